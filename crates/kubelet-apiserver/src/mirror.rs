//! Mirror pods: the API objects that show the agent's static pods (from files or a manifest URL)
//! in the cluster (the kubelet's `mirror_client.go` and the status manager's UID translation).
//!
//! The status sink records every static pod and its latest status here; the pod source records
//! the mirror pods it sees in the API (and hides them from the agent, so deleting a mirror pod
//! never stops its static pod). The mirror pod loop of the API-server plugin (`crate::ApiServer`) then creates missing mirror pods (with
//! `kubernetes.io/config.mirror` = the static pod's hash and the Node as controller owner),
//! replaces stale or deleted ones, deletes those whose static pod is gone, and patches each
//! mirror pod's status with its static pod's status.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{DeleteParams, PostParams, Preconditions};
use kubelet_api::annotations;
use kubelet_api::pod as podutil;
use parking_lot::{Mutex, RwLock};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::{ApiServerError, is_status};
use crate::lease::node_owner;
use crate::patch::write_pod_status;
use crate::wire::Decoded;

/// How long a mirror pod without a static pod must stay orphaned before it is deleted (the
/// agent's sources deliver their static pods first; the kubelet waits for all sources instead).
pub const ORPHAN_GRACE: Duration = Duration::from_secs(30);
/// How often mirror pods are reconciled even without a change.
pub const RESYNC_PERIOD: Duration = Duration::from_secs(10);

/// A mirror pod as the API last showed it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ApiMirror {
    uid: String,
    hash: String,
    deleting: bool,
    status: Option<PodStatus>,
}

#[derive(Debug, Clone)]
struct StaticPod {
    pod: Pod,
    status: Option<PodStatus>,
}

#[derive(Debug, Default)]
struct State {
    /// Mirror pods in the API by `namespace/name`; `None` until the pod source has listed.
    api: Option<HashMap<String, ApiMirror>>,
    /// Static pods the agent runs, by `namespace/name`.
    statics: HashMap<String, StaticPod>,
    /// Static pods that left the agent: their mirror pods go at once.
    removed: HashSet<String>,
    /// Since when a mirror pod has had no static pod.
    orphaned: HashMap<String, Instant>,
    /// Status last written to each mirror pod UID.
    written: HashMap<String, PodStatus>,
}

/// Shared mirror-pod state of one node (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct MirrorPods {
    state: Mutex<State>,
    changed: Notify,
}

fn key(pod: &Pod) -> String {
    format!("{}/{}", podutil::namespace(pod), podutil::name(pod))
}

fn annotation<'a>(pod: &'a Pod, name: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(name))
        .map(String::as_str)
}

/// The static pod's hash (`kubernetes.io/config.hash`, else its UID).
pub fn static_pod_hash(pod: &Pod) -> String {
    annotation(pod, annotations::CONFIG_HASH)
        .unwrap_or_else(|| podutil::uid(pod))
        .to_string()
}

/// The mirror pod the kubelet creates for `static_pod`: a copy of its metadata and spec with
/// `kubernetes.io/config.mirror` = its hash and the Node as controller owner.
pub fn mirror_pod(static_pod: &Pod, node_name: &str, node_uid: &str) -> Pod {
    let mut ann: BTreeMap<String, String> =
        static_pod.metadata.annotations.clone().unwrap_or_default();
    ann.insert(
        annotations::CONFIG_MIRROR.to_string(),
        static_pod_hash(static_pod),
    );
    let mut owner = node_owner(node_name, node_uid);
    owner.controller = Some(true);
    Pod {
        metadata: ObjectMeta {
            name: static_pod.metadata.name.clone(),
            namespace: Some(podutil::namespace(static_pod).to_string()),
            labels: static_pod.metadata.labels.clone(),
            annotations: Some(ann),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: static_pod.spec.clone(),
        status: None,
    }
}

/// What to do about one static pod's mirror.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MirrorAction {
    /// Create it.
    Create,
    /// Delete the stale or deleting mirror with this UID, then create.
    Replace(String),
    /// Write the static pod's status to the mirror with this UID.
    WriteStatus(String),
    /// Nothing.
    Keep,
}

/// The decision for a static pod with `hash` given the API's mirror (`None` if absent).
pub(crate) fn decide(hash: &str, mirror: Option<&ApiMirror>, has_status: bool) -> MirrorAction {
    match mirror {
        None => MirrorAction::Create,
        Some(m) if m.deleting || m.hash != hash => MirrorAction::Replace(m.uid.clone()),
        Some(m) if has_status => MirrorAction::WriteStatus(m.uid.clone()),
        Some(_) => MirrorAction::Keep,
    }
}

