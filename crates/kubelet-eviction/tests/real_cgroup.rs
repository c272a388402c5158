//! One real test, as root: a memory hog container (process runtime, through the engine) grows
//! inside a test cgroup with a 512 MiB limit that stands for "the node"; `memory.available<200Mi`
//! is crossed and the pod is evicted — Failed, reason Evicted, the kubelet's message, condition
//! DisruptionTarget — before the kernel OOM killer fires.
//!
//! Runs without the libtest harness: this file's `main` is also the process runtime's shim and
//! the hog program (`eviction-test-hog <MiB/s> <target MiB>`).

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use kubelet_api::AgentHandle;
use kubelet_api::runtime::SandboxFilter;
use kubelet_api::{ContainerRuntime, PodSource, SourceSender};
use kubelet_core::{KubeletBuilder, KubeletConfig};
use kubelet_eviction::{
    CgroupFs, EvictionConfig, EvictionPlugin, EvictionSettings, MachineStats, MachineStatsConfig,
    ManagerEvent, parse_threshold_flag,
};
use kubelet_process::{ProcessRuntime, ProcessRuntimeConfig, ShimCommand};
use tokio_util::sync::CancellationToken;

const HOG_ARG: &str = "eviction-test-hog";
const MI: usize = 1 << 20;
const LIMIT_MIB: u64 = 512;

fn main() -> ExitCode {
    if let Some(code) = kubelet_process::shim::maybe_run_shim() {
        return code;
    }
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(HOG_ARG) {
        let rate: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(50);
        let target: usize = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(700);
        hog(rate, target);
    }
    if args.iter().any(|a| a == "--list") {
        println!("hog_in_a_limited_cgroup_is_evicted_before_the_oom_killer: test");
        return ExitCode::SUCCESS;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(hog_in_a_limited_cgroup_is_evicted_before_the_oom_killer());
    println!("test hog_in_a_limited_cgroup_is_evicted_before_the_oom_killer ... ok");
    ExitCode::SUCCESS
}

/// Allocate and touch `rate` MiB/s up to `target` MiB, then sleep.
fn hog(rate: usize, target: usize) -> ! {
    let chunk = 4 * MI;
    let per_chunk = Duration::from_secs_f64(4.0 / rate as f64);
    let mut held: Vec<Vec<u8>> = Vec::new();
    let start = Instant::now();
    while held.len() * 4 < target {
        held.push(vec![0x5a; chunk]);
        let due = per_chunk * held.len() as u32;
        if let Some(wait) = due.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        if held.len().is_multiple_of(25) {
            println!("hog: {} MiB", held.len() * 4);
        }
    }
    println!("hog: reached {target} MiB");
    loop {
        std::thread::sleep(Duration::from_secs(60));
        std::hint::black_box(&held);
    }
}

fn skip(reason: &str) {
    if std::env::var("KUBELET_SDK_REQUIRE_ROOT").as_deref() == Ok("1") {
        panic!("KUBELET_SDK_REQUIRE_ROOT=1 but {reason}");
    }
    println!("skipping hog_in_a_limited_cgroup_is_evicted_before_the_oom_killer: {reason}");
}

struct OnePod(Pod);

#[async_trait::async_trait]
impl PodSource for OnePod {
    fn name(&self) -> &str {
        "api"
    }
    async fn run(&self, out: SourceSender, shutdown: CancellationToken) {
        let _ = out.snapshot(vec![self.0.clone()]).await;
        shutdown.cancelled().await;
    }
}

/// The test cgroup standing for the node; removed on drop.
struct TestCgroup {
    dir: PathBuf,
    fs: CgroupFs,
    name: String,
}

impl TestCgroup {
    fn create(fs: CgroupFs, name: &str) -> std::io::Result<Self> {
        let dir = fs.dir(Path::new(name));
        match &fs {
            CgroupFs::V1 { .. } => {
                std::fs::create_dir_all(&dir)?;
                std::fs::write(
                    dir.join("memory.limit_in_bytes"),
                    (LIMIT_MIB << 20).to_string(),
                )?;
            }
            CgroupFs::V2 { root } => {
                let _ = std::fs::write(root.join("cgroup.subtree_control"), "+memory");
                std::fs::create_dir_all(&dir)?;
                std::fs::write(dir.join("memory.max"), (LIMIT_MIB << 20).to_string())?;
                let _ = std::fs::write(dir.join("memory.swap.max"), "0");
            }
        }
        Ok(Self {
            dir,
            fs,
            name: name.to_string(),
        })
    }

    /// OOM kills recorded in the cgroup's subtree.
    fn oom_kills(&self) -> Option<u64> {
        let (file, key) = match self.fs {
            CgroupFs::V1 { .. } => ("memory.oom_control", "oom_kill"),
            CgroupFs::V2 { .. } => ("memory.events", "oom_kill"),
        };
        let text = std::fs::read_to_string(self.dir.join(file)).ok()?;
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == key).then(|| v.trim().parse().ok()).flatten()
        })
    }
}

