//! Exec, attach and port-forward served by the process runtime itself
//! ([`StreamingRuntime`]).
//!
//! - **exec** runs the command as `exec_sync` does (the container's environment, working
//!   directory, user and cgroup), with pipes, or with a pseudo-terminal when `tty` is asked for
//!   (the process leads a new session with the terminal as its controlling one; resize events
//!   set the terminal's size). Ending the session kills the command's process group.
//! - **attach** follows the container's log from its current end (the shim writes everything
//!   the process prints there, in the CRI log format) and, for containers with `stdin: true`,
//!   writes to the FIFO the shim gave the process as its standard input.
//! - **port-forward** connects to the port on the host's loopback: containers of this runtime
//!   share the host's network.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use async_trait::async_trait;
use kubelet_api::{
    DuplexStream, ExecSession, PortDialer, PortForwardEndpoint, StreamEndpoint, StreamOptions,
    StreamingRuntime, TerminalSize,
};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;

use kubelet_api::cri_log::{LogStream, parse_record};

use crate::error::ProcessError;
use crate::runtime::ProcessRuntime;

/// The FIFO the shim gives a `stdin: true` container as standard input.
pub(crate) const STDIN_FIFO: &str = "stdin";

/// How long a terminal exec waits for the client's terminal size before it starts.
const FIRST_RESIZE_WAIT: Duration = Duration::from_secs(1);

/// How often attach looks for new log output.
const LOG_POLL: Duration = Duration::from_millis(50);

/// The master side of a pseudo-terminal, non-blocking, shared by a reader and a writer.
#[derive(Clone)]
struct PtyMaster(Arc<AsyncFd<OwnedFd>>);

impl AsyncRead for PtyMaster {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.0.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match guard
                .try_io(|fd| nix::unistd::read(fd.get_ref(), unfilled).map_err(io::Error::from))
            {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                // Every slave descriptor closed (the process and its children ended): EOF.
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Poll::Ready(Ok(())),
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for PtyMaster {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.0.poll_write_ready(cx))?;
            match guard.try_io(|fd| nix::unistd::write(fd.get_ref(), data).map_err(io::Error::from))
            {
                Ok(r) => return Poll::Ready(r),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// End of input on a terminal is the EOF character (^D), as a user would type it.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_write(cx, &[0x04]).map_ok(|_| ())
    }
}

fn set_size(master: &OwnedFd, size: TerminalSize) {
    let ws = libc::winsize {
        ws_row: size.height,
        ws_col: size.width,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one `winsize` from the pointer, which lives across the call;
    // `master` is an open descriptor.
    #[allow(unsafe_code)]
    unsafe {
        libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws);
    }
}

/// Make the child a session leader with the terminal on its standard input as its controlling
/// terminal (what a login shell expects).
fn controlling_terminal(cmd: &mut tokio::process::Command) {
    // SAFETY: the hook runs in the child between fork and exec and calls only the
    // async-signal-safe `setsid` and `ioctl`.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Kills a process group unless disarmed (the session ended before the process did).
struct KillOnDrop(Option<i32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(pgid) = self.0 {
            let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
        }
    }
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        (None, None) => 255,
    }
}

