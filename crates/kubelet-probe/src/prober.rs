//! The prober: a few scheduler tasks ([`ProberConfig::shards`], probes spread by pod) drive every
//! probe from timer wheels ([`DelayQueue`]); probe I/O runs as short tasks, at most
//! [`ProberConfig::max_concurrent`] at a time.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use futures::future::poll_fn;
use k8s_openapi::api::core::v1::{Container, Pod, Probe};
use kubelet_api::{EventRecorder, InvolvedObject};
use kubelet_api::{ProbeContext, ProbeManager, ProbeResult, ProbeType, ProbeUpdate, ProbeUpdates};
use parking_lot::{Mutex, RwLock};
use prometheus_client::registry::Registry;
use rand::Rng;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::time::{DelayQueue, delay_queue};

use crate::handler::{self, MAX_BODY, NetConfig, Outcome};
use crate::metrics::{MetricResult, ProberMetrics, SeriesLabels, WorkerMetrics};
use crate::spec::{ProbeHandler, ProbeSpec, ProbeTiming, timing_from_k8s};
use crate::targets::{ExecFailure, Observation, ProbeTargets, StatusTargets};

/// `User-Agent` of HTTP and gRPC probes: `kube-probe/<major>.<minor>` of the Kubernetes API
/// version this SDK is built against.
pub const DEFAULT_USER_AGENT: &str = "kube-probe/1.33";
/// Attempts of a probe that returns an error (`maxProbeRetries`).
pub const MAX_PROBE_RETRIES: usize = 3;

/// Prober settings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ProberConfig {
    /// `User-Agent` of HTTP and gRPC probes unless a probe sets its own.
    pub user_agent: String,
    /// Probes running at once; due probes beyond it wait their turn (their lateness grows).
    pub max_concurrent: usize,
    /// Capacity of the result-change channel before changes are held back in memory.
    pub update_capacity: usize,
    /// **Beyond the kubelet.** Count probe errors (an exec the runtime rejects, a probe that
    /// cannot be built) as failures. The kubelet throws errors away, so a liveness probe that
    /// keeps erroring never restarts anything and a readiness probe that keeps erroring keeps
    /// its last result. Off by default.
    pub errors_as_failures: bool,
    /// Scheduler tasks the probes are spread over (by pod); `max_concurrent` is shared out
    /// among them. Default: the machine's available parallelism, at most 8. One scheduler whose
    /// thread the OS preempts holds back only its share of the probes.
    pub shards: usize,
}

impl Default for ProberConfig {
    fn default() -> Self {
        Self {
            user_agent: DEFAULT_USER_AGENT.to_string(),
            max_concurrent: 2048,
            update_capacity: 1024,
            errors_as_failures: false,
            shards: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
                .clamp(1, 8),
        }
    }
}

impl ProberConfig {
    /// Set [`errors_as_failures`](Self::errors_as_failures).
    pub fn errors_as_failures(mut self, on: bool) -> Self {
        self.errors_as_failures = on;
        self
    }

    /// Set [`update_capacity`](Self::update_capacity) (at least 1).
    pub fn update_capacity(mut self, n: usize) -> Self {
        self.update_capacity = n.max(1);
        self
    }

    /// Set [`shards`](Self::shards) (at least 1).
    pub fn shards(mut self, n: usize) -> Self {
        self.shards = n.max(1);
        self
    }

    /// Set [`max_concurrent`](Self::max_concurrent) (at least 1).
    pub fn max_concurrent(mut self, n: usize) -> Self {
        self.max_concurrent = n.max(1);
        self
    }
}

/// One probe to run: which container, which kind, what spec, and what the events are about.
#[derive(Debug, Clone)]
pub struct ProbeRegistration {
    pod_uid: String,
    container: String,
    probe_type: ProbeType,
    handler: Result<Arc<ProbeHandler>, Arc<str>>,
    timing: ProbeTiming,
    involved: InvolvedObject,
    restart_never: bool,
    gated_by_startup: bool,
}

impl ProbeRegistration {
    /// A probe of `probe_type` on container `container` of pod `pod_uid`.
    pub fn new(
        pod_uid: impl Into<String>,
        container: impl Into<String>,
        probe_type: ProbeType,
        spec: ProbeSpec,
    ) -> Self {
        let pod_uid = pod_uid.into();
        let container = container.into();
        Self {
            involved: InvolvedObject {
                kind: "Pod".to_string(),
                uid: pod_uid.clone(),
                field_path: format!("spec.containers{{{container}}}"),
                ..Default::default()
            },
            pod_uid,
            container,
            probe_type,
            handler: Ok(Arc::new(spec.handler)),
            timing: spec.timing,
            restart_never: false,
            gated_by_startup: false,
        }
    }

    /// The object events and metric labels refer to (pod name and namespace).
    pub fn involved(mut self, involved: InvolvedObject) -> Self {
        self.involved = involved;
        self
    }

    /// The pod's restart policy is `Never`: the worker stops once the container has exited.
    pub fn restart_never(mut self, never: bool) -> Self {
        self.restart_never = never;
        self
    }

    /// The container also has a startup probe: this (liveness or readiness) probe waits until
    /// the startup probe has succeeded.
    pub fn gated_by_startup(mut self, gated: bool) -> Self {
        self.gated_by_startup = gated;
        self
    }

    /// The registrations for every probe of `pod` (regular containers and sidecars; regular
    /// init containers have none, as in the kubelet). A probe that cannot be converted still
    /// gets a worker, whose every probe is an error (the kubelet resolves ports at probe time
    /// and discards such errors), so the problem shows up as events.
    pub fn for_pod(pod: &Pod) -> Vec<Self> {
        let Some(spec) = &pod.spec else {
            return Vec::new();
        };
        let uid = kubelet_api::pod::uid(pod);
        let never = spec.restart_policy.as_deref() == Some("Never");
        let regular = spec.containers.iter().map(|c| (c, "containers"));
        let sidecars = spec
            .init_containers
            .iter()
            .flatten()
            .filter(|c| kubelet_api::pod::is_sidecar(c))
            .map(|c| (c, "initContainers"));
        let mut out = Vec::new();
        for (c, field) in regular.chain(sidecars) {
            let probes: [(ProbeType, &Option<Probe>); 3] = [
                (ProbeType::Startup, &c.startup_probe),
                (ProbeType::Liveness, &c.liveness_probe),
                (ProbeType::Readiness, &c.readiness_probe),
            ];
            for (t, probe) in probes {
                let Some(probe) = probe else { continue };
                out.push(Self::from_k8s(pod, uid, c, field, t, probe, never));
            }
        }
        out
    }

