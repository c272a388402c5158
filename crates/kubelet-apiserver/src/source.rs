//! [`ApiPodSource`]: the pods bound to this node in the API server (the kubelet's `apiserver.go`
//! source, named `api`).
//!
//! A kube-runtime watcher lists and watches pods with `spec.nodeName=<node>` in every namespace:
//! it resumes from the last resourceVersion, relists on `410 Gone`, asks for bookmarks, and
//! retries with backoff while the API server is unreachable. Each list and each change delivers
//! the full set of pods (a snapshot) to the agent's merge. Errors never produce a snapshot, so
//! the pods keep running while the API server is away; the relist after it returns resyncs the
//! agent (pods deleted meanwhile are stopped, new ones started). Mirror pods are handed to the
//! mirror-pod manager and hidden from the agent, as the kubelet's pod manager does: deleting a
//! mirror pod never stops its static pod.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kubelet_api::pod as podutil;
use kubelet_api::sources;
use kubelet_api::{PodSource, SourceSender};
use tokio_util::sync::CancellationToken;

use std::time::Duration;

use kubelet_api::{EventRecorder, InvolvedObject};

use crate::agent::Shared;
use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::wire::Decoded;

/// The API server as a pod source (`api`).
#[derive(Clone)]
pub struct ApiPodSource {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for ApiPodSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiPodSource")
            .field("node_name", &self.shared.node_name)
            .finish_non_exhaustive()
    }
}

/// The pods the watcher has listed, and the list being rebuilt during a relist.
#[derive(Debug, Default)]
pub(crate) struct WatchState {
    pods: BTreeMap<String, Pod>,
    relist: Option<BTreeMap<String, Pod>>,
    listed: bool,
}

impl WatchState {
    /// Apply one watcher event; true when the set of pods changed (and it has been listed).
    pub(crate) fn apply(&mut self, ev: Event<Pod>) -> bool {
        match ev {
            Event::Init => {
                self.relist = Some(BTreeMap::new());
                false
            }
            Event::InitApply(p) => {
                if let Some(r) = self.relist.as_mut() {
                    r.insert(podutil::uid(&p).to_string(), p);
                }
                false
            }
            Event::InitDone => {
                if let Some(r) = self.relist.take() {
                    self.pods = r;
                }
                self.listed = true;
                true
            }
            Event::Apply(p) => {
                self.pods.insert(podutil::uid(&p).to_string(), p);
                self.listed
            }
            Event::Delete(p) => {
                self.pods.remove(podutil::uid(&p));
                self.listed
            }
        }
    }

    /// The agent's pods (mirror pods excluded) and the mirror pods.
    pub(crate) fn split(&self) -> (Vec<Pod>, Vec<&Pod>) {
        let (mirrors, pods): (Vec<&Pod>, Vec<&Pod>) =
            self.pods.values().partition(|p| podutil::is_mirror(p));
        (pods.into_iter().cloned().collect(), mirrors)
    }
}

#[async_trait]
impl PodSource for ApiPodSource {
    fn name(&self) -> &str {
        sources::API
    }

