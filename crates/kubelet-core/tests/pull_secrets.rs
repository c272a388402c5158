//! Image pulls with the pod's image pull secrets (and its service account's), on the in-memory
//! runtime: which credentials are tried, what the pod reports when they are wrong, and that no
//! credential reaches an event or a status.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    Container, LocalObjectReference, Pod, PodSpec, PodStatus, Secret, ServiceAccount,
};
use kubelet_api::{ContainerRuntime, ObjectProvider, StaticObjects};
use kubelet_core::testing::{FakeRuntime, RecordingSink, WatchSource};
use kubelet_core::{KubeletBuilder, KubeletConfig};
use kubelet_pleg::{GenericPleg, GenericPlegConfig};
use tokio_util::sync::CancellationToken;

const IMAGE: &str = "registry.example.com:5000/team/app:v1";

fn pull_secret(name: &str, json: &str) -> Secret {
    let mut s = Secret {
        type_: Some("kubernetes.io/dockerconfigjson".into()),
        data: Some(
            [(
                ".dockerconfigjson".to_string(),
                ByteString(json.as_bytes().to_vec()),
            )]
            .into_iter()
            .collect(),
        ),
        ..Default::default()
    };
    s.metadata.name = Some(name.into());
    s.metadata.namespace = Some("default".into());
    s
}

fn auths(user: &str, password: &str) -> String {
    format!(
        r#"{{"auths": {{"registry.example.com:5000": {{"username": "{user}", "password": "{password}"}}}}}}"#
    )
}

fn pod(uid: &str, secrets: &[&str], service_account: Option<&str>) -> Pod {
    let mut p = Pod {
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "app".into(),
                image: Some(IMAGE.into()),
                command: Some(vec!["sleep".into(), "1000".into()]),
                image_pull_policy: Some("IfNotPresent".into()),
                ..Default::default()
            }],
            image_pull_secrets: (!secrets.is_empty()).then(|| {
                secrets
                    .iter()
                    .map(|s| LocalObjectReference {
                        name: s.to_string(),
                    })
                    .collect()
            }),
            service_account_name: service_account.map(str::to_string),
            host_network: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    };
    p.metadata.name = Some(format!("pod-{uid}"));
    p.metadata.namespace = Some("default".into());
    p.metadata.uid = Some(uid.into());
    p
}

struct Agent {
    /// The source's sender: the source stays open while the agent runs.
    _pods: tokio::sync::watch::Sender<Option<Vec<Pod>>>,
    rt: Arc<FakeRuntime>,
    sink: Arc<RecordingSink>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Agent {
    fn start(objects: impl ObjectProvider, pods: Vec<Pod>) -> Self {
        let rt = Arc::new(FakeRuntime::new());
        rt.set_images_present_by_default(false);
        rt.require_pull_credentials("registry.example.com:5000/", "alice", "s3cr3t-pw");
        let runtime: Arc<dyn ContainerRuntime> = rt.clone();
        let (pleg, events) = GenericPleg::new(runtime.clone(), GenericPlegConfig::default());
        let sink = Arc::new(RecordingSink::new());
        let (source, pods) = WatchSource::new(Some(pods));
        let dir = tempfile::tempdir().unwrap().keep();
        let kubelet = KubeletBuilder::new("node-1")
            .config(KubeletConfig::with_dirs(dir.join("root"), dir.join("logs")))
            .runtime(runtime)
            .pleg(Arc::new(pleg), events)
            .pod_source(Arc::new(source))
            .status_sink(sink.clone())
            .object_provider(Arc::new(objects))
            .build()
            .unwrap();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(kubelet.run(shutdown.clone()));
        Self {
            _pods: pods,
            rt,
            sink,
            shutdown,
            task,
        }
    }

    async fn wait(&self, uid: &str, what: &str, f: impl Fn(&PodStatus) -> bool) {
        let uid = uid.to_string();
        if self
            .sink
            .wait_for(|r| r.uid == uid && f(&r.status), Duration::from_secs(600))
            .await
            .is_none()
        {
            panic!(
                "timed out waiting for {what}: {:#?}",
                self.sink.latest(&uid)
            );
        }
    }

    fn pulls(&self) -> Vec<String> {
        self.rt
            .calls()
            .into_iter()
            .filter(|c| c.starts_with("pull_image"))
            .collect()
    }

    async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }
}

