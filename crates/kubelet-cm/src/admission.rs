//! Resource admission: the kubelet's predicate admit handler (`predicateAdmitHandler`), the
//! scheduler's node checks a pod must pass on this node before it runs: the node OS, resource
//! fit (`OutOfcpu`, `OutOfmemory`, `OutOfephemeral-storage`, `OutOfpods`, `OutOf<name>`), node
//! name, node selector and required node affinity, and host ports.

use std::collections::{BTreeMap, HashMap, HashSet};

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, Pod};
use kubelet_api::pod as podutil;
use kubelet_api::resources;
use kubelet_api::{AdmitResult, PodAdmitHandler};
use parking_lot::Mutex;

/// What the node offers pods, shared by the admit handler and the plugin that computes it.
#[derive(Debug, Clone, Default)]
pub struct NodeFacts {
    /// The node's name.
    pub node_name: String,
    /// The node's labels (for `nodeSelector` and node affinity).
    pub labels: BTreeMap<String, String>,
    /// `status.allocatable` in canonical units.
    pub allocatable: BTreeMap<String, i64>,
}

/// The predicate admit handler.
#[derive(Debug)]
pub struct ResourceAdmitHandler {
    facts: std::sync::Arc<parking_lot::RwLock<NodeFacts>>,
    /// Requests per pod UID: a pod's spec requests do not change, so each is computed once.
    requests: Mutex<HashMap<String, BTreeMap<String, i64>>>,
}

impl ResourceAdmitHandler {
    /// A handler reading `facts` at each decision.
    pub fn new(facts: std::sync::Arc<parking_lot::RwLock<NodeFacts>>) -> Self {
        Self {
            facts,
            requests: Mutex::default(),
        }
    }

    fn requests_of(&self, pod: &Pod) -> Result<BTreeMap<String, i64>, String> {
        let uid = podutil::uid(pod);
        if let Some(r) = self.requests.lock().get(uid) {
            return Ok(r.clone());
        }
        let r = resources::pod_requests(pod).map_err(|e| e.to_string())?;
        let mut cache = self.requests.lock();
        // Bounded: the cache is rebuilt when it outgrows the pods a node can hold.
        if cache.len() > 4096 {
            cache.clear();
        }
        cache.insert(uid.to_string(), r.clone());
        Ok(r)
    }

    /// Forget a pod's cached requests.
    pub fn forget(&self, uid: &str) {
        self.requests.lock().remove(uid);
    }
}

fn reject(reason: &str, message: impl Into<String>) -> AdmitResult {
    AdmitResult::reject(reason, message)
}

impl PodAdmitHandler for ResourceAdmitHandler {
    fn admit(&self, pod: &Pod, active_pods: &[std::sync::Arc<Pod>]) -> AdmitResult {
        let facts = self.facts.read();
        // The node OS, from the pod's `kubernetes.io/os` label and `spec.os`.
        if let Some(os) = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("kubernetes.io/os"))
            && os != "linux"
        {
            return reject(
                "PodOSSelectorNodeLabelDoesNotMatch",
                "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label",
            );
        }
        if let Some(os) = pod.spec.as_ref().and_then(|s| s.os.as_ref())
            && os.name != "linux"
        {
            return reject(
                "PodOSNotSupported",
                "Failed to admit pod as the OS field doesn't match node OS",
            );
        }
        let requested = match self.requests_of(pod) {
            Ok(r) => r,
            Err(e) => {
                return reject(
                    "UnexpectedAdmissionError",
                    format!("Allocate failed due to {e}, which is unexpected"),
                );
            }
        };
        // Resource fit, in the scheduler's order: pods, cpu, memory, ephemeral-storage, the rest.
        if let Some(&allowed) = facts.allocatable.get("pods") {
            let used = active_pods.len() as i64;
            if used + 1 > allowed {
                return out_of("pods", 1, used, allowed);
            }
        }
        if requested.values().any(|v| *v > 0) {
            // Summed under one lock from the cached requests, without copying them.
            let mut used: BTreeMap<&str, i64> = BTreeMap::new();
            let mut cache = self.requests.lock();
            for p in active_pods {
                let uid = podutil::uid(p);
                if !cache.contains_key(uid) {
                    let Ok(r) = resources::pod_requests(p) else {
                        continue;
                    };
                    cache.insert(uid.to_string(), r);
                }
                for (k, v) in cache.get(uid).into_iter().flatten() {
                    if let Some((name, _)) = facts.allocatable.get_key_value(k) {
                        *used.entry(name.as_str()).or_insert(0) += v;
                    }
                }
            }
            drop(cache);
            let order = ["cpu", "memory", "ephemeral-storage"];
            let mut names: Vec<&String> = requested.keys().collect();
            kubelet_api::sort::by_key(&mut names, |n| {
                order.iter().position(|o| o == n).unwrap_or(order.len())
            });
            for name in names {
                let want = requested[name];
                // A resource the node does not advertise (a cluster-level extended resource)
                // is not checked here, as the kubelet drops it from the request.
                let Some(&alloc) = facts.allocatable.get(name) else {
                    continue;
                };
                let in_use = used.get(name.as_str()).copied().unwrap_or(0);
                if want > 0 && want > alloc - in_use {
                    return out_of(name, want, in_use, alloc);
                }
            }
        }
        if let Some(spec) = &pod.spec {
            if !node_affinity_matches(pod, &facts.node_name, &facts.labels) {
                return reject(
                    "NodeAffinity",
                    "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector",
                );
            }
            if let Some(n) = spec.node_name.as_deref()
                && !n.is_empty()
                && n != facts.node_name
            {
                return reject(
                    "NodeName",
                    "Predicate NodeName failed: node(s) didn't match the requested node name",
                );
            }
        }
        let wanted = host_ports(pod);
        if !wanted.is_empty() {
            let taken: HashSet<HostPort> = active_pods.iter().flat_map(|p| host_ports(p)).collect();
            if wanted.iter().any(|w| taken.iter().any(|t| t.conflicts(w))) {
                return reject(
                    "NodePorts",
                    "Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports",
                );
            }
        }
        AdmitResult::admit()
    }
}

