//! Real peers for the probe tests: an HTTP(S) server with scripted routes and a gRPC health
//! server, all on loopback.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Shared switches of the test HTTP server.
#[derive(Debug, Default)]
pub struct HttpState {
    /// `/health` answers 500 while set.
    pub unhealthy: AtomicBool,
    /// Requests served.
    pub requests: AtomicUsize,
    /// The last request's headers, as `name: value` lines.
    pub last_headers: parking_lot::Mutex<Vec<(String, String)>>,
}

/// A running test HTTP server.
pub struct HttpServer {
    pub addr: SocketAddr,
    pub state: Arc<HttpState>,
    pub stop: CancellationToken,
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn route(req: &Request<Incoming>, state: &HttpState, port: u16) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    let mk = |code: u16, body: Vec<u8>| {
        Response::builder()
            .status(code)
            .body(Full::new(Bytes::from(body)))
            .unwrap()
    };
    let redirect = |code: u16, loc: String| {
        Response::builder()
            .status(code)
            .header("Location", loc)
            .body(Full::new(Bytes::from_static(b"moved")))
            .unwrap()
    };
    match path.as_str() {
        "/ok" => mk(200, b"fine".to_vec()),
        "/health" => {
            if state.unhealthy.load(Ordering::SeqCst) {
                mk(500, b"sick".to_vec())
            } else {
                mk(200, b"ok".to_vec())
            }
        }
        "/fail" => mk(503, b"secret body".to_vec()),
        "/notfound" => mk(404, Vec::new()),
        "/created" => mk(201, Vec::new()),
        "/same-host" => redirect(302, "/ok".to_string()),
        "/same-host-absolute" => redirect(301, format!("http://127.0.0.1:{port}/ok")),
        "/same-host-to-fail" => redirect(307, "/fail".to_string()),
        "/other-host" => redirect(302, format!("http://localhost:{port}/ok")),
        "/loop" => redirect(302, "/loop".to_string()),
        "/big" => mk(200, vec![b'x'; 1024 * 1024]),
        _ => mk(404, Vec::new()),
    }
}

/// Start an HTTP server on 127.0.0.1; with `tls`, it serves HTTPS with a fresh self-signed
/// certificate.
pub async fn http_server(tls: bool) -> HttpServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = Arc::new(HttpState::default());
    let stop = CancellationToken::new();
    let acceptor = tls.then(tls_acceptor);
    {
        let state = state.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = tokio::select! {
                    _ = stop.cancelled() => return,
                    r = listener.accept() => match r { Ok(s) => s, Err(_) => continue },
                };
                let state = state.clone();
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let port = addr.port();
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let state = state.clone();
                        async move {
                            state.requests.fetch_add(1, Ordering::SeqCst);
                            *state.last_headers.lock() = req
                                .headers()
                                .iter()
                                .map(|(k, v)| {
                                    (k.to_string(), v.to_str().unwrap_or_default().to_string())
                                })
                                .collect();
                            if req.uri().path() == "/slow" {
                                tokio::time::sleep(Duration::from_secs(5)).await;
                            }
                            Ok::<_, Infallible>(route(&req, &state, port))
                        }
                    });
                    let builder = hyper::server::conn::http1::Builder::new();
                    match acceptor {
                        Some(acc) => {
                            if let Ok(s) = acc.accept(stream).await {
                                let _ = builder.serve_connection(TokioIo::new(s), svc).await;
                            }
                        }
                        None => {
                            let _ = builder.serve_connection(TokioIo::new(stream), svc).await;
                        }
                    }
                });
            }
        });
    }
    HttpServer { addr, state, stop }
}

fn tls_acceptor() -> tokio_rustls::TlsAcceptor {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert = ck.cert.der().clone();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.key_pair.serialize_der().into());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
    tokio_rustls::TlsAcceptor::from(Arc::new(cfg))
}

/// A running gRPC health server.
pub struct GrpcServer {
    pub addr: SocketAddr,
    pub reporter: tonic_health::server::HealthReporter,
    pub stop: CancellationToken,
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Start a `grpc.health.v1` server on 127.0.0.1 with service `""` SERVING.
pub async fn grpc_server() -> GrpcServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (reporter, service) = tonic_health::server::health_reporter();
    let stop = CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(async move {
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let _ = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, s.cancelled_owned())
            .await;
    });
    GrpcServer {
        addr,
        reporter,
        stop,
    }
}
