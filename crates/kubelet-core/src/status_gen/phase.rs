//! The pod's phase: the kubelet's `getPhase`, and the closed set [`PodPhase`].

use super::*;

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

/// True for `Succeeded` and `Failed` (an API status's phase, as text).
pub fn is_terminal_phase(phase: Option<&str>) -> bool {
    phase
        .and_then(PodPhase::parse)
        .is_some_and(PodPhase::is_terminal)
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
