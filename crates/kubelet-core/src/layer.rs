//! Runtime layers: cross-cutting behaviour wrapped around any [`ContainerRuntime`], after
//! tower's `Layer` idea.
//!
//! A [`RuntimeLayer`] turns a runtime into another runtime; [`KubeletBuilder::runtime_layer`]
//! applies layers at build. The two built-in ones give every runtime what the CRI runtime does
//! at the RPC level:
//!
//! * [`Deadlines`]: a deadline on every call, the kubelet's `runtimeRequestTimeout` (2 min),
//!   plus the grace period for `stop_container` and the command's timeout for `exec_sync`;
//!   image pulls have none unless set (as the kubelet). A call past its deadline returns
//!   [`ErrorKind::DeadlineExceeded`].
//! * [`OperationMetrics`]: the kubelet's `kubelet_runtime_operations_total`,
//!   `kubelet_runtime_operations_errors_total` and `kubelet_runtime_operations_duration_seconds`
//!   by `operation_type` (`run_podsandbox`, `list_containers`, …), the kubelet's buckets.
//!
//! A third, [`StageLimits`], is opt-in: it bounds how many `RunPodSandbox`, `CreateContainer`
//! and `StartContainer` calls run at once (per stage), for runtimes that slow down when a burst
//! of pods reaches them all at once.
//!
//! All are [`Interceptor`]s run by one delegating wrapper, [`Intercepted`], which forwards
//! every method of the trait, optional capabilities included; a new capability method added to
//! [`ContainerRuntime`] is forwarded there once. Interceptors compose: `(outer, inner)` is one
//! interceptor (and one layer) running `outer` around `inner`, and `None` passes calls through,
//! so `(Some(StageLimits::new(4)), OperationMetrics::new()).layer(runtime)` wraps the runtime once
//! instead of twice.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use kubelet_core::layer::{Deadlines, OperationMetrics};
//! use kubelet_core::KubeletBuilder;
//!
//! let builder = KubeletBuilder::new("node-1")
//!     .runtime_layer(Arc::new(Deadlines::new(Duration::from_secs(120))))
//!     .runtime_layer(Arc::new(OperationMetrics::new()));
//! # let _ = builder;
//! ```
//!
//! [`KubeletBuilder::runtime_layer`]: crate::KubeletBuilder::runtime_layer

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use crate::error::{Error, ErrorKind, Result};
use kubelet_api::runtime::{
    AuthConfig, Container, ContainerConfig, ContainerEventStream, ContainerFilter, ContainerStats,
    ContainerStatus, ExecResult, Image, ImageFsInfo, ImageSpec, PodSandbox, PodSandboxConfig,
    PodSandboxStatus, RuntimeStatus, RuntimeVersion, SandboxFilter,
};
use kubelet_api::{ContainerRuntime, ImageService};

/// Turns a runtime into a wrapped one.
pub trait RuntimeLayer: Send + Sync + 'static {
    /// Wrap `inner`.
    fn layer(&self, inner: Arc<dyn ContainerRuntime>) -> Arc<dyn ContainerRuntime>;
}

fn _assert_layer_dyn(_: &dyn RuntimeLayer) {}

/// One runtime call as an [`Interceptor`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Call {
    /// The kubelet's `operation_type` of the call (`run_podsandbox`, `exec_sync`, …).
    pub operation: &'static str,
    /// How long the call may take beyond the request timeout (the grace period of
    /// `stop_container`, the command timeout of `exec_sync`).
    pub allowance: Duration,
    /// An image pull: bounded by the pull timeout, not the request timeout.
    pub image_pull: bool,
}

impl Call {
    fn new(operation: &'static str) -> Self {
        Self {
            operation,
            allowance: Duration::ZERO,
            image_pull: false,
        }
    }

    fn with_allowance(mut self, allowance: Duration) -> Self {
        self.allowance = allowance;
        self
    }
}

