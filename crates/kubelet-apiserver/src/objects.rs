//! [`ApiObjects`]: the [`ObjectProvider`] backed by the API server, for `envFrom` / `valueFrom`
//! references and `configMap` / `secret` volumes.
//!
//! Three strategies, as the kubelet's `configMapAndSecretChangeDetectionStrategy`
//! ([`ChangeDetection`]):
//! - **`Watch`** (the default, as the kubelet's): each object a registered pod references is
//!   watched (a list and watch with the `metadata.name` field selector, which the Node
//!   authorizer grants a node for its pods' objects) while at least one registered pod
//!   references it, so 1,000 pods sharing 10 ConfigMaps keep 10 watches. Reads come from the
//!   watch. An immutable object is read once and no longer watched. When a watched object
//!   changes (or is deleted), every registered pod that references it is asked to sync at once
//!   ([`AgentHandle::sync_pod`], given through [`ApiObjects::sync_pods_through`]), so its
//!   volume files follow within the time of one sync. The kubelet instead waits for the pod's
//!   next periodic sync (up to `syncFrequency`, 1 minute): a deliberate difference.
//!   A read waits at most 1 s for a new watch's first list (the kubelet's limit) and then, or
//!   when the watch fails (an API server that refuses it), falls back to a GET.
//! - **`Cache`**: each object is fetched with a GET and kept for a TTL
//!   ([`ApiObjects::with_ttl`], default 1 minute, the kubelet's default when the Node carries no
//!   `node.alpha.kubernetes.io/ttl` annotation). When a pod is new or changed (a new UID or
//!   `resourceVersion` at [`register_pod`](ObjectProvider::register_pod)), the cached copies of
//!   the objects it references are dropped, so a pod always starts with fresh objects, as the
//!   kubelet's `RegisterPod` does. Volumes pick up changes on the pod's next sync after the TTL
//!   expired.
//! - **`Get`**: every read is a GET.
//!
//! In every strategy, objects no registered pod references any more are dropped (their watches
//! stopped). Reads of objects no registered pod references are plain GETs, never cached.
//! Anything the Node authorizer refuses comes back as `PermissionDenied` with the server's
//! message. Not-found answers are cached (and watched) like objects.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::wire::Decoded;
use async_trait::async_trait;
use futures::StreamExt;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, ServiceAccount};
use kube::api::PostParams;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use kubelet_api::AgentHandle;
use kubelet_api::{Error, ErrorKind};
use kubelet_api::{ObjectProvider, ReferencedObjects};
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Default time a fetched object is served from the cache (`Cache` strategy).
pub const DEFAULT_OBJECT_TTL: Duration = Duration::from_secs(60);

/// How long a read waits for a new watch's first list before it falls back to a GET (the
/// kubelet's `objectCache.Get` waits one second).
pub const WATCH_SYNC_WAIT: Duration = Duration::from_secs(1);

/// At most one watch-error log line per object per this period.
const ERROR_LOG_EVERY: Duration = Duration::from_secs(30);

/// How the agent learns of ConfigMap and Secret changes: the kubelet's
/// `configMapAndSecretChangeDetectionStrategy` (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ChangeDetection {
    /// Watch each referenced object (the kubelet's default).
    #[default]
    Watch,
    /// GET and keep for a TTL.
    Cache,
    /// GET on every read.
    Get,
}

impl ChangeDetection {
    /// The configuration's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeDetection::Watch => "Watch",
            ChangeDetection::Cache => "Cache",
            ChangeDetection::Get => "Get",
        }
    }
}

impl std::fmt::Display for ChangeDetection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ChangeDetection {
    type Err = crate::ApiServerError;

    /// `Watch`, `Cache` or `Get`, as the kubelet spells them.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "Watch" => Ok(ChangeDetection::Watch),
            "Cache" => Ok(ChangeDetection::Cache),
            "Get" => Ok(ChangeDetection::Get),
            other => Err(crate::ApiServerError::InvalidChangeDetectionStrategy(
                other.to_string(),
            )),
        }
    }
}

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

/// One watched object.
#[derive(Default)]
struct Watched {
    /// The object as the watch last saw it (`Some(None)`: it does not exist); `None` until the
    /// first list.
    value: Option<Cached>,
    /// Its `resourceVersion`, to tell a change from a relist.
    version: Option<String>,
    /// The watch has failed before its first list: reads do not wait for it.
    failing: bool,
    /// The watch task; finished for an immutable object.
    task: Option<tokio::task::AbortHandle>,
}

