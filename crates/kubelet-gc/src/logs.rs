//! [`LogRotator`]: the kubelet's container log rotation (`container_log_manager.go`).
//!
//! Every check takes the running containers and, for each whose log file has reached
//! `containerLogMaxSize`:
//!
//! 1. renames the log to `<log>.<YYYYMMDD-hhmmss>` and asks the runtime to reopen it
//!    ([`ContainerRuntime::reopen_container_log`]); if that fails, renames it back;
//! 2. then, in the background, deletes leftovers of an interrupted run (`*.tmp`, and
//!    uncompressed files whose `.gz` exists), deletes the oldest rotated files until at most
//!    `containerLogMaxFiles − 1` remain, and compresses every rotated file but the newest
//!    (`<f>.gz.tmp`, renamed to `<f>.gz`).
//!
//! The newest rotated file stays uncompressed, so that a reader following the log finishes it.
//! Deliberate difference: the kubelet compresses before it renames, which holds the log at its
//! size limit for as long as compressing takes; here the container's output moves to the new
//! file first.
//! A log file found missing (a rotation that failed half-way, or the file or its directory
//! removed under a running container) is reopened, its directory recreated first. Deliberate
//! difference: the timestamp is UTC (the kubelet uses the node's local time). A runtime that
//! cannot reopen logs is logged once and its logs are left alone.
//!
//! A container's log path is fixed when it is created, so it is looked up once per container:
//! from the log link the engine made for it in `/var/log/containers`
//! ([`LogRotator::with_log_links`]), or, without one, from `log_path` of the runtime's status.
//! Deliberate difference: the kubelet asks every running container's status on every check
//! (every 10 s); on containerd that was a tenth of a pod start's CRI calls.
//!
//! Where the running containers come from: [`LogRotator::rotate_all`] lists them from the
//! runtime, as the kubelet does on every check; [`LogRotator::rotate`] takes them from the
//! caller. The [`GcPlugin`](crate::GcPlugin) passes the running containers of the agent's pod
//! statuses ([`running_containers`]), read again only when a status changed. Deliberate
//! difference: listing every running container from the runtime every 10 s was a third of an
//! idle agent's CPU time at 1,000 pods; a container the agent does not know (created behind its
//! back) is not rotated, and the agent's housekeeping stops it.

use std::io::Write;
use std::path::{Path, PathBuf};

use kubelet_api::runtime::{ContainerFilter, ContainerState};
use kubelet_api::{ContainerRuntime, InvolvedObject};
use parking_lot::Mutex;

use crate::config::LogRotationPolicy;
use crate::error::GcError;

/// What one check did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RotationOutcome {
    /// Logs rotated (the paths of the files they were renamed to); their older rotated files
    /// are compressed and pruned in the background.
    pub rotated: Vec<PathBuf>,
    /// Log directories found removed under a running container, recreated (and the log
    /// reopened): the container (from its labels) and the directory. The plugin records a
    /// warning event for each.
    pub recreated: Vec<(InvolvedObject, PathBuf)>,
}

/// A running container whose log a check looks at: its runtime ID and the pod container it
/// runs (which names its log link and the events about it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunningContainer {
    /// The runtime's container ID (without a `<runtime>://` scheme).
    pub id: String,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod_name: String,
    /// The pod's UID.
    pub pod_uid: String,
    /// The container's name in the pod.
    pub container_name: String,
}

impl RunningContainer {
    /// Container `id` of pod `namespace/pod_name` (`pod_uid`), named `container_name` there.
    pub fn new(
        id: impl Into<String>,
        namespace: impl Into<String>,
        pod_name: impl Into<String>,
        pod_uid: impl Into<String>,
        container_name: impl Into<String>,
    ) -> Self {
        Self {
            id: id.into(),
            namespace: namespace.into(),
            pod_name: pod_name.into(),
            pod_uid: pod_uid.into(),
            container_name: container_name.into(),
        }
    }

