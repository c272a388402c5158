//! Service-account tokens as a current (≥ 1.21) cluster gives them to every pod, against a real
//! kube-apiserver 1.20.2 with the gate `BoundServiceAccountTokenVolume` on, ServiceAccount
//! admission and a kube-controller-manager (the `default` ServiceAccount, `kube-root-ca.crt`):
//! an ordinary pod gets the projected `kube-api-access-*` volume from admission, the agent
//! fills it (a TokenRequest bound to the pod, made with the node's credentials and allowed by
//! the Node authorizer and NodeRestriction; the cluster's CA; the namespace), the pod starts,
//! and its process calls the API server with the token and is recognised as its service
//! account. A pod whose service account is gone waits with `FailedMount` while the other runs.
//!
//! Own `main` (`harness = false`): the process runtime starts each container's supervisor by
//! re-running this executable (`ShimCommand::CurrentExe`). Skips with a message when no
//! kube-apiserver can be provided; fails instead under `KUBELET_SDK_REQUIRE_ROOT=1`.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use common::{log_text, wait_until};
use k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, ObjectFieldSelector, Pod, PodSpec, ServiceAccount,
};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use kubelet_api::ContainerRuntime;
use kubelet_apiserver::{ApiObjects, ApiServer, ApiServerConfig, client_from_kubeconfig};
use kubelet_core::testing::RecordingSink;
use kubelet_core::{KubeletBuilder, KubeletConfig};
use kubelet_pleg::{GenericPleg, GenericPlegConfig};
use kubelet_process::{ProcessRuntime, ProcessRuntimeConfig, ShimCommand};
use kubelet_testenv::ApiServerEnv;
use tokio_util::sync::CancellationToken;

mod common;

const NODE: &str = "projected-node";
const NS: &str = "default";
const TEST: &str = "every_pod_gets_a_service_account_token_it_can_call_the_api_server_with";

fn main() -> ExitCode {
    common::run_one(TEST, run)
}

