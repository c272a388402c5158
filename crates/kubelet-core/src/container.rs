//! Turning a pod's container spec into a runtime [`ContainerConfig`]: environment with `$(VAR)`
//! expansion and `fieldRef`s, command and args expansion, resources, mounts, and the kubelet's
//! labels and annotations (`generateContainerConfig`).

use std::collections::HashMap;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::pod;
use crate::quantity;
use crate::runtime::{
    ContainerConfig, ContainerMetadata, EnvVar, Labels, LinuxResources, Mount, SecurityContext,
    labels,
};

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
    #[error("resources of container {container:?}: {source}")]
    BadQuantity {
        /// Container name.
        container: String,
        /// Parse error.
        #[source]
        source: quantity::QuantityError,
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

fn resource_field(c: &Container, resource: &str) -> Option<String> {
    let (kind, name) = resource.split_once('.')?;
    let r = c.resources.as_ref()?;
    let map = match kind {
        "limits" => r.limits.as_ref(),
        "requests" => r.requests.as_ref(),
        _ => None,
    }?;
    map.get(name).map(|q| q.0.clone())
}

/// The container's environment, in order, with `$(VAR)` references to earlier variables
/// expanded and `fieldRef`/`resourceFieldRef` resolved. ConfigMap and Secret references need an
/// API server and are reported as errors.
pub fn make_environment(
    pod: &Pod,
    c: &Container,
    ctx: &ConfigContext<'_>,
) -> Result<Vec<EnvVar>, ContainerConfigError> {
    let mut out: Vec<EnvVar> = Vec::new();
    let mut values: HashMap<String, String> = HashMap::new();
    for e in c.env.as_deref().unwrap_or(&[]) {
        let value = if let Some(from) = &e.value_from {
            if let Some(f) = &from.field_ref {
                field_ref(pod, &f.field_path, ctx).ok_or_else(|| {
                    ContainerConfigError::UnresolvableEnv {
                        name: e.name.clone(),
                        reason: format!("unsupported fieldRef {:?}", f.field_path),
                    }
                })?
            } else if let Some(r) = &from.resource_field_ref {
                resource_field(c, &r.resource).unwrap_or_default()
            } else {
                return Err(ContainerConfigError::UnresolvableEnv {
                    name: e.name.clone(),
                    reason: "configMapKeyRef and secretKeyRef need an API server source"
                        .to_string(),
                });
            }
        } else {
            let v = e.value.clone().unwrap_or_default();
            expand(&v, &|n| values.get(n).cloned())
        };
        values.insert(e.name.clone(), value.clone());
        if let Some(existing) = out.iter_mut().find(|x| x.name == e.name) {
            existing.value = value;
        } else {
            out.push(EnvVar {
                name: e.name.clone(),
                value,
            });
        }
    }
    Ok(out)
}

fn linux_resources(c: &Container) -> Result<Option<LinuxResources>, ContainerConfigError> {
    let Some(r) = &c.resources else {
        return Ok(None);
    };
    let bad = |source| ContainerConfigError::BadQuantity {
        container: c.name.clone(),
        source,
    };
    let get = |m: Option<
        &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    >,
               k: &str| m.and_then(|m| m.get(k)).map(|q| q.0.clone());
    let limits = r.limits.as_ref();
    let requests = r.requests.as_ref();
    let mut out = LinuxResources::default();
    // Requests default to limits, as the API server defaults them.
    let cpu_request = get(requests, "cpu").or_else(|| get(limits, "cpu"));
    if let Some(q) = cpu_request {
        let milli = quantity::parse_milli(&q).map_err(bad)?;
        out.cpu_shares = (milli * 1024 / 1000).max(2);
    }
    if let Some(q) = get(limits, "cpu") {
        let milli = quantity::parse_milli(&q).map_err(bad)?;
        out.cpu_period = 100_000;
        out.cpu_quota = (milli * 100_000 / 1000).max(1000);
    }
    if let Some(q) = get(limits, "memory") {
        out.memory_limit_in_bytes = quantity::parse_bytes(&q).map_err(bad)?;
    }
    if out == LinuxResources::default() {
        return Ok(None);
    }
    Ok(Some(out))
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

    let sc = c.security_context.as_ref();
    let psc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    Ok(ContainerConfig {
        metadata: ContainerMetadata {
            name: c.name.clone(),
            attempt: ctx.restart_count,
        },
        image: c.image.clone().unwrap_or_default(),
        command,
        args,
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs,
        mounts,
        labels: lbl,
        annotations: ann,
        log_path: format!("{}/{}.log", c.name, ctx.restart_count),
        stdin: c.stdin.unwrap_or(false),
        tty: c.tty.unwrap_or(false),
        resources: linux_resources(c)?,
        security: SecurityContext {
            privileged: sc.and_then(|s| s.privileged).unwrap_or(false),
            run_as_user: sc
                .and_then(|s| s.run_as_user)
                .or_else(|| psc.and_then(|s| s.run_as_user)),
            run_as_group: sc
                .and_then(|s| s.run_as_group)
                .or_else(|| psc.and_then(|s| s.run_as_group)),
        },
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
        };
        let cfg = generate_container_config(&p, &c, &ctx).expect("config");
        assert_eq!(cfg.envs[1].value, "hello web on $(NODE)");
        assert_eq!(cfg.command, vec!["echo", "hello web on $(NODE)"]);
        assert_eq!(cfg.labels[labels::POD_UID], "u1");
        assert_eq!(cfg.log_path, "c/0.log");
    }
}
