//! End-to-end tests of probes in the `minimal_kubelet` binary, on real host processes.
//!
//! Each test starts the real binary (process runtime) on its own temporary directories and
//! read-only port, drops a manifest whose container is a `/bin/sh` loop, and watches `GET /pods`:
//!
//! * readiness: an HTTP probe against a server run by the test on 127.0.0.1 (`httpGet.host`), whose
//!   answers the test switches between 200 and 503;
//! * liveness and startup: exec probes (`/bin/sh -c 'test -e <file>'`), which the test steers
//!   by creating and removing files.
//!
//! Periods are 1 s and thresholds 1, so each test takes a few seconds; the tests run
//! concurrently, each with its own agent. Cleanup (manifests removed, pods stopped, leftover
//! processes killed, agent stopped) happens in [`Env`]'s `Drop`, also when a test fails.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod common;
use common::{container_pids, free_port, http_get};

const BIN: &str = env!("CARGO_BIN_EXE_minimal_kubelet");
const NODE: &str = "probe-e2e-node";
const DEADLINE: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);

static TOKEN_COUNTER: AtomicU32 = AtomicU32::new(0);

// ---------------------------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------------------------

struct Env {
    test: &'static str,
    _dir: tempfile::TempDir,
    manifests: PathBuf,
    /// Scratch directory for the files exec probes test.
    work: PathBuf,
    stderr_path: PathBuf,
    port: u16,
    agent: Option<Child>,
    tokens: Vec<String>,
}

