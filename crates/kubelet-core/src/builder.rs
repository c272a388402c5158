//! [`KubeletBuilder`]: assembling an agent.

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::agent_config::KubeletConfig;
use crate::error::KubeletError;
use crate::kubelet::Kubelet;
use crate::layer::RuntimeLayer;
use crate::merge::PodConfig;
use crate::object_volumes::{ConfigMapPlugin, SecretPlugin};
use crate::plugin::PluginStates;
use crate::status_manager::StatusManager;
use crate::volume::{EmptyDirPlugin, HostPathPlugin};
use kubelet_api::{
    AgentPlugin, ContainerRuntime, EventRecorder, NodeConditionReader, ObjectProvider, PlegEvents,
    PodAdmitHandler, PodLifecycleEventGenerator, PodSource, ProbeManager, ProbeUpdates, StatusSink,
    VolumePlugin,
};

/// Assembles a [`Kubelet`] from a runtime, a PLEG, pod sources, status sinks and optional
/// subsystems.
///
/// ```no_run
/// # async fn demo(runtime: std::sync::Arc<dyn kubelet_api::ContainerRuntime>,
/// #               pleg: std::sync::Arc<dyn kubelet_api::PodLifecycleEventGenerator>,
/// #               pleg_events: kubelet_api::PlegEvents,
/// #               source: std::sync::Arc<dyn kubelet_api::PodSource>) -> Result<(), kubelet_core::KubeletError> {
/// use kubelet_core::{KubeletBuilder, KubeletConfig};
/// use tokio_util::sync::CancellationToken;
/// let kubelet = KubeletBuilder::new("node-1")
///     .config(KubeletConfig::with_dirs("/tmp/kubelet", "/tmp/kubelet/logs"))
///     .runtime(runtime)
///     .pleg(pleg, pleg_events)
///     .pod_source(source)
///     .build()?;
/// let shutdown = CancellationToken::new();
/// kubelet.run(shutdown).await;
/// # Ok(()) }
/// ```
pub struct KubeletBuilder {
    node_name: String,
    config: KubeletConfig,
    runtime: Option<Arc<dyn ContainerRuntime>>,
    pleg: Option<(Arc<dyn PodLifecycleEventGenerator>, PlegEvents)>,
    sources: Vec<Arc<dyn PodSource>>,
    sinks: Vec<Arc<dyn StatusSink>>,
    volume_plugins: Vec<Arc<dyn VolumePlugin>>,
    object_provider: Option<Arc<dyn ObjectProvider>>,
    prober: Option<(Arc<dyn ProbeManager>, ProbeUpdates)>,
    admit_handlers: Vec<Arc<dyn PodAdmitHandler>>,
    plugins: Vec<Arc<dyn AgentPlugin>>,
    layers: Vec<Arc<dyn RuntimeLayer>>,
    metrics: prometheus_client::registry::Registry,
    recorder: EventRecorder,
    events: mpsc::Receiver<kubelet_api::Event>,
}

