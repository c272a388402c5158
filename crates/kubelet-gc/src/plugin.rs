//! [`GcPlugin`]: the collectors as an agent plugin, and the [`NodeReclaimer`] it provides.

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use kubelet_api::stats::StatsService;
use kubelet_api::{
    AgentHandle, AgentPlugin, ContainerRuntime, EventRecorder, InvolvedObject, NodeReclaimer,
    NodeResources, PluginContext, ServiceConflict, Services,
};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::config::GcConfig;
use crate::containers::ContainerGc;
use crate::error::GcError;
use crate::images::{FsUsage, ImageGc, ImageGcOutcome, Reason};
use crate::logs::LogRotator;

/// How often the node status's image list is refreshed (the kubelet's image cache period).
const IMAGE_LIST_PERIOD: std::time::Duration = std::time::Duration::from_secs(30);

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// What the collectors need of the running agent, set when the plugin starts.
struct Running {
    runtime: Arc<dyn ContainerRuntime>,
    handle: Arc<dyn AgentHandle>,
    containers: ContainerGc,
    stats: Option<Arc<dyn StatsService>>,
}

struct Shared {
    config: GcConfig,
    images: ImageGc,
    logs: LogRotator,
    running: OnceLock<Running>,
    /// `kubelet_image_garbage_collected_total{reason}`.
    collected: Family<ReasonLabel, Counter>,
    /// Serializes image removal between the periodic run and eviction's reclaim.
    image_lock: tokio::sync::Mutex<()>,
    /// `status.images` as last listed (every 30 s, as the kubelet's image cache).
    node_images: parking_lot::RwLock<Option<Vec<k8s_openapi::api::core::v1::ContainerImage>>>,
}

impl Shared {
    fn count(&self, outcome: &ImageGcOutcome) {
        for (_, reason) in &outcome.removed {
            let reason = match reason {
                Reason::Age => "age",
                Reason::Space => "space",
            };
            self.collected.get_or_create(&ReasonLabel { reason }).inc();
        }
    }

    fn image_fs_usage(&self, running: &Running) -> Option<FsUsage> {
        let summary = running.stats.as_ref()?.summary();
        let fs = summary
            .node
            .runtime
            .as_ref()
            .and_then(|r| r.image_fs.as_ref())
            .or(summary.node.fs.as_ref())?;
        Some(FsUsage {
            capacity: fs.capacity_bytes?,
            available: fs.available_bytes?,
        })
    }

    /// List the runtime's images for the node status; a runtime without images reports none.
    async fn refresh_node_images(&self, running: &Running) {
        let Some(images) = running.runtime.images() else {
            return;
        };
        match images.list_images().await {
            Ok(list) => {
                *self.node_images.write() = Some(crate::images::node_images(
                    list,
                    crate::images::NODE_STATUS_MAX_IMAGES,
                ));
            }
            Err(e) => {
                tracing::warn!(error = %kubelet_api::chain(&e), "listing images for the node status failed");
            }
        }
    }

    async fn collect_images(&self, running: &Running) -> Result<ImageGcOutcome, GcError> {
        let _one = self.image_lock.lock().await;
        let usage = self.image_fs_usage(running);
        let r = self.images.collect(running.runtime.as_ref(), usage).await;
        if let Ok(o) = &r {
            self.count(o);
        }
        r
    }
}

/// Disk hygiene as an agent plugin: image garbage collection every 5 minutes, container
/// garbage collection every minute and log rotation every 10 seconds (see the crate docs),
/// with the agent's runtime. The log rotation checks the running containers of the agent's
/// pod statuses (see [`logs`](crate::logs)). Provides the [`NodeReclaimer`] service that eviction runs before
/// it evicts a pod for disk pressure. Image usage comes from the agent's
/// [`StatsService`] (the image filesystem's capacity and free space); without one, only
/// `imageMaximumGCAge` removes images.
pub struct GcPlugin {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for GcPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GcPlugin")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl GcPlugin {
    /// The plugin with `config` (checked as the kubelet validates it).
    pub fn new(config: GcConfig) -> Result<Self, GcError> {
        config.validate()?;
        Ok(Self {
            shared: Arc::new(Shared {
                images: ImageGc::new(config.images.clone()),
                logs: LogRotator::new(config.logs.clone())
                    .with_log_links(config.container_log_dir.clone()),
                config,
                running: OnceLock::new(),
                collected: Family::default(),
                image_lock: tokio::sync::Mutex::new(()),
                node_images: parking_lot::RwLock::new(None),
            }),
        })
    }

    /// The node-level reclaim this plugin provides (also registered as a service).
    pub fn reclaimer(&self) -> Arc<dyn NodeReclaimer> {
        Arc::new(Reclaimer {
            shared: self.shared.clone(),
        })
    }
}

/// Eviction's reclaim: every dead container, then every unused image.
struct Reclaimer {
    shared: Arc<Shared>,
}

#[async_trait]
impl NodeReclaimer for Reclaimer {
    async fn delete_unused_containers(&self) -> kubelet_api::Result<()> {
        let running = self.shared.running.get().ok_or(GcError::NotRunning)?;
        let out = running
            .containers
            .collect(running.runtime.as_ref(), running.handle.as_ref(), true)
            .await?;
        tracing::info!(
            containers = out.containers.len(),
            sandboxes = out.sandboxes.len(),
            "reclaim: removed dead containers"
        );
        Ok(())
    }