    fn from_k8s(
        pod: &Pod,
        uid: &str,
        c: &Container,
        field: &str,
        t: ProbeType,
        probe: &Probe,
        never: bool,
    ) -> Self {
        let mut involved = InvolvedObject::pod(pod);
        involved.field_path = format!("spec.{field}{{{}}}", c.name);
        let (handler, timing) = match ProbeSpec::from_k8s(probe, c, t) {
            Ok(s) => (Ok(Arc::new(s.handler)), s.timing),
            Err(e) => {
                tracing::warn!(podUID = %uid, containerName = %c.name, error = %kubelet_api::chain(&e), "invalid probe");
                let timing = timing_from_k8s(probe, c, t).unwrap_or_default();
                (Err(Arc::from(e.to_string())), timing)
            }
        };
        Self {
            pod_uid: uid.to_string(),
            container: c.name.clone(),
            probe_type: t,
            handler,
            timing,
            involved,
            restart_never: never,
            gated_by_startup: t != ProbeType::Startup && c.startup_probe.is_some(),
        }
    }
}

/// `Liveness`, `Readiness` or `Startup`, as the kubelet prints probe types.
pub fn probe_type_name(t: ProbeType) -> &'static str {
    match t {
        ProbeType::Liveness => "Liveness",
        ProbeType::Readiness => "Readiness",
        ProbeType::Startup => "Startup",
    }
}

fn type_index(t: ProbeType) -> usize {
    match t {
        ProbeType::Liveness => 0,
        ProbeType::Readiness => 1,
        ProbeType::Startup => 2,
    }
}

/// Value a probe's result takes when a new container instance appears.
fn initial_result(t: ProbeType) -> ProbeResult {
    match t {
        ProbeType::Readiness => ProbeResult::Failure,
        ProbeType::Liveness => ProbeResult::Success,
        ProbeType::Startup => ProbeResult::Unknown,
    }
}

/// Lateness histogram: 50 µs buckets up to 100 ms, then 10 ms buckets up to 10 s, then one
/// overflow bucket.
const FINE_US: u64 = 50;
const FINE_BUCKETS: u64 = 2000;
const COARSE_US: u64 = 10_000;
const COARSE_BUCKETS: u64 = 990;
const LATENESS_BUCKETS: usize = (FINE_BUCKETS + COARSE_BUCKETS + 1) as usize;

fn lateness_bucket(us: u64) -> usize {
    let fine_end = FINE_US * FINE_BUCKETS;
    let i = if us < fine_end {
        us / FINE_US
    } else {
        (FINE_BUCKETS + (us - fine_end) / COARSE_US).min(FINE_BUCKETS + COARSE_BUCKETS)
    };
    usize::try_from(i).unwrap_or(LATENESS_BUCKETS - 1)
}

/// Upper bound of bucket `i`, microseconds.
fn lateness_upper_us(i: usize) -> u64 {
    let i = i as u64;
    if i < FINE_BUCKETS {
        (i + 1) * FINE_US
    } else {
        FINE_US * FINE_BUCKETS + (i - FINE_BUCKETS + 1) * COARSE_US
    }
}

/// Counters for benchmarks and dashboards of the prober itself.
#[derive(Debug)]
struct Stats {
    started: AtomicU64,
    completed: AtomicU64,
    lateness: Box<[AtomicU64]>,
}

