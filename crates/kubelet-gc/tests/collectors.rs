//! The collectors on the in-memory runtime: which images, containers, sandboxes, directories and
//! log files go, and which stay.
#![allow(clippy::unwrap_used, clippy::field_reassign_with_default)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kubelet_api::runtime::{
    ContainerConfig, ContainerMetadata, Labels, PodSandboxConfig, PodSandboxMetadata, labels,
};
use kubelet_api::{
    AgentDirs, AgentHandle, ContainerRuntime, KillPodOptions, NotRunning, PlegHealth, PluginStatus,
    StatusReader, StatusWriter, SyncLoopStalled,
};
use kubelet_core::testing::{FakeOp, FakeRuntime};
use kubelet_gc::containers::ContainerGc;
use kubelet_gc::images::{FsUsage, ImageGc, Reason};
use kubelet_gc::logs::LogRotator;
use kubelet_gc::{
    ContainerGcPolicy, GcConfig, GcError, GcPlugin, ImageGcPolicy, LogRotationPolicy,
};

/// The agent as the collectors see it: the pods it knows and whether sources are ready.
struct Agent {
    statuses: StatusWriter,
    ready: AtomicBool,
}

impl Agent {
    fn new(known: &[&str], ready: bool) -> Arc<Self> {
        let statuses = StatusWriter::new();
        for uid in known {
            let mut p = Pod::default();
            p.metadata.uid = Some(uid.to_string());
            statuses.put(Arc::new(p), Arc::new(PodStatus::default()));
        }
        Arc::new(Self {
            statuses,
            ready: AtomicBool::new(ready),
        })
    }
}

#[async_trait]
impl AgentHandle for Agent {
    fn statuses(&self) -> StatusReader {
        self.statuses.reader()
    }
    fn pleg_health(&self) -> PlegHealth {
        PlegHealth::Healthy
    }
    fn sync_loop_health(&self, _: Duration) -> Result<(), SyncLoopStalled> {
        Ok(())
    }
    fn plugins(&self) -> Vec<PluginStatus> {
        Vec::new()
    }
    fn metrics(&self) -> Arc<prometheus_client::registry::Registry> {
        Arc::new(prometheus_client::registry::Registry::default())
    }
    fn sync_pod(&self, _: &str) {}
    async fn kill_pod(&self, _: &str, _: KillPodOptions) -> Result<(), NotRunning> {
        Ok(())
    }
    fn sources_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }
}

fn sandbox(uid: &str, attempt: u32, logs: &Path) -> PodSandboxConfig {
    let mut c = PodSandboxConfig::new(PodSandboxMetadata {
        name: format!("pod-{uid}"),
        namespace: "default".into(),
        uid: uid.into(),
        attempt,
    });
    let mut l = Labels::new();
    l.insert(labels::POD_UID.into(), uid.into());
    l.insert(labels::MANAGED_BY.into(), "true".into());
    c.labels = l;
    c.log_directory = logs.join(format!("default_pod-{uid}_{uid}"));
    c
}

fn container(uid: &str, name: &str, attempt: u32, image: &str) -> ContainerConfig {
    let mut c = ContainerConfig::new(
        ContainerMetadata {
            name: name.into(),
            attempt,
        },
        image,
    );
    let mut l = Labels::new();
    l.insert(labels::POD_UID.into(), uid.into());
    l.insert(labels::POD_NAME.into(), format!("pod-{uid}"));
    l.insert(labels::POD_NAMESPACE.into(), "default".into());
    l.insert(labels::CONTAINER_NAME.into(), name.into());
    l.insert(labels::MANAGED_BY.into(), "true".into());
    c.labels = l;
    c.log_path = format!("{name}/{attempt}.log");
    c
}

