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

/// The error type every SDK trait returns: a [`ErrorKind`], a complete message, and an
/// optional cause.
///
/// It crosses the seams as a kind and a message (as a gRPC status does): the message names the
/// cause already, so the cause attached with [`with_source`](Self::with_source) is kept for
/// inspection ([`cause`](Self::cause)) but not returned by
/// [`source`](std::error::Error::source), and a chain printer ([`chain`]) names it once.
#[derive(Debug, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
    cause: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl Error {
    /// A new error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            cause: None,
        }
    }

    /// Attach the underlying cause, whose text the message already contains (for example
    /// `Error::new(kind, chain(&e).to_string()).with_source(e)`).
    pub fn with_source(mut self, cause: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.cause = Some(Box::new(cause));
        self
    }

    /// The underlying cause, if one was attached, for inspection (`downcast_ref`).
    pub fn cause(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        self.cause.as_deref()
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

    /// Shorthand for [`ErrorKind::AlreadyExists`].
    pub fn already_exists(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::AlreadyExists, message)
    }

    /// Shorthand for [`ErrorKind::DeadlineExceeded`]: what `exec_sync` returns when the
    /// command outlives its timeout.
    pub fn deadline_exceeded(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::DeadlineExceeded, message)
    }

    /// Shorthand for [`ErrorKind::PermissionDenied`].
    pub fn permission_denied(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::PermissionDenied, message)
    }

    /// Shorthand for [`ErrorKind::FailedPrecondition`]: what `exec_sync` returns for a
    /// container that is not running, and a call on an object in the wrong state.
    pub fn failed_precondition(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::FailedPrecondition, message)
    }

    /// Shorthand for [`ErrorKind::ResourceExhausted`].
    pub fn resource_exhausted(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::ResourceExhausted, message)
    }

    /// Shorthand for [`ErrorKind::Unimplemented`] with a message of your own (see
    /// [`unsupported`](Self::unsupported) for the usual one).
    pub fn unimplemented(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unimplemented, message)
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

/// Displays an error and each of its [`source`](std::error::Error::source)s, joined by `": "`
/// (as `anyhow`'s `{:#}`). The SDK's typed errors name their cause only through `source`, never
/// in their own message as well, so a log line or an event message shows the whole chain, each
/// cause once, through this.
///
/// ```
/// # use kubelet_api::chain;
/// #[derive(Debug, thiserror::Error)]
/// #[error("binding 127.0.0.1:10248")]
/// struct Bind(#[source] std::io::Error);
///
/// let e = Bind(std::io::Error::from(std::io::ErrorKind::AddrInUse));
/// assert_eq!(chain(&e).to_string(), "binding 127.0.0.1:10248: address in use");
/// ```
pub fn chain<E: std::error::Error + ?Sized>(error: &E) -> ErrorChain<'_, E> {
    ErrorChain(error)
}

/// The display of an error with its sources; see [`chain`].
#[derive(Debug, Clone, Copy)]
pub struct ErrorChain<'a, E: ?Sized>(&'a E);

impl<E: std::error::Error + ?Sized> fmt::Display for ErrorChain<'_, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut next = self.0.source();
        while let Some(e) = next {
            write!(f, ": {e}")?;
            next = e.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("reading {0}")]
    struct Read(&'static str, #[source] std::io::Error);

    #[test]
    fn every_kind_has_a_shorthand() {
        type Make = fn(String) -> Error;
        let made: [(Make, ErrorKind); 10] = [
            (|m| Error::not_found(m), ErrorKind::NotFound),
            (|m| Error::already_exists(m), ErrorKind::AlreadyExists),
            (|m| Error::invalid_argument(m), ErrorKind::InvalidArgument),
            (|m| Error::unavailable(m), ErrorKind::Unavailable),
            (|m| Error::deadline_exceeded(m), ErrorKind::DeadlineExceeded),
            (|m| Error::permission_denied(m), ErrorKind::PermissionDenied),
            (|m| Error::unimplemented(m), ErrorKind::Unimplemented),
            (
                |m| Error::failed_precondition(m),
                ErrorKind::FailedPrecondition,
            ),
            (
                |m| Error::resource_exhausted(m),
                ErrorKind::ResourceExhausted,
            ),
            (|m| Error::internal(m), ErrorKind::Internal),
        ];
        for (make, kind) in made {
            let e = make("why".into());
            assert_eq!((e.kind(), e.message()), (kind, "why"));
            assert_eq!(e.to_string(), format!("{kind}: why"));
        }
    }

    #[test]
    fn a_chain_names_each_cause_once() {
        let e = Read("/x", std::io::Error::other("disk gone"));
        assert_eq!(e.to_string(), "reading /x");
        assert_eq!(chain(&e).to_string(), "reading /x: disk gone");

        // The seam's error carries the whole chain in its message; its cause is kept for
        // inspection and is not a `source`, so a chain of it names the cause once.
        let seam = Error::new(ErrorKind::Internal, chain(&e).to_string()).with_source(e);
        assert_eq!(
            chain(&seam).to_string(),
            "internal error: reading /x: disk gone"
        );
        assert!(std::error::Error::source(&seam).is_none());
        let cause = seam.cause().and_then(|c| c.downcast_ref::<Read>());
        assert_eq!(cause.map(|r| r.0), Some("/x"));
    }
}
