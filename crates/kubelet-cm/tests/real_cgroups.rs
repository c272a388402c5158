//! The container manager on this machine's real cgroups, as root, with the process runtime
//! through the engine: Guaranteed, Burstable and BestEffort pods land in their QoS tier with the
//! kubelet's CPU shares, quota and memory limit (read from the cgroup files); with the static
//! CPU manager and CPU 0 reserved, the Guaranteed 1-CPU container runs pinned to CPU 1 and the
//! BestEffort one on CPU 0, and the assignment survives an agent restart without restarting the
//! container; once the pods are deleted their pod cgroups are gone.
//!
//! Runs without the libtest harness: this file's `main` is also the process runtime's shim.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kubelet_api::ContainerRuntime;
use kubelet_api::resources::QosClass;
use kubelet_api::runtime::{ContainerFilter, labels};
use kubelet_cm::cgroups::Hierarchy;
use kubelet_cm::{CmConfig, ContainerManager, CpuManagerPolicy};
use kubelet_core::testing::{RecordingSink, WatchSource};
use kubelet_core::{KubeletBuilder, KubeletConfig};
use kubelet_process::{ProcessRuntime, ProcessRuntimeConfig, ShimCommand};
use kubelet_stats::CgroupVersion;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const TEST: &str = "qos_tiers_cpu_pinning_restart_and_teardown_on_real_cgroups";

