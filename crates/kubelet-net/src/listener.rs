//! The bounded acceptor every listener of the SDK goes through (the kubelet API, read-only and
//! healthz ports of `kubelet-server`, the pod push endpoint of `kubelet-podconfig`, and an
//! embedder's own): a connection cap (beyond it the listener stops accepting and the kernel's
//! backlog holds the rest), backoff on accept errors such as `EMFILE` with a rate-limited log
//! line, and a bounded drain at shutdown. [`AcceptorConfig`] also carries the per-connection
//! limits the HTTP servers apply: the TLS handshake timeout and the header read timeout (which
//! also closes idle keep-alive connections).
//!
//! The default cap is an eighth of the process's open-file limit (at least 16, at most 1,024), so
//! that four listeners flooded at once hold at most half the descriptors and the sync loop, the
//! PLEG and the sources keep the rest. A host raises its soft limit before building the agent
//! (`minimal_kubelet` raises it to the hard limit).

use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Limits of one listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct AcceptorConfig {
    /// Most connections open at once (an eighth of the open-file limit, 16 to 1,024).
    pub max_connections: usize,
    /// Time allowed for a TLS handshake (10 s).
    pub handshake_timeout: Duration,
    /// Time allowed for a request's headers to arrive, and for an idle connection to send its
    /// next request (30 s).
    pub header_read_timeout: Duration,
    /// How long open connections get to finish at shutdown before they are cut (1 s).
    pub shutdown_grace: Duration,
}

/// The soft limit on open files (`RLIMIT_NOFILE`), from `/proc/self/limits`.
pub fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// The default connection cap: an eighth of `open_files` (at least 16, at most 1,024).
pub fn default_max_connections(open_files: Option<u64>) -> usize {
    open_files.map_or(1024, |l| (l / 8).clamp(16, 1024) as usize)
}

impl Default for AcceptorConfig {
    fn default() -> Self {
        Self {
            max_connections: default_max_connections(open_files_limit()),
            handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(1),
        }
    }
}

/// Shortest and longest pause after a failed accept (as Go's `net/http`).
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// At most one accept-error log line per this period.
const ACCEPT_LOG_EVERY: Duration = Duration::from_secs(10);

/// Accept connections on `listener` until `shutdown`, handing each to `serve` (with the
/// connection's own shutdown token) in its own task, at most `config.max_connections` at once.
/// Returns once every connection task has ended (cut after `shutdown_grace`).
pub async fn accept_loop<F, Fut>(
    listener: TcpListener,
    config: AcceptorConfig,
    shutdown: CancellationToken,
    serve: F,
) where
    F: Fn(TcpStream, CancellationToken) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(config.max_connections.max(1)));
    let mut conns = JoinSet::new();
    let mut backoff = ACCEPT_BACKOFF_MIN;
    let mut last_log: Option<tokio::time::Instant> = None;
    let mut suppressed = 0u64;
    loop {
        // Reap finished connections so the set does not grow.
        while conns.try_join_next().is_some() {}
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break,
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = listener.accept() => r,
        };
        match accepted {
            Ok((stream, _)) => {
                backoff = ACCEPT_BACKOFF_MIN;
                let conn_shutdown = shutdown.child_token();
                let fut = serve(stream, conn_shutdown);
                conns.spawn(async move {
                    fut.await;
                    drop(permit);
                });
            }
            Err(e) => {
                drop(permit);
                let now = tokio::time::Instant::now();
                if last_log.is_none_or(|t| now.duration_since(t) >= ACCEPT_LOG_EVERY) {
                    tracing::warn!(error = %e, suppressed, retry_in = ?backoff, "accepting a connection failed");
                    last_log = Some(now);
                    suppressed = 0;
                } else {
                    suppressed += 1;
                }
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
            }
        }
    }
    drop(listener);
    let drain = async { while conns.join_next().await.is_some() {} };
    if tokio::time::timeout(config.shutdown_grace, drain)
        .await
        .is_err()
    {
        conns.shutdown().await;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn the_default_cap_leaves_most_descriptors_to_the_agent() {
        assert_eq!(default_max_connections(Some(20_000)), 1024);
        assert_eq!(default_max_connections(Some(1024)), 128);
        assert_eq!(default_max_connections(Some(64)), 16);
        assert_eq!(default_max_connections(None), 1024);
        assert!(open_files_limit().is_some_and(|l| l > 0));
    }

    #[tokio::test]
    async fn connections_beyond_the_cap_wait_and_shutdown_cuts_the_rest() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let open = Arc::new(AtomicUsize::new(0));
        let shutdown = CancellationToken::new();
        let o = open.clone();
        let config = AcceptorConfig {
            max_connections: 2,
            shutdown_grace: Duration::from_millis(100),
            ..Default::default()
        };
        let task = tokio::spawn(accept_loop(
            listener,
            config,
            shutdown.clone(),
            move |s, stop| {
                let o = o.clone();
                async move {
                    o.fetch_add(1, Ordering::SeqCst);
                    // A connection that never ends by itself.
                    let _s = s;
                    std::future::pending::<()>().await;
                    let _ = stop;
                }
            },
        ));
        let mut clients = Vec::new();
        for _ in 0..4 {
            clients.push(TcpStream::connect(addr).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(open.load(Ordering::SeqCst), 2, "two served, two wait");
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the acceptor stops despite connections that never end")
            .unwrap();
    }
}