/// Runs `count` instances of container `name` in a sandbox of pod `uid`, all exited but the
/// last when `last_running`; writes each one's log file. Returns the sandbox ID and the
/// container IDs, oldest first.
async fn instances(
    rt: &FakeRuntime,
    logs: &Path,
    uid: &str,
    name: &str,
    count: u32,
    last_running: bool,
) -> (String, Vec<String>) {
    let sb = sandbox(uid, 0, logs);
    let sid = rt.run_pod_sandbox(&sb).await.unwrap();
    let mut ids = Vec::new();
    for attempt in 0..count {
        let id = rt
            .create_container(&sid, &container(uid, name, attempt, "busybox"), &sb)
            .await
            .unwrap();
        rt.start_container(&id).await.unwrap();
        let log = rt.container_status(&id).await.unwrap().log_path;
        std::fs::create_dir_all(log.parent().unwrap()).unwrap();
        std::fs::write(&log, "x\n").unwrap();
        if attempt + 1 < count || !last_running {
            rt.exit_container(&id, 1).unwrap();
        }
        ids.push(id);
    }
    (sid, ids)
}

fn dirs(tmp: &Path) -> AgentDirs {
    AgentDirs {
        root_dir: tmp.join("root"),
        pod_log_dir: tmp.join("logs"),
    }
}

fn no_grace() -> ContainerGcPolicy {
    let mut p = ContainerGcPolicy::default();
    p.orphan_grace = Duration::ZERO;
    p
}

#[tokio::test]
async fn dead_containers_beyond_the_newest_go_with_their_logs_and_running_ones_stay() {
    let tmp = tempfile::tempdir().unwrap();
    let d = dirs(tmp.path());
    let rt = FakeRuntime::new();
    let (_, ids) = instances(&rt, &d.pod_log_dir, "p1", "app", 4, true).await;
    let (_, side) = instances(&rt, &d.pod_log_dir, "p1-side", "side", 2, false).await;
    let logs: Vec<PathBuf> = {
        let mut v = Vec::new();
        for id in &ids {
            v.push(rt.container_status(id).await.unwrap().log_path);
        }
        v
    };
    // Dead containers another kubelet made in the same runtime (no managed-by label) stay.
    let mut foreign_sb = sandbox("foreign", 0, &d.pod_log_dir);
    foreign_sb.labels.remove(labels::MANAGED_BY);
    let foreign_sid = rt.run_pod_sandbox(&foreign_sb).await.unwrap();
    let mut foreign = Vec::new();
    for attempt in 0..2 {
        let mut c = container("foreign", "app", attempt, "busybox");
        c.labels.remove(labels::MANAGED_BY);
        let id = rt
            .create_container(&foreign_sid, &c, &foreign_sb)
            .await
            .unwrap();
        rt.start_container(&id).await.unwrap();
        rt.exit_container(&id, 1).unwrap();
        foreign.push(id);
    }
    rt.stop_pod_sandbox(&foreign_sid).await.unwrap();
    let gc = ContainerGc::new(no_grace(), d, None);
    let agent = Agent::new(&["p1", "p1-side"], true);
    let out = gc.collect(&rt, agent.as_ref(), false).await.unwrap();
    // Of `app`: attempts 0 and 1 go, 2 (the newest dead) and 3 (running) stay. Of `side`:
    // attempt 0 goes.
    let mut removed = out.containers.clone();
    removed.sort();
    let mut want = vec![ids[0].clone(), ids[1].clone(), side[0].clone()];
    want.sort();
    assert_eq!(removed, want);
    let left: Vec<String> = rt.containers().into_iter().map(|c| c.id).collect();
    assert!(left.contains(&ids[2]) && left.contains(&ids[3]) && left.contains(&side[1]));
    assert!(
        !logs[0].exists() && !logs[1].exists(),
        "removed containers' logs go"
    );
    assert!(logs[2].exists() && logs[3].exists());
}

