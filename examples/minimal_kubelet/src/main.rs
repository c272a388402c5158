//! `minimal_kubelet`: a standalone node agent assembled from the kubelet SDK crates.
//!
//! Static pods from `--pod-manifest-path` run on the built-in process runtime (each container a
//! supervised host process), or with `--container-runtime-endpoint unix:///…` on a CRI runtime
//! such as containerd (`kubelet-cri`). `--port` (10250) serves the kubelet API over HTTPS
//! (`kubelet-server`: `/containerLogs` for `kubectl logs`, `/pods`, `/healthz`, `/metrics`,
//! authenticated and authorized), `--read-only-port` the unauthenticated read-only port.
//! With `--kubeconfig` it joins a cluster (`kubelet-apiserver`):
//! registers the Node, renews its Lease, runs the pods bound to it (with their ConfigMaps and
//! Secrets, as env and volumes) and reports their status.
//! Ctrl-C stops the agent and leaves pods running; the next start
//! adopts them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use kubelet::KubeletConfiguration;
use kubelet::core::configuration::AgentConfiguration;
use kubelet::podconfig::{PushSource, PushSourceConfig};
use tokio_util::sync::CancellationToken;

#[cfg(feature = "apiserver")]
mod cluster;
#[cfg(feature = "eviction")]
mod eviction;
mod images;
mod memory;
#[cfg(feature = "cm")]
mod resources;
mod server;

