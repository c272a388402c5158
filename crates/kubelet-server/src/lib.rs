//! `kubelet-server`: the kubelet's HTTP API for an SDK agent, as an agent plugin
//! ([`kubelet_api::AgentPlugin`]).
//!
//! Three listeners, as the kubelet's (`pkg/kubelet/server`):
//!
//! * the **kubelet API** (`port`, default 10250 on `address` 0.0.0.0; `enableServer`) over
//!   HTTPS: every request is authenticated (x509 client certificates against `clientCAFile`,
//!   bearer tokens through a [`TokenAuthenticator`], anonymous when allowed) and authorized (an
//!   [`Authorizer`]: `AlwaysAllow` or a webhook such as the API server's
//!   `SubjectAccessReview`), see [`auth`]. It serves `/healthz` (`/healthz/ping`, `/log`,
//!   `/syncloop`), `/pods`, `/metrics`, `/metrics/probes`, `/configz`, and with
//!   `enableDebuggingHandlers` (default true) `/containerLogs/{ns}/{pod}/{container}` (see
//!   [`logs`]), `/runningpods/`, `/logs/` (the node's `/var/log`, `enableSystemLogHandler`),
//!   and the streaming endpoints `/exec`, `/attach`, `/portForward` and `/run`: `kubectl
//!   exec`, `cp`, `attach` and `port-forward` over SPDY/3.1 ([`spdy`]) or WebSocket, served from
//!   the runtime's [`StreamingRuntime`](kubelet_api::StreamingRuntime) or proxied to a CRI
//!   runtime's streaming server;
//! * the **read-only port** (`readOnlyPort`, off by default): the same `/healthz`, `/pods`,
//!   `/metrics` without TLS or authentication; the debugging paths answer 405;
//! * the **healthz port** (`healthzPort`, default 10248 on 127.0.0.1): `/healthz`.
//!
//! The serving certificate is `tlsCertFile`/`tlsPrivateKeyFile`, else a self-signed pair
//! generated once into the certificate directory (see [`tls`]). Every listener goes through a
//! bounded acceptor (see [`listener`]). Listeners are bound by [`KubeletServer::bind`], so a
//! port in use or a bad certificate is an error before the agent starts; the plugin serves
//! them until the agent's shutdown.
//!
//! Port 0 turns a listener off (the kubelet rejects `port: 0`; `enableServer: false` is the
//! kubelet's way, and works too).
//!
//! The kubelet API (TLS, authentication, the debugging handlers and streaming) is the crate's
//! `https` feature, on by default. Without it (`default-features = false`) the crate serves the
//! read-only and healthz ports only, a much smaller build for agents that do not need `kubectl
//! logs` or `exec`; a configured `port` is then skipped with a warning.
//!
//! An embedder with its own authentication (an mTLS-only edge node, no API server):
//!
//! ```no_run
//! use std::sync::Arc;
//! use kubelet_core::configuration::KubeletConfiguration;
//! use kubelet_server::{KubeletServer, ServerConfig, auth::AlwaysAllow};
//!
//! # async fn demo(builder: kubelet_core::KubeletBuilder) -> Result<(), Box<dyn std::error::Error>> {
//! let mut c = KubeletConfiguration::default();
//! c.authentication.x509.client_ca_file = "/etc/node/clients-ca.pem".into();
//! c.authentication.webhook.enabled = false;
//! c.authorization.mode = "AlwaysAllow".into();
//! let server = KubeletServer::bind(ServerConfig::from_configuration(&c)).await?
//!     .with_authorizer(Arc::new(AlwaysAllow));
//! let kubelet = builder.plugin(Arc::new(server)).build()?;
//! # let _ = kubelet; Ok(()) }
//! ```
//!
//! With an API server, `kubelet-apiserver` provides the `TokenReview` authenticator and the
//! `SubjectAccessReview` authorizer (the facade crate wires them from the configuration).
#![forbid(unsafe_code)]

