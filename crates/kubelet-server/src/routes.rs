//! The endpoints, with the kubelet's paths, methods, status codes and bodies.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{ALLOW, CONTENT_TYPE, LOCATION};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodStatus};
use kubelet_api::AgentHandle;
use kubelet_api::runtime::ContainerState;
use kubelet_api::runtime::strip_container_id;
use kubelet_api::{ContainerRuntime, PlegHealth};
use kubelet_core::k8s_openapi;
use kubelet_core::prometheus_client;
use tokio::sync::mpsc;

use crate::logs::{LogCursor, LogOptions, QueryError, ReadOptions};

/// The agent's pod `namespace`/`name` (with `uid`, only that instance; else the newest) and its
/// status, as `/containerLogs` and the streaming endpoints look it up.
pub(crate) fn find_pod(
    ctx: &Context,
    namespace: &str,
    name: &str,
    uid: Option<&str>,
) -> Option<kubelet_api::PodWithStatus> {
    ctx.handle
        .statuses()
        .list()
        .into_iter()
        .filter(|p| {
            let m = &p.pod.metadata;
            m.namespace.as_deref() == Some(namespace)
                && m.name.as_deref() == Some(name)
                && uid.is_none_or(|u| m.uid.as_deref() == Some(u))
        })
        .max_by_key(|p| p.pod.metadata.creation_timestamp.clone().map(|t| t.0))
}

/// A response body: whole or streamed.
pub type Body = BoxBody<Bytes, Infallible>;

/// The sync loop is unhealthy when it has not run for this long (the kubelet: max(2 ×
/// `syncFrequency`, 5 min)).
pub(crate) const MIN_SYNC_LOOP_THRESHOLD: Duration = Duration::from_secs(300);

/// Which listener a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Port {
    /// The kubelet API (`port`): everything, authenticated.
    Main,
    /// The read-only port: the auth-not-required set.
    ReadOnly,
    /// The healthz port: `/healthz`.
    Healthz,
}

/// What the handlers read.
pub(crate) struct Context {
    pub(crate) handle: std::sync::Arc<dyn AgentHandle>,
    pub(crate) runtime: Arc<dyn ContainerRuntime>,
    /// The agent's stats service, when a plugin provides one (else the stats paths are 404).
    pub(crate) stats: Option<Arc<dyn kubelet_api::stats::StatsService>>,
    pub(crate) debugging: bool,
    pub(crate) system_logs: bool,
    pub(crate) system_log_dir: PathBuf,
    pub(crate) configz: Option<serde_json::Value>,
    pub(crate) sync_loop_threshold: Duration,
    /// `streamingConnectionIdleTimeout`.
    #[cfg(feature = "https")]
    pub(crate) streaming_idle_timeout: Duration,
    /// One permit per open streaming session (`max_streaming_sessions`).
    #[cfg(feature = "https")]
    pub(crate) streaming_sessions: Arc<tokio::sync::Semaphore>,
    /// `max_forwarded_per_session`.
    #[cfg(feature = "https")]
    pub(crate) max_forwarded_per_session: usize,
    /// One permit per forwarded connection of all sessions (`max_forwarded_connections`).
    #[cfg(feature = "https")]
    pub(crate) forwarded_connections: Arc<tokio::sync::Semaphore>,
}

pub(crate) fn full(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()).boxed());
    *r.status_mut() = status;
    r
}

fn with_type(mut r: Response<Body>, value: &'static str) -> Response<Body> {
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(value));
    r
}

pub(crate) fn plain(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    with_type(full(status, body), "text/plain; charset=utf-8")
}

fn json(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    with_type(full(status, value.to_string()), "application/json")
}

/// A Kubernetes `Status` body.
pub(crate) fn status(code: StatusCode, reason: &str, message: impl Into<String>) -> Response<Body> {
    json(
        code,
        &serde_json::json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message.into(),
            "reason": reason,
            "code": code.as_u16(),
        }),
    )
}

fn streamed(rx: mpsc::Receiver<Bytes>) -> Body {
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    BodyExt::boxed(StreamBody::new(stream))
}

/// The paths of the kubelet's debugging set (never on the read-only port).
const DEBUG_PREFIXES: &[&str] = &[
    "/run/",
    "/exec/",
    "/attach/",
    "/portForward/",
    "/containerLogs/",
    "/runningpods/",
    "/debug/pprof/",
    "/logs/",
];

