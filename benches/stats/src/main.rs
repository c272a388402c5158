//! stats-bench: what the stats collector costs with `--pods` pods on the process runtime.
//!
//! * **collection**: wall time and CPU time of one `Collector::collect` (one housekeeping
//!   period's work), against the **floor**: the runtime calls a collection cannot avoid
//!   (`list_pod_sandboxes`, `list_containers`, one `container_stats` per container), timed in
//!   the same run. CPU per period is turned into a share of a core at the kubelet's 10 s
//!   period and into CPU seconds per hour.
//! * **/stats/summary**: encoding the latest sample as the endpoint does (JSON), p50/p99 and
//!   the response size, whole and `only_cpu_and_memory`.
//! * **memory**: the resident memory the collector and its latest sample add.
//!
//! `cargo run --release -p stats-bench -- --pods 110` (as root, for per-container cgroups).

use std::sync::Arc;
use std::time::Instant;

use bench_support::{ms, percentile, rss_kib};
use clap::Parser;
use kubelet_api::runtime::{
    ContainerConfig, ContainerFilter, ContainerMetadata, Labels, PodSandboxConfig,
    PodSandboxMetadata, SandboxFilter, labels,
};
use kubelet_api::{AgentDirs, ContainerRuntime};
use kubelet_process::{ProcessRuntime, ProcessRuntimeConfig, ShimCommand};
use kubelet_stats::{Collector, StatsConfig};

#[derive(Parser, Debug)]
struct Flags {
    /// Pods (one container each).
    #[arg(long, default_value_t = 110)]
    pods: usize,
    /// Collections measured (after one warm-up).
    #[arg(long, default_value_t = 20)]
    rounds: usize,
    /// Encodings of the summary measured.
    #[arg(long, default_value_t = 1000)]
    requests: usize,
    /// `process` (the built-in runtime) or `containerd` (a private containerd, root only).
    #[arg(long, default_value = "process")]
    runtime: String,
}

fn main() -> std::process::ExitCode {
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
            eprintln!("stats-bench: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn self_cpu() -> anyhow::Result<f64> {
    let u = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)?;
    let tv = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    Ok(tv(u.user_time()) + tv(u.system_time()))
}

async fn run(flags: Flags) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("ksdk-stats-bench-")
        .tempdir_in("/tmp")?;
    let root = nix::unistd::geteuid().is_root();
    let dirs = AgentDirs {
        root_dir: dir.path().join("root"),
        pod_log_dir: dir.path().join("logs"),
    };
    std::fs::create_dir_all(&dirs.root_dir)?;
    match flags.runtime.as_str() {
        "process" => {
            let config = ProcessRuntimeConfig::new(dir.path().join("state"))
                .shim(ShimCommand::CurrentExe)
                .use_cgroups(root);
            let rt: Arc<dyn ContainerRuntime> = Arc::new(ProcessRuntime::new(config)?);
            let target = Target {
                rt,
                image: "host".into(),
                what: if root {
                    "process runtime, cgroups"
                } else {
                    "process runtime, no cgroups: not root"
                },
                runtime_pid: None,
            };
            let result = measure(&flags, &target, dirs).await;
            remove_all(&*target.rt).await?;
            result
        }
        "containerd" => {
            let env = bench_support::ContainerdEnv::start("start", "ksdk-stats-bench-")?;
            let cri = kubelet_cri::CriRuntime::connect(
                kubelet_cri::CriConfig::new(env.endpoint())
                    .request_timeout(std::time::Duration::from_secs(60))
                    .termination_message_dir(dirs.root_dir.join("pods")),
            )
            .await?;
            let target = Target {
                rt: Arc::new(cri),
                image: env.busybox.clone(),
                what: "containerd",
                runtime_pid: env.pid,
            };
            let result = measure(&flags, &target, dirs).await;
            remove_all(&*target.rt).await?;
            result
        }
        other => anyhow::bail!("unknown runtime {other:?}: process or containerd"),
    }
}

struct Target {
    rt: Arc<dyn ContainerRuntime>,
    image: String,
    what: &'static str,
    /// The runtime's own process, whose CPU a collection also costs (containerd).
    runtime_pid: Option<u32>,
}

async fn remove_all(rt: &dyn ContainerRuntime) -> anyhow::Result<()> {
    for s in rt.list_pod_sandboxes(&SandboxFilter::default()).await? {
        rt.stop_pod_sandbox(&s.id).await?;
        rt.remove_pod_sandbox(&s.id).await?;
    }
    Ok(())
}