pub mod auth;
pub mod logs;
#[cfg(feature = "https")]
mod proxy;
mod routes;
#[cfg(feature = "https")]
pub mod spdy;
mod stats;
#[cfg(feature = "https")]
mod streaming;
#[cfg(feature = "https")]
pub mod tls;
#[cfg(feature = "https")]
mod websocket;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use kubelet_api::{AgentPlugin, PluginContext};
use kubelet_core::configuration::KubeletConfiguration;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use auth::{
    AlwaysAllow, AlwaysDeny, Attributes, AuthError, Authorizer, Decision, TokenAuthenticator,
    UserInfo,
};
use kubelet_net::listener::{self, AcceptorConfig};
pub use routes::Body;

/// The TLS settings of the kubelet API port.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlsSettings {
    /// `tlsCertFile`; empty for the self-signed pair in [`cert_dir`](Self::cert_dir).
    pub cert_file: PathBuf,
    /// `tlsPrivateKeyFile`.
    pub key_file: PathBuf,
    /// `--cert-dir`: where the self-signed pair is kept.
    pub cert_dir: PathBuf,
    /// The host name the self-signed certificate is issued for (`--hostname-override` or the
    /// machine's host name, lower-cased).
    pub hostname: String,
    /// Node addresses added to the self-signed certificate's SANs.
    pub addresses: Vec<IpAddr>,
    /// `tlsMinVersion`.
    pub min_version: String,
    /// `tlsCipherSuites`.
    pub cipher_suites: Vec<String>,
    /// `authentication.x509.clientCAFile`; empty for no client certificates.
    pub client_ca_file: PathBuf,
}

/// Errors of the server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// An address and port do not form a socket address.
    #[error("invalid listen address {address:?} (port {port})")]
    InvalidAddress {
        /// The address as configured.
        address: String,
        /// The port.
        port: u16,
    },
    /// Binding a listener failed (port in use, no permission). The message names the
    /// configuration fields that choose the address, so the fix is in the message.
    #[error("binding {addr} (set by `{fields}`; 0 turns the port off)")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The `KubeletConfiguration` fields that set this address: `port` and `address`,
        /// `readOnlyPort` and `address`, or `healthzPort` and `healthzBindAddress`.
        fields: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The TLS settings or files are not usable.
    #[error("TLS: {0}")]
    Tls(String),
}

/// `authorization.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AuthorizationMode {
    /// Every authenticated request is allowed.
    AlwaysAllow,
    /// Each request is checked by the [`Authorizer`] given with
    /// [`KubeletServer::with_authorizer`] (the API server's `SubjectAccessReview`), its
    /// decisions cached.
    Webhook,
}

