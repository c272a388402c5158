//! [`KubeletConfiguration`]: the kubelet's configuration (`kubelet.config.k8s.io/v1beta1`), the
//! fields the SDK supports, with the kubelet's names and defaults.
//!
//! One typed value from which each crate's own settings are derived
//! ([`KubeletConfig::from_configuration`](crate::KubeletConfig::from_configuration) here, the
//! eviction, PLEG, API-server and source configurations in their crates); crates never parse
//! the kubelet's YAML or flags themselves. It (de)serialises with the kubelet's field names
//! (camelCase, durations as Go durations such as `1m0s`), every field optional on input, so the
//! same file a kubelet reads can be read into it.
//!
//! ```
//! use kubelet_core::configuration::KubeletConfiguration;
//!
//! let config: KubeletConfiguration = serde_json::from_str(r#"{
//!     "kind": "KubeletConfiguration",
//!     "apiVersion": "kubelet.config.k8s.io/v1beta1",
//!     "staticPodPath": "/etc/kubernetes/manifests",
//!     "syncFrequency": "30s",
//!     "evictionHard": {"memory.available": "200Mi"},
//!     "featureGates": {"EventedPLEG": true}
//! }"#).unwrap();
//! assert_eq!(config.sync_frequency.as_duration(), std::time::Duration::from_secs(30));
//! assert_eq!(config.file_check_frequency.as_duration(), std::time::Duration::from_secs(20));
//! assert!(config.feature_gate("EventedPLEG"));
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// `apiVersion` of the kubelet's configuration file.
pub const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
/// `kind` of the kubelet's configuration file.
pub const KIND: &str = "KubeletConfiguration";

/// A duration written as a Go duration (`metav1.Duration`: `"1m0s"`, `"500ms"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct GoDuration(pub Duration);

impl GoDuration {
    /// A duration of `secs` seconds.
    pub const fn from_secs(secs: u64) -> Self {
        Self(Duration::from_secs(secs))
    }

    /// The duration.
    pub fn as_duration(self) -> Duration {
        self.0
    }
}

impl From<Duration> for GoDuration {
    fn from(d: Duration) -> Self {
        Self(d)
    }
}

impl Serialize for GoDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&crate::duration::format_go(self.0))
    }
}

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        match crate::duration::parse_go(&s) {
            Ok((false, d)) => Ok(Self(d)),
            Ok((true, _)) => Err(serde::de::Error::custom(format!(
                "duration {s:?} must not be negative"
            ))),
            Err(e) => Err(serde::de::Error::custom(e)),
        }
    }
}

/// `apiVersion` of the SDK's own configuration ([`AgentConfiguration`]).
pub const AGENT_API_VERSION: &str = "agent.kubelet-sdk.io/v1alpha1";
/// `kind` of the SDK's own configuration.
pub const AGENT_KIND: &str = "AgentConfiguration";

/// Settings the kubelet does not have, in the SDK's own group (`agent.kubelet-sdk.io/v1alpha1`,
/// kind `AgentConfiguration`): a configuration file may carry it as a second YAML document
/// after its `KubeletConfiguration`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
#[non_exhaustive]
pub struct AgentConfiguration {
    /// `podCheckpoint`: edge autonomy (pods start again from a local checkpoint while the API
    /// server is unreachable).
    pub pod_checkpoint: PodCheckpointConfiguration,
}

/// `podCheckpoint` of [`AgentConfiguration`]: the API server's pods and the objects they use,
/// kept under the root directory (docs/autonomy.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
#[non_exhaustive]
pub struct PodCheckpointConfiguration {
    /// `enabled` (true): keep the checkpoint when the agent joins a cluster.
    pub enabled: bool,
    /// `offlineStartWait` (5s): how long a starting agent waits for the API server's first list
    /// of pods before it runs the checkpointed ones.
    pub offline_start_wait: GoDuration,
    /// `maxAge` (168h): pods the API server last confirmed longer ago are not started from the
    /// checkpoint; `0s`: no limit.
    pub max_age: GoDuration,
    /// `maxSizeBytes` (64 MiB): the most the checkpoint holds.
    pub max_size_bytes: u64,
}

