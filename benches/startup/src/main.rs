//! `startup-bench`: the figures issue 2 asks `docs/performance.md` to record.
//!
//! For a release `minimal_kubelet` binary (built beforehand; this harness builds nothing), each run:
//!
//! 1. **Baseline.** Spawns `N` `sleep` processes directly (`std::process::Command`) and times
//!    until every one has exec'd; sums their VmRSS. This is the cost of the work without the agent.
//! 2. **Startup.** Starts the agent on fresh temp dirs (`--file-check-frequency 60s`, so only
//!    inotify delivers the manifests), waits for `GET /healthz` = 200 and then `r/R` of the 1 s
//!    relist period (run `r` of `R`, so the runs sample the PLEG's phase), then writes `N` pod
//!    manifests (one container `sleep <unique token>`, `restartPolicy: Always`; each written to a
//!    dot-file and renamed, so it lands atomically). Polls `GET /pods` every 20 ms and records the
//!    time from the first write until every pod is `Running` with `Ready=True`, plus each pod's own
//!    write-to-first-seen-`Running` time (p50/p99 across pods). Then reads the agent's
//!    `/metrics` and estimates p50/p99 of each start stage from its histograms (worker start,
//!    RunPodSandbox, ImageStatus, CreateContainer, StartContainer, the first sync, containers
//!    started, Running in status).
//! 3. **Memory.** After 5 s of steady state: the agent's VmRSS, VmHWM and PSS, the total VmRSS and
//!    PSS (`/proc/<pid>/smaps_rollup`, shared pages split among their users) of the
//!    per-container shims (processes whose argv carries `__kubelet-process-shim` and this run's
//!    root dir, found by scanning `/proc`, since shims are not always the agent's descendants) and
//!    of the container processes; compared with the baseline sleeps' total.
//! 4. **Idle CPU.** utime+stime of the agent (and of all shims) over a 10 s window
//!    (`--idle-secs`) with `N` pods running and no requests, as % of one core.
//! 5. **Teardown.** Deletes the manifests, times until `/pods` no longer lists them (60 s cap),
//!    sends SIGINT to the agent, then kills any process still carrying this harness's tokens.
//!
//! With `--containerd` the agent runs on a private containerd (`scripts/containerd-test-env.sh
//! start`, root only) through `--container-runtime-endpoint`: host-network busybox pods whose
//! shell ends on SIGTERM, containerd's shims in place of the process runtime's, and containerd's
//! own RSS and idle CPU reported next to the agent's.
//!
//! It prints a table (median, min and max over the runs) and one JSON line (prefixed `JSON `).
//! Figures are meant to be compared as ratios against the baseline measured in the same run.
//!
//! ```text
//! CARGO_TARGET_DIR=/work/target-perf cargo build --release -p minimal_kubelet -p startup-bench
//! /work/target-perf/release/startup-bench --agent /work/target-perf/release/minimal_kubelet --pods 50 --runs 3
//! ```

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bench_support::{PodState, free_port, ms};
use clap::Parser;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Argument that marks a process-runtime shim (`kubelet_process::shim::SHIM_MARKER`).
const SHIM_MARKER: &str = "__kubelet-process-shim";
/// Integer part of every `sleep` argument; the fraction carries the unique token.
const SLEEP_SECS: u32 = 86_400;
/// `GET /pods` polling period while waiting for the pods.
const POLL: Duration = Duration::from_millis(20);
/// Steady state before memory is read.
const STEADY: Duration = Duration::from_secs(5);
/// The agent's PLEG relist period (`kubelet_pleg::GENERIC_PLEG_RELIST_PERIOD`).
const RELIST_PERIOD: Duration = Duration::from_secs(1);
/// Node name given to the agent (pod names get `-bench-node` appended).
const NODE: &str = "bench-node";

