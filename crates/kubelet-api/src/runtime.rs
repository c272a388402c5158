//! The runtime model and the [`ContainerRuntime`] trait.
//!
//! The model is shaped like CRI v1 (`runtime.v1`): a pod is a *sandbox* plus *containers*, each
//! carrying the kubelet's labels and annotations ([`labels`]) so that a restarted agent can rebuild
//! its view from the runtime alone. No wire type appears here; the CRI crate converts.

use std::collections::BTreeMap;
use std::path::PathBuf;

use jiff::Timestamp;

use crate::ContainerRuntime;
use crate::error::Result;

/// Label and annotation keys the kubelet puts on sandboxes and containers
/// (`pkg/kubelet/kuberuntime/labels.go`), so tools such as `crictl` show them as usual.
pub mod labels {
    /// Label: the pod's name.
    pub const POD_NAME: &str = "io.kubernetes.pod.name";
    /// Label: the pod's namespace.
    pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
    /// Label: the pod's UID.
    pub const POD_UID: &str = "io.kubernetes.pod.uid";
    /// Label: the container's name within the pod.
    pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
    /// Label on sandboxes and containers that marks them as created by this SDK's engine.
    pub const MANAGED_BY: &str = "io.kubernetes.kubelet-sdk.managed";
    /// Annotation: the container hash (name + image), `HashContainer`.
    pub const CONTAINER_HASH: &str = "io.kubernetes.container.hash";
    /// Annotation: the container's restart count.
    pub const CONTAINER_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
    /// Annotation: the termination message path.
    pub const CONTAINER_TERMINATION_MESSAGE_PATH: &str =
        "io.kubernetes.container.terminationMessagePath";
    /// Annotation: the termination message policy.
    pub const CONTAINER_TERMINATION_MESSAGE_POLICY: &str =
        "io.kubernetes.container.terminationMessagePolicy";
    /// Annotation: the pod's `terminationGracePeriodSeconds`.
    pub const POD_TERMINATION_GRACE_PERIOD: &str = "io.kubernetes.pod.terminationGracePeriod";
    /// Annotation: the pod's `deletionGracePeriodSeconds`.
    pub const POD_DELETION_GRACE_PERIOD: &str = "io.kubernetes.pod.deletionGracePeriod";
    /// Annotation: the preStop handler as JSON.
    pub const CONTAINER_PRESTOP_HANDLER: &str = "io.kubernetes.container.preStopHandler";
    /// Annotation: the container ports as JSON.
    pub const CONTAINER_PORTS: &str = "io.kubernetes.container.ports";
    /// Annotation: the container kind for init containers (`init` or `sidecar`), used to
    /// reconstruct the container type after an agent restart.
    pub const CONTAINER_TYPE: &str = "io.kubernetes.container.type";
}

/// Key/value map used for labels and annotations.
pub type Labels = BTreeMap<String, String>;

/// Identity of a sandbox: the pod it belongs to and the creation attempt.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodSandboxMetadata {
    /// Pod name.
    pub name: String,
    /// Pod namespace.
    pub namespace: String,
    /// Pod UID.
    pub uid: String,
    /// Attempt number, 0 for the first sandbox of this pod.
    pub attempt: u32,
}

/// A port the pod exposes (CRI `PortMapping`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortMapping {
    /// The port's protocol.
    pub protocol: Protocol,
    /// Port inside the pod.
    pub container_port: i32,
    /// Port on the host, 0 for none.
    pub host_port: i32,
    /// Host IP to bind, empty for all.
    pub host_ip: String,
}

/// A port's protocol (CRI `Protocol`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// TCP, the default.
    #[default]
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl Protocol {
    /// The protocol of an API port (`TCP`, `UDP`, `SCTP`; unset is TCP, the API default).
    pub fn from_api(p: Option<&str>) -> Self {
        match p.map(str::to_ascii_uppercase).as_deref() {
            Some("UDP") => Protocol::Udp,
            Some("SCTP") => Protocol::Sctp,
            _ => Protocol::Tcp,
        }
    }

    /// The API spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        }
    }
}

/// DNS settings for the sandbox (CRI `DNSConfig`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DnsConfig {
    /// Name servers.
    pub servers: Vec<String>,
    /// Search domains.
    pub searches: Vec<String>,
    /// resolv.conf options.
    pub options: Vec<String>,
}

