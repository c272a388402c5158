//! Shared by the real-runtime PLEG tests: a runtime wrapper that can break the event stream,
//! lose chosen events, and make one pod's calls hang; pod and container configs.

#![allow(dead_code, unreachable_pub)]

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use kubelet_core::runtime::{
    Container, ContainerConfig, ContainerEventStream, ContainerFilter, ContainerMetadata,
    ContainerStats, ContainerStatus, ExecResult, Image, ImageSpec, PodSandbox, PodSandboxConfig,
    PodSandboxMetadata, PodSandboxStatus, RuntimeStatus, RuntimeVersion, SandboxFilter, labels,
};
use kubelet_core::{ContainerRuntime, Error, Result};
use parking_lot::Mutex;
use tokio::sync::watch;

/// A runtime passing every call to `inner`, with faults switched on by the test.
pub struct Faulty {
    inner: Arc<dyn ContainerRuntime>,
    broken: watch::Sender<bool>,
    lose: Arc<Mutex<HashSet<String>>>,
    lost: Arc<AtomicU64>,
    slow_pod: Mutex<Option<String>>,
}

impl Faulty {
    pub fn new(inner: Arc<dyn ContainerRuntime>) -> Self {
        Self {
            inner,
            broken: watch::channel(false).0,
            lose: Arc::new(Mutex::new(HashSet::new())),
            lost: Arc::new(AtomicU64::new(0)),
            slow_pod: Mutex::new(None),
        }
    }

    /// Break the event stream: the current stream fails, and subscribing fails until
    /// `set_broken(false)`.
    pub fn set_broken(&self, broken: bool) {
        self.broken.send_replace(broken);
    }

    /// Drop every event about `container_id`.
    pub fn lose_events_of(&self, container_id: &str) {
        self.lose.lock().insert(container_id.to_string());
    }

    /// Events dropped so far.
    pub fn lost(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }

    /// Make every call about pod `uid` hang (for an hour); `None` lifts it.
    pub fn set_slow_pod(&self, uid: Option<&str>) {
        *self.slow_pod.lock() = uid.map(str::to_string);
    }

    async fn maybe_hang(&self, selector: &BTreeMap<String, String>) {
        let slow = self.slow_pod.lock().clone();
        if let Some(uid) = slow
            && selector.get(labels::POD_UID) == Some(&uid)
        {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
    }
}

#[async_trait]
impl ContainerRuntime for Faulty {
    async fn version(&self) -> Result<RuntimeVersion> {
        self.inner.version().await
    }
    async fn status(&self) -> Result<RuntimeStatus> {
        self.inner.status().await
    }
    async fn run_pod_sandbox(&self, config: &PodSandboxConfig) -> Result<String> {
        self.inner.run_pod_sandbox(config).await
    }
    async fn stop_pod_sandbox(&self, id: &str) -> Result<()> {
        self.inner.stop_pod_sandbox(id).await
    }
    async fn remove_pod_sandbox(&self, id: &str) -> Result<()> {
        self.inner.remove_pod_sandbox(id).await
    }
    async fn pod_sandbox_status(&self, id: &str) -> Result<PodSandboxStatus> {
        self.inner.pod_sandbox_status(id).await
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
    async fn start_container(&self, id: &str) -> Result<()> {
        self.inner.start_container(id).await
    }
    async fn stop_container(&self, id: &str, timeout: Duration) -> Result<()> {
        self.inner.stop_container(id, timeout).await
    }
    async fn remove_container(&self, id: &str) -> Result<()> {
        self.inner.remove_container(id).await
    }
    async fn list_containers(&self, filter: &ContainerFilter) -> Result<Vec<Container>> {
        self.maybe_hang(&filter.label_selector).await;
        self.inner.list_containers(filter).await
    }
    async fn container_status(&self, id: &str) -> Result<ContainerStatus> {
        self.inner.container_status(id).await
    }
    async fn exec_sync(&self, id: &str, cmd: &[String], timeout: Duration) -> Result<ExecResult> {
        self.inner.exec_sync(id, cmd, timeout).await
    }
    async fn image_status(&self, image: &ImageSpec) -> Result<Option<Image>> {
        self.inner.image_status(image).await
    }
    async fn pull_image(&self, image: &ImageSpec, sc: &PodSandboxConfig) -> Result<String> {
        self.inner.pull_image(image, sc).await
    }
    async fn container_stats(&self, id: &str) -> Result<ContainerStats> {
        self.inner.container_stats(id).await
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
            (inner, broken),
            move |(mut inner, mut broken)| {
                let (lose, lost) = (lose.clone(), lost.clone());
                async move {
                    loop {
                        tokio::select! {
                            changed = broken.changed() => {
                                if changed.is_err() || *broken.borrow() {
                                    let err = Error::unavailable("event stream killed by the test");
                                    // One error, then the stream is over for good.
                                    let done: ContainerEventStream = Box::pin(futures::stream::empty());
                                    let (_tx, rx) = watch::channel(true);
                                    return Some((Err(err), (done, rx)));
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
                                return Some((item, (inner, broken)));
                            }
                        }
                    }
                }
            },
        )))
    }
}

/// A sandbox config of pod `uid` (host network, logs under `root`).
pub fn sandbox_config(root: &Path, uid: &str) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: PodSandboxMetadata {
            name: format!("pod-{uid}"),
            namespace: "default".into(),
            uid: uid.into(),
            attempt: 0,
        },
        log_directory: root.join("logs").join(format!("default_pod-{uid}_{uid}")),
        labels: BTreeMap::from([
            (labels::POD_UID.to_string(), uid.to_string()),
            (labels::POD_NAME.to_string(), format!("pod-{uid}")),
            (labels::POD_NAMESPACE.to_string(), "default".to_string()),
        ]),
        host_network: true,
        ..Default::default()
    }
}

/// A container `name` of the pod running `sh -c script`.
pub fn shell_container(
    sandbox: &PodSandboxConfig,
    name: &str,
    image: &str,
    script: &str,
) -> ContainerConfig {
    let mut l = sandbox.labels.clone();
    l.insert(labels::CONTAINER_NAME.into(), name.into());
    ContainerConfig {
        metadata: ContainerMetadata {
            name: name.into(),
            attempt: 0,
        },
        image: image.into(),
        command: vec!["/bin/sh".into(), "-c".into()],
        args: vec![script.into()],
        labels: l,
        log_path: format!("{name}/0.log"),
        ..Default::default()
    }
}