impl Stats {
    fn new() -> Self {
        Self {
            started: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            lateness: (0..LATENESS_BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn record_lateness(&self, late: Duration) {
        let us = u64::try_from(late.as_micros()).unwrap_or(u64::MAX);
        self.lateness[lateness_bucket(us)].fetch_add(1, Ordering::Relaxed);
        self.started.fetch_add(1, Ordering::Relaxed);
    }
}

/// A snapshot of the prober's own counters.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProberStats {
    /// Probes started.
    pub started: u64,
    /// Probes finished.
    pub completed: u64,
    /// Workers (configured probes) alive.
    pub workers: u64,
    /// Median lateness of probe starts against their schedule (50 µs resolution below 100 ms,
    /// 10 ms above).
    pub lateness_p50: Duration,
    /// 99th percentile lateness (same resolution; 9.91 s means "that or more").
    pub lateness_p99: Duration,
}

struct Shared {
    config: ProberConfig,
    results: RwLock<HashMap<String, [Option<ProbeResult>; 3]>>,
    known_pods: Mutex<HashSet<String>>,
    metrics: ProberMetrics,
    created: Instant,
    net: NetConfig,
    updates_tx: mpsc::Sender<ProbeUpdate>,
    stats: Stats,
    workers: AtomicU64,
    /// Worker IDs, unique across shards (metric records are keyed by them).
    next_id: AtomicU64,
}

enum Command {
    Add(Box<ProbeRegistration>),
    RemovePod(String),
    StopLivenessAndStartup(String),
}

/// The prober. Register probes ([`add_pod`](Self::add_pod) or
/// [`add_probe`](Self::add_probe)), run it ([`run_with`](Self::run_with), or let the engine run
/// it as a [`ProbeManager`]), read results with [`result`](Self::result) and changes from the
/// [`ProbeUpdates`] receiver [`new`](Self::new) returned.
pub struct Prober {
    shared: Arc<Shared>,
    /// One command channel per scheduler shard.
    cmd_tx: Vec<mpsc::UnboundedSender<Command>>,
    cmd_rx: Mutex<Option<Vec<mpsc::UnboundedReceiver<Command>>>>,
}

impl std::fmt::Debug for Prober {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prober")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl Prober {
    /// A prober with `config`. Its creation time counts as the agent's start: probes added
    /// within one period of it start after a random delay of up to one period (so a restarted
    /// agent does not probe everything at once); later ones start at once. The receiver of its
    /// result changes comes with it.
    pub fn new(config: ProberConfig) -> (Self, ProbeUpdates) {
        let (updates_tx, updates_rx) = mpsc::channel(config.update_capacity.max(1));
        let (cmd_tx, cmd_rx): (Vec<_>, Vec<_>) = (0..config.shards.max(1))
            .map(|_| mpsc::unbounded_channel())
            .unzip();
        let net = NetConfig::new(&config.user_agent);
        let prober = Self {
            shared: Arc::new(Shared {
                config,
                results: RwLock::default(),
                known_pods: Mutex::default(),
                metrics: ProberMetrics::new(),
                created: Instant::now(),
                net,
                updates_tx,
                stats: Stats::new(),
                workers: AtomicU64::new(0),
                next_id: AtomicU64::new(0),
            }),
            cmd_tx,
            cmd_rx: Mutex::new(Some(cmd_rx)),
        };
        (prober, updates_rx)
    }

    /// Register `prober_probe_total` and `prober_probe_duration_seconds` into `registry`.
    pub fn register_metrics(&self, registry: &mut Registry) {
        self.shared.metrics.register(registry);
    }

    /// Start workers for every probe of `pod` (no-op for a pod already added; probe specs
    /// cannot be changed in place, as in the kubelet).
    pub fn add_pod(&self, pod: &Pod) {
        let uid = kubelet_api::pod::uid(pod);
        if !self.shared.known_pods.lock().insert(uid.to_string()) {
            return;
        }
        for reg in ProbeRegistration::for_pod(pod) {
            let _ = self.shard(uid).send(Command::Add(Box::new(reg)));
        }
    }

    /// Start a worker for one probe (no-op if that pod, container and probe type has one).
    pub fn add_probe(&self, registration: ProbeRegistration) {
        self.shared
            .known_pods
            .lock()
            .insert(registration.pod_uid.clone());
        let _ = self
            .shard(&registration.pod_uid)
            .send(Command::Add(Box::new(registration)));
    }

    /// Stop every worker of pod `pod_uid` and forget its results.
    pub fn remove_pod(&self, pod_uid: &str) {
        self.shared.known_pods.lock().remove(pod_uid);
        let _ = self
            .shard(pod_uid)
            .send(Command::RemovePod(pod_uid.to_string()));
    }

    /// Stop the liveness and startup workers of pod `pod_uid` (it is terminating); readiness
    /// keeps probing.
    pub fn stop_liveness_and_startup(&self, pod_uid: &str) {
        let _ = self
            .shard(pod_uid)
            .send(Command::StopLivenessAndStartup(pod_uid.to_string()));
    }

    /// The command channel of the shard that owns pod `pod_uid` (all probes of a pod live in
    /// one shard).
    fn shard(&self, pod_uid: &str) -> &mpsc::UnboundedSender<Command> {
        // FNV-1a: stable and cheap.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in pod_uid.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        let i = usize::try_from(h % self.cmd_tx.len() as u64).unwrap_or(0);
        &self.cmd_tx[i]
    }

    /// Latest result of `probe_type` for container instance `container_id` (runtime ID, no
    /// `<runtime>://` prefix), `None` if no worker has recorded one.
    pub fn result(&self, container_id: &str, probe_type: ProbeType) -> Option<ProbeResult> {
        self.shared
            .results
            .read()
            .get(container_id)
            .and_then(|r| r[type_index(probe_type)])
    }

    /// Run one attempt of `handler` now, outside any schedule and without thresholds,
    /// events or metrics (for one-off checks and tests): `pod_ip` is the default host of
    /// network probes, `container_id` the target of exec probes.
    pub async fn probe_once(
        &self,
        handler: &ProbeHandler,
        pod_ip: Option<&str>,
        container_id: &str,
        timeout: Duration,
        targets: &dyn ProbeTargets,
    ) -> Outcome {
        execute(
            &self.shared.net,
            handler,
            pod_ip,
            container_id,
            timeout,
            targets,
        )
        .await
    }

    /// Zero the counters behind [`stats`](Self::stats) (for measuring a window).
    pub fn reset_stats(&self) {
        let s = &self.shared.stats;
        s.started.store(0, Ordering::Relaxed);
        s.completed.store(0, Ordering::Relaxed);
        for c in s.lateness.iter() {
            c.store(0, Ordering::Relaxed);
        }
    }

    /// Counters of the prober itself (probes run, lateness against schedule).
    pub fn stats(&self) -> ProberStats {
        let s = &self.shared.stats;
        let counts: Vec<u64> = s
            .lateness
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        let quantile = |q: f64| {
            if total == 0 {
                return Duration::ZERO;
            }
            // The rank is at most `total`, far below 2^53: exact in f64.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let rank = ((total as f64) * q).ceil().max(1.0) as u64;
            let mut seen = 0;
            for (i, c) in counts.iter().enumerate() {
                seen += c;
                if seen >= rank {
                    return Duration::from_micros(lateness_upper_us(i));
                }
            }
            Duration::from_micros(lateness_upper_us(LATENESS_BUCKETS - 1))
        };
        ProberStats {
            started: s.started.load(Ordering::Relaxed),
            completed: s.completed.load(Ordering::Relaxed),
            workers: self.shared.workers.load(Ordering::Relaxed),
            lateness_p50: quantile(0.50),
            lateness_p99: quantile(0.99),
        }
    }

    /// Run every probe until `shutdown` is cancelled: observe containers through `targets`,
    /// record `Unhealthy` / `ProbeWarning` events with `recorder`. Returns at once if the
    /// prober is already running.
    pub async fn run_with(
        &self,
        targets: Arc<dyn ProbeTargets>,
        recorder: EventRecorder,
        shutdown: CancellationToken,
    ) {
        let Some(receivers) = self.cmd_rx.lock().take() else {
            tracing::warn!("prober is already running");
            return;
        };
        let per_shard = (self.shared.config.max_concurrent / receivers.len().max(1)).max(1);
        // The shards run as tasks of their own (so that they can use several worker threads);
        // dropping this future aborts them.
        let mut shards = JoinSet::new();
        for (i, cmd_rx) in receivers.into_iter().enumerate() {
            let s = Scheduler {
                out: Outputs {
                    shared: self.shared.clone(),
                    overflow: VecDeque::new(),
                    recorder: recorder.clone(),
                },
                workers: HashMap::default(),
                by_key: HashMap::new(),
                queue: DelayQueue::new(),
                waiting: VecDeque::new(),
                inflight: JoinSet::new(),
                targets: targets.clone(),
                max_concurrent: per_shard,
            };
            shards.spawn(run_shard(s, cmd_rx, shutdown.clone()).map(move |rx| (i, rx)));
        }
        let mut back = Vec::new();
        while let Some(r) = shards.join_next().await {
            match r {
                Ok(rx) => back.push(rx),
                Err(e) => tracing::error!(error = %kubelet_api::chain(&e), "prober shard failed"),
            }
        }
        kubelet_api::sort::by_key(&mut back, |(i, _)| *i);
        self.shared.metrics.clear();
        self.shared.workers.store(0, Ordering::Relaxed);
        // Results stay readable; a later run starts the workers again from the pods added.
        self.shared.known_pods.lock().clear();
        *self.cmd_rx.lock() = Some(back.into_iter().map(|(_, rx)| rx).collect());
    }
}

/// One scheduler shard, until `shutdown`; gives its command receiver back.
async fn run_shard(
    mut s: Scheduler,
    mut cmd_rx: mpsc::UnboundedReceiver<Command>,
    shutdown: CancellationToken,
) -> mpsc::UnboundedReceiver<Command> {
    let cancelled = shutdown.cancelled();
    tokio::pin!(cancelled);
    loop {
        let ev = tokio::select! {
            biased;
            _ = &mut cancelled => break,
            Some(cmd) = cmd_rx.recv() => Ev::Command(cmd),
            Some(done) = s.inflight.join_next(), if !s.inflight.is_empty() => Ev::Done(done),
            Some(exp) = poll_fn(|cx| s.queue.poll_expired(cx)), if !s.queue.is_empty() => Ev::Due(exp.into_inner()),
            r = s.out.shared.updates_tx.reserve(), if !s.out.overflow.is_empty() => {
                match r {
                    Ok(permit) => {
                        if let Some(u) = s.out.overflow.pop_front() {
                            permit.send(u);
                        }
                    }
                    // Nobody listens any more.
                    Err(_) => s.out.overflow.clear(),
                }
                continue;
            }
        };
        match ev {
            Ev::Command(cmd) => s.command(cmd),
            Ev::Done(done) => s.done(done),
            Ev::Due(id) => s.due(id),
        }
        s.drain_ready();
        s.launch_waiting();
    }
    s.inflight.shutdown().await;
    s.workers.clear();
    cmd_rx
}

#[async_trait]
impl ProbeManager for Prober {
    fn register_metrics(&self, registry: &mut Registry) {
        self.shared.metrics.register(registry);
    }

    fn add_pod(&self, pod: &Pod) {
        Prober::add_pod(self, pod);
    }

    fn remove_pod(&self, pod_uid: &str) {
        Prober::remove_pod(self, pod_uid);
    }

    fn stop_liveness_and_startup(&self, pod_uid: &str) {
        Prober::stop_liveness_and_startup(self, pod_uid);
    }

    fn result(&self, container_id: &str, probe_type: ProbeType) -> Option<ProbeResult> {
        Prober::result(self, container_id, probe_type)
    }

    async fn run(&self, ctx: ProbeContext, shutdown: CancellationToken) {
        let targets = Arc::new(StatusTargets::new(ctx.statuses, ctx.runtime));
        self.run_with(targets, ctx.recorder, shutdown).await;
    }
}

enum Ev {
    Command(Command),
    Done(Result<Done, tokio::task::JoinError>),
    Due(u64),
}

/// What a finished probe task reports.
struct Done {
    worker: u64,
    container_id: String,
    outcome: Outcome,
    elapsed: Duration,
}

/// Hasher of worker IDs (sequential `u64`s the prober assigns itself): one multiplication
/// instead of SipHash, which the scheduler would otherwise run several times per probe.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// One probe worker: the kubelet's `worker` struct, minus the goroutine.
struct Worker {
    pod_uid: Arc<str>,
    container: Arc<str>,
    probe_type: ProbeType,
    handler: Result<Arc<ProbeHandler>, Arc<str>>,
    timing: ProbeTiming,
    involved: InvolvedObject,
    restart_never: bool,
    gated_by_startup: bool,
    container_id: Option<String>,
    last_result: ProbeResult,
    result_run: u32,
    on_hold: bool,
    metrics: Arc<WorkerMetrics>,
    delay_key: Option<delay_queue::Key>,
    /// When the current (or next) tick is due.
    scheduled: Instant,
    in_flight: bool,
}

/// What a tick decided before any I/O.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// Nothing to run now; wait for the next tick.
    Wait,
    /// The worker is done.
    Exit,
    /// Run the probe against this container instance and host.
    Probe {
        container_id: String,
        host: Option<String>,
    },
}

/// Where the results, updates and events go.
struct Outputs {
    shared: Arc<Shared>,
    overflow: VecDeque<ProbeUpdate>,
    recorder: EventRecorder,
}

impl Outputs {
    fn set_result(&mut self, w: &Worker, container_id: &str, result: ProbeResult) {
        let changed = {
            let mut results = self.shared.results.write();
            let i = type_index(w.probe_type);
            match results.get_mut(container_id) {
                Some(slots) => {
                    let changed = slots[i] != Some(result);
                    slots[i] = Some(result);
                    changed
                }
                None => {
                    let mut slots = [None; 3];
                    slots[i] = Some(result);
                    results.insert(container_id.to_string(), slots);
                    true
                }
            }
        };
        if !changed {
            return;
        }
        let update = ProbeUpdate {
            pod_uid: w.pod_uid.to_string(),
            container_name: w.container.to_string(),
            container_id: container_id.to_string(),
            probe_type: w.probe_type,
            result,
        };
        if !self.overflow.is_empty() {
            self.overflow.push_back(update);
            return;
        }
        match self.shared.updates_tx.try_send(update) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(u)) => self.overflow.push_back(u),
            // Nobody listens (the updates were never taken or were dropped).
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    fn remove_result(&self, container_id: &str, t: ProbeType) {
        let mut results = self.shared.results.write();
        if let Some(r) = results.get_mut(container_id) {
            r[type_index(t)] = None;
            if r.iter().all(Option::is_none) {
                results.remove(container_id);
            }
        }
    }

