//! The prober wired into the engine (KubeletBuilder + GenericPleg + the in-memory runtime),
//! probing real HTTP and TCP servers in real time.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Container, ContainerStatus, HTTPGetAction, Pod, PodSpec, PodStatus, Probe, TCPSocketAction,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kubelet_api::ContainerRuntime;
use kubelet_core::testing::{FakeRuntime, RecordingSink, WatchSource};
use kubelet_core::{KubeletBuilder, KubeletConfig};
use kubelet_pleg::{GenericPleg, GenericPlegConfig};
use kubelet_probe::{Prober, ProberConfig};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(90);

fn http_probe(port: u16, path: &str, failure: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            host: Some("127.0.0.1".into()),
            port: IntOrString::Int(i32::from(port)),
            path: Some(path.into()),
            ..Default::default()
        }),
        period_seconds: Some(1),
        failure_threshold: Some(failure),
        ..Default::default()
    }
}

fn pod(uid: &str, app: Container) -> Pod {
    let mut p = Pod {
        spec: Some(PodSpec {
            restart_policy: Some("Always".into()),
            containers: vec![app],
            termination_grace_period_seconds: Some(1),
            ..Default::default()
        }),
        ..Default::default()
    };
    p.metadata.name = Some(format!("pod-{uid}"));
    p.metadata.namespace = Some("default".into());
    p.metadata.uid = Some(uid.into());
    p
}

fn app() -> Container {
    Container {
        name: "app".into(),
        image: Some("busybox:1".into()),
        command: Some(vec!["sleep".into(), "1000".into()]),
        ..Default::default()
    }
}

struct Agent {
    rt: Arc<FakeRuntime>,
    sink: Arc<RecordingSink>,
    _pods: watch::Sender<Option<Vec<Pod>>>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Agent {
    fn start(pod: Pod) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let rt = Arc::new(FakeRuntime::new());
        let runtime: Arc<dyn ContainerRuntime> = rt.clone();
        let (pleg, pleg_events) = GenericPleg::new(runtime.clone(), GenericPlegConfig::default());
        let pleg = std::sync::Arc::new(pleg);
        let sink = Arc::new(RecordingSink::new());
        let (source, tx) = WatchSource::new(Some(vec![pod]));
        let (prober, probe_updates) = Prober::new(ProberConfig::default());
        let kubelet = KubeletBuilder::new("node-1")
            .config(KubeletConfig::with_dirs(
                dir.path().join("root"),
                dir.path().join("logs"),
            ))
            .runtime(runtime)
            .pleg(pleg, pleg_events)
            .pod_source(Arc::new(source))
            .status_sink(sink.clone())
            .prober(Arc::new(prober), probe_updates)
            .build()
            .unwrap();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(kubelet.run(shutdown.clone()));
        Self {
            rt,
            sink,
            _pods: tx,
            shutdown,
            task,
            _dir: dir,
        }
    }

    /// Wait for a status of `uid` recorded after the first `from` statuses that satisfies `f`.
    async fn wait_after(
        &self,
        uid: &str,
        from: usize,
        what: &str,
        f: impl Fn(&PodStatus) -> bool,
    ) -> PodStatus {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let all = self.sink.statuses(uid);
            if let Some(s) = all.iter().skip(from).find(|s| f(s)) {
                return s.clone();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}; latest: {:#?}",
                all.last()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn mark(&self, uid: &str) -> usize {
        self.sink.statuses(uid).len()
    }

    async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }
}

fn app_status(s: &PodStatus) -> Option<&ContainerStatus> {
    s.container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == "app")
}

fn running(s: &PodStatus) -> bool {
    app_status(s).is_some_and(|c| c.state.as_ref().is_some_and(|st| st.running.is_some()))
}

fn ready(s: &PodStatus) -> bool {
    app_status(s).is_some_and(|c| c.ready)
}

fn condition(s: &PodStatus, t: &str) -> Option<String> {
    s.conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == t)
        .map(|c| c.status.clone())
}

