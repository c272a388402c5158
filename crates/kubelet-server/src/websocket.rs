//! Exec, attach and port-forward over WebSocket (Kubernetes' `wsstream` channel protocols),
//! on tokio-tungstenite.
//!
//! Every message is one channel byte then the payload (binary protocols), or the channel as an
//! ASCII digit then the payload in base64 (`base64.*` protocols, text messages).
//! - Exec and attach: channel 0 stdin, 1 stdout, 2 stderr, 3 error (the v4 Status with
//!   `v4.*` and `v5.*`), 4 resize. `v5.channel.k8s.io` adds the close message `[255, channel]`,
//!   with which a client ends its standard input (`kubectl cp`, piped input). On open the
//!   server sends an empty message on the lowest channel it writes.
//! - Port-forward (`v4.channel.k8s.io`): ports from the query; port `i` uses channel `2i` for
//!   data and `2i+1` for errors, both opened by the port number as two little-endian bytes.
//! - Port-forward through the SPDY tunnel (`SPDY/3.1+portforward.k8s.io`, kubectl ≥ 1.31):
//!   the binary messages carry a SPDY connection, served as over a plain upgrade.

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http::header::{CONNECTION, UPGRADE};
use http::{HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use kubelet_api::{ExecSession, PortDialer, StreamOptions};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_util::io::ReaderStream;

use crate::routes::{Body, Context, status};
use crate::streaming::{Refusal, error_stream_message};

/// Exec and attach subprotocols, newest first.
pub(crate) const REMOTECOMMAND_PROTOCOLS: &[&str] = &[
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v4.base64.channel.k8s.io",
    "base64.channel.k8s.io",
    "channel.k8s.io",
];
/// Port-forward subprotocols.
pub(crate) const PORTFORWARD_PROTOCOLS: &[&str] = &[
    "SPDY/3.1+portforward.k8s.io",
    "v4.channel.k8s.io",
    "v4.base64.channel.k8s.io",
];

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;
const CLOSE: u8 = 255;

fn offered(req: &Request<Incoming>) -> Vec<String> {
    req.headers()
        .get_all("sec-websocket-protocol")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect()
}

/// The client's first offered protocol the server supports (`""` when it offers none).
fn choose(req: &Request<Incoming>, supported: &[&'static str]) -> Result<&'static str, Refusal> {
    let offered = offered(req);
    if offered.is_empty() {
        return Ok("");
    }
    for o in &offered {
        if let Some(p) = supported.iter().find(|p| **p == o) {
            return Ok(p);
        }
    }
    Err(Box::new(status(
        StatusCode::BAD_REQUEST,
        "BadRequest",
        format!(
            "unable to upgrade: none of the offered subprotocols {offered:?} is supported ({supported:?})"
        ),
    )))
}

/// The `101` answer, or an error when the request is not a valid WebSocket upgrade.
fn accept(req: &Request<Incoming>, protocol: &str) -> Result<Response<Body>, Refusal> {
    let Some(key) = req.headers().get("sec-websocket-key") else {
        return Err(Box::new(status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "missing Sec-WebSocket-Key",
        )));
    };
    let mut r = crate::routes::full(StatusCode::SWITCHING_PROTOCOLS, Bytes::new());
    let h = r.headers_mut();
    h.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(UPGRADE, HeaderValue::from_static("websocket"));
    if let Ok(v) = HeaderValue::from_str(&derive_accept_key(key.as_bytes())) {
        h.insert("sec-websocket-accept", v);
    }
    if !protocol.is_empty()
        && let Ok(v) = HeaderValue::from_str(protocol)
    {
        h.insert("sec-websocket-protocol", v);
    }
    Ok(r)
}

type Ws = WebSocketStream<TokioIo<crate::streaming::Counted>>;

async fn upgraded(req: Request<Incoming>) -> Option<Ws> {
    match crate::streaming::upgrade(req).await {
        Ok(u) => Some(WebSocketStream::from_raw_socket(TokioIo::new(u), Role::Server, None).await),
        Err(e) => {
            tracing::debug!(error = %kubelet_api::chain(&e), "WebSocket upgrade failed");
            None
        }
    }
}

/// Encodes messages for one protocol.
#[derive(Clone, Copy)]
struct Framing {
    base64: bool,
}

impl Framing {
    fn of(protocol: &str) -> Self {
        Self {
            base64: protocol.contains("base64"),
        }
    }

    fn encode(self, channel: u8, data: &[u8]) -> Message {
        if self.base64 {
            let mut s = String::with_capacity(1 + data.len() * 4 / 3 + 4);
            s.push(char::from(b'0' + channel));
            s.push_str(&B64.encode(data));
            Message::text(s)
        } else {
            let mut v = Vec::with_capacity(1 + data.len());
            v.push(channel);
            v.extend_from_slice(data);
            Message::binary(v)
        }
    }

    /// `(channel, payload)` of a data message; `None` for control messages and garbage.
    fn decode(self, m: Message) -> Option<(u8, Vec<u8>)> {
        match m {
            Message::Binary(b) if !self.base64 => {
                let (c, rest) = b.split_first()?;
                Some((*c, rest.to_vec()))
            }
            Message::Text(t) if self.base64 => {
                let bytes = t.as_bytes();
                let (c, rest) = bytes.split_first()?;
                let channel = c.checked_sub(b'0')?;
                Some((channel, B64.decode(rest).ok()?))
            }
            Message::Binary(b) => {
                let (c, rest) = b.split_first()?;
                Some((*c, rest.to_vec()))
            }
            _ => None,
        }
    }
}

/// Exec or attach over WebSocket.
pub(crate) fn remotecommand(
    ctx: &Context,
    req: Request<Incoming>,
    opts: StreamOptions,
    session: ExecSession,
    command: String,
) -> Response<Body> {
    let protocol = match choose(&req, REMOTECOMMAND_PROTOCOLS) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let response = match accept(&req, protocol) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    let idle = ctx.streaming_idle_timeout;
    tokio::spawn(async move {
        if let Some(ws) = upgraded(req).await {
            tracing::debug!(protocol, "exec or attach over WebSocket");
            serve_remotecommand(ws, protocol, opts, session, command, idle).await;
        }
    });
    response
}

async fn serve_remotecommand(
    ws: Ws,
    protocol: &'static str,
    opts: StreamOptions,
    session: ExecSession,
    command: String,
    idle: std::time::Duration,
) {
    let framing = Framing::of(protocol);
    let (mut sink, mut incoming) = ws.split();
    let (out_tx, mut out_rx) = mpsc::channel::<Message>(32);
    let writer = tokio::spawn(async move {
        while let Some(m) = out_rx.recv().await {
            let close = matches!(m, Message::Close(_));
            if sink.send(m).await.is_err() || close {
                break;
            }
        }
        let _ = sink.close().await;
    });
    let ExecSession {
        stdin,
        stdout,
        stderr,
        resize,
        exit,
    } = session;
    // Ready: an empty message on the lowest channel the server writes.
    let first = if opts.stdout {
        STDOUT
    } else if opts.stderr {
        STDERR
    } else {
        ERROR
    };
    let _ = out_tx.send(framing.encode(first, &[])).await;

    let reader = tokio::spawn(async move {
        let mut stdin = stdin;
        let mut resize_buf = Vec::new();
        loop {
            let next = match tokio::time::timeout(idle, incoming.next()).await {
                Ok(n) => n,
                Err(_) => {
                    tracing::debug!("WebSocket stream idle; closing");
                    return;
                }
            };
            let Some(Ok(m)) = next else { return };
            if matches!(m, Message::Close(_)) {
                return;
            }
            let Some((channel, data)) = framing.decode(m) else {
                continue;
            };
            match channel {
                STDIN => {
                    if let Some(w) = stdin.as_mut()
                        && (w.write_all(&data).await.is_err() || w.flush().await.is_err())
                    {
                        stdin = None;
                    }
                }
                RESIZE => {
                    resize_buf.extend_from_slice(&data);
                    let mut it = serde_json::Deserializer::from_slice(&resize_buf)
                        .into_iter::<kubelet_api::TerminalSize>();
                    let mut used = 0;
                    let mut bad = false;
                    let mut sizes = Vec::new();
                    loop {
                        match it.next() {
                            Some(Ok(size)) => {
                                sizes.push(size);
                                used = it.byte_offset();
                            }
                            Some(Err(e)) if e.is_eof() => break,
                            Some(Err(e)) => {
                                tracing::debug!(error = %kubelet_api::chain(&e), "bad resize event ignored");
                                bad = true;
                                break;
                            }
                            None => break,
                        }
                    }
                    if let Some(tx) = &resize {
                        for size in sizes {
                            let _ = tx.send(size).await;
                        }
                    }
                    if bad {
                        resize_buf.clear();
                    } else {
                        resize_buf.drain(..used.min(resize_buf.len()));
                    }
                }
                CLOSE if protocol == "v5.channel.k8s.io" => {
                    if data.first() == Some(&STDIN)
                        && let Some(mut w) = stdin.take()
                    {
                        tracing::debug!("the client closed stdin");
                        let _ = w.shutdown().await;
                    }
                }
                _ => {}
            }
        }
    });

    let pump = |r: Option<kubelet_api::StreamReader>, channel: u8| {
        let tx = out_tx.clone();
        tokio::spawn(async move {
            let Some(r) = r else { return };
            let mut chunks = ReaderStream::with_capacity(r, 32 * 1024);
            while let Some(Ok(chunk)) = chunks.next().await {
                if tx.send(framing.encode(channel, &chunk)).await.is_err() {
                    break;
                }
            }
        })
    };
    let out = pump(stdout, STDOUT);
    let err = pump(stderr, STDERR);
    let result = exit.await;
    tracing::debug!(?result, "exec or attach over WebSocket ended");
    for t in [out, err] {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), t).await;
    }
    let v4 = protocol.starts_with("v4.") || protocol.starts_with("v5.");
    let message = error_stream_message(&result, v4, &command);
    if let Some(m) = message {
        let _ = out_tx.send(framing.encode(ERROR, m.as_bytes())).await;
    }
    // A normal closure: clients treat a close without a status (1005) as an error.
    let _ = out_tx.send(normal_close()).await;
    drop(out_tx);
    let _ = writer.await;
    reader.abort();
}

