//! [`Collector`]: one pass over the machine, the runtime and the pods' directories makes a
//! [`Summary`].

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use jiff::Timestamp;
use kubelet_api::runtime::{self as model, ContainerState, ImageFsInfo, RuntimePod, SandboxState};
use kubelet_api::stats::{
    ContainerStats, CpuStats, FsStats, InterfaceStats, Machine, MemoryStats, NetworkStats,
    NodeStats, PodReference, PodStats, ProcessStats, RlimitStats, RuntimeStats, Summary,
    VolumeStats,
};
use kubelet_api::{AgentDirs, ContainerRuntime};
use tokio::time::Instant;

use crate::cgroup::{CgroupSample, CgroupSetup};
use crate::fs::{self, FsCapacity};
use crate::procfs;

/// The kubelet's `housekeepingInterval`: how often the collector samples.
pub const DEFAULT_HOUSEKEEPING_INTERVAL: Duration = Duration::from_secs(10);
/// The kubelet's `volumeStatsAggPeriod` (`--volume-stats-agg-period`): how often volume usage
/// is measured (a directory walk).
pub const DEFAULT_VOLUME_STATS_AGG_PERIOD: Duration = Duration::from_secs(60);
/// How long one runtime call of a collection may take before its item is left out.
pub const RUNTIME_CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the runtime may take to list every container's stats (CRI `ListContainerStats`,
/// or one call per container for a runtime without a listing call).
pub const LIST_STATS_TIMEOUT: Duration = Duration::from_secs(10);
/// A CPU figure older than this is no base for a rate (the kubelet's CRI stats provider drops
/// its CPU cache entries after 10 minutes, `defaultCachePeriod`).
const CPU_RATE_MAX_GAP: Duration = Duration::from_secs(600);

/// Volume plugins whose directories count as the pod's local ephemeral storage when they are
/// not memory-backed (the kubelet's emptyDir, configMap, downwardAPI, …).
const EPHEMERAL_VOLUME_PLUGINS: &[&str] = &[
    "kubernetes.io~empty-dir",
    "kubernetes.io~configmap",
    "kubernetes.io~secret",
    "kubernetes.io~downward-api",
    "kubernetes.io~projected",
];

/// Settings of a [`Collector`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StatsConfig {
    /// How often the plugin samples (default 10 s).
    pub housekeeping_interval: Duration,
    /// How often volume usage is measured (default 1 min); between two measurements a pod's
    /// volumes report the last figures.
    pub volume_stats_agg_period: Duration,
    /// procfs (`/proc`).
    pub proc_root: PathBuf,
    /// sysfs (`/sys`).
    pub sys_root: PathBuf,
    /// The cgroup setup; detected by [`StatsConfig::default`], `None` without cgroups.
    pub cgroup: Option<CgroupSetup>,
    /// The kernel log the OOM watcher reads (`/dev/kmsg`); `None` turns the watcher off.
    pub kmsg: Option<PathBuf>,
    /// More system containers of the summary, by name and cgroup: `pods` (the `kubepods`
    /// cgroup), `runtime` (`--runtime-cgroups`), `misc`; a `kubelet` entry
    /// (`--kubelet-cgroups`) replaces the agent's own cgroup.
    pub system_containers: Vec<(String, PathBuf)>,
}

impl Default for StatsConfig {
    fn default() -> Self {
        Self {
            housekeeping_interval: DEFAULT_HOUSEKEEPING_INTERVAL,
            volume_stats_agg_period: DEFAULT_VOLUME_STATS_AGG_PERIOD,
            proc_root: PathBuf::from("/proc"),
            sys_root: PathBuf::from("/sys"),
            cgroup: CgroupSetup::detect(),
            kmsg: Some(crate::oom::default_kmsg()),
            system_containers: Vec::new(),
        }
    }
}

impl StatsConfig {
    /// Report cgroup `cgroup` as system container `name` (`pods`, `runtime`, `kubelet`).
    pub fn system_container(mut self, name: impl Into<String>, cgroup: impl Into<PathBuf>) -> Self {
        self.system_containers.push((name.into(), cgroup.into()));
        self
    }

    /// Sample every `interval`.
    pub fn housekeeping_interval(mut self, interval: Duration) -> Self {
        self.housekeeping_interval = interval;
        self
    }

    /// Measure volumes every `period`.
    pub fn volume_stats_agg_period(mut self, period: Duration) -> Self {
        self.volume_stats_agg_period = period;
        self
    }

    /// Read procfs at `proc_root` and sysfs at `sys_root` (fixtures).
    pub fn roots(mut self, proc_root: impl Into<PathBuf>, sys_root: impl Into<PathBuf>) -> Self {
        self.proc_root = proc_root.into();
        self.sys_root = sys_root.into();
        self
    }

    /// Read the kernel log for OOM kills at `kmsg` (`None`: no OOM watcher).
    pub fn kmsg(mut self, kmsg: Option<PathBuf>) -> Self {
        self.kmsg = kmsg;
        self
    }

    /// Use `cgroup` instead of the detected setup.
    pub fn cgroup(mut self, cgroup: Option<CgroupSetup>) -> Self {
        self.cgroup = cgroup;
        self
    }
}

