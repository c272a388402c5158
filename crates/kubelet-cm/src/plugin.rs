//! [`ContainerManager`]: the agent plugin that puts the container manager together.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Container, Pod};
use kubelet_api::resources::{self, PodResourceManager, QosClass};
use kubelet_api::runtime::{
    ContainerFilter, ContainerState, LinuxResources, SandboxFilter, SandboxState, labels,
};
use kubelet_api::{
    AgentPlugin, InvolvedObject, NodeResources, PluginContext, PodAdmitHandler, ServiceConflict,
    Services,
};
use kubelet_stats::cgroup::CgroupValues;
use parking_lot::{Mutex, RwLock};
use tokio_util::sync::CancellationToken;

use crate::admission::{NodeFacts, ResourceAdmitHandler};
use crate::allocatable::{self, Allocatable, Capacity};
use crate::cgroups::{self, Hierarchy};
use crate::cpumanager::{CpuAdmitHandler, CpuSet, StaticPolicy, Topology};
use crate::{CmConfig, CmError, CpuManagerPolicy};

/// How often pod cgroups of finished pods are looked for (the kubelet's housekeeping).
const HOUSEKEEPING: Duration = Duration::from_secs(2);
/// Where the agent notes the pod cgroups it made.
const OWNED_DIR: &str = "pod-cgroups";
/// One cleanup pass in this many lists the pod cgroups; the others look at those this run made.
const FULL_LISTING_EVERY: u32 = 30;
/// A pod cgroup asked for this recently is never taken for an orphan.
const FRESH_POD: Duration = Duration::from_secs(30);
/// How often the QoS tiers are rewritten (`periodicQOSCgroupUpdateInterval`).
const QOS_UPDATE: Duration = Duration::from_secs(60);

/// The container manager plugin: QoS and pod cgroups, node allocatable, resource admission,
/// the OOM score policy and the CPU manager. Register it with the engine's builder
/// (`KubeletBuilder::plugin`) or through the facade, which does by default.
#[derive(Clone)]
pub struct ContainerManager {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ContainerManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContainerManager")
            .field("cgroups", &self.inner.hierarchy.is_some())
            .field("cpu_manager", &self.inner.cpu.is_some())
            .finish_non_exhaustive()
    }
}

struct Inner {
    config: CmConfig,
    hierarchy: Option<Hierarchy>,
    /// Why there are no pod cgroups although `cgroupsPerQOS` is set.
    no_cgroups: Option<String>,
    /// Whether `kubepods` got the node allocatable limits.
    enforced: bool,
    capacity: Capacity,
    allocatable: Allocatable,
    facts: Arc<RwLock<NodeFacts>>,
    admit: Arc<ResourceAdmitHandler>,
    cpu: Option<Arc<StaticPolicy>>,
    cpu_warning: Option<String>,
    /// The pods whose cgroup this agent made: their class and CPU request.
    pods: Mutex<HashMap<String, (QosClass, i64)>>,
    /// When each pod's cgroup was last asked for (every sync of a live pod asks).
    prepared_at: Mutex<HashMap<String, std::time::Instant>>,
    /// `<root-dir>/pod-cgroups`: one file per pod cgroup this agent made, so that after a
    /// restart it removes its own leftovers and never another agent's pod cgroups.
    owned: std::path::PathBuf,
    /// The cpuset last given to each running container (CPU manager reconcile).
    applied: Mutex<HashMap<String, String>>,
    /// Pods holding CPUs that the last reconcile did not find active.
    missing: Mutex<BTreeSet<String>>,
    failed_oom_check: AtomicBool,
    /// Cleanup passes since the first that listed the pod cgroups with the sources ready.
    cleanups: AtomicU32,
    /// Whether a cleanup pass listed the pod cgroups with the sources ready.
    swept: AtomicBool,
    /// Changes to [`pods`](Self::pods) so far.
    pods_changes: AtomicU64,
    /// The statuses' and `pods`' change counts when a cleanup pass last found nothing to do
    /// and nothing to look at again later: until either changes, the next passes would find
    /// the same.
    settled_at: Mutex<Option<(u64, u64)>>,
}

