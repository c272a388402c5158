//! Exits that containerd has announced and its CRI plugin has not recorded yet ("exit hints").
//!
//! containerd 1.6 publishes a task's `TaskExit` as soon as its shim reaps the init process, but
//! its CRI plugin marks the container exited only after it has deleted the task, 40–60 ms later
//! on an idle machine and seconds later after a burst of exits (it handles them one at a time).
//! Until then CRI reports the container as `RUNNING`. While a native event stream runs
//! ([`crate::events`]), every init-process exit it sees is kept here, and the runtime's
//! container reads ([`ContainerRuntime::container_status`] and
//! [`ContainerRuntime::list_containers`]) report such a container as exited with the exit code
//! and exit time of the event, as CRI will once it catches up:
//!
//! - `exitCode` is the event's exit status and `finishedAt` its `exited_at`: the values the CRI
//!   plugin records from the same event;
//! - `reason` is `OOMKilled` when a `TaskOOM` was seen for the container or CRI already says so,
//!   otherwise CRI's reason if it has one, otherwise `Completed` (exit 0) or `Error`, as the CRI
//!   plugin derives it.
//!
//! A hint is dropped as soon as CRI shows the container exited (or no longer knows it), and
//! after [`HINT_TTL`] at the latest. It is not applied to a failed container whose termination
//! message policy is `FallbackToLogsOnError`: its message is the end of its log, which is
//! complete only once the CRI plugin has closed the container's IO; that container is reported
//! exited when CRI records it. Sandboxes are never overlaid.
//!
//! So a consumer that inspects a pod on the exit event (an evented PLEG) sees the exit at once,
//! and a later read never goes back to `RUNNING`: the hint stays until CRI agrees with it.
//!
//! Acting on such an exit must not race with containerd's own handling of it: before it stops
//! or removes a container or a sandbox whose containers have hints, the runtime waits (at most
//! [`CONFIRM_WITHIN`](crate::events::CONFIRM_WITHIN)) until CRI has recorded those exits, as
//! it would have before hints (a `StopPodSandbox` during the plugin's task deletion was seen to
//! fail with the shim's connection closed).
//!
//! [`ContainerRuntime::container_status`]: kubelet_api::ContainerRuntime::container_status
//! [`ContainerRuntime::list_containers`]: kubelet_api::ContainerRuntime::list_containers

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use kubelet_api::runtime::{self as core, ContainerState, labels};
use tracing::warn;

/// The longest a hint is applied without CRI agreeing with it.
pub const HINT_TTL: Duration = Duration::from_secs(600);

/// The most hints kept; past it, expired ones are dropped, then all.
const MAX_HINTS: usize = 65_536;

/// The CRI plugin's reason for a container killed by the OOM killer.
const OOM_KILLED: &str = "OOMKilled";

/// An exit of a container's init process, from containerd's `TaskExit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Exit {
    /// The exit status (128 + n for signal n).
    pub(crate) code: i32,
    /// When the process exited.
    pub(crate) at: Timestamp,
}

#[derive(Debug, Clone, Copy)]
struct Hint {
    exit: Option<Exit>,
    oom: bool,
    since: Instant,
}

/// Exit hints by container ID, shared by a runtime's clones and its event streams.
#[derive(Debug, Clone, Default)]
pub(crate) struct ExitHints {
    hints: Arc<Mutex<HashMap<String, Hint>>>,
}

impl ExitHints {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Hint>> {
        self.hints.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn entry(&self, id: &str, f: impl FnOnce(&mut Hint)) {
        let mut hints = self.lock();
        if hints.len() >= MAX_HINTS && !hints.contains_key(id) {
            hints.retain(|_, h| h.since.elapsed() < HINT_TTL);
            if hints.len() >= MAX_HINTS {
                warn!(
                    hints = hints.len(),
                    "too many container exits not yet recorded by CRI; forgetting them"
                );
                hints.clear();
            }
        }
        let hint = hints.entry(id.to_string()).or_insert(Hint {
            exit: None,
            oom: false,
            since: Instant::now(),
        });
        f(hint);
    }

