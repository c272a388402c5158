//! How the prober reaches containers: what it observes about them before each probe, and how it
//! runs commands inside them.
//!
//! The engine's adapter is [`StatusTargets`] (pod statuses from the status manager, exec through
//! the [`ContainerRuntime`]). Without the engine, use [`StaticTargets`] and keep it up to date, or
//! implement [`ProbeTargets`] over your own state.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use kubelet_api::ContainerRuntime;
use kubelet_api::StatusReader;
use kubelet_api::runtime::ExecResult;
use kubelet_api::runtime::strip_container_id;
use parking_lot::RwLock;
use tokio::time::Instant;

/// What the prober sees of one container right before a probe (the kubelet's `doProbe` reads
/// the same from the status manager).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observation {
    /// Nothing known about the pod yet: wait.
    NoStatus,
    /// The pod is `Succeeded` or `Failed`: the probe's worker stops.
    PodTerminal,
    /// The container has no instance yet: wait.
    NoContainer,
    /// The current instance of the container.
    Container(ContainerObservation),
}

/// One container instance as the prober sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ContainerObservation {
    /// Runtime container ID (without `<runtime>://`). A new ID means the container restarted:
    /// its results are reset.
    pub container_id: String,
    /// When it started running (on the `tokio::time` clock), `None` if it is not running.
    pub running_since: Option<Instant>,
    /// It has terminated (as opposed to not started yet).
    pub terminated: bool,
    /// The pod is being deleted (liveness and startup go quiet, readiness keeps probing).
    pub pod_deleting: bool,
    /// The pod's IP, the default host of network probes.
    pub pod_ip: Option<String>,
}

impl ContainerObservation {
    /// A container instance that has been running since `since`.
    pub fn running(
        container_id: impl Into<String>,
        since: Instant,
        pod_ip: Option<String>,
    ) -> Self {
        Self {
            container_id: container_id.into(),
            running_since: Some(since),
            terminated: false,
            pod_deleting: false,
            pod_ip,
        }
    }

    /// A container instance that has exited.
    pub fn exited(container_id: impl Into<String>) -> Self {
        Self {
            container_id: container_id.into(),
            running_since: None,
            terminated: true,
            pod_deleting: false,
            pod_ip: None,
        }
    }

    /// Mark the pod as being deleted.
    pub fn deleting(mut self) -> Self {
        self.pod_deleting = true;
        self
    }
}

/// Why an exec probe could not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecFailure {
    /// The command did not finish within the probe's timeout (a probe Failure).
    Timeout,
    /// Any other error (a probe error, thrown away unless errors count as failures).
    Error(String),
}

/// The prober's view of the world. One implementation serves all probes, so it must be cheap:
/// [`observe`](Self::observe) runs before every probe, on the scheduler.
#[async_trait]
pub trait ProbeTargets: Send + Sync + 'static {
    /// The current state of container `container` of pod `pod_uid`.
    fn observe(&self, pod_uid: &str, container: &str) -> Observation;

    /// Run `cmd` in container `container_id`, at most `timeout`.
    async fn exec(
        &self,
        container_id: &str,
        cmd: &[String],
        timeout: Duration,
    ) -> Result<ExecResult, ExecFailure>;
}

fn _assert_targets_dyn(_: &dyn ProbeTargets) {}

async fn runtime_exec(
    runtime: &dyn ContainerRuntime,
    container_id: &str,
    cmd: &[String],
    timeout: Duration,
) -> Result<ExecResult, ExecFailure> {
    match runtime.exec_sync(container_id, cmd, timeout).await {
        Ok(r) => Ok(r),
        Err(e) if e.kind() == kubelet_api::ErrorKind::DeadlineExceeded => Err(ExecFailure::Timeout),
        Err(e) => Err(ExecFailure::Error(e.to_string())),
    }
}

/// The engine's targets: pod statuses from the status manager (container IDs, start times, pod
/// IP, phase, deletion), exec through the container runtime.
#[derive(Clone)]
pub struct StatusTargets {
    statuses: StatusReader,
    runtime: Arc<dyn ContainerRuntime>,
}

impl std::fmt::Debug for StatusTargets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusTargets").finish_non_exhaustive()
    }
}

impl StatusTargets {
    /// Targets over the engine's statuses and runtime.
    pub fn new(statuses: StatusReader, runtime: Arc<dyn ContainerRuntime>) -> Self {
        Self { statuses, runtime }
    }
}

