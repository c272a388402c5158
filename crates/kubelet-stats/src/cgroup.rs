//! The cgroup reader: which hierarchies this machine has ([`CgroupSetup`], detected once from
//! mountinfo, never assumed) and the figures of one cgroup ([`CgroupSample`]), on v1 and v2.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The v1 controllers the SDK reads or writes.
pub const V1_CONTROLLERS: [&str; 5] = ["memory", "cpu", "cpuacct", "pids", "cpuset"];

/// Which cgroup layout this machine has.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CgroupSetup {
    /// Legacy (or hybrid: v1 controllers plus an empty unified tree): each controller's mount
    /// point.
    V1 {
        /// Controller name (`memory`, `cpu`, `cpuacct`, `pids`, `cpuset`) → mount point.
        controllers: BTreeMap<String, PathBuf>,
    },
    /// The unified hierarchy.
    V2 {
        /// Its mount point (`/sys/fs/cgroup`).
        root: PathBuf,
    },
}

/// The cgroup version of a [`CgroupSetup`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// cgroup v1 (or hybrid).
    V1,
    /// cgroup v2.
    V2,
}

/// The cgroup mounts of a mountinfo text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupMounts {
    /// v1 mount points and the SDK's controllers mounted at each.
    pub v1: Vec<(PathBuf, Vec<String>)>,
    /// v2 mount points.
    pub v2: Vec<PathBuf>,
    /// Every v1 mount point, whatever its controllers (`devices`, `freezer`, `name=systemd`,
    /// …): where a container runtime may have made cgroups a pod's teardown must remove.
    pub all_v1: Vec<PathBuf>,
}

/// The cgroup mounts listed in a `/proc/<pid>/mountinfo` text.
pub fn parse_mountinfo(text: &str) -> CgroupMounts {
    let mut out = CgroupMounts::default();
    for line in text.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        let mut pre = pre.split_whitespace();
        let mut post = post.split_whitespace();
        let (Some(mount_point), Some(fstype)) = (pre.nth(4), post.next()) else {
            continue;
        };
        let mount_point = PathBuf::from(mount_point.replace("\\040", " "));
        match fstype {
            "cgroup2" => out.v2.push(mount_point),
            "cgroup" => {
                out.all_v1.push(mount_point.clone());
                let opts = post.nth(1).unwrap_or_default();
                let controllers: Vec<String> = opts
                    .split(',')
                    .filter(|o| V1_CONTROLLERS.contains(o))
                    .map(str::to_string)
                    .collect();
                if !controllers.is_empty() {
                    out.v1.push((mount_point, controllers));
                }
            }
            _ => {}
        }
    }
    out
}

impl CgroupSetup {
    /// This machine's setup, from `/proc/self/mountinfo`; `None` without a memory controller.
    pub fn detect() -> Option<Self> {
        let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        Self::from_mounts(&parse_mountinfo(&text))
    }

    /// The setup `mounts` describe: v1 when a v1 memory hierarchy is mounted (a hybrid machine
    /// counts as v1, as in the kubelet), else v2 when a unified hierarchy offers the memory
    /// controller (read from its `cgroup.controllers`), else `None`.
    pub fn from_mounts(mounts: &CgroupMounts) -> Option<Self> {
        let mut controllers = BTreeMap::new();
        for (mp, ctrls) in &mounts.v1 {
            for c in ctrls {
                controllers.entry(c.clone()).or_insert_with(|| mp.clone());
            }
        }
        if controllers.contains_key("memory") {
            return Some(CgroupSetup::V1 { controllers });
        }
        mounts
            .v2
            .iter()
            .find(|mp| {
                std::fs::read_to_string(mp.join("cgroup.controllers"))
                    .is_ok_and(|c| c.split_whitespace().any(|w| w == "memory"))
            })
            .map(|root| CgroupSetup::V2 { root: root.clone() })
    }

    /// v1 or v2.
    pub fn version(&self) -> CgroupVersion {
        match self {
            CgroupSetup::V1 { .. } => CgroupVersion::V1,
            CgroupSetup::V2 { .. } => CgroupVersion::V2,
        }
    }

