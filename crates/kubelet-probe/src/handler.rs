//! The probe handlers: HTTP(S) GET, TCP connect, gRPC health check. Exec probes go through
//! [`ProbeTargets::exec`](crate::ProbeTargets::exec).
//!
//! Each returns an [`Outcome`] the way the kubelet's `pkg/probe` packages do: transport errors and
//! timeouts of network probes are failures, not errors. HTTP probes go through the SDK's one HTTP
//! client ([`kubelet_net::http`]), shared with lifecycle hooks and the manifest URL source.

use std::time::Duration;

use http::header::HeaderValue;
use kubelet_net::http::{HttpClient, HttpError, host_port};

use kubelet_net::http::HttpGetSpec;

/// Response bodies and exec output are read up to this many bytes (`maxRespBodyLength`).
pub const MAX_BODY: usize = kubelet_net::http::DEFAULT_MAX_BODY;
/// Same-host redirects followed before the probe fails.
pub const MAX_REDIRECTS: usize = kubelet_net::http::MAX_REDIRECTS;

/// What one probe attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Healthy; the string is the output (response body, command output).
    Success(String),
    /// Healthy with a warning (a redirect to another host): recorded as a `ProbeWarning` event.
    Warning(String),
    /// Unhealthy; the string says why (recorded as an `Unhealthy` event).
    Failure(String),
    /// The probe could not run (for example the runtime rejected the exec). The kubelet throws
    /// such results away.
    Error(String),
    /// An HTTP response arrived but its body could not be read (cut short, malformed chunks).
    /// The kubelet returns this as an error too (thrown away) whose state is failure: its event
    /// says "resulted in failure state" where [`Error`](Self::Error)'s says "unknown state".
    BodyError(String),
}

/// Connection settings shared by all network probes.
#[derive(Clone, Debug)]
pub(crate) struct NetConfig {
    pub(crate) user_agent: HeaderValue,
    /// The HTTP client (the user agent, TLS without verification, the 10 KiB body cap).
    pub(crate) http: HttpClient,
}

impl NetConfig {
    pub(crate) fn new(user_agent: &str) -> Self {
        let user_agent = HeaderValue::from_str(user_agent)
            .unwrap_or_else(|_| HeaderValue::from_static("kube-probe"));
        Self {
            http: HttpClient::insecure(user_agent.to_str().unwrap_or("kube-probe"))
                .max_body(MAX_BODY),
            user_agent,
        }
    }
}

/// `tcpSocket`: success when a connection is established within `timeout`.
pub(crate) async fn tcp_probe(host: &str, port: u16, timeout: Duration) -> Outcome {
    let addr = host_port(host, port);
    match tokio::time::timeout(timeout, kubelet_net::http::dial(host, port, false)).await {
        Ok(Ok(stream)) => {
            drop(stream);
            Outcome::Success(String::new())
        }
        Ok(Err(e)) => Outcome::Failure(format!("dial tcp {addr}: {e}")),
        Err(_) => Outcome::Failure(format!("dial tcp {addr}: i/o timeout")),
    }
}

/// `httpGet`: GET with the kubelet's headers, same-host redirects followed (up to
/// [`MAX_REDIRECTS`]), a redirect to another host reported as a warning, body read capped at
/// [`MAX_BODY`]; 200–399 is success. The whole exchange is bounded by `timeout`.
pub(crate) async fn http_probe(
    net: &NetConfig,
    spec: &HttpGetSpec,
    host: &str,
    timeout: Duration,
) -> Outcome {
    let url = spec.url(spec.host.as_deref().unwrap_or(host));
    match tokio::time::timeout(timeout, net.http.get(spec, host)).await {
        Ok(Ok(resp)) => {
            let code = resp.status;
            let body = String::from_utf8_lossy(&resp.body).into_owned();
            if (200..300).contains(&code) {
                Outcome::Success(body)
            } else if (300..400).contains(&code) {
                // A redirect to another host, or a 3xx that is no redirect.
                Outcome::Warning(format!("Probe terminated redirects, Response body: {body}"))
            } else {
                Outcome::Failure(format!("HTTP probe failed with statuscode: {code}"))
            }
        }
        // The kubelet returns body read errors as probe errors.
        Ok(Err(HttpError::Body(e))) => Outcome::BodyError(e),
        Ok(Err(e)) => Outcome::Failure(e.to_string()),
        Err(_) => Outcome::Failure(format!(
            "Get \"{url}\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
        )),
    }
}

/// `grpc`: `grpc.health.v1.Health/Check{service}` over plaintext HTTP/2 within `timeout`.
pub(crate) async fn grpc_probe(
    net: &NetConfig,
    host: &str,
    port: u16,
    service: &str,
    timeout: Duration,
) -> Outcome {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;

    let addr = host_port(host, port);
    let endpoint = match tonic::transport::Endpoint::from_shared(format!("http://{addr}")) {
        Ok(e) => e.connect_timeout(timeout).timeout(timeout),
        Err(e) => return Outcome::Failure(format!("invalid gRPC address {addr}: {e}")),
    };
    let endpoint = match endpoint.clone().user_agent(net.user_agent.clone()) {
        Ok(e) => e,
        Err(_) => endpoint,
    };
    let started = tokio::time::Instant::now();
    let channel = match tokio::time::timeout(timeout, endpoint.connect()).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            return Outcome::Failure(format!(
                "timeout: failed to connect service {addr:?} within {timeout:?}: {e}"
            ));
        }
        Err(_) => {
            return Outcome::Failure(format!(
                "timeout: failed to connect service {addr:?} within {timeout:?}"
            ));
        }
    };
    let left = timeout.saturating_sub(started.elapsed());
    let mut client = HealthClient::new(channel);
    let request = HealthCheckRequest {
        service: service.to_string(),
    };
    match tokio::time::timeout(left, client.check(request)).await {
        Err(_) => Outcome::Failure(format!(
            "timeout: health rpc did not complete within {timeout:?}"
        )),
        Ok(Err(status)) => match status.code() {
            tonic::Code::Unimplemented => Outcome::Failure(format!(
                "this server does not implement the grpc health protocol (grpc.health.v1.Health): {}",
                status.message()
            )),
            tonic::Code::DeadlineExceeded => Outcome::Failure(format!(
                "timeout: health rpc did not complete within {timeout:?}"
            )),
            _ => Outcome::Failure(format!(
                "error: health rpc probe failed: {}: {}",
                status.code(),
                status.message()
            )),
        },
        Ok(Ok(resp)) => {
            let st = resp.into_inner().status;
            match ServingStatus::try_from(st) {
                Ok(ServingStatus::Serving) => Outcome::Success("service healthy".to_string()),
                Ok(other) => Outcome::Failure(format!(
                    "service unhealthy (responded with {:?})",
                    other.as_str_name()
                )),
                Err(_) => Outcome::Failure(format!("service unhealthy (responded with \"{st}\")")),
            }
        }
    }
}
