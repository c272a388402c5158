//! `apiserver-bench`: the figures issue 8 asks `docs/performance.md` to record.
//!
//! One private etcd + kube-apiserver 1.20.2 (`scripts/apiserver-test-env.sh`, through
//! `kubelet-testenv`), and a release `minimal_kubelet` binary on its process runtime (built
//! beforehand; this harness builds nothing). Each run has three phases, each with a fresh agent
//! and root directory:
//!
//! 1. **static** (the baseline): the agent alone (no API server), `N` pod manifests written into
//!    its `--pod-manifest-path`; wall time from the first write until `GET /pods` of its
//!    read-only port shows all `N` Running with `Ready=True`.
//! 2. **api**: the agent with `--kubeconfig` (node credentials for `system:node:bench-node`, so
//!    NodeRestriction applies). Once its Node is Ready in the API, `N` pods with
//!    `spec.nodeName: bench-node` are created concurrently through the API (admin client); wall
//!    time from the first create until a LIST shows all `N` Running with `Ready=True` in the API.
//!    Then all `N` are deleted (default grace period) and the harness waits until the API has none
//!    left: the agent must stop the containers and delete the objects. Every request the agent
//!    made between "Node Ready" and "all gone" is taken from the API server's audit log (user
//!    `system:node:bench-node`) and grouped by verb and resource: requests per pod lifecycle.
//! 3. **mirror**: the agent with `--kubeconfig` *and* `--pod-manifest-path`; the same `N` pods as
//!    static files; wall time until all `N` mirror pods are Running and Ready in the API; then
//!    the files are removed and the harness waits until the mirror pods are gone. Requests are
//!    counted as for `api`.
//!
//! The pods: one container `sleep <unique token>`, image `busybox` (the process runtime runs the
//! host's `sleep`), `restartPolicy: Always`. Polling: every 50 ms (`curl` for the API, plain HTTP
//! for the agent's `/pods`). It prints a table (median, min and max over the runs), the request
//! breakdown of the last run, and one JSON line (prefixed `JSON `).
//!
//! ```text
//! CARGO_TARGET_DIR=/work/target-perf cargo build --release -p minimal_kubelet -p apiserver-bench
//! /work/target-perf/release/apiserver-bench --agent /work/target-perf/release/minimal_kubelet --pods 30 --runs 3
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use kubelet_testenv::{ApiServerEnv, AuditEvent};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Node name given to the agent and to the API server's node credentials.
const NODE: &str = "bench-node";
/// Polling period while waiting.
const POLL: Duration = Duration::from_millis(50);
/// Integer part of every `sleep` argument; the fraction carries the unique token.
const SLEEP_SECS: u32 = 86_400;
/// Namespace of the API pods.
const NAMESPACE: &str = "default";

/// Command-line flags.
#[derive(Debug, Parser)]
#[command(
    name = "apiserver-bench",
    about = "N pods through a real kube-apiserver vs as static files"
)]
struct Args {
    /// Path of a release `minimal_kubelet` binary.
    #[arg(long, default_value_os_t = default_agent())]
    agent: PathBuf,
    /// Number of pods per phase.
    #[arg(long, default_value_t = 30)]
    pods: usize,
    /// Number of runs (the table shows median, min and max).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Give up waiting for a phase after this many seconds.
    #[arg(long, default_value_t = 180)]
    timeout_secs: u64,
    /// Phases to run, in this order: static, api, mirror.
    #[arg(long, value_delimiter = ',', default_values_t = ["static".to_string(), "api".to_string(), "mirror".to_string()])]
    phases: Vec<String>,
}

fn default_agent() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/release/minimal_kubelet")
}

/// One metric: key (also the JSON key), unit, description for the table.
struct Metric {
    key: &'static str,
    unit: &'static str,
    what: &'static str,
}

