//! The engine: the sync loop that merges pod updates, PLEG events and probe results, and the pod
//! workers (one task per pod UID, latest update wins, never two syncs of one pod at once).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures::FutureExt;
use k8s_openapi::api::core::v1::Pod;
use parking_lot::Mutex;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::agent_config::KubeletConfig;
use crate::handle::KubeletHandle;
use crate::merge::PodConfig;
use crate::plugin::{PluginStates, panic_message};
use crate::status_manager::StatusManager;
use crate::sync::Engine;
use crate::worker::{Lifecycle, WorkerState, worker_loop};
use kubelet_api::ContainerRuntime;
use kubelet_api::PodCache;
use kubelet_api::StatusReader;
use kubelet_api::VolumePlugin;
use kubelet_api::pod;
use kubelet_api::runtime::labels;
use kubelet_api::{
    AgentDirs, AgentPlugin, NodeConditionReader, PLUGIN_STOP_GRACE, PluginContext, PluginState,
};
use kubelet_api::{Event, EventRecorder, InvolvedObject};
use kubelet_api::{KillPodOptions, PodAdmitHandler};
use kubelet_api::{PodLifecycleEvent, PodLifecycleEventGenerator, PodLifecycleEventType};
use kubelet_api::{PodOp, PodUpdate};
use kubelet_api::{ProbeContext, ProbeManager, ProbeUpdate};

pub(crate) enum Command {
    KillPod {
        uid: String,
        options: KillPodOptions,
        done: oneshot::Sender<()>,
    },
}

pub(crate) struct Parts {
    pub(crate) node_name: String,
    pub(crate) config: KubeletConfig,
    pub(crate) runtime: Arc<dyn ContainerRuntime>,
    pub(crate) pleg: Arc<dyn PodLifecycleEventGenerator>,
    pub(crate) pleg_events: mpsc::Receiver<PodLifecycleEvent>,
    pub(crate) pod_config: PodConfig,
    pub(crate) status: StatusManager,
    pub(crate) recorder: EventRecorder,
    pub(crate) events: mpsc::Receiver<Event>,
    pub(crate) volume_plugins: Vec<Arc<dyn VolumePlugin>>,
    pub(crate) object_provider: Option<Arc<dyn kubelet_api::ObjectProvider>>,
    pub(crate) prober: Option<Arc<dyn ProbeManager>>,
    pub(crate) probe_updates: Option<mpsc::Receiver<ProbeUpdate>>,
    pub(crate) admit_handlers: Vec<Arc<dyn PodAdmitHandler>>,
    pub(crate) plugins: Arc<[Arc<dyn AgentPlugin>]>,
    pub(crate) plugin_states: PluginStates,
    pub(crate) services: Arc<kubelet_api::Services>,
    pub(crate) conditions: NodeConditionReader,
    pub(crate) metrics: Arc<prometheus_client::registry::Registry>,
    pub(crate) start_metrics: crate::pod_start::PodStartMetrics,
    pub(crate) cmd_tx: mpsc::Sender<Command>,
    pub(crate) cmd_rx: mpsc::Receiver<Command>,
    pub(crate) sync_loop: SyncLoopMonitor,
    pub(crate) sync_requests: SyncRequests,
}

/// Pods whose sync someone outside the loop asked for ([`KubeletHandle::sync_pod`]), e.g. a
/// ConfigMap watch that saw a change: a set (asking twice before the loop drains it costs
/// nothing) and a wake-up for the loop. Never blocks the caller.
#[derive(Debug, Clone, Default)]
pub(crate) struct SyncRequests(Arc<(Mutex<HashSet<String>>, Notify)>);

impl SyncRequests {
    pub(crate) fn request(&self, uid: &str) {
        let (set, notify) = &*self.0;
        if set.lock().insert(uid.to_string()) {
            notify.notify_one();
        }
    }

    async fn wait(&self) -> Vec<String> {
        let (set, notify) = &*self.0;
        loop {
            {
                let mut s = set.lock();
                if !s.is_empty() {
                    return s.drain().collect();
                }
            }
            notify.notified().await;
        }
    }
}