    /// A runtime's container, its pod from the labels the engine sets.
    pub fn from_runtime(c: &kubelet_api::runtime::Container) -> Self {
        use kubelet_api::runtime::labels::{CONTAINER_NAME, POD_NAME, POD_NAMESPACE, POD_UID};
        let get = |k: &str| c.labels.get(k).cloned().unwrap_or_default();
        Self::new(
            c.id.clone(),
            get(POD_NAMESPACE),
            get(POD_NAME),
            get(POD_UID),
            get(CONTAINER_NAME),
        )
    }

    /// The container as an event's object (`spec.containers{name}` of its pod).
    fn involved(&self) -> InvolvedObject {
        InvolvedObject::pod_container(
            self.namespace.as_str(),
            self.pod_name.as_str(),
            self.pod_uid.as_str(),
            &self.container_name,
        )
    }
}

/// The running containers of `pods` as their statuses report them: every container, init
/// container (a restartable one runs beside the others) and ephemeral container whose state is
/// `running` and that has a container ID.
pub fn running_containers(pods: &[kubelet_api::PodWithStatus]) -> Vec<RunningContainer> {
    let mut out = Vec::new();
    for p in pods {
        let s = &p.status;
        let all = s
            .container_statuses
            .iter()
            .flatten()
            .chain(s.init_container_statuses.iter().flatten())
            .chain(s.ephemeral_container_statuses.iter().flatten());
        for cs in all {
            let running = cs.state.as_ref().is_some_and(|st| st.running.is_some());
            let Some(id) = cs.container_id.as_deref().filter(|_| running) else {
                continue;
            };
            let id = kubelet_api::runtime::strip_container_id(id);
            if id.is_empty() {
                continue;
            }
            out.push(RunningContainer::new(
                id,
                kubelet_api::pod::namespace(&p.pod),
                kubelet_api::pod::name(&p.pod),
                kubelet_api::pod::uid(&p.pod),
                cs.name.as_str(),
            ));
        }
    }
    out
}

/// The log rotator; see the [module docs](self).
#[derive(Debug)]
pub struct LogRotator {
    policy: LogRotationPolicy,
    /// The runtime said it cannot reopen logs (logged once).
    unsupported: Mutex<bool>,
    /// Logs whose rotated files are being compressed and pruned, and whether they were rotated
    /// again meanwhile (then the job runs once more).
    busy: std::sync::Arc<Mutex<std::collections::HashMap<PathBuf, bool>>>,
    /// The log path of each running container seen, by ID: a container's log path is fixed
    /// when it is created, so its status is asked once, not on every check (entries go with
    /// their containers).
    log_paths: Mutex<std::collections::HashMap<String, PathBuf>>,
    /// The directory of the engine's log links (`/var/log/containers`), where a new
    /// container's log path is read instead of asked from the runtime.
    links: Option<PathBuf>,
}

/// The target of log link `link`, relative targets taken from the link's directory.
fn read_link(link: &Path) -> Option<PathBuf> {
    let target = std::fs::read_link(link).ok()?;
    if target.is_absolute() {
        Some(target)
    } else {
        Some(link.parent()?.join(target))
    }
}

fn log_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> GcError + 'a {
    move |source| GcError::Log {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// The rotated files of `log` (`<log>.*`), sorted by name (the timestamp suffix sorts them
/// oldest first).
fn rotated_files(log: &Path) -> Result<Vec<PathBuf>, GcError> {
    let (Some(dir), Some(name)) = (log.parent(), log.file_name().and_then(|n| n.to_str())) else {
        return Ok(Vec::new());
    };
    let prefix = format!("{name}.");
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).map_err(log_err("listing", dir))? {
        let Ok(e) = e else { continue };
        if e.file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(&prefix))
        {
            out.push(e.path());
        }
    }
    kubelet_api::sort::by(&mut out, Ord::cmp);
    Ok(out)
}

fn ends_with(p: &Path, suffix: &str) -> bool {
    p.to_str().is_some_and(|s| s.ends_with(suffix))
}