const METRICS: &[Metric] = &[
    Metric {
        key: "static_all_running_ms",
        unit: "ms",
        what: "static: first file write -> all N Running+Ready (agent /pods)",
    },
    Metric {
        key: "api_all_running_ms",
        unit: "ms",
        what: "api: first create -> all N Running+Ready in the API",
    },
    Metric {
        key: "api_vs_static",
        unit: "x",
        what: "api_all_running / static_all_running",
    },
    Metric {
        key: "api_creates_ms",
        unit: "ms",
        what: "api: the N concurrent creates, until all returned",
    },
    Metric {
        key: "api_per_pod_running_p50_ms",
        unit: "ms",
        what: "api: per pod, own create -> Running+Ready in the API, p50",
    },
    Metric {
        key: "api_per_pod_running_p99_ms",
        unit: "ms",
        what: "api: per pod, own create -> Running+Ready in the API, p99",
    },
    Metric {
        key: "mirror_all_running_ms",
        unit: "ms",
        what: "mirror: first file write -> all N mirror pods Running+Ready in the API",
    },
    Metric {
        key: "mirror_vs_static",
        unit: "x",
        what: "mirror_all_running / static_all_running",
    },
    Metric {
        key: "static_teardown_ms",
        unit: "ms",
        what: "static: files removed -> no pod in /pods",
    },
    Metric {
        key: "api_teardown_ms",
        unit: "ms",
        what: "api: N deletes sent -> no pod object left in the API",
    },
    Metric {
        key: "mirror_teardown_ms",
        unit: "ms",
        what: "mirror: files removed -> no mirror pod left in the API",
    },
    Metric {
        key: "api_requests_per_pod",
        unit: "req",
        what: "api: agent requests on pods + events per pod lifecycle",
    },
    Metric {
        key: "api_pod_requests_per_pod",
        unit: "req",
        what: "api: of which on pods (get, status patch, delete)",
    },
    Metric {
        key: "api_event_requests_per_pod",
        unit: "req",
        what: "api: of which on events",
    },
    Metric {
        key: "api_node_lease_requests",
        unit: "req",
        what: "api: agent requests on its Node and Lease in the window",
    },
    Metric {
        key: "api_window_s",
        unit: "s",
        what: "api: the counting window (Node Ready -> all pods gone)",
    },
    Metric {
        key: "mirror_requests_per_pod",
        unit: "req",
        what: "mirror: agent requests on pods + events per static pod lifecycle",
    },
    Metric {
        key: "leftover_processes",
        unit: "",
        what: "token processes killed after the phases",
    },
];

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.pods == 0 || args.runs == 0 {
        bail!("--pods and --runs must be at least 1");
    }
    let agent = args.agent.canonicalize().with_context(|| {
        format!(
            "--agent {}: build it with `cargo build --release -p minimal_kubelet`",
            args.agent.display()
        )
    })?;
    let machine = machine_info();
    eprintln!(
        "apiserver-bench: agent {}, {} pods, {} runs",
        agent.display(),
        args.pods,
        args.runs
    );
    eprintln!("machine: {machine}");
    if let Some(p) = args
        .phases
        .iter()
        .find(|p| !["static", "api", "mirror"].contains(&p.as_str()))
    {
        bail!("--phases: unknown phase {p} (static, api, mirror)");
    }
    let Some(env) = ApiServerEnv::start_for_node("apiserver-bench", NODE) else {
        bail!("no API server on this machine (see the SKIP line above)");
    };
    eprintln!("API server {}", env.url());
    let api = Api::admin(&env);

    let want = |p: &str| args.phases.iter().any(|x| x == p);
    let mut runs = Vec::new();
    let mut last_breakdown = (BTreeMap::new(), BTreeMap::new());
    for run in 0..args.runs {
        let mut out = BTreeMap::new();
        let n = args.pods as f64;
        let count = |evs: &[AuditEvent], f: &dyn Fn(&AuditEvent) -> bool| {
            evs.iter().filter(|e| f(e)).count() as f64
        };
        let mut leftovers = 0;
        let mut line = Vec::new();
        let st = if want("static") {
            let st =
                static_phase(&agent, &args, run).with_context(|| format!("run {run}: static"))?;
            out.insert("static_all_running_ms", st.all_running_ms);
            out.insert("static_teardown_ms", st.teardown_ms);
            leftovers += st.leftovers;
            line.push(format!("static {:.0} ms", st.all_running_ms));
            Some(st)
        } else {
            None
        };
        let ratio = |x: f64| st.as_ref().map(|st| x / st.all_running_ms.max(0.001));
        if want("api") {
            let ap = api_phase(&env, &api, &agent, &args, run)
                .with_context(|| format!("run {run}: api"))?;
            out.insert("api_all_running_ms", ap.all_running_ms);
            if let Some(r) = ratio(ap.all_running_ms) {
                out.insert("api_vs_static", r);
            }
            out.insert("api_creates_ms", ap.creates_ms);
            out.insert(
                "api_per_pod_running_p50_ms",
                percentile(&ap.per_pod_ms, 0.50),
            );
            out.insert(
                "api_per_pod_running_p99_ms",
                percentile(&ap.per_pod_ms, 0.99),
            );
            out.insert("api_teardown_ms", ap.teardown_ms);
            let pods = count(&ap.requests, &|e| e.resource == "pods");
            let events = count(&ap.requests, &|e| e.resource == "events");
            out.insert("api_requests_per_pod", (pods + events) / n);
            out.insert("api_pod_requests_per_pod", pods / n);
            out.insert("api_event_requests_per_pod", events / n);
            out.insert(
                "api_node_lease_requests",
                count(&ap.requests, &|e| {
                    e.resource == "nodes" || e.resource == "leases"
                }),
            );
            out.insert("api_window_s", ap.window_s);
            leftovers += ap.leftovers;
            line.push(format!(
                "api {:.0} ms ({:.1} requests/pod)",
                ap.all_running_ms,
                (pods + events) / n
            ));
            last_breakdown.0 = breakdown(&ap.requests);
        }
        if want("mirror") {
            let mi = mirror_phase(&env, &api, &agent, &args, run)
                .with_context(|| format!("run {run}: mirror"))?;
            out.insert("mirror_all_running_ms", mi.all_running_ms);
            if let Some(r) = ratio(mi.all_running_ms) {
                out.insert("mirror_vs_static", r);
            }
            out.insert("mirror_teardown_ms", mi.teardown_ms);
            out.insert(
                "mirror_requests_per_pod",
                count(&mi.requests, &|e| {
                    e.resource == "pods" || e.resource == "events"
                }) / n,
            );
            leftovers += mi.leftovers;
            line.push(format!("mirror {:.0} ms", mi.all_running_ms));
            last_breakdown.1 = breakdown(&mi.requests);
        }
        out.insert("leftover_processes", leftovers as f64);
        eprintln!("run {}: {}", run + 1, line.join(", "));
        runs.push(out);
    }
    report(&args, &machine, &runs, &last_breakdown);
    Ok(())
}

