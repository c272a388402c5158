//! `kubelet`: the kubelet SDK in one crate. Assemble a Kubernetes node agent from the SDK's
//! subsystems in a few lines, with the kubelet's defaults; reach every subsystem crate through
//! its re-export when you need more.
//!
//! [`AgentBuilder`] reads a [`KubeletConfiguration`] (the kubelet's configuration, its field
//! names and defaults) and makes, unless you give your own:
//!
//! * the **runtime**: a CRI runtime when `containerRuntimeEndpoint` is set (feature `cri`),
//!   else the built-in process runtime (feature `process`), wrapped in the
//!   [deadline and metrics layers](kubelet_core::layer) (the CRI runtime has its own);
//! * the **PLEG** from that runtime (evented by default, the relist as its safety net and for
//!   runtimes without events; the relist alone with `EventedPLEG=false`);
//! * the **prober** (feature `probe`) and **node-pressure eviction** (feature `eviction`);
//! * the **stats** collector (feature `stats`): `/stats/summary`, `/metrics/resource` and
//!   `/metrics/cadvisor` on the kubelet API;
//! * the **pod sources** `staticPodPath` and `staticPodURL`, and with a kubeconfig the API
//!   server's pods, status and ConfigMaps/Secrets (feature `apiserver`);
//! * the **healthz and read-only ports** (feature `server`): `/healthz`, `/pods`, `/metrics`,
//!   and the **kubelet API** on `port` over HTTPS (feature `https`: `kubectl logs`, `exec`,
//!   `attach`, `port-forward`).
//!
//! Feature `tls` gives the HTTP client HTTPS (probes, `httpGet` hooks, `https` manifest URLs)
//! and the push endpoint its TLS. Every feature but `cri`, `apiserver` and `testing` is on by
//! default.
//!
//! `build()` returns the agent ([`Kubelet`]); [`Kubelet::run`] drives everything until the
//! shutdown token is cancelled, and leaves pods running when it returns.
//!
//! ```no_run
//! use kubelet::prelude::*;
//!
//! fn main() -> std::process::ExitCode {
//!     // The process runtime supervises each container with this same binary.
//!     if let Some(code) = kubelet::process::shim::maybe_run_shim() {
//!         return code;
//!     }
//!     let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
//!     rt.block_on(async {
//!         let mut configuration = KubeletConfiguration::default();
//!         configuration.static_pod_path = "/etc/kubernetes/manifests".into();
//!         let agent = AgentBuilder::new("edge-1")
//!             .configuration(configuration)
//!             .root_dir("/var/lib/kubelet")
//!             .build()
//!             .await
//!             .expect("agent");
//!         agent.run(CancellationToken::new()).await;
//!     });
//!     std::process::ExitCode::SUCCESS
//! }
//! ```
//!
//! Features: `process`, `probe`, `eviction`, `stats`, `server` (default), `cri`, `apiserver`,
//! `testing`.
//!
//! # Ports, addresses and paths
//!
//! What an agent built with `AgentBuilder::new(node).build()` uses, and what changes each
//! (configuration fields are [`KubeletConfiguration`]'s, in its YAML spelling). A failed bind
//! names the fields that set the address.
//!
//! | what | default | changed by |
//! |---|---|---|
//! | kubelet API (HTTPS: logs, exec, port-forward, stats) | `0.0.0.0:10250` | `port`, `address`; `0` turns it off |
//! | healthz | `127.0.0.1:10248` | `healthzPort`, `healthzBindAddress`; `0` turns it off |
//! | read-only port (HTTP `/pods`, `/metrics`, stats) | off | `readOnlyPort`, `address` |
//! | root directory | `/var/lib/kubelet` | [`AgentBuilder::root_dir`] |
//! | pod directories (volumes, `/etc/hosts`, termination messages) | `<root>/pods` | root directory |
//! | process runtime state | `<root>/runtime/process` | root directory |
//! | pod logs | `/var/log/pods`; `<root>/logs/pods` once `root_dir` is called | `podLogsDir`; [`AgentBuilder::kubelet_log_layout`] |
//! | container log links | `/var/log/containers`; else `containers` beside the pod logs | follows the pod logs |
//! | serving certificate (self-signed when none is given) | `<root>/pki` | [`AgentBuilder::cert_dir`], `tlsCertFile`, `tlsPrivateKeyFile` |
//! | client certificates (TLS bootstrap, feature `apiserver`) | `<root>/pki` | [`AgentBuilder::cert_dir`] |
//! | pod checkpoint (with a kubeconfig) | `<root>/pod-checkpoint` | `podCheckpoint` of the `AgentConfiguration` |
//! | CPU manager state (policy `static`) | `<root>/cpu_manager_state` | root directory |
//! | pod cgroups (feature `cm`, as root) | `kubepods` under the cgroup root | `cgroupRoot`, `cgroupsPerQOS`, `cgroupDriver` |
//! | DNS settings read | `/etc/resolv.conf` | `resolvConf` |
//! | pod sources | none | `staticPodPath`, `staticPodURL`, [`AgentBuilder::pod_source`], a kubeconfig |
//!
//! So an embedder that calls `root_dir` and sets `port` and `healthzPort` (or gives them free
//! ports) runs a private, unprivileged agent whose files are all under its root directory (the
//! test `crates/kubelet/tests/root_dir.rs` checks it). `minimal_kubelet` keeps the kubelet's
//! flag defaults: logs in `/var/log/pods` whatever `--root-dir` says.
//!
//! # The Kubernetes version is yours
//!
//! No crate of the SDK enables a `k8s-openapi` version feature: the application does, next to
//! this crate, as with `kube` (`k8s-openapi = { version = "0.29", features = ["v1_33"] }`). The
//! SDK builds with every version `k8s-openapi` 0.29 has, `v1_33` (the oldest) to `v1_37` (the
//! newest); without one, `k8s-openapi` stops the build with its own message saying to pick one.
//! An application on an older `k8s-openapi` (0.28 and before, Kubernetes ≤ 1.32) has two copies
//! of it in its build, and the SDK's one has no version: the same message.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::sync::Arc;

