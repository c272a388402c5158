//! The manager wired into the real engine (in-memory runtime, paused time): an eviction ends the
//! pod Failed/Evicted with DisruptionTarget through the pod worker and the status manager, and a
//! BestEffort pod arriving under MemoryPressure is rejected by admission.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use kubelet_api::{PodSource, SourceSender};
use kubelet_core::testing::{FakeRuntime, RecordingSink};
use kubelet_core::{KubeletBuilder, KubeletConfig};
use kubelet_eviction::{
    ActivePod, ContainerUsage, EvictionConfig, EvictionError, EvictionPlugin, EvictionSettings,
    Observations, PodUsage, Signal, SignalObservation, StatsProvider, parse_threshold_flag,
};
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const MI: i64 = 1 << 20;

/// A source whose snapshots the test sends.
struct Scripted {
    rx: tokio::sync::Mutex<mpsc::Receiver<Vec<Pod>>>,
}

#[async_trait]
impl PodSource for Scripted {
    fn name(&self) -> &str {
        "api"
    }
    async fn run(&self, out: SourceSender, shutdown: CancellationToken) {
        let mut rx = self.rx.lock().await;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                p = rx.recv() => match p {
                    Some(pods) => { let _ = out.snapshot(pods).await; }
                    None => return,
                },
            }
        }
    }
}

#[derive(Default)]
struct Memory {
    available: Mutex<i64>,
}

#[async_trait]
impl StatsProvider for Memory {
    async fn observe(&self) -> Result<Observations, EvictionError> {
        Ok(Observations::from([(
            Signal::MemoryAvailable,
            SignalObservation {
                available: *self.available.lock(),
                capacity: 1000 * MI,
                time: Instant::now(),
            },
        )]))
    }
    async fn pod_usage(&self, pods: &[ActivePod]) -> HashMap<String, PodUsage> {
        pods.iter()
            .map(|p| {
                let usage = PodUsage {
                    containers: p
                        .containers
                        .iter()
                        .map(|(name, _)| ContainerUsage {
                            name: name.clone(),
                            memory_working_set: Some(600 << 20),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                };
                (kubelet_api::pod::uid(&p.pod).to_string(), usage)
            })
            .collect()
    }
}

fn pod(name: &str) -> Pod {
    let mut p = Pod {
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "app".into(),
                image: Some("busybox".into()),
                ..Default::default()
            }],
            host_network: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    };
    p.metadata.name = Some(name.into());
    p.metadata.namespace = Some("default".into());
    p.metadata.uid = Some(format!("uid-{name}"));
    p
}

#[tokio::test(start_paused = true)]
async fn evicted_pods_end_failed_and_admission_rejects_best_effort_pods_under_memory_pressure() {
    let tmp = tempfile::tempdir().unwrap();
    let runtime = Arc::new(FakeRuntime::new());
    let (pleg, pleg_events) = kubelet_pleg::GenericPleg::new(runtime.clone(), Default::default());
    let pleg = std::sync::Arc::new(pleg);
    let sink = Arc::new(RecordingSink::new());
    let (tx, rx) = mpsc::channel(4);
    let stats = Arc::new(Memory::default());
    *stats.available.lock() = 800 * MI;
    let mut settings = EvictionSettings::default();
    settings.hard = Some(parse_threshold_flag("evictionHard", "memory.available<100Mi").unwrap());
    let config = EvictionConfig::from_settings(&settings).unwrap();
    let builder = KubeletBuilder::new("node-1")
        .config(KubeletConfig::with_dirs(
            tmp.path().join("root"),
            tmp.path().join("logs"),
        ))
        .runtime(runtime)
        .pleg(pleg, pleg_events)
        .pod_source(Arc::new(Scripted {
            rx: tokio::sync::Mutex::new(rx),
        }))
        .status_sink(sink.clone());
    let eviction = EvictionPlugin::new(config).stats(stats.clone());
    let kubelet = builder.plugin(Arc::new(eviction)).build().unwrap();
    let shutdown = CancellationToken::new();
    let agent = tokio::spawn(kubelet.run(shutdown.clone()));

    let hog = pod("hog");
    tx.send(vec![hog.clone()]).await.unwrap();
    let running = sink
        .wait_for(
            |r| r.name == "hog" && r.status.phase.as_deref() == Some("Running"),
            Duration::from_secs(30),
        )
        .await;
    assert!(running.is_some(), "the pod runs");

    *stats.available.lock() = 50 * MI;
    let evicted = sink
        .wait_for(
            |r| r.name == "hog" && r.status.phase.as_deref() == Some("Failed"),
            Duration::from_secs(30),
        )
        .await
        .expect("the pod is evicted");
    assert_eq!(evicted.status.reason.as_deref(), Some("Evicted"));
    assert_eq!(
        evicted.status.message.as_deref(),
        Some(
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. \
             Container app was using 600Mi, request is 0, has larger consumption of memory. "
        )
    );
    let cond = evicted
        .status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "DisruptionTarget")
        .expect("DisruptionTarget");
    assert_eq!(
        (cond.status.as_str(), cond.reason.as_deref()),
        ("True", Some("TerminationByKubelet"))
    );
    // The Evicted event reaches the status sinks with the kubelet's annotations.
    let event = sink
        .wait_for_event(|e| e.reason == "Evicted", Duration::from_secs(30))
        .await
        .expect("an Evicted event");
    assert_eq!(
        (event.involved.kind.as_str(), event.involved.name.as_str()),
        ("Pod", "hog")
    );
    assert_eq!(
        Some(event.message.as_str()),
        evicted.status.message.as_deref()
    );
    let annotations: Vec<(&str, &str)> = event
        .annotations
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        annotations,
        [
            ("offending_containers", "app"),
            ("offending_containers_usage", "600Mi"),
            ("starved_resource", "memory"),
        ]
    );

    // Still under pressure: a new BestEffort pod is rejected before it starts.
    tx.send(vec![hog, pod("late")]).await.unwrap();
    let rejected = sink
        .wait_for(
            |r| r.name == "late" && r.status.phase.as_deref() == Some("Failed"),
            Duration::from_secs(30),
        )
        .await
        .expect("the late pod is rejected");
    assert_eq!(rejected.status.reason.as_deref(), Some("Evicted"));
    assert_eq!(
        rejected.status.message.as_deref(),
        Some("Pod was rejected: The node had condition: [MemoryPressure]. ")
    );
    assert!(
        sink.statuses("uid-late")
            .iter()
            .all(|s| s.phase.as_deref() != Some("Running")),
        "the rejected pod never ran"
    );

    shutdown.cancel();
    agent.await.unwrap();
}
