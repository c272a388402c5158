//! [`DeferredPods`]: a [`PodControl`] whose target is set after construction.

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use kubelet_core::KillPodOptions;

use crate::error::EvictionError;
use crate::manager::PodControl;
use crate::stats::ActivePod;

/// A [`PodControl`] set once, later: the engine needs the manager's admission handler before it
/// is built, and the manager needs the engine's handle after. Until set, there are no pods.
#[derive(Clone, Default)]
pub struct DeferredPods {
    inner: Arc<OnceLock<Arc<dyn PodControl>>>,
}

impl std::fmt::Debug for DeferredPods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeferredPods")
            .field("set", &self.inner.get().is_some())
            .finish()
    }
}

impl DeferredPods {
    /// An unset target.
    pub fn new() -> Self {
        Self::default()
    }

    /// Set the target; returns false if it was already set.
    pub fn set(&self, target: Arc<dyn PodControl>) -> bool {
        self.inner.set(target).is_ok()
    }
}

#[async_trait]
impl PodControl for DeferredPods {
    async fn active_pods(&self) -> Vec<ActivePod> {
        match self.inner.get() {
            Some(t) => t.active_pods().await,
            None => Vec::new(),
        }
    }

    async fn kill_pod(&self, pod: &Pod, options: KillPodOptions) -> Result<(), EvictionError> {
        match self.inner.get() {
            Some(t) => t.kill_pod(pod, options).await,
            None => Err(EvictionError::KillPod {
                uid: kubelet_core::pod::uid(pod).to_string(),
            }),
        }
    }
}
