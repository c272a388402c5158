//! [`HttpSource`]: static pods from a manifest URL (the kubelet's `--manifest-url`), a
//! [`PodSource`] named `http`.
//!
//! - The URL is fetched at start and then every [`HttpSourceConfig::check_frequency`] (20 s, the
//!   kubelet's `httpCheckFrequency`), with a client timeout of [`HttpSourceConfig::timeout`]
//!   (10 s) and the configured headers (`--manifest-url-header`).
//! - The body is one `v1` `Pod` or a `v1` `PodList`, YAML or JSON, at most 10 MiB. Every pod gets
//!   the static pod defaults (UID hash over the pod and `url:<url>`, `<name>-<node>`, …) and full
//!   validation; as in the kubelet, one invalid pod rejects the whole body.
//! - A body byte-identical to the last one is a no-op. A non-200 answer, a transport error or an
//!   invalid body keeps the last good set. An empty body sends an empty snapshot (the source
//!   counts as seen, its pods are removed) and is logged as a failure.
//! - Failures are logged with the kubelet's rate limiting: the first three at warning level, the
//!   fourth says "Dropping verbosity of this message", later ones at debug level; the first
//!   success after failures logs "Successfully read pods from URL". Invalid bodies are also
//!   recorded as `FailedValidation` warning events, once per distinct error.
//! - `https://` URLs are verified against the system's roots, or only against the CAs of
//!   [`HttpSourceConfig::ca_file`] when set (rustls; no native TLS library).

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use hyper::Uri;
use hyper::header::{HeaderName, HeaderValue};
use k8s_openapi::api::core::v1::Pod;
use kubelet_api::sources;
use kubelet_api::{InvolvedObject, PodSource, SourceSender};
use kubelet_core::merge::REASON_FAILED_VALIDATION;
use kubelet_net::http::{HttpClient, HttpGetSpec, Scheme};
use tokio_util::sync::CancellationToken;

use crate::error::PodConfigError;
use crate::manifest::{self, MAX_MANIFEST_SIZE, ManifestOrigin};
use crate::validation::ValidationOptions;

/// Settings of an [`HttpSource`]. Start from [`Default`] and adjust with the setters.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HttpSourceConfig {
    /// Poll period (kubelet `httpCheckFrequency`, default 20 s).
    pub check_frequency: Duration,
    /// Timeout of one fetch, connect to last body byte (default 10 s, as the kubelet's client).
    pub timeout: Duration,
    /// Headers sent with every request (`--manifest-url-header`), in order.
    pub headers: Vec<(String, String)>,
    /// PEM file of the CAs that verify an `https://` URL (default: the system's roots).
    pub ca_file: Option<PathBuf>,
    /// How pods are validated (default: static pods without API references).
    pub validation: ValidationOptions,
}

impl Default for HttpSourceConfig {
    fn default() -> Self {
        Self {
            check_frequency: Duration::from_secs(20),
            timeout: Duration::from_secs(10),
            headers: Vec::new(),
            ca_file: None,
            validation: ValidationOptions::static_pod(),
        }
    }
}

impl HttpSourceConfig {
    /// Set the poll period.
    pub fn check_frequency(mut self, period: Duration) -> Self {
        self.check_frequency = period;
        self
    }

    /// Set the fetch timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Add a header sent with every request.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Trust only the CAs in this PEM file for `https://` URLs.
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_file = Some(path.into());
        self
    }

    /// Allow static pods to reference API objects (set when the agent has an API source).
    pub fn allow_api_references(mut self, allow: bool) -> Self {
        self.validation = self.validation.allow_api_references(allow);
        self
    }
}

/// Why a `--manifest-url-header` value is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderError {
    /// No `:` between name and value.
    #[error("header {0:?} is not of the form Name:Value")]
    NotNameValue(String),
    /// The name is not an HTTP header name.
    #[error("header name {name:?}: {reason}")]
    Name {
        /// The name as written.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The value is not an HTTP header value.
    #[error("header value of {name:?}: {reason}")]
    Value {
        /// The header's name.
        name: String,
        /// What is wrong with the value.
        reason: String,
    },
}

