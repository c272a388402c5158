//! End-to-end tests of the `minimal_kubelet` binary on real host processes.
//!
//! Every test starts the real binary as a child process on its own temporary directories
//! (`--root-dir`, `--pod-log-dir`, `--pod-manifest-path`) and its own read-only port, drops
//! manifests into the directory (the re-list is set to 60 s, so inotify is what is tested), reads
//! state through `GET /pods`, and finds container processes by a unique token that is a whole
//! argument of their command line (`sh -c <script> <token>`: the token is `$0`).
//!
//! Every test cleans up through [`Env`]'s `Drop`, also when it fails: it deletes the manifests,
//! lets the agent stop the pods, kills whatever still carries one of the test's tokens, and
//! stops the agent.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

mod common;
use common::{cmdline_has, container_pids, free_port, http_get, procs_with_arg};

const BIN: &str = env!("CARGO_BIN_EXE_minimal_kubelet");
const NODE: &str = "e2e-node";
/// Generous deadline for anything that should happen "soon".
const DEADLINE: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);

static TOKEN_COUNTER: AtomicU32 = AtomicU32::new(0);

// ---------------------------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------------------------

/// One test's agent, directories and tokens; cleans everything up on drop.
struct Env {
    test: &'static str,
    _dir: tempfile::TempDir,
    manifests: PathBuf,
    root: PathBuf,
    logs: PathBuf,
    /// Scratch directory for files the containers write.
    work: PathBuf,
    stderr_path: PathBuf,
    port: u16,
    /// `--healthz-port` (0: disabled).
    healthz_port: u16,
    /// `--port`, the kubelet API (0: disabled).
    api_port: u16,
    /// Pass `--root-dir`, `--pod-log-dir` and `--pod-manifest-path` relative to the agent's
    /// working directory (the temp dir) instead of absolute.
    relative_dirs: bool,
    /// More flags for the agent (e.g. `--feature-gates`).
    extra_args: Vec<String>,
    /// A command the agent is started under (e.g. `prlimit --nofile=…`), which execs it.
    wrapper: Vec<String>,
    /// `RUST_LOG` of the agent (`info`).
    rust_log: &'static str,
    agent: Option<Child>,
    tokens: Vec<String>,
}

impl Env {
    fn new(test: &'static str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix(&format!("mk-e2e-{test}-"))
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
        Env {
            test,
            stderr_path: base.join("agent-stderr.log"),
            _dir: dir,
            manifests,
            root,
            logs,
            work,
            port: 0,
            healthz_port: 0,
            api_port: 0,
            relative_dirs: false,
            extra_args: Vec::new(),
            wrapper: Vec::new(),
            rust_log: "info",
            agent: None,
            tokens: Vec::new(),
        }
    }

    /// A fresh token, remembered for cleanup.
    fn token(&mut self, what: &str) -> String {
        let n = TOKEN_COUNTER.fetch_add(1, Ordering::Relaxed);
        let t = format!("e2e-{}-{what}-{}-{n}", self.test, std::process::id());
        self.tokens.push(t.clone());
        t
    }

    /// Serve the kubelet API (HTTPS, self-signed under the temp dir) on a free port to anyone:
    /// anonymous requests, every one allowed.
    fn open_api(&mut self) {
        self.api_port = free_port();
        let certs = self._dir.path().join("pki");
        self.extra_args.extend([
            "--anonymous-auth".into(),
            "--authorization-mode".into(),
            "AlwaysAllow".into(),
            "--authentication-token-webhook=false".into(),
            "--cert-dir".into(),
            certs.to_string_lossy().into_owned(),
        ]);
    }

    /// Start the agent (on a new free port) and wait until its read-only port answers and its
    /// kubelet API, when served, takes connections.
    fn start(&mut self) {
        assert!(self.agent.is_none(), "agent already running");
        self.port = free_port();
        let stderr = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.stderr_path)
            .expect("open stderr log");
        let base = self._dir.path();
        let dir_arg = |p: &Path| {
            if self.relative_dirs {
                p.strip_prefix(base)
                    .expect("under the temp dir")
                    .to_path_buf()
            } else {
                p.to_path_buf()
            }
        };
        let mut cmd = match self.wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        let child = cmd
            .current_dir(base)
            .arg("--root-dir")
            .arg(dir_arg(&self.root))
            .arg("--pod-log-dir")
            .arg(dir_arg(&self.logs))
            .arg("--pod-manifest-path")
            .arg(dir_arg(&self.manifests))
            .args(["--read-only-port", &self.port.to_string()])
            .args(["--address", "127.0.0.1"])
            .args(["--healthz-port", &self.healthz_port.to_string()])
            .args(["--port", &self.api_port.to_string()])
            .args(["--healthz-bind-address", "127.0.0.1"])
            .args(["--node-name", NODE])
            .args(["--file-check-frequency", "60s"])
            .args(["--eviction-hard", common::LOW_EVICTION_HARD])
            .args(&self.extra_args)
            .env("RUST_LOG", self.rust_log)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn minimal_kubelet");
        self.agent = Some(child);
        let deadline = Instant::now() + DEADLINE;
        loop {
            // The read-only port answers, and the kubelet API (when served) takes connections.
            let api_up = self.api_port == 0
                || std::net::TcpStream::connect(("127.0.0.1", self.api_port)).is_ok();
            if api_up && http_get(self.port, "/healthz").is_ok() {
                return;
            }
            if let Some(status) = self
                .agent
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.agent = None;
                panic!(
                    "minimal_kubelet exited during start-up ({status}); stderr:\n{}",
                    self.stderr()
                );
            }
            assert!(
                Instant::now() < deadline,
                "minimal_kubelet did not answer on port {} within {DEADLINE:?}; stderr:\n{}",
                self.port,
                self.stderr()
            );
            std::thread::sleep(POLL);
        }
    }

    /// Send SIGINT (Ctrl-C) to the agent and wait for it to exit.
    fn stop(&mut self) -> ExitStatus {
        let mut child = self.agent.take().expect("agent running");
        let pid = Pid::from_raw(i32::try_from(child.id()).expect("pid fits i32"));
        kill(pid, Signal::SIGINT).expect("SIGINT the agent");
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = child.try_wait().expect("wait for the agent") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the agent did not exit within {DEADLINE:?} of SIGINT");
            }
            std::thread::sleep(POLL);
        }
    }

    /// The agent's stderr so far, without ANSI escapes.
    fn stderr(&self) -> String {
        strip_ansi(&std::fs::read_to_string(&self.stderr_path).unwrap_or_default())
    }

    /// Write a manifest atomically (through a dot-file, which the source ignores).
    fn write_manifest(&self, file: &str, content: &[u8]) {
        let tmp = self.manifests.join(format!(".{file}.tmp"));
        std::fs::write(&tmp, content).expect("write manifest");
        std::fs::rename(&tmp, self.manifests.join(file)).expect("rename manifest");
    }

    fn write_pod(&self, file: &str, pod: &Value) {
        self.write_manifest(file, pod.to_string().as_bytes());
    }

    fn remove_manifest(&self, file: &str) {
        std::fs::remove_file(self.manifests.join(file)).expect("remove manifest");
    }

    /// `GET /pods` items.
    fn pods(&self) -> Vec<Value> {
        let (code, body) = http_get(self.port, "/pods").expect("GET /pods");
        assert_eq!(code, 200, "GET /pods: {body}");
        let list: Value = serde_json::from_str(&body).expect("/pods is JSON");
        assert_eq!(list["kind"], "PodList", "{body}");
        list["items"].as_array().cloned().unwrap_or_default()
    }

    fn pod(&self, name: &str) -> Option<Value> {
        self.pods()
            .into_iter()
            .find(|p| p["metadata"]["name"] == name)
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

    fn wait_running_ready(&self, name: &str) -> Value {
        self.wait_pod(name, "phase Running and Ready=True", |p| {
            p["status"]["phase"] == "Running" && condition(p, "Ready") == Some("True")
        })
    }

    fn wait_pod_gone(&self, name: &str) {
        wait_until(&format!("pod {name} to leave /pods"), || {
            self.pod(name).is_none().then_some(())
        });
    }

    /// Lines the agent wrote to stderr that mention `needle`.
    fn stderr_lines_with(&self, needle: &str) -> Vec<String> {
        self.stderr()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_string)
            .collect()
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

/// Poll `f` until it returns `Some`, for at most [`DEADLINE`].
fn wait_until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(POLL);
    }
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Wait until exactly one container process carries `token`; its pid.
fn wait_single_process(token: &str) -> i32 {
    wait_until(
        &format!("exactly one process with argument {token}"),
        || {
            let pids = container_pids(token);
            (pids.len() == 1).then(|| pids[0])
        },
    )
}

fn wait_process_gone(pid: i32, token: &str) {
    wait_until(&format!("process {pid} ({token}) to exit"), || {
        (!cmdline_has(pid, token)).then_some(())
    });
}

fn condition<'a>(pod: &'a Value, ty: &str) -> Option<&'a str> {
    pod["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == ty)?["status"]
        .as_str()
}

fn container_status<'a>(pod: &'a Value, list: &str, name: &str) -> &'a Value {
    pod["status"][list]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["name"] == name))
        .unwrap_or(&Value::Null)
}

fn main_status<'a>(pod: &'a Value, name: &str) -> &'a Value {
    container_status(pod, "containerStatuses", name)
}

/// A container running `script` under `/bin/sh -c`, with `token` as `$0`.
fn sh(name: &str, script: &str, token: &str) -> Value {
    json!({
        "name": name,
        "image": "busybox",
        "command": ["/bin/sh", "-c", script, token],
    })
}

/// A script that keeps running; on SIGTERM it runs `on_term` (then exits if `exit`).
fn looping(on_term: &str, exit: bool) -> String {
    let exit = if exit { "; exit 0" } else { "" };
    format!("trap '{on_term}{exit}' TERM; while true; do sleep 1 & wait $!; done")
}

/// A v1 Pod manifest.
fn pod(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name },
        "spec": spec,
    })
}

fn static_name(name: &str) -> String {
    format!("{name}-{NODE}")
}

fn read_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

// ---------------------------------------------------------------------------------------------
// 1. A manifest becomes a Running, Ready pod with a host process
// ---------------------------------------------------------------------------------------------

#[test]
fn manifest_dropped_in_directory_becomes_running_ready_pod_with_host_process() {
    let mut env = Env::new("ready");
    env.start();
    let token = env.token("main");
    // YAML on purpose (the other tests write JSON manifests).
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: ready\nspec:\n  containers:\n  - name: main\n    image: busybox\n    command: [\"/bin/sh\", \"-c\", \"echo hello; trap 'exit 0' TERM; while true; do sleep 1 & wait $!; done\", \"{token}\"]\n"
    );
    env.write_manifest("ready.yaml", yaml.as_bytes());

    let name = static_name("ready");
    let p = env.wait_running_ready(&name);
    for ty in [
        "PodReadyToStartContainers",
        "Initialized",
        "ContainersReady",
        "Ready",
        "PodScheduled",
    ] {
        assert_eq!(condition(&p, ty), Some("True"), "condition {ty}: {p:#}");
    }
    assert_eq!(p["metadata"]["namespace"], "default");
    assert_eq!(p["spec"]["nodeName"], NODE);
    assert_eq!(
        p["metadata"]["annotations"]["kubernetes.io/config.source"],
        "file"
    );
    let c = main_status(&p, "main");
    assert_eq!(c["ready"], true, "{c:#}");
    assert_eq!(c["started"], true, "{c:#}");
    assert_eq!(c["restartCount"], 0, "{c:#}");
    assert!(c["state"]["running"]["startedAt"].is_string(), "{c:#}");
    let pid = wait_single_process(&token);
    assert!(Path::new(&format!("/proc/{pid}")).exists());

    // Its output is in the pod log dir, in the CRI log format.
    let uid = p["metadata"]["uid"].as_str().expect("uid");
    let log = env
        .logs
        .join(format!("default_{name}_{uid}"))
        .join("main")
        .join("0.log");
    let line = wait_until(&format!("hello in {}", log.display()), || {
        read_lines(&log).into_iter().find(|l| l.ends_with("hello"))
    });
    let fields: Vec<&str> = line.splitn(4, ' ').collect();
    assert_eq!(fields.len(), 4, "{line:?}");
    assert!(
        fields[0].ends_with('Z') && fields[0].contains('T'),
        "{line:?}"
    );
    assert_eq!(&fields[1..], ["stdout", "F", "hello"], "{line:?}");
}

