//! [`PushSource`]: an HTTP endpoint that accepts pod manifests and feeds them to the merge as
//! their own source, named `push`.
//!
//! It runs pods on the node, so it is off unless the host builds one, binds `127.0.0.1` by
//! default ([`PushSourceConfig::address`]), and refuses to start without a way to authenticate
//! clients: a bearer token file (one token per line) and/or a client CA file (which needs a
//! serving certificate: the endpoint then speaks HTTPS and verifies client certificates).
//!
//! # API
//!
//! | Request | Effect | Success |
//! |---|---|---|
//! | `GET /pods` | list the pushed pods (as defaulted and accepted) | 200, a `v1` `PodList` |
//! | `POST /pods` | add a pod; 409 `AlreadyExists` if its namespace/name is taken, here or by another source | 201, the pod |
//! | `PUT /pods/{namespace}/{name}` | add or replace that pod | 201 (added) or 200 (replaced) |
//! | `DELETE /pods/{namespace}/{name}` | remove it; 404 `NotFound` if absent | 200, a `Success` `Status` |
//!
//! Bodies are one `v1` `Pod`, JSON or YAML (`Content-Type` `application/json`,
//! `application/yaml`, `application/x-yaml`, `text/yaml`, or none), at most 10 MiB. A pushed pod
//! gets the static pod defaults (`<name>-<node>`, the namespace `default`, a UID hashed from
//! the manifest, the node and `push:<namespace>/<name>`) and the same validation as every other
//! source; a pod that fails validation is answered `422 Unprocessable Entity` with a Kubernetes
//! `Status` (`reason: Invalid`, one `cause` per field error) and changes nothing. Every error is
//! a `Status` of the API server's shape. An accepted pod carries
//! `kubernetes.io/config.source: push` and `kubernetes.io/config.seen` (the time it was
//! accepted), the annotations the merge gives every pod; the responses and `GET /pods` show them.
//!
//! # Authentication
//!
//! A request is accepted if the TLS client presented a certificate signed by the client CA, or
//! if it carries `Authorization: Bearer <token>` with a token of the token file. A request
//! without credentials gets `401 Unauthorized`; one whose credentials are not accepted (an
//! unknown token, another scheme) gets `403 Forbidden`. Neither changes anything.
//!
//! Pushed pods live in memory: after a restart of the agent the pusher sends them again.
//!
//! A request is answered once the endpoint's set of pods has changed; a task of the endpoint
//! then delivers the set to the merge. Requests that arrive while the merge is busy with the
//! previous set are delivered together, so a burst of pushes costs a few snapshots.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Status, StatusCause, StatusDetails};
use kubelet_api::{PodSource, SourceSender};
use kubelet_net::listener::AcceptorConfig;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::Mutex as AsyncMutex;
use tokio_util::sync::CancellationToken;

use crate::error::PodConfigError;
use crate::manifest::{self, MAX_MANIFEST_SIZE, ManifestOrigin};
use crate::validation::ValidationOptions;

/// Name of the push source.
pub const PUSH_SOURCE: &str = "push";

/// Default address of the push endpoint (localhost only).
pub const DEFAULT_PUSH_ADDRESS: &str = "127.0.0.1:10260";

/// Settings of a [`PushSource`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PushSourceConfig {
    /// Address to listen on (default `127.0.0.1:10260`).
    pub address: SocketAddr,
    /// File of accepted bearer tokens, one per line (blank lines and `#` comments ignored).
    pub token_file: Option<PathBuf>,
    /// PEM file of the CAs whose client certificates are accepted (needs `tls_cert_file`).
    pub client_ca_file: Option<PathBuf>,
    /// Serving certificate (PEM); with it the endpoint speaks HTTPS.
    pub tls_cert_file: Option<PathBuf>,
    /// Private key of the serving certificate (PEM).
    pub tls_key_file: Option<PathBuf>,
    /// How pushed pods are validated (default: static pods without API references).
    pub validation: ValidationOptions,
    /// Limits of the listener (the SDK's bounded acceptor: connection cap, handshake and
    /// header timeouts).
    pub acceptor: AcceptorConfig,
}