fn is_debug_path(path: &str) -> bool {
    DEBUG_PREFIXES
        .iter()
        .any(|p| path.starts_with(p) || path == &p[..p.len() - 1])
}

fn get_only(method: &Method) -> Option<Response<Body>> {
    if method == Method::GET {
        return None;
    }
    let mut r = plain(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed\n");
    r.headers_mut()
        .insert(ALLOW, HeaderValue::from_static("GET"));
    Some(r)
}

/// Answer `req` (authentication and authorization already passed).
pub(crate) async fn route<B>(ctx: &Context, port: Port, req: &Request<B>) -> Response<Body> {
    let path = req.uri().path();
    let query = req.uri().query().unwrap_or("");
    if port == Port::Healthz {
        return match path {
            "/healthz" => get_only(req.method()).unwrap_or_else(|| healthz(ctx, None, query)),
            _ => plain(StatusCode::NOT_FOUND, "404 page not found\n"),
        };
    }
    if is_debug_path(path) && (port == Port::ReadOnly || !ctx.debugging) {
        return plain(
            StatusCode::METHOD_NOT_ALLOWED,
            "Debug endpoints are disabled.\n",
        );
    }
    if let Some(r) = get_only(req.method()) {
        // `/stats/summary` also answers POST, as the kubelet's.
        if path == "/stats/summary" && req.method() == Method::POST {
            return stats_summary(ctx, query).await;
        }
        let known = path == "/healthz"
            || path.starts_with("/healthz/")
            || path == "/stats/summary"
            || path == "/pods"
            || path == "/pods/"
            || path.starts_with("/metrics")
            || (port == Port::Main && path == "/configz")
            || is_debug_path(path);
        if known {
            return r;
        }
    }
    match path {
        "/healthz" => healthz(ctx, None, query),
        "/healthz/ping" | "/healthz/log" | "/healthz/syncloop" | "/healthz/pleg" => {
            healthz(ctx, path.strip_prefix("/healthz/"), query)
        }
        "/pods" | "/pods/" => pods(ctx.handle.as_ref()),
        "/metrics" => metrics(ctx.handle.as_ref(), None),
        "/metrics/probes" => metrics(
            ctx.handle.as_ref(),
            Some(&["prober_probe", "process_start_time_seconds"]),
        ),
        "/stats/summary" => stats_summary(ctx, query).await,
        "/metrics/resource" => match &ctx.stats {
            Some(stats) => with_type(
                full(
                    StatusCode::OK,
                    crate::stats::resource_metrics(&*stats.summary_with_pods().await),
                ),
                crate::stats::PROMETHEUS_TEXT,
            ),
            None => plain(StatusCode::NOT_FOUND, "404 page not found\n"),
        },
        "/metrics/cadvisor" => match &ctx.stats {
            Some(stats) => with_type(
                full(
                    StatusCode::OK,
                    crate::stats::cadvisor_metrics(
                        &*stats.summary_with_pods().await,
                        stats.machine(),
                    ),
                ),
                crate::stats::PROMETHEUS_TEXT,
            ),
            None => plain(StatusCode::NOT_FOUND, "404 page not found\n"),
        },
        "/configz" if port == Port::Main => match &ctx.configz {
            Some(c) => json(StatusCode::OK, &serde_json::json!({ "kubeletconfig": c })),
            None => plain(StatusCode::NOT_FOUND, "404 page not found\n"),
        },
        "/runningpods" | "/runningpods/" => running_pods(ctx).await,
        _ if path.starts_with("/containerLogs/") || path == "/containerLogs" => {
            container_logs(ctx, path, query).await
        }
        _ if path == "/logs" || path.starts_with("/logs/") => {
            if !ctx.system_logs {
                return plain(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "logs endpoint is disabled.\n",
                );
            }
            system_logs(&ctx.system_log_dir, path).await
        }
        _ => plain(StatusCode::NOT_FOUND, "404 page not found\n"),
    }
}

/// `/stats/summary` (GET and POST): a sample whose pods are at most one sampling period old,
/// whole or `only_cpu_and_memory`.
async fn stats_summary(ctx: &Context, query: &str) -> Response<Body> {
    let Some(stats) = &ctx.stats else {
        return plain(StatusCode::NOT_FOUND, "404 page not found\n");
    };
    let reduced = crate::stats::only_cpu_and_memory(query);
    match crate::stats::summary_json(&*stats.summary_with_pods().await, reduced) {
        Ok(body) => with_type(full(StatusCode::OK, body), "application/json"),
        Err(e) => plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("Internal Error: {e}\n"),
        ),
    }
}

