//! RuntimeClass through the engine: a pod's `runtimeClassName` becomes its sandbox's runtime
//! handler (looked up through the object provider); an unknown class leaves the pod without a
//! sandbox, with the kubelet's `FailedCreatePodSandBox` event, and other pods unaffected.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::api::node::v1::RuntimeClass;
use kubelet_api::{ContainerRuntime, StaticObjects};
use kubelet_core::testing::{FakeRuntime, RecordingSink, WatchSource};
use kubelet_core::{KubeletBuilder, KubeletConfig};
use kubelet_pleg::{GenericPleg, GenericPlegConfig};
use tokio_util::sync::CancellationToken;

fn pod(uid: &str, class: Option<&str>) -> Pod {
    let mut p = Pod {
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "app".into(),
                image: Some("busybox:1".into()),
                ..Default::default()
            }],
            runtime_class_name: class.map(str::to_string),
            host_network: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    };
    p.metadata.name = Some(format!("pod-{uid}"));
    p.metadata.namespace = Some("default".into());
    p.metadata.uid = Some(uid.into());
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_class_names_the_sandbox_handler_and_an_unknown_one_fails_the_sandbox() {
    let rt = Arc::new(FakeRuntime::new());
    let runtime: Arc<dyn ContainerRuntime> = rt.clone();
    let (pleg, pleg_events) = GenericPleg::new(runtime.clone(), GenericPlegConfig::default());
    let sink = Arc::new(RecordingSink::new());
    let objects = Arc::new(StaticObjects::new());
    let mut rc = RuntimeClass {
        handler: "gvisor".into(),
        ..Default::default()
    };
    rc.metadata.name = Some("sandboxed".into());
    objects.put_runtime_class(rc);
    let (source, _tx) = WatchSource::new(Some(vec![
        pod("classy", Some("sandboxed")),
        pod("classless", Some("missing")),
        pod("plain", None),
    ]));
    let dir = tempfile::tempdir().expect("tempdir");
    let kubelet = KubeletBuilder::new("node-1")
        .config(KubeletConfig::with_dirs(
            dir.path().join("root"),
            dir.path().join("logs"),
        ))
        .runtime(runtime)
        .pleg(Arc::new(pleg), pleg_events)
        .pod_source(Arc::new(source))
        .status_sink(sink.clone())
        .object_provider(objects)
        .build()
        .expect("build");
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(kubelet.run(shutdown.clone()));

    for uid in ["classy", "plain"] {
        let running = sink
            .wait_for(
                |s| s.uid == uid && s.status.phase.as_deref() == Some("Running"),
                Duration::from_secs(30),
            )
            .await;
        assert!(
            running.is_some(),
            "{uid} not Running: {:?}",
            sink.latest(uid)
        );
    }
    assert_eq!(
        rt.sandbox_config("classy")
            .expect("sandbox")
            .runtime_handler,
        "gvisor"
    );
    assert_eq!(
        rt.sandbox_config("plain").expect("sandbox").runtime_handler,
        ""
    );
    let ev = sink
        .wait_for_event(
            |e| e.reason == "FailedCreatePodSandBox" && e.involved.uid == "classless",
            Duration::from_secs(30),
        )
        .await
        .expect("FailedCreatePodSandBox");
    assert_eq!(
        ev.message,
        "Failed to create pod sandbox: runtimeClass \"missing\" not found"
    );
    assert!(rt.sandbox_config("classless").is_none());
    assert_eq!(
        sink.latest("classless").and_then(|s| s.phase),
        Some("Pending".to_string())
    );
    shutdown.cancel();
    let _ = task.await;
}
