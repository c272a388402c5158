//! Pod conditions: the kubelet's `status/generate.go` (`Initialized`, `ContainersReady`,
//! `Ready`, `PodReadyToStartContainers`) and which condition types the kubelet owns.

use super::*;

/// True for the condition types the kubelet owns (`PodConditionByKubelet`).
pub fn is_kubelet_condition(type_: &str) -> bool {
    PodConditionType::parse(type_).is_some_and(PodConditionType::is_kubelet_owned)
}

/// True for conditions the kubelet shares with other writers (`PodConditionSharedByKubelet`).
pub fn is_shared_condition(type_: &str) -> bool {
    type_ == PodConditionType::DisruptionTarget
}

pub(super) fn condition(
    type_: PodConditionType,
    ok: bool,
    reason: Option<&str>,
    message: Option<String>,
) -> PodCondition {
    PodCondition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.to_string(),
        reason: reason.map(str::to_string),
        message,
        ..Default::default()
    }
}

/// Go's `fmt.Sprintf("%s", []string{...})`: `[a b]`.
pub(super) fn go_list(names: &[&str]) -> String {
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
        return condition(
            PodConditionType::Initialized,
            true,
            Some("PodCompleted"),
            None,
        );
    }
    if has_any_regular_container_started(pod, statuses) {
        return condition(PodConditionType::Initialized, true, None, None);
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
        condition(PodConditionType::Initialized, true, None, None)
    } else {
        condition(
            PodConditionType::Initialized,
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
    condition(PodConditionType::ContainersReady, false, Some(reason), None)
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
        condition(PodConditionType::ContainersReady, true, None, None)
    } else {
        condition(
            PodConditionType::ContainersReady,
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
            type_: PodConditionType::Ready.into(),
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
        condition(PodConditionType::Ready, true, None, None)
    } else {
        condition(
            PodConditionType::Ready,
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

pub(super) fn generate_conditions(
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
        PodConditionType::PodReadyToStartContainers,
        input.sandbox_ready,
        None,
        None,
    ));
    owned.push(initialized_condition(pod, init_statuses, statuses, phase));
    let containers_ready = containers_ready_condition(pod, init_statuses, statuses, phase);
    owned.push(ready_condition(pod, &conditions, &containers_ready));
    owned.push(containers_ready);
    owned.push(condition(PodConditionType::PodScheduled, true, None, None));
    for mut c in owned {
        set_last_transition_time(&mut c, old, input.now);
        conditions.push(c);
    }
    conditions
}
