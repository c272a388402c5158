//! Pod configuration: the vocabulary of pod sources ([`PodSource`], [`SourceSender`]) and of the

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::event::EventRecorder;

/// Source names the kubelet uses (`pkg/kubelet/types/pod_update.go`).
pub mod sources {
    /// Static pods from files.
    pub const FILE: &str = "file";
    /// Static pods from a manifest URL.
    pub const HTTP: &str = "http";
    /// Pods from the API server.
    pub const API: &str = "api";
}

/// Annotations PodConfig and static-pod defaulting add.
pub mod annotations {
    /// Name of the source a pod came from.
    pub const CONFIG_SOURCE: &str = "kubernetes.io/config.source";
    /// When the pod was first seen (RFC 3339 with nanoseconds).
    pub const CONFIG_SEEN: &str = "kubernetes.io/config.seen";
    /// Hash of a static pod (its UID).
    pub const CONFIG_HASH: &str = "kubernetes.io/config.hash";
    /// Set on mirror pods, value = config hash.
    pub const CONFIG_MIRROR: &str = "kubernetes.io/config.mirror";
}

/// Mark `pod` as first seen now by `source`: `kubernetes.io/config.source` is set to `source` and
/// `kubernetes.io/config.seen` to the current time (RFC 3339 with nanoseconds, UTC), replacing
/// any values the pod carried.
///
/// The merge does this to each pod new to it. A source that marks the pods it loads itself (the
/// file source does) lets the merge keep the source's allocation instead of copying the pod to
/// annotate it: the merge leaves a new pod alone when it already names its source and carries a
/// seen time.
pub fn mark_seen(pod: &mut Pod, source: &str) {
    let annotations = pod
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    annotations.insert(annotations::CONFIG_SOURCE.to_string(), source.to_string());
    annotations.insert(
        annotations::CONFIG_SEEN.to_string(),
        jiff::Timestamp::now().to_string(),
    );
}

/// Whether `pod` is marked as seen by `source` (see [`mark_seen`]).
pub fn is_marked_seen(pod: &Pod, source: &str) -> bool {
    pod.metadata.annotations.as_ref().is_some_and(|a| {
        a.get(annotations::CONFIG_SOURCE).map(String::as_str) == Some(source)
            && a.contains_key(annotations::CONFIG_SEEN)
    })
}

/// Operation of a merged pod update, in the kubelet's semantics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PodOp {
    /// Pods new to the agent.
    Add,
    /// Pods whose spec, labels or annotations changed.
    Update,
    /// Pods that got a deletion timestamp (graceful deletion).
    Delete,
    /// Pods gone from their source: stop them.
    Remove,
    /// Pods whose status alone changed.
    Reconcile,
}

/// A merged update: an operation over pods, tagged with its source.
#[derive(Debug, Clone, PartialEq)]
pub struct PodUpdate {
    /// What happened.
    pub op: PodOp,
    /// The pods it happened to. They are the merge's own copies, shared: the pod workers and the
    /// status manager hold these same allocations.
    pub pods: Vec<Arc<Pod>>,
    /// Name of the source.
    pub source: String,
}

/// A full snapshot of one source's pods.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceSnapshot {
    /// Name of the source.
    pub source: String,
    /// Every pod the source currently has. A source that keeps its pods as `Arc`s sends clones
    /// of those, so a snapshot costs no deep copy of the pods.
    pub pods: Vec<Arc<Pod>>,
}

/// The sending side a [`PodSource`] writes snapshots to.
#[derive(Debug, Clone)]
pub struct SourceSender {
    source: String,
    tx: mpsc::Sender<SourceSnapshot>,
    recorder: EventRecorder,
    names: NameIndex,
}

/// Which source holds each pod full name (`name_namespace`), as of the last merge: written by
/// the merge, read through [`SourceSender::other_owner`]. Cloning shares the index.
///
/// A name two sources hold belongs to the one that took it first, until that one lets it go.
#[derive(Debug, Clone, Default)]
pub struct NameIndex(Arc<parking_lot::RwLock<std::collections::HashMap<String, Vec<String>>>>);

impl NameIndex {
    /// `source` now holds exactly `names`.
    pub fn set(&self, source: &str, names: Vec<String>) {
        let mut map = self.0.write();
        map.retain(|_, holders| {
            holders.retain(|s| s != source);
            !holders.is_empty()
        });
        for n in names {
            Self::add_one(&mut map, n, source);
        }
    }

    /// `source` now also holds `names` (the pods a merge added). Cheaper than [`set`](Self::set)
    /// when a source changes a few of many pods.
    pub fn add(&self, source: &str, names: impl IntoIterator<Item = String>) {
        let mut map = self.0.write();
        for n in names {
            Self::add_one(&mut map, n, source);
        }
    }

    /// `source` no longer holds `names` (the pods a merge removed).
    pub fn remove<S: AsRef<str>>(&self, source: &str, names: impl IntoIterator<Item = S>) {
        let mut map = self.0.write();
        for n in names {
            if let Some(holders) = map.get_mut(n.as_ref()) {
                holders.retain(|s| s != source);
                if holders.is_empty() {
                    map.remove(n.as_ref());
                }
            }
        }
    }