/// Read the machine's capacity: online CPUs and `MemTotal`.
pub fn read_machine(proc_root: &Path, sys_root: &Path) -> Machine {
    let cores = match procfs::read(&sys_root.join("devices/system/cpu/online"))
        .map(|t| procfs::count_cpu_list(&t))
    {
        Some(n) if n > 0 => n,
        _ => std::thread::available_parallelism().map_or(1, |n| n.get() as u64),
    };
    let memory = procfs::read(&proc_root.join("meminfo"))
        .and_then(|t| procfs::parse_meminfo(&t).get("MemTotal").copied())
        .unwrap_or(0);
    Machine::new(cores, memory)
}

/// Items that failed to be read: warned about once, then quiet until they work again.
#[derive(Debug, Default)]
struct Failing(HashSet<String>);

impl Failing {
    fn failed(&mut self, key: String, what: &str, error: &dyn std::fmt::Display) {
        if self.0.insert(key.clone()) {
            tracing::warn!(item = %key, error = %error, "{what}; left out of the stats until it can be read");
        } else {
            tracing::debug!(item = %key, error = %error, "{what}");
        }
    }

    fn ok(&mut self, key: &str) {
        self.0.remove(key);
    }
}

/// Makes [`Summary`] samples: the node from cgroups, `/proc` and `statvfs`; pods and
/// containers from the runtime (`list_pod_sandboxes`, `list_containers`, `list_container_stats`,
/// `image_fs_info`) and the pods' volume and log directories. CPU rates come from the
/// difference to the previous sample. Usable alone (see the crate's `summary` example); the
/// [`StatsPlugin`](crate::StatsPlugin) drives one in the agent.
#[derive(Debug)]
pub struct Collector {
    node_name: String,
    dirs: AgentDirs,
    config: StatsConfig,
    machine: Machine,
    boot_time: Option<Timestamp>,
    own_cgroup: Option<PathBuf>,
    /// The agent's CPU time comes from `/proc/self/stat`, not its cgroup: on v1 its `cpuacct`
    /// cgroup is not its memory cgroup (an agent started from a shell whose session has a
    /// memory cgroup only), so that cgroup's CPU would be somebody else's.
    own_cpu_from_proc: bool,
    /// Each pod's cgroup (relative to the hierarchy roots), found under the `pods` system
    /// container, by pod UID.
    pod_cgroups: HashMap<String, PathBuf>,
    /// Sandboxes found in the agent's own network namespace (host network), by pod UID: a
    /// sandbox keeps its namespace for life, so they are not looked up again.
    host_network_sandboxes: HashMap<String, String>,
    /// Previous cumulative CPU figure of the node and its system containers, by name.
    node_cpu: HashMap<String, (u64, Timestamp)>,
    /// Previous cumulative CPU figure of each container (by ID) and pod (`pod <uid>`).
    pod_cpu: HashMap<String, (u64, Timestamp)>,
    /// Each pod's volume figures and when they were measured.
    volumes: HashMap<String, (Instant, Vec<MeasuredVolume>)>,
    /// Each container's log usage and when it was measured.
    logs: HashMap<String, (Instant, Option<(u64, u64)>)>,
    /// Containers whose logs were looked at in this collection.
    log_seen: HashSet<String>,
    last_image_fs: Option<ImageFsInfo>,
    failing: Failing,
}

impl Collector {
    /// A collector for node `node_name` whose agent keeps its files in `dirs`.
    pub fn new(node_name: impl Into<String>, dirs: AgentDirs, config: StatsConfig) -> Self {
        let machine = read_machine(&config.proc_root, &config.sys_root);
        let boot_time = procfs::read(&config.proc_root.join("stat"))
            .and_then(|t| procfs::parse_boot_time(&t))
            .and_then(|s| Timestamp::from_second(s).ok());
        let self_cgroup = procfs::read(&config.proc_root.join("self/cgroup"));
        let own_cgroup = config.cgroup.as_ref().and_then(|c| {
            c.cgroup_of(self_cgroup.as_deref()?)
                .filter(|p| p != Path::new("/"))
        });
        let own_cpu_from_proc = match (&config.cgroup, self_cgroup.as_deref(), &own_cgroup) {
            (Some(CgroupSetup::V1 { .. }), Some(text), Some(memory)) => {
                crate::cgroup::v1_cgroup_of(text, "cpuacct").as_ref() != Some(memory)
            }
            _ => false,
        };
        Self {
            node_name: node_name.into(),
            dirs,
            config,
            machine,
            boot_time,
            own_cgroup,
            own_cpu_from_proc,
            pod_cgroups: HashMap::new(),
            host_network_sandboxes: HashMap::new(),
            node_cpu: HashMap::new(),
            pod_cpu: HashMap::new(),
            volumes: HashMap::new(),
            logs: HashMap::new(),
            log_seen: HashSet::new(),
            last_image_fs: None,
            failing: Failing::default(),
        }
    }

    /// The machine's capacity, read at construction.
    pub fn machine(&self) -> Machine {
        self.machine
    }

    /// When the machine booted (`btime` of `/proc/stat`).
    pub fn boot_time(&self) -> Option<Timestamp> {
        self.boot_time
    }

    /// The settings.
    pub fn config(&self) -> &StatsConfig {
        &self.config
    }