/// Parse a `--manifest-url-header` value, `Name:Value` (the value may contain `:`; surrounding
/// spaces of the value are trimmed).
pub fn parse_header(text: &str) -> Result<(String, String), HeaderError> {
    let (name, value) = text
        .split_once(':')
        .ok_or_else(|| HeaderError::NotNameValue(text.to_string()))?;
    let name = name.trim();
    HeaderName::from_bytes(name.as_bytes()).map_err(|e| HeaderError::Name {
        name: name.to_string(),
        reason: e.to_string(),
    })?;
    let value = value.trim();
    HeaderValue::from_str(value).map_err(|e| HeaderError::Value {
        name: name.to_string(),
        reason: e.to_string(),
    })?;
    Ok((name.to_string(), value.to_string()))
}

/// Static pods from a manifest URL: a [`PodSource`] named `http`. See the
/// [module docs](self).
#[derive(Clone)]
pub struct HttpSource {
    url: String,
    uri: Uri,
    node_name: String,
    config: HttpSourceConfig,
    /// The request: path, `Host` and the configured headers.
    request: HttpGetSpec,
    client: HttpClient,
}

/// `User-Agent` of manifest fetches (the kubelet's client sends Go's default).
const USER_AGENT: &str = "Go-http-client/1.1";

impl std::fmt::Debug for HttpSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpSource")
            .field("url", &self.url)
            .field("node_name", &self.node_name)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl HttpSource {
    /// A source polling `url` for node `node_name`. Fails on a URL that is not `http://` or
    /// `https://`, a header that is not valid HTTP, or (for `https://`) a CA file that cannot be
    /// loaded.
    pub fn new(
        url: impl Into<String>,
        node_name: impl Into<String>,
        config: HttpSourceConfig,
    ) -> Result<Self, PodConfigError> {
        let url = url.into();
        let invalid = |reason: String| PodConfigError::InvalidUrl {
            url: url.clone(),
            reason,
        };
        let uri: Uri = url.parse().map_err(|e| invalid(format!("{e}")))?;
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            other => return Err(invalid(format!("unsupported scheme {other:?}"))),
        };
        if uri.host().is_none_or(str::is_empty) {
            return Err(invalid("no host".to_string()));
        }
        let (scheme, default_port) = if https {
            (Scheme::Https, 443)
        } else {
            (Scheme::Http, 80)
        };
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        let mut request = HttpGetSpec::new(scheme, uri.port_u16().unwrap_or(default_port), path)
            // The URL's authority as written, as Go's client sends it.
            .header("Host", uri.authority().map_or("", |a| a.as_str()));
        for (name, value) in &config.headers {
            HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| invalid(format!("header name {name:?}: {e}")))?;
            HeaderValue::from_str(value)
                .map_err(|e| invalid(format!("header value of {name:?}: {e}")))?;
            request = request.header(name.clone(), value.clone());
        }
        #[cfg(not(feature = "tls"))]
        if https {
            return Err(invalid(
                "https manifest URLs need kubelet-podconfig's `tls` feature, which this build does not have".to_string(),
            ));
        }
        let client = if https {
            #[cfg(feature = "tls")]
            let client = HttpClient::with_tls(
                USER_AGENT,
                kubelet_net::tls::client_config(config.ca_file.as_deref(), None)?,
            );
            #[cfg(not(feature = "tls"))]
            let client = HttpClient::insecure(USER_AGENT);
            client
        } else {
            HttpClient::insecure(USER_AGENT)
        }
        .max_body(MAX_MANIFEST_SIZE as usize);
        Ok(Self {
            url,
            uri,
            node_name: node_name.into(),
            config,
            request,
            client,
        })
    }

    /// The URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The settings.
    pub fn config(&self) -> &HttpSourceConfig {
        &self.config
    }

    /// Fetch the URL once: the status code and the body (at most 10 MiB), within the timeout.
    pub async fn fetch(&self) -> Result<(u16, Bytes), PodConfigError> {
        match tokio::time::timeout(self.config.timeout, self.fetch_inner()).await {
            Ok(r) => r,
            Err(_) => Err(self.fetch_err(format!(
                "timed out after {:?} (Client.Timeout exceeded)",
                self.config.timeout
            ))),
        }
    }

    fn fetch_err(&self, reason: impl std::fmt::Display) -> PodConfigError {
        PodConfigError::FetchUrl {
            url: self.url.clone(),
            reason: reason.to_string(),
        }
    }

    async fn fetch_inner(&self) -> Result<(u16, Bytes), PodConfigError> {
        let host = self.uri.host().unwrap_or_default();
        // IPv6 literals come bracketed in URLs.
        let dial_host = host.trim_start_matches('[').trim_end_matches(']');
        let resp = self
            .client
            .get(&self.request, dial_host)
            .await
            .map_err(|e| self.fetch_err(e))?;
        if resp.truncated {
            return Err(PodConfigError::BodyTooLarge {
                url: self.url.clone(),
                limit: MAX_MANIFEST_SIZE,
            });
        }
        Ok((resp.status, Bytes::from(resp.body)))
    }

    /// Decode, default and validate a body.
    fn decode(&self, data: &[u8]) -> Result<Vec<Pod>, (PodConfigError, Option<Box<Pod>>)> {
        let mut pods = manifest::decode_pods(&self.url, data).map_err(|e| (e, None))?;
        for pod in &mut pods {
            if let Err(e) = manifest::apply_defaults_with(
                pod,
                ManifestOrigin::Url(&self.url),
                &self.node_name,
                &self.config.validation,
            ) {
                let named = pod.metadata.name.is_some().then(|| Box::new(pod.clone()));
                return Err((e, named));
            }
        }
        Ok(pods)
    }
}