/// The server's settings; [`from_configuration`](Self::from_configuration) reads them from the
/// kubelet's configuration.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ServerConfig {
    /// `address` (`0.0.0.0`): the kubelet API's and the read-only port's address.
    pub address: String,
    /// `port` (10250; 0 or `enableServer: false` = off).
    pub port: u16,
    /// `readOnlyPort` (0 = off).
    pub read_only_port: u16,
    /// `healthzBindAddress` (`127.0.0.1`).
    pub healthz_bind_address: String,
    /// `healthzPort` (10248; 0 = off).
    pub healthz_port: u16,
    /// TLS of the kubelet API.
    pub tls: TlsSettings,
    /// `authentication.anonymous.enabled`.
    pub anonymous: bool,
    /// `authentication.webhook.enabled`: bearer tokens are checked by the
    /// [`TokenAuthenticator`] given with [`KubeletServer::with_token_authenticator`].
    pub token_webhook: bool,
    /// `authentication.webhook.cacheTTL` (2 m).
    pub token_cache_ttl: Duration,
    /// `authorization.mode`.
    pub authorization_mode: AuthorizationMode,
    /// `authorization.webhook.cacheAuthorizedTTL` (5 m).
    pub authorized_ttl: Duration,
    /// `authorization.webhook.cacheUnauthorizedTTL` (30 s).
    pub unauthorized_ttl: Duration,
    /// Gate `KubeletFineGrainedAuthz` (on): `/pods`, `/healthz`, `/configz` are checked
    /// against their own subresource before `proxy`.
    pub fine_grained_authz: bool,
    /// `enableDebuggingHandlers` (true).
    pub enable_debugging_handlers: bool,
    /// `enableSystemLogHandler` (true).
    pub enable_system_log_handler: bool,
    /// The directory `/logs/` serves (`/var/log`).
    pub system_log_dir: PathBuf,
    /// `syncFrequency`: the sync loop health threshold is max(2 × this, 5 min).
    pub sync_frequency: Duration,
    /// What `/configz` shows (the effective configuration); `None` for a 404.
    pub configz: Option<serde_json::Value>,
    /// `streamingConnectionIdleTimeout` (4 h): an exec, attach or port-forward connection
    /// without traffic for this long is closed.
    pub streaming_connection_idle_timeout: Duration,
    /// Limits of every listener.
    pub acceptor: AcceptorConfig,
    /// Most exec, attach and port-forward sessions open at once (upgraded connections leave
    /// the acceptor's count): beyond it a streaming request gets 503. Default: a sixteenth of
    /// the open-file limit, 16 to 1,024.
    pub max_streaming_sessions: usize,
    /// Most forwarded connections one port-forward session may have open (SPDY stream pairs);
    /// beyond it a new pair gets an error on its error stream. Default 128.
    pub max_forwarded_per_session: usize,
    /// Most forwarded connections of all port-forward sessions together (each holds a
    /// descriptor to the pod). Default: an eighth of the open-file limit, 64 to 4,096.
    pub max_forwarded_connections: usize,
}

/// The default cap on streaming sessions: a sixteenth of `open_files` (16 to 1,024).
pub fn default_max_streaming_sessions(open_files: Option<u64>) -> usize {
    open_files.map_or(1024, |l| (l / 16).clamp(16, 1024) as usize)
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self::from_configuration(&KubeletConfiguration::default())
    }
}

/// The machine's host name, lower-cased (the kubelet's `nodeutil.GetHostname`).
fn os_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_lowercase())
        .unwrap_or_else(|_| "localhost".to_string())
}

impl ServerConfig {
    /// The server settings of the kubelet's configuration. The certificate directory is
    /// `/var/lib/kubelet/pki` (`--cert-dir`); set [`cert_dir`](Self::cert_dir) for another
    /// root directory.
    pub fn from_configuration(c: &KubeletConfiguration) -> Self {
        let mode = if c.authorization.mode == "AlwaysAllow" {
            AuthorizationMode::AlwaysAllow
        } else {
            AuthorizationMode::Webhook
        };
        Self {
            address: c.address.clone(),
            port: if c.enable_server { c.port } else { 0 },
            read_only_port: c.read_only_port,
            healthz_bind_address: c.healthz_bind_address.clone(),
            healthz_port: c.healthz_port,
            tls: TlsSettings {
                cert_file: c.tls_cert_file.clone().into(),
                key_file: c.tls_private_key_file.clone().into(),
                cert_dir: PathBuf::from("/var/lib/kubelet/pki"),
                hostname: os_hostname(),
                addresses: Vec::new(),
                min_version: c.tls_min_version.clone(),
                cipher_suites: c.tls_cipher_suites.clone(),
                client_ca_file: c.authentication.x509.client_ca_file.clone().into(),
            },
            anonymous: c.authentication.anonymous.enabled,
            token_webhook: c.authentication.webhook.enabled,
            token_cache_ttl: c.authentication.webhook.cache_ttl.as_duration(),
            authorization_mode: mode,
            authorized_ttl: c.authorization.webhook.cache_authorized_ttl.as_duration(),
            unauthorized_ttl: c.authorization.webhook.cache_unauthorized_ttl.as_duration(),
            fine_grained_authz: c.feature_gate("KubeletFineGrainedAuthz"),
            enable_debugging_handlers: c.enable_debugging_handlers,
            enable_system_log_handler: c.enable_system_log_handler,
            system_log_dir: PathBuf::from("/var/log"),
            sync_frequency: c.sync_frequency.as_duration(),
            configz: serde_json::to_value(c).ok(),
            streaming_connection_idle_timeout: c.streaming_connection_idle_timeout.as_duration(),
            acceptor: AcceptorConfig::default(),
            max_streaming_sessions: default_max_streaming_sessions(listener::open_files_limit()),
            max_forwarded_per_session: 128,
            max_forwarded_connections: listener::open_files_limit()
                .map_or(4096, |l| (l / 8).clamp(64, 4096) as usize),
        }
    }

