//! [`ServiceStats`]: eviction's signals and ranking from the agent's stats service
//! (`kubelet-stats`), with the machine's memory read directly for the fast path.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use kubelet_api::stats::{FsStats, StatsService, Summary};
use tokio::time::Instant;

use crate::error::EvictionError;
use crate::machine::MachineStats;
use crate::signal::Signal;
use crate::stats::{
    ActivePod, ContainerUsage, MemoryCgroup, Observations, PodUsage, SignalObservation,
    StatsProvider,
};

/// How old the stats service's latest sample may be before eviction asks for a new one (two
/// of the kubelet's 10 s housekeeping periods).
pub const MAX_SAMPLE_AGE: Duration = Duration::from_secs(20);

/// A [`StatsProvider`] over the agent's [`StatsService`]: filesystem and PID signals come from
/// the service's latest sample (refreshed when older than [`MAX_SAMPLE_AGE`]) and the pods'
/// usage from [`StatsService::summary_with_pods`], as the kubelet's eviction manager reads its
/// summary provider; memory
/// signals and the memory cgroup for kernel notifications come from [`MachineStats`], so the
/// sub-second memory path reads one cgroup file and never waits for a collection.
#[derive(Clone)]
pub struct ServiceStats {
    service: Arc<dyn StatsService>,
    machine: MachineStats,
}

impl std::fmt::Debug for ServiceStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceStats")
            .field("machine", &self.machine)
            .finish_non_exhaustive()
    }
}

impl ServiceStats {
    /// Signals from `service`, memory from `machine`.
    pub fn new(service: Arc<dyn StatsService>, machine: MachineStats) -> Self {
        Self { service, machine }
    }

    async fn sample(&self) -> Arc<Summary> {
        let latest = self.service.summary();
        let taken = latest
            .node
            .fs
            .as_ref()
            .map(|f| f.time)
            .or_else(|| latest.node.memory.as_ref().map(|m| m.time));
        let fresh = taken.is_some_and(|t| {
            jiff::Timestamp::now().duration_since(t) < MAX_SAMPLE_AGE.try_into().unwrap_or_default()
        });
        if fresh {
            latest
        } else {
            self.service.refresh().await
        }
    }
}

fn fs_signals(
    fs: Option<&FsStats>,
    bytes: Signal,
    inodes: Signal,
    now: Instant,
    out: &mut Observations,
) {
    let Some(fs) = fs else {
        return;
    };
    if let (Some(available), Some(capacity)) = (fs.available_bytes, fs.capacity_bytes) {
        out.insert(
            bytes,
            SignalObservation {
                available: available as i64,
                capacity: capacity as i64,
                time: now,
            },
        );
    }
    if let (Some(free), Some(total)) = (fs.inodes_free, fs.inodes)
        && total > 0
    {
        out.insert(
            inodes,
            SignalObservation {
                available: free as i64,
                capacity: total as i64,
                time: now,
            },
        );
    }
}

#[async_trait]
impl StatsProvider for ServiceStats {
    async fn observe(&self) -> Result<Observations, EvictionError> {
        let summary = self.sample().await;
        self.observations(&summary).await
    }

    /// A new collection, whatever the age of the latest (after node-level reclaim, as the
    /// kubelet asks its summary provider for updated stats).
    async fn observe_fresh(&self) -> Result<Observations, EvictionError> {
        let summary = self.service.refresh().await;
        self.observations(&summary).await
    }

    async fn observe_memory(&self) -> Result<Observations, EvictionError> {
        self.machine.observe_memory().await
    }

    /// The pods' figures of a sample whose pods are at most one sampling period old (the
    /// stats service collects them when they are older).
    async fn pod_usage(&self, pods: &[ActivePod]) -> HashMap<String, PodUsage> {
        let summary = self.service.summary_with_pods().await;
        let by_uid: HashMap<&str, &kubelet_api::stats::PodStats> = summary
            .pods
            .iter()
            .map(|p| (p.pod_ref.uid.as_str(), p))
            .collect();
        let mut out = HashMap::new();
        for p in pods {
            let uid = kubelet_api::pod::uid(&p.pod);
            let Some(stats) = by_uid.get(uid).copied() else {
                continue;
            };
            let empty_dirs: Vec<&str> = p
                .pod
                .spec
                .as_ref()
                .and_then(|s| s.volumes.as_ref())
                .into_iter()
                .flatten()
                .filter(|v| v.empty_dir.is_some())
                .map(|v| v.name.as_str())
                .collect();
            let mut usage = PodUsage::default();
            let mut inodes = None::<u64>;
            let mut add_inodes = |v: Option<u64>| {
                if let Some(v) = v {
                    inodes = Some(inodes.unwrap_or(0) + v);
                }
            };
            for c in &stats.containers {
                let rootfs = c.rootfs.as_ref();
                let logs = c.logs.as_ref();
                add_inodes(rootfs.and_then(|f| f.inodes_used));
                add_inodes(logs.and_then(|f| f.inodes_used));
                let disk = match (
                    rootfs.and_then(|f| f.used_bytes),
                    logs.and_then(|f| f.used_bytes),
                ) {
                    (None, None) => None,
                    (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
                };
                usage.containers.push(ContainerUsage {
                    name: c.name.clone(),
                    memory_working_set: c.memory.as_ref().and_then(|m| m.working_set_bytes),
                    processes: None,
                    disk_bytes: disk,
                });
            }
            usage.processes = stats.process_stats.as_ref().and_then(|p| p.process_count);
            if !stats.volumes.is_empty() {
                usage.volume_bytes =
                    Some(stats.volumes.iter().filter_map(|v| v.fs.used_bytes).sum());
            }
            for v in &stats.volumes {
                add_inodes(v.fs.inodes_used);
                if empty_dirs.contains(&v.name.as_str())
                    && let Some(b) = v.fs.used_bytes
                {
                    usage.volumes.insert(v.name.clone(), b);
                }
            }
            usage.inodes = inodes;
            out.insert(uid.to_string(), usage);
        }
        out
    }

    fn memory_cgroup(&self) -> Option<MemoryCgroup> {
        self.machine.memory_cgroup()
    }
}

impl ServiceStats {
    /// The signals of `summary`, with memory read from the machine now.
    async fn observations(&self, summary: &Summary) -> Result<Observations, EvictionError> {
        let mut out = self.machine.observe_memory().await?;
        let now = Instant::now();
        let node = &summary.node;
        if let Some(r) = &node.rlimit
            && let (Some(max), Some(cur)) = (r.maxpid, r.curproc)
        {
            out.insert(
                Signal::PidAvailable,
                SignalObservation {
                    available: max - cur,
                    capacity: max,
                    time: now,
                },
            );
        }
        fs_signals(
            node.fs.as_ref(),
            Signal::NodeFsAvailable,
            Signal::NodeFsInodesFree,
            now,
            &mut out,
        );
        let runtime = node.runtime.as_ref();
        fs_signals(
            runtime
                .and_then(|r| r.image_fs.as_ref())
                .or(node.fs.as_ref()),
            Signal::ImageFsAvailable,
            Signal::ImageFsInodesFree,
            now,
            &mut out,
        );
        fs_signals(
            runtime.and_then(|r| r.container_fs.as_ref()),
            Signal::ContainerFsAvailable,
            Signal::ContainerFsInodesFree,
            now,
            &mut out,
        );
        Ok(out)
    }
}
