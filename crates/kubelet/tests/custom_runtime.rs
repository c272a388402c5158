//! `examples/custom_runtime.rs`: the toy runtime written from the trait's contract passes the
//! runtime conformance suite (the example exits non-zero otherwise and lists the failures).

use std::path::PathBuf;

fn example_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target profile directory");
    let bin = profile_dir.join("examples").join("custom_runtime");
    assert!(
        bin.exists(),
        "{} is missing: `cargo test` builds the examples",
        bin.display()
    );
    bin
}

#[test]
fn the_custom_runtime_example_passes_the_conformance_suite() {
    let out = std::process::Command::new(example_binary())
        .output()
        .expect("run custom_runtime");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "custom_runtime failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("11 passed, 0 failed"), "{stdout}");
}
