//! `compute_pod_actions`: what to do to bring a pod's runtime state to its spec, as a pure
//! function of the spec, the runtime status and the probe results (the kubelet's
//! `computePodActions` and `computeInitContainerActions`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};

use kubelet_api::pod::{self, RestartPolicy};
use kubelet_api::runtime::{
    ContainerState, ContainerStatus, PodRuntimeStatus, SandboxState, labels,
};
use kubelet_api::{ProbeResult, ProbeType};

/// Why a container is killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum KillReason {
    /// The container's definition (hash) changed.
    DefinitionChanged,
    /// The liveness probe failed.
    LivenessProbe,
    /// The startup probe failed.
    StartupProbe,
    /// The container is in an unknown state and must be killed before a restart.
    UnknownState,
}

/// A container to kill, with the kubelet's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ContainerToKill {
    /// Container name.
    pub(crate) name: String,
    /// Why.
    pub(crate) reason: KillReason,
    /// Message for the `Killing` event.
    pub(crate) message: String,
}

/// The outcome of [`compute_pod_actions`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PodActions {
    /// Kill every container and the sandbox.
    pub(crate) kill_pod: bool,
    /// Create a new sandbox.
    pub(crate) create_sandbox: bool,
    /// The current sandbox, if any.
    pub(crate) sandbox_id: Option<String>,
    /// Attempt number for a new sandbox.
    pub(crate) attempt: u32,
    /// Indices into `spec.initContainers` to start, in order.
    pub(crate) init_containers_to_start: Vec<usize>,
    /// Indices into `spec.containers` to start, in order.
    pub(crate) containers_to_start: Vec<usize>,
    /// Running containers to kill, by container ID.
    pub(crate) containers_to_kill: BTreeMap<String, ContainerToKill>,
}

/// What [`pod_sandbox_changed`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SandboxChange {
    /// A new sandbox is needed (none yet, the newest not ready, or several ready).
    pub(crate) changed: bool,
    /// The attempt number of the sandbox to create, or of the current one when unchanged.
    pub(crate) attempt: u32,
    /// The newest sandbox, if any.
    pub(crate) sandbox_id: Option<String>,
}

/// Whether the pod needs a new sandbox (`podSandboxChanged`).
pub(crate) fn pod_sandbox_changed(status: &PodRuntimeStatus) -> SandboxChange {
    let Some(newest) = status.sandbox_statuses.first() else {
        return SandboxChange {
            changed: true,
            attempt: 0,
            sandbox_id: None,
        };
    };
    let sandbox_id = Some(newest.id.clone());
    let ready = status
        .sandbox_statuses
        .iter()
        .filter(|s| s.state == SandboxState::Ready)
        .count();
    let next = newest.metadata.attempt + 1;
    // The network report is not a reason to re-create (the sandbox network contract on
    // `PodSandboxStatus`): a runtime without pod networking reports host network for every
    // sandbox, and one that breaks the contract is reported by the sync, not looped.
    let changed = ready > 1 || newest.state != SandboxState::Ready;
    SandboxChange {
        changed,
        attempt: if changed {
            next
        } else {
            newest.metadata.attempt
        },
        sandbox_id,
    }
}

/// The container's hash as recorded on the runtime instance.
fn recorded_hash(status: &ContainerStatus) -> Option<u64> {
    status
        .annotations
        .get(labels::CONTAINER_HASH)
        .and_then(|h| u64::from_str_radix(h, 16).ok())
}

/// True when the running instance was created from a different definition.
pub(crate) fn container_changed(c: &Container, status: &ContainerStatus) -> bool {
    recorded_hash(status).is_some_and(|h| h != pod::container_hash(c))
}

