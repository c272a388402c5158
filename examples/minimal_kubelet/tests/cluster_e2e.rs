//! `minimal_kubelet --kubeconfig` against a real kube-apiserver 1.20 (`kubelet-testenv`): the
//! binary, with the node's NodeRestriction-scoped credentials, registers its Node with the
//! `--node-labels`, holds its Lease, runs a pod bound to it through the API, and stops it and
//! lets the object go when the pod is deleted. Skips without the API server environment (fails
//! under `KUBELET_SDK_REQUIRE_ROOT=1`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kubelet::apiserver::kube::api::{DeleteParams, PostParams};
use kubelet::apiserver::kube::{self, Api, Client};
use kubelet::k8s_openapi::api::coordination::v1::Lease;
use kubelet::k8s_openapi::api::core::v1::{Node, Pod};
use kubelet_testenv::ApiServerEnv;

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_minimal_kubelet");

/// The agent process and the token its containers carry; killed (with them) on drop.
struct Agent {
    child: Child,
    token: String,
    _dir: tempfile::TempDir,
}

impl Drop for Agent {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "agent log:\n{}",
                std::fs::read_to_string(self._dir.path().join("agent.log")).unwrap_or_default()
            );
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Containers outlive the agent by design: kill the ones this test started, found by the
        // token that is a whole argument of their command line.
        common::kill_token_processes(std::slice::from_ref(&self.token));
    }
}

impl Agent {
    /// Start `minimal_kubelet` joined to `env` as its node, with `extra` flags; the containers
    /// it starts carry `token`.
    fn start(env: &ApiServerEnv, token: &str, extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let stderr = std::fs::File::create(dir.path().join("agent.log")).unwrap();
        let child = Command::new(BIN)
            .args(["--kubeconfig", env.node_kubeconfig().to_str().unwrap()])
            .args(["--node-name", env.node_name()])
            .arg("--root-dir")
            .arg(dir.path().join("root"))
            .arg("--pod-log-dir")
            .arg(dir.path().join("logs"))
            .args(["--healthz-port", "0", "--port", "0"])
            // The test machine's disk may be fuller than the kubelet's default thresholds allow.
            .args(["--eviction-hard", common::LOW_EVICTION_HARD])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start minimal_kubelet");
        Self {
            child,
            token: token.to_string(),
            _dir: dir,
        }
    }

    /// The agent's pod log directory.
    fn logs(&self) -> std::path::PathBuf {
        self._dir.path().join("logs")
    }
}

/// A client with the environment's admin credentials.
async fn admin_client(env: &ApiServerEnv) -> Client {
    let kc = kube::config::Kubeconfig::read_from(env.admin_kubeconfig()).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    Client::try_from(cfg).unwrap()
}