fn running(s: &PodStatus) -> bool {
    s.container_statuses
        .iter()
        .flatten()
        .any(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
}

fn waiting_reason(s: &PodStatus) -> Option<String> {
    s.container_statuses
        .iter()
        .flatten()
        .find_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone())
}

#[tokio::test(start_paused = true)]
async fn the_matching_credentials_are_tried_most_specific_first_until_one_pulls() {
    let objects = StaticObjects::new();
    // A stale secret for the exact repository path, a good one for the registry.
    objects.put_secret(pull_secret(
        "stale",
        r#"{"auths": {"registry.example.com:5000/team": {"username": "bob", "password": "old"}}}"#,
    ));
    objects.put_secret(pull_secret("good", &auths("alice", "s3cr3t-pw")));
    let agent = Agent::start(objects, vec![pod("u1", &["good", "stale"], None)]);
    agent.wait("u1", "running", running).await;
    assert_eq!(
        agent.pulls(),
        [
            format!("pull_image {IMAGE} as bob"),
            format!("pull_image {IMAGE} as alice")
        ]
    );
    agent.stop().await;
}

/// Everything the agent logs, at every level, while the guard lives (this thread's tasks: the
/// test runtime has one thread).
fn capture_logs() -> (
    Arc<parking_lot::Mutex<Vec<u8>>>,
    tracing::subscriber::DefaultGuard,
) {
    #[derive(Clone)]
    struct Buf(Arc<parking_lot::Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let writer = Buf(buf.clone());
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    (buf, tracing::subscriber::set_default(subscriber))
}

#[tokio::test(start_paused = true)]
async fn a_wrong_password_ends_in_image_pull_backoff_and_no_credential_is_reported() {
    let (logs, _guard) = capture_logs();
    let objects = StaticObjects::new();
    objects.put_secret(pull_secret("bad", &auths("alice", "wr0ng-pw")));
    let agent = Agent::start(objects, vec![pod("u1", &["bad"], None)]);
    agent
        .wait("u1", "ErrImagePull", |s| {
            waiting_reason(s).as_deref() == Some("ErrImagePull")
        })
        .await;
    agent
        .wait("u1", "ImagePullBackOff", |s| {
            waiting_reason(s).as_deref() == Some("ImagePullBackOff")
        })
        .await;
    let events = format!("{:?}", agent.sink.events());
    let statuses = format!("{:?}", agent.sink.latest("u1"));
    let log = String::from_utf8_lossy(&logs.lock()).into_owned();
    assert!(
        log.contains("pull with one matching credential failed"),
        "{log}"
    );
    for text in [&events, &statuses, &log] {
        assert!(
            !text.contains("wr0ng-pw") && !text.contains("s3cr3t-pw"),
            "{text}"
        );
    }
    assert!(
        events.contains("unauthorized"),
        "the runtime's message: {events}"
    );
    agent.stop().await;
}

#[tokio::test(start_paused = true)]
async fn the_service_accounts_secrets_serve_a_pod_that_names_none() {
    let objects = StaticObjects::new();
    objects.put_secret(pull_secret("sa-secret", &auths("alice", "s3cr3t-pw")));
    let mut sa = ServiceAccount {
        image_pull_secrets: Some(vec![LocalObjectReference {
            name: "sa-secret".into(),
        }]),
        ..Default::default()
    };
    sa.metadata.name = Some("builder".into());
    sa.metadata.namespace = Some("default".into());
    objects.put_service_account(sa);
    let agent = Agent::start(objects, vec![pod("u1", &[], Some("builder"))]);
    agent.wait("u1", "running", running).await;
    assert_eq!(agent.pulls(), [format!("pull_image {IMAGE} as alice")]);
    agent.stop().await;
}

/// An API server whose Node authorizer refuses the node every service account.
struct NoServiceAccounts(StaticObjects);

#[async_trait::async_trait]
impl ObjectProvider for NoServiceAccounts {
    async fn config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> kubelet_api::Result<Option<k8s_openapi::api::core::v1::ConfigMap>> {
        self.0.config_map(namespace, name).await
    }
    async fn secret(&self, namespace: &str, name: &str) -> kubelet_api::Result<Option<Secret>> {
        self.0.secret(namespace, name).await
    }
    async fn service_account(
        &self,
        namespace: &str,
        name: &str,
    ) -> kubelet_api::Result<Option<ServiceAccount>> {
        Err(kubelet_api::Error::permission_denied(format!(
            "serviceaccounts {name:?} is forbidden in namespace {namespace:?}"
        )))
    }
}

#[tokio::test(start_paused = true)]
async fn a_node_refused_the_service_account_pulls_without_credentials_and_warns_no_one() {
    let (logs, _guard) = capture_logs();
    let objects = StaticObjects::new();
    let agent = Agent::start(
        NoServiceAccounts(objects),
        vec![pod("u1", &[], Some("builder"))],
    );
    // The registry wants credentials: the anonymous pull fails and the pod backs off, as
    // without a service account.
    agent
        .wait("u1", "ErrImagePull", |s| {
            waiting_reason(s).as_deref() == Some("ErrImagePull")
        })
        .await;
    assert_eq!(agent.pulls(), [format!("pull_image {IMAGE}")]);
    let log = String::from_utf8_lossy(&logs.lock()).into_owned();
    let refusal: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("may not read the service account"))
        .collect();
    assert!(!refusal.is_empty(), "{log}");
    assert!(refusal.iter().all(|l| l.contains("DEBUG")), "{refusal:?}");
    assert!(
        !log.lines()
            .any(|l| l.contains("WARN") && l.contains("service account")),
        "{log}"
    );
    agent.stop().await;
}