#[derive(Default)]
struct State {
    /// `Cache` strategy: fetched objects and when.
    entries: HashMap<Key, (Cached, Instant)>,
    /// `Watch` strategy: one watch per referenced object.
    watched: HashMap<Key, Watched>,
    /// Registered pods: UID → (resourceVersion, namespace, referenced objects).
    pods: HashMap<String, (Option<String>, String, ReferencedObjects)>,
    /// How many registered pods reference each object.
    refs: HashMap<Key, usize>,
    /// Where to ask for pod syncs when a watched object changes.
    kubelet: Option<std::sync::Arc<dyn AgentHandle>>,
    /// RuntimeClasses read lately (by name), with when: a pod's every sync looks its class up.
    runtime_classes: HashMap<String, (Option<k8s_openapi::api::node::v1::RuntimeClass>, Instant)>,
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
    /// Count the pod's references; returns the objects no pod referenced before.
    fn add_refs(&mut self, namespace: &str, r: &ReferencedObjects, invalidate: bool) -> Vec<Key> {
        let mut new = Vec::new();
        for k in keys(namespace, r) {
            if invalidate {
                self.entries.remove(&k);
            }
            let n = self.refs.entry(k.clone()).or_default();
            *n += 1;
            if *n == 1 {
                new.push(k);
            }
        }
        new
    }

    fn drop_refs(&mut self, namespace: &str, r: &ReferencedObjects) {
        for k in keys(namespace, r) {
            if let Some(n) = self.refs.get_mut(&k) {
                *n -= 1;
                if *n == 0 {
                    self.refs.remove(&k);
                    self.entries.remove(&k);
                    if let Some(task) = self.watched.remove(&k).and_then(|w| w.task) {
                        task.abort();
                    }
                }
            }
        }
    }

    /// UIDs of the registered pods that reference `key`.
    fn pods_referencing(&self, key: &Key) -> Vec<String> {
        self.pods
            .iter()
            .filter(|(_, (_, ns, r))| {
                *ns == key.1
                    && match key.0 {
                        Kind::ConfigMap => r.config_maps.binary_search(&key.2).is_ok(),
                        Kind::Secret => r.secrets.binary_search(&key.2).is_ok(),
                    }
            })
            .map(|(uid, _)| uid.clone())
            .collect()
    }
}

/// What the watch task needs to know about one kind of object.
trait WatchedKind:
    kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
    + Clone
    + crate::wire::JsonText
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
    fn wrap(o: Option<Self>) -> Cached;
    fn immutable(&self) -> bool;
}

impl WatchedKind for ConfigMap {
    fn wrap(o: Option<Self>) -> Cached {
        Cached::ConfigMap(o)
    }
    fn immutable(&self) -> bool {
        self.immutable == Some(true)
    }
}

impl WatchedKind for Secret {
    fn wrap(o: Option<Self>) -> Cached {
        Cached::Secret(o)
    }
    fn immutable(&self) -> bool {
        self.immutable == Some(true)
    }
}

