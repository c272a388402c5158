//! `AgentBuilder::start_stage_limit` (`minimal_kubelet --start-stage-limit`) bounds how many
//! RunPodSandbox calls reach the runtime at once during a burst of pods; without it they all go.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use kubelet::k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use kubelet::{AgentBuilder, ContainerRuntime, KubeletConfiguration};
use kubelet_api::Result;
use kubelet_core::layer::{Call, Intercepted, Interceptor};
use kubelet_core::testing::{FakeRuntime, WatchSource};
use tokio_util::sync::CancellationToken;

/// `futures::future::BoxFuture`, which the interceptor trait takes.
type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// Holds every RunPodSandbox for a moment and records how many were in flight at most.
#[derive(Clone, Default)]
struct SandboxConcurrency {
    now: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    calls: Arc<AtomicUsize>,
}

impl Interceptor for SandboxConcurrency {
    fn intercept<'a, T: Send + 'a>(
        &'a self,
        call: Call,
        fut: BoxFuture<'a, Result<T>>,
    ) -> BoxFuture<'a, Result<T>> {
        if call.operation != "run_podsandbox" {
            return fut;
        }
        Box::pin(async move {
            let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(n, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(100)).await;
            let r = fut.await;
            self.now.fetch_sub(1, Ordering::SeqCst);
            self.calls.fetch_add(1, Ordering::SeqCst);
            r
        })
    }
}

fn pod(i: usize) -> Pod {
    let mut p = Pod {
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "app".into(),
                image: Some("busybox:1".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    p.metadata.name = Some(format!("p{i}"));
    p.metadata.namespace = Some("default".into());
    p.metadata.uid = Some(format!("u{i}"));
    p
}

/// Starts 8 pods with `limit` and returns the most RunPodSandbox calls seen at once.
async fn burst(limit: usize) -> usize {
    let probe = SandboxConcurrency::default();
    let runtime: Arc<dyn ContainerRuntime> = Arc::new(Intercepted::new(
        Arc::new(FakeRuntime::new()),
        probe.clone(),
    ));
    let dir = tempfile::tempdir().expect("temp dir");
    let mut configuration = KubeletConfiguration::default();
    configuration.pod_logs_dir = dir.path().join("logs").to_string_lossy().into_owned();
    let (source, _pods) = WatchSource::new(Some((0..8).map(pod).collect()));
    let agent = AgentBuilder::new("node-1")
        .configuration(configuration)
        .root_dir(dir.path().join("root"))
        .runtime(runtime)
        .without_server()
        .without_prober()
        .without_eviction()
        .start_stage_limit(limit)
        .pod_source(Arc::new(source))
        .build()
        .await
        .expect("agent");
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(agent.run(shutdown.clone()));
    let begin = std::time::Instant::now();
    while probe.calls.load(Ordering::SeqCst) < 8 {
        assert!(
            begin.elapsed() < Duration::from_secs(60),
            "only {} of 8 sandboxes were made",
            probe.calls.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    let _ = task.await;
    probe.most.load(Ordering::SeqCst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_start_stage_limit_bounds_concurrent_sandbox_creation() {
    let bounded = burst(2).await;
    assert!(
        (1..=2).contains(&bounded),
        "{bounded} RunPodSandbox calls at once with a limit of 2"
    );
    let unbounded = burst(0).await;
    assert!(
        unbounded > 2,
        "only {unbounded} RunPodSandbox calls at once without a limit"
    );
}
