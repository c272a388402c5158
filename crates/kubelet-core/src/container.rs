//! Turning a pod's container spec into a runtime [`ContainerConfig`]: environment (`envFrom`,
//! `$(VAR)` expansion, `fieldRef`s, ConfigMap and Secret key references), command and args
//! expansion, resources, mounts, and the kubelet's labels and annotations
//! (`generateContainerConfig`).

use std::collections::HashMap;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::env_objects::EnvObjects;
use kubelet_api::Lookup;
use kubelet_api::pod;
use kubelet_api::quantity;
use kubelet_api::runtime::{
    ContainerConfig, ContainerMetadata, EnvVar, Labels, LinuxResources, Mount, SecurityContext,
    SecurityProfile, labels,
};
use kubelet_api::{EventRecorder, InvolvedObject};

/// Why a container config could not be generated (the kubelet's `CreateContainerConfigError`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ContainerConfigError {
    /// An env var's `valueFrom` cannot be resolved by this agent.
    #[error("env var {name:?}: {reason}")]
    UnresolvableEnv {
        /// Variable name.
        name: String,
        /// Why.
        reason: String,
    },
    /// A resource quantity does not parse.
    #[error("resources of container {container:?}")]
    BadQuantity {
        /// Container name.
        container: String,
        /// Parse error.
        #[source]
        source: quantity::QuantityError,
    },
    /// A ConfigMap or Secret the environment needs is missing or could not be fetched; the
    /// message is the kubelet's (`configmap "x" not found`, `couldn't find key k in ConfigMap
    /// ns/x`).
    #[error("{message}")]
    ObjectUnavailable {
        /// What is missing.
        message: String,
    },
    /// `runAsNonRoot` is set and the container would run as UID 0 (the kubelet's
    /// `verifyRunAsNonRoot`).
    #[error("container's runAsUser breaks non-root policy (pod: {pod:?}, container: {container})")]
    RunAsNonRoot {
        /// The pod, as `name_namespace(uid)`.
        pod: String,
        /// The container.
        container: String,
    },
    /// A volume mount names a volume the pod does not declare or that was not set up.
    #[error("volumeMount {mount:?}: volume {volume:?} is not available")]
    MissingVolume {
        /// Mount path.
        mount: String,
        /// Volume name.
        volume: String,
    },
}

/// Expand `$(VAR)` references in `input` with `lookup`, as Kubernetes does: `$$` is a literal
/// `$`, and references that do not resolve are left as written.
pub fn expand(input: &str, lookup: &dyn Fn(&str) -> Option<String>) -> String {
    let bytes = input.as_bytes();
    let mut out = String::with_capacity(input.len());
    let mut i = 0;
    let mut last = 0;
    while i < bytes.len() {
        if bytes[i] == b'$' && i + 1 < bytes.len() {
            out.push_str(&input[last..i]);
            match bytes[i + 1] {
                b'$' => {
                    out.push('$');
                    i += 2;
                }
                b'(' => match input[i + 2..].find(')') {
                    Some(end) => {
                        let name = &input[i + 2..i + 2 + end];
                        match lookup(name) {
                            Some(v) => out.push_str(&v),
                            None => out.push_str(&input[i..i + 3 + end]),
                        }
                        i += 3 + end;
                    }
                    None => {
                        out.push_str(&input[i..]);
                        i = bytes.len();
                    }
                },
                _ => {
                    out.push('$');
                    i += 1;
                }
            }
            last = i;
        } else {
            i += 1;
        }
    }
    out.push_str(&input[last.min(input.len())..]);
    out
}

/// Context a container config is generated in.
#[derive(Debug, Clone)]
pub struct ConfigContext<'a> {
    /// Node name (`spec.nodeName` fallback).
    pub node_name: &'a str,
    /// Pod IPs, primary first.
    pub pod_ips: &'a [String],
    /// Host IP.
    pub host_ip: &'a str,
    /// Host paths of the pod's volumes, by volume name.
    pub volume_paths: &'a HashMap<String, PathBuf>,
    /// Restart count of the new instance.
    pub restart_count: u32,
    /// Whether the container is an init container (`init`) or sidecar (`sidecar`); empty for
    /// regular containers.
    pub container_type: &'a str,
    /// The ConfigMaps and Secrets the container's environment references, fetched beforehand
    /// ([`EnvObjects::fetch`]); `EnvObjects::default()` when no provider is configured.
    pub objects: &'a EnvObjects,
    /// Where to report skipped `envFrom` keys (`InvalidEnvironmentVariableNames`).
    pub recorder: Option<&'a EventRecorder>,
    /// Where `Localhost` seccomp profiles are (`<root-dir>/seccomp`).
    pub seccomp_profile_root: &'a std::path::Path,
}

