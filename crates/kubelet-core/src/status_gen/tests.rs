//! Table tests of status generation.

use super::*;
use k8s_openapi::api::core::v1::{PodReadinessGate, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kubelet_api::resources::QosClass;
use std::collections::BTreeMap;

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
    let c = |name, policy, inits: Vec<Container>, init_statuses, statuses, terminal, want| Case {
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
    {
        let mut v = runtime::ContainerStatus::default();
        v.id = id.into();
        v.metadata = runtime::ContainerMetadata {
            name: name.into(),
            attempt,
        };
        v.state = state;
        v.created_at = ts(created);
        v.started_at = Some(ts(created + 1));
        v.finished_at = (state == runtime::ContainerState::Exited).then(|| ts(created + 5));
        v.exit_code = exit;
        v.image = format!("img-{name}");
        v.image_ref = format!("sha256:{name}");
        v.reason = match (state, exit) {
            (runtime::ContainerState::Exited, 0) => "Completed".into(),
            (runtime::ContainerState::Exited, _) => "Error".into(),
            _ => String::new(),
        };
        v.annotations = annotations;
        v
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

fn cond(s: &PodStatus, t: PodConditionType) -> &PodCondition {
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
    assert_eq!(cond(&s, PodConditionType::Ready).status, "True");
    assert_eq!(cond(&s, PodConditionType::ContainersReady).status, "True");
    assert_eq!(cond(&s, PodConditionType::Initialized).status, "True");
    assert_eq!(
        cond(&s, PodConditionType::PodReadyToStartContainers).status,
        "True"
    );
    assert_eq!(cond(&s, PodConditionType::PodScheduled).status, "True");
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
    let c = cond(&s, PodConditionType::ContainersReady);
    assert_eq!(c.status, "False");
    assert_eq!(c.reason.as_deref(), Some("ContainersNotReady"));
    assert_eq!(
        c.message.as_deref(),
        Some("containers with unready status: [a]")
    );
    let r = cond(&s, PodConditionType::Ready);
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
    let init = cond(&s, PodConditionType::Initialized);
    assert_eq!(init.status, "False");
    assert_eq!(init.reason.as_deref(), Some("ContainersNotInitialized"));
    assert_eq!(
        init.message.as_deref(),
        Some("containers with incomplete status: [init]")
    );
    assert_eq!(
        cond(&s, PodConditionType::ContainersReady)
            .message
            .as_deref(),
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
    assert_eq!(cond(&s, PodConditionType::Initialized).status, "True");
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
    let c = cond(&s, PodConditionType::ContainersReady);
    assert_eq!(c.reason.as_deref(), Some("PodFailed"));
    assert_eq!(
        cond(&s, PodConditionType::Ready).reason.as_deref(),
        Some("PodFailed")
    );
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
    let init = cond(&s, PodConditionType::Initialized);
    assert_eq!(
        (init.status.as_str(), init.reason.as_deref()),
        ("True", Some("PodCompleted"))
    );
    let cr = cond(&s, PodConditionType::ContainersReady);
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
        cond(&s, PodConditionType::Initialized).message.as_deref(),
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
    assert_eq!(cond(&s, PodConditionType::Initialized).status, "True");
    assert_eq!(cond(&s, PodConditionType::ContainersReady).status, "True");
    assert_eq!(s.phase.as_deref(), Some(PodPhase::Running.as_str()));
}

#[test]
fn last_transition_time_is_kept_while_status_unchanged() {
    let p = pod("Always", vec![], &["a"]);
    let mut g = Gen::new(&p, rt(vec![rc("a", "ida", Created, 0, 0, 0)]));
    g.now = ts(100);
    let first = g.run();
    assert_eq!(cond(&first, PodConditionType::Ready).status, "False");
    g.old = Some(first);
    g.now = ts(200);
    let second = g.run();
    assert_eq!(
        cond(&second, PodConditionType::Ready).last_transition_time,
        Some(Time(ts(100)))
    );
    assert_eq!(
        cond(&second, PodConditionType::PodScheduled).last_transition_time,
        Some(Time(ts(100)))
    );
    g.old = Some(second);
    g.rt = rt(vec![rc("a", "ida", Running, 0, 0, 0)]);
    g.now = ts(300);
    let third = g.run();
    assert_eq!(cond(&third, PodConditionType::Ready).status, "True");
    assert_eq!(
        cond(&third, PodConditionType::Ready).last_transition_time,
        Some(Time(ts(300)))
    );
    assert_eq!(
        cond(&third, PodConditionType::PodScheduled).last_transition_time,
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
    let r = cond(&s, PodConditionType::Ready);
    assert_eq!(r.status, "False");
    assert_eq!(r.reason.as_deref(), Some("ReadinessGatesNotReady"));
    assert_eq!(
        r.message.as_deref(),
        Some("corresponding condition of pod readiness gate \"example.com/lb\" does not exist.")
    );
    let mut old = s.clone();
    old.conditions.get_or_insert_with(Vec::new).extend([
        PodCondition {
            type_: "example.com/lb".into(),
            status: "True".into(),
            ..Default::default()
        },
        condition(
            PodConditionType::DisruptionTarget,
            true,
            Some("TerminationByKubelet"),
            None,
        ),
    ]);
    g.old = Some(old);
    let s = g.run();
    assert_eq!(cond(&s, PodConditionType::Ready).status, "True");
    assert_eq!(
        cond(&s, PodConditionType::DisruptionTarget)
            .reason
            .as_deref(),
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
    let q = |s: &str| kubelet_api::quantity::parse_nanos(&Quantity(s.into()).0);
    assert_eq!(q("1"), Some(1_000_000_000));
    assert_eq!(q("500m"), Some(500_000_000));
    assert_eq!(q("0.5"), q("500m"));
    assert_eq!(q("1Ki"), Some(1024 * 1_000_000_000));
    assert_eq!(q("1e3"), q("1k"));
    assert_eq!(q("abc"), None);
    assert_eq!(q(""), None);
}

mod properties {
    //! Random pods and container statuses through `get_phase`: no panic, and the kubelet's
    //! invariants hold.
    use super::*;
    use proptest::prelude::*;

    /// A container's API status: none, waiting (with or without a last exit), running
    /// (started or not), or terminated with a code.
    fn api_status(name: &str, kind: u8, code: i32) -> Option<ContainerStatus> {
        match kind {
            0 => None,
            1 => Some(waiting_status(name, None)),
            2 => Some(waiting_status(name, Some(code))),
            3 => Some(running(name, code == 0)),
            _ => Some(exited(name, code)),
        }
    }

    prop_compose! {
        fn scenario()(
            policy in prop_oneof![Just("Always"), Just("OnFailure"), Just("Never")],
            inits in proptest::collection::vec((any::<bool>(), 0u8..5, prop_oneof![Just(0), Just(1)]), 0..3),
            regular in proptest::collection::vec((0u8..5, prop_oneof![Just(0), Just(1), Just(2)]), 1..4),
            terminal in any::<bool>(),
        ) -> (Pod, Vec<ContainerStatus>, Vec<ContainerStatus>, bool) {
            let init: Vec<Container> = inits
                .iter()
                .enumerate()
                .map(|(i, (side, _, _))| if *side { sidecar(&format!("i{i}")) } else { container(&format!("i{i}")) })
                .collect();
            let names: Vec<String> = (0..regular.len()).map(|i| format!("c{i}")).collect();
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            let p = pod(policy, init, &refs);
            let init_statuses = inits
                .iter()
                .enumerate()
                .filter_map(|(i, (_, k, code))| api_status(&format!("i{i}"), *k, *code))
                .collect();
            let statuses = regular
                .iter()
                .enumerate()
                .filter_map(|(i, (k, code))| api_status(&format!("c{i}"), *k, *code))
                .collect();
            (p, init_statuses, statuses, terminal)
        }
    }

    proptest! {
        #[test]
        fn succeeded_only_when_every_container_exited_zero((p, init, regular, terminal) in scenario()) {
            let phase = get_phase(&p, &init, &regular, terminal);
            if phase == PodPhase::Succeeded {
                for c in podutil::containers(&p) {
                    let s = regular.iter().find(|s| s.name == c.name);
                    let zero = s
                        .and_then(|s| s.state.as_ref())
                        .and_then(|st| st.terminated.as_ref())
                        .is_some_and(|t| t.exit_code == 0);
                    prop_assert!(zero, "Succeeded with {} not terminated with 0: {s:?}", c.name);
                }
            }
            // A failed init container under restartPolicy Never fails the pod.
            let init_failed = podutil::init_containers(&p).iter().filter(|c| !podutil::is_sidecar(c)).any(|c| {
                init.iter().any(|s| {
                    s.name == c.name
                        && s.state.as_ref().and_then(|st| st.terminated.as_ref()).is_some_and(|t| t.exit_code != 0)
                })
            });
            if init_failed && podutil::restart_policy(&p) == RestartPolicy::Never {
                prop_assert_eq!(phase, PodPhase::Failed);
            }
            // restartPolicy Always: a pod the agent has not terminated never fails.
            if podutil::restart_policy(&p) == RestartPolicy::Always && !terminal {
                prop_assert_ne!(phase, PodPhase::Failed);
            }
        }
    }
}
