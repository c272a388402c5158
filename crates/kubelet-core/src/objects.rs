//! The [`ObjectProvider`] seam: where the engine gets the ConfigMaps and Secrets that pods

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret, Service};
use parking_lot::RwLock;

use crate::error::Result;
use crate::pod;

/// Source of the ConfigMaps and Secrets pods reference.
///
/// `Ok(None)` means the object does not exist (the engine then reports the kubelet's
/// `configmap "x" not found` / `secret "x" not found`, or skips it when the reference is
/// optional); `Err` is any other failure (unreachable API server, forbidden), reported as is.
///
/// The [`ObjectProvider`] seam: where the engine gets the ConfigMaps and Secrets that pods
/// reference, for environment variables (`envFrom`, `valueFrom`) and for `configMap` / `secret`
/// volumes. It plays the part of the kubelet's `configmap.Manager` and `secret.Manager`.
///
/// The core has no API client; an implementation backed by a cluster lives in
/// `kubelet-apiserver`. [`StaticObjects`] is an in-memory implementation for standalone agents
/// and tests.
///
/// The engine calls [`ObjectProvider::register_pod`] on every sync of a pod and
/// [`ObjectProvider::unregister_pod`] once the pod is gone, as the kubelet's pod manager does with
/// its managers, so a caching or watching implementation knows which objects are in use.
#[async_trait]
pub trait ObjectProvider: Send + Sync + 'static {
    /// ConfigMap `name` in `namespace`.
    async fn config_map(&self, namespace: &str, name: &str) -> Result<Option<ConfigMap>>;
    /// Secret `name` in `namespace`.
    async fn secret(&self, namespace: &str, name: &str) -> Result<Option<Secret>>;
    /// The engine is about to sync `pod` (called on every sync; must be cheap and idempotent).
    /// Implementations that cache or watch start tracking the objects the pod references.
    fn register_pod(&self, pod: &Pod) {
        let _ = pod;
    }
    /// `pod` is gone: objects only it referenced need no tracking any more.
    fn unregister_pod(&self, pod: &Pod) {
        let _ = pod;
    }
    /// A token for `service_account` in `namespace` (the TokenRequest API,
    /// `POST …/serviceaccounts/<name>/token`), for the `serviceAccountToken` sources of
    /// projected volumes: `request.spec` carries the audiences, the lifetime and the pod the
    /// token is bound to; the answer's `status` carries the token and its expiry. The default
    /// fails with [`ErrorKind::Unimplemented`](crate::ErrorKind::Unimplemented): this provider
    /// cannot issue tokens (an agent without an API server).
    async fn request_service_account_token(
        &self,
        namespace: &str,
        service_account: &str,
        request: &TokenRequest,
    ) -> Result<TokenRequest> {
        let _ = request;
        Err(crate::Error::new(
            crate::ErrorKind::Unimplemented,
            format!(
                "cannot request a token for service account {namespace}/{service_account}: the object provider cannot issue service account tokens"
            ),
        ))
    }
    /// Every Service of the cluster, for the pods' service environment variables
    /// ([`crate::services`]); called for every container start, so it must be a cheap read
    /// (a watch cache). `Ok(None)`, the default: this provider knows no Services (no variables,
    /// as a kubelet without an API server). An error (the cache has not been filled yet) fails
    /// the start of an API pod with `CreateContainerConfigError`, retried; static pods start
    /// without the variables.
    fn services(&self) -> Result<Option<Vec<std::sync::Arc<Service>>>> {
        Ok(None)
    }
}

fn _assert_object_provider_dyn(_: &dyn ObjectProvider) {}

/// Names of the ConfigMaps and Secrets a pod references, from its volumes (including projected
/// sources) and the env of all its containers (`podutil.VisitPodConfigmapNames` and
/// `VisitPodSecretNames`). Image pull secrets are included among the secrets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReferencedObjects {
    /// ConfigMap names, sorted, without duplicates.
    pub config_maps: Vec<String>,
    /// Secret names, sorted, without duplicates.
    pub secrets: Vec<String>,
}