// ---------------------------------------------------------------------------------------------
// 1b. The evented PLEG (the default): exits come from runtime events, not the relist
// ---------------------------------------------------------------------------------------------

/// `GET /metrics` of the agent.
fn metrics(env: &Env) -> String {
    let (code, body) = http_get(env.port, "/metrics").expect("GET /metrics");
    assert_eq!(code, 200, "GET /metrics: {body}");
    body
}

#[test]
fn the_evented_pleg_gate_set_to_false_runs_the_relist_pleg() {
    let mut env = Env::new("relist");
    env.extra_args = vec!["--feature-gates".into(), "EventedPLEG=false".into()];
    env.start();
    let m = wait_until("a relist counted", || {
        let m = metrics(&env);
        common::metric(&m, common::RELISTS)
            .filter(|v| *v >= 1.0)
            .map(|_| m)
    });
    // The series exist for both PLEGs (as in the kubelet); only the evented one subscribes.
    assert_eq!(
        common::metric(&m, "kubelet_evented_pleg_connection_success_count_total").unwrap_or(0.0),
        0.0,
        "the evented PLEG runs although the gate is off:\n{m}"
    );
}

#[test]
fn evented_pleg_reports_a_failed_exit_and_restarts_a_crashed_container_without_relisting() {
    // No flag: the evented PLEG is the default.
    let mut env = Env::new("evented");
    env.start();
    // The event stream is up and the start-up relist is done: what is detected below comes
    // from events.
    let relists = wait_until("the evented PLEG subscribed and relisted once", || {
        common::evented_pleg_relists(&metrics(&env))
    });

    let (t_fail, t_crash) = (env.token("fail"), env.token("crash"));
    let marker = env.work.join("crashed-once");
    env.write_pod(
        "fails.json",
        &pod(
            "fails",
            json!({
                "restartPolicy": "Never",
                "containers": [sh("task", "sleep 1; exit 3", &t_fail)],
            }),
        ),
    );
    // Exits 1 on its first run, keeps running on the next.
    let crash_once = format!(
        "if [ -e {m} ]; then {l}; else touch {m}; exit 1; fi",
        m = marker.display(),
        l = looping("exit 0", false)
    );
    env.write_pod(
        "restarts.json",
        &pod(
            "restarts",
            json!({
                "restartPolicy": "Always",
                "terminationGracePeriodSeconds": 5,
                "containers": [sh("main", &crash_once, &t_crash)],
            }),
        ),
    );

    let p = env.wait_pod(&static_name("fails"), "phase Failed", |p| {
        p["status"]["phase"] == "Failed"
    });
    let c = main_status(&p, "task");
    assert_eq!(c["state"]["terminated"]["exitCode"], 3, "{c:#}");
    assert_eq!(c["state"]["terminated"]["reason"], "Error", "{c:#}");
    assert_eq!(c["restartCount"], 0, "{c:#}");
    assert_eq!(condition(&p, "Ready"), Some("False"), "{p:#}");

    let name = static_name("restarts");
    let p = env.wait_pod(&name, "restartCount 1 and running again", |p| {
        let c = main_status(p, "main");
        c["restartCount"] == 1 && c["state"]["running"].is_object()
    });
    let c = main_status(&p, "main");
    assert_eq!(c["lastState"]["terminated"]["exitCode"], 1, "{c:#}");
    assert_eq!(c["lastState"]["terminated"]["reason"], "Error", "{c:#}");
    let pid = wait_single_process(&t_crash);

    common::assert_seen_through_events(&metrics(&env), relists);

    // Removing the manifests stops and removes both pods.
    env.remove_manifest("restarts.json");
    env.remove_manifest("fails.json");
    env.wait_pod_gone(&name);
    env.wait_pod_gone(&static_name("fails"));
    wait_process_gone(pid, &t_crash);
    assert!(procs_with_arg(&t_fail).is_empty());
}

// ---------------------------------------------------------------------------------------------
// 2. SIGKILL → restart with restartCount 1 and exit code 137
// ---------------------------------------------------------------------------------------------

#[test]
fn container_killed_with_sigkill_is_restarted_with_exit_code_137() {
    let mut env = Env::new("sigkill");
    env.start();
    let token = env.token("main");
    env.write_pod(
        "killme.json",
        &pod(
            "killme",
            json!({ "containers": [sh("main", &looping("", true), &token)] }),
        ),
    );
    let name = static_name("killme");
    let before = env.wait_running_ready(&name);
    let old_id = main_status(&before, "main")["containerID"].clone();
    let old_pid = wait_single_process(&token);

    kill(Pid::from_raw(old_pid), Signal::SIGKILL).expect("SIGKILL the container");

    let p = env.wait_pod(&name, "restartCount 1 and running again", |p| {
        let c = main_status(p, "main");
        c["restartCount"] == 1 && c["state"]["running"].is_object()
    });
    let c = main_status(&p, "main");
    let term = &c["lastState"]["terminated"];
    assert_eq!(term["exitCode"], 137, "{c:#}");
    assert_eq!(term["reason"], "Error", "{c:#}");
    assert_eq!(term["containerID"], old_id, "{c:#}");
    assert_ne!(c["containerID"], old_id, "a new container: {c:#}");
    assert!(!cmdline_has(old_pid, &token), "old process still there");
    let new_pid = wait_single_process(&token);
    assert_ne!(new_pid, old_pid);
}