fn normal_close() -> Message {
    use tokio_tungstenite::tungstenite::protocol::CloseFrame;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    Message::Close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: "".into(),
    }))
}

/// Port-forward over WebSocket: the channel protocol, or the SPDY tunnel.
pub(crate) fn port_forward(
    ctx: &Context,
    req: Request<Incoming>,
    dialer: Arc<dyn PortDialer>,
    ports: &[String],
) -> Response<Body> {
    let protocol = match choose(&req, PORTFORWARD_PROTOCOLS) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let idle = ctx.streaming_idle_timeout;
    let limits = crate::streaming::ForwardLimits {
        per_session: ctx.max_forwarded_per_session,
        all: ctx.forwarded_connections.clone(),
    };
    if protocol == "SPDY/3.1+portforward.k8s.io" {
        let response = match accept(&req, protocol) {
            Ok(r) => r,
            Err(r) => return *r,
        };
        tokio::spawn(async move {
            if let Some(ws) = upgraded(req).await {
                tracing::debug!("port-forward over the WebSocket SPDY tunnel");
                let io = tunnel(ws);
                let spdy = crate::spdy::Session::start(io, idle);
                crate::streaming::serve_port_forward_session(spdy, dialer, String::new(), limits)
                    .await;
            }
        });
        return response;
    }
    let mut parsed = Vec::new();
    for p in ports {
        match p.parse::<u16>() {
            Ok(n) if n > 0 => parsed.push(n),
            _ => {
                return status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    format!("invalid port: {p:?}"),
                );
            }
        }
    }
    if parsed.is_empty() {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "query parameter \"port\" is required",
        );
    }
    // Two channels per port, numbered by one byte; and no more than a session may forward.
    let most = limits.per_session.min(128);
    if parsed.len() > most {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!("too many ports: {} (at most {most})", parsed.len()),
        );
    }
    let response = match accept(&req, protocol) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    tokio::spawn(async move {
        if let Some(ws) = upgraded(req).await {
            serve_channel_port_forward(ws, Framing::of(protocol), dialer, parsed, idle).await;
        }
    });
    response
}

