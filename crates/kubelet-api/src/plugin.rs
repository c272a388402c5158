//! The agent plugin seam: one way for a subsystem to plug into the agent, and
//! [`AgentHandle`], what a plugin may ask of the running agent.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::NodeCondition;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::ContainerRuntime;
use crate::admission::{KillPodOptions, PodAdmitHandler};
use crate::event::EventRecorder;
use crate::objects::ObjectProvider;
use crate::pleg::PlegHealth;
use crate::services::{ServiceConflict, Services};
use crate::sink::StatusSink;
use crate::source::PodSource;
use crate::status::StatusReader;

/// How long plugins' loops get to return after the agent's shutdown before they are dropped.
pub const PLUGIN_STOP_GRACE: Duration = Duration::from_secs(5);

/// A subsystem plugged into the agent. See the documentation below for when each method is
/// called, the start order and the failure policy.
///
/// ```
/// use kubelet_api::{AgentPlugin, PluginContext};
/// use tokio_util::sync::CancellationToken;
///
/// /// Logs how many pods the agent reports, once a minute.
/// struct PodCounter;
///
/// #[async_trait::async_trait]
/// impl AgentPlugin for PodCounter {
///     fn name(&self) -> &str { "pod-counter" }
///     async fn run(&self, ctx: PluginContext, shutdown: CancellationToken) -> kubelet_api::Result<()> {
///         loop {
///             tokio::select! {
///                 _ = shutdown.cancelled() => return Ok(()),
///                 _ = tokio::time::sleep(std::time::Duration::from_secs(60)) => {
///                     tracing::info!(pods = ctx.handle().statuses().list().len(), "pods");
///                 }
///             }
///         }
///     }
/// }
/// ```
///
/// The agent plugin seam: one way for a subsystem to plug into the agent.
///
/// A subsystem that needs the agent (its pod and status readers, the runtime, the event
/// recorder, the metrics registry, the node name) implements [`AgentPlugin`] and is registered
/// with the engine's builder (`KubeletBuilder::plugin` in `kubelet-core`). Every method has a default,
/// so a plugin implements only what it offers:
///
/// * at the engine's `build`, in registration order: its
///   [pod sources](AgentPlugin::pod_sources), [status sinks](AgentPlugin::status_sinks),
///   [object provider](AgentPlugin::object_provider), [admit handlers](AgentPlugin::admit_handlers),
///   [services](AgentPlugin::provide_services) and [metrics](AgentPlugin::register_metrics) are
///   collected;
/// * while the agent runs: its [node conditions](AgentPlugin::node_conditions) are read by
///   whoever writes the node status (through [`PluginContext::node_conditions`]), and its
///   [`run`](AgentPlugin::run) loop is driven by the engine's `Kubelet::run` with the
///   agent's shutdown.
///
/// **Start order** of the engine's `Kubelet::run`: the pod config merge and the
/// sources, the PLEG, the status manager, the prober, then the plugins' `run` loops in
/// registration order, then the sync loop. Plugins therefore see a live
/// [`AgentHandle`] from their first poll, while pods may not have been
/// synced yet. At shutdown the sync loop stops first; the plugins' loops then get
/// [`PLUGIN_STOP_GRACE`] to return after their shutdown token is cancelled, and are dropped
/// after it.
///
/// **Failure policy.** A plugin whose `run` returns an error, or panics, is reported with its
/// name (an `error` log line and a `PluginFailed` warning event on the node) and stays stopped;
/// the agent, its pods and the other plugins go on. Its admit handlers and node conditions stay
/// in place with their last state. [`AgentHandle::plugins`]
/// tells each plugin's [`PluginState`].
#[async_trait]
pub trait AgentPlugin: Send + Sync + 'static {
    /// The plugin's name, used in logs, events and [`PluginStatus`]. Unique per agent.
    fn name(&self) -> &str;

    /// Pod sources the plugin adds (the API server's pods). Called once, at build.
    fn pod_sources(&self) -> Vec<Arc<dyn PodSource>> {
        Vec::new()
    }

    /// Status sinks the plugin adds (the API server's pod status writer). Called once, at build.
    fn status_sinks(&self) -> Vec<Arc<dyn StatusSink>> {
        Vec::new()
    }

    /// Where ConfigMaps and Secrets come from, if the plugin provides them. Called once, at
    /// build; one provider per agent (a second one is a build error).
    fn object_provider(&self) -> Option<Arc<dyn ObjectProvider>> {
        None
    }

    /// Admission handlers the plugin adds. Called once, at build.
    fn admit_handlers(&self) -> Vec<Arc<dyn PodAdmitHandler>> {
        Vec::new()
    }

    /// Provide the services the plugin offers the other plugins (the stats service, …) with
    /// [`Services::provide`], under its [name](Self::name). Called once, at build, in
    /// registration order; a service another plugin already provides is a build error (the
    /// [`ServiceConflict`] this returns). See [`Services`] for the rules.
    fn provide_services(&self, services: &mut Services) -> Result<(), ServiceConflict> {
        let _ = services;
        Ok(())
    }

    /// Register the plugin's metrics in the agent's registry. Called once, at build.
    fn register_metrics(&self, registry: &mut Registry) {
        let _ = registry;
    }

    /// The node conditions the plugin reports now (`MemoryPressure`, …). Called whenever a node
    /// status is computed; must be cheap and must not block.
    fn node_conditions(&self) -> Vec<NodeCondition> {
        Vec::new()
    }

    /// Errors that make the node NotReady now (the kubelet's `ShutdownStatus`: "node is
    /// shutting down"), joined into the `Ready` condition's message with the runtime's and the
    /// PLEG's. Called whenever a node status is computed; must be cheap and must not block.
    fn ready_errors(&self) -> Vec<String> {
        Vec::new()
    }

    /// The node resources the plugin reports now (the stats plugin: the machine's `cpu`,
    /// `memory` and `ephemeral-storage` capacity). Read with the conditions whenever a node
    /// status is computed; must be cheap and must not block. A resource several plugins report
    /// takes the value of the last one registered.
    fn node_resources(&self) -> NodeResources {
        NodeResources::default()
    }

    /// The plugin's long-running loop, driven by the engine's `Kubelet::run` until
    /// `shutdown` is cancelled. The default waits for the shutdown. An error is reported with
    /// the plugin's name and the plugin stays stopped (see the failure policy).
    async fn run(&self, ctx: PluginContext, shutdown: CancellationToken) -> crate::Result<()> {
        let _ = ctx;
        shutdown.cancelled().await;
        Ok(())
    }
}