/// A pod that prints its namespace file and what the API server answers to its token. The
/// process runtime has no mount namespace: the process reads the volume at its host path.
fn pod(name: &str, service_account: Option<&str>, root: &Path, url: &str) -> Pod {
    let vols = format!(
        "{}/pods/$POD_UID/volumes/kubernetes.io~projected",
        root.display()
    );
    let script = format!(
        "d=$(echo {vols}/kube-api-access-*); \
         echo \"namespace=$(cat $d/namespace)\"; \
         curl -sS --cacert $d/ca.crt -H \"Authorization: Bearer $(cat $d/token)\" \
           {url}/api/v1/namespaces/{NS}/pods; echo; \
         exec sleep 1000"
    );
    let mut p = Pod {
        spec: Some(PodSpec {
            node_name: Some(NODE.into()),
            service_account_name: service_account.map(Into::into),
            termination_grace_period_seconds: Some(2),
            host_network: Some(true),
            containers: vec![Container {
                name: "app".into(),
                image: Some("busybox:1".into()),
                command: Some(vec!["sh".into(), "-c".into(), script]),
                env: Some(vec![EnvVar {
                    name: "POD_UID".into(),
                    value_from: Some(EnvVarSource {
                        field_ref: Some(ObjectFieldSelector {
                            field_path: "metadata.uid".into(),
                            api_version: None,
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    p.metadata.name = Some(name.into());
    p
}

async fn run() {
    let Some(env) = ApiServerEnv::start_with_service_accounts(TEST, NODE) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("root");
    let logs = dir.path().join("logs");
    let admin = client_from_kubeconfig(env.admin_kubeconfig())
        .await
        .expect("admin client");
    let node = client_from_kubeconfig(env.node_kubeconfig())
        .await
        .expect("node client");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), NS);
    let pp = PostParams::default();

    // Admission gives an ordinary pod the projected volume of a current cluster.
    let created = pods
        .create(&pp, &pod("web", None, &root, env.url()))
        .await
        .expect("create Pod");
    let uid = created.metadata.uid.clone().expect("uid");
    let spec = created.spec.as_ref().expect("spec");
    let volume = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name.starts_with("kube-api-access-"))
        .unwrap_or_else(|| panic!("no kube-api-access volume: {spec:#?}"));
    let sources = volume
        .projected
        .as_ref()
        .and_then(|p| p.sources.clone())
        .unwrap_or_default();
    assert!(
        sources.iter().any(|s| s.service_account_token.is_some())
            && sources.iter().any(|s| s.config_map.is_some())
            && sources.iter().any(|s| s.downward_api.is_some()),
        "{sources:#?}"
    );

    // A pod whose service account is deleted before the agent sees it gets no token.
    let mut doomed = ServiceAccount::default();
    doomed.metadata.name = Some("doomed".into());
    accounts.create(&pp, &doomed).await.expect("create SA");
    let orphan = pods
        .create(&pp, &pod("orphan", Some("doomed"), &root, env.url()))
        .await
        .expect("create Pod");
    let orphan_uid = orphan.metadata.uid.clone().expect("uid");
    accounts
        .delete("doomed", &DeleteParams::default())
        .await
        .expect("delete SA");

    let state = dir.path().join("state");
    let runtime: Arc<dyn ContainerRuntime> = Arc::new(
        ProcessRuntime::new(
            ProcessRuntimeConfig::new(&state)
                .shim(ShimCommand::CurrentExe)
                .use_cgroups(false),
        )
        .expect("process runtime"),
    );
    let (pleg, pleg_events) = GenericPleg::new(runtime.clone(), GenericPlegConfig::default());
    let pleg = std::sync::Arc::new(pleg);
    let sink = Arc::new(RecordingSink::new());
    let objects = ApiObjects::new(node.clone());
    let builder = KubeletBuilder::new(NODE).config(KubeletConfig::with_dirs(&root, &logs));
    let api = ApiServer::new(node, NODE, ApiServerConfig::default().root_dir(&root))
        .with_recorder(builder.recorder());
    let kubelet = builder
        .runtime(runtime.clone())
        .pleg(pleg, pleg_events)
        .pod_source(api.pod_source())
        .status_sink(sink.clone())
        .object_provider(Arc::new(objects.clone()))
        .build()
        .expect("build");
    objects.sync_pods_through(Arc::new(kubelet.handle()));
    let shutdown = CancellationToken::new();
    let agent = tokio::spawn(kubelet.run(shutdown.clone()));

    let running = sink
        .wait_for(
            |r| r.uid == uid && r.status.phase.as_deref() == Some("Running"),
            Duration::from_secs(60),
        )
        .await;
    assert!(running.is_some(), "pod Running: {:#?}", sink.latest(&uid));
    // The token authenticates the pod's service account (which has no RBAC permissions, so
    // the answer is a 403 naming it; an invalid token would be a 401 "Unauthorized").
    wait_until(
        "the process's call with its token",
        Duration::from_secs(30),
        || {
            let t = log_text(&logs);
            t.contains("namespace=default")
                && t.contains("User \\\"system:serviceaccount:default:default\\\" cannot list")
        },
    )
    .await;
    let files = root
        .join("pods")
        .join(&uid)
        .join("volumes/kubernetes.io~projected")
        .join(&volume.name);
    let token = std::fs::read_to_string(files.join("token")).expect("token");
    assert_eq!(token.split('.').count(), 3, "a JWT: {token}");
    assert_eq!(
        std::fs::read_to_string(files.join("ca.crt")).expect("ca.crt"),
        std::fs::read_to_string(env.ca_file()).expect("CA")
    );
    // The node asked for it, bound to the pod (NodeRestriction checks the binding).
    assert!(
        env.audit_events()
            .iter()
            .any(|e| e.user == format!("system:node:{NODE}")
                && e.verb == "create"
                && e.resource == "serviceaccounts"
                && e.subresource == "token"
                && e.code == 201),
        "no token request by the node in the audit log"
    );

    // The other pod waits with the reason, and never starts.
    wait_until(
        "FailedMount for the pod without its service account",
        Duration::from_secs(30),
        || {
            sink.events().iter().any(|e| {
                e.reason == "FailedMount"
                    && e.involved.uid == orphan_uid
                    && e.message
                        .contains("failed to fetch token for service account default/doomed")
            })
        },
    )
    .await;
    assert_ne!(
        sink.latest(&orphan_uid).and_then(|s| s.phase),
        Some("Running".to_string())
    );
    shutdown.cancel();
    let _ = agent.await;
    // Containers outlive the agent by design: stop and remove them, so the test leaves no
    // shim or `sleep` behind.
    let sandboxes = runtime
        .list_pod_sandboxes(&Default::default())
        .await
        .expect("list sandboxes");
    for sb in sandboxes {
        runtime
            .stop_pod_sandbox(&sb.id)
            .await
            .expect("stop sandbox");
        runtime
            .remove_pod_sandbox(&sb.id)
            .await
            .expect("remove sandbox");
    }
}