fn healthz(ctx: &Context, only: Option<&str>, query: &str) -> Response<Body> {
    let pleg = match ctx.handle.pleg_health() {
        PlegHealth::Healthy => Ok(()),
        PlegHealth::Unhealthy(m) => Err(m),
    };
    let checks: [(&str, Result<(), String>); 4] = [
        ("ping", Ok(())),
        ("log", Ok(())),
        (
            "syncloop",
            ctx.handle
                .sync_loop_health(ctx.sync_loop_threshold)
                .map_err(|e| e.to_string()),
        ),
        ("pleg", pleg),
    ];
    if let Some(name) = only {
        return match checks.iter().find(|(n, _)| *n == name) {
            Some((_, Ok(()))) => plain(StatusCode::OK, "ok"),
            Some((_, Err(e))) => plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("internal server error: {e}\n"),
            ),
            None => plain(StatusCode::NOT_FOUND, "404 page not found\n"),
        };
    }
    let pairs = crate::logs::query_pairs(query);
    let verbose = pairs.iter().any(|(k, _)| k == "verbose");
    let excluded: Vec<&str> = pairs
        .iter()
        .filter(|(k, _)| k == "exclude")
        .map(|(_, v)| v.as_str())
        .collect();
    let mut body = String::new();
    let mut failed = false;
    for (name, result) in &checks {
        if excluded.contains(name) {
            body.push_str(&format!("[+]{name} excluded: ok\n"));
            continue;
        }
        match result {
            Ok(()) => body.push_str(&format!("[+]{name} ok\n")),
            Err(e) => {
                failed = true;
                tracing::info!(check = name, reason = %e, "healthz check failed");
                body.push_str(&format!("[-]{name} failed: reason withheld\n"));
            }
        }
    }
    if failed {
        body.push_str("healthz check failed\n");
        plain(StatusCode::INTERNAL_SERVER_ERROR, body)
    } else if verbose {
        body.push_str("healthz check passed\n");
        plain(StatusCode::OK, body)
    } else {
        plain(StatusCode::OK, "ok")
    }
}

fn pods(handle: &dyn AgentHandle) -> Response<Body> {
    let entries = handle.statuses().list();
    // Encoded where they are: a copy of every pod with its status set would be transient heap
    // of the size of all pods, at each request.
    let body = kubelet_api::pod::list_to_json_with_status(
        &mut entries.iter().map(|p| (&*p.pod, Some(&*p.status))),
    );
    with_type(full(StatusCode::OK, body), "application/json")
}

async fn running_pods(ctx: &Context) -> Response<Body> {
    match kubelet_api::runtime::get_pods(ctx.runtime.as_ref()).await {
        Ok(pods) => {
            let items: Vec<serde_json::Value> = pods
                .into_iter()
                .map(|p| {
                    let containers: Vec<serde_json::Value> = p
                        .containers
                        .iter()
                        .map(|c| serde_json::json!({ "name": c.metadata.name, "image": c.image }))
                        .collect();
                    serde_json::json!({
                        "metadata": { "name": p.name, "namespace": p.namespace, "uid": p.uid },
                        "spec": { "containers": containers },
                        "status": {},
                    })
                })
                .collect();
            json(
                StatusCode::OK,
                &serde_json::json!({
                    "kind": "PodList",
                    "apiVersion": "v1",
                    "metadata": {},
                    "items": items,
                }),
            )
        }
        Err(e) => plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("Internal Error: {e}\n"),
        ),
    }
}

fn metric_name(line: &str) -> &str {
    let rest = line
        .strip_prefix("# HELP ")
        .or_else(|| line.strip_prefix("# TYPE "))
        .or_else(|| line.strip_prefix("# UNIT "))
        .unwrap_or(line);
    rest.split([' ', '{']).next().unwrap_or("")
}

