//! The per-container supervisor ("shim").
//!
//! Only a parent can collect a process's exit status, and a container must outlive the agent
//! that started it. So the runtime starts one small shim process per container, in its own
//! session; the shim
//!
//! 1. moves itself into the container's cgroup (when cgroups are in use), so that the container
//!    process inherits it from the first instruction on — the shim's own few hundred KiB are
//!    charged to the container;
//! 2. spawns the container process in its own process group, with exactly the recorded
//!    environment and working directory, and with SIGKILL as its parent-death signal: if the
//!    shim is killed, the kernel kills the container at once, so no container runs without a
//!    supervisor (the runtime then records the exit and cleans up what is left);
//! 3. records the process's PID and `/proc` start time (`started.json`);
//! 4. copies stdout and stderr to the container's log file in the CRI log format;
//! 5. waits for the exit, kills what is left of the process group and the cgroup (as a
//!    container runtime does when the init process of a container exits), reads the cgroup's
//!    OOM-kill counter, and writes `exit.json` atomically (in place into the preallocated
//!    `exit.slot` when the disk is full).
//!
//! The runtime reads these files; it never needs to be the container's parent.
//!
//! # Launching the shim
//! The shim is [`run_shim`]. The `kubelet-process-shim` binary of this crate calls it. A host
//! binary can instead embed it: configure
//! [`ShimCommand::CurrentExe`](crate::ShimCommand::CurrentExe) and call [`maybe_run_shim`]
//! first thing in `main`:
//!
//! ```no_run
//! use std::process::ExitCode;
//!
//! fn main() -> ExitCode {
//!     if let Some(code) = kubelet_process::shim::maybe_run_shim() {
//!         return code;
//!     }
//!     // ... the agent itself ...
//!     ExitCode::SUCCESS
//! }
//! ```

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::{BufReader, Read};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use parking_lot::Mutex;

use crate::record::{
    CONFIG_FILE, ContainerRecord, ExitRecord, STARTED_FILE, StartedRecord, proc_stat, read_json,
    write_exit, write_json,
};
use kubelet_api::cri_log::{LogStream as Stream, write_records};

/// First argument that makes [`maybe_run_shim`] run the shim instead of the host program.
pub const SHIM_MARKER: &str = "__kubelet-process-shim";

/// Exit code recorded when the container's process could not be started (as containerd does).
pub(crate) const START_ERROR_CODE: i32 = 128;

/// How long the shim waits for the log pumps after the process exited (descendants that
/// escaped the process group may keep the pipes open).
const PUMP_GRACE: Duration = Duration::from_secs(2);

/// Run the shim if this process was started as one (first argument [`SHIM_MARKER`]); returns
/// the exit code to return from `main`, or `None` when this is not a shim invocation.
pub fn maybe_run_shim() -> Option<ExitCode> {
    let mut args = std::env::args_os().skip(1);
    if args.next()? != SHIM_MARKER {
        return None;
    }
    Some(run_shim(args))
}

/// The shim's entry point; `args` excludes the program name (and the marker).
///
/// Forms: `run <container state dir>` supervises a container; `exec [--cgroup-procs FILE]...
/// [--uid N] [--gid N] -- CMD [ARG]...` joins the cgroup and replaces itself with `CMD` (used
/// by `exec_sync`).
pub fn run_shim(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let args: Vec<OsString> = args.into_iter().collect();
    match args.first().and_then(|a| a.to_str()) {
        Some("run") if args.len() == 2 => run_container(Path::new(&args[1])),
        Some("exec") => exec(&args[1..]),
        _ => {
            eprintln!(
                "kubelet-process-shim: usage: run <state-dir> | exec [--cgroup-procs FILE]... \
                 [--uid N] [--gid N] -- CMD [ARG]..."
            );
            ExitCode::from(2)
        }
    }
}

fn log(msg: impl std::fmt::Display) {
    eprintln!(
        "{} kubelet-process-shim[{}]: {msg}",
        Timestamp::now(),
        std::process::id()
    );
}

fn record_start_error(dir: &Path, message: String) -> ExitCode {
    log(format_args!("start failed: {message}"));
    let rec = ExitRecord {
        exit_code: START_ERROR_CODE,
        signal: None,
        finished_at: Timestamp::now(),
        reason: "StartError".to_string(),
        message,
    };
    if let Err(e) = write_exit(dir, &rec) {
        log(format_args!("cannot write exit record: {e}"));
    }
    ExitCode::FAILURE
}

