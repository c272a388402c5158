//! Admission under node pressure (`managerImpl.Admit`).

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Toleration};
use kubelet_api::{AdmitResult, PodAdmitHandler};
use parking_lot::RwLock;

use crate::decide::is_critical;
use crate::signal::NodeCondition;

/// Decide admission of `pod` given the node's pressure `conditions`: no pressure or a critical
/// pod → admit; only MemoryPressure → admit unless the pod is BestEffort and does not tolerate
/// the memory-pressure taint; any other pressure → reject. Rejections carry reason `Evicted`
/// and the kubelet's message "The node had condition: [..]. ".
pub fn admit(
    pod: &Pod,
    conditions: &BTreeSet<NodeCondition>,
    static_pods_are_critical: bool,
) -> AdmitResult {
    if conditions.is_empty() || is_critical(pod, static_pods_are_critical) {
        return AdmitResult::admit();
    }
    if conditions.len() == 1 && conditions.contains(&NodeCondition::MemoryPressure) {
        if kubelet_api::resources::qos_class(pod) != kubelet_api::resources::QosClass::BestEffort {
            return AdmitResult::admit();
        }
        let tolerations = pod
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.as_deref())
            .unwrap_or(&[]);
        if tolerations
            .iter()
            .any(|t| tolerates(t, NodeCondition::MemoryPressure.taint_key(), "NoSchedule"))
        {
            return AdmitResult::admit();
        }
    }
    let names: Vec<&str> = conditions.iter().map(|c| c.as_str()).collect();
    let message = format!("The node had condition: [{}]. ", names.join(" "));
    tracing::info!(
        pod = %kubelet_api::pod::full_name(pod),
        conditions = ?names,
        "Failed to admit pod to node: node has pressure conditions"
    );
    AdmitResult::reject("Evicted", message)
}

/// `Toleration.ToleratesTaint` for a taint with an empty value.
fn tolerates(t: &Toleration, key: &str, effect: &str) -> bool {
    if let Some(e) = t.effect.as_deref().filter(|e| !e.is_empty())
        && e != effect
    {
        return false;
    }
    if let Some(k) = t.key.as_deref().filter(|k| !k.is_empty())
        && k != key
    {
        return false;
    }
    match t.operator.as_deref() {
        None | Some("") | Some("Equal") => t.value.as_deref().unwrap_or("").is_empty(),
        Some("Exists") => true,
        Some(_) => false,
    }
}

/// The manager's [`PodAdmitHandler`]: reads the node conditions the manager publishes.
#[derive(Debug, Clone)]
pub struct EvictionAdmitHandler {
    pub(crate) conditions: Arc<RwLock<BTreeSet<NodeCondition>>>,
    pub(crate) static_pods_are_critical: bool,
}

impl PodAdmitHandler for EvictionAdmitHandler {
    fn admit(&self, pod: &Pod, _active_pods: &[Arc<Pod>]) -> AdmitResult {
        let conditions = self.conditions.read().clone();
        admit(pod, &conditions, self.static_pods_are_critical)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn pod(best_effort: bool, tolerations: Option<Vec<Toleration>>) -> Pod {
        let mut c = Container {
            name: "app".into(),
            ..Default::default()
        };
        if !best_effort {
            c.resources = Some(ResourceRequirements {
                requests: Some([("memory".to_string(), Quantity("10Mi".into()))].into()),
                ..Default::default()
            });
        }
        Pod {
            spec: Some(PodSpec {
                containers: vec![c],
                tolerations,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn set(cs: &[NodeCondition]) -> BTreeSet<NodeCondition> {
        cs.iter().copied().collect()
    }

    #[test]
    fn admission_follows_the_kubelets_table() {
        use NodeCondition::*;
        let tol = |key: Option<&str>, op: &str, effect: Option<&str>| {
            Some(vec![Toleration {
                key: key.map(Into::into),
                operator: Some(op.into()),
                effect: effect.map(Into::into),
                ..Default::default()
            }])
        };
        let mut critical = pod(true, None);
        critical.spec.as_mut().unwrap().priority = Some(2_000_000_000);
        let table = [
            ("no pressure", pod(true, None), set(&[]), true),
            (
                "burstable under memory",
                pod(false, None),
                set(&[MemoryPressure]),
                true,
            ),
            (
                "besteffort under memory",
                pod(true, None),
                set(&[MemoryPressure]),
                false,
            ),
            (
                "besteffort tolerating the taint",
                pod(
                    true,
                    tol(
                        Some("node.kubernetes.io/memory-pressure"),
                        "Exists",
                        Some("NoSchedule"),
                    ),
                ),
                set(&[MemoryPressure]),
                true,
            ),
            (
                "besteffort tolerating everything",
                pod(true, tol(None, "Exists", None)),
                set(&[MemoryPressure]),
                true,
            ),
            (
                "besteffort tolerating another effect",
                pod(
                    true,
                    tol(
                        Some("node.kubernetes.io/memory-pressure"),
                        "Exists",
                        Some("NoExecute"),
                    ),
                ),
                set(&[MemoryPressure]),
                false,
            ),
            (
                "burstable under disk",
                pod(false, None),
                set(&[DiskPressure]),
                false,
            ),
            (
                "tolerations do not help under disk",
                pod(true, tol(None, "Exists", None)),
                set(&[DiskPressure]),
                false,
            ),
            (
                "burstable under pid",
                pod(false, None),
                set(&[PidPressure]),
                false,
            ),
            (
                "burstable under memory and disk",
                pod(false, None),
                set(&[MemoryPressure, DiskPressure]),
                false,
            ),
            (
                "critical under everything",
                critical,
                set(&[MemoryPressure, DiskPressure, PidPressure]),
                true,
            ),
        ];
        for (name, p, conds, want) in table {
            let r = admit(&p, &conds, true);
            assert_eq!(r.admit, want, "{name}");
            if !want {
                assert_eq!(r.reason, "Evicted", "{name}");
            }
        }
        let r = admit(
            &pod(false, None),
            &set(&[MemoryPressure, DiskPressure]),
            true,
        );
        assert_eq!(
            r.message,
            "The node had condition: [MemoryPressure DiskPressure]. "
        );
    }

    #[test]
    fn static_pods_are_admitted_unless_the_policy_is_off() {
        let mut p = pod(true, None);
        p.metadata.annotations = Some(
            [(
                "kubernetes.io/config.source".to_string(),
                "file".to_string(),
            )]
            .into(),
        );
        let disk = set(&[NodeCondition::DiskPressure]);
        assert!(admit(&p, &disk, true).admit);
        assert!(!admit(&p, &disk, false).admit);
    }
}
