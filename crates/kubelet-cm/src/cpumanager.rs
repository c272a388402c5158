//! The CPU manager's `static` policy: containers of Guaranteed pods with an integer CPU request
//! get CPUs of their own (whole physical cores before single hyperthreads), every other
//! container shares the rest; the assignments live in a checkpoint file (`cpu_manager_state`)
//! that survives an agent restart.
//!
//! Deliberate differences from the kubelet: no topology manager (NUMA hints) and no policy
//! options; regular init containers run on the shared pool instead of borrowing CPUs the app
//! containers get later; the checkpoint's checksum is FNV-32a over the JSON written with
//! `checksum: 0` (the kubelet hashes a Go-specific dump), so a Go kubelet's file is reported as
//! foreign.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;
use kubelet_api::pod as podutil;
use kubelet_api::resources::{self, QosClass};
use kubelet_api::{AdmitResult, PodAdmitHandler};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::CmError;

/// The checkpoint's file name under the root directory.
pub const STATE_FILE: &str = "cpu_manager_state";

/// A set of CPU IDs, written in the Linux list format (`0-2,5`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct CpuSet(pub BTreeSet<u32>);

impl CpuSet {
    /// Parse the list format; empty text is the empty set.
    pub fn parse(s: &str) -> Result<Self, CmError> {
        let mut out = BTreeSet::new();
        let bad = || CmError::Config(format!("invalid CPU list {s:?}"));
        for part in s.trim().split(',').filter(|p| !p.trim().is_empty()) {
            let part = part.trim();
            match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b): (u32, u32) = (
                        a.trim().parse().map_err(|_| bad())?,
                        b.trim().parse().map_err(|_| bad())?,
                    );
                    if a > b || b - a > 4096 {
                        return Err(bad());
                    }
                    out.extend(a..=b);
                }
                None => {
                    out.insert(part.parse().map_err(|_| bad())?);
                }
            }
        }
        Ok(CpuSet(out))
    }

    /// How many CPUs.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// No CPU.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The CPUs of `self` not in `other`.
    pub fn difference(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.difference(&other.0).copied().collect())
    }
}

impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut it = self.0.iter().copied().peekable();
        while let Some(start) = it.next() {
            let mut end = start;
            while it.peek() == Some(&(end + 1)) {
                end += 1;
                it.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

/// One logical CPU and where it sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuInfo {
    /// The CPU's ID.
    pub id: u32,
    /// Its physical core (`topology/core_id`).
    pub core: u32,
    /// Its socket (`topology/physical_package_id`).
    pub socket: u32,
}

/// The machine's CPUs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    /// Every online CPU.
    pub cpus: Vec<CpuInfo>,
}

impl Topology {
    /// Read `<sys>/devices/system/cpu` (`sys` is `/sys` on a machine).
    pub fn read(sys: &Path) -> Result<Self, CmError> {
        let base = sys.join("devices/system/cpu");
        let online = std::fs::read_to_string(base.join("online"))
            .map_err(|e| CmError::Config(format!("reading online CPUs: {e}")))?;
        let mut cpus = Vec::new();
        for id in CpuSet::parse(&online)?.0 {
            let read = |f: &str| {
                std::fs::read_to_string(base.join(format!("cpu{id}/topology/{f}")))
                    .ok()
                    .and_then(|t| t.trim().parse::<i64>().ok())
            };
            cpus.push(CpuInfo {
                id,
                // A CPU without topology files is a core of its own.
                core: read("core_id").map_or(id, |c| c.max(0) as u32),
                socket: read("physical_package_id").map_or(0, |s| s.max(0) as u32),
            });
        }
        Ok(Topology { cpus })
    }

    /// Every CPU.
    pub fn all(&self) -> CpuSet {
        CpuSet(self.cpus.iter().map(|c| c.id).collect())
    }

