//! Container events from CRI `GetContainerEvents` on a real, private containerd 1.7 (Debian
//! trixie's, unpacked by `scripts/containerd-test-env.sh start17`; containerd 1.6 lacks the
//! call, see `container_events.rs` for its fallback): `CriRuntime::container_events` uses the
//! CRI source, and a container's exit reaches the evented PLEG through it. Needs root; skipped
//! with a message otherwise, and failing instead when `KUBELET_SDK_REQUIRE_ROOT=1` (CI).

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{
    ContainerdEnv, WITHIN, eventually, exit_is_reported_early_as_cri_records_it, is, next_matching,
    run_until_events, start_pod,
};
use futures::StreamExt;
use kubelet_api::ContainerRuntime;
use kubelet_api::ErrorKind;
use kubelet_api::runtime::{ContainerEventKind, ContainerState};
use kubelet_api::{PodLifecycleEventGenerator, PodLifecycleEventType};
use kubelet_cri::events::ContainerEventSource;
use kubelet_pleg::{EventedPleg, EventedPlegConfig};
use tokio_util::sync::CancellationToken;

fn start(test: &str) -> Option<ContainerdEnv> {
    let env = ContainerdEnv::start_1_7(test)?;
    assert!(
        env.version.starts_with("1.7."),
        "start17 ran containerd {}",
        env.version
    );
    Some(env)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_1_7_streams_a_containers_lifecycle_through_cri_with_its_pod_until_it_restarts()
{
    let Some(env) = start(
        "containerd_1_7_streams_a_containers_lifecycle_through_cri_with_its_pod_until_it_restarts",
    ) else {
        return;
    };
    let rt = env.runtime().await;
    let mut events = rt.container_events().await.unwrap();
    let mut seen = Vec::new();

    let uid = "cri-events";
    let (sandbox, app) = start_pod(&env, &*rt, uid, "sleep 0.5; exit 3").await;
    next_matching(
        &mut events,
        &mut seen,
        "Stopped of the exiting container",
        is(&app, ContainerEventKind::Stopped),
    )
    .await;
    assert_eq!(
        rt.container_event_source(),
        Some(ContainerEventSource::Cri),
        "containerd 1.7 answers GetContainerEvents"
    );
    // containerd 1.7 records the exit before it sends the event: CRI shows it at once.
    let status = rt.container_status(&app).await.unwrap();
    assert_eq!(
        (status.state, status.exit_code, status.reason.as_str()),
        (ContainerState::Exited, 3, "Error"),
        "{status:?}"
    );
    rt.remove_container(&app).await.unwrap();
    next_matching(
        &mut events,
        &mut seen,
        "Deleted of the removed container",
        is(&app, ContainerEventKind::Deleted),
    )
    .await;

    // The container's events, in order, each naming the pod from the sandbox status it carries.
    let kinds: Vec<_> = seen
        .iter()
        .filter(|e| e.container_id == app)
        .map(|e| e.kind)
        .collect();
    assert_eq!(
        kinds,
        [
            ContainerEventKind::Created,
            ContainerEventKind::Started,
            ContainerEventKind::Stopped,
            ContainerEventKind::Deleted
        ],
        "{seen:#?}"
    );
    for e in seen.iter().filter(|e| e.container_id == app) {
        assert_eq!(e.pod_uid.as_deref(), Some(uid), "{e:?}");
    }

    // containerd goes away: the stream reports it and ends; a new subscription after the
    // restart gets the CRI events again.
    env.kill_containerd();
    let broke = tokio::time::timeout(WITHIN, async {
        loop {
            match events.next().await {
                Some(Ok(e)) => seen.push(e),
                Some(Err(e)) => return Some(e),
                None => return None,
            }
        }
    })
    .await
    .expect("the stream noticed containerd going away");
    let e = broke.expect("an error before the end");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(
        events.next().await.is_none(),
        "the stream ends after its error"
    );
    env.restart_containerd();
    let mut events = eventually(WITHIN, "a new subscription", || {
        let rt = rt.clone();
        async move { rt.container_events().await.ok() }
    })
    .await;
    rt.stop_pod_sandbox(&sandbox).await.unwrap();
    next_matching(
        &mut events,
        &mut seen,
        "Stopped of the sandbox after the restart",
        is(&sandbox, ContainerEventKind::Stopped),
    )
    .await;
    rt.remove_pod_sandbox(&sandbox).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_1_7_exit_reaches_the_evented_pleg_through_cri_without_a_relist() {
    let Some(env) =
        start("containerd_1_7_exit_reaches_the_evented_pleg_through_cri_without_a_relist")
    else {
        return;
    };
    let rt = env.runtime().await;
    let runtime: Arc<dyn ContainerRuntime> = rt.clone();
    let (pleg, pleg_events) = EventedPleg::new(
        runtime,
        EventedPlegConfig::default().with_relist_period(Duration::from_secs(3600)),
    );
    let pleg = std::sync::Arc::new(pleg);
    let mut events = pleg_events;
    let shutdown = CancellationToken::new();
    run_until_events(&pleg, &shutdown).await;
    let relisted = pleg.last_relist();

    let uid = "cri-evented-exit";
    let (sandbox, app) = start_pod(&env, &*rt, uid, "sleep 1; exit 3").await;

    let mut started = false;
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(30), events.recv())
            .await
            .expect("the container's events within 30 s")
            .expect("channel open");
        if ev.container_id != app {
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
    assert_eq!(rt.container_event_source(), Some(ContainerEventSource::Cri));
    let status = pleg.cache().get(uid).unwrap().status.unwrap();
    let c = status.find_container("app").unwrap();
    assert_eq!((c.state, c.exit_code), (ContainerState::Exited, 3));
    shutdown.cancel();
    rt.stop_pod_sandbox(&sandbox).await.unwrap();
    rt.remove_pod_sandbox(&sandbox).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_1_7_with_containerd_events_preferred_reports_an_exit_before_cri_records_it() {
    let Some(env) = start(
        "containerd_1_7_with_containerd_events_preferred_reports_an_exit_before_cri_records_it",
    ) else {
        return;
    };
    let rt = kubelet_cri::CriRuntime::connect(env.cri_config().prefer_containerd_events(true))
        .await
        .unwrap();
    let mut events = rt.container_events().await.unwrap();
    let mut seen = Vec::new();
    let (sandbox, app) = start_pod(&env, &rt, "preferred", "sleep 0.5; exit 3").await;
    let stopped = next_matching(
        &mut events,
        &mut seen,
        "Stopped of the exiting container",
        is(&app, ContainerEventKind::Stopped),
    )
    .await;
    assert_eq!(
        rt.container_event_source(),
        Some(ContainerEventSource::Containerd)
    );
    assert_eq!(stopped.pod_uid.as_deref(), Some("preferred"));
    exit_is_reported_early_as_cri_records_it(&env, &rt, &mut events, &mut seen, &app, 3).await;
    rt.stop_pod_sandbox(&sandbox).await.unwrap();
    rt.remove_pod_sandbox(&sandbox).await.unwrap();
}
