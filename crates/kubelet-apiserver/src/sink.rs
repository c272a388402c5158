//! [`ApiStatusSink`]: pod statuses, finished pods and events to the API server.
//!
//! * The status of an API pod is sent as a strategic-merge patch of `status` with the pod's UID
//!   as precondition, only when it differs from the API's copy (the status manager has already
//!   dropped duplicates and holds terminal phases back until no container runs).
//! * A pod with a `deletionTimestamp` whose status is terminal with no container running is
//!   deleted with grace period 0 and a UID precondition, which lets the API server remove it.
//! * The status of a static pod goes to its mirror pod (UID translated) through the mirror-pod
//!   manager, which also creates and removes mirror pods.
//! * Events are posted rate-limited and aggregated (see [`crate::events`]).

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kubelet_api::pod as podutil;
use kubelet_api::{Event, StatusSink};

use crate::agent::Shared;
use crate::error::{ApiServerError, is_status};
use crate::mirror::delete_pod;
use crate::patch::{StatusWrite, write_pod_status};

/// The API server as a status sink.
#[derive(Clone)]
pub struct ApiStatusSink {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for ApiStatusSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiStatusSink")
            .field("node_name", &self.shared.node_name)
            .finish_non_exhaustive()
    }
}

/// True when the status is terminal and no container may still run: the pod is finished.
pub fn pod_is_finished(status: &PodStatus) -> bool {
    let terminal = matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"));
    let running = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .chain(status.ephemeral_container_statuses.iter().flatten())
        .any(|c| {
            c.state.as_ref().is_some_and(|s| {
                s.running.is_some() || (s.terminated.is_none() && s.waiting.is_none())
            })
        });
    terminal && !running
}

impl ApiStatusSink {
    async fn patch_api_pod(&self, pod: &Pod, status: &PodStatus) -> Result<(), ApiServerError> {
        let result = write_pod_status(
            &self.shared.client,
            podutil::namespace(pod),
            podutil::name(pod),
            podutil::uid(pod),
            pod.status.as_ref(),
            status,
            &self.shared.unknown_status_fields,
        )
        .await;
        match result {
            Ok(StatusWrite::Unchanged) => {
                tracing::trace!(pod = %podutil::full_name(pod), "status unchanged in the API; no patch");
                Ok(())
            }
            Ok(StatusWrite::Patched) => {
                tracing::debug!(pod = %podutil::full_name(pod), phase = status.phase.as_deref().unwrap_or(""), "patched pod status");
                Ok(())
            }
            // Deleted, or replaced by a pod with another UID: nothing to update.
            Err(e) if is_status(&e, 404) || is_status(&e, 409) => {
                tracing::debug!(pod = %podutil::full_name(pod), "pod gone or replaced; status not written: {}", kubelet_api::chain(&e));
                Ok(())
            }
            Err(source) => Err(ApiServerError::PatchPodStatus {
                pod: format!("{}/{}", podutil::namespace(pod), podutil::name(pod)),
                source,
            }),
        }
    }
}

#[async_trait]
impl StatusSink for ApiStatusSink {
    async fn update_pod_status(&self, pod: &Pod, status: &PodStatus) -> kubelet_api::Result<()> {
        if podutil::is_mirror(pod) {
            return Ok(());
        }
        if podutil::is_static(pod) {
            self.shared.mirrors.set_static(pod, Some(status));
            return Ok(());
        }
        self.patch_api_pod(pod, status).await?;
        if podutil::is_deleted(pod) && pod_is_finished(status) {
            delete_pod(&self.shared.client, pod, podutil::uid(pod)).await?;
            tracing::info!(pod = %podutil::full_name(pod), "pod terminated; deleted it from the API server (grace 0)");
        }
        Ok(())
    }

    async fn pod_removed(&self, pod: &Pod) -> kubelet_api::Result<()> {
        if podutil::is_static(pod) {
            self.shared.mirrors.remove_static(pod);
        }
        Ok(())
    }

    async fn record_event(&self, event: &Event) -> kubelet_api::Result<()> {
        self.shared.events.post(&self.shared.client, event).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus,
    };

    fn cs(running: bool) -> ContainerStatus {
        ContainerStatus {
            name: "c".into(),
            state: Some(if running {
                ContainerState {
                    running: Some(ContainerStateRunning::default()),
                    ..Default::default()
                }
            } else {
                ContainerState {
                    terminated: Some(ContainerStateTerminated {
                        exit_code: 137,
                        ..Default::default()
                    }),
                    ..Default::default()
                }
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_pod_is_finished_when_terminal_and_nothing_runs() {
        let mut s = PodStatus {
            phase: Some("Failed".into()),
            container_statuses: Some(vec![cs(false)]),
            ..Default::default()
        };
        assert!(pod_is_finished(&s));
        s.container_statuses = Some(vec![cs(true)]);
        assert!(!pod_is_finished(&s));
        s.phase = Some("Running".into());
        s.container_statuses = Some(vec![cs(false)]);
        assert!(!pod_is_finished(&s));
    }
}
