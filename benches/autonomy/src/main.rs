//! `autonomy-bench`: the figures of edge autonomy (the pod checkpoint) for `docs/performance.md`.
//!
//! For a release `minimal_kubelet` binary (built beforehand; this harness builds nothing), each
//! run starts a fresh agent twice on its process runtime, with the same `N` pods (one container
//! `sleep <unique token>`, `restartPolicy: Always`):
//!
//! 1. **static** (the baseline): the `N` manifests are in `--pod-manifest-path` before the agent
//!    starts;
//! 2. **checkpoint**: the `N` pods (as the API server would have them: `nodeName`, UIDs) are in the
//!    agent's pod checkpoint, written beforehand with `kubelet_apiserver::checkpoint`, and the
//!    agent's `--kubeconfig` names an API server that refuses connections (a loopback port with no
//!    listener). `--pod-checkpoint-offline-wait` is `--offline-wait-ms` (default 100 ms); the
//!    wait is a deliberate delay (5 s by default in the agent, so that a healthy start never
//!    uses the checkpoint), reported separately: the ratio without it is the serving path's.
//!
//! Each phase: wall time from spawning the agent until `GET /pods` of its read-only port shows
//! all `N` Running with `Ready=True` (polled every 20 ms). Then the checkpoint's own costs,
//! without an agent: the size of `N` pods of a current cluster (each with a projected
//! service-account volume, env, resources, tolerations as admission adds them) per pod, and
//! the time of [`Checkpoint::save_pods`] for a snapshot in which one pod changed (the file of
//! that pod and the state are written and synced), p50/p99 over `--changes` changes.
//!
//! ```text
//! CARGO_TARGET_DIR=/work/target-perf cargo build --release -p minimal_kubelet -p autonomy-bench
//! /work/target-perf/release/autonomy-bench --agent /work/target-perf/release/minimal_kubelet --pods 30 --runs 3
//! ```

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bench_support::{free_port, ms, percentile};
use clap::Parser;
use k8s_openapi::api::core::v1::Pod;
use kubelet_apiserver::checkpoint::{Checkpoint, CheckpointConfig};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const NODE: &str = "autonomy-bench";
const POLL: Duration = Duration::from_millis(20);

/// Command-line flags.
#[derive(Debug, Parser)]
#[command(about = "Agent start to Running from the pod checkpoint vs static manifests")]
struct Args {
    /// The release `minimal_kubelet` binary.
    #[arg(long)]
    agent: PathBuf,
    /// Pods per phase.
    #[arg(long, default_value_t = 30)]
    pods: usize,
    /// Runs (each: static, then checkpoint).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// `--pod-checkpoint-offline-wait` of the checkpoint phase, in milliseconds.
    #[arg(long, default_value_t = 100)]
    offline_wait_ms: u64,
    /// Pod changes timed for the write cost.
    #[arg(long, default_value_t = 500)]
    changes: usize,
    /// Pods in the checkpoint while the write cost is timed (the kubelet's 110 by default).
    #[arg(long, default_value_t = 110)]
    checkpoint_pods: usize,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if !args.agent.exists() {
        bail!("{} does not exist: build it first", args.agent.display());
    }
    let mut static_ms = Vec::new();
    let mut checkpoint_ms = Vec::new();
    for run in 0..args.runs {
        static_ms.push(phase(&args, run, false)?);
        checkpoint_ms.push(phase(&args, run, true)?);
        println!(
            "run {run}: static {:.0} ms, checkpoint {:.0} ms",
            static_ms[run], checkpoint_ms[run]
        );
    }
    let (size_per_pod, p50, p99) = write_cost(&args)?;
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        percentile(v, 0.5)
    };
    let (s, c) = (median(&mut static_ms), median(&mut checkpoint_ms));
    let wait = args.offline_wait_ms as f64;
    println!(
        "pods: {}, runs: {}, offline wait: {wait} ms",
        args.pods, args.runs
    );
    println!("agent start -> all Running, static manifests (median): {s:.0} ms");
    println!(
        "agent start -> all Running, pod checkpoint   (median): {c:.0} ms  ({:.2}x); without the deliberate offline wait: {:.0} ms ({:.2}x)",
        c / s,
        c - wait,
        (c - wait) / s
    );
    println!("checkpoint size per pod of a current cluster: {size_per_pod} bytes");
    println!(
        "save_pods with one pod changed among {}: p50 {p50:.3} ms, p99 {p99:.3} ms",
        args.checkpoint_pods
    );
    println!(
        "JSON {}",
        serde_json::json!({
            "pods": args.pods, "runs": args.runs, "offline_wait_ms": wait,
            "static_ms": s, "checkpoint_ms": c, "ratio": c / s,
            "ratio_without_wait": (c - wait) / s,
            "size_per_pod_bytes": size_per_pod, "write_p50_ms": p50, "write_p99_ms": p99,
        })
    );
    Ok(())
}

