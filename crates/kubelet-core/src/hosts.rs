//! A pod's hostname and its kubelet-managed `/etc/hosts` (`pkg/kubelet/kubelet_pods.go`):
//! the hostname is `spec.hostname` or the pod's name, cut to 63 characters; with `subdomain`
//! the pod also has the domain `<subdomain>.<ns>.svc.<clusterDomain>` (and, with
//! `setHostnameAsFQDN`, that full name as its hostname). Each container gets the file at
//! `<pod dir>/etc-hosts` mounted on `/etc/hosts` (unless it mounts its own): localhost entries,
//! the pod's IPs with its names, then `hostAliases`; host-network pods get the node's file
//! plus `hostAliases`.

use k8s_openapi::api::core::v1::{HostAlias, Pod};

/// Longest hostname (a DNS label).
pub(crate) const HOSTNAME_MAX_LEN: usize = 63;

/// A pod's hostname and domain, from [`hostname_and_domain`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PodHostname {
    /// `spec.hostname`, or the pod name cut to [`HOSTNAME_MAX_LEN`].
    pub(crate) hostname: String,
    /// `<subdomain>.<namespace>.svc.<cluster domain>` when the pod has a subdomain.
    pub(crate) domain: Option<String>,
}

/// The pod's hostname and domain (the kubelet's `GeneratePodHostNameAndDomain`).
pub(crate) fn hostname_and_domain(pod: &Pod, cluster_domain: &str) -> PodHostname {
    let spec = pod.spec.as_ref();
    let name = spec
        .and_then(|s| s.hostname.clone())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| kubelet_api::pod::name(pod).to_string());
    let mut hostname = name;
    if hostname.len() > HOSTNAME_MAX_LEN {
        let mut cut = HOSTNAME_MAX_LEN;
        while !hostname.is_char_boundary(cut) {
            cut -= 1;
        }
        hostname.truncate(cut);
        while hostname.ends_with('-') || hostname.ends_with('.') {
            hostname.pop();
        }
    }
    let domain = spec
        .and_then(|s| s.subdomain.as_deref())
        .filter(|s| !s.is_empty())
        .map(|sub| {
            format!(
                "{sub}.{}.svc.{cluster_domain}",
                kubelet_api::pod::namespace(pod)
            )
        });
    PodHostname { hostname, domain }
}

/// The hostname the sandbox gets: the FQDN with `setHostnameAsFQDN` and a domain, else the
/// hostname.
pub(crate) fn sandbox_hostname(pod: &Pod, cluster_domain: &str) -> String {
    let PodHostname { hostname, domain } = hostname_and_domain(pod, cluster_domain);
    let fqdn = pod
        .spec
        .as_ref()
        .and_then(|s| s.set_hostname_as_fqdn)
        .unwrap_or(false);
    match domain {
        Some(d) if fqdn => format!("{hostname}.{d}"),
        _ => hostname,
    }
}

fn alias_entries(aliases: &[HostAlias]) -> String {
    if aliases.is_empty() {
        return String::new();
    }
    let mut out = String::from("\n# Entries added by HostAliases.\n");
    for a in aliases {
        let names = a.hostnames.clone().unwrap_or_default();
        out.push_str(&format!("{}\t{}\n", a.ip, names.join("\t")));
    }
    out
}

/// The managed hosts file of a pod on the pod network (`managedHostsFileContent`).
pub(crate) fn managed_hosts(
    ips: &[String],
    hostname: &str,
    domain: Option<&str>,
    aliases: &[HostAlias],
) -> String {
    let mut out = String::from("# Kubernetes-managed hosts file.\n");
    out.push_str("127.0.0.1\tlocalhost\n");
    out.push_str("::1\tlocalhost ip6-localhost ip6-loopback\n");
    out.push_str("fe00::0\tip6-localnet\n");
    out.push_str("fe00::0\tip6-mcastprefix\n");
    out.push_str("fe00::1\tip6-allnodes\n");
    out.push_str("fe00::2\tip6-allrouters\n");
    for ip in ips {
        match domain {
            Some(d) => out.push_str(&format!("{ip}\t{hostname}.{d}\t{hostname}\n")),
            None => out.push_str(&format!("{ip}\t{hostname}\n")),
        }
    }
    out.push_str(&alias_entries(aliases));
    out
}

/// The hosts file of a host-network pod: the node's, plus `hostAliases`
/// (`nodeHostsFileContent`).
pub(crate) fn host_network_hosts(node_hosts: &str, aliases: &[HostAlias]) -> String {
    let mut out = String::from("# Kubernetes-managed hosts file (host network).\n");
    out.push_str(node_hosts);
    out.push_str(&alias_entries(aliases));
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;

    fn pod(name: &str, hostname: Option<&str>, subdomain: Option<&str>, fqdn: bool) -> Pod {
        let mut p = Pod {
            spec: Some(PodSpec {
                hostname: hostname.map(str::to_string),
                subdomain: subdomain.map(str::to_string),
                set_hostname_as_fqdn: Some(fqdn),
                ..Default::default()
            }),
            ..Default::default()
        };
        p.metadata.name = Some(name.into());
        p.metadata.namespace = Some("shop".into());
        p
    }

    #[test]
    fn hostnames_and_domains_as_the_kubelet_makes_them() {
        assert_eq!(
            hostname_and_domain(&pod("web-0", None, None, false), "cluster.local"),
            PodHostname {
                hostname: "web-0".into(),
                domain: None
            }
        );
        assert_eq!(
            hostname_and_domain(
                &pod("web-0", Some("front"), Some("svc1"), false),
                "cluster.local"
            ),
            PodHostname {
                hostname: "front".into(),
                domain: Some("svc1.shop.svc.cluster.local".into())
            }
        );
        let long = format!("{}-{}", "a".repeat(62), "bcd");
        assert_eq!(
            hostname_and_domain(&pod(&long, None, None, false), "").hostname,
            "a".repeat(62)
        );
        assert_eq!(
            sandbox_hostname(&pod("web-0", None, Some("svc1"), true), "cluster.local"),
            "web-0.svc1.shop.svc.cluster.local"
        );
        assert_eq!(
            sandbox_hostname(&pod("web-0", None, None, true), "cluster.local"),
            "web-0"
        );
    }

    #[test]
    fn hosts_files_match_the_kubelets() {
        let aliases = vec![HostAlias {
            ip: "10.1.2.3".into(),
            hostnames: Some(vec!["foo.local".into(), "bar.local".into()]),
        }];
        let f = managed_hosts(
            &["10.88.0.5".into()],
            "web-0",
            Some("svc1.shop.svc.cluster.local"),
            &aliases,
        );
        assert_eq!(
            f,
            "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n10.88.0.5\tweb-0.svc1.shop.svc.cluster.local\tweb-0\n\n# Entries added by HostAliases.\n10.1.2.3\tfoo.local\tbar.local\n"
        );
        assert!(
            managed_hosts(&["10.88.0.5".into()], "web-0", None, &[])
                .ends_with("10.88.0.5\tweb-0\n")
        );
        assert_eq!(
            host_network_hosts("127.0.0.1 localhost\n", &aliases),
            "# Kubernetes-managed hosts file (host network).\n127.0.0.1 localhost\n\n# Entries added by HostAliases.\n10.1.2.3\tfoo.local\tbar.local\n"
        );
    }
}
