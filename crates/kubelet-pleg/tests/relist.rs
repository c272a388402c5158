//! Behaviour of the generic PLEG against the in-memory `FakeRuntime`, with paused time.

use std::sync::Arc;
use std::time::Duration;

use kubelet_api::ContainerRuntime;
use kubelet_api::runtime::{
    ContainerConfig, ContainerMetadata, ContainerState, Labels, PodSandboxConfig,
    PodSandboxMetadata, labels,
};
use kubelet_api::{
    Error, ErrorKind, PlegHealth, PodLifecycleEvent, PodLifecycleEventGenerator,
    PodLifecycleEventType::{self, *},
};
use kubelet_core::testing::{FakeOp, FakeRuntime};
use kubelet_pleg::{GenericPleg, GenericPlegConfig, PlegError};
use tokio::sync::mpsc::Receiver;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

fn sandbox_config(uid: &str) -> PodSandboxConfig {
    let mut l = Labels::new();
    l.insert(labels::POD_UID.into(), uid.into());
    l.insert(labels::POD_NAME.into(), format!("pod-{uid}"));
    l.insert(labels::POD_NAMESPACE.into(), "default".into());
    {
        let mut v = PodSandboxConfig::default();
        v.metadata = PodSandboxMetadata {
            name: format!("pod-{uid}"),
            namespace: "default".into(),
            uid: uid.into(),
            attempt: 0,
        };
        v.labels = l;
        v
    }
}

fn container_config(uid: &str, name: &str) -> ContainerConfig {
    let mut l = Labels::new();
    l.insert(labels::POD_UID.into(), uid.into());
    l.insert(labels::POD_NAME.into(), format!("pod-{uid}"));
    l.insert(labels::POD_NAMESPACE.into(), "default".into());
    l.insert(labels::CONTAINER_NAME.into(), name.into());
    {
        let mut v = ContainerConfig::default();
        v.metadata = ContainerMetadata {
            name: name.into(),
            attempt: 0,
        };
        v.image = "busybox".into();
        v.labels = l;
        v
    }
}

/// A pod with a ready sandbox and one container, started unless `start` is false.
async fn pod(rt: &FakeRuntime, uid: &str, start: bool) -> (String, String) {
    let sc = sandbox_config(uid);
    let sb = rt.run_pod_sandbox(&sc).await.expect("sandbox");
    let id = rt
        .create_container(&sb, &container_config(uid, "app"), &sc)
        .await
        .expect("create");
    if start {
        rt.start_container(&id).await.expect("start");
    }
    (sb, id)
}

fn new_pleg(rt: &Arc<FakeRuntime>) -> (Arc<GenericPleg>, Receiver<PodLifecycleEvent>) {
    new_pleg_with(rt, GenericPlegConfig::default())
}

fn new_pleg_with(
    rt: &Arc<FakeRuntime>,
    config: GenericPlegConfig,
) -> (Arc<GenericPleg>, Receiver<PodLifecycleEvent>) {
    let runtime: Arc<dyn ContainerRuntime> = rt.clone();
    let (pleg, events) = GenericPleg::new(runtime, config);
    (Arc::new(pleg), events)
}

fn spawn_run(pleg: &Arc<GenericPleg>) -> CancellationToken {
    let shutdown = CancellationToken::new();
    let p = pleg.clone();
    let s = shutdown.clone();
    tokio::spawn(async move { p.run(s).await });
    shutdown
}

/// Wait for the first event matching `kind` and `id`; returns it and when it arrived.
async fn wait_event(
    rx: &mut Receiver<PodLifecycleEvent>,
    kind: PodLifecycleEventType,
    id: &str,
    within: Duration,
) -> Instant {
    let deadline = Instant::now() + within;
    loop {
        let ev = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("no {kind:?} for {id} within {within:?}"))
            .expect("channel open");
        if ev.kind == kind && ev.container_id == id {
            return Instant::now();
        }
    }
}

async fn next_event(
    rx: &mut Receiver<PodLifecycleEvent>,
    within: Duration,
) -> (String, PodLifecycleEventType) {
    let ev = tokio::time::timeout(within, rx.recv())
        .await
        .expect("an event in time")
        .expect("channel open");
    (ev.container_id, ev.kind)
}

fn sort(events: &mut [(String, PodLifecycleEventType)]) {
    events.sort_by_key(|(id, kind)| (id.clone(), format!("{kind:?}")));
}

