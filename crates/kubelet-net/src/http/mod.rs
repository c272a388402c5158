//! The SDK's one HTTP client: a `GET` as the kubelet's `httpGet` actions make it.
//!
//! HTTP probes (`kubelet-probe`), `httpGet` lifecycle hooks (the engine) and the manifest URL
//! source (`kubelet-podconfig`) all send one `GET` and read one response. They share this
//! client, which does what the kubelet's `NewRequestForHTTPGetAction` and its HTTP client do:
//!
//! * the request carries the action's headers in order (names canonicalised, values that cannot
//!   go on the wire dropped), `User-Agent` and `Accept: */*` unless the action sets them (set
//!   empty, they are left out), and `Host` from the action's `Host` header or the target;
//! * IPv6 literals are bracketed in the `Host` header and in URLs;
//! * redirects to the same host are followed (at most [`MAX_REDIRECTS`]); a redirect to another
//!   host ends the exchange and returns that 3xx response (Go's `RedirectChecker(false)`); a
//!   custom `Host` header survives only relative redirects;
//! * `https` either skips certificate verification ([`HttpClient::insecure`], the kubelet's
//!   `InsecureSkipVerify` for probes and hooks) or verifies against a given configuration
//!   (`HttpClient::with_tls`, the manifest URL). `https` needs the crate's `tls` feature
//!   (default); without it such a request fails with a transport error saying so;
//! * at most [`HttpClient::max_body`] bytes of the body are read ([`Response::truncated`] says
//!   whether there was more);
//! * sockets close with `SO_LINGER` 0 and connections are never reused, so thousands of probes
//!   a second leave no `TIME-WAIT` entries behind.
//!
//! The caller bounds the whole exchange with its own timeout and decides what a status code
//! means (a probe fails on 400 and above, a hook ignores the status as the kubelet does, the URL
//! source wants 200).
//!
//! ```no_run
//! # async fn demo() -> Result<(), kubelet_net::http::HttpError> {
//! use kubelet_net::http::{HttpClient, HttpGetSpec, Scheme};
//!
//! let client = HttpClient::insecure("kube-probe/1.33");
//! let spec = HttpGetSpec::new(Scheme::Http, 8080, "/healthz").header("X-Probe", "1");
//! let resp = client.get(&spec, "127.0.0.1").await?;
//! println!("{} {}", resp.status, String::from_utf8_lossy(&resp.body));
//! # Ok(())
//! # }
//! ```

#[cfg(feature = "tls")]
mod tls;
mod wire;

use std::net::IpAddr;
#[cfg(feature = "tls")]
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, HTTPGetAction};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
#[cfg(feature = "tls")]
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

#[cfg(feature = "tls")]
pub use tls::insecure_tls_config;
pub use wire::Response;

/// Same-host redirects followed before the exchange fails.
pub const MAX_REDIRECTS: usize = 10;
/// The body limit of a new client: the kubelet's `maxRespBodyLength` for probes and hooks.
pub const DEFAULT_MAX_BODY: usize = 10 * 1024;

/// HTTP or HTTPS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// Plain HTTP.
    Http,
    /// HTTPS.
    Https,
}

impl Scheme {
    /// `http` or `https`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }

    fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }
}

/// An `httpGet` action with its port resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HttpGetSpec {
    /// Scheme.
    pub scheme: Scheme,
    /// Host to connect to; `None` means the pod IP.
    pub host: Option<String>,
    /// Port.
    pub port: u16,
    /// Path and query, starting with `/`.
    pub path: String,
    /// Extra headers in order (`Host` sets the request's host, `User-Agent` and `Accept` replace
    /// the defaults, an empty `Accept` removes it).
    pub headers: Vec<(String, String)>,
}

impl HttpGetSpec {
    /// `GET <scheme>://<pod IP>:<port><path>` with no extra headers.
    pub fn new(scheme: Scheme, port: u16, path: impl Into<String>) -> Self {
        let path = path.into();
        Self {
            scheme,
            host: None,
            port,
            path: normalize_path(&path),
            headers: Vec::new(),
        }
    }

    /// Set the host to connect to instead of the pod IP.
    pub fn host(mut self, host: impl Into<String>) -> Self {
        self.host = Some(host.into());
        self
    }

    /// Add a header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The spec of a Kubernetes `HTTPGetAction` of `container` (a probe's or a lifecycle
    /// hook's): the scheme (`HTTP` when unset), the port resolved against the container's named
    /// ports, the path with a leading `/`, the headers in order, an empty host meaning the pod
    /// IP.
    pub fn from_action(action: &HTTPGetAction, container: &Container) -> Result<Self, SpecError> {
        let scheme = match action
            .scheme
            .as_deref()
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            None | Some("") | Some("http") => Scheme::Http,
            Some("https") => Scheme::Https,
            Some(other) => return Err(SpecError::UnsupportedScheme(other.to_string())),
        };
        let headers = action
            .http_headers
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(|h| (h.name.clone(), h.value.clone()))
            .collect();
        Ok(Self {
            scheme,
            host: action.host.clone().filter(|s| !s.is_empty()),
            port: resolve_port(&action.port, container)?,
            path: normalize_path(action.path.as_deref().unwrap_or("/")),
            headers,
        })
    }

    /// The URL for `host` (the spec's own host or the pod IP), as the kubelet formats it.
    pub fn url(&self, host: &str) -> String {
        format!(
            "{}://{}{}",
            self.scheme.as_str(),
            host_port(host, self.port),
            self.path
        )
    }
}

