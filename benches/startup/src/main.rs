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
    /// Sweep these pod counts (comma-separated, e.g. `110,250,500,1000`) instead of `--pods`:
    /// `--runs` runs of each, then a scaling table (each size against the one before) and, with
    /// `--plot`, an SVG of the slope.
    #[arg(long, value_delimiter = ',')]
    sweep: Vec<usize>,
    /// Where the pods come from: `file` (manifests written into `--pod-manifest-path`, deleted
    /// to remove) or `push` (the agent's push endpoint: one `POST /pods` per pod, one `DELETE`
    /// per pod to remove).
    #[arg(long, value_enum, default_value_t = Source::File)]
    source: Source,
    /// With `--sweep`: write the plot (time to all Running and to all removed, and the agent's
    /// RSS, against the pod count, next to the shell-loop baseline) to this SVG file.
    #[arg(long)]
    plot: Option<PathBuf>,
}

/// The pod source a run feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Source {
    /// Manifest files in the agent's `--pod-manifest-path`.
    File,
    /// The agent's pod push endpoint (`--pod-push-address`).
    Push,
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
        what: "baseline: N sleeps started by a shell loop, all exec'd",
    },
    Metric {
        key: "baseline_kill_ms",
        unit: "ms",
        what: "baseline: the N sleeps sent SIGTERM, all gone",
    },
    Metric {
        key: "all_running_ready_ms",
        unit: "ms",
        what: "first pod written (file or POST) -> all N Running+Ready",
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
        what: "pods deleted (files or DELETEs) -> no pod in /pods",
    },
    Metric {
        key: "runtime_calls_per_pod_start",
        unit: "",
        what: "runtime calls (kubelet_runtime_operations_total) per pod, first write -> all Running",
    },
    Metric {
        key: "runtime_calls_per_pod_removal",
        unit: "",
        what: "runtime calls per pod, first delete -> none in /pods",
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
    let sizes = if args.sweep.is_empty() {
        vec![args.pods]
    } else {
        args.sweep.clone()
    };
    if sizes.contains(&0) || args.runs == 0 {
        bail!("--pods, every --sweep size and --runs must be at least 1");
    }
    let agent = args.agent.canonicalize().with_context(|| {
        format!(
            "--agent {}: build it with `cargo build --release -p minimal_kubelet`",
            args.agent.display()
        )
    })?;
    let machine = machine_info();
    eprintln!(
        "startup-bench: agent {}, {sizes:?} pods, {} runs, source {:?}",
        agent.display(),
        args.runs,
        args.source
    );
    eprintln!("machine: {machine}");

    let containerd = if args.containerd {
        let env = Containerd::start("start", "startup-bench-containerd-")?;
        eprintln!("runtime: {}", env.version);
        Some(env)
    } else {
        None
    };
    let mut rows = Vec::new();
    for &pods in &sizes {
        let mut runs: Vec<BTreeMap<&'static str, f64>> = Vec::new();
        let mut stage_runs: Vec<StageFigures> = Vec::new();
        for run in 0..args.runs {
            let mut stages = StageFigures::new();
            let r = run_once(&agent, &args, pods, containerd.as_ref(), run, &mut stages)
                .with_context(|| format!("{pods} pods, run {}", run + 1))?;
            stage_runs.push(stages);
            eprintln!(
                "{pods} pods, run {}: all Running+Ready in {:.0} ms (baseline {:.1} ms), removed in {:.0} ms, agent RSS {:.0} KiB",
                run + 1,
                r["all_running_ready_ms"],
                r["baseline_spawn_ms"],
                r["teardown_ms"],
                r["agent_rss_kib"]
            );
            runs.push(r);
        }
        rows.push(report(&args, pods, &machine, &runs, &stage_runs));
    }
    if sizes.len() > 1 {
        sweep_report(&args, &machine, &sizes, &rows);
        if let Some(path) = &args.plot {
            fs::write(path, sweep_plot(&args, &sizes, &rows))
                .with_context(|| format!("writing {}", path.display()))?;
            eprintln!("plot written to {}", path.display());
        }
    }
    Ok(())
}

/// The medians of one size's runs, by metric key.
type Medians = BTreeMap<&'static str, f64>;