/// Behaviour run around every runtime call by [`Intercepted`].
pub trait Interceptor: Send + Sync + 'static {
    /// Run `call` (already started lazily: nothing happens until it is polled).
    fn intercept<'a, T: Send + 'a>(
        &'a self,
        call: Call,
        fut: BoxFuture<'a, Result<T>>,
    ) -> BoxFuture<'a, Result<T>>;

    /// Register the interceptor's metrics, if any.
    fn register_metrics(&self, registry: &mut Registry) {
        let _ = registry;
    }
}

/// No interceptor: calls pass through (an optional part of a combined layer).
impl<I: Interceptor> Interceptor for Option<I> {
    fn intercept<'a, T: Send + 'a>(
        &'a self,
        call: Call,
        fut: BoxFuture<'a, Result<T>>,
    ) -> BoxFuture<'a, Result<T>> {
        match self {
            Some(i) => i.intercept(call, fut),
            None => fut,
        }
    }

    fn register_metrics(&self, registry: &mut Registry) {
        if let Some(i) = self {
            i.register_metrics(registry);
        }
    }
}

/// Two interceptors in one layer: `(outer, inner)` runs `outer` around `inner`, as
/// `outer.layer(inner.layer(runtime))` would, with one runtime wrapper instead of two.
impl<A: Interceptor, B: Interceptor> Interceptor for (A, B) {
    fn intercept<'a, T: Send + 'a>(
        &'a self,
        call: Call,
        fut: BoxFuture<'a, Result<T>>,
    ) -> BoxFuture<'a, Result<T>> {
        self.0.intercept(call, self.1.intercept(call, fut))
    }

    fn register_metrics(&self, registry: &mut Registry) {
        self.0.register_metrics(registry);
        self.1.register_metrics(registry);
    }
}

impl<A: Interceptor + Clone, B: Interceptor + Clone> RuntimeLayer for (A, B) {
    fn layer(&self, inner: Arc<dyn ContainerRuntime>) -> Arc<dyn ContainerRuntime> {
        Arc::new(Intercepted::new(inner, self.clone()))
    }
}

/// A runtime whose every call runs through an [`Interceptor`].
pub struct Intercepted<I> {
    inner: Arc<dyn ContainerRuntime>,
    interceptor: I,
}

impl<I> std::fmt::Debug for Intercepted<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Intercepted").finish_non_exhaustive()
    }
}

impl<I: Interceptor> Intercepted<I> {
    /// Wrap `inner`.
    pub fn new(inner: Arc<dyn ContainerRuntime>, interceptor: I) -> Self {
        Self { inner, interceptor }
    }
}

