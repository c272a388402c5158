//! [`ProcessError`]: what can go wrong inside the process runtime, and its mapping onto
//! [`kubelet_api::Error`] at the trait boundary.

use std::path::PathBuf;
use std::time::Duration;

use kubelet_api::{Error, ErrorKind};

/// Errors of the process runtime's own operations.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProcessError {
    /// No container with this ID exists under the root directory.
    #[error("container {0:?} not found")]
    ContainerNotFound(String),
    /// No sandbox with this ID exists under the root directory.
    #[error("pod sandbox {0:?} not found")]
    SandboxNotFound(String),
    /// The ID contains characters that cannot name a directory safely.
    #[error("invalid id {0:?}: only ASCII letters, digits, '-' and '_' are allowed")]
    InvalidId(String),
    /// The container has neither `command` nor `args`.
    #[error("no command: the process runtime needs command or args (images are not pulled)")]
    NoCommand,
    /// The container's sandbox was stopped.
    #[error("pod sandbox {0:?} is not ready")]
    SandboxNotReady(String),
    /// `start_container` on a container that was already started.
    #[error("container {0:?} was already started")]
    AlreadyStarted(String),
    /// The operation needs a running container.
    #[error("container {0:?} is not running")]
    NotRunning(String),
    /// The shim could not start the container's process.
    #[error("starting container {id:?}: {message}")]
    StartFailed {
        /// Container ID.
        id: String,
        /// Why it failed (for example `No such file or directory`).
        message: String,
    },
    /// No shim executable could be found.
    #[error(
        "no kubelet-process-shim executable found: set ProcessRuntimeConfig::shim, \
         the KUBELET_PROCESS_SHIM environment variable, or put kubelet-process-shim in PATH"
    )]
    ShimNotFound,
    /// Spawning the shim failed.
    #[error("spawning shim {program:?}")]
    ShimSpawn {
        /// The shim program.
        program: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The shim exited or stalled before reporting that the container started.
    #[error("shim of container {id:?} did not report a start: {detail}")]
    ShimFailed {
        /// Container ID.
        id: String,
        /// The shim's own log, or what was observed.
        detail: String,
    },
    /// The process did not go away after SIGKILL.
    #[error("container {id:?} did not exit within {waited:?} after SIGKILL")]
    StopTimedOut {
        /// Container ID.
        id: String,
        /// How long we waited after SIGKILL.
        waited: Duration,
    },
    /// Sending a signal failed.
    #[error("signalling container {id:?}")]
    Signal {
        /// Container ID.
        id: String,
        /// The cause.
        #[source]
        source: nix::Error,
    },
    /// `exec_sync` ran longer than its timeout; the command was killed.
    #[error("exec in container {id:?} timed out after {timeout:?}")]
    ExecTimedOut {
        /// Container ID.
        id: String,
        /// The timeout.
        timeout: Duration,
    },
    /// Running the `exec_sync` command failed before it could run.
    #[error("exec in container {id:?}")]
    ExecSpawn {
        /// Container ID.
        id: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The container's shim did not reopen its log file (a shim without log reopening, or
    /// one that did not answer in time).
    #[error("reopening the log of container {id:?}: {detail}")]
    ReopenLog {
        /// Container ID.
        id: String,
        /// What went wrong.
        detail: String,
    },
    /// Reading or writing a state file or directory failed.
    #[error("{op} {path}")]
    State {
        /// What was being done (`reading`, `writing`, `creating`, `removing`).
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The disk holding the runtime's state is full (`ENOSPC`) or over quota (`EDQUOT`).
    #[error("{op} {path} ({})", errno_name(source))]
    NoSpace {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A state file holds invalid JSON.
    #[error("parsing {path}")]
    StateParse {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// Creating, configuring or removing a cgroup failed.
    #[error("cgroup {op} {path}")]
    Cgroup {
        /// What was being done.
        op: &'static str,
        /// The cgroup file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// `ENOSPC` or `EDQUOT`, the two errors [`ProcessError::NoSpace`] stands for.
fn errno_name(e: &std::io::Error) -> &'static str {
    if e.raw_os_error() == Some(libc::EDQUOT) {
        "EDQUOT"
    } else {
        "ENOSPC"
    }
}

impl ProcessError {
    /// The [`ErrorKind`] this error maps to at the [`ContainerRuntime`](kubelet_api::ContainerRuntime)
    /// boundary.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ProcessError::ContainerNotFound(_) | ProcessError::SandboxNotFound(_) => {
                ErrorKind::NotFound
            }
            ProcessError::InvalidId(_) | ProcessError::NoCommand => ErrorKind::InvalidArgument,
            ProcessError::SandboxNotReady(_)
            | ProcessError::AlreadyStarted(_)
            | ProcessError::NotRunning(_)
            | ProcessError::StartFailed { .. }
            | ProcessError::ShimNotFound => ErrorKind::FailedPrecondition,
            ProcessError::StopTimedOut { .. } | ProcessError::ExecTimedOut { .. } => {
                ErrorKind::DeadlineExceeded
            }
            ProcessError::NoSpace { .. } => ErrorKind::ResourceExhausted,
            ProcessError::ReopenLog { .. } => ErrorKind::Unavailable,
            ProcessError::State { source, .. } | ProcessError::Cgroup { source, .. }
                if source.kind() == std::io::ErrorKind::PermissionDenied =>
            {
                ErrorKind::PermissionDenied
            }
            ProcessError::ShimSpawn { .. }
            | ProcessError::ShimFailed { .. }
            | ProcessError::Signal { .. }
            | ProcessError::ExecSpawn { .. }
            | ProcessError::State { .. }
            | ProcessError::StateParse { .. }
            | ProcessError::Cgroup { .. } => ErrorKind::Internal,
        }
    }
}

impl From<ProcessError> for Error {
    fn from(e: ProcessError) -> Self {
        let kind = e.kind();
        Error::new(kind, kubelet_api::chain(&e).to_string()).with_source(e)
    }
}