/// Command-line flags.
#[derive(Debug, Parser)]
#[command(
    name = "startup-bench",
    about = "Time N static pods to Running on minimal_kubelet"
)]
struct Args {
    /// Path of a release `minimal_kubelet` binary.
    #[arg(long, default_value_os_t = default_agent())]
    agent: PathBuf,
    /// Number of pods per run.
    #[arg(long, default_value_t = 50)]
    pods: usize,
    /// Number of runs (the table shows median, min and max).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Give up waiting for the pods to be Running after this many seconds.
    #[arg(long, default_value_t = 120)]
    timeout_secs: u64,
    /// Run the agent on a private containerd (`scripts/containerd-test-env.sh start`, needs
    /// root) through `--container-runtime-endpoint` instead of its process runtime: host-network
    /// busybox pods whose shell ends on SIGTERM. The shims are containerd's
    /// (`containerd-shim-runc-v2`), and containerd's own RSS and CPU are reported too.
    #[arg(long)]
    containerd: bool,
    /// Seconds of the idle-CPU window (CPU time is counted in ticks of 10 ms: a 10 s window
    /// resolves 0.1 % of a core, a 60 s one 0.017 %).
    #[arg(long, default_value_t = 10)]
    idle_secs: u64,
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
        key: "write_offset_ms",
        unit: "ms",
        what: "delay after /healthz before the first write (relist phase)",
    },
    Metric {
        key: "baseline_spawn_ms",
        unit: "ms",
        what: "baseline: N sleeps spawned directly, all exec'd",
    },
    Metric {
        key: "all_running_ready_ms",
        unit: "ms",
        what: "first manifest write -> all N Running+Ready",
    },
    Metric {
        key: "ratio_vs_baseline",
        unit: "x",
        what: "all_running_ready / baseline_spawn",
    },
    Metric {
        key: "per_pod_running_p50_ms",
        unit: "ms",
        what: "per pod: own write -> first seen Running, p50",
    },
    Metric {
        key: "per_pod_running_p99_ms",
        unit: "ms",
        what: "per pod: own write -> first seen Running, p99",
    },
    Metric {
        key: "agent_rss_0_pods_kib",
        unit: "KiB",
        what: "agent VmRSS after /healthz, no pods",
    },
    Metric {
        key: "agent_rss_kib",
        unit: "KiB",
        what: "agent VmRSS, N pods, 5 s steady",
    },
    Metric {
        key: "agent_hwm_kib",
        unit: "KiB",
        what: "agent VmHWM (peak RSS), N pods",
    },
    Metric {
        key: "shims",
        unit: "",
        what: "shim processes found",
    },
    Metric {
        key: "shims_rss_kib",
        unit: "KiB",
        what: "shims: total VmRSS",
    },
    Metric {
        key: "shim_rss_each_kib",
        unit: "KiB",
        what: "shims: VmRSS per shim",
    },
    Metric {
        key: "shims_pss_kib",
        unit: "KiB",
        what: "shims: total PSS (shared pages split)",
    },
    Metric {
        key: "shim_pss_each_kib",
        unit: "KiB",
        what: "shims: PSS per shim",
    },
    Metric {
        key: "agent_pss_kib",
        unit: "KiB",
        what: "agent PSS, N pods",
    },
    Metric {
        key: "containers_pss_kib",
        unit: "KiB",
        what: "container sleeps: total PSS",
    },
    Metric {
        key: "baseline_pss_kib",
        unit: "KiB",
        what: "baseline sleeps: total PSS",
    },
    Metric {
        key: "overhead_pss_ratio",
        unit: "x",
        what: "(agent+shims+containers) / baseline PSS",
    },
    Metric {
        key: "containers_rss_kib",
        unit: "KiB",
        what: "container sleeps: total VmRSS",
    },
    Metric {
        key: "baseline_rss_kib",
        unit: "KiB",
        what: "baseline sleeps: total VmRSS",
    },
    Metric {
        key: "overhead_rss_ratio",
        unit: "x",
        what: "(agent+shims+containers) / baseline RSS",
    },
    Metric {
        key: "agent_idle_cpu_pct",
        unit: "%",
        what: "agent CPU, idle window (--idle-secs), % of a core",
    },
    Metric {
        key: "shims_idle_cpu_pct",
        unit: "%",
        what: "all shims CPU, same window",
    },
    Metric {
        key: "runtime_rss_kib",
        unit: "KiB",
        what: "containerd VmRSS, N pods (--containerd)",
    },
    Metric {
        key: "runtime_idle_cpu_pct",
        unit: "%",
        what: "containerd CPU, same window (--containerd)",
    },
    Metric {
        key: "teardown_ms",
        unit: "ms",
        what: "manifests deleted -> no pod in /pods",
    },
    Metric {
        key: "leftover_processes",
        unit: "",
        what: "token processes killed after teardown",
    },
];

