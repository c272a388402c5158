//! [`StatsPlugin`]: drives a [`Collector`] in the agent and provides [`Stats`], the agent's
//! [`StatsService`].

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use kubelet_api::k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kubelet_api::stats::{Machine, StatsService, Summary};
use kubelet_api::{AgentPlugin, NodeResources, PluginContext, ServiceConflict, Services};
use parking_lot::{Mutex, RwLock};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::collector::{Collector, StatsConfig, read_machine};

/// How long [`Stats::refresh`] waits for the collector before answering with the latest
/// sample.
pub const REFRESH_TIMEOUT: Duration = Duration::from_secs(5);

struct Shared {
    latest: RwLock<Arc<Summary>>,
    /// The plugin's loop is collecting (a refresh can be answered).
    running: std::sync::atomic::AtomicBool,
    machine: Machine,
    refresh: mpsc::Sender<oneshot::Sender<Arc<Summary>>>,
}

/// The agent's stats: the latest sample (a cheap `Arc` clone) and an on-demand refresh.
/// Cheap to clone; what the [`StatsPlugin`] provides as `Arc<dyn StatsService>`.
#[derive(Clone)]
pub struct Stats {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stats")
            .field("machine", &self.shared.machine)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl StatsService for Stats {
    fn summary(&self) -> Arc<Summary> {
        self.shared.latest.read().clone()
    }

    /// Ask the collector for a sample now; the latest one at once when the plugin's loop does
    /// not run, or when the collector does not answer within [`REFRESH_TIMEOUT`].
    async fn refresh(&self) -> Arc<Summary> {
        if !self
            .shared
            .running
            .load(std::sync::atomic::Ordering::Acquire)
        {
            return self.summary();
        }
        let (tx, rx) = oneshot::channel();
        if self.shared.refresh.send(tx).await.is_ok()
            && let Ok(Ok(s)) = tokio::time::timeout(REFRESH_TIMEOUT, rx).await
        {
            return s;
        }
        self.summary()
    }

    fn machine(&self) -> Machine {
        self.shared.machine
    }
}

/// The stats subsystem as an agent plugin: samples every `housekeeping_interval` with the
/// agent's runtime and directories, answers refreshes, and provides [`Stats`] to the other
/// plugins (the kubelet API's `/stats/summary` and `/metrics/resource`, eviction).
pub struct StatsPlugin {
    config: StatsConfig,
    stats: Stats,
    requests: Mutex<Option<mpsc::Receiver<oneshot::Sender<Arc<Summary>>>>>,
}

impl std::fmt::Debug for StatsPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatsPlugin")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl StatsPlugin {
    /// A plugin with `config`. The machine's capacity is read now.
    pub fn new(config: StatsConfig) -> Self {
        let (tx, rx) = mpsc::channel(8);
        let machine = read_machine(&config.proc_root, &config.sys_root);
        Self {
            stats: Stats {
                shared: Arc::new(Shared {
                    latest: RwLock::new(Arc::new(Summary::default())),
                    running: std::sync::atomic::AtomicBool::new(false),
                    machine,
                    refresh: tx,
                }),
            },
            config,
            requests: Mutex::new(Some(rx)),
        }
    }

    /// The service this plugin feeds (for a host that wires it by hand).
    pub fn stats(&self) -> Stats {
        self.stats.clone()
    }
}

#[async_trait]
impl AgentPlugin for StatsPlugin {
    fn name(&self) -> &str {
        "stats"
    }

    /// The machine's `cpu` and `memory`, and nodefs' size as `ephemeral-storage` once sampled.
    fn node_resources(&self) -> NodeResources {
        let machine = self.stats.shared.machine;
        let mut r = NodeResources::default();
        r.capacity
            .insert("cpu".into(), Quantity(machine.num_cores.to_string()));
        r.capacity
            .insert("memory".into(), bytes_quantity(machine.memory_capacity));
        if let Some(bytes) = self
            .stats
            .summary()
            .node
            .fs
            .as_ref()
            .and_then(|f| f.capacity_bytes)
        {
            r.capacity
                .insert("ephemeral-storage".into(), bytes_quantity(bytes));
        }
        r
    }

    fn provide_services(&self, services: &mut Services) -> Result<(), ServiceConflict> {
        services.provide::<dyn StatsService>(self.name(), Arc::new(self.stats.clone()))
    }

    async fn run(
        &self,
        ctx: PluginContext,
        shutdown: CancellationToken,
    ) -> kubelet_api::Result<()> {
        let Some(mut requests) = self.requests.lock().take() else {
            return Err(kubelet_api::Error::internal("the stats plugin runs once"));
        };
        *self.stats.shared.latest.write() = Arc::new(Summary::new(ctx.node_name()));
        let mut collector =
            Collector::new(ctx.node_name(), ctx.dirs().clone(), self.config.clone());
        let runtime = ctx.runtime();
        let boot_time = collector.boot_time();
        let collecting = async {
            let mut tick = tokio::time::interval(self.config.housekeeping_interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let waiting = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tick.tick() => None,
                    Some(reply) = requests.recv() => Some(reply),
                };
                // A collection waits for the runtime at most its timeouts; shutdown does not.
                let summary = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    s = collector.collect(Some(runtime.as_ref())) => Arc::new(s),
                };
                *self.stats.shared.latest.write() = summary.clone();
                if let Some(reply) = waiting {
                    let _ = reply.send(summary.clone());
                    // Everyone who asked meanwhile gets this sample too.
                    while let Ok(reply) = requests.try_recv() {
                        let _ = reply.send(summary.clone());
                    }
                }
            }
        };
        let recorder = ctx.recorder();
        let watching = async {
            if let Some(kmsg) = &self.config.kmsg {
                crate::oom::watch(kmsg, boot_time, ctx.node_name(), &recorder, &shutdown).await;
            }
        };
        self.stats
            .shared
            .running
            .store(true, std::sync::atomic::Ordering::Release);
        tokio::join!(collecting, watching);
        self.stats
            .shared
            .running
            .store(false, std::sync::atomic::Ordering::Release);
        Ok(())
    }
}

/// Bytes as the kubelet writes them in a node status: `Ki` when whole kibibytes.
fn bytes_quantity(bytes: u64) -> Quantity {
    if bytes.is_multiple_of(1024) {
        Quantity(format!("{}Ki", bytes / 1024))
    } else {
        Quantity(bytes.to_string())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_plugin_reports_the_machines_capacity_and_serves_its_latest_sample() {
        let plugin = StatsPlugin::new(StatsConfig::default().kmsg(None));
        let machine = plugin.stats().machine();
        assert!(machine.num_cores >= 1 && machine.memory_capacity > 0);
        let r = plugin.node_resources();
        assert_eq!(r.capacity["cpu"].0, machine.num_cores.to_string());
        assert_eq!(
            r.capacity["memory"],
            bytes_quantity(machine.memory_capacity)
        );
        // No sample yet: no ephemeral-storage, and a refresh without a running loop answers
        // with the latest (empty) sample at once.
        assert!(!r.capacity.contains_key("ephemeral-storage"));
        let s = tokio::time::timeout(REFRESH_TIMEOUT, plugin.stats().refresh())
            .await
            .unwrap();
        assert!(s.pods.is_empty());
        assert_eq!(bytes_quantity(2048).0, "2Ki");
        assert_eq!(bytes_quantity(1000).0, "1000");
        let mut services = Services::default();
        plugin.provide_services(&mut services).unwrap();
        assert!(services.get::<dyn StatsService>().is_some());
        assert!(
            plugin.provide_services(&mut services).is_err(),
            "a second provider"
        );
    }
}
