//! Where a pod's start time goes: per-stage histograms from the moment the sync loop sees a new
//! pod to its first `Running` status.
//!
//! The runtime's own stages (sandbox, image check, create, start) are
//! `kubelet_runtime_operations_duration_seconds{operation_type}` of the [metrics
//! layer](crate::layer). The engine adds the stages around them, under the kubelet's names where
//! the kubelet has one:
//!
//! | metric | from → to |
//! |---|---|
//! | `kubelet_pod_admission_duration_seconds` | the admit handlers' decision on a new pod (SDK) |
//! | `kubelet_pod_worker_start_duration_seconds` | seen → its worker's first sync begins, the wait for a runtime view of the pod included (kubelet) |
//! | `kubelet_pod_worker_duration_seconds{operation_type="create"}` | that first sync (kubelet; later syncs are `sync`) |
//! | `kubelet_pod_start_containers_duration_seconds` | seen → the last of its containers started (SDK) |
//! | `kubelet_pod_start_status_duration_seconds` | last container started → the status says `Running` (SDK) |
//! | `kubelet_pod_start_duration_seconds` | seen → the status says `Running` (kubelet) |
//!
//! "Seen" is when the sync loop receives the pod from the pod config (the kubelet uses the
//! config source's first-seen time; the merge in between takes microseconds). The buckets are
//! finer than the kubelet's (1 ms to about 2 min, ×1.5 each), so that millisecond stages can be
//! told apart.

use std::collections::HashMap;
use std::time::Instant;

use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// The buckets of every start-stage histogram.
fn stage_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 1.5, 30))
}

/// `operation_type` of `kubelet_pod_worker_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WorkerLabels {
    operation_type: &'static str,
}

/// What is known of one starting pod.
#[derive(Debug, Clone, Copy)]
struct Starting {
    seen: Instant,
    worker_started: bool,
    containers_started: Option<Instant>,
}

/// The start-stage histograms and the pods still starting (see the [module docs](self)).
#[derive(Debug, Clone)]
pub(crate) struct PodStartMetrics {
    admission: Histogram,
    worker_start: Histogram,
    worker: Family<WorkerLabels, Histogram, fn() -> Histogram>,
    containers: Histogram,
    status: Histogram,
    total: Histogram,
    starting: std::sync::Arc<Mutex<HashMap<String, Starting>>>,
}

impl PodStartMetrics {
    pub(crate) fn new() -> Self {
        Self {
            admission: stage_histogram(),
            worker_start: stage_histogram(),
            worker: Family::new_with_constructor(stage_histogram as fn() -> Histogram),
            containers: stage_histogram(),
            status: stage_histogram(),
            total: stage_histogram(),
            starting: Default::default(),
        }
    }

    /// Register the families in `registry`.
    pub(crate) fn register(&self, registry: &mut Registry) {
        let families: [(&str, &str, &Histogram); 5] = [
            (
                "kubelet_pod_admission_duration",
                "Duration in seconds of the admission decision on a new pod.",
                &self.admission,
            ),
            (
                "kubelet_pod_worker_start_duration",
                "Duration in seconds from kubelet seeing a pod to starting a worker.",
                &self.worker_start,
            ),
            (
                "kubelet_pod_start_containers_duration",
                "Duration in seconds from kubelet seeing a pod to the last of its containers started.",
                &self.containers,
            ),
            (
                "kubelet_pod_start_status_duration",
                "Duration in seconds from a starting pod's last container start to its Running status.",
                &self.status,
            ),
            (
                "kubelet_pod_start_duration",
                "Duration in seconds from kubelet seeing a pod for the first time to the pod starting to run.",
                &self.total,
            ),
        ];
        for (name, help, h) in families {
            registry.register_with_unit(name, help, Unit::Seconds, h.clone());
        }
        registry.register_with_unit(
            "kubelet_pod_worker_duration",
            "Duration in seconds to sync a single pod. Broken down by operation type: create or sync.",
            Unit::Seconds,
            self.worker.clone(),
        );
    }