fn default_labels(node_name: &str, extra: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let mut l = BTreeMap::from([
        ("kubernetes.io/hostname".to_string(), node_name.to_string()),
        ("kubernetes.io/os".into(), "linux".into()),
        ("kubernetes.io/arch".into(), arch.into()),
        ("beta.kubernetes.io/os".into(), "linux".into()),
        ("beta.kubernetes.io/arch".into(), arch.into()),
    ]);
    l.extend(extra.clone());
    l
}

impl ContainerManager {
    /// The manager of node `node_name` under `config`: reads the machine, computes node
    /// allocatable, builds the QoS hierarchy (when `cgroupsPerQOS`; without a usable cgroup
    /// hierarchy, for example without root, pods run without pod cgroups and this is reported
    /// once) and loads the CPU manager's checkpoint. A wrong configuration value is an error.
    pub fn new(node_name: impl Into<String>, config: CmConfig) -> Result<Self, CmError> {
        let node_name = node_name.into();
        let machine = kubelet_stats::read_machine(&config.proc_root, &config.sys_root);
        let capacity = Capacity {
            cpu_milli: machine.num_cores as i64 * 1000,
            memory: machine.memory_capacity as i64,
            ephemeral_storage: kubelet_stats::fs::capacity(&config.root_dir)
                .map_or(0, |c| c.capacity as i64),
            pods: config.max_pods,
            pids: std::fs::read_to_string(config.proc_root.join("sys/kernel/pid_max"))
                .ok()
                .and_then(|t| t.trim().parse().ok())
                .unwrap_or(4_194_304),
        };
        let kube = allocatable::parse_reserved("kubeReserved", &config.kube_reserved)?;
        let system = allocatable::parse_reserved("systemReserved", &config.system_reserved)?;
        let reserved_cpus = CpuSet::parse(&config.reserved_system_cpus)
            .map_err(|e| CmError::Config(format!("reservedSystemCPUs: {e}")))?;
        if config.cpu_manager_reconcile_period.is_zero() {
            return Err(CmError::Config(
                "cpuManagerReconcilePeriod must be positive".into(),
            ));
        }
        for v in &config.enforce_node_allocatable {
            if !matches!(
                v.as_str(),
                "pods" | "none" | "system-reserved" | "kube-reserved"
            ) {
                return Err(CmError::Config(format!(
                    "enforceNodeAllocatable: unsupported value {v:?} (want pods, none, system-reserved or kube-reserved)"
                )));
            }
        }
        let allocatable = allocatable::compute(
            &capacity,
            &kube,
            &system,
            &config.eviction_hard,
            (!reserved_cpus.is_empty()).then_some(reserved_cpus.len() as i64),
        )?;

        let (cpu, cpu_warning) = match config.cpu_manager_policy {
            CpuManagerPolicy::None => (None, None),
            CpuManagerPolicy::Static => {
                let topology = Topology::read(&config.sys_root)?;
                let reserved = if reserved_cpus.is_empty() {
                    let milli = kube.get("cpu").copied().unwrap_or(0)
                        + system.get("cpu").copied().unwrap_or(0);
                    let n = ((milli + 999) / 1000) as usize;
                    if n == 0 {
                        CpuSet::default()
                    } else {
                        topology.take(&topology.all(), n).ok_or_else(|| {
                            CmError::Config(format!(
                                "the CPU reservation ({milli}m) exceeds the machine's CPUs"
                            ))
                        })?
                    }
                } else {
                    reserved_cpus.clone()
                };
                std::fs::create_dir_all(&config.root_dir).map_err(|e| {
                    CmError::State(format!("creating {}: {e}", config.root_dir.display()))
                })?;
                let (policy, warning) = StaticPolicy::new(topology, reserved, &config.root_dir)?;
                (Some(Arc::new(policy)), warning)
            }
        };

        let facts = Arc::new(RwLock::new(NodeFacts {
            node_name: node_name.clone(),
            labels: default_labels(&node_name, &config.node_labels),
            allocatable: allocatable.allocatable.clone(),
        }));
        let mut inner = Inner {
            admit: Arc::new(ResourceAdmitHandler::new(facts.clone())),
            facts,
            hierarchy: None,
            no_cgroups: None,
            enforced: false,
            capacity,
            allocatable,
            cpu,
            cpu_warning,
            pods: Mutex::default(),
            prepared_at: Mutex::default(),
            owned: config.root_dir.join(OWNED_DIR),
            applied: Mutex::default(),
            missing: Mutex::default(),
            failed_oom_check: AtomicBool::new(false),
            cleanups: AtomicU32::new(1),
            swept: AtomicBool::new(false),
            pods_changes: AtomicU64::new(0),
            settled_at: Mutex::default(),
            config,
        };
        if inner.config.cgroups_per_qos {
            match Hierarchy::detect(inner.config.cgroup_driver, &inner.config.cgroup_root) {
                None => {
                    inner.no_cgroups = Some("no cgroup hierarchy with a memory controller".into())
                }
                Some(h) => match inner.setup_tiers(&h) {
                    Ok(enforced) => {
                        inner.enforced = enforced;
                        inner.hierarchy = Some(h);
                    }
                    Err(e) => inner.no_cgroups = Some(kubelet_api::chain(&e).to_string()),
                },
            }
        }
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// Node allocatable and the `kubepods` limits.
    pub fn allocatable(&self) -> &Allocatable {
        &self.inner.allocatable
    }

    /// The machine's capacity as the manager read it.
    pub fn capacity(&self) -> &Capacity {
        &self.inner.capacity
    }

    /// The QoS hierarchy, when pod cgroups are in use.
    pub fn hierarchy(&self) -> Option<&Hierarchy> {
        self.inner.hierarchy.as_ref()
    }

    /// Why pod cgroups are not in use although `cgroupsPerQOS` is set.
    pub fn cgroups_disabled_reason(&self) -> Option<&str> {
        self.inner.no_cgroups.as_deref()
    }

    /// The CPU manager's static policy, when configured.
    pub fn cpu_manager(&self) -> Option<&Arc<StaticPolicy>> {
        self.inner.cpu.as_ref()
    }
}

impl Inner {
    /// Create `kubepods` and its tiers; returns whether the node allocatable limits were set.
    fn setup_tiers(&self, h: &Hierarchy) -> Result<bool, CmError> {
        let enforce = self
            .config
            .enforce_node_allocatable
            .iter()
            .any(|v| v == "pods");
        let mut top = CgroupValues::default();
        if enforce {
            let limits = &self.allocatable.pods_limits;
            top.cpu_shares = limits
                .get("cpu")
                .map(|m| resources::milli_cpu_to_shares(*m) as u64);
            top.memory_limit = limits.get("memory").copied().filter(|m| *m > 0);
            top.pids_limit = limits.get("pid").copied();
        }
        h.ensure(h.kubepods(), &top)?;
        let mut min = CgroupValues::default();
        min.cpu_shares = Some(resources::MIN_SHARES as u64);
        h.ensure(&h.tier(QosClass::Burstable), &min)?;
        h.ensure(&h.tier(QosClass::BestEffort), &min)?;
        Ok(enforce)
    }