    /// One whole sample: [the node](Self::collect_node), then [the pods](Self::collect_pods).
    /// Without a runtime only the node is sampled. Nothing here fails: an item that cannot be
    /// read (a cgroup that vanished, a runtime call that failed or timed out, a directory that
    /// is gone) is left out and logged once.
    pub async fn collect(&mut self, runtime: Option<&dyn ContainerRuntime>) -> Summary {
        let node = self.collect_node(runtime).await;
        let pods = match runtime {
            Some(rt) => self.collect_pods(rt).await,
            None => Vec::new(),
        };
        let mut summary = Summary::new(self.node_name.clone());
        summary.node = node;
        summary.pods = pods;
        summary
    }

    /// The node's figures: the root cgroup, `/proc`, the filesystems, the system containers
    /// and the runtime's image filesystem (one runtime call). Its cost does not grow with the
    /// pods. CPU rates are against the previous node collection.
    pub async fn collect_node(&mut self, runtime: Option<&dyn ContainerRuntime>) -> NodeStats {
        let now = Timestamp::now();
        let mut seen = HashSet::new();
        let image_fs = match runtime {
            Some(rt) => self.image_fs(rt).await,
            None => None,
        };
        let node = self.node(now, image_fs.as_ref(), &mut seen);
        self.node_cpu.retain(|k, _| seen.contains(k));
        node
    }

    /// Every running pod's figures: the runtime's pods and container stats, the pods' and
    /// containers' cgroups, volumes and logs. Its cost grows with the pods. CPU rates are
    /// against the previous collection of the pods (none when that is older than 10 minutes,
    /// as the kubelet's CRI stats provider); writable layers are placed on the image
    /// filesystem of the last [node collection](Self::collect_node).
    pub async fn collect_pods(&mut self, rt: &dyn ContainerRuntime) -> Vec<PodStats> {
        let now = Timestamp::now();
        let mut seen = HashSet::new();
        let image_fs = self.last_image_fs.clone();
        let pods = self.pods(rt, now, image_fs.as_ref(), &mut seen).await;
        self.pod_cpu.retain(|k, _| seen.contains(k));
        let live: HashSet<&str> = pods.iter().map(|p| p.pod_ref.uid.as_str()).collect();
        self.volumes.retain(|uid, _| live.contains(uid.as_str()));
        self.pod_cgroups
            .retain(|uid, _| live.contains(uid.as_str()));
        self.host_network_sandboxes
            .retain(|uid, _| live.contains(uid.as_str()));
        let log_seen = std::mem::take(&mut self.log_seen);
        self.logs.retain(|id, _| log_seen.contains(id));
        pods
    }

    fn node(
        &mut self,
        now: Timestamp,
        image_fs: Option<&ImageFsInfo>,
        seen: &mut HashSet<String>,
    ) -> NodeStats {
        let mut n = NodeStats::default();
        n.node_name = self.node_name.clone();
        n.start_time = self.boot_time;
        let root = self
            .config
            .cgroup
            .as_ref()
            .and_then(|c| c.sample(Path::new("")));
        let stat = procfs::read(&self.config.proc_root.join("stat"));
        let cpu_ns = root
            .and_then(|r| r.cpu_usage_ns)
            .or_else(|| stat.as_deref().and_then(procfs::parse_stat_cpu_ns));
        n.cpu = cpu_rate(&mut self.node_cpu, "node", cpu_ns, now, seen);
        n.memory = self.node_memory(now, root.as_ref());
        n.network = self.node_network(now);
        n.fs = fs::capacity(&self.dirs.root_dir).map(|c| fs_stats(now, &c, None, None));
        let mut rt = RuntimeStats::default();
        rt.image_fs = match image_fs.and_then(|i| i.image_filesystems.first()) {
            Some(u) => {
                fs::capacity(&u.mountpoint).map(|c| fs_stats(now, &c, u.used_bytes, u.inodes_used))
            }
            // No image filesystem reported: images live on nodefs, as the kubelet assumes.
            None => n.fs.clone(),
        };
        rt.container_fs = image_fs
            .and_then(|i| i.container_filesystems.first())
            .and_then(|u| {
                fs::capacity(&u.mountpoint).map(|c| fs_stats(now, &c, u.used_bytes, u.inodes_used))
            });
        n.runtime = Some(rt);
        n.rlimit = Some(self.rlimit(now));
        let own = self
            .config
            .system_containers
            .iter()
            .any(|(name, _)| name == "kubelet");
        // (name, cgroup, CPU time from /proc/self/stat)
        let mut systems: Vec<(String, PathBuf, bool)> = Vec::new();
        if !own && let Some(c) = &self.own_cgroup {
            systems.push(("kubelet".into(), c.clone(), self.own_cpu_from_proc));
        }
        systems.extend(
            self.config
                .system_containers
                .iter()
                .map(|(n, c)| (n.clone(), c.clone(), false)),
        );
        for (name, cgroup, cpu_from_proc) in systems {
            let Some(s) = self
                .config
                .cgroup
                .as_ref()
                .and_then(|setup| setup.sample(&cgroup))
            else {
                continue;
            };
            let mut c = ContainerStats::new(&name);
            c.start_time = self.boot_time;
            let cpu_ns = if cpu_from_proc {
                procfs::read(&self.config.proc_root.join("self/stat"))
                    .and_then(|t| procfs::parse_pid_stat_cpu_ns(&t))
            } else {
                s.cpu_usage_ns
            };
            c.cpu = cpu_rate(&mut self.node_cpu, &name, cpu_ns, now, seen);
            c.memory = Some(memory_stats(now, &s));
            n.system_containers.push(c);
        }
        n
    }

