//! `/exec`, `/attach`, `/portForward` and `/run`: the kubelet's streaming endpoints.
//!
//! The pod and container are found as for `/containerLogs`. The runtime's
//! [`StreamingRuntime`](kubelet_api::StreamingRuntime) answers with in-process streams, which
//! are served here over the client's protocol, or with its streaming server's URL, to which
//! the upgraded connection is proxied ([`crate::proxy`]). Protocols:
//! - SPDY/3.1 ([`crate::spdy`]) with `X-Stream-Protocol-Version` `v4.channel.k8s.io`,
//!   `v3.channel.k8s.io`, `v2.channel.k8s.io`, `channel.k8s.io` (exec, attach) and
//!   `portforward.k8s.io` (port-forward);
//! - WebSocket ([`crate::websocket`]) with the `Sec-WebSocket-Protocol` values
//!   `v5.channel.k8s.io`, `v4.channel.k8s.io`, `v4.base64.channel.k8s.io`,
//!   `base64.channel.k8s.io`, `channel.k8s.io` (exec, attach) and `v4.channel.k8s.io`,
//!   `v4.base64.channel.k8s.io` (port-forward, one connection per port).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http::header::{CONNECTION, UPGRADE};
use http::{HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use kubelet_api::runtime::strip_container_id;
use kubelet_api::runtime::{SandboxFilter, SandboxState, labels};
use kubelet_api::{
    ErrorKind, ExecSession, PortDialer, PortForwardEndpoint, StreamEndpoint, StreamOptions,
    TerminalSize,
};
use kubelet_core::k8s_openapi;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio_util::io::ReaderStream;

use crate::routes::{Body, Context, plain, status};
use crate::spdy::{Session, Stream, StreamWriter};

/// `streamCreationTimeout`: how long the client has to open its streams.
pub(crate) const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);

/// Exec and attach protocols over SPDY, newest first.
pub(crate) const SPDY_REMOTECOMMAND_PROTOCOLS: &[&str] = &[
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
];
/// The port-forward protocol over SPDY.
pub(crate) const SPDY_PORTFORWARD_PROTOCOLS: &[&str] = &["portforward.k8s.io"];

/// An answer that ends a request before it is served (boxed: responses are large).
pub(crate) type Refusal = Box<Response<Body>>;

/// After the process exits, how long its output may still drain before the status is sent.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// Which endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Exec,
    Attach,
    PortForward,
    Run,
}

impl Kind {
    pub(crate) fn of(path: &str) -> Option<Kind> {
        let first = path.trim_start_matches('/').split('/').next()?;
        Some(match first {
            "exec" => Kind::Exec,
            "attach" => Kind::Attach,
            "portForward" => Kind::PortForward,
            "run" => Kind::Run,
            _ => return None,
        })
    }
}

/// `/{kind}/{ns}/{pod}[/{uid}]/{container}` (no container for port-forward).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Target {
    namespace: String,
    pod: String,
    uid: Option<String>,
    container: String,
}

pub(crate) fn parse_target(kind: Kind, path: &str) -> Option<Target> {
    let parts: Vec<String> = path
        .trim_start_matches('/')
        .trim_end_matches('/')
        .split('/')
        .skip(1)
        .map(crate::logs::percent_decode)
        .collect();
    let t = |ns: &String, pod: &String, uid: Option<&String>, c: &str| Target {
        namespace: ns.clone(),
        pod: pod.clone(),
        uid: uid.cloned(),
        container: c.to_string(),
    };
    match (kind, parts.as_slice()) {
        (Kind::PortForward, [ns, pod]) => Some(t(ns, pod, None, "")),
        (Kind::PortForward, [ns, pod, uid]) => Some(t(ns, pod, Some(uid), "")),
        (Kind::PortForward, _) => None,
        (_, [ns, pod, c]) => Some(t(ns, pod, None, c)),
        (_, [ns, pod, uid, c]) => Some(t(ns, pod, Some(uid), c)),
        _ => None,
    }
}

/// The query's values: `command` (repeated) and the `input`/`output`/`error`/`tty` flags
/// (`1` or `true`), `port` (repeated, WebSocket port-forward), `cmd` (`/run`).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Query {
    command: Vec<String>,
    options: StreamOptions,
    ports: Vec<String>,
    cmd: String,
}

pub(crate) fn parse_query(q: &str) -> Query {
    let mut out = Query::default();
    let (mut stdin, mut stdout, mut stderr, mut tty) = (false, false, false, false);
    for pair in q.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let k = crate::logs::percent_decode(&k.replace('+', " "));
        let v = crate::logs::percent_decode(&v.replace('+', " "));
        let on = v == "1" || v.eq_ignore_ascii_case("true");
        match k.as_str() {
            "command" => out.command.push(v),
            "input" | "stdin" => stdin = on,
            "output" | "stdout" => stdout = on,
            "error" | "stderr" => stderr = on,
            "tty" => tty = on,
            "port" => out.ports.push(v),
            "cmd" => out.cmd = v,
            _ => {}
        }
    }
    out.options = StreamOptions::new(stdin, stdout, stderr, tty);
    out
}