    /// Note that pod `uid`'s cgroup is this agent's.
    fn own_pod(&self, uid: &str) {
        let note = || -> std::io::Result<()> {
            std::fs::create_dir_all(&self.owned)?;
            std::fs::write(self.owned.join(uid), b"")
        };
        if let Err(e) = note() {
            tracing::warn!(podUID = %uid, error = %e, "cannot note the pod cgroup as this agent's: it is not cleaned up after a restart");
        }
    }

    /// Whether pod `uid`'s cgroup is this agent's: made by this process, or noted by an
    /// earlier one (the note may be gone with the root directory; the memory is not).
    fn is_owned(&self, uid: &str) -> bool {
        self.pods.lock().contains_key(uid) || self.owned.join(uid).exists()
    }

    /// Pod `uid`'s cgroup is gone.
    fn forget_pod(&self, uid: &str) {
        self.pods.lock().remove(uid);
        self.pods_changes.fetch_add(1, Ordering::SeqCst);
        self.prepared_at.lock().remove(uid);
        self.admit.forget(uid);
        let _ = std::fs::remove_file(self.owned.join(uid));
    }

    /// Rewrite the Burstable tier's CPU shares from the Burstable pods' requests.
    fn update_qos_tiers(&self) {
        let Some(h) = &self.hierarchy else { return };
        let burstable: i64 = self
            .pods
            .lock()
            .values()
            .filter(|(q, _)| *q == QosClass::Burstable)
            .map(|(_, cpu)| *cpu)
            .sum();
        let mut v = CgroupValues::default();
        v.cpu_shares = Some(resources::milli_cpu_to_shares(burstable) as u64);
        if let Err(e) = h.update(&h.tier(QosClass::Burstable), &v) {
            tracing::warn!(error = %kubelet_api::chain(&e), "updating the Burstable QoS cgroup failed");
        }
        let mut v = CgroupValues::default();
        v.cpu_shares = Some(resources::MIN_SHARES as u64);
        if let Err(e) = h.update(&h.tier(QosClass::BestEffort), &v) {
            tracing::warn!(error = %kubelet_api::chain(&e), "updating the BestEffort QoS cgroup failed");
        }
    }

