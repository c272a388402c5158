//! Per-pod work: `sync_pod` (status, volumes, runtime actions), termination with preStop hooks and
//! sidecar ordering, and cleanup. Driven by the pod workers in [`crate::kubelet`].

use crate::pod_start::PodStartMetrics;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod};
use parking_lot::Mutex;
use rand::Rng;
use tokio::time::Instant;

use crate::actions::{self, KillReason};
use crate::agent_config::KubeletConfig;
use crate::backoff::Backoff;
use crate::container::{self, ConfigContext};
use crate::env_objects::EnvObjects;
use crate::status_gen::{self, StatusInput};
use crate::status_manager::StatusManager;
use kubelet_api::ContainerRuntime;
use kubelet_api::KillPodOptions;
use kubelet_api::ObjectProvider;
use kubelet_api::PodLifecycleEventGenerator;
use kubelet_api::VolumePlugin;
use kubelet_api::pod::{self, PullPolicy};
use kubelet_api::runtime::{
    ContainerState, ContainerStatus, DnsConfig, ImageSpec, PodRuntimeStatus, PodSandboxConfig,
    PodSandboxMetadata, PodSandboxStatus, PortMapping, Protocol, SandboxState, get_pod_status,
};
use kubelet_api::{CacheEntry, PodCache};
use kubelet_api::{EventRecorder, InvolvedObject};
use kubelet_api::{ProbeManager, ProbeResult, ProbeType};
use kubelet_net::http::{HttpClient, HttpError, HttpGetSpec, Scheme, host_port};

/// What a pod worker does after a sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SyncOutcome {
    /// Sync again after this long (resync, backoff expiry, error retry).
    Requeue(Duration),
    /// The sync changed the pod in the runtime (created its sandbox, started or killed
    /// containers) without an error: ask the PLEG to inspect the pod again at once (the
    /// kubelet's post-sync `RequestPodRelist`), then sync again after this long.
    Changed(Duration),
    /// The pod reached a terminal phase: terminate it.
    Terminal,
}

/// The reason of a pod that ran past its `activeDeadlineSeconds` (phase and event).
pub(crate) const DEADLINE_EXCEEDED_REASON: &str = "DeadlineExceeded";
/// The kubelet's message for a pod that ran past its `activeDeadlineSeconds`.
pub(crate) const DEADLINE_EXCEEDED_MESSAGE: &str =
    "Pod was active on the node longer than the specified deadline";

/// How long `p` may still be active before its `activeDeadlineSeconds` passes, counted from
/// its `startTime` (the kubelet's `pastActiveDeadline`); zero once it has passed, `None` without
/// a deadline or a start time.
pub(crate) fn active_deadline_remaining(
    p: &Pod,
    start_time: Option<jiff::Timestamp>,
    now: jiff::Timestamp,
) -> Option<Duration> {
    let deadline = p.spec.as_ref()?.active_deadline_seconds?;
    let start = start_time?;
    let active = now.duration_since(start);
    let allowed = jiff::SignedDuration::from_secs(deadline.max(0));
    Some(if active >= allowed {
        Duration::ZERO
    } else {
        Duration::try_from(allowed - active).unwrap_or(Duration::ZERO)
    })
}

/// The kubelet's `backOffPeriod` for failed syncs.
const ERROR_BACKOFF: Duration = Duration::from_secs(10);
/// The kubelet's `minimumGracePeriodInSeconds`.
const MIN_GRACE_SECONDS: i64 = 2;

type Waiting = HashMap<String, (String, String)>;

pub(crate) struct Engine {
    node_name: String,
    config: KubeletConfig,
    runtime: Arc<dyn ContainerRuntime>,
    runtime_name: String,
    cache: PodCache,
    status: StatusManager,
    recorder: EventRecorder,
    volume_plugins: Vec<Arc<dyn VolumePlugin>>,
    prober: Option<Arc<dyn ProbeManager>>,
    objects: Option<Arc<dyn ObjectProvider>>,
    pleg: Option<Arc<dyn PodLifecycleEventGenerator>>,
    started_at: Instant,
    backoff: Mutex<Backoff>,
    waiting: Mutex<HashMap<String, Waiting>>,
    exits: Mutex<HashMap<String, Instant>>,
    static_names: Mutex<HashMap<String, String>>,
    /// Volumes set up successfully at least once, per pod UID.
    mounted: Mutex<HashMap<String, HashMap<String, PathBuf>>>,
    /// The client of `httpGet` lifecycle hooks.
    hook_http: HttpClient,
    /// Where a pod's start time goes.
    start_metrics: PodStartMetrics,
    /// Admits image pulls (`serializeImagePulls`, `registryPullQPS`).
    pull_gate: crate::image_pull::PullGate,
    /// The node resource manager's pod cgroups and container resources, if a plugin provides one.
    resources: Option<Arc<dyn kubelet_api::resources::PodResourceManager>>,
    /// Where each pod's sandbox goes: its cgroup parent and runtime handler, settled before
    /// the sandbox is created.
    placement: Mutex<HashMap<String, Placement>>,
    /// Per pod UID, the sandbox whose broken network report was already reported (once per
    /// sandbox, the sandbox network contract on `PodSandboxStatus`).
    network_reported: Mutex<HashMap<String, String>>,
}

/// A pod's cgroup parent and runtime handler.
#[derive(Debug, Clone, Default)]
struct Placement {
    cgroup_parent: String,
    runtime_handler: String,
}

/// `User-Agent` of `httpGet` lifecycle hooks: `kube-lifecycle/<major>.<minor>` of the Kubernetes
/// API version the SDK follows.
pub(crate) const LIFECYCLE_USER_AGENT: &str = "kube-lifecycle/1.33";

/// Result of the runtime part of a sync.
#[derive(Default)]
struct RuntimeSync {
    waiting: Waiting,
    backoff_wait: Option<Duration>,
    failed: bool,
    /// Something was changed in the runtime (sandbox created, containers killed or started).
    acted: bool,
    /// Containers started by this sync.
    started: Vec<String>,
}

impl RuntimeSync {
    fn wait(&mut self, d: Duration) {
        self.backoff_wait = Some(self.backoff_wait.map_or(d, |w| w.min(d)));
    }
}