async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubeconfig_joins_the_cluster_and_runs_pods_bound_to_the_node() {
    let test = "kubeconfig_joins_the_cluster_and_runs_pods_bound_to_the_node";
    let Some(env) = ApiServerEnv::start_for_node(test, "mk-cluster") else {
        return;
    };
    let node = env.node_name().to_string();
    let token = format!("mk-cluster-{}", std::process::id());
    let _agent = Agent::start(&env, &token, &["--node-labels", "example.com/zone=lab"]);

    let admin = admin_client(&env).await;
    let nodes: Api<Node> = Api::all(admin.clone());
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let leases: Api<Lease> = Api::namespaced(admin, "kube-node-lease");

    let n = eventually("node Ready", Duration::from_secs(30), || async {
        let n = nodes.get_opt(&node).await.ok().flatten()?;
        let ready = n
            .status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        ready.then_some(n)
    })
    .await;
    assert_eq!(n.metadata.labels.unwrap()["example.com/zone"], "lab");
    let conditions: Vec<String> = n
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .map(|c| c.type_)
        .collect();
    assert_eq!(
        conditions,
        ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"],
        "the eviction manager's conditions, then Ready"
    );
    eventually("lease", Duration::from_secs(20), || async {
        leases.get_opt(&node).await.ok().flatten()
    })
    .await;

    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": "hello" },
        "spec": {
            "nodeName": node, "hostNetwork": true, "terminationGracePeriodSeconds": 3,
            "containers": [{
                "name": "app", "image": "busybox",
                "command": ["/bin/sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done", &token],
            }],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    eventually("hello Running", Duration::from_secs(30), || async {
        let p = pods.get("hello").await.ok()?;
        (p.status?.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
    pods.delete("hello", &DeleteParams::default())
        .await
        .unwrap();
    eventually("hello gone", Duration::from_secs(30), || async {
        pods.get_opt("hello")
            .await
            .ok()
            .flatten()
            .is_none()
            .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_get_the_service_environment_variables_of_their_namespace() {
    let test = "pods_get_the_service_environment_variables_of_their_namespace";
    let Some(env) = ApiServerEnv::start_for_node(test, "mk-svcenv") else {
        return;
    };
    let node = env.node_name().to_string();
    let token = format!("mk-svcenv-{}", std::process::id());
    let admin = admin_client(&env).await;
    // A Service in the pod's namespace and a headless one.
    let services: Api<kubelet::k8s_openapi::api::core::v1::Service> =
        Api::namespaced(admin.clone(), "default");
    for (name, headless) in [("my-web", false), ("nobody", true)] {
        let svc: kubelet::k8s_openapi::api::core::v1::Service =
            serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": { "name": name },
                "spec": {
                    "clusterIP": if headless { "None" } else { "" },
                    "ports": [{ "name": "http", "port": 8080 }, { "name": "dns", "port": 53, "protocol": "UDP" }],
                },
            }))
            .unwrap();
        services.create(&PostParams::default(), &svc).await.unwrap();
    }
    let web = services.get("my-web").await.unwrap();
    let web_ip = web.spec.unwrap().cluster_ip.unwrap();
    let agent = Agent::start(&env, &token, &[]);
    let logs = agent.logs();
    let pods: Api<Pod> = Api::namespaced(admin, "default");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": "envy" },
        "spec": {
            "nodeName": node, "hostNetwork": true, "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "app", "image": "busybox",
                "env": [{ "name": "TARGET", "value": "$(MY_WEB_SERVICE_HOST):$(MY_WEB_SERVICE_PORT)" }],
                "command": ["/bin/sh", "-c", "env | sort; sleep 100000", &token],
            }],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let p = eventually("envy Running", Duration::from_secs(60), || async {
        let p = pods.get("envy").await.ok()?;
        (p.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(p)
    })
    .await;
    let uid = p.metadata.uid.unwrap();
    let log = logs.join(format!("default_envy_{uid}/app/0.log"));
    let out = eventually(
        "the environment in the log",
        Duration::from_secs(20),
        || async {
            let text = std::fs::read_to_string(&log).ok()?;
            text.contains("TARGET=").then_some(text)
        },
    )
    .await;
    let has = |line: &str| out.contains(&format!(" {line}\n"));
    assert!(has("KUBERNETES_SERVICE_HOST=10.0.0.1"), "{out}");
    assert!(has("KUBERNETES_SERVICE_PORT=443"), "{out}");
    assert!(has(&format!("MY_WEB_SERVICE_HOST={web_ip}")), "{out}");
    assert!(has("MY_WEB_SERVICE_PORT=8080"), "{out}");
    assert!(has("MY_WEB_SERVICE_PORT_DNS=53"), "{out}");
    assert!(has(&format!("MY_WEB_PORT=tcp://{web_ip}:8080")), "{out}");
    assert!(has(&format!("MY_WEB_PORT_53_UDP_ADDR={web_ip}")), "{out}");
    assert!(
        has(&format!("TARGET={web_ip}:8080")),
        "$(VAR) sees them: {out}"
    );
    assert!(
        !out.contains("NOBODY_"),
        "a headless Service has none: {out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_edit_of_a_config_map_and_kubectl_label_reach_the_mounted_files() {
    let test = "kubectl_edit_of_a_config_map_and_kubectl_label_reach_the_mounted_files";
    let Some(env) = ApiServerEnv::start_for_node(test, "mk-watch") else {
        return;
    };
    let Some(kubectl) = kubelet_testenv::debian_kubectl(test) else {
        return;
    };
    let node = env.node_name().to_string();
    let token = format!("mk-watch-{}", std::process::id());
    let admin = admin_client(&env).await;
    let cms: Api<kubelet::k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(admin.clone(), "default");
    let cm: kubelet::k8s_openapi::api::core::v1::ConfigMap =
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "settings" },
            "data": { "conf.txt": "colour=blue" },
        }))
        .unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    // The default strategy (Watch) with the kubelet's 1-minute sync period: only the watch
    // brings the edit within the waits below.
    let agent = Agent::start(&env, &token, &[]);
    let pods: Api<Pod> = Api::namespaced(admin, "default");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": "watcher", "labels": { "tier": "web" } },
        "spec": {
            "nodeName": node, "hostNetwork": true, "terminationGracePeriodSeconds": 1,
            "volumes": [
                { "name": "conf", "configMap": { "name": "settings" } },
                { "name": "info", "downwardAPI": { "items": [
                    { "path": "labels", "fieldRef": { "fieldPath": "metadata.labels" } },
                ] } },
            ],
            "containers": [{
                "name": "app", "image": "busybox",
                "command": ["/bin/sh", "-c", "sleep 100000", &token],
            }],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let p = eventually("watcher Running", Duration::from_secs(60), || async {
        let p = pods.get("watcher").await.ok()?;
        (p.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(p)
    })
    .await;
    let uid = p.metadata.uid.unwrap();
    let volumes = agent._dir.path().join(format!("root/pods/{uid}/volumes"));
    let conf = volumes.join("kubernetes.io~configmap/conf/conf.txt");
    let labels = volumes.join("kubernetes.io~downward-api/info/labels");
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), "colour=blue");
    assert_eq!(std::fs::read_to_string(&labels).unwrap(), "tier=\"web\"");

    // `kubectl edit` with an editor that rewrites the value.
    let editor = agent._dir.path().join("editor.sh");
    std::fs::write(
        &editor,
        "#!/bin/sh\nsed -i 's/colour=blue/colour=green/' \"$1\"\n",
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&editor, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let edited = std::time::Instant::now();
    let out = Command::new(&kubectl)
        .arg("--kubeconfig")
        .arg(env.admin_kubeconfig())
        .args(["edit", "configmap", "settings"])
        .env("KUBE_EDITOR", &editor)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl edit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    eventually("the edited file", Duration::from_secs(20), || async {
        (std::fs::read_to_string(&conf).ok()?.as_str() == "colour=green").then_some(())
    })
    .await;
    println!("kubectl edit -> file: {:?}", edited.elapsed());

    // `kubectl label`: the downwardAPI file follows.
    let out = Command::new(&kubectl)
        .arg("--kubeconfig")
        .arg(env.admin_kubeconfig())
        .args(["label", "--overwrite", "pod", "watcher", "tier=db"])
        .output()
        .unwrap();
    assert!(out.status.success(), "kubectl label: {out:?}");
    eventually("the relabelled file", Duration::from_secs(20), || async {
        (std::fs::read_to_string(&labels).ok()?.as_str() == "tier=\"db\"").then_some(())
    })
    .await;
}

#[test]
fn an_unknown_change_detection_strategy_is_a_startup_error_naming_the_accepted_values() {
    let out = Command::new(BIN)
        .args(["--config-map-and-secret-change-detection-strategy", "watch"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("accepted values are Watch, Cache and Get"),
        "{err}"
    );
}

/// An ordinary pod of a current cluster (admission gives it the projected
/// `kube-api-access-*` volume: token, `kube-root-ca.crt`, namespace) starts on the node, and
/// its `hostIP` is the node's IP from `--node-ip`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordinary_pod_of_a_current_cluster_starts_with_its_service_account_volume() {
    let test = "an_ordinary_pod_of_a_current_cluster_starts_with_its_service_account_volume";
    let Some(env) = ApiServerEnv::start_with_service_accounts(test, "mk-current") else {
        return;
    };
    let node = env.node_name().to_string();
    let token = format!("mk-current-{}", std::process::id());
    let agent = Agent::start(&env, &token, &["--node-ip", "127.0.0.1"]);
    let admin = admin_client(&env).await;
    let pods: Api<Pod> = Api::namespaced(admin, "default");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": "ordinary" },
        "spec": {
            "nodeName": node, "terminationGracePeriodSeconds": 3,
            "containers": [{
                "name": "app", "image": "busybox",
                "command": ["/bin/sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done", &token],
            }],
        },
    }))
    .unwrap();
    let created = pods.create(&PostParams::default(), &pod).await.unwrap();
    let volume = created
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .and_then(|v| v.iter().find(|v| v.name.starts_with("kube-api-access-")))
        .map(|v| v.name.clone())
        .expect("admission added the kube-api-access volume");
    let running = eventually("ordinary Running", Duration::from_secs(30), || async {
        let p = pods.get("ordinary").await.ok()?;
        (p.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(p)
    })
    .await;
    let status = running.status.unwrap();
    assert_eq!(status.host_ip.as_deref(), Some("127.0.0.1"));
    let uid = running.metadata.uid.unwrap();
    let files = agent
        ._dir
        .path()
        .join("root/pods")
        .join(uid)
        .join("volumes/kubernetes.io~projected")
        .join(volume);
    assert_eq!(
        std::fs::read_to_string(files.join("namespace")).unwrap(),
        "default"
    );
    assert!(
        !std::fs::read_to_string(files.join("token"))
            .unwrap()
            .is_empty()
    );
    assert!(
        std::fs::read_to_string(files.join("ca.crt"))
            .unwrap()
            .contains("BEGIN CERTIFICATE")
    );
}
