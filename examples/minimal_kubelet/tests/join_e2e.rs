//! Joining like a kubeadm node, against a real kube-apiserver and kube-controller-manager 1.20
//! (`kubelet-testenv`'s bootstrap environment: bootstrap tokens, kubeadm's bindings, the CSR
//! approver and signer issuing certificates valid for 90 seconds (6m30s minus the signer's 5-minute back-dating)): `minimal_kubelet` with only a bootstrap
//! kubeconfig gets its client certificate, writes its kubeconfig, registers Ready with its
//! `--register-with-taints`, runs an ordinary pod (projected service-account token) that calls
//! the API server with its token, rotates its certificate at least twice while the Lease, the
//! pod's status and a `kubectl logs -f` of the pod keep going, registers again when its Node is deleted, after a
//! restart reuses the certificate it has, and bootstraps a new one when that file is truncated.
//! Skips without the environment (fails under `KUBELET_SDK_REQUIRE_ROOT=1`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsStr;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kubelet::apiserver::kube::api::{ListParams, PostParams};
use kubelet::apiserver::kube::{self, Api, Client};
use kubelet::k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kubelet::k8s_openapi::api::coordination::v1::Lease;
use kubelet::k8s_openapi::api::core::v1::{Node, Pod};
use kubelet::k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kubelet_testenv::ApiServerEnv;

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_minimal_kubelet");

