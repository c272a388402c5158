//! `cri-bench`: the kubelet-cri figures of docs/performance.md, measured against a private
//! containerd started by `scripts/containerd-test-env.sh` (needs root).
//!
//! 1. **Start and stop N pods** (1 container each, host network, a shell that ends on SIGTERM):
//!    through the agent (engine + PLEG + `CriRuntime`, from the pod source's first snapshot to
//!    every pod `Running`; then from an empty snapshot until the runtime shows none of their
//!    containers running and none of their sandboxes ready) and through direct CRI calls
//!    (RunPodSandbox, CreateContainer, StartContainer per pod; then StopContainer and
//!    StopPodSandbox per pod; `--widths` pods at a time: 1, 4 and 8 by default), in the same
//!    run, alternating, `--rounds` times. The agent runs the default (evented) PLEG, `--relist`
//!    the relist one. Prints the wall times and the agent / floor ratios at each width.
//! 2. **Relist cost** at 30 and 110 containers: `GenericPleg::relist` when nothing changed
//!    against one bare ListPodSandbox + ListContainers round trip (medians of `--runs`).
//! 3. **Container event latency** (`--events N`, instead of 1 and 2): N containers exit one
//!    after another in one sandbox; for each, the time from its exit (`finished_at` as CRI
//!    records it) to its `Stopped` event arriving from `CriRuntime::container_events`, against a
//!    baseline measured in the same run: a relist every second (the PLEG's default period, a
//!    `ListContainers` on a free-running 1 s tick) seeing the container exited. Prints p50/p99 of
//!    both, their ratio, and the event's parts: exit → containerd's publish timestamp, publish →
//!    arrival (delivery; on containerd 1.6 the exit is yielded as soon as its `TaskExit` arrives,
//!    with an exit hint, and again once CRI has recorded it: the first one is timed).
//!
//! Diagnostics of the agent's teardown: `--timeline` prints the agent's runtime calls made
//! during it by operation (count, last return, median and longest time in the runtime);
//! `--poll-ms` sets how often the teardown looks at the runtime for what is still running
//! (10 ms), `--observe-floor` runs the same look during the direct teardown, so both carry its
//! load. Two experiments change the agent inside the harness only: `--stop-limit N` bounds its
//! `StopContainer` and `StopPodSandbox` calls to N of each at a time, `--removals-after-stops`
//! makes its removals wait while any of its stops is in flight.
//!
//! ```text
//! cargo run --release -p cri-bench -- --pods 30 --rounds 3
//! cargo run --release -p cri-bench -- --events 300
//! cargo run --release -p cri-bench -- --pods 250 --rounds 2 --widths 4 --relist-sizes 30 --timeline
//! ```

use kubelet_api::AgentHandle;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use async_trait::async_trait;
use clap::Parser;
use futures::StreamExt;
use kubelet_api::runtime::{
    ContainerConfig, ContainerEventKind, ContainerFilter, ContainerMetadata, ContainerState,
    PodSandboxConfig, PodSandboxMetadata, SandboxFilter, labels,
};
use kubelet_api::{ContainerRuntime, PodSource, SourceSender};
use kubelet_core::k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use kubelet_core::{KubeletBuilder, KubeletConfig};
use kubelet_cri::{CriConfig, CriRuntime};
use kubelet_pleg::{GenericPleg, GenericPlegConfig, PlegKind, new_pleg};
use tokio_util::sync::CancellationToken;

/// Command-line flags.
#[derive(Debug, Parser)]
struct Flags {
    /// Pods to start in the start benchmark.
    #[arg(long, default_value_t = 30)]
    pods: usize,
    /// Rounds of (the direct floor at each width, agent).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// The direct CRI floor is measured with this many pods started at a time (1 = back to
    /// back).
    #[arg(long, value_delimiter = ',', default_value = "1,4,8")]
    widths: Vec<usize>,
    /// Run the agent on the relist PLEG (`EventedPLEG=false`) instead of the default evented
    /// one.
    #[arg(long)]
    relist: bool,
    /// Bound each start stage of the agent (RunPodSandbox, CreateContainer, StartContainer) to
    /// this many concurrent calls (`kubelet_core::layer::StageLimits`); 0 = unbounded. Default:
    /// the agent's default on a CRI runtime (`StageLimits::cri_default_max`, two per CPU).
    #[arg(long)]
    stage_limit: Option<usize>,
    /// Container counts for the relist benchmark.
    #[arg(long, value_delimiter = ',', default_value = "30,110")]
    relist_sizes: Vec<usize>,
    /// Relists (and bare round trips) per size.
    #[arg(long, default_value_t = 30)]
    runs: usize,
    /// Measure the latency of container events over this many container exits, instead of the
    /// start and relist benchmarks.
    #[arg(long)]
    events: Option<usize>,
    /// With `--events`: then stop this many running containers at once and measure their events.
    #[arg(long, default_value_t = 50)]
    burst: usize,
    /// After each agent teardown, print the agent's runtime calls made during it by operation:
    /// how many, when the last one returned, their median and longest time in the runtime.
    #[arg(long)]
    timeline: bool,
    /// Experiment: the agent's removals wait while any of its stops is in flight.
    #[arg(long)]
    removals_after_stops: bool,
    /// How often the agent's teardown looks at the runtime for the bench pods' containers
    /// still running and sandboxes still ready (milliseconds).
    #[arg(long, default_value_t = 10)]
    poll_ms: u64,
    /// Run the same look at the runtime, as often, during the direct teardown (so both
    /// teardowns carry the observer's list calls).
    #[arg(long)]
    observe_floor: bool,
    /// Experiment: at most this many stops of each kind in flight (0 = unbounded).
    #[arg(long, default_value_t = 0)]
    stop_limit: usize,
}

