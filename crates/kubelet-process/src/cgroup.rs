//! cgroup v1 / v2 support: detection from `/proc/self/mountinfo`, per-container cgroups under
//! `<hierarchy root>/<parent>/<sandbox>/<container>`, limits, usage and OOM-kill counters.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::ProcessError;
use crate::record::ResourcesRecord;

/// v1 controllers the runtime uses.
const V1_CONTROLLERS: [&str; 5] = ["memory", "cpu", "cpuacct", "pids", "cpuset"];
/// Key of the unified hierarchy in [`CgroupPaths::dirs`].
const UNIFIED: &str = "unified";

/// The cgroup hierarchies found on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CgroupDriver {
    /// Legacy hierarchies: controller name → mount point.
    V1(BTreeMap<String, PathBuf>),
    /// The unified hierarchy's mount point.
    V2(PathBuf),
}

#[cfg(test)]
use kubelet_stats::cgroup::parse_keyed;
pub(crate) use kubelet_stats::cgroup::{CgroupMounts, parse_mountinfo, parse_u64};
use kubelet_stats::procfs::read_small;

impl CgroupDriver {
    /// Detect the hierarchy to use: v1 when a v1 memory hierarchy is mounted, else v2 when a
    /// unified hierarchy offers the memory controller, else `None`.
    pub(crate) fn detect() -> Option<Self> {
        let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        Self::from_mounts(&parse_mountinfo(&text))
    }

    pub(crate) fn from_mounts(mounts: &CgroupMounts) -> Option<Self> {
        let mut v1 = BTreeMap::new();
        for (mp, ctrls) in &mounts.v1 {
            for c in ctrls
                .iter()
                .filter(|c| V1_CONTROLLERS.contains(&c.as_str()))
            {
                v1.entry(c.clone()).or_insert_with(|| mp.clone());
            }
        }
        if v1.contains_key("memory") {
            return Some(CgroupDriver::V1(v1));
        }
        mounts
            .v2
            .iter()
            .find(|mp| {
                std::fs::read_to_string(mp.join("cgroup.controllers"))
                    .map(|c| c.split_whitespace().any(|w| w == "memory"))
                    .unwrap_or(false)
            })
            .map(|mp| CgroupDriver::V2(mp.clone()))
    }

    /// `v1` or `v2`.
    pub(crate) fn version(&self) -> &'static str {
        match self {
            CgroupDriver::V1(_) => "v1",
            CgroupDriver::V2(_) => "v2",
        }
    }

    /// Paths of the cgroup of container `cid` in sandbox `sid` (nothing is created).
    pub(crate) fn container_paths(&self, parent: &str, sid: &str, cid: &str) -> CgroupPaths {
        self.paths(&Path::new(parent).join(sid).join(cid))
    }

    /// Paths of the cgroup of container `cid` directly under the pod cgroup `pod_cgroup` the
    /// agent made (`PodSandboxConfig::cgroup_parent`, relative to the hierarchy roots).
    pub(crate) fn container_paths_in(&self, pod_cgroup: &str, cid: &str) -> CgroupPaths {
        let pod = pod_cgroup.trim_start_matches('/');
        self.paths(&Path::new(pod).join(cid))
    }

    fn paths(&self, rel: &Path) -> CgroupPaths {
        match self {
            CgroupDriver::V1(m) => CgroupPaths {
                unified: false,
                dirs: m.iter().map(|(c, mp)| (c.clone(), mp.join(rel))).collect(),
            },
            CgroupDriver::V2(mp) => CgroupPaths {
                unified: true,
                dirs: BTreeMap::from([(UNIFIED.to_string(), mp.join(rel))]),
            },
        }
    }

    /// Directories of the sandbox-level cgroups (to remove with the sandbox).
    pub(crate) fn sandbox_dirs(&self, parent: &str, sid: &str) -> Vec<PathBuf> {
        let rel = Path::new(parent).join(sid);
        let mut dirs: Vec<PathBuf> = match self {
            CgroupDriver::V1(m) => m.values().map(|mp| mp.join(&rel)).collect(),
            CgroupDriver::V2(mp) => vec![mp.join(&rel)],
        };
        dirs.sort();
        dirs.dedup();
        dirs
    }

    /// Create the container's cgroup (and its parents): v2 controllers enabled on the way, v1
    /// cpuset levels initialised from their parents (the shared writer of `kubelet-stats`).
    pub(crate) fn create(&self, paths: &CgroupPaths) -> Result<(), ProcessError> {
        let (version, roots): (_, Vec<(&str, &Path)>) = match self {
            CgroupDriver::V1(m) => (
                kubelet_stats::CgroupVersion::V1,
                m.iter().map(|(c, mp)| (c.as_str(), mp.as_path())).collect(),
            ),
            CgroupDriver::V2(mp) => (
                kubelet_stats::CgroupVersion::V2,
                vec![(UNIFIED, mp.as_path())],
            ),
        };
        for (controller, root) in roots {
            let Some(leaf) = paths.dirs.get(controller) else {
                continue;
            };
            let rel = leaf.strip_prefix(root).unwrap_or(leaf);
            kubelet_stats::cgroup::create_cgroup(version, controller, root, rel, true)
                .map_err(cgroup_error)?;
        }
        Ok(())
    }
}