/// When the sync loop last entered an iteration (the kubelet's `syncLoopMonitor`), for the
/// `/healthz/syncloop` check.
/// It also says whether every pod source has delivered its first set.
#[derive(Debug, Clone, Default)]
pub(crate) struct SyncLoopMonitor {
    last: Arc<Mutex<Option<Instant>>>,
    sources_ready: Arc<std::sync::atomic::AtomicBool>,
}

impl SyncLoopMonitor {
    fn enter(&self) {
        *self.last.lock() = Some(Instant::now());
    }

    pub(crate) fn last(&self) -> Option<Instant> {
        *self.last.lock()
    }

    fn set_sources_ready(&self) {
        self.sources_ready
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn sources_ready(&self) -> bool {
        self.sources_ready
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// A built node agent. Call [`Kubelet::run`] with a shutdown token; the future does nothing
/// unless polled, and stopping it leaves running pods untouched.
pub struct Kubelet {
    parts: Parts,
}

impl std::fmt::Debug for Kubelet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kubelet")
            .field("node_name", &self.parts.node_name)
            .finish_non_exhaustive()
    }
}

struct Worker {
    state: Arc<Mutex<WorkerState>>,
    notify: Arc<Notify>,
    done: Arc<std::sync::atomic::AtomicBool>,
}

impl Kubelet {
    pub(crate) fn assemble(parts: Parts) -> Self {
        Self { parts }
    }

    /// A handle for reading statuses and killing pods while the agent runs.
    pub fn handle(&self) -> KubeletHandle {
        KubeletHandle {
            cmd_tx: self.parts.cmd_tx.clone(),
            statuses: self.parts.status.reader(),
            pleg: self.parts.pleg.clone(),
            plugins: self.parts.plugin_states.clone(),
            metrics: self.parts.metrics.clone(),
            sync_loop: self.parts.sync_loop.clone(),
            sync_requests: self.parts.sync_requests.clone(),
            conditions: self.parts.conditions.clone(),
        }
    }

    /// The agent's metrics registry (see [`AgentHandle::metrics`](kubelet_api::AgentHandle::metrics)).
    pub fn metrics(&self) -> Arc<prometheus_client::registry::Registry> {
        self.parts.metrics.clone()
    }

    /// Reader of the pod statuses the agent generates.
    pub fn status_reader(&self) -> StatusReader {
        self.parts.status.reader()
    }

