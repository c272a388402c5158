//! [`ProcessRuntime`]: the [`ContainerRuntime`] implementation.

use std::collections::{HashMap, HashSet};
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use jiff::Timestamp;
use kubelet_api::runtime::{
    Container, ContainerConfig, ContainerEventStream, ContainerFilter, ContainerMetadata,
    ContainerState, ContainerStats, ContainerStatus, EnvVar, ExecResult, LinuxResources, Mount,
    PodSandbox, PodSandboxConfig, PodSandboxMetadata, PodSandboxStatus, RuntimeStatus,
    RuntimeVersion, SandboxFilter, SandboxState, labels, labels_match,
};
use kubelet_api::{ContainerRuntime, EventRecorder, InvolvedObject};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use parking_lot::Mutex;

use crate::cgroup::{CgroupDriver, remove_tree_once};
use crate::config::ProcessRuntimeConfig;
use crate::error::ProcessError;
use crate::record::{
    CONFIG_FILE, ContainerRecord, EXIT_FILE, ExitRecord, MountRecord, ResourcesRecord,
    SANDBOX_FILE, SHIM_LOG_FILE, STARTED_FILE, SandboxRecord, StartedRecord, boot_time,
    create_exit_slot, decode_wait_status, new_id, proc_stat, process_alive, read_exit, read_json,
    state_error, valid_id, write_exit, write_json,
};
use crate::shim::START_ERROR_CODE;

/// `PATH` given to containers whose environment has none (the value runc and containerd use).
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How long `start_container` waits for the shim to report the process started.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `stop_container` waits for the exit record after SIGKILL.
const KILL_WAIT: Duration = Duration::from_secs(10);
/// Poll period while waiting for a shim's records.
const POLL: Duration = Duration::from_millis(20);

/// The FIFO in a container's state directory its shim reopens the log file on.
pub(crate) const REOPEN_LOG_FIFO: &str = "reopen-log";

/// How long `reopen_container_log` waits for the shim to recreate the log file.
const REOPEN_WAIT: Duration = Duration::from_secs(2);

/// The environment a container's process gets: exactly `envs`, in order (a later duplicate
/// wins), plus `PATH` when not given.
pub fn container_env(envs: &[EnvVar]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::with_capacity(envs.len() + 1);
    for e in envs {
        if let Some(slot) = out.iter_mut().find(|(k, _)| *k == e.name) {
            slot.1 = e.value.clone();
        } else {
            out.push((e.name.clone(), e.value.clone()));
        }
    }
    if !out.iter().any(|(k, _)| k == "PATH") {
        out.push(("PATH".to_string(), DEFAULT_PATH.to_string()));
    }
    out
}

/// A [`ContainerRuntime`] that runs each container as a supervised host process.
///
/// See the [crate documentation](crate) for what it does and does not isolate.
#[derive(Debug)]
pub struct ProcessRuntime {
    config: ProcessRuntimeConfig,
    cgroups: Option<CgroupDriver>,
    no_cgroup_reason: &'static str,
    recorder: EventRecorder,
    containers: Mutex<Records<ContainerRecord>>,
    ledger: Mutex<Ledger>,
    sandbox_lock: Mutex<()>,
    /// Held while deciding the exit of a container whose shim is gone.
    exit_lock: Mutex<()>,
    /// Held while looking for and restoring lost state: one restoration (and one warning) per
    /// loss, however many callers notice it at once.
    restore_lock: Mutex<()>,
    /// Set once every sandbox record on disk has been read (a full list): from then on the
    /// records this runtime holds are all there are, and a pod's sandboxes are found among
    /// them instead of by listing the directory.
    sandboxes_scanned: AtomicBool,
    /// The same for container records.
    containers_scanned: AtomicBool,
    /// Containers an event stream watches as running (their shim under a pidfd, no exit seen):
    /// a list answers their state without reading their files.
    vouched: crate::events::WatchedShims,
    host_ip: String,
}

/// What the runtime remembers of its containers and sandboxes besides their configuration:
/// enough to put their records back when the state directory vanishes under it (see
/// [`ProcessRuntime::restore_lost`]), and what a full disk did not let it write.
#[derive(Debug, Default)]
struct Ledger {
    started: HashMap<String, StartedRecord>,
    exits: HashMap<String, ExitRecord>,
    /// Exits known only here: writing them failed (disk full); retried on every look.
    unsaved_exits: HashSet<String>,
    sandboxes: Records<SandboxRecord>,
    /// Sandboxes stopped whose record still says ready (disk full); retried on every look.
    unsaved_not_ready: HashSet<String>,
    /// Containers being removed: never restored.
    removing: HashSet<String>,
}

/// The parts of a container's security context a host process cannot get (the process runtime
/// applies user, group, supplemental groups and `no_new_privs`).
fn unsupported_security(s: &kubelet_api::runtime::SecurityContext) -> Vec<&'static str> {
    use kubelet_api::runtime::SecurityProfile;
    let mut out = Vec::new();
    if s.readonly_rootfs {
        out.push("readOnlyRootFilesystem");
    }
    if !s.add_capabilities.is_empty() || !s.drop_capabilities.is_empty() {
        out.push("capabilities");
    }
    if s.seccomp != SecurityProfile::Unconfined {
        out.push("seccompProfile");
    }
    if s.apparmor
        .as_ref()
        .is_some_and(|p| *p != SecurityProfile::Unconfined)
    {
        out.push("appArmorProfile");
    }
    out
}

/// Make the child `cmd` spawns write itself (`0`) into every `cgroup.procs` of `files` before
/// it execs: exec'd commands and exec probes run in the container's cgroup.
fn join_cgroup_before_exec(cmd: &mut tokio::process::Command, files: &[PathBuf]) {
    use std::os::unix::ffi::OsStrExt;
    let paths: Vec<std::ffi::CString> = files
        .iter()
        .filter_map(|p| std::ffi::CString::new(p.as_os_str().as_bytes()).ok())
        .collect();
    // SAFETY: the hook runs in the child between fork and exec and only calls the
    // async-signal-safe `open`, `write` and `close` on paths allocated before the fork.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(move || {
            for path in &paths {
                let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                let err = std::io::Error::last_os_error();
                libc::close(fd);
                if written < 0 {
                    return Err(err);
                }
            }
            Ok(())
        });
    }
}

/// What the state files say about a container right now.
struct Observed {
    state: ContainerState,
    started: Option<StartedRecord>,
    exit: Option<ExitRecord>,
}

impl ProcessRuntime {
    /// A runtime on `config.root_dir`, finding the sandboxes and containers a previous instance
    /// left there. Warnings (limits not enforced, mounts ignored) are only logged; use
    /// [`with_recorder`](Self::with_recorder) to deliver them as pod events.
    pub fn new(config: ProcessRuntimeConfig) -> Result<Self, ProcessError> {
        Self::with_recorder(config, EventRecorder::log_only())
    }

    /// Like [`new`](Self::new), recording Warning events (`ResourceLimitsNotEnforced`,
    /// `MountsNotSupported`) on the pod through `recorder`.
    pub fn with_recorder(
        mut config: ProcessRuntimeConfig,
        recorder: EventRecorder,
    ) -> Result<Self, ProcessError> {
        // The shims run with `/` as their working directory: every path they get is absolute.
        config.root_dir =
            std::path::absolute(&config.root_dir).map_err(|source| ProcessError::State {
                op: "resolving",
                path: config.root_dir.clone(),
                source,
            })?;
        for d in [
            config.root_dir.join("sandboxes"),
            config.root_dir.join("containers"),
        ] {
            std::fs::create_dir_all(&d).map_err(|source| ProcessError::State {
                op: "creating",
                path: d.clone(),
                source,
            })?;
        }
        let (cgroups, no_cgroup_reason) = if !config.use_cgroups {
            (None, "cgroups are disabled in the runtime configuration")
        } else if !nix::unistd::geteuid().is_root() {
            (None, "the agent does not run as root")
        } else {
            match CgroupDriver::detect() {
                Some(d) => (Some(d), ""),
                None => (
                    None,
                    "no cgroup hierarchy with the memory controller is mounted",
                ),
            }
        };
        match &cgroups {
            Some(d) => tracing::info!(
                root = %config.root_dir.display(), cgroup = d.version(), parent = %config.cgroup_parent,
                "process runtime ready"
            ),
            None => tracing::warn!(
                root = %config.root_dir.display(),
                "process runtime without cgroups ({no_cgroup_reason}): memory/cpu limits are not enforced"
            ),
        }
        reap_orphans(&config.root_dir, cgroups.as_ref());
        crate::execs::kill_stale(&config.root_dir);
        Ok(Self {
            config,
            cgroups,
            no_cgroup_reason,
            recorder,
            containers: Mutex::new(Records::default()),
            ledger: Mutex::new(Ledger::default()),
            sandbox_lock: Mutex::new(()),
            exit_lock: Mutex::new(()),
            restore_lock: Mutex::new(()),
            sandboxes_scanned: AtomicBool::new(false),
            containers_scanned: AtomicBool::new(false),
            vouched: Arc::default(),
            host_ip: host_ip(),
        })
    }

    /// The configuration in use.
    pub fn config(&self) -> &ProcessRuntimeConfig {
        &self.config
    }

