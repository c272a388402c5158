//! The pod resources seam and the resource arithmetic the kubelet applies to a pod: its QoS
//! class ([`qos_class`]), its total requests and limits ([`pod_requests`], [`pod_limit`]), and
//! a container's Linux resources ([`container_resources`]).
//!
//! A node resource manager (the `kubelet-cm` crate) provides a [`PodResourceManager`] as a
//! [service](crate::Services): the engine asks it for each pod's cgroup before it creates the
//! pod's sandbox and for each container's Linux resources before it creates the container.
//! Without one, the engine places pods nowhere in particular (an empty cgroup parent: the
//! runtime decides) and passes each container's own requests and limits.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::pod as podutil;
use crate::quantity::{self, QuantityError};
use crate::runtime::LinuxResources;

/// CPU shares per CPU (`SharesPerCPU`).
pub const SHARES_PER_CPU: i64 = 1024;
/// The smallest CPU shares value (`MinShares`): BestEffort pods and containers get it.
pub const MIN_SHARES: i64 = 2;
/// The largest CPU shares value (`MaxShares`).
pub const MAX_SHARES: i64 = 262_144;
/// The CFS period the kubelet uses, in microseconds (`QuotaPeriod`, 100 ms).
pub const QUOTA_PERIOD_US: i64 = 100_000;
/// The smallest CFS quota, in microseconds (`MinQuotaPeriod`).
pub const MIN_QUOTA_US: i64 = 1_000;

/// A pod's quality-of-service class (`status.qosClass`), from [`qos_class`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
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

fn quantity_nanos(q: &Quantity) -> Option<i128> {
    quantity::parse_nanos(&q.0)
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

/// An amount of a resource in its canonical integer unit: millicores for `cpu`, bytes for
/// `memory`, `ephemeral-storage` and `hugepages-*`, a count for everything else.
pub fn canonical_amount(resource: &str, q: &Quantity) -> Result<i64, QuantityError> {
    if resource == "cpu" {
        quantity::parse_milli(&q.0)
    } else {
        quantity::parse_bytes(&q.0)
    }
}

/// A container's requests in canonical units ([`canonical_amount`]); a resource with a limit
/// but no request takes the limit, as API defaulting does.
pub fn container_requests(c: &Container) -> Result<BTreeMap<String, i64>, QuantityError> {
    let mut out = BTreeMap::new();
    let r = c.resources.as_ref();
    for (name, q) in r.and_then(|r| r.limits.as_ref()).into_iter().flatten() {
        out.insert(name.clone(), canonical_amount(name, q)?);
    }
    for (name, q) in r.and_then(|r| r.requests.as_ref()).into_iter().flatten() {
        out.insert(name.clone(), canonical_amount(name, q)?);
    }
    Ok(out)
}

/// A container's limits in canonical units ([`canonical_amount`]).
pub fn container_limits(c: &Container) -> Result<BTreeMap<String, i64>, QuantityError> {
    let mut out = BTreeMap::new();
    let r = c.resources.as_ref();
    for (name, q) in r.and_then(|r| r.limits.as_ref()).into_iter().flatten() {
        out.insert(name.clone(), canonical_amount(name, q)?);
    }
    Ok(out)
}

fn overhead(pod: &Pod) -> Result<BTreeMap<String, i64>, QuantityError> {
    let mut out = BTreeMap::new();
    for (name, q) in pod
        .spec
        .as_ref()
        .and_then(|s| s.overhead.as_ref())
        .into_iter()
        .flatten()
    {
        out.insert(name.clone(), canonical_amount(name, q)?);
    }
    Ok(out)
}

/// The pod's requests as the kubelet's admission and the scheduler count them
/// (`resource.PodRequests`): per resource, the sum of the regular containers and the sidecars,
/// at least any init container's request plus the sidecars started before it, plus
/// `spec.overhead` (the RuntimeClass's overhead). Canonical units ([`canonical_amount`]).
pub fn pod_requests(pod: &Pod) -> Result<BTreeMap<String, i64>, QuantityError> {
    let per = |cs: &[Container]| -> Result<Vec<BTreeMap<String, i64>>, QuantityError> {
        cs.iter().map(container_requests).collect()
    };
    let apps = per(podutil::containers(pod))?;
    let inits = per(podutil::init_containers(pod))?;
    let mut names: Vec<&String> = apps.iter().chain(&inits).flat_map(|m| m.keys()).collect();
    crate::sort::by(&mut names, Ord::cmp);
    names.dedup();
    let mut out = BTreeMap::new();
    for name in names {
        let amount = |m: &BTreeMap<String, i64>| m.get(name).copied().unwrap_or(0);
        let sum: i64 = apps.iter().map(amount).fold(0, i64::saturating_add);
        let mut sidecars = 0i64;
        let mut init_max = 0i64;
        for (c, m) in podutil::init_containers(pod).iter().zip(&inits) {
            let v = amount(m);
            if podutil::is_sidecar(c) {
                sidecars = sidecars.saturating_add(v);
                init_max = init_max.max(sidecars);
            } else {
                init_max = init_max.max(sidecars.saturating_add(v));
            }
        }
        let total = sum.saturating_add(sidecars).max(init_max);
        if total > 0 {
            out.insert(name.clone(), total);
        }
    }
    for (name, v) in overhead(pod)? {
        let e = out.entry(name).or_insert(0);
        *e = e.saturating_add(v);
    }
    Ok(out)
}

/// The pod's limit of `resource` (`resource.PodLimits`), aggregated as
/// [`pod_requests`] (overhead included); `None` when some container sets no limit for it (the
/// pod is then unlimited in that resource).
pub fn pod_limit(pod: &Pod, resource: &str) -> Result<Option<i64>, QuantityError> {
    let bad = std::cell::RefCell::new(None);
    let total = podutil::aggregate_resource(pod, |c| {
        match c
            .resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get(resource))
        {
            Some(q) => match canonical_amount(resource, q) {
                Ok(v) => Some(v),
                Err(e) => {
                    *bad.borrow_mut() = Some(e);
                    None
                }
            },
            None => None,
        }
    });
    if let Some(e) = bad.into_inner() {
        return Err(e);
    }
    let extra = overhead(pod)?.get(resource).copied().unwrap_or(0);
    Ok(total.map(|t| t.saturating_add(extra)))
}

