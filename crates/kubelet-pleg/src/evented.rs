//! [`EventedPleg`]: the runtime's pushed container events first, the relist as the safety net
//! (`pkg/kubelet/pleg/evented.go`, with the relist PLEG it runs beside).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use futures::future::BoxFuture;
use kubelet_api::runtime::{ContainerEvent, ContainerEventKind, ContainerEventStream};
use kubelet_api::{
    ContainerRuntime, ErrorKind, PlegEvents, PlegHealth, PodCache, PodLifecycleEventGenerator,
};
use parking_lot::Mutex;
use prometheus_client::registry::Registry;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::core::{Core, Listing, PlegDiagnosis, SlowPod};
use crate::generic::{
    GENERIC_PLEG_RELIST_PERIOD, GENERIC_PLEG_RELIST_THRESHOLD, GenericPlegConfig, RelistReport,
};
use crate::metrics::PlegMetrics;

/// The kubelet's relist period while events flow (`genericPlegRelistPeriod` in evented mode).
pub const EVENTED_RELIST_PERIOD: Duration = Duration::from_secs(300);
/// The kubelet's relist health threshold while events flow.
pub const EVENTED_RELIST_THRESHOLD: Duration = Duration::from_secs(600);
/// The kubelet's `globalCacheUpdatePeriod`: how often the cache's global timestamp advances.
pub const GLOBAL_CACHE_UPDATE_PERIOD: Duration = Duration::from_secs(2);
/// The kubelet's `eventedPlegMaxStreamRetries`: failed subscriptions before falling back.
pub const EVENTED_PLEG_MAX_STREAM_RETRIES: u32 = 5;

/// Settings of an [`EventedPleg`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EventedPlegConfig {
    /// Relist and inspection settings while events flow: the relist is the safety net, run every
    /// [`relist_period`](GenericPlegConfig::relist_period) (default 300 s) with a
    /// [`relist_threshold`](GenericPlegConfig::relist_threshold) of 10 min.
    pub relist: GenericPlegConfig,
    /// Relist period after falling back (default 1 s, the relist PLEG's).
    pub fallback_relist_period: Duration,
    /// Health threshold after falling back (default 3 min).
    pub fallback_relist_threshold: Duration,
    /// How often the cache's global timestamp advances while the stream is up (default 2 s).
    /// It advances to the previous tick's time, so an event has a whole period to arrive
    /// before a waiter can be handed a status that lacks it.
    pub global_cache_update_period: Duration,
    /// Consecutive stream failures before falling back to relisting every
    /// [`fallback_relist_period`](Self::fallback_relist_period) (default 5).
    pub max_stream_retries: u32,
    /// Pause before subscribing again after a stream failure (default 1 s); each failure also
    /// forces a relist.
    pub stream_retry_delay: Duration,
    /// After falling back, how often to try the stream again (default 30 s); when it works,
    /// events take over again. The kubelet stays fallen back until restarted.
    pub stream_recovery_period: Duration,
}

impl Default for EventedPlegConfig {
    fn default() -> Self {
        Self {
            relist: GenericPlegConfig::default()
                .with_relist_period(EVENTED_RELIST_PERIOD)
                .with_relist_threshold(EVENTED_RELIST_THRESHOLD),
            fallback_relist_period: GENERIC_PLEG_RELIST_PERIOD,
            fallback_relist_threshold: GENERIC_PLEG_RELIST_THRESHOLD,
            global_cache_update_period: GLOBAL_CACHE_UPDATE_PERIOD,
            max_stream_retries: EVENTED_PLEG_MAX_STREAM_RETRIES,
            stream_retry_delay: Duration::from_secs(1),
            stream_recovery_period: Duration::from_secs(30),
        }
    }
}

impl EventedPlegConfig {
    /// Set [`relist`](Self::relist).
    pub fn with_relist(mut self, relist: GenericPlegConfig) -> Self {
        self.relist = relist;
        self
    }

    /// Set the safety-net relist period ([`relist`](Self::relist)`.relist_period`).
    pub fn with_relist_period(mut self, period: Duration) -> Self {
        self.relist.relist_period = period;
        self
    }

    /// Set [`fallback_relist_period`](Self::fallback_relist_period).
    pub fn with_fallback_relist_period(mut self, period: Duration) -> Self {
        self.fallback_relist_period = period;
        self
    }

    /// Set [`global_cache_update_period`](Self::global_cache_update_period).
    pub fn with_global_cache_update_period(mut self, period: Duration) -> Self {
        self.global_cache_update_period = period;
        self
    }

    /// Set [`max_stream_retries`](Self::max_stream_retries).
    pub fn with_max_stream_retries(mut self, n: u32) -> Self {
        self.max_stream_retries = n;
        self
    }

    /// Set [`stream_retry_delay`](Self::stream_retry_delay).
    pub fn with_stream_retry_delay(mut self, delay: Duration) -> Self {
        self.stream_retry_delay = delay;
        self
    }

    /// Set [`stream_recovery_period`](Self::stream_recovery_period).
    pub fn with_stream_recovery_period(mut self, period: Duration) -> Self {
        self.stream_recovery_period = period;
        self
    }
}

/// Where an [`EventedPleg`] gets its news from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PlegMode {
    /// Not running yet.
    Starting,
    /// Runtime events, with the relist every [`relist`](EventedPlegConfig::relist) period as the
    /// safety net.
    Events,
    /// The stream failed [`max_stream_retries`](EventedPlegConfig::max_stream_retries) times in
    /// a row: relisting every [`fallback_relist_period`](EventedPlegConfig::fallback_relist_period)
    /// and trying the stream again every
    /// [`stream_recovery_period`](EventedPlegConfig::stream_recovery_period).
    Fallback,
    /// The runtime has no event stream (`Unimplemented`): relisting only, at the fallback period.
    RelistOnly,
}