/// `ShouldContainerBeRestarted` for a regular container.
pub(crate) fn should_container_be_restarted(
    c: &Container,
    pod: &Pod,
    status: &PodRuntimeStatus,
) -> bool {
    if pod::is_deleted(pod) {
        return false;
    }
    let Some(st) = status.find_container(&c.name) else {
        return true;
    };
    match st.state {
        ContainerState::Running => false,
        ContainerState::Unknown | ContainerState::Created => true,
        ContainerState::Exited => match pod::restart_policy(pod) {
            RestartPolicy::Never => false,
            RestartPolicy::OnFailure => st.exit_code != 0,
            RestartPolicy::Always => true,
        },
    }
}

fn container_succeeded(c: &Container, status: &PodRuntimeStatus) -> bool {
    status
        .find_container(&c.name)
        .is_some_and(|s| s.state == ContainerState::Exited && s.exit_code == 0)
}

fn init_container_failed(s: &ContainerStatus) -> bool {
    (s.state == ContainerState::Exited && s.exit_code != 0) || s.state == ContainerState::Unknown
}

fn has_any_regular_container_created(pod: &Pod, status: &PodRuntimeStatus) -> bool {
    pod::containers(pod).iter().any(|c| {
        status.find_container(&c.name).is_some_and(|s| {
            matches!(
                s.state,
                ContainerState::Created | ContainerState::Running | ContainerState::Exited
            )
        })
    })
}

/// Compute what to do for `pod` given its runtime `status`. `probe` returns the latest result of
/// a probe for a container ID, `None` when the container has no such probe or no result yet.
pub(crate) fn compute_pod_actions(
    pod: &Pod,
    status: &PodRuntimeStatus,
    probe: &dyn Fn(&str, ProbeType) -> Option<ProbeResult>,
) -> PodActions {
    let SandboxChange {
        changed: create_sandbox,
        attempt,
        sandbox_id,
    } = pod_sandbox_changed(status);
    let mut changes = PodActions {
        kill_pod: create_sandbox,
        create_sandbox,
        sandbox_id,
        attempt,
        ..Default::default()
    };
    let policy = pod::restart_policy(pod);
    let containers = pod::containers(pod);
    let inits = pod::init_containers(pod);

    if create_sandbox {
        if policy == RestartPolicy::Never && attempt != 0 && !status.container_statuses.is_empty() {
            // The pod ran once and must not run again: kill only.
            changes.create_sandbox = false;
            return changes;
        }
        let to_start: Vec<usize> = containers
            .iter()
            .enumerate()
            .filter(|(_, c)| {
                !(policy == RestartPolicy::OnFailure && container_succeeded(c, status))
            })
            .map(|(i, _)| i)
            .collect();
        if to_start.is_empty() {
            let initialized = if inits.iter().any(pod::is_sidecar) {
                has_any_regular_container_created(pod, status)
            } else {
                // Without sidecars: initialized when the last init container succeeded.
                inits.is_empty()
                    || inits.last().is_some_and(|c| {
                        status
                            .find_container(&c.name)
                            .is_some_and(|s| s.state == ContainerState::Exited && s.exit_code == 0)
                    })
            };
            if initialized {
                changes.create_sandbox = false;
                return changes;
            }
        }
        if !inits.is_empty() {
            changes.init_containers_to_start = vec![0];
            return changes;
        }
        changes.containers_to_start = to_start;
        return changes;
    }

    let initialized = compute_init_container_actions(pod, status, probe, &mut changes);
    if changes.kill_pod || !initialized {
        return changes;
    }

    let mut keep = 0usize;
    for (idx, c) in containers.iter().enumerate() {
        let st = status.find_container(&c.name);
        match st {
            Some(s) if s.state == ContainerState::Running => {
                let mut restart = policy != RestartPolicy::Never;
                let (reason, mut message) = if container_changed(c, s) {
                    restart = true;
                    (
                        KillReason::DefinitionChanged,
                        format!("Container {} definition changed", c.name),
                    )
                } else if probe(&s.id, ProbeType::Liveness) == Some(ProbeResult::Failure) {
                    (
                        KillReason::LivenessProbe,
                        format!("Container {} failed liveness probe", c.name),
                    )
                } else if probe(&s.id, ProbeType::Startup) == Some(ProbeResult::Failure) {
                    (
                        KillReason::StartupProbe,
                        format!("Container {} failed startup probe", c.name),
                    )
                } else {
                    keep += 1;
                    continue;
                };
                if restart {
                    message.push_str(", will be restarted");
                    changes.containers_to_start.push(idx);
                }
                changes.containers_to_kill.insert(
                    s.id.clone(),
                    ContainerToKill {
                        name: c.name.clone(),
                        reason,
                        message,
                    },
                );
            }
            _ => {
                if should_container_be_restarted(c, pod, status) {
                    changes.containers_to_start.push(idx);
                    if let Some(s) = st
                        && s.state == ContainerState::Unknown
                    {
                        changes.containers_to_kill.insert(
                            s.id.clone(),
                            ContainerToKill {
                                name: c.name.clone(),
                                reason: KillReason::UnknownState,
                                message:
                                    "Container is in unknown state, try killing it before restart"
                                        .to_string(),
                            },
                        );
                    }
                }
            }
        }
    }
    if keep == 0 && changes.containers_to_start.is_empty() {
        changes.kill_pod = true;
        // Sidecars must not keep a finished pod alive.
        changes.init_containers_to_start.clear();
    }
    changes
}

