//! The agent plugin seam: one way for a subsystem to plug into the agent.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::NodeCondition;
use parking_lot::Mutex;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::ContainerRuntime;
use crate::admission::PodAdmitHandler;
use crate::builder::{KubeletConfig, KubeletHandle};
use crate::config::PodSource;
use crate::event::EventRecorder;
use crate::objects::ObjectProvider;
use crate::sink::StatusSink;

/// How long plugins' loops get to return after the agent's shutdown before they are dropped.
pub const PLUGIN_STOP_GRACE: Duration = Duration::from_secs(5);

/// A subsystem plugged into the agent. See the documentation below for when each method is
/// called, the start order and the failure policy.
///
/// ```
/// use kubelet_core::{AgentPlugin, PluginContext};
/// use tokio_util::sync::CancellationToken;
///
/// /// Logs how many pods the agent reports, once a minute.
/// struct PodCounter;
///
/// #[async_trait::async_trait]
/// impl AgentPlugin for PodCounter {
///     fn name(&self) -> &str { "pod-counter" }
///     async fn run(&self, ctx: PluginContext, shutdown: CancellationToken) -> kubelet_core::Result<()> {
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
/// with [`KubeletBuilder::plugin`](crate::KubeletBuilder::plugin). Every method has a default,
/// so a plugin implements only what it offers:
///
/// * at [`build`](crate::KubeletBuilder::build), in registration order: its
///   [pod sources](AgentPlugin::pod_sources), [status sinks](AgentPlugin::status_sinks),
///   [object provider](AgentPlugin::object_provider), [admit handlers](AgentPlugin::admit_handlers)
///   and [metrics](AgentPlugin::register_metrics) are collected;
/// * while the agent runs: its [node conditions](AgentPlugin::node_conditions) are read by
///   whoever writes the node status (through [`PluginContext::node_conditions`]), and its
///   [`run`](AgentPlugin::run) loop is driven by [`Kubelet::run`](crate::Kubelet::run) with the
///   agent's shutdown.
///
/// **Start order** of [`Kubelet::run`](crate::Kubelet::run): the pod config merge and the
/// sources, the PLEG, the status manager, the prober, then the plugins' `run` loops in
/// registration order, then the sync loop. Plugins therefore see a live
/// [`KubeletHandle`] from their first poll, while pods may not have been
/// synced yet. At shutdown the sync loop stops first; the plugins' loops then get
/// [`PLUGIN_STOP_GRACE`] to return after their shutdown token is cancelled, and are dropped
/// after it.
///
/// **Failure policy.** A plugin whose `run` returns an error, or panics, is reported with its
/// name (an `error` log line and a `PluginFailed` warning event on the node) and stays stopped;
/// the agent, its pods and the other plugins go on. Its admit handlers and node conditions stay
/// in place with their last state. [`KubeletHandle::plugins`](crate::KubeletHandle::plugins)
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

    /// Register the plugin's metrics in the agent's registry. Called once, at build.
    fn register_metrics(&self, registry: &mut Registry) {
        let _ = registry;
    }

    /// The node conditions the plugin reports now (`MemoryPressure`, …). Called whenever a node
    /// status is computed; must be cheap and must not block.
    fn node_conditions(&self) -> Vec<NodeCondition> {
        Vec::new()
    }

    /// The plugin's long-running loop, driven by [`Kubelet::run`](crate::Kubelet::run) until
    /// `shutdown` is cancelled. The default waits for the shutdown. An error is reported with
    /// the plugin's name and the plugin stays stopped (see the failure policy).
    async fn run(&self, ctx: PluginContext, shutdown: CancellationToken) -> crate::Result<()> {
        let _ = ctx;
        shutdown.cancelled().await;
        Ok(())
    }
}

fn _assert_plugin_dyn(_: &dyn AgentPlugin) {}

/// What a plugin's [`run`](AgentPlugin::run) gets from the agent. Cheap to clone.
#[derive(Clone)]
pub struct PluginContext {
    pub(crate) node_name: String,
    pub(crate) config: KubeletConfig,
    pub(crate) runtime: Arc<dyn ContainerRuntime>,
    pub(crate) recorder: EventRecorder,
    pub(crate) handle: KubeletHandle,
    pub(crate) conditions: NodeConditionReader,
    pub(crate) metrics: Arc<Registry>,
}

impl std::fmt::Debug for PluginContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginContext")
            .field("node_name", &self.node_name)
            .finish_non_exhaustive()
    }
}

impl PluginContext {
    /// The node's name.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// The engine's settings (root and log directories, periods).
    pub fn config(&self) -> &KubeletConfig {
        &self.config
    }

    /// The container runtime, as the engine uses it (with its layers).
    pub fn runtime(&self) -> Arc<dyn ContainerRuntime> {
        self.runtime.clone()
    }

    /// The agent's event recorder.
    pub fn recorder(&self) -> EventRecorder {
        self.recorder.clone()
    }

    /// The agent's handle: pod statuses, PLEG health, killing pods.
    pub fn handle(&self) -> KubeletHandle {
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
}

impl std::fmt::Debug for NodeConditionReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeConditionReader")
            .field("plugins", &self.plugins.len())
            .finish()
    }
}

impl NodeConditionReader {
    pub(crate) fn new(plugins: Arc<[Arc<dyn AgentPlugin>]>) -> Self {
        Self { plugins }
    }

    /// The conditions every plugin reports now.
    pub fn conditions(&self) -> Vec<NodeCondition> {
        self.plugins
            .iter()
            .flat_map(|p| p.node_conditions())
            .collect()
    }
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

/// The plugins' states, shared between the agent and its handles.
#[derive(Clone, Default)]
pub(crate) struct PluginStates(Arc<Mutex<Vec<PluginStatus>>>);

impl PluginStates {
    pub(crate) fn new(names: impl IntoIterator<Item = String>) -> Self {
        Self(Arc::new(Mutex::new(
            names
                .into_iter()
                .map(|name| PluginStatus {
                    name,
                    state: PluginState::Registered,
                })
                .collect(),
        )))
    }

    pub(crate) fn set(&self, index: usize, state: PluginState) {
        if let Some(s) = self.0.lock().get_mut(index) {
            s.state = state;
        }
    }

    pub(crate) fn list(&self) -> Vec<PluginStatus> {
        self.0.lock().clone()
    }
}

/// The text of a panic payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}