    /// Sets [`port`](Self::port).
    pub fn port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    /// Sets [`read_only_port`](Self::read_only_port).
    pub fn read_only_port(mut self, port: u16) -> Self {
        self.read_only_port = port;
        self
    }

    /// Sets [`healthz_port`](Self::healthz_port).
    pub fn healthz_port(mut self, port: u16) -> Self {
        self.healthz_port = port;
        self
    }

    /// Sets the certificate directory (`--cert-dir`).
    pub fn cert_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.tls.cert_dir = dir.into();
        self
    }

    /// Sets the host name of the self-signed certificate (`--hostname-override`).
    pub fn hostname(mut self, hostname: impl Into<String>) -> Self {
        self.tls.hostname = hostname.into();
        self
    }

    /// Adds node addresses to the self-signed certificate's SANs.
    pub fn addresses(mut self, addresses: impl IntoIterator<Item = IpAddr>) -> Self {
        self.tls.addresses.extend(addresses);
        self
    }

    /// Sets the directory `/logs/` serves.
    pub fn system_log_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.system_log_dir = dir.into();
        self
    }
}

/// A bound listener and what it serves.
struct Bound {
    listener: TcpListener,
    port: routes::Port,
}

/// The server plugin (`server`): bound listeners, served while the agent runs.
pub struct KubeletServer {
    config: ServerConfig,
    listeners: Mutex<Vec<Bound>>,
    addrs: Vec<(SocketAddr, routes::Port)>,
    #[cfg(feature = "https")]
    tls: Option<Arc<rustls::ServerConfig>>,
    tokens: Option<Arc<dyn TokenAuthenticator>>,
    authorizer: Option<Arc<dyn Authorizer>>,
}

impl std::fmt::Debug for KubeletServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeletServer")
            .field("addrs", &self.addrs)
            .finish_non_exhaustive()
    }
}

fn socket_addr(address: &str, port: u16) -> Result<SocketAddr, ServerError> {
    let ip: IpAddr = address
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .map_err(|_| ServerError::InvalidAddress {
            address: address.to_string(),
            port,
        })?;
    Ok(SocketAddr::new(ip, port))
}

impl KubeletServer {
    /// Prepare TLS (reading or generating the serving certificate) and bind the configured
    /// ports (those not 0).
    ///
    /// Without the `https` feature the kubelet API is not served: a `port` other than 0 is
    /// skipped with a warning.
    pub async fn bind(config: ServerConfig) -> Result<Self, ServerError> {
        #[cfg(feature = "https")]
        let tls = if config.port != 0 {
            let settings = config.tls.clone();
            let built = tokio::task::spawn_blocking(move || tls::server_config(&settings))
                .await
                .map_err(|e| ServerError::Tls(e.to_string()))??;
            Some(built)
        } else {
            None
        };
        #[cfg(not(feature = "https"))]
        if config.port != 0 {
            tracing::warn!(
                port = config.port,
                "the kubelet API is not served: this build has no HTTPS (kubelet-server's `https` feature); the read-only and healthz ports are"
            );
        }
        let mut listeners = Vec::new();
        let mut addrs = Vec::new();
        for (address, port, kind, fields) in [
            (
                &config.address,
                config.port,
                routes::Port::Main,
                "port, address",
            ),
            (
                &config.address,
                config.read_only_port,
                routes::Port::ReadOnly,
                "readOnlyPort, address",
            ),
            (
                &config.healthz_bind_address,
                config.healthz_port,
                routes::Port::Healthz,
                "healthzPort, healthzBindAddress",
            ),
        ] {
            if port == 0 || (kind == routes::Port::Main && !cfg!(feature = "https")) {
                continue;
            }
            let addr = socket_addr(address, port)?;
            let listener = listener::bind(addr).map_err(|source| ServerError::Bind {
                addr,
                fields,
                source,
            })?;
            let bound = listener.local_addr().unwrap_or(addr);
            addrs.push((bound, kind));
            listeners.push(Bound {
                listener,
                port: kind,
            });
        }
        Ok(Self {
            config,
            listeners: Mutex::new(listeners),
            addrs,
            #[cfg(feature = "https")]
            tls,
            tokens: None,
            authorizer: None,
        })
    }

