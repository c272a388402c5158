//! The agent against a real kube-apiserver 1.20 (`kubelet-testenv`): node registration and
//! Lease, pods bound through the API running on the process runtime with their status in the
//! API, deletion, mirror pods, and an API server outage. The agent only has the node's
//! NodeRestriction-scoped credentials; the test's own checks use the admin kubeconfig.
//!
//! Own `main` (`harness = false`): the process runtime re-runs this executable as each
//! container's supervisor. The tests run in parallel, each with its own API server.
//! `KSDK_API_OUTAGE_SECS` sets the length of the outage (default 60 s, the figure).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use kubelet_api::ContainerRuntime;
use kubelet_api::runtime::{ContainerFilter, ContainerState, labels};
use kubelet_apiserver::{ApiServer, ApiServerConfig};
use kubelet_core::{KubeletBuilder, KubeletConfig};
use kubelet_pleg::{GenericPleg, GenericPlegConfig};
use kubelet_podconfig::FileSource;
use kubelet_process::{ProcessRuntime, ProcessRuntimeConfig, ShimCommand};
use kubelet_testenv::{ApiServerEnv, eventually};
use tokio_util::sync::CancellationToken;

type TestFn = fn() -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

fn main() -> ExitCode {
    if let Some(code) = kubelet_process::shim::maybe_run_shim() {
        return code;
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let tests: [(&str, TestFn); 2] = [
        (
            "agent_joins_the_cluster_with_node_credentials_and_runs_api_and_static_pods",
            || {
                Box::pin(
                    agent_joins_the_cluster_with_node_credentials_and_runs_api_and_static_pods(),
                )
            },
        ),
        (
            "pods_keep_running_through_an_api_server_outage_and_the_agent_catches_up",
            || Box::pin(pods_keep_running_through_an_api_server_outage_and_the_agent_catches_up()),
        ),
    ];
    let selected: Vec<_> = tests
        .into_iter()
        .filter(|(n, _)| filter.as_deref().is_none_or(|f| n.contains(f)))
        .collect();
    let handles: Vec<_> = selected
        .into_iter()
        .map(|(name, f)| {
            (
                name,
                std::thread::spawn(move || {
                    tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(2)
                        .enable_all()
                        .build()
                        .expect("tokio runtime")
                        .block_on(f())
                }),
            )
        })
        .collect();
    let mut failed = 0;
    for (name, h) in handles {
        match h.join() {
            Ok(()) => println!("test {name} ... ok"),
            Err(_) => {
                println!("test {name} ... FAILED");
                failed += 1;
            }
        }
    }
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// An agent on the process runtime joined to `env` with its node credentials.
struct Agent {
    runtime: Arc<ProcessRuntime>,
    shutdown: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
    manifests: std::path::PathBuf,
    api: ApiServer,
}

impl Agent {
    async fn start(env: &ApiServerEnv) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let manifests = dir.path().join("manifests");
        std::fs::create_dir_all(&manifests).unwrap();
        let node = env.node_name().to_string();
        let runtime = Arc::new(
            ProcessRuntime::new(
                ProcessRuntimeConfig::new(dir.path().join("runtime"))
                    .shim(ShimCommand::CurrentExe)
                    .use_cgroups(false),
            )
            .expect("process runtime"),
        );
        let dyn_runtime: Arc<dyn ContainerRuntime> = runtime.clone();
        let api = ApiServer::from_kubeconfig(
            env.node_kubeconfig(),
            node.clone(),
            ApiServerConfig::default()
                .root_dir(dir.path().join("root"))
                .node_labels(BTreeMap::from([(
                    "example.com/role".to_string(),
                    "edge".to_string(),
                )])),
        )
        .await
        .expect("client from the node kubeconfig");
        let builder = KubeletBuilder::new(node.clone()).config(KubeletConfig::with_dirs(
            dir.path().join("root"),
            dir.path().join("logs"),
        ));
        let api_handle = api.clone();
        // The container manager, with reservations: node allocatable through the API.
        let mut cm_config = kubelet_cm::CmConfig::default();
        cm_config.root_dir = dir.path().join("root");
        cm_config.cgroups_per_qos = false;
        cm_config.kube_reserved = BTreeMap::from([("cpu".to_string(), "100m".to_string())]);
        cm_config.system_reserved = BTreeMap::from([("memory".to_string(), "512Mi".to_string())]);
        cm_config.eviction_hard =
            BTreeMap::from([("memory.available".to_string(), "100Mi".to_string())]);
        let cm = kubelet_cm::ContainerManager::new(node.clone(), cm_config).expect("cm");
        let (pleg, pleg_events) =
            GenericPleg::new(dyn_runtime.clone(), GenericPlegConfig::default());
        // The API-server integration as a plugin, as an agent runs it: pod source, status
        // sink, object provider, and its loop (node registration, status, lease, mirror pods)
        // with the agent's recorder and every plugin's node conditions.
        let kubelet = builder
            .runtime(dyn_runtime.clone())
            .pleg(Arc::new(pleg), pleg_events)
            .pod_source(Arc::new(FileSource::new(&manifests, node.clone())))
            .plugin(Arc::new(api))
            .plugin(Arc::new(cm))
            .build()
            .expect("agent");
        let shutdown = CancellationToken::new();
        let tasks = vec![tokio::spawn(kubelet.run(shutdown.clone()))];
        Self {
            runtime,
            shutdown,
            tasks,
            _dir: dir,
            manifests,
            api: api_handle,
        }
    }

    /// IDs of the running containers of pod `uid`.
    async fn running(&self, uid: &str) -> Vec<String> {
        let filter = ContainerFilter {
            state: Some(ContainerState::Running),
            label_selector: BTreeMap::from([(labels::POD_UID.to_string(), uid.to_string())]),
            ..Default::default()
        };
        self.runtime
            .list_containers(&filter)
            .await
            .expect("list")
            .into_iter()
            .map(|c| c.id)
            .collect()
    }

    /// Stop the agent and every container it started.
    async fn stop(mut self) {
        self.shutdown.cancel();
        for t in std::mem::take(&mut self.tasks) {
            let _ = t.await;
        }
        remove_all(&self.runtime).await;
    }
}

/// Stop and remove every container and sandbox of `runtime`.
async fn remove_all(runtime: &ProcessRuntime) {
    for c in runtime
        .list_containers(&Default::default())
        .await
        .unwrap_or_default()
    {
        let _ = runtime.stop_container(&c.id, Duration::ZERO).await;
    }
    for sb in runtime
        .list_pod_sandboxes(&Default::default())
        .await
        .unwrap_or_default()
    {
        let _ = runtime.stop_pod_sandbox(&sb.id).await;
        let _ = runtime.remove_pod_sandbox(&sb.id).await;
    }
}

impl Drop for Agent {
    /// Also when a test fails: no container outlives the test.
    fn drop(&mut self) {
        self.shutdown.cancel();
        for t in &self.tasks {
            t.abort();
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let runtime = self.runtime.clone();
            tokio::task::block_in_place(|| handle.block_on(remove_all(&runtime)));
        }
    }
}

fn pod(name: &str, node: &str, script: &str, restart: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": "default" },
        "spec": {
            "nodeName": node,
            "hostNetwork": true,
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "app",
                "image": "busybox",
                "command": ["/bin/sh", "-c", script],
            }],
        },
    }))
    .expect("pod")
}

