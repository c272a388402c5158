//! SPDY/3.1 framing, as far as Kubernetes' streaming protocols use it (`kubectl exec`,
//! `attach`, `port-forward` over `Upgrade: SPDY/3.1`): the frame codec ([`FrameReader`],
//! [`FrameWriter`]) and a server session ([`Session`]) that accepts the streams a client opens.
//!
//! No maintained crate publishes SPDY/3.1 framing, so it is written here, kept small, and
//! tested and fuzzed on its own (`fuzz/fuzz_targets/spdy_frames.rs`).
//!
//! What is implemented (draft 3.1): control frames `SYN_STREAM`, `SYN_REPLY`, `RST_STREAM`,
//! `SETTINGS`, `PING`, `GOAWAY`, `HEADERS`, `WINDOW_UPDATE` and data frames; name/value header
//! blocks compressed with zlib and the protocol's dictionary, one compression context per
//! direction. Flow control: the server grants the client window back as it consumes data, and
//! does not wait for window updates itself (the Go client, moby/spdystream, sends none).
//! Streams are opened by the client only; a server push is never sent.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use flate2::{Decompress, FlushDecompress};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// The zlib dictionary of SPDY/3 header blocks (draft 3, section 2.6.10.1): 1,423 bytes,
/// Adler-32 `0xe3c6a7c2`.
pub const DICTIONARY: &[u8] = b"\x00\x00\x00\x07options\x00\x00\x00\x04head\x00\x00\x00\x04post\
\x00\x00\x00\x03put\x00\x00\x00\x06delete\x00\x00\x00\x05trace\x00\x00\x00\x06accept\
\x00\x00\x00\x0eaccept-charset\x00\x00\x00\x0faccept-encoding\x00\x00\x00\x0faccept-language\
\x00\x00\x00\x0daccept-ranges\x00\x00\x00\x03age\x00\x00\x00\x05allow\x00\x00\x00\x0dauthorization\
\x00\x00\x00\x0dcache-control\x00\x00\x00\x0aconnection\x00\x00\x00\x0ccontent-base\
\x00\x00\x00\x10content-encoding\x00\x00\x00\x10content-language\x00\x00\x00\x0econtent-length\
\x00\x00\x00\x10content-location\x00\x00\x00\x0bcontent-md5\x00\x00\x00\x0dcontent-range\
\x00\x00\x00\x0ccontent-type\x00\x00\x00\x04date\x00\x00\x00\x04etag\x00\x00\x00\x06expect\
\x00\x00\x00\x07expires\x00\x00\x00\x04from\x00\x00\x00\x04host\x00\x00\x00\x08if-match\
\x00\x00\x00\x11if-modified-since\x00\x00\x00\x0dif-none-match\x00\x00\x00\x08if-range\
\x00\x00\x00\x13if-unmodified-since\x00\x00\x00\x0dlast-modified\x00\x00\x00\x08location\
\x00\x00\x00\x0cmax-forwards\x00\x00\x00\x06pragma\x00\x00\x00\x12proxy-authenticate\
\x00\x00\x00\x13proxy-authorization\x00\x00\x00\x05range\x00\x00\x00\x07referer\
\x00\x00\x00\x0bretry-after\x00\x00\x00\x06server\x00\x00\x00\x02te\x00\x00\x00\x07trailer\
\x00\x00\x00\x11transfer-encoding\x00\x00\x00\x07upgrade\x00\x00\x00\x0auser-agent\
\x00\x00\x00\x04vary\x00\x00\x00\x03via\x00\x00\x00\x07warning\x00\x00\x00\x10www-authenticate\
\x00\x00\x00\x06method\x00\x00\x00\x03get\x00\x00\x00\x06status\x00\x00\x00\x06200 OK\
\x00\x00\x00\x07version\x00\x00\x00\x08HTTP/1.1\x00\x00\x00\x03url\x00\x00\x00\x06public\
\x00\x00\x00\x0aset-cookie\x00\x00\x00\x0akeep-alive\x00\x00\x00\x06origin\
100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505\
203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request401 Unauthorized\
403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented503 Service Unavailable\
Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT\
chunked,text/html,image/png,image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,\
text/javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.";

/// Adler-32 of [`DICTIONARY`] (the dictionary ID of SPDY header blocks).
pub const DICTIONARY_ADLER32: u32 = 0xe3c6_a7c2;

const VERSION: u16 = 3;
const TYPE_SYN_STREAM: u16 = 1;
const TYPE_SYN_REPLY: u16 = 2;
const TYPE_RST_STREAM: u16 = 3;
const TYPE_SETTINGS: u16 = 4;
const TYPE_PING: u16 = 6;
const TYPE_GOAWAY: u16 = 7;
const TYPE_HEADERS: u16 = 8;
const TYPE_WINDOW_UPDATE: u16 = 9;
/// `FLAG_FIN` of control and data frames.
pub const FLAG_FIN: u8 = 0x01;

