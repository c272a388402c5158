//! What the node reports about the machine: CPUs, memory, the root filesystem, kernel, OS image,
//! identifiers and addresses, read from `/proc`, `/sys` and `/etc` (cadvisor's sources).

use std::net::IpAddr;
use std::path::Path;

/// Facts about this machine, as the node status reports them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MachineInfo {
    /// Online CPUs.
    pub cpus: u64,
    /// `MemTotal`, bytes.
    pub memory_bytes: u64,
    /// Size of the filesystem holding the root dir, bytes (0 if unknown).
    pub root_fs_bytes: u64,
    /// `/proc/sys/kernel/osrelease`.
    pub kernel_version: String,
    /// `PRETTY_NAME` of `/etc/os-release`.
    pub os_image: String,
    /// `/etc/machine-id`.
    pub machine_id: String,
    /// `/sys/class/dmi/id/product_uuid` (empty when unreadable).
    pub system_uuid: String,
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot_id: String,
    /// Go's name of the architecture (`amd64`, `arm64`, …).
    pub architecture: String,
}

fn read_trimmed(path: impl AsRef<Path>) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Go's `GOARCH` for this build's target architecture.
pub fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "x86" => "386",
        "aarch64" => "arm64",
        "arm" => "arm",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        "loongarch64" => "loong64",
        other => other,
    }
}

/// `PRETTY_NAME` of an `/etc/os-release` text.
pub(crate) fn pretty_name(os_release: &str) -> String {
    os_release
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim().trim_matches('"').to_string())
        .unwrap_or_else(|| "Linux".to_string())
}

impl MachineInfo {
    /// Read this machine; `root_dir` names the filesystem whose size is the ephemeral storage.
    pub fn detect(root_dir: &Path) -> Self {
        // CPUs and memory as the stats collector reads them (`kubelet-stats`).
        let machine = kubelet_stats::read_machine(Path::new("/proc"), Path::new("/sys"));
        // fsblkcnt_t is not u64 on every target.
        #[allow(clippy::useless_conversion)]
        let root_fs_bytes = existing_ancestor(root_dir)
            .and_then(|p| nix::sys::statvfs::statvfs(p).ok())
            .map_or(0, |s| {
                u64::from(s.blocks()).saturating_mul(u64::from(s.fragment_size()))
            });
        Self {
            cpus: machine.num_cores,
            memory_bytes: machine.memory_capacity,
            root_fs_bytes,
            kernel_version: read_trimmed("/proc/sys/kernel/osrelease"),
            os_image: pretty_name(&std::fs::read_to_string("/etc/os-release").unwrap_or_default()),
            machine_id: read_trimmed("/etc/machine-id"),
            system_uuid: read_trimmed("/sys/class/dmi/id/product_uuid").to_lowercase(),
            boot_id: read_trimmed("/proc/sys/kernel/random/boot_id"),
            architecture: go_arch().to_string(),
        }
    }
}

fn existing_ancestor(p: &Path) -> Option<&Path> {
    p.ancestors().find(|a| a.exists())
}

/// The kernel's hostname, lowercased (the kubelet's default node name and Hostname address).
pub fn hostname() -> String {
    let h = read_trimmed("/proc/sys/kernel/hostname").to_lowercase();
    if h.is_empty() {
        "localhost".to_string()
    } else {
        h
    }
}

/// The address of the interface holding the default route (no packet is sent), or `None`.
pub fn default_route_ip() -> Option<IpAddr> {
    kubelet_core::KubeletConfig::default_node_ip()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_release_parses() {
        assert_eq!(
            pretty_name("NAME=\"Debian\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n"),
            "Debian GNU/Linux 12 (bookworm)"
        );
        assert_eq!(pretty_name(""), "Linux");
    }

    #[test]
    fn this_machine_is_detected() {
        let m = MachineInfo::detect(Path::new("/tmp/does/not/exist"));
        assert!(m.cpus >= 1);
        assert!(m.memory_bytes > 0);
        assert!(
            m.root_fs_bytes > 0,
            "the nearest existing ancestor's filesystem is measured"
        );
        assert!(!m.kernel_version.is_empty());
    }
}