/// The scaling table: each size's medians and its ratio to the size before.
fn sweep_report(args: &Args, machine: &str, sizes: &[usize], rows: &[Medians]) {
    println!();
    println!(
        "scaling sweep, source {:?}, {} runs per size ({machine})",
        args.source, args.runs
    );
    println!(
        "{:>6} {:>10} {:>6} {:>10} {:>10} {:>6} {:>10} {:>9} {:>9} {:>7} {:>7} {:>7}",
        "pods",
        "Running s",
        "x",
        "loop s",
        "removed s",
        "x",
        "loop s",
        "RSS MiB",
        "goal MiB",
        "idle %",
        "calls+",
        "calls-"
    );
    let get = |r: &Medians, k: &str| r.get(k).copied().unwrap_or(f64::NAN);
    let mut json = Vec::new();
    for (i, (&pods, r)) in sizes.iter().zip(rows).enumerate() {
        let ratio = |k: &str| {
            i.checked_sub(1)
                .map_or(f64::NAN, |p| get(r, k) / get(&rows[p], k))
        };
        let goal_mib = rss_goal_mib(pods);
        println!(
            "{:>6} {:>10.2} {:>6.2} {:>10.3} {:>10.2} {:>6.2} {:>10.3} {:>9.1} {:>9.1} {:>7.2} {:>7.1} {:>7.1}",
            pods,
            get(r, "all_running_ready_ms") / 1000.0,
            ratio("all_running_ready_ms"),
            get(r, "baseline_spawn_ms") / 1000.0,
            get(r, "teardown_ms") / 1000.0,
            ratio("teardown_ms"),
            get(r, "baseline_kill_ms") / 1000.0,
            get(r, "agent_rss_kib") / 1024.0,
            goal_mib,
            get(r, "agent_idle_cpu_pct"),
            get(r, "runtime_calls_per_pod_start"),
            get(r, "runtime_calls_per_pod_removal"),
        );
        json.push(serde_json::json!({ "pods": pods, "medians": r, "rss_goal_mib": goal_mib }));
    }
    println!(
        "(x: against the size before; loop: the same processes started / sent SIGTERM by a shell loop; \
         goal: 12 MiB + 40 KiB per pod; calls+/-: runtime calls per pod to start / to remove)"
    );
    let line = serde_json::json!({
        "bench": "startup-sweep",
        "source": format!("{:?}", args.source),
        "containerd": args.containerd,
        "runs": args.runs,
        "machine": machine,
        "sizes": json,
    });
    println!("JSON {line}");
}

/// Issue 36's memory goal: 12 MiB + 40 KiB per pod, in MiB.
fn rss_goal_mib(pods: usize) -> f64 {
    12.0 + 40.0 * pods as f64 / 1024.0
}

/// The sweep as an SVG: times against pods (ours, the shell loop, and a line proportional to the
/// pod count from the smallest size), and the agent's RSS against the goal.
fn sweep_plot(args: &Args, sizes: &[usize], rows: &[Medians]) -> String {
    use bench_support::{Series, line_chart, svg_document};
    let points = |key: &str, scale: f64| -> Vec<(f64, f64)> {
        sizes
            .iter()
            .zip(rows)
            .filter_map(|(&n, r)| r.get(key).map(|v| (n as f64, v * scale)))
            .collect()
    };
    let running = points("all_running_ready_ms", 0.001);
    let linear: Vec<(f64, f64)> = match running.first() {
        Some(&(n0, t0)) => running.iter().map(|&(n, _)| (n, t0 * n / n0)).collect(),
        None => Vec::new(),
    };
    let runtime = if args.containerd {
        "containerd"
    } else {
        "process runtime"
    };
    let times = [
        Series {
            name: "agent: all Running".into(),
            colour: "#c0392b",
            dashed: false,
            points: running,
        },
        Series {
            name: "agent: all removed".into(),
            colour: "#2471a3",
            dashed: false,
            points: points("teardown_ms", 0.001),
        },
        Series {
            name: "linear from the smallest size".into(),
            colour: "#999999",
            dashed: true,
            points: linear,
        },
        Series {
            name: "shell loop: started".into(),
            colour: "#c0392b",
            dashed: true,
            points: points("baseline_spawn_ms", 0.001),
        },
        Series {
            name: "shell loop: killed".into(),
            colour: "#2471a3",
            dashed: true,
            points: points("baseline_kill_ms", 0.001),
        },
    ];
    let rss = [
        Series {
            name: "agent VmRSS".into(),
            colour: "#c0392b",
            dashed: false,
            points: points("agent_rss_kib", 1.0 / 1024.0),
        },
        Series {
            name: "goal: 12 MiB + 40 KiB per pod".into(),
            colour: "#999999",
            dashed: true,
            points: sizes.iter().map(|&n| (n as f64, rss_goal_mib(n))).collect(),
        },
    ];
    let source = format!("{:?}", args.source).to_lowercase();
    svg_document(
        960.0,
        420.0,
        &[
            line_chart(
                &format!("Time to all Running / removed ({runtime}, {source} source)"),
                "pods",
                "seconds",
                &times,
                (0.0, 0.0, 480.0, 420.0),
            ),
            line_chart(
                "Agent memory with N pods",
                "pods",
                "MiB",
                &rss,
                (480.0, 0.0, 480.0, 420.0),
            ),
        ],
    )
}

