//! The pod lifecycle event seam: what a PLEG produces and the engine consumes.

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::cache::PodCache;

/// Kind of a pod lifecycle event (`pkg/kubelet/pleg/pleg.go`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PodLifecycleEventType {
    /// A container started running.
    ContainerStarted,
    /// A container exited (or vanished while running).
    ContainerDied,
    /// A container was removed from the runtime.
    ContainerRemoved,
    /// Something about the pod changed that is not captured by the other kinds.
    PodSync,
    /// A container entered an unknown state. Never delivered to the engine by the kubelet's PLEG.
    ContainerChanged,
}

/// One event: which pod, what happened, and to which container (or sandbox) ID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodLifecycleEvent {
    /// Pod UID.
    pub pod_uid: String,
    /// What happened.
    pub kind: PodLifecycleEventType,
    /// Container or sandbox ID the event is about.
    pub container_id: String,
}

/// The receiving end of a PLEG's events. A PLEG's constructor returns it beside the PLEG (as
/// `kube_runtime::reflector::store` returns a store and its writer), so it has exactly one
/// owner: the engine's builder takes both.
pub type PlegEvents = mpsc::Receiver<PodLifecycleEvent>;

/// Channel capacity the kubelet uses between the PLEG and the sync loop.
pub const PLEG_CHANNEL_CAPACITY: usize = 1000;

/// Health of a PLEG.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlegHealth {
    /// Relisting (or receiving events) normally.
    Healthy,
    /// Not healthy; the message says why ("pleg has yet to be successful", "pleg was last seen
    /// active 3m1s ago; threshold is 3m0s", "runtime unreachable: …").
    Unhealthy(String),
}

/// A pod lifecycle event generator: watches the runtime, keeps the [`PodCache`] current, and
/// emits [`PodLifecycleEvent`]s to the [`PlegEvents`] receiver its constructor returned.
#[async_trait]
pub trait PodLifecycleEventGenerator: Send + Sync + 'static {
    /// A reader of the cache this PLEG writes.
    fn cache(&self) -> PodCache;
    /// Current health.
    fn healthy(&self) -> PlegHealth;
    /// Run until `shutdown` is cancelled.
    async fn run(&self, shutdown: CancellationToken);
    /// Inspect pod `uid` (`namespace/name`) again now, whatever the relist period. The pod
    /// worker calls this right after a sync that changed the pod in the runtime (the kubelet's
    /// post-sync `RequestPodRelist`), so that its next sync gets a status observed after that
    /// sync without waiting for the next relist or global cache timestamp. A PLEG that does it
    /// marks the pod [pending](crate::cache::PodCacheWriter::mark_pending) until the
    /// inspection's entry is stored. The default does nothing: the change is seen at the next
    /// relist.
    fn request_reinspect(&self, uid: &str, name: &str, namespace: &str) {
        let _ = (uid, name, namespace);
    }

    /// Pod `uid`'s worker is about to change it in the runtime (a sync): a PLEG that inspects
    /// pods on runtime events may hold the pod's events until [`release`](Self::release),
    /// whose inspection sees everything they report, instead of inspecting the pod for each
    /// change the worker makes. The default does nothing.
    fn hold(&self, uid: &str) {
        let _ = uid;
    }

    /// Pod `uid`'s worker is done changing it (`changed`: the sync changed the runtime). The
    /// pod is inspected once when it changed or when events arrived while it was held. The
    /// default asks for [`request_reinspect`](Self::request_reinspect) when `changed`.
    fn release(&self, uid: &str, name: &str, namespace: &str, changed: bool) {
        if changed {
            self.request_reinspect(uid, name, namespace);
        }
    }

    /// Pod `uid`'s worker is done with it for good: the pod left every source and the worker
    /// removed every container and sandbox it had (it saw them in an inspection after the
    /// pod's kill, and nothing creates containers for a terminated pod). A PLEG that inspects
    /// pods on runtime events may then forget the pod (its cache entry, its record) instead of
    /// inspecting it once more, and skip the pod's later stop and removal events; its relist
    /// still finds anything left behind. The default is [`release`](Self::release) with
    /// `changed`.
    fn release_removed(&self, uid: &str, name: &str, namespace: &str) {
        self.release(uid, name, namespace, true);
    }

    /// Register the PLEG's metrics (`kubelet_pleg_*`) in the agent's registry; called once by
    /// the engine's `KubeletBuilder::build`. The default registers nothing.
    fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        let _ = registry;
    }
}

fn _assert_pleg_dyn(_: &dyn PodLifecycleEventGenerator) {}