/// The kubelet's rate limiting of URL failure logs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FailureLog {
    failures: u32,
}

/// How loudly to log a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureLevel {
    /// One of the first three failures in a row: a warning.
    Warn,
    /// The fourth: a warning saying verbosity is dropped.
    DroppingVerbosity,
    /// Later ones: debug.
    Debug,
}

impl FailureLog {
    /// Count a failure; returns how to log it.
    pub fn failure(&mut self) -> FailureLevel {
        self.failures = self.failures.saturating_add(1);
        match self.failures {
            1..=3 => FailureLevel::Warn,
            4 => FailureLevel::DroppingVerbosity,
            _ => FailureLevel::Debug,
        }
    }

    /// Count a success; true if it ends a run of failures (log "Successfully read pods from
    /// URL").
    pub fn success(&mut self) -> bool {
        std::mem::take(&mut self.failures) > 0
    }
}

/// What the poll loop remembers between fetches.
#[derive(Debug, Default)]
struct PollState {
    last_body: Option<Bytes>,
    log: FailureLog,
    reported: Option<String>,
}

#[async_trait]
impl PodSource for HttpSource {
    fn name(&self) -> &str {
        sources::HTTP
    }

    async fn run(&self, out: SourceSender, shutdown: CancellationToken) {
        tracing::info!(url = %self.url, period = ?self.config.check_frequency, "polling manifest URL");
        let mut state = PollState::default();
        let mut ticker = tokio::time::interval(self.config.check_frequency);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticker.tick() => {}
            }
            let fetched = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = self.fetch() => r,
            };
            match self.poll_once(&mut state, fetched) {
                Poll::Unchanged => {}
                Poll::Failed(err) => self.log_failure(&mut state, &err),
                Poll::Snapshot(pods, err) => {
                    if out.snapshot(pods).await.is_err() {
                        return;
                    }
                    match err {
                        Some(err) => self.log_failure(&mut state, &err),
                        None => {
                            if state.log.success() {
                                tracing::info!(url = %self.url, "Successfully read pods from URL");
                            }
                        }
                    }
                }
                Poll::Invalid(err, pod) => {
                    self.log_failure(&mut state, &err);
                    let message = kubelet_api::chain(&err).to_string();
                    if state.reported.as_deref() != Some(message.as_str()) {
                        let involved = match pod.as_ref() {
                            Some(p) => InvolvedObject::pod(p),
                            None => InvolvedObject::file(std::path::Path::new(&self.url)),
                        };
                        out.recorder()
                            .warning(involved, REASON_FAILED_VALIDATION, message.clone());
                        state.reported = Some(message);
                    }
                }
            }
        }
    }
}

