//! `CriRuntime::container_events` against a real, private containerd 1.6 (started by
//! `scripts/containerd-test-env.sh`): containerd 1.6 has no CRI `GetContainerEvents`, so these
//! exercise the fallback to containerd's native task events. Needs root; skipped with a message
//! otherwise, and failing instead when `KUBELET_SDK_REQUIRE_ROOT=1` (CI).

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{
    Agent, ContainerdEnv, WITHIN, container, container_config, eventually,
    exit_is_reported_early_as_cri_records_it, is, next_matching, phase, pod, running,
    sandbox_config, start_pod,
};
use futures::StreamExt;
use kubelet_api::ContainerRuntime;
use kubelet_api::ErrorKind;
use kubelet_api::runtime::{ContainerEventKind, ContainerState};
use kubelet_cri::{CriConfig, CriRuntime};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_lifecycle_produces_events_and_a_restart_breaks_the_stream_until_resubscribed() {
    let Some(env) = ContainerdEnv::start(
        "container_lifecycle_produces_events_and_a_restart_breaks_the_stream_until_resubscribed",
    ) else {
        return;
    };
    let rt = env.runtime().await;
    let mut events = rt.container_events().await.unwrap();
    let mut seen = Vec::new();

    let sandbox_cfg = sandbox_config("events", &env);
    let sandbox = rt.run_pod_sandbox(&sandbox_cfg).await.unwrap();
    next_matching(&mut events, &mut seen, "the sandbox's Started", |e| {
        e.container_id == sandbox && e.kind == ContainerEventKind::Started
    })
    .await;

    // A long-running container with an exec in it: the exec's exit is no container exit.
    let mut long_cfg = container_config("long", "exec sleep 1000", &env);
    long_cfg.labels = sandbox_cfg.labels.clone();
    let long = rt
        .create_container(&sandbox, &long_cfg, &sandbox_cfg)
        .await
        .unwrap();
    next_matching(
        &mut events,
        &mut seen,
        "Created of the long container",
        is(&long, ContainerEventKind::Created),
    )
    .await;
    rt.start_container(&long).await.unwrap();
    let returned = jiff::Timestamp::now();
    let started = next_matching(
        &mut events,
        &mut seen,
        "Started of the long container",
        is(&long, ContainerEventKind::Started),
    )
    .await;
    // The runtime's own start: confirmed by its call, with the pod the call was made for and a
    // stamp no later than the call's return (however late containerd published it).
    assert_eq!(
        started.pod_uid.as_deref(),
        Some(sandbox_cfg.metadata.uid.as_str())
    );
    assert!(
        started.created_at <= returned,
        "{started:?} after {returned}"
    );
    let out = rt
        .exec_sync(&long, &["/bin/true".into()], Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(out.exit_code, 0);

    // A container that exits by itself.
    let mut short_cfg = container_config("short", "sleep 0.5; exit 3", &env);
    short_cfg.labels = sandbox_cfg.labels.clone();
    let short = rt
        .create_container(&sandbox, &short_cfg, &sandbox_cfg)
        .await
        .unwrap();
    rt.start_container(&short).await.unwrap();
    let stopped = next_matching(
        &mut events,
        &mut seen,
        "Stopped of the exiting container",
        is(&short, ContainerEventKind::Stopped),
    )
    .await;
    for kind in [ContainerEventKind::Created, ContainerEventKind::Started] {
        assert!(
            seen.iter().any(is(&short, kind)),
            "no {kind:?} before Stopped: {seen:#?}"
        );
    }
    assert!(
        !seen.iter().any(is(&long, ContainerEventKind::Stopped)),
        "the exec's exit was reported as the container's: {seen:#?}"
    );
    // The runtime shows the exit as soon as the event arrives (containerd's CRI plugin records
    // it tens of milliseconds later: until then the exit hint of the event answers), also to a
    // listing by state.
    let listed = rt
        .list_containers(&kubelet_api::runtime::ContainerFilter {
            state: Some(ContainerState::Running),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(
        listed.iter().all(|c| c.id != short),
        "listed as running after its exit: {listed:?}"
    );
    let early =
        exit_is_reported_early_as_cri_records_it(&env, &rt, &mut events, &mut seen, &short, 3)
            .await;
    // The event is no earlier than the exit.
    let finished = early.finished_at.unwrap();
    assert!(
        stopped.created_at >= finished,
        "event at {} before the exit at {finished}",
        stopped.created_at
    );

    rt.remove_container(&short).await.unwrap();
    next_matching(
        &mut events,
        &mut seen,
        "Deleted of the removed container",
        is(&short, ContainerEventKind::Deleted),
    )
    .await;
    // Every event so far names the pod (containers by label, the sandbox by its metadata, the
    // deleted container from memory).
    for e in &seen {
        assert_eq!(e.pod_uid.as_deref(), Some("events"), "{e:?}");
    }

    // containerd goes away: the stream reports it and ends; subscribing fails meanwhile.
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
    if let Some(e) = &broke {
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
        assert!(
            events.next().await.is_none(),
            "the stream ends after its error"
        );
    }
    let e = match rt.container_events().await {
        Err(e) => e,
        Ok(_) => panic!("subscribed while containerd is down"),
    };
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");

    // Back again: a new subscription sees the long container stop.
    env.restart_containerd();
    let mut events = eventually(WITHIN, "a new subscription", || {
        let rt = rt.clone();
        async move { rt.container_events().await.ok() }
    })
    .await;
    rt.stop_container(&long, Duration::from_secs(1))
        .await
        .unwrap();
    next_matching(
        &mut events,
        &mut seen,
        "Stopped of the long container after the restart",
        is(&long, ContainerEventKind::Stopped),
    )
    .await;
}

#[tokio::test]
async fn subscribing_on_a_missing_socket_is_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let rt = CriRuntime::new(
        CriConfig::new(format!("unix://{}/none.sock", dir.path().display()))
            .connect_timeout(Duration::from_secs(1)),
    )
    .unwrap();
    let e = match rt.container_events().await {
        Err(e) => e,
        Ok(_) => panic!("subscribed on a missing socket"),
    };
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.message().contains("GetContainerEvents"), "{e}");
}

/// A real gRPC server that serves neither CRI nor containerd's API (a `grpc.health.v1` server on
/// a unix socket) answers both subscriptions `Unimplemented`; an invalid containerd namespace is
/// refused before anything is sent.
#[tokio::test]
async fn a_runtime_without_either_event_api_is_reported_as_unimplemented() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("health.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let incoming = futures::stream::unfold(listener, |listener| async move {
        let conn = listener.accept().await.map(|(stream, _)| stream);
        Some((conn, listener))
    });
    let (_reporter, service) = tonic_health::server::health_reporter();
    let stop = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, stop.clone().cancelled_owned()),
    );
    let rt = CriRuntime::new(CriConfig::new(format!("unix://{}", socket.display()))).unwrap();
    let e = match rt.container_events().await {
        Err(e) => e,
        Ok(_) => panic!("subscribed on a server without event APIs"),
    };
    assert_eq!(e.kind(), ErrorKind::Unimplemented, "{e}");
    assert!(
        e.message().contains("GetContainerEvents") && e.message().contains("Events/Subscribe"),
        "{e}"
    );
    // A containerd namespace that cannot be sent as gRPC metadata is refused, not sent.
    for bad in ["", "k8s\nio"] {
        let rt = CriRuntime::new(
            CriConfig::new(format!("unix://{}", socket.display())).containerd_namespace(bad),
        )
        .unwrap();
        let e = match rt.container_events().await {
            Err(e) => e,
            Ok(_) => panic!("subscribed with containerd namespace {bad:?}"),
        };
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    }
    stop.cancel();
    server.await.unwrap().unwrap();
}