/// Requests grouped by `verb resource[/subresource] code`.
fn breakdown(events: &[AuditEvent]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for e in events {
        let res = if e.subresource.is_empty() {
            e.resource.clone()
        } else {
            format!("{}/{}", e.resource, e.subresource)
        };
        *out.entry(format!("{} {res} {}", e.verb, e.code))
            .or_insert(0) += 1;
    }
    out
}

/// Median (upper of the two middle values for an even count), min and max.
fn summary(values: &[f64]) -> (f64, f64, f64) {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

type Breakdown = BTreeMap<String, usize>;

fn report(
    args: &Args,
    machine: &str,
    runs: &[BTreeMap<&'static str, f64>],
    last: &(Breakdown, Breakdown),
) {
    println!();
    println!(
        "minimal_kubelet + kube-apiserver 1.20.2, {} pods, {} runs ({machine})",
        args.pods, args.runs
    );
    println!(
        "{:<28} {:<4} {:>9} {:>9} {:>9}  what",
        "metric", "unit", "median", "min", "max"
    );
    let mut json = serde_json::Map::new();
    for m in METRICS {
        let values: Vec<f64> = runs.iter().filter_map(|r| r.get(m.key).copied()).collect();
        if values.is_empty() {
            continue;
        }
        let (med, min, max) = summary(&values);
        println!(
            "{:<28} {:<4} {:>9.1} {:>9.1} {:>9.1}  {}",
            m.key, m.unit, med, min, max, m.what
        );
        json.insert(
            m.key.to_string(),
            serde_json::json!({ "median": med, "min": min, "max": max, "values": values }),
        );
    }
    for (name, b) in [("api", &last.0), ("mirror", &last.1)] {
        if b.is_empty() {
            continue;
        }
        println!();
        println!("{name}: the agent's requests in the last run (verb resource code: count)");
        for (k, v) in b {
            println!("  {k:<40} {v:>5}");
        }
    }
    let line = serde_json::json!({
        "bench": "apiserver",
        "pods": args.pods,
        "runs": args.runs,
        "machine": machine,
        "metrics": json,
        "last_run_requests": { "api": last.0, "mirror": last.1 },
    });
    println!("JSON {line}");
}

/// What one phase measured.
#[derive(Default)]
struct Phase {
    all_running_ms: f64,
    creates_ms: f64,
    per_pod_ms: Vec<f64>,
    teardown_ms: f64,
    window_s: f64,
    requests: Vec<AuditEvent>,
    leftovers: usize,
}

/// The pod manifest of pod `i` of a phase.
fn pod_manifest(name: &str, label: &str, token: &str, node: Option<&str>) -> serde_json::Value {
    let mut spec = serde_json::json!({
        "restartPolicy": "Always",
        "containers": [{ "name": "sleep", "image": "busybox", "command": ["sleep", token] }],
    });
    if let Some(node) = node {
        spec["nodeName"] = node.into();
    }
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": NAMESPACE, "labels": { "bench-run": label } },
        "spec": spec,
    })
}