fn drain(rx: &mut Receiver<PodLifecycleEvent>) -> Vec<(String, PodLifecycleEventType)> {
    let mut v = Vec::new();
    while let Ok(ev) = rx.try_recv() {
        v.push((ev.container_id, ev.kind));
    }
    v
}

#[tokio::test(start_paused = true)]
async fn container_start_exit_and_removal_are_reported_within_one_period() {
    let rt = Arc::new(FakeRuntime::new());
    let (pleg, mut rx) = new_pleg(&rt);
    let shutdown = spawn_run(&pleg);

    let (sb, id) = pod(&rt, "u1", true).await;
    let mut got = vec![
        next_event(&mut rx, Duration::from_secs(2)).await,
        next_event(&mut rx, Duration::from_secs(2)).await,
    ];
    sort(&mut got);
    let mut want = vec![(sb, ContainerStarted), (id.clone(), ContainerStarted)];
    sort(&mut want);
    assert_eq!(got, want);

    tokio::time::sleep(Duration::from_millis(300)).await;
    let exited_at = Instant::now();
    rt.exit_container(&id, 137).expect("exit");
    let seen = wait_event(&mut rx, ContainerDied, &id, Duration::from_secs(5)).await;
    assert!(
        seen - exited_at <= Duration::from_millis(1100),
        "death seen after {:?}",
        seen - exited_at
    );
    let status = pleg.cache().get("u1").expect("cached").status.expect("ok");
    let c = status.find_container("app").expect("container");
    assert_eq!((c.state, c.exit_code), (ContainerState::Exited, 137));

    rt.remove_container(&id).await.expect("remove");
    wait_event(&mut rx, ContainerRemoved, &id, Duration::from_secs(2)).await;
    // An exited container that disappears is only "removed", not "died" a second time.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(drain(&mut rx).is_empty());
    shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn sandbox_stop_and_removal_are_reported_and_the_pod_leaves_the_cache() {
    let rt = Arc::new(FakeRuntime::new());
    let (pleg, mut rx) = new_pleg(&rt);
    let (sb, id) = pod(&rt, "u1", true).await;
    pleg.relist().await.expect("relist");
    drain(&mut rx);

    rt.stop_pod_sandbox(&sb).await.expect("stop");
    pleg.relist().await.expect("relist");
    let mut got = drain(&mut rx);
    sort(&mut got);
    let mut want = vec![(id.clone(), ContainerDied), (sb.clone(), ContainerDied)];
    sort(&mut want);
    assert_eq!(got, want);

    rt.remove_pod_sandbox(&sb).await.expect("remove");
    pleg.relist().await.expect("relist");
    let mut got = drain(&mut rx);
    sort(&mut got);
    let mut want = vec![(id, ContainerRemoved), (sb, ContainerRemoved)];
    sort(&mut want);
    assert_eq!(got, want);

    assert!(pleg.cache().get("u1").is_none());
    // A worker waiting for a newer state of the vanished pod gets an empty status once the next
    // relist raises the global timestamp.
    tokio::time::sleep(Duration::from_millis(10)).await;
    let t = Instant::now();
    let cache = pleg.cache();
    let waiter = tokio::spawn(async move { cache.get_newer_than("u1", t).await });
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(!waiter.is_finished());
    pleg.relist().await.expect("relist");
    let entry = waiter.await.expect("join");
    let status = entry.status.expect("empty status");
    assert!(status.container_statuses.is_empty() && status.sandbox_statuses.is_empty());
}

#[tokio::test(start_paused = true)]
async fn get_newer_than_is_released_by_every_relist_even_for_unchanged_pods() {
    let rt = Arc::new(FakeRuntime::new());
    let (pleg, _rx) = new_pleg(&rt);
    let (_sb, id) = pod(&rt, "u1", true).await;
    pleg.relist().await.expect("relist");
    let first = pleg.cache().get("u1").expect("cached");
    let status = first.status.clone().expect("ok");
    assert_eq!(status.container_statuses.len(), 1);
    assert_eq!(status.container_statuses[0].id, id);
    assert_eq!(status.name, "pod-u1");
    assert_eq!(status.ips.len(), 1);

    let shutdown = spawn_run(&pleg);
    tokio::time::sleep(Duration::from_millis(10)).await;
    let t = Instant::now();
    let cache = pleg.cache();
    let waiter = tokio::spawn(async move { cache.get_newer_than("u1", t).await });
    let unknown = tokio::spawn({
        let cache = pleg.cache();
        async move { cache.get_newer_than("never-existed", t).await }
    });
    let entry = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .expect("released by the next relist")
        .expect("join");
    // Unchanged pod: the entry itself is the old one; the global timestamp released it.
    assert_eq!(entry.modified, first.modified);
    assert!(pleg.last_relist().expect("relisted") >= t);
    let empty = unknown.await.expect("join").status.expect("empty status");
    assert!(empty.container_statuses.is_empty());
    assert_eq!(empty.uid, "never-existed");

    // A changed pod gets a fresh entry stamped with the relist's start.
    tokio::time::sleep(Duration::from_millis(10)).await;
    let before_exit = Instant::now();
    rt.exit_container(&id, 0).expect("exit");
    let entry = pleg.cache().get_newer_than("u1", before_exit).await;
    assert!(entry.modified >= before_exit);
    let c = entry.status.expect("ok").container_statuses[0].clone();
    assert_eq!(
        (c.state, c.reason.as_str()),
        (ContainerState::Exited, "Completed")
    );
    shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_failed_inspection_is_cached_as_an_error_and_retried_next_relist() {
    let rt = Arc::new(FakeRuntime::new());
    let (pleg, mut rx) = new_pleg(&rt);
    let (sb, id) = pod(&rt, "u1", true).await;
    rt.fail_next(FakeOp::PodSandboxStatus, Error::unavailable("runtime busy"));

    let report = pleg.relist().await.expect("listing works");
    assert_eq!(report.inspection_failures.len(), 1);
    assert!(matches!(
        &report.inspection_failures[0],
        PlegError::InspectPod { uid, source } if uid == "u1" && source.kind() == ErrorKind::Unavailable
    ));
    assert!(
        drain(&mut rx).is_empty(),
        "events wait for a successful inspection"
    );
    let cached = pleg.cache().get("u1").expect("error cached");
    assert!(cached.status.expect_err("error").contains("runtime busy"));

    let report = pleg.relist().await.expect("relist");
    assert!(report.inspection_failures.is_empty());
    let mut got = drain(&mut rx);
    sort(&mut got);
    let mut want = vec![(id, ContainerStarted), (sb, ContainerStarted)];
    sort(&mut want);
    assert_eq!(got, want);
    assert!(pleg.cache().get("u1").expect("cached").status.is_ok());

    // Nothing changed since: no more events, no more inspections.
    rt.clear_calls();
    pleg.relist().await.expect("relist");
    assert!(drain(&mut rx).is_empty());
    assert!(!rt.calls().iter().any(|c| c.starts_with("container_status")));
}

#[tokio::test(start_paused = true)]
async fn a_hanging_pod_does_not_delay_other_pods_events() {
    let rt = Arc::new(FakeRuntime::new());
    let (pleg, mut rx) = new_pleg(&rt);
    // "a-slow" sorts first, so it is also first in line for inspection.
    let (_, slow) = pod(&rt, "a-slow", true).await;
    let (_, fast) = pod(&rt, "b-fast", true).await;
    pleg.relist().await.expect("baseline");
    drain(&mut rx);

    rt.set_call_delay("a-slow", Duration::from_secs(3600));
    let shutdown = spawn_run(&pleg);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let exited_at = Instant::now();
    rt.exit_container(&slow, 1).expect("exit slow");
    rt.exit_container(&fast, 1).expect("exit fast");
    let seen = wait_event(&mut rx, ContainerDied, &fast, Duration::from_secs(5)).await;
    assert!(
        seen - exited_at <= Duration::from_millis(1100),
        "fast pod's death seen after {:?}",
        seen - exited_at
    );
    // The slow pod's inspection is abandoned at the timeout, its error cached.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let cached = pleg.cache().get("a-slow").expect("entry");
    assert!(cached.status.expect_err("timed out").contains("timed out"));
    assert!(drain(&mut rx).iter().all(|(id, _)| *id != slow));

    // Once the runtime answers again, the pending diff is delivered.
    rt.set_call_delay("a-slow", Duration::ZERO);
    wait_event(&mut rx, ContainerDied, &slow, Duration::from_secs(15)).await;
    shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn health_follows_listing_failures_past_the_threshold_and_recovers() {
    let rt = Arc::new(FakeRuntime::new());
    let (pleg, _rx) = new_pleg(&rt);
    assert_eq!(
        pleg.healthy(),
        PlegHealth::Unhealthy("pleg has yet to be successful".into())
    );
    let shutdown = spawn_run(&pleg);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(pleg.healthy(), PlegHealth::Healthy);

    rt.fail_always(
        FakeOp::ListPodSandboxes,
        ErrorKind::Unavailable,
        "runtime down",
    );
    tokio::time::sleep(Duration::from_secs(179)).await;
    assert_eq!(
        pleg.healthy(),
        PlegHealth::Healthy,
        "still inside the threshold"
    );
    assert!(matches!(
        pleg.relist().await,
        Err(PlegError::ListPods { source }) if source.kind() == ErrorKind::Unavailable
    ));
    tokio::time::sleep(Duration::from_secs(2)).await;
    match pleg.healthy() {
        PlegHealth::Unhealthy(msg) => {
            assert!(msg.starts_with("pleg was last seen active 3m"), "{msg}");
            assert!(
                msg.contains("ago; threshold is 3m0s; runtime unreachable: "),
                "{msg}"
            );
            assert!(msg.ends_with("runtime down"), "{msg}");
        }
        PlegHealth::Healthy => panic!("should be unhealthy after 3 minutes of failures"),
    }

    let diagnosis = pleg.diagnose();
    assert!(
        diagnosis
            .runtime_error
            .is_some_and(|e| e.contains("runtime down"))
    );
    assert!(diagnosis.slow_pods.is_empty());

    rt.clear_failures(FakeOp::ListPodSandboxes);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(pleg.healthy(), PlegHealth::Healthy);
    assert_eq!(pleg.diagnose().runtime_error, None);
    shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn created_containers_are_inspected_but_not_reported_until_they_run() {
    let rt = Arc::new(FakeRuntime::new());
    let (pleg, mut rx) = new_pleg(&rt);
    let (sb, id) = pod(&rt, "u1", false).await;
    pleg.relist().await.expect("relist");
    assert_eq!(drain(&mut rx), vec![(sb, ContainerStarted)]);
    let status = pleg.cache().get("u1").expect("cached").status.expect("ok");
    assert_eq!(status.container_statuses[0].state, ContainerState::Created);

    rt.start_container(&id).await.expect("start");
    pleg.relist().await.expect("relist");
    assert_eq!(drain(&mut rx), vec![(id, ContainerStarted)]);
}

#[tokio::test(start_paused = true)]
async fn pod_ips_are_kept_after_the_sandbox_stops() {
    let rt = Arc::new(FakeRuntime::new());
    let (pleg, _rx) = new_pleg(&rt);
    let (sb, _id) = pod(&rt, "u1", true).await;
    pleg.relist().await.expect("relist");
    let ips = pleg
        .cache()
        .get("u1")
        .expect("cached")
        .status
        .expect("ok")
        .ips
        .clone();
    assert_eq!(ips.len(), 1);
    rt.stop_pod_sandbox(&sb).await.expect("stop");
    pleg.relist().await.expect("relist");
    let after = pleg.cache().get("u1").expect("cached").status.expect("ok");
    assert_eq!(after.ips, ips);
}

#[tokio::test(start_paused = true)]
async fn a_full_channel_drops_and_counts_events() {
    let rt = Arc::new(FakeRuntime::new());
    let (pleg, mut rx) = new_pleg(&rt);
    // 510 pods, each a sandbox and a container: 1020 ContainerStarted events for 1000 slots.
    for i in 0..510 {
        pod(&rt, &format!("u{i:03}"), true).await;
    }
    let report = pleg.relist().await.expect("relist");
    assert_eq!(report.events_sent, kubelet_api::PLEG_CHANNEL_CAPACITY);
    assert_eq!(report.events_discarded, 20);
    assert_eq!(pleg.discarded_events(), 20);
    assert_eq!(drain(&mut rx).len(), 1000);
    assert_eq!(pleg.cache().uids().len(), 510);
}

#[tokio::test(start_paused = true)]
async fn shutdown_stops_the_relist_loop() {
    let rt = Arc::new(FakeRuntime::new());
    let (pleg, _rx) = new_pleg_with(
        &rt,
        GenericPlegConfig::default().with_relist_period(Duration::from_millis(500)),
    );
    let shutdown = CancellationToken::new();
    let handle = tokio::spawn({
        let pleg = pleg.clone();
        let shutdown = shutdown.clone();
        async move { pleg.run(shutdown).await }
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    let lists = rt
        .calls()
        .iter()
        .filter(|c| *c == "list_pod_sandboxes")
        .count();
    assert!((4..=5).contains(&lists), "{lists} relists in 2s at 500ms");
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(1), handle)
        .await
        .expect("run returns on shutdown")
        .expect("join");
}

#[tokio::test(start_paused = true)]
async fn a_slow_pod_is_reported_on_its_own_and_never_stalls_relists_health_or_other_waiters() {
    let rt = Arc::new(FakeRuntime::new());
    let (pleg, mut rx) = new_pleg(&rt);
    let (_, slow) = pod(&rt, "a-slow", true).await;
    let (_, fast) = pod(&rt, "b-fast", true).await;
    let (_, later) = pod(&rt, "c-later", true).await;
    pleg.relist().await.expect("baseline");
    drain(&mut rx);

    rt.set_call_delay("a-slow", Duration::from_secs(3600));
    let shutdown = spawn_run(&pleg);
    tokio::time::sleep(Duration::from_millis(100)).await;
    rt.exit_container(&slow, 1).expect("exit slow");
    rt.exit_container(&fast, 1).expect("exit fast");
    wait_event(&mut rx, ContainerDied, &fast, Duration::from_secs(3)).await;

    // Relists go on every period while the slow inspection runs: a change of a third pod is
    // seen within about one period, not after the slow pod's 10 s timeout.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let t = Instant::now();
    let slow_waiter = tokio::spawn({
        let cache = pleg.cache();
        async move { cache.get_newer_than("a-slow", t).await }
    });
    let fast_waiter = tokio::spawn({
        let cache = pleg.cache();
        async move { cache.get_newer_than("b-fast", t).await }
    });
    rt.exit_container(&later, 2).expect("exit later");
    let seen = wait_event(&mut rx, ContainerDied, &later, Duration::from_secs(3)).await;
    assert!(
        seen - t <= Duration::from_millis(1100),
        "seen after {:?}",
        seen - t
    );
    assert_eq!(pleg.healthy(), PlegHealth::Healthy);
    let d = pleg.diagnose();
    assert_eq!(d.runtime_error, None);
    assert_eq!(
        d.slow_pods
            .iter()
            .map(|p| p.uid.as_str())
            .collect::<Vec<_>>(),
        vec!["a-slow"]
    );
    // An unchanged pod's waiter is released by the relists' global timestamp; the slow pod's
    // waiter is held (its change is not inspected yet), and released by its timeout's error.
    tokio::time::timeout(Duration::from_secs(2), fast_waiter)
        .await
        .expect("released by a relist")
        .expect("join");
    assert!(!slow_waiter.is_finished());
    let entry = tokio::time::timeout(Duration::from_secs(11), slow_waiter)
        .await
        .expect("released by the inspection timeout")
        .expect("join");
    assert!(entry.status.expect_err("timed out").contains("timed out"));
    assert!(pleg.metrics().inspection_timeouts() >= 1);
    shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn relist_metrics_have_the_kubelets_names() {
    let rt = Arc::new(FakeRuntime::new());
    let (pleg, _rx) = new_pleg(&rt);
    pod(&rt, "u1", true).await;
    pleg.relist().await.expect("relist");
    tokio::time::sleep(Duration::from_secs(1)).await;
    pleg.relist().await.expect("relist");
    let _ = pleg.healthy();
    let mut registry = prometheus_client::registry::Registry::default();
    pleg.register_metrics(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    for line in [
        "# TYPE kubelet_pleg_relist_duration_seconds histogram",
        "kubelet_pleg_relist_duration_seconds_count 2",
        "# TYPE kubelet_pleg_relist_interval_seconds histogram",
        "kubelet_pleg_relist_interval_seconds_count 1",
        "# TYPE kubelet_pleg_last_seen_seconds gauge",
        "# TYPE kubelet_pleg_discard_events counter",
        "kubelet_pleg_discard_events_total 0",
    ] {
        assert!(text.contains(line), "{line} missing in\n{text}");
    }
}
