//! Test doubles for users' own tests: [`FakeRuntime`] and [`RecordingSink`], and
//! [`FaultyRuntime`], which injects faults into any runtime.
//!
//! Enabled with the `testing` feature. The first two are real implementations of the SDK's
//! traits, kept in memory and instrumented for assertions: inject them through the builder (or
//! hand them to a single subsystem such as a PLEG) exactly like a production runtime or sink.
//! [`FaultyRuntime`] wraps a runtime (a real one or [`FakeRuntime`]) and breaks its event stream,
//! loses chosen events or makes one pod's calls hang, on the test's command.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> kubelet_api::Result<()> {
//! use kubelet_api::ContainerRuntime;
//! use kubelet_api::runtime::{ContainerConfig, ContainerMetadata, PodSandboxConfig};
//! use kubelet_core::testing::FakeRuntime;
//!
//! let rt = FakeRuntime::new();
//! let sandbox = PodSandboxConfig::default();
//! let sb = rt.run_pod_sandbox(&sandbox).await?;
//! let config = ContainerConfig::new(ContainerMetadata { name: "app".into(), attempt: 0 }, "busybox");
//! let id = rt.create_container(&sb, &config, &sandbox).await?;
//! rt.start_container(&id).await?;
//! rt.exit_container(&id, 1)?; // the process "crashes"
//! assert_eq!(rt.container_status(&id).await?.exit_code, 1);
//! assert!(rt.calls().contains(&format!("start_container {id}")));
//! # Ok(())
//! # }
//! ```

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::{Error, ErrorKind, Result};
use kubelet_api::Event;
use kubelet_api::StatusSink;
use kubelet_api::runtime::{
    AuthConfig, Container, ContainerConfig, ContainerFilter, ContainerState, ContainerStats,
    ContainerStatus, ExecResult, Image, ImageFsInfo, ImageSpec, LinuxResources, PodSandbox,
    PodSandboxConfig, PodSandboxStatus, RuntimeStatus, RuntimeVersion, SandboxFilter, SandboxState,
    labels, labels_match,
};
use kubelet_api::{ContainerRuntime, ImageService};

mod faulty;
pub use faulty::FaultyRuntime;

/// The [`ContainerRuntime`] operations of a [`FakeRuntime`], to target injected errors and delays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FakeOp {
    /// [`ContainerRuntime::version`].
    Version,
    /// [`ContainerRuntime::status`].
    Status,
    /// [`ContainerRuntime::run_pod_sandbox`].
    RunPodSandbox,
    /// [`ContainerRuntime::stop_pod_sandbox`].
    StopPodSandbox,
    /// [`ContainerRuntime::remove_pod_sandbox`].
    RemovePodSandbox,
    /// [`ContainerRuntime::pod_sandbox_status`].
    PodSandboxStatus,
    /// [`ContainerRuntime::list_pod_sandboxes`].
    ListPodSandboxes,
    /// [`ContainerRuntime::create_container`].
    CreateContainer,
    /// [`ContainerRuntime::start_container`].
    StartContainer,
    /// [`ContainerRuntime::stop_container`].
    StopContainer,
    /// [`ContainerRuntime::remove_container`].
    RemoveContainer,
    /// [`ContainerRuntime::list_containers`].
    ListContainers,
    /// [`ContainerRuntime::container_status`].
    ContainerStatus,
    /// [`ContainerRuntime::exec_sync`].
    ExecSync,
    /// [`ImageService::image_status`].
    ImageStatus,
    /// [`ImageService::pull_image`].
    PullImage,
    /// [`ContainerRuntime::container_stats`].
    ContainerStats,
    /// [`ImageService::image_fs_info`].
    ImageFsInfo,
    /// [`ImageService::list_images`].
    ListImages,
    /// [`ImageService::remove_image`].
    RemoveImage,
    /// [`ContainerRuntime::reopen_container_log`].
    ReopenContainerLog,
    /// [`ContainerRuntime::update_container_resources`].
    UpdateContainerResources,
}

impl FakeOp {
    /// The method name, as it appears in [`FakeRuntime::calls`].
    pub fn as_str(self) -> &'static str {
        match self {
            FakeOp::Version => "version",
            FakeOp::Status => "status",
            FakeOp::RunPodSandbox => "run_pod_sandbox",
            FakeOp::StopPodSandbox => "stop_pod_sandbox",
            FakeOp::RemovePodSandbox => "remove_pod_sandbox",
            FakeOp::PodSandboxStatus => "pod_sandbox_status",
            FakeOp::ListPodSandboxes => "list_pod_sandboxes",
            FakeOp::CreateContainer => "create_container",
            FakeOp::StartContainer => "start_container",
            FakeOp::StopContainer => "stop_container",
            FakeOp::RemoveContainer => "remove_container",
            FakeOp::ListContainers => "list_containers",
            FakeOp::ContainerStatus => "container_status",
            FakeOp::ExecSync => "exec_sync",
            FakeOp::ImageStatus => "image_status",
            FakeOp::PullImage => "pull_image",
            FakeOp::ContainerStats => "container_stats",
            FakeOp::ImageFsInfo => "image_fs_info",
            FakeOp::ListImages => "list_images",
            FakeOp::RemoveImage => "remove_image",
            FakeOp::ReopenContainerLog => "reopen_container_log",
            FakeOp::UpdateContainerResources => "update_container_resources",
        }
    }
}

impl fmt::Display for FakeOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

type ExecHandler = Arc<dyn Fn(&str, &[String]) -> Result<ExecResult> + Send + Sync>;

#[derive(Debug, Clone)]
struct FakeSandbox {
    status: PodSandboxStatus,
    config: PodSandboxConfig,
}

#[derive(Debug, Clone)]
struct FakeContainer {
    status: ContainerStatus,
    sandbox_id: String,
    pod_uid: String,
    exit_at: Option<(Instant, i32)>,
}

struct State {
    next_id: u64,
    last_ts: Timestamp,
    sandboxes: BTreeMap<String, FakeSandbox>,
    containers: BTreeMap<String, FakeContainer>,
    images: HashMap<String, bool>,
    image_info: HashMap<String, FakeImage>,
    pull_auth: Vec<(String, String, String)>,
    images_present_by_default: bool,
    pulls_images: bool,
    calls: Vec<String>,
    fail_next: HashMap<FakeOp, VecDeque<Error>>,
    fail_always: HashMap<FakeOp, (ErrorKind, String)>,
    key_delays: HashMap<String, Duration>,
    op_delays: HashMap<FakeOp, Duration>,
    stop_exit_code: i32,
    auto_exit: HashMap<String, (Duration, i32)>,
    stats: HashMap<String, ContainerStats>,
    sandbox_stats: Option<Vec<kubelet_api::runtime::PodSandboxStats>>,
    image_fs: Option<ImageFsInfo>,
    runtime_status: RuntimeStatus,
    exec_handler: Option<ExecHandler>,
    sandbox_network: SandboxNetworkReport,
}