/// Gzip `path` to `<path>.gz` through `<path>.gz.tmp`, then remove `path`.
fn compress(path: &Path) -> Result<(), GcError> {
    let gz = PathBuf::from(format!("{}.gz", path.display()));
    let tmp = PathBuf::from(format!("{}.gz.tmp", path.display()));
    let mut input = std::fs::File::open(path).map_err(log_err("opening", path))?;
    let output = std::fs::File::create(&tmp).map_err(log_err("creating", &tmp))?;
    let mut encoder = flate2::write::GzEncoder::new(output, flate2::Compression::default());
    std::io::copy(&mut input, &mut encoder).map_err(log_err("compressing", path))?;
    let mut output = encoder.finish().map_err(log_err("compressing", path))?;
    output.flush().map_err(log_err("writing", &tmp))?;
    std::fs::rename(&tmp, &gz).map_err(log_err("renaming", &tmp))?;
    std::fs::remove_file(path).map_err(log_err("removing", path))?;
    Ok(())
}

/// Keep `log`'s rotated files in order (after a rotation): delete leftovers of an
/// interrupted run (`*.tmp`, uncompressed files whose `.gz` exists), delete the oldest until at
/// most `max_files − 1` remain (with the current file, `max_files`), and compress all but the
/// newest. Returns the files deleted.
fn maintain(log: &Path, max_files: usize) -> Result<Vec<PathBuf>, GcError> {
    let mut deleted = Vec::new();
    let files = rotated_files(log)?;
    let mut kept = Vec::new();
    for f in files {
        let gz_twin = PathBuf::from(format!("{}.gz", f.display()));
        if ends_with(&f, ".tmp") || (!ends_with(&f, ".gz") && gz_twin.exists()) {
            std::fs::remove_file(&f).map_err(log_err("removing", &f))?;
            deleted.push(f);
        } else {
            kept.push(f);
        }
    }
    let allowed = max_files.saturating_sub(1);
    while kept.len() > allowed {
        let f = kept.remove(0);
        std::fs::remove_file(&f).map_err(log_err("removing", &f))?;
        deleted.push(f);
    }
    if let Some((_newest, older)) = kept.split_last() {
        for f in older.iter().filter(|f| !ends_with(f, ".gz")) {
            compress(f)?;
        }
    }
    Ok(deleted)
}

impl LogRotator {
    /// A rotator with `policy`.
    pub fn new(policy: LogRotationPolicy) -> Self {
        Self {
            policy,
            unsupported: Mutex::new(false),
            busy: std::sync::Arc::default(),
            log_paths: Mutex::default(),
            links: None,
        }
    }

    /// Read a new container's log path from its log link in `dir` (the engine's
    /// `/var/log/containers`, [`kubelet_api::pod::log_link_name`]) instead of asking the runtime
    /// for its status; containers without a link are still asked. `None`: always ask.
    pub fn with_log_links(mut self, dir: Option<PathBuf>) -> Self {
        self.links = dir;
        self
    }

    /// Where container `c`'s log link would be.
    fn link_of(&self, c: &RunningContainer) -> Option<PathBuf> {
        let dir = self.links.as_ref()?;
        if c.pod_name.is_empty() || c.namespace.is_empty() || c.container_name.is_empty() {
            return None;
        }
        Some(dir.join(kubelet_api::pod::log_link_name(
            &c.pod_name,
            &c.namespace,
            &c.container_name,
            &c.id,
        )))
    }

    /// The policy.
    pub fn policy(&self) -> &LogRotationPolicy {
        &self.policy
    }

    /// One check of every running container's log, the running containers listed from
    /// `runtime`.
    pub async fn rotate_all(
        &self,
        runtime: &dyn ContainerRuntime,
    ) -> Result<RotationOutcome, GcError> {
        if !self.enabled() {
            return Ok(RotationOutcome::default());
        }
        let filter = ContainerFilter {
            state: Some(ContainerState::Running),
            ..Default::default()
        };
        let running: Vec<RunningContainer> = runtime
            .list_containers(&filter)
            .await
            .map_err(GcError::runtime("list_containers"))?
            .iter()
            .map(RunningContainer::from_runtime)
            .collect();
        self.rotate(runtime, &running).await
    }

