//! [`CriRuntime`]: the core [`ContainerRuntime`] over a CRI v1 runtime.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use hyper_util::rt::TokioIo;
use jiff::Timestamp;
use kubelet_api::ContainerRuntime;
use kubelet_api::runtime::{
    self as core, ContainerState, ExecResult, ImageSpec, PodSandboxConfig, RuntimeStatus,
    RuntimeVersion, labels,
};
use kubelet_api::{Error, ErrorKind, Result};
use tonic::transport::{Channel, Endpoint, Uri};
use tracing::{debug, warn};

use crate::convert;
use crate::error::CriError;
use crate::metrics::RuntimeMetrics;
use crate::proto::v1 as cri;
use crate::proto::v1::image_service_client::ImageServiceClient;
use crate::proto::v1::runtime_service_client::RuntimeServiceClient;

/// The CRI API version this client speaks, as `VersionResponse.runtime_api_version` reports it.
pub const CRI_API_VERSION: &str = "v1";

/// The kubelet's default `containerRuntimeEndpoint`.
pub const DEFAULT_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";

/// The kubelet's gRPC message size limit (16 MiB).
const MAX_MESSAGE_SIZE: usize = 16 * 1024 * 1024;

/// The most of a termination message file the kubelet reads.
const MAX_TERMINATION_MESSAGE: u64 = 4096;

/// Settings of a [`CriRuntime`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CriConfig {
    /// `unix:///path/to/socket` (or a bare absolute socket path).
    pub endpoint: String,
    /// Deadline of every call (`runtimeRequestTimeout`, default 2 minutes). `StopContainer`
    /// gets this plus the grace period, `ExecSync` this plus the command's timeout.
    pub request_timeout: Duration,
    /// Deadline of `PullImage`; `None` (the default, as the kubelet) for none.
    pub image_pull_timeout: Option<Duration>,
    /// How long to wait for the socket to accept a connection (default 10 s).
    pub connect_timeout: Duration,
    /// CRI runtime handler (`RuntimeClass` handler) for new sandboxes; empty for the default.
    pub runtime_handler: String,
    /// Where termination message files are created, laid out as the kubelet's
    /// `<root-dir>/pods`: `<dir>/<pod uid>/containers/<container>/<attempt>`. Each is
    /// bind-mounted at the container's `terminationMessagePath` and read back when the container
    /// exits. `None` mounts nothing (messages then come only from the runtime).
    pub termination_message_dir: Option<PathBuf>,
    /// The containerd namespace whose native events `container_events` follows when the runtime
    /// has no CRI `GetContainerEvents` (containerd 1.6): the CRI plugin's, `k8s.io`.
    pub containerd_namespace: String,
    /// Whether `container_events` tries containerd's native events before CRI
    /// `GetContainerEvents` (default `false`: CRI first, as the kubelet). containerd ≥ 1.7
    /// sends a CRI exit event only once its CRI plugin has deleted the task; its native events
    /// with exit hints ([`crate::exits`]) report the exit tens of milliseconds sooner. A runtime
    /// without containerd's event service (CRI-O) still gets CRI's.
    pub prefer_containerd_events: bool,
}

impl CriConfig {
    /// Defaults for `endpoint`: 2 minute request timeout, no pull deadline, no termination
    /// message files.
    pub fn new(endpoint: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            request_timeout: Duration::from_secs(120),
            image_pull_timeout: None,
            connect_timeout: Duration::from_secs(10),
            runtime_handler: String::new(),
            termination_message_dir: None,
            containerd_namespace: crate::events::CRI_NAMESPACE.to_string(),
            prefer_containerd_events: false,
        }
    }

    /// Sets [`request_timeout`](Self::request_timeout).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets [`image_pull_timeout`](Self::image_pull_timeout).
    pub fn image_pull_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.image_pull_timeout = timeout;
        self
    }

    /// Sets [`connect_timeout`](Self::connect_timeout).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets [`runtime_handler`](Self::runtime_handler).
    pub fn runtime_handler(mut self, handler: impl Into<String>) -> Self {
        self.runtime_handler = handler.into();
        self
    }

    /// Sets [`termination_message_dir`](Self::termination_message_dir).
    pub fn termination_message_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.termination_message_dir = Some(dir.into());
        self
    }

    /// Sets [`containerd_namespace`](Self::containerd_namespace).
    pub fn containerd_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.containerd_namespace = namespace.into();
        self
    }

    /// Sets [`prefer_containerd_events`](Self::prefer_containerd_events).
    pub fn prefer_containerd_events(mut self, prefer: bool) -> Self {
        self.prefer_containerd_events = prefer;
        self
    }
}

/// The socket path of a `unix://` endpoint.
pub fn socket_path(endpoint: &str) -> Result<PathBuf, CriError> {
    let invalid = |reason| CriError::InvalidEndpoint {
        endpoint: endpoint.to_string(),
        reason,
    };
    let path = if let Some(rest) = endpoint.strip_prefix("unix://") {
        rest
    } else if endpoint.starts_with('/') {
        endpoint
    } else if endpoint.contains("://") {
        return Err(invalid("only unix:// endpoints are supported"));
    } else {
        return Err(invalid("expected unix:///absolute/path/to/socket"));
    };
    if !path.starts_with('/') {
        return Err(invalid("the socket path must be absolute (unix:///…)"));
    }
    Ok(PathBuf::from(path))
}

/// Result of [`CriRuntime::ensure_sandbox_image`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SandboxImageCheck {
    /// The sandbox image the runtime is configured with, if it reports it.
    pub runtime_sandbox_image: Option<String>,
    /// True when the image was missing and has been pulled.
    pub pulled: bool,
    /// False when the runtime reports a different sandbox image than the requested one.
    pub matches_runtime: bool,
}

