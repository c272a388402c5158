//! Service environment variables (the kubelet's `getServiceEnvVarMap` and
//! `pkg/kubelet/envvars`): for the Services of the pod's namespace (with `enableServiceLinks`,
//! the default) and always for the master Service (`kubernetes` in `default`), each with a
//! cluster IP: `<NAME>_SERVICE_HOST`, `<NAME>_SERVICE_PORT` (the first port),
//! `<NAME>_SERVICE_PORT_<PORT NAME>` per named port, and the Docker-link style `<NAME>_PORT`,
//! `<NAME>_PORT_<port>_<PROTO>` with `_PROTO`, `_PORT` and `_ADDR`. `<NAME>` is the Service's
//! name upper-cased with `-` as `_`.
//!
//! The container's own variables win over these, and `$(VAR)` references in its `env` can use
//! them ([`make_environment`](crate::container::make_environment)).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;

/// The namespace of the master Service.
pub const MASTER_SERVICE_NAMESPACE: &str = "default";
/// The master Service's name.
pub const MASTER_SERVICE: &str = "kubernetes";

fn env_name(service: &str) -> String {
    service.replace('-', "_").to_uppercase()
}

fn cluster_ip(s: &Service) -> Option<&str> {
    s.spec
        .as_ref()
        .and_then(|sp| sp.cluster_ip.as_deref())
        .filter(|ip| !ip.is_empty() && *ip != "None")
}

/// The variables of one Service (`envvars.FromServices`), in the kubelet's order.
pub fn service_vars(s: &Service) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let Some(ip) = cluster_ip(s) else {
        return out;
    };
    let prefix = env_name(s.metadata.name.as_deref().unwrap_or(""));
    let ports = s
        .spec
        .as_ref()
        .and_then(|sp| sp.ports.clone())
        .unwrap_or_default();
    out.push((format!("{prefix}_SERVICE_HOST"), ip.to_string()));
    if let Some(first) = ports.first() {
        let base = format!("{prefix}_SERVICE_PORT");
        out.push((base.clone(), first.port.to_string()));
        for p in &ports {
            if let Some(name) = p.name.as_deref().filter(|n| !n.is_empty()) {
                out.push((format!("{base}_{}", env_name(name)), p.port.to_string()));
            }
        }
    }
    let host = |port: i32| {
        if ip.contains(':') {
            format!("[{ip}]:{port}")
        } else {
            format!("{ip}:{port}")
        }
    };
    for (i, p) in ports.iter().enumerate() {
        let proto = p.protocol.as_deref().unwrap_or("TCP");
        let lower = proto.to_lowercase();
        let url = format!("{lower}://{}", host(p.port));
        if i == 0 {
            out.push((format!("{prefix}_PORT"), url.clone()));
        }
        let pp = format!("{prefix}_PORT_{}_{}", p.port, proto.to_uppercase());
        out.push((pp.clone(), url));
        out.push((format!("{pp}_PROTO"), lower));
        out.push((format!("{pp}_PORT"), p.port.to_string()));
        out.push((format!("{pp}_ADDR"), ip.to_string()));
    }
    out
}