const LONG_RUNNING: &str = "trap 'exit 0' TERM; while true; do sleep 0.2; done";

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

async fn admin_client(env: &ApiServerEnv) -> Client {
    let kc = kube::config::Kubeconfig::read_from(env.admin_kubeconfig()).expect("admin kubeconfig");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("admin config");
    Client::try_from(cfg).expect("admin client")
}

fn write_manifest(dir: &Path, name: &str) {
    let m = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": "default" },
        "spec": {
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 2,
            "containers": [{ "name": "app", "image": "busybox", "command": ["/bin/sh", "-c", LONG_RUNNING] }],
        },
    });
    let tmp = dir.join(format!(".{name}.json"));
    std::fs::write(&tmp, m.to_string()).unwrap();
    std::fs::rename(&tmp, dir.join(format!("{name}.json"))).unwrap();
}

async fn agent_joins_the_cluster_with_node_credentials_and_runs_api_and_static_pods() {
    let test = "agent_joins_the_cluster_with_node_credentials_and_runs_api_and_static_pods";
    let Some(env) = ApiServerEnv::start_for_node(test, "ksdk-join") else {
        return;
    };
    let node = env.node_name().to_string();
    let admin = admin_client(&env).await;
    let agent = Agent::start(&env).await;
    let nodes: Api<Node> = Api::all(admin.clone());
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-node-lease");

    // The Node registers with capacity, labels and Ready=True.
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
    let st = n.status.as_ref().unwrap();
    let cap = st.capacity.as_ref().unwrap();
    assert_eq!(cap["pods"].0, "110");
    assert!(
        cap.contains_key("cpu")
            && cap.contains_key("memory")
            && cap.contains_key("ephemeral-storage")
    );
    // Allocatable: capacity − kubeReserved − systemReserved − the hard eviction threshold.
    let alloc = st.allocatable.as_ref().unwrap();
    let bytes = |q: &str| kubelet_api::quantity::parse_bytes(q).unwrap();
    let milli = |q: &str| kubelet_api::quantity::parse_milli(q).unwrap();
    assert_eq!(
        bytes(&alloc["memory"].0),
        bytes(&cap["memory"].0) - (512 << 20) - (100 << 20),
        "{alloc:?} {cap:?}"
    );
    assert_eq!(milli(&alloc["cpu"].0), milli(&cap["cpu"].0) - 100);
    assert_eq!(alloc["pods"].0, "110");
    let info = st.node_info.as_ref().unwrap();
    assert_eq!(info.kubelet_version, kubelet_apiserver::KUBELET_VERSION);
    assert!(
        info.container_runtime_version.starts_with("process://"),
        "{}",
        info.container_runtime_version
    );
    let l = n.metadata.labels.as_ref().unwrap();
    assert_eq!(l["kubernetes.io/os"], "linux");
    assert_eq!(l["example.com/role"], "edge");
    assert!(
        st.addresses
            .as_ref()
            .unwrap()
            .iter()
            .any(|a| a.type_ == "Hostname")
    );

    // The Lease exists, is owned by the Node and renews.
    let lease = eventually("lease", Duration::from_secs(20), || async {
        leases.get_opt(&node).await.ok().flatten()
    })
    .await;
    let spec = lease.spec.clone().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some(node.as_str()));
    assert_eq!(spec.lease_duration_seconds, Some(40));
    let owner = &lease.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Node", n.metadata.uid.as_deref().unwrap())
    );
    let first_renew = spec.renew_time.unwrap();

    // A pod bound through the API runs, and its status reaches the API.
    let created = pods
        .create(
            &PostParams::default(),
            &pod("web", &node, LONG_RUNNING, "Always"),
        )
        .await
        .unwrap();
    let uid = created.metadata.uid.clone().unwrap();
    let running = eventually(
        "web Running and Ready in the API",
        Duration::from_secs(30),
        || async {
            let p = pods.get("web").await.ok()?;
            let s = p.status.as_ref()?;
            let ready = s
                .conditions
                .as_ref()?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let cs = s.container_statuses.as_ref()?.first()?;
            (phase(&p) == "Running"
                && ready
                && cs.ready
                && cs.state.as_ref()?.running.is_some()
                && s.pod_ip.is_some())
            .then_some(p)
        },
    )
    .await;
    assert!(running.status.as_ref().unwrap().start_time.is_some());
    assert_eq!(agent.running(&uid).await.len(), 1);

    // RuntimeClass: a pod of a known class runs; the class's handler is what the object
    // provider reads from the API (an unknown class cannot be created through the API: its
    // admission plugin refuses; the engine's handling of one is tested with a static store).
    let classes: Api<k8s_openapi::api::node::v1::RuntimeClass> = Api::all(admin.clone());
    let rc: k8s_openapi::api::node::v1::RuntimeClass = serde_json::from_value(serde_json::json!({
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
        "metadata": {"name": "sdk-default"}, "handler": "default"
    }))
    .unwrap();
    classes.create(&PostParams::default(), &rc).await.unwrap();
    let mut p = pod("classy", &node, LONG_RUNNING, "Always");
    p.spec.as_mut().unwrap().runtime_class_name = Some("sdk-default".into());
    pods.create(&PostParams::default(), &p).await.unwrap();
    eventually("classy Running", Duration::from_secs(30), || async {
        let p = pods.get("classy").await.ok()?;
        (phase(&p) == "Running").then_some(())
    })
    .await;
    {
        use kubelet_api::AgentPlugin;
        let provider = agent.api.object_provider().unwrap();
        let got = provider
            .runtime_class("sdk-default")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got.handler, "default");
        assert!(provider.runtime_class("missing").await.unwrap().is_none());
    }
    pods.delete("classy", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();

    // A static pod gets a mirror pod owned by the Node, with the static pod's status.
    write_manifest(&agent.manifests, "static");
    let mirror_name = format!("static-{node}");
    let mirror = eventually("mirror pod Running", Duration::from_secs(30), || async {
        let p = pods.get_opt(&mirror_name).await.ok().flatten()?;
        (phase(&p) == "Running").then_some(p)
    })
    .await;
    let ann = mirror.metadata.annotations.clone().unwrap();
    let hash = ann["kubernetes.io/config.mirror"].clone();
    assert_eq!(ann.get("kubernetes.io/config.hash"), Some(&hash));
    let owner = &mirror.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.controller),
        ("Node", Some(true))
    );
    let static_running = agent.running(&hash).await;
    assert_eq!(
        static_running.len(),
        1,
        "the static pod runs under its own UID (the hash)"
    );

    // Deleting the mirror pod does not stop the static pod; the mirror comes back.
    let old_mirror_uid = mirror.metadata.uid.clone().unwrap();
    pods.delete(&mirror_name, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    eventually("mirror pod recreated", Duration::from_secs(30), || async {
        let p = pods.get_opt(&mirror_name).await.ok().flatten()?;
        (p.metadata.uid.as_deref() != Some(old_mirror_uid.as_str())
            && p.metadata.deletion_timestamp.is_none())
        .then_some(())
    })
    .await;
    assert_eq!(
        agent.running(&hash).await,
        static_running,
        "the static pod's container was not restarted"
    );

    // The lease has been renewed meanwhile (every 10 s).
    eventually("lease renewed", Duration::from_secs(25), || async {
        let l = leases.get(&node).await.ok()?;
        (l.spec?.renew_time?.0 > first_renew.0).then_some(())
    })
    .await;

    // Deleting the API pod stops its container, and the object goes away.
    pods.delete("web", &DeleteParams::default()).await.unwrap();
    eventually("web gone from the API", Duration::from_secs(40), || async {
        pods.get_opt("web")
            .await
            .ok()
            .flatten()
            .is_none()
            .then_some(())
    })
    .await;
    assert!(
        agent.running(&uid).await.is_empty(),
        "web's container stopped before the object went away"
    );

    // Removing the manifest stops the static pod and deletes its mirror pod.
    std::fs::remove_file(agent.manifests.join("static.json")).unwrap();
    eventually("mirror pod deleted", Duration::from_secs(40), || async {
        pods.get_opt(&mirror_name)
            .await
            .ok()
            .flatten()
            .is_none()
            .then_some(())
    })
    .await;

    // Events reached the API (Started, Killing ...), from the kubelet on this node.
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(admin.clone(), "default");
    let evs = events.list(&Default::default()).await.unwrap().items;
    assert!(
        evs.iter().any(|e| e.reason.as_deref() == Some("Started")
            && e.source.as_ref().and_then(|s| s.host.as_deref()) == Some(node.as_str())),
        "no Started event: {evs:?}"
    );

    // The same event twice is one object with count 2.
    let sink = agent.api.status_sink();
    let repeated = kubelet_api::Event {
        involved: kubelet_api::InvolvedObject::node(&node),
        type_: kubelet_api::EventType::Warning,
        reason: "TestRepeated".into(),
        message: "the same event twice".into(),
        timestamp: jiff::Timestamp::now(),
        annotations: BTreeMap::new(),
    };
    for _ in 0..2 {
        kubelet_api::StatusSink::record_event(&*sink, &repeated)
            .await
            .expect("event posted");
    }
    let evs = events.list(&Default::default()).await.unwrap().items;
    let counts: Vec<_> = evs
        .iter()
        .filter(|e| e.reason.as_deref() == Some("TestRepeated"))
        .map(|e| e.count)
        .collect();
    assert_eq!(counts, [Some(2)], "one aggregated event");

    agent.stop().await;

    // Everything the agent did, it did as system:node:<node>, and nothing was forbidden.
    let user = format!("system:node:{node}");
    let audit = env.audit_events();
    let mine: Vec<_> = audit.iter().filter(|e| e.user == user).collect();
    assert!(
        mine.iter()
            .any(|e| e.resource == "nodes" && e.verb == "create")
    );
    assert!(
        mine.iter()
            .any(|e| e.resource == "pods" && e.subresource == "status" && e.verb == "patch")
    );
    assert!(
        mine.iter()
            .any(|e| e.resource == "pods" && e.verb == "create"),
        "mirror pod creation"
    );
    // Figures (not assertions): the agent's requests, and those about the one API pod's life.
    let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
    for e in &mine {
        let sub = if e.subresource.is_empty() {
            String::new()
        } else {
            format!("/{}", e.subresource)
        };
        *by_kind
            .entry(format!("{} {}{}", e.verb, e.resource, sub))
            .or_default() += 1;
    }
    let web: Vec<_> = mine
        .iter()
        .filter(|e| e.request_uri.contains("/pods/web"))
        .map(|e| format!("{} {}", e.verb, e.subresource))
        .collect();
    eprintln!("requests of {user}: {} in all: {by_kind:?}", mine.len());
    eprintln!(
        "requests about pod web (create to gone): {} {web:?}",
        web.len()
    );
    let forbidden: Vec<_> = mine.iter().filter(|e| e.code == 403).collect();
    assert!(forbidden.is_empty(), "forbidden requests: {forbidden:?}");
    assert!(
        !audit
            .iter()
            .any(|e| e.user == "admin" && e.resource == "leases" && e.verb != "get"),
        "only the node writes its lease"
    );
}

