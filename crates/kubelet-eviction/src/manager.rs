//! [`EvictionManager`]: the kubelet's `synchronize` loop plus fast detection.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use kubelet_api::{
    AgentHandle, EventRecorder, EventType, InvolvedObject, KillPodOptions, NodeReclaimer,
    PodAdmitHandler,
};
use parking_lot::RwLock;
use prometheus_client::registry::Registry;
use tokio::sync::broadcast;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::admission::EvictionAdmitHandler;
use crate::config::{EvictionConfig, Threshold};
use crate::decide::{
    EvictionState, Round, eviction_grace_period, eviction_message, has_local_storage_limits,
    has_node_reclaim, is_critical, local_storage_violation, rank, reclaimable_threshold,
    sort_by_eviction_priority, thresholds_met,
};
use crate::error::EvictionError;
use crate::metrics::EvictionMetrics;
use crate::notify::KernelWakers;
use crate::signal::{NodeCondition, Signal};
use crate::stats::{ActivePod, MemoryCgroup, Observations, PodUsage, StatsProvider};

/// The pods the manager may evict and the way to kill them. Implemented for the agent's
/// [`AgentHandle`] (`PluginContext::handle`); implement it to use the manager without the
/// engine.
#[async_trait]
pub trait PodControl: Send + Sync + 'static {
    /// Pods admitted and not terminated, with their runtime container IDs.
    async fn active_pods(&self) -> Vec<ActivePod>;
    /// Kill `pod` with `options` and return once it has terminated.
    async fn kill_pod(&self, pod: &Pod, options: KillPodOptions) -> Result<(), EvictionError>;
    /// A count that moves whenever [`active_pods`](Self::active_pods) may answer differently
    /// (the agent's [`StatusReader::changes`](kubelet_api::StatusReader::changes)): while it
    /// stands still, a round that found no pod with a local-storage limit does not ask again.
    /// `None` (the default): unknown, asked every round.
    fn changes(&self) -> Option<u64> {
        None
    }
}

fn _assert_control_dyn(_: &dyn PodControl) {}

#[async_trait]
impl PodControl for Arc<dyn AgentHandle> {
    async fn active_pods(&self) -> Vec<ActivePod> {
        self.statuses()
            .list()
            .into_iter()
            .filter(|p| {
                !matches!(
                    p.status.phase.as_deref(),
                    Some("Failed") | Some("Succeeded")
                )
            })
            .map(|p| {
                let containers = p
                    .status
                    .container_statuses
                    .iter()
                    .flatten()
                    .chain(p.status.init_container_statuses.iter().flatten())
                    .filter_map(|cs| {
                        let id = cs.container_id.as_deref()?;
                        Some((
                            cs.name.clone(),
                            kubelet_api::runtime::strip_container_id(id).to_string(),
                        ))
                    })
                    .collect();
                ActivePod {
                    pod: p.pod.clone(),
                    containers,
                }
            })
            .collect()
    }

    async fn kill_pod(&self, pod: &Pod, options: KillPodOptions) -> Result<(), EvictionError> {
        let uid = kubelet_api::pod::uid(pod);
        AgentHandle::kill_pod(self.as_ref(), uid, options)
            .await
            .map_err(|_| EvictionError::KillPod {
                uid: uid.to_string(),
            })
    }

    fn changes(&self) -> Option<u64> {
        Some(self.statuses().changes())
    }
}

/// How the node's filesystems are laid out, which decides what node-level reclaim runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FsLayout {
    /// One filesystem for everything: nodefs and imagefs pressure → containers, then images.
    #[default]
    Single,
    /// A dedicated image filesystem: nodefs → nothing; imagefs/containerfs → containers, images.
    SeparateImageFs,
    /// A split container filesystem: imagefs → images; nodefs/containerfs → containers.
    SplitContainerFs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReclaimStep {
    Containers,
    Images,
}