    fn node_memory(&mut self, now: Timestamp, root: Option<&CgroupSample>) -> Option<MemoryStats> {
        let meminfo = procfs::read(&self.config.proc_root.join("meminfo"))
            .map(|t| procfs::parse_meminfo(&t))?;
        let total = meminfo.get("MemTotal").copied()?;
        let mut m = MemoryStats::new(now);
        match (self.config.cgroup.as_ref(), root) {
            // cAdvisor's root container on v1: the root cgroup's usage and inactive files.
            (Some(CgroupSetup::V1 { .. }), Some(r)) if r.memory_usage.is_some() => {
                m.usage_bytes = r.memory_usage;
                m.working_set_bytes = r.working_set();
                m.rss_bytes = r.rss;
                m.page_faults = r.page_faults;
                m.major_page_faults = r.major_page_faults;
            }
            // v2 (no memory.current at the root) or no cgroups: from /proc/meminfo.
            _ => {
                let used = total.saturating_sub(meminfo.get("MemFree").copied().unwrap_or(0));
                m.usage_bytes = Some(used);
                m.working_set_bytes =
                    Some(used.saturating_sub(meminfo.get("Inactive(file)").copied().unwrap_or(0)));
                m.rss_bytes = meminfo.get("AnonPages").copied();
                if let Some(vm) = procfs::read(&self.config.proc_root.join("vmstat")) {
                    let vm = crate::cgroup::parse_keyed(&vm);
                    m.page_faults = vm.get("pgfault").copied();
                    m.major_page_faults = vm.get("pgmajfault").copied();
                }
            }
        }
        m.available_bytes = m.working_set_bytes.map(|ws| total.saturating_sub(ws));
        Some(m)
    }

    fn node_network(&mut self, now: Timestamp) -> Option<NetworkStats> {
        let dev = procfs::read(&self.config.proc_root.join("net/dev"))?;
        let interfaces: Vec<InterfaceStats> = procfs::parse_net_dev(&dev)
            .into_iter()
            .map(interface_stats)
            .collect();
        let default = procfs::read(&self.config.proc_root.join("net/route"))
            .and_then(|t| procfs::default_route_interface(&t));
        let mut net = NetworkStats::new(now);
        net.default = interfaces
            .iter()
            .find(|i| Some(&i.name) == default.as_ref())
            .or_else(|| interfaces.first())
            .cloned()
            .unwrap_or_default();
        net.interfaces = interfaces;
        Some(net)
    }

    fn rlimit(&mut self, now: Timestamp) -> RlimitStats {
        let read_num = |rel: &str| {
            procfs::read(&self.config.proc_root.join(rel))
                .and_then(|t| t.trim().parse::<i64>().ok())
        };
        let mut r = RlimitStats::new(now);
        r.maxpid = match (
            read_num("sys/kernel/pid_max"),
            read_num("sys/kernel/threads-max"),
        ) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        r.curproc = procfs::read(&self.config.proc_root.join("loadavg"))
            .and_then(|t| procfs::parse_loadavg_tasks(&t))
            .map(|v| v as i64);
        r
    }

    async fn image_fs(&mut self, rt: &dyn ContainerRuntime) -> Option<ImageFsInfo> {
        match tokio::time::timeout(RUNTIME_CALL_TIMEOUT, kubelet_api::image_fs_info_of(rt)).await {
            Ok(Ok(info)) => {
                self.failing.ok("image_fs_info");
                self.last_image_fs = Some(info);
            }
            Ok(Err(e)) if e.kind() == kubelet_api::ErrorKind::Unimplemented => {
                self.last_image_fs = None;
            }
            Ok(Err(e)) => self.failing.failed(
                "image_fs_info".into(),
                "the runtime's image filesystem",
                &kubelet_api::chain(&e),
            ),
            Err(_) => self.failing.failed(
                "image_fs_info".into(),
                "the runtime's image filesystem",
                &"timed out",
            ),
        }
        self.last_image_fs.clone()
    }

