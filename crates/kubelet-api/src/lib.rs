//! `kubelet-api`: the seams of the kubelet SDK, for those who implement them.
//!
//! A container runtime for your own sandbox, a pod source, a status sink, a volume plugin, a
//! ConfigMap/Secret provider or a subsystem plugged into the agent depends on this crate alone.
//! It holds:
//!
//! * the **traits** outsiders implement: [`ContainerRuntime`] (CRI-shaped, container level) and
//!   its optional [`StreamingRuntime`] and [`ImageService`], [`PodSource`], [`StatusSink`], [`VolumePlugin`],
//!   [`ObjectProvider`], [`AgentPlugin`] with what its [`PluginContext`] exposes
//!   ([`AgentHandle`]), and the subsystem seams [`PodLifecycleEventGenerator`],
//!   [`ProbeManager`] and [`PodAdmitHandler`];
//! * the **runtime model** ([`runtime`]) with the kubelet's labels and annotations, so a
//!   restarted agent adopts running containers instead of recreating them;
//! * [`Error`]/[`ErrorKind`], events ([`EventRecorder`]), the pod status cache the PLEG fills
//!   ([`PodCache`]), the statuses the engine publishes ([`StatusReader`]) and pod helpers
//!   ([`pod`]);
//! * with the `conformance` feature, the runtime conformance kit (`kubelet_api::conformance`).
//!
//! It speaks no wire protocol (no HTTP, TLS, gRPC, Kubernetes client or YAML) and holds no
//! engine: the engine (`kubelet-core`) and every subsystem crate build on it. An implementation
//! is plugged into an agent through the engine's builder (`KubeletBuilder::status_sink`,
//! `runtime`, `pod_source`, `plugin`, …, or the facade's `AgentBuilder`):
//!
//! ```
//! use kubelet_api::k8s_openapi::api::core::v1::{Pod, PodStatus};
//! use kubelet_api::{Result, StatusSink, pod};
//!
//! /// Logs every phase change; `KubeletBuilder::new(node).status_sink(Arc::new(PhaseLog))`.
//! struct PhaseLog;
//!
//! #[async_trait::async_trait]
//! impl StatusSink for PhaseLog {
//!     async fn update_pod_status(&self, p: &Pod, status: &PodStatus) -> Result<()> {
//!         tracing::info!(pod = %pod::full_name(p), phase = ?status.phase, "status");
//!         Ok(())
//!     }
//! }
//! ```
//! Every item has
//! one path: the flat re-exports below for the traits and their companions, the modules
//! [`runtime`], [`pod`], [`sources`], [`annotations`], [`objects`] and [`stats`] (the
//! Summary model and the [`StatsService`](stats::StatsService) plugins share) for the rest.
#![forbid(unsafe_code)]

// Namespaces: items reached by their module path.
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod cri_log;
pub mod objects;
pub mod pod;
pub mod quantity;
pub mod resources;
pub mod runtime;
pub mod sort;
pub mod stats;

mod admission;
mod cache;
mod container_runtime;
mod error;
mod event;
mod images;
mod pleg;
mod plugin;
mod probe;
mod reclaim;
mod services;
mod sink;
mod source;
mod status;
mod streaming;
mod volume;

pub use admission::{AdmitResult, KillPodOptions, PodAdmitHandler};
pub use cache::{CacheEntry, PodCache, PodCacheWriter, pod_cache};
pub use container_runtime::ContainerRuntime;
pub use error::{Error, ErrorChain, ErrorKind, Result, chain};
pub use event::{Event, EventRecorder, EventType, InvolvedObject};
pub use images::{ImageService, image_fs_info_of};
pub use objects::{Lookup, ObjectProvider, ReferencedObjects, StaticObjects};
pub use pleg::{
    PLEG_CHANNEL_CAPACITY, PlegEvents, PlegHealth, PodLifecycleEvent, PodLifecycleEventGenerator,
    PodLifecycleEventType,
};
pub use plugin::{
    AgentDirs, AgentHandle, AgentPlugin, MAX_NODE_CONDITIONS, NodeConditionReader, NodeResources,
    NotRunning, PLUGIN_STOP_GRACE, PluginContext, PluginState, PluginStatus, SyncLoopStalled,
    merge_node_conditions,
};
pub use probe::{ProbeContext, ProbeManager, ProbeResult, ProbeType, ProbeUpdate, ProbeUpdates};
pub use reclaim::NodeReclaimer;
pub use services::{ServiceConflict, Services};
pub use sink::StatusSink;
pub use source::{
    NameIndex, PodOp, PodSource, PodUpdate, SourceClosed, SourceSender, SourceSnapshot,
    annotations, is_marked_seen, mark_seen, sources,
};
pub use status::{PodWithStatus, StatusReader, StatusWriter};
pub use streaming::{
    DuplexStream, ExecSession, PortDialer, PortForwardEndpoint, StreamEndpoint, StreamOptions,
    StreamReader, StreamWriter, StreamingRuntime, TerminalSize,
};
pub use volume::VolumePlugin;

/// Re-export of the Kubernetes API types the SDK is built on.
pub use k8s_openapi;
/// Re-export of the metrics library whose `Registry` the SDK's metrics are registered in.
pub use prometheus_client;
