//! The runtime conformance kit's engine section (`kubelet::conformance`): the in-memory
//! `FakeRuntime` passes it, the same runtime with a sandbox network report that breaks the
//! contract fails it with a message naming the contract, and the process runtime passes it with
//! real processes. Runs without the libtest harness: `main` is the process runtime's shim host.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use kubelet::conformance::{EngineConformanceConfig, run_engine_conformance};
use kubelet_api::ContainerRuntime;
use kubelet_api::conformance::Outcome;
use kubelet_core::testing::{FakeRuntime, SandboxNetworkReport};

/// One test: a function returning its future.
type TestFn = fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>;

fn main() -> ExitCode {
    #[cfg(feature = "process")]
    if let Some(code) = kubelet::process::shim::maybe_run_shim() {
        return code;
    }
    let tests: Vec<(&str, TestFn)> = vec![
        ("the_fake_runtime_passes_the_engine_section", || {
            Box::pin(the_fake_runtime_passes_the_engine_section())
        }),
        (
            "a_sandbox_network_report_that_breaks_the_contract_fails_the_engine_section",
            || {
                Box::pin(
                    a_sandbox_network_report_that_breaks_the_contract_fails_the_engine_section(),
                )
            },
        ),
        #[cfg(feature = "process")]
        ("the_process_runtime_passes_the_engine_section", || {
            Box::pin(the_process_runtime_passes_the_engine_section())
        }),
    ];
    if std::env::args().any(|a| a == "--list") {
        for (name, _) in &tests {
            println!("{name}: test");
        }
        return ExitCode::SUCCESS;
    }
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    for (name, test) in tests {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        rt.block_on(test());
        println!("test {name} ... ok");
    }
    ExitCode::SUCCESS
}

/// A fake runtime whose containers exit as the section's scripts would.
fn scripted_fake() -> Arc<FakeRuntime> {
    let rt = Arc::new(FakeRuntime::new());
    rt.set_auto_exit("crash", Duration::from_millis(100), 1);
    rt.set_auto_exit("job-ok", Duration::from_millis(100), 0);
    rt.set_auto_exit("job-fail", Duration::from_millis(100), 3);
    rt.set_exec_handler(|_, _| {
        Ok(kubelet_api::runtime::ExecResult {
            stdout: Vec::new(),
            stderr: Vec::new(),
            exit_code: 1,
        })
    });
    rt
}

fn config(dir: &tempfile::TempDir) -> EngineConformanceConfig {
    EngineConformanceConfig::new("busybox", dir.path().join("engine"))
        .timeout(Duration::from_secs(45))
}

async fn the_fake_runtime_passes_the_engine_section() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = scripted_fake();
    let report = run_engine_conformance(rt.clone(), &config(&dir)).await;
    report.assert_passed();
    assert_eq!(report.checks.len(), 5);
    assert!(
        rt.sandboxes().is_empty(),
        "the section removes its sandboxes"
    );
    assert!(
        rt.containers().is_empty(),
        "the section removes its containers"
    );
}

async fn a_sandbox_network_report_that_breaks_the_contract_fails_the_engine_section() {
    for report in [
        SandboxNetworkReport::OwnWithoutIp,
        SandboxNetworkReport::Garbage,
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let rt = scripted_fake();
        rt.set_sandbox_network(report);
        let runtime: Arc<dyn ContainerRuntime> = rt;
        let got = run_engine_conformance(runtime, &config(&dir)).await;
        let steady = got
            .checks
            .iter()
            .find(|(n, _)| *n == "engine_steady_pod_keeps_its_sandbox")
            .map(|(_, o)| o.clone());
        match steady {
            Some(Outcome::Failed(m)) => assert!(
                m.contains("sandbox network contract"),
                "{report:?}: the failure names the contract: {m}"
            ),
            other => panic!("{report:?}: the steady check must fail, got {other:?}"),
        }
    }
}

#[cfg(feature = "process")]
async fn the_process_runtime_passes_the_engine_section() {
    use kubelet::process::{ProcessRuntime, ProcessRuntimeConfig, ShimCommand};
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = ProcessRuntime::new(
        ProcessRuntimeConfig::new(dir.path().join("state"))
            .shim(ShimCommand::CurrentExe)
            .use_cgroups(false),
    )
    .expect("runtime");
    let report = run_engine_conformance(Arc::new(runtime), &config(&dir)).await;
    report.assert_passed();
}