impl ReferencedObjects {
    /// Everything `p` references.
    pub fn of_pod(p: &Pod) -> Self {
        let mut cms = std::collections::BTreeSet::new();
        let mut secrets = std::collections::BTreeSet::new();
        if let Some(spec) = &p.spec {
            for s in spec.image_pull_secrets.iter().flatten() {
                secrets.insert(s.name.clone());
            }
            for v in spec.volumes.iter().flatten() {
                if let Some(c) = &v.config_map {
                    cms.insert(c.name.clone());
                }
                if let Some(s) = v.secret.as_ref().and_then(|s| s.secret_name.clone()) {
                    secrets.insert(s);
                }
                for src in v
                    .projected
                    .iter()
                    .flat_map(|pr| pr.sources.iter().flatten())
                {
                    if let Some(c) = &src.config_map {
                        cms.insert(c.name.clone());
                    }
                    if let Some(s) = &src.secret {
                        secrets.insert(s.name.clone());
                    }
                }
            }
        }
        let all = pod::init_containers(p).iter().chain(pod::containers(p));
        for c in all {
            let (cm, sec) = container_refs(c);
            cms.extend(cm);
            secrets.extend(sec);
        }
        cms.remove("");
        secrets.remove("");
        Self {
            config_maps: cms.into_iter().collect(),
            secrets: secrets.into_iter().collect(),
        }
    }
}

/// ConfigMap and Secret names container `c`'s environment references.
fn container_refs(c: &Container) -> (Vec<String>, Vec<String>) {
    let mut cms = Vec::new();
    let mut secrets = Vec::new();
    for from in c.env_from.iter().flatten() {
        if let Some(r) = &from.config_map_ref {
            cms.push(r.name.clone());
        }
        if let Some(r) = &from.secret_ref {
            secrets.push(r.name.clone());
        }
    }
    for e in c.env.iter().flatten() {
        let Some(from) = &e.value_from else { continue };
        if let Some(r) = &from.config_map_key_ref {
            cms.push(r.name.clone());
        }
        if let Some(r) = &from.secret_key_ref {
            secrets.push(r.name.clone());
        }
    }
    (cms, secrets)
}

/// The outcome of looking one object up.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Lookup<T> {
    /// The object exists.
    Found(T),
    /// The object does not exist.
    NotFound,
    /// The provider failed; the message is reported as the container's config error.
    Failed(String),
}

/// The ConfigMaps and Secrets one container's environment references, fetched before its
/// config is generated (config generation itself is synchronous).
///
/// `EnvObjects::default()` stands for "no provider configured": every reference then fails
/// with the kubelet's "no kubeClient defined" error.
#[derive(Debug, Clone)]
pub struct EnvObjects {
    provider_configured: bool,
    config_maps: HashMap<String, Lookup<ConfigMap>>,
    secrets: HashMap<String, Lookup<Secret>>,
    service_env: Result<BTreeMap<String, String>, String>,
}

impl Default for EnvObjects {
    fn default() -> Self {
        Self {
            provider_configured: false,
            config_maps: HashMap::new(),
            secrets: HashMap::new(),
            service_env: Ok(BTreeMap::new()),
        }
    }
}

