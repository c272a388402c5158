//! `pleg-bench`: the PLEG figures of docs/performance.md ("Issue 7"), on the process runtime and
//! on a private containerd started by `scripts/containerd-test-env.sh` (containerd needs root).
//!
//! 1. **Exit-detection latency**: `--exits` containers (`sh -c 'sleep D'`, one per pod, D spread
//!    over `--spread-ms` after `--lead-ms`, so exits fall anywhere in a relist period) exit in
//!    batches of `--batch`; latency = the moment the PLEG's `ContainerDied` arrives (stamped by
//!    a task of its own) − the exit time the runtime records (`finished_at`). Relist mode
//!    (`GenericPleg`, 1 s) and evented mode (`EventedPleg`, 300 s safety-net relist), same run,
//!    same runtime.
//! 2. **Relist cost** at `--sizes` containers (one per pod): a steady relist (nothing changed)
//!    beside one bare ListPodSandbox + ListContainers round trip, medians and p99 of `--runs`;
//!    then the agent's CPU (this process: user + system) while the relist PLEG runs at its 1 s
//!    period, and while the evented PLEG runs with nothing happening, over `--cpu-window`
//!    seconds each; on containerd also containerd's own CPU over the same windows.
//!
//! ```text
//! cargo build --release -p pleg-bench
//! target/release/pleg-bench --runtimes process,containerd --exits 300 --sizes 30,110,500
//! target/release/pleg-bench --runtimes containerd17 --exits 300 --batch 20 --lead-ms 5000 --spread-ms 6000 --sizes 30
//! ```

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use jiff::Timestamp;
use kubelet_api::runtime::{
    ContainerConfig, ContainerFilter, ContainerMetadata, Labels, PodSandboxConfig,
    PodSandboxMetadata, SandboxFilter, labels,
};
use kubelet_api::{
    ContainerRuntime, PlegEvents, PodLifecycleEventGenerator, PodLifecycleEventType,
};
use kubelet_pleg::{EventedPleg, EventedPlegConfig, GenericPleg, GenericPlegConfig};
use kubelet_process::{ProcessRuntime, ProcessRuntimeConfig, ShimCommand};
use tokio_util::sync::CancellationToken;

/// Command-line flags.
#[derive(Debug, Parser)]
struct Flags {
    /// Runtimes to measure: `process`, `containerd` (the system's, 1.6 on Debian bookworm: the
    /// evented PLEG uses containerd's native events), `containerd17` (Debian trixie's 1.7 from
    /// `containerd-test-env.sh start17`: CRI `GetContainerEvents`), `containerd17-native` (the
    /// same 1.7 with `CriConfig::prefer_containerd_events`: its native events and exit hints).
    #[arg(long, value_delimiter = ',', default_value = "process,containerd")]
    runtimes: Vec<String>,
    /// Container exits per mode for the latency figures (0 skips them).
    #[arg(long, default_value_t = 300)]
    exits: usize,
    /// Containers exiting together per batch.
    #[arg(long, default_value_t = 25)]
    batch: usize,
    /// Milliseconds from the start of a batch's creation to its first possible exit (long
    /// enough for the batch to be created, so exits do not overlap creations).
    #[arg(long, default_value_t = 500)]
    lead_ms: u64,
    /// Milliseconds over which a batch's exits are spread at random.
    #[arg(long, default_value_t = 1500)]
    spread_ms: u64,
    /// Container counts for the relist cost (empty skips it).
    #[arg(long, value_delimiter = ',', default_value = "30,110,500")]
    sizes: Vec<usize>,
    /// Relists (and bare round trips) per size.
    #[arg(long, default_value_t = 30)]
    runs: usize,
    /// Seconds of each CPU window.
    #[arg(long, default_value_t = 10)]
    cpu_window: u64,
}

