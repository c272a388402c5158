//! A private containerd per test, started and torn down with `scripts/containerd-test-env.sh`,
//! and an agent harness (engine + relist PLEG + [`CriRuntime`] + an in-test pod source).

#![allow(clippy::unwrap_used)]
#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, PodStatus};
use kubelet_api::runtime::{
    ContainerConfig, ContainerEvent, ContainerEventKind, ContainerEventStream, ContainerFilter,
    ContainerMetadata, ContainerState, Labels, PodSandboxConfig, PodSandboxMetadata, SandboxFilter,
    labels,
};
use kubelet_api::{ContainerRuntime, PodLifecycleEventGenerator, PodSource, SourceSender};
use kubelet_core::testing::RecordingSink;
use kubelet_core::{KubeletBuilder, KubeletConfig};
use kubelet_cri::{CriConfig, CriRuntime};
use kubelet_pleg::{EventedPleg, GenericPleg, GenericPlegConfig, PlegMode};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The node IP the test agents report (every pod's `hostIP`, a host-network pod's `podIP`).
pub const NODE_IP: &str = "192.0.2.77";

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/containerd-test-env.sh")
}

fn required() -> bool {
    std::env::var("KUBELET_SDK_REQUIRE_ROOT").is_ok_and(|v| v == "1")
}

/// A running private containerd. Dropping it removes every pod it ran, stops it and deletes
/// its directory (mounts, network namespaces and bridge included), also when a test fails.
pub struct ContainerdEnv {
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub busybox: String,
    pub pause: String,
    pub subnet: String,
    /// containerd's version, e.g. `1.6.20`.
    pub version: String,
}

/// Which containerd an environment runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Containerd {
    /// The system's (Debian bookworm: 1.6).
    System,
    /// Debian trixie's 1.7, unpacked into a cache by the script (`start17`), not installed.
    V1_7,
}

impl ContainerdEnv {
    /// Starts one on the system's containerd, or returns `None` after printing a skip line when
    /// this machine cannot (not root, no containerd and no way to install it). With
    /// `KUBELET_SDK_REQUIRE_ROOT=1` a missing prerequisite fails the test instead.
    pub fn start(test: &str) -> Option<Self> {
        Self::start_with(test, Containerd::System)
    }

    /// [`start`](Self::start) on containerd 1.7 (fetched once when missing; a machine that
    /// cannot fetch it skips, or fails with `KUBELET_SDK_REQUIRE_ROOT=1`).
    pub fn start_1_7(test: &str) -> Option<Self> {
        Self::start_with(test, Containerd::V1_7)
    }

    pub fn start_with(test: &str, containerd: Containerd) -> Option<Self> {
        let skip = |why: String| -> Option<Self> {
            if required() {
                panic!("{test}: {why} (KUBELET_SDK_REQUIRE_ROOT=1 makes this a failure)");
            }
            eprintln!("SKIP {test}: {why}");
            None
        };
        if !nix::unistd::geteuid().is_root() {
            return skip("needs root to run containerd".into());
        }
        let dir = match tempfile::Builder::new()
            .prefix("ksdk-cri-")
            .tempdir_in("/tmp")
        {
            Ok(d) => d.keep(),
            Err(e) => return skip(format!("creating a temporary directory: {e}")),
        };
        let out = std::process::Command::new("bash")
            .arg(script())
            .arg(match containerd {
                Containerd::System => "start",
                Containerd::V1_7 => "start17",
            })
            .arg(&dir)
            .output();
        let out = match out {
            Ok(o) if o.status.success() => o,
            Ok(o) => {
                let _ = std::process::Command::new("bash")
                    .arg(script())
                    .arg("stop")
                    .arg(&dir)
                    .status();
                return skip(format!(
                    "containerd-test-env.sh start failed: {}",
                    String::from_utf8_lossy(&o.stderr)
                ));
            }
            Err(e) => return skip(format!("running containerd-test-env.sh: {e}")),
        };
        let vars: BTreeMap<String, String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let get = |k: &str| vars.get(k).cloned().unwrap_or_default();
        Some(Self {
            socket: PathBuf::from(get("CONTAINERD_SOCKET")),
            busybox: get("BUSYBOX_IMAGE"),
            pause: get("PAUSE_IMAGE"),
            subnet: get("POD_SUBNET"),
            version: get("CONTAINERD_VERSION"),
            dir,
        })
    }

    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    pub fn cri_config(&self) -> CriConfig {
        CriConfig::new(self.endpoint())
            .request_timeout(Duration::from_secs(60))
            .termination_message_dir(self.dir.join("kubelet/pods"))
    }

