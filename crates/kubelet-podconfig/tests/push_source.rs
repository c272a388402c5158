//! The push endpoint through the merge, with real HTTP(S) clients, with and without
//! credentials.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use kubelet_api::{EventRecorder, PodOp, PodUpdate};
use kubelet_core::merge::PodConfig;
use kubelet_podconfig::{PushSource, PushSourceConfig};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const NODE: &str = "node1";
const TOKEN: &str = "s3cret-token";
const ARRIVAL: Duration = Duration::from_secs(10);
const QUIET: Duration = Duration::from_millis(700);

fn pod_json(name: &str, image: &str) -> String {
    format!(
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}"}},"spec":{{"containers":[{{"name":"app","image":"{image}"}}]}}}}"#
    )
}

fn pod_yaml(name: &str, image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n  - name: app\n    image: {image}\n"
    )
}

struct Harness {
    addr: SocketAddr,
    updates: mpsc::Receiver<PodUpdate>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Harness {
    async fn start(source: PushSource) -> Self {
        let addr = source.local_addr();
        let mut config = PodConfig::new(EventRecorder::log_only());
        config.add_source(Arc::new(source)).expect("one source");
        let shutdown = CancellationToken::new();
        let (updates, run) = config.start(shutdown.clone());
        let task = tokio::spawn(run);
        let mut h = Self {
            addr,
            updates,
            shutdown,
            task,
        };
        // The endpoint marks itself seen with an empty snapshot.
        let u = h.next().await;
        assert_eq!(
            (u.op, u.pods.len(), u.source.as_str()),
            (PodOp::Add, 0, "push")
        );
        h
    }

    async fn next(&mut self) -> PodUpdate {
        tokio::time::timeout(ARRIVAL, self.updates.recv())
            .await
            .expect("an update in time")
            .expect("update channel open")
    }

    async fn assert_quiet(&mut self) {
        if let Ok(Some(u)) = tokio::time::timeout(QUIET, self.updates.recv()).await {
            panic!("unexpected update {:?} of {} pods", u.op, u.pods.len());
        }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("pod config stops")
            .expect("no panic");
    }
}

struct Reply {
    status: u16,
    body: serde_json::Value,
}

/// One request over a fresh connection.
async fn request_over<S>(
    stream: S,
    method: &str,
    path: &str,
    auth: Option<&str>,
    content_type: Option<&str>,
    body: &str,
) -> Reply
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost");
    if let Some(a) = auth {
        req = req.header("authorization", a);
    }
    if let Some(ct) = content_type {
        req = req.header("content-type", ct);
    }
    let req = req
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request");
    let resp = sender.send_request(req).await.expect("response");
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let body = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    Reply { status, body }
}

async fn http(addr: SocketAddr, method: &str, path: &str, auth: Option<&str>, body: &str) -> Reply {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    request_over(tcp, method, path, auth, Some("application/json"), body).await
}

async fn token_source() -> (PushSource, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("# pushers\n\n{TOKEN}\nother-token\n")).expect("write");
    let source = PushSource::bind(
        PushSourceConfig::default()
            .address(SocketAddr::from(([127, 0, 0, 1], 0)))
            .token_file(&tokens),
        NODE,
    )
    .await
    .expect("bind");
    (source, dir)
}

const BEARER: &str = "Bearer s3cret-token";

#[tokio::test]
async fn the_endpoint_binds_localhost_by_default() {
    let config = PushSourceConfig::default();
    assert!(config.address.ip().is_loopback());
}

