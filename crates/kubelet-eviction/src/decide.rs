//! The kubelet's eviction decisions as pure functions: thresholds met (with hysteresis), grace
//! periods, node conditions with the transition period, ranking, critical pods, the grace
//! override and the eviction message. No I/O; time is an argument.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use tokio::time::Instant;

use crate::config::{
    EvictionConfig, IMMEDIATE_EVICTION_GRACE_PERIOD_SECONDS, QuantityFormat, Threshold,
    format_quantity,
};
use crate::signal::{NodeCondition, Resource, Signal};
use crate::stats::{Observations, PodUsage};

use kubelet_api::pod::{SYSTEM_CRITICAL_PRIORITY, priority};

/// Thresholds met by `observations` (`thresholdsMet`); with `enforce_min_reclaim` a threshold
/// stays met until available exceeds threshold + minimum reclaim. Unobserved signals never meet.
pub fn thresholds_met(
    thresholds: &[Threshold],
    observations: &Observations,
    enforce_min_reclaim: bool,
) -> Vec<Threshold> {
    thresholds
        .iter()
        .filter(|t| {
            let Some(o) = observations.get(&t.signal) else {
                return false;
            };
            let mut q = t.value.quantity(o.capacity);
            if enforce_min_reclaim && let Some(r) = &t.min_reclaim {
                q = q.saturating_add(r.quantity(o.capacity));
            }
            q > o.available
        })
        .cloned()
        .collect()
}

/// What one observation round decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Round {
    /// Thresholds met now, grace periods ignored (with hysteresis).
    pub met: Vec<Threshold>,
    /// Thresholds that drive eviction: met, grace period elapsed, stats newer than last round.
    pub to_reclaim: Vec<Threshold>,
    /// The node's pressure conditions after the transition period.
    pub conditions: BTreeSet<NodeCondition>,
    /// The earliest moment a met soft threshold's grace period ends, if one is still waiting.
    pub next_grace_deadline: Option<Instant>,
}

/// The state the kubelet's manager carries between rounds (`managerImpl` fields).
#[derive(Debug, Clone, Default)]
pub struct EvictionState {
    thresholds_met: Vec<Threshold>,
    first_observed: Vec<(Threshold, Instant)>,
    conditions_last_observed: BTreeMap<NodeCondition, Instant>,
    last_observations: Observations,
}

impl EvictionState {
    /// A fresh state (no pressure seen).
    pub fn new() -> Self {
        Self::default()
    }

    /// One round of `synchronize` steps 3–5 over `observations` taken at `now`.
    pub fn observe(
        &mut self,
        config: &EvictionConfig,
        observations: &Observations,
        now: Instant,
    ) -> Round {
        let mut met = thresholds_met(&config.thresholds, observations, false);
        if !self.thresholds_met.is_empty() {
            for t in thresholds_met(&self.thresholds_met, observations, true) {
                if !met.iter().any(|m| m.same(&t)) {
                    met.push(t);
                }
            }
        }
        let first: Vec<(Threshold, Instant)> = met
            .iter()
            .map(|t| {
                let at = self
                    .first_observed
                    .iter()
                    .find(|(o, _)| o.same(t))
                    .map_or(now, |(_, at)| *at);
                (t.clone(), at)
            })
            .collect();
        for t in &met {
            self.conditions_last_observed
                .insert(t.signal.node_condition(), now);
        }
        let period = config.pressure_transition_period;
        self.conditions_last_observed
            .retain(|_, at| now.saturating_duration_since(*at) < period);
        let conditions: BTreeSet<NodeCondition> =
            self.conditions_last_observed.keys().copied().collect();
        let mut next_grace_deadline: Option<Instant> = None;
        let graced: Vec<Threshold> = first
            .iter()
            .filter(|(t, at)| {
                let elapsed = now.saturating_duration_since(*at) >= t.grace_period;
                if !elapsed {
                    let d = *at + t.grace_period;
                    next_grace_deadline = Some(next_grace_deadline.map_or(d, |n| n.min(d)));
                }
                elapsed
            })
            .map(|(t, _)| t.clone())
            .collect();
        let to_reclaim = graced
            .into_iter()
            .filter(|t| {
                match (
                    observations.get(&t.signal),
                    self.last_observations.get(&t.signal),
                ) {
                    (None, _) => false,
                    (Some(_), None) => true,
                    (Some(o), Some(last)) => o.time > last.time,
                }
            })
            .collect();
        self.first_observed = first;
        self.thresholds_met = met.clone();
        self.last_observations = observations.clone();
        Round {
            met,
            to_reclaim,
            conditions,
            next_grace_deadline,
        }
    }

    /// The conditions as of the last round.
    pub fn conditions(&self) -> BTreeSet<NodeCondition> {
        self.conditions_last_observed.keys().copied().collect()
    }
}