    /// Run the agent until `shutdown` is cancelled. Running pods keep running after it returns.
    pub async fn run(self, shutdown: CancellationToken) {
        let handle = self.handle();
        let Parts {
            node_name,
            config,
            runtime,
            pleg,
            mut pleg_events,
            pod_config,
            status,
            recorder,
            events,
            volume_plugins,
            object_provider,
            prober,
            mut probe_updates,
            admit_handlers,
            plugins,
            plugin_states,
            services,
            conditions,
            metrics,
            start_metrics,
            cmd_tx: _,
            mut cmd_rx,
            sync_loop: monitor,
            sync_requests,
        } = self.parts;
        let inner = shutdown.child_token();
        let mut tasks = JoinSet::new();

        let runtime_name = match runtime.version().await {
            Ok(v) => v.runtime_name,
            Err(e) => {
                tracing::warn!(error = %kubelet_api::chain(&e), "runtime version unavailable");
                "unknown".to_string()
            }
        };
        let source_names: HashSet<String> = pod_config.source_names().into_iter().collect();
        let (mut updates, config_future) = pod_config.start(inner.clone());
        tasks.spawn(config_future);
        // A new pod's first sync waits for a runtime view newer than this: taken before the
        // PLEG starts, so that its first relist (which may begin at once on another thread)
        // counts, and a pod seen in the agent's first second does not wait for the next
        // global cache update.
        let started_at = Instant::now();
        {
            let pleg = pleg.clone();
            let t = inner.clone();
            tasks.spawn(async move { pleg.run(t).await });
        }
        {
            let status = status.clone();
            let t = inner.clone();
            tasks.spawn(async move { status.run(events, t).await });
        }
        if let Some(p) = &prober {
            let p = p.clone();
            let ctx = ProbeContext {
                statuses: status.reader(),
                runtime: runtime.clone(),
                recorder: recorder.clone(),
            };
            let t = inner.clone();
            tasks.spawn(async move { p.run(ctx, t).await });
        }
        let plugin_ctx = PluginContext::new(
            node_name.clone(),
            AgentDirs {
                root_dir: config.root_dir.clone(),
                pod_log_dir: config.pod_log_dir.clone(),
            },
            runtime.clone(),
            recorder.clone(),
            Arc::new(handle),
            conditions,
            metrics,
        )
        .with_services(services.clone());
        let plugin_token = CancellationToken::new();
        let mut plugin_tasks = JoinSet::new();
        for (index, plugin) in plugins.iter().enumerate() {
            plugin_tasks.spawn(run_plugin(
                plugin.clone(),
                index,
                plugin_states.clone(),
                plugin_ctx.clone(),
                plugin_token.clone(),
            ));
        }
        drop(plugin_ctx);

        let cache: PodCache = pleg.cache();
        let engine = Arc::new(
            Engine::new(
                node_name,
                config.clone(),
                runtime,
                runtime_name,
                cache,
                status.clone(),
                recorder.clone(),
                volume_plugins,
                prober.clone(),
                started_at,
            )
            .with_object_provider(object_provider)
            .with_resources(services.get::<dyn kubelet_api::resources::PodResourceManager>())
            .with_pleg(pleg.clone())
            .with_start_metrics(start_metrics),
        );

        let mut loop_state = SyncLoop {
            engine,
            workers: HashMap::new(),
            tasks: JoinSet::new(),
            shutdown: inner.clone(),
            sources_seen: HashSet::new(),
            source_names,
            admit_handlers,
            recorder,
            warn_no_prober: prober.is_none(),
            finished: Arc::default(),
            settled: None,
        };
        let mut housekeeping = tokio::time::interval(config.housekeeping_period);
        housekeeping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

        loop {
            monitor.enter();
            tokio::select! {
                biased;
                _ = inner.cancelled() => break,
                Some(cmd) = cmd_rx.recv() => loop_state.handle_command(cmd),
                Some(u) = updates.recv() => {
                    loop_state.handle_update(u);
                    if loop_state.seen_all_sources() {
                        monitor.set_sources_ready();
                    }
                }
                Some(ev) = pleg_events.recv() => loop_state.handle_pleg_event(ev),
                Some(pu) = async { match probe_updates.as_mut() { Some(r) => r.recv().await, None => std::future::pending().await } } => {
                    loop_state.probe_result_changed(&pu);
                }
                uids = sync_requests.wait() => {
                    for uid in uids {
                        loop_state.sync_requested(&uid);
                    }
                }
                _ = housekeeping.tick() => loop_state.housekeeping(),
                Some(res) = loop_state.tasks.join_next(), if !loop_state.tasks.is_empty() => {
                    if let Err(e) = res && e.is_panic() {
                        tracing::error!(error = %kubelet_api::chain(&e), "pod worker panicked");
                    }
                }
            }
        }
        tracing::info!("kubelet stopping; running pods are left as they are");
        inner.cancel();
        loop_state.tasks.shutdown().await;
        plugin_token.cancel();
        let stopped = tokio::time::timeout(PLUGIN_STOP_GRACE, async {
            while plugin_tasks.join_next().await.is_some() {}
        })
        .await;
        if stopped.is_err() {
            tracing::warn!(
                grace = ?PLUGIN_STOP_GRACE,
                "plugins still running after the shutdown grace period; dropping them"
            );
        }
        plugin_tasks.shutdown().await;
        // The status manager delivers the statuses it still has (bounded by its own flush
        // period); the other tasks end at the cancellation.
        let _ = tokio::time::timeout(TASK_STOP_GRACE, async {
            while tasks.join_next().await.is_some() {}
        })
        .await;
        tasks.shutdown().await;
    }
}

/// How long the agent's own tasks (PLEG, sources, prober, status manager) get to end after
/// the stop: the status manager's last deliveries.
const TASK_STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(4);

/// Whether any container of `pod` has a liveness, readiness or startup probe.
fn has_probes(pod: &Pod) -> bool {
    pod.spec.as_ref().is_some_and(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
            .any(|c| {
                c.liveness_probe.is_some()
                    || c.readiness_probe.is_some()
                    || c.startup_probe.is_some()
            })
    })
}

