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

use std::collections::{BTreeMap, HashMap};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use kubelet_api::pod::{self as podutil, RestartPolicy};
use kubelet_api::runtime::{self, PodRuntimeStatus, labels};
use kubelet_api::{ProbeResult, ProbeType};

/// A pod's phase (`status.phase`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PodPhase {
    /// Accepted; not every container runs yet.
    Pending,
    /// Bound and started; at least one container runs.
    Running,
    /// Every container ended with success and none restarts.
    Succeeded,
    /// Every container ended and at least one failed.
    Failed,
    /// The phase could not be obtained.
    Unknown,
}

impl PodPhase {
    /// The API's spelling: `Pending`, `Running`, `Succeeded`, `Failed`, `Unknown`.
    pub const fn as_str(self) -> &'static str {
        match self {
            PodPhase::Pending => "Pending",
            PodPhase::Running => "Running",
            PodPhase::Succeeded => "Succeeded",
            PodPhase::Failed => "Failed",
            PodPhase::Unknown => "Unknown",
        }
    }

    /// The phase of an API spelling; `None` for anything else.
    pub fn parse(phase: &str) -> Option<Self> {
        Some(match phase {
            "Pending" => PodPhase::Pending,
            "Running" => PodPhase::Running,
            "Succeeded" => PodPhase::Succeeded,
            "Failed" => PodPhase::Failed,
            "Unknown" => PodPhase::Unknown,
            _ => return None,
        })
    }

    /// `Succeeded` and `Failed`: a pod never leaves them.
    pub const fn is_terminal(self) -> bool {
        matches!(self, PodPhase::Succeeded | PodPhase::Failed)
    }
}

impl std::fmt::Display for PodPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A pod's quality-of-service class (`status.qosClass`), from [`qos_class`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QosClass {
    /// Every container has equal cpu and memory requests and limits.
    Guaranteed,
    /// Some requests or limits, not `Guaranteed`.
    Burstable,
    /// No cpu or memory requests or limits at all.
    BestEffort,
}

impl QosClass {
    /// The API's spelling: `Guaranteed`, `Burstable`, `BestEffort`.
    pub const fn as_str(self) -> &'static str {
        match self {
            QosClass::Guaranteed => "Guaranteed",
            QosClass::Burstable => "Burstable",
            QosClass::BestEffort => "BestEffort",
        }
    }
}

impl std::fmt::Display for QosClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Condition type `PodReadyToStartContainers`.
pub const COND_READY_TO_START: &str = "PodReadyToStartContainers";
/// Condition type `Initialized`.
pub const COND_INITIALIZED: &str = "Initialized";
/// Condition type `Ready`.
pub const COND_READY: &str = "Ready";
/// Condition type `ContainersReady`.
pub const COND_CONTAINERS_READY: &str = "ContainersReady";
/// Condition type `PodScheduled`.
pub const COND_POD_SCHEDULED: &str = "PodScheduled";
/// Condition type `DisruptionTarget` (shared: set by eviction, preemption, node shutdown).
pub const COND_DISRUPTION_TARGET: &str = "DisruptionTarget";

/// Waiting reason of a container that has not been created yet.
pub const REASON_CONTAINER_CREATING: &str = "ContainerCreating";
/// Waiting reason of a container of a pod with init containers that has not been created yet.
pub const REASON_POD_INITIALIZING: &str = "PodInitializing";
/// Terminated reason of a container whose state was lost.
pub const REASON_CONTAINER_STATUS_UNKNOWN: &str = "ContainerStatusUnknown";
/// Message of a container that vanished while the pod was terminated.
pub const MESSAGE_LOST_ON_TERMINATION: &str =
    "The container could not be located when the pod was terminated";
/// Message of a container that vanished after it had been seen running.
pub const MESSAGE_LOST_WHILE_RUNNING: &str = "The container could not be located when the pod was deleted.  The container used to be Running";

/// True for the condition types the kubelet owns (`PodConditionByKubelet`).
pub fn is_kubelet_condition(type_: &str) -> bool {
    matches!(
        type_,
        COND_READY_TO_START
            | COND_INITIALIZED
            | COND_READY
            | COND_CONTAINERS_READY
            | COND_POD_SCHEDULED
    )
}

/// True for conditions the kubelet shares with other writers (`PodConditionSharedByKubelet`).
pub fn is_shared_condition(type_: &str) -> bool {
    type_ == COND_DISRUPTION_TARGET
}

/// True for `Succeeded` and `Failed` (an API status's phase, as text).
pub fn is_terminal_phase(phase: Option<&str>) -> bool {
    phase
        .and_then(PodPhase::parse)
        .is_some_and(PodPhase::is_terminal)
}

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
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    // A host-network pod has the node's address, as with the kubelet on a CRI runtime (whose
    // host-network sandboxes report no IP): a runtime that reports its own idea of the host's
    // address must not make the pod's IP differ from its hostIP or change between syncs.
    let pod_ips: Vec<String> = match input.host_ip {
        Some(ip) if host_network => vec![ip.to_string()],
        _ => input.runtime.ips.clone(),
    };
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

/// `<runtime_name>://<id>`.
pub fn container_id(runtime_name: &str, id: &str) -> String {
    format!("{runtime_name}://{id}")
}

/// The id part of a `<runtime>://<id>` container ID (the whole string if it has no scheme).
pub fn strip_container_id(id: &str) -> &str {
    id.split_once("://").map_or(id, |(_, rest)| rest)
}

/// Restart count of a runtime container instance: the `io.kubernetes.container.restartCount`
/// annotation, else the attempt number.
pub fn restart_count(cs: &runtime::ContainerStatus) -> i32 {
    cs.annotations
        .get(labels::CONTAINER_RESTART_COUNT)
        .and_then(|v| v.trim().parse::<i32>().ok())
        .unwrap_or_else(|| i32::try_from(cs.metadata.attempt).unwrap_or(i32::MAX))
}

fn state_is_terminated(s: Option<&ContainerState>) -> bool {
    s.is_some_and(|s| s.terminated.is_some())
}
fn state_is_running(s: Option<&ContainerState>) -> bool {
    s.is_some_and(|s| s.running.is_some())
}
fn state_is_waiting(s: Option<&ContainerState>) -> bool {
    s.is_some_and(|s| s.waiting.is_some())
}
fn waiting_reason(s: Option<&ContainerState>) -> Option<&str> {
    s.and_then(|s| s.waiting.as_ref())
        .and_then(|w| w.reason.as_deref())
}

fn waiting(reason: &str, message: Option<String>) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.to_string()),
            message,
        }),
        ..Default::default()
    }
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

/// One runtime instance as an API container status (`convertContainerStatus`).
fn convert_instance(
    cs: &runtime::ContainerStatus,
    spec_image: &str,
    runtime_name: &str,
    old: Option<&ContainerStatus>,
) -> ContainerStatus {
    let cid = container_id(runtime_name, &cs.id);
    let image_id = if cs.image_ref.is_empty() {
        if cs.image.is_empty() {
            spec_image.to_string()
        } else {
            cs.image.clone()
        }
    } else {
        cs.image_ref.clone()
    };
    let mut status = ContainerStatus {
        name: cs.metadata.name.clone(),
        image: spec_image.to_string(),
        image_id,
        container_id: Some(cid.clone()),
        restart_count: restart_count(cs),
        ..Default::default()
    };
    status.state = Some(match cs.state {
        runtime::ContainerState::Running => ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(Time(cs.started_at.unwrap_or(cs.created_at))),
            }),
            ..Default::default()
        },
        runtime::ContainerState::Exited => ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: cs.exit_code,
                reason: non_empty(&cs.reason),
                message: non_empty(&cs.message),
                started_at: cs.started_at.map(Time),
                finished_at: cs.finished_at.map(Time),
                container_id: Some(cid),
                signal: None,
            }),
            ..Default::default()
        },
        runtime::ContainerState::Created => waiting(REASON_CONTAINER_CREATING, None),
        runtime::ContainerState::Unknown => {
            if let Some(old) = old.filter(|o| state_is_running(o.state.as_ref())) {
                // It was running and is gone: it terminated, we just do not know how.
                status.restart_count = old.restart_count.saturating_add(1);
                lost_container_state()
            } else {
                ContainerState {
                    waiting: Some(ContainerStateWaiting::default()),
                    ..Default::default()
                }
            }
        }
    });
    status
}

