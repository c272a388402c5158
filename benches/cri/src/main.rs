//! `cri-bench`: the kubelet-cri figures of docs/performance.md, measured against a private
//! containerd started by `scripts/containerd-test-env.sh` (needs root).
//!
//! 1. **Start N pods** (1 container each, host network): through the agent (engine + relist
//!    PLEG + `CriRuntime`, from the pod source's first snapshot to every pod `Running`) and
//!    through a direct sequence of CRI calls (RunPodSandbox, CreateContainer, StartContainer per
//!    pod, back to back and with 4 pods at a time), in the same run, alternating, `--rounds`
//!    times. Prints the wall times and the agent / direct ratios.
//! 2. **Relist cost** at 30 and 110 containers: `GenericPleg::relist` when nothing changed
//!    against one bare ListPodSandbox + ListContainers round trip (medians of `--runs`).
//!
//! ```text
//! cargo run --release -p cri-bench -- --pods 30 --rounds 3
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use async_trait::async_trait;
use clap::Parser;
use kubelet_core::k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use kubelet_core::runtime::{
    ContainerConfig, ContainerFilter, ContainerMetadata, PodSandboxConfig, PodSandboxMetadata,
    SandboxFilter, labels,
};
use kubelet_core::{ContainerRuntime, KubeletBuilder, KubeletConfig, PodSource, SourceSender};
use kubelet_cri::{CriConfig, CriRuntime};
use kubelet_pleg::{GenericPleg, GenericPlegConfig};
use tokio_util::sync::CancellationToken;

/// Command-line flags.
#[derive(Debug, Parser)]
struct Flags {
    /// Pods to start in the start benchmark.
    #[arg(long, default_value_t = 30)]
    pods: usize,
    /// Rounds of (direct, direct x4, agent).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Container counts for the relist benchmark.
    #[arg(long, value_delimiter = ',', default_value = "30,110")]
    relist_sizes: Vec<usize>,
    /// Relists (and bare round trips) per size.
    #[arg(long, default_value_t = 30)]
    runs: usize,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/containerd-test-env.sh")
}

/// The private containerd; stopped and removed on drop.
struct Env {
    dir: PathBuf,
    socket: PathBuf,
    busybox: String,
}

impl Env {
    fn start() -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("ksdk-cri-bench-")
            .tempdir_in("/tmp")?
            .keep();
        let out = std::process::Command::new("bash")
            .arg(script())
            .arg("start")
            .arg(&dir)
            .output()
            .context("running containerd-test-env.sh")?;
        let mut env = Self {
            socket: dir.join("containerd.sock"),
            busybox: String::new(),
            dir,
        };
        if !out.status.success() {
            bail!(
                "containerd-test-env.sh start: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        env.busybox = stdout
            .lines()
            .find_map(|l| l.strip_prefix("BUSYBOX_IMAGE="))
            .unwrap_or_default()
            .to_string();
        Ok(env)
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::process::Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(&self.dir)
            .status();
    }
}

struct OneSnapshot(Vec<Pod>);

#[async_trait]
impl PodSource for OneSnapshot {
    fn name(&self) -> &str {
        "file"
    }
    async fn run(&self, out: SourceSender, shutdown: CancellationToken) {
        if out.snapshot(self.0.clone()).await.is_err() {
            return;
        }
        shutdown.cancelled().await;
    }
}

fn bench_pod(i: usize, image: &str) -> Pod {
    let mut p = Pod {
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "app".into(),
                image: Some(image.into()),
                command: Some(vec!["/bin/sleep".into(), "100000".into()]),
                ..Default::default()
            }],
            host_network: Some(true),
            termination_grace_period_seconds: Some(0),
            ..Default::default()
        }),
        ..Default::default()
    };
    p.metadata.name = Some(format!("bench-{i}"));
    p.metadata.namespace = Some("default".into());
    p.metadata.uid = Some(format!("bench-uid-{i}"));
    p
}