fn out_of(resource: &str, requested: i64, used: i64, capacity: i64) -> AdmitResult {
    reject(
        &format!("OutOf{resource}"),
        format!(
            "Node didn't have enough resource: {resource}, requested: {requested}, used: {used}, capacity: {capacity}"
        ),
    )
}

/// One host port a pod binds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct HostPort {
    protocol: String,
    ip: String,
    port: i32,
}

impl HostPort {
    fn conflicts(&self, other: &HostPort) -> bool {
        let any = |ip: &str| ip.is_empty() || ip == "0.0.0.0" || ip == "::";
        self.port == other.port
            && self.protocol == other.protocol
            && (any(&self.ip) || any(&other.ip) || self.ip == other.ip)
    }
}

fn host_ports(pod: &Pod) -> Vec<HostPort> {
    podutil::init_containers(pod)
        .iter()
        .chain(podutil::containers(pod))
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let port = p.host_port.filter(|h| *h > 0)?;
            Some(HostPort {
                protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                ip: p.host_ip.clone().unwrap_or_default(),
                port,
            })
        })
        .collect()
}

/// Whether `pod`'s `nodeSelector` and required node affinity match this node.
pub fn node_affinity_matches(
    pod: &Pod,
    node_name: &str,
    labels: &BTreeMap<String, String>,
) -> bool {
    let Some(spec) = &pod.spec else {
        return true;
    };
    if let Some(sel) = &spec.node_selector
        && !sel.iter().all(|(k, v)| labels.get(k) == Some(v))
    {
        return false;
    }
    let Some(required) = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
    else {
        return true;
    };
    // Terms are ORed; an empty list matches nothing.
    required
        .node_selector_terms
        .iter()
        .any(|t| term_matches(t, node_name, labels))
}

fn term_matches(t: &NodeSelectorTerm, node_name: &str, labels: &BTreeMap<String, String>) -> bool {
    let exprs = t.match_expressions.as_deref().unwrap_or(&[]);
    let fields = t.match_fields.as_deref().unwrap_or(&[]);
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    let fields_map = BTreeMap::from([("metadata.name".to_string(), node_name.to_string())]);
    exprs.iter().all(|r| requirement_matches(r, labels))
        && fields.iter().all(|r| requirement_matches(r, &fields_map))
}