impl ProcessRuntime {
    fn exec_session(
        &self,
        id: &str,
        cmd: &[String],
        opts: StreamOptions,
    ) -> Result<ExecSession, ProcessError> {
        let mut command = self.exec_command(id, cmd)?;
        let spawn_err = |source| ProcessError::ExecSpawn {
            id: id.to_string(),
            source,
        };
        let (child, session) = if opts.tty {
            let pty = nix::pty::openpty(None, None).map_err(|e| spawn_err(io::Error::from(e)))?;
            let slave = pty.slave;
            let dup = |fd: &OwnedFd| fd.try_clone().map_err(spawn_err);
            command
                .stdin(Stdio::from(dup(&slave)?))
                .stdout(Stdio::from(dup(&slave)?))
                .stderr(Stdio::from(slave));
            controlling_terminal(&mut command);
            let flags = nix::fcntl::fcntl(&pty.master, nix::fcntl::FcntlArg::F_GETFL)
                .map_err(|e| spawn_err(io::Error::from(e)))?;
            nix::fcntl::fcntl(
                &pty.master,
                nix::fcntl::FcntlArg::F_SETFL(
                    nix::fcntl::OFlag::from_bits_retain(flags) | nix::fcntl::OFlag::O_NONBLOCK,
                ),
            )
            .map_err(|e| spawn_err(io::Error::from(e)))?;
            let resize_fd = pty.master.try_clone().map_err(spawn_err)?;
            // SAFETY: the master `OwnedFd` is moved into the `AsyncFd`, which owns it until it is
            // dropped (and deregisters it then); nothing else closes it.
            #[allow(unsafe_code)]
            let registered = unsafe {
                AsyncFd::register_with_interest(
                    pty.master,
                    tokio::io::Interest::READABLE | tokio::io::Interest::WRITABLE,
                )
            };
            let master = PtyMaster(Arc::new(
                registered.map_err(|e| spawn_err(io::Error::other(e.to_string())))?,
            ));
            let (resize_tx, mut resize_rx) = mpsc::channel::<TerminalSize>(8);
            // The process starts once the terminal has the client's size (its first resize
            // event, sent as soon as its streams are open), or after a second without one, so
            // that a program that reads the size at start sees the right one.
            let (child_tx, child_rx) =
                tokio::sync::oneshot::channel::<io::Result<tokio::process::Child>>();
            tokio::spawn(async move {
                if let Ok(Some(size)) =
                    tokio::time::timeout(FIRST_RESIZE_WAIT, resize_rx.recv()).await
                {
                    set_size(&resize_fd, size);
                }
                if child_tx.is_closed() {
                    return;
                }
                let spawned = command.spawn();
                if let Err(Ok(mut child)) = child_tx.send(spawned) {
                    // The session ended meanwhile.
                    let _ = child.start_kill();
                }
                while let Some(size) = resize_rx.recv().await {
                    set_size(&resize_fd, size);
                }
            });
            let id = id.to_string();
            let container_dir = self.state_dir(&id);
            return Ok(ExecSession {
                stdin: opts
                    .stdin
                    .then(|| Box::pin(master.clone()) as kubelet_api::StreamWriter),
                stdout: Some(Box::pin(master)),
                stderr: None,
                resize: Some(resize_tx),
                exit: Box::pin(async move {
                    let spawned = child_rx.await.map_err(|_| {
                        kubelet_api::Error::internal("exec session ended before it started")
                    })?;
                    let mut child = spawned.map_err(|source| {
                        kubelet_api::Error::from(ProcessError::ExecSpawn {
                            id: id.clone(),
                            source,
                        })
                    })?;
                    let mut guard = KillOnDrop(child.id().map(|p| p as i32));
                    let _record = child
                        .id()
                        .and_then(|p| crate::execs::ExecRecord::create(&container_dir, p));
                    let status = child.wait().await.map_err(|source| {
                        kubelet_api::Error::from(ProcessError::ExecSpawn { id, source })
                    })?;
                    if let Some(pg) = guard.0.take() {
                        let _ = killpg(Pid::from_raw(pg), Signal::SIGKILL);
                    }
                    Ok(exit_code(status))
                }),
            });
        } else {
            command
                .process_group(0)
                .stdin(if opts.stdin {
                    Stdio::piped()
                } else {
                    Stdio::null()
                })
                .stdout(if opts.stdout {
                    Stdio::piped()
                } else {
                    Stdio::null()
                })
                .stderr(if opts.stderr {
                    Stdio::piped()
                } else {
                    Stdio::null()
                });
            let mut child = command.spawn().map_err(spawn_err)?;
            let session = ExecSession {
                stdin: child
                    .stdin
                    .take()
                    .map(|s| Box::pin(s) as kubelet_api::StreamWriter),
                stdout: child
                    .stdout
                    .take()
                    .map(|s| Box::pin(s) as kubelet_api::StreamReader),
                stderr: child
                    .stderr
                    .take()
                    .map(|s| Box::pin(s) as kubelet_api::StreamReader),
                resize: None,
                exit: Box::pin(std::future::pending()),
            };
            (child, session)
        };
        let mut child = child;
        let guard = KillOnDrop(child.id().map(|p| p as i32));
        let record = child
            .id()
            .and_then(|p| crate::execs::ExecRecord::create(&self.state_dir(id), p));
        let id = id.to_string();
        Ok(ExecSession {
            exit: Box::pin(async move {
                let mut guard = guard;
                let _record = record;
                let status = child.wait().await.map_err(|source| {
                    kubelet_api::Error::from(ProcessError::ExecSpawn { id, source })
                })?;
                // Whatever the command left in its group goes with it, as a CRI exec ends.
                let code = exit_code(status);
                if let Some(pg) = guard.0.take() {
                    let _ = killpg(Pid::from_raw(pg), Signal::SIGKILL);
                }
                Ok(code)
            }),
            ..session
        })
    }

