//! [`MachineStats`]: the reference [`StatsProvider`] reading the real machine — cgroup v1 / v2
//! files, `/proc/meminfo`, `/proc/loadavg`, `statvfs` — and per-pod usage from a
//! [`ContainerRuntime`] plus the pod's volume and log directories.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use std::time::Duration;

use async_trait::async_trait;
use kubelet_api::runtime::ImageFsInfo;
use kubelet_api::{ContainerRuntime, ErrorKind};
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::error::EvictionError;
use crate::manager::FsLayout;
use crate::signal::Signal;
use crate::stats::{
    ActivePod, ContainerUsage, MemoryCgroup, Observations, PodUsage, SignalObservation,
    StatsProvider,
};

/// The cgroup hierarchy holding the memory controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupFs {
    /// cgroup v1: the mount point of the memory controller (`/sys/fs/cgroup/memory`).
    V1 {
        /// Mount point of the memory hierarchy.
        memory: PathBuf,
    },
    /// cgroup v2: the unified mount point (`/sys/fs/cgroup`).
    V2 {
        /// Mount point of the unified hierarchy.
        root: PathBuf,
    },
}

impl CgroupFs {
    /// Detect from `<proc_root>/self/mountinfo`: the v1 memory hierarchy if mounted, else a v2
    /// hierarchy offering the memory controller.
    pub fn detect(proc_root: &Path) -> Option<Self> {
        let text = std::fs::read_to_string(proc_root.join("self/mountinfo")).ok()?;
        Self::from_mountinfo(&text)
    }

    /// Pick the memory hierarchy from a mountinfo text (`kubelet-stats`' detection).
    pub fn from_mountinfo(text: &str) -> Option<Self> {
        let setup =
            kubelet_stats::CgroupSetup::from_mounts(&kubelet_stats::cgroup::parse_mountinfo(text))?;
        Self::from_setup(&setup)
    }

    /// The memory hierarchy of a detected cgroup setup.
    pub fn from_setup(setup: &kubelet_stats::CgroupSetup) -> Option<Self> {
        match setup.version() {
            kubelet_stats::CgroupVersion::V1 => Some(CgroupFs::V1 {
                memory: setup.dir("memory", Path::new(""))?,
            }),
            kubelet_stats::CgroupVersion::V2 => Some(CgroupFs::V2 {
                root: setup.dir("memory", Path::new(""))?,
            }),
        }
    }

    /// Directory of cgroup `rel` (relative to the hierarchy root).
    pub fn dir(&self, rel: &Path) -> PathBuf {
        let rel = rel.strip_prefix("/").unwrap_or(rel);
        match self {
            CgroupFs::V1 { memory } => memory.join(rel),
            CgroupFs::V2 { root } => root.join(rel),
        }
    }
}

/// What "node memory" means for `memory.available`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemorySource {
    /// The whole machine (the kubelet's meaning): capacity `MemTotal`, working set of the root
    /// cgroup (v1) or from `/proc/meminfo` (v2 or no cgroups).
    Node,
    /// A cgroup with a memory limit, treated as the node: capacity is its limit (or `MemTotal`
    /// when unlimited), working set its usage minus inactive file cache. Lets an embedder (or a
    /// test) run eviction against a slice of the machine.
    Cgroup(PathBuf),
}

/// Settings of [`MachineStats`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct MachineStatsConfig {
    /// procfs mount (`/proc`).
    pub proc_root: PathBuf,
    /// The memory cgroup hierarchy; `None` when there is none.
    pub cgroup: Option<CgroupFs>,
    /// What node memory is.
    pub memory: MemorySource,
    /// `allocatableMemory.available`: the pods' cgroup (relative to the hierarchy) and the
    /// node's allocatable memory in bytes. `None` leaves the signal unobserved.
    pub allocatable: Option<(PathBuf, u64)>,
    /// A path on nodefs (the kubelet's root dir); `None` leaves nodefs signals unobserved.
    pub nodefs: Option<PathBuf>,
    /// A path on the image filesystem, for runtimes that do not report one. The runtime's own
    /// report ([`ImageService::image_fs_info`](kubelet_api::ImageService::image_fs_info)) wins; without either, `imagefs.*` is read
    /// from nodefs, as in the kubelet when there is no separate image filesystem. See
    /// [`ImageFsSource`].
    pub imagefs: Option<PathBuf>,
    /// The kubelet's root dir: pod volumes live under `<root_dir>/pods/<uid>/volumes`.
    pub root_dir: Option<PathBuf>,
    /// The pod log dir: `<pod_log_dir>/<ns>_<name>_<uid>`.
    pub pod_log_dir: Option<PathBuf>,
}

