//! Pod validation, in the API server's style (`ValidatePodCreate`), for pods that never went
//! through an API server: static pods from files or a URL.
//!
//! This is the subset the kubelet's static pod path needs first; it grows towards the API
//! server's full validation. Every problem is reported as a field error string formatted like
//! the API server's (`spec.containers[1].name: Duplicate value: "app"`), and validation reports
//! all problems it finds, not only the first.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::{Container, Pod};

const DNS1123_LABEL_MAX_LENGTH: usize = 63;
const DNS1123_SUBDOMAIN_MAX_LENGTH: usize = 253;

const DNS1123_LABEL_ERR_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const DNS1123_SUBDOMAIN_ERR_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

/// Pod restart policies the API accepts.
pub const RESTART_POLICIES: [&str; 3] = ["Always", "OnFailure", "Never"];

/// Problems with `value` as an RFC 1123 label (`[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63
/// characters); empty if it is one.
pub fn is_dns1123_label(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_LABEL_MAX_LENGTH {
        errs.push(format!(
            "must be no more than {DNS1123_LABEL_MAX_LENGTH} characters"
        ));
    }
    if !label_matches(value) {
        errs.push(DNS1123_LABEL_ERR_MSG.to_string());
    }
    errs
}

/// Problems with `value` as an RFC 1123 subdomain (dot-separated labels, at most 253
/// characters); empty if it is one.
pub fn is_dns1123_subdomain(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX_LENGTH {
        errs.push(format!(
            "must be no more than {DNS1123_SUBDOMAIN_MAX_LENGTH} characters"
        ));
    }
    if !value.split('.').all(label_matches) {
        errs.push(DNS1123_SUBDOMAIN_ERR_MSG.to_string());
    }
    errs
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, without the length limit.
fn label_matches(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    match (b.first(), b.last()) {
        (Some(first), Some(last)) => {
            alnum(first) && alnum(last) && b.iter().all(|c| alnum(c) || *c == b'-')
        }
        _ => false,
    }
}

/// `field: Required value`.
fn required(field: &str) -> String {
    format!("{field}: Required value")
}

/// `field: Invalid value: "value": detail`.
fn invalid(field: &str, value: &str, detail: &str) -> String {
    format!("{field}: Invalid value: {value:?}: {detail}")
}

/// Validate a pod as the API server would on create (the subset listed in the module docs):
/// the name is an RFC 1123 subdomain, the namespace an RFC 1123 label, there is at least one
/// container, container names are RFC 1123 labels unique across init and regular containers,
/// every container has an image, `restartPolicy` is `Always`, `OnFailure` or `Never`, and port
/// numbers are within 1..=65535. Returns every problem found; empty means valid.
pub fn validate_pod(pod: &Pod) -> Vec<String> {
    let mut errs = Vec::new();

    match pod.metadata.name.as_deref() {
        None | Some("") => errs.push(format!(
            "{}: name or generateName is required",
            required("metadata.name")
        )),
        Some(name) => {
            for msg in is_dns1123_subdomain(name) {
                errs.push(invalid("metadata.name", name, &msg));
            }
        }
    }
    if let Some(ns) = pod.metadata.namespace.as_deref() {
        for msg in is_dns1123_label(ns) {
            errs.push(invalid("metadata.namespace", ns, &msg));
        }
    }

    let Some(spec) = pod.spec.as_ref() else {
        errs.push(required("spec"));
        return errs;
    };

    if let Some(policy) = spec.restart_policy.as_deref()
        && !RESTART_POLICIES.contains(&policy)
    {
        errs.push(format!(
            "spec.restartPolicy: Unsupported value: {policy:?}: supported values: {}",
            quoted_list(&RESTART_POLICIES)
        ));
    }

    let mut names = HashSet::new();
    if spec.containers.is_empty() {
        errs.push(required("spec.containers"));
    }
    for (i, c) in spec.containers.iter().enumerate() {
        let path = format!("spec.containers[{i}]");
        validate_container(c, &path, &mut names, &mut errs);
        if let Some(policy) = c.restart_policy.as_deref() {
            errs.push(format!(
                "{path}.restartPolicy: Forbidden: may not be set for non-init containers (got {policy:?})"
            ));
        }
    }
    for (i, c) in spec.init_containers.iter().flatten().enumerate() {
        let path = format!("spec.initContainers[{i}]");
        validate_container(c, &path, &mut names, &mut errs);
        if let Some(policy) = c.restart_policy.as_deref()
            && policy != "Always"
        {
            errs.push(format!(
                "{path}.restartPolicy: Unsupported value: {policy:?}: supported values: \"Always\""
            ));
        }
    }
    errs
}

fn validate_container(
    c: &Container,
    path: &str,
    names: &mut HashSet<String>,
    errs: &mut Vec<String>,
) {
    if c.name.is_empty() {
        errs.push(required(&format!("{path}.name")));
    } else {
        for msg in is_dns1123_label(&c.name) {
            errs.push(invalid(&format!("{path}.name"), &c.name, &msg));
        }
        if !names.insert(c.name.clone()) {
            errs.push(format!("{path}.name: Duplicate value: {:?}", c.name));
        }
    }
    if c.image.as_deref().is_none_or(|i| i.trim().is_empty()) {
        errs.push(required(&format!("{path}.image")));
    }
    for (j, port) in c.ports.iter().flatten().enumerate() {
        let ppath = format!("{path}.ports[{j}]");
        if port.container_port == 0 {
            errs.push(required(&format!("{ppath}.containerPort")));
        } else if !(1..=65535).contains(&port.container_port) {
            errs.push(format!(
                "{ppath}.containerPort: Invalid value: {}: must be between 1 and 65535, inclusive",
                port.container_port
            ));
        }
        if let Some(host_port) = port.host_port
            && host_port != 0
            && !(1..=65535).contains(&host_port)
        {
            errs.push(format!(
                "{ppath}.hostPort: Invalid value: {host_port}: must be between 1 and 65535, inclusive"
            ));
        }
    }
}

fn quoted_list(values: &[&str]) -> String {
    values
        .iter()
        .map(|v| format!("{v:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerPort, PodSpec};

    fn container(name: &str, image: &str) -> Container {
        Container {
            name: name.into(),
            image: Some(image.into()),
            ..Default::default()
        }
    }

    fn pod(containers: Vec<Container>) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("web-node1".into());
        p.metadata.namespace = Some("default".into());
        p.spec = Some(PodSpec {
            containers,
            ..Default::default()
        });
        p
    }

    #[test]
    fn a_plain_pod_is_valid() {
        assert!(validate_pod(&pod(vec![container("app", "busybox")])).is_empty());
    }

    #[test]
    fn labels_and_subdomains_follow_rfc_1123() {
        assert!(is_dns1123_label("my-name").is_empty());
        assert!(is_dns1123_label("123-abc").is_empty());
        assert!(!is_dns1123_label("My-name").is_empty());
        assert!(!is_dns1123_label("-a").is_empty());
        assert!(!is_dns1123_label("a.b").is_empty());
        assert!(!is_dns1123_label("").is_empty());
        assert!(!is_dns1123_label(&"a".repeat(64)).is_empty());
        assert!(is_dns1123_subdomain("example.com").is_empty());
        assert!(!is_dns1123_subdomain("example..com").is_empty());
        assert!(!is_dns1123_subdomain("a_b").is_empty());
        assert!(!is_dns1123_subdomain(&"a".repeat(254)).is_empty());
    }

    #[test]
    fn duplicate_container_names_are_reported_across_init_and_regular_containers() {
        let mut p = pod(vec![container("app", "a"), container("app", "b")]);
        if let Some(s) = p.spec.as_mut() {
            s.init_containers = Some(vec![container("app", "c")]);
        }
        assert_eq!(
            validate_pod(&p),
            vec![
                "spec.containers[1].name: Duplicate value: \"app\"".to_string(),
                "spec.initContainers[0].name: Duplicate value: \"app\"".to_string(),
            ]
        );
    }

    #[test]
    fn missing_image_and_containers_are_required() {
        let mut c = container("app", "");
        c.image = None;
        assert_eq!(
            validate_pod(&pod(vec![c])),
            vec!["spec.containers[0].image: Required value".to_string()]
        );
        assert_eq!(
            validate_pod(&pod(vec![])),
            vec!["spec.containers: Required value".to_string()]
        );
    }

    #[test]
    fn bad_names_restart_policy_and_ports_are_each_reported() {
        let mut c = container("App_1", "img");
        c.ports = Some(vec![
            ContainerPort {
                container_port: 70000,
                ..Default::default()
            },
            ContainerPort {
                container_port: 0,
                host_port: Some(-1),
                ..Default::default()
            },
        ]);
        let mut p = pod(vec![c]);
        p.metadata.name = Some("Web".into());
        p.metadata.namespace = Some("kube.system".into());
        if let Some(s) = p.spec.as_mut() {
            s.restart_policy = Some("Sometimes".into());
        }
        let errs = validate_pod(&p);
        assert_eq!(errs.len(), 7, "{errs:#?}");
        assert!(
            errs[0].starts_with(
                "metadata.name: Invalid value: \"Web\": a lowercase RFC 1123 subdomain"
            )
        );
        assert!(errs[1].starts_with(
            "metadata.namespace: Invalid value: \"kube.system\": a lowercase RFC 1123 label"
        ));
        assert_eq!(
            errs[2],
            "spec.restartPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"OnFailure\", \"Never\""
        );
        assert!(errs[3].starts_with("spec.containers[0].name: Invalid value: \"App_1\""));
        assert_eq!(
            errs[4],
            "spec.containers[0].ports[0].containerPort: Invalid value: 70000: must be between 1 and 65535, inclusive"
        );
        assert_eq!(
            errs[5],
            "spec.containers[0].ports[1].containerPort: Required value"
        );
        assert_eq!(
            errs[6],
            "spec.containers[0].ports[1].hostPort: Invalid value: -1: must be between 1 and 65535, inclusive"
        );
    }

    #[test]
    fn sidecars_need_restart_policy_always() {
        let mut init = container("init", "img");
        init.restart_policy = Some("Never".into());
        let mut p = pod(vec![container("app", "img")]);
        if let Some(s) = p.spec.as_mut() {
            s.init_containers = Some(vec![init]);
        }
        assert_eq!(
            validate_pod(&p),
            vec![
                "spec.initContainers[0].restartPolicy: Unsupported value: \"Never\": supported values: \"Always\""
                    .to_string()
            ]
        );
    }
}