#[tokio::test]
async fn leftovers_of_unknown_pods_go_only_once_every_source_was_seen() {
    let tmp = tempfile::tempdir().unwrap();
    let d = dirs(tmp.path());
    let rt = FakeRuntime::new();
    let (sid, ids) = instances(&rt, &d.pod_log_dir, "gone", "app", 2, false).await;
    rt.stop_pod_sandbox(&sid).await.unwrap();
    let pod_dir = d.root_dir.join("pods").join("gone");
    std::fs::create_dir_all(pod_dir.join("volumes")).unwrap();
    let log_dir = d.pod_log_dir.join("default_pod-gone_gone");
    assert!(log_dir.exists());
    let gc = ContainerGc::new(no_grace(), d, None);

    let agent = Agent::new(&[], false);
    let out = gc.collect(&rt, agent.as_ref(), false).await.unwrap();
    assert_eq!(
        out.containers,
        [ids[0].clone()],
        "before sources are ready: the policy only"
    );
    assert!(out.sandboxes.is_empty() && out.paths.is_empty());
    assert!(pod_dir.exists() && log_dir.exists());

    agent.ready.store(true, Ordering::Relaxed);
    let out = gc.collect(&rt, agent.as_ref(), false).await.unwrap();
    assert_eq!(out.containers, [ids[1].clone()]);
    assert_eq!(out.sandboxes, [sid]);
    assert!(!pod_dir.exists() && !log_dir.exists(), "{out:?}");
    assert!(rt.containers().is_empty() && rt.sandboxes().is_empty());
}

#[tokio::test]
async fn older_dead_sandboxes_of_a_known_pod_go_and_the_newest_stays() {
    let tmp = tempfile::tempdir().unwrap();
    let d = dirs(tmp.path());
    let rt = FakeRuntime::new();
    let old = rt
        .run_pod_sandbox(&sandbox("p1", 0, &d.pod_log_dir))
        .await
        .unwrap();
    rt.stop_pod_sandbox(&old).await.unwrap();
    let newer = rt
        .run_pod_sandbox(&sandbox("p1", 1, &d.pod_log_dir))
        .await
        .unwrap();
    rt.stop_pod_sandbox(&newer).await.unwrap();
    let gc = ContainerGc::new(no_grace(), d, None);
    let out = gc
        .collect(&rt, Agent::new(&["p1"], true).as_ref(), false)
        .await
        .unwrap();
    assert_eq!(out.sandboxes, [old]);
    assert_eq!(rt.sandboxes().len(), 1);
}

#[tokio::test]
async fn reclaim_removes_the_last_dead_instance_of_finished_pods() {
    let tmp = tempfile::tempdir().unwrap();
    let d = dirs(tmp.path());
    let rt = FakeRuntime::new();
    let (_, ids) = instances(&rt, &d.pod_log_dir, "done", "app", 1, false).await;
    let agent = Agent::new(&[], true);
    let mut p = Pod::default();
    p.metadata.uid = Some("done".into());
    agent.statuses.put(
        Arc::new(p),
        Arc::new(PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        }),
    );
    let gc = ContainerGc::new(no_grace(), d, None);
    let out = gc.collect(&rt, agent.as_ref(), false).await.unwrap();
    assert!(out.containers.is_empty(), "the newest dead instance stays");
    let out = gc.collect(&rt, agent.as_ref(), true).await.unwrap();
    assert_eq!(out.containers, ids);
}

fn image_gc(min_age: Duration, pinned: &[&str]) -> ImageGc {
    let mut p = ImageGcPolicy::default();
    p.min_age = min_age;
    p.pinned_images = pinned.iter().map(|s| s.to_string()).collect();
    ImageGc::new(p)
}

async fn run_with_image(rt: &FakeRuntime, uid: &str, image: &str) -> String {
    let sb = sandbox(uid, 0, Path::new("/nonexistent"));
    let sid = rt.run_pod_sandbox(&sb).await.unwrap();
    let id = rt
        .create_container(&sid, &container(uid, "app", 0, image), &sb)
        .await
        .unwrap();
    rt.start_container(&id).await.unwrap();
    id
}

