//! Node registration and node status (the kubelet's `kubelet_node_status.go` and its setters).
//!
//! [`NodeStatusInputs`] gathers what the status is made of (the runtime, the PLEG's health,
//! extra condition sources such as node-pressure eviction); [`node_status`] computes the status
//! as a pure function of those observations, the machine and the previous status; the loop in
//! the API-server plugin (`crate::ApiServer`) posts it every `nodeStatusUpdateFrequency` when it changed and at
//! least every `nodeStatusReportFrequency`.

use std::collections::BTreeMap;
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeStatus,
    NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kubelet_api::AgentHandle;
use kubelet_api::runtime::{RuntimeStatus, RuntimeVersion};
use kubelet_api::{ContainerRuntime, NodeConditionReader, NodeResources, PlegHealth};

use crate::config::ApiServerConfig;
use crate::machine::MachineInfo;

/// Label with the node's hostname.
pub const LABEL_HOSTNAME: &str = "kubernetes.io/hostname";
/// Label with the node's OS.
pub const LABEL_OS: &str = "kubernetes.io/os";
/// Label with the node's architecture.
pub const LABEL_ARCH: &str = "kubernetes.io/arch";
/// Deprecated OS label the kubelet still sets.
pub const LABEL_OS_BETA: &str = "beta.kubernetes.io/os";
/// Deprecated architecture label the kubelet still sets.
pub const LABEL_ARCH_BETA: &str = "beta.kubernetes.io/arch";

/// Condition type `Ready`.
pub const COND_READY: &str = "Ready";
/// Reason of `Ready=True`.
pub const REASON_READY: &str = "KubeletReady";
/// Message of `Ready=True`.
pub const MESSAGE_READY: &str = "kubelet is posting ready status";
/// Reason of `Ready=False`.
pub const REASON_NOT_READY: &str = "KubeletNotReady";

/// What the node status is computed from.
#[derive(Clone)]
pub struct NodeStatusInputs {
    runtime: Arc<dyn ContainerRuntime>,
    handle: Option<std::sync::Arc<dyn AgentHandle>>,
    plugins: NodeConditionReader,
}

impl std::fmt::Debug for NodeStatusInputs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeStatusInputs")
            .field("handle", &self.handle.is_some())
            .field("plugins", &self.plugins)
            .finish_non_exhaustive()
    }
}

impl NodeStatusInputs {
    /// Inputs reading `runtime` (version, health).
    pub fn new(runtime: Arc<dyn ContainerRuntime>) -> Self {
        Self {
            runtime,
            handle: None,
            plugins: NodeConditionReader::default(),
        }
    }

    /// The agent's handle, for the PLEG's health ("PLEG is not healthy" makes the node
    /// NotReady).
    pub fn kubelet(mut self, handle: std::sync::Arc<dyn AgentHandle>) -> Self {
        self.handle = Some(handle);
        self
    }

    /// The agent's plugins, for their node conditions (eviction's pressure conditions) and
    /// node resources (the stats plugin's capacity): `PluginContext::node_conditions`.
    pub fn plugins(mut self, plugins: NodeConditionReader) -> Self {
        self.plugins = plugins;
        self
    }

    /// Resolves when a plugin says its conditions changed
    /// ([`NodeConditionReader::notify_changed`]).
    pub async fn changed(&self) {
        self.plugins.changed().await;
    }

    /// Observe everything the status needs now.
    pub async fn observe(&self) -> Observation {
        let version = self.runtime.version().await.ok();
        let runtime_status = self.runtime.status().await.ok();
        Observation {
            runtime_up: version.is_some() || runtime_status.is_some(),
            version,
            runtime_status,
            pleg: self
                .handle
                .as_ref()
                .map_or(PlegHealth::Healthy, |h| h.pleg_health()),
            extra: self.plugins.conditions(),
            plugin_errors: self.plugins.ready_errors(),
            resources: self.plugins.resources(),
        }
    }
}

