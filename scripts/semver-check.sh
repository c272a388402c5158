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
# it yet.
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

libs=(kubelet-core kubelet-podconfig kubelet-pleg kubelet-process kubelet-probe kubelet-cri
    kubelet-eviction kubelet-apiserver kubelet-server kubelet)
status=0
for lib in "${libs[@]}"; do
    if ! git cat-file -e "$baseline:crates/$lib/Cargo.toml" 2>/dev/null; then
        echo "semver-check: $lib is new since $baseline; nothing to compare"
        continue
    fi
    echo "== $lib against $baseline"
    # The baseline pinned v1_33 in the workspace; the current crates leave the version to the
    # application, so it is given here for both.
    cargo semver-checks check-release -p "$lib" --baseline-rev "$baseline" \
        --features k8s-openapi/v1_33 || status=1
done
exit "$status"