/// Why an `httpGet` action (or a `tcpSocket` port) cannot be turned into a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// The scheme is neither `HTTP` nor `HTTPS`.
    #[error("unsupported scheme {0:?}")]
    UnsupportedScheme(String),
    /// The port is out of range or names no port of the container.
    #[error("invalid port {port:?}: {reason}")]
    InvalidPort {
        /// The port as written (or resolved).
        port: String,
        /// Why.
        reason: String,
    },
}

/// Resolve an action's port: a number, or the name of one of the container's ports (a string
/// that names no port but parses as a number is taken as that number, as the kubelet does).
pub fn resolve_port(port: &IntOrString, container: &Container) -> Result<u16, SpecError> {
    let invalid = |port: String, reason: String| SpecError::InvalidPort { port, reason };
    let n: i64 = match port {
        IntOrString::Int(n) => i64::from(*n),
        IntOrString::String(name) => {
            let named = container
                .ports
                .as_deref()
                .unwrap_or_default()
                .iter()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .map(|p| i64::from(p.container_port));
            match named {
                Some(n) => n,
                None => name.parse::<i64>().map_err(|_| {
                    invalid(
                        name.clone(),
                        format!("no port named {name:?} in the container"),
                    )
                })?,
            }
        }
    };
    u16::try_from(n)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| invalid(n.to_string(), "must be in 1..=65535".to_string()))
}

fn normalize_path(path: &str) -> String {
    if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    }
}

/// `host:port`, with an IPv6 literal in brackets.
pub fn host_port(host: &str, port: u16) -> String {
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V6(_)) => format!("[{host}]:{port}"),
        _ => format!("{host}:{port}"),
    }
}

/// Why a `GET` produced no response.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HttpError {
    /// No response: connecting, the TLS handshake, writing the request or reading the response
    /// head failed, or the redirects went wrong. The message reads like Go's client errors
    /// (`Get "<url>": <reason>`), as the kubelet's events show them.
    #[error("Get \"{url}\": {reason}")]
    Transport {
        /// The URL of the failed hop.
        url: String,
        /// What failed.
        reason: String,
    },
    /// An `https` server answered with plain HTTP (Go's "server gave HTTP response to HTTPS
    /// client"); lifecycle hooks retry such a target over HTTP, as the kubelet does.
    #[error("Get \"{url}\": http: server gave HTTP response to HTTPS client")]
    HttpResponseToHttps {
        /// The URL of the failed hop.
        url: String,
    },
    /// The response head arrived but its body could not be read (cut short, malformed chunks).
    #[error("{0}")]
    Body(String),
}

/// The HTTP client. Cheap to clone; one per subsystem (it holds the user agent and the TLS
/// configuration).
#[derive(Clone)]
pub struct HttpClient {
    user_agent: String,
    /// The TLS connector, or why it could not be built (`https` requests then fail with it).
    #[cfg(feature = "tls")]
    tls: Result<tokio_rustls::TlsConnector, String>,
    max_body: usize,
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClient")
            .field("user_agent", &self.user_agent)
            .field("max_body", &self.max_body)
            .finish_non_exhaustive()
    }
}

impl HttpClient {
    /// A client that does not verify server certificates (the kubelet's `InsecureSkipVerify`,
    /// for probes and hooks; handshake signatures are still checked against the presented
    /// certificate), sending `user_agent` unless a request sets its own.
    pub fn insecure(user_agent: impl Into<String>) -> Self {
        Self {
            user_agent: user_agent.into(),
            #[cfg(feature = "tls")]
            tls: tls::insecure_tls_config()
                .map(|c| tokio_rustls::TlsConnector::from(Arc::new(c)))
                .map_err(|e| e.to_string()),
            max_body: DEFAULT_MAX_BODY,
        }
    }

    /// A client that verifies `https` servers with `config`.
    #[cfg(feature = "tls")]
    pub fn with_tls(user_agent: impl Into<String>, config: Arc<rustls::ClientConfig>) -> Self {
        Self {
            user_agent: user_agent.into(),
            tls: Ok(tokio_rustls::TlsConnector::from(config)),
            max_body: DEFAULT_MAX_BODY,
        }
    }

    /// Read at most `max` bytes of a body (default [`DEFAULT_MAX_BODY`]).
    pub fn max_body(mut self, max: usize) -> Self {
        self.max_body = max;
        self
    }

