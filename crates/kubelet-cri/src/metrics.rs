//! The kubelet's runtime operation metrics: `kubelet_runtime_operations_total`,
//! `kubelet_runtime_operations_errors_total` and `kubelet_runtime_operations_duration_seconds`,
//! labelled with `operation_type` as the kubelet's instrumented runtime service does.

use kubelet_core::layer::OperationMetrics;
use prometheus_client::registry::Registry;

/// The metric families (core's [`OperationMetrics`], which the runtime layer of other runtimes
/// uses too); clones share their values.
#[derive(Debug, Clone)]
pub(crate) struct RuntimeMetrics(OperationMetrics);

impl RuntimeMetrics {
    pub(crate) fn new() -> Self {
        Self(OperationMetrics::new())
    }

    pub(crate) fn register(&self, registry: &mut Registry) {
        self.0.register(registry);
    }

    /// Records one call of the CRI RPC `op` (e.g. `RunPodSandbox`).
    pub(crate) fn observe(&self, op: &'static str, seconds: f64, failed: bool) {
        self.0.observe(operation_type(op), seconds, failed);
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
        "ListImages" => "list_images",
        "RemoveImage" => "remove_image",
        "ImageFsInfo" => "image_fs_info",
        "ListContainerStats" => "list_container_stats",
        "ListPodSandboxStats" => "list_pod_sandbox_stats",
        "PodSandboxStats" => "pod_sandbox_stats",
        "ReopenContainerLog" => "reopen_container_log",
        "UpdateContainerResources" => "update_container_resources",
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
