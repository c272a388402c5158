//! The manifest URL source through the merge, against a real local HTTP(S) server.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use kubelet_api::{Event, EventRecorder, PodOp, PodUpdate};
use kubelet_core::merge::PodConfig;
use kubelet_podconfig::{HttpSource, HttpSourceConfig};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const NODE: &str = "node1";
const ARRIVAL: Duration = Duration::from_secs(10);
/// Several poll periods.
const QUIET: Duration = Duration::from_millis(1200);
const PERIOD: Duration = Duration::from_millis(150);

/// A tiny shared cell.
#[derive(Clone, Default)]
struct Shared<T>(Arc<std::sync::Mutex<T>>);

impl<T: Clone> Shared<T> {
    fn set(&self, v: T) {
        *self.0.lock().expect("lock") = v;
    }
    fn get(&self) -> T {
        self.0.lock().expect("lock").clone()
    }
    fn update(&self, f: impl FnOnce(&mut T)) {
        f(&mut self.0.lock().expect("lock"))
    }
}

#[derive(Clone, Default)]
struct Served {
    status: u16,
    body: String,
    /// Headers of every request, as (name, value).
    seen_headers: Vec<Vec<(String, String)>>,
    /// Never answer (to test the client timeout).
    hang: bool,
}

/// A real HTTP server on 127.0.0.1 answering every GET with what `served` says.
struct Server {
    url: String,
    served: Shared<Served>,
    shutdown: CancellationToken,
}