/// Drive one plugin's loop, reporting an error or a panic with its name (the failure policy of
/// [`crate::plugin`]): the agent and the other plugins go on.
async fn run_plugin(
    plugin: Arc<dyn AgentPlugin>,
    index: usize,
    states: PluginStates,
    ctx: PluginContext,
    shutdown: CancellationToken,
) {
    let name = plugin.name().to_string();
    let recorder = ctx.recorder();
    let node = ctx.node_name().to_string();
    states.set(index, PluginState::Running);
    tracing::debug!(plugin = %name, "starting plugin");
    let outcome = std::panic::AssertUnwindSafe(plugin.run(ctx, shutdown))
        .catch_unwind()
        .await;
    let state = match outcome {
        Ok(Ok(())) => PluginState::Stopped,
        Ok(Err(e)) => {
            tracing::error!(plugin = %name, error = %kubelet_api::chain(&e), "plugin failed; the agent goes on without it");
            recorder.warning(
                InvolvedObject::node(&node),
                "PluginFailed",
                format!("plugin {name} failed: {e}"),
            );
            PluginState::Failed(e.to_string())
        }
        Err(payload) => {
            let message = panic_message(payload.as_ref());
            tracing::error!(plugin = %name, panic = %message, "plugin panicked; the agent goes on without it");
            recorder.warning(
                InvolvedObject::node(&node),
                "PluginFailed",
                format!("plugin {name} panicked: {message}"),
            );
            PluginState::Panicked(message)
        }
    };
    states.set(index, state);
}

struct SyncLoop {
    engine: Arc<Engine>,
    workers: HashMap<String, Worker>,
    tasks: JoinSet<()>,
    shutdown: CancellationToken,
    sources_seen: HashSet<String>,
    source_names: HashSet<String>,
    admit_handlers: Vec<Arc<dyn PodAdmitHandler>>,
    recorder: EventRecorder,
    /// No prober is configured and no pod with probes was seen yet: warn at the first one.
    warn_no_prober: bool,
    /// Workers that ended so far.
    finished: Arc<std::sync::atomic::AtomicU64>,
    /// The ended workers' and the cache's change counts when a housekeeping pass last found
    /// no orphan: until either changes, the next passes would find none either (orphans come
    /// only from new or changed cache entries and from workers that end).
    settled: Option<(u64, u64)>,
}

impl SyncLoop {
    fn seen_all_sources(&self) -> bool {
        self.source_names.is_subset(&self.sources_seen)
    }

    fn notify(&self, uid: &str) {
        if let Some(w) = self.workers.get(uid) {
            w.notify.notify_one();
        }
    }

    /// A probe result changed: readiness and startup show in the status at once, and the pod
    /// is synced on a fresh runtime view (so a liveness failure's kill does not wait for the
    /// PLEG's next relist or global timestamp; the kubelet's generic PLEG relists every second).
    fn probe_result_changed(&self, u: &ProbeUpdate) {
        self.engine.probe_result_changed(u);
        self.sync_requested(&u.pod_uid);
    }

    /// [`KubeletHandle::sync_pod`]: wake the worker and, since nothing changed in the runtime,
    /// have the PLEG inspect the pod now, so the sync need not wait for the next relist (or,
    /// with the evented PLEG, the next global cache timestamp) to get a fresh runtime view.
    fn sync_requested(&self, uid: &str) {
        let Some(w) = self.workers.get(uid) else {
            return;
        };
        let pod = {
            let st = w.state.lock();
            if st.terminated() || st.orphan {
                return;
            }
            st.pod.clone()
        };
        self.engine.request_reinspect(&pod);
        w.notify.notify_one();
    }

