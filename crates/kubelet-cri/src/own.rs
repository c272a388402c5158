//! The creations and starts the runtime's own CRI calls made, for the native event stream
//! ([`crate::events`]).
//!
//! containerd 1.6 publishes a container's `ContainerCreate` and `TaskStart` (and a sandbox's)
//! from its shim, asynchronously: after a burst of starts the event can come after the
//! `CreateContainer` / `StartContainer` / `RunPodSandbox` call that made the change has
//! returned, and after the pod's inspection that followed that call was launched. Stamped with
//! containerd's publication time, such an event looked newer than that inspection, and an
//! evented PLEG inspected the pod a second time for a change it had seen (at 250 pods, most
//! pods were inspected twice).
//!
//! The runtime records here when each of its own calls returned. An event of a change whose
//! call has returned is confirmed by that return, without asking CRI (the call returns once
//! CRI has recorded the change), and is stamped no later than the return (the change happened
//! before it); its pod UID is the one the call was made for.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use jiff::Timestamp;
use kubelet_api::runtime::ContainerEventKind;

/// The most IDs kept; past it, all are forgotten (their events are then confirmed through CRI,
/// as for IDs the runtime did not make).
const MAX_OWN: usize = 65_536;

/// What the runtime's own calls did to one container or sandbox ID.
#[derive(Debug, Clone, Default)]
struct Own {
    pod_uid: String,
    /// When the call that created it returned.
    created: Option<Timestamp>,
    /// When the call that started it returned.
    started: Option<Timestamp>,
}

#[derive(Debug, Default)]
struct Inner {
    by_id: Mutex<HashMap<String, Own>>,
    /// The runtime's creating or starting calls in flight.
    in_flight: AtomicUsize,
    /// Woken when such a call ends.
    ended: Notify,
}

/// The creations and starts of the runtime's own calls, by container or sandbox ID; clones
/// share them.
#[derive(Debug, Clone, Default)]
pub(crate) struct OwnChanges(Arc<Inner>);

/// A creating or starting call of the runtime in flight; its end (also by an error or a
/// cancellation) wakes the confirmations waiting for it.
#[derive(Debug)]
pub(crate) struct InFlight(Arc<Inner>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.0.ended.notify_waiters();
    }
}

impl OwnChanges {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Own>> {
        self.0.by_id.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record(&self, id: &str, pod_uid: Option<&str>, update: impl FnOnce(&mut Own)) {
        let mut own = self.lock();
        if own.len() >= MAX_OWN && !own.contains_key(id) {
            own.clear();
        }
        let entry = own.entry(id.to_string()).or_default();
        if let Some(uid) = pod_uid {
            entry.pod_uid = uid.to_string();
        }
        update(entry);
    }

    /// A `RunPodSandbox`, `CreateContainer` or `StartContainer` call begins; it ends when the
    /// returned guard drops (after the call recorded its change).
    pub(crate) fn call(&self) -> InFlight {
        self.0.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(Arc::clone(&self.0))
    }

    /// Whether such a call is in flight: a creation or start of an ID nobody knows yet may be
    /// its own, known when it returns.
    pub(crate) fn calls_in_flight(&self) -> bool {
        self.0.in_flight.load(Ordering::SeqCst) > 0
    }

    /// Resolves when one of those calls ends. Enable it (or poll it once) before checking
    /// [`returned`](Self::returned), so an end in between is not missed.
    pub(crate) fn call_ended(&self) -> tokio::sync::futures::Notified<'_> {
        self.0.ended.notified()
    }

    /// `RunPodSandbox` returned sandbox `id` of pod `pod_uid` at `at`: created and started.
    pub(crate) fn sandbox_ran(&self, id: &str, pod_uid: &str, at: Timestamp) {
        self.record(id, Some(pod_uid), |o| {
            o.created = Some(at);
            o.started = Some(at);
        });
    }

    /// `CreateContainer` returned container `id` of pod `pod_uid` at `at`.
    pub(crate) fn container_created(&self, id: &str, pod_uid: &str, at: Timestamp) {
        self.record(id, Some(pod_uid), |o| o.created = Some(at));
    }

    /// `StartContainer` of container `id` returned at `at`.
    pub(crate) fn container_started(&self, id: &str, at: Timestamp) {
        self.record(id, None, |o| o.started = Some(at));
    }

    /// Container or sandbox `id` was removed.
    pub(crate) fn forget(&self, id: &str) {
        self.lock().remove(id);
    }

    /// For an event of `kind` about `id`: when the runtime's own call that made that change
    /// returned, and the pod it was made for; `None` when no such call has returned (or the
    /// kind is not a creation or a start).
    pub(crate) fn returned(
        &self,
        id: &str,
        kind: ContainerEventKind,
    ) -> Option<(Timestamp, String)> {
        let own = self.lock();
        let o = own.get(id).filter(|o| !o.pod_uid.is_empty())?;
        let at = match kind {
            ContainerEventKind::Created => o.created,
            ContainerEventKind::Started => o.started,
            _ => None,
        }?;
        Some((at, o.pod_uid.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_change_is_known_once_its_call_returned_and_until_the_id_is_removed() {
        let own = OwnChanges::default();
        let t = |s: i64| Timestamp::from_second(1_700_000_000 + s).expect("valid");
        assert_eq!(own.returned("c1", ContainerEventKind::Created), None);
        own.container_created("c1", "pod-a", t(1));
        assert_eq!(
            own.returned("c1", ContainerEventKind::Created),
            Some((t(1), "pod-a".to_string()))
        );
        assert_eq!(
            own.returned("c1", ContainerEventKind::Started),
            None,
            "not started by a call yet"
        );
        own.container_started("c1", t(2));
        assert_eq!(
            own.returned("c1", ContainerEventKind::Started),
            Some((t(2), "pod-a".to_string()))
        );
        assert_eq!(own.returned("c1", ContainerEventKind::Stopped), None);

        own.sandbox_ran("s1", "pod-a", t(0));
        assert_eq!(
            own.returned("s1", ContainerEventKind::Started),
            Some((t(0), "pod-a".to_string()))
        );
        // A start the runtime made of a container it did not create names no pod: CRI decides.
        own.container_started("x1", t(3));
        assert_eq!(own.returned("x1", ContainerEventKind::Started), None);

        // Calls in flight, and their end.
        assert!(!own.calls_in_flight());
        let call = own.call();
        assert!(own.calls_in_flight());
        let ended = own.call_ended();
        tokio::pin!(ended);
        ended.as_mut().enable();
        drop(call);
        assert!(!own.calls_in_flight());
        tokio::time::timeout(std::time::Duration::from_secs(5), ended)
            .await
            .expect("the end of the call wakes its waiters");

        own.forget("c1");
        assert_eq!(own.returned("c1", ContainerEventKind::Created), None);
        assert!(
            own.clone()
                .returned("s1", ContainerEventKind::Created)
                .is_some(),
            "clones share"
        );
    }
}
