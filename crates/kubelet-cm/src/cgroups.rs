//! The kubelet's cgroup hierarchy: names (cgroupfs and systemd spelling), the `kubepods` tree
//! with its QoS tiers, the values of a pod cgroup, and creating, updating, listing and removing
//! them on cgroup v1 and v2 through the shared writer of `kubelet-stats`.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;
use kubelet_api::pod as podutil;
use kubelet_api::resources::{self, QosClass};
use kubelet_stats::cgroup::{self as cg, CgroupValues};
use kubelet_stats::{CgroupSetup, CgroupVersion};

use crate::CmError;

/// How cgroups are named (`cgroupDriver`); it must match the container runtime's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum CgroupDriver {
    /// Plain paths: `/kubepods/burstable/pod<uid>`.
    #[default]
    Cgroupfs,
    /// systemd slices: `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice`.
    /// The SDK creates them through the cgroup filesystem, not through systemd's D-Bus API.
    Systemd,
}

impl CgroupDriver {
    /// Parse `cgroupfs` or `systemd`.
    pub fn parse(s: &str) -> Result<Self, CmError> {
        match s {
            "cgroupfs" => Ok(CgroupDriver::Cgroupfs),
            "systemd" => Ok(CgroupDriver::Systemd),
            other => Err(CmError::Config(format!(
                "cgroupDriver {other:?}: want \"cgroupfs\" or \"systemd\""
            ))),
        }
    }

    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            CgroupDriver::Cgroupfs => "cgroupfs",
            CgroupDriver::Systemd => "systemd",
        }
    }
}

/// A cgroup by its components (`[kubepods, burstable, pod<uid>]`), spelled by a driver.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CgroupName(pub Vec<String>);

impl CgroupName {
    /// This name with `component` appended.
    pub fn child(&self, component: impl Into<String>) -> Self {
        let mut v = self.0.clone();
        v.push(component.into());
        CgroupName(v)
    }

    /// The path of this cgroup below the hierarchy root, as `driver` spells it (what the
    /// runtime gets as `cgroup_parent`).
    pub fn to_path(&self, driver: CgroupDriver) -> String {
        if self.0.is_empty() {
            return "/".into();
        }
        match driver {
            CgroupDriver::Cgroupfs => format!("/{}", self.0.join("/")),
            CgroupDriver::Systemd => {
                let escaped: Vec<String> = self.0.iter().map(|c| c.replace('-', "_")).collect();
                let mut out = String::new();
                for i in 1..=escaped.len() {
                    out.push('/');
                    out.push_str(&escaped[..i].join("-"));
                    out.push_str(".slice");
                }
                out
            }
        }
    }
}

/// The cgroup name of `--cgroup-root` (`/` is the hierarchy root).
pub fn root_name(cgroup_root: &str) -> CgroupName {
    CgroupName(
        cgroup_root
            .split('/')
            .filter(|c| !c.is_empty())
            .map(|c| c.trim_end_matches(".slice").to_string())
            .collect(),
    )
}

/// The values of a pod's cgroup (`ResourceConfigForPod`).
pub fn pod_values(
    pod: &Pod,
    qos: QosClass,
    cpu_cfs_quota: bool,
    pids_limit: i64,
) -> Result<CgroupValues, kubelet_api::quantity::QuantityError> {
    let mut v = CgroupValues::default();
    let requests = resources::pod_requests(pod)?;
    let cpu_request = requests.get("cpu").copied().unwrap_or(0);
    match qos {
        QosClass::BestEffort => {
            v.cpu_shares = Some(resources::MIN_SHARES as u64);
        }
        QosClass::Guaranteed | QosClass::Burstable => {
            v.cpu_shares = Some(resources::milli_cpu_to_shares(cpu_request) as u64);
            if cpu_cfs_quota && let Some(limit) = resources::pod_limit(pod, "cpu")? {
                v.cpu_period = Some(resources::QUOTA_PERIOD_US);
                v.cpu_quota = Some(resources::milli_cpu_to_quota(
                    limit,
                    resources::QUOTA_PERIOD_US,
                ));
            }
            if let Some(limit) = resources::pod_limit(pod, "memory")? {
                v.memory_limit = Some(limit);
            }
        }
    }
    if pids_limit > 0 {
        v.pids_limit = Some(pids_limit);
    }
    Ok(v)
}

/// The v1 controllers the SDK creates pod and QoS cgroups in (the runtime creates its
/// container cgroups in the others, and copies cpuset values down itself).
const V1_CREATED: [&str; 4] = ["memory", "cpu", "cpuacct", "pids"];

/// The `kubepods` tree of one node: where the pod cgroups live and how they are named.
#[derive(Debug, Clone)]
pub struct Hierarchy {
    setup: CgroupSetup,
    /// Every v1 mount, and on a hybrid machine the unified one (a pod's teardown removes its
    /// cgroup from each).
    all_v1: Vec<PathBuf>,
    driver: CgroupDriver,
    kubepods: CgroupName,
}

