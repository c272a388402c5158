//! The two built-in volume plugins, `emptyDir` and `hostPath`.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Pod, Volume};
use kubelet_api::VolumePlugin;

use crate::error::{Error, ErrorKind, Result};

/// `emptyDir`: a directory that lives as long as the pod UID, made as the kubelet's
/// `empty_dir` plugin makes it.
///
/// * The default medium is a directory on the node filesystem, mode 0777, so that containers
///   running as any user can write to it.
/// * `medium: Memory` is a tmpfs mounted by the agent (needs `CAP_SYS_ADMIN`; without it the
///   set-up fails with the mount's error, reported as `FailedMount`). Its size is the node's
///   allocatable memory, lowered to the pod's memory limit (when every container has one) and
///   then to the volume's `sizeLimit` (each only when positive and smaller: a `sizeLimit` above
///   the node's memory leaves the node's size), as the kubelet's `SizeMemoryBackedVolumes`.
///   It is unmounted when the pod's volumes are torn down.
/// * Other media (`HugePages`, …) are rejected with a clear error.
#[derive(Debug, Clone)]
pub struct EmptyDirPlugin {
    node_memory_bytes: i64,
}

impl Default for EmptyDirPlugin {
    fn default() -> Self {
        Self::new()
    }
}

impl EmptyDirPlugin {
    /// A plugin that sizes memory-backed volumes against this host's `MemTotal`.
    pub fn new() -> Self {
        Self {
            node_memory_bytes: crate::downward::NodeCapacity::of_host().memory_bytes,
        }
    }

    /// Size memory-backed volumes against `bytes` (the node's allocatable memory) instead.
    pub fn with_node_memory(mut self, bytes: i64) -> Self {
        self.node_memory_bytes = bytes;
        self
    }

    /// The size of the tmpfs of `volume` of `pod` in bytes (the kubelet's
    /// `calculateEmptyDirMemorySize`); `None` leaves the kernel's default (half the RAM).
    pub fn memory_volume_size(&self, pod: &Pod, volume: &Volume) -> Option<i64> {
        let mut size = self.node_memory_bytes;
        let lower = |size: &mut i64, v: Option<i64>| {
            if let Some(v) = v
                && v > 0
                && v <= *size
            {
                *size = v;
            }
        };
        if size > 0 {
            lower(&mut size, pod_memory_limit(pod));
        } else {
            size = pod_memory_limit(pod).unwrap_or(0);
        }
        let size_limit = volume
            .empty_dir
            .as_ref()
            .and_then(|e| e.size_limit.as_ref())
            .and_then(|q| kubelet_api::quantity::parse_bytes(&q.0).ok());
        if size > 0 {
            lower(&mut size, size_limit);
        } else {
            size = size_limit.unwrap_or(0);
        }
        (size > 0).then_some(size)
    }
}

/// The pod's memory limit as its cgroup gets it (`PodLimits`), only when every container has
/// one.
fn pod_memory_limit(pod: &Pod) -> Option<i64> {
    kubelet_api::pod::aggregate_resource(pod, |c| {
        c.resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get("memory"))
            .and_then(|q| kubelet_api::quantity::parse_bytes(&q.0).ok())
            .filter(|v| *v > 0)
    })
}

/// True when `dir` is the root of a mount (its device differs from its parent's).
fn is_mount_point(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(m), Some(parent)) = (std::fs::symlink_metadata(dir), dir.parent()) else {
        return false;
    };
    std::fs::metadata(parent).is_ok_and(|p| p.dev() != m.dev())
}

#[async_trait]
impl VolumePlugin for EmptyDirPlugin {
    fn name(&self) -> &str {
        "kubernetes.io~empty-dir"
    }

    fn can_support(&self, volume: &Volume) -> bool {
        volume.empty_dir.is_some()
    }