pub mod config_file;
#[cfg(feature = "testing")]
pub mod conformance;

pub use async_trait::async_trait;
pub use jiff::Timestamp;
pub use kubelet_api::{
    AgentPlugin, ContainerRuntime, Error, ErrorKind, NodeConditionReader, PluginContext,
    PluginState, PluginStatus, PodSource, Result, StatusSink, VolumePlugin,
};
pub use kubelet_core::configuration::KubeletConfiguration;
pub use kubelet_core::k8s_openapi;
pub use kubelet_core::layer::RuntimeLayer;
pub use kubelet_core::prometheus_client;
pub use kubelet_core::{Kubelet, KubeletBuilder, KubeletConfig, KubeletError, KubeletHandle};
pub use tokio_util::sync::CancellationToken;

/// The seam crate: the traits a runtime, source, sink, volume plugin or agent plugin
/// implements, and the runtime model.
pub use kubelet_api as seams;
/// The API-server integration crate.
#[cfg(feature = "apiserver")]
pub use kubelet_apiserver as apiserver;
/// The container manager crate (QoS and pod cgroups, allocatable, resource admission).
#[cfg(feature = "cm")]
pub use kubelet_cm as cm;
/// The engine crate.
pub use kubelet_core as core;
/// The CRI runtime crate.
#[cfg(feature = "cri")]
pub use kubelet_cri as cri;
/// The eviction crate.
#[cfg(feature = "eviction")]
pub use kubelet_eviction as eviction;
/// The garbage collection crate.
#[cfg(feature = "gc")]
pub use kubelet_gc as gc;
/// The PLEG crate.
pub use kubelet_pleg as pleg;
/// The pod sources crate.
pub use kubelet_podconfig as podconfig;
/// The prober crate.
#[cfg(feature = "probe")]
pub use kubelet_probe as probe;
/// The process runtime crate.
#[cfg(feature = "process")]
pub use kubelet_process as process;
/// The HTTP endpoints crate.
#[cfg(feature = "server")]
pub use kubelet_server as server;
/// The stats crate.
#[cfg(feature = "stats")]
pub use kubelet_stats as stats;

/// What an agent's `main` usually needs, without names that clash with Kubernetes API types:
/// the runtime model is reached as `runtime::Container`, the API as `api::Container`.
pub mod prelude {
    pub use crate::{
        AgentBuilder, AgentError, AgentPlugin, CancellationToken, ContainerRuntime,
        KubeletConfiguration, KubeletHandle, PluginContext, PodSource, StatusSink, async_trait,
    };
    /// The runtime model (`runtime::Container`, `runtime::PodSandboxConfig`).
    pub use kubelet_api::runtime;
    /// The Kubernetes core/v1 API types (`api::Pod`, `api::Container`).
    pub use kubelet_core::k8s_openapi::api::core::v1 as api;
    pub use std::sync::Arc;
}

