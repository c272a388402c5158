//! `eviction-bench`: how long after a memory threshold is crossed the eviction manager notices,
//! and how long until the victim is dead, at several allocation rates.
//!
//! As root, the harness creates a memory cgroup with a limit that stands for "the node", starts a
//! hog process in it (this binary, `hog` mode) that allocates quickly to just below the threshold
//! and then at the measured rate up to beyond the limit, and runs a fresh `EvictionManager` per
//! run whose `PodControl` sends the hog SIGTERM. Ground truth for the crossing is the hog's own
//! timeline: after each 256 KiB chunk it reads the cgroup's usage counter and prints it with
//! CLOCK_MONOTONIC. Three modes run in the same invocation:
//!
//! * `kubelet-10s`: the kubelet's behaviour, a full synchronisation every 10 s and nothing else
//!   (the baseline), once with a hog that stops below the limit (detection latency) and once
//!   (`kubelet-10s*`) with one that grows past it (eviction or OOM kill first?);
//! * `poll-100ms`: the cheap memory poll every 100 ms, no kernel notifications;
//! * `poll+kernel`: the default, poll plus memcg threshold eventfd / PSI / inotify.
//!
//! `cargo run --release -p eviction-bench -- --runs 10`

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use async_trait::async_trait;
use clap::Parser;
use k8s_openapi::api::core::v1::Pod;
use kubelet_api::KillPodOptions;
use kubelet_eviction::{
    ActivePod, CgroupFs, EvictionConfig, EvictionError, EvictionManager, EvictionSettings,
    MachineStats, MachineStatsConfig, ManagerEvent, PodControl, parse_threshold_flag,
};
use parking_lot::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const MI: usize = 1 << 20;

#[derive(Debug, Parser)]
#[command(name = "eviction-bench", about)]
struct Args {
    /// Runs per rate and mode (fast modes).
    #[arg(long, default_value_t = 10)]
    runs: usize,
    /// Runs per rate of the kubelet-10s baseline (each can take up to 10 s).
    #[arg(long, default_value_t = 3)]
    baseline_runs: usize,
    /// Allocation rates, MiB/s.
    #[arg(long, value_delimiter = ',', default_value = "50,200,1000")]
    rates: Vec<usize>,
    /// Memory limit of the test cgroup ("node capacity"), MiB.
    #[arg(long, default_value_t = 1024)]
    limit_mib: usize,
    /// The hard threshold: memory.available<THRESHOLD Mi.
    #[arg(long, default_value_t = 300)]
    threshold_mib: usize,
    /// Only measure the cost of one fast memory check on this machine (`observe_memory` of the
    /// whole node, N times) and exit.
    #[arg(long)]
    poll_cost: Option<usize>,
}

fn main() -> anyhow::Result<()> {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("hog") {
        let n = |i: usize| {
            argv.get(i)
                .and_then(|a| a.parse::<usize>().ok())
                .unwrap_or(0)
        };
        hog(n(2), n(3), n(4), argv.get(5).map(PathBuf::from));
    }
    let args = Args::parse();
    if !nix::unistd::Uid::effective().is_root() {
        bail!("eviction-bench needs root (it creates a memory cgroup)");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run(args))
}

/// CLOCK_MONOTONIC in nanoseconds (the clock `Instant` uses on Linux), comparable across
/// processes.
fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

/// Allocation granularity of the hog.
const CHUNK: usize = 256 << 10;

/// Wait for a line on stdin (the harness has moved us into the cgroup), then allocate quickly up
/// to `fast_until` MiB and at `rate` MiB/s up to `target` MiB, printing `<monotonic ns> <usage>`
/// after each chunk of the rate phase, `usage` read from the cgroup's `usage_file`; then sleep.
fn hog(rate: usize, fast_until: usize, target: usize, usage_file: Option<PathBuf>) -> ! {
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    let mut held: Vec<Vec<u8>> = Vec::new();
    while held.len() * CHUNK < fast_until * MI {
        held.push(vec![0x5a; CHUNK]);
    }
    let per_chunk = Duration::from_secs_f64(CHUNK as f64 / (rate.max(1) * MI) as f64);
    let start = std::time::Instant::now();
    let mut n = 0u32;
    let mut out = std::io::stdout().lock();
    while held.len() * CHUNK < target * MI {
        held.push(vec![0x5a; CHUNK]);
        let usage = usage_file
            .as_ref()
            .and_then(|f| std::fs::read_to_string(f).ok())
            .and_then(|t| t.trim().parse::<u64>().ok())
            .unwrap_or(0);
        let _ = writeln!(out, "{} {usage}", monotonic_ns());
        let _ = out.flush();
        n += 1;
        if let Some(wait) = (per_chunk * n).checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
    }
    loop {
        std::thread::sleep(Duration::from_secs(60));
        std::hint::black_box(&held);
    }
}