/// Runtime instances of container `name`, newest first.
fn instances<'a>(rt: &'a PodRuntimeStatus, name: &str) -> Vec<&'a runtime::ContainerStatus> {
    let mut v: Vec<&runtime::ContainerStatus> = rt
        .container_statuses
        .iter()
        .filter(|c| c.metadata.name == name)
        .collect();
    v.sort_by_key(|c| std::cmp::Reverse((c.created_at, c.metadata.attempt)));
    v
}

/// `ShouldContainerBeRestarted`, judged on the newest instance.
fn should_restart(
    container: &Container,
    pod: &Pod,
    newest: Option<&runtime::ContainerStatus>,
    is_init: bool,
) -> bool {
    if podutil::is_deleted(pod) {
        return false;
    }
    let Some(cs) = newest else {
        return true;
    };
    match cs.state {
        runtime::ContainerState::Running => return false,
        runtime::ContainerState::Unknown | runtime::ContainerState::Created => return true,
        runtime::ContainerState::Exited => {}
    }
    if is_init && podutil::is_sidecar(container) {
        return true;
    }
    match podutil::restart_policy(pod) {
        RestartPolicy::Never => false,
        RestartPolicy::OnFailure => cs.exit_code != 0,
        RestartPolicy::Always => true,
    }
}

/// `convertToAPIContainerStatuses` for one container list.
fn convert_container_statuses(
    input: &StatusInput<'_>,
    specs: &[Container],
    old_statuses: &[ContainerStatus],
    has_init: bool,
    is_init: bool,
) -> Vec<ContainerStatus> {
    let default_reason = if has_init {
        REASON_POD_INITIALIZING
    } else {
        REASON_CONTAINER_CREATING
    };
    let old_by_name: HashMap<&str, &ContainerStatus> =
        old_statuses.iter().map(|s| (s.name.as_str(), s)).collect();
    let mut out: Vec<ContainerStatus> = Vec::with_capacity(specs.len());
    for spec in specs {
        let spec_image = spec.image.clone().unwrap_or_default();
        let old = old_by_name.get(spec.name.as_str()).copied();
        let insts = instances(input.runtime, &spec.name);

        // Default: waiting, with values carried over from the old status.
        let mut status = ContainerStatus {
            name: spec.name.clone(),
            image: spec_image.clone(),
            state: Some(waiting(default_reason, None)),
            ..Default::default()
        };
        if let Some(old) = old {
            if state_is_terminated(old.state.as_ref()) {
                status = old.clone();
            } else {
                status.restart_count = old.restart_count;
                status.last_state = old.last_state.clone();
            }
        }

        if insts.is_empty() {
            // Seen running before, gone now: show that it stopped rather than "never ran".
            if let Some(old) = old {
                let default_waiting = waiting_reason(status.state.as_ref()) == Some(default_reason);
                if !state_is_terminated(old.state.as_ref())
                    && state_is_running(old.state.as_ref())
                    && default_waiting
                    && !state_is_terminated(status.last_state.as_ref())
                {
                    status.last_state = Some(ContainerState {
                        terminated: Some(ContainerStateTerminated {
                            exit_code: 137,
                            reason: Some(REASON_CONTAINER_STATUS_UNKNOWN.to_string()),
                            message: Some(MESSAGE_LOST_WHILE_RUNNING.to_string()),
                            ..Default::default()
                        }),
                        ..Default::default()
                    });
                    if !podutil::is_deleted(input.pod) {
                        status.restart_count = status.restart_count.saturating_add(1);
                    }
                }
            }
        } else {
            let newest = convert_instance(insts[0], &spec_image, input.runtime_name, old);
            let previous = insts
                .get(1)
                .map(|p| convert_instance(p, &spec_image, input.runtime_name, None));
            // Only the newest instance remains (older ones were removed): keep the last
            // termination we knew of, which is the old state if that was another instance's.
            let carried = match old {
                Some(o)
                    if state_is_terminated(o.state.as_ref())
                        && o.container_id != newest.container_id =>
                {
                    o.state.clone()
                }
                Some(o) => o.last_state.clone(),
                None => None,
            };
            status = newest;
            status.last_state = match previous {
                Some(p) => p.state,
                None => carried,
            };
        }

        // A container that will be restarted and whose last start failed shows why.
        let newest_rt = insts.first().copied();
        let init_done = is_init
            && !podutil::is_sidecar(spec)
            && newest_rt
                .is_some_and(|c| c.state == runtime::ContainerState::Exited && c.exit_code == 0);
        if !init_done
            && should_restart(spec, input.pod, newest_rt, is_init)
            && let Some((reason, message)) = input.waiting_reasons.get(&spec.name)
        {
            if state_is_terminated(status.state.as_ref()) {
                status.last_state = status.state.take();
            }
            status.state = Some(waiting(reason, non_empty(message)));
        }
        out.push(status);
    }
    if !is_init {
        out.sort_by(|a, b| a.name.cmp(&b.name));
    }
    out
}

/// The probe manager's `UpdatePodStatus`: `started` and `ready` from probe results.
fn apply_probe_results(
    input: &StatusInput<'_>,
    init_specs: &[Container],
    init_statuses: &mut [ContainerStatus],
    _specs: &[Container],
    statuses: &mut [ContainerStatus],
) {
    let probe = |status: &ContainerStatus, t: ProbeType| -> Option<ProbeResult> {
        let id = status.container_id.as_deref().map(strip_container_id)?;
        (input.probe_result)(id, t)
    };
    let started_and_ready = |status: &ContainerStatus| -> (bool, bool) {
        let running = state_is_running(status.state.as_ref());
        let started = running
            && matches!(
                probe(status, ProbeType::Startup),
                None | Some(ProbeResult::Success)
            );
        let ready = started
            && matches!(
                probe(status, ProbeType::Readiness),
                None | Some(ProbeResult::Success)
            );
        (started, ready)
    };
    for status in statuses.iter_mut() {
        let (started, ready) = started_and_ready(status);
        status.started = Some(started);
        status.ready = ready;
    }
    for (status, spec) in init_statuses.iter_mut().zip(init_specs) {
        if podutil::is_sidecar(spec) {
            let (started, ready) = started_and_ready(status);
            status.started = Some(started);
            status.ready = ready;
        } else {
            status.started = Some(state_is_running(status.state.as_ref()));
            status.ready = status
                .state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .is_some_and(|t| t.exit_code == 0);
        }
    }
}

fn find<'a>(statuses: &'a [ContainerStatus], name: &str) -> Option<&'a ContainerStatus> {
    statuses.iter().find(|s| s.name == name)
}

fn last_terminated(s: &ContainerStatus) -> Option<&ContainerStateTerminated> {
    s.last_state.as_ref().and_then(|l| l.terminated.as_ref())
}