    pub async fn runtime(&self) -> Arc<CriRuntime> {
        Arc::new(
            CriRuntime::connect(self.cri_config())
                .await
                .expect("connect to the test containerd"),
        )
    }

    fn run_script(&self, cmd: &str) {
        let status = std::process::Command::new("bash")
            .arg(script())
            .arg(cmd)
            .arg(&self.dir)
            .status()
            .expect("run containerd-test-env.sh");
        assert!(status.success(), "containerd-test-env.sh {cmd} failed");
    }

    /// SIGKILLs containerd (shims and containers live on), as a crash would.
    pub fn kill_containerd(&self) {
        self.run_script("kill");
    }

    /// Starts containerd again on the same root and state.
    pub fn restart_containerd(&self) {
        self.run_script("restart");
    }
}

impl Drop for ContainerdEnv {
    fn drop(&mut self) {
        // Remove every pod through CRI first (CNI teardown, shims exit cleanly), then stop.
        let config = self.cri_config().request_timeout(Duration::from_secs(20));
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                let Ok(cri) = CriRuntime::new(config) else {
                    return;
                };
                let Ok(sandboxes) = cri.list_pod_sandboxes(&SandboxFilter::default()).await else {
                    return;
                };
                for s in sandboxes {
                    let _ = cri.stop_pod_sandbox(&s.id).await;
                    let _ = cri.remove_pod_sandbox(&s.id).await;
                }
            });
        })
        .join();
        let _ = std::process::Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(&self.dir)
            .status();
    }
}

/// A pod source fed by the test through a watch channel.
pub struct TestSource {
    rx: watch::Receiver<Vec<Pod>>,
}

#[async_trait]
impl PodSource for TestSource {
    fn name(&self) -> &str {
        "file"
    }
    async fn run(&self, out: SourceSender, shutdown: CancellationToken) {
        let mut rx = self.rx.clone();
        loop {
            let pods = rx.borrow_and_update().clone();
            if out.snapshot(pods).await.is_err() {
                return;
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                r = rx.changed() => if r.is_err() { return },
            }
        }
    }
}

/// One running agent.
pub struct Agent {
    pub sink: Arc<RecordingSink>,
    pub shutdown: CancellationToken,
    pub task: tokio::task::JoinHandle<()>,
}

impl Agent {
    /// Starts an agent on `runtime` reading pods from `pods`.
    pub fn start(
        env: &ContainerdEnv,
        runtime: Arc<dyn ContainerRuntime>,
        pods: watch::Receiver<Vec<Pod>>,
    ) -> Self {
        let (pleg, pleg_events) = GenericPleg::new(runtime.clone(), GenericPlegConfig::default());
        let pleg = std::sync::Arc::new(pleg);
        Self::start_with_pleg(env, runtime, pods, pleg, pleg_events)
    }

    /// Starts an agent on `runtime` whose pods' Secrets (image pull secrets) and service
    /// accounts come from `objects`.
    pub fn start_with_objects(
        env: &ContainerdEnv,
        runtime: Arc<dyn ContainerRuntime>,
        pods: watch::Receiver<Vec<Pod>>,
        objects: Arc<dyn kubelet_api::ObjectProvider>,
    ) -> Self {
        let (pleg, pleg_events) = GenericPleg::new(runtime.clone(), GenericPlegConfig::default());
        Self::build(
            env,
            runtime,
            pods,
            Arc::new(pleg),
            pleg_events,
            Some(objects),
        )
    }

    /// Starts an agent on `runtime` with `plugin` registered.
    #[allow(dead_code)]
    pub fn start_with_plugin(
        env: &ContainerdEnv,
        runtime: Arc<dyn ContainerRuntime>,
        pods: watch::Receiver<Vec<Pod>>,
        plugin: Arc<dyn kubelet_api::AgentPlugin>,
    ) -> Self {
        let (pleg, pleg_events) = GenericPleg::new(runtime.clone(), GenericPlegConfig::default());
        Self::build_with(
            env,
            runtime,
            pods,
            Arc::new(pleg),
            pleg_events,
            None,
            Some(plugin),
        )
    }

    /// Starts an agent with the given PLEG.
    pub fn start_with_pleg(
        env: &ContainerdEnv,
        runtime: Arc<dyn ContainerRuntime>,
        pods: watch::Receiver<Vec<Pod>>,
        pleg: Arc<dyn PodLifecycleEventGenerator>,
        pleg_events: kubelet_api::PlegEvents,
    ) -> Self {
        Self::build(env, runtime, pods, pleg, pleg_events, None)
    }

