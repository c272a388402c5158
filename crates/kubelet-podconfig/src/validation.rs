//! Pod validation, in the API server's style (`ValidatePodCreate`), shared by every pod source
//! of this crate (files, the manifest URL, the push endpoint).
//!
//! Every problem is reported as a field error formatted like the API server's
//! (`spec.containers[1].name: Duplicate value: "app"`), and validation reports all problems it
//! finds, not only the first. What is checked:
//!
//! - `metadata`: the name is an RFC 1123 subdomain, the namespace an RFC 1123 label, label keys
//!   and annotation keys are qualified names, label values are valid label values.
//! - `spec`: `restartPolicy` is `Always`, `OnFailure` or `Never`; `dnsPolicy` one of the four
//!   policies; `terminationGracePeriodSeconds` is not negative, `activeDeadlineSeconds` positive.
//! - volumes: names are RFC 1123 labels and unique, each volume has exactly one source, a
//!   `hostPath` has a path.
//! - containers (init, regular, ephemeral): names are RFC 1123 labels unique across all of them,
//!   an image is required, ports are within 1..=65535 with a known protocol, volume mounts name a
//!   declared volume with a unique, non-empty mount path, environment variables have names, and
//!   `restartPolicy` is only set on init containers, as `Always` (sidecars).
//! - probes: exactly one handler of `exec`, `httpGet`, `tcpSocket`, `grpc`; non-negative
//!   timings; `successThreshold` 1 for liveness and startup probes;
//!   `terminationGracePeriodSeconds` not set on readiness probes; ports in range; no probes on
//!   init containers that are not sidecars.
//! - static pods ([`ValidationOptions::static_pod`]): no references to API objects (service
//!   accounts, secrets, config maps, persistent volume claims, cluster trust bundles, resource
//!   claims), unless the agent also has an API source
//!   ([`ValidationOptions::allow_api_references`]); the message is the kubelet's
//!   `static pods may not reference <resource>`.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvFromSource, EnvVar, Pod, PodSpec, Probe, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

const DNS1123_LABEL_MAX_LENGTH: usize = 63;
const DNS1123_SUBDOMAIN_MAX_LENGTH: usize = 253;
const QUALIFIED_NAME_MAX_LENGTH: usize = 63;
const LABEL_VALUE_MAX_LENGTH: usize = 63;
const IANA_SVC_NAME_MAX_LENGTH: usize = 15;

const DNS1123_LABEL_ERR_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const DNS1123_SUBDOMAIN_ERR_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const QUALIFIED_NAME_ERR_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const LABEL_VALUE_ERR_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";
const PORT_RANGE_MSG: &str = "must be between 1 and 65535, inclusive";

/// Pod restart policies the API accepts.
pub const RESTART_POLICIES: [&str; 3] = ["Always", "OnFailure", "Never"];
/// DNS policies the API accepts.
pub const DNS_POLICIES: [&str; 4] = ["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"];
/// Port protocols the API accepts.
pub const PROTOCOLS: [&str; 3] = ["TCP", "UDP", "SCTP"];

/// What kind of pod is validated, and what the agent around it can resolve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ValidationOptions {
    /// The pod is a static pod (from a file, a URL or the push endpoint): it runs without the
    /// API server, so references to API objects are rejected unless
    /// [`allow_api_references`](Self::allow_api_references) is set.
    pub static_pod: bool,
    /// The agent also has an API server source, so a static pod may reference API objects
    /// (service accounts, secrets, config maps, claims).
    pub allow_api_references: bool,
}

impl ValidationOptions {
    /// Options for static pods of an agent without an API source (the strict default of every
    /// source in this crate).
    pub fn static_pod() -> Self {
        Self {
            static_pod: true,
            allow_api_references: false,
        }
    }

    /// Options for pods that came from an API server (no static-pod rules).
    pub fn api_pod() -> Self {
        Self {
            static_pod: false,
            allow_api_references: true,
        }
    }

    /// Allow (or forbid) static pods to reference API objects: set when the agent has an API
    /// source that can resolve them.
    pub fn allow_api_references(mut self, allow: bool) -> Self {
        self.allow_api_references = allow;
        self
    }
}

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

/// Problems with `value` as a qualified name (label and annotation keys: an optional DNS
/// subdomain prefix and `/`, then a name of at most 63 characters matching
/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`); empty if it is one.
pub fn is_qualified_name(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else {
                for msg in is_dns1123_subdomain(prefix) {
                    errs.push(format!("prefix part {msg}"));
                }
            }
            *name
        }
        _ => {
            errs.push(format!(
                "a qualified name {QUALIFIED_NAME_ERR_MSG} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else {
        if name.len() > QUALIFIED_NAME_MAX_LENGTH {
            errs.push(format!(
                "name part must be no more than {QUALIFIED_NAME_MAX_LENGTH} characters"
            ));
        }
        if !qualified_part_matches(name) {
            errs.push(QUALIFIED_NAME_ERR_MSG.to_string());
        }
    }
    errs
}

/// Problems with `value` as a label value (empty, or at most 63 characters matching
/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`); empty if it is one.
pub fn is_valid_label_value(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > LABEL_VALUE_MAX_LENGTH {
        errs.push(format!(
            "must be no more than {LABEL_VALUE_MAX_LENGTH} characters"
        ));
    }
    if !value.is_empty() && !qualified_part_matches(value) {
        errs.push(LABEL_VALUE_ERR_MSG.to_string());
    }
    errs
}