/// Every cgroup mount point (v1 hierarchies and the unified one).
fn cgroup_mounts() -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let fstype = post.split_whitespace().next()?;
            let mp = pre.split_whitespace().nth(4)?;
            matches!(fstype, "cgroup" | "cgroup2").then(|| PathBuf::from(mp))
        })
        .collect()
}

/// Remove `dir` and the cgroups below it, deepest first.
fn remove_cgroup_tree(dir: &Path) {
    let mut dirs = vec![];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(rd) = std::fs::read_dir(&d) {
            stack.extend(
                rd.filter_map(|e| e.ok())
                    .map(|e| e.path())
                    .filter(|p| p.is_dir()),
            );
        }
        dirs.push(d);
    }
    for d in dirs.iter().rev() {
        if let Err(e) = std::fs::remove_dir(d) {
            eprintln!("removing test cgroup {}: {e}", d.display());
        }
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // The runtime creates `<name>` in every hierarchy it uses (memory, cpu, pids, …).
        for mp in cgroup_mounts() {
            let d = mp.join(&self.name);
            if d.is_dir() {
                remove_cgroup_tree(&d);
            }
        }
        if self.dir.is_dir() {
            remove_cgroup_tree(&self.dir);
        }
    }
}

async fn hog_in_a_limited_cgroup_is_evicted_before_the_oom_killer() {
    if !nix::unistd::Uid::effective().is_root() {
        return skip("not root");
    }
    let Some(fs) = CgroupFs::detect(Path::new("/proc")) else {
        return skip("no memory cgroup hierarchy");
    };
    let name = format!("kubelet-sdk-eviction-test-{}", std::process::id());
    let cgroup = match TestCgroup::create(fs.clone(), &name) {
        Ok(c) => c,
        Err(e) => return skip(&format!("cannot create a limited memory cgroup: {e}")),
    };
    let tmp = tempfile::tempdir().unwrap();
    let runtime: Arc<dyn ContainerRuntime> = Arc::new(
        ProcessRuntime::new(
            ProcessRuntimeConfig::new(tmp.path().join("runtime"))
                .shim(ShimCommand::CurrentExe)
                .cgroup_parent(&name),
        )
        .unwrap(),
    );

    let exe = std::env::current_exe().unwrap();
    let mut pod = Pod {
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "hog".into(),
                image: Some("host".into()),
                command: Some(vec![
                    exe.display().to_string(),
                    HOG_ARG.into(),
                    "50".into(),
                    "700".into(),
                ]),
                ..Default::default()
            }],
            restart_policy: Some("Always".into()),
            termination_grace_period_seconds: Some(30),
            ..Default::default()
        }),
        ..Default::default()
    };
    pod.metadata.name = Some("hog".into());
    pod.metadata.namespace = Some("default".into());
    pod.metadata.uid = Some("eviction-test-hog-uid".into());

    let mut settings = EvictionSettings::default();
    settings.hard = Some(parse_threshold_flag("evictionHard", "memory.available<200Mi").unwrap());
    let config = EvictionConfig::from_settings(&settings).unwrap();
    let stats = MachineStats::new(MachineStatsConfig::detect().memory_cgroup(&name))
        .with_runtime(runtime.clone());
    let eviction = EvictionPlugin::new(config).stats(Arc::new(stats));
    let mut events = eviction.subscribe();
    let (pleg, pleg_events) = kubelet_pleg::GenericPleg::new(runtime.clone(), Default::default());
    let pleg = std::sync::Arc::new(pleg);
    let kubelet = KubeletBuilder::new("eviction-test-node")
        .config(KubeletConfig::with_dirs(
            tmp.path().join("root"),
            tmp.path().join("logs"),
        ))
        .runtime(runtime.clone())
        .pleg(pleg, pleg_events)
        .pod_source(Arc::new(OnePod(pod)))
        .plugin(Arc::new(eviction))
        .build()
        .unwrap();
    let handle = kubelet.handle();
    let shutdown = CancellationToken::new();
    let agent = tokio::spawn(kubelet.run(shutdown.clone()));

    let started = Instant::now();
    let deadline = started + Duration::from_secs(90);
    let status = loop {
        if let Some(p) = handle.statuses().get("eviction-test-hog-uid")
            && p.status.phase.as_deref() == Some("Failed")
        {
            break Some(p.status);
        }
        if Instant::now() >= deadline {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!(
        "evicted after {:?}: {:?}",
        started.elapsed(),
        status.as_ref().map(|s| &s.message)
    );
    let mut crossed = None;
    while let Ok(e) = events.try_recv() {
        match e {
            ManagerEvent::Crossed {
                source, available, ..
            } => {
                println!(
                    "crossing detected by {source}, available {} MiB",
                    available >> 20
                );
                crossed.get_or_insert(source);
            }
            ManagerEvent::Evicted(ev) => {
                println!("evicted {} (grace {} s)", ev.pod, ev.grace_period_seconds)
            }
            ManagerEvent::Synchronized { .. } => {}
        }
    }

    shutdown.cancel();
    let _ = agent.await;
    // Clean up every sandbox (the agent leaves pods behind when it stops).
    for sb in runtime
        .list_pod_sandboxes(&SandboxFilter::default())
        .await
        .unwrap_or_default()
    {
        let _ = runtime.stop_pod_sandbox(&sb.id).await;
        let _ = runtime.remove_pod_sandbox(&sb.id).await;
    }
    let oom_kills = cgroup.oom_kills();
    drop(cgroup);

    let status = status.expect("the hog was not evicted within 90 s");

    assert_eq!(status.reason.as_deref(), Some("Evicted"));
    let msg = status.message.clone().unwrap_or_default();
    assert!(
        msg.starts_with(
            "The node was low on resource: memory. Threshold quantity: 200Mi, available: "
        ),
        "{msg}"
    );
    assert!(
        msg.contains("Container hog was using ")
            && msg.contains(", request is 0, has larger consumption of memory. "),
        "{msg}"
    );
    let cond = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "DisruptionTarget")
        .expect("DisruptionTarget condition");
    assert_eq!(cond.status, "True");
    assert_eq!(cond.reason.as_deref(), Some("TerminationByKubelet"));
    let hog = status
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == "hog")
        .expect("hog status");
    let terminated = hog
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .expect("hog terminated");
    assert_ne!(
        terminated.reason.as_deref(),
        Some("OOMKilled"),
        "{terminated:?}"
    );
    assert_eq!(
        oom_kills,
        Some(0),
        "the kernel OOM killer fired in the test cgroup"
    );
    assert!(crossed.is_some(), "the fast check saw the crossing");
}