#[tokio::test]
async fn requests_without_valid_credentials_are_refused_and_change_nothing() {
    let (source, _dir) = token_source().await;
    let mut h = Harness::start(source).await;
    let body = pod_json("web", "busybox");

    let r = http(h.addr, "POST", "/pods", None, &body).await;
    assert_eq!(r.status, 401);
    assert_eq!(r.body["kind"], "Status");
    assert_eq!(r.body["reason"], "Unauthorized");
    let r = http(h.addr, "POST", "/pods", Some("Bearer wrong"), &body).await;
    assert_eq!(r.status, 403);
    assert_eq!(r.body["reason"], "Forbidden");
    let r = http(h.addr, "POST", "/pods", Some("Basic dXNlcjpwYXNz"), &body).await;
    assert_eq!(r.status, 403);
    let r = http(h.addr, "GET", "/pods", None, "").await;
    assert_eq!(r.status, 401);
    h.assert_quiet().await;

    // Nothing was stored either.
    let r = http(h.addr, "GET", "/pods", Some(BEARER), "").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["items"], serde_json::json!([]));
    h.stop().await;
}

#[tokio::test]
async fn pods_are_added_replaced_and_deleted_with_a_token() {
    let (source, _dir) = token_source().await;
    let mut h = Harness::start(source).await;

    let r = http(
        h.addr,
        "POST",
        "/pods",
        Some(BEARER),
        &pod_json("web", "busybox:1"),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.body["metadata"]["name"], "web-node1");
    // Accepted as the merge will store it: marked with this source and the time it was seen.
    let seen = r.body["metadata"]["annotations"]["kubernetes.io/config.seen"].clone();
    assert_eq!(
        r.body["metadata"]["annotations"]["kubernetes.io/config.source"],
        "push"
    );
    assert!(seen.is_string(), "{}", r.body);
    let u = h.next().await;
    assert_eq!(u.op, PodOp::Add);
    assert_eq!(u.pods[0].metadata.name.as_deref(), Some("web-node1"));
    assert_eq!(
        u.pods[0]
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("kubernetes.io/config.seen"))
            .map(String::as_str),
        seen.as_str()
    );
    let uid1 = u.pods[0].metadata.uid.clone().expect("uid");

    // The same name again: a conflict, nothing changes.
    let r = http(
        h.addr,
        "POST",
        "/pods",
        Some("Bearer other-token"),
        &pod_json("web", "x"),
    )
    .await;
    assert_eq!(r.status, 409);
    assert_eq!(r.body["reason"], "AlreadyExists");
    h.assert_quiet().await;

    // PUT as YAML replaces it: a new manifest, a new UID.
    let addr = h.addr;
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let r = request_over(
        tcp,
        "PUT",
        "/pods/default/web",
        Some(BEARER),
        Some("application/yaml"),
        &pod_yaml("web", "busybox:2"),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let u = h.next().await;
    assert_eq!(
        (u.op, u.pods[0].metadata.uid.clone()),
        (PodOp::Remove, Some(uid1))
    );
    let u = h.next().await;
    assert_eq!(u.op, PodOp::Add);
    assert_eq!(
        u.pods[0]
            .spec
            .as_ref()
            .and_then(|s| s.containers[0].image.as_deref()),
        Some("busybox:2")
    );

    // PUT of a new name creates it.
    let r = http(
        h.addr,
        "PUT",
        "/pods/kube-system/agent",
        Some(BEARER),
        &pod_json("agent", "a"),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let u = h.next().await;
    assert_eq!(u.op, PodOp::Add);
    assert_eq!(u.pods[0].metadata.namespace.as_deref(), Some("kube-system"));

    // A PUT whose body names another pod is refused.
    let r = http(
        h.addr,
        "PUT",
        "/pods/default/web",
        Some(BEARER),
        &pod_json("other", "a"),
    )
    .await;
    assert_eq!(r.status, 400);
    h.assert_quiet().await;

    let r = http(h.addr, "GET", "/pods", Some(BEARER), "").await;
    assert_eq!(r.body["kind"], "PodList");
    assert_eq!(r.body["items"].as_array().map(Vec::len), Some(2));

    let r = http(h.addr, "DELETE", "/pods/default/web", Some(BEARER), "").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["status"], "Success");
    let u = h.next().await;
    assert_eq!(u.op, PodOp::Remove);
    assert_eq!(u.pods[0].metadata.name.as_deref(), Some("web-node1"));
    let r = http(h.addr, "DELETE", "/pods/default/web", Some(BEARER), "").await;
    assert_eq!(r.status, 404);
    assert_eq!(r.body["reason"], "NotFound");
    h.stop().await;
}