    /// The directory of cgroup `rel` (relative to the hierarchy root, a leading `/` allowed)
    /// for `controller`; on v2 every controller shares it. `None` when a v1 controller is not
    /// mounted.
    pub fn dir(&self, controller: &str, rel: &Path) -> Option<PathBuf> {
        let rel = rel.strip_prefix("/").unwrap_or(rel);
        match self {
            CgroupSetup::V1 { controllers } => controllers.get(controller).map(|m| m.join(rel)),
            CgroupSetup::V2 { root } => Some(root.join(rel)),
        }
    }

    /// The cgroup of a process in this setup, from its `/proc/<pid>/cgroup` text: the memory
    /// controller's line on v1, the `0::` line on v2.
    pub fn cgroup_of(&self, proc_cgroup: &str) -> Option<PathBuf> {
        proc_cgroup.lines().find_map(|l| {
            let mut it = l.splitn(3, ':');
            let (_, ctrls, path) = (it.next()?, it.next()?, it.next()?);
            let wanted = match self {
                CgroupSetup::V1 { .. } => ctrls.split(',').any(|c| c == "memory"),
                CgroupSetup::V2 { .. } => ctrls.is_empty(),
            };
            wanted.then(|| PathBuf::from(path))
        })
    }

    /// The figures of cgroup `rel` that can be read; `None` when its memory directory does not
    /// exist (the cgroup is gone).
    pub fn sample(&self, rel: &Path) -> Option<CgroupSample> {
        read_sample(self.version(), |controller| self.dir(controller, rel))
    }
}

/// The v1 cgroup of a process for `controller`, from its `/proc/<pid>/cgroup` text.
pub(crate) fn v1_cgroup_of(proc_cgroup: &str, controller: &str) -> Option<PathBuf> {
    proc_cgroup.lines().find_map(|l| {
        let mut it = l.splitn(3, ':');
        let (_, ctrls, path) = (it.next()?, it.next()?, it.next()?);
        ctrls
            .split(',')
            .any(|c| c == controller)
            .then(|| PathBuf::from(path))
    })
}

/// The child cgroups of cgroup `rel` (their names), read from the memory controller's tree.
pub(crate) fn children(setup: &CgroupSetup, rel: &Path) -> Vec<String> {
    let Some(dir) = setup.dir("memory", rel) else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect()
}

/// The cgroup of pod `uid` under the pods' cgroup `kubepods`: `pod<uid>` (cgroupfs driver) or
/// `…-pod<uid with underscores>.slice` (systemd driver), directly under it (Guaranteed pods) or
/// one QoS tier below.
pub(crate) fn find_pod_cgroup(setup: &CgroupSetup, kubepods: &Path, uid: &str) -> Option<PathBuf> {
    let cgroupfs = format!("pod{uid}");
    let systemd = format!("pod{}.slice", uid.replace('-', "_"));
    let is_pod = |name: &str| name == cgroupfs || name.ends_with(&systemd);
    let top = children(setup, kubepods);
    if let Some(name) = top.iter().find(|n| is_pod(n)) {
        return Some(kubepods.join(name));
    }
    let is_tier = |name: &str| {
        let name = name.strip_suffix(".slice").unwrap_or(name);
        name.ends_with("burstable") || name.ends_with("besteffort")
    };
    top.iter().filter(|n| is_tier(n)).find_map(|tier| {
        let tier = kubepods.join(tier);
        children(setup, &tier)
            .into_iter()
            .find(|n| is_pod(n))
            .map(|n| tier.join(n))
    })
}

/// The cgroup of container `id` (a sandbox's too) under its pod's cgroup: named by the ID
/// (`<id>`, or `cri-containerd-<id>.scope` and the like with the systemd driver).
pub(crate) fn find_container_cgroup(setup: &CgroupSetup, pod: &Path, id: &str) -> Option<PathBuf> {
    if id.is_empty() {
        return None;
    }
    children(setup, pod)
        .into_iter()
        .find(|n| n.contains(id))
        .map(|n| pod.join(n))
}

