//! The [`ObjectProvider`] seam: where the engine gets the ConfigMaps and Secrets that pods

use std::collections::BTreeMap;

use async_trait::async_trait;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::node::v1::RuntimeClass;
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
    /// ServiceAccount `name` in `namespace`, for its `imagePullSecrets` when a pod names none
    /// (`Ok(None)`: it does not exist). The default knows none: an agent without an API server
    /// pulls with the pod's own secrets only.
    async fn service_account(&self, namespace: &str, name: &str) -> Result<Option<ServiceAccount>> {
        let _ = (namespace, name);
        Ok(None)
    }
    /// Every Service of the cluster, for the pods' service environment variables
    /// (the engine's `services` module); called for every container start, so it must be a cheap read
    /// (a watch cache). `Ok(None)`, the default: this provider knows no Services (no variables,
    /// as a kubelet without an API server). An error (the cache has not been filled yet) fails
    /// the start of an API pod with `CreateContainerConfigError`, retried; static pods start
    /// without the variables.
    fn services(&self) -> Result<Option<Vec<std::sync::Arc<Service>>>> {
        Ok(None)
    }
    /// RuntimeClass `name` (cluster-scoped), whose `handler` a pod with that
    /// `runtimeClassName` runs with (`Ok(None)`: it does not exist; the pod's sandbox is then
    /// not created, as the kubelet's `runtimeClass "x" not found`). The default knows none.
    async fn runtime_class(&self, name: &str) -> Result<Option<RuntimeClass>> {
        let _ = name;
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

/// ConfigMap and Secret names container `c`'s environment references (`envFrom` and
/// `valueFrom`), in the order of the spec, with duplicates.
pub fn container_refs(c: &Container) -> (Vec<String>, Vec<String>) {
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

/// The outcome of looking one object up (a closed set: exists, does not, or failed).
#[derive(Debug, Clone, PartialEq)]
pub enum Lookup<T> {
    /// The object exists.
    Found(T),
    /// The object does not exist.
    NotFound,
    /// The provider failed; the message is reported as the container's config error.
    Failed(String),
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
    service_accounts: BTreeMap<(String, String), ServiceAccount>,
    runtime_classes: BTreeMap<String, RuntimeClass>,
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

    /// Add or replace a ServiceAccount (namespace `default` when unset): its
    /// `imagePullSecrets` serve pods that name none.
    pub fn put_service_account(&self, sa: ServiceAccount) {
        self.inner
            .write()
            .service_accounts
            .insert(key_of(&sa.metadata), sa);
    }

    /// Add or replace a RuntimeClass.
    pub fn put_runtime_class(&self, rc: RuntimeClass) {
        let name = rc.metadata.name.clone().unwrap_or_default();
        self.inner.write().runtime_classes.insert(name, rc);
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

    async fn service_account(&self, namespace: &str, name: &str) -> Result<Option<ServiceAccount>> {
        Ok(self
            .inner
            .read()
            .service_accounts
            .get(&(namespace.to_string(), name.to_string()))
            .cloned())
    }

    async fn runtime_class(&self, name: &str) -> Result<Option<RuntimeClass>> {
        Ok(self.inner.read().runtime_classes.get(name).cloned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ConfigMapEnvSource, ConfigMapVolumeSource, EnvFromSource, EnvVar, EnvVarSource,
        LocalObjectReference, PodSpec, SecretKeySelector, SecretVolumeSource, Volume,
    };

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