    /// Take `n` CPUs of `free`: whole physical cores first (lowest socket and core first),
    /// then single threads, preferring cores already partly taken (packing). `None` when
    /// `free` has fewer than `n`.
    pub fn take(&self, free: &CpuSet, n: usize) -> Option<CpuSet> {
        if free.len() < n {
            return None;
        }
        let mut cores: BTreeMap<(u32, u32), Vec<u32>> = BTreeMap::new();
        let mut core_size: BTreeMap<(u32, u32), usize> = BTreeMap::new();
        for c in &self.cpus {
            *core_size.entry((c.socket, c.core)).or_insert(0) += 1;
            if free.0.contains(&c.id) {
                cores.entry((c.socket, c.core)).or_default().push(c.id);
            }
        }
        let mut taken = BTreeSet::new();
        // Whole cores.
        for (key, ids) in &cores {
            let size = core_size[key];
            if ids.len() == size && n - taken.len() >= size {
                taken.extend(ids.iter().copied());
            }
            if taken.len() == n {
                return Some(CpuSet(taken));
            }
        }
        // Single threads, from the cores with the fewest free threads first.
        let mut rest: Vec<(usize, (u32, u32), u32)> = cores
            .iter()
            .flat_map(|(k, ids)| ids.iter().map(move |id| (ids.len(), *k, *id)))
            .filter(|(_, _, id)| !taken.contains(id))
            .collect();
        kubelet_api::sort::by(&mut rest, Ord::cmp);
        for (_, _, id) in rest {
            if taken.len() == n {
                break;
            }
            taken.insert(id);
        }
        (taken.len() == n).then_some(CpuSet(taken))
    }
}

/// The checkpoint as written.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
struct Checkpoint {
    policy_name: String,
    default_cpu_set: String,
    #[serde(default)]
    entries: BTreeMap<String, BTreeMap<String, String>>,
    checksum: u32,
}