/// Flags, named like the kubelet's.
#[derive(Debug, clap::Parser)]
#[command(name = "minimal_kubelet", version, about)]
struct Flags {
    /// The kubelet's configuration file (`KubeletConfiguration`, YAML or JSON). Flags given
    /// on the command line override its fields; fields this agent does not know are listed in
    /// one warning and ignored.
    #[arg(long = "config")]
    config: Option<PathBuf>,
    /// Directory (or file) of static pod manifests.
    #[arg(long = "pod-manifest-path")]
    pod_manifest_path: Option<PathBuf>,
    /// How often the manifest path is re-listed, besides inotify.
    #[arg(long = "file-check-frequency", default_value = "20s", value_parser = parse_duration)]
    file_check_frequency: Duration,
    /// URL of static pod manifests (one Pod or a PodList), polled every --http-check-frequency.
    #[arg(long = "manifest-url")]
    manifest_url: Option<String>,
    /// Header sent with every --manifest-url request, `Name:Value` (repeatable).
    #[arg(long = "manifest-url-header", value_parser = kubelet::podconfig::http::parse_header)]
    manifest_url_header: Vec<(String, String)>,
    /// How often --manifest-url is polled.
    #[arg(long = "http-check-frequency", default_value = "20s", value_parser = parse_duration)]
    http_check_frequency: Duration,
    /// PEM file of the CAs that verify an https --manifest-url (default: the system's roots).
    #[arg(long = "manifest-url-ca-file")]
    manifest_url_ca_file: Option<PathBuf>,
    /// Address of the pod push endpoint (POST/PUT/DELETE /pods). Off unless set; needs
    /// --pod-push-token-file or --pod-push-client-ca-file. Bind to localhost unless you mean it.
    #[arg(long = "pod-push-address")]
    pod_push_address: Option<SocketAddr>,
    /// File of bearer tokens (one per line) accepted by the push endpoint.
    #[arg(long = "pod-push-token-file")]
    pod_push_token_file: Option<PathBuf>,
    /// PEM file of the CAs whose client certificates the push endpoint accepts (needs
    /// --pod-push-tls-cert-file and --pod-push-tls-private-key-file).
    #[arg(long = "pod-push-client-ca-file")]
    pod_push_client_ca_file: Option<PathBuf>,
    /// Serving certificate of the push endpoint (HTTPS).
    #[arg(long = "pod-push-tls-cert-file")]
    pod_push_tls_cert_file: Option<PathBuf>,
    /// Private key of the push endpoint's serving certificate.
    #[arg(long = "pod-push-tls-private-key-file")]
    pod_push_tls_private_key_file: Option<PathBuf>,
    /// Directory for pod directories and the process runtime's state.
    #[arg(long = "root-dir", default_value = "/var/lib/kubelet")]
    root_dir: PathBuf,
    /// Directory for container logs (`<ns>_<name>_<uid>/<container>/<n>.log`).
    /// Default `/var/log/pods`.
    #[arg(long = "pod-log-dir")]
    pod_log_dir: Option<PathBuf>,
    /// Node name; defaults to the hostname. `--hostname-override` is the kubelet's name for it.
    #[arg(long = "node-name", alias = "hostname-override")]
    node_name: Option<String>,
    /// Container runtime endpoint. Unset: the built-in process runtime; `unix:///…`: a CRI v1
    /// runtime such as containerd (`unix:///run/containerd/containerd.sock`).
    #[arg(long = "container-runtime-endpoint")]
    container_runtime_endpoint: Option<String>,
    /// At most this many concurrent calls of each pod-start stage (RunPodSandbox,
    /// CreateContainer, StartContainer) reach the runtime; 0 leaves them unbounded, as the
    /// kubelet does. Default: two per CPU on a CRI runtime, unbounded on the process runtime.
    /// Not a kubelet flag.
    #[arg(long = "start-stage-limit")]
    start_stage_limit: Option<usize>,
    /// Sandbox (pause) image for CRI runtimes. CRI has no per-sandbox field for it: the agent
    /// makes sure it is present and warns when the runtime is configured with another one.
    #[arg(long = "pod-infra-container-image")]
    pod_infra_container_image: Option<String>,
    /// Deadline of every CRI call except image pulls (the kubelet's runtimeRequestTimeout).
    #[arg(long = "runtime-request-timeout", default_value = "2m", value_parser = parse_duration)]
    runtime_request_timeout: Duration,
    /// How often the stats collector samples the node, pods and containers.
    #[arg(long = "housekeeping-interval", default_value = "10s", value_parser = parse_duration)]
    housekeeping_interval: Duration,
    /// How often pod volumes' disk usage is measured for the stats (`volumeStatsAggPeriod`).
    #[arg(long = "volume-stats-agg-period", default_value = "1m", value_parser = parse_duration)]
    volume_stats_agg_period: Duration,
    /// Port of the read-only API (`/healthz`, `/pods`); 0 disables it (the kubelet's default).
    #[arg(long = "read-only-port", default_value_t = 0)]
    read_only_port: u16,
    /// Address the kubelet API and the read-only port bind to.
    #[arg(long = "address", default_value = "0.0.0.0")]
    address: String,
    /// Port of the localhost healthz endpoint; 0 disables it.
    #[arg(long = "healthz-port", default_value_t = 10248)]
    healthz_port: u16,
    /// Address of the healthz endpoint.
    #[arg(long = "healthz-bind-address", default_value = "127.0.0.1")]
    healthz_bind_address: String,
    /// Cluster DNS server addresses, comma-separated: pods with `dnsPolicy: ClusterFirst` on
    /// the pod network resolve through them.
    #[arg(long = "cluster-dns", value_delimiter = ',')]
    cluster_dns: Vec<String>,
    /// The cluster's domain (e.g. `cluster.local`): pods search `<ns>.svc.<domain>`,
    /// `svc.<domain>` and `<domain>`.
    #[arg(long = "cluster-domain", default_value = "")]
    cluster_domain: String,
    /// The host resolver configuration pods inherit; empty for none.
    #[arg(long = "resolv-conf", default_value = "/etc/resolv.conf")]
    resolv_conf: String,
    /// The node-pressure eviction flags.
    #[cfg(feature = "eviction")]
    #[command(flatten)]
    eviction: eviction::EvictionFlags,
    /// Image pulls, garbage collection and log rotation.
    #[command(flatten)]
    images: images::ImageFlags,
    /// QoS cgroups, reservations, admission and the CPU manager.
    #[cfg(feature = "cm")]
    #[command(flatten)]
    resources: resources::ResourceFlags,
    /// Beyond the kubelet: count probe errors (an exec the runtime rejects, a probe port that
    /// names no container port) as probe failures. The kubelet discards them, so a liveness
    /// probe that keeps erroring never restarts anything.
    #[cfg(feature = "probe")]
    #[arg(long = "probe-errors-as-failures", default_value_t = false)]
    probe_errors_as_failures: bool,
    /// Feature gates, `Key=bool,…`; `EventedPLEG=false` turns the evented PLEG off (relist every
    /// 1 s, the kubelet's default); it is on by default.
    #[arg(long = "feature-gates", default_value = "", value_parser = kubelet::core::configuration::parse_feature_gates)]
    feature_gates: std::collections::BTreeMap<String, bool>,
    /// `--kubeconfig` and the node's API server flags.
    #[cfg(feature = "apiserver")]
    #[command(flatten)]
    cluster: cluster::ClusterFlags,
    /// The kubelet API's flags (`--port`, TLS, authentication, authorization).
    #[command(flatten)]
    server: server::ServerFlags,
    /// Log verbosity (kubelet-style); `RUST_LOG` takes precedence.
    #[arg(long = "v", short = 'v', default_value_t = 2)]
    verbosity: u8,
    /// Log format: `text` (colours only when stderr is a terminal) or `json` (one object per
    /// line: `timestamp`, `level`, `fields` with `message` and the event's keys, `target`). A
    /// pod's and a container's lines use the kubelet's keys: `pod`, `podUID`, `containerName`,
    /// `containerID`.
    #[arg(long = "log-format", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    match kubelet::core::duration::parse_go(s).map_err(|e| e.to_string())? {
        (false, d) if !d.is_zero() => Ok(d),
        _ => Err(format!(
            "duration {s:?} must be positive (e.g. 20s, 500ms, 1m)"
        )),
    }
}

