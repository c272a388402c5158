//! The read-only port (`GET /healthz`, `GET /pods`) and the healthz port (`GET /healthz`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use kubelet_core::{KubeletHandle, PlegHealth};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Bind `addr`, with a clear error.
pub(crate) async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))
}

/// Serve until `shutdown`; `with_pods` adds `/pods` and `/metrics` (the read-only port).
pub(crate) async fn serve(
    listener: TcpListener,
    handle: KubeletHandle,
    metrics: Arc<Registry>,
    with_pods: bool,
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
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let handle = handle.clone();
                let metrics = metrics.clone();
                async move { Ok::<_, Infallible>(respond(&handle, &metrics, with_pods, req)) }
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

fn respond(
    handle: &KubeletHandle,
    metrics: &Registry,
    with_pods: bool,
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
        "/metrics" if with_pods => {
            let mut body = String::new();
            match prometheus_client::encoding::text::encode(&mut body, metrics) {
                Ok(()) => {
                    let mut r = text(StatusCode::OK, body);
                    r.headers_mut().insert(
                        hyper::header::CONTENT_TYPE,
                        hyper::header::HeaderValue::from_static(
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        ),
                    );
                    r
                }
                Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
            }
        }
        "/pods" | "/pods/" if with_pods => {
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
            let mut r = text(StatusCode::OK, list.to_string());
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("application/json"),
            );
            r
        }
        _ => text(StatusCode::NOT_FOUND, "404 page not found\n"),
    }
}
