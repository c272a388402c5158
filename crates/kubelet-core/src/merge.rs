//! The pod config merge: per-source snapshots in, the kubelet's incremental operations out.
//!
//! [`PodStorage`] is the kubelet's `podStorage` (`pkg/kubelet/config/config.go`): it keeps one
//! map UID → pod per source, and turns every full snapshot of a source into `REMOVE`, `ADD`,
//! `UPDATE`, `DELETE` and `RECONCILE` operations, in that order (with an empty `ADD` on a source's
//! first snapshot when nothing else was added, updated or deleted, so the consumer learns that the
//! source has been seen). It is pure and synchronous, so it can be driven by anything.
//!
//! [`PodConfig`] runs a set of [`PodSource`]s and the merge, and hands the resulting
//! [`PodUpdate`]s to the caller on a channel. It spawns nothing by itself: [`PodConfig::start`]
//! returns a future the caller runs.
//!
//! ```
//! use kubelet_core::merge::PodStorage;
//! use kubelet_api::{EventRecorder, PodOp, SourceSnapshot};
//! use k8s_openapi::api::core::v1::Pod;
//!
//! let mut storage = PodStorage::new(["file"]);
//! let mut pod = Pod::default();
//! pod.metadata.name = Some("web".into());
//! pod.metadata.uid = Some("uid-1".into());
//! let updates = storage.merge(
//!     SourceSnapshot { source: "file".into(), pods: vec![pod.into()] },
//!     &EventRecorder::log_only(),
//! );
//! assert_eq!(updates[0].op, PodOp::Add);
//! assert!(storage.seen_all_sources());
//! ```

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use parking_lot::RwLock;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::error::KubeletError;
use kubelet_api::pod;
use kubelet_api::{EventRecorder, InvolvedObject};
use kubelet_api::{PodOp, PodSource, PodUpdate, SourceSender, SourceSnapshot, annotations};

/// Capacity of the merged update channel, as the kubelet's (`PodConfig` buffers 50 updates).
pub const UPDATE_CHANNEL_CAPACITY: usize = 50;

/// Event reason for pods rejected by the merge or by a source.
pub const REASON_FAILED_VALIDATION: &str = "FailedValidation";

/// Annotations PodConfig owns on the agent side; differences in them are not a pod change.
const LOCAL_ANNOTATIONS: [&str; 3] = [
    annotations::CONFIG_SOURCE,
    annotations::CONFIG_MIRROR,
    annotations::CONFIG_SEEN,
];

/// How long [`PodConfig`]'s future waits for its sources to return after shutdown before aborting
/// them.
const SOURCE_STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// One stored pod of a source.
#[derive(Debug, Clone)]
struct Stored {
    /// Shared with the updates sent for it (and so with the pod workers).
    pod: Arc<Pod>,
    /// Its position in the source's last snapshot that listed it.
    index: usize,
    /// The source's snapshot that last listed it (see [`SourcePods::round`]).
    round: u64,
}

/// The pods of one source. A snapshot updates the stored pods in place: it looks each
/// incoming pod up by its UID, allocates only for pods new to the source, and takes out the
/// ones it no longer lists, so a snapshot of N unchanged pods costs N lookups and no
/// allocation (a burst of N deletions, each answered with a snapshot of the rest, used to
/// rebuild the map N times).
#[derive(Debug, Default, Clone)]
struct SourcePods {
    by_uid: HashMap<String, Stored>,
    /// Snapshots merged so far.
    round: u64,
}

impl SourcePods {
    /// The pods in the order the source last listed them.
    fn listed(&self) -> Vec<Arc<Pod>> {
        let mut pods: Vec<&Stored> = self.by_uid.values().collect();
        kubelet_api::sort::by_key(&mut pods, |s| s.index);
        pods.into_iter().map(|s| Arc::clone(&s.pod)).collect()
    }
}

/// Per-source pod state and the merge of snapshots into incremental updates (the kubelet's
/// `podStorage`).
#[derive(Debug, Default, Clone)]
pub struct PodStorage {
    registered: BTreeSet<String>,
    seen: HashSet<String>,
    pods: BTreeMap<String, SourcePods>,
}

impl PodStorage {
    /// The full names (`name_namespace`) of the pods `source` holds.
    pub fn full_names(&self, source: &str) -> Vec<String> {
        self.pods
            .get(source)
            .map(|s| s.by_uid.values().map(|p| pod::full_name(&p.pod)).collect())
            .unwrap_or_default()
    }

    /// Storage expecting snapshots from `sources`. [`seen_all_sources`](Self::seen_all_sources)
    /// is true once each of them has delivered a snapshot.
    pub fn new(sources: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            registered: sources.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }

