//! [`PodConfigError`]: what can go wrong reading static pod manifests.

use std::path::PathBuf;

/// Errors of the pod sources in this crate. Each names the manifest (or directory) and the
/// operation that failed. None of them stops a source: they are logged, recorded as
/// `FailedValidation` warning events, and the offending file is skipped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PodConfigError {
    /// Listing the manifest directory failed.
    #[error("listing static pod directory {path}")]
    ListManifestDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Reading a manifest file failed.
    #[error("reading static pod manifest {path}")]
    ReadManifest {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The manifest is larger than the kubelet's `maxConfigLength`.
    #[error("static pod manifest {path} exceeds the maximum size of {limit} bytes")]
    ManifestTooLarge {
        /// The file.
        path: PathBuf,
        /// The limit, in bytes.
        limit: u64,
    },
    /// The manifest file is empty.
    #[error("static pod manifest {path} is empty")]
    EmptyManifest {
        /// The file.
        path: PathBuf,
    },
    /// The manifest is neither valid YAML nor valid JSON, or does not fit the Pod schema.
    #[error("decoding static pod manifest {path}: {reason}")]
    DecodeManifest {
        /// The file.
        path: PathBuf,
        /// What the decoder said.
        reason: String,
    },
    /// The manifest holds an object other than a single `v1` `Pod` (for example a `PodList`).
    #[error(
        "static pod manifest {path} holds a {kind:?} of apiVersion {api_version:?}; a manifest file must hold exactly one v1 Pod"
    )]
    UnsupportedKind {
        /// The file.
        path: PathBuf,
        /// The manifest's `kind` (empty if missing).
        kind: String,
        /// The manifest's `apiVersion` (empty if missing).
        api_version: String,
    },
    /// The pod failed defaulting or validation.
    #[error("invalid static pod manifest {path}: {}", reasons.join("; "))]
    InvalidPod {
        /// The file.
        path: PathBuf,
        /// Every problem found, in the API server's style
        /// (`spec.containers[1].name: Duplicate value: "app"`).
        reasons: Vec<String>,
    },
    /// Setting up the inotify watch on the manifest path failed (the periodic re-list goes on).
    #[error("watching static pod path {path}")]
    Watch {
        /// The watched path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The manifest URL is not an `http://` or `https://` URL with a host.
    #[error("invalid manifest URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Fetching the manifest URL failed (connect, TLS, timeout, or reading the body).
    #[error("fetching pods from URL {url}: {reason}")]
    FetchUrl {
        /// The URL.
        url: String,
        /// The cause.
        reason: String,
    },
    /// The manifest URL answered with a status other than 200.
    #[error("{url}: received status {status}; expected 200 OK")]
    UrlStatus {
        /// The URL.
        url: String,
        /// The HTTP status code.
        status: u16,
    },
    /// The manifest URL answered with an empty body (an empty snapshot was sent).
    #[error("zero-length data received from {url}")]
    EmptyBody {
        /// The URL.
        url: String,
    },
    /// The manifest URL's body is larger than the kubelet's `maxConfigLength`.
    #[error("manifest from URL {url} exceeds the maximum size of {limit} bytes")]
    BodyTooLarge {
        /// The URL.
        url: String,
        /// The limit, in bytes.
        limit: u64,
    },
    /// TLS material could not be loaded (the file is named in the error).
    #[cfg(feature = "tls")]
    #[error(transparent)]
    Tls(#[from] kubelet_net::tls::TlsError),
    /// A certificate, key or CA file could not be loaded.
    #[error("loading TLS material from {path}: {reason}")]
    LoadTls {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The push endpoint was configured without any way to authenticate clients.
    #[error(
        "the pod push endpoint needs a bearer token file or a client CA file (with a serving certificate); refusing to accept pods from anyone"
    )]
    PushNoAuthentication,
    /// The push endpoint could not bind its address.
    #[error("binding the pod push endpoint to {addr}")]
    PushBind {
        /// The address.
        addr: std::net::SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl PodConfigError {
    /// The manifest file, directory or URL the error is about.
    pub fn path(&self) -> &std::path::Path {
        match self {
            PodConfigError::InvalidUrl { url, .. }
            | PodConfigError::FetchUrl { url, .. }
            | PodConfigError::UrlStatus { url, .. }
            | PodConfigError::EmptyBody { url }
            | PodConfigError::BodyTooLarge { url, .. } => std::path::Path::new(url),
            PodConfigError::LoadTls { path, .. } => path,
            #[cfg(feature = "tls")]
            PodConfigError::Tls(e) => e.path().unwrap_or(std::path::Path::new("")),
            PodConfigError::PushNoAuthentication | PodConfigError::PushBind { .. } => {
                std::path::Path::new("")
            }
            PodConfigError::ListManifestDir { path, .. }
            | PodConfigError::ReadManifest { path, .. }
            | PodConfigError::ManifestTooLarge { path, .. }
            | PodConfigError::EmptyManifest { path }
            | PodConfigError::DecodeManifest { path, .. }
            | PodConfigError::UnsupportedKind { path, .. }
            | PodConfigError::InvalidPod { path, .. }
            | PodConfigError::Watch { path, .. } => path,
        }
    }
}