impl State {
    fn now(&mut self) -> Timestamp {
        // Strictly increasing, so "newest first" orderings are well defined even when tokio time
        // is paused and many objects are created within one wall-clock tick.
        let mut now = Timestamp::now();
        if now <= self.last_ts {
            now = self
                .last_ts
                .checked_add(jiff::SignedDuration::from_nanos(1))
                .unwrap_or(self.last_ts);
        }
        self.last_ts = now;
        now
    }

    fn next_id(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        format!("{prefix}-{}", self.next_id)
    }

    /// Apply scheduled exits (see [`FakeRuntime::set_auto_exit`]) that are due.
    fn reap(&mut self) {
        let now = Instant::now();
        let due: Vec<(String, i32)> = self
            .containers
            .iter()
            .filter_map(|(id, c)| match c.exit_at {
                Some((at, code)) if at <= now && c.status.state == ContainerState::Running => {
                    Some((id.clone(), code))
                }
                _ => None,
            })
            .collect();
        for (id, code) in due {
            self.mark_exited(&id, code, None);
        }
    }

    fn mark_exited(&mut self, id: &str, exit_code: i32, reason: Option<&str>) {
        let ts = self.now();
        if let Some(c) = self.containers.get_mut(id) {
            c.status.state = ContainerState::Exited;
            c.status.finished_at = Some(ts);
            c.status.exit_code = exit_code;
            c.status.reason = reason
                .map(str::to_string)
                .unwrap_or_else(|| default_reason(exit_code).to_string());
            c.exit_at = None;
        }
    }

    /// Keys (container ID, sandbox ID, pod UID) a call on `id` is about.
    fn keys_for_id(&self, id: &str) -> Vec<String> {
        let mut keys = vec![id.to_string()];
        if let Some(c) = self.containers.get(id) {
            keys.push(c.sandbox_id.clone());
            keys.push(c.pod_uid.clone());
        } else if let Some(s) = self.sandboxes.get(id) {
            keys.push(s.status.metadata.uid.clone());
            if let Some(uid) = s.status.labels.get(labels::POD_UID) {
                keys.push(uid.clone());
            }
        }
        keys
    }

    fn delay_for(&self, op: FakeOp, keys: &[String]) -> Duration {
        let by_key = keys
            .iter()
            .filter_map(|k| self.key_delays.get(k))
            .max()
            .copied()
            .unwrap_or_default();
        by_key.max(self.op_delays.get(&op).copied().unwrap_or_default())
    }

    fn take_failure(&mut self, op: FakeOp) -> Option<Error> {
        if let Some(e) = self.fail_next.get_mut(&op).and_then(VecDeque::pop_front) {
            return Some(e);
        }
        self.fail_always
            .get(&op)
            .map(|(kind, msg)| Error::new(*kind, msg.clone()))
    }

    fn sandbox(&self, id: &str) -> Result<&FakeSandbox> {
        self.sandboxes
            .get(id)
            .ok_or_else(|| Error::not_found(format!("pod sandbox {id:?} not found")))
    }

    fn container(&self, id: &str) -> Result<&FakeContainer> {
        self.containers
            .get(id)
            .ok_or_else(|| Error::not_found(format!("container {id:?} not found")))
    }

    /// The image name an image reference or fake image ID stands for.
    fn image_name(&self, image: &str) -> String {
        image
            .strip_prefix("fake-image:")
            .unwrap_or(image)
            .to_string()
    }

    fn image_entry(&self, name: &str) -> Image {
        let info = self.image_info.get(name).copied().unwrap_or_default();
        let mut v = Image::new(image_id(name), vec![name.to_string()], info.size);
        v.pinned = info.pinned;
        v
    }

    fn image_present(&self, image: &str) -> bool {
        self.images
            .get(image)
            .copied()
            .unwrap_or(self.images_present_by_default)
    }
}

/// Size and pin of one image of a [`FakeRuntime`].
#[derive(Debug, Clone, Copy, Default)]
struct FakeImage {
    size: u64,
    pinned: bool,
}

/// The user name and password `auth` carries: its own fields, or the `auth` field
/// (`base64(user:password)`) when set, as a registry reads them.
fn credentials_of(auth: &AuthConfig) -> (String, String) {
    use base64::Engine as _;
    if !auth.auth.is_empty() {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(&auth.auth)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .unwrap_or_default();
        if let Some((u, p)) = decoded.split_once(':') {
            return (u.to_string(), p.to_string());
        }
    }
    (auth.username.clone(), auth.password.clone())
}

fn default_reason(exit_code: i32) -> &'static str {
    if exit_code == 0 { "Completed" } else { "Error" }
}

fn image_id(image: &str) -> String {
    format!("fake-image:{image}")
}

/// How [`FakeRuntime`]'s sandbox statuses report their network
/// ([`FakeRuntime::set_sandbox_network`]; the sandbox network contract on `PodSandboxStatus`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum SandboxNetworkReport {
    /// As the configuration asked: host network without an IP, or a network of its own with an
    /// IP (the default).
    #[default]
    AsRequested,
    /// Host network and no IP for every sandbox: a runtime without pod networking.
    HostOnly,
    /// A network of its own and no IP: breaks the contract.
    OwnWithoutIp,
    /// A network of its own and an IP that is not one: breaks the contract.
    Garbage,
}

/// An in-memory [`ContainerRuntime`] that behaves like a real CRI runtime, for tests.
///
/// Behaviour:
/// - Sandboxes are created `Ready` (with an IP in `10.88.0.0/16` unless host-network) and keep the
///   labels and annotations of their config; containers are created `Created`, must be started,
///   and record created/started/finished timestamps (wall clock, strictly increasing).
/// - Unknown IDs give [`ErrorKind::NotFound`]; `stop_pod_sandbox`, `remove_pod_sandbox` and
///   `remove_container` of unknown IDs succeed, as CRI requires.
/// - `stop_container` of a running container marks it exited with exit code 137 (SIGKILL), or
///   the code set with [`set_stop_exit_code`](Self::set_stop_exit_code); `stop_pod_sandbox` does
///   that to every container of the sandbox; removing a sandbox removes its containers.
/// - Images are present unless [`set_image_present`](Self::set_image_present) says otherwise (or
///   [`set_images_present_by_default`](Self::set_images_present_by_default) is false);
///   `pull_image` makes them present and `create_container` of an absent image fails with
///   `NotFound`.
/// - `exec_sync` in a running container calls the handler set with
///   [`set_exec_handler`](Self::set_exec_handler) (default: exit code 0, no output).
///
/// Test controls: simulated process exits ([`exit_container`](Self::exit_container),
/// [`set_auto_exit`](Self::set_auto_exit)), injected errors ([`fail_next`](Self::fail_next),
/// [`fail_always`](Self::fail_always)), slow calls ([`set_call_delay`](Self::set_call_delay),
/// [`set_op_delay`](Self::set_op_delay); delays use `tokio::time::sleep`, so paused-time tests
/// work), and a log of every call ([`calls`](Self::calls)).
///
/// Cheap to share: wrap it in an `Arc` and keep a clone for the test's assertions.
pub struct FakeRuntime {
    state: Mutex<State>,
}

