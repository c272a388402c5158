//! `httpGet` lifecycle hooks through the SDK's HTTP client, against real loopback servers (real
//! time: the sockets are real): postStart before a container counts as started, a failing
//! postStart kills the container with `FailedPostStartHook`, an HTTPS hook answered in plain HTTP
//! falls back to HTTP, preStop runs on removal, and IPv6 literals work.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Container, HTTPGetAction, HTTPHeader, Lifecycle, LifecycleHandler, Pod, PodSpec,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kubelet_api::ContainerRuntime;
use kubelet_core::testing::{FakeRuntime, RecordingSink, WatchSource};
use kubelet_core::{KubeletBuilder, KubeletConfig};
use kubelet_pleg::{GenericPleg, GenericPlegConfig};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// A loopback HTTP server that answers every request with `status` and records request heads.
async fn hook_server(bind: &str, status: u16) -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind((bind, 0)).await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut b = [0u8; 2048];
                // A TLS client hello (record type 0x16) gets the plain answer at once.
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.first() != Some(&0x16) {
                    match s.read(&mut b).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&b[..n]),
                    }
                }
                if head.first() != Some(&0x16) {
                    log.lock().push(String::from_utf8_lossy(&head).into_owned());
                }
                let answer = format!("HTTP/1.1 {status} Status\r\nContent-Length: 0\r\n\r\n");
                let _ = s.write_all(answer.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    (port, seen)
}

fn http_hook(host: &str, port: u16, path: &str, scheme: &str) -> LifecycleHandler {
    LifecycleHandler {
        http_get: Some(HTTPGetAction {
            host: Some(host.into()),
            port: IntOrString::Int(i32::from(port)),
            path: Some(path.into()),
            scheme: Some(scheme.into()),
            http_headers: Some(vec![HTTPHeader {
                name: "Authorization".into(),
                value: "Bearer hook-token".into(),
            }]),
        }),
        ..Default::default()
    }
}

fn pod(uid: &str, lifecycle: Lifecycle) -> Pod {
    let mut p = Pod {
        spec: Some(PodSpec {
            restart_policy: Some("Never".into()),
            containers: vec![Container {
                name: "app".into(),
                image: Some("busybox:1".into()),
                lifecycle: Some(lifecycle),
                ..Default::default()
            }],
            host_network: Some(true),
            termination_grace_period_seconds: Some(5),
            ..Default::default()
        }),
        ..Default::default()
    };
    p.metadata.name = Some(format!("pod-{uid}"));
    p.metadata.namespace = Some("default".into());
    p.metadata.uid = Some(uid.into());
    p
}

struct Agent {
    rt: Arc<FakeRuntime>,
    sink: Arc<RecordingSink>,
    pods: watch::Sender<Option<Vec<Pod>>>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Agent {
    fn start(pods: Vec<Pod>) -> Self {
        let rt = Arc::new(FakeRuntime::new());
        let runtime: Arc<dyn ContainerRuntime> = rt.clone();
        let (pleg, pleg_events) = GenericPleg::new(runtime.clone(), GenericPlegConfig::default());
        let pleg = std::sync::Arc::new(pleg);
        let sink = Arc::new(RecordingSink::new());
        let (source, tx) = WatchSource::new(Some(pods));
        let dir = tempfile::tempdir().expect("tempdir");
        let kubelet = KubeletBuilder::new("node-1")
            .config(KubeletConfig::with_dirs(
                dir.path().join("root"),
                dir.path().join("logs"),
            ))
            .runtime(runtime)
            .pleg(pleg, pleg_events)
            .pod_source(Arc::new(source))
            .status_sink(sink.clone())
            .build()
            .expect("build");
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(kubelet.run(shutdown.clone()));
        Self {
            rt,
            sink,
            pods: tx,
            shutdown,
            task,
            _dir: dir,
        }
    }

    async fn event(&self, reason: &str) -> kubelet_api::Event {
        match self
            .sink
            .wait_for_event(|e| e.reason == reason, Duration::from_secs(30))
            .await
        {
            Some(e) => e,
            None => panic!("no {reason} event; events: {:#?}", self.sink.events()),
        }
    }

    /// Wait until pod `uid` is reported Running.
    async fn running(&self, uid: &str, what: &str) {
        let found = self
            .sink
            .wait_for(
                |r| r.uid == uid && r.status.phase.as_deref() == Some("Running"),
                Duration::from_secs(30),
            )
            .await;
        assert!(found.is_some(), "{what}: {:#?}", self.sink.latest(uid));
    }

    async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }
}

