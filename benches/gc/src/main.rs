//! gc-bench: what disk hygiene costs.
//!
//! * `decision`: image and container garbage collection with `--images` images and `--dead`
//!   dead containers on the in-memory runtime: the planning alone (ordering and choosing, pure
//!   functions) and whole runs (detection with the listing calls, then the removals), against
//!   the **floor** of the same run: the listing calls a run cannot avoid.
//! * `logs`: the agent's CPU while a container writes `--mib-per-sec` MiB/s of logs for
//!   `--seconds` seconds on the process runtime, with the log rotator (default settings) and
//!   without it, and the log files left.
//! * `pull` (root): pulls of a `--mib` MiB image from a private registry (TLS, htpasswd) on a
//!   private containerd: through an agent (a pod with a pull secret, `imagePullPolicy: Always`;
//!   the agent's own `Pulled` time: keyring, pull gate, runtime layers, CRI) against a direct CRI
//!   `PullImage` with the same credentials, alternating, the image removed before each pull.
//!
//! `cargo run --release -p gc-bench -- decision` (or `logs`, `pull`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bench_support::{ms, percentile};
use clap::{Parser, Subcommand};
use kubelet_api::runtime::{
    AuthConfig, ContainerConfig, ContainerFilter, ContainerMetadata, ImageSpec, Labels,
    PodSandboxConfig, PodSandboxMetadata, SandboxFilter, labels,
};
use kubelet_api::{
    AgentDirs, AgentHandle, ContainerRuntime, KillPodOptions, NotRunning, PlegHealth, PluginStatus,
    StatusReader, StatusWriter, SyncLoopStalled,
};
use kubelet_core::testing::FakeRuntime;

#[derive(Parser, Debug)]
struct Flags {
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand, Debug)]
enum What {
    /// Garbage collection decisions.
    Decision {
        /// Images on the node.
        #[arg(long, default_value_t = 1000)]
        images: usize,
        /// Dead containers on the node.
        #[arg(long, default_value_t = 5000)]
        dead: usize,
        /// Rounds measured.
        #[arg(long, default_value_t = 30)]
        rounds: usize,
    },
    /// Agent CPU while a container writes logs, with and without rotation.
    Logs {
        /// How long the container writes, per variant.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Write rate.
        #[arg(long, default_value_t = 50)]
        mib_per_sec: u64,
    },
    /// A private-registry pull through the agent against a direct CRI pull (root).
    Pull {
        /// Image size.
        #[arg(long, default_value_t = 20)]
        mib: u64,
        /// Pulls per side.
        #[arg(long, default_value_t = 5)]
        rounds: usize,
    },
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
        .and_then(|rt| {
            rt.block_on(async {
                match flags.what {
                    What::Decision {
                        images,
                        dead,
                        rounds,
                    } => decision(images, dead, rounds).await,
                    What::Logs {
                        seconds,
                        mib_per_sec,
                    } => logs(seconds, mib_per_sec).await,
                    What::Pull { mib, rounds } => pull(mib, rounds).await,
                }
            })
        });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gc-bench: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn self_cpu() -> anyhow::Result<f64> {
    let u = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)?;
    let tv = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    Ok(tv(u.user_time()) + tv(u.system_time()))
}

fn summary(label: &str, mut v: Vec<Duration>) {
    v.sort();
    println!(
        "{label:<44} p50 {:>9.3} ms   p99 {:>9.3} ms",
        ms(percentile(&v, 0.5)),
        ms(percentile(&v, 0.99))
    );
}

// --- decision -------------------------------------------------------------------------------

/// The agent as the container collector sees it: every pod known, sources ready.
struct Known(StatusWriter);

#[async_trait::async_trait]
impl AgentHandle for Known {
    fn statuses(&self) -> StatusReader {
        self.0.reader()
    }
    fn pleg_health(&self) -> PlegHealth {
        PlegHealth::Healthy
    }
    fn sync_loop_health(&self, _: Duration) -> Result<(), SyncLoopStalled> {
        Ok(())
    }
    fn plugins(&self) -> Vec<PluginStatus> {
        Vec::new()
    }
    fn metrics(&self) -> Arc<kubelet_api::prometheus_client::registry::Registry> {
        Arc::default()
    }
    fn sync_pod(&self, _: &str) {}
    async fn kill_pod(&self, _: &str, _: KillPodOptions) -> Result<(), NotRunning> {
        Ok(())
    }
    fn sources_ready(&self) -> bool {
        true
    }
}

