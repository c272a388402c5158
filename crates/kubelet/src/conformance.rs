//! The runtime conformance kit's engine section: the SDK's engine runs a small fixed set of pods
//! on the runtime under test, and the outcomes a kubelet user relies on are checked.
//!
//! The per-call checks of [`kubelet_api::conformance`] ask the runtime one question at a time;
//! this section asks what the pods do when the engine drives the runtime for a bounded time
//! (one minute by default). The pods are not host-network, so a runtime without pod networking
//! is held to the [sandbox network
//! contract](kubelet_api::runtime::PodSandboxStatus#the-sandbox-network-contract):
//!
//! | check | pod | outcome |
//! |---|---|---|
//! | `engine_steady_pod_keeps_its_sandbox` | `sleep`, restartPolicy Always | Running and Ready, one sandbox, no `SandboxChanged`, restartCount 0, a pod IP |
//! | `engine_crash_loop_backs_off` | exits 1, restartPolicy Always | restartCount ≥ 2, `CrashLoopBackOff`, last state exit code 1 |
//! | `engine_phases_follow_the_restart_policy` | exits 0 with OnFailure; exits 3 with Never | `Succeeded`; `Failed` with exit code 3 and reason `Error` |
//! | `engine_liveness_failure_restarts_the_container` | exec liveness probe that fails | `Unhealthy`, restartCount ≥ 1 |
//! | `engine_deleted_pod_leaves_nothing` | `sleep`, deleted once Running | status removed; no sandbox or container of the pod left |
//!
//! ```no_run
//! use std::sync::Arc;
//! use kubelet::conformance::{EngineConformanceConfig, run_engine_conformance};
//! # async fn demo(runtime: Arc<dyn kubelet::seams::ContainerRuntime>) {
//! let dir = std::env::temp_dir().join("engine-conformance");
//! let report = run_engine_conformance(runtime, &EngineConformanceConfig::new("busybox", dir)).await;
//! report.assert_passed();
//! # }
//! ```
//!
//! Feature `testing`. The pods live in namespace `engine-conformance`; whatever of them the
//! runtime still holds at the end is stopped and removed, also after a failure.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Container, ExecAction, Pod, PodSpec, PodStatus, Probe as K8sProbe,
};
use kubelet_api::ContainerRuntime;
use kubelet_api::conformance::{Outcome, Report};
use kubelet_api::runtime::{
    Container as RuntimeContainer, ContainerFilter, Labels, PodSandbox, SandboxFilter, labels,
};
use kubelet_core::testing::{RecordingSink, WatchSource};
use kubelet_core::{KubeletBuilder, KubeletConfig};
use tokio_util::sync::CancellationToken;

/// The namespace of the section's pods.
pub const NAMESPACE: &str = "engine-conformance";

/// How to run the engine section.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EngineConformanceConfig {
    /// Image of every container.
    pub image: String,
    /// The shell prefix of containers' commands (`["/bin/sh", "-c"]`).
    pub shell: Vec<String>,
    /// Directory for the engine's root and pod log directories (removed at the end).
    pub dir: PathBuf,
    /// The node IP the engine is given (`KubeletConfig::node_ip`): what a pod whose sandbox
    /// uses the node's network shows as its IP.
    pub node_ip: String,
    /// Run the exec liveness probe check (the runtime implements `exec_sync`).
    pub exec: bool,
    /// The bound of the whole section.
    pub timeout: Duration,
}

impl EngineConformanceConfig {
    /// Containers from `image` with `/bin/sh -c`, state under `dir`, node IP 192.0.2.1 (a
    /// documentation address), the exec check on, one minute.
    pub fn new(image: impl Into<String>, dir: impl Into<PathBuf>) -> Self {
        Self {
            image: image.into(),
            shell: vec!["/bin/sh".into(), "-c".into()],
            dir: dir.into(),
            node_ip: "192.0.2.1".into(),
            exec: true,
            timeout: Duration::from_secs(60),
        }
    }

    /// Sets [`exec`](Self::exec).
    pub fn exec(mut self, on: bool) -> Self {
        self.exec = on;
        self
    }

    /// Sets [`timeout`](Self::timeout).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

const STEADY: &str = "steady";
const CRASH: &str = "crash";
const JOB_OK: &str = "job-ok";
const JOB_FAIL: &str = "job-fail";
const LIVENESS: &str = "liveness";
const DELETED: &str = "deleted";

fn uid(name: &str) -> String {
    format!("{NAMESPACE}-{name}")
}

/// Runs the engine section against `runtime`. Never panics: what goes wrong is a failed check.
pub async fn run_engine_conformance(
    runtime: Arc<dyn ContainerRuntime>,
    config: &EngineConformanceConfig,
) -> Report {
    let section = Section {
        runtime: runtime.clone(),
        config,
        sink: Arc::new(RecordingSink::new()),
    };
    let report = section.run().await;
    section.cleanup().await;
    let _ = std::fs::remove_dir_all(&config.dir);
    report
}

struct Section<'a> {
    runtime: Arc<dyn ContainerRuntime>,
    config: &'a EngineConformanceConfig,
    sink: Arc<RecordingSink>,
}

