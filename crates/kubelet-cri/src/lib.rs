//! `kubelet-cri`: run pods on containerd (or any CRI v1 runtime) with the kubelet SDK.
//!
//! [`CriRuntime`] implements [`kubelet_api::ContainerRuntime`] over CRI v1 (`runtime.v1`)
//! `RuntimeService` and `ImageService`, with tonic over a unix socket. Hand it to
//! [`KubeletBuilder::runtime`](kubelet_core::KubeletBuilder::runtime) and the engine runs pods on
//! the runtime: sandboxes (host network or the runtime's CNI pod network), image pulls, containers
//! with mounts, resources and security settings, exec, stats, and garbage collection of dead
//! containers, and container lifecycle events for an evented PLEG ([`events`]: CRI
//! `GetContainerEvents`, or containerd 1.6's native task events).
//!
//! Start with [`CriConfig::new`] and [`CriRuntime::connect`]. Every call has a deadline
//! ([`CriConfig::request_timeout`], 2 minutes as the kubelet's `runtimeRequestTimeout`);
//! failures carry the core [`ErrorKind`](kubelet_api::ErrorKind)s (`NotFound`, `Unavailable`,
//! `DeadlineExceeded`, …). The connection is remade when the runtime restarts.
//!
//! The wire types are generated in-tree ([`proto`]): building needs no `protoc`.
//!
//! ```no_run
//! use std::sync::Arc;
//! use kubelet_api::ContainerRuntime;
//! use kubelet_cri::{CriConfig, CriRuntime};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let runtime = CriRuntime::connect(
//!     CriConfig::new("unix:///run/containerd/containerd.sock")
//!         .termination_message_dir("/var/lib/kubelet/pods"),
//! )
//! .await?;
//! let status = runtime.status().await?;
//! println!("{:?}", status.conditions);
//! let runtime: Arc<dyn ContainerRuntime> = Arc::new(runtime);
//! // kubelet_core::KubeletBuilder::new("node-1").runtime(runtime)…
//! # drop(runtime);
//! # Ok(())
//! # }
//! ```
//!
//! Tests run against a private containerd started by `scripts/containerd-test-env.sh`.

mod convert;
pub mod error;
pub mod events;
pub mod exits;
mod metrics;
pub mod own;
pub mod proto;
mod runtime;

pub use error::CriError;
pub use runtime::{
    CRI_API_VERSION, CriConfig, CriRuntime, DEFAULT_ENDPOINT, SandboxImageCheck, socket_path,
};