/// The largest frame payload accepted (the 24-bit length allows 16 MiB; clients send 32 KiB
/// data frames at most).
pub const MAX_FRAME: usize = 1 << 20;
/// The largest decompressed header block accepted.
pub const MAX_HEADER_BLOCK: usize = 64 * 1024;
/// The receive window the protocol starts with, per stream.
const INITIAL_WINDOW: u32 = 64 * 1024;

/// `RST_STREAM` status codes used here.
pub mod status {
    /// `PROTOCOL_ERROR`.
    pub const PROTOCOL_ERROR: u32 = 1;
    /// `INVALID_STREAM`.
    pub const INVALID_STREAM: u32 = 2;
    /// `REFUSED_STREAM`.
    pub const REFUSED_STREAM: u32 = 3;
    /// `CANCEL`.
    pub const CANCEL: u32 = 5;
}

/// What can go wrong on a SPDY connection.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpdyError {
    /// The peer broke the framing; the connection is closed.
    #[error("SPDY protocol error: {0}")]
    Protocol(String),
    /// Reading or writing the connection failed.
    #[error("SPDY connection")]
    Io(#[from] std::io::Error),
}

fn protocol(msg: impl Into<String>) -> SpdyError {
    SpdyError::Protocol(msg.into())
}

/// Header names and values of a stream (names lowercased, as SPDY requires).
pub type Headers = Vec<(String, String)>;

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Frame {
    /// The peer opens a stream.
    SynStream {
        /// Stream ID (odd from a client).
        stream_id: u32,
        /// The peer sends nothing more on it.
        fin: bool,
        /// Its headers.
        headers: Headers,
    },
    /// The answer to a stream we opened.
    SynReply {
        /// Stream ID.
        stream_id: u32,
        /// No more data follows.
        fin: bool,
        /// Headers.
        headers: Headers,
    },
    /// The stream is aborted.
    RstStream {
        /// Stream ID.
        stream_id: u32,
        /// Why.
        status: u32,
    },
    /// Connection settings (ignored).
    Settings,
    /// A ping, answered with the same ID.
    Ping(u32),
    /// The peer opens no more streams.
    GoAway {
        /// The last stream it accepted.
        last_stream_id: u32,
    },
    /// More headers for a stream (ignored apart from `FLAG_FIN`).
    Headers {
        /// Stream ID.
        stream_id: u32,
        /// No more data follows.
        fin: bool,
    },
    /// Flow-control credit (ignored: see the module docs).
    WindowUpdate {
        /// Stream ID (0: the connection).
        stream_id: u32,
        /// Credit.
        delta: u32,
    },
    /// Stream data.
    Data {
        /// Stream ID.
        stream_id: u32,
        /// The last data of the stream from this side.
        fin: bool,
        /// The bytes.
        data: Bytes,
    },
    /// A control frame type this implementation does not know (skipped, as the draft says).
    Unknown(u16),
}

/// Decodes frames from bytes; keeps the connection's header decompression context.
pub struct FrameReader {
    inflate: Decompress,
}

impl Default for FrameReader {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for FrameReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameReader").finish_non_exhaustive()
    }
}

fn u31(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0] & 0x7f, b[1], b[2], b[3]])
}

impl FrameReader {
    /// A reader for a new connection.
    pub fn new() -> Self {
        Self {
            inflate: Decompress::new(true),
        }
    }