/// Problems with `value` as an IANA service name (a named port): at most 15 lowercase
/// alphanumerics or '-', at least one letter, no leading, trailing or double '-'.
pub fn is_valid_port_name(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > IANA_SVC_NAME_MAX_LENGTH {
        errs.push(format!(
            "must be no more than {IANA_SVC_NAME_MAX_LENGTH} characters"
        ));
    }
    if !value
        .bytes()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
    {
        errs.push("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)".into());
    }
    if value.contains("--") {
        errs.push("must not contain consecutive hyphens".into());
    }
    if !value.bytes().any(|c| c.is_ascii_lowercase()) {
        errs.push("must contain at least one letter (a-z)".into());
    }
    if value.starts_with('-') || value.ends_with('-') {
        errs.push("must not begin or end with a hyphen".into());
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

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, without the length limit.
fn qualified_part_matches(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
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

/// `field: Invalid value: 42: detail`.
fn invalid_num(field: &str, value: i64, detail: &str) -> String {
    format!("{field}: Invalid value: {value}: {detail}")
}

/// `field: Unsupported value: "value": supported values: "a", "b"`.
fn unsupported(field: &str, value: &str, supported: &[&str]) -> String {
    format!(
        "{field}: Unsupported value: {value:?}: supported values: {}",
        quoted_list(supported)
    )
}

/// Validate a pod as the API server would on create, with the default options for a static pod
/// of an agent without an API source ([`ValidationOptions::static_pod`]). Returns every problem
/// found; empty means valid. See the [module docs](self) for what is checked.
pub fn validate_pod(pod: &Pod) -> Vec<String> {
    validate_pod_with(pod, &ValidationOptions::static_pod())
}

/// [`validate_pod`] with explicit options.
pub fn validate_pod_with(pod: &Pod, options: &ValidationOptions) -> Vec<String> {
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
    for (key, value) in pod.metadata.labels.iter().flatten() {
        for msg in is_qualified_name(key) {
            errs.push(invalid("metadata.labels", key, &msg));
        }
        for msg in is_valid_label_value(value) {
            errs.push(invalid(&format!("metadata.labels[{key}]"), value, &msg));
        }
    }
    for key in pod.metadata.annotations.iter().flatten().map(|(k, _)| k) {
        for msg in is_qualified_name(&key.to_lowercase()) {
            errs.push(invalid("metadata.annotations", key, &msg));
        }
    }

    let Some(spec) = pod.spec.as_ref() else {
        errs.push(required("spec"));
        return errs;
    };
    validate_spec(spec, &mut errs);
    if options.static_pod
        && !options.allow_api_references
        && let Some(resource) = api_object_reference(spec)
    {
        errs.push(format!("static pods may not reference {resource}"));
    }
    errs
}

fn validate_spec(spec: &PodSpec, errs: &mut Vec<String>) {
    if let Some(policy) = spec.restart_policy.as_deref()
        && !RESTART_POLICIES.contains(&policy)
    {
        errs.push(unsupported("spec.restartPolicy", policy, &RESTART_POLICIES));
    }
    if let Some(policy) = spec.dns_policy.as_deref()
        && !DNS_POLICIES.contains(&policy)
    {
        errs.push(unsupported("spec.dnsPolicy", policy, &DNS_POLICIES));
    }
    validate_dns(spec, errs);
    for (i, alias) in spec.host_aliases.iter().flatten().enumerate() {
        if alias.ip.parse::<std::net::IpAddr>().is_err() {
            errs.push(invalid(
                &format!("spec.hostAliases[{i}].ip"),
                &alias.ip,
                "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
            ));
        }
        for (j, h) in alias.hostnames.iter().flatten().enumerate() {
            for msg in is_dns1123_subdomain(h) {
                errs.push(invalid(
                    &format!("spec.hostAliases[{i}].hostnames[{j}]"),
                    h,
                    &msg,
                ));
            }
        }
    }
    for (field, value) in [
        ("spec.hostname", &spec.hostname),
        ("spec.subdomain", &spec.subdomain),
    ] {
        if let Some(v) = value.as_deref().filter(|v| !v.is_empty()) {
            for msg in is_dns1123_label(v) {
                errs.push(invalid(field, v, &msg));
            }
        }
    }
    if let Some(grace) = spec.termination_grace_period_seconds
        && grace < 0
    {
        errs.push(invalid_num(
            "spec.terminationGracePeriodSeconds",
            grace,
            "must be greater than or equal to 0",
        ));
    }
    if let Some(deadline) = spec.active_deadline_seconds
        && deadline <= 0
    {
        errs.push(invalid_num(
            "spec.activeDeadlineSeconds",
            deadline,
            "must be between 1 and 2147483647, inclusive",
        ));
    }

    let volumes = validate_volumes(spec.volumes.as_deref().unwrap_or_default(), errs);

    let mut names = HashSet::new();
    if spec.containers.is_empty() {
        errs.push(required("spec.containers"));
    }
    for (i, c) in spec.containers.iter().enumerate() {
        let path = format!("spec.containers[{i}]");
        validate_container(c, &path, &volumes, &mut names, errs);
        if let Some(policy) = c.restart_policy.as_deref() {
            errs.push(format!(
                "{path}.restartPolicy: Forbidden: may not be set for non-init containers (got {policy:?})"
            ));
        }
        validate_probe(c.liveness_probe.as_ref(), &path, ProbeKind::Liveness, errs);
        validate_probe(
            c.readiness_probe.as_ref(),
            &path,
            ProbeKind::Readiness,
            errs,
        );
        validate_probe(c.startup_probe.as_ref(), &path, ProbeKind::Startup, errs);
    }
    for (i, c) in spec.init_containers.iter().flatten().enumerate() {
        let path = format!("spec.initContainers[{i}]");
        validate_container(c, &path, &volumes, &mut names, errs);
        let sidecar = c.restart_policy.as_deref() == Some("Always");
        if let Some(policy) = c.restart_policy.as_deref()
            && !sidecar
        {
            errs.push(unsupported(
                &format!("{path}.restartPolicy"),
                policy,
                &["Always"],
            ));
        }
        if sidecar {
            validate_probe(c.liveness_probe.as_ref(), &path, ProbeKind::Liveness, errs);
            validate_probe(
                c.readiness_probe.as_ref(),
                &path,
                ProbeKind::Readiness,
                errs,
            );
            validate_probe(c.startup_probe.as_ref(), &path, ProbeKind::Startup, errs);
        } else {
            for (probe, field) in [
                (&c.liveness_probe, "livenessProbe"),
                (&c.readiness_probe, "readinessProbe"),
                (&c.startup_probe, "startupProbe"),
            ] {
                if probe.is_some() {
                    errs.push(format!(
                        "{path}.{field}: Forbidden: may not be set for init containers without restartPolicy=Always"
                    ));
                }
            }
        }
    }
    for (i, c) in spec.ephemeral_containers.iter().flatten().enumerate() {
        let path = format!("spec.ephemeralContainers[{i}]");
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
    }
}

/// Validate the volumes; returns the declared names.
fn validate_volumes(volumes: &[Volume], errs: &mut Vec<String>) -> HashSet<String> {
    let mut names = HashSet::new();
    for (i, v) in volumes.iter().enumerate() {
        let path = format!("spec.volumes[{i}]");
        if v.name.is_empty() {
            errs.push(required(&format!("{path}.name")));
        } else {
            for msg in is_dns1123_label(&v.name) {
                errs.push(invalid(&format!("{path}.name"), &v.name, &msg));
            }
            if !names.insert(v.name.clone()) {
                errs.push(format!("{path}.name: Duplicate value: {:?}", v.name));
            }
        }
        let sources = volume_sources(v);
        match sources.as_slice() {
            [] => errs.push(format!("{}: must specify a volume type", required(&path))),
            [_] => {}
            [_, rest @ ..] => {
                for extra in rest {
                    errs.push(format!(
                        "{path}.{extra}: Forbidden: may not specify more than 1 volume type"
                    ));
                }
            }
        }
        if let Some(hp) = v.host_path.as_ref()
            && hp.path.is_empty()
        {
            errs.push(required(&format!("{path}.hostPath.path")));
        }
    }
    names
}

/// The JSON names of the volume sources set on `v`, in the API's field order.
fn volume_sources(v: &Volume) -> Vec<&'static str> {
    let set: [(bool, &'static str); 30] = [
        (v.host_path.is_some(), "hostPath"),
        (v.empty_dir.is_some(), "emptyDir"),
        (v.gce_persistent_disk.is_some(), "gcePersistentDisk"),
        (v.aws_elastic_block_store.is_some(), "awsElasticBlockStore"),
        (v.git_repo.is_some(), "gitRepo"),
        (v.secret.is_some(), "secret"),
        (v.nfs.is_some(), "nfs"),
        (v.iscsi.is_some(), "iscsi"),
        (v.glusterfs.is_some(), "glusterfs"),
        (v.persistent_volume_claim.is_some(), "persistentVolumeClaim"),
        (v.rbd.is_some(), "rbd"),
        (v.flex_volume.is_some(), "flexVolume"),
        (v.cinder.is_some(), "cinder"),
        (v.cephfs.is_some(), "cephfs"),
        (v.flocker.is_some(), "flocker"),
        (v.downward_api.is_some(), "downwardAPI"),
        (v.fc.is_some(), "fc"),
        (v.azure_file.is_some(), "azureFile"),
        (v.config_map.is_some(), "configMap"),
        (v.vsphere_volume.is_some(), "vsphereVolume"),
        (v.quobyte.is_some(), "quobyte"),
        (v.azure_disk.is_some(), "azureDisk"),
        (v.photon_persistent_disk.is_some(), "photonPersistentDisk"),
        (v.projected.is_some(), "projected"),
        (v.portworx_volume.is_some(), "portworxVolume"),
        (v.scale_io.is_some(), "scaleIO"),
        (v.storageos.is_some(), "storageos"),
        (v.csi.is_some(), "csi"),
        (v.ephemeral.is_some(), "ephemeral"),
        (v.image.is_some(), "image"),
    ];
    set.into_iter()
        .filter(|(s, _)| *s)
        .map(|(_, n)| n)
        .collect()
}

fn validate_container(
    c: &Container,
    path: &str,
    volumes: &HashSet<String>,
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
    validate_ports(c.ports.as_deref().unwrap_or_default(), path, errs);
    validate_resources(c, path, errs);
    validate_env(
        c.env.as_deref().unwrap_or_default(),
        c.env_from.as_deref().unwrap_or_default(),
        path,
        errs,
    );
    validate_mounts(
        c.volume_mounts.as_deref().unwrap_or_default(),
        path,
        volumes,
        errs,
    );
}

/// The API server's `validateDNSPolicy`/`validatePodDNSConfig`.
fn validate_dns(spec: &PodSpec, errs: &mut Vec<String>) {
    let policy = spec.dns_policy.as_deref().unwrap_or("ClusterFirst");
    let Some(dns) = spec.dns_config.as_ref() else {
        if policy == "None" {
            errs.push(format!(
                "{}: must provide `dnsConfig` when `dnsPolicy` is None",
                required("spec.dnsConfig")
            ));
        }
        return;
    };
    let servers = dns.nameservers.as_deref().unwrap_or_default();
    if policy == "None" && servers.is_empty() {
        errs.push(format!(
            "{}: must provide at least one DNS nameserver when `dnsPolicy` is None",
            required("spec.dnsConfig.nameservers")
        ));
    }
    if servers.len() > kubelet_core::dns::MAX_NAMESERVERS {
        errs.push(format!(
            "spec.dnsConfig.nameservers: Invalid value: {servers:?}: must not have more than {} nameservers",
            kubelet_core::dns::MAX_NAMESERVERS
        ));
    }
    for (i, ns) in servers.iter().enumerate() {
        if ns.parse::<std::net::IpAddr>().is_err() {
            errs.push(invalid(
                &format!("spec.dnsConfig.nameservers[{i}]"),
                ns,
                "must be a valid IP address",
            ));
        }
    }
    let searches = dns.searches.as_deref().unwrap_or_default();
    if searches.len() > kubelet_core::dns::MAX_SEARCH_PATHS {
        errs.push(format!(
            "spec.dnsConfig.searches: Invalid value: {searches:?}: must not have more than {} search paths",
            kubelet_core::dns::MAX_SEARCH_PATHS
        ));
    }
    let chars = searches.join(" ").len();
    if chars > kubelet_core::dns::MAX_SEARCH_CHARS {
        errs.push(format!(
            "spec.dnsConfig.searches: Invalid value: {searches:?}: must not have more than {} characters (including spaces) in the search list",
            kubelet_core::dns::MAX_SEARCH_CHARS
        ));
    }
    for (i, s) in searches.iter().enumerate() {
        // A trailing dot is allowed (a fully qualified name).
        let name = s.strip_suffix('.').unwrap_or(s);
        for msg in is_dns1123_subdomain(name) {
            errs.push(invalid(&format!("spec.dnsConfig.searches[{i}]"), s, &msg));
        }
    }
    for (i, o) in dns.options.iter().flatten().enumerate() {
        if o.name.as_deref().is_none_or(str::is_empty) {
            errs.push(required(&format!("spec.dnsConfig.options[{i}].name")));
        }
    }
}

/// The API server's `ValidateResourceRequirements`: quantities parse and are not negative, and
/// no request exceeds its limit.
fn validate_resources(c: &Container, path: &str, errs: &mut Vec<String>) {
    let Some(resources) = c.resources.as_ref() else {
        return;
    };
    let mut parsed = |kind: &str,
                      map: &Option<
        std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >|
     -> Vec<(String, String, i128)> {
        let mut out = Vec::new();
        for (name, q) in map.iter().flatten() {
            let field = format!("{path}.resources.{kind}[{name}]");
            match kubelet_api::quantity::parse_nanos(&q.0) {
                None => errs.push(invalid(
                    &field,
                    &q.0,
                    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
                )),
                Some(n) if n < 0 => {
                    errs.push(invalid(&field, &q.0, "must be greater than or equal to 0"))
                }
                Some(n) => out.push((name.clone(), q.0.clone(), n)),
            }
        }
        out
    };
    let limits = parsed("limits", &resources.limits);
    let requests = parsed("requests", &resources.requests);
    for (name, value, n) in &requests {
        if let Some((_, limit, l)) = limits.iter().find(|(ln, _, _)| ln == name)
            && n > l
        {
            errs.push(invalid(
                &format!("{path}.resources.requests[{name}]"),
                value,
                &format!("must be less than or equal to {name} limit of {limit}"),
            ));
        }
    }
}

fn validate_ports(ports: &[ContainerPort], path: &str, errs: &mut Vec<String>) {
    let mut port_names = HashSet::new();
    for (j, port) in ports.iter().enumerate() {
        let ppath = format!("{path}.ports[{j}]");
        if let Some(name) = port.name.as_deref() {
            for msg in is_valid_port_name(name) {
                errs.push(invalid(&format!("{ppath}.name"), name, &msg));
            }
            if !port_names.insert(name) {
                errs.push(format!("{ppath}.name: Duplicate value: {name:?}"));
            }
        }
        if port.container_port == 0 {
            errs.push(required(&format!("{ppath}.containerPort")));
        } else if !(1..=65535).contains(&port.container_port) {
            errs.push(invalid_num(
                &format!("{ppath}.containerPort"),
                port.container_port.into(),
                PORT_RANGE_MSG,
            ));
        }
        if let Some(host_port) = port.host_port
            && host_port != 0
            && !(1..=65535).contains(&host_port)
        {
            errs.push(invalid_num(
                &format!("{ppath}.hostPort"),
                host_port.into(),
                PORT_RANGE_MSG,
            ));
        }
        if let Some(proto) = port.protocol.as_deref()
            && !PROTOCOLS.contains(&proto)
        {
            errs.push(unsupported(&format!("{ppath}.protocol"), proto, &PROTOCOLS));
        }
    }
}

fn validate_env(env: &[EnvVar], env_from: &[EnvFromSource], path: &str, errs: &mut Vec<String>) {
    for (j, var) in env.iter().enumerate() {
        let vpath = format!("{path}.env[{j}]");
        if var.name.is_empty() {
            errs.push(required(&format!("{vpath}.name")));
        }
        if let Some(from) = var.value_from.as_ref() {
            let n = [
                from.field_ref.is_some(),
                from.resource_field_ref.is_some(),
                from.config_map_key_ref.is_some(),
                from.secret_key_ref.is_some(),
            ]
            .into_iter()
            .filter(|s| *s)
            .count();
            if n == 0 {
                errs.push(format!(
                    "{}: must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`",
                    required(&format!("{vpath}.valueFrom"))
                ));
            } else if n > 1 {
                errs.push(format!(
                    "{vpath}.valueFrom: Invalid value: \"\": may not have more than one field specified at a time"
                ));
            }
            if var.value.as_deref().is_some_and(|v| !v.is_empty()) {
                errs.push(format!(
                    "{vpath}.valueFrom: Invalid value: \"\": may not be specified when `value` is not empty"
                ));
            }
        }
    }
    for (j, from) in env_from.iter().enumerate() {
        if from.config_map_ref.is_some() == from.secret_ref.is_some() {
            errs.push(format!(
                "{path}.envFrom[{j}]: Invalid value: \"\": must specify one of: `configMapRef` or `secretRef`"
            ));
        }
    }
}

fn validate_mounts(
    mounts: &[VolumeMount],
    path: &str,
    volumes: &HashSet<String>,
    errs: &mut Vec<String>,
) {
    let mut paths = HashSet::new();
    for (j, m) in mounts.iter().enumerate() {
        let mpath = format!("{path}.volumeMounts[{j}]");
        if m.name.is_empty() {
            errs.push(required(&format!("{mpath}.name")));
        } else if !volumes.contains(&m.name) {
            errs.push(format!("{mpath}.name: Not found: {:?}", m.name));
        }
        if m.mount_path.is_empty() {
            errs.push(required(&format!("{mpath}.mountPath")));
        } else if !paths.insert(m.mount_path.as_str()) {
            errs.push(invalid(
                &format!("{mpath}.mountPath"),
                &m.mount_path,
                "must be unique",
            ));
        }
        if m.sub_path.is_some() && m.sub_path_expr.is_some() {
            errs.push(invalid(
                &format!("{mpath}.subPathExpr"),
                m.sub_path_expr.as_deref().unwrap_or_default(),
                "subPathExpr and subPath are mutually exclusive",
            ));
        }
    }
}

/// Which probe a [`Probe`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProbeKind {
    Liveness,
    Readiness,
    Startup,
}

impl ProbeKind {
    fn field(self) -> &'static str {
        match self {
            ProbeKind::Liveness => "livenessProbe",
            ProbeKind::Readiness => "readinessProbe",
            ProbeKind::Startup => "startupProbe",
        }
    }
}

fn validate_probe(probe: Option<&Probe>, container: &str, kind: ProbeKind, errs: &mut Vec<String>) {
    let Some(p) = probe else { return };
    let path = format!("{container}.{}", kind.field());
    let handlers: Vec<&str> = [
        (p.exec.is_some(), "exec"),
        (p.http_get.is_some(), "httpGet"),
        (p.tcp_socket.is_some(), "tcpSocket"),
        (p.grpc.is_some(), "grpc"),
    ]
    .into_iter()
    .filter(|(s, _)| *s)
    .map(|(_, n)| n)
    .collect();
    match handlers.as_slice() {
        [] => errs.push(format!("{}: must specify a handler type", required(&path))),
        [_] => {}
        [_, rest @ ..] => {
            for extra in rest {
                errs.push(format!(
                    "{path}.{extra}: Forbidden: may not specify more than 1 handler type"
                ));
            }
        }
    }
    if let Some(exec) = p.exec.as_ref()
        && exec.command.as_deref().unwrap_or_default().is_empty()
    {
        errs.push(required(&format!("{path}.exec.command")));
    }
    if let Some(http) = p.http_get.as_ref() {
        validate_port_ref(&http.port, &format!("{path}.httpGet.port"), errs);
        if let Some(scheme) = http.scheme.as_deref()
            && scheme != "HTTP"
            && scheme != "HTTPS"
        {
            errs.push(unsupported(
                &format!("{path}.httpGet.scheme"),
                scheme,
                &["HTTP", "HTTPS"],
            ));
        }
    }
    if let Some(tcp) = p.tcp_socket.as_ref() {
        validate_port_ref(&tcp.port, &format!("{path}.tcpSocket.port"), errs);
    }
    if let Some(grpc) = p.grpc.as_ref()
        && !(1..=65535).contains(&grpc.port)
    {
        errs.push(invalid_num(
            &format!("{path}.grpc.port"),
            grpc.port.into(),
            PORT_RANGE_MSG,
        ));
    }
    for (value, field) in [
        (p.initial_delay_seconds, "initialDelaySeconds"),
        (p.timeout_seconds, "timeoutSeconds"),
        (p.period_seconds, "periodSeconds"),
        (p.success_threshold, "successThreshold"),
        (p.failure_threshold, "failureThreshold"),
    ] {
        if let Some(v) = value
            && v < 0
        {
            errs.push(invalid_num(
                &format!("{path}.{field}"),
                v.into(),
                "must be greater than or equal to 0",
            ));
        }
    }
    if kind != ProbeKind::Readiness
        && let Some(st) = p.success_threshold
        && st != 1
        && st >= 0
    {
        errs.push(invalid_num(
            &format!("{path}.successThreshold"),
            st.into(),
            "must be 1",
        ));
    }
    if let Some(grace) = p.termination_grace_period_seconds {
        if kind == ProbeKind::Readiness {
            errs.push(invalid_num(
                &format!("{path}.terminationGracePeriodSeconds"),
                grace,
                "must not be set for readinessProbes",
            ));
        } else if grace <= 0 {
            errs.push(invalid_num(
                &format!("{path}.terminationGracePeriodSeconds"),
                grace,
                "must be greater than 0",
            ));
        }
    }
}

/// A probe port: a number in 1..=65535 or an IANA service name (a named container port).
fn validate_port_ref(port: &IntOrString, field: &str, errs: &mut Vec<String>) {
    match port {
        IntOrString::Int(n) if !(1..=65535).contains(n) => {
            errs.push(invalid_num(field, (*n).into(), PORT_RANGE_MSG));
        }
        IntOrString::Int(_) => {}
        IntOrString::String(name) => {
            for msg in is_valid_port_name(name) {
                errs.push(invalid(field, name, &msg));
            }
        }
    }
}

/// The kubelet's `HasAPIObjectReference`: the first kind of API object a pod spec references
/// (`serviceaccounts`, `secrets`, `configmaps`, `persistentvolumeclaims`,
/// `clustertrustbundles`, `resourceclaims`), or `None`.
pub fn api_object_reference(spec: &PodSpec) -> Option<&'static str> {
    let non_empty = |s: &Option<String>| s.as_deref().is_some_and(|s| !s.is_empty());
    if non_empty(&spec.service_account_name) || non_empty(&spec.service_account) {
        return Some("serviceaccounts");
    }
    let volumes = spec.volumes.as_deref().unwrap_or_default();
    let envs = || {
        spec.containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .map(|c| (c.env.as_deref(), c.env_from.as_deref()))
            .chain(
                spec.ephemeral_containers
                    .iter()
                    .flatten()
                    .map(|c| (c.env.as_deref(), c.env_from.as_deref())),
            )
    };
    let secret_in_env = envs().any(|(env, from)| {
        env.unwrap_or_default().iter().any(|e| {
            e.value_from
                .as_ref()
                .is_some_and(|f| f.secret_key_ref.is_some())
        }) || from
            .unwrap_or_default()
            .iter()
            .any(|f| f.secret_ref.is_some())
    });
    let secret_in_volume = volumes.iter().any(|v| {
        v.secret.is_some()
            || v.azure_file.is_some()
            || v.scale_io.is_some()
            || v.cephfs.as_ref().is_some_and(|s| s.secret_ref.is_some())
            || v.cinder.as_ref().is_some_and(|s| s.secret_ref.is_some())
            || v.flex_volume
                .as_ref()
                .is_some_and(|s| s.secret_ref.is_some())
            || v.rbd.as_ref().is_some_and(|s| s.secret_ref.is_some())
            || v.iscsi.as_ref().is_some_and(|s| s.secret_ref.is_some())
            || v.storageos.as_ref().is_some_and(|s| s.secret_ref.is_some())
            || v.csi
                .as_ref()
                .is_some_and(|s| s.node_publish_secret_ref.is_some())
            || projections(v).any(|p| p.secret.is_some())
    });
    if non_empty_vec(&spec.image_pull_secrets) || secret_in_env || secret_in_volume {
        return Some("secrets");
    }
    let config_map_in_env = envs().any(|(env, from)| {
        env.unwrap_or_default().iter().any(|e| {
            e.value_from
                .as_ref()
                .is_some_and(|f| f.config_map_key_ref.is_some())
        }) || from
            .unwrap_or_default()
            .iter()
            .any(|f| f.config_map_ref.is_some())
    });
    let config_map_in_volume = volumes
        .iter()
        .any(|v| v.config_map.is_some() || projections(v).any(|p| p.config_map.is_some()));
    if config_map_in_env || config_map_in_volume {
        return Some("configmaps");
    }
    for v in volumes {
        if projections(v).any(|p| p.cluster_trust_bundle.is_some()) {
            return Some("clustertrustbundles");
        }
        if v.persistent_volume_claim.is_some() || v.ephemeral.is_some() {
            return Some("persistentvolumeclaims");
        }
        if projections(v).any(|p| p.service_account_token.is_some()) {
            return Some("serviceaccounts");
        }
    }
    if non_empty_vec(&spec.resource_claims) {
        return Some("resourceclaims");
    }
    None
}