impl std::fmt::Debug for KubeletBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeletBuilder")
            .field("node_name", &self.node_name)
            .field("config", &self.config)
            .field("sources", &self.sources.len())
            .field("sinks", &self.sinks.len())
            .field(
                "plugins",
                &self.plugins.iter().map(|p| p.name()).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl KubeletBuilder {
    /// A builder for node `node_name`, with the built-in `emptyDir`, `hostPath`, `configMap`,
    /// `secret` and `downwardAPI` plugins (`configMap` and `secret` read from the
    /// [object provider](Self::object_provider)).
    pub fn new(node_name: impl Into<String>) -> Self {
        let (recorder, events) = EventRecorder::channel(1024);
        Self {
            recorder,
            events,
            node_name: node_name.into(),
            config: KubeletConfig::default(),
            runtime: None,
            pleg: None,
            sources: Vec::new(),
            sinks: Vec::new(),
            volume_plugins: vec![Arc::new(EmptyDirPlugin::new()), Arc::new(HostPathPlugin)],
            object_provider: None,
            prober: None,
            admit_handlers: Vec::new(),
            plugins: Vec::new(),
            layers: Vec::new(),
            metrics: Default::default(),
        }
    }

    /// The agent's event recorder, for components built before the agent (a runtime's warnings,
    /// a custom source): events recorded here reach every status sink once the agent runs.
    pub fn recorder(&self) -> EventRecorder {
        self.recorder.clone()
    }

    /// Engine settings.
    pub fn config(mut self, config: KubeletConfig) -> Self {
        self.config = config;
        self
    }

    /// The container runtime (required).
    pub fn runtime(mut self, runtime: Arc<dyn ContainerRuntime>) -> Self {
        self.runtime = Some(runtime);
        self
    }

    /// The pod lifecycle event generator (required), e.g. `kubelet_pleg::GenericPleg`, with
    /// the receiver of its events that its constructor returned.
    pub fn pleg(mut self, pleg: Arc<dyn PodLifecycleEventGenerator>, events: PlegEvents) -> Self {
        self.pleg = Some((pleg, events));
        self
    }

    /// Add a pod source.
    pub fn pod_source(mut self, source: Arc<dyn PodSource>) -> Self {
        self.sources.push(source);
        self
    }

    /// Add a status sink.
    pub fn status_sink(mut self, sink: Arc<dyn StatusSink>) -> Self {
        self.sinks.push(sink);
        self
    }

    /// Add a volume plugin (checked before the built-in ones).
    pub fn volume_plugin(mut self, plugin: Arc<dyn VolumePlugin>) -> Self {
        self.volume_plugins.insert(0, plugin);
        self
    }

    /// Where ConfigMaps and Secrets come from (the kubelet's configmap and secret managers):
    /// used for `envFrom` / `valueFrom` references and for `configMap` / `secret` volumes, e.g.
    /// `kubelet_apiserver`'s provider or [`StaticObjects`](kubelet_api::StaticObjects).
    /// Without one, containers referencing them fail with `CreateContainerConfigError` and such
    /// volumes with `FailedMount`, each with a message saying no provider is configured.
    pub fn object_provider(mut self, provider: Arc<dyn ObjectProvider>) -> Self {
        self.object_provider = Some(provider);
        self
    }

    /// The prober (liveness, readiness, startup). Without one, running containers are started
    /// and ready, as for containers without probes. `updates` is the receiver of its result
    /// changes that its constructor returned.
    pub fn prober(mut self, prober: Arc<dyn ProbeManager>, updates: ProbeUpdates) -> Self {
        self.prober = Some((prober, updates));
        self
    }

    /// Add an admission handler.
    pub fn admit_handler(mut self, handler: Arc<dyn PodAdmitHandler>) -> Self {
        self.admit_handlers.push(handler);
        self
    }

    /// Add a subsystem ([`AgentPlugin`]): its sources, sinks, object provider, admit handlers
    /// and metrics are collected at [`build`](Self::build), its loop is driven by
    /// [`Kubelet::run`] after the engine's own parts, in registration order.
    pub fn plugin(mut self, plugin: Arc<dyn AgentPlugin>) -> Self {
        self.plugins.push(plugin);
        self
    }

    /// Wrap the runtime in `layer` (deadlines, metrics, …; see [`crate::layer`]). Layers added
    /// first are innermost: `.runtime_layer(a).runtime_layer(b)` gives `b(a(runtime))`. Applied
    /// at build: the engine, the prober and the plugins get the wrapped runtime; a PLEG the host
    /// built before keeps the runtime it was given.
    pub fn runtime_layer(mut self, layer: Arc<dyn RuntimeLayer>) -> Self {
        self.layers.push(layer);
        self
    }

    /// The agent's metrics registry, for metrics of parts that are neither the runtime, the
    /// PLEG, the prober nor a plugin (those are registered by [`build`](Self::build)).
    pub fn metrics_registry(&mut self) -> &mut prometheus_client::registry::Registry {
        &mut self.metrics
    }

    /// Validate and assemble the agent.
    ///
    /// The runtime's, the PLEG's, the prober's and every plugin's metrics are registered here,
    /// once, in the agent's registry ([`AgentHandle::metrics`](kubelet_api::AgentHandle::metrics)).
    pub fn build(mut self) -> Result<Kubelet, KubeletError> {
        let mut runtime = self.runtime.ok_or(KubeletError::BuildMissingRuntime)?;
        let (pleg, pleg_events) = self.pleg.ok_or(KubeletError::BuildMissingPleg)?;
        validate_node_name(&self.node_name)?;
        for layer in &self.layers {
            runtime = layer.layer(runtime);
        }
        let mut names = std::collections::HashSet::new();
        let mut services = kubelet_api::Services::default();
        for p in &self.plugins {
            if !names.insert(p.name().to_string()) {
                return Err(KubeletError::BuildDuplicatePlugin(p.name().to_string()));
            }
            self.sources.extend(p.pod_sources());
            self.sinks.extend(p.status_sinks());
            self.admit_handlers.extend(p.admit_handlers());
            if let Some(provider) = p.object_provider() {
                if self.object_provider.is_some() {
                    return Err(KubeletError::BuildDuplicateObjectProvider(
                        p.name().to_string(),
                    ));
                }
                self.object_provider = Some(provider);
            }
            p.provide_services(&mut services)?;
        }
        let mut metrics = self.metrics;
        runtime.register_metrics(&mut metrics);
        pleg.register_metrics(&mut metrics);
        if let Some((p, _)) = &self.prober {
            p.register_metrics(&mut metrics);
        }
        for p in &self.plugins {
            p.register_metrics(&mut metrics);
        }
        let start_metrics = crate::pod_start::PodStartMetrics::new();
        start_metrics.register(&mut metrics);
        let metrics = Arc::new(metrics);
        let plugins: Arc<[Arc<dyn AgentPlugin>]> = self.plugins.into();
        let plugin_states = PluginStates::new(plugins.iter().map(|p| p.name().to_string()));
        // Paths reach runtimes and their helper processes, whose working directory differs from
        // ours: make them absolute once.
        let mut config = self.config;
        for dir in [
            &mut config.root_dir,
            &mut config.pod_log_dir,
            &mut config.container_log_dir,
        ] {
            *dir = std::path::absolute(&*dir).map_err(|source| KubeletError::ResolveDir {
                path: dir.clone(),
                source,
            })?;
        }
        let (recorder, events) = (self.recorder, self.events);
        let mut pod_config = PodConfig::new(recorder.clone());
        for s in self.sources {
            pod_config.add_source(s)?;
        }
        let status = StatusManager::new(self.sinks);
        let (prober, probe_updates) = self.prober.unzip();
        let (cmd_tx, cmd_rx) = mpsc::channel(64);
        let mut volume_plugins = self.volume_plugins;
        volume_plugins.push(Arc::new(ConfigMapPlugin::new(self.object_provider.clone())));
        volume_plugins.push(Arc::new(SecretPlugin::new(self.object_provider.clone())));
        volume_plugins.push(Arc::new(crate::object_volumes::DownwardApiPlugin::new()));
        volume_plugins.push(Arc::new(crate::object_volumes::ProjectedPlugin::new(
            self.object_provider.clone(),
        )));
        Ok(Kubelet::assemble(crate::kubelet::Parts {
            node_name: self.node_name,
            config,
            runtime,
            pleg,
            pleg_events,
            pod_config,
            status,
            recorder,
            events,
            volume_plugins,
            object_provider: self.object_provider,
            prober,
            probe_updates,
            admit_handlers: self.admit_handlers,
            conditions: NodeConditionReader::new(plugins.clone()),
            plugins,
            plugin_states,
            services: Arc::new(services),
            metrics,
            start_metrics,
            cmd_tx,
            cmd_rx,
            sync_loop: Default::default(),
            sync_requests: Default::default(),
        }))
    }
}

fn validate_node_name(name: &str) -> Result<(), KubeletError> {
    let bad = |reason: &str| KubeletError::BuildInvalidNodeName {
        name: name.to_string(),
        reason: reason.to_string(),
    };
    if name.is_empty() || name.len() > 253 {
        return Err(bad("must be 1 to 253 characters"));
    }
    let ok = name.split('.').all(|label| {
        !label.is_empty()
            && label
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    });
    if !ok {
        return Err(bad(
            "must be a lowercase RFC 1123 subdomain (a-z, 0-9, '-' and '.')",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_must_be_dns_subdomains() {
        assert!(validate_node_name("node-1.example").is_ok());
        assert!(validate_node_name("Node_1").is_err());
        assert!(validate_node_name("").is_err());
    }
}
