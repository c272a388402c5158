//! [`EvictionPlugin`]: node-pressure eviction plugged into the agent.

use crate::FsLayout;
use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::NodeCondition as ApiNodeCondition;
use kubelet_api::{AgentPlugin, PluginContext, PodAdmitHandler};
use kubelet_core::configuration::KubeletConfiguration;
use kubelet_core::prometheus_client::registry::Registry;
use parking_lot::RwLock;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::admission::EvictionAdmitHandler;
use crate::config::{EvictionConfig, EvictionSettings};
use crate::error::EvictionError;
use crate::machine::{MachineStats, MachineStatsConfig};
use crate::manager::{EvictionManager, ManagerEvent, NodeConditions};
use crate::metrics::EvictionMetrics;
use crate::service::ServiceStats;
use crate::signal::NodeCondition;
use crate::stats::StatsProvider;

/// The eviction manager as an [`AgentPlugin`] (named `eviction`): its admission handler, its
/// pressure conditions (`MemoryPressure`, `DiskPressure`, `PIDPressure`) for the node status,
/// its metrics (`kubelet_evictions`, `kubelet_eviction_stats_age_seconds`) and its loop, which
/// kills pods through the agent's handle.
///
/// Without [`stats`](Self::stats), it reads the machine ([`MachineStats`]) under the agent's
/// root and pod log directories, with the agent's runtime for container stats and the image
/// filesystem.
///
/// ```no_run
/// use std::sync::Arc;
/// use kubelet_core::configuration::KubeletConfiguration;
/// use kubelet_eviction::EvictionPlugin;
///
/// # fn demo(builder: kubelet_core::KubeletBuilder) -> Result<(), Box<dyn std::error::Error>> {
/// let mut configuration = KubeletConfiguration::default();
/// configuration.eviction_hard = Some([("memory.available".to_string(), "500Mi".to_string())].into());
/// let kubelet = builder
///     .plugin(Arc::new(EvictionPlugin::from_configuration(&configuration)?))
///     .build()?;
/// # let _ = kubelet; Ok(()) }
/// ```
pub struct EvictionPlugin {
    config: EvictionConfig,
    stats: Option<Arc<dyn StatsProvider>>,
    machine: MachineStatsConfig,
    conditions: Arc<RwLock<BTreeSet<NodeCondition>>>,
    metrics: EvictionMetrics,
    events: broadcast::Sender<ManagerEvent>,
}

impl std::fmt::Debug for EvictionPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EvictionPlugin")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl EvictionPlugin {
    /// A plugin with `config`, reading the machine.
    pub fn new(config: EvictionConfig) -> Self {
        let (events, _) = broadcast::channel(256);
        Self {
            config,
            stats: None,
            machine: MachineStatsConfig::detect(),
            conditions: Arc::default(),
            metrics: EvictionMetrics::default(),
            events,
        }
    }

    /// A plugin with the eviction settings of the kubelet's configuration (`evictionHard`,
    /// `evictionSoft`, grace periods, minimum reclaim, transition period, maximum pod grace).
    pub fn from_configuration(configuration: &KubeletConfiguration) -> Result<Self, EvictionError> {
        Ok(Self::new(EvictionConfig::from_configuration(
            configuration,
        )?))
    }

    /// Read signals and usage from `stats` instead of the machine.
    pub fn stats(mut self, stats: Arc<dyn StatsProvider>) -> Self {
        self.stats = Some(stats);
        self
    }

    /// How the machine is read when no [`stats`](Self::stats) is given (the root and pod log
    /// directories are the agent's unless set here).
    pub fn machine_stats(mut self, config: MachineStatsConfig) -> Self {
        self.machine = config;
        self
    }

    /// The configuration.
    pub fn config(&self) -> &EvictionConfig {
        &self.config
    }

    /// The node's current pressure conditions.
    pub fn node_condition_reader(&self) -> NodeConditions {
        NodeConditions(self.conditions.clone())
    }

    /// The metrics (for embedders reading them directly).
    pub fn metrics(&self) -> &EvictionMetrics {
        &self.metrics
    }

    /// Subscribe to what the manager does once the agent runs it.
    pub fn subscribe(&self) -> broadcast::Receiver<ManagerEvent> {
        self.events.subscribe()
    }
}