    async fn delete_unused_images(&self) -> kubelet_api::Result<()> {
        let running = self.shared.running.get().ok_or(GcError::NotRunning)?;
        let _one = self.shared.image_lock.lock().await;
        let out = self
            .shared
            .images
            .delete_unused(running.runtime.as_ref())
            .await?;
        self.shared.count(&out);
        tracing::info!(
            images = out.removed.len(),
            bytes = out.freed,
            "reclaim: removed unused images"
        );
        Ok(())
    }
}

/// Reports a failure the way the kubelet's loops do: the first failure of a loop is only
/// logged ("stats initialization may not have completed yet"), later consecutive ones are
/// Warning events on the Node.
struct FailureReport {
    failed_before: bool,
}

impl FailureReport {
    fn report(
        &mut self,
        recorder: &EventRecorder,
        node: &InvolvedObject,
        reason: &str,
        r: Result<(), String>,
    ) {
        match r {
            Ok(()) => self.failed_before = false,
            Err(message) => {
                if self.failed_before {
                    recorder.warning(node.clone(), reason, message.clone());
                }
                tracing::warn!(reason, error = %message, "garbage collection failed");
                self.failed_before = true;
            }
        }
    }
}

#[async_trait]
impl AgentPlugin for GcPlugin {
    fn name(&self) -> &str {
        "gc"
    }

    fn provide_services(&self, services: &mut Services) -> Result<(), ServiceConflict> {
        services.provide::<dyn NodeReclaimer>(self.name(), self.reclaimer())
    }

    fn node_resources(&self) -> NodeResources {
        let mut r = NodeResources::default();
        r.images = self.shared.node_images.read().clone();
        r
    }

    fn register_metrics(&self, registry: &mut Registry) {
        registry.register(
            "kubelet_image_garbage_collected",
            "Total number of images garbage collected by the kubelet, whether through disk usage or image age.",
            self.shared.collected.clone(),
        );
    }

    async fn run(
        &self,
        ctx: PluginContext,
        shutdown: CancellationToken,
    ) -> kubelet_api::Result<()> {
        let shared = &self.shared;
        let running = Running {
            runtime: ctx.runtime(),
            handle: ctx.handle(),
            containers: ContainerGc::new(
                shared.config.containers.clone(),
                ctx.dirs().clone(),
                shared.config.container_log_dir.clone(),
            ),
            stats: ctx.service::<dyn StatsService>(),
        };
        if running.stats.is_none() {
            tracing::info!("gc: no stats service: images are removed by age only");
        }
        let _ = shared.running.set(running);
        let Some(running) = shared.running.get() else {
            return Ok(());
        };
        let recorder = ctx.recorder();
        let node = InvolvedObject::node(ctx.node_name());
        let interval = |d| {
            let mut i = tokio::time::interval(d);
            i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            i
        };
        let mut image_tick = interval(shared.config.images.period);
        let mut container_tick = interval(shared.config.containers.period);
        let mut log_tick = interval(shared.config.logs.monitor_interval);
        let mut image_list_tick = interval(IMAGE_LIST_PERIOD);
        let (mut image_failures, mut container_failures) = (
            FailureReport {
                failed_before: false,
            },
            FailureReport {
                failed_before: false,
            },
        );
        // The running containers whose logs are checked, from the pod statuses as of a count of
        // the status store's changes: taken again only when a status changed (building them on
        // every check cost as much as the checks' `stat`s).
        let mut log_containers: (Option<u64>, Vec<crate::logs::RunningContainer>) =
            (None, Vec::new());
        // The first image collection waits one period, as the kubelet's (stats need a start).
        image_tick.tick().await;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = image_tick.tick() => {
                    let r = shared.collect_images(running).await;
                    let reason = match &r {
                        Err(GcError::FreeDiskSpace { .. }) => "FreeDiskSpaceFailed",
                        Err(GcError::InvalidDiskCapacity) => "InvalidDiskCapacity",
                        _ => "ImageGCFailed",
                    };
                    image_failures.report(&recorder, &node, reason, r.map(|_| ()).map_err(|e| e.to_string()));
                }
                _ = container_tick.tick() => {
                    let r = running
                        .containers
                        .collect(running.runtime.as_ref(), running.handle.as_ref(), false)
                        .await;
                    container_failures.report(&recorder, &node, "ContainerGCFailed", r.map(|_| ()).map_err(|e| e.to_string()));
                }
                _ = image_list_tick.tick() => shared.refresh_node_images(running).await,
                _ = log_tick.tick(), if shared.logs.enabled() => {
                    let statuses = running.handle.statuses();
                    let changes = statuses.changes();
                    if log_containers.0 != Some(changes) {
                        log_containers = (
                            Some(changes),
                            crate::logs::running_containers(&statuses.list()),
                        );
                    }
                    match shared.logs.rotate(running.runtime.as_ref(), &log_containers.1).await {
                        Ok(outcome) => {
                            for (container, dir) in outcome.recreated {
                                recorder.warning(
                                    container,
                                    "ContainerLogDirectoryRecreated",
                                    format!("the log directory {} of a running container was removed; it was recreated and the log reopened", dir.display()),
                                );
                            }
                        }
                        Err(e) => tracing::warn!(error = %e, "container log rotation failed"),
                    }
                }
            }
        }
    }
}
