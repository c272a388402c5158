//! [`ContainerGc`]: the kubelet's container garbage collection (`kuberuntime_gc.go`).
//!
//! One run:
//!
//! 1. **Dead containers** (not running, created at least `minAge` ago, made by the agent) are
//!    grouped by pod and container name, newest first (by attempt, then creation). Those of a
//!    pod the agent no longer knows (once every pod source has been seen) all go; of the
//!    others, all but the newest `maxPerPodContainer` go (the newest stays, for
//!    `kubectl logs --previous`); then, with `maxContainers` set, each group is cut to
//!    `max(1, maxContainers / groups)` and the oldest overall go until the node is within it.
//!    A removed container's log files go with it.
//! 2. **Sandboxes**: a sandbox is active when ready or when a container still references it.
//!    Of a pod the agent no longer knows, every inactive sandbox goes; of the others, every
//!    inactive sandbox but the newest.
//! 3. **Directories** (once every source has been seen): pod log directories
//!    (`<namespace>_<name>_<uid>`) and pod directories (`<root>/pods/<uid>`, when nothing is
//!    mounted under them) of pods the agent does not know and that did not change for the
//!    orphan grace period; dangling log links of containers that are not running.
//!
//! With `all` (eviction's reclaim, the kubelet's `DeleteAllUnusedContainers`), the newest dead
//! instance of a container of a finished pod goes too.
//!
//! A periodic run that found nothing to remove and nothing to look at again later (no dead
//! container younger than `minAge`, no directory of an unknown pod inside its grace period) is
//! not repeated while the agent's pod statuses
//! ([`StatusReader::changes`](kubelet_api::StatusReader::changes)) and its sources' readiness
//! stay as they were, but for one run in [`FULL_RUN_EVERY`]: what a run removes comes from a
//! container's exit or a pod's removal, which change a status first. Deliberate difference:
//! the kubelet lists every container and sandbox every minute; at 1,000 pods that was a fifth
//! of an idle agent's CPU time. Containers the agent does not know (made behind its back) are
//! collected by the full run.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use kubelet_api::runtime::{
    Container, ContainerFilter, ContainerState, PodSandbox, SandboxFilter, SandboxState, labels,
};
use kubelet_api::{AgentDirs, AgentHandle, ContainerRuntime};

use crate::config::ContainerGcPolicy;
use crate::error::GcError;

/// What one run removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerGcOutcome {
    /// Container IDs removed.
    pub containers: Vec<String>,
    /// Sandbox IDs removed.
    pub sandboxes: Vec<String>,
    /// Directories and links removed.
    pub paths: Vec<PathBuf>,
}

/// One dead container, as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadContainer {
    /// Container ID.
    pub id: String,
    /// Pod UID.
    pub pod_uid: String,
    /// Container name.
    pub name: String,
    /// Restart attempt.
    pub attempt: u32,
    /// Creation time (nanoseconds since the epoch).
    pub created: i128,
}

/// The dead containers to remove (see the [module docs](self)): `known(uid)` says whether the
/// agent knows the pod, `finished(uid)` whether it has finished (only asked with `all`).
pub fn plan_dead_containers(
    dead: Vec<DeadContainer>,
    policy: &ContainerGcPolicy,
    sources_ready: bool,
    all: bool,
    known: &dyn Fn(&str) -> bool,
    finished: &dyn Fn(&str) -> bool,
) -> Vec<DeadContainer> {
    let mut units: BTreeMap<(String, String), Vec<DeadContainer>> = BTreeMap::new();
    for c in dead {
        units
            .entry((c.pod_uid.clone(), c.name.clone()))
            .or_default()
            .push(c);
    }
    for list in units.values_mut() {
        kubelet_api::sort::by(list, |a, b| {
            b.attempt.cmp(&a.attempt).then(b.created.cmp(&a.created))
        });
    }
    let mut remove = Vec::new();
    units.retain(|(uid, _), list| {
        let gone = sources_ready && !known(uid);
        if gone || (all && finished(uid)) {
            remove.append(list);
            return false;
        }
        true
    });
    if let Ok(keep) = usize::try_from(policy.max_per_pod_container) {
        for list in units.values_mut() {
            if list.len() > keep {
                remove.extend(list.drain(keep..));
            }
        }
    }
    if let Ok(max) = usize::try_from(policy.max_containers) {
        let total: usize = units.values().map(Vec::len).sum();
        if total > max && !units.is_empty() {
            let per_unit = (max / units.len()).max(1);
            for list in units.values_mut() {
                if list.len() > per_unit {
                    remove.extend(list.drain(per_unit..));
                }
            }
            let mut rest: Vec<DeadContainer> = units.into_values().flatten().collect();
            if rest.len() > max {
                kubelet_api::sort::by_key(&mut rest, |c| std::cmp::Reverse(c.created));
                remove.extend(rest.drain(max..));
            }
        }
    }
    remove
}