#[tokio::test]
async fn invalid_pods_get_a_422_status_with_the_reasons_and_change_nothing() {
    let (source, _dir) = token_source().await;
    let mut h = Harness::start(source).await;
    let bad = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web"},"spec":{
        "containers":[{"name":"app"},{"name":"app","image":"i"}],
        "volumes":[{"name":"s","secret":{"secretName":"x"}}]}}"#;
    let r = http(h.addr, "POST", "/pods", Some(BEARER), bad).await;
    assert_eq!(r.status, 422, "{}", r.body);
    assert_eq!(r.body["kind"], "Status");
    assert_eq!(r.body["apiVersion"], "v1");
    assert_eq!(r.body["status"], "Failure");
    assert_eq!(r.body["reason"], "Invalid");
    assert_eq!(r.body["code"], 422);
    assert_eq!(r.body["details"]["name"], "web");
    assert_eq!(r.body["details"]["kind"], "Pod");
    let causes = r.body["details"]["causes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        causes,
        vec![
            serde_json::json!({"reason":"FieldValueRequired","message":"Required value","field":"spec.containers[0].image"}),
            serde_json::json!({"reason":"FieldValueDuplicate","message":"Duplicate value: \"app\"","field":"spec.containers[1].name"}),
            serde_json::json!({"reason":"FieldValueInvalid","message":"static pods may not reference secrets"}),
        ]
    );
    let message = r.body["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("Pod \"web\" is invalid: ["),
        "{message}"
    );

    // Garbage and a non-pod are bad requests.
    let r = http(h.addr, "POST", "/pods", Some(BEARER), "{not json").await;
    assert_eq!(r.status, 400);
    let r = http(
        h.addr,
        "POST",
        "/pods",
        Some(BEARER),
        r#"{"apiVersion":"v1","kind":"Secret"}"#,
    )
    .await;
    assert_eq!(r.status, 400);
    h.assert_quiet().await;
    h.stop().await;
}

struct Pki {
    dir: tempfile::TempDir,
    ca: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

impl Pki {
    fn new() -> Self {
        let ca_key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = params.self_signed(&ca_key).expect("ca");
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).expect("write");
        Self { dir, ca, ca_key }
    }

    /// A leaf certificate and key, as DER.
    fn leaf(
        &self,
        name: &str,
    ) -> (
        CertificateDer<'static>,
        PrivateKeyDer<'static>,
        String,
        String,
    ) {
        let key = rcgen::KeyPair::generate().expect("key");
        let params = rcgen::CertificateParams::new(vec![name.to_string()]).expect("params");
        let cert = params
            .signed_by(&key, &self.ca, &self.ca_key)
            .expect("cert");
        let der = cert.der().clone();
        let key_der = PrivateKeyDer::try_from(key.serialize_der()).expect("key der");
        (der, key_der, cert.pem(), key.serialize_pem())
    }

    fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(name)
    }
}

fn client_tls(
    ca: &Pki,
    cert: Option<(CertificateDer<'static>, PrivateKeyDer<'static>)>,
) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.ca.der().clone()).expect("root");
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots);
    let config = match cert {
        Some((c, k)) => builder
            .with_client_auth_cert(vec![c], k)
            .expect("client cert"),
        None => builder.with_no_client_auth(),
    };
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

