//! Resource admission through the engine (FakeRuntime, no cgroups): pod #111 ends `OutOfpods`,
//! a pod asking for more memory than is allocatable ends `OutOfmemory` while the others run,
//! the second of two pods on one host port ends `NodePorts`; rejected pods end `Failed` with
//! the kubelet's reason and message, and the admitted ones keep running.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, ContainerPort, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kubelet_api::ContainerRuntime;
use kubelet_cm::{CmConfig, ContainerManager};
use kubelet_core::testing::{FakeRuntime, RecordingSink, WatchSource};
use kubelet_core::{KubeletBuilder, KubeletConfig};
use kubelet_pleg::{GenericPleg, GenericPlegConfig};
use tokio_util::sync::CancellationToken;

fn pod(i: usize, memory: Option<&str>, host_port: Option<i32>) -> Pod {
    let mut p = Pod {
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "app".into(),
                image: Some("busybox:1".into()),
                resources: memory.map(|m| ResourceRequirements {
                    requests: Some([("memory".to_string(), Quantity(m.into()))].into()),
                    ..Default::default()
                }),
                ports: host_port.map(|hp| {
                    vec![ContainerPort {
                        container_port: 80,
                        host_port: Some(hp),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }],
            host_network: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    };
    p.metadata.name = Some(format!("pod-{i:03}"));
    p.metadata.namespace = Some("default".into());
    p.metadata.uid = Some(format!("uid-{i:03}"));
    // Creation order decides admission order.
    let t = jiff::Timestamp::from_second(1_700_000_000 + i as i64).unwrap();
    p.metadata.creation_timestamp = Some(Time(t));
    p
}

struct Agent {
    sink: Arc<RecordingSink>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

fn start(pods: Vec<Pod>, config: CmConfig) -> Agent {
    let rt = Arc::new(FakeRuntime::new());
    let runtime: Arc<dyn ContainerRuntime> = rt;
    let (pleg, pleg_events) = GenericPleg::new(runtime.clone(), GenericPlegConfig::default());
    let sink = Arc::new(RecordingSink::new());
    let (source, _tx) = WatchSource::new(Some(pods));
    let dir = tempfile::tempdir().unwrap();
    let mut config = config;
    config.root_dir = dir.path().join("root");
    config.cgroups_per_qos = false;
    let cm = ContainerManager::new("node-1", config).unwrap();
    let kubelet = KubeletBuilder::new("node-1")
        .config(KubeletConfig::with_dirs(
            dir.path().join("root"),
            dir.path().join("logs"),
        ))
        .runtime(runtime)
        .pleg(Arc::new(pleg), pleg_events)
        .pod_source(Arc::new(source))
        .status_sink(sink.clone())
        .plugin(Arc::new(cm))
        .build()
        .unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(kubelet.run(shutdown.clone()));
    // The source must outlive the test's waits.
    std::mem::forget(_tx);
    Agent {
        sink,
        shutdown,
        task,
        _dir: dir,
    }
}

impl Agent {
    async fn phase(&self, uid: &str, phase: &str) -> k8s_openapi::api::core::v1::PodStatus {
        let got = self
            .sink
            .wait_for(
                |s| s.uid == uid && s.status.phase.as_deref() == Some(phase),
                Duration::from_secs(60),
            )
            .await;
        match got {
            Some(s) => s.status,
            None => panic!(
                "pod {uid} never {phase}; latest: {:?}",
                self.sink.latest(uid)
            ),
        }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_111th_pod_is_out_of_pods() {
    let pods: Vec<Pod> = (0..111).map(|i| pod(i, None, None)).collect();
    let agent = start(pods, CmConfig::default());
    let st = agent.phase("uid-110", "Failed").await;
    assert_eq!(st.reason.as_deref(), Some("OutOfpods"));
    assert_eq!(
        st.message.as_deref(),
        Some(
            "Pod was rejected: Node didn't have enough resource: pods, requested: 1, used: 110, capacity: 110"
        )
    );
    let ev = agent
        .sink
        .wait_for_event(|e| e.reason == "OutOfpods", Duration::from_secs(10))
        .await
        .expect("an OutOfpods event");
    assert_eq!(ev.involved.name, "pod-110");
    // The first 110 run.
    for i in [0, 55, 109] {
        agent.phase(&format!("uid-{i:03}"), "Running").await;
    }
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_above_allocatable_and_a_taken_host_port_are_rejected_while_others_run() {
    let mut config = CmConfig::default();
    // Allocatable memory = MemTotal − 1 GiB reserved − 100 Mi hard threshold.
    config.system_reserved = [("memory".to_string(), "1Gi".to_string())].into();
    config.eviction_hard = [("memory.available".to_string(), "100Mi".to_string())].into();
    let total =
        kubelet_stats::read_machine(std::path::Path::new("/proc"), std::path::Path::new("/sys"))
            .memory_capacity;
    let too_much = format!("{}", total - (1 << 30) - (100 << 20) + 1);
    let pods = vec![
        pod(0, Some("64Mi"), Some(18080)),
        pod(1, Some(&too_much), None),
        pod(2, None, Some(18080)),
        pod(3, Some("64Mi"), None),
    ];
    let agent = start(pods, config);
    let st = agent.phase("uid-001", "Failed").await;
    assert_eq!(st.reason.as_deref(), Some("OutOfmemory"));
    let msg = st.message.unwrap();
    assert!(
        msg.starts_with("Pod was rejected: Node didn't have enough resource: memory, requested: "),
        "{msg}"
    );
    let st = agent.phase("uid-002", "Failed").await;
    assert_eq!(st.reason.as_deref(), Some("NodePorts"));
    assert_eq!(
        st.message.as_deref(),
        Some(
            "Pod was rejected: Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports"
        )
    );
    agent.phase("uid-000", "Running").await;
    agent.phase("uid-003", "Running").await;
    agent.stop().await;
}
