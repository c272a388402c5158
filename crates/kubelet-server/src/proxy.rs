//! Proxying an upgraded streaming request to a runtime's streaming server (the URL a CRI
//! runtime answers `Exec`, `Attach` or `PortForward` with), as current kubelets do: the
//! client's upgrade request goes to the URL with its upgrade headers; when the runtime
//! switches protocols, bytes are copied both ways until either side closes; any other answer
//! is passed back to the client as it is (so a client whose protocol the runtime refuses can
//! fall back, e.g. kubectl from WebSocket to SPDY).

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::routes::{Body, full, status};

/// The request headers that make an upgrade, passed on to the runtime.
const FORWARDED: &[&str] = &[
    "connection",
    "upgrade",
    "x-stream-protocol-version",
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-protocol",
    "sec-websocket-extensions",
];

/// The largest response head accepted from the runtime.
const MAX_HEAD: usize = 16 * 1024;
/// The largest non-101 body passed back.
const MAX_BODY: usize = 64 * 1024;

fn bad_gateway(message: String) -> Response<Body> {
    status(StatusCode::BAD_GATEWAY, "InternalError", message)
}

/// Proxy `req` to `url` (`http://host:port/path`).
pub(crate) async fn proxy(req: Request<Incoming>, url: &str) -> Response<Body> {
    let uri: http::Uri = match url.parse() {
        Ok(u) => u,
        Err(e) => return bad_gateway(format!("invalid streaming URL {url:?}: {e}")),
    };
    if uri.scheme_str() != Some("http") {
        return bad_gateway(format!(
            "streaming URL {url:?}: only http:// streaming servers are supported"
        ));
    }
    let Some(host) = uri.host() else {
        return bad_gateway(format!("streaming URL {url:?} has no host"));
    };
    let port = uri.port_u16().unwrap_or(80);
    let mut upstream = match TcpStream::connect((host.trim_matches(['[', ']']), port)).await {
        Ok(s) => s,
        Err(e) => return bad_gateway(format!("connecting to the runtime's streaming server: {e}")),
    };
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut head = format!(
        "{} {path} HTTP/1.1\r\nHost: {host}:{port}\r\n",
        req.method()
    );
    for name in FORWARDED {
        for v in req.headers().get_all(*name) {
            if let Ok(v) = v.to_str() {
                head.push_str(&format!("{name}: {v}\r\n"));
            }
        }
    }
    head.push_str("Content-Length: 0\r\n\r\n");
    if let Err(e) = upstream.write_all(head.as_bytes()).await {
        return bad_gateway(format!("writing to the runtime's streaming server: {e}"));
    }

    // Read the answer's head.
    let mut buf = Vec::with_capacity(1024);
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > MAX_HEAD {
            return bad_gateway("the runtime's streaming server sent an oversized head".into());
        }
        let mut chunk = [0u8; 2048];
        match upstream.read(&mut chunk).await {
            Ok(0) => {
                return bad_gateway("the runtime's streaming server closed the connection".into());
            }
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => return bad_gateway(format!("reading from the runtime: {e}")),
        }
    };
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut parsed = httparse::Response::new(&mut headers);
    if !matches!(parsed.parse(&buf[..end]), Ok(httparse::Status::Complete(_))) {
        return bad_gateway("the runtime's streaming server sent a malformed answer".into());
    }
    let code = parsed.code.unwrap_or(502);
    let mut response = full(
        StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_GATEWAY),
        Bytes::new(),
    );
    let mut content_length = None;
    for h in parsed.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        if name == "content-length" {
            content_length = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok());
            continue;
        }
        if name == "transfer-encoding" {
            continue;
        }
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(h.name.as_bytes()),
            HeaderValue::from_bytes(h.value),
        ) {
            response.headers_mut().append(n, v);
        }
    }
    let leftover = buf[end..].to_vec();
    if code != 101 {
        // Pass the refusal back with its body.
        let mut body = leftover;
        let want = content_length.unwrap_or(MAX_BODY).min(MAX_BODY);
        while body.len() < want {
            let mut chunk = [0u8; 4096];
            match upstream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => body.extend_from_slice(&chunk[..n]),
            }
        }
        body.truncate(want);
        let headers = std::mem::take(response.headers_mut());
        let mut r = full(response.status(), body);
        *r.headers_mut() = headers;
        return r;
    }
    tokio::spawn(async move {
        let client = match crate::streaming::upgrade(req).await {
            Ok(u) => u,
            Err(e) => {
                tracing::debug!(error = %kubelet_api::chain(&e), "streaming proxy: client upgrade failed");
                return;
            }
        };
        let mut client = TokioIo::new(client);
        if !leftover.is_empty() && client.write_all(&leftover).await.is_err() {
            return;
        }
        if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
            tracing::debug!(error = %kubelet_api::chain(&e), "streaming proxy ended");
        }
    });
    response
}