/// The `sleep` argument for pod `i` of phase `kind` in `run`.
fn token(run: usize, kind: u8, i: usize) -> String {
    format!("{}{kind}{run:02}{i:05}", token_prefix())
}

/// Prefix shared by every token of this harness process.
fn token_prefix() -> String {
    format!("{SLEEP_SECS}.{:07}", std::process::id())
}

/// Writes the manifests into `dir` (each to a dot-file, then renamed); returns the write times.
fn write_manifests(
    dir: &Path,
    run: usize,
    kind: u8,
    label: &str,
    n: usize,
) -> anyhow::Result<Vec<String>> {
    let mut names = Vec::with_capacity(n);
    for i in 0..n {
        let name = format!("{label}-{i}");
        let body = pod_manifest(&name, label, &token(run, kind, i), None);
        let tmp = dir.join(format!(".{name}.json"));
        fs::write(&tmp, body.to_string())?;
        fs::rename(&tmp, dir.join(format!("{name}.json")))?;
        names.push(name);
    }
    Ok(names)
}

fn static_phase(agent: &Path, args: &Args, run: usize) -> anyhow::Result<Phase> {
    let tmp = tempfile::Builder::new()
        .prefix("apiserver-bench-")
        .tempdir()?;
    let manifests = tmp.path().join("manifests");
    fs::create_dir_all(&manifests)?;
    let mut guard = AgentGuard::start(agent, tmp.path(), Some(&manifests), None, args.pods)?;
    guard.wait_healthz(Duration::from_secs(30))?;
    let label = format!("static-{run}");
    let t0 = Instant::now();
    let names = write_manifests(&manifests, run, 1, &label, args.pods)?;
    let full: Vec<String> = names.iter().map(|n| format!("{n}-{NODE}")).collect();
    let deadline = t0 + Duration::from_secs(args.timeout_secs);
    loop {
        let pods = get_agent_pods(guard.port)?;
        let ready = full.iter().filter(|n| pods.get(*n) == Some(&true)).count();
        if ready == args.pods {
            break;
        }
        guard.check(
            deadline,
            &format!("{ready}/{} pods Running+Ready", args.pods),
        )?;
        sleep(POLL);
    }
    let mut phase = Phase {
        all_running_ms: ms(t0.elapsed()),
        ..Phase::default()
    };
    let td = Instant::now();
    for name in &names {
        fs::remove_file(manifests.join(format!("{name}.json")))?;
    }
    let deadline = td + Duration::from_secs(args.timeout_secs);
    loop {
        let pods = get_agent_pods(guard.port)?;
        if !full.iter().any(|n| pods.contains_key(n)) {
            break;
        }
        guard.check(deadline, "pods still listed after their files were removed")?;
        sleep(POLL);
    }
    phase.teardown_ms = ms(td.elapsed());
    phase.leftovers = guard.stop();
    Ok(phase)
}