/// The processes in cgroup `rel` and its children (a pod's cgroup holds its containers'),
/// from the memory controller's `cgroup.procs`; `None` when it is gone.
pub(crate) fn count_processes(setup: &CgroupSetup, rel: &Path) -> Option<u64> {
    let dir = setup.dir("memory", rel)?;
    if !dir.is_dir() {
        return None;
    }
    let own = cgroup_pids(&dir).len();
    let nested: usize = children(setup, rel)
        .iter()
        .filter_map(|c| setup.dir("memory", &rel.join(c)))
        .map(|d| cgroup_pids(&d).len())
        .sum();
    u64::try_from(own + nested).ok()
}

/// The figures of one cgroup whose directory for each controller `dir` names (on v2 the same
/// for all); `None` when its memory directory does not exist (the cgroup is gone). For a
/// runtime that keeps its containers' cgroup directories itself.
pub fn read_sample(
    version: CgroupVersion,
    dir: impl Fn(&str) -> Option<PathBuf>,
) -> Option<CgroupSample> {
    let read = |controller: &str, file: &str| -> Option<String> {
        crate::procfs::read_small(&dir(controller)?.join(file)).ok()
    };
    let mut s = CgroupSample::default();
    // Borrowed keys: no allocation per line (a collection reads one per container).
    let stat_text = read("memory", "memory.stat");
    // Only when the file is unreadable: is the cgroup gone?
    if stat_text.is_none() && !dir("memory")?.is_dir() {
        return None;
    }
    let stat = stat_text.as_deref().map(Keyed);
    let stat = stat.as_ref();
    match version {
        CgroupVersion::V2 => {
            s.cpu_usage_ns = read("cpu", "cpu.stat")
                .and_then(|t| Keyed(&t).get("usage_usec"))
                .map(|us| us.saturating_mul(1000));
            s.memory_usage = read("memory", "memory.current").and_then(|t| parse_u64(&t));
            s.memory_limit = read("memory", "memory.max").and_then(|t| parse_u64(&t));
            s.inactive_file = stat.and_then(|m| m.get("inactive_file"));
            s.rss = stat.and_then(|m| m.get("anon"));
            s.oom_kills = read("memory", "memory.events").and_then(|t| Keyed(&t).get("oom_kill"));
        }
        CgroupVersion::V1 => {
            s.cpu_usage_ns = read("cpuacct", "cpuacct.usage").and_then(|t| parse_u64(&t));
            s.memory_usage = read("memory", "memory.usage_in_bytes").and_then(|t| parse_u64(&t));
            // An unlimited v1 cgroup reports a page-rounded i64::MAX.
            s.memory_limit = read("memory", "memory.limit_in_bytes")
                .and_then(|t| parse_u64(&t))
                .filter(|l| *l < (1 << 62));
            s.inactive_file = stat.and_then(|m| {
                m.get("total_inactive_file")
                    .or_else(|| m.get("inactive_file"))
            });
            s.rss = stat.and_then(|m| m.get("total_rss").or_else(|| m.get("rss")));
            s.oom_kills =
                read("memory", "memory.oom_control").and_then(|t| Keyed(&t).get("oom_kill"));
        }
    }
    s.page_faults = stat.and_then(|m| m.get("total_pgfault").or_else(|| m.get("pgfault")));
    s.major_page_faults =
        stat.and_then(|m| m.get("total_pgmajfault").or_else(|| m.get("pgmajfault")));
    s.pids = read("pids", "pids.current").and_then(|t| parse_u64(&t));
    Some(s)
}

/// What one cgroup's files say. A figure the kernel does not offer is `None`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CgroupSample {
    /// Cumulative CPU time, ns (v1 `cpuacct.usage`, v2 `cpu.stat usage_usec` × 1000).
    pub cpu_usage_ns: Option<u64>,
    /// Memory usage, bytes (v1 `memory.usage_in_bytes`, v2 `memory.current`).
    pub memory_usage: Option<u64>,
    /// Memory limit, bytes; `None` when unlimited.
    pub memory_limit: Option<u64>,
    /// Inactive file pages, bytes (v1 `total_inactive_file`, v2 `inactive_file`).
    pub inactive_file: Option<u64>,
    /// Anonymous memory, bytes (v1 `total_rss`, v2 `anon`).
    pub rss: Option<u64>,
    /// Page faults, cumulative (`pgfault`).
    pub page_faults: Option<u64>,
    /// Major page faults, cumulative (`pgmajfault`).
    pub major_page_faults: Option<u64>,
    /// OOM kills in this cgroup, cumulative (v1 `memory.oom_control`, v2 `memory.events`).
    pub oom_kills: Option<u64>,
    /// Tasks in the cgroup (`pids.current`).
    pub pids: Option<u64>,
}

