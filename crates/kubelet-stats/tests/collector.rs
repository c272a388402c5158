//! The collector over a runtime that misbehaves: stats that fail or hang, a pod whose volume
//! vanishes. The sample leaves the item out and goes on; nothing panics.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kubelet_api::runtime::{
    ContainerConfig, ContainerMetadata, ContainerStats, InterfaceUsage, Labels, PodSandboxConfig,
    PodSandboxMetadata, PodSandboxStats, SandboxNetworkStats, labels,
};
use kubelet_api::{AgentDirs, ContainerRuntime, ErrorKind};
use kubelet_core::testing::{FakeOp, FakeRuntime};
use kubelet_stats::{Collector, StatsConfig};

const UID: &str = "u-1";

async fn pod(rt: &FakeRuntime) -> Vec<String> {
    let mut l = Labels::new();
    l.insert(labels::POD_UID.into(), UID.into());
    l.insert(labels::POD_NAME.into(), "web".into());
    l.insert(labels::POD_NAMESPACE.into(), "default".into());
    let mut s = PodSandboxConfig::new(PodSandboxMetadata {
        name: "web".into(),
        namespace: "default".into(),
        uid: UID.into(),
        attempt: 0,
    });
    s.labels = l.clone();
    let sid = rt.run_pod_sandbox(&s).await.unwrap();
    let mut ids = Vec::new();
    for name in ["app", "sidecar"] {
        let mut cl = l.clone();
        cl.insert(labels::CONTAINER_NAME.into(), name.into());
        let mut c = ContainerConfig::new(
            ContainerMetadata {
                name: name.into(),
                attempt: 0,
            },
            "busybox",
        );
        c.labels = cl;
        let id = rt.create_container(&sid, &c, &s).await.unwrap();
        rt.start_container(&id).await.unwrap();
        ids.push(id);
    }
    ids
}

fn figures(id: &str, cpu_ns: u64, ws: u64) -> ContainerStats {
    let mut s = ContainerStats::new(id, jiff::Timestamp::now());
    s.cpu_usage_core_nanoseconds = Some(cpu_ns);
    s.memory_working_set_bytes = Some(ws);
    s.memory_usage_bytes = Some(ws * 2);
    s.process_count = Some(1);
    s
}

fn collector(dir: &std::path::Path) -> Collector {
    let dirs = AgentDirs {
        root_dir: dir.join("root"),
        pod_log_dir: dir.join("logs"),
    };
    std::fs::create_dir_all(&dirs.root_dir).unwrap();
    Collector::new("n", dirs, StatsConfig::default().kmsg(None))
}

#[tokio::test]
async fn pods_containers_rates_and_volumes_come_from_the_runtime_and_the_pod_directory() {
    let dir = tempfile::tempdir().unwrap();
    let rt = FakeRuntime::new();
    let ids = pod(&rt).await;
    rt.set_container_stats(&ids[0], figures(&ids[0], 1_000_000_000, 100));
    rt.set_container_stats(&ids[1], figures(&ids[1], 0, 50));
    let vol = dir.path().join(format!(
        "root/pods/{UID}/volumes/kubernetes.io~empty-dir/cache"
    ));
    std::fs::create_dir_all(&vol).unwrap();
    std::fs::write(vol.join("blob"), vec![1u8; 1 << 20]).unwrap();
    let mut c = collector(dir.path());
    let first = c.collect(Some(&rt)).await;
    let p = first.pod(UID).expect("the pod");
    assert_eq!(p.pod_ref.name, "web");
    assert_eq!(p.containers.len(), 2);
    assert_eq!(p.memory.as_ref().unwrap().working_set_bytes, Some(150));
    assert_eq!(p.process_stats.as_ref().unwrap().process_count, Some(2));
    assert!(p.volumes[0].fs.used_bytes.unwrap() >= 1 << 20);
    assert!(p.ephemeral_storage.as_ref().unwrap().used_bytes.unwrap() >= 1 << 20);
    let app = p.containers.iter().find(|c| c.name == "app").unwrap();
    assert_eq!(
        app.cpu.as_ref().unwrap().usage_nano_cores,
        None,
        "one sample: no rate yet"
    );

    tokio::time::sleep(Duration::from_millis(200)).await;
    rt.set_container_stats(&ids[0], figures(&ids[0], 1_100_000_000, 100));
    // The volume goes away between two measurements: it is left out, nothing fails.
    std::fs::remove_dir_all(dir.path().join(format!("root/pods/{UID}"))).unwrap();
    let second = c.collect(Some(&rt)).await;
    let p = second.pod(UID).expect("the pod");
    let app = p.containers.iter().find(|c| c.name == "app").unwrap();
    let rate = app.cpu.as_ref().unwrap().usage_nano_cores.expect("a rate");
    assert!(
        rate > 0 && rate <= 500_000_000,
        "0.1 s of CPU in ≥ 0.2 s: {rate}"
    );
}

