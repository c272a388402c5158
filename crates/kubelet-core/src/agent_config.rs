//! [`KubeletConfig`]: the engine's settings (directories, periods, the node's addresses and DNS).

use std::path::PathBuf;
use std::time::Duration;

/// Engine settings, with the kubelet's defaults.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct KubeletConfig {
    /// `--root-dir`: pod directories live under `<root_dir>/pods/<uid>`.
    pub root_dir: PathBuf,
    /// `--pod-log-dir`: container logs live under `<pod_log_dir>/<ns>_<name>_<uid>/`.
    pub pod_log_dir: PathBuf,
    /// Where the kubelet's log links go, `<pod>_<ns>_<container>-<id>.log` → the container's
    /// log, what log shippers tail (`/var/log/containers`; with another pod log directory,
    /// `containers` next to it: see [`container_log_dir_for`]).
    pub container_log_dir: PathBuf,
    /// `syncFrequency`: resync period of a running pod (1 m, with 0.5 jitter).
    pub sync_frequency: Duration,
    /// `housekeepingPeriod` (2 s): orphan cleanup.
    pub housekeeping_period: Duration,
    /// `runtimeRequestTimeout` (2 m): added to the grace period of stop calls.
    pub runtime_request_timeout: Duration,
    /// The node's IP, reported as every pod's `hostIP` and the downward API's `status.hostIP`
    /// (the `kubelet` facade sets `--node-ip` or [`KubeletConfig::default_node_ip`]); `None`
    /// reports the pod's own IP.
    pub node_ip: Option<String>,
    /// `clusterDNS`.
    pub cluster_dns: Vec<String>,
    /// `clusterDomain`.
    pub cluster_domain: String,
    /// `resolvConf` (`/etc/resolv.conf`); empty for none.
    pub resolv_conf: PathBuf,
    /// `serializeImagePulls`, `maxParallelImagePulls`, `registryPullQPS`, `registryBurst`.
    pub pull_limits: crate::image_pull::PullLimits,
}

/// The log link directory that goes with a pod log directory: `/var/log/containers` for the
/// kubelet's `/var/log/pods`, else `containers` next to the pod log directory (so that an agent
/// with its logs elsewhere keeps its links there too).
pub fn container_log_dir_for(pod_log_dir: &std::path::Path) -> PathBuf {
    if pod_log_dir == std::path::Path::new("/var/log/pods") {
        return PathBuf::from("/var/log/containers");
    }
    match pod_log_dir.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.join("containers"),
        _ => pod_log_dir.join("containers"),
    }
}

impl Default for KubeletConfig {
    fn default() -> Self {
        Self {
            root_dir: PathBuf::from("/var/lib/kubelet"),
            pod_log_dir: PathBuf::from("/var/log/pods"),
            container_log_dir: PathBuf::from("/var/log/containers"),
            sync_frequency: Duration::from_secs(60),
            housekeeping_period: Duration::from_secs(2),
            runtime_request_timeout: Duration::from_secs(120),
            node_ip: None,
            cluster_dns: Vec::new(),
            cluster_domain: String::new(),
            resolv_conf: PathBuf::from("/etc/resolv.conf"),
            pull_limits: crate::image_pull::PullLimits::default(),
        }
    }
}

impl KubeletConfig {
    /// The engine's settings from the kubelet's configuration (`syncFrequency`,
    /// `runtimeRequestTimeout`, `podLogsDir`) and `--root-dir`, which is a flag only.
    pub fn from_configuration(
        configuration: &crate::configuration::KubeletConfiguration,
        root_dir: impl Into<PathBuf>,
    ) -> Self {
        Self {
            root_dir: root_dir.into(),
            pod_log_dir: PathBuf::from(&configuration.pod_logs_dir),
            container_log_dir: container_log_dir_for(std::path::Path::new(
                &configuration.pod_logs_dir,
            )),
            sync_frequency: configuration.sync_frequency.as_duration(),
            runtime_request_timeout: configuration.runtime_request_timeout.as_duration(),
            cluster_dns: configuration.cluster_dns.clone(),
            cluster_domain: configuration.cluster_domain.clone(),
            resolv_conf: PathBuf::from(&configuration.resolv_conf),
            pull_limits: crate::image_pull::PullLimits {
                serialize: configuration.serialize_image_pulls,
                max_parallel: configuration.max_parallel_image_pulls,
                qps: f64::from(configuration.registry_pull_qps),
                burst: configuration.registry_burst,
            },
            ..Self::default()
        }
    }

    /// The node's IP when none is configured, as the kubelet picks it without `--node-ip`: the
    /// local address of the default route (IPv4 first, then IPv6); `None` on a host without
    /// one.
    pub fn default_node_ip() -> Option<std::net::IpAddr> {
        // Connecting a UDP socket sends nothing: it only selects the route and source address.
        for (bind, target) in [("0.0.0.0:0", "10.255.255.255:9"), ("[::]:0", "[fd00::1]:9")] {
            if let Ok(sock) = std::net::UdpSocket::bind(bind)
                && sock.connect(target).is_ok()
                && let Ok(addr) = sock.local_addr()
                && !addr.ip().is_unspecified()
            {
                return Some(addr.ip());
            }
        }
        None
    }

    /// Defaults with `root_dir` and `pod_log_dir` replaced.
    pub fn with_dirs(root_dir: impl Into<PathBuf>, pod_log_dir: impl Into<PathBuf>) -> Self {
        let pod_log_dir = pod_log_dir.into();
        Self {
            root_dir: root_dir.into(),
            container_log_dir: container_log_dir_for(&pod_log_dir),
            pod_log_dir,
            ..Self::default()
        }
    }
}