impl Default for PodCheckpointConfiguration {
    fn default() -> Self {
        Self {
            enabled: true,
            offline_start_wait: GoDuration::from_secs(5),
            max_age: GoDuration::from_secs(7 * 24 * 3600),
            max_size_bytes: 64 * 1024 * 1024,
        }
    }
}

/// The kubelet's configuration: the fields the SDK supports, named and defaulted as the
/// kubelet's (`pkg/kubelet/apis/config/v1beta1/defaults.go`). See the [module docs](self).
///
/// Deliberate difference: an empty [`container_runtime_endpoint`](Self::container_runtime_endpoint)
/// (the default here) selects the SDK's built-in process runtime; the kubelet defaults to
/// containerd's socket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
#[non_exhaustive]
pub struct KubeletConfiguration {
    /// `kind`: `KubeletConfiguration`.
    pub kind: String,
    /// `apiVersion`: `kubelet.config.k8s.io/v1beta1`.
    pub api_version: String,
    /// `staticPodPath`: directory (or file) of static pod manifests; empty for none.
    pub static_pod_path: String,
    /// `syncFrequency` (1 m): resync period of running pods.
    pub sync_frequency: GoDuration,
    /// `fileCheckFrequency` (20 s): how often the static pod path is re-listed.
    pub file_check_frequency: GoDuration,
    /// `httpCheckFrequency` (20 s): how often the static pod URL is polled.
    pub http_check_frequency: GoDuration,
    /// `staticPodURL`: URL of static pod manifests; empty for none.
    #[serde(rename = "staticPodURL")]
    pub static_pod_url: String,
    /// `staticPodURLHeader`: headers sent with every static pod URL request.
    #[serde(rename = "staticPodURLHeader")]
    pub static_pod_url_header: BTreeMap<String, Vec<String>>,
    /// `address` (`0.0.0.0`): the address the kubelet's ports bind to.
    pub address: String,
    /// `enableServer` (true): serve the kubelet API on [`port`](Self::port).
    pub enable_server: bool,
    /// `port` (10250): the kubelet API's port (HTTPS, authenticated and authorized).
    pub port: u16,
    /// `tlsCertFile`: the serving certificate (PEM, chain after the leaf); with
    /// [`tls_private_key_file`](Self::tls_private_key_file). Empty: a self-signed pair in the
    /// certificate directory (`kubelet.crt`, `kubelet.key`), generated once and reused.
    pub tls_cert_file: String,
    /// `tlsPrivateKeyFile`: the serving certificate's key (PEM).
    pub tls_private_key_file: String,
    /// `tlsCipherSuites`: the TLS 1.2 cipher suites allowed, by their IANA names as the kubelet
    /// takes them (`TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256`); empty for the defaults.
    pub tls_cipher_suites: Vec<String>,
    /// `tlsMinVersion`: `VersionTLS12` or `VersionTLS13`; empty for TLS 1.2.
    pub tls_min_version: String,
    /// `authentication`: how requests to [`port`](Self::port) are authenticated.
    pub authentication: KubeletAuthentication,
    /// `authorization`: how authenticated requests are authorized.
    pub authorization: KubeletAuthorization,
    /// `enableDebuggingHandlers` (true): serve `/containerLogs`, `/runningpods`, `/logs` (and the
    /// streaming endpoints) on [`port`](Self::port).
    pub enable_debugging_handlers: bool,
    /// `enableSystemLogHandler` (true): serve the node's `/var/log` under `/logs/`.
    pub enable_system_log_handler: bool,
    /// `readOnlyPort` (0 = off): the unauthenticated read-only port.
    pub read_only_port: u16,
    /// `healthzPort` (10248; 0 = off).
    pub healthz_port: u16,
    /// `healthzBindAddress` (`127.0.0.1`).
    pub healthz_bind_address: String,
    /// `registerNode` (true): create the Node object when it does not exist.
    pub register_node: bool,
    /// `registerWithTaints`: taints the Node is created with (`key`, `value`, `effect`).
    pub register_with_taints: Vec<k8s_openapi::api::core::v1::Taint>,
    /// `rotateCertificates` (false; kubeadm sets true): renew the client certificate with a
    /// `CertificateSigningRequest` before it expires, and bootstrap it when there is none.
    pub rotate_certificates: bool,
    /// `serverTLSBootstrap` (false): request the kubelet API's serving certificate from the
    /// cluster (signer `kubernetes.io/kubelet-serving`) and renew it, instead of
    /// `tlsCertFile` or a self-signed pair.
    #[serde(rename = "serverTLSBootstrap")]
    pub server_tls_bootstrap: bool,
    /// `nodeStatusUpdateFrequency` (10 s).
    pub node_status_update_frequency: GoDuration,
    /// `nodeStatusReportFrequency` (5 m).
    pub node_status_report_frequency: GoDuration,
    /// `runtimeRequestTimeout` (2 m): deadline of every runtime call but image pulls.
    pub runtime_request_timeout: GoDuration,
    /// `volumeStatsAggPeriod` (1 m): how often pod volumes' disk usage is measured for the
    /// stats (`/stats/summary`, eviction).
    pub volume_stats_agg_period: GoDuration,
    /// `serializeImagePulls` (true): pull one image at a time.
    pub serialize_image_pulls: bool,
    /// `maxParallelImagePulls`: how many pulls run at once when they are not serialized;
    /// absent for no bound.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_parallel_image_pulls: Option<u32>,
    /// `registryPullQPS` (5): image pulls started per second; 0 for no limit.
    #[serde(rename = "registryPullQPS")]
    pub registry_pull_qps: u32,
    /// `registryBurst` (10): pulls that may start at once above `registryPullQPS`.
    pub registry_burst: u32,
    /// `imageGCHighThresholdPercent` (85): image filesystem usage at which image garbage
    /// collection starts; 100 switches it off.
    #[serde(rename = "imageGCHighThresholdPercent")]
    pub image_gc_high_threshold_percent: i32,
    /// `imageGCLowThresholdPercent` (80): the usage image garbage collection frees down to.
    #[serde(rename = "imageGCLowThresholdPercent")]
    pub image_gc_low_threshold_percent: i32,
    /// `imageMinimumGCAge` (2 m): an image is not removed before it has been known this long.
    #[serde(rename = "imageMinimumGCAge")]
    pub image_minimum_gc_age: GoDuration,
    /// `imageMaximumGCAge` (0, off): unused images are removed this long after their last
    /// use whatever the disk usage.
    #[serde(rename = "imageMaximumGCAge")]
    pub image_maximum_gc_age: GoDuration,
    /// `containerLogMaxSize` (`10Mi`): a container's log is rotated at this size.
    pub container_log_max_size: String,
    /// `containerLogMaxFiles` (5): log files kept per container, the current one included.
    pub container_log_max_files: i32,
    /// `containerLogMonitorInterval` (10 s): how often log sizes are checked.
    pub container_log_monitor_interval: GoDuration,
    /// `streamingConnectionIdleTimeout` (4 h): idle exec, attach and port-forward connections
    /// are closed after this long.
    pub streaming_connection_idle_timeout: GoDuration,
    /// `containerRuntimeEndpoint`: a CRI runtime's socket (`unix:///run/containerd/containerd.sock`);
    /// empty for the built-in process runtime (a deliberate difference from the kubelet).
    pub container_runtime_endpoint: String,
    /// `podLogsDir` (`/var/log/pods`): where container logs are written.
    pub pod_logs_dir: String,
    /// `clusterDNS`: the cluster DNS servers pods with `ClusterFirst` use; empty: those pods
    /// fall back to the host's resolver (`MissingClusterDNS`).
    #[serde(rename = "clusterDNS")]
    pub cluster_dns: Vec<String>,
    /// `clusterDomain`: the cluster's domain (`cluster.local` in most clusters); empty: no
    /// cluster search path.
    pub cluster_domain: String,
    /// `resolvConf` (`/etc/resolv.conf`): the host resolver configuration pods inherit; empty:
    /// none (host-policy pods get 127.0.0.1).
    pub resolv_conf: String,
    /// `maxPods` (110): reported as the node's `pods` capacity.
    pub max_pods: i32,
    /// `cgroupsPerQOS` (true): whether the agent builds the kubelet's QoS cgroup hierarchy
    /// (`kubepods`, `burstable`, `besteffort`) with a cgroup per pod (`kubelet-cm`).
    #[serde(rename = "cgroupsPerQOS")]
    pub cgroups_per_qos: bool,
    /// `cgroupDriver` (`cgroupfs`): `cgroupfs` or `systemd` naming of the cgroups; it must
    /// match the container runtime's.
    pub cgroup_driver: String,
    /// `cgroupRoot` (empty: `/`): the cgroup `kubepods` is made under.
    pub cgroup_root: String,
    /// `kubeReserved`: resources set aside for the agent and the runtime (`cpu`, `memory`,
    /// `ephemeral-storage`, `pid`), subtracted from node allocatable.
    pub kube_reserved: BTreeMap<String, String>,
    /// `systemReserved`: resources set aside for the operating system.
    pub system_reserved: BTreeMap<String, String>,
    /// `enforceNodeAllocatable` (`[pods]`): `pods` sets the `kubepods` cgroup's limits to
    /// capacity minus the reservations.
    pub enforce_node_allocatable: Vec<String>,
    /// `podPidsLimit` (-1: unlimited): `pids.max` of every pod cgroup.
    pub pod_pids_limit: i64,
    /// `cpuCFSQuota` (true): CPU limits are enforced as CFS quotas.
    #[serde(rename = "cpuCFSQuota")]
    pub cpu_cfs_quota: bool,
    /// `cpuManagerPolicy` (`none`): `none` or `static`.
    pub cpu_manager_policy: String,
    /// `cpuManagerReconcilePeriod` (10 s).
    pub cpu_manager_reconcile_period: GoDuration,
    /// `reservedSystemCPUs` (empty): CPUs (list format) kept for the system; replaces the CPU
    /// part of `kubeReserved` and `systemReserved`.
    #[serde(rename = "reservedSystemCPUs")]
    pub reserved_system_cpus: String,
    /// `failSwapOn` (true): refuse to start when swap is on.
    pub fail_swap_on: bool,
    /// `kubeletCgroups` (empty: the agent's own cgroup): the cgroup the stats summary reports
    /// as the `kubelet` system container.
    pub kubelet_cgroups: String,
    /// `configMapAndSecretChangeDetectionStrategy` (`Watch`): `Watch`, `Cache` or `Get`, how
    /// the API-server integration learns of ConfigMap and Secret changes.
    pub config_map_and_secret_change_detection_strategy: String,
    /// `evictionHard`; `None` (absent) for the kubelet's defaults.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eviction_hard: Option<BTreeMap<String, String>>,
    /// `evictionSoft`.
    pub eviction_soft: BTreeMap<String, String>,
    /// `evictionSoftGracePeriod` (Go durations).
    pub eviction_soft_grace_period: BTreeMap<String, String>,
    /// `evictionPressureTransitionPeriod` (5 m).
    pub eviction_pressure_transition_period: GoDuration,
    /// `evictionMaxPodGracePeriod` (0), seconds.
    pub eviction_max_pod_grace_period: i32,
    /// `evictionMinimumReclaim`.
    pub eviction_minimum_reclaim: BTreeMap<String, String>,
    /// `mergeDefaultEvictionSettings` (false): keep the default hard thresholds not set in
    /// `evictionHard`.
    pub merge_default_eviction_settings: bool,
    /// `shutdownGracePeriod` (0: graceful node shutdown off): how long a node shutdown may
    /// take; pods are terminated within it, critical pods last.
    pub shutdown_grace_period: GoDuration,
    /// `shutdownGracePeriodCriticalPods` (0): the last part of
    /// [`shutdown_grace_period`](Self::shutdown_grace_period), for critical pods (priority
    /// ≥ 2000000000).
    pub shutdown_grace_period_critical_pods: GoDuration,
    /// `shutdownGracePeriodByPodPriority`: instead of the two above, a period per priority
    /// band; a pod belongs to the band of the highest `priority` not above its own.
    pub shutdown_grace_period_by_pod_priority: Vec<ShutdownGracePeriodByPodPriority>,
    /// `featureGates`: the SDK reads those in [`KNOWN_FEATURE_GATES`].
    pub feature_gates: BTreeMap<String, bool>,
}