impl MachineStatsConfig {
    /// The real machine: `/proc`, the detected cgroup hierarchy, the whole node's memory.
    pub fn detect() -> Self {
        let proc_root = PathBuf::from("/proc");
        Self {
            cgroup: CgroupFs::detect(&proc_root),
            proc_root,
            memory: MemorySource::Node,
            allocatable: None,
            nodefs: None,
            imagefs: None,
            root_dir: None,
            pod_log_dir: None,
        }
    }

    /// Explicit roots (for fixtures laid out like `/proc` and cgroupfs).
    pub fn with_roots(proc_root: impl Into<PathBuf>, cgroup: Option<CgroupFs>) -> Self {
        Self {
            proc_root: proc_root.into(),
            cgroup,
            memory: MemorySource::Node,
            allocatable: None,
            nodefs: None,
            imagefs: None,
            root_dir: None,
            pod_log_dir: None,
        }
    }

    /// Treat cgroup `rel` as the node's memory.
    pub fn memory_cgroup(mut self, rel: impl Into<PathBuf>) -> Self {
        self.memory = MemorySource::Cgroup(rel.into());
        self
    }

    /// Observe nodefs at `path` and take pod volumes from `<path>/pods`.
    pub fn root_dir(mut self, path: impl Into<PathBuf>) -> Self {
        let p = path.into();
        self.nodefs = Some(p.clone());
        self.root_dir = Some(p);
        self
    }

    /// Observe the image filesystem at `path` when the runtime reports none (see
    /// [`imagefs`](Self::imagefs)).
    pub fn imagefs(mut self, path: impl Into<PathBuf>) -> Self {
        self.imagefs = Some(path.into());
        self
    }

    /// Pod logs live under `path`.
    pub fn pod_log_dir(mut self, path: impl Into<PathBuf>) -> Self {
        self.pod_log_dir = Some(path.into());
        self
    }

    /// Observe `allocatableMemory.available` on cgroup `rel` with `capacity` bytes.
    pub fn allocatable(mut self, rel: impl Into<PathBuf>, capacity: u64) -> Self {
        self.allocatable = Some((rel.into(), capacity));
        self
    }
}

/// How long [`MachineStats`] waits for the runtime's `image_fs_info` before falling back to the
/// last image filesystem it reported: the full synchronisation (and with it the fast memory
/// check) must not hang on a stuck runtime.
pub const IMAGE_FS_INFO_TIMEOUT: Duration = Duration::from_secs(2);

/// Where [`MachineStats`] reads `imagefs.available` / `imagefs.inodesFree` (capacity, available
/// bytes and free inodes from `statvfs` of that path, as cAdvisor does for the kubelet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageFsSource {
    /// The mountpoint of the runtime's first image filesystem (CRI `ImageFsInfo`), or the last
    /// one it reported when the runtime did not answer this time.
    Runtime(PathBuf),
    /// The configured path ([`MachineStatsConfig::imagefs`]): the runtime reports none.
    Configured(PathBuf),
    /// Nodefs: the runtime reports no image filesystem and none is configured, so images are
    /// taken to live on the node filesystem.
    NodeFs(PathBuf),
}

impl ImageFsSource {
    /// The path whose filesystem is observed.
    pub fn path(&self) -> &Path {
        match self {
            ImageFsSource::Runtime(p) | ImageFsSource::Configured(p) | ImageFsSource::NodeFs(p) => {
                p
            }
        }
    }
}

/// The reference [`StatsProvider`]: reads the machine, and the runtime for per-pod usage and the
/// image filesystem.
#[derive(Clone)]
pub struct MachineStats {
    config: MachineStatsConfig,
    runtime: Option<Arc<dyn ContainerRuntime>>,
    /// The runtime's image and container filesystems as last reported.
    last_image_fs: Arc<Mutex<Option<ImageFsInfo>>>,
}

