//! `--kubeconfig` and the flags that go with it: joining a cluster through its API server
//! (`kubelet-apiserver`). Without `--kubeconfig` the agent stays standalone.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use kubelet::KubeletConfiguration;
use kubelet::apiserver::{ApiServerConfig, parse_node_labels};
use kubelet::core::configuration::AgentConfiguration;

/// The kubelet's API server flags.
#[derive(Debug, clap::Args)]
pub(crate) struct ClusterFlags {
    /// Kubeconfig with the API server and this node's credentials (token or client
    /// certificate). Unset: standalone, pods come only from the other sources.
    #[arg(long = "kubeconfig")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// Kubeconfig with a bootstrap token: when --kubeconfig has no valid client certificate,
    /// one is requested with it (a CertificateSigningRequest), stored in --cert-dir and
    /// --kubeconfig is written to use it.
    #[arg(long = "bootstrap-kubeconfig")]
    pub(crate) bootstrap_kubeconfig: Option<PathBuf>,
    /// Renew the client certificate before it expires (`rotateCertificates`).
    #[arg(long = "rotate-certificates", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    rotate_certificates: bool,
    /// Taints the Node is created with, `key=value:Effect,key2:Effect`.
    #[arg(long = "register-with-taints", default_value = "")]
    register_with_taints: String,
    /// Create the Node object when it does not exist.
    #[arg(long = "register-node", default_value_t = true, action = clap::ArgAction::Set)]
    register_node: bool,
    /// Labels added when the node registers, `key=value,key2=value2`.
    #[arg(long = "node-labels", default_value = "")]
    node_labels: String,
    /// The node's IP: its InternalIP and every pod's hostIP (default: the address of the
    /// default route).
    #[arg(long = "node-ip")]
    pub(crate) node_ip: Option<std::net::IpAddr>,
    /// How often the node status is computed and posted when it changed.
    #[arg(long = "node-status-update-frequency", default_value = "10s", value_parser = crate::parse_duration)]
    node_status_update_frequency: Duration,
    /// How often the node status is posted even when nothing changed.
    #[arg(long = "node-status-report-frequency", default_value = "5m", value_parser = crate::parse_duration)]
    node_status_report_frequency: Duration,
    /// How ConfigMap and Secret changes reach pods (`configMapAndSecretChangeDetectionStrategy`):
    /// `Watch` (each object a pod uses is watched; a change syncs its pods at once), `Cache`
    /// (GET, kept 1 minute) or `Get` (GET on every sync).
    #[arg(long = "config-map-and-secret-change-detection-strategy", default_value = "Watch", value_parser = parse_strategy)]
    change_detection: String,
    /// Edge autonomy (the SDK's `podCheckpoint.enabled`; the kubelet has no such flag): keep the
    /// API server's pods and the objects they use under --root-dir, and run them from there
    /// when the agent starts while the API server is unreachable.
    #[arg(long = "pod-checkpoint", default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pod_checkpoint: bool,
    /// How long a starting agent waits for the API server's pods before it runs the
    /// checkpointed ones (`podCheckpoint.offlineStartWait`).
    #[arg(long = "pod-checkpoint-offline-wait", default_value = "5s", value_parser = crate::parse_duration)]
    pod_checkpoint_offline_wait: Duration,
    /// Pods the API server last confirmed longer ago are not started from the checkpoint;
    /// `0s`: no limit (`podCheckpoint.maxAge`).
    #[arg(long = "pod-checkpoint-max-age", default_value = "168h", value_parser = parse_age)]
    pod_checkpoint_max_age: Duration,
}

fn parse_age(s: &str) -> Result<Duration, String> {
    match kubelet::core::duration::parse_go(s).map_err(|e| e.to_string())? {
        (false, d) => Ok(d),
        _ => Err(format!(
            "duration {s:?} must not be negative (0s: no limit)"
        )),
    }
}

fn parse_strategy(s: &str) -> Result<String, String> {
    s.parse::<kubelet::apiserver::ChangeDetection>()
        .map(|c| c.as_str().to_string())
        .map_err(|e| e.to_string())
}

/// The flags that are fields of the kubelet's configuration.
pub(crate) fn configure(
    flags: &ClusterFlags,
    given: &crate::Given<'_>,
    c: &mut KubeletConfiguration,
    agent: &mut AgentConfiguration,
) -> anyhow::Result<()> {
    let checkpoint = &mut agent.pod_checkpoint;
    if given.has("pod_checkpoint") {
        checkpoint.enabled = flags.pod_checkpoint;
    }
    if given.has("pod_checkpoint_offline_wait") {
        checkpoint.offline_start_wait = flags.pod_checkpoint_offline_wait.into();
    }
    if given.has("pod_checkpoint_max_age") {
        checkpoint.max_age = flags.pod_checkpoint_max_age.into();
    }
    if given.has("rotate_certificates") {
        c.rotate_certificates = flags.rotate_certificates;
    }
    if given.has("register_with_taints") {
        c.register_with_taints = kubelet::apiserver::parse_taints(&flags.register_with_taints)
            .context("--register-with-taints")?;
    }
    if given.has("register_node") {
        c.register_node = flags.register_node;
    }
    if given.has("node_status_update_frequency") {
        c.node_status_update_frequency = flags.node_status_update_frequency.into();
    }
    if given.has("node_status_report_frequency") {
        c.node_status_report_frequency = flags.node_status_report_frequency.into();
    }
    if given.has("change_detection") {
        c.config_map_and_secret_change_detection_strategy = flags.change_detection.clone();
    }
    Ok(())
}

/// The kubeconfig and API server settings from the flags, or `None` without `--kubeconfig`.
pub(crate) fn api_server_config(
    flags: &ClusterFlags,
    configuration: &KubeletConfiguration,
    root_dir: &Path,
) -> anyhow::Result<Option<(PathBuf, ApiServerConfig)>> {
    let Some(path) = &flags.kubeconfig else {
        if flags.bootstrap_kubeconfig.is_some() {
            anyhow::bail!("--bootstrap-kubeconfig needs --kubeconfig (the file it writes)");
        }
        return Ok(None);
    };
    let mut config = ApiServerConfig::from_configuration(configuration)
        .node_labels(parse_node_labels(&flags.node_labels).context("--node-labels")?)
        .root_dir(root_dir);
    if let Some(ip) = flags.node_ip {
        config = config.node_ip(ip.to_string());
    }
    Ok(Some((path.clone(), config)))
}
