//! Helpers shared by minimal_kubelet's end-to-end tests: a small HTTP client for the agent's
//! ports, process lookups by command-line token, and the teardown of a test's agent.
#![allow(dead_code)] // each test binary uses a different subset

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

#[allow(unused_imports)] // each test binary uses a different subset
pub(crate) use kubelet_testenv::free_port;

/// A minimal HTTP/1.1 GET to 127.0.0.1:`port`; returns the status code and the body.
pub(crate) fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    http_get_addr(SocketAddr::from(([127, 0, 0, 1], port)), path)
}

/// A minimal HTTP/1.1 GET to `addr`; returns the status code and the body.
pub(crate) fn http_get_addr(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
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

/// The value of the sample `name` (the whole series name, labels included, e.g.
/// `kubelet_pleg_relist_duration_seconds_count`) in Prometheus/OpenMetrics text.
pub(crate) fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Relists counted in `kubelet_pleg_relist_duration_seconds` once the evented PLEG is up: it
/// subscribed to the runtime's events (`kubelet_evented_pleg_connection_success_count`) and its
/// start-up relist is done. `None` before that. With events flowing the next relist is 300 s
/// away.
pub(crate) fn evented_pleg_relists(metrics: &str) -> Option<f64> {
    metric(
        metrics,
        "kubelet_evented_pleg_connection_success_count_total",
    )
    .filter(|v| *v >= 1.0)?;
    metric(metrics, RELISTS).filter(|v| *v >= 1.0)
}

/// Assert that the PLEG ran no relist since it counted `relists` and that its event stream never
/// failed: what the agent saw meanwhile came from runtime events.
pub(crate) fn assert_seen_through_events(metrics: &str, relists: f64) {
    assert_eq!(
        metric(metrics, RELISTS),
        Some(relists),
        "a relist ran: not everything was seen through events\n{metrics}"
    );
    assert_eq!(
        metric(metrics, "kubelet_evented_pleg_connection_error_count_total"),
        Some(0.0),
        "{metrics}"
    );
}

pub(crate) const RELISTS: &str = "kubelet_pleg_relist_duration_seconds_count";

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

/// SIGKILL every process carrying one of `tokens` as a whole argument.
pub(crate) fn kill_token_processes(tokens: &[String]) {
    for t in tokens {
        for (pid, _) in procs_with_arg(t) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// Tear down one test's agent on the process runtime, also when the test failed:
///
/// 1. when the test is panicking, print the last lines of the agent's stderr (file `stderr`);
/// 2. delete every manifest in `manifests` and wait (up to 15 s) until the agent lists no pod on
///    its read-only `port` and no process carries one of `tokens` (a restart leaves a moment with
///    no process, so both are needed);
/// 3. kill whatever still carries a token;
/// 4. stop the agent like Ctrl-C does (SIGINT, SIGKILL after 5 s);
/// 5. kill token processes again: a container the agent restarted between 3 and 4 outlives the
///    agent by design.
pub(crate) fn teardown(
    test: &str,
    stderr: &Path,
    manifests: &Path,
    port: u16,
    agent: &mut Option<Child>,
    tokens: &[String],
) {
    const POLL: Duration = Duration::from_millis(100);
    if std::thread::panicking() {
        let err = std::fs::read_to_string(stderr).unwrap_or_default();
        let tail: Vec<&str> = err.lines().rev().take(80).collect();
        eprintln!(
            "---- {test}: last lines of the agent's stderr ----\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    if let Some(child) = agent.as_mut()
        && matches!(child.try_wait(), Ok(None))
    {
        if let Ok(rd) = std::fs::read_dir(manifests) {
            for e in rd.flatten() {
                let _ = std::fs::remove_file(e.path());
            }
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            let no_procs = tokens.iter().all(|t| procs_with_arg(t).is_empty());
            let no_pods = match http_get(port, "/pods") {
                Ok((200, body)) => serde_json::from_str::<serde_json::Value>(&body)
                    .map(|v| v["items"].as_array().is_some_and(|a| a.is_empty()))
                    .unwrap_or(true),
                _ => true,
            };
            if no_procs && no_pods {
                break;
            }
            std::thread::sleep(POLL);
        }
    }
    kill_token_processes(tokens);
    if let Some(mut child) = agent.take() {
        if let Ok(pid) = i32::try_from(child.id()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGINT);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match child.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() > deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(POLL),
            }
        }
    }
    kill_token_processes(tokens);
}

/// `--eviction-hard` thresholds a test machine does not meet (its disk may be fuller than the
/// kubelet's defaults, 10 % nodefs and 15 % imagefs, allow), so no test pod is rejected or
/// evicted for the machine's own state.
pub(crate) const LOW_EVICTION_HARD: &str =
    "memory.available<1Mi,nodefs.available<1%,imagefs.available<1%";