fn labelled(uid: &str, name: Option<&str>) -> Labels {
    let mut l = Labels::new();
    l.insert(labels::POD_UID.into(), uid.into());
    l.insert(labels::MANAGED_BY.into(), "true".into());
    if let Some(n) = name {
        l.insert(labels::CONTAINER_NAME.into(), n.into());
    }
    l
}

/// A fake node: `images` images (a tenth in use), `dead` dead containers in pods of two
/// containers with five dead instances each.
async fn node(images: usize, dead: usize) -> anyhow::Result<(FakeRuntime, Known)> {
    let rt = FakeRuntime::new();
    rt.set_images_present_by_default(false);
    for i in 0..images {
        rt.add_image(&format!("registry.example/app-{i}:v1"), 10 << 20, i == 0);
    }
    let statuses = StatusWriter::new();
    let per_pod = 10;
    let pods = dead.div_ceil(per_pod);
    let mut made = 0;
    for p in 0..pods {
        let uid = format!("pod-{p}");
        let mut sb = PodSandboxConfig::new(PodSandboxMetadata {
            name: uid.clone(),
            namespace: "default".into(),
            uid: uid.clone(),
            attempt: 0,
        });
        sb.labels = labelled(&uid, None);
        let sid = rt.run_pod_sandbox(&sb).await?;
        let image = format!("registry.example/app-{}:v1", p % images.max(1));
        for n in 0..per_pod {
            if made == dead {
                break;
            }
            let name = format!("c{}", n % 2);
            let mut c = ContainerConfig::new(
                ContainerMetadata {
                    name: name.clone(),
                    attempt: (n / 2) as u32,
                },
                image.clone(),
            );
            c.labels = labelled(&uid, Some(&name));
            let id = rt.create_container(&sid, &c, &sb).await?;
            rt.start_container(&id).await?;
            rt.exit_container(&id, 1)?;
            made += 1;
        }
        let mut pod = k8s_openapi::api::core::v1::Pod::default();
        pod.metadata.uid = Some(uid);
        statuses.put(Arc::new(pod), Arc::default());
    }
    Ok((rt, Known(statuses)))
}

async fn decision(images: usize, dead: usize, rounds: usize) -> anyhow::Result<()> {
    println!("gc-bench decision: {images} images, {dead} dead containers, {rounds} rounds");
    // Planning alone.
    let base = tokio::time::Instant::now();
    let candidates: Vec<kubelet_gc::images::Candidate> = (0..images)
        .map(|i| kubelet_gc::images::Candidate {
            id: format!("sha256:{i:064x}"),
            size: 10 << 20,
            last_used: (i % 3 != 0).then(|| base + Duration::from_secs((i * 7 % 1000) as u64)),
            first_detected: base,
        })
        .collect();
    let now = base + Duration::from_secs(2000);
    let dead_list: Vec<kubelet_gc::containers::DeadContainer> = (0..dead)
        .map(|i| kubelet_gc::containers::DeadContainer {
            id: format!("c-{i}"),
            pod_uid: format!("pod-{}", i / 10),
            name: format!("c{}", i % 2),
            attempt: (i % 10 / 2) as u32,
            created: i as i128,
        })
        .collect();
    let policy = kubelet_gc::ContainerGcPolicy::default();
    let (mut image_plan, mut container_plan) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t = Instant::now();
        let ordered = kubelet_gc::images::eviction_order(candidates.clone());
        let plan = kubelet_gc::images::plan_free(&ordered, u64::MAX / 2, now, Duration::ZERO);
        std::hint::black_box(plan.len());
        image_plan.push(t.elapsed());
        let t = Instant::now();
        let plan = kubelet_gc::containers::plan_dead_containers(
            dead_list.clone(),
            &policy,
            true,
            false,
            &|_| true,
            &|_| false,
        );
        std::hint::black_box(plan.len());
        container_plan.push(t.elapsed());
    }
    summary("image plan (order + choose)", image_plan);
    summary("container plan (group + choose)", container_plan);

    // Whole runs on the in-memory runtime, with the listing floor.
    let (mut floor, mut detect, mut containers) = (Vec::new(), Vec::new(), Vec::new());
    let dirs = AgentDirs {
        root_dir: PathBuf::from("/nonexistent/root"),
        pod_log_dir: PathBuf::from("/nonexistent/logs"),
    };
    for _ in 0..rounds.min(10) {
        let (rt, known) = node(images, dead).await?;
        let t = Instant::now();
        let listed = rt
            .images()
            .ok_or_else(|| anyhow::anyhow!("no images"))?
            .list_images()
            .await?;
        let all = rt.list_containers(&ContainerFilter::default()).await?;
        let sandboxes = rt.list_pod_sandboxes(&SandboxFilter::default()).await?;
        std::hint::black_box((listed.len(), all.len(), sandboxes.len()));
        floor.push(t.elapsed());
        let gc = kubelet_gc::images::ImageGc::new(kubelet_gc::ImageGcPolicy::default());
        let t = Instant::now();
        let c = gc.detect(&rt, tokio::time::Instant::now()).await?;
        std::hint::black_box(kubelet_gc::images::eviction_order(c).len());
        detect.push(t.elapsed());
        let cgc = kubelet_gc::containers::ContainerGc::new(
            kubelet_gc::ContainerGcPolicy::default(),
            dirs.clone(),
            None,
        );
        let t = Instant::now();
        let out = cgc.collect(&rt, &known, false).await?;
        containers.push(t.elapsed());
        std::hint::black_box(out.containers.len());
    }
    summary("floor: list images, containers, sandboxes", floor);
    summary("image GC detection + order (1 run)", detect);
    summary("container GC run (plan + removals)", containers);
    Ok(())
}