impl Hierarchy {
    /// The tree under `cgroup_root` in `setup`; `all_v1` lists every v1 mount point.
    pub fn new(
        setup: CgroupSetup,
        all_v1: Vec<PathBuf>,
        driver: CgroupDriver,
        cgroup_root: &str,
    ) -> Self {
        Self {
            setup,
            all_v1,
            driver,
            kubepods: root_name(cgroup_root).child("kubepods"),
        }
    }

    /// This machine's cgroups (from `/proc/self/mountinfo`); `None` without a memory
    /// controller.
    pub fn detect(driver: CgroupDriver, cgroup_root: &str) -> Option<Self> {
        let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        let mounts = cg::parse_mountinfo(&text);
        let setup = CgroupSetup::from_mounts(&mounts)?;
        // On a hybrid machine runc also makes each container's cgroup in the unified tree.
        let mut all = mounts.all_v1;
        if setup.version() == CgroupVersion::V1 {
            all.extend(mounts.v2);
        }
        Some(Self::new(setup, all, driver, cgroup_root))
    }

    /// v1 or v2.
    pub fn version(&self) -> CgroupVersion {
        self.setup.version()
    }

    /// The driver naming the cgroups.
    pub fn driver(&self) -> CgroupDriver {
        self.driver
    }

    /// `kubepods`.
    pub fn kubepods(&self) -> &CgroupName {
        &self.kubepods
    }

    /// The QoS tier of `qos`: `kubepods/burstable`, `kubepods/besteffort`, or `kubepods` itself
    /// for Guaranteed pods.
    pub fn tier(&self, qos: QosClass) -> CgroupName {
        match qos {
            QosClass::Guaranteed => self.kubepods.clone(),
            QosClass::Burstable => self.kubepods.child("burstable"),
            QosClass::BestEffort => self.kubepods.child("besteffort"),
        }
    }

    /// The cgroup of pod `uid` of class `qos`.
    pub fn pod(&self, qos: QosClass, uid: &str) -> CgroupName {
        self.tier(qos).child(format!("pod{uid}"))
    }

    /// The directory of cgroup `name` for `controller` (on v2 the same for all).
    pub fn dir(&self, controller: &str, name: &CgroupName) -> Option<PathBuf> {
        self.setup
            .dir(controller, Path::new(&name.to_path(self.driver)))
    }

    fn roots(&self) -> Vec<(&'static str, PathBuf)> {
        match &self.setup {
            CgroupSetup::V2 { root } => vec![("unified", root.clone())],
            _ => V1_CREATED
                .iter()
                .filter_map(|c| Some((*c, self.setup.dir(c, Path::new("/"))?)))
                .collect(),
        }
    }

    /// Whether cgroup `name` exists (its memory directory).
    pub fn exists(&self, name: &CgroupName) -> bool {
        self.dir("memory", name).is_some_and(|d| d.is_dir())
    }

    /// Create cgroup `name` (and the missing ones above it) and write `values`.
    pub fn ensure(&self, name: &CgroupName, values: &CgroupValues) -> Result<(), CmError> {
        let rel = name.to_path(self.driver);
        for (controller, root) in self.roots() {
            cg::create_cgroup(self.version(), controller, &root, Path::new(&rel), false)?;
        }
        self.update(name, values)
    }

    /// Write `values` into the existing cgroup `name`.
    pub fn update(&self, name: &CgroupName, values: &CgroupValues) -> Result<(), CmError> {
        cg::write_values(self.version(), |c| self.dir(c, name), values)?;
        Ok(())
    }

    /// Every directory of cgroup `name`: one per v1 mount (each controller the runtime may
    /// have created it in), or the v2 one.
    fn all_dirs(&self, name: &CgroupName) -> Vec<PathBuf> {
        let rel = name.to_path(self.driver);
        let rel = rel.trim_start_matches('/');
        let mut dirs: Vec<PathBuf> = match &self.setup {
            CgroupSetup::V2 { root } => vec![root.join(rel)],
            _ => self.all_v1.iter().map(|m| m.join(rel)).collect(),
        };
        if dirs.is_empty() {
            dirs = self.roots().into_iter().map(|(_, r)| r.join(rel)).collect();
        }
        kubelet_api::sort::by(&mut dirs, Ord::cmp);
        dirs.dedup();
        dirs
    }

    /// Remove cgroup `name` everywhere: its CPU weight dropped to the minimum first (as the
    /// kubelet does), then every process still in it or below it killed, then the directories
    /// removed, children first. Returns how many processes were killed; an `EBUSY` error
    /// means the kernel has not freed them yet (call again).
    pub fn destroy(&self, name: &CgroupName) -> Result<usize, CmError> {
        let mut minimum = CgroupValues::default();
        minimum.cpu_shares = Some(resources::MIN_SHARES as u64);
        let _ = self.update(name, &minimum);
        let mut killed = 0;
        for dir in self.all_dirs(name) {
            killed += cg::remove_tree_once(&dir)?;
        }
        Ok(killed)
    }

