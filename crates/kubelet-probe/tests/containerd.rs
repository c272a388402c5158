//! Probes through the engine on containerd (kubelet-cri): an HTTP readiness probe whose host
//! defaults to the pod IP on a bridge network, and an exec liveness probe through CRI
//! `ExecSync`. Needs root and containerd (a private instance per test, see
//! `scripts/containerd-test-env.sh`); skips otherwise unless `KUBELET_SDK_REQUIRE_ROOT=1`.
#![allow(clippy::unwrap_used)]

#[path = "../../kubelet-cri/tests/common/mod.rs"]
mod cri;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ExecAction, HTTPGetAction, PodStatus, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kubelet_api::ContainerRuntime;
use kubelet_core::testing::{RecordingSink, WatchSource};
use kubelet_core::{KubeletBuilder, KubeletConfig};
use kubelet_pleg::{GenericPleg, GenericPlegConfig};
use kubelet_probe::{Prober, ProberConfig};
use tokio_util::sync::CancellationToken;

const LONG: Duration = Duration::from_secs(120);

fn app(s: &PodStatus) -> Option<&k8s_openapi::api::core::v1::ContainerStatus> {
    s.container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == "web")
}

async fn wait(
    sink: &RecordingSink,
    from: usize,
    what: &str,
    f: impl Fn(&PodStatus) -> bool,
) -> PodStatus {
    let deadline = tokio::time::Instant::now() + LONG;
    loop {
        if let Some(s) = sink.statuses("web-1").into_iter().skip(from).find(|s| f(s)) {
            return s;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} not reached; latest {:#?}; events {:#?}",
            sink.latest("web-1"),
            sink.events()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_readiness_on_the_pod_ip_and_exec_liveness_work_on_containerd() {
    let Some(env) = cri::ContainerdEnv::start("http_readiness_and_exec_liveness_on_containerd")
    else {
        return;
    };
    let rt = env.runtime().await;
    let runtime: Arc<dyn ContainerRuntime> = rt.clone();
    let mut c = cri::container(
        "web",
        &env.busybox,
        "mkdir -p /www && echo ok > /www/healthz && touch /tmp/alive && exec httpd -f -p 8080 -h /www",
    );
    c.readiness_probe = Some(Probe {
        http_get: Some(HTTPGetAction {
            port: IntOrString::Int(8080),
            path: Some("/healthz".into()),
            ..Default::default()
        }),
        period_seconds: Some(1),
        failure_threshold: Some(1),
        ..Default::default()
    });
    c.liveness_probe = Some(Probe {
        exec: Some(ExecAction {
            command: Some(vec!["test".into(), "-f".into(), "/tmp/alive".into()]),
        }),
        period_seconds: Some(1),
        failure_threshold: Some(1),
        timeout_seconds: Some(5),
        ..Default::default()
    });
    let pod = cri::pod("web-1", false, vec![c]);
    let (source, tx) = WatchSource::new(Some(vec![pod]));
    let sink = Arc::new(RecordingSink::new());
    let (prober, probe_updates) = Prober::new(ProberConfig::default());
    let (pleg, pleg_events) = GenericPleg::new(runtime.clone(), GenericPlegConfig::default());
    let kubelet = KubeletBuilder::new("node-1")
        .config(KubeletConfig::with_dirs(
            env.dir.join("kubelet"),
            env.dir.join("logs"),
        ))
        .runtime(runtime.clone())
        .pleg(Arc::new(pleg), pleg_events)
        .pod_source(Arc::new(source))
        .status_sink(sink.clone())
        .prober(Arc::new(prober), probe_updates)
        .build()
        .unwrap();
    let shutdown = CancellationToken::new();
    let agent = tokio::spawn(kubelet.run(shutdown.clone()));

    // Ready through an HTTP probe on the pod's bridge IP (no host in the probe).
    let s = wait(&sink, 0, "ready", |s| app(s).is_some_and(|c| c.ready)).await;
    let ip = s.pod_ip.clone().unwrap();
    assert!(!ip.starts_with("127."), "{ip}");
    let id = app(&s).unwrap().container_id.clone().unwrap();
    let id = kubelet_api::runtime::strip_container_id(&id).to_string();

    // The page goes away: unready, not restarted.
    let mark = sink.statuses("web-1").len();
    let out = rt
        .exec_sync(
            &id,
            &["rm".into(), "/www/healthz".into()],
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert_eq!(out.exit_code, 0);
    let s = wait(&sink, mark, "unready", |s| app(s).is_some_and(|c| !c.ready)).await;
    assert_eq!(app(&s).unwrap().restart_count, 0);
    assert!(sink.events().iter().any(|e| e.reason == "Unhealthy"
        && e.message == "Readiness probe failed: HTTP probe failed with statuscode: 404"));

    // The liveness file goes away: the exec probe fails and the container restarts, and the
    // new instance (which recreates the page) becomes ready again.
    let mark = sink.statuses("web-1").len();
    let out = rt
        .exec_sync(
            &id,
            &["rm".into(), "/tmp/alive".into()],
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert_eq!(out.exit_code, 0);
    let s = wait(&sink, mark, "restarted and ready", |s| {
        app(s).is_some_and(|c| c.restart_count >= 1 && c.ready)
    })
    .await;
    assert_ne!(
        kubelet_api::runtime::strip_container_id(app(&s).unwrap().container_id.as_deref().unwrap()),
        id
    );
    assert!(
        sink.events()
            .iter()
            .any(|e| e.reason == "Killing" && e.message.contains("failed liveness probe"))
    );

    // Remove the pod, then stop the agent; dropping the environment tears containerd down.
    tx.send(Some(Vec::new())).unwrap();
    let deadline = tokio::time::Instant::now() + LONG;
    while !sink.removed().iter().any(|u| u == "web-1") {
        assert!(tokio::time::Instant::now() < deadline, "pod not removed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    shutdown.cancel();
    let _ = agent.await;
}