    fn started(&self, container_id: &str) -> bool {
        self.shared
            .results
            .read()
            .get(container_id)
            .and_then(|r| r[type_index(ProbeType::Startup)])
            == Some(ProbeResult::Success)
    }
}

impl Worker {
    /// The kubelet's `doProbe` up to running the probe (steps 1-9).
    fn before_probe(&mut self, obs: Observation, now: Instant, out: &mut Outputs) -> Step {
        let c = match obs {
            Observation::NoStatus | Observation::NoContainer => return Step::Wait,
            Observation::PodTerminal => return Step::Exit,
            Observation::Container(c) => c,
        };
        if self.container_id.as_deref() != Some(c.container_id.as_str()) {
            if let Some(old) = self.container_id.take() {
                out.remove_result(&old, self.probe_type);
            }
            out.set_result(self, &c.container_id, initial_result(self.probe_type));
            self.container_id = Some(c.container_id.clone());
            // A new container instance: probing resumes.
            self.on_hold = false;
        }
        if self.on_hold {
            return Step::Wait;
        }
        let Some(since) = c.running_since else {
            out.set_result(self, &c.container_id, ProbeResult::Failure);
            return if c.terminated && self.restart_never {
                Step::Exit
            } else {
                Step::Wait
            };
        };
        if c.pod_deleting && self.probe_type != ProbeType::Readiness {
            // Quiet shutdown: a pod being deleted is not restarted by its probes.
            out.set_result(self, &c.container_id, ProbeResult::Success);
            return Step::Exit;
        }
        if now.saturating_duration_since(since) < self.timing.initial_delay {
            return Step::Wait;
        }
        let started = match self.probe_type {
            ProbeType::Startup => out.started(&c.container_id),
            _ => !self.gated_by_startup || out.started(&c.container_id),
        };
        match (self.probe_type, started) {
            // The startup probe idles once it has succeeded, until the next instance.
            (ProbeType::Startup, true) => return Step::Wait,
            (ProbeType::Liveness | ProbeType::Readiness, false) => return Step::Wait,
            _ => {}
        }
        Step::Probe {
            container_id: c.container_id,
            host: c.pod_ip,
        }
    }