fn metrics(handle: &dyn AgentHandle, only: Option<&[&str]>) -> Response<Body> {
    let mut body = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut body, &handle.metrics()) {
        return plain(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n"));
    }
    if let Some(prefixes) = only {
        let mut kept = String::new();
        for line in body.lines() {
            let name = metric_name(line);
            if line == "# EOF" || prefixes.iter().any(|p| name.starts_with(p)) {
                kept.push_str(line);
                kept.push('\n');
            }
        }
        body = kept;
    }
    with_type(
        full(StatusCode::OK, body),
        "application/openmetrics-text; version=1.0.0; charset=utf-8",
    )
}

/// The container instance whose log to read (the kubelet's `validateContainerLogStatus`).
fn log_container_id(
    pod_name: &str,
    container: &str,
    status: &PodStatus,
    previous: bool,
) -> Result<String, String> {
    let all = status
        .container_statuses
        .iter()
        .chain(status.init_container_statuses.iter())
        .chain(status.ephemeral_container_statuses.iter())
        .flatten();
    let found: Option<&ContainerStatus> = all.into_iter().find(|s| s.name == container);
    let Some(cs) = found else {
        return Err(format!(
            "container {container:?} in pod {pod_name:?} is not available"
        ));
    };
    let last_terminated = cs
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .and_then(|t| t.container_id.clone())
        .filter(|id| !id.is_empty());
    if previous {
        return last_terminated.ok_or_else(|| {
            format!("previous terminated container {container:?} in pod {pod_name:?} not found")
        });
    }
    let state = cs.state.as_ref();
    if state.and_then(|s| s.running.as_ref()).is_some() {
        return cs
            .container_id
            .clone()
            .filter(|id| !id.is_empty())
            .ok_or_else(|| {
                format!("container {container:?} in pod {pod_name:?} is not available")
            });
    }
    if let Some(t) = state.and_then(|s| s.terminated.as_ref()) {
        return t
            .container_id
            .clone()
            .filter(|id| !id.is_empty())
            .or(last_terminated)
            .ok_or_else(|| format!("container {container:?} in pod {pod_name:?} is terminated"));
    }
    if let Some(w) = state.and_then(|s| s.waiting.as_ref()) {
        let reason = w.reason.as_deref().unwrap_or("");
        return Err(match reason {
            "ErrImagePull" => format!(
                "container {container:?} in pod {pod_name:?} is waiting to start: image can't be pulled"
            ),
            "ImagePullBackOff" => format!(
                "container {container:?} in pod {pod_name:?} is waiting to start: trying and failing to pull image"
            ),
            r => format!("container {container:?} in pod {pod_name:?} is waiting to start: {r}"),
        });
    }
    Err(format!(
        "container {container:?} in pod {pod_name:?} is not available"
    ))
}

fn in_spec(pod: &Pod, container: &str) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    spec.containers.iter().any(|c| c.name == container)
        || spec
            .init_containers
            .iter()
            .flatten()
            .any(|c| c.name == container)
        || spec
            .ephemeral_containers
            .iter()
            .flatten()
            .any(|c| c.name == container)
}

