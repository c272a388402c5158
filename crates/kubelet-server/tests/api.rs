//! The kubelet API served from an agent built in code (in-memory runtime, relist PLEG), over
//! real TLS on 127.0.0.1: authentication (x509, tokens, anonymous), an in-process authorizer,
//! container logs with their options and errors, the read-only port's limits, and the bounds on
//! connections (handshake and header timeouts; no tasks or descriptors left after 200
//! followers leave).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use kubelet_api::{ContainerRuntime, PodSource, SourceSender};
use kubelet_core::configuration::KubeletConfiguration;
use kubelet_core::testing::FakeRuntime;
use kubelet_core::{KubeletBuilder, KubeletConfig};
use kubelet_pleg::GenericPleg;
use kubelet_server::{
    Attributes, AuthError, Authorizer, Decision, KubeletServer, ServerConfig, TokenAuthenticator,
    UserInfo,
};
use kubelet_testenv::free_port;
use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

struct Pods(Vec<Pod>);

#[async_trait]
impl PodSource for Pods {
    fn name(&self) -> &str {
        "file"
    }
    async fn run(&self, out: SourceSender, shutdown: CancellationToken) {
        let _ = out.snapshot(self.0.clone()).await;
        shutdown.cancelled().await;
    }
}

fn pod(name: &str) -> Pod {
    let mut p = Pod {
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "app".into(),
                image: Some("busybox".into()),
                ..Default::default()
            }],
            host_network: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    };
    p.metadata.name = Some(name.into());
    p.metadata.namespace = Some("default".into());
    p.metadata.uid = Some(format!("uid-{name}"));
    p
}

/// Tokens: `admin-token` is `admin`, `viewer-token` is `viewer`; `down-token` fails.
struct Tokens;

#[async_trait]
impl TokenAuthenticator for Tokens {
    async fn authenticate_token(&self, token: &str) -> Result<Option<UserInfo>, AuthError> {
        Ok(match token {
            "admin-token" => Some(UserInfo::new("admin", vec![])),
            "viewer-token" => Some(UserInfo::new("viewer", vec![])),
            "monitor-token" => Some(UserInfo::new("monitor", vec![])),
            "down-token" => return Err(AuthError::Webhook("connection refused".into())),
            _ => None,
        })
    }
}

/// Allows `admin` and members of `ops`, and `monitor` to `get` only (as `get nodes/proxy`);
/// records what it was asked.
#[derive(Default)]
struct Policy {
    asked: Mutex<Vec<Attributes>>,
}

#[async_trait]
impl Authorizer for Policy {
    async fn authorize(&self, a: &Attributes) -> Result<Decision, AuthError> {
        self.asked.lock().push(a.clone());
        if a.user.name == "admin"
            || a.user.groups.iter().any(|g| g == "ops")
            || (a.user.name == "monitor" && a.verb == "get")
        {
            Ok(Decision::Allow)
        } else {
            Ok(Decision::Deny("not in ops".into()))
        }
    }
}

struct Pki {
    ca: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

impl Pki {
    fn new() -> Self {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "test-client-ca");
        let ca = p.self_signed(&ca_key).unwrap();
        Self { ca, ca_key }
    }

