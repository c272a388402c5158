//! The pod status cache shared by the PLEG (writer) and the pod workers (readers).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::runtime::PodRuntimeStatus;

/// One cache entry: a status (or the error of the inspection) and its observation time.
#[derive(Debug, Clone)]
pub struct CacheEntry {
    /// The status, or the message of the failed inspection.
    pub status: Result<Arc<PodRuntimeStatus>, String>,
    /// When the inspection that produced it started.
    pub modified: Instant,
}

#[derive(Debug, Default)]
struct State {
    pods: HashMap<String, CacheEntry>,
    global: Option<Instant>,
    // Pods with a known change not yet inspected; the global timestamp does not release them.
    pending: HashSet<String>,
    // Entries stored or dropped so far.
    entry_changes: u64,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    // Bumped on every change; waiters re-check after each bump.
    changed: watch::Sender<u64>,
}

/// Reader handle of the pod status cache. Cheap to clone.
///
/// The pod status cache shared by the PLEG (writer) and the pod workers (readers).
///
/// Contract, as the kubelet's `pkg/kubelet/container/cache.go`: [`PodCacheWriter::set`] stores a
/// pod's runtime status with the time the inspection *started*;
/// [`PodCache::get_newer_than`] waits until the pod's entry, or the global timestamp
/// ([`PodCacheWriter::update_time`], bumped after every relist), is newer than the given time.
/// Unlike the kubelet (which accepts equal times), the comparison is strict: under paused test
/// time an inspection and a sync can share one instant, and only a strictly later observation is
/// guaranteed to have seen what the sync did. A
/// worker therefore always syncs from a status observed after its previous sync, and never waits
/// forever for a pod that did not change.
///
/// One addition to the kubelet's contract: a PLEG marks a pod *pending*
/// ([`PodCacheWriter::mark_pending`]) when it knows the pod changed but has not inspected it yet
/// (an inspection still running after its relist finished, a runtime event not yet followed by an
/// inspection). The global timestamp does not release waiters of a pending pod: they wait for
/// the pod's own entry (a status or the inspection's error), which the PLEG stores within its
/// inspection timeout. Without this, a worker could be handed a status from before its own
/// change (for example without the container it just created) and act on it twice.
#[derive(Debug, Clone)]
pub struct PodCache {
    shared: Arc<Shared>,
}

/// Writer handle of the pod status cache, held by the PLEG.
#[derive(Debug, Clone)]
pub struct PodCacheWriter {
    shared: Arc<Shared>,
}

/// A new empty cache: its writer and a reader.
pub fn pod_cache() -> (PodCacheWriter, PodCache) {
    let (changed, _) = watch::channel(0);
    let shared = Arc::new(Shared {
        state: Mutex::new(State::default()),
        changed,
    });
    (
        PodCacheWriter {
            shared: shared.clone(),
        },
        PodCache { shared },
    )
}

impl PodCacheWriter {
    /// Store `status` for `uid`, observed at `modified`. An entry older than the stored one is
    /// rejected; returns whether the value was stored. Either way the pod is no longer
    /// [pending](Self::mark_pending).
    pub fn set(
        &self,
        uid: &str,
        status: Result<PodRuntimeStatus, String>,
        modified: Instant,
    ) -> bool {
        {
            let mut st = self.shared.state.lock();
            let was_pending = st.pending.remove(uid);
            if let Some(old) = st.pods.get(uid)
                && old.modified > modified
            {
                drop(st);
                if was_pending {
                    self.shared.changed.send_modify(|g| *g += 1);
                }
                return false;
            }
            st.pods.insert(
                uid.to_string(),
                CacheEntry {
                    status: status.map(Arc::new),
                    modified,
                },
            );
            st.entry_changes += 1;
        }
        self.shared.changed.send_modify(|g| *g += 1);
        true
    }

