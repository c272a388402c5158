//! [`StatsPlugin`]: drives a [`Collector`] in the agent and provides [`Stats`], the agent's
//! [`StatsService`].

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use kubelet_api::stats::{Machine, StatsService, Summary};
use kubelet_api::{AgentPlugin, PluginContext, ServiceConflict, Services};
use parking_lot::{Mutex, RwLock};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::collector::{Collector, StatsConfig, read_machine};

/// How long [`Stats::refresh`] waits for the collector before answering with the latest
/// sample.
pub const REFRESH_TIMEOUT: Duration = Duration::from_secs(5);

struct Shared {
    latest: RwLock<Arc<Summary>>,
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

    /// Ask the collector for a sample now; the latest one when the collector does not run or
    /// does not answer within [`REFRESH_TIMEOUT`].
    async fn refresh(&self) -> Arc<Summary> {
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
                let summary = Arc::new(collector.collect(Some(runtime.as_ref())).await);
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
        tokio::join!(collecting, watching);
        Ok(())
    }
}
