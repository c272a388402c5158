//! Resource usage: the kubelet's `stats/v1alpha1` Summary model and [`StatsService`], the
//! service a stats collector provides to the other plugins (the kubelet API's `/stats/summary`
//! and `/metrics/resource`, eviction, the node status).
//!
//! The types serialize to the field names of the kubelet's `/stats/summary` JSON (`nodeName`,
//! `usageNanoCores`, `ephemeral-storage`, …); a figure that is not known is `None` and left out
//! of the JSON, as the kubelet leaves out nil pointers. Timestamps are RFC 3339 with second
//! precision, as `metav1.Time`.

use std::sync::Arc;

use async_trait::async_trait;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// What a stats collector offers the agent's other plugins: the latest sample, cheap to read
/// (no collection on the caller's path), the pods' figures when a reader needs them, a fresh
/// sample on demand, and the machine's capacity.
///
/// Provided as `Arc<dyn StatsService>` through [`Services`](crate::Services); see
/// `kubelet-stats` for the SDK's implementation, which samples the node periodically and the
/// pods when [`summary_with_pods`](Self::summary_with_pods) asks for them.
#[async_trait]
pub trait StatsService: Send + Sync + 'static {
    /// The latest sample. Before the first collection: a summary with the node's name and no
    /// figures. Its node figures are at most one sampling period old; its pods are those of
    /// the last collection that included them (each figure carries its time), and may be
    /// none: readers of the pods' figures call
    /// [`summary_with_pods`](Self::summary_with_pods).
    fn summary(&self) -> Arc<Summary>;

    /// A sample whose pods were collected at most one sampling period ago: the latest when
    /// they were, after a collection of the pods otherwise. What the kubelet API's
    /// `/stats/summary` and `/metrics/resource` and eviction's per-pod usage read. The default
    /// returns [`summary`](Self::summary).
    async fn summary_with_pods(&self) -> Arc<Summary> {
        self.summary()
    }

    /// Collect the node and the pods now and return the new sample (eviction's on-demand
    /// refresh). The default returns [`summary`](Self::summary).
    async fn refresh(&self) -> Arc<Summary> {
        self.summary()
    }

    /// The machine's capacity (CPU cores and memory), read once at start.
    fn machine(&self) -> Machine;
}

fn _assert_stats_dyn(_: &dyn StatsService) {}

/// The machine's capacity (cAdvisor's `MachineInfo` subset the kubelet reports).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Machine {
    /// Logical CPUs.
    pub num_cores: u64,
    /// `MemTotal` of `/proc/meminfo`, in bytes.
    pub memory_capacity: u64,
}

impl Machine {
    /// A machine of `num_cores` logical CPUs and `memory_capacity` bytes.
    pub fn new(num_cores: u64, memory_capacity: u64) -> Self {
        Self {
            num_cores,
            memory_capacity,
        }
    }
}

/// The kubelet's `Summary`: the node and every pod it runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Summary {
    /// The node.
    pub node: NodeStats,
    /// The pods, in no particular order.
    pub pods: Vec<PodStats>,
}

impl Summary {
    /// An empty summary of node `node_name`.
    pub fn new(node_name: impl Into<String>) -> Self {
        Self {
            node: NodeStats {
                node_name: node_name.into(),
                ..Default::default()
            },
            pods: Vec::new(),
        }
    }

    /// The reduced form `/stats/summary?only_cpu_and_memory=true` answers: the node's and its
    /// system containers' CPU and memory, each pod's reference, start time, CPU and memory, and
    /// its containers' name, start time, CPU and memory.
    pub fn cpu_and_memory(&self) -> Summary {
        let container = |c: &ContainerStats| ContainerStats {
            name: c.name.clone(),
            start_time: c.start_time,
            cpu: c.cpu.clone(),
            memory: c.memory.clone(),
            ..Default::default()
        };
        Summary {
            node: NodeStats {
                node_name: self.node.node_name.clone(),
                system_containers: self.node.system_containers.iter().map(container).collect(),
                start_time: self.node.start_time,
                cpu: self.node.cpu.clone(),
                memory: self.node.memory.clone(),
                ..Default::default()
            },
            pods: self
                .pods
                .iter()
                .map(|p| PodStats {
                    pod_ref: p.pod_ref.clone(),
                    start_time: p.start_time,
                    containers: p.containers.iter().map(container).collect(),
                    cpu: p.cpu.clone(),
                    memory: p.memory.clone(),
                    ..Default::default()
                })
                .collect(),
        }
    }