impl CgroupSample {
    /// Usage minus inactive file pages, floored at 0 (cAdvisor's working set).
    pub fn working_set(&self) -> Option<u64> {
        self.memory_usage
            .map(|u| u.saturating_sub(self.inactive_file.unwrap_or(0)))
    }
}

/// A single-number cgroup file (`max` is `None`).
pub fn parse_u64(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// A flat-keyed text looked up in place.
struct Keyed<'a>(&'a str);

impl Keyed<'_> {
    fn get(&self, key: &str) -> Option<u64> {
        self.0.lines().find_map(|l| {
            let mut it = l.split_whitespace();
            if it.next()? != key {
                return None;
            }
            it.next()?.parse().ok()
        })
    }
}

/// A flat-keyed file (`key value` per line): `memory.stat`, `memory.events`,
/// `memory.oom_control`, `cpu.stat`. Lines that are not `key number` are skipped.
pub fn parse_keyed(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let k = it.next()?;
            let v = it.next()?.parse().ok()?;
            Some((k.to_string(), v))
        })
        .collect()
}

// ----- writing -----

/// A cgroup file could not be created, written or removed.
#[derive(Debug, thiserror::Error)]
#[error("{op} cgroup file {path}")]
pub struct CgroupWriteError {
    /// What was being done (`creating`, `writing`, `removing`).
    pub op: &'static str,
    /// The directory or file.
    pub path: PathBuf,
    /// The system error.
    #[source]
    pub source: std::io::Error,
}

