//! `minimal_kubelet --kubeconfig` against a real kube-apiserver 1.20 (`kubelet-testenv`): the
//! binary, with the node's NodeRestriction-scoped credentials, registers its Node with the
//! `--node-labels`, holds its Lease, runs a pod bound to it through the API, and stops it and
//! lets the object go when the pod is deleted. Skips without the API server environment (fails
//! under `KUBELET_SDK_REQUIRE_ROOT=1`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kubelet::apiserver::kube::api::{DeleteParams, PostParams};
use kubelet::apiserver::kube::{self, Api, Client};
use kubelet::k8s_openapi::api::coordination::v1::Lease;
use kubelet::k8s_openapi::api::core::v1::{Node, Pod};
use kubelet_testenv::{ApiServerEnv, eventually};

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_minimal_kubelet");

/// The agent process and the token its containers carry; killed (with them) on drop.
struct Agent {
    child: Child,
    token: String,
    dir: std::path::PathBuf,
    _owned: Option<tempfile::TempDir>,
}

impl Drop for Agent {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "agent log:\n{}",
                std::fs::read_to_string(self.dir.join("agent.log")).unwrap_or_default()
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
        let mut agent = Self::start_in(dir.path(), env.node_kubeconfig(), env, token, extra);
        agent._owned = Some(dir);
        agent
    }

    /// Start the agent with its root, logs and log file in `dir` (kept when it stops, so that
    /// another agent can start on them) and the kubeconfig `kubeconfig`.
    fn start_in(
        dir: &std::path::Path,
        kubeconfig: &std::path::Path,
        env: &ApiServerEnv,
        token: &str,
        extra: &[&str],
    ) -> Self {
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("agent.log"))
            .unwrap();
        let child = Command::new(BIN)
            .args(["--kubeconfig", kubeconfig.to_str().unwrap()])
            .args(["--node-name", env.node_name()])
            .arg("--root-dir")
            .arg(dir.join("root"))
            .arg("--pod-log-dir")
            .arg(dir.join("logs"))
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
            dir: dir.to_path_buf(),
            _owned: None,
        }
    }

    /// The agent's directory (root directory `root`, pod logs `logs`, its log `agent.log`).
    fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// The agent's pod log directory.
    fn logs(&self) -> std::path::PathBuf {
        self.dir.join("logs")
    }

    /// The agent's log so far.
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("agent.log")).unwrap_or_default()
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
    let volumes = agent.dir().join(format!("root/pods/{uid}/volumes"));
    let conf = volumes.join("kubernetes.io~configmap/conf/conf.txt");
    let labels = volumes.join("kubernetes.io~downward-api/info/labels");
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), "colour=blue");
    assert_eq!(std::fs::read_to_string(&labels).unwrap(), "tier=\"web\"");

    // `kubectl edit` with an editor that rewrites the value.
    let editor = agent.dir().join("editor.sh");
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
        .dir()
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

/// A TCP proxy between the node and the API server: `cut` makes the API server unreachable for
/// the node alone (new connections are dropped, open ones closed) while the test's admin client
/// still reaches it; `restore` lets the node through again.
struct Proxy {
    port: u16,
    open: std::sync::Arc<std::sync::atomic::AtomicBool>,
    conns: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.task.abort();
    }
}

impl Proxy {
    async fn start(upstream: &str) -> Self {
        use std::sync::atomic::Ordering;
        let upstream = upstream
            .trim_start_matches("https://")
            .trim_end_matches('/')
            .to_string();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let conns: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>> =
            Default::default();
        let (o, c) = (open.clone(), conns.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut down, _)) = listener.accept().await {
                if !o.load(Ordering::SeqCst) {
                    continue; // dropped: the node's connection fails at once
                }
                let upstream = upstream.clone();
                let conn = tokio::spawn(async move {
                    if let Ok(mut up) = tokio::net::TcpStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                    }
                });
                c.lock().unwrap().push(conn.abort_handle());
            }
        });
        Self {
            port,
            open,
            conns,
            task,
        }
    }

    fn cut(&self) {
        self.open.store(false, std::sync::atomic::Ordering::SeqCst);
        for c in self.conns.lock().unwrap().drain(..) {
            c.abort();
        }
    }

    fn restore(&self) {
        self.open.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// A copy of `kubeconfig` whose server is this proxy (the API server's certificate names
    /// 127.0.0.1, so TLS still verifies).
    fn kubeconfig(&self, env: &ApiServerEnv, dir: &std::path::Path) -> std::path::PathBuf {
        let text = std::fs::read_to_string(env.node_kubeconfig()).unwrap();
        let url = env.url().trim_end_matches('/');
        assert!(text.contains(url), "the kubeconfig names {url}");
        let path = dir.join("node-via-proxy.kubeconfig");
        std::fs::write(
            &path,
            text.replace(url, &format!("https://127.0.0.1:{}", self.port)),
        )
        .unwrap();
        path
    }
}