    fn build(
        env: &ContainerdEnv,
        runtime: Arc<dyn ContainerRuntime>,
        pods: watch::Receiver<Vec<Pod>>,
        pleg: Arc<dyn PodLifecycleEventGenerator>,
        pleg_events: kubelet_api::PlegEvents,
        objects: Option<Arc<dyn kubelet_api::ObjectProvider>>,
    ) -> Self {
        Self::build_with(env, runtime, pods, pleg, pleg_events, objects, None)
    }

    fn build_with(
        env: &ContainerdEnv,
        runtime: Arc<dyn ContainerRuntime>,
        pods: watch::Receiver<Vec<Pod>>,
        pleg: Arc<dyn PodLifecycleEventGenerator>,
        pleg_events: kubelet_api::PlegEvents,
        objects: Option<Arc<dyn kubelet_api::ObjectProvider>>,
        plugin: Option<Arc<dyn kubelet_api::AgentPlugin>>,
    ) -> Self {
        let sink = Arc::new(RecordingSink::new());
        let mut config = KubeletConfig::with_dirs(env.dir.join("kubelet"), env.dir.join("logs"));
        config.node_ip = Some(NODE_IP.to_string());
        let mut builder = KubeletBuilder::new("node-1")
            .config(config)
            .runtime(runtime)
            .pleg(pleg, pleg_events)
            .pod_source(Arc::new(TestSource { rx: pods }))
            .status_sink(sink.clone());
        if let Some(objects) = objects {
            builder = builder.object_provider(objects);
        }
        if let Some(plugin) = plugin {
            builder = builder.plugin(plugin);
        }
        let kubelet = builder.build().expect("build the agent");
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(kubelet.run(shutdown.clone()));
        Self {
            sink,
            shutdown,
            task,
        }
    }

