//! Machinery shared by the relist PLEG and the evented PLEG: pod records, inspections that run
//! concurrently and may outlive the relist that started them, event delivery, health, metrics.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kubelet_api::runtime::{self, PodRuntimeStatus, RuntimePod, SandboxState, labels};
use kubelet_api::{
    ContainerRuntime, PLEG_CHANNEL_CAPACITY, PlegEvents, PlegHealth, PodCache, PodCacheWriter,
    PodLifecycleEvent, PodLifecycleEventType,
};
use parking_lot::Mutex;
use tokio::sync::mpsc::{self, error::TrySendError};
use tokio::sync::{Semaphore, mpsc::UnboundedReceiver};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::diff::{PodRecords, compute_pod_events, view_of_status};
use crate::error::PlegError;
use crate::generic::{GenericPlegConfig, RelistReport};
use crate::metrics::{FailureLabels, PlegMetrics};
use kubelet_core::duration::format_go as format_go_duration;

/// The most pods [`Core::forget_removed`] remembers between relists; past it, all are dropped
/// (their later stop and removal events are then inspected, as before).
const MAX_REMOVED: usize = 65_536;

/// Why a pod is inspected.
#[derive(Debug)]
pub(crate) enum JobKind {
    /// A relist saw the pod change: its events were computed from the listing (`view`).
    Relist {
        events: Vec<PodLifecycleEvent>,
        view: RuntimePod,
    },
    /// A runtime event (or a retry) asks for the pod's current state: events come from diffing
    /// the inspected status against the pod's record.
    Refresh,
}

/// What a background task reports.
#[derive(Debug)]
pub(crate) enum Done {
    Inspected(Box<Inspected>),
    /// The pod of a container ID that an event named without one.
    Resolved {
        container_id: String,
        pod: Option<(String, String, String)>,
        /// The event's stamp, as [`Core::event_for`] takes it.
        at: Option<jiff::Timestamp>,
    },
}

/// A finished inspection.
#[derive(Debug)]
pub(crate) struct Inspected {
    id: u64,
    uid: String,
    name: String,
    namespace: String,
    kind: JobKind,
    started: Instant,
    result: Result<PodRuntimeStatus, PlegError>,
}

/// An inspection in flight.
#[derive(Debug)]
struct Inflight {
    id: u64,
    launched: Instant,
    /// The wall-clock time of the launch: the inspection sees every change made before it.
    launched_at: jiff::Timestamp,
    /// Reported as slow (it outlived its relist's wait).
    slow: bool,
}

#[derive(Debug, Default)]
struct State {
    records: PodRecords,
    reinspect: HashSet<String>,
    inflight: HashMap<String, Inflight>,
    /// Pods asked to be refreshed while an inspection was in flight: refreshed once it ends.
    dirty: HashSet<String>,
    /// Pods whose worker is changing them (a sync): their runtime events are held until the
    /// worker releases them (`true` once one arrived).
    held: HashMap<String, bool>,
    /// When the last successful inspection of each pod was launched (wall clock): a runtime
    /// event stamped before it reports a change that inspection saw.
    inspected_at: HashMap<String, jiff::Timestamp>,
    /// Pods their worker removed and the PLEG forgot ([`Core::forget_removed`]), with when:
    /// their later stop and removal events are the worker's own, not inspected. Dropped by the
    /// next relist that starts after them.
    removed: HashMap<String, Instant>,
    next_id: u64,
}

#[derive(Debug, Default)]
struct Health {
    last_relist: Option<Instant>,
    last_list_error: Option<String>,
    threshold: Duration,
}

/// A pod whose inspection is taking long; see [`GenericPleg::slow_pods`](crate::GenericPleg::slow_pods).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SlowPod {
    /// Pod UID.
    pub uid: String,
    /// How long its inspection has been running.
    pub running_for: Duration,
}