/// `HasAnyRegularContainerStarted`: a regular container is running or has terminated.
pub fn has_any_regular_container_started(pod: &Pod, statuses: &[ContainerStatus]) -> bool {
    podutil::containers(pod).iter().any(|c| {
        find(statuses, &c.name).is_some_and(|s| {
            state_is_running(s.state.as_ref()) || state_is_terminated(s.state.as_ref())
        })
    })
}

/// The pod phase (the kubelet's `getPhase`, section 3.7).
///
/// `init_statuses` and `statuses` are the init (sidecars included) and regular container
/// statuses; `pod_is_terminal` says the agent terminated the pod and no container runs, in which
/// case a non-static pod whose containers all stopped is `Succeeded` or `Failed` regardless of
/// its restart policy.
pub fn get_phase(
    pod: &Pod,
    init_statuses: &[ContainerStatus],
    statuses: &[ContainerStatus],
    pod_is_terminal: bool,
) -> PodPhase {
    let policy = podutil::restart_policy(pod);
    let mut pending_init = 0usize;
    let mut failed_init = 0usize;
    let (mut unknown, mut running, mut waiting_n, mut stopped, mut succeeded) =
        (0usize, 0usize, 0usize, 0usize, 0usize);

    for c in podutil::init_containers(pod) {
        let Some(s) = find(init_statuses, &c.name) else {
            if podutil::is_sidecar(c) {
                unknown += 1;
            } else {
                pending_init += 1;
            }
            continue;
        };
        let st = s.state.as_ref();
        if podutil::is_sidecar(c) {
            if state_is_running(st) {
                if s.started != Some(true) {
                    pending_init += 1;
                }
                running += 1;
            } else if state_is_terminated(st) {
                // Terminated sidecars are ignored.
            } else if state_is_waiting(st) {
                if last_terminated(s).is_none() {
                    pending_init += 1;
                    waiting_n += 1;
                }
            } else {
                pending_init += 1;
                unknown += 1;
            }
        } else if state_is_running(st) {
            pending_init += 1;
        } else if let Some(t) = st.and_then(|s| s.terminated.as_ref()) {
            if t.exit_code != 0 {
                failed_init += 1;
            }
        } else if state_is_waiting(st) {
            match last_terminated(s) {
                Some(t) if t.exit_code != 0 => failed_init += 1,
                Some(_) => {}
                None => pending_init += 1,
            }
        } else {
            pending_init += 1;
        }
    }

    for c in podutil::containers(pod) {
        let Some(s) = find(statuses, &c.name) else {
            unknown += 1;
            continue;
        };
        let st = s.state.as_ref();
        if state_is_running(st) {
            running += 1;
        } else if let Some(t) = st.and_then(|s| s.terminated.as_ref()) {
            stopped += 1;
            if t.exit_code == 0 {
                succeeded += 1;
            }
        } else if state_is_waiting(st) {
            if last_terminated(s).is_some() {
                stopped += 1;
            } else {
                waiting_n += 1;
            }
        } else {
            unknown += 1;
        }
    }

    if failed_init > 0 && policy == RestartPolicy::Never {
        return PodPhase::Failed;
    }
    if pending_init > 0 && !has_any_regular_container_started(pod, statuses) {
        return PodPhase::Pending;
    }
    if waiting_n > 0 {
        return PodPhase::Pending;
    }
    if running > 0 && unknown == 0 {
        return PodPhase::Running;
    }
    if running == 0 && stopped > 0 && unknown == 0 {
        if pod_is_terminal && !podutil::is_static(pod) {
            return if stopped == succeeded {
                PodPhase::Succeeded
            } else {
                PodPhase::Failed
            };
        }
        if policy == RestartPolicy::Always {
            return PodPhase::Running;
        }
        if stopped == succeeded {
            return PodPhase::Succeeded;
        }
        if policy == RestartPolicy::Never {
            return PodPhase::Failed;
        }
        return PodPhase::Running;
    }
    PodPhase::Pending
}

fn condition(type_: &str, ok: bool, reason: Option<&str>, message: Option<String>) -> PodCondition {
    PodCondition {
        type_: type_.to_string(),
        status: if ok { "True" } else { "False" }.to_string(),
        reason: reason.map(str::to_string),
        message,
        ..Default::default()
    }
}

/// Go's `fmt.Sprintf("%s", []string{...})`: `[a b]`.
fn go_list(names: &[&str]) -> String {
    format!("[{}]", names.join(" "))
}

/// The `Initialized` condition (`GeneratePodInitializedCondition`).
pub fn initialized_condition(
    pod: &Pod,
    init_statuses: &[ContainerStatus],
    statuses: &[ContainerStatus],
    phase: &str,
) -> PodCondition {
    let mut unknown = Vec::new();
    let mut incomplete = Vec::new();
    for c in podutil::init_containers(pod) {
        let Some(s) = find(init_statuses, &c.name) else {
            unknown.push(c.name.as_str());
            continue;
        };
        let done = if podutil::is_sidecar(c) {
            s.started == Some(true)
        } else {
            s.ready
        };
        if !done {
            incomplete.push(c.name.as_str());
        }
    }
    if phase == PodPhase::Succeeded.as_str() && unknown.is_empty() {
        return condition(COND_INITIALIZED, true, Some("PodCompleted"), None);
    }
    if has_any_regular_container_started(pod, statuses) {
        return condition(COND_INITIALIZED, true, None, None);
    }
    let mut msgs = Vec::new();
    if !unknown.is_empty() {
        msgs.push(format!(
            "containers with unknown status: {}",
            go_list(&unknown)
        ));
    }
    if !incomplete.is_empty() {
        msgs.push(format!(
            "containers with incomplete status: {}",
            go_list(&incomplete)
        ));
    }
    if msgs.is_empty() {
        condition(COND_INITIALIZED, true, None, None)
    } else {
        condition(
            COND_INITIALIZED,
            false,
            Some("ContainersNotInitialized"),
            Some(msgs.join(", ")),
        )
    }
}

/// `ContainersReady` for a terminal phase: False with `PodCompleted` / `PodFailed`.
pub fn terminal_containers_ready_condition(phase: &str) -> PodCondition {
    let reason = if phase == PodPhase::Succeeded.as_str() {
        "PodCompleted"
    } else {
        "PodFailed"
    };
    condition(COND_CONTAINERS_READY, false, Some(reason), None)
}

/// The `ContainersReady` condition (`GenerateContainersReadyCondition`).
pub fn containers_ready_condition(
    pod: &Pod,
    init_statuses: &[ContainerStatus],
    statuses: &[ContainerStatus],
    phase: &str,
) -> PodCondition {
    let mut unknown = Vec::new();
    let mut unready = Vec::new();
    for c in podutil::init_containers(pod)
        .iter()
        .filter(|c| podutil::is_sidecar(c))
    {
        match find(init_statuses, &c.name) {
            Some(s) if !s.ready => unready.push(c.name.as_str()),
            Some(_) => {}
            None => unknown.push(c.name.as_str()),
        }
    }
    for c in podutil::containers(pod) {
        match find(statuses, &c.name) {
            Some(s) if !s.ready => unready.push(c.name.as_str()),
            Some(_) => {}
            None => unknown.push(c.name.as_str()),
        }
    }
    if (phase == PodPhase::Succeeded.as_str() && unknown.is_empty())
        || phase == PodPhase::Failed.as_str()
    {
        return terminal_containers_ready_condition(phase);
    }
    let mut msgs = Vec::new();
    if !unknown.is_empty() {
        msgs.push(format!(
            "containers with unknown status: {}",
            go_list(&unknown)
        ));
    }
    if !unready.is_empty() {
        msgs.push(format!(
            "containers with unready status: {}",
            go_list(&unready)
        ));
    }
    if msgs.is_empty() {
        condition(COND_CONTAINERS_READY, true, None, None)
    } else {
        condition(
            COND_CONTAINERS_READY,
            false,
            Some("ContainersNotReady"),
            Some(msgs.join(", ")),
        )
    }
}