struct TestCgroup {
    dir: PathBuf,
    fs: CgroupFs,
}

impl TestCgroup {
    fn create(fs: CgroupFs, name: &str, limit: usize) -> anyhow::Result<Self> {
        let dir = fs.dir(Path::new(name));
        match &fs {
            CgroupFs::V1 { .. } => {
                std::fs::create_dir_all(&dir)?;
                std::fs::write(dir.join("memory.limit_in_bytes"), limit.to_string())?;
            }
            CgroupFs::V2 { root } => {
                let _ = std::fs::write(root.join("cgroup.subtree_control"), "+memory");
                std::fs::create_dir_all(&dir)?;
                std::fs::write(dir.join("memory.max"), limit.to_string())?;
                let _ = std::fs::write(dir.join("memory.swap.max"), "0");
            }
        }
        Ok(Self { dir, fs })
    }

    fn stat(&self, file: &str, key: &str) -> Option<u64> {
        let text = std::fs::read_to_string(self.dir.join(file)).ok()?;
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == key).then(|| v.trim().parse().ok()).flatten()
        })
    }

    /// The usage counter the memcg threshold compares against.
    fn usage_file(&self) -> PathBuf {
        match self.fs {
            CgroupFs::V1 { .. } => self.dir.join("memory.usage_in_bytes"),
            CgroupFs::V2 { .. } => self.dir.join("memory.current"),
        }
    }

    fn inactive_file(&self) -> u64 {
        match self.fs {
            CgroupFs::V1 { .. } => self.stat("memory.stat", "total_inactive_file"),
            CgroupFs::V2 { .. } => self.stat("memory.stat", "inactive_file"),
        }
        .unwrap_or(0)
    }

    fn oom_kills(&self) -> u64 {
        match self.fs {
            CgroupFs::V1 { .. } => self.stat("memory.oom_control", "oom_kill"),
            CgroupFs::V2 { .. } => self.stat("memory.events", "oom_kill"),
        }
        .unwrap_or(0)
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir(&self.dir) {
            eprintln!("removing {}: {e}", self.dir.display());
        }
    }
}

/// The one "pod": the hog process; killing it sends SIGTERM.
struct HogControl {
    pod: Arc<Pod>,
    pid: i32,
    killed: Mutex<Option<Instant>>,
}

#[async_trait]
impl PodControl for HogControl {
    async fn active_pods(&self) -> Vec<ActivePod> {
        if self.killed.lock().is_some() {
            return vec![];
        }
        vec![ActivePod {
            pod: self.pod.clone(),
            containers: vec![],
        }]
    }

    async fn kill_pod(&self, _pod: &Pod, _options: KillPodOptions) -> Result<(), EvictionError> {
        *self.killed.lock() = Some(Instant::now());
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid),
            nix::sys::signal::Signal::SIGTERM,
        );
        Ok(())
    }
}

#[derive(Debug, Clone, Copy)]
enum Mode {
    /// The kubelet's period, with a hog that stops below the limit (measures detection).
    Kubelet10s,
    /// The kubelet's period, with a hog that grows past the limit (who wins: eviction or OOM).
    Kubelet10sOom,
    Poll,
    PollKernel,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Kubelet10s => "kubelet-10s",
            Mode::Kubelet10sOom => "kubelet-10s*",
            Mode::Poll => "poll-100ms",
            Mode::PollKernel => "poll+kernel",
        }
    }
}

/// One run's figures, in milliseconds after the ground-truth crossing.
#[derive(Debug, Default, Clone, Copy)]
struct RunResult {
    detected_ms: Option<f64>,
    dead_ms: Option<f64>,
    oom_killed: bool,
}