impl Default for PushSourceConfig {
    fn default() -> Self {
        Self {
            address: SocketAddr::from(([127, 0, 0, 1], 10260)),
            token_file: None,
            client_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            validation: ValidationOptions::static_pod(),
            acceptor: AcceptorConfig::default(),
        }
    }
}

impl PushSourceConfig {
    /// Set the listen address.
    pub fn address(mut self, address: SocketAddr) -> Self {
        self.address = address;
        self
    }

    /// Accept the bearer tokens listed in this file.
    pub fn token_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.token_file = Some(path.into());
        self
    }

    /// Serve HTTPS with this certificate and key.
    pub fn tls(mut self, cert_file: impl Into<PathBuf>, key_file: impl Into<PathBuf>) -> Self {
        self.tls_cert_file = Some(cert_file.into());
        self.tls_key_file = Some(key_file.into());
        self
    }

    /// Accept client certificates signed by the CAs in this file (needs [`tls`](Self::tls)).
    pub fn client_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.client_ca_file = Some(path.into());
        self
    }

    /// Allow pushed pods to reference API objects (set when the agent has an API source).
    pub fn allow_api_references(mut self, allow: bool) -> Self {
        self.validation = self.validation.allow_api_references(allow);
        self
    }
}

/// The endpoint's TLS acceptor, if it serves HTTPS.
#[cfg(feature = "tls")]
type Tls = Option<Arc<tokio_rustls::rustls::ServerConfig>>;
/// Without the `tls` feature the endpoint serves plain HTTP only.
#[cfg(not(feature = "tls"))]
type Tls = Option<NoTls>;
/// No TLS in this build (a type without values).
#[cfg(not(feature = "tls"))]
#[derive(Clone)]
enum NoTls {}

/// The push endpoint as a [`PodSource`] named `push`. Build it with [`PushSource::bind`]; it
/// serves requests while [`PodSource::run`] is polled. See the [module docs](self).
pub struct PushSource {
    node_name: String,
    config: PushSourceConfig,
    local_addr: SocketAddr,
    listener: std::sync::Mutex<Option<TcpListener>>,
    tokens: Vec<String>,
    tls: Tls,
}

impl std::fmt::Debug for PushSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PushSource")
            .field("node_name", &self.node_name)
            .field("local_addr", &self.local_addr)
            .field("tokens", &self.tokens.len())
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl PushSource {
    /// Load the credentials and bind the address. Fails without any way to authenticate
    /// ([`PodConfigError::PushNoAuthentication`]), on unreadable TLS material or token file, or
    /// when the address cannot be bound.
    pub async fn bind(
        config: PushSourceConfig,
        node_name: impl Into<String>,
    ) -> Result<Self, PodConfigError> {
        let tokens = match &config.token_file {
            Some(path) => {
                let text =
                    tokio::fs::read_to_string(path)
                        .await
                        .map_err(|e| PodConfigError::LoadTls {
                            path: path.clone(),
                            reason: format!("reading token file: {e}"),
                        })?;
                text.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .map(str::to_string)
                    .collect()
            }
            None => Vec::new(),
        };
        let tls: Tls = match (&config.tls_cert_file, &config.tls_key_file) {
            #[cfg(feature = "tls")]
            (Some(cert), Some(key)) => Some(kubelet_net::tls::server_config(
                kubelet_net::tls::ReloadingIdentity::load(cert, key)?,
                config.client_ca_file.as_deref(),
            )?),
            #[cfg(not(feature = "tls"))]
            (Some(cert), Some(_)) => {
                return Err(PodConfigError::LoadTls {
                    path: cert.clone(),
                    reason: "this build has no TLS (kubelet-podconfig's `tls` feature)".to_string(),
                });
            }
            (None, None) => None,
            (Some(path), None) | (None, Some(path)) => {
                return Err(PodConfigError::LoadTls {
                    path: path.clone(),
                    reason: "a serving certificate needs both a certificate and a key file"
                        .to_string(),
                });
            }
        };
        let client_certs = tls.is_some() && config.client_ca_file.is_some();
        if let (Some(ca), None) = (&config.client_ca_file, &tls) {
            return Err(PodConfigError::LoadTls {
                path: ca.clone(),
                reason: "client certificates need a serving certificate and key (HTTPS)"
                    .to_string(),
            });
        }
        if tokens.is_empty() && !client_certs {
            return Err(PodConfigError::PushNoAuthentication);
        }
        let listener = kubelet_net::listener::bind(config.address).map_err(|source| {
            PodConfigError::PushBind {
                addr: config.address,
                source,
            }
        })?;
        let local_addr = listener
            .local_addr()
            .map_err(|source| PodConfigError::PushBind {
                addr: config.address,
                source,
            })?;
        Ok(Self {
            node_name: node_name.into(),
            config,
            local_addr,
            listener: std::sync::Mutex::new(Some(listener)),
            tokens,
            tls,
        })
    }

    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Whether the endpoint speaks HTTPS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }
}