fn field_ref(pod: &Pod, path: &str, ctx: &ConfigContext<'_>) -> Option<String> {
    let sel = |prefix: &str, map: Option<&std::collections::BTreeMap<String, String>>| {
        let key = path.strip_prefix(prefix)?.strip_suffix("']")?;
        Some(map.and_then(|m| m.get(key)).cloned().unwrap_or_default())
    };
    match path {
        "metadata.name" => Some(pod::name(pod).to_string()),
        "metadata.namespace" => Some(pod::namespace(pod).to_string()),
        "metadata.uid" => Some(pod::uid(pod).to_string()),
        "spec.nodeName" => Some(
            pod.spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_else(|| ctx.node_name.to_string()),
        ),
        "spec.serviceAccountName" => Some(
            pod.spec
                .as_ref()
                .and_then(|s| s.service_account_name.clone())
                .unwrap_or_default(),
        ),
        "status.podIP" => Some(ctx.pod_ips.first().cloned().unwrap_or_default()),
        "status.podIPs" => Some(ctx.pod_ips.join(",")),
        "status.hostIP" | "status.hostIPs" => Some(ctx.host_ip.to_string()),
        _ => sel("metadata.labels['", pod.metadata.labels.as_ref())
            .or_else(|| sel("metadata.annotations['", pod.metadata.annotations.as_ref())),
    }
}

/// `IsEnvVarName`: `[-._a-zA-Z][-._a-zA-Z0-9]*`.
fn is_env_var_name(k: &str) -> bool {
    let mut chars = k.chars();
    let ok_first = |c: char| c.is_ascii_alphabetic() || matches!(c, '-' | '.' | '_');
    match chars.next() {
        Some(c) if ok_first(c) => chars.all(|c| ok_first(c) || c.is_ascii_digit()),
        _ => false,
    }
}

fn no_provider(kind: &str, pod: &Pod, name: &str) -> ContainerConfigError {
    ContainerConfigError::ObjectUnavailable {
        message: format!(
            "couldn't get {kind} {}/{name}, no kubeClient defined",
            pod::namespace(pod)
        ),
    }
}

/// One object an env source refers to, resolved against [`EnvObjects`]: `Ok(None)` when it is
/// missing and the reference is optional (skip it).
fn resolve<'o, T>(
    lookup: Lookup<&'o T>,
    objects: &EnvObjects,
    kind: &str,
    resource: &str,
    pod: &Pod,
    name: &str,
    optional: bool,
) -> Result<Option<&'o T>, ContainerConfigError> {
    if !objects.provider_configured() {
        return Err(no_provider(kind, pod, name));
    }
    match lookup {
        Lookup::Found(o) => Ok(Some(o)),
        Lookup::NotFound if optional => Ok(None),
        Lookup::NotFound => Err(ContainerConfigError::ObjectUnavailable {
            message: format!("{resource} {name:?} not found"),
        }),
        Lookup::Failed(message) => Err(ContainerConfigError::ObjectUnavailable { message }),
    }
}

fn set_var(out: &mut Vec<EnvVar>, values: &mut HashMap<String, String>, name: &str, value: String) {
    values.insert(name.to_string(), value.clone());
    if let Some(existing) = out.iter_mut().find(|x| x.name == name) {
        existing.value = value;
    } else {
        out.push(EnvVar {
            name: name.to_string(),
            value,
        });
    }
}

