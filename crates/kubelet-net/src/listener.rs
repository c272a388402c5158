//! The bounded acceptor every listener of the SDK goes through (the kubelet API, read-only and
//! healthz ports of `kubelet-server`, the pod push endpoint of `kubelet-podconfig`, and an
//! embedder's own).
//!
//! # Admission
//!
//! A connection starts **pending**: it is in its TLS handshake, or has not yet sent a request
//! the server accepts. Pending connections have a small budget of their own
//! ([`AcceptorConfig::max_pending`]); when a new connection arrives and the budget is full, the
//! **oldest pending connection is dropped**, so that silent or stalled clients cannot build a
//! queue that real clients wait behind. The accept loop never stops accepting for them.
//!
//! A pending connection whose client has shown that it speaks the protocol (its whole TLS
//! `ClientHello` arrived: [`Admission::progressed`], done by [`tls_handshake`]) is dropped
//! only after every pending connection that has not: a flood that sends nothing or a partial
//! record never drops a client whose handshake is under way.
//!
//! The server **promotes** a connection ([`Admission::promote`]) once it has proved itself: the
//! kubelet API once a request was authenticated and authorized, the ports without
//! authentication at their first request. Promoted connections count against
//! [`AcceptorConfig::max_connections`] and are never dropped for newcomers; when that cap is
//! full, `promote` answers `false` and the server refuses the request (503) and closes. So an
//! unauthenticated flood of any size holds at most `max_pending` descriptors and costs each
//! new client at most its place among the newest `max_pending` pending connections, while
//! established, authorized connections keep being served.
//!
//! Limits of the design: a client whose `ClientHello` takes longer to arrive than
//! `max_pending` newer connections (or, once it has arrived, whose handshake and first request
//! take longer than `max_pending` newer complete `ClientHello`s) loses its connection (it
//! retries); on the plain HTTP ports nothing marks progress before the request; an attacker
//! with valid credentials is an authorized client and is bounded only by `max_connections`;
//! anonymous ports (read-only, healthz) promote any client that sends a request, so there a
//! flood of well-formed requests competes with everyone else for `max_connections`.
//!
//! Also: backoff on accept errors such as `EMFILE` with a rate-limited log line, and a bounded
//! drain at shutdown. [`AcceptorConfig`] also carries the per-connection limits the HTTP
//! servers apply: the TLS handshake timeout and the header read timeout (which also closes idle
//! keep-alive connections).
//!
//! The default cap is an eighth of the process's open-file limit (at least 16, at most 1,024),
//! and the pending budget a quarter of that (at least 8, at most 256), so that four listeners
//! flooded at once hold well under two thirds of the descriptors and the sync loop, the PLEG
//! and the sources keep the rest. A host raises its soft limit before building the agent
//! (`minimal_kubelet` raises it to the hard limit).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Limits of one listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct AcceptorConfig {
    /// Most promoted connections open at once (an eighth of the open-file limit, 16 to 1,024).
    pub max_connections: usize,
    /// Most pending connections (in their handshake or before a request was accepted); beyond
    /// it the oldest is dropped (a quarter of `max_connections`, 8 to 256).
    pub max_pending: usize,
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

/// The default pending budget for a connection cap: a quarter of it (at least 8, at most 256).
pub fn default_max_pending(max_connections: usize) -> usize {
    (max_connections / 4).clamp(8, 256)
}

impl Default for AcceptorConfig {
    fn default() -> Self {
        let max_connections = default_max_connections(open_files_limit());
        Self {
            max_connections,
            max_pending: default_max_pending(max_connections),
            handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(1),
        }
    }
}

/// The listen backlog the kernel allows (`/proc/sys/net/core/somaxconn`, at most 65,535; 4,096
/// when unreadable), as Go's `net.Listen` uses: a burst of connections waits in the kernel's
/// queue instead of having its SYNs dropped (which costs a client a one-second retransmit).
pub fn listen_backlog() -> u32 {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .map_or(4_096, |n| n.clamp(1, 65_535))
}

/// Bind a listener on `addr` with [`listen_backlog`] (tokio's `TcpListener::bind` uses 1,024)
/// and `SO_REUSEADDR`, as the kubelet's listeners.
pub fn bind(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(listen_backlog())
}

/// Shortest and longest pause after a failed accept (as Go's `net/http`).
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// At most one accept-error log line per this period.
const ACCEPT_LOG_EVERY: Duration = Duration::from_secs(10);