fn main() -> std::process::ExitCode {
    // The process runtime re-runs this executable as each container's shim.
    if let Some(code) = kubelet_process::shim::maybe_run_shim() {
        return code;
    }
    let flags = Flags::parse();
    let result = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(run(flags)));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pleg-bench: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(flags: Flags) -> anyhow::Result<()> {
    println!("load before: {}", loadavg());
    for name in &flags.runtimes {
        match name.as_str() {
            "process" => {
                let dir = tempfile::Builder::new()
                    .prefix("ksdk-pleg-bench-")
                    .tempdir_in("/tmp")?;
                let config = ProcessRuntimeConfig::new(dir.path().join("state"))
                    .shim(ShimCommand::CurrentExe)
                    .use_cgroups(false);
                let rt: Arc<dyn ContainerRuntime> = Arc::new(ProcessRuntime::new(config)?);
                let target = Target {
                    name: "process",
                    rt,
                    image: "host".into(),
                    logs: dir.path().join("logs"),
                    containerd_pid: None,
                };
                // Clean up also when a measurement fails: the shims outlive this process.
                let res = measure(&target, &flags).await;
                let cleanup = remove_all(&*target.rt).await;
                res?;
                cleanup?;
            }
            "containerd" | "containerd17" | "containerd17-native" => {
                let start = if name == "containerd" {
                    "start"
                } else {
                    "start17"
                };
                let env = Env::start(start, "ksdk-pleg-bench-")?;
                let cri = kubelet_cri::CriRuntime::connect(
                    kubelet_cri::CriConfig::new(env.endpoint())
                        .request_timeout(Duration::from_secs(60))
                        .termination_message_dir(env.dir.join("kubelet/pods"))
                        .prefer_containerd_events(name == "containerd17-native"),
                )
                .await?;
                let events = cri.clone();
                let rt: Arc<dyn ContainerRuntime> = Arc::new(cri);
                let target = Target {
                    name: match name.as_str() {
                        "containerd" => "containerd",
                        "containerd17" => "containerd-1.7",
                        _ => "containerd-1.7, native events preferred",
                    },
                    rt,
                    image: env.busybox.clone(),
                    logs: env.dir.join("logs"),
                    containerd_pid: env.pid,
                };
                let res = measure(&target, &flags).await;
                println!(
                    "{}: container events from {:?}",
                    target.name,
                    events.container_event_source()
                );
                let cleanup = remove_all(&*target.rt).await;
                res?;
                cleanup?;
            }
            other => bail!("unknown runtime {other:?}"),
        }
    }
    println!("load after: {}", loadavg());
    Ok(())
}

struct Target {
    name: &'static str,
    rt: Arc<dyn ContainerRuntime>,
    image: String,
    logs: PathBuf,
    containerd_pid: Option<u32>,
}