    /// Container `id`'s init process exited.
    pub(crate) fn record_exit(&self, id: &str, exit: Exit) {
        self.entry(id, |h| {
            h.exit = Some(exit);
            h.since = Instant::now();
        });
    }

    /// The OOM killer killed a process of container `id`.
    pub(crate) fn record_oom(&self, id: &str) {
        self.entry(id, |h| h.oom = true);
    }

    /// CRI has recorded what happened to `id` (or no longer knows it).
    pub(crate) fn forget(&self, id: &str) {
        self.lock().remove(id);
    }

    /// Whether an exit of `id` is known that CRI may not have recorded yet.
    pub(crate) fn has_exit(&self, id: &str) -> bool {
        self.lock().get(id).is_some_and(|h| h.exit.is_some())
    }

    /// Whether any hint is kept. Expired hints are dropped here: a hint nobody reads again (a
    /// sandbox's, or one whose confirmation a broken stream took along) would otherwise keep
    /// the runtime's stop and remove calls checking for exits.
    pub(crate) fn is_empty(&self) -> bool {
        let mut hints = self.lock();
        if !hints.is_empty() {
            hints.retain(|_, h| h.since.elapsed() < HINT_TTL);
        }
        hints.is_empty()
    }

    /// The hint for a container CRI reports in `state`, or `None` when none applies (dropping a
    /// hint CRI has caught up with, or an expired one).
    fn applicable(&self, id: &str, state: ContainerState) -> Option<(Exit, bool)> {
        let mut hints = self.lock();
        let hint = *hints.get(id)?;
        match state {
            ContainerState::Exited | ContainerState::Unknown => {
                hints.remove(id);
                None
            }
            _ if hint.since.elapsed() >= HINT_TTL => {
                hints.remove(id);
                warn!(
                    containerID = id,
                    "CRI has not recorded the container's exit for 10 minutes; reporting what CRI says"
                );
                None
            }
            ContainerState::Running => hint.exit.map(|e| (e, hint.oom)),
            ContainerState::Created => None,
        }
    }

    /// Applies a hint to a status CRI returned: see the module docs.
    pub(crate) fn apply_to_status(&self, status: &mut core::ContainerStatus) {
        let Some((exit, oom)) = self.applicable(&status.id, status.state) else {
            return;
        };
        if waits_for_its_log(&status.annotations, exit) {
            return;
        }
        status.state = ContainerState::Exited;
        status.exit_code = exit.code;
        status.finished_at = Some(exit.at);
        status.reason = exit_reason(&status.reason, oom, exit.code);
    }