/// One observation of the node's health.
#[derive(Debug, Clone)]
pub struct Observation {
    /// The runtime answered.
    pub runtime_up: bool,
    /// The runtime's version, if it answered.
    pub version: Option<RuntimeVersion>,
    /// The runtime's status, if it answered.
    pub runtime_status: Option<RuntimeStatus>,
    /// PLEG health.
    pub pleg: PlegHealth,
    /// Extra conditions (pressure).
    pub extra: Vec<NodeCondition>,
    /// Errors the plugins report that make the node NotReady (node shutdown).
    pub plugin_errors: Vec<String>,
    /// Node resources the plugins report; they replace the machine facts' values.
    pub resources: NodeResources,
}

/// The errors that make the node NotReady (the kubelet's runtime and network errors).
pub fn not_ready_errors(obs: &Observation) -> Vec<String> {
    let mut errs = Vec::new();
    if !obs.runtime_up {
        errs.push("container runtime is down".to_string());
    }
    if let PlegHealth::Unhealthy(msg) = &obs.pleg {
        errs.push(format!("PLEG is not healthy: {msg}"));
    }
    match &obs.runtime_status {
        Some(st) => {
            for (cond, what) in [
                (RuntimeStatus::RUNTIME_READY, "container runtime not ready"),
                (
                    RuntimeStatus::NETWORK_READY,
                    "container runtime network not ready",
                ),
            ] {
                match st.conditions.iter().find(|c| c.type_ == cond) {
                    Some(c) if c.status => {}
                    Some(c) => errs.push(format!(
                        "{what}: {cond}=false reason:{} message:{}",
                        c.reason, c.message
                    )),
                    None => errs.push(format!("{what}: {cond}=false reason: message:")),
                }
            }
        }
        None if obs.runtime_up => {
            errs.push("container runtime status check may not have completed yet".to_string());
        }
        None => {}
    }
    errs.extend(obs.plugin_errors.iter().cloned());
    errs
}

fn quantity(n: u64) -> Quantity {
    Quantity(n.to_string())
}

fn memory_quantity(bytes: u64) -> Quantity {
    if bytes.is_multiple_of(1024) {
        Quantity(format!("{}Ki", bytes / 1024))
    } else {
        quantity(bytes)
    }
}

/// Capacity and allocatable of the machine under `config`.
pub fn resources(
    machine: &MachineInfo,
    config: &ApiServerConfig,
) -> (BTreeMap<String, Quantity>, BTreeMap<String, Quantity>) {
    let mut capacity = BTreeMap::new();
    capacity.insert("cpu".to_string(), quantity(machine.cpus));
    capacity.insert("memory".to_string(), memory_quantity(machine.memory_bytes));
    capacity.insert(
        "pods".to_string(),
        Quantity(config.max_pods.max(0).to_string()),
    );
    if machine.root_fs_bytes > 0 {
        capacity.insert(
            "ephemeral-storage".to_string(),
            memory_quantity(machine.root_fs_bytes),
        );
    }
    let mut allocatable = capacity.clone();
    allocatable.insert(
        "memory".to_string(),
        memory_quantity(
            machine
                .memory_bytes
                .saturating_sub(config.reserved_memory_bytes),
        ),
    );
    if machine.root_fs_bytes > 0 {
        let reserved = machine.root_fs_bytes / 100
            * u64::from(config.reserved_ephemeral_storage_percent.min(100));
        allocatable.insert(
            "ephemeral-storage".to_string(),
            quantity(machine.root_fs_bytes - reserved),
        );
    }
    (capacity, allocatable)
}

