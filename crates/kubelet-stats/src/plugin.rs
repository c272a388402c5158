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
/// How long [`Stats::summary_with_pods`] waits for the collector (a collection of every pod:
/// the runtime's listing and container stats, each with its own timeout) before answering
/// with the latest sample.
pub const PODS_TIMEOUT: Duration = Duration::from_secs(15);

/// What a reader asks the plugin's loop for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    /// Pods collected within the last sampling period.
    Pods,
    /// The node and the pods, collected now.
    All,
}

type Request = (Want, oneshot::Sender<Arc<Summary>>);

struct Shared {
    latest: RwLock<Arc<Summary>>,
    /// The plugin's loop is collecting (a refresh can be answered).
    running: std::sync::atomic::AtomicBool,
    machine: Machine,
    requests: mpsc::Sender<Request>,
}

impl Stats {
    /// Ask the plugin's loop; the latest sample when the loop does not run or does not
    /// answer within `timeout`.
    async fn ask(&self, want: Want, timeout: Duration) -> Arc<Summary> {
        if !self
            .shared
            .running
            .load(std::sync::atomic::Ordering::Acquire)
        {
            return self.summary();
        }
        let (tx, rx) = oneshot::channel();
        if self.shared.requests.send((want, tx)).await.is_ok()
            && let Ok(Ok(s)) = tokio::time::timeout(timeout, rx).await
        {
            return s;
        }
        self.summary()
    }
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

    /// The latest sample when its pods were collected within the last
    /// `housekeeping_interval`; otherwise the collector samples the pods now. The latest one
    /// at once when the plugin's loop does not run, or when the collector does not answer
    /// within [`PODS_TIMEOUT`].
    async fn summary_with_pods(&self) -> Arc<Summary> {
        self.ask(Want::Pods, PODS_TIMEOUT).await
    }

    /// Ask the collector for a sample of the node and the pods now; the latest one at once
    /// when the plugin's loop does not run, or when the collector does not answer within
    /// [`REFRESH_TIMEOUT`].
    async fn refresh(&self) -> Arc<Summary> {
        self.ask(Want::All, REFRESH_TIMEOUT).await
    }

    fn machine(&self) -> Machine {
        self.shared.machine
    }
}

/// The stats subsystem as an agent plugin: samples the node every `housekeeping_interval`
/// with the agent's runtime and directories, the pods when a reader asks for them (at most
/// once per `housekeeping_interval`, as the kubelet's CRI stats provider asks the runtime on
/// each `/stats/summary`), answers refreshes, and provides [`Stats`] to the other plugins
/// (the kubelet API's `/stats/summary` and `/metrics/resource`, eviction). An idle node whose
/// stats nobody reads pays for the node's figures only, whatever its pod count.
pub struct StatsPlugin {
    config: StatsConfig,
    stats: Stats,
    requests: Mutex<Option<mpsc::Receiver<Request>>>,
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
                    requests: tx,
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
        let interval = self.config.housekeeping_interval;
        let collecting = async {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // When the pods were last collected.
            let mut pods_at: Option<tokio::time::Instant> = None;
            loop {
                let first = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tick.tick() => None,
                    Some(request) = requests.recv() => Some(request),
                };
                let mut waiting = Vec::new();
                let mut want = Wanted {
                    node: first.is_none(),
                    pods: false,
                    all: false,
                };
                // Everyone who asked meanwhile is answered by this collection too.
                let mut next = first;
                while let Some((w, reply)) = next.take().or_else(|| requests.try_recv().ok()) {
                    want.add(w);
                    waiting.push(reply);
                }
                let pods_fresh = pods_at.is_some_and(|t| t.elapsed() < interval);
                let collect_pods = want.all || (want.pods && !pods_fresh);
                let latest = self.stats.shared.latest.read().clone();
                let summary = if want.node || collect_pods {
                    // A collection waits for the runtime at most its timeouts; shutdown does
                    // not.
                    let node = if want.node {
                        tokio::select! {
                            _ = shutdown.cancelled() => return,
                            n = collector.collect_node(Some(runtime.as_ref())) => n,
                        }
                    } else {
                        latest.node.clone()
                    };
                    let pods = if collect_pods {
                        let pods = tokio::select! {
                            _ = shutdown.cancelled() => return,
                            p = collector.collect_pods(runtime.as_ref()) => p,
                        };
                        pods_at = Some(tokio::time::Instant::now());
                        pods
                    } else {
                        latest.pods.clone()
                    };
                    let mut s = Summary::new(ctx.node_name());
                    s.node = node;
                    s.pods = pods;
                    let s = Arc::new(s);
                    *self.stats.shared.latest.write() = s.clone();
                    s
                } else {
                    latest
                };
                for reply in waiting {
                    let _ = reply.send(summary.clone());
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

/// What one round of the plugin's loop collects.
#[derive(Debug, Clone, Copy)]
struct Wanted {
    /// The node's figures (every tick, and a refresh).
    node: bool,
    /// Pods no older than a sampling period.
    pods: bool,
    /// The pods collected now (a refresh).
    all: bool,
}

impl Wanted {
    fn add(&mut self, w: Want) {
        self.pods = true;
        if w == Want::All {
            self.node = true;
            self.all = true;
        }
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
