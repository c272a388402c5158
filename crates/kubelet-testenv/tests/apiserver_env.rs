//! The test API server itself: environments run side by side, the node credentials are
//! node-scoped (Node authorizer, NodeRestriction), and the API server restarts with its data.
//! Requests go through `curl` (installed by the script), so this crate needs no Kubernetes client.

#![allow(clippy::unwrap_used)]

use std::process::Command;

use kubelet_testenv::ApiServerEnv;

enum Cred<'a> {
    Admin(&'a ApiServerEnv),
    Node(&'a ApiServerEnv),
}

/// `(HTTP status, body)` of one request; status 0 when nothing answered.
fn request(cred: Cred<'_>, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let env = match cred {
        Cred::Admin(e) | Cred::Node(e) => e,
    };
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "-w", "\n%{http_code}", "-X", method, "--cacert"])
        .arg(env.ca_file())
        .args(["-H", "Content-Type: application/json"]);
    match cred {
        Cred::Admin(e) => {
            cmd.args(["-H", &format!("Authorization: Bearer {}", e.admin_token())]);
        }
        Cred::Node(e) => {
            let (cert, key) = e.node_cert_and_key();
            cmd.arg("--cert").arg(cert).arg("--key").arg(key);
        }
    }
    if let Some(b) = body {
        cmd.args(["--data", b]);
    }
    let out = cmd
        .arg(format!("{}{path}", env.url()))
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

#[test]
fn environments_started_in_parallel_are_independent() {
    let starts: Vec<_> = (0..2)
        .map(|i| {
            std::thread::spawn(move || {
                ApiServerEnv::start_for_node(
                    "environments_started_in_parallel_are_independent",
                    &format!("node-{i}"),
                )
            })
        })
        .collect();
    let envs: Vec<ApiServerEnv> = starts
        .into_iter()
        .filter_map(|t| t.join().unwrap())
        .collect();
    if envs.len() < 2 {
        return; // skipped (the message is printed)
    }
    assert_ne!(envs[0].url(), envs[1].url());
    let ns = r#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"only-in-first"}}"#;
    let (code, body) = request(
        Cred::Admin(&envs[0]),
        "POST",
        "/api/v1/namespaces",
        Some(ns),
    );
    assert_eq!(code, 201, "{body}");
    let (code, _) = request(
        Cred::Admin(&envs[0]),
        "GET",
        "/api/v1/namespaces/only-in-first",
        None,
    );
    assert_eq!(code, 200);
    let (code, _) = request(
        Cred::Admin(&envs[1]),
        "GET",
        "/api/v1/namespaces/only-in-first",
        None,
    );
    assert_eq!(code, 404);
    let dirs: Vec<_> = envs.iter().map(|e| e.dir().to_path_buf()).collect();
    drop(envs);
    for d in dirs {
        assert!(!d.exists(), "{} left behind", d.display());
    }
}

#[test]
fn node_credentials_are_limited_to_their_own_node() {
    let Some(env) =
        ApiServerEnv::start_for_node("node_credentials_are_limited_to_their_own_node", "node-a")
    else {
        return;
    };
    let node = |name: &str| {
        format!(r#"{{"apiVersion":"v1","kind":"Node","metadata":{{"name":"{name}"}}}}"#)
    };
    // Its own Node and Lease: allowed.
    let (code, body) = request(
        Cred::Node(&env),
        "POST",
        "/api/v1/nodes",
        Some(&node("node-a")),
    );
    assert_eq!(code, 201, "own Node: {body}");
    let lease = r#"{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"node-a","namespace":"kube-node-lease"},"spec":{"holderIdentity":"node-a","leaseDurationSeconds":40}}"#;
    let (code, body) = request(
        Cred::Node(&env),
        "POST",
        "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
        Some(lease),
    );
    assert_eq!(code, 201, "own Lease: {body}");
    // Another node's Node object: refused by NodeRestriction.
    let (code, body) = request(
        Cred::Node(&env),
        "POST",
        "/api/v1/nodes",
        Some(&node("node-b")),
    );
    assert_eq!(code, 403, "other Node: {body}");
    // A Secret no pod of this node uses: refused by the Node authorizer.
    let secret =
        r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"},"data":{"k":"dg=="}}"#;
    let (code, body) = request(
        Cred::Admin(&env),
        "POST",
        "/api/v1/namespaces/default/secrets",
        Some(secret),
    );
    assert_eq!(code, 201, "{body}");
    let (code, _) = request(
        Cred::Node(&env),
        "GET",
        "/api/v1/namespaces/default/secrets/s",
        None,
    );
    assert_eq!(code, 403);
    // A pod that is not a mirror pod: refused by NodeRestriction.
    let pod = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"nodeName":"node-a","containers":[{"name":"c","image":"busybox"}]}}"#;
    let (code, body) = request(
        Cred::Node(&env),
        "POST",
        "/api/v1/namespaces/default/pods",
        Some(pod),
    );
    assert_eq!(code, 403, "non-mirror pod: {body}");
    // The admin can create it (no ServiceAccount admission, no scheduler needed).
    let (code, body) = request(
        Cred::Admin(&env),
        "POST",
        "/api/v1/namespaces/default/pods",
        Some(pod),
    );
    assert_eq!(code, 201, "{body}");
    // Every request is in the audit log, with its user.
    let events = env.audit_events();
    assert!(events.iter().any(|e| e.user == "system:node:node-a"
        && e.verb == "create"
        && e.resource == "leases"
        && e.code == 201));
}

#[test]
fn api_server_restarts_on_the_same_port_with_its_data() {
    let Some(env) = ApiServerEnv::start("api_server_restarts_on_the_same_port_with_its_data")
    else {
        return;
    };
    let cm =
        r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"kept"},"data":{"a":"b"}}"#;
    let (code, body) = request(
        Cred::Admin(&env),
        "POST",
        "/api/v1/namespaces/default/configmaps",
        Some(cm),
    );
    assert_eq!(code, 201, "{body}");
    env.stop_apiserver();
    let (code, _) = request(Cred::Admin(&env), "GET", "/readyz", None);
    assert_eq!(code, 0, "nothing answers while stopped");
    env.start_apiserver();
    let (code, body) = request(
        Cred::Admin(&env),
        "GET",
        "/api/v1/namespaces/default/configmaps/kept",
        None,
    );
    assert_eq!(code, 200, "{body}");
}