fn api_phase(
    env: &ApiServerEnv,
    api: &Api,
    agent: &Path,
    args: &Args,
    run: usize,
) -> anyhow::Result<Phase> {
    let tmp = tempfile::Builder::new()
        .prefix("apiserver-bench-")
        .tempdir()?;
    let mut guard = AgentGuard::start(
        agent,
        tmp.path(),
        None,
        Some(env.node_kubeconfig()),
        args.pods,
    )?;
    guard.wait_healthz(Duration::from_secs(30))?;
    wait_node_ready(api, &mut guard, Duration::from_secs(60))?;
    let seen = audit_ids(env);
    let w0 = Instant::now();

    let label = format!("api-{run}");
    let names: Vec<String> = (0..args.pods).map(|i| format!("{label}-{i}")).collect();
    let t0 = Instant::now();
    let creates: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let body = pod_manifest(name, &label, &token(run, 2, i), Some(NODE)).to_string();
            let api = api.clone();
            std::thread::spawn(move || {
                let sent = Instant::now();
                let r = api.request(
                    "POST",
                    &format!("/api/v1/namespaces/{NAMESPACE}/pods"),
                    Some(&body),
                );
                (sent, r)
            })
        })
        .collect();
    let mut sent_at = Vec::with_capacity(args.pods);
    for (name, c) in names.iter().zip(creates) {
        let (sent, r) = c
            .join()
            .map_err(|_| anyhow::anyhow!("create thread panicked"))?;
        let (code, body) = r?;
        if code != 201 {
            bail!("creating {name}: HTTP {code}: {body}");
        }
        sent_at.push(sent);
    }
    let creates_ms = ms(t0.elapsed());
    let list = format!("/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=bench-run%3D{label}");
    let mut first_ready: Vec<Option<Instant>> = vec![None; args.pods];
    let deadline = t0 + Duration::from_secs(args.timeout_secs);
    let all = loop {
        let now = Instant::now();
        let pods = api.list_pods(&list)?;
        for (i, name) in names.iter().enumerate() {
            if first_ready[i].is_none() && pods.get(name) == Some(&true) {
                first_ready[i] = Some(now);
            }
        }
        let ready = first_ready.iter().filter(|r| r.is_some()).count();
        if ready == args.pods {
            break now;
        }
        guard.check(
            deadline,
            &format!("{ready}/{} pods Running+Ready in the API", args.pods),
        )?;
        sleep(POLL);
    };
    let mut per_pod: Vec<f64> = first_ready
        .iter()
        .zip(&sent_at)
        .filter_map(|(r, s)| r.map(|r| ms(r - *s)))
        .collect();
    per_pod.sort_by(f64::total_cmp);

    let td = Instant::now();
    let deletes: Vec<_> = names
        .iter()
        .map(|name| {
            let api = api.clone();
            let path = format!("/api/v1/namespaces/{NAMESPACE}/pods/{name}");
            std::thread::spawn(move || api.request("DELETE", &path, None))
        })
        .collect();
    for (name, d) in names.iter().zip(deletes) {
        let (code, body) = d
            .join()
            .map_err(|_| anyhow::anyhow!("delete thread panicked"))??;
        if code != 200 && code != 202 {
            bail!("deleting {name}: HTTP {code}: {body}");
        }
    }
    let deadline = td + Duration::from_secs(args.timeout_secs);
    loop {
        let pods = api.list_pods(&list)?;
        if pods.is_empty() {
            break;
        }
        guard.check(
            deadline,
            &format!("{} pod objects left after deletion", pods.len()),
        )?;
        sleep(POLL);
    }
    let teardown_ms = ms(td.elapsed());
    let window_s = w0.elapsed().as_secs_f64();
    let requests = node_requests(env, &seen);
    let leftovers = guard.stop();
    Ok(Phase {
        all_running_ms: ms(all - t0),
        creates_ms,
        per_pod_ms: per_pod,
        teardown_ms,
        window_s,
        requests,
        leftovers,
    })
}

fn mirror_phase(
    env: &ApiServerEnv,
    api: &Api,
    agent: &Path,
    args: &Args,
    run: usize,
) -> anyhow::Result<Phase> {
    let tmp = tempfile::Builder::new()
        .prefix("apiserver-bench-")
        .tempdir()?;
    let manifests = tmp.path().join("manifests");
    fs::create_dir_all(&manifests)?;
    let mut guard = AgentGuard::start(
        agent,
        tmp.path(),
        Some(&manifests),
        Some(env.node_kubeconfig()),
        args.pods,
    )?;
    guard.wait_healthz(Duration::from_secs(30))?;
    wait_node_ready(api, &mut guard, Duration::from_secs(60))?;
    let seen = audit_ids(env);
    let w0 = Instant::now();
    let label = format!("mirror-{run}");
    let t0 = Instant::now();
    let names = write_manifests(&manifests, run, 3, &label, args.pods)?;
    let full: Vec<String> = names.iter().map(|n| format!("{n}-{NODE}")).collect();
    let list = format!("/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=bench-run%3D{label}");
    let deadline = t0 + Duration::from_secs(args.timeout_secs);
    loop {
        let pods = api.list_pods(&list)?;
        let ready = full.iter().filter(|n| pods.get(*n) == Some(&true)).count();
        if ready == args.pods {
            break;
        }
        guard.check(
            deadline,
            &format!("{ready}/{} mirror pods Running+Ready in the API", args.pods),
        )?;
        sleep(POLL);
    }
    let all_running_ms = ms(t0.elapsed());
    let td = Instant::now();
    for name in &names {
        fs::remove_file(manifests.join(format!("{name}.json")))?;
    }
    let deadline = td + Duration::from_secs(args.timeout_secs);
    loop {
        let pods = api.list_pods(&list)?;
        if pods.is_empty() {
            break;
        }
        guard.check(deadline, &format!("{} mirror pods left", pods.len()))?;
        sleep(POLL);
    }
    let teardown_ms = ms(td.elapsed());
    let window_s = w0.elapsed().as_secs_f64();
    let requests = node_requests(env, &seen);
    let leftovers = guard.stop();
    Ok(Phase {
        all_running_ms,
        teardown_ms,
        window_s,
        requests,
        leftovers,
        ..Phase::default()
    })
}