fn non_empty_vec<T>(v: &Option<Vec<T>>) -> bool {
    v.as_ref().is_some_and(|v| !v.is_empty())
}

fn projections(v: &Volume) -> impl Iterator<Item = &k8s_openapi::api::core::v1::VolumeProjection> {
    v.projected.iter().flat_map(|p| p.sources.iter().flatten())
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
    use k8s_openapi::api::core::v1::{
        ConfigMapVolumeSource, EmptyDirVolumeSource, EnvVarSource, ExecAction, GRPCAction,
        HTTPGetAction, HostPathVolumeSource, PersistentVolumeClaimVolumeSource, PodResourceClaim,
        ProjectedVolumeSource, SecretKeySelector, SecretVolumeSource,
        ServiceAccountTokenProjection, TCPSocketAction, VolumeProjection,
    };

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
    fn host_aliases_and_hostnames_are_validated() {
        use k8s_openapi::api::core::v1::HostAlias;
        let mut p = pod(vec![container("app", "busybox")]);
        let spec = p.spec.as_mut().expect("spec");
        spec.host_aliases = Some(vec![HostAlias {
            ip: "10.1.2.300".into(),
            hostnames: Some(vec!["ok.local".into(), "Not_OK".into()]),
        }]);
        spec.hostname = Some("Front".into());
        let errs = validate_pod(&p);
        assert!(
            errs.iter()
                .any(|e| e.starts_with("spec.hostAliases[0].ip: Invalid value: \"10.1.2.300\"")),
            "{errs:?}"
        );
        assert!(
            errs.iter()
                .any(|e| e.starts_with("spec.hostAliases[0].hostnames[1]")),
            "{errs:?}"
        );
        assert!(
            errs.iter().any(|e| e.starts_with("spec.hostname")),
            "{errs:?}"
        );
        assert_eq!(errs.len(), 3, "{errs:?}");
    }

    #[test]
    fn dns_settings_are_validated_as_the_api_server_does() {
        use k8s_openapi::api::core::v1::PodDNSConfig;
        let with = |policy: Option<&str>, dns: Option<PodDNSConfig>| {
            let mut p = pod(vec![container("app", "busybox")]);
            let spec = p.spec.as_mut().expect("spec");
            spec.dns_policy = policy.map(str::to_string);
            spec.dns_config = dns;
            validate_pod(&p)
        };
        assert!(
            with(Some("None"), None)[0]
                .contains("must provide `dnsConfig` when `dnsPolicy` is None")
        );
        let many = PodDNSConfig {
            nameservers: Some(vec![
                "1.1.1.1".into(),
                "2.2.2.2".into(),
                "3.3.3.3".into(),
                "4.4.4.4".into(),
            ]),
            ..Default::default()
        };
        assert!(with(None, Some(many))[0].contains("must not have more than 3 nameservers"));
        let bad = PodDNSConfig {
            nameservers: Some(vec!["not-an-ip".into()]),
            searches: Some(vec!["Bad_Domain".into()]),
            ..Default::default()
        };
        let errs = with(None, Some(bad));
        assert!(
            errs.iter()
                .any(|e| e.starts_with("spec.dnsConfig.nameservers[0]")),
            "{errs:?}"
        );
        assert!(
            errs.iter()
                .any(|e| e.starts_with("spec.dnsConfig.searches[0]")),
            "{errs:?}"
        );
        let good = PodDNSConfig {
            nameservers: Some(vec!["10.0.0.10".into()]),
            searches: Some(vec!["svc.cluster.local".into(), "example.org.".into()]),
            ..Default::default()
        };
        assert!(with(Some("None"), Some(good)).is_empty());
    }

    #[test]
    fn negative_or_unparsable_quantities_and_requests_over_limits_are_rejected() {
        use k8s_openapi::api::core::v1::ResourceRequirements;
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let with = |limits: &[(&str, &str)], requests: &[(&str, &str)]| {
            let mut c = container("app", "busybox");
            let map = |kv: &[(&str, &str)]| {
                Some(
                    kv.iter()
                        .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                        .collect(),
                )
            };
            c.resources = Some(ResourceRequirements {
                limits: map(limits),
                requests: map(requests),
                ..Default::default()
            });
            validate_pod(&pod(vec![c]))
        };
        assert_eq!(
            with(&[("cpu", "-1")], &[]),
            vec![
                "spec.containers[0].resources.limits[cpu]: Invalid value: \"-1\": must be greater than or equal to 0"
                    .to_string()
            ]
        );
        assert!(with(&[], &[("memory", "lots")])[0].contains("quantities must match"));
        assert_eq!(
            with(&[("memory", "64Mi")], &[("memory", "128Mi")]),
            vec![
                "spec.containers[0].resources.requests[memory]: Invalid value: \"128Mi\": must be less than or equal to memory limit of 64Mi"
                    .to_string()
            ]
        );
        assert!(
            with(
                &[("cpu", "500m"), ("memory", "64Mi")],
                &[("cpu", "0.5"), ("memory", "0")]
            )
            .is_empty()
        );
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

    fn volume(name: &str) -> Volume {
        Volume {
            name: name.into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        }
    }

    fn mount(name: &str, path: &str) -> VolumeMount {
        VolumeMount {
            name: name.into(),
            mount_path: path.into(),
            ..Default::default()
        }
    }

    fn exec_probe() -> Probe {
        Probe {
            exec: Some(ExecAction {
                command: Some(vec!["true".into()]),
            }),
            ..Default::default()
        }
    }

    fn with_spec(f: impl FnOnce(&mut PodSpec)) -> Pod {
        let mut p = pod(vec![container("app", "img")]);
        if let Some(s) = p.spec.as_mut() {
            f(s);
        }
        p
    }

    fn with_app(f: impl FnOnce(&mut Container)) -> Pod {
        with_spec(|s| f(&mut s.containers[0]))
    }

    /// One table of (case, pod, expected errors, in order).
    #[test]
    fn each_rule_reports_the_api_servers_message() {
        let cases: Vec<(&str, Pod, Vec<&str>)> = vec![
            (
                "a bad label key and value",
                {
                    let mut p = pod(vec![container("app", "img")]);
                    p.metadata.labels = Some(
                        [
                            ("app".to_string(), "ok".to_string()),
                            ("bad key".to_string(), "v".to_string()),
                            ("tier".to_string(), "-x".to_string()),
                        ]
                        .into(),
                    );
                    p
                },
                vec![
                    "metadata.labels: Invalid value: \"bad key\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
                    "metadata.labels[tier]: Invalid value: \"-x\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
                ],
            ),
            (
                "a prefixed annotation key with a bad prefix",
                {
                    let mut p = pod(vec![container("app", "img")]);
                    p.metadata.annotations = Some(
                        [
                            ("example.com/ok".to_string(), String::new()),
                            ("Bad_Prefix/x".to_string(), String::new()),
                        ]
                        .into(),
                    );
                    p
                },
                vec![
                    "metadata.annotations: Invalid value: \"Bad_Prefix/x\": prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
                ],
            ),
            (
                "dnsPolicy, grace period and deadline",
                with_spec(|s| {
                    s.dns_policy = Some("Google".into());
                    s.termination_grace_period_seconds = Some(-1);
                    s.active_deadline_seconds = Some(0);
                }),
                vec![
                    "spec.dnsPolicy: Unsupported value: \"Google\": supported values: \"ClusterFirstWithHostNet\", \"ClusterFirst\", \"Default\", \"None\"",
                    "spec.terminationGracePeriodSeconds: Invalid value: -1: must be greater than or equal to 0",
                    "spec.activeDeadlineSeconds: Invalid value: 0: must be between 1 and 2147483647, inclusive",
                ],
            ),
            (
                "duplicate volume names",
                with_spec(|s| s.volumes = Some(vec![volume("data"), volume("data")])),
                vec!["spec.volumes[1].name: Duplicate value: \"data\""],
            ),
            (
                "a volume without or with two sources, a hostPath without path",
                with_spec(|s| {
                    let mut two = volume("two");
                    two.host_path = Some(HostPathVolumeSource::default());
                    s.volumes = Some(vec![
                        Volume {
                            name: "none".into(),
                            ..Default::default()
                        },
                        two,
                    ]);
                }),
                vec![
                    "spec.volumes[0]: Required value: must specify a volume type",
                    "spec.volumes[1].emptyDir: Forbidden: may not specify more than 1 volume type",
                    "spec.volumes[1].hostPath.path: Required value",
                ],
            ),
            (
                "a mount of an undeclared volume, an empty and a repeated mount path",
                with_spec(|s| {
                    s.volumes = Some(vec![volume("data")]);
                    s.containers[0].volume_mounts = Some(vec![
                        mount("data", "/data"),
                        mount("cache", "/cache"),
                        mount("data", "/data"),
                        mount("data", ""),
                    ]);
                }),
                vec![
                    "spec.containers[0].volumeMounts[1].name: Not found: \"cache\"",
                    "spec.containers[0].volumeMounts[2].mountPath: Invalid value: \"/data\": must be unique",
                    "spec.containers[0].volumeMounts[3].mountPath: Required value",
                ],
            ),
            (
                "a port protocol and a port name",
                with_app(|c| {
                    c.ports = Some(vec![ContainerPort {
                        container_port: 80,
                        protocol: Some("HTTP".into()),
                        name: Some("web_port".into()),
                        ..Default::default()
                    }])
                }),
                vec![
                    "spec.containers[0].ports[0].name: Invalid value: \"web_port\": must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)",
                    "spec.containers[0].ports[0].protocol: Unsupported value: \"HTTP\": supported values: \"TCP\", \"UDP\", \"SCTP\"",
                ],
            ),
            (
                "a probe without handler",
                with_app(|c| c.liveness_probe = Some(Probe::default())),
                vec![
                    "spec.containers[0].livenessProbe: Required value: must specify a handler type",
                ],
            ),
            (
                "a probe with two handlers",
                with_app(|c| {
                    let mut p = exec_probe();
                    p.tcp_socket = Some(TCPSocketAction {
                        port: IntOrString::Int(80),
                        ..Default::default()
                    });
                    c.readiness_probe = Some(p);
                }),
                vec![
                    "spec.containers[0].readinessProbe.tcpSocket: Forbidden: may not specify more than 1 handler type",
                ],
            ),
            (
                "successThreshold must be 1 for liveness and startup, not for readiness",
                with_app(|c| {
                    let mut p = exec_probe();
                    p.success_threshold = Some(3);
                    c.liveness_probe = Some(p.clone());
                    c.startup_probe = Some(p.clone());
                    c.readiness_probe = Some(p);
                }),
                vec![
                    "spec.containers[0].livenessProbe.successThreshold: Invalid value: 3: must be 1",
                    "spec.containers[0].startupProbe.successThreshold: Invalid value: 3: must be 1",
                ],
            ),
            (
                "negative timings, bad probe ports, grace period on readiness",
                with_app(|c| {
                    c.liveness_probe = Some(Probe {
                        http_get: Some(HTTPGetAction {
                            port: IntOrString::Int(0),
                            ..Default::default()
                        }),
                        period_seconds: Some(-5),
                        ..Default::default()
                    });
                    c.readiness_probe = Some(Probe {
                        grpc: Some(GRPCAction {
                            port: 70000,
                            service: None,
                        }),
                        termination_grace_period_seconds: Some(10),
                        ..Default::default()
                    });
                    c.startup_probe = Some(Probe {
                        tcp_socket: Some(TCPSocketAction {
                            port: IntOrString::String("Not-A-Name".into()),
                            ..Default::default()
                        }),
                        ..Default::default()
                    });
                }),
                vec![
                    "spec.containers[0].livenessProbe.httpGet.port: Invalid value: 0: must be between 1 and 65535, inclusive",
                    "spec.containers[0].livenessProbe.periodSeconds: Invalid value: -5: must be greater than or equal to 0",
                    "spec.containers[0].readinessProbe.grpc.port: Invalid value: 70000: must be between 1 and 65535, inclusive",
                    "spec.containers[0].readinessProbe.terminationGracePeriodSeconds: Invalid value: 10: must not be set for readinessProbes",
                    "spec.containers[0].startupProbe.tcpSocket.port: Invalid value: \"Not-A-Name\": must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)",
                ],
            ),
            (
                "probes on a plain init container",
                with_spec(|s| {
                    let mut init = container("init", "img");
                    init.readiness_probe = Some(exec_probe());
                    s.init_containers = Some(vec![init]);
                }),
                vec![
                    "spec.initContainers[0].readinessProbe: Forbidden: may not be set for init containers without restartPolicy=Always",
                ],
            ),
            (
                "an env var from nothing",
                with_app(|c| {
                    c.env = Some(vec![EnvVar {
                        name: "X".into(),
                        value_from: Some(EnvVarSource::default()),
                        ..Default::default()
                    }])
                }),
                vec![
                    "spec.containers[0].env[0].valueFrom: Required value: must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`",
                ],
            ),
        ];
        for (case, p, expected) in cases {
            assert_eq!(validate_pod(&p), expected, "case: {case}");
        }
    }

    #[test]
    fn a_sidecar_may_have_probes_and_mount_declared_volumes() {
        let p = with_spec(|s| {
            s.volumes = Some(vec![volume("data")]);
            let mut sidecar = container("log", "img");
            sidecar.restart_policy = Some("Always".into());
            sidecar.readiness_probe = Some(exec_probe());
            sidecar.volume_mounts = Some(vec![mount("data", "/data")]);
            s.init_containers = Some(vec![sidecar]);
            s.containers[0].liveness_probe = Some(exec_probe());
            s.containers[0].volume_mounts = Some(vec![mount("data", "/data")]);
        });
        assert_eq!(validate_pod(&p), Vec::<String>::new());
    }

    #[test]
    fn static_pods_may_not_reference_api_objects_unless_the_agent_has_an_api_source() {
        let secret_env = EnvVar {
            name: "TOKEN".into(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: "s".into(),
                    key: "k".into(),
                    optional: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let projected = |p: VolumeProjection| Volume {
            name: "p".into(),
            projected: Some(ProjectedVolumeSource {
                sources: Some(vec![p]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let cases: Vec<(Pod, &str)> = vec![
            (
                with_spec(|s| s.service_account_name = Some("builder".into())),
                "serviceaccounts",
            ),
            (
                with_app(|c| c.env = Some(vec![secret_env.clone()])),
                "secrets",
            ),
            (
                with_spec(|s| {
                    s.volumes = Some(vec![Volume {
                        name: "s".into(),
                        secret: Some(SecretVolumeSource::default()),
                        ..Default::default()
                    }])
                }),
                "secrets",
            ),
            (
                with_spec(|s| {
                    s.volumes = Some(vec![Volume {
                        name: "c".into(),
                        config_map: Some(ConfigMapVolumeSource::default()),
                        ..Default::default()
                    }])
                }),
                "configmaps",
            ),
            (
                with_spec(|s| {
                    s.volumes = Some(vec![Volume {
                        name: "c".into(),
                        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                            claim_name: "data".into(),
                            read_only: None,
                        }),
                        ..Default::default()
                    }])
                }),
                "persistentvolumeclaims",
            ),
            (
                with_spec(|s| {
                    s.volumes = Some(vec![projected(VolumeProjection {
                        service_account_token: Some(ServiceAccountTokenProjection {
                            path: "token".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })])
                }),
                "serviceaccounts",
            ),
            (
                with_spec(|s| {
                    s.resource_claims = Some(vec![PodResourceClaim {
                        name: "gpu".into(),
                        ..Default::default()
                    }])
                }),
                "resourceclaims",
            ),
        ];
        for (p, resource) in cases {
            assert_eq!(
                validate_pod(&p),
                vec![format!("static pods may not reference {resource}")]
            );
            let with_api = ValidationOptions::static_pod().allow_api_references(true);
            assert!(validate_pod_with(&p, &with_api).is_empty(), "{resource}");
            assert!(
                validate_pod_with(&p, &ValidationOptions::api_pod()).is_empty(),
                "{resource}"
            );
        }
        // Local volumes are fine.
        let p = with_spec(|s| {
            s.volumes = Some(vec![Volume {
                name: "h".into(),
                host_path: Some(HostPathVolumeSource {
                    path: "/etc".into(),
                    type_: None,
                }),
                ..Default::default()
            }])
        });
        assert!(validate_pod(&p).is_empty());
    }

    #[test]
    fn qualified_names_label_values_and_port_names() {
        assert!(is_qualified_name("app.kubernetes.io/name").is_empty());
        assert!(is_qualified_name("Name_1.x").is_empty());
        assert!(!is_qualified_name("a/b/c").is_empty());
        assert!(!is_qualified_name("/x").is_empty());
        assert!(!is_qualified_name("x/").is_empty());
        assert!(!is_qualified_name(&"a".repeat(64)).is_empty());
        assert!(is_valid_label_value("").is_empty());
        assert!(is_valid_label_value("v1.2_b-c").is_empty());
        assert!(!is_valid_label_value("a b").is_empty());
        assert!(is_valid_port_name("http-alt").is_empty());
        assert!(!is_valid_port_name("8080").is_empty());
        assert!(!is_valid_port_name("a--b").is_empty());
        assert!(!is_valid_port_name("a-very-long-port-name").is_empty());
    }
}
