//! `minimal_kubelet --container-runtime-endpoint unix:///…` runs static pods on a real, private
//! containerd started by `scripts/containerd-test-env.sh`. Needs root; skipped with a message
//! otherwise, and failing instead when `KUBELET_SDK_REQUIRE_ROOT=1` (CI).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

mod common;
use common::{free_port, http_get_addr};

const BIN: &str = env!("CARGO_BIN_EXE_minimal_kubelet");
const LONG: Duration = Duration::from_secs(90);

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/containerd-test-env.sh")
}

/// A private containerd plus the agent; everything is stopped and removed on drop.
struct Env {
    dir: PathBuf,
    vars: BTreeMap<String, String>,
    port: u16,
    /// `--port`, the kubelet API (0: off).
    api_port: u16,
    /// More flags for the agent (e.g. `--feature-gates`).
    extra_args: Vec<String>,
    agent: Option<Child>,
}

impl Env {
    fn start(test: &str) -> Option<Self> {
        Self::start_with(test, &[])
    }

    /// [`start`](Self::start) with environment variables for `containerd-test-env.sh start`
    /// (`CONTAINERD_ROOT_TMPFS`).
    fn start_with(test: &str, script_env: &[(&str, &str)]) -> Option<Self> {
        let required = std::env::var("KUBELET_SDK_REQUIRE_ROOT").is_ok_and(|v| v == "1");
        let skip = |why: String| -> Option<Self> {
            assert!(!required, "{test}: {why} (KUBELET_SDK_REQUIRE_ROOT=1)");
            eprintln!("SKIP {test}: {why}");
            None
        };
        if !nix::unistd::geteuid().is_root() {
            return skip("needs root to run containerd".into());
        }
        let dir = tempfile::Builder::new()
            .prefix("ksdk-mk-cri-")
            .tempdir_in("/tmp")
            .unwrap()
            .keep();
        let out = Command::new("bash")
            .arg(script())
            .arg("start")
            .arg(dir.join("containerd"))
            .envs(script_env.iter().copied())
            .output()
            .unwrap();
        let env = Self {
            vars: String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            port: free_port(),
            api_port: 0,
            extra_args: Vec::new(),
            agent: None,
            dir,
        };
        if !out.status.success() {
            return skip(format!(
                "containerd-test-env.sh start failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        std::fs::create_dir_all(env.manifests()).unwrap();
        Some(env)
    }

    /// Serve the kubelet API on a free port, open to anonymous requests (a node without an API
    /// server: `AlwaysAllow`), with `extra` flags.
    fn open_api(&mut self, extra: &[&str]) {
        self.api_port = free_port();
        self.extra_args = [
            "--anonymous-auth=true",
            "--authorization-mode",
            "AlwaysAllow",
        ]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect();
    }

    fn var(&self, k: &str) -> &str {
        self.vars.get(k).map(String::as_str).unwrap_or("")
    }

    fn manifests(&self) -> PathBuf {
        self.dir.join("manifests")
    }

    fn start_agent(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("agent.log"))
            .unwrap();
        let child = Command::new(BIN)
            .arg("--container-runtime-endpoint")
            .arg(format!("unix://{}", self.var("CONTAINERD_SOCKET")))
            .arg("--pod-infra-container-image")
            .arg(self.var("PAUSE_IMAGE"))
            .arg("--pod-manifest-path")
            .arg(self.manifests())
            .arg("--root-dir")
            .arg(self.dir.join("root"))
            .arg("--pod-log-dir")
            .arg(self.dir.join("logs"))
            .arg("--node-name")
            .arg("cri-node")
            .arg("--read-only-port")
            .arg(self.port.to_string())
            .arg("--address")
            .arg("127.0.0.1")
            .arg("--healthz-port")
            .arg("0")
            .args(["--port", &self.api_port.to_string()])
            .arg("--cert-dir")
            .arg(self.dir.join("pki"))
            .args(
                (!self.extra_args.iter().any(|a| a == "--eviction-hard"))
                    .then_some(["--eviction-hard", common::LOW_EVICTION_HARD])
                    .into_iter()
                    .flatten(),
            )
            .args(&self.extra_args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.agent = Some(child);
    }

    /// SIGINT: the agent stops and leaves the pods running.
    fn stop_agent(&mut self) {
        if let Some(mut child) = self.agent.take() {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGINT);
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if child.try_wait().unwrap().is_some() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn pods(&self) -> Option<Vec<Value>> {
        let body = http_get(self.port, "/pods").ok()?;
        let v: Value = serde_json::from_str(&body).ok()?;
        Some(v["items"].as_array()?.clone())
    }

    fn pod(&self, name: &str) -> Option<Value> {
        self.pods()?
            .into_iter()
            .find(|p| p["metadata"]["name"] == format!("{name}-cri-node"))
    }

    /// Container IDs the runtime has (`ctr -n k8s.io containers ls -q`), sandboxes included.
    fn runtime_containers(&self) -> Vec<String> {
        let out = Command::new("ctr")
            .arg("-a")
            .arg(self.var("CONTAINERD_SOCKET"))
            .args(["-n", "k8s.io", "containers", "ls", "-q"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(mut child) = self.agent.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking()
            && let Ok(log) = std::fs::read_to_string(self.dir.join("agent.log"))
        {
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!("agent log (last lines, newest first):\n{}", tail.join("\n"));
        }
        let _ = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(self.dir.join("containerd"))
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn http_get(port: u16, path: &str) -> std::io::Result<String> {
    common::http_get(port, path).map(|(_, b)| b)
}

fn wait_until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + LONG;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{what} not reached within {LONG:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn running(pod: &Value) -> bool {
    pod["status"]["phase"] == "Running"
        && pod["status"]["containerStatuses"]
            .as_array()
            .is_some_and(|cs| {
                !cs.is_empty() && cs.iter().all(|c| c["state"]["running"].is_object())
            })
}

fn container_ids(pod: &Value) -> Vec<String> {
    let mut ids: Vec<String> = pod["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["containerID"].as_str().map(str::to_string))
        .collect();
    ids.sort();
    ids
}

fn write_manifest(dir: &Path, name: &str, yaml: &str) {
    let tmp = dir.join(format!(".{name}.yaml.tmp"));
    std::fs::write(&tmp, yaml).unwrap();
    std::fs::rename(&tmp, dir.join(format!("{name}.yaml"))).unwrap();
}

#[test]
fn static_pods_run_on_containerd_survive_an_agent_restart_and_are_removed_with_their_manifest() {
    let Some(mut env) = Env::start(
        "static_pods_run_on_containerd_survive_an_agent_restart_and_are_removed_with_their_manifest",
    ) else {
        return;
    };
    let image = env.var("BUSYBOX_IMAGE").to_string();
    write_manifest(
        &env.manifests(),
        "web",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: web\n    \
             image: {image}\n    command: [\"/bin/sh\", \"-c\", \"mkdir -p /www && echo hello-from-cri > /www/index.html && exec httpd -f -p 8080 -h /www\"]\n"
        ),
    );
    write_manifest(
        &env.manifests(),
        "host",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: host\nspec:\n  terminationGracePeriodSeconds: 2\n  hostNetwork: true\n  containers:\n  - name: app\n    \
             image: {image}\n    command: [\"/bin/sleep\", \"100000\"]\n"
        ),
    );
    env.start_agent();

    let web = wait_until("web Running", || env.pod("web").filter(running));
    let host = wait_until("host Running", || env.pod("host").filter(running));
    // On a CRI runtime the start stages are bounded by default, two calls per CPU.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let log = std::fs::read_to_string(env.dir.join("agent.log")).unwrap_or_default();
    assert!(
        log.lines().any(|l| l.contains("pod-start stages bounded")
            && l.contains(&format!("limit={}", 2 * cpus))),
        "no start stage limit of {} in the agent log:\n{log}",
        2 * cpus
    );
    let ip = web["status"]["podIP"].as_str().unwrap().to_string();
    let prefix = env
        .var("POD_SUBNET")
        .rsplit_once('.')
        .unwrap()
        .0
        .to_string();
    assert!(
        ip.starts_with(&prefix),
        "{ip} not in {}",
        env.var("POD_SUBNET")
    );
    assert!(
        container_ids(&web)[0].starts_with("containerd://"),
        "{:?}",
        container_ids(&web)
    );
    // The pod network works: the host reaches httpd on the pod IP.
    let addr: SocketAddr = format!("{ip}:8080").parse().unwrap();
    let (code, body) = wait_until("httpd answers on the pod IP", || {
        http_get_addr(addr, "/index.html").ok()
    });
    assert_eq!((code, body.trim()), (200, "hello-from-cri"));

    // The runtime operation metrics are served with the agent's others.
    let metrics = http_get(env.port, "/metrics").unwrap();
    for series in [
        "kubelet_runtime_operations_total{operation_type=\"run_podsandbox\"} 2",
        "kubelet_runtime_operations_total{operation_type=\"list_containers\"}",
        "kubelet_runtime_operations_duration_seconds_bucket{",
    ] {
        assert!(
            metrics.contains(series),
            "{series} missing from /metrics:\n{metrics}"
        );
    }
    // The start stages: every stage of the pods that reached Running was observed.
    let count = |family: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{family}_count ")))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    for family in [
        "kubelet_pod_worker_start_duration_seconds",
        "kubelet_pod_start_containers_duration_seconds",
        "kubelet_pod_start_status_duration_seconds",
        "kubelet_pod_start_duration_seconds",
    ] {
        assert!(count(family) >= 1, "no {family} in /metrics:\n{metrics}");
    }

    // Restart the agent: the same containers are adopted, none is recreated.
    let before = env.runtime_containers();
    env.stop_agent();
    env.start_agent();
    let web2 = wait_until("web Running after the restart", || {
        env.pod("web").filter(running)
    });
    let host2 = wait_until("host Running after the restart", || {
        env.pod("host").filter(running)
    });
    assert_eq!(container_ids(&web), container_ids(&web2));
    assert_eq!(container_ids(&host), container_ids(&host2));
    std::thread::sleep(Duration::from_secs(3));
    let mut after = env.runtime_containers();
    let mut before_sorted = before;
    before_sorted.sort();
    after.sort();
    assert_eq!(before_sorted, after, "containers (and sandboxes) changed");

    // Deleting the manifests removes the pods from containerd.
    std::fs::remove_file(env.manifests().join("web.yaml")).unwrap();
    std::fs::remove_file(env.manifests().join("host.yaml")).unwrap();
    wait_until("containerd has no containers left", || {
        env.runtime_containers().is_empty().then_some(())
    });
    wait_until("/pods empty", || {
        env.pods().filter(|p| p.is_empty()).map(|_| ())
    });
    env.stop_agent();
}

#[test]
fn evented_pleg_on_containerd_reports_a_failed_exit_and_restarts_a_crashed_container() {
    let Some(mut env) = Env::start(
        "evented_pleg_on_containerd_reports_a_failed_exit_and_restarts_a_crashed_container",
    ) else {
        return;
    };
    // No flag: the evented PLEG is the default.
    env.start_agent();
    // containerd's event stream is up and the start-up relist is done: the exits below are seen
    // through events.
    let relists = wait_until("the evented PLEG subscribed and relisted once", || {
        common::evented_pleg_relists(&http_get(env.port, "/metrics").ok()?)
    });
    let image = env.var("BUSYBOX_IMAGE").to_string();
    write_manifest(
        &env.manifests(),
        "fails",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: fails\nspec:\n  restartPolicy: Never\n  containers:\n  - name: task\n    \
             image: {image}\n    command: [\"/bin/sh\", \"-c\", \"sleep 1; exit 3\"]\n"
        ),
    );
    write_manifest(
        &env.manifests(),
        "restarts",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: restarts\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: main\n    \
             image: {image}\n    command: [\"/bin/sh\", \"-c\", \"sleep 1; exit 1\"]\n"
        ),
    );
    let main_status = |p: &Value| p["status"]["containerStatuses"][0].clone();

    let fails = wait_until("fails Failed", || {
        env.pod("fails")
            .filter(|p| p["status"]["phase"] == "Failed")
    });
    let c = main_status(&fails);
    assert_eq!(c["state"]["terminated"]["exitCode"], 3, "{c:#}");
    assert_eq!(c["state"]["terminated"]["reason"], "Error", "{c:#}");
    assert_eq!(c["restartCount"], 0, "{c:#}");

    let restarts = wait_until("restarts restarted after its exit", || {
        env.pod("restarts").filter(|p| {
            let c = main_status(p);
            c["restartCount"].as_u64().is_some_and(|n| n >= 1)
                && c["lastState"]["terminated"]["exitCode"] == 1
        })
    });
    let c = main_status(&restarts);
    assert_eq!(c["lastState"]["terminated"]["reason"], "Error", "{c:#}");

    common::assert_seen_through_events(&http_get(env.port, "/metrics").unwrap(), relists);

    // Deleting the manifests removes the pods from the agent and from containerd.
    std::fs::remove_file(env.manifests().join("fails.yaml")).unwrap();
    std::fs::remove_file(env.manifests().join("restarts.yaml")).unwrap();
    wait_until("/pods empty", || {
        env.pods().filter(|p| p.is_empty()).map(|_| ())
    });
    wait_until("containerd has no containers left", || {
        env.runtime_containers().is_empty().then_some(())
    });
    env.stop_agent();
}

/// `curl` to the agent's kubelet API (anonymous): (HTTP code, body).
fn api_get(port: u16, path: &str) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sk", "--max-time", "60", "-w", "\n%{http_code}"])
        .arg(format!("https://127.0.0.1:{port}{path}"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

#[test]
fn container_logs_on_containerd_across_restarts_and_followed_to_the_end() {
    let Some(mut env) =
        Env::start("container_logs_on_containerd_across_restarts_and_followed_to_the_end")
    else {
        return;
    };
    env.open_api(&[]);
    let image = env.var("BUSYBOX_IMAGE").to_string();
    write_manifest(
        &env.manifests(),
        "talk",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: talk\n  namespace: default\nspec:\n  terminationGracePeriodSeconds: 1\n  hostNetwork: true\n  containers:\n  - name: app\n    \
             image: {image}\n    command: [\"/bin/sh\", \"-c\", \"echo run; for i in 1 2 3; do echo line-$i; done; sleep 0.3; echo oops >&2; sleep 1; exit 3\"]\n"
        ),
    );
    env.start_agent();
    let port = env.api_port;
    let pod = "talk-cri-node";
    wait_until("talk restarted", || {
        env.pod("talk").filter(|p| {
            p["status"]["containerStatuses"][0]["restartCount"]
                .as_u64()
                .unwrap_or(0)
                >= 1
        })
    });
    let expected = "run\nline-1\nline-2\nline-3\noops\n";
    let (code, body) = api_get(
        port,
        &format!("/containerLogs/default/{pod}/app?previous=true"),
    );
    assert_eq!((code, body.as_str()), (200, expected));
    let (code, body) = api_get(
        port,
        &format!("/containerLogs/default/{pod}/app?previous=true&tailLines=2"),
    );
    assert_eq!((code, body.as_str()), (200, "line-3\noops\n"));
    let (code, body) = api_get(
        port,
        &format!("/containerLogs/default/{pod}/app?previous=true&timestamps=true&limitBytes=35"),
    );
    assert_eq!(code, 200);
    assert!(body.ends_with(" run\n"), "{body:?}");
    // The current instance (running or just exited) wrote the same lines into its own file.
    let (code, body) = wait_until("the current instance's lines", || {
        let (c, b) = api_get(port, &format!("/containerLogs/default/{pod}/app"));
        b.contains("line-3").then_some((c, b))
    });
    assert_eq!(code, 200);
    assert!(body.starts_with("run\n"), "{body:?}");

    // follow ends when the container exits.
    write_manifest(
        &env.manifests(),
        "once",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: once\n  namespace: default\nspec:\n  restartPolicy: Never\n  hostNetwork: true\n  containers:\n  - name: app\n    \
             image: {image}\n    command: [\"/bin/sh\", \"-c\", \"echo first; sleep 3; echo second\"]\n"
        ),
    );
    wait_until("once Running", || env.pod("once").filter(running));
    let start = Instant::now();
    let (code, body) = api_get(port, "/containerLogs/default/once-cri-node/app?follow=true");
    assert_eq!((code, body.as_str()), (200, "first\nsecond\n"));
    assert!(start.elapsed() < Duration::from_secs(30));

    // The log link of the (exited) container points at its log and goes with the pod.
    let once = env.pod("once").unwrap();
    let id = once["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .unwrap()
        .trim_start_matches("containerd://")
        .to_string();
    let link = env
        .dir
        .join("containers")
        .join(format!("once-cri-node_default_app-{id}.log"));
    let target = std::fs::read_link(&link).expect("the log link");
    assert!(
        target.starts_with(env.dir.join("logs")),
        "{}",
        target.display()
    );
    assert!(
        std::fs::read_to_string(&link)
            .unwrap()
            .contains(" F second")
    );
    std::fs::remove_file(env.manifests().join("once.yaml")).unwrap();
    wait_until("the log link gone", || {
        std::fs::symlink_metadata(&link).is_err().then_some(())
    });
    env.stop_agent();
}

#[test]
fn pods_on_containerd_get_the_kubelets_dns_settings_for_each_policy() {
    let Some(mut env) =
        Env::start("pods_on_containerd_get_the_kubelets_dns_settings_for_each_policy")
    else {
        return;
    };
    env.open_api(&[
        "--cluster-dns",
        "10.0.0.10",
        "--cluster-domain",
        "cluster.local",
    ]);
    let image = env.var("BUSYBOX_IMAGE").to_string();
    let manifest = |name: &str, extra: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  terminationGracePeriodSeconds: 1\n{extra}  containers:\n  - name: app\n    \
             image: {image}\n    command: [\"/bin/sh\", \"-c\", \"cat /etc/resolv.conf; exec sleep 100000\"]\n"
        )
    };
    write_manifest(&env.manifests(), "dnsa", &manifest("dnsa", ""));
    write_manifest(
        &env.manifests(),
        "dnsb",
        &manifest(
            "dnsb",
            "  hostNetwork: true\n  dnsPolicy: ClusterFirstWithHostNet\n",
        ),
    );
    write_manifest(
        &env.manifests(),
        "dnsc",
        &manifest(
            "dnsc",
            "  dnsPolicy: None\n  dnsConfig:\n    nameservers: [10.9.9.9]\n    searches: [example.test]\n    options:\n    - name: ndots\n      value: \"1\"\n",
        ),
    );
    env.start_agent();
    let port = env.api_port;
    let resolv = |name: &str| {
        wait_until(&format!("{name}'s resolv.conf"), || {
            env.pod(name).filter(running)?;
            let (code, body) =
                api_get(port, &format!("/containerLogs/default/{name}-cri-node/app"));
            (code == 200 && body.contains("nameserver")).then_some(body)
        })
    };
    let cluster_search = "search default.svc.cluster.local svc.cluster.local cluster.local";
    for name in ["dnsa", "dnsb"] {
        let r = resolv(name);
        assert!(r.contains("nameserver 10.0.0.10"), "{name}: {r}");
        assert!(r.contains(cluster_search), "{name}: {r}");
        assert!(r.contains("options ndots:5"), "{name}: {r}");
    }
    let r = resolv("dnsc");
    assert!(r.contains("nameserver 10.9.9.9"), "{r}");
    assert!(r.contains("search example.test"), "{r}");
    assert!(r.contains("options ndots:1"), "{r}");
    assert!(
        !r.contains("10.0.0.10") && !r.contains("cluster.local"),
        "{r}"
    );
    env.stop_agent();
}

/// dnsmasq serving a few static records on `address` (bound once the address exists, so it can
/// be the pod bridge's gateway before the first pod creates the bridge); killed on drop.
struct Dnsmasq(Child);

impl Dnsmasq {
    fn start(dir: &Path, address: &str, records: &[(&str, &str)]) -> Self {
        let mut cmd = Command::new("/usr/sbin/dnsmasq");
        cmd.args([
            "--keep-in-foreground",
            "--no-resolv",
            "--no-hosts",
            "--bind-dynamic",
        ])
        .arg(format!("--listen-address={address}"))
        .args(["--port=53", "--log-queries"])
        // Authoritative for the test's domains: unknown names are NXDOMAIN, not REFUSED.
        .args(["--local=/cluster.local/", "--local=/example.test/"])
        .arg(format!("--pid-file={}", dir.join("dnsmasq.pid").display()))
        .arg(format!(
            "--log-facility={}",
            dir.join("dnsmasq.log").display()
        ));
        for (name, ip) in records {
            cmd.arg(format!("--host-record={name},{ip}"));
        }
        Self(
            cmd.spawn()
                .expect("start dnsmasq (Debian package dnsmasq-base)"),
        )
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn pods_on_containerd_resolve_names_through_the_cluster_dns_for_each_policy() {
    let Some(mut env) =
        Env::start("pods_on_containerd_resolve_names_through_the_cluster_dns_for_each_policy")
    else {
        return;
    };
    // The cluster DNS is dnsmasq on the pod bridge's gateway, reachable from the pod network
    // and, as a host address, from host-network pods.
    let prefix = env
        .var("POD_SUBNET")
        .rsplit_once('.')
        .unwrap()
        .0
        .to_string();
    let gateway = format!("{prefix}.1");
    let _dns = Dnsmasq::start(
        &env.dir,
        &gateway,
        &[
            ("web.default.svc.cluster.local", "10.77.0.7"),
            ("db.example.test", "10.77.0.8"),
        ],
    );
    // The node's resolver configuration, which `Default` pods (and `ClusterFirst` pods on the
    // host network) inherit, points at the same server with another search domain.
    let host_resolv = env.dir.join("host-resolv.conf");
    std::fs::write(
        &host_resolv,
        format!("nameserver {gateway}\nsearch example.test\n"),
    )
    .unwrap();
    env.open_api(&[
        "--cluster-dns",
        &gateway,
        "--cluster-domain",
        "cluster.local",
        "--resolv-conf",
        host_resolv.to_str().unwrap(),
    ]);
    let image = env.var("BUSYBOX_IMAGE").to_string();
    let manifest = |name: &str, extra: &str, lookup: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  terminationGracePeriodSeconds: 1\n{extra}  containers:\n  - name: app\n    \
             image: {image}\n    command: [\"/bin/sh\", \"-c\", \"until nslookup {lookup} >/tmp/out 2>&1 || grep -q 10.77 /tmp/out; do sleep 0.5; done; cat /tmp/out; echo lookup-done; exec sleep 100000\"]\n"
        )
    };
    // ClusterFirst on the pod network: the short name through the search path.
    write_manifest(&env.manifests(), "rsa", &manifest("rsa", "", "web"));
    // ClusterFirstWithHostNet on the host network.
    write_manifest(
        &env.manifests(),
        "rsb",
        &manifest(
            "rsb",
            "  hostNetwork: true\n  dnsPolicy: ClusterFirstWithHostNet\n",
            "web.default.svc.cluster.local",
        ),
    );
    // None: only dnsConfig, with its own search domain.
    write_manifest(
        &env.manifests(),
        "rsc",
        &manifest(
            "rsc",
            &format!(
                "  dnsPolicy: None\n  dnsConfig:\n    nameservers: [{gateway}]\n    searches: [example.test]\n"
            ),
            "db",
        ),
    );
    // Default: the node's resolver, its search domain.
    write_manifest(
        &env.manifests(),
        "rsd",
        &manifest("rsd", "  dnsPolicy: Default\n", "db"),
    );
    // ClusterFirst on the host network falls back to the node's resolver.
    write_manifest(
        &env.manifests(),
        "rse",
        &manifest("rse", "  hostNetwork: true\n", "db"),
    );
    env.start_agent();
    let port = env.api_port;
    let lookup = |name: &str| {
        wait_until(&format!("{name}'s lookup"), || {
            env.pod(name).filter(running)?;
            let (code, body) =
                api_get(port, &format!("/containerLogs/default/{name}-cri-node/app"));
            (code == 200 && body.contains("lookup-done")).then_some(body)
        })
    };
    let a = lookup("rsa");
    assert!(
        a.contains("web.default.svc.cluster.local") && a.contains("Address: 10.77.0.7"),
        "{a}"
    );
    let b = lookup("rsb");
    assert!(b.contains("Address: 10.77.0.7"), "{b}");
    for name in ["rsc", "rsd", "rse"] {
        let out = lookup(name);
        assert!(
            out.contains("db.example.test") && out.contains("Address: 10.77.0.8"),
            "{name}: {out}"
        );
    }
    // The queries reached the test's server from the pods.
    let log = std::fs::read_to_string(env.dir.join("dnsmasq.log")).unwrap_or_default();
    assert!(log.contains("web.default.svc.cluster.local"), "{log}");
    assert!(log.contains("db.example.test"), "{log}");
    env.stop_agent();
}

#[test]
fn pods_on_containerd_get_a_managed_hosts_file_and_their_hostname() {
    let Some(mut env) =
        Env::start("pods_on_containerd_get_a_managed_hosts_file_and_their_hostname")
    else {
        return;
    };
    env.open_api(&["--cluster-domain", "cluster.local"]);
    let image = env.var("BUSYBOX_IMAGE").to_string();
    let manifest = |name: &str, extra: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  terminationGracePeriodSeconds: 1\n  hostAliases:\n  - ip: 10.1.2.3\n    hostnames: [foo.local, bar.local]\n{extra}  containers:\n  - name: app\n    \
             image: {image}\n    command: [\"/bin/sh\", \"-c\", \"cat /etc/hosts; echo host=$(hostname); exec sleep 100000\"]\n"
        )
    };
    write_manifest(
        &env.manifests(),
        "hosta",
        &manifest("hosta", "  hostname: front\n  subdomain: sub\n"),
    );
    write_manifest(
        &env.manifests(),
        "hostb",
        &manifest("hostb", "  hostNetwork: true\n"),
    );
    env.start_agent();
    let port = env.api_port;
    let output = |name: &str| {
        wait_until(&format!("{name}'s /etc/hosts"), || {
            let p = env.pod(name).filter(running)?;
            let (code, body) =
                api_get(port, &format!("/containerLogs/default/{name}-cri-node/app"));
            (code == 200 && body.contains("host=")).then_some((p, body))
        })
    };
    let (p, hosts) = output("hosta");
    let ip = p["status"]["podIP"].as_str().unwrap().to_string();
    assert!(
        hosts.starts_with("# Kubernetes-managed hosts file.\n"),
        "{hosts}"
    );
    assert!(
        hosts.contains(&format!(
            "{ip}\tfront.sub.default.svc.cluster.local\tfront\n"
        )),
        "{hosts}"
    );
    assert!(
        hosts.contains("10.1.2.3\tfoo.local\tbar.local\n"),
        "{hosts}"
    );
    assert!(hosts.contains("host=front\n"), "{hosts}");
    let (_, hosts) = output("hostb");
    assert!(
        hosts.starts_with("# Kubernetes-managed hosts file (host network).\n"),
        "{hosts}"
    );
    assert!(
        hosts.contains("10.1.2.3\tfoo.local\tbar.local\n"),
        "{hosts}"
    );
    env.stop_agent();
}

#[test]
fn a_full_root_dir_on_containerd_keeps_the_status_true_and_leaves_nothing_behind() {
    let test = "a_full_root_dir_on_containerd_keeps_the_status_true_and_leaves_nothing_behind";
    let Some(mut env) = Env::start(test) else {
        return;
    };
    let fs = kubelet_testenv::Tmpfs::mount(&env.dir.join("root"), "4m").expect("mount a tmpfs");
    env.start_agent();
    let image = env.var("BUSYBOX_IMAGE").to_string();
    let manifest = |name: &str, script: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: main\n    \
             image: {image}\n    command: [\"/bin/sh\", \"-c\", \"{script}\"]\n"
        )
    };
    write_manifest(&env.manifests(), "by", &manifest("by", "sleep 3600"));
    write_manifest(&env.manifests(), "gone", &manifest("gone", "sleep 3600"));
    write_manifest(
        &env.manifests(),
        "crash",
        &manifest("crash", "sleep 2; exit 3"),
    );
    let by = wait_until("by running", || env.pod("by").filter(running));
    wait_until("gone running", || env.pod("gone").filter(running));
    let by_ids = container_ids(&by);
    let restarts_before = wait_until("crash restarted once", || {
        env.pod("crash").and_then(|p| {
            p["status"]["containerStatuses"][0]["restartCount"]
                .as_u64()
                .filter(|&n| n >= 1)
        })
    });

    let filler = fs.fill();

    // A pod removed from its source goes, from the agent and from containerd.
    let gone_ids = container_ids(&env.pod("gone").expect("gone"));
    std::fs::remove_file(env.manifests().join("gone.yaml")).unwrap();
    wait_until("gone to leave /pods", || {
        env.pod("gone").is_none().then_some(())
    });
    wait_until("gone's containers removed from containerd", || {
        let left = env.runtime_containers();
        gone_ids
            .iter()
            .all(|id| !left.iter().any(|l| id.ends_with(l.as_str())))
            .then_some(())
    });
    // The crashing container is still reported and restarted per its policy.
    wait_until("crash's next exit reported", || {
        env.pod("crash").and_then(|p| {
            let c = &p["status"]["containerStatuses"][0];
            (c["restartCount"].as_u64()? > restarts_before
                && c["lastState"]["terminated"]["exitCode"] == 3)
                .then_some(())
        })
    });
    // A new pod runs: the agent's own files for it are a directory and, for a pod with an IP,
    // the managed hosts file, whose failed write is logged while the container keeps the
    // runtime's /etc/hosts (the agent's choice over failing the pod).
    write_manifest(&env.manifests(), "late", &manifest("late", "sleep 3600"));
    wait_until("late running on a full disk", || {
        env.pod("late").filter(running)
    });

    // Space returns; the bystander kept its container throughout.
    std::fs::remove_file(&filler).unwrap();
    let by = env.pod("by").expect("by");
    assert_eq!(
        container_ids(&by),
        by_ids,
        "the bystander was disturbed: {by:#}"
    );

    for name in ["by", "crash", "late"] {
        std::fs::remove_file(env.manifests().join(format!("{name}.yaml"))).unwrap();
    }
    wait_until("/pods empty", || {
        env.pods().filter(|p| p.is_empty()).map(|_| ())
    });
    wait_until("containerd has no containers left", || {
        env.runtime_containers().is_empty().then_some(())
    });
    wait_until("no pod directory left", || {
        std::fs::read_dir(env.dir.join("root/pods"))
            .map(|rd| rd.count() == 0)
            .unwrap_or(true)
            .then_some(())
    });
    env.stop_agent();
    drop(fs);
}

/// `kubectl` with `args` (30 s request timeout): (success, stdout, stderr).
fn kubectl(bin: &Path, kubeconfig: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(bin)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--request-timeout", "30s"])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn kubectl_exec_cp_and_port_forward_reach_containerd_containers_through_its_streaming_server() {
    let test =
        "kubectl_exec_cp_and_port_forward_reach_containerd_containers_through_its_streaming_server";
    let Some(mut env) = Env::start(test) else {
        return;
    };
    let Some(debian) = kubelet_testenv::debian_kubectl(test) else {
        return;
    };
    let Some(api) = kubelet_testenv::ApiServerEnv::start_for_node(test, "cri-node") else {
        return;
    };
    let admin = api.admin_kubeconfig().to_path_buf();
    let (ok, _, err) = kubectl(
        &debian,
        &admin,
        &[
            "create",
            "clusterrolebinding",
            "apiserver-kubelet-api",
            "--clusterrole=system:kubelet-api-admin",
            "--user=kube-apiserver-kubelet-client",
        ],
    );
    assert!(ok, "{err}");
    env.open_api(&[
        "--kubeconfig",
        api.node_kubeconfig().to_str().unwrap(),
        "--node-ip",
        "127.0.0.1",
    ]);
    env.start_agent();
    let image = env.var("BUSYBOX_IMAGE").to_string();
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": "box", "namespace": "default" },
        "spec": {
            "nodeName": "cri-node", "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "app", "image": image,
                "command": ["/bin/sh", "-c",
                    "mkdir -p /www && echo page-cri > /www/index.html && httpd -f -p 8080 -h /www & exec sleep 100000"],
            }],
        },
    });
    let file = env.dir.join("box.json");
    std::fs::write(&file, pod.to_string()).unwrap();
    let (ok, _, err) = kubectl(&debian, &admin, &["apply", "-f", file.to_str().unwrap()]);
    assert!(ok, "{err}");
    wait_until("box Running", || {
        let (_, out, _) = kubectl(
            &debian,
            &admin,
            &["get", "pod", "box", "-o", "jsonpath={.status.phase}"],
        );
        (out.trim() == "Running").then_some(())
    });

    let mut clients = vec![debian.clone()];
    if let Some(newer) = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("kubectl"))
            .find(|p| p.is_file())
    }) {
        clients.push(newer);
    }
    for kc in &clients {
        let v = kc.display().to_string();
        let (ok, out, err) = kubectl(kc, &admin, &["exec", "box", "--", "cat", "/www/index.html"]);
        assert!(ok && out == "page-cri\n", "{v}: exec: {out} {err}");
        let code = Command::new(kc)
            .arg("--kubeconfig")
            .arg(&admin)
            .args(["exec", "box", "--", "sh", "-c", "exit 7"])
            .status()
            .unwrap()
            .code();
        assert_eq!(code, Some(7), "{v}: the exit code propagates");
        // kubectl cp into the container and back.
        let local = env.dir.join("up.txt");
        std::fs::write(&local, "upload-cri\n").unwrap();
        let (ok, _, err) = kubectl(
            kc,
            &admin,
            &["cp", local.to_str().unwrap(), "box:/tmp/up.txt"],
        );
        assert!(ok, "{v}: cp up: {err}");
        let (ok, out, err) = kubectl(kc, &admin, &["exec", "box", "--", "cat", "/tmp/up.txt"]);
        assert!(ok && out == "upload-cri\n", "{v}: {out} {err}");
        let back = env.dir.join("down.txt");
        let (ok, _, err) = kubectl(
            kc,
            &admin,
            &["cp", "box:/tmp/up.txt", back.to_str().unwrap()],
        );
        assert!(ok, "{v}: cp down: {err}");
        assert_eq!(
            std::fs::read_to_string(&back).unwrap(),
            "upload-cri\n",
            "{v}"
        );

        // Port-forward into the pod's network namespace.
        let local_port = free_port();
        let mut pf = Command::new(kc)
            .arg("--kubeconfig")
            .arg(&admin)
            .args(["port-forward", "pod/box", &format!("{local_port}:8080")])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{local_port}").parse().unwrap();
        let body = wait_until(&format!("{v}: the page through port-forward"), || {
            http_get_addr(addr, "/index.html")
                .ok()
                .filter(|(code, _)| *code == 200)
                .map(|(_, b)| b)
        });
        assert_eq!(body, "page-cri\n", "{v}");
        let handles: Vec<_> = (0..10)
            .map(|_| std::thread::spawn(move || http_get_addr(addr, "/index.html")))
            .collect();
        for h in handles {
            let (code, body) = h.join().unwrap().unwrap();
            assert!(code == 200 && body == "page-cri\n", "{v}: {code} {body}");
        }
        let _ = pf.kill();
        let _ = pf.wait();
    }
    env.stop_agent();
}

/// Stats on containerd (CRI `ContainerStats`, `ImageFsInfo`): a container burning CPU under a
/// 500m quota, one holding 200 MiB, one that wrote 5 MiB of logs, an emptyDir with a 50 MiB
/// file; a container over its 64 MiB limit ends `OOMKilled`.
#[test]
fn stats_and_oom_kills_on_containerd_match_what_the_containers_do() {
    let Some(mut env) =
        Env::start("stats_and_oom_kills_on_containerd_match_what_the_containers_do")
    else {
        return;
    };
    env.extra_args = [
        "--housekeeping-interval",
        "1s",
        "--volume-stats-agg-period",
        "1s",
    ]
    .map(String::from)
    .to_vec();
    env.start_agent();
    let image = env.var("BUSYBOX_IMAGE").to_string();
    let c = |name: &str, script: &str| serde_json::json!({ "name": name, "image": image, "command": ["/bin/sh", "-c", script] });
    let mut burn = c("burn", "while :; do :; done");
    burn["resources"] = serde_json::json!({ "limits": { "cpu": "500m" } });
    // dd reads 200 MiB into one buffer, then blocks writing it to a reader that never reads:
    // the buffer stays resident.
    let mut hold = c("hold", "dd if=/dev/zero bs=209715200 count=1 | sleep 3600");
    hold["resources"] = serde_json::json!({ "limits": { "memory": "400Mi" } });
    let logger = c(
        "logger",
        "head -c 5300000 /dev/zero | tr '\\0' x | fold -w 1000; sleep 3600",
    );
    let mut filler = c(
        "filler",
        "head -c 52428800 /dev/zero > /data/blob; sleep 3600",
    );
    filler["volumeMounts"] = serde_json::json!([{ "name": "data", "mountPath": "/data" }]);
    // 300 pings of 1,400 bytes to the bridge (the pod network's gateway) through the sandbox's
    // eth0: at least 420,000 bytes each way.
    let gateway = format!("{}.1", env.var("POD_SUBNET").rsplit_once('.').unwrap().0);
    let talker = c(
        "talker",
        &format!("ping -A -q -c 300 -s 1400 {gateway}; sleep 3600"),
    );
    let stats = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": { "name": "stats" },
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [burn, hold, logger, filler, talker],
            "volumes": [{ "name": "data", "emptyDir": {} }],
        },
    });
    write_manifest(&env.manifests(), "stats", &stats.to_string());
    let mut hog = c(
        "hog",
        "x=$(head -c 268435456 /dev/zero | tr '\\0' a); sleep 3600",
    );
    hog["resources"] = serde_json::json!({ "limits": { "memory": "64Mi" } });
    let hog = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": { "name": "hog" },
        "spec": { "restartPolicy": "Never", "containers": [hog] },
    });
    write_manifest(&env.manifests(), "hog", &hog.to_string());
    let find = |s: &Value, pod: &str, c: &str, path: &[&str]| -> f64 {
        let Some(p) = s["pods"].as_array().and_then(|ps| {
            ps.iter()
                .find(|p| p["podRef"]["name"] == format!("{pod}-cri-node"))
        }) else {
            return 0.0;
        };
        let mut v = if c.is_empty() {
            p
        } else {
            match p["containers"]
                .as_array()
                .and_then(|cs| cs.iter().find(|x| x["name"] == c))
            {
                Some(v) => v,
                None => return 0.0,
            }
        };
        for k in path {
            v = &v[*k];
        }
        v.as_f64().unwrap_or(0.0)
    };
    let last = std::cell::RefCell::new(Value::Null);
    let deadline = Instant::now() + LONG;
    let summary = wait_until("the stats of the pod's containers", || {
        assert!(
            Instant::now() < deadline,
            "the stats did not show the pods' usage; last summary:\n{:#}",
            last.borrow()["pods"]
        );
        let s: Value = serde_json::from_str(&http_get(env.port, "/stats/summary").ok()?).ok()?;
        *last.borrow_mut() = s.clone();
        let cores = find(&s, "stats", "burn", &["cpu", "usageNanoCores"]);
        let held = find(&s, "stats", "hold", &["memory", "workingSetBytes"]);
        let logs = find(&s, "stats", "logger", &["logs", "usedBytes"]);
        let volume = s["pods"]
            .as_array()?
            .iter()
            .find(|p| p["podRef"]["name"] == "stats-cri-node")?["volume"]
            .as_array()?
            .iter()
            .find(|v| v["name"] == "data")?["usedBytes"]
            .as_f64()?;
        // The sandbox's network (CRI ListPodSandboxStats), its default interface inlined.
        let sent = find(&s, "stats", "", &["network", "txBytes"]);
        let received = find(&s, "stats", "", &["network", "rxBytes"]);
        ((0.35e9..=0.65e9).contains(&cores)
            && held >= 200.0 * 1048576.0
            && logs >= 5.0 * 1048576.0
            && volume >= 50.0 * 1048576.0
            && sent >= 420_000.0
            && received >= 420_000.0)
            .then_some(s)
    });
    assert!(
        find(&summary, "stats", "", &["memory", "workingSetBytes"])
            >= find(&summary, "stats", "hold", &["memory", "workingSetBytes"])
    );
    let network = &summary["pods"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["podRef"]["name"] == "stats-cri-node"))
        .unwrap()["network"];
    assert_eq!(network["name"], "eth0", "{network:#}");
    // containerd 1.6 names only the default interface: the list comes from the sandbox's
    // namespace.
    assert!(
        network["interfaces"]
            .as_array()
            .is_some_and(|is| is.iter().any(|i| i["name"] == "eth0")),
        "{network:#}"
    );
    // From the pod's and the containers' cgroups, which the CRI figures lack: the limit
    // against the working set, and the pod's processes (sandbox included).
    let available = find(&summary, "stats", "hold", &["memory", "availableBytes"]);
    let held = find(&summary, "stats", "hold", &["memory", "workingSetBytes"]);
    assert!(
        available > 0.0 && available + held <= 400.0 * 1048576.0 + 1.0,
        "available {available}, working set {held}"
    );
    assert!(
        find(&summary, "stats", "", &["process_stats", "process_count"]) >= 6.0,
        "{:#}",
        summary["pods"]
    );
    let cadvisor = http_get(env.port, "/metrics/cadvisor").unwrap();
    let line = cadvisor
        .lines()
        .find(|l| {
            l.starts_with("container_network_transmit_bytes_total{")
                && l.contains("interface=\"eth0\"")
                && l.contains("pod=\"stats-cri-node\"")
        })
        .unwrap_or_else(|| panic!("no eth0 series of the pod:\n{cadvisor}"));
    let value: f64 = line.split(' ').nth(1).unwrap().parse().unwrap();
    assert!(value >= 420_000.0, "{line}");
    // containerd reports writable layers and its image filesystem.
    assert!(
        summary["pods"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["podRef"]["name"] == "stats-cri-node"))
            .and_then(|p| p["containers"][0]["rootfs"]["usedBytes"].as_u64())
            .is_some(),
        "{summary:#}"
    );
    assert!(
        summary["node"]["runtime"]["imageFs"]["usedBytes"]
            .as_u64()
            .is_some(),
        "{summary:#}"
    );

    let hog = wait_until("hog terminated", || {
        env.pod("hog")
            .filter(|p| p["status"]["containerStatuses"][0]["state"]["terminated"].is_object())
    });
    let t = &hog["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(t["reason"], "OOMKilled", "{hog:#}");
    assert_eq!(t["exitCode"], 137, "{hog:#}");

    std::fs::remove_file(env.manifests().join("stats.yaml")).unwrap();
    std::fs::remove_file(env.manifests().join("hog.yaml")).unwrap();
    wait_until("/pods empty", || {
        env.pods().filter(|p| p.is_empty()).map(|_| ())
    });
    env.stop_agent();
}

/// Imports an image `name` of one layer of `mib` MiB of random data into the environment's
/// containerd.
fn import_filler_image(env: &Env, name: &str, mib: usize) {
    let work = env.dir.join(format!("filler-{mib}"));
    std::fs::create_dir_all(work.join("rootfs")).unwrap();
    let mut data = vec![0u8; mib << 20];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ mib as u64;
    for chunk in data.chunks_mut(8) {
        // xorshift: incompressible enough that the layer keeps its size.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    std::fs::write(work.join("rootfs/blob"), data).unwrap();
    let ok = |c: &mut Command| {
        let o = c.output().unwrap();
        assert!(
            o.status.success(),
            "{c:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    ok(Command::new("tar")
        .arg("-C")
        .arg(work.join("rootfs"))
        .arg("-cf")
        .arg(work.join("layer.tar"))
        .arg("."));
    ok(Command::new("bash")
        .arg(script())
        .arg("build-image")
        .arg(work.join("image.tar"))
        .arg(name)
        .arg(work.join("layer.tar"))
        .arg(r#"{"Env":["PATH=/bin"],"Cmd":["/bin/sh"]}"#));
    ok(Command::new("ctr")
        .arg("-a")
        .arg(env.var("CONTAINERD_SOCKET"))
        .args(["-n", "k8s.io", "images", "import"])
        .arg(work.join("image.tar")));
    let _ = std::fs::remove_dir_all(&work);
}

fn runtime_images(env: &Env) -> Vec<String> {
    let out = Command::new("ctr")
        .arg("-a")
        .arg(env.var("CONTAINERD_SOCKET"))
        .args(["-n", "k8s.io", "images", "ls", "-q"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn disk_pressure_on_a_small_image_filesystem_is_relieved_by_image_gc_with_no_pod_evicted() {
    let test =
        "disk_pressure_on_a_small_image_filesystem_is_relieved_by_image_gc_with_no_pod_evicted";
    // containerd's root (images, snapshots) on a 256 MiB tmpfs: the image filesystem.
    let Some(mut env) = Env::start_with(test, &[("CONTAINERD_ROOT_TMPFS", "256M")]) else {
        return;
    };
    let imagefs = env.dir.join("containerd/root");
    let available_mib = || {
        let stat = nix::sys::statvfs::statvfs(&imagefs).unwrap();
        (stat.blocks_available() as u64 * stat.fragment_size() as u64) >> 20
    };
    // Pressure below 30 MiB less than is free before the fillers (72 MiB at least) arrive:
    // met with them, relieved once they are gone.
    let before = available_mib();
    let threshold = format!(
        "memory.available<1Mi,nodefs.available<1%,imagefs.available<{}Mi",
        before - 30
    );
    env.extra_args = [
        "--eviction-hard",
        &threshold,
        "--eviction-pressure-transition-period",
        "1s",
        // The fillers are first seen just before the pressure: the minimum age would protect
        // them.
        "--minimum-image-ttl-duration",
        "0s",
        // Static pods are critical: without this nothing could be evicted anyway.
        "--evict-static-pods",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    write_manifest(
        &env.manifests(),
        "steady",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: steady}}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: app\n    image: {}\n    imagePullPolicy: Never\n    command: [/bin/sh, -c, 'sleep 3600']\n",
            env.var("BUSYBOX_IMAGE")
        ),
    );
    env.start_agent();
    let pod = wait_until("the pod running", || env.pod("steady").filter(running));
    let ids = container_ids(&pod);
    let fillers: Vec<String> = (1..=3)
        .map(|n| format!("localhost/kubelet-sdk/filler:{n}"))
        .collect();
    for f in &fillers {
        import_filler_image(&env, f, 24);
    }
    // No check of the room the fillers took on the filesystem's free space here: the other
    // tests of this binary write and free room on the same filesystem meanwhile, and the
    // reclaim may already be under way. The agent's reclaim lines below show the pressure.
    wait_until("the fillers removed by reclaim", || {
        let images = runtime_images(&env);
        fillers.iter().all(|f| !images.contains(f)).then_some(())
    });
    let images = runtime_images(&env);
    assert!(
        images.contains(&env.var("BUSYBOX_IMAGE").to_string()),
        "in use: {images:?}"
    );
    assert!(
        images.contains(&env.var("PAUSE_IMAGE").to_string()),
        "the sandbox image: {images:?}"
    );
    let log = std::fs::read_to_string(env.dir.join("agent.log")).unwrap();
    assert!(log.contains("reclaim: removed unused images"), "{log}");
    wait_until("the reclaim judged enough", || {
        std::fs::read_to_string(env.dir.join("agent.log"))
            .ok()
            .filter(|l| l.contains("node-level reclaim resolved the pressure"))
    });
    // Two more eviction rounds (10 s each): the pod is never evicted.
    std::thread::sleep(Duration::from_secs(21));
    let pod = env.pod("steady").expect("the pod");
    assert!(running(&pod), "{pod:#}");
    assert_eq!(container_ids(&pod), ids, "the same container");
    let log = std::fs::read_to_string(env.dir.join("agent.log")).unwrap();
    assert!(
        !log.contains("evicting pod") && !log.contains("Evicted"),
        "{log}"
    );
}