/// The threshold to act on and its resource (`getReclaimableThreshold` after sorting memory
/// first).
pub fn reclaimable_threshold(thresholds: &[Threshold]) -> Option<&Threshold> {
    thresholds
        .iter()
        .find(|t| t.signal.is_memory())
        .or_else(|| thresholds.first())
}

/// True when `pod` is critical and never evicted: static or mirror (when
/// `static_pods_are_critical`, the kubelet's rule) or priority ≥ [`SYSTEM_CRITICAL_PRIORITY`].
pub fn is_critical(pod: &Pod, static_pods_are_critical: bool) -> bool {
    if static_pods_are_critical
        && (kubelet_api::pod::is_static(pod) || kubelet_api::pod::is_mirror(pod))
    {
        return true;
    }
    priority(pod) >= SYSTEM_CRITICAL_PRIORITY
}

/// The grace period override for evicting `pod` because of `threshold`: 1 s for hard
/// thresholds, else `min(evictionMaxPodGracePeriod, terminationGracePeriodSeconds)`.
pub fn eviction_grace_period(
    threshold: &Threshold,
    pod: &Pod,
    max_pod_grace_period_seconds: i64,
) -> i64 {
    if threshold.is_hard() {
        return IMMEDIATE_EVICTION_GRACE_PERIOD_SECONDS;
    }
    match pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
    {
        Some(tgps) => max_pod_grace_period_seconds.min(tgps),
        None => max_pod_grace_period_seconds,
    }
}

fn container_request(c: &Container, resource: &str) -> i64 {
    c.resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|m| m.get(resource))
        .and_then(|q| kubelet_api::quantity::parse_bytes(&q.0).ok())
        .unwrap_or(0)
}

/// The pod's request of `resource` (`PodRequests`): pod-level requests when set, else the sum
/// of regular containers and sidecars, at least any init container's request plus the sidecars
/// started before it; plus overhead.
pub fn pod_request(pod: &Pod, resource: &str) -> i64 {
    let Some(spec) = pod.spec.as_ref() else {
        return 0;
    };
    let overhead = spec
        .overhead
        .as_ref()
        .and_then(|m| m.get(resource))
        .and_then(|q| kubelet_api::quantity::parse_bytes(&q.0).ok())
        .unwrap_or(0);
    if let Some(v) = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|m| m.get(resource))
        .and_then(|q| kubelet_api::quantity::parse_bytes(&q.0).ok())
    {
        return v + overhead;
    }
    let total = kubelet_api::pod::aggregate_resource(pod, |c| Some(container_request(c, resource)))
        .unwrap_or(0);
    total + overhead
}

fn usage_for(resource: Resource, u: &PodUsage) -> Option<i64> {
    let v = match resource {
        Resource::Memory => u.memory(),
        Resource::EphemeralStorage => u.disk(),
        Resource::Inodes => u.inodes,
        Resource::Pids => u.processes(),
    }?;
    Some(i64::try_from(v).unwrap_or(i64::MAX))
}

fn request_for(resource: Resource, pod: &Pod) -> i64 {
    match resource {
        Resource::Memory => pod_request(pod, "memory"),
        Resource::EphemeralStorage => pod_request(pod, "ephemeral-storage"),
        Resource::Inodes | Resource::Pids => 0,
    }
}

/// Order `pods` for eviction under pressure on `resource` (`rankMemoryPressure`,
/// `rankPIDPressure`, `rankDiskPressureFunc`): pods without stats first; for memory and disk,
/// usage above requests first, then lower priority, then larger usage minus request; for PIDs,
/// lower priority, then more processes. The sort is stable.
pub fn rank<'a, T>(
    resource: Resource,
    pods: &mut [T],
    pod_of: impl Fn(&T) -> &'a Pod,
    usage_of: impl Fn(&T) -> Option<&'a PodUsage>,
) {
    kubelet_api::sort::by(pods, |a, b| {
        let (pa, pb) = (pod_of(a), pod_of(b));
        let ua = usage_of(a).and_then(|u| usage_for(resource, u));
        let ub = usage_of(b).and_then(|u| usage_for(resource, u));
        // Pods without stats first (false sorts before true).
        let no_stats = ua.is_some().cmp(&ub.is_some());
        if no_stats.is_ne() {
            return no_stats;
        }
        let prio = priority(pa).cmp(&priority(pb));
        if resource == Resource::Pids {
            return prio.then_with(|| ub.unwrap_or(0).cmp(&ua.unwrap_or(0)));
        }
        let (ra, rb) = (request_for(resource, pa), request_for(resource, pb));
        let (Some(ua), Some(ub)) = (ua, ub) else {
            return prio;
        };
        let exceeds = (ub > rb).cmp(&(ua > ra)); // exceeding first
        exceeds.then(prio).then_with(|| (ub - rb).cmp(&(ua - ra))) // larger usage - request first
    });
}