/// One entry of `shutdownGracePeriodByPodPriority`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct ShutdownGracePeriodByPodPriority {
    /// The lowest priority of the band.
    pub priority: i32,
    /// How long the band's pods get, seconds.
    pub shutdown_grace_period_seconds: i64,
}

impl ShutdownGracePeriodByPodPriority {
    /// A band from `priority` up whose pods get `seconds`.
    pub fn new(priority: i32, seconds: i64) -> Self {
        Self {
            priority,
            shutdown_grace_period_seconds: seconds,
        }
    }
}

/// `authentication` of the kubelet's configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
#[non_exhaustive]
pub struct KubeletAuthentication {
    /// `x509`: client certificates.
    pub x509: KubeletX509Authentication,
    /// `webhook`: bearer tokens checked with a `TokenReview`.
    pub webhook: KubeletWebhookAuthentication,
    /// `anonymous`: requests without credentials.
    pub anonymous: KubeletAnonymousAuthentication,
}

impl Default for KubeletAuthentication {
    fn default() -> Self {
        Self {
            x509: KubeletX509Authentication::default(),
            webhook: KubeletWebhookAuthentication {
                enabled: true,
                cache_ttl: GoDuration::from_secs(120),
            },
            anonymous: KubeletAnonymousAuthentication { enabled: false },
        }
    }
}