impl MirrorPods {
    /// The pod source listed the API: these are its mirror pods now.
    pub(crate) fn set_api_mirrors(&self, pods: &[&Pod]) {
        let api: HashMap<String, ApiMirror> = pods
            .iter()
            .map(|p| {
                (
                    key(p),
                    ApiMirror {
                        uid: podutil::uid(p).to_string(),
                        hash: annotation(p, annotations::CONFIG_MIRROR)
                            .unwrap_or("")
                            .to_string(),
                        deleting: podutil::is_deleted(p),
                        status: p.status.clone(),
                    },
                )
            })
            .collect();
        let mut st = self.state.lock();
        if st.api.as_ref() != Some(&api) {
            st.api = Some(api);
            drop(st);
            self.changed.notify_one();
        }
    }

    /// The agent runs `pod` (static) with `status`.
    pub(crate) fn set_static(&self, pod: &Pod, status: Option<&PodStatus>) {
        let k = key(pod);
        let mut st = self.state.lock();
        st.removed.remove(&k);
        let status = status
            .cloned()
            .or_else(|| st.statics.get(&k).and_then(|s| s.status.clone()));
        st.statics.insert(
            k,
            StaticPod {
                pod: pod.clone(),
                status,
            },
        );
        drop(st);
        self.changed.notify_one();
    }

    /// The agent is done with static pod `pod`.
    pub(crate) fn remove_static(&self, pod: &Pod) {
        let k = key(pod);
        let mut st = self.state.lock();
        if st
            .statics
            .get(&k)
            .is_some_and(|s| podutil::uid(&s.pod) == podutil::uid(pod))
        {
            st.statics.remove(&k);
            st.removed.insert(k);
        }
        drop(st);
        self.changed.notify_one();
    }

    /// Wait for a change or the resync period.
    pub(crate) async fn wait(&self) {
        let _ = tokio::time::timeout(RESYNC_PERIOD, self.changed.notified()).await;
    }

    /// One reconcile round. Errors are logged; the next round retries.
    pub(crate) async fn reconcile(
        &self,
        client: &kube::Client,
        unknown: &RwLock<HashSet<String>>,
        node_name: &str,
        node_uid: Option<&str>,
    ) {
        let (statics, api, removed) = {
            let st = self.state.lock();
            let Some(api) = st.api.clone() else {
                return; // the API has not been listed yet
            };
            (st.statics.clone(), api, st.removed.clone())
        };
        for (k, s) in &statics {
            let hash = static_pod_hash(&s.pod);
            let res = match decide(&hash, api.get(k), s.status.is_some()) {
                MirrorAction::Keep => Ok(()),
                MirrorAction::WriteStatus(uid) => {
                    self.write_status(
                        client,
                        unknown,
                        s,
                        &uid,
                        api.get(k).and_then(|m| m.status.as_ref()),
                    )
                    .await
                }
                MirrorAction::Create => self.create(client, unknown, s, node_name, node_uid).await,
                MirrorAction::Replace(uid) => {
                    tracing::info!(pod = %k, "deleting a stale or deleted mirror pod to recreate it");
                    match delete_pod(client, &s.pod, &uid).await {
                        Ok(()) => self.create(client, unknown, s, node_name, node_uid).await,
                        Err(e) => Err(e),
                    }
                }
            };
            if let Err(e) = res {
                tracing::warn!(pod = %k, "mirror pod: {}", kubelet_api::chain(&e));
            }
        }
        let now = Instant::now();
        let mut orphans = Vec::new();
        {
            let mut st = self.state.lock();
            st.orphaned
                .retain(|k, _| api.contains_key(k) && !statics.contains_key(k));
            st.removed.retain(|k| api.contains_key(k));
            for (k, m) in &api {
                if statics.contains_key(k) || m.deleting {
                    continue;
                }
                let since = *st.orphaned.entry(k.clone()).or_insert(now);
                if removed.contains(k) || now.saturating_duration_since(since) >= ORPHAN_GRACE {
                    orphans.push((k.clone(), m.uid.clone()));
                }
            }
        }
        for (k, uid) in orphans {
            let Some((ns, name)) = k.split_once('/') else {
                continue;
            };
            let mut pod = Pod::default();
            pod.metadata.namespace = Some(ns.to_string());
            pod.metadata.name = Some(name.to_string());
            match delete_pod(client, &pod, &uid).await {
                Ok(()) => {
                    tracing::info!(pod = %k, "deleted the mirror pod of a static pod that is gone");
                    let mut st = self.state.lock();
                    st.removed.remove(&k);
                    st.orphaned.remove(&k);
                    st.written.remove(&uid);
                }
                Err(e) => {
                    tracing::warn!(pod = %k, "deleting orphaned mirror pod: {}", kubelet_api::chain(&e))
                }
            }
        }
    }