impl CgroupWriteError {
    fn new(op: &'static str, path: &Path, source: std::io::Error) -> Self {
        Self {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// cgroup v1 `cpu.shares` → v2 `cpu.weight` (the linear conversion the kubelet uses for its
/// pod and QoS cgroups, and runc before 1.3): 2 → 1, 1024 → 39, 262144 → 10000.
pub fn shares_to_weight(shares: u64) -> u64 {
    let shares = shares.clamp(2, 262_144);
    1 + ((shares - 2) * 9999) / 262_142
}

/// v2 `cpu.max` content for a CFS quota and period in µs (quota 0: `max`; period 0: 100 ms).
pub fn cpu_max(quota: i64, period: i64) -> String {
    let period = if period > 0 { period } else { 100_000 };
    if quota > 0 {
        format!("{quota} {period}")
    } else {
        format!("max {period}")
    }
}

/// The values the SDK writes into a cgroup; `None` leaves a file as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CgroupValues {
    /// v1 `cpu.shares` (v2: `cpu.weight` by [`shares_to_weight`]).
    pub cpu_shares: Option<u64>,
    /// CFS quota in µs; `Some(-1)` (v1) or `Some(0)` sets "no quota".
    pub cpu_quota: Option<i64>,
    /// CFS period in µs.
    pub cpu_period: Option<i64>,
    /// Memory limit in bytes (v1 `memory.limit_in_bytes`, v2 `memory.max`); `Some(-1)`: none.
    pub memory_limit: Option<i64>,
    /// `pids.max`; `Some(-1)`: `max`.
    pub pids_limit: Option<i64>,
    /// `cpuset.cpus` (list format).
    pub cpuset_cpus: Option<String>,
    /// `cpuset.mems` (list format).
    pub cpuset_mems: Option<String>,
}

/// Write `values` into the cgroup whose directory for each controller `dir` names (on v2 the
/// same for all). A file the kernel does not offer (a controller not enabled for this cgroup,
/// no swap accounting) is skipped; a value the kernel refuses is an error.
pub fn write_values(
    version: CgroupVersion,
    dir: impl Fn(&str) -> Option<PathBuf>,
    values: &CgroupValues,
) -> Result<(), CgroupWriteError> {
    let write = |controller: &str, file: &str, value: &str| -> Result<(), CgroupWriteError> {
        let Some(d) = dir(controller) else {
            return Ok(());
        };
        let path = d.join(file);
        if !path.exists() {
            tracing::debug!(path = %path.display(), "cgroup file absent, not written");
            return Ok(());
        }
        std::fs::write(&path, value).map_err(|e| CgroupWriteError::new("writing", &path, e))
    };
    let v = values;
    match version {
        CgroupVersion::V2 => {
            if let Some(s) = v.cpu_shares {
                write("cpu", "cpu.weight", &shares_to_weight(s).to_string())?;
            }
            if v.cpu_quota.is_some() || v.cpu_period.is_some() {
                let quota = v.cpu_quota.unwrap_or(0);
                write("cpu", "cpu.max", &cpu_max(quota, v.cpu_period.unwrap_or(0)))?;
            }
            if let Some(m) = v.memory_limit {
                let text = if m > 0 { m.to_string() } else { "max".into() };
                write("memory", "memory.max", &text)?;
                if m > 0 {
                    write("memory", "memory.swap.max", "0")?;
                }
            }
            if let Some(p) = v.pids_limit {
                let text = if p > 0 { p.to_string() } else { "max".into() };
                write("pids", "pids.max", &text)?;
            }
        }
        CgroupVersion::V1 => {
            if let Some(s) = v.cpu_shares {
                write("cpu", "cpu.shares", &s.max(2).to_string())?;
            }
            if let Some(p) = v.cpu_period.filter(|p| *p > 0) {
                write("cpu", "cpu.cfs_period_us", &p.to_string())?;
            }
            if let Some(q) = v.cpu_quota {
                let q = if q > 0 { q } else { -1 };
                write("cpu", "cpu.cfs_quota_us", &q.to_string())?;
            }
            if let Some(m) = v.memory_limit {
                let text = if m > 0 { m.to_string() } else { "-1".into() };
                // The swap limit may not go below the memory limit: raise it first when
                // raising, lower it after when lowering.
                let swap = |t: &str| write("memory", "memory.memsw.limit_in_bytes", t);
                if swap(&text).is_err() {
                    write("memory", "memory.limit_in_bytes", &text)?;
                    swap(&text)?;
                } else {
                    write("memory", "memory.limit_in_bytes", &text)?;
                }
            }
            if let Some(p) = v.pids_limit {
                let text = if p > 0 { p.to_string() } else { "max".into() };
                write("pids", "pids.max", &text)?;
            }
        }
    }
    if let Some(c) = &v.cpuset_cpus {
        write("cpuset", "cpuset.cpus", c)?;
    }
    if let Some(m) = &v.cpuset_mems {
        write("cpuset", "cpuset.mems", m)?;
    }
    Ok(())
}

/// Create the cgroup `rel` (relative to the hierarchy root `root`) and every missing cgroup
/// above it. On v2 the `cpu`, `memory`, `pids` (and `cpuset` when `cpuset` is true)
/// controllers are enabled for the children of each level on the way down (best effort: a
/// controller the parent lacks is skipped). On a v1 `cpuset` hierarchy each new level copies
/// its parent's `cpuset.cpus` and `cpuset.mems`, without which no process could join it.
pub fn create_cgroup(
    version: CgroupVersion,
    controller: &str,
    root: &Path,
    rel: &Path,
    cpuset: bool,
) -> Result<(), CgroupWriteError> {
    let rel = rel.strip_prefix("/").unwrap_or(rel);
    let mut dir = root.to_path_buf();
    for comp in rel.components() {
        let parent = dir.clone();
        if version == CgroupVersion::V2 {
            enable_v2_controllers(&parent, cpuset);
        }
        dir.push(comp);
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(CgroupWriteError::new("creating", &dir, e)),
        }
        // Also when the level already exists: a concurrent creator may not have filled it
        // in yet.
        if version == CgroupVersion::V1 && controller == "cpuset" {
            for f in ["cpuset.cpus", "cpuset.mems"] {
                let inherited = std::fs::read_to_string(parent.join(f)).unwrap_or_default();
                let own = std::fs::read_to_string(dir.join(f)).unwrap_or_default();
                if own.trim().is_empty() && !inherited.trim().is_empty() {
                    std::fs::write(dir.join(f), inherited.trim())
                        .map_err(|e| CgroupWriteError::new("writing", &dir.join(f), e))?;
                }
            }
        }
    }
    Ok(())
}

fn enable_v2_controllers(dir: &Path, cpuset: bool) {
    let file = dir.join("cgroup.subtree_control");
    let current = std::fs::read_to_string(&file).unwrap_or_default();
    let wanted: &[&str] = if cpuset {
        &["cpu", "memory", "pids", "cpuset"]
    } else {
        &["cpu", "memory", "pids"]
    };
    for c in wanted {
        if current.split_whitespace().any(|w| w == *c) {
            continue;
        }
        if let Err(e) = std::fs::write(&file, format!("+{c}")) {
            tracing::debug!(path = %file.display(), controller = c, error = %e, "cannot enable cgroup controller");
        }
    }
}

/// Remove the cgroup directory `dir` (it must hold no process and no child cgroup); a missing
/// one is fine.
pub fn remove_cgroup(dir: &Path) -> Result<(), CgroupWriteError> {
    match std::fs::remove_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(CgroupWriteError::new("removing", dir, e)),
    }
}

