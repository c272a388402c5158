//! The wire side of the HTTP/1.1 client: one `GET`, one response, no connection reuse.
//!
//! A general client (connection pools, dispatch tasks, header maps, body streams) costs more CPU
//! and memory per request than the socket work of a probe; at thousands of probes a second that
//! is most of the prober's user-space time. A probe, a hook or a manifest fetch needs much less:
//! write one request, parse one response head, read at most a given number of bytes of its body
//! (`Content-Length`, chunked, or up to the end of the connection), and close. The response head
//! is parsed with `httparse`.
//!
//! Errors before a complete response head are transport errors (the kubelet turns them into
//! probe failures); errors while reading the body are [`Error::Body`] (the kubelet returns them
//! as probe errors, which its workers discard).

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Largest response head accepted.
pub(crate) const MAX_HEAD: usize = 64 * 1024;
/// Informational (1xx) responses skipped before the final one (Go's `max1xxResponses`).
const MAX_1XX: usize = 5;
/// Header lines parsed on the fast path; more fall back to a heap array.
const FAST_HEADERS: usize = 32;
const MAX_HEADERS: usize = 1024;

/// A response: its status, where it redirects to, and the start of its body.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The first `Location` header.
    pub location: Option<String>,
    /// At most the client's [`max_body`](super::HttpClient::max_body) bytes of the
    /// (de-chunked) body.
    pub body: Vec<u8>,
    /// The body went on past that limit (the rest was not read).
    pub truncated: bool,
}

/// Why an exchange did not produce a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Error {
    /// Writing the request or reading / parsing the response head failed.
    Transport(String),
    /// The response head arrived but its body could not be read.
    Body(String),
}

/// How the body of a response is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    None,
    Length(u64),
    Chunked,
    UntilClose,
}

/// Request bytes: `GET <path> HTTP/1.1`, `Host`, then `headers` (each already `Name: value`
/// without line end), then the empty line.
pub(crate) fn request<'a>(
    path: &str,
    authority: &str,
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(128 + path.len());
    out.extend_from_slice(b"GET ");
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    out.extend_from_slice(authority.as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in headers {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// Send `request` on `io` and read the response, its body up to `max_body` bytes.
pub(crate) async fn exchange<S>(
    io: &mut S,
    request: &[u8],
    max_body: usize,
) -> Result<Response, Error>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    io.write_all(request)
        .await
        .map_err(|e| Error::Transport(e.to_string()))?;
    io.flush()
        .await
        .map_err(|e| Error::Transport(e.to_string()))?;
    let mut buf: Vec<u8> = Vec::with_capacity(1024);
    let mut informational = 0;
    loop {
        let head = loop {
            if let Some(head) = parse_head(&buf)? {
                break head;
            }
            if buf.len() >= MAX_HEAD {
                return Err(Error::Transport(format!(
                    "net/http: server response headers exceeded {MAX_HEAD} bytes; aborted"
                )));
            }
            if read_more(io, &mut buf, MAX_HEAD)
                .await
                .map_err(|e| Error::Transport(e.to_string()))?
                == 0
            {
                return Err(Error::Transport(if buf.is_empty() {
                    "EOF".to_string()
                } else {
                    "unexpected EOF reading the response head".to_string()
                }));
            }
        };
        buf.drain(..head.len);
        if (100..200).contains(&head.status) && head.status != 101 {
            informational += 1;
            if informational > MAX_1XX {
                return Err(Error::Transport(
                    "net/http: too many 1xx informational responses".to_string(),
                ));
            }
            continue;
        }
        let (body, truncated) = read_body(io, buf, head.framing, max_body).await?;
        return Ok(Response {
            status: head.status,
            location: head.location,
            body,
            truncated,
        });
    }
}

struct Head {
    len: usize,
    status: u16,
    location: Option<String>,
    framing: Framing,
}

fn parse_head(buf: &[u8]) -> Result<Option<Head>, Error> {
    let mut fast = [httparse::EMPTY_HEADER; FAST_HEADERS];
    let mut resp = httparse::Response::new(&mut fast);
    match resp.parse(buf) {
        Ok(status) => head_of(&resp, status),
        Err(httparse::Error::TooManyHeaders) => {
            let mut slow = vec![httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut resp = httparse::Response::new(&mut slow);
            match resp.parse(buf) {
                Ok(status) => head_of(&resp, status),
                Err(e) => Err(malformed(e)),
            }
        }
        Err(e) => Err(malformed(e)),
    }
}

fn malformed(e: httparse::Error) -> Error {
    Error::Transport(format!("net/http: malformed HTTP response: {e}"))
}

fn head_of(
    resp: &httparse::Response<'_, '_>,
    status: httparse::Status<usize>,
) -> Result<Option<Head>, Error> {
    let httparse::Status::Complete(len) = status else {
        return Ok(None);
    };
    let code = resp.code.unwrap_or(0);
    let http10 = resp.version == Some(0);
    let mut location = None;
    let mut length: Option<u64> = None;
    let mut chunked = false;
    let mut transfer_encoding = false;
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("location") {
            if location.is_none() {
                location = Some(String::from_utf8_lossy(h.value).trim().to_string());
            }
        } else if h.name.eq_ignore_ascii_case("content-length") {
            let v = std::str::from_utf8(h.value)
                .ok()
                .map(str::trim)
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| {
                    Error::Transport(format!(
                        "net/http: bad Content-Length {:?}",
                        String::from_utf8_lossy(h.value)
                    ))
                })?;
            if length.is_some_and(|l| l != v) {
                return Err(Error::Transport(
                    "net/http: message cannot contain multiple Content-Length headers".to_string(),
                ));
            }
            length = Some(v);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            transfer_encoding = true;
            // Chunked must be the last coding to delimit the body.
            chunked = String::from_utf8_lossy(h.value)
                .rsplit(',')
                .next()
                .is_some_and(|c| c.trim().eq_ignore_ascii_case("chunked"));
        }
    }
    let framing = if (100..200).contains(&code) || code == 204 || code == 304 {
        Framing::None
    } else if transfer_encoding && !http10 {
        if chunked {
            Framing::Chunked
        } else {
            Framing::UntilClose
        }
    } else if let Some(l) = length {
        Framing::Length(l)
    } else {
        Framing::UntilClose
    };
    Ok(Some(Head {
        len,
        status: code,
        location,
        framing,
    }))
}