fn token(run: usize, checkpoint: bool, i: usize) -> String {
    format!("{}.{}{run}{i:04}", 86_400, u8::from(checkpoint) + 1)
}

/// A pod as `kubectl run` makes it, bound to the node, with its container's `sleep` token.
fn pod(name: &str, uid: &str, token: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name, "namespace": "default", "uid": uid },
        "spec": {
            "nodeName": NODE, "restartPolicy": "Always", "terminationGracePeriodSeconds": 1,
            "containers": [{ "name": "app", "image": "busybox", "command": ["sleep", token] }],
        },
    })
}

/// A pod of a current cluster as the API server stores it after admission.
fn current_pod(i: usize) -> anyhow::Result<Pod> {
    let mut p = pod(
        &format!("web-{i}"),
        &format!("00000000-0000-4000-8000-{i:012}"),
        "1",
    );
    p["metadata"]["labels"] = serde_json::json!({ "app": "web", "pod-template-hash": "5d4f8c9b7" });
    p["metadata"]["resourceVersion"] = serde_json::json!("123456");
    p["metadata"]["creationTimestamp"] = serde_json::json!("2026-11-27T10:00:00Z");
    p["spec"]["serviceAccountName"] = serde_json::json!("default");
    p["spec"]["containers"][0]["env"] =
        serde_json::json!([{ "name": "MODE", "value": "production" }]);
    p["spec"]["containers"][0]["resources"] = serde_json::json!({ "requests": { "cpu": "100m", "memory": "64Mi" }, "limits": { "memory": "128Mi" } });
    p["spec"]["containers"][0]["volumeMounts"] = serde_json::json!([{
        "name": "kube-api-access-x7k2p", "readOnly": true,
        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
    }]);
    p["spec"]["volumes"] = serde_json::json!([{ "name": "kube-api-access-x7k2p", "projected": {
        "defaultMode": 420,
        "sources": [
            { "serviceAccountToken": { "expirationSeconds": 3607, "path": "token" } },
            { "configMap": { "name": "kube-root-ca.crt", "items": [{ "key": "ca.crt", "path": "ca.crt" }] } },
            { "downwardAPI": { "items": [{ "path": "namespace", "fieldRef": { "apiVersion": "v1", "fieldPath": "metadata.namespace" } }] } },
        ],
    } }]);
    p["spec"]["tolerations"] = serde_json::json!([
        { "key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300 },
        { "key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300 },
    ]);
    p["status"] = serde_json::json!({
        "phase": "Running", "hostIP": "10.0.0.5", "podIP": "10.244.1.7", "qosClass": "Burstable",
        "startTime": "2026-11-27T10:00:01Z",
        "conditions": [{ "type": "Ready", "status": "True", "lastTransitionTime": "2026-11-27T10:00:03Z" }],
        "containerStatuses": [{
            "name": "app", "ready": true, "restartCount": 0, "image": "docker.io/library/busybox:latest",
            "imageID": "docker.io/library/busybox@sha256:0000000000000000000000000000000000000000000000000000000000000000",
            "containerID": "containerd://0000000000000000000000000000000000000000000000000000000000000000",
            "started": true, "state": { "running": { "startedAt": "2026-11-27T10:00:02Z" } },
        }],
    });
    serde_json::from_value(p).context("a current cluster's pod")
}

/// Checkpoint size per pod and the cost of a save in which one pod changed.
fn write_cost(args: &Args) -> anyhow::Result<(u64, f64, f64)> {
    let dir = tempfile::tempdir()?;
    let cp = Checkpoint::open(dir.path(), NODE, CheckpointConfig::default())?;
    let mut pods: Vec<Pod> = (0..args.checkpoint_pods)
        .map(current_pod)
        .collect::<Result<_, _>>()?;
    if let Some(e) = cp.save_pods(&pods).into_iter().next() {
        bail!("writing the checkpoint: {e}");
    }
    let size_per_pod = cp.size() / args.checkpoint_pods.max(1) as u64;
    let mut times = Vec::with_capacity(args.changes);
    for i in 0..args.changes {
        let n = i % pods.len();
        pods[n].metadata.resource_version = Some(format!("{}", 200_000 + i));
        let t = Instant::now();
        if let Some(e) = cp.save_pods(&pods).into_iter().next() {
            bail!("writing the checkpoint: {e}");
        }
        times.push(ms(t.elapsed()));
    }
    times.sort_by(f64::total_cmp);
    Ok((
        size_per_pod,
        percentile(&times, 0.5),
        percentile(&times, 0.99),
    ))
}

/// One agent start: wall time until all pods are Running and Ready.
fn phase(args: &Args, run: usize, checkpoint: bool) -> anyhow::Result<f64> {
    let dir = tempfile::Builder::new()
        .prefix("autonomy-bench-")
        .tempdir()?;
    let root = dir.path().join("root");
    let manifests = dir.path().join("manifests");
    std::fs::create_dir_all(&manifests)?;
    let tokens: Vec<String> = (0..args.pods).map(|i| token(run, checkpoint, i)).collect();
    let names: Vec<String> = (0..args.pods).map(|i| format!("pod-{i}")).collect();
    let mut cmd = Command::new(&args.agent);
    if checkpoint {
        let pods: Vec<Pod> = names
            .iter()
            .zip(&tokens)
            .enumerate()
            .map(|(i, (n, t))| {
                serde_json::from_value(pod(n, &format!("10000000-0000-4000-8000-{i:012}"), t))
            })
            .collect::<Result<_, _>>()?;
        let cp = Checkpoint::open(&root, NODE, CheckpointConfig::default())?;
        if let Some(e) = cp.save_pods(&pods).into_iter().next() {
            bail!("writing the checkpoint: {e}");
        }
        // The Services the pods' environment is made from, as an online agent keeps them.
        let kubernetes: k8s_openapi::api::core::v1::Service =
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": "kubernetes", "namespace": "default" },
                "spec": { "clusterIP": "10.0.0.1", "ports": [{ "name": "https", "port": 443 }] },
            }))?;
        cp.save_services(&[std::sync::Arc::new(kubernetes)])?;
        // An API server that refuses connections.
        let kubeconfig = dir.path().join("kubeconfig");
        let port = free_port()?;
        std::fs::write(
            &kubeconfig,
            serde_json::json!({
                "apiVersion": "v1", "kind": "Config", "current-context": "c",
                "clusters": [{ "name": "c", "cluster": { "server": format!("https://127.0.0.1:{port}"), "insecure-skip-tls-verify": true } }],
                "users": [{ "name": "u", "user": { "token": "unused" } }],
                "contexts": [{ "name": "c", "context": { "cluster": "c", "user": "u" } }],
            })
            .to_string(),
        )?;
        cmd.arg("--kubeconfig").arg(&kubeconfig).args([
            "--pod-checkpoint-offline-wait",
            &format!("{}ms", args.offline_wait_ms),
        ]);
    } else {
        for (n, t) in names.iter().zip(&tokens) {
            let mut p = pod(n, "", t);
            p["metadata"].as_object_mut().map(|m| m.remove("uid"));
            p["spec"].as_object_mut().map(|s| s.remove("nodeName"));
            std::fs::write(manifests.join(format!("{n}.json")), p.to_string())?;
        }
    }
    let port = free_port()?;
    let log = std::fs::File::create(dir.path().join("agent.log"))?;
    let started = Instant::now();
    let mut child = cmd
        .arg("--pod-manifest-path")
        .arg(&manifests)
        .arg("--root-dir")
        .arg(&root)
        .arg("--pod-log-dir")
        .arg(dir.path().join("logs"))
        .args(["--read-only-port", &port.to_string()])
        .args([
            "--address",
            "127.0.0.1",
            "--healthz-port",
            "0",
            "--port",
            "0",
        ])
        .args(["--node-name", NODE, "--register-node=false"])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", args.agent.display()))?;
    let result = wait_all_running(port, args.pods, &mut child, started);
    let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGINT);
    let stop = Instant::now();
    while child.try_wait()?.is_none() && stop.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(POLL);
    }
    let _ = child.kill();
    let _ = child.wait();
    kill_sleeps(&tokens);
    match result {
        Ok(d) => Ok(ms(d)),
        Err(e) => {
            let log = std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            bail!(
                "{e}; agent log (last lines, newest first):\n{}",
                tail.join("\n")
            )
        }
    }
}

fn wait_all_running(
    port: u16,
    n: usize,
    child: &mut Child,
    started: Instant,
) -> anyhow::Result<Duration> {
    loop {
        if let Ok(pods) = get_pods(port)
            && pods.values().filter(|ready| **ready).count() == n
        {
            return Ok(started.elapsed());
        }
        if let Some(status) = child.try_wait()? {
            bail!("the agent exited: {status}");
        }
        if started.elapsed() > Duration::from_secs(120) {
            bail!("not all {n} pods Running after 120 s");
        }
        std::thread::sleep(POLL);
    }
}

/// `GET /pods` of the read-only port: name -> Running with Ready=True.
fn get_pods(port: u16) -> anyhow::Result<BTreeMap<String, bool>> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET /pods HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or_default();
    Ok(bench_support::pod_states(body)
        .context("pod list: not JSON")?
        .into_iter()
        .map(|(name, s)| (name, s.running_ready()))
        .collect())
}

/// SIGKILL the `sleep` processes of this phase (containers outlive the agent by design).
fn kill_sleeps(tokens: &[String]) {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        if cmdline
            .split(|b| *b == 0)
            .any(|a| tokens.iter().any(|t| a == t.as_bytes()))
        {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}
