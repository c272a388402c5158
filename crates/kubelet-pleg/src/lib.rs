//! `kubelet-pleg`: the pod lifecycle event generator (PLEG) of the kubelet SDK.
//!
//! A PLEG watches a [`ContainerRuntime`](kubelet_core::ContainerRuntime), keeps the pod status
//! cache ([`kubelet_core::PodCache`]) current, and tells the engine which pods changed through
//! [`PodLifecycleEvent`](kubelet_core::PodLifecycleEvent)s (`ContainerStarted`, `ContainerDied`,
//! `ContainerRemoved`). Start with [`GenericPleg`]: the kubelet's relist PLEG, which lists every
//! sandbox and container once per second, diffs the result against the previous list, inspects
//! the pods that changed, and publishes their statuses. A dead container is therefore noticed
//! within about one relist period rather than at the next one-minute resync.
//!
//! It is usable without the engine: take its event receiver, run it, and read the cache.
//!
//! ```no_run
//! use std::sync::Arc;
//! use kubelet_core::{ContainerRuntime, PodLifecycleEventGenerator};
//! use kubelet_pleg::{GenericPleg, GenericPlegConfig};
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn example(runtime: Arc<dyn ContainerRuntime>) {
//! let pleg = Arc::new(GenericPleg::new(runtime, GenericPlegConfig::default()));
//! let mut events = pleg.take_events().expect("first call returns the receiver");
//! let cache = pleg.cache();
//! let shutdown = CancellationToken::new();
//! tokio::spawn({
//!     let pleg = pleg.clone();
//!     let shutdown = shutdown.clone();
//!     async move { pleg.run(shutdown).await }
//! });
//! while let Some(event) = events.recv().await {
//!     let status = cache.get(&event.pod_uid);
//!     println!("{:?} {} {}: {:?}", event.kind, event.pod_uid, event.container_id, status);
//! }
//! # }
//! ```
//!
//! Semantics follow the upstream kubelet's `pkg/kubelet/pleg/generic.go`; where this crate
//! differs (concurrent, time-bounded inspections of changed pods) the items say so.

#![forbid(unsafe_code)]

mod diff;
mod error;
mod generic;

pub use error::PlegError;
pub use generic::{
    DEFAULT_INSPECT_TIMEOUT, DEFAULT_MAX_CONCURRENT_INSPECTIONS, GENERIC_PLEG_RELIST_PERIOD,
    GENERIC_PLEG_RELIST_THRESHOLD, GenericPleg, GenericPlegConfig, RelistReport,
};
pub use kubelet_core::pleg::PLEG_CHANNEL_CAPACITY;

/// Format a duration the way Go's `time.Duration.String` does (`3m0s`), so health messages read
/// like the kubelet's.
pub use kubelet_core::duration::format_go as format_go_duration;