/// One periodic run in this many runs even while nothing changed (every 5 minutes at the
/// default period of 1 minute); see the [module docs](self).
pub const FULL_RUN_EVERY: u32 = 5;

/// The agent as of a periodic run that found nothing: runs skipped since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Quiet {
    changes: u64,
    sources_ready: bool,
    skipped: u32,
}

/// The container collector; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct ContainerGc {
    policy: ContainerGcPolicy,
    dirs: AgentDirs,
    container_log_dir: Option<PathBuf>,
    /// Set by a periodic run that found nothing (shared by clones).
    quiet: std::sync::Arc<parking_lot::Mutex<Option<Quiet>>>,
}

/// Made by this agent: the engine's rule (its orphan cleanup uses the same label). A pod UID
/// label alone is not enough: another kubelet sharing the runtime sets it too.
fn managed(labels_: &kubelet_api::runtime::Labels) -> bool {
    labels_.contains_key(labels::MANAGED_BY)
}

fn pod_uid(labels_: &kubelet_api::runtime::Labels) -> Option<&str> {
    labels_.get(labels::POD_UID).map(String::as_str)
}

impl ContainerGc {
    /// A collector with `policy` for the agent's directories `dirs`; dangling links are looked
    /// for in `container_log_dir` when set.
    pub fn new(
        policy: ContainerGcPolicy,
        dirs: AgentDirs,
        container_log_dir: Option<PathBuf>,
    ) -> Self {
        Self {
            policy,
            dirs,
            container_log_dir,
            quiet: std::sync::Arc::default(),
        }
    }

    /// One run; `all` for eviction's reclaim (never skipped). A periodic run (`all` false)
    /// after one that found nothing is skipped while nothing changed (see the
    /// [module docs](self)); it then returns an empty outcome.
    pub async fn collect(
        &self,
        runtime: &dyn ContainerRuntime,
        handle: &dyn AgentHandle,
        all: bool,
    ) -> Result<ContainerGcOutcome, GcError> {
        let sources_ready = handle.sources_ready();
        let statuses = handle.statuses();
        // Read before the listing: a status set after it is a change the next run sees.
        let changes = statuses.changes();
        {
            let mut quiet = self.quiet.lock();
            match quiet.as_mut() {
                Some(q)
                    if !all
                        && q.changes == changes
                        && q.sources_ready == sources_ready
                        && q.skipped + 1 < FULL_RUN_EVERY =>
                {
                    q.skipped += 1;
                    return Ok(ContainerGcOutcome::default());
                }
                _ => *quiet = None,
            }
        }
        // Whether this run met something to remove (removed or not) or to look at again later:
        // a dead container younger than `minAge`, a directory of an unknown pod inside its
        // grace period. Only a run that met nothing lets the next ones be skipped.
        let mut pending = false;
        let known = |uid: &str| statuses.get(uid).is_some();
        let finished = |uid: &str| {
            statuses
                .get(uid)
                .is_some_and(|p| matches!(p.status.phase.as_deref(), Some("Succeeded" | "Failed")))
        };
        let mut out = ContainerGcOutcome::default();
        let containers = runtime
            .list_containers(&ContainerFilter::default())
            .await
            .map_err(GcError::runtime("list_containers"))?;
        let now = jiff::Timestamp::now();
        let min_age = jiff::SignedDuration::try_from(self.policy.min_age).unwrap_or_default();
        let dead: Vec<DeadContainer> = containers
            .iter()
            .filter(|c| c.state != ContainerState::Running && managed(&c.labels))
            .filter(|c| {
                let old_enough = now.duration_since(c.created_at) >= min_age;
                pending |= !old_enough;
                old_enough
            })
            .filter_map(|c| {
                Some(DeadContainer {
                    id: c.id.clone(),
                    pod_uid: pod_uid(&c.labels)?.to_string(),
                    name: c
                        .labels
                        .get(labels::CONTAINER_NAME)
                        .cloned()
                        .unwrap_or_else(|| c.metadata.name.clone()),
                    attempt: c.metadata.attempt,
                    created: c.created_at.as_nanosecond(),
                })
            })
            .collect();
        let plan = plan_dead_containers(dead, &self.policy, sources_ready, all, &known, &finished);
        let by_id: HashMap<&str, &Container> =
            containers.iter().map(|c| (c.id.as_str(), c)).collect();
        let mut removed: HashSet<String> = HashSet::new();
        pending |= !plan.is_empty();
        for d in &plan {
            let Some(c) = by_id.get(d.id.as_str()) else {
                continue;
            };
            if self.remove_container(runtime, c).await {
                removed.insert(d.id.clone());
                out.containers.push(d.id.clone());
            }
        }
        pending |= self
            .collect_sandboxes(
                runtime,
                &containers,
                &removed,
                sources_ready,
                &known,
                &mut out,
            )
            .await?;
        if sources_ready {
            self.collect_dirs(&known, &mut out, &mut pending).await;
        }
        self.collect_links(&containers, &removed, &mut out, &mut pending)
            .await;
        if !all && !pending {
            *self.quiet.lock() = Some(Quiet {
                changes,
                sources_ready,
                skipped: 0,
            });
        }
        Ok(out)
    }