    /// Stops the agent; pods keep running.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(60), self.task).await;
    }

    pub fn status(&self, uid: &str) -> Option<PodStatus> {
        self.sink.latest(uid)
    }

    /// Polls the latest status of `uid` until `pred` holds (at most `within`).
    pub async fn wait_for(
        &self,
        uid: &str,
        within: Duration,
        what: &str,
        pred: impl Fn(&PodStatus) -> bool,
    ) -> PodStatus {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(s) = self.status(uid)
                && pred(&s)
            {
                return s;
            }
            if tokio::time::Instant::now() > deadline {
                panic!(
                    "pod {uid}: {what} not reached within {within:?}; last status: {:#?}\nevents: {:#?}",
                    self.status(uid),
                    self.sink.events()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Polls `f` until it returns `Some` (at most `within`).
pub async fn eventually<T, F, Fut>(within: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() <= deadline,
            "{what} not reached within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub fn container(name: &str, image: &str, script: &str) -> Container {
    Container {
        name: name.into(),
        image: Some(image.into()),
        command: Some(vec!["/bin/sh".into(), "-c".into(), script.into()]),
        ..Default::default()
    }
}

pub fn pod(uid: &str, host_network: bool, containers: Vec<Container>) -> Pod {
    let mut p = Pod {
        spec: Some(PodSpec {
            containers,
            host_network: Some(host_network),
            termination_grace_period_seconds: Some(30),
            ..Default::default()
        }),
        ..Default::default()
    };
    p.metadata.name = Some(format!("pod-{uid}"));
    p.metadata.namespace = Some("default".into());
    p.metadata.uid = Some(uid.into());
    p
}

pub fn phase(s: &PodStatus) -> &str {
    s.phase.as_deref().unwrap_or("")
}

pub fn running(s: &PodStatus) -> bool {
    phase(s) == "Running"
        && s.container_statuses.as_ref().is_some_and(|cs| {
            !cs.is_empty()
                && cs.iter().all(|c| {
                    c.state
                        .as_ref()
                        .and_then(|st| st.running.as_ref())
                        .is_some()
                })
        })
}

/// `(name, containerID without the runtime prefix, restartCount)` of every container.
pub fn container_ids(s: &PodStatus) -> Vec<(String, String, i32)> {
    let mut v: Vec<_> = s
        .container_statuses
        .iter()
        .flatten()
        .map(|c| {
            let id = c.container_id.clone().unwrap_or_default();
            let id = id.rsplit("://").next().unwrap_or("").to_string();
            (c.name.clone(), id, c.restart_count)
        })
        .collect();
    v.sort();
    v
}

fn uid_selector(uid: &str) -> BTreeMap<String, String> {
    [(labels::POD_UID.to_string(), uid.to_string())].into()
}

/// Every sandbox the runtime has for pod `uid`.
pub async fn sandboxes_of(
    rt: &dyn ContainerRuntime,
    uid: &str,
) -> Vec<kubelet_api::runtime::PodSandbox> {
    rt.list_pod_sandboxes(&SandboxFilter {
        label_selector: uid_selector(uid),
        ..Default::default()
    })
    .await
    .expect("ListPodSandbox")
}

/// Every container the runtime has for pod `uid`.
pub async fn containers_of(
    rt: &dyn ContainerRuntime,
    uid: &str,
) -> Vec<kubelet_api::runtime::Container> {
    rt.list_containers(&ContainerFilter {
        label_selector: uid_selector(uid),
        ..Default::default()
    })
    .await
    .expect("ListContainers")
}

/// Generous bounds for the machine being busy; the latency itself is measured by cri-bench.
pub const WITHIN: Duration = Duration::from_secs(30);

/// A host-network sandbox named `events-UID` for pod `uid` (in `default`), with the pod's
/// labels.
pub fn sandbox_config(uid: &str, env: &ContainerdEnv) -> PodSandboxConfig {
    let mut labels = Labels::new();
    labels.insert(kubelet_api::runtime::labels::POD_UID.into(), uid.into());
    labels.insert(
        kubelet_api::runtime::labels::POD_NAME.into(),
        format!("events-{uid}"),
    );
    labels.insert(
        kubelet_api::runtime::labels::POD_NAMESPACE.into(),
        "default".into(),
    );
    {
        let mut v = PodSandboxConfig::default();
        v.metadata = PodSandboxMetadata {
            name: format!("events-{uid}"),
            namespace: "default".into(),
            uid: uid.into(),
            attempt: 0,
        };
        v.hostname = format!("events-{uid}");
        v.log_directory = env.dir.join("logs").join(uid);
        v.labels = labels;
        v.host_network = true;
        v
    }
}

/// A busybox container running `script` with `/bin/sh -c`.
pub fn container_config(name: &str, script: &str, env: &ContainerdEnv) -> ContainerConfig {
    {
        let mut v = ContainerConfig::default();
        v.metadata = ContainerMetadata {
            name: name.into(),
            attempt: 0,
        };
        v.image = env.busybox.clone();
        v.command = vec!["/bin/sh".into(), "-c".into(), script.into()];
        v.log_path = format!("{name}/0.log");
        v
    }
}

/// Container `name` of the pod of `sandbox` (its labels, plus the container name) running
/// `script`.
pub fn pod_container(
    env: &ContainerdEnv,
    sandbox: &PodSandboxConfig,
    name: &str,
    script: &str,
) -> ContainerConfig {
    let mut cfg = container_config(name, script, env);
    cfg.labels = sandbox.labels.clone();
    cfg.labels
        .insert(labels::CONTAINER_NAME.into(), name.into());
    cfg
}

/// Runs pod `uid` ([`sandbox_config`]) with one started container `app` running `script`;
/// returns (sandbox ID, container ID).
pub async fn start_pod(
    env: &ContainerdEnv,
    rt: &dyn ContainerRuntime,
    uid: &str,
    script: &str,
) -> (String, String) {
    let sandbox = sandbox_config(uid, env);
    let sid = rt.run_pod_sandbox(&sandbox).await.expect("run the sandbox");
    let cid = rt
        .create_container(&sid, &pod_container(env, &sandbox, "app", script), &sandbox)
        .await
        .expect("create the container");
    rt.start_container(&cid).await.expect("start the container");
    (sid, cid)
}

/// Runs `pleg` until `shutdown` and waits for events mode after its first relist.
pub async fn run_until_events(pleg: &Arc<EventedPleg>, shutdown: &CancellationToken) {
    tokio::spawn({
        let (pleg, shutdown) = (pleg.clone(), shutdown.clone());
        async move { pleg.run(shutdown).await }
    });
    eventually(WITHIN, "events mode after the first relist", || {
        let pleg = pleg.clone();
        async move {
            (pleg.mode() == PlegMode::Events
                && pleg.last_relist().is_some()
                && pleg.metrics().connection_successes() >= 1)
                .then_some(())
        }
    })
    .await;
}

/// Reads events into `seen` until one matches `pred`; panics on a stream error, its end, or
/// after [`WITHIN`].
pub async fn next_matching(
    stream: &mut ContainerEventStream,
    seen: &mut Vec<ContainerEvent>,
    what: &str,
    pred: impl Fn(&ContainerEvent) -> bool,
) -> ContainerEvent {
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        let next = tokio::time::timeout_at(deadline, stream.next())
            .await
            .unwrap_or_else(|_| panic!("no {what} within {WITHIN:?}; events: {seen:#?}"));
        let event = match next {
            Some(Ok(e)) => e,
            Some(Err(e)) => {
                panic!("event stream failed waiting for {what}: {e}; events: {seen:#?}")
            }
            None => panic!("event stream ended waiting for {what}; events: {seen:#?}"),
        };
        seen.push(event.clone());
        if pred(&event) {
            return event;
        }
    }
}

/// Matches the events of kind `kind` of container `id`.
pub fn is(id: &str, kind: ContainerEventKind) -> impl Fn(&ContainerEvent) -> bool + '_ {
    move |e| e.container_id == id && e.kind == kind
}

/// Right after container `id`'s first `Stopped` event on containerd's native events: `rt`
/// already reports it exited with `code` and reason `Error` (the exit hint), and once the exit's
/// second `Stopped` event has come (the CRI plugin recorded it), CRI's own record, read through
/// a runtime without hints, is the same exit. Returns the status `rt` reported first.
pub async fn exit_is_reported_early_as_cri_records_it(
    env: &ContainerdEnv,
    rt: &CriRuntime,
    events: &mut ContainerEventStream,
    seen: &mut Vec<ContainerEvent>,
    id: &str,
    code: i32,
) -> kubelet_api::runtime::ContainerStatus {
    let early = rt
        .container_status(id)
        .await
        .expect("status after the exit");
    assert_eq!(
        (early.state, early.exit_code, early.reason.as_str()),
        (ContainerState::Exited, code, "Error"),
        "{early:?}"
    );
    next_matching(
        events,
        seen,
        "the exit again once CRI recorded it",
        is(id, ContainerEventKind::Stopped),
    )
    .await;
    let recorded = env
        .runtime()
        .await
        .container_status(id)
        .await
        .expect("CRI's status");
    assert_eq!(
        (
            recorded.state,
            recorded.exit_code,
            &recorded.reason,
            recorded.finished_at
        ),
        (
            early.state,
            early.exit_code,
            &early.reason,
            early.finished_at
        )
    );
    early
}

fn registry_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/registry-test-env.sh")
}