    fn memory_capacity(&self) -> u64 {
        self.capacity.memory.max(0) as u64
    }

    /// Remove the cgroups of pods that are gone or finished and whose containers no longer run.
    ///
    /// The kubelet lists the pod cgroups on every pass. Here the passes list them until one has
    /// run with the sources ready (cgroups an earlier run of the agent left), then one pass in
    /// [`FULL_LISTING_EVERY`]; the others look only at the pod cgroups this run made, which it
    /// knows: at 1,000 pods the listing was a tenth of the idle agent's CPU time. A pass that
    /// found nothing to remove and nothing to look at again later is not repeated (but for
    /// the full listings) until a pod status or this run's set of pod cgroups changes: the
    /// look-up of every pod's status was a tenth of the idle agent's CPU time too.
    async fn cleanup(&self, ctx: &PluginContext) {
        let Some(h) = &self.hierarchy else { return };
        let handle = ctx.handle();
        let statuses = handle.statuses();
        let ready = handle.sources_ready();
        // Read before the look-ups: a change after this point is seen by the next pass.
        let seen = (statuses.changes(), self.pods_changes.load(Ordering::SeqCst));
        // Until the sources are ready no unknown pod's cgroup may go, so the passes list until
        // one has run with the sources ready.
        let full = !self.swept.load(Ordering::Relaxed)
            || self
                .cleanups
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(FULL_LISTING_EVERY);
        if full && ready {
            self.swept.store(true, Ordering::Relaxed);
        }
        if !full && *self.settled_at.lock() == Some(seen) {
            return;
        }
        // Whether a pod's cgroup is to be looked at again without any change: a pod prepared
        // a moment ago, without a status yet.
        let again = AtomicBool::new(false);
        // Whether pod `uid`'s cgroup may go: the pod is gone or terminal.
        let may_go = |uid: &str| {
            // One lookup per pod cgroup, not a listing of every status every 2 s.
            let terminal = statuses.inspect(uid, |p| {
                matches!(
                    p.status.phase.as_deref(),
                    Some("Succeeded") | Some("Failed")
                )
            });
            match terminal {
                Some(false) => false,
                // Not known yet: it may still arrive from a source.
                None if !ready => false,
                // Prepared a moment ago: its first status may not be published yet.
                None => {
                    let may = self
                        .prepared_at
                        .lock()
                        .get(uid)
                        .is_none_or(|t| t.elapsed() >= FRESH_POD);
                    if !may {
                        again.store(true, Ordering::Relaxed);
                    }
                    may
                }
                Some(true) => true,
            }
        };
        let candidates: Vec<(String, QosClass)> = if full {
            h.list_pods()
                .into_iter()
                // Only this agent's: another agent sharing the hierarchy keeps its pods.
                .filter(|(uid, _)| self.is_owned(uid) && may_go(uid))
                .collect()
        } else {
            self.pods
                .lock()
                .iter()
                .filter(|(uid, _)| may_go(uid))
                .map(|(uid, (qos, _))| (uid.clone(), *qos))
                .collect()
        };
        // Nothing removed and nothing left to look at again: settled until something changes.
        let settled = ready && candidates.is_empty() && !again.load(Ordering::Relaxed);
        *self.settled_at.lock() = settled.then_some(seen);
        for (uid, qos) in candidates {
            if self.pod_still_runs(ctx, &uid).await {
                continue;
            }
            let name = h.pod(qos, &uid);
            match h.destroy(&name) {
                Ok(killed) => {
                    if killed > 0 {
                        tracing::warn!(podUID = %uid, killed, "killed processes left in the pod's cgroup");
                    }
                    tracing::debug!(podUID = %uid, cgroup = %name.to_path(h.driver()), "pod cgroup removed");
                    self.forget_pod(&uid);
                    self.update_qos_tiers();
                }
                // Busy: processes the kernel has not freed yet; the next pass retries.
                Err(e) => {
                    tracing::debug!(podUID = %uid, error = %kubelet_api::chain(&e), "pod cgroup not removed yet")
                }
            }
        }
    }