/// Median (upper of the two middle values for an even count), min and max.
fn summary(values: &[f64]) -> (f64, f64, f64) {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// Prints one size's table and JSON line; returns its medians.
fn report(
    args: &Args,
    pods: usize,
    machine: &str,
    runs: &[BTreeMap<&'static str, f64>],
    stage_runs: &[StageFigures],
) -> Medians {
    println!();
    println!(
        "minimal_kubelet startup, {pods} pods, {} runs, source {:?} ({machine})",
        args.runs, args.source
    );
    println!(
        "{:<24} {:<4} {:>9} {:>9} {:>9}  what",
        "metric", "unit", "median", "min", "max"
    );
    let mut json = serde_json::Map::new();
    let mut medians = Medians::new();
    for m in METRICS {
        let values: Vec<f64> = runs.iter().filter_map(|r| r.get(m.key).copied()).collect();
        if values.is_empty() {
            continue;
        }
        let (med, min, max) = summary(&values);
        medians.insert(m.key, med);
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
        "pods": pods,
        "source": format!("{:?}", args.source),
        "runs": args.runs,
        "machine": machine,
        "metrics": json,
    });
    println!("JSON {line}");
    medians
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
    pods: usize,
    containerd: Option<&Containerd>,
    run: usize,
    stages: &mut StageFigures,
) -> anyhow::Result<BTreeMap<&'static str, f64>> {
    let mut out = BTreeMap::new();
    let (spawn_ms, baseline_rss, baseline_pss, kill_ms) = baseline(pods, run)?;
    out.insert("baseline_spawn_ms", spawn_ms);
    out.insert("baseline_kill_ms", kill_ms);
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
    if pods > 110 {
        extra_args.extend(["--max-pods".to_string(), pods.to_string()]);
    }
    let push = match args.source {
        Source::File => None,
        Source::Push => {
            let push_port = free_port()?;
            let token = format!("startup-bench-{}", std::process::id());
            let token_file = tmp.path().join("push-tokens");
            fs::write(&token_file, format!("{token}\n"))?;
            extra_args.extend([
                "--pod-push-address".to_string(),
                format!("127.0.0.1:{push_port}"),
                "--pod-push-token-file".to_string(),
                token_file.to_string_lossy().into_owned(),
            ]);
            Some(Pusher {
                port: push_port,
                token,
            })
        }
    };
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

    // Runtime calls so far (the agent's start), so a size's count is its pods' alone.
    let calls_at_start = runtime_calls_by_op(&get_metrics(port)?);

    // Write the manifests.
    let names: Vec<String> = (0..pods).map(|i| format!("bench-{run}-{i}")).collect();
    let t0 = Instant::now();
    let mut written = Vec::with_capacity(pods);
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
        match &push {
            None => {
                let tmpfile = manifests.join(format!(".{name}.json"));
                fs::write(&tmpfile, body.to_string())?;
                fs::rename(&tmpfile, manifests.join(format!("{name}.json")))?;
            }
            Some(p) => p.send("POST", "/pods", Some(&body.to_string()), 201)?,
        }
    }

    // Poll until every pod is Running and Ready.
    let full: Vec<String> = names.iter().map(|n| format!("{n}-{NODE}")).collect();
    let mut first_running: Vec<Option<Instant>> = vec![None; pods];
    let deadline = t0 + Duration::from_secs(args.timeout_secs);
    let all_ready = loop {
        let now = Instant::now();
        let listed = get_pods(port)?;
        let mut ready = 0;
        for (i, name) in full.iter().enumerate() {
            if let Some(p) = listed.get(name) {
                if p.running && first_running[i].is_none() {
                    first_running[i] = Some(now);
                }
                if p.running && p.ready {
                    ready += 1;
                }
            }
        }
        if ready == pods {
            break now;
        }
        if now > deadline {
            bail!(
                "{ready}/{} pods Running+Ready after {} s; agent log:\n{}",
                pods,
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
    let metrics = get_metrics(port)?;
    let calls_running = runtime_calls_by_op(&metrics);
    out.insert(
        "runtime_calls_per_pod_start",
        (calls_total(&calls_running) - calls_total(&calls_at_start)) / pods as f64,
    );
    eprintln!(
        "runtime calls per pod to start: {}",
        calls_per_pod(&calls_at_start, &calls_running, pods)
    );
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
    let ops_before = runtime_calls_by_op(&get_metrics(port)?);
    let td = Instant::now();
    for name in &names {
        match &push {
            None => fs::remove_file(manifests.join(format!("{name}.json")))?,
            Some(p) => p.send("DELETE", &format!("/pods/default/{name}"), None, 200)?,
        }
    }
    let td_deadline = td + Duration::from_secs(60);
    loop {
        let listed = get_pods(port)?;
        if !full.iter().any(|n| listed.contains_key(n)) {
            break;
        }
        if Instant::now() > td_deadline {
            eprintln!("warning: pods still listed 60 s after their manifests were deleted");
            break;
        }
        sleep(POLL);
    }
    out.insert("teardown_ms", ms(Instant::now() - td));
    let ops_after = runtime_calls_by_op(&get_metrics(port)?);
    eprintln!(
        "runtime calls per pod to remove: {}",
        calls_per_pod(&ops_before, &ops_after, pods)
    );
    out.insert(
        "runtime_calls_per_pod_removal",
        (calls_total(&ops_after) - calls_total(&ops_before)) / pods as f64,
    );
    let leftover = guard.stop();
    out.insert("leftover_processes", leftover as f64);
    Ok(out)
}

/// The baseline: `n` sleeps started by one shell loop (`for t; do sleep "$t" & done; wait`).
/// Returns (ms until every one has exec'd, their total VmRSS and PSS in KiB read 500 ms later,
/// ms from sending each SIGTERM until none is left).
fn baseline(n: usize, run: usize) -> anyhow::Result<(f64, u64, u64, f64)> {
    let tokens: Vec<String> = (0..n).map(|i| token(run, 2, i)).collect();
    let prefix = format!("{}2{run:02}", token_prefix());
    let t0 = Instant::now();
    let mut shell = Command::new("sh")
        .arg("-c")
        .arg(r#"for t in "$@"; do sleep "$t" & done; wait"#)
        .arg("sh")
        .args(&tokens)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting the baseline shell loop")?;
    // A forked child shows the shell's argv until it has exec'd `sleep`.
    let pids = loop {
        let pids = find_procs(|argv| is_token_sleep(argv, &prefix));
        if pids.len() == n {
            break pids;
        }
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = shell.kill();
            kill_leftovers();
            bail!("{} of {n} baseline sleeps exec'd within 60 s", pids.len());
        }
        sleep(Duration::from_millis(1));
    };
    let spawn_ms = ms(t0.elapsed());
    sleep(Duration::from_millis(500));
    let (rss, pss) = (sum_kib(&pids, rss_kib), sum_kib(&pids, pss_kib));
    let t1 = Instant::now();
    for &p in &pids {
        let _ = kill(Pid::from_raw(p), Signal::SIGTERM);
    }
    // The shell reaps them (`wait`); a reaped or zombie process no longer shows its argv.
    while !find_procs(|argv| is_token_sleep(argv, &prefix)).is_empty() {
        if t1.elapsed() > Duration::from_secs(60) {
            break;
        }
        sleep(Duration::from_millis(1));
    }
    let kill_ms = ms(t1.elapsed());
    let _ = shell.kill();
    let _ = shell.wait();
    Ok((spawn_ms, rss, pss, kill_ms))
}

/// The agent's push endpoint and the bearer token it accepts.
struct Pusher {
    port: u16,
    token: String,
}

impl Pusher {
    /// One request; fails unless the answer is `expect`.
    fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
        expect: u16,
    ) -> anyhow::Result<()> {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        let body = body.unwrap_or("");
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.token,
            body.len()
        )?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf)?;
        let text = String::from_utf8_lossy(&buf);
        let code: u16 = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .context("malformed HTTP status line")?;
        if code != expect {
            bail!("{method} {path}: HTTP {code}, expected {expect}: {text}");
        }
        Ok(())
    }
}