fn fnv32a(data: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in data {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

impl Checkpoint {
    fn sum(&self) -> u32 {
        let mut c = self.clone();
        c.checksum = 0;
        fnv32a(&serde_json::to_vec(&c).unwrap_or_default())
    }
}

/// The assignments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct State {
    default: CpuSet,
    entries: BTreeMap<String, BTreeMap<String, CpuSet>>,
}

/// The static policy with its checkpoint.
#[derive(Debug)]
pub struct StaticPolicy {
    topology: Topology,
    reserved: CpuSet,
    file: PathBuf,
    state: Mutex<State>,
    /// Why the checkpoint could not be used; while set nothing is assigned or changed.
    broken: Option<String>,
}

impl StaticPolicy {
    /// The policy on `topology` with the `reserved` CPUs (never handed out exclusively), its
    /// checkpoint in `root_dir`. A checkpoint of another policy, with a wrong checksum or
    /// unreadable is reported (the returned warning); the policy starts afresh only when that
    /// file assigned no exclusive CPUs, else it refuses to assign until the file is removed,
    /// leaving running containers as they are.
    pub fn new(
        topology: Topology,
        reserved: CpuSet,
        root_dir: &Path,
    ) -> Result<(Self, Option<String>), CmError> {
        if reserved.is_empty() {
            return Err(CmError::Config(
                "the static CPU manager policy needs a CPU reservation: set reservedSystemCPUs, or a cpu in kubeReserved or systemReserved".into(),
            ));
        }
        let all = topology.all();
        if !reserved.difference(&all).is_empty() {
            return Err(CmError::Config(format!(
                "reserved CPUs {reserved} are not all online CPUs ({all})"
            )));
        }
        let file = root_dir.join(STATE_FILE);
        let fresh = State {
            default: all.clone(),
            entries: BTreeMap::new(),
        };
        let mut warning = None;
        let mut broken = None;
        let state = match std::fs::read(&file) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => fresh,
            Err(e) => {
                broken = Some(format!("reading {}: {e}", file.display()));
                fresh
            }
            Ok(bytes) => match Self::load(&bytes, &all) {
                Ok(s) => s,
                Err((why, holds_cpus)) => {
                    let msg = format!("CPU manager checkpoint {}: {why}", file.display());
                    if holds_cpus {
                        broken = Some(format!(
                            "{msg}; it assigns exclusive CPUs, so none are assigned until it is removed (drain the node and delete the file)"
                        ));
                    } else {
                        warning = Some(format!(
                            "{msg}; it assigns no exclusive CPUs: starting afresh"
                        ));
                    }
                    fresh
                }
            },
        };
        let policy = Self {
            topology,
            reserved,
            file,
            state: Mutex::new(state),
            broken,
        };
        if let Some(b) = &policy.broken {
            warning = Some(b.clone());
        } else {
            policy.save()?;
        }
        Ok((policy, warning))
    }

    fn load(bytes: &[u8], all: &CpuSet) -> Result<State, (String, bool)> {
        let cp: Checkpoint =
            serde_json::from_slice(bytes).map_err(|e| (format!("unreadable ({e})"), true))?;
        let holds = cp.entries.values().any(|m| !m.is_empty());
        if cp.policy_name != "static" {
            return Err((
                format!(
                    "configured policy \"static\" differs from state checkpoint policy {:?}",
                    cp.policy_name
                ),
                holds,
            ));
        }
        if cp.sum() != cp.checksum {
            return Err((
                "checksum mismatch (corrupt or written by another agent)".into(),
                holds,
            ));
        }
        let parse = |s: &str| CpuSet::parse(s).map_err(|e| (e.to_string(), holds));
        let mut st = State {
            default: parse(&cp.default_cpu_set)?,
            entries: BTreeMap::new(),
        };
        let mut seen = st.default.clone();
        for (uid, m) in cp.entries {
            for (name, set) in m {
                let set = parse(&set)?;
                if set.0.iter().any(|c| seen.0.contains(c)) {
                    return Err((format!("CPUs {set} assigned twice"), holds));
                }
                seen.0.extend(set.0.iter().copied());
                st.entries.entry(uid.clone()).or_default().insert(name, set);
            }
        }
        if &seen != all {
            return Err((
                format!("its CPUs ({seen}) are not this machine's ({all})"),
                holds,
            ));
        }
        Ok(st)
    }

    fn save(&self) -> Result<(), CmError> {
        let st = self.state.lock().clone();
        let mut cp = Checkpoint {
            policy_name: "static".into(),
            default_cpu_set: st.default.to_string(),
            entries: st
                .entries
                .iter()
                .map(|(u, m)| {
                    (
                        u.clone(),
                        m.iter().map(|(n, s)| (n.clone(), s.to_string())).collect(),
                    )
                })
                .collect(),
            checksum: 0,
        };
        cp.checksum = cp.sum();
        let bytes = serde_json::to_vec(&cp).map_err(|e| CmError::State(e.to_string()))?;
        let tmp = self.file.with_extension("tmp");
        std::fs::write(&tmp, bytes)
            .and_then(|()| std::fs::rename(&tmp, &self.file))
            .map_err(|e| CmError::State(format!("writing {}: {e}", self.file.display())))
    }

    /// The reserved CPUs.
    pub fn reserved(&self) -> &CpuSet {
        &self.reserved
    }

    /// Why the policy is not assigning (an unusable checkpoint), if so.
    pub fn broken(&self) -> Option<&str> {
        self.broken.as_deref()
    }

    /// The shared pool: every CPU not assigned exclusively (reserved ones included).
    pub fn shared(&self) -> CpuSet {
        self.state.lock().default.clone()
    }

    /// The CPUs of container `name` of pod `uid`: its own, or the shared pool.
    pub fn cpuset(&self, uid: &str, name: &str) -> CpuSet {
        let st = self.state.lock();
        st.entries
            .get(uid)
            .and_then(|m| m.get(name))
            .cloned()
            .unwrap_or_else(|| st.default.clone())
    }

    /// The exclusive CPUs `pod` asks for, per container: app containers and sidecars of a
    /// Guaranteed pod with an integer CPU request.
    pub fn exclusive_requests(pod: &Pod, qos: QosClass) -> Vec<(String, usize)> {
        if qos != QosClass::Guaranteed {
            return Vec::new();
        }
        let sidecars = podutil::init_containers(pod)
            .iter()
            .filter(|c| podutil::is_sidecar(c));
        sidecars
            .chain(podutil::containers(pod))
            .filter_map(|c| {
                let milli = resources::container_requests(c).ok()?.get("cpu").copied()?;
                (milli > 0 && milli % 1000 == 0).then(|| (c.name.clone(), (milli / 1000) as usize))
            })
            .collect()
    }

    /// Assign the exclusive CPUs of `pod` (idempotent); an error names the shortfall.
    pub fn allocate(&self, pod: &Pod, qos: QosClass) -> Result<(), String> {
        let wants = Self::exclusive_requests(pod, qos);
        if wants.is_empty() {
            return Ok(());
        }
        if let Some(b) = &self.broken {
            return Err(b.clone());
        }
        let uid = podutil::uid(pod).to_string();
        let mut st = self.state.lock();
        let mut changed = false;
        for (name, n) in wants {
            if st.entries.get(&uid).is_some_and(|m| m.contains_key(&name)) {
                continue;
            }
            let free = st.default.difference(&self.reserved);
            let Some(set) = self.topology.take(&free, n) else {
                // Hand back what this pod got in this call's earlier containers.
                drop(st);
                if changed {
                    self.release(&uid);
                }
                return Err(format!(
                    "not enough cpus available to satisfy request: requested={n}, available={}",
                    free.len()
                ));
            };
            st.default = st.default.difference(&set);
            st.entries.entry(uid.clone()).or_default().insert(name, set);
            changed = true;
        }
        drop(st);
        if changed && let Err(e) = self.save() {
            tracing::warn!(error = %kubelet_api::chain(&e), "CPU manager checkpoint not written");
        }
        Ok(())
    }

    /// Give pod `uid`'s exclusive CPUs back to the shared pool.
    pub fn release(&self, uid: &str) -> bool {
        let mut st = self.state.lock();
        let Some(m) = st.entries.remove(uid) else {
            return false;
        };
        for set in m.values() {
            st.default.0.extend(set.0.iter().copied());
        }
        drop(st);
        if let Err(e) = self.save() {
            tracing::warn!(error = %kubelet_api::chain(&e), "CPU manager checkpoint not written");
        }
        true
    }

    /// The pods holding exclusive CPUs.
    pub fn assigned_pods(&self) -> Vec<String> {
        self.state.lock().entries.keys().cloned().collect()
    }

    /// Release the CPUs of every pod not in `active` (`removeStaleState`); returns their UIDs.
    pub fn remove_stale(&self, active: &BTreeSet<String>) -> Vec<String> {
        let stale: Vec<String> = self
            .state
            .lock()
            .entries
            .keys()
            .filter(|u| !active.contains(*u))
            .cloned()
            .collect();
        for u in &stale {
            self.release(u);
        }
        stale
    }
}

