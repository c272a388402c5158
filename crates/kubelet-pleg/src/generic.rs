//! [`GenericPleg`]: the relist PLEG (`pkg/kubelet/pleg/generic.go`).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use kubelet_core::runtime::{self, PodRuntimeStatus, RuntimePod, SandboxState};
use kubelet_core::{
    ContainerRuntime, PlegHealth, PodCache, PodCacheWriter, PodLifecycleEvent,
    PodLifecycleEventGenerator, PodLifecycleEventType, pleg::PLEG_CHANNEL_CAPACITY,
};
use parking_lot::Mutex;
use tokio::sync::mpsc::{self, error::TrySendError};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::diff::{PodRecords, compute_pod_events};
use crate::error::PlegError;
use crate::format_go_duration;

/// The kubelet's relist period (`genericPlegRelistPeriod`): 1 s.
pub const GENERIC_PLEG_RELIST_PERIOD: Duration = Duration::from_secs(1);
/// The kubelet's health threshold (`genericPlegRelistThreshold`): 3 min without a successful
/// relist makes the PLEG unhealthy.
pub const GENERIC_PLEG_RELIST_THRESHOLD: Duration = Duration::from_secs(180);
/// Default bound on one pod's inspection within a relist.
pub const DEFAULT_INSPECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default number of changed pods inspected at once.
pub const DEFAULT_MAX_CONCURRENT_INSPECTIONS: usize = 8;

/// Settings of a [`GenericPleg`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct GenericPlegConfig {
    /// Pause between the end of one relist and the start of the next (default 1 s).
    pub relist_period: Duration,
    /// How long without a successful relist before [`healthy`](GenericPleg::healthy) reports
    /// unhealthy (default 3 min).
    pub relist_threshold: Duration,
    /// Longest one changed pod's inspection may take before it is abandoned, its error cached,
    /// and the pod queued for reinspection (default 10 s). The kubelet has no such bound beyond
    /// the 2 min runtime request timeout; here one hung pod delays a relist by at most this much,
    /// and never delays other pods' events.
    pub inspect_timeout: Duration,
    /// Changed pods inspected concurrently (default 8; 0 is treated as 1).
    pub max_concurrent_inspections: usize,
}

impl Default for GenericPlegConfig {
    fn default() -> Self {
        Self {
            relist_period: GENERIC_PLEG_RELIST_PERIOD,
            relist_threshold: GENERIC_PLEG_RELIST_THRESHOLD,
            inspect_timeout: DEFAULT_INSPECT_TIMEOUT,
            max_concurrent_inspections: DEFAULT_MAX_CONCURRENT_INSPECTIONS,
        }
    }
}

impl GenericPlegConfig {
    /// Set [`relist_period`](Self::relist_period).
    pub fn with_relist_period(mut self, period: Duration) -> Self {
        self.relist_period = period;
        self
    }

    /// Set [`relist_threshold`](Self::relist_threshold).
    pub fn with_relist_threshold(mut self, threshold: Duration) -> Self {
        self.relist_threshold = threshold;
        self
    }

    /// Set [`inspect_timeout`](Self::inspect_timeout).
    pub fn with_inspect_timeout(mut self, timeout: Duration) -> Self {
        self.inspect_timeout = timeout;
        self
    }

    /// Set [`max_concurrent_inspections`](Self::max_concurrent_inspections).
    pub fn with_max_concurrent_inspections(mut self, n: usize) -> Self {
        self.max_concurrent_inspections = n;
        self
    }
}

/// What one successful relist did.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct RelistReport {
    /// Pods seen in the runtime.
    pub pods: usize,
    /// Events delivered to the channel.
    pub events_sent: usize,
    /// Events dropped because the channel was full or closed.
    pub events_discarded: usize,
    /// Pods inspected successfully.
    pub pods_inspected: usize,
    /// Pods whose inspection failed or timed out; they are inspected again at the next relist.
    pub inspection_failures: Vec<PlegError>,
}

/// State only a relist touches; the async mutex around it serialises relists (`relistLock`).
#[derive(Debug, Default)]
struct RelistState {
    records: PodRecords,
    reinspect: HashSet<String>,
}

/// One changed pod to inspect.
struct Inspection {
    uid: String,
    pod: RuntimePod,
    events: Vec<PodLifecycleEvent>,
}