    /// Merge a full snapshot of one source and return the resulting updates, in the kubelet's
    /// order: `REMOVE`, `ADD`, `UPDATE`, `DELETE`, an empty `ADD` on the source's first snapshot
    /// if nothing was added, updated or deleted, then `RECONCILE`. Operations without pods are
    /// not returned (except that empty first `ADD`).
    ///
    /// Pods without a UID, and second and later pods with an already used full name
    /// (`name_namespace`) or UID, are dropped with a `FailedValidation` warning event.
    ///
    /// A snapshot from a source not given to [`new`](Self::new) registers that source.
    pub fn merge(&mut self, snapshot: SourceSnapshot, recorder: &EventRecorder) -> Vec<PodUpdate> {
        let SourceSnapshot { source, pods } = snapshot;
        if !self.registered.contains(&source) {
            tracing::debug!(source = %source, "snapshot from an unregistered pod source; registering it");
            self.registered.insert(source.clone());
        }
        let first_set = self.seen.insert(source.clone());
        let pods = filter_invalid_pods(pods, &source, recorder);

        let stored = self.pods.entry(source.clone()).or_default();
        stored.round += 1;
        let round = stored.round;

        let mut adds = Vec::new();
        let mut updates = Vec::new();
        let mut deletes = Vec::new();
        let mut reconciles = Vec::new();

        for (index, incoming) in pods.into_iter().enumerate() {
            match stored.by_uid.get_mut(pod::uid(&incoming)) {
                // The stored pod already carries the source annotation, and the comparison
                // ignores it: an unchanged pod is neither copied nor written.
                Some(existing) => {
                    existing.index = index;
                    existing.round = round;
                    match check_and_update_pod(&mut existing.pod, incoming) {
                        Change::Update => updates.push(Arc::clone(&existing.pod)),
                        Change::Delete => deletes.push(Arc::clone(&existing.pod)),
                        Change::Reconcile => reconciles.push(Arc::clone(&existing.pod)),
                        Change::None => {}
                    }
                }
                None => {
                    // A pod its source marked already is kept as it is: the merge and the
                    // source share one allocation.
                    let mut incoming = incoming;
                    if !kubelet_api::is_marked_seen(&incoming, &source) {
                        kubelet_api::mark_seen(Arc::make_mut(&mut incoming), &source);
                    }
                    adds.push(Arc::clone(&incoming));
                    stored.by_uid.insert(
                        pod::uid(&incoming).to_string(),
                        Stored {
                            pod: incoming,
                            index,
                            round,
                        },
                    );
                }
            }
        }

        // The pods this snapshot did not list are gone from the source, in the order it last
        // listed them.
        let mut gone: Vec<Stored> = stored
            .by_uid
            .extract_if(|_, s| s.round != round)
            .map(|(_, s)| s)
            .collect();
        kubelet_api::sort::by_key(&mut gone, |s| s.index);
        let removes: Vec<Arc<Pod>> = gone.into_iter().map(|s| s.pod).collect();

        let mut out = Vec::new();
        let mut emit = |op: PodOp, pods: Vec<Arc<Pod>>| {
            out.push(PodUpdate {
                op,
                pods,
                source: source.clone(),
            })
        };
        let send_empty_add =
            first_set && adds.is_empty() && updates.is_empty() && deletes.is_empty();
        if !removes.is_empty() {
            emit(PodOp::Remove, removes);
        }
        if !adds.is_empty() {
            emit(PodOp::Add, adds);
        }
        if !updates.is_empty() {
            emit(PodOp::Update, updates);
        }
        if !deletes.is_empty() {
            emit(PodOp::Delete, deletes);
        }
        if send_empty_add {
            emit(PodOp::Add, Vec::new());
        }
        if !reconciles.is_empty() {
            emit(PodOp::Reconcile, reconciles);
        }
        out
    }

    /// True once every registered source has delivered at least one snapshot.
    pub fn seen_all_sources(&self) -> bool {
        self.registered.iter().all(|s| self.seen.contains(s))
    }

    /// True once `source` has delivered at least one snapshot.
    pub fn has_seen(&self, source: &str) -> bool {
        self.seen.contains(source)
    }

    /// All current pods, source by source (sources in name order, pods in the order their source
    /// last listed them).
    pub fn pods(&self) -> Vec<Arc<Pod>> {
        self.pods.values().flat_map(SourcePods::listed).collect()
    }

    /// The current pods of one source, in the order it last listed them.
    pub fn source_pods(&self, source: &str) -> Vec<Arc<Pod>> {
        self.pods
            .get(source)
            .map(SourcePods::listed)
            .unwrap_or_default()
    }
}

/// What `check_and_update_pod` decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    None,
    Update,
    Delete,
    Reconcile,
}

/// The kubelet's `checkAndUpdatePod`: compare the stored pod with the incoming one and update
/// the stored pod. A changed pod becomes a new allocation (the updates already sent keep the
/// old one); an unchanged one is left as it is.
fn check_and_update_pod(existing: &mut Arc<Pod>, incoming: Arc<Pod>) -> Change {
    // The very pod stored (a source that keeps its pods and marks them): nothing to compare.
    if Arc::ptr_eq(existing, &incoming) {
        return Change::None;
    }
    if !pods_differ_semantically(existing, &incoming) {
        if existing.status != incoming.status {
            Arc::make_mut(existing).status = incoming.status.clone();
            return Change::Reconcile;
        }
        return Change::None;
    }
    let incoming = Arc::unwrap_or_clone(incoming);
    let existing = Arc::make_mut(existing);
    let deleting = incoming.metadata.deletion_timestamp.is_some();
    existing.spec = incoming.spec;
    existing.metadata.labels = incoming.metadata.labels;
    existing.metadata.deletion_timestamp = incoming.metadata.deletion_timestamp;
    existing.metadata.deletion_grace_period_seconds =
        incoming.metadata.deletion_grace_period_seconds;
    existing.status = incoming.status;
    // updateAnnotations: the incoming annotations, with the agent-local keys of the stored pod
    // (so config.seen survives updates).
    let mut merged = incoming.metadata.annotations.unwrap_or_default();
    if let Some(old) = existing.metadata.annotations.as_ref() {
        for key in LOCAL_ANNOTATIONS {
            if let Some(v) = old.get(key) {
                merged.insert(key.to_string(), v.clone());
            }
        }
    }
    existing.metadata.annotations = Some(merged);
    if deleting {
        Change::Delete
    } else {
        Change::Update
    }
}

