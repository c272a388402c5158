//! The admission and eviction seams.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodCondition};

/// Decision of one admission handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmitResult {
    /// Whether the pod may run.
    pub admit: bool,
    /// Machine-readable reason when rejected (`Evicted`, `OutOfpods`, …).
    pub reason: String,
    /// Human-readable message when rejected.
    pub message: String,
}

impl AdmitResult {
    /// Admit the pod.
    pub fn admit() -> Self {
        Self {
            admit: true,
            reason: String::new(),
            message: String::new(),
        }
    }

    /// Reject the pod with `reason` and `message`.
    pub fn reject(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            admit: false,
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// Decides whether a new pod may run on this node.
///
/// The admission and eviction seams.
///
/// Admission: every handler sees a pod before it is started; one rejection fails the pod with the
/// handler's reason and message, as the kubelet's `canAdmitPod`. Eviction: an eviction manager
/// kills pods through [`AgentHandle::kill_pod`](crate::AgentHandle::kill_pod) with
/// [`KillPodOptions`].
pub trait PodAdmitHandler: Send + Sync + 'static {
    /// Decide for `pod`, given the pods already admitted and not terminated (shared with the
    /// pod workers, not copied for each decision).
    fn admit(&self, pod: &Pod, active_pods: &[Arc<Pod>]) -> AdmitResult;
}

fn _assert_admit_dyn(_: &dyn PodAdmitHandler) {}

/// How to kill a pod from outside the sync loop (eviction, preemption).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KillPodOptions {
    /// Grace period override in seconds; it can only shorten the pod's own.
    pub grace_period_override: Option<i64>,
    /// Mark the pod evicted: it ends `Failed` with `reason` and `message` and is not restarted.
    pub evict: bool,
    /// Reason written to the pod status (`Evicted`).
    pub reason: String,
    /// Message written to the pod status.
    pub message: String,
    /// An extra condition to publish with the terminal status (`DisruptionTarget`).
    pub condition: Option<PodCondition>,
}
