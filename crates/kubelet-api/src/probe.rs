//! The probe seam: how a prober (the `kubelet-probe` crate, or an embedder's own) feeds liveness,

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::ContainerRuntime;
use crate::status::StatusReader;

/// Probe kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProbeType {
    /// Restart the container when it fails.
    Liveness,
    /// Gate the container's `ready`.
    Readiness,
    /// Gate liveness and readiness until the container has started.
    Startup,
}

/// Probe result as the kubelet's results manager stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProbeResult {
    /// No result yet.
    Unknown,
    /// The probe succeeded (threshold reached).
    Success,
    /// The probe failed (threshold reached).
    Failure,
}

/// A changed probe result for one container instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeUpdate {
    /// Pod UID.
    pub pod_uid: String,
    /// Container name.
    pub container_name: String,
    /// Container ID (the instance the result is about).
    pub container_id: String,
    /// Which probe.
    pub probe_type: ProbeType,
    /// The new result.
    pub result: ProbeResult,
}

/// What the engine hands a prober when it starts it.
#[derive(Clone)]
pub struct ProbeContext {
    /// Current pod statuses (container IDs, start times, pod IPs).
    pub statuses: StatusReader,
    /// The runtime, for exec probes.
    pub runtime: Arc<dyn ContainerRuntime>,
    /// Recorder for the `Unhealthy` and `ProbeWarning` events.
    pub recorder: crate::event::EventRecorder,
}

impl std::fmt::Debug for ProbeContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeContext").finish_non_exhaustive()
    }
}

/// The receiving end of a prober's result changes, returned by the prober's constructor beside
/// the prober (one owner: the engine's builder takes both).
pub type ProbeUpdates = mpsc::Receiver<ProbeUpdate>;

/// A prober the engine drives: it is told which pods exist and reports result changes to the
/// [`ProbeUpdates`] receiver its constructor returned.
///
/// The probe seam: how a prober (the `kubelet-probe` crate, or an embedder's own) feeds liveness,
/// readiness and startup results into the engine.
///
/// Without a prober the engine behaves as the kubelet does for containers without probes: a
/// running container is started and ready.
#[async_trait]
pub trait ProbeManager: Send + Sync + 'static {
    /// A pod is being synced: start workers for its probes (no-op for known pods).
    fn add_pod(&self, pod: &Pod);
    /// A pod is gone: stop all its workers.
    fn remove_pod(&self, pod_uid: &str);
    /// A pod is terminating: stop liveness and startup workers, keep readiness.
    fn stop_liveness_and_startup(&self, pod_uid: &str);
    /// Latest result for a container instance, `None` if it has no such probe.
    fn result(&self, container_id: &str, probe_type: ProbeType) -> Option<ProbeResult>;
    /// Run the probe workers until `shutdown` is cancelled.
    async fn run(&self, ctx: ProbeContext, shutdown: CancellationToken);
    /// Register the prober's metrics (`prober_probe_total`, …) in the agent's registry; called
    /// once by the engine's `KubeletBuilder::build`. The default registers
    /// nothing.
    fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        let _ = registry;
    }
}

fn _assert_probe_dyn(_: &dyn ProbeManager) {}