/// Read into the spare capacity of `buf` (growing it up to `limit`); bytes read, 0 at EOF.
async fn read_more<S>(io: &mut S, buf: &mut Vec<u8>, limit: usize) -> std::io::Result<usize>
where
    S: AsyncRead + Unpin,
{
    if buf.len() == buf.capacity() {
        let grow = buf
            .capacity()
            .max(1024)
            .min(limit.saturating_sub(buf.len()).max(1));
        buf.reserve(grow);
    }
    io.read_buf(buf).await
}

fn body_error(e: impl std::fmt::Display) -> Error {
    Error::Body(e.to_string())
}

/// The body (at most `max_body` bytes) and whether there was more.
async fn read_body<S>(
    io: &mut S,
    mut buf: Vec<u8>,
    framing: Framing,
    max_body: usize,
) -> Result<(Vec<u8>, bool), Error>
where
    S: AsyncRead + Unpin,
{
    match framing {
        Framing::None => Ok((Vec::new(), false)),
        Framing::Length(n) => {
            let full = usize::try_from(n).unwrap_or(usize::MAX);
            let want = full.min(max_body);
            while buf.len() < want {
                if read_more(io, &mut buf, want).await.map_err(body_error)? == 0 {
                    return Err(Error::Body("unexpected EOF".to_string()));
                }
            }
            buf.truncate(want);
            Ok((buf, full > max_body))
        }
        Framing::UntilClose => {
            // One byte past the cap tells whether the body goes on.
            let limit = max_body.saturating_add(1);
            while buf.len() < limit {
                if read_more(io, &mut buf, limit).await.map_err(body_error)? == 0 {
                    break;
                }
            }
            let truncated = buf.len() > max_body;
            buf.truncate(max_body);
            Ok((buf, truncated))
        }
        Framing::Chunked => read_chunked(io, buf, max_body).await,
    }
}

/// Where the chunked decoder is.
enum Chunk {
    /// Expecting a `size[;ext]\r\n` line.
    Size,
    /// Inside a chunk's data: bytes left.
    Data(u64),
    /// Expecting the `\r\n` after a chunk's data.
    DataEnd,
}

