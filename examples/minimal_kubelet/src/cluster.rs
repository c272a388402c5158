//! `--kubeconfig` and the flags that go with it: joining a cluster through its API server
//! (`kubelet-apiserver`). Without `--kubeconfig` the agent stays standalone.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use kubelet_apiserver::{ApiServer, ApiServerConfig, NodeStatusInputs, parse_node_labels};
use kubelet_core::k8s_openapi::api::core::v1::NodeCondition;
use kubelet_core::{ContainerRuntime, KubeletHandle};

/// The kubelet's API server flags.
#[derive(Debug, clap::Args)]
pub(crate) struct ClusterFlags {
    /// Kubeconfig with the API server and this node's credentials (token or client
    /// certificate). Unset: standalone, pods come only from the other sources.
    #[arg(long = "kubeconfig")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// Create the Node object when it does not exist.
    #[arg(long = "register-node", default_value_t = true, action = clap::ArgAction::Set)]
    register_node: bool,
    /// Labels added when the node registers, `key=value,key2=value2`.
    #[arg(long = "node-labels", default_value = "")]
    node_labels: String,
    /// The node's InternalIP (default: the address of the default route).
    #[arg(long = "node-ip")]
    node_ip: Option<String>,
    /// How often the node status is computed and posted when it changed.
    #[arg(long = "node-status-update-frequency", default_value = "10s", value_parser = crate::parse_duration)]
    node_status_update_frequency: Duration,
    /// How often the node status is posted even when nothing changed.
    #[arg(long = "node-status-report-frequency", default_value = "5m", value_parser = crate::parse_duration)]
    node_status_report_frequency: Duration,
}

/// The API server connection from the flags, or `None` without `--kubeconfig`.
pub(crate) async fn connect(
    flags: &ClusterFlags,
    node_name: &str,
    root_dir: &std::path::Path,
) -> anyhow::Result<Option<ApiServer>> {
    let Some(path) = &flags.kubeconfig else {
        return Ok(None);
    };
    let mut config = ApiServerConfig::default()
        .register_node(flags.register_node)
        .node_labels(parse_node_labels(&flags.node_labels).context("--node-labels")?)
        .node_status_frequencies(
            flags.node_status_update_frequency,
            flags.node_status_report_frequency,
        )
        .root_dir(root_dir);
    if let Some(ip) = &flags.node_ip {
        config = config.node_ip(ip);
    }
    let api = ApiServer::from_kubeconfig(path, node_name, config)
        .await
        .with_context(|| format!("--kubeconfig {}", path.display()))?;
    Ok(Some(api))
}

/// What the node status is made of: the runtime, the PLEG's health and the eviction manager's
/// pressure conditions.
pub(crate) fn status_inputs(
    runtime: Arc<dyn ContainerRuntime>,
    handle: KubeletHandle,
    pressure: kubelet_eviction::NodeConditions,
) -> NodeStatusInputs {
    let conditions = move || -> Vec<NodeCondition> {
        pressure
            .report()
            .into_iter()
            .map(|(type_, status, reason, message)| NodeCondition {
                type_: type_.to_string(),
                status: status.to_string(),
                reason: Some(reason.to_string()),
                message: Some(message.to_string()),
                ..Default::default()
            })
            .collect()
    };
    NodeStatusInputs::new(runtime)
        .kubelet(handle)
        .condition_source(Arc::new(conditions))
}