/// Everything a runtime needs to create a pod sandbox (CRI `PodSandboxConfig`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PodSandboxConfig {
    /// Pod identity.
    pub metadata: PodSandboxMetadata,
    /// Hostname; empty for host-network pods.
    pub hostname: String,
    /// Directory holding the pod's container logs (`<pod-log-dir>/<ns>_<name>_<uid>`).
    pub log_directory: PathBuf,
    /// DNS configuration, if the pod has its own.
    pub dns_config: Option<DnsConfig>,
    /// Declared container ports.
    pub port_mappings: Vec<PortMapping>,
    /// Labels: the pod's labels plus the `io.kubernetes.pod.*` labels.
    pub labels: Labels,
    /// Annotations: the pod's annotations.
    pub annotations: Labels,
    /// True when the pod uses the host's network namespace.
    pub host_network: bool,
    /// Parent cgroup for the pod's containers, if the agent manages pod cgroups (the pod
    /// cgroup of a [`PodResourceManager`](crate::resources::PodResourceManager)); empty: the
    /// runtime decides.
    pub cgroup_parent: String,
    /// The runtime handler of the pod's RuntimeClass (CRI `runtime_handler`); empty for the
    /// runtime's default.
    pub runtime_handler: String,
    /// True when any container of the pod runs privileged: CRI runtimes refuse privileged
    /// containers in a sandbox that is not privileged itself.
    pub privileged: bool,
}

impl PodSandboxConfig {
    /// A configuration for the sandbox of the pod `metadata`; every other field at its default
    /// (set the public fields to fill them in).
    pub fn new(metadata: PodSandboxMetadata) -> Self {
        Self {
            metadata,
            ..Default::default()
        }
    }
}

/// Sandbox state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum SandboxState {
    /// The sandbox is up and containers can run in it.
    Ready,
    /// The sandbox was stopped or failed.
    #[default]
    NotReady,
}

/// A sandbox as listed (CRI `PodSandbox`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodSandbox {
    /// Runtime-assigned ID.
    pub id: String,
    /// Pod identity.
    pub metadata: PodSandboxMetadata,
    /// Current state.
    pub state: SandboxState,
    /// Creation time.
    pub created_at: Timestamp,
    /// Labels.
    pub labels: Labels,
    /// Annotations.
    pub annotations: Labels,
}

/// Detailed sandbox status (CRI `PodSandboxStatus`).
///
/// # The sandbox network contract
///
/// A sandbox either uses the node's network (`host_network: true`) or has a network of its
/// own (`host_network: false`), and says which in every status:
///
/// - A sandbox created with [`PodSandboxConfig::host_network`] set must use the node's
///   network and report `host_network: true`.
/// - A runtime without pod networking (plain processes, a VM sharing the host's stack) reports
///   `host_network: true` for every sandbox, whatever the pod asked. Its `ip` may be empty.
///   The engine runs such a pod with the node's network, and its status shows the node's IP
///   as the kubelet shows it for `hostNetwork` pods.
/// - A sandbox that reports `host_network: false` must report its IP in `ip` (and
///   `additional_ips` for dual stack), each a valid IP address.
///
/// The engine never re-creates a sandbox for its network report: a report that breaks the
/// contract ([`PodSandboxStatus::check_network`]) is reported once per sandbox as a
/// `SandboxNetworkInvalid` Warning event on the pod, and the pod keeps its sandbox. The
/// runtime conformance kit checks the contract.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PodSandboxStatus {
    /// Runtime-assigned ID.
    pub id: String,
    /// Pod identity.
    pub metadata: PodSandboxMetadata,
    /// Current state.
    pub state: SandboxState,
    /// Creation time.
    pub created_at: Timestamp,
    /// Primary pod IP. Required when the sandbox has a network of its own
    /// (`host_network == false`); optional for a host-network sandbox, whose pods show the
    /// node's IP. See [the sandbox network contract](PodSandboxStatus#the-sandbox-network-contract).
    pub ip: Option<String>,
    /// Additional pod IPs (dual stack).
    pub additional_ips: Vec<String>,
    /// True when the sandbox uses the node's network namespace: because its configuration
    /// asked for it ([`PodSandboxConfig::host_network`]), or because the runtime has no pod
    /// networking at all (then every sandbox reports `true`).
    pub host_network: bool,
    /// Labels.
    pub labels: Labels,
    /// Annotations.
    pub annotations: Labels,
}

impl PodSandboxStatus {
    /// The status of sandbox `id` of the pod `metadata`, in `state`; every other field at its
    /// default.
    pub fn new(id: impl Into<String>, metadata: PodSandboxMetadata, state: SandboxState) -> Self {
        Self {
            id: id.into(),
            metadata,
            state,
            ..Default::default()
        }
    }

