//! The in-memory `FakeRuntime` passes the runtime conformance suite where it can: it runs no
//! processes, so containers exit when told to (auto-exit by name) and the exec and log checks
//! are off.

use std::time::Duration;

use kubelet_api::conformance::{ConformanceConfig, Outcome, run_conformance};
use kubelet_core::testing::FakeRuntime;

#[tokio::test]
async fn the_fake_runtime_passes_the_conformance_suite_without_exec_and_logs() {
    let runtime = FakeRuntime::new();
    for (name, code) in [("fails", 3), ("succeeds", 0), ("quick", 0), ("talker", 0)] {
        runtime.set_auto_exit(name, Duration::from_millis(50), code);
    }
    runtime.set_stop_exit_code(143);
    let tmp = tempfile::tempdir().expect("tempdir");
    let config = ConformanceConfig::new("busybox", tmp.path())
        .exec(false)
        .logs(false);
    let report = run_conformance(&runtime, &config).await;
    report.assert_passed();
    assert_eq!(
        report
            .checks
            .iter()
            .filter(|(_, o)| *o == Outcome::Passed)
            .count(),
        9
    );
}
