//! [`ApiServerError`]: everything that can fail while talking to the API server.

use std::path::PathBuf;

/// Errors of the API server integration. Every variant names the operation that failed; API
/// errors keep the `kube` error (and so the server's status) as their source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApiServerError {
    /// The kubeconfig file could not be read or parsed.
    #[error("reading kubeconfig {path}")]
    ReadKubeconfig {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: crate::kubeconfig::KubeconfigFileError,
    },
    /// The kubeconfig names no usable cluster, user or credentials.
    #[error("loading kubeconfig {path}")]
    LoadKubeconfig {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// The node's client certificate could not be bootstrapped, read or stored.
    #[error("the node's client certificate")]
    Certificate(#[source] Box<crate::certificate::CertificateError>),
    /// The HTTP client could not be built from the configuration (TLS material, proxy).
    #[error("creating the API client")]
    CreateClient(#[source] kube::Error),
    /// `configMapAndSecretChangeDetectionStrategy` is none of the kubelet's values.
    #[error(
        "invalid configMapAndSecretChangeDetectionStrategy {0:?}: accepted values are Watch, Cache and Get"
    )]
    InvalidChangeDetectionStrategy(String),
    /// A `--node-labels` entry is not `key=value` with a valid key and value.
    #[error("invalid node label {label:?}: {reason}")]
    InvalidNodeLabel {
        /// The entry as given.
        label: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A `--register-with-taints` entry is not `key[=value]:Effect`.
    #[error("invalid taint {taint:?}: {reason}")]
    InvalidTaint {
        /// The entry as given.
        taint: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Creating or reading the Node object failed.
    #[error("registering node {node}")]
    RegisterNode {
        /// Node name.
        node: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Patching the Node's status failed.
    #[error("updating the status of node {node}")]
    UpdateNodeStatus {
        /// Node name.
        node: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Creating or renewing the node Lease failed.
    #[error("renewing the lease of node {node}")]
    RenewLease {
        /// Node name.
        node: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Patching a pod's status failed.
    #[error("patching the status of pod {pod}")]
    PatchPodStatus {
        /// `namespace/name`.
        pod: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Deleting a pod (a finished pod, or a stale mirror pod) failed.
    #[error("deleting pod {pod}")]
    DeletePod {
        /// `namespace/name`.
        pod: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Creating a mirror pod failed.
    #[error("creating mirror pod {pod}")]
    CreateMirrorPod {
        /// `namespace/name`.
        pod: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Posting or updating an event failed.
    #[error("posting event {reason} about {object}")]
    PostEvent {
        /// The event's reason.
        reason: String,
        /// `kind namespace/name` of the involved object.
        object: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// A patch could not be encoded.
    #[error("encoding a patch")]
    EncodePatch(#[source] serde_json::Error),
}

impl ApiServerError {
    /// The underlying API status code, if the API server answered with an error.
    pub fn status_code(&self) -> Option<u16> {
        let e = match self {
            ApiServerError::CreateClient(e)
            | ApiServerError::RegisterNode { source: e, .. }
            | ApiServerError::UpdateNodeStatus { source: e, .. }
            | ApiServerError::RenewLease { source: e, .. }
            | ApiServerError::PatchPodStatus { source: e, .. }
            | ApiServerError::DeletePod { source: e, .. }
            | ApiServerError::CreateMirrorPod { source: e, .. }
            | ApiServerError::PostEvent { source: e, .. } => e,
            _ => return None,
        };
        match e {
            kube::Error::Api(s) => Some(s.code),
            _ => None,
        }
    }
}

impl From<ApiServerError> for kubelet_api::Error {
    fn from(e: ApiServerError) -> Self {
        use kubelet_api::ErrorKind;
        let kind = match e.status_code() {
            Some(404) => ErrorKind::NotFound,
            Some(409) => ErrorKind::AlreadyExists,
            Some(400 | 422) => ErrorKind::InvalidArgument,
            Some(401 | 403) => ErrorKind::PermissionDenied,
            Some(_) => ErrorKind::Internal,
            None => ErrorKind::Unavailable,
        };
        kubelet_api::Error::new(kind, kubelet_api::chain(&e).to_string()).with_source(e)
    }
}

/// True when `e` is an API answer with status `code`.
pub(crate) fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}