    /// A new pod reached the sync loop.
    pub(crate) fn seen(&self, uid: &str, at: Instant) {
        self.starting
            .lock()
            .entry(uid.to_string())
            .or_insert(Starting {
                seen: at,
                worker_started: false,
                containers_started: None,
            });
    }

    /// The admit handlers took `since.elapsed()` to decide on a pod.
    pub(crate) fn admitted(&self, since: Instant) {
        self.admission.observe(since.elapsed().as_secs_f64());
    }

    /// A pod left before it ran (rejected, deleted, terminal): nothing more to time.
    pub(crate) fn forget(&self, uid: &str) {
        self.starting.lock().remove(uid);
    }

    /// A worker begins a sync of the pod; its first one ends the worker-start stage. Returns the
    /// operation type of the sync (`create` for the first).
    pub(crate) fn sync_begins(&self, uid: &str) -> &'static str {
        let mut starting = self.starting.lock();
        match starting.get_mut(uid) {
            Some(s) if !s.worker_started => {
                s.worker_started = true;
                self.worker_start.observe(s.seen.elapsed().as_secs_f64());
                "create"
            }
            _ => "sync",
        }
    }

    /// A sync of `operation_type` took `since.elapsed()`.
    pub(crate) fn sync_done(&self, operation_type: &'static str, since: Instant) {
        self.worker
            .get_or_create(&WorkerLabels { operation_type })
            .observe(since.elapsed().as_secs_f64());
    }

    /// A sync of a starting pod started containers.
    pub(crate) fn containers_started(&self, uid: &str) {
        if let Some(s) = self.starting.lock().get_mut(uid) {
            s.containers_started = Some(Instant::now());
        }
    }

    /// The pod's status says `Running`: the start is complete (once per pod).
    pub(crate) fn running(&self, uid: &str) {
        let Some(s) = self.starting.lock().remove(uid) else {
            return;
        };
        let now = Instant::now();
        self.total.observe((now - s.seen).as_secs_f64());
        if let Some(c) = s.containers_started {
            self.containers.observe((c - s.seen).as_secs_f64());
            self.status.observe((now - c).as_secs_f64());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn encoded(m: &PodStartMetrics) -> String {
        let mut r = Registry::default();
        m.register(&mut r);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).expect("encode");
        text
    }

    fn count(text: &str, family: &str) -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{family}_count ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    #[test]
    fn each_stage_is_observed_once_per_started_pod() {
        let m = PodStartMetrics::new();
        let seen = Instant::now() - Duration::from_millis(30);
        m.seen("a", seen);
        m.seen("a", Instant::now()); // a second add keeps the first seen time
        m.admitted(Instant::now());
        assert_eq!(m.sync_begins("a"), "create");
        m.containers_started("a");
        m.sync_done("create", Instant::now());
        assert_eq!(m.sync_begins("a"), "sync");
        m.running("a");
        m.running("a"); // only the first Running counts
        // A pod that never runs is forgotten without an observation.
        m.seen("b", Instant::now());
        m.forget("b");
        m.running("b");
        let text = encoded(&m);
        for family in [
            "kubelet_pod_admission_duration_seconds",
            "kubelet_pod_worker_start_duration_seconds",
            "kubelet_pod_start_containers_duration_seconds",
            "kubelet_pod_start_status_duration_seconds",
            "kubelet_pod_start_duration_seconds",
        ] {
            assert_eq!(count(&text, family), 1, "{family} in\n{text}");
        }
        assert!(
            text.contains("kubelet_pod_worker_duration_seconds_count{operation_type=\"create\"} 1"),
            "{text}"
        );
        // seen → Running took at least the 30 ms the pod was seen before.
        let sum: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("kubelet_pod_start_duration_seconds_sum "))
            .and_then(|v| v.trim().parse().ok())
            .expect("sum");
        assert!(sum >= 0.030, "{sum}");
        assert!(m.starting.lock().is_empty());
    }
}