    /// Drop the entry of `uid` (and its pending mark).
    pub fn delete(&self, uid: &str) {
        {
            let mut st = self.shared.state.lock();
            if st.pods.remove(uid).is_some() {
                st.entry_changes += 1;
            }
            st.pending.remove(uid);
        }
        self.shared.changed.send_modify(|g| *g += 1);
    }

    /// Mark `uid` as changed but not yet inspected: until the next [`set`](Self::set) or
    /// [`delete`](Self::delete) of this pod, raising the global timestamp does not release its
    /// waiters. The PLEG that marks a pod must store its entry within a bounded time (its
    /// inspection timeout), so waits stay bounded.
    pub fn mark_pending(&self, uid: &str) {
        self.shared.state.lock().pending.insert(uid.to_string());
    }

    /// Whether `uid` is [pending](Self::mark_pending).
    pub fn is_pending(&self, uid: &str) -> bool {
        self.shared.state.lock().pending.contains(uid)
    }

    /// Raise the global timestamp: every pod is known to be current as of `t`.
    pub fn update_time(&self, t: Instant) {
        {
            let mut st = self.shared.state.lock();
            if st.global.is_some_and(|g| g >= t) {
                return;
            }
            st.global = Some(t);
        }
        self.shared.changed.send_modify(|g| *g += 1);
    }

    /// A reader of the same cache.
    pub fn reader(&self) -> PodCache {
        PodCache {
            shared: self.shared.clone(),
        }
    }
}

impl PodCache {
    /// The current entry of `uid`, if any.
    pub fn get(&self, uid: &str) -> Option<CacheEntry> {
        self.shared.state.lock().pods.get(uid).cloned()
    }

    /// How many times an entry was stored or dropped so far: a reader that reads the same
    /// count before two passes over the entries saw the same entries (the sync loop's
    /// housekeeping skips its look for orphans then).
    pub fn entry_changes(&self) -> u64 {
        self.shared.state.lock().entry_changes
    }

    /// UIDs of every cached pod.
    pub fn uids(&self) -> Vec<String> {
        self.uids_where(|_| true)
    }

    /// UIDs of the cached pods for which `keep` is true (copied only when kept: the sync
    /// loop's housekeeping looks for pods no worker handles every 2 s). `keep` runs under the
    /// cache's lock and must not use the cache.
    pub fn uids_where(&self, mut keep: impl FnMut(&str) -> bool) -> Vec<String> {
        self.shared
            .state
            .lock()
            .pods
            .keys()
            .filter(|uid| keep(uid))
            .cloned()
            .collect()
    }

    /// The entry of `uid` if it, or the global timestamp, is newer than `t` (an empty status
    /// if the runtime has nothing for this pod), as [`get_newer_than`](Self::get_newer_than)
    /// returns it, without waiting: `None` otherwise.
    pub fn get_if_newer(&self, uid: &str, t: Instant) -> Option<CacheEntry> {
        let st = self.shared.state.lock();
        let entry = st.pods.get(uid);
        let fresh_entry = entry.is_some_and(|e| e.modified > t);
        let fresh_global = st.global.is_some_and(|g| g > t) && !st.pending.contains(uid);
        if fresh_entry || fresh_global {
            Some(entry.cloned().unwrap_or_else(|| CacheEntry {
                status: Ok(Arc::new(PodRuntimeStatus {
                    uid: uid.to_string(),
                    ..Default::default()
                })),
                modified: st.global.unwrap_or(t),
            }))
        } else {
            None
        }
    }