/// The start stages read from the agent's `/metrics` after the burst: (table key prefix, family,
/// label filter, what). p50 and p99 are estimated from the histogram's buckets (linear within a
/// bucket, as Prometheus' `histogram_quantile`).
const STAGES: &[(&str, &str, &str, &str)] = &[
    (
        "stage_worker_start",
        "kubelet_pod_worker_start_duration_seconds",
        "",
        "seen → worker's first sync",
    ),
    (
        "stage_sandbox",
        "kubelet_runtime_operations_duration_seconds",
        "operation_type=\"run_podsandbox\"",
        "RunPodSandbox",
    ),
    (
        "stage_image",
        "kubelet_runtime_operations_duration_seconds",
        "operation_type=\"image_status\"",
        "ImageStatus (image check)",
    ),
    (
        "stage_create",
        "kubelet_runtime_operations_duration_seconds",
        "operation_type=\"create_container\"",
        "CreateContainer",
    ),
    (
        "stage_start",
        "kubelet_runtime_operations_duration_seconds",
        "operation_type=\"start_container\"",
        "StartContainer",
    ),
    (
        "stage_first_sync",
        "kubelet_pod_worker_duration_seconds",
        "operation_type=\"create\"",
        "the pod's first sync",
    ),
    (
        "stage_containers",
        "kubelet_pod_start_containers_duration_seconds",
        "",
        "seen → containers started",
    ),
    (
        "stage_status",
        "kubelet_pod_start_status_duration_seconds",
        "",
        "containers started → Running in status",
    ),
    (
        "stage_total",
        "kubelet_pod_start_duration_seconds",
        "",
        "seen → Running in status",
    ),
];

/// The `q` quantile (0..1) of histogram `family` (series whose labels contain `labels`) in a
/// Prometheus text exposition, estimated from its cumulative buckets; `None` without samples.
fn histogram_quantile(text: &str, family: &str, labels: &str, q: f64) -> Option<f64> {
    let prefix = format!("{family}_bucket{{");
    let mut buckets: Vec<(f64, f64)> = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(&prefix) else {
            continue;
        };
        let (set, value) = rest.split_once("} ")?;
        if !labels.is_empty() && !set.contains(labels) {
            continue;
        }
        let le = set.split("le=\"").nth(1)?.split('"').next()?;
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().ok()?
        };
        buckets.push((le, value.trim().parse().ok()?));
    }
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for (le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return Some(lower);
            }
            let within = (rank - below) / (count - below).max(f64::MIN_POSITIVE);
            return Some(lower + (le - lower) * within);
        }
        (lower, below) = (le, count);
    }
    None
}

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
        "startup-bench: agent {}, {} pods, {} runs",
        agent.display(),
        args.pods,
        args.runs
    );
    eprintln!("machine: {machine}");

    let containerd = if args.containerd {
        let env = Containerd::start("start", "startup-bench-containerd-")?;
        eprintln!("runtime: {}", env.version);
        Some(env)
    } else {
        None
    };
    let mut runs: Vec<BTreeMap<&'static str, f64>> = Vec::new();
    let mut stage_runs: Vec<StageFigures> = Vec::new();
    for run in 0..args.runs {
        let mut stages = StageFigures::new();
        let r = run_once(&agent, &args, containerd.as_ref(), run, &mut stages)
            .with_context(|| format!("run {}", run + 1))?;
        stage_runs.push(stages);
        eprintln!(
            "run {}: all Running+Ready in {:.0} ms (baseline {:.1} ms), agent RSS {:.0} KiB",
            run + 1,
            r["all_running_ready_ms"],
            r["baseline_spawn_ms"],
            r["agent_rss_kib"]
        );
        runs.push(r);
    }
    report(&args, &machine, &runs, &stage_runs);
    Ok(())
}