    async fn pod_still_runs(&self, ctx: &PluginContext, uid: &str) -> bool {
        let rt = ctx.runtime();
        let selector = BTreeMap::from([(labels::POD_UID.to_string(), uid.to_string())]);
        let cf = ContainerFilter {
            state: Some(ContainerState::Running),
            label_selector: selector.clone(),
            ..Default::default()
        };
        let sf = SandboxFilter {
            state: Some(SandboxState::Ready),
            label_selector: selector,
            ..Default::default()
        };
        match (
            rt.list_containers(&cf).await,
            rt.list_pod_sandboxes(&sf).await,
        ) {
            (Ok(c), Ok(s)) => !c.is_empty() || !s.is_empty(),
            // Unknown: keep it.
            _ => true,
        }
    }

    /// The CPU manager's reconcile: release the CPUs of pods no longer active, and move each
    /// running container to the CPU set it should have now.
    async fn reconcile_cpus(&self, ctx: &PluginContext) {
        let Some(policy) = &self.cpu else { return };
        if policy.broken().is_some() {
            return;
        }
        let handle = ctx.handle();
        let active: BTreeSet<String> = handle
            .statuses()
            .list()
            .into_iter()
            .filter(|p| {
                !matches!(
                    p.status.phase.as_deref(),
                    Some("Succeeded") | Some("Failed")
                )
            })
            .map(|p| kubelet_api::pod::uid(&p.pod).to_string())
            .collect();
        if handle.sources_ready() {
            // A pod just admitted may not have a status yet: its CPUs are released only when
            // it is missing from two reconciles in a row.
            let mut keep = active.clone();
            let mut missing = self.missing.lock();
            let now_missing: BTreeSet<String> = policy
                .assigned_pods()
                .into_iter()
                .filter(|u| !active.contains(u))
                .collect();
            keep.extend(now_missing.difference(&missing).cloned());
            *missing = now_missing;
            drop(missing);
            for uid in policy.remove_stale(&keep) {
                tracing::info!(podUID = %uid, "CPU manager released the CPUs of a finished pod");
            }
        }
        let filter = ContainerFilter {
            state: Some(ContainerState::Running),
            label_selector: BTreeMap::from([(labels::MANAGED_BY.into(), "true".into())]),
            ..Default::default()
        };
        let rt = ctx.runtime();
        let Ok(running) = rt.list_containers(&filter).await else {
            return;
        };
        let mut seen = BTreeSet::new();
        for c in running {
            let (Some(uid), Some(name)) = (
                c.labels.get(labels::POD_UID),
                c.labels.get(labels::CONTAINER_NAME),
            ) else {
                continue;
            };
            seen.insert(c.id.clone());
            let want = policy.cpuset(uid, name).to_string();
            if self.applied.lock().get(&c.id) == Some(&want) {
                continue;
            }
            let mut r = LinuxResources::default();
            r.cpuset_cpus = want.clone();
            match rt.update_container_resources(&c.id, &r).await {
                Ok(()) => {
                    self.applied.lock().insert(c.id.clone(), want);
                }
                Err(e) => {
                    tracing::warn!(containerID = %c.id, cpuset = %want, error = %kubelet_api::chain(&e), "CPU manager could not update a container's CPU set");
                }
            }
        }
        self.applied.lock().retain(|id, _| seen.contains(id));
    }
}

/// Whether this process holds `CAP_SYS_RESOURCE` (needed to lower `oom_score_adj`).
fn has_cap_sys_resource(proc_root: &std::path::Path) -> bool {
    std::fs::read_to_string(proc_root.join("self/status"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << 24) != 0)
}

impl PodResourceManager for ContainerManager {
    fn prepare_pod(&self, pod: &Pod) -> kubelet_api::Result<String> {
        let inner = &self.inner;
        let Some(h) = &inner.hierarchy else {
            return Ok(String::new());
        };
        let qos = cgroups::pod_qos(pod);
        let uid = cgroups::uid(pod);
        let name = h.pod(qos, uid);
        inner
            .prepared_at
            .lock()
            .insert(uid.to_string(), std::time::Instant::now());
        let known = inner.pods.lock().contains_key(uid);
        if !known || !h.exists(&name) {
            let values = cgroups::pod_values(
                pod,
                qos,
                inner.config.cpu_cfs_quota,
                inner.config.pod_pids_limit,
            )
            .map_err(|e| kubelet_api::Error::invalid_argument(e.to_string()))?;
            inner.own_pod(uid);
            h.ensure(&name, &values)
                .map_err(|e| kubelet_api::Error::internal(kubelet_api::chain(&e).to_string()))?;
            let cpu = resources::pod_requests(pod)
                .ok()
                .and_then(|r| r.get("cpu").copied())
                .unwrap_or(0);
            inner.pods.lock().insert(uid.to_string(), (qos, cpu));
            inner.pods_changes.fetch_add(1, Ordering::SeqCst);
            inner.update_qos_tiers();
        }
        Ok(name.to_path(h.driver()))
    }