fn header_values(req: &Request<Incoming>, name: &str) -> Vec<String> {
    req.headers()
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect()
}

fn upgrade_to(req: &Request<Incoming>) -> Option<String> {
    let connection = header_values(req, "connection");
    if !connection.iter().any(|c| c.eq_ignore_ascii_case("upgrade")) {
        return None;
    }
    req.headers()
        .get(UPGRADE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_ascii_lowercase())
}

fn not_found(message: String) -> Response<Body> {
    status(StatusCode::NOT_FOUND, "NotFound", message)
}

fn bad_request(message: impl Into<String>) -> Response<Body> {
    status(StatusCode::BAD_REQUEST, "BadRequest", message)
}

/// A runtime error as the kubelet's answer.
fn runtime_error(e: &kubelet_api::Error) -> Response<Body> {
    match e.kind() {
        ErrorKind::NotFound => not_found(e.message().to_string()),
        ErrorKind::Unimplemented => status(
            StatusCode::NOT_IMPLEMENTED,
            "NotImplemented",
            e.message().to_string(),
        ),
        ErrorKind::InvalidArgument | ErrorKind::FailedPrecondition => {
            bad_request(e.message().to_string())
        }
        _ => status(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            e.message().to_string(),
        ),
    }
}

fn not_supported(what: &str) -> Response<Body> {
    status(
        StatusCode::NOT_IMPLEMENTED,
        "NotImplemented",
        format!("{what} is not supported by this node's container runtime"),
    )
}

/// The pod `t` names, as the agent knows it.
fn find_pod(ctx: &Context, t: &Target) -> Result<Pod, Refusal> {
    match crate::routes::find_pod(ctx, &t.namespace, &t.pod, t.uid.as_deref()) {
        Some(e) => Ok((*e.pod).clone()),
        None => Err(Box::new(not_found("pod does not exist".to_string()))),
    }
}