fn main() -> ExitCode {
    if let Some(code) = kubelet_process::shim::maybe_run_shim() {
        return code;
    }
    if std::env::args().any(|a| a == "--list") {
        println!("{TEST}: test");
        return ExitCode::SUCCESS;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(run());
    println!("test {TEST} ... ok");
    ExitCode::SUCCESS
}

fn skip(reason: &str) {
    if std::env::var("KUBELET_SDK_REQUIRE_ROOT").as_deref() == Ok("1") {
        panic!("KUBELET_SDK_REQUIRE_ROOT=1 but {reason}");
    }
    println!("skipping {TEST}: {reason}");
}

fn pod(name: &str, requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Pod {
    let map = |kv: &[(&str, &str)]| {
        (!kv.is_empty()).then(|| {
            kv.iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect()
        })
    };
    let mut p = Pod {
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "app".into(),
                image: Some("host".into()),
                command: Some(vec!["/bin/sh".into(), "-c".into(), "sleep 600".into()]),
                resources: Some(ResourceRequirements {
                    requests: map(requests),
                    limits: map(limits),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            host_network: Some(true),
            termination_grace_period_seconds: Some(2),
            ..Default::default()
        }),
        ..Default::default()
    };
    p.metadata.name = Some(name.into());
    p.metadata.namespace = Some("default".into());
    p.metadata.uid = Some(format!("cm-test-{name}-{}", std::process::id()));
    p
}

/// Every cgroup mount point.
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

/// Removes the test's cgroup root from every hierarchy (deepest first) when dropped.
struct CgroupRoot(String);

impl Drop for CgroupRoot {
    fn drop(&mut self) {
        for mp in cgroup_mounts() {
            let top = mp.join(&self.0);
            let mut dirs = vec![];
            let mut stack = vec![top];
            while let Some(d) = stack.pop() {
                if let Ok(rd) = std::fs::read_dir(&d) {
                    stack.extend(rd.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
                    dirs.push(d);
                }
            }
            for d in dirs.iter().rev() {
                if let Ok(t) = std::fs::read_to_string(d.join("cgroup.procs")) {
                    for pid in t.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(pid),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    }
                }
                for _ in 0..50 {
                    if std::fs::remove_dir(d).is_ok() || !d.exists() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }
}

struct Agent {
    cm: ContainerManager,
    runtime: Arc<dyn ContainerRuntime>,
    sink: Arc<RecordingSink>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

fn start(dir: &Path, config: &CmConfig, source: WatchSource) -> Agent {
    let runtime: Arc<dyn ContainerRuntime> = Arc::new(
        ProcessRuntime::new(
            ProcessRuntimeConfig::new(dir.join("runtime"))
                .shim(ShimCommand::CurrentExe)
                .cgroup_parent(format!("kubelet-cm-test-rt-{}", std::process::id())),
        )
        .unwrap(),
    );
    let cm = ContainerManager::new("cm-test-node", config.clone()).unwrap();
    assert_eq!(cm.cgroups_disabled_reason(), None);
    let (pleg, pleg_events) = kubelet_pleg::GenericPleg::new(runtime.clone(), Default::default());
    let sink = Arc::new(RecordingSink::new());
    let kubelet = KubeletBuilder::new("cm-test-node")
        .config(KubeletConfig::with_dirs(dir.join("root"), dir.join("logs")))
        .runtime(runtime.clone())
        .pleg(Arc::new(pleg), pleg_events)
        .pod_source(Arc::new(source))
        .status_sink(sink.clone())
        .plugin(Arc::new(cm.clone()))
        .build()
        .unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(kubelet.run(shutdown.clone()));
    Agent {
        cm,
        runtime,
        sink,
        shutdown,
        task,
    }
}

impl Agent {
    async fn running(&self, uid: &str) {
        let got = self
            .sink
            .wait_for(
                |s| s.uid == uid && s.status.phase.as_deref() == Some("Running"),
                Duration::from_secs(60),
            )
            .await;
        assert!(
            got.is_some(),
            "pod {uid} never Running; latest {:?}; events {:#?}",
            self.sink.latest(uid),
            self.sink.events()
        );
    }

    async fn container_id(&self, uid: &str) -> String {
        let mut f = ContainerFilter::default();
        f.label_selector.insert(labels::POD_UID.into(), uid.into());
        let list = self.runtime.list_containers(&f).await.unwrap();
        if list.len() != 1 {
            for c in &list {
                eprintln!("{:?}", self.runtime.container_status(&c.id).await);
            }
            panic!("{list:?}");
        }
        list[0].id.clone()
    }

    async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }
}

fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.join(file).display()))
        .trim()
        .to_string()
}

/// The CPUs the processes of container `id` (a child of pod cgroup `pod_dir`) may run on.
fn allowed_cpus(pod_dir: &Path, id: &str) -> String {
    let pids = read(&pod_dir.join(id), "cgroup.procs");
    let pid = pids
        .lines()
        .last()
        .expect("a process in the container cgroup");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .to_string()
}

async fn run() {
    if !nix::unistd::Uid::effective().is_root() {
        return skip("not root");
    }
    let Some(probe) = Hierarchy::detect(kubelet_cm::CgroupDriver::Cgroupfs, "/") else {
        return skip("no cgroup hierarchy with a memory controller");
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let root_name = format!("kubelet-cm-test-{}", std::process::id());
    let _guard = CgroupRoot(root_name.clone());
    let tmp = tempfile::tempdir().unwrap();
    let mut config = CmConfig::default();
    config.root_dir = tmp.path().join("root");
    config.cgroup_root = format!("/{root_name}");
    config.pod_pids_limit = 512;

    // Part 1: the QoS tiers, without the CPU manager.
    let guaranteed = pod("guaranteed", &[], &[("cpu", "1"), ("memory", "64Mi")]);
    let burstable = pod(
        "burstable",
        &[("cpu", "250m"), ("memory", "32Mi")],
        &[("memory", "128Mi")],
    );
    let best_effort = pod("besteffort", &[], &[]);
    // Ends on its own a few housekeeping passes after it started, and stays in its source.
    let mut finishing = pod("finishing", &[], &[]);
    if let Some(spec) = finishing.spec.as_mut() {
        spec.restart_policy = Some("Never".into());
        spec.containers[0].command = Some(vec!["/bin/sh".into(), "-c".into(), "sleep 8".into()]);
    }
    let uid = |p: &Pod| p.metadata.uid.clone().unwrap();
    let (source, tx): (WatchSource, watch::Sender<Option<Vec<Pod>>>) =
        WatchSource::new(Some(vec![
            guaranteed.clone(),
            burstable.clone(),
            best_effort.clone(),
            finishing.clone(),
        ]));
    let agent = start(tmp.path(), &config, source);
    for p in [&guaranteed, &burstable, &best_effort, &finishing] {
        agent.running(&uid(p)).await;
    }
    let h = agent.cm.hierarchy().unwrap().clone();
    let dir = |c: &str, q: QosClass, p: &Pod| h.dir(c, &h.pod(q, &uid(p))).unwrap();
    let finished_dir = dir("memory", QosClass::BestEffort, &finishing);
    assert!(finished_dir.is_dir(), "{}", finished_dir.display());
    let g = (QosClass::Guaranteed, &guaranteed);
    let b = (QosClass::Burstable, &burstable);
    let e = (QosClass::BestEffort, &best_effort);
    match probe.version() {
        CgroupVersion::V1 => {
            assert_eq!(read(&dir("cpu", g.0, g.1), "cpu.shares"), "1024");
            assert_eq!(read(&dir("cpu", g.0, g.1), "cpu.cfs_quota_us"), "100000");
            assert_eq!(read(&dir("cpu", g.0, g.1), "cpu.cfs_period_us"), "100000");
            assert_eq!(
                read(&dir("memory", g.0, g.1), "memory.limit_in_bytes"),
                (64u64 << 20).to_string()
            );
            assert_eq!(read(&dir("cpu", b.0, b.1), "cpu.shares"), "256");
            assert_eq!(read(&dir("cpu", b.0, b.1), "cpu.cfs_quota_us"), "-1");
            assert_eq!(
                read(&dir("memory", b.0, b.1), "memory.limit_in_bytes"),
                (128u64 << 20).to_string()
            );
            assert_eq!(read(&dir("cpu", e.0, e.1), "cpu.shares"), "2");
            assert_eq!(read(&dir("pids", e.0, e.1), "pids.max"), "512");
            // The tiers: BestEffort at the minimum, Burstable from its pods' requests.
            let tier = |q| h.dir("cpu", &h.tier(q)).unwrap();
            assert_eq!(read(&tier(QosClass::BestEffort), "cpu.shares"), "2");
            assert_eq!(read(&tier(QosClass::Burstable), "cpu.shares"), "256");
        }
        CgroupVersion::V2 => {
            assert_eq!(read(&dir("cpu", g.0, g.1), "cpu.weight"), "39");
            assert_eq!(read(&dir("cpu", g.0, g.1), "cpu.max"), "100000 100000");
            assert_eq!(
                read(&dir("memory", g.0, g.1), "memory.max"),
                (64u64 << 20).to_string()
            );
            assert_eq!(read(&dir("cpu", b.0, b.1), "cpu.max"), "max 100000");
            assert_eq!(read(&dir("cpu", e.0, e.1), "cpu.weight"), "1");
            assert_eq!(read(&dir("pids", e.0, e.1), "pids.max"), "512");
        }
    }
    // Each container lives in its pod's cgroup, with the kubelet's OOM score where the agent
    // may set it (raising is always allowed).
    for (q, p) in [g, b, e] {
        let id = agent.container_id(&uid(p)).await;
        assert!(dir("memory", q, p).join(&id).is_dir(), "{q:?}");
    }
    let e_id = agent.container_id(&uid(&best_effort)).await;
    let procs = read(&dir("memory", e.0, e.1).join(&e_id), "cgroup.procs");
    let Some(pid) = procs.lines().last().map(str::to_string) else {
        panic!(
            "no process in {}; status {:?}; events {:#?}",
            dir("memory", e.0, e.1).join(&e_id).display(),
            agent.runtime.container_status(&e_id).await,
            agent.sink.events()
        );
    };
    assert_eq!(
        read(Path::new(&format!("/proc/{pid}")), "oom_score_adj"),
        "1000"
    );

    // A pod that succeeded: the housekeeping removes its cgroup although the pod stays, also
    // after passes that found nothing to do (they are skipped until a status changes).
    let deadline = Instant::now() + Duration::from_secs(40);
    while finished_dir.exists() {
        assert!(
            Instant::now() < deadline,
            "a finished pod's cgroup is still there; latest status {:?}",
            agent.sink.latest(&uid(&finishing)).map(|s| s.phase)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        agent
            .sink
            .latest(&uid(&finishing))
            .and_then(|s| s.phase)
            .as_deref(),
        Some("Succeeded")
    );

    // A pod cgroup of another agent sharing the hierarchy.
    let foreign = h.pod(QosClass::BestEffort, "another-agents-pod");
    h.ensure(&foreign, &Default::default()).unwrap();

    // Deleted pods: their cgroups go once their containers are gone.
    tx.send(Some(vec![])).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let pod_dirs: Vec<PathBuf> = [g, b, e]
        .iter()
        .map(|(q, p)| dir("memory", *q, p))
        .collect();
    while pod_dirs.iter().any(|d| d.exists()) {
        assert!(
            Instant::now() < deadline,
            "pod cgroups still there: {:?}",
            pod_dirs.iter().filter(|d| d.exists()).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Housekeeping passes never take another agent's pod cgroup.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(h.exists(&foreign), "another agent's pod cgroup was removed");
    h.destroy(&foreign).unwrap();
    agent.stop().await;

    // Part 2: the static CPU manager with CPU 0 reserved.
    if cpus < 2 {
        println!("{TEST}: one CPU: the CPU manager part is not run");
        return;
    }
    config.cpu_manager_policy = CpuManagerPolicy::Static;
    config.reserved_system_cpus = "0".into();
    config.cpu_manager_reconcile_period = Duration::from_secs(1);
    let pinned = pod("pinned", &[], &[("cpu", "1"), ("memory", "64Mi")]);
    let shared = pod("shared", &[], &[]);
    // A pod cgroup an earlier run made for a pod deleted while the agent was down: the first
    // housekeeping pass lists the pod cgroups and removes it.
    let leftover = h.pod(QosClass::BestEffort, "deleted-while-down");
    h.ensure(&leftover, &Default::default()).unwrap();
    std::fs::write(config.root_dir.join("pod-cgroups/deleted-while-down"), b"").unwrap();
    let (source, tx) = WatchSource::new(Some(vec![pinned.clone(), shared.clone()]));
    let agent = start(tmp.path(), &config, source.clone());
    agent.running(&uid(&pinned)).await;
    agent.running(&uid(&shared)).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while h.exists(&leftover) {
        assert!(
            Instant::now() < deadline,
            "an earlier run's pod cgroup was not removed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let g = (QosClass::Guaranteed, &pinned);
    let e = (QosClass::BestEffort, &shared);
    let g_id = agent.container_id(&uid(&pinned)).await;
    let e_id = agent.container_id(&uid(&shared)).await;
    assert_eq!(allowed_cpus(&dir("memory", g.0, g.1), &g_id), "1");
    let pool = agent.cm.cpu_manager().unwrap().shared().to_string();
    assert!(!pool.split(',').any(|p| p == "1"), "{pool}");
    assert_eq!(allowed_cpus(&dir("memory", e.0, e.1), &e_id), pool);
    if cpus == 2 {
        assert_eq!(pool, "0");
    }
    let state = std::fs::read_to_string(config.root_dir.join("cpu_manager_state")).unwrap();
    assert!(state.contains(&uid(&pinned)), "{state}");

    // An agent restart keeps the assignment and the containers.
    agent.stop().await;
    let agent = start(tmp.path(), &config, source);
    agent.running(&uid(&pinned)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(agent.container_id(&uid(&pinned)).await, g_id);
    assert_eq!(
        agent
            .cm
            .cpu_manager()
            .unwrap()
            .cpuset(&uid(&pinned), "app")
            .to_string(),
        "1"
    );
    assert_eq!(allowed_cpus(&dir("memory", g.0, g.1), &g_id), "1");

    // Deleted: the exclusive CPU goes back to the shared pool.
    tx.send(Some(vec![])).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while agent.cm.cpu_manager().unwrap().shared().len() != cpus {
        assert!(
            Instant::now() < deadline,
            "the exclusive CPU was not released"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while dir("memory", g.0, g.1).exists() {
        assert!(Instant::now() < deadline, "pod cgroup still there");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    agent.stop().await;
}