#[test]
fn crashing_container_is_restarted_at_once_then_backs_off_ten_seconds() {
    let mut env = Env::new("backoff");
    env.start();
    let token = env.token("crash");
    let runs = env.work.join("runs");
    env.write_pod(
        "crash.json",
        &pod(
            "crash",
            json!({ "containers": [sh("main", &format!("date +%s.%N >> {}; exit 1", runs.display()), &token)] }),
        ),
    );
    let name = static_name("crash");
    let p = env.wait_pod(&name, "CrashLoopBackOff after the first restart", |p| {
        let c = main_status(p, "main");
        c["restartCount"] == 1 && c["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    });
    let c = main_status(&p, "main");
    let msg = c["state"]["waiting"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(msg.contains("back-off 10s"), "{c:#}");
    assert_eq!(c["lastState"]["terminated"]["exitCode"], 1, "{c:#}");
    let times = wait_until("a third run", || {
        let t: Vec<f64> = read_lines(&runs)
            .iter()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        (t.len() >= 3).then_some(t)
    });
    let (first_gap, second_gap) = (times[1] - times[0], times[2] - times[1]);
    assert!(
        first_gap < 5.0,
        "the first restart is immediate; took {first_gap:.2} s"
    );
    assert!(
        (9.5..20.0).contains(&second_gap),
        "the second restart waits the 10 s back-off; took {second_gap:.2} s"
    );
}

#[test]
fn container_whose_command_does_not_exist_reports_start_error_and_backs_off() {
    let mut env = Env::new("noexec");
    env.start();
    let missing = env.work.join("no-such-program");
    env.write_pod(
        "noexec.json",
        &pod(
            "noexec",
            json!({ "containers": [{ "name": "main", "image": "busybox", "command": [missing] }] }),
        ),
    );
    let p = env.wait_pod(
        &static_name("noexec"),
        "a StartError in CrashLoopBackOff",
        |p| {
            let c = main_status(p, "main");
            c["lastState"]["terminated"]["reason"] == "StartError"
                && c["state"]["waiting"]["reason"] == "CrashLoopBackOff"
        },
    );
    let c = main_status(&p, "main");
    assert_eq!(c["lastState"]["terminated"]["exitCode"], 128, "{c:#}");
    let msg = c["lastState"]["terminated"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        msg.contains("no-such-program"),
        "the message names the program: {c:#}"
    );
    assert_eq!(p["status"]["phase"], "Running", "{p:#}");
    assert_eq!(c["ready"], false, "{c:#}");
    assert_eq!(condition(&p, "Ready"), Some("False"));
}

// ---------------------------------------------------------------------------------------------
// 3. Restart policies, init containers, sidecars
// ---------------------------------------------------------------------------------------------

#[test]
fn on_failure_pod_whose_container_exits_zero_succeeds_without_restart() {
    let mut env = Env::new("onfailure");
    env.start();
    let token = env.token("task");
    let runs = env.work.join("runs");
    env.write_pod(
        "once.json",
        &pod(
            "once",
            json!({
                "restartPolicy": "OnFailure",
                "containers": [sh("task", &format!("echo ran >> {}; exit 0", runs.display()), &token)],
            }),
        ),
    );
    let name = static_name("once");
    env.wait_pod(&name, "phase Succeeded", |p| {
        p["status"]["phase"] == "Succeeded"
    });
    // Give a wrongful restart time to happen (the PLEG relists every second).
    std::thread::sleep(Duration::from_millis(2500));
    let p = env.pod(&name).expect("pod still listed");
    assert_eq!(p["status"]["phase"], "Succeeded", "{p:#}");
    let c = main_status(&p, "task");
    assert_eq!(c["restartCount"], 0, "{c:#}");
    assert_eq!(c["state"]["terminated"]["exitCode"], 0, "{c:#}");
    assert_eq!(c["state"]["terminated"]["reason"], "Completed", "{c:#}");
    assert_eq!(
        read_lines(&runs),
        vec!["ran"],
        "the container ran exactly once"
    );
    assert!(container_pids(&token).is_empty());
}

#[test]
fn never_pod_ends_failed_on_exit_one_and_succeeded_on_exit_zero() {
    let mut env = Env::new("never");
    env.start();
    let (t_fail, t_ok) = (env.token("fail"), env.token("ok"));
    let (runs_fail, runs_ok) = (env.work.join("runs-fail"), env.work.join("runs-ok"));
    for (name, token, runs, code) in [
        ("never-fail", &t_fail, &runs_fail, 1),
        ("never-ok", &t_ok, &runs_ok, 0),
    ] {
        env.write_pod(
            &format!("{name}.json"),
            &pod(
                name,
                json!({
                    "restartPolicy": "Never",
                    "containers": [sh("task", &format!("echo ran >> {}; exit {code}", runs.display()), token)],
                }),
            ),
        );
    }
    env.wait_pod(&static_name("never-fail"), "phase Failed", |p| {
        p["status"]["phase"] == "Failed"
    });
    env.wait_pod(&static_name("never-ok"), "phase Succeeded", |p| {
        p["status"]["phase"] == "Succeeded"
    });
    std::thread::sleep(Duration::from_millis(2500));

    let p = env.pod(&static_name("never-fail")).expect("listed");
    assert_eq!(p["status"]["phase"], "Failed", "{p:#}");
    let c = main_status(&p, "task");
    assert_eq!(c["restartCount"], 0, "{c:#}");
    assert_eq!(c["state"]["terminated"]["exitCode"], 1, "{c:#}");
    assert_eq!(c["state"]["terminated"]["reason"], "Error", "{c:#}");
    assert_eq!(read_lines(&runs_fail), vec!["ran"]);

    let p = env.pod(&static_name("never-ok")).expect("listed");
    assert_eq!(p["status"]["phase"], "Succeeded", "{p:#}");
    let c = main_status(&p, "task");
    assert_eq!(c["restartCount"], 0, "{c:#}");
    assert_eq!(c["state"]["terminated"]["exitCode"], 0, "{c:#}");
    assert_eq!(read_lines(&runs_ok), vec!["ran"]);
}

#[test]
fn init_containers_run_in_order_before_the_main_container() {
    let mut env = Env::new("init");
    env.start();
    let order = env.work.join("order");
    let o = order.display().to_string();
    let (t1, t2, tm) = (env.token("init1"), env.token("init2"), env.token("main"));
    env.write_pod(
        "init.json",
        &pod(
            "init",
            json!({
                "initContainers": [
                    // The first one is slower, so that running them concurrently would show.
                    sh("init1", &format!("sleep 0.5; echo init1 >> {o}"), &t1),
                    sh("init2", &format!("echo init2 >> {o}"), &t2),
                ],
                "containers": [sh("main", &format!("echo main >> {o}; {}", looping("", true)), &tm)],
            }),
        ),
    );
    let name = static_name("init");
    let p = env.wait_running_ready(&name);
    assert_eq!(condition(&p, "Initialized"), Some("True"));
    for init in ["init1", "init2"] {
        let c = container_status(&p, "initContainerStatuses", init);
        assert_eq!(c["state"]["terminated"]["exitCode"], 0, "{c:#}");
        assert_eq!(c["state"]["terminated"]["reason"], "Completed", "{c:#}");
        assert_eq!(c["restartCount"], 0, "{c:#}");
    }
    wait_single_process(&tm);
    assert_eq!(read_lines(&order), vec!["init1", "init2", "main"]);
}

#[test]
fn sidecar_starts_before_and_stops_after_the_main_container() {
    let mut env = Env::new("sidecar");
    env.start();
    let events = env.work.join("events");
    let e = events.display().to_string();
    let (ts, tm) = (env.token("sidecar"), env.token("main"));
    let mut sidecar = sh(
        "sidecar",
        &format!(
            "echo sidecar started >> {e}; {}",
            looping(&format!("echo sidecar stopped >> {e}"), true)
        ),
        &ts,
    );
    sidecar["restartPolicy"] = json!("Always");
    let main = sh(
        "main",
        &format!(
            "echo main started >> {e}; {}",
            // The small sleep makes a concurrent stop of the sidecar observable.
            looping(&format!("sleep 1; echo main stopped >> {e}"), true)
        ),
        &tm,
    );
    env.write_pod(
        "sidecar.json",
        &pod(
            "sidecar",
            json!({
                "terminationGracePeriodSeconds": 15,
                "initContainers": [sidecar],
                "containers": [main],
            }),
        ),
    );
    let name = static_name("sidecar");
    let p = env.wait_running_ready(&name);
    let s = container_status(&p, "initContainerStatuses", "sidecar");
    assert!(s["state"]["running"].is_object(), "sidecar running: {s:#}");
    assert_eq!(s["started"], true, "{s:#}");
    let (sidecar_pid, main_pid) = (wait_single_process(&ts), wait_single_process(&tm));
    assert_eq!(read_lines(&events), vec!["sidecar started", "main started"]);

    env.remove_manifest("sidecar.json");
    wait_process_gone(main_pid, &tm);
    wait_process_gone(sidecar_pid, &ts);
    env.wait_pod_gone(&name);
    assert_eq!(
        read_lines(&events),
        vec![
            "sidecar started",
            "main started",
            "main stopped",
            "sidecar stopped"
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// 4. Deleting and editing manifests
// ---------------------------------------------------------------------------------------------

#[test]
fn deleting_manifest_sends_sigterm_and_sigkill_only_after_the_grace_period() {
    let mut env = Env::new("grace");
    env.start();
    let (ts, tp) = (env.token("stubborn"), env.token("polite"));
    let (stubborn_mark, polite_mark) = (env.work.join("stubborn"), env.work.join("polite"));
    // Ignores SIGTERM (records it, keeps running): only SIGKILL after 3 s ends it.
    env.write_pod(
        "stubborn.json",
        &pod(
            "stubborn",
            json!({
                "terminationGracePeriodSeconds": 3,
                "containers": [sh("main", &looping(&format!("echo term >> {}", stubborn_mark.display()), false), &ts)],
            }),
        ),
    );
    // Exits on SIGTERM: gone long before its (long) grace period.
    env.write_pod(
        "polite.json",
        &pod(
            "polite",
            json!({
                "terminationGracePeriodSeconds": 30,
                "containers": [sh("main", &looping(&format!("echo term >> {}", polite_mark.display()), true), &tp)],
            }),
        ),
    );
    env.wait_running_ready(&static_name("stubborn"));
    env.wait_running_ready(&static_name("polite"));
    let (stubborn_pid, polite_pid) = (wait_single_process(&ts), wait_single_process(&tp));

    let t0 = Instant::now();
    env.remove_manifest("stubborn.json");
    env.remove_manifest("polite.json");
    let (mut stubborn_gone, mut polite_gone) = (None, None);
    while (stubborn_gone.is_none() || polite_gone.is_none()) && t0.elapsed() < DEADLINE {
        if stubborn_gone.is_none() && !cmdline_has(stubborn_pid, &ts) {
            stubborn_gone = Some(t0.elapsed());
        }
        if polite_gone.is_none() && !cmdline_has(polite_pid, &tp) {
            polite_gone = Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let stubborn_gone = stubborn_gone.expect("the process ignoring SIGTERM was never killed");
    let polite_gone = polite_gone.expect("the process exiting on SIGTERM never exited");

    assert_eq!(read_lines(&stubborn_mark), vec!["term"], "SIGTERM first");
    assert_eq!(read_lines(&polite_mark), vec!["term"], "SIGTERM first");
    // SIGKILL only after the 3 s grace period (20 ms polling tolerance), but not much later.
    assert!(
        stubborn_gone >= Duration::from_millis(2950),
        "killed after {stubborn_gone:?}, before the 3 s grace period"
    );
    assert!(
        stubborn_gone < Duration::from_secs(10),
        "killed only after {stubborn_gone:?}"
    );
    assert!(
        polite_gone < Duration::from_secs(5),
        "a process exiting on SIGTERM took {polite_gone:?}"
    );
    env.wait_pod_gone(&static_name("stubborn"));
    env.wait_pod_gone(&static_name("polite"));
}

#[test]
fn zero_grace_period_still_sends_sigterm_and_waits_the_two_second_minimum() {
    let mut env = Env::new("zerograce");
    env.start();
    let token = env.token("main");
    let mark = env.work.join("term");
    env.write_pod(
        "zero.json",
        &pod(
            "zero",
            json!({
                "terminationGracePeriodSeconds": 0,
                "containers": [sh("main", &looping(&format!("echo term >> {}", mark.display()), false), &token)],
            }),
        ),
    );
    env.wait_running_ready(&static_name("zero"));
    let pid = wait_single_process(&token);
    let t0 = Instant::now();
    env.remove_manifest("zero.json");
    wait_process_gone(pid, &token);
    let gone = t0.elapsed();
    assert_eq!(read_lines(&mark), vec!["term"], "SIGTERM first");
    // The kubelet never gives the runtime less than 2 s (`minimumGracePeriodInSeconds`).
    assert!(
        gone >= Duration::from_millis(1950),
        "killed after {gone:?}, before the 2 s minimum"
    );
    assert!(gone < Duration::from_secs(10), "killed only after {gone:?}");
    env.wait_pod_gone(&static_name("zero"));
}

#[test]
fn editing_manifest_replaces_the_pod() {
    let mut env = Env::new("edit");
    env.start();
    let (t_old, t_new) = (env.token("old"), env.token("new"));
    let name = static_name("edit");
    env.write_pod(
        "edit.json",
        &pod(
            "edit",
            json!({ "containers": [sh("main", &looping("", true), &t_old)] }),
        ),
    );
    let before = env.wait_running_ready(&name);
    let old_pid = wait_single_process(&t_old);

    env.write_pod(
        "edit.json",
        &pod(
            "edit",
            json!({ "containers": [sh("main", &looping("", true), &t_new)] }),
        ),
    );
    let after = env.wait_pod(&name, "the edited command running and ready", |p| {
        p["spec"]["containers"][0]["command"][3] == t_new.as_str()
            && p["status"]["phase"] == "Running"
            && condition(p, "Ready") == Some("True")
    });
    wait_process_gone(old_pid, &t_old);
    let new_pid = wait_single_process(&t_new);
    assert_ne!(new_pid, old_pid);
    assert!(container_pids(&t_old).is_empty(), "old process still there");
    assert_ne!(
        after["metadata"]["uid"], before["metadata"]["uid"],
        "an edited manifest is a new pod"
    );
    assert_eq!(main_status(&after, "main")["restartCount"], 0);
    assert_eq!(env.pods().len(), 1, "only the new pod is listed");
}

// ---------------------------------------------------------------------------------------------
// 5. Agent restart adopts running containers
// ---------------------------------------------------------------------------------------------

/// An exec'd command (here an exec liveness probe) whose agent is killed with SIGKILL belongs
/// to no session any more: the next agent kills it at start, and leaves the container alone.
#[test]
fn commands_execd_by_a_killed_agent_are_killed_by_the_next_one() {
    let mut env = Env::new("stale-exec");
    env.open_api();
    env.start();
    let token = env.token("main");
    let probe_token = env.token("probe");
    let once = env.work.join("probed-once");
    let mut container = sh("main", &looping("", true), &token);
    // The first probe hangs in `sleep` (its timeout is long); later ones pass at once.
    container["livenessProbe"] = json!({
        "exec": { "command": ["/bin/sh", "-c", format!(
            "test -e {o} && exit 0; touch {o}; sleep 300", o = once.display()
        ), probe_token] },
        "periodSeconds": 1,
        "timeoutSeconds": 600,
    });
    env.write_pod(
        "execd.json",
        &pod("execd", json!({ "containers": [container] })),
    );
    let name = static_name("execd");
    env.wait_running_ready(&name);
    let pid = wait_single_process(&token);
    wait_until("the hanging probe command", || {
        (!container_pids(&probe_token).is_empty()).then_some(())
    });
    // 20 commands through the kubelet API's `/run` (each a session of a client), hanging.
    let hang = env.work.join("hang.sh");
    std::fs::write(&hang, "while :; do sleep 1; done\n").expect("write the script");
    let run_token = env.token("run");
    let url = format!(
        "https://127.0.0.1:{}/run/default/{name}/main?cmd=/bin/sh%20{}%20{run_token}",
        env.api_port,
        hang.display()
    );
    let mut clients: Vec<Child> = (0..20)
        .map(|_| {
            Command::new("curl")
                .args(["-sk", "-o", "/dev/null", "-X", "POST", &url])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("curl")
        })
        .collect();
    wait_until("20 commands run through /run", || {
        (container_pids(&run_token).len() == 20).then_some(())
    });

    let mut agent = env.agent.take().expect("agent running");
    agent.kill().expect("SIGKILL the agent");
    agent.wait().expect("reap the agent");
    for c in &mut clients {
        let _ = c.kill();
        let _ = c.wait();
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !container_pids(&probe_token).is_empty(),
        "the probe command died with the agent: nothing to clean up"
    );
    assert_eq!(
        container_pids(&run_token).len(),
        20,
        "the /run commands died with the agent: nothing to clean up"
    );

    env.start();
    wait_until("the stale exec'd commands killed", || {
        (container_pids(&probe_token).is_empty() && container_pids(&run_token).is_empty())
            .then_some(())
    });
    assert!(
        !env.stderr_lines_with("exec'd by a previous agent")
            .is_empty(),
        "one warning says so"
    );
    let after = env.wait_running_ready(&name);
    assert_eq!(main_status(&after, "main")["restartCount"], 0, "{after:#}");
    assert_eq!(
        container_pids(&token),
        vec![pid],
        "the container was touched"
    );
}

#[test]
fn restarting_the_agent_leaves_running_containers_untouched() {
    let mut env = Env::new("restart");
    env.start();
    let token = env.token("main");
    env.write_pod(
        "survivor.json",
        &pod(
            "survivor",
            json!({ "containers": [sh("main", &looping("", true), &token)] }),
        ),
    );
    let name = static_name("survivor");
    let before = env.wait_running_ready(&name);
    let pid = wait_single_process(&token);
    let cid = main_status(&before, "main")["containerID"].clone();

    let status = env.stop();
    assert!(status.success(), "agent exit on SIGINT: {status}");
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        cmdline_has(pid, &token),
        "the container died with the agent"
    );

    env.start();
    let after = env.wait_running_ready(&name);
    let c = main_status(&after, "main");
    assert_eq!(c["containerID"], cid, "the same container: {c:#}");
    assert_eq!(c["restartCount"], 0, "{c:#}");
    // Give a wrongful restart time to happen (the PLEG relists every second).
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(
        container_pids(&token),
        vec![pid],
        "same pid, no new process"
    );
    let again = env.pod(&name).expect("listed");
    let c = main_status(&again, "main");
    assert_eq!(c["containerID"], cid, "{c:#}");
    assert_eq!(c["restartCount"], 0, "{c:#}");
    assert_eq!(again["status"]["phase"], "Running");
}

#[test]
fn pod_whose_manifest_was_deleted_while_the_agent_was_down_is_stopped_on_restart() {
    let mut env = Env::new("orphan");
    let (t_keep, t_gone) = (env.token("keep"), env.token("gone"));
    // Manifests present before the agent starts: the initial listing, not inotify.
    for (name, token) in [("keep", &t_keep), ("gone", &t_gone)] {
        env.write_pod(
            &format!("{name}.json"),
            &pod(
                name,
                json!({ "containers": [sh("main", &looping("", true), token)] }),
            ),
        );
    }
    env.start();
    env.wait_running_ready(&static_name("keep"));
    env.wait_running_ready(&static_name("gone"));
    let (keep_pid, gone_pid) = (wait_single_process(&t_keep), wait_single_process(&t_gone));

    assert!(env.stop().success());
    env.remove_manifest("gone.json");
    env.start();
    wait_process_gone(gone_pid, &t_gone);
    env.wait_pod_gone(&static_name("gone"));
    let keep = env.wait_running_ready(&static_name("keep"));
    assert_eq!(main_status(&keep, "main")["restartCount"], 0);
    assert_eq!(
        container_pids(&t_keep),
        vec![keep_pid],
        "the kept pod is untouched"
    );
    assert!(container_pids(&t_gone).is_empty());
}

#[test]
fn completed_pod_is_not_run_again_after_agent_restart() {
    let mut env = Env::new("donerestart");
    env.start();
    let token = env.token("task");
    let runs = env.work.join("runs");
    env.write_pod(
        "done.json",
        &pod(
            "done",
            json!({
                "restartPolicy": "OnFailure",
                "containers": [sh("task", &format!("echo ran >> {}; exit 0", runs.display()), &token)],
            }),
        ),
    );
    let name = static_name("done");
    env.wait_pod(&name, "phase Succeeded", |p| {
        p["status"]["phase"] == "Succeeded"
    });
    assert!(env.stop().success());
    env.start();
    env.wait_pod(&name, "phase Succeeded after the restart", |p| {
        p["status"]["phase"] == "Succeeded"
    });
    std::thread::sleep(Duration::from_millis(2500));
    let p = env.pod(&name).expect("listed");
    assert_eq!(p["status"]["phase"], "Succeeded", "{p:#}");
    let c = main_status(&p, "task");
    assert_eq!(c["restartCount"], 0, "{c:#}");
    assert_eq!(c["state"]["terminated"]["exitCode"], 0, "{c:#}");
    assert_eq!(
        read_lines(&runs),
        vec!["ran"],
        "the container ran exactly once"
    );
}

// ---------------------------------------------------------------------------------------------
// 6. Malformed manifests
// ---------------------------------------------------------------------------------------------

/// Starts a valid pod, drops `bad` as `file`, expects a stderr line naming the file and
/// containing `expect`, and checks the valid pod kept running untouched.
fn malformed_manifest_case(test: &'static str, file: &str, bad: &[u8], expect: &str) {
    let mut env = Env::new(test);
    env.start();
    let token = env.token("good");
    env.write_pod(
        "good.json",
        &pod(
            "good",
            json!({ "containers": [sh("main", &looping("", true), &token)] }),
        ),
    );
    let name = static_name("good");
    env.wait_running_ready(&name);
    let pid = wait_single_process(&token);

    env.write_manifest(file, bad);
    let path = env.manifests.join(file).display().to_string();
    let lines = wait_until(
        &format!("an error naming {path} with {expect:?} on stderr"),
        || {
            let l: Vec<String> = env
                .stderr_lines_with(&path)
                .into_iter()
                .filter(|l| l.contains(expect))
                .collect();
            (!l.is_empty()).then_some(l)
        },
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("WARN") || l.contains("ERROR")),
        "the error is logged as a warning or error: {lines:#?}"
    );

    // A moment for any wrongful effect on the other pod to show.
    std::thread::sleep(Duration::from_millis(1500));
    let pods = env.pods();
    let names: Vec<&Value> = pods.iter().map(|p| &p["metadata"]["name"]).collect();
    assert_eq!(names, vec![&json!(name)], "only the valid pod is listed");
    let p = env.pod(&name).expect("valid pod listed");
    assert_eq!(p["status"]["phase"], "Running");
    assert_eq!(main_status(&p, "main")["restartCount"], 0);
    assert_eq!(
        container_pids(&token),
        vec![pid],
        "the valid pod's process is untouched"
    );
    assert!(
        env.agent
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None))),
        "the agent keeps running"
    );
}

#[test]
fn manifest_with_bad_yaml_is_reported_and_other_pods_keep_running() {
    malformed_manifest_case(
        "badyaml",
        "bad-yaml.yaml",
        b"apiVersion: v1\nkind: Pod\nmetadata:\n  name: [unclosed\n  spec: {\n",
        "decoding static pod manifest",
    );
}

#[test]
fn manifest_without_name_is_reported_and_other_pods_keep_running() {
    let bad = pod(
        "placeholder",
        json!({ "containers": [{ "name": "c", "image": "busybox", "command": ["true"] }] }),
    );
    let mut bad = bad;
    bad["metadata"] = json!({});
    malformed_manifest_case(
        "noname",
        "no-name.json",
        bad.to_string().as_bytes(),
        "name is needed for the pod",
    );
}

#[test]
fn manifest_with_duplicate_container_names_is_reported_and_other_pods_keep_running() {
    let bad = pod(
        "dup",
        json!({ "containers": [
            { "name": "same", "image": "busybox", "command": ["sleep", "1000"] },
            { "name": "same", "image": "busybox", "command": ["sleep", "1001"] },
        ] }),
    );
    malformed_manifest_case(
        "dupnames",
        "dup.json",
        bad.to_string().as_bytes(),
        "Duplicate value: \"same\"",
    );
}

#[test]
fn manifest_of_20_mib_is_reported_and_other_pods_keep_running() {
    // A valid pod followed by 20 MiB of YAML comments: only the size is wrong.
    let mut bad = String::from(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: huge\nspec:\n  containers:\n  - name: c\n    image: busybox\n    command: [\"sleep\", \"1000\"]\n",
    );
    let line = format!("#{}\n", "x".repeat(1023));
    while bad.len() < 20 * 1024 * 1024 {
        bad.push_str(&line);
    }
    malformed_manifest_case(
        "huge",
        "huge.yaml",
        bad.as_bytes(),
        "exceeds the maximum size",
    );
}

// ---------------------------------------------------------------------------------------------
// 7. Health
// ---------------------------------------------------------------------------------------------

#[test]
fn log_links_point_at_each_containers_current_log_and_go_with_the_pod() {
    let mut env = Env::new("loglinks");
    env.start();
    let token = env.token("link");
    env.write_pod(
        "linked.json",
        &pod(
            "linked",
            json!({
                "restartPolicy": "Always",
                "terminationGracePeriodSeconds": 2,
                "containers": [sh("app", &format!("echo hi; {}", looping("exit 0", false)), &token)],
            }),
        ),
    );
    let name = static_name("linked");
    let p = env.wait_running_ready(&name);
    let id = main_status(&p, "app")["containerID"]
        .as_str()
        .expect("containerID")
        .split("://")
        .nth(1)
        .expect("scheme")
        .to_string();
    // --pod-log-dir is <tmp>/logs, so the links live in <tmp>/containers.
    let links = env.logs.parent().expect("parent").join("containers");
    let link = links.join(format!("{name}_default_app-{id}.log"));
    let target = wait_until(&format!("{} to exist", link.display()), || {
        std::fs::read_link(&link).ok()
    });
    let uid = p["metadata"]["uid"].as_str().expect("uid");
    assert_eq!(
        target,
        env.logs
            .join(format!("default_{name}_{uid}"))
            .join("app")
            .join("0.log")
    );
    assert!(
        std::fs::read_to_string(&link)
            .unwrap_or_default()
            .contains(" F hi"),
        "the link reads the container's log"
    );
    env.remove_manifest("linked.json");
    wait_until("the link to go with the pod", || {
        (!link.exists() && std::fs::symlink_metadata(&link).is_err()).then_some(())
    });
}

#[test]
fn json_logs_are_one_object_per_line_and_the_startup_line_names_runtime_pleg_and_listeners() {
    let mut env = Env::new("jsonlog");
    env.healthz_port = free_port();
    env.api_port = free_port();
    env.extra_args = vec!["--log-format".into(), "json".into()];
    env.rust_log = "info,kubelet_core=debug,kubelet_process=debug";
    env.start();
    let line = wait_until("the start-up line", || {
        env.stderr()
            .lines()
            .find(|l| l.contains("minimal_kubelet running"))
            .map(str::to_string)
    });
    let stderr = env.stderr();
    assert!(
        !stderr.contains('\u{1b}'),
        "colour codes in the log:\n{stderr}"
    );
    for l in stderr.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        assert!(v["level"].is_string() && v["timestamp"].is_string(), "{l}");
    }
    let v: Value = serde_json::from_str(&line).expect("JSON");
    let f = &v["fields"];
    assert_eq!(f["runtime"], "process (built in)", "{line}");
    assert!(
        f["pleg"].as_str().unwrap_or("").starts_with("evented"),
        "{line}"
    );
    let listening = f["listening"].as_str().unwrap_or("");
    for want in [
        format!("kubelet API https://127.0.0.1:{}", env.api_port),
        format!("read-only http://127.0.0.1:{}", env.port),
        format!("healthz http://127.0.0.1:{}", env.healthz_port),
    ] {
        assert!(listening.contains(&want), "{want} missing: {line}");
    }

    // A pod's log lines carry the kubelet's structured keys: `podUID`, `containerID`.
    let token = env.token("json");
    env.write_pod(
        "json.json",
        &pod(
            "json",
            json!({ "containers": [{ "name": "main", "image": "busybox", "command": ["/bin/sh", "-c", "sleep 1000", &token] }] }),
        ),
    );
    let p = env.wait_running_ready(&static_name("json"));
    let uid = p["metadata"]["uid"].as_str().expect("uid").to_string();
    let container_id = main_status(&p, "main")["containerID"]
        .as_str()
        .and_then(|id| id.split_once("://"))
        .map(|(_, id)| id.to_string())
        .expect("container id");
    let fields_with = |key: &str, value: &str| {
        env.stderr()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .any(|v| v["fields"][key] == value)
    };
    wait_until("a log line with the pod's podUID", || {
        fields_with("podUID", &uid).then_some(())
    });
    wait_until("a log line with the container's containerID", || {
        fields_with("containerID", &container_id).then_some(())
    });
    let stderr = env.stderr();
    for old in ["\"pod_uid\"", "\"container_id\""] {
        assert!(!stderr.contains(old), "{old} in the log:\n{stderr}");
    }

    // The node's conditions (eviction's pressure conditions) are logged once each, when they
    // first appear, and not again while they stay the same.
    let changes = |ty: &str| {
        env.stderr()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| {
                v["fields"]["message"] == "node condition changed" && v["fields"]["condition"] == ty
            })
            .count()
    };
    wait_until("MemoryPressure logged as a node condition", || {
        (changes("MemoryPressure") > 0).then_some(())
    });
    std::thread::sleep(Duration::from_secs(3));
    for ty in ["MemoryPressure", "DiskPressure", "PIDPressure"] {
        assert_eq!(changes(ty), 1, "{ty}:\n{}", env.stderr());
    }
}

#[test]
fn an_unknown_log_format_is_a_startup_error_naming_the_accepted_values() {
    let out = Command::new(BIN)
        .args(["--log-format", "xml", "--port", "0", "--healthz-port", "0"])
        .output()
        .expect("run minimal_kubelet");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("xml") && err.contains("text") && err.contains("json"),
        "{err}"
    );
}

#[test]
fn healthz_returns_200_ok_on_the_read_only_and_healthz_ports() {
    let mut env = Env::new("healthz");
    let healthz_port = free_port();
    env.healthz_port = healthz_port;
    env.start();
    for port in [env.port, healthz_port] {
        let (code, body) = wait_until(&format!("GET /healthz on {port} to answer 200"), || {
            http_get(port, "/healthz").ok().filter(|(c, _)| *c == 200)
        });
        assert_eq!((code, body.as_str()), (200, "ok"));
    }
    // /pods is served on the read-only port only.
    assert_eq!(http_get(env.port, "/pods").expect("GET /pods").0, 200);
    assert_eq!(http_get(healthz_port, "/pods").expect("GET /pods").0, 404);
}

// ---------------------------------------------------------------------------------------------
// Relative directories
// ---------------------------------------------------------------------------------------------

/// Relative `--root-dir` and `--pod-log-dir` work: the shims run with `/` as their working
/// directory, so the runtime and the engine resolve every directory before handing it on.
#[test]
fn relative_root_dir_runs_containers() {
    let mut env = Env::new("reldirs");
    env.relative_dirs = true;
    env.start();
    let token = env.token("main");
    env.write_pod(
        "rel.json",
        &pod(
            "rel",
            json!({ "containers": [sh("main", &looping("", true), &token)] }),
        ),
    );
    let p = env.wait_running_ready(&static_name("rel"));
    assert_eq!(main_status(&p, "main")["restartCount"], 0, "{p:#}");
    wait_single_process(&token);
}

// ---------------------------------------------------------------------------------------------
// Root only: cgroup memory limits
// ---------------------------------------------------------------------------------------------

/// True if root-only tests should run; prints a skip line (or fails, when
/// `KUBELET_SDK_REQUIRE_ROOT=1`) otherwise.
fn root_or_skip(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var("KUBELET_SDK_REQUIRE_ROOT").as_deref() != Ok("1"),
        "{test}: KUBELET_SDK_REQUIRE_ROOT=1 but not running as root"
    );
    println!("SKIPPED {test}: needs root (set KUBELET_SDK_REQUIRE_ROOT=1 to make this a failure)");
    false
}

/// A cgroup mount: its mount point and the root of the hierarchy it shows.
type Mount = (PathBuf, String);

/// Mount points of cgroup hierarchies: v1 by controller, and the v2 mount.
fn cgroup_mounts() -> (BTreeMap<String, Mount>, Option<Mount>) {
    let mut v1 = BTreeMap::new();
    let mut v2 = None;
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for line in info.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        let pre: Vec<&str> = pre.split_whitespace().collect();
        let post: Vec<&str> = post.split_whitespace().collect();
        let (Some(root), Some(mp), Some(fstype)) = (pre.get(3), pre.get(4), post.first()) else {
            continue;
        };
        match *fstype {
            "cgroup2" => v2 = Some((PathBuf::from(mp), root.to_string())),
            "cgroup" => {
                for opt in post.get(2).copied().unwrap_or("").split(',') {
                    v1.insert(opt.to_string(), (PathBuf::from(mp), root.to_string()));
                }
            }
            _ => {}
        }
    }
    (v1, v2)
}

