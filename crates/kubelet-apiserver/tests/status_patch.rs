//! The status sink against a real kube-apiserver 1.20 with the node's credentials: a status
//! patch computed from a stale copy of the pod (the watch has not yet brought back the sink's
//! previous write) still lands. A strategic merge of `podIPs` from such a copy keeps the old
//! address next to the new one, which the API server refuses ("may specify no more than one IP
//! for each IP family"); the sink diffs again from the API server's copy.
//!
//! Skips with a message when no kube-apiserver can be provided; fails instead under
//! `KUBELET_SDK_REQUIRE_ROOT=1`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::core::v1::{Container, Pod, PodIP, PodSpec, PodStatus};
use kube::Api;
use kube::api::PostParams;
use kubelet_api::StatusSink;
use kubelet_apiserver::ApiServer;
use kubelet_testenv::ApiServerEnv;

const NODE: &str = "status-patch-node";

fn status(ip: &str) -> PodStatus {
    PodStatus {
        phase: Some("Running".into()),
        host_ip: Some("192.0.2.10".into()),
        pod_ip: Some(ip.into()),
        pod_ips: Some(vec![PodIP { ip: ip.into() }]),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_status_patch_from_a_stale_copy_of_the_pod_still_lands() {
    let Some(env) = ApiServerEnv::start_for_node("status_patch", NODE) else {
        return;
    };
    let admin = kubelet_apiserver::client_from_kubeconfig(env.admin_kubeconfig())
        .await
        .expect("admin client");
    let agent = ApiServer::from_kubeconfig(env.node_kubeconfig(), NODE, Default::default())
        .await
        .expect("node client");
    agent.register().await.expect("node registers");

    let pods: Api<Pod> = Api::namespaced(admin, "default");
    let created = pods
        .create(
            &PostParams::default(),
            &Pod {
                metadata: kube::api::ObjectMeta {
                    name: Some("web".into()),
                    ..Default::default()
                },
                spec: Some(PodSpec {
                    node_name: Some(NODE.into()),
                    containers: vec![Container {
                        name: "app".into(),
                        image: Some("busybox:1".into()),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await
        .expect("pod created");

    let sink = agent.status_sink();
    // The first write, from the pod as created (no status yet).
    sink.update_pod_status(&created, &status("10.0.0.1"))
        .await
        .expect("first status written");
    // The second, from the same copy: it does not know 10.0.0.1 is in the API.
    sink.update_pod_status(&created, &status("10.0.0.2"))
        .await
        .expect("second status written though the copy was stale");

    let now = pods.get("web").await.expect("pod read back");
    let s = now.status.expect("status");
    let ips: Vec<_> = s.pod_ips.iter().flatten().map(|i| i.ip.as_str()).collect();
    assert_eq!(ips, ["10.0.0.2"]);
    assert_eq!(s.pod_ip.as_deref(), Some("10.0.0.2"));
}
