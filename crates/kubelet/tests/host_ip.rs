//! Every pod's `status.hostIP` is the node's IP: `AgentBuilder::node_ip` (`--node-ip`), else
//! the local address of the default route, never the pod's own IP.

use std::sync::Arc;
use std::time::Duration;

use kubelet::k8s_openapi::api::core::v1::{Container, Pod, PodSpec, PodStatus};
use kubelet::{AgentBuilder, KubeletConfig, KubeletConfiguration};
use kubelet_core::testing::{FakeRuntime, WatchSource};
use tokio_util::sync::CancellationToken;

fn pod() -> Pod {
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
    p.metadata.name = Some("web".into());
    p.metadata.namespace = Some("default".into());
    p.metadata.uid = Some("u1".into());
    p
}

/// Runs one pod on an agent with `node_ip` and returns its first status that has a host IP.
async fn status_with(node_ip: Option<std::net::IpAddr>) -> PodStatus {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut configuration = KubeletConfiguration::default();
    configuration.pod_logs_dir = dir.path().join("logs").to_string_lossy().into_owned();
    let (source, _pods) = WatchSource::new(Some(vec![pod()]));
    let mut agent = AgentBuilder::new("node-1")
        .configuration(configuration)
        .root_dir(dir.path().join("root"))
        .runtime(Arc::new(FakeRuntime::new()))
        .without_server()
        .without_prober()
        .without_eviction()
        .pod_source(Arc::new(source));
    if let Some(ip) = node_ip {
        agent = agent.node_ip(ip);
    }
    let agent = agent.build().await.expect("agent");
    let statuses = agent.status_reader();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(agent.run(shutdown.clone()));
    let begin = std::time::Instant::now();
    let status = loop {
        if let Some(s) = statuses
            .get("u1")
            .map(|p| PodStatus::clone(&p.status))
            .filter(|s| s.host_ip.is_some() && s.pod_ip.is_some())
        {
            break s;
        }
        assert!(begin.elapsed() < Duration::from_secs(30), "no hostIP");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    shutdown.cancel();
    let _ = task.await;
    status
}

#[tokio::test]
async fn host_ip_is_the_node_ip_not_the_pod_ip() {
    let ip: std::net::IpAddr = "192.0.2.10".parse().expect("ip");
    let st = status_with(Some(ip)).await;
    assert_eq!(st.host_ip.as_deref(), Some("192.0.2.10"));
    assert_eq!(
        st.host_ips
            .iter()
            .flatten()
            .map(|h| h.ip.as_str())
            .collect::<Vec<_>>(),
        ["192.0.2.10"]
    );
    assert_ne!(st.pod_ip.as_deref(), Some("192.0.2.10"));

    // Without one, the address of the default route, as the kubelet picks it.
    if let Some(default) = KubeletConfig::default_node_ip() {
        let st = status_with(None).await;
        assert_eq!(st.host_ip, Some(default.to_string()));
    }
}