fn pods_differ_semantically(existing: &Pod, incoming: &Pod) -> bool {
    existing.spec != incoming.spec
        || non_empty(&existing.metadata.labels) != non_empty(&incoming.metadata.labels)
        || existing.metadata.deletion_timestamp != incoming.metadata.deletion_timestamp
        || existing.metadata.deletion_grace_period_seconds
            != incoming.metadata.deletion_grace_period_seconds
        || !annotations_equal_ignoring_local(existing, incoming)
}

/// `None` and an empty map are the same (Go's `reflect.DeepEqual` on maps is used through
/// `equality.Semantic`, which treats nil and empty maps alike).
fn non_empty(
    m: &Option<std::collections::BTreeMap<String, String>>,
) -> Option<&std::collections::BTreeMap<String, String>> {
    m.as_ref().filter(|m| !m.is_empty())
}

fn annotations_equal_ignoring_local(a: &Pod, b: &Pod) -> bool {
    // Both maps iterate in key order, so comparing the filtered iterators compares the maps,
    // without copying them (this runs for every pod of every snapshot).
    fn relevant(p: &Pod) -> impl Iterator<Item = (&String, &String)> {
        p.metadata
            .annotations
            .iter()
            .flatten()
            .filter(|(k, _)| !LOCAL_ANNOTATIONS.contains(&k.as_str()))
    }
    relevant(a).eq(relevant(b))
}

/// Drop pods without UID and later copies of a full name or UID, with a warning event each.
/// Valid pods cost two set insertions of borrowed keys, no allocation.
fn filter_invalid_pods(
    pods: Vec<Arc<Pod>>,
    source: &str,
    recorder: &EventRecorder,
) -> Vec<Arc<Pod>> {
    let reject = |index: usize, p: &Pod, why: String| {
        tracing::info!(index, pod = %pod::full_name(p), source, "pod failed validation due to {why}, ignoring");
        recorder.warning(
            InvolvedObject::pod(p),
            REASON_FAILED_VALIDATION,
            format!(
                "Error validating pod {} from {source} due to {why}, ignoring",
                format_pod(p)
            ),
        );
    };
    let mut invalid = Vec::new();
    {
        let mut names: HashSet<(&str, &str)> = HashSet::with_capacity(pods.len());
        let mut uids: HashSet<&str> = HashSet::with_capacity(pods.len());
        for (index, p) in pods.iter().enumerate() {
            let uid = pod::uid(p);
            let name = (pod::namespace(p), pod::name(p));
            let why = if uid.is_empty() {
                "missing UID".to_string()
            } else if names.contains(&name) {
                format!("duplicate pod name {:?}", pod::name(p))
            } else if uids.contains(uid) {
                format!("duplicate pod UID {uid:?}")
            } else {
                names.insert(name);
                uids.insert(uid);
                continue;
            };
            reject(index, p, why);
            invalid.push(index);
        }
    }
    if invalid.is_empty() {
        return pods;
    }
    pods.into_iter()
        .enumerate()
        .filter(|(i, _)| invalid.binary_search(i).is_err())
        .map(|(_, p)| p)
        .collect()
}

/// `format.Pod`: `name_namespace(uid)`.
fn format_pod(p: &Pod) -> String {
    format!("{}({})", pod::full_name(p), pod::uid(p))
}

/// Which sources have delivered their first snapshot: a cheap, cloneable reader that
/// [`PodConfig`]'s future updates after every merge.
#[derive(Debug, Clone, Default)]
pub struct SourcesSeen {
    inner: Arc<RwLock<(BTreeSet<String>, HashSet<String>)>>,
}

impl SourcesSeen {
    fn set(&self, storage: &PodStorage) {
        let mut g = self.inner.write();
        g.0 = storage.registered.clone();
        g.1 = storage.seen.clone();
    }

    /// True once every registered source has delivered a snapshot.
    pub fn seen_all_sources(&self) -> bool {
        let g = self.inner.read();
        g.0.iter().all(|s| g.1.contains(s))
    }

    /// True once `source` has delivered a snapshot.
    pub fn has_seen(&self, source: &str) -> bool {
        self.inner.read().1.contains(source)
    }
}

/// Runs a set of [`PodSource`]s and merges their snapshots into [`PodUpdate`]s.
///
/// ```no_run
/// # async fn demo(source: std::sync::Arc<dyn kubelet_api::PodSource>) -> Result<(), kubelet_core::KubeletError> {
/// use kubelet_core::merge::PodConfig;
/// use kubelet_api::EventRecorder;
/// use tokio_util::sync::CancellationToken;
///
/// let mut config = PodConfig::new(EventRecorder::log_only());
/// config.add_source(source)?;
/// let shutdown = CancellationToken::new();
/// let (mut updates, run) = config.start(shutdown.clone());
/// tokio::spawn(run);
/// while let Some(update) = updates.recv().await {
///     println!("{:?} {} pods from {}", update.op, update.pods.len(), update.source);
/// }
/// # Ok(()) }
/// ```
pub struct PodConfig {
    recorder: EventRecorder,
    sources: Vec<Arc<dyn PodSource>>,
    seen: SourcesSeen,
}

impl std::fmt::Debug for PodConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodConfig")
            .field("sources", &self.source_names())
            .finish_non_exhaustive()
    }
}

