//! The API-server integration as an agent plugin.

use std::sync::Arc;

use async_trait::async_trait;
use kubelet_api::{AgentPlugin, ObjectProvider, PluginContext, PodSource, StatusSink};
use kubelet_core::configuration::KubeletConfiguration;
use tokio_util::sync::CancellationToken;

use crate::agent::ApiServer;
use crate::config::ApiServerConfig;
use crate::node::NodeStatusInputs;

/// [`ApiServer`] is the agent plugin `apiserver`: it adds the `api` pod source, the status sink
/// and the ConfigMap/Secret provider ([`ApiObjects`](crate::ApiObjects), kept in the pod
/// checkpoint when [`ApiServerConfig::checkpoint`] is on) at build, and its loop registers the Node,
/// keeps its status current (with every plugin's node conditions, e.g. eviction's pressure
/// conditions) and its Lease renewed, and manages mirror pods. Node events go through the
/// agent's recorder.
#[async_trait]
impl AgentPlugin for ApiServer {
    fn name(&self) -> &str {
        "apiserver"
    }

    fn pod_sources(&self) -> Vec<Arc<dyn PodSource>> {
        vec![self.pod_source()]
    }

    fn status_sinks(&self) -> Vec<Arc<dyn StatusSink>> {
        vec![self.status_sink()]
    }

    fn object_provider(&self) -> Option<Arc<dyn ObjectProvider>> {
        Some(match &self.shared.checkpoint {
            Some(c) => Arc::new(crate::checkpoint::CheckpointedObjects::new(
                self.objects(),
                Arc::clone(c),
            )),
            None => Arc::new(self.objects()),
        })
    }

    fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        for c in self.shared.certificates.read().iter() {
            c.register_metrics(registry);
        }
    }

    async fn run(
        &self,
        ctx: PluginContext,
        shutdown: CancellationToken,
    ) -> kubelet_api::Result<()> {
        *self.shared.recorder.write() = Some(ctx.recorder());
        self.shared.objects.sync_pods_through(ctx.handle());
        let inputs = NodeStatusInputs::new(ctx.runtime())
            .kubelet(ctx.handle())
            .plugins(ctx.node_conditions());
        ApiServer::run(self, inputs, shutdown).await;
        Ok(())
    }
}

impl ApiServerConfig {
    /// The settings of the kubelet's configuration: `registerNode`,
    /// `nodeStatusUpdateFrequency`, `nodeStatusReportFrequency`, `maxPods`,
    /// `configMapAndSecretChangeDetectionStrategy` and the served
    /// `port` (advertised as `daemonEndpoints.kubeletEndpoint.Port`); the rest keep
    /// their defaults (`root_dir` is a flag: set it).
    pub fn from_configuration(c: &KubeletConfiguration) -> Self {
        let mut config = ApiServerConfig::default()
            .register_node(c.register_node)
            .node_status_frequencies(
                c.node_status_update_frequency.as_duration(),
                c.node_status_report_frequency.as_duration(),
            );
        config.max_pods = i64::from(c.max_pods);
        config.register_with_taints = c.register_with_taints.clone();
        // Checked by `ChangeDetection::from_str` where the configuration is loaded; an unknown
        // value keeps the default here.
        if let Ok(strategy) = c.config_map_and_secret_change_detection_strategy.parse() {
            config.change_detection = strategy;
        }
        if c.enable_server && c.port != 0 {
            config.kubelet_port = Some(i32::from(c.port));
        }
        config
    }
}

impl crate::checkpoint::CheckpointConfig {
    /// The checkpoint `podCheckpoint` of the SDK's `AgentConfiguration` asks for (`None` when
    /// it is not `enabled`; `maxAge: 0s` is no limit).
    pub fn from_configuration(
        c: &kubelet_core::configuration::PodCheckpointConfiguration,
    ) -> Option<Self> {
        let max_age = c.max_age.as_duration();
        c.enabled.then(|| {
            Self::default()
                .offline_start_wait(c.offline_start_wait.as_duration())
                .max_age((!max_age.is_zero()).then_some(max_age))
                .max_bytes(c.max_size_bytes)
        })
    }
}