/// One pending connection: its ID, the token that drops it, and whether its client has shown
/// that it speaks the protocol ([`Admission::progressed`]).
#[derive(Debug)]
struct PendingEntry {
    id: u64,
    evict: CancellationToken,
    progressed: bool,
}

/// The pending connections of one listener, oldest first.
#[derive(Debug, Default)]
struct Pending {
    queue: VecDeque<PendingEntry>,
    next_id: u64,
}

impl Pending {
    /// Drop one connection to make room: the oldest that has not progressed, or else the
    /// oldest.
    fn evict_one(&mut self) {
        let i = self.queue.iter().position(|e| !e.progressed).unwrap_or(0);
        if let Some(e) = self.queue.remove(i) {
            e.evict.cancel();
        }
    }
}

/// What the connections of one listener share.
#[derive(Debug)]
struct Pools {
    pending: Mutex<Pending>,
    promoted: Arc<Semaphore>,
}

impl Pools {
    fn remove_pending(&self, id: u64) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = p.queue.iter().position(|e| e.id == id) {
            p.queue.remove(i);
        }
    }

    fn mark_progressed(&self, id: u64) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = p.queue.iter_mut().find(|e| e.id == id) {
            e.progressed = true;
        }
    }
}

#[derive(Debug)]
struct AdmissionInner {
    id: u64,
    pools: Arc<Pools>,
    promoted: Mutex<Option<OwnedSemaphorePermit>>,
    shutdown: CancellationToken,
}

impl Drop for AdmissionInner {
    fn drop(&mut self) {
        self.pools.remove_pending(self.id);
    }
}

/// One connection's place in its listener's admission (see the module docs); cheap to clone,
/// the place is given back when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct Admission(Arc<AdmissionInner>);

impl Admission {
    /// Cancelled when the listener shuts down: finish the request in flight and close.
    pub fn shutdown(&self) -> &CancellationToken {
        &self.0.shutdown
    }

    /// Move the connection from the pending budget to the promoted ones, where newcomers
    /// cannot drop it. `true` when it is (or already was) promoted; `false` when every
    /// promoted slot is taken: refuse the request and close the connection.
    pub fn promote(&self) -> bool {
        let mut promoted = self.0.promoted.lock().unwrap_or_else(|e| e.into_inner());
        if promoted.is_some() {
            return true;
        }
        match self.0.pools.promoted.clone().try_acquire_owned() {
            Ok(permit) => {
                *promoted = Some(permit);
                self.0.pools.remove_pending(self.0.id);
                true
            }
            Err(_) => false,
        }
    }

    /// Record that the client has shown it speaks the protocol (its whole TLS `ClientHello`
    /// arrived): while pending, the connection is dropped for newcomers only after every
    /// pending connection that has not shown as much, so silent and stalled clients, however
    /// many, cannot drop a client whose handshake is under way.
    pub fn progressed(&self) {
        self.0.pools.mark_progressed(self.0.id);
    }

    /// Whether [`Admission::promote`] succeeded.
    pub fn is_promoted(&self) -> bool {
        self.0
            .promoted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }
}