#[async_trait]
impl PodSource for PushSource {
    fn name(&self) -> &str {
        PUSH_SOURCE
    }

    async fn run(&self, out: SourceSender, shutdown: CancellationToken) {
        let listener = match self.listener.lock() {
            Ok(mut l) => l.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        let Some(listener) = listener else {
            tracing::error!("pod push endpoint is already running; this run serves nothing");
            shutdown.cancelled().await;
            return;
        };
        let handler = Arc::new(Handler {
            node_name: self.node_name.clone(),
            validation: self.config.validation,
            tokens: self.tokens.clone(),
            pods: AsyncMutex::new(BTreeMap::new()),
            changed: tokio::sync::Notify::new(),
            out: out.clone(),
        });
        // Nothing pushed yet: an empty snapshot marks the source as seen.
        if out.snapshot(Vec::<Pod>::new()).await.is_err() {
            return;
        }
        // Requests change the set and return; this task sends the set as it is then. While the
        // merge takes one snapshot, the requests that arrive meanwhile collect into the next,
        // so a burst of N pushes costs a few snapshots, not N snapshots of up to N pods each.
        let sending = {
            let handler = handler.clone();
            let shutdown = shutdown.clone();
            async move {
                loop {
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = handler.changed.notified() => {}
                    }
                    // Clones of the shared pods: no deep copy per snapshot.
                    let pods: Vec<Arc<Pod>> = handler.pods.lock().await.values().cloned().collect();
                    if out.snapshot(pods).await.is_err() {
                        tracing::debug!(
                            "pod config receiver closed; pushed pods are not delivered"
                        );
                        return;
                    }
                }
            }
        };
        tracing::info!(address = %self.local_addr, tls = self.tls.is_some(), "pod push endpoint listening");
        let limits = self.config.acceptor;
        let tls = self.tls.clone();
        let accepting = kubelet_net::listener::accept_loop(
            listener,
            limits,
            shutdown,
            move |tcp, admission| {
                let handler = handler.clone();
                let tls = tls.clone();
                async move {
                    let peer = match tcp.peer_addr() {
                        Ok(p) => p,
                        Err(_) => return,
                    };
                    match tls {
                        #[cfg(not(feature = "tls"))]
                        Some(never) => match never {},
                        #[cfg(feature = "tls")]
                        Some(config) => {
                            let handshake = kubelet_net::listener::tls_handshake(
                                config,
                                tcp,
                                &admission,
                                limits.handshake_timeout,
                            );
                            match handshake.await {
                                Ok(stream) => {
                                    let client_cert = stream
                                        .get_ref()
                                        .1
                                        .peer_certificates()
                                        .is_some_and(|c| !c.is_empty());
                                    serve(stream, handler, client_cert, peer, limits, admission)
                                        .await
                                }
                                Err(e) => {
                                    tracing::debug!(%peer, error = %kubelet_api::chain(&e), "pod push TLS handshake failed")
                                }
                            }
                        }
                        None => serve(tcp, handler, false, peer, limits, admission).await,
                    }
                }
            },
        );
        tokio::join!(accepting, sending);
    }
}