fn reclaim_steps(layout: FsLayout, signal: Signal) -> Vec<ReclaimStep> {
    use ReclaimStep::*;
    if !has_node_reclaim(signal) {
        return vec![];
    }
    let fs = match signal {
        Signal::NodeFsAvailable | Signal::NodeFsInodesFree => "node",
        Signal::ImageFsAvailable | Signal::ImageFsInodesFree => "image",
        _ => "container",
    };
    match (layout, fs) {
        (FsLayout::Single, _) => vec![Containers, Images],
        (FsLayout::SeparateImageFs, "node") => vec![],
        (FsLayout::SeparateImageFs, _) => vec![Containers, Images],
        (FsLayout::SplitContainerFs, "image") => vec![Images],
        (FsLayout::SplitContainerFs, _) => vec![Containers],
    }
}

/// Something the manager did, for observers (benchmarks, logs, node status writers).
#[derive(Debug, Clone, PartialEq)]
pub enum ManagerEvent {
    /// A memory threshold was found met by the fast check (`source`: `poll` or the kernel
    /// notification that woke it).
    Crossed {
        /// The signal.
        signal: Signal,
        /// Available at detection.
        available: i64,
        /// When it was detected.
        at: Instant,
        /// What woke the check.
        source: &'static str,
    },
    /// A full synchronisation ran.
    Synchronized {
        /// The node conditions after it.
        conditions: BTreeSet<NodeCondition>,
        /// Thresholds met.
        met: Vec<Threshold>,
    },
    /// A pod was evicted.
    Evicted(Eviction),
}

/// One eviction.
#[derive(Debug, Clone, PartialEq)]
pub struct Eviction {
    /// Pod UID.
    pub uid: String,
    /// `namespace/name`.
    pub pod: String,
    /// The signal that drove it, as counted in `kubelet_evictions` (`memory.available`, …, or a
    /// local-storage pseudo-signal such as `emptydirfs.limit`).
    pub signal: String,
    /// The status message.
    pub message: String,
    /// The annotations of the `Evicted` event (`offending_containers`,
    /// `offending_containers_usage`, `starved_resource`); empty for local-storage evictions and
    /// pods without usage statistics, as in the kubelet.
    pub annotations: BTreeMap<String, String>,
    /// The grace period override used.
    pub grace_period_seconds: i64,
    /// When the kill was requested.
    pub at: Instant,
}

/// What one synchronisation did.
#[derive(Debug, Clone, PartialEq)]
pub struct SyncResult {
    /// The decision round.
    pub round: Round,
    /// Node-level reclaim ran and resolved the pressure.
    pub reclaimed: bool,
    /// The pod evicted for a threshold, if any.
    pub evicted: Option<Eviction>,
    /// Pods evicted for exceeding their local ephemeral-storage limits (checked first; when any
    /// is evicted the round ends there).
    pub local_storage_evictions: Vec<Eviction>,
}

/// The eviction manager: watches signals, keeps node conditions, evicts one pod per round, and
/// serves admission. Drive it with [`run`](Self::run).
pub struct EvictionManager {
    config: EvictionConfig,
    stats: Arc<dyn StatsProvider>,
    pods: Arc<dyn PodControl>,
    reclaimer: Option<(Arc<dyn NodeReclaimer>, FsLayout)>,
    recorder: Option<EventRecorder>,
    node_name: String,
    conditions: Arc<RwLock<BTreeSet<NodeCondition>>>,
    metrics: EvictionMetrics,
    state: EvictionState,
    events: broadcast::Sender<ManagerEvent>,
    proc_root: std::path::PathBuf,
    /// Pods evicted in the last [`POD_CLEANUP_TIMEOUT`], never chosen again meanwhile (the
    /// kubelet waits that long for an evicted pod to be cleaned up).
    recently_evicted: parking_lot::Mutex<std::collections::HashMap<String, Instant>>,
    /// [`PodControl::changes`] when a round last found no active pod with a local-storage
    /// limit: until it moves, the next rounds do not list the pods again.
    no_local_limits_at: Option<u64>,
}

/// How long an evicted pod is not considered again (`podCleanupTimeout`).
pub const POD_CLEANUP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

impl std::fmt::Debug for EvictionManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EvictionManager")
            .field("config", &self.config)
            .field("node_name", &self.node_name)
            .finish_non_exhaustive()
    }
}