#[tokio::test]
async fn failing_stats_leave_the_figures_out_and_keep_the_pods_and_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let rt = FakeRuntime::new();
    let ids = pod(&rt).await;
    rt.set_container_stats(&ids[0], figures(&ids[0], 5, 100));
    rt.fail_always(
        FakeOp::ContainerStats,
        ErrorKind::Unavailable,
        "stats broken",
    );
    rt.fail_always(
        FakeOp::ImageFsInfo,
        ErrorKind::Unavailable,
        "imagefs broken",
    );
    let mut c = collector(dir.path());
    for _ in 0..3 {
        let s = c.collect(Some(&rt)).await;
        let p = s.pod(UID).expect("the pod is still reported");
        assert_eq!(p.containers.len(), 2);
        assert!(
            p.containers
                .iter()
                .all(|c| c.cpu.is_none() && c.memory.is_none())
        );
        assert!(
            s.node.memory.is_some(),
            "the node does not depend on the runtime"
        );
    }
    rt.clear_failures(FakeOp::ContainerStats);
    let s = c.collect(Some(&rt)).await;
    assert!(
        s.pod(UID)
            .unwrap()
            .containers
            .iter()
            .any(|c| c.memory.is_some())
    );
}

#[tokio::test(start_paused = true)]
async fn a_hanging_runtime_costs_one_timeout_and_the_sample_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Arc::new(FakeRuntime::new());
    pod(&rt).await;
    rt.set_op_delay(FakeOp::ContainerStats, Duration::from_secs(3600));
    let mut c = collector(dir.path());
    let started = tokio::time::Instant::now();
    let s = c.collect(Some(rt.as_ref() as &dyn ContainerRuntime)).await;
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(s.pod(UID).unwrap().containers.len(), 2);
}

/// The agent side of a plugin context, for driving the plugin without the engine.
struct NoAgent;

#[async_trait::async_trait]
impl kubelet_api::AgentHandle for NoAgent {
    fn statuses(&self) -> kubelet_api::StatusReader {
        kubelet_api::StatusReader::default()
    }
    fn pleg_health(&self) -> kubelet_api::PlegHealth {
        kubelet_api::PlegHealth::Healthy
    }
    fn sync_loop_health(&self, _: Duration) -> Result<(), kubelet_api::SyncLoopStalled> {
        Ok(())
    }
    fn plugins(&self) -> Vec<kubelet_api::PluginStatus> {
        Vec::new()
    }
    fn metrics(&self) -> Arc<kubelet_api::prometheus_client::registry::Registry> {
        Arc::default()
    }
    fn sync_pod(&self, _: &str) {}
    async fn kill_pod(
        &self,
        _: &str,
        _: kubelet_api::KillPodOptions,
    ) -> Result<(), kubelet_api::NotRunning> {
        Err(kubelet_api::NotRunning)
    }
}

/// The runtime's per-container stats calls so far.
fn stats_calls(rt: &FakeRuntime) -> usize {
    rt.calls()
        .iter()
        .filter(|c| c.starts_with("container_stats"))
        .count()
}

