//! The probe handlers: HTTP(S) GET, TCP connect, gRPC health check. Exec probes go through
//! [`ProbeTargets::exec`](crate::ProbeTargets::exec).
//!
//! Each returns an [`Outcome`] the way the kubelet's `pkg/probe` packages do: transport errors and
//! timeouts of network probes are failures, not errors.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{ACCEPT, HOST, HeaderName, HeaderValue, LOCATION, USER_AGENT};
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

use crate::spec::{HttpGetSpec, Scheme};

/// Response bodies and exec output are read up to this many bytes (`maxRespBodyLength`).
pub const MAX_BODY: usize = 10 * 1024;
/// Same-host redirects followed before the probe fails.
pub const MAX_REDIRECTS: usize = 10;

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
}

/// Connection settings shared by all network probes.
#[derive(Clone)]
pub(crate) struct NetConfig {
    pub(crate) user_agent: HeaderValue,
    /// The TLS connector, or why it could not be built (HTTPS probes then fail with it).
    pub(crate) tls: Result<tokio_rustls::TlsConnector, String>,
}

impl NetConfig {
    pub(crate) fn new(user_agent: &str) -> Self {
        let user_agent = HeaderValue::from_str(user_agent)
            .unwrap_or_else(|_| HeaderValue::from_static("kube-probe"));
        Self {
            user_agent,
            tls: insecure_tls_config()
                .map(|c| tokio_rustls::TlsConnector::from(Arc::new(c)))
                .map_err(|e| e.to_string()),
        }
    }
}

impl std::fmt::Debug for NetConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetConfig")
            .field("user_agent", &self.user_agent)
            .finish_non_exhaustive()
    }
}

fn host_port(host: &str, port: u16) -> String {
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V6(_)) => format!("[{host}]:{port}"),
        _ => format!("{host}:{port}"),
    }
}