#[async_trait]
impl<I: Interceptor> ContainerRuntime for Intercepted<I> {
    fn streaming(&self) -> Option<&dyn kubelet_api::StreamingRuntime> {
        self.inner.streaming()
    }
    async fn version(&self) -> Result<RuntimeVersion> {
        let c = Call::new("version");
        self.interceptor.intercept(c, self.inner.version()).await
    }
    async fn status(&self) -> Result<RuntimeStatus> {
        let c = Call::new("status");
        self.interceptor.intercept(c, self.inner.status()).await
    }
    async fn run_pod_sandbox(&self, config: &PodSandboxConfig) -> Result<String> {
        let c = Call::new("run_podsandbox");
        let fut = self.inner.run_pod_sandbox(config);
        self.interceptor.intercept(c, fut).await
    }
    async fn stop_pod_sandbox(&self, sandbox_id: &str) -> Result<()> {
        let c = Call::new("stop_podsandbox");
        let fut = self.inner.stop_pod_sandbox(sandbox_id);
        self.interceptor.intercept(c, fut).await
    }
    async fn remove_pod_sandbox(&self, sandbox_id: &str) -> Result<()> {
        let c = Call::new("remove_podsandbox");
        let fut = self.inner.remove_pod_sandbox(sandbox_id);
        self.interceptor.intercept(c, fut).await
    }
    async fn pod_sandbox_status(&self, sandbox_id: &str) -> Result<PodSandboxStatus> {
        let c = Call::new("podsandbox_status");
        let fut = self.inner.pod_sandbox_status(sandbox_id);
        self.interceptor.intercept(c, fut).await
    }
    async fn list_pod_sandboxes(&self, filter: &SandboxFilter) -> Result<Vec<PodSandbox>> {
        let c = Call::new("list_podsandbox");
        let fut = self.inner.list_pod_sandboxes(filter);
        self.interceptor.intercept(c, fut).await
    }
    async fn create_container(
        &self,
        sandbox_id: &str,
        config: &ContainerConfig,
        sandbox_config: &PodSandboxConfig,
    ) -> Result<String> {
        let c = Call::new("create_container");
        let fut = self
            .inner
            .create_container(sandbox_id, config, sandbox_config);
        self.interceptor.intercept(c, fut).await
    }
    async fn start_container(&self, container_id: &str) -> Result<()> {
        let c = Call::new("start_container");
        let fut = self.inner.start_container(container_id);
        self.interceptor.intercept(c, fut).await
    }
    async fn stop_container(&self, container_id: &str, timeout: Duration) -> Result<()> {
        let c = Call::new("stop_container").with_allowance(timeout);
        let fut = self.inner.stop_container(container_id, timeout);
        self.interceptor.intercept(c, fut).await
    }
    async fn remove_container(&self, container_id: &str) -> Result<()> {
        let c = Call::new("remove_container");
        let fut = self.inner.remove_container(container_id);
        self.interceptor.intercept(c, fut).await
    }
    async fn list_containers(&self, filter: &ContainerFilter) -> Result<Vec<Container>> {
        let c = Call::new("list_containers");
        let fut = self.inner.list_containers(filter);
        self.interceptor.intercept(c, fut).await
    }
    async fn container_status(&self, container_id: &str) -> Result<ContainerStatus> {
        let c = Call::new("container_status");
        let fut = self.inner.container_status(container_id);
        self.interceptor.intercept(c, fut).await
    }
    async fn exec_sync(
        &self,
        container_id: &str,
        cmd: &[String],
        timeout: Duration,
    ) -> Result<ExecResult> {
        let c = Call::new("exec_sync").with_allowance(timeout);
        let fut = self.inner.exec_sync(container_id, cmd, timeout);
        self.interceptor.intercept(c, fut).await
    }
    async fn container_stats(&self, container_id: &str) -> Result<ContainerStats> {
        let c = Call::new("container_stats");
        let fut = self.inner.container_stats(container_id);
        self.interceptor.intercept(c, fut).await
    }
    async fn list_container_stats(&self) -> Result<Vec<ContainerStats>> {
        let c = Call::new("list_container_stats");
        let fut = self.inner.list_container_stats();
        self.interceptor.intercept(c, fut).await
    }
    async fn list_pod_sandbox_stats(&self) -> Result<Vec<kubelet_api::runtime::PodSandboxStats>> {
        let c = Call::new("list_pod_sandbox_stats");
        let fut = self.inner.list_pod_sandbox_stats();
        self.interceptor.intercept(c, fut).await
    }
    async fn update_container_resources(
        &self,
        container_id: &str,
        resources: &kubelet_api::runtime::LinuxResources,
    ) -> Result<()> {
        let c = Call::new("update_container_resources");
        let fut = self
            .inner
            .update_container_resources(container_id, resources);
        self.interceptor.intercept(c, fut).await
    }
    async fn reopen_container_log(&self, container_id: &str) -> Result<()> {
        let c = Call::new("reopen_container_log");
        let fut = self.inner.reopen_container_log(container_id);
        self.interceptor.intercept(c, fut).await
    }
    async fn container_events(&self) -> Result<ContainerEventStream> {
        // The subscription call is intercepted; the stream itself is long-lived and is not.
        let c = Call::new("get_container_events");
        self.interceptor
            .intercept(c, self.inner.container_events())
            .await
    }
    fn images(&self) -> Option<&dyn ImageService> {
        // The wrapper answers for the inner image service, so image calls are intercepted too.
        self.inner.images().map(|_| self as &dyn ImageService)
    }
    fn register_metrics(&self, registry: &mut Registry) {
        self.interceptor.register_metrics(registry);
        self.inner.register_metrics(registry);
    }
}