/// The generic (relist) pod lifecycle event generator.
///
/// Every [`relist_period`](GenericPlegConfig::relist_period) after the previous relist finished,
/// it lists every sandbox and container ([`runtime::get_pods`]), compares each container's and
/// sandbox's state with the previous list, and for each pod that changed (or whose previous
/// inspection failed) fetches its full status ([`runtime::get_pod_status`]) into the pod cache,
/// stamped with the relist's start time, before sending its events. After each relist the
/// cache's global timestamp is raised, so [`PodCache::get_newer_than`] returns for unchanged
/// pods too.
///
/// Events: a container or sandbox becoming running gives `ContainerStarted`, exited (or not
/// ready) gives `ContainerDied`, disappearing gives `ContainerRemoved` (preceded by
/// `ContainerDied` if it was not already exited). `ContainerChanged` (entering the runtime's
/// `Created` or `Unknown` state) triggers an inspection but is never sent. Events go to a
/// channel of [`PLEG_CHANNEL_CAPACITY`] without blocking; when it is full they are dropped and
/// counted ([`discarded_events`](Self::discarded_events)).
///
/// Changed pods are inspected concurrently (up to
/// [`max_concurrent_inspections`](GenericPlegConfig::max_concurrent_inspections)), each bounded
/// by [`inspect_timeout`](GenericPlegConfig::inspect_timeout), and each pod's events are sent as
/// soon as its own inspection finishes, so a slow pod never delays another pod's events.
pub struct GenericPleg {
    runtime: Arc<dyn ContainerRuntime>,
    config: GenericPlegConfig,
    cache: PodCacheWriter,
    reader: PodCache,
    events_tx: mpsc::Sender<PodLifecycleEvent>,
    events_rx: Mutex<Option<mpsc::Receiver<PodLifecycleEvent>>>,
    relist_state: tokio::sync::Mutex<RelistState>,
    last_relist: Mutex<Option<Instant>>,
    discarded: AtomicU64,
}

impl std::fmt::Debug for GenericPleg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GenericPleg")
            .field("config", &self.config)
            .field("last_relist", &*self.last_relist.lock())
            .field("discarded", &self.discarded_events())
            .finish_non_exhaustive()
    }
}

impl GenericPleg {
    /// A PLEG over `runtime` with a new, empty pod cache. Nothing happens until
    /// [`run`](PodLifecycleEventGenerator::run) or [`relist`](Self::relist) is called.
    pub fn new(runtime: Arc<dyn ContainerRuntime>, config: GenericPlegConfig) -> Self {
        let (cache, reader) = kubelet_core::pod_cache();
        let (events_tx, events_rx) = mpsc::channel(PLEG_CHANNEL_CAPACITY);
        Self {
            runtime,
            config,
            cache,
            reader,
            events_tx,
            events_rx: Mutex::new(Some(events_rx)),
            relist_state: tokio::sync::Mutex::new(RelistState::default()),
            last_relist: Mutex::new(None),
            discarded: AtomicU64::new(0),
        }
    }

    /// The settings this PLEG runs with.
    pub fn config(&self) -> &GenericPlegConfig {
        &self.config
    }

    /// Number of events dropped so far because the channel was full (or its receiver gone); the
    /// kubelet's `kubelet_pleg_discard_events`.
    pub fn discarded_events(&self) -> u64 {
        self.discarded.load(Ordering::Relaxed)
    }

    /// Start time of the last relist whose listing succeeded, if any.
    pub fn last_relist(&self) -> Option<Instant> {
        *self.last_relist.lock()
    }

