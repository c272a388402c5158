//! The status manager: the agent's versioned cache of API pod statuses, its readers, and the

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ContainerState, ContainerStatus, Pod, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::status_gen::{
    self, PodPhase, is_kubelet_condition, is_shared_condition, is_terminal_phase,
};
use kubelet_api::pod::{self as podutil, PodConditionType, RestartPolicy};
use kubelet_api::{Event, StatusReader, StatusSink, StatusWriter};

/// How often failed deliveries are retried and every sink is reconciled (`syncPeriod`).
pub const SYNC_PERIOD: Duration = Duration::from_secs(10);
/// Total bytes of termination messages kept per pod (`MaxPodTerminationMessageLogLength`),
/// shared equally between its containers.
pub const MAX_POD_TERMINATION_MESSAGE_LENGTH: usize = 12 * 1024;
/// Events queued per sink before new ones are dropped (with a log line).
const EVENT_QUEUE_PER_SINK: usize = 1024;

/// Delivery state of one pod for one sink.
#[derive(Debug, Clone, Copy, Default)]
struct SinkSlot {
    /// Highest status version the sink accepted.
    acked: u64,
    /// Version whose delivery failed last (retried on the next tick, not on every wake-up).
    failed: Option<u64>,
    /// A call for this pod is running on this sink.
    in_flight: bool,
    /// The sink was told the pod is gone.
    removal_done: bool,
    /// Telling the sink the pod is gone failed (retried on the next tick).
    removal_failed: bool,
}

#[derive(Debug)]
struct Entry {
    pod: Arc<Pod>,
    status: Arc<PodStatus>,
    /// 0 = no status accepted yet (only possible for a pod removed before any status).
    version: u64,
    removed: bool,
    sinks: Vec<SinkSlot>,
    /// Set by [`StatusManager::set_terminal`]: every later status is Failed with this reason
    /// and message.
    forced_failure: Option<(String, String)>,
    /// Shared conditions (DisruptionTarget) held back until the published phase is terminal
    /// and no container runs.
    pending_conditions: Vec<PodCondition>,
}

impl Entry {
    fn new(pod: Arc<Pod>, sinks: usize) -> Self {
        Self {
            pod,
            status: Arc::new(PodStatus::default()),
            version: 0,
            removed: false,
            sinks: vec![SinkSlot::default(); sinks],
            forced_failure: None,
            pending_conditions: Vec::new(),
        }
    }
}

struct Shared {
    sinks: Vec<Arc<dyn StatusSink>>,
    pods: Mutex<HashMap<String, Entry>>,
    reader: StatusWriter,
    changed: watch::Sender<u64>,
    running: AtomicBool,
}

/// The agent's status manager. Cheap to clone; every clone shares the cache.
///
/// See the documentation below for the rules it applies.
///
/// The status manager: the agent's versioned cache of API pod statuses, its readers, and the
/// delivery of every accepted status to the [`StatusSink`]s (the kubelet's
/// `pkg/kubelet/status/status_manager.go`).
///
/// The engine generates a status after each sync ([`generate_pod_status`](crate::status_gen))
/// and hands it to [`StatusManager::set_pod_status`], which never awaits. The manager applies the
/// kubelet's rules (terminal phases are sticky, illegal container transitions are rejected,
/// `startTime` is set once, a terminal phase is held back while a container still runs,
/// timestamps are normalized, identical statuses are dropped) and bumps the pod's version.
/// [`StatusManager::run`] delivers the newest version of each changed pod to every sink
/// (intermediate versions collapse), concurrently per sink, retrying failures every 10 s.
///
/// ```no_run
/// use std::sync::Arc;
/// use kubelet_core::StatusManager;
/// use kubelet_api::{EventRecorder, StatusSink};
/// use tokio_util::sync::CancellationToken;
///
/// # async fn example(sink: Arc<dyn StatusSink>) {
/// let manager = StatusManager::new(vec![sink]);
/// let (_recorder, events) = EventRecorder::channel(1024);
/// let shutdown = CancellationToken::new();
/// let reader = manager.reader(); // for probers and the read-only port
/// tokio::spawn({
///     let manager = manager.clone();
///     let shutdown = shutdown.clone();
///     async move { manager.run(events, shutdown).await }
/// });
/// // ... the engine calls manager.set_pod_status(&pod, status) after each sync ...
/// # let _ = reader;
/// # }
/// ```
#[derive(Clone)]
pub struct StatusManager {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for StatusManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusManager")
            .field("sinks", &self.shared.sinks.len())
            .field("pods", &self.shared.pods.lock().len())
            .finish()
    }
}

/// One call to make on one sink.
enum Job {
    Status {
        uid: String,
        pod: Arc<Pod>,
        status: Arc<PodStatus>,
        version: u64,
    },
    Removed {
        uid: String,
        pod: Arc<Pod>,
    },
}

enum Outcome {
    Status { uid: String, version: u64, ok: bool },
    Removed { uid: String, ok: bool },
}

impl StatusManager {
    /// A status manager delivering to `sinks` (none is fine: the cache and reader still work).
    pub fn new(sinks: Vec<Arc<dyn StatusSink>>) -> Self {
        let (changed, _) = watch::channel(0);
        Self {
            shared: Arc::new(Shared {
                sinks,
                pods: Mutex::new(HashMap::new()),
                reader: StatusWriter::new(),
                changed,
                running: AtomicBool::new(false),
            }),
        }
    }

    /// A reader of the accepted statuses (for probers, the read-only port, embedders).
    pub fn reader(&self) -> StatusReader {
        self.shared.reader.reader()
    }

    /// The latest accepted status of pod `uid`, if the pod is known and not removed.
    pub fn get(&self, uid: &str) -> Option<PodStatus> {
        self.get_shared(uid).map(|s| PodStatus::clone(&s))
    }

    /// [`get`](Self::get) without a copy: the status as the manager holds it (every resync
    /// reads it to generate the next one).
    pub fn get_shared(&self, uid: &str) -> Option<Arc<PodStatus>> {
        let pods = self.shared.pods.lock();
        pods.get(uid)
            .filter(|e| !e.removed && e.version > 0)
            .map(|e| Arc::clone(&e.status))
    }

    /// The version of the latest accepted status of pod `uid` (0 if none). Every accepted change
    /// bumps it by one; dropped duplicates do not.
    pub fn version(&self, uid: &str) -> u64 {
        self.shared.pods.lock().get(uid).map_or(0, |e| e.version)
    }

    /// Accept a freshly generated status for `pod` (the engine calls this after each sync).
    ///
    /// Never blocks on the sinks. The status is dropped when it equals the cached one, unless the
    /// pod has a `deletionTimestamp`.
    pub fn set_pod_status(&self, pod: &Arc<Pod>, status: PodStatus) {
        let forced = podutil::is_deleted(pod);
        self.update(pod, status, forced);
    }

    /// A readiness probe result for container instance `container_id` (without the runtime
    /// prefix) of pod `uid`, shown at once (the kubelet's `SetContainerReadiness`): the
    /// container's `ready` and the pod's `ContainersReady` and `Ready` conditions are updated in
    /// the latest status, without waiting for the pod's next sync. Nothing happens when the pod
    /// has no status, the status does not list that instance, or `ready` is already so.
    pub fn set_container_readiness(&self, uid: &str, container_id: &str, ready: bool) {
        self.set_container_flag(uid, |pod, status| {
            let Some(c) = container_mut(status, container_id) else {
                return false;
            };
            if c.ready == ready {
                return false;
            }
            c.ready = ready;
            let phase = status.phase.clone().unwrap_or_default();
            let containers_ready = status_gen::containers_ready_condition(
                pod,
                status.init_container_statuses.as_deref().unwrap_or(&[]),
                status.container_statuses.as_deref().unwrap_or(&[]),
                &phase,
            );
            let conditions = status.conditions.get_or_insert_with(Vec::new);
            let ready_condition = status_gen::ready_condition(pod, conditions, &containers_ready);
            for c in [containers_ready, ready_condition] {
                match conditions.iter_mut().find(|x| x.type_ == c.type_) {
                    Some(x) => *x = c,
                    None => conditions.push(c),
                }
            }
            true
        });
    }

