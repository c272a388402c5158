//! [`FaultyRuntime`]: a pass-through wrapper around any [`ContainerRuntime`] with faults the test
//! switches on and off.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::error::{Error, Result};
use kubelet_api::ContainerRuntime;
use kubelet_api::runtime::{
    Container, ContainerConfig, ContainerEventStream, ContainerFilter, ContainerStats,
    ContainerStatus, ExecResult, PodSandbox, PodSandboxConfig, PodSandboxStatus, RuntimeStatus,
    RuntimeVersion, SandboxFilter, labels,
};

/// A [`ContainerRuntime`] passing every call to an inner runtime (a real one: the process
/// runtime, CRI, or a [`FakeRuntime`](super::FakeRuntime)), with faults switched on by the test:
///
/// - [`set_broken`](Self::set_broken): the open event stream yields one error and ends, and
///   [`container_events`](ContainerRuntime::container_events) fails until the stream is unbroken;
/// - [`lose_events_of`](Self::lose_events_of): the events of one container (or sandbox) ID are
///   dropped, counted by [`lost`](Self::lost);
/// - [`set_slow_pod`](Self::set_slow_pod): `list_pod_sandboxes` and `list_containers` calls whose
///   label selector names that pod UID ([`labels::POD_UID`]) hang until the pod is no longer slow;
///   calls about other pods go through.
///
/// It does not depend on the inner runtime, so the same fault tests run against every runtime.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> kubelet_api::Result<()> {
/// use std::sync::Arc;
/// use kubelet_api::ContainerRuntime;
/// use kubelet_core::testing::{FakeRuntime, FaultyRuntime};
///
/// let faulty = FaultyRuntime::new(Arc::new(FakeRuntime::new()));
/// faulty.set_broken(true);
/// assert!(faulty.container_events().await.is_err());
/// faulty.set_broken(false);
/// assert!(faulty.version().await.is_ok());
/// # Ok(())
/// # }
/// ```
pub struct FaultyRuntime {
    inner: Arc<dyn ContainerRuntime>,
    broken: watch::Sender<bool>,
    lose: Arc<Mutex<HashSet<String>>>,
    lost: Arc<AtomicU64>,
    slow_pod: watch::Sender<Option<String>>,
}

impl fmt::Debug for FaultyRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyRuntime")
            .field("broken", &*self.broken.borrow())
            .field("losing", &self.lose.lock().len())
            .field("lost", &self.lost())
            .field("slow_pod", &*self.slow_pod.borrow())
            .finish_non_exhaustive()
    }
}

impl FaultyRuntime {
    /// A wrapper around `inner` with no fault switched on.
    pub fn new(inner: Arc<dyn ContainerRuntime>) -> Self {
        Self {
            inner,
            broken: watch::channel(false).0,
            lose: Arc::new(Mutex::new(HashSet::new())),
            lost: Arc::new(AtomicU64::new(0)),
            slow_pod: watch::channel(None).0,
        }
    }

    /// The wrapped runtime.
    pub fn inner(&self) -> &Arc<dyn ContainerRuntime> {
        &self.inner
    }

    /// Break the event stream (`true`): every open stream yields one `Unavailable` error and
    /// ends, and subscribing fails with `Unavailable` until `set_broken(false)`.
    pub fn set_broken(&self, broken: bool) {
        self.broken.send_replace(broken);
    }

    /// Drop every later event about `id` (a container or sandbox ID), on every stream.
    pub fn lose_events_of(&self, id: &str) {
        self.lose.lock().insert(id.to_string());
    }

    /// How many events were dropped so far.
    pub fn lost(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }

    /// Make the listing calls about pod `uid` hang (including those already waiting) until the
    /// pod is no longer slow; `None` lifts it and releases the waiting calls.
    pub fn set_slow_pod(&self, uid: Option<&str>) {
        self.slow_pod.send_replace(uid.map(str::to_string));
    }

    async fn maybe_hang(&self, selector: &BTreeMap<String, String>) {
        let Some(uid) = selector.get(labels::POD_UID) else {
            return;
        };
        let mut rx = self.slow_pod.subscribe();
        // The sender lives in `self`, so the wait only ends when the pod is no longer slow.
        let _ = rx.wait_for(|slow| slow.as_ref() != Some(uid)).await;
    }
}

