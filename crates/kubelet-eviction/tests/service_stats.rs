//! Eviction over the agent's stats service: signals and per-pod usage come from the service's
//! sample, memory from the machine, and a stale sample is refreshed.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, Pod, PodSpec, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kubelet_api::stats::{
    ContainerStats, FsStats, Machine, MemoryStats, PodReference, PodStats, ProcessStats,
    RlimitStats, RuntimeStats, StatsService, Summary, VolumeStats,
};
use kubelet_eviction::{
    ActivePod, MachineStats, MachineStatsConfig, ServiceStats, Signal, StatsProvider,
};

/// A stats service with one sample; like `kubelet-stats`' service, its latest sample has no
/// pods until a reader asks for them.
struct Fixed {
    summary: Arc<Summary>,
    refreshes: AtomicUsize,
}

#[async_trait::async_trait]
impl StatsService for Fixed {
    fn summary(&self) -> Arc<Summary> {
        let mut node_only = Summary::new("n");
        node_only.node = self.summary.node.clone();
        Arc::new(node_only)
    }
    async fn summary_with_pods(&self) -> Arc<Summary> {
        self.summary.clone()
    }
    async fn refresh(&self) -> Arc<Summary> {
        self.refreshes.fetch_add(1, Ordering::SeqCst);
        self.summary.clone()
    }
    fn machine(&self) -> Machine {
        Machine::new(2, 8 << 30)
    }
}

fn fs(at: jiff::Timestamp, used: u64, avail: u64, cap: u64, inodes: (u64, u64)) -> FsStats {
    let mut f = FsStats::new(at);
    f.used_bytes = Some(used);
    f.available_bytes = Some(avail);
    f.capacity_bytes = Some(cap);
    f.inodes_used = Some(inodes.0);
    f.inodes_free = Some(inodes.1);
    f.inodes = Some(inodes.0 + inodes.1);
    f
}

fn summary(at: jiff::Timestamp) -> Summary {
    let mut s = Summary::new("n");
    s.node.fs = Some(fs(at, 60, 40, 100, (6, 4)));
    let mut rt = RuntimeStats::default();
    rt.image_fs = Some(fs(at, 10, 30, 50, (1, 9)));
    s.node.runtime = Some(rt);
    let mut r = RlimitStats::new(at);
    r.maxpid = Some(1000);
    r.curproc = Some(250);
    s.node.rlimit = Some(r);
    let mut p = PodStats::new(PodReference::new("default", "web", "u1"));
    let mut c = ContainerStats::new("app");
    let mut m = MemoryStats::new(at);
    m.working_set_bytes = Some(300);
    c.memory = Some(m);
    c.rootfs = Some(fs(at, 5, 0, 0, (2, 0)));
    c.logs = Some(fs(at, 7, 0, 0, (1, 0)));
    p.containers.push(c);
    p.volumes
        .push(VolumeStats::new("cache", fs(at, 11, 0, 0, (3, 0))));
    p.volumes
        .push(VolumeStats::new("config", fs(at, 13, 0, 0, (4, 0))));
    p.process_stats = Some(ProcessStats::new(9));
    s.pods.push(p);
    s
}

fn machine(dir: &std::path::Path) -> MachineStats {
    std::fs::write(
        dir.join("meminfo"),
        "MemTotal: 1000 kB\nMemFree: 400 kB\nInactive(file): 100 kB\n",
    )
    .unwrap();
    MachineStats::new(MachineStatsConfig::with_roots(dir, None))
}

#[tokio::test]
async fn signals_and_pod_usage_come_from_the_sample_and_memory_from_the_machine() {
    let dir = tempfile::tempdir().unwrap();
    let service = Arc::new(Fixed {
        summary: Arc::new(summary(jiff::Timestamp::now())),
        refreshes: AtomicUsize::new(0),
    });
    let stats = ServiceStats::new(service.clone(), machine(dir.path()));
    let o = stats.observe().await.unwrap();
    assert_eq!(o[&Signal::MemoryAvailable].available, 500 * 1024);
    assert_eq!(o[&Signal::NodeFsAvailable].available, 40);
    assert_eq!(o[&Signal::NodeFsInodesFree].available, 4);
    assert_eq!(o[&Signal::ImageFsAvailable].capacity, 50);
    assert_eq!(o[&Signal::ImageFsInodesFree].available, 9);
    assert_eq!(o[&Signal::PidAvailable].available, 750);
    assert!(!o.contains_key(&Signal::ContainerFsAvailable));
    assert_eq!(
        service.refreshes.load(Ordering::SeqCst),
        0,
        "a fresh sample is read as is"
    );

    let pod = Pod {
        metadata: ObjectMeta {
            uid: Some("u1".into()),
            name: Some("web".into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            volumes: Some(vec![
                Volume {
                    name: "cache".into(),
                    empty_dir: Some(EmptyDirVolumeSource::default()),
                    ..Default::default()
                },
                Volume {
                    name: "config".into(),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let gone = Pod {
        metadata: ObjectMeta {
            uid: Some("u2".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let usage = stats
        .pod_usage(&[
            ActivePod {
                pod: Arc::new(pod),
                containers: vec![("app".into(), "c1".into())],
            },
            ActivePod {
                pod: Arc::new(gone),
                containers: vec![],
            },
        ])
        .await;
    assert!(
        !usage.contains_key("u2"),
        "no stats: ranked first, as in the kubelet"
    );
    let u = &usage["u1"];
    assert_eq!(u.memory(), Some(300));
    assert_eq!(u.processes(), Some(9));
    assert_eq!(u.disk(), Some(5 + 7 + 11 + 13));
    assert_eq!(u.volumes.get("cache"), Some(&11));
    assert!(
        !u.volumes.contains_key("config"),
        "only emptyDirs, for their sizeLimit"
    );
    assert_eq!(u.inodes, Some(2 + 1 + 3 + 4));
}

#[tokio::test]
async fn a_stale_or_empty_sample_is_refreshed() {
    let dir = tempfile::tempdir().unwrap();
    let old = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(120);
    let service = Arc::new(Fixed {
        summary: Arc::new(summary(old)),
        refreshes: AtomicUsize::new(0),
    });
    let stats = ServiceStats::new(service.clone(), machine(dir.path()));
    stats.observe().await.unwrap();
    assert_eq!(service.refreshes.load(Ordering::SeqCst), 1);
    let empty = Arc::new(Fixed {
        summary: Arc::new(Summary::new("n")),
        refreshes: AtomicUsize::new(0),
    });
    let stats = ServiceStats::new(empty.clone(), machine(dir.path()));
    let o = stats.observe().await.unwrap();
    assert_eq!(empty.refreshes.load(Ordering::SeqCst), 1);
    assert!(
        o.contains_key(&Signal::MemoryAvailable),
        "memory never waits for the sample"
    );
    assert!(!o.contains_key(&Signal::NodeFsAvailable));
}
