//! `kubelet-core`: the engine of the kubelet SDK.
//!
//! The engine runs pods on any [`ContainerRuntime`](kubelet_api::ContainerRuntime) with the
//! kubelet's behaviour; the seams it plugs together (the runtime, pod sources, status sinks,
//! volume plugins, the object provider, agent plugins, the PLEG, prober and admission) live in
//! the seam crate `kubelet-api`, which an implementor depends on alone. This crate holds:
//!
//! * the pod config merge ([`merge`]), the sync loop and one worker task per pod ([`Kubelet`]),
//!   the pure decision function `compute_pod_actions`, CrashLoopBackOff, status generation
//!   ([`status_gen`]) and the [`StatusManager`];
//! * volumes (`emptyDir`, `hostPath`, ConfigMap, Secret, downward API and projected volumes,
//!   registered by the builder; [`EmptyDirPlugin`] and [`HostPathPlugin`] can be configured),
//!   the pod's cluster environment ([`dns`], `/etc/hosts`, [`services`], the downward API) and
//!   container configs ([`container`]);
//! * runtime layers ([`layer`]), the typed [`configuration::KubeletConfiguration`];
//! * the [`KubeletBuilder`] that assembles them, and [`KubeletHandle`], the running agent's
//!   [`AgentHandle`](kubelet_api::AgentHandle).
//!
//! Start with [`KubeletBuilder`]. Nothing here spawns work behind the host's back: the agent is
//! the future returned by [`Kubelet::run`], stopped by a cancellation token, and stopping it
//! leaves pods running. The `testing` feature adds in-memory doubles (`FakeRuntime`,
//! `RecordingSink`) and a fault-injecting runtime wrapper (`FaultyRuntime`) for embedders' own
//! tests. The `tls` feature (default) gives `httpGet` hooks HTTPS (rustls, through `kubelet-net`); without it an `https`
//! request fails with an error saying so.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use kubelet_core::k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
//! use kubelet_core::testing::{FakeRuntime, RecordingSink};
//! use kubelet_core::{KubeletBuilder, KubeletConfig};
//! use kubelet_api::{PodSource, SourceSender};
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
//! let (pleg, pleg_events) = kubelet_pleg::GenericPleg::new(runtime.clone(), Default::default());
//! let sink = Arc::new(RecordingSink::new());
//! let dir = std::env::temp_dir().join("kubelet-core-doc");
//! let kubelet = KubeletBuilder::new("node-1")
//!     .config(KubeletConfig::with_dirs(dir.join("root"), dir.join("logs")))
//!     .runtime(runtime)
//!     .pleg(Arc::new(pleg), pleg_events)
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
pub mod configuration;
pub mod container;
pub mod credentials;
pub mod dns;
pub mod duration;
pub mod layer;
pub mod merge;
pub mod services;
pub mod status_gen;
#[cfg(feature = "testing")]
pub mod testing;

// The engine: every public item is re-exported below, so each has one path. `actions`
// (`compute_pod_actions`), `backoff`, the object volumes with their atomic writer and the
// downward API's values, and `/etc/hosts` have no user outside the engine.
mod actions;
mod agent_config;
mod atomic_writer;
mod backoff;
mod builder;
mod downward;
mod env_objects;
mod error;
mod handle;
mod hosts;
mod image_pull;
mod kubelet;
pub mod node_shutdown;
mod object_volumes;
mod plugin;
mod pod_start;
mod status_manager;
mod sync;
mod volume;
mod worker;

pub use agent_config::{KubeletConfig, container_log_dir_for};
pub use builder::KubeletBuilder;
pub use env_objects::EnvObjects;
pub use error::KubeletError;
pub use handle::KubeletHandle;
pub use image_pull::PullLimits;
pub use kubelet::Kubelet;
pub use status_manager::{
    MAX_POD_TERMINATION_MESSAGE_LENGTH, SYNC_PERIOD, StatusManager, normalize_status,
};
pub use volume::{EmptyDirPlugin, HostPathPlugin};

/// Re-export of the Kubernetes API types the SDK is built on.
pub use k8s_openapi;
/// Re-export of the metrics library whose `Registry` the SDK's metrics are registered in.
pub use prometheus_client;
