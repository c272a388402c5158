//! The kubelet API of `minimal_kubelet` (port 10250-style HTTPS, `kubelet-server`) against a
//! real kube-apiserver 1.20 (`kubelet-testenv`) and real `kubectl`s: Debian's 1.20 client
//! (unpacked into the cache) and, when the PATH has another one, that one too.
//!
//! * `kubectl logs` with `-f`, `--previous`, `--tail`, `--since`, `--since-time`,
//!   `--timestamps`, `--limit-bytes`, through the API server, which reaches the agent at its
//!   InternalIP with its kubelet client certificate; the agent checks it against
//!   `--client-ca-file` and authorizes it with a SubjectAccessReview that RBAC answers
//!   (the certificate's user is bound to `system:kubelet-api-admin`);
//! * the node advertises the port in `daemonEndpoints.kubeletEndpoint.Port`;
//! * direct requests: 401 anonymous and for a bad token, 403 for a service account RBAC denies,
//!   200 for one bound to `system:kubelet-api-admin`, for an x509 client certificate and for a
//!   static token; with the API server stopped, an unknown token is 401 and an unreviewed user
//!   500, both without hanging.
//!
//! Skips without the API server environment (fails under `KUBELET_SDK_REQUIRE_ROOT=1`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kubelet_testenv::{ApiServerEnv, free_port};

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_minimal_kubelet");