impl fmt::Debug for FakeRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.state.lock();
        f.debug_struct("FakeRuntime")
            .field("sandboxes", &st.sandboxes.len())
            .field("containers", &st.containers.len())
            .field("calls", &st.calls.len())
            .finish()
    }
}

impl Default for FakeRuntime {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeRuntime {
    /// An empty runtime: no sandboxes, no containers, every image present, runtime and network
    /// ready.
    pub fn new() -> Self {
        Self {
            state: Mutex::new(State {
                next_id: 0,
                last_ts: Timestamp::UNIX_EPOCH,
                sandboxes: BTreeMap::new(),
                containers: BTreeMap::new(),
                images: HashMap::new(),
                image_info: HashMap::new(),
                pull_auth: Vec::new(),
                images_present_by_default: true,
                pulls_images: true,
                calls: Vec::new(),
                fail_next: HashMap::new(),
                fail_always: HashMap::new(),
                key_delays: HashMap::new(),
                op_delays: HashMap::new(),
                stop_exit_code: 137,
                auto_exit: HashMap::new(),
                stats: HashMap::new(),
                sandbox_stats: None,
                image_fs: None,
                runtime_status: RuntimeStatus::all_ready(),
                exec_handler: None,
                sandbox_network: SandboxNetworkReport::AsRequested,
            }),
        }
    }

    // ----- test controls -----

    /// How sandbox statuses report their network from now on (also for existing sandboxes).
    pub fn set_sandbox_network(&self, report: SandboxNetworkReport) {
        self.state.lock().sandbox_network = report;
    }

    /// Simulate the container's process exiting with `exit_code` (reason `Completed` for 0,
    /// `Error` otherwise). A container that is not running is left as it is.
    pub fn exit_container(&self, id: &str, exit_code: i32) -> Result<()> {
        self.exit_container_with_reason(id, exit_code, default_reason(exit_code))
    }

    /// Like [`exit_container`](Self::exit_container) with an explicit reason (e.g. `OOMKilled`).
    pub fn exit_container_with_reason(&self, id: &str, exit_code: i32, reason: &str) -> Result<()> {
        let mut st = self.state.lock();
        st.reap();
        let c = st.container(id)?;
        if c.status.state == ContainerState::Running {
            st.mark_exited(id, exit_code, Some(reason));
        }
        Ok(())
    }

    /// Containers named `container_name` started from now on exit with `exit_code` once they
    /// have run for `after` (measured with `tokio::time`, so paused-time tests see it).
    pub fn set_auto_exit(&self, container_name: &str, after: Duration, exit_code: i32) {
        self.state
            .lock()
            .auto_exit
            .insert(container_name.to_string(), (after, exit_code));
    }

    /// Stop scheduling exits for containers named `container_name`.
    pub fn clear_auto_exit(&self, container_name: &str) {
        self.state.lock().auto_exit.remove(container_name);
    }

    /// Make every call about `key` take `delay` longer. `key` is a pod UID, a sandbox ID or a
    /// container ID: calls on a container are slowed by its own ID, its sandbox's and its pod's;
    /// list calls by the ID or pod-UID label in their filter. `Duration::ZERO` removes the delay.
    pub fn set_call_delay(&self, key: &str, delay: Duration) {
        let mut st = self.state.lock();
        if delay.is_zero() {
            st.key_delays.remove(key);
        } else {
            st.key_delays.insert(key.to_string(), delay);
        }
    }

    /// Make every call of `op` take `delay` longer. `Duration::ZERO` removes the delay.
    pub fn set_op_delay(&self, op: FakeOp, delay: Duration) {
        let mut st = self.state.lock();
        if delay.is_zero() {
            st.op_delays.remove(&op);
        } else {
            st.op_delays.insert(op, delay);
        }
    }

    /// The next call of `op` fails with `err` (errors queue up, one per call).
    pub fn fail_next(&self, op: FakeOp, err: Error) {
        self.state
            .lock()
            .fail_next
            .entry(op)
            .or_default()
            .push_back(err);
    }

    /// Every call of `op` fails with `kind` and `message` until [`clear_failures`](Self::clear_failures).
    pub fn fail_always(&self, op: FakeOp, kind: ErrorKind, message: impl Into<String>) {
        self.state
            .lock()
            .fail_always
            .insert(op, (kind, message.into()));
    }

    /// Drop every injected failure of `op`.
    pub fn clear_failures(&self, op: FakeOp) {
        let mut st = self.state.lock();
        st.fail_next.remove(&op);
        st.fail_always.remove(&op);
    }

    /// Every call so far, in order, with its arguments: `"run_pod_sandbox <pod name>"`,
    /// `"create_container <container name>"`, `"start_container <id>"`,
    /// `"stop_container <id> 30s"` (timeout in `Duration`'s debug form), `"exec_sync <id> <cmd…>"`,
    /// `"pull_image <image>"`, `"list_containers"`, …
    pub fn calls(&self) -> Vec<String> {
        self.state.lock().calls.clone()
    }

    /// Forget the recorded calls.
    pub fn clear_calls(&self) {
        self.state.lock().calls.clear();
    }

    /// Say whether `image` is present (`image_status` returns it, `create_container` accepts it).
    pub fn set_image_present(&self, image: &str, present: bool) {
        self.state.lock().images.insert(image.to_string(), present);
    }

    /// Whether the runtime has images ([`ContainerRuntime::images`] answers `Some`, true unless
    /// set): false makes a runtime without images, as the process runtime.
    pub fn set_pulls_images(&self, pulls: bool) {
        self.state.lock().pulls_images = pulls;
    }

    /// Make `image` present with `size` bytes, pinned or not: it is then listed by
    /// [`ImageService::list_images`] (images only present by default are not listed).
    pub fn add_image(&self, image: &str, size: u64, pinned: bool) {
        let mut st = self.state.lock();
        st.images.insert(image.to_string(), true);
        st.image_info
            .insert(image.to_string(), FakeImage { size, pinned });
    }

    /// Pulls of images starting with `prefix` need user `username` with `password` (a pull
    /// without them, or with others, fails with `PermissionDenied` and an `unauthorized`
    /// message naming the image, never the credentials).
    pub fn require_pull_credentials(&self, prefix: &str, username: &str, password: &str) {
        self.state.lock().pull_auth.push((
            prefix.to_string(),
            username.to_string(),
            password.to_string(),
        ));
    }

    /// Whether images not named in [`set_image_present`](Self::set_image_present) are present
    /// (true unless set).
    pub fn set_images_present_by_default(&self, present: bool) {
        self.state.lock().images_present_by_default = present;
    }

    /// Answer `exec_sync(container_id, cmd)` in running containers with `f`.
    pub fn set_exec_handler(
        &self,
        f: impl Fn(&str, &[String]) -> Result<ExecResult> + Send + Sync + 'static,
    ) {
        self.state.lock().exec_handler = Some(Arc::new(f));
    }

    /// Exit code a running container gets from `stop_container` (default 137).
    pub fn set_stop_exit_code(&self, exit_code: i32) {
        self.state.lock().stop_exit_code = exit_code;
    }