/// The running instance of container `name` in `pod`.
fn running_container(ctx: &Context, pod: &Pod, name: &str) -> Result<String, Refusal> {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let entry = ctx
        .handle
        .statuses()
        .list()
        .into_iter()
        .find(|p| p.pod.metadata.uid.as_deref() == Some(uid));
    let statuses = entry
        .as_ref()
        .map(|e| {
            e.status
                .container_statuses
                .iter()
                .chain(e.status.init_container_statuses.iter())
                .chain(e.status.ephemeral_container_statuses.iter())
                .flatten()
                .cloned()
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    let Some(cs) = statuses.iter().find(|s| s.name == name) else {
        return Err(Box::new(not_found(format!(
            "container {name} is not valid for pod {}",
            pod.metadata.name.as_deref().unwrap_or_default()
        ))));
    };
    let running = cs.state.as_ref().and_then(|s| s.running.as_ref()).is_some();
    match cs.container_id.as_deref().filter(|id| !id.is_empty()) {
        Some(id) if running => Ok(strip_container_id(id).to_string()),
        _ => Err(Box::new(bad_request(format!(
            "container {name} is not running in pod {}",
            pod.metadata.name.as_deref().unwrap_or_default()
        )))),
    }
}

async fn ready_sandbox(ctx: &Context, pod: &Pod) -> Result<String, Refusal> {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let filter = SandboxFilter {
        state: Some(SandboxState::Ready),
        label_selector: [(labels::POD_UID.to_string(), uid)].into_iter().collect(),
        ..Default::default()
    };
    match ctx.runtime.list_pod_sandboxes(&filter).await {
        Ok(list) => list
            .into_iter()
            .max_by_key(|s| s.created_at)
            .map(|s| s.id)
            .ok_or_else(|| Box::new(bad_request("pod has no ready sandbox"))),
        Err(e) => Err(Box::new(runtime_error(&e))),
    }
}

/// Answer a streaming request (authorized already).
/// A streaming session's place under `max_streaming_sessions`, carried in the request's
/// extensions to the upgraded connection ([`upgrade`]), which holds it until it closes.
#[derive(Clone)]
pub(crate) struct SessionSlot(#[allow(dead_code)] Arc<tokio::sync::OwnedSemaphorePermit>);

/// An upgraded connection that holds its session's slot.
pub(crate) struct Counted {
    io: hyper::upgrade::Upgraded,
    _slot: Option<SessionSlot>,
}

impl hyper::rt::Read for Counted {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for Counted {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }
}

/// A slot for one more streaming session, or the 503 that refuses it.
fn session_slot(sessions: &Arc<tokio::sync::Semaphore>) -> Result<SessionSlot, Refusal> {
    sessions
        .clone()
        .try_acquire_owned()
        .map(|p| SessionSlot(Arc::new(p)))
        .map_err(|_| {
            let mut r = plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "too many streaming sessions; retry later\n",
            );
            r.headers_mut()
                .insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
            Box::new(r)
        })
}

/// `hyper::upgrade::on`, keeping the request's [`SessionSlot`] with the connection.
pub(crate) async fn upgrade(mut req: Request<Incoming>) -> hyper::Result<Counted> {
    let slot = req.extensions_mut().remove::<SessionSlot>();
    let io = hyper::upgrade::on(req).await?;
    Ok(Counted { io, _slot: slot })
}

pub(crate) async fn handle(
    ctx: &Context,
    kind: Kind,
    mut req: Request<Incoming>,
) -> Response<Body> {
    let path = req.uri().path().to_string();
    // `/run` runs a command: POST only, as the kubelet registers it.
    if kind == Kind::Run && req.method() != http::Method::POST {
        let mut r = plain(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed\n");
        r.headers_mut()
            .insert(http::header::ALLOW, HeaderValue::from_static("POST"));
        return r;
    }
    let query = parse_query(req.uri().query().unwrap_or(""));
    let Some(target) = parse_target(kind, &path) else {
        return not_found("404 page not found".to_string());
    };
    let pod = match find_pod(ctx, &target) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    if kind == Kind::Run {
        return run(ctx, &pod, &target, &query).await;
    }
    // Upgraded connections leave the acceptor's count: sessions have a cap of their own.
    match session_slot(&ctx.streaming_sessions) {
        Ok(slot) => {
            req.extensions_mut().insert(slot);
        }
        Err(r) => {
            tracing::warn!(kind = ?kind, "streaming session refused: every session slot is taken");
            return *r;
        }
    }
    let Some(streaming) = ctx.runtime.streaming() else {
        return not_supported(match kind {
            Kind::Exec => "exec",
            Kind::Attach => "attach",
            _ => "port-forward",
        });
    };
    let upgrade = upgrade_to(&req);
    let websocket = upgrade.as_deref() == Some("websocket");
    let spdy = upgrade.as_deref() == Some("spdy/3.1");
    if kind == Kind::PortForward {
        let sandbox = match ready_sandbox(ctx, &pod).await {
            Ok(s) => s,
            Err(r) => return *r,
        };
        let ports: Vec<u16> = query.ports.iter().filter_map(|p| p.parse().ok()).collect();
        let endpoint = match streaming.port_forward(&sandbox, &ports).await {
            Ok(e) => e,
            Err(e) => return runtime_error(&e),
        };
        return match endpoint {
            PortForwardEndpoint::Url(url) => crate::proxy::proxy(req, &url).await,
            PortForwardEndpoint::Dialer(dialer) if spdy => {
                spdy_port_forward(ctx, req, dialer, sandbox)
            }
            PortForwardEndpoint::Dialer(dialer) if websocket => {
                crate::websocket::port_forward(ctx, req, dialer, &query.ports)
            }
            _ => bad_request("Upgrade request required"),
        };
    }

    let opts = query.options;
    if opts.tty && opts.stderr {
        return bad_request("tty and stderr cannot both be true");
    }
    if !opts.stdin && !opts.stdout && !opts.stderr {
        return bad_request("you must specify at least 1 of stdin, stdout, stderr");
    }
    if kind == Kind::Exec && query.command.is_empty() {
        return bad_request("you must specify a command");
    }
    if !spdy && !websocket {
        return bad_request("Upgrade request required");
    }
    // Negotiate before starting anything.
    let protocol = if spdy {
        match negotiate(&req, SPDY_REMOTECOMMAND_PROTOCOLS) {
            Ok(p) => Some(p),
            Err(r) => return *r,
        }
    } else {
        None
    };
    let id = match running_container(ctx, &pod, &target.container) {
        Ok(id) => id,
        Err(r) => return *r,
    };
    let endpoint = match kind {
        Kind::Exec => streaming.exec(&id, &query.command, opts).await,
        _ => streaming.attach(&id, opts).await,
    };
    let session = match endpoint {
        Ok(StreamEndpoint::Url(url)) => return crate::proxy::proxy(req, &url).await,
        Ok(StreamEndpoint::Session(s)) => s,
        Ok(_) => return not_supported("this kind of stream endpoint"),
        Err(e) => return runtime_error(&e),
    };
    let command = if kind == Kind::Exec {
        query.command.join(" ")
    } else {
        String::new()
    };
    match protocol {
        Some(protocol) => spdy_remotecommand(ctx, req, protocol, opts, session, command),
        None => crate::websocket::remotecommand(ctx, req, opts, session, command),
    }
}

/// `httpstream.Handshake`: the first protocol the client offers that the server supports.
fn negotiate(req: &Request<Incoming>, supported: &[&str]) -> Result<&'static str, Refusal> {
    let offered = header_values(req, "x-stream-protocol-version");
    if offered.is_empty() {
        return Err(Box::new(bad_request(
            "unable to upgrade: X-Stream-Protocol-Version is required",
        )));
    }
    let all: &'static [&'static str] = if supported == SPDY_PORTFORWARD_PROTOCOLS {
        SPDY_PORTFORWARD_PROTOCOLS
    } else {
        SPDY_REMOTECOMMAND_PROTOCOLS
    };
    for o in &offered {
        if let Some(p) = all.iter().find(|p| **p == o) {
            return Ok(p);
        }
    }
    let mut r = plain(
        StatusCode::FORBIDDEN,
        format!(
            "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, server accepts {all:?}"
        ),
    );
    for p in all {
        r.headers_mut().append(
            "X-Accepted-Stream-Protocol-Versions",
            HeaderValue::from_static(p),
        );
    }
    Err(Box::new(r))
}

fn switching(upgrade: &'static str, protocol_header: (&'static str, &str)) -> Response<Body> {
    let mut r = crate::routes::full(StatusCode::SWITCHING_PROTOCOLS, Bytes::new());
    r.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    r.headers_mut()
        .insert(UPGRADE, HeaderValue::from_static(upgrade));
    if let Ok(v) = HeaderValue::from_str(protocol_header.1) {
        r.headers_mut().insert(protocol_header.0, v);
    }
    r
}