    /// Relist now. Serialised with the periodic relists of [`run`](PodLifecycleEventGenerator::run).
    ///
    /// Returns [`PlegError::ListPods`] (after logging it) when listing fails; nothing else is
    /// changed then. Per-pod inspection failures are logged, cached as the pod's error, and
    /// returned in the report; those pods are inspected again at the next relist.
    pub async fn relist(&self) -> Result<RelistReport, PlegError> {
        let mut state = self.relist_state.lock().await;
        let start = Instant::now();
        let pods = match runtime::get_pods(&*self.runtime).await {
            Ok(p) => p,
            Err(source) => {
                let err = PlegError::ListPods { source };
                tracing::warn!(error = %err, "PLEG: relist failed; will retry");
                return Err(err);
            }
        };
        *self.last_relist.lock() = Some(start);
        let mut report = RelistReport {
            pods: pods.len(),
            ..Default::default()
        };
        let state = &mut *state;
        state.records.set_current(pods);

        let mut inspections = Vec::new();
        for uid in state.records.uids() {
            let Some(record) = state.records.get(&uid) else {
                continue;
            };
            let events = compute_pod_events(&uid, record.old.as_ref(), record.current.as_ref());
            if events.is_empty() && !state.reinspect.contains(&uid) {
                state.records.update(&uid);
                continue;
            }
            match record.current.clone() {
                Some(pod) => inspections.push(Inspection { uid, pod, events }),
                None => {
                    // The pod has no sandbox or container left: drop its entry. Waiters still
                    // get an (empty) status once the global timestamp is raised below.
                    tracing::debug!(pod_uid = %uid, "PLEG: pod is gone from the runtime");
                    self.cache.delete(&uid);
                    state.reinspect.remove(&uid);
                    state.records.update(&uid);
                    self.send_events(events, &mut report);
                }
            }
        }

        let timeout = self.config.inspect_timeout;
        let runtime = self.runtime.clone();
        let mut results = futures::stream::iter(inspections.into_iter().map(|job| {
            let runtime = runtime.clone();
            async move {
                let inspect =
                    runtime::get_pod_status(&*runtime, &job.uid, &job.pod.name, &job.pod.namespace);
                let res = match tokio::time::timeout(timeout, inspect).await {
                    Ok(Ok(status)) => Ok(status),
                    Ok(Err(source)) => Err(PlegError::InspectPod {
                        uid: job.uid.clone(),
                        source,
                    }),
                    Err(_) => Err(PlegError::InspectTimeout {
                        uid: job.uid.clone(),
                        timeout,
                    }),
                };
                (job, res)
            }
        }))
        .buffer_unordered(self.config.max_concurrent_inspections.max(1));

        while let Some((job, res)) = results.next().await {
            match res {
                Ok(status) => {
                    let status = self.preserve_pod_ips(status);
                    self.cache.set(&job.uid, Ok(status), start);
                    state.reinspect.remove(&job.uid);
                    state.records.update(&job.uid);
                    report.pods_inspected += 1;
                    self.send_events(job.events, &mut report);
                }
                Err(err) => {
                    tracing::warn!(
                        pod_uid = %job.uid,
                        pod = %format_args!("{}/{}", job.pod.namespace, job.pod.name),
                        error = %err,
                        "PLEG: ignoring events for pod; it will be inspected again at the next relist"
                    );
                    // The record is not advanced, so the same diff is computed next time.
                    self.cache.set(&job.uid, Err(err.to_string()), start);
                    state.reinspect.insert(job.uid);
                    report.inspection_failures.push(err);
                }
            }
        }
        drop(results);

        self.cache.update_time(start);
        tracing::trace!(
            pods = report.pods,
            events = report.events_sent,
            elapsed = ?start.elapsed(),
            "PLEG: relist done"
        );
        Ok(report)
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

    fn send_events(&self, events: Vec<PodLifecycleEvent>, report: &mut RelistReport) {
        for event in events {
            if event.kind == PodLifecycleEventType::ContainerChanged {
                continue;
            }
            match self.events_tx.try_send(event) {
                Ok(()) => report.events_sent += 1,
                Err(TrySendError::Full(event)) => {
                    self.discarded.fetch_add(1, Ordering::Relaxed);
                    report.events_discarded += 1;
                    tracing::error!(
                        pod_uid = %event.pod_uid,
                        kind = ?event.kind,
                        "PLEG: event channel is full, discard this relist() cycle event"
                    );
                }
                Err(TrySendError::Closed(event)) => {
                    self.discarded.fetch_add(1, Ordering::Relaxed);
                    report.events_discarded += 1;
                    tracing::debug!(
                        pod_uid = %event.pod_uid,
                        kind = ?event.kind,
                        "PLEG: event receiver is gone; event dropped"
                    );
                }
            }
        }
    }
}

#[async_trait]
impl PodLifecycleEventGenerator for GenericPleg {
    fn take_events(&self) -> Option<mpsc::Receiver<PodLifecycleEvent>> {
        self.events_rx.lock().take()
    }

    fn cache(&self) -> PodCache {
        self.reader.clone()
    }

    fn healthy(&self) -> PlegHealth {
        let Some(last) = *self.last_relist.lock() else {
            return PlegHealth::Unhealthy("pleg has yet to be successful".to_string());
        };
        let elapsed = Instant::now().saturating_duration_since(last);
        if elapsed > self.config.relist_threshold {
            return PlegHealth::Unhealthy(format!(
                "pleg was last seen active {} ago; threshold is {}",
                format_go_duration(elapsed),
                format_go_duration(self.config.relist_threshold)
            ));
        }
        PlegHealth::Healthy
    }

    /// Relist until `shutdown` is cancelled; the next relist starts
    /// [`relist_period`](GenericPlegConfig::relist_period) after the previous one finished.
    /// A relist in progress is abandoned at shutdown.
    async fn run(&self, shutdown: CancellationToken) {
        tracing::debug!(period = ?self.config.relist_period, "PLEG: starting relist loop");
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                // Failures are logged inside relist.
                _ = self.relist() => {}
            }
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(self.config.relist_period) => {}
            }
        }
        tracing::debug!("PLEG: relist loop stopped");
    }
}