#[async_trait]
impl ProbeTargets for StatusTargets {
    fn observe(&self, pod_uid: &str, container: &str) -> Observation {
        let Some(p) = self.statuses.get(pod_uid) else {
            return Observation::NoStatus;
        };
        if matches!(p.status.phase.as_deref(), Some("Succeeded" | "Failed")) {
            return Observation::PodTerminal;
        }
        let cs = p
            .status
            .container_statuses
            .iter()
            .flatten()
            .chain(p.status.init_container_statuses.iter().flatten())
            .find(|c| c.name == container);
        let Some(cs) = cs else {
            return Observation::NoContainer;
        };
        let Some(id) = cs.container_id.as_deref().filter(|s| !s.is_empty()) else {
            return Observation::NoContainer;
        };
        let state = cs.state.as_ref();
        let running_since = state.and_then(|s| s.running.as_ref()).map(|r| {
            let now = Instant::now();
            let Some(started) = &r.started_at else {
                return now;
            };
            let ago = jiff::Timestamp::now().duration_since(started.0);
            let ago = Duration::try_from(ago).unwrap_or(Duration::ZERO);
            now.checked_sub(ago).unwrap_or(now)
        });
        Observation::Container(ContainerObservation {
            container_id: strip_container_id(id).to_string(),
            running_since,
            terminated: state.is_some_and(|s| s.terminated.is_some()),
            pod_deleting: p.pod.metadata.deletion_timestamp.is_some(),
            pod_ip: p.status.pod_ip.clone().filter(|s| !s.is_empty()),
        })
    }

    async fn exec(
        &self,
        container_id: &str,
        cmd: &[String],
        timeout: Duration,
    ) -> Result<ExecResult, ExecFailure> {
        runtime_exec(self.runtime.as_ref(), container_id, cmd, timeout).await
    }
}

/// Targets kept up to date by the caller, for using the prober without the engine: record each
/// container instance with [`set`](Self::set) (a new ID is a restart), mark pods finished with
/// [`set_pod_terminal`](Self::set_pod_terminal). Exec probes go to the runtime given to
/// [`with_runtime`](Self::with_runtime), or fail with an error without one.
#[derive(Clone, Default)]
pub struct StaticTargets {
    pods: Arc<RwLock<HashMap<String, StaticPod>>>,
    runtime: Option<Arc<dyn ContainerRuntime>>,
}

#[derive(Debug, Clone, Default)]
struct StaticPod {
    terminal: bool,
    containers: HashMap<String, ContainerObservation>,
}

impl std::fmt::Debug for StaticTargets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StaticTargets")
            .field("pods", &self.pods.read().len())
            .finish_non_exhaustive()
    }
}

impl StaticTargets {
    /// Empty targets without exec support.
    pub fn new() -> Self {
        Self::default()
    }

    /// Empty targets whose exec probes run through `runtime`'s `exec_sync`.
    pub fn with_runtime(runtime: Arc<dyn ContainerRuntime>) -> Self {
        Self {
            pods: Arc::default(),
            runtime: Some(runtime),
        }
    }

    /// Record the current instance of `container` in pod `pod_uid`.
    pub fn set(&self, pod_uid: &str, container: &str, observation: ContainerObservation) {
        self.pods
            .write()
            .entry(pod_uid.to_string())
            .or_default()
            .containers
            .insert(container.to_string(), observation);
    }

    /// Mark pod `pod_uid` as finished (`Succeeded` / `Failed`): its probes stop.
    pub fn set_pod_terminal(&self, pod_uid: &str) {
        self.pods
            .write()
            .entry(pod_uid.to_string())
            .or_default()
            .terminal = true;
    }

    /// Forget pod `pod_uid`.
    pub fn remove_pod(&self, pod_uid: &str) {
        self.pods.write().remove(pod_uid);
    }
}

#[async_trait]
impl ProbeTargets for StaticTargets {
    fn observe(&self, pod_uid: &str, container: &str) -> Observation {
        let pods = self.pods.read();
        let Some(p) = pods.get(pod_uid) else {
            return Observation::NoStatus;
        };
        if p.terminal {
            return Observation::PodTerminal;
        }
        match p.containers.get(container) {
            Some(c) => Observation::Container(c.clone()),
            None => Observation::NoContainer,
        }
    }

    async fn exec(
        &self,
        container_id: &str,
        cmd: &[String],
        timeout: Duration,
    ) -> Result<ExecResult, ExecFailure> {
        match &self.runtime {
            Some(rt) => runtime_exec(rt.as_ref(), container_id, cmd, timeout).await,
            None => Err(ExecFailure::Error(
                "exec probes need a runtime (StaticTargets::with_runtime)".to_string(),
            )),
        }
    }
}