/// The v4 error-stream Status for an exit code (`Success`, or `NonZeroExitCode` with the code).
pub(crate) fn exit_status_json(code: i32, command: &str) -> String {
    if code == 0 {
        return r#"{"metadata":{},"status":"Success"}"#.to_string();
    }
    serde_json::json!({
        "metadata": {},
        "status": "Failure",
        "message": format!("command terminated with non-zero exit code: command '{command}' exited with {code}"),
        "reason": "NonZeroExitCode",
        "details": { "causes": [ { "reason": "ExitCode", "message": code.to_string() } ] },
    })
    .to_string()
}

/// What the error stream (or channel) carries when a session ends: the Status with `v4`
/// (and WebSocket `v5`), else a plain message on failure and nothing on success.
pub(crate) fn error_stream_message(
    result: &kubelet_api::Result<i32>,
    status: bool,
    command: &str,
) -> Option<String> {
    match (result, status) {
        (Ok(code), true) => Some(exit_status_json(*code, command)),
        (Ok(0), false) => None,
        (Ok(code), false) => Some(format!(
            "command terminated with non-zero exit code: command '{command}' exited with {code}"
        )),
        (Err(e), true) => Some(internal_status_json(e.message())),
        (Err(e), false) => Some(e.message().to_string()),
    }
}

/// The v4 error-stream Status for a failure of the runtime.
pub(crate) fn internal_status_json(message: &str) -> String {
    serde_json::json!({
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "InternalError",
        "code": 500,
    })
    .to_string()
}

fn spdy_remotecommand(
    ctx: &Context,
    req: Request<Incoming>,
    protocol: &'static str,
    opts: StreamOptions,
    session: ExecSession,
    command: String,
) -> Response<Body> {
    let idle = ctx.streaming_idle_timeout;
    tokio::spawn(async move {
        let upgraded = match upgrade(req).await {
            Ok(u) => u,
            Err(e) => {
                tracing::debug!(error = %kubelet_api::chain(&e), "exec upgrade failed");
                return;
            }
        };
        let spdy = Session::start(TokioIo::new(upgraded), idle);
        serve_remotecommand(spdy, protocol, opts, session, command).await;
    });
    switching("SPDY/3.1", ("X-Stream-Protocol-Version", protocol))
}

/// The streams of one remotecommand session over SPDY.
#[derive(Default)]
struct Streams {
    error: Option<Stream>,
    stdin: Option<Stream>,
    stdout: Option<Stream>,
    stderr: Option<Stream>,
    resize: Option<Stream>,
}

async fn serve_remotecommand(
    mut spdy: Session,
    protocol: &str,
    opts: StreamOptions,
    session: ExecSession,
    command: String,
) {
    let resize_supported = protocol != "channel.k8s.io" && protocol != "v2.channel.k8s.io";
    let expected = 1
        + usize::from(opts.stdin)
        + usize::from(opts.stdout)
        + usize::from(opts.stderr)
        + usize::from(opts.tty && resize_supported);
    let mut got = Streams::default();
    let mut count = 0;
    let waited = tokio::time::timeout(STREAM_CREATION_TIMEOUT, async {
        while count < expected {
            let Some(s) = spdy.streams.recv().await else {
                return false;
            };
            let slot = match s.header("streamtype") {
                Some("error") => &mut got.error,
                Some("stdin") => &mut got.stdin,
                Some("stdout") => &mut got.stdout,
                Some("stderr") => &mut got.stderr,
                Some("resize") => &mut got.resize,
                other => {
                    tracing::debug!(stream_type = ?other, "unknown stream type; resetting it");
                    let _ = s.writer.reset(crate::spdy::status::REFUSED_STREAM).await;
                    continue;
                }
            };
            if slot.is_none() {
                count += 1;
            }
            *slot = Some(s);
        }
        true
    })
    .await;
    if !matches!(waited, Ok(true)) {
        tracing::debug!("timed out waiting for client to create streams");
        spdy.close().await;
        return;
    }
    let ExecSession {
        stdin,
        stdout,
        stderr,
        resize,
        exit,
    } = session;

    // Client input → the process.
    if let (Some(mut s), Some(mut w)) = (got.stdin.take(), stdin) {
        tokio::spawn(async move {
            while let Some(data) = s.data.recv().await {
                if w.write_all(&data).await.is_err() {
                    return;
                }
                let _ = w.flush().await;
            }
            let _ = w.shutdown().await;
        });
    }
    if let (Some(mut s), Some(tx)) = (got.resize.take(), resize) {
        tokio::spawn(async move { forward_resizes(&mut s.data, tx).await });
    }
    let out = got
        .stdout
        .take()
        .zip(stdout)
        .map(|(s, r)| tokio::spawn(copy_out(r, s.writer)));
    let err = got
        .stderr
        .take()
        .zip(stderr)
        .map(|(s, r)| tokio::spawn(copy_out(r, s.writer)));

    let result = exit.await;
    for task in [out, err].into_iter().flatten() {
        let _ = tokio::time::timeout(DRAIN_GRACE, task).await;
    }
    if let Some(e) = got.error.take() {
        let message = error_stream_message(&result, protocol == "v4.channel.k8s.io", &command);
        if let Some(m) = message {
            let _ = e.writer.write(m.as_bytes()).await;
        }
        let _ = e.writer.finish().await;
    }
    spdy.close().await;
}