    async fn set_up(&self, pod: &Pod, volume: &Volume, dir: &Path) -> Result<PathBuf> {
        use std::os::unix::fs::PermissionsExt;
        let medium = volume
            .empty_dir
            .as_ref()
            .and_then(|e| e.medium.clone())
            .unwrap_or_default();
        if !medium.is_empty() && medium != "Memory" {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "emptyDir volume {:?}: medium {medium:?} is not supported by this agent",
                    volume.name
                ),
            ));
        }
        tokio::fs::create_dir_all(dir).await?;
        if medium == "Memory" {
            let size = self.memory_volume_size(pod, volume);
            let target = dir.to_path_buf();
            let name = volume.name.clone();
            tokio::task::spawn_blocking(move || mount_tmpfs(&target, size, &name))
                .await
                .map_err(|e| Error::internal(format!("tmpfs mount task failed: {e}")))??;
            return Ok(dir.to_path_buf());
        }
        // The kubelet makes the directory 0777 whatever the umask, so that containers of any
        // user can write to it.
        tokio::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).await?;
        Ok(dir.to_path_buf())
    }

    async fn tear_down(&self, _volume_name: &str, dir: &Path) -> Result<()> {
        let target = dir.to_path_buf();
        tokio::task::spawn_blocking(move || unmount_if_mounted(&target))
            .await
            .map_err(|e| Error::internal(format!("tmpfs unmount task failed: {e}")))??;
        match tokio::fs::remove_dir_all(dir).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// Mounts a tmpfs of `size` bytes (the kernel's default without one) at `dir`, unless one is
/// there already (a later sync, or an agent restarted while the pod runs).
fn mount_tmpfs(dir: &Path, size: Option<i64>, volume: &str) -> Result<()> {
    use nix::mount::{MsFlags, mount};
    if is_mount_point(dir) {
        return Ok(());
    }
    let options = size.map(|s| format!("size={s}"));
    mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        MsFlags::empty(),
        options.as_deref(),
    )
    .map_err(|errno| {
        Error::new(
            ErrorKind::FailedPrecondition,
            format!(
                "emptyDir volume {volume:?} (medium Memory): mounting a tmpfs at {}: {errno}",
                dir.display()
            ),
        )
    })?;
    tracing::debug!(dir = %dir.display(), ?size, "tmpfs mounted for a memory-backed emptyDir");
    Ok(())
}

/// Unmounts `dir` when something is mounted there (a memory-backed `emptyDir`).
fn unmount_if_mounted(dir: &Path) -> Result<()> {
    use nix::mount::{MntFlags, umount2};
    if !is_mount_point(dir) {
        return Ok(());
    }
    umount2(dir, MntFlags::empty()).map_err(|errno| {
        Error::new(
            ErrorKind::FailedPrecondition,
            format!("unmounting the tmpfs at {}: {errno}", dir.display()),
        )
    })
}

/// Unmounts everything mounted below `dir` (deepest first): the tmpfs of memory-backed
/// `emptyDir`s of a pod whose directory is removed without its spec (an orphan found after a
/// restart). Best effort: failures are logged.
pub(crate) fn unmount_all_below(dir: &Path) {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else {
        return;
    };
    let mut below: Vec<PathBuf> = mounts
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .map(|p| PathBuf::from(unescape_mount_path(p)))
        .filter(|p| p.starts_with(dir) && p != dir)
        .collect();
    kubelet_api::sort::by_key(&mut below, |p| std::cmp::Reverse(p.components().count()));
    for p in below {
        if let Err(e) = nix::mount::umount2(&p, nix::mount::MntFlags::empty()) {
            tracing::warn!(path = %p.display(), error = %kubelet_api::chain(&e), "unmounting below a removed pod directory failed");
        }
    }
}