/// The `Ready` condition (`GeneratePodReadyCondition`): a copy of `ContainersReady` unless that
/// is True; then every readiness gate must have a True condition in `conditions`.
pub fn ready_condition(
    pod: &Pod,
    conditions: &[PodCondition],
    containers_ready: &PodCondition,
) -> PodCondition {
    if containers_ready.status != "True" {
        return PodCondition {
            type_: COND_READY.to_string(),
            status: containers_ready.status.clone(),
            reason: containers_ready.reason.clone(),
            message: containers_ready.message.clone(),
            ..Default::default()
        };
    }
    let mut msgs = Vec::new();
    let gates = pod
        .spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_deref())
        .unwrap_or(&[]);
    for gate in gates {
        match conditions.iter().find(|c| c.type_ == gate.condition_type) {
            None => msgs.push(format!(
                "corresponding condition of pod readiness gate \"{}\" does not exist.",
                gate.condition_type
            )),
            Some(c) if c.status != "True" => msgs.push(format!(
                "the status of pod readiness gate \"{}\" is not \"True\", but {}",
                gate.condition_type, c.status
            )),
            Some(_) => {}
        }
    }
    if msgs.is_empty() {
        condition(COND_READY, true, None, None)
    } else {
        condition(
            COND_READY,
            false,
            Some("ReadinessGatesNotReady"),
            Some(msgs.join(", ")),
        )
    }
}

/// Set `cond.last_transition_time`: the old condition's when its status is unchanged, else `now`.
pub fn set_last_transition_time(cond: &mut PodCondition, old: Option<&PodStatus>, now: Timestamp) {
    let prev = old
        .and_then(|o| o.conditions.as_deref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == cond.type_));
    cond.last_transition_time = match prev {
        Some(p) if p.status == cond.status && p.last_transition_time.is_some() => {
            p.last_transition_time.clone()
        }
        _ => Some(Time(now)),
    };
}

fn generate_conditions(
    input: &StatusInput<'_>,
    old: Option<&PodStatus>,
    init_statuses: &[ContainerStatus],
    statuses: &[ContainerStatus],
    phase: &str,
) -> Vec<PodCondition> {
    let pod = input.pod;
    let mut conditions: Vec<PodCondition> = Vec::new();
    // Conditions owned by others: the API copy's, then the ones the agent set (DisruptionTarget).
    let sources = [
        pod.status.as_ref().and_then(|s| s.conditions.as_deref()),
        input.old.and_then(|s| s.conditions.as_deref()),
    ];
    for c in sources.into_iter().flatten().flatten() {
        if is_kubelet_condition(&c.type_) {
            continue;
        }
        match conditions.iter_mut().find(|x| x.type_ == c.type_) {
            Some(existing) => *existing = c.clone(),
            None => conditions.push(c.clone()),
        }
    }
    let mut owned = Vec::with_capacity(5);
    owned.push(condition(
        COND_READY_TO_START,
        input.sandbox_ready,
        None,
        None,
    ));
    owned.push(initialized_condition(pod, init_statuses, statuses, phase));
    let containers_ready = containers_ready_condition(pod, init_statuses, statuses, phase);
    owned.push(ready_condition(pod, &conditions, &containers_ready));
    owned.push(containers_ready);
    owned.push(condition(COND_POD_SCHEDULED, true, None, None));
    for mut c in owned {
        set_last_transition_time(&mut c, old, input.now);
        conditions.push(c);
    }
    conditions
}

// ---------------------------------------------------------------------------------------------
// QoS class

fn quantity_nanos(q: &Quantity) -> Option<i128> {
    crate::quantity::parse_nanos(&q.0)
}