/// The memory limit file of `pid`'s cgroup (`memory.limit_in_bytes` or `memory.max`).
fn memory_limit_file(pid: i32) -> Option<PathBuf> {
    let (v1, v2) = cgroup_mounts();
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let join = |mp: &Path, root: &str, path: &str| {
        let rel = path
            .strip_prefix(root)
            .unwrap_or(path)
            .trim_start_matches('/');
        mp.join(rel)
    };
    for line in cg.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
        if ctrls.split(',').any(|c| c == "memory")
            && let Some((mp, root)) = v1.get("memory")
        {
            let f = join(mp, root, path).join("memory.limit_in_bytes");
            if path != "/" && f.exists() {
                return Some(f);
            }
        }
    }
    for line in cg.lines() {
        if let Some(path) = line.strip_prefix("0::")
            && let Some((mp, root)) = &v2
        {
            let f = join(mp, root, path).join("memory.max");
            if path != "/" && f.exists() {
                return Some(f);
            }
        }
    }
    None
}

#[test]
fn memory_limit_from_manifest_is_the_containers_cgroup_limit_when_root() {
    if !root_or_skip("memory_limit_from_manifest_is_the_containers_cgroup_limit_when_root") {
        return;
    }
    let (v1, v2) = cgroup_mounts();
    let v2_memory = v2.as_ref().is_some_and(|(mp, _)| {
        std::fs::read_to_string(mp.join("cgroup.controllers"))
            .unwrap_or_default()
            .split_whitespace()
            .any(|c| c == "memory")
    });
    if !v1.contains_key("memory") && !v2_memory {
        assert!(
            std::env::var("KUBELET_SDK_REQUIRE_ROOT").as_deref() != Ok("1"),
            "KUBELET_SDK_REQUIRE_ROOT=1 but no cgroup memory controller is available"
        );
        println!(
            "SKIPPED memory limit test: no cgroup v1 memory hierarchy or v2 memory controller"
        );
        return;
    }
    let mut env = Env::new("memlimit");
    env.start();
    let token = env.token("main");
    let mut c = sh("main", &looping("", true), &token);
    c["resources"] = json!({ "limits": { "memory": "48Mi" } });
    env.write_pod(
        "limited.json",
        &pod("limited", json!({ "containers": [c] })),
    );
    let p = env.wait_running_ready(&static_name("limited"));
    assert_eq!(p["status"]["qosClass"], "Burstable", "{p:#}");
    let pid = wait_single_process(&token);
    let file = memory_limit_file(pid).unwrap_or_else(|| {
        panic!(
            "process {pid} is in no limited memory cgroup: /proc/{pid}/cgroup =\n{}",
            std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default()
        )
    });
    let limit = std::fs::read_to_string(&file).expect("read the limit");
    assert_eq!(
        limit.trim(),
        (48u64 * 1024 * 1024).to_string(),
        "{}",
        file.display()
    );
}