impl EvictionManager {
    /// A manager with `config`, reading `stats` and killing through `pods`.
    pub fn new(
        config: EvictionConfig,
        stats: Arc<dyn StatsProvider>,
        pods: Arc<dyn PodControl>,
    ) -> Self {
        let (events, _) = broadcast::channel(256);
        Self {
            config,
            stats,
            pods,
            reclaimer: None,
            recorder: None,
            node_name: String::new(),
            conditions: Arc::default(),
            metrics: EvictionMetrics::default(),
            state: EvictionState::new(),
            events,
            proc_root: "/proc".into(),
            recently_evicted: Default::default(),
            no_local_limits_at: None,
        }
    }

    /// Run `reclaimer` first for disk pressure, according to `layout`.
    pub fn with_reclaimer(mut self, reclaimer: Arc<dyn NodeReclaimer>, layout: FsLayout) -> Self {
        self.reclaimer = Some((reclaimer, layout));
        self
    }

    /// Share conditions, metrics and the event channel with an [`EvictionPlugin`](crate::EvictionPlugin),
    /// which hands them out before the manager exists.
    pub(crate) fn with_shared(
        mut self,
        conditions: Arc<RwLock<BTreeSet<NodeCondition>>>,
        metrics: EvictionMetrics,
        events: broadcast::Sender<ManagerEvent>,
    ) -> Self {
        self.conditions = conditions;
        self.metrics = metrics;
        self.events = events;
        self
    }

    /// Record the kubelet's events (`EvictionThresholdMet` on the node, `Evicted` on pods).
    pub fn with_recorder(mut self, recorder: EventRecorder, node_name: impl Into<String>) -> Self {
        self.recorder = Some(recorder);
        self.node_name = node_name.into();
        self
    }

    /// Where `/proc` is (for the PSI trigger); default `/proc`.
    pub fn with_proc_root(mut self, proc_root: impl Into<std::path::PathBuf>) -> Self {
        self.proc_root = proc_root.into();
        self
    }

    /// The admission handler to give the engine (`KubeletBuilder::admit_handler`).
    pub fn admit_handler(&self) -> Arc<dyn PodAdmitHandler> {
        Arc::new(EvictionAdmitHandler {
            conditions: self.conditions.clone(),
            static_pods_are_critical: self.config.static_pods_are_critical,
        })
    }

    /// The node's current pressure conditions (shared with admission).
    pub fn node_conditions(&self) -> NodeConditions {
        NodeConditions(self.conditions.clone())
    }

    /// Register `kubelet_evictions` and `kubelet_eviction_stats_age_seconds`.
    pub fn register_metrics(&self, registry: &mut Registry) {
        self.metrics.register(registry);
    }

    /// The metrics (for embedders reading them directly).
    pub fn metrics(&self) -> &EvictionMetrics {
        &self.metrics
    }

    /// Subscribe to what the manager does.
    pub fn subscribe(&self) -> broadcast::Receiver<ManagerEvent> {
        self.events.subscribe()
    }

    /// The configuration.
    pub fn config(&self) -> &EvictionConfig {
        &self.config
    }

    /// One `synchronize` round: observe, update conditions, reclaim or evict at most one pod.
    pub async fn synchronize(&mut self) -> Result<SyncResult, EvictionError> {
        let observations = self.stats.observe().await?;
        let now = Instant::now();
        let round = self.state.observe(&self.config, &observations, now);
        *self.conditions.write() = round.conditions.clone();
        let _ = self.events.send(ManagerEvent::Synchronized {
            conditions: round.conditions.clone(),
            met: round.met.clone(),
        });
        let mut result = SyncResult {
            round: round.clone(),
            reclaimed: false,
            evicted: None,
            local_storage_evictions: Vec::new(),
        };
        if self.config.local_storage_capacity_isolation {
            result.local_storage_evictions = self.local_storage_eviction().await;
            if !result.local_storage_evictions.is_empty() {
                return Ok(result);
            }
        }
        let mut thresholds = round.to_reclaim.clone();
        if thresholds.is_empty() {
            return Ok(result);
        }
        sort_by_eviction_priority(&mut thresholds);
        let Some(threshold) = reclaimable_threshold(&thresholds).cloned() else {
            return Ok(result);
        };
        let resource = threshold.signal.resource();
        tracing::warn!(signal = %threshold.signal, threshold = %threshold, "eviction threshold met, attempting to reclaim {resource}");
        if let Some(r) = &self.recorder {
            r.warning(
                InvolvedObject::node(&self.node_name),
                "EvictionThresholdMet",
                format!("Attempting to reclaim {resource}"),
            );
        }
        if self.reclaim_node_level(&threshold, &thresholds).await {
            result.reclaimed = true;
            return Ok(result);
        }
        result.evicted = self.evict_one(&threshold, &thresholds, &observations).await;
        Ok(result)
    }

