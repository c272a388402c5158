//! The [`VolumePlugin`] seam: how a kind of volume is made available on the host for a pod.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Pod, Volume};

use crate::error::Result;

/// A volume plugin: makes one kind of volume available on the host for a pod.
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