fn direct_configs(
    i: usize,
    image: &str,
    logs: &Path,
    tag: &str,
) -> (PodSandboxConfig, ContainerConfig) {
    let uid = format!("direct-{tag}-{i}");
    let mut l = kubelet_core::runtime::Labels::new();
    l.insert(labels::POD_UID.into(), uid.clone());
    l.insert(labels::POD_NAME.into(), format!("direct-{i}"));
    l.insert(labels::POD_NAMESPACE.into(), "default".into());
    let sandbox = PodSandboxConfig {
        metadata: PodSandboxMetadata {
            name: format!("direct-{i}"),
            namespace: "default".into(),
            uid: uid.clone(),
            attempt: 0,
        },
        log_directory: logs.join(&uid),
        labels: l.clone(),
        host_network: true,
        ..Default::default()
    };
    let mut cl = l;
    cl.insert(labels::CONTAINER_NAME.into(), "app".into());
    let container = ContainerConfig {
        metadata: ContainerMetadata {
            name: "app".into(),
            attempt: 0,
        },
        image: image.into(),
        command: vec!["/bin/sleep".into(), "100000".into()],
        labels: cl,
        log_path: "app/0.log".into(),
        ..Default::default()
    };
    (sandbox, container)
}

async fn start_direct(
    rt: &CriRuntime,
    i: usize,
    image: &str,
    logs: &Path,
    tag: &str,
) -> anyhow::Result<()> {
    let (s, c) = direct_configs(i, image, logs, tag);
    let id = rt.run_pod_sandbox(&s).await?;
    let cid = rt.create_container(&id, &c, &s).await?;
    rt.start_container(&cid).await?;
    Ok(())
}