async fn images(rt: &FakeRuntime) -> Vec<String> {
    let mut v: Vec<String> = rt
        .images()
        .unwrap()
        .list_images()
        .await
        .unwrap()
        .into_iter()
        .flat_map(|i| i.repo_tags)
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn above_the_high_threshold_unused_images_go_least_recently_used_first() {
    let rt = FakeRuntime::new();
    rt.set_images_present_by_default(false);
    for (name, size) in [("a", 10), ("b", 20), ("c", 30), ("in-use", 40)] {
        rt.add_image(name, size, false);
    }
    rt.add_image("runtime-pinned", 50, true);
    rt.add_image("pause", 60, false);
    let gc = image_gc(Duration::ZERO, &["pause"]);
    // `b` is used first, then its container goes: it is the most recently used of the unused.
    let b_user = run_with_image(&rt, "p-b", "b").await;
    gc.detect(&rt, tokio::time::Instant::now()).await.unwrap();
    rt.remove_container(&b_user).await.unwrap();
    run_with_image(&rt, "p-in-use", "in-use").await;
    tokio::time::sleep(Duration::from_millis(5)).await;

    // 86 % used of 1000 bytes: 60 bytes to free down to 80 %. The never used `a` and `c` go
    // first (40 bytes), then `b` (60 in all); `in-use`, the runtime's pin and the configured
    // sandbox image stay.
    let out = gc
        .collect(
            &rt,
            Some(FsUsage {
                capacity: 1000,
                available: 140,
            }),
        )
        .await
        .unwrap();
    let removed: Vec<&str> = out
        .removed
        .iter()
        .map(|(id, r)| {
            assert_eq!(*r, Reason::Space);
            id.strip_prefix("fake-image:").unwrap()
        })
        .collect();
    assert_eq!(removed, ["a", "c", "b"]);
    assert_eq!(out.freed, 60);
    assert_eq!(out.usage_percent, Some(86));
    assert_eq!(images(&rt).await, ["in-use", "pause", "runtime-pinned"]);

    // Below the threshold nothing goes; asked for more than is eligible, it says so.
    rt.add_image("d", 5, false);
    let out = gc
        .collect(
            &rt,
            Some(FsUsage {
                capacity: 1000,
                available: 160,
            }),
        )
        .await
        .unwrap();
    assert!(out.removed.is_empty());
    let err = gc
        .collect(
            &rt,
            Some(FsUsage {
                capacity: 1000,
                available: 10,
            }),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            GcError::FreeDiskSpace {
                wanted: 190,
                freed: 5
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .starts_with("Failed to garbage collect required amount of images")
    );
    let err = gc
        .collect(
            &rt,
            Some(FsUsage {
                capacity: 0,
                available: 0,
            }),
        )
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "invalid capacity 0 on image filesystem");
}

#[tokio::test]
async fn young_images_stay_and_a_refused_removal_does_not_stop_the_run() {
    let rt = FakeRuntime::new();
    rt.set_images_present_by_default(false);
    rt.add_image("a", 10, false);
    rt.add_image("b", 10, false);
    let young = image_gc(Duration::from_secs(3600), &[]);
    let out = young.delete_unused(&rt).await.unwrap();
    assert!(out.removed.is_empty(), "first seen just now");
    let gc = image_gc(Duration::ZERO, &[]);
    rt.fail_next(
        FakeOp::RemoveImage,
        kubelet_api::Error::new(
            kubelet_api::ErrorKind::FailedPrecondition,
            "image is in use",
        ),
    );
    let out = gc.delete_unused(&rt).await.unwrap();
    assert_eq!(out.removed.len(), 1, "{out:?}");
    assert_eq!(images(&rt).await.len(), 1);
}

/// A running container's log directory removed under it is recreated, the log reopened, and
/// the container named in the outcome (the plugin's warning event); once only.
#[tokio::test]
async fn a_removed_log_directory_is_recreated_reopened_and_reported_once() {
    let tmp = tempfile::tempdir().unwrap();
    let d = dirs(tmp.path());
    let rt = FakeRuntime::new();
    let (_, ids) = instances(&rt, &d.pod_log_dir, "p1", "app", 1, true).await;
    let log = rt.container_status(&ids[0]).await.unwrap().log_path;
    let dir = log.parent().unwrap().to_path_buf();
    std::fs::remove_dir_all(&dir).unwrap();
    let rotator = LogRotator::new(LogRotationPolicy::default());
    let out = rotator.rotate_all(&rt).await.unwrap();
    assert!(dir.is_dir(), "recreated");
    assert_eq!(out.recreated.len(), 1, "{out:?}");
    let (involved, reported) = &out.recreated[0];
    assert_eq!(reported, &dir);
    assert_eq!(
        (
            involved.namespace.as_str(),
            involved.name.as_str(),
            involved.uid.as_str()
        ),
        ("default", "pod-p1", "p1")
    );
    assert_eq!(involved.field_path, "spec.containers{app}");
    assert!(
        rt.calls()
            .iter()
            .any(|c| c.starts_with("reopen_container_log"))
    );
    // The directory is back: the next check reports nothing.
    assert!(rotator.rotate_all(&rt).await.unwrap().recreated.is_empty());
}

/// A container's status is asked once for its log path, not on every check; a new container's
/// is asked when it appears, and a rotation still follows the log's size.
#[tokio::test]
async fn each_containers_log_path_is_asked_once() {
    let tmp = tempfile::tempdir().unwrap();
    let d = dirs(tmp.path());
    let rt = FakeRuntime::new();
    let (_, ids) = instances(&rt, &d.pod_log_dir, "p1", "app", 1, true).await;
    let log = rt.container_status(&ids[0]).await.unwrap().log_path;
    let statuses = |rt: &FakeRuntime| {
        rt.calls()
            .iter()
            .filter(|c| c.starts_with("container_status"))
            .count()
    };
    let mut policy = LogRotationPolicy::default();
    policy.max_size = 1024;
    let rotator = LogRotator::new(policy);
    let before = statuses(&rt);
    for _ in 0..3 {
        assert!(rotator.rotate_all(&rt).await.unwrap().rotated.is_empty());
    }
    assert_eq!(statuses(&rt), before + 1, "one status for three checks");

    let (_, more) = instances(&rt, &d.pod_log_dir, "p2", "app", 1, true).await;
    let before = statuses(&rt);
    rotator.rotate_all(&rt).await.unwrap();
    rotator.rotate_all(&rt).await.unwrap();
    assert_eq!(
        statuses(&rt),
        before + 1,
        "the new container's status, once"
    );

    std::fs::write(&log, vec![b'x'; 2048]).unwrap();
    let out = rotator.rotate_all(&rt).await.unwrap();
    assert_eq!(
        out.rotated.len(),
        1,
        "the known path is still checked: {out:?}"
    );
    assert!(!more.is_empty());
}

/// With the engine's log links, a new container's log path is read from its link: no status is
/// asked, and the linked log is rotated at its size; a container without a link is still asked.
#[tokio::test]
async fn log_paths_are_read_from_the_log_links_without_asking_the_runtime() {
    let tmp = tempfile::tempdir().unwrap();
    let d = dirs(tmp.path());
    let links = tmp.path().join("containers");
    std::fs::create_dir_all(&links).unwrap();
    let rt = FakeRuntime::new();
    let (_, linked) = instances(&rt, &d.pod_log_dir, "p1", "app", 1, true).await;
    let (_, unlinked) = instances(&rt, &d.pod_log_dir, "p2", "app", 1, true).await;
    let log = rt.container_status(&linked[0]).await.unwrap().log_path;
    std::os::unix::fs::symlink(
        &log,
        links.join(kubelet_api::pod::log_link_name(
            "pod-p1", "default", "app", &linked[0],
        )),
    )
    .unwrap();
    let statuses = |rt: &FakeRuntime, id: &str| {
        rt.calls()
            .iter()
            .filter(|c| c.starts_with("container_status") && c.contains(id))
            .count()
    };
    let mut policy = LogRotationPolicy::default();
    policy.max_size = 1024;
    let rotator = LogRotator::new(policy).with_log_links(Some(links));
    let (before_linked, before_unlinked) = (statuses(&rt, &linked[0]), statuses(&rt, &unlinked[0]));
    assert!(rotator.rotate_all(&rt).await.unwrap().rotated.is_empty());
    assert!(rotator.rotate_all(&rt).await.unwrap().rotated.is_empty());
    assert_eq!(
        statuses(&rt, &linked[0]),
        before_linked,
        "read from the link"
    );
    assert_eq!(
        statuses(&rt, &unlinked[0]),
        before_unlinked + 1,
        "no link: asked once"
    );

    std::fs::write(&log, vec![b'x'; 2048]).unwrap();
    let out = rotator.rotate_all(&rt).await.unwrap();
    assert_eq!(out.rotated.len(), 1, "{out:?}");
    assert!(out.rotated[0].starts_with(log.parent().unwrap()));
    assert_eq!(statuses(&rt, &linked[0]), before_linked);
}

#[tokio::test]
async fn a_log_at_its_size_is_rotated_and_put_back_when_the_runtime_cannot_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    let d = dirs(tmp.path());
    let rt = FakeRuntime::new();
    let (_, ids) = instances(&rt, &d.pod_log_dir, "p1", "app", 1, true).await;
    let log = rt.container_status(&ids[0]).await.unwrap().log_path;
    let mut policy = LogRotationPolicy::default();
    policy.max_size = 1024;
    policy.max_files = 3;
    let rotator = LogRotator::new(policy);
    std::fs::write(&log, "small\n").unwrap();
    assert!(rotator.rotate_all(&rt).await.unwrap().rotated.is_empty());

    std::fs::write(&log, vec![b'x'; 2048]).unwrap();
    rt.fail_next(
        FakeOp::ReopenContainerLog,
        kubelet_api::Error::unavailable("shim gone"),
    );
    let out = rotator.rotate_all(&rt).await.unwrap();
    assert!(out.rotated.is_empty());
    assert_eq!(std::fs::metadata(&log).unwrap().len(), 2048, "renamed back");

    let out = rotator.rotate_all(&rt).await.unwrap();
    assert_eq!(out.rotated.len(), 1);
    assert!(out.rotated[0].exists() && !log.exists());
    assert!(
        rt.calls()
            .iter()
            .filter(|c| c.starts_with("reopen_container_log"))
            .count()
            >= 2
    );
}

