//! The streaming capability of a runtime: `kubectl exec`, `attach` and `port-forward`
//! ([`StreamingRuntime`], reached through
//! [`ContainerRuntime::streaming`](crate::ContainerRuntime::streaming)).
//!
//! A runtime answers each request in one of two ways:
//! - with the streams themselves ([`StreamEndpoint::Session`], [`PortForwardEndpoint::Dialer`]):
//!   the agent's server speaks the client's protocol (SPDY or WebSocket) and copies bytes between
//!   the client and these streams. The process runtime does this, and so can any runtime an
//!   embedder writes;
//! - with the URL of the runtime's own streaming server ([`StreamEndpoint::Url`],
//!   [`PortForwardEndpoint::Url`]), as CRI runtimes do: the agent's server proxies the client's
//!   upgraded connection to it, as current kubelets do.
//!
//! A runtime adds the capability by implementing [`StreamingRuntime`] and returning it from
//! [`ContainerRuntime::streaming`](crate::ContainerRuntime::streaming); the agent's server
//! (`kubelet-server`, added by the builder's facade) then serves `kubectl exec` and the rest.
//! An exec that runs host commands with pipes:
//!
//! ```no_run
//! use std::process::Stdio;
//! use kubelet_api::{
//!     Error, ExecSession, PortForwardEndpoint, Result, StreamEndpoint, StreamOptions,
//!     StreamingRuntime,
//! };
//!
//! struct HostExec;
//!
//! #[async_trait::async_trait]
//! impl StreamingRuntime for HostExec {
//!     async fn exec(&self, _id: &str, cmd: &[String], o: StreamOptions) -> Result<StreamEndpoint> {
//!         let (program, args) = cmd
//!             .split_first()
//!             .ok_or_else(|| Error::invalid_argument("no command"))?;
//!         let mut child = tokio::process::Command::new(program)
//!             .args(args)
//!             .stdin(if o.stdin { Stdio::piped() } else { Stdio::null() })
//!             .stdout(Stdio::piped())
//!             .stderr(Stdio::piped())
//!             .kill_on_drop(true)
//!             .spawn()
//!             .map_err(|e| Error::internal(e.to_string()))?;
//!         Ok(StreamEndpoint::Session(ExecSession {
//!             stdin: child.stdin.take().map(|s| Box::pin(s) as _),
//!             stdout: child.stdout.take().map(|s| Box::pin(s) as _),
//!             stderr: child.stderr.take().map(|s| Box::pin(s) as _),
//!             resize: None,
//!             exit: Box::pin(async move {
//!                 let status = child.wait().await.map_err(|e| Error::internal(e.to_string()))?;
//!                 Ok(status.code().unwrap_or(255))
//!             }),
//!         }))
//!     }
//!     async fn attach(&self, _id: &str, _o: StreamOptions) -> Result<StreamEndpoint> {
//!         Err(Error::unsupported("attach"))
//!     }
//!     async fn port_forward(&self, _id: &str, _ports: &[u16]) -> Result<PortForwardEndpoint> {
//!         Err(Error::unsupported("port-forward"))
//!     }
//! }
//!
//! // In the runtime's `impl ContainerRuntime`:
//! //     fn streaming(&self) -> Option<&dyn StreamingRuntime> { Some(&self.host_exec) }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;

use crate::error::Result;

/// Which standard streams a client asked for, and whether it wants a terminal.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamOptions {
    /// The client sends input.
    pub stdin: bool,
    /// The client reads standard output.
    pub stdout: bool,
    /// The client reads standard error (never with `tty`: a terminal merges both).
    pub stderr: bool,
    /// Run on a terminal; resize events follow.
    pub tty: bool,
}

impl StreamOptions {
    /// Options with the given streams.
    pub fn new(stdin: bool, stdout: bool, stderr: bool, tty: bool) -> Self {
        Self {
            stdin,
            stdout,
            stderr,
            tty,
        }
    }
}

/// A terminal's size in characters (`remotecommand.TerminalSize`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TerminalSize {
    /// Columns.
    #[serde(rename = "Width")]
    pub width: u16,
    /// Rows.
    #[serde(rename = "Height")]
    pub height: u16,
}

/// A byte source of a session.
pub type StreamReader = Pin<Box<dyn AsyncRead + Send>>;
/// A byte sink of a session.
pub type StreamWriter = Pin<Box<dyn AsyncWrite + Send>>;

/// A bidirectional byte stream (one forwarded connection).
pub trait DuplexStream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> DuplexStream for T {}

/// A running exec or attach, served by the runtime itself. Dropping it ends the session: an
/// exec's process is killed, an attach detaches.
pub struct ExecSession {
    /// The process's input (when asked for); shutting it down is end of input.
    pub stdin: Option<StreamWriter>,
    /// Its standard output (with a terminal: everything the terminal shows).
    pub stdout: Option<StreamReader>,
    /// Its standard error (never with a terminal).
    pub stderr: Option<StreamReader>,
    /// Terminal size changes (with a terminal).
    pub resize: Option<mpsc::Sender<TerminalSize>>,
    /// Resolves to the exit code once the process ended (an attach: once the container
    /// ended).
    pub exit: Pin<Box<dyn Future<Output = Result<i32>> + Send>>,
}

impl std::fmt::Debug for ExecSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecSession")
            .field("stdin", &self.stdin.is_some())
            .field("stdout", &self.stdout.is_some())
            .field("stderr", &self.stderr.is_some())
            .field("tty", &self.resize.is_some())
            .finish_non_exhaustive()
    }
}

/// Where an exec or attach is served.
#[derive(Debug)]
#[non_exhaustive]
pub enum StreamEndpoint {
    /// By the runtime, in process.
    Session(ExecSession),
    /// By the runtime's streaming server at this URL (CRI): the client's connection is proxied
    /// there.
    Url(String),
}

/// Opens connections to a pod's ports for port-forwarding.
#[async_trait]
pub trait PortDialer: Send + Sync {
    /// A new connection to `port` in the pod's network.
    async fn dial(&self, port: u16) -> Result<Box<dyn DuplexStream>>;
}

/// Where a port-forward is served.
#[non_exhaustive]
pub enum PortForwardEndpoint {
    /// Connections are opened by the agent through this dialer.
    Dialer(Arc<dyn PortDialer>),
    /// By the runtime's streaming server at this URL (CRI).
    Url(String),
}

impl std::fmt::Debug for PortForwardEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PortForwardEndpoint::Dialer(_) => f.write_str("PortForwardEndpoint::Dialer"),
            PortForwardEndpoint::Url(u) => {
                f.debug_tuple("PortForwardEndpoint::Url").field(u).finish()
            }
        }
    }
}

/// Exec, attach and port-forward (CRI's `Exec`, `Attach` and `PortForward`).
#[async_trait]
pub trait StreamingRuntime: Send + Sync {
    /// Run `cmd` in container `container_id` with the streams of `options`. A container that
    /// is not running is [`ErrorKind::FailedPrecondition`](crate::ErrorKind), an unknown one
    /// [`ErrorKind::NotFound`](crate::ErrorKind).
    async fn exec(
        &self,
        container_id: &str,
        cmd: &[String],
        options: StreamOptions,
    ) -> Result<StreamEndpoint>;

    /// Connect to the standard streams of container `container_id`'s main process.
    async fn attach(&self, container_id: &str, options: StreamOptions) -> Result<StreamEndpoint>;

    /// Forward connections to the ports of sandbox `sandbox_id` (`ports`: those the client
    /// named, when it names them up front).
    async fn port_forward(&self, sandbox_id: &str, ports: &[u16]) -> Result<PortForwardEndpoint>;
}
