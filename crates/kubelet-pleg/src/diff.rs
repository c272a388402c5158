//! The pure part of a relist: per-pod records of the previous and current runtime view, and the
//! events that the difference between them means (`generic.go` `computeEvents`).

use std::collections::HashMap;

use kubelet_api::runtime::{
    Container, ContainerState, PodRuntimeStatus, PodSandbox, RuntimePod, SandboxState,
};
use kubelet_api::{PodLifecycleEvent, PodLifecycleEventType};

/// The PLEG's coarse view of a container or sandbox (`plegContainerState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PlegState {
    Running,
    Exited,
    Unknown,
    NonExistent,
}

impl From<ContainerState> for PlegState {
    fn from(s: ContainerState) -> Self {
        match s {
            ContainerState::Running => PlegState::Running,
            ContainerState::Exited => PlegState::Exited,
            // The kubelet maps `created` to unknown: it is neither running nor dead.
            ContainerState::Created | ContainerState::Unknown => PlegState::Unknown,
        }
    }
}

impl From<SandboxState> for PlegState {
    fn from(s: SandboxState) -> Self {
        match s {
            SandboxState::Ready => PlegState::Running,
            SandboxState::NotReady => PlegState::Exited,
        }
    }
}

/// State of `id` (a container or a sandbox) in `pod`.
fn state_of(pod: Option<&RuntimePod>, id: &str) -> PlegState {
    let Some(pod) = pod else {
        return PlegState::NonExistent;
    };
    if let Some(c) = pod.containers.iter().find(|c| c.id == id) {
        return c.state.into();
    }
    if let Some(s) = pod.sandboxes.iter().find(|s| s.id == id) {
        return s.state.into();
    }
    PlegState::NonExistent
}

/// Events for one container going from `old` to `new` (`generateEvents`).
pub(crate) fn events_for_transition(
    old: PlegState,
    new: PlegState,
) -> &'static [PodLifecycleEventType] {
    use PodLifecycleEventType::*;
    if old == new {
        return &[];
    }
    match new {
        PlegState::Running => &[ContainerStarted],
        PlegState::Exited => &[ContainerDied],
        PlegState::Unknown => &[ContainerChanged],
        PlegState::NonExistent => match old {
            PlegState::Exited => &[ContainerRemoved],
            _ => &[ContainerDied, ContainerRemoved],
        },
    }
}