    async fn run(&self, out: SourceSender, shutdown: CancellationToken) {
        let node = &self.shared.node_name;
        let api: Api<Decoded<Pod>> = Api::all(self.shared.client.clone());
        let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        let stream = watcher::watcher(api, config).default_backoff();
        futures::pin_mut!(stream);
        let mut state = WatchState::default();
        let mut failing = false;
        let checkpoint = self.shared.checkpoint.clone();
        // With a checkpoint, the first list has this long before the checkpoint is served.
        let mut offline_at = checkpoint
            .as_ref()
            .map(|c| tokio::time::Instant::now() + c.config().offline_start_wait);
        let mut from_checkpoint = false;
        loop {
            let next = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = sleep_until(offline_at) => {
                    offline_at = None;
                    if let Some(c) = &checkpoint
                        && !state.listed
                    {
                        match self.serve_checkpoint(c, &out).await {
                            Ok(served) => from_checkpoint = served,
                            Err(_) => return,
                        }
                    }
                    continue;
                }
                next = stream.next() => next,
            };
            let Some(first) = next else {
                tracing::warn!(node = %node, "pod watch ended");
                return;
            };
            let mut changed = false;
            let mut handle = |item: Result<Event<Decoded<Pod>>, watcher::Error>,
                              failing: &mut bool| {
                match item {
                    Ok(ev) => {
                        let ev = crate::wire::event(ev);
                        if *failing {
                            tracing::info!(node = %node, "pod watch recovered");
                            *failing = false;
                        }
                        changed |= state.apply(ev);
                    }
                    Err(e) => {
                        if *failing {
                            tracing::debug!(node = %node, "pod watch still failing: {}", kubelet_api::chain(&e));
                        } else {
                            tracing::warn!(node = %node, "pod watch failed, retrying with backoff (pods keep running): {}", kubelet_api::chain(&e));
                            *failing = true;
                        }
                    }
                }
            };
            handle(first, &mut failing);
            // Take every event that is ready now, then deliver one snapshot.
            while let Some(Some(item)) = stream.next().now_or_never() {
                handle(item, &mut failing);
            }
            if state.listed {
                offline_at = None;
            }
            if changed {
                let (pods, mirrors) = state.split();
                self.shared.mirrors.set_api_mirrors(&mirrors);
                tracing::debug!(node = %node, pods = pods.len(), mirrors = mirrors.len(), "api pods changed");
                if from_checkpoint {
                    from_checkpoint = false;
                    tracing::info!(node = %node, pods = pods.len(), "the API server is back: its pods replace the checkpoint's (pods with the same UID keep their containers)");
                }
                let keep = checkpoint.as_ref().map(|_| pods.clone());
                if out.snapshot(pods).await.is_err() {
                    return;
                }
                if let (Some(c), Some(pods)) = (&checkpoint, keep) {
                    save(c, pods, out.recorder(), node).await;
                }
            } else if !failing
                && state.listed
                && let Some(c) = &checkpoint
            {
                let c = Arc::clone(c);
                if let Ok(Err(e)) = tokio::task::spawn_blocking(move || c.confirm()).await {
                    tracing::warn!(node = %node, "pod checkpoint: {e}");
                }
            }
        }
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Write the API server's pods to the checkpoint; failures are logged and recorded on the Node
/// (`FailedToCheckpointPods`), the previous checkpoint stays valid.
async fn save(checkpoint: &Arc<Checkpoint>, pods: Vec<Pod>, recorder: &EventRecorder, node: &str) {
    let c = Arc::clone(checkpoint);
    let errors = match tokio::task::spawn_blocking(move || c.save_pods(&pods)).await {
        Ok(errors) => errors,
        Err(e) => {
            tracing::warn!(node = %node, "pod checkpoint task failed: {e}");
            return;
        }
    };
    if let Some(first) = errors.first() {
        tracing::warn!(node = %node, failures = errors.len(), "pod checkpoint not fully written: {first}");
        recorder.warning(
            InvolvedObject::node(node),
            FAILED_TO_CHECKPOINT,
            format!(
                "pod checkpoint not fully written ({} failures): {first}",
                errors.len()
            ),
        );
    }
}

/// Event reason: the checkpoint could not be written.
pub const FAILED_TO_CHECKPOINT: &str = "FailedToCheckpointPods";
/// Event reason: the agent runs the checkpointed pods (the API server was unreachable at start).
pub const STARTED_FROM_CHECKPOINT: &str = "StartedFromCheckpoint";
/// Event reason: the checkpoint could not be used.
pub const INVALID_CHECKPOINT: &str = "InvalidCheckpoint";
/// Event reason: a checkpointed pod is older than the maximum age and is not started.
pub const CHECKPOINT_EXPIRED: &str = "CheckpointExpired";

impl ApiPodSource {
    /// The API server's first list did not come in time: deliver the checkpointed pods.
    /// `Ok(true)` when pods were served from it, `Ok(false)` when the checkpoint could not be
    /// used (reported; the source then waits for the API server as without one), `Err` when
    /// the agent is gone.
    async fn serve_checkpoint(
        &self,
        checkpoint: &Arc<Checkpoint>,
        out: &SourceSender,
    ) -> Result<bool, kubelet_api::SourceClosed> {
        let node = &self.shared.node_name;
        let c = Arc::clone(checkpoint);
        let loaded = match tokio::task::spawn_blocking(move || c.load_pods()).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(node = %node, "pod checkpoint task failed: {e}");
                return Ok(false);
            }
        };
        let wait = kubelet_core::duration::format_go(checkpoint.config().offline_start_wait);
        let loaded = match loaded {
            Ok(l) => l,
            Err(CheckpointError::Missing { .. }) => {
                tracing::info!(node = %node, "the API server has not answered within {wait} and there is no pod checkpoint: waiting for it");
                return Ok(false);
            }
            Err(e) => {
                tracing::error!(node = %node, "the API server has not answered within {wait}; the pod checkpoint cannot be used, waiting for the API server: {e}");
                out.recorder().warning(
                    InvolvedObject::node(node),
                    INVALID_CHECKPOINT,
                    format!("pod checkpoint not used: {e}"),
                );
                return Ok(false);
            }
        };
        let now = jiff::Timestamp::now();
        let max_age = checkpoint.config().max_age;
        let mut pods = Vec::new();
        for (pod, saved) in &loaded.pods {
            let age = loaded.age(*saved, now);
            if max_age.is_some_and(|max| age > max) {
                let msg = format!(
                    "not started from the pod checkpoint: the API server last confirmed it {} ago, more than the maximum age {}",
                    kubelet_core::duration::format_go(Duration::from_secs(age.as_secs())),
                    kubelet_core::duration::format_go(max_age.unwrap_or_default()),
                );
                tracing::warn!(node = %node, pod = %podutil::full_name(pod), "{msg}");
                out.recorder()
                    .warning(InvolvedObject::pod(pod), CHECKPOINT_EXPIRED, msg);
                continue;
            }
            pods.push(pod.clone());
        }
        let msg = format!(
            "the API server has not answered within {wait}: running {} pods from the pod checkpoint, which the API server last confirmed at {}",
            pods.len(),
            loaded.confirmed_at
        );
        tracing::warn!(node = %node, "{msg}");
        out.recorder()
            .warning(InvolvedObject::node(node), STARTED_FROM_CHECKPOINT, msg);
        out.snapshot(pods).await?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, mirror: bool) -> Pod {
        let mut p = Pod::default();
        p.metadata.uid = Some(uid.into());
        p.metadata.name = Some(uid.into());
        if mirror {
            p.metadata.annotations = Some(BTreeMap::from([(
                kubelet_api::annotations::CONFIG_MIRROR.to_string(),
                "h".to_string(),
            )]));
        }
        p
    }

    #[test]
    fn nothing_is_delivered_before_the_first_list_and_a_relist_replaces_the_set() {
        let mut s = WatchState::default();
        assert!(!s.apply(Event::Init));
        assert!(!s.apply(Event::InitApply(pod("a", false))));
        assert!(!s.apply(Event::InitApply(pod("m", true))));
        assert!(s.apply(Event::InitDone));
        let (pods, mirrors) = s.split();
        assert_eq!(pods.len(), 1, "mirror pods are hidden from the agent");
        assert_eq!(mirrors.len(), 1);
        assert!(s.apply(Event::Apply(pod("b", false))));
        // A relist (after 410 Gone or a reconnect) keeps the old set until it is complete...
        assert!(!s.apply(Event::Init));
        assert!(!s.apply(Event::InitApply(pod("b", false))));
        assert_eq!(s.split().0.len(), 2);
        // ...then replaces it: "a" was deleted while the watch was down.
        assert!(s.apply(Event::InitDone));
        let names: Vec<_> = s
            .split()
            .0
            .iter()
            .map(|p| podutil::uid(p).to_string())
            .collect();
        assert_eq!(names, ["b"]);
        assert!(s.apply(Event::Delete(pod("b", false))));
        assert!(s.split().0.is_empty());
    }
}