/// `/proc/self/mounts` writes space, tab, newline and backslash as `\ooo` octal escapes.
fn unescape_mount_path(p: &str) -> String {
    let b = p.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `hostPath`: a path on the host, with the kubelet's `type` checks
/// (`DirectoryOrCreate`, `Directory`, `FileOrCreate`, `File`, `Socket`, `CharDevice`,
/// `BlockDevice`, or none).
#[derive(Debug, Default, Clone)]
pub struct HostPathPlugin;

#[async_trait]
impl VolumePlugin for HostPathPlugin {
    fn name(&self) -> &str {
        "kubernetes.io~host-path"
    }

    fn can_support(&self, volume: &Volume) -> bool {
        volume.host_path.is_some()
    }

    async fn set_up(&self, _pod: &Pod, volume: &Volume, _dir: &Path) -> Result<PathBuf> {
        let Some(hp) = &volume.host_path else {
            return Err(Error::invalid_argument(format!(
                "volume {:?} is not a hostPath volume",
                volume.name
            )));
        };
        let path = PathBuf::from(&hp.path);
        let type_ = hp.type_.clone().unwrap_or_default();
        check_host_path_type(&path, &type_).await?;
        Ok(path)
    }

    async fn tear_down(&self, _volume_name: &str, _dir: &Path) -> Result<()> {
        Ok(())
    }
}

async fn check_host_path_type(path: &Path, type_: &str) -> Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let fail = |what: &str| {
        Err(Error::new(
            ErrorKind::FailedPrecondition,
            format!(
                "hostPath type check failed: {} is not a {what}",
                path.display()
            ),
        ))
    };
    let meta = tokio::fs::metadata(path).await;
    match type_ {
        "" => Ok(()),
        "DirectoryOrCreate" => match meta {
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => fail("directory"),
            Err(_) => {
                tokio::fs::create_dir_all(path).await?;
                Ok(())
            }
        },
        "Directory" => match meta {
            Ok(m) if m.is_dir() => Ok(()),
            _ => fail("directory"),
        },
        "FileOrCreate" => match meta {
            Ok(m) if m.is_file() => Ok(()),
            Ok(_) => fail("file"),
            Err(_) => {
                tokio::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .await?;
                Ok(())
            }
        },
        "File" => match meta {
            Ok(m) if m.is_file() => Ok(()),
            _ => fail("file"),
        },
        "Socket" => match meta {
            Ok(m) if m.file_type().is_socket() => Ok(()),
            _ => fail("socket"),
        },
        "CharDevice" => match meta {
            Ok(m) if m.file_type().is_char_device() => Ok(()),
            _ => fail("character device"),
        },
        "BlockDevice" => match meta {
            Ok(m) if m.file_type().is_block_device() => Ok(()),
            _ => fail("block device"),
        },
        other => Err(Error::invalid_argument(format!(
            "hostPath type {other:?} is not supported"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::HostPathVolumeSource;

    fn host_path(path: &Path, type_: &str) -> Volume {
        Volume {
            name: "v".into(),
            host_path: Some(HostPathVolumeSource {
                path: path.display().to_string(),
                type_: Some(type_.into()),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn memory_volumes_are_sized_as_the_kubelet_sizes_them() {
        use k8s_openapi::api::core::v1::{
            Container, EmptyDirVolumeSource, PodSpec, ResourceRequirements,
        };
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let plugin = EmptyDirPlugin::new().with_node_memory(1 << 30);
        let volume = |limit: Option<&str>| Volume {
            name: "m".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".into()),
                size_limit: limit.map(|l| Quantity(l.into())),
            }),
            ..Default::default()
        };
        let container = |limit: Option<&str>| Container {
            resources: limit.map(|l| ResourceRequirements {
                limits: Some([("memory".to_string(), Quantity(l.into()))].into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let pod = |limits: &[Option<&str>]| Pod {
            spec: Some(PodSpec {
                containers: limits.iter().map(|l| container(*l)).collect(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let size = |p: &Pod, v: &Volume| plugin.memory_volume_size(p, v);
        // The node's memory without limits.
        assert_eq!(size(&pod(&[None]), &volume(None)), Some(1 << 30));
        // The pod's limit when every container has one.
        assert_eq!(
            size(&pod(&[Some("64Mi"), Some("64Mi")]), &volume(None)),
            Some(128 << 20)
        );
        assert_eq!(
            size(&pod(&[Some("64Mi"), None]), &volume(None)),
            Some(1 << 30)
        );
        // sizeLimit when smaller; a sizeLimit above the node's memory is ignored.
        assert_eq!(
            size(&pod(&[Some("64Mi")]), &volume(Some("3Mi"))),
            Some(3 << 20)
        );
        assert_eq!(size(&pod(&[None]), &volume(Some("4Gi"))), Some(1 << 30));
        assert_eq!(
            size(&pod(&[Some("64Mi")]), &volume(Some("1Gi"))),
            Some(64 << 20)
        );
    }

    #[tokio::test]
    async fn host_path_type_checks_follow_the_kubelet() {
        let tmp = std::env::temp_dir().join(format!("hp-test-{}", std::process::id()));
        let plugin = HostPathPlugin;
        let pod = Pod::default();
        let made = plugin
            .set_up(
                &pod,
                &host_path(&tmp.join("d"), "DirectoryOrCreate"),
                Path::new("/"),
            )
            .await
            .expect("created");
        assert!(made.is_dir());
        let err = plugin
            .set_up(&pod, &host_path(&tmp.join("d"), "File"), Path::new("/"))
            .await
            .expect_err("a directory is not a file");
        assert!(err.message().contains("is not a file"), "{err}");
        plugin
            .set_up(
                &pod,
                &host_path(&tmp.join("f"), "FileOrCreate"),
                Path::new("/"),
            )
            .await
            .expect("file created");
        assert!(tmp.join("f").is_file());
        let _ = std::fs::remove_dir_all(&tmp);
    }
}