/// The state of a container that could not be located when the pod was terminated: terminated,
/// exit code 137, reason `ContainerStatusUnknown`.
pub(crate) fn lost_container_state() -> ContainerState {
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: 137,
            reason: Some(REASON_CONTAINER_STATUS_UNKNOWN.to_string()),
            message: Some(MESSAGE_LOST_ON_TERMINATION.to_string()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The pod's QoS class (`GetPodQOS`): `Guaranteed`, `Burstable` or `BestEffort`, from the cpu and
/// memory requests and limits of all containers (init containers included). A missing request
/// defaults to the limit, as API defaulting does.
pub fn qos_class(pod: &Pod) -> QosClass {
    let mut requests: BTreeMap<&str, i128> = BTreeMap::new();
    let mut limits: BTreeMap<&str, i128> = BTreeMap::new();
    let mut guaranteed = true;
    let all = podutil::init_containers(pod)
        .iter()
        .chain(podutil::containers(pod));
    for c in all {
        let res = c.resources.as_ref();
        let lim = res.and_then(|r| r.limits.as_ref());
        let req = res.and_then(|r| r.requests.as_ref());
        let mut found_limits = 0;
        for name in ["cpu", "memory"] {
            let l = lim.and_then(|m| m.get(name)).and_then(quantity_nanos);
            let r = req.and_then(|m| m.get(name)).and_then(quantity_nanos).or(l);
            if let Some(r) = r.filter(|r| *r > 0) {
                *requests.entry(name).or_insert(0) += r;
            }
            if let Some(l) = l.filter(|l| *l > 0) {
                *limits.entry(name).or_insert(0) += l;
                found_limits += 1;
            }
        }
        if found_limits < 2 {
            guaranteed = false;
        }
    }
    if requests.is_empty() && limits.is_empty() {
        return QosClass::BestEffort;
    }
    if guaranteed
        && requests.iter().all(|(k, v)| limits.get(k) == Some(v))
        && requests.len() == limits.len()
    {
        return QosClass::Guaranteed;
    }
    QosClass::Burstable
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodReadinessGate, PodSpec, ResourceRequirements};

    fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).expect("valid timestamp")
    }

    fn container(name: &str) -> Container {
        Container {
            name: name.into(),
            image: Some(format!("img-{name}")),
            ..Default::default()
        }
    }

    fn sidecar(name: &str) -> Container {
        Container {
            restart_policy: Some("Always".into()),
            ..container(name)
        }
    }

    fn pod(policy: &str, inits: Vec<Container>, containers: &[&str]) -> Pod {
        Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                uid: Some("uid-1".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                restart_policy: Some(policy.into()),
                init_containers: (!inits.is_empty()).then_some(inits),
                containers: containers.iter().map(|n| container(n)).collect(),
                ..Default::default()
            }),
            status: None,
        }
    }

    // --- API container statuses for the phase matrix -----------------------------------------

    fn running(name: &str, started: bool) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            state: Some(ContainerState {
                running: Some(ContainerStateRunning::default()),
                ..Default::default()
            }),
            started: Some(started),
            ..Default::default()
        }
    }

    fn terminated_state(code: i32) -> ContainerState {
        ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: code,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn exited(name: &str, code: i32) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            state: Some(terminated_state(code)),
            ready: code == 0,
            ..Default::default()
        }
    }

    fn waiting_status(name: &str, last_exit: Option<i32>) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            state: Some(waiting("CrashLoopBackOff", None)),
            last_state: last_exit.map(terminated_state),
            ..Default::default()
        }
    }

    #[test]
    fn phase_matrix_follows_get_phase() {
        let no_init: Vec<Container> = vec![];
        struct Case {
            name: &'static str,
            policy: &'static str,
            inits: Vec<Container>,
            init_statuses: Vec<ContainerStatus>,
            statuses: Vec<ContainerStatus>,
            terminal: bool,
            want: &'static str,
        }
        let c =
            |name, policy, inits: Vec<Container>, init_statuses, statuses, terminal, want| Case {
                name,
                policy,
                inits,
                init_statuses,
                statuses,
                terminal,
                want,
            };
        let cases = vec![
            c(
                "always exit 0 restarts",
                "Always",
                no_init.clone(),
                vec![],
                vec![exited("a", 0)],
                false,
                PodPhase::Running.as_str(),
            ),
            c(
                "always exit 1 restarts",
                "Always",
                no_init.clone(),
                vec![],
                vec![exited("a", 1)],
                false,
                PodPhase::Running.as_str(),
            ),
            c(
                "onfailure exit 0 succeeds",
                "OnFailure",
                no_init.clone(),
                vec![],
                vec![exited("a", 0)],
                false,
                PodPhase::Succeeded.as_str(),
            ),
            c(
                "onfailure exit 1 restarts",
                "OnFailure",
                no_init.clone(),
                vec![],
                vec![exited("a", 1)],
                false,
                PodPhase::Running.as_str(),
            ),
            c(
                "never exit 0 succeeds",
                "Never",
                no_init.clone(),
                vec![],
                vec![exited("a", 0)],
                false,
                PodPhase::Succeeded.as_str(),
            ),
            c(
                "never exit 1 fails",
                "Never",
                no_init.clone(),
                vec![],
                vec![exited("a", 1)],
                false,
                PodPhase::Failed.as_str(),
            ),
            c(
                "never mixed fails",
                "Never",
                no_init.clone(),
                vec![],
                vec![exited("a", 0), exited("b", 137)],
                false,
                PodPhase::Failed.as_str(),
            ),
            c(
                "one running one exited runs",
                "Never",
                no_init.clone(),
                vec![],
                vec![running("a", true), exited("b", 0)],
                false,
                PodPhase::Running.as_str(),
            ),
            c(
                "terminal always all 0 succeeds",
                "Always",
                no_init.clone(),
                vec![],
                vec![exited("a", 0)],
                true,
                PodPhase::Succeeded.as_str(),
            ),
            c(
                "terminal always 137 fails",
                "Always",
                no_init.clone(),
                vec![],
                vec![exited("a", 137)],
                true,
                PodPhase::Failed.as_str(),
            ),
            c(
                "crashloop with last state counts as stopped",
                "Always",
                no_init.clone(),
                vec![],
                vec![waiting_status("a", Some(1))],
                false,
                PodPhase::Running.as_str(),
            ),
            c(
                "waiting first time is pending",
                "Always",
                no_init.clone(),
                vec![],
                vec![waiting_status("a", None)],
                false,
                PodPhase::Pending.as_str(),
            ),
            c(
                "unknown container is pending",
                "Always",
                no_init.clone(),
                vec![],
                vec![],
                false,
                PodPhase::Pending.as_str(),
            ),
            c(
                "init without status is pending",
                "Always",
                vec![container("i")],
                vec![],
                vec![waiting_status("a", None)],
                false,
                PodPhase::Pending.as_str(),
            ),
            c(
                "init running is pending",
                "Always",
                vec![container("i")],
                vec![running("i", true)],
                vec![waiting_status("a", None)],
                false,
                PodPhase::Pending.as_str(),
            ),
            c(
                "init failed with never fails",
                "Never",
                vec![container("i")],
                vec![exited("i", 1)],
                vec![waiting_status("a", None)],
                false,
                PodPhase::Failed.as_str(),
            ),
            c(
                "init failed with onfailure stays pending",
                "OnFailure",
                vec![container("i")],
                vec![waiting_status("i", Some(1))],
                vec![waiting_status("a", None)],
                false,
                PodPhase::Pending.as_str(),
            ),
            c(
                "init done main running",
                "Always",
                vec![container("i")],
                vec![exited("i", 0)],
                vec![running("a", true)],
                false,
                PodPhase::Running.as_str(),
            ),
            c(
                "sidecar running not started is pending",
                "Always",
                vec![sidecar("s")],
                vec![running("s", false)],
                vec![waiting_status("a", None)],
                false,
                PodPhase::Pending.as_str(),
            ),
            c(
                "sidecar started main running",
                "Always",
                vec![sidecar("s")],
                vec![running("s", true)],
                vec![running("a", true)],
                false,
                PodPhase::Running.as_str(),
            ),
            c(
                "sidecar restarting after init keeps running",
                "Always",
                vec![sidecar("s")],
                vec![running("s", false)],
                vec![running("a", true)],
                false,
                PodPhase::Running.as_str(),
            ),
            c(
                "terminated sidecar ignored for completion",
                "Never",
                vec![sidecar("s")],
                vec![exited("s", 143)],
                vec![exited("a", 0)],
                false,
                PodPhase::Succeeded.as_str(),
            ),
            c(
                "running sidecar with finished main",
                "Never",
                vec![sidecar("s")],
                vec![running("s", true)],
                vec![exited("a", 0)],
                false,
                PodPhase::Running.as_str(),
            ),
            c(
                "sidecar without status is unknown",
                "Never",
                vec![sidecar("s")],
                vec![],
                vec![exited("a", 0)],
                false,
                PodPhase::Pending.as_str(),
            ),
        ];
        for case in cases {
            let mut p = pod(case.policy, case.inits, &[]);
            if let Some(spec) = p.spec.as_mut() {
                let names: Vec<String> = if case.statuses.is_empty() {
                    vec!["a".into()]
                } else {
                    case.statuses.iter().map(|s| s.name.clone()).collect()
                };
                spec.containers = names.iter().map(|n| container(n)).collect();
            }
            let got = get_phase(&p, &case.init_statuses, &case.statuses, case.terminal);
            assert_eq!(got.as_str(), case.want, "case {:?}", case.name);
        }
    }

    #[test]
    fn static_pods_are_not_forced_terminal() {
        let mut p = pod("Always", vec![], &["a"]);
        p.metadata.annotations = Some(
            [(
                kubelet_api::annotations::CONFIG_SOURCE.to_string(),
                "file".to_string(),
            )]
            .into(),
        );
        assert_eq!(
            get_phase(&p, &[], &[exited("a", 0)], true),
            PodPhase::Running
        );
    }

    // --- full generation ------------------------------------------------------------------

    fn rc(
        name: &str,
        id: &str,
        state: runtime::ContainerState,
        exit: i32,
        created: i64,
        attempt: u32,
    ) -> runtime::ContainerStatus {
        let mut annotations = runtime::Labels::new();
        annotations.insert(labels::CONTAINER_RESTART_COUNT.into(), attempt.to_string());
        runtime::ContainerStatus {
            id: id.into(),
            metadata: runtime::ContainerMetadata {
                name: name.into(),
                attempt,
            },
            state,
            created_at: ts(created),
            started_at: Some(ts(created + 1)),
            finished_at: (state == runtime::ContainerState::Exited).then(|| ts(created + 5)),
            exit_code: exit,
            image: format!("img-{name}"),
            image_ref: format!("sha256:{name}"),
            reason: match (state, exit) {
                (runtime::ContainerState::Exited, 0) => "Completed".into(),
                (runtime::ContainerState::Exited, _) => "Error".into(),
                _ => String::new(),
            },
            annotations,
            ..Default::default()
        }
    }

    fn rt(containers: Vec<runtime::ContainerStatus>) -> PodRuntimeStatus {
        PodRuntimeStatus {
            uid: "uid-1".into(),
            name: "web".into(),
            namespace: "default".into(),
            ips: vec!["10.1.0.5".into()],
            container_statuses: containers,
            ..Default::default()
        }
    }

    struct Gen<'a> {
        pod: &'a Pod,
        rt: PodRuntimeStatus,
        old: Option<PodStatus>,
        reasons: HashMap<String, (String, String)>,
        probes: HashMap<(String, ProbeType), ProbeResult>,
        terminal: bool,
        now: Timestamp,
    }

    impl<'a> Gen<'a> {
        fn new(pod: &'a Pod, rt: PodRuntimeStatus) -> Self {
            Self {
                pod,
                rt,
                old: None,
                reasons: HashMap::new(),
                probes: HashMap::new(),
                terminal: false,
                now: ts(100),
            }
        }
        fn run(&self) -> PodStatus {
            let probe = |id: &str, t: ProbeType| self.probes.get(&(id.to_string(), t)).copied();
            generate_pod_status(&StatusInput {
                pod: self.pod,
                runtime: &self.rt,
                old: self.old.as_ref(),
                runtime_name: "process",
                waiting_reasons: &self.reasons,
                probe_result: &probe,
                sandbox_ready: true,
                pod_is_terminal: self.terminal,
                host_ip: Some("192.168.1.10"),
                now: self.now,
            })
        }
    }

    fn cs<'s>(s: &'s PodStatus, name: &str) -> &'s ContainerStatus {
        s.container_statuses
            .iter()
            .chain(s.init_container_statuses.iter())
            .flatten()
            .find(|c| c.name == name)
            .expect("container status present")
    }

    fn cond<'s>(s: &'s PodStatus, t: &str) -> &'s PodCondition {
        s.conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == t)
            .expect("condition present")
    }

    use runtime::ContainerState::{Created, Exited, Running, Unknown};

    #[test]
    fn running_container_without_probes_is_started_and_ready() {
        let p = pod("Always", vec![], &["b", "a"]);
        let g = Gen::new(
            &p,
            rt(vec![
                rc("a", "ida", Running, 0, 0, 0),
                rc("b", "idb", Running, 0, 0, 0),
            ]),
        );
        let s = g.run();
        assert_eq!(s.phase.as_deref(), Some(PodPhase::Running.as_str()));
        let names: Vec<_> = s
            .container_statuses
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(names, ["a", "b"], "regular statuses are sorted by name");
        let a = cs(&s, "a");
        assert_eq!(a.container_id.as_deref(), Some("process://ida"));
        assert_eq!(a.image, "img-a");
        assert_eq!(a.image_id, "sha256:a");
        assert!(a.ready);
        assert_eq!(a.started, Some(true));
        let started_at = a
            .state
            .as_ref()
            .and_then(|s| s.running.as_ref())
            .and_then(|r| r.started_at.clone());
        assert_eq!(started_at, Some(Time(ts(1))));
        assert_eq!(cond(&s, COND_READY).status, "True");
        assert_eq!(cond(&s, COND_CONTAINERS_READY).status, "True");
        assert_eq!(cond(&s, COND_INITIALIZED).status, "True");
        assert_eq!(cond(&s, COND_READY_TO_START).status, "True");
        assert_eq!(cond(&s, COND_POD_SCHEDULED).status, "True");
        assert_eq!(s.pod_ip.as_deref(), Some("10.1.0.5"));
        assert_eq!(s.host_ip.as_deref(), Some("192.168.1.10"));
        assert_eq!(s.start_time, Some(Time(ts(100))));
        assert_eq!(s.qos_class.as_deref(), Some("BestEffort"));
    }

    #[test]
    fn host_network_pod_has_the_node_address_whatever_the_runtime_reports() {
        let mut p = pod("Always", vec![], &["a"]);
        p.spec.as_mut().expect("spec").host_network = Some(true);
        // The runtime reports the host's address as it sees it; the node's configured address wins.
        let s = Gen::new(&p, rt(vec![rc("a", "ida", Running, 0, 0, 0)])).run();
        assert_eq!(s.pod_ip.as_deref(), Some("192.168.1.10"));
        let ips: Vec<_> = s.pod_ips.iter().flatten().map(|i| i.ip.as_str()).collect();
        assert_eq!(ips, ["192.168.1.10"]);
        // Before the sandbox exists (no runtime IPs) the address is already the node's.
        let mut empty = rt(vec![]);
        empty.ips.clear();
        let s = Gen::new(&p, empty).run();
        assert_eq!(s.pod_ip.as_deref(), Some("192.168.1.10"));
    }

    #[test]
    fn readiness_follows_probe_results() {
        let p = pod("Always", vec![], &["a"]);
        let mut g = Gen::new(&p, rt(vec![rc("a", "ida", Running, 0, 0, 0)]));
        g.probes
            .insert(("ida".into(), ProbeType::Readiness), ProbeResult::Unknown);
        let s = g.run();
        assert!(!cs(&s, "a").ready, "a probe without result is not ready");
        let c = cond(&s, COND_CONTAINERS_READY);
        assert_eq!(c.status, "False");
        assert_eq!(c.reason.as_deref(), Some("ContainersNotReady"));
        assert_eq!(
            c.message.as_deref(),
            Some("containers with unready status: [a]")
        );
        let r = cond(&s, COND_READY);
        assert_eq!(r.reason.as_deref(), Some("ContainersNotReady"));

        g.probes
            .insert(("ida".into(), ProbeType::Readiness), ProbeResult::Success);
        assert!(cs(&g.run(), "a").ready);
        g.probes
            .insert(("ida".into(), ProbeType::Readiness), ProbeResult::Failure);
        assert!(!cs(&g.run(), "a").ready);
    }

    #[test]
    fn startup_probe_gates_started_and_ready() {
        let p = pod("Always", vec![], &["a"]);
        let mut g = Gen::new(&p, rt(vec![rc("a", "ida", Running, 0, 0, 0)]));
        g.probes
            .insert(("ida".into(), ProbeType::Startup), ProbeResult::Unknown);
        let s = g.run();
        assert_eq!(cs(&s, "a").started, Some(false));
        assert!(!cs(&s, "a").ready);
        g.probes
            .insert(("ida".into(), ProbeType::Startup), ProbeResult::Success);
        let s = g.run();
        assert_eq!(cs(&s, "a").started, Some(true));
        assert!(cs(&s, "a").ready);
    }

    #[test]
    fn never_created_containers_wait_creating_or_initializing() {
        let p = pod("Always", vec![], &["a"]);
        let s = Gen::new(&p, rt(vec![])).run();
        assert_eq!(
            waiting_reason(cs(&s, "a").state.as_ref()),
            Some(REASON_CONTAINER_CREATING)
        );
        assert_eq!(s.phase.as_deref(), Some(PodPhase::Pending.as_str()));

        let p = pod("Always", vec![container("init")], &["a"]);
        let s = Gen::new(&p, rt(vec![rc("init", "idi", Running, 0, 0, 0)])).run();
        assert_eq!(
            waiting_reason(cs(&s, "a").state.as_ref()),
            Some(REASON_POD_INITIALIZING)
        );
        assert_eq!(s.phase.as_deref(), Some(PodPhase::Pending.as_str()));
        let init = cond(&s, COND_INITIALIZED);
        assert_eq!(init.status, "False");
        assert_eq!(init.reason.as_deref(), Some("ContainersNotInitialized"));
        assert_eq!(
            init.message.as_deref(),
            Some("containers with incomplete status: [init]")
        );
        assert_eq!(
            cond(&s, COND_CONTAINERS_READY).message.as_deref(),
            Some("containers with unready status: [a]")
        );
    }

    #[test]
    fn completed_init_container_is_ready_and_pod_initialized() {
        let p = pod("Always", vec![container("i1"), container("i2")], &["a"]);
        let s = Gen::new(
            &p,
            rt(vec![
                rc("i1", "id1", Exited, 0, 0, 0),
                rc("i2", "id2", Exited, 0, 10, 0),
                rc("a", "ida", Running, 0, 20, 0),
            ]),
        )
        .run();
        let names: Vec<_> = s
            .init_container_statuses
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(names, ["i1", "i2"], "init statuses keep spec order");
        assert!(cs(&s, "i1").ready);
        assert_eq!(cs(&s, "i1").started, Some(false));
        assert_eq!(cond(&s, COND_INITIALIZED).status, "True");
        assert_eq!(s.phase.as_deref(), Some(PodPhase::Running.as_str()));
    }

    #[test]
    fn restart_after_kill_reports_restart_count_and_last_state() {
        let p = pod("Always", vec![], &["a"]);
        let s = Gen::new(
            &p,
            rt(vec![
                rc("a", "new", Running, 0, 30, 1),
                rc("a", "old", Exited, 137, 0, 0),
            ]),
        )
        .run();
        let a = cs(&s, "a");
        assert_eq!(a.restart_count, 1);
        assert_eq!(a.container_id.as_deref(), Some("process://new"));
        let last = a
            .last_state
            .as_ref()
            .and_then(|l| l.terminated.as_ref())
            .expect("last state terminated");
        assert_eq!(last.exit_code, 137);
        assert_eq!(last.container_id.as_deref(), Some("process://old"));
        assert_eq!(last.finished_at, Some(Time(ts(5))));
    }

    #[test]
    fn last_state_is_carried_over_when_old_instance_was_removed() {
        let p = pod("Always", vec![], &["a"]);
        let mut g = Gen::new(&p, rt(vec![rc("a", "old", Exited, 1, 0, 0)]));
        let first = g.run();
        assert!(state_is_terminated(cs(&first, "a").state.as_ref()));
        g.old = Some(first);
        g.rt = rt(vec![rc("a", "new", Running, 0, 30, 1)]);
        let s = g.run();
        let last = cs(&s, "a")
            .last_state
            .as_ref()
            .and_then(|l| l.terminated.as_ref())
            .expect("carried over");
        assert_eq!(last.exit_code, 1);
        assert_eq!(last.container_id.as_deref(), Some("process://old"));
    }

    #[test]
    fn crashloop_backoff_shows_waiting_with_last_state() {
        let p = pod("Always", vec![], &["a"]);
        let mut g = Gen::new(&p, rt(vec![rc("a", "ida", Exited, 2, 0, 3)]));
        // Without a recorded reason the exited container shows terminated.
        let s = g.run();
        assert!(state_is_terminated(cs(&s, "a").state.as_ref()));
        g.reasons.insert(
            "a".into(),
            (
                "CrashLoopBackOff".into(),
                "back-off 40s restarting failed container=a pod=web_default(uid-1)".into(),
            ),
        );
        let s = g.run();
        let a = cs(&s, "a");
        let w = a
            .state
            .as_ref()
            .and_then(|s| s.waiting.as_ref())
            .expect("waiting");
        assert_eq!(w.reason.as_deref(), Some("CrashLoopBackOff"));
        assert_eq!(
            w.message.as_deref(),
            Some("back-off 40s restarting failed container=a pod=web_default(uid-1)")
        );
        assert_eq!(
            a.last_state
                .as_ref()
                .and_then(|l| l.terminated.as_ref())
                .map(|t| t.exit_code),
            Some(2)
        );
        assert_eq!(a.restart_count, 3);
        assert_eq!(s.phase.as_deref(), Some(PodPhase::Running.as_str()));
    }

    #[test]
    fn waiting_reason_is_ignored_when_container_will_not_restart() {
        let p = pod("Never", vec![], &["a"]);
        let mut g = Gen::new(&p, rt(vec![rc("a", "ida", Exited, 2, 0, 0)]));
        g.reasons
            .insert("a".into(), ("CrashLoopBackOff".into(), String::new()));
        let s = g.run();
        assert!(state_is_terminated(cs(&s, "a").state.as_ref()));
        assert_eq!(s.phase.as_deref(), Some(PodPhase::Failed.as_str()));
        let c = cond(&s, COND_CONTAINERS_READY);
        assert_eq!(c.reason.as_deref(), Some("PodFailed"));
        assert_eq!(cond(&s, COND_READY).reason.as_deref(), Some("PodFailed"));
    }

    #[test]
    fn image_pull_error_shows_waiting_reason_for_never_created_container() {
        let p = pod("Always", vec![], &["a"]);
        let mut g = Gen::new(&p, rt(vec![]));
        g.reasons.insert(
            "a".into(),
            ("ErrImagePull".into(), "pull access denied".into()),
        );
        let s = g.run();
        assert_eq!(
            waiting_reason(cs(&s, "a").state.as_ref()),
            Some("ErrImagePull")
        );
        assert!(cs(&s, "a").last_state.is_none());
        assert_eq!(s.phase.as_deref(), Some(PodPhase::Pending.as_str()));
    }

    #[test]
    fn vanished_running_container_is_reported_terminated_unknown() {
        let p = pod("Always", vec![], &["a"]);
        let mut g = Gen::new(&p, rt(vec![rc("a", "ida", Running, 0, 0, 0)]));
        g.old = Some(g.run());
        let mut lost = rc("a", "ida", Unknown, 0, 0, 0);
        lost.started_at = None;
        g.rt = rt(vec![lost]);
        let s = g.run();
        let a = cs(&s, "a");
        let t = a
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .expect("terminated");
        assert_eq!(t.exit_code, 137);
        assert_eq!(t.reason.as_deref(), Some(REASON_CONTAINER_STATUS_UNKNOWN));
        assert_eq!(a.restart_count, 1);
    }

    #[test]
    fn succeeded_pod_reports_completed_conditions() {
        let p = pod("Never", vec![container("i")], &["a"]);
        let s = Gen::new(
            &p,
            rt(vec![
                rc("i", "idi", Exited, 0, 0, 0),
                rc("a", "ida", Exited, 0, 10, 0),
            ]),
        )
        .run();
        assert_eq!(s.phase.as_deref(), Some(PodPhase::Succeeded.as_str()));
        let init = cond(&s, COND_INITIALIZED);
        assert_eq!(
            (init.status.as_str(), init.reason.as_deref()),
            ("True", Some("PodCompleted"))
        );
        let cr = cond(&s, COND_CONTAINERS_READY);
        assert_eq!(
            (cr.status.as_str(), cr.reason.as_deref()),
            ("False", Some("PodCompleted"))
        );
    }

    #[test]
    fn sidecar_is_ready_like_a_regular_container_and_gates_initialization() {
        let p = pod("Always", vec![sidecar("s")], &["a"]);
        let mut g = Gen::new(&p, rt(vec![rc("s", "ids", Running, 0, 0, 0)]));
        g.probes
            .insert(("ids".into(), ProbeType::Startup), ProbeResult::Unknown);
        let s = g.run();
        assert_eq!(cs(&s, "s").started, Some(false));
        assert_eq!(s.phase.as_deref(), Some(PodPhase::Pending.as_str()));
        assert_eq!(
            cond(&s, COND_INITIALIZED).message.as_deref(),
            Some("containers with incomplete status: [s]")
        );
        g.probes
            .insert(("ids".into(), ProbeType::Startup), ProbeResult::Success);
        g.rt = rt(vec![
            rc("s", "ids", Running, 0, 0, 0),
            rc("a", "ida", Running, 0, 10, 0),
        ]);
        let s = g.run();
        assert!(cs(&s, "s").ready);
        assert_eq!(cond(&s, COND_INITIALIZED).status, "True");
        assert_eq!(cond(&s, COND_CONTAINERS_READY).status, "True");
        assert_eq!(s.phase.as_deref(), Some(PodPhase::Running.as_str()));
    }

    #[test]
    fn last_transition_time_is_kept_while_status_unchanged() {
        let p = pod("Always", vec![], &["a"]);
        let mut g = Gen::new(&p, rt(vec![rc("a", "ida", Created, 0, 0, 0)]));
        g.now = ts(100);
        let first = g.run();
        assert_eq!(cond(&first, COND_READY).status, "False");
        g.old = Some(first);
        g.now = ts(200);
        let second = g.run();
        assert_eq!(
            cond(&second, COND_READY).last_transition_time,
            Some(Time(ts(100)))
        );
        assert_eq!(
            cond(&second, COND_POD_SCHEDULED).last_transition_time,
            Some(Time(ts(100)))
        );
        g.old = Some(second);
        g.rt = rt(vec![rc("a", "ida", Running, 0, 0, 0)]);
        g.now = ts(300);
        let third = g.run();
        assert_eq!(cond(&third, COND_READY).status, "True");
        assert_eq!(
            cond(&third, COND_READY).last_transition_time,
            Some(Time(ts(300)))
        );
        assert_eq!(
            cond(&third, COND_POD_SCHEDULED).last_transition_time,
            Some(Time(ts(100)))
        );
        assert_eq!(third.start_time, Some(Time(ts(100))), "startTime is kept");
    }

    #[test]
    fn foreign_conditions_are_preserved_and_readiness_gates_apply() {
        let mut p = pod("Always", vec![], &["a"]);
        if let Some(spec) = p.spec.as_mut() {
            spec.readiness_gates = Some(vec![PodReadinessGate {
                condition_type: "example.com/lb".into(),
            }]);
        }
        let mut g = Gen::new(&p, rt(vec![rc("a", "ida", Running, 0, 0, 0)]));
        let s = g.run();
        let r = cond(&s, COND_READY);
        assert_eq!(r.status, "False");
        assert_eq!(r.reason.as_deref(), Some("ReadinessGatesNotReady"));
        assert_eq!(
            r.message.as_deref(),
            Some(
                "corresponding condition of pod readiness gate \"example.com/lb\" does not exist."
            )
        );
        let mut old = s.clone();
        old.conditions.get_or_insert_with(Vec::new).extend([
            condition("example.com/lb", true, None, None),
            condition(
                COND_DISRUPTION_TARGET,
                true,
                Some("TerminationByKubelet"),
                None,
            ),
        ]);
        g.old = Some(old);
        let s = g.run();
        assert_eq!(cond(&s, COND_READY).status, "True");
        assert_eq!(
            cond(&s, COND_DISRUPTION_TARGET).reason.as_deref(),
            Some("TerminationByKubelet")
        );
    }

    #[test]
    fn terminal_phase_in_old_status_is_never_left() {
        let p = pod("Always", vec![], &["a"]);
        let mut g = Gen::new(&p, rt(vec![rc("a", "ida", Running, 0, 0, 0)]));
        g.old = Some(PodStatus {
            phase: Some(PodPhase::Failed.as_str().into()),
            reason: Some("Evicted".into()),
            message: Some("The node was low on resource: memory.".into()),
            ..Default::default()
        });
        let s = g.run();
        assert_eq!(s.phase.as_deref(), Some(PodPhase::Failed.as_str()));
        assert_eq!(s.reason.as_deref(), Some("Evicted"));
        assert_eq!(
            s.message.as_deref(),
            Some("The node was low on resource: memory.")
        );
    }

    #[test]
    fn pod_terminated_by_agent_gets_terminal_phase() {
        let p = pod("Always", vec![], &["a"]);
        let mut g = Gen::new(&p, rt(vec![rc("a", "ida", Exited, 137, 0, 0)]));
        g.terminal = true;
        assert_eq!(g.run().phase.as_deref(), Some(PodPhase::Failed.as_str()));
    }

    fn with_resources(mut c: Container, req: &[(&str, &str)], lim: &[(&str, &str)]) -> Container {
        let map = |v: &[(&str, &str)]| -> Option<BTreeMap<String, Quantity>> {
            (!v.is_empty()).then(|| {
                v.iter()
                    .map(|(k, q)| (k.to_string(), Quantity(q.to_string())))
                    .collect()
            })
        };
        c.resources = Some(ResourceRequirements {
            requests: map(req),
            limits: map(lim),
            ..Default::default()
        });
        c
    }

    #[test]
    fn phases_read_and_write_the_api_spelling() {
        for phase in [
            PodPhase::Pending,
            PodPhase::Running,
            PodPhase::Succeeded,
            PodPhase::Failed,
            PodPhase::Unknown,
        ] {
            assert_eq!(PodPhase::parse(phase.as_str()), Some(phase));
            assert_eq!(phase.to_string(), phase.as_str());
            assert_eq!(
                phase.is_terminal(),
                is_terminal_phase(Some(phase.as_str())),
                "{phase}"
            );
        }
        assert_eq!(PodPhase::parse("running"), None);
        assert!(!is_terminal_phase(Some("Done")));
        assert!(!is_terminal_phase(None));
        assert_eq!(QosClass::BestEffort.to_string(), "BestEffort");
    }

    #[test]
    fn qos_class_follows_requests_and_limits() {
        let mk = |cs: Vec<Container>| Pod {
            spec: Some(PodSpec {
                containers: cs,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(qos_class(&mk(vec![container("a")])), QosClass::BestEffort);
        let g = with_resources(
            container("a"),
            &[("cpu", "500m"), ("memory", "64Mi")],
            &[("cpu", "0.5"), ("memory", "67108864")],
        );
        assert_eq!(qos_class(&mk(vec![g.clone()])), QosClass::Guaranteed);
        let limits_only = with_resources(container("b"), &[], &[("cpu", "1"), ("memory", "1Gi")]);
        assert_eq!(
            qos_class(&mk(vec![g.clone(), limits_only])),
            QosClass::Guaranteed,
            "requests default to limits"
        );
        let burst = with_resources(container("c"), &[("cpu", "100m")], &[]);
        assert_eq!(qos_class(&mk(vec![g, burst])), QosClass::Burstable);
        let unequal = with_resources(
            container("d"),
            &[("cpu", "100m"), ("memory", "1Gi")],
            &[("cpu", "200m"), ("memory", "1Gi")],
        );
        assert_eq!(qos_class(&mk(vec![unequal])), QosClass::Burstable);
    }

    #[test]
    fn quantities_parse_exactly() {
        let q = |s: &str| quantity_nanos(&Quantity(s.into()));
        assert_eq!(q("1"), Some(1_000_000_000));
        assert_eq!(q("500m"), Some(500_000_000));
        assert_eq!(q("0.5"), q("500m"));
        assert_eq!(q("1Ki"), Some(1024 * 1_000_000_000));
        assert_eq!(q("1e3"), q("1k"));
        assert_eq!(q("abc"), None);
        assert_eq!(q(""), None);
    }
}