impl Env {
    /// Directories for `test` and a running agent answering on its read-only port.
    fn start(test: &'static str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix(&format!("mk-probe-e2e-{test}-"))
            .tempdir()
            .expect("temp dir");
        let base = dir.path().to_path_buf();
        let (manifests, root, logs, work) = (
            base.join("manifests"),
            base.join("root"),
            base.join("logs"),
            base.join("work"),
        );
        for d in [&manifests, &root, &logs, &work] {
            std::fs::create_dir_all(d).expect("create dir");
        }
        let stderr_path = base.join("agent-stderr.log");
        let stderr = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&stderr_path)
            .expect("open stderr log");
        let port = free_port();
        let child = Command::new(BIN)
            .current_dir(&base)
            .arg("--root-dir")
            .arg(&root)
            .arg("--pod-log-dir")
            .arg(&logs)
            .arg("--pod-manifest-path")
            .arg(&manifests)
            .args(["--read-only-port", &port.to_string()])
            .args(["--address", "127.0.0.1"])
            .args(["--healthz-port", "0", "--port", "0"])
            .args(["--eviction-hard", common::LOW_EVICTION_HARD])
            .args(["--node-name", NODE])
            .args(["--file-check-frequency", "60s"])
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn minimal_kubelet");
        let mut env = Env {
            test,
            _dir: dir,
            manifests,
            work,
            stderr_path,
            port,
            agent: Some(child),
            tokens: Vec::new(),
        };
        let deadline = Instant::now() + DEADLINE;
        while http_get(env.port, "/healthz").is_err() {
            if let Some(status) = env.agent.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                env.agent = None;
                panic!(
                    "minimal_kubelet exited during start-up ({status}); stderr:\n{}",
                    env.stderr()
                );
            }
            assert!(
                Instant::now() < deadline,
                "minimal_kubelet did not answer on port {port}; stderr:\n{}",
                env.stderr()
            );
            std::thread::sleep(POLL);
        }
        env
    }

    fn token(&mut self, what: &str) -> String {
        let n = TOKEN_COUNTER.fetch_add(1, Ordering::Relaxed);
        let t = format!("probe-e2e-{}-{what}-{}-{n}", self.test, std::process::id());
        self.tokens.push(t.clone());
        t
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    fn write_pod(&self, file: &str, pod: &Value) {
        let tmp = self.manifests.join(format!(".{file}.tmp"));
        std::fs::write(&tmp, pod.to_string()).expect("write manifest");
        std::fs::rename(&tmp, self.manifests.join(file)).expect("rename manifest");
    }

    fn pod(&self, name: &str) -> Option<Value> {
        let (code, body) = http_get(self.port, "/pods").expect("GET /pods");
        assert_eq!(code, 200, "GET /pods: {body}");
        let list: Value = serde_json::from_str(&body).expect("/pods is JSON");
        list["items"]
            .as_array()?
            .iter()
            .find(|p| p["metadata"]["name"] == name)
            .cloned()
    }

    /// Poll `GET /pods` until pod `name` satisfies `pred`; panics with the last state otherwise.
    fn wait_pod(&self, name: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let pod = self.pod(name);
            if let Some(p) = &pod
                && pred(p)
            {
                return p.clone();
            }
            if Instant::now() > deadline {
                panic!(
                    "pod {name}: timed out waiting for {what}; last seen:\n{}",
                    pod.map(|p| serde_json::to_string_pretty(&p["status"]).unwrap_or_default())
                        .unwrap_or_else(|| "<absent>".into())
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// Check for `how_long` that pod `name` keeps satisfying `pred`.
    fn holds_for(&self, name: &str, what: &str, how_long: Duration, pred: impl Fn(&Value) -> bool) {
        let until = Instant::now() + how_long;
        while Instant::now() < until {
            let p = self.pod(name).expect("pod listed");
            assert!(
                pred(&p),
                "pod {name}: expected {what} to hold; status:\n{}",
                serde_json::to_string_pretty(&p["status"]).unwrap_or_default()
            );
            std::thread::sleep(POLL);
        }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        common::teardown(
            self.test,
            &self.stderr_path,
            &self.manifests,
            self.port,
            &mut self.agent,
            &self.tokens,
        );
    }
}

fn condition<'a>(pod: &'a Value, ty: &str) -> Option<&'a str> {
    pod["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == ty)?["status"]
        .as_str()
}

fn main_status(pod: &Value) -> &Value {
    pod["status"]["containerStatuses"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["name"] == "main"))
        .unwrap_or(&Value::Null)
}

/// A pod with one container `main`: a `/bin/sh` loop (exits on SIGTERM) with `token` as `$0`,
/// and the given probes (`readinessProbe`, `livenessProbe`, `startupProbe` keys).
fn pod(name: &str, token: &str, probes: Value) -> Value {
    let mut container = json!({
        "name": "main",
        "image": "busybox",
        "command": [
            "/bin/sh", "-c",
            "trap 'exit 0' TERM; while true; do sleep 1 & wait $!; done",
            token
        ],
    });
    if let (Some(c), Some(p)) = (container.as_object_mut(), probes.as_object()) {
        c.extend(p.clone());
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name },
        "spec": { "containers": [container], "terminationGracePeriodSeconds": 5 },
    })
}

/// An exec probe `/bin/sh -c <script>` with period 1 s and failure threshold `failures`.
fn exec_probe(script: &str, failures: u32) -> Value {
    json!({
        "exec": { "command": ["/bin/sh", "-c", script] },
        "periodSeconds": 1,
        "failureThreshold": failures,
    })
}

/// An HTTP server on 127.0.0.1 standing in for the container's health endpoint: answers every
/// request with the status code in `status`, counts requests, stops when dropped.
struct HealthServer {
    port: u16,
    status: Arc<AtomicU16>,
    requests: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl HealthServer {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind health server");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("addr").port();
        let status = Arc::new(AtomicU16::new(200));
        let requests = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, rq, sp) = (status.clone(), requests.clone(), stop.clone());
        std::thread::spawn(move || {
            while !sp.load(Ordering::Relaxed) {
                let mut conn = match listener.accept() {
                    Ok((c, _)) => c,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                    Err(_) => continue,
                };
                let _ = conn.set_nonblocking(false);
                let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                if !req.starts_with(b"GET /healthz ") {
                    continue;
                }
                rq.fetch_add(1, Ordering::SeqCst);
                let code = st.load(Ordering::SeqCst);
                let _ = write!(
                    conn,
                    "HTTP/1.1 {code} X\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
                );
            }
        });
        HealthServer {
            port,
            status,
            requests,
            stop,
        }
    }
}