    /// Whether a check does anything: rotation is on (`containerLogMaxSize` above 0) and the
    /// runtime did not say it cannot reopen logs.
    pub fn enabled(&self) -> bool {
        self.policy.max_size != 0 && !*self.unsupported.lock()
    }

    /// One check of the logs of `running`, the containers running now (from
    /// [`running_containers`] of the agent's pod statuses, for example); reopens go to
    /// `runtime`.
    pub async fn rotate(
        &self,
        runtime: &dyn ContainerRuntime,
        running: &[RunningContainer],
    ) -> Result<RotationOutcome, GcError> {
        let mut out = RotationOutcome::default();
        if !self.enabled() {
            return Ok(out);
        }
        // Each container's log path: known from an earlier check, else read from the log link
        // the engine made for it (no runtime call), else from the runtime's status.
        let mut logs: Vec<(&RunningContainer, Option<PathBuf>)> = Vec::with_capacity(running.len());
        let mut links = Vec::new();
        {
            let known = self.log_paths.lock();
            for c in running {
                let log = known.get(&c.id).cloned();
                if log.is_none()
                    && let Some(link) = self.link_of(c)
                {
                    links.push((logs.len(), link));
                }
                logs.push((c, log));
            }
        }
        // The links' targets and every log's size in one blocking task (not one per log): most
        // logs are below the limit and need nothing more. A log that is missing or unreadable
        // is looked at again below.
        let paths: Vec<Option<PathBuf>> = logs.iter().map(|(_, log)| log.clone()).collect();
        let (paths, sizes) = tokio::task::spawn_blocking(move || {
            let mut paths = paths;
            for (i, link) in links {
                if let Some(target) = read_link(&link)
                    && let Some(slot) = paths.get_mut(i)
                {
                    *slot = Some(target);
                }
            }
            let sizes: Vec<Option<u64>> = paths
                .iter()
                .map(|p| {
                    p.as_ref()
                        .and_then(|p| std::fs::metadata(p).ok())
                        .map(|m| m.len())
                })
                .collect();
            (paths, sizes)
        })
        .await
        .unwrap_or_default();
        let mut checked = Vec::with_capacity(logs.len());
        // How many of `running` have a known path after this loop.
        let mut kept = 0;
        for (i, (c, known)) in logs.into_iter().enumerate() {
            let log = match (known, paths.get(i).cloned().flatten()) {
                (Some(log), _) => log,
                (None, Some(linked)) => {
                    self.log_paths.lock().insert(c.id.clone(), linked.clone());
                    linked
                }
                (None, None) => {
                    let Ok(status) = runtime.container_status(&c.id).await else {
                        continue;
                    };
                    self.log_paths
                        .lock()
                        .insert(c.id.clone(), status.log_path.clone());
                    status.log_path
                }
            };
            kept += 1;
            if !log.as_os_str().is_empty() {
                checked.push((c, log, sizes.get(i).copied().flatten()));
            }
        }
        // Forget the paths of containers no longer running: every running container whose
        // path is known was counted, so any more known paths are of stopped ones (the set of
        // running IDs is built only then, not on every check).
        {
            let mut known = self.log_paths.lock();
            if known.len() > kept {
                let ids: std::collections::HashSet<&str> =
                    running.iter().map(|c| c.id.as_str()).collect();
                known.retain(|id, _| ids.contains(id.as_str()));
            }
        }
        for (c, log, size) in checked {
            if size.is_some_and(|size| size < self.policy.max_size) {
                continue;
            }
            if let Err(e) = self.check(runtime, c, &log, &mut out).await {
                // One container's log must not keep the others from being rotated.
                tracing::warn!(container = %c.id, path = %log.display(), error = %e, "rotating a container log failed");
            }
            if *self.unsupported.lock() {
                break;
            }
        }
        Ok(out)
    }

