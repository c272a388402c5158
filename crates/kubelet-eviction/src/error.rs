//! The crate's error type.

use std::path::PathBuf;

/// Errors of the eviction crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EvictionError {
    /// An eviction setting (`evictionHard`, `evictionSoft`, …) has a bad entry.
    #[error("{setting}: bad entry {entry:?}: {reason}")]
    ParseSetting {
        /// The setting (`evictionHard`, `evictionSoftGracePeriod`, …).
        setting: &'static str,
        /// The offending entry as written.
        entry: String,
        /// What is wrong with it, in the kubelet's words.
        reason: String,
    },
    /// A stats file could not be read.
    #[error("reading {path}")]
    ReadStats {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A stats file has unexpected content.
    #[error("parsing {path}: {reason}")]
    ParseStats {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// `statvfs` of a filesystem failed.
    #[error("statvfs {path}")]
    Statvfs {
        /// The path whose filesystem was queried.
        path: PathBuf,
        /// The errno.
        #[source]
        source: nix::Error,
    },
    /// Setting up a kernel notification (eventfd, PSI trigger, inotify) failed.
    #[error("setting up {what} on {path}: {reason}")]
    NotifierSetup {
        /// The kind of notification.
        what: &'static str,
        /// The file involved.
        path: PathBuf,
        /// Why it failed.
        reason: String,
    },
    /// Killing a pod failed because the agent is not running.
    #[error("evicting pod {uid}: the agent is not running")]
    KillPod {
        /// The pod UID.
        uid: String,
    },
}