/// The container's environment (`makeEnvironmentVariables`): first `envFrom` sources in order
/// (keys with the source's prefix; keys that are not valid variable names are skipped and
/// reported with an `InvalidEnvironmentVariableNames` event), then `env` in order, where later
/// entries override earlier ones, `$(VAR)` references to variables defined so far are expanded,
/// and `fieldRef`, `resourceFieldRef`, `configMapKeyRef` and `secretKeyRef` are resolved. The
/// ConfigMaps and Secrets come from [`ConfigContext::objects`]; a missing required object or key
/// is an error with the kubelet's message, a missing optional one is skipped.
pub fn make_environment(
    pod: &Pod,
    c: &Container,
    ctx: &ConfigContext<'_>,
) -> Result<Vec<EnvVar>, ContainerConfigError> {
    let mut out: Vec<EnvVar> = Vec::new();
    let mut values: HashMap<String, String> = HashMap::new();
    let objects = ctx.objects;
    let services = objects
        .service_env()
        .map_err(|e| ContainerConfigError::ObjectUnavailable {
            message: e.to_string(),
        })?;
    for from in c.env_from.as_deref().unwrap_or(&[]) {
        let prefix = from.prefix.as_deref().unwrap_or("");
        let (kind, name, pairs): (&str, &str, Vec<(String, String)>) =
            if let Some(r) = &from.config_map_ref {
                let optional = r.optional.unwrap_or(false);
                let found = resolve(
                    objects.config_map(&r.name),
                    objects,
                    "configMap",
                    "configmap",
                    pod,
                    &r.name,
                    optional,
                )?;
                let Some(cm) = found else { continue };
                let pairs = cm
                    .data
                    .iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                ("configMap", r.name.as_str(), pairs)
            } else if let Some(r) = &from.secret_ref {
                let optional = r.optional.unwrap_or(false);
                let found = resolve(
                    objects.secret(&r.name),
                    objects,
                    "secret",
                    "secret",
                    pod,
                    &r.name,
                    optional,
                )?;
                let Some(s) = found else { continue };
                let pairs = s
                    .data
                    .iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), String::from_utf8_lossy(&v.0).into_owned()))
                    .collect();
                ("secret", r.name.as_str(), pairs)
            } else {
                continue;
            };
        let mut invalid = Vec::new();
        for (k, v) in pairs {
            let k = format!("{prefix}{k}");
            if !is_env_var_name(&k) {
                invalid.push(k);
                continue;
            }
            set_var(&mut out, &mut values, &k, v);
        }
        if !invalid.is_empty() {
            kubelet_api::sort::by(&mut invalid, Ord::cmp);
            if let Some(recorder) = ctx.recorder {
                recorder.warning(
                    InvolvedObject::pod(pod),
                    "InvalidEnvironmentVariableNames",
                    format!(
                        "Keys [{}] from the EnvFrom {kind} {}/{name} were skipped since they are considered invalid environment variable names.",
                        invalid.join(", "),
                        pod::namespace(pod)
                    ),
                );
            }
        }
    }
    for e in c.env.as_deref().unwrap_or(&[]) {
        let literal = e.value.as_deref().unwrap_or("");
        let value = if !literal.is_empty() || e.value_from.is_none() {
            expand(literal, &|n| {
                values.get(n).cloned().or_else(|| services.get(n).cloned())
            })
        } else if let Some(from) = &e.value_from {
            if let Some(f) = &from.field_ref {
                field_ref(pod, &f.field_path, ctx).ok_or_else(|| {
                    ContainerConfigError::UnresolvableEnv {
                        name: e.name.clone(),
                        reason: format!("unsupported fieldRef {:?}", f.field_path),
                    }
                })?
            } else if let Some(r) = &from.resource_field_ref {
                // `containerName` defaults to this container (the kubelet's
                // `containerResourceRuntimeValue`).
                let target = match r.container_name.as_deref().filter(|n| !n.is_empty()) {
                    None => Some(c),
                    Some(n) => pod.spec.as_ref().and_then(|s| {
                        s.containers
                            .iter()
                            .chain(s.init_containers.iter().flatten())
                            .find(|x| x.name == n)
                    }),
                };
                let unresolvable = |reason: String| ContainerConfigError::UnresolvableEnv {
                    name: e.name.clone(),
                    reason,
                };
                let target = target.ok_or_else(|| {
                    unresolvable(format!(
                        "container {:?} not found in the pod",
                        r.container_name.as_deref().unwrap_or_default()
                    ))
                })?;
                crate::downward::container_resource_value(
                    target,
                    &r.resource,
                    r.divisor.as_ref(),
                    &crate::downward::NodeCapacity::of_host(),
                )
                .map_err(|e| unresolvable(e.to_string()))?
            } else if let Some(r) = &from.config_map_key_ref {
                let optional = r.optional.unwrap_or(false);
                let found = resolve(
                    objects.config_map(&r.name),
                    objects,
                    "configMap",
                    "configmap",
                    pod,
                    &r.name,
                    optional,
                )?;
                let Some(cm) = found else { continue };
                match cm.data.as_ref().and_then(|d| d.get(&r.key)) {
                    Some(v) => v.clone(),
                    None if optional => continue,
                    None => {
                        return Err(ContainerConfigError::ObjectUnavailable {
                            message: format!(
                                "couldn't find key {} in ConfigMap {}/{}",
                                r.key,
                                pod::namespace(pod),
                                r.name
                            ),
                        });
                    }
                }
            } else if let Some(r) = &from.secret_key_ref {
                let optional = r.optional.unwrap_or(false);
                let found = resolve(
                    objects.secret(&r.name),
                    objects,
                    "secret",
                    "secret",
                    pod,
                    &r.name,
                    optional,
                )?;
                let Some(s) = found else { continue };
                match s.data.as_ref().and_then(|d| d.get(&r.key)) {
                    Some(v) => String::from_utf8_lossy(&v.0).into_owned(),
                    None if optional => continue,
                    None => {
                        return Err(ContainerConfigError::ObjectUnavailable {
                            message: format!(
                                "couldn't find key {} in Secret {}/{}",
                                r.key,
                                pod::namespace(pod),
                                r.name
                            ),
                        });
                    }
                }
            } else {
                return Err(ContainerConfigError::UnresolvableEnv {
                    name: e.name.clone(),
                    reason: "valueFrom names no source this agent supports".to_string(),
                });
            }
        } else {
            String::new()
        };
        set_var(&mut out, &mut values, &e.name, value);
    }
    // Then the service variables the container does not set itself.
    for (k, v) in services {
        if !values.contains_key(k) {
            out.push(EnvVar {
                name: k.clone(),
                value: v.clone(),
            });
        }
    }
    Ok(out)
}