impl PodConfig {
    /// An empty config; events about rejected pods go to `recorder`.
    pub fn new(recorder: EventRecorder) -> Self {
        Self {
            recorder,
            sources: Vec::new(),
            seen: SourcesSeen::default(),
        }
    }

    /// Register a source. Its name must be unique.
    pub fn add_source(&mut self, source: Arc<dyn PodSource>) -> Result<(), KubeletError> {
        if self.sources.iter().any(|s| s.name() == source.name()) {
            return Err(KubeletError::BuildDuplicateSource(
                source.name().to_string(),
            ));
        }
        self.seen.inner.write().0.insert(source.name().to_string());
        self.sources.push(source);
        Ok(())
    }

    /// Names of the registered sources, in registration order.
    pub fn source_names(&self) -> Vec<String> {
        self.sources.iter().map(|s| s.name().to_string()).collect()
    }

    /// A reader telling which sources have delivered their first snapshot (updated by the future
    /// [`start`](Self::start) returns, before the updates of that snapshot are sent).
    pub fn sources_seen(&self) -> SourcesSeen {
        self.seen.clone()
    }

    /// Start: returns the receiver of merged updates (capacity 50) and the future that runs every
    /// source and the merge. Nothing happens until the caller polls (spawns) the future. It ends
    /// when `shutdown` is cancelled (after giving the sources up to 5 s to return) or when the
    /// receiver is dropped.
    pub fn start(
        self,
        shutdown: CancellationToken,
    ) -> (
        mpsc::Receiver<PodUpdate>,
        impl Future<Output = ()> + Send + 'static,
    ) {
        let (out_tx, out_rx) = mpsc::channel(UPDATE_CHANNEL_CAPACITY);
        let fut = run_config(self, out_tx, shutdown);
        (out_rx, fut)
    }
}