impl std::fmt::Debug for MachineStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MachineStats")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Memory figures of one cgroup or of the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryFigures {
    /// Capacity, bytes.
    pub capacity: u64,
    /// Usage, bytes.
    pub usage: u64,
    /// Inactive file cache, bytes.
    pub inactive_file: u64,
}

impl MemoryFigures {
    /// Working set: usage minus inactive file cache.
    pub fn working_set(&self) -> u64 {
        self.usage.saturating_sub(self.inactive_file)
    }

    /// Available: capacity minus working set.
    pub fn available(&self) -> i64 {
        self.capacity as i64 - self.working_set() as i64
    }
}

impl MachineStats {
    /// A provider with `config` and no runtime (pods then have no usage and rank first).
    pub fn new(config: MachineStatsConfig) -> Self {
        Self {
            config,
            runtime: None,
            last_image_fs: Arc::default(),
        }
    }

    /// Take per-container usage (`ContainerRuntime::container_stats`) and the image filesystem
    /// (`ImageService::image_fs_info`) from `runtime`.
    pub fn with_runtime(mut self, runtime: Arc<dyn ContainerRuntime>) -> Self {
        self.runtime = Some(runtime);
        self
    }

    /// The settings.
    pub fn config(&self) -> &MachineStatsConfig {
        &self.config
    }

    fn read(&self, path: &Path) -> Result<String, EvictionError> {
        std::fs::read_to_string(path).map_err(|source| EvictionError::ReadStats {
            path: path.to_path_buf(),
            source,
        })
    }

    fn meminfo(&self) -> Result<std::collections::BTreeMap<String, u64>, EvictionError> {
        let path = self.config.proc_root.join("meminfo");
        let out = kubelet_stats::procfs::parse_meminfo(&self.read(&path)?);
        if !out.contains_key("MemTotal") {
            return Err(EvictionError::ParseStats {
                path,
                reason: "no MemTotal".into(),
            });
        }
        Ok(out)
    }

    fn mem_total(&self) -> Result<u64, EvictionError> {
        Ok(self.meminfo()?.get("MemTotal").copied().unwrap_or(0))
    }

    fn read_u64(&self, path: &Path) -> Result<u64, EvictionError> {
        let text = self.read(path)?;
        text.trim()
            .parse::<u64>()
            .map_err(|_| EvictionError::ParseStats {
                path: path.to_path_buf(),
                reason: format!("not a number: {:?}", text.trim()),
            })
    }