    /// Check bearer tokens with `authenticator` (when `authentication.webhook.enabled`); its
    /// answers are cached for `cacheTTL`.
    pub fn with_token_authenticator(mut self, authenticator: Arc<dyn TokenAuthenticator>) -> Self {
        self.tokens = Some(authenticator);
        self
    }

    /// Authorize requests with `authorizer` (`authorization.mode: Webhook`); its decisions are
    /// cached for the configured TTLs. Without one, a `Webhook` server denies every request
    /// (403) and says why in its log.
    pub fn with_authorizer(mut self, authorizer: Arc<dyn Authorizer>) -> Self {
        self.authorizer = Some(authorizer);
        self
    }

    /// The bound kubelet API address, if any.
    pub fn addr(&self) -> Option<SocketAddr> {
        self.find(routes::Port::Main)
    }

    /// The bound read-only port's address, if any.
    pub fn read_only_addr(&self) -> Option<SocketAddr> {
        self.find(routes::Port::ReadOnly)
    }

    /// The bound healthz port's address, if any.
    pub fn healthz_addr(&self) -> Option<SocketAddr> {
        self.find(routes::Port::Healthz)
    }

    fn find(&self, port: routes::Port) -> Option<SocketAddr> {
        self.addrs.iter().find(|(_, p)| *p == port).map(|(a, _)| *a)
    }

    fn security(&self) -> Security {
        let c = &self.config;
        // Whether the kubelet API is served (warnings about its authentication only then).
        let serves_api = c.port != 0 && cfg!(feature = "https");
        let tokens = match (&self.tokens, c.token_webhook) {
            (Some(t), true) => Some(Arc::new(auth::CachedTokenAuthenticator::new(
                t.clone(),
                c.token_cache_ttl,
            )) as Arc<dyn TokenAuthenticator>),
            (None, true) if serves_api => {
                tracing::warn!(
                    "token authentication (authentication.webhook.enabled) needs an API server; bearer tokens will be rejected"
                );
                None
            }
            _ => None,
        };
        let authorizer: Arc<dyn Authorizer> = match (c.authorization_mode, &self.authorizer) {
            (AuthorizationMode::AlwaysAllow, _) => Arc::new(AlwaysAllow),
            (AuthorizationMode::Webhook, Some(a)) => Arc::new(auth::CachedAuthorizer::new(
                a.clone(),
                c.authorized_ttl,
                c.unauthorized_ttl,
            )),
            (AuthorizationMode::Webhook, None) => {
                if serves_api {
                    tracing::warn!(
                        "authorization mode Webhook needs an API server; every request to the kubelet API will be denied (set authorization.mode AlwaysAllow with client certificates for a node without one)"
                    );
                }
                Arc::new(AlwaysDeny(
                    "authorization mode Webhook without an API server".to_string(),
                ))
            }
        };
        Security {
            tokens,
            token_webhook: c.token_webhook,
            anonymous: c.anonymous,
            authorizer,
            fine_grained: c.fine_grained_authz,
        }
    }
}