    /// The pod with UID `uid`.
    pub fn pod(&self, uid: &str) -> Option<&PodStats> {
        self.pods.iter().find(|p| p.pod_ref.uid == uid)
    }
}

/// The node's figures (`NodeStats`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct NodeStats {
    /// The node's name.
    pub node_name: String,
    /// The agent itself (`kubelet`), the runtime (`runtime`) and the pods' parent (`pods`),
    /// where known.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub system_containers: Vec<ContainerStats>,
    /// When the machine booted.
    #[serde(default, with = "opt_time", skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Timestamp>,
    /// The whole machine's CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// The whole machine's memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    /// The machine's network interfaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
    /// The filesystem of the agent's root directory (nodefs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fs: Option<FsStats>,
    /// The runtime's image and container filesystems.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeStats>,
    /// Process IDs: the limit and how many are in use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rlimit: Option<RlimitStats>,
}

/// The runtime's filesystems (`RuntimeStats`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct RuntimeStats {
    /// Where images are stored; `usedBytes` is what the images use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_fs: Option<FsStats>,
    /// Where writable container layers are stored, when apart from the images.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_fs: Option<FsStats>,
}

/// Process IDs (`RlimitStats`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RlimitStats {
    /// When read.
    #[serde(with = "time")]
    pub time: Timestamp,
    /// min(`pid_max`, `threads-max`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maxpid: Option<i64>,
    /// Processes (and threads) that exist now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub curproc: Option<i64>,
}

impl RlimitStats {
    /// Figures read at `time`, none known yet.
    pub fn new(time: Timestamp) -> Self {
        Self {
            time,
            ..Default::default()
        }
    }
}

/// A pod's reference (`PodReference`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PodReference {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.uid`.
    pub uid: String,
}

impl PodReference {
    /// Pod `namespace/name` with `uid`.
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        uid: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            namespace: namespace.into(),
            uid: uid.into(),
        }
    }
}

/// One pod's figures (`PodStats`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct PodStats {
    /// Which pod.
    pub pod_ref: PodReference,
    /// When the agent first saw the pod running (its status' `startTime`).
    #[serde(default, with = "opt_time", skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Timestamp>,
    /// Its running containers.
    #[serde(default)]
    pub containers: Vec<ContainerStats>,
    /// The pod's CPU (the sum of its containers').
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// The pod's memory (the sum of its containers').
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    /// The pod's network (its sandbox's interfaces).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
    /// Its volumes, by volume name.
    #[serde(default, rename = "volume", skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeStats>,
    /// Local ephemeral storage: the containers' writable layers and logs and the pod's
    /// disk-backed emptyDir volumes.
    #[serde(
        default,
        rename = "ephemeral-storage",
        skip_serializing_if = "Option::is_none"
    )]
    pub ephemeral_storage: Option<FsStats>,
    /// Processes in the pod.
    #[serde(
        default,
        rename = "process_stats",
        skip_serializing_if = "Option::is_none"
    )]
    pub process_stats: Option<ProcessStats>,
}

impl PodStats {
    /// Figures of the pod `pod_ref`, none known yet.
    pub fn new(pod_ref: PodReference) -> Self {
        Self {
            pod_ref,
            ..Default::default()
        }
    }
}

/// One container's figures (`ContainerStats`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct ContainerStats {
    /// The container's name in the pod spec (or the system container's: `kubelet`, `runtime`,
    /// `pods`).
    pub name: String,
    /// When the container started.
    #[serde(default, with = "opt_time", skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Timestamp>,
    /// CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// Memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    /// Its writable layer, on the runtime's container filesystem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<FsStats>,
    /// Its log files, on the filesystem of the pod log directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs: Option<FsStats>,
    /// The runtime's container ID (not part of the Summary's JSON; labels
    /// `/metrics/cadvisor` series).
    #[serde(skip)]
    pub container_id: String,
    /// The container's image (not part of the Summary's JSON; labels `/metrics/cadvisor`
    /// series).
    #[serde(skip)]
    pub image: String,
}