/// Health with its causes: the kubelet's health signal, plus what it is made of, so a runtime
/// that does not answer can be told apart from one pod that is slow.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PlegDiagnosis {
    /// The health signal (unhealthy only when relisting itself fails or stalls past the
    /// threshold).
    pub health: PlegHealth,
    /// The error of the last relist's listing, when it failed: the runtime is unreachable or
    /// failing. `None` when the last listing succeeded.
    pub runtime_error: Option<String>,
    /// Pods whose inspection outlived its relist (they never make the PLEG unhealthy).
    pub slow_pods: Vec<SlowPod>,
    /// Events dropped because the channel was full.
    pub discarded_events: u64,
}

/// The shared engine of both PLEGs.
pub(crate) struct Core {
    pub(crate) runtime: Arc<dyn ContainerRuntime>,
    pub(crate) config: GenericPlegConfig,
    pub(crate) cache: PodCacheWriter,
    pub(crate) reader: PodCache,
    events_tx: mpsc::Sender<PodLifecycleEvent>,
    state: Mutex<State>,
    done_tx: mpsc::UnboundedSender<Done>,
    /// Completions; whoever drives the PLEG (a relist, the run loop) holds it, which also
    /// serialises relists.
    pub(crate) done_rx: tokio::sync::Mutex<UnboundedReceiver<Done>>,
    permits: Arc<Semaphore>,
    /// The background inspections and lookups, owned by the PLEG: dropping it aborts them.
    tasks: Mutex<JoinSet<()>>,
    /// Cancelled when the PLEG is dropped: background inspections stop at their next await.
    cancel: CancellationToken,
    pub(crate) metrics: PlegMetrics,
    health: Mutex<Health>,
}

impl Drop for Core {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("config", &self.config)
            .field("health", &*self.health.lock())
            .finish_non_exhaustive()
    }
}

/// The result of one listing: when it started and what it found.
pub(crate) type Listing = (Instant, kubelet_api::Result<Vec<RuntimePod>>);

impl Core {
    pub(crate) fn new(
        runtime: Arc<dyn ContainerRuntime>,
        config: GenericPlegConfig,
    ) -> (Self, PlegEvents) {
        let (cache, reader) = kubelet_api::pod_cache();
        let (events_tx, events_rx) = mpsc::channel(PLEG_CHANNEL_CAPACITY);
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let permits = Arc::new(Semaphore::new(config.max_concurrent_inspections.max(1)));
        let threshold = config.relist_threshold;
        let core = Self {
            runtime,
            config,
            cache,
            reader,
            events_tx,
            state: Mutex::new(State::default()),
            done_tx,
            done_rx: tokio::sync::Mutex::new(done_rx),
            permits,
            tasks: Mutex::new(JoinSet::new()),
            cancel: CancellationToken::new(),
            metrics: PlegMetrics::default(),
            health: Mutex::new(Health {
                threshold,
                ..Default::default()
            }),
        };
        (core, events_rx)
    }

    /// Run `work` in the PLEG's own task set, reaping the tasks that have finished.
    fn spawn(&self, work: impl std::future::Future<Output = ()> + Send + 'static) {
        let mut tasks = self.tasks.lock();
        while let Some(done) = tasks.try_join_next() {
            if let Err(e) = done
                && e.is_panic()
            {
                tracing::error!(error = %kubelet_api::chain(&e), "a PLEG inspection panicked");
            }
        }
        tasks.spawn(work);
    }

    pub(crate) fn set_threshold(&self, threshold: Duration) {
        self.health.lock().threshold = threshold;
    }

    pub(crate) fn last_relist(&self) -> Option<Instant> {
        self.health.lock().last_relist
    }

