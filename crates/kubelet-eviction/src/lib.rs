//! `kubelet-eviction`: node-pressure eviction with the kubelet's rules, reacting in well under a
//! second.
//!
//! The pieces, usable alone or together:
//!
//! * **Configuration** ([`config`]): `evictionHard` / `evictionSoft` statements such as
//!   `memory.available<100Mi` or `nodefs.available<10%`, soft grace periods, minimum reclaim,
//!   the pressure transition period (5 m) and the maximum pod grace period, with the kubelet's
//!   defaults; errors name the bad entry.
//! * **Signals** ([`StatsProvider`]): observations of `memory.available`,
//!   `allocatableMemory.available`, `nodefs.*`, `imagefs.*`, `pid.available` and per-pod usage.
//!   [`MachineStats`] reads the real machine (cgroup v1/v2, `/proc`, `statvfs`, the runtime's
//!   container stats and image filesystem); it can treat a cgroup with a memory limit as "the
//!   node".
//! * **Decisions** ([`decide`]): thresholds met with hysteresis, grace periods, node conditions
//!   with the transition period, ranking, critical pods, the eviction message; pure functions.
//! * **Admission** ([`admission`]): BestEffort pods rejected under MemoryPressure, every
//!   non-critical pod under DiskPressure / PIDPressure.
//! * **The manager** ([`EvictionManager`]): the kubelet's 10 s `synchronize` as a safety net plus
//!   a cheap memory check every 100 ms near a threshold (once a second far from every threshold
//!   or while the cgroup v1 threshold eventfd watches), woken early by kernel notifications
//!   (cgroup v1 memory threshold eventfd, PSI trigger, inotify on cgroup v2 `memory.events`);
//!   evicts one pod per
//!   round through [`PodControl`] (implemented for the agent's `AgentHandle`).
//!
//! With the engine, add an [`EvictionPlugin`] to the agent's builder: it gives the agent its
//! admission handler, pressure conditions and metrics, and the agent runs its loop with the
//! agent's handle for killing pods. Without the engine, drive an [`EvictionManager`] with your
//! own [`PodControl`].
//!
//! ```no_run
//! use std::sync::Arc;
//! use kubelet_eviction::{EvictionConfig, EvictionPlugin, EvictionSettings, parse_threshold_flag};
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn demo(builder: kubelet_core::KubeletBuilder) -> Result<(), Box<dyn std::error::Error>> {
//! let mut settings = EvictionSettings::default();
//! settings.hard = Some(parse_threshold_flag("evictionHard", "memory.available<500Mi,nodefs.available<10%")?);
//! let eviction = EvictionPlugin::new(EvictionConfig::from_settings(&settings)?);
//! let kubelet = builder.plugin(Arc::new(eviction)).build()?;
//! kubelet.run(CancellationToken::new()).await;
//! # Ok(()) }
//! ```

pub mod admission;
pub mod config;
pub mod decide;
pub mod error;
pub mod machine;
pub mod manager;
pub mod metrics;
pub mod notify;
mod plugin;
pub mod service;
pub mod signal;
pub mod stats;

pub use admission::EvictionAdmitHandler;
pub use config::{
    EvictionConfig, EvictionSettings, Threshold, ThresholdValue, parse_map_flag,
    parse_threshold_flag,
};
pub use error::EvictionError;
pub use machine::{
    CgroupFs, IMAGE_FS_INFO_TIMEOUT, ImageFsSource, MachineStats, MachineStatsConfig, MemorySource,
};
pub use manager::{
    Eviction, EvictionManager, FsLayout, ManagerEvent, NodeConditions, PodControl, SyncResult,
};
pub use metrics::EvictionMetrics;
pub use plugin::EvictionPlugin;
pub use service::ServiceStats;
pub use signal::{NodeCondition, Resource, Signal};
pub use stats::{
    ActivePod, ContainerUsage, Observations, PodUsage, SignalObservation, StatsProvider,
};