impl Engine {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        node_name: String,
        config: KubeletConfig,
        runtime: Arc<dyn ContainerRuntime>,
        runtime_name: String,
        cache: PodCache,
        status: StatusManager,
        recorder: EventRecorder,
        volume_plugins: Vec<Arc<dyn VolumePlugin>>,
        prober: Option<Arc<dyn ProbeManager>>,
        started_at: Instant,
    ) -> Self {
        Self {
            node_name,
            runtime,
            runtime_name,
            cache,
            status,
            recorder,
            volume_plugins,
            prober,
            objects: None,
            pleg: None,
            started_at,
            backoff: Mutex::new(Backoff::crash_loop()),
            hook_http: HttpClient::insecure(LIFECYCLE_USER_AGENT),
            waiting: Mutex::new(HashMap::new()),
            exits: Mutex::new(HashMap::new()),
            static_names: Mutex::new(HashMap::new()),
            mounted: Mutex::new(HashMap::new()),
            start_metrics: PodStartMetrics::new(),
            pull_gate: crate::image_pull::PullGate::new(config.pull_limits),
            resources: None,
            placement: Mutex::default(),
            network_reported: Mutex::default(),
            config,
        }
    }

    /// Record the start stages into `metrics` (registered by the builder).
    pub(crate) fn with_start_metrics(mut self, metrics: PodStartMetrics) -> Self {
        self.start_metrics = metrics;
        self
    }

    /// The start-stage histograms.
    pub(crate) fn start_metrics(&self) -> &PodStartMetrics {
        &self.start_metrics
    }

    /// Where ConfigMaps and Secrets for env come from.
    pub(crate) fn with_object_provider(mut self, p: Option<Arc<dyn ObjectProvider>>) -> Self {
        self.objects = p;
        self
    }

    /// The node resource manager (the `PodResourceManager` service).
    pub(crate) fn with_resources(
        mut self,
        r: Option<Arc<dyn kubelet_api::resources::PodResourceManager>>,
    ) -> Self {
        self.resources = r;
        self
    }

    /// Settle where pod `p`'s sandbox goes (the kubelet's `EnsureExists` of the pod cgroup and
    /// the RuntimeClass lookup), before anything of the pod is created. An error was reported
    /// as an event.
    async fn place_pod(&self, p: &Pod) -> Result<(), ()> {
        let mut placement = Placement::default();
        if let Some(rm) = &self.resources {
            match rm.prepare_pod(p) {
                Ok(parent) => placement.cgroup_parent = parent,
                Err(e) => {
                    self.recorder.warning(
                        InvolvedObject::pod(p),
                        "FailedCreatePodContainer",
                        format!("unable to ensure pod container exists: {e}"),
                    );
                    return Err(());
                }
            }
        }
        if let Some(class) = p
            .spec
            .as_ref()
            .and_then(|s| s.runtime_class_name.as_deref())
            .filter(|c| !c.is_empty())
        {
            let found = match &self.objects {
                Some(o) => o.runtime_class(class).await,
                None => Ok(None),
            };
            match found {
                Ok(Some(rc)) => placement.runtime_handler = rc.handler,
                Ok(None) => {
                    self.recorder.warning(
                        InvolvedObject::pod(p),
                        "FailedCreatePodSandBox",
                        format!("Failed to create pod sandbox: runtimeClass {class:?} not found"),
                    );
                    return Err(());
                }
                Err(e) => {
                    self.recorder.warning(
                        InvolvedObject::pod(p),
                        "FailedCreatePodSandBox",
                        format!(
                            "Failed to create pod sandbox: failed to lookup RuntimeClass {class}: {e}"
                        ),
                    );
                    return Err(());
                }
            }
        }
        self.placement
            .lock()
            .insert(pod::uid(p).to_string(), placement);
        Ok(())
    }

    /// The PLEG asked to inspect a pod again after a sync that changed it.
    pub(crate) fn with_pleg(mut self, pleg: Arc<dyn PodLifecycleEventGenerator>) -> Self {
        self.pleg = Some(pleg);
        self
    }

    /// Ask the PLEG to inspect pod `p` again now.
    pub(crate) fn request_reinspect(&self, p: &Pod) {
        if let Some(pleg) = &self.pleg {
            pleg.request_reinspect(pod::uid(p), pod::name(p), pod::namespace(p));
        }
    }

    /// A probe result changed. Readiness and startup show in the pod's status at once, as the
    /// kubelet's sync loop has the status manager do (`SetContainerReadiness`,
    /// `SetContainerStartup`); the pod's sync the result also triggers acts on it (a liveness
    /// kill) and keeps the status consistent.
    pub(crate) fn probe_result_changed(&self, u: &kubelet_api::ProbeUpdate) {
        let success = u.result == ProbeResult::Success;
        match u.probe_type {
            ProbeType::Readiness => {
                self.status
                    .set_container_readiness(&u.pod_uid, &u.container_id, success);
            }
            ProbeType::Startup => {
                self.status
                    .set_container_startup(&u.pod_uid, &u.container_id, success);
            }
            ProbeType::Liveness => {}
        }
    }

    /// Hold pod `p`'s runtime events at the PLEG while its worker syncs it; the returned
    /// guard releases them (with one inspection when the sync changed the pod or events
    /// arrived) when dropped, also when the sync is cancelled.
    pub(crate) fn hold_pod(&self, p: &Pod) -> PodHold<'_> {
        if let Some(pleg) = &self.pleg {
            pleg.hold(pod::uid(p));
        }
        PodHold {
            engine: self,
            uid: pod::uid(p).to_string(),
            name: pod::name(p).to_string(),
            namespace: pod::namespace(p).to_string(),
            changed: false,
            gone: false,
        }
    }

    pub(crate) fn cache(&self) -> &PodCache {
        &self.cache
    }

    pub(crate) fn started_at(&self) -> Instant {
        self.started_at
    }

    /// A PLEG saw container `id` exit: remember when, for CrashLoopBackOff.
    pub(crate) fn observe_exit(&self, id: &str) {
        self.exits
            .lock()
            .entry(id.to_string())
            .or_insert_with(Instant::now);
    }

    fn exit_instant(&self, c: &ContainerStatus) -> Instant {
        *self
            .exits
            .lock()
            .entry(c.id.clone())
            .or_insert_with(Instant::now)
    }

    /// The prober's result for container instance `id`. A probe the spec configures but the
    /// prober has not recorded yet (a new instance it has not observed) counts as `Unknown`,
    /// so readiness starts False and a startup probe holds `started` back (the kubelet checks
    /// for a worker by pod and container name in the same case).
    fn probe_result(
        &self,
        p: &Pod,
        rt: &PodRuntimeStatus,
        id: &str,
        t: ProbeType,
    ) -> Option<ProbeResult> {
        let prober = self.prober.as_ref()?;
        prober.result(id, t).or_else(|| {
            let name = &rt
                .container_statuses
                .iter()
                .find(|c| c.id == id)?
                .metadata
                .name;
            let spec = p.spec.as_ref()?;
            let c = spec
                .containers
                .iter()
                .chain(spec.init_containers.iter().flatten())
                .find(|c| &c.name == name)?;
            let configured = match t {
                ProbeType::Liveness => c.liveness_probe.is_some(),
                ProbeType::Readiness => c.readiness_probe.is_some(),
                ProbeType::Startup => c.startup_probe.is_some(),
            };
            configured.then_some(ProbeResult::Unknown)
        })
    }

    /// Static pods sharing a full name run one after the other: `Some(wait)` while another
    /// UID still holds the name.
    pub(crate) fn wait_for_static_predecessor(&self, p: &Pod) -> Option<Duration> {
        if !pod::is_static(p) {
            return None;
        }
        let mut names = self.static_names.lock();
        let full = pod::full_name(p);
        match names.get(&full) {
            Some(u) if u != pod::uid(p) => Some(Duration::from_millis(200)),
            _ => {
                names.insert(full, pod::uid(p).to_string());
                None
            }
        }
    }

    fn pod_dir(&self, p: &Pod) -> PathBuf {
        self.config.root_dir.join("pods").join(pod::uid(p))
    }

    fn log_dir(&self, p: &Pod) -> PathBuf {
        self.config.pod_log_dir.join(format!(
            "{}_{}_{}",
            pod::namespace(p),
            pod::name(p),
            pod::uid(p)
        ))
    }

    /// A pod an admission handler rejected: it ends `Failed` with the handler's reason.
    pub(crate) fn reject_pod(&self, p: &Arc<Pod>, reason: &str, message: &str) {
        // The kubelet's `rejectPod` prefixes the handler's message.
        let mut st = k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Failed".into()),
            reason: Some(reason.into()),
            message: Some(format!("Pod was rejected: {message}")),
            ..Default::default()
        };
        if let Some(old) = self.status.get_shared(pod::uid(p)) {
            st.start_time = old.start_time.clone();
        }
        self.status.set_pod_status(p, st);
    }

    /// A rejected pod left its source.
    pub(crate) fn forget_rejected(&self, p: &Arc<Pod>) {
        if self.status.get_shared(pod::uid(p)).is_some() {
            self.status.remove_pod(p);
        }
    }

    fn generate_status(
        &self,
        p: &Pod,
        rt: &PodRuntimeStatus,
        waiting: &Waiting,
        pod_is_terminal: bool,
    ) -> k8s_openapi::api::core::v1::PodStatus {
        let sandbox_changed = actions::pod_sandbox_changed(rt).changed;
        let old = self.status.get_shared(pod::uid(p));
        let probe = |id: &str, t: ProbeType| self.probe_result(p, rt, id, t);
        let host_ip = self
            .config
            .node_ip
            .clone()
            .or_else(|| rt.ips.first().cloned());
        status_gen::generate_pod_status(&StatusInput {
            pod: p,
            runtime: rt,
            old: old.as_deref(),
            runtime_name: &self.runtime_name,
            waiting_reasons: waiting,
            probe_result: &probe,
            sandbox_ready: !sandbox_changed,
            pod_is_terminal,
            host_ip: host_ip.as_deref(),
            now: jiff::Timestamp::now(),
        })
    }

    /// Sync a running pod toward its spec, within its `activeDeadlineSeconds` (the kubelet's
    /// `activeDeadlineHandler`): a pod active longer than its deadline fails with reason
    /// `DeadlineExceeded` and is killed; before that, the pod is synced again when the deadline
    /// passes (an update that changes the deadline syncs the pod at once).
    pub(crate) async fn sync_pod(&self, p: &Arc<Pod>, entry: CacheEntry) -> SyncOutcome {
        let has_deadline = p
            .spec
            .as_ref()
            .is_some_and(|s| s.active_deadline_seconds.is_some());
        if !has_deadline {
            return self.sync_pod_toward_spec(p, entry).await;
        }
        // The start time as the status manager has it.
        let start_time = || {
            self.status
                .get_shared(pod::uid(p))
                .and_then(|s| s.start_time.clone())
                .or_else(|| p.status.as_ref().and_then(|s| s.start_time.clone()))
                .map(|t| t.0)
        };
        let remaining = active_deadline_remaining(p, start_time(), jiff::Timestamp::now());
        if remaining == Some(Duration::ZERO) {
            self.recorder.normal(
                InvolvedObject::pod(p),
                DEADLINE_EXCEEDED_REASON,
                DEADLINE_EXCEEDED_MESSAGE,
            );
            self.status.set_terminal(
                p,
                Some((
                    DEADLINE_EXCEEDED_REASON.into(),
                    DEADLINE_EXCEEDED_MESSAGE.into(),
                )),
                None,
            );
            return SyncOutcome::Terminal;
        }
        let outcome = self.sync_pod_toward_spec(p, entry).await;
        // A pod that has just got its start time has its deadline counted from now on.
        let remaining = remaining
            .or_else(|| active_deadline_remaining(p, start_time(), jiff::Timestamp::now()));
        match (outcome, remaining) {
            (SyncOutcome::Requeue(d), Some(r)) => SyncOutcome::Requeue(d.min(r)),
            (SyncOutcome::Changed(d), Some(r)) => SyncOutcome::Changed(d.min(r)),
            (outcome, _) => outcome,
        }
    }

    async fn sync_pod_toward_spec(&self, p: &Arc<Pod>, entry: CacheEntry) -> SyncOutcome {
        let uid = pod::uid(p).to_string();
        let rt = match entry.status {
            Ok(s) => s,
            Err(msg) => {
                self.recorder.warning(
                    InvolvedObject::pod(p),
                    "FailedSync",
                    format!("error determining status: {msg}"),
                );
                return SyncOutcome::Requeue(ERROR_BACKOFF);
            }
        };
        let waiting = self.waiting.lock().get(&uid).cloned().unwrap_or_default();
        let api = self.generate_status(p, &rt, &waiting, false);
        let phase = api.phase.clone().unwrap_or_default();
        self.status.set_pod_status(p, api);
        if phase == "Running" {
            self.start_metrics.running(&uid);
        }
        if phase == "Succeeded" || phase == "Failed" {
            self.start_metrics.forget(&uid);
            return SyncOutcome::Terminal;
        }

        if let Some(objects) = &self.objects {
            objects.register_pod(p);
        }
        if self.place_pod(p).await.is_err() {
            return SyncOutcome::Requeue(ERROR_BACKOFF);
        }
        // Every resync of every pod passes here: a directory that is there costs one `stat`,
        // not a blocking task.
        let volumes_dir = self.pod_dir(p).join("volumes");
        let made = match std::fs::metadata(&volumes_dir) {
            Ok(m) if m.is_dir() => Ok(()),
            _ => tokio::fs::create_dir_all(&volumes_dir).await,
        };
        if let Err(e) = made {
            self.recorder.warning(
                InvolvedObject::pod(p),
                "FailedSync",
                format!("creating pod directory: {e}"),
            );
            return SyncOutcome::Requeue(ERROR_BACKOFF);
        }
        let volume_paths = match self.mount_volumes(p).await {
            Ok(v) => v,
            Err(e) => {
                self.recorder.warning(
                    InvolvedObject::pod(p),
                    "FailedMount",
                    format!("Unable to attach or mount volumes: {e}"),
                );
                return SyncOutcome::Requeue(ERROR_BACKOFF);
            }
        };
        if let Some(prober) = &self.prober {
            prober.add_pod(p);
        }

        let result = self.sync_runtime(p, &rt, &volume_paths).await;
        if !result.started.is_empty() {
            self.start_metrics.containers_started(&uid);
        }
        let changed = {
            let mut w = self.waiting.lock();
            let old = w.insert(uid.clone(), result.waiting.clone());
            old.as_ref() != Some(&result.waiting)
        };
        if changed {
            // `rt` predates this sync: a container it started still shows its exited
            // instance there. Until the next sync sees the new one, keep what the status said
            // about it (CrashLoopBackOff), as the kubelet's status does between a back-off's
            // expiry and the restart, rather than a stale Terminated.
            let mut shown = result.waiting.clone();
            for name in &result.started {
                if let Some(w) = waiting.get(name) {
                    shown.entry(name.clone()).or_insert_with(|| w.clone());
                }
            }
            let api = self.generate_status(p, &rt, &shown, false);
            self.status.set_pod_status(p, api);
        }
        if let Some(w) = result.backoff_wait {
            return SyncOutcome::Requeue(w.max(Duration::from_millis(100)));
        }
        if result.failed {
            return SyncOutcome::Requeue(jitter(ERROR_BACKOFF));
        }
        if result.acted {
            return SyncOutcome::Changed(jitter(self.config.sync_frequency));
        }
        SyncOutcome::Requeue(jitter(self.config.sync_frequency))
    }

    async fn mount_volumes(&self, p: &Pod) -> Result<HashMap<String, PathBuf>, UnmountedVolumes> {
        let mut out = HashMap::new();
        let volumes = p
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_deref())
            .unwrap_or(&[]);
        let mut failed = Vec::new();
        for v in volumes {
            let Some(plugin) = self.volume_plugins.iter().find(|pl| pl.can_support(v)) else {
                failed.push(VolumeFailure {
                    volume: v.name.clone(),
                    cause: None,
                });
                continue;
            };
            let dir = self
                .pod_dir(p)
                .join("volumes")
                .join(plugin.name())
                .join(&v.name);
            match plugin.set_up(p, v, &dir).await {
                Ok(path) => {
                    out.insert(v.name.clone(), path);
                }
                Err(e) => {
                    // A volume that was set up before stays mounted when a later set-up (the
                    // periodic remount of configMap/secret volumes) fails, as in the kubelet's
                    // reconciler: report it, keep the old content, do not block the pod.
                    let previous = self
                        .mounted
                        .lock()
                        .get(pod::uid(p))
                        .and_then(|m| m.get(&v.name).cloned());
                    match previous {
                        Some(path) => {
                            self.recorder.warning(
                                InvolvedObject::pod(p),
                                "FailedMount",
                                format!(
                                    "MountVolume.SetUp failed for volume {:?} : {}",
                                    v.name,
                                    e.message()
                                ),
                            );
                            out.insert(v.name.clone(), path);
                        }
                        None => failed.push(VolumeFailure {
                            volume: v.name.clone(),
                            cause: Some(e),
                        }),
                    }
                }
            }
        }
        self.mounted
            .lock()
            .insert(pod::uid(p).to_string(), out.clone());
        if failed.is_empty() {
            Ok(out)
        } else {
            Err(UnmountedVolumes(failed))
        }
    }

    /// The node's DNS settings, with the host's resolver read now (it may change).
    fn dns_settings(&self) -> crate::dns::DnsSettings {
        let host = if self.config.resolv_conf.as_os_str().is_empty() {
            None
        } else {
            match std::fs::read_to_string(&self.config.resolv_conf) {
                Ok(text) => Some(crate::dns::parse_resolv_conf(&text)),
                Err(e) => {
                    tracing::warn!(path = %self.config.resolv_conf.display(), error = %kubelet_api::chain(&e), "reading resolvConf failed; pods get no host resolver settings");
                    Some(DnsConfig::default())
                }
            }
        };
        crate::dns::DnsSettings {
            cluster_dns: self.config.cluster_dns.clone(),
            cluster_domain: self.config.cluster_domain.clone(),
            host,
        }
    }

    fn sandbox_config(&self, p: &Pod, attempt: u32) -> PodSandboxConfig {
        self.sandbox_config_and_dns_events(p, attempt).0
    }

    /// The sandbox config and what forming its DNS settings had to report (the host's
    /// resolver is read once).
    fn sandbox_config_and_dns_events(
        &self,
        p: &Pod,
        attempt: u32,
    ) -> (PodSandboxConfig, Vec<crate::dns::DnsEvent>) {
        let spec = p.spec.as_ref();
        let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
        let hostname = if host_network {
            String::new()
        } else {
            crate::hosts::sandbox_hostname(p, &self.config.cluster_domain)
        };
        let crate::dns::PodDns {
            config: dns,
            events: dns_events,
        } = crate::dns::pod_dns(&self.dns_settings(), p);
        let dns_config = Some(dns);
        let port_mappings = pod::containers(p)
            .iter()
            .flat_map(|c| c.ports.iter().flatten())
            .map(|port| PortMapping {
                protocol: Protocol::from_api(port.protocol.as_deref()),
                container_port: port.container_port,
                host_port: port.host_port.unwrap_or(0),
                host_ip: port.host_ip.clone().unwrap_or_default(),
            })
            .collect();
        let config = {
            let mut v = PodSandboxConfig::default();
            v.metadata = PodSandboxMetadata {
                name: pod::name(p).into(),
                namespace: pod::namespace(p).into(),
                uid: pod::uid(p).into(),
                attempt,
            };
            v.hostname = hostname;
            v.log_directory = self.log_dir(p);
            v.dns_config = dns_config;
            v.port_mappings = port_mappings;
            v.labels = container::sandbox_labels(p);
            v.annotations = p.metadata.annotations.clone().unwrap_or_default();
            v.host_network = host_network;
            if let Some(placed) = self.placement.lock().get(pod::uid(p)) {
                v.cgroup_parent = placed.cgroup_parent.clone();
                v.runtime_handler = placed.runtime_handler.clone();
            }
            v.privileged = pod::has_privileged_container(p);
            v
        };
        (config, dns_events)
    }

    /// Reports a sandbox whose network report breaks the sandbox network contract, once per
    /// sandbox: a `SandboxNetworkInvalid` Warning event naming the contract. The sandbox is
    /// kept (re-creating it would loop on a runtime that always reports the same).
    fn check_sandbox_network(&self, p: &Pod, s: &PodSandboxStatus) {
        let requested = p
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false);
        let Err(e) = s.check_network(requested) else {
            return;
        };
        let uid = pod::uid(p);
        {
            let mut reported = self.network_reported.lock();
            if reported.get(uid).is_some_and(|id| *id == s.id) {
                return;
            }
            reported.insert(uid.to_string(), s.id.clone());
        }
        tracing::warn!(pod = %pod::full_name(p), error = %e, "sandbox network report breaks the runtime contract");
        self.recorder.warning(
            InvolvedObject::pod(p),
            "SandboxNetworkInvalid",
            format!("Pod sandbox network breaks the runtime contract: {e}"),
        );
    }

    /// The runtime part of the sync (`kuberuntime SyncPod`).
    async fn sync_runtime(
        &self,
        p: &Pod,
        rt: &PodRuntimeStatus,
        volume_paths: &HashMap<String, PathBuf>,
    ) -> RuntimeSync {
        let mut out = RuntimeSync::default();
        let probe = |id: &str, t: ProbeType| self.probe_result(p, rt, id, t);
        let changes = actions::compute_pod_actions(p, rt, &probe);
        if changes.create_sandbox && changes.sandbox_id.is_some() {
            self.recorder.normal(
                InvolvedObject::pod(p),
                "SandboxChanged",
                "Pod sandbox changed, it will be killed and re-created.",
            );
        }
        if changes.kill_pod {
            if !self.kill_pod(p, rt, None).await {
                out.failed = true;
                return out;
            }
            out.acted = true;
            if changes.create_sandbox {
                self.purge_init_containers(p, rt).await;
            }
        } else {
            let kills = changes.containers_to_kill.iter().map(|(id, k)| {
                let spec = find_spec(p, &k.name);
                let grace = kill_grace(p, spec, k.reason, None);
                self.kill_container(p, spec, id, &k.name, grace, Some(k.message.clone()))
            });
            if join_all(kills).await.iter().any(|ok| !ok) {
                out.failed = true;
                return out;
            }
            out.acted |= !changes.containers_to_kill.is_empty();
            self.prune_dead_containers(p, rt).await;
        }

        let mut pod_ips = rt.ips.clone();
        let mut sandbox_host_network = rt.sandbox_host_network();
        let sandbox_id;
        let sandbox_config;
        if changes.create_sandbox {
            let dns_events;
            (sandbox_config, dns_events) = self.sandbox_config_and_dns_events(p, changes.attempt);
            // What forming the DNS settings had to report, once per sandbox.
            for e in dns_events {
                self.recorder
                    .warning(InvolvedObject::pod(p), e.reason, e.message);
            }
            if let Err(e) = tokio::fs::create_dir_all(&sandbox_config.log_directory).await {
                self.recorder.warning(
                    InvolvedObject::pod(p),
                    "FailedCreatePodSandBox",
                    format!("Failed to create pod sandbox: creating log directory: {e}"),
                );
                out.failed = true;
                return out;
            }
            match self.runtime.run_pod_sandbox(&sandbox_config).await {
                Ok(id) => {
                    out.acted = true;
                    sandbox_id = id;
                }
                Err(e) => {
                    self.recorder.warning(
                        InvolvedObject::pod(p),
                        "FailedCreatePodSandBox",
                        format!("Failed to create pod sandbox: {e}"),
                    );
                    out.failed = true;
                    return out;
                }
            }
            match self.runtime.pod_sandbox_status(&sandbox_id).await {
                Ok(s) => {
                    self.check_sandbox_network(p, &s);
                    pod_ips = s.valid_ips();
                    sandbox_host_network = s.host_network;
                }
                Err(e) => {
                    tracing::warn!(pod = %pod::full_name(p), error = %kubelet_api::chain(&e), "sandbox status after creation failed");
                }
            }
        } else if let Some(id) = changes.sandbox_id.clone() {
            if let Some(s) = rt.sandbox_statuses.iter().find(|s| s.id == id) {
                self.check_sandbox_network(p, s);
            }
            // The config (and the host resolver it reads) is only for containers to start: a
            // periodic resync of a running pod, every `syncFrequency` per pod, forms none.
            if changes.init_containers_to_start.is_empty() && changes.containers_to_start.is_empty()
            {
                return out;
            }
            sandbox_id = id;
            sandbox_config = self.sandbox_config(p, changes.attempt);
        } else {
            return out;
        }

        // The same IPs the status reports (the node's for a host-network pod or sandbox), for
        // the downward API and /etc/hosts.
        let pod_ips = crate::status_gen::pod_ips(
            p,
            &pod_ips,
            sandbox_host_network,
            self.config.node_ip.as_deref(),
        );
        let host_ip = self
            .config
            .node_ip
            .clone()
            .or_else(|| pod_ips.first().cloned())
            .unwrap_or_default();
        let inits = pod::init_containers(p);
        for &i in &changes.init_containers_to_start {
            let Some(c) = inits.get(i) else { continue };
            let kind = if pod::is_sidecar(c) {
                "sidecar"
            } else {
                "init"
            };
            let ok = self
                .start_container(
                    p,
                    c,
                    kind,
                    rt,
                    &sandbox_id,
                    &sandbox_config,
                    &pod_ips,
                    &host_ip,
                    volume_paths,
                    &mut out,
                )
                .await;
            if !ok && !pod::is_sidecar(c) {
                // A regular init container that cannot start aborts the sync.
                return out;
            }
        }
        let containers = pod::containers(p);
        for &i in &changes.containers_to_start {
            let Some(c) = containers.get(i) else { continue };
            self.start_container(
                p,
                c,
                "",
                rt,
                &sandbox_id,
                &sandbox_config,
                &pod_ips,
                &host_ip,
                volume_paths,
                &mut out,
            )
            .await;
        }
        out
    }

    #[allow(clippy::too_many_arguments)]
    async fn start_container(
        &self,
        p: &Pod,
        c: &Container,
        kind: &str,
        rt: &PodRuntimeStatus,
        sandbox_id: &str,
        sandbox_config: &PodSandboxConfig,
        pod_ips: &[String],
        host_ip: &str,
        volume_paths: &HashMap<String, PathBuf>,
        out: &mut RuntimeSync,
    ) -> bool {
        let involved = InvolvedObject::container(p, &c.name);
        let previous = rt.find_container(&c.name);
        let pod_desc = format!("{}_{}({})", pod::name(p), pod::namespace(p), pod::uid(p));
        // CrashLoopBackOff, keyed like the kubelet's GetStableKey, from the newest *exited*
        // instance (the kubelet's doBackOff): when this sync kills a running instance to
        // restart it (liveness, spec change), that instance is not the one to count from.
        if let Some(prev) = rt
            .container_instances(&c.name)
            .filter(|i| i.state == ContainerState::Exited)
            .max_by_key(|i| (i.created_at, i.metadata.attempt))
        {
            let key = format!(
                "{}/{}_{}_{:x}",
                pod::uid(p),
                pod::full_name(p),
                c.name,
                pod::container_hash(c)
            );
            let event_time = self.exit_instant(prev);
            let now = Instant::now();
            let mut backoff = self.backoff.lock();
            if let Some(remaining) = backoff.remaining_since(&key, event_time, now) {
                let delay = backoff.get(&key);
                drop(backoff);
                self.recorder.warning(
                    involved,
                    "BackOff",
                    format!(
                        "Back-off restarting failed container {} in pod {pod_desc}",
                        c.name
                    ),
                );
                out.waiting.insert(
                    c.name.clone(),
                    (
                        "CrashLoopBackOff".into(),
                        format!(
                            "back-off {} restarting failed container={} pod={pod_desc}",
                            crate::duration::format_go(delay),
                            c.name
                        ),
                    ),
                );
                out.wait(remaining);
                return false;
            }
            backoff.next(&key, event_time, now);
        }

        if let Err(e) = self.ensure_image(p, c).await {
            out.waiting
                .insert(c.name.clone(), (e.reason().to_string(), e.to_string()));
            out.failed = true;
            return false;
        }

        let restart_count = previous
            .map(|prev| {
                prev.annotations
                    .get(kubelet_api::runtime::labels::CONTAINER_RESTART_COUNT)
                    .and_then(|v| v.parse::<u32>().ok())
                    .unwrap_or(prev.metadata.attempt)
                    + 1
            })
            .unwrap_or(0);
        let objects = match &self.objects {
            Some(provider) => EnvObjects::fetch(provider.as_ref(), p, c).await,
            None => EnvObjects::default(),
        };
        let ctx = ConfigContext {
            objects: &objects,
            recorder: Some(&self.recorder),
            node_name: &self.node_name,
            pod_ips,
            host_ip,
            volume_paths,
            restart_count,
            container_type: kind,
            seccomp_profile_root: &self.config.root_dir.join("seccomp"),
        };
        let config = match container::generate_container_config(p, c, &ctx) {
            Ok(mut cfg) => {
                if let Some(m) = self.hosts_mount(p, c, pod_ips).await {
                    cfg.mounts.push(m);
                }
                if let Some(rm) = &self.resources {
                    cfg.resources = rm.container_resources(p, c, cfg.resources.take());
                }
                cfg
            }
            Err(e) => {
                let e = kubelet_api::chain(&e);
                self.recorder
                    .warning(involved, "Failed", format!("Error: {e}"));
                out.waiting.insert(
                    c.name.clone(),
                    ("CreateContainerConfigError".into(), e.to_string()),
                );
                out.failed = true;
                return false;
            }
        };
        let id = match self
            .runtime
            .create_container(sandbox_id, &config, sandbox_config)
            .await
        {
            Ok(id) => id,
            Err(e) => {
                self.recorder
                    .warning(involved, "Failed", format!("Error: {e}"));
                out.waiting.insert(
                    c.name.clone(),
                    ("CreateContainerError".into(), e.to_string()),
                );
                out.failed = true;
                return false;
            }
        };
        self.recorder.normal(
            involved.clone(),
            "Created",
            format!("Created container: {}", c.name),
        );
        if let Err(e) = self.runtime.start_container(&id).await {
            self.recorder
                .warning(involved, "Failed", format!("Error: {e}"));
            out.waiting
                .insert(c.name.clone(), ("RunContainerError".into(), e.to_string()));
            out.failed = true;
            return false;
        }
        self.recorder
            .normal(involved, "Started", format!("Started container {}", c.name));
        self.create_log_link(p, &c.name, &id, &self.log_dir(p).join(&config.log_path))
            .await;
        out.acted = true;
        if let Err(message) = self.run_post_start(p, c, &id).await {
            out.waiting
                .insert(c.name.clone(), ("PostStartHookError".into(), message));
            out.failed = true;
            return false;
        }
        out.started.push(c.name.clone());
        true
    }

    async fn ensure_image(&self, p: &Pod, c: &Container) -> Result<(), ImageError> {
        let Some(images) = self.runtime.images() else {
            return Ok(());
        };
        let image = c.image.clone().unwrap_or_default();
        let involved = InvolvedObject::container(p, &c.name);
        let policy = pod::pull_policy(c);
        let spec = ImageSpec::new(image.clone());
        let present = match images.image_status(&spec).await {
            Ok(s) => s.is_some(),
            Err(cause) => return Err(ImageError::Inspect { image, cause }),
        };
        match policy {
            PullPolicy::Never if !present => {
                let e = ImageError::NeverPull { image };
                self.recorder.warning(involved, e.reason(), e.to_string());
                Err(e)
            }
            PullPolicy::Never => Ok(()),
            PullPolicy::IfNotPresent if present => Ok(()),
            _ => {
                // ImagePullBackOff (10 s doubling to 300 s), keyed by pod UID and image as the
                // kubelet's image manager; the `<uid>/` prefix lets pod cleanup drop it.
                let key = format!("{}/image/{image}", pod::uid(p));
                if self
                    .backoff
                    .lock()
                    .remaining_since_update(&key, Instant::now())
                    .is_some()
                {
                    let e = ImageError::BackOff { image };
                    self.recorder.normal(involved, "BackOff", e.to_string());
                    return Err(e);
                }
                let started = Instant::now();
                match self.pull(p, &involved, images, &spec).await {
                    Ok(_) => {
                        self.recorder.normal(
                            involved,
                            "Pulled",
                            format!(
                                "Successfully pulled image {image:?} in {:.3}s",
                                started.elapsed().as_secs_f64()
                            ),
                        );
                        Ok(())
                    }
                    Err(cause) => {
                        let now = Instant::now();
                        self.backoff.lock().next(&key, now, now);
                        let e = ImageError::Pull { image, cause };
                        self.recorder.warning(involved, "Failed", e.to_string());
                        Err(e)
                    }
                }
            }
        }
    }

    /// One pull of `spec` for pod `p`: the pull gate (rate, then a slot), then each matching
    /// credential of the pod's pull secrets in turn (most specific first; the first success
    /// wins, else the last error), anonymously when none matches.
    async fn pull(
        &self,
        p: &Pod,
        involved: &InvolvedObject,
        images: &dyn kubelet_api::ImageService,
        spec: &ImageSpec,
    ) -> Result<String, kubelet_api::Error> {
        let keyring = self.pull_keyring(p).await?;
        let credentials = keyring
            .lookup(&spec.image)
            .map_err(|e| kubelet_api::Error::invalid_argument(e.to_string()))?;
        if !self.pull_gate.try_accept() {
            return Err(kubelet_api::Error::new(
                kubelet_api::ErrorKind::ResourceExhausted,
                crate::image_pull::PULL_QPS_EXCEEDED,
            ));
        }
        self.recorder.normal(
            involved.clone(),
            "Pulling",
            format!("Pulling image {:?}", spec.image),
        );
        let _slot = self.pull_gate.slot().await;
        let sandbox = self.sandbox_config(p, 0);
        if credentials.is_empty() {
            return images.pull_image(spec, None, &sandbox).await;
        }
        let mut last = None;
        for auth in &credentials {
            match images.pull_image(spec, Some(auth), &sandbox).await {
                Ok(r) => return Ok(r),
                Err(e) => {
                    tracing::debug!(image = %spec.image, error = %kubelet_api::chain(&e), "pull with one matching credential failed; trying the next");
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| kubelet_api::Error::internal("no pull attempted")))
    }

    /// The keyring of pod `p`'s image pull secrets (those of its service account when it names
    /// none). A secret that cannot be read is reported in one `FailedToRetrieveImagePullSecret`
    /// event and skipped, as the kubelet does; a malformed one fails the pull.
    async fn pull_keyring(
        &self,
        p: &Pod,
    ) -> Result<crate::credentials::Keyring, kubelet_api::Error> {
        let mut keyring = crate::credentials::Keyring::default();
        let Some(objects) = &self.objects else {
            return Ok(keyring);
        };
        let namespace = pod::namespace(p);
        let mut names: Vec<String> = p
            .spec
            .iter()
            .flat_map(|s| s.image_pull_secrets.iter().flatten())
            .map(|r| r.name.clone())
            .filter(|n| !n.is_empty())
            .collect();
        if names.is_empty() {
            let account = p
                .spec
                .as_ref()
                .and_then(|s| s.service_account_name.clone())
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| "default".to_string());
            match objects.service_account(namespace, &account).await {
                Ok(Some(sa)) => {
                    names = sa
                        .image_pull_secrets
                        .iter()
                        .flatten()
                        .map(|r| r.name.clone())
                        .filter(|n| !n.is_empty())
                        .collect();
                }
                Ok(None) => {}
                // The Node authorizer does not let a node read service accounts; in such a
                // cluster the ServiceAccount admission has already copied the account's secrets
                // into the pod (here it had none to copy), so a refusal is expected there and
                // not worth a warning per pull.
                Err(e) if e.kind() == kubelet_api::ErrorKind::PermissionDenied => {
                    tracing::debug!(pod = %pod::full_name(p), service_account = %account, error = %kubelet_api::chain(&e), "this node may not read the service account; pulling without credentials");
                }
                Err(e) => {
                    tracing::warn!(pod = %pod::full_name(p), service_account = %account, error = %kubelet_api::chain(&e), "reading the service account's image pull secrets failed; pulling without them");
                }
            }
        }
        let mut failed = Vec::new();
        for name in &names {
            match objects.secret(namespace, name).await {
                Ok(Some(secret)) => match keyring.add_secret(&secret) {
                    Ok(true) => {}
                    Ok(false) => failed.push(format!(
                        "{namespace}/{name} (type {:?} is not an image pull secret)",
                        secret.type_.as_deref().unwrap_or("")
                    )),
                    Err(e) => return Err(kubelet_api::Error::invalid_argument(e.to_string())),
                },
                Ok(None) => failed.push(format!("{namespace}/{name}")),
                Err(e) => {
                    tracing::warn!(pod = %pod::full_name(p), secret = %name, error = %kubelet_api::chain(&e), "reading an image pull secret failed");
                    failed.push(format!("{namespace}/{name}"));
                }
            }
        }
        if !failed.is_empty() {
            self.recorder.warning(
                InvolvedObject::pod(p),
                "FailedToRetrieveImagePullSecret",
                format!(
                    "Unable to retrieve some image pull secrets ({}); attempting to pull the image may not succeed.",
                    failed.join(", ")
                ),
            );
        }
        Ok(keyring)
    }

    /// Stop one container: preStop hook (bounded by the grace period), then the runtime's stop
    /// with what is left of the grace period (at least 2 s). Returns false on failure.
    async fn kill_container(
        &self,
        p: &Pod,
        spec: Option<&Container>,
        id: &str,
        name: &str,
        grace: i64,
        message: Option<String>,
    ) -> bool {
        let grace = self.run_pre_stop(p, spec, id, name, grace).await;
        self.stop_container(p, id, name, grace, message).await
    }

    async fn run_pre_stop(
        &self,
        p: &Pod,
        spec: Option<&Container>,
        id: &str,
        name: &str,
        grace: i64,
    ) -> i64 {
        let Some(handler) = spec
            .and_then(|c| c.lifecycle.as_ref())
            .and_then(|l| l.pre_stop.as_ref())
        else {
            return grace;
        };
        if grace <= 0 {
            return grace;
        }
        let start = Instant::now();
        let budget = Duration::from_secs(grace as u64);
        let run = self.run_handler(p, spec, id, handler, budget);
        let result = tokio::time::timeout(budget, run).await;
        let failed = match result {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e),
            Err(_) => Some(HookError::TimedOut(budget)),
        };
        if let Some(e) = failed {
            tracing::warn!(pod = %pod::full_name(p), containerName = %name, error = %kubelet_api::chain(&e), "preStop hook failed");
            self.recorder.warning(
                InvolvedObject::container(p, name),
                "FailedPreStopHook",
                "PreStopHook failed",
            );
        }
        let elapsed = start.elapsed().as_secs() as i64;
        grace - elapsed
    }

    async fn run_handler(
        &self,
        p: &Pod,
        spec: Option<&Container>,
        id: &str,
        h: &LifecycleHandler,
        budget: Duration,
    ) -> Result<(), HookError> {
        if let Some(exec) = &h.exec {
            let cmd = exec.command.clone().unwrap_or_default();
            let r = self
                .runtime
                .exec_sync(id, &cmd, budget)
                .await
                .map_err(HookError::Runtime)?;
            if r.exit_code != 0 {
                return Err(HookError::ExitCode(r.exit_code));
            }
            return Ok(());
        }
        if let Some(sleep) = &h.sleep {
            tokio::time::sleep(Duration::from_secs(sleep.seconds.max(0) as u64)).await;
            return Ok(());
        }
        if let Some(get) = &h.http_get {
            return self.run_http_handler(p, spec, get).await;
        }
        Err(HookError::NoAction)
    }

    /// An `httpGet` hook as the kubelet's `runHTTPHandler`: the request of
    /// [`HttpGetSpec::from_action`] to the action's host or the pod IP, through the SDK's HTTP
    /// client (certificates not verified); only a transport error fails it, whatever the
    /// status code. An `HTTPS` target that answers in plain HTTP is asked again over HTTP
    /// without the `Authorization` header, with a `LifecycleHTTPFallback` warning event when
    /// that works.
    async fn run_http_handler(
        &self,
        p: &Pod,
        spec: Option<&Container>,
        get: &k8s_openapi::api::core::v1::HTTPGetAction,
    ) -> Result<(), HookError> {
        let fallback = Container::default();
        let mut request =
            HttpGetSpec::from_action(get, spec.unwrap_or(&fallback)).map_err(HookError::Spec)?;
        let host = match &request.host {
            Some(h) => h.clone(),
            None => self
                .status
                .get_shared(pod::uid(p))
                .and_then(|s| s.pod_ip.clone())
                .unwrap_or_else(|| "127.0.0.1".into()),
        };
        match self.hook_http.get(&request, &host).await {
            Ok(_) => Ok(()),
            Err(HttpError::HttpResponseToHttps { url }) => {
                tracing::debug!(pod = %pod::full_name(p), %url, "HTTPS request to lifecycle hook got HTTP response, retrying with HTTP");
                request.scheme = Scheme::Http;
                request
                    .headers
                    .retain(|(n, _)| !n.eq_ignore_ascii_case("authorization"));
                self.hook_http
                    .get(&request, &host)
                    .await
                    .map_err(HookError::Http)?;
                let target = host_port(&host, request.port);
                self.recorder.warning(
                    InvolvedObject::pod(p),
                    "LifecycleHTTPFallback",
                    format!(
                        "request to HTTPS lifecycle hook {target} got HTTP response, retry with HTTP succeeded"
                    ),
                );
                Ok(())
            }
            Err(e) => Err(HookError::Http(e)),
        }
    }

    /// The postStart hook of a started container, as the kubelet's `startContainer` step 4: on
    /// failure a `FailedPostStartHook` warning, the container killed (its preStop hook first)
    /// and the `PostStartHookError` message returned. The kubelet does not bound the hook; here
    /// it is bounded by `runtimeRequestTimeout` so that a hanging hook cannot hold the pod's
    /// worker forever.
    async fn run_post_start(&self, p: &Pod, c: &Container, id: &str) -> Result<(), String> {
        let Some(handler) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) else {
            return Ok(());
        };
        let budget = self.config.runtime_request_timeout;
        let run = self.run_handler(p, Some(c), id, handler, budget);
        let failed = match tokio::time::timeout(budget, run).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => e,
            Err(_) => HookError::TimedOut(budget),
        };
        let kind = if handler.http_get.is_some() {
            "HTTP"
        } else if handler.sleep.is_some() {
            "Sleep"
        } else {
            "Exec"
        };
        let message = format!(
            "{kind} lifecycle hook for Container {:?} in Pod {:?} failed - error: {failed}",
            c.name,
            pod::full_name(p)
        );
        tracing::warn!(pod = %pod::full_name(p), containerName = %c.name, error = %failed, "PostStartHook failed");
        self.recorder.warning(
            InvolvedObject::container(p, &c.name),
            "FailedPostStartHook",
            message.clone(),
        );
        let grace = effective_grace(p, None);
        self.kill_container(
            p,
            Some(c),
            id,
            &c.name,
            grace,
            Some("FailedPostStartHook".to_string()),
        )
        .await;
        Err(message)
    }

    async fn stop_container(
        &self,
        p: &Pod,
        id: &str,
        name: &str,
        grace: i64,
        message: Option<String>,
    ) -> bool {
        let grace = grace.max(MIN_GRACE_SECONDS) as u64;
        self.recorder.normal(
            InvolvedObject::container(p, name),
            "Killing",
            message.unwrap_or_else(|| format!("Stopping container {name}")),
        );
        let deadline = self.config.runtime_request_timeout + Duration::from_secs(grace);
        let call = self.runtime.stop_container(id, Duration::from_secs(grace));
        match tokio::time::timeout(deadline, call).await {
            Ok(Ok(())) => true,
            Ok(Err(e)) if e.is_not_found() => true,
            Ok(Err(e)) => {
                tracing::warn!(pod = %pod::full_name(p), containerName = %name, error = %kubelet_api::chain(&e), "stopping container failed");
                false
            }
            Err(_) => {
                tracing::warn!(pod = %pod::full_name(p), containerName = %name, "stopping container timed out");
                false
            }
        }
    }

    /// Kill every running container of the pod (preStop hooks first, regular containers before
    /// sidecars, sidecars in reverse order), then stop its sandboxes. Returns false on failure.
    async fn kill_pod(&self, p: &Pod, rt: &PodRuntimeStatus, grace_override: Option<i64>) -> bool {
        let grace = effective_grace(p, grace_override);
        let running: Vec<&ContainerStatus> = rt
            .container_statuses
            .iter()
            .filter(|c| {
                matches!(
                    c.state,
                    ContainerState::Running | ContainerState::Unknown | ContainerState::Created
                )
            })
            .collect();
        let sidecar_names: Vec<String> = pod::init_containers(p)
            .iter()
            .filter(|c| pod::is_sidecar(c))
            .map(|c| c.name.clone())
            .collect();
        let mut ok = true;
        if sidecar_names.is_empty() {
            let kills = running.iter().map(|c| {
                let spec = find_spec(p, &c.metadata.name);
                self.kill_container(p, spec, &c.id, &c.metadata.name, grace, None)
            });
            ok &= join_all(kills).await.into_iter().all(|r| r);
        } else {
            // Every preStop hook runs at once; then regular containers stop, then sidecars in
            // reverse init order, all within the pod's grace period.
            let start = Instant::now();
            let hooks = running.iter().map(|c| {
                let spec = find_spec(p, &c.metadata.name);
                self.run_pre_stop(p, spec, &c.id, &c.metadata.name, grace)
            });
            join_all(hooks).await;
            let remaining = |s: Instant| grace - s.elapsed().as_secs() as i64;
            let regular = running
                .iter()
                .filter(|c| !sidecar_names.contains(&c.metadata.name))
                .map(|c| self.stop_container(p, &c.id, &c.metadata.name, remaining(start), None));
            ok &= join_all(regular).await.into_iter().all(|r| r);
            for name in sidecar_names.iter().rev() {
                for c in running.iter().filter(|c| &c.metadata.name == name) {
                    ok &= self
                        .stop_container(p, &c.id, name, remaining(start), None)
                        .await;
                }
            }
        }
        for s in rt
            .sandbox_statuses
            .iter()
            .filter(|s| s.state == SandboxState::Ready)
        {
            if let Err(e) = self.runtime.stop_pod_sandbox(&s.id).await
                && !e.is_not_found()
            {
                tracing::warn!(pod = %pod::full_name(p), error = %kubelet_api::chain(&e), "stopping sandbox failed");
                ok = false;
            }
        }
        ok
    }

    /// Remove container `c` of pod `p` and its log link; `false` when the runtime failed to
    /// remove it (a container it does not know counts as removed).
    async fn remove_container(&self, p: &Pod, c: &ContainerStatus) -> bool {
        let id = c.id.as_str();
        let mut removed = true;
        if let Err(e) = self.runtime.remove_container(id).await
            && !e.is_not_found()
        {
            tracing::warn!(containerID = %id, error = %kubelet_api::chain(&e), "removing container failed");
            removed = false;
        }
        self.exits.lock().remove(id);
        // The link's name is known from the pod and the container: no listing of the
        // directory, which holds every container's link.
        let link = self.log_link(p, &c.metadata.name, id);
        if let Err(e) = tokio::fs::remove_file(&link).await
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::debug!(link = %link.display(), error = %e, "removing the container log link failed");
        }
        removed
    }

    /// The kubelet's legacy log link of a container (`logSymlink`):
    /// `<container_log_dir>/<pod>_<ns>_<container>-<id>.log`, cut to 255 bytes.
    fn log_link(&self, p: &Pod, container: &str, id: &str) -> PathBuf {
        self.config.container_log_dir.join(pod::log_link_name(
            pod::name(p),
            pod::namespace(p),
            container,
            id,
        ))
    }

    /// The kubelet-managed `/etc/hosts` for a container (the kubelet's `makeHostsMount`):
    /// written to `<pod dir>/etc-hosts` and mounted unless the container mounts its own, the
    /// IPs of a pod on the pod network are not known yet, or the runtime's containers are host
    /// programs.
    async fn hosts_mount(
        &self,
        p: &Pod,
        c: &Container,
        pod_ips: &[String],
    ) -> Option<kubelet_api::runtime::Mount> {
        let host_network = p
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false);
        if self.runtime.images().is_none() || (pod_ips.is_empty() && !host_network) {
            return None;
        }
        let own = c
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.mount_path.trim_end_matches('/') == "/etc/hosts");
        if own {
            return None;
        }
        let spec = p.spec.as_ref();
        let aliases = spec
            .and_then(|s| s.host_aliases.clone())
            .unwrap_or_default();
        let content = if host_network {
            let node = tokio::fs::read_to_string("/etc/hosts")
                .await
                .unwrap_or_default();
            crate::hosts::host_network_hosts(&node, &aliases)
        } else {
            let crate::hosts::PodHostname { hostname, domain } =
                crate::hosts::hostname_and_domain(p, &self.config.cluster_domain);
            crate::hosts::managed_hosts(pod_ips, &hostname, domain.as_deref(), &aliases)
        };
        let path = self.pod_dir(p).join("etc-hosts");
        if let Err(e) = tokio::fs::write(&path, content).await {
            tracing::warn!(path = %path.display(), error = %kubelet_api::chain(&e), "writing the pod's hosts file failed; the container keeps the runtime's");
            return None;
        }
        Some(kubelet_api::runtime::Mount {
            container_path: PathBuf::from("/etc/hosts"),
            host_path: path,
            readonly: false,
        })
    }

    /// Link the started container's log into the container log directory (log shippers tail
    /// it). Failures are logged; they never fail the start.
    async fn create_log_link(&self, p: &Pod, container: &str, id: &str, log: &std::path::Path) {
        if tokio::fs::metadata(log).await.is_err() {
            return;
        }
        let link = self.log_link(p, container, id);
        let _ = tokio::fs::create_dir_all(&self.config.container_log_dir).await;
        let _ = tokio::fs::remove_file(&link).await;
        if let Err(e) = tokio::fs::symlink(log, &link).await {
            tracing::warn!(link = %link.display(), error = %kubelet_api::chain(&e), "creating the container log link failed");
        }
    }

    async fn purge_init_containers(&self, p: &Pod, rt: &PodRuntimeStatus) {
        for c in pod::init_containers(p) {
            for inst in rt.container_instances(&c.name) {
                self.remove_container(p, inst).await;
            }
        }
    }

    /// Keep the newest dead instance of each container (`minDeadContainerInPod` = 1), as the
    /// kubelet's container GC does; remove older ones.
    async fn prune_dead_containers(&self, p: &Pod, rt: &PodRuntimeStatus) {
        let names = pod::init_containers(p)
            .iter()
            .chain(pod::containers(p))
            .map(|c| c.name.as_str());
        for name in names {
            let dead: Vec<&ContainerStatus> = rt
                .container_instances(name)
                .filter(|c| c.state == ContainerState::Exited)
                .collect();
            for old in dead.iter().skip(1) {
                self.remove_container(p, old).await;
            }
        }
    }

    async fn fresh_status(&self, p: &Pod) -> Option<PodRuntimeStatus> {
        match get_pod_status(
            self.runtime.as_ref(),
            pod::uid(p),
            pod::name(p),
            pod::namespace(p),
        )
        .await
        {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(pod = %pod::full_name(p), error = %kubelet_api::chain(&e), "inspecting pod failed");
                None
            }
        }
    }

    /// Kill the pod. `Err(wait)` asks the worker to retry.
    ///
    /// `known`: the pod's runtime status from the PLEG's cache when it was observed after the
    /// worker's last sync (only syncs create containers, so it shows every one of them); the
    /// pod is inspected otherwise. Returns the inspection after the kill (`None` for an orphan
    /// or when it failed), which the cleanup uses to remove what the pod left: each inspection
    /// saved is four runtime calls per pod (containerd lists every sandbox and container for
    /// each), the kubelet's pod workers take the status to kill from the cache too.
    pub(crate) async fn sync_terminating_pod(
        &self,
        p: &Arc<Pod>,
        opts: &KillPodOptions,
        orphan: bool,
        known: Option<Arc<PodRuntimeStatus>>,
    ) -> Result<Option<PodRuntimeStatus>, Duration> {
        if let Some(prober) = &self.prober {
            prober.stop_liveness_and_startup(pod::uid(p));
        }
        if opts.evict && !orphan {
            // Before any container stops: a container that exits 0 on SIGTERM must not make
            // the pod Succeeded first (the kubelet applies the kill's status function to every
            // status it generates while terminating).
            self.status.set_terminal(
                p,
                Some((opts.reason.clone(), opts.message.clone())),
                opts.condition.clone(),
            );
        }
        let rt = match known {
            Some(rt) => rt,
            None => match self.fresh_status(p).await {
                Some(rt) => Arc::new(rt),
                None => return Err(ERROR_BACKOFF),
            },
        };
        let grace_override = if orphan {
            // Orphans: the grace period recorded on the containers, as the kubelet restores it.
            Some(
                rt.container_statuses
                    .iter()
                    .filter_map(|c| {
                        c.annotations
                            .get(kubelet_api::runtime::labels::POD_TERMINATION_GRACE_PERIOD)
                            .and_then(|g| g.parse::<i64>().ok())
                    })
                    .min()
                    .unwrap_or(30),
            )
        } else {
            opts.grace_period_override
        };
        if !self.kill_pod(p, &rt, grace_override).await {
            return Err(Duration::from_secs(1));
        }
        if orphan {
            return Ok(None);
        }
        // Publish the terminal status from a fresh look at the runtime.
        let after = self.fresh_status(p).await;
        if let Some(rt) = &after {
            let waiting = Waiting::new();
            let terminal = !pod::is_static(p);
            let api = self.generate_status(p, rt, &waiting, terminal);
            self.status.set_pod_status(p, api);
        }
        Ok(after)
    }

    /// After termination: tear down volumes and finalize the status.
    pub(crate) async fn sync_terminated_pod(
        &self,
        p: &Arc<Pod>,
        opts: &KillPodOptions,
        orphan: bool,
    ) {
        if orphan {
            return;
        }
        self.unmount_volumes(p).await;
        if opts.evict {
            self.status.set_terminal(
                p,
                Some((opts.reason.clone(), opts.message.clone())),
                opts.condition.clone(),
            );
        }
        self.status.terminate_pod(p);
    }

    async fn unmount_volumes(&self, p: &Pod) {
        self.mounted.lock().remove(pod::uid(p));
        let volumes = p
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_deref())
            .unwrap_or(&[]);
        for v in volumes {
            if let Some(plugin) = self.volume_plugins.iter().find(|pl| pl.can_support(v)) {
                let dir = self
                    .pod_dir(p)
                    .join("volumes")
                    .join(plugin.name())
                    .join(&v.name);
                if let Err(e) = plugin.tear_down(&v.name, &dir).await {
                    tracing::warn!(pod = %pod::full_name(p), volume = %v.name, error = %kubelet_api::chain(&e), "tearing down volume failed");
                }
            }
        }
    }

    /// The pod terminated and left every source: remove its containers, sandboxes, directories
    /// and status. `known`: the inspection after the pod's kill (nothing is created for a
    /// terminated pod, so it names everything there is to remove; a container the garbage
    /// collector removed since is not found, which is fine); the pod is inspected otherwise.
    /// Returns whether the runtime is known to have nothing of the pod left: every container
    /// and sandbox of the inspection removed (or not found).
    pub(crate) async fn cleanup_pod(
        &self,
        p: &Arc<Pod>,
        orphan: bool,
        known: Option<PodRuntimeStatus>,
    ) -> bool {
        let uid = pod::uid(p).to_string();
        self.start_metrics.forget(&uid);
        let rt = match known {
            Some(rt) => Some(rt),
            None => self.fresh_status(p).await,
        };
        let mut emptied = rt.is_some();
        if let Some(rt) = rt {
            for c in &rt.container_statuses {
                emptied &= self.remove_container(p, c).await;
            }
            for s in &rt.sandbox_statuses {
                if let Err(e) = self.runtime.remove_pod_sandbox(&s.id).await
                    && !e.is_not_found()
                {
                    tracing::warn!(podUID = %uid, error = %kubelet_api::chain(&e), "removing sandbox failed");
                    emptied = false;
                }
            }
        }
        // Orphans carry name, namespace and UID from the runtime's labels, which is all the
        // directory layout needs. Their memory-backed volumes are still mounted: unmount first.
        self.network_reported.lock().remove(&uid);
        if self.placement.lock().remove(&uid).is_some()
            && let Some(rm) = &self.resources
        {
            rm.pod_removed(p);
        }
        let pod_dir = self.pod_dir(p);
        let volumes_dir = pod_dir.join("volumes");
        let _ = tokio::task::spawn_blocking(move || crate::volume::unmount_all_below(&volumes_dir))
            .await;
        let _ = tokio::fs::remove_dir_all(pod_dir).await;
        let _ = tokio::fs::remove_dir_all(self.log_dir(p)).await;
        if !orphan {
            self.status.remove_pod(p);
        }
        if let Some(prober) = &self.prober {
            prober.remove_pod(&uid);
        }
        if let Some(objects) = &self.objects {
            objects.unregister_pod(p);
        }
        self.mounted.lock().remove(&uid);
        self.waiting.lock().remove(&uid);
        self.backoff.lock().remove_prefix(&format!("{uid}/"));
        let mut names = self.static_names.lock();
        let full = pod::full_name(p);
        if names.get(&full) == Some(&uid) {
            names.remove(&full);
        }
        emptied
    }
}