    /// The sandbox's IPs that are valid IP addresses, primary first (empty entries and
    /// anything that does not parse are left out).
    pub fn valid_ips(&self) -> Vec<String> {
        self.ip
            .iter()
            .chain(&self.additional_ips)
            .filter(|ip| ip.parse::<std::net::IpAddr>().is_ok())
            .cloned()
            .collect()
    }

    /// Checks this status against [the sandbox network
    /// contract](PodSandboxStatus#the-sandbox-network-contract) for a sandbox created with
    /// `host_network_requested` ([`PodSandboxConfig::host_network`]).
    pub fn check_network(&self, host_network_requested: bool) -> Result<(), SandboxNetworkError> {
        let id = || self.id.clone();
        if host_network_requested && !self.host_network {
            return Err(SandboxNetworkError::NotHostNetwork { id: id() });
        }
        if let Some(bad) = self
            .ip
            .iter()
            .chain(&self.additional_ips)
            .find(|ip| !ip.is_empty() && ip.parse::<std::net::IpAddr>().is_err())
        {
            return Err(SandboxNetworkError::InvalidIp {
                id: id(),
                ip: bad.clone(),
            });
        }
        if !self.host_network && self.ip.as_deref().unwrap_or("").is_empty() {
            return Err(SandboxNetworkError::NoIp { id: id() });
        }
        Ok(())
    }
}

/// How a sandbox's network report breaks [the sandbox network
/// contract](PodSandboxStatus#the-sandbox-network-contract).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxNetworkError {
    /// The sandbox was asked for the node's network and reports one of its own.
    #[error(
        "sandbox {id} was created with host_network but reports a network of its own (host_network: false)"
    )]
    NotHostNetwork {
        /// The sandbox.
        id: String,
    },
    /// The sandbox reports a network of its own and no IP.
    #[error(
        "sandbox {id} reports a network of its own (host_network: false) but no IP; a runtime without pod networking must report host_network: true"
    )]
    NoIp {
        /// The sandbox.
        id: String,
    },
    /// The sandbox reports something that is not an IP address.
    #[error("sandbox {id} reports IP {ip:?}, which is not an IP address")]
    InvalidIp {
        /// The sandbox.
        id: String,
        /// What it reported.
        ip: String,
    },
}

/// Identity of a container within its sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerMetadata {
    /// Container name as in the pod spec.
    pub name: String,
    /// Attempt (restart count) of this instance.
    pub attempt: u32,
}

/// A bind mount into the container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mount {
    /// Path inside the container.
    pub container_path: PathBuf,
    /// Path on the host.
    pub host_path: PathBuf,
    /// Mount read-only.
    pub readonly: bool,
}

/// An environment variable after expansion.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvVar {
    /// Name.
    pub name: String,
    /// Value.
    pub value: String,
}

/// Linux resource settings derived from `resources` (CRI `LinuxContainerResources`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LinuxResources {
    /// CFS period in microseconds, 0 for unset.
    pub cpu_period: i64,
    /// CFS quota in microseconds, 0 for unset.
    pub cpu_quota: i64,
    /// CPU shares (cgroup v1 units; 2 is the minimum).
    pub cpu_shares: i64,
    /// Memory limit in bytes, 0 for unlimited.
    pub memory_limit_in_bytes: i64,
    /// The CPUs the container may run on (Linux list format, `0-2,5`); empty for no
    /// restriction (the CPU manager's exclusive or shared set).
    pub cpuset_cpus: String,
    /// The memory nodes the container may use (list format); empty for no restriction.
    pub cpuset_mems: String,
    /// The `oom_score_adj` of the container's processes (the kubelet's OOM score policy);
    /// `None` leaves the runtime's default.
    pub oom_score_adj: Option<i64>,
}

