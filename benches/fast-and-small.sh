#!/usr/bin/env bash
# The "fast and small" figures in one command: binary sizes, the start/stop burst, start stages,
# RSS and idle CPU of `minimal_kubelet` at 30 and 110 pods on its process runtime and on
# containerd, the agent's start and teardown against the direct CRI floor (1, 4 and 8 pods at a
# time) on containerd at 30 and 100 pods, and exit -> PLEG event latency on both runtimes. Each
# harness measures its own same-run baseline and prints the ratio next to it; this script builds
# them, runs them in turn and prints their tables. Containerd parts need root and
# `scripts/containerd-test-env.sh install`.
#
#   bash benches/fast-and-small.sh            # everything
#   QUICK=1 bash benches/fast-and-small.sh    # one run per figure, fewer exits
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
nodef_target=${NODEF_TARGET_DIR:-$target/no-default-features}
runs=2; rounds=3; exits=300
if [[ -n ${QUICK:-} ]]; then runs=1; rounds=1; exits=50; fi

echo "== building (release profile)"
CARGO_TARGET_DIR=$target cargo build --release -q -p startup-bench -p cri-bench -p pleg-bench
# The agent last and alone: built together with the harnesses, feature unification adds about
# 360 KB to it, and the size below is the one `cargo build --release -p minimal_kubelet` gives.
CARGO_TARGET_DIR=$target cargo build --release -q -p minimal_kubelet
CARGO_TARGET_DIR=$nodef_target cargo build --release -q -p minimal_kubelet --no-default-features

echo
echo "== binary sizes (stripped by the release profile)"
limit_all=$((12 * 1024 * 1024)); limit_min=$((5 * 1024 * 1024))
for b in "every feature:$target/release/minimal_kubelet:$limit_all" \
         "--no-default-features:$nodef_target/release/minimal_kubelet:$limit_min"; do
    IFS=: read -r what path limit <<<"$b"
    size=$(stat -c %s "$path")
    printf '%-24s %10d B  (%.2f MiB; goal <= %d MiB: %s)\n' "$what" "$size" \
        "$(awk "BEGIN { print $size / 1048576 }")" $((limit / 1048576)) \
        "$([[ $size -le $limit ]] && echo met || echo MISSED)"
done

for pods in 30 110; do
    echo
    echo "== process runtime: $pods pods (startup-bench; baseline: $pods sleeps spawned directly)"
    "$target/release/startup-bench" --agent "$target/release/minimal_kubelet" \
        --pods "$pods" --runs "$runs" | grep -v '^JSON '
done

if [[ $(id -u) -eq 0 ]] && command -v containerd >/dev/null; then
    for pods in 30 110; do
        echo
        echo "== containerd: minimal_kubelet with $pods pods (startup-bench --containerd: RSS, idle CPU over 60 s)"
        "$target/release/startup-bench" --agent "$target/release/minimal_kubelet" --containerd \
            --pods "$pods" --runs "$runs" --idle-secs 60 | grep -v '^JSON '
    done
    for pods in 30 100; do
        echo
        echo "== containerd: $pods pods started and stopped (cri-bench; floor: the same CRI calls without the agent)"
        "$target/release/cri-bench" --pods "$pods" --rounds "$rounds" --relist-sizes 30,110 --runs 10
    done
    runtimes=process,containerd
else
    echo
    echo "== containerd parts skipped (needs root and containerd)"
    runtimes=process
fi

echo
echo "== exit -> PLEG event ($runtimes; baseline: the 1 s relist in the same run)"
"$target/release/pleg-bench" --runtimes "$runtimes" --exits "$exits" --sizes 30,110
