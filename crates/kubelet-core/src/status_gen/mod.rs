//! Pod status generation: the kubelet's `generateAPIPodStatus`, `convertToAPIContainerStatuses`,
//! `getPhase` and `status/generate.go`, as pure functions.
//!
//! The engine gathers everything a status depends on into one [`StatusInput`] (the desired pod,
//! the runtime's view of it, the status generated last time, the reasons recorded by the last
//! sync, probe results) and calls [`generate_pod_status`]. Nothing here does I/O or reads a clock:
//! `now` is an input, so every rule is table-testable.
//!
//! ```
//! use std::collections::HashMap;
//! use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
//! use kubelet_api::runtime::PodRuntimeStatus;
//! use kubelet_core::status_gen::{StatusInput, generate_pod_status};
//!
//! let pod = Pod {
//!     spec: Some(PodSpec {
//!         containers: vec![Container { name: "app".into(), image: Some("busybox".into()), ..Default::default() }],
//!         ..Default::default()
//!     }),
//!     ..Default::default()
//! };
//! let runtime = PodRuntimeStatus::default();
//! let reasons = HashMap::new();
//! let status = generate_pod_status(&StatusInput {
//!     pod: &pod,
//!     runtime: &runtime,
//!     old: None,
//!     runtime_name: "process",
//!     waiting_reasons: &reasons,
//!     probe_result: &|_, _| None,
//!     sandbox_ready: false,
//!     pod_is_terminal: false,
//!     host_ip: Some("10.0.0.1"),
//!     now: jiff::Timestamp::UNIX_EPOCH,
//! });
//! assert_eq!(status.phase.as_deref(), Some("Pending"));
//! let app = &status.container_statuses.as_ref().unwrap()[0];
//! assert_eq!(app.state.as_ref().unwrap().waiting.as_ref().unwrap().reason.as_deref(), Some("ContainerCreating"));
//! ```

use std::collections::HashMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use kubelet_api::pod::{self as podutil, PodConditionType, RestartPolicy};
use kubelet_api::resources::qos_class;
use kubelet_api::runtime::{self, PodRuntimeStatus, labels};
use kubelet_api::{ProbeResult, ProbeType};

mod conditions;
mod containers;
mod phase;

pub use conditions::*;
pub use containers::*;
pub use phase::*;

/// Everything a pod status is generated from. See [`generate_pod_status`].
pub struct StatusInput<'a> {
    /// The desired pod as its source delivered it (its `status`, if any, is the API copy: a
    /// terminal phase there is never left, and non-kubelet conditions are copied from it).
    pub pod: &'a Pod,
    /// The runtime's view of the pod: all container instances, newest first.
    pub runtime: &'a PodRuntimeStatus,
    /// The status generated (and accepted by the status manager) last time: source of
    /// `lastTransitionTime`s, `startTime`, carried-over `lastState`, phase reason and message.
    pub old: Option<&'a PodStatus>,
    /// Prefix of container IDs: `<runtime_name>://<id>` (`process`, `containerd`, …).
    pub runtime_name: &'a str,
    /// Container name → (reason, message) of the last failed start recorded by the sync
    /// (`CrashLoopBackOff`, `ErrImagePull`, `CreateContainerError`, …).
    pub waiting_reasons: &'a HashMap<String, (String, String)>,
    /// Probe result of a container instance: `(container id, probe type)` → `None` when the
    /// container has no such probe configured. The id is the runtime's id, without prefix.
    pub probe_result: &'a (dyn Fn(&str, ProbeType) -> Option<ProbeResult> + 'a),
    /// `PodReadyToStartContainers`: the sandbox is ready and no new one is needed.
    pub sandbox_ready: bool,
    /// The agent terminated the pod (deleted, evicted, killed) and no container runs.
    pub pod_is_terminal: bool,
    /// The node's IP, reported as `hostIP`/`hostIPs` (and as pod IP for host-network pods).
    pub host_ip: Option<&'a str>,
    /// The current time (for new `lastTransitionTime`s and the first `startTime`).
    pub now: Timestamp,
}

impl std::fmt::Debug for StatusInput<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusInput")
            .field("pod", &podutil::full_name(self.pod))
            .field("runtime_name", &self.runtime_name)
            .field("sandbox_ready", &self.sandbox_ready)
            .field("pod_is_terminal", &self.pod_is_terminal)
            .field("now", &self.now)
            .finish_non_exhaustive()
    }
}