async fn measure(t: &Target, flags: &Flags) -> anyhow::Result<()> {
    if flags.exits > 0 {
        let relist = latency(t, Mode::Relist, flags).await?;
        let evented = latency(t, Mode::Evented, flags).await?;
        let (r50, r99, rmax) = (
            quantile(&relist, 0.5),
            quantile(&relist, 0.99),
            quantile(&relist, 1.0),
        );
        let (e50, e99, emax) = (
            quantile(&evented, 0.5),
            quantile(&evented, 0.99),
            quantile(&evented, 1.0),
        );
        println!("| {} | exits | p50 | p99 | max |", t.name);
        println!("|---|---|---|---|---|");
        println!(
            "| relist (1 s) | {} | {r50:.1} ms | {r99:.1} ms | {rmax:.1} ms |",
            relist.len()
        );
        println!(
            "| evented | {} | {e50:.1} ms | {e99:.1} ms | {emax:.1} ms |",
            evented.len()
        );
        println!(
            "| evented / relist | | {:.3} | {:.3} | |",
            e50 / r50,
            e99 / r99
        );
    }
    if !flags.sizes.is_empty() {
        println!(
            "| {} containers | first relist, until every pod is inspected | steady relist p50 | p99 | List round trip p50 | relist / round trip | agent CPU, relist 1 s | agent CPU, evented idle | runtime CPU, relist 1 s | runtime CPU, evented idle |",
            t.name
        );
        println!("|---|---|---|---|---|---|---|---|---|---|");
        for &n in &flags.sizes {
            relist_cost(t, n, flags.runs, Duration::from_secs(flags.cpu_window)).await?;
        }
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Relist,
    Evented,
}

fn pod_configs(
    t: &Target,
    uid: &str,
    name: &str,
    script: &str,
) -> (PodSandboxConfig, ContainerConfig) {
    let mut l = Labels::new();
    l.insert(labels::POD_UID.into(), uid.into());
    l.insert(labels::POD_NAME.into(), format!("pod-{uid}"));
    l.insert(labels::POD_NAMESPACE.into(), "default".into());
    let sandbox = {
        let mut v = PodSandboxConfig::default();
        v.metadata = PodSandboxMetadata {
            name: format!("pod-{uid}"),
            namespace: "default".into(),
            uid: uid.into(),
            attempt: 0,
        };
        v.log_directory = t.logs.join(uid);
        v.labels = l.clone();
        v.host_network = true;
        v
    };
    let mut cl = l;
    cl.insert(labels::CONTAINER_NAME.into(), name.into());
    let container = container_config(t, &cl, name, script);
    (sandbox, container)
}

fn container_config(t: &Target, labels_: &Labels, name: &str, script: &str) -> ContainerConfig {
    let mut cl = labels_.clone();
    cl.insert(labels::CONTAINER_NAME.into(), name.into());
    {
        let mut v = ContainerConfig::default();
        v.metadata = ContainerMetadata {
            name: name.into(),
            attempt: 0,
        };
        v.image = t.image.clone();
        v.command = vec!["/bin/sh".into(), "-c".into(), script.into()];
        v.labels = cl;
        v.log_path = format!("{name}/0.log");
        v
    }
}

/// A PLEG behind the trait object the engine takes, with its events.
fn shared<P: PodLifecycleEventGenerator>(
    (pleg, events): (P, PlegEvents),
) -> (Arc<dyn PodLifecycleEventGenerator>, PlegEvents) {
    (Arc::new(pleg), events)
}

/// Exit-detection latencies (ms) of `exits` containers in `mode`.
async fn latency(t: &Target, mode: Mode, flags: &Flags) -> anyhow::Result<Vec<f64>> {
    let (exits, batch) = (flags.exits, flags.batch.max(1));
    let (pleg, mut pleg_events) = match mode {
        Mode::Relist => shared(GenericPleg::new(t.rt.clone(), GenericPlegConfig::default())),
        Mode::Evented => shared(EventedPleg::new(t.rt.clone(), EventedPlegConfig::default())),
    };
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let (pleg, shutdown) = (pleg.clone(), shutdown.clone());
        async move { pleg.run(shutdown).await }
    });
    // Events are stamped on arrival by their own task: the harness creating the next containers
    // (seconds for a batch on a loaded machine) must not delay the stamp.
    let (stamped_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let stamper = tokio::spawn(async move {
        while let Some(ev) = pleg_events.recv().await {
            if stamped_tx.send((ev, Timestamp::now())).is_err() {
                break;
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    while events.try_recv().is_ok() {}
    let mut out = Vec::with_capacity(exits);
    let mut n = 0;
    while n < exits {
        let size = batch.min(exits - n);
        let mut ids = HashSet::new();
        let mut sandboxes = Vec::new();
        let base = Instant::now() + Duration::from_millis(flags.lead_ms);
        for i in 0..size {
            // One pod per container; exits spread over --spread-ms (more than a relist period).
            let at = base + Duration::from_millis(rand::random_range(0..flags.spread_ms.max(1)));
            let d = at
                .saturating_duration_since(Instant::now())
                .as_secs_f64()
                .max(0.05);
            let uid = format!("lat-{mode:?}-{}", n + i).to_lowercase();
            let (s, c) = pod_configs(t, &uid, "app", &format!("sleep {d:.3}"));
            let sid = t.rt.run_pod_sandbox(&s).await?;
            let cid = t.rt.create_container(&sid, &c, &s).await?;
            t.rt.start_container(&cid).await?;
            ids.insert(cid);
            sandboxes.push(sid);
        }
        let mut arrived = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        while !ids.is_empty() {
            let (ev, stamp) = tokio::time::timeout_at(deadline, events.recv())
                .await
                .context("exits not all reported within 120 s")?
                .context("event channel closed")?;
            if ev.kind == PodLifecycleEventType::ContainerDied && ids.remove(&ev.container_id) {
                arrived.push((ev.container_id, stamp));
            }
        }
        for (cid, at) in arrived {
            let st = t.rt.container_status(&cid).await?;
            let fin = st
                .finished_at
                .context("exited container without finished_at")?;
            out.push((at.as_nanosecond() - fin.as_nanosecond()) as f64 / 1e6);
        }
        for sid in sandboxes {
            t.rt.stop_pod_sandbox(&sid).await?;
            t.rt.remove_pod_sandbox(&sid).await?;
        }
        n += size;
    }
    shutdown.cancel();
    let _ = task.await;
    stamper.abort();
    out.sort_by(f64::total_cmp);
    Ok(out)
}

async fn relist_cost(t: &Target, n: usize, runs: usize, window: Duration) -> anyhow::Result<()> {
    // Start n pods of one long-running container, 4 at a time.
    let sem = Arc::new(tokio::sync::Semaphore::new(4));
    let mut set = tokio::task::JoinSet::new();
    for i in 0..n {
        let (rt, sem) = (t.rt.clone(), sem.clone());
        let (s, c) = pod_configs(t, &format!("cost{n}-{i}"), "app", "sleep 100000");
        set.spawn(async move {
            let _permit = sem.acquire_owned().await?;
            let sid = rt.run_pod_sandbox(&s).await?;
            let cid = rt.create_container(&sid, &c, &s).await?;
            rt.start_container(&cid).await?;
            anyhow::Ok(())
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    let (pleg, _events) = GenericPleg::new(t.rt.clone(), GenericPlegConfig::default());
    let s = Instant::now();
    let first = pleg.relist().await?;
    if first.pods < n {
        bail!("listed {} pods, expected {n}", first.pods);
    }
    // The first relist inspects every pod; inspections past its 1 s wait finish in the
    // background and are taken in by the next relists.
    let mut settled = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if pleg.relist().await?.pods_inspected == 0 && pleg.slow_pods().is_empty() {
            settled = true;
            break;
        }
    }
    if !settled {
        bail!("pods still being inspected 10 s after the first relist");
    }
    let first_all = s.elapsed();
    let mut relists = Vec::with_capacity(runs);
    let mut bare = Vec::with_capacity(runs);
    for _ in 0..runs {
        let s = Instant::now();
        let r = pleg.relist().await?;
        relists.push(s.elapsed().as_secs_f64() * 1e3);
        if r.pods_inspected != 0 {
            bail!("steady relist inspected {} pods", r.pods_inspected);
        }
        let s = Instant::now();
        t.rt.list_pod_sandboxes(&SandboxFilter::default()).await?;
        t.rt.list_containers(&ContainerFilter::default()).await?;
        bare.push(s.elapsed().as_secs_f64() * 1e3);
    }
    relists.sort_by(f64::total_cmp);
    bare.sort_by(f64::total_cmp);
    drop(pleg);

    // CPU while the relist PLEG runs at its period, then while the evented PLEG idles.
    let warmup = first_all + Duration::from_secs(1);
    let relist_cpu = cpu_while(
        t,
        window,
        warmup,
        shared(GenericPleg::new(t.rt.clone(), GenericPlegConfig::default())),
    )
    .await?;
    let evented_cpu = cpu_while(
        t,
        window,
        warmup,
        shared(EventedPleg::new(t.rt.clone(), EventedPlegConfig::default())),
    )
    .await?;
    let pct = |c: Option<f64>| c.map_or("n/a".to_string(), |c| format!("{:.2} %", c * 100.0));
    println!(
        "| {n} | {:.0} ms | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} | {} | {} | {} | {} |",
        first_all.as_secs_f64() * 1e3,
        quantile(&relists, 0.5),
        quantile(&relists, 0.99),
        quantile(&bare, 0.5),
        quantile(&relists, 0.5) / quantile(&bare, 0.5).max(1e-9),
        pct(Some(relist_cpu.0)),
        pct(Some(evented_cpu.0)),
        pct(relist_cpu.1),
        pct(evented_cpu.1),
    );
    remove_all(&*t.rt).await?;
    Ok(())
}

/// CPU share (1.0 = one core) of this process, and of containerd if known, while `pleg` runs
/// for `window`.
async fn cpu_while(
    t: &Target,
    window: Duration,
    warmup: Duration,
    (pleg, _events): (Arc<dyn PodLifecycleEventGenerator>, PlegEvents),
) -> anyhow::Result<(f64, Option<f64>)> {
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let (pleg, shutdown) = (pleg.clone(), shutdown.clone());
        async move { pleg.run(shutdown).await }
    });
    // Past the first relist and its inspections of every pod.
    tokio::time::sleep(warmup.max(Duration::from_millis(2500))).await;
    let (a0, r0, w0) = (
        self_cpu()?,
        t.containerd_pid.and_then(proc_cpu),
        Instant::now(),
    );
    tokio::time::sleep(window).await;
    let (a1, r1, wall) = (
        self_cpu()?,
        t.containerd_pid.and_then(proc_cpu),
        w0.elapsed(),
    );
    shutdown.cancel();
    let _ = task.await;
    let w = wall.as_secs_f64();
    let runtime = match (r0, r1) {
        (Some(a), Some(b)) => Some((b - a) / w),
        _ => None,
    };
    Ok(((a1 - a0) / w, runtime))
}

/// User + system CPU seconds of this process.
fn self_cpu() -> anyhow::Result<f64> {
    let u = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)?;
    let tv = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    Ok(tv(u.user_time()) + tv(u.system_time()))
}

/// User + system CPU seconds of process `pid` (from /proc, 100 ticks per second).
fn proc_cpu(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

async fn remove_all(rt: &dyn ContainerRuntime) -> anyhow::Result<()> {
    for s in rt.list_pod_sandboxes(&SandboxFilter::default()).await? {
        rt.stop_pod_sandbox(&s.id).await?;
        rt.remove_pod_sandbox(&s.id).await?;
    }
    Ok(())
}

/// The `q` quantile (0..=1) of sorted `v`, nearest rank.
fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// The private containerd (as in benches/cri).
type Env = bench_support::ContainerdEnv;