    /// A startup probe result for container instance `container_id` (without the runtime
    /// prefix) of pod `uid`, shown at once (the kubelet's `SetContainerStartup`): the container's
    /// `started` is updated in the latest status, without waiting for the pod's next sync.
    /// Nothing happens when the pod has no status, the status does not list that instance, or
    /// `started` is already so.
    pub fn set_container_startup(&self, uid: &str, container_id: &str, started: bool) {
        self.set_container_flag(uid, |_, status| {
            let Some(c) = container_mut(status, container_id) else {
                return false;
            };
            if c.started == Some(started) {
                return false;
            }
            c.started = Some(started);
            true
        });
    }

    /// Apply `change` to a copy of pod `uid`'s latest status and accept the copy when `change`
    /// says it changed something. The cache stays locked throughout, as the kubelet's status
    /// manager holds its lock: a sync's status cannot slip in between.
    fn set_container_flag(&self, uid: &str, change: impl FnOnce(&Pod, &mut PodStatus) -> bool) {
        let mut pods = self.shared.pods.lock();
        let Some(entry) = pods.get(uid).filter(|e| e.version > 0 && !e.removed) else {
            return;
        };
        let pod = Arc::clone(&entry.pod);
        let mut status = PodStatus::clone(&entry.status);
        if !change(&pod, &mut status) {
            return;
        }
        let accepted = self.update_locked(&mut pods, &pod, status, false);
        drop(pods);
        if accepted {
            self.notify();
        }
    }

    /// Force the pod to `Failed` (eviction, activeDeadlineSeconds): the current and every later
    /// status get phase `Failed` with `reason`/`message` from `phase_reason` (empty if `None`),
    /// published once no container runs. `extra_condition` (typically `DisruptionTarget`,
    /// reason `TerminationByKubelet`) is added at that moment.
    pub fn set_terminal(
        &self,
        pod: &Arc<Pod>,
        phase_reason: Option<(String, String)>,
        extra_condition: Option<PodCondition>,
    ) {
        let base = {
            let mut pods = self.shared.pods.lock();
            let n = self.shared.sinks.len();
            let entry = pods
                .entry(podutil::uid(pod).to_string())
                .or_insert_with(|| Entry::new(Arc::clone(pod), n));
            entry.forced_failure = Some(phase_reason.unwrap_or_default());
            if let Some(mut c) = extra_condition {
                if c.last_transition_time.is_none() {
                    c.last_transition_time = Some(Time(Timestamp::now()));
                }
                entry.pending_conditions.retain(|p| p.type_ != c.type_);
                entry.pending_conditions.push(c);
            }
            if entry.version > 0 && !entry.removed {
                PodStatus::clone(&entry.status)
            } else {
                pod.status.clone().unwrap_or_default()
            }
        };
        self.update(pod, base, true);
    }

    /// The agent has killed `pod`: containers without a terminated state are reported as
    /// terminated (exit code 137, reason `ContainerStatusUnknown`), and a non-static pod in a
    /// non-terminal phase becomes `Failed`. Static pods keep their computed phase.
    pub fn terminate_pod(&self, pod: &Arc<Pod>) {
        let base = {
            let pods = self.shared.pods.lock();
            match pods
                .get(podutil::uid(pod))
                .filter(|e| e.version > 0 && !e.removed)
            {
                Some(e) => PodStatus::clone(&e.status),
                None => pod.status.clone().unwrap_or_default(),
            }
        };
        let status = terminated_status(pod, base);
        self.update(pod, status, true);
    }

    /// The pod finished and left every source: drop it from the cache and the reader, and tell
    /// every sink (`pod_removed`) once its last status was delivered.
    pub fn remove_pod(&self, pod: &Arc<Pod>) {
        let uid = podutil::uid(pod).to_string();
        self.shared.reader.remove(&uid);
        {
            let mut pods = self.shared.pods.lock();
            let n = self.shared.sinks.len();
            let entry = pods
                .entry(uid)
                .or_insert_with(|| Entry::new(Arc::clone(pod), n));
            entry.removed = true;
            entry.pod = Arc::clone(pod);
            entry.forced_failure = None;
            entry.pending_conditions.clear();
            for slot in &mut entry.sinks {
                slot.removal_done = false;
                slot.removal_failed = false;
            }
            if n == 0 {
                pods.remove(podutil::uid(pod));
            }
        }
        self.notify();
    }