/// How the kubelet API authenticates and authorizes.
struct Security {
    tokens: Option<Arc<dyn TokenAuthenticator>>,
    token_webhook: bool,
    anonymous: bool,
    authorizer: Arc<dyn Authorizer>,
    fine_grained: bool,
}

struct Shared {
    ctx: routes::Context,
    security: Security,
    node_name: String,
    acceptor: AcceptorConfig,
}

#[async_trait]
impl AgentPlugin for KubeletServer {
    fn name(&self) -> &str {
        "server"
    }

    async fn run(
        &self,
        ctx: PluginContext,
        shutdown: CancellationToken,
    ) -> kubelet_api::Result<()> {
        let listeners = std::mem::take(&mut *self.listeners.lock());
        let shared = Arc::new(Shared {
            ctx: routes::Context {
                handle: ctx.handle(),
                runtime: ctx.runtime(),
                stats: ctx.service::<dyn kubelet_api::stats::StatsService>(),
                debugging: self.config.enable_debugging_handlers,
                system_logs: self.config.enable_system_log_handler,
                system_log_dir: self.config.system_log_dir.clone(),
                configz: self.config.configz.clone(),
                sync_loop_threshold: (self.config.sync_frequency * 2)
                    .max(routes::MIN_SYNC_LOOP_THRESHOLD),
                #[cfg(feature = "https")]
                streaming_idle_timeout: self.config.streaming_connection_idle_timeout,
                #[cfg(feature = "https")]
                streaming_sessions: Arc::new(tokio::sync::Semaphore::new(
                    self.config.max_streaming_sessions.max(1),
                )),
                #[cfg(feature = "https")]
                max_forwarded_per_session: self.config.max_forwarded_per_session.max(1),
                #[cfg(feature = "https")]
                forwarded_connections: Arc::new(tokio::sync::Semaphore::new(
                    self.config.max_forwarded_connections.max(1),
                )),
            },
            security: self.security(),
            node_name: ctx.node_name().to_string(),
            acceptor: self.config.acceptor,
        });
        let mut serving = tokio::task::JoinSet::new();
        for b in listeners {
            #[cfg(feature = "https")]
            let tls = match b.port {
                routes::Port::Main => self.tls.clone(),
                _ => None,
            };
            #[cfg(not(feature = "https"))]
            let tls: Tls = None;
            tracing::info!(addr = %b.listener.local_addr().map(|a| a.to_string()).unwrap_or_default(), port = ?b.port, "serving");
            serving.spawn(serve_listener(
                b.listener,
                b.port,
                tls,
                shared.clone(),
                shutdown.clone(),
            ));
        }
        while serving.join_next().await.is_some() {}
        Ok(())
    }
}

/// The TLS of a listener: the kubelet API's configuration, none for the other ports.
#[cfg(feature = "https")]
type Tls = Option<Arc<rustls::ServerConfig>>;
/// Without the `https` feature no listener has TLS.
#[cfg(not(feature = "https"))]
type Tls = Option<NoTls>;
/// No TLS in this build (a type without values).
#[cfg(not(feature = "https"))]
#[derive(Clone)]
enum NoTls {}

async fn serve_listener(
    listener: TcpListener,
    port: routes::Port,
    tls: Tls,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
) {
    let acceptor = shared.acceptor;
    listener::accept_loop(listener, acceptor, shutdown, move |stream, admission| {
        let shared = shared.clone();
        let tls = tls.clone();
        async move {
            let _ = stream.set_nodelay(true);
            match tls {
                #[cfg(not(feature = "https"))]
                Some(never) => match never {},
                #[cfg(feature = "https")]
                Some(tls) => {
                    let handshake = listener::tls_handshake(
                        tls,
                        stream,
                        &admission,
                        acceptor.handshake_timeout,
                    );
                    let stream = match handshake.await {
                        Ok(s) => s,
                        Err(e) => {
                            tracing::debug!(error = %kubelet_api::chain(&e), "TLS handshake failed");
                            return;
                        }
                    };
                    let peer = stream
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .and_then(|c| tls::certificate_user(c));
                    serve_connection(stream, port, peer, shared, admission).await;
                }
                None => serve_connection(stream, port, None, shared, admission).await,
            }
        }
    })
    .await;
}

