//! Helpers shared by minimal_kubelet's end-to-end tests: a small HTTP client for the agent's
//! ports and process lookups by command-line token.
#![allow(dead_code)] // each test binary uses a different subset

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A minimal HTTP/1.1 GET; returns the status code and the body.
pub(crate) fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no end of headers"))?;
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut body = raw[split + 4..].to_vec();
    let code: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| bad("no status code"))?;
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body).ok_or_else(|| bad("bad chunked body"))?;
    }
    Ok((code, String::from_utf8_lossy(&body).to_string()))
}

pub(crate) fn dechunk(mut b: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = b.windows(2).position(|w| w == b"\r\n")?;
        let size_str = std::str::from_utf8(&b[..eol]).ok()?;
        let size = usize::from_str_radix(size_str.split(';').next()?.trim(), 16).ok()?;
        b = &b[eol + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(b.get(..size)?);
        b = b.get(size + 2..)?;
    }
}

/// Processes having `token` as one whole command-line argument: `(pid, ppid)`.
pub(crate) fn procs_with_arg(token: &str) -> Vec<(i32, i32)> {
    let me = std::process::id() as i32;
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        if !cmdline_has(pid, token) {
            continue;
        }
        let ppid = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                let after = &s[s.rfind(')')? + 1..];
                after.split_whitespace().nth(1)?.parse().ok()
            })
            .unwrap_or(0);
        out.push((pid, ppid));
    }
    out
}

pub(crate) fn cmdline_has(pid: i32, token: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| c.split(|b| *b == 0).any(|a| a == token.as_bytes()))
        .unwrap_or(false)
}

/// The container processes carrying `token`: matching processes whose parent does not match
/// (a shell's fork that has not exec'd yet has the same command line as the shell).
pub(crate) fn container_pids(token: &str) -> Vec<i32> {
    let procs = procs_with_arg(token);
    let pids: HashSet<i32> = procs.iter().map(|(p, _)| *p).collect();
    procs
        .into_iter()
        .filter(|(_, ppid)| !pids.contains(ppid))
        .map(|(p, _)| p)
        .collect()
}
