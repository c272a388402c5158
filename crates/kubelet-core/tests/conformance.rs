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

#[tokio::test]
async fn a_sandbox_network_report_that_breaks_the_contract_fails_the_sandbox_check() {
    use kubelet_core::testing::SandboxNetworkReport;
    for report in [
        SandboxNetworkReport::OwnWithoutIp,
        SandboxNetworkReport::Garbage,
    ] {
        let runtime = FakeRuntime::new();
        for (name, code) in [("fails", 3), ("succeeds", 0), ("quick", 0), ("talker", 0)] {
            runtime.set_auto_exit(name, Duration::from_millis(50), code);
        }
        runtime.set_stop_exit_code(143);
        runtime.set_sandbox_network(report);
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut config = ConformanceConfig::new("busybox", tmp.path())
            .exec(false)
            .logs(false)
            .host_network(false);
        config.timeout = Duration::from_secs(2);
        let got = run_conformance(&runtime, &config).await;
        let sandbox = got
            .checks
            .iter()
            .find(|(n, _)| *n == "sandbox_echoes_metadata_labels_and_annotations")
            .map(|(_, o)| o.clone());
        match sandbox {
            Some(Outcome::Failed(m)) => {
                assert!(m.contains("sandbox network contract"), "{report:?}: {m}")
            }
            other => panic!("{report:?}: want a failed sandbox check, got {other:?}"),
        }
    }
}
