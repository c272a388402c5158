//! [`GenericPleg`]: the relist PLEG (`pkg/kubelet/pleg/generic.go`).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use kubelet_api::{ContainerRuntime, PlegEvents, PlegHealth, PodCache, PodLifecycleEventGenerator};
use prometheus_client::registry::Registry;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::core::{Core, PlegDiagnosis, SlowPod};
use crate::error::PlegError;
use crate::metrics::PlegMetrics;

/// The kubelet's relist period (`genericPlegRelistPeriod`): 1 s.
pub const GENERIC_PLEG_RELIST_PERIOD: Duration = Duration::from_secs(1);
/// The kubelet's health threshold (`genericPlegRelistThreshold`): 3 min without a successful
/// relist makes the PLEG unhealthy.
pub const GENERIC_PLEG_RELIST_THRESHOLD: Duration = Duration::from_secs(180);
/// Default bound on one pod's inspection within a relist.
pub const DEFAULT_INSPECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default number of changed pods inspected at once.
pub const DEFAULT_MAX_CONCURRENT_INSPECTIONS: usize = 8;
/// Default time a relist waits for its pods' inspections before finishing without the slow
/// ones.
pub const DEFAULT_INSPECTION_WAIT: Duration = Duration::from_secs(1);

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
    /// How long a relist waits for its pods' inspections (default 1 s). Inspections still
    /// running then go on in the background (up to [`inspect_timeout`](Self::inspect_timeout)):
    /// the relist finishes, raises the global timestamp and counts as a successful relist for
    /// health, the slow pods are logged and listed by
    /// [`slow_pods`](GenericPleg::slow_pods), and their events follow when their inspection
    /// ends. Their cache entries are held *pending* meanwhile, so no worker is handed a status
    /// older than their change.
    pub inspection_wait: Duration,
}

impl Default for GenericPlegConfig {
    fn default() -> Self {
        Self {
            relist_period: GENERIC_PLEG_RELIST_PERIOD,
            relist_threshold: GENERIC_PLEG_RELIST_THRESHOLD,
            inspect_timeout: DEFAULT_INSPECT_TIMEOUT,
            max_concurrent_inspections: DEFAULT_MAX_CONCURRENT_INSPECTIONS,
            inspection_wait: DEFAULT_INSPECTION_WAIT,
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

    /// Set [`inspection_wait`](Self::inspection_wait).
    pub fn with_inspection_wait(mut self, wait: Duration) -> Self {
        self.inspection_wait = wait;
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
    /// Pods inspected successfully (including inspections started by an earlier relist that
    /// finished during this one).
    pub pods_inspected: usize,
    /// Pods whose inspection failed or timed out; they are inspected again at the next relist.
    pub inspection_failures: Vec<PlegError>,
    /// Pods whose inspection was still running when the relist stopped waiting for it; their
    /// events follow when it finishes.
    pub slow_pods: Vec<String>,
}

/// The generic (relist) pod lifecycle event generator.
///
/// Every [`relist_period`](GenericPlegConfig::relist_period) after the previous relist finished,
/// it lists every sandbox and container ([`get_pods`](kubelet_api::runtime::get_pods)),
/// compares each container's and sandbox's state with the previous list, and for each pod that
/// changed (or whose previous inspection failed) fetches its full status
/// ([`get_pod_status`](kubelet_api::runtime::get_pod_status)) into the pod cache, stamped with
/// the time its inspection started, before sending its events. After each relist the cache's
/// global timestamp is raised, so [`PodCache::get_newer_than`] returns for unchanged pods too.
///
/// Events: a container or sandbox becoming running gives `ContainerStarted`, exited (or not
/// ready) gives `ContainerDied`, disappearing gives `ContainerRemoved` (preceded by
/// `ContainerDied` if it was not already exited). `ContainerChanged` (entering the runtime's
/// `Created` or `Unknown` state) triggers an inspection but is never sent. Events go to a
/// channel of [`PLEG_CHANNEL_CAPACITY`](kubelet_api::PLEG_CHANNEL_CAPACITY) without blocking; when it
/// is full they are dropped and counted ([`discarded_events`](Self::discarded_events)).
///
/// No pod can stall the relist (the kubelet's "PLEG is not healthy" failure): changed pods are
/// inspected concurrently (up to
/// [`max_concurrent_inspections`](GenericPlegConfig::max_concurrent_inspections)), each bounded
/// by [`inspect_timeout`](GenericPlegConfig::inspect_timeout); each pod's events are sent as
/// soon as its own inspection finishes; and a relist waits at most
/// [`inspection_wait`](GenericPlegConfig::inspection_wait) for them, leaving slower ones to finish
/// in the background. Health ([`healthy`](PodLifecycleEventGenerator::healthy)) therefore turns
/// bad only when listing itself fails or hangs (the runtime is unreachable), never because one
/// pod is slow; [`diagnose`](Self::diagnose) tells the two apart.
pub struct GenericPleg {
    core: Core,
}

impl std::fmt::Debug for GenericPleg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GenericPleg")
            .field("core", &self.core)
            .finish_non_exhaustive()
    }
}

impl GenericPleg {
    /// A PLEG over `runtime` with a new, empty pod cache, and the receiver of its events.
    /// Nothing happens until [`run`](PodLifecycleEventGenerator::run) or
    /// [`relist`](Self::relist) is called.
    pub fn new(
        runtime: Arc<dyn ContainerRuntime>,
        config: GenericPlegConfig,
    ) -> (Self, PlegEvents) {
        let (core, events) = Core::new(runtime, config);
        (Self { core }, events)
    }