    /// A client certificate for `cn` in `orgs`: (cert PEM, key PEM).
    fn client(&self, cn: &str, orgs: &[&str]) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        for o in orgs {
            p.distinguished_name
                .push(rcgen::DnType::OrganizationName, *o);
        }
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let cert = p.signed_by(&key, &self.ca, &self.ca_key).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

struct Agent {
    api: SocketAddr,
    read_only: SocketAddr,
    healthz: Option<SocketAddr>,
    runtime: Arc<FakeRuntime>,
    log_dir: PathBuf,
    server_ca: PathBuf,
    policy: Arc<Policy>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    _tmp: tempfile::TempDir,
}

async fn start(pki: &Pki) -> Agent {
    start_with(pki, tempfile::tempdir().unwrap(), |c| c).await
}

async fn start_with(
    pki: &Pki,
    tmp: tempfile::TempDir,
    adjust: impl FnOnce(ServerConfig) -> ServerConfig,
) -> Agent {
    let ca_file = tmp.path().join("client-ca.pem");
    std::fs::write(&ca_file, pki.ca.pem()).unwrap();
    let mut c = KubeletConfiguration::default();
    c.address = "127.0.0.1".into();
    c.port = 1; // replaced below by a free port
    c.authentication.x509.client_ca_file = ca_file.display().to_string();
    c.authentication.anonymous.enabled = false;
    let mut config = ServerConfig::from_configuration(&c)
        .port(free_port())
        .read_only_port(free_port())
        .healthz_port(0)
        .cert_dir(tmp.path().join("pki"))
        .hostname("localhost")
        .addresses(["127.0.0.1".parse().unwrap()]);
    config.acceptor.handshake_timeout = Duration::from_millis(500);
    config.acceptor.header_read_timeout = Duration::from_millis(500);
    let config = adjust(config);
    let policy = Arc::new(Policy::default());
    let server = KubeletServer::bind(config)
        .await
        .unwrap()
        .with_token_authenticator(Arc::new(Tokens))
        .with_authorizer(policy.clone());
    let api = server.addr().unwrap();
    let read_only = server.read_only_addr().unwrap();
    let healthz = server.healthz_addr();
    let runtime = Arc::new(FakeRuntime::new());
    let log_dir = tmp.path().join("logs");
    let (pleg, pleg_events) = GenericPleg::new(
        runtime.clone() as Arc<dyn ContainerRuntime>,
        Default::default(),
    );
    let pleg = std::sync::Arc::new(pleg);
    let kubelet = KubeletBuilder::new("node-1")
        .config(KubeletConfig::with_dirs(tmp.path().join("root"), &log_dir))
        .runtime(runtime.clone())
        .pleg(pleg, pleg_events)
        .pod_source(Arc::new(Pods(vec![pod("p1")])))
        .plugin(Arc::new(server))
        .build()
        .unwrap();
    let reader = kubelet.status_reader();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(kubelet.run(shutdown.clone()));
    // Wait until the pod runs.
    for _ in 0..200 {
        let running = reader.list().iter().any(|p| {
            p.status
                .container_statuses
                .iter()
                .flatten()
                .any(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
        });
        if running {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Agent {
        api,
        read_only,
        healthz,
        runtime,
        log_dir,
        server_ca: tmp.path().join("pki/kubelet.crt"),
        policy,
        shutdown,
        task,
        _tmp: tmp,
    }
}

/// The container log the fake runtime reports for `app` of `p1`.
fn app_log(agent: &Agent) -> PathBuf {
    let dir = std::fs::read_dir(&agent.log_dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let app = dir.join("app");
    std::fs::create_dir_all(&app).unwrap();
    app.join("0.log")
}

fn tls_client(server_ca: &Path, identity: Option<(String, String)>) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    // The self-signed file holds the leaf then its CA.
    for c in CertificateDer::pem_file_iter(server_ca).unwrap() {
        let _ = roots.add(c.unwrap());
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let config = match identity {
        Some((cert, key)) => {
            let chain: Vec<_> = CertificateDer::pem_slice_iter(cert.as_bytes())
                .collect::<Result<_, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

struct Reply {
    code: u16,
    headers: String,
    body: String,
}

fn parse_reply(raw: &[u8]) -> Reply {
    let text = String::from_utf8_lossy(raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut out = String::new();
        let mut rest = rest;
        while let Some((size, after)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if n == 0 || after.len() < n {
                break;
            }
            out.push_str(&after[..n]);
            rest = after[n..].strip_prefix("\r\n").unwrap_or(&after[n..]);
        }
        out
    } else {
        rest.to_string()
    };
    Reply {
        code,
        headers: head.to_string(),
        body,
    }
}

fn request(path: &str, token: Option<&str>) -> String {
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n")
}

async fn https(
    agent: &Agent,
    path: &str,
    token: Option<&str>,
    identity: Option<(String, String)>,
) -> Reply {
    let tcp = TcpStream::connect(agent.api).await.unwrap();
    let mut tls = tls_client(&agent.server_ca, identity)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .expect("TLS handshake");
    tls.write_all(request(path, token).as_bytes())
        .await
        .unwrap();
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), tls.read_to_end(&mut raw)).await;
    parse_reply(&raw)
}

async fn http(addr: SocketAddr, path: &str) -> Reply {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(request(path, None).as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), tcp.read_to_end(&mut raw)).await;
    parse_reply(&raw)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_authenticated_and_authorized_as_the_kubelet_does() {
    let pki = Pki::new();
    let agent = start(&pki).await;

    // No credentials, anonymous off: 401.
    let r = https(&agent, "/pods", None, None).await;
    assert_eq!((r.code, r.body.as_str()), (401, "Unauthorized\n"));
    // A token nobody knows, and a token check that fails: 401.
    assert_eq!(https(&agent, "/pods", Some("nope"), None).await.code, 401);
    assert_eq!(
        https(&agent, "/pods", Some("down-token"), None).await.code,
        401
    );
    // A known user the policy denies: 403 with the kubelet's body, both subresources tried.
    let r = https(&agent, "/pods", Some("viewer-token"), None).await;
    assert_eq!(r.code, 403);
    assert_eq!(
        r.body,
        "Forbidden (user=viewer, verb=get, resource=nodes, subresource(s)=[pods proxy])\n"
    );
    // An allowed token.
    let r = https(&agent, "/pods", Some("admin-token"), None).await;
    assert_eq!(r.code, 200, "{}", r.body);
    assert!(r.body.contains("\"PodList\"") && r.body.contains("\"p1\""));
    // A client certificate: CN is the user, O the groups, plus system:authenticated.
    let r = https(
        &agent,
        "/healthz",
        None,
        Some(pki.client("carol", &["ops"])),
    )
    .await;
    assert_eq!((r.code, r.body.as_str()), (200, "ok"));
    let asked = agent.policy.asked.lock().clone();
    let carol = asked.iter().find(|a| a.user.name == "carol").unwrap();
    assert_eq!(carol.user.groups, ["ops", "system:authenticated"]);
    assert_eq!(
        (
            carol.verb.as_str(),
            carol.resource.as_str(),
            carol.subresource.as_str(),
            carol.name.as_str()
        ),
        ("get", "nodes", "healthz", "node-1")
    );
    // A certificate from another CA fails the handshake; the server keeps serving.
    let stranger = Pki::new().client("mallory", &["ops"]);
    let tcp = TcpStream::connect(agent.api).await.unwrap();
    let handshake = tls_client(&agent.server_ca, Some(stranger))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await;
    if let Ok(mut s) = handshake {
        // TLS 1.3 reports the client certificate's rejection on the first read.
        let _ = s.write_all(request("/pods", None).as_bytes()).await;
        let mut raw = Vec::new();
        let read = s.read_to_end(&mut raw).await;
        assert!(
            read.is_err() || raw.is_empty(),
            "a stranger was served: {:?}",
            String::from_utf8_lossy(&raw)
        );
    }
    assert_eq!(
        https(&agent, "/pods", Some("admin-token"), None).await.code,
        200
    );
    // Decisions are cached: asking again does not reach the authorizer.
    let before = agent.policy.asked.lock().len();
    https(&agent, "/pods", Some("admin-token"), None).await;
    assert_eq!(agent.policy.asked.lock().len(), before);

    // Commands need `create`: `get nodes/proxy` reads logs but runs nothing, neither through a
    // WebSocket exec (a GET upgrade) nor through `/run`; `/run` takes POST only.
    assert_eq!(
        https(&agent, "/pods", Some("monitor-token"), None)
            .await
            .code,
        200
    );
    let ws_exec = |token: &str| {
        format!(
            "GET /exec/default/p1/app?command=id&output=1 HTTP/1.1\r\nHost: localhost\r\n\
             Authorization: Bearer {token}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
             Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Sec-WebSocket-Protocol: v4.channel.k8s.io\r\n\r\n"
        )
    };
    let (api, server_ca) = (agent.api, agent.server_ca.clone());
    let raw = |text: String| async move {
        let tcp = TcpStream::connect(api).await.unwrap();
        let mut tls = tls_client(&server_ca, None)
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .expect("TLS handshake");
        tls.write_all(text.as_bytes()).await.unwrap();
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(20), tls.read(&mut buf))
            .await
            .expect("an answer")
            .unwrap();
        parse_reply(&buf[..n])
    };
    let denied = raw(ws_exec("monitor-token")).await;
    assert_eq!(denied.code, 403, "{}", denied.body);
    assert_eq!(
        https(
            &agent,
            "/run/default/p1/app?cmd=id",
            Some("monitor-token"),
            None
        )
        .await
        .code,
        403
    );
    let asked = agent.policy.asked.lock().clone();
    assert!(
        asked
            .iter()
            .filter(|a| a.user.name == "monitor" && a.path.starts_with("/exec/"))
            .all(|a| a.verb == "create"),
        "{asked:?}"
    );
    let get_run = https(
        &agent,
        "/run/default/p1/app?cmd=id",
        Some("admin-token"),
        None,
    )
    .await;
    assert_eq!(get_run.code, 405);
    assert!(
        get_run.headers.to_ascii_lowercase().contains("allow: post"),
        "{}",
        get_run.headers
    );

    // /configz shows the effective configuration; the read-only port has no debugging set.
    let r = https(&agent, "/configz", Some("admin-token"), None).await;
    assert_eq!(r.code, 200);
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["kubeletconfig"]["kind"], "KubeletConfiguration");
    assert_eq!(v["kubeletconfig"]["cgroupsPerQOS"], true);
    assert_eq!(v["kubeletconfig"]["cgroupDriver"], "cgroupfs");
    let r = http(agent.read_only, "/containerLogs/default/p1/app").await;
    assert_eq!(
        (r.code, r.body.as_str()),
        (405, "Debug endpoints are disabled.\n")
    );
    assert_eq!(http(agent.read_only, "/configz").await.code, 404);
    assert_eq!(http(agent.read_only, "/pods").await.code, 200);
    // Other methods on GET-only paths: 405 with Allow.
    let mut tcp = TcpStream::connect(agent.read_only).await.unwrap();
    tcp.write_all(
        b"POST /pods HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let mut raw = Vec::new();
    tcp.read_to_end(&mut raw).await.unwrap();
    let r = parse_reply(&raw);
    assert_eq!(r.code, 405);
    assert!(r.headers.to_ascii_lowercase().contains("allow: get"));

    agent.shutdown.cancel();
    agent.task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_logs_honour_the_kubelets_options_and_errors() {
    let pki = Pki::new();
    let agent = start(&pki).await;
    let log = app_log(&agent);
    std::fs::write(
        &log,
        "2024-01-01T00:00:01Z stdout F one\n2024-01-01T00:00:02Z stderr F two\n2024-01-01T00:00:03Z stdout F three\n",
    )
    .unwrap();
    let get = |q: &str| {
        let path = format!("/containerLogs/default/p1/app{q}");
        let agent = &agent;
        async move { https(agent, &path, Some("admin-token"), None).await }
    };
    let r = get("").await;
    assert_eq!((r.code, r.body.as_str()), (200, "one\ntwo\nthree\n"));
    assert_eq!(get("?tailLines=1").await.body, "three\n");
    assert_eq!(get("?tail=2").await.body, "two\nthree\n");
    assert_eq!(get("?limitBytes=5").await.body, "one\nt");
    assert_eq!(
        get("?timestamps=true&tailLines=1").await.body,
        "2024-01-01T00:00:03.000000000Z three\n"
    );
    assert_eq!(
        get("?sinceTime=2024-01-01T00:00:02Z").await.body,
        "two\nthree\n"
    );

    // Errors: the kubelet's codes, a Status body naming the parameter or object.
    let r = get("?tailLines=-1").await;
    assert_eq!(r.code, 422);
    assert!(
        r.body.contains("tailLines: Invalid value: -1"),
        "{}",
        r.body
    );
    let r = get("?limitBytes=0").await;
    assert_eq!(r.code, 422);
    assert!(r.body.contains("limitBytes"), "{}", r.body);
    let r = get("?sinceSeconds=10&sinceTime=2024-01-01T00:00:02Z").await;
    assert_eq!(r.code, 422);
    let r = get("?sinceTime=garbage").await;
    assert_eq!(r.code, 400);
    assert!(r.body.contains("sinceTime"), "{}", r.body);
    let r = https(
        &agent,
        "/containerLogs/default/nope/app",
        Some("admin-token"),
        None,
    )
    .await;
    assert_eq!(r.code, 404);
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(
        (v["kind"].as_str(), v["reason"].as_str()),
        (Some("Status"), Some("NotFound"))
    );
    assert_eq!(v["message"], "pod \"nope\" does not exist");
    let r = https(
        &agent,
        "/containerLogs/other/p1/app",
        Some("admin-token"),
        None,
    )
    .await;
    assert_eq!(r.code, 404);
    let r = https(
        &agent,
        "/containerLogs/default/p1/sidecar",
        Some("admin-token"),
        None,
    )
    .await;
    assert_eq!(r.code, 404);
    assert!(
        r.body
            .contains("container \\\"sidecar\\\" not found in pod \\\"p1\\\""),
        "{}",
        r.body
    );
    let r = get("?previous=true").await;
    assert_eq!(r.code, 400);
    assert!(
        r.body.contains("previous terminated container"),
        "{}",
        r.body
    );

    // follow: new lines arrive; the stream ends when the container exits.
    let tcp = TcpStream::connect(agent.api).await.unwrap();
    let mut s = tls_client(&agent.server_ca, None)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    s.write_all(
        request(
            "/containerLogs/default/p1/app?follow=true&tailLines=1",
            Some("admin-token"),
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let wait_for = |needle: &'static str| needle;
    for needle in [wait_for("three\n"), wait_for("four\n")] {
        if needle == "four\n" {
            std::fs::OpenOptions::new()
                .append(true)
                .open(&log)
                .unwrap()
                .write_all(b"2024-01-01T00:00:04Z stdout F four\n")
                .unwrap();
        }
        while !String::from_utf8_lossy(&seen).contains(needle) {
            let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
                .await
                .expect("a followed line arrives")
                .unwrap();
            assert!(n > 0, "the stream ended early");
            seen.extend_from_slice(&buf[..n]);
        }
    }
    let id = agent.runtime.find_container("uid-p1", "app").unwrap();
    agent.runtime.exit_container(&id, 0).unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut rest))
        .await
        .expect("follow ends when the container exits")
        .unwrap();

    agent.shutdown.cancel();
    agent.task.await.unwrap();
}

use std::io::Write as _;

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_vanishing_clients_leave_nothing_behind() {
    let pki = Pki::new();
    let agent = start(&pki).await;
    let log = app_log(&agent);
    std::fs::write(&log, "2024-01-01T00:00:01Z stdout F hello\n").unwrap();
    // Let the agent settle before counting.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let metrics = tokio::runtime::Handle::current().metrics();
    let fds_before = open_fds();
    let tasks_before = metrics.num_alive_tasks();

    // 200 followers, each seeing the first line, then all leave at once.
    let mut followers = Vec::new();
    for _ in 0..200 {
        let tcp = TcpStream::connect(agent.api).await.unwrap();
        let mut s = tls_client(&agent.server_ca, None)
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .unwrap();
        s.write_all(
            request(
                "/containerLogs/default/p1/app?follow=1",
                Some("admin-token"),
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        followers.push(s);
    }
    for s in &mut followers {
        let mut seen = Vec::new();
        let mut buf = [0u8; 1024];
        while !String::from_utf8_lossy(&seen).contains("hello") {
            let n = tokio::time::timeout(Duration::from_secs(20), s.read(&mut buf))
                .await
                .expect("each follower is served")
                .unwrap();
            assert!(n > 0);
            seen.extend_from_slice(&buf[..n]);
        }
    }
    assert!(metrics.num_alive_tasks() >= tasks_before + 200);
    drop(followers);

    // Clients that never finish their handshake or their headers are cut after the timeouts.
    let mut silent = TcpStream::connect(agent.api).await.unwrap();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf))
        .await
        .expect("a silent client is disconnected")
        .unwrap_or(0);
    assert_eq!(n, 0);
    let mut slow = TcpStream::connect(agent.read_only).await.unwrap();
    slow.write_all(b"GET /pods HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), slow.read_to_end(&mut raw))
        .await
        .expect("a client that never finishes its headers is disconnected")
        .ok();

    // 1,000 clients that connect and say nothing: the server keeps answering others, and
    // cuts them all after the handshake timeout.
    let mut idle = Vec::new();
    for _ in 0..1000 {
        idle.push(TcpStream::connect(agent.api).await.unwrap());
    }
    assert_eq!(
        https(&agent, "/pods", Some("admin-token"), None).await.code,
        200
    );
    for s in &mut idle {
        let mut b = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut b))
            .await
            .expect("an idle client is disconnected")
            .unwrap_or(0);
        assert_eq!(n, 0);
    }
    drop(idle);

    // Everything the followers and idle clients held is released.
    let mut settled = false;
    for _ in 0..100 {
        if metrics.num_alive_tasks() <= tasks_before + 2 && open_fds() <= fds_before + 4 {
            settled = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        settled,
        "tasks {} (before {tasks_before}), fds {} (before {fds_before})",
        metrics.num_alive_tasks(),
        open_fds()
    );
    // And the server still answers.
    assert_eq!(
        https(&agent, "/pods", Some("admin-token"), None).await.code,
        200
    );

    agent.shutdown.cancel();
    agent.task.await.unwrap();
}

/// Writes a self-signed pair for `localhost` to `cert`/`key` (by rename); returns its leaf.
fn write_pair(cert: &Path, key: &Path) -> CertificateDer<'static> {
    let (cert_pem, key_pem) = kubelet_server::tls::self_signed("localhost", &[]).unwrap();
    std::fs::write(cert.with_extension("crt.new"), &cert_pem).unwrap();
    std::fs::write(key.with_extension("key.new"), &key_pem).unwrap();
    std::fs::rename(key.with_extension("key.new"), key).unwrap();
    std::fs::rename(cert.with_extension("crt.new"), cert).unwrap();
    CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .next()
        .unwrap()
        .unwrap()
}

/// Reads one `/healthz` answer (`ok`, with a Content-Length) from a kept-alive connection.
async fn healthz_on<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(s: &mut S) -> String {
    s.write_all(
        b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer admin-token\r\n\r\n",
    )
    .await
    .unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&raw).ends_with("\r\n\r\nok") {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .expect("an answer")
            .unwrap();
        assert!(
            n > 0,
            "connection closed: {:?}",
            String::from_utf8_lossy(&raw)
        );
        raw.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&raw).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_certificate_is_served_to_new_connections_and_old_ones_keep_working() {
    let pki = Pki::new();
    let tmp = tempfile::tempdir().unwrap();
    let (cert, key) = (tmp.path().join("tls.crt"), tmp.path().join("tls.key"));
    let first = write_pair(&cert, &key);
    let (c, k) = (cert.clone(), key.clone());
    let agent = start_with(&pki, tmp, move |mut config| {
        config.tls.cert_file = c;
        config.tls.key_file = k;
        // Keep idle connections open across the waits below.
        config.acceptor.header_read_timeout = Duration::from_secs(10);
        config
    })
    .await;
    // Trust any certificate: this test compares what is served.
    let connect = || async {
        let tcp = TcpStream::connect(agent.api).await.unwrap();
        tokio_rustls::TlsConnector::from(Arc::new(
            kubelet_net::http::insecure_tls_config().unwrap(),
        ))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap()
    };
    let mut old = connect().await;
    assert_eq!(old.get_ref().1.peer_certificates().unwrap()[0], first);
    assert!(healthz_on(&mut old).await.starts_with("HTTP/1.1 200"));

    let second = write_pair(&cert, &key);
    assert_ne!(first, second);
    // The files are checked at most once a second.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let mut new = connect().await;
    assert_eq!(new.get_ref().1.peer_certificates().unwrap()[0], second);
    assert!(healthz_on(&mut new).await.starts_with("HTTP/1.1 200"));
    // The connection made before the change still works.
    assert!(healthz_on(&mut old).await.starts_with("HTTP/1.1 200"));

    // A broken replacement is not served; the last good pair stays.
    std::fs::write(&cert, "not a certificate").unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let again = connect().await;
    assert_eq!(again.get_ref().1.peer_certificates().unwrap()[0], second);

    agent.shutdown.cancel();
    agent.task.await.unwrap();
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_does_not_read_holds_the_server_to_a_bounded_buffer() {
    let pki = Pki::new();
    let agent = start(&pki).await;
    let log = app_log(&agent);
    // 64 MiB of log.
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&log).unwrap());
        let line = format!("2024-01-01T00:00:01Z stdout F {}\n", "y".repeat(200));
        let mut written = 0;
        while written < 64 << 20 {
            f.write_all(line.as_bytes()).unwrap();
            written += line.len();
        }
    }
    let before = rss_kib();
    let tcp = TcpStream::connect(agent.api).await.unwrap();
    let mut s = tls_client(&agent.server_ca, None)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    s.write_all(request("/containerLogs/default/p1/app", Some("admin-token")).as_bytes())
        .await
        .unwrap();
    // The client reads nothing for a while: the server stops at its channel and the socket
    // buffers instead of reading the file into memory.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let grown = rss_kib().saturating_sub(before);
    assert!(
        grown < 16 * 1024,
        "RSS grew by {grown} KiB for a stalled reader of 64 MiB"
    );
    // Reading then gets the whole log.
    let mut total = 0usize;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(30), s.read(&mut buf))
            .await
            .expect("the log arrives")
            .unwrap();
        if n == 0 {
            break;
        }
        total += n;
    }
    assert!(total > 55_000_000, "{total} bytes");
    agent.shutdown.cancel();
    agent.task.await.unwrap();
}

/// What a connection flood opens, spread over `rounds`: `idle` connections to the kubelet API
/// that send nothing, of which `stalled` send the start of a TLS record that never completes,
/// and `read_only` silent connections to the read-only port.
struct Flood {
    idle: usize,
    stalled: usize,
    read_only: usize,
    rounds: usize,
}

/// Open `flood` against `agent` round by round while an authorized client is served: it keeps
/// one connection (promoted, never dropped) and makes a request on a new connection after each
/// round; the read-only and healthz ports answer after each round too. Returns how many of the
/// flood's connections the server still holds at the end (the others it closed: EOF).
async fn flood_while_serving(agent: &Agent, flood: Flood) -> usize {
    let tcp = TcpStream::connect(agent.api).await.unwrap();
    let mut kept = tls_client(&agent.server_ca, None)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .expect("TLS handshake");
    let keep_alive =
        "GET /healthz HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer admin-token\r\n\r\n";
    kept.write_all(keep_alive.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = kept.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));

