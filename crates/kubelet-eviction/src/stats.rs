//! The [`StatsProvider`] seam: node signal observations and per-pod usage.

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use tokio::time::Instant;

use crate::error::EvictionError;
use crate::signal::Signal;

/// One observation of a signal: what is available out of what capacity, and when it was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignalObservation {
    /// Available amount (bytes, inodes or PIDs); may be negative when over-committed.
    pub available: i64,
    /// Capacity in the same unit.
    pub capacity: i64,
    /// When the figures were read.
    pub time: Instant,
}

/// Observations of every signal a provider can see.
pub type Observations = BTreeMap<Signal, SignalObservation>;

/// A pod the manager may evict, with its runtime container IDs (to look up usage).
#[derive(Debug, Clone)]
pub struct ActivePod {
    /// The pod.
    pub pod: Arc<Pod>,
    /// Container name and runtime container ID (without the `<runtime>://` prefix).
    pub containers: Vec<(String, String)>,
}

/// Usage of one container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerUsage {
    /// Container name.
    pub name: String,
    /// Memory working set, bytes.
    pub memory_working_set: Option<u64>,
    /// Number of processes.
    pub processes: Option<u64>,
    /// Writable layer (the runtime's `ContainerStats::writable_layer_bytes`) plus logs, bytes,
    /// as the kubelet counts a container's ephemeral storage (the process runtime has no
    /// writable layer: logs only).
    pub disk_bytes: Option<u64>,
}

/// Usage of one pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodUsage {
    /// Per container.
    pub containers: Vec<ContainerUsage>,
    /// The pod's volumes (every plugin's directory), bytes.
    pub volume_bytes: Option<u64>,
    /// Usage of each emptyDir volume by name, bytes (for `sizeLimit`).
    pub volumes: BTreeMap<String, u64>,
    /// Inodes used by the pod's volumes, logs and writable layers.
    pub inodes: Option<u64>,
    /// Processes of the whole pod, when known only for the pod (the stats service's
    /// `process_stats`); else the containers' sum counts.
    pub processes: Option<u64>,
}

impl PodUsage {
    /// Memory working set of the pod (sum over containers), if any container reported one.
    pub fn memory(&self) -> Option<u64> {
        sum(self.containers.iter().map(|c| c.memory_working_set))
    }

    /// Processes of the pod.
    pub fn processes(&self) -> Option<u64> {
        self.processes
            .or_else(|| sum(self.containers.iter().map(|c| c.processes)))
    }

    /// Ephemeral storage used by the pod (containers plus volumes).
    pub fn disk(&self) -> Option<u64> {
        let c = sum(self.containers.iter().map(|c| c.disk_bytes));
        match (c, self.volume_bytes) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        }
    }
}

fn sum(it: impl Iterator<Item = Option<u64>>) -> Option<u64> {
    let mut any = false;
    let mut total = 0u64;
    for v in it.flatten() {
        any = true;
        total = total.saturating_add(v);
    }
    any.then_some(total)
}

/// The cgroup whose memory usage drives `memory.available`, for kernel notifications.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemoryCgroup {
    /// A cgroup v1 memory cgroup directory (`memory.usage_in_bytes`, `cgroup.event_control`).
    V1(PathBuf),
    /// A cgroup v2 directory (`memory.events`).
    V2(PathBuf),
}

/// Where the eviction manager gets its numbers.
///
/// [`MachineStats`](crate::MachineStats) is the reference implementation reading the real
/// machine; implement this to feed the manager from elsewhere (cAdvisor, a CRI runtime's stats).
#[async_trait]
pub trait StatsProvider: Send + Sync + 'static {
    /// Observe every signal this provider can. Signals it cannot see are left out; thresholds
    /// on them are then ignored.
    async fn observe(&self) -> Result<Observations, EvictionError>;

    /// Observe with figures taken now, not cached ones: after node-level reclaim, to judge
    /// whether it was enough. The default is [`observe`](Self::observe).
    async fn observe_fresh(&self) -> Result<Observations, EvictionError> {
        self.observe().await
    }

    /// Observe only the memory signals. Called every fast-poll period, so it must be cheap.
    /// The default filters [`observe`](Self::observe).
    async fn observe_memory(&self) -> Result<Observations, EvictionError> {
        let mut o = self.observe().await?;
        o.retain(|s, _| s.is_memory());
        Ok(o)
    }

    /// Usage of `pods`, keyed by pod UID. Pods left out have no stats (they rank first, as in
    /// the kubelet).
    async fn pod_usage(&self, pods: &[ActivePod]) -> HashMap<String, PodUsage>;

    /// The cgroup behind `memory.available`, if any, for event-driven detection.
    fn memory_cgroup(&self) -> Option<MemoryCgroup> {
        None
    }
}

fn _assert_stats_dyn(_: &dyn StatsProvider) {}
