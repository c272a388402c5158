//! The kubelet's OOM score policy (`pkg/kubelet/qos/policy.go`): which processes the kernel
//! kills first when the node runs out of memory.

use k8s_openapi::api::core::v1::{Container, Pod};
use kubelet_api::pod as podutil;
use kubelet_api::resources::{self, QosClass};

/// Guaranteed and node-critical containers.
pub const GUARANTEED_OOM_SCORE_ADJ: i64 = -997;
/// BestEffort containers.
pub const BEST_EFFORT_OOM_SCORE_ADJ: i64 = 1000;
/// The priority from which a pod is node-critical (`system-node-critical`).
pub const NODE_CRITICAL_PRIORITY: i32 = 2_000_001_000;

fn memory_request(c: &Container) -> i64 {
    resources::container_requests(c)
        .ok()
        .and_then(|r| r.get("memory").copied())
        .unwrap_or(0)
}

fn burstable_score(request: i64, memory_capacity: u64) -> i64 {
    if memory_capacity == 0 {
        return 999;
    }
    let cap = i128::from(memory_capacity);
    let score = 1000 - (1000 * i128::from(request.max(0))) / cap;
    // Never as low as a Guaranteed container, never as high as a BestEffort one.
    let score = i64::try_from(score).unwrap_or(3);
    if score < 1000 + GUARANTEED_OOM_SCORE_ADJ {
        1000 + GUARANTEED_OOM_SCORE_ADJ
    } else if score == 1000 {
        999
    } else {
        score
    }
}

/// The `oom_score_adj` of container `c` of `pod` (of QoS class `qos`) on a node with
/// `memory_capacity` bytes (`GetContainerOOMScoreAdjust`).
pub fn container_oom_score_adj(
    pod: &Pod,
    qos: QosClass,
    c: &Container,
    memory_capacity: u64,
) -> i64 {
    let priority = pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
    if priority >= NODE_CRITICAL_PRIORITY {
        return GUARANTEED_OOM_SCORE_ADJ;
    }
    match qos {
        QosClass::Guaranteed => GUARANTEED_OOM_SCORE_ADJ,
        QosClass::BestEffort => BEST_EFFORT_OOM_SCORE_ADJ,
        QosClass::Burstable => {
            let own = burstable_score(memory_request(c), memory_capacity);
            let is_sidecar = podutil::init_containers(pod)
                .iter()
                .any(|i| i.name == c.name && podutil::is_sidecar(i));
            if !is_sidecar {
                return own;
            }
            // A sidecar is never killed before the main containers: at most the score of
            // the regular container with the smallest memory request.
            match podutil::containers(pod).iter().map(memory_request).min() {
                Some(min) => own.min(burstable_score(min, memory_capacity)),
                None => own,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn c(name: &str, mem: &str) -> Container {
        Container {
            name: name.into(),
            resources: Some(ResourceRequirements {
                requests: Some([("memory".to_string(), Quantity(mem.into()))].into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn scores_follow_the_kubelet_policy() {
        let gib = 1u64 << 30;
        let p = Pod::default();
        let x = c("a", "256Mi");
        assert_eq!(
            container_oom_score_adj(&p, QosClass::Guaranteed, &x, gib),
            -997
        );
        assert_eq!(
            container_oom_score_adj(&p, QosClass::BestEffort, &x, gib),
            1000
        );
        // 1000 - 1000 × 256Mi / 1Gi = 750.
        assert_eq!(
            container_oom_score_adj(&p, QosClass::Burstable, &x, gib),
            750
        );
        // Clamped: at least 3, at most 999.
        assert_eq!(
            container_oom_score_adj(&p, QosClass::Burstable, &c("a", "2Gi"), gib),
            3
        );
        assert_eq!(
            container_oom_score_adj(&p, QosClass::Burstable, &c("a", "0"), gib),
            999
        );
        // A sidecar is capped by the smallest regular request.
        let mut side = c("side", "1Mi");
        side.restart_policy = Some("Always".into());
        let p = Pod {
            spec: Some(PodSpec {
                containers: vec![c("main", "512Mi")],
                init_containers: Some(vec![side.clone()]),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            container_oom_score_adj(&p, QosClass::Burstable, &side, gib),
            500
        );
        let mut critical = p.clone();
        if let Some(s) = critical.spec.as_mut() {
            s.priority = Some(2_000_001_000);
        }
        assert_eq!(
            container_oom_score_adj(&critical, QosClass::Burstable, &side, gib),
            -997
        );
    }
}