#[tokio::test]
async fn the_plugin_checks_its_configuration_and_reclaims_only_while_running() {
    let mut bad = GcConfig::new();
    bad.images.low_threshold_percent = 95;
    assert!(matches!(GcPlugin::new(bad), Err(GcError::InvalidConfig(_))));
    let plugin = GcPlugin::new(GcConfig::new()).unwrap();
    let err = plugin.reclaimer().delete_unused_images().await.unwrap_err();
    assert_eq!(err.kind(), kubelet_api::ErrorKind::Unavailable);
}

/// Runs `plugin` on node `node-1` with `runtime` and `agent`; cancel the token to stop it.
fn run_plugin(
    plugin: &Arc<GcPlugin>,
    dirs: AgentDirs,
    runtime: Arc<FakeRuntime>,
    agent: Arc<Agent>,
) -> (
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<kubelet_api::Result<()>>,
) {
    use kubelet_api::AgentPlugin;
    let runtime: Arc<dyn ContainerRuntime> = runtime;
    let ctx = kubelet_api::PluginContext::new(
        "node-1",
        dirs,
        runtime,
        kubelet_api::EventRecorder::channel(16).0,
        agent,
        kubelet_api::NodeConditionReader::default(),
        Arc::default(),
    );
    let shutdown = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn({
        let (plugin, shutdown) = (plugin.clone(), shutdown.clone());
        async move { plugin.run(ctx, shutdown).await }
    });
    (shutdown, task)
}