    /// Applies a hint to a container CRI listed: see the module docs.
    pub(crate) fn apply_to_container(&self, container: &mut core::Container) {
        let Some((exit, _)) = self.applicable(&container.id, container.state) else {
            return;
        };
        if !waits_for_its_log(&container.annotations, exit) {
            container.state = ContainerState::Exited;
        }
    }
}

/// A failed container whose message comes from the end of its log.
fn waits_for_its_log(annotations: &core::Labels, exit: Exit) -> bool {
    exit.code != 0
        && annotations
            .get(labels::CONTAINER_TERMINATION_MESSAGE_POLICY)
            .is_some_and(|p| p == "FallbackToLogsOnError")
}

/// The reason the CRI plugin will report for an exited container.
fn exit_reason(cri_reason: &str, oom: bool, code: i32) -> String {
    if oom || cri_reason == OOM_KILLED {
        OOM_KILLED.to_string()
    } else if !cri_reason.is_empty() {
        cri_reason.to_string()
    } else if code == 0 {
        "Completed".to_string()
    } else {
        "Error".to_string()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn running(id: &str) -> core::ContainerStatus {
        {
            let mut v = core::ContainerStatus::default();
            v.id = id.into();
            v.state = ContainerState::Running;
            v.started_at = Some(Timestamp::new(1_700_000_000, 0).unwrap());
            v
        }
    }

    fn exit(code: i32) -> Exit {
        Exit {
            code,
            at: Timestamp::new(1_700_000_010, 7).unwrap(),
        }
    }

    #[test]
    fn a_running_container_with_an_exit_reads_as_exited_until_cri_records_it() {
        let hints = ExitHints::default();
        hints.record_exit("c1", exit(3));
        let mut st = running("c1");
        hints.apply_to_status(&mut st);
        assert_eq!(st.state, ContainerState::Exited);
        assert_eq!(st.exit_code, 3);
        assert_eq!(st.finished_at, Some(exit(3).at));
        assert_eq!(st.reason, "Error");
        // Applied again on the next read: it never goes back to running.
        let mut c = core::Container {
            id: "c1".into(),
            state: ContainerState::Running,
            ..Default::default()
        };
        hints.apply_to_container(&mut c);
        assert_eq!(c.state, ContainerState::Exited);
        // Other containers are untouched.
        let mut other = running("c2");
        hints.apply_to_status(&mut other);
        assert_eq!(other, running("c2"));
        // CRI catches up: the hint is dropped and CRI's own record is reported.
        let mut recorded = running("c1");
        recorded.state = ContainerState::Exited;
        recorded.exit_code = 3;
        recorded.reason = "Error".into();
        let before = recorded.clone();
        hints.apply_to_status(&mut recorded);
        assert_eq!(recorded, before);
        assert!(hints.is_empty());
    }

    #[test]
    fn reasons_follow_the_cri_plugin() {
        let hints = ExitHints::default();
        hints.record_exit("ok", exit(0));
        hints.record_oom("oom");
        hints.record_exit("oom", exit(137));
        hints.record_exit("cri-oom", exit(137));
        let mut ok = running("ok");
        hints.apply_to_status(&mut ok);
        assert_eq!(ok.reason, "Completed");
        let mut oom = running("oom");
        hints.apply_to_status(&mut oom);
        assert_eq!((oom.reason.as_str(), oom.exit_code), (OOM_KILLED, 137));
        let mut cri_oom = running("cri-oom");
        cri_oom.reason = OOM_KILLED.into();
        hints.apply_to_status(&mut cri_oom);
        assert_eq!(cri_oom.reason, OOM_KILLED);
    }

    #[test]
    fn an_oom_alone_or_a_created_container_is_not_an_exit() {
        let hints = ExitHints::default();
        hints.record_oom("c1");
        let mut st = running("c1");
        hints.apply_to_status(&mut st);
        assert_eq!(st, running("c1"));
        hints.record_exit("c2", exit(1));
        let mut created = running("c2");
        created.state = ContainerState::Created;
        let before = created.clone();
        hints.apply_to_status(&mut created);
        assert_eq!(created, before);
    }

    #[test]
    fn a_failed_container_with_fallback_to_logs_waits_for_cri() {
        let hints = ExitHints::default();
        hints.record_exit("c1", exit(2));
        hints.record_exit("c2", exit(0));
        let policy = |st: &mut core::ContainerStatus| {
            st.annotations.insert(
                labels::CONTAINER_TERMINATION_MESSAGE_POLICY.into(),
                "FallbackToLogsOnError".into(),
            );
        };
        let mut failed = running("c1");
        policy(&mut failed);
        let before = failed.clone();
        hints.apply_to_status(&mut failed);
        assert_eq!(failed, before);
        // A successful exit has no message from the log: applied.
        let mut succeeded = running("c2");
        policy(&mut succeeded);
        hints.apply_to_status(&mut succeeded);
        assert_eq!(succeeded.state, ContainerState::Exited);
    }

    #[test]
    fn forget_drops_a_hint() {
        let hints = ExitHints::default();
        hints.record_exit("c1", exit(1));
        hints.forget("c1");
        let mut st = running("c1");
        hints.apply_to_status(&mut st);
        assert_eq!(st, running("c1"));
    }
}
