//! The crate's error type.

/// What can go wrong turning a Kubernetes probe into something the prober runs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProbeError {
    /// The probe sets no handler (`exec`, `httpGet`, `tcpSocket`, `grpc`), or more than one.
    #[error("probe of container {container:?} must set exactly one handler, found {found}")]
    HandlerCount {
        /// Container name.
        container: String,
        /// How many handlers the probe sets.
        found: usize,
    },
    /// A port is neither a number in 1..=65535 nor the name of one of the container's ports.
    #[error("invalid port {port:?} in probe of container {container:?}: {reason}")]
    InvalidPort {
        /// Container name.
        container: String,
        /// The port as written.
        port: String,
        /// Why it is invalid.
        reason: String,
    },
    /// A field is out of range (for example a period below 1 second).
    #[error("invalid {field} in probe of container {container:?}: {reason}")]
    InvalidField {
        /// Container name.
        container: String,
        /// The field (`periodSeconds`, `scheme`, …).
        field: &'static str,
        /// Why it is invalid.
        reason: String,
    },
}