#[tokio::test]
async fn the_running_plugin_reports_the_nodes_images_and_reclaims() {
    use kubelet_api::AgentPlugin;
    let tmp = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeRuntime::new());
    fake.set_images_present_by_default(false);
    fake.add_image("registry.example/big:1", 300, false);
    fake.add_image("registry.example/small:1", 100, false);
    let plugin = Arc::new(GcPlugin::new(GcConfig::new()).unwrap());
    assert_eq!(
        plugin.node_resources().images,
        None,
        "nothing listed before it runs"
    );
    let (shutdown, task) = run_plugin(
        &plugin,
        dirs(tmp.path()),
        fake.clone(),
        Agent::new(&[], true),
    );
    let listed = loop {
        if let Some(images) = plugin.node_resources().images {
            break images;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let names: Vec<&str> = listed
        .iter()
        .map(|i| i.names.as_ref().unwrap()[0].as_str())
        .collect();
    assert_eq!(
        names,
        ["registry.example/big:1", "registry.example/small:1"]
    );
    assert_eq!(listed[0].size_bytes, Some(300));
    // While it runs, reclaim works (the images are younger than the minimum age: kept).
    plugin.reclaimer().delete_unused_containers().await.unwrap();
    plugin.reclaimer().delete_unused_images().await.unwrap();
    assert_eq!(images(&fake).await.len(), 2);
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

/// The status of pod `uid` (`default/pod-<uid>`) with container `name` running as runtime
/// container `id`.
fn running_status(uid: &str, name: &str, id: &str) -> (Arc<Pod>, Arc<PodStatus>) {
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateRunning, ContainerStatus};
    let mut p = Pod::default();
    p.metadata.uid = Some(uid.to_string());
    p.metadata.name = Some(format!("pod-{uid}"));
    p.metadata.namespace = Some("default".into());
    let mut cs = ContainerStatus::default();
    cs.name = name.into();
    cs.container_id = Some(format!("fake://{id}"));
    cs.state = Some(ContainerState {
        running: Some(ContainerStateRunning::default()),
        ..Default::default()
    });
    let mut s = PodStatus::default();
    s.container_statuses = Some(vec![cs]);
    (Arc::new(p), Arc::new(s))
}

/// In an agent, the log rotation checks the running containers of the pod statuses: a
/// container only the runtime knows is left alone, and a container whose status appears later
/// is checked from then on (the statuses are read again when one changes).
#[tokio::test]
async fn the_running_plugin_rotates_the_logs_of_the_containers_the_pod_statuses_report() {
    let tmp = tempfile::tempdir().unwrap();
    let d = dirs(tmp.path());
    let fake = Arc::new(FakeRuntime::new());
    let (_, reported) = instances(&fake, &d.pod_log_dir, "p1", "app", 1, true).await;
    let (_, unreported) = instances(&fake, &d.pod_log_dir, "p2", "app", 1, true).await;
    let log_of = |id: &str| {
        let fake = fake.clone();
        let id = id.to_string();
        async move { fake.container_status(&id).await.unwrap().log_path }
    };
    let (log1, log2) = (log_of(&reported[0]).await, log_of(&unreported[0]).await);
    std::fs::write(&log1, vec![b'x'; 2048]).unwrap();
    std::fs::write(&log2, vec![b'x'; 2048]).unwrap();
    let rotated = |log: &Path| {
        let name = format!("{}.", log.file_name().unwrap().to_str().unwrap());
        std::fs::read_dir(log.parent().unwrap())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_str()
                    .unwrap()
                    .starts_with(&name)
            })
            .count()
    };

    let agent = Agent::new(&[], true);
    let (pod, status) = running_status("p1", "app", &reported[0]);
    agent.statuses.put(pod, status);
    let mut config = GcConfig::new();
    config.logs.max_size = 1024;
    config.logs.monitor_interval = Duration::from_millis(20);
    let plugin = Arc::new(GcPlugin::new(config).unwrap());
    let (shutdown, task) = run_plugin(&plugin, d.clone(), fake.clone(), agent.clone());
    let wait_rotated = |log: PathBuf| async move {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while rotated(&log) == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "{} not rotated",
                log.display()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    wait_rotated(log1.clone()).await;
    // Several more checks: the container no status reports stays as it is.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(rotated(&log2), 0, "a container only the runtime knows");
    assert_eq!(std::fs::metadata(&log2).unwrap().len(), 2048);

    let (pod, status) = running_status("p2", "app", &unreported[0]);
    agent.statuses.put(pod, status);
    wait_rotated(log2.clone()).await;
    assert_eq!(rotated(&log1), 1, "rotated once: its new log is small");
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

/// A periodic run after one that found nothing is skipped while no pod status changed, but
/// for one run in `FULL_RUN_EVERY`; a status change or a reclaim (`all`) runs at once.
#[tokio::test]
async fn periodic_runs_after_a_run_that_found_nothing_wait_for_a_status_change_or_the_full_run() {
    use kubelet_gc::containers::FULL_RUN_EVERY;
    let tmp = tempfile::tempdir().unwrap();
    let d = dirs(tmp.path());
    let rt = FakeRuntime::new();
    instances(&rt, &d.pod_log_dir, "p1", "app", 1, true).await;
    let listings = |rt: &FakeRuntime| {
        rt.calls()
            .iter()
            .filter(|c| c.starts_with("list_containers"))
            .count()
    };
    let gc = ContainerGc::new(no_grace(), d.clone(), None);
    let agent = Agent::new(&["p1"], true);
    let out = gc.collect(&rt, agent.as_ref(), false).await.unwrap();
    assert!(out.containers.is_empty(), "{out:?}");

    // Dead instances behind the statuses' back: not seen while nothing changed.
    let (_, dead) = instances(&rt, &d.pod_log_dir, "p1", "app", 3, false).await;
    let before = listings(&rt);
    let out = gc.collect(&rt, agent.as_ref(), false).await.unwrap();
    assert!(out.containers.is_empty());
    assert_eq!(listings(&rt), before, "skipped: no listing");

    // A status change: the next run looks, and removes all but the newest dead instance.
    let (pod, status) = running_status("p1", "app", "whatever");
    agent.statuses.put(pod, status);
    let out = gc.collect(&rt, agent.as_ref(), false).await.unwrap();
    let mut removed = out.containers.clone();
    removed.sort();
    let mut want = vec![dead[0].clone(), dead[1].clone()];
    want.sort();
    assert_eq!(removed, want);

    // That run found something: the next one runs too, finds nothing, and the following ones
    // are skipped until the full run.
    let out = gc.collect(&rt, agent.as_ref(), false).await.unwrap();
    assert!(
        out.containers.is_empty() && out.sandboxes.is_empty(),
        "{out:?}"
    );
    let (_, later) = instances(&rt, &d.pod_log_dir, "p1", "app", 2, false).await;
    let before = listings(&rt);
    for _ in 1..FULL_RUN_EVERY {
        let out = gc.collect(&rt, agent.as_ref(), false).await.unwrap();
        assert!(out.containers.is_empty());
    }
    assert_eq!(listings(&rt), before, "skipped until the full run");
    let out = gc.collect(&rt, agent.as_ref(), false).await.unwrap();
    assert!(
        out.containers.contains(&later[0]),
        "the full run collects what no status told of: {out:?}"
    );

    // A reclaim is never skipped.
    gc.collect(&rt, agent.as_ref(), false).await.unwrap();
    let before = listings(&rt);
    gc.collect(&rt, agent.as_ref(), true).await.unwrap();
    assert_eq!(listings(&rt), before + 1);
}