    /// Node-level reclaim for `threshold`; true when afterwards no threshold of the reclaimed
    /// set is met any more (minimum reclaim included).
    async fn reclaim_node_level(&self, threshold: &Threshold, thresholds: &[Threshold]) -> bool {
        let Some((reclaimer, layout)) = &self.reclaimer else {
            return false;
        };
        let steps = reclaim_steps(*layout, threshold.signal);
        if steps.is_empty() {
            return false;
        }
        for step in steps {
            let r = match step {
                ReclaimStep::Containers => reclaimer.delete_unused_containers().await,
                ReclaimStep::Images => reclaimer.delete_unused_images().await,
            };
            if let Err(e) = r {
                tracing::warn!(error = %kubelet_api::chain(&e), step = ?step, "node-level reclaim failed");
            }
        }
        match self.stats.observe_fresh().await {
            Ok(obs) => {
                let still = thresholds_met(thresholds, &obs, true);
                if still.is_empty() {
                    tracing::info!(signal = %threshold.signal, "node-level reclaim resolved the pressure; no pod evicted");
                    return true;
                }
                false
            }
            Err(e) => {
                tracing::warn!(error = %kubelet_api::chain(&e), "observing after node-level reclaim failed");
                false
            }
        }
    }

    async fn evict_one(
        &mut self,
        threshold: &Threshold,
        thresholds: &[Threshold],
        observations: &Observations,
    ) -> Option<Eviction> {
        let resource = threshold.signal.resource();
        let active = self.pods.active_pods().await;
        if active.is_empty() {
            tracing::info!("eviction threshold met but there are no pods to evict");
            return None;
        }
        let usage = self.stats.pod_usage(&active).await;
        let mut ranked: Vec<(&ActivePod, Option<&PodUsage>)> = active
            .iter()
            .map(|p| (p, usage.get(kubelet_api::pod::uid(&p.pod))))
            .collect();
        rank(resource, &mut ranked, |e| e.0.pod.as_ref(), |e| e.1);
        for (p, u) in ranked {
            let pod = p.pod.as_ref();
            if self.was_recently_evicted(pod) {
                continue;
            }
            if is_critical(pod, self.config.static_pods_are_critical) {
                tracing::info!(pod = %kubelet_api::pod::full_name(pod), "cannot evict a critical pod");
                continue;
            }
            let grace =
                eviction_grace_period(threshold, pod, self.config.max_pod_grace_period_seconds);
            let (message, annotations) =
                eviction_message(resource, pod, u, thresholds, observations);
            let age = observations.get(&threshold.signal).map_or(0.0, |o| {
                Instant::now()
                    .saturating_duration_since(o.time)
                    .as_secs_f64()
            });
            let eviction = self
                .evict_pod(
                    pod,
                    threshold.signal.as_str(),
                    grace,
                    message,
                    annotations,
                    age,
                )
                .await;
            return Some(eviction);
        }
        tracing::info!("eviction threshold met but every pod is critical");
        None
    }

    fn was_recently_evicted(&self, pod: &Pod) -> bool {
        let now = Instant::now();
        let mut m = self.recently_evicted.lock();
        m.retain(|_, at| now.saturating_duration_since(*at) < POD_CLEANUP_TIMEOUT);
        m.contains_key(kubelet_api::pod::uid(pod))
    }