/// Security settings the runtime applies (CRI `LinuxContainerSecurityContext`), the pod's and
/// the container's `securityContext` merged as the kubelet's `determineEffectiveSecurityContext`
/// does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SecurityContext {
    /// Run privileged.
    pub privileged: bool,
    /// UID to run as.
    pub run_as_user: Option<i64>,
    /// GID to run as.
    pub run_as_group: Option<i64>,
    /// Additional groups of the process: the pod's `fsGroup`, then its `supplementalGroups`.
    pub supplemental_groups: Vec<i64>,
    /// `readOnlyRootFilesystem`: mount the root filesystem read-only.
    pub readonly_rootfs: bool,
    /// `no_new_privs`: set when `allowPrivilegeEscalation` is `false`.
    pub no_new_privs: bool,
    /// Capabilities to add (`capabilities.add`, names without the `CAP_` prefix as written).
    pub add_capabilities: Vec<String>,
    /// Capabilities to drop (`capabilities.drop`; `ALL` drops every one).
    pub drop_capabilities: Vec<String>,
    /// Paths to mask (the kubelet's defaults unless `procMount: Unmasked`).
    pub masked_paths: Vec<String>,
    /// Paths to make read-only (the kubelet's defaults unless `procMount: Unmasked`).
    pub readonly_paths: Vec<String>,
    /// The seccomp profile (`seccompProfile`; unconfined when unset, as the kubelet without
    /// `seccompDefault`).
    pub seccomp: SecurityProfile,
    /// The AppArmor profile (`appArmorProfile` or the beta annotation); `None` leaves the
    /// runtime's default.
    pub apparmor: Option<SecurityProfile>,
}

/// A seccomp or AppArmor profile (CRI `SecurityProfile`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum SecurityProfile {
    /// No profile.
    #[default]
    Unconfined,
    /// The runtime's default profile.
    RuntimeDefault,
    /// A profile on the node: for seccomp the absolute path of its file
    /// (`<root-dir>/seccomp/<localhostProfile>`), for AppArmor the profile's name.
    Localhost(String),
}

/// Everything a runtime needs to create a container (CRI `ContainerConfig`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ContainerConfig {
    /// Container identity.
    pub metadata: ContainerMetadata,
    /// Image reference as written in the pod spec.
    pub image: String,
    /// Entrypoint (`command`), already `$(VAR)`-expanded.
    pub command: Vec<String>,
    /// Arguments, already `$(VAR)`-expanded.
    pub args: Vec<String>,
    /// Working directory, empty for the runtime's default.
    pub working_dir: String,
    /// Environment, in order, already expanded.
    pub envs: Vec<EnvVar>,
    /// Mounts from volume plugins.
    pub mounts: Vec<Mount>,
    /// Labels (`io.kubernetes.*`).
    pub labels: Labels,
    /// Annotations (`io.kubernetes.container.*`).
    pub annotations: Labels,
    /// Log path relative to the sandbox's `log_directory` (`<container>/<restart>.log`).
    pub log_path: String,
    /// Keep stdin open.
    pub stdin: bool,
    /// Allocate a TTY.
    pub tty: bool,
    /// Resource limits.
    pub resources: Option<LinuxResources>,
    /// Security settings.
    pub security: SecurityContext,
}

impl ContainerConfig {
    /// A configuration for the container `metadata` running `image`; every other field at its
    /// default.
    pub fn new(metadata: ContainerMetadata, image: impl Into<String>) -> Self {
        Self {
            metadata,
            image: image.into(),
            ..Default::default()
        }
    }
}

/// Container state (CRI `ContainerState`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum ContainerState {
    /// Created, not started.
    Created,
    /// Running.
    Running,
    /// Exited.
    Exited,
    /// State cannot be determined.
    #[default]
    Unknown,
}

/// A container as listed (CRI `Container`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Container {
    /// Runtime-assigned ID.
    pub id: String,
    /// Sandbox the container belongs to.
    pub pod_sandbox_id: String,
    /// Container identity.
    pub metadata: ContainerMetadata,
    /// Image as requested.
    pub image: String,
    /// Resolved image reference (digest), if known.
    pub image_ref: String,
    /// Current state.
    pub state: ContainerState,
    /// Creation time.
    pub created_at: Timestamp,
    /// Labels.
    pub labels: Labels,
    /// Annotations.
    pub annotations: Labels,
}

/// Detailed container status (CRI `ContainerStatus`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ContainerStatus {
    /// Runtime-assigned ID.
    pub id: String,
    /// Container identity.
    pub metadata: ContainerMetadata,
    /// Current state.
    pub state: ContainerState,
    /// Creation time.
    pub created_at: Timestamp,
    /// Start time, if it started.
    pub started_at: Option<Timestamp>,
    /// Finish time, if it exited.
    pub finished_at: Option<Timestamp>,
    /// Exit code, meaningful when exited (137 for SIGKILL, 128+n for signal n).
    pub exit_code: i32,
    /// Image as requested.
    pub image: String,
    /// Resolved image reference.
    pub image_ref: String,
    /// Brief reason for the state (`Completed`, `Error`, `OOMKilled`).
    pub reason: String,
    /// Human-readable detail (for example the termination message).
    pub message: String,
    /// Labels.
    pub labels: Labels,
    /// Annotations.
    pub annotations: Labels,
    /// Mounts.
    pub mounts: Vec<Mount>,
    /// Absolute log path.
    pub log_path: PathBuf,
    /// Resources applied.
    pub resources: Option<LinuxResources>,
}