/// The container process of the pod whose command carries `tag` (one whole argument).
fn pid_of(tag: &str) -> Option<i32> {
    let pids = common::container_pids(tag);
    (pids.len() == 1).then(|| pids[0])
}

/// A pod bound to `node` whose container runs `script` in a loop-free shell, carrying `token`
/// and `tag` as arguments; `extra` is merged into the spec.
fn looping_pod(
    node: &str,
    name: &str,
    script: &str,
    token: &str,
    tag: &str,
    extra: serde_json::Value,
) -> Pod {
    let mut pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name },
        "spec": {
            "nodeName": node, "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "app", "image": "busybox",
                "command": ["/bin/sh", "-c", format!("{script}; trap 'exit 0' TERM; while true; do sleep 0.2; done"), token, tag],
            }],
        },
    });
    if let serde_json::Value::Object(extra) = extra {
        for (k, v) in extra {
            match (k.as_str(), v) {
                ("container", serde_json::Value::Object(c)) => {
                    for (ck, cv) in c {
                        pod["spec"]["containers"][0][ck] = cv;
                    }
                }
                (_, v) => pod["spec"][k] = v,
            }
        }
    }
    serde_json::from_value(pod).unwrap()
}

/// Edge autonomy, against a current cluster's pods (each with its projected service-account
/// token volume): a node runs two API pods (one mounting a ConfigMap and a Secret, one with env
/// from a Secret), a pod that is deleted while the node is offline, and a static pod; the API
/// server goes away and the machine "reboots" (agent and containers killed, the pods' volume
/// and log directories removed); the agent starts again with the API server still unreachable
/// and runs every pod from its checkpoint, with the volume contents and env, restarting after a
/// crash; when the node reaches the API server again, the pods keep their processes, the pod
/// deleted meanwhile is stopped, a pod added meanwhile starts, and the API shows the statuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_while_the_api_server_is_away_runs_its_pods_from_the_checkpoint() {
    let test = "a_node_restarted_while_the_api_server_is_away_runs_its_pods_from_the_checkpoint";
    let Some(env) = ApiServerEnv::start_with_service_accounts(test, "mk-autonomy") else {
        return;
    };
    let node = env.node_name().to_string();
    let token = format!("mk-autonomy-{}", std::process::id());
    let tag = |name: &str| format!("{token}-{name}");
    let admin = admin_client(&env).await;
    let cms: Api<kubelet::k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(admin.clone(), "default");
    let secrets: Api<kubelet::k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(admin.clone(), "default");
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(serde_json::json!({
            "metadata": { "name": "settings" }, "data": { "conf.txt": "colour=blue" },
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    for (name, key, value) in [
        ("creds", "password", "hunter2"),
        ("env-secret", "TOKEN", "s3cret"),
    ] {
        secrets
            .create(
                &PostParams::default(),
                &serde_json::from_value(serde_json::json!({
                    "metadata": { "name": name }, "stringData": { key: value },
                }))
                .unwrap(),
            )
            .await
            .unwrap();
    }

    let proxy = Proxy::start(env.url()).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = proxy.kubeconfig(&env, dir.path());
    let manifests = dir.path().join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    std::fs::write(
        manifests.join("static.yaml"),
        serde_json::to_string(&looping_pod(
            "",
            "static-web",
            "true",
            &token,
            &tag("static"),
            serde_json::json!({}),
        ))
        .unwrap(),
    )
    .unwrap();
    let manifest_flag = manifests.to_str().unwrap().to_string();
    let flags = [
        "--pod-manifest-path",
        manifest_flag.as_str(),
        "--pod-checkpoint-offline-wait",
        "2s",
        "--node-ip",
        "127.0.0.1",
    ];
    let agent = Agent::start_in(dir.path(), &kubeconfig, &env, &token, &flags);

    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let vols = looping_pod(
        &node,
        "vols",
        "true",
        &token,
        &tag("vols"),
        serde_json::json!({
            "volumes": [
                { "name": "conf", "configMap": { "name": "settings" } },
                { "name": "creds", "secret": { "secretName": "creds" } },
            ],
            "container": { "volumeMounts": [
                { "name": "conf", "mountPath": "/etc/conf" },
                { "name": "creds", "mountPath": "/etc/creds" },
            ] },
        }),
    );
    let envy = looping_pod(
        &node,
        "envy",
        "echo TOKEN=$TOKEN",
        &token,
        &tag("envy"),
        serde_json::json!({
            "container": { "env": [{ "name": "TOKEN", "valueFrom": { "secretKeyRef": { "name": "env-secret", "key": "TOKEN" } } }] },
        }),
    );
    let doomed = looping_pod(
        &node,
        "doomed",
        "true",
        &token,
        &tag("doomed"),
        serde_json::json!({}),
    );
    let mut uids = std::collections::BTreeMap::new();
    for p in [&vols, &envy, &doomed] {
        let created = pods.create(&PostParams::default(), p).await.unwrap();
        uids.insert(
            created.metadata.name.unwrap(),
            created.metadata.uid.unwrap(),
        );
    }
    for name in ["vols", "envy", "doomed"] {
        eventually(
            &format!("{name} Running"),
            Duration::from_secs(60),
            || async {
                let p = pods.get(name).await.ok()?;
                (p.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(())
            },
        )
        .await;
    }
    for name in ["vols", "envy", "doomed", "static"] {
        eventually(
            &format!("{name}'s process"),
            Duration::from_secs(20),
            || async { pid_of(&tag(name)) },
        )
        .await;
    }
    let checkpoint = dir.path().join("root/pod-checkpoint");
    for uid in uids.values() {
        assert!(
            checkpoint.join("pods").join(uid).exists(),
            "{uid} checkpointed"
        );
    }
    // The secrets are kept private, and never in the agent's log.
    for s in ["default_creds", "default_env-secret"] {
        let meta = std::fs::metadata(checkpoint.join("secrets").join(s)).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{s}");
    }

    // The API server goes away, then the machine "reboots".
    proxy.cut();
    env.stop_apiserver();
    drop(agent_process(agent));
    common::kill_token_processes(std::slice::from_ref(&token));
    for uid in uids.values() {
        let volumes = dir.path().join(format!("root/pods/{uid}/volumes"));
        let _ = std::fs::remove_dir_all(&volumes);
    }
    let envy_logs = dir
        .path()
        .join(format!("logs/default_envy_{}", uids["envy"]));
    let _ = std::fs::remove_dir_all(&envy_logs);
    let started = std::time::Instant::now();
    let agent = Agent::start_in(dir.path(), &kubeconfig, &env, &token, &flags);
    let mut offline_pids = std::collections::BTreeMap::new();
    for name in ["vols", "envy", "doomed", "static"] {
        let pid = eventually(
            &format!("{name} running offline"),
            Duration::from_secs(30),
            || async { pid_of(&tag(name)) },
        )
        .await;
        offline_pids.insert(name, pid);
    }
    println!(
        "agent start with the API server away -> every pod running: {:?}",
        started.elapsed()
    );
    assert!(
        agent
            .log()
            .contains("running 3 pods from the pod checkpoint"),
        "{}",
        agent.log()
    );
    let volumes = dir
        .path()
        .join(format!("root/pods/{}/volumes", uids["vols"]));
    assert_eq!(
        std::fs::read_to_string(volumes.join("kubernetes.io~configmap/conf/conf.txt")).unwrap(),
        "colour=blue"
    );
    assert_eq!(
        std::fs::read_to_string(volumes.join("kubernetes.io~secret/creds/password")).unwrap(),
        "hunter2"
    );
    let projected = std::fs::read_dir(volumes.join("kubernetes.io~projected"))
        .unwrap()
        .next()
        .expect("the kube-api-access volume")
        .unwrap()
        .path();
    assert!(
        !std::fs::read_to_string(projected.join("token"))
            .unwrap()
            .is_empty()
    );
    assert!(
        std::fs::read_to_string(projected.join("ca.crt"))
            .unwrap()
            .contains("BEGIN CERTIFICATE")
    );
    eventually("envy's env in its log", Duration::from_secs(20), || async {
        let logs = std::fs::read_dir(envy_logs.join("app")).ok()?;
        logs.flatten()
            .any(|f| std::fs::read_to_string(f.path()).is_ok_and(|t| t.contains("TOKEN=s3cret")))
            .then_some(())
    })
    .await;
    assert!(!agent.log().contains("hunter2") && !agent.log().contains("s3cret"));

    // A crash while offline: restarted under the pod's restart policy.
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(offline_pids["envy"]),
        nix::sys::signal::Signal::SIGKILL,
    );
    let restarted = eventually(
        "envy restarted offline",
        Duration::from_secs(30),
        || async { pid_of(&tag("envy")).filter(|p| *p != offline_pids["envy"]) },
    )
    .await;
    offline_pids.insert("envy", restarted);

    // The API server returns, the node still cannot reach it: a pod is deleted and one added.
    env.start_apiserver();
    pods.delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    let newcomer = looping_pod(
        &node,
        "newcomer",
        "true",
        &token,
        &tag("newcomer"),
        serde_json::json!({}),
    );
    pods.create(&PostParams::default(), &newcomer)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        pid_of(&tag("newcomer")).is_none(),
        "the node cannot see it yet"
    );
    proxy.restore();

    eventually("newcomer running", Duration::from_secs(60), || async {
        pid_of(&tag("newcomer"))
    })
    .await;
    eventually(
        "doomed stopped and gone",
        Duration::from_secs(60),
        || async {
            (common::container_pids(&tag("doomed")).is_empty()
                && pods.get_opt("doomed").await.ok()?.is_none())
            .then_some(())
        },
    )
    .await;
    for name in ["vols", "envy", "static"] {
        assert_eq!(
            pid_of(&tag(name)),
            Some(offline_pids[name]),
            "{name} kept its container"
        );
    }
    // The statuses the node accumulated while offline reach the API server.
    let envy_status = eventually(
        "envy's restarts in the API",
        Duration::from_secs(30),
        || async {
            let p = pods.get("envy").await.ok()?;
            let s = p.status?;
            let c = s.container_statuses?.into_iter().next()?;
            (s.phase.as_deref() == Some("Running") && c.ready && c.restart_count >= 1).then_some(c)
        },
    )
    .await;
    assert!(envy_status.state.unwrap().running.is_some());
    let vols_status = pods.get("vols").await.unwrap().status.unwrap();
    assert_eq!(vols_status.phase.as_deref(), Some("Running"));
    assert!(
        agent.log().contains("the API server is back"),
        "{}",
        agent.log()
    );
    // Still the same processes after the reconnect settled.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for name in ["vols", "envy", "static"] {
        assert_eq!(
            pid_of(&tag(name)),
            Some(offline_pids[name]),
            "{name} kept its container"
        );
    }
    drop(agent);
}

