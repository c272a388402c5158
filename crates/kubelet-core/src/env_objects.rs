//! [`EnvObjects`]: the ConfigMaps, Secrets and Service variables one container's environment
//! needs, fetched from the [`ObjectProvider`] before its config is generated.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret};
use kubelet_api::objects::container_refs;
use kubelet_api::{Lookup, ObjectProvider, pod};

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

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
    use kubelet_api::Result;

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
            Err(kubelet_api::Error::new(
                kubelet_api::ErrorKind::Unavailable,
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
                kubelet_api::annotations::CONFIG_SOURCE.to_string(),
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
                kubelet_api::annotations::CONFIG_SOURCE.to_string(),
                "file".to_string(),
            )]
            .into(),
        );
        let e = EnvObjects::fetch(&Unsynced, &file, &c).await;
        assert!(e.service_env().is_ok_and(|m| m.is_empty()));
    }
}