impl<I: Interceptor> Intercepted<I> {
    fn inner_images(&self) -> Result<&dyn ImageService> {
        self.inner
            .images()
            .ok_or_else(|| Error::unsupported("images"))
    }
}

#[async_trait]
impl<I: Interceptor> ImageService for Intercepted<I> {
    async fn list_images(&self) -> Result<Vec<Image>> {
        let images = self.inner_images()?;
        let c = Call::new("list_images");
        self.interceptor.intercept(c, images.list_images()).await
    }
    async fn image_status(&self, image: &ImageSpec) -> Result<Option<Image>> {
        let images = self.inner_images()?;
        let c = Call::new("image_status");
        self.interceptor
            .intercept(c, images.image_status(image))
            .await
    }
    async fn pull_image(
        &self,
        image: &ImageSpec,
        auth: Option<&AuthConfig>,
        sandbox_config: &PodSandboxConfig,
    ) -> Result<String> {
        let images = self.inner_images()?;
        let mut c = Call::new("pull_image");
        c.image_pull = true;
        let fut = images.pull_image(image, auth, sandbox_config);
        self.interceptor.intercept(c, fut).await
    }
    async fn remove_image(&self, image: &ImageSpec) -> Result<()> {
        let images = self.inner_images()?;
        let c = Call::new("remove_image");
        self.interceptor
            .intercept(c, images.remove_image(image))
            .await
    }
    async fn image_fs_info(&self) -> Result<ImageFsInfo> {
        let images = self.inner_images()?;
        let c = Call::new("image_fs_info");
        self.interceptor.intercept(c, images.image_fs_info()).await
    }
}

/// Per-call deadlines (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Deadlines {
    /// Deadline of every call (the kubelet's `runtimeRequestTimeout`, 2 min), plus the call's
    /// allowance (grace period, exec timeout).
    pub request_timeout: Duration,
    /// Deadline of image pulls; `None` (the default, as the kubelet) for none.
    pub image_pull_timeout: Option<Duration>,
}

impl Default for Deadlines {
    fn default() -> Self {
        Self::new(Duration::from_secs(120))
    }
}

impl Deadlines {
    /// Deadlines of `request_timeout`, image pulls unbounded.
    pub fn new(request_timeout: Duration) -> Self {
        Self {
            request_timeout,
            image_pull_timeout: None,
        }
    }

    /// Sets [`image_pull_timeout`](Self::image_pull_timeout).
    pub fn image_pull_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.image_pull_timeout = timeout;
        self
    }

    fn deadline(&self, call: Call) -> Option<Duration> {
        if call.image_pull {
            self.image_pull_timeout
        } else {
            Some(self.request_timeout.saturating_add(call.allowance))
        }
    }
}

impl Interceptor for Deadlines {
    fn intercept<'a, T: Send + 'a>(
        &'a self,
        call: Call,
        fut: BoxFuture<'a, Result<T>>,
    ) -> BoxFuture<'a, Result<T>> {
        let Some(limit) = self.deadline(call) else {
            return fut;
        };
        Box::pin(async move {
            match tokio::time::timeout(limit, fut).await {
                Ok(r) => r,
                Err(_) => Err(Error::new(
                    ErrorKind::DeadlineExceeded,
                    format!(
                        "runtime operation {} exceeded its deadline of {}",
                        call.operation,
                        crate::duration::format_go(limit)
                    ),
                )),
            }
        })
    }
}