async fn serve_connection<S>(
    io: S,
    port: routes::Port,
    peer: Option<UserInfo>,
    shared: Arc<Shared>,
    admission: listener::Admission,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let header_timeout = shared.acceptor.header_read_timeout;
    let stop = admission.shutdown().clone();
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let shared = shared.clone();
        let peer = peer.clone();
        let admission = admission.clone();
        async move {
            Ok::<_, std::convert::Infallible>(handle(&shared, port, peer, &admission, req).await)
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .max_buf_size(1024 * 1024)
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::debug!(error = %kubelet_api::chain(&e), "HTTP connection ended with an error");
            }
        }
        _ = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// Authenticate (kubelet API only), authorize, promote the connection (see
/// [`listener`]'s admission: on the kubelet API only an authorized request promotes it), then
/// route.
async fn handle(
    shared: &Shared,
    port: routes::Port,
    peer: Option<UserInfo>,
    admission: &listener::Admission,
    req: Request<Incoming>,
) -> Response<Body> {
    if port == routes::Port::Main {
        let user = match authenticate(&shared.security, peer, &req).await {
            Some(u) => u,
            None => return routes::plain(StatusCode::UNAUTHORIZED, "Unauthorized\n"),
        };
        let attrs = auth::request_attributes(
            &user,
            req.method(),
            req.uri().path(),
            &shared.node_name,
            shared.security.fine_grained,
        );
        match auth::authorize_all(shared.security.authorizer.as_ref(), &attrs).await {
            auth::Verdict::Allowed => {}
            auth::Verdict::Forbidden(body) => {
                return routes::plain(StatusCode::FORBIDDEN, body);
            }
            auth::Verdict::Error(body) => {
                return routes::plain(StatusCode::INTERNAL_SERVER_ERROR, body);
            }
        }
    }
    if !admission.promote() {
        let mut r = routes::plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many connections; retry later\n",
        );
        r.headers_mut().insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
        r.headers_mut().insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_static("1"),
        );
        return r;
    }
    #[cfg(feature = "https")]
    if port == routes::Port::Main
        && shared.ctx.debugging
        && let Some(kind) = streaming::Kind::of(req.uri().path())
    {
        return streaming::handle(&shared.ctx, kind, req).await;
    }
    routes::route(&shared.ctx, port, &req).await
}

/// The request's user: a verified client certificate, else a bearer token, else anonymous
/// (when allowed); `None` for 401.
async fn authenticate<B>(
    security: &Security,
    peer: Option<UserInfo>,
    req: &Request<B>,
) -> Option<UserInfo> {
    let with_authenticated = |mut u: UserInfo| {
        if !u.groups.iter().any(|g| g == "system:authenticated") {
            u.groups.push("system:authenticated".to_string());
        }
        u
    };
    if let Some(user) = peer {
        return Some(with_authenticated(user));
    }
    let bearer = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.split_once(' ')?;
            scheme
                .eq_ignore_ascii_case("bearer")
                .then(|| token.trim().to_string())
        })
        .filter(|t| !t.is_empty());
    if let Some(token) = bearer {
        if !security.token_webhook {
            return if security.anonymous {
                Some(UserInfo::anonymous())
            } else {
                None
            };
        }
        let tokens = security.tokens.as_ref()?;
        return match tokens.authenticate_token(&token).await {
            Ok(Some(user)) => Some(with_authenticated(user)),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(error = %kubelet_api::chain(&e), "checking a bearer token failed");
                None
            }
        };
    }
    security.anonymous.then(UserInfo::anonymous)
}