/// Admits a Guaranteed pod only when its exclusive CPUs can be assigned (the kubelet's
/// resource allocation admit handler).
#[derive(Debug)]
pub struct CpuAdmitHandler {
    policy: std::sync::Arc<StaticPolicy>,
}

impl CpuAdmitHandler {
    /// A handler assigning through `policy`.
    pub fn new(policy: std::sync::Arc<StaticPolicy>) -> Self {
        Self { policy }
    }
}

impl PodAdmitHandler for CpuAdmitHandler {
    fn admit(&self, pod: &Pod, _active_pods: &[std::sync::Arc<Pod>]) -> AdmitResult {
        match self.policy.allocate(pod, crate::cgroups::pod_qos(pod)) {
            Ok(()) => AdmitResult::admit(),
            Err(e) => AdmitResult::reject(
                "UnexpectedAdmissionError",
                format!("Allocate failed due to {e}, which is unexpected"),
            ),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn topo(cpus: &[(u32, u32)]) -> Topology {
        Topology {
            cpus: cpus
                .iter()
                .map(|&(id, core)| CpuInfo {
                    id,
                    core,
                    socket: 0,
                })
                .collect(),
        }
    }

    #[test]
    fn cpu_lists_round_trip() {
        let s = CpuSet::parse("0-2,5,7-8").unwrap();
        assert_eq!(s.len(), 6);
        assert_eq!(s.to_string(), "0-2,5,7-8");
        assert_eq!(CpuSet::parse("").unwrap().to_string(), "");
        assert!(CpuSet::parse("3-1").is_err());
        assert!(CpuSet::parse("x").is_err());
    }

    #[test]
    fn whole_cores_go_before_single_threads() {
        // 4 cores × 2 threads: CPU n and n+4 are siblings.
        let t = topo(&[
            (0, 0),
            (1, 1),
            (2, 2),
            (3, 3),
            (4, 0),
            (5, 1),
            (6, 2),
            (7, 3),
        ]);
        let free = CpuSet::parse("1-7").unwrap();
        // Core 0 is partly taken (CPU 0): two CPUs come from core 1 whole.
        assert_eq!(t.take(&free, 2).unwrap().to_string(), "1,5");
        // One CPU: the lone sibling of the partly-taken core 0.
        assert_eq!(t.take(&free, 1).unwrap().to_string(), "4");
        assert!(t.take(&free, 8).is_none());
    }

    #[test]
    fn checkpoint_survives_a_restart_and_corruption_is_handled() {
        let dir = tempfile::tempdir().unwrap();
        let t = topo(&[(0, 0), (1, 1)]);
        let reserved = CpuSet::parse("0").unwrap();
        let (p, w) = StaticPolicy::new(t.clone(), reserved.clone(), dir.path()).unwrap();
        assert!(w.is_none());
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"uid": "u1", "name": "g"},
            "spec": {"containers": [{"name": "c", "resources": {
                "requests": {"cpu": "1", "memory": "64Mi"},
                "limits": {"cpu": "1", "memory": "64Mi"}}}]}
        }))
        .unwrap();
        p.allocate(&pod, QosClass::Guaranteed).unwrap();
        assert_eq!(p.cpuset("u1", "c").to_string(), "1");
        assert_eq!(p.shared().to_string(), "0");
        // A second pod finds no free CPU (CPU 0 is reserved).
        let mut other = pod.clone();
        other.metadata.uid = Some("u2".into());
        let e = p.allocate(&other, QosClass::Guaranteed).unwrap_err();
        assert!(e.contains("requested=1, available=0"), "{e}");
        drop(p);
        let (p, _) = StaticPolicy::new(t.clone(), reserved.clone(), dir.path()).unwrap();
        assert_eq!(p.cpuset("u1", "c").to_string(), "1");
        assert_eq!(p.remove_stale(&BTreeSet::new()), vec!["u1".to_string()]);
        assert_eq!(p.shared().to_string(), "0-1");
        p.allocate(&pod, QosClass::Guaranteed).unwrap();
        drop(p);
        // Corrupt it: exclusive CPUs are held, so the policy refuses.
        let file = dir.path().join(STATE_FILE);
        let mut cp: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        cp["checksum"] = serde_json::json!(cp["checksum"].as_u64().unwrap() ^ 1);
        std::fs::write(&file, serde_json::to_vec(&cp).unwrap()).unwrap();
        let (p, w) = StaticPolicy::new(t.clone(), reserved.clone(), dir.path()).unwrap();
        assert!(w.unwrap().contains("checksum mismatch"));
        assert!(p.broken().is_some());
        assert!(p.allocate(&other, QosClass::Guaranteed).is_err());
        // A foreign file holding nothing: fresh state.
        std::fs::write(
            &file,
            r#"{"policyName":"none","defaultCpuSet":"","checksum":1}"#,
        )
        .unwrap();
        let (p, w) = StaticPolicy::new(t, reserved, dir.path()).unwrap();
        assert!(w.unwrap().contains("starting afresh"));
        assert!(p.broken().is_none());
        assert!(StaticPolicy::new(topo(&[(0, 0)]), CpuSet::default(), dir.path()).is_err());
    }
}