    fn add_one(
        map: &mut std::collections::HashMap<String, Vec<String>>,
        name: String,
        source: &str,
    ) {
        let holders = map.entry(name).or_default();
        if !holders.iter().any(|s| s == source) {
            holders.push(source.to_string());
        }
    }

    fn owner(&self, full_name: &str) -> Option<String> {
        self.0
            .read()
            .get(full_name)
            .and_then(|holders| holders.first())
            .cloned()
    }
}

/// The receiver of a [`SourceSender`] is gone: the agent is shutting down.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("pod config receiver closed")]
pub struct SourceClosed;

impl SourceSender {
    /// A sender for `source` writing into `tx`, recording events with `recorder`.
    pub fn new(
        source: impl Into<String>,
        tx: mpsc::Sender<SourceSnapshot>,
        recorder: EventRecorder,
    ) -> Self {
        Self {
            source: source.into(),
            tx,
            recorder,
            names: NameIndex::default(),
        }
    }

    /// The sender reading pod name ownership from `names` (the merge's index).
    pub fn with_names(mut self, names: NameIndex) -> Self {
        self.names = names;
        self
    }

    /// The other source that holds a pod of this full name (`name_namespace`) as of the last
    /// merge, if any: a source that accepts pods from clients (the push endpoint) refuses such
    /// a name up front rather than accept a pod that would clash.
    pub fn other_owner(&self, full_name: &str) -> Option<String> {
        self.names.owner(full_name).filter(|s| *s != self.source)
    }

    /// Deliver a full snapshot. An empty snapshot is meaningful: it marks the source as seen.
    ///
    /// Takes owned pods or shared ones (`Vec<Pod>` or `Vec<Arc<Pod>>`).
    pub async fn snapshot<P: Into<Arc<Pod>>>(
        &self,
        pods: impl IntoIterator<Item = P>,
    ) -> Result<(), SourceClosed> {
        let pods = pods.into_iter().map(Into::into).collect();
        self.tx
            .send(SourceSnapshot {
                source: self.source.clone(),
                pods,
            })
            .await
            .map_err(|_| SourceClosed)
    }

    /// The source name.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Recorder for events about manifests (for example `FailedValidation`).
    pub fn recorder(&self) -> &EventRecorder {
        &self.recorder
    }
}

/// A source of desired pods (files, a URL, the API server, …).
///
/// `run` delivers full snapshots through the sender until `shutdown` is cancelled. A source with
/// nothing to report must still send one empty snapshot, because destructive cleanup waits until
/// every source has been seen. Bad input is reported through the sender's recorder and never ends
/// the source.
///
/// Pod configuration: the vocabulary of pod sources ([`PodSource`], [`SourceSender`]) and of the
/// merged update stream ([`PodUpdate`], [`PodOp`]).
///
/// A source delivers full snapshots of its pods; the engine's merge (`kubelet_core::merge`) turns per-source
/// snapshots into the kubelet's incremental operations and tracks which sources have been seen.
#[async_trait]
pub trait PodSource: Send + Sync + 'static {
    /// Source name (`file`, `http`, `api` or an embedder's own).
    fn name(&self) -> &str;
    /// Deliver snapshots until `shutdown` is cancelled.
    async fn run(&self, out: SourceSender, shutdown: CancellationToken);
}

fn _assert_source_dyn(_: &dyn PodSource) {}

#[cfg(test)]
mod tests {
    use super::*;

    fn sender(source: &str, names: &NameIndex) -> SourceSender {
        let (tx, _rx) = mpsc::channel(1);
        SourceSender::new(source, tx, EventRecorder::log_only()).with_names(names.clone())
    }

    #[test]
    fn a_name_belongs_to_the_source_that_took_it_first_until_it_lets_it_go() {
        let names = NameIndex::default();
        let (file, push) = (sender("file", &names), sender("push", &names));
        names.add(
            "file",
            ["web_default".to_string(), "db_default".to_string()],
        );
        names.add(
            "push",
            ["web_default".to_string(), "api_default".to_string()],
        );
        assert_eq!(push.other_owner("web_default").as_deref(), Some("file"));
        assert_eq!(file.other_owner("web_default"), None, "its own");
        assert_eq!(file.other_owner("api_default").as_deref(), Some("push"));

        names.remove("file", ["web_default"]);
        assert_eq!(push.other_owner("web_default"), None, "push holds it now");
        assert_eq!(file.other_owner("web_default").as_deref(), Some("push"));
        names.remove("push", ["web_default", "unknown_default"]);
        assert_eq!(file.other_owner("web_default"), None);

        // `set` replaces what one source holds and leaves the others'.
        names.set("file", vec!["api_default".to_string()]);
        assert_eq!(push.other_owner("db_default"), None);
        assert_eq!(push.other_owner("api_default"), None, "push took it first");
        names.remove("push", ["api_default"]);
        assert_eq!(push.other_owner("api_default").as_deref(), Some("file"));
    }
}