fn find_spec<'a>(p: &'a Pod, name: &str) -> Option<&'a Container> {
    pod::containers(p)
        .iter()
        .chain(pod::init_containers(p))
        .find(|c| c.name == name)
}

/// The pod's grace period: the deletion grace period or `terminationGracePeriodSeconds`, shortened
/// by an override.
fn effective_grace(p: &Pod, grace_override: Option<i64>) -> i64 {
    let base = p
        .metadata
        .deletion_grace_period_seconds
        .unwrap_or_else(|| pod::termination_grace_period(p));
    match grace_override {
        Some(o) => o.min(base).max(0),
        None => base,
    }
}

/// Grace period of a single container kill (`killContainer`): probe-level grace for probe kills.
fn kill_grace(
    p: &Pod,
    spec: Option<&Container>,
    reason: KillReason,
    override_: Option<i64>,
) -> i64 {
    if let Some(g) = p.metadata.deletion_grace_period_seconds {
        return g;
    }
    let probe_grace = spec.and_then(|c| match reason {
        KillReason::LivenessProbe => c
            .liveness_probe
            .as_ref()
            .and_then(|pr| pr.termination_grace_period_seconds),
        KillReason::StartupProbe => c
            .startup_probe
            .as_ref()
            .and_then(|pr| pr.termination_grace_period_seconds),
        _ => None,
    });
    override_
        .or(probe_grace)
        .unwrap_or_else(|| pod::termination_grace_period(p))
}