#[tokio::test]
async fn the_plugin_samples_the_node_periodically_and_the_pods_when_asked() {
    use kubelet_api::AgentPlugin;
    use kubelet_api::stats::StatsService;
    let dir = tempfile::tempdir().unwrap();
    let rt = Arc::new(FakeRuntime::new());
    pod(&rt).await;
    let dirs = AgentDirs {
        root_dir: dir.path().join("root"),
        pod_log_dir: dir.path().join("logs"),
    };
    std::fs::create_dir_all(&dirs.root_dir).unwrap();
    let ctx = kubelet_api::PluginContext::new(
        "n",
        dirs,
        rt.clone(),
        kubelet_api::EventRecorder::log_only(),
        Arc::new(NoAgent),
        kubelet_api::NodeConditionReader::default(),
        Arc::default(),
    );
    // An hour between housekeeping rounds: only the first round and the readers collect.
    let plugin = Arc::new(kubelet_stats::StatsPlugin::new(
        StatsConfig::default()
            .kmsg(None)
            .housekeeping_interval(Duration::from_secs(3600)),
    ));
    let stats = plugin.stats();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn({
        let (plugin, shutdown) = (plugin.clone(), shutdown.clone());
        async move { plugin.run(ctx, shutdown).await }
    });
    let first = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let s = stats.summary();
            if s.node.fs.is_some() {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the first round");
    // The periodic round samples the node only: nobody asked for the pods.
    assert!(first.pods.is_empty());
    assert_eq!(stats_calls(&rt), 0, "no container was sampled");

    // A reader of the pods' figures gets them collected now …
    let ids = rt.containers();
    let with_pods = tokio::time::timeout(kubelet_stats::PODS_TIMEOUT, stats.summary_with_pods())
        .await
        .unwrap();
    assert_eq!(with_pods.pod(UID).unwrap().containers.len(), ids.len());
    assert_eq!(with_pods.node, first.node, "with the node's latest figures");
    assert!(Arc::ptr_eq(&with_pods, &stats.summary()), "and published");
    let calls = stats_calls(&rt);
    assert_eq!(calls, ids.len());
    // … and the next reader within the sampling period gets the same sample.
    let again = stats.summary_with_pods().await;
    assert!(Arc::ptr_eq(&again, &with_pods));
    assert_eq!(stats_calls(&rt), calls, "no second collection");

    // Figures that change show through a refresh, which collects anew.
    rt.set_container_stats(&ids[0].id, figures(&ids[0].id, 7, 4242));
    let fresh = tokio::time::timeout(kubelet_stats::REFRESH_TIMEOUT, stats.refresh())
        .await
        .unwrap();
    let app = fresh
        .pod(UID)
        .unwrap()
        .containers
        .iter()
        .find(|c| c.container_id == ids[0].id);
    assert_eq!(
        app.and_then(|c| c.memory.as_ref()?.working_set_bytes),
        Some(4242),
        "the refresh collected anew"
    );
    assert!(
        Arc::ptr_eq(&fresh, &stats.summary()),
        "and published what it returned"
    );
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("stops at shutdown")
        .unwrap()
        .unwrap();
    // Stopped: a refresh and a reader of the pods answer at once with the latest sample.
    let after = tokio::time::timeout(Duration::from_millis(500), stats.refresh())
        .await
        .unwrap();
    assert!(Arc::ptr_eq(&after, &fresh));
    let after = tokio::time::timeout(Duration::from_millis(500), stats.summary_with_pods())
        .await
        .unwrap();
    assert!(Arc::ptr_eq(&after, &fresh));
}

#[tokio::test]
async fn configured_system_containers_are_reported_from_their_cgroups() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("cgroup");
    let pods = root.join("kubepods");
    std::fs::create_dir_all(&pods).unwrap();
    for (f, c) in [
        ("memory.current", "10485760\n"),
        ("memory.stat", "anon 6000000\ninactive_file 2485760\n"),
        ("cpu.stat", "usage_usec 1500\n"),
    ] {
        std::fs::write(pods.join(f), c).unwrap();
    }
    let dirs = AgentDirs {
        root_dir: dir.path().join("root"),
        pod_log_dir: dir.path().join("logs"),
    };
    std::fs::create_dir_all(&dirs.root_dir).unwrap();
    #[allow(clippy::field_reassign_with_default)]
    let config = {
        let mut c = StatsConfig::default()
            .kmsg(None)
            .system_container("pods", "/kubepods")
            .system_container("runtime", "/no-such-cgroup");
        c.cgroup = Some(kubelet_stats::CgroupSetup::V2 { root: root.clone() });
        c
    };
    let mut c = Collector::new("n", dirs, config);
    let s = c.collect(None).await;
    let names: Vec<&str> = s
        .node
        .system_containers
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert!(names.contains(&"pods"), "{names:?}");
    // A cgroup that does not exist is left out, not reported empty.
    assert!(!names.contains(&"runtime"), "{names:?}");
    let p = s
        .node
        .system_containers
        .iter()
        .find(|c| c.name == "pods")
        .unwrap();
    assert_eq!(
        p.memory.as_ref().unwrap().working_set_bytes,
        Some(10_485_760 - 2_485_760)
    );
}