fn requirement_matches(r: &NodeSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let value = labels.get(&r.key);
    let values = r.values.as_deref().unwrap_or(&[]);
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => !value.is_some_and(|v| values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) = (
                value.and_then(|v| v.parse::<i64>().ok()),
                values.first().and_then(|b| b.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if r.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Affinity, Container, ContainerPort, NodeAffinity, NodeSelector, PodSpec,
        ResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use std::sync::Arc;

    fn pod(uid: &str, cpu: &str, mem: &str) -> Pod {
        let mut req = BTreeMap::new();
        if !cpu.is_empty() {
            req.insert("cpu".to_string(), Quantity(cpu.into()));
        }
        if !mem.is_empty() {
            req.insert("memory".to_string(), Quantity(mem.into()));
        }
        Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                uid: Some(uid.into()),
                name: Some(uid.into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".into(),
                    resources: Some(ResourceRequirements {
                        requests: Some(req),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn handler(pods: i64) -> ResourceAdmitHandler {
        let facts = NodeFacts {
            node_name: "n1".into(),
            labels: [("disk".to_string(), "ssd".to_string())].into(),
            allocatable: [
                ("cpu".to_string(), 2000),
                ("memory".into(), 1 << 30),
                ("pods".into(), pods),
                ("example.com/dongle".into(), 1),
            ]
            .into(),
        };
        ResourceAdmitHandler::new(Arc::new(parking_lot::RwLock::new(facts)))
    }

    #[test]
    fn fit_counts_pods_cpu_memory_and_extended_resources() {
        let h = handler(2);
        let a = pod("a", "1500m", "");
        assert!(h.admit(&a, &[]).admit);
        let a = std::sync::Arc::new(a);
        let r = h.admit(&pod("b", "600m", ""), std::slice::from_ref(&a));
        assert_eq!(r.reason, "OutOfcpu");
        assert_eq!(
            r.message,
            "Node didn't have enough resource: cpu, requested: 600, used: 1500, capacity: 2000"
        );
        let r = h.admit(&pod("c", "", "2Gi"), &[]);
        assert_eq!(r.reason, "OutOfmemory");
        let r = h.admit(
            &pod("d", "", ""),
            &[a.clone(), std::sync::Arc::new(pod("x", "", ""))],
        );
        assert_eq!(r.reason, "OutOfpods");
        let requesting = |uid: &str, name: &str, n: &str| {
            let mut p = pod(uid, "", "");
            let c = &mut p.spec.as_mut().unwrap().containers[0];
            let req = c.resources.as_mut().unwrap().requests.as_mut().unwrap();
            req.insert(name.into(), Quantity(n.into()));
            p
        };
        let dongle = requesting("e", "example.com/dongle", "2");
        assert_eq!(h.admit(&dongle, &[]).reason, "OutOfexample.com/dongle");
        // Not advertised by the node: not checked.
        let other = requesting("f", "example.com/cluster", "5");
        assert!(h.admit(&other, &[]).admit);
    }

    #[test]
    fn node_name_selector_affinity_and_host_ports() {
        let h = handler(110);
        let mut p = pod("a", "", "");
        p.spec.as_mut().unwrap().node_name = Some("other".into());
        assert_eq!(h.admit(&p, &[]).reason, "NodeName");
        let mut p = pod("b", "", "");
        p.spec.as_mut().unwrap().node_selector =
            Some([("disk".to_string(), "hdd".to_string())].into());
        assert_eq!(h.admit(&p, &[]).reason, "NodeAffinity");
        let mut p = pod("c", "", "");
        p.spec.as_mut().unwrap().affinity = Some(Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: "disk".into(),
                            operator: "In".into(),
                            values: Some(vec!["ssd".into()]),
                        }]),
                        ..Default::default()
                    }],
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        assert!(h.admit(&p, &[]).admit);
        let with_port = |uid: &str, ip: Option<&str>| {
            let mut p = pod(uid, "", "");
            p.spec.as_mut().unwrap().containers[0].ports = Some(vec![ContainerPort {
                container_port: 80,
                host_port: Some(8080),
                host_ip: ip.map(str::to_string),
                ..Default::default()
            }]);
            p
        };
        let first = std::sync::Arc::new(with_port("p1", None));
        assert!(h.admit(&first, &[]).admit);
        let r = h.admit(
            &with_port("p2", Some("127.0.0.1")),
            std::slice::from_ref(&first),
        );
        assert_eq!(r.reason, "NodePorts");
        let mut os = pod("w", "", "");
        os.metadata.labels = Some([("kubernetes.io/os".to_string(), "windows".to_string())].into());
        assert_eq!(
            h.admit(&os, &[]).reason,
            "PodOSSelectorNodeLabelDoesNotMatch"
        );
    }
}