/// Median (upper of the two middle values for an even count), min and max.
fn summary(values: &[f64]) -> (f64, f64, f64) {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn report(
    args: &Args,
    machine: &str,
    runs: &[BTreeMap<&'static str, f64>],
    stage_runs: &[StageFigures],
) {
    println!();
    println!(
        "minimal_kubelet startup, {} pods, {} runs ({machine})",
        args.pods, args.runs
    );
    println!(
        "{:<24} {:<4} {:>9} {:>9} {:>9}  what",
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
            "{:<24} {:<4} {:>9.1} {:>9.1} {:>9.1}  {}",
            m.key, m.unit, med, min, max, m.what
        );
        json.insert(
            m.key.to_string(),
            serde_json::json!({ "median": med, "min": min, "max": max, "values": values }),
        );
    }
    println!();
    println!(
        "start stages (the agent's /metrics after the burst; median over runs of the estimated quantiles)"
    );
    println!("{:<20} {:>9} {:>9}  what", "stage", "p50 ms", "p99 ms");
    let mut stage_json = serde_json::Map::new();
    for &(key, _, _, what) in STAGES {
        let p50: Vec<f64> = stage_runs
            .iter()
            .flat_map(|r| r.iter().filter(|s| s.0 == key).map(|s| s.1))
            .collect();
        let p99: Vec<f64> = stage_runs
            .iter()
            .flat_map(|r| r.iter().filter(|s| s.0 == key).map(|s| s.2))
            .collect();
        if p50.is_empty() {
            continue;
        }
        let (p50, p99) = (summary(&p50).0, summary(&p99).0);
        println!("{key:<20} {p50:>9.1} {p99:>9.1}  {what}");
        stage_json.insert(
            key.to_string(),
            serde_json::json!({ "p50_ms": p50, "p99_ms": p99 }),
        );
    }
    let line = serde_json::json!({
        "bench": "startup",
        "stages": stage_json,
        "pods": args.pods,
        "runs": args.runs,
        "machine": machine,
        "metrics": json,
    });
    println!("JSON {line}");
}

/// A `key=value, ...` description of the machine: cores, CPU model, kernel, uid, cgroup layout.
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
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cgroup = if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        "v2"
    } else if Path::new("/sys/fs/cgroup/memory").exists() {
        "v1"
    } else {
        "none"
    };
    format!(
        "cores={cores}, cpu={model}, kernel={}, euid={}, cgroup={cgroup}",
        kernel.trim(),
        nix::unistd::geteuid()
    )
}

/// The `sleep` argument for pod/process `i` of `run`; `kind` 1 = agent pod, 2 = baseline.
fn token(run: usize, kind: u8, i: usize) -> String {
    format!("{}{kind}{run:02}{i:05}", token_prefix())
}

/// Prefix shared by every token of this harness process.
fn token_prefix() -> String {
    format!("{SLEEP_SECS}.{:07}", std::process::id())
}

