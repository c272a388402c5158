//! Eviction signals, the resources they starve and the node conditions they raise.

use std::fmt;
use std::str::FromStr;

/// An eviction signal (`eviction/api/types.go`). The only operator is "less than".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Signal {
    /// `memory.available`: node memory capacity minus working set.
    MemoryAvailable,
    /// `allocatableMemory.available`: the pods' cgroup, against node allocatable memory.
    AllocatableMemoryAvailable,
    /// `nodefs.available`: free bytes of the filesystem holding the kubelet's root dir.
    NodeFsAvailable,
    /// `nodefs.inodesFree`: free inodes of that filesystem.
    NodeFsInodesFree,
    /// `imagefs.available`: free bytes of the runtime's image filesystem.
    ImageFsAvailable,
    /// `imagefs.inodesFree`: free inodes of the image filesystem.
    ImageFsInodesFree,
    /// `containerfs.available`: free bytes of the container filesystem (split layouts).
    ContainerFsAvailable,
    /// `containerfs.inodesFree`: free inodes of the container filesystem.
    ContainerFsInodesFree,
    /// `pid.available`: `pid_max` minus running processes.
    PidAvailable,
}

impl Signal {
    /// Every signal.
    pub const ALL: [Signal; 9] = [
        Signal::MemoryAvailable,
        Signal::AllocatableMemoryAvailable,
        Signal::NodeFsAvailable,
        Signal::NodeFsInodesFree,
        Signal::ImageFsAvailable,
        Signal::ImageFsInodesFree,
        Signal::ContainerFsAvailable,
        Signal::ContainerFsInodesFree,
        Signal::PidAvailable,
    ];

    /// The kubelet's name of the signal.
    pub fn as_str(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::AllocatableMemoryAvailable => "allocatableMemory.available",
            Signal::NodeFsAvailable => "nodefs.available",
            Signal::NodeFsInodesFree => "nodefs.inodesFree",
            Signal::ImageFsAvailable => "imagefs.available",
            Signal::ImageFsInodesFree => "imagefs.inodesFree",
            Signal::ContainerFsAvailable => "containerfs.available",
            Signal::ContainerFsInodesFree => "containerfs.inodesFree",
            Signal::PidAvailable => "pid.available",
        }
    }

    /// The resource the signal measures (`signalToResource`).
    pub fn resource(self) -> Resource {
        match self {
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => Resource::Memory,
            Signal::NodeFsAvailable | Signal::ImageFsAvailable | Signal::ContainerFsAvailable => {
                Resource::EphemeralStorage
            }
            Signal::NodeFsInodesFree
            | Signal::ImageFsInodesFree
            | Signal::ContainerFsInodesFree => Resource::Inodes,
            Signal::PidAvailable => Resource::Pids,
        }
    }

    /// The node condition the signal raises (`signalToNodeCondition`).
    pub fn node_condition(self) -> NodeCondition {
        match self.resource() {
            Resource::Memory => NodeCondition::MemoryPressure,
            Resource::EphemeralStorage | Resource::Inodes => NodeCondition::DiskPressure,
            Resource::Pids => NodeCondition::PidPressure,
        }
    }

    /// True for the two memory signals.
    pub fn is_memory(self) -> bool {
        self.resource() == Resource::Memory
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not an eviction signal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unsupported eviction signal {0}")]
pub struct UnknownSignal(pub String);

impl FromStr for Signal {
    type Err = UnknownSignal;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Signal::ALL
            .into_iter()
            .find(|sig| sig.as_str() == s)
            .ok_or_else(|| UnknownSignal(s.to_string()))
    }
}

/// A resource a signal can starve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resource {
    /// `memory`.
    Memory,
    /// `ephemeral-storage`.
    EphemeralStorage,
    /// `inodes`.
    Inodes,
    /// `pids`.
    Pids,
}