async fn container_logs(ctx: &Context, path: &str, query: &str) -> Response<Body> {
    let rest = path
        .trim_start_matches("/containerLogs")
        .trim_start_matches('/');
    let mut parts = rest.splitn(3, '/');
    let namespace = crate::logs::percent_decode(parts.next().unwrap_or(""));
    let pod_name = crate::logs::percent_decode(parts.next().unwrap_or(""));
    let container = crate::logs::percent_decode(parts.next().unwrap_or("").trim_end_matches('/'));
    let bad = |m: &str| status(StatusCode::BAD_REQUEST, "BadRequest", m);
    if pod_name.is_empty() {
        return bad("Missing podID.");
    }
    if container.is_empty() {
        return bad("Missing container name.");
    }
    if namespace.is_empty() {
        return bad("Missing podNamespace.");
    }
    let options = match LogOptions::from_query(query) {
        Ok(o) => o,
        Err(e @ QueryError::Decode(_)) => return bad(&e.to_string()),
        Err(e @ QueryError::Invalid(_)) => {
            return status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", e.to_string());
        }
    };
    let Some(entry) = find_pod(ctx, &namespace, &pod_name, None) else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("pod {pod_name:?} does not exist"),
        );
    };
    if !in_spec(&entry.pod, &container) {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("container {container:?} not found in pod {pod_name:?}"),
        );
    }
    let id = match log_container_id(&pod_name, &container, &entry.status, options.previous) {
        Ok(id) => strip_container_id(&id).to_string(),
        Err(m) => return bad(&m),
    };
    let cs = match ctx.runtime.container_status(&id).await {
        Ok(cs) => cs,
        Err(e) => return bad(&format!("failed to get container status {id:?}: {e}")),
    };
    let read = ReadOptions {
        since: options.since(jiff::Timestamp::now()),
        timestamps: options.timestamps,
        limit_bytes: options.limit_bytes.map(|n| n.max(0) as u64),
        follow: options.follow,
    };
    let tail = options.tail_lines.map(|n| n.max(0) as u64);
    let log_path = cs.log_path.clone();
    let opened = tokio::task::spawn_blocking(move || LogCursor::open(&log_path, tail, read)).await;
    let cursor = match opened {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            return bad(&format!(
                "failed to open log file {:?}: {e}",
                cs.log_path.display()
            ));
        }
        Err(e) => return bad(&e.to_string()),
    };
    let (tx, rx) = mpsc::channel(2);
    let runtime = ctx.runtime.clone();
    tokio::spawn(crate::logs::stream_log(cursor, tx, move || {
        let runtime = runtime.clone();
        let id = id.clone();
        async move {
            matches!(
                runtime.container_status(&id).await,
                Ok(s) if s.state == ContainerState::Running
            )
        }
    }));
    let mut r = Response::new(streamed(rx));
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// The file or directory of `/logs/<rest>` under `root`, `..` unable to leave it (Go's
/// `http.Dir` cleaning).
fn system_log_path(root: &Path, rest: &str) -> PathBuf {
    let mut parts: Vec<String> = Vec::new();
    for seg in rest.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(crate::logs::percent_decode(s)),
        }
    }
    let mut p = root.to_path_buf();
    for s in parts {
        if s.contains('/') || s == ".." {
            continue;
        }
        p.push(s);
    }
    p
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&#34;")
        .replace('\'', "&#39;")
}