impl ContainerStatus {
    /// The status of container `id` (`metadata`) in `state`; every other field at its default.
    pub fn new(id: impl Into<String>, metadata: ContainerMetadata, state: ContainerState) -> Self {
        Self {
            id: id.into(),
            metadata,
            state,
            ..Default::default()
        }
    }
}

/// Result of [`ContainerRuntime::exec_sync`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecResult {
    /// Captured stdout.
    pub stdout: Vec<u8>,
    /// Captured stderr.
    pub stderr: Vec<u8>,
    /// Exit code of the command.
    pub exit_code: i32,
}

/// Runtime identity (CRI `VersionResponse`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeVersion {
    /// Runtime name, e.g. `containerd` or `process`.
    pub runtime_name: String,
    /// Runtime version.
    pub runtime_version: String,
    /// API version the runtime speaks.
    pub runtime_api_version: String,
}

/// One runtime condition (CRI `RuntimeCondition`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeCondition {
    /// `RuntimeReady` or `NetworkReady`.
    pub type_: String,
    /// Whether the condition holds.
    pub status: bool,
    /// Machine-readable reason when false.
    pub reason: String,
    /// Human-readable message when false.
    pub message: String,
}

/// Runtime health (CRI `StatusResponse`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RuntimeStatus {
    /// Conditions; `RuntimeReady` and `NetworkReady` are the required ones.
    pub conditions: Vec<RuntimeCondition>,
}

impl RuntimeStatus {
    /// Name of the condition that says the runtime can run containers.
    pub const RUNTIME_READY: &'static str = "RuntimeReady";
    /// Name of the condition that says pod networking is ready.
    pub const NETWORK_READY: &'static str = "NetworkReady";

    /// `RuntimeReady` and `NetworkReady` both true: a runtime with nothing to report.
    pub fn all_ready() -> Self {
        let ready = |type_: &str| RuntimeCondition {
            type_: type_.to_string(),
            status: true,
            ..Default::default()
        };
        Self {
            conditions: vec![ready(Self::RUNTIME_READY), ready(Self::NETWORK_READY)],
        }
    }

    /// The condition named `type_`, if reported.
    pub fn condition(&self, type_: &str) -> Option<&RuntimeCondition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }
}

/// An image reference to look up or pull.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ImageSpec {
    /// Reference as written in the pod spec.
    pub image: String,
}

impl ImageSpec {
    /// The image reference `image`, as written in the pod spec.
    pub fn new(image: impl Into<String>) -> Self {
        Self {
            image: image.into(),
        }
    }
}

/// An image the runtime has (CRI `Image`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Image {
    /// Image ID.
    pub id: String,
    /// Tags (`registry/repository:tag`).
    pub repo_tags: Vec<String>,
    /// Digest references (`registry/repository@sha256:…`).
    pub repo_digests: Vec<String>,
    /// Size in bytes.
    pub size: u64,
    /// The runtime keeps this image (its sandbox image, say): image garbage collection never
    /// removes it.
    pub pinned: bool,
}

impl Image {
    /// The image `id` with its tags and size in bytes.
    pub fn new(id: impl Into<String>, repo_tags: Vec<String>, size: u64) -> Self {
        Self {
            id: id.into(),
            repo_tags,
            size,
            ..Default::default()
        }
    }
}

/// Registry credentials for one pull (CRI `AuthConfig`), from the pod's image pull secrets.
///
/// Its `Debug` output names which fields are set, never their values: credentials must not
/// reach a log line, an event or a status message.
#[derive(Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AuthConfig {
    /// User name.
    pub username: String,
    /// Password.
    pub password: String,
    /// `base64(username:password)`, as a docker config's `auth` field.
    pub auth: String,
    /// The registry the credentials are for, as a URL (`https://host:port`); empty: whatever
    /// registry the image names (as the kubelet sends pull secrets' credentials).
    pub server_address: String,
    /// A token to exchange for a registry token (docker config `identitytoken`).
    pub identity_token: String,
    /// A bearer token for the registry (docker config `registrytoken`).
    pub registry_token: String,
}