/// Create `<dir>/stdin` (a FIFO) and open it: a blocking read end for the process, and a write
/// end for the shim to keep.
fn stdin_fifo(dir: &Path) -> std::io::Result<(std::fs::File, std::fs::File)> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(crate::streaming::STDIN_FIFO);
    match nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)) {
        Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
        Err(e) => return Err(e.into()),
    }
    // Non-blocking so the open does not wait for a writer; the keeper then exists, and the
    // read end is switched back to blocking for the process.
    let read = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&path)?;
    let keeper = OpenOptions::new().write(true).open(&path)?;
    let flags = nix::fcntl::fcntl(&read, nix::fcntl::FcntlArg::F_GETFL)?;
    nix::fcntl::fcntl(
        &read,
        nix::fcntl::FcntlArg::F_SETFL(
            nix::fcntl::OFlag::from_bits_retain(flags) & !nix::fcntl::OFlag::O_NONBLOCK,
        ),
    )?;
    Ok((read, keeper))
}

/// The container's user, group, supplemental groups and `no_new_privs`. Without supplemental
/// groups std changes the user and group (dropping the agent's groups); with them a hook does it
/// in the child, groups first. Both run before the parent-death hook, which a credential change
/// would clear.
fn set_credentials(cmd: &mut Command, rec: &ContainerRecord) {
    use nix::unistd::{Gid, Uid};
    if rec.groups.is_empty() {
        if let Some(gid) = rec.gid {
            cmd.gid(gid);
        }
        if let Some(uid) = rec.uid {
            cmd.uid(uid);
        }
    } else {
        let groups: Vec<Gid> = rec.groups.iter().map(|g| Gid::from_raw(*g)).collect();
        let gid = rec.gid.map(Gid::from_raw);
        let uid = rec.uid.map(Uid::from_raw);
        let hook = move || -> std::io::Result<()> {
            let os = |e: nix::errno::Errno| std::io::Error::from_raw_os_error(e as i32);
            nix::unistd::setgroups(&groups).map_err(os)?;
            if let Some(g) = gid {
                nix::unistd::setgid(g).map_err(os)?;
            }
            if let Some(u) = uid {
                nix::unistd::setuid(u).map_err(os)?;
            }
            Ok(())
        };
        #[allow(unsafe_code)]
        // SAFETY: the hook runs in the child between fork and exec; it makes only the
        // setgroups, setgid and setuid system calls on memory allocated before the fork, and
        // takes no lock.
        unsafe {
            cmd.pre_exec(hook);
        }
    }
    if rec.no_new_privs {
        let hook = || -> std::io::Result<()> {
            nix::sys::prctl::set_no_new_privs()
                .map_err(|e| std::io::Error::from_raw_os_error(e as i32))
        };
        #[allow(unsafe_code)]
        // SAFETY: the hook runs in the child between fork and exec and makes one prctl call.
        unsafe {
            cmd.pre_exec(hook);
        }
    }
}

/// Give the shim (and so the container process it forks) the container's `oom_score_adj`. A
/// value below the current one needs `CAP_SYS_RESOURCE`; without it the current value stays
/// (as containerd's `restrict_oom_score_adj`), and the container runs anyway.
fn set_oom_score_adj(adj: i64) {
    let adj = adj.clamp(-1000, 1000);
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", adj.to_string()) {
        log(format_args!(
            "oom_score_adj {adj} not set ({e}); the inherited value stays"
        ));
    }
}