/// A private registry (TLS + htpasswd) that `containerd` trusts, holding
/// [`private_image`](Self::private_image) and [`extra_images`](Self::extra_images); started
/// with `scripts/registry-test-env.sh`, stopped and deleted on drop.
pub struct RegistryEnv {
    pub dir: PathBuf,
    /// `127.0.0.1:<port>`.
    pub host: String,
    pub user: String,
    pub password: String,
    /// busybox, pullable with the credentials only.
    pub private_image: String,
    /// Three distinct images of 2, 3 and 4 MiB (no shell in them: not for running).
    pub extra_images: Vec<String>,
}

impl RegistryEnv {
    /// Starts one next to `containerd` (which then trusts its CA); panics when the script
    /// fails (the containerd environment exists, so the machine can run it).
    pub fn start(containerd: &ContainerdEnv) -> Self {
        let dir = containerd.dir.join("registry");
        let out = std::process::Command::new("bash")
            .arg(registry_script())
            .arg("start")
            .arg(&dir)
            .arg(containerd.dir.join("certs.d"))
            .output()
            .expect("run registry-test-env.sh");
        assert!(
            out.status.success(),
            "registry-test-env.sh start failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let vars: BTreeMap<String, String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let get = |k: &str| vars.get(k).cloned().unwrap_or_default();
        Self {
            dir,
            host: get("REGISTRY"),
            user: get("REGISTRY_USER"),
            password: get("REGISTRY_PASSWORD"),
            private_image: get("PRIVATE_IMAGE"),
            extra_images: get("EXTRA_IMAGES")
                .split_whitespace()
                .map(str::to_string)
                .collect(),
        }
    }

    /// A `.dockerconfigjson` document for this registry with `password`.
    pub fn docker_config_json(&self, password: &str) -> String {
        format!(
            r#"{{"auths": {{"{}": {{"username": "{}", "password": "{password}"}}}}}}"#,
            self.host, self.user
        )
    }
}

impl Drop for RegistryEnv {
    fn drop(&mut self) {
        let _ = std::process::Command::new("bash")
            .arg(registry_script())
            .arg("stop")
            .arg(&self.dir)
            .status();
    }
}