fn restarts(s: &PodStatus) -> i32 {
    app_status(s).map_or(0, |c| c.restart_count)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_whose_http_server_starts_failing_is_marked_unready_then_ready_again() {
    let srv = common::http_server(false).await;
    let mut c = app();
    c.readiness_probe = Some(http_probe(srv.addr.port(), "/health", 1));
    let agent = Agent::start(pod("ready-1", c));

    let first = agent
        .wait_after("ready-1", 0, "a running container", running)
        .await;
    assert!(!ready(&first), "readiness starts False: {first:#?}");
    let s = agent
        .wait_after("ready-1", 0, "ready", |s| running(s) && ready(s))
        .await;
    assert_eq!(condition(&s, "Ready").as_deref(), Some("True"));
    assert_eq!(condition(&s, "ContainersReady").as_deref(), Some("True"));

    let mark = agent.mark("ready-1");
    srv.state.unhealthy.store(true, Ordering::SeqCst);
    let s = agent
        .wait_after("ready-1", mark, "unready", |s| !ready(s))
        .await;
    assert_eq!(condition(&s, "Ready").as_deref(), Some("False"));
    assert_eq!(condition(&s, "ContainersReady").as_deref(), Some("False"));
    assert_eq!(restarts(&s), 0, "readiness failures do not restart");
    let ev = agent
        .sink
        .wait_for_event(|e| e.reason == "Unhealthy", WAIT)
        .await
        .unwrap();
    assert_eq!(
        ev.message,
        "Readiness probe failed: HTTP probe failed with statuscode: 500"
    );
    assert_eq!(ev.involved.field_path, "spec.containers{app}");

    let mark = agent.mark("ready-1");
    srv.state.unhealthy.store(false, Ordering::SeqCst);
    let s = agent
        .wait_after("ready-1", mark, "ready again", ready)
        .await;
    assert_eq!(condition(&s, "Ready").as_deref(), Some("True"));
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_liveness_probe_restarts_the_container() {
    let srv = common::http_server(false).await;
    let mut c = app();
    let mut probe = http_probe(srv.addr.port(), "/health", 2);
    // The probe-level grace period applies to the liveness kill (the pod's is 1 s).
    probe.termination_grace_period_seconds = Some(7);
    c.liveness_probe = Some(probe);
    let agent = Agent::start(pod("live-1", c));
    let s = agent.wait_after("live-1", 0, "running", running).await;
    let first_id = app_status(&s).unwrap().container_id.clone();
    assert!(ready(&s), "no readiness probe: ready once running");

    let mark = agent.mark("live-1");
    srv.state.unhealthy.store(true, Ordering::SeqCst);
    let ev = agent
        .sink
        .wait_for_event(|e| e.reason == "Killing", WAIT)
        .await
        .unwrap();
    assert!(
        ev.message.contains("failed liveness probe"),
        "{}",
        ev.message
    );
    srv.state.unhealthy.store(false, Ordering::SeqCst);
    let s = agent
        .wait_after("live-1", mark, "a restarted container", |s| {
            running(s) && restarts(s) >= 1
        })
        .await;
    assert_ne!(app_status(&s).unwrap().container_id, first_id);
    let first = kubelet_api::runtime::strip_container_id(first_id.as_deref().unwrap());
    assert!(
        agent
            .rt
            .calls()
            .iter()
            .any(|c| c == &format!("stop_container {first} 7s")),
        "{:#?}",
        agent.rt.calls()
    );
    let last = app_status(&s).unwrap().last_state.clone().unwrap();
    assert!(last.terminated.is_some(), "{last:#?}");
    assert!(
        agent
            .sink
            .events()
            .iter()
            .any(|e| e.message == "Liveness probe failed: HTTP probe failed with statuscode: 500")
    );
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_startup_probe_holds_liveness_back_until_it_succeeds() {
    // Liveness would fail at once; the startup probe waits for a port that opens later.
    let srv = common::http_server(false).await;
    srv.state.unhealthy.store(true, Ordering::SeqCst);
    let startup_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut c = app();
    c.liveness_probe = Some(http_probe(srv.addr.port(), "/health", 1));
    c.startup_probe = Some(Probe {
        tcp_socket: Some(TCPSocketAction {
            host: Some("127.0.0.1".into()),
            port: IntOrString::Int(i32::from(startup_port)),
        }),
        period_seconds: Some(1),
        failure_threshold: Some(1000),
        ..Default::default()
    });
    let agent = Agent::start(pod("start-1", c));
    let s = agent.wait_after("start-1", 0, "running", running).await;
    assert_eq!(app_status(&s).unwrap().started, Some(false));
    assert!(!ready(&s), "not ready before started");

    tokio::time::sleep(Duration::from_secs(4)).await;
    let latest = agent.sink.latest("start-1").unwrap();
    assert_eq!(restarts(&latest), 0, "liveness held back: {latest:#?}");
    assert_eq!(app_status(&latest).unwrap().started, Some(false));
    assert!(
        !agent
            .sink
            .events()
            .iter()
            .any(|e| e.message.starts_with("Liveness probe")),
        "no liveness probe ran before startup succeeded"
    );
    assert_eq!(srv.state.requests.load(Ordering::SeqCst), 0);

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", startup_port))
        .await
        .unwrap();
    let s = agent
        .wait_after("start-1", 0, "started", |s| {
            app_status(s).and_then(|c| c.started) == Some(true)
        })
        .await;
    assert_eq!(restarts(&s), 0);
    let s = agent
        .wait_after("start-1", 0, "restart by liveness", |s| restarts(s) >= 1)
        .await;
    assert!(restarts(&s) >= 1);
    assert!(srv.state.requests.load(Ordering::SeqCst) >= 1);
    drop(listener);
    agent.stop().await;
}

/// The app's state in a status, for the sequence check below.
fn app_state(s: &PodStatus) -> &'static str {
    let Some(st) = app_status(s).and_then(|c| c.state.as_ref()) else {
        return "none";
    };
    if st.running.is_some() {
        "running"
    } else if st.terminated.is_some() {
        "terminated"
    } else if st
        .waiting
        .as_ref()
        .is_some_and(|w| w.reason.as_deref() == Some("CrashLoopBackOff"))
    {
        "backoff"
    } else {
        "waiting"
    }
}

#[tokio::test(start_paused = true)]
async fn a_container_its_liveness_probe_keeps_killing_backs_off_like_a_crashing_one() {
    let mut c = app();
    c.liveness_probe = Some(Probe {
        exec: Some(k8s_openapi::api::core::v1::ExecAction {
            command: Some(vec!["check".into()]),
        }),
        period_seconds: Some(1),
        failure_threshold: Some(1),
        ..Default::default()
    });
    let agent = Agent::start(pod("live-2", c));
    // Every liveness check fails.
    agent.rt.set_exec_handler(|_, _| {
        Ok(kubelet_api::runtime::ExecResult {
            exit_code: 1,
            ..Default::default()
        })
    });
    let started = || {
        agent
            .rt
            .calls()
            .iter()
            .filter(|c| c.starts_with("start_container"))
            .count()
    };
    let begin = tokio::time::Instant::now();
    while begin.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Kills at ~1 s after each start; the first restart is immediate, then 10 s and 20 s
    // back-offs from the previous exit (the kubelet's doBackOff on the newest exited instance).
    // Without back-off a start every ~2 s would give about 30.
    let n = started();
    assert!(
        (3..=6).contains(&n),
        "{n} starts in 60 s: {:#?}",
        agent.rt.calls()
    );
    let statuses = agent.sink.statuses("live-2");
    assert!(
        statuses.iter().any(|s| app_state(s) == "backoff"),
        "never in CrashLoopBackOff"
    );
    // Between a back-off's end and the new instance running, the status does not go back to
    // the old instance's Terminated.
    let states: Vec<&str> = statuses.iter().map(app_state).collect();
    for w in states.windows(2) {
        assert!(
            !(w[0] == "backoff" && w[1] == "terminated"),
            "a stale Terminated after CrashLoopBackOff: {states:?}"
        );
    }
    agent.stop().await;
}
