//! The PLEG's Prometheus metrics, named as the kubelet's (`pkg/kubelet/metrics/metrics.go`).

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Prometheus' default buckets, which the kubelet uses for both relist histograms.
const DEFAULT_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Labels of `kubelet_pleg_inspection_failures`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct FailureLabels {
    /// `timeout` or `error`.
    pub(crate) reason: &'static str,
}

/// The metric handles of one PLEG; cheap to clone (shared state).
///
/// Registered by [`GenericPleg::register_metrics`](crate::GenericPleg::register_metrics) or
/// [`EventedPleg::register_metrics`](crate::EventedPleg::register_metrics). prometheus-client
/// writes OpenMetrics text, so counters carry the `_total` suffix there
/// (`kubelet_pleg_discard_events_total`).
#[derive(Debug, Clone)]
pub struct PlegMetrics {
    pub(crate) relist_duration: Histogram,
    pub(crate) relist_interval: Histogram,
    pub(crate) last_seen: Gauge<f64, AtomicU64>,
    pub(crate) discard_events: Counter,
    pub(crate) inspection_failures: Family<FailureLabels, Counter>,
    pub(crate) evented_connection_errors: Counter,
    pub(crate) evented_connection_successes: Counter,
}

impl Default for PlegMetrics {
    fn default() -> Self {
        Self {
            relist_duration: Histogram::new(DEFAULT_BUCKETS),
            relist_interval: Histogram::new(DEFAULT_BUCKETS),
            last_seen: Gauge::default(),
            discard_events: Counter::default(),
            inspection_failures: Family::default(),
            evented_connection_errors: Counter::default(),
            evented_connection_successes: Counter::default(),
        }
    }
}

impl PlegMetrics {
    /// Register every family in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kubelet_pleg_relist_duration_seconds",
            "Duration in seconds for relisting pods in PLEG",
            self.relist_duration.clone(),
        );
        registry.register(
            "kubelet_pleg_relist_interval_seconds",
            "Interval in seconds between relisting in PLEG",
            self.relist_interval.clone(),
        );
        registry.register(
            "kubelet_pleg_last_seen_seconds",
            "Timestamp in seconds when PLEG was last seen active",
            self.last_seen.clone(),
        );
        registry.register(
            "kubelet_pleg_discard_events",
            "The number of discard events in PLEG",
            self.discard_events.clone(),
        );
        registry.register(
            "kubelet_pleg_inspection_failures",
            "Pod inspections in PLEG that failed or timed out (the pod is inspected again; other pods are not held back), by reason",
            self.inspection_failures.clone(),
        );
        registry.register(
            "kubelet_evented_pleg_connection_error_count",
            "The number of errors encountered during the establishment of streaming connection with the CRI runtime",
            self.evented_connection_errors.clone(),
        );
        registry.register(
            "kubelet_evented_pleg_connection_success_count",
            "The number of times a streaming client was obtained to receive CRI Events",
            self.evented_connection_successes.clone(),
        );
    }

    /// Events dropped because the channel was full or closed.
    pub fn discarded_events(&self) -> u64 {
        self.discard_events.get()
    }

    /// Pod inspections that timed out.
    pub fn inspection_timeouts(&self) -> u64 {
        self.inspection_failures
            .get_or_create(&FailureLabels { reason: "timeout" })
            .get()
    }

    /// Event stream subscriptions that failed or ended.
    pub fn connection_errors(&self) -> u64 {
        self.evented_connection_errors.get()
    }

    /// Event stream subscriptions that succeeded.
    pub fn connection_successes(&self) -> u64 {
        self.evented_connection_successes.get()
    }
}