impl Drop for HealthServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[test]
fn pod_whose_http_server_starts_failing_is_marked_unready_then_ready_again() {
    let server = HealthServer::start();
    let mut env = Env::start("readiness");
    let token = env.token("main");
    let name = format!("web-{NODE}");
    env.write_pod(
        "web.json",
        &pod(
            "web",
            &token,
            json!({ "readinessProbe": {
                "httpGet": { "host": "127.0.0.1", "port": server.port, "path": "/healthz" },
                "periodSeconds": 1,
                "failureThreshold": 1,
            }}),
        ),
    );

    let p = env.wait_pod(&name, "Running and Ready", |p| {
        p["status"]["phase"] == "Running" && condition(p, "Ready") == Some("True")
    });
    assert!(
        server.requests.load(Ordering::SeqCst) >= 1,
        "Ready before any probe reached the server: readiness must start False"
    );
    assert_eq!(main_status(&p)["ready"], true, "{p:#}");
    assert_eq!(condition(&p, "ContainersReady"), Some("True"));
    let pids = container_pids(&token);
    assert_eq!(pids.len(), 1, "one container process: {pids:?}");

    // The server starts failing: unready, but not restarted.
    server.status.store(503, Ordering::SeqCst);
    let p = env.wait_pod(&name, "Ready=False after 503s", |p| {
        condition(p, "Ready") == Some("False") && main_status(p)["ready"] == false
    });
    assert_eq!(condition(&p, "ContainersReady"), Some("False"));
    assert_eq!(p["status"]["phase"], "Running");
    assert_eq!(main_status(&p)["restartCount"], 0, "{p:#}");
    assert!(
        main_status(&p)["state"]["running"].is_object(),
        "readiness failures never kill: {p:#}"
    );
    assert_eq!(container_pids(&token), pids, "same container process");
    assert!(
        env.stderr()
            .contains("Readiness probe failed: HTTP probe failed with statuscode: 503"),
        "an Unhealthy event is recorded"
    );

    // It recovers: ready again.
    let before = server.requests.load(Ordering::SeqCst);
    server.status.store(200, Ordering::SeqCst);
    let p = env.wait_pod(&name, "Ready=True again", |p| {
        condition(p, "Ready") == Some("True") && main_status(p)["ready"] == true
    });
    assert!(server.requests.load(Ordering::SeqCst) > before);
    assert_eq!(main_status(&p)["restartCount"], 0, "{p:#}");

    // The kubelet's prober metrics, on the read-only port.
    let uid = p["metadata"]["uid"].as_str().expect("uid").to_string();
    let (code, metrics) = http_get(env.port, "/metrics").expect("GET /metrics");
    assert_eq!(code, 200, "{metrics}");
    let count = |result: &str| -> u64 {
        let prefix = format!(
            "prober_probe_total{{probe_type=\"Readiness\",result=\"{result}\",container=\"main\",pod=\"{name}\",namespace=\"default\",pod_uid=\"{uid}\"}} "
        );
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {prefix:?} in\n{metrics}"))
    };
    assert!(count("successful") >= 2, "{metrics}");
    assert!(count("failed") >= 1, "{metrics}");
    assert!(
        metrics.lines().any(|l| l.starts_with(&format!(
            "prober_probe_duration_seconds_count{{probe_type=\"Readiness\",container=\"main\",pod=\"{name}\",namespace=\"default\"}}"
        ))),
        "{metrics}"
    );
}