/// `authentication.x509`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
#[non_exhaustive]
pub struct KubeletX509Authentication {
    /// `clientCAFile`: CA bundle (PEM) that client certificates must chain to; the user is the
    /// certificate's CN, its groups the O values. Empty: no client certificates.
    #[serde(rename = "clientCAFile")]
    pub client_ca_file: String,
}

/// `authentication.webhook`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
#[non_exhaustive]
pub struct KubeletWebhookAuthentication {
    /// `enabled` (true in a configuration file): check bearer tokens with a `TokenReview`.
    pub enabled: bool,
    /// `cacheTTL` (2 m): how long review results are cached.
    #[serde(rename = "cacheTTL")]
    pub cache_ttl: GoDuration,
}

impl Default for KubeletWebhookAuthentication {
    fn default() -> Self {
        KubeletAuthentication::default().webhook
    }
}

/// `authentication.anonymous`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
#[non_exhaustive]
pub struct KubeletAnonymousAuthentication {
    /// `enabled` (false in a configuration file): requests without credentials are
    /// `system:anonymous` in `system:unauthenticated` instead of answered 401.
    pub enabled: bool,
}

/// `authorization` of the kubelet's configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
#[non_exhaustive]
pub struct KubeletAuthorization {
    /// `mode`: `Webhook` (the default in a configuration file: a `SubjectAccessReview` per
    /// request) or `AlwaysAllow`.
    pub mode: String,
    /// `webhook`: the review caches.
    pub webhook: KubeletWebhookAuthorization,
}