impl Resource {
    /// The kubelet's name of the resource, as it appears in eviction messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Resource::Memory => "memory",
            Resource::EphemeralStorage => "ephemeral-storage",
            Resource::Inodes => "inodes",
            Resource::Pids => "pids",
        }
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A node pressure condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NodeCondition {
    /// `MemoryPressure`.
    MemoryPressure,
    /// `DiskPressure`.
    DiskPressure,
    /// `PIDPressure`.
    PidPressure,
}

impl NodeCondition {
    /// Every pressure condition.
    pub const ALL: [NodeCondition; 3] = [
        NodeCondition::MemoryPressure,
        NodeCondition::DiskPressure,
        NodeCondition::PidPressure,
    ];

    /// The condition type as in `NodeStatus.conditions`.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeCondition::MemoryPressure => "MemoryPressure",
            NodeCondition::DiskPressure => "DiskPressure",
            NodeCondition::PidPressure => "PIDPressure",
        }
    }

    /// The kubelet's reason when the condition is true / false.
    pub fn reason(self, active: bool) -> &'static str {
        match (self, active) {
            (NodeCondition::MemoryPressure, true) => "KubeletHasInsufficientMemory",
            (NodeCondition::MemoryPressure, false) => "KubeletHasSufficientMemory",
            (NodeCondition::DiskPressure, true) => "KubeletHasDiskPressure",
            (NodeCondition::DiskPressure, false) => "KubeletHasNoDiskPressure",
            (NodeCondition::PidPressure, true) => "KubeletHasInsufficientPID",
            (NodeCondition::PidPressure, false) => "KubeletHasSufficientPID",
        }
    }

    /// The kubelet's message when the condition is true / false.
    pub fn message(self, active: bool) -> &'static str {
        match (self, active) {
            (NodeCondition::MemoryPressure, true) => "kubelet has insufficient memory available",
            (NodeCondition::MemoryPressure, false) => "kubelet has sufficient memory available",
            (NodeCondition::DiskPressure, true) => "kubelet has disk pressure",
            (NodeCondition::DiskPressure, false) => "kubelet has no disk pressure",
            (NodeCondition::PidPressure, true) => "kubelet has insufficient PID available",
            (NodeCondition::PidPressure, false) => "kubelet has sufficient PID available",
        }
    }

    /// The taint the node lifecycle controller derives from the condition.
    pub fn taint_key(self) -> &'static str {
        match self {
            NodeCondition::MemoryPressure => "node.kubernetes.io/memory-pressure",
            NodeCondition::DiskPressure => "node.kubernetes.io/disk-pressure",
            NodeCondition::PidPressure => "node.kubernetes.io/pid-pressure",
        }
    }
}

impl fmt::Display for NodeCondition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_signal_round_trips_through_its_name() {
        for s in Signal::ALL {
            assert_eq!(s.as_str().parse::<Signal>(), Ok(s));
        }
        assert_eq!(
            "memory.free".parse::<Signal>().map_err(|e| e.to_string()),
            Err("unsupported eviction signal memory.free".to_string())
        );
    }

    #[test]
    fn signals_map_to_the_kubelets_resources_and_conditions() {
        let table = [
            (Signal::MemoryAvailable, "memory", "MemoryPressure"),
            (
                Signal::AllocatableMemoryAvailable,
                "memory",
                "MemoryPressure",
            ),
            (Signal::NodeFsAvailable, "ephemeral-storage", "DiskPressure"),
            (Signal::NodeFsInodesFree, "inodes", "DiskPressure"),
            (
                Signal::ImageFsAvailable,
                "ephemeral-storage",
                "DiskPressure",
            ),
            (Signal::ImageFsInodesFree, "inodes", "DiskPressure"),
            (Signal::PidAvailable, "pids", "PIDPressure"),
        ];
        for (s, res, cond) in table {
            assert_eq!(s.resource().as_str(), res, "{s}");
            assert_eq!(s.node_condition().as_str(), cond, "{s}");
        }
    }
}
