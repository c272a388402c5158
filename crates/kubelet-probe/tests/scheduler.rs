//! The scheduler's timing and result semantics under paused time, with a scripted exec target.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use kubelet_api::runtime::ExecResult;
use kubelet_api::{Event, EventRecorder, ProbeResult, ProbeType, ProbeUpdate};
use kubelet_probe::{
    ContainerObservation, ExecFailure, Observation, ProbeHandler, ProbeRegistration, ProbeSpec,
    ProbeTargets, ProbeTiming, Prober, ProberConfig, StaticTargets,
};
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Copy, Debug)]
enum Answer {
    Exit(i32),
    Timeout,
    Error,
}

/// Static targets whose exec answers as scripted and records when it was called.
struct Scripted {
    inner: StaticTargets,
    answer: Mutex<Answer>,
    calls: Mutex<Vec<(Instant, String)>>,
}

impl Scripted {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            inner: StaticTargets::new(),
            answer: Mutex::new(Answer::Exit(0)),
            calls: Mutex::new(Vec::new()),
        })
    }
    fn answer(&self, a: Answer) {
        *self.answer.lock() = a;
    }
    fn calls(&self) -> Vec<(Instant, String)> {
        self.calls.lock().clone()
    }
}

#[async_trait]
impl ProbeTargets for Scripted {
    fn observe(&self, pod_uid: &str, container: &str) -> Observation {
        self.inner.observe(pod_uid, container)
    }
    async fn exec(
        &self,
        container_id: &str,
        _cmd: &[String],
        _timeout: Duration,
    ) -> Result<ExecResult, ExecFailure> {
        self.calls
            .lock()
            .push((Instant::now(), container_id.to_string()));
        match *self.answer.lock() {
            Answer::Exit(code) => Ok(ExecResult {
                stdout: format!("exit {code}").into_bytes(),
                stderr: Vec::new(),
                exit_code: code,
            }),
            Answer::Timeout => Err(ExecFailure::Timeout),
            Answer::Error => Err(ExecFailure::Error("runtime said no".into())),
        }
    }
}

fn exec_spec(timing: ProbeTiming) -> ProbeSpec {
    ProbeSpec::new(
        ProbeHandler::Exec {
            command: vec!["check".into(), "health".into()],
        },
        timing,
    )
}

fn timing(period: u64, failure: u32) -> ProbeTiming {
    let mut t = ProbeTiming::with_period(Duration::from_secs(period));
    t.failure_threshold = failure;
    t
}

struct Harness {
    prober: Arc<Prober>,
    targets: Arc<Scripted>,
    updates: mpsc::Receiver<ProbeUpdate>,
    events: mpsc::Receiver<Event>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Harness {
    /// A prober created `age` before the probes are added.
    async fn start(config: ProberConfig, age: Duration) -> Self {
        let (prober, updates) = Prober::new(config);
        let prober = Arc::new(prober);
        tokio::time::advance(age).await;
        let targets = Scripted::new();
        let (recorder, events) = EventRecorder::channel(1000);
        let stop = CancellationToken::new();
        let task = {
            let p = prober.clone();
            let t: Arc<dyn ProbeTargets> = targets.clone();
            let s = stop.clone();
            tokio::spawn(async move { p.run_with(t, recorder, s).await })
        };
        Self {
            prober,
            targets,
            updates,
            events,
            stop,
            task,
        }
    }

    fn updates(&mut self) -> Vec<(String, ProbeResult)> {
        let mut v = Vec::new();
        while let Ok(u) = self.updates.try_recv() {
            v.push((u.container_id, u.result));
        }
        v
    }

    fn events(&mut self) -> Vec<Event> {
        let mut v = Vec::new();
        while let Ok(e) = self.events.try_recv() {
            v.push(e);
        }
        v
    }

    async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap();
    }
}

/// Let the scheduler and its probe tasks run, then advance paused time by `d`.
async fn run_for(d: Duration) {
    let step = Duration::from_millis(100);
    let mut left = d;
    while !left.is_zero() {
        let s = step.min(left);
        tokio::time::sleep(s).await;
        left -= s;
    }
}

const LONG_AGO: Duration = Duration::from_secs(3600);

