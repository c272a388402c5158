#!/usr/bin/env bash
# Compares the public API of every library crate with a release: cargo-semver-checks reports
# each change that needs a major (for 0.x: minor) version bump, so a release that breaks
# embedders cannot go out as a patch.
#
#   scripts/semver-check.sh [BASELINE_REV]
#
# BASELINE_REV is the git revision of the last release (default: the commit CHANGELOG.md names
# for the newest released version). cargo-semver-checks is installed from the crate registry
# when missing. Every crate is checked with k8s-openapi's v1_33 (the oldest Kubernetes version
# the SDK supports); the check of a crate is skipped with a note when the baseline does not have
# it yet. SEMVER_CRATES="a b" checks only those crates.
set -euo pipefail
cd "$(dirname "$0")/.."

baseline=${1:-$(sed -n 's/^\[0\.[0-9]*\.[0-9]*\]: .*\/commit\/\([0-9a-f]*\)$/\1/p' CHANGELOG.md | head -1)}
[ -n "$baseline" ] || { echo "semver-check: no baseline revision (give one)" >&2; exit 2; }
git rev-parse --verify -q "$baseline^{commit}" >/dev/null ||
    { echo "semver-check: $baseline is not a commit of this repository" >&2; exit 2; }

if ! cargo semver-checks --version >/dev/null 2>&1; then
    echo "semver-check: installing cargo-semver-checks from the crate registry" >&2
    cargo install --locked cargo-semver-checks >&2
fi

libs=(${SEMVER_CRATES:-kubelet-api kubelet-net kubelet-core kubelet-podconfig kubelet-pleg kubelet-process kubelet-probe kubelet-cri
    kubelet-eviction kubelet-stats kubelet-gc kubelet-cm kubelet-apiserver kubelet-server kubelet})

# The rustdoc JSON of both sides is made here rather than by cargo-semver-checks: it builds a
# crate as the dependency of a placeholder, which cannot pick k8s-openapi's version feature for
# a crate that leaves it to the application. The baseline is built from a worktree.
work=$(mktemp -d "${TMPDIR:-/tmp}/kubelet-sdk-semver.XXXXXX")
cleanup() {
    git worktree remove --force "$work/baseline" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT
git worktree add --detach -q "$work/baseline" "$baseline"
target=${CARGO_TARGET_DIR:-$PWD/target}
rustdoc_json() { # DIR CRATE TARGET [CARGO ARGS...]
    local dir=$1 crate=$2 out=$3
    shift 3
    (cd "$dir" && RUSTC_BOOTSTRAP=1 cargo rustdoc -q -p "$crate" --lib --target-dir "$out" "$@" \
        -- -Z unstable-options --output-format json)
    echo "$out/doc/${crate//-/_}.json"
}

status=0
for lib in "${libs[@]}"; do
    if ! git cat-file -e "$baseline:crates/$lib/Cargo.toml" 2>/dev/null; then
        echo "semver-check: $lib is new since $baseline; nothing to compare"
        continue
    fi
    echo "== $lib against $baseline"
    # The baseline pinned v1_33 in its workspace; the current crates leave the version to the
    # application, so it is given here.
    old=$(rustdoc_json "$work/baseline" "$lib" "$target/semver-baseline")
    new=$(rustdoc_json "$PWD" "$lib" "$target/semver-current" --features k8s-openapi/v1_33)
    cargo semver-checks check-release --baseline-rustdoc "$old" --current-rustdoc "$new" || status=1
done
exit "$status"