// --- logs -----------------------------------------------------------------------------------

async fn logs(seconds: u64, mib_per_sec: u64) -> anyhow::Result<()> {
    println!(
        "gc-bench logs: a container writing {mib_per_sec} MiB/s for {seconds} s, process runtime"
    );
    for rotate in [false, true] {
        let dir = tempfile::Builder::new()
            .prefix("ksdk-gc-bench-")
            .tempdir_in("/tmp")?;
        let (cpu, files) = logs_once(dir.path(), seconds, mib_per_sec, rotate).await?;
        let total: u64 = files.values().sum();
        println!(
            "{:<16} agent CPU {:>6.2} s = {:>5.2} % of a core; {} files, {:.0} MiB on disk, largest {:.0} MiB",
            if rotate {
                "with rotation"
            } else {
                "without rotation"
            },
            cpu,
            cpu / seconds as f64 * 100.0,
            files.len(),
            total as f64 / 1048576.0,
            files.values().max().copied().unwrap_or(0) as f64 / 1048576.0,
        );
    }
    Ok(())
}

async fn logs_once(
    dir: &Path,
    seconds: u64,
    mib_per_sec: u64,
    rotate: bool,
) -> anyhow::Result<(f64, BTreeMap<String, u64>)> {
    use kubelet_api::AgentPlugin;
    let chunk = dir.join("chunk.txt");
    // A tenth of a second's output: lines of 1 KiB.
    let line = format!("{}\n", "x".repeat(1023));
    std::fs::write(&chunk, line.repeat((mib_per_sec * 1024 / 10) as usize))?;
    let config = kubelet_process::ProcessRuntimeConfig::new(dir.join("state"))
        .shim(kubelet_process::ShimCommand::CurrentExe)
        .use_cgroups(false);
    let rt: Arc<dyn ContainerRuntime> = Arc::new(kubelet_process::ProcessRuntime::new(config)?);
    let mut sb = PodSandboxConfig::new(PodSandboxMetadata {
        name: "chatty".into(),
        namespace: "default".into(),
        uid: "chatty".into(),
        attempt: 0,
    });
    sb.labels = labelled("chatty", None);
    sb.log_directory = dir.join("logs/default_chatty_chatty");
    sb.host_network = true;
    std::fs::create_dir_all(&sb.log_directory)?;
    let sid = rt.run_pod_sandbox(&sb).await?;
    let mut c = ContainerConfig::new(
        ContainerMetadata {
            name: "app".into(),
            attempt: 0,
        },
        "host",
    );
    c.labels = labelled("chatty", Some("app"));
    c.log_path = "app/0.log".into();
    c.command = vec![
        "/bin/sh".into(),
        "-c".into(),
        format!(
            "end=$(($(date +%s) + {seconds})); while [ $(date +%s) -lt $end ]; do cat {}; sleep 0.1; done; sleep 3600",
            chunk.display()
        ),
    ];
    let cid = rt.create_container(&sid, &c, &sb).await?;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let plugin = kubelet_gc::GcPlugin::new(kubelet_gc::GcConfig::new())?;
    let before = self_cpu()?;
    let started = Instant::now();
    rt.start_container(&cid).await?;
    let task = rotate.then(|| {
        let handle: Arc<dyn AgentHandle> = Arc::new(Known(StatusWriter::new()));
        let ctx = kubelet_api::PluginContext::new(
            "bench",
            AgentDirs {
                root_dir: dir.join("root"),
                pod_log_dir: dir.join("logs"),
            },
            rt.clone(),
            kubelet_api::EventRecorder::channel(64).0,
            handle,
            kubelet_api::NodeConditionReader::new(Arc::from(Vec::new())),
            Arc::default(),
        );
        let token = shutdown.clone();
        tokio::spawn(async move { plugin.run(ctx, token).await })
    });
    tokio::time::sleep(Duration::from_secs(seconds).saturating_sub(started.elapsed())).await;
    let cpu = self_cpu()? - before;
    shutdown.cancel();
    if let Some(t) = task {
        let _ = t.await;
    }
    rt.stop_container(&cid, Duration::ZERO).await?;
    rt.stop_pod_sandbox(&sid).await?;
    let mut files = BTreeMap::new();
    for e in std::fs::read_dir(sb.log_directory.join("app"))? {
        let e = e?;
        files.insert(
            e.file_name().to_string_lossy().into_owned(),
            e.metadata()?.len(),
        );
    }
    rt.remove_pod_sandbox(&sid).await?;
    Ok((cpu, files))
}

