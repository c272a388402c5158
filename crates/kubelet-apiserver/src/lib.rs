//! `kubelet-apiserver`: joins a kubelet SDK agent to a Kubernetes cluster through a real API
//! server, with `kube` (kube-rs). It is the only crate of the SDK that depends on kube-rs.
//!
//! What it does, as the Go kubelet does it:
//!
//! * **node registration and status** ([`node`]): creates the Node (`--register-node`) with
//!   capacity, allocatable, addresses, node info, daemon endpoints and the kubelet's labels, and
//!   keeps its conditions current (Ready with the reason when not ready; the plugins' node
//!   conditions, such as eviction's pressure conditions, and node resources, such as the stats
//!   plugin's capacity: `AgentPlugin::node_conditions` / `node_resources`);
//! * **the node Lease** ([`lease`]) in `kube-node-lease`, renewed every 10 s;
//! * **the pod source** ([`ApiPodSource`], source `api`): pods with `spec.nodeName=<node>`,
//!   watched with kube-runtime, delivered as snapshots; pods keep running while the API server
//!   is away;
//! * **the status sink** ([`ApiStatusSink`]): strategic-merge patches of pod status with a UID
//!   precondition, deletion of finished pods after a graceful deletion, events with the kubelet's
//!   rate limits ([`events`]), and mirror pods for static pods ([`mirror`]);
//! * **ConfigMaps and Secrets** ([`objects`]): [`ApiObjects`], the agent's
//!   [`ObjectProvider`](kubelet_api::ObjectProvider) for env references and `configMap` /
//!   `secret` volumes (GETs with the node's credentials and a TTL cache);
//! * **edge autonomy** ([`checkpoint`]): the pods and the objects they use kept under the root
//!   directory, served when the agent starts while the API server is unreachable, replaced by
//!   the live list (same UID, same containers) when it returns;
//! * **the kubelet API's webhook authentication and authorization** ([`review`]):
//!   `TokenReview` and `SubjectAccessReview` implementations of `kubelet-server`'s
//!   [`TokenAuthenticator`](kubelet_server::TokenAuthenticator) and
//!   [`Authorizer`](kubelet_server::Authorizer).
//!
//! Start with [`ApiServer`]: build it from a kubeconfig and add it to the agent as a plugin
//! ([`KubeletBuilder::plugin`](kubelet_core::KubeletBuilder::plugin)); it contributes the pod
//! source, the status sink and the object provider, and the agent runs its node loops. Nothing
//! here exits or panics on API errors: every loop logs and retries.
//!
//! ```no_run
//! use std::sync::Arc;
//! use kubelet_apiserver::{ApiServer, ApiServerConfig};
//! use kubelet_core::{KubeletBuilder, KubeletConfig};
//! use kubelet_api::{ContainerRuntime, PlegEvents, PodLifecycleEventGenerator};
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn agent(runtime: Arc<dyn ContainerRuntime>, pleg: Arc<dyn PodLifecycleEventGenerator>,
//! #     pleg_events: PlegEvents) -> Result<(), Box<dyn std::error::Error>> {
//! let api = ApiServer::from_kubeconfig(
//!     std::path::Path::new("/etc/kubernetes/kubelet.conf"),
//!     "node-1",
//!     ApiServerConfig::default().root_dir("/var/lib/kubelet"),
//! )
//! .await?;
//! let kubelet = KubeletBuilder::new("node-1")
//!     .config(KubeletConfig::with_dirs("/var/lib/kubelet", "/var/log/pods"))
//!     .runtime(runtime)
//!     .pleg(pleg, pleg_events)
//!     .plugin(Arc::new(api))
//!     .build()?;
//! kubelet.run(CancellationToken::new()).await;
//! # Ok(()) }
//! ```
//!
//! The integration runs as this plugin only: its loop needs the agent's handle, recorder and
//! the other plugins' node conditions and resources, which the plugin context brings.
#![forbid(unsafe_code)]

mod agent;
pub mod certificate;
pub mod checkpoint;
pub mod config;
pub mod error;
pub mod events;
pub mod kubeconfig;
pub mod lease;
pub mod machine;
pub mod mirror;
pub mod node;
pub mod objects;
pub mod patch;
mod plugin;
pub mod review;
pub mod services;
pub mod sink;
pub mod source;
mod wire;

pub use agent::{ApiServer, MAX_RETRY, client_from_kubeconfig};
pub use config::{ApiServerConfig, KUBELET_VERSION, parse_node_labels, parse_taints};
pub use error::ApiServerError;
pub use node::NodeStatusInputs;
pub use objects::{ApiObjects, ChangeDetection};
pub use review::{SubjectAccessReviewAuthorizer, TokenReviewAuthenticator};
pub use services::ServiceCache;
pub use sink::ApiStatusSink;
pub use source::ApiPodSource;

/// Re-export of the `kube` crate this integration is built on.
pub use kube;