fn outage() -> Duration {
    Duration::from_secs(
        std::env::var("KSDK_API_OUTAGE_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(60),
    )
}

async fn pods_keep_running_through_an_api_server_outage_and_the_agent_catches_up() {
    let test = "pods_keep_running_through_an_api_server_outage_and_the_agent_catches_up";
    let Some(env) = ApiServerEnv::start_for_node(test, "ksdk-outage") else {
        return;
    };
    let node = env.node_name().to_string();
    let admin = admin_client(&env).await;
    let agent = Agent::start(&env).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-node-lease");
    let outage = outage();

    // "steady" runs throughout; "finisher" completes in the middle of the outage.
    let steady = pods
        .create(
            &PostParams::default(),
            &pod("steady", &node, LONG_RUNNING, "Always"),
        )
        .await
        .unwrap();
    let finish_after = (outage.as_secs() / 2).max(1) + 5;
    let finisher = pods
        .create(
            &PostParams::default(),
            &pod(
                "finisher",
                &node,
                &format!("sleep {finish_after}; exit 0"),
                "Never",
            ),
        )
        .await
        .unwrap();
    for name in ["steady", "finisher"] {
        eventually("pods Running", Duration::from_secs(30), || async {
            (phase(&pods.get(name).await.ok()?) == "Running").then_some(())
        })
        .await;
    }
    let steady_uid = steady.metadata.uid.clone().unwrap();
    let finisher_uid = finisher.metadata.uid.clone().unwrap();
    let steady_containers = agent.running(&steady_uid).await;
    assert_eq!(steady_containers.len(), 1);

    env.stop_apiserver();
    tokio::time::sleep(outage).await;
    assert_eq!(
        agent.running(&steady_uid).await,
        steady_containers,
        "steady kept its container during the outage"
    );
    assert!(
        agent.running(&finisher_uid).await.is_empty(),
        "finisher completed during the outage"
    );
    env.start_apiserver();
    let back = jiff::Timestamp::now();

    // The agent catches up: the status that changed during the outage reaches the API ...
    let done = eventually(
        "finisher Succeeded in the API",
        Duration::from_secs(60),
        || async {
            let p = pods.get("finisher").await.ok()?;
            (phase(&p) == "Succeeded").then_some(p)
        },
    )
    .await;
    let cs = &done
        .status
        .as_ref()
        .unwrap()
        .container_statuses
        .as_ref()
        .unwrap()[0];
    assert_eq!(
        cs.state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .map(|t| t.exit_code),
        Some(0)
    );
    // ... the lease renews again ...
    eventually(
        "lease renewed after the outage",
        Duration::from_secs(30),
        || async {
            let l = leases.get(&node).await.ok()?;
            (l.spec?.renew_time?.0 > back).then_some(())
        },
    )
    .await;
    // ... and new pods run.
    let after = pods
        .create(
            &PostParams::default(),
            &pod("after", &node, LONG_RUNNING, "Always"),
        )
        .await
        .unwrap();
    // The pod watch retries with the kubelet's reflector backoff (0.8 s doubling to 30 s), so it
    // may take up to 30 s after the API server returns to resume.
    eventually("after Running", Duration::from_secs(60), || async {
        (phase(&pods.get("after").await.ok()?) == "Running").then_some(())
    })
    .await;

    // Nothing lost or duplicated: one container each, steady never restarted, three pods.
    let s = pods.get("steady").await.unwrap();
    assert_eq!(phase(&s), "Running");
    assert_eq!(
        s.status.unwrap().container_statuses.unwrap()[0].restart_count,
        0
    );
    assert_eq!(agent.running(&steady_uid).await, steady_containers);
    assert_eq!(
        agent
            .running(after.metadata.uid.as_deref().unwrap())
            .await
            .len(),
        1
    );
    let listed = pods.list(&Default::default()).await.unwrap().items;
    assert_eq!(
        listed.len(),
        3,
        "{:?}",
        listed
            .iter()
            .map(|p| p.metadata.name.clone())
            .collect::<Vec<_>>()
    );
    let sandboxes = agent
        .runtime
        .list_pod_sandboxes(&Default::default())
        .await
        .unwrap();
    let ready_sandboxes = sandboxes
        .iter()
        .filter(|s| s.labels.get(labels::POD_UID) == Some(&steady_uid))
        .count();
    assert_eq!(ready_sandboxes, 1, "one sandbox for steady");
    agent.stop().await;
}
