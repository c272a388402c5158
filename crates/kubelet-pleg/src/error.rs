//! [`PlegError`]: what can go wrong in a relist.

use std::time::Duration;

/// Failure of a relist or of one pod's inspection within it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlegError {
    /// Listing sandboxes and containers failed; the relist was abandoned and the PLEG's last
    /// relist time was not advanced (it turns unhealthy if this persists past the threshold).
    #[error("listing pods from the container runtime failed")]
    ListPods {
        /// The runtime's error.
        #[source]
        source: kubelet_api::Error,
    },
    /// Inspecting one changed pod failed; its error is cached and it is inspected again at the
    /// next relist.
    #[error("inspecting pod {uid} failed")]
    InspectPod {
        /// Pod UID.
        uid: String,
        /// The runtime's error.
        #[source]
        source: kubelet_api::Error,
    },
    /// Inspecting one changed pod took longer than the per-pod inspection timeout; handled like
    /// [`PlegError::InspectPod`].
    #[error("inspecting pod {uid} timed out after {timeout:?}")]
    InspectTimeout {
        /// Pod UID.
        uid: String,
        /// The timeout that expired.
        timeout: Duration,
    },
}

impl PlegError {
    /// UID of the pod the error is about, for per-pod failures.
    pub fn pod_uid(&self) -> Option<&str> {
        match self {
            PlegError::ListPods { .. } => None,
            PlegError::InspectPod { uid, .. } | PlegError::InspectTimeout { uid, .. } => Some(uid),
        }
    }
}
