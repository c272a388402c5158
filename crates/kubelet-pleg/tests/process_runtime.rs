//! The generic PLEG over the real process runtime: a host process that exits is reported as
//! `ContainerDied` within about one relist period.
//!
//! This test has its own `main` (`harness = false`) because the process runtime starts each
//! container's supervisor by re-running this executable (`ShimCommand::CurrentExe`).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use kubelet_api::ContainerRuntime;
use kubelet_api::runtime::{
    ContainerConfig, ContainerMetadata, ContainerState, PodSandboxConfig, PodSandboxMetadata,
    labels,
};
use kubelet_api::{PodLifecycleEventGenerator, PodLifecycleEventType};
use kubelet_pleg::{GenericPleg, GenericPlegConfig};
use kubelet_process::{ProcessRuntime, ProcessRuntimeConfig, ShimCommand};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

fn main() -> ExitCode {
    if let Some(code) = kubelet_process::shim::maybe_run_shim() {
        return code;
    }
    let filter = std::env::args().nth(1).filter(|a| !a.starts_with('-'));
    let name = "a_real_process_that_exits_is_reported_as_container_died_within_about_a_second";
    if filter.as_deref().is_some_and(|f| !name.contains(f)) {
        println!("test {name} ... filtered out");
        return ExitCode::SUCCESS;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(a_real_process_that_exits_is_reported_as_container_died_within_about_a_second());
    println!("test {name} ... ok");
    ExitCode::SUCCESS
}

fn sandbox_config(root: &Path, uid: &str) -> PodSandboxConfig {
    {
        let mut v = PodSandboxConfig::default();
        v.metadata = PodSandboxMetadata {
            name: format!("pod-{uid}"),
            namespace: "default".into(),
            uid: uid.into(),
            attempt: 0,
        };
        v.log_directory = root.join("logs").join(format!("default_pod-{uid}_{uid}"));
        v.labels = BTreeMap::from([
            (labels::POD_UID.to_string(), uid.to_string()),
            (labels::POD_NAME.to_string(), format!("pod-{uid}")),
            (labels::POD_NAMESPACE.to_string(), "default".to_string()),
        ]);
        v.host_network = true;
        v
    }
}

async fn a_real_process_that_exits_is_reported_as_container_died_within_about_a_second() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = ProcessRuntimeConfig::new(dir.path().join("state"))
        .shim(ShimCommand::CurrentExe)
        .use_cgroups(false);
    let runtime = Arc::new(ProcessRuntime::new(config).expect("process runtime"));
    let dyn_runtime: Arc<dyn ContainerRuntime> = runtime.clone();
    let (pleg, pleg_events) = GenericPleg::new(dyn_runtime, GenericPlegConfig::default());
    let pleg = std::sync::Arc::new(pleg);
    let mut events = pleg_events;
    let shutdown = CancellationToken::new();
    tokio::spawn({
        let pleg = pleg.clone();
        let shutdown = shutdown.clone();
        async move { pleg.run(shutdown).await }
    });

    let sb = sandbox_config(dir.path(), "real-1");
    let mut l = sb.labels.clone();
    l.insert(labels::CONTAINER_NAME.into(), "app".into());
    let cfg = {
        let mut v = ContainerConfig::default();
        v.metadata = ContainerMetadata {
            name: "app".into(),
            attempt: 0,
        };
        v.image = "busybox:latest".into();
        v.command = vec!["/bin/sh".into(), "-c".into()];
        v.args = vec!["sleep 1.5; exit 3".into()];
        v.labels = l;
        v.log_path = "app/0.log".into();
        v
    };
    let sid = runtime.run_pod_sandbox(&sb).await.expect("sandbox");
    let cid = runtime
        .create_container(&sid, &cfg, &sb)
        .await
        .expect("create");
    runtime.start_container(&cid).await.expect("start");
    let started = Instant::now();

    let mut saw_started = false;
    let died_at = loop {
        let ev = tokio::time::timeout(Duration::from_secs(10), events.recv())
            .await
            .expect("an event within 10s")
            .expect("channel open");
        if ev.container_id != cid {
            continue;
        }
        match ev.kind {
            PodLifecycleEventType::ContainerStarted => saw_started = true,
            PodLifecycleEventType::ContainerDied => break Instant::now(),
            other => panic!("unexpected {other:?}"),
        }
    };
    assert!(saw_started, "ContainerStarted precedes ContainerDied");
    // The process exits 1.5 s after start; one relist period (1 s) plus slack for the runtime.
    let latency = died_at - started;
    assert!(
        latency >= Duration::from_millis(1400) && latency <= Duration::from_millis(3000),
        "death reported {latency:?} after start"
    );
    let status = pleg
        .cache()
        .get("real-1")
        .expect("cached")
        .status
        .expect("inspected");
    let c = status.find_container("app").expect("container status");
    assert_eq!((c.state, c.exit_code), (ContainerState::Exited, 3));

    shutdown.cancel();
    runtime.stop_pod_sandbox(&sid).await.expect("stop sandbox");
    runtime
        .remove_pod_sandbox(&sid)
        .await
        .expect("remove sandbox");
}
