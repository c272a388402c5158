//! `kubelet-gc`: disk hygiene for the kubelet SDK, as the kubelet keeps its node's disks.
//!
//! * [`ImageGc`] — image garbage collection: unused images least recently used first when the
//!   image filesystem is above `imageGCHighThresholdPercent` (85), down to
//!   `imageGCLowThresholdPercent` (80); `imageMinimumGCAge` (2 m), `imageMaximumGCAge` (off);
//!   never an image a container uses, one the runtime pins, or the configured sandbox image.
//! * [`ContainerGc`] — container garbage collection: dead containers beyond
//!   `--maximum-dead-containers-per-container` (1, the newest stays) and
//!   `--maximum-dead-containers` (no limit), dead sandboxes, and what is left of pods no
//!   source knows (containers, sandboxes, log and pod directories, dangling log links).
//! * [`LogRotator`] — container log rotation at `containerLogMaxSize` (10 MiB), keeping
//!   `containerLogMaxFiles` (5), older ones gzipped, the runtime told to reopen.
//! * [`GcPlugin`] — all three in an agent (every 5 min, 1 min and 10 s), providing the
//!   [`NodeReclaimer`](kubelet_api::NodeReclaimer) service eviction runs before it evicts for
//!   disk pressure. Depends on `kubelet-api` only; each collector is usable alone with any
//!   [`ContainerRuntime`](kubelet_api::ContainerRuntime).
//!
//! ```no_run
//! # fn demo(builder: kubelet_core::KubeletBuilder) -> Result<(), kubelet_gc::GcError> {
//! use std::sync::Arc;
//! let mut config = kubelet_gc::GcConfig::new();
//! config.images.high_threshold_percent = 90;
//! let builder = builder.plugin(Arc::new(kubelet_gc::GcPlugin::new(config)?));
//! # let _ = builder; Ok(()) }
//! ```
#![forbid(unsafe_code)]

mod config;
mod containers;
mod error;
mod images;
mod logs;
mod plugin;

pub use config::{ContainerGcPolicy, GcConfig, ImageGcPolicy, LogRotationPolicy};
pub use containers::{ContainerGc, ContainerGcOutcome, DeadContainer, plan_dead_containers};
pub use error::GcError;
pub use images::{Candidate, FsUsage, ImageGc, ImageGcOutcome, Reason, eviction_order, plan_free};
pub use logs::{LogRotator, RotationOutcome};
pub use plugin::GcPlugin;