/// The default labels the kubelet sets on its Node, plus `config.node_labels`.
pub fn node_labels(node_name: &str, config: &ApiServerConfig) -> BTreeMap<String, String> {
    let mut labels = config.node_labels.clone();
    let hostname = config
        .hostname
        .clone()
        .unwrap_or_else(|| node_name.to_string());
    labels.insert(LABEL_HOSTNAME.to_string(), hostname);
    labels.insert(LABEL_OS.to_string(), "linux".to_string());
    labels.insert(
        LABEL_ARCH.to_string(),
        crate::machine::go_arch().to_string(),
    );
    labels.insert(LABEL_OS_BETA.to_string(), "linux".to_string());
    labels.insert(
        LABEL_ARCH_BETA.to_string(),
        crate::machine::go_arch().to_string(),
    );
    labels
}

/// The Node object the agent registers.
pub fn initial_node(node_name: &str, config: &ApiServerConfig) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(node_name.to_string()),
            labels: Some(node_labels(node_name, config)),
            annotations: Some(BTreeMap::from([(
                "volumes.kubernetes.io/controller-managed-attach-detach".to_string(),
                "true".to_string(),
            )])),
            ..Default::default()
        },
        spec: (!config.register_with_taints.is_empty()).then(|| {
            k8s_openapi::api::core::v1::NodeSpec {
                taints: Some(config.register_with_taints.clone()),
                ..Default::default()
            }
        }),
        ..Default::default()
    }
}

/// Carry timestamps over from the previous condition of the same type: the transition time is
/// kept unless the status flipped; the heartbeat is `now`.
fn stamp(mut c: NodeCondition, old: Option<&NodeStatus>, now: Timestamp) -> NodeCondition {
    let prev = old
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|p| p.type_ == c.type_));
    c.last_heartbeat_time = Some(Time(now));
    c.last_transition_time = match prev {
        Some(p) if p.status == c.status => p.last_transition_time.clone().or(Some(Time(now))),
        _ => Some(Time(now)),
    };
    c
}

/// Everything that goes into the node status besides the observation.
#[derive(Debug, Clone)]
pub struct NodeFacts {
    /// The machine.
    pub machine: MachineInfo,
    /// InternalIP, if known.
    pub node_ip: Option<String>,
    /// Hostname address.
    pub hostname: String,
}

/// The node status from an observation (the kubelet's setters, in its order: addresses, machine
/// info, version info, daemon endpoints, pressure conditions, then Ready).
pub fn node_status(
    facts: &NodeFacts,
    config: &ApiServerConfig,
    obs: &Observation,
    old: Option<&NodeStatus>,
    now: Timestamp,
) -> NodeStatus {
    let (mut capacity, mut allocatable) = resources(&facts.machine, config);
    capacity.extend(obs.resources.capacity.clone());
    allocatable.extend(obs.resources.allocatable.clone());
    let mut addresses = Vec::new();
    if let Some(ip) = &facts.node_ip {
        addresses.push(NodeAddress {
            type_: "InternalIP".into(),
            address: ip.clone(),
        });
    }
    addresses.push(NodeAddress {
        type_: "Hostname".into(),
        address: facts.hostname.clone(),
    });
    let runtime_version = obs
        .version
        .as_ref()
        .map(|v| format!("{}://{}", v.runtime_name, v.runtime_version))
        .or_else(|| {
            // Keep the last known version while the runtime is down.
            old.and_then(|s| s.node_info.as_ref())
                .map(|i| i.container_runtime_version.clone())
        })
        .unwrap_or_default();
    let m = &facts.machine;
    let node_info = NodeSystemInfo {
        machine_id: m.machine_id.clone(),
        system_uuid: m.system_uuid.clone(),
        boot_id: m.boot_id.clone(),
        kernel_version: m.kernel_version.clone(),
        os_image: m.os_image.clone(),
        container_runtime_version: runtime_version,
        kubelet_version: config.kubelet_version.clone(),
        kube_proxy_version: String::new(),
        operating_system: "linux".into(),
        architecture: m.architecture.clone(),
        ..Default::default()
    };
    let (merged, _) = kubelet_api::merge_node_conditions(obs.extra.iter().cloned());
    let mut conditions: Vec<NodeCondition> =
        merged.into_iter().map(|c| stamp(c, old, now)).collect();
    let errs = not_ready_errors(obs);
    let ready = if errs.is_empty() {
        NodeCondition {
            type_: COND_READY.into(),
            status: "True".into(),
            reason: Some(REASON_READY.into()),
            message: Some(MESSAGE_READY.into()),
            ..Default::default()
        }
    } else {
        let message = if errs.len() == 1 {
            errs[0].clone()
        } else {
            format!("[{}]", errs.join(", "))
        };
        NodeCondition {
            type_: COND_READY.into(),
            status: "False".into(),
            reason: Some(REASON_NOT_READY.into()),
            message: Some(message),
            ..Default::default()
        }
    };
    conditions.push(stamp(ready, old, now));
    NodeStatus {
        capacity: Some(capacity),
        allocatable: Some(allocatable),
        addresses: Some(addresses),
        node_info: Some(node_info),
        daemon_endpoints: Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint {
                port: config.kubelet_port.unwrap_or(0),
            }),
        }),
        conditions: Some(conditions),
        images: obs.resources.images.clone(),
        ..Default::default()
    }
}