/// Connect with no Nagle and `SO_LINGER` 0, so that closing the probe socket sends a reset
/// instead of leaving a `TIME-WAIT` entry behind (thousands of probes a second would otherwise
/// exhaust ephemeral ports). The kubelet uses a 1 s linger for the same reason; a non-zero
/// linger would block a runtime thread in `close`, so this uses 0. For the same reason HTTP
/// probes do not send `Connection: close` (Go does, as its keep-alives are off): the server
/// then keeps the connection open after the response and the prober, closing first with a
/// reset, leaves no `TIME-WAIT` on either side. Connections are never reused.
async fn dial(host: &str, port: u16) -> std::io::Result<TcpStream> {
    let stream = match host.parse::<IpAddr>() {
        Ok(ip) => TcpStream::connect((ip, port)).await?,
        Err(_) => TcpStream::connect((host, port)).await?,
    };
    let sock = socket2::SockRef::from(&stream);
    sock.set_linger(Some(Duration::ZERO))?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// `tcpSocket`: success when a connection is established within `timeout`.
pub(crate) async fn tcp_probe(host: &str, port: u16, timeout: Duration) -> Outcome {
    let addr = host_port(host, port);
    match tokio::time::timeout(timeout, dial(host, port)).await {
        Ok(Ok(stream)) => {
            drop(stream);
            Outcome::Success(String::new())
        }
        Ok(Err(e)) => Outcome::Failure(format!("dial tcp {addr}: {e}")),
        Err(_) => Outcome::Failure(format!("dial tcp {addr}: i/o timeout")),
    }
}

/// The URL of an HTTP probe as the kubelet formats it.
pub(crate) fn http_url(spec: &HttpGetSpec, host: &str) -> String {
    format!(
        "{}://{}{}",
        spec.scheme.as_str(),
        host_port(host, spec.port),
        spec.path
    )
}

/// One hop of an HTTP probe: where to connect and what to ask.
#[derive(Debug, Clone)]
struct Target {
    scheme: Scheme,
    host: String,
    port: u16,
    path: String,
    /// `Host` header value.
    authority: String,
}

impl Target {
    fn url(&self) -> String {
        format!(
            "{}://{}{}",
            self.scheme.as_str(),
            host_port(&self.host, self.port),
            self.path
        )
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
    let url = http_url(spec, host);
    match tokio::time::timeout(timeout, http_exchange(net, spec, host)).await {
        Ok(outcome) => outcome,
        Err(_) => Outcome::Failure(format!(
            "Get \"{url}\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
        )),
    }
}

fn request_headers(net: &NetConfig, spec: &HttpGetSpec) -> (HeaderMap, Option<String>) {
    let mut headers = HeaderMap::new();
    let mut host_override = None;
    for (name, value) in &spec.headers {
        let Ok(name) = HeaderName::from_bytes(name.as_bytes()) else {
            tracing::debug!(header = %name, "invalid probe header name ignored");
            continue;
        };
        if name == HOST {
            host_override = Some(value.clone());
            continue;
        }
        match HeaderValue::from_str(value) {
            Ok(v) => {
                headers.append(name, v);
            }
            Err(_) => tracing::debug!(header = %name, "invalid probe header value ignored"),
        }
    }
    match headers.get(USER_AGENT) {
        None => {
            headers.insert(USER_AGENT, net.user_agent.clone());
        }
        Some(v) if v.is_empty() => {
            headers.remove(USER_AGENT);
        }
        Some(_) => {}
    }
    match headers.get(ACCEPT) {
        None => {
            headers.insert(ACCEPT, HeaderValue::from_static("*/*"));
        }
        Some(v) if v.is_empty() => {
            headers.remove(ACCEPT);
        }
        Some(_) => {}
    }
    (headers, host_override)
}

async fn http_exchange(net: &NetConfig, spec: &HttpGetSpec, host: &str) -> Outcome {
    let (headers, host_override) = request_headers(net, spec);
    let first_host = host.to_string();
    let mut target = Target {
        scheme: spec.scheme,
        host: host.to_string(),
        port: spec.port,
        path: spec.path.clone(),
        authority: host_override
            .clone()
            .unwrap_or_else(|| host_port(host, spec.port)),
    };
    let mut redirects = 0usize;
    loop {
        let url = target.url();
        let (status, location, body) = match http_once(net, &target, &headers).await {
            Ok(r) => r,
            Err(e) => return Outcome::Failure(format!("Get \"{url}\": {e}")),
        };
        let code = status.as_u16();
        let body_text = String::from_utf8_lossy(&body).into_owned();
        if status.is_redirection()
            && matches!(code, 301 | 302 | 303 | 307 | 308)
            && let Some(loc) = location
        {
            let Some(next) = resolve_redirect(&target, &loc, host_override.as_deref()) else {
                return Outcome::Failure(format!(
                    "Get \"{url}\": unsupported redirect location {loc:?}"
                ));
            };
            if !next.host.eq_ignore_ascii_case(&first_host) {
                return Outcome::Warning(format!(
                    "Probe terminated redirects, Response body: {body_text}"
                ));
            }
            if redirects >= MAX_REDIRECTS {
                return Outcome::Failure(format!(
                    "Get \"{}\": stopped after {MAX_REDIRECTS} redirects",
                    next.url()
                ));
            }
            redirects += 1;
            target = next;
            continue;
        }
        return if (200..400).contains(&code) {
            if status.is_redirection() {
                Outcome::Warning(format!(
                    "Probe terminated redirects, Response body: {body_text}"
                ))
            } else {
                Outcome::Success(body_text)
            }
        } else {
            Outcome::Failure(format!("HTTP probe failed with statuscode: {code}"))
        };
    }
}

/// Resolve a `Location` against the current request (absolute, scheme-relative, absolute path,
/// or relative path). A custom `Host` header is kept only for relative locations, as Go's client
/// does.
fn resolve_redirect(
    current: &Target,
    location: &str,
    host_override: Option<&str>,
) -> Option<Target> {
    let lower = location.to_ascii_lowercase();
    let (scheme, rest) = if lower.starts_with("http://") {
        (Scheme::Http, &location[7..])
    } else if lower.starts_with("https://") {
        (Scheme::Https, &location[8..])
    } else if let Some(rest) = location.strip_prefix("//") {
        (current.scheme, rest)
    } else if lower.contains("://") {
        return None;
    } else {
        let path = if location.starts_with('/') {
            location.to_string()
        } else {
            let base = current.path.split(['?', '#']).next().unwrap_or("/");
            let dir = base.rsplit_once('/').map_or("", |(d, _)| d);
            format!("{dir}/{location}")
        };
        return Some(Target {
            path,
            authority: host_override
                .map(str::to_string)
                .unwrap_or_else(|| current.authority.clone()),
            ..current.clone()
        });
    };
    let (authority, path) = match rest.find(['/', '?', '#']) {
        Some(i) => (&rest[..i], rest[i..].to_string()),
        None => (rest, "/".to_string()),
    };
    let path = if path.starts_with('/') {
        path
    } else {
        format!("/{path}")
    };
    let default_port = match scheme {
        Scheme::Http => 80,
        Scheme::Https => 443,
    };
    let (host, port) = if let Some(stripped) = authority.strip_prefix('[') {
        let (h, after) = stripped.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None => default_port,
        };
        (h.to_string(), port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), p.parse().ok()?),
            None => (authority.to_string(), default_port),
        }
    };
    if host.is_empty() {
        return None;
    }
    Some(Target {
        scheme,
        authority: authority.to_string(),
        host,
        port,
        path,
    })
}

type Response = (StatusCode, Option<String>, Bytes);