#[tokio::test(start_paused = true)]
async fn probes_run_once_per_period_starting_immediately_when_the_agent_is_old() {
    let mut h = Harness::start(ProberConfig::default(), LONG_AGO).await;
    let since = Instant::now();
    h.targets
        .inner
        .set("p", "app", ContainerObservation::running("c1", since, None));
    let added = Instant::now();
    h.prober.add_probe(ProbeRegistration::new(
        "p",
        "app",
        ProbeType::Readiness,
        exec_spec(timing(2, 3)),
    ));
    run_for(Duration::from_millis(9_050)).await;
    let calls = h.targets.calls();
    let offsets: Vec<u64> = calls
        .iter()
        .map(|(t, _)| t.duration_since(added).as_millis() as u64)
        .collect();
    assert_eq!(offsets.len(), 5, "{offsets:?}");
    for (i, o) in offsets.iter().enumerate() {
        let want = i as u64 * 2000;
        assert!(o.abs_diff(want) <= 100, "probe {i} at {o} ms: {offsets:?}");
    }
    assert_eq!(
        h.updates(),
        vec![
            ("c1".into(), ProbeResult::Failure),
            ("c1".into(), ProbeResult::Success)
        ],
        "readiness starts False, then one success flips it"
    );
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn the_first_probe_is_jittered_within_one_period_right_after_the_agent_starts() {
    let h = Harness::start(ProberConfig::default(), Duration::ZERO).await;
    h.targets.inner.set(
        "p",
        "app",
        ContainerObservation::running("c1", Instant::now(), None),
    );
    let added = Instant::now();
    h.prober.add_probe(ProbeRegistration::new(
        "p",
        "app",
        ProbeType::Readiness,
        exec_spec(timing(10, 3)),
    ));
    run_for(Duration::from_secs(10)).await;
    let calls = h.targets.calls();
    assert_eq!(calls.len(), 1, "exactly one probe in the first period");
    assert!(calls[0].0.duration_since(added) < Duration::from_secs(10));
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn initial_delay_holds_probes_back_from_the_container_start() {
    let h = Harness::start(ProberConfig::default(), LONG_AGO).await;
    let since = Instant::now();
    h.targets
        .inner
        .set("p", "app", ContainerObservation::running("c1", since, None));
    let mut t = timing(1, 3);
    t.initial_delay = Duration::from_secs(5);
    h.prober.add_probe(ProbeRegistration::new(
        "p",
        "app",
        ProbeType::Liveness,
        exec_spec(t),
    ));
    run_for(Duration::from_millis(4_500)).await;
    assert!(h.targets.calls().is_empty(), "nothing before the delay");
    run_for(Duration::from_millis(1_000)).await;
    let calls = h.targets.calls();
    assert_eq!(calls.len(), 1);
    assert!(calls[0].0.duration_since(since) >= Duration::from_secs(5));
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn liveness_fails_after_the_threshold_holds_and_resets_on_a_new_container() {
    let mut h = Harness::start(ProberConfig::default(), LONG_AGO).await;
    h.targets.answer(Answer::Exit(1));
    h.targets.inner.set(
        "p",
        "app",
        ContainerObservation::running("c1", Instant::now(), None),
    );
    h.prober.add_probe(ProbeRegistration::new(
        "p",
        "app",
        ProbeType::Liveness,
        exec_spec(timing(1, 3)),
    ));
    run_for(Duration::from_millis(1_500)).await;
    assert_eq!(h.updates(), vec![("c1".into(), ProbeResult::Success)]);
    assert_eq!(
        h.prober.result("c1", ProbeType::Liveness),
        Some(ProbeResult::Success),
        "two failures are below the threshold"
    );
    run_for(Duration::from_millis(1_000)).await;
    assert_eq!(h.updates(), vec![("c1".into(), ProbeResult::Failure)]);
    let events = h.events();
    assert_eq!(events.len(), 3);
    assert!(events.iter().all(|e| e.reason == "Unhealthy"
        && e.message == "Liveness probe failed: exit 1"
        && e.involved.field_path == "spec.containers{app}"));

    // On hold: no more probes of this instance.
    run_for(Duration::from_secs(5)).await;
    assert_eq!(h.targets.calls().len(), 3);

    // The restarted instance starts from Success and is probed again.
    h.targets.answer(Answer::Exit(0));
    h.targets.inner.set(
        "p",
        "app",
        ContainerObservation::running("c2", Instant::now(), None),
    );
    run_for(Duration::from_secs(2)).await;
    assert_eq!(h.updates(), vec![("c2".into(), ProbeResult::Success)]);
    assert_eq!(h.prober.result("c1", ProbeType::Liveness), None);
    assert!(h.targets.calls().iter().any(|(_, id)| id == "c2"));
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn exec_timeouts_are_failures_and_errors_are_discarded_by_default() {
    let mut h = Harness::start(ProberConfig::default(), LONG_AGO).await;
    h.targets.answer(Answer::Error);
    h.targets.inner.set(
        "p",
        "app",
        ContainerObservation::running("c1", Instant::now(), None),
    );
    h.prober.add_probe(ProbeRegistration::new(
        "p",
        "app",
        ProbeType::Liveness,
        exec_spec(timing(1, 1)),
    ));
    run_for(Duration::from_millis(3_500)).await;
    assert_eq!(
        h.prober.result("c1", ProbeType::Liveness),
        Some(ProbeResult::Success)
    );
    // Each errored probe is retried up to 3 times.
    assert_eq!(h.targets.calls().len(), 4 * 3);
    let events = h.events();
    assert!(
        events.iter().all(|e| e.message
            == "Liveness probe errored and resulted in unknown state: runtime said no")
    );
    h.targets.answer(Answer::Timeout);
    run_for(Duration::from_secs(1)).await;
    assert_eq!(
        h.prober.result("c1", ProbeType::Liveness),
        Some(ProbeResult::Failure)
    );
    assert!(
        h.events()
            .iter()
            .any(|e| e.message == "Liveness probe failed: command \"check health\" timed out")
    );
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn errors_count_as_failures_when_configured() {
    let h = Harness::start(ProberConfig::default().errors_as_failures(true), LONG_AGO).await;
    h.targets.answer(Answer::Error);
    h.targets.inner.set(
        "p",
        "app",
        ContainerObservation::running("c1", Instant::now(), None),
    );
    h.prober.add_probe(ProbeRegistration::new(
        "p",
        "app",
        ProbeType::Liveness,
        exec_spec(timing(1, 2)),
    ));
    run_for(Duration::from_millis(1_500)).await;
    assert_eq!(
        h.prober.result("c1", ProbeType::Liveness),
        Some(ProbeResult::Failure)
    );
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn startup_gates_liveness_until_it_succeeds() {
    let mut h = Harness::start(ProberConfig::default(), LONG_AGO).await;
    h.targets.answer(Answer::Exit(1));
    h.targets.inner.set(
        "p",
        "app",
        ContainerObservation::running("c1", Instant::now(), None),
    );
    h.prober.add_probe(ProbeRegistration::new(
        "p",
        "app",
        ProbeType::Startup,
        exec_spec(timing(1, 100)),
    ));
    h.prober.add_probe(
        ProbeRegistration::new("p", "app", ProbeType::Liveness, exec_spec(timing(1, 1)))
            .gated_by_startup(true),
    );
    run_for(Duration::from_millis(3_500)).await;
    // Only the startup probe ran (4 ticks); liveness stays at its initial Success.
    assert_eq!(h.targets.calls().len(), 4);
    assert_eq!(
        h.prober.result("c1", ProbeType::Startup),
        Some(ProbeResult::Unknown)
    );
    assert_eq!(
        h.prober.result("c1", ProbeType::Liveness),
        Some(ProbeResult::Success)
    );
    h.updates();
    h.targets.answer(Answer::Exit(0));
    run_for(Duration::from_secs(1)).await;
    assert_eq!(
        h.prober.result("c1", ProbeType::Startup),
        Some(ProbeResult::Success)
    );
    h.targets.answer(Answer::Exit(1));
    run_for(Duration::from_secs(2)).await;
    assert_eq!(
        h.prober.result("c1", ProbeType::Liveness),
        Some(ProbeResult::Failure),
        "liveness runs once startup succeeded"
    );
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn workers_stop_when_the_pod_finishes_or_is_removed() {
    let h = Harness::start(ProberConfig::default(), LONG_AGO).await;
    for pod in ["p1", "p2"] {
        h.targets.inner.set(
            pod,
            "app",
            ContainerObservation::running(format!("{pod}-c"), Instant::now(), None),
        );
        h.prober.add_probe(ProbeRegistration::new(
            pod,
            "app",
            ProbeType::Readiness,
            exec_spec(timing(1, 3)),
        ));
    }
    run_for(Duration::from_millis(500)).await;
    assert_eq!(h.prober.stats().workers, 2);
    h.targets.inner.set_pod_terminal("p1");
    h.prober.remove_pod("p2");
    run_for(Duration::from_secs(2)).await;
    assert_eq!(h.prober.stats().workers, 0);
    let n = h.targets.calls().len();
    run_for(Duration::from_secs(5)).await;
    assert_eq!(
        h.targets.calls().len(),
        n,
        "no probes after the workers stopped"
    );
    assert_eq!(h.prober.result("p2-c", ProbeType::Readiness), None);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn probe_metrics_use_the_kubelet_names_and_labels() {
    let h = Harness::start(ProberConfig::default(), LONG_AGO).await;
    let mut registry = prometheus_client::registry::Registry::default();
    h.prober.register_metrics(&mut registry);
    h.targets.inner.set(
        "uid-1",
        "app",
        ContainerObservation::running("c1", Instant::now(), None),
    );
    let involved = kubelet_api::InvolvedObject {
        kind: "Pod".into(),
        namespace: "ns".into(),
        name: "web".into(),
        uid: "uid-1".into(),
        field_path: "spec.containers{app}".into(),
    };
    h.prober.add_probe(
        ProbeRegistration::new(
            "uid-1",
            "app",
            ProbeType::Readiness,
            exec_spec(timing(1, 3)),
        )
        .involved(involved),
    );
    run_for(Duration::from_millis(1_500)).await;
    h.targets.answer(Answer::Exit(3));
    run_for(Duration::from_millis(1_000)).await;
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    let line = |result: &str| {
        text.lines()
            .find(|l| {
                l.starts_with("prober_probe_total{") && l.contains(&format!("result=\"{result}\""))
            })
            .map(str::to_string)
            .unwrap_or_default()
    };
    let ok = line("successful");
    assert!(ok.contains("probe_type=\"Readiness\""), "{text}");
    assert!(ok.contains("container=\"app\""), "{ok}");
    assert!(ok.contains("pod=\"web\""), "{ok}");
    assert!(ok.contains("namespace=\"ns\""), "{ok}");
    assert!(ok.contains("pod_uid=\"uid-1\""), "{ok}");
    assert!(ok.ends_with(" 2"), "{ok}");
    assert!(line("failed").ends_with(" 1"), "{text}");
    assert!(line("unknown").ends_with(" 0"), "{text}");
    assert!(
        text.contains("prober_probe_duration_seconds_count{probe_type=\"Readiness\",container=\"app\",pod=\"web\",namespace=\"ns\"} 2"),
        "{text}"
    );
    h.prober.remove_pod("uid-1");
    run_for(Duration::from_millis(100)).await;
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        !text.contains("uid-1"),
        "series removed with the worker: {text}"
    );
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn result_changes_beyond_the_channel_capacity_are_held_back_not_lost() {
    let mut h = Harness::start(
        ProberConfig::default().update_capacity(1).max_concurrent(2),
        LONG_AGO,
    )
    .await;
    for i in 0..5 {
        let pod = format!("p{i}");
        h.targets.inner.set(
            &pod,
            "app",
            ContainerObservation::running(format!("c{i}"), Instant::now(), None),
        );
        h.prober.add_probe(ProbeRegistration::new(
            pod,
            "app",
            ProbeType::Readiness,
            exec_spec(timing(1, 3)),
        ));
    }
    run_for(Duration::from_secs(3)).await;
    let mut got = Vec::new();
    for _ in 0..10 {
        let u = tokio::time::timeout(Duration::from_secs(5), h.updates.recv())
            .await
            .unwrap()
            .unwrap();
        got.push((u.container_id, u.result));
    }
    for i in 0..5 {
        let id = format!("c{i}");
        let mine: Vec<ProbeResult> = got
            .iter()
            .filter(|(c, _)| *c == id)
            .map(|(_, r)| *r)
            .collect();
        assert_eq!(
            mine,
            vec![ProbeResult::Failure, ProbeResult::Success],
            "{id}"
        );
    }
    h.stop().await;
}
