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
use kubelet_core::{Error, ErrorKind};
use kubelet_core::{ObjectProvider, ReferencedObjects};
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
    services: Option<crate::services::ServiceCache>,
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
    fn services(
        &self,
    ) -> kubelet_core::Result<Option<Vec<std::sync::Arc<k8s_openapi::api::core::v1::Service>>>>
    {
        match &self.services {
            None => Ok(None),
            Some(cache) => cache
                .services()
                .map(Some)
                .map_err(|m| kubelet_core::Error::new(kubelet_core::ErrorKind::Unavailable, m)),
        }
    }

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
}