/// `d` plus a random 0-50 % (`wait.Jitter(d, 0.5)`).
fn jitter(d: Duration) -> Duration {
    let f: f64 = rand::rng().random_range(0.0..0.5);
    d + d.mul_f64(f)
}

/// A pod whose runtime events the PLEG holds while its worker syncs it; see
/// [`Engine::hold_pod`].
pub(crate) struct PodHold<'a> {
    engine: &'a Engine,
    uid: String,
    name: String,
    namespace: String,
    /// The sync changed the pod in the runtime: the release asks for an inspection.
    pub(crate) changed: bool,
    /// The pod is cleaned up for good and the runtime has nothing of it left: the PLEG may
    /// forget it instead of inspecting it ([`PodLifecycleEventGenerator::release_removed`]).
    pub(crate) gone: bool,
}

impl Drop for PodHold<'_> {
    fn drop(&mut self) {
        if let Some(pleg) = &self.engine.pleg {
            if self.gone {
                pleg.release_removed(&self.uid, &self.name, &self.namespace);
            } else {
                pleg.release(&self.uid, &self.name, &self.namespace, self.changed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grace_period_can_only_shrink() {
        let mut p = Pod {
            spec: Some(Default::default()),
            ..Default::default()
        };
        assert_eq!(effective_grace(&p, None), 30);
        assert_eq!(effective_grace(&p, Some(5)), 5);
        assert_eq!(effective_grace(&p, Some(60)), 30);
        p.metadata.deletion_grace_period_seconds = Some(10);
        assert_eq!(effective_grace(&p, None), 10);
    }
}

/// Why a container's image is not ready to run: its waiting reason ([`reason`](Self::reason))
/// and message (the `Display`, which names the runtime's answer as the kubelet's messages do).
#[derive(Debug, thiserror::Error)]
enum ImageError {
    /// The runtime could not say whether the image is present.
    #[error("Failed to inspect image {image:?}: {cause}")]
    Inspect {
        image: String,
        cause: kubelet_api::Error,
    },
    /// Absent with `imagePullPolicy: Never`.
    #[error("Container image {image:?} is not present with pull policy of Never")]
    NeverPull { image: String },
    /// A previous pull failed and its back-off has not passed.
    #[error("Back-off pulling image {image:?}")]
    BackOff { image: String },
    /// The pull failed.
    #[error("Failed to pull image {image:?}: {cause}")]
    Pull {
        image: String,
        cause: kubelet_api::Error,
    },
}

impl ImageError {
    /// The container's waiting reason (and the event's reason for `ErrImageNeverPull`).
    fn reason(&self) -> &'static str {
        match self {
            ImageError::Inspect { .. } => "ErrImageInspect",
            ImageError::NeverPull { .. } => "ErrImageNeverPull",
            ImageError::BackOff { .. } => "ImagePullBackOff",
            ImageError::Pull { .. } => "ErrImagePull",
        }
    }
}

/// The volumes of a pod that could not be set up (the kubelet's `unmounted volumes=[…]`).
#[derive(Debug, thiserror::Error)]
#[error("unmounted volumes=[{}]", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))]
struct UnmountedVolumes(Vec<VolumeFailure>);

/// One volume that could not be set up, and why.
#[derive(Debug)]
struct VolumeFailure {
    volume: String,
    /// The plugin's answer; `None` when no plugin supports the volume's type.
    cause: Option<kubelet_api::Error>,
}

impl std::fmt::Display for VolumeFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.cause {
            Some(e) => write!(f, "{}: {e}", self.volume),
            None => write!(
                f,
                "{}: no volume plugin supports this volume type",
                self.volume
            ),
        }
    }
}

/// Why a lifecycle hook failed (the text after `failed - error:` in the kubelet's messages).
/// The messages carry their cause (the runtime's or the HTTP client's answer) as the kubelet's
/// do; none is a `source`.
#[derive(Debug, thiserror::Error)]
enum HookError {
    /// The runtime could not run the command.
    #[error("{0}")]
    Runtime(kubelet_api::Error),
    /// The command ran and exited non-zero.
    #[error("command exited with {0}")]
    ExitCode(i32),
    /// The handler names no action.
    #[error("handler has no exec, httpGet or sleep action")]
    NoAction,
    /// The `httpGet` action does not make a request (a named port the container lacks).
    #[error("{0}")]
    Spec(kubelet_net::http::SpecError),
    /// The request failed (only a transport error fails an `httpGet` hook).
    #[error("{0}")]
    Http(HttpError),
    /// The hook ran out of its time (the grace period, or `runtimeRequestTimeout` for postStart).
    #[error("timed out after {}", crate::duration::format_go(*.0))]
    TimedOut(Duration),
}