    fn stat_field(&self, path: &Path, key: &str) -> Result<u64, EvictionError> {
        let text = self.read(path)?;
        text.lines()
            .find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == key).then(|| v.trim().parse::<u64>().ok()).flatten()
            })
            .ok_or_else(|| EvictionError::ParseStats {
                path: path.to_path_buf(),
                reason: format!("no {key}"),
            })
    }

    /// Memory figures of cgroup `rel`; capacity is its limit, capped by `MemTotal`.
    pub fn cgroup_memory(&self, rel: &Path) -> Result<MemoryFigures, EvictionError> {
        let Some(fs) = &self.config.cgroup else {
            return Err(EvictionError::ParseStats {
                path: rel.to_path_buf(),
                reason: "no memory cgroup hierarchy".into(),
            });
        };
        let dir = fs.dir(rel);
        let total = self.mem_total()?;
        match fs {
            CgroupFs::V1 { .. } => {
                let limit = self.read_u64(&dir.join("memory.limit_in_bytes"))?;
                let usage = self.read_u64(&dir.join("memory.usage_in_bytes"))?;
                let inactive = self.stat_field(&dir.join("memory.stat"), "total_inactive_file")?;
                Ok(MemoryFigures {
                    capacity: limit.min(total),
                    usage,
                    inactive_file: inactive,
                })
            }
            CgroupFs::V2 { .. } => {
                let max_path = dir.join("memory.max");
                let max = self.read(&max_path)?;
                let limit = match max.trim() {
                    "max" => u64::MAX,
                    v => v.parse().map_err(|_| EvictionError::ParseStats {
                        path: max_path,
                        reason: format!("not a limit: {v:?}"),
                    })?,
                };
                let usage = self.read_u64(&dir.join("memory.current"))?;
                let inactive = self.stat_field(&dir.join("memory.stat"), "inactive_file")?;
                Ok(MemoryFigures {
                    capacity: limit.min(total),
                    usage,
                    inactive_file: inactive,
                })
            }
        }
    }

    /// Memory figures of the node as configured by [`MemorySource`].
    pub fn node_memory(&self) -> Result<MemoryFigures, EvictionError> {
        match &self.config.memory {
            MemorySource::Cgroup(rel) => self.cgroup_memory(rel),
            MemorySource::Node => {
                let mi = self.meminfo()?;
                let total = mi.get("MemTotal").copied().unwrap_or(0);
                if let Some(CgroupFs::V1 { memory }) = &self.config.cgroup {
                    // cAdvisor's root container: root cgroup usage minus total_inactive_file.
                    let usage = self.read_u64(&memory.join("memory.usage_in_bytes"))?;
                    let inactive =
                        self.stat_field(&memory.join("memory.stat"), "total_inactive_file")?;
                    return Ok(MemoryFigures {
                        capacity: total,
                        usage,
                        inactive_file: inactive,
                    });
                }
                // v2 has no memory.current at the root: usage from meminfo, as cAdvisor.
                let free = mi.get("MemFree").copied().unwrap_or(0);
                let inactive = mi.get("Inactive(file)").copied().unwrap_or(0);
                Ok(MemoryFigures {
                    capacity: total,
                    usage: total.saturating_sub(free),
                    inactive_file: inactive,
                })
            }
        }
    }

    fn memory_observations(&self, now: Instant) -> Result<Observations, EvictionError> {
        let mut out = Observations::new();
        let m = self.node_memory()?;
        out.insert(
            Signal::MemoryAvailable,
            SignalObservation {
                available: m.available(),
                capacity: m.capacity as i64,
                time: now,
            },
        );
        if let Some((rel, capacity)) = &self.config.allocatable {
            match self.cgroup_memory(rel) {
                Ok(f) => {
                    out.insert(
                        Signal::AllocatableMemoryAvailable,
                        SignalObservation {
                            available: *capacity as i64 - f.working_set() as i64,
                            capacity: *capacity as i64,
                            time: now,
                        },
                    );
                }
                Err(e) => {
                    tracing::debug!(error = %kubelet_api::chain(&e), "allocatable memory not observed")
                }
            }
        }
        Ok(out)
    }

    /// `pid.available`: `kernel/pid_max` minus the number of tasks (`/proc/loadavg`).
    pub fn pids(&self) -> Result<(i64, i64), EvictionError> {
        let max = self.read_u64(&self.config.proc_root.join("sys/kernel/pid_max"))? as i64;
        let path = self.config.proc_root.join("loadavg");
        let text = self.read(&path)?;
        let running = kubelet_stats::procfs::parse_loadavg_tasks(&text)
            .map(|n| n as i64)
            .ok_or_else(|| EvictionError::ParseStats {
                path,
                reason: format!("unexpected content {:?}", text.trim()),
            })?;
        Ok((max - running, max))
    }

    /// The runtime's image and container filesystems: asked now (within
    /// [`IMAGE_FS_INFO_TIMEOUT`]), else as last reported. `None` when the runtime does not
    /// report one (no runtime, `Unimplemented`, an empty list) or has never answered.
    pub async fn runtime_image_fs(&self) -> Option<ImageFsInfo> {
        let rt = self.runtime.as_ref()?;
        let answer = tokio::time::timeout(
            IMAGE_FS_INFO_TIMEOUT,
            kubelet_api::image_fs_info_of(rt.as_ref()),
        )
        .await;
        let mut last = self.last_image_fs.lock();
        match answer {
            Ok(Ok(info)) if !info.image_filesystems.is_empty() => {
                *last = Some(info);
            }
            Ok(Ok(_)) => {
                tracing::debug!("the runtime reports no image filesystem");
                *last = None;
            }
            Ok(Err(e)) if e.kind() == ErrorKind::Unimplemented => {
                tracing::debug!(error = %kubelet_api::chain(&e), "the runtime reports no image filesystem");
                *last = None;
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %kubelet_api::chain(&e), "image_fs_info failed; using the last report");
            }
            Err(_) => tracing::warn!(
                timeout = ?IMAGE_FS_INFO_TIMEOUT,
                "image_fs_info timed out; using the last report"
            ),
        }
        last.clone()
    }

    /// Where `imagefs.*` is read now (see [`ImageFsSource`]); `None` when neither the runtime,
    /// the configuration nor nodefs gives a path.
    pub async fn image_fs(&self) -> Option<ImageFsSource> {
        let info = self.runtime_image_fs().await;
        self.image_fs_from(info.as_ref())
    }

    fn image_fs_from(&self, info: Option<&ImageFsInfo>) -> Option<ImageFsSource> {
        if let Some(fs) = info.and_then(|i| i.image_filesystems.first()) {
            return Some(ImageFsSource::Runtime(fs.mountpoint.clone()));
        }
        if let Some(p) = &self.config.imagefs {
            return Some(ImageFsSource::Configured(p.clone()));
        }
        self.config.nodefs.clone().map(ImageFsSource::NodeFs)
    }

    /// The filesystem layout for node-level reclaim
    /// ([`EvictionManager::with_reclaimer`](crate::EvictionManager::with_reclaimer)), as the
    /// kubelet's `HasDedicatedImageFs` decides it: the image filesystem is dedicated when it
    /// is on another device than nodefs; split when the runtime also reports a container
    /// filesystem on another device than the images.
    pub async fn fs_layout(&self) -> FsLayout {
        use std::os::unix::fs::MetadataExt;
        let dev = |p: &Path| std::fs::metadata(p).ok().map(|m| m.dev());
        let Some(node) = self.config.nodefs.as_deref().and_then(dev) else {
            return FsLayout::Single;
        };
        let info = self.runtime_image_fs().await;
        let image = self
            .image_fs_from(info.as_ref())
            .and_then(|source| dev(source.path()));
        let Some(image) = image.filter(|d| *d != node) else {
            return FsLayout::Single;
        };
        let container = info
            .as_ref()
            .and_then(|i| i.container_filesystems.first())
            .and_then(|fs| dev(&fs.mountpoint));
        match container {
            Some(c) if c != image => FsLayout::SplitContainerFs,
            _ => FsLayout::SeparateImageFs,
        }
    }

    fn fs_observations(
        &self,
        path: &Path,
        bytes: Signal,
        inodes: Signal,
        now: Instant,
        out: &mut Observations,
    ) -> Result<(), EvictionError> {
        let st = nix::sys::statvfs::statvfs(path).map_err(|source| EvictionError::Statvfs {
            path: path.to_path_buf(),
            source,
        })?;
        let frsize = st.fragment_size() as i64;
        out.insert(
            bytes,
            SignalObservation {
                available: st.blocks_available() as i64 * frsize,
                capacity: st.blocks() as i64 * frsize,
                time: now,
            },
        );
        if st.files() > 0 {
            out.insert(
                inodes,
                SignalObservation {
                    available: st.files_free() as i64,
                    capacity: st.files() as i64,
                    time: now,
                },
            );
        }
        Ok(())
    }
}