    /// Remove one container and its log files; false when the runtime refused.
    async fn remove_container(&self, runtime: &dyn ContainerRuntime, c: &Container) -> bool {
        let log_path = runtime
            .container_status(&c.id)
            .await
            .ok()
            .map(|s| s.log_path)
            .filter(|p| !p.as_os_str().is_empty());
        if c.state == ContainerState::Unknown {
            tracing::info!(container = %c.id, "Container is in unknown state, try killing it before removal");
            if let Err(e) = runtime
                .stop_container(&c.id, std::time::Duration::ZERO)
                .await
            {
                tracing::warn!(container = %c.id, error = %kubelet_api::chain(&e), "killing a container in unknown state failed");
            }
        }
        if let Err(e) = runtime.remove_container(&c.id).await {
            tracing::warn!(container = %c.id, error = %kubelet_api::chain(&e), "removing a dead container failed");
            return false;
        }
        tracing::debug!(container = %c.id, name = %c.metadata.name, "removed dead container");
        if let Some(path) = log_path {
            remove_log_files(&path).await;
        }
        true
    }

    /// Dead sandboxes; true when one was found to remove.
    async fn collect_sandboxes(
        &self,
        runtime: &dyn ContainerRuntime,
        containers: &[Container],
        removed: &HashSet<String>,
        sources_ready: bool,
        known: &(dyn Fn(&str) -> bool + Sync),
        out: &mut ContainerGcOutcome,
    ) -> Result<bool, GcError> {
        let sandboxes = runtime
            .list_pod_sandboxes(&SandboxFilter::default())
            .await
            .map_err(GcError::runtime("list_pod_sandboxes"))?;
        let referenced: HashSet<&str> = containers
            .iter()
            .filter(|c| !removed.contains(&c.id))
            .map(|c| c.pod_sandbox_id.as_str())
            .collect();
        let mut found = false;
        let mut by_pod: BTreeMap<&str, Vec<&PodSandbox>> = BTreeMap::new();
        for s in sandboxes.iter().filter(|s| managed(&s.labels)) {
            let uid = pod_uid(&s.labels).unwrap_or(s.metadata.uid.as_str());
            by_pod.entry(uid).or_default().push(s);
        }
        for (uid, mut list) in by_pod {
            kubelet_api::sort::by(&mut list, |a, b| {
                b.metadata
                    .attempt
                    .cmp(&a.metadata.attempt)
                    .then(b.created_at.cmp(&a.created_at))
            });
            let gone = sources_ready && !known(uid);
            let keep_newest = usize::from(!gone);
            for s in list.into_iter().skip(keep_newest) {
                let active = s.state == SandboxState::Ready || referenced.contains(s.id.as_str());
                if active {
                    continue;
                }
                found = true;
                let _ = runtime.stop_pod_sandbox(&s.id).await;
                match runtime.remove_pod_sandbox(&s.id).await {
                    Ok(()) => {
                        tracing::debug!(sandbox = %s.id, podUID = %uid, "removed dead sandbox");
                        out.sandboxes.push(s.id.clone());
                    }
                    Err(e) => {
                        tracing::warn!(sandbox = %s.id, error = %kubelet_api::chain(&e), "removing a dead sandbox failed");
                    }
                }
            }
        }
        Ok(found)
    }