/// One stage's estimated p50 and p99 in one run, ms.
type StageFigures = Vec<(&'static str, f64, f64)>;

fn run_once(
    agent: &Path,
    args: &Args,
    containerd: Option<&Containerd>,
    run: usize,
    stages: &mut StageFigures,
) -> anyhow::Result<BTreeMap<&'static str, f64>> {
    let mut out = BTreeMap::new();
    let (spawn_ms, baseline_rss, baseline_pss) = baseline(args.pods, run)?;
    out.insert("baseline_spawn_ms", spawn_ms);
    out.insert("baseline_rss_kib", baseline_rss as f64);
    out.insert("baseline_pss_kib", baseline_pss as f64);

    let tmp = tempfile::Builder::new()
        .prefix("startup-bench-")
        .tempdir()?;
    let manifests = tmp.path().join("manifests");
    let root = tmp.path().join("root");
    let logs = tmp.path().join("logs");
    fs::create_dir_all(&manifests)?;
    let port = free_port()?;
    let agent_log = tmp.path().join("agent.log");
    let mut extra_args = Vec::new();
    if let Some(endpoint) = containerd.map(Containerd::endpoint) {
        extra_args.extend(["--container-runtime-endpoint".to_string(), endpoint]);
    }
    // The node admits `maxPods` (110 by default); beyond it pods are rejected (OutOfpods).
    if args.pods > 110 {
        extra_args.extend(["--max-pods".to_string(), args.pods.to_string()]);
    }
    let mut guard = AgentGuard::start(
        agent,
        &manifests,
        &root,
        &logs,
        port,
        &agent_log,
        &extra_args,
    )?;
    let pid = guard.pid();
    wait_healthz(port, &mut guard.child, Duration::from_secs(30))
        .with_context(|| format!("agent log:\n{}", tail(&agent_log)))?;
    out.insert(
        "agent_rss_0_pods_kib",
        proc_status_kib(pid, "VmRSS:").unwrap_or(0) as f64,
    );

    // Sample the relist phase: run r of R waits r/R of the 1 s relist period after /healthz
    // (the agent relists once at start, then every second), so the runs do not all land at the
    // same point of the PLEG's cycle.
    let offset = RELIST_PERIOD.mul_f64(run as f64 / args.runs as f64);
    sleep(offset);
    out.insert("write_offset_ms", ms(offset));

    // Write the manifests.
    let names: Vec<String> = (0..args.pods).map(|i| format!("bench-{run}-{i}")).collect();
    let t0 = Instant::now();
    let mut written = Vec::with_capacity(args.pods);
    for (i, name) in names.iter().enumerate() {
        written.push(Instant::now());
        let body = match containerd {
            None => serde_json::json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": { "name": name },
                "spec": {
                    "restartPolicy": "Always",
                    "containers": [{ "name": "sleep", "image": "busybox", "command": ["sleep", token(run, 1, i)] }],
                },
            }),
            // PID 1 of a container ignores SIGTERM unless it handles it: the shell ends on it,
            // so teardown measures the work, not the grace period.
            Some(c) => serde_json::json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": { "name": name },
                "spec": {
                    "restartPolicy": "Always",
                    "hostNetwork": true,
                    "containers": [{
                        "name": "sleep",
                        "image": c.busybox,
                        "command": ["sh", "-c", format!("trap 'exit 0' TERM; sleep {} & wait", token(run, 1, i))],
                    }],
                },
            }),
        };
        let tmpfile = manifests.join(format!(".{name}.json"));
        fs::write(&tmpfile, body.to_string())?;
        fs::rename(&tmpfile, manifests.join(format!("{name}.json")))?;
    }

    // Poll until every pod is Running and Ready.
    let full: Vec<String> = names.iter().map(|n| format!("{n}-{NODE}")).collect();
    let mut first_running: Vec<Option<Instant>> = vec![None; args.pods];
    let deadline = t0 + Duration::from_secs(args.timeout_secs);
    let all_ready = loop {
        let now = Instant::now();
        let pods = get_pods(port)?;
        let mut ready = 0;
        for (i, name) in full.iter().enumerate() {
            if let Some(p) = pods.get(name) {
                if p.running && first_running[i].is_none() {
                    first_running[i] = Some(now);
                }
                if p.running && p.ready {
                    ready += 1;
                }
            }
        }
        if ready == args.pods {
            break now;
        }
        if now > deadline {
            bail!(
                "{ready}/{} pods Running+Ready after {} s; agent log:\n{}",
                args.pods,
                args.timeout_secs,
                tail(&agent_log)
            );
        }
        if let Some(status) = guard.child.try_wait()? {
            bail!("agent exited ({status}); log:\n{}", tail(&agent_log));
        }
        sleep(POLL);
    };
    let all_ms = ms(all_ready - t0);
    out.insert("all_running_ready_ms", all_ms);
    out.insert("ratio_vs_baseline", all_ms / spawn_ms.max(0.001));
    let mut per_pod: Vec<f64> = first_running
        .iter()
        .zip(&written)
        .filter_map(|(r, w)| r.map(|r| ms(r - *w)))
        .collect();
    per_pod.sort_by(f64::total_cmp);
    out.insert("per_pod_running_p50_ms", percentile(&per_pod, 0.50));
    out.insert("per_pod_running_p99_ms", percentile(&per_pod, 0.99));

    // Where the time went, from the agent's own start-stage histograms.
    let (code, metrics) = http_get(port, "/metrics")?;
    if code != 200 {
        bail!("GET /metrics: HTTP {code}");
    }
    stages.clear();
    for &(key, family, labels, _) in STAGES {
        if let (Some(p50), Some(p99)) = (
            histogram_quantile(&metrics, family, labels, 0.50),
            histogram_quantile(&metrics, family, labels, 0.99),
        ) {
            stages.push((key, p50 * 1000.0, p99 * 1000.0));
        }
    }

    // Memory after a steady period.
    sleep(STEADY);
    let agent_rss = rss_kib(pid);
    let agent_pss = pss_kib(pid);
    out.insert("agent_rss_kib", agent_rss as f64);
    out.insert("agent_pss_kib", agent_pss as f64);
    out.insert(
        "agent_hwm_kib",
        proc_status_kib(pid, "VmHWM:").unwrap_or(0) as f64,
    );
    let root_str = root.to_string_lossy().into_owned();
    let shims = match containerd {
        None => find_procs(|argv| {
            argv.iter().any(|a| a == SHIM_MARKER) && argv.iter().any(|a| a.starts_with(&root_str))
        }),
        Some(c) => {
            let socket = c.socket.to_string_lossy().into_owned();
            find_procs(|argv| {
                argv.first()
                    .is_some_and(|a| a.ends_with("containerd-shim-runc-v2"))
                    && argv
                        .windows(2)
                        .any(|w| w[0] == "-address" && w[1] == socket)
            })
        }
    };
    let each = |total: u64| total as f64 / shims.len().max(1) as f64;
    let (shims_rss, shims_pss) = (sum_kib(&shims, rss_kib), sum_kib(&shims, pss_kib));
    out.insert("shims", shims.len() as f64);
    out.insert("shims_rss_kib", shims_rss as f64);
    out.insert("shim_rss_each_kib", each(shims_rss));
    out.insert("shims_pss_kib", shims_pss as f64);
    out.insert("shim_pss_each_kib", each(shims_pss));
    let run_prefix = format!("{}1{run:02}", token_prefix());
    let containers = find_procs(|argv| is_token_sleep(argv, &run_prefix));
    let containers_rss = sum_kib(&containers, rss_kib);
    let containers_pss = sum_kib(&containers, pss_kib);
    out.insert("containers_rss_kib", containers_rss as f64);
    out.insert("containers_pss_kib", containers_pss as f64);
    out.insert(
        "overhead_rss_ratio",
        (agent_rss + shims_rss + containers_rss) as f64 / baseline_rss.max(1) as f64,
    );
    out.insert(
        "overhead_pss_ratio",
        (agent_pss + shims_pss + containers_pss) as f64 / baseline_pss.max(1) as f64,
    );

    // Idle CPU: no requests during the window.
    let tick = clock_ticks()?;
    let runtime_pid = containerd.and_then(|c| c.pid).map(|p| p as i32);
    if let Some(rp) = runtime_pid {
        out.insert("runtime_rss_kib", rss_kib(rp) as f64);
    }
    let runtime0 = runtime_pid.and_then(proc_cpu_ticks).unwrap_or(0);
    let agent0 = proc_cpu_ticks(pid).unwrap_or(0);
    let shims0: u64 = shims.iter().filter_map(|&p| proc_cpu_ticks(p)).sum();
    let w0 = Instant::now();
    sleep(Duration::from_secs(args.idle_secs));
    let window = (Instant::now() - w0).as_secs_f64();
    let agent1 = proc_cpu_ticks(pid).unwrap_or(0);
    let shims1: u64 = shims.iter().filter_map(|&p| proc_cpu_ticks(p)).sum();
    let pct = |ticks: u64| ticks as f64 / tick / window * 100.0;
    out.insert("agent_idle_cpu_pct", pct(agent1.saturating_sub(agent0)));
    out.insert("shims_idle_cpu_pct", pct(shims1.saturating_sub(shims0)));
    if let Some(rp) = runtime_pid {
        let runtime1 = proc_cpu_ticks(rp).unwrap_or(0);
        out.insert(
            "runtime_idle_cpu_pct",
            pct(runtime1.saturating_sub(runtime0)),
        );
    }

    // Teardown: delete manifests, wait for the pods to leave /pods.
    let td = Instant::now();
    for name in &names {
        fs::remove_file(manifests.join(format!("{name}.json")))?;
    }
    let td_deadline = td + Duration::from_secs(60);
    loop {
        let pods = get_pods(port)?;
        if !full.iter().any(|n| pods.contains_key(n)) {
            break;
        }
        if Instant::now() > td_deadline {
            eprintln!("warning: pods still listed 60 s after their manifests were deleted");
            break;
        }
        sleep(POLL);
    }
    out.insert("teardown_ms", ms(Instant::now() - td));
    let leftover = guard.stop();
    out.insert("leftover_processes", leftover as f64);
    Ok(out)
}