/// Keep `key`'s entry in `state` current from a watch until the entry goes (the last pod
/// referencing it went: the task is aborted) or the object is immutable.
async fn watch_object<K: WatchedKind>(
    client: Client,
    key: Key,
    state: Weak<Mutex<State>>,
    synced: Arc<Notify>,
) {
    let api: Api<Decoded<K>> = Api::namespaced(client, &key.1);
    let config = watcher::Config::default().fields(&format!("metadata.name={}", key.2));
    let stream = watcher::watcher(api, config).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut listed: Option<K> = None;
    let mut last_error: Option<Instant> = None;
    while let Some(event) = stream.next().await {
        let seen = match event.map(crate::wire::event) {
            Ok(Event::Init) => {
                listed = None;
                continue;
            }
            Ok(Event::InitApply(o)) => {
                listed = Some(o);
                continue;
            }
            Ok(Event::InitDone) => listed.take(),
            Ok(Event::Apply(o)) => Some(o),
            Ok(Event::Delete(_)) => None,
            Err(e) => {
                let Some(state) = state.upgrade() else { return };
                if let Some(w) = state.lock().watched.get_mut(&key) {
                    w.failing = w.value.is_none();
                }
                synced.notify_waiters();
                if last_error.is_none_or(|t| t.elapsed() >= ERROR_LOG_EVERY) {
                    tracing::warn!(namespace = %key.1, name = %key.2, kind = ?key.0, error = %kubelet_api::chain(&e),
                        "watching an object failed; retrying (reads fall back to GETs meanwhile)");
                    last_error = Some(Instant::now());
                }
                continue;
            }
        };
        let Some(state) = state.upgrade() else { return };
        let immutable = seen.as_ref().is_some_and(K::immutable);
        let version = seen
            .as_ref()
            .and_then(|o| o.meta().resource_version.clone());
        let (pods, kubelet) = {
            let mut st = state.lock();
            let Some(w) = st.watched.get_mut(&key) else {
                return;
            };
            let changed = w.value.is_some() && w.version != version;
            w.value = Some(K::wrap(seen));
            w.version = version;
            w.failing = false;
            let pods = if changed {
                st.pods_referencing(&key)
            } else {
                Vec::new()
            };
            (pods, st.kubelet.clone())
        };
        synced.notify_waiters();
        if !pods.is_empty() {
            tracing::debug!(namespace = %key.1, name = %key.2, kind = ?key.0, pods = pods.len(),
                "watched object changed; syncing the pods that use it");
            if let Some(k) = &kubelet {
                for uid in &pods {
                    k.sync_pod(uid);
                }
            }
        }
        if immutable {
            tracing::debug!(namespace = %key.1, name = %key.2, kind = ?key.0,
                "object is immutable; no longer watched");
            return;
        }
    }
}

/// ConfigMaps and Secrets from the API server (see the [module docs](self) for the strategies).
/// Cheap to clone (shared state).
#[derive(Clone)]
pub struct ApiObjects {
    client: Client,
    strategy: ChangeDetection,
    ttl: Duration,
    state: Arc<Mutex<State>>,
    synced: Arc<Notify>,
    services: Option<crate::services::ServiceCache>,
}

impl std::fmt::Debug for ApiObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiObjects")
            .field("strategy", &self.strategy)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

/// How long a RuntimeClass read is reused (the kubelet watches them; a class changes rarely).
const RUNTIME_CLASS_TTL: Duration = Duration::from_secs(60);

