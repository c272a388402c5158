//! `examples/cluster_agent.rs` against a real kube-apiserver 1.20 (`kubelet-testenv`): the
//! example binary, with the node's credentials, registers its Node with eviction's pressure
//! conditions before Ready, runs a pod bound to it whose failing liveness probe restarts its
//! container, serves every subsystem's metrics on the read-only port, and stops the pod when it
//! is deleted. Skips without the API server environment (fails under
//! `KUBELET_SDK_REQUIRE_ROOT=1`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kubelet::apiserver::kube::api::{DeleteParams, PostParams};
use kubelet::apiserver::kube::{self, Api, Client};
use kubelet::k8s_openapi::api::core::v1::{Node, Pod};
use kubelet_testenv::{ApiServerEnv, eventually, free_port};

/// The example binary: `cargo test` builds the examples next to the test binaries' directory.
fn example_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).unwrap();
    let bin = profile_dir.join("examples").join("cluster_agent");
    assert!(
        bin.exists(),
        "{} is missing: run the tests with `cargo test --workspace` (or `-p kubelet --all-features`), which builds the examples",
        bin.display()
    );
    bin
}

/// The agent process; killed with the containers carrying `token` on drop, its log printed
/// when the test fails.
struct Agent {
    child: Child,
    token: String,
    dir: tempfile::TempDir,
}

impl Drop for Agent {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log =
                std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default();
            println!("--- cluster_agent log ---\n{log}--- end of log ---");
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = Command::new("pkill")
            .args(["-KILL", "-f", &self.token])
            .status();
    }
}

fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_agent_joins_the_cluster_with_probes_eviction_and_metrics() {
    let test = "cluster_agent_joins_the_cluster_with_probes_eviction_and_metrics";
    let Some(env) = ApiServerEnv::start_for_node(test, "cluster-agent") else {
        return;
    };
    let node = env.node_name().to_string();
    let dir = tempfile::tempdir().unwrap();
    let token = format!("cluster-agent-{}", std::process::id());
    let port = free_port();
    let log = std::fs::File::create(dir.path().join("agent.log")).unwrap();
    // The kubelet's configuration as a file: the read-only port for /metrics, no healthz port
    // (tests run side by side), and hard eviction thresholds the test machine's disk, which may
    // be fuller than the kubelet's defaults allow, does not meet.
    let configuration = dir.path().join("config.json");
    let json = serde_json::json!({
        "kind": "KubeletConfiguration",
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "readOnlyPort": port,
        "healthzPort": 0,
        "port": 0,
        "podLogsDir": dir.path().join("logs"),
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
    });
    std::fs::write(&configuration, json.to_string()).unwrap();
    let child = Command::new(example_binary())
        .arg(env.node_kubeconfig())
        .arg(&node)
        .arg(dir.path().join("root"))
        .arg(&configuration)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start cluster_agent");
    let _agent = Agent {
        child,
        token: token.clone(),
        dir,
    };

    let kc = kube::config::Kubeconfig::read_from(env.admin_kubeconfig()).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let admin = Client::try_from(cfg).unwrap();
    let nodes: Api<Node> = Api::all(admin.clone());
    let pods: Api<Pod> = Api::namespaced(admin, "default");

    let n = eventually("node Ready", Duration::from_secs(60), || async {
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
        "the eviction plugin's conditions reach the Node through the plugin seam"
    );

    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": "probed" },
        "spec": {
            "nodeName": node, "hostNetwork": true, "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "app", "image": "busybox",
                "command": ["/bin/sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done", &token],
                "livenessProbe": {
                    "exec": { "command": ["/bin/false"] },
                    "periodSeconds": 1, "failureThreshold": 1,
                },
            }],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    eventually(
        "the liveness probe restarts the container",
        Duration::from_secs(60),
        || async {
            let p = pods.get("probed").await.ok()?;
            let restarts = p.status?.container_statuses?.first()?.restart_count;
            (restarts >= 1).then_some(())
        },
    )
    .await;

    let metrics = http_get(port, "/metrics").expect("the read-only port answers");
    for family in [
        "prober_probe_total",
        "kubelet_runtime_operations_total{operation_type=\"run_podsandbox\"}",
        "kubelet_pleg_relist_duration_seconds",
        "kubelet_pod_start_duration_seconds_count 1",
        "kubelet_pod_worker_duration_seconds_count{operation_type=\"create\"} 1",
        "kubelet_evictions",
    ] {
        assert!(
            metrics.contains(family),
            "no {family} in /metrics:\n{metrics}"
        );
    }
    let listed = http_get(port, "/pods").unwrap();
    assert!(listed.contains("\"probed\""), "{listed}");

    pods.delete("probed", &DeleteParams::default())
        .await
        .unwrap();
    eventually("probed gone", Duration::from_secs(30), || async {
        pods.get_opt("probed")
            .await
            .ok()
            .flatten()
            .is_none()
            .then_some(())
    })
    .await;
}