/// Resize events: JSON objects back to back (`{"Width":80,"Height":24}`). Anything else ends
/// the resize stream (logged), not the session.
async fn forward_resizes(data: &mut mpsc::Receiver<Bytes>, tx: mpsc::Sender<TerminalSize>) {
    let mut buf: Vec<u8> = Vec::new();
    while let Some(chunk) = data.recv().await {
        buf.extend_from_slice(&chunk);
        let mut it = serde_json::Deserializer::from_slice(&buf).into_iter::<TerminalSize>();
        let mut consumed = 0;
        loop {
            match it.next() {
                Some(Ok(size)) => {
                    consumed = it.byte_offset();
                    let _ = tx.send(size).await;
                }
                Some(Err(e)) if e.is_eof() => break,
                Some(Err(e)) => {
                    tracing::debug!(error = %kubelet_api::chain(&e), "bad resize event; ignoring further resizes");
                    return;
                }
                None => break,
            }
        }
        buf.drain(..consumed);
        if buf.len() > 64 * 1024 {
            tracing::debug!("resize stream without a complete event in 64 KiB; ignoring it");
            return;
        }
    }
}

async fn copy_out(r: kubelet_api::StreamReader, w: StreamWriter) {
    let mut chunks = ReaderStream::with_capacity(r, 32 * 1024);
    while let Some(Ok(chunk)) = chunks.next().await {
        if w.write(&chunk).await.is_err() {
            return;
        }
    }
    let _ = w.finish().await;
}

fn spdy_port_forward(
    ctx: &Context,
    req: Request<Incoming>,
    dialer: Arc<dyn PortDialer>,
    sandbox: String,
) -> Response<Body> {
    let protocol = match negotiate(&req, SPDY_PORTFORWARD_PROTOCOLS) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let idle = ctx.streaming_idle_timeout;
    let limits = ForwardLimits {
        per_session: ctx.max_forwarded_per_session,
        all: ctx.forwarded_connections.clone(),
    };
    tokio::spawn(async move {
        let upgraded = match upgrade(req).await {
            Ok(u) => u,
            Err(e) => {
                tracing::debug!(error = %kubelet_api::chain(&e), "port-forward upgrade failed");
                return;
            }
        };
        let spdy = Session::start(TokioIo::new(upgraded), idle);
        serve_port_forward_session(spdy, dialer, sandbox, limits).await;
    });
    switching("SPDY/3.1", ("X-Stream-Protocol-Version", protocol))
}

/// How many connections port-forward sessions may forward.
#[derive(Clone)]
pub(crate) struct ForwardLimits {
    /// At once in one session.
    pub(crate) per_session: usize,
    /// At once in all sessions together: one permit each.
    pub(crate) all: Arc<tokio::sync::Semaphore>,
}