/// Decode a chunked body until its last chunk or `max_body` bytes (trailers are not read); the
/// flag tells whether data went on past the cap.
async fn read_chunked<S>(
    io: &mut S,
    mut raw: Vec<u8>,
    max_body: usize,
) -> Result<(Vec<u8>, bool), Error>
where
    S: AsyncRead + Unpin,
{
    let mut body = Vec::new();
    let mut state = Chunk::Size;
    let mut pos = 0;
    loop {
        // Decode as much of `raw[pos..]` as possible.
        loop {
            match state {
                Chunk::Size => {
                    let Some(nl) = raw[pos..].iter().position(|&b| b == b'\n') else {
                        break;
                    };
                    let line = &raw[pos..pos + nl];
                    let line = line.strip_suffix(b"\r").unwrap_or(line);
                    let size = line.split(|&b| b == b';').next().unwrap_or_default();
                    let size = std::str::from_utf8(size)
                        .ok()
                        .map(str::trim)
                        .filter(|s| !s.is_empty() && s.len() <= 16)
                        .and_then(|s| u64::from_str_radix(s, 16).ok())
                        .ok_or_else(|| Error::Body("malformed chunked encoding".to_string()))?;
                    pos += nl + 1;
                    if size == 0 {
                        return Ok((body, false));
                    }
                    state = Chunk::Data(size);
                }
                Chunk::Data(left) => {
                    let avail = raw.len() - pos;
                    if avail == 0 {
                        break;
                    }
                    let take = usize::try_from(left).unwrap_or(usize::MAX).min(avail);
                    let room = max_body - body.len();
                    body.extend_from_slice(&raw[pos..pos + take.min(room)]);
                    if take > room {
                        return Ok((body, true));
                    }
                    pos += take;
                    let left = left - take as u64;
                    state = if left == 0 {
                        Chunk::DataEnd
                    } else {
                        Chunk::Data(left)
                    };
                }
                Chunk::DataEnd => {
                    if raw.len() - pos < 2 {
                        break;
                    }
                    if &raw[pos..pos + 2] != b"\r\n" {
                        return Err(Error::Body("malformed chunked encoding".to_string()));
                    }
                    pos += 2;
                    state = Chunk::Size;
                }
            }
        }
        // Keep only the undecoded tail, then read more.
        raw.drain(..pos);
        pos = 0;
        if raw.len() >= MAX_HEAD {
            return Err(Error::Body("chunk size line too long".to_string()));
        }
        if read_more(io, &mut raw, MAX_HEAD)
            .await
            .map_err(body_error)?
            == 0
        {
            return Err(Error::Body("unexpected EOF".to_string()));
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    const MAX_BODY: usize = 10 * 1024;

    /// Run an exchange against a peer that answers `response` (in pieces of `step` bytes) and
    /// then closes; also returns what the peer received.
    async fn against(response: &[u8], step: usize) -> (Result<Response, Error>, Vec<u8>) {
        let (mut client, mut server) = tokio::io::duplex(64 * 1024);
        let response = response.to_vec();
        let peer = tokio::spawn(async move {
            let mut got = Vec::new();
            let mut b = [0u8; 512];
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = server.read(&mut b).await.unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&b[..n]);
            }
            for piece in response.chunks(step.max(1)) {
                if server.write_all(piece).await.is_err() {
                    break;
                }
                tokio::task::yield_now().await;
            }
            drop(server);
            got
        });
        let req = request("/p?q=1", "10.0.0.1:80", [("User-Agent", "kube-probe/1.33")]);
        let r = exchange(&mut client, &req, MAX_BODY).await;
        drop(client);
        (r, peer.await.unwrap())
    }

    #[tokio::test]
    async fn requests_carry_the_path_host_and_headers() {
        let (r, got) = against(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", 1000).await;
        assert_eq!(r.unwrap().body, b"ok");
        assert_eq!(
            got,
            b"GET /p?q=1 HTTP/1.1\r\nHost: 10.0.0.1:80\r\nUser-Agent: kube-probe/1.33\r\n\r\n"
        );
    }

    #[tokio::test]
    async fn bodies_are_framed_by_length_chunks_or_close_and_capped_at_10_kib() {
        for step in [1, 7, 4096] {
            let (r, _) = against(
                b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello-and-more",
                step,
            )
            .await;
            assert_eq!(r.unwrap().body, b"hello", "step {step}");
            let (r, _) = against(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
                step,
            )
            .await;
            assert_eq!(r.unwrap().body, b"abcde", "step {step}");
            let (r, _) = against(b"HTTP/1.0 200 OK\r\n\r\nuntil close", step).await;
            assert_eq!(r.unwrap().body, b"until close", "step {step}");
        }
        let mut big = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n".to_vec();
        big.extend(std::iter::repeat_n(b'x', 100_000));
        assert_eq!(against(&big, 8192).await.0.unwrap().body.len(), MAX_BODY);
        let mut chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        for _ in 0..20 {
            chunked.extend_from_slice(b"400\r\n");
            chunked.extend(std::iter::repeat_n(b'y', 1024));
            chunked.extend_from_slice(b"\r\n");
        }
        chunked.extend_from_slice(b"0\r\n\r\n");
        assert_eq!(
            against(&chunked, 3000).await.0.unwrap().body.len(),
            MAX_BODY
        );
    }

    #[tokio::test]
    async fn informational_responses_are_skipped_and_no_body_statuses_read_none() {
        let (r, _) = against(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: x\r\n\r\nHTTP/1.1 204 No Content\r\nContent-Length: 10\r\n\r\n",
            5,
        )
        .await;
        let r = r.unwrap();
        assert_eq!((r.status, r.body.len()), (204, 0));
        let (r, _) = against(
            b"HTTP/1.1 302 Found\r\nLocation: /next\r\nlocation: /other\r\nContent-Length: 0\r\n\r\n",
            1000,
        )
        .await;
        let r = r.unwrap();
        assert_eq!((r.status, r.location.as_deref()), (302, Some("/next")));
    }

    #[tokio::test]
    async fn broken_heads_are_transport_errors_and_broken_bodies_body_errors() {
        let (r, _) = against(b"", 1).await;
        assert!(matches!(r, Err(Error::Transport(_))), "{r:?}");
        let (r, _) = against(b"HTTP/1.1 200 OK\r\nContent-Le", 1000).await;
        assert!(matches!(r, Err(Error::Transport(_))), "{r:?}");
        let (r, _) = against(b"SSH-2.0-OpenSSH\r\n\r\n", 1000).await;
        assert!(matches!(r, Err(Error::Transport(_))), "{r:?}");
        let (r, _) = against(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", 1000).await;
        assert!(matches!(r, Err(Error::Transport(_))), "{r:?}");
        let (r, _) = against(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", 1000).await;
        assert_eq!(r, Err(Error::Body("unexpected EOF".into())));
        let (r, _) = against(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            1000,
        )
        .await;
        assert!(matches!(r, Err(Error::Body(_))), "{r:?}");
        let mut huge = b"HTTP/1.1 200 OK\r\nX: ".to_vec();
        huge.extend(std::iter::repeat_n(b'a', MAX_HEAD + 10));
        let (r, _) = against(&huge, 8192).await;
        match r {
            Err(Error::Transport(m)) => assert!(m.contains("exceeded"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn many_headers_fall_back_to_the_slow_path() {
        let mut resp = b"HTTP/1.1 200 OK\r\n".to_vec();
        for i in 0..100 {
            resp.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
        }
        resp.extend_from_slice(b"Content-Length: 2\r\n\r\nok");
        let (r, _) = against(&resp, 1000).await;
        assert_eq!(r.unwrap().body, b"ok");
    }

    #[tokio::test]
    async fn arbitrary_responses_never_panic() {
        // A deterministic sweep of mutations of a valid response (the parser sees bytes from
        // any server a pod runs).
        let base = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n4\r\nabcd\r\n0\r\n\r\n";
        let mut seed = 0x9e37_79b9_u32;
        for _ in 0..300 {
            let mut m = base.to_vec();
            for _ in 0..4 {
                seed ^= seed << 13;
                seed ^= seed >> 17;
                seed ^= seed << 5;
                let i = seed as usize % m.len();
                m[i] = (seed >> 8) as u8;
            }
            let cut = (seed as usize >> 3) % (m.len() + 1);
            let _ = against(&m[..cut], 1 + (seed as usize % 9)).await;
        }
    }
}