#[tokio::test]
async fn post_start_and_pre_stop_http_hooks_reach_an_ipv6_server_with_the_lifecycle_agent() {
    let (port, seen) = hook_server("::1", 200).await;
    let lifecycle = Lifecycle {
        post_start: Some(http_hook("::1", port, "started", "HTTP")),
        pre_stop: Some(http_hook("::1", port, "/stopping", "HTTP")),
        ..Default::default()
    };
    let agent = Agent::start(vec![pod("u1", lifecycle)]);
    agent.running("u1", "Running").await;
    {
        let heads = seen.lock();
        assert_eq!(heads.len(), 1, "{heads:?}");
        assert!(
            heads[0].starts_with(&format!(
                "GET /started HTTP/1.1\r\nHost: [::1]:{port}\r\nUser-Agent: kube-lifecycle/"
            )),
            "{}",
            heads[0]
        );
        assert!(heads[0].contains("Authorization: Bearer hook-token\r\n"));
    }
    agent.pods.send_replace(Some(vec![]));
    agent.event("Killing").await;
    let begin = std::time::Instant::now();
    while seen.lock().len() < 2 {
        assert!(
            begin.elapsed() < Duration::from_secs(30),
            "no preStop request"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(seen.lock()[1].starts_with("GET /stopping HTTP/1.1\r\n"));
    assert!(
        agent
            .sink
            .events()
            .iter()
            .all(|e| e.reason != "FailedPreStopHook" && e.reason != "FailedPostStartHook"),
        "{:#?}",
        agent.sink.events()
    );
    agent.stop().await;
}

#[tokio::test]
async fn a_failing_post_start_hook_kills_the_container_and_reports_post_start_hook_error() {
    // A port nothing listens on: the hook's GET cannot connect. (A status code alone would not
    // fail it: the kubelet ignores the status of hook responses.)
    let closed = {
        let l = TcpListener::bind(("127.0.0.1", 0)).await.expect("bind");
        l.local_addr().expect("addr").port()
    };
    let (ok_port, _) = hook_server("127.0.0.1", 500).await;
    let failing = Lifecycle {
        post_start: Some(http_hook("127.0.0.1", closed, "/", "HTTP")),
        ..Default::default()
    };
    let status_500 = Lifecycle {
        post_start: Some(http_hook("127.0.0.1", ok_port, "/", "HTTP")),
        ..Default::default()
    };
    let agent = Agent::start(vec![pod("u1", failing), pod("u2", status_500)]);
    let failed = agent.event("FailedPostStartHook").await;
    assert!(
        failed
            .message
            .contains("HTTP lifecycle hook for Container \"app\"")
            && failed.message.contains(&format!("127.0.0.1:{closed}")),
        "{}",
        failed.message
    );
    let killing = agent.event("Killing").await;
    assert_eq!(killing.message, "FailedPostStartHook");
    let status = agent
        .sink
        .wait_for(
            |r| {
                r.uid == "u1"
                    && r.status.container_statuses.iter().flatten().any(|c| {
                        c.state
                            .as_ref()
                            .and_then(|s| s.terminated.as_ref())
                            .is_some()
                    })
            },
            Duration::from_secs(30),
        )
        .await
        .expect("the container killed");
    assert_eq!(
        status.status.phase.as_deref(),
        Some("Failed"),
        "{status:#?}"
    );
    let id = agent.rt.find_container("u1", "app").expect("container");
    assert!(
        agent
            .rt
            .calls()
            .iter()
            .any(|c| c.starts_with(&format!("stop_container {id}"))),
        "{:?}",
        agent.rt.calls()
    );
    // The pod whose hook got a 500 runs on.
    agent.running("u2", "u2 Running despite the 500").await;
    agent.stop().await;
}

#[tokio::test]
async fn an_https_hook_answered_in_plain_http_is_retried_over_http_without_authorization() {
    let (port, seen) = hook_server("127.0.0.1", 200).await;
    let lifecycle = Lifecycle {
        post_start: Some(http_hook("127.0.0.1", port, "/tls", "HTTPS")),
        ..Default::default()
    };
    let agent = Agent::start(vec![pod("u1", lifecycle)]);
    let fallback = agent.event("LifecycleHTTPFallback").await;
    assert_eq!(
        fallback.message,
        format!(
            "request to HTTPS lifecycle hook 127.0.0.1:{port} got HTTP response, retry with HTTP succeeded"
        )
    );
    agent.running("u1", "Running after the fallback").await;
    let heads = seen.lock().clone();
    assert_eq!(
        heads.len(),
        1,
        "only the plain retry reads as HTTP: {heads:?}"
    );
    assert!(heads[0].starts_with("GET /tls HTTP/1.1\r\n"));
    assert!(!heads[0].contains("Authorization"), "{}", heads[0]);
    agent.stop().await;
}