    /// Pod log directories and pod directories of pods the agent does not know.
    async fn collect_dirs(
        &self,
        known: &(dyn Fn(&str) -> bool + Sync),
        out: &mut ContainerGcOutcome,
        pending: &mut bool,
    ) {
        let grace = self.policy.orphan_grace;
        let log_dirs = list_dir(&self.dirs.pod_log_dir).await;
        for (path, name) in log_dirs {
            // `<namespace>_<name>_<uid>`: the UID is the last field.
            let Some((_, uid)) = name.rsplit_once('_') else {
                continue;
            };
            if known(uid) {
                continue;
            }
            *pending = true;
            if !unchanged_for(&path, grace).await {
                continue;
            }
            if tokio::fs::remove_dir_all(&path).await.is_ok() {
                tracing::info!(path = %path.display(), podUID = %uid, "removed the log directory of a pod no source knows");
                out.paths.push(path);
            }
        }
        let pods_dir = self.dirs.root_dir.join("pods");
        let pod_dirs = list_dir(&pods_dir).await;
        if pod_dirs.is_empty() {
            return;
        }
        let mounts = mount_points().await;
        for (path, uid) in pod_dirs {
            if known(&uid) {
                continue;
            }
            *pending = true;
            if !unchanged_for(&path, grace).await {
                continue;
            }
            if mounts.iter().any(|m| m.starts_with(&path)) {
                tracing::debug!(path = %path.display(), "pod directory of an unknown pod still has mounts; kept");
                continue;
            }
            if tokio::fs::remove_dir_all(&path).await.is_ok() {
                tracing::info!(path = %path.display(), podUID = %uid, "removed the directory of a pod no source knows");
                out.paths.push(path);
            }
        }
    }

    /// Dangling log links (`<pod>_<ns>_<container>-<id>.log`) of containers not running.
    async fn collect_links(
        &self,
        containers: &[Container],
        removed: &HashSet<String>,
        out: &mut ContainerGcOutcome,
        pending: &mut bool,
    ) {
        let Some(dir) = &self.container_log_dir else {
            return;
        };
        let running: HashSet<&str> = containers
            .iter()
            .filter(|c| c.state == ContainerState::Running && !removed.contains(&c.id))
            .map(|c| c.id.as_str())
            .collect();
        for (path, name) in list_dir(dir).await {
            let Some(id) = name
                .strip_suffix(".log")
                .and_then(|n| n.rsplit_once('-'))
                .map(|(_, id)| id)
            else {
                continue;
            };
            // A running container's link is kept without a look at the file system (two
            // blocking calls per link, every minute, for every running container).
            if running.contains(id) {
                continue;
            }
            let is_link = tokio::fs::symlink_metadata(&path)
                .await
                .is_ok_and(|m| m.file_type().is_symlink());
            let dangling = tokio::fs::metadata(&path).await.is_err();
            if is_link && dangling {
                *pending = true;
                if tokio::fs::remove_file(&path).await.is_ok() {
                    out.paths.push(path);
                }
            }
        }
    }
}

/// `(path, file name)` of every entry of `dir`; empty when it cannot be read.
async fn list_dir(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let Ok(mut rd) = tokio::fs::read_dir(dir).await else {
        return out;
    };
    while let Ok(Some(e)) = rd.next_entry().await {
        if let Some(name) = e.file_name().to_str() {
            out.push((e.path(), name.to_string()));
        }
    }
    out
}

