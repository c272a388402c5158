//! The process runtime passes the SDK's runtime conformance suite (the contract the engine
//! relies on), with real processes.

use kubelet_api::conformance::{ConformanceConfig, run_conformance};
use kubelet_process::{ProcessRuntime, ProcessRuntimeConfig};

const SHIM: &str = env!("CARGO_BIN_EXE_kubelet-process-shim");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_process_runtime_passes_the_conformance_suite() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let runtime = ProcessRuntime::new(
        ProcessRuntimeConfig::new(tmp.path().join("state"))
            .shim_path(SHIM)
            .use_cgroups(false),
    )
    .expect("runtime");
    let report = run_conformance(
        &runtime,
        &ConformanceConfig::new("busybox", tmp.path().join("logs")),
    )
    .await;
    report.assert_passed();
}