use kubelet_stats::fs::disk_usage;

#[async_trait]
impl StatsProvider for MachineStats {
    async fn observe(&self) -> Result<Observations, EvictionError> {
        let now = Instant::now();
        let mut out = self.memory_observations(now)?;
        match self.pids() {
            Ok((available, capacity)) => {
                out.insert(
                    Signal::PidAvailable,
                    SignalObservation {
                        available,
                        capacity,
                        time: now,
                    },
                );
            }
            Err(e) => {
                tracing::debug!(error = %kubelet_api::chain(&e), "pid.available not observed")
            }
        }
        if let Some(p) = &self.config.nodefs
            && let Err(e) = self.fs_observations(
                p,
                Signal::NodeFsAvailable,
                Signal::NodeFsInodesFree,
                now,
                &mut out,
            )
        {
            tracing::warn!(error = %kubelet_api::chain(&e), "nodefs not observed");
        }
        if let Some(source) = self.image_fs().await
            && let Err(e) = self.fs_observations(
                source.path(),
                Signal::ImageFsAvailable,
                Signal::ImageFsInodesFree,
                now,
                &mut out,
            )
        {
            tracing::warn!(error = %kubelet_api::chain(&e), ?source, "imagefs not observed");
        }
        Ok(out)
    }

    async fn observe_memory(&self) -> Result<Observations, EvictionError> {
        self.memory_observations(Instant::now())
    }