    /// Wait until the entry of `uid` or the global timestamp is newer than `t`, then return the
    /// entry (an empty status if the runtime has nothing for this pod).
    pub async fn get_newer_than(&self, uid: &str, t: Instant) -> CacheEntry {
        let mut rx = self.shared.changed.subscribe();
        loop {
            rx.mark_unchanged();
            if let Some(e) = self.get_if_newer(uid, t) {
                return e;
            }
            if rx.changed().await.is_err() {
                // The writer is gone; nothing newer will ever arrive.
                return self.get(uid).unwrap_or_else(|| CacheEntry {
                    status: Err("pod cache writer dropped".to_string()),
                    modified: t,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn uids_where_keeps_the_uids_the_filter_keeps() {
        let (w, r) = pod_cache();
        let t0 = Instant::now();
        for uid in ["a", "b", "c"] {
            w.set(uid, Ok(PodRuntimeStatus::default()), t0);
        }
        let mut kept = r.uids_where(|uid| uid != "b");
        kept.sort();
        assert_eq!(kept, ["a", "c"]);
        assert_eq!(r.uids().len(), 3);
        assert_eq!(r.entry_changes(), 3);
        // A rejected older entry, a deletion of nothing: no change.
        assert!(!w.set(
            "a",
            Ok(PodRuntimeStatus::default()),
            t0 - Duration::from_secs(1)
        ));
        w.delete("x");
        assert_eq!(r.entry_changes(), 3);
        w.set("a", Ok(PodRuntimeStatus::default()), t0);
        w.delete("b");
        assert_eq!(r.entry_changes(), 5);
    }

    #[tokio::test(start_paused = true)]
    async fn get_newer_than_waits_for_a_fresh_entry_or_global_bump() {
        let (w, r) = pod_cache();
        let t0 = Instant::now();
        w.set("a", Ok(PodRuntimeStatus::default()), t0);
        tokio::time::advance(Duration::from_secs(1)).await;
        let t1 = Instant::now();
        let r2 = r.clone();
        let waiter = tokio::spawn(async move { r2.get_newer_than("a", t1).await });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!waiter.is_finished());
        w.update_time(t1);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!waiter.is_finished(), "an equal time is not newer");
        w.update_time(Instant::now());
        let e = waiter.await.expect("join");
        assert_eq!(e.modified, t0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_pending_pod_waits_for_its_own_entry_not_the_global_timestamp() {
        let (w, r) = pod_cache();
        let t0 = Instant::now();
        w.set("a", Ok(PodRuntimeStatus::default()), t0);
        w.set("b", Ok(PodRuntimeStatus::default()), t0);
        tokio::time::advance(Duration::from_secs(1)).await;
        let t1 = Instant::now();
        w.mark_pending("a");
        assert!(w.is_pending("a"));
        let (ra, rb) = (r.clone(), r.clone());
        let a = tokio::spawn(async move { ra.get_newer_than("a", t1).await });
        let b = tokio::spawn(async move { rb.get_newer_than("b", t1).await });
        tokio::time::advance(Duration::from_secs(1)).await;
        w.update_time(Instant::now());
        let eb = b.await.expect("join");
        assert_eq!(
            eb.modified, t0,
            "an unchanged pod is released by the global timestamp"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!a.is_finished(), "a pending pod is not");
        // Its inspection result, even stamped before the wait began, ends the wait: the global
        // timestamp is past `t1` and the pod is no longer pending.
        let stamped = t1 - Duration::from_millis(500);
        assert!(w.set("a", Err("inspection timed out".into()), stamped));
        let ea = a.await.expect("join");
        assert_eq!(
            ea.status.expect_err("the inspection's error"),
            "inspection timed out"
        );
        assert!(!w.is_pending("a"));

        w.mark_pending("a");
        w.delete("a");
        assert!(!w.is_pending("a"));
    }

    #[tokio::test(start_paused = true)]
    async fn older_entries_are_rejected() {
        let (w, r) = pod_cache();
        let t0 = Instant::now();
        tokio::time::advance(Duration::from_secs(1)).await;
        let t1 = Instant::now();
        assert!(w.set("a", Ok(PodRuntimeStatus::default()), t1));
        assert!(!w.set("a", Err("x".into()), t0));
        assert!(r.get("a").expect("entry").status.is_ok());
    }
}