fn run_container(dir: &Path) -> ExitCode {
    // Leave the agent's session and process group: Ctrl-C or a terminal hang-up aimed at the
    // agent must not reach its containers.
    if let Err(e) = nix::unistd::setsid() {
        log(format_args!("setsid: {e}"));
    }
    let rec: ContainerRecord = match read_json(&dir.join(CONFIG_FILE)) {
        Ok(Some(r)) => r,
        Ok(None) => return record_start_error(dir, "container record missing".to_string()),
        Err(e) => return record_start_error(dir, e.to_string()),
    };
    if let Some(cg) = &rec.cgroup
        && let Err(e) = cg.join(std::process::id())
    {
        return record_start_error(dir, e.to_string());
    }
    if let Some(adj) = rec.resources.as_ref().and_then(|r| r.oom_score_adj) {
        set_oom_score_adj(adj);
    }
    let Some((program, args)) = rec.argv.split_first() else {
        return record_start_error(dir, "no command".to_string());
    };
    if let Some(parent) = rec.log_path.parent()
        && let Err(e) = std::fs::create_dir_all(parent)
    {
        return record_start_error(
            dir,
            format!("creating log directory {}: {e}", parent.display()),
        );
    }
    let log_file = match OpenOptions::new()
        .create(true)
        .append(true)
        .open(&rec.log_path)
    {
        Ok(f) => f,
        Err(e) => {
            return record_start_error(dir, format!("opening log {}: {e}", rec.log_path.display()));
        }
    };
    // `stdin: true`: a FIFO attach writes to. The shim holds a write end for the container's
    // lifetime, so the process sees no end of input between attaches.
    let (stdin, _stdin_keeper) = if rec.stdin {
        match stdin_fifo(dir) {
            Ok((read, keeper)) => (Stdio::from(read), Some(keeper)),
            Err(e) => return record_start_error(dir, format!("creating the stdin FIFO: {e}")),
        }
    } else {
        (Stdio::null(), None)
    };
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .envs(rec.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&rec.working_dir)
        .process_group(0)
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    set_credentials(&mut cmd, &rec);
    crate::pidfd::die_with_parent(&mut cmd, std::process::id());
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return record_start_error(dir, format!("exec {program:?}: {e}")),
    };
    let pid = child.id();
    let started = StartedRecord {
        pid,
        pid_start_time: proc_stat(pid).map(|s| s.start_time).unwrap_or(0),
        shim_pid: std::process::id(),
        shim_start_time: proc_stat(std::process::id())
            .map(|s| s.start_time)
            .unwrap_or(0),
        started_at: Timestamp::now(),
    };
    if let Err(e) = write_json(&dir.join(STARTED_FILE), &started) {
        let _ = child.kill();
        let _ = child.wait();
        return record_start_error(dir, format!("recording start: {e}"));
    }

    let sink = Arc::new(Mutex::new(log_file));
    if let Err(e) = listen_for_reopen(dir, &rec.log_path, sink.clone()) {
        // The container runs; only log rotation is unavailable for it.
        log(format_args!("log reopening unavailable: {e}"));
    }
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let mut pumps = 0;
    if let Some(out) = child.stdout.take() {
        pumps += 1;
        spawn_pump(out, Stream::Stdout, sink.clone(), done_tx.clone());
    }
    if let Some(err) = child.stderr.take() {
        pumps += 1;
        spawn_pump(err, Stream::Stderr, sink.clone(), done_tx.clone());
    }
    drop(done_tx);

    let status = loop {
        match child.wait() {
            Ok(s) => break Some(s),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                log(format_args!("waiting for pid {pid}: {e}"));
                break None;
            }
        }
    };

    // The container's main process is gone: so is the container. Kill what is left of it.
    let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
    if let Some(cg) = &rec.cgroup {
        let me = std::process::id();
        for p in cg.pids().into_iter().filter(|&p| p != me) {
            let _ = kill(Pid::from_raw(p as i32), Signal::SIGKILL);
        }
    }
    let deadline = Instant::now() + PUMP_GRACE;
    for _ in 0..pumps {
        let left = deadline.saturating_duration_since(Instant::now());
        if done_rx.recv_timeout(left).is_err() {
            log("log pumps still open after the process exited; closing the log");
            break;
        }
    }

    let (exit_code, signal) = match status {
        Some(s) => match (s.code(), s.signal()) {
            (Some(c), _) => (c, None),
            (None, Some(sig)) => (128 + sig, Some(sig)),
            (None, None) => (255, None),
        },
        None => (255, None),
    };
    let oom = rec.cgroup.as_ref().is_some_and(|cg| match cg.oom_kills() {
        Some(n) => n > 0,
        None => signal == Some(9) && cg.memory_failcnt().is_some_and(|n| n > 0),
    });
    let reason = if oom {
        "OOMKilled"
    } else if exit_code == 0 {
        "Completed"
    } else {
        "Error"
    };
    let message = rec
        .termination_message_path
        .as_deref()
        .and_then(|p| termination_message(p, started.started_at))
        .unwrap_or_default();
    let exit = ExitRecord {
        exit_code,
        signal,
        finished_at: Timestamp::now(),
        reason: reason.to_string(),
        message,
    };
    if let Err(e) = write_exit(dir, &exit) {
        log(format_args!("cannot write exit record: {e}"));
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// Serve `reopen_container_log`: each writer that opens the `reopen-log` FIFO in the state
/// directory makes the shim open `log_path` anew (after a log rotator renamed the full file)
/// and send later output there. The thread blocks in `open` between requests and ends with the
/// shim.
fn listen_for_reopen(
    dir: &Path,
    log_path: &Path,
    sink: Arc<Mutex<std::fs::File>>,
) -> std::io::Result<()> {
    let fifo = dir.join(crate::runtime::REOPEN_LOG_FIFO);
    match nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)) {
        Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
        Err(e) => return Err(e.into()),
    }
    let log_path = log_path.to_path_buf();
    std::thread::spawn(move || {
        loop {
            let mut request = match std::fs::File::open(&fifo) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    log(format_args!("log reopening stopped: {e}"));
                    return;
                }
            };
            let _ = std::io::copy(&mut request, &mut std::io::sink());
            // The writers wait while the new file is opened: once it exists, nothing more is
            // written to the old one (a follower drains the old file, then switches).
            let mut writer = sink.lock();
            match OpenOptions::new().create(true).append(true).open(&log_path) {
                Ok(f) => *writer = f,
                Err(e) => log(format_args!(
                    "reopening log {}: {e}; writing to the old file",
                    log_path.display()
                )),
            }
        }
    });
    Ok(())
}