/// Which flags were given on the command line. With `--config`, only those override the
/// file (the kubelet re-applies the command line over its file); without one, every flag
/// (given or defaulted) makes the configuration.
pub(crate) struct Given<'a> {
    matches: &'a clap::ArgMatches,
    all: bool,
}

impl Given<'_> {
    /// Whether the flag whose argument id (the field's name) is `id` sets its field.
    pub(crate) fn has(&self, id: &str) -> bool {
        self.all || self.matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine)
    }
}

/// The kubelet's configuration: `--config`'s file (or the defaults), then the flags: the one
/// place flags map into it.
fn configuration(
    flags: &Flags,
    matches: &clap::ArgMatches,
) -> anyhow::Result<(KubeletConfiguration, AgentConfiguration)> {
    #[allow(unused_mut)]
    let mut agent = AgentConfiguration::default();
    let mut c = match &flags.config {
        Some(path) => {
            let loaded = kubelet::config_file::load(path)?;
            if !loaded.unknown_fields.is_empty() {
                tracing::warn!(
                    file = %loaded.path.display(),
                    fields = %loaded.unknown_fields.join(", "),
                    "the configuration file has fields this agent does not know or support; they are ignored"
                );
            }
            agent = loaded.agent;
            loaded.configuration
        }
        None => KubeletConfiguration::default(),
    };
    let given = Given {
        matches,
        all: flags.config.is_none(),
    };
    if let Some(path) = &flags.pod_manifest_path {
        c.static_pod_path = path.to_string_lossy().into_owned();
    }
    if given.has("file_check_frequency") {
        c.file_check_frequency = flags.file_check_frequency.into();
    }
    if let Some(url) = &flags.manifest_url {
        c.static_pod_url = url.clone();
    }
    if !flags.manifest_url_header.is_empty() {
        c.static_pod_url_header.clear();
    }
    for (name, value) in &flags.manifest_url_header {
        c.static_pod_url_header
            .entry(name.clone())
            .or_default()
            .push(value.clone());
    }
    if given.has("http_check_frequency") {
        c.http_check_frequency = flags.http_check_frequency.into();
    }
    if let Some(dir) = &flags.pod_log_dir {
        c.pod_logs_dir = dir.to_string_lossy().into_owned();
    }
    if let Some(endpoint) = &flags.container_runtime_endpoint {
        c.container_runtime_endpoint = endpoint.clone();
    }
    if given.has("runtime_request_timeout") {
        c.runtime_request_timeout = flags.runtime_request_timeout.into();
    }
    if given.has("volume_stats_agg_period") {
        c.volume_stats_agg_period = flags.volume_stats_agg_period.into();
    }
    if given.has("cluster_dns") {
        c.cluster_dns = flags
            .cluster_dns
            .iter()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
    }
    for ip in &c.cluster_dns {
        ip.parse::<std::net::IpAddr>()
            .map_err(|_| anyhow::anyhow!("clusterDNS: {ip:?} is not an IP address"))?;
    }
    if given.has("cluster_domain") {
        c.cluster_domain = flags.cluster_domain.clone();
    }
    if given.has("resolv_conf") {
        c.resolv_conf = flags.resolv_conf.clone();
    }
    if given.has("read_only_port") {
        c.read_only_port = flags.read_only_port;
    }
    if given.has("address") {
        c.address = flags.address.clone();
    }
    if given.has("healthz_port") {
        c.healthz_port = flags.healthz_port;
    }
    if given.has("healthz_bind_address") {
        c.healthz_bind_address = flags.healthz_bind_address.clone();
    }
    #[cfg(feature = "eviction")]
    eviction::configure(&flags.eviction, &given, &mut c)?;
    images::configure(&flags.images, &given, &mut c);
    #[cfg(feature = "cm")]
    resources::configure(&flags.resources, &given, &mut c);
    // Gates merge key by key with the file's, as the kubelet's do.
    c.feature_gates.extend(flags.feature_gates.clone());
    #[cfg(feature = "apiserver")]
    cluster::configure(&flags.cluster, &given, &mut c, &mut agent)?;
    server::configure(&flags.server, &given, &mut c);
    Ok((c, agent))
}