/// Pairs each forwarded connection's `error` and `data` streams (by `requestID`) and copies
/// bytes between the data stream and a connection to the port. At most `limits.per_session`
/// pairs are forwarded (and at most as many streams wait for their other half) at once, and no
/// more than `limits.all` permits allow; when the session ends, every connection to the pod it
/// opened is closed.
pub(crate) async fn serve_port_forward_session(
    mut spdy: Session,
    dialer: Arc<dyn PortDialer>,
    sandbox: String,
    limits: ForwardLimits,
) {
    let limit = limits.per_session;
    let mut waiting: std::collections::HashMap<String, (Option<Stream>, Option<Stream>)> =
        std::collections::HashMap::new();
    // Dropped (so aborted, their pod-side sockets closed) when the session ends.
    let mut forwarding = tokio::task::JoinSet::new();
    let mut refused = 0u64;
    while let Some(s) = spdy.streams.recv().await {
        while forwarding.try_join_next().is_some() {}
        tracing::debug!(stream = s.id, headers = ?s.headers, "port-forward stream");
        let request = s
            .header("requestid")
            .map(str::to_string)
            .unwrap_or_else(|| {
                // Without a requestID, an error stream and the data stream after it (ID + 2)
                // belong together.
                let base = if s.header("streamtype") == Some("data") {
                    s.id.saturating_sub(2)
                } else {
                    s.id
                };
                format!("stream-{base}")
            });
        if !waiting.contains_key(&request) && waiting.len() >= limit {
            tracing::debug!(
                limit,
                "port-forward: too many half-open stream pairs; resetting"
            );
            let _ = s.writer.reset(crate::spdy::status::REFUSED_STREAM).await;
            continue;
        }
        let entry = waiting.entry(request.clone()).or_default();
        match s.header("streamtype") {
            Some("error") => entry.0 = Some(s),
            Some("data") => entry.1 = Some(s),
            other => {
                tracing::debug!(stream_type = ?other, "unknown port-forward stream; resetting it");
                let _ = s.writer.reset(crate::spdy::status::REFUSED_STREAM).await;
                continue;
            }
        }
        if entry.0.is_some() && entry.1.is_some() {
            let Some((Some(error), Some(data))) = waiting.remove(&request) else {
                continue;
            };
            let permit = if forwarding.len() < limit {
                limits.all.clone().try_acquire_owned().ok()
            } else {
                None
            };
            let Some(permit) = permit else {
                refused += 1;
                if refused == 1 {
                    tracing::warn!(
                        limit,
                        "port-forward: a session reached its limit of forwarded connections; new ones are refused"
                    );
                }
                let m = format!(
                    "too many forwarded connections (limit {limit} in this session, or the agent's) for pod {sandbox}"
                );
                let _ = error.writer.write(m.as_bytes()).await;
                let _ = error.writer.finish().await;
                let _ = data.writer.finish().await;
                continue;
            };
            let dialer = dialer.clone();
            let sandbox = sandbox.clone();
            forwarding.spawn(async move {
                forward_one(dialer, error, data, &sandbox).await;
                drop(permit);
            });
        }
    }
    // The client is gone: nothing it opened stays connected to the pod.
    forwarding.shutdown().await;
}

