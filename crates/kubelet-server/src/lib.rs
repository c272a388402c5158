//! `kubelet-server`: the kubelet's HTTP endpoints for an SDK agent, as an
//! `AgentPlugin` ([`kubelet_core::AgentPlugin`]).
//!
//! Today it serves the two unauthenticated ports of the kubelet:
//!
//! * the **healthz port** (`healthzPort`, default 10248 on `healthzBindAddress` 127.0.0.1):
//!   `GET /healthz` (`ok`, or 500 with the PLEG's health message);
//! * the **read-only port** (`readOnlyPort`, off by default as in the kubelet, on `address`):
//!   `GET /healthz`, `GET /pods` (the agent's pods with their statuses, a `PodList`) and
//!   `GET /metrics` (every metric the agent registered, OpenMetrics text).
//!
//! Listeners are bound by [`KubeletServer::bind`], so a port in use is an error before the agent
//! starts; the plugin's loop serves them with the agent's handle and metrics until shutdown.
//!
//! ```no_run
//! use std::sync::Arc;
//! use kubelet_server::{KubeletServer, ServerConfig};
//!
//! # async fn demo(builder: kubelet_core::KubeletBuilder) -> Result<(), Box<dyn std::error::Error>> {
//! let server = KubeletServer::bind(ServerConfig::default().read_only_port(10255)).await?;
//! let kubelet = builder.plugin(Arc::new(server)).build()?;
//! # let _ = kubelet; Ok(()) }
//! ```
#![forbid(unsafe_code)]

use std::convert::Infallible;
use std::net::SocketAddr;

use async_trait::async_trait;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use kubelet_core::configuration::KubeletConfiguration;
use kubelet_core::prometheus_client;
use kubelet_core::prometheus_client::registry::Registry;
use kubelet_core::{AgentPlugin, KubeletHandle, PlegHealth, PluginContext};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

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
    /// Binding a listener failed (port in use, no permission).
    #[error("binding {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Where the server listens; the kubelet's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerConfig {
    /// `address` (`0.0.0.0`): the read-only port's address.
    pub address: String,
    /// `readOnlyPort` (0 = off).
    pub read_only_port: u16,
    /// `healthzBindAddress` (`127.0.0.1`).
    pub healthz_bind_address: String,
    /// `healthzPort` (10248; 0 = off).
    pub healthz_port: u16,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self::from_configuration(&KubeletConfiguration::default())
    }
}

impl ServerConfig {
    /// The listeners of the kubelet's configuration (`address`, `readOnlyPort`,
    /// `healthzBindAddress`, `healthzPort`).
    pub fn from_configuration(c: &KubeletConfiguration) -> Self {
        Self {
            address: c.address.clone(),
            read_only_port: c.read_only_port,
            healthz_bind_address: c.healthz_bind_address.clone(),
            healthz_port: c.healthz_port,
        }
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
}

/// A bound listener and what it serves.
struct Listener {
    listener: TcpListener,
    read_only: bool,
}

/// The server plugin (`server`): bound listeners, served while the agent runs.
pub struct KubeletServer {
    listeners: Mutex<Vec<Listener>>,
    addrs: Vec<(SocketAddr, bool)>,
}

impl std::fmt::Debug for KubeletServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeletServer")
            .field("addrs", &self.addrs)
            .finish()
    }
}

impl KubeletServer {
    /// Bind the configured ports (those not 0).
    pub async fn bind(config: ServerConfig) -> Result<Self, ServerError> {
        let mut listeners = Vec::new();
        let mut addrs = Vec::new();
        for (address, port, read_only) in [
            (&config.address, config.read_only_port, true),
            (&config.healthz_bind_address, config.healthz_port, false),
        ] {
            if port == 0 {
                continue;
            }
            let addr = socket_addr(address, port)?;
            let listener = TcpListener::bind(addr)
                .await
                .map_err(|source| ServerError::Bind { addr, source })?;
            let bound = listener.local_addr().unwrap_or(addr);
            addrs.push((bound, read_only));
            listeners.push(Listener {
                listener,
                read_only,
            });
        }
        Ok(Self {
            listeners: Mutex::new(listeners),
            addrs,
        })
    }

    /// The bound read-only port's address, if any.
    pub fn read_only_addr(&self) -> Option<SocketAddr> {
        self.addrs.iter().find(|(_, ro)| *ro).map(|(a, _)| *a)
    }

    /// The bound healthz port's address, if any.
    pub fn healthz_addr(&self) -> Option<SocketAddr> {
        self.addrs.iter().find(|(_, ro)| !*ro).map(|(a, _)| *a)
    }
}

fn socket_addr(address: &str, port: u16) -> Result<SocketAddr, ServerError> {
    let ip: std::net::IpAddr = address
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .map_err(|_| ServerError::InvalidAddress {
            address: address.to_string(),
            port,
        })?;
    Ok(SocketAddr::new(ip, port))
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
    ) -> kubelet_core::Result<()> {
        let listeners = std::mem::take(&mut *self.listeners.lock());
        let mut serving = tokio::task::JoinSet::new();
        for l in listeners {
            serving.spawn(serve(
                l.listener,
                ctx.handle(),
                l.read_only,
                shutdown.clone(),
            ));
        }
        while serving.join_next().await.is_some() {}
        Ok(())
    }
}

/// Serve `listener` until `shutdown`; `read_only` adds `/pods` and `/metrics`.
pub async fn serve(
    listener: TcpListener,
    handle: KubeletHandle,
    read_only: bool,
    shutdown: CancellationToken,
) {
    loop {
        let (stream, _) = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection failed");
                    continue;
                }
            },
        };
        let handle = handle.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let handle = handle.clone();
                async move { Ok::<_, Infallible>(respond(&handle, read_only, req)) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await
            {
                tracing::debug!(error = %e, "HTTP connection ended with an error");
            }
        });
    }
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r
}

fn with_content_type(mut r: Response<Full<Bytes>>, value: &'static str) -> Response<Full<Bytes>> {
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(value),
    );
    r
}

fn respond(
    handle: &KubeletHandle,
    read_only: bool,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    if req.method() != Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    }
    match req.uri().path() {
        "/healthz" => match handle.pleg_health() {
            PlegHealth::Healthy => text(StatusCode::OK, "ok"),
            PlegHealth::Unhealthy(msg) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("[-]pleg failed: {msg}\nhealthz check failed\n"),
            ),
        },
        "/metrics" if read_only => metrics(&handle.metrics()),
        "/pods" | "/pods/" if read_only => {
            let items: Vec<serde_json::Value> = handle
                .statuses()
                .list()
                .into_iter()
                .map(|p| {
                    let mut pod = (*p.pod).clone();
                    pod.status = Some((*p.status).clone());
                    serde_json::to_value(&pod).unwrap_or(serde_json::Value::Null)
                })
                .collect();
            let list = serde_json::json!({
                "kind": "PodList",
                "apiVersion": "v1",
                "metadata": {},
                "items": items,
            });
            with_content_type(text(StatusCode::OK, list.to_string()), "application/json")
        }
        _ => text(StatusCode::NOT_FOUND, "404 page not found\n"),
    }
}

fn metrics(registry: &Registry) -> Response<Full<Bytes>> {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, registry) {
        Ok(()) => with_content_type(
            text(StatusCode::OK, body),
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
    }
}
