//! `probe-bench`: the figures issue 4 asks `docs/performance.md` to record.
//!
//! Each scenario runs `N` probes with `periodSeconds: 1` for a warm-up and then a measured
//! window, twice: once with [`kubelet_probe::Prober`] (one scheduler, timer wheel, bounded
//! concurrency) and once with the **baseline**, one tokio task and one `tokio::time::interval`
//! per probe (the shape of the kubelet's goroutine-and-ticker workers), both doing the same probe
//! I/O (`Prober::probe_once`). The HTTP and TCP peers are hyper servers in a child process (this
//! binary re-executed with `--serve`), each on its own thread like the containers of separate
//! pods, so the CPU figures are the prober's alone; the servers' CPU is printed beside them, with
//! the machine's load average at the start and the end of the window (the machine is shared).
//!
//! Printed per scenario and implementation: probes completed per second, CPU seconds per 1,000
//! probes (utime+stime of this process over the window), p50/p99 lateness of each probe's start
//! against its schedule, and resident memory per probe (VmRSS growth from before the probes
//! were created to the end of the window, divided by `N`).
//!
//! Scenarios: `http` (10,000 GET probes against `--servers` local HTTP servers), `tcp` (1,000
//! connect probes), `exec` (200 exec probes, `/bin/true`, in 200 containers of the process
//! runtime; the cost is mostly the runtime's process spawning and is reported separately).
//!
//! ```text
//! cargo build --release -p probe-bench
//! target/release/probe-bench --scenario all --warmup 3 --window 10
//! ```

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use kubelet_api::runtime::{ContainerConfig, PodSandboxConfig};
use kubelet_api::{ContainerRuntime, EventRecorder, ProbeType};
use kubelet_net::http::{HttpGetSpec, Scheme};
use kubelet_probe::{
    ContainerObservation, Observation, Outcome, ProbeHandler, ProbeRegistration, ProbeSpec,
    ProbeTargets, ProbeTiming, Prober, ProberConfig, StaticTargets,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

#[derive(Parser, Debug)]
struct Args {
    /// `http`, `tcp`, `exec` or `all`.
    #[arg(long, default_value = "all")]
    scenario: String,
    /// HTTP probes.
    #[arg(long, default_value_t = 10_000)]
    http: usize,
    /// TCP probes.
    #[arg(long, default_value_t = 1_000)]
    tcp: usize,
    /// Exec probes (one container each).
    #[arg(long, default_value_t = 200)]
    exec: usize,
    /// Local servers the HTTP and TCP probes spread over.
    #[arg(long, default_value_t = 4)]
    servers: usize,
    /// Warm-up seconds before the window.
    #[arg(long, default_value_t = 3)]
    warmup: u64,
    /// Measured window, seconds.
    #[arg(long, default_value_t = 10)]
    window: u64,
    /// Which implementations: `both`, `prober` or `baseline`.
    #[arg(long, default_value = "both")]
    implementations: String,
    /// The prober's `max_concurrent` (default: the prober's own default).
    #[arg(long)]
    max_concurrent: Option<usize>,
    /// Internal: run the servers on these ports' listeners (child process mode).
    #[arg(long, hide = true)]
    serve: Option<usize>,
}

fn main() -> anyhow::Result<()> {
    if let Some(code) = kubelet_process::shim::maybe_run_shim() {
        std::process::exit(if code == std::process::ExitCode::SUCCESS {
            0
        } else {
            1
        });
    }
    let args = Args::parse();
    if let Some(n) = args.serve {
        return serve(n);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run(args))
}

/// Child mode: `n` HTTP/1 servers on 127.0.0.1 (answering 200 "ok" to everything), each on its
/// own thread (like the containers of separate pods, each its own process); prints the ports on
/// one line and exits when the parent closes stdin.
fn serve(n: usize) -> anyhow::Result<()> {
    let mut ports = Vec::new();
    for _ in 0..n {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.set_nonblocking(true)?;
        ports.push(l.local_addr()?.port());
        std::thread::spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("server runtime: {e}");
                    std::process::exit(1);
                }
            };
            rt.block_on(async move {
                let Ok(l) = tokio::net::TcpListener::from_std(l) else {
                    eprintln!("server listener");
                    std::process::exit(1);
                };
                loop {
                    let Ok((s, _)) = l.accept().await else {
                        continue;
                    };
                    tokio::spawn(async move {
                        let svc = hyper::service::service_fn(|_req| async {
                            Ok::<_, std::convert::Infallible>(hyper::Response::new(
                                http_body_util::Full::new(bytes::Bytes::from_static(b"ok")),
                            ))
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                            .await;
                    });
                }
            });
        });
    }
    println!(
        "{}",
        ports
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let mut buf = [0u8; 1];
    let _ = std::io::Read::read(&mut std::io::stdin(), &mut buf);
    Ok(())
}

