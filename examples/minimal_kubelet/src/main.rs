//! `minimal_kubelet`: a standalone node agent assembled from the kubelet SDK crates.
//!
//! Static pods from `--pod-manifest-path` run on the built-in process runtime (each container a
//! supervised host process); `--read-only-port` serves `GET /healthz` and `GET /pods` like the
//! kubelet's read-only port. Ctrl-C stops the agent and leaves pods running; the next start
//! adopts them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use kubelet_core::{ContainerRuntime, KubeletBuilder, KubeletConfig};
use kubelet_pleg::{GenericPleg, GenericPlegConfig};
use kubelet_podconfig::{FileSource, FileSourceConfig};
use kubelet_process::{ProcessRuntime, ProcessRuntimeConfig, ShimCommand};
use tokio_util::sync::CancellationToken;

mod server;

/// Flags, named like the kubelet's.
#[derive(Debug, Parser)]
#[command(name = "minimal_kubelet", version, about)]
struct Flags {
    /// Directory (or file) of static pod manifests.
    #[arg(long = "pod-manifest-path")]
    pod_manifest_path: Option<PathBuf>,
    /// How often the manifest path is re-listed, besides inotify.
    #[arg(long = "file-check-frequency", default_value = "20s", value_parser = parse_duration)]
    file_check_frequency: Duration,
    /// Directory for pod directories and the process runtime's state.
    #[arg(long = "root-dir", default_value = "/var/lib/kubelet")]
    root_dir: PathBuf,
    /// Directory for container logs (`<ns>_<name>_<uid>/<container>/<n>.log`).
    /// Default `/var/log/pods`.
    #[arg(long = "pod-log-dir")]
    pod_log_dir: Option<PathBuf>,
    /// Node name; defaults to the hostname.
    #[arg(long = "node-name")]
    node_name: Option<String>,
    /// Container runtime endpoint. Unset: the built-in process runtime.
    #[arg(long = "container-runtime-endpoint")]
    container_runtime_endpoint: Option<String>,
    /// Port of the read-only API (`/healthz`, `/pods`); 0 disables it (the kubelet's default).
    #[arg(long = "read-only-port", default_value_t = 0)]
    read_only_port: u16,
    /// Address the read-only port binds to.
    #[arg(long = "address", default_value = "0.0.0.0")]
    address: String,
    /// Port of the localhost healthz endpoint; 0 disables it.
    #[arg(long = "healthz-port", default_value_t = 10248)]
    healthz_port: u16,
    /// Address of the healthz endpoint.
    #[arg(long = "healthz-bind-address", default_value = "127.0.0.1")]
    healthz_bind_address: String,
    /// Log verbosity (kubelet-style); `RUST_LOG` takes precedence.
    #[arg(long = "v", short = 'v', default_value_t = 2)]
    verbosity: u8,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, mult) = if let Some(n) = s.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration {s:?} (use e.g. 20s, 500ms, 1m)"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("duration {s:?} must be positive"));
    }
    Ok(Duration::from_secs_f64(v * mult))
}

fn init_logging(verbosity: u8) {
    let default = match verbosity {
        0..=3 => "info",
        4..=5 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_lowercase())
        .unwrap_or_else(|_| "localhost".to_string())
}

fn main() -> ExitCode {
    // The process runtime's per-container supervisor is this same binary.
    if let Some(code) = kubelet_process::shim::maybe_run_shim() {
        return code;
    }
    let flags = Flags::parse();
    init_logging(flags.verbosity);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("minimal_kubelet: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(flags)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("minimal_kubelet: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(flags: Flags) -> anyhow::Result<()> {
    let node_name = flags.node_name.clone().unwrap_or_else(hostname);
    let pod_log_dir = flags
        .pod_log_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("/var/log/pods"));
    std::fs::create_dir_all(&flags.root_dir)
        .with_context(|| format!("creating --root-dir {}", flags.root_dir.display()))?;
    std::fs::create_dir_all(&pod_log_dir)
        .with_context(|| format!("creating --pod-log-dir {}", pod_log_dir.display()))?;

    let mut builder = KubeletBuilder::new(node_name.clone())
        .config(KubeletConfig::with_dirs(&flags.root_dir, &pod_log_dir));

    let runtime: Arc<dyn ContainerRuntime> = match flags.container_runtime_endpoint.as_deref() {
        None | Some("") => {
            let config = ProcessRuntimeConfig::new(flags.root_dir.join("runtime").join("process"))
                .shim(ShimCommand::CurrentExe);
            Arc::new(
                ProcessRuntime::with_recorder(config, builder.recorder())
                    .context("starting the process runtime")?,
            )
        }
        Some(endpoint) if endpoint.starts_with("unix://") => bail!(
            "--container-runtime-endpoint {endpoint}: CRI runtimes are not supported by this build yet; \
             leave the flag unset to use the built-in process runtime"
        ),
        Some(endpoint) => bail!(
            "--container-runtime-endpoint {endpoint:?}: expected a unix:// endpoint, or no flag for the process runtime"
        ),
    };
    let pleg = Arc::new(GenericPleg::new(
        runtime.clone(),
        GenericPlegConfig::default(),
    ));
    builder = builder.runtime(runtime).pleg(pleg);
    if let Some(path) = &flags.pod_manifest_path {
        let source = FileSource::new(path, node_name.clone())
            .with_config(FileSourceConfig::default().check_frequency(flags.file_check_frequency));
        builder = builder.pod_source(Arc::new(source));
    } else {
        tracing::warn!("no --pod-manifest-path: this agent has no pod source and will run no pods");
    }
    let kubelet = builder.build().context("assembling the agent")?;
    let handle = kubelet.handle();

    let shutdown = CancellationToken::new();
    let mut servers = tokio::task::JoinSet::new();
    if flags.read_only_port != 0 {
        let addr: SocketAddr = format!("{}:{}", flags.address, flags.read_only_port)
            .parse()
            .with_context(|| format!("--address {:?}", flags.address))?;
        let listener = server::bind(addr).await?;
        servers.spawn(server::serve(
            listener,
            handle.clone(),
            true,
            shutdown.clone(),
        ));
    }
    if flags.healthz_port != 0 {
        let addr: SocketAddr = format!("{}:{}", flags.healthz_bind_address, flags.healthz_port)
            .parse()
            .with_context(|| format!("--healthz-bind-address {:?}", flags.healthz_bind_address))?;
        let listener = server::bind(addr).await?;
        servers.spawn(server::serve(
            listener,
            handle.clone(),
            false,
            shutdown.clone(),
        ));
    }

    {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("signal received: stopping the agent, pods keep running");
            shutdown.cancel();
        });
    }
    tracing::info!(node = %node_name, "minimal_kubelet running");
    kubelet.run(shutdown.clone()).await;
    shutdown.cancel();
    while servers.join_next().await.is_some() {}
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGTERM; only Ctrl-C stops the agent");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
