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
//!   a cheap memory check every 100 ms, woken early by kernel notifications (cgroup v1 memory
//!   threshold eventfd, PSI trigger, inotify on cgroup v2 `memory.events`); evicts one pod per
//!   round through [`PodControl`] (implemented for the engine's `KubeletHandle`).
//!
//! Start with [`EvictionManager::new`]. With the engine, the agent needs the manager's
//! [`admit_handler`](EvictionManager::admit_handler) before it is built and the manager needs
//! the agent's handle after: [`DeferredPods`] bridges the two.
//!
//! ```no_run
//! use std::sync::Arc;
//! use kubelet_eviction::{DeferredPods, EvictionConfig, EvictionManager, EvictionSettings,
//!     MachineStats, MachineStatsConfig, parse_threshold_flag};
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn demo(builder: kubelet_core::KubeletBuilder,
//! #               runtime: Arc<dyn kubelet_core::ContainerRuntime>) -> Result<(), Box<dyn std::error::Error>> {
//! let mut settings = EvictionSettings::default();
//! settings.hard = Some(parse_threshold_flag("evictionHard", "memory.available<500Mi,nodefs.available<10%")?);
//! let config = EvictionConfig::from_settings(&settings)?;
//! let stats = MachineStats::new(MachineStatsConfig::detect().root_dir("/var/lib/kubelet"))
//!     .with_runtime(runtime);
//! let pods = DeferredPods::new();
//! let manager = EvictionManager::new(config, Arc::new(stats), Arc::new(pods.clone()));
//! let kubelet = builder.admit_handler(manager.admit_handler()).build()?;
//! pods.set(Arc::new(kubelet.handle()));
//! let shutdown = CancellationToken::new();
//! tokio::join!(kubelet.run(shutdown.clone()), manager.run(shutdown.clone()));
//! # Ok(()) }
//! ```

pub mod admission;
pub mod config;
pub mod decide;
mod deferred;
pub mod error;
pub mod machine;
pub mod manager;
pub mod metrics;
pub mod notify;
pub mod signal;
pub mod stats;

pub use admission::EvictionAdmitHandler;
pub use config::{
    EvictionConfig, EvictionSettings, Threshold, ThresholdValue, parse_map_flag,
    parse_threshold_flag,
};
pub use deferred::DeferredPods;
pub use error::EvictionError;
pub use machine::{
    CgroupFs, IMAGE_FS_INFO_TIMEOUT, ImageFsSource, MachineStats, MachineStatsConfig, MemorySource,
};
pub use manager::{
    Eviction, EvictionManager, FsLayout, ManagerEvent, NodeConditions, NodeReclaimer, PodControl,
    SyncResult,
};
pub use metrics::EvictionMetrics;
pub use signal::{NodeCondition, Resource, Signal};
pub use stats::{
    ActivePod, ContainerUsage, Observations, PodUsage, SignalObservation, StatsProvider,
};