impl EvictionConfig {
    /// The eviction settings of the kubelet's configuration.
    pub fn from_configuration(c: &KubeletConfiguration) -> Result<Self, EvictionError> {
        Self::from_settings(&EvictionSettings {
            hard: c.eviction_hard.clone(),
            merge_default_hard: c.merge_default_eviction_settings,
            soft: c.eviction_soft.clone(),
            soft_grace_period: c.eviction_soft_grace_period.clone(),
            minimum_reclaim: c.eviction_minimum_reclaim.clone(),
            pressure_transition_period: Some(kubelet_core::duration::format_go(
                c.eviction_pressure_transition_period.as_duration(),
            )),
            max_pod_grace_period: Some(i64::from(c.eviction_max_pod_grace_period)),
        })
    }
}

#[async_trait]
impl AgentPlugin for EvictionPlugin {
    fn name(&self) -> &str {
        "eviction"
    }

    fn admit_handlers(&self) -> Vec<Arc<dyn PodAdmitHandler>> {
        vec![Arc::new(EvictionAdmitHandler {
            conditions: self.conditions.clone(),
            static_pods_are_critical: self.config.static_pods_are_critical,
        })]
    }

    fn register_metrics(&self, registry: &mut Registry) {
        self.metrics.register(registry);
    }

    fn node_conditions(&self) -> Vec<ApiNodeCondition> {
        self.node_condition_reader().report()
    }

    async fn run(
        &self,
        ctx: PluginContext,
        shutdown: CancellationToken,
    ) -> kubelet_api::Result<()> {
        let stats = match &self.stats {
            Some(s) => s.clone(),
            None => {
                let mut machine = self.machine.clone();
                if machine.root_dir.is_none() {
                    machine = machine.root_dir(&ctx.dirs().root_dir);
                }
                if machine.pod_log_dir.is_none() {
                    machine = machine.pod_log_dir(&ctx.dirs().pod_log_dir);
                }
                let machine = MachineStats::new(machine).with_runtime(ctx.runtime());
                // The agent's stats service when a plugin provides one (the kubelet reads its
                // summary provider); the machine alone otherwise.
                match ctx.service::<dyn kubelet_api::stats::StatsService>() {
                    Some(service) => {
                        tracing::info!(
                            "eviction: signals and pod usage from the stats service, memory from the machine"
                        );
                        Arc::new(ServiceStats::new(service, machine)) as Arc<dyn StatsProvider>
                    }
                    None => {
                        tracing::info!(
                            "eviction: signals and pod usage from the machine (no stats service)"
                        );
                        Arc::new(machine)
                    }
                }
            }
        };
        let mut manager = EvictionManager::new(self.config.clone(), stats, Arc::new(ctx.handle()))
            .with_shared(
                self.conditions.clone(),
                self.metrics.clone(),
                self.events.clone(),
            )
            .with_recorder(ctx.recorder(), ctx.node_name());
        // Disk pressure is first met by reclaim (dead containers, unused images) when a plugin
        // provides it (the garbage collector), as the kubelet does before it evicts.
        if let Some(reclaimer) = ctx.service::<dyn kubelet_api::NodeReclaimer>() {
            let layout = fs_layout(ctx.runtime().as_ref(), &ctx.dirs().root_dir).await;
            tracing::info!(
                ?layout,
                "eviction: node-level reclaim before evicting for disk pressure"
            );
            manager = manager.with_reclaimer(reclaimer, layout);
        }
        manager.run(shutdown).await;
        Ok(())
    }
}

/// The node's filesystem layout: a separate image filesystem when the runtime's image
/// filesystem is another device than the root directory's, one filesystem otherwise (also
/// when the runtime reports none).
async fn fs_layout(
    runtime: &dyn kubelet_api::ContainerRuntime,
    root_dir: &std::path::Path,
) -> FsLayout {
    use std::os::unix::fs::MetadataExt;
    let answer = tokio::time::timeout(
        crate::machine::IMAGE_FS_INFO_TIMEOUT,
        kubelet_api::image_fs_info_of(runtime),
    )
    .await;
    let Ok(Ok(info)) = answer else {
        return FsLayout::Single;
    };
    let Some(image_fs) = info.image_filesystems.first() else {
        return FsLayout::Single;
    };
    let device = |p: &std::path::Path| std::fs::metadata(p).ok().map(|m| m.dev());
    match (device(&image_fs.mountpoint), device(root_dir)) {
        (Some(a), Some(b)) if a != b => FsLayout::SeparateImageFs,
        _ => FsLayout::Single,
    }
}