/// Removes every sandbox (and so every container) of the runtime.
async fn remove_all(rt: &CriRuntime) -> anyhow::Result<()> {
    let sandboxes = rt.list_pod_sandboxes(&SandboxFilter::default()).await?;
    let mut set = tokio::task::JoinSet::new();
    for s in sandboxes {
        let rt = rt.clone();
        set.spawn(async move {
            rt.stop_pod_sandbox(&s.id).await?;
            rt.remove_pod_sandbox(&s.id).await
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    Ok(())
}

async fn direct_sequential(
    rt: &CriRuntime,
    env: &Env,
    n: usize,
    round: usize,
) -> anyhow::Result<Duration> {
    let logs = env.dir.join("logs");
    let tag = format!("seq{round}");
    let t = Instant::now();
    for i in 0..n {
        start_direct(rt, i, &env.busybox, &logs, &tag).await?;
    }
    let d = t.elapsed();
    remove_all(rt).await?;
    Ok(d)
}

async fn direct_concurrent(
    rt: &CriRuntime,
    env: &Env,
    n: usize,
    round: usize,
    width: usize,
) -> anyhow::Result<Duration> {
    let logs = env.dir.join("logs");
    let tag = format!("par{round}");
    let t = Instant::now();
    let sem = Arc::new(tokio::sync::Semaphore::new(width));
    let mut set = tokio::task::JoinSet::new();
    for i in 0..n {
        let (rt, sem, image, logs, tag) = (
            rt.clone(),
            sem.clone(),
            env.busybox.clone(),
            logs.clone(),
            tag.clone(),
        );
        set.spawn(async move {
            let _permit = sem.acquire_owned().await?;
            start_direct(&rt, i, &image, &logs, &tag).await
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    let d = t.elapsed();
    remove_all(rt).await?;
    Ok(d)
}

async fn through_agent(
    rt: &Arc<CriRuntime>,
    env: &Env,
    n: usize,
    round: usize,
) -> anyhow::Result<Duration> {
    let pods: Vec<Pod> = (0..n).map(|i| bench_pod(i, &env.busybox)).collect();
    let uids: Vec<String> = pods.iter().filter_map(|p| p.metadata.uid.clone()).collect();
    let runtime: Arc<dyn ContainerRuntime> = rt.clone();
    let pleg = Arc::new(GenericPleg::new(
        runtime.clone(),
        GenericPlegConfig::default(),
    ));
    let root = env.dir.join(format!("agent-{round}"));
    let kubelet = KubeletBuilder::new("bench-node")
        .config(KubeletConfig::with_dirs(
            root.join("root"),
            root.join("logs"),
        ))
        .runtime(runtime)
        .pleg(pleg)
        .pod_source(Arc::new(OneSnapshot(pods)))
        .build()?;
    let statuses = kubelet.handle().statuses();
    let shutdown = CancellationToken::new();
    let t = Instant::now();
    let task = tokio::spawn(kubelet.run(shutdown.clone()));
    let deadline = t + Duration::from_secs(300);
    loop {
        let running =
            uids.iter()
                .filter(|u| {
                    statuses.get(u).is_some_and(|p| {
                        p.status.phase.as_deref() == Some("Running")
                            && p.status.container_statuses.iter().flatten().all(|c| {
                                c.state.as_ref().and_then(|s| s.running.as_ref()).is_some()
                            })
                    })
                })
                .count();
        if running == n {
            break;
        }
        if Instant::now() > deadline {
            shutdown.cancel();
            bail!("only {running}/{n} pods Running after 300 s");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let d = t.elapsed();
    shutdown.cancel();
    let _ = task.await;
    remove_all(rt).await?;
    Ok(d)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

async fn relist_cost(
    rt: &Arc<CriRuntime>,
    env: &Env,
    containers: usize,
    runs: usize,
) -> anyhow::Result<()> {
    let logs = env.dir.join("logs");
    let tag = format!("relist{containers}");
    let sem = Arc::new(tokio::sync::Semaphore::new(4));
    let mut set = tokio::task::JoinSet::new();
    for i in 0..containers {
        let (rt, sem, image, logs, tag) = (
            rt.clone(),
            sem.clone(),
            env.busybox.clone(),
            logs.clone(),
            tag.clone(),
        );
        set.spawn(async move {
            let _permit = sem.acquire_owned().await?;
            start_direct(&rt, i, &image, &logs, &tag).await
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    let runtime: Arc<dyn ContainerRuntime> = rt.clone();
    let pleg = GenericPleg::new(runtime, GenericPlegConfig::default());
    let t = Instant::now();
    let first = pleg.relist().await?;
    let first_time = t.elapsed();
    let mut relists = Vec::with_capacity(runs);
    let mut bare = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        let r = pleg.relist().await?;
        relists.push(t.elapsed());
        if r.pods_inspected != 0 {
            bail!("steady relist inspected {} pods", r.pods_inspected);
        }
        let t = Instant::now();
        let s = rt.list_pod_sandboxes(&SandboxFilter::default()).await?;
        let c = rt.list_containers(&ContainerFilter::default()).await?;
        bare.push(t.elapsed());
        if c.len() != containers || s.len() != containers {
            bail!("expected {containers} containers, listed {}", c.len());
        }
    }
    let (r, b) = (median(relists), median(bare));
    println!(
        "relist {containers:>3} containers: first relist (inspects {} pods) {:>8.2} ms; steady relist median {:>6.2} ms; \
         ListPodSandbox+ListContainers median {:>6.2} ms; ratio {:.2}",
        first.pods_inspected,
        first_time.as_secs_f64() * 1e3,
        r.as_secs_f64() * 1e3,
        b.as_secs_f64() * 1e3,
        r.as_secs_f64() / b.as_secs_f64().max(1e-9)
    );
    remove_all(rt).await?;
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let flags = Flags::parse();
    let env = Env::start()?;
    let rt = Arc::new(
        CriRuntime::connect(CriConfig::new(format!("unix://{}", env.socket.display()))).await?,
    );
    let v = rt.version().await?;
    println!(
        "runtime {} {} (CRI {}), {} pods, {} rounds",
        v.runtime_name, v.runtime_version, v.runtime_api_version, flags.pods, flags.rounds
    );
    // Warm-up: the first sandbox and container pay one-off costs (image unpack, CNI setup).
    direct_sequential(&rt, &env, 2, 0).await?;

    let (mut seq, mut par, mut agent) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=flags.rounds {
        let s = direct_sequential(&rt, &env, flags.pods, round).await?;
        let p = direct_concurrent(&rt, &env, flags.pods, round, 4).await?;
        let a = through_agent(&rt, &env, flags.pods, round).await?;
        println!(
            "round {round}: direct back-to-back {:>7.0} ms, direct 4 at a time {:>7.0} ms, agent {:>7.0} ms",
            s.as_secs_f64() * 1e3,
            p.as_secs_f64() * 1e3,
            a.as_secs_f64() * 1e3
        );
        seq.push(s);
        par.push(p);
        agent.push(a);
    }
    let (s, p, a) = (median(seq), median(par), median(agent));
    println!(
        "start {} pods (median): direct back-to-back {:.0} ms, direct 4 at a time {:.0} ms, agent {:.0} ms; \
         agent/direct back-to-back {:.2}, agent/direct 4 at a time {:.2}",
        flags.pods,
        s.as_secs_f64() * 1e3,
        p.as_secs_f64() * 1e3,
        a.as_secs_f64() * 1e3,
        a.as_secs_f64() / s.as_secs_f64(),
        a.as_secs_f64() / p.as_secs_f64()
    );
    for n in flags.relist_sizes.clone() {
        relist_cost(&rt, &env, n, flags.runs).await?;
    }
    Ok(())
}