async fn http_once(
    net: &NetConfig,
    target: &Target,
    headers: &HeaderMap,
) -> Result<Response, String> {
    let tcp = dial(&target.host, target.port)
        .await
        .map_err(|e| format!("dial tcp {}: {e}", host_port(&target.host, target.port)))?;
    match target.scheme {
        Scheme::Http => exchange(TokioIo::new(tcp), target, headers).await,
        Scheme::Https => {
            let name = match target.host.parse::<IpAddr>() {
                Ok(ip) => ServerName::IpAddress(ip.into()),
                Err(_) => ServerName::try_from(target.host.clone())
                    .map_err(|e| format!("invalid TLS server name: {e}"))?,
            };
            let connector = net.tls.as_ref().map_err(|e| format!("tls: {e}"))?;
            let tls = connector
                .connect(name, tcp)
                .await
                .map_err(|e| format!("tls: {e}"))?;
            exchange(TokioIo::new(tls), target, headers).await
        }
    }
}

async fn exchange<I>(io: I, target: &Target, headers: &HeaderMap) -> Result<Response, String>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(io)
        .await
        .map_err(|e| e.to_string())?;
    let mut req = Request::get(target.path.as_str())
        .body(Empty::new())
        .map_err(|e| e.to_string())?;
    *req.headers_mut() = headers.clone();
    let host = HeaderValue::from_str(&target.authority).map_err(|e| e.to_string())?;
    req.headers_mut().insert(HOST, host);
    let work = async move {
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let location = resp
            .headers()
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let mut body = resp.into_body();
        let mut buf = Vec::new();
        while buf.len() < MAX_BODY {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        let take = data.len().min(MAX_BODY - buf.len());
                        buf.extend_from_slice(&data[..take]);
                    }
                }
                // A body cut short is not fatal: the status decides.
                Some(Err(_)) | None => break,
            }
        }
        Ok::<_, String>((status, location, Bytes::from(buf)))
    };
    tokio::pin!(work);
    tokio::pin!(conn);
    let mut conn_done = false;
    loop {
        tokio::select! {
            biased;
            r = &mut work => return r,
            _ = &mut conn, if !conn_done => conn_done = true,
        }
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

/// TLS client configuration without certificate verification (the kubelet's
/// `InsecureSkipVerify: true`); handshake signatures are still checked against the presented
/// certificate.
fn insecure_tls_config() -> Result<rustls::ClientConfig, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = Arc::new(NoCertificateVerification(provider.clone()));
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

#[derive(Debug)]
struct NoCertificateVerification(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoCertificateVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn target() -> Target {
        Target {
            scheme: Scheme::Http,
            host: "10.0.0.1".into(),
            port: 8080,
            path: "/a/b?x=1".into(),
            authority: "10.0.0.1:8080".into(),
        }
    }

    #[test]
    fn redirect_locations_resolve_like_a_browser() {
        let t = target();
        let r = resolve_redirect(&t, "/c", None).unwrap();
        assert_eq!(
            (r.host.as_str(), r.port, r.path.as_str()),
            ("10.0.0.1", 8080, "/c")
        );
        let r = resolve_redirect(&t, "c", None).unwrap();
        assert_eq!(r.path, "/a/c");
        let r = resolve_redirect(&t, "http://example.com/x", None).unwrap();
        assert_eq!(
            (r.host.as_str(), r.port, r.path.as_str()),
            ("example.com", 80, "/x")
        );
        let r = resolve_redirect(&t, "https://[::1]:8443", None).unwrap();
        assert_eq!(
            (r.host.as_str(), r.port, r.path.as_str()),
            ("::1", 8443, "/")
        );
        assert_eq!(r.scheme, Scheme::Https);
        let r = resolve_redirect(&t, "//other:81/y", None).unwrap();
        assert_eq!((r.host.as_str(), r.port), ("other", 81));
        assert!(resolve_redirect(&t, "ftp://x/", None).is_none());
    }

    #[test]
    fn a_custom_host_header_survives_only_relative_redirects() {
        let t = target();
        let r = resolve_redirect(&t, "/c", Some("svc.local")).unwrap();
        assert_eq!(r.authority, "svc.local");
        let r = resolve_redirect(&t, "http://10.0.0.1:8080/c", Some("svc.local")).unwrap();
        assert_eq!(r.authority, "10.0.0.1:8080");
    }

    #[test]
    fn default_headers_are_user_agent_and_accept_unless_overridden() {
        let net = NetConfig::new("kube-probe/1.33");
        let spec = HttpGetSpec::new(Scheme::Http, 80, "/");
        let (h, host) = request_headers(&net, &spec);
        assert_eq!(h.get(USER_AGENT).unwrap(), "kube-probe/1.33");
        assert_eq!(h.get(ACCEPT).unwrap(), "*/*");
        assert_eq!(host, None);
        let spec = HttpGetSpec::new(Scheme::Http, 80, "/")
            .header("accept", "")
            .header("User-Agent", "mine")
            .header("Host", "svc.local")
            .header("X-Multi", "1")
            .header("X-Multi", "2");
        let (h, host) = request_headers(&net, &spec);
        assert!(h.get(ACCEPT).is_none());
        assert_eq!(h.get(USER_AGENT).unwrap(), "mine");
        assert_eq!(host.as_deref(), Some("svc.local"));
        assert_eq!(h.get_all("x-multi").iter().count(), 2);
    }
}
