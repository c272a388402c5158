//! The kubelet's prober metrics: `prober_probe_total` and `prober_probe_duration_seconds`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

/// Buckets of `prober_probe_duration_seconds` (Prometheus' default buckets, as the kubelet).
const DURATION_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

fn new_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

/// Labels of `prober_probe_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TotalLabels {
    pub(crate) probe_type: &'static str,
    pub(crate) result: &'static str,
    pub(crate) container: String,
    pub(crate) pod: String,
    pub(crate) namespace: String,
    pub(crate) pod_uid: String,
}

/// Labels of `prober_probe_duration_seconds`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct DurationLabels {
    pub(crate) probe_type: &'static str,
    pub(crate) container: String,
    pub(crate) pod: String,
    pub(crate) namespace: String,
}

/// The metric families; cheap to clone (shared state).
#[derive(Debug, Clone)]
pub(crate) struct ProberMetrics {
    pub(crate) total: Family<TotalLabels, Counter>,
    pub(crate) duration: Family<DurationLabels, Histogram, fn() -> Histogram>,
}

impl ProberMetrics {
    pub(crate) fn new() -> Self {
        Self {
            total: Family::default(),
            duration: Family::new_with_constructor(new_histogram as fn() -> Histogram),
        }
    }

    pub(crate) fn register(&self, registry: &mut Registry) {
        // prometheus-client appends `_total` to counters.
        registry.register(
            "prober_probe",
            "Cumulative number of a liveness, readiness or startup probe for a container by result",
            self.total.clone(),
        );
        registry.register_with_unit(
            "prober_probe_duration",
            "Duration in seconds for a probe response",
            Unit::Seconds,
            self.duration.clone(),
        );
    }
}

/// The metric handles of one probe worker, resolved once (no label hashing per probe).
#[derive(Debug)]
pub(crate) struct WorkerMetrics {
    successful: Counter,
    failed: Counter,
    /// Kept so that the `unknown` series is exported (at 0) as by the kubelet.
    _unknown: Counter,
    duration: Histogram,
}

impl WorkerMetrics {
    pub(crate) fn new(
        m: &ProberMetrics,
        probe_type: &'static str,
        container: &str,
        pod: &str,
        namespace: &str,
        pod_uid: &str,
    ) -> Self {
        let labels = TotalLabels {
            probe_type,
            result: "successful",
            container: container.to_string(),
            pod: pod.to_string(),
            namespace: namespace.to_string(),
            pod_uid: pod_uid.to_string(),
        };
        let with = |result| TotalLabels {
            result,
            ..labels.clone()
        };
        let duration_labels = DurationLabels {
            probe_type,
            container: container.to_string(),
            pod: pod.to_string(),
            namespace: namespace.to_string(),
        };
        Self {
            successful: m.total.get_or_create_owned(&with("successful")),
            failed: m.total.get_or_create_owned(&with("failed")),
            _unknown: m.total.get_or_create_owned(&with("unknown")),
            duration: m.duration.get_or_create_owned(&duration_labels),
        }
    }

    /// Count one probe result; durations are recorded for successful results, as the kubelet
    /// does. (The kubelet's `unknown` series exists for dashboards but stays at 0: probes that
    /// cannot decide are errors, which are not counted.)
    pub(crate) fn observe(&self, result: MetricResult, seconds: f64) {
        match result {
            MetricResult::Successful => {
                self.successful.inc();
                self.duration.observe(seconds);
            }
            MetricResult::Failed => {
                self.failed.inc();
            }
        }
    }

    /// Remove a worker's series (the kubelet deletes them when a worker stops). The labels are
    /// rebuilt rather than stored, to keep workers small.
    pub(crate) fn remove(
        m: &ProberMetrics,
        probe_type: &'static str,
        container: &str,
        pod: &str,
        namespace: &str,
        pod_uid: &str,
    ) {
        for result in ["successful", "failed", "unknown"] {
            m.total.remove(&TotalLabels {
                probe_type,
                result,
                container: container.to_string(),
                pod: pod.to_string(),
                namespace: namespace.to_string(),
                pod_uid: pod_uid.to_string(),
            });
        }
        m.duration.remove(&DurationLabels {
            probe_type,
            container: container.to_string(),
            pod: pod.to_string(),
            namespace: namespace.to_string(),
        });
    }
}

/// The `result` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MetricResult {
    Successful,
    Failed,
}