async fn serve<S>(
    stream: S,
    handler: Arc<Handler>,
    client_cert: bool,
    peer: SocketAddr,
    limits: AcceptorConfig,
    admission: kubelet_net::listener::Admission,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let shutdown = admission.shutdown().clone();
    let service = hyper::service::service_fn(move |req| {
        let handler = handler.clone();
        let admission = admission.clone();
        async move { Ok::<_, Infallible>(handler.handle(req, client_cert, peer, &admission).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::debug!(%peer, error = %kubelet_api::chain(&e), "pod push connection ended with an error");
            }
        }
        _ = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// `pod` marked as seen by this source now: the merge then stores the endpoint's own allocation
/// (and finds it unchanged in later snapshots by identity, without comparing it).
fn marked(mut pod: Pod) -> Pod {
    kubelet_api::mark_seen(&mut pod, PUSH_SOURCE);
    pod
}

/// The endpoint's state: pushed pods by submitted `(namespace, name)`.
struct Handler {
    node_name: String,
    validation: ValidationOptions,
    tokens: Vec<String>,
    pods: AsyncMutex<BTreeMap<(String, String), Arc<Pod>>>,
    /// Woken after each change of `pods`; the sending task delivers the set.
    changed: tokio::sync::Notify,
    /// For the merge's name index (which source holds a name).
    out: SourceSender,
}

type Resp = Response<Full<Bytes>>;

impl Handler {
    async fn handle(
        &self,
        req: Request<Incoming>,
        client_cert: bool,
        peer: SocketAddr,
        admission: &kubelet_net::listener::Admission,
    ) -> Resp {
        if let Err(resp) = self.authenticate(&req, client_cert) {
            tracing::info!(%peer, method = %req.method(), path = %req.uri().path(), status = resp.status().as_u16(), "pod push request refused");
            return *resp;
        }
        // An authenticated client's connection leaves the pending budget (see
        // `kubelet_net::listener`).
        if !admission.promote() {
            let mut resp = status_response(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                "too many connections; retry later".to_string(),
                None,
            );
            resp.headers_mut().insert(
                hyper::header::CONNECTION,
                hyper::header::HeaderValue::from_static("close"),
            );
            return resp;
        }
        let method = req.method().clone();
        let segments: Vec<String> = req
            .uri()
            .path()
            .trim_matches('/')
            .split('/')
            .map(str::to_string)
            .collect();
        let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
        let resp = match (&method, segments.as_slice()) {
            (&Method::GET, ["pods"]) => self.list().await,
            (&Method::POST, ["pods"]) => match read_pod(req).await {
                Ok(pod) => self.create(pod).await,
                Err(resp) => *resp,
            },
            (&Method::PUT, ["pods", ns, name]) => {
                let (ns, name) = (ns.to_string(), name.to_string());
                match read_pod(req).await {
                    Ok(pod) => self.replace(ns, name, pod).await,
                    Err(resp) => *resp,
                }
            }
            (&Method::DELETE, ["pods", ns, name]) => self.delete(ns, name).await,
            (_, ["pods"]) | (_, ["pods", _, _]) => status_response(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                format!(
                    "the server does not allow this method on the requested resource ({method})"
                ),
                None,
            ),
            _ => status_response(
                StatusCode::NOT_FOUND,
                "NotFound",
                "the server could not find the requested resource".to_string(),
                None,
            ),
        };
        tracing::debug!(%peer, %method, status = resp.status().as_u16(), "pod push request");
        resp
    }

    fn authenticate(&self, req: &Request<Incoming>, client_cert: bool) -> Result<(), Box<Resp>> {
        if client_cert {
            return Ok(());
        }
        let Some(value) = req.headers().get(AUTHORIZATION) else {
            let mut resp = status_response(
                StatusCode::UNAUTHORIZED,
                "Unauthorized",
                "Unauthorized".to_string(),
                None,
            );
            resp.headers_mut()
                .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return Err(Box::new(resp));
        };
        let presented = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        match presented {
            Some(token) if self.tokens.iter().any(|t| constant_time_eq(t, token)) => Ok(()),
            _ => Err(Box::new(status_response(
                StatusCode::FORBIDDEN,
                "Forbidden",
                "the presented credentials are not allowed to push pods".to_string(),
                None,
            ))),
        }
    }

    async fn list(&self) -> Resp {
        let pods = self.pods.lock().await;
        json_bytes_response(
            StatusCode::OK,
            kubelet_api::pod::list_to_json(&mut pods.values().map(|p| &**p)),
        )
    }

    async fn create(&self, pod: Pod) -> Resp {
        let key = submitted_key(&pod, None);
        let mut pods = self.pods.lock().await;
        if pods.contains_key(&key) {
            return status_response(
                StatusCode::CONFLICT,
                "AlreadyExists",
                format!("pods {:?} already exists", key.1),
                Some(details(&key.1, None)),
            );
        }
        let pod = match self.default_and_validate(pod, &key) {
            Ok(pod) => pod,
            Err(resp) => return *resp,
        };
        if let Some(resp) = self.owned_elsewhere(&pod) {
            return resp;
        }
        let pod = marked(pod);
        let body = kubelet_api::pod::to_json(&pod);
        pods.insert(key, Arc::new(pod));
        self.send();
        json_bytes_response(StatusCode::CREATED, body)
    }

    async fn replace(&self, ns: String, name: String, pod: Pod) -> Resp {
        let body_name = pod.metadata.name.clone().unwrap_or_default();
        let body_ns = pod.metadata.namespace.clone();
        if (!body_name.is_empty() && body_name != name)
            || body_ns.as_deref().is_some_and(|b| !b.is_empty() && b != ns)
        {
            return status_response(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                format!(
                    "the name or namespace of the object ({}/{body_name}) does not match the URL ({ns}/{name})",
                    body_ns.as_deref().unwrap_or("default"),
                ),
                None,
            );
        }
        let mut pod = pod;
        pod.metadata.name = Some(name.clone());
        pod.metadata.namespace = Some(ns.clone());
        let key = (ns, name);
        let pod = match self.default_and_validate(pod, &key) {
            Ok(pod) => pod,
            Err(resp) => return *resp,
        };
        if let Some(resp) = self.owned_elsewhere(&pod) {
            return resp;
        }
        let mut pods = self.pods.lock().await;
        let pod = marked(pod);
        let body = kubelet_api::pod::to_json(&pod);
        let created = pods.insert(key, Arc::new(pod)).is_none();
        self.send();
        let code = if created {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        };
        json_bytes_response(code, body)
    }

    async fn delete(&self, ns: &str, name: &str) -> Resp {
        let mut pods = self.pods.lock().await;
        if pods.remove(&(ns.to_string(), name.to_string())).is_none() {
            return status_response(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("pods {name:?} not found"),
                Some(details(name, None)),
            );
        }
        self.send();
        let status = Status {
            status: Some("Success".to_string()),
            code: Some(200),
            details: Some(details(name, None)),
            ..Default::default()
        };
        json_response(StatusCode::OK, &status_json(&status))
    }

    /// 409 when another source (a manifest file, the URL, the API server) already holds a pod
    /// of this name: the merge would keep both names apart by UID, and a clash is refused here
    /// with a reason instead.
    fn owned_elsewhere(&self, pod: &Pod) -> Option<Resp> {
        let owner = self.out.other_owner(&kubelet_api::pod::full_name(pod))?;
        let name = kubelet_api::pod::name(pod);
        Some(status_response(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!(
                "pod {name:?} in namespace {:?} is already defined by the {owner:?} source; pushed pods may not reuse its name",
                kubelet_api::pod::namespace(pod)
            ),
            Some(details(name, None)),
        ))
    }

    fn default_and_validate(&self, mut pod: Pod, key: &(String, String)) -> Result<Pod, Box<Resp>> {
        let origin = format!("{}/{}", key.0, key.1);
        match manifest::apply_defaults_with(
            &mut pod,
            ManifestOrigin::Push(&origin),
            &self.node_name,
            &self.validation,
        ) {
            Ok(()) => Ok(pod),
            Err(PodConfigError::InvalidPod { reasons, .. }) => {
                Err(Box::new(invalid_response(&key.1, &reasons)))
            }
            Err(e) => Err(Box::new(status_response(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                kubelet_api::chain(&e).to_string(),
                None,
            ))),
        }
    }

    /// The set changed: the sending task delivers it (with any changes made meanwhile).
    fn send(&self) {
        self.changed.notify_one();
    }
}

/// The submitted `(namespace, name)` of a pod (namespace `default` when unset).
fn submitted_key(pod: &Pod, ns: Option<&str>) -> (String, String) {
    let namespace = ns
        .map(str::to_string)
        .or_else(|| pod.metadata.namespace.clone().filter(|n| !n.is_empty()))
        .unwrap_or_else(|| "default".to_string());
    (namespace, pod.metadata.name.clone().unwrap_or_default())
}

/// How long a request body may take to arrive.
const BODY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Read and decode the body of a request as one Pod.
async fn read_pod(req: Request<Incoming>) -> Result<Pod, Box<Resp>> {
    if let Some(ct) = req.headers().get(CONTENT_TYPE) {
        let ct = ct.to_str().unwrap_or_default();
        let mime = ct.split(';').next().unwrap_or_default().trim();
        if !matches!(
            mime,
            "application/json" | "application/yaml" | "application/x-yaml" | "text/yaml" | ""
        ) {
            return Err(Box::new(status_response(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "UnsupportedMediaType",
                format!(
                    "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml (got {mime:?})"
                ),
                None,
            )));
        }
    }
    // A body announced larger than the limit is refused before any of it is read.
    let announced = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(len) = announced
        && len > MAX_MANIFEST_SIZE
    {
        return Err(Box::new(status_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            "RequestEntityTooLarge",
            format!(
                "request entity too large: {len} bytes announced, the limit is {MAX_MANIFEST_SIZE} bytes"
            ),
            None,
        )));
    }
    let collected = tokio::time::timeout(
        BODY_READ_TIMEOUT,
        Limited::new(req.into_body(), MAX_MANIFEST_SIZE as usize).collect(),
    )
    .await
    .map_err(|_| {
        Box::new(status_response(
            StatusCode::REQUEST_TIMEOUT,
            "Timeout",
            format!(
                "the request body did not arrive within {}s",
                BODY_READ_TIMEOUT.as_secs()
            ),
            None,
        ))
    })?;
    let body = collected
        .map_err(|e| {
            Box::new(if e.is::<http_body_util::LengthLimitError>() {
                status_response(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "RequestEntityTooLarge",
                    format!("request entity too large: limit is {MAX_MANIFEST_SIZE} bytes"),
                    None,
                )
            } else {
                status_response(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    format!("reading the request body: {e}"),
                    None,
                )
            })
        })?
        .to_bytes();
    manifest::decode_pod(std::path::Path::new("request body"), &body).map_err(|e| {
        Box::new(status_response(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            kubelet_api::chain(&e).to_string(),
            None,
        ))
    })
}

fn details(name: &str, causes: Option<Vec<StatusCause>>) -> StatusDetails {
    StatusDetails {
        name: Some(name.to_string()),
        kind: Some("pods".to_string()),
        causes,
        ..Default::default()
    }
}

/// The API server's 422 for a pod that fails validation.
fn invalid_response(name: &str, reasons: &[String]) -> Resp {
    let causes = reasons.iter().map(|r| field_cause(r)).collect();
    let status = Status {
        status: Some("Failure".to_string()),
        message: Some(format!("Pod {name:?} is invalid: [{}]", reasons.join(", "))),
        reason: Some("Invalid".to_string()),
        details: Some(StatusDetails {
            kind: Some("Pod".to_string()),
            ..details(name, Some(causes))
        }),
        code: Some(422),
        ..Default::default()
    };
    json_response(StatusCode::UNPROCESSABLE_ENTITY, &status_json(&status))
}

/// Split `field: Kind: detail` into a `StatusCause` with the API server's cause reasons.
pub fn field_cause(reason: &str) -> StatusCause {
    const KINDS: [(&str, &str); 7] = [
        ("Required value", "FieldValueRequired"),
        ("Invalid value", "FieldValueInvalid"),
        ("Duplicate value", "FieldValueDuplicate"),
        ("Not found", "FieldValueNotFound"),
        ("Forbidden", "FieldValueForbidden"),
        ("Unsupported value", "FieldValueNotSupported"),
        ("Too long", "FieldValueTooLong"),
    ];
    if let Some((field, rest)) = reason.split_once(": ") {
        for (text, cause) in KINDS {
            if rest.starts_with(text) {
                return StatusCause {
                    field: Some(field.to_string()),
                    message: Some(rest.to_string()),
                    reason: Some(cause.to_string()),
                };
            }
        }
    }
    StatusCause {
        field: None,
        message: Some(reason.to_string()),
        reason: Some("FieldValueInvalid".to_string()),
    }
}

/// A `Status` as JSON with its `kind` and `apiVersion`.
fn status_json(status: &Status) -> serde_json::Value {
    let mut v = serde_json::to_value(status).unwrap_or_else(|_| serde_json::json!({}));
    if let Some(obj) = v.as_object_mut() {
        obj.insert("kind".into(), "Status".into());
        obj.insert("apiVersion".into(), "v1".into());
        obj.entry("metadata")
            .or_insert_with(|| serde_json::json!({}));
    }
    v
}

fn status_response(
    code: StatusCode,
    reason: &str,
    message: String,
    details: Option<StatusDetails>,
) -> Resp {
    let status = Status {
        status: Some("Failure".to_string()),
        message: Some(message),
        reason: Some(reason.to_string()),
        details,
        code: Some(i32::from(code.as_u16())),
        ..Default::default()
    };
    json_response(code, &status_json(&status))
}

fn json_response(code: StatusCode, body: &serde_json::Value) -> Resp {
    json_bytes_response(code, serde_json::to_vec(body).unwrap_or_default())
}

/// A response of JSON text (pods are encoded by `kubelet_api::pod`).
fn json_bytes_response(code: StatusCode, bytes: Vec<u8>) -> Resp {
    let mut resp = Response::new(Full::new(Bytes::from(bytes)));
    *resp.status_mut() = code;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// Compare without an early exit on the first differing byte.
fn constant_time_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_errors_become_status_causes() {
        let c = field_cause("spec.containers[0].image: Required value");
        assert_eq!(c.field.as_deref(), Some("spec.containers[0].image"));
        assert_eq!(c.reason.as_deref(), Some("FieldValueRequired"));
        assert_eq!(c.message.as_deref(), Some("Required value"));
        let c = field_cause("spec.volumes[1].name: Duplicate value: \"data\"");
        assert_eq!(c.reason.as_deref(), Some("FieldValueDuplicate"));
        let c = field_cause("static pods may not reference secrets");
        assert_eq!(c.field, None);
    }

    #[test]
    fn tokens_compare_exactly() {
        assert!(constant_time_eq("abc", "abc"));
        assert!(!constant_time_eq("abc", "abd"));
        assert!(!constant_time_eq("abc", "abcd"));
    }

    #[tokio::test]
    async fn an_endpoint_without_credentials_is_refused() {
        let config = PushSourceConfig::default().address(SocketAddr::from(([127, 0, 0, 1], 0)));
        assert!(matches!(
            PushSource::bind(config, "n").await,
            Err(PodConfigError::PushNoAuthentication)
        ));
    }
}
