//! `kubelet-pleg`: the pod lifecycle event generator (PLEG) of the kubelet SDK.
//!
//! A PLEG watches a [`ContainerRuntime`](kubelet_api::ContainerRuntime), keeps the pod status
//! cache ([`kubelet_api::PodCache`]) current, and tells the engine which pods changed through
//! [`PodLifecycleEvent`](kubelet_api::PodLifecycleEvent)s (`ContainerStarted`, `ContainerDied`,
//! `ContainerRemoved`). Start with [`GenericPleg`]: the kubelet's relist PLEG, which lists every
//! sandbox and container once per second, diffs the result against the previous list, inspects
//! the pods that changed, and publishes their statuses. A dead container is therefore noticed
//! within about one relist period rather than at the next one-minute resync.
//!
//! It is usable without the engine: run it, read its events from the receiver its constructor
//! returned, and read the cache.
//!
//! ```no_run
//! use std::sync::Arc;
//! use kubelet_api::{ContainerRuntime, PodLifecycleEventGenerator};
//! use kubelet_pleg::{GenericPleg, GenericPlegConfig};
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn example(runtime: Arc<dyn ContainerRuntime>) {
//! let (pleg, mut events) = GenericPleg::new(runtime, GenericPlegConfig::default());
//! let pleg = Arc::new(pleg);
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
//! [`EventedPleg`] is the kubelet's `EventedPLEG` feature: the runtime's pushed container events
//! ([`ContainerRuntime::container_events`](kubelet_api::ContainerRuntime::container_events))
//! drive inspections, the relist runs every 300 s as the safety net, and repeated stream failures
//! fall back to the 1 s relist until the stream works again.
//!
//! Semantics follow the upstream kubelet's `pkg/kubelet/pleg/generic.go` and `evented.go`; where
//! this crate differs (concurrent, time-bounded inspections that never stall a relist; pending
//! cache entries; events as hints followed by an inspection) the items say so.

#![forbid(unsafe_code)]

mod core;
mod diff;
mod error;
mod evented;
mod generic;
mod metrics;
mod select;

pub use crate::core::{PlegDiagnosis, SlowPod};
pub use error::PlegError;
pub use evented::{
    EVENTED_PLEG_MAX_STREAM_RETRIES, EVENTED_RELIST_PERIOD, EVENTED_RELIST_THRESHOLD, EventedPleg,
    EventedPlegConfig, GLOBAL_CACHE_UPDATE_PERIOD, PlegMode,
};
pub use generic::{
    DEFAULT_INSPECT_TIMEOUT, DEFAULT_INSPECTION_WAIT, DEFAULT_MAX_CONCURRENT_INSPECTIONS,
    GENERIC_PLEG_RELIST_PERIOD, GENERIC_PLEG_RELIST_THRESHOLD, GenericPleg, GenericPlegConfig,
    RelistReport,
};
pub use metrics::PlegMetrics;
pub use select::{PlegKind, new_pleg};