    /// The `User-Agent` sent by default.
    pub fn user_agent(&self) -> &str {
        &self.user_agent
    }

    /// `GET` `spec` from `host` (the spec's own host when it has one, else the given one, the pod
    /// IP), following same-host redirects. Not bounded in time: wrap it in the caller's timeout.
    pub async fn get(&self, spec: &HttpGetSpec, host: &str) -> Result<Response, HttpError> {
        let host = spec.host.as_deref().unwrap_or(host);
        let (headers, host_override) = request_headers(&self.user_agent, spec);
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
            let resp = self.once(&target, &headers).await?;
            if !matches!(resp.status, 301 | 302 | 303 | 307 | 308) {
                return Ok(resp);
            }
            let Some(loc) = &resp.location else {
                return Ok(resp);
            };
            let Some(next) = resolve_redirect(&target, loc, host_override.as_deref()) else {
                return Err(HttpError::Transport {
                    url: target.url(),
                    reason: format!("unsupported redirect location {loc:?}"),
                });
            };
            if !next.host.eq_ignore_ascii_case(first_host) {
                return Ok(resp);
            }
            if redirects >= MAX_REDIRECTS {
                return Err(HttpError::Transport {
                    url: next.url(),
                    reason: format!("stopped after {MAX_REDIRECTS} redirects"),
                });
            }
            redirects += 1;
            target = next;
        }
    }

    async fn once(
        &self,
        target: &Target,
        headers: &[(String, String)],
    ) -> Result<Response, HttpError> {
        let transport = |reason: String| HttpError::Transport {
            url: target.url(),
            reason,
        };
        let request = wire::request(
            &target.path,
            &target.authority,
            headers.iter().map(|(n, v)| (n.as_str(), v.as_str())),
        );
        let mut tcp = dial(&target.host, target.port, target.scheme == Scheme::Https)
            .await
            .map_err(|e| {
                transport(format!(
                    "dial tcp {}: {e}",
                    host_port(&target.host, target.port)
                ))
            })?;
        let from_wire = |e: wire::Error| match e {
            wire::Error::Transport(m) => transport(m),
            wire::Error::Body(m) => HttpError::Body(m),
        };
        match target.scheme {
            Scheme::Http => wire::exchange(&mut tcp, &request, self.max_body)
                .await
                .map_err(from_wire),
            #[cfg(not(feature = "tls"))]
            Scheme::Https => Err(transport(
                "https is not available: kubelet-core was built without its `tls` feature"
                    .to_string(),
            )),
            #[cfg(feature = "tls")]
            Scheme::Https => {
                let name = match target.host.parse::<IpAddr>() {
                    Ok(ip) => ServerName::IpAddress(ip.into()),
                    Err(_) => ServerName::try_from(target.host.clone())
                        .map_err(|e| transport(format!("invalid TLS server name: {e}")))?,
                };
                let connector = self
                    .tls
                    .as_ref()
                    .map_err(|e| transport(format!("tls: {e}")))?;
                // Boxed (the handshake and the TLS state are large, and would make every
                // caller's future as large).
                let mut stream =
                    Box::new(Box::pin(connector.connect(name, tcp)).await.map_err(|e| {
                        if tls::is_plain_http_answer(&e) {
                            HttpError::HttpResponseToHttps { url: target.url() }
                        } else {
                            transport(format!("tls: {e}"))
                        }
                    })?);
                wire::exchange(&mut stream, &request, self.max_body)
                    .await
                    .map_err(from_wire)
            }
        }
    }
}

/// Connect with `SO_LINGER` 0, so that closing the socket sends a reset instead of leaving a
/// `TIME-WAIT` entry behind (thousands of probes a second would otherwise exhaust ephemeral
/// ports). The kubelet uses a 1 s linger for the same reason; a non-zero linger would block a
/// runtime thread in `close`, so this uses 0. For the same reason requests do not send
/// `Connection: close` (Go does, as its keep-alives are off): the server then keeps the
/// connection open after the response and the client, closing first with a reset, leaves no
/// `TIME-WAIT` on either side. `nodelay` turns Nagle off (for TLS, whose handshake and request
/// are separate writes; a plain request is one write).
pub async fn dial(host: &str, port: u16, nodelay: bool) -> std::io::Result<TcpStream> {
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

/// One hop: where to connect and what to ask.
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

/// Header lines of a request (besides `Host`) and the `Host` override, as the kubelet builds
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
            tracing::debug!(header = %name, "invalid request header name ignored");
            continue;
        }
        if !valid_value(value) {
            tracing::debug!(header = %name, "invalid request header value ignored");
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
    let (host, port) = if let Some(stripped) = authority.strip_prefix('[') {
        let (h, after) = stripped.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None => scheme.default_port(),
        };
        (h.to_string(), port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), p.parse().ok()?),
            None => (authority.to_string(), scheme.default_port()),
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