    async fn create(
        &self,
        client: &kube::Client,
        unknown: &RwLock<HashSet<String>>,
        s: &StaticPod,
        node_name: &str,
        node_uid: Option<&str>,
    ) -> Result<(), ApiServerError> {
        let Some(node_uid) = node_uid else {
            return Ok(()); // the Node is not registered yet; the next round creates it
        };
        let api: Api<Decoded<Pod>> = Api::namespaced(client.clone(), podutil::namespace(&s.pod));
        let mirror = Decoded(mirror_pod(&s.pod, node_name, node_uid));
        match api.create(&PostParams::default(), &mirror).await {
            Ok(Decoded(created)) => {
                tracing::info!(pod = %key(&s.pod), "created mirror pod");
                let uid = created.metadata.uid.clone().unwrap_or_default();
                if s.status.is_some() {
                    self.write_status(client, unknown, s, &uid, created.status.as_ref())
                        .await?;
                }
                Ok(())
            }
            // The watch will show it; the next round compares hashes.
            Err(e) if is_status(&e, 409) => Ok(()),
            Err(source) => Err(ApiServerError::CreateMirrorPod {
                pod: key(&s.pod),
                source,
            }),
        }
    }

    async fn write_status(
        &self,
        client: &kube::Client,
        unknown: &RwLock<HashSet<String>>,
        s: &StaticPod,
        mirror_uid: &str,
        api_status: Option<&PodStatus>,
    ) -> Result<(), ApiServerError> {
        let Some(status) = &s.status else {
            return Ok(());
        };
        if self.state.lock().written.get(mirror_uid) == Some(status) {
            return Ok(());
        }
        match write_pod_status(
            client,
            podutil::namespace(&s.pod),
            podutil::name(&s.pod),
            mirror_uid,
            api_status,
            status,
            unknown,
        )
        .await
        {
            Ok(_) => {
                self.state
                    .lock()
                    .written
                    .insert(mirror_uid.to_string(), status.clone());
                Ok(())
            }
            // Gone or replaced meanwhile: the next round sees the new mirror.
            Err(e) if is_status(&e, 404) || is_status(&e, 409) => Ok(()),
            Err(source) => Err(ApiServerError::PatchPodStatus {
                pod: key(&s.pod),
                source,
            }),
        }
    }
}

/// Delete `pod` (namespace and name) with grace 0 and a UID precondition; gone already is fine.
pub(crate) async fn delete_pod(
    client: &kube::Client,
    pod: &Pod,
    uid: &str,
) -> Result<(), ApiServerError> {
    let api: Api<Decoded<Pod>> = Api::namespaced(client.clone(), podutil::namespace(pod));
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(podutil::name(pod), &dp).await {
        Ok(_) => Ok(()),
        Err(e) if is_status(&e, 404) || is_status(&e, 409) => Ok(()),
        Err(source) => Err(ApiServerError::DeletePod {
            pod: key(pod),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn static_pod() -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("web-node-1".into());
        p.metadata.namespace = Some("default".into());
        p.metadata.uid = Some("hash-1".into());
        p.metadata.annotations = Some(BTreeMap::from([
            (annotations::CONFIG_HASH.to_string(), "hash-1".to_string()),
            (annotations::CONFIG_SOURCE.to_string(), "file".to_string()),
        ]));
        p.metadata.resource_version = Some("7".into());
        p
    }

    #[test]
    fn mirror_pod_copies_the_static_pod_with_the_mirror_annotation_and_node_owner() {
        let m = mirror_pod(&static_pod(), "node-1", "node-uid");
        let ann = m.metadata.annotations.as_ref().expect("annotations");
        assert_eq!(ann[annotations::CONFIG_MIRROR], "hash-1");
        assert_eq!(ann[annotations::CONFIG_SOURCE], "file");
        assert_eq!(m.metadata.uid, None);
        assert_eq!(m.metadata.resource_version, None);
        let o = &m.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (
                o.kind.as_str(),
                o.name.as_str(),
                o.uid.as_str(),
                o.controller
            ),
            ("Node", "node-1", "node-uid", Some(true))
        );
        assert!(podutil::is_mirror(&m));
    }

    #[test]
    fn mirror_decisions() {
        let ok = ApiMirror {
            uid: "m1".into(),
            hash: "h".into(),
            deleting: false,
            status: None,
        };
        assert_eq!(decide("h", None, false), MirrorAction::Create);
        assert_eq!(decide("h", Some(&ok), false), MirrorAction::Keep);
        assert_eq!(
            decide("h", Some(&ok), true),
            MirrorAction::WriteStatus("m1".into())
        );
        assert_eq!(
            decide("h2", Some(&ok), true),
            MirrorAction::Replace("m1".into())
        );
        let deleting = ApiMirror {
            deleting: true,
            ..ok
        };
        assert_eq!(
            decide("h", Some(&deleting), true),
            MirrorAction::Replace("m1".into())
        );
    }
}