    let mut open = Vec::with_capacity(flood.idle + flood.read_only);
    let per_round = |total: usize, round: usize| {
        total / flood.rounds + usize::from(round < total % flood.rounds)
    };
    for round in 0..flood.rounds {
        for i in 0..per_round(flood.idle, round) {
            let mut s = TcpStream::connect(agent.api).await.unwrap();
            if i < per_round(flood.stalled, round) {
                // The start of a TLS record that never completes: a stalled handshake.
                s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
                    .await
                    .unwrap();
            }
            open.push(s);
        }
        for _ in 0..per_round(flood.read_only, round) {
            open.push(TcpStream::connect(agent.read_only).await.unwrap());
        }
        let r = tokio::time::timeout(
            Duration::from_secs(20),
            https(agent, "/pods", Some("admin-token"), None),
        )
        .await
        .expect("an authorized request is answered during the flood");
        assert_eq!(r.code, 200, "round {round}");
        for (port, addr) in [
            ("read-only", Some(agent.read_only)),
            ("healthz", agent.healthz),
        ] {
            let Some(addr) = addr else { continue };
            let r = tokio::time::timeout(Duration::from_secs(20), http(addr, "/healthz"))
                .await
                .unwrap_or_else(|_| panic!("the {port} port answers during the flood"));
            assert_eq!(r.code, 200, "{port} port, round {round}");
        }
    }
    // The promoted keep-alive connection still works.
    kept.write_all(keep_alive.as_bytes()).await.unwrap();
    let n = tokio::time::timeout(Duration::from_secs(20), kept.read(&mut buf))
        .await
        .expect("the kept connection answers")
        .unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    let mut held = 0;
    for s in &mut open {
        let mut b = [0u8; 1];
        if tokio::time::timeout(Duration::from_millis(5), s.read(&mut b))
            .await
            .is_err()
        {
            held += 1;
        }
    }
    held
}

