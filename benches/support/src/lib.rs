//! What the benchmark harnesses under `benches/` share, so that every harness computes its
//! quantiles and reads memory the same way.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The `p` quantile (0 to 1) of `sorted` (ascending): the element at index
/// `round((len − 1) · p)`; `T::default()` for an empty slice.
pub fn percentile<T: Copy + Default>(sorted: &[T], p: f64) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// `d` in milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `VmRSS` of process `pid` in KiB (`/proc/<pid>/status`); 0 when it cannot be read.
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A private containerd started by `scripts/containerd-test-env.sh` (root only): its root,
/// state, socket and logs live under [`dir`](Self::dir); stopped and removed on drop.
#[derive(Debug)]
pub struct ContainerdEnv {
    /// The environment's directory.
    pub dir: PathBuf,
    /// containerd's socket (`CONTAINERD_SOCKET`).
    pub socket: PathBuf,
    /// The busybox image reference the script imported (`BUSYBOX_IMAGE`).
    pub busybox: String,
    /// containerd's PID (`CONTAINERD_PID`).
    pub pid: Option<u32>,
    /// containerd's version (`CONTAINERD_VERSION`).
    pub version: String,
}

impl ContainerdEnv {
    /// Runs the script's `subcommand` (`start`, or `start17` for containerd 1.7) on a new
    /// directory `/tmp/<prefix><pid>-<n>`.
    pub fn start(subcommand: &str, prefix: &str) -> std::io::Result<Self> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = PathBuf::from(format!("/tmp/{prefix}{}-{nanos}", std::process::id()));
        let out = std::process::Command::new("bash")
            .arg(script())
            .arg(subcommand)
            .arg(&dir)
            .output()?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let value = |key: &str| {
            stdout
                .lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
                .unwrap_or_default()
                .to_string()
        };
        let env = Self {
            socket: PathBuf::from(value("CONTAINERD_SOCKET")),
            busybox: value("BUSYBOX_IMAGE"),
            pid: value("CONTAINERD_PID").parse().ok(),
            version: value("CONTAINERD_VERSION"),
            dir,
        };
        if !out.status.success() || env.busybox.is_empty() {
            return Err(std::io::Error::other(format!(
                "containerd-test-env.sh {subcommand}: {}{stdout}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(env)
    }

    /// `unix://<socket>`, for CRI clients and `--container-runtime-endpoint`.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }
}

impl Drop for ContainerdEnv {
    fn drop(&mut self) {
        let _ = std::process::Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(&self.dir)
            .status();
    }
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/containerd-test-env.sh")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_round_to_the_nearest_index() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&v, 0.5), Duration::from_millis(51));
        assert_eq!(percentile(&v, 0.99), Duration::from_millis(99));
        assert_eq!(percentile(&v, 1.0), Duration::from_millis(100));
        assert_eq!(percentile::<Duration>(&[], 0.5), Duration::ZERO);
        assert_eq!(ms(Duration::from_micros(1500)), 1.5);
    }

    #[test]
    fn this_process_has_resident_memory_and_a_port_is_found() {
        assert!(rss_kib(std::process::id()) > 0);
        assert_eq!(rss_kib(u32::MAX), 0);
        assert!(free_port().expect("port") > 0);
    }
}

/// One pod of a pod list (the agent's `/pods`, or a LIST of the API server).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodState {
    /// `status.phase` is `Running`.
    pub running: bool,
    /// The `Ready` condition is `True`.
    pub ready: bool,
}

impl PodState {
    /// Running and Ready.
    pub fn running_ready(self) -> bool {
        self.running && self.ready
    }
}

/// Every item of a pod list (JSON `{"items": [...]}`), by name.
pub fn pod_states(
    body: &str,
) -> Result<std::collections::BTreeMap<String, PodState>, serde_json::Error> {
    let list: serde_json::Value = serde_json::from_str(body)?;
    let mut out = std::collections::BTreeMap::new();
    for item in list["items"].as_array().into_iter().flatten() {
        let Some(name) = item["metadata"]["name"].as_str() else {
            continue;
        };
        let status = &item["status"];
        let ready = status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        out.insert(
            name.to_string(),
            PodState {
                running: status["phase"] == "Running",
                ready,
            },
        );
    }
    Ok(out)
}
