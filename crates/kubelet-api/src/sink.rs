//! The [`StatusSink`] trait: where pod statuses and events go (the API server, a file, memory).

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Pod, PodStatus};

use crate::error::Result;
use crate::event::Event;

/// Receives every pod status change the status manager decides to publish, and every event.
///
/// Calls for one pod arrive in order; the status manager has already de-duplicated them and keeps
/// terminal phases sticky. A failing sink is retried on the next change and never blocks the
/// engine or other sinks.
#[async_trait]
pub trait StatusSink: Send + Sync + 'static {
    /// The status of `pod` changed to `status`.
    async fn update_pod_status(&self, pod: &Pod, status: &PodStatus) -> Result<()>;
    /// The engine is done with `pod`: it has terminated and left every source.
    /// Sinks that keep per-pod state drop it here; others ignore it.
    async fn pod_removed(&self, pod: &Pod) -> Result<()> {
        let _ = pod;
        Ok(())
    }
    /// An event was recorded. Sinks that do not store events ignore it.
    async fn record_event(&self, event: &Event) -> Result<()> {
        let _ = event;
        Ok(())
    }
}

fn _assert_sink_dyn(_: &dyn StatusSink) {}