/// The eviction message and annotations (`evictionMessage`): `The node was low on resource:
/// {res}. Threshold quantity: {q}, available: {a}. ` plus one sentence per container using more
/// than its request.
///
/// The annotations go on the `Evicted` event, with the kubelet's keys and formats:
/// `offending_containers` (the names of the containers using more than their request, joined
/// with `,`), `offending_containers_usage` (their usage as quantities, same order) and
/// `starved_resource` (`memory`, `ephemeral-storage`, …). As in the kubelet, a pod without
/// usage statistics gets the message only and no annotations.
pub fn eviction_message(
    resource: Resource,
    pod: &Pod,
    usage: Option<&PodUsage>,
    thresholds: &[Threshold],
    observations: &Observations,
) -> (String, BTreeMap<String, String>) {
    let mut annotations = BTreeMap::new();
    let mut message = format!("The node was low on resource: {resource}. ");
    if let Some(t) = thresholds.iter().find(|t| t.signal.resource() == resource)
        && let Some(o) = observations.get(&t.signal)
    {
        let available = format_quantity(o.available, QuantityFormat::BinarySi);
        message += &format!(
            "Threshold quantity: {}, available: {available}. ",
            t.value.display(o.capacity)
        );
    }
    let mut names = Vec::new();
    let mut usages = Vec::new();
    let Some(u) = usage else {
        return (message, annotations);
    };
    for cu in &u.containers {
        let Some(c) = kubelet_api::pod::containers(pod)
            .iter()
            .find(|c| c.name == cu.name)
        else {
            continue;
        };
        let used = match resource {
            Resource::Memory => cu.memory_working_set,
            Resource::EphemeralStorage => cu.disk_bytes,
            _ => None,
        };
        let Some(used) = used.map(|v| i64::try_from(v).unwrap_or(i64::MAX)) else {
            continue;
        };
        let req_raw = c
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|m| m.get(resource.as_str()))
            .map(|q| q.0.clone());
        let req = req_raw
            .as_deref()
            .and_then(|s| kubelet_api::quantity::parse_bytes(s).ok())
            .unwrap_or(0);
        if used > req {
            let req_fmt = match &req_raw {
                Some(s)
                    if ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
                        .iter()
                        .any(|x| s.ends_with(x)) =>
                {
                    format_quantity(req, QuantityFormat::BinarySi)
                }
                Some(_) => format_quantity(req, QuantityFormat::DecimalSi),
                None => "0".into(),
            };
            let used_fmt = format_quantity(used, QuantityFormat::BinarySi);
            message += &format!(
                "Container {} was using {used_fmt}, request is {req_fmt}, has larger consumption of {resource}. ",
                c.name
            );
            names.push(c.name.clone());
            usages.push(used_fmt);
        }
    }
    annotations.insert("offending_containers".into(), names.join(","));
    annotations.insert("offending_containers_usage".into(), usages.join(","));
    annotations.insert("starved_resource".into(), resource.as_str().into());
    (message, annotations)
}

/// A local ephemeral-storage limit a pod exceeded (`localStorageEviction`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalStorageViolation {
    /// The pseudo-signal counted in `kubelet_evictions`: `emptydirfs.limit`,
    /// `ephemeralpodfs.limit` or `ephemeralcontainerfs.limit`.
    pub signal: &'static str,
    /// The kubelet's message.
    pub message: String,
}

fn quantity_string(q: &str) -> String {
    let binary = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
        .iter()
        .any(|x| q.ends_with(x));
    match kubelet_api::quantity::parse_bytes(q) {
        Ok(v) if binary => format_quantity(v, QuantityFormat::BinarySi),
        Ok(v) => format_quantity(v, QuantityFormat::DecimalSi),
        Err(_) => q.to_string(),
    }
}

fn container_limit(c: &Container, resource: &str) -> Option<(i64, String)> {
    let q = c.resources.as_ref()?.limits.as_ref()?.get(resource)?;
    let v = kubelet_api::quantity::parse_bytes(&q.0).ok()?;
    Some((v, q.0.clone()))
}

/// Whether `pod` has a local-storage limit [`local_storage_violation`] can find exceeded: an
/// emptyDir `sizeLimit` or a container's `ephemeral-storage` limit. Pods without one need no
/// disk usage measured for local-storage eviction.
pub fn has_local_storage_limits(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    spec.volumes
        .iter()
        .flatten()
        .any(|v| v.empty_dir.as_ref().is_some_and(|e| e.size_limit.is_some()))
        || spec
            .containers
            .iter()
            .any(|c| container_limit(c, "ephemeral-storage").is_some())
}

