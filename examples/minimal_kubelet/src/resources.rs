//! Node resource flags (`kubelet-cm`): QoS cgroups, reservations, admission and the CPU
//! manager, named and parsed as the kubelet's.

use std::collections::BTreeMap;
use std::time::Duration;

use kubelet::KubeletConfiguration;

/// QoS and pod cgroups, node allocatable, admission, the CPU manager.
#[derive(Debug, clap::Args)]
pub(crate) struct ResourceFlags {
    /// Build the QoS cgroup hierarchy with a cgroup per pod (`cgroupsPerQOS`).
    #[arg(long = "cgroups-per-qos", default_value_t = true, action = clap::ArgAction::Set)]
    pub(crate) cgroups_per_qos: bool,
    /// `cgroupfs` or `systemd`; must match the container runtime's (`cgroupDriver`).
    #[arg(long = "cgroup-driver", default_value = "cgroupfs")]
    pub(crate) cgroup_driver: String,
    /// The cgroup `kubepods` is made under (`cgroupRoot`); empty: `/`.
    #[arg(long = "cgroup-root", default_value = "")]
    pub(crate) cgroup_root: String,
    /// Resources kept for the agent and the runtime: `cpu=100m,memory=256Mi,pid=1000`
    /// (`kubeReserved`).
    #[arg(long = "kube-reserved", default_value = "", value_parser = parse_map)]
    pub(crate) kube_reserved: BTreeMap<String, String>,
    /// Resources kept for the operating system (`systemReserved`).
    #[arg(long = "system-reserved", default_value = "", value_parser = parse_map)]
    pub(crate) system_reserved: BTreeMap<String, String>,
    /// What node allocatable is enforced on: `pods`, or `none` (`enforceNodeAllocatable`).
    #[arg(
        long = "enforce-node-allocatable",
        default_value = "pods",
        value_delimiter = ','
    )]
    pub(crate) enforce_node_allocatable: Vec<String>,
    /// Pods this node runs at most (`maxPods`).
    #[arg(long = "max-pods", default_value_t = 110)]
    pub(crate) max_pods: i32,
    /// `pids.max` of each pod cgroup; -1: unlimited (`podPidsLimit`).
    #[arg(long = "pod-pids-limit", default_value_t = -1, allow_negative_numbers = true)]
    pub(crate) pod_pids_limit: i64,
    /// Enforce CPU limits as CFS quotas (`cpuCFSQuota`).
    #[arg(long = "cpu-cfs-quota", default_value_t = true, action = clap::ArgAction::Set)]
    pub(crate) cpu_cfs_quota: bool,
    /// `none` or `static` (`cpuManagerPolicy`).
    #[arg(long = "cpu-manager-policy", default_value = "none")]
    pub(crate) cpu_manager_policy: String,
    /// How often the CPU manager moves containers to their CPU sets
    /// (`cpuManagerReconcilePeriod`).
    #[arg(long = "cpu-manager-reconcile-period", default_value = "10s", value_parser = crate::parse_duration)]
    pub(crate) cpu_manager_reconcile_period: Duration,
    /// CPUs kept for the system, list format (`reservedSystemCPUs`).
    #[arg(long = "reserved-cpus", default_value = "")]
    pub(crate) reserved_cpus: String,
    /// Refuse to start when swap is on (`failSwapOn`).
    #[arg(long = "fail-swap-on", default_value_t = true, action = clap::ArgAction::Set)]
    pub(crate) fail_swap_on: bool,
    /// The agent's cgroup for the stats summary's `kubelet` system container
    /// (`kubeletCgroups`); empty: its own.
    #[arg(long = "kubelet-cgroups", default_value = "")]
    pub(crate) kubelet_cgroups: String,
    /// The container runtime's cgroup, reported as the `runtime` system container.
    #[arg(long = "runtime-cgroups")]
    pub(crate) runtime_cgroups: Option<String>,
}

/// `a=1,b=2` as the kubelet's map flags.
fn parse_map(s: &str) -> Result<BTreeMap<String, String>, String> {
    let mut m = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?}: want resource=quantity"))?;
        m.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(m)
}

/// The flags that are fields of the kubelet's configuration.
pub(crate) fn configure(
    flags: &ResourceFlags,
    given: &crate::Given<'_>,
    c: &mut KubeletConfiguration,
) {
    if given.has("cgroups_per_qos") {
        c.cgroups_per_qos = flags.cgroups_per_qos;
    }
    if given.has("cgroup_driver") {
        c.cgroup_driver = flags.cgroup_driver.clone();
    }
    if given.has("cgroup_root") {
        c.cgroup_root = flags.cgroup_root.clone();
    }
    if given.has("kube_reserved") {
        c.kube_reserved = flags.kube_reserved.clone();
    }
    if given.has("system_reserved") {
        c.system_reserved = flags.system_reserved.clone();
    }
    if given.has("enforce_node_allocatable") {
        c.enforce_node_allocatable = flags.enforce_node_allocatable.clone();
    }
    if given.has("max_pods") {
        c.max_pods = flags.max_pods;
    }
    if given.has("pod_pids_limit") {
        c.pod_pids_limit = flags.pod_pids_limit;
    }
    if given.has("cpu_cfs_quota") {
        c.cpu_cfs_quota = flags.cpu_cfs_quota;
    }
    if given.has("cpu_manager_policy") {
        c.cpu_manager_policy = flags.cpu_manager_policy.clone();
    }
    if given.has("cpu_manager_reconcile_period") {
        c.cpu_manager_reconcile_period = flags.cpu_manager_reconcile_period.into();
    }
    if given.has("reserved_cpus") {
        c.reserved_system_cpus = flags.reserved_cpus.clone();
    }
    if given.has("fail_swap_on") {
        c.fail_swap_on = flags.fail_swap_on;
    }
    if given.has("kubelet_cgroups") {
        c.kubelet_cgroups = flags.kubelet_cgroups.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_flags_parse_as_the_kubelets() {
        let m = parse_map("cpu=100m, memory=256Mi").expect("valid");
        assert_eq!(m["cpu"], "100m");
        assert_eq!(m["memory"], "256Mi");
        assert!(parse_map("").expect("empty").is_empty());
        assert!(parse_map("cpu").is_err());
    }
}
