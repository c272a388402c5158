//! `kubelet-stats`: resource usage for the kubelet SDK.
//!
//! One collector for the node, its pods and their containers, as the kubelet's cAdvisor and
//! CRI stats providers make it:
//!
//! * the **node** from the root cgroup (cgroup v1 or v2, [detected](CgroupSetup::detect)
//!   once from mountinfo, never assumed), `/proc` (`meminfo`, `stat`, `loadavg`, `net/dev`)
//!   and `statvfs` of the agent's root directory;
//! * **pods and containers** from the runtime (`list_pod_sandboxes`, `list_containers`, one
//!   `list_container_stats` per collection, `image_fs_info`: CRI `ListContainerStats` on
//!   containerd, the process runtime's cgroups), their **volumes** (`<root>/pods/<uid>/volumes/<plugin>/<name>`, walked
//!   every `volumeStatsAggPeriod`) and **logs** (`<podLogsDir>/<ns>_<name>_<uid>/<container>`);
//! * **rates** (`usageNanoCores`) from the difference between two samples.
//!
//! The [OOM watcher](oom) reads the kernel log (`/dev/kmsg`) and records a `SystemOOM`
//! warning event on the Node for every system OOM kill, with the victim's name and PID.
//!
//! The result is the kubelet's `stats/v1alpha1` [`Summary`](kubelet_api::stats::Summary).
//! [`StatsPlugin`] samples the node every `housekeepingInterval` (10 s) in an agent, the pods
//! when a reader asks for them (at most once per interval, as the kubelet's CRI stats provider
//! asks the runtime on each request), and provides [`Stats`] as the agent's
//! [`StatsService`](kubelet_api::stats::StatsService): the kubelet API serves it as
//! `/stats/summary`, `/metrics/resource` and `/metrics/cadvisor`. An idle node pays for the
//! node's figures only, whatever its pod count.
//!
//! In an agent it is one line of the builder (the facade's `AgentBuilder` adds it by default;
//! `without_stats()` leaves it out):
//!
//! ```text
//! let stats = kubelet_stats::StatsPlugin::new(StatsConfig::default());
//! let agent = KubeletBuilder::new("node-1").plugin(Arc::new(stats)) /* runtime, pleg, … */;
//! // another plugin, in its run(): ctx.service::<dyn kubelet_api::stats::StatsService>()
//! ```
//!
//! Used alone, a [`Collector`] samples on demand:
//!
//! ```no_run
//! # async fn f() {
//! use kubelet_api::AgentDirs;
//! use kubelet_stats::{Collector, StatsConfig};
//!
//! let dirs = AgentDirs { root_dir: "/var/lib/kubelet".into(), pod_log_dir: "/var/log/pods".into() };
//! let mut collector = Collector::new("node-1", dirs, StatsConfig::default());
//! let summary = collector.collect(None).await; // no runtime: the node only
//! println!("{:?}", summary.node.memory);
//! # }
//! ```
//!
//! Differences from the kubelet: a pod's CPU and memory are the sums of its running
//! containers' (the kubelet reads the pod cgroup, which the SDK does not create yet); pod
//! network figures are not collected (the runtime seam exposes no sandbox network namespace);
//! the `runtime` and `pods` system containers are not reported, `kubelet` is when the agent runs
//! in a cgroup of its own.
#![forbid(unsafe_code)]

pub mod cgroup;
mod collector;
pub mod fs;
pub mod oom;
mod plugin;
pub mod procfs;

pub use cgroup::{CgroupSample, CgroupSetup, CgroupVersion};
pub use collector::{
    Collector, DEFAULT_HOUSEKEEPING_INTERVAL, DEFAULT_VOLUME_STATS_AGG_PERIOD, LIST_STATS_TIMEOUT,
    RUNTIME_CALL_TIMEOUT, StatsConfig, read_machine,
};
pub use plugin::{PODS_TIMEOUT, REFRESH_TIMEOUT, Stats, StatsPlugin};