fn linux_resources(c: &Container) -> Result<Option<LinuxResources>, ContainerConfigError> {
    kubelet_api::resources::container_resources(c).map_err(|source| {
        ContainerConfigError::BadQuantity {
            container: c.name.clone(),
            source,
        }
    })
}

/// Labels every sandbox of `pod` carries.
pub fn sandbox_labels(p: &Pod) -> Labels {
    let mut l: Labels = p.metadata.labels.clone().unwrap_or_default();
    l.insert(labels::POD_NAME.into(), pod::name(p).into());
    l.insert(labels::POD_NAMESPACE.into(), pod::namespace(p).into());
    l.insert(labels::POD_UID.into(), pod::uid(p).into());
    l.insert(labels::MANAGED_BY.into(), "true".into());
    l
}

/// Generate the runtime config of container `c` of `pod`.
pub fn generate_container_config(
    pod: &Pod,
    c: &Container,
    ctx: &ConfigContext<'_>,
) -> Result<ContainerConfig, ContainerConfigError> {
    let envs = make_environment(pod, c, ctx)?;
    let env_map: HashMap<&str, &str> = envs
        .iter()
        .map(|e| (e.name.as_str(), e.value.as_str()))
        .collect();
    let lookup = |n: &str| env_map.get(n).map(|v| v.to_string());
    let command = c
        .command
        .iter()
        .flatten()
        .map(|s| expand(s, &lookup))
        .collect();
    let args = c
        .args
        .iter()
        .flatten()
        .map(|s| expand(s, &lookup))
        .collect();

    let mut mounts = Vec::new();
    for vm in c.volume_mounts.as_deref().unwrap_or(&[]) {
        let Some(host) = ctx.volume_paths.get(&vm.name) else {
            return Err(ContainerConfigError::MissingVolume {
                mount: vm.mount_path.clone(),
                volume: vm.name.clone(),
            });
        };
        let host_path = match vm.sub_path.as_deref() {
            Some(sub) if !sub.is_empty() => host.join(sub),
            _ => host.clone(),
        };
        mounts.push(Mount {
            container_path: PathBuf::from(&vm.mount_path),
            host_path,
            readonly: vm.read_only.unwrap_or(false),
        });
    }

    let mut lbl = Labels::new();
    lbl.insert(labels::POD_NAME.into(), pod::name(pod).into());
    lbl.insert(labels::POD_NAMESPACE.into(), pod::namespace(pod).into());
    lbl.insert(labels::POD_UID.into(), pod::uid(pod).into());
    lbl.insert(labels::CONTAINER_NAME.into(), c.name.clone());
    lbl.insert(labels::MANAGED_BY.into(), "true".into());

    let mut ann = Labels::new();
    ann.insert(
        labels::CONTAINER_HASH.into(),
        format!("{:x}", pod::container_hash(c)),
    );
    ann.insert(
        labels::CONTAINER_RESTART_COUNT.into(),
        ctx.restart_count.to_string(),
    );
    ann.insert(
        labels::CONTAINER_TERMINATION_MESSAGE_PATH.into(),
        c.termination_message_path
            .clone()
            .unwrap_or_else(|| "/dev/termination-log".into()),
    );
    ann.insert(
        labels::CONTAINER_TERMINATION_MESSAGE_POLICY.into(),
        c.termination_message_policy
            .clone()
            .unwrap_or_else(|| "File".into()),
    );
    ann.insert(
        labels::POD_TERMINATION_GRACE_PERIOD.into(),
        pod::termination_grace_period(pod).to_string(),
    );
    if let Some(g) = pod.metadata.deletion_grace_period_seconds {
        ann.insert(labels::POD_DELETION_GRACE_PERIOD.into(), g.to_string());
    }
    if let Some(pre_stop) = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref())
        && let Ok(json) = serde_json::to_string(pre_stop)
    {
        ann.insert(labels::CONTAINER_PRESTOP_HANDLER.into(), json);
    }
    if let Some(ports) = &c.ports
        && let Ok(json) = serde_json::to_string(ports)
    {
        ann.insert(labels::CONTAINER_PORTS.into(), json);
    }
    if !ctx.container_type.is_empty() {
        ann.insert(labels::CONTAINER_TYPE.into(), ctx.container_type.into());
    }

    let security = security_context(pod, c, ctx.seccomp_profile_root)?;
    Ok({
        let mut v = ContainerConfig::default();
        v.metadata = ContainerMetadata {
            name: c.name.clone(),
            attempt: ctx.restart_count,
        };
        v.image = c.image.clone().unwrap_or_default();
        v.command = command;
        v.args = args;
        v.working_dir = c.working_dir.clone().unwrap_or_default();
        v.envs = envs;
        v.mounts = mounts;
        v.labels = lbl;
        v.annotations = ann;
        v.log_path = format!("{}/{}.log", c.name, ctx.restart_count);
        v.stdin = c.stdin.unwrap_or(false);
        v.tty = c.tty.unwrap_or(false);
        v.resources = linux_resources(c)?;
        v.security = security;
        v
    })
}