/// Init container part of [`compute_pod_actions`]; returns whether the pod is initialized.
fn compute_init_container_actions(
    pod: &Pod,
    status: &PodRuntimeStatus,
    probe: &dyn Fn(&str, ProbeType) -> Option<ProbeResult>,
    changes: &mut PodActions,
) -> bool {
    let inits = pod::init_containers(pod);
    if inits.is_empty() {
        return true;
    }
    // Regular containers created or running mean initialization finished at some point.
    let mut pod_has_initialized = pod::containers(pod).iter().any(|c| {
        status
            .find_container(&c.name)
            .is_some_and(|s| matches!(s.state, ContainerState::Created | ContainerState::Running))
    });
    let mut previously_initialized = pod_has_initialized;
    let restart_on_failure = pod::restart_policy(pod) != RestartPolicy::Never;
    let last = inits.len() - 1;

    let kill = |changes: &mut PodActions, s: &ContainerStatus, c: &Container, reason, message| {
        changes.containers_to_kill.insert(
            s.id.clone(),
            ContainerToKill {
                name: c.name.clone(),
                reason,
                message,
            },
        );
    };

    for i in (0..inits.len()).rev() {
        let c = &inits[i];
        let sidecar = pod::is_sidecar(c);
        let Some(s) = status.find_container(&c.name) else {
            if previously_initialized && sidecar {
                changes.init_containers_to_start.push(i);
            }
            continue;
        };
        if previously_initialized && !sidecar {
            continue;
        }
        match s.state {
            ContainerState::Created => changes.init_containers_to_start.push(i),
            ContainerState::Running => {
                if sidecar {
                    'sidecar: {
                        if c.startup_probe.is_some() {
                            match probe(&s.id, ProbeType::Startup) {
                                Some(ProbeResult::Success) => {}
                                Some(ProbeResult::Failure) => {
                                    kill(
                                        changes,
                                        s,
                                        c,
                                        KillReason::StartupProbe,
                                        format!("Init container {} failed startup probe", c.name),
                                    );
                                    changes.init_containers_to_start.push(i);
                                    break 'sidecar;
                                }
                                _ => break 'sidecar,
                            }
                        }
                        if i == last {
                            pod_has_initialized = true;
                        } else if !previously_initialized {
                            changes.init_containers_to_start.push(i + 1);
                        }
                        if container_changed(c, s) {
                            kill(
                                changes,
                                s,
                                c,
                                KillReason::DefinitionChanged,
                                format!("Init container {} definition changed", c.name),
                            );
                            changes.init_containers_to_start.push(i);
                            break 'sidecar;
                        }
                        if c.liveness_probe.is_some()
                            && probe(&s.id, ProbeType::Liveness) == Some(ProbeResult::Failure)
                        {
                            kill(
                                changes,
                                s,
                                c,
                                KillReason::LivenessProbe,
                                format!("Init container {} failed liveness probe", c.name),
                            );
                            changes.init_containers_to_start.push(i);
                        }
                    }
                }
                // A running regular init container: wait for it to finish.
            }
            ContainerState::Exited => {
                if sidecar {
                    changes.init_containers_to_start.push(i);
                } else if init_container_failed(s) {
                    if !restart_on_failure {
                        changes.kill_pod = true;
                        changes.init_containers_to_start.clear();
                        return false;
                    }
                    changes.init_containers_to_start.push(i);
                } else if i == last {
                    pod_has_initialized = true;
                } else {
                    changes.init_containers_to_start.push(i + 1);
                }
            }
            ContainerState::Unknown => {
                if !sidecar && !restart_on_failure {
                    changes.kill_pod = true;
                    changes.init_containers_to_start.clear();
                    return false;
                }
                kill(
                    changes,
                    s,
                    c,
                    KillReason::UnknownState,
                    "Init container is in \"unknown\" state, try killing it before restart"
                        .to_string(),
                );
                changes.init_containers_to_start.push(i);
            }
        }
        previously_initialized = true;
    }
    if !previously_initialized {
        // No init container has run yet: start the first one.
        changes.init_containers_to_start.push(0);
    }
    // Start in spec order.
    changes.init_containers_to_start.sort_unstable();
    changes.init_containers_to_start.dedup();
    pod_has_initialized
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, Probe};
    use kubelet_api::runtime::{ContainerMetadata, PodSandboxMetadata, PodSandboxStatus};

    fn container(name: &str) -> Container {
        Container {
            name: name.into(),
            image: Some("img".into()),
            ..Default::default()
        }
    }

    fn sidecar(name: &str) -> Container {
        Container {
            restart_policy: Some("Always".into()),
            ..container(name)
        }
    }

    fn pod(policy: &str, inits: Vec<Container>, containers: Vec<Container>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                restart_policy: Some(policy.into()),
                init_containers: Some(inits),
                containers,
                host_network: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn ready_sandbox() -> PodSandboxStatus {
        {
            let mut v = PodSandboxStatus::default();
            v.id = "sb".into();
            v.metadata = PodSandboxMetadata::default();
            v.state = SandboxState::Ready;
            v.host_network = true;
            v
        }
    }

    fn cs(pod: &Pod, name: &str, id: &str, state: ContainerState, exit: i32) -> ContainerStatus {
        let spec = pod::containers(pod)
            .iter()
            .chain(pod::init_containers(pod))
            .find(|c| c.name == name)
            .cloned()
            .unwrap_or_else(|| container(name));
        let mut annotations = kubelet_api::runtime::Labels::new();
        annotations.insert(
            labels::CONTAINER_HASH.into(),
            format!("{:x}", pod::container_hash(&spec)),
        );
        {
            let mut v = ContainerStatus::default();
            v.id = id.into();
            v.metadata = ContainerMetadata {
                name: name.into(),
                attempt: 0,
            };
            v.state = state;
            v.exit_code = exit;
            v.annotations = annotations;
            v
        }
    }

    fn status(containers: Vec<ContainerStatus>) -> PodRuntimeStatus {
        PodRuntimeStatus {
            sandbox_statuses: vec![ready_sandbox()],
            container_statuses: containers,
            ..Default::default()
        }
    }

    fn no_probes(_: &str, _: ProbeType) -> Option<ProbeResult> {
        None
    }

    #[test]
    fn new_pod_creates_sandbox_and_starts_all_containers() {
        let p = pod("Always", vec![], vec![container("a"), container("b")]);
        let a = compute_pod_actions(&p, &PodRuntimeStatus::default(), &no_probes);
        assert!(a.create_sandbox && a.kill_pod);
        assert_eq!(a.attempt, 0);
        assert_eq!(a.containers_to_start, vec![0, 1]);
    }

    #[test]
    fn new_pod_with_init_containers_starts_only_the_first_init() {
        let p = pod(
            "Always",
            vec![container("i1"), container("i2")],
            vec![container("a")],
        );
        let a = compute_pod_actions(&p, &PodRuntimeStatus::default(), &no_probes);
        assert_eq!(a.init_containers_to_start, vec![0]);
        assert!(a.containers_to_start.is_empty());
    }

    #[test]
    fn restart_policy_decides_whether_an_exited_container_restarts() {
        for (policy, exit, restarts) in [
            ("Always", 0, true),
            ("Always", 1, true),
            ("OnFailure", 0, false),
            ("OnFailure", 2, true),
            ("Never", 0, false),
            ("Never", 1, false),
        ] {
            let p = pod(policy, vec![], vec![container("a"), container("b")]);
            let s = status(vec![
                cs(&p, "a", "ida", ContainerState::Exited, exit),
                cs(&p, "b", "idb", ContainerState::Running, 0),
            ]);
            let a = compute_pod_actions(&p, &s, &no_probes);
            assert_eq!(
                a.containers_to_start.contains(&0),
                restarts,
                "{policy} exit {exit}"
            );
            assert!(!a.kill_pod);
        }
    }

    #[test]
    fn all_containers_done_without_restart_kills_the_pod() {
        let p = pod("Never", vec![sidecar("s")], vec![container("a")]);
        let s = status(vec![
            cs(&p, "s", "ids", ContainerState::Running, 0),
            cs(&p, "a", "ida", ContainerState::Exited, 0),
        ]);
        let a = compute_pod_actions(&p, &s, &no_probes);
        assert!(a.kill_pod);
        assert!(
            a.init_containers_to_start.is_empty(),
            "sidecars must not keep the pod alive"
        );
    }

    #[test]
    fn init_containers_run_in_order() {
        let p = pod(
            "Always",
            vec![container("i1"), container("i2")],
            vec![container("a")],
        );
        // i1 running: wait.
        let a = compute_pod_actions(
            &p,
            &status(vec![cs(&p, "i1", "x", ContainerState::Running, 0)]),
            &no_probes,
        );
        assert!(a.init_containers_to_start.is_empty() && a.containers_to_start.is_empty());
        // i1 done: start i2.
        let a = compute_pod_actions(
            &p,
            &status(vec![cs(&p, "i1", "x", ContainerState::Exited, 0)]),
            &no_probes,
        );
        assert_eq!(a.init_containers_to_start, vec![1]);
        assert!(a.containers_to_start.is_empty());
        // i2 done: start the app.
        let a = compute_pod_actions(
            &p,
            &status(vec![
                cs(&p, "i1", "x", ContainerState::Exited, 0),
                cs(&p, "i2", "y", ContainerState::Exited, 0),
            ]),
            &no_probes,
        );
        assert!(a.init_containers_to_start.is_empty());
        assert_eq!(a.containers_to_start, vec![0]);
    }

    #[test]
    fn failed_init_container_with_never_kills_the_pod() {
        let p = pod("Never", vec![container("i1")], vec![container("a")]);
        let a = compute_pod_actions(
            &p,
            &status(vec![cs(&p, "i1", "x", ContainerState::Exited, 1)]),
            &no_probes,
        );
        assert!(a.kill_pod);
        let p = pod("Always", vec![container("i1")], vec![container("a")]);
        let a = compute_pod_actions(
            &p,
            &status(vec![cs(&p, "i1", "x", ContainerState::Exited, 1)]),
            &no_probes,
        );
        assert!(!a.kill_pod);
        assert_eq!(a.init_containers_to_start, vec![0]);
    }

    #[test]
    fn sidecar_starts_before_and_is_kept_with_the_main_container() {
        let mut side = sidecar("s");
        side.startup_probe = Some(Probe::default());
        let p = pod("Always", vec![side, container("i2")], vec![container("a")]);
        let running = status(vec![cs(&p, "s", "ids", ContainerState::Running, 0)]);
        // Startup probe not yet succeeded: nothing else starts.
        let a = compute_pod_actions(&p, &running, &no_probes);
        assert!(a.init_containers_to_start.is_empty());
        // Started: the next init container starts.
        let started =
            |_: &str, t: ProbeType| (t == ProbeType::Startup).then_some(ProbeResult::Success);
        let a = compute_pod_actions(&p, &running, &started);
        assert_eq!(a.init_containers_to_start, vec![1]);
        // Main container running, sidecar exited: the sidecar restarts, whatever the policy.
        let s = status(vec![
            cs(&p, "s", "ids", ContainerState::Exited, 0),
            cs(&p, "i2", "idi", ContainerState::Exited, 0),
            cs(&p, "a", "ida", ContainerState::Running, 0),
        ]);
        let a = compute_pod_actions(&p, &s, &started);
        assert_eq!(a.init_containers_to_start, vec![0]);
        assert!(!a.kill_pod);
    }

    #[test]
    fn liveness_failure_and_definition_change_kill_and_restart() {
        let p = pod("Always", vec![], vec![container("a")]);
        let s = status(vec![cs(&p, "a", "ida", ContainerState::Running, 0)]);
        let failing =
            |_: &str, t: ProbeType| (t == ProbeType::Liveness).then_some(ProbeResult::Failure);
        let a = compute_pod_actions(&p, &s, &failing);
        assert_eq!(a.containers_to_start, vec![0]);
        let k = &a.containers_to_kill["ida"];
        assert_eq!(k.reason, KillReason::LivenessProbe);
        assert_eq!(
            k.message,
            "Container a failed liveness probe, will be restarted"
        );

        let mut changed = p.clone();
        if let Some(spec) = changed.spec.as_mut() {
            spec.containers[0].image = Some("img:2".into());
        }
        let a = compute_pod_actions(&changed, &s, &no_probes);
        assert_eq!(a.containers_to_start, vec![0]);
        assert_eq!(
            a.containers_to_kill["ida"].reason,
            KillReason::DefinitionChanged
        );
    }

    #[test]
    fn dead_sandbox_with_never_policy_is_not_recreated() {
        let p = pod("Never", vec![], vec![container("a")]);
        let mut s = status(vec![cs(&p, "a", "ida", ContainerState::Exited, 0)]);
        s.sandbox_statuses[0].state = SandboxState::NotReady;
        let a = compute_pod_actions(&p, &s, &no_probes);
        assert!(a.kill_pod);
        assert!(!a.create_sandbox);
    }

    #[test]
    fn running_pod_needs_nothing() {
        let p = pod("Always", vec![], vec![container("a")]);
        let s = status(vec![cs(&p, "a", "ida", ContainerState::Running, 0)]);
        let a = compute_pod_actions(&p, &s, &no_probes);
        assert_eq!(
            a,
            PodActions {
                sandbox_id: Some("sb".into()),
                ..Default::default()
            }
        );
    }

    mod properties {
        //! Random specs and runtime statuses: no panic, and the kubelet's invariants hold.
        use super::*;
        use proptest::prelude::*;

        /// One container instance: state, exit code, attempt.
        fn instance() -> impl Strategy<Value = (u8, i32, u32)> {
            (0u8..4, prop_oneof![Just(0), Just(1), Just(137)], 0u32..3)
        }

        fn state_of(s: u8) -> ContainerState {
            match s {
                0 => ContainerState::Created,
                1 => ContainerState::Running,
                2 => ContainerState::Exited,
                _ => ContainerState::Unknown,
            }
        }

        prop_compose! {
                    fn scenario()(
                        policy in prop_oneof![Just("Always"), Just("OnFailure"), Just("Never")],
                        inits in proptest::collection::vec(any::<bool>(), 0..3),
                        regular in 1usize..4,
                        instances in proptest::collection::vec(proptest::collection::vec(instance(), 0..3), 6),
                        sandbox in 0u8..3,
                    ) -> (Pod, PodRuntimeStatus) {
                        let init: Vec<Container> = inits
                            .iter()
                            .enumerate()
                            .map(|(i, side)| if *side { sidecar(&format!("i{i}")) } else { container(&format!("i{i}")) })
                            .collect();
                        let regular: Vec<Container> = (0..regular).map(|i| container(&format!("c{i}"))).collect();
                        let p = pod(policy, init.clone(), regular.clone());
                        let mut statuses = Vec::new();
                        for (n, c) in init.iter().chain(regular.iter()).enumerate() {
                            for (k, (st, exit, attempt)) in instances[n % instances.len()].iter().enumerate() {
                                let mut s = cs(&p, &c.name, &format!("{}-{k}", c.name), state_of(*st), *exit);
                                s.metadata.attempt = *attempt;
                                s.created_at = jiff::Timestamp::from_second(1_700_000_000 + i64::from(*attempt) * 10 + k as i64)
                                    .expect("timestamp");
                                statuses.push(s);
                            }
                        }
                        statuses.sort_by_key(|s| std::cmp::Reverse(s.created_at));
                        let sandbox_statuses = match sandbox {
                            0 => vec![],
                            1 => vec![ready_sandbox()],
                            _ => vec![{ let mut v = ready_sandbox();
        v.state = SandboxState::NotReady;
        v }],
                        };
                        (p, PodRuntimeStatus { sandbox_statuses, container_statuses: statuses, ..Default::default() })
                    }
                }

        proptest! {
            #[test]
            fn actions_are_well_formed_and_keep_the_restart_policy((p, s) in scenario()) {
                let a = compute_pod_actions(&p, &s, &no_probes);
                let regular = pod::containers(&p);
                let init = pod::init_containers(&p);
                // Indices are valid and unique.
                let mut seen = std::collections::BTreeSet::new();
                for i in &a.containers_to_start {
                    prop_assert!(*i < regular.len());
                    prop_assert!(seen.insert(*i));
                }
                let mut seen = std::collections::BTreeSet::new();
                for i in &a.init_containers_to_start {
                    prop_assert!(*i < init.len());
                    prop_assert!(seen.insert(*i));
                }
                // Only containers the runtime reports are killed.
                for id in a.containers_to_kill.keys() {
                    prop_assert!(s.container_statuses.iter().any(|c| &c.id == id));
                }
                // restartPolicy Never: a regular container whose newest instance exited is never
                // started again while the pod has a sandbox (the kubelet's one exception is a
                // pod whose sandboxes are all gone, attempt 0; a newer instance that was only
                // created is started, as the kubelet's `ShouldContainerBeRestarted`).
                if podutil_policy(&p) == "Never" && !s.sandbox_statuses.is_empty() {
                    for i in &a.containers_to_start {
                        let name = &regular[*i].name;
                        let newest = s.container_statuses.iter().find(|c| &c.metadata.name == name);
                        let exited = newest.is_some_and(|c| c.state == ContainerState::Exited);
                        prop_assert!(!exited, "{name} exited under Never and is started again");
                    }
                }
                // OnFailure: a regular container whose newest instance exited with 0 is not
                // started again.
                if podutil_policy(&p) == "OnFailure" {
                    for i in &a.containers_to_start {
                        let name = &regular[*i].name;
                        let newest = s.container_statuses.iter().find(|c| &c.metadata.name == name);
                        let succeeded = newest.is_some_and(|c| c.state == ContainerState::Exited && c.exit_code == 0);
                        prop_assert!(!succeeded, "{name} succeeded under OnFailure and is started again");
                    }
                }
            }
        }

        fn podutil_policy(p: &Pod) -> &str {
            p.spec
                .as_ref()
                .and_then(|s| s.restart_policy.as_deref())
                .unwrap_or("Always")
        }
    }
}