    /// List every pod; a future that borrows nothing, so a loop can race it with other work.
    pub(crate) fn list(&self) -> impl Future<Output = Listing> + Send + 'static {
        let runtime = self.runtime.clone();
        async move {
            let start = Instant::now();
            (start, runtime::get_pods(&*runtime).await)
        }
    }

    /// Take in a listing: diff every pod not under inspection against its record, send the
    /// events of vanished pods, and start inspections of changed pods (and of pods whose last
    /// inspection failed). Returns the IDs of the inspections started.
    pub(crate) fn take_listing(
        &self,
        listing: Listing,
        report: &mut RelistReport,
    ) -> Result<HashSet<u64>, PlegError> {
        let (start, pods) = listing;
        let pods = match pods {
            Ok(p) => p,
            Err(source) => {
                let err = PlegError::ListPods { source };
                tracing::warn!(error = %kubelet_api::chain(&err), "PLEG: relist failed; will retry");
                self.health.lock().last_list_error = Some(kubelet_api::chain(&err).to_string());
                return Err(err);
            }
        };
        {
            let mut h = self.health.lock();
            if let Some(prev) = h.last_relist {
                self.metrics
                    .relist_interval
                    .observe(start.saturating_duration_since(prev).as_secs_f64());
            }
            h.last_relist = Some(start);
            h.last_list_error = None;
        }
        self.metrics.last_seen.set(unix_seconds(start));
        report.pods = pods.len();
        let mut launched = HashSet::new();
        let mut st = self.state.lock();
        let st = &mut *st;
        st.records.set_current(pods);
        for uid in st.records.uids() {
            if st.inflight.contains_key(&uid) {
                // Diffed again once the inspection in flight has set the baseline.
                continue;
            }
            let Some(record) = st.records.get(&uid) else {
                continue;
            };
            let events = compute_pod_events(&uid, record.old.as_ref(), record.current.as_ref());
            if events.is_empty() && !st.reinspect.contains(&uid) {
                st.records.update(&uid);
                continue;
            }
            match record.current.clone() {
                Some(view) => {
                    let (name, namespace) = (view.name.clone(), view.namespace.clone());
                    let id =
                        self.launch(st, uid, name, namespace, JobKind::Relist { events, view });
                    launched.insert(id);
                }
                None => {
                    // The pod has no sandbox or container left: drop its entry. Waiters still
                    // get an (empty) status once the global timestamp is raised.
                    tracing::debug!(podUID = %uid, "PLEG: pod is gone from the runtime");
                    self.cache.delete(&uid);
                    st.reinspect.remove(&uid);
                    st.inspected_at.remove(&uid);
                    st.records.update(&uid);
                    self.send_events(events, report);
                }
            }
        }
        Ok(launched)
    }

    /// Start inspecting `uid` in the background, or, when an inspection of it is already in
    /// flight, refresh it again once that one ends. Returns the job ID (0 when deferred).
    pub(crate) fn refresh(&self, uid: String, name: String, namespace: String) -> u64 {
        let mut st = self.state.lock();
        self.launch(&mut st, uid, name, namespace, JobKind::Refresh)
    }

    /// Hold pod `uid`'s runtime events until [`release`](Self::release).
    pub(crate) fn hold(&self, uid: &str) {
        self.state.lock().held.insert(uid.to_string(), false);
    }

    /// Stop holding pod `uid`'s events; whether one arrived while it was held.
    pub(crate) fn release(&self, uid: &str) -> bool {
        self.state.lock().held.remove(uid).unwrap_or(false)
    }

    /// Pod `uid`'s worker removed every container and sandbox the pod had, and the pod is gone
    /// for good: drop its hold, its cache entry and its record without inspecting it, and skip
    /// its stop and removal events from now on (a creation or a start is inspected again).
    /// The next relist still finds anything left behind. `false` (and only the hold dropped)
    /// when an inspection of the pod is in flight: its result would bring the entry back, so
    /// the caller inspects the pod as usual.
    pub(crate) fn forget_removed(&self, uid: &str) -> bool {
        let mut st = self.state.lock();
        st.held.remove(uid);
        if st.inflight.contains_key(uid) {
            return false;
        }
        st.records.set_old(uid, None);
        st.reinspect.remove(uid);
        st.inspected_at.remove(uid);
        if st.removed.len() >= MAX_REMOVED {
            st.removed.clear();
        }
        st.removed.insert(uid.to_string(), Instant::now());
        self.cache.delete(uid);
        true
    }

    /// A runtime event for pod `uid` that happened at `at` (by the runtime's stamp; `None` for
    /// a stop or a removal, which are always looked at): held (and noted) while its worker
    /// changes it; nothing when an inspection launched after `at` (in flight, or the last that
    /// succeeded) sees the change, or when it is a stop or removal of a pod its worker removed
    /// ([`forget_removed`](Self::forget_removed)); otherwise a refresh.
    pub(crate) fn event_for(
        &self,
        uid: String,
        name: String,
        namespace: String,
        at: Option<jiff::Timestamp>,
    ) {
        {
            let mut st = self.state.lock();
            if let Some(arrived) = st.held.get_mut(&uid) {
                *arrived = true;
                return;
            }
            if st.removed.contains_key(&uid) {
                if at.is_none() {
                    return;
                }
                // Created again (the same UID added back): an ordinary pod from now on.
                st.removed.remove(&uid);
            }
            let seen = |launched: jiff::Timestamp| at.is_some_and(|at| launched > at);
            if st.inflight.get(&uid).is_some_and(|f| seen(f.launched_at))
                || st.inspected_at.get(&uid).is_some_and(|t| seen(*t))
            {
                return;
            }
        }
        self.refresh(uid, name, namespace);
    }

    /// Refresh every pod whose last inspection failed and that is not being inspected.
    pub(crate) fn refresh_failed(&self) {
        let mut st = self.state.lock();
        let st = &mut *st;
        let uids: Vec<String> = st
            .reinspect
            .iter()
            .filter(|u| !st.inflight.contains_key(*u))
            .cloned()
            .collect();
        for uid in uids {
            let (name, namespace) = st
                .records
                .old(&uid)
                .map(|p| (p.name.clone(), p.namespace.clone()))
                .unwrap_or_default();
            self.launch(st, uid, name, namespace, JobKind::Refresh);
        }
    }

    /// The pod of container (or sandbox) `id`, from the records.
    pub(crate) fn pod_of(&self, id: &str) -> Option<(String, String, String)> {
        self.state.lock().records.pod_of(id)
    }

    /// Name and namespace of pod `uid` from the records (empty when unknown).
    pub(crate) fn names_of(&self, uid: &str) -> (String, String) {
        let st = self.state.lock();
        st.records
            .get(uid)
            .and_then(|r| r.old.as_ref().or(r.current.as_ref()))
            .map(|p| (p.name.clone(), p.namespace.clone()))
            .unwrap_or_default()
    }

    /// Find the pod of a container or sandbox ID that the records do not know (a container
    /// created since the last relist), in the background; the answer arrives as
    /// [`Done::Resolved`], with the event's stamp `at` (so that a start the pod's last
    /// inspection saw is not inspected again once its pod is known).
    pub(crate) fn resolve(&self, container_id: String, at: Option<jiff::Timestamp>) {
        let runtime = self.runtime.clone();
        let tx = self.done_tx.clone();
        let cancel = self.cancel.clone();
        let timeout = self.config.inspect_timeout;
        self.spawn(async move {
            let work = async {
                let filter = runtime::ContainerFilter {
                    id: Some(container_id.clone()),
                    ..Default::default()
                };
                if let Ok(cs) = runtime.list_containers(&filter).await
                    && let Some(c) = cs.first()
                    && let Some(uid) = c.labels.get(labels::POD_UID)
                {
                    let label = |k: &str| c.labels.get(k).cloned().unwrap_or_default();
                    return Some((
                        uid.clone(),
                        label(labels::POD_NAME),
                        label(labels::POD_NAMESPACE),
                    ));
                }
                let filter = runtime::SandboxFilter {
                    id: Some(container_id.clone()),
                    ..Default::default()
                };
                if let Ok(ss) = runtime.list_pod_sandboxes(&filter).await
                    && let Some(s) = ss.first()
                {
                    let uid = s
                        .labels
                        .get(labels::POD_UID)
                        .cloned()
                        .unwrap_or_else(|| s.metadata.uid.clone());
                    if !uid.is_empty() {
                        return Some((uid, s.metadata.name.clone(), s.metadata.namespace.clone()));
                    }
                }
                None
            };
            let pod = tokio::select! {
                _ = cancel.cancelled() => return,
                r = tokio::time::timeout(timeout, work) => r.ok().flatten(),
            };
            let _ = tx.send(Done::Resolved {
                container_id,
                pod,
                at,
            });
        });
    }

    fn launch(
        &self,
        st: &mut State,
        uid: String,
        name: String,
        namespace: String,
        kind: JobKind,
    ) -> u64 {
        if st.inflight.contains_key(&uid) {
            st.dirty.insert(uid);
            return 0;
        }
        st.next_id += 1;
        let id = st.next_id;
        st.inflight.insert(
            uid.clone(),
            Inflight {
                id,
                launched: Instant::now(),
                launched_at: jiff::Timestamp::now(),
                slow: false,
            },
        );
        self.cache.mark_pending(&uid);
        let runtime = self.runtime.clone();
        let permits = self.permits.clone();
        let tx = self.done_tx.clone();
        let cancel = self.cancel.clone();
        let timeout = self.config.inspect_timeout;
        self.spawn(async move {
            let work = async {
                // The semaphore is never closed; without a permit the bound is simply not applied.
                let _permit = permits.acquire_owned().await.ok();
                let started = Instant::now();
                let inspect = runtime::get_pod_status(&*runtime, &uid, &name, &namespace);
                let result = match tokio::time::timeout(timeout, inspect).await {
                    Ok(Ok(status)) => Ok(status),
                    Ok(Err(source)) => Err(PlegError::InspectPod {
                        uid: uid.clone(),
                        source,
                    }),
                    Err(_) => Err(PlegError::InspectTimeout {
                        uid: uid.clone(),
                        timeout,
                    }),
                };
                (started, result)
            };
            let (started, result) = tokio::select! {
                _ = cancel.cancelled() => return,
                r = work => r,
            };
            let _ = tx.send(Done::Inspected(Box::new(Inspected {
                id,
                uid,
                name,
                namespace,
                kind,
                started,
                result,
            })));
        });
        id
    }

    /// Take in a completion: store the status (stamped with the inspection's start), advance
    /// the pod's record, send its events. Returns the job ID it completed (0 for none).
    pub(crate) fn apply(&self, done: Done, report: &mut RelistReport) -> u64 {
        let (id, uid, name, namespace, kind, started, result) = match done {
            Done::Resolved {
                container_id,
                pod,
                at,
            } => {
                match pod {
                    Some((uid, name, namespace)) => {
                        self.event_for(uid, name, namespace, at);
                    }
                    None => tracing::debug!(
                        containerID = %container_id,
                        "PLEG: event for a container the runtime no longer has; the relist settles it"
                    ),
                }
                return 0;
            }
            Done::Inspected(i) => {
                let i = *i;
                (
                    i.id,
                    i.uid,
                    i.name,
                    i.namespace,
                    i.kind,
                    i.started,
                    i.result,
                )
            }
        };
        let mut st = self.state.lock();
        let st = &mut *st;
        if st.inflight.get(&uid).is_none_or(|f| f.id != id) {
            return 0;
        }
        let launched_at = st.inflight.remove(&uid).map(|f| {
            if f.slow {
                tracing::info!(
                    podUID = %uid,
                    took = ?f.launched.elapsed(),
                    "PLEG: slow pod inspection finished"
                );
            }
            f.launched_at
        });
        match result {
            Ok(status) => {
                let status = fill_names(self.preserve_pod_ips(status));
                let (events, view) = match kind {
                    JobKind::Relist { events, view } => (events, Some(view)),
                    JobKind::Refresh => {
                        let view = view_of_status(&status);
                        let events = compute_pod_events(&uid, st.records.old(&uid), view.as_ref());
                        (events, view)
                    }
                };
                match &view {
                    Some(_) => {
                        self.cache.set(&uid, Ok(status), started);
                        if let Some(t) = launched_at {
                            st.inspected_at.insert(uid.clone(), t);
                        }
                    }
                    None => {
                        self.cache.delete(&uid);
                        st.inspected_at.remove(&uid);
                    }
                }
                st.records.set_old(&uid, view);
                st.reinspect.remove(&uid);
                report.pods_inspected += 1;
                self.send_events(events, report);
            }
            Err(err) => {
                let reason = match err {
                    PlegError::InspectTimeout { .. } => "timeout",
                    _ => "error",
                };
                self.metrics
                    .inspection_failures
                    .get_or_create(&FailureLabels { reason })
                    .inc();
                tracing::warn!(
                    podUID = %uid,
                    pod = %format_args!("{namespace}/{name}"),
                    error = %kubelet_api::chain(&err),
                    "PLEG: ignoring events for pod; it will be inspected again at the next relist"
                );
                // The record is not advanced, so the same diff is computed next time. The error
                // is what is known of the pod *now*: stamped with the time it was learnt, it
                // releases the pod's waiters even when every inspection of the pod hangs.
                let _ = started;
                self.cache.set(
                    &uid,
                    Err(kubelet_api::chain(&err).to_string()),
                    Instant::now(),
                );
                st.reinspect.insert(uid.clone());
                report.inspection_failures.push(err);
            }
        }
        if st.dirty.remove(&uid) {
            self.launch(st, uid, name, namespace, JobKind::Refresh);
        }
        id
    }

    /// Wait until every job of `ids` has completed or `deadline` passes, applying every
    /// completion that arrives meanwhile. Jobs still running at the deadline keep running;
    /// their pods are reported as slow.
    pub(crate) async fn wait_for(
        &self,
        done: &mut UnboundedReceiver<Done>,
        mut ids: HashSet<u64>,
        deadline: Instant,
        report: &mut RelistReport,
    ) {
        while !ids.is_empty() {
            match tokio::time::timeout_at(deadline, done.recv()).await {
                Ok(Some(d)) => {
                    let id = self.apply(d, report);
                    ids.remove(&id);
                }
                Ok(None) => break,
                Err(_) => break,
            }
        }
        if ids.is_empty() {
            return;
        }
        let mut st = self.state.lock();
        for (uid, f) in st.inflight.iter_mut() {
            if ids.contains(&f.id) && !f.slow {
                f.slow = true;
                tracing::warn!(
                    podUID = %uid,
                    running_for = ?f.launched.elapsed(),
                    timeout = ?self.config.inspect_timeout,
                    "PLEG: pod inspection is slow; other pods' events go ahead, this pod's follow when it finishes or times out"
                );
                report.slow_pods.push(uid.clone());
            }
        }
    }

    /// Report inspections running longer than the relist's inspection wait as slow (for
    /// inspections no relist waits for: those of runtime events).
    pub(crate) fn note_slow(&self) {
        let wait = self.config.inspection_wait;
        let mut st = self.state.lock();
        for (uid, f) in st.inflight.iter_mut() {
            if !f.slow && f.launched.elapsed() >= wait {
                f.slow = true;
                tracing::warn!(
                    podUID = %uid,
                    running_for = ?f.launched.elapsed(),
                    timeout = ?self.config.inspect_timeout,
                    "PLEG: pod inspection is slow; other pods' events go ahead, this pod's follow when it finishes or times out"
                );
            }
        }
    }

    /// Apply every completion already queued.
    pub(crate) fn drain(&self, done: &mut UnboundedReceiver<Done>, report: &mut RelistReport) {
        while let Ok(d) = done.try_recv() {
            self.apply(d, report);
        }
    }

    /// One full relist, waiting for its inspections up to the configured wait.
    pub(crate) async fn relist(
        &self,
        done: &mut UnboundedReceiver<Done>,
    ) -> Result<RelistReport, PlegError> {
        let mut report = RelistReport::default();
        self.drain(done, &mut report);
        let listing = self.list().await;
        let start = listing.0;
        let ids = self.take_listing(listing, &mut report)?;
        self.wait_for(done, ids, start + self.config.inspection_wait, &mut report)
            .await;
        self.finish_relist(start, &report);
        Ok(report)
    }

    /// After a relist's listing was taken in (and its inspections waited for): raise the
    /// global timestamp (pods still under inspection are pending and stay held) and record the
    /// duration.
    pub(crate) fn finish_relist(&self, start: Instant, report: &RelistReport) {
        self.cache.update_time(start);
        // This relist's listing saw what the workers removed before it started.
        self.state.lock().removed.retain(|_, at| *at >= start);
        self.metrics
            .relist_duration
            .observe(start.elapsed().as_secs_f64());
        tracing::trace!(
            pods = report.pods,
            events = report.events_sent,
            elapsed = ?start.elapsed(),
            "PLEG: relist done"
        );
    }

    /// The kubelet keeps the previous pod IPs when a pod has none and no ready sandbox, so a
    /// completed pod keeps reporting its IP.
    fn preserve_pod_ips(&self, mut status: PodRuntimeStatus) -> PodRuntimeStatus {
        let any_ready = status
            .sandbox_statuses
            .iter()
            .any(|s| s.state == SandboxState::Ready);
        if status.ips.is_empty()
            && !any_ready
            && let Some(old) = self.reader.get(&status.uid)
            && let Ok(old) = old.status
        {
            status.ips = old.ips.clone();
        }
        status
    }

    pub(crate) fn send_events(&self, events: Vec<PodLifecycleEvent>, report: &mut RelistReport) {
        for event in events {
            if event.kind == PodLifecycleEventType::ContainerChanged {
                continue;
            }
            match self.events_tx.try_send(event) {
                Ok(()) => report.events_sent += 1,
                Err(TrySendError::Full(event)) => {
                    self.metrics.discard_events.inc();
                    report.events_discarded += 1;
                    tracing::error!(
                        podUID = %event.pod_uid,
                        kind = ?event.kind,
                        "PLEG: event channel is full, discard this relist() cycle event"
                    );
                }
                Err(TrySendError::Closed(event)) => {
                    self.metrics.discard_events.inc();
                    report.events_discarded += 1;
                    tracing::debug!(
                        podUID = %event.pod_uid,
                        kind = ?event.kind,
                        "PLEG: event receiver is gone; event dropped"
                    );
                }
            }
        }
    }

    /// Whether the event channel is full (the evented PLEG's own health criterion).
    pub(crate) fn channel_full(&self) -> bool {
        self.events_tx.capacity() == 0
    }

    pub(crate) fn healthy(&self) -> PlegHealth {
        let h = self.health.lock();
        let Some(last) = h.last_relist else {
            return PlegHealth::Unhealthy("pleg has yet to be successful".to_string());
        };
        self.metrics.last_seen.set(unix_seconds(last));
        let elapsed = Instant::now().saturating_duration_since(last);
        if elapsed > h.threshold {
            let mut msg = format!(
                "pleg was last seen active {} ago; threshold is {}",
                format_go_duration(elapsed),
                format_go_duration(h.threshold)
            );
            if let Some(e) = &h.last_list_error {
                msg.push_str("; runtime unreachable: ");
                msg.push_str(e);
            }
            return PlegHealth::Unhealthy(msg);
        }
        PlegHealth::Healthy
    }

    pub(crate) fn slow_pods(&self) -> Vec<SlowPod> {
        let st = self.state.lock();
        let mut v: Vec<SlowPod> = st
            .inflight
            .iter()
            .filter(|(_, f)| f.slow)
            .map(|(uid, f)| SlowPod {
                uid: uid.clone(),
                running_for: f.launched.elapsed(),
            })
            .collect();
        kubelet_api::sort::by(&mut v, |a, b| a.uid.cmp(&b.uid));
        v
    }

    pub(crate) fn diagnose(&self) -> PlegDiagnosis {
        PlegDiagnosis {
            health: self.healthy(),
            runtime_error: self.health.lock().last_list_error.clone(),
            slow_pods: self.slow_pods(),
            discarded_events: self.metrics.discarded_events(),
        }
    }
}

/// Unix time (seconds) of a monotonic instant, for `kubelet_pleg_last_seen_seconds`.
fn unix_seconds(t: Instant) -> f64 {
    let ago = Instant::now().saturating_duration_since(t);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    now.saturating_sub(ago).as_secs_f64()
}

/// A refresh of a pod first seen through an event may not know its name: take it from the
/// sandbox or the containers' labels.
fn fill_names(mut status: PodRuntimeStatus) -> PodRuntimeStatus {
    if status.name.is_empty() {
        if let Some(s) = status.sandbox_statuses.first() {
            status.name = s.metadata.name.clone();
            status.namespace = s.metadata.namespace.clone();
        } else if let Some(c) = status.container_statuses.first() {
            status.name = c.labels.get(labels::POD_NAME).cloned().unwrap_or_default();
            status.namespace = c
                .labels
                .get(labels::POD_NAMESPACE)
                .cloned()
                .unwrap_or_default();
        }
    }
    status
}
