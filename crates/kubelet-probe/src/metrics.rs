//! The kubelet's prober metrics: `prober_probe_total` and `prober_probe_duration_seconds`.
//!
//! Each worker owns one small [`WorkerMetrics`] record (atomic counters and the histogram's
//! buckets, labels shared with the worker) instead of five label-keyed series in
//! prometheus-client families: at 10,000 probes the families cost more memory than the workers
//! themselves. A [`Collector`] writes the series at scrape time, with the kubelet's names, labels
//! and buckets.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabel, EncodeLabelSet, LabelSetEncoder, NoLabelSet,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

/// Upper bounds of `prober_probe_duration_seconds` (Prometheus' default buckets, as the
/// kubelet); a last `+Inf` bucket follows.
const DURATION_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
const BUCKETS: usize = DURATION_BUCKETS.len() + 1;

/// The labels of one worker's series.
#[derive(Debug)]
pub(crate) struct SeriesLabels {
    pub(crate) probe_type: &'static str,
    pub(crate) container: Arc<str>,
    pub(crate) pod: Arc<str>,
    pub(crate) namespace: Arc<str>,
    pub(crate) pod_uid: Arc<str>,
}

/// One worker's counters and histogram.
#[derive(Debug)]
pub(crate) struct WorkerMetrics {
    labels: SeriesLabels,
    successful: AtomicU64,
    failed: AtomicU64,
    /// `f64` bits of the histogram's sum.
    sum: AtomicU64,
    buckets: [AtomicU64; BUCKETS],
}

/// Every worker's metrics; cheap to clone (shared state), registered as one collector.
#[derive(Debug, Clone, Default)]
pub(crate) struct ProberMetrics {
    workers: Arc<Mutex<HashMap<u64, Arc<WorkerMetrics>>>>,
}

/// The `result` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MetricResult {
    Successful,
    Failed,
}

impl WorkerMetrics {
    /// Count one probe result; durations are recorded for successful results, as the kubelet
    /// does. (The kubelet's `unknown` series stays at 0: probes that cannot decide are errors,
    /// which are not counted.)
    pub(crate) fn observe(&self, result: MetricResult, seconds: f64) {
        match result {
            MetricResult::Successful => {
                self.successful.fetch_add(1, Ordering::Relaxed);
                let i = DURATION_BUCKETS
                    .iter()
                    .position(|b| seconds <= *b)
                    .unwrap_or(BUCKETS - 1);
                self.buckets[i].fetch_add(1, Ordering::Relaxed);
                let _ = self
                    .sum
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                        Some((f64::from_bits(bits) + seconds).to_bits())
                    });
            }
            MetricResult::Failed => {
                self.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl ProberMetrics {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Start the series of worker `id`.
    pub(crate) fn add(&self, id: u64, labels: SeriesLabels) -> Arc<WorkerMetrics> {
        let m = Arc::new(WorkerMetrics {
            labels,
            successful: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            sum: AtomicU64::new(0f64.to_bits()),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        });
        self.workers.lock().insert(id, m.clone());
        m
    }

    /// Drop the series of worker `id` (the kubelet deletes them when a worker stops).
    pub(crate) fn remove(&self, id: u64) {
        self.workers.lock().remove(&id);
    }

    /// Drop every series.
    pub(crate) fn clear(&self) {
        self.workers.lock().clear();
    }

    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register_collector(Box::new(self.clone()));
    }
}

struct TotalLabels<'a> {
    labels: &'a SeriesLabels,
    result: &'static str,
}

impl EncodeLabelSet for TotalLabels<'_> {
    fn encode(&self, encoder: &mut LabelSetEncoder<'_>) -> Result<(), fmt::Error> {
        let l = self.labels;
        ("probe_type", l.probe_type).encode(encoder.encode_label())?;
        ("result", self.result).encode(encoder.encode_label())?;
        ("container", &*l.container).encode(encoder.encode_label())?;
        ("pod", &*l.pod).encode(encoder.encode_label())?;
        ("namespace", &*l.namespace).encode(encoder.encode_label())?;
        ("pod_uid", &*l.pod_uid).encode(encoder.encode_label())
    }
}

struct DurationLabels<'a>(&'a SeriesLabels);

impl EncodeLabelSet for DurationLabels<'_> {
    fn encode(&self, encoder: &mut LabelSetEncoder<'_>) -> Result<(), fmt::Error> {
        let l = self.0;
        ("probe_type", l.probe_type).encode(encoder.encode_label())?;
        ("container", &*l.container).encode(encoder.encode_label())?;
        ("pod", &*l.pod).encode(encoder.encode_label())?;
        ("namespace", &*l.namespace).encode(encoder.encode_label())
    }
}