/// The service variables for a pod in `namespace` from every Service known
/// (`getServiceEnvVarMap`).
pub fn service_env(
    services: &[Arc<Service>],
    namespace: &str,
    enable_service_links: bool,
) -> BTreeMap<String, String> {
    let mut chosen: HashMap<&str, &Service> = HashMap::new();
    for s in services {
        if cluster_ip(s).is_none() {
            continue;
        }
        let name = s.metadata.name.as_deref().unwrap_or("");
        let ns = s.metadata.namespace.as_deref().unwrap_or("");
        if ns == MASTER_SERVICE_NAMESPACE && name == MASTER_SERVICE {
            chosen.entry(name).or_insert(s);
        } else if ns == namespace && enable_service_links {
            chosen.insert(name, s);
        }
    }
    chosen.values().flat_map(|s| service_vars(s)).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};

    fn svc(
        ns: &str,
        name: &str,
        ip: &str,
        ports: &[(Option<&str>, i32, Option<&str>)],
    ) -> Arc<Service> {
        let mut s = Service {
            spec: Some(ServiceSpec {
                cluster_ip: Some(ip.into()),
                ports: Some(
                    ports
                        .iter()
                        .map(|(n, p, proto)| ServicePort {
                            name: n.map(str::to_string),
                            port: *p,
                            protocol: proto.map(str::to_string),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        s.metadata.name = Some(name.into());
        s.metadata.namespace = Some(ns.into());
        Arc::new(s)
    }

    #[test]
    fn variables_are_named_and_valued_as_the_kubelet_does() {
        let s = svc(
            "shop",
            "my-db",
            "10.0.0.7",
            &[
                (Some("sql"), 5432, None),
                (Some("metrics"), 9187, Some("UDP")),
            ],
        );
        let v: Vec<(String, String)> = service_vars(&s);
        let want: Vec<(&str, &str)> = vec![
            ("MY_DB_SERVICE_HOST", "10.0.0.7"),
            ("MY_DB_SERVICE_PORT", "5432"),
            ("MY_DB_SERVICE_PORT_SQL", "5432"),
            ("MY_DB_SERVICE_PORT_METRICS", "9187"),
            ("MY_DB_PORT", "tcp://10.0.0.7:5432"),
            ("MY_DB_PORT_5432_TCP", "tcp://10.0.0.7:5432"),
            ("MY_DB_PORT_5432_TCP_PROTO", "tcp"),
            ("MY_DB_PORT_5432_TCP_PORT", "5432"),
            ("MY_DB_PORT_5432_TCP_ADDR", "10.0.0.7"),
            ("MY_DB_PORT_9187_UDP", "udp://10.0.0.7:9187"),
            ("MY_DB_PORT_9187_UDP_PROTO", "udp"),
            ("MY_DB_PORT_9187_UDP_PORT", "9187"),
            ("MY_DB_PORT_9187_UDP_ADDR", "10.0.0.7"),
        ];
        let got: Vec<(&str, &str)> = v.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        assert_eq!(got, want);
        // IPv6 addresses are bracketed in URLs.
        let v6 = service_vars(&svc("shop", "v6", "fd00::7", &[(None, 80, None)]));
        assert!(v6.contains(&("V6_PORT".into(), "tcp://[fd00::7]:80".into())));
        // No ports: only the host.
        assert_eq!(
            service_vars(&svc("shop", "bare", "10.0.0.9", &[])),
            vec![("BARE_SERVICE_HOST".to_string(), "10.0.0.9".to_string())]
        );
    }

    #[test]
    fn the_namespace_and_the_master_service_are_chosen() {
        let all = vec![
            svc(
                "default",
                "kubernetes",
                "10.0.0.1",
                &[(Some("https"), 443, None)],
            ),
            svc("shop", "web", "10.0.0.2", &[(None, 80, None)]),
            svc("shop", "headless", "None", &[(None, 80, None)]),
            svc("other", "db", "10.0.0.3", &[(None, 5432, None)]),
        ];
        let env = service_env(&all, "shop", true);
        assert_eq!(env["KUBERNETES_SERVICE_HOST"], "10.0.0.1");
        assert_eq!(env["KUBERNETES_SERVICE_PORT"], "443");
        assert_eq!(env["KUBERNETES_SERVICE_PORT_HTTPS"], "443");
        assert_eq!(env["WEB_SERVICE_HOST"], "10.0.0.2");
        assert!(
            !env.keys()
                .any(|k| k.starts_with("HEADLESS") || k.starts_with("DB_"))
        );
        // enableServiceLinks: false keeps only the master service.
        let env = service_env(&all, "shop", false);
        assert!(env.contains_key("KUBERNETES_SERVICE_HOST"));
        assert!(!env.contains_key("WEB_SERVICE_HOST"));
    }
}