impl Server {
    async fn start(tls: Option<Arc<rustls::ServerConfig>>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let served = Shared::default();
        served.set(Served {
            status: 200,
            ..Default::default()
        });
        let shutdown = CancellationToken::new();
        let (s, token) = (served.clone(), shutdown.clone());
        let scheme = if tls.is_some() { "https" } else { "http" };
        let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
        tokio::spawn(async move {
            loop {
                let (tcp, _) = tokio::select! {
                    _ = token.cancelled() => return,
                    r = listener.accept() => match r { Ok(c) => c, Err(_) => continue },
                };
                let (s, token, acceptor) = (s.clone(), token.clone(), acceptor.clone());
                tokio::spawn(async move {
                    let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let s = s.clone();
                        let token = token.clone();
                        async move {
                            let headers = req
                                .headers()
                                .iter()
                                .map(|(k, v)| {
                                    (k.to_string(), v.to_str().unwrap_or_default().to_string())
                                })
                                .collect();
                            s.update(|x| x.seen_headers.push(headers));
                            let now = s.get();
                            if now.hang {
                                token.cancelled().await;
                            }
                            let resp = hyper::Response::builder()
                                .status(now.status)
                                .body(Full::new(Bytes::from(now.body)))
                                .expect("response");
                            Ok::<_, Infallible>(resp)
                        }
                    });
                    match acceptor {
                        Some(a) => {
                            if let Ok(tls) = a.accept(tcp).await {
                                let _ = hyper::server::conn::http1::Builder::new()
                                    .serve_connection(TokioIo::new(tls), service)
                                    .await;
                            }
                        }
                        None => {
                            let _ = hyper::server::conn::http1::Builder::new()
                                .serve_connection(TokioIo::new(tcp), service)
                                .await;
                        }
                    }
                });
            }
        });
        Self {
            url: format!("{scheme}://localhost:{}/manifests", addr.port()),
            served,
            shutdown,
        }
    }

    fn serve(&self, status: u16, body: &str) {
        self.served.update(|s| {
            s.status = status;
            s.body = body.to_string();
        });
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

struct Harness {
    updates: mpsc::Receiver<PodUpdate>,
    events: mpsc::Receiver<Event>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Harness {
    fn start(source: HttpSource) -> Self {
        let (recorder, events) = EventRecorder::channel(100);
        let mut config = PodConfig::new(recorder);
        config.add_source(Arc::new(source)).expect("one source");
        let shutdown = CancellationToken::new();
        let (updates, run) = config.start(shutdown.clone());
        let task = tokio::spawn(run);
        Self {
            updates,
            events,
            shutdown,
            task,
        }
    }

    async fn next(&mut self) -> PodUpdate {
        tokio::time::timeout(ARRIVAL, self.updates.recv())
            .await
            .expect("an update in time")
            .expect("update channel open")
    }

    async fn assert_quiet(&mut self) {
        if let Ok(Some(u)) = tokio::time::timeout(QUIET, self.updates.recv()).await {
            panic!("unexpected update {:?} {:?}", u.op, names(&u));
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

fn names(u: &PodUpdate) -> Vec<String> {
    u.pods
        .iter()
        .map(|p| p.metadata.name.clone().unwrap_or_default())
        .collect()
}

fn pod_yaml(name: &str, image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n  - name: app\n    image: {image}\n"
    )
}

fn source(url: &str) -> HttpSource {
    HttpSource::new(
        url,
        NODE,
        HttpSourceConfig::default().check_frequency(PERIOD),
    )
    .expect("valid source")
}

#[tokio::test]
async fn serving_changing_failing_and_emptying_the_url() {
    let server = Server::start(None).await;
    server.serve(200, &pod_yaml("web", "busybox:1"));
    let mut h = Harness::start(source(&server.url));

    let u = h.next().await;
    assert_eq!(
        (u.op, names(&u)),
        (PodOp::Add, vec!["web-node1".to_string()])
    );
    let uid1 = u.pods[0].metadata.uid.clone().expect("uid");
    assert_eq!(u.source, "http");
    // Static pods from a URL get no NoExecute toleration (that is the file source's).
    assert!(
        u.pods[0]
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.as_ref())
            .is_none()
    );

    // The same body, polled many times: nothing.
    h.assert_quiet().await;

    // A changed manifest: a new UID, so the old pod is removed and the new one added.
    server.serve(200, &pod_yaml("web", "busybox:2"));
    let u = h.next().await;
    assert_eq!(
        (u.op, u.pods[0].metadata.uid.clone()),
        (PodOp::Remove, Some(uid1))
    );
    let u = h.next().await;
    assert_eq!(u.op, PodOp::Add);
    let image = u.pods[0]
        .spec
        .as_ref()
        .and_then(|s| s.containers[0].image.clone());
    assert_eq!(image.as_deref(), Some("busybox:2"));

    // Failing: the last good set stays.
    server.serve(500, "boom");
    h.assert_quiet().await;
    server.serve(404, "");
    h.assert_quiet().await;

    // An empty body is an empty snapshot: the pod goes.
    server.serve(200, "");
    let u = h.next().await;
    assert_eq!(
        (u.op, names(&u)),
        (PodOp::Remove, vec!["web-node1".to_string()])
    );
    h.assert_quiet().await;

    // The same manifest as before the empty body comes back as an ADD.
    server.serve(200, &pod_yaml("web", "busybox:2"));
    let u = h.next().await;
    assert_eq!(
        (u.op, names(&u)),
        (PodOp::Add, vec!["web-node1".to_string()])
    );
    h.stop().await;
}

#[tokio::test]
async fn an_empty_first_body_marks_the_source_seen() {
    let server = Server::start(None).await;
    server.serve(200, "");
    let mut h = Harness::start(source(&server.url));
    let u = h.next().await;
    assert_eq!((u.op, u.pods.len()), (PodOp::Add, 0));
    h.stop().await;
}

#[tokio::test]
async fn a_non_200_first_answer_sends_nothing_until_the_url_works() {
    let server = Server::start(None).await;
    server.serve(503, "unavailable");
    let mut h = Harness::start(source(&server.url));
    h.assert_quiet().await;
    server.serve(200, &pod_yaml("web", "busybox"));
    let u = h.next().await;
    assert_eq!(
        (u.op, names(&u)),
        (PodOp::Add, vec!["web-node1".to_string()])
    );
    h.stop().await;
}

#[tokio::test]
async fn a_pod_list_body_yields_every_pod_and_one_invalid_item_rejects_the_body() {
    let server = Server::start(None).await;
    let list = r#"{"apiVersion":"v1","kind":"PodList","items":[
        {"metadata":{"name":"a"},"spec":{"containers":[{"name":"c","image":"i"}]}},
        {"metadata":{"name":"b"},"spec":{"containers":[{"name":"c","image":"i"}]}}]}"#;
    server.serve(200, list);
    let mut h = Harness::start(source(&server.url));
    let u = h.next().await;
    assert_eq!(
        (u.op, names(&u)),
        (
            PodOp::Add,
            vec!["a-node1".to_string(), "b-node1".to_string()]
        )
    );

    let bad = list.replace(
        r#""name":"b"},"spec":{"containers":[{"name":"c","image":"i"}]"#,
        r#""name":"b"},"spec":{"containers":[{"name":"c"}]"#,
    );
    server.serve(200, &bad);
    let ev = tokio::time::timeout(ARRIVAL, h.events.recv())
        .await
        .expect("an event")
        .expect("open");
    assert_eq!(ev.reason, "FailedValidation");
    assert!(
        ev.message
            .contains("spec.containers[0].image: Required value"),
        "{}",
        ev.message
    );
    // The last good set stays, and the same bad body is reported once.
    h.assert_quiet().await;
    assert!(h.events.try_recv().is_err());
    h.stop().await;
}

#[tokio::test]
async fn configured_headers_are_sent_with_every_poll() {
    let server = Server::start(None).await;
    server.serve(200, &pod_yaml("web", "busybox"));
    let src = HttpSource::new(
        &server.url,
        NODE,
        HttpSourceConfig::default()
            .check_frequency(PERIOD)
            .header("Authorization", "Bearer s3cret")
            .header("X-Node", "node1"),
    )
    .expect("source");
    let mut h = Harness::start(src);
    h.next().await;
    tokio::time::sleep(PERIOD * 3).await;
    let seen = server.served.get().seen_headers;
    assert!(seen.len() >= 2, "polled repeatedly: {}", seen.len());
    for headers in seen {
        assert!(headers.contains(&("authorization".to_string(), "Bearer s3cret".to_string())));
        assert!(headers.contains(&("x-node".to_string(), "node1".to_string())));
    }
    h.stop().await;
}

#[tokio::test]
async fn a_hanging_server_times_out_and_keeps_polling() {
    let server = Server::start(None).await;
    server.served.update(|s| s.hang = true);
    let src = HttpSource::new(
        &server.url,
        NODE,
        HttpSourceConfig::default()
            .check_frequency(PERIOD)
            .timeout(Duration::from_millis(300)),
    )
    .expect("source");
    let err = src.fetch().await.expect_err("times out");
    assert!(err.to_string().contains("timed out"), "{err}");
    let mut h = Harness::start(src);
    h.assert_quiet().await;
    server.served.update(|s| {
        s.hang = false;
        s.body = pod_yaml("web", "busybox");
    });
    let u = h.next().await;
    assert_eq!(u.op, PodOp::Add);
    h.stop().await;
}

struct Pki {
    _dir: tempfile::TempDir,
    ca_file: std::path::PathBuf,
    server: Arc<rustls::ServerConfig>,
}

fn pki() -> Pki {
    let ca_key = rcgen::KeyPair::generate().expect("key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).expect("ca");
    let key = rcgen::KeyPair::generate().expect("key");
    let params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).expect("params");
    let cert = params.signed_by(&key, &ca, &ca_key).expect("cert");
    let dir = tempfile::tempdir().expect("tempdir");
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).expect("write");
    let cert_file = dir.path().join("tls.crt");
    let key_file = dir.path().join("tls.key");
    std::fs::write(&cert_file, cert.pem()).expect("write");
    std::fs::write(&key_file, key.serialize_pem()).expect("write");
    let server = kubelet_net::tls::server_config(
        kubelet_net::tls::ReloadingIdentity::load(&cert_file, &key_file).expect("pair"),
        None,
    )
    .expect("server config");
    Pki {
        _dir: dir,
        ca_file,
        server,
    }
}

#[tokio::test]
async fn https_urls_are_verified_against_the_ca_file() {
    let pki = pki();
    let server = Server::start(Some(pki.server.clone())).await;
    server.serve(200, &pod_yaml("web", "busybox"));
    assert!(server.url.starts_with("https://"));

    // Not trusted by the system roots: the handshake fails.
    let untrusted = source(&server.url);
    let err = untrusted.fetch().await.expect_err("unknown CA");
    assert!(
        err.to_string().contains("invalid peer certificate"),
        "{err}"
    );

    let trusted = HttpSource::new(
        &server.url,
        NODE,
        HttpSourceConfig::default()
            .check_frequency(PERIOD)
            .ca_file(&pki.ca_file),
    )
    .expect("source");
    let mut h = Harness::start(trusted);
    let u = h.next().await;
    assert_eq!(
        (u.op, names(&u)),
        (PodOp::Add, vec!["web-node1".to_string()])
    );
    h.stop().await;
}