fn url_escape(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

async fn system_logs(root: &Path, path: &str) -> Response<Body> {
    let rest = path.strip_prefix("/logs").unwrap_or("");
    let target = system_log_path(root, rest);
    let meta = match tokio::fs::metadata(&target).await {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return plain(StatusCode::NOT_FOUND, "404 page not found\n");
        }
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return plain(StatusCode::FORBIDDEN, "403 Forbidden\n");
        }
        Err(_) => {
            return plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                "500 Internal Server Error\n",
            );
        }
    };
    if meta.is_dir() {
        if !path.ends_with('/') {
            let mut r = full(StatusCode::MOVED_PERMANENTLY, "");
            if let Ok(v) = HeaderValue::from_str(&format!("{path}/")) {
                r.headers_mut().insert(LOCATION, v);
            }
            return r;
        }
        let mut names = Vec::new();
        let mut dir = match tokio::fs::read_dir(&target).await {
            Ok(d) => d,
            Err(_) => {
                return plain(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "Error reading directory\n",
                );
            }
        };
        while let Ok(Some(e)) = dir.next_entry().await {
            let mut name = e.file_name().to_string_lossy().into_owned();
            if e.file_type().await.is_ok_and(|t| t.is_dir()) {
                name.push('/');
            }
            names.push(name);
        }
        kubelet_api::sort::by(&mut names, Ord::cmp);
        let mut body = String::from("<pre>\n");
        for n in names {
            body.push_str(&format!(
                "<a href=\"{}\">{}</a>\n",
                url_escape(&n),
                html_escape(&n)
            ));
        }
        body.push_str("</pre>\n");
        return with_type(full(StatusCode::OK, body), "text/html; charset=utf-8");
    }
    let file = match std::fs::File::open(&target) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return plain(StatusCode::FORBIDDEN, "403 Forbidden\n");
        }
        Err(_) => {
            return plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                "500 Internal Server Error\n",
            );
        }
    };
    // Read chunk by chunk on the blocking pool: a slow client holds no thread.
    use futures::StreamExt;
    let chunks =
        tokio_util::io::ReaderStream::with_capacity(tokio::fs::File::from_std(file), 64 * 1024)
            .scan((), |_, chunk| {
                std::future::ready(chunk.ok().map(|b| Ok::<_, Infallible>(Frame::data(b))))
            });
    let mut r = Response::new(BodyExt::boxed(StreamBody::new(chunks)));
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState as K8sState, ContainerStateRunning, ContainerStateTerminated,
        ContainerStateWaiting,
    };

    /// `/logs/` serves a file larger than one read chunk whole, lists a directory with a slash
    /// after subdirectories, and answers 404 for what is not there.
    #[tokio::test]
    async fn system_logs_serve_files_in_chunks_and_list_directories() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.path().join("syslog"), &data).unwrap();
        std::fs::create_dir(dir.path().join("pods")).unwrap();

        let r = system_logs(dir.path(), "/logs/syslog").await;
        assert_eq!(r.status(), StatusCode::OK);
        let body = r.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body.len(), data.len());
        assert!(body[..] == data[..], "the body differs from the file");

        let r = system_logs(dir.path(), "/logs/").await;
        assert_eq!(r.status(), StatusCode::OK);
        let body = r.into_body().collect().await.unwrap().to_bytes();
        let listing = String::from_utf8_lossy(&body);
        assert!(
            listing.contains(">pods/<") && listing.contains(">syslog<"),
            "{listing}"
        );

        let r = system_logs(dir.path(), "/logs/missing").await;
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
    }

    fn cs(name: &str, state: K8sState, last: Option<K8sState>, id: &str) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            state: Some(state),
            last_state: last,
            container_id: Some(id.into()),
            ..Default::default()
        }
    }

    #[test]
    fn the_instance_is_chosen_as_the_kubelet_chooses_it() {
        let running = K8sState {
            running: Some(ContainerStateRunning::default()),
            ..Default::default()
        };
        let terminated = |id: &str| K8sState {
            terminated: Some(ContainerStateTerminated {
                container_id: Some(id.into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let waiting = |r: &str| K8sState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(r.into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let status = PodStatus {
            container_statuses: Some(vec![
                cs(
                    "a",
                    running.clone(),
                    Some(terminated("process://old")),
                    "process://new",
                ),
                cs("b", running, None, "process://b"),
                cs("c", waiting("ImagePullBackOff"), None, ""),
                cs("d", waiting("ContainerCreating"), None, ""),
                cs("e", terminated(""), Some(terminated("process://e0")), ""),
            ]),
            ..Default::default()
        };
        assert_eq!(
            log_container_id("p", "a", &status, false).unwrap(),
            "process://new"
        );
        assert_eq!(
            log_container_id("p", "a", &status, true).unwrap(),
            "process://old"
        );
        assert_eq!(
            log_container_id("p", "b", &status, true).unwrap_err(),
            "previous terminated container \"b\" in pod \"p\" not found"
        );
        assert_eq!(
            log_container_id("p", "c", &status, false).unwrap_err(),
            "container \"c\" in pod \"p\" is waiting to start: trying and failing to pull image"
        );
        assert_eq!(
            log_container_id("p", "d", &status, false).unwrap_err(),
            "container \"d\" in pod \"p\" is waiting to start: ContainerCreating"
        );
        assert_eq!(
            log_container_id("p", "e", &status, false).unwrap(),
            "process://e0"
        );
        assert_eq!(
            log_container_id("p", "x", &status, false).unwrap_err(),
            "container \"x\" in pod \"p\" is not available"
        );
    }

    #[test]
    fn system_log_paths_cannot_leave_the_root() {
        let root = Path::new("/var/log");
        assert_eq!(system_log_path(root, "/"), PathBuf::from("/var/log"));
        assert_eq!(
            system_log_path(root, "/a/b.log"),
            PathBuf::from("/var/log/a/b.log")
        );
        assert_eq!(
            system_log_path(root, "/../../etc/passwd"),
            PathBuf::from("/var/log/etc/passwd")
        );
        assert_eq!(
            system_log_path(root, "/a/%2e%2e/x"),
            PathBuf::from("/var/log/a/x")
        );
    }

    #[test]
    fn probe_metrics_are_picked_by_family() {
        assert_eq!(
            metric_name("# HELP prober_probe_total Cumulative"),
            "prober_probe_total"
        );
        assert_eq!(
            metric_name("prober_probe_total{probe_type=\"Liveness\"} 1"),
            "prober_probe_total"
        );
        assert_eq!(
            metric_name("# TYPE process_start_time_seconds gauge"),
            "process_start_time_seconds"
        );
    }
}
