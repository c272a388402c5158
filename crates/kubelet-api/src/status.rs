//! Pod statuses as the agent last generated them: [`StatusReader`] for probers, servers and
//! plugins, [`StatusWriter`] for the engine.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use parking_lot::RwLock;

use crate::pod as podutil;

/// A pod and the status the agent last generated for it.
#[derive(Debug, Clone)]
pub struct PodWithStatus {
    /// The pod as its source delivered it.
    pub pod: Arc<Pod>,
    /// The latest generated status.
    pub status: Arc<PodStatus>,
}

/// Cloneable reader of the status manager's cache (used by probers, the read-only port, and
/// embedders). Reads never block the engine for more than a map lookup.
#[derive(Debug, Clone, Default)]
pub struct StatusReader {
    inner: Arc<RwLock<HashMap<String, PodWithStatus>>>,
    changes: Arc<AtomicU64>,
}

impl StatusReader {
    /// Status of pod `uid`, if the agent has generated one.
    pub fn get(&self, uid: &str) -> Option<PodWithStatus> {
        self.inner.read().get(uid).cloned()
    }

    /// `f` of pod `uid`'s entry, read in place (no copy of the entry): for checks that run
    /// over many pods, such as the container manager's housekeeping every 2 s.
    pub fn inspect<R>(&self, uid: &str, f: impl FnOnce(&PodWithStatus) -> R) -> Option<R> {
        self.inner.read().get(uid).map(f)
    }

    /// How many times an entry was set or removed so far. A reader that reads the same count
    /// before two passes over the entries saw no change between them: periodic checks that
    /// found nothing to do (the container manager's housekeeping) can skip a pass.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::SeqCst)
    }

    /// Every pod with its status, sorted by namespace and name.
    pub fn list(&self) -> Vec<PodWithStatus> {
        let mut v: Vec<PodWithStatus> = self.inner.read().values().cloned().collect();
        crate::sort::by(&mut v, |a, b| {
            (
                a.pod.metadata.namespace.as_deref(),
                a.pod.metadata.name.as_deref(),
            )
                .cmp(&(
                    b.pod.metadata.namespace.as_deref(),
                    b.pod.metadata.name.as_deref(),
                ))
        });
        v
    }
}

/// The writing side of a [`StatusReader`], held by whoever generates statuses (the engine's
/// status manager).
#[derive(Debug, Default)]
pub struct StatusWriter {
    reader: StatusReader,
}

impl StatusWriter {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// A reader of this store.
    pub fn reader(&self) -> StatusReader {
        self.reader.clone()
    }

    /// Set the status of `pod` (keyed by its UID).
    pub fn put(&self, pod: Arc<Pod>, status: Arc<PodStatus>) {
        let uid = podutil::uid(&pod).to_string();
        let mut entries = self.reader.inner.write();
        entries.insert(uid, PodWithStatus { pod, status });
        // Counted under the lock: whoever reads the new count finds the new entry.
        self.reader.changes.fetch_add(1, Ordering::SeqCst);
    }

    /// Forget pod `uid`.
    pub fn remove(&self, uid: &str) {
        let mut entries = self.reader.inner.write();
        if entries.remove(uid).is_some() {
            self.reader.changes.fetch_add(1, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inspect_reads_an_entry_in_place() {
        let w = StatusWriter::new();
        let r = w.reader();
        assert_eq!(r.inspect("u1", |_| ()), None);
        let mut pod = Pod::default();
        pod.metadata.uid = Some("u1".into());
        let status = PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        };
        w.put(Arc::new(pod), Arc::new(status));
        assert_eq!(
            r.inspect("u1", |p| p.status.phase.clone()),
            Some(Some("Running".to_string()))
        );
        w.remove("u1");
        assert_eq!(r.inspect("u1", |_| ()), None);
    }

    #[test]
    fn every_set_and_removal_is_counted() {
        let w = StatusWriter::new();
        let r = w.reader();
        assert_eq!(r.changes(), 0);
        let mut pod = Pod::default();
        pod.metadata.uid = Some("u1".into());
        let pod = Arc::new(pod);
        w.put(pod.clone(), Arc::default());
        w.put(pod, Arc::default());
        assert_eq!(r.changes(), 2);
        w.remove("u1");
        assert_eq!(r.changes(), 3);
        // Nothing to remove: no change.
        w.remove("u1");
        assert_eq!(r.clone().changes(), 3);
    }
}