/// A [`ContainerRuntime`] that talks CRI v1 to containerd (or CRI-O) over a unix socket.
///
/// The connection is made lazily and remade after it breaks, so a runtime that restarts is
/// reached again on the next call; calls made while it is away fail with
/// [`ErrorKind::Unavailable`]. Every call has a deadline ([`CriConfig::request_timeout`]);
/// one that passes fails with [`ErrorKind::DeadlineExceeded`].
#[derive(Debug, Clone)]
pub struct CriRuntime {
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    config: CriConfig,
    metrics: RuntimeMetrics,
    events: crate::events::EventSubscriber,
}

impl CriRuntime {
    /// A client for `config.endpoint` without contacting the runtime yet.
    pub fn new(config: CriConfig) -> Result<Self, CriError> {
        let path = socket_path(&config.endpoint)?;
        // The URI is not used for routing: every connection goes to the socket.
        let channel = Endpoint::from_static("http://cri.invalid")
            .connect_timeout(config.connect_timeout)
            .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(path).await?;
                    Ok::<_, std::io::Error>(TokioIo::new(stream))
                }
            }));
        let events = crate::events::EventSubscriber::new(&channel, &config, MAX_MESSAGE_SIZE);
        Ok(Self {
            runtime: RuntimeServiceClient::new(channel.clone())
                .max_decoding_message_size(MAX_MESSAGE_SIZE)
                .max_encoding_message_size(MAX_MESSAGE_SIZE),
            images: ImageServiceClient::new(channel)
                .max_decoding_message_size(MAX_MESSAGE_SIZE)
                .max_encoding_message_size(MAX_MESSAGE_SIZE),
            config,
            metrics: RuntimeMetrics::new(),
            events,
        })
    }

    /// A client for `config.endpoint` after the `Version` handshake: the runtime must answer
    /// and speak CRI `v1`.
    pub async fn connect(config: CriConfig) -> Result<Self, CriError> {
        let rt = Self::new(config)?;
        let v = rt.cri_version().await?;
        if v.runtime_api_version != CRI_API_VERSION {
            return Err(CriError::UnsupportedApiVersion {
                runtime: format!("{} {}", v.runtime_name, v.runtime_version),
                api_version: v.runtime_api_version,
            });
        }
        debug!(
            runtime = %v.runtime_name,
            version = %v.runtime_version,
            "connected to CRI runtime"
        );
        Ok(rt)
    }

    /// The source [`container_events`](ContainerRuntime::container_events) streams use: known
    /// once a subscription of this runtime (or a clone) was answered, `None` before. A CRI
    /// `GetContainerEvents` subscription counts as answered when its first event arrives (the
    /// runtime sends nothing before); containerd's native one as soon as it was made.
    pub fn container_event_source(&self) -> Option<crate::events::ContainerEventSource> {
        self.events.source()
    }

    /// The settings this runtime was made with.
    pub fn config(&self) -> &CriConfig {
        &self.config
    }

    /// The sandbox (pause) image the runtime is configured with, if it reports its
    /// configuration (containerd does, in `Status(verbose)` → `info.config.sandboxImage`).
    ///
    /// CRI has no field to pass a sandbox image with each sandbox: the runtime's own
    /// configuration decides. A node agent uses this to check its `--pod-infra-container-image`
    /// against the runtime's.
    pub async fn sandbox_image(&self) -> Result<Option<String>, CriError> {
        let mut c = self.runtime.clone();
        let resp = self
            .unary(
                "Status",
                Some(self.config.request_timeout),
                move |r| async move { c.status(r).await },
                cri::StatusRequest { verbose: true },
            )
            .await?;
        let Some(config) = resp.info.get("config") else {
            return Ok(None);
        };
        Ok(json_string_field(config, "sandboxImage"))
    }

    /// What a node agent can do with its `--pod-infra-container-image` over CRI: make sure the
    /// image is present (pulling it if not), and compare it with the sandbox image the runtime
    /// is configured with, since that, not the agent, decides what sandboxes run. A difference
    /// is logged as a warning and reported in the result.
    pub async fn ensure_sandbox_image(&self, image: &str) -> Result<SandboxImageCheck, CriError> {
        let configured = self.sandbox_image().await?;
        let mut c = self.images.clone();
        let present = self
            .unary(
                "ImageStatus",
                self.timeout(),
                move |r| async move { c.image_status(r).await },
                cri::ImageStatusRequest {
                    image: Some(cri::ImageSpec {
                        image: image.to_string(),
                        ..Default::default()
                    }),
                    verbose: false,
                },
            )
            .await?
            .image
            .is_some();
        let mut pulled = false;
        if !present {
            let mut c = self.images.clone();
            self.unary(
                "PullImage",
                self.config.image_pull_timeout,
                move |r| async move { c.pull_image(r).await },
                cri::PullImageRequest {
                    image: Some(cri::ImageSpec {
                        image: image.to_string(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            )
            .await?;
            pulled = true;
        }
        let matches_runtime = configured.as_deref().is_none_or(|c| c == image);
        if !matches_runtime {
            warn!(
                requested = image,
                runtime = configured.as_deref().unwrap_or(""),
                "the runtime runs sandboxes with its own configured sandbox image, not the requested one"
            );
        }
        Ok(SandboxImageCheck {
            runtime_sandbox_image: configured,
            pulled,
            matches_runtime,
        })
    }

    async fn cri_version(&self) -> Result<cri::VersionResponse, CriError> {
        let mut c = self.runtime.clone();
        self.unary(
            "Version",
            Some(self.config.request_timeout),
            move |r| async move { c.version(r).await },
            cri::VersionRequest {
                version: "0.1.0".into(),
            },
        )
        .await
    }

    /// One unary call with a deadline: `grpc-timeout` for the runtime, and a local timer that
    /// also covers connecting.
    async fn unary<Req, Resp, F, Fut>(
        &self,
        op: &'static str,
        timeout: Option<Duration>,
        call: F,
        req: Req,
    ) -> Result<Resp, CriError>
    where
        F: FnOnce(tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        let mut request = tonic::Request::new(req);
        if let Some(t) = timeout {
            request.set_timeout(t);
        }
        let started = Instant::now();
        let result = self.call_with_deadline(op, timeout, call, request).await;
        self.metrics
            .observe(op, started.elapsed().as_secs_f64(), result.is_err());
        result
    }

    async fn call_with_deadline<Req, Resp, F, Fut>(
        &self,
        op: &'static str,
        timeout: Option<Duration>,
        call: F,
        request: tonic::Request<Req>,
    ) -> Result<Resp, CriError>
    where
        F: FnOnce(tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        let started = Instant::now();
        let result = match timeout {
            Some(t) => match tokio::time::timeout(t, call(request)).await {
                Ok(r) => r,
                Err(_) => {
                    debug!(op, ?t, "CRI call timed out");
                    return Err(CriError::Timeout { op, timeout: t });
                }
            },
            None => call(request).await,
        };
        match result {
            Ok(resp) => {
                debug!(op, elapsed = ?started.elapsed(), "CRI call");
                Ok(resp.into_inner())
            }
            // tonic enforces `grpc-timeout` on the client too, and reports it as Cancelled.
            Err(status)
                if status.code() == tonic::Code::Cancelled
                    && status.message().contains("Timeout expired") =>
            {
                debug!(op, ?timeout, "CRI call timed out");
                Err(CriError::Timeout {
                    op,
                    timeout: timeout.unwrap_or_default(),
                })
            }
            Err(status) => {
                debug!(op, code = ?status.code(), message = status.message(), "CRI call failed");
                Err(CriError::Rpc { op, status })
            }
        }
    }

    fn timeout(&self) -> Option<Duration> {
        Some(self.config.request_timeout)
    }

    /// Creates the termination message file of a container and returns the mount for it.
    fn termination_message_mount(
        &self,
        config: &core::ContainerConfig,
        sandbox: &PodSandboxConfig,
    ) -> Result<Option<cri::Mount>, CriError> {
        let Some(dir) = &self.config.termination_message_dir else {
            return Ok(None);
        };
        let Some(target) = config
            .annotations
            .get(labels::CONTAINER_TERMINATION_MESSAGE_PATH)
            .filter(|p| p.starts_with('/'))
        else {
            return Ok(None);
        };
        if config
            .mounts
            .iter()
            .any(|m| m.container_path == Path::new(target))
        {
            return Ok(None);
        }
        let uid = &sandbox.metadata.uid;
        let name = &config.metadata.name;
        if [uid.as_str(), name.as_str()]
            .iter()
            .any(|s| s.is_empty() || s.contains('/') || *s == "..")
        {
            return Ok(None);
        }
        let container_dir = dir.join(uid).join("containers").join(name);
        std::fs::create_dir_all(&container_dir).map_err(|source| CriError::PrepareHostFile {
            path: container_dir.clone(),
            source,
        })?;
        let file = container_dir.join(config.metadata.attempt.to_string());
        std::fs::File::create(&file).map_err(|source| CriError::PrepareHostFile {
            path: file.clone(),
            source,
        })?;
        // As the kubelet: writable by any user, so that a container that does not run as root
        // can write its message.
        std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o666))
            .map_err(|source| CriError::PrepareHostFile {
                path: file.clone(),
                source,
            })?;
        Ok(Some(cri::Mount {
            container_path: target.clone(),
            host_path: file.to_string_lossy().into_owned(),
            readonly: false,
            ..Default::default()
        }))
    }

    /// Waits until CRI has recorded the exits the runtime knows of early for `ids` (exit hints,
    /// [`crate::exits`]), at most [`CONFIRM_WITHIN`](crate::events::CONFIRM_WITHIN) in all:
    /// containerd 1.6 is still deleting those tasks, and stopping or removing the container or
    /// its sandbox meanwhile races with it (the call can fail with the shim's connection closed
    /// under it). Errors end the wait: the call that follows reports them.
    async fn settle_exits(&self, ids: impl IntoIterator<Item = String>) {
        let hints = self.events.exit_hints();
        if hints.is_empty() {
            return;
        }
        let deadline = tokio::time::Instant::now() + crate::events::CONFIRM_WITHIN;
        for id in ids.into_iter().filter(|id| hints.has_exit(id)) {
            let mut delay = Duration::from_millis(2);
            loop {
                let mut c = self.runtime.clone();
                let status = tokio::time::timeout_at(
                    deadline,
                    c.container_status(cri::ContainerStatusRequest {
                        container_id: id.clone(),
                        verbose: false,
                    }),
                )
                .await;
                let recorded = match status {
                    Ok(Ok(resp)) => resp.into_inner().status.is_none_or(|s| {
                        s.state != cri::ContainerState::ContainerRunning as i32
                            && s.state != cri::ContainerState::ContainerCreated as i32
                    }),
                    // Not found, or CRI fails: nothing to wait for.
                    Ok(Err(_)) => true,
                    Err(_) => {
                        debug!(containerID = %id, "CRI has not recorded the exit yet; going on");
                        return;
                    }
                };
                if recorded {
                    hints.forget(&id);
                    break;
                }
                if tokio::time::Instant::now() + delay >= deadline {
                    debug!(containerID = %id, "CRI has not recorded the exit yet; going on");
                    return;
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_millis(20));
            }
        }
    }

    /// [`settle_exits`](Self::settle_exits) for the containers of a sandbox.
    async fn settle_sandbox_exits(&self, sandbox_id: &str) {
        if self.events.exit_hints().is_empty() {
            return;
        }
        let mut c = self.runtime.clone();
        let listed = tokio::time::timeout(
            crate::events::CONFIRM_WITHIN,
            c.list_containers(cri::ListContainersRequest {
                filter: Some(cri::ContainerFilter {
                    pod_sandbox_id: sandbox_id.to_string(),
                    ..Default::default()
                }),
            }),
        )
        .await;
        if let Ok(Ok(resp)) = listed {
            self.settle_exits(resp.into_inner().containers.into_iter().map(|c| c.id))
                .await;
        }
    }

    /// Fills the message of an exited container from its termination message file, or from
    /// the end of its log with `FallbackToLogsOnError`, as the kubelet does.
    fn read_termination_message(&self, status: &mut core::ContainerStatus) {
        if status.state != ContainerState::Exited || !status.message.is_empty() {
            return;
        }
        if let Some(path) = status
            .annotations
            .get(labels::CONTAINER_TERMINATION_MESSAGE_PATH)
            && let Some(m) = status
                .mounts
                .iter()
                .find(|m| m.container_path == Path::new(path))
        {
            let in_our_dir = self
                .config
                .termination_message_dir
                .as_ref()
                .is_some_and(|d| m.host_path.starts_with(d));
            if in_our_dir && let Some(text) = read_prefix(&m.host_path, MAX_TERMINATION_MESSAGE) {
                status.message = text;
            }
        }
        let fallback = status
            .annotations
            .get(labels::CONTAINER_TERMINATION_MESSAGE_POLICY)
            .is_some_and(|p| p == "FallbackToLogsOnError");
        if status.message.is_empty() && fallback && status.exit_code != 0 {
            status.message = tail_of_cri_log(&status.log_path, 80, 2048);
        }
    }

    fn remove_termination_message_file(&self, status: &core::ContainerStatus) {
        let Some(dir) = &self.config.termination_message_dir else {
            return;
        };
        let Some(path) = status
            .annotations
            .get(labels::CONTAINER_TERMINATION_MESSAGE_PATH)
        else {
            return;
        };
        for m in &status.mounts {
            if m.container_path == Path::new(path)
                && m.host_path.starts_with(dir)
                && let Err(e) = std::fs::remove_file(&m.host_path)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                warn!(path = %m.host_path.display(), error = %kubelet_api::chain(&e), "removing termination message file");
            }
        }
    }
}