/// Logs to stderr: text with colours only when stderr is a terminal, or JSON lines.
fn init_logging(verbosity: u8, format: &str) {
    use std::io::IsTerminal;
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let default = match verbosity {
        0..=3 => LevelFilter::INFO,
        4..=5 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    };
    // `RUST_LOG` as `level` and `target=level` directives (no span or field filters: they need
    // a regex engine, about 1 MB of binary).
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| v.parse::<Targets>().ok())
        .unwrap_or_else(|| Targets::new().with_default(default));
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let registry = tracing_subscriber::registry().with(filter);
    if format == "json" {
        registry.with(layer.json().with_ansi(false)).init();
    } else {
        registry
            .with(layer.with_ansi(std::io::stderr().is_terminal()))
            .init();
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_lowercase())
        .unwrap_or_else(|_| "localhost".to_string())
}

fn main() -> ExitCode {
    // The process runtime's per-container supervisor is this same binary.
    if let Some(code) = kubelet::process::shim::maybe_run_shim() {
        return code;
    }
    let matches = <Flags as clap::CommandFactory>::command().get_matches();
    let flags = match <Flags as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(flags) => flags,
        Err(e) => e.exit(),
    };
    init_logging(flags.verbosity, &flags.log_format);
    memory::limit_malloc_arenas();
    raise_open_files_limit();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        // Blocking-pool threads (file system calls) leave soon after a burst, with their stacks.
        .thread_keep_alive(Duration::from_secs(2))
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("minimal_kubelet: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(flags, matches)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("minimal_kubelet: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(flags: Flags, matches: clap::ArgMatches) -> anyhow::Result<()> {
    tokio::spawn(memory::release_freed_memory());
    let node_name = flags.node_name.clone().unwrap_or_else(hostname);
    let (configuration, agent_configuration) = configuration(&flags, &matches)?;
    #[cfg(feature = "apiserver")]
    let cluster = cluster::api_server_config(&flags.cluster, &configuration, &flags.root_dir)?;
    let summary = startup_summary(&flags, &configuration);
    let node_shutdown =
        kubelet::core::node_shutdown::NodeShutdown::from_configuration(&configuration);
    #[allow(unused_mut)]
    let mut agent = kubelet::AgentBuilder::new(node_name.clone())
        .configuration(configuration)
        .agent_configuration(agent_configuration)
        .root_dir(&flags.root_dir)
        .kubelet_log_layout()
        .housekeeping_interval(flags.housekeeping_interval);
    if let Some(limit) = flags.start_stage_limit {
        agent = agent.start_stage_limit(limit);
    }
    #[cfg(feature = "probe")]
    {
        agent = agent.probe_errors_as_failures(flags.probe_errors_as_failures);
    }
    #[cfg(feature = "eviction")]
    {
        agent = agent.evict_static_pods(flags.eviction.evict_static_pods);
    }
    #[cfg(feature = "gc")]
    {
        agent = agent.container_gc_policy(images::container_gc_policy(&flags.images));
    }
    #[cfg(feature = "cm")]
    if let Some(cgroup) = &flags.resources.runtime_cgroups {
        agent = agent.runtime_cgroups(cgroup);
    }
    if let Some(image) = &flags.pod_infra_container_image {
        agent = agent.pod_infra_container_image(image);
    }
    if let Some(ca) = &flags.manifest_url_ca_file {
        agent = agent.static_pod_url_ca_file(ca);
    }
    #[cfg(feature = "apiserver")]
    if let Some(config) = cluster {
        agent = agent.cluster(&config.0, config.1);
    }
    #[cfg(feature = "apiserver")]
    if let Some(path) = &flags.cluster.bootstrap_kubeconfig {
        agent = agent.bootstrap_kubeconfig(path);
    }
    #[cfg(feature = "apiserver")]
    if let Some(ip) = flags.cluster.node_ip {
        agent = agent.node_ip(ip);
    }
    if let Some(dir) = &flags.server.cert_dir {
        agent = agent.cert_dir(dir);
    }
    if let Some(address) = flags.pod_push_address {
        let mut config = PushSourceConfig::default().address(address);
        if let Some(tokens) = &flags.pod_push_token_file {
            config = config.token_file(tokens);
        }
        if let (Some(cert), Some(key)) = (
            &flags.pod_push_tls_cert_file,
            &flags.pod_push_tls_private_key_file,
        ) {
            config = config.tls(cert, key);
        }
        if let Some(ca) = &flags.pod_push_client_ca_file {
            config = config.client_ca_file(ca);
        }
        let source = PushSource::bind(config, node_name.clone())
            .await
            .context("--pod-push-address")?;
        agent = agent.pod_source(Arc::new(source));
    }
    #[cfg(feature = "apiserver")]
    let kubeconfig = flags.cluster.kubeconfig.is_some();
    #[cfg(not(feature = "apiserver"))]
    let kubeconfig = false;
    if flags.pod_manifest_path.is_none()
        && flags.manifest_url.is_none()
        && flags.pod_push_address.is_none()
        && !kubeconfig
    {
        tracing::warn!(
            "no --pod-manifest-path, --manifest-url, --pod-push-address or --kubeconfig: this agent has no pod source and will run no pods"
        );
    }
    if let Some(s) = &node_shutdown {
        agent = agent.node_shutdown(s.clone());
    }
    let kubelet = agent.build().await.context("assembling the agent")?;

    let shutdown = CancellationToken::new();
    {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let signal = wait_for_signal().await;
            match (&node_shutdown, signal) {
                // The machine is going down (the kubelet learns it from logind; this agent
                // from its service manager's SIGTERM): terminate the pods within the
                // configured periods, then stop.
                (Some(s), Signal::Term) => {
                    tracing::info!(period = ?s.total_period(), "SIGTERM: graceful node shutdown");
                    if let Err(e) = s.shut_down().await {
                        tracing::warn!(error = %e, "graceful node shutdown");
                    }
                    tracing::info!("graceful node shutdown done: stopping the agent");
                }
                _ => tracing::info!("signal received: stopping the agent, pods keep running"),
            }
            shutdown.cancel();
        });
    }
    tracing::info!(
        node = %node_name,
        runtime = %summary.runtime,
        pleg = summary.pleg,
        listening = %summary.listening,
        "minimal_kubelet running"
    );
    tokio::spawn(log_condition_changes(kubelet.handle(), shutdown.clone()));
    kubelet.run(shutdown).await;
    Ok(())
}

