//! `kubelet-cm`: node resource management for the kubelet SDK, as the kubelet's container
//! manager (`pkg/kubelet/cm`).
//!
//! One agent plugin, [`ContainerManager`], gives a node:
//!
//! * the **QoS cgroup hierarchy** when `cgroupsPerQOS` (default on): `kubepods`,
//!   `kubepods/burstable`, `kubepods/besteffort` and one `pod<uid>` cgroup per pod under its
//!   QoS tier, named for the `cgroupfs` or `systemd` driver, on cgroup v1 and v2 ([`cgroups`]);
//!   pod cgroups get the pod's CPU shares, quota and memory limit and `podPidsLimit`, and are
//!   removed once the pod's containers are gone;
//! * **node allocatable** ([`allocatable`]): capacity − `kubeReserved` − `systemReserved` −
//!   hard eviction thresholds, reported in `node.status.allocatable` and, with
//!   `enforceNodeAllocatable: [pods]`, enforced as the `kubepods` limits;
//! * **resource admission** ([`admission`]): `OutOfcpu`, `OutOfmemory`,
//!   `OutOfephemeral-storage`, `OutOfpods`, `OutOf<extended resource>`, `NodeAffinity`,
//!   `NodeName`, `NodePorts`, the node OS;
//! * the **OOM score policy** ([`oom`]) in each container's `oom_score_adj`;
//! * the **CPU manager** `static` policy ([`cpumanager`]): exclusive CPUs for Guaranteed
//!   containers with integer CPU requests, from a checkpoint that survives restarts.
//!
//! The engine reaches it through the [`PodResourceManager`](kubelet_api::resources::PodResourceManager)
//! service. The facade (`kubelet::AgentBuilder`) registers it by default from the
//! `KubeletConfiguration`; with the engine's builder it is one plugin:
//!
//! ```no_run
//! use std::sync::Arc;
//! use kubelet_cm::{CmConfig, ContainerManager};
//!
//! # fn build() -> Result<(), Box<dyn std::error::Error>> {
//! let mut config = CmConfig::default();
//! config.root_dir = "/var/lib/my-agent".into();
//! config.kube_reserved = [("memory".to_string(), "256Mi".to_string())].into();
//! let cm = ContainerManager::new("node-1", config)?;
//! let agent = kubelet_core::KubeletBuilder::new("node-1")
//!     // .runtime(…).pleg(…).pod_source(…)
//!     .plugin(Arc::new(cm))
//!     .build()?;
//! # drop(agent);
//! # Ok(())
//! # }
//! ```
//! Critical-pod preemption (a static pod evicting others to fit) is not done: a
//! static pod that does not fit is rejected like any other. Memory and topology managers are
//! not implemented.
#![forbid(unsafe_code)]

pub mod admission;
pub mod allocatable;
pub mod cgroups;
pub mod cpumanager;
pub mod oom;
mod plugin;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

pub use cgroups::CgroupDriver;
pub use plugin::ContainerManager;

/// Why the container manager cannot do what it was configured to.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CmError {
    /// A configuration value is wrong (the message names the field).
    #[error("container manager configuration: {0}")]
    Config(String),
    /// A cgroup could not be created, written or removed.
    #[error(transparent)]
    Cgroup(#[from] kubelet_stats::cgroup::CgroupWriteError),
    /// The CPU manager's checkpoint could not be written.
    #[error("CPU manager state: {0}")]
    State(String),
    /// Swap is on and `failSwapOn` is set.
    #[error(
        "running with swap on is not supported, please disable swap or set --fail-swap-on flag to false; /proc/swaps contained: {0:?}"
    )]
    SwapOn(Vec<String>),
}

/// The CPU manager policy (`cpuManagerPolicy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum CpuManagerPolicy {
    /// Every container shares every CPU (the default).
    #[default]
    None,
    /// Exclusive CPUs for Guaranteed containers with integer CPU requests.
    Static,
}