fn read_prefix(path: &Path, max: u64) -> Option<String> {
    use std::io::Read;
    let f = std::fs::File::open(path).ok()?;
    let mut buf = Vec::new();
    f.take(max).read_to_end(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// The last `lines` lines (at most `max_bytes`) of a CRI-format log, without the
/// `<time> <stream> <tag> ` prefixes.
fn tail_of_cri_log(path: &Path, lines: usize, max_bytes: usize) -> String {
    let Ok(text) = std::fs::read_to_string(path) else {
        return String::new();
    };
    let all: Vec<&str> = text.lines().collect();
    let start = all.len().saturating_sub(lines);
    let mut out = String::new();
    for line in &all[start..] {
        let mut parts = line.splitn(4, ' ');
        let (_, _, tag, content) = (parts.next(), parts.next(), parts.next(), parts.next());
        out.push_str(content.unwrap_or(""));
        if tag != Some("P") {
            out.push('\n');
        }
    }
    if out.len() > max_bytes {
        let mut cut = out.len() - max_bytes;
        while !out.is_char_boundary(cut) {
            cut += 1;
        }
        out = out[cut..].to_string();
    }
    out
}

/// Reads a string field of a JSON object without a JSON dependency: enough for containerd's
/// `"sandboxImage":"…"`.
fn json_string_field(json: &str, field: &str) -> Option<String> {
    let key = format!("\"{field}\"");
    let at = json.find(&key)? + key.len();
    let rest = json[at..].trim_start().strip_prefix(':')?.trim_start();
    let rest = rest.strip_prefix('"')?;
    let end = rest.find('"')?;
    Some(rest[..end].to_string())
}

/// Seconds for a CRI timeout field: rounded up, so a sub-second timeout is not "none".
fn whole_seconds(d: Duration) -> i64 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    i64::try_from(secs).unwrap_or(i64::MAX)
}

fn ok_if_not_found(r: Result<(), CriError>) -> Result<()> {
    match r {
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        other => other.map_err(Error::from),
    }
}

/// Exec, attach and port-forward: the runtime's streaming server URL for each request (CRI
/// `Exec`, `Attach`, `PortForward`), to which the agent's server proxies the client.
#[async_trait]
impl kubelet_api::StreamingRuntime for CriRuntime {
    async fn exec(
        &self,
        container_id: &str,
        cmd: &[String],
        options: kubelet_api::StreamOptions,
    ) -> Result<kubelet_api::StreamEndpoint> {
        let mut c = self.runtime.clone();
        let req = cri::ExecRequest {
            container_id: container_id.to_string(),
            cmd: cmd.to_vec(),
            tty: options.tty,
            stdin: options.stdin,
            stdout: options.stdout,
            stderr: options.stderr,
        };
        let resp = self
            .unary("Exec", None, move |r| async move { c.exec(r).await }, req)
            .await?;
        Ok(kubelet_api::StreamEndpoint::Url(resp.url))
    }

    async fn attach(
        &self,
        container_id: &str,
        options: kubelet_api::StreamOptions,
    ) -> Result<kubelet_api::StreamEndpoint> {
        let mut c = self.runtime.clone();
        let req = cri::AttachRequest {
            container_id: container_id.to_string(),
            stdin: options.stdin,
            tty: options.tty,
            stdout: options.stdout,
            stderr: options.stderr,
        };
        let resp = self
            .unary(
                "Attach",
                None,
                move |r| async move { c.attach(r).await },
                req,
            )
            .await?;
        Ok(kubelet_api::StreamEndpoint::Url(resp.url))
    }

    async fn port_forward(
        &self,
        sandbox_id: &str,
        ports: &[u16],
    ) -> Result<kubelet_api::PortForwardEndpoint> {
        let mut c = self.runtime.clone();
        let req = cri::PortForwardRequest {
            pod_sandbox_id: sandbox_id.to_string(),
            port: ports.iter().map(|p| i32::from(*p)).collect(),
        };
        let resp = self
            .unary(
                "PortForward",
                None,
                move |r| async move { c.port_forward(r).await },
                req,
            )
            .await?;
        Ok(kubelet_api::PortForwardEndpoint::Url(resp.url))
    }
}

#[async_trait]
impl ContainerRuntime for CriRuntime {
    /// CRI runtimes serve streams themselves (see the `StreamingRuntime` implementation).
    fn streaming(&self) -> Option<&dyn kubelet_api::StreamingRuntime> {
        Some(self)
    }

    /// Registers the kubelet's runtime operation metrics (`kubelet_runtime_operations_total`,
    /// `kubelet_runtime_operations_errors_total`, `kubelet_runtime_operations_duration_seconds`,
    /// by `operation_type`), recorded per CRI call, into `registry`. Clones of this runtime share
    /// them. The agent's builder calls it; do not add the `OperationMetrics` layer as well.
    fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        self.metrics.register(registry);
    }

    async fn version(&self) -> Result<RuntimeVersion> {
        let v = self.cri_version().await?;
        Ok(RuntimeVersion {
            runtime_name: v.runtime_name,
            runtime_version: v.runtime_version,
            runtime_api_version: v.runtime_api_version,
        })
    }

    async fn status(&self) -> Result<RuntimeStatus> {
        let mut c = self.runtime.clone();
        let resp = self
            .unary(
                "Status",
                self.timeout(),
                move |r| async move { c.status(r).await },
                cri::StatusRequest { verbose: false },
            )
            .await?;
        let status = resp.status.ok_or(CriError::IncompleteResponse {
            op: "Status",
            field: "status",
        })?;
        Ok({
            let mut v = RuntimeStatus::default();
            v.conditions = status
                .conditions
                .into_iter()
                .map(convert::condition_out)
                .collect();
            v
        })
    }

    async fn run_pod_sandbox(&self, config: &PodSandboxConfig) -> Result<String> {
        if !config.log_directory.as_os_str().is_empty() {
            std::fs::create_dir_all(&config.log_directory).map_err(|source| {
                CriError::PrepareHostFile {
                    path: config.log_directory.clone(),
                    source,
                }
            })?;
        }
        let mut c = self.runtime.clone();
        let req = cri::RunPodSandboxRequest {
            config: Some(convert::sandbox_config_in(config)),
            // The pod's RuntimeClass handler, else the one this runtime was configured with.
            runtime_handler: if config.runtime_handler.is_empty() {
                self.config.runtime_handler.clone()
            } else {
                config.runtime_handler.clone()
            },
        };
        let _call = self.events.own().call();
        let resp = self
            .unary(
                "RunPodSandbox",
                self.timeout(),
                move |r| async move { c.run_pod_sandbox(r).await },
                req,
            )
            .await?;
        self.events
            .own()
            .sandbox_ran(&resp.pod_sandbox_id, &config.metadata.uid, Timestamp::now());
        Ok(resp.pod_sandbox_id)
    }

    async fn stop_pod_sandbox(&self, sandbox_id: &str) -> Result<()> {
        self.settle_sandbox_exits(sandbox_id).await;
        let mut c = self.runtime.clone();
        let req = cri::StopPodSandboxRequest {
            pod_sandbox_id: sandbox_id.to_string(),
        };
        ok_if_not_found(
            self.unary(
                "StopPodSandbox",
                self.timeout(),
                move |r| async move { c.stop_pod_sandbox(r).await },
                req,
            )
            .await
            .map(|_| ()),
        )
    }

    async fn remove_pod_sandbox(&self, sandbox_id: &str) -> Result<()> {
        self.settle_sandbox_exits(sandbox_id).await;
        let mut c = self.runtime.clone();
        let req = cri::RemovePodSandboxRequest {
            pod_sandbox_id: sandbox_id.to_string(),
        };
        ok_if_not_found(
            self.unary(
                "RemovePodSandbox",
                self.timeout(),
                move |r| async move { c.remove_pod_sandbox(r).await },
                req,
            )
            .await
            .map(|_| ()),
        )?;
        self.events.own().forget(sandbox_id);
        Ok(())
    }

    async fn pod_sandbox_status(&self, sandbox_id: &str) -> Result<core::PodSandboxStatus> {
        let mut c = self.runtime.clone();
        let req = cri::PodSandboxStatusRequest {
            pod_sandbox_id: sandbox_id.to_string(),
            verbose: false,
        };
        let resp = self
            .unary(
                "PodSandboxStatus",
                self.timeout(),
                move |r| async move { c.pod_sandbox_status(r).await },
                req,
            )
            .await?;
        let status = resp.status.ok_or(CriError::IncompleteResponse {
            op: "PodSandboxStatus",
            field: "status",
        })?;
        Ok(convert::sandbox_status_out(status))
    }

    async fn list_pod_sandboxes(
        &self,
        filter: &core::SandboxFilter,
    ) -> Result<Vec<core::PodSandbox>> {
        let mut c = self.runtime.clone();
        let req = cri::ListPodSandboxRequest {
            filter: Some(cri::PodSandboxFilter {
                id: filter.id.clone().unwrap_or_default(),
                state: filter.state.map(|s| cri::PodSandboxStateValue {
                    state: convert::sandbox_state_in(s),
                }),
                label_selector: convert::map_in(&filter.label_selector),
            }),
        };
        let resp = self
            .unary(
                "ListPodSandbox",
                self.timeout(),
                move |r| async move { c.list_pod_sandbox(r).await },
                req,
            )
            .await?;
        Ok(resp.items.into_iter().map(convert::sandbox_out).collect())
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        config: &core::ContainerConfig,
        sandbox_config: &PodSandboxConfig,
    ) -> Result<String> {
        let extra = self
            .termination_message_mount(config, sandbox_config)?
            .into_iter()
            .collect();
        let mut c = self.runtime.clone();
        let req = cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.to_string(),
            config: Some(convert::container_config_in(config, sandbox_config, extra)),
            sandbox_config: Some(convert::sandbox_config_in(sandbox_config)),
        };
        let _call = self.events.own().call();
        let resp = self
            .unary(
                "CreateContainer",
                self.timeout(),
                move |r| async move { c.create_container(r).await },
                req,
            )
            .await?;
        self.events.own().container_created(
            &resp.container_id,
            &sandbox_config.metadata.uid,
            Timestamp::now(),
        );
        Ok(resp.container_id)
    }

    async fn start_container(&self, container_id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = cri::StartContainerRequest {
            container_id: container_id.to_string(),
        };
        let _call = self.events.own().call();
        self.unary(
            "StartContainer",
            self.timeout(),
            move |r| async move { c.start_container(r).await },
            req,
        )
        .await?;
        self.events
            .own()
            .container_started(container_id, Timestamp::now());
        Ok(())
    }

    async fn stop_container(&self, container_id: &str, timeout: Duration) -> Result<()> {
        self.settle_exits([container_id.to_string()]).await;
        let mut c = self.runtime.clone();
        let req = cri::StopContainerRequest {
            container_id: container_id.to_string(),
            timeout: whole_seconds(timeout),
        };
        // The kubelet's deadline: the request timeout plus the grace period.
        let deadline = self.config.request_timeout + timeout;
        ok_if_not_found(
            self.unary(
                "StopContainer",
                Some(deadline),
                move |r| async move { c.stop_container(r).await },
                req,
            )
            .await
            .map(|_| ()),
        )
    }

    async fn remove_container(&self, container_id: &str) -> Result<()> {
        self.settle_exits([container_id.to_string()]).await;
        let status = match self.container_status(container_id).await {
            Ok(s) => Some(s),
            Err(e) if e.is_not_found() => None,
            Err(e) => return Err(e),
        };
        let mut c = self.runtime.clone();
        let req = cri::RemoveContainerRequest {
            container_id: container_id.to_string(),
        };
        ok_if_not_found(
            self.unary(
                "RemoveContainer",
                self.timeout(),
                move |r| async move { c.remove_container(r).await },
                req,
            )
            .await
            .map(|_| ()),
        )?;
        self.events.exit_hints().forget(container_id);
        self.events.own().forget(container_id);
        if let Some(status) = status {
            self.remove_termination_message_file(&status);
        }
        Ok(())
    }

    async fn list_containers(
        &self,
        filter: &core::ContainerFilter,
    ) -> Result<Vec<core::Container>> {
        let mut c = self.runtime.clone();
        let hints = self.events.exit_hints();
        // A container with an exit hint is running for CRI and exited for us: filter by state
        // here, after applying the hints.
        let local_state = filter.state.filter(|_| !hints.is_empty());
        let req = cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                id: filter.id.clone().unwrap_or_default(),
                state: filter.state.filter(|_| local_state.is_none()).map(|s| {
                    cri::ContainerStateValue {
                        state: convert::container_state_in(s),
                    }
                }),
                pod_sandbox_id: filter.pod_sandbox_id.clone().unwrap_or_default(),
                label_selector: convert::map_in(&filter.label_selector),
            }),
        };
        let resp = self
            .unary(
                "ListContainers",
                self.timeout(),
                move |r| async move { c.list_containers(r).await },
                req,
            )
            .await?;
        Ok(resp
            .containers
            .into_iter()
            .map(|c| {
                let mut c = convert::container_out(c);
                hints.apply_to_container(&mut c);
                c
            })
            .filter(|c| local_state.is_none_or(|s| c.state == s))
            .collect())
    }

    async fn container_status(&self, container_id: &str) -> Result<core::ContainerStatus> {
        let mut c = self.runtime.clone();
        let req = cri::ContainerStatusRequest {
            container_id: container_id.to_string(),
            verbose: false,
        };
        let resp = self
            .unary(
                "ContainerStatus",
                self.timeout(),
                move |r| async move { c.container_status(r).await },
                req,
            )
            .await;
        let resp = match resp {
            Err(e) if e.kind() == ErrorKind::NotFound => {
                self.events.exit_hints().forget(container_id);
                return Err(e.into());
            }
            r => r?,
        };
        let status = resp.status.ok_or(CriError::IncompleteResponse {
            op: "ContainerStatus",
            field: "status",
        })?;
        let mut status = convert::container_status_out(status);
        self.events.exit_hints().apply_to_status(&mut status);
        self.read_termination_message(&mut status);
        Ok(status)
    }

    async fn exec_sync(
        &self,
        container_id: &str,
        cmd: &[String],
        timeout: Duration,
    ) -> Result<ExecResult> {
        let mut c = self.runtime.clone();
        let req = cri::ExecSyncRequest {
            container_id: container_id.to_string(),
            cmd: cmd.to_vec(),
            timeout: whole_seconds(timeout),
        };
        // The kubelet's deadline: the request timeout plus the command's timeout.
        let deadline = self.config.request_timeout + timeout;
        let resp = self
            .unary(
                "ExecSync",
                Some(deadline),
                move |r| async move { c.exec_sync(r).await },
                req,
            )
            .await?;
        Ok(ExecResult {
            stdout: resp.stdout,
            stderr: resp.stderr,
            exit_code: resp.exit_code,
        })
    }

    async fn container_stats(&self, container_id: &str) -> Result<core::ContainerStats> {
        let mut c = self.runtime.clone();
        let req = cri::ContainerStatsRequest {
            container_id: container_id.to_string(),
        };
        let resp = self
            .unary(
                "ContainerStats",
                self.timeout(),
                move |r| async move { c.container_stats(r).await },
                req,
            )
            .await?;
        let stats = resp.stats.ok_or(CriError::IncompleteResponse {
            op: "ContainerStats",
            field: "stats",
        })?;
        Ok(convert::stats_out(container_id, stats))
    }

    async fn list_container_stats(&self) -> Result<Vec<core::ContainerStats>> {
        let mut c = self.runtime.clone();
        let req = cri::ListContainerStatsRequest { filter: None };
        let resp = self
            .unary(
                "ListContainerStats",
                self.timeout(),
                move |r| async move { c.list_container_stats(r).await },
                req,
            )
            .await?;
        Ok(resp
            .stats
            .into_iter()
            .map(|s| {
                let id = s
                    .attributes
                    .as_ref()
                    .map(|a| a.id.clone())
                    .unwrap_or_default();
                convert::stats_out(&id, s)
            })
            .filter(|s| !s.container_id.is_empty())
            .collect())
    }

    /// CRI `ListPodSandboxStats`; when it fails (containerd 1.6 fails the whole list when one
    /// sandbox's metrics cannot be read, e.g. a sandbox whose task is gone), `PodSandboxStats`
    /// for each ready sandbox, leaving out those that fail.
    async fn list_pod_sandbox_stats(&self) -> Result<Vec<core::PodSandboxStats>> {
        let mut c = self.runtime.clone();
        let req = cri::ListPodSandboxStatsRequest { filter: None };
        let listed = self
            .unary(
                "ListPodSandboxStats",
                self.timeout(),
                move |r| async move { c.list_pod_sandbox_stats(r).await },
                req,
            )
            .await;
        let e = match listed {
            Ok(resp) => {
                return Ok(resp
                    .stats
                    .into_iter()
                    .filter_map(convert::sandbox_stats_out)
                    .collect());
            }
            Err(e) if e.kind() == ErrorKind::Unimplemented => return Err(e.into()),
            Err(e) => e,
        };
        debug!("ListPodSandboxStats failed, asking each sandbox: {e}");
        let ready = core::SandboxFilter {
            state: Some(core::SandboxState::Ready),
            ..Default::default()
        };
        let mut out = Vec::new();
        for sandbox in self.list_pod_sandboxes(&ready).await? {
            let mut c = self.runtime.clone();
            let req = cri::PodSandboxStatsRequest {
                pod_sandbox_id: sandbox.id.clone(),
            };
            match self
                .unary(
                    "PodSandboxStats",
                    self.timeout(),
                    move |r| async move { c.pod_sandbox_stats(r).await },
                    req,
                )
                .await
            {
                Ok(resp) => out.extend(resp.stats.and_then(convert::sandbox_stats_out)),
                Err(e) => {
                    debug!(sandbox = %sandbox.id, "PodSandboxStats failed: {e}");
                }
            }
        }
        Ok(out)
    }

    /// CRI `GetContainerEvents` when the runtime implements it (containerd ≥ 1.7, CRI-O),
    /// otherwise containerd's native task and container events (containerd 1.6); see
    /// [`crate::events`].
    async fn container_events(&self) -> Result<core::ContainerEventStream> {
        Ok(self.events.subscribe().await?)
    }

    async fn update_container_resources(
        &self,
        container_id: &str,
        resources: &core::LinuxResources,
    ) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = cri::UpdateContainerResourcesRequest {
            container_id: container_id.to_string(),
            linux: Some(convert::resources_in(resources)),
            ..Default::default()
        };
        self.unary(
            "UpdateContainerResources",
            self.timeout(),
            move |r| async move { c.update_container_resources(r).await },
            req,
        )
        .await?;
        Ok(())
    }

    async fn reopen_container_log(&self, container_id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = cri::ReopenContainerLogRequest {
            container_id: container_id.to_string(),
        };
        self.unary(
            "ReopenContainerLog",
            self.timeout(),
            move |r| async move { c.reopen_container_log(r).await },
            req,
        )
        .await?;
        Ok(())
    }

    fn images(&self) -> Option<&dyn kubelet_api::ImageService> {
        Some(self)
    }
}

