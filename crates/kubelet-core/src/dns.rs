//! A pod's DNS settings, as the kubelet forms them (`pkg/kubelet/network/dns/dns.go`): from
//! `dnsPolicy`, `dnsConfig`, the node's `clusterDNS`, `clusterDomain` and `resolvConf`, within
//! the resolver's limits. The result goes to the runtime in the sandbox config (CRI
//! `DNSConfig`); a runtime that gives pods their own `/etc/resolv.conf` (containerd, CRI-O)
//! writes it there. The process runtime's pods share the host's files and cannot honour it.
//!
//! | `dnsPolicy` | pods on the pod network | host-network pods |
//! |---|---|---|
//! | `ClusterFirst` (default) | cluster DNS | the host's resolver |
//! | `ClusterFirstWithHostNet` | cluster DNS | cluster DNS |
//! | `Default` | the host's resolver | the host's resolver |
//! | `None` | only `dnsConfig` | only `dnsConfig` |
//!
//! Cluster DNS: `nameserver`s = `clusterDNS`, `search` = `<ns>.svc.<domain> svc.<domain>
//! <domain>` then the host's, `options ndots:5`. Without `clusterDNS`, `ClusterFirst` falls back
//! to the host's resolver with a `MissingClusterDNS` event. `dnsConfig` is then appended
//! (duplicates dropped, options of the same name replaced). More than 3 nameservers, 32 search
//! domains or 2,048 characters of search line are cut with a `DNSConfigForming` warning.

use k8s_openapi::api::core::v1::Pod;

use kubelet_api::runtime::DnsConfig;

/// The resolver's limits (`validation.MaxDNSNameservers`, `MaxDNSSearchPaths`,
/// `MaxDNSSearchListChars`).
pub const MAX_NAMESERVERS: usize = 3;
/// See [`MAX_NAMESERVERS`].
pub const MAX_SEARCH_PATHS: usize = 32;
/// See [`MAX_NAMESERVERS`].
pub const MAX_SEARCH_CHARS: usize = 2048;

/// The node's DNS settings (`clusterDNS`, `clusterDomain`, `resolvConf`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DnsSettings {
    /// `clusterDNS`: the cluster's DNS server addresses.
    pub cluster_dns: Vec<String>,
    /// `clusterDomain` (`cluster.local` in most clusters; empty: no cluster search path).
    pub cluster_domain: String,
    /// The host's resolver, parsed from `resolvConf` (`/etc/resolv.conf`); `None` when
    /// `resolvConf` is empty (the kubelet then points host-policy pods at 127.0.0.1).
    pub host: Option<DnsConfig>,
}

/// Parse a `resolv.conf`: `nameserver`, `search` (and `domain`), `options`; comments ignored.
pub fn parse_resolv_conf(text: &str) -> DnsConfig {
    let mut c = DnsConfig::default();
    for line in text.lines() {
        let line = line.split(['#', ';']).next().unwrap_or("");
        let mut fields = line.split_whitespace();
        match fields.next() {
            Some("nameserver") => c.servers.extend(fields.next().map(str::to_string)),
            Some("search") | Some("domain") => {
                c.searches = fields.map(str::to_string).collect();
            }
            Some("options") => c.options.extend(fields.map(str::to_string)),
            _ => {}
        }
    }
    c
}

/// A problem the kubelet reports as a warning event on the pod while forming the settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsEvent {
    /// `DNSConfigForming` or `MissingClusterDNS`.
    pub reason: &'static str,
    /// The kubelet's message.
    pub message: String,
}

fn push_unique(list: &mut Vec<String>, items: impl IntoIterator<Item = String>) {
    for i in items {
        if !list.contains(&i) {
            list.push(i);
        }
    }
}

fn option_name(o: &str) -> &str {
    o.split(':').next().unwrap_or(o)
}

/// What [`pod_dns`] formed: the pod's resolver settings and the events forming them raised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodDns {
    /// The settings handed to the runtime (CRI `DNSConfig`).
    pub config: DnsConfig,
    /// `DNSConfigForming` and `MissingClusterDNS` events to record.
    pub events: Vec<DnsEvent>,
}