/// Stops bounded per kind.
#[derive(Clone)]
struct StopLimit {
    containers: Arc<tokio::sync::Semaphore>,
    sandboxes: Arc<tokio::sync::Semaphore>,
}

impl kubelet_core::layer::Interceptor for StopLimit {
    fn intercept<'a, T: Send + 'a>(
        &'a self,
        call: kubelet_core::layer::Call,
        fut: futures::future::BoxFuture<'a, kubelet_api::Result<T>>,
    ) -> futures::future::BoxFuture<'a, kubelet_api::Result<T>> {
        let sem = match call.operation {
            "stop_container" => &self.containers,
            "stop_podsandbox" => &self.sandboxes,
            _ => return fut,
        };
        Box::pin(async move {
            let _slot = sem.acquire().await.ok();
            fut.await
        })
    }
}

impl Flags {
    /// How often a teardown looks at the runtime.
    fn poll(&self) -> Duration {
        Duration::from_millis(self.poll_ms.max(1))
    }
}

/// Removals wait while a stop is in flight.
#[derive(Clone, Default)]
struct RemovalsAfterStops {
    stops: Arc<std::sync::atomic::AtomicUsize>,
    quiet: Arc<tokio::sync::Notify>,
}

struct StopInFlight(RemovalsAfterStops);

impl Drop for StopInFlight {
    fn drop(&mut self) {
        if self
            .0
            .stops
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst)
            == 1
        {
            self.0.quiet.notify_waiters();
        }
    }
}

impl kubelet_core::layer::Interceptor for RemovalsAfterStops {
    fn intercept<'a, T: Send + 'a>(
        &'a self,
        call: kubelet_core::layer::Call,
        fut: futures::future::BoxFuture<'a, kubelet_api::Result<T>>,
    ) -> futures::future::BoxFuture<'a, kubelet_api::Result<T>> {
        use std::sync::atomic::Ordering;
        match call.operation {
            "stop_container" | "stop_podsandbox" => {
                self.stops.fetch_add(1, Ordering::SeqCst);
                let guard = StopInFlight(self.clone());
                Box::pin(async move {
                    let r = fut.await;
                    drop(guard);
                    r
                })
            }
            "remove_container" | "remove_podsandbox" => Box::pin(async move {
                loop {
                    let quiet = self.quiet.notified();
                    if self.stops.load(Ordering::SeqCst) == 0 {
                        break;
                    }
                    quiet.await;
                }
                fut.await
            }),
            _ => fut,
        }
    }
}

/// Every runtime call the agent makes (innermost layer, so the times are the runtime's):
/// operation, start and end since `epoch`, success.
#[derive(Clone)]
struct Timeline {
    epoch: Instant,
    calls: Arc<std::sync::Mutex<Vec<TimedCall>>>,
}

#[derive(Debug, Clone, Copy)]
struct TimedCall {
    operation: &'static str,
    start: Duration,
    end: Duration,
    ok: bool,
}

impl Timeline {
    fn new() -> Self {
        Self {
            epoch: Instant::now(),
            calls: Arc::default(),
        }
    }

    /// The calls started at or after `from` (since the epoch).
    fn since(&self, from: Duration) -> Vec<TimedCall> {
        let calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        calls.iter().filter(|c| c.start >= from).copied().collect()
    }