impl Default for KubeletAuthorization {
    fn default() -> Self {
        Self {
            mode: "Webhook".to_string(),
            webhook: KubeletWebhookAuthorization::default(),
        }
    }
}

/// `authorization.webhook`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
#[non_exhaustive]
pub struct KubeletWebhookAuthorization {
    /// `cacheAuthorizedTTL` (5 m).
    #[serde(rename = "cacheAuthorizedTTL")]
    pub cache_authorized_ttl: GoDuration,
    /// `cacheUnauthorizedTTL` (30 s).
    #[serde(rename = "cacheUnauthorizedTTL")]
    pub cache_unauthorized_ttl: GoDuration,
}

impl Default for KubeletWebhookAuthorization {
    fn default() -> Self {
        Self {
            cache_authorized_ttl: GoDuration::from_secs(300),
            cache_unauthorized_ttl: GoDuration::from_secs(30),
        }
    }
}

impl Default for KubeletConfiguration {
    fn default() -> Self {
        Self {
            kind: KIND.to_string(),
            api_version: API_VERSION.to_string(),
            static_pod_path: String::new(),
            sync_frequency: GoDuration::from_secs(60),
            file_check_frequency: GoDuration::from_secs(20),
            http_check_frequency: GoDuration::from_secs(20),
            static_pod_url: String::new(),
            static_pod_url_header: BTreeMap::new(),
            address: "0.0.0.0".to_string(),
            enable_server: true,
            port: 10250,
            tls_cert_file: String::new(),
            tls_private_key_file: String::new(),
            tls_cipher_suites: Vec::new(),
            tls_min_version: String::new(),
            authentication: KubeletAuthentication::default(),
            authorization: KubeletAuthorization::default(),
            enable_debugging_handlers: true,
            enable_system_log_handler: true,
            read_only_port: 0,
            healthz_port: 10248,
            healthz_bind_address: "127.0.0.1".to_string(),
            register_node: true,
            register_with_taints: Vec::new(),
            rotate_certificates: false,
            server_tls_bootstrap: false,
            node_status_update_frequency: GoDuration::from_secs(10),
            node_status_report_frequency: GoDuration::from_secs(300),
            runtime_request_timeout: GoDuration::from_secs(120),
            volume_stats_agg_period: GoDuration::from_secs(60),
            serialize_image_pulls: true,
            max_parallel_image_pulls: None,
            registry_pull_qps: 5,
            registry_burst: 10,
            image_gc_high_threshold_percent: 85,
            image_gc_low_threshold_percent: 80,
            image_minimum_gc_age: GoDuration::from_secs(120),
            image_maximum_gc_age: GoDuration::from_secs(0),
            container_log_max_size: "10Mi".to_string(),
            container_log_max_files: 5,
            container_log_monitor_interval: GoDuration::from_secs(10),
            streaming_connection_idle_timeout: GoDuration::from_secs(4 * 3600),
            container_runtime_endpoint: String::new(),
            pod_logs_dir: "/var/log/pods".to_string(),
            cluster_dns: Vec::new(),
            cluster_domain: String::new(),
            resolv_conf: "/etc/resolv.conf".to_string(),
            max_pods: 110,
            cgroups_per_qos: true,
            cgroup_driver: "cgroupfs".into(),
            cgroup_root: String::new(),
            kube_reserved: BTreeMap::new(),
            system_reserved: BTreeMap::new(),
            enforce_node_allocatable: vec!["pods".to_string()],
            pod_pids_limit: -1,
            cpu_cfs_quota: true,
            cpu_manager_policy: "none".to_string(),
            cpu_manager_reconcile_period: GoDuration::from_secs(10),
            reserved_system_cpus: String::new(),
            fail_swap_on: true,
            kubelet_cgroups: String::new(),
            config_map_and_secret_change_detection_strategy: "Watch".to_string(),
            eviction_hard: None,
            eviction_soft: BTreeMap::new(),
            eviction_soft_grace_period: BTreeMap::new(),
            eviction_pressure_transition_period: GoDuration::from_secs(300),
            eviction_max_pod_grace_period: 0,
            eviction_minimum_reclaim: BTreeMap::new(),
            merge_default_eviction_settings: false,
            shutdown_grace_period: GoDuration::default(),
            shutdown_grace_period_critical_pods: GoDuration::default(),
            shutdown_grace_period_by_pod_priority: Vec::new(),
            feature_gates: BTreeMap::new(),
        }
    }
}