    /// What `status()` reports.
    pub fn set_runtime_status(&self, status: RuntimeStatus) {
        self.state.lock().runtime_status = status;
    }

    /// What `container_stats(id)` reports for `id` (the timestamp is refreshed on each call).
    pub fn set_container_stats(&self, id: &str, stats: ContainerStats) {
        self.state.lock().stats.insert(id.to_string(), stats);
    }

    /// What `list_pod_sandbox_stats()` reports; `None` (the default) answers `Unimplemented`,
    /// as a runtime whose pods share the host's network.
    pub fn set_sandbox_stats(&self, stats: Option<Vec<kubelet_api::runtime::PodSandboxStats>>) {
        self.state.lock().sandbox_stats = stats;
    }

    /// What `image_fs_info()` reports; `None` (the default) answers `Unimplemented`, as a
    /// runtime without the call.
    pub fn set_image_fs_info(&self, info: Option<ImageFsInfo>) {
        self.state.lock().image_fs = info;
    }

    /// Every container as listed right now.
    pub fn containers(&self) -> Vec<Container> {
        let mut st = self.state.lock();
        st.reap();
        st.containers.values().map(list_entry).collect()
    }

    /// Every sandbox as listed right now.
    pub fn sandboxes(&self) -> Vec<PodSandbox> {
        self.state
            .lock()
            .sandboxes
            .values()
            .map(sandbox_list_entry)
            .collect()
    }

    /// The configuration the newest sandbox of pod `pod_uid` was created with.
    pub fn sandbox_config(&self, pod_uid: &str) -> Option<PodSandboxConfig> {
        self.state
            .lock()
            .sandboxes
            .values()
            .filter(|s| s.config.metadata.uid == pod_uid)
            .max_by_key(|s| s.status.created_at)
            .map(|s| s.config.clone())
    }

    /// ID of the newest container named `name` of pod `pod_uid`, if any.
    pub fn find_container(&self, pod_uid: &str, name: &str) -> Option<String> {
        let mut st = self.state.lock();
        st.reap();
        st.containers
            .iter()
            .filter(|(_, c)| c.pod_uid == pod_uid && c.status.metadata.name == name)
            .max_by_key(|(_, c)| c.status.created_at)
            .map(|(id, _)| id.clone())
    }

    // ----- plumbing -----

    /// Record the call, wait out any delay, then return an injected failure if there is one.
    async fn enter(&self, op: FakeOp, args: &str, keys: &[String]) -> Result<()> {
        let delay = {
            let mut st = self.state.lock();
            st.calls.push(if args.is_empty() {
                op.as_str().to_string()
            } else {
                format!("{op} {args}")
            });
            st.delay_for(op, keys)
        };
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let mut st = self.state.lock();
        st.reap();
        match st.take_failure(op) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn keys_for_id(&self, id: &str) -> Vec<String> {
        self.state.lock().keys_for_id(id)
    }
}

fn list_entry(c: &FakeContainer) -> Container {
    Container {
        id: c.status.id.clone(),
        pod_sandbox_id: c.sandbox_id.clone(),
        metadata: c.status.metadata.clone(),
        image: c.status.image.clone(),
        image_ref: c.status.image_ref.clone(),
        state: c.status.state,
        created_at: c.status.created_at,
        labels: c.status.labels.clone(),
        annotations: c.status.annotations.clone(),
    }
}

fn sandbox_list_entry(s: &FakeSandbox) -> PodSandbox {
    PodSandbox {
        id: s.status.id.clone(),
        metadata: s.status.metadata.clone(),
        state: s.status.state,
        created_at: s.status.created_at,
        labels: s.status.labels.clone(),
        annotations: s.status.annotations.clone(),
    }
}

fn filter_keys(
    id: Option<&String>,
    sandbox: Option<&String>,
    sel: &kubelet_api::runtime::Labels,
) -> Vec<String> {
    id.into_iter()
        .chain(sandbox)
        .chain(sel.get(labels::POD_UID))
        .cloned()
        .collect()
}

#[async_trait]
impl ContainerRuntime for FakeRuntime {
    fn images(&self) -> Option<&dyn ImageService> {
        self.state
            .lock()
            .pulls_images
            .then_some(self as &dyn ImageService)
    }

    async fn version(&self) -> Result<RuntimeVersion> {
        self.enter(FakeOp::Version, "", &[]).await?;
        Ok(RuntimeVersion {
            runtime_name: "fake".to_string(),
            runtime_version: env!("CARGO_PKG_VERSION").to_string(),
            runtime_api_version: "v1".to_string(),
        })
    }

    async fn status(&self) -> Result<RuntimeStatus> {
        self.enter(FakeOp::Status, "", &[]).await?;
        Ok(self.state.lock().runtime_status.clone())
    }

    async fn run_pod_sandbox(&self, config: &PodSandboxConfig) -> Result<String> {
        let keys = vec![config.metadata.uid.clone()];
        self.enter(FakeOp::RunPodSandbox, &config.metadata.name, &keys)
            .await?;
        let mut st = self.state.lock();
        let id = st.next_id("fake-sandbox");
        let created_at = st.now();
        let ip = (!config.host_network)
            .then(|| format!("10.88.{}.{}", (st.next_id >> 8) & 0xff, st.next_id & 0xff));
        let status = {
            let mut v = PodSandboxStatus::default();
            v.id = id.clone();
            v.metadata = config.metadata.clone();
            v.state = SandboxState::Ready;
            v.created_at = created_at;
            v.ip = ip;
            v.additional_ips = Vec::new();
            v.host_network = config.host_network;
            v.labels = config.labels.clone();
            v.annotations = config.annotations.clone();
            v
        };
        st.sandboxes.insert(
            id.clone(),
            FakeSandbox {
                status,
                config: config.clone(),
            },
        );
        Ok(id)
    }