    /// One line per operation of `calls`: count (failures), last end after `from`, median and
    /// longest duration.
    fn print(calls: &[TimedCall], from: Duration) {
        let mut ops: Vec<&'static str> = calls.iter().map(|c| c.operation).collect();
        ops.sort_unstable();
        ops.dedup();
        for op in ops {
            let mut d: Vec<Duration> = calls
                .iter()
                .filter(|c| c.operation == op)
                .map(|c| c.end - c.start)
                .collect();
            d.sort_unstable();
            let failed = calls.iter().filter(|c| c.operation == op && !c.ok).count();
            let last = calls
                .iter()
                .filter(|c| c.operation == op)
                .map(|c| c.end)
                .max()
                .unwrap_or(from);
            println!(
                "    {op:<20} {:>5} calls ({failed} failed), last returned at {:>6.0} ms, \
                 median {:>6.1} ms, longest {:>6.1} ms",
                d.len(),
                bench_support::ms(last.saturating_sub(from)),
                bench_support::ms(bench_support::percentile(&d, 0.5)),
                bench_support::ms(d.last().copied().unwrap_or_default()),
            );
        }
    }
}

impl kubelet_core::layer::Interceptor for Timeline {
    fn intercept<'a, T: Send + 'a>(
        &'a self,
        call: kubelet_core::layer::Call,
        fut: futures::future::BoxFuture<'a, kubelet_api::Result<T>>,
    ) -> futures::future::BoxFuture<'a, kubelet_api::Result<T>> {
        Box::pin(async move {
            let start = self.epoch.elapsed();
            let r = fut.await;
            let end = self.epoch.elapsed();
            let mut calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
            calls.push(TimedCall {
                operation: call.operation,
                start,
                end,
                ok: r.is_ok(),
            });
            r
        })
    }
}

/// The private containerd.
type Env = bench_support::ContainerdEnv;

/// The bench pods, then whatever the harness sends (an empty list tears them down).
struct Snapshots {
    first: Vec<Pod>,
    later: tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<Vec<Pod>>>,
}

#[async_trait]
impl PodSource for Snapshots {
    fn name(&self) -> &str {
        "file"
    }
    async fn run(&self, out: SourceSender, shutdown: CancellationToken) {
        if out.snapshot(self.first.clone()).await.is_err() {
            return;
        }
        let mut later = self.later.lock().await;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                Some(pods) = later.recv() => {
                    if out.snapshot(pods).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// The containers' command: a shell that ends on SIGTERM (PID 1 of a container ignores it
/// otherwise), so a stop measures the work of stopping, not a grace period.
fn command() -> Vec<String> {
    vec![
        "/bin/sh".into(),
        "-c".into(),
        "trap 'exit 0' TERM; sleep 100000 & wait".into(),
    ]
}

/// The stop timeout of the direct teardown: the agent's (the kubelet's minimum grace period,
/// these pods asking for 0 s).
const STOP_TIMEOUT: Duration = Duration::from_secs(2);

fn bench_pod(i: usize, image: &str) -> Pod {
    let mut p = Pod {
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "app".into(),
                image: Some(image.into()),
                command: Some(command()),
                ..Default::default()
            }],
            host_network: Some(true),
            termination_grace_period_seconds: Some(0),
            ..Default::default()
        }),
        ..Default::default()
    };
    p.metadata.name = Some(format!("bench-{i}"));
    p.metadata.namespace = Some("default".into());
    p.metadata.uid = Some(format!("bench-uid-{i}"));
    p
}

fn direct_configs(
    i: usize,
    image: &str,
    logs: &Path,
    tag: &str,
) -> (PodSandboxConfig, ContainerConfig) {
    let uid = format!("direct-{tag}-{i}");
    let mut l = kubelet_api::runtime::Labels::new();
    l.insert(labels::POD_UID.into(), uid.clone());
    l.insert(labels::POD_NAME.into(), format!("direct-{i}"));
    l.insert(labels::POD_NAMESPACE.into(), "default".into());
    let sandbox = {
        let mut v = PodSandboxConfig::default();
        v.metadata = PodSandboxMetadata {
            name: format!("direct-{i}"),
            namespace: "default".into(),
            uid: uid.clone(),
            attempt: 0,
        };
        v.log_directory = logs.join(&uid);
        v.labels = l.clone();
        v.host_network = true;
        v
    };
    let mut cl = l;
    cl.insert(labels::CONTAINER_NAME.into(), "app".into());
    let container = {
        let mut v = ContainerConfig::default();
        v.metadata = ContainerMetadata {
            name: "app".into(),
            attempt: 0,
        };
        v.image = image.into();
        v.command = command();
        v.labels = cl;
        v.log_path = "app/0.log".into();
        v
    };
    (sandbox, container)
}

