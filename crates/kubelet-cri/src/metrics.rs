//! The kubelet's runtime operation metrics: `kubelet_runtime_operations_total`,
//! `kubelet_runtime_operations_errors_total` and `kubelet_runtime_operations_duration_seconds`,
//! labelled with `operation_type` as the kubelet's instrumented runtime service does.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// Label set of the three families.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OperationLabels {
    pub(crate) operation_type: &'static str,
}

fn new_histogram() -> Histogram {
    // The kubelet's buckets: 5 ms × 2.5^n, 14 buckets (up to ~745 s).
    Histogram::new(exponential_buckets(0.005, 2.5, 14))
}

/// The metric families; clones share their values.
#[derive(Debug, Clone)]
pub(crate) struct RuntimeMetrics {
    total: Family<OperationLabels, Counter>,
    errors: Family<OperationLabels, Counter>,
    duration: Family<OperationLabels, Histogram, fn() -> Histogram>,
}

impl RuntimeMetrics {
    pub(crate) fn new() -> Self {
        Self {
            total: Family::default(),
            errors: Family::default(),
            duration: Family::new_with_constructor(new_histogram as fn() -> Histogram),
        }
    }

    pub(crate) fn register(&self, registry: &mut Registry) {
        // prometheus-client appends `_total` to counters.
        registry.register(
            "kubelet_runtime_operations",
            "Cumulative number of runtime operations by operation type.",
            self.total.clone(),
        );
        registry.register(
            "kubelet_runtime_operations_errors",
            "Cumulative number of runtime operation errors by operation type.",
            self.errors.clone(),
        );
        registry.register_with_unit(
            "kubelet_runtime_operations_duration",
            "Duration in seconds of runtime operations. Broken down by operation type.",
            Unit::Seconds,
            self.duration.clone(),
        );
    }

    /// Records one call of the CRI RPC `op` (e.g. `RunPodSandbox`).
    pub(crate) fn observe(&self, op: &'static str, seconds: f64, failed: bool) {
        let labels = OperationLabels {
            operation_type: operation_type(op),
        };
        self.total.get_or_create(&labels).inc();
        self.duration.get_or_create(&labels).observe(seconds);
        if failed {
            self.errors.get_or_create(&labels).inc();
        }
    }
}

/// The kubelet's `operation_type` for a CRI RPC (`instrumented_services.go`).
fn operation_type(op: &'static str) -> &'static str {
    match op {
        "Version" => "version",
        "Status" => "status",
        "RunPodSandbox" => "run_podsandbox",
        "StopPodSandbox" => "stop_podsandbox",
        "RemovePodSandbox" => "remove_podsandbox",
        "PodSandboxStatus" => "podsandbox_status",
        "ListPodSandbox" => "list_podsandbox",
        "CreateContainer" => "create_container",
        "StartContainer" => "start_container",
        "StopContainer" => "stop_container",
        "RemoveContainer" => "remove_container",
        "ListContainers" => "list_containers",
        "ContainerStatus" => "container_status",
        "ExecSync" => "exec_sync",
        "ContainerStats" => "container_stats",
        "ImageStatus" => "image_status",
        "PullImage" => "pull_image",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_and_errors_are_counted_per_kubelet_operation_type() {
        let m = RuntimeMetrics::new();
        let mut registry = Registry::default();
        m.register(&mut registry);
        m.observe("RunPodSandbox", 0.08, false);
        m.observe("RunPodSandbox", 0.2, true);
        m.observe("ListContainers", 0.0001, false);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap_or_default();
        for line in [
            "kubelet_runtime_operations_total{operation_type=\"run_podsandbox\"} 2",
            "kubelet_runtime_operations_total{operation_type=\"list_containers\"} 1",
            "kubelet_runtime_operations_errors_total{operation_type=\"run_podsandbox\"} 1",
            "kubelet_runtime_operations_duration_seconds_count{operation_type=\"run_podsandbox\"} 2",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }
}