    fn notify(&self) {
        self.shared.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// The kubelet's `updateStatusInternal` + `mergePodStatus` + `normalizeStatus`.
    fn update(&self, pod: &Arc<Pod>, status: PodStatus, forced: bool) {
        let mut pods = self.shared.pods.lock();
        let accepted = self.update_locked(&mut pods, pod, status, forced);
        drop(pods);
        if accepted {
            self.notify();
        }
    }

    /// [`update`](Self::update) with the cache already locked; whether a new version was
    /// accepted (the caller then notifies, once the lock is released).
    fn update_locked(
        &self,
        pods: &mut HashMap<String, Entry>,
        pod: &Arc<Pod>,
        mut status: PodStatus,
        forced: bool,
    ) -> bool {
        let uid = podutil::uid(pod).to_string();
        let full_name = podutil::full_name(pod);
        let now = Timestamp::now();
        let n = self.shared.sinks.len();
        let entry = pods
            .entry(uid.clone())
            .or_insert_with(|| Entry::new(Arc::clone(pod), n));
        if entry.removed {
            // Same UID again (re-added after removal): start afresh.
            *entry = Entry::new(Arc::clone(pod), n);
        }
        let cached = (entry.version > 0).then(|| Arc::clone(&entry.status));
        let default_old = PodStatus::default();
        let old: &PodStatus = cached
            .as_deref()
            .or(pod.status.as_ref())
            .unwrap_or(&default_old);

        if let Some((reason, message)) = &entry.forced_failure {
            status.phase = Some(PodPhase::Failed.as_str().to_string());
            status.reason = Some(reason.clone()).filter(|r| !r.is_empty());
            status.message = Some(message.clone()).filter(|m| !m.is_empty());
        }

        if let Err(msg) = check_container_state_transition(old, &status, pod) {
            tracing::error!(pod = %full_name, podUID = %uid, "status update on pod aborted: {msg}");
            return false;
        }

        // Terminal phases are sticky.
        if is_terminal_phase(old.phase.as_deref()) && status.phase != old.phase {
            tracing::error!(
                pod = %full_name, podUID = %uid,
                original = old.phase.as_deref().unwrap_or(""),
                attempted = status.phase.as_deref().unwrap_or(""),
                "Pod attempted illegal phase transition"
            );
            status.phase = old.phase.clone();
            status.reason = old.reason.clone();
            status.message = old.message.clone();
        }

        // Never publish a terminal phase while a container may still run.
        let running = any_running(&status);
        if is_terminal_phase(status.phase.as_deref())
            && !is_terminal_phase(old.phase.as_deref())
            && running
        {
            tracing::debug!(pod = %full_name, podUID = %uid, "delaying terminal phase until no container runs");
            status.phase = Some(
                old.phase
                    .clone()
                    .unwrap_or_else(|| PodPhase::Pending.as_str().to_string()),
            );
            status.reason = old.reason.clone();
            status.message = old.message.clone();
        }

        // Conditions: kubelet-owned from the new status; others from the old one; shared ones
        // (DisruptionTarget) only once the pod is terminal and nothing runs.
        let terminal_now = is_terminal_phase(status.phase.as_deref()) && !running;
        let mut conditions: Vec<PodCondition> = old
            .conditions
            .iter()
            .flatten()
            .filter(|c| !is_kubelet_condition(&c.type_))
            .cloned()
            .collect();
        for c in status.conditions.take().into_iter().flatten() {
            if is_kubelet_condition(&c.type_) {
                conditions.push(c);
            } else if is_shared_condition(&c.type_) {
                if !conditions.iter().any(|x| x.type_ == c.type_) {
                    entry.pending_conditions.retain(|p| p.type_ != c.type_);
                    entry.pending_conditions.push(c);
                }
            } else if !conditions.iter().any(|x| x.type_ == c.type_) {
                conditions.push(c);
            }
        }
        if terminal_now {
            for mut c in std::mem::take(&mut entry.pending_conditions) {
                c.last_transition_time = Some(Time(now));
                match conditions.iter_mut().find(|x| x.type_ == c.type_) {
                    Some(x) => *x = c,
                    None => conditions.push(c),
                }
            }
        }
        for c in &mut conditions {
            if is_kubelet_condition(&c.type_) {
                status_gen::set_last_transition_time(c, Some(old), now);
            } else if c.last_transition_time.is_none() {
                c.last_transition_time = Some(Time(now));
            }
        }
        status.conditions = Some(conditions);

        // Ready and ContainersReady are False in a terminal phase.
        if let Some(phase) = status.phase.clone().filter(|p| is_terminal_phase(Some(p))) {
            for c in status.conditions.iter_mut().flatten() {
                if (c.type_ == PodConditionType::Ready
                    || c.type_ == PodConditionType::ContainersReady)
                    && c.status == "True"
                {
                    let t = status_gen::terminal_containers_ready_condition(&phase);
                    c.status = t.status;
                    c.reason = t.reason;
                    c.message = None;
                    c.last_transition_time = Some(Time(now));
                }
            }
        }

        // startTime is set once.
        status.start_time = old
            .start_time
            .clone()
            .or(status.start_time)
            .or(Some(Time(now)));
        status.resource_claim_statuses = old
            .resource_claim_statuses
            .clone()
            .or(status.resource_claim_statuses);

        normalize_status(pod, &mut status);

        if let Some(cached) = &cached
            && !forced
            && kubelet_view_equal(cached, &mut status)
        {
            tracing::trace!(pod = %full_name, podUID = %uid, "ignoring same status");
            entry.pod = Arc::clone(pod);
            return false;
        }
        entry.version += 1;
        entry.status = Arc::new(status);
        entry.pod = Arc::clone(pod);
        tracing::debug!(
            pod = %full_name, podUID = %uid, version = entry.version,
            phase = entry.status.phase.as_deref().unwrap_or(""),
            "pod status updated"
        );
        self.shared
            .reader
            .put(Arc::clone(&entry.pod), Arc::clone(&entry.status));
        true
    }

    /// Deliver statuses and events to the sinks until `shutdown` is cancelled.
    ///
    /// Wakes on every accepted change and every [`SYNC_PERIOD`]; for each pod whose latest
    /// version a sink has not accepted yet, calls `update_pod_status` with that latest version
    /// (intermediate versions collapse). Sinks are served concurrently and independently; one
    /// call per pod per sink is in flight at a time, so a sink sees each pod's statuses in order.
    /// A failed call is retried on the next tick. Every event from `events` is passed to every
    /// sink's `record_event`. Call it once; a second concurrent call returns at once.
    pub async fn run(&self, mut events: mpsc::Receiver<Event>, shutdown: CancellationToken) {
        if self.shared.running.swap(true, Ordering::SeqCst) {
            tracing::warn!("status manager is already running; second run() ignored");
            return;
        }
        let mut event_txs = Vec::with_capacity(self.shared.sinks.len());
        let mut workers = Vec::with_capacity(self.shared.sinks.len() * 2);
        for (idx, sink) in self.shared.sinks.iter().enumerate() {
            let (tx, rx) = mpsc::channel::<Event>(EVENT_QUEUE_PER_SINK);
            event_txs.push(tx);
            workers.push(futures::future::Either::Left(event_worker(
                Arc::clone(sink),
                rx,
                shutdown.clone(),
            )));
            workers.push(futures::future::Either::Right(
                self.sink_worker(idx, shutdown.clone()),
            ));
        }
        let dispatch = async {
            loop {
                tokio::select! {
                    biased;
                    () = shutdown.cancelled() => break,
                    ev = events.recv() => match ev {
                        Some(ev) => {
                            for tx in &event_txs {
                                if tx.try_send(ev.clone()).is_err() {
                                    tracing::warn!(reason = %ev.reason, "event queue of a status sink is full; event dropped");
                                }
                            }
                        }
                        None => {
                            // No more events; keep delivering statuses until shutdown.
                            shutdown.cancelled().await;
                            break;
                        }
                    },
                }
            }
            drop(event_txs);
        };
        futures::join!(dispatch, futures::future::join_all(workers));
        self.shared.running.store(false, Ordering::SeqCst);
    }

    /// Pick the calls sink `idx` should make now, marking them in flight.
    fn take_jobs(&self, idx: usize, retry_failed: bool) -> Vec<Job> {
        let mut pods = self.shared.pods.lock();
        let mut jobs = Vec::new();
        for (uid, e) in pods.iter_mut() {
            let Some(slot) = e.sinks.get_mut(idx) else {
                continue;
            };
            if slot.in_flight {
                continue;
            }
            if slot.acked < e.version {
                if retry_failed || slot.failed != Some(e.version) {
                    slot.in_flight = true;
                    jobs.push(Job::Status {
                        uid: uid.clone(),
                        pod: Arc::clone(&e.pod),
                        status: Arc::clone(&e.status),
                        version: e.version,
                    });
                }
            } else if e.removed && !slot.removal_done && (retry_failed || !slot.removal_failed) {
                slot.in_flight = true;
                jobs.push(Job::Removed {
                    uid: uid.clone(),
                    pod: Arc::clone(&e.pod),
                });
            }
        }
        jobs
    }

    fn complete(&self, idx: usize, outcome: Outcome) {
        let mut pods = self.shared.pods.lock();
        match outcome {
            Outcome::Status { uid, version, ok } => {
                if let Some(slot) = pods.get_mut(&uid).and_then(|e| e.sinks.get_mut(idx)) {
                    slot.in_flight = false;
                    if ok {
                        slot.acked = slot.acked.max(version);
                        slot.failed = None;
                    } else {
                        slot.failed = Some(version);
                    }
                }
            }
            Outcome::Removed { uid, ok } => {
                let drop_entry = match pods.get_mut(&uid) {
                    Some(e) => {
                        if let Some(slot) = e.sinks.get_mut(idx) {
                            slot.in_flight = false;
                            slot.removal_done = ok;
                            slot.removal_failed = !ok;
                        }
                        e.removed && e.sinks.iter().all(|s| s.removal_done)
                    }
                    None => false,
                };
                if drop_entry {
                    pods.remove(&uid);
                }
            }
        }
    }

    async fn sink_worker(&self, idx: usize, shutdown: CancellationToken) {
        let Some(sink) = self.shared.sinks.get(idx).cloned() else {
            return;
        };
        let mut changed = self.shared.changed.subscribe();
        let mut tick = tokio::time::interval(SYNC_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.reset(); // the first scan happens right away below; the first retry after a period
        let mut in_flight = FuturesUnordered::new();
        let mut retry_failed = true;
        loop {
            for job in self.take_jobs(idx, retry_failed) {
                in_flight.push(run_job(Arc::clone(&sink), idx, job));
            }
            retry_failed = false;
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                Some(outcome) = in_flight.next(), if !in_flight.is_empty() => {
                    self.complete(idx, outcome);
                }
                res = changed.changed() => {
                    if res.is_err() {
                        return;
                    }
                }
                _ = tick.tick() => retry_failed = true,
            }
        }
        // Stopping: deliver what is known (the calls in flight and the statuses not sent yet:
        // the pods a node shutdown has just terminated), for at most `STOP_FLUSH`.
        // A pod whose older status is still in flight is taken again once that call is done:
        // its newer status (the terminal one of a pod a shutdown just killed) goes out too.
        let flush = async {
            loop {
                for job in self.take_jobs(idx, false) {
                    in_flight.push(run_job(Arc::clone(&sink), idx, job));
                }
                match in_flight.next().await {
                    Some(outcome) => self.complete(idx, outcome),
                    None => break,
                }
            }
        };
        if tokio::time::timeout(STOP_FLUSH, flush).await.is_err() {
            tracing::warn!(
                sink = idx,
                "pod statuses not delivered when the agent stopped"
            );
        }
    }
}

/// How long a stopping agent keeps delivering pod statuses.
const STOP_FLUSH: Duration = Duration::from_secs(3);

/// One call of a sink.
async fn run_job(sink: Arc<dyn StatusSink>, idx: usize, job: Job) -> Outcome {
    match job {
        Job::Status {
            uid,
            pod,
            status,
            version,
        } => {
            let res = sink.update_pod_status(&pod, &status).await;
            if let Err(e) = &res {
                tracing::warn!(
                    pod = %podutil::full_name(&pod), podUID = %uid, sink = idx, version,
                    "status sink failed to update pod status, will retry: {e}"
                );
            }
            Outcome::Status {
                uid,
                version,
                ok: res.is_ok(),
            }
        }
        Job::Removed { uid, pod } => {
            let res = sink.pod_removed(&pod).await;
            if let Err(e) = &res {
                tracing::warn!(
                    pod = %podutil::full_name(&pod), podUID = %uid, sink = idx,
                    "status sink failed to handle pod removal, will retry: {e}"
                );
            }
            Outcome::Removed {
                uid,
                ok: res.is_ok(),
            }
        }
    }
}

async fn event_worker(
    sink: Arc<dyn StatusSink>,
    mut rx: mpsc::Receiver<Event>,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            ev = rx.recv() => match ev {
                Some(ev) => {
                    if let Err(e) = sink.record_event(&ev).await {
                        tracing::warn!(reason = %ev.reason, "status sink failed to record event: {e}");
                    }
                }
                None => break,
            },
        }
    }
}