/// The first local-storage limit `pod` exceeds, checked as the kubelet does: emptyDir
/// `sizeLimit`s, then the pod's total against the sum of its containers' ephemeral-storage
/// limits, then each container's logs (and writable layer) against its own limit.
pub fn local_storage_violation(pod: &Pod, usage: &PodUsage) -> Option<LocalStorageViolation> {
    let spec = pod.spec.as_ref()?;
    for v in spec.volumes.iter().flatten() {
        let Some(limit) = v.empty_dir.as_ref().and_then(|e| e.size_limit.as_ref()) else {
            continue;
        };
        let Ok(limit_bytes) = kubelet_api::quantity::parse_bytes(&limit.0) else {
            continue;
        };
        if let Some(&used) = usage.volumes.get(&v.name)
            && limit_bytes > 0
            && used > limit_bytes as u64
        {
            return Some(LocalStorageViolation {
                signal: "emptydirfs.limit",
                message: format!(
                    "Usage of EmptyDir volume {:?} exceeds the limit {:?}. ",
                    v.name,
                    quantity_string(&limit.0)
                ),
            });
        }
    }
    let limits: Vec<i64> = spec
        .containers
        .iter()
        .filter_map(|c| container_limit(c, "ephemeral-storage").map(|(v, _)| v))
        .collect();
    if !limits.is_empty()
        && let Some(total) = usage.disk()
    {
        let limit: i64 = limits.iter().sum();
        if total > limit as u64 {
            return Some(LocalStorageViolation {
                signal: "ephemeralpodfs.limit",
                message: format!(
                    "Pod ephemeral local storage usage exceeds the total limit of containers {}. ",
                    format_quantity(limit, QuantityFormat::BinarySi)
                ),
            });
        }
    }
    for cu in &usage.containers {
        let Some(c) = spec.containers.iter().find(|c| c.name == cu.name) else {
            continue;
        };
        if let (Some((limit, raw)), Some(used)) =
            (container_limit(c, "ephemeral-storage"), cu.disk_bytes)
            && limit != 0
            && used > limit as u64
        {
            return Some(LocalStorageViolation {
                signal: "ephemeralcontainerfs.limit",
                message: format!(
                    "Container {} exceeded its local ephemeral storage limit {:?}. ",
                    c.name,
                    quantity_string(&raw)
                ),
            });
        }
    }
    None
}

/// Sort thresholds memory first (`byEvictionPriority`), keeping the order otherwise.
pub fn sort_by_eviction_priority(thresholds: &mut [Threshold]) {
    kubelet_api::sort::by_key(thresholds, |t| !t.signal.is_memory());
}

/// Signals whose node-level reclaim may help (`buildSignalToNodeReclaimFuncs`): disk signals.
pub fn has_node_reclaim(signal: Signal) -> bool {
    !matches!(signal.resource(), Resource::Memory | Resource::Pids)
}

