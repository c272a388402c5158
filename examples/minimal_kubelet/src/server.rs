//! The kubelet API's flags (`kubelet-server`): port 10250 over HTTPS, its certificate, and how
//! requests are authenticated and authorized. Named and parsed as the kubelet's.
//!
//! Defaults are the kubelet configuration file's, not its legacy flag defaults: anonymous
//! requests are refused (`--anonymous-auth=false`), bearer tokens are checked with the API
//! server (`--authentication-token-webhook=true`) and requests are authorized by it
//! (`--authorization-mode=Webhook`). The kubelet's flag defaults (anonymous allowed,
//! `AlwaysAllow`) leave exec and logs open to anyone who can reach the port. Without
//! `--kubeconfig` there is no API server to ask, so a standalone node denies every request
//! until it is given `--authorization-mode=AlwaysAllow` and `--client-ca-file`.

use std::path::PathBuf;

use kubelet::KubeletConfiguration;

/// The kubelet API's flags.
#[derive(Debug, clap::Args)]
pub(crate) struct ServerFlags {
    /// Port of the kubelet API (HTTPS); 0 disables it.
    #[arg(long = "port", default_value_t = 10250)]
    port: u16,
    /// CA bundle (PEM) client certificates must chain to; the user is the certificate's CN,
    /// its groups the O values.
    #[arg(long = "client-ca-file")]
    client_ca_file: Option<PathBuf>,
    /// Check bearer tokens with a TokenReview to the API server.
    #[arg(long = "authentication-token-webhook", default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    authentication_token_webhook: bool,
    /// How long TokenReview answers are cached.
    #[arg(long = "authentication-token-webhook-cache-ttl", default_value = "2m", value_parser = crate::parse_duration)]
    authentication_token_webhook_cache_ttl: std::time::Duration,
    /// Serve requests without credentials as system:anonymous (default: 401).
    #[arg(long = "anonymous-auth", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    anonymous_auth: bool,
    /// `Webhook` (a SubjectAccessReview per request) or `AlwaysAllow`.
    #[arg(long = "authorization-mode", default_value = "Webhook", value_parser = ["Webhook", "AlwaysAllow"])]
    authorization_mode: String,
    /// How long allowed SubjectAccessReview answers are cached.
    #[arg(long = "authorization-webhook-cache-authorized-ttl", default_value = "5m", value_parser = crate::parse_duration)]
    authorization_webhook_cache_authorized_ttl: std::time::Duration,
    /// How long denied SubjectAccessReview answers are cached.
    #[arg(long = "authorization-webhook-cache-unauthorized-ttl", default_value = "30s", value_parser = crate::parse_duration)]
    authorization_webhook_cache_unauthorized_ttl: std::time::Duration,
    /// Serving certificate (PEM, chain after the leaf). Unset: a self-signed pair in
    /// --cert-dir, generated once.
    #[arg(long = "tls-cert-file")]
    tls_cert_file: Option<PathBuf>,
    /// Key of --tls-cert-file.
    #[arg(long = "tls-private-key-file")]
    tls_private_key_file: Option<PathBuf>,
    /// `VersionTLS12` or `VersionTLS13`.
    #[arg(long = "tls-min-version", default_value = "")]
    tls_min_version: String,
    /// TLS 1.2 cipher suites allowed, comma-separated IANA names.
    #[arg(long = "tls-cipher-suites", default_value = "", value_delimiter = ',')]
    tls_cipher_suites: Vec<String>,
    /// Where the self-signed serving certificate is kept (default `<root-dir>/pki`).
    #[arg(long = "cert-dir")]
    pub(crate) cert_dir: Option<PathBuf>,
    /// Serve /containerLogs, /runningpods and /logs on the kubelet API.
    #[arg(long = "enable-debugging-handlers", default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    enable_debugging_handlers: bool,
}

/// The flags that are fields of the kubelet's configuration.
pub(crate) fn configure(
    flags: &ServerFlags,
    given: &crate::Given<'_>,
    c: &mut KubeletConfiguration,
) {
    if given.has("port") {
        c.port = flags.port;
    }
    if let Some(ca) = &flags.client_ca_file {
        c.authentication.x509.client_ca_file = ca.to_string_lossy().into_owned();
    }
    if given.has("authentication_token_webhook") {
        c.authentication.webhook.enabled = flags.authentication_token_webhook;
    }
    if given.has("authentication_token_webhook_cache_ttl") {
        c.authentication.webhook.cache_ttl = flags.authentication_token_webhook_cache_ttl.into();
    }
    if given.has("anonymous_auth") {
        c.authentication.anonymous.enabled = flags.anonymous_auth;
    }
    if given.has("authorization_mode") {
        c.authorization.mode = flags.authorization_mode.clone();
    }
    if given.has("authorization_webhook_cache_authorized_ttl") {
        c.authorization.webhook.cache_authorized_ttl =
            flags.authorization_webhook_cache_authorized_ttl.into();
    }
    if given.has("authorization_webhook_cache_unauthorized_ttl") {
        c.authorization.webhook.cache_unauthorized_ttl =
            flags.authorization_webhook_cache_unauthorized_ttl.into();
    }
    if let Some(f) = &flags.tls_cert_file {
        c.tls_cert_file = f.to_string_lossy().into_owned();
    }
    if let Some(f) = &flags.tls_private_key_file {
        c.tls_private_key_file = f.to_string_lossy().into_owned();
    }
    if given.has("tls_min_version") {
        c.tls_min_version = flags.tls_min_version.clone();
    }
    if given.has("tls_cipher_suites") {
        c.tls_cipher_suites = flags
            .tls_cipher_suites
            .iter()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
    }
    if given.has("enable_debugging_handlers") {
        c.enable_debugging_handlers = flags.enable_debugging_handlers;
    }
}