/// Audit IDs of every request so far.
fn audit_ids(env: &ApiServerEnv) -> BTreeSet<String> {
    env.audit_events().into_iter().map(|e| e.audit_id).collect()
}

/// The agent's requests not in `seen`.
fn node_requests(env: &ApiServerEnv, seen: &BTreeSet<String>) -> Vec<AuditEvent> {
    let user = format!("system:node:{NODE}");
    env.audit_events()
        .into_iter()
        .filter(|e| e.user == user && !seen.contains(&e.audit_id))
        .collect()
}

/// Waits until the agent's Node has `Ready=True` in the API.
fn wait_node_ready(api: &Api, guard: &mut AgentGuard, limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let (code, body) = api.request("GET", &format!("/api/v1/nodes/{NODE}"), None)?;
        if code == 200 {
            let node: serde_json::Value = serde_json::from_str(&body).context("Node: not JSON")?;
            if node["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
            {
                return Ok(());
            }
        }
        guard.check(deadline, "the Node is not Ready in the API")?;
        sleep(POLL);
    }
}

/// The admin's client for the API server: `curl` with the admin's client certificate.
#[derive(Clone)]
struct Api {
    url: String,
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl Api {
    fn admin(env: &ApiServerEnv) -> Self {
        let (cert, key) = env.admin_cert_and_key();
        Self {
            url: env.url().to_string(),
            ca: env.ca_file().to_path_buf(),
            cert,
            key,
        }
    }

    /// `(HTTP status, body)` of one request.
    fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> anyhow::Result<(u16, String)> {
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "-w", "\n%{http_code}", "-X", method, "--cacert"])
            .arg(&self.ca)
            .arg("--cert")
            .arg(&self.cert)
            .arg("--key")
            .arg(&self.key)
            .args(["-H", "Content-Type: application/json"]);
        if let Some(b) = body {
            cmd.args(["--data-binary", b]);
        }
        let out = cmd
            .arg(format!("{}{path}", self.url))
            .stdin(Stdio::null())
            .output()
            .context("running curl")?;
        let text = String::from_utf8_lossy(&out.stdout);
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        let code = code.trim().parse().unwrap_or(0);
        if code == 0 {
            bail!(
                "{method} {path}: no answer: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok((code, body.to_string()))
    }

    /// LIST pods: name -> Running with Ready=True.
    fn list_pods(&self, path: &str) -> anyhow::Result<BTreeMap<String, bool>> {
        let (code, body) = self.request("GET", path, None)?;
        if code != 200 {
            bail!("GET {path}: HTTP {code}: {body}");
        }
        pods_running_ready(&body)
    }
}

/// name -> (phase Running and Ready=True) for every item of a pod list.
fn pods_running_ready(body: &str) -> anyhow::Result<BTreeMap<String, bool>> {
    Ok(bench_support::pod_states(body)
        .context("pod list: not JSON")?
        .into_iter()
        .map(|(name, s)| (name, s.running_ready()))
        .collect())
}

/// `GET /pods` of the agent's read-only port: name -> Running with Ready=True.
fn get_agent_pods(port: u16) -> anyhow::Result<BTreeMap<String, bool>> {
    let (status, body) = http_get(port, "/pods")?;
    if status != 200 {
        bail!("GET /pods: HTTP {status}: {body}");
    }
    pods_running_ready(&body)
}

/// The agent process; dropping it stops the agent and kills this harness's token processes.
struct AgentGuard {
    child: Child,
    port: u16,
    log: PathBuf,
    stopped: bool,
}

impl AgentGuard {
    fn start(
        agent: &Path,
        dir: &Path,
        manifests: Option<&Path>,
        kubeconfig: Option<&Path>,
        pods: usize,
    ) -> anyhow::Result<Self> {
        let port = free_port()?;
        let log = dir.join("agent.log");
        let mut cmd = Command::new(agent);
        // The node admits `maxPods` (110 by default); beyond it pods are rejected (OutOfpods).
        if pods > 110 {
            cmd.args(["--max-pods", &pods.to_string()]);
        }
        cmd.arg("--root-dir")
            .arg(dir.join("root"))
            .arg("--pod-log-dir")
            .arg(dir.join("logs"))
            .args(["--read-only-port", &port.to_string()])
            .args([
                "--address",
                "127.0.0.1",
                "--healthz-port",
                "0",
                "--port",
                "0",
            ])
            .args(["--node-name", NODE, "--file-check-frequency", "60s"]);
        if let Some(m) = manifests {
            cmd.arg("--pod-manifest-path").arg(m);
        }
        if let Some(k) = kubeconfig {
            cmd.arg("--kubeconfig").arg(k);
        }
        let child = cmd
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log)?)
            .spawn()
            .with_context(|| format!("starting {}", agent.display()))?;
        Ok(Self {
            child,
            port,
            log,
            stopped: false,
        })
    }

    fn wait_healthz(&mut self, limit: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok((200, _)) = http_get(self.port, "/healthz") {
                return Ok(());
            }
            self.check(deadline, "/healthz not 200")?;
            sleep(POLL);
        }
    }

    /// Fails with `what` and the agent's log when the agent exited or `deadline` passed.
    fn check(&mut self, deadline: Instant, what: &str) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("agent exited ({status}); log:\n{}", tail(&self.log));
        }
        if Instant::now() > deadline {
            bail!("{what} (timed out); agent log:\n{}", tail(&self.log));
        }
        Ok(())
    }

    /// SIGINT the agent (SIGKILL after 10 s), then kill leftover token processes; returns how
    /// many leftovers there were.
    fn stop(&mut self) -> usize {
        self.stopped = true;
        let pid = Pid::from_raw(self.child.id() as i32);
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = kill(pid, Signal::SIGINT);
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(self.child.try_wait(), Ok(None)) {
                if Instant::now() > deadline {
                    eprintln!("warning: agent still running 10 s after SIGINT; killing it");
                    let _ = self.child.kill();
                    break;
                }
                sleep(Duration::from_millis(20));
            }
            let _ = self.child.wait();
        }
        kill_leftovers()
    }
}