    fn handle_command(&mut self, cmd: Command) {
        match cmd {
            Command::KillPod { uid, options, done } => match self.workers.get(&uid) {
                Some(w) => {
                    let mut st = w.state.lock();
                    if st.terminated() {
                        let _ = done.send(());
                    } else {
                        st.kill_waiters.push(done);
                        st.kill = Some(merge_kill(st.kill.take(), options));
                        drop(st);
                        w.notify.notify_one();
                    }
                }
                None => {
                    let _ = done.send(());
                }
            },
        }
    }

    fn active_pods(&self) -> Vec<Arc<Pod>> {
        self.workers
            .values()
            .filter(|w| !w.done.load(std::sync::atomic::Ordering::Relaxed))
            .filter_map(|w| {
                let st = w.state.lock();
                (!st.terminated() && !st.orphan).then(|| Arc::clone(&st.pod))
            })
            .collect()
    }

    fn handle_update(&mut self, u: PodUpdate) {
        self.sources_seen.insert(u.source.clone());
        match u.op {
            PodOp::Add => {
                let mut pods = u.pods;
                kubelet_api::sort::by(&mut pods, |a, b| {
                    a.metadata
                        .creation_timestamp
                        .as_ref()
                        .map(|t| t.0)
                        .cmp(&b.metadata.creation_timestamp.as_ref().map(|t| t.0))
                });
                // The active pods are gathered once per batch (and only when someone admits);
                // each admitted pod joins them for the next decision.
                let mut active = if self.admit_handlers.is_empty() {
                    Vec::new()
                } else {
                    self.active_pods()
                };
                for p in pods {
                    if !self.workers.contains_key(pod::uid(&p)) {
                        self.engine
                            .start_metrics()
                            .seen(pod::uid(&p), std::time::Instant::now());
                    }
                    if self.warn_no_prober && has_probes(&p) {
                        self.warn_no_prober = false;
                        tracing::warn!(
                            pod = %pod::full_name(&p),
                            "pod has probes but the agent has no prober: they are not run and its containers count as ready once running (KubeletBuilder::prober)"
                        );
                    }
                    if !self.admit_handlers.is_empty() && !self.workers.contains_key(pod::uid(&p)) {
                        let deciding = std::time::Instant::now();
                        let rejected = self.admit_handlers.iter().find_map(|h| {
                            let r = h.admit(&p, &active);
                            (!r.admit).then_some(r)
                        });
                        self.engine.start_metrics().admitted(deciding);
                        if let Some(r) = rejected {
                            self.engine.start_metrics().forget(pod::uid(&p));
                            self.recorder.warning(
                                InvolvedObject::pod(&p),
                                &r.reason,
                                r.message.clone(),
                            );
                            self.engine.reject_pod(&p, &r.reason, &r.message);
                            continue;
                        }
                        active.push(p.clone());
                    }
                    self.dispatch(p, false, true);
                }
            }
            PodOp::Update | PodOp::Delete => {
                for p in u.pods {
                    self.dispatch(p, false, false);
                }
            }
            PodOp::Reconcile => {
                for p in u.pods {
                    if let Some(w) = self.workers.get(pod::uid(&p)) {
                        w.state.lock().pod = p;
                    }
                }
            }
            PodOp::Remove => {
                for p in u.pods {
                    match self.workers.get(pod::uid(&p)) {
                        Some(w) => {
                            let mut st = w.state.lock();
                            st.removed = true;
                            if st.kill.is_none() {
                                st.kill = Some(KillPodOptions::default());
                            }
                            drop(st);
                            w.notify.notify_one();
                        }
                        None => self.engine.forget_rejected(&p),
                    }
                }
            }
        }
    }

    fn handle_pleg_event(&mut self, ev: PodLifecycleEvent) {
        if ev.kind == PodLifecycleEventType::ContainerDied {
            self.engine.observe_exit(&ev.container_id);
        }
        if ev.kind != PodLifecycleEventType::ContainerRemoved {
            self.notify(&ev.pod_uid);
        }
    }