    /// Record a probe error (`state` is the result the probe reported with it, as the
    /// kubelet's event says); whether the result is thrown away, as the kubelet does unless
    /// errors count as failures.
    fn errored(&self, out: &Outputs, state: &str, msg: &str) -> bool {
        let name = probe_type_name(self.probe_type);
        out.recorder.warning(
            self.involved.clone(),
            "Unhealthy",
            format!("{name} probe errored and resulted in {state} state: {msg}"),
        );
        // The kubelet: "Prober error, throw away the result".
        !out.shared.config.errors_as_failures
    }

    /// The kubelet's `doProbe` after the probe (steps 10-12): events, metrics, thresholds.
    fn after_probe(
        &mut self,
        container_id: &str,
        outcome: Outcome,
        elapsed: Duration,
        out: &mut Outputs,
    ) {
        let name = probe_type_name(self.probe_type);
        let (result, metric) = match outcome {
            Outcome::Success(_) => (ProbeResult::Success, MetricResult::Successful),
            Outcome::Warning(msg) => {
                out.recorder.warning(
                    self.involved.clone(),
                    "ProbeWarning",
                    format!("{name} probe warning: {msg}"),
                );
                (ProbeResult::Success, MetricResult::Successful)
            }
            Outcome::Failure(msg) => {
                out.recorder.warning(
                    self.involved.clone(),
                    "Unhealthy",
                    format!("{name} probe failed: {msg}"),
                );
                (ProbeResult::Failure, MetricResult::Failed)
            }
            Outcome::Error(msg) => {
                if self.errored(out, "unknown", &msg) {
                    return;
                }
                (ProbeResult::Failure, MetricResult::Failed)
            }
            Outcome::BodyError(msg) => {
                if self.errored(out, "failure", &msg) {
                    return;
                }
                (ProbeResult::Failure, MetricResult::Failed)
            }
        };
        self.metrics.observe(metric, elapsed.as_secs_f64());
        if self.last_result == result {
            self.result_run = self.result_run.saturating_add(1);
        } else {
            self.last_result = result;
            self.result_run = 1;
        }
        let threshold = match result {
            ProbeResult::Failure => self.timing.failure_threshold,
            _ => self.timing.success_threshold,
        };
        if self.result_run < threshold {
            return;
        }
        out.set_result(self, container_id, result);
        if result == ProbeResult::Failure && self.probe_type != ProbeType::Readiness {
            // The container will be restarted: no more probes until a new instance appears.
            self.on_hold = true;
            self.result_run = 0;
        }
    }
}

struct Scheduler {
    out: Outputs,
    workers: HashMap<u64, Worker, BuildHasherDefault<IdHasher>>,
    by_key: HashMap<(Arc<str>, Arc<str>, ProbeType), u64>,
    queue: DelayQueue<u64>,
    /// This shard's share of `max_concurrent`.
    max_concurrent: usize,
    waiting: VecDeque<(u64, String, Option<String>)>,
    inflight: JoinSet<Done>,
    targets: Arc<dyn ProbeTargets>,
}

impl Scheduler {
    fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Add(reg) => self.add(*reg),
            Command::RemovePod(uid) => {
                let ids: Vec<u64> = self
                    .by_key
                    .iter()
                    .filter(|((p, _, _), _)| p.as_ref() == uid)
                    .map(|(_, id)| *id)
                    .collect();
                for id in ids {
                    self.remove(id);
                }
            }
            Command::StopLivenessAndStartup(uid) => {
                let ids: Vec<u64> = self
                    .by_key
                    .iter()
                    .filter(|((p, _, t), _)| p.as_ref() == uid && *t != ProbeType::Readiness)
                    .map(|(_, id)| *id)
                    .collect();
                for id in ids {
                    self.remove(id);
                }
            }
        }
    }

    fn add(&mut self, reg: ProbeRegistration) {
        let pod_uid: Arc<str> = Arc::from(reg.pod_uid.as_str());
        let container: Arc<str> = Arc::from(reg.container.as_str());
        let key = (pod_uid.clone(), container.clone(), reg.probe_type);
        if self.by_key.contains_key(&key) {
            return;
        }
        let id = self.out.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let period = reg.timing.period;
        // Jitter only right after the agent started, so a restart does not probe everything
        // at once; otherwise the first probe is immediate.
        let first = if now.saturating_duration_since(self.out.shared.created) < period {
            let nanos = u64::try_from(period.as_nanos()).unwrap_or(u64::MAX).max(1);
            now + Duration::from_nanos(rand::rng().random_range(0..nanos))
        } else {
            now
        };
        let metrics = self.out.shared.metrics.add(
            id,
            SeriesLabels {
                probe_type: probe_type_name(reg.probe_type),
                container: container.clone(),
                pod: Arc::from(reg.involved.name.as_str()),
                namespace: Arc::from(reg.involved.namespace.as_str()),
                pod_uid: pod_uid.clone(),
            },
        );
        let delay_key = Some(self.queue.insert_at(id, first));
        self.workers.insert(
            id,
            Worker {
                pod_uid,
                container,
                probe_type: reg.probe_type,
                handler: reg.handler,
                timing: reg.timing,
                involved: reg.involved,
                restart_never: reg.restart_never,
                gated_by_startup: reg.gated_by_startup,
                container_id: None,
                last_result: ProbeResult::Unknown,
                result_run: 0,
                on_hold: false,
                metrics,
                delay_key,
                scheduled: first,
                in_flight: false,
            },
        );
        self.by_key.insert(key, id);
        self.out.shared.workers.fetch_add(1, Ordering::Relaxed);
    }

    fn remove(&mut self, id: u64) {
        let Some(w) = self.workers.remove(&id) else {
            return;
        };
        if let Some(k) = &w.delay_key {
            self.queue.try_remove(k);
        }
        if let Some(cid) = &w.container_id {
            self.out.remove_result(cid, w.probe_type);
        }
        self.out.shared.metrics.remove(id);
        self.by_key
            .remove(&(w.pod_uid.clone(), w.container.clone(), w.probe_type));
        self.out.shared.workers.fetch_sub(1, Ordering::Relaxed);
    }

    fn schedule_next(&mut self, id: u64, now: Instant) {
        let Some(w) = self.workers.get_mut(&id) else {
            return;
        };
        let mut next = w.scheduled + w.timing.period;
        if next <= now {
            // Overran the period: run once more right away (a Go ticker keeps one tick).
            next = now;
        }
        w.scheduled = next;
        w.delay_key = Some(self.queue.insert_at(id, next));
    }

    fn due(&mut self, id: u64) {
        let now = Instant::now();
        let Some(w) = self.workers.get_mut(&id) else {
            return;
        };
        w.delay_key = None;
        let obs = self.targets.observe(&w.pod_uid, &w.container);
        match w.before_probe(obs, now, &mut self.out) {
            Step::Wait => self.schedule_next(id, now),
            Step::Exit => self.remove(id),
            Step::Probe { container_id, host } => {
                w.in_flight = true;
                self.waiting.push_back((id, container_id, host));
            }
        }
    }

    /// Handle finished probes and due workers that are already there, up to a batch of each,
    /// without a trip through `select!` for every one (at thousands of probes a second most
    /// wake-ups find several).
    fn drain_ready(&mut self) {
        const BATCH: usize = 256;
        for _ in 0..BATCH {
            match self.inflight.try_join_next() {
                Some(done) => self.done(done),
                None => break,
            }
        }
        // A no-op waker: the next `select!` polls the queue again with the real one.
        let mut cx = std::task::Context::from_waker(futures::task::noop_waker_ref());
        for _ in 0..BATCH {
            match self.queue.poll_expired(&mut cx) {
                std::task::Poll::Ready(Some(exp)) => self.due(exp.into_inner()),
                _ => break,
            }
        }
    }

    fn launch_waiting(&mut self) {
        while self.inflight.len() < self.max_concurrent {
            let Some((id, container_id, host)) = self.waiting.pop_front() else {
                return;
            };
            let Some(w) = self.workers.get(&id) else {
                continue;
            };
            let task = ProbeTask {
                worker: id,
                handler: w.handler.clone(),
                container_id,
                host,
                timeout: w.timing.timeout,
                scheduled: w.scheduled,
                shared: self.out.shared.clone(),
                targets: self.targets.clone(),
            };
            // A panic in a probe (a bug) is caught here, so that every task reports its worker.
            let run = AssertUnwindSafe(task.run()).catch_unwind().map(move |r| {
                r.unwrap_or_else(|_| {
                    tracing::error!(worker = id, "probe task panicked");
                    Done {
                        worker: id,
                        container_id: String::new(),
                        outcome: Outcome::Error("probe task panicked".to_string()),
                        elapsed: Duration::ZERO,
                    }
                })
            });
            self.inflight.spawn(run);
        }
    }

    fn done(&mut self, done: Result<Done, tokio::task::JoinError>) {
        let now = Instant::now();
        let done = match done {
            Ok(d) => d,
            // Only cancellation is left (panics are caught in the task), which happens when the
            // runtime shuts down.
            Err(e) => {
                tracing::debug!(error = %kubelet_api::chain(&e), "probe task cancelled");
                return;
            }
        };
        let worker = done.worker;
        self.out
            .shared
            .stats
            .completed
            .fetch_add(1, Ordering::Relaxed);
        let Some(w) = self.workers.get_mut(&worker) else {
            return;
        };
        w.in_flight = false;
        if w.container_id.as_deref() == Some(done.container_id.as_str()) {
            w.after_probe(
                &done.container_id,
                done.outcome,
                done.elapsed,
                &mut self.out,
            );
        }
        self.schedule_next(worker, now);
    }
}