/// The DNS settings of `pod` (CRI `DNSConfig`) and the events forming them raised.
pub fn pod_dns(settings: &DnsSettings, pod: &Pod) -> PodDns {
    let mut events = Vec::new();
    let spec = pod.spec.as_ref();
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    let policy = spec
        .and_then(|s| s.dns_policy.as_deref())
        .unwrap_or("ClusterFirst");
    #[derive(PartialEq)]
    enum Kind {
        Cluster,
        Host,
        None,
    }
    let mut kind = match policy {
        "None" => Kind::None,
        "ClusterFirstWithHostNet" => Kind::Cluster,
        "ClusterFirst" if !host_network => Kind::Cluster,
        _ => Kind::Host,
    };
    if kind == Kind::Cluster && settings.cluster_dns.is_empty() {
        events.push(DnsEvent {
            reason: "MissingClusterDNS",
            message: format!(
                "pod: {:?}. kubelet does not have ClusterDNS IP configured and cannot create Pod using {policy:?} policy. Falling back to \"Default\" policy.",
                kubelet_api::pod::full_name(pod)
            ),
        });
        kind = Kind::Host;
    }
    let host = settings.host.clone();
    let mut c = match kind {
        Kind::None => DnsConfig::default(),
        Kind::Cluster => {
            let host = host.unwrap_or_default();
            let mut searches = Vec::new();
            if !settings.cluster_domain.is_empty() {
                let d = &settings.cluster_domain;
                searches.push(format!("{}.svc.{d}", kubelet_api::pod::namespace(pod)));
                searches.push(format!("svc.{d}"));
                searches.push(d.clone());
            }
            push_unique(&mut searches, host.searches);
            DnsConfig {
                servers: settings.cluster_dns.clone(),
                searches,
                options: vec!["ndots:5".to_string()],
            }
        }
        Kind::Host => match host {
            Some(h) => h,
            // No resolvConf: the local resolver only, and no search path.
            None => DnsConfig {
                servers: vec!["127.0.0.1".to_string()],
                searches: vec![".".to_string()],
                options: Vec::new(),
            },
        },
    };
    if let Some(extra) = spec.and_then(|s| s.dns_config.as_ref()) {
        push_unique(
            &mut c.servers,
            extra.nameservers.clone().unwrap_or_default(),
        );
        push_unique(&mut c.searches, extra.searches.clone().unwrap_or_default());
        for o in extra.options.iter().flatten() {
            let name = o.name.clone().unwrap_or_default();
            let value = match &o.value {
                Some(v) => format!("{name}:{v}"),
                None => name.clone(),
            };
            match c.options.iter_mut().find(|x| option_name(x) == name) {
                Some(existing) => *existing = value,
                None => c.options.push(value),
            }
        }
    }
    if c.servers.len() > MAX_NAMESERVERS {
        c.servers.truncate(MAX_NAMESERVERS);
        events.push(DnsEvent {
            reason: "DNSConfigForming",
            message: format!(
                "Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line is: {}",
                c.servers.join(" ")
            ),
        });
    }
    let mut cut = false;
    if c.searches.len() > MAX_SEARCH_PATHS {
        c.searches.truncate(MAX_SEARCH_PATHS);
        cut = true;
    }
    while c.searches.join(" ").len() > MAX_SEARCH_CHARS {
        c.searches.pop();
        cut = true;
    }
    if cut {
        events.push(DnsEvent {
            reason: "DNSConfigForming",
            message: format!(
                "Search Line limits were exceeded, some search paths have been omitted, the applied search line is: {}",
                c.searches.join(" ")
            ),
        });
    }
    PodDns { config: c, events }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodDNSConfig, PodDNSConfigOption, PodSpec};

    fn pod(policy: Option<&str>, host_network: bool, extra: Option<PodDNSConfig>) -> Pod {
        let mut p = Pod {
            spec: Some(PodSpec {
                dns_policy: policy.map(str::to_string),
                host_network: Some(host_network),
                dns_config: extra,
                ..Default::default()
            }),
            ..Default::default()
        };
        p.metadata.name = Some("web".into());
        p.metadata.namespace = Some("shop".into());
        p
    }

    fn settings() -> DnsSettings {
        DnsSettings {
            cluster_dns: vec!["10.0.0.10".into()],
            cluster_domain: "cluster.local".into(),
            host: Some(parse_resolv_conf(
                "# host\nnameserver 192.168.1.1\nnameserver 8.8.8.8\nsearch lan example.org\noptions edns0 timeout:2\n",
            )),
        }
    }

    #[test]
    fn resolv_conf_parses() {
        let h = settings().host.unwrap();
        assert_eq!(h.servers, ["192.168.1.1", "8.8.8.8"]);
        assert_eq!(h.searches, ["lan", "example.org"]);
        assert_eq!(h.options, ["edns0", "timeout:2"]);
    }

    #[test]
    fn each_policy_forms_the_kubelets_settings() {
        let s = settings();
        let cluster = DnsConfig {
            servers: vec!["10.0.0.10".into()],
            searches: vec![
                "shop.svc.cluster.local".into(),
                "svc.cluster.local".into(),
                "cluster.local".into(),
                "lan".into(),
                "example.org".into(),
            ],
            options: vec!["ndots:5".into()],
        };
        let host = s.host.clone().unwrap();
        let table: [(Option<&str>, bool, &DnsConfig); 7] = [
            (None, false, &cluster),
            (Some("ClusterFirst"), false, &cluster),
            (Some("ClusterFirst"), true, &host),
            (Some("ClusterFirstWithHostNet"), true, &cluster),
            (Some("ClusterFirstWithHostNet"), false, &cluster),
            (Some("Default"), false, &host),
            (Some("None"), false, &DnsConfig::default()),
        ];
        for (policy, host_network, want) in table {
            let PodDns {
                config: got,
                events,
            } = pod_dns(&s, &pod(policy, host_network, None));
            assert_eq!(&got, want, "{policy:?} hostNetwork={host_network}");
            assert!(events.is_empty());
        }
    }

    #[test]
    fn dns_config_is_appended_and_options_replace_by_name() {
        let extra = PodDNSConfig {
            nameservers: Some(vec!["1.1.1.1".into(), "10.0.0.10".into()]),
            searches: Some(vec!["my.dns.search.suffix".into()]),
            options: Some(vec![
                PodDNSConfigOption {
                    name: Some("ndots".into()),
                    value: Some("2".into()),
                },
                PodDNSConfigOption {
                    name: Some("edns0".into()),
                    value: None,
                },
            ]),
        };
        let c = pod_dns(
            &settings(),
            &pod(Some("ClusterFirst"), false, Some(extra.clone())),
        )
        .config;
        assert_eq!(c.servers, ["10.0.0.10", "1.1.1.1"]);
        assert_eq!(c.searches.last().unwrap(), "my.dns.search.suffix");
        assert_eq!(c.options, ["ndots:2", "edns0"]);
        let c = pod_dns(&settings(), &pod(Some("None"), false, Some(extra))).config;
        assert_eq!(c.servers, ["1.1.1.1", "10.0.0.10"]);
        assert_eq!(c.searches, ["my.dns.search.suffix"]);
    }

    #[test]
    fn limits_cut_with_a_warning_and_a_missing_cluster_dns_falls_back() {
        let extra = PodDNSConfig {
            nameservers: Some(vec!["1.1.1.1".into(), "2.2.2.2".into(), "3.3.3.3".into()]),
            searches: Some((0..40).map(|i| format!("s{i}.example")).collect()),
            options: None,
        };
        let PodDns { config: c, events } = pod_dns(&settings(), &pod(None, false, Some(extra)));
        assert_eq!(c.servers, ["10.0.0.10", "1.1.1.1", "2.2.2.2"]);
        assert_eq!(c.searches.len(), MAX_SEARCH_PATHS);
        let reasons: Vec<&str> = events.iter().map(|e| e.reason).collect();
        assert_eq!(reasons, ["DNSConfigForming", "DNSConfigForming"]);
        assert!(
            events[0].message.ends_with("10.0.0.10 1.1.1.1 2.2.2.2"),
            "{}",
            events[0].message
        );

        let no_cluster = DnsSettings {
            cluster_dns: vec![],
            ..settings()
        };
        let PodDns { config: c, events } = pod_dns(&no_cluster, &pod(None, false, None));
        assert_eq!(c, settings().host.unwrap());
        assert_eq!(events[0].reason, "MissingClusterDNS");
        let no_resolv = DnsSettings {
            host: None,
            ..DnsSettings::default()
        };
        let c = pod_dns(&no_resolv, &pod(Some("Default"), false, None)).config;
        assert_eq!(c.servers, ["127.0.0.1"]);
        assert_eq!(c.searches, ["."]);
    }
}