    /// The next complete frame in `buf` (consumed), `Ok(None)` when more bytes are needed.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, SpdyError> {
        if buf.len() < 8 {
            return Ok(None);
        }
        let length = u32::from_be_bytes([0, buf[5], buf[6], buf[7]]) as usize;
        if length > MAX_FRAME {
            return Err(protocol(format!("frame of {length} bytes is too large")));
        }
        if buf.len() < 8 + length {
            buf.reserve(8 + length - buf.len());
            return Ok(None);
        }
        let head = buf.split_to(8);
        let payload = buf.split_to(length).freeze();
        let flags = head[4];
        let fin = flags & FLAG_FIN != 0;
        if head[0] & 0x80 == 0 {
            let stream_id = u31(&head[..4]);
            return Ok(Some(Frame::Data {
                stream_id,
                fin,
                data: payload,
            }));
        }
        let version = u16::from_be_bytes([head[0] & 0x7f, head[1]]);
        if version != VERSION {
            return Err(protocol(format!("unsupported SPDY version {version}")));
        }
        let kind = u16::from_be_bytes([head[2], head[3]]);
        let need = |n: usize| {
            if payload.len() < n {
                Err(protocol(format!(
                    "control frame type {kind} of {} bytes is too short",
                    payload.len()
                )))
            } else {
                Ok(())
            }
        };
        let frame = match kind {
            TYPE_SYN_STREAM => {
                need(10)?;
                let stream_id = u31(&payload[..4]);
                if stream_id == 0 {
                    return Err(protocol("SYN_STREAM with stream ID 0"));
                }
                let headers = self.headers(&payload[10..])?;
                Frame::SynStream {
                    stream_id,
                    fin,
                    headers,
                }
            }
            TYPE_SYN_REPLY => {
                need(4)?;
                let headers = self.headers(&payload[4..])?;
                Frame::SynReply {
                    stream_id: u31(&payload[..4]),
                    fin,
                    headers,
                }
            }
            TYPE_RST_STREAM => {
                need(8)?;
                Frame::RstStream {
                    stream_id: u31(&payload[..4]),
                    status: u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]),
                }
            }
            TYPE_SETTINGS => Frame::Settings,
            TYPE_PING => {
                need(4)?;
                Frame::Ping(u32::from_be_bytes([
                    payload[0], payload[1], payload[2], payload[3],
                ]))
            }
            TYPE_GOAWAY => {
                need(4)?;
                Frame::GoAway {
                    last_stream_id: u31(&payload[..4]),
                }
            }
            TYPE_HEADERS => {
                need(4)?;
                // Decompressed to keep the shared zlib context in step; the values are not
                // used by the streaming protocols.
                self.headers(&payload[4..])?;
                Frame::Headers {
                    stream_id: u31(&payload[..4]),
                    fin,
                }
            }
            TYPE_WINDOW_UPDATE => {
                need(8)?;
                Frame::WindowUpdate {
                    stream_id: u31(&payload[..4]),
                    delta: u31(&payload[4..8]),
                }
            }
            other => Frame::Unknown(other),
        };
        Ok(Some(frame))
    }

    fn inflate(&mut self, input: &[u8]) -> Result<Vec<u8>, SpdyError> {
        let mut out = Vec::with_capacity(256);
        let mut pos = 0;
        loop {
            if out.len() == out.capacity() {
                if out.len() >= MAX_HEADER_BLOCK {
                    return Err(protocol("header block too large"));
                }
                out.reserve(out.len().max(256));
            }
            let before_in = self.inflate.total_in();
            let before_out = self.inflate.total_out();
            let r = self
                .inflate
                .decompress_vec(&input[pos..], &mut out, FlushDecompress::Sync);
            pos += (self.inflate.total_in() - before_in) as usize;
            match r {
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    self.inflate
                        .set_dictionary(DICTIONARY)
                        .map_err(|e| protocol(format!("header dictionary: {e}")))?;
                    continue;
                }
                Err(e) => return Err(protocol(format!("header block: {e}"))),
            }
            let progressed =
                self.inflate.total_out() > before_out || self.inflate.total_in() > before_in;
            if pos >= input.len() && out.len() < out.capacity() {
                return Ok(out);
            }
            if !progressed && out.len() < out.capacity() {
                return Err(protocol("truncated header block"));
            }
        }
    }

    fn headers(&mut self, block: &[u8]) -> Result<Headers, SpdyError> {
        if block.is_empty() {
            return Ok(Vec::new());
        }
        let raw = self.inflate(block)?;
        parse_header_block(&raw)
    }
}

/// Parse an uncompressed name/value block: a 32-bit count, then length-prefixed names and
/// values. Several values of one name are NUL-separated; they are kept joined by `,`.
pub fn parse_header_block(raw: &[u8]) -> Result<Headers, SpdyError> {
    let mut b = raw;
    let take_u32 = |b: &mut &[u8]| -> Result<usize, SpdyError> {
        if b.len() < 4 {
            return Err(protocol("truncated header block"));
        }
        let v = b.get_u32() as usize;
        Ok(v)
    };
    let count = take_u32(&mut b)?;
    if count > 1024 {
        return Err(protocol(format!("{count} headers in one block")));
    }
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let n = take_u32(&mut b)?;
        if n == 0 || b.len() < n {
            return Err(protocol("bad header name length"));
        }
        let name = String::from_utf8_lossy(&b[..n]).to_ascii_lowercase();
        b.advance(n);
        let v = take_u32(&mut b)?;
        if b.len() < v {
            return Err(protocol("bad header value length"));
        }
        let value = String::from_utf8_lossy(&b[..v]).replace('\0', ",");
        b.advance(v);
        out.push((name, value));
    }
    Ok(out)
}