    async fn pod_usage(&self, pods: &[ActivePod]) -> HashMap<String, PodUsage> {
        let mut out = HashMap::new();
        for p in pods {
            let mut usage = PodUsage::default();
            let mut any = false;
            if let Some(rt) = &self.runtime {
                for (name, id) in &p.containers {
                    match rt.container_stats(id).await {
                        Ok(s) => {
                            any = true;
                            if let Some(i) = s.writable_layer_inodes {
                                usage.inodes = Some(usage.inodes.unwrap_or(0) + i);
                            }
                            usage.containers.push(ContainerUsage {
                                name: name.clone(),
                                memory_working_set: s.memory_working_set_bytes,
                                processes: s.process_count,
                                // The writable layer; the logs are added below.
                                disk_bytes: s.writable_layer_bytes,
                            });
                        }
                        Err(e) => {
                            tracing::debug!(containerID = %id, error = %kubelet_api::chain(&e), "no container stats")
                        }
                    }
                }
            }
            // Volumes: every plugin's directory counts towards the pod; emptyDirs also
            // individually (for their sizeLimit).
            if let Some(root) = &self.config.root_dir {
                let vols = root
                    .join("pods")
                    .join(kubelet_api::pod::uid(&p.pod))
                    .join("volumes");
                if let Some((b, i)) = disk_usage(&vols) {
                    any = true;
                    usage.volume_bytes = Some(b);
                    usage.inodes = Some(usage.inodes.unwrap_or(0) + i);
                    if let Ok(rd) = std::fs::read_dir(vols.join("kubernetes.io~empty-dir")) {
                        for e in rd.filter_map(|e| e.ok()) {
                            if let (Ok(name), Some((b, _))) =
                                (e.file_name().into_string(), disk_usage(&e.path()))
                            {
                                usage.volumes.insert(name, b);
                            }
                        }
                    }
                }
            }
            // Logs: per container (`<ns>_<name>_<uid>/<container>/`).
            if let Some(logs) = &self.config.pod_log_dir {
                let dir = logs.join(format!(
                    "{}_{}_{}",
                    kubelet_api::pod::namespace(&p.pod),
                    kubelet_api::pod::name(&p.pod),
                    kubelet_api::pod::uid(&p.pod)
                ));
                for c in kubelet_api::pod::containers(&p.pod) {
                    let Some((b, i)) = disk_usage(&dir.join(&c.name)) else {
                        continue;
                    };
                    any = true;
                    usage.inodes = Some(usage.inodes.unwrap_or(0) + i);
                    match usage.containers.iter_mut().find(|u| u.name == c.name) {
                        Some(u) => u.disk_bytes = Some(u.disk_bytes.unwrap_or(0) + b),
                        None => usage.containers.push(ContainerUsage {
                            name: c.name.clone(),
                            disk_bytes: Some(b),
                            ..Default::default()
                        }),
                    }
                }
            }
            if any {
                out.insert(kubelet_api::pod::uid(&p.pod).to_string(), usage);
            }
        }
        out
    }

    fn memory_cgroup(&self) -> Option<MemoryCgroup> {
        let fs = self.config.cgroup.as_ref()?;
        let rel = match &self.config.memory {
            MemorySource::Node => PathBuf::new(),
            MemorySource::Cgroup(rel) => rel.clone(),
        };
        Some(match fs {
            CgroupFs::V1 { .. } => MemoryCgroup::V1(fs.dir(&rel)),
            CgroupFs::V2 { .. } => MemoryCgroup::V2(fs.dir(&rel)),
        })
    }
}