// --- pull -----------------------------------------------------------------------------------

fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts")
}

async fn pull(mib: u64, rounds: usize) -> anyhow::Result<()> {
    anyhow::ensure!(
        nix::unistd::geteuid().is_root(),
        "pull needs root (containerd)"
    );
    let env = bench_support::ContainerdEnv::start("start", "ksdk-gc-bench-")?;
    let registry_dir = env.dir.join("registry");
    let out = std::process::Command::new("bash")
        .arg(scripts().join("registry-test-env.sh"))
        .arg("start")
        .arg(&registry_dir)
        .arg(env.dir.join("certs.d"))
        .env("REGISTRY_BIG_IMAGE_MIB", mib.to_string())
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "registry-test-env.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let vars: BTreeMap<String, String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let result = pull_rounds(&env, &vars, rounds).await;
    let _ = std::process::Command::new("bash")
        .arg(scripts().join("registry-test-env.sh"))
        .arg("stop")
        .arg(&registry_dir)
        .status();
    result
}

async fn pull_rounds(
    env: &bench_support::ContainerdEnv,
    vars: &BTreeMap<String, String>,
    rounds: usize,
) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::{Container, LocalObjectReference, Pod, PodSpec, Secret};
    let var = |k: &str| vars.get(k).cloned().unwrap_or_default();
    let image = var("BIG_IMAGE");
    let image = image.as_str();
    let (host, user, password) = (
        var("REGISTRY"),
        var("REGISTRY_USER"),
        var("REGISTRY_PASSWORD"),
    );
    println!(
        "gc-bench pull: {image} from a private registry on containerd {}",
        env.version
    );
    let cri = Arc::new(
        kubelet_cri::CriRuntime::connect(
            kubelet_cri::CriConfig::new(env.endpoint()).request_timeout(Duration::from_secs(120)),
        )
        .await?,
    );
    let images = cri.images().ok_or_else(|| anyhow::anyhow!("no images"))?;
    let spec = ImageSpec::new(image);
    let remove = || async {
        if let Some(i) = images.image_status(&spec).await? {
            images.remove_image(&ImageSpec::new(i.id)).await?;
        }
        anyhow::Ok(())
    };
    // The agent: a pod per round with the pull secret and `imagePullPolicy: Always`.
    let objects = kubelet_api::StaticObjects::new();
    let mut secret = Secret {
        type_: Some("kubernetes.io/dockerconfigjson".into()),
        data: Some(
            [(
                ".dockerconfigjson".to_string(),
                k8s_openapi::ByteString(
                    format!(r#"{{"auths": {{"{host}": {{"username": "{user}", "password": "{password}"}}}}}}"#)
                        .into_bytes(),
                ),
            )]
            .into_iter()
            .collect(),
        ),
        ..Default::default()
    };
    secret.metadata.name = Some("registry".into());
    secret.metadata.namespace = Some("default".into());
    objects.put_secret(secret);
    let dir = tempfile::Builder::new()
        .prefix("ksdk-gc-bench-agent-")
        .tempdir_in("/tmp")?;
    let runtime: Arc<dyn ContainerRuntime> = kubelet_core::layer::RuntimeLayer::layer(
        &kubelet_core::layer::OperationMetrics::new(),
        kubelet_core::layer::RuntimeLayer::layer(
            &kubelet_core::layer::Deadlines::new(Duration::from_secs(120)),
            cri.clone(),
        ),
    );
    let (pleg, events) =
        kubelet_pleg::GenericPleg::new(runtime.clone(), kubelet_pleg::GenericPlegConfig::default());
    let sink = Arc::new(kubelet_core::testing::RecordingSink::new());
    let (source, pods) = kubelet_core::testing::WatchSource::new(Some(Vec::new()));
    let agent = kubelet_core::KubeletBuilder::new("bench-node")
        .config(kubelet_core::KubeletConfig::with_dirs(
            dir.path().join("root"),
            dir.path().join("logs"),
        ))
        .runtime(runtime)
        .pleg(Arc::new(pleg), events)
        .pod_source(Arc::new(source))
        .status_sink(sink.clone())
        .object_provider(Arc::new(objects))
        .build()?;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(agent.run(shutdown.clone()));
    let auth = AuthConfig::basic(&user, &password);
    let (mut direct, mut through) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        remove().await?;
        let t = Instant::now();
        images
            .pull_image(&spec, Some(&auth), &PodSandboxConfig::default())
            .await?;
        direct.push(t.elapsed());
        remove().await?;
        let uid = format!("pull-{round}");
        let mut pod = Pod {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "app".into(),
                    image: Some(image.to_string()),
                    image_pull_policy: Some("Always".into()),
                    command: Some(vec!["/none".into()]),
                    ..Default::default()
                }],
                image_pull_secrets: Some(vec![LocalObjectReference {
                    name: "registry".into(),
                }]),
                host_network: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        };
        pod.metadata.name = Some(uid.clone());
        pod.metadata.namespace = Some("default".into());
        pod.metadata.uid = Some(uid.clone());
        pods.send_replace(Some(vec![pod]));
        let deadline = Instant::now() + Duration::from_secs(120);
        let pulled = loop {
            let found = sink
                .events()
                .into_iter()
                .find(|e| e.involved.uid == uid && e.reason == "Pulled");
            if let Some(e) = found {
                break e.message;
            }
            anyhow::ensure!(Instant::now() < deadline, "no Pulled event for {uid}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        // "Successfully pulled image "<img>" in <seconds>s"
        let secs: f64 = pulled
            .rsplit(" in ")
            .next()
            .and_then(|s| s.trim_end_matches('s').parse().ok())
            .ok_or_else(|| anyhow::anyhow!("unexpected Pulled message {pulled:?}"))?;
        through.push(Duration::from_secs_f64(secs));
        pods.send_replace(Some(Vec::new()));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    shutdown.cancel();
    let _ = task.await;
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        percentile(v, 0.5)
    };
    let (d, a) = (median(&mut direct), median(&mut through));
    summary("direct CRI PullImage", direct.clone());
    summary("through the agent (its Pulled time)", through.clone());
    println!(
        "ratio agent / direct (medians): {:.3}",
        a.as_secs_f64() / d.as_secs_f64()
    );
    for s in cri.list_pod_sandboxes(&SandboxFilter::default()).await? {
        let _ = cri.stop_pod_sandbox(&s.id).await;
        let _ = cri.remove_pod_sandbox(&s.id).await;
    }
    Ok(())
}