/// CRI's ImageService.
#[async_trait]
impl kubelet_api::ImageService for CriRuntime {
    async fn list_images(&self) -> Result<Vec<core::Image>> {
        let mut c = self.images.clone();
        let resp = self
            .unary(
                "ListImages",
                self.timeout(),
                move |r| async move { c.list_images(r).await },
                cri::ListImagesRequest { filter: None },
            )
            .await?;
        Ok(resp.images.into_iter().map(convert::image_out).collect())
    }

    async fn image_status(&self, image: &ImageSpec) -> Result<Option<core::Image>> {
        let mut c = self.images.clone();
        let req = cri::ImageStatusRequest {
            image: Some(cri::ImageSpec {
                image: image.image.clone(),
                ..Default::default()
            }),
            verbose: false,
        };
        let resp = self
            .unary(
                "ImageStatus",
                self.timeout(),
                move |r| async move { c.image_status(r).await },
                req,
            )
            .await?;
        Ok(resp.image.map(convert::image_out))
    }

    async fn pull_image(
        &self,
        image: &ImageSpec,
        auth: Option<&core::AuthConfig>,
        sandbox_config: &PodSandboxConfig,
    ) -> Result<String> {
        let mut c = self.images.clone();
        let req = cri::PullImageRequest {
            image: Some(cri::ImageSpec {
                image: image.image.clone(),
                ..Default::default()
            }),
            auth: auth.map(convert::auth_in),
            sandbox_config: Some(convert::sandbox_config_in(sandbox_config)),
        };
        let resp = self
            .unary(
                "PullImage",
                self.config.image_pull_timeout,
                move |r| async move { c.pull_image(r).await },
                req,
            )
            .await?;
        Ok(resp.image_ref)
    }