#[test]
fn pod_whose_liveness_probe_fails_is_restarted_with_restart_count_incremented() {
    let mut env = Env::start("liveness");
    let token = env.token("main");
    let sick = env.work.join("sick");
    let name = format!("live-{NODE}");
    env.write_pod(
        "live.json",
        &pod(
            "live",
            &token,
            json!({ "livenessProbe": exec_probe(&format!("test ! -e {}", sick.display()), 1) }),
        ),
    );
    env.wait_pod(&name, "Running", |p| {
        main_status(p)["state"]["running"].is_object() && main_status(p)["ready"] == true
    });
    // Healthy: probes pass and nothing restarts.
    env.holds_for(&name, "restartCount 0", Duration::from_secs(3), |p| {
        main_status(p)["restartCount"] == 0
    });
    let first = container_pids(&token);
    assert_eq!(first.len(), 1, "{first:?}");

    std::fs::write(&sick, b"").expect("make the liveness probe fail");
    // Wait until the first instance has been killed, then let the next one be healthy.
    let deadline = Instant::now() + DEADLINE;
    while container_pids(&token) == first {
        assert!(
            Instant::now() < deadline,
            "the container was not killed after its liveness probe failed"
        );
        std::thread::sleep(POLL);
    }
    std::fs::remove_file(&sick).expect("make the liveness probe pass again");
    let p = env.wait_pod(&name, "restartCount 1 and running again", |p| {
        let c = main_status(p);
        c["restartCount"] == 1 && c["state"]["running"].is_object()
    });
    assert!(
        main_status(&p)["lastState"]["terminated"].is_object(),
        "{p:#}"
    );
    let second = container_pids(&token);
    assert_eq!(second.len(), 1, "{second:?}");
    assert_ne!(second, first, "a new process");
    let err = env.stderr();
    assert!(err.contains("Liveness probe failed"), "Unhealthy event");
    assert!(
        err.contains("failed liveness probe"),
        "kill reason in the agent's log"
    );
    // The new instance is healthy: it stays.
    env.holds_for(&name, "restartCount stays 1", Duration::from_secs(3), |p| {
        main_status(p)["restartCount"] == 1
    });
}

#[test]
fn startup_probe_holds_liveness_back_until_it_succeeds() {
    let mut env = Env::start("startup");
    let token = env.token("main");
    let started = env.work.join("started");
    let calls = env.work.join("liveness-calls");
    let name = format!("slow-{NODE}");
    env.write_pod(
        "slow.json",
        &pod(
            "slow",
            &token,
            json!({
                "startupProbe": exec_probe(&format!("test -e {}", started.display()), 60),
                // Always fails, and leaves a trace each time it runs; three failures (2 s or
                // more) before the kill, so `started` shows long enough for the poll to see it.
                "livenessProbe": exec_probe(&format!("echo x >> {}; exit 1", calls.display()), 3),
            }),
        ),
    );
    env.wait_pod(&name, "Running", |p| {
        main_status(p)["state"]["running"].is_object()
    });
    // The startup probe fails for a while: the container is not started, and liveness (which
    // would kill it at once) does not run.
    env.holds_for(
        &name,
        "not started, not restarted",
        Duration::from_secs(4),
        |p| {
            let c = main_status(p);
            c["started"] == false && c["ready"] == false && c["restartCount"] == 0
        },
    );
    assert!(
        !calls.exists(),
        "the liveness probe ran before the startup probe succeeded"
    );

    std::fs::write(&started, b"").expect("let the startup probe pass");
    env.wait_pod(&name, "started", |p| main_status(p)["started"] == true);
    // Now liveness runs, fails, and the container is restarted.
    env.wait_pod(&name, "restarted by the liveness probe", |p| {
        main_status(p)["restartCount"].as_u64() >= Some(1)
    });
    assert!(calls.exists(), "the liveness probe ran once started");
    assert!(env.stderr().contains("failed liveness probe"));
}