    async fn check(
        &self,
        runtime: &dyn ContainerRuntime,
        container: &RunningContainer,
        log: &Path,
        out: &mut RotationOutcome,
    ) -> Result<(), GcError> {
        let id = container.id.as_str();
        let size = match tokio::fs::metadata(log).await {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // A rotation that renamed the file but did not reopen it, or the file (or its
                // whole directory) removed under the running container, which then writes into
                // a deleted file: recreate the directory and reopen now.
                if let Some(dir) = log.parent()
                    && !tokio::fs::try_exists(dir).await.unwrap_or(true)
                {
                    tracing::debug!(container = %id, dir = %dir.display(), "a running container's log directory was removed; recreating it and reopening the log");
                    tokio::fs::create_dir_all(dir)
                        .await
                        .map_err(log_err("creating", dir))?;
                    out.recreated
                        .push((container.involved(), dir.to_path_buf()));
                }
                self.reopen(runtime, id).await?;
                match tokio::fs::metadata(log).await {
                    Ok(m) => m.len(),
                    Err(_) => return Ok(()),
                }
            }
            Err(e) => return Err(log_err("reading", log)(e)),
        };
        if size < self.policy.max_size {
            return Ok(());
        }
        let stamp = jiff::Timestamp::now().strftime("%Y%m%d-%H%M%S").to_string();
        let rotated = PathBuf::from(format!("{}.{stamp}", log.display()));
        if tokio::fs::try_exists(&rotated).await.unwrap_or(true) {
            // Rotated twice within a second: the next check rotates it.
            return Ok(());
        }
        tokio::fs::rename(log, &rotated)
            .await
            .map_err(log_err("renaming", log))?;
        if let Err(e) = self.reopen(runtime, id).await {
            // Put it back so that the container keeps writing to the file readers open.
            if let Err(back) = tokio::fs::rename(&rotated, log).await {
                tracing::warn!(path = %log.display(), error = %back, "renaming a rotated log back failed");
            }
            return Err(e);
        }
        tracing::debug!(container = %id, path = %rotated.display(), size, "rotated container log");
        out.rotated.push(rotated);
        // Compressing takes a while: it runs in the background, so that the next check (of
        // this log too) is not held up; one run per log at a time.
        {
            let mut busy = self.busy.lock();
            if let Some(again) = busy.get_mut(log) {
                *again = true;
                return Ok(());
            }
            busy.insert(log.to_path_buf(), false);
        }
        let (busy, log, max_files) = (self.busy.clone(), log.to_path_buf(), self.policy.max_files);
        tokio::task::spawn_blocking(move || {
            loop {
                match maintain(&log, max_files) {
                    Ok(deleted) if !deleted.is_empty() => {
                        tracing::debug!(path = %log.display(), deleted = deleted.len(), "deleted old rotated logs");
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(path = %log.display(), error = %e, "compressing or pruning rotated logs failed");
                    }
                }
                let mut busy = busy.lock();
                match busy.get_mut(&log) {
                    Some(again) if *again => *again = false,
                    _ => {
                        busy.remove(&log);
                        return;
                    }
                }
            }
        });
        Ok(())
    }

    async fn reopen(&self, runtime: &dyn ContainerRuntime, id: &str) -> Result<(), GcError> {
        match runtime.reopen_container_log(id).await {
            Ok(()) => Ok(()),
            Err(e) if e.is_unsupported() => {
                let mut warned = self.unsupported.lock();
                if !*warned {
                    tracing::warn!(error = %kubelet_api::chain(&e), "the runtime cannot reopen container logs: logs are not rotated");
                    *warned = true;
                }
                Err(GcError::runtime("reopen_container_log")(e))
            }
            Err(e) => Err(GcError::runtime("reopen_container_log")(e)),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::field_reassign_with_default)]
mod tests {
    use super::*;