impl AuthConfig {
    /// A user name and password.
    pub fn basic(username: impl Into<String>, password: impl Into<String>) -> Self {
        Self {
            username: username.into(),
            password: password.into(),
            ..Default::default()
        }
    }
}

impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = |s: &String| if s.is_empty() { "" } else { "<redacted>" };
        f.debug_struct("AuthConfig")
            .field("server_address", &self.server_address)
            .field("username", &set(&self.username))
            .field("password", &set(&self.password))
            .field("auth", &set(&self.auth))
            .field("identity_token", &set(&self.identity_token))
            .field("registry_token", &set(&self.registry_token))
            .finish()
    }
}

/// Usage figures for one container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ContainerStats {
    /// Container ID.
    pub container_id: String,
    /// When the figures were read.
    pub timestamp: Timestamp,
    /// Memory working set (usage minus inactive file cache), in bytes.
    pub memory_working_set_bytes: Option<u64>,
    /// Memory usage, in bytes.
    pub memory_usage_bytes: Option<u64>,
    /// Anonymous memory (cgroup `rss`/`anon`), in bytes.
    pub memory_rss_bytes: Option<u64>,
    /// Page faults, cumulative.
    pub memory_page_faults: Option<u64>,
    /// Major page faults, cumulative.
    pub memory_major_page_faults: Option<u64>,
    /// Cumulative CPU time, in nanoseconds.
    pub cpu_usage_core_nanoseconds: Option<u64>,
    /// Number of processes.
    pub process_count: Option<u64>,
    /// Bytes used by the container's writable layer (CRI `writable_layer.used_bytes`); `None`
    /// for runtimes without one (the process runtime).
    pub writable_layer_bytes: Option<u64>,
    /// Inodes used by the container's writable layer (CRI `writable_layer.inodes_used`).
    pub writable_layer_inodes: Option<u64>,
}

impl ContainerStats {
    /// Figures of container `container_id` read at `timestamp`, none known yet.
    pub fn new(container_id: impl Into<String>, timestamp: Timestamp) -> Self {
        Self {
            container_id: container_id.into(),
            timestamp,
            ..Default::default()
        }
    }
}

/// Usage figures of one pod sandbox (CRI `PodSandboxStats`): what the sandbox itself has, which
/// its containers do not (its network namespace's interfaces).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PodSandboxStats {
    /// Sandbox ID.
    pub sandbox_id: String,
    /// The sandbox's network interfaces; `None` when it has no network namespace of its own
    /// (host network) or the runtime does not know.
    pub network: Option<SandboxNetworkStats>,
}

impl PodSandboxStats {
    /// Figures of sandbox `sandbox_id`, none known yet.
    pub fn new(sandbox_id: impl Into<String>) -> Self {
        Self {
            sandbox_id: sandbox_id.into(),
            network: None,
        }
    }
}

/// A sandbox's network figures (CRI `NetworkUsage`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SandboxNetworkStats {
    /// When the figures were read.
    pub timestamp: Timestamp,
    /// The default interface (the one with the default route, `eth0` under CNI).
    pub default_interface: Option<InterfaceUsage>,
    /// The other interfaces.
    pub interfaces: Vec<InterfaceUsage>,
}

impl SandboxNetworkStats {
    /// Figures read at `timestamp`, no interface yet.
    pub fn new(timestamp: Timestamp) -> Self {
        Self {
            timestamp,
            ..Default::default()
        }
    }
}

/// Cumulative counters of one network interface (CRI `NetworkInterfaceUsage`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct InterfaceUsage {
    /// Interface name.
    pub name: String,
    /// Bytes received.
    pub rx_bytes: Option<u64>,
    /// Receive errors.
    pub rx_errors: Option<u64>,
    /// Bytes sent.
    pub tx_bytes: Option<u64>,
    /// Send errors.
    pub tx_errors: Option<u64>,
}

impl InterfaceUsage {
    /// Interface `name`, no figures yet.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            ..Default::default()
        }
    }
}

/// What the runtime uses of one filesystem (CRI `FilesystemUsage`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FilesystemUsage {
    /// When the figures were read.
    pub timestamp: Timestamp,
    /// Mountpoint of the filesystem (CRI `fs_id.mountpoint`): the directory the runtime keeps
    /// its images (or writable container layers) under, e.g. containerd's snapshotter root.
    pub mountpoint: PathBuf,
    /// Bytes the images use there; not the whole filesystem's usage.
    pub used_bytes: Option<u64>,
    /// Inodes the images use there; not the whole filesystem's usage.
    pub inodes_used: Option<u64>,
}