/// Containerd 1.6 reports no limits and no sandbox network through the CRI: the pod's figures
/// come from its cgroup (under the `pods` system container), the limits from the containers'
/// cgroups, the interfaces from `/proc/<pid>/net/dev` of the sandbox's process.
#[tokio::test]
async fn a_pods_cgroup_gives_its_limits_processes_and_network_when_the_runtime_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let rt = FakeRuntime::new();
    let ids = pod(&rt).await;
    let sid = rt
        .list_pod_sandboxes(&Default::default())
        .await
        .unwrap()
        .remove(0)
        .id;
    rt.set_container_stats(&ids[0], figures(&ids[0], 1_000_000_000, 10_000_000));
    rt.set_container_stats(&ids[1], figures(&ids[1], 0, 5_000_000));

    let cg = dir.path().join("cgroup");
    let pod_cg = cg.join(format!("kubepods/burstable/pod{UID}"));
    let files: Vec<(PathBuf, &str)> = vec![
        (cg.join("cgroup.controllers"), "cpu memory pids\n"),
        (cg.join("kubepods/memory.current"), "90000000\n"),
        (pod_cg.join("memory.current"), "40000000\n"),
        (pod_cg.join("memory.max"), "100000000\n"),
        (
            pod_cg.join("memory.stat"),
            "anon 20000000\ninactive_file 4000000\n",
        ),
        (pod_cg.join("cpu.stat"), "usage_usec 3000000\n"),
        (pod_cg.join("pids.current"), "9\n"),
        (pod_cg.join(&sid).join("memory.current"), "1000000\n"),
        (pod_cg.join(&sid).join("cgroup.procs"), "4242\n"),
        (pod_cg.join(&ids[0]).join("memory.current"), "30000000\n"),
        (pod_cg.join(&ids[0]).join("memory.max"), "67108864\n"),
        (pod_cg.join(&ids[0]).join("cgroup.procs"), "100\n101\n"),
        (pod_cg.join(&ids[1]).join("memory.current"), "9000000\n"),
        (pod_cg.join(&ids[1]).join("memory.max"), "max\n"),
        (pod_cg.join(&ids[1]).join("cgroup.procs"), "102\n"),
    ];
    let proc = dir.path().join("proc");
    let files = files.into_iter().chain([(
        proc.join("4242/net/dev"),
        "Inter-|   Receive                                                |  Transmit\n \
         face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
         lo: 100 1 0 0 0 0 0 0 100 1 0 0 0 0 0 0\n  \
         eth0: 2000000 1500 1 0 0 0 0 0 30000 200 2 0 0 0 0 0\n",
    )]);
    for (path, content) in files {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }
    std::fs::create_dir_all(proc.join("self/ns")).unwrap();
    std::fs::create_dir_all(proc.join("4242/ns")).unwrap();
    std::os::unix::fs::symlink("net:[4026531840]", proc.join("self/ns/net")).unwrap();
    std::os::unix::fs::symlink("net:[4026532999]", proc.join("4242/ns/net")).unwrap();

    let dirs = AgentDirs {
        root_dir: dir.path().join("root"),
        pod_log_dir: dir.path().join("logs"),
    };
    std::fs::create_dir_all(&dirs.root_dir).unwrap();
    #[allow(clippy::field_reassign_with_default)]
    let config = {
        let mut c = StatsConfig::default()
            .kmsg(None)
            .roots(&proc, dir.path().join("sys"))
            .system_container("pods", "/kubepods");
        c.cgroup = Some(kubelet_stats::CgroupSetup::V2 { root: cg.clone() });
        c
    };
    let mut c = Collector::new("n", dirs, config);
    let s = c.collect(Some(&rt)).await;
    let p = s.pod(UID).expect("the pod");

    // Pod: the cgroup's figures, not the containers' sum (which misses the sandbox).
    let m = p.memory.as_ref().unwrap();
    assert_eq!(m.usage_bytes, Some(40_000_000));
    assert_eq!(m.working_set_bytes, Some(36_000_000));
    assert_eq!(m.available_bytes, Some(64_000_000));
    assert_eq!(
        p.cpu.as_ref().unwrap().usage_core_nano_seconds,
        Some(3_000_000_000)
    );
    // Processes as cAdvisor counts them: the cgroup's and its children's `cgroup.procs`.
    assert_eq!(p.process_stats.as_ref().unwrap().process_count, Some(4));

    // Containers: the runtime's working set against the cgroup's limit; none without a limit.
    let app = p.containers.iter().find(|c| c.name == "app").unwrap();
    let am = app.memory.as_ref().unwrap();
    assert_eq!(am.working_set_bytes, Some(10_000_000));
    assert_eq!(am.available_bytes, Some(67_108_864 - 10_000_000));
    let sidecar = p.containers.iter().find(|c| c.name == "sidecar").unwrap();
    assert_eq!(sidecar.memory.as_ref().unwrap().available_bytes, None);

    // Network: the sandbox process's namespace, eth0 the default, loopback left out.
    let net = p.network.as_ref().expect("the pod's network");
    assert_eq!(net.default.name, "eth0");
    assert_eq!(net.default.rx_bytes, Some(2_000_000));
    assert_eq!(net.default.tx_bytes, Some(30_000));
    assert_eq!(net.interfaces.len(), 1);

    // A sandbox in the agent's own network namespace (host network) reports none.
    std::fs::remove_file(proc.join("4242/ns/net")).unwrap();
    std::os::unix::fs::symlink("net:[4026531840]", proc.join("4242/ns/net")).unwrap();
    let s = c.collect(Some(&rt)).await;
    assert!(s.pod(UID).unwrap().network.is_none());

    // A runtime that reports the default interface only: it is also the list.
    let mut net = SandboxNetworkStats::new(jiff::Timestamp::now());
    let mut eth0 = InterfaceUsage::new("eth0");
    eth0.rx_bytes = Some(7);
    net.default_interface = Some(eth0);
    let mut stats = PodSandboxStats::new(sid.clone());
    stats.network = Some(net.clone());
    rt.set_sandbox_stats(Some(vec![stats.clone()]));
    let s = c.collect(Some(&rt)).await;
    let n = s.pod(UID).unwrap().network.clone().unwrap();
    assert_eq!(n.default.rx_bytes, Some(7));
    assert_eq!(n.interfaces.len(), 1);
    // A runtime with the full list is taken as it is.
    net.interfaces = vec![InterfaceUsage::new("eth0"), InterfaceUsage::new("net1")];
    stats.network = Some(net);
    rt.set_sandbox_stats(Some(vec![stats]));
    let s = c.collect(Some(&rt)).await;
    assert_eq!(
        s.pod(UID)
            .unwrap()
            .network
            .as_ref()
            .unwrap()
            .interfaces
            .len(),
        2
    );
}