// ---------------------------------------------------------------------------------------------
// Faults: a killed supervisor, the root directory removed, a full disk. After each, a bystander
// pod keeps its process and the deleted pods leave nothing behind.
// ---------------------------------------------------------------------------------------------

/// The parent PID of `pid`.
fn parent_of(pid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let rest = &stat[stat.rfind(')').expect("comm") + 1..];
    rest.split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("ppid")
}

impl Env {
    /// Pod `name` (file `<name>.json`) with one looping container carrying a fresh token;
    /// waits until it runs. Returns the token and the container's PID.
    fn looping_pod(&mut self, name: &str) -> (String, i32) {
        let token = self.token(name);
        self.write_pod(
            &format!("{name}.json"),
            &pod(
                name,
                json!({ "containers": [sh("main", &looping("", true), &token)] }),
            ),
        );
        self.wait_running_ready(&static_name(name));
        let pid = wait_single_process(&token);
        (token, pid)
    }

    /// Delete the manifests of `names` and wait until their pods are gone.
    fn remove_pods(&self, names: &[&str]) {
        for n in names {
            self.remove_manifest(&format!("{n}.json"));
        }
        for n in names {
            self.wait_pod_gone(&static_name(n));
        }
    }
}

/// The cgroup directories a container process lives in (its own and its sandbox's), when the
/// runtime gave it one.
fn cgroup_traces(pid: i32) -> Vec<PathBuf> {
    memory_limit_file(pid)
        .and_then(|f| f.parent().map(Path::to_path_buf))
        .map(|c| {
            let sandbox = c.parent().map(Path::to_path_buf);
            std::iter::once(c).chain(sandbox).collect()
        })
        .unwrap_or_default()
}

/// After the test's pods were deleted: no process with any of `tokens`, none of `traces`
/// (cgroup directories), no container or sandbox state, no pod directory.
fn assert_nothing_left(env: &Env, tokens: &[&str], traces: &[PathBuf]) {
    for t in tokens {
        wait_until(&format!("no process with {t}"), || {
            container_pids(t).is_empty().then_some(())
        });
    }
    for t in traces {
        wait_until(&format!("{} to be removed", t.display()), || {
            (!t.exists()).then_some(())
        });
    }
    let state = env.root.join("runtime").join("process");
    for sub in ["containers", "sandboxes"] {
        wait_until(&format!("no {sub} state left"), || {
            std::fs::read_dir(state.join(sub))
                .map(|rd| rd.count() == 0)
                .unwrap_or(true)
                .then_some(())
        });
    }
    wait_until("no pod directory left", || {
        std::fs::read_dir(env.root.join("pods"))
            .map(|rd| rd.count() == 0)
            .unwrap_or(true)
            .then_some(())
    });
}

#[test]
fn a_connection_flood_on_the_read_only_port_starves_nothing_else() {
    let mut env = Env::new("flood");
    // 256 descriptors in all: the read-only port's cap is an eighth of them (32).
    env.wrapper = vec!["prlimit".into(), "--nofile=256:256".into(), "--".into()];
    env.healthz_port = free_port();
    env.start();
    let (by, by_pid) = env.looping_pod("by");
    let (token, pid) = env.looping_pod("crash");
    let name = static_name("crash");
    let lines_before = env.stderr().lines().count();

    // 600 idle connections, more than the agent has descriptors: it keeps the newest 8 pending
    // (a quarter of its cap) and closes the others as they come.
    let mut flood = Vec::new();
    while flood.len() < 600 {
        match std::net::TcpStream::connect_timeout(
            &std::net::SocketAddr::from(([127, 0, 0, 1], env.port)),
            Duration::from_millis(500),
        ) {
            Ok(s) => flood.push(s),
            Err(_) => break,
        }
    }
    assert!(flood.len() >= 100, "only {} flood connections", flood.len());

    // The healthz port answers, the PLEG and the sync loop work: a killed container is
    // restarted (a new process), the bystander is untouched.
    for _ in 0..20 {
        let (code, _) = http_get(env.healthz_port, "/healthz").expect("healthz under the flood");
        assert_eq!(code, 200);
    }
    kill(Pid::from_raw(pid), Signal::SIGKILL).expect("kill the container");
    wait_until("the killed container's restart under the flood", || {
        container_pids(&token)
            .first()
            .copied()
            .filter(|&p| p != pid)
    });
    assert_eq!(
        container_pids(&by),
        vec![by_pid],
        "the bystander was disturbed"
    );
    let noisy: Vec<String> = env
        .stderr()
        .lines()
        .skip(lines_before)
        .map(str::to_string)
        .collect();
    assert!(
        !noisy.iter().any(|l| l.contains("Too many open files")),
        "descriptors ran out: {noisy:#?}"
    );

    // The flood goes: the read-only port serves again, with the truth.
    drop(flood);
    let p = env.wait_pod(&name, "restartCount 1 after the flood", |p| {
        main_status(p, "main")["restartCount"] == 1
    });
    assert_eq!(
        main_status(&p, "main")["lastState"]["terminated"]["exitCode"],
        137,
        "{p:#}"
    );
}

#[test]
fn a_killed_supervisor_is_noticed_at_once_and_its_container_restarted_with_exit_code_137() {
    let mut env = Env::new("shimkill");
    env.start();
    let (by, by_pid) = env.looping_pod("by");
    let (token, old_pid) = env.looping_pod("sup");
    let name = static_name("sup");
    let mut traces = cgroup_traces(old_pid);

    // The evented PLEG relists only every 300 s: the restart within the deadline comes from
    // the runtime's pidfd watch on the supervisor.
    kill(Pid::from_raw(parent_of(old_pid)), Signal::SIGKILL).expect("SIGKILL the supervisor");

    let p = env.wait_pod(&name, "restartCount 1 and running again", |p| {
        let c = main_status(p, "main");
        c["restartCount"] == 1 && c["state"]["running"].is_object()
    });
    let c = main_status(&p, "main");
    assert_eq!(c["lastState"]["terminated"]["exitCode"], 137, "{c:#}");
    assert!(
        c["lastState"]["terminated"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("supervisor")),
        "{c:#}"
    );
    assert!(
        !cmdline_has(old_pid, &token),
        "the old process outlived its supervisor"
    );
    let new_pid = wait_single_process(&token);
    assert_ne!(new_pid, old_pid);
    traces.extend(cgroup_traces(new_pid));
    assert_eq!(
        container_pids(&by),
        vec![by_pid],
        "the bystander was disturbed"
    );

    env.remove_pods(&["sup", "by"]);
    traces.extend(cgroup_traces(by_pid));
    assert_nothing_left(&env, &[&token, &by], &traces);
}