/// Starts direct pod `i`; returns its (sandbox, container) IDs.
async fn start_direct(
    rt: &CriRuntime,
    i: usize,
    image: &str,
    logs: &Path,
    tag: &str,
) -> anyhow::Result<(String, String)> {
    let (s, c) = direct_configs(i, image, logs, tag);
    let id = rt.run_pod_sandbox(&s).await?;
    let cid = rt.create_container(&id, &c, &s).await?;
    rt.start_container(&cid).await?;
    Ok((id, cid))
}

/// The direct teardown floor: StopContainer then StopPodSandbox per pod, `width` pods at a
/// time (what the agent does for a deleted pod before it is gone from the runtime's view).
async fn stop_direct(
    rt: &CriRuntime,
    pods: Vec<(String, String)>,
    width: usize,
) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let sem = Arc::new(tokio::sync::Semaphore::new(width));
    let mut set = tokio::task::JoinSet::new();
    for (sandbox, container) in pods {
        let (rt, sem) = (rt.clone(), sem.clone());
        set.spawn(async move {
            let _permit = sem.acquire_owned().await?;
            rt.stop_container(&container, STOP_TIMEOUT).await?;
            rt.stop_pod_sandbox(&sandbox).await?;
            anyhow::Ok(())
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    Ok(t.elapsed())
}

/// Of the pods whose UID starts with `prefix`: the containers running and the sandboxes ready.
async fn left_running(rt: &CriRuntime, prefix: &str) -> anyhow::Result<(usize, usize)> {
    let ours = |labels: &kubelet_api::runtime::Labels| {
        labels
            .get(labels::POD_UID)
            .is_some_and(|u| u.starts_with(prefix))
    };
    let running = rt
        .list_containers(&ContainerFilter {
            state: Some(ContainerState::Running),
            ..Default::default()
        })
        .await?
        .iter()
        .filter(|c| ours(&c.labels))
        .count();
    let ready = rt
        .list_pod_sandboxes(&SandboxFilter {
            state: Some(kubelet_api::runtime::SandboxState::Ready),
            ..Default::default()
        })
        .await?
        .iter()
        .filter(|s| ours(&s.labels))
        .count();
    Ok((running, ready))
}

/// Removes every sandbox (and so every container) of the runtime. Retries a few times: an
/// agent that was just stopped may leave a removal of its own in flight.
async fn remove_all(rt: &CriRuntime) -> anyhow::Result<()> {
    let mut attempt = 0;
    loop {
        match remove_all_once(rt).await {
            Ok(()) => return Ok(()),
            Err(e) if attempt < 5 => {
                attempt += 1;
                eprintln!("cleanup: {e:#}; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

async fn remove_all_once(rt: &CriRuntime) -> anyhow::Result<()> {
    let sandboxes = rt.list_pod_sandboxes(&SandboxFilter::default()).await?;
    let mut set = tokio::task::JoinSet::new();
    for s in sandboxes {
        let rt = rt.clone();
        set.spawn(async move {
            rt.stop_pod_sandbox(&s.id).await?;
            rt.remove_pod_sandbox(&s.id).await
        });
    }
    let mut result = Ok(());
    while let Some(r) = set.join_next().await {
        if let Err(e) = r? {
            result = Err(e.into());
        }
    }
    result
}

async fn direct_sequential(
    rt: &CriRuntime,
    env: &Env,
    n: usize,
    round: usize,
) -> anyhow::Result<Duration> {
    let logs = env.dir.join("logs");
    let tag = format!("seq{round}");
    let t = Instant::now();
    for i in 0..n {
        let _ = start_direct(rt, i, &env.busybox, &logs, &tag).await?;
    }
    let d = t.elapsed();
    remove_all(rt).await?;
    Ok(d)
}

/// The direct floor at `width` pods at a time: (start, teardown).
async fn direct_concurrent(
    rt: &CriRuntime,
    env: &Env,
    round: usize,
    width: usize,
    flags: &Flags,
) -> anyhow::Result<(Duration, Duration)> {
    let n = flags.pods;
    let (poll, observe_floor, mark) = (flags.poll(), flags.observe_floor, flags.timeline);
    let logs = env.dir.join("logs");
    let tag = format!("par{round}");
    let t = Instant::now();
    let sem = Arc::new(tokio::sync::Semaphore::new(width));
    let mut set = tokio::task::JoinSet::new();
    for i in 0..n {
        let (rt, sem, image, logs, tag) = (
            rt.clone(),
            sem.clone(),
            env.busybox.clone(),
            logs.clone(),
            tag.clone(),
        );
        set.spawn(async move {
            let _permit = sem.acquire_owned().await?;
            start_direct(&rt, i, &image, &logs, &tag).await
        });
    }
    let mut pods = Vec::with_capacity(n);
    while let Some(r) = set.join_next().await {
        pods.push(r??);
    }
    let d = t.elapsed();
    // The same observer as the agent's teardown, when asked: its list calls load the runtime.
    let observer = observe_floor.then(|| {
        let (rt, done) = (rt.clone(), CancellationToken::new());
        let stop = done.clone();
        let task = tokio::spawn(async move {
            while !stop.is_cancelled() {
                let _ = left_running(&rt, "direct-").await;
                tokio::time::sleep(poll).await;
            }
        });
        (done, task)
    });
    let from = Instant::now();
    let teardown = stop_direct(rt, pods, width).await?;
    if mark {
        println!("  direct teardown from {from:?} to {:?}", Instant::now());
    }
    if let Some((done, task)) = observer {
        done.cancel();
        let _ = task.await;
    }
    remove_all(rt).await?;
    Ok((d, teardown))
}

async fn through_agent(
    rt: &Arc<CriRuntime>,
    env: &Env,
    round: usize,
    pleg: PlegKind,
    stage_limit: usize,
    flags: &Flags,
) -> anyhow::Result<(Duration, Duration)> {
    let n = flags.pods;
    let (print_timeline, removals_after_stops, stop_limit) =
        (flags.timeline, flags.removals_after_stops, flags.stop_limit);
    let poll = flags.poll();
    let pods: Vec<Pod> = (0..n).map(|i| bench_pod(i, &env.busybox)).collect();
    let uids: Vec<String> = pods.iter().filter_map(|p| p.metadata.uid.clone()).collect();
    // Timed only when asked: the default figures carry no layer of the harness's own.
    let timeline = print_timeline.then(Timeline::new);
    let runtime: Arc<dyn ContainerRuntime> = match &timeline {
        Some(t) => Arc::new(kubelet_core::layer::Intercepted::new(rt.clone(), t.clone())),
        None => rt.clone(),
    };
    let (pleg, pleg_events) = new_pleg(pleg, runtime.clone());
    let runtime: Arc<dyn ContainerRuntime> = if stop_limit > 0 {
        Arc::new(kubelet_core::layer::Intercepted::new(
            runtime,
            StopLimit {
                containers: Arc::new(tokio::sync::Semaphore::new(stop_limit)),
                sandboxes: Arc::new(tokio::sync::Semaphore::new(stop_limit)),
            },
        ))
    } else {
        runtime
    };
    let runtime: Arc<dyn ContainerRuntime> = if removals_after_stops {
        Arc::new(kubelet_core::layer::Intercepted::new(
            runtime,
            RemovalsAfterStops::default(),
        ))
    } else {
        runtime
    };
    let runtime = if stage_limit > 0 {
        kubelet_core::layer::RuntimeLayer::layer(
            &kubelet_core::layer::StageLimits::new(stage_limit),
            runtime,
        )
    } else {
        runtime
    };
    let root = env.dir.join(format!("agent-{round}"));
    let (later_tx, later_rx) = tokio::sync::mpsc::unbounded_channel();
    let source = Snapshots {
        first: pods,
        later: tokio::sync::Mutex::new(later_rx),
    };
    let kubelet = KubeletBuilder::new("bench-node")
        .config(KubeletConfig::with_dirs(
            root.join("root"),
            root.join("logs"),
        ))
        .runtime(runtime)
        .pleg(pleg, pleg_events)
        .pod_source(Arc::new(source))
        .build()?;
    let statuses = kubelet.handle().statuses();
    let shutdown = CancellationToken::new();
    let t = Instant::now();
    let task = tokio::spawn(kubelet.run(shutdown.clone()));
    let deadline = t + Duration::from_secs(300);
    loop {
        let running =
            uids.iter()
                .filter(|u| {
                    statuses.get(u).is_some_and(|p| {
                        p.status.phase.as_deref() == Some("Running")
                            && p.status.container_statuses.iter().flatten().all(|c| {
                                c.state.as_ref().and_then(|s| s.running.as_ref()).is_some()
                            })
                    })
                })
                .count();
        if running == n {
            break;
        }
        if Instant::now() > deadline {
            shutdown.cancel();
            bail!("only {running}/{n} pods Running after 300 s");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let d = t.elapsed();
    // Teardown: the pods leave the source; until the runtime shows none of their containers
    // running and none of their sandboxes ready.
    let teardown = Instant::now();
    let teardown_from = timeline.as_ref().map(|t| t.epoch.elapsed());
    later_tx.send(Vec::new())?;
    let deadline = teardown + Duration::from_secs(300);
    loop {
        let (running, ready) = left_running(rt, "bench-uid-").await?;
        if running == 0 && ready == 0 {
            break;
        }
        if Instant::now() > deadline {
            shutdown.cancel();
            bail!(
                "{running} containers running, {ready} sandboxes ready 300 s after the pods left"
            );
        }
        tokio::time::sleep(poll).await;
    }
    let teardown = teardown.elapsed();
    if let (Some(timeline), Some(from)) = (&timeline, teardown_from) {
        println!(
            "  agent teardown {:.0} ms (to {:?}); its runtime calls meanwhile:",
            bench_support::ms(teardown),
            Instant::now()
        );
        Timeline::print(&timeline.since(from), from);
    }
    shutdown.cancel();
    let _ = task.await;
    remove_all(rt).await?;
    Ok((d, teardown))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

async fn relist_cost(
    rt: &Arc<CriRuntime>,
    env: &Env,
    containers: usize,
    runs: usize,
) -> anyhow::Result<()> {
    let logs = env.dir.join("logs");
    let tag = format!("relist{containers}");
    let sem = Arc::new(tokio::sync::Semaphore::new(4));
    let mut set = tokio::task::JoinSet::new();
    for i in 0..containers {
        let (rt, sem, image, logs, tag) = (
            rt.clone(),
            sem.clone(),
            env.busybox.clone(),
            logs.clone(),
            tag.clone(),
        );
        set.spawn(async move {
            let _permit = sem.acquire_owned().await?;
            start_direct(&rt, i, &image, &logs, &tag).await
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    let runtime: Arc<dyn ContainerRuntime> = rt.clone();
    let (pleg, _events) = GenericPleg::new(runtime, GenericPlegConfig::default());
    let t = Instant::now();
    let first = pleg.relist().await?;
    let first_time = t.elapsed();
    let mut relists = Vec::with_capacity(runs);
    let mut bare = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        let r = pleg.relist().await?;
        relists.push(t.elapsed());
        if r.pods_inspected != 0 {
            bail!("steady relist inspected {} pods", r.pods_inspected);
        }
        let t = Instant::now();
        let s = rt.list_pod_sandboxes(&SandboxFilter::default()).await?;
        let c = rt.list_containers(&ContainerFilter::default()).await?;
        bare.push(t.elapsed());
        if c.len() != containers || s.len() != containers {
            bail!("expected {containers} containers, listed {}", c.len());
        }
    }
    let (r, b) = (median(relists), median(bare));
    println!(
        "relist {containers:>3} containers: first relist (inspects {} pods) {:>8.2} ms; steady relist median {:>6.2} ms; \
         ListPodSandbox+ListContainers median {:>6.2} ms; ratio {:.2}",
        first.pods_inspected,
        first_time.as_secs_f64() * 1e3,
        r.as_secs_f64() * 1e3,
        b.as_secs_f64() * 1e3,
        r.as_secs_f64() / b.as_secs_f64().max(1e-9)
    );
    remove_all(rt).await?;
    Ok(())
}

/// The `q` quantile (0..=1) of sorted `v`, nearest rank.
fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

fn millis_between(from: jiff::Timestamp, to: jiff::Timestamp) -> f64 {
    (to.as_nanosecond() - from.as_nanosecond()) as f64 / 1e6
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Benchmark 3: see the crate docs.
async fn event_latency(
    rt: &Arc<CriRuntime>,
    env: &Env,
    exits: usize,
    burst: usize,
) -> anyhow::Result<()> {
    let (sandbox_cfg, _) = direct_configs(0, &env.busybox, &env.dir.join("logs"), "events");
    let sandbox = rt.run_pod_sandbox(&sandbox_cfg).await?;

    // The events, stamped as they arrive.
    let mut stream = rt.container_events().await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let reader = tokio::spawn(async move {
        while let Some(item) = stream.next().await {
            let now = jiff::Timestamp::now();
            if tx.send(item.map(|e| (e, now))).is_err() {
                return;
            }
        }
    });

    // The baseline: a relist every second; records when it first lists each container exited
    // (the main loop removes those).
    let seen_by_relist = Arc::new(std::sync::Mutex::new(std::collections::HashMap::<
        String,
        jiff::Timestamp,
    >::new()));
    let stop = CancellationToken::new();
    let relister = {
        let (rt, seen, stop) = (rt.clone(), seen_by_relist.clone(), stop.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return anyhow::Ok(()),
                    _ = tick.tick() => {}
                }
                let listed = rt.list_containers(&ContainerFilter::default()).await?;
                let now = jiff::Timestamp::now();
                let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
                for c in listed {
                    if c.state == ContainerState::Exited {
                        seen.entry(c.id).or_insert(now);
                    }
                }
            }
        })
    };

    let mut exit_to_event = Vec::with_capacity(exits);
    let mut exit_to_publish = Vec::with_capacity(exits);
    let mut publish_to_arrival = Vec::with_capacity(exits);
    let mut finished = Vec::with_capacity(exits);
    let mut removed = std::collections::HashSet::new();
    let t = Instant::now();
    for i in 0..exits {
        let to_remove: Vec<String> = seen_by_relist
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .filter(|id| !removed.contains(*id))
            .cloned()
            .collect();
        for id in to_remove {
            rt.remove_container(&id).await?;
            removed.insert(id);
        }
        let mut cfg = {
            let mut v = ContainerConfig::default();
            v.metadata = ContainerMetadata {
                name: format!("exit-{i}"),
                attempt: 0,
            };
            v.image = env.busybox.clone();
            v.command = vec!["/bin/sh".into(), "-c".into(), "sleep 0.1".into()];
            v.labels = sandbox_cfg.labels.clone();
            v.log_path = format!("exit-{i}/0.log");
            v
        };
        cfg.labels
            .insert(labels::CONTAINER_NAME.into(), format!("exit-{i}"));
        let id = rt.create_container(&sandbox, &cfg, &sandbox_cfg).await?;
        rt.start_container(&id).await?;
        let (event, arrived) = loop {
            let next = tokio::time::timeout(Duration::from_secs(30), rx.recv()).await;
            let Ok(Some(item)) = next else {
                bail!("no Stopped event for container {i} within 30 s");
            };
            let (event, arrived) = item?;
            if event.container_id == id && event.kind == ContainerEventKind::Stopped {
                break (event, arrived);
            }
        };
        let status = rt.container_status(&id).await?;
        let Some(exit) = status.finished_at else {
            bail!(
                "container {i}: Stopped event but no finished_at ({:?})",
                status.state
            );
        };
        exit_to_event.push(millis_between(exit, arrived));
        exit_to_publish.push(millis_between(exit, event.created_at));
        publish_to_arrival.push(millis_between(event.created_at, arrived));
        finished.push((id, exit));
    }
    let elapsed = t.elapsed();

    // The burst: `burst` running containers killed at once.
    let mut running = Vec::with_capacity(burst);
    for i in 0..burst {
        let name = format!("burst-{i}");
        let mut cfg = {
            let mut v = ContainerConfig::default();
            v.metadata = ContainerMetadata {
                name: name.clone(),
                attempt: 0,
            };
            v.image = env.busybox.clone();
            v.command = vec!["/bin/sleep".into(), "100000".into()];
            v.labels = sandbox_cfg.labels.clone();
            v.log_path = format!("{name}/0.log");
            v
        };
        cfg.labels.insert(labels::CONTAINER_NAME.into(), name);
        let id = rt.create_container(&sandbox, &cfg, &sandbox_cfg).await?;
        rt.start_container(&id).await?;
        running.push(id);
    }
    // Drain the events of their creation.
    while let Ok(Some(item)) = tokio::time::timeout(Duration::from_millis(500), rx.recv()).await {
        item?;
    }
    let mut set = tokio::task::JoinSet::new();
    for id in running.clone() {
        let rt = rt.clone();
        set.spawn(async move { rt.stop_container(&id, Duration::ZERO).await });
    }
    let mut arrivals = std::collections::HashMap::new();
    while arrivals.len() < burst {
        let next = tokio::time::timeout(Duration::from_secs(30), rx.recv()).await;
        let Ok(Some(item)) = next else {
            bail!(
                "only {} of {burst} Stopped events within 30 s",
                arrivals.len()
            );
        };
        let (event, arrived) = item?;
        if event.kind == ContainerEventKind::Stopped && running.contains(&event.container_id) {
            arrivals.insert(event.container_id, arrived);
        }
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    let mut burst_exit_to_event = Vec::with_capacity(burst);
    let mut burst_finished = Vec::with_capacity(burst);
    for (id, arrived) in &arrivals {
        let status = rt.container_status(id).await?;
        let Some(exit) = status.finished_at else {
            bail!("burst container {id}: Stopped event but no finished_at");
        };
        burst_exit_to_event.push(millis_between(exit, *arrived));
        burst_finished.push((id.clone(), exit));
    }
    burst_exit_to_event.sort_by(f64::total_cmp);

    // Let the relist see the last ones.
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen_by_relist
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .len()
        < exits + burst
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.cancel();
    relister.await??;
    reader.abort();
    let seen = seen_by_relist
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let relist_latency = |finished: &[(String, jiff::Timestamp)]| -> Vec<f64> {
        let mut v: Vec<f64> = finished
            .iter()
            .filter_map(|(id, exit)| seen.get(id).map(|at| millis_between(*exit, *at)))
            .collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let mut exit_to_relist = relist_latency(&finished);
    let burst_exit_to_relist = relist_latency(&burst_finished);
    for v in [
        &mut exit_to_event,
        &mut exit_to_publish,
        &mut publish_to_arrival,
        &mut exit_to_relist,
    ] {
        v.sort_by(f64::total_cmp);
    }
    let line = |name: &str, v: &[f64]| {
        println!(
            "{name:<34} n={:<4} p50 {:>8.2} ms  p99 {:>8.2} ms  max {:>8.2} ms",
            v.len(),
            quantile(v, 0.5),
            quantile(v, 0.99),
            v.last().copied().unwrap_or(f64::NAN)
        );
    };
    println!(
        "{exits} container exits in {:.1} s, load average {}",
        elapsed.as_secs_f64(),
        loadavg()
    );
    line("exit -> Stopped event", &exit_to_event);
    line("  exit -> containerd publish", &exit_to_publish);
    line("  publish -> arrival", &publish_to_arrival);
    line("exit -> relist every 1 s sees it", &exit_to_relist);
    line(
        &format!("burst of {burst}: exit -> Stopped"),
        &burst_exit_to_event,
    );
    line(
        &format!("burst of {burst}: exit -> relist"),
        &burst_exit_to_relist,
    );
    println!(
        "event / relist: p50 {:.3}, p99 {:.3}",
        quantile(&exit_to_event, 0.5) / quantile(&exit_to_relist, 0.5),
        quantile(&exit_to_event, 0.99) / quantile(&exit_to_relist, 0.99)
    );
    remove_all(rt).await?;
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let flags = Flags::parse();
    let env = Env::start("start", "ksdk-cri-bench-")?;
    let rt = Arc::new(CriRuntime::connect(CriConfig::new(env.endpoint())).await?);
    let v = rt.version().await?;
    println!(
        "runtime {} {} (CRI {}), {} pods, {} rounds",
        v.runtime_name, v.runtime_version, v.runtime_api_version, flags.pods, flags.rounds
    );
    // Warm-up: the first sandbox and container pay one-off costs (image unpack, CNI setup).
    direct_sequential(&rt, &env, 2, 0).await?;
    if let Some(exits) = flags.events {
        println!("load average before: {}", loadavg());
        return event_latency(&rt, &env, exits, flags.burst).await;
    }

    let pleg = if flags.relist {
        PlegKind::Relist
    } else {
        PlegKind::Evented
    };
    let stage_limit = flags
        .stage_limit
        .unwrap_or_else(kubelet_core::layer::StageLimits::cri_default_max);
    println!("agent start stage limit: {stage_limit} (0 = unbounded)");
    let mut floors: Vec<Vec<Duration>> = vec![Vec::new(); flags.widths.len()];
    let mut floor_stops: Vec<Vec<Duration>> = vec![Vec::new(); flags.widths.len()];
    let mut agent = Vec::new();
    let mut agent_stops = Vec::new();
    for round in 1..=flags.rounds {
        let mut line = format!("round {round}:");
        for (w, width) in flags.widths.iter().enumerate() {
            let (d, stop) = direct_concurrent(&rt, &env, round, (*width).max(1), &flags).await?;
            line += &format!(
                " direct {width} at a time {:>6.0} ms (teardown {:>5.0} ms),",
                d.as_secs_f64() * 1e3,
                stop.as_secs_f64() * 1e3
            );
            floors[w].push(d);
            floor_stops[w].push(stop);
        }
        let (a, stop) = through_agent(&rt, &env, round, pleg, stage_limit, &flags).await?;
        println!(
            "{line} agent ({pleg:?} PLEG) {:>6.0} ms (teardown {:>5.0} ms)",
            a.as_secs_f64() * 1e3,
            stop.as_secs_f64() * 1e3
        );
        agent.push(a);
        agent_stops.push(stop);
    }
    let (a, a_stop) = (median(agent), median(agent_stops));
    println!(
        "start {} pods (median of {} rounds): agent ({pleg:?} PLEG) {:.0} ms; teardown {:.0} ms",
        flags.pods,
        flags.rounds,
        a.as_secs_f64() * 1e3,
        a_stop.as_secs_f64() * 1e3
    );
    for ((width, f), stop) in flags.widths.iter().zip(floors).zip(floor_stops) {
        let (f, stop) = (median(f), median(stop));
        println!(
            "  CRI floor, {width} at a time: start {:.0} ms, agent / floor {:.2}; teardown {:.0} ms, agent / floor {:.2}",
            f.as_secs_f64() * 1e3,
            a.as_secs_f64() / f.as_secs_f64(),
            stop.as_secs_f64() * 1e3,
            a_stop.as_secs_f64() / stop.as_secs_f64()
        );
    }
    for n in flags.relist_sizes.clone() {
        relist_cost(&rt, &env, n, flags.runs).await?;
    }
    Ok(())
}