#[tokio::test]
async fn a_client_certificate_from_the_client_ca_is_accepted_over_https() {
    let pki = Pki::new();
    let (_, _, server_pem, server_key) = pki.leaf("localhost");
    std::fs::write(pki.path("tls.crt"), server_pem).expect("write");
    std::fs::write(pki.path("tls.key"), server_key).expect("write");
    let source = PushSource::bind(
        PushSourceConfig::default()
            .address(SocketAddr::from(([127, 0, 0, 1], 0)))
            .tls(pki.path("tls.crt"), pki.path("tls.key"))
            .client_ca_file(pki.path("ca.pem")),
        NODE,
    )
    .await
    .expect("bind");
    assert!(source.is_tls());
    let mut h = Harness::start(source).await;
    let name = ServerName::try_from("localhost").expect("name");

    // Over TLS but without a client certificate or token: 401.
    let tcp = TcpStream::connect(h.addr).await.expect("connect");
    let tls = client_tls(&pki, None)
        .connect(name.clone(), tcp)
        .await
        .expect("tls");
    let r = request_over(tls, "POST", "/pods", None, None, &pod_json("web", "i")).await;
    assert_eq!(r.status, 401);
    h.assert_quiet().await;

    // A certificate of another CA fails the handshake (or the first request).
    let other = Pki::new();
    let (c, k, _, _) = other.leaf("pusher");
    let tcp = TcpStream::connect(h.addr).await.expect("connect");
    if let Ok(tls) = client_tls(&pki, Some((c, k)))
        .connect(name.clone(), tcp)
        .await
    {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .expect("handshake");
        tokio::spawn(conn);
        let req = hyper::Request::post("/pods")
            .header("host", "localhost")
            .body(Full::new(Bytes::from(pod_json("web", "i"))))
            .expect("request");
        assert!(
            sender.send_request(req).await.is_err(),
            "rejected certificate"
        );
    }
    h.assert_quiet().await;

    // A certificate of the client CA: accepted, no token needed.
    let (c, k, _, _) = pki.leaf("pusher");
    let tcp = TcpStream::connect(h.addr).await.expect("connect");
    let tls = client_tls(&pki, Some((c, k)))
        .connect(name, tcp)
        .await
        .expect("tls");
    let r = request_over(
        tls,
        "POST",
        "/pods",
        None,
        Some("application/json"),
        &pod_json("web", "i"),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let u = h.next().await;
    assert_eq!(u.op, PodOp::Add);
    h.stop().await;
}

/// Raw HTTP/1.1 exchange: write `head`, read what comes back within `wait`.
async fn raw_exchange(addr: SocketAddr, head: &str, wait: Duration) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = TcpStream::connect(addr).await.expect("connect");
    tcp.write_all(head.as_bytes()).await.expect("write");
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(wait, tcp.read_to_end(&mut raw)).await;
    String::from_utf8_lossy(&raw).into_owned()
}