/// Start the server child; its ports.
fn start_servers(n: usize) -> anyhow::Result<(std::process::Child, Vec<u16>)> {
    use std::io::BufRead;
    let exe = std::env::current_exe()?;
    let mut child = std::process::Command::new(exe)
        .arg("--serve")
        .arg(n.to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let out = child.stdout.take().context("server stdout")?;
    let mut line = String::new();
    std::io::BufReader::new(out).read_line(&mut line)?;
    let ports: Vec<u16> = line
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    if ports.len() != n {
        bail!("server child printed {line:?}");
    }
    Ok((child, ports))
}

/// utime+stime of this process, seconds (`/proc/self/stat`, USER_HZ = 100).
fn cpu_seconds() -> f64 {
    cpu_seconds_at("/proc/self/stat")
}

/// utime+stime of process `pid` (all its threads), seconds.
fn cpu_seconds_of(pid: u32) -> f64 {
    cpu_seconds_at(&format!("/proc/{pid}/stat"))
}

/// The machine's 1-minute load average.
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

fn cpu_seconds_at(path: &str) -> f64 {
    let stat = std::fs::read_to_string(path).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields after the command: state(0) ... utime(11) stime(12).
    (ticks(11) + ticks(12)) / 100.0
}

/// VmRSS of this process, bytes.
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

#[derive(Debug, Clone)]
struct Figures {
    probes_per_sec: f64,
    cpu_per_1000: f64,
    p50: Duration,
    p99: Duration,
    bytes_per_probe: f64,
    time_wait: usize,
    /// CPU seconds of the server child per 1,000 probes.
    server_cpu_per_1000: f64,
    /// 1-minute load average at the start and the end of the window.
    load: (f64, f64),
}

/// Sockets in TIME-WAIT on this machine (IPv4 and IPv6) right now.
fn time_wait_sockets() -> usize {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .map(|p| {
            std::fs::read_to_string(p)
                .unwrap_or_default()
                .lines()
                .skip(1)
                .filter(|l| l.split_whitespace().nth(3) == Some("06"))
                .count()
        })
        .sum()
}

impl Figures {
    fn print(&self, scenario: &str, imp: &str, n: usize) {
        println!(
            "{scenario:>5} {imp:>8} n={n:>6}  {:>9.0} probes/s  {:>7.3} CPU-s/1000 (servers {:.3})  lateness p50 {:>7.2} ms  p99 {:>8.2} ms  {:>7.0} B/probe  TIME-WAIT {:>4}  load {:.1}-{:.1}",
            self.probes_per_sec,
            self.cpu_per_1000,
            self.server_cpu_per_1000,
            self.p50.as_secs_f64() * 1e3,
            self.p99.as_secs_f64() * 1e3,
            self.bytes_per_probe,
            self.time_wait,
            self.load.0,
            self.load.1,
        );
    }
}

/// What the probes target: a handler per probe, and the targets (for exec).
struct Workload {
    handlers: Vec<ProbeHandler>,
    targets: Arc<dyn ProbeTargets>,
}

/// Every probe's container: running, pod IP 127.0.0.1.
fn populate(st: &StaticTargets, ids: &[String]) {
    let now = Instant::now();
    for (i, id) in ids.iter().enumerate() {
        st.set(
            &format!("pod-{i}"),
            "app",
            ContainerObservation::running(id.clone(), now, Some("127.0.0.1".into())),
        );
    }
}

/// Run every (scenario, implementation) pair in a fresh process of this binary, so that one
/// run's memory (the allocator keeps freed pages) does not hide the next one's growth.
fn run_children(args: &Args, scenarios: &[&str]) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let mut results: HashMap<(String, String), Figures> = HashMap::new();
    for scenario in scenarios {
        for imp in ["prober", "baseline"] {
            if args.implementations != "both" && args.implementations != imp {
                continue;
            }
            let out = std::process::Command::new(&exe)
                .args(["--scenario", scenario, "--implementations", imp])
                .args(["--http", &args.http.to_string()])
                .args(["--tcp", &args.tcp.to_string()])
                .args(["--exec", &args.exec.to_string()])
                .args(["--servers", &args.servers.to_string()])
                .args(["--warmup", &args.warmup.to_string()])
                .args(["--window", &args.window.to_string()])
                .args(
                    args.max_concurrent
                        .map(|m| vec!["--max-concurrent".to_string(), m.to_string()])
                        .unwrap_or_default(),
                )
                .output()?;
            let text = String::from_utf8_lossy(&out.stdout);
            for line in text.lines() {
                if let Some(rest) = line.strip_prefix("FIG ") {
                    let v: Vec<&str> = rest.split_whitespace().collect();
                    let num =
                        |i: usize| v.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
                    let f = Figures {
                        probes_per_sec: num(0),
                        cpu_per_1000: num(1),
                        p50: Duration::from_micros(num(2) as u64),
                        p99: Duration::from_micros(num(3) as u64),
                        bytes_per_probe: num(4),
                        time_wait: num(5) as usize,
                        server_cpu_per_1000: num(6),
                        load: (num(7), num(8)),
                    };
                    let n = match *scenario {
                        "http" => args.http,
                        "tcp" => args.tcp,
                        _ => args.exec,
                    };
                    f.print(scenario, imp, n);
                    results.insert((scenario.to_string(), imp.to_string()), f);
                }
            }
            if !out.status.success() {
                bail!(
                    "{scenario}/{imp} failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
    print_ratios(&results);
    Ok(())
}

fn print_ratios(results: &HashMap<(String, String), Figures>) {
    for scenario in ["http", "tcp", "exec"] {
        let (Some(p), Some(b)) = (
            results.get(&(scenario.to_string(), "prober".to_string())),
            results.get(&(scenario.to_string(), "baseline".to_string())),
        ) else {
            continue;
        };
        println!(
            "{scenario:>5} prober/baseline: throughput x{:.2}, CPU per probe x{:.2}, p50 lateness x{:.2}, p99 lateness x{:.2}, memory per probe x{:.2}",
            p.probes_per_sec / b.probes_per_sec.max(1e-9),
            p.cpu_per_1000 / b.cpu_per_1000.max(1e-9),
            p.p50.as_secs_f64() / b.p50.as_secs_f64().max(1e-9),
            p.p99.as_secs_f64() / b.p99.as_secs_f64().max(1e-9),
            p.bytes_per_probe / b.bytes_per_probe.max(1e-9),
        );
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let scenarios: Vec<&str> = match args.scenario.as_str() {
        "all" => vec!["http", "tcp", "exec"],
        s => vec![s],
    };
    if scenarios.len() > 1 || args.implementations == "both" {
        return run_children(&args, &scenarios);
    }
    let (mut child, ports) = start_servers(args.servers)?;
    let server_pid = child.id();
    let mut results: HashMap<(String, String), Figures> = HashMap::new();
    for scenario in scenarios {
        for imp in ["prober", "baseline"] {
            if args.implementations != "both" && args.implementations != imp {
                continue;
            }
            let (n, rss0, work, cleanup) = match scenario {
                "http" | "tcp" => {
                    let n = if scenario == "http" {
                        args.http
                    } else {
                        args.tcp
                    };
                    let handlers = (0..n)
                        .map(|i| {
                            let port = ports[i % ports.len()];
                            if scenario == "http" {
                                ProbeHandler::HttpGet(HttpGetSpec::new(
                                    Scheme::Http,
                                    port,
                                    "/healthz",
                                ))
                            } else {
                                ProbeHandler::TcpSocket { host: None, port }
                            }
                        })
                        .collect();
                    let st = StaticTargets::new();
                    let ids: Vec<String> = (0..n).map(|i| format!("c{i}")).collect();
                    populate(&st, &ids);
                    let rss0 = rss_bytes();
                    let work = Workload {
                        handlers,
                        targets: Arc::new(st.clone()),
                    };
                    (n, rss0, work, None)
                }
                "exec" => {
                    let n = args.exec;
                    let dir = tempfile::tempdir()?;
                    let rt = Arc::new(kubelet_process::ProcessRuntime::new(
                        kubelet_process::ProcessRuntimeConfig::new(dir.path().join("state"))
                            .shim(kubelet_process::ShimCommand::CurrentExe)
                            .use_cgroups(false),
                    )?);
                    let sb = {
                        let mut v = PodSandboxConfig::default();
                        v.log_directory = dir.path().join("logs");
                        v
                    };
                    let sid = rt.run_pod_sandbox(&sb).await?;
                    let mut ids = Vec::new();
                    for i in 0..n {
                        let c = {
                            let mut v = ContainerConfig::default();
                            v.command = vec!["/bin/sleep".into(), "3600".into()];
                            v.log_path = format!("c{i}/0.log");
                            v
                        };
                        let cid = rt.create_container(&sid, &c, &sb).await?;
                        rt.start_container(&cid).await?;
                        ids.push(cid);
                    }
                    let st = StaticTargets::with_runtime(rt.clone());
                    populate(&st, &ids);
                    let rss0 = rss_bytes();
                    let work = Workload {
                        handlers: (0..n)
                            .map(|_| ProbeHandler::Exec {
                                command: vec!["/bin/true".into()],
                            })
                            .collect(),
                        targets: Arc::new(st.clone()),
                    };
                    (n, rss0, work, Some((rt, sid, dir)))
                }
                other => bail!("unknown scenario {other}"),
            };
            let f = if imp == "prober" {
                run_prober(&args, n, rss0, work, server_pid).await
            } else {
                run_baseline(&args, n, rss0, work, server_pid).await
            };
            println!(
                "FIG {} {} {} {} {} {} {} {} {}",
                f.probes_per_sec,
                f.cpu_per_1000,
                f.p50.as_micros(),
                f.p99.as_micros(),
                f.bytes_per_probe,
                f.time_wait,
                f.server_cpu_per_1000,
                f.load.0,
                f.load.1,
            );
            results.insert((scenario.to_string(), imp.to_string()), f);
            if let Some((rt, sid, _dir)) = cleanup {
                rt.stop_pod_sandbox(&sid).await?;
                rt.remove_pod_sandbox(&sid).await?;
            }
            // Let sockets and tasks of the run settle before the next one.
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }
    drop(child.stdin.take());
    let _ = child.kill();
    let _ = child.wait();
    Ok(())
}

async fn run_prober(args: &Args, n: usize, rss0: u64, work: Workload, server_pid: u32) -> Figures {
    let mut config = ProberConfig::default();
    if let Some(m) = args.max_concurrent {
        config = config.max_concurrent(m);
    }
    // The receiver of result changes stays open for the whole run, as in the engine.
    let (prober, _updates) = Prober::new(config);
    let prober = Arc::new(prober);
    for (i, h) in work.handlers.into_iter().enumerate() {
        let uid = format!("pod-{i}");
        let mut timing = ProbeTiming::with_period(Duration::from_secs(1));
        timing.failure_threshold = 3;
        prober.add_probe(ProbeRegistration::new(
            uid,
            "app",
            ProbeType::Readiness,
            ProbeSpec::new(h, timing),
        ));
    }
    let stop = CancellationToken::new();
    let task = {
        let p = prober.clone();
        let t = work.targets.clone();
        let s = stop.clone();
        tokio::spawn(async move { p.run_with(t, EventRecorder::log_only(), s).await })
    };
    tokio::time::sleep(Duration::from_secs(args.warmup)).await;
    prober.reset_stats();
    let (cpu0, server0, load0) = (cpu_seconds(), cpu_seconds_of(server_pid), load_average());
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.window)).await;
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let server_cpu = cpu_seconds_of(server_pid) - server0;
    let load1 = load_average();
    let stats = prober.stats();
    let rss = rss_bytes();
    stop.cancel();
    let _ = task.await;
    Figures {
        probes_per_sec: stats.completed as f64 / secs,
        cpu_per_1000: cpu / (stats.completed.max(1) as f64) * 1000.0,
        p50: stats.lateness_p50,
        p99: stats.lateness_p99,
        bytes_per_probe: rss.saturating_sub(rss0) as f64 / n as f64,
        time_wait: time_wait_sockets(),
        server_cpu_per_1000: server_cpu / (stats.completed.max(1) as f64) * 1000.0,
        load: (load0, load1),
    }
}

/// Lateness histogram of the baseline, same buckets as the prober's (50 µs to 100 ms, then
/// 10 ms to 10 s).
struct Hist {
    buckets: Vec<AtomicU64>,
    completed: AtomicU64,
}

impl Hist {
    fn new() -> Self {
        Self {
            buckets: (0..2991).map(|_| AtomicU64::new(0)).collect(),
            completed: AtomicU64::new(0),
        }
    }
    fn record(&self, late: Duration) {
        let us = late.as_micros() as u64;
        let i = if us < 100_000 {
            (us / 50) as usize
        } else {
            (2000 + (us - 100_000) / 10_000).min(2990) as usize
        };
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
    }
    fn reset(&self) {
        for b in &self.buckets {
            b.store(0, Ordering::Relaxed);
        }
        self.completed.store(0, Ordering::Relaxed);
    }
    fn quantile(&self, q: f64) -> Duration {
        let counts: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return Duration::ZERO;
        }
        let rank = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let i = i as u64;
                let upper = if i < 2000 {
                    (i + 1) * 50
                } else {
                    100_000 + (i - 2000 + 1) * 10_000
                };
                return Duration::from_micros(upper);
            }
        }
        Duration::from_secs(10)
    }
}

/// Metric labels of the baseline (the kubelet's names).
type Labels = Vec<(&'static str, String)>;

async fn run_baseline(
    args: &Args,
    n: usize,
    rss0: u64,
    work: Workload,
    server_pid: u32,
) -> Figures {
    let hist = Arc::new(Hist::new());
    let (prober, _updates) = Prober::new(ProberConfig::default());
    let prober = Arc::new(prober);
    let stop = CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();
    let total: Family<Labels, Counter> = Family::default();
    let duration: Family<Labels, Histogram, fn() -> Histogram> =
        Family::new_with_constructor(|| {
            Histogram::new([
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ])
        });
    let results: Arc<parking_lot::RwLock<HashMap<String, bool>>> = Arc::default();
    for (i, h) in work.handlers.into_iter().enumerate() {
        let hist = hist.clone();
        let prober = prober.clone();
        let targets = work.targets.clone();
        let stop = stop.clone();
        let results = results.clone();
        let uid = format!("pod-{i}");
        let labels = |result: &str| {
            vec![
                ("probe_type", "Readiness".to_string()),
                ("result", result.to_string()),
                ("container", "app".to_string()),
                ("pod", uid.clone()),
                ("namespace", "default".to_string()),
                ("pod_uid", uid.clone()),
            ]
        };
        let ok = total.get_or_create_owned(&labels("successful"));
        let failed = total.get_or_create_owned(&labels("failed"));
        let seconds = duration.get_or_create_owned(&vec![
            ("probe_type", "Readiness".to_string()),
            ("container", "app".to_string()),
            ("pod", uid.clone()),
            ("namespace", "default".to_string()),
        ]);
        // The same first-probe jitter as the prober after an agent start.
        let jitter = Duration::from_nanos((i as u64).wrapping_mul(2_654_435_761) % 1_000_000_000);
        tasks.spawn(async move {
            let mut ticker =
                tokio::time::interval_at(Instant::now() + jitter, Duration::from_secs(1));
            // A Go ticker: missed ticks are dropped, the phase is kept (as the prober's schedule).
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let (mut last, mut run) = (None, 0u32);
            loop {
                let due = tokio::select! {
                    _ = stop.cancelled() => return,
                    t = ticker.tick() => t,
                };
                hist.record(Instant::now().saturating_duration_since(due));
                // The same work per tick as the prober: observe, probe, count, threshold.
                let Observation::Container(c) = targets.observe(&uid, "app") else {
                    continue;
                };
                let start = Instant::now();
                let out = prober
                    .probe_once(
                        &h,
                        c.pod_ip.as_deref(),
                        &c.container_id,
                        Duration::from_secs(1),
                        targets.as_ref(),
                    )
                    .await;
                let success = matches!(out, Outcome::Success(_) | Outcome::Warning(_));
                if success {
                    ok.inc();
                    seconds.observe(start.elapsed().as_secs_f64());
                } else {
                    failed.inc();
                }
                if last == Some(success) {
                    run += 1;
                } else {
                    last = Some(success);
                    run = 1;
                }
                if run >= if success { 1 } else { 3 } {
                    results.write().insert(c.container_id.clone(), success);
                }
                hist.completed.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    tokio::time::sleep(Duration::from_secs(args.warmup)).await;
    hist.reset();
    let (cpu0, server0, load0) = (cpu_seconds(), cpu_seconds_of(server_pid), load_average());
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.window)).await;
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let server_cpu = cpu_seconds_of(server_pid) - server0;
    let load1 = load_average();
    let completed = hist.completed.load(Ordering::Relaxed);
    let rss = rss_bytes();
    let figures = Figures {
        probes_per_sec: completed as f64 / secs,
        cpu_per_1000: cpu / (completed.max(1) as f64) * 1000.0,
        p50: hist.quantile(0.5),
        p99: hist.quantile(0.99),
        bytes_per_probe: rss.saturating_sub(rss0) as f64 / n as f64,
        time_wait: time_wait_sockets(),
        server_cpu_per_1000: server_cpu / (completed.max(1) as f64) * 1000.0,
        load: (load0, load1),
    };
    stop.cancel();
    while tasks.join_next().await.is_some() {}
    figures
}