fn cgroup_error(e: kubelet_stats::cgroup::CgroupWriteError) -> ProcessError {
    ProcessError::Cgroup {
        op: e.op,
        path: e.path,
        source: e.source,
    }
}

/// The cgroup directories of one container.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct CgroupPaths {
    /// True for cgroup v2.
    pub(crate) unified: bool,
    /// Controller (or `unified`) → directory.
    pub(crate) dirs: BTreeMap<String, PathBuf>,
}

/// Usage figures read from a cgroup: what the shared reader says, and the processes in it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CgroupStats {
    pub(crate) sample: kubelet_stats::CgroupSample,
    pub(crate) process_count: Option<u64>,
}

impl CgroupPaths {
    fn dir(&self, controller: &str) -> Option<&Path> {
        if self.unified {
            self.dirs.get(UNIFIED).map(PathBuf::as_path)
        } else {
            self.dirs.get(controller).map(PathBuf::as_path)
        }
    }

    /// Distinct directories (v1 controllers may share a mount, as `cpu,cpuacct`).
    pub(crate) fn unique_dirs(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = self.dirs.values().cloned().collect();
        v.sort();
        v.dedup();
        v
    }

    /// `cgroup.procs` files a process must be written to to join this cgroup.
    pub(crate) fn procs_files(&self) -> Vec<PathBuf> {
        self.unique_dirs()
            .into_iter()
            .map(|d| d.join("cgroup.procs"))
            .collect()
    }

    /// Write `pid` into every hierarchy of this cgroup.
    pub(crate) fn join(&self, pid: u32) -> Result<(), ProcessError> {
        for f in self.procs_files() {
            std::fs::write(&f, pid.to_string()).map_err(|source| ProcessError::Cgroup {
                op: "joining",
                path: f.clone(),
                source,
            })?;
        }
        Ok(())
    }

    /// Apply memory, CPU and cpuset settings (the shared writer of `kubelet-stats`).
    pub(crate) fn apply(&self, r: &ResourcesRecord) -> Result<(), ProcessError> {
        let mut v = kubelet_stats::cgroup::CgroupValues::default();
        v.cpu_shares = (r.cpu_shares > 0).then_some(r.cpu_shares.unsigned_abs());
        v.cpu_period = (r.cpu_period > 0).then_some(r.cpu_period);
        v.cpu_quota = (r.cpu_quota > 0 || r.cpu_period > 0).then_some(r.cpu_quota);
        v.memory_limit = (r.memory_limit_in_bytes > 0).then_some(r.memory_limit_in_bytes);
        v.cpuset_cpus = (!r.cpuset_cpus.is_empty()).then(|| r.cpuset_cpus.clone());
        v.cpuset_mems = (!r.cpuset_mems.is_empty()).then(|| r.cpuset_mems.clone());
        kubelet_stats::cgroup::write_values(
            self.version(),
            |c| self.dir(c).map(Path::to_path_buf),
            &v,
        )
        .map_err(cgroup_error)
    }

    fn version(&self) -> kubelet_stats::CgroupVersion {
        if self.unified {
            kubelet_stats::CgroupVersion::V2
        } else {
            kubelet_stats::CgroupVersion::V1
        }
    }

    /// Memory, CPU and process figures (`kubelet-stats`' reader).
    pub(crate) fn stats(&self) -> CgroupStats {
        let sample = kubelet_stats::cgroup::read_sample(self.version(), |c| {
            self.dir(c).map(Path::to_path_buf)
        })
        .unwrap_or_default();
        let process_count = ["pids", "memory"].iter().find_map(|c| {
            let t = read_small(&self.dir(c)?.join("cgroup.procs")).ok()?;
            Some(t.lines().filter(|l| !l.trim().is_empty()).count() as u64)
        });
        CgroupStats {
            sample,
            process_count,
        }
    }

    /// Number of OOM kills the kernel performed in this cgroup, if it says.
    pub(crate) fn oom_kills(&self) -> Option<u64> {
        self.stats().sample.oom_kills
    }