fn control(out: &mut BytesMut, kind: u16, flags: u8, payload: &[u8]) {
    out.put_u16(0x8000 | VERSION);
    out.put_u16(kind);
    out.put_u8(flags);
    let len = payload.len() as u32;
    out.put_slice(&len.to_be_bytes()[1..]);
    out.put_slice(payload);
}

/// Encodes frames; keeps the connection's header compression context.
///
/// Header blocks are written as zlib *stored* blocks: a valid zlib stream with the protocol's
/// dictionary (any SPDY peer decodes it), without a compressor's state (about 256 KiB per
/// connection with zlib's defaults). The server's header blocks are empty `SYN_REPLY`s, so
/// nothing is lost by not compressing them.
#[derive(Debug, Default)]
pub struct FrameWriter {
    started: bool,
}

impl FrameWriter {
    /// A writer for a new connection.
    pub fn new() -> Self {
        Self { started: false }
    }

    fn header_block(&mut self, headers: &[(&str, &str)]) -> Result<Vec<u8>, SpdyError> {
        let mut raw = BytesMut::new();
        raw.put_u32(headers.len() as u32);
        for (n, v) in headers {
            raw.put_u32(n.len() as u32);
            raw.put_slice(n.to_ascii_lowercase().as_bytes());
            raw.put_u32(v.len() as u32);
            raw.put_slice(v.as_bytes());
        }
        let mut out = Vec::with_capacity(raw.len() + 16);
        if !self.started {
            // zlib header: deflate with a 32 KiB window, a preset dictionary (FDICT), no level
            // hint; then the dictionary's Adler-32.
            out.extend_from_slice(&[0x78, 0x20]);
            out.extend_from_slice(&DICTIONARY_ADLER32.to_be_bytes());
            self.started = true;
        }
        for chunk in raw.chunks(0xffff) {
            // A non-final stored block, byte-aligned like a sync flush's output.
            let len = chunk.len() as u16;
            out.push(0x00);
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(&(!len).to_le_bytes());
            out.extend_from_slice(chunk);
        }
        // The empty stored block that ends a sync flush: some decoders (Go's) hand out a
        // block's data only once the next block begins.
        out.extend_from_slice(&[0x00, 0x00, 0x00, 0xff, 0xff]);
        Ok(out)
    }

    /// `SYN_REPLY` for `stream_id`.
    pub fn syn_reply(
        &mut self,
        out: &mut BytesMut,
        stream_id: u32,
        fin: bool,
        headers: &[(&str, &str)],
    ) -> Result<(), SpdyError> {
        let block = self.header_block(headers)?;
        let mut p = BytesMut::with_capacity(4 + block.len());
        p.put_u32(stream_id & 0x7fff_ffff);
        p.put_slice(&block);
        control(out, TYPE_SYN_REPLY, if fin { FLAG_FIN } else { 0 }, &p);
        Ok(())
    }

    /// `SYN_STREAM` (for tests and clients).
    pub fn syn_stream(
        &mut self,
        out: &mut BytesMut,
        stream_id: u32,
        fin: bool,
        headers: &[(&str, &str)],
    ) -> Result<(), SpdyError> {
        let block = self.header_block(headers)?;
        let mut p = BytesMut::with_capacity(10 + block.len());
        p.put_u32(stream_id & 0x7fff_ffff);
        p.put_u32(0);
        p.put_u16(0);
        p.put_slice(&block);
        control(out, TYPE_SYN_STREAM, if fin { FLAG_FIN } else { 0 }, &p);
        Ok(())
    }
}

/// A data frame (empty with `fin` to half-close).
pub fn data_frame(out: &mut BytesMut, stream_id: u32, fin: bool, data: &[u8]) {
    out.put_u32(stream_id & 0x7fff_ffff);
    out.put_u8(if fin { FLAG_FIN } else { 0 });
    out.put_slice(&(data.len() as u32).to_be_bytes()[1..]);
    out.put_slice(data);
}

/// `RST_STREAM`.
pub fn rst_frame(out: &mut BytesMut, stream_id: u32, status: u32) {
    let mut p = [0u8; 8];
    p[..4].copy_from_slice(&(stream_id & 0x7fff_ffff).to_be_bytes());
    p[4..].copy_from_slice(&status.to_be_bytes());
    control(out, TYPE_RST_STREAM, 0, &p);
}

/// `PING`.
pub fn ping_frame(out: &mut BytesMut, id: u32) {
    control(out, TYPE_PING, 0, &id.to_be_bytes());
}

/// `GOAWAY` (status OK).
pub fn goaway_frame(out: &mut BytesMut, last_stream_id: u32) {
    let mut p = [0u8; 8];
    p[..4].copy_from_slice(&(last_stream_id & 0x7fff_ffff).to_be_bytes());
    control(out, TYPE_GOAWAY, 0, &p);
}

