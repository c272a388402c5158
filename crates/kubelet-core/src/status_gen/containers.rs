//! Container statuses: the kubelet's `convertToAPIContainerStatuses` (state, last state,
//! restart count, readiness and start from probe results, waiting reasons).

use super::*;
use kubelet_api::runtime::strip_container_id;

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

/// `<runtime_name>://<id>`.
pub fn container_id(runtime_name: &str, id: &str) -> String {
    format!("{runtime_name}://{id}")
}

/// Restart count of a runtime container instance: the `io.kubernetes.container.restartCount`
/// annotation, else the attempt number.
pub fn restart_count(cs: &runtime::ContainerStatus) -> i32 {
    cs.annotations
        .get(labels::CONTAINER_RESTART_COUNT)
        .and_then(|v| v.trim().parse::<i32>().ok())
        .unwrap_or_else(|| i32::try_from(cs.metadata.attempt).unwrap_or(i32::MAX))
}

pub(super) fn state_is_terminated(s: Option<&ContainerState>) -> bool {
    s.is_some_and(|s| s.terminated.is_some())
}

pub(super) fn state_is_running(s: Option<&ContainerState>) -> bool {
    s.is_some_and(|s| s.running.is_some())
}

pub(super) fn state_is_waiting(s: Option<&ContainerState>) -> bool {
    s.is_some_and(|s| s.waiting.is_some())
}

pub(super) fn waiting_reason(s: Option<&ContainerState>) -> Option<&str> {
    s.and_then(|s| s.waiting.as_ref())
        .and_then(|w| w.reason.as_deref())
}

pub(super) fn waiting(reason: &str, message: Option<String>) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.to_string()),
            message,
        }),
        ..Default::default()
    }
}

pub(super) fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

/// One runtime instance as an API container status (`convertContainerStatus`).
pub(super) fn convert_instance(
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
pub(super) fn instances<'a>(
    rt: &'a PodRuntimeStatus,
    name: &str,
) -> Vec<&'a runtime::ContainerStatus> {
    let mut v: Vec<&runtime::ContainerStatus> = rt
        .container_statuses
        .iter()
        .filter(|c| c.metadata.name == name)
        .collect();
    kubelet_api::sort::by_key(&mut v, |c| {
        std::cmp::Reverse((c.created_at, c.metadata.attempt))
    });
    v
}

/// `ShouldContainerBeRestarted`, judged on the newest instance.
pub(super) fn should_restart(
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
pub(super) fn convert_container_statuses(
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
        kubelet_api::sort::by(&mut out, |a, b| a.name.cmp(&b.name));
    }
    out
}

/// The probe manager's `UpdatePodStatus`: `started` and `ready` from probe results.
pub(super) fn apply_probe_results(
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

pub(super) fn find<'a>(statuses: &'a [ContainerStatus], name: &str) -> Option<&'a ContainerStatus> {
    statuses.iter().find(|s| s.name == name)
}

pub(super) fn last_terminated(s: &ContainerStatus) -> Option<&ContainerStateTerminated> {
    s.last_state.as_ref().and_then(|l| l.terminated.as_ref())
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