    fn attach_session(&self, id: &str, opts: StreamOptions) -> Result<ExecSession, ProcessError> {
        let rec = self.container_record(id)?;
        let Some(pid) = self.running_pid(&rec)? else {
            return Err(ProcessError::NotRunning(id.to_string()));
        };
        let dir = self.state_dir(id);
        // Without `stdin: true` there is nothing to write to: the client's input is dropped,
        // as the kubelet does for such containers.
        let fifo = dir.join(STDIN_FIFO);
        let stdin = if opts.stdin && rec.stdin && fifo.exists() {
            let state_err = |source| ProcessError::State {
                op: "opening",
                path: fifo.clone(),
                source,
            };
            let w = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&fifo)
                .map_err(state_err)?;
            let pipe = tokio::net::unix::pipe::Sender::from_file(w).map_err(state_err)?;
            Some(Box::pin(pipe) as kubelet_api::StreamWriter)
        } else {
            None
        };
        let log = rec.log_path.clone();
        let start = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
        let want_out = opts.stdout;
        let want_err = opts.stderr && !opts.tty;
        let (out_tx, out_rx) = tokio::io::duplex(64 * 1024);
        let (err_tx, err_rx) = tokio::io::duplex(64 * 1024);
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<i32>();
        tokio::spawn(async move {
            let code = follow_log(
                &log,
                start,
                want_out.then_some(out_tx),
                want_err.then_some(err_tx),
                &dir,
                pid,
            )
            .await;
            let _ = done_tx.send(code);
        });
        Ok(ExecSession {
            stdin,
            stdout: want_out.then(|| Box::pin(out_rx) as kubelet_api::StreamReader),
            stderr: want_err.then(|| Box::pin(err_rx) as kubelet_api::StreamReader),
            resize: None,
            exit: Box::pin(async move { Ok(done_rx.await.unwrap_or(0)) }),
        })
    }
}

use std::os::unix::fs::OpenOptionsExt;

/// Copy the log's new lines from `start` to the writers (by stream) until the container
/// exits; returns its exit code.
async fn follow_log(
    log: &Path,
    start: u64,
    mut out: Option<tokio::io::DuplexStream>,
    mut err: Option<tokio::io::DuplexStream>,
    dir: &Path,
    pid: u32,
) -> i32 {
    use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};
    let mut pos = start;
    let mut pending = Vec::new();
    let mut last_round = false;
    loop {
        if let Ok(mut f) = tokio::fs::File::open(log).await {
            let len = f.metadata().await.map(|m| m.len()).unwrap_or(0);
            if len < pos {
                // Rotated or truncated: start over.
                pos = 0;
            }
            if f.seek(io::SeekFrom::Start(pos)).await.is_ok() {
                let mut chunk = Vec::new();
                if let Ok(n) = f.read_to_end(&mut chunk).await {
                    pos += n as u64;
                    pending.extend_from_slice(&chunk);
                }
            }
        }
        while let Some(nl) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=nl).collect();
            let Some(record) = parse_record(&line) else {
                continue;
            };
            let target = match record.stream {
                LogStream::Stderr => &mut err,
                LogStream::Stdout => &mut out,
            };
            // A full record's content ends with its newline; a partial one's does not go on.
            let text = if record.partial {
                record.content.strip_suffix(b"\n").unwrap_or(record.content)
            } else {
                record.content
            };
            if let Some(w) = target.as_mut()
                && w.write_all(text).await.is_err()
            {
                *target = None;
            }
        }
        if last_round {
            break;
        }
        let exited = dir.join(crate::record::EXIT_FILE).exists()
            || !Path::new(&format!("/proc/{pid}")).exists();
        if exited {
            // One more read for what was written just before the exit.
            last_round = true;
        }
        tokio::time::sleep(LOG_POLL).await;
    }
    crate::record::read_json::<crate::record::ExitRecord>(&dir.join(crate::record::EXIT_FILE))
        .ok()
        .flatten()
        .map_or(0, |e| e.exit_code)
}

/// Connections to the host's loopback (process-runtime pods share the host's network).
struct HostDialer {
    sandbox_id: String,
}

#[async_trait]
impl PortDialer for HostDialer {
    async fn dial(&self, port: u16) -> kubelet_api::Result<Box<dyn DuplexStream>> {
        match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                Ok(Box::new(s))
            }
            Err(e) => Err(kubelet_api::Error::unavailable(format!(
                "error forwarding port {port} to pod {}, uid : dial tcp4 127.0.0.1:{port}: {e}",
                self.sandbox_id
            ))),
        }
    }
}

#[async_trait]
impl StreamingRuntime for ProcessRuntime {
    async fn exec(
        &self,
        container_id: &str,
        cmd: &[String],
        options: StreamOptions,
    ) -> kubelet_api::Result<StreamEndpoint> {
        Ok(StreamEndpoint::Session(self.exec_session(
            container_id,
            cmd,
            options,
        )?))
    }

    async fn attach(
        &self,
        container_id: &str,
        options: StreamOptions,
    ) -> kubelet_api::Result<StreamEndpoint> {
        Ok(StreamEndpoint::Session(
            self.attach_session(container_id, options)?,
        ))
    }

    async fn port_forward(
        &self,
        sandbox_id: &str,
        _ports: &[u16],
    ) -> kubelet_api::Result<PortForwardEndpoint> {
        if !self.has_sandbox(sandbox_id) {
            return Err(ProcessError::SandboxNotFound(sandbox_id.to_string()).into());
        }
        Ok(PortForwardEndpoint::Dialer(Arc::new(HostDialer {
            sandbox_id: sandbox_id.to_string(),
        })))
    }
}
