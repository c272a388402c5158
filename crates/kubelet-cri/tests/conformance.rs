//! `CriRuntime` on a private containerd passes the SDK's runtime conformance kit, the per-call
//! checks and the engine section (pods on the CNI network driven by the engine); root and
//! containerd, skipped otherwise, mandatory under `KUBELET_SDK_REQUIRE_ROOT=1`.

mod common;

use common::ContainerdEnv;
use kubelet_api::conformance::{ConformanceConfig, run_conformance};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cri_runtime_passes_the_conformance_suite_on_containerd() {
    let Some(env) =
        ContainerdEnv::start("the_cri_runtime_passes_the_conformance_suite_on_containerd")
    else {
        return;
    };
    let runtime = env.runtime().await;
    let report = run_conformance(
        runtime.as_ref(),
        &ConformanceConfig::new(env.busybox.clone(), env.dir.join("logs")),
    )
    .await;
    report.assert_passed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cri_runtime_passes_the_engine_section_on_containerd() {
    use kubelet::conformance::{EngineConformanceConfig, run_engine_conformance};
    let Some(env) = ContainerdEnv::start("the_cri_runtime_passes_the_engine_section_on_containerd")
    else {
        return;
    };
    let runtime = env.runtime().await;
    let report = run_engine_conformance(
        runtime.clone(),
        &EngineConformanceConfig::new(env.busybox.clone(), env.dir.join("engine")),
    )
    .await;
    report.assert_passed();
    assert_eq!(report.checks.len(), 5);
}