impl ApiObjects {
    /// A provider using `client` (the node's credentials), with the `Watch` strategy.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            strategy: ChangeDetection::Watch,
            ttl: DEFAULT_OBJECT_TTL,
            state: Default::default(),
            synced: Arc::new(Notify::new()),
            services: None,
        }
    }

    /// Answer [`ObjectProvider::services`] from `cache` (which the agent keeps filled, see
    /// [`ServiceCache::run`](crate::services::ServiceCache::run)); without one, pods get no
    /// service variables.
    pub fn with_services(mut self, cache: crate::services::ServiceCache) -> Self {
        self.services = Some(cache);
        self
    }

    /// Use `strategy` (`Cache` with the TTL set by [`with_ttl`](Self::with_ttl), default
    /// 1 minute).
    pub fn with_strategy(mut self, strategy: ChangeDetection) -> Self {
        self.strategy = strategy;
        self
    }

    /// The `Cache` strategy with objects served from the cache for `ttl` (zero: every lookup
    /// is a GET).
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.strategy = ChangeDetection::Cache;
        self.ttl = ttl;
        self
    }

    /// The strategy in use.
    pub fn strategy(&self) -> ChangeDetection {
        self.strategy
    }

    /// With the `Watch` strategy, ask `kubelet` to sync the pods that use an object as soon as
    /// a watch sees it change. The API-server plugin does this when it starts.
    pub fn sync_pods_through(&self, kubelet: std::sync::Arc<dyn AgentHandle>) {
        self.state.lock().kubelet = Some(kubelet);
    }

    /// Number of objects currently cached (`Cache`) or watched and read (`Watch`), for tests
    /// and metrics.
    pub fn cached_objects(&self) -> usize {
        let st = self.state.lock();
        st.entries.len() + st.watched.values().filter(|w| w.value.is_some()).count()
    }

    /// Number of watches currently open (`Watch` strategy; immutable objects have none).
    pub fn active_watches(&self) -> usize {
        self.state
            .lock()
            .watched
            .values()
            .filter(|w| w.task.as_ref().is_some_and(|t| !t.is_finished()))
            .count()
    }

    /// Start the watches of objects a pod referenced first (`Watch` strategy). Without a tokio
    /// runtime there is nothing to run them on; reads then fall back to GETs.
    fn start_watches(&self, st: &mut State, new: Vec<Key>) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        for key in new {
            let client = self.client.clone();
            let weak = Arc::downgrade(&self.state);
            let synced = self.synced.clone();
            let task = match key.0 {
                Kind::ConfigMap => {
                    rt.spawn(watch_object::<ConfigMap>(client, key.clone(), weak, synced))
                }
                Kind::Secret => rt.spawn(watch_object::<Secret>(client, key.clone(), weak, synced)),
            };
            st.watched.insert(
                key,
                Watched {
                    task: Some(task.abort_handle()),
                    ..Default::default()
                },
            );
        }
    }

    /// The watched copy of `key`: `None` when it is not watched, or its watch has not listed
    /// within [`WATCH_SYNC_WAIT`] or is failing (the caller GETs).
    async fn watched(&self, key: &Key) -> Option<Cached> {
        let deadline = Instant::now() + WATCH_SYNC_WAIT;
        loop {
            let wait = self.synced.notified();
            let mut wait = std::pin::pin!(wait);
            wait.as_mut().enable();
            {
                let st = self.state.lock();
                let w = st.watched.get(key)?;
                if let Some(v) = &w.value {
                    return Some(v.clone());
                }
                if w.failing {
                    return None;
                }
            }
            if tokio::time::timeout_at(deadline, wait).await.is_err() {
                return None;
            }
        }
    }

    async fn lookup(&self, key: &Key) -> Option<Cached> {
        match self.strategy {
            ChangeDetection::Watch => self.watched(key).await,
            ChangeDetection::Cache => {
                let st = self.state.lock();
                let (c, at) = st.entries.get(key)?;
                (at.elapsed() < self.ttl).then(|| c.clone())
            }
            ChangeDetection::Get => None,
        }
    }

    fn store(&self, key: Key, value: Cached) {
        if self.strategy != ChangeDetection::Cache {
            return;
        }
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
    fn services(
        &self,
    ) -> kubelet_api::Result<Option<Vec<std::sync::Arc<k8s_openapi::api::core::v1::Service>>>> {
        match &self.services {
            None => Ok(None),
            Some(cache) => cache
                .services()
                .map(Some)
                .map_err(|m| kubelet_api::Error::new(kubelet_api::ErrorKind::Unavailable, m)),
        }
    }

    async fn config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> kubelet_api::Result<Option<ConfigMap>> {
        let key = (Kind::ConfigMap, namespace.to_string(), name.to_string());
        if let Some(Cached::ConfigMap(c)) = self.lookup(&key).await {
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

    async fn request_service_account_token(
        &self,
        namespace: &str,
        service_account: &str,
        request: &TokenRequest,
    ) -> kubelet_api::Result<TokenRequest> {
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), namespace);
        api.create_token_request(service_account, &PostParams::default(), request)
            .await
            .map_err(|e| api_error("serviceaccounts/token", namespace, service_account, e))
    }

    async fn secret(&self, namespace: &str, name: &str) -> kubelet_api::Result<Option<Secret>> {
        let key = (Kind::Secret, namespace.to_string(), name.to_string());
        if let Some(Cached::Secret(s)) = self.lookup(&key).await {
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

    async fn runtime_class(
        &self,
        name: &str,
    ) -> kubelet_api::Result<Option<k8s_openapi::api::node::v1::RuntimeClass>> {
        if let Some((rc, at)) = self.state.lock().runtime_classes.get(name)
            && at.elapsed() < RUNTIME_CLASS_TTL
        {
            return Ok(rc.clone());
        }
        let api: Api<k8s_openapi::api::node::v1::RuntimeClass> = Api::all(self.client.clone());
        let got = api
            .get_opt(name)
            .await
            .map_err(|e| api_error("runtimeclass", "", name, e))?;
        let mut st = self.state.lock();
        if st.runtime_classes.len() > 256 {
            st.runtime_classes.clear();
        }
        st.runtime_classes
            .insert(name.to_string(), (got.clone(), Instant::now()));
        Ok(got)
    }

    async fn service_account(
        &self,
        namespace: &str,
        name: &str,
    ) -> kubelet_api::Result<Option<ServiceAccount>> {
        // Read when a pod without pull secrets pulls: rare enough for a GET each time.
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), namespace);
        api.get_opt(name)
            .await
            .map_err(|e| api_error("serviceaccount", namespace, name, e))
    }

    fn register_pod(&self, pod: &Pod) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        let version = pod.metadata.resource_version.clone();
        let namespace = kubelet_api::pod::namespace(pod).to_string();
        let mut st = self.state.lock();
        match st.pods.get(&uid) {
            Some((v, _, _)) if *v == version => {}
            _ => {
                let refs = ReferencedObjects::of_pod(pod);
                // Count the new references before dropping the old ones, so an object both
                // versions reference keeps its watch.
                let new = st.add_refs(&namespace, &refs, true);
                if let Some((_, old_ns, old)) = st.pods.insert(uid, (version, namespace, refs)) {
                    st.drop_refs(&old_ns, &old);
                }
                if self.strategy == ChangeDetection::Watch {
                    let new: Vec<Key> = new
                        .into_iter()
                        .filter(|k| st.refs.contains_key(k) && !st.watched.contains_key(k))
                        .collect();
                    self.start_watches(&mut st, new);
                }
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ConfigMapVolumeSource, PodSpec, Volume};
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A tiny real HTTP server standing in for the API server: answers ConfigMap GETs from a
    /// map (404 Status for others, 403 for names starting with `forbidden`) and counts requests.
    struct Server {
        url: String,
        requests: Arc<Mutex<Vec<String>>>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Drop for Server {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    fn status(code: u16, reason: &str, message: &str) -> String {
        serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code,
        })
        .to_string()
    }

    async fn server(objects: BTreeMap<String, String>) -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let requests: Arc<Mutex<Vec<String>>> = Default::default();
        let seen = requests.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut chunk).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&buf).into_owned();
                let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
                seen.lock().push(path.clone());
                let name = path.rsplit('/').next().unwrap_or("").to_string();
                let (code, body) = if name.starts_with("forbidden") {
                    (
                        403,
                        status(
                            403,
                            "Forbidden",
                            "configmaps \"forbidden\" is forbidden: no relationship found between node \"n\" and this object",
                        ),
                    )
                } else if let Some(data) = objects.get(&name) {
                    let cm = serde_json::json!({
                        "kind": "ConfigMap", "apiVersion": "v1",
                        "metadata": {"name": name, "namespace": "ns"},
                        "data": {"k": data},
                    });
                    (200, cm.to_string())
                } else {
                    (
                        404,
                        status(404, "NotFound", &format!("configmaps \"{name}\" not found")),
                    )
                };
                let resp = format!(
                    "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(resp.as_bytes()).await;
                let _ = conn.shutdown().await;
            }
        });
        Server {
            url,
            requests,
            task,
        }
    }

    fn client(url: &str) -> Client {
        let uri: http::Uri = url.parse().expect("uri");
        Client::try_from(kube::Config::new(uri)).expect("client")
    }

    fn pod(uid: &str, version: &str, config_maps: &[&str]) -> Pod {
        let mut p = Pod {
            spec: Some(PodSpec {
                volumes: Some(
                    config_maps
                        .iter()
                        .map(|n| Volume {
                            name: n.to_string(),
                            config_map: Some(ConfigMapVolumeSource {
                                name: n.to_string(),
                                ..Default::default()
                            }),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        p.metadata.uid = Some(uid.into());
        p.metadata.namespace = Some("ns".into());
        p.metadata.resource_version = Some(version.into());
        p
    }

    #[tokio::test]
    async fn objects_are_cached_for_the_ttl_and_refetched_when_a_pod_changes() {
        let srv = server(BTreeMap::from([("a".to_string(), "1".to_string())])).await;
        let objects = ApiObjects::new(client(&srv.url)).with_ttl(Duration::from_secs(600));
        let count = || srv.requests.lock().len();

        objects.register_pod(&pod("u1", "1", &["a", "missing"]));
        let got = objects.config_map("ns", "a").await.expect("get");
        assert_eq!(
            got.and_then(|c| c.data).and_then(|d| d.get("k").cloned()),
            Some("1".to_string())
        );
        assert_eq!(count(), 1);
        assert_eq!(srv.requests.lock()[0], "/api/v1/namespaces/ns/configmaps/a");
        objects.config_map("ns", "a").await.expect("cached");
        assert_eq!(count(), 1, "served from the cache within the TTL");

        // Not found is an answer, cached like an object.
        assert!(
            objects
                .config_map("ns", "missing")
                .await
                .expect("get")
                .is_none()
        );
        assert!(
            objects
                .config_map("ns", "missing")
                .await
                .expect("get")
                .is_none()
        );
        assert_eq!(count(), 2);

        // Syncing the same pod again keeps the cache; a changed pod refetches.
        objects.register_pod(&pod("u1", "1", &["a", "missing"]));
        objects.config_map("ns", "a").await.expect("cached");
        assert_eq!(count(), 2);
        objects.register_pod(&pod("u1", "2", &["a"]));
        objects.config_map("ns", "a").await.expect("refetched");
        assert_eq!(count(), 3);
        assert_eq!(
            objects.cached_objects(),
            1,
            "missing is no longer referenced"
        );

        // Once no pod references an object it is not cached.
        objects.unregister_pod(&pod("u1", "2", &["a"]));
        assert_eq!(objects.cached_objects(), 0);
        objects.config_map("ns", "a").await.expect("get");
        objects.config_map("ns", "a").await.expect("get");
        assert_eq!(count(), 5);
    }

    #[tokio::test]
    async fn zero_ttl_always_fetches_and_errors_keep_their_kind() {
        let srv = server(BTreeMap::from([("a".to_string(), "1".to_string())])).await;
        let objects = ApiObjects::new(client(&srv.url)).with_ttl(Duration::ZERO);
        objects.register_pod(&pod("u1", "1", &["a", "forbidden"]));
        objects.config_map("ns", "a").await.expect("get");
        objects.config_map("ns", "a").await.expect("get");
        assert_eq!(srv.requests.lock().len(), 2);

        let err = objects
            .config_map("ns", "forbidden")
            .await
            .expect_err("403");
        assert_eq!(err.kind(), ErrorKind::PermissionDenied);
        assert!(err.message().contains("no relationship found"), "{err}");

        let down = ApiObjects::new(client("http://127.0.0.1:1"));
        let err = down.secret("ns", "s").await.expect_err("unreachable");
        assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    }

    #[tokio::test]
    async fn a_refused_watch_falls_back_to_gets_and_goes_with_the_last_pod() {
        // The stand-in server answers GETs only: the list of a watch gets a 404 Status.
        let srv = server(BTreeMap::from([("a".to_string(), "1".to_string())])).await;
        let objects = ApiObjects::new(client(&srv.url));
        assert_eq!(objects.strategy(), ChangeDetection::Watch);
        objects.register_pod(&pod("u1", "1", &["a"]));
        objects.register_pod(&pod("u2", "1", &["a"]));
        assert_eq!(
            objects.state.lock().watched.len(),
            1,
            "one watch per object"
        );
        let started = Instant::now();
        let got = objects.config_map("ns", "a").await.expect("get");
        assert!(got.is_some());
        assert!(
            started.elapsed() <= WATCH_SYNC_WAIT + Duration::from_millis(500),
            "waited at most the sync wait: {:?}",
            started.elapsed()
        );
        let requests = srv.requests.lock().clone();
        assert!(
            requests
                .iter()
                .any(|r| r.contains("fieldSelector=metadata.name")),
            "the watch lists by name: {requests:?}"
        );
        assert!(requests.contains(&"/api/v1/namespaces/ns/configmaps/a".to_string()));

        // Watches stay while a pod references the object, and go with the last one.
        objects.unregister_pod(&pod("u1", "1", &["a"]));
        assert_eq!(objects.state.lock().watched.len(), 1);
        objects.unregister_pod(&pod("u2", "1", &["a"]));
        assert_eq!(objects.state.lock().watched.len(), 0);
        assert_eq!(objects.active_watches(), 0);

        assert_eq!(
            "Cache".parse::<ChangeDetection>().ok(),
            Some(ChangeDetection::Cache)
        );
        let e = "watch"
            .parse::<ChangeDetection>()
            .expect_err("case matters");
        assert!(e.to_string().contains("Watch, Cache and Get"), "{e}");
    }
}