/// Accept connections on `listener` until `shutdown`, handing each to `serve` (with its
/// [`Admission`]) in its own task. At most `config.max_pending` connections are pending (the
/// oldest is dropped for a newcomer) and at most `config.max_connections` promoted. Returns
/// once every connection task has ended (cut after `shutdown_grace`).
pub async fn accept_loop<F, Fut>(
    listener: TcpListener,
    config: AcceptorConfig,
    shutdown: CancellationToken,
    serve: F,
) where
    F: Fn(TcpStream, Admission) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let pools = Arc::new(Pools {
        pending: Mutex::new(Pending::default()),
        promoted: Arc::new(Semaphore::new(config.max_connections.max(1))),
    });
    let max_pending = config.max_pending.max(1);
    let mut conns = JoinSet::new();
    let mut backoff = ACCEPT_BACKOFF_MIN;
    let mut last_log: Option<tokio::time::Instant> = None;
    let mut suppressed = 0u64;
    let mut dropped = 0u64;
    let mut last_drop_log: Option<tokio::time::Instant> = None;
    loop {
        // Reap finished connections so the set does not grow.
        while conns.try_join_next().is_some() {}
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = listener.accept() => r,
        };
        match accepted {
            Ok((stream, _)) => {
                backoff = ACCEPT_BACKOFF_MIN;
                let evict = CancellationToken::new();
                let (id, full) = {
                    let mut p = pools.pending.lock().unwrap_or_else(|e| e.into_inner());
                    let full = p.queue.len() >= max_pending;
                    while p.queue.len() >= max_pending {
                        p.evict_one();
                        dropped += 1;
                    }
                    let id = p.next_id;
                    p.next_id += 1;
                    p.queue.push_back(PendingEntry {
                        id,
                        evict: evict.clone(),
                        progressed: false,
                    });
                    (id, full)
                };
                let now = tokio::time::Instant::now();
                if dropped > 0
                    && last_drop_log.is_none_or(|t| now.duration_since(t) >= ACCEPT_LOG_EVERY)
                {
                    tracing::warn!(
                        dropped,
                        max_pending,
                        "pending connections dropped for newer ones (a flood of connections that send no accepted request)"
                    );
                    last_drop_log = Some(now);
                    dropped = 0;
                }
                let admission = Admission(Arc::new(AdmissionInner {
                    id,
                    pools: pools.clone(),
                    promoted: Mutex::new(None),
                    shutdown: shutdown.child_token(),
                }));
                let fut = serve(stream, admission);
                conns.spawn(async move {
                    tokio::select! {
                        _ = fut => {}
                        // Dropping the future closes the socket.
                        _ = evict.cancelled() => {}
                    }
                });
                if full {
                    // A flood: let the connections already accepted read what their clients
                    // sent (and so show progress) before the next one may drop them.
                    tokio::task::yield_now().await;
                }
            }
            Err(e) => {
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

/// The server side of a TLS handshake on an admitted connection, within `timeout`: the
/// connection is marked [`Admission::progressed`] once the client's whole `ClientHello` has
/// arrived. A timeout is an error of kind [`std::io::ErrorKind::TimedOut`].
#[cfg(feature = "tls")]
pub async fn tls_handshake(
    config: Arc<rustls::ServerConfig>,
    stream: TcpStream,
    admission: &Admission,
    timeout: Duration,
) -> std::io::Result<tokio_rustls::server::TlsStream<TcpStream>> {
    let handshake = async {
        let start =
            tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), stream)
                .await?;
        admission.progressed();
        start.into_stream(config).await
    };
    tokio::time::timeout(timeout, handshake)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS handshake timed out"))?
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
    async fn listeners_take_the_kernels_backlog_and_accept() {
        assert!(listen_backlog() >= 1);
        let listener = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        assert_eq!(client.unwrap().local_addr().unwrap(), accepted.unwrap().1);
        // A taken address is an error, not a second listener.
        assert!(bind(addr).is_err());
    }

    #[test]
    fn the_pending_budget_is_a_quarter_of_the_cap() {
        assert_eq!(default_max_pending(1024), 256);
        assert_eq!(default_max_pending(128), 32);
        assert_eq!(default_max_pending(16), 8);
    }

    /// Counts one live connection until dropped (with the connection's future).
    struct Alive(Arc<AtomicUsize>);

    impl Alive {
        fn count(alive: Arc<AtomicUsize>) -> Self {
            alive.fetch_add(1, Ordering::SeqCst);
            Self(alive)
        }
    }

    impl Drop for Alive {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Serves each connection by promoting it at once when `promote` says so, then holding it
    /// open forever; counts connections alive.
    fn holding_server(
        promote: bool,
        alive: Arc<AtomicUsize>,
        promoted: Arc<AtomicUsize>,
    ) -> impl Fn(TcpStream, Admission) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
    {
        move |s, admission| {
            let (alive, promoted) = (alive.clone(), promoted.clone());
            Box::pin(async move {
                let _alive = Alive::count(alive);
                if promote && admission.promote() {
                    promoted.fetch_add(1, Ordering::SeqCst);
                }
                let _s = s;
                admission.shutdown().cancelled().await;
            })
        }
    }

    /// An acceptor on a loopback port (2 promoted connections, `max_pending` pending) serving
    /// with `serve`: its address, its shutdown token and its task.
    async fn acceptor<F, Fut>(
        max_pending: usize,
        serve: F,
    ) -> (
        std::net::SocketAddr,
        CancellationToken,
        tokio::task::JoinHandle<()>,
    )
    where
        F: Fn(TcpStream, Admission) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let config = AcceptorConfig {
            max_connections: 2,
            max_pending,
            shutdown_grace: Duration::from_millis(100),
            ..Default::default()
        };
        let task = tokio::spawn(accept_loop(listener, config, shutdown.clone(), serve));
        (addr, shutdown, task)
    }

    /// Shut the acceptor down; it must stop within 5 s.
    async fn stop(shutdown: CancellationToken, task: tokio::task::JoinHandle<()>) {
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the acceptor stops, even with connections that never end")
            .unwrap();
    }

    #[tokio::test]
    async fn the_oldest_pending_connection_makes_room_and_promoted_ones_stay() {
        let (alive, promoted) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        // Promoted at once: two take the promoted slots, the rest stay pending.
        let (addr, shutdown, task) =
            acceptor(3, holding_server(true, alive.clone(), promoted.clone())).await;
        let mut clients = Vec::new();
        // The first two promote themselves before the others arrive (a server promotes after
        // a request, which takes a moment).
        for _ in 0..2 {
            clients.push(TcpStream::connect(addr).await.unwrap());
        }
        for _ in 0..500 {
            if promoted.load(Ordering::SeqCst) == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for _ in 2..20 {
            clients.push(TcpStream::connect(addr).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(promoted.load(Ordering::SeqCst), 2);
        assert_eq!(
            alive.load(Ordering::SeqCst),
            2 + 3,
            "the two promoted and the three newest pending"
        );
        // The first two clients (promoted) are still connected; the dropped ones see EOF.
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 1];
        for (i, c) in clients.iter_mut().enumerate() {
            let r = tokio::time::timeout(Duration::from_millis(50), c.read(&mut buf)).await;
            let open = r.is_err();
            assert_eq!(open, !(2..17).contains(&i), "client {i}: open {open}");
        }
        stop(shutdown, task).await;
        assert_eq!(alive.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_flood_of_silent_connections_never_stops_accepting_and_shutdown_cuts_the_rest() {
        let (alive, promoted) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (addr, shutdown, task) =
            acceptor(8, holding_server(false, alive.clone(), promoted.clone())).await;
        let mut clients = Vec::new();
        for _ in 0..300 {
            clients.push(TcpStream::connect(addr).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            alive.load(Ordering::SeqCst),
            8,
            "only the newest pending stay"
        );
        stop(shutdown, task).await;
    }

    /// A client whose whole TLS `ClientHello` arrived (then stalls) outlives any number of
    /// newer silent connections: they drop each other, never it.
    #[cfg(feature = "tls")]
    #[tokio::test]
    async fn a_client_whose_hello_arrived_outlives_a_flood_of_silent_connections() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let (cert_file, key_file) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        std::fs::write(&cert_file, cert.pem()).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        let identity = crate::tls::ReloadingIdentity::load(&cert_file, &key_file).unwrap();
        let server = crate::tls::server_config(identity, None).unwrap();
        let client = crate::tls::client_config(Some(&cert_file), None).unwrap();

        let alive = Arc::new(AtomicUsize::new(0));
        let counter = alive.clone();
        let (addr, shutdown, task) = acceptor(3, move |s, admission| {
            let (server, alive) = (server.clone(), counter.clone());
            async move {
                let _alive = Alive::count(alive);
                let _tls = tls_handshake(server, s, &admission, Duration::from_secs(120)).await;
                admission.shutdown().cancelled().await;
            }
        })
        .await;
        // The client's hello, then nothing: the server answers and waits for the client.
        let mut conn =
            rustls::ClientConnection::new(client, "localhost".try_into().unwrap()).unwrap();
        let mut hello = Vec::new();
        conn.write_tls(&mut hello).unwrap();
        let mut honest = TcpStream::connect(addr).await.unwrap();
        honest.write_all(&hello).await.unwrap();
        let mut buf = vec![0u8; 16 * 1024];
        let n = tokio::time::timeout(Duration::from_secs(5), honest.read(&mut buf))
            .await
            .expect("the server's hello")
            .unwrap();
        assert!(n > 0);
        let mut silent = Vec::new();
        for _ in 0..50 {
            silent.push(TcpStream::connect(addr).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            alive.load(Ordering::SeqCst),
            3,
            "the client and the two newest silent"
        );
        let r = tokio::time::timeout(Duration::from_millis(100), honest.read(&mut buf)).await;
        assert!(r.is_err(), "the client's connection was dropped: {r:?}");
        stop(shutdown, task).await;
    }
}