/// Stop the agent process alone (SIGKILL), leaving its containers: a crash or a reboot's first
/// half.
fn agent_process(mut agent: Agent) -> Agent {
    let _ = agent.child.kill();
    let _ = agent.child.wait();
    // Its drop would kill the containers: hand back an agent whose token matches nothing.
    agent.token = format!("{}-stopped", agent.token);
    agent
}

/// A corrupt checkpoint, and one older than the maximum age, are reported and not used: the
/// agent waits for the API server as without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_or_too_old_checkpoint_is_reported_and_not_used() {
    let test = "a_corrupt_or_too_old_checkpoint_is_reported_and_not_used";
    let Some(env) = ApiServerEnv::start_for_node(test, "mk-stale") else {
        return;
    };
    let node = env.node_name().to_string();
    let token = format!("mk-stale-{}", std::process::id());
    let admin = admin_client(&env).await;
    let proxy = Proxy::start(env.url()).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = proxy.kubeconfig(&env, dir.path());
    let flags = ["--pod-checkpoint-offline-wait", "1s"];
    let agent = Agent::start_in(dir.path(), &kubeconfig, &env, &token, &flags);
    let pods: Api<Pod> = Api::namespaced(admin, "default");
    let created = pods
        .create(
            &PostParams::default(),
            &looping_pod(
                &node,
                "stale",
                "true",
                &token,
                &token,
                serde_json::json!({}),
            ),
        )
        .await
        .unwrap();
    let uid = created.metadata.uid.unwrap();
    eventually("stale running", Duration::from_secs(60), || async {
        pid_of(&token)
    })
    .await;
    proxy.cut();
    drop(agent_process(agent));
    common::kill_token_processes(std::slice::from_ref(&token));

    // Older than the maximum age.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut too_old = flags.to_vec();
    too_old.extend(["--pod-checkpoint-max-age", "1s"]);
    let agent = Agent::start_in(dir.path(), &kubeconfig, &env, &token, &too_old);
    eventually(
        "the too-old pod reported",
        Duration::from_secs(20),
        || async {
            agent
                .log()
                .contains("more than the maximum age")
                .then_some(())
        },
    )
    .await;
    assert!(
        agent
            .log()
            .contains("running 0 pods from the pod checkpoint"),
        "{}",
        agent.log()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(pid_of(&token).is_none(), "not started");
    drop(agent_process(agent));

    // Corrupt: one byte of the pod's file changed.
    let file = dir.path().join("root/pod-checkpoint/pods").join(&uid);
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes.len() - 3;
    bytes[at] ^= 0x01;
    std::fs::write(&file, &bytes).unwrap();
    let agent = Agent::start_in(dir.path(), &kubeconfig, &env, &token, &flags);
    eventually(
        "the corrupt checkpoint reported",
        Duration::from_secs(20),
        || async { agent.log().contains("checksum mismatch").then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        pid_of(&token).is_none(),
        "not started from a corrupt checkpoint"
    );
    // The API server is reachable again: the pod runs, the checkpoint is written anew.
    proxy.restore();
    eventually(
        "stale running from the API server",
        Duration::from_secs(60),
        || async { pid_of(&token) },
    )
    .await;
    drop(agent);
}