/// On cgroup v1 an agent started from a shell can sit in a memory cgroup whose `cpuacct`
/// cgroup is the root: the `kubelet` system container's CPU is then the agent's own
/// (`/proc/self/stat`), not the whole machine's.
#[tokio::test]
async fn the_agents_cpu_comes_from_its_process_when_its_cpuacct_cgroup_is_not_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let (cg, proc) = (dir.path().join("cgroup"), dir.path().join("proc"));
    for (path, content) in [
        (
            proc.join("self/cgroup"),
            "4:memory:/session/agent\n2:cpu,cpuacct:/\n0::/\n",
        ),
        (
            proc.join("self/stat"),
            "77 (agent) S 1 77 77 0 -1 0 10 0 0 0 150 50 0 0 20 0 4 0 1 1 1\n",
        ),
        (
            cg.join("memory/session/agent/memory.usage_in_bytes"),
            "8000000\n",
        ),
        (
            cg.join("memory/session/agent/memory.stat"),
            "total_rss 5000000\n",
        ),
        (cg.join("cpu,cpuacct/cpuacct.usage"), "999000000000000\n"),
    ] {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }
    let dirs = AgentDirs {
        root_dir: dir.path().join("root"),
        pod_log_dir: dir.path().join("logs"),
    };
    std::fs::create_dir_all(&dirs.root_dir).unwrap();
    let controllers = [
        ("memory".to_string(), cg.join("memory")),
        ("cpu".to_string(), cg.join("cpu,cpuacct")),
        ("cpuacct".to_string(), cg.join("cpu,cpuacct")),
    ]
    .into_iter()
    .collect();
    #[allow(clippy::field_reassign_with_default)]
    let config = {
        let mut c = StatsConfig::default()
            .kmsg(None)
            .roots(&proc, dir.path().join("sys"));
        c.cgroup = Some(kubelet_stats::CgroupSetup::V1 { controllers });
        c
    };
    let mut c = Collector::new("n", dirs, config);
    let s = c.collect(None).await;
    let kubelet = s
        .node
        .system_containers
        .iter()
        .find(|c| c.name == "kubelet")
        .expect("the kubelet system container");
    assert_eq!(
        kubelet.cpu.as_ref().unwrap().usage_core_nano_seconds,
        Some(2_000_000_000),
        "200 ticks of utime + stime"
    );
    assert_eq!(
        kubelet.memory.as_ref().unwrap().usage_bytes,
        Some(8_000_000)
    );
}