/// The evented pod lifecycle event generator: the kubelet's `EventedPLEG` feature gate.
///
/// It subscribes to the runtime's container events
/// ([`ContainerRuntime::container_events`]): CRI `GetContainerEvents`, containerd's task events,
/// the process runtime's exit notifications. Each event makes it inspect the event's pod
/// ([`get_pod_status`](kubelet_api::runtime::get_pod_status)), store the status in the cache
/// stamped with the inspection's start (an older status never replaces a newer one), and diff
/// the pod against the same per-pod records the relist uses, so it sends exactly the events a
/// relist would have sent, once: an event the relist already accounted for (or a duplicate
/// event) sends nothing. Events are hints, not statuses: the kubelet builds statuses from the
/// event's payload, which produced stale statuses and duplicate containers (containerd 2.0 sent
/// a timestamp with empty container statuses); here the status always comes from an inspection.
///
/// The relist keeps running as the safety net every
/// [`relist_period`](GenericPlegConfig::relist_period) (300 s by default, as the kubelet) and
/// finds anything the events missed. When the stream fails, a relist is forced at once and the
/// stream retried; after [`max_stream_retries`](EventedPlegConfig::max_stream_retries)
/// consecutive failures it falls back to relisting every second, and it goes back to events as
/// soon as the stream works again. A runtime without events is relisted every second.
///
/// The cache's global timestamp advances every
/// [`global_cache_update_period`](EventedPlegConfig::global_cache_update_period) while the stream
/// is up, so [`PodCache::get_newer_than`] never waits for a relist; pods with an event not yet
/// inspected are held pending until their inspection ends.
pub struct EventedPleg {
    core: Core,
    config: EventedPlegConfig,
    mode: Mutex<PlegMode>,
    relist_now: Notify,
}

impl std::fmt::Debug for EventedPleg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventedPleg")
            .field("mode", &*self.mode.lock())
            .field("core", &self.core)
            .finish_non_exhaustive()
    }
}

impl EventedPleg {
    /// An evented PLEG over `runtime` with a new, empty pod cache, and the receiver of its
    /// events. Nothing happens until [`run`](PodLifecycleEventGenerator::run).
    pub fn new(
        runtime: Arc<dyn ContainerRuntime>,
        config: EventedPlegConfig,
    ) -> (Self, PlegEvents) {
        let (core, events) = Core::new(runtime, config.relist.clone());
        let pleg = Self {
            core,
            config,
            mode: Mutex::new(PlegMode::Starting),
            relist_now: Notify::new(),
        };
        (pleg, events)
    }

    /// The settings this PLEG runs with.
    pub fn config(&self) -> &EventedPlegConfig {
        &self.config
    }

    /// Where events come from right now.
    pub fn mode(&self) -> PlegMode {
        *self.mode.lock()
    }

    /// Start time of the last relist whose listing succeeded, if any.
    pub fn last_relist(&self) -> Option<Instant> {
        self.core.last_relist()
    }

    /// The metric handles.
    pub fn metrics(&self) -> &PlegMetrics {
        &self.core.metrics
    }

    /// Register the PLEG's metrics (the relist PLEG's `kubelet_pleg_*` plus
    /// `kubelet_evented_pleg_connection_error_count` and
    /// `kubelet_evented_pleg_connection_success_count`) in `registry`.
    pub fn register_metrics(&self, registry: &mut Registry) {
        self.core.metrics.register(registry);
    }

    /// Pods whose inspection is taking long.
    pub fn slow_pods(&self) -> Vec<SlowPod> {
        self.core.slow_pods()
    }

    /// Health with its causes; see [`GenericPleg::diagnose`](crate::GenericPleg::diagnose).
    pub fn diagnose(&self) -> PlegDiagnosis {
        let mut d = self.core.diagnose();
        d.health = self.healthy();
        d
    }

    /// Ask the running loop for a relist now (for example after an outside hint that events were
    /// lost).
    pub fn request_relist(&self) {
        self.relist_now.notify_one();
    }

    fn set_mode(&self, mode: PlegMode) {
        let (period, threshold) = match mode {
            PlegMode::Events | PlegMode::Starting => (
                self.config.relist.relist_period,
                self.config.relist.relist_threshold,
            ),
            PlegMode::Fallback | PlegMode::RelistOnly => (
                self.config.fallback_relist_period,
                self.config.fallback_relist_threshold,
            ),
        };
        let old = std::mem::replace(&mut *self.mode.lock(), mode);
        if old != mode {
            tracing::info!(from = ?old, to = ?mode, relist_period = ?period, "PLEG: mode changed");
        }
        self.core.set_threshold(threshold);
    }

    /// Turn one runtime event into an inspection of its pod.
    fn handle_event(&self, ev: ContainerEvent) {
        tracing::trace!(containerID = %ev.container_id, kind = ?ev.kind, "PLEG: runtime event");
        // A creation or start stamped before an inspection of the pod was launched is what
        // that inspection saw (containerd's events of a sync often arrive after the sync's own
        // inspection began). Exits and removals are always inspected: containerd's exit hints
        // are stamped with the exit, which its CRI plugin may not show yet.
        let at = matches!(
            ev.kind,
            ContainerEventKind::Created | ContainerEventKind::Started
        )
        .then_some(ev.created_at);
        match ev.pod_uid.filter(|u| !u.is_empty()) {
            Some(uid) => {
                let (name, namespace) = self.core.names_of(&uid);
                self.core.event_for(uid, name, namespace, at);
            }
            None => match self.core.pod_of(&ev.container_id) {
                Some((uid, name, namespace)) => {
                    self.core.event_for(uid, name, namespace, at);
                }
                None => self.core.resolve(ev.container_id, at),
            },
        }
    }

    async fn subscribe(&self) -> kubelet_api::Result<ContainerEventStream> {
        match tokio::time::timeout(
            self.config.relist.inspect_timeout,
            self.core.runtime.container_events(),
        )
        .await
        {
            Ok(r) => r,
            Err(_) => Err(kubelet_api::Error::new(
                ErrorKind::DeadlineExceeded,
                "subscribing to container events timed out",
            )),
        }
    }
}

#[async_trait]
impl PodLifecycleEventGenerator for EventedPleg {
    fn register_metrics(&self, registry: &mut Registry) {
        self.core.metrics.register(registry);
    }

    fn cache(&self) -> PodCache {
        self.core.reader.clone()
    }

    /// Unhealthy when the relist (the safety net) has not succeeded within the threshold of the
    /// current mode (10 min with events, 3 min after falling back), or when the event channel
    /// is full (the kubelet's evented PLEG criterion).
    fn healthy(&self) -> PlegHealth {
        if self.core.channel_full() {
            return PlegHealth::Unhealthy("the PLEG event channel is full".to_string());
        }
        self.core.healthy()
    }