/// Everything one probe run needs, moved into its task.
struct ProbeTask {
    worker: u64,
    handler: Result<Arc<ProbeHandler>, Arc<str>>,
    container_id: String,
    host: Option<String>,
    timeout: Duration,
    scheduled: Instant,
    shared: Arc<Shared>,
    targets: Arc<dyn ProbeTargets>,
}

impl ProbeTask {
    async fn run(self) -> Done {
        let start = Instant::now();
        self.shared
            .stats
            .record_lateness(start.saturating_duration_since(self.scheduled));
        let mut outcome = Outcome::Error("probe not run".to_string());
        for _ in 0..MAX_PROBE_RETRIES {
            outcome = self.once().await;
            if !matches!(outcome, Outcome::Error(_) | Outcome::BodyError(_)) {
                break;
            }
        }
        Done {
            worker: self.worker,
            container_id: self.container_id,
            outcome,
            elapsed: start.elapsed(),
        }
    }

    async fn once(&self) -> Outcome {
        match &self.handler {
            Ok(h) => {
                execute(
                    &self.shared.net,
                    h,
                    self.host.as_deref(),
                    &self.container_id,
                    self.timeout,
                    self.targets.as_ref(),
                )
                .await
            }
            Err(e) => Outcome::Error(e.to_string()),
        }
    }
}