async fn forward_one(dialer: Arc<dyn PortDialer>, error: Stream, data: Stream, sandbox: &str) {
    let port = data
        .header("port")
        .and_then(|p| p.parse::<u16>().ok())
        .filter(|p| *p > 0);
    let Some(port) = port else {
        let m = format!(
            "invalid port {:?} for pod {sandbox}",
            data.header("port").unwrap_or_default()
        );
        let _ = error.writer.write(m.as_bytes()).await;
        let _ = error.writer.finish().await;
        let _ = data.writer.finish().await;
        return;
    };
    tracing::debug!(port, stream = data.id, "port-forward: connecting");
    let data_id = data.id;
    let conn = match dialer.dial(port).await {
        Ok(c) => c,
        Err(e) => {
            let _ = error.writer.write(e.message().as_bytes()).await;
            let _ = error.writer.finish().await;
            let _ = data.writer.finish().await;
            return;
        }
    };
    let Stream {
        data: mut incoming,
        writer,
        ..
    } = data;
    let (rd, mut wr) = tokio::io::split(conn);
    // Client → pod until the client half-closes (or the connection goes).
    let to_pod = tokio::spawn(async move {
        while let Some(chunk) = incoming.recv().await {
            if wr.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = wr.shutdown().await;
    });
    // Pod → client until the pod closes; then both streams of the pair are closed at once (the
    // client waits for them before it closes its local connection), as the kubelet does when
    // its forwarder returns.
    // One TLS record per read.
    let mut chunks = ReaderStream::with_capacity(rd, 16 * 1024);
    while let Some(Ok(chunk)) = chunks.next().await {
        if writer.write(&chunk).await.is_err() {
            break;
        }
    }
    tracing::debug!(port, stream = data_id, "port-forward: connection done");
    let _ = writer.finish().await;
    let _ = error.writer.finish().await;
    to_pod.abort();
}

/// `/run`: the command's output (standard output then standard error), as the kubelet's
/// `RunInContainer`; a failure of the runtime is a 500 with its message.
async fn run(ctx: &Context, pod: &Pod, target: &Target, query: &Query) -> Response<Body> {
    let id = match running_container(ctx, pod, &target.container) {
        Ok(id) => id,
        Err(r) => return *r,
    };
    // The kubelet splits `cmd` on spaces and hands even an empty one to the runtime (a 500
    // from its error); no runtime can run an empty program name: 400, as `/exec` without a
    // command.
    if query.cmd.trim().is_empty() {
        return bad_request("you must specify a command");
    }
    let cmd: Vec<String> = query.cmd.split(' ').map(str::to_string).collect();
    match ctx.runtime.exec_sync(&id, &cmd, Duration::ZERO).await {
        Ok(r) => {
            let mut out = r.stdout;
            out.extend_from_slice(&r.stderr);
            let mut resp = crate::routes::full(StatusCode::OK, out);
            resp.headers_mut().insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            resp
        }
        Err(e) => plain(StatusCode::INTERNAL_SERVER_ERROR, e.message().to_string()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[test]
    fn paths_and_queries_are_read_with_the_kubelets_names() {
        assert_eq!(Kind::of("/exec/ns/p/c"), Some(Kind::Exec));
        assert_eq!(Kind::of("/portForward/ns/p"), Some(Kind::PortForward));
        assert_eq!(Kind::of("/pods"), None);
        let t = parse_target(Kind::Exec, "/exec/ns/p/uid-1/c").unwrap();
        assert_eq!(t.uid.as_deref(), Some("uid-1"));
        assert_eq!(t.container, "c");
        assert!(parse_target(Kind::Exec, "/exec/ns/p").is_none());
        let t = parse_target(Kind::PortForward, "/portForward/ns/p").unwrap();
        assert_eq!((t.namespace.as_str(), t.pod.as_str()), ("ns", "p"));
        let q = parse_query("command=sh&command=-c&command=echo+hi%21&input=1&output=1&tty=true");
        assert_eq!(q.command, ["sh", "-c", "echo hi!"]);
        assert_eq!(q.options, StreamOptions::new(true, true, false, true));
        assert_eq!(parse_query("cmd=ls+-l").cmd, "ls -l");
        assert_eq!(parse_query("port=80&port=8080").ports, ["80", "8080"]);
    }

    #[test]
    fn exit_codes_become_the_v4_status() {
        assert_eq!(
            exit_status_json(0, "true"),
            r#"{"metadata":{},"status":"Success"}"#
        );
        let v: serde_json::Value =
            serde_json::from_str(&exit_status_json(7, "sh -c exit 7")).unwrap();
        assert_eq!(v["reason"], "NonZeroExitCode");
        assert_eq!(v["details"]["causes"][0]["reason"], "ExitCode");
        assert_eq!(v["details"]["causes"][0]["message"], "7");
    }

    #[tokio::test]
    async fn resize_events_are_decoded_back_to_back_and_garbage_stops_them() {
        let (data_tx, mut data_rx) = mpsc::channel(4);
        let (tx, mut rx) = mpsc::channel(8);
        let task = tokio::spawn(async move { forward_resizes(&mut data_rx, tx).await });
        data_tx
            .send(Bytes::from_static(br#"{"Width":80,"Height":24}{"Width":1"#))
            .await
            .unwrap();
        data_tx
            .send(Bytes::from_static(br#"00,"Height":50}not json"#))
            .await
            .unwrap();
        assert_eq!(
            rx.recv().await,
            Some(TerminalSize {
                width: 80,
                height: 24
            })
        );
        assert_eq!(
            rx.recv().await,
            Some(TerminalSize {
                width: 100,
                height: 50
            })
        );
        task.await.unwrap();
        assert_eq!(
            rx.recv().await,
            None,
            "the bad event ended the resize stream"
        );
    }

    struct LocalDialer;

    #[async_trait::async_trait]
    impl PortDialer for LocalDialer {
        async fn dial(&self, port: u16) -> kubelet_api::Result<Box<dyn kubelet_api::DuplexStream>> {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .map(|s| Box::new(s) as Box<dyn kubelet_api::DuplexStream>)
                .map_err(|e| kubelet_api::Error::unavailable(e.to_string()))
        }
    }

    #[tokio::test]
    async fn a_forwarded_connection_carries_bytes_both_ways_over_spdy() {
        use crate::spdy::{Frame, FrameReader, FrameWriter, data_frame};
        use bytes::BytesMut;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut c, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 64];
            let n = c.read(&mut buf).await.unwrap();
            c.write_all(&[b"echo:", &buf[..n]].concat()).await.unwrap();
        });
        let (client, server) = tokio::io::duplex(64 * 1024);
        let session = Session::start(server, Duration::from_secs(30));
        tokio::spawn(serve_port_forward_session(
            session,
            Arc::new(LocalDialer),
            "sb".into(),
            ForwardLimits {
                per_session: 2,
                all: Arc::new(tokio::sync::Semaphore::new(100)),
            },
        ));
        let (mut crd, mut cwr) = tokio::io::split(client);
        let mut w = FrameWriter::new();
        let mut wire = BytesMut::new();
        let p = port.to_string();
        w.syn_stream(
            &mut wire,
            1,
            false,
            &[("streamType", "error"), ("port", &p), ("requestID", "0")],
        )
        .unwrap();
        data_frame(&mut wire, 1, true, &[]);
        w.syn_stream(
            &mut wire,
            3,
            false,
            &[("streamType", "data"), ("port", &p), ("requestID", "0")],
        )
        .unwrap();
        data_frame(&mut wire, 3, false, b"ping");
        cwr.write_all(&wire).await.unwrap();
        let mut r = FrameReader::new();
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !got.ends_with(b"echo:ping") {
            assert!(tokio::time::Instant::now() < deadline, "no answer: {got:?}");
            let n = tokio::time::timeout(Duration::from_secs(5), crd.read_buf(&mut buf))
                .await
                .unwrap()
                .unwrap();
            assert!(n > 0);
            while let Some(f) = r.decode(&mut buf).unwrap() {
                if let Frame::Data {
                    stream_id: 3, data, ..
                } = f
                {
                    got.extend_from_slice(&data);
                }
            }
        }
    }

    /// TCP sockets of this machine with one end at 127.0.0.1:`port` that are neither listening
    /// nor in TIME_WAIT (which holds no descriptor): both ends of every live connection.
    fn live_sockets_at(port: u16) -> usize {
        let text = std::fs::read_to_string("/proc/net/tcp").unwrap();
        let at = format!("0100007F:{port:04X}");
        text.lines()
            .skip(1)
            .filter(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() > 3 && (f[1] == at || f[2] == at) && f[3] != "06" && f[3] != "0A"
            })
            .count()
    }

    /// One port-forward connection opening 10,000 streams (5,000 pairs) against the default
    /// limit of 128 forwarded connections per session: the pairs beyond it get the protocol's
    /// error on their error stream, and when the client goes every connection it made to the
    /// pod is closed, even those the pod keeps open: no socket of the session is left.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ten_thousand_port_forward_streams_are_bounded_and_closed_with_their_session() {
        use crate::spdy::{Frame, FrameReader, FrameWriter};
        use bytes::BytesMut;
        const PAIRS: u32 = 5_000;
        let limit = crate::ServerConfig::default().max_forwarded_per_session;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (closed_tx, mut closed_rx) = mpsc::channel::<()>(PAIRS as usize);
        tokio::spawn(async move {
            loop {
                let (mut c, _) = listener.accept().await.unwrap();
                let closed = closed_tx.clone();
                // The pod side never closes by itself; it notices when the agent closes.
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while matches!(c.read(&mut buf).await, Ok(n) if n > 0) {}
                    drop(c);
                    let _ = closed.send(()).await;
                });
            }
        });
        let (client, server) = tokio::io::duplex(64 * 1024);
        let session = Session::start(server, Duration::from_secs(30));
        let served = tokio::spawn(serve_port_forward_session(
            session,
            Arc::new(LocalDialer),
            "sb".into(),
            ForwardLimits {
                per_session: limit,
                all: Arc::new(tokio::sync::Semaphore::new(4_096)),
            },
        ));
        let (mut crd, mut cwr) = tokio::io::split(client);
        let p = port.to_string();
        let writer = tokio::spawn(async move {
            let mut w = FrameWriter::new();
            for i in 0..PAIRS {
                let (mut wire, id) = (BytesMut::new(), i.to_string());
                for (offset, kind) in [(0, "error"), (2, "data")] {
                    w.syn_stream(
                        &mut wire,
                        1 + 4 * i + offset,
                        false,
                        &[("streamType", kind), ("port", &p), ("requestID", &id)],
                    )
                    .unwrap();
                }
                cwr.write_all(&wire).await.unwrap();
            }
            cwr
        });
        // Every pair beyond the limit is refused on its error stream (ID 4n + 1), saying why.
        let mut r = FrameReader::new();
        let mut buf = BytesMut::new();
        let mut refused = std::collections::HashSet::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while refused.len() < (PAIRS as usize - limit) {
            let n = tokio::time::timeout_at(deadline, crd.read_buf(&mut buf))
                .await
                .unwrap_or_else(|_| panic!("{} pairs refused, not more", refused.len()))
                .unwrap();
            assert!(n > 0);
            while let Some(f) = r.decode(&mut buf).unwrap() {
                if let Frame::Data {
                    stream_id, data, ..
                } = f
                    && stream_id % 4 == 1
                    && String::from_utf8_lossy(&data).contains(&format!("limit {limit}"))
                {
                    refused.insert(stream_id);
                }
            }
        }
        let cwr = writer.await.unwrap();
        // The first `limit` pairs are forwarded: both ends of each connection are live.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while live_sockets_at(port) < 2 * limit {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} live sockets",
                live_sockets_at(port)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            live_sockets_at(port),
            2 * limit,
            "more than the limit reached the pod"
        );
        // The client goes: every pod-side connection is closed, nothing half-open stays.
        drop((crd, cwr));
        for _ in 0..limit {
            tokio::time::timeout(Duration::from_secs(10), closed_rx.recv())
                .await
                .expect("a pod-side connection closed with its session");
        }
        tokio::time::timeout(Duration::from_secs(10), served)
            .await
            .expect("the session ends")
            .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while live_sockets_at(port) > 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} sockets of the session left",
                live_sockets_at(port)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[test]
    fn streaming_sessions_beyond_the_cap_get_503_until_one_ends() {
        let sessions = Arc::new(tokio::sync::Semaphore::new(2));
        let a = session_slot(&sessions).ok().unwrap();
        let b = session_slot(&sessions).ok().unwrap();
        let refused = session_slot(&sessions).err().unwrap();
        assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(refused.headers()["retry-after"], "1");
        // A clone (the request's extensions are cloned with it) keeps the slot taken.
        let a2 = a.clone();
        drop(a);
        assert!(session_slot(&sessions).is_err());
        drop(a2);
        assert!(session_slot(&sessions).is_ok());
        drop(b);
    }
}
