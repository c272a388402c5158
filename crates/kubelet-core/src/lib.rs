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
//! tests.
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

pub mod actions;
pub mod admission;
pub mod atomic_writer;
pub mod backoff;
pub mod builder;
pub mod cache;
pub mod config;
pub mod configuration;
pub mod container;
pub mod dns;
pub mod duration;
pub mod error;
pub mod event;
pub mod hosts;
pub mod http;
pub mod kubelet;
pub mod layer;
pub mod listener;
pub mod merge;
pub mod object_volumes;
pub mod objects;
pub mod pleg;
pub mod plugin;
pub mod pod;
pub mod probe;
pub mod quantity;
pub mod runtime;
pub mod services;
pub mod sink;
pub mod status_gen;
pub mod status_manager;
mod sync;
#[cfg(feature = "testing")]
pub mod testing;
pub mod volume;
mod worker;

pub use admission::{AdmitResult, KillPodOptions, PodAdmitHandler};
pub use builder::{KubeletBuilder, KubeletConfig, KubeletHandle, NotRunning};
pub use cache::{PodCache, PodCacheWriter, pod_cache};
pub use config::{PodOp, PodSource, PodUpdate, SourceSender, SourceSnapshot};
pub use configuration::KubeletConfiguration;
pub use error::{Error, ErrorKind, KubeletError, Result};
pub use event::{Event, EventRecorder, EventType, InvolvedObject};
pub use kubelet::Kubelet;
pub use layer::RuntimeLayer;
pub use merge::{PodConfig, PodStorage};
pub use objects::{ObjectProvider, StaticObjects};
pub use pleg::{PlegHealth, PodLifecycleEvent, PodLifecycleEventGenerator, PodLifecycleEventType};
pub use plugin::{AgentPlugin, NodeConditionReader, PluginContext, PluginState, PluginStatus};
pub use probe::{ProbeContext, ProbeManager, ProbeResult, ProbeType, ProbeUpdate};
pub use runtime::{
    ContainerEvent, ContainerEventKind, ContainerEventStream, ContainerRuntime, PodRuntimeStatus,
    RuntimePod,
};
pub use sink::StatusSink;
pub use status_gen::{StatusInput, generate_pod_status, get_phase};
pub use status_manager::{StatusManager, StatusReader};
pub use volume::VolumePlugin;

/// Re-export of the Kubernetes API types the SDK is built on.
pub use k8s_openapi;
/// Re-export of the metrics library whose `Registry` the SDK's metrics are registered in.
pub use prometheus_client;