/// Why an agent could not be assembled.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// A directory the agent needs could not be created.
    #[error("creating {what} {path}")]
    CreateDir {
        /// Which directory (`root directory`, `pod log directory`).
        what: &'static str,
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The configuration asks for something this build of the crate leaves out.
    #[error("{what} needs the `{feature}` feature of the kubelet crate")]
    FeatureDisabled {
        /// What was asked for.
        what: String,
        /// The feature.
        feature: &'static str,
    },
    /// The configuration names no runtime this build can make.
    #[error("no container runtime: {0}")]
    Runtime(String),
    /// The graceful node shutdown settings contradict each other.
    #[error("graceful node shutdown: {0}")]
    NodeShutdown(String),
    /// The process runtime could not start.
    #[cfg(feature = "process")]
    #[error("starting the process runtime")]
    ProcessRuntime(#[from] kubelet_process::ProcessError),
    /// The CRI runtime could not be reached.
    #[cfg(feature = "cri")]
    #[error("containerRuntimeEndpoint {endpoint}")]
    Cri {
        /// The endpoint.
        endpoint: String,
        /// The cause.
        #[source]
        source: kubelet_cri::CriError,
    },
    /// A pod source could not be set up (`staticPodURL`).
    #[error("pod source")]
    PodSource(#[from] kubelet_podconfig::PodConfigError),
    /// The eviction settings are invalid.
    #[cfg(feature = "eviction")]
    #[error("eviction settings")]
    Eviction(#[from] kubelet_eviction::EvictionError),
    /// Invalid garbage collection settings.
    #[cfg(feature = "gc")]
    #[error("garbage collection settings")]
    Gc(#[from] kubelet_gc::GcError),
    /// Invalid node resource settings, or swap is on with `failSwapOn`.
    #[cfg(feature = "cm")]
    #[error("node resource management")]
    Cm(#[from] kubelet_cm::CmError),
    /// The API server connection could not be made from the kubeconfig.
    #[cfg(feature = "apiserver")]
    #[error("kubeconfig")]
    ApiServer(#[from] kubelet_apiserver::ApiServerError),
    /// The healthz or read-only port could not be bound.
    #[cfg(feature = "server")]
    #[error(transparent)]
    Server(#[from] kubelet_server::ServerError),
    /// The engine rejected the assembly.
    #[error(transparent)]
    Build(#[from] KubeletError),
}

/// Assembles an agent from a [`KubeletConfiguration`] with the kubelet's defaults; see the
/// [crate docs](crate) for what it makes unless given.
pub struct AgentBuilder {
    node_name: String,
    configuration: KubeletConfiguration,
    root_dir: PathBuf,
    /// Pod logs go under the root directory while `podLogsDir` is the kubelet's default.
    logs_under_root: bool,
    inner: KubeletBuilder,
    runtime: Option<Arc<dyn ContainerRuntime>>,
    runtime_layers: bool,
    start_stage_limit: Option<usize>,
    pleg: Option<(
        Arc<dyn kubelet_api::PodLifecycleEventGenerator>,
        kubelet_api::PlegEvents,
    )>,
    prober: Option<(
        Arc<dyn kubelet_api::ProbeManager>,
        kubelet_api::ProbeUpdates,
    )>,
    default_prober: bool,
    probe_errors_as_failures: bool,
    default_eviction: bool,
    default_stats: bool,
    housekeeping_interval: std::time::Duration,
    default_gc: bool,
    #[cfg(feature = "gc")]
    container_gc: kubelet_gc::ContainerGcPolicy,
    default_cm: bool,
    runtime_cgroups: Option<PathBuf>,
    evict_static_pods: bool,
    static_pod_url_ca_file: Option<PathBuf>,
    #[cfg(feature = "process")]
    shim: kubelet_process::ShimCommand,
    pod_infra_container_image: Option<String>,
    #[cfg(feature = "apiserver")]
    /// The kubeconfig, and API-server settings when given explicitly (else derived from the
    /// configuration at build, whatever order the builder's methods were called in).
    cluster: Option<(PathBuf, Option<kubelet_apiserver::ApiServerConfig>)>,
    #[cfg(feature = "apiserver")]
    bootstrap_kubeconfig: Option<PathBuf>,
    /// The SDK's own settings (`AgentConfiguration`): the pod checkpoint.
    agent_configuration: kubelet_core::configuration::AgentConfiguration,
    default_server: bool,
    cert_dir: Option<PathBuf>,
    node_ip: Option<std::net::IpAddr>,
    node_shutdown: Option<kubelet_core::node_shutdown::NodeShutdown>,
}

impl std::fmt::Debug for AgentBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentBuilder")
            .field("node_name", &self.node_name)
            .field("root_dir", &self.root_dir)
            .finish_non_exhaustive()
    }
}

impl AgentBuilder {
    /// An agent for node `node_name` with the kubelet's default configuration and
    /// `/var/lib/kubelet` as its root directory.
    pub fn new(node_name: impl Into<String>) -> Self {
        let node_name = node_name.into();
        Self {
            inner: KubeletBuilder::new(node_name.clone()),
            node_name,
            configuration: KubeletConfiguration::default(),
            root_dir: PathBuf::from("/var/lib/kubelet"),
            logs_under_root: false,
            runtime: None,
            runtime_layers: true,
            start_stage_limit: None,
            pleg: None,
            prober: None,
            default_prober: true,
            probe_errors_as_failures: false,
            default_eviction: true,
            default_stats: true,
            housekeeping_interval: std::time::Duration::from_secs(10),
            default_gc: true,
            #[cfg(feature = "gc")]
            container_gc: kubelet_gc::ContainerGcPolicy::default(),
            default_cm: true,
            runtime_cgroups: None,
            evict_static_pods: false,
            static_pod_url_ca_file: None,
            #[cfg(feature = "process")]
            shim: kubelet_process::ShimCommand::CurrentExe,
            pod_infra_container_image: None,
            #[cfg(feature = "apiserver")]
            cluster: None,
            #[cfg(feature = "apiserver")]
            bootstrap_kubeconfig: None,
            agent_configuration: Default::default(),
            default_server: true,
            cert_dir: None,
            node_ip: None,
            node_shutdown: None,
        }
    }

    /// `--node-ip`: the node's IP, every pod's `status.hostIP` (and the downward API's), and
    /// the node's `InternalIP` when joining a cluster. Default: the IP the cluster settings
    /// name, else the local address of the default route
    /// ([`KubeletConfig::default_node_ip`]).
    pub fn node_ip(mut self, ip: std::net::IpAddr) -> Self {
        self.node_ip = Some(ip);
        self
    }

    /// `--cert-dir`: where the kubelet API's self-signed serving certificate is kept when
    /// `tlsCertFile` is not set (default `<root-dir>/pki`).
    pub fn cert_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cert_dir = Some(dir.into());
        self
    }

    /// The kubelet's configuration.
    pub fn configuration(mut self, configuration: KubeletConfiguration) -> Self {
        self.configuration = configuration;
        self
    }

    /// Where the agent keeps everything it writes, unless a field says otherwise (see [the
    /// defaults](crate#ports-addresses-and-paths)): pod directories, the process runtime's
    /// state, the serving certificate (`<dir>/pki`), the pod checkpoint, the CPU manager's
    /// state, and, while the configuration's `podLogsDir` is the kubelet's `/var/log/pods`,
    /// the pod logs (`<dir>/logs/pods`, their per-container links in `<dir>/logs/containers`).
    /// [`kubelet_log_layout`](Self::kubelet_log_layout) keeps the kubelet's `/var/log` layout
    /// instead, as `--root-dir` does for the kubelet.
    pub fn root_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.root_dir = dir.into();
        self.logs_under_root = true;
        self
    }

    /// Pod logs where `podLogsDir` says even when it is the kubelet's default `/var/log/pods`,
    /// whatever the root directory: the kubelet's own layout (`minimal_kubelet` keeps it, as
    /// its flags are the kubelet's).
    pub fn kubelet_log_layout(mut self) -> Self {
        self.logs_under_root = false;
        self
    }

    /// The agent's event recorder, for parts made before the agent (a custom runtime's
    /// warnings).
    pub fn recorder(&self) -> kubelet_api::EventRecorder {
        self.inner.recorder()
    }

    /// Use `runtime` instead of the one the configuration names. It gets the deadline and
    /// metrics layers unless [`without_runtime_layers`](Self::without_runtime_layers).
    pub fn runtime(mut self, runtime: Arc<dyn ContainerRuntime>) -> Self {
        self.runtime = Some(runtime);
        self
    }

    /// Do not wrap the runtime in the deadline and metrics layers.
    pub fn without_runtime_layers(mut self) -> Self {
        self.runtime_layers = false;
        self
    }

    /// At most `max` concurrent calls of each pod-start stage (RunPodSandbox, CreateContainer,
    /// StartContainer; [`kubelet_core::layer::StageLimits`]), outside the deadline and metrics
    /// layers, so a call's deadline and recorded duration start when it reaches the runtime.
    /// 0 leaves them unbounded, as the kubelet does.
    ///
    /// Default: on the CRI runtime the agent connects to (`containerRuntimeEndpoint`),
    /// [`StageLimits::cri_default_max`](kubelet_core::layer::StageLimits::cri_default_max), two
    /// per CPU; on the embedded process runtime and on a runtime given with
    /// [`runtime`](Self::runtime), unbounded. Deliberate difference from the kubelet, which
    /// leaves them unbounded: containerd finishes a burst of pods sooner a few calls at a time.
    /// Stops, kills and removals are never bounded.
    pub fn start_stage_limit(mut self, max: usize) -> Self {
        self.start_stage_limit = Some(max);
        self
    }

    /// Use `pleg` (with the receiver of its events) instead of the one made from the runtime.
    pub fn pleg(
        mut self,
        pleg: Arc<dyn kubelet_api::PodLifecycleEventGenerator>,
        events: kubelet_api::PlegEvents,
    ) -> Self {
        self.pleg = Some((pleg, events));
        self
    }

    /// Use `prober` (with the receiver of its result changes) instead of the default one.
    pub fn prober(
        mut self,
        prober: Arc<dyn kubelet_api::ProbeManager>,
        updates: kubelet_api::ProbeUpdates,
    ) -> Self {
        self.prober = Some((prober, updates));
        self
    }

    /// No prober: containers are ready once running (a warning is logged for pods with probes).
    pub fn without_prober(mut self) -> Self {
        self.default_prober = false;
        self
    }

    /// Count probe errors as failures (see `kubelet_probe::ProberConfig::errors_as_failures`).
    pub fn probe_errors_as_failures(mut self, on: bool) -> Self {
        self.probe_errors_as_failures = on;
        self
    }

    /// No node-pressure eviction.
    pub fn without_eviction(mut self) -> Self {
        self.default_eviction = false;
        self
    }

    /// No stats collector (the stats endpoints answer 404).
    pub fn without_stats(mut self) -> Self {
        self.default_stats = false;
        self
    }

    /// No image or container garbage collection and no log rotation (disks fill up).
    pub fn without_gc(mut self) -> Self {
        self.default_gc = false;
        self
    }

    /// No container manager: no QoS or pod cgroups, allocatable equals capacity, and pods are
    /// admitted whatever they request.
    pub fn without_container_manager(mut self) -> Self {
        self.default_cm = false;
        self
    }

    /// `--runtime-cgroups`: the container runtime's cgroup, reported as the `runtime` system
    /// container of the stats summary.
    pub fn runtime_cgroups(mut self, cgroup: impl Into<PathBuf>) -> Self {
        self.runtime_cgroups = Some(cgroup.into());
        self
    }

    /// Container garbage collection's policy (`--maximum-dead-containers-per-container`,
    /// `--maximum-dead-containers`, `--minimum-container-ttl-duration`); the kubelet's
    /// defaults unless set.
    #[cfg(feature = "gc")]
    pub fn container_gc_policy(mut self, policy: kubelet_gc::ContainerGcPolicy) -> Self {
        self.container_gc = policy;
        self
    }

    /// `--housekeeping-interval`: how often the stats collector samples the node, and the
    /// longest it reuses a collection of the pods for their readers (default 10 s).
    pub fn housekeeping_interval(mut self, interval: std::time::Duration) -> Self {
        self.housekeeping_interval = interval;
        self
    }

    /// Let eviction take static pods (the kubelet never evicts them; an agent whose pods all
    /// come from files wants priority to decide).
    pub fn evict_static_pods(mut self, on: bool) -> Self {
        self.evict_static_pods = on;
        self
    }

    /// No healthz or read-only port.
    pub fn without_server(mut self) -> Self {
        self.default_server = false;
        self
    }

    /// PEM file of the CAs that verify an `https` `staticPodURL` (default: the system's roots).
    pub fn static_pod_url_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.static_pod_url_ca_file = Some(path.into());
        self
    }

    /// How the process runtime starts its per-container supervisor. Default
    /// [`ShimCommand::CurrentExe`](kubelet_process::ShimCommand::CurrentExe): the host's `main`
    /// calls [`process::maybe_run_shim`](kubelet_process::shim::maybe_run_shim) first.
    #[cfg(feature = "process")]
    pub fn process_shim(mut self, shim: kubelet_process::ShimCommand) -> Self {
        self.shim = shim;
        self
    }

    /// `--pod-infra-container-image`: for CRI runtimes, made sure to be present at start.
    pub fn pod_infra_container_image(mut self, image: impl Into<String>) -> Self {
        self.pod_infra_container_image = Some(image.into());
        self
    }

    /// Join the cluster of the kubeconfig at `path` (`--kubeconfig`) with the API-server
    /// settings of the configuration (read at build).
    #[cfg(feature = "apiserver")]
    pub fn kubeconfig(mut self, path: impl Into<PathBuf>) -> Self {
        self.cluster = Some((path.into(), None));
        self
    }

    /// Join the cluster of the kubeconfig at `path` with `config` (node labels, node IP, …;
    /// its `root_dir` is set to the agent's).
    #[cfg(feature = "apiserver")]
    pub fn cluster(
        mut self,
        path: impl Into<PathBuf>,
        config: kubelet_apiserver::ApiServerConfig,
    ) -> Self {
        self.cluster = Some((path.into(), Some(config)));
        self
    }

    /// `--bootstrap-kubeconfig`: when the kubeconfig of [`kubeconfig`](Self::kubeconfig) or
    /// [`cluster`](Self::cluster) has no valid client certificate (missing, expired, for
    /// another node), the agent requests one with these credentials (a bootstrap token) at
    /// build, stores it in the certificate directory ([`cert_dir`](Self::cert_dir)) and writes
    /// the kubeconfig ([`kubelet_apiserver::certificate`]). With `rotateCertificates` in the
    /// configuration it is renewed before it expires.
    #[cfg(feature = "apiserver")]
    pub fn bootstrap_kubeconfig(mut self, path: impl Into<PathBuf>) -> Self {
        self.bootstrap_kubeconfig = Some(path.into());
        self
    }

    /// The SDK's own settings ([`AgentConfiguration`](kubelet_core::configuration::AgentConfiguration),
    /// which the kubelet does not have; [`config_file::load`] reads it from a configuration
    /// file's second document). Its `podCheckpoint` (on by default) applies when the agent
    /// joins a cluster and the [`cluster`](Self::cluster) settings name no checkpoint.
    pub fn agent_configuration(
        mut self,
        configuration: kubelet_core::configuration::AgentConfiguration,
    ) -> Self {
        self.agent_configuration = configuration;
        self
    }

    /// No edge autonomy: no pod checkpoint is kept, and an agent that starts while the API
    /// server is unreachable waits for it (the kubelet's behaviour).
    pub fn without_autonomy(mut self) -> Self {
        self.agent_configuration.pod_checkpoint.enabled = false;
        self
    }

    /// Graceful node shutdown: `shutdown` (made with
    /// [`NodeShutdown::from_configuration`](kubelet_core::node_shutdown::NodeShutdown::from_configuration)
    /// from the same configuration) joins the agent as a plugin; keep a clone and call its
    /// [`shut_down`](kubelet_core::node_shutdown::NodeShutdown::shut_down) when the machine is
    /// going down, before stopping the agent. The SDK never watches signals or logind itself.
    pub fn node_shutdown(mut self, shutdown: kubelet_core::node_shutdown::NodeShutdown) -> Self {
        self.node_shutdown = Some(shutdown);
        self
    }

    /// Add a pod source.
    pub fn pod_source(mut self, source: Arc<dyn PodSource>) -> Self {
        self.inner = self.inner.pod_source(source);
        self
    }

    /// Add a status sink.
    pub fn status_sink(mut self, sink: Arc<dyn StatusSink>) -> Self {
        self.inner = self.inner.status_sink(sink);
        self
    }

    /// Add a volume plugin.
    pub fn volume_plugin(mut self, plugin: Arc<dyn VolumePlugin>) -> Self {
        self.inner = self.inner.volume_plugin(plugin);
        self
    }

    /// Add a subsystem (after the built-in ones, which start first).
    pub fn plugin(mut self, plugin: Arc<dyn AgentPlugin>) -> Self {
        self.inner = self.inner.plugin(plugin);
        self
    }

    /// Assemble the agent: create the directories, make what was not given, bind the ports.
    pub async fn build(self) -> Result<Kubelet, AgentError> {
        let Self {
            node_name,
            configuration: mut c,
            root_dir,
            logs_under_root,
            inner,
            runtime,
            runtime_layers,
            start_stage_limit,
            pleg,
            prober,
            default_prober,
            probe_errors_as_failures,
            default_eviction,
            default_stats,
            housekeeping_interval,
            default_gc,
            #[cfg(feature = "gc")]
            container_gc,
            default_cm,
            runtime_cgroups,
            evict_static_pods,
            static_pod_url_ca_file,
            #[cfg(feature = "process")]
            shim,
            pod_infra_container_image,
            #[cfg(feature = "apiserver")]
            cluster,
            #[cfg(feature = "apiserver")]
            bootstrap_kubeconfig,
            agent_configuration,
            default_server,
            cert_dir,
            node_ip,
            node_shutdown,
        } = self;
        #[cfg(not(feature = "apiserver"))]
        let _ = agent_configuration;
        kubelet_core::node_shutdown::validate(&c).map_err(AgentError::NodeShutdown)?;
        for unknown in c.unknown_feature_gates() {
            tracing::warn!(gate = %unknown, "feature gate has no effect on this agent");
        }
        let root_dir = std::path::absolute(&root_dir).map_err(|source| AgentError::CreateDir {
            what: "root directory",
            path: root_dir.clone(),
            source,
        })?;
        if logs_under_root && c.pod_logs_dir == KubeletConfiguration::default().pod_logs_dir {
            c.pod_logs_dir = root_dir
                .join("logs")
                .join("pods")
                .to_string_lossy()
                .into_owned();
        }
        let pod_log_dir = PathBuf::from(&c.pod_logs_dir);
        for (what, dir) in [
            ("root directory", &root_dir),
            ("pod log directory", &pod_log_dir),
        ] {
            std::fs::create_dir_all(dir).map_err(|source| AgentError::CreateDir {
                what,
                path: dir.clone(),
                source,
            })?;
        }
        #[cfg(feature = "apiserver")]
        let node_ip = node_ip.or_else(|| {
            cluster
                .as_ref()
                .and_then(|(_, config)| config.as_ref()?.node_ip.as_deref()?.parse().ok())
        });
        let node_ip = node_ip.or_else(KubeletConfig::default_node_ip);
        let mut engine_config = KubeletConfig::from_configuration(&c, &root_dir);
        engine_config.node_ip = node_ip.map(|ip| ip.to_string());
        let mut builder = inner.config(engine_config);
        if let Some(shutdown) = node_shutdown {
            builder = builder.plugin(Arc::new(shutdown));
        }

        let runtime_given = runtime.is_some();
        let (runtime, layered) = match runtime {
            Some(r) => (r, runtime_layers),
            None => {
                default_runtime(
                    &c,
                    &root_dir,
                    &builder,
                    pod_infra_container_image.as_deref(),
                    #[cfg(feature = "process")]
                    shim,
                )
                .await?
            }
        };
        // The stage limits and the metrics share one layer, the limits outside: a call's
        // deadline and recorded duration start when it reaches the runtime.
        let start_stage_limit = start_stage_limit.unwrap_or_else(|| {
            default_start_stage_limit(runtime_given, &c.container_runtime_endpoint)
        });
        if start_stage_limit > 0 {
            tracing::info!(
                limit = start_stage_limit,
                "pod-start stages bounded: at most `limit` calls of each of RunPodSandbox, CreateContainer and StartContainer at once"
            );
        }
        let limits = (start_stage_limit > 0)
            .then(|| kubelet_core::layer::StageLimits::new(start_stage_limit));
        let runtime = if layered {
            let deadlines =
                kubelet_core::layer::Deadlines::new(c.runtime_request_timeout.as_duration());
            let metrics = kubelet_core::layer::OperationMetrics::new();
            (limits, Some(metrics)).layer(deadlines.layer(runtime))
        } else if limits.is_some() {
            (limits, None::<kubelet_core::layer::OperationMetrics>).layer(runtime)
        } else {
            runtime
        };
        let (pleg, pleg_events) = pleg.unwrap_or_else(|| {
            kubelet_pleg::new_pleg(
                kubelet_pleg::PlegKind::from_configuration(&c),
                runtime.clone(),
            )
        });
        builder = builder.runtime(runtime).pleg(pleg, pleg_events);

        let prober = prober.or_else(|| {
            default_prober
                .then(|| make_prober(probe_errors_as_failures))
                .flatten()
        });
        if let Some((p, updates)) = prober {
            builder = builder.prober(p, updates);
        }
        if default_eviction {
            builder = with_eviction(builder, &c, evict_static_pods)?;
        }
        if default_stats {
            let mut systems = Vec::new();
            // The `pods` system container: the kubepods cgroup the container manager makes.
            #[cfg(feature = "cm")]
            if default_cm
                && c.cgroups_per_qos
                && let Ok(driver) = kubelet_cm::CgroupDriver::parse(&c.cgroup_driver)
            {
                let root = if c.cgroup_root.is_empty() {
                    "/"
                } else {
                    c.cgroup_root.as_str()
                };
                let kubepods = kubelet_cm::cgroups::root_name(root)
                    .child("kubepods")
                    .to_path(driver);
                systems.push(("pods".to_string(), PathBuf::from(kubepods)));
            }
            if let Some(r) = &runtime_cgroups {
                systems.push(("runtime".to_string(), r.clone()));
            }
            builder = with_stats(builder, &c, housekeeping_interval, systems);
        }
        if default_gc {
            #[cfg(feature = "gc")]
            {
                let mut config = gc_config(&c, pod_infra_container_image.as_deref())?;
                config.containers = container_gc;
                builder = builder.plugin(Arc::new(kubelet_gc::GcPlugin::new(config)?));
            }
        }
        if default_cm {
            #[cfg(feature = "cm")]
            {
                if c.fail_swap_on {
                    kubelet_cm::check_swap(std::path::Path::new("/proc"))?;
                }
                #[allow(unused_mut)]
                let mut labels = std::collections::BTreeMap::new();
                #[cfg(feature = "apiserver")]
                if let Some((_, Some(api))) = &cluster {
                    labels.extend(api.node_labels.clone());
                }
                let config = cm_config(&c, &root_dir, labels)?;
                builder = builder.plugin(Arc::new(kubelet_cm::ContainerManager::new(
                    node_name.clone(),
                    config,
                )?));
            }
        }
        if !c.static_pod_path.is_empty() {
            let source = kubelet_podconfig::FileSource::new(&c.static_pod_path, node_name.clone())
                .with_config(
                    kubelet_podconfig::FileSourceConfig::default()
                        .check_frequency(c.file_check_frequency.as_duration()),
                );
            builder = builder.pod_source(Arc::new(source));
        }
        if !c.static_pod_url.is_empty() {
            let mut config = kubelet_podconfig::HttpSourceConfig::default()
                .check_frequency(c.http_check_frequency.as_duration());
            for (name, values) in &c.static_pod_url_header {
                for value in values {
                    config = config.header(name, value);
                }
            }
            if let Some(ca) = &static_pod_url_ca_file {
                config = config.ca_file(ca);
            }
            let source =
                kubelet_podconfig::HttpSource::new(&c.static_pod_url, node_name.clone(), config)?;
            builder = builder.pod_source(Arc::new(source));
        }
        #[allow(unused_mut)]
        let mut reviews = None;
        #[allow(unused_mut)]
        let mut node_addresses: Vec<std::net::IpAddr> = Vec::new();
        // `serverTLSBootstrap`: the pair the cluster signs, served by the kubelet API.
        #[allow(unused_mut)]
        let mut serving_pair: Option<PathBuf> = None;
        let cert_dir = cert_dir.unwrap_or_else(|| root_dir.join("pki"));
        #[cfg(feature = "apiserver")]
        if let Some((path, config)) = cluster {
            // An unknown strategy is a startup error naming the accepted values.
            c.config_map_and_secret_change_detection_strategy
                .parse::<kubelet_apiserver::ChangeDetection>()?;
            let mut config = config
                .unwrap_or_else(|| kubelet_apiserver::ApiServerConfig::from_configuration(&c));
            if let Some(ip) = node_ip {
                config.node_ip = Some(ip.to_string());
            }
            if config.checkpoint.is_none() {
                config.checkpoint =
                    kubelet_apiserver::checkpoint::CheckpointConfig::from_configuration(
                        &agent_configuration.pod_checkpoint,
                    );
            }
            if !default_server {
                config.kubelet_port = None;
            }
            node_addresses.extend(
                config
                    .node_ip
                    .as_deref()
                    .and_then(|ip| ip.parse::<std::net::IpAddr>().ok()),
            );
            let mut certificates =
                kubelet_apiserver::certificate::ClientCertificateConfig::new(&path, &cert_dir)
                    .rotate(c.rotate_certificates);
            if let Some(bootstrap) = &bootstrap_kubeconfig {
                certificates = certificates.bootstrap_kubeconfig(bootstrap);
            }
            let (client, rotation) =
                kubelet_apiserver::certificate::connect(&node_name, &certificates).await?;
            let mut api = kubelet_apiserver::ApiServer::new(
                client,
                node_name.clone(),
                config.root_dir(&root_dir),
            );
            if let Some(rotation) = rotation {
                api = api.with_certificate_manager(rotation);
            }
            if c.server_tls_bootstrap && default_server {
                let hostname = api
                    .config()
                    .hostname
                    .clone()
                    .unwrap_or_else(kubelet_apiserver::machine::hostname);
                let serving = kubelet_apiserver::certificate::serving(
                    &node_name,
                    api.client(),
                    &cert_dir,
                    vec![hostname],
                    node_addresses.clone(),
                )?;
                serving_pair = Some(serving.current_path());
                api = api.with_certificate_manager(serving);
            }
            reviews = Some(api.client());
            builder = builder.plugin(Arc::new(api));
        }
        if default_server {
            let mut server_c = c.clone();
            if let Some(pair) = serving_pair {
                let pair = pair.to_string_lossy().into_owned();
                server_c.tls_cert_file.clone_from(&pair);
                server_c.tls_private_key_file = pair;
            }
            builder = with_server(builder, &server_c, cert_dir, node_addresses, reviews).await?;
        }
        Ok(builder.build()?)
    }
}

fn make_prober(
    errors_as_failures: bool,
) -> Option<(
    Arc<dyn kubelet_api::ProbeManager>,
    kubelet_api::ProbeUpdates,
)> {
    #[cfg(feature = "probe")]
    {
        let config = kubelet_probe::ProberConfig::default().errors_as_failures(errors_as_failures);
        let (prober, updates) = kubelet_probe::Prober::new(config);
        Some((Arc::new(prober), updates))
    }
    #[cfg(not(feature = "probe"))]
    {
        let _ = errors_as_failures;
        None
    }
}

#[cfg(feature = "eviction")]
fn with_eviction(
    builder: KubeletBuilder,
    c: &KubeletConfiguration,
    evict_static_pods: bool,
) -> Result<KubeletBuilder, AgentError> {
    let mut config = kubelet_eviction::EvictionConfig::from_configuration(c)?;
    config.static_pods_are_critical = !evict_static_pods;
    Ok(builder.plugin(Arc::new(kubelet_eviction::EvictionPlugin::new(config))))
}

#[cfg(not(feature = "eviction"))]
fn with_eviction(
    builder: KubeletBuilder,
    _: &KubeletConfiguration,
    _: bool,
) -> Result<KubeletBuilder, AgentError> {
    Ok(builder)
}

#[cfg(feature = "stats")]
fn with_stats(
    builder: KubeletBuilder,
    c: &KubeletConfiguration,
    housekeeping_interval: std::time::Duration,
    system_containers: Vec<(String, PathBuf)>,
) -> KubeletBuilder {
    let mut config = kubelet_stats::StatsConfig::default()
        .housekeeping_interval(housekeeping_interval)
        .volume_stats_agg_period(c.volume_stats_agg_period.as_duration());
    for (name, cgroup) in system_containers {
        config = config.system_container(name, cgroup);
    }
    if !c.kubelet_cgroups.is_empty() {
        config = config.system_container("kubelet", &c.kubelet_cgroups);
    }
    builder.plugin(Arc::new(kubelet_stats::StatsPlugin::new(config)))
}

/// The garbage collectors' settings from the kubelet's configuration; the sandbox image
/// (`--pod-infra-container-image`) is never removed.
#[cfg(feature = "gc")]
pub fn gc_config(
    c: &KubeletConfiguration,
    sandbox_image: Option<&str>,
) -> Result<kubelet_gc::GcConfig, AgentError> {
    let percent = |field: &str, v: i32| {
        u8::try_from(v).ok().filter(|p| *p <= 100).ok_or_else(|| {
            AgentError::Gc(kubelet_gc::GcError::InvalidConfig(format!(
                "{field} ({v}) must be between 0 and 100"
            )))
        })
    };
    let mut config = kubelet_gc::GcConfig::new();
    config.images.high_threshold_percent = percent(
        "imageGCHighThresholdPercent",
        c.image_gc_high_threshold_percent,
    )?;
    config.images.low_threshold_percent = percent(
        "imageGCLowThresholdPercent",
        c.image_gc_low_threshold_percent,
    )?;
    config.images.min_age = c.image_minimum_gc_age.as_duration();
    config.images.max_age = c.image_maximum_gc_age.as_duration();
    config.images.pinned_images = sandbox_image.map(str::to_string).into_iter().collect();
    let size = kubelet_api::quantity::parse_bytes(&c.container_log_max_size).map_err(|e| {
        AgentError::Gc(kubelet_gc::GcError::InvalidConfig(format!(
            "containerLogMaxSize {:?}: {e}",
            c.container_log_max_size
        )))
    })?;
    config.logs.max_size = u64::try_from(size).unwrap_or(0);
    config.logs.max_files = usize::try_from(c.container_log_max_files).unwrap_or(0);
    config.logs.monitor_interval = c.container_log_monitor_interval.as_duration();
    config.container_log_dir = Some(kubelet_core::container_log_dir_for(std::path::Path::new(
        &c.pod_logs_dir,
    )));
    config.validate()?;
    Ok(config)
}

/// The container manager's settings from the kubelet's configuration (`cgroupsPerQOS`,
/// `cgroupDriver`, `cgroupRoot`, reservations, `enforceNodeAllocatable`, `maxPods`,
/// `podPidsLimit`, the CPU manager), with the effective hard eviction thresholds that node
/// allocatable subtracts.
#[cfg(feature = "cm")]
pub fn cm_config(
    c: &KubeletConfiguration,
    root_dir: &std::path::Path,
    node_labels: std::collections::BTreeMap<String, String>,
) -> Result<kubelet_cm::CmConfig, AgentError> {
    let mut config = kubelet_cm::CmConfig::default();
    config.root_dir = root_dir.to_path_buf();
    config.cgroups_per_qos = c.cgroups_per_qos;
    config.cgroup_driver = kubelet_cm::CgroupDriver::parse(&c.cgroup_driver)?;
    config.cgroup_root = if c.cgroup_root.is_empty() {
        "/".into()
    } else {
        c.cgroup_root.clone()
    };
    config.kube_reserved = c.kube_reserved.clone();
    config.system_reserved = c.system_reserved.clone();
    config.enforce_node_allocatable = c.enforce_node_allocatable.clone();
    config.max_pods = i64::from(c.max_pods);
    config.pod_pids_limit = c.pod_pids_limit;
    config.cpu_cfs_quota = c.cpu_cfs_quota;
    config.cpu_manager_policy = kubelet_cm::CpuManagerPolicy::parse(&c.cpu_manager_policy)?;
    config.cpu_manager_reconcile_period = c.cpu_manager_reconcile_period.as_duration();
    config.reserved_system_cpus = c.reserved_system_cpus.clone();
    config.node_labels = node_labels;
    // The kubelet's default hard thresholds unless the configuration names its own; an agent
    // without eviction evicts nothing, so it keeps no headroom for it either.
    let defaults = || -> std::collections::BTreeMap<String, String> {
        #[cfg(feature = "eviction")]
        {
            kubelet_eviction::config::DEFAULT_EVICTION_HARD
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        }
        #[cfg(not(feature = "eviction"))]
        {
            std::collections::BTreeMap::new()
        }
    };
    config.eviction_hard = match &c.eviction_hard {
        None => defaults(),
        Some(m) if c.merge_default_eviction_settings => {
            let mut d = defaults();
            d.extend(m.clone());
            d
        }
        Some(m) => m.clone(),
    };
    Ok(config)
}

#[cfg(not(feature = "stats"))]
fn with_stats(
    builder: KubeletBuilder,
    _: &KubeletConfiguration,
    _: std::time::Duration,
    _: Vec<(String, PathBuf)>,
) -> KubeletBuilder {
    builder
}

/// The API server client the kubelet API's webhook authentication and authorization use.
#[cfg(feature = "apiserver")]
type Reviews = Option<kubelet_apiserver::kube::Client>;
#[cfg(not(feature = "apiserver"))]
type Reviews = Option<std::convert::Infallible>;

#[cfg(feature = "server")]
async fn with_server(
    builder: KubeletBuilder,
    c: &KubeletConfiguration,
    cert_dir: PathBuf,
    node_addresses: Vec<std::net::IpAddr>,
    reviews: Reviews,
) -> Result<KubeletBuilder, AgentError> {
    // The node's addresses join the host name in a generated certificate's SANs.
    let config = kubelet_server::ServerConfig::from_configuration(c)
        .cert_dir(cert_dir)
        .addresses(node_addresses);
    #[allow(unused_mut)]
    let mut server = kubelet_server::KubeletServer::bind(config).await?;
    #[cfg(feature = "apiserver")]
    if let Some(client) = reviews {
        server = server
            .with_token_authenticator(Arc::new(kubelet_apiserver::TokenReviewAuthenticator::new(
                client.clone(),
            )))
            .with_authorizer(Arc::new(
                kubelet_apiserver::SubjectAccessReviewAuthorizer::new(client),
            ));
    }
    #[cfg(not(feature = "apiserver"))]
    let _ = reviews;
    Ok(builder.plugin(Arc::new(server)))
}

#[cfg(not(feature = "server"))]
async fn with_server(
    builder: KubeletBuilder,
    _: &KubeletConfiguration,
    _: PathBuf,
    _: Vec<std::net::IpAddr>,
    _: Reviews,
) -> Result<KubeletBuilder, AgentError> {
    Ok(builder)
}

/// The runtime the configuration names, and whether it wants the core layers (the CRI runtime
/// instruments and bounds its own calls).
/// The start stage limit when none was asked: [`StageLimits::cri_default_max`] on the CRI
/// runtime the agent connects to, unbounded on the process runtime and on a given runtime.
///
/// [`StageLimits::cri_default_max`]: kubelet_core::layer::StageLimits::cri_default_max
fn default_start_stage_limit(runtime_given: bool, endpoint: &str) -> usize {
    if runtime_given || endpoint.is_empty() {
        0
    } else {
        kubelet_core::layer::StageLimits::cri_default_max()
    }
}

async fn default_runtime(
    c: &KubeletConfiguration,
    root_dir: &std::path::Path,
    builder: &KubeletBuilder,
    pod_infra_container_image: Option<&str>,
    #[cfg(feature = "process")] shim: kubelet_process::ShimCommand,
) -> Result<(Arc<dyn ContainerRuntime>, bool), AgentError> {
    let endpoint = c.container_runtime_endpoint.as_str();
    if endpoint.is_empty() {
        #[cfg(feature = "process")]
        {
            let config = kubelet_process::ProcessRuntimeConfig::new(
                root_dir.join("runtime").join("process"),
            )
            .shim(shim);
            let runtime =
                kubelet_process::ProcessRuntime::with_recorder(config, builder.recorder())?;
            let _ = pod_infra_container_image;
            return Ok((Arc::new(runtime), true));
        }
        #[cfg(not(feature = "process"))]
        return Err(AgentError::FeatureDisabled {
            what: "the built-in process runtime (no containerRuntimeEndpoint)".into(),
            feature: "process",
        });
    }
    if !endpoint.starts_with("unix://") {
        return Err(AgentError::Runtime(format!(
            "containerRuntimeEndpoint {endpoint:?}: expected a unix:// endpoint, or none for the process runtime"
        )));
    }
    #[cfg(feature = "cri")]
    {
        let _ = builder;
        let config = kubelet_cri::CriConfig::new(endpoint)
            .request_timeout(c.runtime_request_timeout.as_duration())
            .termination_message_dir(root_dir.join("pods"));
        let cri = kubelet_cri::CriRuntime::connect(config)
            .await
            .map_err(|source| AgentError::Cri {
                endpoint: endpoint.to_string(),
                source,
            })?;
        if let Some(image) = pod_infra_container_image
            && let Err(e) = cri.ensure_sandbox_image(image).await
        {
            tracing::warn!(image = %image, error = %kubelet_api::chain(&e), "--pod-infra-container-image is not available");
        }
        Ok((Arc::new(cri), false))
    }
    #[cfg(not(feature = "cri"))]
    {
        let _ = (root_dir, builder, pod_infra_container_image);
        Err(AgentError::FeatureDisabled {
            what: format!("containerRuntimeEndpoint {endpoint}"),
            feature: "cri",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_stages_are_bounded_by_default_on_the_cri_runtime_only() {
        let cri = kubelet_core::layer::StageLimits::cri_default_max();
        assert!(cri >= 2, "{cri}");
        assert_eq!(
            default_start_stage_limit(false, "unix:///run/containerd/containerd.sock"),
            cri
        );
        assert_eq!(default_start_stage_limit(false, ""), 0, "process runtime");
        assert_eq!(
            default_start_stage_limit(true, "unix:///run/containerd/containerd.sock"),
            0,
            "a runtime the embedder gave"
        );
    }
}