/// The agent process and the token its containers carry; killed (with them) on drop.
struct Agent {
    child: Child,
    token: String,
    log: PathBuf,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Containers outlive the agent by design.
        common::kill_token_processes(std::slice::from_ref(&self.token));
        if std::thread::panicking() {
            eprintln!(
                "--- agent log ---\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }
}

#[derive(Debug)]
struct Out {
    ok: bool,
    stdout: String,
    stderr: String,
}

fn run(cmd: &mut Command) -> Out {
    let out = cmd.output().expect("run a command");
    Out {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn kubectl(bin: &Path, kubeconfig: &Path, args: &[&str]) -> Out {
    run(Command::new(bin)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--request-timeout", "30s"])
        .args(args))
}

fn kubectl_ok(bin: &Path, kubeconfig: &Path, args: &[&str]) -> String {
    let o = kubectl(bin, kubeconfig, args);
    assert!(o.ok, "kubectl {args:?} failed: {}", o.stderr);
    o.stdout
}

fn eventually<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// `curl` to the agent's API: (HTTP code, body, seconds taken).
fn curl(port: u16, path: &str, extra: &[&str]) -> (u16, String, f64) {
    let start = Instant::now();
    let o = run(Command::new("curl")
        .args(["-sk", "--max-time", "60", "-w", "\n%{http_code}"])
        .args(extra)
        .arg(format!("https://127.0.0.1:{port}{path}")));
    let (body, code) = o.stdout.rsplit_once('\n').unwrap_or(("", "0"));
    (
        code.trim().parse().unwrap_or(0),
        body.to_string(),
        start.elapsed().as_secs_f64(),
    )
}

fn pod_json(name: &str, restart: &str, script: &str, token: &str, node: &str) -> String {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name },
        "spec": {
            "nodeName": node, "hostNetwork": true, "terminationGracePeriodSeconds": 2,
            "restartPolicy": restart,
            "containers": [{
                "name": "app", "image": "busybox",
                "command": ["/bin/sh", "-c", script, token],
            }],
        },
    })
    .to_string()
}

fn apply(bin: &Path, kubeconfig: &Path, manifest: &str) {
    let mut child = Command::new(bin)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["apply", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(manifest.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kubectl apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `minimal_kubelet` joined to `env` with its kubelet API on a free port (client certificates
/// of the environment's CA, webhook authentication and authorization), on the process
/// runtime; the containers it starts carry `token`.
/// Bind the directory first (`let (dir, agent, port)`): the agent, dropped first, prints its log
/// from it when the test fails.
fn start_agent(env: &ApiServerEnv, token: &str) -> (tempfile::TempDir, Agent, u16) {
    let node = env.node_name().to_string();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let log = dir.path().join("agent.log");
    let child = Command::new(BIN)
        .args(["--kubeconfig", env.node_kubeconfig().to_str().unwrap()])
        .args(["--node-name", &node, "--node-ip", "127.0.0.1"])
        .args(["--address", "127.0.0.1", "--port", &port.to_string()])
        .arg("--client-ca-file")
        .arg(env.ca_file())
        .arg("--cert-dir")
        .arg(dir.path().join("pki"))
        .arg("--root-dir")
        .arg(dir.path().join("root"))
        .arg("--pod-log-dir")
        .arg(dir.path().join("logs"))
        .args(["--healthz-port", "0"])
        .args(["--eviction-hard", common::LOW_EVICTION_HARD])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .env("RUST_LOG", "info,kubelet_server=debug")
        .spawn()
        .expect("start minimal_kubelet");
    let agent = Agent {
        child,
        token: token.to_string(),
        log,
    };
    (dir, agent, port)
}

/// A service account token from the TokenRequest API (works with any kubectl version).
fn service_account_token(env: &ApiServerEnv, kubectl_bin: &Path, name: &str) -> String {
    kubectl_ok(
        kubectl_bin,
        env.admin_kubeconfig(),
        &["create", "serviceaccount", name],
    );
    let (cert, key) = env.admin_cert_and_key();
    let o = run(Command::new("curl")
        .args(["-sf", "--cacert"])
        .arg(env.ca_file())
        .arg("--cert")
        .arg(cert)
        .arg("--key")
        .arg(key)
        .args(["-X", "POST", "-H", "Content-Type: application/json", "-d"])
        .arg(r#"{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{"expirationSeconds":3600}}"#)
        .arg(format!(
            "{}/api/v1/namespaces/default/serviceaccounts/{name}/token",
            env.url()
        )));
    assert!(o.ok, "TokenRequest for {name}: {}", o.stderr);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    v["status"]["token"].as_str().unwrap().to_string()
}

#[test]
fn kubectl_logs_and_the_kubelet_apis_authentication_through_a_real_api_server() {
    let test = "kubectl_logs_and_the_kubelet_apis_authentication_through_a_real_api_server";
    let Some(debian_kubectl) = kubelet_testenv::debian_kubectl(test) else {
        return;
    };
    let Some(env) = ApiServerEnv::start_for_node(test, "mk-server") else {
        return;
    };
    let kubectls = kubectls(&debian_kubectl);
    let admin = env.admin_kubeconfig().to_path_buf();
    let k = &debian_kubectl;
    kubectl_ok(
        k,
        &admin,
        &[
            "create",
            "clusterrolebinding",
            "apiserver-kubelet-api",
            "--clusterrole=system:kubelet-api-admin",
            "--user=kube-apiserver-kubelet-client",
        ],
    );

    let node = env.node_name().to_string();
    let token = format!("mk-server-{}", std::process::id());
    let (dir, _agent, port) = start_agent(&env, &token);

    // The node advertises the port.
    eventually(
        "the node to advertise its port",
        Duration::from_secs(60),
        || {
            let o = kubectl(
                k,
                &admin,
                &[
                    "get",
                    "node",
                    &node,
                    "-o",
                    "jsonpath={.status.daemonEndpoints.kubeletEndpoint.Port}",
                ],
            );
            (o.ok && o.stdout.trim() == port.to_string()).then_some(())
        },
    );

    // The generated serving certificate names the host and the node's InternalIP.
    let text = run(Command::new("openssl")
        .args(["x509", "-noout", "-text", "-in"])
        .arg(dir.path().join("pki/kubelet.crt")));
    assert!(text.ok, "{}", text.stderr);
    assert!(
        text.stdout.contains("IP Address:127.0.0.1"),
        "{}",
        text.stdout
    );

    // counter: five lines then waits; crasher: one line per run, exits 1 (restarted);
    // finisher: a line, a pause, a line, exits.
    apply(
        k,
        &admin,
        &pod_json(
            "counter",
            "Always",
            "for i in 1 2 3 4 5; do echo line-$i; done; trap 'exit 0' TERM; while true; do sleep 0.2; done",
            &token,
            &node,
        ),
    );
    apply(
        k,
        &admin,
        &pod_json(
            "crasher",
            "Always",
            "echo run-$$; sleep 0.5; exit 1",
            &token,
            &node,
        ),
    );
    let wait_running = |name: &str| {
        eventually(&format!("{name} Running"), Duration::from_secs(60), || {
            let o = kubectl(
                k,
                &admin,
                &["get", "pod", name, "-o", "jsonpath={.status.phase}"],
            );
            (o.stdout.trim() == "Running").then_some(())
        })
    };
    wait_running("counter");

    for kc in &kubectls {
        let logs = |args: &[&str]| {
            let mut all = vec!["logs"];
            all.extend_from_slice(args);
            kubectl_ok(kc, &admin, &all)
        };
        let all = eventually("five lines", Duration::from_secs(20), || {
            let o = kubectl(kc, &admin, &["logs", "counter"]);
            (o.ok && o.stdout.contains("line-5")).then_some(o.stdout)
        });
        assert_eq!(all, "line-1\nline-2\nline-3\nline-4\nline-5\n", "{kc:?}");
        assert_eq!(logs(&["counter", "--tail=2"]), "line-4\nline-5\n", "{kc:?}");
        assert_eq!(
            logs(&["counter", "-c", "app", "--limit-bytes=8"]),
            "line-1\nl",
            "{kc:?}"
        );
        assert_eq!(logs(&["counter", "--since=1h"]), all, "{kc:?}");
        assert_eq!(
            logs(&["counter", "--since-time=2999-01-01T00:00:00Z"]),
            "",
            "{kc:?}"
        );
        let stamped = logs(&["counter", "--timestamps", "--tail=1"]);
        let (ts, line) = stamped.trim_end().split_once(' ').unwrap();
        assert_eq!(line, "line-5");
        assert_eq!(
            ts.len(),
            "2024-01-01T00:00:00.000000000Z".len(),
            "{stamped}"
        );
        // An unknown container: the API server passes the kubelet's answer on.
        let o = kubectl(kc, &admin, &["logs", "counter", "-c", "nope"]);
        assert!(!o.ok);
    }

    // --previous: the crasher's last terminated run.
    eventually("crasher restarted", Duration::from_secs(60), || {
        let o = kubectl(
            k,
            &admin,
            &[
                "get",
                "pod",
                "crasher",
                "-o",
                "jsonpath={.status.containerStatuses[0].restartCount}",
            ],
        );
        (o.stdout.trim().parse::<u32>().unwrap_or(0) >= 1).then_some(())
    });
    for kc in &kubectls {
        let prev = eventually("previous logs", Duration::from_secs(30), || {
            let o = kubectl(kc, &admin, &["logs", "crasher", "--previous"]);
            (o.ok && o.stdout.starts_with("run-")).then_some(o.stdout)
        });
        assert_eq!(prev.lines().count(), 1, "{prev}");
    }

    // -f: follows until the container exits, then kubectl exits by itself.
    for (i, kc) in kubectls.iter().enumerate() {
        let name = format!("finisher-{i}");
        apply(
            k,
            &admin,
            &pod_json(
                &name,
                "Never",
                "echo first; sleep 3; echo second",
                &token,
                &node,
            ),
        );
        eventually(&format!("{name} started"), Duration::from_secs(60), || {
            let o = kubectl(
                k,
                &admin,
                &[
                    "get",
                    "pod",
                    &name,
                    "-o",
                    "jsonpath={.status.containerStatuses[0].state.running}",
                ],
            );
            (!o.stdout.trim().is_empty()).then_some(())
        });
        let start = Instant::now();
        let followed = kubectl(kc, &admin, &["logs", "-f", &name]);
        assert!(followed.ok, "{}", followed.stderr);
        assert_eq!(followed.stdout, "first\nsecond\n", "{kc:?}");
        assert!(start.elapsed() < Duration::from_secs(30));
    }

    // Direct requests to the kubelet API.
    let (code, body, _) = curl(port, "/pods", &[]);
    assert_eq!((code, body.as_str()), (401, "Unauthorized\n"));
    let (code, _, _) = curl(port, "/pods", &["-H", "Authorization: Bearer not-a-token"]);
    assert_eq!(code, 401);
    let viewer = service_account_token(&env, k, "viewer");
    let (code, body, _) = curl(
        port,
        "/pods",
        &["-H", &format!("Authorization: Bearer {viewer}")],
    );
    assert_eq!(code, 403, "{body}");
    assert_eq!(
        body,
        "Forbidden (user=system:serviceaccount:default:viewer, verb=get, resource=nodes, subresource(s)=[pods proxy])\n"
    );
    let reader = service_account_token(&env, k, "reader");
    kubectl_ok(
        k,
        &admin,
        &[
            "create",
            "clusterrolebinding",
            "reader-kubelet-api",
            "--clusterrole=system:kubelet-api-admin",
            "--serviceaccount=default:reader",
        ],
    );
    let bearer = format!("Authorization: Bearer {reader}");
    let (code, body, _) = curl(port, "/pods", &["-H", &bearer]);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"counter\""));
    let (code, body, _) = curl(
        port,
        "/containerLogs/default/counter/app?tailLines=1",
        &["-H", &bearer],
    );
    assert_eq!((code, body.as_str()), (200, "line-5\n"));
    let (code, body, _) = curl(
        port,
        "/containerLogs/default/counter/app?tailLines=-1",
        &["-H", &bearer],
    );
    assert_eq!(code, 422, "{body}");
    assert!(body.contains("tailLines"), "{body}");
    let (code, _, _) = curl(port, "/containerLogs/default/ghost/app", &["-H", &bearer]);
    assert_eq!(code, 404);
    let (code, _, _) = curl(
        port,
        "/pods",
        &[
            "-H",
            &format!("Authorization: Bearer {}", env.admin_token()),
        ],
    );
    assert_eq!(code, 200);
    let (cert, key) = env.admin_cert_and_key();
    let x509 = [
        "--cert",
        cert.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
    ];
    let (code, body, _) = curl(port, "/configz", &x509);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"kubeletconfig\""));

    // Stats: through the API server's node proxy (`kubectl get --raw`), refused without RBAC.
    let raw = format!("/api/v1/nodes/{node}/proxy/stats/summary");
    let summary = eventually(
        "the node's summary through the API server",
        Duration::from_secs(60),
        || {
            let o = kubectl(k, &admin, &["get", "--raw", &raw]);
            let v: serde_json::Value = serde_json::from_str(&o.stdout).ok()?;
            (v["node"]["nodeName"] == node.as_str()).then_some(v)
        },
    );
    assert!(
        summary["node"]["memory"]["workingSetBytes"]
            .as_u64()
            .unwrap_or(0)
            > 0,
        "{summary:#}"
    );
    let (code, body, _) = curl(
        port,
        "/stats/summary",
        &["-H", &format!("Authorization: Bearer {viewer}")],
    );
    assert_eq!(
        (code, body.as_str()),
        (
            403,
            "Forbidden (user=system:serviceaccount:default:viewer, verb=get, resource=nodes, subresource(s)=[stats])\n"
        )
    );
    let prober = service_account_token(&env, k, "prober");
    for args in [
        &[
            "create",
            "clusterrole",
            "node-proxy",
            "--verb=get",
            "--resource=nodes/proxy",
        ][..],
        &[
            "create",
            "clusterrolebinding",
            "prober-node-proxy",
            "--clusterrole=node-proxy",
            "--serviceaccount=default:prober",
        ][..],
    ] {
        kubectl_ok(k, &admin, args);
    }
    let through_apiserver = |token: &str| {
        let o = run(Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
            .arg(env.ca_file())
            .args(["-H", &format!("Authorization: Bearer {token}")])
            .arg(format!("{}{raw}", env.url())));
        o.stdout.trim().parse::<u16>().unwrap_or(0)
    };
    eventually(
        "the prober's RBAC to allow the node proxy",
        Duration::from_secs(30),
        || (through_apiserver(&prober) == 200).then_some(()),
    );
    kubectl_ok(
        k,
        &admin,
        &["delete", "clusterrolebinding", "prober-node-proxy"],
    );
    eventually(
        "the node proxy to be refused once the binding is gone",
        Duration::from_secs(30),
        || (through_apiserver(&prober) == 403).then_some(()),
    );

    // The API server goes away: nothing hangs.
    let unused = service_account_token(&env, k, "late");
    env.stop_apiserver();
    let (code, _, took) = curl(
        port,
        "/pods",
        &["-H", &format!("Authorization: Bearer {unused}")],
    );
    assert_eq!(code, 401);
    assert!(took < 30.0, "{took}s");
    let (node_cert, node_key) = env.node_cert_and_key();
    let (code, body, took) = curl(
        port,
        "/healthz",
        &[
            "--cert",
            node_cert.to_str().unwrap(),
            "--key",
            node_key.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 500, "{body}");
    assert!(
        body.starts_with("Authorization error (user=system:node:mk-server"),
        "{body}"
    );
    assert!(took < 30.0, "{took}s");
    // Cached decisions still serve.
    let (code, _, _) = curl(port, "/pods", &["-H", &bearer]);
    assert_eq!(code, 200);
}

fn which_kubectl() -> Result<PathBuf, ()> {
    let path = std::env::var_os("PATH").ok_or(())?;
    std::env::split_paths(&path)
        .map(|d| d.join("kubectl"))
        .find(|p| p.is_file())
        .ok_or(())
}

/// Every `kubectl` to test: Debian's 1.20 (SPDY) and, when the machine has another one on the
/// PATH (a newer client: WebSocket first, SPDY as its fallback), that one too.
fn kubectls(debian: &Path) -> Vec<PathBuf> {
    let mut all = vec![debian.to_path_buf()];
    if let Ok(path) = which_kubectl() {
        let version = |b: &Path| run(Command::new(b).args(["version", "--client"])).stdout;
        if version(&path) != version(debian) {
            all.push(path);
        }
    }
    all
}

fn kubectl_with_stdin(bin: &Path, kubeconfig: &Path, args: &[&str], input: &[u8]) -> Out {
    use std::io::Write;
    let mut child = Command::new(bin)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--request-timeout", "30s"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    Out {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn http_get(port: u16) -> Option<String> {
    use std::io::{Read, Write};
    let r = (|| -> std::io::Result<String> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.write_all(b"GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n")?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    })();
    match r {
        Ok(o) => Some(o),
        Err(e) => Some(format!("error: {e}")),
    }
}

#[test]
fn kubectl_exec_cp_attach_and_port_forward_through_a_real_api_server() {
    let test = "kubectl_exec_cp_attach_and_port_forward_through_a_real_api_server";
    let Some(debian_kubectl) = kubelet_testenv::debian_kubectl(test) else {
        return;
    };
    let Some(env) = ApiServerEnv::start_for_node(test, "mk-stream") else {
        return;
    };
    let admin = env.admin_kubeconfig().to_path_buf();
    let k = &debian_kubectl;
    kubectl_ok(
        k,
        &admin,
        &[
            "create",
            "clusterrolebinding",
            "apiserver-kubelet-api",
            "--clusterrole=system:kubelet-api-admin",
            "--user=kube-apiserver-kubelet-client",
        ],
    );
    let node = env.node_name().to_string();
    let token = format!("mk-stream-{}", std::process::id());
    let (dir, agent, port) = start_agent(&env, &token);
    let agent_pid = agent.child.id();

    // The pod: a shell that serves a page on two ports (busybox httpd) and waits.
    let www = dir.path().join("www");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::write(www.join("index.html"), format!("page-{token}\n")).unwrap();
    let (p1, p2) = (free_port(), free_port());
    let script = format!(
        "busybox httpd -f -p 127.0.0.1:{p1} -h {w} & busybox httpd -f -p 127.0.0.1:{p2} -h {w} & \
         trap 'kill $(jobs -p); exit 0' TERM; while true; do sleep 0.2; done",
        w = www.display()
    );
    apply(
        k,
        &admin,
        &pod_json("shell", "Always", &script, &token, &node),
    );
    eventually("shell Running", Duration::from_secs(60), || {
        let o = kubectl(
            k,
            &admin,
            &["get", "pod", "shell", "-o", "jsonpath={.status.phase}"],
        );
        (o.stdout.trim() == "Running").then_some(())
    });
    eventually("httpd listening", Duration::from_secs(20), || {
        http_get(p1).filter(|b| b.contains("page-"))
    });

    let clients = kubectls(&debian_kubectl);
    for kc in clients.clone() {
        let v = run(Command::new(&kc).args(["version", "--client"])).stdout;
        let v = v.lines().next().unwrap_or_default().to_string();
        // Output, and the exit code on the error stream.
        let o = kubectl(&kc, &admin, &["exec", "shell", "--", "echo", "hi"]);
        assert!(
            o.ok && o.stdout == "hi\n",
            "{v}: exec echo: {} {}",
            o.stdout,
            o.stderr
        );
        let o = kubectl(&kc, &admin, &["exec", "shell", "--", "sh", "-c", "exit 7"]);
        assert!(!o.ok, "{v}: exit 7 must fail");
        let code = Command::new(&kc)
            .arg("--kubeconfig")
            .arg(&admin)
            .args(["exec", "shell", "--", "sh", "-c", "exit 7"])
            .status()
            .unwrap()
            .code();
        assert_eq!(code, Some(7), "{v}: the exit code propagates");
        // Standard input, to its end.
        let o = kubectl_with_stdin(
            &kc,
            &admin,
            &["exec", "-i", "shell", "--", "cat"],
            b"hello\n",
        );
        assert!(
            o.ok && o.stdout == "hello\n",
            "{v}: exec -i cat: {} {}",
            o.stdout,
            o.stderr
        );
        // Standard error apart.
        let o = kubectl(
            &kc,
            &admin,
            &["exec", "shell", "--", "sh", "-c", "echo err >&2"],
        );
        assert!(
            o.ok && o.stderr.contains("err") && o.stdout.is_empty(),
            "{v}: {o:?}"
        );
        // A terminal, with its size sent as a resize event.
        let o = run(Command::new("script").args([
            "-qec",
            &format!(
                "stty rows 31 cols 101; {} --kubeconfig {} exec -it shell -- stty size",
                kc.display(),
                admin.display()
            ),
            "/dev/null",
        ]));
        assert!(
            o.stdout.contains("31 101"),
            "{v}: exec -it stty size: {} {}",
            o.stdout,
            o.stderr
        );

        // kubectl cp both ways (tar in the container, through stdin and stdout).
        let local = dir.path().join(format!("up-{token}.txt"));
        std::fs::write(&local, format!("upload-{token}\n")).unwrap();
        let remote = format!("/tmp/cp-{token}.txt");
        let o = kubectl(
            &kc,
            &admin,
            &["cp", local.to_str().unwrap(), &format!("shell:{remote}")],
        );
        assert!(o.ok, "{v}: kubectl cp up: {}", o.stderr);
        assert_eq!(
            std::fs::read_to_string(&remote).unwrap_or_default(),
            format!("upload-{token}\n"),
            "{v}"
        );
        let back = dir.path().join(format!("down-{token}.txt"));
        let o = kubectl(
            &kc,
            &admin,
            &["cp", &format!("shell:{remote}"), back.to_str().unwrap()],
        );
        assert!(o.ok, "{v}: kubectl cp down: {}", o.stderr);
        assert_eq!(
            std::fs::read_to_string(&back).unwrap_or_default(),
            format!("upload-{token}\n"),
            "{v}"
        );
        let _ = std::fs::remove_file(&remote);

        // An unknown container.
        let o = kubectl(&kc, &admin, &["exec", "shell", "-c", "nope", "--", "true"]);
        assert!(!o.ok, "{v}: exec into an unknown container must fail");

        // Port-forward: two ports at once, 20 concurrent requests, and a closed port that
        // fails alone.
        let (l1, l2, l3) = (free_port(), free_port(), free_port());
        let closed = free_port();
        let mut pf = Command::new(&kc)
            .arg("--kubeconfig")
            .arg(&admin)
            .args([
                "port-forward",
                "pod/shell",
                &format!("{l1}:{p1}"),
                &format!("{l2}:{p2}"),
                &format!("{l3}:{closed}"),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        eventually("port-forward listening", Duration::from_secs(30), || {
            std::net::TcpStream::connect(("127.0.0.1", l2)).ok()
        });
        let handles: Vec<_> = (0..20)
            .map(|i| {
                let port = if i % 2 == 0 { l1 } else { l2 };
                std::thread::spawn(move || http_get(port))
            })
            .collect();
        let mut failed = Vec::new();
        for h in handles {
            let body = h.join().unwrap().unwrap_or_default();
            if !body.contains(&format!("page-{token}")) {
                failed.push(body);
            }
        }
        // The closed port: the request fails, and the other ports keep working.
        let refused = http_get(l3).unwrap_or_default();
        let after = http_get(l1).unwrap_or_default();
        let _ = pf.kill();
        let out = pf.wait_with_output().unwrap();
        let pf_err = String::from_utf8_lossy(&out.stderr);
        assert!(
            failed.is_empty(),
            "{v}: port-forward failed {} of 20: {failed:?}; kubectl: {pf_err}",
            failed.len()
        );
        assert!(!refused.contains("page-"), "{v}: {refused}");
        assert!(
            pf_err.contains(&format!("error forwarding port {closed}")),
            "{v}: the refusal is reported on the error stream: {pf_err}"
        );
        // The server keeps the connection up for the other ports. Debian's kubectl keeps
        // forwarding too; newer clients end the whole port-forward on the first error by
        // themselves.
        if kc == debian_kubectl {
            assert!(
                after.contains("page-"),
                "{v}: after a refused connection: {after}; kubectl: {pf_err}"
            );
        }
        eprintln!("{v}: exec, cp and port-forward ok");
    }
    // kube-rs's WebSocket client (exec with and without stdin, port-forward), through the API
    // server.
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(kube_rs_client(&admin, &token, p1));

    // kubectl attach to a container with `stdin: true`: input reaches its standard input (the
    // FIFO its supervisor holds), its output comes back from the log as it is written.
    for (i, kc) in clients.iter().enumerate() {
        let name = format!("reader{i}");
        let pod = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": name },
            "spec": {
                "nodeName": node, "hostNetwork": true, "terminationGracePeriodSeconds": 1,
                "restartPolicy": "Never",
                "containers": [{
                    "name": "app", "image": "busybox", "stdin": true, "stdinOnce": true,
                    "command": ["/bin/sh", "-c", "read l; echo got-$l; sleep 1", &token],
                }],
            },
        });
        apply(k, &admin, &pod.to_string());
        eventually(&format!("{name} Running"), Duration::from_secs(60), || {
            let o = kubectl(
                k,
                &admin,
                &["get", "pod", &name, "-o", "jsonpath={.status.phase}"],
            );
            (o.stdout.trim() == "Running").then_some(())
        });
        let o = kubectl_with_stdin(kc, &admin, &["attach", "-i", &name], b"hello\n");
        assert!(
            o.stdout.contains("got-hello"),
            "attach: {} {}",
            o.stdout,
            o.stderr
        );
    }

    // Bad input, straight to the kubelet API (the admin's client certificate).
    let (cert, key) = env.admin_cert_and_key();
    let x509 = [
        "--cert".to_string(),
        cert.to_str().unwrap().to_string(),
        "--key".to_string(),
        key.to_str().unwrap().to_string(),
    ];
    let with = |extra: &[&str]| -> Vec<String> {
        x509.iter()
            .cloned()
            .chain(extra.iter().map(|s| s.to_string()))
            .collect()
    };
    let call = |path: &str, extra: &[&str]| {
        let args = with(extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        curl(port, path, &args)
    };
    let exec_path = "/exec/default/shell/app?command=true&output=1";
    // No upgrade.
    let (code, body, _) = call(exec_path, &["-X", "POST"]);
    assert_eq!(code, 400, "{body}");
    // An upgrade without a protocol both sides speak: 403, with the accepted ones.
    let o = run(Command::new("curl")
        .args(["-sk", "-i", "--max-time", "10", "-X", "POST"])
        .args(with(&[
            "-H",
            "Connection: Upgrade",
            "-H",
            "Upgrade: SPDY/3.1",
            "-H",
            "X-Stream-Protocol-Version: v9.channel.k8s.io",
        ]))
        .arg(format!("https://127.0.0.1:{port}{exec_path}")));
    assert!(o.stdout.starts_with("HTTP/1.1 403"), "{}", o.stdout);
    assert!(
        o.stdout
            .contains("x-accepted-stream-protocol-versions: v4.channel.k8s.io"),
        "{}",
        o.stdout
    );
    // Unknown pod and container: 404.
    let spdy = [
        "-X",
        "POST",
        "-H",
        "Connection: Upgrade",
        "-H",
        "Upgrade: SPDY/3.1",
        "-H",
        "X-Stream-Protocol-Version: v4.channel.k8s.io",
    ];
    let (code, body, _) = call("/exec/default/ghost/app?command=true&output=1", &spdy);
    assert_eq!(code, 404, "{body}");
    let (code, body, _) = call("/exec/default/shell/nope?command=true&output=1", &spdy);
    assert_eq!(code, 404, "{body}");
    // /run: the output of a non-streaming exec.
    let (code, body, _) = call("/run/default/shell/app?cmd=echo+run-ok", &["-X", "POST"]);
    assert!(code == 200 && body == "run-ok\n", "{code} {body}");
    // No command: 400 (the kubelet passes an empty program name to the runtime).
    let (code, body, _) = call("/run/default/shell/app?cmd=", &["-X", "POST"]);
    assert_eq!(code, 400, "{body}");
    // A boolean the API machinery reads as true (anything but absent, `0` or `false`), as the
    // kubelet does: not an error.
    let (code, body, _) = call("/containerLogs/default/shell/app?timestamps=maybe", &[]);
    assert_eq!(code, 200, "{body}");

    // A 10 MiB burst on standard input, and 100 execs at once.
    let k = &debian_kubectl;
    let burst = vec![b'x'; 10 * 1024 * 1024];
    let o = kubectl_with_stdin(
        k,
        &admin,
        &["exec", "-i", "shell", "--", "wc", "-c"],
        &burst,
    );
    assert!(
        o.ok && o.stdout.trim() == "10485760",
        "{} {}",
        o.stdout,
        o.stderr
    );
    let fds = || {
        std::fs::read_dir(format!("/proc/{agent_pid}/fd"))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    let fds_before = fds();
    let handles: Vec<_> = (0..100)
        .map(|i| {
            let (k, admin) = (k.clone(), admin.clone());
            std::thread::spawn(move || {
                kubectl(
                    &k,
                    &admin,
                    &["exec", "shell", "--", "echo", &format!("n{i}")],
                )
            })
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        let o = h.join().unwrap();
        assert!(
            o.ok && o.stdout == format!("n{i}\n"),
            "exec {i}: {} {}",
            o.stdout,
            o.stderr
        );
    }
    // A client that goes away mid-stream: its command is killed.
    let marker = format!("sleep-{token}");
    let mut gone = Command::new(k)
        .arg("--kubeconfig")
        .arg(&admin)
        .args([
            "exec",
            "shell",
            "--",
            "sh",
            "-c",
            &format!("exec -a {marker} sleep 1000"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pgrep = |pattern: &str| run(Command::new("pgrep").args(["-f", pattern])).stdout;
    eventually("the exec'd sleep", Duration::from_secs(20), || {
        (!pgrep(&marker).trim().is_empty()).then_some(())
    });
    let _ = gone.kill();
    let _ = gone.wait();
    eventually("the exec'd sleep killed", Duration::from_secs(30), || {
        pgrep(&marker).trim().is_empty().then_some(())
    });
    // Nothing leaked: descriptors back to where they were (connections may linger briefly).
    let fds_after = eventually("descriptors released", Duration::from_secs(30), || {
        let n = fds();
        (n <= fds_before + 4).then_some(n)
    });
    eprintln!("agent descriptors: {fds_before} before 100 execs, {fds_after} after");

    // The agent logs each protocol it served (RUST_LOG=kubelet_server=debug): Debian's kubectl
    // speaks SPDY; a newer one WebSocket (exec, cp) and the SPDY tunnel (port-forward).
    let log = std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default();
    if clients.len() > 1 {
        eprintln!(
            "served: WebSocket exec {}, SPDY tunnel {}",
            log.contains("exec or attach over WebSocket"),
            log.contains("WebSocket SPDY tunnel")
        );
        assert!(
            log.contains("exec or attach over WebSocket protocol=\"v5.channel.k8s.io\""),
            "the newer kubectl used WebSocket v5"
        );
        assert!(
            log.contains("WebSocket SPDY tunnel"),
            "the newer kubectl forwarded ports through the SPDY tunnel"
        );
    }

    // Nothing left behind: the shell and its two httpd are the only processes with the token's
    // pages or commands.
    let execs = run(Command::new("pgrep").args(["-f", "stty size|exit 7|cat$"]));
    assert!(
        !execs.stdout.lines().any(|pid| {
            std::fs::read_to_string(format!("/proc/{}/environ", pid.trim()))
                .is_ok_and(|e| e.contains(&token))
        }),
        "exec processes left: {}",
        execs.stdout
    );
}

async fn kube_rs_client(admin: &Path, token: &str, port: u16) {
    use kube::api::{Api, AttachParams};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let kc = kube::config::Kubeconfig::read_from(admin).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let pods: Api<kubelet::k8s_openapi::api::core::v1::Pod> = Api::namespaced(client, "default");

    let mut p = pods
        .exec(
            "shell",
            ["echo", "kube-rs"],
            &AttachParams::default().stderr(false),
        )
        .await
        .expect("kube-rs exec");
    let mut out = String::new();
    p.stdout().unwrap().read_to_string(&mut out).await.unwrap();
    let status = p.take_status().unwrap().await;
    assert_eq!(out, "kube-rs\n");
    assert_eq!(
        status.and_then(|s| s.status).as_deref(),
        Some("Success"),
        "the v4 status on the error channel"
    );

    let mut p = pods
        .exec(
            "shell",
            ["cat"],
            &AttachParams::default().stdin(true).stderr(false),
        )
        .await
        .expect("kube-rs exec with stdin");
    let mut stdin = p.stdin().unwrap();
    stdin.write_all(b"via-websocket\n").await.unwrap();
    // End of input: kube-rs then sends v5's close message for stdin.
    stdin.shutdown().await.unwrap();
    drop(stdin);
    let mut out = String::new();
    let mut stdout = p.stdout().unwrap();
    let read = tokio::time::timeout(Duration::from_secs(20), async {
        let mut buf = [0u8; 64];
        while !out.contains("via-websocket") {
            let n = stdout.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            out.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    })
    .await;
    assert!(
        read.is_ok() && out.contains("via-websocket"),
        "kube-rs stdin: {out:?}"
    );
    drop(stdout);
    // cat saw the end of its input and exited: the session ends with its status.
    let status = tokio::time::timeout(Duration::from_secs(30), p.take_status().unwrap())
        .await
        .expect("the exec ends once stdin is closed");
    assert_eq!(status.and_then(|s| s.status).as_deref(), Some("Success"));
    let _ = p.join().await;

    let mut pf = pods
        .portforward("shell", &[port])
        .await
        .expect("kube-rs port-forward");
    let mut stream = pf.take_stream(port).unwrap();
    stream
        .write_all(b"GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut page = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut page)).await;
    let page = String::from_utf8_lossy(&page);
    assert!(
        page.contains(&format!("page-{token}")),
        "kube-rs port-forward: {page}"
    );
    drop(stream);
    let _ = tokio::time::timeout(Duration::from_secs(10), pf.join()).await;
}
