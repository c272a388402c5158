//! `kubelet-apiserver`: joins a kubelet SDK agent to a Kubernetes cluster through a real API
//! server, with `kube` (kube-rs). It is the only crate of the SDK that depends on kube-rs.
//!
//! What it does, as the Go kubelet does it:
//!
//! * **node registration and status** ([`node`]): creates the Node (`--register-node`) with
//!   capacity, allocatable, addresses, node info, daemon endpoints and the kubelet's labels, and
//!   keeps its conditions current (Ready with the reason when not ready; pressure conditions from
//!   a [`NodeConditionSource`] such as the eviction manager);
//! * **the node Lease** ([`lease`]) in `kube-node-lease`, renewed every 10 s;
//! * **the pod source** ([`ApiPodSource`], source `api`): pods with `spec.nodeName=<node>`,
//!   watched with kube-runtime, delivered as snapshots; pods keep running while the API server
//!   is away;
//! * **the status sink** ([`ApiStatusSink`]): strategic-merge patches of pod status with a UID
//!   precondition, deletion of finished pods after a graceful deletion, events with the kubelet's
//!   rate limits ([`events`]), and mirror pods for static pods ([`mirror`]);
//! * **ConfigMaps and Secrets** ([`objects`]): [`ApiObjects`], the agent's
//!   [`ObjectProvider`](kubelet_core::ObjectProvider) for env references and `configMap` /
//!   `secret` volumes (GETs with the node's credentials and a TTL cache).
//!
//! Start with [`ApiServer`]: build it from a kubeconfig, give its pod source and status sink to
//! the [`KubeletBuilder`](kubelet_core::KubeletBuilder), then run [`ApiServer::run`] next to the
//! agent. Nothing here exits or panics on API errors: every loop logs and retries.
//!
//! ```no_run
//! use std::sync::Arc;
//! use kubelet_apiserver::{ApiServer, ApiServerConfig, NodeStatusInputs};
//! use kubelet_core::{ContainerRuntime, KubeletBuilder, KubeletConfig, PodLifecycleEventGenerator};
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn agent(runtime: Arc<dyn ContainerRuntime>, pleg: Arc<dyn PodLifecycleEventGenerator>)
//! #     -> Result<(), Box<dyn std::error::Error>> {
//! let api = ApiServer::from_kubeconfig(
//!     std::path::Path::new("/etc/kubernetes/kubelet.conf"),
//!     "node-1",
//!     ApiServerConfig::default().root_dir("/var/lib/kubelet"),
//! )
//! .await?;
//! let builder = KubeletBuilder::new("node-1")
//!     .config(KubeletConfig::with_dirs("/var/lib/kubelet", "/var/log/pods"));
//! let api = api.with_recorder(builder.recorder()); // NodeReady / NodeNotReady events
//! let kubelet = builder
//!     .runtime(runtime.clone())
//!     .pleg(pleg)
//!     .pod_source(api.pod_source())
//!     .status_sink(api.status_sink())
//!     .build()?;
//! let inputs = NodeStatusInputs::new(runtime).kubelet(kubelet.handle());
//! let shutdown = CancellationToken::new();
//! let node = tokio::spawn({
//!     let shutdown = shutdown.clone();
//!     async move { api.run(inputs, shutdown).await }
//! });
//! kubelet.run(shutdown.clone()).await;
//! let _ = node.await;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

mod agent;
pub mod config;
pub mod error;
pub mod events;
pub mod lease;
pub mod machine;
pub mod mirror;
pub mod node;
pub mod objects;
pub mod patch;
pub mod sink;
pub mod source;

pub use agent::{ApiServer, MAX_RETRY, client_from_kubeconfig};
pub use config::{ApiServerConfig, KUBELET_VERSION, parse_node_labels};
pub use error::ApiServerError;
pub use node::{NodeConditionSource, NodeStatusInputs};
pub use objects::ApiObjects;
pub use sink::ApiStatusSink;
pub use source::ApiPodSource;

/// Re-export of the `kube` crate this integration is built on.
pub use kube;