impl ContainerStats {
    /// Figures of container `name`, none known yet.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            ..Default::default()
        }
    }
}

/// CPU figures (`CPUStats`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct CpuStats {
    /// When read.
    #[serde(with = "time")]
    pub time: Timestamp,
    /// Average use since the previous sample, in billionths of a core.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_nano_cores: Option<u64>,
    /// Cumulative use, in core-nanoseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_core_nano_seconds: Option<u64>,
}

impl CpuStats {
    /// Figures read at `time`, none known yet.
    pub fn new(time: Timestamp) -> Self {
        Self {
            time,
            ..Default::default()
        }
    }
}

/// Memory figures (`MemoryStats`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct MemoryStats {
    /// When read.
    #[serde(with = "time")]
    pub time: Timestamp,
    /// Limit (or capacity, for the node) minus the working set; unset without a limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    /// All memory in use, page cache included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_bytes: Option<u64>,
    /// Usage minus inactive file pages: what the kernel cannot easily reclaim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_set_bytes: Option<u64>,
    /// Anonymous memory and swap cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    /// Page faults, cumulative.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_faults: Option<u64>,
    /// Major page faults, cumulative.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major_page_faults: Option<u64>,
}

impl MemoryStats {
    /// Figures read at `time`, none known yet.
    pub fn new(time: Timestamp) -> Self {
        Self {
            time,
            ..Default::default()
        }
    }
}

/// Network figures (`NetworkStats`): the default interface's inline, and every interface.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct NetworkStats {
    /// When read.
    #[serde(with = "time")]
    pub time: Timestamp,
    /// The default interface (the kubelet inlines it).
    #[serde(flatten)]
    pub default: InterfaceStats,
    /// Every interface.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<InterfaceStats>,
}

impl NetworkStats {
    /// Figures read at `time`, none known yet.
    pub fn new(time: Timestamp) -> Self {
        Self {
            time,
            ..Default::default()
        }
    }
}

/// One interface's counters (`InterfaceStats`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct InterfaceStats {
    /// Interface name.
    #[serde(default)]
    pub name: String,
    /// Bytes received, cumulative.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_bytes: Option<u64>,
    /// Receive errors, cumulative.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_errors: Option<u64>,
    /// Bytes sent, cumulative.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_bytes: Option<u64>,
    /// Send errors, cumulative.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_errors: Option<u64>,
}

impl InterfaceStats {
    /// Counters of interface `name`, none known yet.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            ..Default::default()
        }
    }
}

/// Filesystem figures (`FsStats`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct FsStats {
    /// When read.
    #[serde(with = "time")]
    pub time: Timestamp,
    /// Free bytes for unprivileged users.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    /// Size of the filesystem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
    /// Bytes this item uses (for the node: the whole filesystem's usage).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    /// Free inodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inodes_free: Option<u64>,
    /// Inodes of the filesystem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inodes: Option<u64>,
    /// Inodes this item uses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inodes_used: Option<u64>,
}

impl FsStats {
    /// Figures read at `time`, none known yet.
    pub fn new(time: Timestamp) -> Self {
        Self {
            time,
            ..Default::default()
        }
    }
}

/// One volume's figures (`VolumeStats`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct VolumeStats {
    /// Usage of the volume, capacity of its filesystem.
    #[serde(flatten)]
    pub fs: FsStats,
    /// The volume's name in the pod spec.
    pub name: String,
}

impl VolumeStats {
    /// Figures of volume `name`.
    pub fn new(name: impl Into<String>, fs: FsStats) -> Self {
        Self {
            fs,
            name: name.into(),
        }
    }
}

/// Processes of a pod (`ProcessStats`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ProcessStats {
    /// How many processes run in the pod's containers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_count: Option<u64>,
}

impl ProcessStats {
    /// `count` processes.
    pub fn new(count: u64) -> Self {
        Self {
            process_count: Some(count),
        }
    }
}

