//! [`KubeletError`]: the engine's own errors (building and running the agent).

// The seams' error, under the path the engine's modules use.
pub(crate) use kubelet_api::{Error, ErrorKind, Result};

/// Errors of the engine's own operations (building and running the agent).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KubeletError {
    /// `build()` was called without a container runtime.
    #[error("no container runtime configured: call KubeletBuilder::runtime")]
    BuildMissingRuntime,
    /// `build()` was called without a pod lifecycle event generator.
    #[error("no pod lifecycle event generator configured: call KubeletBuilder::pleg")]
    BuildMissingPleg,
    /// Two pod sources were registered under one name.
    #[error("pod source {0:?} registered twice")]
    BuildDuplicateSource(String),
    /// The node name is not a valid DNS-1123 subdomain.
    #[error("invalid node name {name:?}: {reason}")]
    BuildInvalidNodeName {
        /// The rejected name.
        name: String,
        /// Why it was rejected.
        reason: String,
    },
    /// Two plugins were registered under one name.
    #[error("plugin {0:?} registered twice")]
    BuildDuplicatePlugin(String),
    /// A plugin provides ConfigMaps and Secrets while another provider is already set.
    #[error("plugin {0:?} provides an object provider, but one is already configured")]
    BuildDuplicateObjectProvider(String),
    /// Two plugins provide the same service.
    #[error(transparent)]
    BuildDuplicateService(#[from] kubelet_api::ServiceConflict),
    /// A configured directory could not be made absolute.
    #[error("resolving directory {path}")]
    ResolveDir {
        /// The directory as configured.
        path: std::path::PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Creating the agent's root directory failed.
    #[error("creating root directory {path}")]
    CreateRootDir {
        /// The directory.
        path: std::path::PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}