impl RuntimeLayer for Deadlines {
    fn layer(&self, inner: Arc<dyn ContainerRuntime>) -> Arc<dyn ContainerRuntime> {
        Arc::new(Intercepted::new(inner, *self))
    }
}

/// Label set of the runtime operation families.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    operation_type: &'static str,
}

fn operation_histogram() -> Histogram {
    // The kubelet's buckets: 5 ms × 2.5^n, 14 buckets (up to ~745 s).
    Histogram::new(exponential_buckets(0.005, 2.5, 14))
}

/// The kubelet's runtime operation metrics (see the [module docs](self)). Clones share their
/// values; [`observe`](Self::observe) is public so that a runtime instrumenting its own wire
/// calls (the CRI runtime) records into the same families.
#[derive(Debug, Clone)]
pub struct OperationMetrics {
    total: Family<OperationLabels, Counter>,
    errors: Family<OperationLabels, Counter>,
    duration: Family<OperationLabels, Histogram, fn() -> Histogram>,
}

impl Default for OperationMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl OperationMetrics {
    /// Empty families.
    pub fn new() -> Self {
        Self {
            total: Family::default(),
            errors: Family::default(),
            duration: Family::new_with_constructor(operation_histogram as fn() -> Histogram),
        }
    }

    /// Register the three families in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        // prometheus-client appends `_total` to counters.
        registry.register(
            "kubelet_runtime_operations",
            "Cumulative number of runtime operations by operation type.",
            self.total.clone(),
        );
        registry.register(
            "kubelet_runtime_operations_errors",
            "Cumulative number of runtime operation errors by operation type.",
            self.errors.clone(),
        );
        registry.register_with_unit(
            "kubelet_runtime_operations_duration",
            "Duration in seconds of runtime operations. Broken down by operation type.",
            Unit::Seconds,
            self.duration.clone(),
        );
    }

    /// Record one call of `operation_type` that took `seconds`.
    pub fn observe(&self, operation_type: &'static str, seconds: f64, failed: bool) {
        let labels = OperationLabels { operation_type };
        self.total.get_or_create(&labels).inc();
        self.duration.get_or_create(&labels).observe(seconds);
        if failed {
            self.errors.get_or_create(&labels).inc();
        }
    }
}

impl Interceptor for OperationMetrics {
    fn intercept<'a, T: Send + 'a>(
        &'a self,
        call: Call,
        fut: BoxFuture<'a, Result<T>>,
    ) -> BoxFuture<'a, Result<T>> {
        Box::pin(async move {
            let started = std::time::Instant::now();
            let result = fut.await;
            self.observe(
                call.operation,
                started.elapsed().as_secs_f64(),
                result.is_err(),
            );
            result
        })
    }

    fn register_metrics(&self, registry: &mut Registry) {
        self.register(registry);
    }
}

impl RuntimeLayer for OperationMetrics {
    fn layer(&self, inner: Arc<dyn ContainerRuntime>) -> Arc<dyn ContainerRuntime> {
        Arc::new(Intercepted::new(inner, self.clone()))
    }
}

/// The pod-start stages [`StageLimits`] bounds.
pub const START_STAGES: [&str; 3] = ["run_podsandbox", "create_container", "start_container"];