/// Spawn `n` sleeps directly; return (ms until all exec'd, their total VmRSS and PSS in KiB,
/// read 500 ms later).
fn baseline(n: usize, run: usize) -> anyhow::Result<(f64, u64, u64)> {
    let t0 = Instant::now();
    let mut children: Vec<Child> = Vec::with_capacity(n);
    let mut result = Ok(());
    for i in 0..n {
        match Command::new("sleep")
            .arg(token(run, 2, i))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
        {
            Ok(c) => children.push(c),
            Err(e) => {
                result = Err(e).context("spawning a baseline sleep");
                break;
            }
        }
    }
    // `spawn` returns once exec succeeded (std reports exec errors through a CLOEXEC pipe);
    // confirm through /proc that each process is `sleep` now.
    let pids: Vec<i32> = children.iter().map(|c| c.id() as i32).collect();
    while result.is_ok() && !pids.iter().all(|&p| comm(p).as_deref() == Some("sleep")) {
        if t0.elapsed() > Duration::from_secs(10) {
            result = Err(anyhow::anyhow!("baseline sleeps did not exec within 10 s"));
        }
        sleep(Duration::from_micros(200));
    }
    let spawn_ms = ms(t0.elapsed());
    if result.is_ok() {
        sleep(Duration::from_millis(500));
    }
    let (rss, pss) = (sum_kib(&pids, rss_kib), sum_kib(&pids, pss_kib));
    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
    result.map(|()| (spawn_ms, rss, pss))
}