    async fn pods(
        &mut self,
        rt: &dyn ContainerRuntime,
        now: Timestamp,
        image_fs: Option<&ImageFsInfo>,
        seen: &mut HashSet<String>,
    ) -> Vec<PodStats> {
        let listed = tokio::time::timeout(RUNTIME_CALL_TIMEOUT, model::get_pods(rt)).await;
        let pods = match listed {
            Ok(Ok(p)) => {
                self.failing.ok("list");
                p
            }
            Ok(Err(e)) => {
                self.failing.failed(
                    "list".into(),
                    "listing the runtime's pods",
                    &kubelet_api::chain(&e),
                );
                return Vec::new();
            }
            Err(_) => {
                self.failing
                    .failed("list".into(), "listing the runtime's pods", &"timed out");
                return Vec::new();
            }
        };
        let mut stats: HashMap<String, model::ContainerStats> =
            match tokio::time::timeout(LIST_STATS_TIMEOUT, rt.list_container_stats()).await {
                Ok(Ok(list)) => {
                    self.failing.ok("list_container_stats");
                    list.into_iter()
                        .map(|s| (s.container_id.clone(), s))
                        .collect()
                }
                Ok(Err(e)) => {
                    self.failing.failed(
                        "list_container_stats".into(),
                        "the containers' stats",
                        &kubelet_api::chain(&e),
                    );
                    HashMap::new()
                }
                Err(_) => {
                    self.failing.failed(
                        "list_container_stats".into(),
                        "the containers' stats",
                        &"timed out",
                    );
                    HashMap::new()
                }
            };
        let networks = self.sandbox_networks(rt).await;
        // Writable layers live on the container filesystem (the image filesystem unless split).
        let layer_fs = image_fs
            .and_then(|i| {
                i.container_filesystems
                    .first()
                    .or_else(|| i.image_filesystems.first())
            })
            .and_then(|u| fs::capacity(&u.mountpoint));
        let log_fs = fs::capacity(&self.dirs.pod_log_dir);
        let root_fs = fs::capacity(&self.dirs.root_dir);
        let mut out = Vec::new();
        for pod in pods {
            let filesystems = Filesystems {
                layers: layer_fs.as_ref(),
                logs: log_fs.as_ref(),
                root: root_fs.as_ref(),
            };
            if let Some(mut p) = self.pod(&pod, &mut stats, now, filesystems, seen) {
                let sandbox = pod
                    .sandboxes
                    .iter()
                    .find(|s| s.state == SandboxState::Ready);
                let from_runtime = sandbox.and_then(|s| networks.get(&s.id)).map(network_stats);
                p.network = match from_runtime {
                    Some(n) if !n.interfaces.is_empty() => Some(n),
                    // Nothing, or only the default interface (containerd 1.6's
                    // `PodSandboxStats`): the namespace's own figures, as cAdvisor reads them.
                    partial => sandbox
                        .and_then(|s| self.sandbox_network_from_procfs(&pod.uid, s, now))
                        .or_else(|| {
                            partial.map(|mut n| {
                                if !n.default.name.is_empty() {
                                    n.interfaces.push(n.default.clone());
                                }
                                n
                            })
                        }),
                };
                out.push(p);
            }
        }
        out
    }

    /// The sandboxes' network figures (CRI `ListPodSandboxStats`), by sandbox ID; none from a
    /// runtime without them (the process runtime: its pods use the host's network).
    async fn sandbox_networks(
        &mut self,
        rt: &dyn ContainerRuntime,
    ) -> HashMap<String, model::SandboxNetworkStats> {
        match tokio::time::timeout(LIST_STATS_TIMEOUT, rt.list_pod_sandbox_stats()).await {
            Ok(Ok(list)) => {
                self.failing.ok("list_pod_sandbox_stats");
                list.into_iter()
                    .filter_map(|s| Some((s.sandbox_id, s.network?)))
                    .collect()
            }
            Ok(Err(e)) if e.kind() == kubelet_api::ErrorKind::Unimplemented => HashMap::new(),
            Ok(Err(e)) => {
                self.failing.failed(
                    "list_pod_sandbox_stats".into(),
                    "the pod sandboxes' stats",
                    &kubelet_api::chain(&e),
                );
                HashMap::new()
            }
            Err(_) => {
                self.failing.failed(
                    "list_pod_sandbox_stats".into(),
                    "the pod sandboxes' stats",
                    &"timed out",
                );
                HashMap::new()
            }
        }
    }

    /// The cgroup of pod `uid` under the `pods` system container, once found remembered for
    /// the pod's life; `None` without cgroups, without a `pods` system container, or when the
    /// runtime put the pod elsewhere.
    fn pod_cgroup(&mut self, uid: &str) -> Option<PathBuf> {
        if let Some(p) = self.pod_cgroups.get(uid) {
            return Some(p.clone());
        }
        let setup = self.config.cgroup.as_ref()?;
        let (_, kubepods) = self
            .config
            .system_containers
            .iter()
            .find(|(name, _)| name == "pods")?;
        let found = crate::cgroup::find_pod_cgroup(setup, kubepods, uid)?;
        self.pod_cgroups.insert(uid.to_string(), found.clone());
        Some(found)
    }

    /// A sandbox's interfaces read from `/proc/<pid>/net/dev` of a process in its cgroup, for a
    /// runtime that reports none (containerd 1.6: its `ListPodSandboxStats` fails and
    /// `PodSandboxStats` has no network); cAdvisor's way. `None` for a sandbox in the agent's
    /// own network namespace (host network: the node's figures are not the pod's).
    fn sandbox_network_from_procfs(
        &mut self,
        uid: &str,
        sandbox: &model::PodSandbox,
        now: Timestamp,
    ) -> Option<NetworkStats> {
        if self.host_network_sandboxes.get(uid) == Some(&sandbox.id) {
            return None;
        }
        let setup = self.config.cgroup.as_ref()?;
        let pod = self.pod_cgroups.get(uid)?;
        let cgroup = crate::cgroup::find_container_cgroup(setup, pod, &sandbox.id)?;
        let pid = *crate::cgroup::cgroup_pids(&setup.dir("memory", &cgroup)?).first()?;
        let proc_root = &self.config.proc_root;
        let netns = |p: &Path| std::fs::read_link(p.join("ns/net")).ok();
        let own = netns(&proc_root.join("self"))?;
        if netns(&proc_root.join(pid.to_string()))? == own {
            self.host_network_sandboxes
                .insert(uid.to_string(), sandbox.id.clone());
            return None;
        }
        let dev = procfs::read(&proc_root.join(pid.to_string()).join("net/dev"))?;
        let interfaces: Vec<InterfaceStats> = procfs::parse_net_dev(&dev)
            .into_iter()
            .map(interface_stats)
            .collect();
        let mut net = NetworkStats::new(now);
        // The kubelet's default pod interface.
        net.default = interfaces
            .iter()
            .find(|i| i.name == "eth0")
            .or_else(|| interfaces.first())
            .cloned()
            .unwrap_or_default();
        net.interfaces = interfaces;
        Some(net)
    }