/// Bounds how many calls of each pod-start stage ([`START_STAGES`]: `RunPodSandbox`,
/// `CreateContainer`, `StartContainer`) run at once; other calls are not limited. A burst of
/// pods then reaches the runtime a few at a time per stage instead of all at once.
#[derive(Debug, Clone)]
pub struct StageLimits {
    slots: Arc<[(&'static str, Arc<tokio::sync::Semaphore>)]>,
}

impl StageLimits {
    /// The bound for a CRI runtime when nothing else is asked (the agent facade's default):
    /// two calls of each start stage per CPU of this machine. Containerd's CRI service does the
    /// work of a sandbox or container creation on the node's CPUs (runc, the network
    /// namespace, its metadata store); a burst of 250 pods issued all at once took 1.4–1.6× as
    /// long as the same calls issued 4 at a time on 2 CPUs, bounded to 4 it took 1.03–1.11×
    /// (docs/performance.md).
    pub fn cri_default_max() -> usize {
        std::thread::available_parallelism().map_or(1, |n| n.get()) * 2
    }

    /// At most `max` (at least 1) concurrent calls of each start stage.
    pub fn new(max: usize) -> Self {
        Self {
            slots: START_STAGES
                .iter()
                .map(|op| (*op, Arc::new(tokio::sync::Semaphore::new(max.max(1)))))
                .collect(),
        }
    }
}

impl Interceptor for StageLimits {
    fn intercept<'a, T: Send + 'a>(
        &'a self,
        call: Call,
        fut: BoxFuture<'a, Result<T>>,
    ) -> BoxFuture<'a, Result<T>> {
        match self.slots.iter().find(|(op, _)| *op == call.operation) {
            Some((_, slots)) => Box::pin(async move {
                // The semaphore is never closed; a failed acquire would only mean no limit.
                let _slot = slots.acquire().await.ok();
                fut.await
            }),
            None => fut,
        }
    }
}

impl RuntimeLayer for StageLimits {
    fn layer(&self, inner: Arc<dyn ContainerRuntime>) -> Arc<dyn ContainerRuntime> {
        Arc::new(Intercepted::new(inner, self.clone()))
    }
}

#[cfg(test)]
mod stage_limit_tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Six concurrent `op` calls of 10 ms each through `limits`: how many ran at once.
    async fn most_at_once(limits: &StageLimits, op: &'static str) -> usize {
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let tasks: Vec<_> = (0..6)
            .map(|_| {
                let (now, most, limits) = (now.clone(), most.clone(), limits.clone());
                tokio::spawn(async move {
                    let work: BoxFuture<'static, Result<()>> = Box::pin(async move {
                        let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(n, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        now.fetch_sub(1, Ordering::SeqCst);
                        Ok(())
                    });
                    limits.intercept(Call::new(op), work).await
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("join").expect("call");
        }
        most.load(Ordering::SeqCst)
    }

    /// Records the order interceptors run in.
    #[derive(Clone)]
    struct Mark(&'static str, Arc<parking_lot::Mutex<Vec<&'static str>>>);

    impl Interceptor for Mark {
        fn intercept<'a, T: Send + 'a>(
            &'a self,
            _call: Call,
            fut: BoxFuture<'a, Result<T>>,
        ) -> BoxFuture<'a, Result<T>> {
            Box::pin(async move {
                self.1.lock().push(self.0);
                let r = fut.await;
                self.1.lock().push(self.0);
                r
            })
        }
    }

    #[tokio::test]
    async fn a_pair_runs_its_first_interceptor_around_the_second_and_none_passes_through() {
        let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let pair = (
            Mark("outer", seen.clone()),
            (None::<Mark>, Mark("inner", seen.clone())),
        );
        let call: BoxFuture<'static, Result<u8>> = Box::pin(async { Ok(7) });
        assert_eq!(
            pair.intercept(Call::new("version"), call).await.ok(),
            Some(7)
        );
        assert_eq!(*seen.lock(), ["outer", "inner", "inner", "outer"]);
    }

    #[tokio::test(start_paused = true)]
    async fn start_stages_run_at_most_the_limit_at_once_and_other_calls_are_free() {
        let limits = StageLimits::new(2);
        for op in START_STAGES {
            assert_eq!(most_at_once(&limits, op).await, 2, "{op}");
        }
        assert_eq!(
            most_at_once(&limits, "list_containers").await,
            6,
            "not a start stage: unbounded"
        );
    }
}

#[cfg(all(test, feature = "testing"))]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::testing::{FakeOp, FakeRuntime};