    fn container_resources(
        &self,
        pod: &Pod,
        container: &Container,
        from_spec: Option<LinuxResources>,
    ) -> Option<LinuxResources> {
        let inner = &self.inner;
        let qos = cgroups::pod_qos(pod);
        let mut r = from_spec.unwrap_or_default();
        if r.cpu_shares == 0 {
            r.cpu_shares = resources::MIN_SHARES;
        }
        if !inner.config.cpu_cfs_quota {
            r.cpu_quota = 0;
        }
        r.oom_score_adj = Some(crate::oom::container_oom_score_adj(
            pod,
            qos,
            container,
            inner.memory_capacity(),
        ));
        if let Some(policy) = &inner.cpu
            && policy.broken().is_none()
        {
            r.cpuset_cpus = policy
                .cpuset(kubelet_api::pod::uid(pod), &container.name)
                .to_string();
        }
        Some(r)
    }

    fn pod_removed(&self, pod: &Pod) {
        let inner = &self.inner;
        let uid = cgroups::uid(pod);
        inner.prepared_at.lock().remove(uid);
        let Some(h) = &inner.hierarchy else { return };
        if !inner.is_owned(uid) {
            return;
        }
        let qos = inner
            .pods
            .lock()
            .get(uid)
            .map_or_else(|| cgroups::pod_qos(pod), |(q, _)| *q);
        match h.destroy(&h.pod(qos, uid)) {
            Ok(_) => {
                inner.forget_pod(uid);
                inner.update_qos_tiers();
            }
            // Busy: the housekeeping pass retries.
            Err(e) => {
                tracing::debug!(podUID = %uid, error = %kubelet_api::chain(&e), "pod cgroup not removed yet")
            }
        }
    }
}

#[async_trait]
impl AgentPlugin for ContainerManager {
    fn name(&self) -> &str {
        "container-manager"
    }