    fn pod(
        &mut self,
        pod: &RuntimePod,
        stats: &mut HashMap<String, model::ContainerStats>,
        now: Timestamp,
        filesystems: Filesystems<'_>,
        seen: &mut HashSet<String>,
    ) -> Option<PodStats> {
        let (layer_fs, log_fs) = (filesystems.layers, filesystems.logs);
        let sandbox = pod
            .sandboxes
            .iter()
            .find(|s| s.state == SandboxState::Ready)?;
        let mut p = PodStats::new(PodReference::new(
            pod.namespace.clone(),
            pod.name.clone(),
            pod.uid.clone(),
        ));
        p.start_time = Some(sandbox.created_at);
        let log_dir = self
            .dirs
            .pod_log_dir
            .join(format!("{}_{}_{}", pod.namespace, pod.name, pod.uid));
        let mut cpu_sum: Option<u64> = None;
        let mut memory = MemoryStats::new(now);
        let mut any_memory = false;
        let mut processes: Option<u64> = None;
        let mut ephemeral = (0u64, 0u64);
        let pod_cgroup = self.pod_cgroup(&pod.uid);
        let cgroup_setup = self.config.cgroup.clone();
        // The cgroup figures of a container (its memory limit), found under the pod's cgroup.
        let container_cgroup = |id: &str| {
            let setup = cgroup_setup.as_ref()?;
            setup.sample(&crate::cgroup::find_container_cgroup(
                setup,
                pod_cgroup.as_ref()?,
                id,
            )?)
        };
        for c in pod
            .containers
            .iter()
            .filter(|c| c.state == ContainerState::Running && c.pod_sandbox_id == sandbox.id)
        {
            let mut cs = ContainerStats::new(c.metadata.name.clone());
            cs.start_time = Some(c.created_at);
            cs.container_id = c.id.clone();
            cs.image = c.image.clone();
            // A container the runtime had no figures for is reported without them.
            if let Some(s) = stats.remove(&c.id) {
                cs.cpu = cpu_rate(
                    &mut self.pod_cpu,
                    &c.id,
                    s.cpu_usage_core_nanoseconds,
                    s.timestamp,
                    seen,
                );
                let mut m = MemoryStats::new(s.timestamp);
                m.usage_bytes = s.memory_usage_bytes;
                m.working_set_bytes = s.memory_working_set_bytes;
                m.rss_bytes = s.memory_rss_bytes;
                m.page_faults = s.memory_page_faults;
                m.major_page_faults = s.memory_major_page_faults;
                if s.memory_usage_bytes.is_some() || s.memory_working_set_bytes.is_some() {
                    any_memory = true;
                    add(&mut memory.usage_bytes, m.usage_bytes);
                    add(&mut memory.working_set_bytes, m.working_set_bytes);
                    add(&mut memory.rss_bytes, m.rss_bytes);
                    add(&mut memory.page_faults, m.page_faults);
                    add(&mut memory.major_page_faults, m.major_page_faults);
                    cs.memory = Some(m);
                }
                // What the CRI leaves out (the limit, so available bytes), from the cgroup,
                // as the kubelet fills it from cAdvisor.
                if let Some(m) = cs.memory.as_mut()
                    && let Some(cg) = container_cgroup(&c.id)
                {
                    let from_cgroup = memory_stats(now, &cg);
                    m.available_bytes = cg
                        .memory_limit
                        .zip(m.working_set_bytes)
                        .map(|(limit, ws)| limit.saturating_sub(ws));
                    m.rss_bytes = m.rss_bytes.or(from_cgroup.rss_bytes);
                    m.page_faults = m.page_faults.or(from_cgroup.page_faults);
                    m.major_page_faults = m.major_page_faults.or(from_cgroup.major_page_faults);
                }
                add(&mut cpu_sum, s.cpu_usage_core_nanoseconds);
                add(&mut processes, s.process_count);
                if s.writable_layer_bytes.is_some() {
                    ephemeral.0 += s.writable_layer_bytes.unwrap_or(0);
                    ephemeral.1 += s.writable_layer_inodes.unwrap_or(0);
                    cs.rootfs = Some(usage_on(
                        now,
                        layer_fs,
                        s.writable_layer_bytes,
                        s.writable_layer_inodes,
                    ));
                }
            }
            if let Some((used, inodes)) = self.log_usage(&c.id, &log_dir.join(&c.metadata.name)) {
                ephemeral.0 += used;
                ephemeral.1 += inodes;
                cs.logs = Some(usage_on(now, log_fs, Some(used), Some(inodes)));
            }
            p.containers.push(cs);
        }
        // The pod's own cgroup first (it also counts the sandbox, and has the pod's limit),
        // the sum of its containers otherwise: the kubelet's order.
        let pod_sample = self
            .config
            .cgroup
            .as_ref()
            .zip(pod_cgroup.as_ref())
            .and_then(|(setup, cg)| Some((setup.sample(cg)?, setup, cg)));
        if let Some((s, setup, cg)) = &pod_sample {
            cpu_sum = s.cpu_usage_ns.or(cpu_sum);
            if s.memory_usage.is_some() {
                memory = memory_stats(now, s);
                any_memory = true;
            }
            // Processes, as cAdvisor counts them (`pids.current` counts threads).
            processes = crate::cgroup::count_processes(setup, cg)
                .or(s.pids)
                .or(processes);
        }
        p.cpu = cpu_rate(
            &mut self.pod_cpu,
            &format!("pod {}", pod.uid),
            cpu_sum,
            now,
            seen,
        );
        if any_memory {
            p.memory = Some(memory);
        }
        p.process_stats = processes.map(ProcessStats::new);
        let (volumes, ephemeral_volumes) = self.pod_volumes(&pod.uid, now);
        p.volumes = volumes;
        ephemeral.0 += ephemeral_volumes.0;
        ephemeral.1 += ephemeral_volumes.1;
        p.ephemeral_storage = Some(usage_on(
            now,
            filesystems.root,
            Some(ephemeral.0),
            Some(ephemeral.1),
        ));
        Some(p)
    }