/// Has `path` not been modified for `grace`?
async fn unchanged_for(path: &Path, grace: std::time::Duration) -> bool {
    let Ok(modified) = tokio::fs::metadata(path).await.and_then(|m| m.modified()) else {
        return false;
    };
    modified.elapsed().is_ok_and(|age| age >= grace)
}

/// Mount points of this mount namespace (`/proc/self/mountinfo`, field 5, octal escapes
/// decoded).
async fn mount_points() -> Vec<PathBuf> {
    let text = tokio::fs::read_to_string("/proc/self/mountinfo")
        .await
        .unwrap_or_default();
    text.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(unescape_octal(m)))
        .collect()
}

fn unescape_octal(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Remove a container's log file and its rotated files (`<log>.*`).
pub(crate) async fn remove_log_files(path: &Path) {
    let _ = tokio::fs::remove_file(path).await;
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return;
    };
    let prefix = format!("{name}.");
    for (p, n) in list_dir(dir).await {
        if n.starts_with(&prefix) {
            let _ = tokio::fs::remove_file(&p).await;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn dc(uid: &str, name: &str, attempt: u32, created: i128) -> DeadContainer {
        DeadContainer {
            id: format!("{uid}-{name}-{attempt}"),
            pod_uid: uid.into(),
            name: name.into(),
            attempt,
            created,
        }
    }

    fn ids(v: &[DeadContainer]) -> Vec<String> {
        let mut v: Vec<String> = v.iter().map(|c| c.id.clone()).collect();
        v.sort();
        v
    }

    #[test]
    fn the_newest_dead_instance_of_each_container_stays() {
        let dead = vec![
            dc("p1", "app", 0, 10),
            dc("p1", "app", 2, 30),
            dc("p1", "app", 1, 20),
            dc("p1", "side", 0, 5),
        ];
        let plan = plan_dead_containers(
            dead,
            &ContainerGcPolicy::default(),
            true,
            false,
            &|_| true,
            &|_| false,
        );
        assert_eq!(ids(&plan), ["p1-app-0", "p1-app-1"]);
    }

    #[test]
    fn unknown_pods_lose_everything_but_only_once_sources_are_ready() {
        let dead = || vec![dc("gone", "app", 0, 1), dc("gone", "app", 1, 2)];
        let policy = ContainerGcPolicy::default();
        let not_ready = plan_dead_containers(dead(), &policy, false, false, &|_| false, &|_| false);
        assert_eq!(ids(&not_ready), ["gone-app-0"]);
        let ready = plan_dead_containers(dead(), &policy, true, false, &|_| false, &|_| false);
        assert_eq!(ids(&ready), ["gone-app-0", "gone-app-1"]);
    }

    #[test]
    fn reclaim_takes_the_last_instance_of_finished_pods_too() {
        let dead = vec![dc("done", "app", 0, 1), dc("live", "app", 0, 1)];
        let plan = plan_dead_containers(
            dead,
            &ContainerGcPolicy::default(),
            true,
            true,
            &|_| true,
            &|uid| uid == "done",
        );
        assert_eq!(ids(&plan), ["done-app-0"]);
    }

    #[test]
    fn max_containers_caps_units_then_removes_the_oldest_overall() {
        let policy = ContainerGcPolicy {
            max_per_pod_container: -1,
            max_containers: 3,
            ..Default::default()
        };
        let dead = vec![
            dc("a", "c", 0, 1),
            dc("a", "c", 1, 2),
            dc("a", "c", 2, 3),
            dc("b", "c", 0, 4),
            dc("b", "c", 1, 5),
            dc("d", "c", 0, 6),
            dc("e", "c", 0, 7),
        ];
        // 4 units, 3 allowed: each unit is cut to 1, then the oldest of the 4 left goes.
        let plan = plan_dead_containers(dead, &policy, true, false, &|_| true, &|_| false);
        assert_eq!(ids(&plan), ["a-c-0", "a-c-1", "a-c-2", "b-c-0"]);
    }

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape_octal(r"/a\040b"), "/a b");
        assert_eq!(unescape_octal("/plain"), "/plain");
        assert_eq!(unescape_octal(r"/x\0"), r"/x\0");
    }
}