/// One pass at removing the cgroup `dir` and every cgroup below it: child cgroups first, the
/// processes still in each killed (SIGKILL), then `rmdir`. A cgroup whose processes the kernel
/// has not freed yet fails with `EBUSY`: call again a moment later. Returns how many processes
/// were signalled; a missing `dir` is fine.
pub fn remove_tree_once(dir: &Path) -> Result<usize, CgroupWriteError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(CgroupWriteError::new("listing", dir, e)),
    };
    let mut killed = 0;
    let mut first_err = None;
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            match remove_tree_once(&entry.path()) {
                Ok(n) => killed += n,
                Err(e) => first_err = first_err.or(Some(e)),
            }
        }
    }
    for pid in cgroup_pids(dir) {
        if nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .is_ok()
        {
            killed += 1;
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    remove_cgroup(dir)?;
    Ok(killed)
}

/// The processes in cgroup directory `dir` (`cgroup.procs`); empty when it is gone.
pub fn cgroup_pids(dir: &Path) -> Vec<i32> {
    crate::procfs::read_small(&dir.join("cgroup.procs"))
        .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod fixtures {
    use std::path::Path;

    /// Write `files` (path relative to `root`, content) under `root`.
    pub(crate) fn lay_out(root: &Path, files: &[(&str, &str)]) {
        for (rel, content) in files {
            let p = root.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, content).unwrap();
        }
    }

    /// A cgroup v1 tree: memory and cpu,cpuacct hierarchies with cgroup `pod/c`.
    pub(crate) fn v1(root: &Path) {
        lay_out(
            root,
            &[
                ("memory/memory.usage_in_bytes", "4000000000\n"),
                (
                    "memory/memory.stat",
                    "cache 1\nrss 2\ntotal_rss 900000000\ntotal_inactive_file 1000000000\ntotal_pgfault 10\ntotal_pgmajfault 1\n",
                ),
                ("memory/pod/c/memory.usage_in_bytes", "300000000\n"),
                (
                    "memory/pod/c/memory.limit_in_bytes",
                    "9223372036854771712\n",
                ),
                (
                    "memory/pod/c/memory.stat",
                    "rss 1\ntotal_rss 200000000\ntotal_inactive_file 50000000\ntotal_pgfault 77\ntotal_pgmajfault 3\n",
                ),
                (
                    "memory/pod/c/memory.oom_control",
                    "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
                ),
                ("cpu,cpuacct/cpuacct.usage", "123456789000\n"),
                ("cpu,cpuacct/pod/c/cpuacct.usage", "5000000000\n"),
                ("pids/pod/c/pids.current", "4\n"),
            ],
        );
    }

    /// A cgroup v2 tree with cgroup `pod/c`.
    pub(crate) fn v2(root: &Path) {
        lay_out(
            root,
            &[
                ("cgroup.controllers", "cpuset cpu io memory pids\n"),
                ("cpu.stat", "usage_usec 7000000\nuser_usec 1\n"),
                ("pod/c/memory.current", "300000000\n"),
                ("pod/c/memory.max", "67108864\n"),
                (
                    "pod/c/memory.stat",
                    "anon 200000000\nfile 90000000\ninactive_file 50000000\npgfault 77\npgmajfault 3\n",
                ),
                (
                    "pod/c/memory.events",
                    "low 0\nhigh 0\nmax 5\noom 1\noom_kill 1\n",
                ),
                ("pod/c/cpu.stat", "usage_usec 5000000\nnr_periods 0\n"),
                ("pod/c/pids.current", "4\n"),
            ],
        );
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_picks_v1_on_a_hybrid_machine_and_v2_when_the_unified_tree_has_memory() {
        let dir = tempfile::tempdir().unwrap();
        let unified = dir.path().join("unified");
        std::fs::create_dir_all(&unified).unwrap();
        std::fs::write(unified.join("cgroup.controllers"), "").unwrap();
        let hybrid = format!(
            "30 25 0:26 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory\n\
             31 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n\
             32 25 0:28 / {} rw - cgroup2 cgroup2 rw\n\
             33 25 0:29 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd\n",
            unified.display()
        );
        let setup = CgroupSetup::from_mounts(&parse_mountinfo(&hybrid)).unwrap();
        assert_eq!(setup.version(), CgroupVersion::V1);
        assert_eq!(
            setup.dir("cpuacct", Path::new("/a/b")),
            Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/a/b"))
        );
        assert_eq!(setup.dir("pids", Path::new("a")), None);

        // A unified tree without the memory controller is no setup at all.
        let v2_only = format!(
            "32 25 0:28 / {} rw - cgroup2 cgroup2 rw\n",
            unified.display()
        );
        assert_eq!(CgroupSetup::from_mounts(&parse_mountinfo(&v2_only)), None);
        std::fs::write(unified.join("cgroup.controllers"), "cpu memory pids\n").unwrap();
        let setup = CgroupSetup::from_mounts(&parse_mountinfo(&v2_only)).unwrap();
        assert_eq!(setup.version(), CgroupVersion::V2);
        assert_eq!(
            setup.dir("memory", Path::new("/x")),
            Some(unified.join("x"))
        );
        // Garbage lines are skipped.
        assert_eq!(
            parse_mountinfo("junk\n1 2 3 - cgroup\n"),
            CgroupMounts::default()
        );
    }

    #[test]
    fn a_processes_cgroup_is_read_from_the_controller_the_setup_uses() {
        let text = "12:pids:/a\n4:memory:/kubepods/pod1/c1\n0::/user.slice\n";
        let v1 = CgroupSetup::V1 {
            controllers: BTreeMap::from([("memory".into(), PathBuf::from("/m"))]),
        };
        let v2 = CgroupSetup::V2 {
            root: PathBuf::from("/sys/fs/cgroup"),
        };
        assert_eq!(v1.cgroup_of(text), Some(PathBuf::from("/kubepods/pod1/c1")));
        assert_eq!(v2.cgroup_of(text), Some(PathBuf::from("/user.slice")));
        assert_eq!(v2.cgroup_of("garbage"), None);
    }

    #[test]
    fn v1_fixture_figures() {
        let dir = tempfile::tempdir().unwrap();
        fixtures::v1(dir.path());
        let setup = CgroupSetup::V1 {
            controllers: BTreeMap::from([
                ("memory".into(), dir.path().join("memory")),
                ("cpu".into(), dir.path().join("cpu,cpuacct")),
                ("cpuacct".into(), dir.path().join("cpu,cpuacct")),
                ("pids".into(), dir.path().join("pids")),
            ]),
        };
        let s = setup.sample(Path::new("/pod/c")).unwrap();
        assert_eq!(s.cpu_usage_ns, Some(5_000_000_000));
        assert_eq!(s.memory_usage, Some(300_000_000));
        assert_eq!(s.memory_limit, None, "unlimited");
        assert_eq!(s.working_set(), Some(250_000_000));
        assert_eq!(s.rss, Some(200_000_000));
        assert_eq!((s.page_faults, s.major_page_faults), (Some(77), Some(3)));
        assert_eq!(s.oom_kills, Some(2));
        assert_eq!(s.pids, Some(4));
        let root = setup.sample(Path::new("")).unwrap();
        assert_eq!(root.working_set(), Some(3_000_000_000));
        assert_eq!(root.cpu_usage_ns, Some(123_456_789_000));
        // A cgroup that is gone (pod just deleted) has no sample.
        assert_eq!(setup.sample(Path::new("/pod/gone")), None);
    }

    #[test]
    fn v2_fixture_figures() {
        let dir = tempfile::tempdir().unwrap();
        fixtures::v2(dir.path());
        let setup = CgroupSetup::V2 {
            root: dir.path().to_path_buf(),
        };
        let s = setup.sample(Path::new("pod/c")).unwrap();
        assert_eq!(s.cpu_usage_ns, Some(5_000_000_000));
        assert_eq!(s.memory_limit, Some(64 << 20));
        assert_eq!(s.working_set(), Some(250_000_000));
        assert_eq!(s.rss, Some(200_000_000));
        assert_eq!((s.page_faults, s.major_page_faults), (Some(77), Some(3)));
        assert_eq!(s.oom_kills, Some(1));
        assert_eq!(s.pids, Some(4));
        // A file with unexpected content is a missing figure, not an error.
        std::fs::write(dir.path().join("pod/c/memory.current"), "lots\n").unwrap();
        let s = setup.sample(Path::new("pod/c")).unwrap();
        assert_eq!((s.memory_usage, s.working_set()), (None, None));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod writer_tests {
    use super::*;

    #[test]
    fn cpu_conversions_match_the_kubelet() {
        assert_eq!(shares_to_weight(2), 1);
        assert_eq!(shares_to_weight(1024), 39);
        assert_eq!(shares_to_weight(262_144), 10_000);
        assert_eq!(cpu_max(0, 0), "max 100000");
        assert_eq!(cpu_max(25_000, 50_000), "25000 50000");
    }

    #[test]
    fn v2_values_and_v1_cpuset_levels_inherit_their_parent() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::write(r.join("cgroup.subtree_control"), "").unwrap();
        create_cgroup(CgroupVersion::V2, "unified", r, Path::new("/a/b"), false).unwrap();
        let leaf = r.join("a/b");
        for f in ["cpu.weight", "cpu.max", "memory.max", "pids.max"] {
            std::fs::write(leaf.join(f), "").unwrap();
        }
        let v = CgroupValues {
            cpu_shares: Some(1024),
            cpu_quota: Some(50_000),
            cpu_period: Some(100_000),
            memory_limit: Some(64 << 20),
            pids_limit: Some(-1),
            ..Default::default()
        };
        write_values(CgroupVersion::V2, |_| Some(leaf.clone()), &v).unwrap();
        let rd = |f: &str| std::fs::read_to_string(leaf.join(f)).unwrap();
        assert_eq!(rd("cpu.weight"), "39");
        assert_eq!(rd("cpu.max"), "50000 100000");
        assert_eq!(rd("memory.max"), (64u64 << 20).to_string());
        assert_eq!(rd("pids.max"), "max");
        // memory.swap.max is absent: skipped, not an error.
        assert!(!leaf.join("memory.swap.max").exists());

        let v1 = tempfile::tempdir().unwrap();
        std::fs::write(v1.path().join("cpuset.cpus"), "0-3\n").unwrap();
        std::fs::write(v1.path().join("cpuset.mems"), "0\n").unwrap();
        create_cgroup(
            CgroupVersion::V1,
            "cpuset",
            v1.path(),
            Path::new("k/p"),
            false,
        )
        .unwrap();
        let got = std::fs::read_to_string(v1.path().join("k/p/cpuset.cpus")).unwrap();
        assert_eq!(got, "0-3");
        remove_cgroup(&v1.path().join("nothing-here")).unwrap();
        assert!(cgroup_pids(&v1.path().join("nothing-here")).is_empty());
    }
}