impl EnvObjects {
    /// Fetch every object `c` of `pod` references from `provider`, each once, and the service
    /// environment variables of the pod's namespace.
    pub async fn fetch(provider: &dyn ObjectProvider, pod: &Pod, c: &Container) -> Self {
        let namespace = pod::namespace(pod);
        let (cms, secrets) = container_refs(c);
        let links = pod
            .spec
            .as_ref()
            .and_then(|s| s.enable_service_links)
            .unwrap_or(true);
        let service_env = match provider.services() {
            Ok(Some(all)) => Ok(crate::services::service_env(&all, namespace, links)),
            Ok(None) => Ok(BTreeMap::new()),
            // A static pod does not wait for the API server (it may be the API server): it
            // starts without service variables, as the kubelet's.
            Err(_) if pod::is_static(pod) => Ok(BTreeMap::new()),
            Err(e) => Err(e.to_string()),
        };
        let mut out = Self {
            provider_configured: true,
            service_env,
            ..Self::default()
        };
        for name in cms {
            if out.config_maps.contains_key(&name) {
                continue;
            }
            let l = match provider.config_map(namespace, &name).await {
                Ok(Some(o)) => Lookup::Found(o),
                Ok(None) => Lookup::NotFound,
                Err(e) => Lookup::Failed(e.to_string()),
            };
            out.config_maps.insert(name, l);
        }
        for name in secrets {
            if out.secrets.contains_key(&name) {
                continue;
            }
            let l = match provider.secret(namespace, &name).await {
                Ok(Some(o)) => Lookup::Found(o),
                Ok(None) => Lookup::NotFound,
                Err(e) => Lookup::Failed(e.to_string()),
            };
            out.secrets.insert(name, l);
        }
        out
    }

    /// Objects given directly (for tests and callers that fetched them already): names absent
    /// from the maps are not found.
    pub fn from_objects(
        config_maps: impl IntoIterator<Item = ConfigMap>,
        secrets: impl IntoIterator<Item = Secret>,
    ) -> Self {
        Self {
            provider_configured: true,
            config_maps: config_maps
                .into_iter()
                .map(|o| {
                    (
                        o.metadata.name.clone().unwrap_or_default(),
                        Lookup::Found(o),
                    )
                })
                .collect(),
            secrets: secrets
                .into_iter()
                .map(|o| {
                    (
                        o.metadata.name.clone().unwrap_or_default(),
                        Lookup::Found(o),
                    )
                })
                .collect(),
            service_env: Ok(BTreeMap::new()),
        }
    }

    /// The service environment variables, or why they could not be made.
    pub fn service_env(&self) -> Result<&BTreeMap<String, String>, &str> {
        self.service_env.as_ref().map_err(String::as_str)
    }

    /// Objects given directly with these service variables (for tests).
    pub fn with_service_env(mut self, env: BTreeMap<String, String>) -> Self {
        self.service_env = Ok(env);
        self
    }

    /// True when a provider was configured.
    pub fn provider_configured(&self) -> bool {
        self.provider_configured
    }

    /// The lookup of ConfigMap `name`.
    pub fn config_map(&self, name: &str) -> Lookup<&ConfigMap> {
        lookup(&self.config_maps, name)
    }

    /// The lookup of Secret `name`.
    pub fn secret(&self, name: &str) -> Lookup<&Secret> {
        lookup(&self.secrets, name)
    }
}

fn lookup<'a, T>(map: &'a HashMap<String, Lookup<T>>, name: &str) -> Lookup<&'a T> {
    match map.get(name) {
        Some(Lookup::Found(o)) => Lookup::Found(o),
        Some(Lookup::Failed(m)) => Lookup::Failed(m.clone()),
        Some(Lookup::NotFound) | None => Lookup::NotFound,
    }
}

/// An in-memory [`ObjectProvider`]: objects set by the host (a standalone agent with
/// configuration from files) or by tests. Cloning shares the store.
#[derive(Debug, Clone, Default)]
pub struct StaticObjects {
    inner: std::sync::Arc<RwLock<Store>>,
}

#[derive(Debug, Default)]
struct Store {
    config_maps: BTreeMap<(String, String), ConfigMap>,
    secrets: BTreeMap<(String, String), Secret>,
}

fn key_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> (String, String) {
    (
        meta.namespace.clone().unwrap_or_else(|| "default".into()),
        meta.name.clone().unwrap_or_default(),
    )
}

impl StaticObjects {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add or replace a ConfigMap (namespace `default` when unset).
    pub fn put_config_map(&self, cm: ConfigMap) {
        self.inner
            .write()
            .config_maps
            .insert(key_of(&cm.metadata), cm);
    }

    /// Add or replace a Secret (namespace `default` when unset).
    pub fn put_secret(&self, s: Secret) {
        self.inner.write().secrets.insert(key_of(&s.metadata), s);
    }

