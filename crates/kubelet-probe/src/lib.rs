//! `kubelet-probe`: liveness, readiness and startup probes (exec, HTTP(S), TCP, gRPC) with the
//! kubelet's semantics, driven by one scheduler instead of one task and ticker per probe.
//!
//! Start with [`Prober`]:
//!
//! * **With the engine**, hand it to `KubeletBuilder::prober`: it implements
//!   [`kubelet_api::ProbeManager`], reads pod statuses from the status manager and runs exec
//!   probes through the runtime's `exec_sync`. Readiness then drives `ready` and the pod's
//!   Ready conditions; liveness and startup failures make the engine restart the container.
//! * **Alone**, register probes ([`Prober::add_pod`] with a Kubernetes pod, or
//!   [`Prober::add_probe`] with a [`ProbeSpec`]), tell it about containers through a
//!   [`ProbeTargets`] (for example [`StaticTargets`]), run [`Prober::run_with`] and read the
//!   changes from the receiver [`Prober::new`] returned.
//!
//! How it works: every configured probe is a small worker record in a timer wheel
//! ([`tokio_util::time::DelayQueue`]) of one of a few scheduler tasks ([`ProberConfig::shards`],
//! one per core by default, probes spread by pod) that the future [`Prober::run_with`] runs and
//! stops. When a worker is due, its scheduler observes its container (the kubelet's `doProbe` checks: new container ID
//! resets the result, initial delay, startup gating, hold after a liveness failure, pod
//! deletion) and, if a probe must run, starts its I/O as a short task, at most
//! [`ProberConfig::max_concurrent`] at a time. Results count toward `successThreshold` /
//! `failureThreshold` as in the kubelet; events (`Unhealthy`, `ProbeWarning`) go to the
//! [`EventRecorder`](kubelet_api::EventRecorder) and the metrics `prober_probe_total` and
//! `prober_probe_duration_seconds` to a prometheus-client registry
//! ([`Prober::register_metrics`]).
//!
//! Beyond the kubelet: [`ProberConfig::errors_as_failures`] counts probe errors as failures
//! (the kubelet discards them, so an erroring liveness probe never restarts anything).
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use kubelet_api::{EventRecorder, ProbeResult, ProbeType};
//! use kubelet_probe::{
//!     ContainerObservation, ProbeHandler, ProbeRegistration, ProbeSpec, ProbeTiming, Prober,
//!     ProberConfig,
//!     StaticTargets,
//! };
//! use tokio_util::sync::CancellationToken;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // Something listening, standing in for a container's port.
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
//! let port = listener.local_addr().unwrap().port();
//!
//! let (prober, mut updates) = Prober::new(ProberConfig::default());
//! let spec = ProbeSpec::new(
//!     ProbeHandler::TcpSocket { host: None, port },
//!     ProbeTiming::with_period(Duration::from_secs(1)),
//! );
//! prober.add_probe(ProbeRegistration::new("pod-uid", "app", ProbeType::Readiness, spec));
//!
//! let targets = StaticTargets::new();
//! targets.set(
//!     "pod-uid",
//!     "app",
//!     ContainerObservation::running("c-1", tokio::time::Instant::now(), Some("127.0.0.1".into())),
//! );
//! let shutdown = CancellationToken::new();
//! let run = prober.run_with(Arc::new(targets), EventRecorder::log_only(), shutdown.clone());
//! let watch = async {
//!     // Readiness starts False, then the TCP probe succeeds.
//!     while let Some(u) = updates.recv().await {
//!         if u.result == ProbeResult::Success {
//!             break;
//!         }
//!     }
//!     shutdown.cancel();
//! };
//! tokio::join!(run, watch);
//! assert_eq!(prober.result("c-1", ProbeType::Readiness), Some(ProbeResult::Success));
//! # }
//! ```
#![warn(missing_docs)]

pub mod error;
pub mod handler;
mod metrics;
pub mod prober;
pub mod spec;
pub mod targets;

pub use error::ProbeError;
pub use handler::Outcome;
pub use prober::{
    DEFAULT_USER_AGENT, ProbeRegistration, Prober, ProberConfig, ProberStats, probe_type_name,
};
pub use spec::{ProbeHandler, ProbeSpec, ProbeTiming};
pub use targets::{
    ContainerObservation, ExecFailure, Observation, ProbeTargets, StaticTargets, StatusTargets,
};
