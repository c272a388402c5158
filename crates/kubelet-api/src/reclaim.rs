//! The [`NodeReclaimer`] service: node-level disk reclaim (dead containers, unused images) that
//! eviction runs before it evicts a pod for disk pressure, as the kubelet does.

use async_trait::async_trait;

use crate::error::Result;

/// Node-level reclaim for disk pressure, provided as a service
/// ([`Services`](crate::Services)) by the garbage collector and taken by eviction from its
/// [`PluginContext`](crate::PluginContext).
#[async_trait]
pub trait NodeReclaimer: Send + Sync + 'static {
    /// Remove every dead container and sandbox the agent no longer needs, the newest dead
    /// instance of each container included (the kubelet's `DeleteAllUnusedContainers`).
    async fn delete_unused_containers(&self) -> Result<()>;
    /// Remove every image no container uses that is not pinned and is past its minimum age
    /// (the kubelet's `DeleteUnusedImages`).
    async fn delete_unused_images(&self) -> Result<()>;
}

fn _assert_reclaimer_dyn(_: &dyn NodeReclaimer) {}