    async fn stop_pod_sandbox(&self, sandbox_id: &str) -> Result<()> {
        let keys = self.keys_for_id(sandbox_id);
        self.enter(FakeOp::StopPodSandbox, sandbox_id, &keys)
            .await?;
        let mut st = self.state.lock();
        if !st.sandboxes.contains_key(sandbox_id) {
            return Ok(());
        }
        let code = st.stop_exit_code;
        let running: Vec<String> = st
            .containers
            .iter()
            .filter(|(_, c)| {
                c.sandbox_id == sandbox_id && c.status.state == ContainerState::Running
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in running {
            st.mark_exited(&id, code, None);
        }
        if let Some(s) = st.sandboxes.get_mut(sandbox_id) {
            s.status.state = SandboxState::NotReady;
        }
        Ok(())
    }

    async fn remove_pod_sandbox(&self, sandbox_id: &str) -> Result<()> {
        let keys = self.keys_for_id(sandbox_id);
        self.enter(FakeOp::RemovePodSandbox, sandbox_id, &keys)
            .await?;
        let mut st = self.state.lock();
        st.sandboxes.remove(sandbox_id);
        st.containers.retain(|_, c| c.sandbox_id != sandbox_id);
        Ok(())
    }

    async fn pod_sandbox_status(&self, sandbox_id: &str) -> Result<PodSandboxStatus> {
        let keys = self.keys_for_id(sandbox_id);
        self.enter(FakeOp::PodSandboxStatus, sandbox_id, &keys)
            .await?;
        let st = self.state.lock();
        let mut status = st.sandbox(sandbox_id)?.status.clone();
        match st.sandbox_network {
            SandboxNetworkReport::AsRequested => {}
            SandboxNetworkReport::HostOnly => {
                status.host_network = true;
                status.ip = None;
            }
            SandboxNetworkReport::OwnWithoutIp => {
                status.host_network = false;
                status.ip = None;
            }
            SandboxNetworkReport::Garbage => {
                status.host_network = false;
                status.ip = Some("not-an-ip".into());
            }
        }
        Ok(status)
    }

    async fn list_pod_sandboxes(&self, filter: &SandboxFilter) -> Result<Vec<PodSandbox>> {
        let keys = filter_keys(filter.id.as_ref(), None, &filter.label_selector);
        self.enter(FakeOp::ListPodSandboxes, "", &keys).await?;
        let st = self.state.lock();
        Ok(st
            .sandboxes
            .values()
            .filter(|s| filter.id.as_ref().is_none_or(|id| *id == s.status.id))
            .filter(|s| filter.state.is_none_or(|state| state == s.status.state))
            .filter(|s| labels_match(&s.status.labels, &filter.label_selector))
            .map(sandbox_list_entry)
            .collect())
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        config: &ContainerConfig,
        sandbox_config: &PodSandboxConfig,
    ) -> Result<String> {
        let mut keys = self.keys_for_id(sandbox_id);
        keys.push(sandbox_config.metadata.uid.clone());
        self.enter(FakeOp::CreateContainer, &config.metadata.name, &keys)
            .await?;
        let mut st = self.state.lock();
        let sandbox = st.sandbox(sandbox_id)?;
        if sandbox.status.state != SandboxState::Ready {
            return Err(Error::new(
                ErrorKind::FailedPrecondition,
                format!("pod sandbox {sandbox_id:?} is not ready"),
            ));
        }
        let pod_uid = sandbox
            .status
            .labels
            .get(labels::POD_UID)
            .cloned()
            .unwrap_or_else(|| sandbox.status.metadata.uid.clone());
        let log_dir = sandbox.config.log_directory.clone();
        if st.pulls_images && !st.image_present(&config.image) {
            return Err(Error::not_found(format!(
                "image {:?} not found: pull it first",
                config.image
            )));
        }
        if st.pulls_images {
            st.images.insert(config.image.clone(), true);
        }
        let id = st.next_id("fake-container");
        let created_at = st.now();
        let status = {
            let mut v = ContainerStatus::default();
            v.id = id.clone();
            v.metadata = config.metadata.clone();
            v.state = ContainerState::Created;
            v.created_at = created_at;
            v.started_at = None;
            v.finished_at = None;
            v.exit_code = 0;
            v.image = config.image.clone();
            v.image_ref = image_id(&config.image);
            v.reason = String::new();
            v.message = String::new();
            v.labels = config.labels.clone();
            v.annotations = config.annotations.clone();
            v.mounts = config.mounts.clone();
            v.log_path = log_dir.join(&config.log_path);
            v.resources = config.resources.clone();
            v
        };
        st.containers.insert(
            id.clone(),
            FakeContainer {
                status,
                sandbox_id: sandbox_id.to_string(),
                pod_uid,
                exit_at: None,
            },
        );
        Ok(id)
    }

    async fn start_container(&self, container_id: &str) -> Result<()> {
        let keys = self.keys_for_id(container_id);
        self.enter(FakeOp::StartContainer, container_id, &keys)
            .await?;
        let mut st = self.state.lock();
        let c = st.container(container_id)?;
        if c.status.state != ContainerState::Created {
            return Err(Error::new(
                ErrorKind::FailedPrecondition,
                format!(
                    "container {container_id:?} is in state {:?}, not Created",
                    c.status.state
                ),
            ));
        }
        let sandbox_ready = st
            .sandboxes
            .get(&c.sandbox_id)
            .is_some_and(|s| s.status.state == SandboxState::Ready);
        if !sandbox_ready {
            return Err(Error::new(
                ErrorKind::FailedPrecondition,
                format!("sandbox of container {container_id:?} is not ready"),
            ));
        }
        let auto = st.auto_exit.get(&c.status.metadata.name).copied();
        let ts = st.now();
        if let Some(c) = st.containers.get_mut(container_id) {
            c.status.state = ContainerState::Running;
            c.status.started_at = Some(ts);
            c.exit_at = auto.map(|(after, code)| (Instant::now() + after, code));
        }
        Ok(())
    }

    async fn stop_container(&self, container_id: &str, timeout: Duration) -> Result<()> {
        let keys = self.keys_for_id(container_id);
        self.enter(
            FakeOp::StopContainer,
            &format!("{container_id} {timeout:?}"),
            &keys,
        )
        .await?;
        let mut st = self.state.lock();
        let c = st.container(container_id)?;
        match c.status.state {
            ContainerState::Running => {
                let code = st.stop_exit_code;
                st.mark_exited(container_id, code, None);
            }
            ContainerState::Created | ContainerState::Unknown => {
                // Never ran: it is now simply exited, without a process exit code.
                st.mark_exited(container_id, 0, Some("Error"));
            }
            ContainerState::Exited => {}
        }
        Ok(())
    }

    async fn remove_container(&self, container_id: &str) -> Result<()> {
        let keys = self.keys_for_id(container_id);
        self.enter(FakeOp::RemoveContainer, container_id, &keys)
            .await?;
        let mut st = self.state.lock();
        st.containers.remove(container_id);
        st.stats.remove(container_id);
        Ok(())
    }

    async fn list_containers(&self, filter: &ContainerFilter) -> Result<Vec<Container>> {
        let keys = filter_keys(
            filter.id.as_ref(),
            filter.pod_sandbox_id.as_ref(),
            &filter.label_selector,
        );
        self.enter(FakeOp::ListContainers, "", &keys).await?;
        let st = self.state.lock();
        Ok(st
            .containers
            .values()
            .filter(|c| filter.id.as_ref().is_none_or(|id| *id == c.status.id))
            .filter(|c| {
                filter
                    .pod_sandbox_id
                    .as_ref()
                    .is_none_or(|id| *id == c.sandbox_id)
            })
            .filter(|c| filter.state.is_none_or(|s| s == c.status.state))
            .filter(|c| labels_match(&c.status.labels, &filter.label_selector))
            .map(list_entry)
            .collect())
    }

    async fn container_status(&self, container_id: &str) -> Result<ContainerStatus> {
        let keys = self.keys_for_id(container_id);
        self.enter(FakeOp::ContainerStatus, container_id, &keys)
            .await?;
        let st = self.state.lock();
        Ok(st.container(container_id)?.status.clone())
    }

    async fn exec_sync(
        &self,
        container_id: &str,
        cmd: &[String],
        timeout: Duration,
    ) -> Result<ExecResult> {
        let keys = self.keys_for_id(container_id);
        let args = std::iter::once(container_id.to_string())
            .chain(cmd.iter().cloned())
            .collect::<Vec<_>>()
            .join(" ");
        let entered = self.enter(FakeOp::ExecSync, &args, &keys);
        if timeout.is_zero() {
            entered.await?;
        } else {
            tokio::time::timeout(timeout, entered).await.map_err(|_| {
                Error::new(
                    ErrorKind::DeadlineExceeded,
                    format!("exec in container {container_id:?} timed out after {timeout:?}"),
                )
            })??;
        }
        let handler = {
            let st = self.state.lock();
            let c = st.container(container_id)?;
            if c.status.state != ContainerState::Running {
                return Err(Error::new(
                    ErrorKind::FailedPrecondition,
                    format!("container {container_id:?} is not running"),
                ));
            }
            st.exec_handler.clone()
        };
        match handler {
            Some(h) => h(container_id, cmd),
            None => Ok(ExecResult::default()),
        }
    }

    async fn list_pod_sandbox_stats(&self) -> Result<Vec<kubelet_api::runtime::PodSandboxStats>> {
        self.state.lock().sandbox_stats.clone().ok_or_else(|| {
            Error::new(
                ErrorKind::Unimplemented,
                "list_pod_sandbox_stats is not supported by this runtime",
            )
        })
    }

    async fn container_stats(&self, container_id: &str) -> Result<ContainerStats> {
        let keys = self.keys_for_id(container_id);
        self.enter(FakeOp::ContainerStats, container_id, &keys)
            .await?;
        let mut st = self.state.lock();
        st.container(container_id)?;
        let ts = st.now();
        let mut stats = st.stats.get(container_id).cloned().unwrap_or_else(|| {
            let mut v = ContainerStats::default();
            v.container_id = container_id.to_string();
            v
        });
        stats.timestamp = ts;
        Ok(stats)
    }

    async fn update_container_resources(
        &self,
        container_id: &str,
        resources: &LinuxResources,
    ) -> Result<()> {
        let keys = self.keys_for_id(container_id);
        self.enter(FakeOp::UpdateContainerResources, container_id, &keys)
            .await?;
        let mut st = self.state.lock();
        let c = st
            .containers
            .get_mut(container_id)
            .ok_or_else(|| Error::not_found(format!("container {container_id:?} not found")))?;
        c.status.resources = Some(resources.clone());
        Ok(())
    }

    async fn reopen_container_log(&self, container_id: &str) -> Result<()> {
        let keys = self.keys_for_id(container_id);
        self.enter(FakeOp::ReopenContainerLog, container_id, &keys)
            .await?;
        let st = self.state.lock();
        let c = st.container(container_id)?;
        if c.status.state != ContainerState::Running {
            return Err(Error::new(
                ErrorKind::FailedPrecondition,
                format!("container {container_id:?} is not running"),
            ));
        }
        Ok(())
    }
}

#[async_trait]
impl ImageService for FakeRuntime {
    async fn list_images(&self) -> Result<Vec<Image>> {
        self.enter(FakeOp::ListImages, "", &[]).await?;
        let st = self.state.lock();
        let mut out: Vec<Image> = st
            .images
            .iter()
            .filter(|(_, present)| **present)
            .map(|(name, _)| st.image_entry(name))
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    async fn image_status(&self, image: &ImageSpec) -> Result<Option<Image>> {
        self.enter(FakeOp::ImageStatus, &image.image, &[]).await?;
        let mut st = self.state.lock();
        let name = st.image_name(&image.image);
        let present = st.image_present(&name);
        if present {
            // An image present by default is listed from the first time it is asked about.
            st.images.insert(name.clone(), true);
        }
        Ok(present.then(|| st.image_entry(&name)))
    }

    async fn pull_image(
        &self,
        image: &ImageSpec,
        auth: Option<&AuthConfig>,
        sandbox_config: &PodSandboxConfig,
    ) -> Result<String> {
        let keys = vec![sandbox_config.metadata.uid.clone()];
        let what = match auth {
            Some(a) => format!("{} as {}", image.image, credentials_of(a).0),
            None => image.image.clone(),
        };
        self.enter(FakeOp::PullImage, &what, &keys).await?;
        let mut st = self.state.lock();
        let needed = st
            .pull_auth
            .iter()
            .find(|(prefix, _, _)| image.image.starts_with(prefix.as_str()))
            .map(|(_, u, p)| (u.clone(), p.clone()));
        if let Some(needed) = needed
            && auth.map(credentials_of) != Some(needed)
        {
            return Err(Error::new(
                ErrorKind::PermissionDenied,
                format!("failed to pull {:?}: unauthorized", image.image),
            ));
        }
        st.images.insert(image.image.clone(), true);
        Ok(image_id(&image.image))
    }

    async fn remove_image(&self, image: &ImageSpec) -> Result<()> {
        self.enter(FakeOp::RemoveImage, &image.image, &[]).await?;
        let mut st = self.state.lock();
        let name = st.image_name(&image.image);
        st.images.insert(name, false);
        Ok(())
    }

    async fn image_fs_info(&self) -> Result<ImageFsInfo> {
        self.enter(FakeOp::ImageFsInfo, "", &[]).await?;
        self.state.lock().image_fs.clone().ok_or_else(|| {
            Error::new(
                ErrorKind::Unimplemented,
                "image_fs_info: no image filesystem set on this FakeRuntime",
            )
        })
    }
}

// ---------------------------------------------------------------------------------------------

/// One status a [`RecordingSink`] received.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedStatus {
    /// Pod UID.
    pub uid: String,
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// The status as published.
    pub status: PodStatus,
}

#[derive(Debug, Default)]
struct SinkState {
    statuses: Vec<RecordedStatus>,
    removed: Vec<String>,
    events: Vec<Event>,
    fail_next: VecDeque<Error>,
}

/// A pod source named `file` that the test drives through a `watch` channel: every value sent is
/// a snapshot of the source's pods; `None` sends nothing, so the source has not been seen yet
/// (orphan cleanup waits for it).
///
/// The pods are `Pod`s, or `Arc<Pod>`s sent as they are (to follow one allocation through the
/// engine).
#[derive(Debug, Clone)]
pub struct WatchSource<P = Pod> {
    rx: watch::Receiver<Option<Vec<P>>>,
}

impl<P> WatchSource<P> {
    /// A source starting with `pods` (`None`: no first snapshot yet) and the sender that
    /// replaces them.
    pub fn new(pods: Option<Vec<P>>) -> (Self, watch::Sender<Option<Vec<P>>>) {
        let (tx, rx) = watch::channel(pods);
        (Self { rx }, tx)
    }
}

#[async_trait]
impl<P> kubelet_api::PodSource for WatchSource<P>
where
    P: Into<Arc<Pod>> + Clone + Send + Sync + 'static,
{
    fn name(&self) -> &str {
        kubelet_api::sources::FILE
    }

    async fn run(
        &self,
        out: kubelet_api::SourceSender,
        shutdown: tokio_util::sync::CancellationToken,
    ) {
        let mut rx = self.rx.clone();
        loop {
            let snapshot = rx.borrow_and_update().clone();
            if let Some(pods) = snapshot
                && out.snapshot(pods).await.is_err()
            {
                return;
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                r = rx.changed() => if r.is_err() { return },
            }
        }
    }
}

/// A [`StatusSink`] that records everything it receives, for assertions.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::time::Duration;
/// use kubelet_api::StatusSink;
/// use kubelet_core::k8s_openapi::api::core::v1::{Pod, PodStatus};
/// use kubelet_core::testing::RecordingSink;
///
/// let sink = RecordingSink::new();
/// let mut pod = Pod::default();
/// pod.metadata.uid = Some("u1".into());
/// let status = PodStatus { phase: Some("Running".into()), ..Default::default() };
/// sink.update_pod_status(&pod, &status).await.expect("recorded");
/// let seen = sink
///     .wait_for(|r| r.status.phase.as_deref() == Some("Running"), Duration::from_secs(1))
///     .await;
/// assert_eq!(seen.map(|r| r.uid).as_deref(), Some("u1"));
/// assert_eq!(sink.latest("u1"), Some(status));
/// # }
/// ```
#[derive(Debug)]
pub struct RecordingSink {
    state: Mutex<SinkState>,
    changed: watch::Sender<u64>,
}

impl Default for RecordingSink {
    fn default() -> Self {
        Self::new()
    }
}

impl RecordingSink {
    /// An empty sink.
    pub fn new() -> Self {
        let (changed, _) = watch::channel(0);
        Self {
            state: Mutex::new(SinkState::default()),
            changed,
        }
    }

    /// Every status of pod `uid`, oldest first.
    pub fn statuses(&self, uid: &str) -> Vec<PodStatus> {
        self.state
            .lock()
            .statuses
            .iter()
            .filter(|r| r.uid == uid)
            .map(|r| r.status.clone())
            .collect()
    }

    /// The latest status of pod `uid`.
    pub fn latest(&self, uid: &str) -> Option<PodStatus> {
        self.state
            .lock()
            .statuses
            .iter()
            .rev()
            .find(|r| r.uid == uid)
            .map(|r| r.status.clone())
    }

    /// Every status of every pod, in the order received.
    pub fn all_statuses(&self) -> Vec<RecordedStatus> {
        self.state.lock().statuses.clone()
    }

    /// UIDs passed to `pod_removed`, in order.
    pub fn removed(&self) -> Vec<String> {
        self.state.lock().removed.clone()
    }

    /// Every event, in order.
    pub fn events(&self) -> Vec<Event> {
        self.state.lock().events.clone()
    }

    /// The next `update_pod_status` fails with `err` instead of recording.
    pub fn fail_next_update(&self, err: Error) {
        self.state.lock().fail_next.push_back(err);
    }

    /// Wait until some recorded status (already received or arriving within `timeout`)
    /// satisfies `predicate`; returns the first such status, or `None` on timeout.
    pub async fn wait_for(
        &self,
        predicate: impl Fn(&RecordedStatus) -> bool,
        timeout: Duration,
    ) -> Option<RecordedStatus> {
        self.wait_until(
            |st| st.statuses.iter().find(|r| predicate(r)).cloned(),
            timeout,
        )
        .await
    }

    /// Wait until some recorded event satisfies `predicate`; `None` on timeout.
    pub async fn wait_for_event(
        &self,
        predicate: impl Fn(&Event) -> bool,
        timeout: Duration,
    ) -> Option<Event> {
        self.wait_until(
            |st| st.events.iter().find(|e| predicate(e)).cloned(),
            timeout,
        )
        .await
    }

    async fn wait_until<T>(
        &self,
        check: impl Fn(&SinkState) -> Option<T>,
        timeout: Duration,
    ) -> Option<T> {
        let mut rx = self.changed.subscribe();
        let wait = async {
            loop {
                rx.mark_unchanged();
                if let Some(v) = check(&self.state.lock()) {
                    return Some(v);
                }
                if rx.changed().await.is_err() {
                    return None;
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.ok().flatten()
    }

    fn bump(&self) {
        self.changed.send_modify(|g| *g += 1);
    }
}

#[async_trait]
impl StatusSink for RecordingSink {
    async fn update_pod_status(&self, pod: &Pod, status: &PodStatus) -> Result<()> {
        {
            let mut st = self.state.lock();
            if let Some(e) = st.fail_next.pop_front() {
                return Err(e);
            }
            st.statuses.push(RecordedStatus {
                uid: pod.metadata.uid.clone().unwrap_or_default(),
                namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                name: pod.metadata.name.clone().unwrap_or_default(),
                status: status.clone(),
            });
        }
        self.bump();
        Ok(())
    }

    async fn pod_removed(&self, pod: &Pod) -> Result<()> {
        self.state
            .lock()
            .removed
            .push(pod.metadata.uid.clone().unwrap_or_default());
        self.bump();
        Ok(())
    }

    async fn record_event(&self, event: &Event) -> Result<()> {
        self.state.lock().events.push(event.clone());
        self.bump();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubelet_api::runtime::{ContainerMetadata, Labels, PodSandboxMetadata};

    fn sandbox_config(uid: &str) -> PodSandboxConfig {
        let mut l = Labels::new();
        l.insert(labels::POD_UID.into(), uid.into());
        {
            let mut v = PodSandboxConfig::default();
            v.metadata = PodSandboxMetadata {
                name: format!("pod-{uid}"),
                namespace: "default".into(),
                uid: uid.into(),
                attempt: 0,
            };
            v.labels = l;
            v
        }
    }

    fn container_config(uid: &str, name: &str) -> ContainerConfig {
        let mut l = Labels::new();
        l.insert(labels::POD_UID.into(), uid.into());
        l.insert(labels::CONTAINER_NAME.into(), name.into());
        {
            let mut v = ContainerConfig::default();
            v.metadata = ContainerMetadata {
                name: name.into(),
                attempt: 0,
            };
            v.image = "busybox".into();
            v.labels = l;
            v
        }
    }

    async fn running(rt: &FakeRuntime, uid: &str, name: &str) -> (String, String) {
        let sc = sandbox_config(uid);
        let sb = rt.run_pod_sandbox(&sc).await.expect("sandbox");
        let id = rt
            .create_container(&sb, &container_config(uid, name), &sc)
            .await
            .expect("create");
        rt.start_container(&id).await.expect("start");
        (sb, id)
    }

    #[tokio::test]
    async fn container_lifecycle_records_states_timestamps_and_calls() {
        let rt = FakeRuntime::new();
        let (_sb, id) = running(&rt, "u1", "app").await;
        let st = rt.container_status(&id).await.expect("status");
        assert_eq!(st.state, ContainerState::Running);
        assert!(st.started_at.is_some());
        rt.stop_container(&id, Duration::from_secs(30))
            .await
            .expect("stop");
        let st = rt.container_status(&id).await.expect("status");
        assert_eq!(st.state, ContainerState::Exited);
        assert_eq!(st.exit_code, 137);
        assert_eq!(st.reason, "Error");
        assert!(st.finished_at >= st.started_at);
        let calls = rt.calls();
        assert!(calls.contains(&"create_container app".to_string()));
        assert!(calls.contains(&format!("start_container {id}")));
        assert!(calls.contains(&format!("stop_container {id} 30s")));
        rt.remove_container(&id).await.expect("remove");
        let err = rt.container_status(&id).await.expect_err("gone");
        assert!(err.is_not_found());
        rt.remove_container(&id).await.expect("idempotent remove");
    }

    #[tokio::test]
    async fn stopping_a_sandbox_stops_its_containers_and_lists_filter() {
        let rt = FakeRuntime::new();
        let (sb1, c1) = running(&rt, "u1", "app").await;
        let (_sb2, c2) = running(&rt, "u2", "app").await;
        rt.stop_pod_sandbox(&sb1).await.expect("stop sandbox");
        assert_eq!(
            rt.container_status(&c1).await.expect("c1").state,
            ContainerState::Exited
        );
        assert_eq!(
            rt.container_status(&c2).await.expect("c2").state,
            ContainerState::Running
        );
        let mut sel = Labels::new();
        sel.insert(labels::POD_UID.into(), "u2".into());
        let listed = rt
            .list_containers(&ContainerFilter {
                label_selector: sel,
                ..Default::default()
            })
            .await
            .expect("list");
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].id, c2);
        let ready = rt
            .list_pod_sandboxes(&SandboxFilter {
                state: Some(SandboxState::Ready),
                ..Default::default()
            })
            .await
            .expect("list");
        assert_eq!(ready.len(), 1);
        let err = rt
            .create_container(&sb1, &container_config("u1", "x"), &sandbox_config("u1"))
            .await
            .expect_err("sandbox not ready");
        assert_eq!(err.kind(), ErrorKind::FailedPrecondition);
    }

    #[tokio::test]
    async fn injected_failures_exit_codes_images_and_exec() {
        let rt = FakeRuntime::new();
        rt.fail_next(FakeOp::ListContainers, Error::unavailable("down"));
        let err = rt
            .list_containers(&ContainerFilter::default())
            .await
            .expect_err("injected");
        assert_eq!(err.kind(), ErrorKind::Unavailable);
        rt.list_containers(&ContainerFilter::default())
            .await
            .expect("only once");

        let (_sb, id) = running(&rt, "u1", "app").await;
        rt.exit_container(&id, 3).expect("exit");
        let st = rt.container_status(&id).await.expect("status");
        assert_eq!((st.exit_code, st.reason.as_str()), (3, "Error"));

        rt.set_image_present("nginx", false);
        let spec = ImageSpec::new("nginx");
        assert!(rt.image_status(&spec).await.expect("status").is_none());
        let err = rt
            .create_container(
                &rt.sandboxes()[0].id,
                &{
                    let mut v = container_config("u1", "web");
                    v.image = "nginx".into();
                    v
                },
                &sandbox_config("u1"),
            )
            .await
            .expect_err("absent image");
        assert!(err.is_not_found());
        rt.pull_image(&spec, None, &sandbox_config("u1"))
            .await
            .expect("pull");
        assert!(rt.image_status(&spec).await.expect("status").is_some());
        rt.add_image("reg.io/big", 5 << 20, false);
        rt.add_image("reg.io/pause", 1 << 20, true);
        let listed = rt.list_images().await.expect("list");
        assert!(
            listed
                .iter()
                .any(|i| i.repo_tags == ["reg.io/pause"] && i.pinned && i.size == 1 << 20),
            "{listed:?}"
        );
        let big = listed
            .iter()
            .find(|i| i.repo_tags == ["reg.io/big"])
            .expect("listed");
        rt.remove_image(&ImageSpec::new(big.id.clone()))
            .await
            .expect("remove");
        assert_eq!(
            rt.list_images().await.expect("list").len(),
            listed.len() - 1
        );
        rt.require_pull_credentials("private.io/", "alice", "pw");
        let private = ImageSpec::new("private.io/app");
        let err = rt
            .pull_image(&private, None, &sandbox_config("u1"))
            .await
            .expect_err("anonymous");
        assert_eq!(err.kind(), ErrorKind::PermissionDenied);
        rt.pull_image(
            &private,
            Some(&AuthConfig::basic("alice", "pw")),
            &sandbox_config("u1"),
        )
        .await
        .expect("with credentials");

        let (_sb, id2) = running(&rt, "u2", "app").await;
        rt.set_exec_handler(|_, cmd| {
            Ok(ExecResult {
                stdout: cmd.join(" ").into_bytes(),
                exit_code: 7,
                ..Default::default()
            })
        });
        let r = rt
            .exec_sync(&id2, &["echo".into(), "hi".into()], Duration::from_secs(1))
            .await
            .expect("exec");
        assert_eq!((r.exit_code, r.stdout), (7, b"echo hi".to_vec()));
        assert!(rt.calls().contains(&format!("exec_sync {id2} echo hi")));
    }

    #[tokio::test(start_paused = true)]
    async fn call_delays_slow_only_the_targeted_pod_and_auto_exit_follows_tokio_time() {
        let rt = Arc::new(FakeRuntime::new());
        let (_sb, slow) = running(&rt, "slow", "app").await;
        let (_sb, fast) = running(&rt, "fast", "app").await;
        rt.set_call_delay("slow", Duration::from_secs(60));
        let start = Instant::now();
        rt.container_status(&fast).await.expect("fast");
        assert!(start.elapsed() < Duration::from_millis(1));
        rt.container_status(&slow).await.expect("slow");
        assert!(start.elapsed() >= Duration::from_secs(60));

        rt.set_auto_exit("job", Duration::from_secs(5), 0);
        let (_sb, job) = running(&rt, "u3", "job").await;
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert_eq!(
            rt.container_status(&job).await.expect("job").state,
            ContainerState::Running
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        let st = rt.container_status(&job).await.expect("job");
        assert_eq!(
            (st.state, st.reason.as_str()),
            (ContainerState::Exited, "Completed")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn recording_sink_wait_for_sees_later_statuses_and_times_out() {
        let sink = Arc::new(RecordingSink::new());
        let s2 = sink.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let mut pod = Pod::default();
            pod.metadata.uid = Some("u".into());
            let status = PodStatus {
                phase: Some("Failed".into()),
                ..Default::default()
            };
            s2.update_pod_status(&pod, &status).await.expect("record");
        });
        let got = sink
            .wait_for(
                |r| r.status.phase.as_deref() == Some("Failed"),
                Duration::from_secs(5),
            )
            .await;
        assert_eq!(got.map(|r| r.uid).as_deref(), Some("u"));
        assert_eq!(sink.statuses("u").len(), 1);
        let none = sink
            .wait_for(
                |r| r.status.phase.as_deref() == Some("Running"),
                Duration::from_secs(5),
            )
            .await;
        assert!(none.is_none());
    }
}