/// Paths the kubelet masks in every container whose `procMount` is not `Unmasked`
/// (`securitycontext.defaultMaskedPaths`).
pub const DEFAULT_MASKED_PATHS: &[&str] = &[
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

/// Paths the kubelet makes read-only in every container whose `procMount` is not `Unmasked`
/// (`securitycontext.defaultReadonlyPaths`).
pub const DEFAULT_READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// The AppArmor annotation of a container before the `appArmorProfile` field (1.30).
const APPARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";

/// The container's effective security context (the kubelet's
/// `determineEffectiveSecurityContext`): the container's fields, the pod's where the container
/// sets none, the pod's `fsGroup` and `supplementalGroups` as supplemental groups,
/// `no_new_privs` when `allowPrivilegeEscalation` is `false`, the default masked and read-only
/// paths, and the seccomp and AppArmor profiles. Fails when `runAsNonRoot` meets UID 0.
pub fn security_context(
    pod: &Pod,
    c: &Container,
    seccomp_profile_root: &std::path::Path,
) -> Result<SecurityContext, ContainerConfigError> {
    let sc = c.security_context.as_ref();
    let psc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let privileged = sc.and_then(|s| s.privileged).unwrap_or(false);
    let run_as_user = sc
        .and_then(|s| s.run_as_user)
        .or_else(|| psc.and_then(|s| s.run_as_user));
    let run_as_non_root = sc
        .and_then(|s| s.run_as_non_root)
        .or_else(|| psc.and_then(|s| s.run_as_non_root))
        .unwrap_or(false);
    if run_as_non_root && run_as_user == Some(0) {
        return Err(ContainerConfigError::RunAsNonRoot {
            pod: format!(
                "{}_{}({})",
                pod::name(pod),
                pod::namespace(pod),
                pod::uid(pod)
            ),
            container: c.name.clone(),
        });
    }
    let mut supplemental_groups = Vec::new();
    if let Some(psc) = psc {
        supplemental_groups.extend(psc.fs_group);
        supplemental_groups.extend(psc.supplemental_groups.iter().flatten().copied());
    }
    let caps = sc.and_then(|s| s.capabilities.as_ref());
    let unmasked = sc.and_then(|s| s.proc_mount.as_deref()) == Some("Unmasked");
    let paths = |list: &[&str]| {
        if unmasked {
            Vec::new()
        } else {
            list.iter().map(|p| p.to_string()).collect()
        }
    };
    let seccomp = sc
        .and_then(|s| s.seccomp_profile.as_ref())
        .or_else(|| psc.and_then(|s| s.seccomp_profile.as_ref()))
        .map(|p| match p.type_.as_str() {
            "RuntimeDefault" => SecurityProfile::RuntimeDefault,
            "Localhost" => SecurityProfile::Localhost(
                seccomp_profile_root
                    .join(p.localhost_profile.as_deref().unwrap_or_default())
                    .display()
                    .to_string(),
            ),
            _ => SecurityProfile::Unconfined,
        })
        .unwrap_or_default();
    let annotation = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(&format!("{APPARMOR_ANNOTATION_PREFIX}{}", c.name)));
    let apparmor = sc
        .and_then(|s| s.app_armor_profile.as_ref())
        .or_else(|| psc.and_then(|s| s.app_armor_profile.as_ref()))
        .map(|p| match p.type_.as_str() {
            "RuntimeDefault" => SecurityProfile::RuntimeDefault,
            "Localhost" => {
                SecurityProfile::Localhost(p.localhost_profile.clone().unwrap_or_default())
            }
            _ => SecurityProfile::Unconfined,
        })
        .or_else(|| {
            annotation.map(|a| match a.as_str() {
                "runtime/default" => SecurityProfile::RuntimeDefault,
                a => match a.strip_prefix("localhost/") {
                    Some(name) => SecurityProfile::Localhost(name.to_string()),
                    None => SecurityProfile::Unconfined,
                },
            })
        });
    Ok({
        let mut v = SecurityContext::default();
        v.privileged = privileged;
        v.run_as_user = run_as_user;
        v.run_as_group = sc
            .and_then(|s| s.run_as_group)
            .or_else(|| psc.and_then(|s| s.run_as_group));
        v.supplemental_groups = supplemental_groups;
        v.readonly_rootfs = sc
            .and_then(|s| s.read_only_root_filesystem)
            .unwrap_or(false);
        v.no_new_privs = sc.and_then(|s| s.allow_privilege_escalation) == Some(false);
        v.add_capabilities = caps.and_then(|c| c.add.clone()).unwrap_or_default();
        v.drop_capabilities = caps.and_then(|c| c.drop.clone()).unwrap_or_default();
        v.masked_paths = paths(DEFAULT_MASKED_PATHS);
        v.readonly_paths = paths(DEFAULT_READONLY_PATHS);
        v.seccomp = seccomp;
        v.apparmor = apparmor;
        v
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{EnvVar as KEnv, EnvVarSource, ObjectFieldSelector};

    #[test]
    fn expansion_follows_kubernetes_rules() {
        let lookup = |n: &str| (n == "A").then(|| "x".to_string());
        assert_eq!(expand("$(A)-$(B)-$$(A)-$A-$", &lookup), "x-$(B)-$(A)-$A-$");
        assert_eq!(expand("no refs", &lookup), "no refs");
        assert_eq!(expand("$(A", &lookup), "$(A");
    }

    #[test]
    fn env_resolves_field_refs_and_earlier_vars() {
        let mut p = Pod::default();
        p.metadata.name = Some("web".into());
        p.metadata.uid = Some("u1".into());
        let c = Container {
            name: "c".into(),
            env: Some(vec![
                KEnv {
                    name: "POD".into(),
                    value_from: Some(EnvVarSource {
                        field_ref: Some(ObjectFieldSelector {
                            field_path: "metadata.name".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                KEnv {
                    name: "GREETING".into(),
                    value: Some("hello $(POD) on $(NODE)".into()),
                    ..Default::default()
                },
            ]),
            command: Some(vec!["echo".into(), "$(GREETING)".into()]),
            ..Default::default()
        };
        let volumes = HashMap::new();
        let ctx = ConfigContext {
            node_name: "n1",
            pod_ips: &[],
            host_ip: "",
            volume_paths: &volumes,
            restart_count: 0,
            container_type: "",
            objects: &EnvObjects::default(),
            recorder: None,
            seccomp_profile_root: std::path::Path::new("/var/lib/kubelet/seccomp"),
        };
        let cfg = generate_container_config(&p, &c, &ctx).expect("config");
        assert_eq!(cfg.envs[1].value, "hello web on $(NODE)");
        assert_eq!(cfg.command, vec!["echo", "hello web on $(NODE)"]);
        assert_eq!(cfg.labels[labels::POD_UID], "u1");
        assert_eq!(cfg.log_path, "c/0.log");
    }

    mod env_objects {
        use super::super::*;
        use crate::env_objects::EnvObjects;
        use k8s_openapi::ByteString;
        use k8s_openapi::api::core::v1::{
            ConfigMap, ConfigMapEnvSource, ConfigMapKeySelector, EnvFromSource, EnvVar as KEnv,
            EnvVarSource, Secret, SecretEnvSource, SecretKeySelector,
        };
        use kubelet_api::Lookup;
        use std::collections::BTreeMap;

        fn pod() -> Pod {
            let mut p = Pod::default();
            p.metadata.name = Some("web".into());
            p.metadata.namespace = Some("ns".into());
            p.metadata.uid = Some("u1".into());
            p
        }

        fn cm(name: &str, data: &[(&str, &str)]) -> ConfigMap {
            let mut c = ConfigMap {
                data: Some(
                    data.iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            };
            c.metadata.name = Some(name.into());
            c
        }

        fn secret(name: &str, data: &[(&str, &str)]) -> Secret {
            let mut s = Secret {
                data: Some(
                    data.iter()
                        .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                        .collect::<BTreeMap<_, _>>(),
                ),
                ..Default::default()
            };
            s.metadata.name = Some(name.into());
            s
        }

        fn cm_key(var: &str, name: &str, key: &str, optional: bool) -> KEnv {
            KEnv {
                name: var.into(),
                value_from: Some(EnvVarSource {
                    config_map_key_ref: Some(ConfigMapKeySelector {
                        name: name.into(),
                        key: key.into(),
                        optional: Some(optional),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }
        }

        fn secret_key(var: &str, name: &str, key: &str, optional: bool) -> KEnv {
            KEnv {
                name: var.into(),
                value_from: Some(EnvVarSource {
                    secret_key_ref: Some(SecretKeySelector {
                        name: name.into(),
                        key: key.into(),
                        optional: Some(optional),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }
        }

        fn literal(var: &str, v: &str) -> KEnv {
            KEnv {
                name: var.into(),
                value: Some(v.into()),
                ..Default::default()
            }
        }

        fn from_cm(name: &str, prefix: Option<&str>, optional: bool) -> EnvFromSource {
            EnvFromSource {
                config_map_ref: Some(ConfigMapEnvSource {
                    name: name.into(),
                    optional: Some(optional),
                }),
                prefix: prefix.map(Into::into),
                ..Default::default()
            }
        }

        fn from_secret(name: &str, optional: bool) -> EnvFromSource {
            EnvFromSource {
                secret_ref: Some(SecretEnvSource {
                    name: name.into(),
                    optional: Some(optional),
                }),
                ..Default::default()
            }
        }

        type EnvResult = Result<Vec<(String, String)>, String>;

        fn run(
            env_from: Vec<EnvFromSource>,
            env: Vec<KEnv>,
            objects: &EnvObjects,
        ) -> (EnvResult, Vec<String>) {
            let c = Container {
                name: "c".into(),
                env_from: Some(env_from),
                env: Some(env),
                ..Default::default()
            };
            let volumes = HashMap::new();
            let (recorder, mut events) = EventRecorder::channel(16);
            let ctx = ConfigContext {
                node_name: "n1",
                pod_ips: &[],
                host_ip: "",
                volume_paths: &volumes,
                restart_count: 0,
                container_type: "",
                objects,
                recorder: Some(&recorder),
                seccomp_profile_root: std::path::Path::new("/var/lib/kubelet/seccomp"),
            };
            let r = make_environment(&pod(), &c, &ctx)
                .map(|v| v.into_iter().map(|e| (e.name, e.value)).collect())
                .map_err(|e| e.to_string());
            let mut msgs = Vec::new();
            while let Ok(ev) = events.try_recv() {
                msgs.push(format!("{} {}", ev.reason, ev.message));
            }
            (r, msgs)
        }

        fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
            v.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        }

        #[test]
        fn service_variables_come_after_the_containers_and_feed_expansion() {
            let services: BTreeMap<String, String> = [
                ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
                ("WEB_SERVICE_HOST", "10.0.0.2"),
                ("WEB_SERVICE_PORT", "80"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
            let objects = EnvObjects::from_objects([], []).with_service_env(services);
            let env = vec![
                KEnv {
                    name: "URL".into(),
                    value: Some("http://$(WEB_SERVICE_HOST):$(WEB_SERVICE_PORT)/".into()),
                    ..Default::default()
                },
                KEnv {
                    name: "WEB_SERVICE_PORT".into(),
                    value: Some("8080".into()),
                    ..Default::default()
                },
            ];
            let (r, _) = run(vec![], env, &objects);
            assert_eq!(
                r.expect("environment"),
                pairs(&[
                    ("URL", "http://10.0.0.2:80/"),
                    ("WEB_SERVICE_PORT", "8080"),
                    ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
                    ("WEB_SERVICE_HOST", "10.0.0.2"),
                ])
            );
        }

        #[test]
        fn env_from_and_value_from_follow_the_kubelet() {
            let objects = EnvObjects::from_objects(
                [
                    cm(
                        "cfg",
                        &[("A", "1"), ("B", "2"), ("1bad", "x"), ("with space", "y")],
                    ),
                    cm("other", &[("K", "v")]),
                ],
                [secret("sec", &[("PASSWORD", "hunter2"), ("TOKEN", "t")])],
            );
            struct Case {
                name: &'static str,
                env_from: Vec<EnvFromSource>,
                env: Vec<KEnv>,
                want: Result<Vec<(String, String)>, &'static str>,
                events: Vec<&'static str>,
            }
            let cases = vec![
                Case {
                    name: "envFrom keys then env overriding in place, expansion sees envFrom",
                    env_from: vec![from_cm("cfg", None, false), from_secret("sec", false)],
                    env: vec![literal("B", "over-$(A)"), cm_key("X", "other", "K", false)],
                    want: Ok(pairs(&[
                        ("A", "1"),
                        ("B", "over-1"),
                        ("PASSWORD", "hunter2"),
                        ("TOKEN", "t"),
                        ("X", "v"),
                    ])),
                    events: vec![
                        "InvalidEnvironmentVariableNames Keys [1bad, with space] from the EnvFrom configMap ns/cfg were skipped since they are considered invalid environment variable names.",
                    ],
                },
                Case {
                    name: "a prefix can make a key valid",
                    env_from: vec![from_cm("cfg", Some("P_"), false)],
                    env: vec![],
                    want: Ok(pairs(&[("P_1bad", "x"), ("P_A", "1"), ("P_B", "2")])),
                    events: vec![
                        "InvalidEnvironmentVariableNames Keys [P_with space] from the EnvFrom configMap ns/cfg were skipped since they are considered invalid environment variable names.",
                    ],
                },
                Case {
                    name: "secretKeyRef",
                    env_from: vec![],
                    env: vec![secret_key("PW", "sec", "PASSWORD", false)],
                    want: Ok(pairs(&[("PW", "hunter2")])),
                    events: vec![],
                },
                Case {
                    name: "missing required configMap in envFrom",
                    env_from: vec![from_cm("nope", None, false)],
                    env: vec![],
                    want: Err("configmap \"nope\" not found"),
                    events: vec![],
                },
                Case {
                    name: "missing optional configMap and secret in envFrom are skipped",
                    env_from: vec![from_cm("nope", None, true), from_secret("nope", true)],
                    env: vec![literal("A", "a")],
                    want: Ok(pairs(&[("A", "a")])),
                    events: vec![],
                },
                Case {
                    name: "missing required secret",
                    env_from: vec![],
                    env: vec![secret_key("PW", "nope", "k", false)],
                    want: Err("secret \"nope\" not found"),
                    events: vec![],
                },
                Case {
                    name: "missing required key",
                    env_from: vec![],
                    env: vec![cm_key("X", "cfg", "missing", false)],
                    want: Err("couldn't find key missing in ConfigMap ns/cfg"),
                    events: vec![],
                },
                Case {
                    name: "missing required secret key",
                    env_from: vec![],
                    env: vec![secret_key("X", "sec", "missing", false)],
                    want: Err("couldn't find key missing in Secret ns/sec"),
                    events: vec![],
                },
                Case {
                    name: "missing optional key or object leaves the variable unset",
                    env_from: vec![],
                    env: vec![
                        cm_key("X", "cfg", "missing", true),
                        cm_key("Y", "nope", "k", true),
                        secret_key("Z", "sec", "missing", true),
                        literal("W", "$(X)"),
                    ],
                    want: Ok(pairs(&[("W", "$(X)")])),
                    events: vec![],
                },
            ];
            for case in cases {
                let (got, events) = run(case.env_from, case.env, &objects);
                let want = case.want.map_err(|e| e.to_string());
                assert_eq!(got, want, "{}", case.name);
                assert_eq!(events, case.events, "{}", case.name);
            }
        }

        #[test]
        fn without_a_provider_references_fail_clearly() {
            let (got, _) = run(
                vec![from_cm("cfg", None, true)],
                vec![],
                &EnvObjects::default(),
            );
            assert_eq!(
                got,
                Err("couldn't get configMap ns/cfg, no kubeClient defined".to_string())
            );
            let (got, _) = run(vec![], vec![literal("A", "plain")], &EnvObjects::default());
            assert_eq!(got, Ok(pairs(&[("A", "plain")])));
        }

        #[tokio::test]
        async fn provider_failures_are_reported_and_objects_fetched_once() {
            use crate::error::{Error, Result};
            use kubelet_api::ObjectProvider;
            use std::sync::atomic::{AtomicUsize, Ordering};
            struct Flaky(AtomicUsize);
            #[async_trait::async_trait]
            impl ObjectProvider for Flaky {
                async fn config_map(&self, _: &str, name: &str) -> Result<Option<ConfigMap>> {
                    self.0.fetch_add(1, Ordering::SeqCst);
                    Ok(Some(cm(name, &[("k", "v")])))
                }
                async fn secret(&self, _: &str, _: &str) -> Result<Option<Secret>> {
                    Err(Error::unavailable("api server unreachable"))
                }
            }
            let provider = Flaky(AtomicUsize::new(0));
            let c = Container {
                name: "c".into(),
                env_from: Some(vec![from_cm("a", None, false)]),
                env: Some(vec![
                    cm_key("X", "a", "k", false),
                    secret_key("S", "s", "k", true),
                ]),
                ..Default::default()
            };
            let mut owner = Pod::default();
            owner.metadata.namespace = Some("ns".into());
            let objects = EnvObjects::fetch(&provider, &owner, &c).await;
            assert_eq!(provider.0.load(Ordering::SeqCst), 1);
            assert!(matches!(objects.config_map("a"), Lookup::Found(_)));
            let (got, _) = run(
                c.env_from.clone().unwrap_or_default(),
                c.env.clone().unwrap_or_default(),
                &objects,
            );
            assert_eq!(got, Err("unavailable: api server unreachable".to_string()));
        }
    }
}
