//! The pod's QoS class (`GetPodQOS`).

use super::*;

/// A pod's quality-of-service class (`status.qosClass`), from [`qos_class`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QosClass {
    /// Every container has equal cpu and memory requests and limits.
    Guaranteed,
    /// Some requests or limits, not `Guaranteed`.
    Burstable,
    /// No cpu or memory requests or limits at all.
    BestEffort,
}

impl QosClass {
    /// The API's spelling: `Guaranteed`, `Burstable`, `BestEffort`.
    pub const fn as_str(self) -> &'static str {
        match self {
            QosClass::Guaranteed => "Guaranteed",
            QosClass::Burstable => "Burstable",
            QosClass::BestEffort => "BestEffort",
        }
    }
}

impl std::fmt::Display for QosClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

pub(super) fn quantity_nanos(q: &Quantity) -> Option<i128> {
    crate::quantity::parse_nanos(&q.0)
}

/// The pod's QoS class (`GetPodQOS`): `Guaranteed`, `Burstable` or `BestEffort`, from the cpu and
/// memory requests and limits of all containers (init containers included). A missing request
/// defaults to the limit, as API defaulting does.
pub fn qos_class(pod: &Pod) -> QosClass {
    let mut requests: BTreeMap<&str, i128> = BTreeMap::new();
    let mut limits: BTreeMap<&str, i128> = BTreeMap::new();
    let mut guaranteed = true;
    let all = podutil::init_containers(pod)
        .iter()
        .chain(podutil::containers(pod));
    for c in all {
        let res = c.resources.as_ref();
        let lim = res.and_then(|r| r.limits.as_ref());
        let req = res.and_then(|r| r.requests.as_ref());
        let mut found_limits = 0;
        for name in ["cpu", "memory"] {
            let l = lim.and_then(|m| m.get(name)).and_then(quantity_nanos);
            let r = req.and_then(|m| m.get(name)).and_then(quantity_nanos).or(l);
            if let Some(r) = r.filter(|r| *r > 0) {
                *requests.entry(name).or_insert(0) += r;
            }
            if let Some(l) = l.filter(|l| *l > 0) {
                *limits.entry(name).or_insert(0) += l;
                found_limits += 1;
            }
        }
        if found_limits < 2 {
            guaranteed = false;
        }
    }
    if requests.is_empty() && limits.is_empty() {
        return QosClass::BestEffort;
    }
    if guaranteed
        && requests.iter().all(|(k, v)| limits.get(k) == Some(v))
        && requests.len() == limits.len()
    {
        return QosClass::Guaranteed;
    }
    QosClass::Burstable
}