/// Feature gates the SDK reads; others are accepted and have no effect.
pub const KNOWN_FEATURE_GATES: &[&str] = &["EventedPLEG", "KubeletFineGrainedAuthz"];

/// The known gates that are on unless set: `KubeletFineGrainedAuthz` as in the kubelet release
/// the SDK follows, and `EventedPLEG`, which the SDK turns on by default (a deliberate
/// difference: the kubelet's is off; runtimes without events fall back to the relist).
pub const DEFAULT_ON_FEATURE_GATES: &[&str] = &["EventedPLEG", "KubeletFineGrainedAuthz"];

impl KubeletConfiguration {
    /// Whether feature gate `name` is on: as set, else its default ([`DEFAULT_ON_FEATURE_GATES`];
    /// every other gate defaults off).
    pub fn feature_gate(&self, name: &str) -> bool {
        self.feature_gates
            .get(name)
            .copied()
            .unwrap_or_else(|| DEFAULT_ON_FEATURE_GATES.contains(&name))
    }

    /// Give the kubelet's default to every field it treats as unset when zero (its
    /// `SetDefaults_KubeletConfiguration`): a duration of `0s`, a number `0` or an empty string
    /// in a non-pointer field of the kubelet's type. Files written by kubeadm are full of these
    /// (`syncFrequency: 0s`). Fields where zero is a value (`readOnlyPort`, `healthzPort`,
    /// `registryPullQPS`, `imageMaximumGCAge`, `resolvConf: ""`) are left alone.
    ///
    /// `nodeStatusReportFrequency` follows the kubelet's rule: unset, it equals
    /// `nodeStatusUpdateFrequency` when that one is set, else 5 minutes. A value that came
    /// from [`Default`] cannot be told from one that was given, so the caller says which of the
    /// two frequencies its input had (`update_given`, `report_given`).
    pub fn default_unset_fields(&mut self, update_given: bool, report_given: bool) {
        let d = Self::default();
        fn dur(v: &mut GoDuration, default: GoDuration) {
            if v.0.is_zero() {
                *v = default;
            }
        }
        fn text(v: &mut String, default: &str) {
            if v.is_empty() {
                *v = default.to_string();
            }
        }
        let update_unset = !update_given || self.node_status_update_frequency.0.is_zero();
        let report_unset = !report_given || self.node_status_report_frequency.0.is_zero();
        if update_unset {
            self.node_status_update_frequency = d.node_status_update_frequency;
            if report_unset {
                self.node_status_report_frequency = d.node_status_report_frequency;
            }
        } else if report_unset {
            self.node_status_report_frequency = self.node_status_update_frequency;
        }
        dur(&mut self.sync_frequency, d.sync_frequency);
        dur(&mut self.file_check_frequency, d.file_check_frequency);
        dur(&mut self.http_check_frequency, d.http_check_frequency);
        text(&mut self.address, &d.address);
        if self.port == 0 {
            self.port = d.port;
        }
        text(&mut self.healthz_bind_address, &d.healthz_bind_address);
        dur(&mut self.runtime_request_timeout, d.runtime_request_timeout);
        dur(&mut self.volume_stats_agg_period, d.volume_stats_agg_period);
        if self.registry_burst == 0 {
            self.registry_burst = d.registry_burst;
        }
        dur(&mut self.image_minimum_gc_age, d.image_minimum_gc_age);
        text(&mut self.container_log_max_size, &d.container_log_max_size);
        dur(
            &mut self.container_log_monitor_interval,
            d.container_log_monitor_interval,
        );
        dur(
            &mut self.streaming_connection_idle_timeout,
            d.streaming_connection_idle_timeout,
        );
        text(&mut self.pod_logs_dir, &d.pod_logs_dir);
        if self.max_pods == 0 {
            self.max_pods = d.max_pods;
        }
        text(&mut self.cgroup_driver, &d.cgroup_driver);
        text(&mut self.cpu_manager_policy, &d.cpu_manager_policy);
        dur(
            &mut self.cpu_manager_reconcile_period,
            d.cpu_manager_reconcile_period,
        );
        text(
            &mut self.config_map_and_secret_change_detection_strategy,
            &d.config_map_and_secret_change_detection_strategy,
        );
        dur(
            &mut self.eviction_pressure_transition_period,
            d.eviction_pressure_transition_period,
        );
        dur(
            &mut self.authentication.webhook.cache_ttl,
            d.authentication.webhook.cache_ttl,
        );
        text(&mut self.authorization.mode, &d.authorization.mode);
        dur(
            &mut self.authorization.webhook.cache_authorized_ttl,
            d.authorization.webhook.cache_authorized_ttl,
        );
        dur(
            &mut self.authorization.webhook.cache_unauthorized_ttl,
            d.authorization.webhook.cache_unauthorized_ttl,
        );
    }

