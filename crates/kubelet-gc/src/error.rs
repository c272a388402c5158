//! [`GcError`]: what the garbage collectors report.

/// Errors of the garbage collectors. None stops the agent: each run reports its error (an
/// event on the Node when the kubelet emits one) and the next run tries again.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GcError {
    /// The configuration is invalid.
    #[error("invalid garbage collection configuration: {0}")]
    InvalidConfig(String),
    /// A runtime call failed.
    #[error("{op}: {source}")]
    Runtime {
        /// The call (`list_images`, `list_containers`, …).
        op: &'static str,
        /// The runtime's error.
        #[source]
        source: kubelet_api::Error,
    },
    /// The image filesystem reports no capacity (the kubelet's `InvalidDiskCapacity`).
    #[error("invalid capacity 0 on image filesystem")]
    InvalidDiskCapacity,
    /// Image GC could not free what the high threshold asks for (`FreeDiskSpaceFailed`).
    #[error(
        "Failed to garbage collect required amount of images. Attempted to free {wanted} bytes, but only found {freed} bytes eligible to free."
    )]
    FreeDiskSpace {
        /// Bytes to free.
        wanted: u64,
        /// Bytes freed.
        freed: u64,
    },
    /// A file of a container's log could not be handled.
    #[error("{op} {path}: {source}")]
    Log {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: std::path::PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The garbage collector's plugin is not running (a reclaim asked before the agent runs).
    #[error("the garbage collector is not running")]
    NotRunning,
}

impl GcError {
    pub(crate) fn runtime(op: &'static str) -> impl FnOnce(kubelet_api::Error) -> Self {
        move |source| GcError::Runtime { op, source }
    }
}

impl From<GcError> for kubelet_api::Error {
    fn from(e: GcError) -> Self {
        use kubelet_api::ErrorKind;
        let kind = match &e {
            GcError::InvalidConfig(_) => ErrorKind::InvalidArgument,
            GcError::Runtime { source, .. } => source.kind(),
            GcError::InvalidDiskCapacity | GcError::FreeDiskSpace { .. } => {
                ErrorKind::ResourceExhausted
            }
            GcError::Log { .. } => ErrorKind::Internal,
            GcError::NotRunning => ErrorKind::Unavailable,
        };
        kubelet_api::Error::new(kind, e.to_string())
    }
}