/// The status of container instance `id` (without the runtime prefix) in `status`.
fn container_mut<'a>(status: &'a mut PodStatus, id: &str) -> Option<&'a mut ContainerStatus> {
    status
        .container_statuses
        .iter_mut()
        .flatten()
        .chain(status.init_container_statuses.iter_mut().flatten())
        .find(|c| {
            c.container_id
                .as_deref()
                .is_some_and(|cid| kubelet_api::runtime::strip_container_id(cid) == id)
        })
}

fn any_running(status: &PodStatus) -> bool {
    status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten())
        .any(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
}

fn is_terminated(c: &ContainerStatus) -> bool {
    c.state.as_ref().is_some_and(|s| s.terminated.is_some())
}

/// `hasPodInitialized`, judged on `status`.
fn has_pod_initialized(pod: &Pod, status: &PodStatus) -> bool {
    if podutil::init_containers(pod).is_empty() {
        return true;
    }
    let regular_moved = status.container_statuses.iter().flatten().any(|c| {
        c.last_state
            .as_ref()
            .is_some_and(|l| l.terminated.is_some())
            || c.state.as_ref().is_none_or(|s| s.waiting.is_none())
    });
    if regular_moved {
        return true;
    }
    if let Some(last) = status
        .init_container_statuses
        .as_ref()
        .and_then(|v| v.last())
    {
        let exited0 = |s: Option<&ContainerState>| {
            s.and_then(|s| s.terminated.as_ref())
                .is_some_and(|t| t.exit_code == 0)
        };
        if exited0(last.last_state.as_ref()) || exited0(last.state.as_ref()) {
            return true;
        }
    }
    false
}

/// The status `TerminatePod` writes: lost containers terminated with 137, phase Failed.
fn terminated_status(pod: &Pod, mut status: PodStatus) -> PodStatus {
    if has_pod_initialized(pod, &status) {
        for c in status.container_statuses.iter_mut().flatten() {
            if !is_terminated(c) {
                c.state = Some(crate::status_gen::lost_container_state());
            }
        }
    }
    if let Some(inits) = status.init_container_statuses.as_mut() {
        // All but the trailing init containers that never attempted to start.
        let attempted = |c: &ContainerStatus| {
            c.state.as_ref().is_none_or(|s| s.waiting.is_none())
                || c.last_state
                    .as_ref()
                    .is_some_and(|l| l.terminated.is_some())
        };
        let upto = inits
            .iter()
            .rposition(attempted)
            .map_or(usize::from(!inits.is_empty()), |i| i + 1);
        for c in inits.iter_mut().take(upto) {
            if !is_terminated(c) {
                c.state = Some(crate::status_gen::lost_container_state());
            }
        }
    }
    if !podutil::is_static(pod) && !is_terminal_phase(status.phase.as_deref()) {
        tracing::debug!(pod = %podutil::full_name(pod), old_phase = status.phase.as_deref().unwrap_or(""), "marking terminated pod as failed");
        status.phase = Some(PodPhase::Failed.as_str().to_string());
    }
    status
}

/// A status that would bring a terminated container back while the restart policy forbids it
/// (the kubelet's messages).
#[derive(Debug, thiserror::Error)]
enum IllegalTransition {
    #[error("terminated container {0} attempted illegal transition to non-terminated state")]
    Container(String),
    #[error("terminated init container {0} attempted illegal transition to non-terminated state")]
    InitContainer(String),
}

/// `checkContainerStateTransition`: a terminated container may not become non-terminated when
/// the restart policy forbids a restart.
fn check_container_state_transition(
    old: &PodStatus,
    new: &PodStatus,
    pod: &Pod,
) -> Result<(), IllegalTransition> {
    let policy = podutil::restart_policy(pod);
    if policy == RestartPolicy::Always {
        return Ok(());
    }
    let may_not_restart = |c: &ContainerStatus| {
        c.state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .is_some_and(|t| !(t.exit_code != 0 && policy == RestartPolicy::OnFailure))
    };
    for o in old.container_statuses.iter().flatten() {
        if !may_not_restart(o) {
            continue;
        }
        if let Some(n) = new
            .container_statuses
            .iter()
            .flatten()
            .find(|n| n.name == o.name)
            && !is_terminated(n)
        {
            return Err(IllegalTransition::Container(n.name.clone()));
        }
    }
    let inits = podutil::init_containers(pod);
    for o in old.init_container_statuses.iter().flatten() {
        let Some(spec) = inits.iter().find(|c| c.name == o.name) else {
            continue;
        };
        if podutil::is_sidecar(spec) || !may_not_restart(o) {
            continue;
        }
        if let Some(n) = new
            .init_container_statuses
            .iter()
            .flatten()
            .find(|n| n.name == o.name)
            && !is_terminated(n)
        {
            return Err(IllegalTransition::InitContainer(n.name.clone()));
        }
    }
    Ok(())
}

fn truncate_time(t: &mut Time) {
    if let Ok(ts) = Timestamp::from_second(t.0.as_second()) {
        t.0 = ts;
    }
}

fn truncate_utf8(s: &mut String, max: usize) {
    if s.len() <= max {
        return;
    }
    let mut end = max;
    while end > 0 && !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
}

/// `normalizeStatus`: second-precision timestamps, bounded termination messages, container
/// statuses sorted by name and init container statuses in spec order.
pub fn normalize_status(pod: &Pod, status: &mut PodStatus) {
    let spec_count = podutil::containers(pod).len()
        + podutil::init_containers(pod).len()
        + pod
            .spec
            .as_ref()
            .and_then(|s| s.ephemeral_containers.as_ref())
            .map_or(0, Vec::len);
    let bytes_per_status = MAX_POD_TERMINATION_MESSAGE_LENGTH / spec_count.max(1);
    let normalize_state = |s: &mut ContainerState| {
        if let Some(t) = s.running.as_mut().and_then(|r| r.started_at.as_mut()) {
            truncate_time(t);
        }
        if let Some(t) = s.terminated.as_mut() {
            for ts in [t.started_at.as_mut(), t.finished_at.as_mut()]
                .into_iter()
                .flatten()
            {
                truncate_time(ts);
            }
            if let Some(m) = t.message.as_mut() {
                truncate_utf8(m, bytes_per_status);
            }
        }
    };
    if let Some(t) = status.start_time.as_mut() {
        truncate_time(t);
    }
    for c in status.conditions.iter_mut().flatten() {
        for ts in [c.last_probe_time.as_mut(), c.last_transition_time.as_mut()]
            .into_iter()
            .flatten()
        {
            truncate_time(ts);
        }
    }
    for list in [
        status.container_statuses.as_mut(),
        status.init_container_statuses.as_mut(),
        status.ephemeral_container_statuses.as_mut(),
    ]
    .into_iter()
    .flatten()
    {
        for c in list.iter_mut() {
            if let Some(s) = c.state.as_mut() {
                normalize_state(s);
            }
            if let Some(s) = c.last_state.as_mut() {
                normalize_state(s);
            }
        }
    }
    if let Some(list) = status.container_statuses.as_mut() {
        kubelet_api::sort::by(list, |a, b| a.name.cmp(&b.name));
    }
    if let Some(list) = status.init_container_statuses.as_mut() {
        let inits = podutil::init_containers(pod);
        kubelet_api::sort::by_key(list, |s| {
            inits
                .iter()
                .position(|c| c.name == s.name)
                .unwrap_or(usize::MAX)
        });
    }
}