/// CPU shares for `milli` millicores (`MilliCPUToShares`): [`MIN_SHARES`] for 0, else
/// `milli × 1024 / 1000` clamped to [`MIN_SHARES`, `MAX_SHARES`].
pub fn milli_cpu_to_shares(milli: i64) -> i64 {
    if milli <= 0 {
        return MIN_SHARES;
    }
    (milli.saturating_mul(SHARES_PER_CPU) / 1000).clamp(MIN_SHARES, MAX_SHARES)
}

/// CFS quota in microseconds for `milli` millicores at `period` µs (`MilliCPUToQuota`): 0
/// (unset) for 0, else at least [`MIN_QUOTA_US`].
pub fn milli_cpu_to_quota(milli: i64, period: i64) -> i64 {
    if milli <= 0 {
        return 0;
    }
    (milli.saturating_mul(period) / 1000).max(MIN_QUOTA_US)
}

/// The Linux resources of container `c` from its own requests and limits, as the kubelet's
/// `generateLinuxContainerResources`: shares from the cpu request (the limit when no request),
/// quota at a 100 ms period from the cpu limit, the memory limit. `None` when the container
/// sets none of them.
pub fn container_resources(c: &Container) -> Result<Option<LinuxResources>, QuantityError> {
    let Some(r) = &c.resources else {
        return Ok(None);
    };
    fn get<'a>(m: Option<&'a BTreeMap<String, Quantity>>, k: &str) -> Option<&'a Quantity> {
        m.and_then(|m| m.get(k))
    }
    let limits = r.limits.as_ref();
    let requests = r.requests.as_ref();
    let mut out = LinuxResources::default();
    if let Some(q) = get(requests, "cpu").or_else(|| get(limits, "cpu")) {
        out.cpu_shares = milli_cpu_to_shares(quantity::parse_milli(&q.0)?);
    }
    if let Some(q) = get(limits, "cpu") {
        out.cpu_period = QUOTA_PERIOD_US;
        out.cpu_quota = milli_cpu_to_quota(quantity::parse_milli(&q.0)?, QUOTA_PERIOD_US);
    }
    if let Some(q) = get(limits, "memory") {
        out.memory_limit_in_bytes = quantity::parse_bytes(&q.0)?;
    }
    if out == LinuxResources::default() {
        return Ok(None);
    }
    Ok(Some(out))
}