fn _assert_plugin_dyn(_: &dyn AgentPlugin) {}

/// What a plugin needs of the running agent, implemented by the engine (`KubeletHandle` of
/// `kubelet-core`): pod statuses, health, plugin states, and the two pod operations a
/// subsystem may ask for (a sync, a kill). Cheap to clone behind its `Arc`.
#[async_trait]
pub trait AgentHandle: Send + Sync + 'static {
    /// Pod statuses as the agent last generated them.
    fn statuses(&self) -> StatusReader;

    /// Health of the PLEG ("PLEG is not healthy" makes a node NotReady).
    fn pleg_health(&self) -> PlegHealth;

    /// Health of the sync loop (the kubelet's `SyncLoopHealthCheck`): an error when the loop
    /// entered its last iteration longer ago than `threshold` (the kubelet uses
    /// max(2 × `syncFrequency`, 5 min)); healthy before the loop first runs.
    fn sync_loop_health(&self, threshold: Duration) -> Result<(), SyncLoopStalled>;

    /// Each plugin's name and state, in registration order.
    fn plugins(&self) -> Vec<PluginStatus>;

    /// The agent's metrics registry (everything registered at build), for a `/metrics`
    /// endpoint.
    fn metrics(&self) -> Arc<Registry>;

    /// Ask for a sync of pod `uid` soon, as if its worker had been woken by a runtime event:
    /// its volumes are set up again (a changed ConfigMap reaches its files) and its containers
    /// checked. Never blocks; an unknown or finished pod is ignored, and requests made before
    /// the loop drains them are merged.
    fn sync_pod(&self, uid: &str);

    /// Kill pod `uid` with `options` (the eviction path); returns once the pod has terminated.
    async fn kill_pod(&self, uid: &str, options: KillPodOptions) -> Result<(), NotRunning>;

    /// Whether every pod source has delivered its first full set of pods (the kubelet's
    /// `sourcesReady.AllReady()`). Until then a pod the agent does not know yet may still
    /// arrive, so garbage collectors must not remove anything of pods missing from
    /// [`statuses`](Self::statuses). The default, false, keeps them from doing so.
    fn sources_ready(&self) -> bool {
        false
    }

    /// The node conditions every plugin reports now, merged as the node status shows them
    /// ([`NodeConditionReader::conditions`]): a standalone node reads its own conditions
    /// here, without an API server. The default (a handle without plugins) is empty.
    fn node_conditions(&self) -> Vec<NodeCondition> {
        Vec::new()
    }
}

fn _assert_handle_dyn(_: &dyn AgentHandle) {}

/// The agent is not running (never started or already stopped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the kubelet is not running")]
pub struct NotRunning;