#[tokio::test(start_paused = true)]
async fn bad_secrets_are_reported_and_the_pod_retries_with_backoff() {
    let objects = StaticObjects::new();
    objects.put_secret(pull_secret("malformed", "{not json"));
    let mut opaque = pull_secret("opaque", &auths("alice", "s3cr3t-pw"));
    opaque.type_ = Some("Opaque".into());
    objects.put_secret(opaque);
    // A missing and a wrongly typed secret are reported and skipped: the pull is anonymous.
    let agent = Agent::start(
        objects.clone(),
        vec![pod("u1", &["missing", "opaque"], None)],
    );
    agent
        .wait("u1", "ErrImagePull", |s| {
            waiting_reason(s).as_deref() == Some("ErrImagePull")
        })
        .await;
    let events = agent.sink.events();
    let failed = events
        .iter()
        .find(|e| e.reason == "FailedToRetrieveImagePullSecret")
        .expect("event");
    assert!(
        failed.message.contains("default/missing") && failed.message.contains("default/opaque"),
        "{}",
        failed.message
    );
    assert_eq!(agent.pulls(), [format!("pull_image {IMAGE}")]);
    agent.stop().await;
    // A malformed one fails the pull before the runtime is asked.
    let agent = Agent::start(objects, vec![pod("u2", &["malformed"], None)]);
    agent
        .wait("u2", "ErrImagePull", |s| {
            waiting_reason(s).as_deref() == Some("ErrImagePull")
        })
        .await;
    let message = agent
        .sink
        .latest("u2")
        .and_then(|s| s.container_statuses?[0].state.clone()?.waiting?.message)
        .unwrap_or_default();
    assert!(message.contains("malformed .dockerconfigjson"), "{message}");
    assert!(agent.pulls().is_empty());
    agent
        .wait("u2", "ImagePullBackOff", |s| {
            waiting_reason(s).as_deref() == Some("ImagePullBackOff")
        })
        .await;
    agent.stop().await;
}