/// `WINDOW_UPDATE`.
pub fn window_update_frame(out: &mut BytesMut, stream_id: u32, delta: u32) {
    let mut p = [0u8; 8];
    p[..4].copy_from_slice(&(stream_id & 0x7fff_ffff).to_be_bytes());
    p[4..].copy_from_slice(&(delta & 0x7fff_ffff).to_be_bytes());
    control(out, TYPE_WINDOW_UPDATE, 0, &p);
}

/// A stream the client opened, accepted (its `SYN_REPLY` is queued before it is handed out).
#[derive(Debug)]
pub struct Stream {
    /// Its ID.
    pub id: u32,
    /// Its headers.
    pub headers: Headers,
    /// Data from the client; ends at the client's `FLAG_FIN` or `RST_STREAM`.
    pub data: mpsc::Receiver<Bytes>,
    /// Sends to the client.
    pub writer: StreamWriter,
}

impl Stream {
    /// The value of header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Writes data frames of one stream. Cheap to clone.
#[derive(Debug, Clone)]
pub struct StreamWriter {
    id: u32,
    out: mpsc::Sender<Bytes>,
    finished: Arc<AtomicBool>,
}

/// The largest data frame sent.
const MAX_DATA: usize = 32 * 1024;

impl StreamWriter {
    /// Send `data` (split into frames of at most 32 KiB). Fails once the connection is gone.
    pub async fn write(&self, data: &[u8]) -> Result<(), SpdyError> {
        for chunk in data.chunks(MAX_DATA) {
            let mut f = BytesMut::with_capacity(8 + chunk.len());
            data_frame(&mut f, self.id, false, chunk);
            self.send(f.freeze()).await?;
        }
        Ok(())
    }

    /// Half-close: no more data from this side (once).
    pub async fn finish(&self) -> Result<(), SpdyError> {
        if self.finished.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let mut f = BytesMut::with_capacity(8);
        data_frame(&mut f, self.id, true, &[]);
        self.send(f.freeze()).await
    }

    /// Abort the stream.
    pub async fn reset(&self, status: u32) -> Result<(), SpdyError> {
        self.finished.store(true, Ordering::Release);
        let mut f = BytesMut::with_capacity(16);
        rst_frame(&mut f, self.id, status);
        self.send(f.freeze()).await
    }

    async fn send(&self, frame: Bytes) -> Result<(), SpdyError> {
        self.out.send(frame).await.map_err(|_| {
            SpdyError::Io(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "SPDY connection closed",
            ))
        })
    }
}

/// A server session on an upgraded connection: accepts streams, answers pings, grants
/// window, and closes after `idle_timeout` without frames in either direction.
#[derive(Debug)]
pub struct Session {
    /// The streams the client opens, in order; ends with the connection.
    pub streams: mpsc::Receiver<Stream>,
    out: mpsc::Sender<Bytes>,
    closed: CancellationToken,
}

impl Session {
    /// Serve `io` until the client goes away, the session is [closed](Self::close), or it is
    /// idle for `idle_timeout`. Spawns a reader and a writer task.
    pub fn start<T>(io: T, idle_timeout: Duration) -> Session
    where
        T: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (rd, wr) = tokio::io::split(io);
        let (out_tx, out_rx) = mpsc::channel::<Bytes>(64);
        let (streams_tx, streams_rx) = mpsc::channel(16);
        let closed = CancellationToken::new();
        let activity = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let started = tokio::time::Instant::now();
        tokio::spawn(write_loop(
            wr,
            out_rx,
            closed.clone(),
            activity.clone(),
            started,
        ));
        tokio::spawn(read_loop(
            rd,
            out_tx.clone(),
            streams_tx,
            closed.clone(),
            activity,
            started,
            idle_timeout,
        ));
        Session {
            streams: streams_rx,
            out: out_tx,
            closed,
        }
    }

    /// Send `GOAWAY` after everything queued, then close the connection.
    pub async fn close(&self) {
        let mut f = BytesMut::with_capacity(16);
        goaway_frame(&mut f, 0);
        let _ = self.out.send(f.freeze()).await;
        let _ = self.out.send(Bytes::new()).await;
    }

    /// Resolves once the connection is closed.
    pub async fn closed(&self) {
        self.closed.cancelled().await;
    }
}

fn elapsed_ms(started: tokio::time::Instant) -> u64 {
    started.elapsed().as_millis() as u64
}

