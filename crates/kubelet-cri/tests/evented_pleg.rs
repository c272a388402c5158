//! The evented PLEG (`kubelet_pleg::EventedPleg`) over `CriRuntime` and a real, private
//! containerd (`scripts/containerd-test-env.sh`): a container's exit reaches the PLEG through the
//! runtime's events with the safety-net relist an hour away. Needs root; skipped with a message
//! otherwise, and failing instead when `KUBELET_SDK_REQUIRE_ROOT=1` (CI).

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{ContainerdEnv, eventually};
use kubelet_core::runtime::{
    ContainerConfig, ContainerMetadata, ContainerRuntime, ContainerState, Labels, PodSandboxConfig,
    PodSandboxMetadata, labels,
};
use kubelet_core::{PodLifecycleEventGenerator, PodLifecycleEventType};
use kubelet_pleg::{EventedPleg, EventedPlegConfig, PlegMode};
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_exit_reaches_the_evented_pleg_without_a_relist() {
    let Some(env) =
        ContainerdEnv::start("a_container_exit_reaches_the_evented_pleg_without_a_relist")
    else {
        return;
    };
    let rt = env.runtime().await;
    let runtime: Arc<dyn ContainerRuntime> = rt.clone();
    let pleg = Arc::new(EventedPleg::new(
        runtime,
        EventedPlegConfig::default().with_relist_period(Duration::from_secs(3600)),
    ));
    let mut events = pleg.take_events().unwrap();
    let shutdown = CancellationToken::new();
    tokio::spawn({
        let (pleg, shutdown) = (pleg.clone(), shutdown.clone());
        async move { pleg.run(shutdown).await }
    });
    eventually(
        Duration::from_secs(30),
        "events mode after the first relist",
        || {
            let pleg = pleg.clone();
            async move {
                (pleg.mode() == PlegMode::Events
                    && pleg.last_relist().is_some()
                    && pleg.metrics().connection_successes() >= 1)
                    .then_some(())
            }
        },
    )
    .await;
    let relisted = pleg.last_relist();

    let uid = "evented-exit";
    let mut l = Labels::new();
    l.insert(labels::POD_UID.into(), uid.into());
    l.insert(labels::POD_NAME.into(), format!("pod-{uid}"));
    l.insert(labels::POD_NAMESPACE.into(), "default".into());
    let sandbox = PodSandboxConfig {
        metadata: PodSandboxMetadata {
            name: format!("pod-{uid}"),
            namespace: "default".into(),
            uid: uid.into(),
            attempt: 0,
        },
        log_directory: env.dir.join("logs").join(uid),
        labels: l.clone(),
        host_network: true,
        ..Default::default()
    };
    let mut cl = l;
    cl.insert(labels::CONTAINER_NAME.into(), "app".into());
    let container = ContainerConfig {
        metadata: ContainerMetadata {
            name: "app".into(),
            attempt: 0,
        },
        image: env.busybox.clone(),
        command: vec!["/bin/sh".into(), "-c".into(), "sleep 1; exit 3".into()],
        labels: cl,
        log_path: "app/0.log".into(),
        ..Default::default()
    };
    let sid = rt.run_pod_sandbox(&sandbox).await.unwrap();
    let cid = rt
        .create_container(&sid, &container, &sandbox)
        .await
        .unwrap();
    rt.start_container(&cid).await.unwrap();

    let mut started = false;
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(30), events.recv())
            .await
            .expect("the container's events within 30 s")
            .expect("channel open");
        if ev.container_id != cid {
            continue;
        }
        match ev.kind {
            PodLifecycleEventType::ContainerStarted => started = true,
            PodLifecycleEventType::ContainerDied => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(started, "ContainerStarted precedes ContainerDied");
    assert_eq!(
        pleg.last_relist(),
        relisted,
        "the event alone explains the detection"
    );
    let status = pleg.cache().get(uid).unwrap().status.unwrap();
    let c = status.find_container("app").unwrap();
    assert_eq!((c.state, c.exit_code), (ContainerState::Exited, 3));
    shutdown.cancel();
    rt.stop_pod_sandbox(&sid).await.unwrap();
    rt.remove_pod_sandbox(&sid).await.unwrap();
}