#[test]
fn removing_the_root_dir_under_a_running_agent_starts_nothing_twice_and_leaks_nothing() {
    let mut env = Env::new("rootgone");
    env.start();
    let (by, by_pid) = env.looping_pod("by");
    let (third, third_pid) = env.looping_pod("third");
    let (token, pid) = env.looping_pod("lost");
    let name = static_name("lost");
    let mut traces = cgroup_traces(pid);
    traces.extend(cgroup_traces(by_pid));
    traces.extend(cgroup_traces(third_pid));

    // Renamed away first, so that the removal is one event: an `rm -rf` racing the agent's
    // writes fails with ENOTEMPTY and is run again by its operator, and each run is a loss of
    // its own.
    let removed = env.root.with_extension("removed");
    std::fs::rename(&env.root, &removed).expect("move the root dir away");
    std::fs::remove_dir_all(&removed).expect("remove it");

    // The runtime notices (its event stream fails, the PLEG relists) and restores what it
    // knows: one warning, no second copy.
    wait_until("the restoration warning", || {
        (!env.stderr_lines_with("vanished under it").is_empty()).then_some(())
    });
    // Give a second copy every chance to appear: several syncs of both pods.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        container_pids(&token),
        vec![pid],
        "a second copy was started"
    );
    for (what, token, pid) in [("bystander", &by, by_pid), ("third pod", &third, third_pid)] {
        assert_eq!(
            container_pids(token),
            vec![pid],
            "a second copy of the {what}"
        );
    }
    let restored = env.stderr_lines_with("vanished under it");
    assert_eq!(restored.len(), 1, "{restored:#?}");
    // Adopted as after an agent restart: nothing stopped, nothing restarted.
    for n in ["lost", "by", "third"] {
        let p = env.wait_running_ready(&static_name(n));
        assert_eq!(main_status(&p, "main")["restartCount"], 0, "{p:#}");
    }
    let killing = env.stderr_lines_with("Killing");
    assert!(killing.is_empty(), "containers were stopped: {killing:#?}");

    // Exits are still learnt: the shim records it in the restored state.
    kill(Pid::from_raw(pid), Signal::SIGKILL).expect("SIGKILL the container");
    let p = env.wait_pod(&name, "restartCount 1 and running again", |p| {
        let c = main_status(p, "main");
        c["restartCount"] == 1 && c["state"]["running"].is_object()
    });
    assert_eq!(
        main_status(&p, "main")["lastState"]["terminated"]["exitCode"],
        137,
        "{p:#}"
    );
    let new_pid = wait_single_process(&token);
    traces.extend(cgroup_traces(new_pid));

    env.remove_pods(&["lost", "by", "third"]);
    assert_nothing_left(&env, &[&token, &by, &third], &traces);
}

#[test]
fn a_full_root_dir_keeps_the_status_true_and_recovers_when_space_returns() {
    if !root_or_skip("a_full_root_dir_keeps_the_status_true_and_recovers_when_space_returns") {
        return;
    }
    let mut env = Env::new("diskfull");
    let fs = kubelet_testenv::Tmpfs::mount(&env.root, "4m").expect("mount a tmpfs root dir");
    env.start();
    let (by, by_pid) = env.looping_pod("by");
    let (gone, gone_pid) = env.looping_pod("gone");
    let crash = env.token("crash");
    let trigger = env.work.join("crash-now");
    let script = format!(
        "while [ ! -e {} ]; do sleep 0.1; done; exit 3",
        trigger.display()
    );
    env.write_pod(
        "crash.json",
        &pod(
            "crash",
            json!({ "containers": [sh("main", &script, &crash)] }),
        ),
    );
    env.wait_running_ready(&static_name("crash"));
    let crash_pid = wait_single_process(&crash);
    let mut traces = cgroup_traces(gone_pid);
    traces.extend(cgroup_traces(crash_pid));
    traces.extend(cgroup_traces(by_pid));

    let filler = fs.fill();
    let lines_before = env.stderr().lines().count();

    // A pod removed from its source goes, disk full or not.
    env.remove_manifest("gone.json");
    env.wait_pod_gone(&static_name("gone"));
    wait_until("the removed pod's process to go", || {
        container_pids(&gone).is_empty().then_some(())
    });
    // Its removal freed its files' space: take that too, or the restart below may fit in it.
    fs.fill();

    // A crashed container is reported exited with its code; its restart cannot be created yet.
    std::fs::write(&trigger, b"").expect("trigger the crash");
    let name = static_name("crash");
    let p = env.wait_pod(&name, "the exit with code 3 in the status", |p| {
        let c = main_status(p, "main");
        c["lastState"]["terminated"]["exitCode"] == 3 || c["state"]["terminated"]["exitCode"] == 3
    });
    assert!(!cmdline_has(crash_pid, &crash), "{p:#}");
    let p = env.wait_pod(&name, "a waiting state naming the full disk", |p| {
        main_status(p, "main")["state"]["waiting"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("ENOSPC"))
    });
    let window = Duration::from_secs(5);
    std::thread::sleep(window);
    let noisy: Vec<String> = env
        .stderr()
        .lines()
        .skip(lines_before)
        .filter(|l| l.contains("ENOSPC") || l.contains("No space left"))
        .map(str::to_string)
        .collect();
    assert!(
        noisy.len() <= 12,
        "{} disk-full lines in about {window:?} (rate-limit them): {noisy:#?}\n{p:#}",
        noisy.len()
    );

    // Space returns: the pod runs again without help.
    std::fs::remove_file(&filler).expect("free the disk");
    std::fs::remove_file(&trigger).expect("disarm the crash");
    env.wait_pod(&name, "running again", |p| {
        main_status(p, "main")["state"]["running"].is_object()
    });
    let new_pid = wait_single_process(&crash);
    traces.extend(cgroup_traces(new_pid));
    assert_eq!(
        container_pids(&by),
        vec![by_pid],
        "the bystander was disturbed"
    );

    env.remove_pods(&["crash", "by"]);
    assert_nothing_left(&env, &[&crash, &by, &gone], &traces);
    drop(env);
    drop(fs);
}

// ---------------------------------------------------------------------------------------------
// Stats: `/stats/summary` and `/metrics/resource` against the machine's ground truth
// ---------------------------------------------------------------------------------------------

/// `GET path` on the read-only port as JSON.
fn get_json(env: &Env, path: &str) -> Value {
    let (code, body) = http_get(env.port, path).unwrap_or_else(|e| panic!("GET {path}: {e}"));
    assert_eq!(code, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path} is not JSON ({e}): {body}"))
}

fn stats_pod<'a>(summary: &'a Value, name: &str) -> Option<&'a Value> {
    summary["pods"]
        .as_array()?
        .iter()
        .find(|p| p["podRef"]["name"] == name)
}

fn stats_container<'a>(pod: &'a Value, name: &str) -> Option<&'a Value> {
    pod["containers"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)
}

/// One sample of a Prometheus text exposition: name, labels, value, timestamp (ms).
type PromSample = (String, BTreeMap<String, String>, f64, Option<i64>);

/// A strict parser of the Prometheus text format (0.0.4): `# HELP`/`# TYPE` lines, samples with
/// quoted, escaped label values, a float value and an optional integer timestamp. Panics on
/// anything else, and on a sample whose family has no `# TYPE` line before it.
fn parse_prometheus(text: &str) -> Vec<PromSample> {
    fn is_name(s: &str) -> bool {
        let mut chars = s.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    }
    let mut typed = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split(' ');
            let (name, kind) = (it.next().unwrap_or(""), it.next().unwrap_or(""));
            assert!(is_name(name), "bad family name in {line:?}");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "bad type in {line:?}"
            );
            assert!(
                typed.insert(name.to_string()),
                "family typed twice: {line:?}"
            );
            continue;
        }
        if line.starts_with("# HELP ") || line.is_empty() {
            continue;
        }
        assert!(!line.starts_with('#'), "unexpected comment {line:?}");
        let (name, rest) = match line.find(['{', ' ']) {
            Some(i) => line.split_at(i),
            None => panic!("no value in {line:?}"),
        };
        assert!(is_name(name), "bad metric name in {line:?}");
        assert!(typed.contains(name), "sample before its # TYPE: {line:?}");
        let mut labels = BTreeMap::new();
        let mut rest = rest;
        if let Some(r) = rest.strip_prefix('{') {
            let mut r = r;
            loop {
                if let Some(after) = r.strip_prefix('}') {
                    r = after;
                    break;
                }
                let eq = r
                    .find('=')
                    .unwrap_or_else(|| panic!("bad labels in {line:?}"));
                let key = &r[..eq];
                assert!(is_name(key), "bad label name in {line:?}");
                let mut value = String::new();
                let mut chars = r[eq + 1..]
                    .strip_prefix('"')
                    .expect("quoted")
                    .char_indices();
                let end = loop {
                    match chars.next() {
                        Some((_, '\\')) => match chars.next() {
                            Some((_, 'n')) => value.push('\n'),
                            Some((_, c @ ('\\' | '"'))) => value.push(c),
                            other => panic!("bad escape {other:?} in {line:?}"),
                        },
                        Some((i, '"')) => break i,
                        Some((_, c)) => value.push(c),
                        None => panic!("unterminated label value in {line:?}"),
                    }
                };
                labels.insert(key.to_string(), value);
                r = &r[eq + 2 + end + 1..];
                r = r.strip_prefix(',').unwrap_or(r);
            }
            rest = r;
        }
        let mut fields = rest.trim_start().split(' ');
        let value: f64 = fields
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("bad value in {line:?}"));
        let ts = fields.next().map(|t| {
            t.parse::<i64>()
                .unwrap_or_else(|_| panic!("bad timestamp in {line:?}"))
        });
        assert!(fields.next().is_none(), "trailing fields in {line:?}");
        out.push((name.to_string(), labels, value, ts));
    }
    out
}