    /// Kill `pod` as an eviction: event, metric, `DisruptionTarget`, `Failed`/`Evicted`.
    async fn evict_pod(
        &self,
        pod: &Pod,
        signal: &str,
        grace: i64,
        message: String,
        annotations: BTreeMap<String, String>,
        stats_age: f64,
    ) -> Eviction {
        self.recently_evicted
            .lock()
            .insert(kubelet_api::pod::uid(pod).to_string(), Instant::now());
        let eviction = Eviction {
            uid: kubelet_api::pod::uid(pod).to_string(),
            pod: format!(
                "{}/{}",
                kubelet_api::pod::namespace(pod),
                kubelet_api::pod::name(pod)
            ),
            signal: signal.to_string(),
            message: message.clone(),
            annotations,
            grace_period_seconds: grace,
            at: Instant::now(),
        };
        tracing::warn!(pod = %eviction.pod, signal, grace, %message, "evicting pod");
        if let Some(r) = &self.recorder {
            r.record_with_annotations(
                InvolvedObject::pod(pod),
                EventType::Warning,
                "Evicted",
                message.clone(),
                eviction.annotations.clone(),
            );
        }
        let _ = self.events.send(ManagerEvent::Evicted(eviction.clone()));
        self.metrics.record(signal, stats_age);
        let options = KillPodOptions {
            grace_period_override: Some(grace),
            evict: true,
            reason: "Evicted".into(),
            condition: Some(kubelet_api::pod::disruption_condition(&message)),
            message,
        };
        if let Err(e) = self.pods.kill_pod(pod, options).await {
            tracing::error!(error = %kubelet_api::chain(&e), pod = %eviction.pod, "eviction failed");
        }
        eviction
    }

    /// Evict every non-critical pod over one of its local ephemeral-storage limits
    /// (`localStorageEviction`), with the 1 s grace period of hard evictions.
    async fn local_storage_eviction(&mut self) -> Vec<Eviction> {
        // Only pods with a local-storage limit can exceed one: the others' disk usage (a walk
        // of their volumes and logs) is not measured every round, and while no pod changed
        // since a round that found none with a limit, the pods are not listed again.
        let changes = self.pods.changes();
        if changes.is_some() && changes == self.no_local_limits_at {
            return Vec::new();
        }
        let mut active = self.pods.active_pods().await;
        active.retain(|p| has_local_storage_limits(&p.pod));
        if active.is_empty() {
            self.no_local_limits_at = changes;
            return Vec::new();
        }
        self.no_local_limits_at = None;
        let usage = self.stats.pod_usage(&active).await;
        let mut out = Vec::new();
        for p in &active {
            if self.was_recently_evicted(&p.pod) {
                continue;
            }
            let Some(u) = usage.get(kubelet_api::pod::uid(&p.pod)) else {
                continue;
            };
            let Some(v) = local_storage_violation(&p.pod, u) else {
                continue;
            };
            if is_critical(&p.pod, self.config.static_pods_are_critical) {
                tracing::info!(pod = %kubelet_api::pod::full_name(&p.pod), "cannot evict a critical pod");
                continue;
            }
            out.push(
                self.evict_pod(
                    &p.pod,
                    v.signal,
                    crate::config::IMMEDIATE_EVICTION_GRACE_PERIOD_SECONDS,
                    v.message,
                    BTreeMap::new(),
                    0.0,
                )
                .await,
            );
        }
        out
    }

    fn memory_thresholds(&self) -> Vec<Threshold> {
        self.config
            .thresholds
            .iter()
            .filter(|t| t.signal.is_memory())
            .cloned()
            .collect()
    }

    /// The `memory.usage_in_bytes` value at which the most sensitive `memory.available`
    /// threshold is crossed: `capacity − threshold + inactive_file` (the kubelet's memcg
    /// notifier), for the v1 eventfd.
    async fn memcg_threshold_usage(&self) -> Option<u64> {
        let obs = self.stats.observe_memory().await.ok()?;
        let o = obs.get(&Signal::MemoryAvailable)?;
        let quantity = self
            .config
            .thresholds
            .iter()
            .filter(|t| t.signal == Signal::MemoryAvailable)
            .map(|t| t.value.quantity(o.capacity))
            .max()?;
        let inactive = self.inactive_file().unwrap_or(0);
        u64::try_from(o.capacity - quantity + inactive).ok()
    }