struct Agent {
    child: Child,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start the agent on `dir` (root, logs, pki and kubeconfig under it) with only the bootstrap
/// The OS string of `s`, for [`spawn`]'s arguments.
fn o(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// Start the agent with `args` on `dir` (`root`, `logs` and `pki` under it; its stderr appended
/// to `dir/<log>`), healthz off, with the tests' low eviction thresholds.
fn spawn(dir: &Path, log: &str, args: &[&OsStr]) -> Agent {
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(log))
        .unwrap();
    let child = Command::new(BIN)
        .arg("--root-dir")
        .arg(dir.join("root"))
        .arg("--pod-log-dir")
        .arg(dir.join("logs"))
        .arg("--cert-dir")
        .arg(dir.join("pki"))
        .args(["--healthz-port", "0"])
        .args(["--eviction-hard", common::LOW_EVICTION_HARD])
        .args(args)
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("start minimal_kubelet");
    Agent { child }
}

/// Start the agent on `dir` with only the bootstrap kubeconfig as credentials, the kubelet API
/// on `port`.
fn start(env: &ApiServerEnv, dir: &Path, log: &str, port: u16) -> Agent {
    spawn(
        dir,
        log,
        &[
            o("--kubeconfig"),
            dir.join("kubelet.conf").as_os_str(),
            o("--bootstrap-kubeconfig"),
            env.bootstrap_kubeconfig()
                .expect("a bootstrap environment")
                .as_os_str(),
            o("--rotate-certificates"),
            o("--register-with-taints"),
            o("example.com/edge=true:NoSchedule"),
            o("--hostname-override"),
            o(env.node_name()),
            o("--node-ip"),
            o("127.0.0.1"),
            o("--port"),
            o(&port.to_string()),
            o("--address"),
            o("127.0.0.1"),
            o("--client-ca-file"),
            env.ca_file().as_os_str(),
            o("--node-status-update-frequency"),
            o("2s"),
        ],
    )
}

/// `kubectl` with the environment's admin credentials; its standard output.
fn kubectl_out(kubectl: &Path, env: &ApiServerEnv, args: &[&str]) -> String {
    let out = Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(env.admin_kubeconfig())
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn admin_client(env: &ApiServerEnv) -> Client {
    let kc = kube::config::Kubeconfig::read_from(env.admin_kubeconfig()).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    Client::try_from(cfg).unwrap()
}

async fn eventually<T, F, Fut>(what: &str, timeout: Duration, log: &Path, mut f: F) -> T
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
            "timed out after {timeout:?} waiting for {what}; agent log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The dated client pairs in the certificate directory.
fn stored_pairs(pki: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(pki)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    let n = p.file_name().unwrap().to_string_lossy().into_owned();
                    n.starts_with("kubelet-client-2") && n.ends_with(".pem")
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_only_a_bootstrap_token_joins_rotates_its_certificate_and_runs_pods() {
    let test = "a_node_with_only_a_bootstrap_token_joins_rotates_its_certificate_and_runs_pods";
    let Some(env) = ApiServerEnv::start_with_bootstrap(test, "mk-join", "6m30s") else {
        return;
    };
    let node = env.node_name().to_string();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let log = dir.join("agent.log");
    let pki = dir.join("pki");
    let token = format!("mk-join-{}", std::process::id());
    let port = common::free_port();
    let agent = start(&env, dir, "agent.log", port);

    let admin = admin_client(&env).await;
    let nodes: Api<Node> = Api::all(admin.clone());
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-node-lease");
    let csrs: Api<CertificateSigningRequest> = Api::all(admin.clone());

    // Bootstrap: a CSR by the bootstrap token's user, approved and signed; the pair and the
    // kubeconfig written; the node registered Ready with its taint.
    let n = eventually("node Ready", Duration::from_secs(60), &log, || async {
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
    let taints = n.spec.unwrap().taints.unwrap();
    assert!(
        taints
            .iter()
            .any(|t| t.key == "example.com/edge" && t.effect == "NoSchedule"),
        "{taints:?}"
    );
    let first = csrs.list(&ListParams::default()).await.unwrap().items;
    assert!(
        first.iter().any(|c| c
            .spec
            .username
            .as_deref()
            .is_some_and(|u| u.starts_with("system:bootstrap:"))
            && c.spec.signer_name == "kubernetes.io/kube-apiserver-client-kubelet"),
        "no bootstrap CSR: {first:?}"
    );
    let kubeconfig = std::fs::read_to_string(dir.join("kubelet.conf")).unwrap();
    assert!(
        kubeconfig.contains("kubelet-client-current.pem"),
        "{kubeconfig}"
    );
    assert!(std::fs::read_link(pki.join("kubelet-client-current.pem")).is_ok());

    // An ordinary pod whose container calls the API server with its service-account token
    // (the process runtime's containers see the pod's volume at its host path).
    let role: Role = serde_json::from_value(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": { "name": "pod-reader", "namespace": "default" },
        "rules": [{ "apiGroups": [""], "resources": ["pods"], "verbs": ["get"] }],
    }))
    .unwrap();
    Api::<Role>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let rb: RoleBinding = serde_json::from_value(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": { "name": "default-pod-reader", "namespace": "default" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader" },
        "subjects": [{ "kind": "ServiceAccount", "name": "default", "namespace": "default" }],
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &rb)
        .await
        .unwrap();
    let script = format!(
        "trap 'exit 0' TERM; while true; do d=$(echo {root}/pods/$POD_UID/volumes/kubernetes.io~projected/kube-api-access-*); \
         echo code=$(curl -s -o /dev/null -w '%{{http_code}}' --cacert $d/ca.crt -H \"Authorization: Bearer $(cat $d/token)\" {url}/api/v1/namespaces/default/pods/caller); sleep 1; done",
        root = dir.join("root").display(),
        url = env.url(),
    );
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": "caller" },
        "spec": {
            "nodeName": node, "terminationGracePeriodSeconds": 3,
            "containers": [{
                "name": "app", "image": "busybox",
                "command": ["/bin/sh", "-c", script, &token],
                "env": [{ "name": "POD_UID", "valueFrom": { "fieldRef": { "fieldPath": "metadata.uid" } } }],
            }],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let logs = dir.join("logs");
    let pod_log = || {
        let mut text = String::new();
        for e in std::fs::read_dir(&logs).into_iter().flatten().flatten() {
            for f in walk(&e.path()) {
                text.push_str(&std::fs::read_to_string(f).unwrap_or_default());
            }
        }
        text
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !pod_log().contains("code=200") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the pod's call did not answer 200; its log:\n{}",
            pod_log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // `kubectl logs -f` through the API server and the node's kubelet API, open across the
    // rotations below.
    let kubectl = kubelet_testenv::debian_kubectl(test).expect("kubectl");
    let kc = |args: &[&str]| kubectl_out(&kubectl, &env, args);
    kc(&[
        "create",
        "clusterrolebinding",
        "apiserver-kubelet-api",
        "--clusterrole=system:kubelet-api-admin",
        "--user=kube-apiserver-kubelet-client",
    ]);
    let follow_log = dir.join("follow.log");
    let mut follow = Command::new(&kubectl)
        .arg("--kubeconfig")
        .arg(env.admin_kubeconfig())
        .args(["logs", "-f", "caller"])
        .stdout(std::fs::File::create(&follow_log).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let followed = || {
        std::fs::read_to_string(&follow_log)
            .unwrap_or_default()
            .lines()
            .count()
    };
    eventually(
        "kubectl logs -f shows the pod's lines",
        Duration::from_secs(30),
        &log,
        || async { (followed() > 0).then_some(()) },
    )
    .await;

    // Rotation: two more pairs (the certificates are renewed at 70–90 % of a 6m30s lifetime that
    // starts 5 minutes back-dated), each with a CSR by the node itself; the Lease, the pod
    // status and the followed log keep going through them.
    let pairs_at_follow = stored_pairs(&pki).len();
    eventually("two rotations", Duration::from_secs(150), &log, || async {
        (stored_pairs(&pki).len() >= (pairs_at_follow + 2).max(3)).then_some(())
    })
    .await;
    let lines = followed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        follow.try_wait().unwrap().is_none() && followed() > lines,
        "kubectl logs -f goes on across the rotations"
    );
    let _ = follow.kill();
    let _ = follow.wait();
    let by_node = csrs
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|c| c.spec.username.as_deref() == Some(&format!("system:node:{node}")))
        .count();
    assert!(by_node >= 2, "renewals are requested by the node itself");
    let renew = |l: Lease| l.spec.and_then(|s| s.renew_time).map(|t| t.0);
    let before = renew(leases.get(&node).await.unwrap());
    eventually(
        "the Lease renewed after the rotations",
        Duration::from_secs(30),
        &log,
        || async {
            let now = renew(leases.get(&node).await.ok()?);
            (now > before).then_some(())
        },
    )
    .await;
    let agent_log = std::fs::read_to_string(&log).unwrap();
    assert!(
        agent_log.contains("certificate rotation detected"),
        "{agent_log}"
    );
    let uid = pods.get("caller").await.unwrap().metadata.uid.unwrap();
    let pid_of = || common::container_pids(&token);
    let pids = pid_of();
    assert!(!pids.is_empty());

    // The Node deleted while the agent runs: registered again within 20 s with its taint, the
    // pod untouched.
    let old_uid = nodes.get(&node).await.unwrap().metadata.uid.unwrap();
    nodes
        .delete(&node, &kube::api::DeleteParams::default())
        .await
        .unwrap();
    let again = eventually(
        "the node registered again",
        Duration::from_secs(20),
        &log,
        || async {
            let n = nodes.get_opt(&node).await.ok().flatten()?;
            (n.metadata.uid.as_deref() != Some(old_uid.as_str())).then_some(n)
        },
    )
    .await;
    assert!(
        again
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .iter()
            .any(|t| t.key == "example.com/edge"),
        "the taint is registered again"
    );
    eventually(
        "the new Node Ready",
        Duration::from_secs(20),
        &log,
        || async {
            let n = nodes.get_opt(&node).await.ok().flatten()?;
            n.status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
                .then_some(())
        },
    )
    .await;
    assert_eq!(pid_of(), pids, "the container was not restarted");

    // Restart: the stored certificate is reused (no bootstrap), the pod keeps its process.
    drop(agent);
    let _agent = start(&env, dir, "agent2.log", port);
    let log2 = dir.join("agent2.log");
    eventually(
        "the restarted agent's node status",
        Duration::from_secs(60),
        &log2,
        || async {
            std::fs::read_to_string(&log2)
                .ok()?
                .contains("no bootstrap necessary")
                .then_some(())
        },
    )
    .await;
    eventually(
        "the pod Running after the restart",
        Duration::from_secs(60),
        &log2,
        || async {
            let p = pods.get("caller").await.ok()?;
            (p.metadata.uid.as_deref() == Some(uid.as_str())
                && p.status?.phase.as_deref() == Some("Running"))
            .then_some(())
        },
    )
    .await;
    assert_eq!(pid_of(), pids, "the container was not restarted");

    // A truncated certificate file: the agent bootstraps a new one at its next start.
    drop(_agent);
    let current = std::fs::canonicalize(pki.join("kubelet-client-current.pem")).unwrap();
    let pem = std::fs::read(&current).unwrap();
    std::fs::write(&current, &pem[..pem.len() / 2]).unwrap();
    let csrs_before = csrs.list(&ListParams::default()).await.unwrap().items.len();
    let _agent = start(&env, dir, "agent3.log", port);
    let log3 = dir.join("agent3.log");
    eventually(
        "a new bootstrap",
        Duration::from_secs(60),
        &log3,
        || async {
            let text = std::fs::read_to_string(&log3).ok()?;
            (text.contains("no usable client certificate: bootstrapping one")
                && text.contains("wrote the kubeconfig of the bootstrapped client certificate"))
            .then_some(())
        },
    )
    .await;
    assert!(csrs.list(&ListParams::default()).await.unwrap().items.len() > csrs_before);
    eventually(
        "the node Ready again",
        Duration::from_secs(30),
        &log3,
        || async {
            let n = nodes.get_opt(&node).await.ok().flatten()?;
            n.status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
                .then_some(())
        },
    )
    .await;
    assert_eq!(pid_of(), pids, "the container was not restarted");
    common::kill_token_processes(std::slice::from_ref(&token));
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// A bootstrap token the API server rejects: the agent logs why and retries with backoff (no
/// busy loop), writes no kubeconfig, and never registers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_bootstrap_token_is_retried_with_backoff_and_logged() {
    let test = "a_rejected_bootstrap_token_is_retried_with_backoff_and_logged";
    let Some(env) = ApiServerEnv::start_with_bootstrap(test, "mk-badtoken", "1h") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let bad = dir.join("bad-bootstrap.conf");
    let text = std::fs::read_to_string(env.bootstrap_kubeconfig().unwrap()).unwrap();
    let token_line = text
        .lines()
        .find(|l| l.trim_start().starts_with("token:"))
        .unwrap();
    std::fs::write(
        &bad,
        text.replace(token_line, "    token: abcdef.0123456789abcdef"),
    )
    .unwrap();
    let log = dir.join("agent.log");
    let _agent = spawn(
        dir,
        "agent.log",
        &[
            o("--kubeconfig"),
            dir.join("kubelet.conf").as_os_str(),
            o("--bootstrap-kubeconfig"),
            bad.as_os_str(),
            o("--port"),
            o("0"),
            o("--node-name"),
            o(env.node_name()),
        ],
    );
    tokio::time::sleep(Duration::from_secs(12)).await;
    let text = std::fs::read_to_string(&log).unwrap();
    let failures = text
        .matches("failed to get a client certificate with the bootstrap credentials")
        .count();
    // 2 s, 4 s, 8 s apart: three or four attempts in 12 s, not hundreds.
    assert!((2..=5).contains(&failures), "{failures} attempts:\n{text}");
    assert!(
        text.contains("Unauthorized") || text.contains("401"),
        "{text}"
    );
    assert!(!dir.join("kubelet.conf").exists());
    let nodes: Api<Node> = Api::all(admin_client(&env).await);
    assert!(nodes.get_opt(env.node_name()).await.unwrap().is_none());
}

/// Graceful node shutdown on a cluster node: on SIGTERM the Node turns NotReady saying it is
/// shutting down, the ordinary pod and then the `system-node-critical` one end `Failed` with
/// reason `Terminated` and the `DisruptionTarget` condition, and the agent exits within the
/// configured period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_on_a_cluster_node_reports_the_shutdown_and_terminates_pods_by_priority() {
    let test = "sigterm_on_a_cluster_node_reports_the_shutdown_and_terminates_pods_by_priority";
    let Some(env) = ApiServerEnv::start_for_node(test, "mk-shutdown") else {
        return;
    };
    let node = env.node_name().to_string();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let log = dir.join("agent.log");
    std::fs::write(
        dir.join("config.yaml"),
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nshutdownGracePeriod: 8s\nshutdownGracePeriodCriticalPods: 4s\nnodeStatusUpdateFrequency: 1s\n",
    )
    .unwrap();
    let token = format!("mk-shutdown-{}", std::process::id());
    let mut agent = spawn(
        dir,
        "agent.log",
        &[
            o("--config"),
            dir.join("config.yaml").as_os_str(),
            o("--kubeconfig"),
            env.node_kubeconfig().as_os_str(),
            o("--node-name"),
            o(&node),
            o("--port"),
            o("0"),
        ],
    );
    let admin = admin_client(&env).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let nodes: Api<Node> = Api::all(admin.clone());
    for (name, class) in [
        ("ordinary", None),
        ("critical", Some("system-node-critical")),
    ] {
        let mut spec = serde_json::json!({
            "nodeName": node, "terminationGracePeriodSeconds": 30,
            "containers": [{
                "name": "app", "image": "busybox",
                "command": ["/bin/sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.1; done", &token],
            }],
        });
        if let Some(class) = class {
            spec["priorityClassName"] = class.into();
        }
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": { "name": name }, "spec": spec,
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    for name in ["ordinary", "critical"] {
        eventually(
            &format!("{name} Running"),
            Duration::from_secs(60),
            &log,
            || async {
                let p = pods.get(name).await.ok()?;
                (p.status?.phase.as_deref() == Some("Running")).then_some(())
            },
        )
        .await;
    }
    let started = std::time::Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(agent.child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let not_ready = eventually(
        "the node NotReady for the shutdown",
        Duration::from_secs(10),
        &log,
        || async {
            let n = nodes.get(&node).await.ok()?;
            let ready = n
                .status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "Ready")?;
            (ready.status == "False").then_some(ready)
        },
    )
    .await;
    assert!(
        not_ready
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("node is shutting down"),
        "{not_ready:?}"
    );
    for name in ["ordinary", "critical"] {
        let p = eventually(
            &format!("{name} Failed"),
            Duration::from_secs(15),
            &log,
            || async {
                let p = pods.get(name).await.ok()?;
                (p.status.as_ref()?.phase.as_deref() == Some("Failed")).then_some(p)
            },
        )
        .await;
        let status = p.status.unwrap();
        assert_eq!(status.reason.as_deref(), Some("Terminated"), "{name}");
        assert_eq!(
            status.message.as_deref(),
            Some("Pod was terminated in response to imminent node shutdown."),
            "{name}"
        );
        assert!(
            status
                .conditions
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "DisruptionTarget"
                    && c.reason.as_deref() == Some("TerminationByKubelet")),
            "{name}"
        );
    }
    let exited = loop {
        if let Some(s) = agent.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the agent did not exit"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(exited.success());
    assert!(
        started.elapsed() < Duration::from_secs(12),
        "within the 8 s period and a margin"
    );
    assert!(
        common::container_pids(&token).is_empty(),
        "no container left"
    );
}

/// `serverTLSBootstrap`: the kubelet API first serves a self-signed placeholder, asks the
/// cluster for a serving certificate (signer `kubernetes.io/kubelet-serving`, the node's IP and
/// hostname as SANs) which an administrator approves, then serves the signed one, and rotates it
/// (approved again) while a followed log stream opened before the rotation goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_tls_bootstrap_serves_the_cluster_signed_certificate_and_rotates_it() {
    let test = "server_tls_bootstrap_serves_the_cluster_signed_certificate_and_rotates_it";
    let Some(env) = ApiServerEnv::start_with_bootstrap(test, "mk-serving", "6m30s") else {
        return;
    };
    let Some(kubectl) = kubelet_testenv::debian_kubectl(test) else {
        return;
    };
    let node = env.node_name().to_string();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let log = dir.join("agent.log");
    let port = common::free_port();
    std::fs::write(
        dir.join("config.yaml"),
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nserverTLSBootstrap: true\nauthentication:\n  x509:\n    clientCAFile: {}\n",
            env.ca_file().display()
        ),
    )
    .unwrap();
    let token = format!("mk-serving-{}", std::process::id());
    let port_arg = port.to_string();
    let _agent = spawn(
        dir,
        "agent.log",
        &[
            o("--config"),
            dir.join("config.yaml").as_os_str(),
            o("--kubeconfig"),
            env.node_kubeconfig().as_os_str(),
            o("--node-name"),
            o(&node),
            o("--node-ip"),
            o("127.0.0.1"),
            o("--address"),
            o("127.0.0.1"),
            o("--port"),
            o(&port_arg),
        ],
    );
    // The certificate the server presents: serial, issuer, subject and SANs, from openssl.
    let presented = || {
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "echo | openssl s_client -connect 127.0.0.1:{port} 2>/dev/null | openssl x509 -noout -serial -issuer -subject -ext subjectAltName 2>/dev/null"
            ))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let kc = |args: &[&str]| kubectl_out(&kubectl, &env, args);
    // The placeholder first, and a pending kubelet-serving CSR by the node.
    let pending = eventually("a pending serving CSR", Duration::from_secs(60), &log, || async {
        let out = kc(&["get", "csr", "-o", "jsonpath={range .items[*]}{.metadata.name} {.spec.signerName} {.spec.username} {.status.conditions[*].type}{\"\\n\"}{end}"]);
        out.lines()
            .find(|l| l.contains("kubernetes.io/kubelet-serving") && l.split(' ').nth(3).is_some_and(str::is_empty))
            .map(|l| l.split(' ').next().unwrap().to_string())
    })
    .await;
    let placeholder = presented();
    assert!(
        placeholder.contains(&format!("system:node:{node}")),
        "{placeholder}"
    );
    assert!(
        !placeholder.contains("kubelet-sdk-test-ca"),
        "a placeholder before approval: {placeholder}"
    );
    // An administrator approves; the server then presents the cluster-signed certificate.
    let approve_all = || {
        let out = kc(&[
            "get",
            "csr",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.spec.signerName} {.status.conditions[*].type}{\"\\n\"}{end}",
        ]);
        for l in out.lines() {
            let f: Vec<&str> = l.split(' ').collect();
            if f.len() >= 2
                && f[1] == "kubernetes.io/kubelet-serving"
                && f.get(2).is_none_or(|c| c.is_empty())
            {
                kc(&["certificate", "approve", f[0]]);
            }
        }
    };
    kc(&["certificate", "approve", &pending]);
    let signed = eventually(
        "the signed serving certificate",
        Duration::from_secs(30),
        &log,
        || async {
            let p = presented();
            p.contains("kubelet-sdk-test-ca").then_some(p)
        },
    )
    .await;
    assert!(signed.contains("IP Address:127.0.0.1"), "{signed}");