async fn one_run(
    args: &Args,
    fs: &CgroupFs,
    mode: Mode,
    rate: usize,
    run: usize,
) -> anyhow::Result<RunResult> {
    let name = format!("eviction-bench-{}-{run}", std::process::id());
    let limit = args.limit_mib * MI;
    let cgroup =
        TestCgroup::create(fs.clone(), &name, limit).context("creating the test cgroup")?;
    let crossing_ws = (args.limit_mib - args.threshold_mib) * MI;
    let fast_until = (args.limit_mib - args.threshold_mib).saturating_sub(rate.max(100) / 2);
    // The detection-only baseline stops 64 MiB below the limit; every other mode would reach
    // the limit 256 MiB over if nothing stopped it.
    let target = match mode {
        Mode::Kubelet10s => args.limit_mib - 64,
        _ => args.limit_mib + 256,
    };

    let exe = std::env::current_exe()?;
    let mut child = tokio::process::Command::new(exe)
        .args([
            "hog",
            &rate.to_string(),
            &fast_until.to_string(),
            &target.to_string(),
        ])
        .arg(cgroup.usage_file())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let pid = child.id().context("hog pid")? as i32;
    std::fs::write(cgroup.dir.join("cgroup.procs"), pid.to_string()).context("moving the hog")?;
    let oom_before = cgroup.oom_kills();

    let mut settings = EvictionSettings::default();
    settings.hard = Some(parse_threshold_flag(
        "evictionHard",
        &format!("memory.available<{}Mi", args.threshold_mib),
    )?);
    let mut config = EvictionConfig::from_settings(&settings)?;
    match mode {
        Mode::Kubelet10s | Mode::Kubelet10sOom => {
            config.fast_poll_interval = None;
            config.kernel_notifications = false;
        }
        Mode::Poll => config.kernel_notifications = false,
        Mode::PollKernel => {}
    }
    let stats = MachineStats::new(MachineStatsConfig::detect().memory_cgroup(&name));
    let mut pod = Pod::default();
    pod.metadata.name = Some("hog".into());
    pod.metadata.uid = Some("hog".into());
    let control = Arc::new(HogControl {
        pod: Arc::new(pod),
        pid,
        killed: Mutex::new(None),
    });
    let manager = EvictionManager::new(config, Arc::new(stats), control.clone());
    let mut events = manager.subscribe();
    let shutdown = CancellationToken::new();
    let manager_task = tokio::spawn(manager.run(shutdown.clone()));
    // Let the manager's first synchronisation run before the hog starts. The phase of the 10 s
    // round relative to the crossing is therefore the same in every run (about 10 s minus the
    // time the hog takes to reach the threshold); on a real node it is uniform over 0–10 s.
    tokio::time::sleep(Duration::from_millis(50)).await;

    // Ground truth: the cgroup's usage counter as the hog reads it after each chunk, minus the
    // inactive file cache (the hog does no file I/O, so it stays put).
    let inactive = cgroup.inactive_file() as usize;
    let timeline = {
        let stdout = child.stdout.take().context("hog stdout")?;
        tokio::spawn(async move {
            use tokio::io::AsyncBufReadExt;
            let mut lines = tokio::io::BufReader::new(stdout).lines();
            let mut points: Vec<(u64, usize)> = Vec::new();
            while let Ok(Some(l)) = lines.next_line().await {
                let mut it = l.split_whitespace().map(|x| x.parse::<u64>().ok());
                if let (Some(Some(t)), Some(Some(b))) = (it.next(), it.next()) {
                    points.push((t, b as usize));
                }
            }
            points
        })
    };
    if let Some(stdin) = child.stdin.as_mut() {
        use tokio::io::AsyncWriteExt;
        stdin.write_all(b"go\n").await?;
    }
    let deadline = Duration::from_secs(30);
    let status = tokio::time::timeout(deadline, child.wait()).await;
    let dead_at = Instant::now();
    shutdown.cancel();
    let _ = manager_task.await;
    let _ = child.kill().await;
    let oom_killed = cgroup.oom_kills() > oom_before;
    drop(cgroup);

    let points = timeline.await.unwrap_or_default();
    // The first report above the threshold; when the hog was killed before it could report one
    // (the memcg eventfd fires within the crossing chunk), its last report below the threshold,
    // which makes the latency an upper bound.
    let crossed_ns = points
        .iter()
        .find(|(_, usage)| usage.saturating_sub(inactive) > crossing_ws)
        .or(points.last())
        .map(|(t, _)| *t);
    // Map the hog's CLOCK_MONOTONIC to our `Instant`s.
    let (ref_instant, ref_ns) = (Instant::now(), monotonic_ns());
    let crossed = crossed_ns.map(|t| {
        let back = Duration::from_nanos(ref_ns.saturating_sub(t));
        ref_instant.checked_sub(back).unwrap_or(ref_instant)
    });
    let Some(crossed) = crossed else {
        let _ = std::io::stderr().write_all(b"warning: no crossing observed\n");
        return Ok(RunResult {
            oom_killed,
            ..Default::default()
        });
    };
    let mut detected = None;
    while let Ok(e) = events.try_recv() {
        match e {
            ManagerEvent::Crossed { at, .. } if detected.is_none() => detected = Some(at),
            ManagerEvent::Evicted(ev) if detected.is_none() => detected = Some(ev.at),
            _ => {}
        }
    }
    // Signed: a memcg eventfd can fire while the crossing chunk is still being filled.
    let ms = |t: Instant| {
        if t >= crossed {
            (t - crossed).as_secs_f64() * 1000.0
        } else {
            -((crossed - t).as_secs_f64() * 1000.0)
        }
    };
    Ok(RunResult {
        detected_ms: detected.map(ms),
        dead_ms: status.is_ok().then(|| ms(dead_at)),
        oom_killed,
    })
}