/// What is still awaited of one check, or its result.
type Verdict = Option<Result<(), String>>;

impl Section<'_> {
    fn pod(&self, name: &str, policy: &str, script: &str) -> Pod {
        let mut command = self.config.shell.clone();
        command.push(script.into());
        let mut p = Pod {
            spec: Some(PodSpec {
                restart_policy: Some(policy.into()),
                containers: vec![Container {
                    name: name.into(),
                    image: Some(self.config.image.clone()),
                    command: Some(command),
                    image_pull_policy: Some("IfNotPresent".into()),
                    ..Default::default()
                }],
                termination_grace_period_seconds: Some(2),
                ..Default::default()
            }),
            ..Default::default()
        };
        p.metadata.name = Some(name.into());
        p.metadata.namespace = Some(NAMESPACE.into());
        p.metadata.uid = Some(uid(name));
        p
    }

    fn pods(&self) -> Vec<Pod> {
        let mut pods = vec![
            self.pod(STEADY, "Always", "sleep 3600"),
            self.pod(CRASH, "Always", "echo crashing; exit 1"),
            self.pod(JOB_OK, "OnFailure", "echo done; exit 0"),
            self.pod(JOB_FAIL, "Never", "echo failed; exit 3"),
            self.pod(DELETED, "Always", "sleep 3600"),
        ];
        if self.config.exec {
            let mut p = self.pod(LIVENESS, "Always", "sleep 3600");
            let mut probe_command = self.config.shell.clone();
            probe_command.push("exit 1".into());
            if let Some(c) = p.spec.as_mut().and_then(|s| s.containers.first_mut()) {
                c.liveness_probe = Some(K8sProbe {
                    exec: Some(ExecAction {
                        command: Some(probe_command),
                    }),
                    period_seconds: Some(1),
                    failure_threshold: Some(1),
                    timeout_seconds: Some(5),
                    ..Default::default()
                });
            }
            pods.push(p);
        }
        pods
    }

    async fn run(&self) -> Report {
        let (source, pods_tx) = WatchSource::new(Some(self.pods()));
        let mut engine_config =
            KubeletConfig::with_dirs(self.config.dir.join("root"), self.config.dir.join("logs"));
        engine_config.node_ip = Some(self.config.node_ip.clone());
        let (pleg, pleg_events) = kubelet_pleg::GenericPleg::new(
            self.runtime.clone(),
            kubelet_pleg::GenericPlegConfig::default(),
        );
        let mut builder = KubeletBuilder::new("engine-conformance-node")
            .config(engine_config)
            .runtime(self.runtime.clone())
            .pleg(Arc::new(pleg), pleg_events)
            .pod_source(Arc::new(source))
            .status_sink(self.sink.clone());
        if let Some((prober, updates)) = crate::make_prober(false) {
            builder = builder.prober(prober, updates);
        }
        let mut checks: Vec<(&'static str, Verdict)> = vec![
            ("engine_steady_pod_keeps_its_sandbox", None),
            ("engine_crash_loop_backs_off", None),
            ("engine_phases_follow_the_restart_policy", None),
            (
                "engine_liveness_failure_restarts_the_container",
                (!self.config.exec || cfg!(not(feature = "probe"))).then_some(Ok(())),
            ),
            ("engine_deleted_pod_leaves_nothing", None),
        ];
        let skipped_liveness = checks[3].1.is_some();
        let engine = match builder.build() {
            Ok(e) => e,
            Err(e) => {
                let m = format!("assembling the engine: {}", kubelet_api::chain(&e));
                return report(
                    checks
                        .into_iter()
                        .map(|(n, _)| (n, Some(Err(m.clone()))))
                        .collect(),
                    skipped_liveness,
                );
            }
        };
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(engine.run(shutdown.clone()));

        let started = tokio::time::Instant::now();
        let deadline = started + self.config.timeout;
        // A steady pod is judged after it has run this long: an engine that re-creates its
        // sandbox does so on every sync (about once a second).
        let steady_for = Duration::from_secs(10).min(self.config.timeout / 2);
        let mut deleted_at: Option<tokio::time::Instant> = None;
        loop {
            let now = tokio::time::Instant::now();
            let late = now >= deadline;
            if checks[0].1.is_none() {
                checks[0].1 = self.steady(now - started >= steady_for, late).await;
            }
            if checks[1].1.is_none() {
                checks[1].1 = self.crash_loop(late);
            }
            if checks[2].1.is_none() {
                checks[2].1 = self.phases(late);
            }
            if checks[3].1.is_none() {
                checks[3].1 = self.liveness(late);
            }
            if checks[4].1.is_none() {
                if deleted_at.is_none() && self.running(DELETED) {
                    let remaining: Vec<Pod> = self
                        .pods()
                        .into_iter()
                        .filter(|p| p.metadata.name.as_deref() != Some(DELETED))
                        .collect();
                    let _ = pods_tx.send(Some(remaining));
                    deleted_at = Some(now);
                }
                checks[4].1 = self.deleted(deleted_at.is_some(), late).await;
            }
            if checks.iter().all(|(_, v)| v.is_some()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        shutdown.cancel();
        let _ = task.await;
        report(checks, skipped_liveness)
    }

    fn latest(&self, name: &str) -> Option<PodStatus> {
        self.sink.latest(&uid(name))
    }

    fn running(&self, name: &str) -> bool {
        self.latest(name)
            .is_some_and(|s| s.phase.as_deref() == Some("Running"))
    }

    fn events(&self, name: &str, reason: &str) -> Vec<String> {
        let uid = uid(name);
        self.sink
            .events()
            .into_iter()
            .filter(|e| e.involved.uid == uid && e.reason == reason)
            .map(|e| e.message)
            .collect()
    }

    fn restart_count(s: &PodStatus) -> i32 {
        s.container_statuses
            .iter()
            .flatten()
            .map(|c| c.restart_count)
            .max()
            .unwrap_or(0)
    }

    /// The sandboxes and containers labelled `label: value`.
    async fn labelled(
        &self,
        label: &str,
        value: String,
    ) -> Result<(Vec<PodSandbox>, Vec<RuntimeContainer>), String> {
        let mut selector = Labels::new();
        selector.insert(label.into(), value);
        let sandboxes = self
            .runtime
            .list_pod_sandboxes(&SandboxFilter {
                label_selector: selector.clone(),
                ..Default::default()
            })
            .await
            .map_err(|e| format!("list_pod_sandboxes: {}", kubelet_api::chain(&e)))?;
        let containers = self
            .runtime
            .list_containers(&ContainerFilter {
                label_selector: selector,
                ..Default::default()
            })
            .await
            .map_err(|e| format!("list_containers: {}", kubelet_api::chain(&e)))?;
        Ok((sandboxes, containers))
    }

    /// How many sandboxes and containers pod `name` has in the runtime.
    async fn of_pod(&self, name: &str) -> Result<(usize, usize), String> {
        let (sandboxes, containers) = self.labelled(labels::POD_UID, uid(name)).await?;
        Ok((sandboxes.len(), containers.len()))
    }

    async fn steady(&self, long_enough: bool, late: bool) -> Verdict {
        if let Some(m) = self.events(STEADY, "SandboxNetworkInvalid").first() {
            return Some(Err(format!(
                "the sandbox's network report breaks the sandbox network contract \
                 (PodSandboxStatus): {m}"
            )));
        }
        let changed = self.events(STEADY, "SandboxChanged");
        if !changed.is_empty() {
            return Some(Err(format!(
                "{} SandboxChanged events on a steady pod: the engine re-created its sandbox; \
                 a runtime without pod networking must report host_network (the sandbox \
                 network contract on PodSandboxStatus)",
                changed.len()
            )));
        }
        let latest = self.latest(STEADY);
        let ready = latest.as_ref().is_some_and(|s| {
            s.phase.as_deref() == Some("Running")
                && s.conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
        });
        if !ready {
            return late.then(|| {
                Err(format!(
                    "not Running and Ready within the bound; latest status: {latest:?}"
                ))
            });
        }
        if !long_enough && !late {
            return None;
        }
        let status = latest.unwrap_or_default();
        let restarts = Self::restart_count(&status);
        if restarts != 0 {
            return Some(Err(format!("restartCount {restarts}, want 0")));
        }
        if status.pod_ip.as_deref().unwrap_or("").is_empty() {
            return Some(Err("no pod IP in the status".into()));
        }
        match self.of_pod(STEADY).await {
            Ok((1, _)) => Some(Ok(())),
            Ok((n, _)) => Some(Err(format!("{n} sandboxes of the steady pod, want 1"))),
            Err(e) => Some(Err(e)),
        }
    }

    fn crash_loop(&self, late: bool) -> Verdict {
        let statuses = self.sink.statuses(&uid(CRASH));
        let backed_off = statuses.iter().any(|s| {
            s.container_statuses.iter().flatten().any(|c| {
                c.state
                    .as_ref()
                    .and_then(|st| st.waiting.as_ref())
                    .and_then(|w| w.reason.as_deref())
                    == Some("CrashLoopBackOff")
            })
        });
        let latest = statuses.last().cloned().unwrap_or_default();
        let restarts = Self::restart_count(&latest);
        let last_exit = latest
            .container_statuses
            .iter()
            .flatten()
            .find_map(|c| c.last_state.as_ref()?.terminated.as_ref())
            .map(|t| t.exit_code);
        if backed_off && restarts >= 2 {
            return Some(match last_exit {
                Some(1) => Ok(()),
                other => Err(format!("last state exit code {other:?}, want 1")),
            });
        }
        late.then(|| {
            Err(format!(
                "restartCount {restarts} and CrashLoopBackOff seen: {backed_off} within the \
                 bound (want ≥ 2 and seen); latest status: {latest:?}"
            ))
        })
    }

    fn phases(&self, late: bool) -> Verdict {
        let ok = self.latest(JOB_OK);
        let failed = self.latest(JOB_FAIL);
        let phase =
            |s: &Option<PodStatus>| s.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
        let (ok_phase, failed_phase) = (phase(&ok), phase(&failed));
        if ok_phase == "Succeeded" && failed_phase == "Failed" {
            let terminated = failed
                .unwrap_or_default()
                .container_statuses
                .into_iter()
                .flatten()
                .find_map(|c| c.state?.terminated);
            return Some(match terminated {
                Some(t) if t.exit_code == 3 && t.reason.as_deref() == Some("Error") => Ok(()),
                other => Err(format!(
                    "the Never pod's container ended as {other:?}, want exit code 3 and reason Error"
                )),
            });
        }
        if failed_phase == "Succeeded" || ok_phase == "Failed" {
            return Some(Err(format!(
                "OnFailure pod exiting 0 is {ok_phase}, Never pod exiting 3 is {failed_phase}"
            )));
        }
        late.then(|| {
            Err(format!(
                "OnFailure pod exiting 0 is {ok_phase:?} (want Succeeded), Never pod exiting 3 \
                 is {failed_phase:?} (want Failed) at the bound"
            ))
        })
    }

    fn liveness(&self, late: bool) -> Verdict {
        let unhealthy = !self.events(LIVENESS, "Unhealthy").is_empty();
        let restarts = self
            .latest(LIVENESS)
            .map(|s| Self::restart_count(&s))
            .unwrap_or(0);
        if unhealthy && restarts >= 1 {
            return Some(Ok(()));
        }
        late.then(|| {
            Err(format!(
                "Unhealthy event: {unhealthy}, restartCount {restarts} (want an event and ≥ 1)"
            ))
        })
    }

    async fn deleted(&self, was_deleted: bool, late: bool) -> Verdict {
        if !was_deleted {
            return late.then(|| Err("never Running, so never deleted".into()));
        }
        let removed = self.sink.removed().contains(&uid(DELETED));
        let left = match self.of_pod(DELETED).await {
            Ok(counts) => counts,
            Err(e) => return Some(Err(e)),
        };
        if removed && left == (0, 0) {
            return Some(Ok(()));
        }
        late.then(|| {
            Err(format!(
                "after deletion: status removed {removed}, {} sandboxes and {} containers left",
                left.0, left.1
            ))
        })
    }

    /// Stops and removes whatever of the section's pods the runtime still holds.
    async fn cleanup(&self) {
        let Ok((sandboxes, containers)) =
            self.labelled(labels::POD_NAMESPACE, NAMESPACE.into()).await
        else {
            return;
        };
        for c in containers {
            let _ = self.runtime.stop_container(&c.id, Duration::ZERO).await;
            let _ = self.runtime.remove_container(&c.id).await;
        }
        for s in sandboxes {
            let _ = self.runtime.stop_pod_sandbox(&s.id).await;
            let _ = self.runtime.remove_pod_sandbox(&s.id).await;
        }
    }
}

fn report(checks: Vec<(&'static str, Verdict)>, skipped_liveness: bool) -> Report {
    let mut report = Report::default();
    for (i, (name, verdict)) in checks.into_iter().enumerate() {
        let outcome = match verdict {
            _ if i == 3 && skipped_liveness => Outcome::Skipped,
            Some(Ok(())) => Outcome::Passed,
            Some(Err(m)) => Outcome::Failed(m),
            None => Outcome::Failed("not judged within the bound".into()),
        };
        report.checks.push((name, outcome));
    }
    report
}