#[tokio::test]
async fn an_oversized_body_is_refused_before_it_is_read() {
    let (source, _dir) = token_source().await;
    let mut h = Harness::start(source).await;
    // 99,999,999,999 bytes announced, none sent: 413 at once, not a wait for the body.
    let started = std::time::Instant::now();
    let reply = raw_exchange(
        h.addr,
        &format!(
            "POST /pods HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: 99999999999\r\n\r\n"
        ),
        Duration::from_secs(5),
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
    assert!(reply.contains("RequestEntityTooLarge"), "{reply}");
    assert!(started.elapsed() < Duration::from_secs(5));
    h.assert_quiet().await;
    // A pod still goes through afterwards.
    let ok = http(
        h.addr,
        "POST",
        "/pods",
        Some(&format!("Bearer {TOKEN}")),
        &pod_json("after", "busybox"),
    )
    .await;
    assert_eq!(ok.status, 201);
    let u = h.next().await;
    assert_eq!(u.pods.len(), 1);
    h.stop().await;
}

/// Read merged updates until one satisfies `pred`.
async fn wait_for_update(
    updates: &mut tokio::sync::mpsc::Receiver<kubelet_api::PodUpdate>,
    pred: impl Fn(&kubelet_api::PodUpdate) -> bool,
) {
    loop {
        let u = tokio::time::timeout(ARRIVAL, updates.recv())
            .await
            .expect("an update")
            .expect("open");
        if pred(&u) {
            return;
        }
    }
}

#[tokio::test]
async fn a_pushed_pod_whose_name_a_file_pod_holds_gets_a_409_naming_the_source() {
    let manifests = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        manifests.path().join("web.yaml"),
        pod_yaml("web", "nginx:1"),
    )
    .expect("write");
    let (push, _dir) = token_source().await;
    let addr = push.local_addr();
    let mut config = PodConfig::new(EventRecorder::log_only());
    config.add_source(Arc::new(push)).expect("push");
    config
        .add_source(Arc::new(kubelet_podconfig::FileSource::new(
            manifests.path(),
            NODE,
        )))
        .expect("file");
    let shutdown = CancellationToken::new();
    let (mut updates, run) = config.start(shutdown.clone());
    let task = tokio::spawn(run);
    // Wait until the file pod has been merged.
    wait_for_update(&mut updates, |u| u.source == "file" && !u.pods.is_empty()).await;
    let reply = http(
        addr,
        "POST",
        "/pods",
        Some(BEARER),
        &pod_json("web", "nginx:2"),
    )
    .await;
    assert_eq!(reply.status, 409, "{}", reply.body);
    assert_eq!(reply.body["reason"], "AlreadyExists");
    let message = reply.body["message"].as_str().unwrap_or_default();
    assert!(message.contains("\"file\""), "{message}");
    let reply = http(
        addr,
        "PUT",
        "/pods/default/web",
        Some(BEARER),
        &pod_json("web", "nginx:2"),
    )
    .await;
    assert_eq!(reply.status, 409);
    // Another name goes through.
    let ok = http(
        addr,
        "POST",
        "/pods",
        Some(BEARER),
        &pod_json("api", "nginx:2"),
    )
    .await;
    assert_eq!(ok.status, 201);
    // Once the file pod is gone, its name is free.
    std::fs::remove_file(manifests.path().join("web.yaml")).expect("remove manifest");
    wait_for_update(&mut updates, |u| {
        u.source == "file" && u.op == kubelet_api::PodOp::Remove
    })
    .await;
    let freed = http(
        addr,
        "POST",
        "/pods",
        Some(BEARER),
        &pod_json("web", "nginx:2"),
    )
    .await;
    assert_eq!(freed.status, 201, "{}", freed.body);
    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
}

/// Requests do not wait for the merge: while the consumer is busy, a burst of pushes is
/// answered at once and delivered in a few snapshots, the last one holding every pod (one
/// snapshot of up to N pods per push made a burst of N pushes quadratic).
#[tokio::test]
async fn a_burst_of_pushes_is_answered_at_once_and_delivered_in_a_few_snapshots() {
    use kubelet_api::{PodSource, SourceSender};
    let (source, _dir) = token_source().await;
    let addr = source.local_addr();
    // Room for one snapshot, and nobody reads until the burst is over.
    let (tx, mut rx) = mpsc::channel(1);
    let out = SourceSender::new("push", tx, EventRecorder::log_only());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { source.run(out, shutdown).await }
    });
    for i in 0..50 {
        let r = tokio::time::timeout(
            ARRIVAL,
            http(
                addr,
                "POST",
                "/pods",
                Some(BEARER),
                &pod_json(&format!("p{i}"), "busybox"),
            ),
        )
        .await
        .expect("answered while the consumer is busy");
        assert_eq!(r.status, 201, "{}", r.body);
    }
    let mut sizes = Vec::new();
    while let Ok(Some(s)) = tokio::time::timeout(QUIET, rx.recv()).await {
        sizes.push(s.pods.len());
    }
    assert_eq!(
        sizes.first(),
        Some(&0),
        "the empty first snapshot: {sizes:?}"
    );
    assert_eq!(sizes.last(), Some(&50), "{sizes:?}");
    assert!(sizes.len() <= 3, "{sizes:?}");
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the endpoint stops")
        .expect("no panic");
}