#[async_trait]
impl ContainerRuntime for FaultyRuntime {
    fn images(&self) -> Option<&dyn kubelet_api::ImageService> {
        self.inner.images()
    }
    fn streaming(&self) -> Option<&dyn kubelet_api::StreamingRuntime> {
        self.inner.streaming()
    }
    async fn version(&self) -> Result<RuntimeVersion> {
        self.inner.version().await
    }
    async fn status(&self) -> Result<RuntimeStatus> {
        self.inner.status().await
    }
    async fn run_pod_sandbox(&self, config: &PodSandboxConfig) -> Result<String> {
        self.inner.run_pod_sandbox(config).await
    }
    async fn stop_pod_sandbox(&self, sandbox_id: &str) -> Result<()> {
        self.inner.stop_pod_sandbox(sandbox_id).await
    }
    async fn remove_pod_sandbox(&self, sandbox_id: &str) -> Result<()> {
        self.inner.remove_pod_sandbox(sandbox_id).await
    }
    async fn pod_sandbox_status(&self, sandbox_id: &str) -> Result<PodSandboxStatus> {
        self.inner.pod_sandbox_status(sandbox_id).await
    }
    async fn list_pod_sandboxes(&self, filter: &SandboxFilter) -> Result<Vec<PodSandbox>> {
        self.maybe_hang(&filter.label_selector).await;
        self.inner.list_pod_sandboxes(filter).await
    }
    async fn create_container(
        &self,
        sandbox_id: &str,
        config: &ContainerConfig,
        sandbox_config: &PodSandboxConfig,
    ) -> Result<String> {
        self.inner
            .create_container(sandbox_id, config, sandbox_config)
            .await
    }
    async fn start_container(&self, container_id: &str) -> Result<()> {
        self.inner.start_container(container_id).await
    }
    async fn stop_container(&self, container_id: &str, timeout: Duration) -> Result<()> {
        self.inner.stop_container(container_id, timeout).await
    }
    async fn remove_container(&self, container_id: &str) -> Result<()> {
        self.inner.remove_container(container_id).await
    }
    async fn list_containers(&self, filter: &ContainerFilter) -> Result<Vec<Container>> {
        self.maybe_hang(&filter.label_selector).await;
        self.inner.list_containers(filter).await
    }
    async fn container_status(&self, container_id: &str) -> Result<ContainerStatus> {
        self.inner.container_status(container_id).await
    }
    async fn exec_sync(
        &self,
        container_id: &str,
        cmd: &[String],
        timeout: Duration,
    ) -> Result<ExecResult> {
        self.inner.exec_sync(container_id, cmd, timeout).await
    }
    async fn container_stats(&self, container_id: &str) -> Result<ContainerStats> {
        self.inner.container_stats(container_id).await
    }
    async fn list_container_stats(&self) -> Result<Vec<ContainerStats>> {
        self.inner.list_container_stats().await
    }
    async fn list_pod_sandbox_stats(&self) -> Result<Vec<kubelet_api::runtime::PodSandboxStats>> {
        self.inner.list_pod_sandbox_stats().await
    }
    async fn reopen_container_log(&self, container_id: &str) -> Result<()> {
        self.inner.reopen_container_log(container_id).await
    }
    async fn update_container_resources(
        &self,
        container_id: &str,
        resources: &kubelet_api::runtime::LinuxResources,
    ) -> Result<()> {
        self.inner
            .update_container_resources(container_id, resources)
            .await
    }
    async fn container_events(&self) -> Result<ContainerEventStream> {
        if *self.broken.borrow() {
            return Err(Error::unavailable("event stream broken by the test"));
        }
        let inner = self.inner.container_events().await?;
        let broken = self.broken.subscribe();
        let lose = self.lose.clone();
        let lost = self.lost.clone();
        Ok(Box::pin(futures::stream::unfold(
            Some((inner, broken)),
            move |state| {
                let (lose, lost) = (lose.clone(), lost.clone());
                async move {
                    let (mut inner, mut broken) = state?;
                    loop {
                        tokio::select! {
                            changed = broken.changed() => {
                                if changed.is_err() || *broken.borrow() {
                                    // One error, then the stream is over for good.
                                    let err = Error::unavailable("event stream killed by the test");
                                    return Some((Err(err), None));
                                }
                            }
                            item = inner.next() => {
                                let item = item?;
                                if let Ok(ev) = &item
                                    && lose.lock().contains(&ev.container_id)
                                {
                                    lost.fetch_add(1, Ordering::Relaxed);
                                    continue;
                                }
                                return Some((item, Some((inner, broken))));
                            }
                        }
                    }
                }
            },
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use crate::testing::FakeRuntime;

    fn by_uid(uid: &str) -> ContainerFilter {
        ContainerFilter {
            label_selector: BTreeMap::from([(labels::POD_UID.to_string(), uid.to_string())]),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_slow_pods_listings_hang_until_lifted_and_other_pods_go_through() {
        let faulty = Arc::new(FaultyRuntime::new(Arc::new(FakeRuntime::new())));
        faulty.set_slow_pod(Some("slow"));
        let hung = tokio::spawn({
            let faulty = faulty.clone();
            async move { faulty.list_containers(&by_uid("slow")).await }
        });
        let other = tokio::time::timeout(
            Duration::from_secs(5),
            faulty.list_containers(&by_uid("fast")),
        )
        .await;
        assert!(matches!(other, Ok(Ok(ref v)) if v.is_empty()));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!hung.is_finished(), "the slow pod's listing hangs");
        faulty.set_slow_pod(None);
        let released = tokio::time::timeout(Duration::from_secs(5), hung).await;
        assert!(matches!(released, Ok(Ok(Ok(_)))), "released when lifted");
    }

    #[tokio::test]
    async fn subscribing_fails_while_broken_and_reaches_the_inner_runtime_otherwise() {
        let faulty = FaultyRuntime::new(Arc::new(FakeRuntime::new()));
        faulty.set_broken(true);
        let err = faulty.container_events().await.err().map(|e| e.kind());
        assert_eq!(err, Some(ErrorKind::Unavailable));
        faulty.set_broken(false);
        // The fake runtime has no event stream: its answer comes through unchanged.
        let err = faulty.container_events().await.err().map(|e| e.kind());
        assert_eq!(err, Some(ErrorKind::Unimplemented));
    }
}