    /// The pod cgroups that exist now: `(pod uid, QoS class)`.
    pub fn list_pods(&self) -> Vec<(String, QosClass)> {
        let mut out = Vec::new();
        for qos in [
            QosClass::Guaranteed,
            QosClass::Burstable,
            QosClass::BestEffort,
        ] {
            let Some(dir) = self.dir("memory", &self.tier(qos)) else {
                continue;
            };
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                if !e.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(uid) = self.pod_uid_of(qos, &name) {
                    out.push((uid, qos));
                }
            }
        }
        out
    }

    /// The pod UID of directory `dir_name` in tier `qos`, if it is a pod cgroup.
    fn pod_uid_of(&self, qos: QosClass, dir_name: &str) -> Option<String> {
        match self.driver {
            CgroupDriver::Cgroupfs => dir_name.strip_prefix("pod").map(str::to_string),
            CgroupDriver::Systemd => {
                let prefix = self.tier(qos).to_path(self.driver);
                let prefix = prefix.rsplit('/').next()?.trim_end_matches(".slice");
                let rest = dir_name
                    .strip_prefix(prefix)?
                    .strip_prefix("-pod")?
                    .strip_suffix(".slice")?;
                Some(rest.replace('_', "-"))
            }
        }
    }
}

/// The QoS class of `pod`, from its status when set (it is immutable), else computed.
pub fn pod_qos(pod: &Pod) -> QosClass {
    match pod.status.as_ref().and_then(|s| s.qos_class.as_deref()) {
        Some("Guaranteed") => QosClass::Guaranteed,
        Some("Burstable") => QosClass::Burstable,
        Some("BestEffort") => QosClass::BestEffort,
        _ => resources::qos_class(pod),
    }
}

/// The UID of `pod`.
pub(crate) fn uid(pod: &Pod) -> &str {
    podutil::uid(pod)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_kubelet_for_both_drivers() {
        let h = Hierarchy::new(
            CgroupSetup::V2 {
                root: "/sys/fs/cgroup".into(),
            },
            vec![],
            CgroupDriver::Systemd,
            "/",
        );
        let p = h.pod(QosClass::Burstable, "1234-abcd");
        assert_eq!(
            p.to_path(CgroupDriver::Systemd),
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234_abcd.slice"
        );
        assert_eq!(
            p.to_path(CgroupDriver::Cgroupfs),
            "/kubepods/burstable/pod1234-abcd"
        );
        assert_eq!(
            h.pod(QosClass::Guaranteed, "u")
                .to_path(CgroupDriver::Systemd),
            "/kubepods.slice/kubepods-podu.slice"
        );
        assert_eq!(
            h.pod_uid_of(QosClass::Burstable, "kubepods-burstable-pod1234_abcd.slice"),
            Some("1234-abcd".into())
        );
        assert_eq!(h.pod_uid_of(QosClass::Burstable, "other.slice"), None);
        assert_eq!(
            root_name("/agent")
                .child("kubepods")
                .to_path(CgroupDriver::Cgroupfs),
            "/agent/kubepods"
        );
        assert_eq!(
            CgroupDriver::parse("systemd").unwrap(),
            CgroupDriver::Systemd
        );
        assert!(CgroupDriver::parse("cgroupsfs").is_err());
    }

    #[test]
    fn a_v2_pod_cgroup_gets_weight_max_and_memory_and_its_parents_the_controllers() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::write(r.join("cgroup.subtree_control"), "").unwrap();
        let h = Hierarchy::new(
            CgroupSetup::V2 {
                root: r.to_path_buf(),
            },
            vec![],
            CgroupDriver::Cgroupfs,
            "/",
        );
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"uid": "u1"},
            "spec": {"containers": [{"name": "c", "resources": {
                "limits": {"cpu": "500m", "memory": "64Mi"}}}]}
        }))
        .unwrap();
        let qos = pod_qos(&pod);
        assert_eq!(qos, QosClass::Guaranteed);
        let name = h.pod(qos, "u1");
        // The kernel makes the interface files with the directory; a tempdir needs them first.
        let dir = r.join("kubepods/podu1");
        std::fs::create_dir_all(&dir).unwrap();
        for f in [
            "cpu.weight",
            "cpu.max",
            "memory.max",
            "memory.swap.max",
            "pids.max",
        ] {
            std::fs::write(dir.join(f), "").unwrap();
        }
        let values = pod_values(&pod, qos, true, 100).unwrap();
        h.ensure(&name, &values).unwrap();
        let rd = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
        // 500m: shares 512 → weight 1 + 510 × 9999 / 262142 = 20.
        assert_eq!(rd("cpu.weight"), "20");
        assert_eq!(rd("cpu.max"), "50000 100000");
        assert_eq!(rd("memory.max"), (64u64 << 20).to_string());
        assert_eq!(rd("memory.swap.max"), "0");
        assert_eq!(rd("pids.max"), "100");
        // Controllers were enabled on the way down (the last write stays in a plain file).
        let control = std::fs::read_to_string(r.join("kubepods/cgroup.subtree_control")).unwrap();
        assert!(control.starts_with('+'), "{control:?}");
        assert_eq!(
            h.list_pods(),
            vec![("u1".to_string(), QosClass::Guaranteed)]
        );
        assert!(h.exists(&name));
    }
}