    fn touch(p: &Path, content: &str) {
        std::fs::write(p, content).unwrap();
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn the_running_containers_of_pod_statuses_are_those_running_with_an_id() {
        use k8s_openapi::api::core::v1::{
            ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus, Pod,
            PodStatus,
        };
        let status = |name: &str, id: Option<&str>, running: bool| {
            let mut cs = ContainerStatus::default();
            cs.name = name.into();
            cs.container_id = id.map(str::to_string);
            cs.state = Some(if running {
                ContainerState {
                    running: Some(ContainerStateRunning::default()),
                    ..Default::default()
                }
            } else {
                ContainerState {
                    terminated: Some(ContainerStateTerminated::default()),
                    ..Default::default()
                }
            });
            cs
        };
        let mut pod = Pod::default();
        pod.metadata.name = Some("web".into());
        pod.metadata.namespace = Some("ns".into());
        pod.metadata.uid = Some("u1".into());
        let mut s = PodStatus::default();
        s.container_statuses = Some(vec![
            status("app", Some("containerd://c1"), true),
            status("done", Some("containerd://c2"), false),
            status("starting", None, true),
        ]);
        s.init_container_statuses = Some(vec![status("sidecar", Some("c3"), true)]);
        s.ephemeral_container_statuses = Some(vec![status("debug", Some("process://c4"), true)]);
        let pods = [kubelet_api::PodWithStatus {
            pod: std::sync::Arc::new(pod),
            status: std::sync::Arc::new(s),
        }];
        let got = running_containers(&pods);
        assert_eq!(
            got,
            [
                RunningContainer::new("c1", "ns", "web", "u1", "app"),
                RunningContainer::new("c3", "ns", "web", "u1", "sidecar"),
                RunningContainer::new("c4", "ns", "web", "u1", "debug"),
            ]
        );
        assert_eq!(got[0].involved().field_path, "spec.containers{app}");
    }

    #[tokio::test]
    async fn the_paths_of_containers_no_longer_running_are_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let links = dir.path().join("links");
        std::fs::create_dir(&links).unwrap();
        let c = |id: &str| RunningContainer::new(id, "ns", "web", "u1", id);
        for id in ["a", "b", "x"] {
            let log = dir.path().join(format!("{id}.log"));
            touch(&log, "small\n");
            std::os::unix::fs::symlink(
                &log,
                links.join(kubelet_api::pod::log_link_name("web", "ns", id, id)),
            )
            .unwrap();
        }
        let rt = kubelet_core::testing::FakeRuntime::new();
        let rotator = LogRotator::new(LogRotationPolicy::default()).with_log_links(Some(links));
        let known = |r: &LogRotator| {
            let mut v: Vec<String> = r.log_paths.lock().keys().cloned().collect();
            v.sort();
            v
        };
        rotator.rotate(&rt, &[c("a"), c("b")]).await.unwrap();
        assert_eq!(known(&rotator), ["a", "b"]);
        rotator.rotate(&rt, &[c("b"), c("x")]).await.unwrap();
        assert_eq!(known(&rotator), ["b", "x"]);
        // `missing` has neither a link nor a runtime status: nothing known, nothing kept.
        rotator.rotate(&rt, &[c("x"), c("missing")]).await.unwrap();
        assert_eq!(known(&rotator), ["x"]);
    }

    #[test]
    fn maintaining_cleans_leftovers_keeps_the_newest_files_and_compresses_all_but_the_newest() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        touch(&log, "current\n");
        for f in [
            "0.log.20260101-000001.gz",
            "0.log.20260101-000002",
            "0.log.20260101-000003",
            "0.log.20260101-000003.gz",
            "0.log.20260101-000004",
            "0.log.20260101-000005.gz.tmp",
            "1.log.20260101-000001",
        ] {
            touch(&dir.path().join(f), "x\n");
        }
        let deleted = maintain(&log, 4).unwrap();
        // The .tmp and the uncompressed twin go, then the oldest until 3 remain; of those,
        // all but the newest are compressed.
        assert_eq!(deleted.len(), 3, "{deleted:?}");
        assert_eq!(
            names(dir.path()),
            [
                "0.log",
                "0.log.20260101-000002.gz",
                "0.log.20260101-000003.gz",
                "0.log.20260101-000004",
                "1.log.20260101-000001",
            ]
        );
        let mut text = String::new();
        std::io::Read::read_to_string(
            &mut flate2::read::GzDecoder::new(
                std::fs::File::open(dir.path().join("0.log.20260101-000002.gz")).unwrap(),
            ),
            &mut text,
        )
        .unwrap();
        assert_eq!(text, "x\n");
    }
}
