//! The evented PLEG over the real process runtime (real shims, real processes, inotify): exits
//! are detected from events with the safety-net relist an hour away, a broken stream falls back
//! to relisting and recovers, a lost event is found by the relist, and a pod whose runtime calls
//! hang does not hold back another pod's events.
//!
//! Own `main` (`harness = false`): the process runtime re-runs this executable as the shim.

mod common;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use common::{sandbox_config, shell_container};
use kubelet_api::ContainerRuntime;
use kubelet_api::runtime::ContainerState;
use kubelet_api::{
    PlegHealth, PodLifecycleEvent, PodLifecycleEventGenerator, PodLifecycleEventType,
};
use kubelet_core::testing::FaultyRuntime;
use kubelet_pleg::{EventedPleg, EventedPlegConfig, GenericPlegConfig, PlegMode};
use kubelet_process::{ProcessRuntime, ProcessRuntimeConfig, ShimCommand};
use tokio::sync::mpsc::Receiver;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use PodLifecycleEventType::{ContainerDied, ContainerStarted};

type TestFn = fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>;

fn main() -> ExitCode {
    if let Some(code) = kubelet_process::shim::maybe_run_shim() {
        return code;
    }
    let tests: &[(&str, TestFn)] = &[
        (
            "a_container_exit_is_detected_from_its_event_without_a_relist",
            || Box::pin(a_container_exit_is_detected_from_its_event_without_a_relist()),
        ),
        (
            "waiters_are_released_by_the_global_timestamp_without_a_relist",
            || Box::pin(waiters_are_released_by_the_global_timestamp_without_a_relist()),
        ),
        (
            "an_exit_after_an_agent_restart_is_detected_from_its_event",
            || Box::pin(an_exit_after_an_agent_restart_is_detected_from_its_event()),
        ),
        (
            "a_broken_event_stream_falls_back_to_relisting_and_recovers",
            || Box::pin(a_broken_event_stream_falls_back_to_relisting_and_recovers()),
        ),
        ("an_event_lost_on_purpose_is_found_by_the_relist", || {
            Box::pin(an_event_lost_on_purpose_is_found_by_the_relist())
        }),
        (
            "a_pod_whose_runtime_calls_hang_does_not_delay_other_pods_events",
            || Box::pin(a_pod_whose_runtime_calls_hang_does_not_delay_other_pods_events()),
        ),
    ];
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let mut passed = 0;
    for (name, f) in tests {
        if filter.as_deref().is_some_and(|f| !name.contains(f)) {
            println!("test {name} ... filtered out");
            continue;
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        rt.block_on(f());
        println!("test {name} ... ok");
        passed += 1;
    }
    println!("{passed} passed, 0 failed");
    ExitCode::SUCCESS
}

struct Setup {
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
    process: Arc<ProcessRuntime>,
    faulty: Arc<FaultyRuntime>,
    pleg: Arc<EventedPleg>,
    events: Receiver<PodLifecycleEvent>,
    shutdown: CancellationToken,
}

fn process_runtime(state: &std::path::Path) -> Arc<ProcessRuntime> {
    let config = ProcessRuntimeConfig::new(state)
        .shim(ShimCommand::CurrentExe)
        .use_cgroups(false);
    Arc::new(ProcessRuntime::new(config).expect("process runtime"))
}

/// An evented PLEG over the process runtime (through [`FaultyRuntime`]), running, with its first
/// relist done and its stream subscribed.
async fn setup(config: EventedPlegConfig, dir: Option<tempfile::TempDir>) -> Setup {
    let dir = dir.unwrap_or_else(|| tempfile::tempdir().expect("tempdir"));
    let process = process_runtime(&dir.path().join("state"));
    let faulty = Arc::new(FaultyRuntime::new(process.clone()));
    let runtime: Arc<dyn ContainerRuntime> = faulty.clone();
    let (pleg, pleg_events) = EventedPleg::new(runtime, config);
    let pleg = std::sync::Arc::new(pleg);
    let events = pleg_events;
    let shutdown = CancellationToken::new();
    tokio::spawn({
        let pleg = pleg.clone();
        let shutdown = shutdown.clone();
        async move { pleg.run(shutdown).await }
    });
    wait_until(
        "the first relist with events",
        Duration::from_secs(10),
        || {
            pleg.mode() == PlegMode::Events
                && pleg.last_relist().is_some()
                && pleg.metrics().connection_successes() == 1
        },
    )
    .await;
    Setup {
        root: dir.path().to_path_buf(),
        _dir: dir,
        process,
        faulty,
        pleg,
        events,
        shutdown,
    }
}

async fn wait_until(what: &str, within: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < deadline, "no {what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Wait for `kind` about `id`; returns when it arrived.
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

/// Start pod `uid` with one container running `script`; returns (sandbox, container).
async fn start_pod(
    rt: &dyn ContainerRuntime,
    root: &std::path::Path,
    uid: &str,
    script: &str,
) -> (String, String) {
    let sb = sandbox_config(root, uid);
    let sid = rt.run_pod_sandbox(&sb).await.expect("sandbox");
    let cfg = shell_container(&sb, "app", "busybox", script);
    let cid = rt.create_container(&sid, &cfg, &sb).await.expect("create");
    rt.start_container(&cid).await.expect("start");
    (sid, cid)
}

async fn teardown(s: Setup, sandboxes: &[String]) {
    s.shutdown.cancel();
    for sid in sandboxes {
        s.process.stop_pod_sandbox(sid).await.expect("stop sandbox");
        s.process
            .remove_pod_sandbox(sid)
            .await
            .expect("remove sandbox");
    }
}

fn long_relist() -> EventedPlegConfig {
    EventedPlegConfig::default().with_relist_period(Duration::from_secs(3600))
}

async fn a_container_exit_is_detected_from_its_event_without_a_relist() {
    let mut s = setup(long_relist(), None).await;
    let relisted = s.pleg.last_relist();
    let (sid, cid) = start_pod(&*s.faulty, &s.root, "ev-1", "sleep 0.3; exit 3").await;
    wait_event(
        &mut s.events,
        ContainerStarted,
        &cid,
        Duration::from_secs(5),
    )
    .await;
    wait_event(&mut s.events, ContainerDied, &cid, Duration::from_secs(5)).await;
    assert_eq!(
        s.pleg.last_relist(),
        relisted,
        "no relist ran: the event alone explains it"
    );
    let status = s
        .pleg
        .cache()
        .get("ev-1")
        .expect("cached")
        .status
        .expect("inspected");
    let c = status.find_container("app").expect("container status");
    assert_eq!((c.state, c.exit_code), (ContainerState::Exited, 3));
    assert_eq!(status.name, "pod-ev-1");
    // Nothing is reported twice.
    tokio::time::sleep(Duration::from_millis(300)).await;
    while let Ok(ev) = s.events.try_recv() {
        assert!(
            !(ev.container_id == cid && matches!(ev.kind, ContainerStarted | ContainerDied)),
            "duplicate {ev:?}"
        );
    }
    teardown(s, &[sid]).await;
}

async fn waiters_are_released_by_the_global_timestamp_without_a_relist() {
    let config = long_relist().with_global_cache_update_period(Duration::from_millis(500));
    let mut s = setup(config, None).await;
    let (sid, cid) = start_pod(&*s.faulty, &s.root, "gt-1", "sleep 3600").await;
    wait_event(
        &mut s.events,
        ContainerStarted,
        &cid,
        Duration::from_secs(5),
    )
    .await;
    let relisted = s.pleg.last_relist();
    // Unchanged pods (and pods the runtime never had) are released by the periodic bump of the
    // global timestamp: no worker waits for the 1 h relist.
    for round in 0..3 {
        let t = Instant::now();
        let cache = s.pleg.cache();
        let (a, b) = tokio::join!(
            tokio::time::timeout(Duration::from_secs(5), cache.get_newer_than("gt-1", t)),
            tokio::time::timeout(
                Duration::from_secs(5),
                cache.get_newer_than("no-such-pod", t)
            ),
        );
        let a = a.unwrap_or_else(|_| panic!("round {round}: the running pod's waiter hangs"));
        let b = b.unwrap_or_else(|_| panic!("round {round}: the unknown pod's waiter hangs"));
        assert!(
            a.modified < t,
            "the entry itself is older: the global timestamp released it"
        );
        let c = a
            .status
            .expect("status")
            .find_container("app")
            .cloned()
            .expect("container");
        assert_eq!(c.state, ContainerState::Running);
        assert!(
            b.status
                .expect("empty status")
                .container_statuses
                .is_empty()
        );
    }
    assert_eq!(s.pleg.last_relist(), relisted, "no relist ran meanwhile");
    teardown(s, &[sid]).await;
}

async fn an_exit_after_an_agent_restart_is_detected_from_its_event() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (sid, cid) = {
        // The first agent starts the container and goes away; the shim stays.
        let first = process_runtime(&dir.path().join("state"));
        start_pod(&*first, dir.path(), "ev-2", "sleep 2; exit 4").await
    };
    let mut s = setup(long_relist(), Some(dir)).await;
    let relisted = s.pleg.last_relist();
    wait_event(
        &mut s.events,
        ContainerStarted,
        &cid,
        Duration::from_secs(5),
    )
    .await;
    wait_event(&mut s.events, ContainerDied, &cid, Duration::from_secs(10)).await;
    assert_eq!(
        s.pleg.last_relist(),
        relisted,
        "detected from the shim's exit record"
    );
    let status = s
        .pleg
        .cache()
        .get("ev-2")
        .expect("cached")
        .status
        .expect("inspected");
    let c = status.find_container("app").expect("container status");
    assert_eq!((c.state, c.exit_code), (ContainerState::Exited, 4));
    teardown(s, &[sid]).await;
}

async fn a_broken_event_stream_falls_back_to_relisting_and_recovers() {
    let config = long_relist()
        .with_max_stream_retries(3)
        .with_stream_retry_delay(Duration::from_millis(100))
        .with_stream_recovery_period(Duration::from_secs(1))
        .with_fallback_relist_period(Duration::from_secs(1));
    let mut s = setup(config, None).await;
    s.faulty.set_broken(true);
    wait_until("fallback", Duration::from_secs(10), || {
        s.pleg.mode() == PlegMode::Fallback
    })
    .await;
    assert!(s.pleg.metrics().connection_errors() >= 3);
    assert_eq!(s.pleg.healthy(), PlegHealth::Healthy);

    // Fallen back: relists every second find the exit.
    let before = s.pleg.last_relist();
    let (sid1, cid1) = start_pod(&*s.faulty, &s.root, "fb-1", "sleep 0.2; exit 1").await;
    wait_event(&mut s.events, ContainerDied, &cid1, Duration::from_secs(5)).await;
    assert!(s.pleg.last_relist() > before, "found by a relist");

    // The stream works again: events take over.
    s.faulty.set_broken(false);
    wait_until("events again", Duration::from_secs(5), || {
        s.pleg.mode() == PlegMode::Events
    })
    .await;
    let successes = s.pleg.metrics().connection_successes();
    assert!(successes >= 2);
    // Let the relist forced by the new subscription finish.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let relisted = s.pleg.last_relist();
    let (sid2, cid2) = start_pod(&*s.faulty, &s.root, "fb-2", "sleep 0.2; exit 2").await;
    wait_event(&mut s.events, ContainerDied, &cid2, Duration::from_secs(5)).await;
    assert_eq!(s.pleg.last_relist(), relisted, "detected from the event");
    teardown(s, &[sid1, sid2]).await;
}

async fn an_event_lost_on_purpose_is_found_by_the_relist() {
    let config = EventedPlegConfig::default().with_relist_period(Duration::from_secs(2));
    let mut s = setup(config, None).await;
    let sb = sandbox_config(&s.root, "lost-1");
    let sid = s.faulty.run_pod_sandbox(&sb).await.expect("sandbox");
    let cfg = shell_container(&sb, "app", "busybox", "sleep 0.3; exit 5");
    let cid = s
        .faulty
        .create_container(&sid, &cfg, &sb)
        .await
        .expect("create");
    s.faulty.lose_events_of(&cid);
    s.faulty.start_container(&cid).await.expect("start");
    let started = Instant::now();
    wait_event(&mut s.events, ContainerDied, &cid, Duration::from_secs(10)).await;
    assert!(s.faulty.lost() >= 1, "the container's events were dropped");
    assert!(
        s.pleg.last_relist().expect("relisted") > started,
        "a relist after the start found it"
    );
    let status = s
        .pleg
        .cache()
        .get("lost-1")
        .expect("cached")
        .status
        .expect("inspected");
    let c = status.find_container("app").expect("container status");
    assert_eq!((c.state, c.exit_code), (ContainerState::Exited, 5));
    teardown(s, &[sid]).await;
}

async fn a_pod_whose_runtime_calls_hang_does_not_delay_other_pods_events() {
    let config = long_relist().with_relist(
        GenericPlegConfig::default()
            .with_relist_period(Duration::from_secs(3600))
            // The hung inspection is reported slow from the inspection wait (1 s) until it
            // times out: a window wide enough for a loaded machine to look inside it.
            .with_inspect_timeout(Duration::from_secs(6)),
    );
    let mut s = setup(config, None).await;
    let (sid_slow, slow) = start_pod(&*s.faulty, &s.root, "hang-slow", "sleep 1; exit 6").await;
    let (sid_fast, fast) = start_pod(&*s.faulty, &s.root, "hang-fast", "sleep 1; exit 7").await;
    wait_event(
        &mut s.events,
        ContainerStarted,
        &slow,
        Duration::from_secs(5),
    )
    .await;
    s.faulty.set_slow_pod(Some("hang-slow"));
    // Both exit about together; the fast pod's death arrives while the slow pod's inspection
    // hangs.
    let mut slow_died = false;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let ev = tokio::time::timeout_at(deadline, s.events.recv())
            .await
            .expect("the fast pod's death in time")
            .expect("open");
        if ev.container_id == slow && ev.kind == ContainerDied {
            slow_died = true;
        }
        if ev.container_id == fast && ev.kind == ContainerDied {
            break;
        }
    }
    assert!(!slow_died, "the slow pod's inspection cannot have finished");
    assert_eq!(s.pleg.healthy(), PlegHealth::Healthy);
    wait_until("the slow pod reported", Duration::from_secs(4), || {
        s.pleg.slow_pods().iter().any(|p| p.uid == "hang-slow")
    })
    .await;
    // Its inspection times out (error cached), then succeeds once the runtime answers.
    wait_until("the slow pod's timeout", Duration::from_secs(10), || {
        s.pleg
            .cache()
            .get("hang-slow")
            .is_some_and(|e| e.status.is_err())
    })
    .await;
    s.faulty.set_slow_pod(None);
    wait_event(&mut s.events, ContainerDied, &slow, Duration::from_secs(10)).await;
    teardown(s, &[sid_slow, sid_fast]).await;
}