    fn inactive_file(&self) -> Option<i64> {
        let (dir, key) = match self.stats.memory_cgroup()? {
            MemoryCgroup::V1(d) => (d, "total_inactive_file"),
            MemoryCgroup::V2(d) => (d, "inactive_file"),
        };
        let text = std::fs::read_to_string(dir.join("memory.stat")).ok()?;
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == key).then(|| v.trim().parse().ok()).flatten()
        })
    }

    /// Run until `shutdown`: a full synchronisation every `monitoring_interval` (and when a
    /// soft threshold's grace period ends), immediately again after an eviction, and as soon as
    /// the fast check (a poll every `fast_poll_interval`, woken early by kernel notifications)
    /// sees a memory threshold crossed.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let memory_thresholds = self.memory_thresholds();
        let cgroup = self.stats.memory_cgroup();
        let fast = self
            .config
            .fast_poll_interval
            .filter(|_| !memory_thresholds.is_empty());
        let kernel = fast.is_some() && self.config.kernel_notifications;
        let mut wakers = if kernel {
            KernelWakers::new(cgroup.as_ref(), &self.proc_root)
        } else {
            KernelWakers::default()
        };
        loop {
            if shutdown.is_cancelled() {
                return;
            }
            let result = match self.synchronize().await {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::warn!(error = %kubelet_api::chain(&e), "eviction manager: synchronize failed");
                    None
                }
            };
            if result
                .as_ref()
                .is_some_and(|r| r.evicted.is_some() || !r.local_storage_evictions.is_empty())
            {
                continue;
            }
            let now = Instant::now();
            let mut deadline = now + self.config.monitoring_interval;
            if let Some(d) = result.as_ref().and_then(|r| r.round.next_grace_deadline) {
                deadline = deadline.min(d.max(now));
            }
            let mut was_met = result
                .as_ref()
                .is_some_and(|r| r.round.met.iter().any(|t| t.signal.is_memory()));
            if kernel && let Some(usage) = self.memcg_threshold_usage().await {
                wakers.arm_threshold(cgroup.as_ref(), usage);
            }
            let Some(period) = fast else {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep_until(deadline) => {}
                }
                continue;
            };
            // Fast path: cheap memory checks until a crossing or the next full round, every
            // `period` while memory is near a threshold and the kernel does not watch it,
            // else every `relaxed_poll_interval`.
            let relaxed = self.config.relaxed_poll_interval.max(period);
            // Whether the kernel watches every memory threshold: the v1 eventfd is armed
            // for `memory.available`, and no other memory signal has a threshold.
            let watched = wakers.memcg.is_some()
                && memory_thresholds
                    .iter()
                    .all(|t| t.signal == Signal::MemoryAvailable);
            let mut next_poll = Instant::now() + period;
            loop {
                let source = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep_until(deadline) => break,
                    _ = tokio::time::sleep_until(next_poll) => "poll",
                    s = wakers.wait() => s,
                };
                next_poll = Instant::now() + period;
                let obs = match self.stats.observe_memory().await {
                    Ok(o) => o,
                    Err(e) => {
                        tracing::debug!(error = %kubelet_api::chain(&e), "fast memory check failed");
                        continue;
                    }
                };
                let met = thresholds_met(&memory_thresholds, &obs, false);
                if met.is_empty() {
                    was_met = false;
                    let far = far_from(&memory_thresholds, &obs);
                    match poll_pace(watched, wakers.memcg.is_some(), far) {
                        PollPace::Fast => {}
                        PollPace::Relaxed => next_poll = Instant::now() + relaxed,
                        // After the full round, which comes first.
                        PollPace::Off => next_poll = deadline + relaxed,
                    }
                    continue;
                }
                if was_met {
                    continue;
                }
                let at = Instant::now();
                for t in &met {
                    let available = obs.get(&t.signal).map_or(0, |o| o.available);
                    tracing::info!(signal = %t.signal, available, source, "memory threshold crossed");
                    let _ = self.events.send(ManagerEvent::Crossed {
                        signal: t.signal,
                        available,
                        at,
                        source,
                    });
                }
                break;
            }
        }
    }
}