    /// Remove a ConfigMap.
    pub fn remove_config_map(&self, namespace: &str, name: &str) {
        self.inner
            .write()
            .config_maps
            .remove(&(namespace.to_string(), name.to_string()));
    }

    /// Remove a Secret.
    pub fn remove_secret(&self, namespace: &str, name: &str) {
        self.inner
            .write()
            .secrets
            .remove(&(namespace.to_string(), name.to_string()));
    }
}

#[async_trait]
impl ObjectProvider for StaticObjects {
    async fn config_map(&self, namespace: &str, name: &str) -> Result<Option<ConfigMap>> {
        Ok(self
            .inner
            .read()
            .config_maps
            .get(&(namespace.to_string(), name.to_string()))
            .cloned())
    }

    async fn secret(&self, namespace: &str, name: &str) -> Result<Option<Secret>> {
        Ok(self
            .inner
            .read()
            .secrets
            .get(&(namespace.to_string(), name.to_string()))
            .cloned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ConfigMapEnvSource, ConfigMapVolumeSource, EnvFromSource, EnvVar, EnvVarSource,
        LocalObjectReference, PodSpec, SecretKeySelector, SecretVolumeSource, Volume,
    };

    /// A provider whose Service list has not arrived yet.
    struct Unsynced;

    #[async_trait]
    impl ObjectProvider for Unsynced {
        async fn config_map(&self, _: &str, _: &str) -> Result<Option<ConfigMap>> {
            Ok(None)
        }
        async fn secret(&self, _: &str, _: &str) -> Result<Option<Secret>> {
            Ok(None)
        }
        fn services(&self) -> Result<Option<Vec<std::sync::Arc<Service>>>> {
            Err(crate::Error::new(
                crate::ErrorKind::Unavailable,
                "services have not yet been read at least once, cannot construct envvars",
            ))
        }
    }

    #[tokio::test]
    async fn api_pods_wait_for_the_service_list_and_static_pods_do_not() {
        let c = Container::default();
        let mut api = Pod::default();
        api.metadata.annotations = Some(
            [(
                crate::config::annotations::CONFIG_SOURCE.to_string(),
                "api".to_string(),
            )]
            .into(),
        );
        let e = EnvObjects::fetch(&Unsynced, &api, &c).await;
        assert!(
            e.service_env()
                .is_err_and(|m| m.contains("have not yet been read"))
        );
        let mut file = Pod::default();
        file.metadata.annotations = Some(
            [(
                crate::config::annotations::CONFIG_SOURCE.to_string(),
                "file".to_string(),
            )]
            .into(),
        );
        let e = EnvObjects::fetch(&Unsynced, &file, &c).await;
        assert!(e.service_env().is_ok_and(|m| m.is_empty()));
    }

    #[test]
    fn referenced_objects_cover_volumes_env_and_pull_secrets() {
        let c = Container {
            name: "c".into(),
            env_from: Some(vec![EnvFromSource {
                config_map_ref: Some(ConfigMapEnvSource {
                    name: "cm-env".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            env: Some(vec![EnvVar {
                name: "X".into(),
                value_from: Some(EnvVarSource {
                    secret_key_ref: Some(SecretKeySelector {
                        name: "s-env".into(),
                        key: "k".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let p = Pod {
            spec: Some(PodSpec {
                containers: vec![c],
                image_pull_secrets: Some(vec![LocalObjectReference {
                    name: "pull".into(),
                }]),
                volumes: Some(vec![
                    Volume {
                        name: "a".into(),
                        config_map: Some(ConfigMapVolumeSource {
                            name: "cm-vol".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                    Volume {
                        name: "b".into(),
                        secret: Some(SecretVolumeSource {
                            secret_name: Some("s-vol".into()),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let r = ReferencedObjects::of_pod(&p);
        assert_eq!(r.config_maps, vec!["cm-env", "cm-vol"]);
        assert_eq!(r.secrets, vec!["pull", "s-env", "s-vol"]);
    }
}