/// What the engine asks a node resource manager about each pod, provided as a
/// [service](crate::Services) (`Arc<dyn PodResourceManager>`) by one plugin.
///
/// Called from pod workers, concurrently for different pods; must not block for long (cgroup
/// file writes are fine).
pub trait PodResourceManager: Send + Sync + 'static {
    /// Make sure the cgroup of `pod` exists with its values, before the pod's sandbox is
    /// created (the kubelet's `EnsureExists`); returns the cgroup parent to hand the runtime
    /// in [`PodSandboxConfig::cgroup_parent`](crate::runtime::PodSandboxConfig) (empty: no pod
    /// cgroup, the runtime decides). An error fails this sync of the pod (event
    /// `FailedCreatePodContainer`); the pod is retried.
    fn prepare_pod(&self, pod: &Pod) -> crate::Result<String>;

    /// The Linux resources container `container` of `pod` is created with, given `from_spec`
    /// (what [`container_resources`] made of its own requests and limits): a manager adds the
    /// `oom_score_adj` and the cpuset of its policies.
    fn container_resources(
        &self,
        pod: &Pod,
        container: &Container,
        from_spec: Option<LinuxResources>,
    ) -> Option<LinuxResources>;

    /// Pod `pod` is gone: its containers and sandboxes are removed (the engine's cleanup of a
    /// deleted pod). A manager removes the pod's cgroup here. The default does nothing.
    fn pod_removed(&self, pod: &Pod) {
        let _ = pod;
    }
}

fn _assert_manager_dyn(_: &dyn PodResourceManager) {}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};

    fn c(name: &str, req: &[(&str, &str)], lim: &[(&str, &str)]) -> Container {
        let map = |kv: &[(&str, &str)]| {
            (!kv.is_empty()).then(|| {
                kv.iter()
                    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                    .collect()
            })
        };
        Container {
            name: name.into(),
            resources: Some(ResourceRequirements {
                requests: map(req),
                limits: map(lim),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pod(apps: Vec<Container>, inits: Vec<Container>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers: apps,
                init_containers: Some(inits),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn requests_take_the_larger_of_init_and_apps_with_sidecars_and_overhead() {
        let mut sidecar = c("s", &[("cpu", "100m")], &[]);
        sidecar.restart_policy = Some("Always".into());
        let mut p = pod(
            vec![
                c("a", &[("cpu", "200m"), ("memory", "64Mi")], &[]),
                c("b", &[], &[("memory", "32Mi")]),
            ],
            vec![c("i", &[("cpu", "1")], &[]), sidecar],
        );
        let r = pod_requests(&p).unwrap();
        // apps 200m + sidecar 100m = 300m < init 1000m.
        assert_eq!(r["cpu"], 1000);
        assert_eq!(r["memory"], 96 << 20);
        p.spec.as_mut().unwrap().overhead = Some(BTreeMap::from([(
            "cpu".to_string(),
            Quantity("250m".into()),
        )]));
        assert_eq!(pod_requests(&p).unwrap()["cpu"], 1250);
        // Memory: not every container has a limit.
        assert_eq!(pod_limit(&p, "memory").unwrap(), None);
        let q = pod(vec![c("a", &[], &[("memory", "1Gi")])], vec![]);
        assert_eq!(pod_limit(&q, "memory").unwrap(), Some(1 << 30));
        let bad = pod(vec![c("a", &[("cpu", "lots")], &[])], vec![]);
        assert!(pod_requests(&bad).is_err());
    }

    #[test]
    fn shares_and_quota_follow_the_kubelet_constants() {
        assert_eq!(milli_cpu_to_shares(0), 2);
        assert_eq!(milli_cpu_to_shares(1), 2);
        assert_eq!(milli_cpu_to_shares(1000), 1024);
        assert_eq!(milli_cpu_to_shares(10_000_000), MAX_SHARES);
        assert_eq!(milli_cpu_to_quota(0, QUOTA_PERIOD_US), 0);
        assert_eq!(milli_cpu_to_quota(5, QUOTA_PERIOD_US), MIN_QUOTA_US);
        assert_eq!(milli_cpu_to_quota(250, QUOTA_PERIOD_US), 25_000);
        let r = container_resources(&c("a", &[("cpu", "250m")], &[("memory", "64Mi")]))
            .unwrap()
            .unwrap();
        assert_eq!(
            (r.cpu_shares, r.cpu_quota, r.memory_limit_in_bytes),
            (256, 0, 64 << 20)
        );
        assert_eq!(container_resources(&c("a", &[], &[])).unwrap(), None);
    }
}