    /// While events flow, inspect the pod now (its waiters wait for that inspection): after a
    /// sync that changed the pod, the worker's next sync needs a status observed after that
    /// sync, which the global timestamp only gives 2 to 4 s later. In the other modes the 1 s
    /// relist gives it, as with the relist PLEG.
    fn request_reinspect(&self, uid: &str, name: &str, namespace: &str) {
        if self.mode() == PlegMode::Events {
            self.core
                .refresh(uid.to_string(), name.to_string(), namespace.to_string());
        }
    }

    /// While the worker syncs the pod, its runtime events (the sandbox, the containers it
    /// creates and starts) are noted, not inspected one by one: the release's one inspection
    /// sees them all.
    fn hold(&self, uid: &str) {
        self.core.hold(uid);
    }

    /// One inspection when the sync changed the pod or events arrived meanwhile (while events
    /// flow; in the other modes the 1 s relist sees the change).
    fn release(&self, uid: &str, name: &str, namespace: &str, changed: bool) {
        let arrived = self.core.release(uid);
        if (changed || arrived) && self.mode() == PlegMode::Events {
            self.core
                .refresh(uid.to_string(), name.to_string(), namespace.to_string());
        }
    }

    /// While events flow, the pod is forgotten without an inspection (the worker removed all it
    /// had); its later stop and removal events are skipped until the next relist. Otherwise (or
    /// when an inspection of the pod is in flight) as [`release`](Self::release) with
    /// `changed`.
    fn release_removed(&self, uid: &str, name: &str, namespace: &str) {
        if self.mode() == PlegMode::Events && self.core.forget_removed(uid) {
            return;
        }
        self.release(uid, name, namespace, true);
    }

    async fn run(&self, shutdown: CancellationToken) {
        let mut done = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return,
            d = self.core.done_rx.lock() => d,
        };
        let mut state = Loop::new(Instant::now());
        self.set_mode(state.mode);
        // Present exactly while `state.link` is `Up`.
        let mut stream: Option<ContainerEventStream> = None;
        let mut listing: Option<BoxFuture<'static, Listing>> = None;
        let mut tick = tokio::time::interval(self.config.global_cache_update_period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

        loop {
            let due = state.start(Instant::now());
            if due.list {
                listing = Some(Box::pin(self.core.list()));
            }
            if due.subscribe {
                let input = match self.subscribe().await {
                    Ok(s) => {
                        self.core.metrics.evented_connection_successes.inc();
                        tracing::debug!("PLEG: subscribed to container events");
                        stream = Some(s);
                        Input::Subscribed
                    }
                    Err(e) if e.kind() == ErrorKind::Unimplemented => {
                        tracing::info!(error = %kubelet_api::chain(&e), "PLEG: the runtime has no container events; relisting only");
                        Input::Unsupported
                    }
                    Err(e) => {
                        self.core.metrics.evented_connection_errors.inc();
                        tracing::warn!(error = %kubelet_api::chain(&e), failures = state.failures + 1, "PLEG: subscribing to container events failed");
                        Input::LinkFailed
                    }
                };
                self.apply(&mut state, input);
                continue;
            }

            let (relist_at, subscribe_at) = state.wake_at();
            let input = tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                Some(d) = done.recv() => {
                    self.core.apply(d, &mut RelistReport::default());
                    continue;
                }
                Some(listed) = in_flight(&mut listing) => {
                    listing = None;
                    let start = listed.0;
                    let mut report = RelistReport::default();
                    // Inspections started here finish in the background, like event
                    // inspections; the loop takes them in as they complete.
                    if self.core.take_listing(listed, &mut report).is_ok() {
                        self.core.finish_relist(start, &report);
                    }
                    Input::Listed { start }
                }
                ev = next_event(&mut stream) => match ev {
                    Some(Ok(ev)) => {
                        self.handle_event(ev);
                        continue;
                    }
                    other => {
                        stream = None;
                        let why = match other {
                            Some(Err(e)) => e.to_string(),
                            _ => "the stream ended".to_string(),
                        };
                        self.core.metrics.evented_connection_errors.inc();
                        tracing::warn!(error = %why, failures = state.failures + 1, "PLEG: container event stream broke");
                        Input::LinkFailed
                    }
                },
                _ = tick.tick() => {
                    self.core.note_slow();
                    Input::Tick
                }
                _ = self.relist_now.notified() => Input::RelistRequested,
                _ = sleep_until_some(relist_at) => continue,
                _ = sleep_until_some(subscribe_at) => continue,
            };
            self.apply(&mut state, input);
        }
        tracing::debug!("PLEG: evented loop stopped");
    }
}

impl EventedPleg {
    /// Take `input` through the loop's [`Loop::step`] and do what it says: log a fall-back,
    /// advance the cache's global timestamp, retry failed inspections, publish the mode.
    fn apply(&self, state: &mut Loop, input: Input) {
        let effects = state.step(input, Instant::now(), &self.config);
        if effects.fell_back {
            tracing::warn!(
                failures = state.failures,
                period = ?self.config.fallback_relist_period,
                "PLEG: container events keep failing; falling back to relisting"
            );
        }
        if let Some(at) = effects.advance_cache {
            self.core.cache.update_time(at);
        }
        if effects.refresh_failed {
            self.core.refresh_failed();
        }
        self.set_mode(state.mode);
    }
}

/// The state of the evented PLEG's subscription, as the loop's step sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LinkState {
    /// Subscribe at this instant.
    Due(Instant),
    /// Subscribed since this instant.
    Up(Instant),
    /// The runtime has no event stream: relisting only.
    Unsupported,
}

/// What happened, as the evented PLEG's loop tells its [`Loop::step`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Input {
    /// A subscription succeeded.
    Subscribed,
    /// The runtime answered that it has no events.
    Unsupported,
    /// Subscribing failed, or the stream broke or ended.
    LinkFailed,
    /// The listing that started at `start` finished (whether it succeeded or not).
    Listed { start: Instant },
    /// The global cache period passed.
    Tick,
    /// Someone asked for a relist ([`EventedPleg::request_relist`]).
    RelistRequested,
}

/// What to start now ([`Loop::start`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Due {
    /// Start a listing.
    list: bool,
    /// Subscribe to the runtime's events.
    subscribe: bool,
}

/// What a [`Loop::step`] asks the loop to do beyond its own state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Effects {
    /// The step fell back to relisting (logged once).
    fell_back: bool,
    /// Advance the cache's global timestamp to this instant.
    advance_cache: Option<Instant>,
    /// Inspect again the pods whose inspection failed.
    refresh_failed: bool,
}