fn percentile(v: &[f64], p: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let idx = ((p / 100.0) * (s.len() - 1) as f64).round() as usize;
    s.get(idx).copied()
}

fn fmt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.0}"))
}

/// CPU time (user + system) of this process.
fn cpu_time() -> Duration {
    nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)
        .map(|u| {
            let t = |tv: nix::sys::time::TimeVal| {
                Duration::from_secs(tv.tv_sec() as u64) + Duration::from_micros(tv.tv_usec() as u64)
            };
            t(u.user_time()) + t(u.system_time())
        })
        .unwrap_or_default()
}

async fn poll_cost(n: usize) -> anyhow::Result<()> {
    use kubelet_eviction::StatsProvider;
    let stats = MachineStats::new(MachineStatsConfig::detect());
    stats.observe_memory().await?;
    let (wall, cpu) = (std::time::Instant::now(), cpu_time());
    for _ in 0..n {
        stats.observe_memory().await?;
    }
    let (wall, cpu) = (wall.elapsed(), cpu_time() - cpu);
    let per = cpu.as_secs_f64() / n as f64;
    println!(
        "poll cost: {n} memory checks of the whole node ({:?}): {:.1} us CPU and {:.1} us wall each; at one check per 100 ms that is {:.3} % of one core",
        MachineStatsConfig::detect().cgroup,
        per * 1e6,
        wall.as_secs_f64() / n as f64 * 1e6,
        per / 0.1 * 100.0
    );
    Ok(())
}

async fn run(args: Args) -> anyhow::Result<()> {
    if let Some(n) = args.poll_cost {
        return poll_cost(n).await;
    }
    let Some(fs) = CgroupFs::detect(Path::new("/proc")) else {
        bail!("no memory cgroup hierarchy");
    };
    println!(
        "eviction-bench: cgroup limit {} MiB, memory.available<{}Mi, {} runs per fast mode, {} baseline runs",
        args.limit_mib, args.threshold_mib, args.runs, args.baseline_runs
    );
    println!(
        "{:<12} {:>6} {:>5} {:>9} {:>9} {:>9} {:>9} {:>6}",
        "mode", "MiB/s", "runs", "det p50", "det p99", "dead p50", "dead p99", "OOM"
    );
    for &rate in &args.rates {
        for mode in [
            Mode::Kubelet10s,
            Mode::Kubelet10sOom,
            Mode::Poll,
            Mode::PollKernel,
        ] {
            let n = match mode {
                Mode::Kubelet10s | Mode::Kubelet10sOom => args.baseline_runs,
                _ => args.runs,
            };
            let mut det = vec![];
            let mut dead = vec![];
            let mut ooms = 0;
            for i in 0..n {
                let r = one_run(&args, &fs, mode, rate, i).await?;
                if r.oom_killed {
                    ooms += 1;
                } else {
                    if let Some(d) = r.detected_ms {
                        det.push(d);
                    }
                    if let Some(d) = r.dead_ms {
                        dead.push(d);
                    }
                }
            }
            println!(
                "{:<12} {:>6} {:>5} {:>9} {:>9} {:>9} {:>9} {:>6}",
                mode.name(),
                rate,
                n,
                fmt(percentile(&det, 50.0)),
                fmt(percentile(&det, 99.0)),
                fmt(percentile(&dead, 50.0)),
                fmt(percentile(&dead, 99.0)),
                format!("{ooms}/{n}")
            );
        }
    }
    println!(
        "(ms after the crossing; runs where the kernel OOM killer fired are counted under OOM and excluded from the latencies;\n \
         kubelet-10s: the hog stops 64 MiB below the limit, so the 10 s round is measured; kubelet-10s*: it grows past the limit)"
    );
    Ok(())
}
