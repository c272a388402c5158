//! Conversions between the core runtime model and the CRI v1 wire types.

use std::collections::HashMap;
use std::path::PathBuf;

use jiff::Timestamp;
use kubelet_api::runtime as core;

use crate::proto::v1 as cri;

pub(crate) fn map_in(m: &core::Labels) -> HashMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

pub(crate) fn map_out(m: HashMap<String, String>) -> core::Labels {
    m.into_iter().collect()
}

/// CRI timestamps are nanoseconds since the epoch; 0 means unset.
pub(crate) fn time_out(nanos: i64) -> Option<Timestamp> {
    if nanos == 0 {
        return None;
    }
    Timestamp::from_nanosecond(i128::from(nanos)).ok()
}

fn time_or_epoch(nanos: i64) -> Timestamp {
    time_out(nanos).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// The namespace options the kubelet gives sandboxes and containers: the network namespace of
/// the node for host-network pods, else the pod's; a PID namespace per container; the pod's IPC.
fn namespace_options(host_network: bool) -> cri::NamespaceOption {
    cri::NamespaceOption {
        network: if host_network {
            cri::NamespaceMode::Node as i32
        } else {
            cri::NamespaceMode::Pod as i32
        },
        pid: cri::NamespaceMode::Container as i32,
        ipc: cri::NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

fn protocol_in(p: core::Protocol) -> i32 {
    match p {
        core::Protocol::Udp => cri::Protocol::Udp as i32,
        core::Protocol::Sctp => cri::Protocol::Sctp as i32,
        core::Protocol::Tcp => cri::Protocol::Tcp as i32,
    }
}

pub(crate) fn sandbox_metadata_in(m: &core::PodSandboxMetadata) -> cri::PodSandboxMetadata {
    cri::PodSandboxMetadata {
        name: m.name.clone(),
        uid: m.uid.clone(),
        namespace: m.namespace.clone(),
        attempt: m.attempt,
    }
}

fn sandbox_metadata_out(m: Option<cri::PodSandboxMetadata>) -> core::PodSandboxMetadata {
    let m = m.unwrap_or_default();
    core::PodSandboxMetadata {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        attempt: m.attempt,
    }
}

/// The CRI `PodSandboxConfig` for a core sandbox config, as the kubelet's
/// `generatePodSandboxConfig` builds it.
pub(crate) fn sandbox_config_in(c: &core::PodSandboxConfig) -> cri::PodSandboxConfig {
    cri::PodSandboxConfig {
        metadata: Some(sandbox_metadata_in(&c.metadata)),
        // runc cannot set a hostname without a private UTS namespace.
        hostname: if c.host_network {
            String::new()
        } else {
            c.hostname.clone()
        },
        log_directory: c.log_directory.to_string_lossy().into_owned(),
        dns_config: c.dns_config.as_ref().map(|d| cri::DnsConfig {
            servers: d.servers.clone(),
            searches: d.searches.clone(),
            options: d.options.clone(),
        }),
        port_mappings: c
            .port_mappings
            .iter()
            .map(|p| cri::PortMapping {
                protocol: protocol_in(p.protocol),
                container_port: p.container_port,
                host_port: p.host_port,
                host_ip: p.host_ip.clone(),
            })
            .collect(),
        labels: map_in(&c.labels),
        annotations: map_in(&c.annotations),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: c.cgroup_parent.clone(),
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(namespace_options(c.host_network)),
                privileged: c.privileged,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn sandbox_state_out(s: i32) -> core::SandboxState {
    if s == cri::PodSandboxState::SandboxReady as i32 {
        core::SandboxState::Ready
    } else {
        core::SandboxState::NotReady
    }
}

pub(crate) fn sandbox_state_in(s: core::SandboxState) -> i32 {
    match s {
        core::SandboxState::Ready => cri::PodSandboxState::SandboxReady as i32,
        core::SandboxState::NotReady => cri::PodSandboxState::SandboxNotready as i32,
    }
}

pub(crate) fn sandbox_out(s: cri::PodSandbox) -> core::PodSandbox {
    core::PodSandbox {
        id: s.id,
        metadata: sandbox_metadata_out(s.metadata),
        state: sandbox_state_out(s.state),
        created_at: time_or_epoch(s.created_at),
        labels: map_out(s.labels),
        annotations: map_out(s.annotations),
    }
}

pub(crate) fn sandbox_status_out(s: cri::PodSandboxStatus) -> core::PodSandboxStatus {
    let network = s.network.unwrap_or_default();
    let host_network = s
        .linux
        .and_then(|l| l.namespaces)
        .and_then(|n| n.options)
        .is_some_and(|o| o.network == cri::NamespaceMode::Node as i32);
    {
        let mut v = core::PodSandboxStatus::default();
        v.id = s.id;
        v.metadata = sandbox_metadata_out(s.metadata);
        v.state = sandbox_state_out(s.state);
        v.created_at = time_or_epoch(s.created_at);
        v.ip = Some(network.ip).filter(|ip| !ip.is_empty());
        v.additional_ips = network
            .additional_ips
            .into_iter()
            .map(|i| i.ip)
            .filter(|ip| !ip.is_empty())
            .collect();
        v.host_network = host_network;
        v.labels = map_out(s.labels);
        v.annotations = map_out(s.annotations);
        v
    }
}

fn container_state_out(s: i32) -> core::ContainerState {
    match cri::ContainerState::try_from(s) {
        Ok(cri::ContainerState::ContainerCreated) => core::ContainerState::Created,
        Ok(cri::ContainerState::ContainerRunning) => core::ContainerState::Running,
        Ok(cri::ContainerState::ContainerExited) => core::ContainerState::Exited,
        Ok(cri::ContainerState::ContainerUnknown) | Err(_) => core::ContainerState::Unknown,
    }
}

pub(crate) fn container_state_in(s: core::ContainerState) -> i32 {
    match s {
        core::ContainerState::Created => cri::ContainerState::ContainerCreated as i32,
        core::ContainerState::Running => cri::ContainerState::ContainerRunning as i32,
        core::ContainerState::Exited => cri::ContainerState::ContainerExited as i32,
        core::ContainerState::Unknown => cri::ContainerState::ContainerUnknown as i32,
    }
}

fn container_metadata_out(m: Option<cri::ContainerMetadata>) -> core::ContainerMetadata {
    let m = m.unwrap_or_default();
    core::ContainerMetadata {
        name: m.name,
        attempt: m.attempt,
    }
}

pub(crate) fn container_out(c: cri::Container) -> core::Container {
    core::Container {
        id: c.id,
        pod_sandbox_id: c.pod_sandbox_id,
        metadata: container_metadata_out(c.metadata),
        image: c.image.map(|i| i.image).unwrap_or_default(),
        image_ref: c.image_ref,
        state: container_state_out(c.state),
        created_at: time_or_epoch(c.created_at),
        labels: map_out(c.labels),
        annotations: map_out(c.annotations),
    }
}

fn mount_out(m: cri::Mount) -> core::Mount {
    core::Mount {
        container_path: PathBuf::from(m.container_path),
        host_path: PathBuf::from(m.host_path),
        readonly: m.readonly,
    }
}

pub(crate) fn mount_in(m: &core::Mount) -> cri::Mount {
    cri::Mount {
        container_path: m.container_path.to_string_lossy().into_owned(),
        host_path: m.host_path.to_string_lossy().into_owned(),
        readonly: m.readonly,
        propagation: cri::MountPropagation::PropagationPrivate as i32,
        ..Default::default()
    }
}

pub(crate) fn resources_in(r: &core::LinuxResources) -> cri::LinuxContainerResources {
    cri::LinuxContainerResources {
        cpu_period: r.cpu_period,
        cpu_quota: r.cpu_quota,
        cpu_shares: r.cpu_shares,
        memory_limit_in_bytes: r.memory_limit_in_bytes,
        oom_score_adj: r.oom_score_adj.unwrap_or(0),
        cpuset_cpus: r.cpuset_cpus.clone(),
        cpuset_mems: r.cpuset_mems.clone(),
        ..Default::default()
    }
}

pub(crate) fn container_status_out(s: cri::ContainerStatus) -> core::ContainerStatus {
    let resources = s.resources.and_then(|r| r.linux).map(|l| {
        let mut v = core::LinuxResources::default();
        v.cpu_period = l.cpu_period;
        v.cpu_quota = l.cpu_quota;
        v.cpu_shares = l.cpu_shares;
        v.memory_limit_in_bytes = l.memory_limit_in_bytes;
        v.cpuset_cpus = l.cpuset_cpus;
        v.cpuset_mems = l.cpuset_mems;
        v.oom_score_adj = Some(l.oom_score_adj);
        v
    });
    {
        let mut v = core::ContainerStatus::default();
        v.id = s.id;
        v.metadata = container_metadata_out(s.metadata);
        v.state = container_state_out(s.state);
        v.created_at = time_or_epoch(s.created_at);
        v.started_at = time_out(s.started_at);
        v.finished_at = time_out(s.finished_at);
        v.exit_code = s.exit_code;
        v.image = s.image.map(|i| i.image).unwrap_or_default();
        v.image_ref = s.image_ref;
        v.reason = s.reason;
        v.message = s.message;
        v.labels = map_out(s.labels);
        v.annotations = map_out(s.annotations);
        v.mounts = s.mounts.into_iter().map(mount_out).collect();
        v.log_path = PathBuf::from(s.log_path);
        v.resources = resources;
        v
    }
}

/// The CRI `ContainerConfig` for a core container config. `extra_mounts` are mounts the CRI
/// runtime adds itself (the termination message file).
pub(crate) fn container_config_in(
    c: &core::ContainerConfig,
    sandbox: &core::PodSandboxConfig,
    extra_mounts: Vec<cri::Mount>,
) -> cri::ContainerConfig {
    let security = &c.security;
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: c.metadata.name.clone(),
            attempt: c.metadata.attempt,
        }),
        image: Some(cri::ImageSpec {
            image: c.image.clone(),
            ..Default::default()
        }),
        command: c.command.clone(),
        args: c.args.clone(),
        working_dir: c.working_dir.clone(),
        envs: c
            .envs
            .iter()
            .map(|e| cri::KeyValue {
                key: e.name.clone(),
                value: e.value.clone(),
            })
            .collect(),
        mounts: c.mounts.iter().map(mount_in).chain(extra_mounts).collect(),
        labels: map_in(&c.labels),
        annotations: map_in(&c.annotations),
        log_path: c.log_path.clone(),
        stdin: c.stdin,
        tty: c.tty,
        linux: Some(cri::LinuxContainerConfig {
            resources: Some(c.resources.as_ref().map(resources_in).unwrap_or_default()),
            security_context: Some(security_context_in(security, sandbox)),
        }),
        ..Default::default()
    }
}

/// The CRI security context of a container (the kubelet's `convertToRuntimeSecurityContext`).
fn security_context_in(
    security: &core::SecurityContext,
    sandbox: &core::PodSandboxConfig,
) -> cri::LinuxContainerSecurityContext {
    let caps = (!security.add_capabilities.is_empty() || !security.drop_capabilities.is_empty())
        .then(|| cri::Capability {
            add_capabilities: security.add_capabilities.clone(),
            drop_capabilities: security.drop_capabilities.clone(),
            ..Default::default()
        });
    cri::LinuxContainerSecurityContext {
        capabilities: caps,
        privileged: security.privileged,
        namespace_options: Some(namespace_options(sandbox.host_network)),
        run_as_user: security.run_as_user.map(|value| cri::Int64Value { value }),
        run_as_group: security.run_as_group.map(|value| cri::Int64Value { value }),
        readonly_rootfs: security.readonly_rootfs,
        supplemental_groups: security.supplemental_groups.clone(),
        no_new_privs: security.no_new_privs,
        masked_paths: security.masked_paths.clone(),
        readonly_paths: security.readonly_paths.clone(),
        seccomp: Some(security_profile_in(&security.seccomp)),
        apparmor: security.apparmor.as_ref().map(security_profile_in),
        ..Default::default()
    }
}

fn security_profile_in(p: &core::SecurityProfile) -> cri::SecurityProfile {
    use cri::security_profile::ProfileType;
    let (kind, localhost_ref) = match p {
        core::SecurityProfile::Unconfined => (ProfileType::Unconfined, String::new()),
        core::SecurityProfile::RuntimeDefault => (ProfileType::RuntimeDefault, String::new()),
        core::SecurityProfile::Localhost(r) => (ProfileType::Localhost, r.clone()),
    };
    cri::SecurityProfile {
        profile_type: kind as i32,
        localhost_ref,
    }
}

pub(crate) fn condition_out(c: cri::RuntimeCondition) -> core::RuntimeCondition {
    core::RuntimeCondition {
        type_: c.r#type,
        status: c.status,
        reason: c.reason,
        message: c.message,
    }
}

pub(crate) fn image_out(i: cri::Image) -> core::Image {
    {
        let mut v = core::Image::default();
        v.id = i.id;
        v.repo_tags = i.repo_tags;
        v.repo_digests = i.repo_digests;
        v.size = i.size;
        v.pinned = i.pinned;
        v
    }
}

/// Registry credentials → CRI `AuthConfig`.
pub(crate) fn auth_in(a: &core::AuthConfig) -> cri::AuthConfig {
    cri::AuthConfig {
        username: a.username.clone(),
        password: a.password.clone(),
        auth: a.auth.clone(),
        server_address: a.server_address.clone(),
        identity_token: a.identity_token.clone(),
        registry_token: a.registry_token.clone(),
    }
}

pub(crate) fn stats_out(container_id: &str, s: cri::ContainerStats) -> core::ContainerStats {
    let cpu = s.cpu.unwrap_or_default();
    let memory = s.memory.unwrap_or_default();
    let writable = s.writable_layer.as_ref();
    let when = if memory.timestamp != 0 {
        memory.timestamp
    } else {
        cpu.timestamp
    };
    {
        let mut vv = core::ContainerStats::default();
        vv.container_id = s
            .attributes
            .map(|a| a.id)
            .filter(|id| !id.is_empty())
            .unwrap_or_else(|| container_id.to_string());
        vv.timestamp = time_out(when).unwrap_or_else(Timestamp::now);
        vv.memory_working_set_bytes = memory.working_set_bytes.map(|v| v.value);
        vv.memory_usage_bytes = memory.usage_bytes.map(|v| v.value);
        vv.memory_rss_bytes = memory.rss_bytes.map(|v| v.value);
        vv.memory_page_faults = memory.page_faults.map(|v| v.value);
        vv.memory_major_page_faults = memory.major_page_faults.map(|v| v.value);
        vv.cpu_usage_core_nanoseconds = cpu.usage_core_nano_seconds.map(|v| v.value);
        vv.process_count = None;
        vv.writable_layer_bytes = writable.and_then(|w| w.used_bytes).map(|v| v.value);
        vv.writable_layer_inodes = writable.and_then(|w| w.inodes_used).map(|v| v.value);
        vv
    }
}

/// CRI `PodSandboxStats` → the core model (its network figures; `None` without a sandbox ID).
pub(crate) fn sandbox_stats_out(s: cri::PodSandboxStats) -> Option<core::PodSandboxStats> {
    fn interface(i: cri::NetworkInterfaceUsage) -> core::InterfaceUsage {
        let mut u = core::InterfaceUsage::new(i.name);
        u.rx_bytes = i.rx_bytes.map(|v| v.value);
        u.rx_errors = i.rx_errors.map(|v| v.value);
        u.tx_bytes = i.tx_bytes.map(|v| v.value);
        u.tx_errors = i.tx_errors.map(|v| v.value);
        u
    }
    let id = s.attributes.map(|a| a.id).filter(|id| !id.is_empty())?;
    let mut out = core::PodSandboxStats::new(id);
    out.network = s.linux.and_then(|l| l.network).map(|n| {
        let mut net =
            core::SandboxNetworkStats::new(time_out(n.timestamp).unwrap_or_else(Timestamp::now));
        net.default_interface = n.default_interface.map(interface);
        net.interfaces = n.interfaces.into_iter().map(interface).collect();
        net
    });
    Some(out)
}

/// CRI `ImageFsInfoResponse` → the core model. Entries that name no mountpoint identify no
/// filesystem and are dropped; a missing timestamp reads as "now".
pub(crate) fn image_fs_info_out(r: cri::ImageFsInfoResponse) -> core::ImageFsInfo {
    fn usage(fs: Vec<cri::FilesystemUsage>) -> Vec<core::FilesystemUsage> {
        fs.into_iter()
            .filter_map(|u| {
                let mountpoint = u.fs_id.map(|id| id.mountpoint).unwrap_or_default();
                (!mountpoint.is_empty()).then(|| {
                    let mut vv = core::FilesystemUsage::default();
                    vv.timestamp = time_out(u.timestamp).unwrap_or_else(Timestamp::now);
                    vv.mountpoint = PathBuf::from(mountpoint);
                    vv.used_bytes = u.used_bytes.map(|v| v.value);
                    vv.inodes_used = u.inodes_used.map(|v| v.value);
                    vv
                })
            })
            .collect()
    }
    {
        let mut v = core::ImageFsInfo::default();
        v.image_filesystems = usage(r.image_filesystems);
        v.container_filesystems = usage(r.container_filesystems);
        v
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn sandbox(host_network: bool) -> core::PodSandboxConfig {
        {
            let mut v = core::PodSandboxConfig::default();
            v.metadata = core::PodSandboxMetadata {
                name: "web".into(),
                namespace: "default".into(),
                uid: "u1".into(),
                attempt: 2,
            };
            v.hostname = "web".into();
            v.log_directory = "/var/log/pods/default_web_u1".into();
            v.port_mappings = vec![core::PortMapping {
                protocol: core::Protocol::Udp,
                container_port: 53,
                host_port: 0,
                host_ip: String::new(),
            }];
            v.host_network = host_network;
            v
        }
    }

    #[test]
    fn host_network_sandboxes_use_the_node_namespace_and_no_hostname() {
        let c = sandbox_config_in(&sandbox(true));
        assert_eq!(c.hostname, "");
        let ns = c
            .linux
            .and_then(|l| l.security_context)
            .and_then(|s| s.namespace_options)
            .unwrap();
        assert_eq!(ns.network, cri::NamespaceMode::Node as i32);
        assert_eq!(ns.pid, cri::NamespaceMode::Container as i32);
    }

    #[test]
    fn pod_network_sandboxes_keep_hostname_ports_and_metadata() {
        let c = sandbox_config_in(&sandbox(false));
        assert_eq!(c.hostname, "web");
        assert_eq!(c.log_directory, "/var/log/pods/default_web_u1");
        assert_eq!(c.port_mappings[0].protocol, cri::Protocol::Udp as i32);
        let m = c.metadata.unwrap();
        assert_eq!(
            (m.name.as_str(), m.uid.as_str(), m.attempt),
            ("web", "u1", 2)
        );
        let ns = c
            .linux
            .unwrap()
            .security_context
            .unwrap()
            .namespace_options
            .unwrap();
        assert_eq!(ns.network, cri::NamespaceMode::Pod as i32);
    }

    #[test]
    fn container_config_carries_resources_security_mounts_and_env() {
        let cfg = {
            let mut vv = core::ContainerConfig::default();
            vv.metadata = core::ContainerMetadata {
                name: "app".into(),
                attempt: 1,
            };
            vv.image = "busybox".into();
            vv.command = vec!["/bin/sh".into()];
            vv.args = vec!["-c".into(), "sleep 1".into()];
            vv.working_dir = "/tmp".into();
            vv.envs = vec![core::EnvVar {
                name: "A".into(),
                value: "1".into(),
            }];
            vv.mounts = vec![core::Mount {
                container_path: "/data".into(),
                host_path: "/var/lib/kubelet/pods/u1/volumes/x".into(),
                readonly: true,
            }];
            vv.log_path = "app/1.log".into();
            vv.resources = Some({
                let mut v = core::LinuxResources::default();
                v.cpu_period = 100_000;
                v.cpu_quota = 50_000;
                v.cpu_shares = 512;
                v.memory_limit_in_bytes = 64 << 20;
                v
            });
            vv.security = {
                let mut v = core::SecurityContext::default();
                v.privileged = true;
                v.run_as_user = Some(1000);
                v.readonly_rootfs = true;
                v.no_new_privs = true;
                v.supplemental_groups = vec![2000, 3000];
                v.drop_capabilities = vec!["ALL".into()];
                v.add_capabilities = vec!["NET_BIND_SERVICE".into()];
                v.seccomp =
                    core::SecurityProfile::Localhost("/var/lib/kubelet/seccomp/p.json".into());
                v
            };
            vv
        };
        let c = container_config_in(&cfg, &sandbox(false), Vec::new());
        assert_eq!(c.envs[0].key, "A");
        assert_eq!(c.mounts[0].container_path, "/data");
        assert!(c.mounts[0].readonly);
        assert_eq!(c.log_path, "app/1.log");
        let linux = c.linux.unwrap();
        let r = linux.resources.unwrap();
        assert_eq!(
            (r.cpu_period, r.cpu_quota, r.cpu_shares),
            (100_000, 50_000, 512)
        );
        assert_eq!(r.memory_limit_in_bytes, 64 << 20);
        let s = linux.security_context.unwrap();
        assert!(s.privileged);
        assert_eq!(s.run_as_user.map(|v| v.value), Some(1000));
        assert!(s.run_as_group.is_none());
        assert!(s.readonly_rootfs && s.no_new_privs);
        assert_eq!(s.supplemental_groups, vec![2000, 3000]);
        let caps = s.capabilities.unwrap();
        assert_eq!(caps.drop_capabilities, vec!["ALL"]);
        assert_eq!(caps.add_capabilities, vec!["NET_BIND_SERVICE"]);
        let seccomp = s.seccomp.unwrap();
        assert_eq!(
            seccomp.profile_type,
            cri::security_profile::ProfileType::Localhost as i32
        );
        assert_eq!(seccomp.localhost_ref, "/var/lib/kubelet/seccomp/p.json");
        assert!(s.apparmor.is_none());
    }

    #[test]
    fn unset_timestamps_are_none_and_states_round_trip() {
        assert_eq!(time_out(0), None);
        assert_eq!(
            time_out(1_500_000_000).map(|t| t.as_nanosecond()),
            Some(1_500_000_000)
        );
        for s in [
            core::ContainerState::Created,
            core::ContainerState::Running,
            core::ContainerState::Exited,
            core::ContainerState::Unknown,
        ] {
            assert_eq!(container_state_out(container_state_in(s)), s);
        }
        for s in [core::SandboxState::Ready, core::SandboxState::NotReady] {
            assert_eq!(sandbox_state_out(sandbox_state_in(s)), s);
        }
    }

    #[test]
    fn image_fs_info_keeps_filesystems_with_a_mountpoint() {
        let fs = |mountpoint: Option<&str>, used: Option<u64>| cri::FilesystemUsage {
            timestamp: 1_700_000_000_000_000_000,
            fs_id: mountpoint.map(|m| cri::FilesystemIdentifier {
                mountpoint: m.into(),
            }),
            used_bytes: used.map(|value| cri::UInt64Value { value }),
            inodes_used: Some(cri::UInt64Value { value: 42 }),
        };
        let out = image_fs_info_out(cri::ImageFsInfoResponse {
            image_filesystems: vec![
                fs(Some("/var/lib/containerd/snapshots"), Some(1 << 20)),
                fs(None, Some(1)),
                fs(Some(""), Some(1)),
            ],
            container_filesystems: vec![fs(Some("/var/lib/containers"), None)],
        });
        assert_eq!(out.image_filesystems.len(), 1);
        let img = &out.image_filesystems[0];
        assert_eq!(
            img.mountpoint,
            PathBuf::from("/var/lib/containerd/snapshots")
        );
        assert_eq!(img.used_bytes, Some(1 << 20));
        assert_eq!(img.inodes_used, Some(42));
        assert_eq!(img.timestamp.as_second(), 1_700_000_000);
        assert_eq!(out.container_filesystems.len(), 1);
        assert_eq!(out.container_filesystems[0].used_bytes, None);
    }

    #[test]
    fn container_stats_carry_the_writable_layer() {
        let out = stats_out(
            "c1",
            cri::ContainerStats {
                writable_layer: Some(cri::FilesystemUsage {
                    timestamp: 1,
                    fs_id: None,
                    used_bytes: Some(cri::UInt64Value { value: 4096 }),
                    inodes_used: Some(cri::UInt64Value { value: 3 }),
                }),
                ..Default::default()
            },
        );
        assert_eq!(out.container_id, "c1");
        assert_eq!(out.writable_layer_bytes, Some(4096));
        assert_eq!(out.writable_layer_inodes, Some(3));
        let none = stats_out("c2", cri::ContainerStats::default());
        assert_eq!(none.writable_layer_bytes, None);
    }
}