/// The evented PLEG's loop as state plus a pure step (like the pod worker's): the run loop
/// starts what [`start`](Self::start) says is due, waits for the first thing to happen, and
/// feeds it to [`step`](Self::step), which updates the subscription, the relist schedule and
/// the cache ticks and returns what to do about them.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Loop {
    mode: PlegMode,
    /// Consecutive subscription failures.
    failures: u32,
    link: LinkState,
    /// When the next listing starts (once the one in flight, if any, finished).
    next_relist: Instant,
    /// A listing is in flight.
    listing: bool,
    /// The previous cache tick while the current subscription was up.
    prev_tick: Option<Instant>,
    /// A follow-up relist after a resubscription (see [`LinkDecision::settle_relist`]): when
    /// the subscription succeeded, and when to relist again.
    settle: Option<(Instant, Instant)>,
}

impl Loop {
    /// Events mode, subscription and relist due at `now`.
    fn new(now: Instant) -> Self {
        Self {
            mode: PlegMode::Events,
            failures: 0,
            link: LinkState::Due(now),
            next_relist: now,
            listing: false,
            prev_tick: None,
            settle: None,
        }
    }

    /// What is due at `now`; a listing it returns counts as in flight.
    fn start(&mut self, now: Instant) -> Due {
        let list = !self.listing && now >= self.next_relist;
        self.listing |= list;
        let subscribe = matches!(self.link, LinkState::Due(at) if now >= at);
        Due { list, subscribe }
    }

    /// When the next listing and the next subscription are due, if they are.
    fn wake_at(&self) -> (Option<Instant>, Option<Instant>) {
        let relist = (!self.listing).then_some(self.next_relist);
        let subscribe = match self.link {
            LinkState::Due(at) => Some(at),
            LinkState::Up(_) | LinkState::Unsupported => None,
        };
        (relist, subscribe)
    }

    /// Take `input`, which happened at `now`.
    fn step(&mut self, input: Input, now: Instant, config: &EventedPlegConfig) -> Effects {
        let mut effects = Effects::default();
        let link_event = match input {
            Input::Subscribed => LinkEvent::Subscribed,
            Input::Unsupported => LinkEvent::Unsupported,
            Input::LinkFailed => LinkEvent::Failed,
            Input::Listed { start } => {
                self.listing = false;
                self.next_relist = now + relist_period(self.mode, config);
                if let Some((subscribed, again)) = self.settle
                    && start >= subscribed
                {
                    // The relist of the resubscription is done: one more a period later.
                    self.next_relist = self.next_relist.min(again);
                    self.settle = None;
                }
                return effects;
            }
            Input::Tick => {
                match (self.link, self.mode) {
                    (LinkState::Up(since), PlegMode::Events) => {
                        // Advance to the previous tick: every event of a change made before it
                        // has had a whole period to arrive and mark its pod pending.
                        if let Some(prev) = self.prev_tick
                            && since <= prev
                        {
                            effects.advance_cache = Some(prev);
                            let d = link_step(self.mode, self.failures, LinkEvent::Steady, config);
                            self.failures = d.failures;
                        }
                        self.prev_tick = Some(now);
                        effects.refresh_failed = true;
                    }
                    _ => self.prev_tick = None,
                }
                return effects;
            }
            Input::RelistRequested => {
                self.next_relist = now;
                return effects;
            }
        };
        let d = link_step(self.mode, self.failures, link_event, config);
        effects.fell_back = d.mode == PlegMode::Fallback && self.mode != PlegMode::Fallback;
        self.mode = d.mode;
        self.failures = d.failures;
        // A tick counts only while the subscription it was seen under is up.
        self.prev_tick = None;
        self.link = match (link_event, d.retry_after) {
            (LinkEvent::Subscribed, _) => LinkState::Up(now),
            (_, Some(after)) => LinkState::Due(now + after),
            (_, None) => LinkState::Unsupported,
        };
        if d.settle_relist {
            self.settle = Some((now, now + config.fallback_relist_period));
        }
        if d.relist_now {
            // Whatever happened while unsubscribed is found by a relist now.
            self.next_relist = now;
        } else if link_event == LinkEvent::Unsupported {
            self.next_relist = self.next_relist.min(now + relist_period(self.mode, config));
        }
        effects
    }
}

/// The relist period in `mode`: the safety net's while events flow, the fallback's otherwise.
fn relist_period(mode: PlegMode, config: &EventedPlegConfig) -> Duration {
    match mode {
        PlegMode::Events | PlegMode::Starting => config.relist.relist_period,
        PlegMode::Fallback | PlegMode::RelistOnly => config.fallback_relist_period,
    }
}

/// The next event of the stream; never ready without one.
async fn next_event(
    stream: &mut Option<ContainerEventStream>,
) -> Option<kubelet_api::Result<ContainerEvent>> {
    match stream {
        Some(stream) => stream.next().await,
        None => std::future::pending().await,
    }
}

/// Ready at `at`; never without it.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The listing in flight, when there is one; never ready otherwise.
async fn in_flight<F: std::future::Future + Unpin>(f: &mut Option<F>) -> Option<F::Output> {
    match f {
        Some(f) => Some(f.await),
        None => std::future::pending().await,
    }
}

/// What happened to the event subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LinkEvent {
    /// A subscription succeeded.
    Subscribed,
    /// The runtime answered that it has no events.
    Unsupported,
    /// Subscribing failed, or the stream broke or ended.
    Failed,
    /// A cache tick passed with the stream up since before the previous tick.
    Steady,
}

/// What the evented PLEG does after a [`LinkEvent`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LinkDecision {
    mode: PlegMode,
    /// Consecutive failures.
    failures: u32,
    /// Relist now (whatever happened while unsubscribed, or what a broken stream lost).
    relist_now: bool,
    /// Subscribe again after this long; `None`: no subscription is due.
    retry_after: Option<Duration>,
    /// Relist once more a fallback period later: after an outage the runtime may report what
    /// happened meanwhile (an exit while it was down) only once it has caught up, after the
    /// relist at resubscription has run, and no event will tell of it.
    settle_relist: bool,
}