    // A followed log stream across a rotation of the serving certificate.
    let api: Api<Pod> = Api::namespaced(admin_client(&env).await, "default");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": { "name": "ticker" },
        "spec": { "nodeName": node, "terminationGracePeriodSeconds": 1, "containers": [{
            "name": "app", "image": "busybox",
            "command": ["/bin/sh", "-c", "trap 'exit 0' TERM; i=0; while true; do i=$((i+1)); echo tick-$i; sleep 0.5; done", &token],
        }]},
    }))
    .unwrap();
    api.create(&PostParams::default(), &pod).await.unwrap();
    eventually("ticker Running", Duration::from_secs(30), &log, || async {
        let p = api.get("ticker").await.ok()?;
        (p.status?.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
    let (cert, key) = env.admin_cert_and_key();
    let follow_log = dir.join("follow.log");
    let mut follow = Command::new("curl")
        .args(["-sk", "--no-buffer", "--cert"])
        .arg(&cert)
        .arg("--key")
        .arg(&key)
        .arg(format!(
            "https://127.0.0.1:{port}/containerLogs/default/ticker/app?follow=true"
        ))
        .stdout(std::fs::File::create(&follow_log).unwrap())
        .spawn()
        .unwrap();
    let before = signed.clone();
    let rotated = eventually(
        "a rotated serving certificate",
        Duration::from_secs(150),
        &log,
        || async {
            approve_all();
            let p = presented();
            (p.contains("kubelet-sdk-test-ca") && p != before).then_some(p)
        },
    )
    .await;
    let _ = rotated;
    let lines_at_rotation = std::fs::read_to_string(&follow_log)
        .unwrap()
        .lines()
        .count();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let text = std::fs::read_to_string(&follow_log).unwrap();
    assert!(
        follow.try_wait().unwrap().is_none(),
        "the stream is still open"
    );
    assert!(
        text.lines().count() > lines_at_rotation && lines_at_rotation > 0,
        "the stream opened before the rotation goes on: {lines_at_rotation} then {}",
        text.lines().count()
    );
    let _ = follow.kill();
    let _ = follow.wait();
    common::kill_token_processes(std::slice::from_ref(&token));
}

/// A bootstrap request nobody approves stays pending (the agent waits, polling, no busy loop);
/// one an administrator denies is logged with the reason and followed, after the backoff, by a
/// new request; no kubeconfig is written meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_bootstrap_request_is_logged_and_requested_again_after_the_backoff() {
    let test = "a_denied_bootstrap_request_is_logged_and_requested_again_after_the_backoff";
    let Some(env) = ApiServerEnv::start_with_bootstrap(test, "mk-denied", "1h") else {
        return;
    };
    let Some(kubectl) = kubelet_testenv::debian_kubectl(test) else {
        return;
    };
    let kc = |args: &[&str]| kubectl_out(&kubectl, &env, args);
    // Without kubeadm's auto-approval binding the request stays pending.
    kc(&[
        "delete",
        "clusterrolebinding",
        "kubeadm:node-autoapprove-bootstrap",
    ]);
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let log = dir.join("agent.log");
    let _agent = spawn(
        dir,
        "agent.log",
        &[
            o("--kubeconfig"),
            dir.join("kubelet.conf").as_os_str(),
            o("--bootstrap-kubeconfig"),
            env.bootstrap_kubeconfig().unwrap().as_os_str(),
            o("--port"),
            o("0"),
            o("--node-name"),
            o(env.node_name()),
        ],
    );
    let names = || {
        kc(&[
            "get",
            "csr",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}{\"\\n\"}{end}",
        ])
        .lines()
        .map(str::to_string)
        .collect::<Vec<_>>()
    };
    let first = eventually(
        "a pending request",
        Duration::from_secs(30),
        &log,
        || async { names().first().cloned() },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        names(),
        std::slice::from_ref(&first),
        "one request while it is pending"
    );
    kc(&["certificate", "deny", &first]);
    eventually(
        "the denial in the log and a new request",
        Duration::from_secs(20),
        &log,
        || async {
            let text = std::fs::read_to_string(&log).ok()?;
            (text.contains(&format!("certificate signing request {first} was Denied"))
                && names().len() == 2)
                .then_some(())
        },
    )
    .await;
    assert!(!dir.join("kubelet.conf").exists());
}