    /// Start a worker for `p` or hand it the newer pod. `added` marks a pod (re)added by its
    /// source: a worker tearing the same UID down runs it again afterwards.
    fn dispatch(&mut self, p: Arc<Pod>, orphan: bool, added: bool) {
        let uid = pod::uid(&p).to_string();
        if let Some(w) = self.workers.get(&uid) {
            let mut st = w.state.lock();
            // A worker that has finished its cleanup is ending: a pod added again gets a new
            // worker (a restart asked of the old one now would be lost).
            if w.done.load(std::sync::atomic::Ordering::Relaxed)
                || (added && st.lifecycle == Lifecycle::Finished)
            {
                drop(st);
                self.workers.remove(&uid);
            } else {
                if added && st.removed && !st.orphan {
                    st.restart_requested = true;
                }
                st.pod = p;
                drop(st);
                w.notify.notify_one();
                return;
            }
        }
        let state = Arc::new(Mutex::new(WorkerState::new(p, orphan)));
        let notify = Arc::new(Notify::new());
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        notify.notify_one();
        let engine = self.engine.clone();
        let shutdown = self.shutdown.clone();
        {
            let state = state.clone();
            let notify = notify.clone();
            let done = done.clone();
            let finished = self.finished.clone();
            self.tasks.spawn(async move {
                let run =
                    std::panic::AssertUnwindSafe(worker_loop(engine, state, notify, shutdown))
                        .catch_unwind();
                if run.await.is_err() {
                    tracing::error!(podUID = %uid, "pod worker panicked; the pod is left as it is");
                }
                done.store(true, std::sync::atomic::Ordering::Relaxed);
                finished.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            });
        }
        self.workers.insert(
            pod_uid_of(&state),
            Worker {
                state,
                notify,
                done,
            },
        );
    }

    fn housekeeping(&mut self) {
        let cache = self.engine.cache().clone();
        // Read before the pass: a change after this point is seen by the next one.
        let seen = (
            self.finished.load(std::sync::atomic::Ordering::SeqCst),
            cache.entry_changes(),
        );
        if self.settled == Some(seen) {
            return;
        }
        self.settled = None;
        // Forget finished workers.
        self.workers
            .retain(|_, w| !w.done.load(std::sync::atomic::Ordering::Relaxed));
        if !self.seen_all_sources() {
            return;
        }
        // Runtime pods that no source knows and no worker handles are orphans: stop them.
        let mut orphans = false;
        for uid in cache.uids_where(|uid| !self.workers.contains_key(uid)) {
            let Some(entry) = cache.get(&uid) else {
                continue;
            };
            let Ok(st) = entry.status else { continue };
            let ours = st
                .sandbox_statuses
                .iter()
                .any(|s| s.labels.contains_key(labels::MANAGED_BY))
                || st
                    .container_statuses
                    .iter()
                    .any(|c| c.labels.contains_key(labels::MANAGED_BY));
            if !ours {
                continue;
            }
            if st.sandbox_statuses.is_empty() && st.container_statuses.is_empty() {
                continue;
            }
            tracing::info!(podUID = %uid, pod = %st.name, "stopping runtime pod unknown to every source");
            let mut p = Pod::default();
            p.metadata.uid = Some(uid.clone());
            p.metadata.name = Some(st.name.clone());
            p.metadata.namespace = Some(st.namespace.clone());
            self.dispatch(Arc::new(p), true, false);
            orphans = true;
        }
        if !orphans {
            self.settled = Some(seen);
        }
    }
}

fn pod_uid_of(state: &Arc<Mutex<WorkerState>>) -> String {
    pod::uid(&state.lock().pod).to_string()
}

fn merge_kill(old: Option<KillPodOptions>, new: KillPodOptions) -> KillPodOptions {
    match old {
        None => new,
        Some(mut o) => {
            o.grace_period_override = match (o.grace_period_override, new.grace_period_override) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            if new.evict {
                o.evict = true;
                o.reason = new.reason;
                o.message = new.message;
                o.condition = new.condition;
            }
            o
        }
    }
}