    /// A container's log directory usage, measured at most once per
    /// `volume_stats_agg_period` (a directory walk, like the volumes).
    fn log_usage(&mut self, container_id: &str, dir: &Path) -> Option<(u64, u64)> {
        self.log_seen.insert(container_id.to_string());
        if let Some((at, usage)) = self.logs.get(container_id)
            && at.elapsed() < self.config.volume_stats_agg_period
        {
            return *usage;
        }
        let usage = fs::disk_usage(dir);
        self.logs
            .insert(container_id.to_string(), (Instant::now(), usage));
        usage
    }

    /// The pod's volumes (measured at most once per `volume_stats_agg_period`) and the bytes
    /// and inodes of those that count as ephemeral storage.
    fn pod_volumes(&mut self, uid: &str, now: Timestamp) -> (Vec<VolumeStats>, (u64, u64)) {
        let fresh = self
            .volumes
            .get(uid)
            .is_some_and(|(at, _)| at.elapsed() < self.config.volume_stats_agg_period);
        if !fresh {
            let dir = self.dirs.root_dir.join("pods").join(uid).join("volumes");
            self.volumes.insert(
                uid.to_string(),
                (Instant::now(), measure_volumes(&dir, now)),
            );
        }
        let Some((_, vols)) = self.volumes.get(uid) else {
            return (Vec::new(), (0, 0));
        };
        let mut eph = (0, 0);
        for v in vols.iter().filter(|v| v.ephemeral) {
            eph.0 += v.stats.fs.used_bytes.unwrap_or(0);
            eph.1 += v.stats.fs.inodes_used.unwrap_or(0);
        }
        (vols.iter().map(|v| v.stats.clone()).collect(), eph)
    }
}

/// The filesystems of one collection: writable layers, logs, the root directory.
#[derive(Debug, Clone, Copy)]
struct Filesystems<'a> {
    layers: Option<&'a FsCapacity>,
    logs: Option<&'a FsCapacity>,
    root: Option<&'a FsCapacity>,
}

/// One measured volume.
#[derive(Debug, Clone)]
struct MeasuredVolume {
    stats: VolumeStats,
    /// Counts as the pod's ephemeral storage (a disk-backed emptyDir, configMap, …).
    ephemeral: bool,
}

/// Every volume directory `<volumes>/<plugin>/<name>`: its usage, and its filesystem's size.
fn measure_volumes(volumes: &Path, now: Timestamp) -> Vec<MeasuredVolume> {
    let mut out = Vec::new();
    let Ok(plugins) = std::fs::read_dir(volumes) else {
        return out;
    };
    for plugin in plugins.flatten() {
        let Ok(vols) = std::fs::read_dir(plugin.path()) else {
            continue;
        };
        let plugin_name = plugin.file_name();
        let ephemeral_kind = EPHEMERAL_VOLUME_PLUGINS
            .iter()
            .any(|p| plugin_name.to_str() == Some(*p));
        for v in vols.flatten() {
            let Ok(name) = v.file_name().into_string() else {
                continue;
            };
            let path = v.path();
            let Some(cap) = fs::capacity(&path) else {
                continue;
            };
            let mut s = fs_stats(now, &cap, None, None);
            if let Some((used, inodes)) = fs::disk_usage(&path) {
                s.used_bytes = Some(used);
                s.inodes_used = Some(inodes);
            }
            out.push(MeasuredVolume {
                stats: VolumeStats::new(name, s),
                ephemeral: ephemeral_kind && !cap.tmpfs,
            });
        }
    }
    kubelet_api::sort::by(&mut out, |a, b| a.stats.name.cmp(&b.stats.name));
    out
}