/// The outcome of one fetch.
enum Poll {
    /// The body did not change: nothing to do.
    Unchanged,
    /// Fetch failed: keep the last good set.
    Failed(PodConfigError),
    /// Send this snapshot (with the error to log, for an empty body).
    Snapshot(Vec<Pod>, Option<PodConfigError>),
    /// The body is invalid: keep the last good set, report.
    Invalid(PodConfigError, Option<Box<Pod>>),
}

impl HttpSource {
    fn poll_once(
        &self,
        state: &mut PollState,
        fetched: Result<(u16, Bytes), PodConfigError>,
    ) -> Poll {
        let body = match fetched {
            Err(e) => return Poll::Failed(e),
            Ok((200, body)) => body,
            Ok((status, _)) => {
                return Poll::Failed(PodConfigError::UrlStatus {
                    url: self.url.clone(),
                    status,
                });
            }
        };
        if body.is_empty() {
            // Forget the last body, so the same pods served again are sent again.
            state.last_body = None;
            state.reported = None;
            return Poll::Snapshot(
                Vec::new(),
                Some(PodConfigError::EmptyBody {
                    url: self.url.clone(),
                }),
            );
        }
        if state.last_body.as_ref() == Some(&body) {
            return Poll::Unchanged;
        }
        state.last_body = Some(body.clone());
        match self.decode(&body) {
            Ok(pods) => {
                state.reported = None;
                Poll::Snapshot(pods, None)
            }
            Err((e, pod)) => Poll::Invalid(e, pod),
        }
    }

    fn log_failure(&self, state: &mut PollState, err: &PodConfigError) {
        match state.log.failure() {
            FailureLevel::Warn => {
                tracing::warn!(url = %self.url, error = %kubelet_api::chain(&err), "Failed to read pods from URL")
            }
            FailureLevel::DroppingVerbosity => tracing::warn!(
                url = %self.url,
                error = %kubelet_api::chain(&err),
                "Failed to read pods from URL. Dropping verbosity of this message to V(4)"
            ),
            FailureLevel::Debug => {
                tracing::debug!(url = %self.url, error = %kubelet_api::chain(&err), "Failed to read pods from URL")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_log_three_warnings_then_drop_verbosity() {
        let mut log = FailureLog::default();
        let levels: Vec<FailureLevel> = (0..6).map(|_| log.failure()).collect();
        assert_eq!(
            levels,
            [
                FailureLevel::Warn,
                FailureLevel::Warn,
                FailureLevel::Warn,
                FailureLevel::DroppingVerbosity,
                FailureLevel::Debug,
                FailureLevel::Debug
            ]
        );
        assert!(log.success(), "a success after failures is announced");
        assert!(!log.success(), "only once");
        assert_eq!(log.failure(), FailureLevel::Warn, "the count starts over");
    }

    #[test]
    fn headers_parse_as_name_colon_value() {
        assert_eq!(
            parse_header("Authorization: Bearer a:b"),
            Ok(("Authorization".to_string(), "Bearer a:b".to_string()))
        );
        assert_eq!(
            parse_header("no-colon"),
            Err(HeaderError::NotNameValue("no-colon".into()))
        );
        assert!(matches!(
            parse_header("bad name:x"),
            Err(HeaderError::Name { name, .. }) if name == "bad name"
        ));
        assert!(matches!(
            parse_header("X-A:bad\u{7f}value"),
            Err(HeaderError::Value { name, .. }) if name == "X-A"
        ));
    }

    #[test]
    fn only_http_and_https_urls_with_a_host_are_accepted() {
        let new = |u: &str| HttpSource::new(u, "n", HttpSourceConfig::default());
        assert!(new("http://127.0.0.1:8080/pods").is_ok());
        assert!(matches!(
            new("ftp://example.com/x"),
            Err(PodConfigError::InvalidUrl { .. })
        ));
        assert!(matches!(
            new("/etc/x"),
            Err(PodConfigError::InvalidUrl { .. })
        ));
        let missing_ca = HttpSource::new(
            "https://example.com/",
            "n",
            HttpSourceConfig::default().ca_file("/nonexistent/ca.pem"),
        );
        match missing_ca {
            Err(e @ PodConfigError::Tls(_)) => {
                assert_eq!(e.path(), std::path::Path::new("/nonexistent/ca.pem"));
            }
            other => panic!(
                "expected a TLS error naming the CA file, got {:?}",
                other.err()
            ),
        }
    }
}
