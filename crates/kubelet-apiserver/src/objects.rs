//! [`ApiObjects`]: the [`ObjectProvider`] backed by the API server, for `envFrom` / `valueFrom`
//! references and `configMap` / `secret` volumes.
//!
//! Strategy: the kubelet's TTL-based `Cache` manager (`configMapAndSecretChangeDetectionStrategy:
//! Cache`), not its default `Watch` (one watch per referenced object). Each object is fetched
//! with a GET and kept for [`ApiObjects::with_ttl`] (default 1 minute, the kubelet's default when
//! the Node carries no `node.alpha.kubernetes.io/ttl` annotation). When a pod is new or changed
//! (a new UID or `resourceVersion` at [`register_pod`](ObjectProvider::register_pod)), the
//! cached copies of the objects it references are dropped, so a pod always starts with fresh
//! objects, as the kubelet's `RegisterPod` does. Objects no registered pod references any more
//! are dropped from the cache. Volumes pick up changes on the pod's next sync after the TTL
//! expired (at most `syncFrequency` × 1.5 + TTL).
//!
//! Only GETs are made, which is what the Node authorizer grants a node for the ConfigMaps and
//! Secrets referenced by pods bound to it; anything else comes back as `PermissionDenied` with
//! the server's message. Not-found answers are cached like objects (a missing object referenced
//! by a retrying pod costs one GET per TTL).

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::{Api, Client};
use kubelet_core::objects::{ObjectProvider, ReferencedObjects};
use kubelet_core::{Error, ErrorKind};
use parking_lot::Mutex;
use tokio::time::Instant;

/// Default time a fetched object is served from the cache.
pub const DEFAULT_OBJECT_TTL: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    ConfigMap,
    Secret,
}

type Key = (Kind, String, String);

#[derive(Debug, Clone)]
enum Cached {
    ConfigMap(Option<ConfigMap>),
    Secret(Option<Secret>),
}

#[derive(Default)]
struct State {
    entries: HashMap<Key, (Cached, Instant)>,
    /// Registered pods: UID → (resourceVersion, namespace, referenced objects).
    pods: HashMap<String, (Option<String>, String, ReferencedObjects)>,
    /// How many registered pods reference each object.
    refs: HashMap<Key, usize>,
}

fn keys<'a>(namespace: &'a str, r: &'a ReferencedObjects) -> impl Iterator<Item = Key> + 'a {
    r.config_maps
        .iter()
        .map(move |n| (Kind::ConfigMap, namespace.to_string(), n.clone()))
        .chain(
            r.secrets
                .iter()
                .map(move |n| (Kind::Secret, namespace.to_string(), n.clone())),
        )
}

impl State {
    fn add_refs(&mut self, namespace: &str, r: &ReferencedObjects, invalidate: bool) {
        for k in keys(namespace, r) {
            if invalidate {
                self.entries.remove(&k);
            }
            *self.refs.entry(k).or_default() += 1;
        }
    }

    fn drop_refs(&mut self, namespace: &str, r: &ReferencedObjects) {
        for k in keys(namespace, r) {
            if let Some(n) = self.refs.get_mut(&k) {
                *n -= 1;
                if *n == 0 {
                    self.refs.remove(&k);
                    self.entries.remove(&k);
                }
            }
        }
    }
}

/// ConfigMaps and Secrets from the API server, with a TTL cache. Cheap to clone (shared cache).
#[derive(Clone)]
pub struct ApiObjects {
    client: Client,
    ttl: Duration,
    state: std::sync::Arc<Mutex<State>>,
}

impl std::fmt::Debug for ApiObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiObjects")
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl ApiObjects {
    /// A provider using `client` (the node's credentials), with the default TTL.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            ttl: DEFAULT_OBJECT_TTL,
            state: Default::default(),
        }
    }

    /// Serve fetched objects from the cache for `ttl` (zero: every lookup is a GET).
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Number of objects currently cached (for tests and metrics).
    pub fn cached_objects(&self) -> usize {
        self.state.lock().entries.len()
    }

    fn cached(&self, key: &Key) -> Option<Cached> {
        let st = self.state.lock();
        let (c, at) = st.entries.get(key)?;
        (at.elapsed() < self.ttl).then(|| c.clone())
    }

    fn store(&self, key: Key, value: Cached) {
        let mut st = self.state.lock();
        // Cache only what a registered pod references, so unregistered lookups cannot grow it.
        if st.refs.contains_key(&key) {
            st.entries.insert(key, (value, Instant::now()));
        }
    }
}

/// The kubelet's view of an API failure, as a core error with the server's message.
fn api_error(kind: &str, namespace: &str, name: &str, e: kube::Error) -> Error {
    let (k, msg) = match &e {
        kube::Error::Api(status) => {
            let k = match status.code {
                401 | 403 => ErrorKind::PermissionDenied,
                404 => ErrorKind::NotFound,
                408 | 429 | 500..=599 => ErrorKind::Unavailable,
                _ => ErrorKind::Internal,
            };
            (k, status.message.clone())
        }
        other => (
            ErrorKind::Unavailable,
            format!("getting {kind} {namespace}/{name}: {other}"),
        ),
    };
    Error::new(k, msg).with_source(e)
}

#[async_trait]
impl ObjectProvider for ApiObjects {
    async fn config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> kubelet_core::Result<Option<ConfigMap>> {
        let key = (Kind::ConfigMap, namespace.to_string(), name.to_string());
        if let Some(Cached::ConfigMap(c)) = self.cached(&key) {
            return Ok(c);
        }
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), namespace);
        let got = api
            .get_opt(name)
            .await
            .map_err(|e| api_error("configmap", namespace, name, e))?;
        self.store(key, Cached::ConfigMap(got.clone()));
        Ok(got)
    }

    async fn secret(&self, namespace: &str, name: &str) -> kubelet_core::Result<Option<Secret>> {
        let key = (Kind::Secret, namespace.to_string(), name.to_string());
        if let Some(Cached::Secret(s)) = self.cached(&key) {
            return Ok(s);
        }
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let got = api
            .get_opt(name)
            .await
            .map_err(|e| api_error("secret", namespace, name, e))?;
        self.store(key, Cached::Secret(got.clone()));
        Ok(got)
    }

    fn register_pod(&self, pod: &Pod) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        let version = pod.metadata.resource_version.clone();
        let namespace = kubelet_core::pod::namespace(pod).to_string();
        let mut st = self.state.lock();
        match st.pods.get(&uid) {
            Some((v, _, _)) if *v == version => {}
            _ => {
                let refs = ReferencedObjects::of_pod(pod);
                if let Some((_, old_ns, old)) = st.pods.remove(&uid) {
                    st.drop_refs(&old_ns, &old);
                }
                st.add_refs(&namespace, &refs, true);
                st.pods.insert(uid, (version, namespace, refs));
            }
        }
    }

    fn unregister_pod(&self, pod: &Pod) {
        let Some(uid) = pod.metadata.uid.as_deref() else {
            return;
        };
        let mut st = self.state.lock();
        if let Some((_, ns, refs)) = st.pods.remove(uid) {
            st.drop_refs(&ns, &refs);
        }
    }
}