/// User + system CPU seconds of process `pid` (from /proc, 100 ticks per second).
fn proc_cpu(pid: Option<u32>) -> f64 {
    let Some(stat) = pid.and_then(|p| std::fs::read_to_string(format!("/proc/{p}/stat")).ok())
    else {
        return 0.0;
    };
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

async fn measure(flags: &Flags, t: &Target, dirs: AgentDirs) -> anyhow::Result<()> {
    let rt = &t.rt;
    for i in 0..flags.pods {
        let uid = format!("stats-bench-{i}");
        let mut l = Labels::new();
        l.insert(labels::POD_UID.into(), uid.clone());
        l.insert(labels::POD_NAME.into(), format!("pod-{i}"));
        l.insert(labels::POD_NAMESPACE.into(), "default".into());
        let mut s = PodSandboxConfig::new(PodSandboxMetadata {
            name: format!("pod-{i}"),
            namespace: "default".into(),
            uid: uid.clone(),
            attempt: 0,
        });
        s.log_directory = dirs.pod_log_dir.join(format!("default_pod-{i}_{uid}"));
        s.labels = l.clone();
        s.host_network = true;
        let mut cl = l;
        cl.insert(labels::CONTAINER_NAME.into(), "main".into());
        let mut c = ContainerConfig::new(
            ContainerMetadata {
                name: "main".into(),
                attempt: 0,
            },
            t.image.clone(),
        );
        c.command = vec!["/bin/sh".into(), "-c".into(), "exec sleep 3600".into()];
        std::fs::create_dir_all(&s.log_directory)?;
        c.labels = cl;
        c.log_path = "main/0.log".into();
        let sid = rt.run_pod_sandbox(&s).await?;
        let cid = rt.create_container(&sid, &c, &s).await?;
        rt.start_container(&cid).await?;
    }
    println!(
        "{} pods ({}), load {}",
        flags.pods,
        t.what,
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );

    // The floor: the runtime calls one collection needs.
    let mut floor = Vec::new();
    let mut floor_cpu = 0.0;
    let mut floor_runtime = 0.0;
    for _ in 0..flags.rounds {
        let (c0, r0, t0) = (self_cpu()?, proc_cpu(t.runtime_pid), Instant::now());
        rt.list_pod_sandboxes(&SandboxFilter::default()).await?;
        let containers = rt.list_containers(&ContainerFilter::default()).await?;
        for c in &containers {
            rt.container_stats(&c.id).await?;
        }
        floor.push(t0.elapsed());
        floor_cpu += self_cpu()? - c0;
        floor_runtime += proc_cpu(t.runtime_pid) - r0;
    }

    let rss_before = rss_kib(std::process::id());
    let mut collector = Collector::new("bench", dirs, StatsConfig::default().kmsg(None));
    let mut summary = collector.collect(Some(rt.as_ref())).await;
    let mut times = Vec::new();
    let mut cpu = 0.0;
    let mut runtime_cpu = 0.0;
    for _ in 0..flags.rounds {
        let (c0, r0, t0) = (self_cpu()?, proc_cpu(t.runtime_pid), Instant::now());
        summary = collector.collect(Some(rt.as_ref())).await;
        times.push(t0.elapsed());
        cpu += self_cpu()? - c0;
        runtime_cpu += proc_cpu(t.runtime_pid) - r0;
    }
    let latest = Arc::new(summary);
    let rss_after = rss_kib(std::process::id());
    anyhow::ensure!(
        latest.pods.len() == flags.pods,
        "the summary has {} pods, not {}",
        latest.pods.len(),
        flags.pods
    );
    floor.sort();
    times.sort();
    let n = flags.rounds as f64;
    let (cpu_per, floor_cpu_per) = (cpu / n, floor_cpu / n);
    println!(
        "collection: p50 {:.1} ms, p99 {:.1} ms; CPU {:.2} ms per period",
        ms(percentile(&times, 0.5)),
        ms(percentile(&times, 0.99)),
        cpu_per * 1e3
    );
    println!(
        "floor (runtime calls alone): p50 {:.1} ms, CPU {:.2} ms; collection/floor: wall {:.2}x, CPU {:.2}x",
        ms(percentile(&floor, 0.5)),
        floor_cpu_per * 1e3,
        ms(percentile(&times, 0.5)) / ms(percentile(&floor, 0.5)),
        cpu_per / floor_cpu_per
    );
    println!(
        "at the 10 s housekeeping period: {:.3} % of a core, {:.1} CPU s per hour",
        cpu_per / 10.0 * 100.0,
        cpu_per * 360.0
    );
    if t.runtime_pid.is_some() {
        println!(
            "the runtime's own CPU per collection: {:.2} ms (floor {:.2} ms), {:.3} % of a core at 10 s",
            runtime_cpu / n * 1e3,
            floor_runtime / n * 1e3,
            runtime_cpu / n / 10.0 * 100.0
        );
    }

    for (what, reduced) in [("whole", false), ("only_cpu_and_memory", true)] {
        let mut lat = Vec::with_capacity(flags.requests);
        let mut size = 0;
        for _ in 0..flags.requests {
            let t0 = Instant::now();
            let body = if reduced {
                serde_json::to_vec(&latest.cpu_and_memory())?
            } else {
                serde_json::to_vec(&*latest)?
            };
            lat.push(t0.elapsed());
            size = body.len();
        }
        lat.sort();
        println!(
            "/stats/summary {what}: p50 {:.3} ms, p99 {:.3} ms, {} bytes",
            ms(percentile(&lat, 0.5)),
            ms(percentile(&lat, 0.99)),
            size
        );
    }
    println!(
        "memory: collector and latest sample add {} KiB resident ({} KiB before, {} KiB after)",
        rss_after.saturating_sub(rss_before),
        rss_before,
        rss_after
    );
    Ok(())
}
