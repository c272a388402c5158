//! The probe handlers: HTTP(S) GET, TCP connect, gRPC health check. Exec probes go through
//! [`ProbeTargets::exec`](crate::ProbeTargets::exec).
//!
//! Each returns an [`Outcome`] the way the kubelet's `pkg/probe` packages do: transport errors and
//! timeouts of network probes are failures, not errors.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use http::header::HeaderValue;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

use crate::http1;
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
    /// An HTTP response arrived but its body could not be read (cut short, malformed chunks).
    /// The kubelet returns this as an error too (thrown away) whose state is failure: its event
    /// says "resulted in failure state" where [`Error`](Self::Error)'s says "unknown state".
    BodyError(String),
}

/// Connection settings shared by all network probes.
#[derive(Clone)]
pub(crate) struct NetConfig {
    pub(crate) user_agent: HeaderValue,
    /// The same, as text for HTTP requests.
    pub(crate) user_agent_text: String,
    /// The TLS connector, or why it could not be built (HTTPS probes then fail with it).
    pub(crate) tls: Result<tokio_rustls::TlsConnector, String>,
}

impl NetConfig {
    pub(crate) fn new(user_agent: &str) -> Self {
        let user_agent = HeaderValue::from_str(user_agent)
            .unwrap_or_else(|_| HeaderValue::from_static("kube-probe"));
        Self {
            user_agent_text: user_agent.to_str().unwrap_or("kube-probe").to_string(),
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

/// Connect with `SO_LINGER` 0, so that closing the probe socket sends a reset instead of
/// leaving a `TIME-WAIT` entry behind (thousands of probes a second would otherwise exhaust
/// ephemeral ports). The kubelet uses a 1 s linger for the same reason; a non-zero linger would
/// block a runtime thread in `close`, so this uses 0. For the same reason HTTP probes do not send
/// `Connection: close` (Go does, as its keep-alives are off): the server then keeps the
/// connection open after the response and the prober, closing first with a reset, leaves no
/// `TIME-WAIT` on either side. Connections are never reused. `nodelay` turns Nagle off (for TLS,
/// whose handshake and request are separate writes; a plain request is one write).
async fn dial(host: &str, port: u16, nodelay: bool) -> std::io::Result<TcpStream> {
    let stream = match host.parse::<IpAddr>() {
        Ok(ip) => TcpStream::connect((ip, port)).await?,
        Err(_) => TcpStream::connect((host, port)).await?,
    };
    let sock = socket2::SockRef::from(&stream);
    sock.set_linger(Some(Duration::ZERO))?;
    if nodelay {
        stream.set_nodelay(true)?;
    }
    Ok(stream)
}

/// `tcpSocket`: success when a connection is established within `timeout`.
pub(crate) async fn tcp_probe(host: &str, port: u16, timeout: Duration) -> Outcome {
    let addr = host_port(host, port);
    match tokio::time::timeout(timeout, dial(host, port, false)).await {
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

/// Go's `CanonicalMIMEHeaderKey`: `x-probe` becomes `X-Probe` (names that are not tokens are
/// left alone).
fn canonical_name(name: &str) -> String {
    if !name.bytes().all(is_token_byte) {
        return name.to_string();
    }
    let mut upper = true;
    name.chars()
        .map(|c| {
            let out = if upper {
                c.to_ascii_uppercase()
            } else {
                c.to_ascii_lowercase()
            };
            upper = c == '-';
            out
        })
        .collect()
}

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A header value that can go on the wire (no line breaks or other control characters).
fn valid_value(v: &str) -> bool {
    v.bytes().all(|b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

/// Header lines of an HTTP probe (besides `Host`) and the `Host` override, as the kubelet builds
/// them: custom headers in order (repeated names kept), `User-Agent` and `Accept: */*` unless
/// set (set empty, they are left out), a `Host` header sets the request's host. Headers the
/// client owns (`Content-Length`, `Transfer-Encoding`, `Trailer`, `Connection`) are not sent.
fn request_headers(
    user_agent: &str,
    spec: &HttpGetSpec,
) -> (Vec<(String, String)>, Option<String>) {
    let mut headers: Vec<(String, String)> = Vec::with_capacity(spec.headers.len() + 2);
    let mut host_override = None;
    let (mut user_agent_set, mut accept_set) = (false, false);
    for (name, value) in &spec.headers {
        if name.is_empty() || !name.bytes().all(is_token_byte) {
            tracing::debug!(header = %name, "invalid probe header name ignored");
            continue;
        }
        if !valid_value(value) {
            tracing::debug!(header = %name, "invalid probe header value ignored");
            continue;
        }
        let name = canonical_name(name);
        match name.as_str() {
            "Host" => {
                if host_override.is_none() {
                    host_override = Some(value.trim().to_string());
                }
                continue;
            }
            "Content-Length" | "Transfer-Encoding" | "Trailer" | "Connection" => continue,
            "User-Agent" => user_agent_set = true,
            "Accept" => accept_set = true,
            _ => {}
        }
        headers.push((name, value.clone()));
    }
    // A header set to empty removes it (Go writes no empty User-Agent and deletes an empty
    // Accept); other empty headers are sent as they are.
    headers.retain(|(n, v)| !(v.is_empty() && (n == "User-Agent" || n == "Accept")));
    if !user_agent_set && !user_agent.is_empty() {
        headers.insert(0, ("User-Agent".to_string(), user_agent.to_string()));
    }
    if !accept_set {
        headers.push(("Accept".to_string(), "*/*".to_string()));
    }
    (headers, host_override)
}

async fn http_exchange(net: &NetConfig, spec: &HttpGetSpec, host: &str) -> Outcome {
    let (headers, host_override) = request_headers(&net.user_agent_text, spec);
    let first_host = host;
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
        let resp = match http_once(net, &target, &headers).await {
            Ok(r) => r,
            Err(HopError::Transport(e)) => {
                return Outcome::Failure(format!("Get \"{}\": {e}", target.url()));
            }
            // The kubelet returns body read errors as probe errors.
            Err(HopError::Body(e)) => return Outcome::BodyError(e),
        };
        let code = resp.status;
        if matches!(code, 301 | 302 | 303 | 307 | 308)
            && let Some(loc) = &resp.location
        {
            let url = target.url();
            let Some(next) = resolve_redirect(&target, loc, host_override.as_deref()) else {
                return Outcome::Failure(format!(
                    "Get \"{url}\": unsupported redirect location {loc:?}"
                ));
            };
            if !next.host.eq_ignore_ascii_case(first_host) {
                return Outcome::Warning(format!(
                    "Probe terminated redirects, Response body: {}",
                    String::from_utf8_lossy(&resp.body)
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
            let body = String::from_utf8_lossy(&resp.body).into_owned();
            if code >= 300 {
                Outcome::Warning(format!("Probe terminated redirects, Response body: {body}"))
            } else {
                Outcome::Success(body)
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

/// Why one hop of an HTTP probe failed.
enum HopError {
    /// No response (connect, TLS, request, response head): a probe failure.
    Transport(String),
    /// The response body could not be read: a probe error.
    Body(String),
}

impl From<http1::Error> for HopError {
    fn from(e: http1::Error) -> Self {
        match e {
            http1::Error::Transport(m) => HopError::Transport(m),
            http1::Error::Body(m) => HopError::Body(m),
        }
    }
}

async fn http_once(
    net: &NetConfig,
    target: &Target,
    headers: &[(String, String)],
) -> Result<http1::Response, HopError> {
    let request = http1::request(
        &target.path,
        &target.authority,
        headers.iter().map(|(n, v)| (n.as_str(), v.as_str())),
    );
    let mut tcp = dial(&target.host, target.port, target.scheme == Scheme::Https)
        .await
        .map_err(|e| {
            HopError::Transport(format!(
                "dial tcp {}: {e}",
                host_port(&target.host, target.port)
            ))
        })?;
    match target.scheme {
        Scheme::Http => Ok(http1::exchange(&mut tcp, &request).await?),
        Scheme::Https => {
            let name = match target.host.parse::<IpAddr>() {
                Ok(ip) => ServerName::IpAddress(ip.into()),
                Err(_) => ServerName::try_from(target.host.clone())
                    .map_err(|e| HopError::Transport(format!("invalid TLS server name: {e}")))?,
            };
            let connector = net
                .tls
                .as_ref()
                .map_err(|e| HopError::Transport(format!("tls: {e}")))?;
            // Boxed (the handshake and the TLS state are large, and would make every probe
            // task as large).
            let mut tls = Box::new(
                Box::pin(connector.connect(name, tcp))
                    .await
                    .map_err(|e| HopError::Transport(format!("tls: {e}")))?,
            );
            Ok(http1::exchange(&mut tls, &request).await?)
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
        let spec = HttpGetSpec::new(Scheme::Http, 80, "/");
        let (h, host) = request_headers("kube-probe/1.33", &spec);
        let get = |h: &[(String, String)], n: &str| {
            h.iter()
                .filter(|(k, _)| k == n)
                .map(|(_, v)| v.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(get(&h, "User-Agent"), ["kube-probe/1.33"]);
        assert_eq!(get(&h, "Accept"), ["*/*"]);
        assert_eq!(host, None);
        let spec = HttpGetSpec::new(Scheme::Http, 80, "/")
            .header("accept", "")
            .header("user-agent", "mine")
            .header("Host", "svc.local")
            .header("host", "second.local")
            .header("x-multi", "1")
            .header("X-Multi", "2")
            .header("Content-Length", "5")
            .header("bad name", "x")
            .header("X-Split", "a\r\nInjected: 1");
        let (h, host) = request_headers("kube-probe/1.33", &spec);
        assert!(get(&h, "Accept").is_empty(), "an empty Accept removes it");
        assert_eq!(get(&h, "User-Agent"), ["mine"]);
        assert_eq!(host.as_deref(), Some("svc.local"), "the first Host wins");
        assert_eq!(
            get(&h, "X-Multi"),
            ["1", "2"],
            "names canonicalized, values kept"
        );
        assert!(get(&h, "Content-Length").is_empty());
        assert_eq!(h.len(), 3, "{h:?}");
        let spec = HttpGetSpec::new(Scheme::Http, 80, "/").header("User-Agent", "");
        let (h, _) = request_headers("kube-probe/1.33", &spec);
        assert!(
            get(&h, "User-Agent").is_empty(),
            "an empty User-Agent removes it"
        );
    }
}