/// The sync loop has not started an iteration for longer than the health threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("sync Loop took longer than expected")]
pub struct SyncLoopStalled {
    /// How long ago the loop entered its last iteration.
    pub since: Duration,
    /// The threshold it exceeded.
    pub threshold: Duration,
}

/// Where the agent keeps its files: `--root-dir` and the pod log directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentDirs {
    /// `--root-dir`: pod directories live under `<root_dir>/pods/<uid>`.
    pub root_dir: std::path::PathBuf,
    /// `podLogsDir`: container logs live under `<pod_log_dir>/<ns>_<name>_<uid>/`.
    pub pod_log_dir: std::path::PathBuf,
}

/// What a plugin's [`run`](AgentPlugin::run) gets from the agent. Cheap to clone.
#[derive(Clone)]
pub struct PluginContext {
    node_name: String,
    dirs: AgentDirs,
    runtime: Arc<dyn ContainerRuntime>,
    recorder: EventRecorder,
    handle: Arc<dyn AgentHandle>,
    conditions: NodeConditionReader,
    metrics: Arc<Registry>,
    services: Arc<Services>,
}

impl std::fmt::Debug for PluginContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginContext")
            .field("node_name", &self.node_name)
            .field("dirs", &self.dirs)
            .finish_non_exhaustive()
    }
}

impl PluginContext {
    /// A context, as the engine makes one for each plugin (or a host that drives a plugin
    /// without the engine).
    pub fn new(
        node_name: impl Into<String>,
        dirs: AgentDirs,
        runtime: Arc<dyn ContainerRuntime>,
        recorder: EventRecorder,
        handle: Arc<dyn AgentHandle>,
        conditions: NodeConditionReader,
        metrics: Arc<Registry>,
    ) -> Self {
        Self {
            node_name: node_name.into(),
            dirs,
            runtime,
            recorder,
            handle,
            conditions,
            metrics,
            services: Arc::default(),
        }
    }

    /// The services the agent's plugins provide (the engine sets them at build).
    pub fn with_services(mut self, services: Arc<Services>) -> Self {
        self.services = services;
        self
    }

    /// The agent's `T` if a plugin provides one (`ctx.service::<dyn StatsService>()`); see
    /// [`Services`].
    pub fn service<T: ?Sized + Send + Sync + 'static>(&self) -> Option<Arc<T>> {
        self.services.get::<T>()
    }

    /// The node's name.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// The agent's root and pod log directories.
    pub fn dirs(&self) -> &AgentDirs {
        &self.dirs
    }

    /// The container runtime, as the engine uses it (with its layers).
    pub fn runtime(&self) -> Arc<dyn ContainerRuntime> {
        self.runtime.clone()
    }

    /// The agent's event recorder.
    pub fn recorder(&self) -> EventRecorder {
        self.recorder.clone()
    }

    /// The agent's handle: pod statuses, PLEG health, syncing and killing pods.
    pub fn handle(&self) -> Arc<dyn AgentHandle> {
        self.handle.clone()
    }

    /// The node conditions of every plugin, for a node status writer.
    pub fn node_conditions(&self) -> NodeConditionReader {
        self.conditions.clone()
    }

    /// The agent's metrics registry, with every metric registered at build (for a `/metrics`
    /// endpoint).
    pub fn metrics(&self) -> Arc<Registry> {
        self.metrics.clone()
    }
}

/// Reads the node conditions of every plugin of an agent, in registration order.
#[derive(Clone, Default)]
pub struct NodeConditionReader {
    plugins: Arc<[Arc<dyn AgentPlugin>]>,
    changed: Arc<tokio::sync::Notify>,
    /// Set once a merge dropped conditions was logged.
    dropped_logged: Arc<AtomicBool>,
}

/// The most node conditions plugins contribute to the node status, all plugins together.
pub const MAX_NODE_CONDITIONS: usize = 32;

/// Merges plugins' node conditions into what the node status shows: the first condition of
/// each type (in the order given: registration order), without `Ready` (the node status writer
/// computes it from the runtime, the PLEG and the plugins' [ready
/// errors](AgentPlugin::ready_errors)), and at most [`MAX_NODE_CONDITIONS`]. Returns the merged
/// conditions and the types of those left out.
pub fn merge_node_conditions(
    conditions: impl IntoIterator<Item = NodeCondition>,
) -> (Vec<NodeCondition>, Vec<String>) {
    let mut merged: Vec<NodeCondition> = Vec::new();
    let mut dropped = Vec::new();
    for c in conditions {
        if c.type_ == "Ready"
            || merged.iter().any(|m| m.type_ == c.type_)
            || merged.len() >= MAX_NODE_CONDITIONS
        {
            dropped.push(c.type_);
        } else {
            merged.push(c);
        }
    }
    (merged, dropped)
}