    async fn remove_image(&self, image: &ImageSpec) -> Result<()> {
        let mut c = self.images.clone();
        let req = cri::RemoveImageRequest {
            image: Some(cri::ImageSpec {
                image: image.image.clone(),
                ..Default::default()
            }),
        };
        self.unary(
            "RemoveImage",
            self.timeout(),
            move |r| async move { c.remove_image(r).await },
            req,
        )
        .await?;
        Ok(())
    }

    async fn image_fs_info(&self) -> Result<core::ImageFsInfo> {
        let mut c = self.images.clone();
        let resp = self
            .unary(
                "ImageFsInfo",
                self.timeout(),
                move |r| async move { c.image_fs_info(r).await },
                cri::ImageFsInfoRequest {},
            )
            .await?;
        Ok(convert::image_fs_info_out(resp))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_must_be_unix_sockets_with_absolute_paths() {
        assert_eq!(
            socket_path("unix:///run/containerd/containerd.sock").unwrap(),
            PathBuf::from("/run/containerd/containerd.sock")
        );
        assert_eq!(
            socket_path("/tmp/x.sock").unwrap(),
            PathBuf::from("/tmp/x.sock")
        );
        for bad in [
            "tcp://127.0.0.1:1",
            "unix://relative.sock",
            "containerd.sock",
            "",
        ] {
            let e = socket_path(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{bad}: {e}");
        }
    }

    #[test]
    fn timeouts_round_up_to_whole_seconds() {
        assert_eq!(whole_seconds(Duration::ZERO), 0);
        assert_eq!(whole_seconds(Duration::from_millis(1)), 1);
        assert_eq!(whole_seconds(Duration::from_secs(30)), 30);
        assert_eq!(whole_seconds(Duration::from_millis(30_500)), 31);
    }

    #[test]
    fn sandbox_image_is_read_from_containerd_config_json() {
        let json = r#"{"containerd":{"snapshotter":"overlayfs"},"sandboxImage" : "localhost/pause:3.9","x":1}"#;
        assert_eq!(
            json_string_field(json, "sandboxImage").as_deref(),
            Some("localhost/pause:3.9")
        );
        assert_eq!(json_string_field(json, "missing"), None);
    }

    #[test]
    fn log_tail_strips_cri_prefixes_and_joins_partial_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("0.log");
        std::fs::write(
            &p,
            "2024-01-01T00:00:00Z stdout F first\n2024-01-01T00:00:01Z stderr P par\n2024-01-01T00:00:01Z stderr F tial\n",
        )
        .unwrap();
        assert_eq!(tail_of_cri_log(&p, 80, 2048), "first\npartial\n");
        assert_eq!(tail_of_cri_log(&p, 2, 2048), "partial\n");
        assert_eq!(tail_of_cri_log(&p, 80, 4), "ial\n");
    }

    #[tokio::test]
    async fn calls_to_a_missing_socket_are_unavailable() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("none.sock");
        let rt = CriRuntime::new(CriConfig::new(format!("unix://{}", sock.display()))).unwrap();
        let e = rt.version().await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    }

    #[tokio::test]
    async fn a_runtime_that_never_answers_hits_the_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("silent.sock");
        // Accepts connections and reads nothing: the HTTP/2 handshake never completes.
        let listener = tokio::net::UnixListener::bind(&sock).unwrap();
        let server = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                held.push(s);
            }
        });
        let rt = CriRuntime::new(
            CriConfig::new(format!("unix://{}", sock.display()))
                .request_timeout(Duration::from_millis(300)),
        )
        .unwrap();
        let e = rt
            .list_containers(&core::ContainerFilter::default())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::DeadlineExceeded, "{e}");
        server.abort();
    }
}