/// True when `a` and `b` differ in anything but heartbeat times (the kubelet's
/// `nodeStatusHasChanged`).
pub fn node_status_changed(a: &NodeStatus, b: &NodeStatus) -> bool {
    let strip = |s: &NodeStatus| {
        let mut s = s.clone();
        for c in s.conditions.iter_mut().flatten() {
            c.last_heartbeat_time = None;
        }
        s
    };
    strip(a) != strip(b)
}

/// The Ready condition's status in `s` (`"True"`, `"False"`, `"Unknown"`), if present.
pub fn ready_status(s: &NodeStatus) -> Option<&str> {
    s.conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == COND_READY)
        .map(|c| c.status.as_str())
}

/// The strategic-merge patch that sets `status` on a Node: conditions and addresses are merged
/// by type, in the given order.
pub fn node_status_patch(status: &NodeStatus) -> serde_json::Value {
    let mut v = serde_json::json!({ "status": status });
    if let Some(obj) = v.get_mut("status").and_then(|s| s.as_object_mut()) {
        for (list, key) in [("conditions", "type"), ("addresses", "type")] {
            if let Some(items) = obj.get(list).and_then(|l| l.as_array()) {
                let order: Vec<serde_json::Value> = items
                    .iter()
                    .filter_map(|i| i.get(key).cloned())
                    .map(|k| serde_json::json!({ key: k }))
                    .collect();
                obj.insert(
                    format!("$setElementOrder/{list}"),
                    serde_json::Value::Array(order),
                );
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubelet_api::runtime::RuntimeCondition;

    fn facts() -> NodeFacts {
        NodeFacts {
            machine: MachineInfo {
                cpus: 2,
                memory_bytes: 4 * 1024 * 1024 * 1024,
                root_fs_bytes: 100 * 1024 * 1024 * 1024,
                kernel_version: "6.1.0".into(),
                os_image: "Debian GNU/Linux 12 (bookworm)".into(),
                architecture: "amd64".into(),
                ..Default::default()
            },
            node_ip: Some("10.0.0.5".into()),
            hostname: "node-1".into(),
        }
    }

    fn healthy() -> Observation {
        Observation {
            runtime_up: true,
            version: Some(RuntimeVersion {
                runtime_name: "containerd".into(),
                runtime_version: "1.6.20".into(),
                runtime_api_version: "v1".into(),
            }),
            runtime_status: Some(RuntimeStatus::all_ready()),
            pleg: PlegHealth::Healthy,
            extra: vec![],
            plugin_errors: vec![],
            resources: NodeResources::default(),
        }
    }

    #[test]
    fn resources_the_plugins_report_replace_the_machine_facts() {
        let mut obs = healthy();
        obs.resources
            .capacity
            .insert("cpu".into(), Quantity("3".into()));
        obs.resources
            .capacity
            .insert("example.com/dongle".into(), Quantity("1".into()));
        obs.resources
            .allocatable
            .insert("example.com/dongle".into(), Quantity("1".into()));
        let s = node_status(
            &facts(),
            &ApiServerConfig::default(),
            &obs,
            None,
            Timestamp::UNIX_EPOCH,
        );
        let cap = s.capacity.as_ref().expect("capacity");
        assert_eq!(cap["cpu"].0, "3");
        assert_eq!(cap["example.com/dongle"].0, "1");
        assert_eq!(cap["pods"].0, "110", "what no plugin reports stays");
        let alloc = s.allocatable.as_ref().expect("allocatable");
        assert_eq!(alloc["example.com/dongle"].0, "1");
        assert_eq!(
            s.images, None,
            "no plugin reports images: the field stays out"
        );
        obs.resources.images = Some(vec![k8s_openapi::api::core::v1::ContainerImage {
            names: Some(vec!["registry.example/app:1".into()]),
            size_bytes: Some(42),
        }]);
        let s = node_status(
            &facts(),
            &ApiServerConfig::default(),
            &obs,
            None,
            Timestamp::UNIX_EPOCH,
        );
        assert_eq!(s.images.as_ref().map(Vec::len), Some(1));
    }

    fn ready(s: &NodeStatus) -> NodeCondition {
        s.conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == COND_READY)
            .cloned()
            .expect("Ready condition")
    }

    #[test]
    fn healthy_node_is_ready_with_capacity_allocatable_and_info() {
        let s = node_status(
            &facts(),
            &ApiServerConfig::default(),
            &healthy(),
            None,
            Timestamp::UNIX_EPOCH,
        );
        let r = ready(&s);
        assert_eq!(
            (r.status.as_str(), r.reason.as_deref(), r.message.as_deref()),
            ("True", Some(REASON_READY), Some(MESSAGE_READY))
        );
        let cap = s.capacity.as_ref().expect("capacity");
        assert_eq!(cap["cpu"].0, "2");
        assert_eq!(cap["memory"].0, "4194304Ki");
        assert_eq!(cap["pods"].0, "110");
        assert_eq!(cap["ephemeral-storage"].0, "104857600Ki");
        let alloc = s.allocatable.as_ref().expect("allocatable");
        assert_eq!(
            alloc["memory"].0,
            format!("{}Ki", 4 * 1024 * 1024 - 100 * 1024)
        );
        assert_eq!(
            alloc["ephemeral-storage"].0,
            (100u64 * 1024 * 1024 * 1024 / 100 * 90).to_string()
        );
        let info = s.node_info.as_ref().expect("node info");
        assert_eq!(info.container_runtime_version, "containerd://1.6.20");
        assert_eq!(info.kubelet_version, crate::config::KUBELET_VERSION);
        assert_eq!(info.architecture, "amd64");
        let addrs = s.addresses.as_ref().expect("addresses");
        assert_eq!(addrs[0].type_, "InternalIP");
        assert_eq!(addrs[1].type_, "Hostname");
    }

    #[test]
    fn not_ready_says_why_runtime_down_pleg_unhealthy_network() {
        let down = Observation {
            runtime_up: false,
            version: None,
            runtime_status: None,
            ..healthy()
        };
        let r = ready(&node_status(
            &facts(),
            &ApiServerConfig::default(),
            &down,
            None,
            Timestamp::UNIX_EPOCH,
        ));
        assert_eq!(
            (r.status.as_str(), r.reason.as_deref(), r.message.as_deref()),
            (
                "False",
                Some(REASON_NOT_READY),
                Some("container runtime is down")
            )
        );

        let mut obs = healthy();
        obs.pleg = PlegHealth::Unhealthy("pleg has yet to be successful".into());
        obs.runtime_status = Some({
            let mut v = RuntimeStatus::default();
            v.conditions = vec![
                RuntimeCondition {
                    type_: "RuntimeReady".into(),
                    status: true,
                    ..Default::default()
                },
                RuntimeCondition {
                    type_: "NetworkReady".into(),
                    status: false,
                    reason: "NoCNI".into(),
                    message: "no config".into(),
                },
            ];
            v
        });
        let r = ready(&node_status(
            &facts(),
            &ApiServerConfig::default(),
            &obs,
            None,
            Timestamp::UNIX_EPOCH,
        ));
        assert_eq!(
            r.message.as_deref(),
            Some(
                "[PLEG is not healthy: pleg has yet to be successful, container runtime network not ready: NetworkReady=false reason:NoCNI message:no config]"
            )
        );
    }

    #[test]
    fn transition_time_moves_only_when_the_status_flips_and_heartbeats_are_not_changes() {
        let cfg = ApiServerConfig::default();
        let t0 = Timestamp::UNIX_EPOCH;
        let t1 = t0 + jiff::SignedDuration::from_secs(10);
        let t2 = t0 + jiff::SignedDuration::from_secs(20);
        let mut pressure = NodeCondition {
            type_: "MemoryPressure".into(),
            status: "False".into(),
            reason: Some("KubeletHasSufficientMemory".into()),
            ..Default::default()
        };
        let mut obs = healthy();
        obs.extra = vec![pressure.clone()];
        let s0 = node_status(&facts(), &cfg, &obs, None, t0);
        let s1 = node_status(&facts(), &cfg, &obs, Some(&s0), t1);
        assert!(!node_status_changed(&s0, &s1), "only heartbeats moved");
        assert_eq!(ready(&s1).last_transition_time, Some(Time(t0)));
        assert_eq!(ready(&s1).last_heartbeat_time, Some(Time(t1)));
        let names: Vec<_> = s1
            .conditions
            .iter()
            .flatten()
            .map(|c| c.type_.clone())
            .collect();
        assert_eq!(
            names,
            ["MemoryPressure", "Ready"],
            "pressure conditions come before Ready"
        );
        pressure.status = "True".into();
        obs.extra = vec![pressure];
        let s2 = node_status(&facts(), &cfg, &obs, Some(&s1), t2);
        assert!(node_status_changed(&s1, &s2));
        let mp = s2
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "MemoryPressure")
            .expect("mp");
        assert_eq!(mp.last_transition_time, Some(Time(t2)));
        assert_eq!(ready(&s2).last_transition_time, Some(Time(t0)));
    }

    #[test]
    fn default_labels_and_flag_labels() {
        let cfg = ApiServerConfig::default().node_labels(BTreeMap::from([(
            "example.com/role".to_string(),
            "edge".to_string(),
        )]));
        let l = node_labels("node-1", &cfg);
        assert_eq!(l[LABEL_HOSTNAME], "node-1");
        assert_eq!(l[LABEL_OS], "linux");
        assert_eq!(l[LABEL_OS_BETA], "linux");
        assert_eq!(l[LABEL_ARCH], crate::machine::go_arch());
        assert_eq!(l["example.com/role"], "edge");
    }

    #[test]
    fn status_patch_orders_conditions_and_addresses() {
        let s = node_status(
            &facts(),
            &ApiServerConfig::default(),
            &healthy(),
            None,
            Timestamp::UNIX_EPOCH,
        );
        let p = node_status_patch(&s);
        assert_eq!(
            p["status"]["$setElementOrder/conditions"],
            serde_json::json!([{"type": "Ready"}])
        );
        assert_eq!(
            p["status"]["$setElementOrder/addresses"],
            serde_json::json!([{"type": "InternalIP"}, {"type": "Hostname"}])
        );
    }
}