    /// The settings this PLEG runs with.
    pub fn config(&self) -> &GenericPlegConfig {
        &self.core.config
    }

    /// Number of events dropped so far because the channel was full (or its receiver gone); the
    /// kubelet's `kubelet_pleg_discard_events`.
    pub fn discarded_events(&self) -> u64 {
        self.core.metrics.discarded_events()
    }

    /// Start time of the last relist whose listing succeeded, if any.
    pub fn last_relist(&self) -> Option<Instant> {
        self.core.last_relist()
    }

    /// The metric handles (`kubelet_pleg_*`).
    pub fn metrics(&self) -> &PlegMetrics {
        &self.core.metrics
    }

    /// Register the PLEG's metrics (`kubelet_pleg_relist_duration_seconds`,
    /// `kubelet_pleg_relist_interval_seconds`, `kubelet_pleg_last_seen_seconds`,
    /// `kubelet_pleg_discard_events`, `kubelet_pleg_inspection_failures`) in `registry`.
    pub fn register_metrics(&self, registry: &mut Registry) {
        self.core.metrics.register(registry);
    }

    /// Pods whose inspection outlived its relist and is still running.
    pub fn slow_pods(&self) -> Vec<SlowPod> {
        self.core.slow_pods()
    }

    /// Health with its causes: the runtime's listing error, if the last relist failed, apart
    /// from the pods that are merely slow.
    pub fn diagnose(&self) -> PlegDiagnosis {
        self.core.diagnose()
    }

    /// Relist now and wait for the changed pods' inspections up to
    /// [`inspection_wait`](GenericPlegConfig::inspection_wait). Serialised with the periodic
    /// relists of [`run`](PodLifecycleEventGenerator::run) (while `run` is active, this waits
    /// for its current relist or pause to end).
    ///
    /// Returns [`PlegError::ListPods`] (after logging it) when listing fails; nothing else is
    /// changed then. Per-pod inspection failures are logged, cached as the pod's error, and
    /// returned in the report; those pods are inspected again at the next relist.
    pub async fn relist(&self) -> Result<RelistReport, PlegError> {
        let mut done = self.core.done_rx.lock().await;
        self.core.relist(&mut done).await
    }
}

#[async_trait]
impl PodLifecycleEventGenerator for GenericPleg {
    fn register_metrics(&self, registry: &mut Registry) {
        self.core.metrics.register(registry);
    }

    fn cache(&self) -> PodCache {
        self.core.reader.clone()
    }

    fn healthy(&self) -> PlegHealth {
        self.core.healthy()
    }

    /// Relist until `shutdown` is cancelled; the next relist starts
    /// [`relist_period`](GenericPlegConfig::relist_period) after the previous one finished.
    /// Inspections that outlive their relist are taken in as they finish, between relists.
    /// A relist in progress is abandoned at shutdown.
    async fn run(&self, shutdown: CancellationToken) {
        tracing::debug!(period = ?self.core.config.relist_period, "PLEG: starting relist loop");
        loop {
            // The completions receiver doubles as the relist lock; it is released between the
            // relist and the pause (and at the pause's end), so a direct `relist` call gets in.
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                // Failures are logged inside relist.
                _ = async {
                    let mut done = self.core.done_rx.lock().await;
                    self.core.relist(&mut done).await
                } => {}
            }
            let next = Instant::now() + self.core.config.relist_period;
            let pause = async {
                let mut done = self.core.done_rx.lock().await;
                loop {
                    tokio::select! {
                        biased;
                        _ = tokio::time::sleep_until(next) => break,
                        Some(d) = done.recv() => {
                            self.core.apply(d, &mut RelistReport::default());
                        }
                    }
                }
            };
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                _ = pause => {}
            }
        }
        tracing::debug!("PLEG: relist loop stopped");
    }
}
