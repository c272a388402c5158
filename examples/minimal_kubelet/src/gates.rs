//! `--feature-gates` (the kubelet's `Key=bool,Key=bool` syntax) and the PLEG it selects.

use std::collections::BTreeMap;
use std::sync::Arc;

use kubelet_core::{ContainerRuntime, PodLifecycleEventGenerator};
use kubelet_pleg::{EventedPleg, EventedPlegConfig, GenericPleg, GenericPlegConfig};
use prometheus_client::registry::Registry;

/// Gates this agent knows; others are accepted with a warning (the kubelet rejects unknown
/// gates, but knows hundreds this agent has no use for).
const KNOWN: &[&str] = &["EventedPLEG"];

/// Parse `A=true,B=false`.
pub(crate) fn parse_feature_gates(s: &str) -> Result<BTreeMap<String, bool>, String> {
    let mut gates = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("missing bool value for {part}"))?;
        let v: bool = v
            .trim()
            .parse()
            .map_err(|_| format!("invalid value of {k}={v}, err: expected true or false"))?;
        gates.insert(k.trim().to_string(), v);
    }
    Ok(gates)
}

/// The PLEG the gates ask for: the relist PLEG, or with `EventedPLEG=true` the evented one
/// (runtime events, 300 s safety-net relist, fallback to the 1 s relist), its metrics
/// registered in `metrics`.
pub(crate) fn pleg(
    gates: &BTreeMap<String, bool>,
    runtime: Arc<dyn ContainerRuntime>,
    metrics: &mut Registry,
) -> Arc<dyn PodLifecycleEventGenerator> {
    for k in gates.keys().filter(|k| !KNOWN.contains(&k.as_str())) {
        tracing::warn!(gate = %k, "--feature-gates: gate has no effect on this agent");
    }
    if gates.get("EventedPLEG").copied().unwrap_or(false) {
        tracing::info!(
            "EventedPLEG: runtime events drive the PLEG, relist every 300s as the safety net"
        );
        let pleg = EventedPleg::new(runtime, EventedPlegConfig::default());
        pleg.register_metrics(metrics);
        Arc::new(pleg)
    } else {
        let pleg = GenericPleg::new(runtime, GenericPlegConfig::default());
        pleg.register_metrics(metrics);
        Arc::new(pleg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feature_gates_parse_like_the_kubelets() {
        let g = parse_feature_gates("EventedPLEG=true, Other=false").expect("parses");
        assert_eq!(g.get("EventedPLEG"), Some(&true));
        assert_eq!(g.get("Other"), Some(&false));
        assert!(parse_feature_gates("").expect("empty").is_empty());
        assert!(parse_feature_gates("EventedPLEG").is_err());
        assert!(parse_feature_gates("EventedPLEG=yes").is_err());
    }
}
