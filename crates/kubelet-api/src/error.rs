//! [`Error`]: what trait implementors (runtimes, sinks, volume plugins, sources) report, with
//! an [`ErrorKind`] the engine branches on.

use std::fmt;

/// What kind of failure a trait implementor reports, so the engine can branch on it.
///
/// The kinds follow gRPC status codes where a CRI runtime would report one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The object (container, sandbox, image, pod) does not exist.
    NotFound,
    /// The object already exists.
    AlreadyExists,
    /// The request was malformed or names something impossible.
    InvalidArgument,
    /// The backend cannot be reached right now; retrying later may work.
    Unavailable,
    /// The call did not finish within its deadline.
    DeadlineExceeded,
    /// The caller lacks a privilege the operation needs (for example root for cgroups).
    PermissionDenied,
    /// The backend does not implement this optional operation.
    Unimplemented,
    /// The backend is in a state that does not allow the operation.
    FailedPrecondition,
    /// A resource the operation needs is used up: the disk is full (`ENOSPC`), a quota is
    /// reached. Retrying once some is freed may work.
    ResourceExhausted,
    /// The backend failed in a way it could not classify further.
    Internal,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            ErrorKind::NotFound => "not found",
            ErrorKind::AlreadyExists => "already exists",
            ErrorKind::InvalidArgument => "invalid argument",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::DeadlineExceeded => "deadline exceeded",
            ErrorKind::PermissionDenied => "permission denied",
            ErrorKind::Unimplemented => "unimplemented",
            ErrorKind::FailedPrecondition => "failed precondition",
            ErrorKind::ResourceExhausted => "resource exhausted",
            ErrorKind::Internal => "internal error",
        };
        f.write_str(s)
    }
}

/// The error type every SDK trait returns: a [`ErrorKind`], a message, and an optional cause.
#[derive(Debug, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl Error {
    /// A new error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// Attach the underlying cause.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// Shorthand for [`ErrorKind::NotFound`].
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    /// Shorthand for [`ErrorKind::InvalidArgument`].
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }

    /// Shorthand for [`ErrorKind::Unavailable`].
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, message)
    }

    /// The answer of a runtime (or another implementor) that does not offer an optional
    /// capability: [`ErrorKind::Unimplemented`] with the message `<capability> is not supported
    /// by this runtime`. Callers test [`is_unsupported`](Self::is_unsupported) and fall back
    /// (relisting without events, the node filesystem without an image filesystem) or report
    /// the message as is.
    pub fn unsupported(capability: &str) -> Self {
        Self::new(
            ErrorKind::Unimplemented,
            format!("{capability} is not supported by this runtime"),
        )
    }

    /// True when the implementor does not offer the operation ([`ErrorKind::Unimplemented`]).
    pub fn is_unsupported(&self) -> bool {
        self.kind == ErrorKind::Unimplemented
    }

    /// Shorthand for [`ErrorKind::Internal`].
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }

    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message, without the kind prefix.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// True when the error says the object does not exist.
    pub fn is_not_found(&self) -> bool {
        self.kind == ErrorKind::NotFound
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        let kind = match e.kind() {
            std::io::ErrorKind::NotFound => ErrorKind::NotFound,
            std::io::ErrorKind::AlreadyExists => ErrorKind::AlreadyExists,
            std::io::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
            std::io::ErrorKind::InvalidInput | std::io::ErrorKind::InvalidData => {
                ErrorKind::InvalidArgument
            }
            std::io::ErrorKind::TimedOut => ErrorKind::DeadlineExceeded,
            _ => ErrorKind::Internal,
        };
        Error::new(kind, e.to_string()).with_source(e)
    }
}

/// Shorthand result type for SDK traits.
pub type Result<T, E = Error> = std::result::Result<T, E>;
