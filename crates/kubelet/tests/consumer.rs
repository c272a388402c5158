//! The SDK as a dependency of an application (`tests/consumer/`): it builds with the oldest
//! and with the newest Kubernetes version the SDK supports (`k8s-openapi`'s `v1_33` and
//! `v1_37`), picked by the application. A library crate that enabled a version feature itself
//! would make one of the two builds fail ("Both v1_33 and v1_37 features are enabled").

use std::path::Path;
use std::process::Command;

/// `cargo build` (and a run of the result) or `cargo check` of the consumer with `features`.
fn build(features: &str, run: bool) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let manifest = root.join("tests/consumer/Cargo.toml");
    // Their own target directories: each resolves k8s-openapi with another feature, and keeping
    // them apart keeps a second run incremental.
    let target = root.join(format!("target/consumer-{features}"));
    let command = if run { "build" } else { "check" };
    let out = Command::new(env!("CARGO"))
        .args([command, "--locked", "--quiet", "--features", features])
        .arg("--manifest-path")
        .arg(&manifest)
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .expect("running cargo");
    assert!(
        out.status.success(),
        "the consumer does not build with --features {features}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    if !run {
        return;
    }
    let bin = target.join("debug/kubelet-sdk-consumer");
    let run = Command::new(&bin).output().expect("running the consumer");
    assert!(
        run.status.success(),
        "the consumer built with {features} fails:\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
}

#[test]
fn an_application_builds_the_agent_with_the_oldest_and_the_newest_kubernetes_version() {
    // The README's agent assembled and run with the oldest version; type-checked with the newest
    // (a build of every crate again would double the test's time for no more coverage).
    build("oldest", true);
    build("newest", false);
}