/// The private containerd of `--containerd`.
type Containerd = bench_support::ContainerdEnv;

/// The agent process; dropping it stops the agent and kills this harness's token processes.
struct AgentGuard {
    child: Child,
    stopped: bool,
}

impl AgentGuard {
    fn start(
        agent: &Path,
        manifests: &Path,
        root: &Path,
        logs: &Path,
        port: u16,
        log: &Path,
        extra_args: &[String],
    ) -> anyhow::Result<Self> {
        let log_file = fs::File::create(log)?;
        let mut cmd = Command::new(agent);
        cmd.args(extra_args);
        let child = cmd
            .arg("--pod-manifest-path")
            .arg(manifests)
            .arg("--root-dir")
            .arg(root)
            .arg("--pod-log-dir")
            .arg(logs)
            .args(["--read-only-port", &port.to_string()])
            .args([
                "--address",
                "127.0.0.1",
                "--healthz-port",
                "0",
                "--port",
                "0",
            ])
            .args(["--node-name", NODE, "--file-check-frequency", "60s"])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("starting {}", agent.display()))?;
        Ok(Self {
            child,
            stopped: false,
        })
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// SIGINT the agent (SIGKILL after 10 s), then kill leftover token processes; returns how
    /// many leftovers there were.
    fn stop(&mut self) -> usize {
        self.stopped = true;
        let pid = Pid::from_raw(self.pid());
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
    let pids = find_procs(|argv| is_token_sleep(argv, &prefix));
    for &p in &pids {
        let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
    }
    pids.len()
}

fn is_token_sleep(argv: &[String], prefix: &str) -> bool {
    argv.len() == 2 && argv[0].rsplit('/').next() == Some("sleep") && argv[1].starts_with(prefix)
}

/// `GET /pods`, keyed by pod name.
fn get_pods(port: u16) -> anyhow::Result<BTreeMap<String, PodState>> {
    let (status, body) = http_get(port, "/pods")?;
    if status != 200 {
        bail!("GET /pods: HTTP {status}: {body}");
    }
    bench_support::pod_states(&body).context("GET /pods: not JSON")
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

fn wait_healthz(port: u16, child: &mut Child, limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok((200, _)) = http_get(port, "/healthz") {
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            bail!("agent exited before /healthz answered ({status})");
        }
        if Instant::now() > deadline {
            bail!("/healthz not 200 within {limit:?}");
        }
        sleep(POLL);
    }
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

fn comm(pid: i32) -> Option<String> {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim().to_string())
}

/// A `kB` field of `/proc/<pid>/status` (`VmRSS:`, `VmHWM:`).
fn proc_status_kib(pid: i32, key: &str) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// VmRSS of `pid` in KiB (0 if it is gone).
fn rss_kib(pid: i32) -> u64 {
    proc_status_kib(pid, "VmRSS:").unwrap_or(0)
}

/// Proportional set size of `pid` in KiB (`/proc/<pid>/smaps_rollup`; shared pages divided
/// among their users, so sums over processes do not count the binary's text N times).
fn pss_kib(pid: i32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Pss:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

fn sum_kib(pids: &[i32], f: fn(i32) -> u64) -> u64 {
    pids.iter().map(|&p| f(p)).sum()
}

/// utime + stime of `pid` in clock ticks.
fn proc_cpu_ticks(pid: i32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the `(comm)`: state is index 0, utime 11, stime 12.
    let fields: Vec<&str> = s.rsplit_once(')')?.1.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

fn clock_ticks() -> anyhow::Result<f64> {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)? {
        Some(t) if t > 0 => Ok(t as f64),
        _ => bail!("sysconf(CLK_TCK) gave no value"),
    }
}

/// Nearest-rank percentile of sorted values (0 when empty).
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The last 40 lines of a log file, for error messages.
fn tail(path: &Path) -> String {
    let s = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}