/// Generate the API status of a pod (the kubelet's `generateAPIPodStatus` plus the probe
/// manager's `UpdatePodStatus`).
///
/// * Container statuses: regular containers sorted by name, init containers (sidecars included)
///   in spec order; state from the newest runtime instance, `lastState` from the second newest
///   (else carried over from `old`), `restartCount` from the `io.kubernetes.container.restartCount`
///   annotation (else the attempt). A container never created waits with `ContainerCreating`
///   (`PodInitializing` when the pod has init containers, as the kubelet does); a container that
///   should be restarted and has a recorded reason waits with that reason, its previous
///   termination moved to `lastState`.
/// * `ready` / `started` from probe results; regular init containers are ready once exited 0.
/// * Phase from [`get_phase`]; a terminal phase in `old` or in the API copy is never left.
/// * Conditions `PodReadyToStartContainers`, `Initialized`, `Ready`, `ContainersReady`,
///   `PodScheduled`, with `lastTransitionTime` kept unless the status changed; conditions not
///   owned by the kubelet are preserved.
/// * `hostIP(s)`, `podIP(s)`, `startTime`, `qosClass`; phase reason and message kept while the
///   phase is unchanged.
pub fn generate_pod_status(input: &StatusInput<'_>) -> PodStatus {
    let pod = input.pod;
    let api = pod.status.as_ref();
    // The kubelet's `oldPodStatus`: the status manager's copy, else the API's.
    let old = input.old.or(api);
    let init_specs = podutil::init_containers(pod);
    let specs = podutil::containers(pod);
    let has_init = !init_specs.is_empty();

    let mut init_statuses = convert_container_statuses(
        input,
        init_specs,
        old.and_then(|o| o.init_container_statuses.as_deref())
            .unwrap_or(&[]),
        has_init,
        true,
    );
    let mut statuses = convert_container_statuses(
        input,
        specs,
        old.and_then(|o| o.container_statuses.as_deref())
            .unwrap_or(&[]),
        has_init,
        false,
    );
    apply_probe_results(input, init_specs, &mut init_statuses, specs, &mut statuses);

    let terminal_of = |s: Option<&PodStatus>| {
        s.and_then(|s| s.phase.as_deref())
            .and_then(PodPhase::parse)
            .filter(|p| p.is_terminal())
    };
    let mut phase = get_phase(pod, &init_statuses, &statuses, input.pod_is_terminal);
    if !phase.is_terminal() {
        if let Some(p) = terminal_of(old) {
            tracing::debug!(pod = %podutil::full_name(pod), phase = %p, "status manager phase was terminal, keeping it");
            phase = p;
        } else if let Some(p) = terminal_of(api) {
            tracing::debug!(pod = %podutil::full_name(pod), phase = %p, "API phase was terminal, keeping it");
            phase = p;
        }
    }
    if let Some(api_phase) = terminal_of(api)
        && phase != api_phase
    {
        tracing::error!(
            pod = %podutil::full_name(pod), original = %api_phase, generated = %phase,
            "Pod attempted illegal phase transition"
        );
        phase = api_phase;
    }
    let phase = phase.as_str();

    let (mut reason, mut message) = (None, None);
    if old.and_then(|o| o.phase.as_deref()) == Some(phase) {
        reason = old
            .and_then(|o| o.reason.clone())
            .filter(|r| !r.is_empty())
            .or_else(|| api.and_then(|a| a.reason.clone()));
        message = old
            .and_then(|o| o.message.clone())
            .filter(|m| !m.is_empty())
            .or_else(|| api.and_then(|a| a.message.clone()));
    }

    let conditions = generate_conditions(input, old, &init_statuses, &statuses, phase);

    let host_ip = input
        .host_ip
        .map(str::to_string)
        .or_else(|| old.and_then(|o| o.host_ip.clone()));
    let host_ips = match input.host_ip {
        Some(ip) => Some(vec![HostIP { ip: ip.to_string() }]),
        None => old.and_then(|o| o.host_ips.clone()),
    };
    let pod_ips = pod_ips(
        pod,
        &input.runtime.ips,
        input.runtime.sandbox_host_network(),
        input.host_ip,
    );
    let (pod_ip, pod_ips) = if pod_ips.is_empty() {
        // The sandbox is gone (the pod finished): keep reporting the IPs it had.
        (
            old.and_then(|o| o.pod_ip.clone()),
            old.and_then(|o| o.pod_ips.clone()),
        )
    } else {
        (
            pod_ips.first().cloned(),
            Some(pod_ips.into_iter().map(|ip| PodIP { ip }).collect()),
        )
    };

    let start_time = old
        .and_then(|o| o.start_time.clone())
        .or(Some(Time(input.now)));
    let qos_class = api
        .and_then(|a| a.qos_class.clone())
        .unwrap_or_else(|| qos_class(pod).as_str().to_string());

    PodStatus {
        phase: Some(phase.to_string()),
        reason,
        message,
        conditions: Some(conditions),
        host_ip,
        host_ips,
        pod_ip,
        pod_ips,
        start_time,
        qos_class: Some(qos_class),
        init_container_statuses: Some(init_statuses),
        container_statuses: Some(statuses),
        nominated_node_name: api.and_then(|a| a.nominated_node_name.clone()),
        resource_claim_statuses: api.and_then(|a| a.resource_claim_statuses.clone()),
        observed_generation: pod.metadata.generation,
        ..Default::default()
    }
}

/// The pod's IPs: for a host-network pod, or a pod whose sandbox uses the node's network (a
/// runtime without pod networking, `sandbox_host_network`), the node's (`host_ip`), as with the
/// kubelet on a CRI runtime, whose host-network sandboxes report no IP; else what the runtime
/// reports. A runtime
/// that reports its own idea of the host's address must not make a host-network pod's IP differ
/// from its `hostIP`, change between syncs, or differ between its status and the downward API.
pub(crate) fn pod_ips(
    pod: &Pod,
    runtime_ips: &[String],
    sandbox_host_network: bool,
    host_ip: Option<&str>,
) -> Vec<String> {
    let host_network = sandbox_host_network
        || pod
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false);
    match host_ip {
        Some(ip) if host_network && !ip.is_empty() => vec![ip.to_string()],
        _ => runtime_ips.to_vec(),
    }
}

#[cfg(test)]
mod tests;
