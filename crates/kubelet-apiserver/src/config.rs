//! [`ApiServerConfig`]: the kubelet's API-related settings, with its defaults.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::ApiServerError;

/// Settings of the API server integration. `Default` gives the kubelet's defaults.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ApiServerConfig {
    /// `--register-node` (true): create the Node object when it does not exist.
    pub register_node: bool,
    /// `--node-labels`: extra labels set when the node registers.
    pub node_labels: BTreeMap<String, String>,
    /// `registerWithTaints` (`--register-with-taints`): taints the Node is created with.
    pub register_with_taints: Vec<k8s_openapi::api::core::v1::Taint>,
    /// `nodeStatusUpdateFrequency` (10 s): how often the node status is computed, and posted if
    /// it changed.
    pub node_status_update_frequency: Duration,
    /// `nodeStatusReportFrequency` (5 m): the status is posted at least this often even when
    /// nothing changed.
    pub node_status_report_frequency: Duration,
    /// `nodeLeaseDurationSeconds` (40).
    pub node_lease_duration_seconds: i32,
    /// How often the Lease is renewed (the kubelet: 1/4 of the lease duration, 10 s).
    pub node_lease_renew_interval: Duration,
    /// `maxPods` (110): the `pods` capacity.
    pub max_pods: i64,
    /// `--node-ip`: the node's InternalIP; `None` picks the address of the default route.
    pub node_ip: Option<String>,
    /// The node's hostname address; `None` reads the kernel's hostname.
    pub hostname: Option<String>,
    /// `--root-dir`: its filesystem gives the `ephemeral-storage` capacity.
    pub root_dir: PathBuf,
    /// The kubelet port reported in `daemonEndpoints` (the kubelet's 10250); `None` reports 0
    /// (no kubelet API served).
    pub kubelet_port: Option<i32>,
    /// Memory kept out of `allocatable` (the kubelet's default hard eviction threshold
    /// `memory.available<100Mi`).
    pub reserved_memory_bytes: u64,
    /// Percentage of the root filesystem kept out of `allocatable` ephemeral storage (the
    /// kubelet's default `nodefs.available<10%`).
    pub reserved_ephemeral_storage_percent: u8,
    /// `kubeletVersion` in the node info.
    pub kubelet_version: String,
    /// `eventRecordQPS` (5): events posted per second, on average.
    pub event_qps: f64,
    /// `eventBurst` (10): events posted at once before the rate applies.
    pub event_burst: u32,
    /// `configMapAndSecretChangeDetectionStrategy` (`Watch`): how ConfigMap and Secret changes
    /// reach the pods (see [`ApiObjects`](crate::ApiObjects)).
    pub change_detection: crate::ChangeDetection,
    /// The pod checkpoint under `root_dir` (edge autonomy: pods start again while the API
    /// server is unreachable; see [`checkpoint`](crate::checkpoint)). `None` (the default of
    /// this type): off. The `kubelet` facade turns it on with a kubeconfig.
    pub checkpoint: Option<crate::checkpoint::CheckpointConfig>,
}

/// The `kubeletVersion` this SDK reports: the Kubernetes API level it implements, then the
/// SDK's own version.
pub const KUBELET_VERSION: &str = concat!("v1.33.0-kubelet-sdk.", env!("CARGO_PKG_VERSION"));

impl Default for ApiServerConfig {
    fn default() -> Self {
        Self {
            register_node: true,
            node_labels: BTreeMap::new(),
            register_with_taints: Vec::new(),
            node_status_update_frequency: Duration::from_secs(10),
            node_status_report_frequency: Duration::from_secs(300),
            node_lease_duration_seconds: 40,
            node_lease_renew_interval: Duration::from_secs(10),
            max_pods: 110,
            node_ip: None,
            hostname: None,
            root_dir: PathBuf::from("/var/lib/kubelet"),
            kubelet_port: None,
            reserved_memory_bytes: 100 * 1024 * 1024,
            reserved_ephemeral_storage_percent: 10,
            kubelet_version: KUBELET_VERSION.to_string(),
            event_qps: 5.0,
            event_burst: 10,
            change_detection: crate::ChangeDetection::Watch,
            checkpoint: None,
        }
    }
}

impl ApiServerConfig {
    /// Set `register_node`.
    pub fn register_node(mut self, register: bool) -> Self {
        self.register_node = register;
        self
    }

    /// Add node labels.
    pub fn node_labels(mut self, labels: BTreeMap<String, String>) -> Self {
        self.node_labels.extend(labels);
        self
    }

    /// Set the node status update and report frequencies.
    pub fn node_status_frequencies(mut self, update: Duration, report: Duration) -> Self {
        self.node_status_update_frequency = update;
        self.node_status_report_frequency = report;
        self
    }