/// The ground truth of the stats: a container burning CPU under a 500m quota, one holding
/// 200 MiB, one that wrote 5 MiB of logs, an emptyDir with a 50 MiB file, the node's memory
/// against `/proc/meminfo`; `/metrics/resource` parses and agrees with the Summary.
#[test]
fn stats_summary_and_resource_metrics_report_what_the_machine_shows_when_root() {
    if !root_or_skip("stats_summary_and_resource_metrics_report_what_the_machine_shows_when_root") {
        return;
    }
    let mut env = Env::new("stats");
    env.extra_args = [
        "--housekeeping-interval",
        "1s",
        "--volume-stats-agg-period",
        "1s",
    ]
    .map(String::from)
    .to_vec();
    env.start();
    let (burn, hold, logger, filler) = (
        env.token("burn"),
        env.token("hold"),
        env.token("logger"),
        env.token("filler"),
    );
    let mut burn_c = sh("burn", "while :; do :; done", &burn);
    burn_c["resources"] = json!({ "limits": { "cpu": "500m" } });
    let mut hold_c = json!({
        "name": "hold",
        "image": "busybox",
        "command": ["perl", "-e", "my $x = 'a' x (210 * 1024 * 1024); sleep 3600;", &hold],
    });
    hold_c["resources"] = json!({ "limits": { "memory": "640Mi" } });
    let logger_c = json!({
        "name": "logger",
        "image": "busybox",
        "command": ["perl", "-e", "$| = 1; print 'x' x 1023, \"\\n\" for 1 .. 5200; sleep 3600;", &logger],
    });
    // The process runtime runs on the host's filesystem: the filler finds the emptyDir under
    // the agent's root directory by the pod's UID.
    let root = env.root.display().to_string();
    let mut filler_c = sh(
        "filler",
        &format!(
            "d={root}/pods/$POD_UID/volumes/kubernetes.io~empty-dir/data; head -c 52428800 /dev/zero > $d/blob; {}",
            looping("", true)
        ),
        &filler,
    );
    filler_c["env"] = json!([{ "name": "POD_UID", "valueFrom": { "fieldRef": { "fieldPath": "metadata.uid" } } }]);
    filler_c["volumeMounts"] = json!([{ "name": "data", "mountPath": "/data" }]);
    env.write_pod(
        "stats.json",
        &pod(
            "stats",
            json!({
                "containers": [burn_c, hold_c, logger_c, filler_c],
                "volumes": [{ "name": "data", "emptyDir": {} }],
                "terminationGracePeriodSeconds": 1,
            }),
        ),
    );
    let name = static_name("stats");
    env.wait_running_ready(&name);

    // Everything shows within the deadline (rates need two samples; volumes their period).
    let deadline = Instant::now() + Duration::from_secs(60);
    let summary = loop {
        let s = get_json(&env, "/stats/summary");
        let ok = stats_pod(&s, &name).is_some_and(|p| {
            let cores = stats_container(p, "burn")
                .and_then(|c| c["cpu"]["usageNanoCores"].as_f64())
                .unwrap_or(0.0);
            let held = stats_container(p, "hold")
                .and_then(|c| c["memory"]["workingSetBytes"].as_f64())
                .unwrap_or(0.0);
            let logs = stats_container(p, "logger")
                .and_then(|c| c["logs"]["usedBytes"].as_f64())
                .unwrap_or(0.0);
            let volume = p["volume"]
                .as_array()
                .and_then(|v| v.iter().find(|v| v["name"] == "data"))
                .and_then(|v| v["usedBytes"].as_f64())
                .unwrap_or(0.0);
            (0.35e9..=0.65e9).contains(&cores)
                && held >= 200.0 * 1048576.0
                && logs >= 5.0 * 1048576.0
                && volume >= 50.0 * 1048576.0
        });
        if ok {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the summary did not show the pod's usage within 60 s:\n{}",
            serde_json::to_string_pretty(&stats_pod(&s, &name)).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let p = stats_pod(&summary, &name).expect("the pod");
    assert_eq!(p["podRef"]["namespace"], "default", "{p:#}");
    assert!(
        p["podRef"]["uid"].as_str().is_some_and(|u| !u.is_empty()),
        "{p:#}"
    );
    let held = stats_container(p, "hold").expect("hold")["memory"]["workingSetBytes"]
        .as_u64()
        .expect("working set");
    let pod_ws = p["memory"]["workingSetBytes"]
        .as_u64()
        .expect("pod working set");
    assert!(pod_ws >= held, "pod {pod_ws} < container {held}");
    assert!(
        p["ephemeral-storage"]["usedBytes"].as_u64().unwrap_or(0) >= 55 << 20,
        "{p:#}"
    );
    assert!(
        p["process_stats"]["process_count"].as_u64().unwrap_or(0) >= 4,
        "{p:#}"
    );

    // The node: capacity is MemTotal, usage what the machine shows.
    let meminfo = std::fs::read_to_string("/proc/meminfo").expect("meminfo");
    let kb = |key: &str| -> f64 {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .map(|v| v * 1024.0)
            .unwrap_or_else(|| panic!("{key} in /proc/meminfo"))
    };
    let node = &summary["node"];
    assert_eq!(node["nodeName"], NODE);
    let mem = &node["memory"];
    let (ws, avail, usage) = (
        mem["workingSetBytes"].as_f64().expect("node working set"),
        mem["availableBytes"].as_f64().expect("node available"),
        mem["usageBytes"].as_f64().expect("node usage"),
    );
    let total = kb("MemTotal");
    assert_eq!(ws + avail, total, "working set + available = MemTotal");
    // Page cache, buffers and anonymous memory: what the root memory cgroup (or meminfo) counts.
    let charged = kb("Cached") + kb("Buffers") + kb("AnonPages");
    let meminfo_used = total - kb("MemFree");
    assert!(
        (usage - charged).abs() <= 0.05 * total || (usage - meminfo_used).abs() <= 0.05 * total,
        "node usage {usage} is not within 5% of MemTotal of /proc/meminfo's ({charged} charged, {meminfo_used} used)"
    );
    assert!(
        node["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap_or(0) > 0,
        "{node:#}"
    );
    assert!(
        node["fs"]["capacityBytes"].as_u64().unwrap_or(0) > 0,
        "{node:#}"
    );
    assert!(
        node["rlimit"]["maxpid"].as_i64().unwrap_or(0) > 0,
        "{node:#}"
    );

    // The reduced form metrics-server ≤ 0.5 asks for.
    let reduced = get_json(&env, "/stats/summary?only_cpu_and_memory=true");
    let rp = stats_pod(&reduced, &name).expect("the pod, reduced");
    assert!(
        rp.get("ephemeral-storage").is_none() && rp.get("volume").is_none(),
        "{rp:#}"
    );
    assert!(
        stats_container(rp, "hold").is_some_and(|c| c.get("logs").is_none()),
        "{rp:#}"
    );

    // /metrics/resource parses, and its container series are the Summary's figures: read
    // between two identical summaries, so all three come from one sample.
    let (before, metrics, after) = loop {
        let before = get_json(&env, "/stats/summary");
        let (code, metrics) =
            http_get(env.port, "/metrics/resource").expect("GET /metrics/resource");
        assert_eq!(code, 200, "{metrics}");
        let after = get_json(&env, "/stats/summary");
        if before == after {
            break (before, metrics, after);
        }
    };
    drop(after);
    let samples = parse_prometheus(&metrics);
    let find = |name_: &str, container: &str| {
        samples
            .iter()
            .find(|(n, l, _, _)| {
                n == name_
                    && l.get("container").map(String::as_str) == Some(container)
                    && l.get("pod") == Some(&name)
                    && l.get("namespace").map(String::as_str) == Some("default")
            })
            .unwrap_or_else(|| panic!("{name_} of {container} in:\n{metrics}"))
    };
    let p = stats_pod(&before, &name).expect("the pod");
    for c in ["burn", "hold", "logger", "filler"] {
        let sc = stats_container(p, c).expect("container");
        let (_, _, cpu, ts) = find("container_cpu_usage_seconds_total", c);
        let ns = sc["cpu"]["usageCoreNanoSeconds"].as_f64().expect("cpu");
        assert!((cpu - ns / 1e9).abs() < 1e-6, "{c}: {cpu} s vs {ns} ns");
        assert!(ts.is_some(), "{c}: the sample carries its timestamp");
        let (_, _, ws, _) = find("container_memory_working_set_bytes", c);
        assert_eq!(
            *ws,
            sc["memory"]["workingSetBytes"].as_f64().expect("ws"),
            "{c}"
        );
        find("container_start_time_seconds", c);
    }
    assert!(
        samples
            .iter()
            .any(|(n, _, _, _)| n == "node_cpu_usage_seconds_total"),
        "{metrics}"
    );
    assert!(
        samples
            .iter()
            .any(|(n, _, v, _)| n == "resource_scrape_error" && *v == 0.0),
        "{metrics}"
    );

    // /metrics/cadvisor parses too, with the machine's size.
    let (code, cadvisor) = http_get(env.port, "/metrics/cadvisor").expect("GET /metrics/cadvisor");
    assert_eq!(code, 200, "{cadvisor}");
    let cs = parse_prometheus(&cadvisor);
    let cores = cs
        .iter()
        .find(|(n, _, _, _)| n == "machine_cpu_cores")
        .map(|s| s.2)
        .expect("machine_cpu_cores");
    assert!(cores >= 1.0, "{cadvisor}");
    assert!(
        cs.iter().any(|(n, l, _, _)| n == "container_memory_rss"
            && l.get("container").map(String::as_str) == Some("hold")
            && l.get("image").map(String::as_str) == Some("busybox")),
        "{cadvisor}"
    );

    env.remove_pods(&["stats"]);
}

/// A container that allocates 256 MiB under a 64 MiB limit ends `OOMKilled` (exit code 137),
/// and the agent goes on.
#[test]
fn a_container_over_its_memory_limit_ends_oom_killed_when_root() {
    if !root_or_skip("a_container_over_its_memory_limit_ends_oom_killed_when_root") {
        return;
    }
    let mut env = Env::new("oomkill");
    env.start();
    let token = env.token("hog");
    let mut c = json!({
        "name": "hog",
        "image": "busybox",
        "command": ["perl", "-e", "my $x = 'a' x (256 * 1024 * 1024); sleep 3600;", &token],
    });
    c["resources"] = json!({ "limits": { "memory": "64Mi" } });
    env.write_pod(
        "hog.json",
        &pod(
            "hog",
            json!({ "containers": [c], "restartPolicy": "Never" }),
        ),
    );
    let p = env.wait_pod(&static_name("hog"), "the container terminated", |p| {
        main_status(p, "hog")["state"]["terminated"].is_object()
    });
    let t = &main_status(&p, "hog")["state"]["terminated"];
    assert_eq!(t["reason"], "OOMKilled", "{p:#}");
    assert_eq!(t["exitCode"], 137, "{p:#}");
    assert_eq!(p["status"]["phase"], "Failed", "{p:#}");
    env.remove_pods(&["hog"]);
}

/// Eviction reads the stats service: an emptyDir over its `sizeLimit` (measured by the stats
/// collector's volume walk) gets its pod evicted, and a bystander keeps running.
#[test]
fn an_empty_dir_over_its_size_limit_is_evicted_through_the_stats_service() {
    let mut env = Env::new("sizelimit");
    // Static pods are critical to the kubelet: this agent's pods all come from files.
    env.extra_args = [
        "--housekeeping-interval",
        "1s",
        "--volume-stats-agg-period",
        "1s",
        "--evict-static-pods",
    ]
    .map(String::from)
    .to_vec();
    env.start();
    let (by, by_pid) = env.looping_pod("bystander");
    let token = env.token("filler");
    let root = env.root.display().to_string();
    let mut c = sh(
        "filler",
        &format!(
            "head -c 20971520 /dev/zero > {root}/pods/$POD_UID/volumes/kubernetes.io~empty-dir/cache/blob; {}",
            looping("", true)
        ),
        &token,
    );
    c["env"] = json!([{ "name": "POD_UID", "valueFrom": { "fieldRef": { "fieldPath": "metadata.uid" } } }]);
    env.write_pod(
        "filler.json",
        &pod(
            "filler",
            json!({
                "containers": [c],
                "volumes": [{ "name": "cache", "emptyDir": { "sizeLimit": "10Mi" } }],
                "terminationGracePeriodSeconds": 1,
            }),
        ),
    );
    let p = env.wait_pod(&static_name("filler"), "evicted", |p| {
        p["status"]["phase"] == "Failed" && p["status"]["reason"] == "Evicted"
    });
    let message = p["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("cache") && message.contains("10Mi"),
        "{p:#}"
    );
    assert_eq!(
        container_pids(&by),
        vec![by_pid],
        "the bystander was disturbed"
    );
    assert!(
        env.stderr()
            .contains("eviction: signals and pod usage from the stats service"),
        "{}",
        env.stderr()
    );
    env.remove_pods(&["filler", "bystander"]);
}

/// Lines `first..=last` of the followed log, each once and in order (the payload after the
/// number is checked too: a torn line would not match).
fn assert_every_line_once(text: &str, count: usize, pad: &str) {
    let mut next = 0usize;
    for line in text.lines() {
        if line == "done" {
            continue;
        }
        let (n, rest) = line
            .split_once(' ')
            .unwrap_or_else(|| panic!("line {next}: malformed {:?}", &line[..line.len().min(80)]));
        let n: usize = n
            .parse()
            .unwrap_or_else(|_| panic!("line {next}: malformed {:?}", &line[..line.len().min(80)]));
        assert_eq!(n, next, "a line lost or repeated around line {next}");
        assert_eq!(rest, pad, "line {n} torn");
        next += 1;
    }
    assert_eq!(next, count, "lines followed");
}

/// A running pod's log directory removed under it: the next log check recreates it and has the
/// runtime reopen the log, so the container's output is readable again (not written into a
/// deleted file), with one warning.
#[test]
fn a_removed_pod_log_directory_is_recreated_and_the_log_reopened() {
    let mut env = Env::new("logdir-gone");
    env.extra_args = vec!["--container-log-monitor-interval".into(), "200ms".into()];
    env.start();
    let token = env.token("talker");
    let script = "i=0; while true; do echo \"line $i\"; i=$((i+1)); sleep 0.1; done";
    env.write_pod(
        "talker.json",
        &pod(
            "talker",
            json!({ "containers": [sh("app", script, &token)] }),
        ),
    );
    let name = static_name("talker");
    let p = env.wait_running_ready(&name);
    let uid = p["metadata"]["uid"].as_str().expect("uid").to_string();
    let pid = wait_single_process(&token);
    let dir = env.logs.join(format!("default_{name}_{uid}"));
    let log = dir.join("app").join("0.log");
    wait_until("the first lines", || log.exists().then_some(()));
    std::fs::remove_dir_all(&dir).expect("remove the pod's log directory");

    wait_until("new lines in a recreated log", || {
        std::fs::read_to_string(&log)
            .ok()
            .filter(|t| t.lines().count() >= 3)
            .map(|_| ())
    });
    wait_until("the warning event", || {
        (!env
            .stderr_lines_with("ContainerLogDirectoryRecreated")
            .is_empty())
        .then_some(())
    });
    assert_eq!(
        container_pids(&token),
        vec![pid],
        "the container was restarted"
    );
    let events = env.stderr_lines_with("ContainerLogDirectoryRecreated");
    assert_eq!(events.len(), 1, "one warning event: {events:#?}");
}

#[test]
fn a_chatty_containers_logs_rotate_at_10_mib_keeping_five_files_and_a_follower_loses_no_line() {
    let mut env = Env::new("logrotate");
    env.open_api();
    env.extra_args.extend([
        // Checked every 100 ms instead of 10 s, so that a fast writer overshoots 10 MiB by
        // little (the kubelet's check is as coarse: a file grows until the next check).
        "--container-log-monitor-interval".into(),
        "100ms".into(),
    ]);
    env.start();
    let token = env.token("chatty");
    // 61,440 lines of 1 KiB (60 MiB), about 6 MiB/s, then a marker.
    let pad = "x".repeat(1017);
    let script = format!(
        "i=0; while [ $i -lt 61440 ]; do echo \"$i {pad}\"; i=$((i+1)); \
         if [ $((i % 200)) -eq 0 ]; then sleep 0.03; fi; done; echo done; sleep 3600"
    );
    env.write_pod(
        "chatty.json",
        &pod(
            "chatty",
            json!({
                "restartPolicy": "Always",
                "terminationGracePeriodSeconds": 1,
                "containers": [sh("app", &script, &token)],
            }),
        ),
    );
    let name = static_name("chatty");
    let p = env.wait_running_ready(&name);
    let uid = p["metadata"]["uid"].as_str().expect("uid").to_string();
    let followed = env.work.join("followed.log");
    let mut curl = Command::new("curl")
        .args(["-sk", "--no-buffer", "-o"])
        .arg(&followed)
        .arg(format!(
            "https://127.0.0.1:{}/containerLogs/default/{name}/app?follow=true",
            env.api_port
        ))
        .spawn()
        .expect("curl");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let text = std::fs::read_to_string(&followed).unwrap_or_default();
        if text.ends_with("done\n") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the follower did not reach the end ({} bytes); agent log:\n{}",
            text.len(),
            env.stderr()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = curl.kill();
    let _ = curl.wait();
    assert_every_line_once(
        &std::fs::read_to_string(&followed).expect("followed"),
        61440,
        &pad,
    );
    // Compressing and pruning run in the background after each rotation: once they are done,
    // at most 5 files, all but the newest rotated one compressed.
    let dir = env.logs.join(format!("default_{name}_{uid}")).join("app");
    let list = || -> Vec<(String, u64)> {
        std::fs::read_dir(&dir)
            .expect("log dir")
            .filter_map(|e| {
                let e = e.ok()?;
                Some((
                    e.file_name().to_string_lossy().into_owned(),
                    e.metadata().ok()?.len(),
                ))
            })
            .collect()
    };
    let settled = |files: &[(String, u64)]| {
        files.len() <= 5
            && files
                .iter()
                .filter(|(n, _)| n != "0.log" && !n.ends_with(".gz"))
                .count()
                == 1
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut files = list();
    while !settled(&files) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        files = list();
    }
    assert!(files.len() <= 5, "{files:?}");
    let rotated: Vec<&(String, u64)> = files.iter().filter(|(n, _)| n != "0.log").collect();
    assert!(
        rotated.len() >= 3,
        "60 MiB at 10 MiB makes rotations: {files:?}"
    );
    // Within one check's writing (100 ms at ~6 MiB/s) of the limit.
    const SLACK: u64 = 3 << 20;
    for (n, len) in &files {
        assert!(
            *len <= (10 << 20) + SLACK,
            "{n}: {len} bytes; rotations:\n{}",
            env.stderr_lines_with("rotat").join("\n")
        );
    }
    let plain: Vec<&&(String, u64)> = rotated
        .iter()
        .filter(|(n, _)| !n.ends_with(".gz"))
        .collect();
    assert_eq!(
        plain.len(),
        1,
        "all but the newest rotated file are compressed: {files:?}"
    );
    // `tailLines` reaches into the newest rotated file when the current one is short.
    let current_lines = std::fs::read_to_string(dir.join("0.log"))
        .expect("current log")
        .lines()
        .count();
    let want = current_lines + 10;
    let o = Command::new("curl")
        .args(["-sk"])
        .arg(format!(
            "https://127.0.0.1:{}/containerLogs/default/{name}/app?tailLines={want}",
            env.api_port
        ))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(text.lines().count(), want, "tailLines={want}");
    assert_eq!(text.lines().last(), Some("done"));
    env.remove_manifest("chatty.json");
    env.wait_pod_gone(&name);
}

/// The kubeadm-written `config.yaml` of the facade's tests (1.31–1.33 layout) with this test's
/// changes: anonymous requests allowed so `/configz` can be read without credentials, a relative
/// `resolvConf`.
fn kubeadm_config() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../crates/kubelet/tests/fixtures/kubeadm-config.yaml");
    let mut text = std::fs::read_to_string(path).expect("the kubeadm fixture");
    for (from, to) in [
        (
            "  anonymous:\n    enabled: false",
            "  anonymous:\n    enabled: true",
        ),
        (
            "    cacheTTL: 0s\n    enabled: true",
            "    cacheTTL: 0s\n    enabled: false",
        ),
        (
            "  x509:\n    clientCAFile: /etc/kubernetes/pki/ca.crt\n",
            "",
        ),
        ("  mode: Webhook", "  mode: AlwaysAllow"),
        (
            "resolvConf: /run/systemd/resolve/resolv.conf",
            "resolvConf: resolv.conf",
        ),
    ] {
        assert!(text.contains(from), "the fixture has {from:?}");
        text = text.replace(from, to);
    }
    text
}

/// `--config` with a kubeadm-style file and flags on top: the effective configuration that
/// `/configz` shows is the golden one (`tests/fixtures/configz-kubeadm.json`, `$DIR` standing for
/// the test's directory): the file's values, the kubelet's defaults for its zero values, paths
/// relative to the file, every flag given on the command line over the file (the harness's
/// `--pod-manifest-path`, `--healthz-port`, `--file-check-frequency`, `--eviction-hard`…, and
/// `--cgroup-driver`, `--sync-frequency`-less flags left to the file), and one warning listing
/// the fields this agent does not support. `UPDATE_GOLDEN=1` rewrites the golden file.
#[test]
fn a_kubeadm_config_file_with_flags_on_top_gives_the_golden_configz() {
    let mut env = Env::new("configfile");
    env.api_port = free_port();
    let base = env._dir.path().to_path_buf();
    let config = base.join("etc").join("config.yaml");
    std::fs::create_dir_all(config.parent().expect("parent")).expect("mkdir");
    std::fs::write(&config, kubeadm_config()).expect("write config");
    std::fs::write(base.join("etc/resolv.conf"), "nameserver 127.0.0.1\n").expect("resolv");
    env.extra_args = vec![
        "--config".into(),
        config.to_string_lossy().into_owned(),
        "--cgroup-driver".into(),
        "cgroupfs".into(),
        "--feature-gates".into(),
        "EventedPLEG=false".into(),
        "--fail-swap-on=false".into(),
    ];
    env.start();
    let o = Command::new("curl")
        .args(["-sk"])
        .arg(format!("https://127.0.0.1:{}/configz", env.api_port))
        .output()
        .expect("curl");
    let body = String::from_utf8_lossy(&o.stdout).into_owned();
    let mut got: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    // The ports are the harness's free ones: given as flags, checked here.
    let c = &mut got["kubeletconfig"];
    assert_eq!(c["port"], env.api_port, "{body}");
    assert_eq!(c["readOnlyPort"], env.port, "{body}");
    c["port"] = json!("$PORT");
    c["readOnlyPort"] = json!("$READ_ONLY_PORT");
    let dir = base.to_string_lossy().into_owned();
    let rendered = serde_json::to_string_pretty(&got)
        .expect("render")
        .replace(&dir, "$DIR");
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/configz-kubeadm.json");
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&golden, format!("{rendered}\n")).expect("write golden");
    }
    let want = std::fs::read_to_string(&golden).expect("golden file");
    assert_eq!(
        rendered.trim(),
        want.trim(),
        "/configz differs from {}",
        golden.display()
    );
    let warnings = env.stderr_lines_with("does not know or support");
    assert_eq!(warnings.len(), 1, "{}", env.stderr());
    assert!(
        warnings[0].contains("crashLoopBackOff, logging, memorySwap"),
        "{}",
        warnings[0]
    );
}

