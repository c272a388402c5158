//! The image capability of a runtime ([`ImageService`], reached through
//! [`ContainerRuntime::images`](crate::ContainerRuntime::images)), shaped like CRI v1's
//! ImageService: list, inspect, pull (with registry credentials), remove, and the image
//! filesystem's usage.
//!
//! A runtime whose containers have images of their own (containerd through CRI) implements it;
//! one that runs programs of the host (the process runtime) has none and answers `None`: the
//! engine then skips image checks and pulls, and image garbage collection has nothing to do.
//!
//! ```
//! use kubelet_api::runtime::{AuthConfig, Image, ImageSpec, PodSandboxConfig};
//! use kubelet_api::{Error, ImageService, Result};
//! use parking_lot::Mutex;
//!
//! /// Images "pulled" into memory; a pull with credentials needs user `me`.
//! #[derive(Default)]
//! struct MemoryImages(Mutex<Vec<Image>>);
//!
//! #[async_trait::async_trait]
//! impl ImageService for MemoryImages {
//!     async fn list_images(&self) -> Result<Vec<Image>> {
//!         Ok(self.0.lock().clone())
//!     }
//!     async fn image_status(&self, image: &ImageSpec) -> Result<Option<Image>> {
//!         Ok(self.0.lock().iter().find(|i| i.repo_tags.contains(&image.image)).cloned())
//!     }
//!     async fn pull_image(
//!         &self,
//!         image: &ImageSpec,
//!         auth: Option<&AuthConfig>,
//!         _sandbox: &PodSandboxConfig,
//!     ) -> Result<String> {
//!         if auth.is_some_and(|a| a.username != "me") {
//!             return Err(Error::new(kubelet_api::ErrorKind::PermissionDenied, "unauthorized"));
//!         }
//!         let id = format!("sha256:{:064x}", self.0.lock().len());
//!         self.0.lock().push(Image::new(id.clone(), vec![image.image.clone()], 1 << 20));
//!         Ok(id)
//!     }
//!     async fn remove_image(&self, image: &ImageSpec) -> Result<()> {
//!         self.0.lock().retain(|i| i.id != image.image && !i.repo_tags.contains(&image.image));
//!         Ok(())
//!     }
//! }
//! ```

use async_trait::async_trait;

use crate::error::Result;
use crate::runtime::{AuthConfig, Image, ImageFsInfo, ImageSpec, PodSandboxConfig};

/// The image operations of a runtime (CRI `ImageService`).
///
/// Every method must be safe to call concurrently. Contract (checked by the conformance kit):
/// an image pulled by a reference is then found by [`image_status`](Self::image_status) under
/// that reference and listed by [`list_images`](Self::list_images) with it among its
/// `repo_tags` (or `repo_digests` for a digest reference); removing an image that does not
/// exist is `Ok`; removing one a container still uses may fail (the caller logs it and moves
/// on).
#[async_trait]
pub trait ImageService: Send + Sync {
    /// Every image the runtime has (CRI `ListImages`).
    async fn list_images(&self) -> Result<Vec<Image>>;
    /// The image `image` names (a tag, a digest reference or an image ID) if the runtime has
    /// it, `None` if it must be pulled (CRI `ImageStatus`).
    async fn image_status(&self, image: &ImageSpec) -> Result<Option<Image>>;
    /// Pull `image`, with the registry credentials `auth` when given (anonymously otherwise);
    /// returns the image reference (its ID or digest) (CRI `PullImage`). Errors carry the
    /// registry's message; they must not contain the credentials.
    async fn pull_image(
        &self,
        image: &ImageSpec,
        auth: Option<&AuthConfig>,
        sandbox_config: &PodSandboxConfig,
    ) -> Result<String>;
    /// Remove the image `image` names (usually its ID). Idempotent (CRI `RemoveImage`).
    async fn remove_image(&self, image: &ImageSpec) -> Result<()>;
    /// The filesystems the runtime keeps images (and container layers) on, with the space and
    /// inodes the images use (CRI `ImageFsInfo`). The eviction manager's `imagefs.*` signals
    /// and image garbage collection read the image filesystem's mountpoint.
    ///
    /// Optional: the default reports [`ErrorKind::Unimplemented`](crate::ErrorKind), and
    /// callers then treat the image filesystem as the node filesystem, as the kubelet does when
    /// there is no separate one.
    async fn image_fs_info(&self) -> Result<ImageFsInfo> {
        Err(crate::Error::unsupported("image_fs_info"))
    }
}

fn _assert_image_service_dyn(_: &dyn ImageService) {}

/// The image filesystem info of `runtime`'s image service; `Unimplemented` when it has none
/// (callers then fall back to the node filesystem).
pub async fn image_fs_info_of(runtime: &dyn crate::ContainerRuntime) -> Result<ImageFsInfo> {
    match runtime.images() {
        Some(images) => images.image_fs_info().await,
        None => Err(crate::Error::unsupported("images")),
    }
}
