//! Node allocatable (`GetNodeAllocatableReservation`): capacity minus `kubeReserved`,
//! `systemReserved` and the hard eviction thresholds, and the limits `kubepods` gets when
//! `enforceNodeAllocatable` lists `pods`.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kubelet_api::quantity;

use crate::CmError;

/// What the node has, in canonical units (millicores, bytes, a count).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capacity {
    /// `cpu`, in millicores.
    pub cpu_milli: i64,
    /// `memory`, in bytes.
    pub memory: i64,
    /// `ephemeral-storage` (the root directory's filesystem), in bytes; 0 when unknown.
    pub ephemeral_storage: i64,
    /// `pods` (`maxPods`).
    pub pods: i64,
    /// `pid` (the kernel's `pid_max`), for `kubepods` `pids.max` when pids are reserved.
    pub pids: i64,
}

impl Capacity {
    /// The capacity as a resource list in canonical units.
    pub fn as_map(&self) -> BTreeMap<String, i64> {
        let mut m = BTreeMap::from([
            ("cpu".to_string(), self.cpu_milli),
            ("memory".to_string(), self.memory),
            ("pods".to_string(), self.pods),
        ]);
        if self.ephemeral_storage > 0 {
            m.insert("ephemeral-storage".into(), self.ephemeral_storage);
        }
        m
    }
}

/// Parse a reservation map (`kubeReserved`, `systemReserved`: `cpu`, `memory`,
/// `ephemeral-storage`, `pid`) into canonical units.
pub fn parse_reserved(
    field: &str,
    m: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, i64>, CmError> {
    let mut out = BTreeMap::new();
    for (k, v) in m {
        let amount = match k.as_str() {
            "cpu" => quantity::parse_milli(v),
            "memory" | "ephemeral-storage" | "pid" => quantity::parse_bytes(v),
            other => {
                return Err(CmError::Config(format!(
                    "{field}: unsupported resource {other:?} (want cpu, memory, ephemeral-storage or pid)"
                )));
            }
        }
        .map_err(|e| CmError::Config(format!("{field}.{k}: {e}")))?;
        out.insert(k.clone(), amount);
    }
    Ok(out)
}

/// A hard eviction threshold (`100Mi` or `10%`) in bytes of `capacity`.
fn threshold_bytes(value: &str, capacity: i64) -> Result<i64, CmError> {
    if let Some(p) = value.strip_suffix('%') {
        let pct: f64 = p
            .trim()
            .parse()
            .map_err(|_| CmError::Config(format!("evictionHard: bad percentage {value:?}")))?;
        if !(0.0..=100.0).contains(&pct) {
            return Err(CmError::Config(format!(
                "evictionHard: percentage {value:?} out of range"
            )));
        }
        return Ok((capacity as f64 * pct / 100.0) as i64);
    }
    quantity::parse_bytes(value).map_err(|e| CmError::Config(format!("evictionHard: {e}")))
}

/// Node allocatable and the `kubepods` limits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allocatable {
    /// `status.allocatable`, canonical units.
    pub allocatable: BTreeMap<String, i64>,
    /// capacity − kube − system reserved (without the eviction thresholds): the `kubepods`
    /// cgroup's limits when `pods` is enforced.
    pub pods_limits: BTreeMap<String, i64>,
}