/// `GET /metrics` of the agent's read-only port.
fn get_metrics(port: u16) -> anyhow::Result<String> {
    let (code, metrics) = http_get(port, "/metrics")?;
    if code != 200 {
        bail!("GET /metrics: HTTP {code}");
    }
    Ok(metrics)
}

/// `kubelet_runtime_operations_total` by operation type.
fn runtime_calls_by_op(metrics: &str) -> BTreeMap<String, f64> {
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix("kubelet_runtime_operations_total{"))
        .filter_map(|l| {
            let (labels, value) = l.split_once("} ")?;
            let op = labels
                .split("operation_type=\"")
                .nth(1)?
                .split('"')
                .next()?;
            Some((op.to_string(), value.trim().parse::<f64>().ok()?))
        })
        .collect()
}

/// All calls of a [`runtime_calls_by_op`] reading.
fn calls_total(by_op: &BTreeMap<String, f64>) -> f64 {
    by_op.values().sum()
}

/// Per pod, the calls of each operation type between two readings, largest first.
fn calls_per_pod(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
    pods: usize,
) -> String {
    let mut v: Vec<(String, f64)> = after
        .iter()
        .map(|(op, n)| {
            (
                op.clone(),
                (n - before.get(op).unwrap_or(&0.0)) / pods as f64,
            )
        })
        .filter(|(_, n)| *n > 0.0)
        .collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1));
    v.iter()
        .map(|(op, n)| format!("{op} {n:.2}"))
        .collect::<Vec<_>>()
        .join(", ")
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
