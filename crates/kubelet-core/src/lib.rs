//! `kubelet-core`: the vocabulary and the engine of the kubelet SDK.
//!
//! This crate holds what every other crate of the SDK plugs into:
//!
//! * the **traits** outsiders implement: [`ContainerRuntime`] (CRI-shaped, container level),
//!   [`PodSource`], [`StatusSink`], [`VolumePlugin`], [`ObjectProvider`] (ConfigMaps and
//!   Secrets), and the subsystem seams
//!   [`PodLifecycleEventGenerator`], [`ProbeManager`], [`PodAdmitHandler`];
//! * the **runtime model** ([`runtime`]) with the kubelet's labels and annotations, so a restarted
//!   agent adopts running containers instead of recreating them;
//! * the **engine**: the pod config merge ([`merge`]), the sync loop and one worker task per pod
//!   ([`Kubelet`]), the pure decision function [`actions::compute_pod_actions`], CrashLoopBackOff
//!   ([`backoff`]), status generation ([`status_gen`]) and the [`StatusManager`];
//! * the [`KubeletBuilder`] that assembles them.
//!
//! Start with [`KubeletBuilder`]. Nothing here spawns work behind the host's back: the agent is
//! the future returned by [`Kubelet::run`], stopped by a cancellation token, and stopping it
//! leaves pods running. The `testing` feature adds in-memory doubles (`FakeRuntime`,
//! `RecordingSink`) and a fault-injecting runtime wrapper (`FaultyRuntime`) for embedders' own
//! tests. The `tls` feature (default) gives [`http`] HTTPS (rustls); without it an `https`
//! request fails with an error saying so.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use kubelet_core::k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
//! use kubelet_core::testing::{FakeRuntime, RecordingSink};
//! use kubelet_core::{KubeletBuilder, KubeletConfig, PodSource, SourceSender};
//! use tokio_util::sync::CancellationToken;
//!
//! /// A source with one fixed pod.
//! struct OnePod(Pod);
//!
//! #[async_trait::async_trait]
//! impl PodSource for OnePod {
//!     fn name(&self) -> &str { "file" }
//!     async fn run(&self, out: SourceSender, shutdown: CancellationToken) {
//!         let _ = out.snapshot(vec![self.0.clone()]).await;
//!         shutdown.cancelled().await;
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), kubelet_core::KubeletError> {
//! let mut pod = Pod {
//!     spec: Some(PodSpec {
//!         containers: vec![Container { name: "app".into(), image: Some("busybox".into()), ..Default::default() }],
//!         host_network: Some(true),
//!         ..Default::default()
//!     }),
//!     ..Default::default()
//! };
//! pod.metadata.name = Some("demo".into());
//! pod.metadata.uid = Some("uid-1".into());
//!
//! let runtime = Arc::new(FakeRuntime::new());
//! let pleg = Arc::new(kubelet_pleg::GenericPleg::new(runtime.clone(), Default::default()));
//! let sink = Arc::new(RecordingSink::new());
//! let dir = std::env::temp_dir().join("kubelet-core-doc");
//! let kubelet = KubeletBuilder::new("node-1")
//!     .config(KubeletConfig::with_dirs(dir.join("root"), dir.join("logs")))
//!     .runtime(runtime)
//!     .pleg(pleg)
//!     .pod_source(Arc::new(OnePod(pod)))
//!     .status_sink(sink.clone())
//!     .build()?;
//! let shutdown = CancellationToken::new();
//! let agent = tokio::spawn(kubelet.run(shutdown.clone()));
//!
//! let running = sink
//!     .wait_for(|r| r.status.phase.as_deref() == Some("Running"), Duration::from_secs(30))
//!     .await;
//! assert!(running.is_some());
//! shutdown.cancel();
//! let _ = agent.await;
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]

// Namespaces: items reached by their module path.
pub mod actions;
pub mod atomic_writer;
pub mod backoff;
pub mod configuration;
pub mod container;
pub mod dns;
pub mod downward;
pub mod duration;
pub mod hosts;
pub mod http;
pub mod layer;
pub mod listener;
pub mod merge;
pub mod object_volumes;
pub mod pod;
pub mod quantity;
pub mod runtime;
pub mod services;
pub mod status_gen;
#[cfg(feature = "testing")]
pub mod testing;

// The engine and the seams: every public item is re-exported below, so each has one path.
mod admission;
mod builder;
mod cache;
mod config;
mod container_runtime;
mod error;
mod event;
mod kubelet;
mod objects;
mod pleg;
mod plugin;
mod pod_start;
mod probe;
mod sink;
mod status_manager;
mod streaming;
mod sync;
mod volume;
mod worker;

pub use admission::{AdmitResult, KillPodOptions, PodAdmitHandler};
pub use builder::{
    KubeletBuilder, KubeletConfig, KubeletHandle, NotRunning, container_log_dir_for,
};
pub use cache::{CacheEntry, PodCache, PodCacheWriter, pod_cache};
pub use config::{
    PodOp, PodSource, PodUpdate, SourceClosed, SourceSender, SourceSnapshot, annotations, sources,
};
pub use container_runtime::ContainerRuntime;
pub use error::{Error, ErrorKind, KubeletError, Result};
pub use event::{Event, EventRecorder, EventType, InvolvedObject};
pub use kubelet::Kubelet;
pub use objects::{EnvObjects, Lookup, ObjectProvider, ReferencedObjects, StaticObjects};
pub use pleg::{
    PLEG_CHANNEL_CAPACITY, PlegHealth, PodLifecycleEvent, PodLifecycleEventGenerator,
    PodLifecycleEventType,
};
pub use plugin::{
    AgentPlugin, NodeConditionReader, PLUGIN_STOP_GRACE, PluginContext, PluginState, PluginStatus,
};
pub use probe::{ProbeContext, ProbeManager, ProbeResult, ProbeType, ProbeUpdate};
pub use sink::StatusSink;
pub use status_manager::{
    MAX_POD_TERMINATION_MESSAGE_LENGTH, PodWithStatus, SYNC_PERIOD, StatusManager, StatusReader,
    normalize_status,
};
pub use streaming::{
    DuplexStream, ExecSession, PortDialer, PortForwardEndpoint, StreamEndpoint, StreamOptions,
    StreamReader, StreamWriter, StreamingRuntime, TerminalSize,
};
pub use volume::{EmptyDirPlugin, HostPathPlugin, VolumePlugin};

/// Re-export of the Kubernetes API types the SDK is built on.
pub use k8s_openapi;
/// Re-export of the metrics library whose `Registry` the SDK's metrics are registered in.
pub use prometheus_client;