/// `metav1.Time`: RFC 3339, whole seconds, UTC.
mod time {
    use jiff::Timestamp;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(t: &Timestamp, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&format_args!(
            "{:.0}",
            t.round(jiff::Unit::Second).unwrap_or(*t)
        ))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Timestamp, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

mod opt_time {
    use jiff::Timestamp;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(t: &Option<Timestamp>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => super::time::serialize(t, s),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Timestamp>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|s| s.parse().map_err(serde::de::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn t() -> Timestamp {
        "2026-11-27T04:05:06.789Z".parse().unwrap()
    }

    #[test]
    fn the_summary_serializes_with_the_kubelets_field_names() {
        let mut pod = PodStats::new(PodReference::new("default", "web", "u1"));
        pod.start_time = Some(t());
        let mut cpu = CpuStats::new(t());
        cpu.usage_nano_cores = Some(500_000_000);
        cpu.usage_core_nano_seconds = Some(12);
        let mut c = ContainerStats::new("app");
        c.cpu = Some(cpu.clone());
        c.container_id = "abc".into();
        pod.containers.push(c);
        let mut fs = FsStats::new(t());
        fs.used_bytes = Some(50);
        pod.volumes.push(VolumeStats::new("data", fs.clone()));
        pod.ephemeral_storage = Some(fs);
        pod.process_stats = Some(ProcessStats::new(3));
        let mut net = NetworkStats::new(t());
        net.default = InterfaceStats::new("eth0");
        net.default.rx_bytes = Some(1);
        net.interfaces.push(net.default.clone());
        pod.network = Some(net);
        let mut summary = Summary::new("node-1");
        summary.node.cpu = Some(cpu);
        summary.pods.push(pod);
        let v = serde_json::to_value(&summary).unwrap();
        assert_eq!(v["node"]["nodeName"], "node-1");
        assert_eq!(v["node"]["cpu"]["usageNanoCores"], 500_000_000);
        assert_eq!(v["node"]["cpu"]["time"], "2026-11-27T04:05:07Z");
        let p = &v["pods"][0];
        assert_eq!(p["podRef"]["namespace"], "default");
        assert_eq!(p["startTime"], "2026-11-27T04:05:07Z");
        assert_eq!(p["containers"][0]["name"], "app");
        assert!(p["containers"][0].get("containerId").is_none());
        assert!(p["containers"][0].get("memory").is_none());
        assert_eq!(p["volume"][0]["name"], "data");
        assert_eq!(p["volume"][0]["usedBytes"], 50);
        assert_eq!(p["ephemeral-storage"]["usedBytes"], 50);
        assert_eq!(p["process_stats"]["process_count"], 3);
        assert_eq!(p["network"]["name"], "eth0");
        assert_eq!(p["network"]["rxBytes"], 1);
        assert_eq!(p["network"]["interfaces"][0]["name"], "eth0");
        // It reads back (metrics-server and tests decode it).
        let back: Summary = serde_json::from_value(v).unwrap();
        assert_eq!(back.pods[0].volumes[0].fs.used_bytes, Some(50));
    }

    #[test]
    fn only_cpu_and_memory_keeps_what_metrics_server_reads() {
        let mut pod = PodStats::new(PodReference::new("ns", "p", "u"));
        pod.cpu = Some(CpuStats::new(t()));
        pod.memory = Some(MemoryStats::new(t()));
        pod.ephemeral_storage = Some(FsStats::new(t()));
        let mut c = ContainerStats::new("c");
        c.memory = Some(MemoryStats::new(t()));
        c.logs = Some(FsStats::new(t()));
        pod.containers.push(c);
        let mut s = Summary::new("n");
        s.node.fs = Some(FsStats::new(t()));
        s.node.memory = Some(MemoryStats::new(t()));
        s.pods.push(pod);
        let r = s.cpu_and_memory();
        assert!(r.node.fs.is_none() && r.node.memory.is_some());
        assert!(r.pods[0].ephemeral_storage.is_none());
        assert!(r.pods[0].cpu.is_some() && r.pods[0].memory.is_some());
        assert!(r.pods[0].containers[0].logs.is_none());
        assert!(r.pods[0].containers[0].memory.is_some());
        assert_eq!(r.pod("u").map(|p| p.pod_ref.name.as_str()), Some("p"));
    }
}