async fn run_config(config: PodConfig, out: mpsc::Sender<PodUpdate>, shutdown: CancellationToken) {
    let PodConfig {
        recorder,
        sources,
        seen,
    } = config;
    let mut storage = PodStorage::new(sources.iter().map(|s| s.name().to_string()));
    seen.set(&storage);
    let names = kubelet_api::NameIndex::default();
    let (tx, mut rx) = mpsc::channel::<SourceSnapshot>(UPDATE_CHANNEL_CAPACITY);
    // Sources stop when shutdown is cancelled or when this future ends for another reason.
    let sources_token = shutdown.child_token();
    let mut tasks = JoinSet::new();
    for source in sources {
        let sender = SourceSender::new(source.name(), tx.clone(), recorder.clone())
            .with_names(names.clone());
        let token = sources_token.clone();
        tasks.spawn(async move {
            let name = source.name().to_string();
            source.run(sender, token).await;
            name
        });
    }
    drop(tx);

    'outer: loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            done = tasks.join_next(), if !tasks.is_empty() => {
                match done {
                    Some(Ok(name)) if !sources_token.is_cancelled() => {
                        tracing::warn!(source = %name, "pod source returned before shutdown");
                    }
                    Some(Err(e)) => tracing::error!(error = %kubelet_api::chain(&e), "pod source task failed"),
                    _ => {}
                }
            }
            snapshot = rx.recv() => {
                let Some(snapshot) = snapshot else {
                    // Every source has returned; nothing more will arrive.
                    shutdown.cancelled().await;
                    break;
                };
                let source = snapshot.source.clone();
                let n = snapshot.pods.len();
                let updates = storage.merge(snapshot, &recorder);
                seen.set(&storage);
                // Only the pods a merge adds or removes change the names a source holds (a
                // stored pod keeps its name through updates).
                for u in &updates {
                    match u.op {
                        PodOp::Remove => names.remove(&source, u.pods.iter().map(|p| pod::full_name(p))),
                        PodOp::Add => names.add(&source, u.pods.iter().map(|p| pod::full_name(p))),
                        _ => {}
                    }
                }
                tracing::debug!(source = %source, pods = n, updates = updates.len(), "merged pod source snapshot");
                for update in updates {
                    tokio::select! {
                        _ = shutdown.cancelled() => break 'outer,
                        sent = out.send(update) => if sent.is_err() {
                            tracing::debug!("pod update receiver dropped; stopping pod config");
                            break 'outer;
                        }
                    }
                }
            }
        }
    }

    sources_token.cancel();
    drop(rx);
    let stop = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(SOURCE_STOP_TIMEOUT, stop)
        .await
        .is_err()
    {
        tracing::warn!("pod sources did not stop within {SOURCE_STOP_TIMEOUT:?}; aborting them");
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kubelet_api::EventType;
    use proptest::prelude::*;

    fn mk(name: &str, uid: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.to_string());
        p.metadata.namespace = Some("default".to_string());
        p.metadata.uid = Some(uid.to_string());
        p.spec = Some(PodSpec {
            containers: vec![Container {
                name: "app".into(),
                image: Some("busybox".into()),
                ..Default::default()
            }],
            ..Default::default()
        });
        p
    }

    fn snap(source: &str, pods: Vec<Pod>) -> SourceSnapshot {
        SourceSnapshot {
            source: source.into(),
            pods: pods.into_iter().map(Arc::new).collect(),
        }
    }

    fn ops(updates: &[PodUpdate]) -> Vec<(PodOp, Vec<String>)> {
        updates
            .iter()
            .map(|u| {
                (
                    u.op,
                    u.pods.iter().map(|p| pod::uid(p).to_string()).collect(),
                )
            })
            .collect()
    }

    fn ann<'a>(p: &'a Pod, key: &str) -> Option<&'a str> {
        p.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(String::as_str)
    }

    fn log() -> EventRecorder {
        EventRecorder::log_only()
    }

    #[test]
    fn first_empty_snapshot_yields_one_empty_add_and_marks_source_seen() {
        let mut s = PodStorage::new(["file", "api"]);
        assert!(!s.seen_all_sources());
        let out = s.merge(snap("file", vec![]), &log());
        assert_eq!(ops(&out), vec![(PodOp::Add, vec![])]);
        assert!(s.has_seen("file"));
        assert!(!s.has_seen("api"));
        assert!(!s.seen_all_sources());
        s.merge(snap("api", vec![]), &log());
        assert!(s.seen_all_sources());
        // A second empty snapshot says nothing.
        assert!(s.merge(snap("file", vec![]), &log()).is_empty());
    }

    #[test]
    fn new_pods_are_added_with_source_and_seen_annotations() {
        let mut s = PodStorage::new(["file"]);
        let out = s.merge(snap("file", vec![mk("a", "1"), mk("b", "2")]), &log());
        assert_eq!(ops(&out), vec![(PodOp::Add, vec!["1".into(), "2".into()])]);
        for p in &out[0].pods {
            assert_eq!(ann(p, annotations::CONFIG_SOURCE), Some("file"));
            let seen = ann(p, annotations::CONFIG_SEEN).expect("seen annotation");
            assert!(seen.parse::<jiff::Timestamp>().is_ok(), "{seen}");
        }
        assert_eq!(out[0].source, "file");
        assert_eq!(s.pods().len(), 2);
    }

    #[test]
    fn pods_are_shared_not_copied_unless_they_must_be_annotated_or_changed() {
        let mut s = PodStorage::new(["file", "api"]);
        let mut marked = mk("a", "1");
        kubelet_api::mark_seen(&mut marked, "file");
        let marked = Arc::new(marked);
        let plain = Arc::new(mk("b", "2"));
        let out = s.merge(
            SourceSnapshot {
                source: "file".into(),
                pods: vec![marked.clone(), plain.clone()],
            },
            &log(),
        );
        // The marked pod is the source's allocation, in the update and in the storage.
        assert!(Arc::ptr_eq(&out[0].pods[0], &marked));
        assert!(!Arc::ptr_eq(&out[0].pods[1], &plain));
        let stored = s.source_pods("file");
        assert!(Arc::ptr_eq(&stored[0], &marked));
        assert!(Arc::ptr_eq(&stored[1], &out[0].pods[1]));
        // A pod marked by another source is annotated afresh for this one.
        let out = s.merge(
            SourceSnapshot {
                source: "api".into(),
                pods: vec![Arc::new({
                    let mut p = Pod::clone(&marked);
                    p.metadata.uid = Some("3".into());
                    p.metadata.name = Some("c".into());
                    p
                })],
            },
            &log(),
        );
        assert_eq!(
            ann(&out[0].pods[0], annotations::CONFIG_SOURCE),
            Some("api")
        );
        // Unchanged pods sent again (as new allocations): the stored ones stay.
        let again = s.merge(
            snap("file", vec![Pod::clone(&marked), Pod::clone(&plain)]),
            &log(),
        );
        assert!(again.is_empty());
        let after = s.source_pods("file");
        assert!(Arc::ptr_eq(&after[0], &marked));
        assert!(Arc::ptr_eq(&after[1], &stored[1]));
        // A change replaces the stored pod; the update sent before keeps the old one.
        let mut changed = Pod::clone(&plain);
        if let Some(spec) = changed.spec.as_mut() {
            spec.containers[0].image = Some("busybox:2".into());
        }
        let out2 = s.merge(snap("file", vec![Pod::clone(&marked), changed]), &log());
        assert_eq!(ops(&out2), vec![(PodOp::Update, vec!["2".into()])]);
        assert!(!Arc::ptr_eq(&out2[0].pods[0], &stored[1]));
        assert_eq!(
            stored[1]
                .spec
                .as_ref()
                .map(|s| s.containers[0].image.clone()),
            Some(Some("busybox".into()))
        );
        assert_eq!(
            ann(&out2[0].pods[0], annotations::CONFIG_SEEN),
            ann(&stored[1], annotations::CONFIG_SEEN)
        );
    }

    #[test]
    fn missing_uids_are_removed_and_new_ones_added_in_that_order() {
        let mut s = PodStorage::new(["file"]);
        s.merge(snap("file", vec![mk("a", "1"), mk("b", "2")]), &log());
        let out = s.merge(snap("file", vec![mk("b", "2"), mk("c", "3")]), &log());
        assert_eq!(
            ops(&out),
            vec![
                (PodOp::Remove, vec!["1".into()]),
                (PodOp::Add, vec!["3".into()])
            ]
        );
        assert_eq!(pod::name(&out[0].pods[0]), "a");
    }

    #[test]
    fn removed_pods_come_out_in_the_order_their_source_last_listed_them() {
        let mut s = PodStorage::new(["file"]);
        s.merge(
            snap("file", vec![mk("a", "1"), mk("b", "2"), mk("c", "3")]),
            &log(),
        );
        // Listed again in another order: nothing changes, but the order is the new one.
        let out = s.merge(
            snap("file", vec![mk("c", "3"), mk("a", "1"), mk("b", "2")]),
            &log(),
        );
        assert!(out.is_empty());
        let names = |pods: &[Arc<Pod>]| {
            pods.iter()
                .map(|p| pod::name(p).to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&s.source_pods("file")), ["c", "a", "b"]);
        let out = s.merge(snap("file", vec![mk("d", "4")]), &log());
        assert_eq!(
            ops(&out),
            vec![
                (PodOp::Remove, vec!["3".into(), "1".into(), "2".into()]),
                (PodOp::Add, vec!["4".into()])
            ]
        );
        assert_eq!(names(&s.pods()), ["d"]);
    }

    #[test]
    fn a_pod_dropped_for_its_uid_leaves_its_name_to_the_next_pod() {
        let (rec, mut events) = EventRecorder::channel(8);
        let mut s = PodStorage::new(["file"]);
        let out = s.merge(
            snap("file", vec![mk("a", "1"), mk("b", "1"), mk("b", "2")]),
            &rec,
        );
        assert_eq!(ops(&out), vec![(PodOp::Add, vec!["1".into(), "2".into()])]);
        assert_eq!(pod::name(&out[0].pods[1]), "b");
        let ev = events.try_recv().expect("a warning event");
        assert!(ev.message.contains("duplicate pod UID"), "{}", ev.message);
        assert!(events.try_recv().is_err(), "one warning only");
    }

    #[test]
    fn spec_change_is_an_update_that_keeps_first_seen_time() {
        let mut s = PodStorage::new(["file"]);
        let out = s.merge(snap("file", vec![mk("a", "1")]), &log());
        let seen = ann(&out[0].pods[0], annotations::CONFIG_SEEN).map(str::to_string);
        let mut changed = mk("a", "1");
        if let Some(spec) = changed.spec.as_mut() {
            spec.containers[0].image = Some("nginx".into());
        }
        let out = s.merge(snap("file", vec![changed]), &log());
        assert_eq!(ops(&out), vec![(PodOp::Update, vec!["1".into()])]);
        let p = &out[0].pods[0];
        assert_eq!(ann(p, annotations::CONFIG_SEEN).map(str::to_string), seen);
        assert_eq!(ann(p, annotations::CONFIG_SOURCE), Some("file"));
        assert_eq!(
            p.spec
                .as_ref()
                .and_then(|s| s.containers[0].image.as_deref()),
            Some("nginx")
        );
    }

    #[test]
    fn label_and_annotation_changes_are_updates_but_local_annotations_are_ignored() {
        let mut s = PodStorage::new(["api"]);
        s.merge(snap("api", vec![mk("a", "1")]), &log());

        let mut labelled = mk("a", "1");
        labelled.metadata.labels = Some([("app".to_string(), "x".to_string())].into());
        let out = s.merge(snap("api", vec![labelled.clone()]), &log());
        assert_eq!(ops(&out), vec![(PodOp::Update, vec!["1".into()])]);

        let mut annotated = labelled.clone();
        annotated.metadata.annotations = Some([("team".to_string(), "y".to_string())].into());
        let out = s.merge(snap("api", vec![annotated.clone()]), &log());
        assert_eq!(ops(&out), vec![(PodOp::Update, vec!["1".into()])]);
        assert_eq!(ann(&out[0].pods[0], "team"), Some("y"));
        assert!(ann(&out[0].pods[0], annotations::CONFIG_SEEN).is_some());

        let mut local_only = annotated.clone();
        local_only
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .extend([
                (annotations::CONFIG_MIRROR.to_string(), "h".to_string()),
                (annotations::CONFIG_SEEN.to_string(), "other".to_string()),
            ]);
        assert!(s.merge(snap("api", vec![local_only]), &log()).is_empty());
    }

    #[test]
    fn deletion_timestamp_turns_the_change_into_a_delete() {
        let mut s = PodStorage::new(["api"]);
        s.merge(snap("api", vec![mk("a", "1")]), &log());
        let mut deleting = mk("a", "1");
        deleting.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        deleting.metadata.deletion_grace_period_seconds = Some(30);
        let out = s.merge(snap("api", vec![deleting]), &log());
        assert_eq!(ops(&out), vec![(PodOp::Delete, vec!["1".into()])]);
        assert_eq!(
            out[0].pods[0].metadata.deletion_grace_period_seconds,
            Some(30)
        );
    }

    #[test]
    fn status_only_change_is_a_reconcile_that_overwrites_the_stored_status() {
        let mut s = PodStorage::new(["api"]);
        s.merge(snap("api", vec![mk("a", "1")]), &log());
        let mut running = mk("a", "1");
        running.status = Some(PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        });
        let out = s.merge(snap("api", vec![running.clone()]), &log());
        assert_eq!(ops(&out), vec![(PodOp::Reconcile, vec!["1".into()])]);
        assert_eq!(s.pods()[0].status, running.status);
        assert!(s.merge(snap("api", vec![running]), &log()).is_empty());
    }

    #[test]
    fn unchanged_snapshot_yields_nothing() {
        let mut s = PodStorage::new(["file"]);
        s.merge(snap("file", vec![mk("a", "1")]), &log());
        assert!(s.merge(snap("file", vec![mk("a", "1")]), &log()).is_empty());
    }

    #[test]
    fn all_kinds_of_change_come_out_in_kubelet_order() {
        let mut s = PodStorage::new(["api"]);
        s.merge(
            snap(
                "api",
                vec![mk("r", "r"), mk("u", "u"), mk("d", "d"), mk("c", "c")],
            ),
            &log(),
        );
        let mut u = mk("u", "u");
        u.metadata.labels = Some([("x".to_string(), "1".to_string())].into());
        let mut d = mk("d", "d");
        d.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        let mut c = mk("c", "c");
        c.status = Some(PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        });
        let out = s.merge(snap("api", vec![c, d, u, mk("n", "n")]), &log());
        assert_eq!(
            ops(&out),
            vec![
                (PodOp::Remove, vec!["r".into()]),
                (PodOp::Add, vec!["n".into()]),
                (PodOp::Update, vec!["u".into()]),
                (PodOp::Delete, vec!["d".into()]),
                (PodOp::Reconcile, vec!["c".into()]),
            ]
        );
    }

    #[test]
    fn duplicate_full_names_keep_the_first_pod_and_warn() {
        let (rec, mut events) = EventRecorder::channel(8);
        let mut s = PodStorage::new(["file"]);
        let out = s.merge(snap("file", vec![mk("a", "1"), mk("a", "2")]), &rec);
        assert_eq!(ops(&out), vec![(PodOp::Add, vec!["1".into()])]);
        let ev = events.try_recv().expect("a warning event");
        assert_eq!(ev.type_, EventType::Warning);
        assert_eq!(ev.reason, "FailedValidation");
        assert_eq!(
            ev.message,
            "Error validating pod a_default(2) from file due to duplicate pod name \"a\", ignoring"
        );
        assert_eq!(ev.involved.uid, "2");
    }

    #[test]
    fn same_name_in_another_namespace_is_not_a_duplicate() {
        let mut s = PodStorage::new(["file"]);
        let mut other = mk("a", "2");
        other.metadata.namespace = Some("kube-system".into());
        let out = s.merge(snap("file", vec![mk("a", "1"), other]), &log());
        assert_eq!(out[0].pods.len(), 2);
    }

    #[test]
    fn pods_without_uid_are_dropped_with_a_warning() {
        let (rec, mut events) = EventRecorder::channel(8);
        let mut s = PodStorage::new(["file"]);
        let mut no_uid = mk("a", "");
        no_uid.metadata.uid = None;
        let out = s.merge(snap("file", vec![no_uid, mk("b", "2")]), &rec);
        assert_eq!(ops(&out), vec![(PodOp::Add, vec!["2".into()])]);
        let ev = events.try_recv().expect("a warning event");
        assert_eq!(ev.reason, "FailedValidation");
        assert!(ev.message.contains("missing UID"), "{}", ev.message);
    }

    #[test]
    fn sources_are_independent() {
        let mut s = PodStorage::new(["file", "http"]);
        s.merge(snap("file", vec![mk("a", "1")]), &log());
        let out = s.merge(snap("http", vec![mk("b", "2")]), &log());
        assert_eq!(ops(&out), vec![(PodOp::Add, vec!["2".into()])]);
        let out = s.merge(snap("http", vec![]), &log());
        assert_eq!(ops(&out), vec![(PodOp::Remove, vec!["2".into()])]);
        assert_eq!(s.source_pods("file").len(), 1);
        assert!(s.seen_all_sources());
    }

    /// Rank of an update in the kubelet's output order; the empty first ADD sits between DELETE
    /// and RECONCILE.
    fn rank(u: &PodUpdate) -> u8 {
        match u.op {
            PodOp::Remove => 0,
            PodOp::Add if !u.pods.is_empty() => 1,
            PodOp::Update => 2,
            PodOp::Delete => 3,
            PodOp::Add => 4,
            PodOp::Reconcile => 5,
        }
    }

    #[derive(Debug, Clone)]
    struct GenPod {
        uid: u8,
        image: u8,
        label: u8,
        phase: u8,
        deleting: bool,
        note: u8,
    }

    fn gen_pod() -> impl Strategy<Value = GenPod> {
        (0u8..6, 0u8..3, 0u8..2, 0u8..3, any::<bool>(), 0u8..2).prop_map(
            |(uid, image, label, phase, deleting, note)| GenPod {
                uid,
                image,
                label,
                phase,
                deleting,
                note,
            },
        )
    }

    const SOURCES: [&str; 3] = ["file", "http", "api"];

    fn build(source: &str, g: &GenPod) -> Pod {
        // The name is a function of the UID (as in the API, where both are immutable), shared by
        // two UIDs so that duplicate names occur.
        let mut p = mk(
            &format!("{source}-{}", g.uid / 2),
            &format!("{source}-{}", g.uid),
        );
        if let Some(spec) = p.spec.as_mut() {
            spec.containers[0].image = Some(format!("image-{}", g.image));
        }
        if g.label == 1 {
            p.metadata.labels = Some([("l".to_string(), "v".to_string())].into());
        }
        if g.phase > 0 {
            p.status = Some(PodStatus {
                phase: Some(format!("phase-{}", g.phase)),
                ..Default::default()
            });
        }
        if g.deleting {
            p.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        }
        if g.note == 1 {
            p.metadata.annotations = Some([("note".to_string(), "n".to_string())].into());
        }
        p
    }

    /// The parts of a pod the merge must carry through, without the local annotations.
    fn essence(p: &Pod) -> String {
        let mut p = p.clone();
        if let Some(a) = p.metadata.annotations.as_mut() {
            for k in LOCAL_ANNOTATIONS {
                a.remove(k);
            }
            if a.is_empty() {
                p.metadata.annotations = None;
            }
        }
        if p.metadata.labels.as_ref().is_some_and(|l| l.is_empty()) {
            p.metadata.labels = None;
        }
        serde_json::to_string(&p).unwrap_or_default()
    }

    proptest! {
        #[test]
        fn applying_emitted_ops_reproduces_the_last_snapshot_of_every_source(
            steps in proptest::collection::vec(
                (0usize..3, proptest::collection::vec(gen_pod(), 0..6)),
                1..25,
            )
        ) {
            let mut storage = PodStorage::new(SOURCES);
            let mut applied: HashMap<String, Pod> = HashMap::new();
            let mut first_seen: HashMap<String, String> = HashMap::new();
            let mut last: HashMap<&str, Vec<Pod>> = HashMap::new();
            let mut seen_sources = HashSet::new();
            for (src, gens) in &steps {
                let source = SOURCES[*src];
                let pods: Vec<Pod> = gens.iter().map(|g| build(source, g)).collect();
                last.insert(source, pods.clone());
                let first = seen_sources.insert(source);
                let out = storage.merge(snap(source, pods), &log());

                // Kubelet order, no empty op except the first-snapshot ADD.
                for w in out.windows(2) {
                    prop_assert!(rank(&w[0]) < rank(&w[1]), "order: {:?}", ops(&out));
                }
                let mut uids_this_merge = HashSet::new();
                for u in &out {
                    prop_assert_eq!(&u.source, source);
                    if u.pods.is_empty() {
                        prop_assert!(first && u.op == PodOp::Add);
                    }
                    for p in &u.pods {
                        prop_assert!(uids_this_merge.insert(pod::uid(p).to_string()));
                    }
                }
                if first {
                    prop_assert!(out.iter().any(|u| u.op == PodOp::Add));
                }

                for u in out {
                    for p in u.pods {
                        let uid = pod::uid(&p).to_string();
                        prop_assert_eq!(ann(&p, annotations::CONFIG_SOURCE), Some(source));
                        let seen = ann(&p, annotations::CONFIG_SEEN).map(str::to_string);
                        prop_assert!(seen.is_some());
                        match u.op {
                            PodOp::Remove => {
                                prop_assert!(applied.remove(&uid).is_some());
                                first_seen.remove(&uid);
                            }
                            PodOp::Add => {
                                prop_assert!(!applied.contains_key(&uid));
                                first_seen.insert(uid.clone(), seen.unwrap_or_default());
                                applied.insert(uid, Pod::clone(&p));
                            }
                            _ => {
                                prop_assert!(applied.contains_key(&uid));
                                prop_assert_eq!(first_seen.get(&uid), seen.as_ref());
                                applied.insert(uid, Pod::clone(&p));
                            }
                        }
                    }
                }
            }
            prop_assert!(seen_sources.len() < SOURCES.len() || storage.seen_all_sources());

            // Expected: the last snapshot of each source, first copy of each name and UID kept.
            let mut expected: HashMap<String, String> = HashMap::new();
            for pods in last.values() {
                let mut names = HashSet::new();
                let mut uids = HashSet::new();
                for p in pods {
                    if names.insert(pod::full_name(p)) && uids.insert(pod::uid(p).to_string()) {
                        expected.insert(pod::uid(p).to_string(), essence(p));
                    } else {
                        // A rejected duplicate name must not consume its UID.
                        continue;
                    }
                }
            }
            let got: HashMap<String, String> =
                applied.iter().map(|(k, v)| (k.clone(), essence(v))).collect();
            prop_assert_eq!(&got, &expected);
            let stored: HashMap<String, String> = storage
                .pods()
                .iter()
                .map(|p| (pod::uid(p).to_string(), essence(p)))
                .collect();
            prop_assert_eq!(stored, expected);
        }
    }

    struct StaticSource {
        name: &'static str,
        pods: Vec<Pod>,
    }

    #[async_trait::async_trait]
    impl PodSource for StaticSource {
        fn name(&self) -> &str {
            self.name
        }
        async fn run(&self, out: SourceSender, shutdown: CancellationToken) {
            if out.snapshot(self.pods.clone()).await.is_err() {
                return;
            }
            shutdown.cancelled().await;
        }
    }

    #[test]
    fn duplicate_source_names_are_rejected() {
        let mut c = PodConfig::new(log());
        let src = || {
            Arc::new(StaticSource {
                name: "file",
                pods: vec![],
            })
        };
        assert!(c.add_source(src()).is_ok());
        assert!(matches!(
            c.add_source(src()),
            Err(KubeletError::BuildDuplicateSource(n)) if n == "file"
        ));
        assert_eq!(c.source_names(), vec!["file".to_string()]);
    }

    #[tokio::test]
    async fn pod_config_runs_sources_and_streams_merged_updates_until_shutdown() {
        let mut c = PodConfig::new(log());
        c.add_source(Arc::new(StaticSource {
            name: "file",
            pods: vec![mk("a", "1")],
        }))
        .expect("add file");
        c.add_source(Arc::new(StaticSource {
            name: "http",
            pods: vec![],
        }))
        .expect("add http");
        let seen = c.sources_seen();
        assert!(!seen.seen_all_sources());
        let shutdown = CancellationToken::new();
        let (mut rx, fut) = c.start(shutdown.clone());
        let handle = tokio::spawn(fut);
        let mut got = Vec::new();
        for _ in 0..2 {
            let u = tokio::time::timeout(Duration::from_secs(5), rx.recv())
                .await
                .expect("update in time")
                .expect("channel open");
            got.push((u.source.clone(), u.op, u.pods.len()));
        }
        got.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            got,
            vec![
                ("file".to_string(), PodOp::Add, 1),
                ("http".to_string(), PodOp::Add, 0)
            ]
        );
        assert!(seen.seen_all_sources());
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), handle)
            .await
            .expect("config future ends after shutdown")
            .expect("no panic");
        assert!(rx.recv().await.is_none());
    }
}