/// `isPodStatusByKubeletEqual`: equal when everything but the conditions the kubelet does not
/// own (or share) is equal.
///
/// Compared in place (every resync of every pod compares): `b` gets `a`'s conditions for the
/// comparison of the other fields and its own back afterwards.
fn kubelet_view_equal(a: &PodStatus, b: &mut PodStatus) -> bool {
    fn view(conditions: &Option<Vec<PodCondition>>) -> Vec<&PodCondition> {
        let mut conds: Vec<&PodCondition> = conditions
            .iter()
            .flatten()
            .filter(|c| is_kubelet_condition(&c.type_) || is_shared_condition(&c.type_))
            .collect();
        kubelet_api::sort::by(&mut conds, |x, y| x.type_.cmp(&y.type_));
        conds
    }
    if view(&a.conditions) != view(&b.conditions) {
        return false;
    }
    let own = std::mem::replace(&mut b.conditions, a.conditions.clone());
    let equal = a == b;
    b.conditions = own;
    equal
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status_gen::{MESSAGE_LOST_ON_TERMINATION, REASON_CONTAINER_STATUS_UNKNOWN};
    use k8s_openapi::api::core::v1::ContainerStateTerminated;
    use std::sync::atomic::AtomicUsize;

    use async_trait::async_trait;
    use k8s_openapi::api::core::v1::{Container, ContainerStateRunning, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use kubelet_api::{EventRecorder, InvolvedObject};

    #[test]
    fn statuses_are_equal_to_the_kubelet_when_only_conditions_it_does_not_own_differ() {
        let cond = |t: &str, s: &str| PodCondition {
            type_: t.into(),
            status: s.into(),
            ..Default::default()
        };
        let a = PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![
                cond("Ready", "True"),
                cond("example.com/gate", "True"),
            ]),
            ..Default::default()
        };
        // Another order, another writer's condition changed: equal, and `b` keeps its own.
        let mut b = PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![
                cond("example.com/gate", "False"),
                cond("Ready", "True"),
            ]),
            ..Default::default()
        };
        assert!(kubelet_view_equal(&a, &mut b));
        assert_eq!(
            b.conditions.as_ref().map(|c| c[0].status.as_str()),
            Some("False")
        );
        // A condition the kubelet owns, or another field, differs: not equal.
        let mut c = b.clone();
        c.conditions = Some(vec![cond("Ready", "False")]);
        assert!(!kubelet_view_equal(&a, &mut c));
        let mut d = b.clone();
        d.pod_ip = Some("10.0.0.1".into());
        assert!(!kubelet_view_equal(&a, &mut d));
        assert_eq!(d.conditions, b.conditions);
    }

    #[test]
    fn a_terminated_container_may_come_back_only_when_the_policy_restarts_it() {
        let status = |terminated: bool| {
            let mut state = k8s_openapi::api::core::v1::ContainerState::default();
            if terminated {
                state.terminated = Some(ContainerStateTerminated {
                    exit_code: 1,
                    ..Default::default()
                });
            } else {
                state.running = Some(ContainerStateRunning::default());
            }
            PodStatus {
                container_statuses: Some(vec![ContainerStatus {
                    name: "app".into(),
                    state: Some(state),
                    ..Default::default()
                }]),
                ..Default::default()
            }
        };
        let pod = |policy: &str| Pod {
            spec: Some(PodSpec {
                restart_policy: Some(policy.into()),
                containers: vec![Container {
                    name: "app".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let (old, new) = (status(true), status(false));
        let refused = check_container_state_transition(&old, &new, &pod("Never"));
        assert!(
            matches!(&refused, Err(IllegalTransition::Container(n)) if n == "app"),
            "{refused:?}"
        );
        assert_eq!(
            refused.map_err(|e| e.to_string()),
            Err(
                "terminated container app attempted illegal transition to non-terminated state"
                    .into()
            )
        );
        // A failed container restarts under OnFailure and Always.
        assert!(check_container_state_transition(&old, &new, &pod("OnFailure")).is_ok());
        assert!(check_container_state_transition(&old, &new, &pod("Always")).is_ok());
    }

    /// A sink that records calls, and can fail or stall on demand.
    #[derive(Default)]
    struct TestSink {
        calls: Mutex<Vec<(String, PodStatus)>>,
        removed: Mutex<Vec<String>>,
        events: Mutex<Vec<String>>,
        fail: AtomicBool,
        stall: AtomicBool,
        slow: AtomicBool,
        attempts: AtomicUsize,
    }

    impl TestSink {
        fn calls(&self) -> Vec<(String, PodStatus)> {
            self.calls.lock().clone()
        }
        fn phases(&self) -> Vec<String> {
            self.calls
                .lock()
                .iter()
                .map(|(_, s)| s.phase.clone().unwrap_or_default())
                .collect()
        }
    }

    #[async_trait]
    impl StatusSink for TestSink {
        async fn update_pod_status(
            &self,
            pod: &Pod,
            status: &PodStatus,
        ) -> kubelet_api::Result<()> {
            self.attempts.fetch_add(1, Ordering::SeqCst);
            if self.stall.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            if self.slow.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            if self.fail.load(Ordering::SeqCst) {
                return Err(kubelet_api::Error::new(
                    kubelet_api::ErrorKind::Unavailable,
                    "sink down",
                ));
            }
            self.calls
                .lock()
                .push((podutil::uid(pod).to_string(), status.clone()));
            Ok(())
        }
        async fn pod_removed(&self, pod: &Pod) -> kubelet_api::Result<()> {
            self.removed.lock().push(podutil::uid(pod).to_string());
            Ok(())
        }
        async fn record_event(&self, event: &Event) -> kubelet_api::Result<()> {
            self.events.lock().push(event.reason.clone());
            Ok(())
        }
    }

    fn pod(uid: &str, policy: &str) -> Arc<Pod> {
        Arc::new(Pod {
            metadata: ObjectMeta {
                name: Some(format!("pod-{uid}")),
                namespace: Some("default".into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                restart_policy: Some(policy.into()),
                containers: vec![
                    Container {
                        name: "b".into(),
                        ..Default::default()
                    },
                    Container {
                        name: "a".into(),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }),
            status: None,
        })
    }

    fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).expect("valid timestamp")
    }

    fn running_cs(name: &str) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            ready: true,
            state: Some(ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(Time(ts(1))),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn exited_cs(name: &str, code: i32) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: code,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn ready_cond(ok: bool) -> PodCondition {
        PodCondition {
            type_: PodConditionType::Ready.into(),
            status: if ok { "True" } else { "False" }.into(),
            ..Default::default()
        }
    }

    fn status(phase: &str, containers: Vec<ContainerStatus>) -> PodStatus {
        PodStatus {
            phase: Some(phase.into()),
            container_statuses: Some(containers),
            conditions: Some(vec![ready_cond(phase == PodPhase::Running.as_str())]),
            start_time: Some(Time(ts(0))),
            ..Default::default()
        }
    }

    fn manager(sinks: &[Arc<TestSink>]) -> StatusManager {
        StatusManager::new(
            sinks
                .iter()
                .map(|s| Arc::clone(s) as Arc<dyn StatusSink>)
                .collect(),
        )
    }

    fn start(m: &StatusManager) -> (CancellationToken, EventRecorder) {
        let token = CancellationToken::new();
        let (recorder, events) = EventRecorder::channel(16);
        let m = m.clone();
        let t = token.clone();
        tokio::spawn(async move { m.run(events, t).await });
        (token, recorder)
    }

    async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
        for _ in 0..2000 {
            if cond() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("timed out waiting for {what}");
    }

    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn identical_status_is_delivered_once() {
        let sink = Arc::new(TestSink::default());
        let m = manager(&[Arc::clone(&sink)]);
        let p = pod("u1", "Always");
        m.set_pod_status(
            &p,
            status(
                PodPhase::Running.as_str(),
                vec![running_cs("a"), running_cs("b")],
            ),
        );
        m.set_pod_status(
            &p,
            status(
                PodPhase::Running.as_str(),
                vec![running_cs("b"), running_cs("a")],
            ),
        );
        assert_eq!(
            m.version("u1"),
            1,
            "the duplicate does not bump the version"
        );
        let (token, _) = start(&m);
        eventually("first delivery", || sink.calls().len() == 1).await;
        m.set_pod_status(
            &p,
            status(
                PodPhase::Running.as_str(),
                vec![running_cs("a"), running_cs("b")],
            ),
        );
        settle().await;
        assert_eq!(sink.calls().len(), 1, "no second sink call");
        token.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn intermediate_versions_collapse_to_the_latest() {
        let sink = Arc::new(TestSink::default());
        let m = manager(&[Arc::clone(&sink)]);
        let p = pod("u1", "Always");
        m.set_pod_status(&p, status(PodPhase::Pending.as_str(), vec![]));
        let mut s = status(PodPhase::Running.as_str(), vec![running_cs("a")]);
        m.set_pod_status(&p, s.clone());
        s.container_statuses = Some(vec![running_cs("a"), running_cs("b")]);
        m.set_pod_status(&p, s);
        assert_eq!(m.version("u1"), 3);
        let (token, _) = start(&m);
        eventually("delivery", || !sink.calls().is_empty()).await;
        settle().await;
        let calls = sink.calls();
        assert_eq!(calls.len(), 1);
        assert_eq!(
            calls[0].1.container_statuses.as_ref().map(Vec::len),
            Some(2),
            "only the latest status is sent"
        );
        token.cancel();
    }

    #[tokio::test]
    async fn terminal_phase_is_sticky() {
        let m = manager(&[]);
        let p = pod("u1", "Always");
        let mut failed = status(
            PodPhase::Failed.as_str(),
            vec![exited_cs("a", 1), exited_cs("b", 0)],
        );
        failed.reason = Some("Evicted".into());
        failed.message = Some("low memory".into());
        m.set_pod_status(&p, failed);
        let mut running = status(
            PodPhase::Running.as_str(),
            vec![exited_cs("a", 1), exited_cs("b", 0)],
        );
        running.reason = None;
        m.set_pod_status(&p, running);
        let got = m.get("u1").expect("cached");
        assert_eq!(got.phase.as_deref(), Some(PodPhase::Failed.as_str()));
        assert_eq!(got.reason.as_deref(), Some("Evicted"));
        assert_eq!(got.message.as_deref(), Some("low memory"));
    }

    #[tokio::test]
    async fn start_time_is_set_once() {
        let m = manager(&[]);
        let p = pod("u1", "Always");
        m.set_pod_status(&p, status(PodPhase::Pending.as_str(), vec![]));
        let mut later = status(PodPhase::Running.as_str(), vec![running_cs("a")]);
        later.start_time = Some(Time(ts(500)));
        m.set_pod_status(&p, later);
        assert_eq!(m.get("u1").and_then(|s| s.start_time), Some(Time(ts(0))));

        let mut none = status(PodPhase::Pending.as_str(), vec![]);
        none.start_time = None;
        m.set_pod_status(&pod("u2", "Always"), none);
        assert!(m.get("u2").and_then(|s| s.start_time).is_some());
    }

    #[tokio::test]
    async fn deletion_timestamp_forces_an_update() {
        let m = manager(&[]);
        let mut p = pod("u1", "Always");
        Arc::make_mut(&mut p).metadata.deletion_timestamp = Some(Time(ts(10)));
        m.set_pod_status(
            &p,
            status(PodPhase::Running.as_str(), vec![running_cs("a")]),
        );
        m.set_pod_status(
            &p,
            status(PodPhase::Running.as_str(), vec![running_cs("a")]),
        );
        assert_eq!(m.version("u1"), 2);
    }

    /// Pod `uid` running containers `b` and `a` (instances `rt://b1`, `rt://a1`), neither
    /// started nor ready, as a sync reports them while startup and readiness probes run.
    fn probed_status() -> PodStatus {
        let cs = |name: &str| ContainerStatus {
            container_id: Some(format!("rt://{name}1")),
            ready: false,
            started: Some(false),
            ..running_cs(name)
        };
        let mut st = status(PodPhase::Running.as_str(), vec![cs("b"), cs("a")]);
        let not_ready = |t: PodConditionType| PodCondition {
            type_: t.into(),
            status: "False".into(),
            reason: Some("ContainersNotReady".into()),
            message: Some("containers with unready status: [b a]".into()),
            ..Default::default()
        };
        st.conditions = Some(vec![
            not_ready(PodConditionType::Ready),
            not_ready(PodConditionType::ContainersReady),
        ]);
        st
    }

    fn cs<'a>(s: &'a PodStatus, name: &str) -> &'a ContainerStatus {
        s.container_statuses
            .iter()
            .flatten()
            .find(|c| c.name == name)
            .expect("container listed")
    }

    fn cond(s: &PodStatus, t: PodConditionType) -> &PodCondition {
        s.conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == t)
            .expect("condition listed")
    }

    #[tokio::test]
    async fn startup_results_show_in_the_status_before_the_next_sync() {
        let sink = Arc::new(TestSink::default());
        let m = manager(std::slice::from_ref(&sink));
        let p = pod("u1", "Always");
        m.set_pod_status(&p, probed_status());
        assert_eq!(m.version("u1"), 1);

        m.set_container_startup("u1", "a1", true);
        let got = m.get("u1").expect("cached");
        assert_eq!(cs(&got, "a").started, Some(true));
        assert_eq!(cs(&got, "b").started, Some(false));
        assert!(!cs(&got, "a").ready, "started is not ready");
        assert_eq!(m.version("u1"), 2, "an accepted change");
        let (token, _rec) = start(&m);
        eventually("delivered", || {
            sink.calls()
                .last()
                .is_some_and(|(_, s)| cs(s, "a").started == Some(true))
        })
        .await;
        token.cancel();

        // The same result again, an instance the status does not list, an unknown pod: nothing.
        m.set_container_startup("u1", "a1", true);
        m.set_container_startup("u1", "a0", false);
        m.set_container_startup("u2", "a1", false);
        assert_eq!(m.version("u1"), 2);
        assert!(m.get("u2").is_none());

        // A failure (a restarted instance's) takes `started` back.
        m.set_container_startup("u1", "a1", false);
        assert_eq!(cs(&m.get("u1").expect("cached"), "a").started, Some(false));
    }

    #[tokio::test]
    async fn readiness_results_update_ready_and_the_conditions_before_the_next_sync() {
        let m = manager(&[]);
        let p = pod("u1", "Always");
        m.set_pod_status(&p, probed_status());
        let before = m.get("u1").expect("cached");
        let since = cond(&before, PodConditionType::Ready)
            .last_transition_time
            .clone();

        m.set_container_readiness("u1", "b1", true);
        let got = m.get("u1").expect("cached");
        assert!(cs(&got, "b").ready);
        for t in [PodConditionType::Ready, PodConditionType::ContainersReady] {
            let c = cond(&got, t);
            assert_eq!(c.status, "False");
            assert_eq!(
                c.message.as_deref(),
                Some("containers with unready status: [a]"),
                "{t:?}"
            );
        }
        assert_eq!(
            cond(&got, PodConditionType::Ready).last_transition_time,
            since,
            "still False: the transition time stays"
        );

        m.set_container_readiness("u1", "a1", true);
        let got = m.get("u1").expect("cached");
        for t in [PodConditionType::Ready, PodConditionType::ContainersReady] {
            let c = cond(&got, t);
            assert_eq!(c.status, "True", "{t:?}");
            assert_eq!(c.reason, None);
            assert_eq!(c.message, None);
        }
        assert_eq!(m.version("u1"), 3);

        m.set_container_readiness("u1", "a1", false);
        let got = m.get("u1").expect("cached");
        assert!(!cs(&got, "a").ready);
        assert_eq!(cond(&got, PodConditionType::Ready).status, "False");
        assert_eq!(
            cond(&got, PodConditionType::ContainersReady)
                .reason
                .as_deref(),
            Some("ContainersNotReady")
        );
    }

    #[tokio::test]
    async fn readiness_results_respect_the_readiness_gates() {
        let m = manager(&[]);
        let mut p = pod("u1", "Always");
        if let Some(spec) = Arc::make_mut(&mut p).spec.as_mut() {
            spec.readiness_gates = Some(vec![k8s_openapi::api::core::v1::PodReadinessGate {
                condition_type: "example.com/lb".into(),
            }]);
        }
        m.set_pod_status(&p, probed_status());
        m.set_container_readiness("u1", "a1", true);
        m.set_container_readiness("u1", "b1", true);
        let got = m.get("u1").expect("cached");
        assert_eq!(cond(&got, PodConditionType::ContainersReady).status, "True");
        let ready = cond(&got, PodConditionType::Ready);
        assert_eq!(ready.status, "False");
        assert_eq!(ready.reason.as_deref(), Some("ReadinessGatesNotReady"));
    }

    #[tokio::test]
    async fn illegal_container_transition_is_rejected() {
        let m = manager(&[]);
        let p = pod("u1", "Never");
        m.set_pod_status(
            &p,
            status(
                PodPhase::Running.as_str(),
                vec![exited_cs("a", 0), running_cs("b")],
            ),
        );
        m.set_pod_status(
            &p,
            status(
                PodPhase::Running.as_str(),
                vec![running_cs("a"), running_cs("b")],
            ),
        );
        assert_eq!(m.version("u1"), 1);
        // OnFailure may restart a failed container.
        let p = pod("u2", "OnFailure");
        m.set_pod_status(
            &p,
            status(PodPhase::Running.as_str(), vec![exited_cs("a", 1)]),
        );
        m.set_pod_status(
            &p,
            status(PodPhase::Running.as_str(), vec![running_cs("a")]),
        );
        assert_eq!(m.version("u2"), 2);
    }

    #[tokio::test]
    async fn terminal_phase_waits_until_no_container_runs() {
        let m = manager(&[]);
        let p = pod("u1", "Never");
        m.set_pod_status(
            &p,
            status(
                PodPhase::Running.as_str(),
                vec![running_cs("a"), running_cs("b")],
            ),
        );
        let mut s = status(
            PodPhase::Failed.as_str(),
            vec![exited_cs("a", 1), running_cs("b")],
        );
        s.conditions = Some(vec![ready_cond(true)]);
        m.set_pod_status(&p, s);
        let got = m.get("u1").expect("cached");
        assert_eq!(got.phase.as_deref(), Some(PodPhase::Running.as_str()));
        m.set_pod_status(
            &p,
            status(
                PodPhase::Failed.as_str(),
                vec![exited_cs("a", 1), exited_cs("b", 137)],
            ),
        );
        let got = m.get("u1").expect("cached");
        assert_eq!(got.phase.as_deref(), Some(PodPhase::Failed.as_str()));
    }

    #[tokio::test]
    async fn ready_is_forced_false_in_terminal_phase() {
        let m = manager(&[]);
        let p = pod("u1", "Never");
        let mut s = status(
            PodPhase::Succeeded.as_str(),
            vec![exited_cs("a", 0), exited_cs("b", 0)],
        );
        s.conditions = Some(vec![
            ready_cond(true),
            PodCondition {
                type_: PodConditionType::ContainersReady.into(),
                status: "True".into(),
                ..Default::default()
            },
        ]);
        m.set_pod_status(&p, s);
        let got = m.get("u1").expect("cached");
        for c in got.conditions.iter().flatten() {
            assert_eq!(c.status, "False", "{}", c.type_);
            assert_eq!(c.reason.as_deref(), Some("PodCompleted"));
        }
    }

    #[tokio::test]
    async fn status_is_normalized() {
        let m = manager(&[]);
        let p = pod("u1", "Always");
        let mut a = exited_cs("a", 1);
        if let Some(t) = a.state.as_mut().and_then(|s| s.terminated.as_mut()) {
            t.message = Some("é".repeat(10_000));
            t.finished_at = Some(Time(
                ts(3)
                    .checked_add(jiff::SignedDuration::from_millis(750))
                    .expect("time"),
            ));
        }
        let mut s = status(PodPhase::Running.as_str(), vec![running_cs("b"), a]);
        s.start_time = Some(Time(
            ts(0)
                .checked_add(jiff::SignedDuration::from_millis(999))
                .expect("time"),
        ));
        m.set_pod_status(&p, s);
        let got = m.get("u1").expect("cached");
        assert_eq!(got.start_time, Some(Time(ts(0))));
        let cs = got.container_statuses.expect("statuses");
        assert_eq!(cs[0].name, "a");
        assert_eq!(cs[1].name, "b");
        let t = cs[0]
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .expect("terminated");
        assert_eq!(t.finished_at, Some(Time(ts(3))));
        let msg = t.message.as_deref().unwrap_or("");
        assert!(
            msg.len() <= MAX_POD_TERMINATION_MESSAGE_LENGTH / 2,
            "{}",
            msg.len()
        );
        assert!(msg.len() > MAX_POD_TERMINATION_MESSAGE_LENGTH / 2 - 2);
    }

    #[tokio::test]
    async fn terminate_pod_reports_lost_containers_and_fails_the_pod() {
        let m = manager(&[]);
        let p = pod("u1", "Always");
        m.set_pod_status(
            &p,
            status(
                PodPhase::Running.as_str(),
                vec![running_cs("a"), exited_cs("b", 0)],
            ),
        );
        m.terminate_pod(&p);
        let got = m.get("u1").expect("cached");
        assert_eq!(got.phase.as_deref(), Some(PodPhase::Failed.as_str()));
        let cs = got.container_statuses.expect("statuses");
        let a = cs[0]
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .expect("a terminated");
        assert_eq!(a.exit_code, 137);
        assert_eq!(a.reason.as_deref(), Some(REASON_CONTAINER_STATUS_UNKNOWN));
        assert_eq!(a.message.as_deref(), Some(MESSAGE_LOST_ON_TERMINATION));
        let b = cs[1]
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .expect("b terminated");
        assert_eq!(b.exit_code, 0, "already terminated containers are kept");
        assert!(
            got.conditions
                .iter()
                .flatten()
                .all(|c| c.type_ != PodConditionType::Ready || c.status == "False")
        );
    }

    #[tokio::test]
    async fn terminate_pod_keeps_the_phase_of_static_pods() {
        let m = manager(&[]);
        let mut p = pod("u1", "Always");
        Arc::make_mut(&mut p).metadata.annotations = Some(
            [(
                kubelet_api::annotations::CONFIG_SOURCE.to_string(),
                "file".to_string(),
            )]
            .into(),
        );
        m.set_pod_status(
            &p,
            status(
                PodPhase::Running.as_str(),
                vec![running_cs("a"), running_cs("b")],
            ),
        );
        m.terminate_pod(&p);
        let got = m.get("u1").expect("cached");
        assert_eq!(got.phase.as_deref(), Some(PodPhase::Running.as_str()));
        assert!(!any_running(&got));
    }

    #[tokio::test]
    async fn set_terminal_fails_the_pod_with_reason_once_containers_stop() {
        let m = manager(&[]);
        let p = pod("u1", "Always");
        m.set_pod_status(
            &p,
            status(
                PodPhase::Running.as_str(),
                vec![running_cs("a"), running_cs("b")],
            ),
        );
        m.set_terminal(
            &p,
            Some((
                "Evicted".into(),
                "The node was low on resource: memory.".into(),
            )),
            Some(PodCondition {
                type_: PodConditionType::DisruptionTarget.into(),
                status: "True".into(),
                reason: Some("TerminationByKubelet".into()),
                ..Default::default()
            }),
        );
        let got = m.get("u1").expect("cached");
        assert_eq!(
            got.phase.as_deref(),
            Some(PodPhase::Running.as_str()),
            "containers still run"
        );
        assert!(
            got.conditions
                .iter()
                .flatten()
                .all(|c| c.type_ != PodConditionType::DisruptionTarget)
        );
        // The engine regenerates after the kill.
        m.set_pod_status(
            &p,
            status(
                PodPhase::Running.as_str(),
                vec![exited_cs("a", 137), exited_cs("b", 137)],
            ),
        );
        let got = m.get("u1").expect("cached");
        assert_eq!(got.phase.as_deref(), Some(PodPhase::Failed.as_str()));
        assert_eq!(got.reason.as_deref(), Some("Evicted"));
        let dt = got
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == PodConditionType::DisruptionTarget)
            .expect("DisruptionTarget");
        assert_eq!(dt.reason.as_deref(), Some("TerminationByKubelet"));
        assert!(dt.last_transition_time.is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn failing_sink_is_retried_and_does_not_block_a_healthy_one() {
        let healthy = Arc::new(TestSink::default());
        let failing = Arc::new(TestSink::default());
        failing.fail.store(true, Ordering::SeqCst);
        let m = manager(&[Arc::clone(&failing), Arc::clone(&healthy)]);
        let (token, _) = start(&m);
        let p = pod("u1", "Always");
        m.set_pod_status(
            &p,
            status(PodPhase::Running.as_str(), vec![running_cs("a")]),
        );
        eventually("healthy delivery", || healthy.calls().len() == 1).await;
        assert_eq!(failing.attempts.load(Ordering::SeqCst), 1);
        // No retry before the tick...
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(failing.attempts.load(Ordering::SeqCst), 1);
        // ...and a retry on it, which succeeds once the sink is back.
        failing.fail.store(false, Ordering::SeqCst);
        tokio::time::sleep(SYNC_PERIOD).await;
        eventually("retried delivery", || failing.calls().len() == 1).await;
        assert_eq!(failing.phases(), [PodPhase::Running.as_str()]);
        assert_eq!(
            healthy.calls().len(),
            1,
            "the healthy sink is not called again"
        );
        token.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn stalled_sink_does_not_block_others_or_the_engine() {
        let healthy = Arc::new(TestSink::default());
        let stalled = Arc::new(TestSink::default());
        stalled.stall.store(true, Ordering::SeqCst);
        let m = manager(&[Arc::clone(&stalled), Arc::clone(&healthy)]);
        let (token, _) = start(&m);
        let p1 = pod("u1", "Always");
        let p2 = pod("u2", "Always");
        m.set_pod_status(&p1, status(PodPhase::Pending.as_str(), vec![]));
        eventually("first", || healthy.calls().len() == 1).await;
        m.set_pod_status(
            &p1,
            status(PodPhase::Running.as_str(), vec![running_cs("a")]),
        );
        m.set_pod_status(
            &p2,
            status(PodPhase::Running.as_str(), vec![running_cs("a")]),
        );
        eventually("others", || healthy.calls().len() == 3).await;
        // The stalled sink has one call in flight for u1 and started u2 independently.
        eventually("stalled attempts", || {
            stalled.attempts.load(Ordering::SeqCst) == 2
        })
        .await;
        token.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn calls_for_one_pod_stay_in_order() {
        let sink = Arc::new(TestSink::default());
        let m = manager(&[Arc::clone(&sink)]);
        let (token, _) = start(&m);
        let p = pod("u1", "Never");
        m.set_pod_status(&p, status(PodPhase::Pending.as_str(), vec![]));
        eventually("pending", || sink.calls().len() == 1).await;
        m.set_pod_status(
            &p,
            status(PodPhase::Running.as_str(), vec![running_cs("a")]),
        );
        eventually("running", || sink.calls().len() == 2).await;
        m.set_pod_status(
            &p,
            status(
                PodPhase::Succeeded.as_str(),
                vec![exited_cs("a", 0), exited_cs("b", 0)],
            ),
        );
        eventually("succeeded", || sink.calls().len() == 3).await;
        assert_eq!(
            sink.phases(),
            [
                PodPhase::Pending.as_str(),
                PodPhase::Running.as_str(),
                PodPhase::Succeeded.as_str()
            ]
        );
        token.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_stopping_manager_delivers_the_status_that_came_while_an_older_one_was_in_flight() {
        let sink = Arc::new(TestSink::default());
        sink.slow.store(true, Ordering::SeqCst);
        let m = manager(&[Arc::clone(&sink)]);
        let token = CancellationToken::new();
        let (_recorder, events) = EventRecorder::channel(16);
        let task = {
            let (m, t) = (m.clone(), token.clone());
            tokio::spawn(async move { m.run(events, t).await })
        };
        let p = pod("u1", "Never");
        m.set_pod_status(
            &p,
            status(PodPhase::Running.as_str(), vec![running_cs("a")]),
        );
        eventually("the Running call in flight", || {
            sink.attempts.load(Ordering::SeqCst) == 1
        })
        .await;
        // The pod is killed (a node shutdown) while the Running call is in flight, and the
        // agent stops at once.
        m.set_pod_status(
            &p,
            status(
                PodPhase::Failed.as_str(),
                vec![exited_cs("a", 137), exited_cs("b", 137)],
            ),
        );
        token.cancel();
        task.await.expect("status manager");
        assert_eq!(
            sink.phases(),
            [PodPhase::Running.as_str(), PodPhase::Failed.as_str()]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn removed_pod_is_dropped_and_sinks_are_told() {
        let sink = Arc::new(TestSink::default());
        let m = manager(&[Arc::clone(&sink)]);
        let reader = m.reader();
        let p = pod("u1", "Never");
        m.set_pod_status(
            &p,
            status(
                PodPhase::Succeeded.as_str(),
                vec![exited_cs("a", 0), exited_cs("b", 0)],
            ),
        );
        assert!(reader.get("u1").is_some());
        m.remove_pod(&p);
        assert!(reader.get("u1").is_none());
        assert!(m.get("u1").is_none());
        let (token, _) = start(&m);
        eventually("removal", || sink.removed.lock().len() == 1).await;
        assert_eq!(
            sink.phases(),
            [PodPhase::Succeeded.as_str()],
            "the final status comes first"
        );
        eventually("entry dropped", || m.shared.pods.lock().is_empty()).await;
        token.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn events_reach_every_sink() {
        let a = Arc::new(TestSink::default());
        let b = Arc::new(TestSink::default());
        let m = manager(&[Arc::clone(&a), Arc::clone(&b)]);
        let (token, recorder) = start(&m);
        let p = pod("u1", "Always");
        recorder.normal(InvolvedObject::pod(&p), "Started", "Started container a");
        eventually("events", || {
            a.events.lock().len() == 1 && b.events.lock().len() == 1
        })
        .await;
        assert_eq!(a.events.lock()[0], "Started");
        token.cancel();
    }

    #[tokio::test]
    async fn reader_sees_every_accepted_status() {
        let m = manager(&[]);
        let reader = m.reader();
        let p = pod("u1", "Always");
        m.set_pod_status(
            &p,
            status(PodPhase::Running.as_str(), vec![running_cs("a")]),
        );
        let got = reader.get("u1").expect("reader");
        assert_eq!(
            got.status.phase.as_deref(),
            Some(PodPhase::Running.as_str())
        );
        assert_eq!(reader.list().len(), 1);
    }
}