impl std::fmt::Debug for NodeConditionReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeConditionReader")
            .field("plugins", &self.plugins.len())
            .finish()
    }
}

impl NodeConditionReader {
    /// A reader of `plugins`' conditions.
    pub fn new(plugins: Arc<[Arc<dyn AgentPlugin>]>) -> Self {
        Self {
            plugins,
            changed: Arc::default(),
            dropped_logged: Arc::default(),
        }
    }

    /// Tell the node status writer that a plugin's conditions or ready errors changed, so
    /// that it posts the node status now instead of at its next period (node shutdown).
    pub fn notify_changed(&self) {
        self.changed.notify_one();
    }

    /// Resolves at the next [`notify_changed`](Self::notify_changed) (or at once when one
    /// came since the last wait): for the node status writer.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    /// The conditions every plugin reports now, merged as the node status gets them
    /// ([`merge_node_conditions`]): one per type, the first plugin's in registration order,
    /// no `Ready` (the node status writer computes it), at most [`MAX_NODE_CONDITIONS`].
    pub fn conditions(&self) -> Vec<NodeCondition> {
        let (merged, dropped) =
            merge_node_conditions(self.plugins.iter().flat_map(|p| p.node_conditions()));
        if !dropped.is_empty() && !self.dropped_logged.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                dropped = ?dropped,
                "plugins' node conditions repeat a type, report Ready, or exceed {MAX_NODE_CONDITIONS}; \
                 the first of each type is kept (logged once)"
            );
        }
        merged
    }

    /// The errors that make the node NotReady, of every plugin.
    pub fn ready_errors(&self) -> Vec<String> {
        self.plugins.iter().flat_map(|p| p.ready_errors()).collect()
    }

    /// The node resources every plugin reports now, merged in registration order (a later
    /// plugin's value of a resource wins).
    pub fn resources(&self) -> NodeResources {
        let mut out = NodeResources::default();
        for p in self.plugins.iter() {
            let r = p.node_resources();
            out.capacity.extend(r.capacity);
            out.allocatable.extend(r.allocatable);
            if r.images.is_some() {
                out.images = r.images;
            }
        }
        out
    }
}

/// Node resources a plugin contributes to the node status (`status.capacity`,
/// `status.allocatable`, by resource name: `cpu`, `memory`, `ephemeral-storage`, …; and
/// `status.images`). What no plugin reports, the node status writer fills in itself.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct NodeResources {
    /// `status.capacity` entries.
    pub capacity: std::collections::BTreeMap<String, Quantity>,
    /// `status.allocatable` entries.
    pub allocatable: std::collections::BTreeMap<String, Quantity>,
    /// `status.images`: the node's images, largest first (the kubelet reports at most 50,
    /// `nodeStatusMaxImages`); `None`: this plugin does not report them.
    pub images: Option<Vec<k8s_openapi::api::core::v1::ContainerImage>>,
}

/// Where a plugin's loop is.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PluginState {
    /// Registered; the agent has not started it yet.
    Registered,
    /// Its loop is running.
    Running,
    /// Its loop returned `Ok` (normally at shutdown).
    Stopped,
    /// Its loop returned an error (the message).
    Failed(String),
    /// Its loop panicked (the panic message).
    Panicked(String),
}

/// One plugin's name and state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginStatus {
    /// The plugin's name.
    pub name: String,
    /// Its state.
    pub state: PluginState,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    struct Reports(&'static str, &'static str);

    #[async_trait]
    impl AgentPlugin for Reports {
        fn name(&self) -> &str {
            self.0
        }
        fn node_resources(&self) -> NodeResources {
            let mut r = NodeResources::default();
            r.capacity.insert("cpu".into(), Quantity(self.1.into()));
            r.capacity
                .insert(format!("example.com/{}", self.0), Quantity("1".into()));
            r
        }
    }

    #[test]
    fn node_resources_merge_in_registration_order_and_the_last_plugin_wins() {
        let plugins: Arc<[Arc<dyn AgentPlugin>]> = vec![
            Arc::new(Reports("a", "2")) as Arc<dyn AgentPlugin>,
            Arc::new(Reports("b", "4")),
        ]
        .into();
        let r = NodeConditionReader::new(plugins).resources();
        assert_eq!(r.capacity["cpu"].0, "4");
        assert_eq!(r.capacity["example.com/a"].0, "1");
        assert_eq!(r.capacity["example.com/b"].0, "1");
        assert!(r.allocatable.is_empty());
        assert!(
            NodeConditionReader::default()
                .resources()
                .capacity
                .is_empty()
        );
    }
}