    /// The gates set that the SDK does not know (worth a warning: they change nothing).
    pub fn unknown_feature_gates(&self) -> Vec<&str> {
        self.feature_gates
            .keys()
            .map(String::as_str)
            .filter(|k| !KNOWN_FEATURE_GATES.contains(k))
            .collect()
    }
}

/// Parse the kubelet's `--feature-gates` syntax, `A=true,B=false`, with its error messages.
pub fn parse_feature_gates(s: &str) -> Result<BTreeMap<String, bool>, String> {
    let mut gates = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("missing bool value for {part}"))?;
        let v: bool = v
            .trim()
            .parse()
            .map_err(|_| format!("invalid value of {k}={v}, err: expected true or false"))?;
        gates.insert(k.trim().to_string(), v);
    }
    Ok(gates)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_kubelets() {
        let c = KubeletConfiguration::default();
        assert_eq!(c.sync_frequency.as_duration(), Duration::from_secs(60));
        assert_eq!(c.port, 10250);
        assert_eq!(c.read_only_port, 0);
        assert_eq!(c.healthz_port, 10248);
        assert_eq!(c.max_pods, 110);
        assert_eq!(
            c.node_status_report_frequency.as_duration(),
            Duration::from_secs(300)
        );
        assert_eq!(c.pod_logs_dir, "/var/log/pods");
        assert_eq!(c.config_map_and_secret_change_detection_strategy, "Watch");
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["configMapAndSecretChangeDetectionStrategy"], "Watch");
    }

    #[test]
    fn serialises_with_the_kubelets_field_names_and_go_durations() {
        let c = KubeletConfiguration {
            static_pod_url: "http://x/pods".into(),
            ..Default::default()
        };
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["kind"], "KubeletConfiguration");
        assert_eq!(v["apiVersion"], "kubelet.config.k8s.io/v1beta1");
        assert_eq!(v["syncFrequency"], "1m0s");
        assert_eq!(v["staticPodURL"], "http://x/pods");
        assert_eq!(v["nodeStatusReportFrequency"], "5m0s");
        assert!(v.get("evictionHard").is_none());
        let back: KubeletConfiguration = serde_json::from_value(v).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn bad_durations_and_gates_are_errors() {
        let e = serde_json::from_str::<KubeletConfiguration>(r#"{"syncFrequency":"soon"}"#)
            .unwrap_err();
        assert!(e.to_string().contains("invalid duration"), "{e}");
        assert!(
            serde_json::from_str::<KubeletConfiguration>(r#"{"syncFrequency":"-1s"}"#).is_err()
        );
        let g = parse_feature_gates("EventedPLEG=true, Other=false").unwrap();
        assert_eq!(g.get("EventedPLEG"), Some(&true));
        assert!(parse_feature_gates("EventedPLEG").is_err());
        assert!(parse_feature_gates("EventedPLEG=yes").is_err());
        let c = KubeletConfiguration {
            feature_gates: g,
            ..Default::default()
        };
        assert!(c.feature_gate("EventedPLEG"));
        assert_eq!(c.unknown_feature_gates(), vec!["Other"]);
    }
}