    /// Set the root directory (for the ephemeral-storage capacity).
    pub fn root_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.root_dir = dir.into();
        self
    }

    /// Keep a pod checkpoint with `config` (`None`: none).
    pub fn checkpoint(mut self, config: Option<crate::checkpoint::CheckpointConfig>) -> Self {
        self.checkpoint = config;
        self
    }

    /// Set the node IP.
    pub fn node_ip(mut self, ip: impl Into<String>) -> Self {
        self.node_ip = Some(ip.into());
        self
    }

    /// Set the kubelet port reported in `daemonEndpoints`.
    pub fn kubelet_port(mut self, port: i32) -> Self {
        self.kubelet_port = Some(port);
        self
    }
}

/// Parse `--register-with-taints` (`key=value:Effect,key:Effect`), as the kubelet does: the
/// effect is `NoSchedule`, `PreferNoSchedule` or `NoExecute`; the value may be omitted.
pub fn parse_taints(s: &str) -> Result<Vec<k8s_openapi::api::core::v1::Taint>, ApiServerError> {
    let mut taints = Vec::new();
    for spec in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = |reason: &str| ApiServerError::InvalidTaint {
            taint: spec.to_string(),
            reason: reason.to_string(),
        };
        let (kv, effect) = spec
            .rsplit_once(':')
            .ok_or_else(|| bad("want key[=value]:Effect"))?;
        if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
            return Err(bad(
                "the effect must be NoSchedule, PreferNoSchedule or NoExecute",
            ));
        }
        let (key, value) = match kv.split_once('=') {
            Some((k, v)) => (k, Some(v.to_string())),
            None => (kv, None),
        };
        if key.is_empty() {
            return Err(bad("the key is empty"));
        }
        taints.push(k8s_openapi::api::core::v1::Taint {
            key: key.to_string(),
            value,
            effect: effect.to_string(),
            time_added: None,
        });
    }
    Ok(taints)
}

/// Parse `--node-labels` (`key=value,key2=value2`), checking keys and values as the API does.
pub fn parse_node_labels(s: &str) -> Result<BTreeMap<String, String>, ApiServerError> {
    let mut out = BTreeMap::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let bad = |reason: &str| ApiServerError::InvalidNodeLabel {
            label: item.to_string(),
            reason: reason.to_string(),
        };
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| bad("expected key=value"))?;
        validate_label_key(k).map_err(|r| bad(&r))?;
        validate_label_value(v).map_err(|r| bad(&r))?;
        out.insert(k.to_string(), v.to_string());
    }
    Ok(out)
}

fn is_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn validate_label_key(k: &str) -> Result<(), String> {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    if let Some(p) = prefix {
        let ok = !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            });
        if !ok {
            return Err("the key's prefix must be a DNS subdomain".into());
        }
    }
    if !is_name_part(name) {
        return Err(
            "the key's name must be 1-63 alphanumerics, '-', '_' or '.', starting and ending alphanumeric"
                .into(),
        );
    }
    Ok(())
}

fn validate_label_value(v: &str) -> Result<(), String> {
    if v.is_empty() || is_name_part(v) {
        Ok(())
    } else {
        Err("the value must be empty or 1-63 alphanumerics, '-', '_' or '.', starting and ending alphanumeric".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_labels_parse_and_reject_bad_keys_and_values() {
        let l = parse_node_labels("a=b, example.com/role=edge ,empty=").expect("valid");
        assert_eq!(l.len(), 3);
        assert_eq!(l["example.com/role"], "edge");
        assert_eq!(l["empty"], "");
        assert!(parse_node_labels("novalue").is_err());
        assert!(parse_node_labels("Bad_Prefix.COM/x=y").is_err());
        assert!(parse_node_labels("a=-bad").is_err());
        assert!(parse_node_labels("=v").is_err());
        assert!(parse_node_labels("").expect("empty is fine").is_empty());
    }

    #[test]
    fn taints_parse_as_the_kubelets_flag() {
        let t = parse_taints("dedicated=edge:NoSchedule, gpu:NoExecute").expect("valid");
        assert_eq!(t.len(), 2);
        assert_eq!(
            (
                t[0].key.as_str(),
                t[0].value.as_deref(),
                t[0].effect.as_str()
            ),
            ("dedicated", Some("edge"), "NoSchedule")
        );
        assert_eq!((t[1].key.as_str(), t[1].value.as_deref()), ("gpu", None));
        assert!(parse_taints("a=b").is_err());
        assert!(parse_taints("a=b:Sometimes").is_err());
        assert!(parse_taints(":NoSchedule").is_err());
        assert!(parse_taints("").expect("empty").is_empty());
    }
}