    /// v1 only: how often the memory limit was hit (a fallback OOM hint on old kernels).
    pub(crate) fn memory_failcnt(&self) -> Option<u64> {
        if self.unified {
            return None;
        }
        let t = read_small(&self.dir("memory")?.join("memory.failcnt")).ok()?;
        parse_u64(&t)
    }

    /// PIDs in the cgroup.
    pub(crate) fn pids(&self) -> Vec<u32> {
        let Some(dir) = self
            .dir("memory")
            .or_else(|| self.dirs.values().next().map(PathBuf::as_path))
        else {
            return Vec::new();
        };
        read_small(&dir.join("cgroup.procs"))
            .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Remove the cgroup directories (they must be empty of processes).
    pub(crate) fn remove(&self) -> Result<(), ProcessError> {
        remove_dirs(&self.unique_dirs())
    }
}

/// `rmdir` each directory that exists.
pub(crate) fn remove_dirs(dirs: &[PathBuf]) -> Result<(), ProcessError> {
    for d in dirs {
        match std::fs::remove_dir(d) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(ProcessError::Cgroup {
                    op: "removing",
                    path: d.clone(),
                    source,
                });
            }
        }
    }
    Ok(())
}

/// One pass at removing the cgroup `dir` and every cgroup below it (the shared writer's).
pub(crate) fn remove_tree_once(dir: &Path) -> Result<usize, ProcessError> {
    kubelet_stats::cgroup::remove_tree_once(dir).map_err(cgroup_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO_V1: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn mountinfo_with_v1_memory_selects_v1_even_with_an_empty_unified_tree() {
        let m = parse_mountinfo(MOUNTINFO_V1);
        assert_eq!(m.v2, vec![PathBuf::from("/sys/fs/cgroup/unified")]);
        let d = CgroupDriver::from_mounts(&m).expect("detected");
        let CgroupDriver::V1(map) = &d else {
            panic!("expected v1, got {d:?}");
        };
        assert_eq!(map["memory"], Path::new("/sys/fs/cgroup/memory"));
        assert_eq!(map["cpuacct"], Path::new("/sys/fs/cgroup/cpuacct"));
        assert!(!map.contains_key("name=systemd"));
        let p = d.container_paths("kubelet-sdk", "s1", "c1");
        assert_eq!(
            p.dirs["memory"],
            Path::new("/sys/fs/cgroup/memory/kubelet-sdk/s1/c1")
        );
        assert_eq!(p.procs_files().len(), 4);
    }

    #[test]
    fn comounted_cpu_cpuacct_is_joined_once() {
        let m = parse_mountinfo(
            "25 20 0:22 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n\
             26 20 0:23 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n",
        );
        let d = CgroupDriver::from_mounts(&m).expect("detected");
        let p = d.container_paths("k", "s", "c");
        assert_eq!(p.unique_dirs().len(), 2);
    }

    #[test]
    fn v2_is_used_only_when_it_offers_memory() {
        let root = tempfile::tempdir().expect("tempdir");
        let mounts = CgroupMounts {
            v2: vec![root.path().to_path_buf()],
            ..Default::default()
        };
        std::fs::write(root.path().join("cgroup.controllers"), "").expect("write");
        assert_eq!(CgroupDriver::from_mounts(&mounts), None);
        std::fs::write(
            root.path().join("cgroup.controllers"),
            "cpuset cpu io memory pids\n",
        )
        .expect("write");
        assert_eq!(
            CgroupDriver::from_mounts(&mounts),
            Some(CgroupDriver::V2(root.path().to_path_buf()))
        );
    }

    fn fixture_v2() -> (tempfile::TempDir, CgroupPaths) {
        let root = tempfile::tempdir().expect("tempdir");
        let d = CgroupDriver::V2(root.path().to_path_buf());
        let p = d.container_paths("kubelet-sdk", "s", "c");
        d.create(&p).expect("create");
        let dir = &p.dirs[UNIFIED];
        for (f, c) in [
            ("memory.max", "max\n"),
            ("memory.swap.max", "max\n"),
            ("cpu.weight", "100\n"),
            ("cpu.max", "max 100000\n"),
            ("memory.current", "10485760\n"),
            (
                "memory.stat",
                "anon 6000000\nfile 4000000\ninactive_file 3000000\nactive_file 1000000\n",
            ),
            (
                "cpu.stat",
                "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n",
            ),
            (
                "memory.events",
                "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n",
            ),
            ("cgroup.procs", "10\n11\n"),
        ] {
            std::fs::write(dir.join(f), c).expect("write");
        }
        (root, p)
    }

    #[test]
    fn v2_fixture_limits_stats_and_oom_kills() {
        let (_root, p) = fixture_v2();
        p.apply(&ResourcesRecord {
            cpu_period: 100_000,
            cpu_quota: 50_000,
            cpu_shares: 512,
            memory_limit_in_bytes: 33_554_432,
            ..Default::default()
        })
        .expect("apply");
        let dir = &p.dirs[UNIFIED];
        let rd = |f: &str| std::fs::read_to_string(dir.join(f)).expect("read");
        assert_eq!(rd("memory.max"), "33554432");
        assert_eq!(rd("memory.swap.max"), "0");
        assert_eq!(rd("cpu.max"), "50000 100000");
        assert_eq!(
            rd("cpu.weight"),
            kubelet_stats::cgroup::shares_to_weight(512).to_string()
        );
        let s = p.stats();
        assert_eq!(s.sample.memory_usage, Some(10_485_760));
        assert_eq!(s.sample.working_set(), Some(10_485_760 - 3_000_000));
        assert_eq!(s.sample.cpu_usage_ns, Some(1_500_000));
        assert_eq!(s.process_count, Some(2));
        assert_eq!(p.oom_kills(), Some(1));
        assert_eq!(p.pids(), vec![10, 11]);
    }

    #[test]
    fn v1_fixture_limits_stats_and_oom_kills() {
        let root = tempfile::tempdir().expect("tempdir");
        let map: BTreeMap<String, PathBuf> = V1_CONTROLLERS
            .iter()
            .map(|c| (c.to_string(), root.path().join(c)))
            .collect();
        for mount in map.values() {
            std::fs::create_dir_all(mount).expect("mount point");
        }
        let d = CgroupDriver::V1(map);
        let p = d.container_paths("kubelet-sdk", "s", "c");
        d.create(&p).expect("create");
        let mem = &p.dirs["memory"];
        std::fs::write(mem.join("memory.usage_in_bytes"), "8192000\n").expect("write");
        std::fs::write(
            mem.join("memory.memsw.limit_in_bytes"),
            "9223372036854771712\n",
        )
        .expect("write");
        std::fs::write(
            mem.join("memory.stat"),
            "cache 100\ninactive_file 50\ntotal_inactive_file 192000\n",
        )
        .expect("write");
        std::fs::write(
            mem.join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        )
        .expect("write");
        std::fs::write(mem.join("memory.failcnt"), "7\n").expect("write");
        std::fs::write(p.dirs["cpuacct"].join("cpuacct.usage"), "123456789\n").expect("write");
        std::fs::write(p.dirs["pids"].join("cgroup.procs"), "42\n").expect("write");
        // The kernel offers these files; the writer leaves absent ones alone.
        std::fs::write(mem.join("memory.limit_in_bytes"), "9223372036854771712\n").expect("write");
        for f in ["cpu.shares", "cpu.cfs_quota_us", "cpu.cfs_period_us"] {
            std::fs::write(p.dirs["cpu"].join(f), "0\n").expect("write");
        }
        std::fs::write(p.dirs["cpuset"].join("cpuset.cpus"), "0-1\n").expect("write");
        p.apply(&ResourcesRecord {
            cpu_period: 100_000,
            cpu_quota: 20_000,
            cpu_shares: 204,
            memory_limit_in_bytes: 33_554_432,
            cpuset_cpus: "1".into(),
            ..Default::default()
        })
        .expect("apply");
        let rd = |c: &str, f: &str| std::fs::read_to_string(p.dirs[c].join(f)).expect("read");
        assert_eq!(rd("memory", "memory.limit_in_bytes"), "33554432");
        assert_eq!(rd("memory", "memory.memsw.limit_in_bytes"), "33554432");
        assert_eq!(rd("cpu", "cpu.shares"), "204");
        assert_eq!(rd("cpu", "cpu.cfs_quota_us"), "20000");
        assert_eq!(rd("cpu", "cpu.cfs_period_us"), "100000");
        assert_eq!(rd("cpuset", "cpuset.cpus"), "1");
        let s = p.stats();
        assert_eq!(s.sample.memory_usage, Some(8_192_000));
        assert_eq!(s.sample.working_set(), Some(8_000_000));
        assert_eq!(s.sample.cpu_usage_ns, Some(123_456_789));
        assert_eq!(s.process_count, Some(1));
        assert_eq!(p.oom_kills(), Some(2));
        assert_eq!(p.memory_failcnt(), Some(7));
    }

    #[test]
    fn keyed_files_skip_malformed_lines() {
        let m = parse_keyed("a 1\nbroken\nb x\nc 3\n");
        assert_eq!(m.len(), 2);
        assert_eq!(m["c"], 3);
        assert_eq!(parse_u64("max\n"), None);
    }
}