/// One attempt of `handler`.
async fn execute(
    net: &NetConfig,
    handler: &ProbeHandler,
    pod_ip: Option<&str>,
    container_id: &str,
    timeout: Duration,
    targets: &dyn ProbeTargets,
) -> Outcome {
    // No pod IP: like an empty host in Go's dialer, the local machine.
    let pod_host = pod_ip.unwrap_or("127.0.0.1");
    match handler {
        ProbeHandler::Exec { command } => {
            match targets.exec(container_id, command, timeout).await {
                Ok(r) => {
                    let mut output = r.stdout;
                    output.extend_from_slice(&r.stderr);
                    output.truncate(MAX_BODY);
                    let text = String::from_utf8_lossy(&output).into_owned();
                    if r.exit_code == 0 {
                        Outcome::Success(text)
                    } else {
                        Outcome::Failure(text)
                    }
                }
                Err(ExecFailure::Timeout) => {
                    Outcome::Failure(format!("command {:?} timed out", command.join(" ")))
                }
                Err(ExecFailure::Error(e)) => Outcome::Error(e),
            }
        }
        ProbeHandler::HttpGet(spec) => {
            let h = spec.host.as_deref().unwrap_or(pod_host);
            handler::http_probe(net, spec, h, timeout).await
        }
        ProbeHandler::TcpSocket { host, port } => {
            let h = host.as_deref().unwrap_or(pod_host);
            handler::tcp_probe(h, *port, timeout).await
        }
        ProbeHandler::Grpc { port, service } => {
            // Boxed: its future is large, and would make every probe task as large.
            Box::pin(handler::grpc_probe(net, pod_host, *port, service, timeout)).await
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::spec::ProbeSpec;
    use crate::targets::ContainerObservation;

    fn outputs() -> (Outputs, mpsc::Receiver<ProbeUpdate>) {
        let (p, rx) = Prober::new(ProberConfig::default());
        (
            Outputs {
                shared: p.shared.clone(),
                overflow: VecDeque::new(),
                recorder: EventRecorder::log_only(),
            },
            rx,
        )
    }

    fn worker(out: &Outputs, t: ProbeType, timing: ProbeTiming) -> Worker {
        let reg = ProbeRegistration::new(
            "uid",
            "app",
            t,
            ProbeSpec::new(
                ProbeHandler::TcpSocket {
                    host: None,
                    port: 1,
                },
                timing,
            ),
        );
        Worker {
            pod_uid: Arc::from("uid"),
            container: Arc::from("app"),
            probe_type: t,
            handler: reg.handler,
            timing: reg.timing,
            involved: reg.involved,
            restart_never: false,
            gated_by_startup: false,
            container_id: None,
            last_result: ProbeResult::Unknown,
            result_run: 0,
            on_hold: false,
            metrics: out.shared.metrics.add(
                0,
                SeriesLabels {
                    probe_type: "Liveness",
                    container: Arc::from("app"),
                    pod: Arc::from("p"),
                    namespace: Arc::from("ns"),
                    pod_uid: Arc::from("uid"),
                },
            ),
            delay_key: None,
            scheduled: Instant::now(),
            in_flight: false,
        }
    }

    fn running(id: &str, since: Instant) -> Observation {
        Observation::Container(ContainerObservation::running(
            id,
            since,
            Some("127.0.0.1".into()),
        ))
    }

    fn fail() -> Outcome {
        Outcome::Failure("boom".into())
    }

    fn ok() -> Outcome {
        Outcome::Success(String::new())
    }

    #[tokio::test(start_paused = true)]
    async fn readiness_starts_false_and_flips_only_at_the_thresholds() {
        let (mut out, mut rx) = outputs();
        let timing = ProbeTiming {
            success_threshold: 2,
            failure_threshold: 3,
            ..ProbeTiming::default()
        };
        let mut w = worker(&out, ProbeType::Readiness, timing);
        let now = Instant::now();
        let step = w.before_probe(running("c1", now), now, &mut out);
        assert!(matches!(step, Step::Probe { .. }));
        assert_eq!(
            out.shared.results.read()["c1"][1],
            Some(ProbeResult::Failure)
        );
        assert_eq!(rx.try_recv().unwrap().result, ProbeResult::Failure);

        w.after_probe("c1", ok(), Duration::ZERO, &mut out);
        assert_eq!(
            out.shared.results.read()["c1"][1],
            Some(ProbeResult::Failure),
            "1 of 2 successes"
        );
        w.after_probe("c1", ok(), Duration::ZERO, &mut out);
        assert_eq!(
            out.shared.results.read()["c1"][1],
            Some(ProbeResult::Success)
        );
        assert_eq!(rx.try_recv().unwrap().result, ProbeResult::Success);
        for _ in 0..2 {
            w.after_probe("c1", fail(), Duration::ZERO, &mut out);
        }
        assert_eq!(
            out.shared.results.read()["c1"][1],
            Some(ProbeResult::Success),
            "2 of 3 failures"
        );
        w.after_probe("c1", fail(), Duration::ZERO, &mut out);
        assert_eq!(
            out.shared.results.read()["c1"][1],
            Some(ProbeResult::Failure)
        );
        assert!(
            !w.on_hold,
            "readiness failures never put the worker on hold"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn liveness_failure_holds_the_worker_until_a_new_container_appears() {
        let (mut out, _rx) = outputs();
        let timing = ProbeTiming {
            failure_threshold: 1,
            ..ProbeTiming::default()
        };
        let mut w = worker(&out, ProbeType::Liveness, timing);
        let now = Instant::now();
        assert!(matches!(
            w.before_probe(running("c1", now), now, &mut out),
            Step::Probe { .. }
        ));
        assert_eq!(
            out.shared.results.read()["c1"][0],
            Some(ProbeResult::Success),
            "liveness starts Success"
        );
        w.after_probe("c1", fail(), Duration::ZERO, &mut out);
        assert_eq!(
            out.shared.results.read()["c1"][0],
            Some(ProbeResult::Failure)
        );
        assert_eq!(
            w.before_probe(running("c1", now), now, &mut out),
            Step::Wait
        );
        // The restarted container gets a fresh Success and the old result is gone.
        assert!(matches!(
            w.before_probe(running("c2", now), now, &mut out),
            Step::Probe { .. }
        ));
        assert!(!out.shared.results.read().contains_key("c1"));
        assert_eq!(
            out.shared.results.read()["c2"][0],
            Some(ProbeResult::Success)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn initial_delay_counts_from_the_container_start() {
        let (mut out, _rx) = outputs();
        let timing = ProbeTiming {
            initial_delay: Duration::from_secs(15),
            ..ProbeTiming::default()
        };
        let mut w = worker(&out, ProbeType::Readiness, timing);
        let since = Instant::now();
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(
            w.before_probe(running("c1", since), Instant::now(), &mut out),
            Step::Wait
        );
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(matches!(
            w.before_probe(running("c1", since), Instant::now(), &mut out),
            Step::Probe { .. }
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn gated_probes_wait_for_the_startup_probe_which_then_idles() {
        let (mut out, _rx) = outputs();
        let timing = ProbeTiming {
            failure_threshold: 1,
            ..ProbeTiming::default()
        };
        let mut live = worker(&out, ProbeType::Liveness, timing.clone());
        live.gated_by_startup = true;
        let mut startup = worker(&out, ProbeType::Startup, timing);
        let now = Instant::now();
        assert!(matches!(
            startup.before_probe(running("c1", now), now, &mut out),
            Step::Probe { .. }
        ));
        assert_eq!(
            out.shared.results.read()["c1"][2],
            Some(ProbeResult::Unknown)
        );
        assert_eq!(
            live.before_probe(running("c1", now), now, &mut out),
            Step::Wait
        );
        startup.after_probe("c1", ok(), Duration::ZERO, &mut out);
        assert!(matches!(
            live.before_probe(running("c1", now), now, &mut out),
            Step::Probe { .. }
        ));
        assert_eq!(
            startup.before_probe(running("c1", now), now, &mut out),
            Step::Wait
        );
    }

    #[tokio::test(start_paused = true)]
    async fn errors_are_discarded_unless_configured_to_count_as_failures() {
        let (mut out, _rx) = outputs();
        let timing = ProbeTiming {
            failure_threshold: 1,
            ..ProbeTiming::default()
        };
        let mut w = worker(&out, ProbeType::Liveness, timing.clone());
        let now = Instant::now();
        w.before_probe(running("c1", now), now, &mut out);
        w.after_probe(
            "c1",
            Outcome::Error("no runtime".into()),
            Duration::ZERO,
            &mut out,
        );
        assert_eq!(
            out.shared.results.read()["c1"][0],
            Some(ProbeResult::Success)
        );

        let (p, _updates) = Prober::new(ProberConfig::default().errors_as_failures(true));
        let mut out2 = Outputs {
            shared: p.shared.clone(),
            overflow: VecDeque::new(),
            recorder: EventRecorder::log_only(),
        };
        let mut w2 = worker(&out2, ProbeType::Liveness, timing);
        w2.before_probe(running("c9", now), now, &mut out2);
        w2.after_probe(
            "c9",
            Outcome::Error("no runtime".into()),
            Duration::ZERO,
            &mut out2,
        );
        assert_eq!(
            out2.shared.results.read()["c9"][0],
            Some(ProbeResult::Failure)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn unreadable_http_bodies_are_errors_in_failure_state_and_discarded() {
        let (p, _updates) = Prober::new(ProberConfig::default());
        let (recorder, mut events) = EventRecorder::channel(10);
        let mut out = Outputs {
            shared: p.shared.clone(),
            overflow: VecDeque::new(),
            recorder,
        };
        let timing = ProbeTiming {
            failure_threshold: 1,
            ..ProbeTiming::default()
        };
        let mut w = worker(&out, ProbeType::Readiness, timing);
        let now = Instant::now();
        w.before_probe(running("c1", now), now, &mut out);
        w.after_probe("c1", ok(), Duration::ZERO, &mut out);
        w.after_probe(
            "c1",
            Outcome::BodyError("unexpected EOF".into()),
            Duration::ZERO,
            &mut out,
        );
        assert_eq!(
            out.shared.results.read()["c1"][1],
            Some(ProbeResult::Success),
            "thrown away"
        );
        let ev = events.try_recv().unwrap();
        assert_eq!(
            ev.message,
            "Readiness probe errored and resulted in failure state: unexpected EOF"
        );
        w.after_probe(
            "c1",
            Outcome::Error("no runtime".into()),
            Duration::ZERO,
            &mut out,
        );
        let ev = events.try_recv().unwrap();
        assert_eq!(
            ev.message,
            "Readiness probe errored and resulted in unknown state: no runtime"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn exited_containers_fail_and_never_restarting_ones_stop_the_worker() {
        let (mut out, _rx) = outputs();
        let mut w = worker(&out, ProbeType::Readiness, ProbeTiming::default());
        let now = Instant::now();
        let exited = Observation::Container(ContainerObservation::exited("c1"));
        assert_eq!(w.before_probe(exited.clone(), now, &mut out), Step::Wait);
        assert_eq!(
            out.shared.results.read()["c1"][1],
            Some(ProbeResult::Failure)
        );
        w.restart_never = true;
        assert_eq!(w.before_probe(exited, now, &mut out), Step::Exit);
        assert_eq!(
            w.before_probe(Observation::PodTerminal, now, &mut out),
            Step::Exit
        );
        assert_eq!(
            w.before_probe(Observation::NoStatus, now, &mut out),
            Step::Wait
        );
    }

    #[tokio::test(start_paused = true)]
    async fn warnings_count_as_success_with_a_probe_warning_event_and_failures_emit_unhealthy() {
        let (p, _updates) = Prober::new(ProberConfig::default());
        let (recorder, mut events) = EventRecorder::channel(10);
        let mut out = Outputs {
            shared: p.shared.clone(),
            overflow: VecDeque::new(),
            recorder,
        };
        let mut w = worker(&out, ProbeType::Readiness, ProbeTiming::default());
        let now = Instant::now();
        w.before_probe(running("c1", now), now, &mut out);
        w.after_probe(
            "c1",
            Outcome::Warning("Probe terminated redirects, Response body: moved".into()),
            Duration::ZERO,
            &mut out,
        );
        assert_eq!(
            out.shared.results.read()["c1"][1],
            Some(ProbeResult::Success)
        );
        let ev = events.try_recv().unwrap();
        assert_eq!(ev.reason, "ProbeWarning");
        assert_eq!(
            ev.message,
            "Readiness probe warning: Probe terminated redirects, Response body: moved"
        );
        assert_eq!(ev.type_, kubelet_api::EventType::Warning);
        w.after_probe("c1", fail(), Duration::ZERO, &mut out);
        let ev = events.try_recv().unwrap();
        assert_eq!(ev.reason, "Unhealthy");
        assert_eq!(ev.message, "Readiness probe failed: boom");
    }

    #[tokio::test(start_paused = true)]
    async fn a_deleting_pod_quiets_liveness_but_keeps_probing_readiness() {
        let (mut out, _rx) = outputs();
        let now = Instant::now();
        let obs = Observation::Container(ContainerObservation::running("c1", now, None).deleting());
        let mut live = worker(&out, ProbeType::Liveness, ProbeTiming::default());
        assert_eq!(live.before_probe(obs.clone(), now, &mut out), Step::Exit);
        assert_eq!(
            out.shared.results.read()["c1"][0],
            Some(ProbeResult::Success)
        );
        let mut ready = worker(&out, ProbeType::Readiness, ProbeTiming::default());
        assert!(matches!(
            ready.before_probe(obs, now, &mut out),
            Step::Probe { .. }
        ));
    }
}