fn spawn_pump(
    r: impl Read + Send + 'static,
    stream: Stream,
    sink: Arc<Mutex<std::fs::File>>,
    done: mpsc::Sender<()>,
) {
    std::thread::spawn(move || {
        write_records(BufReader::new(r), stream, |record| {
            let mut w = sink.lock();
            // A failing log write (disk full) must not kill the container: drop the line.
            let _ = std::io::Write::write_all(&mut *w, record)
                .and_then(|()| std::io::Write::flush(&mut *w));
        });
        let _ = done.send(());
    });
}

/// The termination message: the file at `path` on the host, if it was written after the
/// container started (the process runtime has no per-container filesystem). At most 4 KiB.
fn termination_message(path: &Path, started_at: Timestamp) -> Option<String> {
    let meta = std::fs::metadata(path).ok()?;
    let mtime = Timestamp::try_from(meta.modified().ok()?).ok()?;
    if mtime < started_at {
        return None;
    }
    let mut buf = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(4096)
        .read_to_end(&mut buf)
        .ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

fn exec(args: &[OsString]) -> ExitCode {
    let mut procs: Vec<PathBuf> = Vec::new();
    let mut uid = None;
    let mut gid = None;
    let mut i = 0;
    while i < args.len() {
        let a = args[i].to_str().unwrap_or("");
        let val = args.get(i + 1);
        match (a, val) {
            ("--", _) => {
                i += 1;
                break;
            }
            ("--cgroup-procs", Some(v)) => procs.push(PathBuf::from(v)),
            ("--uid", Some(v)) => uid = v.to_str().and_then(|s| s.parse::<u32>().ok()),
            ("--gid", Some(v)) => gid = v.to_str().and_then(|s| s.parse::<u32>().ok()),
            _ => {
                eprintln!("kubelet-process-shim exec: unexpected argument {a:?}");
                return ExitCode::from(2);
            }
        }
        i += 2;
    }
    let Some((program, rest)) = args.get(i..).and_then(|a| a.split_first()) else {
        eprintln!("kubelet-process-shim exec: no command");
        return ExitCode::from(2);
    };
    for f in &procs {
        if let Err(e) = std::fs::write(f, std::process::id().to_string()) {
            eprintln!(
                "kubelet-process-shim exec: joining cgroup {}: {e}",
                f.display()
            );
            return ExitCode::from(126);
        }
    }
    let mut cmd = Command::new(program);
    cmd.args(rest);
    if let Some(g) = gid {
        cmd.gid(g);
    }
    if let Some(u) = uid {
        cmd.uid(u);
    }
    let err = cmd.exec();
    eprintln!("exec {program:?}: {err}");
    ExitCode::from(if err.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    })
}