/// Every event of pod `uid` between its `old` and `new` runtime view. Sandboxes are treated as
/// containers. IDs are visited containers first, then sandboxes, old view first.
pub(crate) fn compute_pod_events(
    uid: &str,
    old: Option<&RuntimePod>,
    new: Option<&RuntimePod>,
) -> Vec<PodLifecycleEvent> {
    let mut ids: Vec<&str> = Vec::new();
    for pod in [old, new].into_iter().flatten() {
        for id in pod
            .containers
            .iter()
            .map(|c| c.id.as_str())
            .chain(pod.sandboxes.iter().map(|s| s.id.as_str()))
        {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    let mut events = Vec::new();
    for id in ids {
        for kind in events_for_transition(state_of(old, id), state_of(new, id)) {
            events.push(PodLifecycleEvent {
                pod_uid: uid.to_string(),
                kind: *kind,
                container_id: id.to_string(),
            });
        }
    }
    events
}

/// The PLEG's view of a pod built from its inspected status: the same IDs and states a listing
/// gives, so a diff against it yields the events a relist would. `None` when the runtime has
/// nothing left of the pod.
pub(crate) fn view_of_status(status: &PodRuntimeStatus) -> Option<RuntimePod> {
    if status.sandbox_statuses.is_empty() && status.container_statuses.is_empty() {
        return None;
    }
    Some(RuntimePod {
        uid: status.uid.clone(),
        name: status.name.clone(),
        namespace: status.namespace.clone(),
        sandboxes: status
            .sandbox_statuses
            .iter()
            .map(|s| PodSandbox {
                id: s.id.clone(),
                metadata: s.metadata.clone(),
                state: s.state,
                created_at: s.created_at,
                ..Default::default()
            })
            .collect(),
        containers: status
            .container_statuses
            .iter()
            .map(|c| Container {
                id: c.id.clone(),
                metadata: c.metadata.clone(),
                state: c.state,
                created_at: c.created_at,
                ..Default::default()
            })
            .collect(),
    })
}

/// What the PLEG saw of one pod at the previous relist (`old`) and at this one (`current`).
#[derive(Debug, Default)]
pub(crate) struct PodRecord {
    pub(crate) old: Option<RuntimePod>,
    pub(crate) current: Option<RuntimePod>,
}

/// All pod records (`podRecords`).
#[derive(Debug, Default)]
pub(crate) struct PodRecords {
    records: HashMap<String, PodRecord>,
}

impl PodRecords {
    /// Install this relist's view: pods absent from `pods` get no current view.
    pub(crate) fn set_current(&mut self, pods: Vec<RuntimePod>) {
        for r in self.records.values_mut() {
            r.current = None;
        }
        for pod in pods {
            let uid = pod.uid.clone();
            self.records.entry(uid).or_default().current = Some(pod);
        }
    }

    /// UIDs of every record, sorted.
    pub(crate) fn uids(&self) -> Vec<String> {
        let mut v: Vec<String> = self.records.keys().cloned().collect();
        kubelet_api::sort::by(&mut v, Ord::cmp);
        v
    }

    pub(crate) fn get(&self, uid: &str) -> Option<&PodRecord> {
        self.records.get(uid)
    }

    /// The baseline of pod `uid`'s next diff.
    pub(crate) fn old(&self, uid: &str) -> Option<&RuntimePod> {
        self.records.get(uid).and_then(|r| r.old.as_ref())
    }

    /// Set the baseline of pod `uid`'s next diff to `view` (an inspection's view, which may be
    /// older than the current listing when the inspection outlived its relist); `None` forgets
    /// the pod.
    pub(crate) fn set_old(&mut self, uid: &str, view: Option<RuntimePod>) {
        match view {
            Some(v) => self.records.entry(uid.to_string()).or_default().old = Some(v),
            None => {
                self.records.remove(uid);
            }
        }
    }

    /// The pod (UID, name, namespace) whose last known view has container or sandbox `id`.
    pub(crate) fn pod_of(&self, id: &str) -> Option<(String, String, String)> {
        self.records.iter().find_map(|(uid, r)| {
            [r.old.as_ref(), r.current.as_ref()]
                .into_iter()
                .flatten()
                .find(|p| {
                    p.containers.iter().any(|c| c.id == id)
                        || p.sandboxes.iter().any(|s| s.id == id)
                })
                .map(|p| (uid.clone(), p.name.clone(), p.namespace.clone()))
        })
    }

    /// Accept the current view as the baseline of the next diff; forget pods that are gone.
    pub(crate) fn update(&mut self, uid: &str) {
        let Some(r) = self.records.get_mut(uid) else {
            return;
        };
        match r.current.take() {
            Some(cur) => r.old = Some(cur),
            None => {
                self.records.remove(uid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use PodLifecycleEventType::*;

    #[test]
    fn transitions_match_the_kubelet_table() {
        use PlegState::*;
        let cases: &[(PlegState, PlegState, &[PodLifecycleEventType])] = &[
            (NonExistent, Running, &[ContainerStarted]),
            (Unknown, Running, &[ContainerStarted]),
            (Running, Exited, &[ContainerDied]),
            (NonExistent, Exited, &[ContainerDied]),
            (Running, Unknown, &[ContainerChanged]),
            (NonExistent, Unknown, &[ContainerChanged]),
            (Exited, NonExistent, &[ContainerRemoved]),
            (Running, NonExistent, &[ContainerDied, ContainerRemoved]),
            (Unknown, NonExistent, &[ContainerDied, ContainerRemoved]),
            (Running, Running, &[]),
            (Exited, Exited, &[]),
            (Exited, Running, &[ContainerStarted]),
        ];
        for (old, new, want) in cases {
            assert_eq!(
                events_for_transition(*old, *new),
                *want,
                "{old:?} -> {new:?}"
            );
        }
    }

    #[test]
    fn created_containers_are_unknown_and_not_ready_sandboxes_are_exited() {
        assert_eq!(PlegState::from(ContainerState::Created), PlegState::Unknown);
        assert_eq!(PlegState::from(SandboxState::NotReady), PlegState::Exited);
        assert_eq!(PlegState::from(SandboxState::Ready), PlegState::Running);
    }

    fn pod(
        containers: &[(&str, ContainerState)],
        sandboxes: &[(&str, SandboxState)],
    ) -> RuntimePod {
        RuntimePod {
            uid: "u".into(),
            containers: containers
                .iter()
                .map(|(id, state)| Container {
                    id: id.to_string(),
                    state: *state,
                    ..Default::default()
                })
                .collect(),
            sandboxes: sandboxes
                .iter()
                .map(|(id, state)| PodSandbox {
                    id: id.to_string(),
                    state: *state,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn kinds(events: &[PodLifecycleEvent]) -> Vec<(&str, PodLifecycleEventType)> {
        events
            .iter()
            .map(|e| (e.container_id.as_str(), e.kind))
            .collect()
    }

    #[test]
    fn pod_diff_covers_containers_and_sandboxes() {
        let old = pod(
            &[
                ("c1", ContainerState::Running),
                ("c2", ContainerState::Exited),
            ],
            &[("s1", SandboxState::Ready)],
        );
        let new = pod(
            &[
                ("c1", ContainerState::Exited),
                ("c3", ContainerState::Running),
            ],
            &[("s1", SandboxState::NotReady)],
        );
        let ev = compute_pod_events("u", Some(&old), Some(&new));
        assert_eq!(
            kinds(&ev),
            vec![
                ("c1", ContainerDied),
                ("c2", ContainerRemoved),
                ("s1", ContainerDied),
                ("c3", ContainerStarted),
            ]
        );
        assert!(ev.iter().all(|e| e.pod_uid == "u"));
    }

    #[test]
    fn a_vanished_pod_reports_died_and_removed_for_running_containers() {
        let old = pod(
            &[("c1", ContainerState::Running)],
            &[("s1", SandboxState::Ready)],
        );
        let ev = compute_pod_events("u", Some(&old), None);
        assert_eq!(
            kinds(&ev),
            vec![
                ("c1", ContainerDied),
                ("c1", ContainerRemoved),
                ("s1", ContainerDied),
                ("s1", ContainerRemoved),
            ]
        );
    }

    #[test]
    fn records_advance_and_forget_vanished_pods() {
        let mut r = PodRecords::default();
        r.set_current(vec![pod(&[("c1", ContainerState::Running)], &[])]);
        r.update("u");
        assert!(
            r.get("u")
                .is_some_and(|p| p.old.is_some() && p.current.is_none())
        );
        r.set_current(vec![]);
        assert!(
            r.get("u")
                .is_some_and(|p| p.old.is_some() && p.current.is_none())
        );
        r.update("u");
        assert!(r.get("u").is_none());
        assert!(r.uids().is_empty());
    }
}