async fn serve_channel_port_forward(
    ws: Ws,
    framing: Framing,
    dialer: Arc<dyn PortDialer>,
    ports: Vec<u16>,
    idle: std::time::Duration,
) {
    let (mut sink, mut incoming) = ws.split();
    let (out_tx, mut out_rx) = mpsc::channel::<Message>(32);
    let writer = tokio::spawn(async move {
        while let Some(m) = out_rx.recv().await {
            if sink.send(m).await.is_err() {
                break;
            }
        }
        let _ = sink.close().await;
    });
    let mut to_pod: Vec<Option<mpsc::Sender<Vec<u8>>>> = Vec::new();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, port) in ports.iter().copied().enumerate() {
        let data = (2 * i) as u8;
        let error = data + 1;
        let le = port.to_le_bytes();
        let _ = out_tx.send(framing.encode(data, &le)).await;
        let _ = out_tx.send(framing.encode(error, &le)).await;
        let (tx, mut rx) = mpsc::channel::<Vec<u8>>(16);
        to_pod.push(Some(tx));
        let out = out_tx.clone();
        let dialer = dialer.clone();
        tasks.spawn(async move {
            let conn = match dialer.dial(port).await {
                Ok(c) => c,
                Err(e) => {
                    let _ = out
                        .send(framing.encode(error, e.message().as_bytes()))
                        .await;
                    return;
                }
            };
            let (rd, mut wr) = tokio::io::split(conn);
            let up = async move {
                while let Some(d) = rx.recv().await {
                    if wr.write_all(&d).await.is_err() {
                        break;
                    }
                }
                let _ = wr.shutdown().await;
            };
            let down = async {
                let mut chunks = ReaderStream::with_capacity(rd, 32 * 1024);
                while let Some(Ok(chunk)) = chunks.next().await {
                    if out.send(framing.encode(data, &chunk)).await.is_err() {
                        break;
                    }
                }
            };
            // The pod side closing ends the port (the protocol has no per-channel close): the
            // connection closes once every port has ended.
            let up = tokio::spawn(up);
            down.await;
            up.abort();
        });
    }
    loop {
        let next = tokio::select! {
            n = tokio::time::timeout(idle, incoming.next()) => match n {
                Ok(n) => n,
                Err(_) => break,
            },
            _ = async { while tasks.join_next().await.is_some() {} } => break,
        };
        let Some(Ok(m)) = next else { break };
        if matches!(m, Message::Close(_)) {
            break;
        }
        let Some((channel, data)) = framing.decode(m) else {
            continue;
        };
        let index = usize::from(channel / 2);
        if channel % 2 == 0
            && let Some(slot) = to_pod.get_mut(index)
            && let Some(tx) = slot.as_ref()
            && tx.send(data).await.is_err()
        {
            *slot = None;
        }
    }
    drop(to_pod);
    tasks.abort_all();
    let _ = out_tx.send(normal_close()).await;
    drop(out_tx);
    let _ = writer.await;
}