async fn write_loop<W: AsyncWrite + Send>(
    wr: W,
    mut frames: mpsc::Receiver<Bytes>,
    closed: CancellationToken,
    activity: Arc<std::sync::atomic::AtomicU64>,
    started: tokio::time::Instant,
) {
    let mut wr = std::pin::pin!(wr);
    loop {
        let frame = tokio::select! {
            _ = closed.cancelled() => break,
            f = frames.recv() => f,
        };
        let Some(frame) = frame else { break };
        // An empty buffer is the close marker (after GOAWAY).
        if frame.is_empty() {
            break;
        }
        if wr.write_all(&frame).await.is_err() {
            break;
        }
        // Batch what is queued before flushing.
        while let Ok(more) = frames.try_recv() {
            if more.is_empty() {
                let _ = wr.flush().await;
                let _ = wr.shutdown().await;
                closed.cancel();
                return;
            }
            if wr.write_all(&more).await.is_err() {
                closed.cancel();
                return;
            }
        }
        if wr.flush().await.is_err() {
            break;
        }
        activity.store(elapsed_ms(started), Ordering::Relaxed);
    }
    let _ = wr.shutdown().await;
    closed.cancel();
}

struct Open {
    data: Option<mpsc::Sender<Bytes>>,
    /// Bytes received since the last window update.
    unacked: u32,
}