    #[test]
    fn layers_pass_on_whether_the_runtime_has_images() {
        let layered = |fake: FakeRuntime| {
            let inner: Arc<dyn ContainerRuntime> = Arc::new(fake);
            OperationMetrics::new().layer(Deadlines::new(Duration::from_secs(1)).layer(inner))
        };
        let without = FakeRuntime::new();
        without.set_pulls_images(false);
        assert!(layered(without).images().is_none());
        assert!(layered(FakeRuntime::new()).images().is_some());
    }

    #[tokio::test]
    async fn image_calls_through_a_layer_are_counted() {
        let fake: Arc<dyn ContainerRuntime> = Arc::new(FakeRuntime::new());
        let metrics = OperationMetrics::new();
        let runtime = metrics.layer(fake);
        let mut registry = Registry::default();
        runtime.register_metrics(&mut registry);
        let images = runtime.images().unwrap();
        images.list_images().await.unwrap();
        images
            .remove_image(&ImageSpec::new("absent"))
            .await
            .unwrap();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "kubelet_runtime_operations_total{operation_type=\"list_images\"} 1",
            "kubelet_runtime_operations_total{operation_type=\"remove_image\"} 1",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }

    #[tokio::test]
    async fn operation_metrics_count_calls_and_errors_by_kubelet_operation_type() {
        let fake: Arc<dyn ContainerRuntime> = Arc::new(FakeRuntime::new());
        let metrics = OperationMetrics::new();
        let runtime = metrics.layer(fake);
        let mut registry = Registry::default();
        runtime.register_metrics(&mut registry);
        runtime.version().await.unwrap();
        runtime
            .list_containers(&ContainerFilter::default())
            .await
            .unwrap();
        assert!(runtime.container_status("missing").await.is_err());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "kubelet_runtime_operations_total{operation_type=\"version\"} 1",
            "kubelet_runtime_operations_total{operation_type=\"list_containers\"} 1",
            "kubelet_runtime_operations_errors_total{operation_type=\"container_status\"} 1",
            "kubelet_runtime_operations_duration_seconds_count{operation_type=\"container_status\"} 1",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }

    /// A runtime whose listing never answers, whose stops take 11 s and whose pulls an hour.
    fn slow() -> Arc<dyn ContainerRuntime> {
        let fake = FakeRuntime::new();
        fake.set_op_delay(FakeOp::ListContainers, Duration::from_secs(86_400));
        fake.set_op_delay(FakeOp::StopContainer, Duration::from_secs(11));
        fake.set_op_delay(FakeOp::PullImage, Duration::from_secs(3600));
        Arc::new(fake)
    }

    #[tokio::test(start_paused = true)]
    async fn deadlines_bound_every_call_and_allow_the_grace_period_of_stops() {
        let runtime = Deadlines::new(Duration::from_secs(2)).layer(slow());
        let err = runtime
            .list_containers(&ContainerFilter::default())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::DeadlineExceeded);
        assert!(err.message().contains("list_containers"), "{err}");
        // A stop taking 11 s with a 10 s grace is inside request timeout + grace.
        let stop = runtime
            .stop_container("missing", Duration::from_secs(10))
            .await;
        assert!(
            stop.as_ref()
                .err()
                .is_none_or(|e| e.kind() != ErrorKind::DeadlineExceeded),
            "{stop:?}"
        );
        // Image pulls are unbounded by default: still pending after an hour minus a second.
        let pull = tokio::time::timeout(
            Duration::from_secs(3599),
            runtime.images().unwrap().pull_image(
                &ImageSpec::default(),
                None,
                &PodSandboxConfig::default(),
            ),
        )
        .await;
        assert!(pull.is_err(), "the pull was cut short: {pull:?}");
        let bounded = Deadlines::new(Duration::from_secs(2))
            .image_pull_timeout(Some(Duration::from_secs(5)))
            .layer(slow());
        let err = bounded
            .images()
            .unwrap()
            .pull_image(&ImageSpec::default(), None, &PodSandboxConfig::default())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::DeadlineExceeded);
    }
}
