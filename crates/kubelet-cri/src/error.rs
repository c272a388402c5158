//! [`CriError`], and how CRI failures map to the core's [`ErrorKind`].

use std::time::Duration;

use kubelet_api::{Error, ErrorKind};

/// What went wrong talking to a CRI runtime.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CriError {
    /// The endpoint is not a `unix://` URL (or a bare absolute socket path).
    #[error("invalid CRI endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// The runtime answered a call with an error status.
    #[error("CRI {op} failed: {} ({:?})", status.message(), status.code())]
    Rpc {
        /// The RPC (`RunPodSandbox`, `ListContainers`, …).
        op: &'static str,
        /// The gRPC status.
        #[source]
        status: tonic::Status,
    },
    /// The runtime did not answer within the call's deadline.
    #[error("CRI {op} did not answer within {timeout:?}")]
    Timeout {
        /// The RPC.
        op: &'static str,
        /// The deadline that passed.
        timeout: Duration,
    },
    /// The runtime answered with a message that lacks a required field.
    #[error("CRI {op} answered without {field}")]
    IncompleteResponse {
        /// The RPC.
        op: &'static str,
        /// The missing field.
        field: &'static str,
    },
    /// The runtime speaks another CRI API version than `v1`.
    #[error("runtime {runtime} speaks CRI API {api_version:?}, this client speaks v1")]
    UnsupportedApiVersion {
        /// Runtime name and version.
        runtime: String,
        /// The API version it reported.
        api_version: String,
    },
    /// containerd's native events API (`containerd.services.events.v1.Events/Subscribe`, what
    /// `container_events` uses on containerd releases without CRI `GetContainerEvents`) failed,
    /// or its event stream broke.
    #[error("containerd Events/Subscribe failed: {} ({:?})", status.message(), status.code())]
    SubscribeEvents {
        /// The gRPC status.
        #[source]
        status: tonic::Status,
    },
    /// The runtime implements neither CRI `GetContainerEvents` nor containerd's events API, so it
    /// pushes no container events (a PLEG then relies on relisting).
    #[error(
        "the runtime pushes no container events: CRI GetContainerEvents: {} ({:?}); containerd Events/Subscribe: {} ({:?})",
        cri.message(),
        cri.code(),
        containerd.message(),
        containerd.code()
    )]
    ContainerEventsUnsupported {
        /// What `GetContainerEvents` answered.
        cri: tonic::Status,
        /// What containerd's `Events/Subscribe` answered.
        containerd: tonic::Status,
    },
    /// A containerd event could not be decoded. The event stream skips such events (with a log
    /// line); this is what it logs.
    #[error("decoding containerd event {type_url:?} (topic {topic:?}): {reason}")]
    DecodeEvent {
        /// The event's topic (`/tasks/exit`, …).
        topic: String,
        /// The type URL of its payload.
        type_url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The containerd namespace of [`CriConfig`](crate::CriConfig) cannot be sent as gRPC
    /// metadata.
    #[error("invalid containerd namespace {namespace:?}: {reason}")]
    InvalidNamespace {
        /// The namespace as configured.
        namespace: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// Preparing a host file for the container (the termination message file) failed.
    #[error("preparing {path}")]
    PrepareHostFile {
        /// The file or directory.
        path: std::path::PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl CriError {
    /// The core error kind this failure maps to, so the engine can branch on it.
    pub fn kind(&self) -> ErrorKind {
        match self {
            CriError::InvalidEndpoint { .. } => ErrorKind::InvalidArgument,
            CriError::Rpc { status, .. } => status_kind(status),
            CriError::Timeout { .. } => ErrorKind::DeadlineExceeded,
            CriError::IncompleteResponse { .. } => ErrorKind::Internal,
            CriError::SubscribeEvents { status } => status_kind(status),
            CriError::ContainerEventsUnsupported { .. } => ErrorKind::Unimplemented,
            CriError::DecodeEvent { .. } => ErrorKind::Internal,
            CriError::InvalidNamespace { .. } => ErrorKind::InvalidArgument,
            CriError::UnsupportedApiVersion { .. } => ErrorKind::FailedPrecondition,
            CriError::PrepareHostFile { source, .. } => match source.kind() {
                std::io::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
                _ => ErrorKind::Internal,
            },
        }
    }
}

impl From<CriError> for Error {
    fn from(e: CriError) -> Self {
        Error::new(e.kind(), kubelet_api::chain(&e).to_string()).with_source(e)
    }
}

/// Maps a gRPC status to a core error kind.
///
/// containerd reports some conditions with `Unknown` and a telling message (an exec that ran out
/// of time, an object that is gone); those are recognised by their text. Transport failures (the
/// socket is gone, the connection was reset while containerd restarts) are `Unavailable`.
pub(crate) fn status_kind(status: &tonic::Status) -> ErrorKind {
    use tonic::Code;
    match status.code() {
        Code::NotFound => ErrorKind::NotFound,
        Code::AlreadyExists => ErrorKind::AlreadyExists,
        Code::InvalidArgument | Code::OutOfRange => ErrorKind::InvalidArgument,
        Code::Unavailable | Code::Cancelled | Code::Aborted | Code::ResourceExhausted => {
            ErrorKind::Unavailable
        }
        Code::DeadlineExceeded => ErrorKind::DeadlineExceeded,
        Code::PermissionDenied | Code::Unauthenticated => ErrorKind::PermissionDenied,
        Code::Unimplemented => ErrorKind::Unimplemented,
        Code::FailedPrecondition => ErrorKind::FailedPrecondition,
        Code::Unknown | Code::Internal | Code::DataLoss | Code::Ok => {
            let m = status.message().to_ascii_lowercase();
            if m.contains("deadline exceeded") || (m.contains("timeout") && m.contains("exceeded"))
            {
                ErrorKind::DeadlineExceeded
            } else if m.contains("not found") || m.contains("does not exist") {
                ErrorKind::NotFound
            } else if m.contains("transport error")
                || m.contains("connection refused")
                || m.contains("broken pipe")
                || m.contains("connection reset")
                || m.contains("error reading a body from connection")
            {
                ErrorKind::Unavailable
            } else {
                ErrorKind::Internal
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use tonic::{Code, Status};

    #[test]
    fn grpc_codes_map_to_core_kinds() {
        let table = [
            (Status::new(Code::NotFound, "x"), ErrorKind::NotFound),
            (Status::new(Code::Unavailable, "x"), ErrorKind::Unavailable),
            (
                Status::new(Code::DeadlineExceeded, "x"),
                ErrorKind::DeadlineExceeded,
            ),
            (
                Status::new(Code::InvalidArgument, "x"),
                ErrorKind::InvalidArgument,
            ),
            (
                Status::new(
                    Code::Unknown,
                    "timeout 1s exceeded: context deadline exceeded",
                ),
                ErrorKind::DeadlineExceeded,
            ),
            (
                Status::new(
                    Code::Unknown,
                    "an error occurred when try to find container \"x\": not found",
                ),
                ErrorKind::NotFound,
            ),
            (
                Status::new(Code::Unknown, "transport error"),
                ErrorKind::Unavailable,
            ),
            // hyper's message when the connection closes under a streaming response.
            (
                Status::new(Code::Unknown, "error reading a body from connection"),
                ErrorKind::Unavailable,
            ),
            (Status::new(Code::Unknown, "boom"), ErrorKind::Internal),
        ];
        for (status, kind) in table {
            let e: Error = CriError::Rpc { op: "Test", status }.into();
            assert_eq!(e.kind(), kind, "{e}");
        }
    }

    #[test]
    fn timeouts_are_deadline_exceeded() {
        let e: Error = CriError::Timeout {
            op: "ListContainers",
            timeout: Duration::from_secs(1),
        }
        .into();
        assert_eq!(e.kind(), ErrorKind::DeadlineExceeded);
        assert!(e.message().contains("ListContainers"));
    }
}