impl FilesystemUsage {
    /// Usage of the filesystem at `mountpoint` read at `timestamp`, no figures yet.
    pub fn new(timestamp: Timestamp, mountpoint: impl Into<PathBuf>) -> Self {
        Self {
            timestamp,
            mountpoint: mountpoint.into(),
            ..Default::default()
        }
    }
}

/// The filesystems the runtime keeps images and containers on (CRI `ImageFsInfoResponse`); see
/// [`ImageService::image_fs_info`](crate::ImageService::image_fs_info).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ImageFsInfo {
    /// The image filesystem(s), usually one.
    pub image_filesystems: Vec<FilesystemUsage>,
    /// The filesystem(s) of writable container layers when the runtime keeps them apart from
    /// the images (a "split" image filesystem); empty otherwise.
    pub container_filesystems: Vec<FilesystemUsage>,
}

/// Filter for [`ContainerRuntime::list_pod_sandboxes`]; empty fields match everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxFilter {
    /// Only this sandbox ID.
    pub id: Option<String>,
    /// Only sandboxes in this state.
    pub state: Option<SandboxState>,
    /// Only sandboxes carrying all these labels.
    pub label_selector: Labels,
}

/// Filter for [`ContainerRuntime::list_containers`]; empty fields match everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerFilter {
    /// Only this container ID.
    pub id: Option<String>,
    /// Only containers in this state.
    pub state: Option<ContainerState>,
    /// Only containers of this sandbox.
    pub pod_sandbox_id: Option<String>,
    /// Only containers carrying all these labels.
    pub label_selector: Labels,
}

/// The ID part of a pod status's `<runtime>://<id>` container ID (the whole string if it has
/// no scheme), as the runtime knows the container.
pub fn strip_container_id(id: &str) -> &str {
    id.split_once("://").map_or(id, |(_, rest)| rest)
}

/// True when `labels` contains every pair of `selector`.
pub fn labels_match(labels: &Labels, selector: &Labels) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn _assert_runtime_dyn(_: &dyn ContainerRuntime) {}

/// What happened to a container, as a runtime event reports it (CRI `ContainerEventType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ContainerEventKind {
    /// The container was created.
    Created,
    /// The container started running.
    Started,
    /// The container stopped (its process exited or was killed).
    Stopped,
    /// The container was removed.
    Deleted,
}

/// One container event pushed by a runtime; see [`ContainerRuntime::container_events`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ContainerEvent {
    /// The container (or, for sandbox events, the sandbox) ID.
    pub container_id: String,
    /// What happened.
    pub kind: ContainerEventKind,
    /// The pod UID when the runtime knows it without another call (CRI events carry the sandbox
    /// metadata; containerd task events do not).
    pub pod_uid: Option<String>,
    /// When the runtime says it happened.
    pub created_at: Timestamp,
}

impl ContainerEvent {
    /// A new event.
    pub fn new(
        container_id: impl Into<String>,
        kind: ContainerEventKind,
        pod_uid: Option<String>,
        created_at: Timestamp,
    ) -> Self {
        Self {
            container_id: container_id.into(),
            kind,
            pod_uid,
            created_at,
        }
    }
}

/// The stream [`ContainerRuntime::container_events`] returns.
pub type ContainerEventStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<ContainerEvent>> + Send + 'static>>;

/// A pod as the runtime sees it: its sandboxes and containers grouped by pod UID.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimePod {
    /// Pod UID (from the `io.kubernetes.pod.uid` label).
    pub uid: String,
    /// Pod name.
    pub name: String,
    /// Pod namespace.
    pub namespace: String,
    /// Sandboxes, newest first.
    pub sandboxes: Vec<PodSandbox>,
    /// Containers.
    pub containers: Vec<Container>,
}

/// The runtime-side status of one pod (the kubelet's `kubecontainer.PodStatus`): the input of
/// the engine's `compute_pod_actions` and status generation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodRuntimeStatus {
    /// Pod UID.
    pub uid: String,
    /// Pod name.
    pub name: String,
    /// Pod namespace.
    pub namespace: String,
    /// Pod IPs as the ready sandbox reports them (primary first; only valid addresses).
    pub ips: Vec<String>,
    /// Sandbox statuses, newest first.
    pub sandbox_statuses: Vec<PodSandboxStatus>,
    /// Statuses of all container instances, newest first.
    pub container_statuses: Vec<ContainerStatus>,
}