/// Logs each change of the node's conditions once (what the plugins report, merged as the
/// node status shows them): a node without an API server sees its own pressure conditions.
/// It looks every 10 s, the kubelet's `nodeStatusUpdateFrequency`, at which the node status
/// shows them too (asking every plugin each second was a twentieth of the idle agent's CPU
/// time at 1,000 pods).
async fn log_condition_changes(handle: kubelet::KubeletHandle, shutdown: CancellationToken) {
    use kubelet::seams::AgentHandle;
    let mut last: std::collections::BTreeMap<String, (String, String, String)> = Default::default();
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(10));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now: std::collections::BTreeMap<String, (String, String, String)> = handle
            .node_conditions()
            .into_iter()
            .map(|c| {
                let reason = c.reason.unwrap_or_default();
                let message = c.message.unwrap_or_default();
                (c.type_, (c.status, reason, message))
            })
            .collect();
        for (type_, (status, reason, message)) in &now {
            if last.get(type_) != now.get(type_) {
                tracing::info!(condition = %type_, %status, %reason, detail = %message, "node condition changed");
            }
        }
        for type_ in last.keys().filter(|t| !now.contains_key(*t)) {
            tracing::info!(condition = %type_, "node condition no longer reported");
        }
        last = now;
    }
}

/// Raise the soft limit on open files to the hard limit (the binary's business, not the
/// libraries'): the listeners' connection caps are derived from it, and a flood of connections
/// must not starve the agent of descriptors.
fn raise_open_files_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => tracing::info!(from = soft, to = hard, "raised the open-file limit"),
            Err(e) => {
                tracing::warn!(error = %kubelet::seams::chain(&e), soft, hard, "could not raise the open-file limit")
            }
        },
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(error = %kubelet::seams::chain(&e), "could not read the open-file limit")
        }
    }
}