/// Time left before `deadline`, zero when past.
pub fn until(deadline: Instant, now: Instant) -> Duration {
    deadline.saturating_duration_since(now)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::config::{EvictionSettings, ThresholdValue};
    use crate::stats::{ContainerUsage, SignalObservation};
    use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use proptest::prelude::*;

    const MI: i64 = 1 << 20;

    fn obs(signal: Signal, available: i64, capacity: i64, time: Instant) -> Observations {
        Observations::from([(
            signal,
            SignalObservation {
                available,
                capacity,
                time,
            },
        )])
    }

    fn pod(name: &str, prio: Option<i32>, mem_request: Option<&str>) -> Pod {
        let mut c = Container {
            name: "app".into(),
            ..Default::default()
        };
        if let Some(r) = mem_request {
            c.resources = Some(ResourceRequirements {
                requests: Some([("memory".to_string(), Quantity(r.into()))].into()),
                ..Default::default()
            });
        }
        let mut p = Pod {
            spec: Some(PodSpec {
                containers: vec![c],
                priority: prio,
                ..Default::default()
            }),
            ..Default::default()
        };
        p.metadata.name = Some(name.into());
        p.metadata.uid = Some(format!("uid-{name}"));
        p
    }

    fn mem_usage(bytes: u64) -> PodUsage {
        PodUsage {
            containers: vec![ContainerUsage {
                name: "app".into(),
                memory_working_set: Some(bytes),
                processes: Some(1),
                disk_bytes: None,
            }],
            ..Default::default()
        }
    }

    fn config(
        hard: &[(&str, &str)],
        soft: &[(&str, &str, &str)],
        reclaim: &[(&str, &str)],
    ) -> EvictionConfig {
        let s = EvictionSettings {
            hard: Some(
                hard.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            soft: soft
                .iter()
                .map(|(k, v, _)| (k.to_string(), v.to_string()))
                .collect(),
            soft_grace_period: soft
                .iter()
                .map(|(k, _, g)| (k.to_string(), g.to_string()))
                .collect(),
            minimum_reclaim: reclaim
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        };
        EvictionConfig::from_settings(&s).unwrap()
    }

    #[test]
    fn thresholds_are_met_strictly_below_and_percentages_use_capacity() {
        let t0 = Instant::now();
        let c = config(
            &[("memory.available", "100Mi"), ("nodefs.available", "10%")],
            &[],
            &[],
        );
        let cases = [
            (Signal::MemoryAvailable, 100 * MI, 1000 * MI, false),
            (Signal::MemoryAvailable, 100 * MI - 1, 1000 * MI, true),
            (Signal::NodeFsAvailable, 100, 1000, false),
            (Signal::NodeFsAvailable, 99, 1000, true),
            (Signal::PidAvailable, 0, 1000, false),
        ];
        for (sig, avail, cap, want) in cases {
            let met = thresholds_met(&c.thresholds, &obs(sig, avail, cap, t0), false);
            assert_eq!(!met.is_empty(), want, "{sig} {avail}/{cap}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn minimum_reclaim_keeps_a_threshold_met_until_cleared_with_margin() {
        let c = config(
            &[("memory.available", "100Mi")],
            &[],
            &[("memory.available", "50Mi")],
        );
        let mut st = EvictionState::new();
        let cap = 1000 * MI;
        let r = st.observe(
            &c,
            &obs(Signal::MemoryAvailable, 90 * MI, cap, Instant::now()),
            Instant::now(),
        );
        assert_eq!(r.met.len(), 1);
        tokio::time::advance(Duration::from_secs(1)).await;
        // Above the threshold, below threshold + min reclaim: still met.
        let r = st.observe(
            &c,
            &obs(Signal::MemoryAvailable, 120 * MI, cap, Instant::now()),
            Instant::now(),
        );
        assert_eq!(r.met.len(), 1);
        assert_eq!(r.to_reclaim.len(), 1);
        tokio::time::advance(Duration::from_secs(1)).await;
        let r = st.observe(
            &c,
            &obs(Signal::MemoryAvailable, 151 * MI, cap, Instant::now()),
            Instant::now(),
        );
        assert!(r.met.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn soft_thresholds_wait_for_their_grace_period() {
        let c = config(&[], &[("memory.available", "300Mi", "30s")], &[]);
        let mut st = EvictionState::new();
        let cap = 1000 * MI;
        let start = Instant::now();
        let r = st.observe(
            &c,
            &obs(Signal::MemoryAvailable, 200 * MI, cap, start),
            start,
        );
        assert_eq!(r.met.len(), 1);
        assert!(r.to_reclaim.is_empty(), "grace period not elapsed");
        assert_eq!(r.next_grace_deadline, Some(start + Duration::from_secs(30)));
        assert!(
            r.conditions.contains(&NodeCondition::MemoryPressure),
            "the condition is immediate"
        );
        tokio::time::advance(Duration::from_secs(29)).await;
        let now = Instant::now();
        let r = st.observe(&c, &obs(Signal::MemoryAvailable, 200 * MI, cap, now), now);
        assert!(r.to_reclaim.is_empty());
        tokio::time::advance(Duration::from_secs(1)).await;
        let now = Instant::now();
        let r = st.observe(&c, &obs(Signal::MemoryAvailable, 200 * MI, cap, now), now);
        assert_eq!(r.to_reclaim.len(), 1);
        // Clearing resets the clock.
        tokio::time::advance(Duration::from_secs(1)).await;
        let now = Instant::now();
        st.observe(&c, &obs(Signal::MemoryAvailable, 500 * MI, cap, now), now);
        tokio::time::advance(Duration::from_secs(1)).await;
        let now = Instant::now();
        let r = st.observe(&c, &obs(Signal::MemoryAvailable, 200 * MI, cap, now), now);
        assert!(
            r.to_reclaim.is_empty(),
            "grace starts again after the threshold cleared"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn pressure_conditions_persist_for_the_transition_period() {
        let c = config(
            &[("memory.available", "100Mi"), ("pid.available", "100")],
            &[],
            &[],
        );
        let mut st = EvictionState::new();
        let now = Instant::now();
        let mut o = obs(Signal::MemoryAvailable, 50 * MI, 1000 * MI, now);
        o.insert(
            Signal::PidAvailable,
            SignalObservation {
                available: 10,
                capacity: 1000,
                time: now,
            },
        );
        let r = st.observe(&c, &o, now);
        assert_eq!(
            r.conditions,
            BTreeSet::from([NodeCondition::MemoryPressure, NodeCondition::PidPressure])
        );
        for step in 1..=4 {
            tokio::time::advance(Duration::from_secs(60)).await;
            let now = Instant::now();
            let r = st.observe(
                &c,
                &obs(Signal::MemoryAvailable, 500 * MI, 1000 * MI, now),
                now,
            );
            assert!(r.met.is_empty());
            assert_eq!(r.conditions.len(), 2, "still reported after {step} min");
        }
        tokio::time::advance(Duration::from_secs(59)).await;
        let now = Instant::now();
        let r = st.observe(
            &c,
            &obs(Signal::MemoryAvailable, 500 * MI, 1000 * MI, now),
            now,
        );
        assert_eq!(r.conditions.len(), 2, "4m59s after the last observation");
        tokio::time::advance(Duration::from_secs(1)).await;
        let now = Instant::now();
        let r = st.observe(
            &c,
            &obs(Signal::MemoryAvailable, 500 * MI, 1000 * MI, now),
            now,
        );
        assert!(r.conditions.is_empty(), "cleared after 5 minutes");
    }

    #[tokio::test(start_paused = true)]
    async fn stale_stats_do_not_drive_a_second_eviction() {
        let c = config(&[("memory.available", "100Mi")], &[], &[]);
        let mut st = EvictionState::new();
        let t = Instant::now();
        let o = obs(Signal::MemoryAvailable, 50 * MI, 1000 * MI, t);
        assert_eq!(st.observe(&c, &o, t).to_reclaim.len(), 1);
        tokio::time::advance(Duration::from_secs(1)).await;
        let r = st.observe(&c, &o, Instant::now());
        assert_eq!(r.met.len(), 1);
        assert!(
            r.to_reclaim.is_empty(),
            "same observation time as last round"
        );
    }

    #[test]
    fn memory_ranking_follows_requests_priority_then_excess() {
        let pods = [
            (
                pod("guaranteed-low-use", Some(0), Some("500Mi")),
                Some(mem_usage(100 << 20)),
            ),
            (
                pod("besteffort-small", Some(0), None),
                Some(mem_usage(10 << 20)),
            ),
            (
                pod("burstable-over", Some(0), Some("100Mi")),
                Some(mem_usage(400 << 20)),
            ),
            (
                pod("over-high-prio", Some(1000), None),
                Some(mem_usage(900 << 20)),
            ),
            (pod("no-stats", Some(5000), None), None),
            (
                pod("under-low-prio", Some(-10), Some("1Gi")),
                Some(mem_usage(1 << 20)),
            ),
        ];
        let mut v: Vec<&(Pod, Option<PodUsage>)> = pods.iter().collect();
        rank(Resource::Memory, &mut v, |p| &p.0, |p| p.1.as_ref());
        let names: Vec<&str> = v.iter().map(|p| kubelet_api::pod::name(&p.0)).collect();
        assert_eq!(
            names,
            vec![
                "no-stats",
                "burstable-over",   // exceeds, prio 0, 300Mi over
                "besteffort-small", // exceeds, prio 0, 10Mi over
                "over-high-prio",   // exceeds, prio 1000
                "under-low-prio",   // within request, prio -10
                "guaranteed-low-use",
            ]
        );
    }

    #[test]
    fn pid_ranking_is_priority_then_process_count() {
        let usage = |n| PodUsage {
            containers: vec![ContainerUsage {
                name: "app".into(),
                processes: Some(n),
                ..Default::default()
            }],
            ..Default::default()
        };
        let pods = [
            (pod("few", Some(0), None), Some(usage(2))),
            (pod("many", Some(0), None), Some(usage(200))),
            (pod("many-important", Some(10), None), Some(usage(900))),
        ];
        let mut v: Vec<&(Pod, Option<PodUsage>)> = pods.iter().collect();
        rank(Resource::Pids, &mut v, |p| &p.0, |p| p.1.as_ref());
        let names: Vec<&str> = v.iter().map(|p| kubelet_api::pod::name(&p.0)).collect();
        assert_eq!(names, vec!["many", "few", "many-important"]);
    }

    #[test]
    fn critical_pods_are_static_mirror_or_system_priority() {
        let mut st = pod("static", None, None);
        st.metadata.annotations = Some(
            [(
                "kubernetes.io/config.source".to_string(),
                "file".to_string(),
            )]
            .into(),
        );
        assert!(is_critical(&st, true));
        assert!(
            !is_critical(&st, false),
            "policy switched off: priority decides"
        );
        let mut mirror = pod("mirror", None, None);
        mirror.metadata.annotations =
            Some([("kubernetes.io/config.mirror".to_string(), "x".to_string())].into());
        assert!(is_critical(&mirror, true));
        assert!(is_critical(
            &pod("sys", Some(SYSTEM_CRITICAL_PRIORITY), None),
            false
        ));
        assert!(!is_critical(
            &pod("high", Some(SYSTEM_CRITICAL_PRIORITY - 1), None),
            true
        ));
        let mut api = pod("api", None, None);
        api.metadata.annotations =
            Some([("kubernetes.io/config.source".to_string(), "api".to_string())].into());
        assert!(!is_critical(&api, true));
    }

    #[test]
    fn grace_override_is_one_second_for_hard_and_bounded_for_soft() {
        let hard = Threshold::hard(Signal::MemoryAvailable, ThresholdValue::Percentage(0.1));
        let soft = Threshold {
            grace_period: Duration::from_secs(30),
            ..hard.clone()
        };
        let mut p = pod("p", None, None);
        assert_eq!(eviction_grace_period(&hard, &p, 60), 1);
        assert_eq!(eviction_grace_period(&soft, &p, 0), 0);
        assert_eq!(eviction_grace_period(&soft, &p, 60), 60);
        p.spec.as_mut().unwrap().termination_grace_period_seconds = Some(10);
        assert_eq!(eviction_grace_period(&soft, &p, 60), 10);
    }

    #[test]
    fn requests_sum_containers_and_respect_init_containers() {
        let mut p = pod("p", None, Some("100Mi"));
        let spec = p.spec.as_mut().unwrap();
        let mut big_init = spec.containers[0].clone();
        big_init.name = "init".into();
        big_init.resources.as_mut().unwrap().requests =
            Some([("memory".to_string(), Quantity("1Gi".into()))].into());
        spec.init_containers = Some(vec![big_init]);
        assert_eq!(pod_request(&p, "memory"), 1 << 30);
        let mut sidecar = p.spec.as_ref().unwrap().containers[0].clone();
        sidecar.name = "side".into();
        sidecar.restart_policy = Some("Always".into());
        let spec = p.spec.as_mut().unwrap();
        spec.init_containers = Some(vec![sidecar]);
        assert_eq!(pod_request(&p, "memory"), 200 * MI);
        assert_eq!(pod_request(&p, "ephemeral-storage"), 0);
    }

    #[test]
    fn message_names_resource_threshold_and_offending_container() {
        let t = Instant::now();
        let c = config(&[("memory.available", "100Mi")], &[], &[]);
        let p = pod("hog", None, Some("64Mi"));
        let o = obs(Signal::MemoryAvailable, 80 * MI, 1000 * MI, t);
        let (msg, ann) = eviction_message(
            Resource::Memory,
            &p,
            Some(&mem_usage(300 << 20)),
            &c.thresholds,
            &o,
        );
        assert_eq!(
            msg,
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 80Mi. \
             Container app was using 300Mi, request is 64Mi, has larger consumption of memory. "
        );
        assert_eq!(ann["offending_containers"], "app");
        assert_eq!(ann["offending_containers_usage"], "300Mi");
        assert_eq!(ann["starved_resource"], "memory");
        let (msg, _) = eviction_message(
            Resource::Memory,
            &pod("be", None, None),
            Some(&mem_usage(5000)),
            &c.thresholds,
            &o,
        );
        assert!(
            msg.ends_with(
                "Container app was using 5000, request is 0, has larger consumption of memory. "
            ),
            "{msg}"
        );
        let (msg, ann) = eviction_message(Resource::Memory, &p, None, &c.thresholds, &o);
        assert_eq!(
            msg,
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 80Mi. "
        );
        assert!(ann.is_empty(), "no stats, no annotations: {ann:?}");
        let (_, ann) = eviction_message(
            Resource::Memory,
            &pod("within", None, Some("1Gi")),
            Some(&mem_usage(300 << 20)),
            &c.thresholds,
            &o,
        );
        assert_eq!(ann["offending_containers"], "");
        assert_eq!(ann["offending_containers_usage"], "");
        assert_eq!(ann["starved_resource"], "memory");
    }

    #[test]
    fn percentage_thresholds_print_as_quantities_of_capacity() {
        let t = Instant::now();
        let c = config(&[("nodefs.available", "10%")], &[], &[]);
        let o = obs(Signal::NodeFsAvailable, 50 * MI, 1000 * MI, t);
        let (msg, _) = eviction_message(
            Resource::EphemeralStorage,
            &pod("p", None, None),
            None,
            &c.thresholds,
            &o,
        );
        assert_eq!(
            msg,
            "The node was low on resource: ephemeral-storage. Threshold quantity: 100Mi, available: 50Mi. "
        );
    }

    #[test]
    fn memory_thresholds_sort_first() {
        let mut ts = config(
            &[
                ("nodefs.available", "10%"),
                ("pid.available", "10"),
                ("memory.available", "1Mi"),
            ],
            &[],
            &[],
        )
        .thresholds;
        sort_by_eviction_priority(&mut ts);
        assert_eq!(ts[0].signal, Signal::MemoryAvailable);
        assert_eq!(
            reclaimable_threshold(&ts).map(|t| t.signal),
            Some(Signal::MemoryAvailable)
        );
        assert!(has_node_reclaim(Signal::ImageFsAvailable));
        assert!(!has_node_reclaim(Signal::MemoryAvailable));
        assert!(!has_node_reclaim(Signal::PidAvailable));
    }

    #[test]
    fn local_storage_limits_are_checked_in_the_kubelets_order() {
        use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, Volume};
        let mut p = pod("p", None, None);
        let spec = p.spec.as_mut().unwrap();
        spec.volumes = Some(vec![Volume {
            name: "cache".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                size_limit: Some(Quantity("1Mi".into())),
                ..Default::default()
            }),
            ..Default::default()
        }]);
        spec.containers[0].resources = Some(ResourceRequirements {
            limits: Some([("ephemeral-storage".to_string(), Quantity("4Mi".into()))].into()),
            ..Default::default()
        });
        let usage = |vol: u64, logs: u64| PodUsage {
            containers: vec![ContainerUsage {
                name: "app".into(),
                disk_bytes: Some(logs),
                ..Default::default()
            }],
            volume_bytes: Some(vol),
            volumes: [("cache".to_string(), vol)].into(),
            inodes: None,
            processes: None,
        };
        assert_eq!(local_storage_violation(&p, &usage(1 << 20, 1 << 20)), None);
        let v = local_storage_violation(&p, &usage(2 << 20, 0)).unwrap();
        assert_eq!(v.signal, "emptydirfs.limit");
        assert_eq!(
            v.message,
            "Usage of EmptyDir volume \"cache\" exceeds the limit \"1Mi\". "
        );
        // Logs alone over the container's limit (the volume within its own): the pod total
        // (volume + logs) is checked before the container.
        let v = local_storage_violation(&p, &usage(1 << 20, 5 << 20)).unwrap();
        assert_eq!(v.signal, "ephemeralpodfs.limit");
        assert_eq!(
            v.message,
            "Pod ephemeral local storage usage exceeds the total limit of containers 4Mi. "
        );
        // A second container without a limit raises the pod total but not the first's limit.
        let mut two = p.clone();
        let mut other = two.spec.as_ref().unwrap().containers[0].clone();
        other.name = "other".into();
        other.resources.as_mut().unwrap().limits =
            Some([("ephemeral-storage".to_string(), Quantity("100Mi".into()))].into());
        two.spec.as_mut().unwrap().containers.push(other);
        let v = local_storage_violation(&two, &usage(0, 5 << 20)).unwrap();
        assert_eq!(v.signal, "ephemeralcontainerfs.limit");
        assert_eq!(
            v.message,
            "Container app exceeded its local ephemeral storage limit \"4Mi\". "
        );
        assert_eq!(
            local_storage_violation(&pod("plain", None, None), &usage(9 << 30, 9 << 30)),
            None
        );
        // Only pods with a limit are measured at all.
        assert!(has_local_storage_limits(&p));
        assert!(has_local_storage_limits(&two));
        assert!(!has_local_storage_limits(&pod("plain", None, None)));
        let mut volume_only = pod("vol", None, None);
        volume_only.spec.as_mut().unwrap().volumes = p.spec.as_ref().unwrap().volumes.clone();
        assert!(has_local_storage_limits(&volume_only));
    }

    proptest! {
        #[test]
        fn ranking_puts_every_exceeding_pod_before_every_pod_within_its_request(
            specs in proptest::collection::vec((0u64..2048, 0i64..2048, -5i32..5), 1..20)
        ) {
            let pods: Vec<(Pod, Option<PodUsage>)> = specs
                .iter()
                .enumerate()
                .map(|(i, (use_mi, req_mi, prio))| {
                    (pod(&format!("p{i}"), Some(*prio), Some(&format!("{req_mi}Mi"))), Some(mem_usage(use_mi << 20)))
                })
                .collect();
            let mut v: Vec<&(Pod, Option<PodUsage>)> = pods.iter().collect();
            rank(Resource::Memory, &mut v, |p| &p.0, |p| p.1.as_ref());
            let exceeds: Vec<bool> = v
                .iter()
                .map(|p| p.1.as_ref().unwrap().memory().unwrap() as i64 > pod_request(&p.0, "memory"))
                .collect();
            let first_within = exceeds.iter().position(|e| !e).unwrap_or(exceeds.len());
            prop_assert!(exceeds[first_within..].iter().all(|e| !e));
            // Within each group, priority never decreases.
            for w in v.windows(2) {
                let (a, b) = (w[0], w[1]);
                let ea = a.1.as_ref().unwrap().memory().unwrap() as i64 > pod_request(&a.0, "memory");
                let eb = b.1.as_ref().unwrap().memory().unwrap() as i64 > pod_request(&b.0, "memory");
                if ea == eb {
                    prop_assert!(priority(&a.0) <= priority(&b.0));
                }
            }
        }

        #[test]
        fn a_threshold_is_met_exactly_when_available_is_below_it(avail in -(1i64 << 40)..(1i64 << 40), mi in 1i64..100_000) {
            let c = config(&[("memory.available", &format!("{mi}Mi"))], &[], &[]);
            let met = thresholds_met(&c.thresholds, &obs(Signal::MemoryAvailable, avail, 1 << 41, Instant::now()), false);
            prop_assert_eq!(!met.is_empty(), avail < mi * MI);
        }
    }
}