impl Collector for ProberMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        let mut all: Vec<Arc<WorkerMetrics>> = self.workers.lock().values().cloned().collect();
        kubelet_api::sort::by(&mut all, |a, b| {
            let key = |m: &WorkerMetrics| {
                let l = &m.labels;
                (
                    l.namespace.clone(),
                    l.pod.clone(),
                    l.container.clone(),
                    l.probe_type,
                    l.pod_uid.clone(),
                )
            };
            key(a).cmp(&key(b))
        });
        {
            // prometheus-client appends `_total` to counters.
            let mut total = encoder.encode_descriptor(
                "prober_probe",
                "Cumulative number of a liveness, readiness or startup probe for a container by result",
                None,
                MetricType::Counter,
            )?;
            for m in &all {
                for (result, value) in [
                    ("successful", m.successful.load(Ordering::Relaxed)),
                    ("failed", m.failed.load(Ordering::Relaxed)),
                    ("unknown", 0),
                ] {
                    let labels = TotalLabels {
                        labels: &m.labels,
                        result,
                    };
                    total
                        .encode_family(&labels)?
                        .encode_counter::<NoLabelSet, _, u64>(&value, None)?;
                }
            }
        }
        let mut duration = encoder.encode_descriptor(
            "prober_probe_duration",
            "Duration in seconds for a probe response",
            Some(&Unit::Seconds),
            MetricType::Histogram,
        )?;
        // The duration series have no pod_uid: two workers of pods with the same name (a pod
        // deleted and created again) share one, as in the kubelet.
        let mut i = 0;
        while i < all.len() {
            let first = &all[i].labels;
            let mut sum = 0.0;
            let mut buckets = [0u64; BUCKETS];
            let mut j = i;
            while j < all.len() {
                let l = &all[j].labels;
                if l.probe_type != first.probe_type
                    || l.container != first.container
                    || l.pod != first.pod
                    || l.namespace != first.namespace
                {
                    break;
                }
                sum += f64::from_bits(all[j].sum.load(Ordering::Relaxed));
                for (b, v) in buckets.iter_mut().zip(all[j].buckets.iter()) {
                    *b += v.load(Ordering::Relaxed);
                }
                j += 1;
            }
            let count = buckets.iter().sum();
            let pairs: Vec<(f64, u64)> = DURATION_BUCKETS
                .iter()
                .copied()
                .chain(std::iter::once(f64::INFINITY))
                .zip(buckets)
                .collect();
            duration
                .encode_family(&DurationLabels(first))?
                .encode_histogram::<NoLabelSet>(sum, count, &pairs, None)?;
            i = j;
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn labels(uid: &str) -> SeriesLabels {
        SeriesLabels {
            probe_type: "Liveness",
            container: Arc::from("app"),
            pod: Arc::from("web"),
            namespace: Arc::from("ns"),
            pod_uid: Arc::from(uid),
        }
    }

    #[test]
    fn series_use_the_kubelet_names_labels_and_buckets() {
        let m = ProberMetrics::new();
        let mut registry = Registry::default();
        m.register(&mut registry);
        let w = m.add(1, labels("u1"));
        w.observe(MetricResult::Successful, 0.003);
        w.observe(MetricResult::Successful, 0.2);
        w.observe(MetricResult::Failed, 0.5);
        // A pod of the same name with another UID shares the duration series.
        let w2 = m.add(2, labels("u2"));
        w2.observe(MetricResult::Successful, 20.0);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "# TYPE prober_probe counter",
            "prober_probe_total{probe_type=\"Liveness\",result=\"successful\",container=\"app\",pod=\"web\",namespace=\"ns\",pod_uid=\"u1\"} 2",
            "prober_probe_total{probe_type=\"Liveness\",result=\"failed\",container=\"app\",pod=\"web\",namespace=\"ns\",pod_uid=\"u1\"} 1",
            "prober_probe_total{probe_type=\"Liveness\",result=\"unknown\",container=\"app\",pod=\"web\",namespace=\"ns\",pod_uid=\"u1\"} 0",
            "prober_probe_total{probe_type=\"Liveness\",result=\"successful\",container=\"app\",pod=\"web\",namespace=\"ns\",pod_uid=\"u2\"} 1",
            "# TYPE prober_probe_duration_seconds histogram",
            "# UNIT prober_probe_duration_seconds seconds",
            "prober_probe_duration_seconds_count{probe_type=\"Liveness\",container=\"app\",pod=\"web\",namespace=\"ns\"} 3",
            "prober_probe_duration_seconds_sum{probe_type=\"Liveness\",container=\"app\",pod=\"web\",namespace=\"ns\"} 20.203",
            "prober_probe_duration_seconds_bucket{le=\"0.005\",probe_type=\"Liveness\",container=\"app\",pod=\"web\",namespace=\"ns\"} 1",
            "prober_probe_duration_seconds_bucket{le=\"0.25\",probe_type=\"Liveness\",container=\"app\",pod=\"web\",namespace=\"ns\"} 2",
            "prober_probe_duration_seconds_bucket{le=\"10.0\",probe_type=\"Liveness\",container=\"app\",pod=\"web\",namespace=\"ns\"} 2",
            "prober_probe_duration_seconds_bucket{le=\"+Inf\",probe_type=\"Liveness\",container=\"app\",pod=\"web\",namespace=\"ns\"} 3",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert_eq!(
            text.matches("prober_probe_duration_seconds_count{").count(),
            1,
            "one duration series per label set: {text}"
        );
        m.remove(1);
        m.remove(2);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(!text.contains("pod=\"web\""), "{text}");
    }
}
