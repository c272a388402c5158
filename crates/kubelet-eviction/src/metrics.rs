//! The manager's metrics, with the kubelet's names: `kubelet_evictions{eviction_signal}` and
//! `kubelet_eviction_stats_age_seconds{eviction_signal}`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Buckets of `kubelet_eviction_stats_age_seconds` (Prometheus' default buckets).
const AGE_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Counters per eviction signal, exposed under the exact name `kubelet_evictions` (the
/// OpenMetrics counter type would append `_total`, which the kubelet's metric does not have).
#[derive(Debug, Clone, Default)]
pub struct EvictionCounter {
    values: Arc<RwLock<BTreeMap<String, Arc<AtomicU64>>>>,
}

impl EvictionCounter {
    /// Add one eviction for `signal`.
    pub fn inc(&self, signal: &str) {
        if let Some(v) = self.values.read().get(signal) {
            v.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.values
            .write()
            .entry(signal.to_string())
            .or_default()
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Evictions counted for `signal`.
    pub fn get(&self, signal: &str) -> u64 {
        self.values
            .read()
            .get(signal)
            .map_or(0, |v| v.load(Ordering::Relaxed))
    }
}

impl EncodeMetric for EvictionCounter {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (signal, v) in self.values.read().iter() {
            let labels = [("eviction_signal", signal.as_str())];
            let value = v.load(Ordering::Relaxed) as i64;
            encoder.encode_family(&labels)?.encode_gauge(&value)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Unknown
    }
}

/// The manager's metrics.
#[derive(Debug, Clone)]
pub struct EvictionMetrics {
    /// `kubelet_evictions{eviction_signal}`.
    pub evictions: EvictionCounter,
    /// `kubelet_eviction_stats_age_seconds{eviction_signal}`: age of the stats an eviction
    /// decision was based on.
    pub stats_age: Family<Vec<(String, String)>, Histogram>,
}

impl Default for EvictionMetrics {
    fn default() -> Self {
        Self {
            evictions: EvictionCounter::default(),
            stats_age: Family::new_with_constructor(|| Histogram::new(AGE_BUCKETS)),
        }
    }
}

impl EvictionMetrics {
    /// Register both metrics into `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kubelet_evictions",
            "Cumulative number of pod evictions by eviction signal",
            self.evictions.clone(),
        );
        registry.register(
            "kubelet_eviction_stats_age_seconds",
            "Time between when stats are collected, and when pod is evicted based on those stats by eviction signal",
            self.stats_age.clone(),
        );
    }

    /// Record one eviction for `signal` based on stats `age_seconds` old.
    pub fn record(&self, signal: &str, age_seconds: f64) {
        self.evictions.inc(signal);
        self.stats_age
            .get_or_create(&vec![("eviction_signal".to_string(), signal.to_string())])
            .observe(age_seconds);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn evictions_are_exposed_under_the_kubelets_name() {
        let m = EvictionMetrics::default();
        let mut reg = Registry::default();
        m.register(&mut reg);
        m.record("memory.available", 0.02);
        m.record("memory.available", 0.03);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &reg).unwrap();
        assert!(
            out.contains("kubelet_evictions{eviction_signal=\"memory.available\"} 2\n"),
            "{out}"
        );
        assert!(
            out.contains(
                "kubelet_eviction_stats_age_seconds_count{eviction_signal=\"memory.available\"} 2"
            ),
            "{out}"
        );
        assert_eq!(m.evictions.get("memory.available"), 2);
    }
}