/// CPU figures with the rate since `previous`'s sample of `key` (none when that is more than
/// [`CPU_RATE_MAX_GAP`] old); records this sample as the next one's base.
fn cpu_rate(
    previous: &mut HashMap<String, (u64, Timestamp)>,
    key: &str,
    cumulative: Option<u64>,
    at: Timestamp,
    seen: &mut HashSet<String>,
) -> Option<CpuStats> {
    let cum = cumulative?;
    seen.insert(key.to_string());
    let mut c = CpuStats::new(at);
    c.usage_core_nano_seconds = Some(cum);
    if let Some((prev, prev_at)) = previous.get(key) {
        let dt = at.duration_since(*prev_at);
        let recent = dt.as_secs() < CPU_RATE_MAX_GAP.as_secs() as i64;
        let dt = dt.as_nanos();
        if dt > 0 && recent && cum >= *prev {
            c.usage_nano_cores = Some(((cum - prev) as u128 * 1_000_000_000 / dt as u128) as u64);
        }
    }
    previous.insert(key.to_string(), (cum, at));
    Some(c)
}

fn add(sum: &mut Option<u64>, v: Option<u64>) {
    if let Some(v) = v {
        *sum = Some(sum.unwrap_or(0).saturating_add(v));
    }
}

/// A filesystem's figures; `used`/`inodes_used` are the item's own (the filesystem's when
/// `None`).
fn fs_stats(
    now: Timestamp,
    c: &FsCapacity,
    used: Option<u64>,
    inodes_used: Option<u64>,
) -> FsStats {
    let mut s = FsStats::new(now);
    s.capacity_bytes = Some(c.capacity);
    s.available_bytes = Some(c.available);
    s.used_bytes = used.or(Some(c.used));
    if c.inodes > 0 {
        s.inodes = Some(c.inodes);
        s.inodes_free = Some(c.inodes_free);
        s.inodes_used = inodes_used.or(Some(c.inodes.saturating_sub(c.inodes_free)));
    } else {
        s.inodes_used = inodes_used;
    }
    s
}

/// An item's usage (`used`, `inodes_used`) on a filesystem whose size `capacity` gives, when
/// known.
fn usage_on(
    now: Timestamp,
    capacity: Option<&FsCapacity>,
    used: Option<u64>,
    inodes_used: Option<u64>,
) -> FsStats {
    match capacity {
        Some(c) => fs_stats(now, c, used, inodes_used),
        None => {
            let mut s = FsStats::new(now);
            s.used_bytes = used;
            s.inodes_used = inodes_used;
            s
        }
    }
}

/// Memory figures of a cgroup; available is its limit minus its working set.
fn memory_stats(now: Timestamp, s: &CgroupSample) -> MemoryStats {
    let mut m = MemoryStats::new(now);
    m.usage_bytes = s.memory_usage;
    m.working_set_bytes = s.working_set();
    m.rss_bytes = s.rss;
    m.page_faults = s.page_faults;
    m.major_page_faults = s.major_page_faults;
    m.available_bytes = s
        .memory_limit
        .zip(m.working_set_bytes)
        .map(|(l, ws)| l.saturating_sub(ws));
    m
}

/// A sandbox's network figures in the Summary's shape (the default interface inlined).
fn network_stats(n: &model::SandboxNetworkStats) -> NetworkStats {
    let convert = |i: &model::InterfaceUsage| {
        let mut s = InterfaceStats::new(i.name.clone());
        s.rx_bytes = i.rx_bytes;
        s.rx_errors = i.rx_errors;
        s.tx_bytes = i.tx_bytes;
        s.tx_errors = i.tx_errors;
        s
    };
    let mut net = NetworkStats::new(n.timestamp);
    net.default = n
        .default_interface
        .as_ref()
        .map(convert)
        .unwrap_or_default();
    net.interfaces = n.interfaces.iter().map(convert).collect();
    net
}

fn interface_stats(i: procfs::InterfaceCounters) -> InterfaceStats {
    let mut s = InterfaceStats::new(i.name);
    s.rx_bytes = Some(i.rx_bytes);
    s.rx_errors = Some(i.rx_errors);
    s.tx_bytes = Some(i.tx_bytes);
    s.tx_errors = Some(i.tx_errors);
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_needs_a_previous_figure_no_older_than_ten_minutes() {
        let mut previous = HashMap::new();
        let mut seen = HashSet::new();
        let t0 = Timestamp::from_second(1_000_000).unwrap();
        let first = cpu_rate(&mut previous, "c", Some(1_000), t0, &mut seen).unwrap();
        assert_eq!(first.usage_nano_cores, None, "one figure: no rate");
        // Half a core over 10 s.
        let t1 = t0 + jiff::SignedDuration::from_secs(10);
        let second = cpu_rate(&mut previous, "c", Some(5_000_001_000), t1, &mut seen).unwrap();
        assert_eq!(second.usage_nano_cores, Some(500_000_000));
        assert_eq!(second.usage_core_nano_seconds, Some(5_000_001_000));
        // Eleven minutes later: too old a base, as the kubelet's CRI stats provider.
        let t2 = t1 + jiff::SignedDuration::from_secs(660);
        let late = cpu_rate(&mut previous, "c", Some(6_000_000_000), t2, &mut seen).unwrap();
        assert_eq!(late.usage_nano_cores, None);
        // A counter that went back (a restarted container): no rate either.
        let t3 = t2 + jiff::SignedDuration::from_secs(10);
        let reset = cpu_rate(&mut previous, "c", Some(10), t3, &mut seen).unwrap();
        assert_eq!(reset.usage_nano_cores, None);
        assert!(seen.contains("c"));
        assert_eq!(cpu_rate(&mut previous, "d", None, t3, &mut seen), None);
    }
}
