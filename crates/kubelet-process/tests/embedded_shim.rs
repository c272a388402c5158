//! The host-binary embedding of the shim: `main` calls `maybe_run_shim` first, and the runtime
//! is configured with `ShimCommand::CurrentExe`. Runs without the libtest harness so that this
//! file's `main` is the host program.

use std::process::ExitCode;
use std::time::Duration;

use kubelet_api::ContainerRuntime;
use kubelet_api::runtime::{ContainerConfig, ContainerState, PodSandboxConfig};
use kubelet_process::{ProcessRuntime, ProcessRuntimeConfig, ShimCommand};

fn main() -> ExitCode {
    if let Some(code) = kubelet_process::shim::maybe_run_shim() {
        return code;
    }
    // `cargo test` passes harness flags such as `--list`; only run the scenario for real runs.
    if std::env::args().any(|a| a == "--list") {
        println!("embedded_shim_runs_containers: test");
        return ExitCode::SUCCESS;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(embedded_shim_runs_containers());
    println!("test embedded_shim_runs_containers ... ok");
    ExitCode::SUCCESS
}

async fn embedded_shim_runs_containers() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rt = ProcessRuntime::new(
        ProcessRuntimeConfig::new(tmp.path().join("state"))
            .shim(ShimCommand::CurrentExe)
            .cgroup_parent("kubelet-sdk-test"),
    )
    .expect("runtime");
    let sb = {
        let mut v = PodSandboxConfig::default();
        v.log_directory = tmp.path().join("logs");
        v
    };
    let sid = rt.run_pod_sandbox(&sb).await.expect("sandbox");
    let c = {
        let mut v = ContainerConfig::default();
        v.command = vec![
            "/bin/sh".into(),
            "-c".into(),
            "echo embedded; exit 7".into(),
        ];
        v.log_path = "c/0.log".into();
        v
    };
    let cid = rt.create_container(&sid, &c, &sb).await.expect("create");
    rt.start_container(&cid).await.expect("start");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let st = loop {
        let st = rt.container_status(&cid).await.expect("status");
        if st.state == ContainerState::Exited {
            break st;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "container did not exit"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(st.exit_code, 7);
    let log = std::fs::read_to_string(tmp.path().join("logs/c/0.log")).expect("log");
    assert!(log.contains(" stdout F embedded"), "{log}");
    rt.remove_pod_sandbox(&sid).await.expect("remove");
}