/// Idle connections and stalled TLS handshakes far beyond small caps, with timeouts longer
/// than the test: authorized clients are still served (the oldest pending connections make
/// room), the read-only port too, and a flood holds no more than the pending budgets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_flood_without_credentials_does_not_starve_authorized_clients() {
    let pki = Pki::new();
    let agent = start_with(&pki, tempfile::tempdir().unwrap(), |mut c| {
        c.acceptor.max_connections = 16;
        c.acceptor.max_pending = 8;
        c.acceptor.handshake_timeout = Duration::from_secs(120);
        c.acceptor.header_read_timeout = Duration::from_secs(120);
        c
    })
    .await;
    let flood = Flood {
        idle: 800,
        stalled: 100,
        read_only: 200,
        rounds: 10,
    };
    let held = flood_while_serving(&agent, flood).await;
    // Of the flood, at most the pending budgets (8 per listener) are still connected.
    assert!(
        held <= 16,
        "{held} flood connections still held by the server"
    );
    agent.shutdown.cancel();
    let _ = agent.task.await;
}

/// The same at the scale of a real flood and with the caps the server derives from its
/// descriptor limit: 5,000 idle connections and 500 stalled handshakes on the kubelet API,
/// 1,000 more on the read-only port; every authorized request and every healthz probe is
/// answered, and the server holds no more than its pending budgets of the flood.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_thousand_idle_connections_and_500_stalled_handshakes_starve_no_authorized_client() {
    // Client and server ends live in this process: about two descriptors per connection the
    // server still holds, one per connection it closed.
    let want = 16_384;
    let limit = kubelet_testenv::raise_nofile_limit(want);
    let scale = |n: usize| n * usize::try_from(limit.min(want)).unwrap_or(0) / want as usize;
    let pki = Pki::new();
    let mut pending = 0;
    let agent = start_with(&pki, tempfile::tempdir().unwrap(), |mut c| {
        c = c.healthz_port(free_port());
        c.acceptor.handshake_timeout = Duration::from_secs(120);
        c.acceptor.header_read_timeout = Duration::from_secs(120);
        pending = c.acceptor.max_pending;
        c
    })
    .await;
    let flood = Flood {
        idle: scale(5_500),
        stalled: scale(500),
        read_only: scale(1_000),
        rounds: 10,
    };
    if limit < want {
        eprintln!(
            "descriptor limit {limit} (< {want}): the flood is scaled to {} connections",
            flood.idle + flood.read_only
        );
    }
    let held = flood_while_serving(&agent, flood).await;
    // Three listeners (API, read-only, healthz), each with its own pending budget.
    assert!(
        held <= 3 * pending,
        "{held} flood connections still held by the server (pending budget {pending})"
    );
    agent.shutdown.cancel();
    let _ = agent.task.await;
}