/// A file the agent cannot use stops it at start with a message naming the file and the field.
#[test]
fn a_bad_config_file_stops_the_agent_naming_the_field() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cases = [
        (
            "apiVersion: kubelet.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n",
            "want kubelet.config.k8s.io/v1beta1/KubeletConfiguration",
        ),
        (
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nsyncFrequency: -1s\n",
            "syncFrequency: duration \"-1s\" must not be negative",
        ),
        (
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nport: many\n",
            "port: invalid type",
        ),
        ("", "was empty"),
    ];
    for (i, (text, want)) in cases.into_iter().enumerate() {
        let path = dir.path().join(format!("c{i}.yaml"));
        std::fs::write(&path, text).expect("write");
        let o = Command::new(BIN)
            .arg("--config")
            .arg(&path)
            .args(["--root-dir", &dir.path().join("root").to_string_lossy()])
            .env("NO_COLOR", "1")
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{text}: {stderr}");
        assert!(
            stderr.contains(want) && stderr.contains(&format!("c{i}.yaml")),
            "{text}: want {want:?} in\n{stderr}"
        );
    }
}

/// Graceful node shutdown (`shutdownGracePeriod: 6s`, `shutdownGracePeriodCriticalPods: 3s`
/// from `--config`): on SIGTERM the agent reports the node shutting down, terminates the
/// ordinary pod first and the critical one (priority ≥ 2000000000) after it, each within its
/// band, and only then exits.
#[test]
fn sigterm_shuts_the_node_down_terminating_low_priority_pods_before_critical_ones() {
    let mut env = Env::new("shutdown");
    let config = env._dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nshutdownGracePeriod: 6s\nshutdownGracePeriodCriticalPods: 3s\n",
    )
    .expect("config");
    env.extra_args = vec!["--config".into(), config.to_string_lossy().into_owned()];
    env.start();
    let work = env.work.clone();
    for (name, priority) in [("low", 0), ("critical", 2_000_001_000)] {
        let token = env.token(name);
        let stamp = work.join(format!("{name}.term"));
        let script = format!(
            "trap 'date +%s%N > {}; exit 0' TERM; while true; do sleep 0.1; done",
            stamp.display()
        );
        env.write_pod(
            &format!("{name}.json"),
            &pod(
                name,
                json!({
                    "priority": priority,
                    "terminationGracePeriodSeconds": 30,
                    "containers": [{ "name": "main", "image": "busybox",
                        "command": ["/bin/sh", "-c", script, token] }],
                }),
            ),
        );
    }
    env.wait_running_ready(&static_name("low"));
    env.wait_running_ready(&static_name("critical"));
    let mut child = env.agent.take().expect("agent");
    let started = Instant::now();
    kill(
        Pid::from_raw(i32::try_from(child.id()).expect("pid")),
        Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the agent did not exit"
        );
        std::thread::sleep(POLL);
    };
    assert!(status.success(), "{status}: {}", env.stderr());
    let stamp = |name: &str| -> u128 {
        std::fs::read_to_string(work.join(format!("{name}.term")))
            .unwrap_or_else(|_| panic!("{name} got no SIGTERM; log:\n{}", env.stderr()))
            .trim()
            .parse()
            .expect("a time")
    };
    assert!(
        stamp("low") <= stamp("critical"),
        "the ordinary pod is terminated before the critical one"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "within the 6 s period (and a margin)"
    );
    let log = env.stderr();
    assert!(log.contains("SIGTERM: graceful node shutdown"), "{log}");
    assert_eq!(
        log.matches("terminating a priority band").count(),
        2,
        "{log}"
    );
    assert!(log.contains("terminated=2"), "{log}");
}