/// Allocatable of `capacity` with the reservations and hard eviction thresholds.
/// `reserved_cpus`: the CPU count of `reservedSystemCPUs`, which replaces the CPU part of the
/// reservations.
pub fn compute(
    capacity: &Capacity,
    kube_reserved: &BTreeMap<String, i64>,
    system_reserved: &BTreeMap<String, i64>,
    eviction_hard: &BTreeMap<String, String>,
    reserved_cpus: Option<i64>,
) -> Result<Allocatable, CmError> {
    let cap = capacity.as_map();
    let mut reserved: BTreeMap<String, i64> = BTreeMap::new();
    for m in [kube_reserved, system_reserved] {
        for (k, v) in m {
            *reserved.entry(k.clone()).or_insert(0) += v;
        }
    }
    if let Some(n) = reserved_cpus {
        reserved.insert("cpu".into(), n * 1000);
    }
    let mut pods_limits = BTreeMap::new();
    for (k, v) in &cap {
        pods_limits.insert(
            k.clone(),
            (v - reserved.get(k).copied().unwrap_or(0)).max(0),
        );
    }
    if let Some(p) = reserved.get("pid") {
        pods_limits.insert("pid".into(), (capacity.pids - p).max(0));
    }
    let mut with_eviction = reserved.clone();
    if let Some(v) = eviction_hard.get("memory.available") {
        *with_eviction.entry("memory".into()).or_insert(0) += threshold_bytes(v, capacity.memory)?;
    }
    if let Some(v) = eviction_hard.get("nodefs.available")
        && capacity.ephemeral_storage > 0
    {
        *with_eviction.entry("ephemeral-storage".into()).or_insert(0) +=
            threshold_bytes(v, capacity.ephemeral_storage)?;
    }
    let mut allocatable = BTreeMap::new();
    for (k, v) in &cap {
        allocatable.insert(
            k.clone(),
            (v - with_eviction.get(k).copied().unwrap_or(0)).max(0),
        );
    }
    Ok(Allocatable {
        allocatable,
        pods_limits,
    })
}

/// A canonical amount as the API writes it in a node status: `1500m` / `2` for CPU, `…Ki`
/// for whole KiB of bytes, else the number.
pub fn to_quantity(resource: &str, amount: i64) -> Quantity {
    if resource == "cpu" {
        if amount % 1000 == 0 {
            return Quantity((amount / 1000).to_string());
        }
        return Quantity(format!("{amount}m"));
    }
    if (resource == "memory" || resource == "ephemeral-storage") && amount % 1024 == 0 {
        return Quantity(format!("{}Ki", amount / 1024));
    }
    Quantity(amount.to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn allocatable_subtracts_reservations_and_hard_thresholds() {
        let cap = Capacity {
            cpu_milli: 2000,
            memory: 8 << 30,
            ephemeral_storage: 100 << 30,
            pods: 110,
            pids: 4_194_304,
        };
        let kube = parse_reserved(
            "kubeReserved",
            &[
                ("cpu".to_string(), "100m".to_string()),
                ("memory".into(), "256Mi".into()),
            ]
            .into(),
        )
        .unwrap();
        let system = parse_reserved(
            "systemReserved",
            &[("memory".to_string(), "256Mi".to_string())].into(),
        )
        .unwrap();
        let hard: BTreeMap<String, String> = [
            ("memory.available".to_string(), "100Mi".to_string()),
            ("nodefs.available".into(), "10%".into()),
        ]
        .into();
        let a = compute(&cap, &kube, &system, &hard, None).unwrap();
        assert_eq!(a.allocatable["cpu"], 1900);
        assert_eq!(a.allocatable["memory"], (8 << 30) - (612 << 20));
        assert_eq!(
            a.allocatable["ephemeral-storage"],
            (100i64 << 30) - (10i64 << 30)
        );
        assert_eq!(a.allocatable["pods"], 110);
        // kubepods: without the eviction threshold.
        assert_eq!(a.pods_limits["memory"], (8 << 30) - (512 << 20));
        // reservedSystemCPUs replaces the CPU reservation.
        let b = compute(&cap, &kube, &system, &hard, Some(1)).unwrap();
        assert_eq!(b.allocatable["cpu"], 1000);
        assert_eq!(to_quantity("cpu", 1900).0, "1900m");
        assert_eq!(to_quantity("cpu", 1000).0, "1");
        assert_eq!(to_quantity("memory", 2048).0, "2Ki");
        assert_eq!(to_quantity("pods", 110).0, "110");
        assert!(
            parse_reserved(
                "kubeReserved",
                &[("gpu".to_string(), "1".to_string())].into()
            )
            .is_err()
        );
        assert!(
            parse_reserved(
                "kubeReserved",
                &[("cpu".to_string(), "lots".to_string())].into()
            )
            .is_err()
        );
    }
}