/// The subscription's decisions (pure): a success returns to [`PlegMode::Events`] and forces a
/// relist; a failure forces a relist and retries after `stream_retry_delay`, or, from the
/// `max_stream_retries`th failure in a row, falls back to relisting and retries after
/// `stream_recovery_period`; a runtime without events relists only; a steady tick clears the
/// failure count.
fn link_step(
    mode: PlegMode,
    failures: u32,
    event: LinkEvent,
    config: &EventedPlegConfig,
) -> LinkDecision {
    match event {
        LinkEvent::Subscribed => LinkDecision {
            mode: PlegMode::Events,
            // Failures count on while events were already flowing (a flapping stream); a
            // return from the fallback starts afresh.
            failures: if mode == PlegMode::Events {
                failures
            } else {
                0
            },
            relist_now: true,
            retry_after: None,
            settle_relist: failures > 0 || mode == PlegMode::Fallback,
        },
        LinkEvent::Unsupported => LinkDecision {
            mode: PlegMode::RelistOnly,
            failures,
            relist_now: false,
            retry_after: None,
            settle_relist: false,
        },
        LinkEvent::Failed => {
            let failures = failures.saturating_add(1);
            let fall_back = failures >= config.max_stream_retries.max(1);
            LinkDecision {
                mode: if fall_back { PlegMode::Fallback } else { mode },
                failures,
                relist_now: true,
                retry_after: Some(if fall_back {
                    config.stream_recovery_period
                } else {
                    config.stream_retry_delay
                }),
                settle_relist: false,
            }
        }
        LinkEvent::Steady => LinkDecision {
            mode,
            failures: 0,
            relist_now: false,
            retry_after: None,
            settle_relist: false,
        },
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;

    use kubelet_api::runtime::{
        Container, ContainerConfig, ContainerFilter, ContainerMetadata, ContainerStatus,
        ExecResult, PodSandbox, PodSandboxConfig, PodSandboxMetadata, PodSandboxStatus,
        RuntimeStatus, RuntimeVersion, SandboxFilter, labels,
    };
    use kubelet_api::{PodLifecycleEventType, Result};
    use kubelet_core::testing::FakeRuntime;

    use super::*;

    /// The in-memory runtime with an event stream that stays open and says nothing (or, with
    /// a receiver, says what the test sends): the PLEG is in [`PlegMode::Events`] and learns of
    /// a change only from a relist, a request or the test's events.
    struct Silent(
        FakeRuntime,
        parking_lot::Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<ContainerEvent>>>,
    );

    impl Silent {
        fn new(rt: FakeRuntime) -> Self {
            Self(rt, parking_lot::Mutex::new(None))
        }
    }

    #[async_trait]
    impl ContainerRuntime for Silent {
        async fn version(&self) -> Result<RuntimeVersion> {
            self.0.version().await
        }
        async fn status(&self) -> Result<RuntimeStatus> {
            self.0.status().await
        }
        async fn run_pod_sandbox(&self, config: &PodSandboxConfig) -> Result<String> {
            self.0.run_pod_sandbox(config).await
        }
        async fn stop_pod_sandbox(&self, id: &str) -> Result<()> {
            self.0.stop_pod_sandbox(id).await
        }
        async fn remove_pod_sandbox(&self, id: &str) -> Result<()> {
            self.0.remove_pod_sandbox(id).await
        }
        async fn pod_sandbox_status(&self, id: &str) -> Result<PodSandboxStatus> {
            self.0.pod_sandbox_status(id).await
        }
        async fn list_pod_sandboxes(&self, filter: &SandboxFilter) -> Result<Vec<PodSandbox>> {
            self.0.list_pod_sandboxes(filter).await
        }
        async fn create_container(
            &self,
            sandbox_id: &str,
            config: &ContainerConfig,
            sandbox_config: &PodSandboxConfig,
        ) -> Result<String> {
            self.0
                .create_container(sandbox_id, config, sandbox_config)
                .await
        }
        async fn start_container(&self, id: &str) -> Result<()> {
            self.0.start_container(id).await
        }
        async fn stop_container(&self, id: &str, timeout: Duration) -> Result<()> {
            self.0.stop_container(id, timeout).await
        }
        async fn remove_container(&self, id: &str) -> Result<()> {
            self.0.remove_container(id).await
        }
        async fn list_containers(&self, filter: &ContainerFilter) -> Result<Vec<Container>> {
            self.0.list_containers(filter).await
        }
        async fn container_status(&self, id: &str) -> Result<ContainerStatus> {
            self.0.container_status(id).await
        }
        async fn exec_sync(
            &self,
            id: &str,
            cmd: &[String],
            timeout: Duration,
        ) -> Result<ExecResult> {
            self.0.exec_sync(id, cmd, timeout).await
        }
        fn images(&self) -> Option<&dyn kubelet_api::ImageService> {
            self.0.images()
        }
        async fn container_events(&self) -> Result<ContainerEventStream> {
            match self.1.lock().take() {
                Some(rx) => Ok(Box::pin(
                    futures::stream::unfold(rx, |mut rx| async move {
                        rx.recv().await.map(|e| (Ok(e), rx))
                    })
                    .chain(futures::stream::pending()),
                )),
                None => Ok(Box::pin(futures::stream::pending())),
            }
        }
    }

    // Real time: the inspection must start strictly after the request, which paused time (one
    // instant for both) cannot show.
    #[test]
    fn the_subscription_retries_falls_back_and_recovers_by_its_table() {
        let cfg = EventedPlegConfig::default()
            .with_max_stream_retries(3)
            .with_stream_retry_delay(Duration::from_secs(1))
            .with_stream_recovery_period(Duration::from_secs(30));
        let d = |mode, failures, relist_now, retry: Option<u64>| LinkDecision {
            mode,
            failures,
            relist_now,
            retry_after: retry.map(Duration::from_secs),
            settle_relist: false,
        };
        let settled = |d: LinkDecision| LinkDecision {
            settle_relist: true,
            ..d
        };
        use LinkEvent::*;
        use PlegMode::*;
        let table = [
            // A failure relists at once and retries soon, until the third in a row falls back.
            (Events, 0, Failed, d(Events, 1, true, Some(1))),
            (Events, 1, Failed, d(Events, 2, true, Some(1))),
            (Events, 2, Failed, d(Fallback, 3, true, Some(30))),
            (Fallback, 3, Failed, d(Fallback, 4, true, Some(30))),
            // Back to events from the fallback: the count starts afresh, a relist finds what
            // was missed, and it relists once more a period later for what the runtime reports only
            // once it has caught up.
            (Fallback, 4, Subscribed, settled(d(Events, 0, true, None))),
            // A flapping stream keeps its count until a steady tick clears it.
            (Events, 2, Subscribed, settled(d(Events, 2, true, None))),
            (Events, 2, Steady, d(Events, 0, false, None)),
            // No events at all: relisting only, no retries.
            (Events, 0, Unsupported, d(RelistOnly, 0, false, None)),
            (Starting, 0, Subscribed, d(Events, 0, true, None)),
        ];
        for (mode, failures, event, want) in table {
            assert_eq!(
                link_step(mode, failures, event, &cfg),
                want,
                "{mode:?} after {failures} failures, {event:?}"
            );
        }
        // A limit of 0 behaves as 1: the first failure falls back.
        let zero = EventedPlegConfig::default().with_max_stream_retries(0);
        assert_eq!(link_step(Events, 0, Failed, &zero).mode, Fallback);
    }

    /// One row of the loop's table: at `at` seconds, call [`Loop::start`] (`None`) or
    /// [`Loop::step`] with the input, and compare what it returns and the state it leaves.
    struct Row {
        at: f64,
        input: Option<Input>,
        due: Due,
        effects: Effects,
        mode: PlegMode,
        failures: u32,
        link: LinkState,
        next_relist: f64,
        settle: Option<(f64, f64)>,
    }

    #[test]
    fn the_loop_subscribes_relists_ticks_falls_back_and_settles_by_its_table() {
        let cfg = EventedPlegConfig::default()
            .with_relist_period(Duration::from_secs(300))
            .with_fallback_relist_period(Duration::from_secs(1))
            .with_global_cache_update_period(Duration::from_secs(2))
            .with_max_stream_retries(3)
            .with_stream_retry_delay(Duration::from_secs(1))
            .with_stream_recovery_period(Duration::from_secs(30));
        let t0 = Instant::now();
        let t = |s: f64| t0 + Duration::from_secs_f64(s);
        use Input::*;
        use LinkState::{Due as At, Up};
        use PlegMode::*;
        let none = Effects::default();
        let refresh = Effects {
            refresh_failed: true,
            ..none
        };
        let list = Due {
            list: true,
            subscribe: false,
        };
        let nothing = Due::default();
        #[rustfmt::skip]
        let table = [
            // Start: subscribe and list at once.
            Row { at: 0.0, input: None, due: Due { list: true, subscribe: true }, effects: none, mode: Events, failures: 0, link: At(t(0.0)), next_relist: 0.0, settle: None },
            Row { at: 0.0, input: Some(Subscribed), due: nothing, effects: none, mode: Events, failures: 0, link: Up(t(0.0)), next_relist: 0.0, settle: None },
            // The listing in flight is not started twice.
            Row { at: 0.1, input: None, due: nothing, effects: none, mode: Events, failures: 0, link: Up(t(0.0)), next_relist: 0.0, settle: None },
            // Its end schedules the safety net 300 s later.
            Row { at: 0.5, input: Some(Listed { start: t(0.0) }), due: nothing, effects: none, mode: Events, failures: 0, link: Up(t(0.0)), next_relist: 300.5, settle: None },
            // The first tick only remembers itself; the second advances the cache to the first.
            Row { at: 2.0, input: Some(Tick), due: nothing, effects: refresh, mode: Events, failures: 0, link: Up(t(0.0)), next_relist: 300.5, settle: None },
            Row { at: 4.0, input: Some(Tick), due: nothing, effects: Effects { advance_cache: Some(t(2.0)), ..refresh }, mode: Events, failures: 0, link: Up(t(0.0)), next_relist: 300.5, settle: None },
            // The stream breaks: relist now, subscribe again a second later.
            Row { at: 5.0, input: Some(LinkFailed), due: nothing, effects: none, mode: Events, failures: 1, link: At(t(6.0)), next_relist: 5.0, settle: None },
            Row { at: 5.0, input: None, due: list, effects: none, mode: Events, failures: 1, link: At(t(6.0)), next_relist: 5.0, settle: None },
            // No tick counts while unsubscribed.
            Row { at: 5.5, input: Some(Tick), due: nothing, effects: none, mode: Events, failures: 1, link: At(t(6.0)), next_relist: 5.0, settle: None },
            Row { at: 6.0, input: None, due: Due { list: false, subscribe: true }, effects: none, mode: Events, failures: 1, link: At(t(6.0)), next_relist: 5.0, settle: None },
            Row { at: 6.0, input: Some(LinkFailed), due: nothing, effects: none, mode: Events, failures: 2, link: At(t(7.0)), next_relist: 6.0, settle: None },
            // The third failure in a row falls back: relist every second, try again in 30 s.
            Row { at: 7.0, input: Some(LinkFailed), due: nothing, effects: Effects { fell_back: true, ..none }, mode: Fallback, failures: 3, link: At(t(37.0)), next_relist: 7.0, settle: None },
            Row { at: 7.2, input: Some(Listed { start: t(5.0) }), due: nothing, effects: none, mode: Fallback, failures: 3, link: At(t(37.0)), next_relist: 8.2, settle: None },
            Row { at: 8.0, input: Some(Tick), due: nothing, effects: none, mode: Fallback, failures: 3, link: At(t(37.0)), next_relist: 8.2, settle: None },
            Row { at: 9.0, input: Some(RelistRequested), due: nothing, effects: none, mode: Fallback, failures: 3, link: At(t(37.0)), next_relist: 9.0, settle: None },
            // Back to events: relist now, and once more a fallback period after that relist.
            Row { at: 37.0, input: Some(Subscribed), due: nothing, effects: none, mode: Events, failures: 0, link: Up(t(37.0)), next_relist: 37.0, settle: Some((37.0, 38.0)) },
            // A listing that started before the subscription is not the settling one.
            Row { at: 37.1, input: Some(Listed { start: t(36.5) }), due: nothing, effects: none, mode: Events, failures: 0, link: Up(t(37.0)), next_relist: 337.1, settle: Some((37.0, 38.0)) },
            Row { at: 37.5, input: Some(Listed { start: t(37.2) }), due: nothing, effects: none, mode: Events, failures: 0, link: Up(t(37.0)), next_relist: 38.0, settle: None },
        ];
        let mut state = Loop::new(t0);
        for (i, row) in table.iter().enumerate() {
            let now = t(row.at);
            match row.input {
                None => assert_eq!(state.start(now), row.due, "row {i}: due"),
                Some(input) => {
                    assert_eq!(
                        state.step(input, now, &cfg),
                        row.effects,
                        "row {i}: effects"
                    )
                }
            }
            assert_eq!(
                (state.mode, state.failures, state.link),
                (row.mode, row.failures, row.link),
                "row {i}: mode, failures, link"
            );
            assert_eq!(
                state.next_relist,
                t(row.next_relist),
                "row {i}: next relist"
            );
            assert_eq!(
                state.settle,
                row.settle.map(|(a, b)| (t(a), t(b))),
                "row {i}: settle"
            );
        }

        // A runtime without events: relisting only, at the fallback period, no ticks.
        let mut state = Loop::new(t0);
        assert_eq!(
            state.start(t0),
            Due {
                list: true,
                subscribe: true
            }
        );
        assert_eq!(state.step(Unsupported, t0, &cfg), none);
        assert_eq!(
            (state.mode, state.link, state.wake_at()),
            (RelistOnly, LinkState::Unsupported, (None, None))
        );
        state.step(Listed { start: t0 }, t(0.1), &cfg);
        assert_eq!(state.wake_at(), (Some(t(1.1)), None));
        assert_eq!(state.step(Tick, t(2.0), &cfg), none);
    }

    /// An evented PLEG over `rt`, running, subscribed and relisted once (the next relist is an
    /// hour away).
    async fn started(
        rt: Arc<Silent>,
    ) -> (
        Arc<EventedPleg>,
        tokio::sync::mpsc::Receiver<kubelet_api::PodLifecycleEvent>,
        CancellationToken,
        tokio::task::JoinHandle<()>,
    ) {
        let (pleg, events) = EventedPleg::new(
            rt,
            EventedPlegConfig::default().with_relist_period(Duration::from_secs(3600)),
        );
        let pleg = Arc::new(pleg);
        let shutdown = CancellationToken::new();
        let task = {
            let (pleg, shutdown) = (pleg.clone(), shutdown.clone());
            tokio::spawn(async move { pleg.run(shutdown).await })
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while pleg.mode() != PlegMode::Events || pleg.last_relist().is_none() {
            assert!(Instant::now() < deadline, "the PLEG did not start");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        (pleg, events, shutdown, task)
    }

    /// Wait (30 s at most) for a `kind` event about container `id`.
    async fn next_of(
        events: &mut tokio::sync::mpsc::Receiver<kubelet_api::PodLifecycleEvent>,
        kind: PodLifecycleEventType,
        id: &str,
    ) -> Option<kubelet_api::PodLifecycleEvent> {
        tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                let ev = events.recv().await.expect("event channel open");
                if ev.kind == kind && ev.container_id == id {
                    return ev;
                }
            }
        })
        .await
        .ok()
    }

    /// Pod `u1`'s sandbox and its container `app`, with the labels the engine gives them.
    fn pod_u1() -> (PodSandboxConfig, ContainerConfig) {
        let mut sandbox = PodSandboxConfig::default();
        sandbox.metadata = PodSandboxMetadata {
            name: "pod-u1".into(),
            namespace: "default".into(),
            uid: "u1".into(),
            attempt: 0,
        };
        sandbox.labels = BTreeMap::from([
            (labels::POD_UID.to_string(), "u1".to_string()),
            (labels::POD_NAME.to_string(), "pod-u1".to_string()),
            (labels::POD_NAMESPACE.to_string(), "default".to_string()),
        ]);
        sandbox.host_network = true;
        let mut config = ContainerConfig::default();
        config.metadata = ContainerMetadata {
            name: "app".into(),
            attempt: 0,
        };
        config.image = "busybox:1".into();
        config.labels = sandbox.labels.clone();
        config
            .labels
            .insert(labels::CONTAINER_NAME.into(), "app".into());
        (sandbox, config)
    }

    #[tokio::test]
    async fn a_requested_reinspection_stores_a_status_newer_than_the_request_and_sends_its_events()
    {
        let rt = Arc::new(Silent::new(FakeRuntime::new()));
        let (pleg, mut events, shutdown, task) = started(rt.clone()).await;
        let (sandbox, config) = pod_u1();
        let sandbox_id = rt.run_pod_sandbox(&sandbox).await.expect("sandbox");
        let id = rt
            .create_container(&sandbox_id, &config, &sandbox)
            .await
            .expect("create");
        rt.start_container(&id).await.expect("start");

        // As a pod worker after its sync: the next status must be newer than the sync.
        let synced = Instant::now();
        pleg.request_reinspect("u1", "pod-u1", "default");
        let entry = tokio::time::timeout(
            Duration::from_secs(30),
            pleg.cache().get_newer_than("u1", synced),
        )
        .await
        .expect("a status newer than the request");
        assert!(entry.modified > synced);
        let status = entry.status.expect("inspected");
        assert!(
            status.container_statuses.iter().any(|c| c.id == id),
            "{status:?}"
        );
        let started = next_of(&mut events, PodLifecycleEventType::ContainerStarted, &id)
            .await
            .expect("ContainerStarted from the requested inspection");
        assert_eq!(started.pod_uid, "u1");
        shutdown.cancel();
        let _ = task.await;
    }

    /// The pod's inspections (each lists its sandboxes once) among the fake's calls.
    fn inspections(rt: &Silent) -> usize {
        rt.0.calls()
            .iter()
            .filter(|c| c.starts_with("list_pod_sandboxes"))
            .count()
    }

    /// A fake runtime whose event stream yields what the returned sender sends.
    fn with_events() -> (
        Arc<Silent>,
        tokio::sync::mpsc::UnboundedSender<ContainerEvent>,
    ) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let rt = Arc::new(Silent(
            FakeRuntime::new(),
            parking_lot::Mutex::new(Some(rx)),
        ));
        (rt, tx)
    }

    /// A runtime event of pod `u1`, stamped now.
    fn u1_event(id: &str, kind: ContainerEventKind) -> ContainerEvent {
        ContainerEvent::new(id, kind, Some("u1".to_string()), jiff::Timestamp::now())
    }

    #[tokio::test]
    async fn events_of_a_held_pod_wait_for_its_release_which_inspects_it_once() {
        let (rt, tx) = with_events();
        let (pleg, mut events, shutdown, task) = started(rt.clone()).await;
        let (sandbox, config) = pod_u1();
        let event = u1_event;

        // As a pod worker's sync: the pod is held while the sync creates and starts it, and
        // the runtime's events for each step are noted, not inspected.
        rt.0.clear_calls();
        pleg.hold("u1");
        let sandbox_id = rt.run_pod_sandbox(&sandbox).await.expect("sandbox");
        tx.send(event(&sandbox_id, ContainerEventKind::Created))
            .unwrap();
        let id = rt
            .create_container(&sandbox_id, &config, &sandbox)
            .await
            .expect("create");
        tx.send(event(&id, ContainerEventKind::Created)).unwrap();
        rt.start_container(&id).await.expect("start");
        tx.send(event(&id, ContainerEventKind::Started)).unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(inspections(&rt), 0, "held: {:?}", rt.0.calls());

        // The release: one inspection, newer than the sync, which sends the start.
        let synced = Instant::now();
        pleg.release("u1", "pod-u1", "default", true);
        let entry = tokio::time::timeout(
            Duration::from_secs(30),
            pleg.cache().get_newer_than("u1", synced),
        )
        .await
        .expect("a status newer than the sync");
        let status = entry.status.expect("inspected");
        assert!(status.container_statuses.iter().any(|c| c.id == id));
        next_of(&mut events, PodLifecycleEventType::ContainerStarted, &id)
            .await
            .expect("ContainerStarted");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(inspections(&rt), 1, "{:?}", rt.0.calls());

        // A sync that changed nothing still inspects the pod when an event arrived while it
        // was held (here the container's exit); one that saw no event inspects nothing.
        pleg.hold("u1");
        pleg.release("u1", "pod-u1", "default", false);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(inspections(&rt), 1, "{:?}", rt.0.calls());
        pleg.hold("u1");
        rt.0.exit_container(&id, 3).unwrap();
        tx.send(event(&id, ContainerEventKind::Stopped)).unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(inspections(&rt), 1, "held");
        pleg.release("u1", "pod-u1", "default", false);
        next_of(&mut events, PodLifecycleEventType::ContainerDied, &id)
            .await
            .expect("ContainerDied after the release");
        assert_eq!(inspections(&rt), 2, "{:?}", rt.0.calls());
        // Not held: a start stamped before the last inspection was launched reports what it
        // saw (containerd's events arriving after the inspection of their sync) …
        let mut late = event(&id, ContainerEventKind::Started);
        late.created_at = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(3600);
        tx.send(late).unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(inspections(&rt), 2, "{:?}", rt.0.calls());
        // The same for a container the PLEG has not seen (containerd's own events name no
        // pod): once its pod is found, its start stamped before the last inspection is not
        // inspected either.
        let mut unseen_config = config.clone();
        unseen_config.metadata.name = "unseen".into();
        let unseen = rt
            .create_container(&sandbox_id, &unseen_config, &sandbox)
            .await
            .expect("create");
        let mut late = ContainerEvent::new(
            unseen.as_str(),
            ContainerEventKind::Started,
            None,
            jiff::Timestamp::now() - jiff::SignedDuration::from_secs(3600),
        );
        late.pod_uid = None;
        let lists = |rt: &Silent| {
            rt.0.calls()
                .iter()
                .filter(|c| c.starts_with("list_containers"))
                .count()
        };
        let before = lists(&rt);
        tx.send(late).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while lists(&rt) == before {
            assert!(
                Instant::now() < deadline,
                "the container's pod was not looked up"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(inspections(&rt), 2, "{:?}", rt.0.calls());
        // … and an exit is inspected at once, whatever its stamp (exit hints).
        let mut hint = event(&id, ContainerEventKind::Stopped);
        hint.created_at = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(3600);
        tx.send(hint).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while inspections(&rt) < 3 {
            assert!(Instant::now() < deadline, "no inspection of an event");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        shutdown.cancel();
        let _ = task.await;
    }

    #[tokio::test]
    async fn a_pod_its_worker_removed_is_forgotten_without_an_inspection() {
        let (rt, tx) = with_events();
        let (pleg, mut events, shutdown, task) = started(rt.clone()).await;
        let (sandbox, config) = pod_u1();
        let event = u1_event;
        let sandbox_id = rt.run_pod_sandbox(&sandbox).await.expect("sandbox");
        let id = rt
            .create_container(&sandbox_id, &config, &sandbox)
            .await
            .expect("create");
        rt.start_container(&id).await.expect("start");
        pleg.hold("u1");
        pleg.release("u1", "pod-u1", "default", true);
        next_of(&mut events, PodLifecycleEventType::ContainerStarted, &id)
            .await
            .expect("ContainerStarted");
        assert!(pleg.cache().get("u1").is_some());

        // As a pod worker's termination and cleanup: stopped and removed while held, the
        // runtime's events noted.
        pleg.hold("u1");
        rt.stop_container(&id, Duration::ZERO).await.expect("stop");
        tx.send(event(&id, ContainerEventKind::Stopped)).unwrap();
        rt.stop_pod_sandbox(&sandbox_id).await.expect("stop");
        rt.remove_container(&id).await.expect("remove");
        tx.send(event(&id, ContainerEventKind::Deleted)).unwrap();
        rt.remove_pod_sandbox(&sandbox_id).await.expect("remove");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before = inspections(&rt);

        // Released as removed: no inspection; the entry is gone (no orphan for the sync loop
        // to find), and the pod's late stop and removal events inspect nothing either.
        pleg.release_removed("u1", "pod-u1", "default");
        assert!(pleg.cache().get("u1").is_none());
        tx.send(event(&sandbox_id, ContainerEventKind::Stopped))
            .unwrap();
        tx.send(event(&sandbox_id, ContainerEventKind::Deleted))
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(inspections(&rt), before, "{:?}", rt.0.calls());
        assert!(pleg.cache().get("u1").is_none());

        // The same UID created again is inspected as any pod.
        let again = rt.run_pod_sandbox(&sandbox).await.expect("sandbox");
        tx.send(event(&again, ContainerEventKind::Created)).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while pleg.cache().get("u1").is_none() {
            assert!(
                Instant::now() < deadline,
                "the pod created again was not inspected"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(inspections(&rt), before + 1, "{:?}", rt.0.calls());
        let status = pleg
            .cache()
            .get("u1")
            .expect("entry")
            .status
            .expect("inspected");
        assert!(status.sandbox_statuses.iter().any(|s| s.id == again));
        shutdown.cancel();
        let _ = task.await;
    }
}