/// How often the fast check polls while no memory threshold is met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PollPace {
    /// Every `fast_poll_interval`: memory is near a threshold nobody else watches.
    Fast,
    /// Every `relaxed_poll_interval`.
    Relaxed,
    /// Not until the next full round: the kernel signals the crossing of every memory
    /// threshold, and memory is far from them (the kubelet's own model: the memcg
    /// notification and the 10 s synchronisation, no polls).
    Off,
}

/// The pace of the fast check: `watched`, the kernel signals the crossing of every memory
/// threshold; `armed`, it signals at least one; `far`, available memory is far from them all.
fn poll_pace(watched: bool, armed: bool, far: bool) -> PollPace {
    match (watched && far, armed || far) {
        (true, _) => PollPace::Off,
        (false, true) => PollPace::Relaxed,
        (false, false) => PollPace::Fast,
    }
}

/// Whether available memory is far from every memory threshold: above it by more than the
/// threshold itself and by more than a tenth of capacity (so a poll a second is enough).
fn far_from(thresholds: &[Threshold], obs: &Observations) -> bool {
    thresholds.iter().all(|t| {
        obs.get(&t.signal).is_some_and(|o| {
            let q = t.value.quantity(o.capacity);
            o.available - q > q.max(o.capacity / 10)
        })
    })
}

/// A cloneable reader of the node's pressure conditions, for node status writers.
#[derive(Debug, Clone)]
pub struct NodeConditions(pub(crate) Arc<RwLock<BTreeSet<NodeCondition>>>);

impl NodeConditions {
    /// Conditions currently true.
    pub fn active(&self) -> BTreeSet<NodeCondition> {
        self.0.read().clone()
    }

    /// Every pressure condition with its status, reason and message as the kubelet reports
    /// them in the node status.
    pub fn report(&self) -> Vec<k8s_openapi::api::core::v1::NodeCondition> {
        let active = self.active();
        NodeCondition::ALL
            .iter()
            .map(|c| {
                let on = active.contains(c);
                k8s_openapi::api::core::v1::NodeCondition {
                    type_: c.as_str().to_string(),
                    status: if on { "True" } else { "False" }.to_string(),
                    reason: Some(c.reason(on).to_string()),
                    message: Some(c.message(on).to_string()),
                    ..Default::default()
                }
            })
            .collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_fast_check_stops_polling_only_where_the_kernel_watches_every_threshold() {
        use PollPace::*;
        // (watched, armed, far)
        assert_eq!(poll_pace(true, true, true), Off);
        // Near a threshold the kernel watches: a poll a second as a safety net.
        assert_eq!(poll_pace(true, true, false), Relaxed);
        // Another memory threshold the kernel does not watch.
        assert_eq!(poll_pace(false, true, true), Relaxed);
        assert_eq!(poll_pace(false, true, false), Relaxed);
        // No kernel notification.
        assert_eq!(poll_pace(false, false, true), Relaxed);
        assert_eq!(poll_pace(false, false, false), Fast);
    }

    #[test]
    fn reclaim_depends_on_the_filesystem_layout() {
        use ReclaimStep::*;
        assert_eq!(
            reclaim_steps(FsLayout::Single, Signal::NodeFsAvailable),
            vec![Containers, Images]
        );
        assert_eq!(
            reclaim_steps(FsLayout::Single, Signal::ImageFsInodesFree),
            vec![Containers, Images]
        );
        assert!(reclaim_steps(FsLayout::SeparateImageFs, Signal::NodeFsAvailable).is_empty());
        assert_eq!(
            reclaim_steps(FsLayout::SeparateImageFs, Signal::ImageFsAvailable),
            vec![Containers, Images]
        );
        assert_eq!(
            reclaim_steps(FsLayout::SplitContainerFs, Signal::ImageFsAvailable),
            vec![Images]
        );
        assert_eq!(
            reclaim_steps(FsLayout::SplitContainerFs, Signal::NodeFsAvailable),
            vec![Containers]
        );
        assert!(reclaim_steps(FsLayout::Single, Signal::MemoryAvailable).is_empty());
        assert!(reclaim_steps(FsLayout::Single, Signal::PidAvailable).is_empty());
    }
}