impl Drop for AgentGuard {
    fn drop(&mut self) {
        if !self.stopped {
            self.stop();
        }
    }
}

/// SIGKILL every `sleep` carrying this harness's token prefix; returns how many.
fn kill_leftovers() -> usize {
    let prefix = token_prefix();
    let pids = find_procs(|argv| {
        argv.len() == 2
            && argv[0].rsplit('/').next() == Some("sleep")
            && argv[1].starts_with(&prefix)
    });
    for &p in &pids {
        let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
    }
    pids.len()
}

/// Pids whose argv (from `/proc/<pid>/cmdline`) matches.
fn find_procs(pred: impl Fn(&[String]) -> bool) -> Vec<i32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| {
            fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|raw| {
                let argv: Vec<String> = raw
                    .split(|&b| b == 0)
                    .filter(|a| !a.is_empty())
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect();
                pred(&argv)
            })
        })
        .collect()
}

/// A minimal HTTP/1.1 GET against 127.0.0.1 (`Connection: close`); returns (status, body).
fn http_get(port: u16, path: &str) -> anyhow::Result<(u16, String)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("malformed HTTP response")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("malformed HTTP status line")?;
    Ok((status, body.to_string()))
}

/// A port that was free a moment ago.
fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A `key=value, ...` description of the machine.
fn machine_info() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let load = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    format!(
        "cores={cores}, cpu={model}, loadavg={}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    )
}

/// Nearest-rank percentile of sorted values (0 when empty).
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The last 40 lines of a log file, for error messages.
fn tail(path: &Path) -> String {
    let s = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}