#[allow(clippy::too_many_arguments)]
async fn read_loop<R: AsyncRead + Send>(
    rd: R,
    out: mpsc::Sender<Bytes>,
    streams: mpsc::Sender<Stream>,
    closed: CancellationToken,
    activity: Arc<std::sync::atomic::AtomicU64>,
    started: tokio::time::Instant,
    idle_timeout: Duration,
) {
    let mut rd = std::pin::pin!(rd);
    let mut reader = FrameReader::new();
    let mut writer = FrameWriter::new();
    // Small while idle; grown before each read (an idle connection holds little).
    let mut buf = BytesMut::with_capacity(4 * 1024);
    let mut open: HashMap<u32, Open> = HashMap::new();
    let mut last_stream = 0u32;
    let mut going_away = false;
    let outcome: Result<(), SpdyError> = async {
        loop {
            while let Some(frame) = reader.decode(&mut buf)? {
                activity.store(elapsed_ms(started), Ordering::Relaxed);
                match frame {
                    Frame::SynStream {
                        stream_id,
                        fin,
                        headers,
                    } => {
                        if stream_id % 2 == 0 || stream_id <= last_stream || going_away {
                            let mut f = BytesMut::new();
                            rst_frame(&mut f, stream_id, status::PROTOCOL_ERROR);
                            let _ = out.send(f.freeze()).await;
                            continue;
                        }
                        last_stream = stream_id;
                        let mut f = BytesMut::new();
                        writer.syn_reply(&mut f, stream_id, false, &[])?;
                        if out.send(f.freeze()).await.is_err() {
                            return Ok(());
                        }
                        let (tx, rx) = mpsc::channel(16);
                        let stream = Stream {
                            id: stream_id,
                            headers,
                            data: rx,
                            writer: StreamWriter {
                                id: stream_id,
                                out: out.clone(),
                                finished: Arc::new(AtomicBool::new(false)),
                            },
                        };
                        open.insert(
                            stream_id,
                            Open {
                                data: (!fin).then_some(tx),
                                unacked: 0,
                            },
                        );
                        if streams.send(stream).await.is_err() {
                            return Ok(());
                        }
                    }
                    Frame::Data {
                        stream_id,
                        fin,
                        data,
                    } => {
                        let Some(s) = open.get_mut(&stream_id) else {
                            let mut f = BytesMut::new();
                            rst_frame(&mut f, stream_id, status::INVALID_STREAM);
                            let _ = out.send(f.freeze()).await;
                            continue;
                        };
                        let n = data.len() as u32;
                        if !data.is_empty()
                            && let Some(tx) = &s.data
                            && tx.send(data).await.is_err()
                        {
                            // The consumer stopped reading this stream: drop what comes.
                            s.data = None;
                        }
                        s.unacked += n;
                        if s.unacked >= INITIAL_WINDOW / 2 {
                            let mut f = BytesMut::new();
                            window_update_frame(&mut f, stream_id, s.unacked);
                            window_update_frame(&mut f, 0, s.unacked);
                            s.unacked = 0;
                            let _ = out.send(f.freeze()).await;
                        }
                        if fin {
                            s.data = None;
                        }
                    }
                    Frame::RstStream { stream_id, .. } => {
                        open.remove(&stream_id);
                    }
                    Frame::Headers { stream_id, fin } => {
                        if fin && let Some(s) = open.get_mut(&stream_id) {
                            s.data = None;
                        }
                    }
                    Frame::Ping(id) => {
                        let mut f = BytesMut::new();
                        ping_frame(&mut f, id);
                        let _ = out.send(f.freeze()).await;
                    }
                    Frame::GoAway { .. } => {
                        going_away = true;
                    }
                    Frame::SynReply { .. }
                    | Frame::Settings
                    | Frame::WindowUpdate { .. }
                    | Frame::Unknown(_) => {}
                }
            }
            let read = async {
                loop {
                    let idle_for = Duration::from_millis(
                        elapsed_ms(started).saturating_sub(activity.load(Ordering::Relaxed)),
                    );
                    let left = idle_timeout.saturating_sub(idle_for);
                    if left.is_zero() {
                        return None;
                    }
                    if buf.capacity() - buf.len() < 1024 {
                        buf.reserve(16 * 1024);
                    }
                    match tokio::time::timeout(left, rd.read_buf(&mut buf)).await {
                        Ok(r) => return Some(r),
                        Err(_) => continue,
                    }
                }
            };
            let n = tokio::select! {
                _ = closed.cancelled() => return Ok(()),
                r = read => match r {
                    None => {
                        tracing::debug!(timeout = ?idle_timeout, "streaming connection idle; closing");
                        return Ok(());
                    }
                    Some(r) => r?,
                },
            };
            if n == 0 {
                return Ok(());
            }
        }
    }
    .await;
    if let Err(e) = outcome {
        tracing::debug!(error = %kubelet_api::chain(&e), "SPDY connection ended");
        let mut f = BytesMut::new();
        goaway_frame(&mut f, last_stream);
        let _ = out.try_send(f.freeze());
    }
    // Ends every stream's data: consumers see the connection go.
    drop(open);
    closed.cancel();
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn adler32(bytes: &[u8]) -> u32 {
        let (mut a, mut b) = (1u32, 0u32);
        for x in bytes {
            a = (a + u32::from(*x)) % 65_521;
            b = (b + a) % 65_521;
        }
        (b << 16) | a
    }

    #[test]
    fn the_dictionary_is_the_protocols() {
        assert_eq!(DICTIONARY.len(), 1423);
        assert_eq!(adler32(DICTIONARY), DICTIONARY_ADLER32);
    }

    /// A `SYN_STREAM` as Go's framer (moby/spdystream, used by kubectl) writes it for the header
    /// `streamtype: stdout` on stream 1: best compression, the protocol's dictionary.
    const GO_STDOUT_SYN_STREAM: &[u8] = b"\x80\x03\x00\x01\x00\x00\x00\x2b\x00\x00\x00\x01\
\x00\x00\x00\x00\x00\x00\x78\xf9\xe3\xc6\xa7\xc2\x62\x60\x60\x60\x04\xa7\xb3\x92\xa2\xd4\xc4\x5c\
\x68\x51\xc2\x56\x5c\x92\x92\x5f\x5a\x02\x00\x00\x00\xff\xff";

    #[test]
    fn a_go_clients_syn_stream_decodes() {
        let mut r = FrameReader::new();
        let mut buf = BytesMut::from(GO_STDOUT_SYN_STREAM);
        let f = r.decode(&mut buf).unwrap().unwrap();
        assert_eq!(
            f,
            Frame::SynStream {
                stream_id: 1,
                fin: false,
                headers: vec![("streamtype".into(), "stdout".into())],
            }
        );
        assert!(buf.is_empty());
    }

    #[test]
    fn frames_round_trip_through_one_compression_context_per_direction() {
        let mut w = FrameWriter::new();
        let mut r = FrameReader::new();
        let mut wire = BytesMut::new();
        for (id, t) in [(1, "error"), (3, "stdin"), (5, "stdout"), (7, "resize")] {
            w.syn_stream(&mut wire, id, id == 7, &[("streamType", t), ("port", "80")])
                .unwrap();
        }
        data_frame(&mut wire, 3, true, b"hello");
        ping_frame(&mut wire, 1);
        window_update_frame(&mut wire, 0, 100);
        rst_frame(&mut wire, 5, status::CANCEL);
        w.syn_reply(&mut wire, 9, false, &[]).unwrap();
        goaway_frame(&mut wire, 7);
        // Fed a byte at a time: a partial frame waits for the rest.
        let mut buf = BytesMut::new();
        let mut frames = Vec::new();
        for b in wire.iter() {
            buf.put_u8(*b);
            while let Some(f) = r.decode(&mut buf).unwrap() {
                frames.push(f);
            }
        }
        assert_eq!(frames.len(), 10);
        assert_eq!(
            frames[3],
            Frame::SynStream {
                stream_id: 7,
                fin: true,
                headers: vec![
                    ("streamtype".into(), "resize".into()),
                    ("port".into(), "80".into())
                ],
            }
        );
        assert_eq!(
            frames[4],
            Frame::Data {
                stream_id: 3,
                fin: true,
                data: Bytes::from_static(b"hello")
            }
        );
        assert_eq!(frames[5], Frame::Ping(1));
        assert_eq!(
            frames[7],
            Frame::RstStream {
                stream_id: 5,
                status: status::CANCEL
            }
        );
        assert_eq!(
            frames[8],
            Frame::SynReply {
                stream_id: 9,
                fin: false,
                headers: vec![]
            }
        );
        assert_eq!(frames[9], Frame::GoAway { last_stream_id: 7 });
    }

    #[test]
    fn header_blocks_are_stored_zlib_blocks_ending_like_a_sync_flush() {
        let mut w = FrameWriter::new();
        let mut first = BytesMut::new();
        w.syn_reply(&mut first, 1, false, &[]).unwrap();
        // Header 8, stream ID 4, then the zlib header with the dictionary ID.
        assert_eq!(&first[12..18], &[0x78, 0x20, 0xe3, 0xc6, 0xa7, 0xc2]);
        assert!(
            first.ends_with(&[0x00, 0x00, 0x00, 0xff, 0xff]),
            "{first:?}"
        );
        let mut second = BytesMut::new();
        w.syn_reply(&mut second, 3, false, &[]).unwrap();
        // No zlib header again: one stream per direction.
        assert_eq!(
            &second[12..],
            &[0, 4, 0, 0xfb, 0xff, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]
        );
    }

    #[test]
    fn broken_input_is_an_error_not_a_panic() {
        let mut r = FrameReader::new();
        // Wrong version.
        let mut b = BytesMut::from(&b"\x80\x02\x00\x01\x00\x00\x00\x00"[..]);
        assert!(r.decode(&mut b).is_err());
        // Too large.
        let mut b = BytesMut::from(&b"\x00\x00\x00\x01\x00\xff\xff\xff"[..]);
        assert!(r.decode(&mut b).is_err());
        // SYN_STREAM too short, and with garbage for a header block.
        let mut b = BytesMut::from(&b"\x80\x03\x00\x01\x00\x00\x00\x02\x00\x01"[..]);
        assert!(FrameReader::new().decode(&mut b).is_err());
        let mut b = BytesMut::from(
            &b"\x80\x03\x00\x01\x00\x00\x00\x0e\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00garb"[..],
        );
        assert!(FrameReader::new().decode(&mut b).is_err());
        // Header blocks with impossible lengths.
        assert!(parse_header_block(b"\x00\x00\x00\x01\x00\x00\x00\x09ab").is_err());
        assert!(parse_header_block(b"\xff\xff\xff\xff").is_err());
        assert!(parse_header_block(b"\x00\x00").is_err());
    }

    #[tokio::test]
    async fn a_session_accepts_streams_answers_pings_and_passes_data() {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let mut session = Session::start(server, Duration::from_secs(30));
        let (mut crd, mut cwr) = tokio::io::split(client);
        let mut w = FrameWriter::new();
        let mut wire = BytesMut::new();
        w.syn_stream(&mut wire, 1, false, &[("streamtype", "stdin")])
            .unwrap();
        data_frame(&mut wire, 1, false, b"abc");
        data_frame(&mut wire, 1, true, b"def");
        ping_frame(&mut wire, 7);
        cwr.write_all(&wire).await.unwrap();

        let mut s = session.streams.recv().await.unwrap();
        assert_eq!(s.header("streamtype"), Some("stdin"));
        let mut got = Vec::new();
        while let Some(d) = s.data.recv().await {
            got.extend_from_slice(&d);
        }
        assert_eq!(got, b"abcdef", "data then the end of the stream at FIN");
        s.writer.write(b"out").await.unwrap();
        s.writer.finish().await.unwrap();
        session.close().await;

        let mut r = FrameReader::new();
        let mut buf = BytesMut::new();
        let mut frames = Vec::new();
        loop {
            let n = crd.read_buf(&mut buf).await.unwrap();
            while let Some(f) = r.decode(&mut buf).unwrap() {
                frames.push(f);
            }
            if n == 0 {
                break;
            }
        }
        assert!(matches!(frames[0], Frame::SynReply { stream_id: 1, .. }));
        assert!(frames.contains(&Frame::Ping(7)));
        assert!(frames.contains(&Frame::Data {
            stream_id: 1,
            fin: false,
            data: Bytes::from_static(b"out")
        }));
        assert!(frames.contains(&Frame::Data {
            stream_id: 1,
            fin: true,
            data: Bytes::new()
        }));
        assert!(matches!(frames.last(), Some(Frame::GoAway { .. })));
        session.closed().await;
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_session_closes() {
        let (_client, server) = tokio::io::duplex(1024);
        let session = Session::start(server, Duration::from_secs(5));
        tokio::time::timeout(Duration::from_secs(6), session.closed())
            .await
            .expect("closed after the idle timeout");
    }
}