    /// `Some("v1")` or `Some("v2")` when containers get their own cgroups, else `None`.
    pub fn cgroup_version(&self) -> Option<&'static str> {
        self.cgroups.as_ref().map(CgroupDriver::version)
    }

    /// PID of a running container's main process, `None` when it is not running.
    pub fn container_pid(&self, container_id: &str) -> Result<Option<u32>, ProcessError> {
        let rec = self.container(container_id)?;
        let obs = self.observe(&rec)?;
        Ok(match (obs.state, obs.started) {
            (ContainerState::Running, Some(s)) => Some(s.pid),
            _ => None,
        })
    }

    /// The container's cgroup directories (one per v1 controller, or the v2 directory); empty
    /// without cgroups.
    pub fn container_cgroup_dirs(&self, container_id: &str) -> Result<Vec<PathBuf>, ProcessError> {
        let rec = self.container(container_id)?;
        Ok(rec
            .cgroup
            .as_ref()
            .map(|c| c.unique_dirs())
            .unwrap_or_default())
    }

    fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.config.root_dir.join("sandboxes").join(id)
    }

    fn container_dir(&self, id: &str) -> PathBuf {
        self.config.root_dir.join("containers").join(id)
    }

    fn sandbox(&self, id: &str) -> Result<Arc<SandboxRecord>, ProcessError> {
        if !valid_id(id) {
            return Err(ProcessError::InvalidId(id.to_string()));
        }
        let path = self.sandbox_dir(id).join(SANDBOX_FILE);
        // This runtime writes every sandbox record and keeps what it wrote: read the file only
        // for a sandbox it has not seen (one of a previous agent) or whose record is gone (the
        // root directory removed: restored there), so that a list costs a `stat` per sandbox
        // rather than a read and a parse.
        let exists = path.exists();
        {
            let ledger = self.ledger.lock();
            if exists
                && !ledger.unsaved_not_ready.contains(id)
                && let Some(rec) = ledger.sandboxes.get(id)
            {
                return Ok(rec.clone());
            }
        }
        let mut rec: SandboxRecord = match read_json(&path)? {
            Some(r) => r,
            None => {
                self.restore_lost()?;
                read_json(&path)?.ok_or_else(|| ProcessError::SandboxNotFound(id.to_string()))?
            }
        };
        let mut ledger = self.ledger.lock();
        if ledger.unsaved_not_ready.contains(id) {
            rec.ready = false;
            if write_json(&path, &rec).is_ok() {
                ledger.unsaved_not_ready.remove(id);
            }
        }
        let rec = Arc::new(rec);
        ledger.sandboxes.insert(id.to_string(), rec.clone());
        Ok(rec)
    }

    fn sandboxes(&self) -> Result<Vec<Arc<SandboxRecord>>, ProcessError> {
        self.restore_lost()?;
        let mut out = Vec::new();
        for id in list_ids(&self.config.root_dir.join("sandboxes"))? {
            match self.sandbox(&id) {
                Ok(s) => out.push(s),
                Err(ProcessError::SandboxNotFound(_)) => {}
                Err(e) => {
                    tracing::warn!(sandbox = %id, error = %kubelet_api::chain(&e), "skipping unreadable sandbox record")
                }
            }
        }
        self.sandboxes_scanned.store(true, Ordering::Release);
        Ok(out)
    }

    /// The sandboxes of pod `uid` (its `POD_UID` label): after a full list, from the records
    /// this runtime holds (each checked on disk), so that inspecting one pod does not cost a
    /// look at every sandbox; before it, from a full list.
    fn sandboxes_of_pod(&self, uid: &str) -> Result<Vec<Arc<SandboxRecord>>, ProcessError> {
        if !self.sandboxes_scanned.load(Ordering::Acquire) {
            return self.sandboxes();
        }
        let ids = self.ledger.lock().sandboxes.ids_of_pod(uid);
        look_up(
            ids,
            |id| self.sandbox(id),
            |e| matches!(e, ProcessError::SandboxNotFound(_)),
        )
    }

    /// The containers of pod `uid`, as [`Self::sandboxes_of_pod`].
    fn containers_of_pod(&self, uid: &str) -> Result<Vec<Arc<ContainerRecord>>, ProcessError> {
        if !self.containers_scanned.load(Ordering::Acquire) {
            return self.all_containers();
        }
        let ids = self.containers.lock().ids_of_pod(uid);
        look_up(
            ids,
            |id| self.container(id),
            |e| matches!(e, ProcessError::ContainerNotFound(_)),
        )
    }

    /// Sandbox `id`'s containers: from the index by sandbox once every record was listed (no
    /// listing of every record per stopped or removed sandbox), from a full listing before.
    fn containers_of_sandbox(&self, id: &str) -> Result<Vec<Arc<ContainerRecord>>, ProcessError> {
        if !self.containers_scanned.load(Ordering::Acquire) {
            return Ok(self
                .all_containers()?
                .into_iter()
                .filter(|c| c.sandbox_id == id)
                .collect());
        }
        let ids = self.containers.lock().ids_of_sandbox(id);
        look_up(
            ids,
            |cid| self.container(cid),
            |e| matches!(e, ProcessError::ContainerNotFound(_)),
        )
    }

    fn container(&self, id: &str) -> Result<Arc<ContainerRecord>, ProcessError> {
        if !valid_id(id) {
            return Err(ProcessError::InvalidId(id.to_string()));
        }
        let dir = self.container_dir(id);
        let cached = self.containers.lock().get(id).cloned();
        if let Some(r) = cached
            && dir.exists()
        {
            return Ok(r);
        }
        if !dir.exists() {
            // Being removed: gone, and not to be restored (that would list every record on
            // each look-up while a teardown runs).
            if self.ledger.lock().removing.contains(id) {
                return Err(ProcessError::ContainerNotFound(id.to_string()));
            }
            if self.restore_lost()? > 0 && dir.exists() {
                return self.container(id);
            }
        }
        match read_json::<ContainerRecord>(&dir.join(CONFIG_FILE))? {
            Some(r) => {
                let r = Arc::new(r);
                self.containers.lock().insert(id.to_string(), r.clone());
                Ok(r)
            }
            None => {
                self.forget(id);
                Err(ProcessError::ContainerNotFound(id.to_string()))
            }
        }
    }

    /// Drop everything remembered about container `id`.
    fn forget(&self, id: &str) {
        self.containers.lock().remove(id);
        self.vouched.lock().remove(id);
        let mut ledger = self.ledger.lock();
        ledger.started.remove(id);
        ledger.exits.remove(id);
        ledger.unsaved_exits.remove(id);
    }

    /// Put back the records of containers (and their sandboxes) whose state directories
    /// vanished while the runtime was using them — the root directory deleted or replaced
    /// under a running agent. A container whose process still runs, or whose exit is known, is
    /// restored from memory, so that its pod is not started a second time and its exit is
    /// still learnt; one that was only created, or whose process is gone without a known
    /// exit, is forgotten. Logs one warning per restoration. Returns how many were restored.
    fn restore_lost(&self) -> Result<usize, ProcessError> {
        // Listed under the lock: a caller that waited for another's restoration sees its
        // files and restores nothing a second time.
        let _guard = self.restore_lock.lock();
        let listed = list_ids(&self.config.root_dir.join("containers"))?;
        let lost = self.lost_records(&listed);
        if lost.is_empty() {
            return Ok(0);
        }
        self.restore_records(lost)
    }

    /// [`restore_lost`](Self::restore_lost) when `listed`, a listing of the containers' state
    /// directory the caller has just made, lacks a record this runtime holds: the common case
    /// (nothing lost) costs no second listing.
    fn restore_lost_from(&self, listed: &[String]) -> Result<usize, ProcessError> {
        if self.lost_records(listed).is_empty() {
            return Ok(0);
        }
        self.restore_lost()
    }

    /// The records this runtime holds that `listed` lacks (but those being removed).
    fn lost_records(&self, listed: &[String]) -> Vec<Arc<ContainerRecord>> {
        let on_disk: HashSet<&str> = listed.iter().map(String::as_str).collect();
        let removing = &self.ledger.lock().removing;
        self.containers
            .lock()
            .by_id
            .iter()
            .filter(|(id, _)| !on_disk.contains(id.as_str()) && !removing.contains(*id))
            .map(|(_, r)| r.clone())
            .collect()
    }

    /// Put back `lost` (see [`restore_lost`](Self::restore_lost)); the caller holds the
    /// restoration lock.
    fn restore_records(&self, lost: Vec<Arc<ContainerRecord>>) -> Result<usize, ProcessError> {
        let mut restored = Vec::new();
        let mut failed = None;
        for rec in lost {
            let (started, exit, sandbox) = {
                let ledger = self.ledger.lock();
                (
                    ledger.started.get(&rec.id).cloned(),
                    ledger.exits.get(&rec.id).cloned(),
                    ledger.sandboxes.get(&rec.sandbox_id).cloned(),
                )
            };
            let running = started.as_ref().is_some_and(|s| {
                process_alive(s.shim_pid, s.shim_start_time)
                    || process_alive(s.pid, s.pid_start_time)
            });
            if !running && exit.is_none() {
                tracing::warn!(
                    containerID = %rec.id, name = %rec.name,
                    "the state of a container that was not running vanished; forgetting it"
                );
                self.forget(&rec.id);
                continue;
            }
            let dir = self.container_dir(&rec.id);
            let put_back = || -> Result<(), ProcessError> {
                let sandbox_file = self.sandbox_dir(&rec.sandbox_id).join(SANDBOX_FILE);
                if let Some(sb) = &sandbox
                    && !sandbox_file.exists()
                {
                    mkdir(&self.sandbox_dir(&rec.sandbox_id).join("work"))?;
                    write_json(&sandbox_file, &**sb)?;
                }
                mkdir(&dir)?;
                write_json(&dir.join(CONFIG_FILE), rec.as_ref())?;
                create_exit_slot(&dir)?;
                if let Some(s) = &started {
                    write_json(&dir.join(STARTED_FILE), s)?;
                }
                if let Some(e) = &exit
                    && !dir.join(EXIT_FILE).exists()
                {
                    write_json(&dir.join(EXIT_FILE), e)?;
                }
                Ok(())
            };
            match put_back() {
                Ok(()) => restored.push(format!("{} ({})", rec.id, rec.name)),
                Err(e) => failed = Some(e),
            }
        }
        if !restored.is_empty() {
            tracing::warn!(
                root = %self.config.root_dir.display(),
                containers = %restored.join(", "),
                "the process runtime's state vanished under it (root directory removed or \
                 replaced); restored the records of {} container(s) from memory, their \
                 processes untouched",
                restored.len()
            );
        }
        match failed {
            Some(e) if restored.is_empty() => Err(e),
            _ => Ok(restored.len()),
        }
    }

    fn all_containers(&self) -> Result<Vec<Arc<ContainerRecord>>, ProcessError> {
        // One listing of the state directory serves both the check for vanished records and
        // the answer (the log rotation lists every running container every 10 s); only a
        // restoration lists it again.
        let dir = self.config.root_dir.join("containers");
        let mut ids = list_ids(&dir)?;
        if self.restore_lost_from(&ids)? > 0 {
            ids = list_ids(&dir)?;
        }
        let mut out = Vec::with_capacity(ids.len());
        // Listed a moment ago: a record this runtime holds needs no `stat` of its directory
        // (the log rotation lists every running container every 10 s).
        let mut unheld = Vec::new();
        {
            let held = self.containers.lock();
            for id in &ids {
                match held.get(id.as_str()) {
                    Some(r) => out.push(r.clone()),
                    None => unheld.push(id),
                }
            }
        }
        for id in unheld {
            match self.container(id) {
                Ok(r) => out.push(r),
                Err(ProcessError::ContainerNotFound(_)) => {}
                Err(e) => {
                    tracing::warn!(containerID = %id, error = %kubelet_api::chain(&e), "skipping unreadable container record")
                }
            }
        }
        self.containers_scanned.store(true, Ordering::Release);
        Ok(out)
    }

    fn observe(&self, rec: &ContainerRecord) -> Result<Observed, ProcessError> {
        let dir = self.container_dir(&rec.id);
        let exit = read_exit(&dir)?;
        // `started.json` never changes once written: after the first read it comes from memory
        // (the ledger keeps it to restore lost records anyway), so observing a running
        // container reads its exit files and the shim's `/proc` entry, nothing more.
        let cached = self.ledger.lock().started.get(&rec.id).cloned();
        let started: Option<StartedRecord> = match cached {
            Some(s) => Some(s),
            None => read_json(&dir.join(STARTED_FILE))?,
        };
        let exit = match exit {
            Some(e) => Some(e),
            None => self.unsaved_exit(&rec.id, &dir),
        };
        if let Some(e) = exit {
            // Seen here before any stream saw it (a stop waits for it): lists read it too.
            self.vouched.lock().remove(&rec.id);
            let mut ledger = self.ledger.lock();
            if !ledger.exits.contains_key(&rec.id) {
                ledger.exits.insert(rec.id.clone(), e.clone());
            }
            return Ok(Observed {
                state: ContainerState::Exited,
                started,
                exit: Some(e),
            });
        }
        let Some(s) = started else {
            return Ok(Observed {
                state: ContainerState::Created,
                started: None,
                exit: None,
            });
        };
        self.ledger
            .lock()
            .started
            .entry(rec.id.clone())
            .or_insert_with(|| s.clone());
        if process_alive(s.shim_pid, s.shim_start_time) {
            return Ok(Observed {
                state: ContainerState::Running,
                started: Some(s),
                exit: None,
            });
        }
        self.vouched.lock().remove(&rec.id);
        let exit = self.supervisor_gone(rec, &s)?;
        Ok(Observed {
            state: ContainerState::Exited,
            started: Some(s),
            exit: Some(exit),
        })
    }

    /// An exit known only in memory (the disk was full when it was recorded); tries once more
    /// to write it.
    fn unsaved_exit(&self, id: &str, dir: &Path) -> Option<ExitRecord> {
        let mut ledger = self.ledger.lock();
        if !ledger.unsaved_exits.contains(id) {
            return None;
        }
        let e = ledger.exits.get(id).cloned()?;
        if write_exit(dir, &e).is_ok() {
            ledger.unsaved_exits.remove(id);
            tracing::info!(containerID = %id, "exit status written now that the disk has room");
        }
        Some(e)
    }

    /// The shim of a started container is gone without recording an exit: it was killed (or
    /// the host rebooted). Kill what is left of the container, as the shim would have, and
    /// record the exit: the status the kernel still holds for a zombie main process, else 137
    /// (the shim's death killed the process: it is the container's parent-death signal), or 255
    /// when the host rebooted since the container started. Written to `exit.json`, or kept in
    /// memory while the disk is full.
    fn supervisor_gone(
        &self,
        rec: &ContainerRecord,
        s: &StartedRecord,
    ) -> Result<ExitRecord, ProcessError> {
        let _guard = self.exit_lock.lock();
        let dir = self.container_dir(&rec.id);
        // The shim may have written its record just before exiting.
        if let Some(e) = read_exit(&dir)? {
            return Ok(e);
        }
        if let Some(e) = self.ledger.lock().exits.get(&rec.id).cloned() {
            return Ok(e);
        }
        let main = proc_stat(s.pid).filter(|p| p.start_time == s.pid_start_time);
        let shim = s.shim_pid;
        let (exit_code, signal, message) = match main {
            Some(p) if p.state == 'Z' => {
                let (code, sig) = p.exit_status.map(decode_wait_status).unwrap_or((255, None));
                (
                    code,
                    sig,
                    format!(
                        "the container's supervisor (shim, pid {shim}) died just after the \
                         container exited; exit status read from the kernel"
                    ),
                )
            }
            Some(_) => {
                let _ = killpg(Pid::from_raw(s.pid as i32), Signal::SIGKILL);
                (
                    137,
                    Some(9),
                    format!(
                        "the container's supervisor (shim, pid {shim}) died; the container was \
                         killed with it"
                    ),
                )
            }
            None if boot_time().is_some_and(|b| b > s.started_at) => (
                255,
                None,
                "the host rebooted while the container was running".to_string(),
            ),
            None => (
                137,
                Some(9),
                format!(
                    "the container's supervisor (shim, pid {shim}) died; the kernel killed the \
                     container with it"
                ),
            ),
        };
        if let Some(cg) = &rec.cgroup {
            for p in cg.pids() {
                let _ = kill(Pid::from_raw(p as i32), Signal::SIGKILL);
            }
        }
        // The shim lives in the container's cgroup: an OOM kill there can take it too.
        let oom = rec.cgroup.as_ref().is_some_and(|cg| match cg.oom_kills() {
            Some(n) => n > 0,
            None => signal == Some(9) && cg.memory_failcnt().is_some_and(|n| n > 0),
        });
        let exit = ExitRecord {
            exit_code,
            signal,
            finished_at: Timestamp::now(),
            reason: if oom { "OOMKilled" } else { "Error" }.to_string(),
            message,
        };
        let mut ledger = self.ledger.lock();
        ledger.exits.insert(rec.id.clone(), exit.clone());
        match write_exit(&dir, &exit) {
            Ok(()) => tracing::warn!(
                containerID = %rec.id, name = %rec.name, exit_code, "{}", exit.message
            ),
            Err(e) => {
                tracing::warn!(
                    containerID = %rec.id, name = %rec.name, exit_code, error = %kubelet_api::chain(&e),
                    "{}; the exit status is kept in memory until it can be written", exit.message
                );
                ledger.unsaved_exits.insert(rec.id.clone());
            }
        }
        Ok(exit)
    }

    fn pod_object(sandbox: &SandboxRecord, container: &str) -> InvolvedObject {
        InvolvedObject::pod_container(
            sandbox.namespace.as_str(),
            sandbox.name.as_str(),
            sandbox.uid.as_str(),
            container,
        )
    }

    fn create(&self, sandbox_id: &str, config: &ContainerConfig) -> Result<String, ProcessError> {
        let sandbox = self.sandbox(sandbox_id)?;
        if !sandbox.ready {
            return Err(ProcessError::SandboxNotReady(sandbox_id.to_string()));
        }
        let argv: Vec<String> = if config.command.is_empty() {
            config.args.clone()
        } else {
            config.command.iter().chain(&config.args).cloned().collect()
        };
        if argv.is_empty() || argv[0].is_empty() {
            return Err(ProcessError::NoCommand);
        }
        let name = &config.metadata.name;
        let id = new_id();
        let dir = self.container_dir(&id);
        mkdir(&dir)?;
        let working_dir = if config.working_dir.is_empty() {
            self.sandbox_dir(sandbox_id).join("work")
        } else {
            PathBuf::from(&config.working_dir)
        };
        mkdir(&working_dir)?;
        let log_base = if sandbox.log_directory.as_os_str().is_empty() {
            dir.clone()
        } else {
            sandbox.log_directory.clone()
        };
        let log_path = if config.log_path.is_empty() {
            log_base
                .join(name)
                .join(format!("{}.log", config.metadata.attempt))
        } else {
            log_base.join(&config.log_path)
        };
        let resources = config.resources.as_ref().map(ResourcesRecord::from_api);
        let limited = resources
            .as_ref()
            .is_some_and(|r| r.memory_limit_in_bytes > 0 || r.cpu_quota > 0);
        let cgroup = match &self.cgroups {
            Some(driver) => {
                // Under the pod cgroup the agent made, else the runtime's own per-sandbox one.
                let paths = if sandbox.cgroup_parent.is_empty() {
                    driver.container_paths(&self.config.cgroup_parent, sandbox_id, &id)
                } else {
                    driver.container_paths_in(&sandbox.cgroup_parent, &id)
                };
                let applied = driver.create(&paths).and_then(|()| match &resources {
                    Some(r) => paths.apply(r),
                    None => Ok(()),
                });
                if let Err(e) = applied {
                    let _ = paths.remove();
                    let _ = std::fs::remove_dir_all(&dir);
                    return Err(e);
                }
                Some(paths)
            }
            None => {
                if limited {
                    self.recorder.warning(
                        Self::pod_object(&sandbox, name),
                        "ResourceLimitsNotEnforced",
                        format!(
                            "container {name}: memory/cpu limits need root and a cgroup hierarchy; \
                             running without limits ({})",
                            self.no_cgroup_reason
                        ),
                    );
                }
                None
            }
        };
        if !config.mounts.is_empty() {
            let list: Vec<String> = config
                .mounts
                .iter()
                .map(|m| {
                    format!(
                        "{} -> {}",
                        m.host_path.display(),
                        m.container_path.display()
                    )
                })
                .collect();
            self.recorder.warning(
                Self::pod_object(&sandbox, name),
                "MountsNotSupported",
                format!(
                    "container {name}: the process runtime has no mount namespace and cannot \
                     bind-mount; ignored: {}; the process sees the host filesystem",
                    list.join(", ")
                ),
            );
        }
        let unsupported = unsupported_security(&config.security);
        if !unsupported.is_empty() {
            self.recorder.warning(
                Self::pod_object(&sandbox, name),
                "SecurityContextNotSupported",
                format!(
                    "container {name}: the process runtime runs host processes and cannot apply \
                     {}; the process runs without them",
                    unsupported.join(", ")
                ),
            );
        }
        let to_u32 = |v: Option<i64>| v.and_then(|v| u32::try_from(v).ok());
        let rec = ContainerRecord {
            id: id.clone(),
            sandbox_id: sandbox_id.to_string(),
            name: name.clone(),
            attempt: config.metadata.attempt,
            image: config.image.clone(),
            argv,
            env: container_env(&config.envs),
            working_dir,
            log_path,
            labels: config.labels.clone(),
            annotations: config.annotations.clone(),
            created_at: Timestamp::now(),
            resources,
            mounts: config
                .mounts
                .iter()
                .map(|m| MountRecord {
                    container_path: m.container_path.clone(),
                    host_path: m.host_path.clone(),
                    readonly: m.readonly,
                })
                .collect(),
            cgroup,
            uid: to_u32(config.security.run_as_user),
            gid: to_u32(config.security.run_as_group),
            groups: config
                .security
                .supplemental_groups
                .iter()
                .filter_map(|g| u32::try_from(*g).ok())
                .collect(),
            no_new_privs: config.security.no_new_privs,
            termination_message_path: config
                .annotations
                .get(labels::CONTAINER_TERMINATION_MESSAGE_PATH)
                .filter(|p| !p.is_empty())
                .map(PathBuf::from),
            stdin: config.stdin,
        };
        let written =
            create_exit_slot(&dir).and_then(|()| write_json(&dir.join(CONFIG_FILE), &rec));
        if let Err(e) = written {
            if let Some(cg) = &rec.cgroup {
                let _ = cg.remove();
            }
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
        self.containers.lock().insert(id.clone(), Arc::new(rec));
        tracing::debug!(containerID = %id, sandbox = %sandbox_id, name = %name, "container created");
        Ok(id)
    }

    fn fail_start(&self, dir: &Path, err: ProcessError) -> ProcessError {
        if matches!(read_exit(dir), Ok(None)) {
            let rec = ExitRecord {
                exit_code: START_ERROR_CODE,
                signal: None,
                finished_at: Timestamp::now(),
                reason: "StartError".to_string(),
                message: err.to_string(),
            };
            if let Err(e) = write_exit(dir, &rec) {
                tracing::warn!(error = %kubelet_api::chain(&e), "cannot record start failure");
            }
        }
        err
    }

    async fn start(&self, id: &str) -> Result<(), ProcessError> {
        let rec = self.container(id)?;
        let dir = self.container_dir(id);
        if dir.join(STARTED_FILE).exists() || dir.join(EXIT_FILE).exists() {
            return Err(ProcessError::AlreadyStarted(id.to_string()));
        }
        let shim_log = match OpenOptions::new()
            .append(true)
            .create_new(true)
            .open(dir.join(SHIM_LOG_FILE))
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(ProcessError::AlreadyStarted(id.to_string()));
            }
            Err(source) => {
                return Err(ProcessError::State {
                    op: "creating",
                    path: dir.join(SHIM_LOG_FILE),
                    source,
                });
            }
        };
        let (program, lead) = self
            .config
            .shim
            .resolve()
            .map_err(|e| self.fail_start(&dir, e))?;
        let mut cmd = tokio::process::Command::new(&program);
        cmd.args(&lead)
            .arg("run")
            .arg(&dir)
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(shim_log))
            .kill_on_drop(false);
        let mut child = cmd.spawn().map_err(|source| {
            self.fail_start(
                &dir,
                ProcessError::ShimSpawn {
                    program: program.clone(),
                    source,
                },
            )
        })?;
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        let mut shim_exited = false;
        // A shim usually reports within a few milliseconds: look again after 1 ms, then back
        // off to `POLL`, so a start is not held for most of a 20 ms period.
        let mut pause = Duration::from_millis(1);
        // The dropped `child` is reaped by tokio in the background once the shim exits.
        loop {
            if let Some(exit) = read_exit(&dir)? {
                if exit.reason == "StartError" {
                    return Err(ProcessError::StartFailed {
                        id: id.to_string(),
                        message: exit.message,
                    });
                }
                break;
            }
            if dir.join(STARTED_FILE).exists() {
                break;
            }
            if shim_exited {
                let detail = std::fs::read_to_string(dir.join(SHIM_LOG_FILE)).unwrap_or_default();
                return Err(self.fail_start(
                    &dir,
                    ProcessError::ShimFailed {
                        id: id.to_string(),
                        detail: format!("shim {} exited: {}", program.display(), detail.trim()),
                    },
                ));
            }
            if tokio::time::Instant::now() >= deadline {
                let _ = child.start_kill();
                return Err(self.fail_start(
                    &dir,
                    ProcessError::ShimFailed {
                        id: id.to_string(),
                        detail: format!("no start report within {START_TIMEOUT:?}"),
                    },
                ));
            }
            // One more round of file checks after the shim exited, then give up.
            shim_exited = matches!(child.try_wait(), Ok(Some(_)));
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(POLL);
        }
        tracing::debug!(containerID = %id, name = %rec.name, "container started");
        Ok(())
    }

    fn signal(
        &self,
        id: &str,
        started: &StartedRecord,
        sig: Signal,
        cgroup: bool,
    ) -> Result<(), ProcessError> {
        if process_alive(started.pid, started.pid_start_time) {
            let pid = Pid::from_raw(started.pid as i32);
            match killpg(pid, sig) {
                Ok(()) => {}
                Err(nix::errno::Errno::ESRCH) => {
                    // The process left its group (setsid): signal it directly.
                    match kill(pid, sig) {
                        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
                        Err(source) => {
                            return Err(ProcessError::Signal {
                                id: id.to_string(),
                                source,
                            });
                        }
                    }
                }
                Err(source) => {
                    return Err(ProcessError::Signal {
                        id: id.to_string(),
                        source,
                    });
                }
            }
        }
        if cgroup && let Some(cg) = self.container(id)?.cgroup.as_ref() {
            for p in cg.pids().into_iter().filter(|&p| p != started.shim_pid) {
                let _ = kill(Pid::from_raw(p as i32), sig);
            }
        }
        Ok(())
    }

    async fn wait_exited(
        &self,
        rec: &ContainerRecord,
        within: Duration,
    ) -> Result<bool, ProcessError> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.observe(rec)?.state == ContainerState::Exited {
                return Ok(true);
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn stop(&self, id: &str, timeout: Duration) -> Result<(), ProcessError> {
        let rec = self.container(id)?;
        let obs = self.observe(&rec)?;
        let (ContainerState::Running, Some(started)) = (obs.state, obs.started) else {
            return Ok(());
        };
        if !timeout.is_zero() {
            tracing::debug!(containerID = %id, ?timeout, "stopping container with SIGTERM");
            self.signal(id, &started, Signal::SIGTERM, false)?;
            if self.wait_exited(&rec, timeout).await? {
                return Ok(());
            }
        }
        tracing::debug!(containerID = %id, "killing container with SIGKILL");
        self.signal(id, &started, Signal::SIGKILL, true)?;
        if self.wait_exited(&rec, KILL_WAIT).await? {
            Ok(())
        } else {
            Err(ProcessError::StopTimedOut {
                id: id.to_string(),
                waited: KILL_WAIT,
            })
        }
    }

    async fn remove(&self, id: &str) -> Result<(), ProcessError> {
        self.ledger.lock().removing.insert(id.to_string());
        let result = self.remove_marked(id).await;
        if result.is_ok() {
            self.forget(id);
        }
        self.ledger.lock().removing.remove(id);
        result
    }

    async fn remove_marked(&self, id: &str) -> Result<(), ProcessError> {
        let rec = match self.container(id) {
            Ok(r) => r,
            Err(ProcessError::ContainerNotFound(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        if self.observe(&rec)?.state == ContainerState::Running {
            self.stop(id, Duration::ZERO).await?;
        }
        if let Some(cg) = &rec.cgroup {
            // The kernel frees a cgroup a moment after its last process exits.
            let mut tries = 0;
            loop {
                match cg.remove() {
                    Ok(()) => break,
                    Err(e) if tries >= 25 => {
                        tracing::warn!(containerID = %id, error = %kubelet_api::chain(&e), "cgroup not removed");
                        break;
                    }
                    Err(_) => {
                        tries += 1;
                        tokio::time::sleep(POLL).await;
                    }
                }
            }
        }
        let dir = self.container_dir(id);
        // The shim may still be finishing (log flush, its last records) just after the exit:
        // let it go first, or removing the directory races with its writes.
        if let Ok(Some(s)) = read_json::<StartedRecord>(&dir.join(STARTED_FILE)) {
            let deadline = tokio::time::Instant::now() + KILL_WAIT;
            while process_alive(s.shim_pid, s.shim_start_time)
                && tokio::time::Instant::now() < deadline
            {
                tokio::time::sleep(POLL).await;
            }
        }
        let mut tries = 0;
        loop {
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty && tries < 10 => {
                    tries += 1;
                    tokio::time::sleep(POLL).await;
                }
                Err(source) => {
                    return Err(ProcessError::State {
                        op: "removing",
                        path: dir,
                        source,
                    });
                }
            }
        }
        tracing::debug!(containerID = %id, "container removed");
        Ok(())
    }

    /// A command that runs `cmd` in running container `id`: its environment, working
    /// directory, user and cgroup (through the shim's `exec` mode), in a new process group.
    /// Standard streams are left to the caller.
    /// Ask container `id`'s shim to reopen its log; see
    /// [`reopen_container_log`](ContainerRuntime::reopen_container_log).
    async fn reopen_log(&self, id: &str) -> Result<(), ProcessError> {
        use std::os::unix::fs::OpenOptionsExt;
        let rec = self.container(id)?;
        if self.observe(&rec)?.state != ContainerState::Running {
            return Err(ProcessError::NotRunning(id.to_string()));
        }
        let fifo = self.container_dir(id).join(REOPEN_LOG_FIFO);
        let reopen_err = |detail: String| ProcessError::ReopenLog {
            id: id.to_string(),
            detail,
        };
        // Non-blocking: with no shim listening the open fails (ENXIO) instead of waiting.
        let request = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .map_err(|e| {
                reopen_err(format!(
                    "the shim does not listen on {}: {e}",
                    fifo.display()
                ))
            })?;
        drop(request);
        let deadline = tokio::time::Instant::now() + REOPEN_WAIT;
        while !rec.log_path.exists() {
            if tokio::time::Instant::now() >= deadline {
                return Err(reopen_err(format!(
                    "{} was not recreated within {REOPEN_WAIT:?}",
                    rec.log_path.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    pub(crate) fn exec_command(
        &self,
        id: &str,
        cmd: &[String],
    ) -> Result<tokio::process::Command, ProcessError> {
        let rec = self.container(id)?;
        if self.observe(&rec)?.state != ContainerState::Running {
            return Err(ProcessError::NotRunning(id.to_string()));
        }
        let Some((program, args)) = cmd.split_first() else {
            return Err(ProcessError::NoCommand);
        };
        let mut command = match &rec.cgroup {
            // Root: the child joins the cgroup itself between fork and exec (no second exec).
            Some(cg) if rec.uid.is_none() && rec.gid.is_none() => {
                let mut c = tokio::process::Command::new(program);
                c.args(args);
                join_cgroup_before_exec(&mut c, &cg.procs_files());
                c
            }
            // Another user: the shim's `exec` mode joins the cgroup as root, then drops to the
            // user and execs (std changes the credentials before a `pre_exec` hook would run).
            Some(cg) => {
                let (shim, lead) = self.config.shim.resolve()?;
                let mut c = tokio::process::Command::new(shim);
                c.args(lead).arg("exec");
                for f in cg.procs_files() {
                    c.arg("--cgroup-procs").arg(f);
                }
                if let Some(u) = rec.uid {
                    c.arg("--uid").arg(u.to_string());
                }
                if let Some(g) = rec.gid {
                    c.arg("--gid").arg(g.to_string());
                }
                c.arg("--").arg(program).args(args);
                c
            }
            None => {
                let mut c = tokio::process::Command::new(program);
                c.args(args);
                if let Some(u) = rec.uid {
                    c.uid(u);
                }
                if let Some(g) = rec.gid {
                    c.gid(g);
                }
                c
            }
        };
        command
            .env_clear()
            .envs(rec.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&rec.working_dir)
            .kill_on_drop(true);
        Ok(command)
    }

    /// The record of container `id` (for the streaming module).
    pub(crate) fn container_record(&self, id: &str) -> Result<Arc<ContainerRecord>, ProcessError> {
        self.container(id)
    }

    /// Whether container `id` runs now, and its main process.
    pub(crate) fn running_pid(&self, rec: &ContainerRecord) -> Result<Option<u32>, ProcessError> {
        let obs = self.observe(rec)?;
        Ok((obs.state == ContainerState::Running)
            .then(|| obs.started.map(|s| s.pid))
            .flatten())
    }

    /// The directory of container `id`'s state.
    pub(crate) fn state_dir(&self, id: &str) -> PathBuf {
        self.container_dir(id)
    }

    /// Whether sandbox `id` exists.
    pub(crate) fn has_sandbox(&self, id: &str) -> bool {
        self.sandbox(id).is_ok()
    }

    async fn exec(
        &self,
        id: &str,
        cmd: &[String],
        timeout: Duration,
    ) -> Result<ExecResult, ProcessError> {
        let program = cmd.first().cloned().unwrap_or_default();
        let mut command = self.exec_command(id, cmd)?;
        command
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = match command.spawn() {
            Ok(c) => c,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied
                ) =>
            {
                let code = if e.kind() == std::io::ErrorKind::NotFound {
                    127
                } else {
                    126
                };
                return Ok(ExecResult {
                    stdout: Vec::new(),
                    stderr: format!("exec {program:?}: {e}\n").into_bytes(),
                    exit_code: code,
                });
            }
            Err(source) => {
                return Err(ProcessError::ExecSpawn {
                    id: id.to_string(),
                    source,
                });
            }
        };
        let pid = child.id();
        let _record =
            pid.and_then(|p| crate::execs::ExecRecord::create(&self.container_dir(id), p));
        let out = if timeout.is_zero() {
            child.wait_with_output().await
        } else {
            match tokio::time::timeout(timeout, child.wait_with_output()).await {
                Ok(r) => r,
                Err(_) => {
                    if let Some(pid) = pid {
                        let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
                    }
                    return Err(ProcessError::ExecTimedOut {
                        id: id.to_string(),
                        timeout,
                    });
                }
            }
        };
        let out = out.map_err(|source| ProcessError::ExecSpawn {
            id: id.to_string(),
            source,
        })?;
        use std::os::unix::process::ExitStatusExt;
        let exit_code = match (out.status.code(), out.status.signal()) {
            (Some(c), _) => c,
            (None, Some(s)) => 128 + s,
            (None, None) => 255,
        };
        Ok(ExecResult {
            stdout: out.stdout,
            stderr: out.stderr,
            exit_code,
        })
    }

    fn status_of(&self, rec: &ContainerRecord) -> Result<ContainerStatus, ProcessError> {
        let obs = self.observe(rec)?;
        let (exit_code, reason, message, finished_at) = match &obs.exit {
            Some(e) => (
                e.exit_code,
                e.reason.clone(),
                e.message.clone(),
                Some(e.finished_at),
            ),
            None => (0, String::new(), String::new(), None),
        };
        Ok({
            let mut vv = ContainerStatus::default();
            vv.id = rec.id.clone();
            vv.metadata = ContainerMetadata {
                name: rec.name.clone(),
                attempt: rec.attempt,
            };
            vv.state = obs.state;
            vv.created_at = rec.created_at;
            vv.started_at = obs.started.as_ref().map(|s| s.started_at);
            vv.finished_at = finished_at;
            vv.exit_code = exit_code;
            vv.image = rec.image.clone();
            vv.image_ref = rec.image.clone();
            vv.reason = reason;
            vv.message = message;
            vv.labels = rec.labels.clone();
            vv.annotations = rec.annotations.clone();
            vv.mounts = rec
                .mounts
                .iter()
                .map(|m| Mount {
                    container_path: m.container_path.clone(),
                    host_path: m.host_path.clone(),
                    readonly: m.readonly,
                })
                .collect();
            vv.log_path = rec.log_path.clone();
            vv.resources = rec.resources.as_ref().map(ResourcesRecord::to_api);
            vv
        })
    }

    /// Rewrite a container's cgroup with `resources` and record them.
    fn update_resources(&self, id: &str, resources: &LinuxResources) -> Result<(), ProcessError> {
        let rec = self.container(id)?;
        let wanted = ResourcesRecord::from_api(resources);
        if let Some(cg) = &rec.cgroup {
            // Only what the caller sets: zero fields leave the cgroup as it is.
            cg.apply(&wanted)?;
        }
        // The record keeps what was not changed (as CRI runtimes merge an update).
        let mut merged = rec.resources.clone().unwrap_or_default();
        let set = |old: &mut i64, new: i64| {
            if new != 0 {
                *old = new;
            }
        };
        set(&mut merged.cpu_period, wanted.cpu_period);
        set(&mut merged.cpu_quota, wanted.cpu_quota);
        set(&mut merged.cpu_shares, wanted.cpu_shares);
        set(
            &mut merged.memory_limit_in_bytes,
            wanted.memory_limit_in_bytes,
        );
        if !wanted.cpuset_cpus.is_empty() {
            merged.cpuset_cpus = wanted.cpuset_cpus;
        }
        if !wanted.cpuset_mems.is_empty() {
            merged.cpuset_mems = wanted.cpuset_mems;
        }
        if wanted.oom_score_adj.is_some() {
            merged.oom_score_adj = wanted.oom_score_adj;
        }
        let mut updated = rec.as_ref().clone();
        updated.resources = Some(merged);
        write_json(&self.container_dir(id).join(CONFIG_FILE), &updated)?;
        self.containers
            .lock()
            .insert(id.to_string(), Arc::new(updated));
        Ok(())
    }

    fn run_sandbox(&self, config: &PodSandboxConfig) -> Result<String, ProcessError> {
        let id = new_id();
        let dir = self.sandbox_dir(&id);
        mkdir(&dir.join("work"))?;
        if !config.log_directory.as_os_str().is_empty() {
            mkdir(&config.log_directory)?;
        }
        let rec = SandboxRecord {
            id: id.clone(),
            name: config.metadata.name.clone(),
            namespace: config.metadata.namespace.clone(),
            uid: config.metadata.uid.clone(),
            attempt: config.metadata.attempt,
            ready: true,
            created_at: Timestamp::now(),
            labels: config.labels.clone(),
            annotations: config.annotations.clone(),
            log_directory: config.log_directory.clone(),
            ip: self.host_ip.clone(),
            cgroup_parent: config.cgroup_parent.clone(),
        };
        if let Err(e) = write_json(&dir.join(SANDBOX_FILE), &rec) {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
        let rec = Arc::new(rec);
        self.ledger.lock().sandboxes.insert(id.clone(), rec.clone());
        tracing::debug!(sandbox = %id, pod = %format_args!("{}/{}", rec.namespace, rec.name), "sandbox created");
        Ok(id)
    }

    async fn stop_sandbox(&self, id: &str) -> Result<(), ProcessError> {
        match self.sandbox(id) {
            Ok(_) => {}
            Err(ProcessError::SandboxNotFound(_)) => return Ok(()),
            Err(e) => return Err(e),
        }
        let members = self.containers_of_sandbox(id)?;
        let timeout = self.config.stop_timeout;
        let results =
            futures::future::join_all(members.iter().map(|c| self.stop(&c.id, timeout))).await;
        for r in results {
            r?;
        }
        let _guard = self.sandbox_lock.lock();
        if let Ok(rec) = self.sandbox(id)
            && rec.ready
        {
            let mut rec = SandboxRecord::clone(&rec);
            rec.ready = false;
            match write_json(&self.sandbox_dir(id).join(SANDBOX_FILE), &rec) {
                Ok(()) => {
                    self.ledger
                        .lock()
                        .sandboxes
                        .insert(id.to_string(), Arc::new(rec));
                }
                Err(e @ ProcessError::NoSpace { .. }) => {
                    // Stopped it is: report it so, and write it down once there is room.
                    tracing::warn!(sandbox = %id, error = %kubelet_api::chain(&e), "sandbox stopped; its record is updated once the disk has room");
                    let mut ledger = self.ledger.lock();
                    ledger.unsaved_not_ready.insert(id.to_string());
                    ledger.sandboxes.insert(id.to_string(), Arc::new(rec));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    async fn remove_sandbox(&self, id: &str) -> Result<(), ProcessError> {
        if !valid_id(id) {
            return Err(ProcessError::InvalidId(id.to_string()));
        }
        let members = self.containers_of_sandbox(id)?;
        for c in members {
            self.remove(&c.id).await?;
        }
        // A pod cgroup the agent made is the agent's to remove, once this returns.
        let own_cgroup = match self.sandbox(id) {
            Ok(sb) => sb.cgroup_parent.is_empty(),
            Err(_) => true,
        };
        if let Some(driver) = self.cgroups.as_ref().filter(|_| own_cgroup) {
            // Also the cgroups of containers the runtime has no record of any more, and any
            // process still in them: nothing of the pod stays behind.
            let dirs = driver.sandbox_dirs(&self.config.cgroup_parent, id);
            let mut tries = 0;
            loop {
                let mut killed = 0;
                let mut failed = None;
                for d in &dirs {
                    match remove_tree_once(d) {
                        Ok(n) => killed += n,
                        Err(e) => failed = Some(e),
                    }
                }
                if killed > 0 {
                    tracing::warn!(sandbox = %id, killed, "killed processes left in the pod's cgroups");
                }
                match failed {
                    None => break,
                    Some(e) if tries >= 50 => {
                        tracing::warn!(sandbox = %id, error = %kubelet_api::chain(&e), "sandbox cgroup not removed");
                        break;
                    }
                    Some(_) => {
                        tries += 1;
                        tokio::time::sleep(POLL).await;
                    }
                }
            }
        }
        let dir = self.sandbox_dir(id);
        {
            let mut ledger = self.ledger.lock();
            ledger.sandboxes.remove(id);
            ledger.unsaved_not_ready.remove(id);
        }
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(ProcessError::State {
                op: "removing",
                path: dir,
                source,
            }),
        }
    }

    fn stats(&self, id: &str) -> Result<ContainerStats, ProcessError> {
        let rec = self.container(id)?;
        let mut out = {
            let mut v = ContainerStats::default();
            v.container_id = id.to_string();
            v.timestamp = Timestamp::now();
            v
        };
        if let Some(cg) = &rec.cgroup {
            let s = cg.stats();
            out.memory_usage_bytes = s.sample.memory_usage;
            out.memory_working_set_bytes = s.sample.working_set();
            out.memory_rss_bytes = s.sample.rss;
            out.memory_page_faults = s.sample.page_faults;
            out.memory_major_page_faults = s.sample.major_page_faults;
            out.cpu_usage_core_nanoseconds = s.sample.cpu_usage_ns;
            out.process_count = s.process_count;
            return Ok(out);
        }
        // Without a cgroup: the main process only, from /proc.
        let obs = self.observe(&rec)?;
        if let (ContainerState::Running, Some(st)) = (obs.state, obs.started)
            && let Some(ps) = proc_stat(st.pid).filter(|p| p.start_time == st.pid_start_time)
        {
            let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
                .ok()
                .flatten()
                .unwrap_or(4096) as u64;
            let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
                .ok()
                .flatten()
                .filter(|&h| h > 0)
                .unwrap_or(100) as u64;
            let rss = ps.rss_pages.saturating_mul(page);
            out.memory_usage_bytes = Some(rss);
            out.memory_working_set_bytes = Some(rss);
            out.cpu_usage_core_nanoseconds =
                Some((ps.utime + ps.stime).saturating_mul(1_000_000_000 / hz));
            out.process_count = Some(1);
        }
        Ok(out)
    }
}

fn mkdir(dir: &Path) -> Result<(), ProcessError> {
    std::fs::create_dir_all(dir).map_err(|source| state_error("creating", dir, source))
}

/// Records by ID, and the IDs of each pod's records (by their `io.kubernetes.pod.uid` label):
/// the PLEG inspects one pod at a time, and finding its records must not cost a scan of every
/// pod's (with `N` pods, `N` inspections of `O(N)` made the start of `N` pods quadratic).
#[derive(Debug)]
struct Records<R> {
    by_id: HashMap<String, Arc<R>>,
    by_pod: HashMap<String, Vec<String>>,
    /// Container IDs by sandbox ID (containers only): stopping or removing a sandbox finds
    /// its containers without listing every record.
    by_sandbox: HashMap<String, Vec<String>>,
}

impl<R> Default for Records<R> {
    fn default() -> Self {
        Self {
            by_id: HashMap::new(),
            by_pod: HashMap::new(),
            by_sandbox: HashMap::new(),
        }
    }
}

/// A record with the labels its sandbox or container was created with.
trait Labelled {
    fn labels(&self) -> &std::collections::BTreeMap<String, String>;
    /// The sandbox a container belongs to; `None` for a sandbox.
    fn sandbox(&self) -> Option<&str>;
}

impl Labelled for SandboxRecord {
    fn labels(&self) -> &std::collections::BTreeMap<String, String> {
        &self.labels
    }
    fn sandbox(&self) -> Option<&str> {
        None
    }
}

impl Labelled for ContainerRecord {
    fn labels(&self) -> &std::collections::BTreeMap<String, String> {
        &self.labels
    }
    fn sandbox(&self) -> Option<&str> {
        Some(&self.sandbox_id)
    }
}

/// Add `id` to `key`'s list in `index`.
fn link(index: &mut HashMap<String, Vec<String>>, key: &str, id: &str) {
    index
        .entry(key.to_string())
        .or_default()
        .push(id.to_string());
}

/// Take `id` out of `key`'s list in `index`.
fn unlink(index: &mut HashMap<String, Vec<String>>, key: &str, id: &str) {
    if let Some(ids) = index.get_mut(key) {
        ids.retain(|i| i != id);
        if ids.is_empty() {
            index.remove(key);
        }
    }
}

impl<R: Labelled> Records<R> {
    fn get(&self, id: &str) -> Option<&Arc<R>> {
        self.by_id.get(id)
    }

    fn insert(&mut self, id: String, rec: Arc<R>) {
        if let Some(old) = self.by_id.insert(id.clone(), rec.clone()) {
            self.unlink_record(&id, &old);
        }
        if let Some(uid) = rec.labels().get(labels::POD_UID) {
            link(&mut self.by_pod, uid, &id);
        }
        if let Some(sandbox) = rec.sandbox() {
            link(&mut self.by_sandbox, sandbox, &id);
        }
    }

    fn remove(&mut self, id: &str) -> Option<Arc<R>> {
        let old = self.by_id.remove(id)?;
        self.unlink_record(id, &old);
        Some(old)
    }

    fn unlink_record(&mut self, id: &str, rec: &R) {
        if let Some(uid) = rec.labels().get(labels::POD_UID) {
            unlink(&mut self.by_pod, uid, id);
        }
        if let Some(sandbox) = rec.sandbox() {
            unlink(&mut self.by_sandbox, sandbox, id);
        }
    }

    /// The IDs of sandbox `id`'s containers.
    fn ids_of_sandbox(&self, id: &str) -> Vec<String> {
        self.by_sandbox.get(id).cloned().unwrap_or_default()
    }

    /// The IDs of pod `uid`'s records.
    fn ids_of_pod(&self, uid: &str) -> Vec<String> {
        self.by_pod.get(uid).cloned().unwrap_or_default()
    }
}

/// Each of `ids` through `get`, leaving out those `gone` says were removed meanwhile.
fn look_up<R>(
    ids: Vec<String>,
    get: impl Fn(&str) -> Result<Arc<R>, ProcessError>,
    gone: impl Fn(&ProcessError) -> bool,
) -> Result<Vec<Arc<R>>, ProcessError> {
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        match get(&id) {
            Ok(r) => out.push(r),
            Err(e) if gone(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Directory entries of `dir` that are valid IDs.
fn list_ids(dir: &Path) -> Result<Vec<String>, ProcessError> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(state_error("listing", dir, source)),
    };
    Ok(rd
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| valid_id(n))
        .collect())
}

/// Shims of containers under `root` whose state is gone (the root directory was removed while
/// no runtime was there to restore it): their containers can be neither reported nor stopped,
/// and the pods would be started a second time beside them. Kill them (the container dies with
/// its shim), remove the cgroups they were in, and say so once.
fn reap_orphans(root: &Path, cgroups: Option<&CgroupDriver>) {
    let containers = root.join("containers");
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    let mut reaped = Vec::new();
    for entry in procs.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        let Some(dir) = args
            .windows(2)
            .find(|w| w[0] == b"run")
            .map(|w| PathBuf::from(String::from_utf8_lossy(w[1]).into_owned()))
        else {
            continue;
        };
        if dir.parent() != Some(containers.as_path()) || dir.join(CONFIG_FILE).exists() {
            continue;
        }
        let cgroup_dirs = cgroups
            .map(|_| process_cgroup_dirs(pid))
            .unwrap_or_default();
        if kill(Pid::from_raw(pid as i32), Signal::SIGKILL).is_ok() {
            reaped.push(pid);
        }
        for d in cgroup_dirs {
            for _ in 0..50 {
                match remove_tree_once(&d) {
                    Ok(_) => break,
                    Err(_) => std::thread::sleep(POLL),
                }
            }
            // The sandbox's cgroup, once its last container's is gone.
            if let Some(parent) = d.parent() {
                let _ = std::fs::remove_dir(parent);
            }
        }
    }
    if !reaped.is_empty() {
        tracing::warn!(
            root = %root.display(),
            shims = ?reaped,
            "found {} container supervisor(s) whose state under the root directory is gone; \
             killed them and their containers (their pods are started afresh)",
            reaped.len()
        );
    }
}

/// The cgroup directories of process `pid` below the cgroup mounts (v1 and v2), from
/// `/proc/<pid>/cgroup` and `/proc/self/mountinfo`; the root cgroup is skipped.
fn process_cgroup_dirs(pid: u32) -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
        return Vec::new();
    };
    let mounts = crate::cgroup::parse_mountinfo(
        &std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default(),
    );
    let mut out = Vec::new();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let rel = path.trim_start_matches('/');
        if rel.is_empty() {
            continue;
        }
        if ctrls.is_empty() {
            out.extend(mounts.v2.iter().map(|mp| mp.join(rel)));
        } else {
            for (mp, have) in &mounts.v1 {
                if ctrls.split(',').any(|c| have.iter().any(|h| h == c)) {
                    out.push(mp.join(rel));
                }
            }
        }
    }
    out.retain(|d| d.is_dir());
    kubelet_api::sort::by(&mut out, Ord::cmp);
    out.dedup();
    out
}

/// The host's primary IP: the source address of the default route, else `127.0.0.1`.
fn host_ip() -> String {
    let probe = || -> std::io::Result<std::net::IpAddr> {
        let s = std::net::UdpSocket::bind("0.0.0.0:0")?;
        // connect() on UDP sends nothing; it only selects a route and a source address.
        s.connect("192.0.2.1:9")?;
        Ok(s.local_addr()?.ip())
    };
    match probe() {
        Ok(ip) if !ip.is_unspecified() => ip.to_string(),
        _ => "127.0.0.1".to_string(),
    }
}

fn sandbox_state(rec: &SandboxRecord) -> SandboxState {
    if rec.ready {
        SandboxState::Ready
    } else {
        SandboxState::NotReady
    }
}

fn sandbox_of(rec: &SandboxRecord) -> PodSandbox {
    PodSandbox {
        id: rec.id.clone(),
        metadata: PodSandboxMetadata {
            name: rec.name.clone(),
            namespace: rec.namespace.clone(),
            uid: rec.uid.clone(),
            attempt: rec.attempt,
        },
        state: sandbox_state(rec),
        created_at: rec.created_at,
        labels: rec.labels.clone(),
        annotations: rec.annotations.clone(),
    }
}

#[async_trait]
impl ContainerRuntime for ProcessRuntime {
    async fn version(&self) -> kubelet_api::Result<RuntimeVersion> {
        Ok(RuntimeVersion {
            runtime_name: "process".to_string(),
            runtime_version: env!("CARGO_PKG_VERSION").to_string(),
            runtime_api_version: "v1".to_string(),
        })
    }

    async fn status(&self) -> kubelet_api::Result<RuntimeStatus> {
        Ok(RuntimeStatus::all_ready())
    }

    async fn run_pod_sandbox(&self, config: &PodSandboxConfig) -> kubelet_api::Result<String> {
        Ok(self.run_sandbox(config)?)
    }

    async fn stop_pod_sandbox(&self, sandbox_id: &str) -> kubelet_api::Result<()> {
        Ok(self.stop_sandbox(sandbox_id).await?)
    }

    async fn remove_pod_sandbox(&self, sandbox_id: &str) -> kubelet_api::Result<()> {
        Ok(self.remove_sandbox(sandbox_id).await?)
    }

    async fn pod_sandbox_status(&self, sandbox_id: &str) -> kubelet_api::Result<PodSandboxStatus> {
        let rec = self.sandbox(sandbox_id)?;
        let s = sandbox_of(&rec);
        Ok({
            let mut v = PodSandboxStatus::default();
            v.id = s.id;
            v.metadata = s.metadata;
            v.state = s.state;
            v.created_at = s.created_at;
            v.ip = Some(rec.ip.clone());
            v.additional_ips = Vec::new();
            v.host_network = true;
            v.labels = s.labels;
            v.annotations = s.annotations;
            v
        })
    }

    async fn list_pod_sandboxes(
        &self,
        filter: &SandboxFilter,
    ) -> kubelet_api::Result<Vec<PodSandbox>> {
        let records = match &filter.id {
            Some(id) => match self.sandbox(id) {
                Ok(r) => vec![r],
                Err(ProcessError::SandboxNotFound(_) | ProcessError::InvalidId(_)) => Vec::new(),
                Err(e) => return Err(e.into()),
            },
            None => match filter.label_selector.get(labels::POD_UID) {
                Some(uid) => self.sandboxes_of_pod(uid)?,
                None => self.sandboxes()?,
            },
        };
        // Filtered before they are copied: a pod's inspection asks for its own sandboxes.
        Ok(records
            .iter()
            .filter(|r| filter.state.is_none_or(|st| st == sandbox_state(r)))
            .filter(|r| labels_match(&r.labels, &filter.label_selector))
            .map(|r| sandbox_of(r))
            .collect())
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        config: &ContainerConfig,
        _sandbox_config: &PodSandboxConfig,
    ) -> kubelet_api::Result<String> {
        self.create(sandbox_id, config).map_err(|e| {
            tracing::warn!(sandbox = %sandbox_id, containerName = %config.metadata.name, error = %kubelet_api::chain(&e), "create_container failed");
            e.into()
        })
    }

    async fn start_container(&self, container_id: &str) -> kubelet_api::Result<()> {
        self.start(container_id).await.map_err(|e| {
            tracing::warn!(containerID = %container_id, error = %kubelet_api::chain(&e), "start_container failed");
            e.into()
        })
    }

    async fn stop_container(
        &self,
        container_id: &str,
        timeout: Duration,
    ) -> kubelet_api::Result<()> {
        Ok(self.stop(container_id, timeout).await?)
    }

    async fn remove_container(&self, container_id: &str) -> kubelet_api::Result<()> {
        Ok(self.remove(container_id).await?)
    }

    async fn list_containers(
        &self,
        filter: &ContainerFilter,
    ) -> kubelet_api::Result<Vec<Container>> {
        let records = match &filter.id {
            Some(id) => match self.container(id) {
                Ok(r) => vec![r],
                Err(ProcessError::ContainerNotFound(_) | ProcessError::InvalidId(_)) => Vec::new(),
                Err(e) => return Err(e.into()),
            },
            None => match filter.label_selector.get(labels::POD_UID) {
                Some(uid) => self.containers_of_pod(uid)?,
                None => self.all_containers()?,
            },
        };
        let mut out = Vec::new();
        for rec in records {
            if filter
                .pod_sandbox_id
                .as_ref()
                .is_some_and(|s| *s != rec.sandbox_id)
                || !labels_match(&rec.labels, &filter.label_selector)
            {
                continue;
            }
            // A container a stream vouches for is running: no files or `/proc` to read (the
            // log rotation and the GC list every running container every few seconds).
            let vouched = self.vouched.lock().contains(&rec.id);
            let state = if vouched {
                Ok(ContainerState::Running)
            } else {
                self.observe(&rec).map(|o| o.state)
            };
            let state = match state {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(containerID = %rec.id, error = %kubelet_api::chain(&e), "container state unreadable");
                    ContainerState::Unknown
                }
            };
            if filter.state.is_some_and(|s| s != state) {
                continue;
            }
            out.push(Container {
                id: rec.id.clone(),
                pod_sandbox_id: rec.sandbox_id.clone(),
                metadata: ContainerMetadata {
                    name: rec.name.clone(),
                    attempt: rec.attempt,
                },
                image: rec.image.clone(),
                image_ref: rec.image.clone(),
                state,
                created_at: rec.created_at,
                labels: rec.labels.clone(),
                annotations: rec.annotations.clone(),
            });
        }
        Ok(out)
    }

    async fn container_status(&self, container_id: &str) -> kubelet_api::Result<ContainerStatus> {
        let rec = self.container(container_id)?;
        Ok(self.status_of(&rec)?)
    }

    async fn exec_sync(
        &self,
        container_id: &str,
        cmd: &[String],
        timeout: Duration,
    ) -> kubelet_api::Result<ExecResult> {
        Ok(self.exec(container_id, cmd, timeout).await?)
    }

    /// Exec, attach and port-forward served in process (see the crate documentation).
    fn streaming(&self) -> Option<&dyn kubelet_api::StreamingRuntime> {
        Some(self)
    }

    /// Tell the container's shim to open its log file anew (over the `reopen-log` FIFO in
    /// the container's state directory), then wait until the file exists again (at most 2 s).
    /// Containers have no images: [`images`](ContainerRuntime::images) stays `None`.
    async fn update_container_resources(
        &self,
        container_id: &str,
        resources: &LinuxResources,
    ) -> kubelet_api::Result<()> {
        Ok(self.update_resources(container_id, resources)?)
    }

    async fn reopen_container_log(&self, container_id: &str) -> kubelet_api::Result<()> {
        Ok(self.reopen_log(container_id).await?)
    }

    /// Container and sandbox events from inotify on the state directory; see the
    /// [crate documentation](crate#events).
    async fn container_events(&self) -> kubelet_api::Result<ContainerEventStream> {
        Ok(crate::events::container_events(
            &self.config.root_dir,
            self.vouched.clone(),
        )?)
    }

    async fn container_stats(&self, container_id: &str) -> kubelet_api::Result<ContainerStats> {
        Ok(self.stats(container_id)?)
    }

    /// Every container's figures in one pass over the records (exited containers included,
    /// with what their cgroup still says).
    async fn list_container_stats(&self) -> kubelet_api::Result<Vec<ContainerStats>> {
        let mut out = Vec::new();
        for rec in self.all_containers()? {
            match self.stats(&rec.id) {
                Ok(s) => out.push(s),
                Err(ProcessError::ContainerNotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record type for the index alone: labels and, for a container, its sandbox.
    struct Labels(std::collections::BTreeMap<String, String>, Option<String>);

    impl Labelled for Labels {
        fn labels(&self) -> &std::collections::BTreeMap<String, String> {
            &self.0
        }
        fn sandbox(&self) -> Option<&str> {
            self.1.as_deref()
        }
    }

    fn of_pod(uid: Option<&str>) -> Arc<Labels> {
        in_sandbox(uid, None)
    }

    fn in_sandbox(uid: Option<&str>, sandbox: Option<&str>) -> Arc<Labels> {
        Arc::new(Labels(
            uid.map(|u| (labels::POD_UID.to_string(), u.to_string()))
                .into_iter()
                .collect(),
            sandbox.map(str::to_string),
        ))
    }

    #[test]
    fn containers_are_indexed_by_sandbox_whatever_their_labels() {
        let mut r: Records<Labels> = Records::default();
        r.insert("a".into(), in_sandbox(Some("p1"), Some("s1")));
        r.insert("b".into(), in_sandbox(None, Some("s1")));
        r.insert("c".into(), in_sandbox(Some("p1"), Some("s2")));
        r.insert("s1".into(), in_sandbox(Some("p1"), None));
        let mut s1 = r.ids_of_sandbox("s1");
        s1.sort();
        assert_eq!(s1, ["a", "b"], "a container without the pod's label too");
        assert_eq!(r.ids_of_sandbox("s2"), ["c"]);
        // A re-read lists it once; a removal takes it out, and the empty entry goes.
        r.insert("c".into(), in_sandbox(Some("p1"), Some("s2")));
        assert_eq!(r.ids_of_sandbox("s2"), ["c"]);
        assert!(r.remove("c").is_some());
        assert!(r.ids_of_sandbox("s2").is_empty());
        assert!(!r.by_sandbox.contains_key("s2"));
        assert!(r.ids_of_sandbox("s1").len() == 2 && r.by_sandbox.len() == 1);
    }

    #[test]
    fn the_index_follows_inserts_replacements_and_removals() {
        let mut r: Records<Labels> = Records::default();
        r.insert("a".into(), of_pod(Some("p1")));
        r.insert("b".into(), of_pod(Some("p1")));
        r.insert("c".into(), of_pod(Some("p2")));
        r.insert("d".into(), of_pod(None));
        let mut p1 = r.ids_of_pod("p1");
        p1.sort();
        assert_eq!(p1, ["a", "b"]);
        assert_eq!(r.ids_of_pod("p2"), ["c"]);
        // The same record again (a re-read) is listed once; a record relabelled moves.
        r.insert("a".into(), of_pod(Some("p1")));
        r.insert("b".into(), of_pod(Some("p2")));
        assert_eq!(r.ids_of_pod("p1"), ["a"]);
        let mut p2 = r.ids_of_pod("p2");
        p2.sort();
        assert_eq!(p2, ["b", "c"]);
        assert!(r.remove("a").is_some());
        assert!(r.remove("a").is_none());
        assert!(r.ids_of_pod("p1").is_empty());
        assert!(!r.by_pod.contains_key("p1"), "empty entries are dropped");
        assert!(r.get("d").is_some() && r.remove("d").is_some());
        assert_eq!(r.by_id.len(), 2);
    }

    fn ev(n: &str, v: &str) -> EnvVar {
        EnvVar {
            name: n.to_string(),
            value: v.to_string(),
        }
    }

    #[test]
    fn env_is_exactly_the_given_vars_plus_a_default_path() {
        let env = container_env(&[ev("A", "1"), ev("B", "two words")]);
        assert_eq!(
            env,
            vec![
                ("A".to_string(), "1".to_string()),
                ("B".to_string(), "two words".to_string()),
                ("PATH".to_string(), DEFAULT_PATH.to_string()),
            ]
        );
    }

    #[test]
    fn env_keeps_a_given_path_and_lets_later_duplicates_win() {
        let env = container_env(&[ev("PATH", "/opt/bin"), ev("A", "1"), ev("A", "2")]);
        assert_eq!(
            env,
            vec![
                ("PATH".to_string(), "/opt/bin".to_string()),
                ("A".to_string(), "2".to_string()),
            ]
        );
    }
}