/// A byte stream over the binary messages of `ws` (the SPDY tunnel).
fn tunnel(ws: Ws) -> tokio::io::DuplexStream {
    let (ours, theirs) = tokio::io::duplex(64 * 1024);
    let (rd, mut wr) = tokio::io::split(theirs);
    let (mut sink, mut incoming) = ws.split();
    tokio::spawn(async move {
        let down = async {
            let mut chunks = ReaderStream::with_capacity(rd, 32 * 1024);
            while let Some(Ok(chunk)) = chunks.next().await {
                if sink.send(Message::binary(chunk)).await.is_err() {
                    break;
                }
            }
            let _ = sink.send(normal_close()).await;
            let _ = sink.close().await;
        };
        let up = async {
            while let Some(Ok(m)) = incoming.next().await {
                match m {
                    Message::Binary(b) if wr.write_all(&b).await.is_err() => break,
                    Message::Close(_) => break,
                    _ => {}
                }
            }
            let _ = wr.shutdown().await;
        };
        tokio::join!(down, up);
    });
    ours
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn messages_carry_the_channel_in_binary_and_base64_framing() {
        let bin = Framing { base64: false };
        let m = bin.encode(STDOUT, b"hi");
        assert_eq!(m, Message::binary(vec![1, b'h', b'i']));
        assert_eq!(bin.decode(m), Some((1, b"hi".to_vec())));
        let b64 = Framing { base64: true };
        let m = b64.encode(STDERR, b"hi");
        assert_eq!(m, Message::text("2aGk="));
        assert_eq!(b64.decode(m), Some((2, b"hi".to_vec())));
        assert_eq!(b64.decode(Message::text("x!!")), None);
        assert_eq!(bin.decode(Message::binary(Vec::new())), None);
    }
}
