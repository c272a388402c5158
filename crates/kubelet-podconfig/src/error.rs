//! [`PodConfigError`]: what can go wrong reading static pod manifests.

use std::path::PathBuf;

/// Errors of the pod sources in this crate. Each names the manifest (or directory) and the
/// operation that failed. None of them stops a source: they are logged, recorded as
/// `FailedValidation` warning events, and the offending file is skipped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PodConfigError {
    /// Listing the manifest directory failed.
    #[error("listing static pod directory {path}: {source}")]
    ListManifestDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Reading a manifest file failed.
    #[error("reading static pod manifest {path}: {source}")]
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
    #[error("watching static pod path {path}: {source}")]
    Watch {
        /// The watched path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl PodConfigError {
    /// The manifest file or directory the error is about.
    pub fn path(&self) -> &std::path::Path {
        match self {
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
