//! [`KubeletHandle`]: the running agent's [`AgentHandle`].

use std::sync::Arc;
use std::time::Duration;

use kubelet_api::{
    AgentHandle, KillPodOptions, NotRunning, PlegHealth, PluginStatus, PodLifecycleEventGenerator,
    StatusReader, SyncLoopStalled,
};
use tokio::sync::{mpsc, oneshot};

use crate::kubelet::Command;
use crate::plugin::PluginStates;

/// A cloneable handle to a built agent, the engine's [`AgentHandle`]: read statuses, check
/// health, sync and kill pods (eviction).
#[derive(Clone)]
pub struct KubeletHandle {
    pub(crate) cmd_tx: mpsc::Sender<Command>,
    pub(crate) statuses: StatusReader,
    pub(crate) pleg: Arc<dyn PodLifecycleEventGenerator>,
    pub(crate) plugins: PluginStates,
    pub(crate) metrics: Arc<prometheus_client::registry::Registry>,
    pub(crate) sync_loop: crate::kubelet::SyncLoopMonitor,
    pub(crate) sync_requests: crate::kubelet::SyncRequests,
    pub(crate) conditions: kubelet_api::NodeConditionReader,
}

impl std::fmt::Debug for KubeletHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeletHandle").finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl AgentHandle for KubeletHandle {
    fn statuses(&self) -> StatusReader {
        self.statuses.clone()
    }

    fn pleg_health(&self) -> PlegHealth {
        self.pleg.healthy()
    }

    fn sync_loop_health(&self, threshold: Duration) -> Result<(), SyncLoopStalled> {
        match self.sync_loop.last() {
            Some(t) if t.elapsed() > threshold => Err(SyncLoopStalled {
                since: t.elapsed(),
                threshold,
            }),
            _ => Ok(()),
        }
    }

    fn plugins(&self) -> Vec<PluginStatus> {
        self.plugins.list()
    }

    fn metrics(&self) -> Arc<prometheus_client::registry::Registry> {
        self.metrics.clone()
    }

    fn sync_pod(&self, uid: &str) {
        self.sync_requests.request(uid);
    }

    fn sources_ready(&self) -> bool {
        self.sync_loop.sources_ready()
    }

    fn node_conditions(&self) -> Vec<k8s_openapi::api::core::v1::NodeCondition> {
        self.conditions.conditions()
    }

    async fn kill_pod(&self, uid: &str, options: KillPodOptions) -> Result<(), NotRunning> {
        let (done, wait) = oneshot::channel();
        self.cmd_tx
            .send(Command::KillPod {
                uid: uid.to_string(),
                options,
                done,
            })
            .await
            .map_err(|_| NotRunning)?;
        wait.await.map_err(|_| NotRunning)
    }
}
