//! [`ProcessRuntimeConfig`]: where the runtime keeps its state, which cgroup parent it uses and
//! how it starts its per-container shim.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::ProcessError;
use crate::shim::SHIM_MARKER;

/// Environment variable naming the shim executable for [`ShimCommand::Auto`].
pub const SHIM_ENV: &str = "KUBELET_PROCESS_SHIM";

/// File name of the shim binary this crate builds.
pub const SHIM_BINARY: &str = "kubelet-process-shim";

/// How the runtime launches the supervisor ("shim") of each container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ShimCommand {
    /// Find a shim: the `KUBELET_PROCESS_SHIM` environment variable, then a
    /// `kubelet-process-shim` next to the current executable (or one directory up, which covers
    /// cargo's `target/<profile>/deps` test binaries), then `PATH`.
    #[default]
    Auto,
    /// This executable; the runtime passes `__kubelet-process-shim` as the first argument. The
    /// host's `main` must call [`maybe_run_shim`](crate::shim::maybe_run_shim) first thing.
    CurrentExe,
    /// An explicit path to a `kubelet-process-shim` binary.
    Path(PathBuf),
}

impl ShimCommand {
    /// The program and leading arguments to run the shim with.
    pub(crate) fn resolve(&self) -> Result<(PathBuf, Vec<OsString>), ProcessError> {
        match self {
            ShimCommand::Path(p) => Ok((p.clone(), Vec::new())),
            ShimCommand::CurrentExe => {
                let exe = std::env::current_exe().map_err(|source| ProcessError::State {
                    op: "resolving current executable",
                    path: PathBuf::from("/proc/self/exe"),
                    source,
                })?;
                Ok((exe, vec![OsString::from(SHIM_MARKER)]))
            }
            ShimCommand::Auto => find_shim()
                .map(|p| (p, Vec::new()))
                .ok_or(ProcessError::ShimNotFound),
        }
    }
}

fn find_shim() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(SHIM_ENV) {
        return Some(PathBuf::from(p));
    }
    if let Ok(exe) = std::env::current_exe() {
        let mut dir = exe.parent();
        for _ in 0..2 {
            let Some(d) = dir else { break };
            let candidate = d.join(SHIM_BINARY);
            if candidate.is_file() {
                return Some(candidate);
            }
            dir = d.parent();
        }
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(SHIM_BINARY))
        .find(|p| p.is_file())
}

/// Configuration of [`ProcessRuntime`](crate::ProcessRuntime).
///
/// ```
/// use kubelet_process::{ProcessRuntimeConfig, ShimCommand};
/// let config = ProcessRuntimeConfig::new("/tmp/kubelet-process-doc")
///     .cgroup_parent("my-agent")
///     .shim(ShimCommand::CurrentExe)
///     .stop_timeout(std::time::Duration::from_secs(5));
/// assert_eq!(config.root_dir, std::path::Path::new("/tmp/kubelet-process-doc"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProcessRuntimeConfig {
    /// Where sandbox and container records live. Default: `/var/lib/kubelet-sdk/process` as
    /// root, else `$XDG_RUNTIME_DIR/kubelet-sdk/process` or `/tmp/kubelet-sdk-<uid>/process`.
    pub root_dir: PathBuf,
    /// Name of the cgroup under each hierarchy's root that holds `<sandbox>/<container>` cgroups
    /// of sandboxes created without a `PodSandboxConfig::cgroup_parent`. Default `kubelet-sdk`.
    /// A sandbox with one (the agent's pod cgroup, from a node resource manager) gets its
    /// containers at `<cgroup_parent>/<container>` instead.
    pub cgroup_parent: String,
    /// How to start the per-container shim. Default [`ShimCommand::Auto`].
    pub shim: ShimCommand,
    /// Time between SIGTERM and SIGKILL when `stop_pod_sandbox` stops containers that are still
    /// running. Default 2 s (the engine normally stops containers with the pod's grace period
    /// before it stops the sandbox).
    pub stop_timeout: Duration,
    /// Use cgroups when running as root and a hierarchy with the memory controller exists.
    /// Default `true`; set `false` to run without limits even as root.
    pub use_cgroups: bool,
}

impl Default for ProcessRuntimeConfig {
    fn default() -> Self {
        Self::new(default_root_dir())
    }
}

impl ProcessRuntimeConfig {
    /// Defaults with the given root directory.
    pub fn new(root_dir: impl Into<PathBuf>) -> Self {
        Self {
            root_dir: root_dir.into(),
            cgroup_parent: "kubelet-sdk".to_string(),
            shim: ShimCommand::Auto,
            stop_timeout: Duration::from_secs(2),
            use_cgroups: true,
        }
    }

    /// Set the root directory.
    pub fn root_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.root_dir = dir.into();
        self
    }

    /// Set the cgroup parent name.
    pub fn cgroup_parent(mut self, name: impl Into<String>) -> Self {
        self.cgroup_parent = name.into();
        self
    }

    /// Set how the shim is started.
    pub fn shim(mut self, shim: ShimCommand) -> Self {
        self.shim = shim;
        self
    }

    /// Shorthand for `shim(ShimCommand::Path(path))`.
    pub fn shim_path(self, path: impl AsRef<Path>) -> Self {
        self.shim(ShimCommand::Path(path.as_ref().to_path_buf()))
    }

    /// Set the SIGTERM-to-SIGKILL delay used by `stop_pod_sandbox`.
    pub fn stop_timeout(mut self, timeout: Duration) -> Self {
        self.stop_timeout = timeout;
        self
    }

    /// Enable or disable cgroups.
    pub fn use_cgroups(mut self, enabled: bool) -> Self {
        self.use_cgroups = enabled;
        self
    }
}

/// The default root directory for the current user.
pub fn default_root_dir() -> PathBuf {
    let uid = nix::unistd::geteuid();
    if uid.is_root() {
        return PathBuf::from("/var/lib/kubelet-sdk/process");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("kubelet-sdk").join("process"),
        _ => PathBuf::from(format!("/tmp/kubelet-sdk-{uid}")).join("process"),
    }
}