impl CpuManagerPolicy {
    /// Parse `none` or `static`.
    pub fn parse(s: &str) -> Result<Self, CmError> {
        match s {
            "none" | "" => Ok(CpuManagerPolicy::None),
            "static" => Ok(CpuManagerPolicy::Static),
            other => Err(CmError::Config(format!(
                "cpuManagerPolicy {other:?}: want \"none\" or \"static\""
            ))),
        }
    }
}

/// The container manager's configuration; field names follow `KubeletConfiguration`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CmConfig {
    /// `--root-dir`: the CPU manager checkpoint and the `ephemeral-storage` capacity.
    pub root_dir: PathBuf,
    /// `cgroupsPerQOS` (true): build the QoS hierarchy and pod cgroups.
    pub cgroups_per_qos: bool,
    /// `cgroupDriver` (`cgroupfs`).
    pub cgroup_driver: CgroupDriver,
    /// `cgroupRoot` (`/`): where `kubepods` goes.
    pub cgroup_root: String,
    /// `kubeReserved` (`cpu`, `memory`, `ephemeral-storage`, `pid`).
    pub kube_reserved: BTreeMap<String, String>,
    /// `systemReserved`.
    pub system_reserved: BTreeMap<String, String>,
    /// `enforceNodeAllocatable` (`[pods]`).
    pub enforce_node_allocatable: Vec<String>,
    /// `evictionHard`, subtracted from allocatable (`memory.available`, `nodefs.available`).
    pub eviction_hard: BTreeMap<String, String>,
    /// `maxPods` (110).
    pub max_pods: i64,
    /// `podPidsLimit` (-1: unlimited).
    pub pod_pids_limit: i64,
    /// `cpuCFSQuota` (true): CPU limits become CFS quotas.
    pub cpu_cfs_quota: bool,
    /// `cpuManagerPolicy`.
    pub cpu_manager_policy: CpuManagerPolicy,
    /// `reservedSystemCPUs` (list format; empty: none).
    pub reserved_system_cpus: String,
    /// `cpuManagerReconcilePeriod` (10 s).
    pub cpu_manager_reconcile_period: Duration,
    /// The node's labels, for `nodeSelector` and node affinity (the default labels
    /// `kubernetes.io/hostname`, `kubernetes.io/os`, `kubernetes.io/arch` are added).
    pub node_labels: BTreeMap<String, String>,
    /// Where `/proc` and `/sys` are (tests point them at fixtures).
    pub proc_root: PathBuf,
    /// See [`proc_root`](Self::proc_root).
    pub sys_root: PathBuf,
}

impl Default for CmConfig {
    fn default() -> Self {
        Self {
            root_dir: PathBuf::from("/var/lib/kubelet"),
            cgroups_per_qos: true,
            cgroup_driver: CgroupDriver::Cgroupfs,
            cgroup_root: "/".into(),
            kube_reserved: BTreeMap::new(),
            system_reserved: BTreeMap::new(),
            enforce_node_allocatable: vec!["pods".into()],
            eviction_hard: BTreeMap::new(),
            max_pods: 110,
            pod_pids_limit: -1,
            cpu_cfs_quota: true,
            cpu_manager_policy: CpuManagerPolicy::None,
            reserved_system_cpus: String::new(),
            cpu_manager_reconcile_period: Duration::from_secs(10),
            node_labels: BTreeMap::new(),
            proc_root: PathBuf::from("/proc"),
            sys_root: PathBuf::from("/sys"),
        }
    }
}

/// The swap devices in use (`/proc/swaps` without its header); the kubelet refuses to start
/// when there are any and `failSwapOn` is set.
pub fn swap_devices(proc_root: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(proc_root.join("swaps"))
        .map(|t| {
            t.lines()
                .skip(1)
                .filter(|l| !l.trim().is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// `failSwapOn`: an error when swap is on.
pub fn check_swap(proc_root: &std::path::Path) -> Result<(), CmError> {
    let devices = swap_devices(proc_root);
    if devices.is_empty() {
        Ok(())
    } else {
        Err(CmError::SwapOn(devices))
    }
}
