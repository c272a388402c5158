//! The [`VolumePlugin`] trait and the two built-in plugins, `emptyDir` and `hostPath`.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Pod, Volume};

use crate::error::{Error, ErrorKind, Result};

/// A volume plugin: makes one kind of volume available on the host for a pod.
///
/// The [`VolumePlugin`] trait and the two built-in plugins, `emptyDir` and `hostPath`.
///
/// The engine sets up every volume of a pod before any of its containers is created, under the
/// kubelet's layout `<root-dir>/pods/<uid>/volumes/kubernetes.io~<plugin>/<volume>`, and passes
/// the resulting host paths to the runtime as [`Mount`](crate::runtime::Mount)s.
#[async_trait]
pub trait VolumePlugin: Send + Sync + 'static {
    /// Plugin name as in the kubelet's directory layout, e.g. `kubernetes.io~empty-dir`.
    fn name(&self) -> &str;
    /// True when this plugin handles `volume`.
    fn can_support(&self, volume: &Volume) -> bool;
    /// Make `volume` of `pod` available; `dir` is `<pod-dir>/volumes/<plugin name>/<volume name>`
    /// (plugins without per-pod state may ignore it). Returns the host path to mount.
    /// Must be idempotent: it is called on every sync.
    async fn set_up(&self, pod: &Pod, volume: &Volume, dir: &Path) -> Result<PathBuf>;
    /// Undo `set_up` once the pod has terminated. Must be idempotent.
    async fn tear_down(&self, volume_name: &str, dir: &Path) -> Result<()>;
}

fn _assert_volume_dyn(_: &dyn VolumePlugin) {}

/// `emptyDir` with the default medium: a directory on the node filesystem that lives as long as
/// the pod UID. `medium: Memory` needs a tmpfs mount and is rejected with a clear error.
#[derive(Debug, Default, Clone)]
pub struct EmptyDirPlugin;

#[async_trait]
impl VolumePlugin for EmptyDirPlugin {
    fn name(&self) -> &str {
        "kubernetes.io~empty-dir"
    }

    fn can_support(&self, volume: &Volume) -> bool {
        volume.empty_dir.is_some()
    }

    async fn set_up(&self, _pod: &Pod, volume: &Volume, dir: &Path) -> Result<PathBuf> {
        let medium = volume
            .empty_dir
            .as_ref()
            .and_then(|e| e.medium.clone())
            .unwrap_or_default();
        if !medium.is_empty() {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "emptyDir volume {:?}: medium {medium:?} is not supported by this agent",
                    volume.name
                ),
            ));
        }
        tokio::fs::create_dir_all(dir).await?;
        Ok(dir.to_path_buf())
    }

    async fn tear_down(&self, _volume_name: &str, dir: &Path) -> Result<()> {
        match tokio::fs::remove_dir_all(dir).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
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