/// What the start-up line states: the runtime, the PLEG and every listening address.
struct Summary {
    runtime: String,
    pleg: &'static str,
    listening: String,
}

fn startup_summary(flags: &Flags, c: &KubeletConfiguration) -> Summary {
    let runtime = if c.container_runtime_endpoint.is_empty() {
        "process (built in)".to_string()
    } else {
        format!("CRI at {}", c.container_runtime_endpoint)
    };
    let pleg = match kubelet::pleg::PlegKind::from_configuration(c) {
        kubelet::pleg::PlegKind::Relist => "relist (1s)",
        _ => "evented (relist every 300s as the safety net; 1s without runtime events)",
    };
    let host = |a: &str| {
        if a.contains(':') {
            format!("[{a}]")
        } else {
            a.to_string()
        }
    };
    let mut listening = Vec::new();
    // Without the `https` feature the kubelet API is not served (kubelet-server logs why).
    if cfg!(feature = "https") && c.enable_server && c.port != 0 {
        listening.push(format!(
            "kubelet API https://{}:{}",
            host(&c.address),
            c.port
        ));
    }
    if c.read_only_port != 0 {
        listening.push(format!(
            "read-only http://{}:{}",
            host(&c.address),
            c.read_only_port
        ));
    }
    if c.healthz_port != 0 {
        listening.push(format!(
            "healthz http://{}:{}",
            host(&c.healthz_bind_address),
            c.healthz_port
        ));
    }
    if let Some(a) = flags.pod_push_address {
        let scheme = if flags.pod_push_tls_cert_file.is_some() {
            "https"
        } else {
            "http"
        };
        listening.push(format!("pod push {scheme}://{a}"));
    }
    Summary {
        runtime,
        pleg,
        listening: if listening.is_empty() {
            "nothing".to_string()
        } else {
            listening.join(", ")
        },
    }
}

/// The stop signal received.
enum Signal {
    /// Ctrl-C (SIGINT): stop the agent.
    Interrupt,
    /// SIGTERM: the service manager stops the agent (the machine may be going down).
    Term,
}

async fn wait_for_signal() -> Signal {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %kubelet::seams::chain(&e), "cannot watch SIGTERM; only Ctrl-C stops the agent");
            let _ = tokio::signal::ctrl_c().await;
            return Signal::Interrupt;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => Signal::Interrupt,
        _ = term.recv() => Signal::Term,
    }
}