    fn admit_handlers(&self) -> Vec<Arc<dyn PodAdmitHandler>> {
        let mut v: Vec<Arc<dyn PodAdmitHandler>> = Vec::new();
        // The kubelet's order: resource allocation (the CPU manager) before the predicates.
        if let Some(p) = &self.inner.cpu {
            v.push(Arc::new(CpuAdmitHandler::new(p.clone())));
        }
        v.push(self.inner.admit.clone());
        v
    }

    fn provide_services(&self, services: &mut Services) -> Result<(), ServiceConflict> {
        services.provide::<dyn PodResourceManager>(self.name(), Arc::new(self.clone()))
    }

    fn node_resources(&self) -> NodeResources {
        let mut r = NodeResources::default();
        let cap = self.inner.capacity.as_map();
        r.capacity
            .insert("pods".into(), allocatable::to_quantity("pods", cap["pods"]));
        for (k, v) in &self.inner.facts.read().allocatable {
            r.allocatable
                .insert(k.clone(), allocatable::to_quantity(k, *v));
        }
        r
    }

    async fn run(
        &self,
        ctx: PluginContext,
        shutdown: CancellationToken,
    ) -> kubelet_api::Result<()> {
        let inner = &self.inner;
        let node = InvolvedObject::node(ctx.node_name());
        if let Some(why) = &inner.no_cgroups {
            tracing::warn!(reason = %why, "cgroupsPerQOS is set but pod cgroups cannot be made: pods run without them");
        }
        if inner.enforced {
            ctx.recorder().normal(
                node.clone(),
                "NodeAllocatableEnforced",
                "Updated Node Allocatable limit across pods",
            );
        } else if inner.config.cgroups_per_qos
            && inner.no_cgroups.is_some()
            && inner
                .config
                .enforce_node_allocatable
                .iter()
                .any(|v| v == "pods")
        {
            ctx.recorder().warning(
                node.clone(),
                "FailedNodeAllocatableEnforcement",
                format!(
                    "Failed to update Node Allocatable Limits: {}",
                    inner.no_cgroups.as_deref().unwrap_or_default()
                ),
            );
        }
        if let Some(w) = &inner.cpu_warning {
            tracing::warn!(problem = %w, "CPU manager");
            ctx.recorder()
                .warning(node.clone(), "CPUManagerCheckpointInvalid", w.clone());
        }
        if !has_cap_sys_resource(&inner.config.proc_root)
            && !inner.failed_oom_check.swap(true, Ordering::Relaxed)
        {
            tracing::warn!(
                "no CAP_SYS_RESOURCE: containers whose OOM score adjustment is below the agent's own (Guaranteed: -997) keep the inherited value"
            );
        }
        let mut housekeeping = tokio::time::interval(HOUSEKEEPING);
        let mut qos = tokio::time::interval(QOS_UPDATE);
        let mut cpus = tokio::time::interval(inner.config.cpu_manager_reconcile_period);
        for t in [&mut housekeeping, &mut qos, &mut cpus] {
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        }
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = housekeeping.tick() => inner.cleanup(&ctx).await,
                _ = qos.tick() => inner.update_qos_tiers(),
                _ = cpus.tick() => inner.reconcile_cpus(&ctx).await,
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_capability_bit_is_read_from_cap_eff() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("self")).unwrap();
        std::fs::write(
            dir.path().join("self/status"),
            "Name:\tx\nCapEff:\t00000000a80425fb\n",
        )
        .unwrap();
        assert!(!has_cap_sys_resource(dir.path()));
        std::fs::write(
            dir.path().join("self/status"),
            "CapEff:\t000001ffffffffff\n",
        )
        .unwrap();
        assert!(has_cap_sys_resource(dir.path()));
        let l = default_labels("n1", &BTreeMap::from([("a".to_string(), "b".to_string())]));
        assert_eq!(l["kubernetes.io/hostname"], "n1");
        assert_eq!(l["a"], "b");
    }
}