/// The evented PLEG on `CriRuntime` (relisting only every 300 s while events flow): a container
/// that exits reaches the pod status through the events alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_evented_pleg_sees_exits_through_containerd_events() {
    let Some(env) = ContainerdEnv::start("the_evented_pleg_sees_exits_through_containerd_events")
    else {
        return;
    };
    let rt = env.runtime().await;
    let runtime: std::sync::Arc<dyn ContainerRuntime> = rt.clone();
    let (pleg, pleg_events) =
        kubelet_pleg::EventedPleg::new(runtime.clone(), kubelet_pleg::EventedPlegConfig::default());
    let pleg = std::sync::Arc::new(pleg);
    // 8 s: the inspection a Started event causes may predate the end of the pod worker's sync,
    // so the Running status can wait for the cache's global timestamp (2 s period); a container
    // that exits within ~3 s was seen to go from Pending straight to Failed.
    let mut p = pod(
        "evented",
        true,
        vec![container("app", &env.busybox, "sleep 8; exit 2")],
    );
    if let Some(spec) = p.spec.as_mut() {
        spec.restart_policy = Some("Never".into());
    }
    let (_tx, rx) = tokio::sync::watch::channel(vec![p]);
    let agent = Agent::start_with_pleg(&env, runtime, rx, pleg.clone(), pleg_events);
    agent.wait_for("evented", WITHIN, "Running", running).await;
    let s = agent
        .wait_for("evented", WITHIN, "Failed", |s| phase(s) == "Failed")
        .await;
    let terminated = s
        .container_statuses
        .iter()
        .flatten()
        .find_map(|c| c.state.as_ref()?.terminated.clone())
        .expect("a terminated container state");
    assert_eq!(terminated.exit_code, 2);
    assert_eq!(pleg.mode(), kubelet_pleg::PlegMode::Events);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_stopped_and_removed_right_after_its_exit_event_goes_cleanly() {
    // The exit event comes before containerd 1.6's CRI plugin has deleted the task; stopping and
    // removing the pod at once must not race with that deletion.
    let Some(env) =
        ContainerdEnv::start("a_pod_stopped_and_removed_right_after_its_exit_event_goes_cleanly")
    else {
        return;
    };
    let rt = env.runtime().await;
    let mut events = rt.container_events().await.unwrap();
    let mut seen = Vec::new();
    for i in 0..5 {
        let (sandbox, id) = start_pod(&env, &*rt, &format!("quick-{i}"), "sleep 0.3; exit 4").await;
        next_matching(
            &mut events,
            &mut seen,
            "the exit",
            is(&id, ContainerEventKind::Stopped),
        )
        .await;
        rt.stop_pod_sandbox(&sandbox)
            .await
            .unwrap_or_else(|e| panic!("pod {i}: stopping right after the exit: {e}"));
        let status = rt.container_status(&id).await.unwrap();
        assert_eq!(
            (status.state, status.exit_code),
            (ContainerState::Exited, 4)
        );
        rt.remove_pod_sandbox(&sandbox)
            .await
            .unwrap_or_else(|e| panic!("pod {i}: removing right after the exit: {e}"));
    }
}
