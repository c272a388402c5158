//! `kubelet-gc`: disk hygiene for the kubelet SDK, as the kubelet keeps its node's disks.
//!
//! * [`images::ImageGc`] — image garbage collection: unused images least recently used first when the
//!   image filesystem is above `imageGCHighThresholdPercent` (85), down to
//!   `imageGCLowThresholdPercent` (80); `imageMinimumGCAge` (2 m), `imageMaximumGCAge` (off);
//!   never an image a container uses, one the runtime pins, or the configured sandbox image.
//! * [`containers::ContainerGc`] — container garbage collection: dead containers beyond
//!   `--maximum-dead-containers-per-container` (1, the newest stays) and
//!   `--maximum-dead-containers` (no limit), dead sandboxes, and what is left of pods no
//!   source knows (containers, sandboxes, log and pod directories, dangling log links).
//! * [`logs::LogRotator`] — container log rotation at `containerLogMaxSize` (10 MiB), keeping
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

// The collectors, each usable alone, reached by their module path.
pub mod containers;
pub mod images;
pub mod logs;

mod config;
mod error;
mod plugin;

pub use config::{ContainerGcPolicy, GcConfig, ImageGcPolicy, LogRotationPolicy};
pub use error::GcError;
pub use plugin::GcPlugin;