impl PodRuntimeStatus {
    /// True when the newest ready sandbox uses the node's network ([the sandbox network
    /// contract](PodSandboxStatus#the-sandbox-network-contract)).
    pub fn sandbox_host_network(&self) -> bool {
        self.sandbox_statuses
            .iter()
            .find(|s| s.state == SandboxState::Ready)
            .is_some_and(|s| s.host_network)
    }

    /// The newest instance of container `name`, if any.
    pub fn find_container(&self, name: &str) -> Option<&ContainerStatus> {
        self.container_statuses
            .iter()
            .filter(|c| c.metadata.name == name)
            .max_by_key(|c| (c.created_at, c.metadata.attempt))
    }

    /// Every instance of container `name`, newest first.
    pub fn container_instances<'a>(
        &'a self,
        name: &'a str,
    ) -> impl Iterator<Item = &'a ContainerStatus> + 'a {
        self.container_statuses
            .iter()
            .filter(move |c| c.metadata.name == name)
    }
}

/// List every pod the runtime knows about that carries the `io.kubernetes.pod.uid` label,
/// grouped by UID, sandboxes newest first (the kubelet's `GetPods(all=true)`).
pub async fn get_pods(runtime: &dyn ContainerRuntime) -> Result<Vec<RuntimePod>> {
    let sandboxes = runtime
        .list_pod_sandboxes(&SandboxFilter::default())
        .await?;
    let containers = runtime.list_containers(&ContainerFilter::default()).await?;
    let mut pods: BTreeMap<String, RuntimePod> = BTreeMap::new();
    for s in sandboxes {
        let Some(uid) = s.labels.get(labels::POD_UID).cloned() else {
            continue;
        };
        let pod = pods.entry(uid.clone()).or_insert_with(|| RuntimePod {
            uid,
            name: s.metadata.name.clone(),
            namespace: s.metadata.namespace.clone(),
            ..Default::default()
        });
        pod.sandboxes.push(s);
    }
    for c in containers {
        let Some(uid) = c.labels.get(labels::POD_UID).cloned() else {
            continue;
        };
        let pod = pods.entry(uid.clone()).or_insert_with(|| RuntimePod {
            uid,
            name: c.labels.get(labels::POD_NAME).cloned().unwrap_or_default(),
            namespace: c
                .labels
                .get(labels::POD_NAMESPACE)
                .cloned()
                .unwrap_or_default(),
            ..Default::default()
        });
        pod.containers.push(c);
    }
    let mut out: Vec<RuntimePod> = pods.into_values().collect();
    for p in &mut out {
        crate::sort::by_key(&mut p.sandboxes, |s| std::cmp::Reverse(s.created_at));
    }
    Ok(out)
}

/// Inspect one pod in depth (the kubelet's `GetPodStatus`): every sandbox's status and every
/// container's status, found by the pod-UID label. Containers that vanish between the list and
/// the status call are skipped.
pub async fn get_pod_status(
    runtime: &dyn ContainerRuntime,
    uid: &str,
    name: &str,
    namespace: &str,
) -> Result<PodRuntimeStatus> {
    let mut selector = Labels::new();
    selector.insert(labels::POD_UID.to_string(), uid.to_string());
    let sandboxes = runtime
        .list_pod_sandboxes(&SandboxFilter {
            label_selector: selector.clone(),
            ..Default::default()
        })
        .await?;
    let mut sandbox_statuses = Vec::with_capacity(sandboxes.len());
    for s in &sandboxes {
        match runtime.pod_sandbox_status(&s.id).await {
            Ok(st) => sandbox_statuses.push(st),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    crate::sort::by_key(&mut sandbox_statuses, |s| std::cmp::Reverse(s.created_at));
    let containers = runtime
        .list_containers(&ContainerFilter {
            label_selector: selector,
            ..Default::default()
        })
        .await?;
    let mut container_statuses = Vec::with_capacity(containers.len());
    for c in &containers {
        match runtime.container_status(&c.id).await {
            Ok(st) => container_statuses.push(st),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    crate::sort::by(&mut container_statuses, |a, b| {
        (b.created_at, b.metadata.attempt).cmp(&(a.created_at, a.metadata.attempt))
    });
    let ips = sandbox_statuses
        .iter()
        .find(|s| s.state == SandboxState::Ready)
        .map(PodSandboxStatus::valid_ips)
        .unwrap_or_default();
    Ok(PodRuntimeStatus {
        uid: uid.to_string(),
        name: name.to_string(),
        namespace: namespace.to_string(),
        ips,
        sandbox_statuses,
        container_statuses,
    })
}
