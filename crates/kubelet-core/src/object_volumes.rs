//! The `configMap` and `secret` volume plugins: the object's keys as files, written with the
//! [`AtomicWriter`] layout (`..data` symlink swapped atomically) and rewritten on a later sync
//! only when the content changed. The objects come from the agent's [`ObjectProvider`].
//!
//! Semantics follow the kubelet's plugins: without `items` every key becomes a file named after
//! it; with `items` only the listed keys, each at its `path` with its own `mode` or the volume's
//! `defaultMode` (0644 when unset, for both kinds); a missing object gives an empty volume when
//! `optional`, an error (`configmap "x" not found`) otherwise; a missing key listed in `items`
//! is skipped when `optional`, an error otherwise.
//!
//! `downwardAPI` volumes ([`DownwardApiPlugin`]) project the pod's own metadata and its
//! containers' resources ([`crate::downward`]) with the same layout; they are rewritten on the
//! pod's next sync when a label or annotation changes (an update of the pod syncs it at once).
//!
//! Deliberate difference: the kubelet backs secret volumes with tmpfs; these write to the node
//! filesystem under the pod directory (docs/architecture.md).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{KeyToPath, Pod, Volume};

use crate::atomic_writer::{AtomicWriter, FileProjection, Payload};
use crate::error::{Error, ErrorKind, Result};
use crate::objects::ObjectProvider;
use crate::pod;
use crate::volume::VolumePlugin;

/// Mode of projected files when the volume sets none (the API's default).
pub const DEFAULT_MODE: i32 = 0o644;

/// Keys (`key` → bytes) of an object, before `items` are applied.
type Keys = Vec<(String, Vec<u8>)>;

/// Build the payload of a volume from the object's keys (`MakePayload`).
fn make_payload(
    keys: Option<&Keys>,
    items: Option<&[KeyToPath]>,
    default_mode: Option<i32>,
    optional: bool,
    missing_key: &str,
) -> Result<Payload> {
    let default_mode = default_mode.unwrap_or(DEFAULT_MODE);
    let mode = |m: i32| (m as u32) & 0o7777;
    let mut out = Payload::new();
    let empty = Keys::new();
    let keys = keys.unwrap_or(&empty);
    match items {
        None | Some([]) => {
            for (k, v) in keys {
                out.insert(
                    k.clone(),
                    FileProjection {
                        data: v.clone(),
                        mode: mode(default_mode),
                    },
                );
            }
        }
        Some(items) => {
            for item in items {
                let Some((_, data)) = keys.iter().find(|(k, _)| k == &item.key) else {
                    if optional {
                        continue;
                    }
                    return Err(Error::new(
                        ErrorKind::NotFound,
                        format!("{missing_key}: {}", item.key),
                    ));
                };
                out.insert(
                    item.path.clone(),
                    FileProjection {
                        data: data.clone(),
                        mode: mode(item.mode.unwrap_or(default_mode)),
                    },
                );
            }
        }
    }
    Ok(out)
}

async fn write(dir: &Path, payload: Payload) -> Result<bool> {
    let writer = AtomicWriter::new(dir);
    tokio::task::spawn_blocking(move || writer.write(&payload))
        .await
        .map_err(|e| Error::internal(format!("volume writer task failed: {e}")))?
}

async fn remove(dir: &Path) -> Result<()> {
    match tokio::fs::remove_dir_all(dir).await {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn no_provider(kind: &str, volume: &Volume) -> Error {
    Error::new(
        ErrorKind::FailedPrecondition,
        format!(
            "cannot setup {kind} volume {} because no ConfigMap/Secret provider is configured (KubeletBuilder::object_provider)",
            volume.name
        ),
    )
}

/// `configMap` volumes (`kubernetes.io~configmap`).
#[derive(Clone)]
pub struct ConfigMapPlugin {
    provider: Option<Arc<dyn ObjectProvider>>,
}

impl std::fmt::Debug for ConfigMapPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigMapPlugin")
            .field("provider", &self.provider.is_some())
            .finish()
    }
}

impl ConfigMapPlugin {
    /// A plugin reading ConfigMaps from `provider`; `None` makes every set-up fail with a clear
    /// error (an agent without an API server).
    pub fn new(provider: Option<Arc<dyn ObjectProvider>>) -> Self {
        Self { provider }
    }
}

#[async_trait]
impl VolumePlugin for ConfigMapPlugin {
    fn name(&self) -> &str {
        "kubernetes.io~configmap"
    }

    fn can_support(&self, volume: &Volume) -> bool {
        volume.config_map.is_some()
    }

    async fn set_up(&self, pod: &Pod, volume: &Volume, dir: &Path) -> Result<PathBuf> {
        let Some(src) = &volume.config_map else {
            return Err(Error::invalid_argument(format!(
                "volume {:?} is not a configMap volume",
                volume.name
            )));
        };
        let provider = self
            .provider
            .as_ref()
            .ok_or_else(|| no_provider("configMap", volume))?;
        let optional = src.optional.unwrap_or(false);
        let keys = match provider.config_map(pod::namespace(pod), &src.name).await? {
            Some(cm) => Some(
                cm.data
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k, v.into_bytes()))
                    .chain(cm.binary_data.into_iter().flatten().map(|(k, v)| (k, v.0)))
                    .collect::<Keys>(),
            ),
            None if optional => None,
            None => {
                return Err(Error::not_found(format!(
                    "configmap {:?} not found",
                    src.name
                )));
            }
        };
        let payload = make_payload(
            keys.as_ref(),
            src.items.as_deref(),
            src.default_mode,
            optional,
            "configmap references non-existent config key",
        )?;
        if write(dir, payload).await? {
            tracing::debug!(pod = %pod::full_name(pod), volume = %volume.name, "configMap volume written");
        }
        Ok(dir.to_path_buf())
    }

    async fn tear_down(&self, _volume_name: &str, dir: &Path) -> Result<()> {
        remove(dir).await
    }
}

/// `secret` volumes (`kubernetes.io~secret`).
#[derive(Clone)]
pub struct SecretPlugin {
    provider: Option<Arc<dyn ObjectProvider>>,
}

impl std::fmt::Debug for SecretPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretPlugin")
            .field("provider", &self.provider.is_some())
            .finish()
    }
}

impl SecretPlugin {
    /// A plugin reading Secrets from `provider`; `None` makes every set-up fail with a clear
    /// error.
    pub fn new(provider: Option<Arc<dyn ObjectProvider>>) -> Self {
        Self { provider }
    }
}

#[async_trait]
impl VolumePlugin for SecretPlugin {
    fn name(&self) -> &str {
        "kubernetes.io~secret"
    }

    fn can_support(&self, volume: &Volume) -> bool {
        volume.secret.is_some()
    }

    async fn set_up(&self, pod: &Pod, volume: &Volume, dir: &Path) -> Result<PathBuf> {
        let Some(src) = &volume.secret else {
            return Err(Error::invalid_argument(format!(
                "volume {:?} is not a secret volume",
                volume.name
            )));
        };
        let provider = self
            .provider
            .as_ref()
            .ok_or_else(|| no_provider("secret", volume))?;
        let name = src.secret_name.clone().unwrap_or_default();
        if name.is_empty() {
            return Err(Error::invalid_argument(format!(
                "secret volume {:?} names no secret",
                volume.name
            )));
        }
        let optional = src.optional.unwrap_or(false);
        let keys = match provider.secret(pod::namespace(pod), &name).await? {
            Some(s) => Some(
                s.data
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k, v.0))
                    .collect::<Keys>(),
            ),
            None if optional => None,
            None => return Err(Error::not_found(format!("secret {name:?} not found"))),
        };
        let payload = make_payload(
            keys.as_ref(),
            src.items.as_deref(),
            src.default_mode,
            optional,
            "secret references non-existent secret key",
        )?;
        if write(dir, payload).await? {
            tracing::debug!(pod = %pod::full_name(pod), volume = %volume.name, "secret volume written");
        }
        Ok(dir.to_path_buf())
    }

    async fn tear_down(&self, _volume_name: &str, dir: &Path) -> Result<()> {
        remove(dir).await
    }
}

/// `downwardAPI` volumes (`kubernetes.io~downward-api`): each item's `fieldRef`
/// (`metadata.name`, `namespace`, `uid`, `labels`, `annotations`, or one label or annotation)
/// or `resourceFieldRef` (a container's limit or request, divided by `divisor`, a missing limit
/// being the node's capacity) as a file.
#[derive(Debug, Clone)]
pub struct DownwardApiPlugin {
    node: crate::downward::NodeCapacity,
}

impl Default for DownwardApiPlugin {
    fn default() -> Self {
        Self::new()
    }
}

impl DownwardApiPlugin {
    /// A plugin that gives containers without a limit this host's CPUs and memory.
    pub fn new() -> Self {
        Self {
            node: crate::downward::NodeCapacity::of_host(),
        }
    }

    /// Give containers without a limit `node` instead (e.g. the node's allocatable).
    pub fn with_node_capacity(mut self, node: crate::downward::NodeCapacity) -> Self {
        self.node = node;
        self
    }

    fn payload(&self, pod: &Pod, volume: &Volume) -> Result<Payload> {
        let Some(src) = &volume.downward_api else {
            return Err(Error::invalid_argument(format!(
                "volume {:?} is not a downwardAPI volume",
                volume.name
            )));
        };
        let default_mode = src.default_mode.unwrap_or(DEFAULT_MODE);
        let mut out = Payload::new();
        for item in src.items.iter().flatten() {
            let bad = |m: String| {
                Error::invalid_argument(format!(
                    "downwardAPI volume {:?}, item {:?}: {m}",
                    volume.name, item.path
                ))
            };
            let value = if let Some(f) = &item.field_ref {
                crate::downward::field_path_value(pod, &f.field_path).map_err(bad)?
            } else if let Some(r) = &item.resource_field_ref {
                let name = r.container_name.as_deref().unwrap_or_default();
                let spec = pod.spec.as_ref();
                let container = spec
                    .into_iter()
                    .flat_map(|s| {
                        s.containers
                            .iter()
                            .chain(s.init_containers.iter().flatten())
                    })
                    .find(|c| c.name == name)
                    .ok_or_else(|| bad(format!("container {name:?} not found in the pod")))?;
                crate::downward::container_resource_value(
                    container,
                    &r.resource,
                    r.divisor.as_ref(),
                    &self.node,
                )
                .map_err(bad)?
            } else {
                return Err(bad("neither fieldRef nor resourceFieldRef is set".into()));
            };
            out.insert(
                item.path.clone(),
                FileProjection {
                    data: value.into_bytes(),
                    mode: (item.mode.unwrap_or(default_mode) as u32) & 0o7777,
                },
            );
        }
        Ok(out)
    }
}

#[async_trait]
impl VolumePlugin for DownwardApiPlugin {
    fn name(&self) -> &str {
        "kubernetes.io~downward-api"
    }

    fn can_support(&self, volume: &Volume) -> bool {
        volume.downward_api.is_some()
    }

    async fn set_up(&self, pod: &Pod, volume: &Volume, dir: &Path) -> Result<PathBuf> {
        let payload = self.payload(pod, volume)?;
        if write(dir, payload).await? {
            tracing::debug!(pod = %pod::full_name(pod), volume = %volume.name, "downwardAPI volume written");
        }
        Ok(dir.to_path_buf())
    }

    async fn tear_down(&self, _volume_name: &str, dir: &Path) -> Result<()> {
        remove(dir).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::StaticObjects;
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::{
        ConfigMap, ConfigMapVolumeSource, Secret, SecretVolumeSource,
    };
    use std::collections::BTreeMap;
    use std::os::unix::fs::PermissionsExt;

    fn tempdir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "object-volumes-{}-{}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::create_dir_all(&d).expect("tempdir");
        d
    }

    fn pod() -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("p".into());
        p.metadata.namespace = Some("ns".into());
        p.metadata.uid = Some("u".into());
        p
    }

    fn cm(data: &[(&str, &str)]) -> ConfigMap {
        let mut c = ConfigMap {
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        };
        c.metadata.name = Some("cfg".into());
        c.metadata.namespace = Some("ns".into());
        c
    }

    fn cm_volume(items: Option<Vec<KeyToPath>>, optional: bool) -> Volume {
        Volume {
            name: "v".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: "cfg".into(),
                items,
                optional: Some(optional),
                default_mode: None,
            }),
            ..Default::default()
        }
    }

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).expect("meta").permissions().mode() & 0o777
    }

    #[tokio::test]
    async fn config_map_volume_projects_keys_and_follows_updates() {
        let dir = tempdir();
        let store = StaticObjects::new();
        store.put_config_map(cm(&[("a", "1"), ("b", "2")]));
        let plugin = ConfigMapPlugin::new(Some(Arc::new(store.clone())));
        let vol = dir.join("v");
        plugin
            .set_up(&pod(), &cm_volume(None, false), &vol)
            .await
            .expect("set up");
        assert_eq!(std::fs::read_to_string(vol.join("a")).expect("a"), "1");
        assert_eq!(mode(&vol.join("b")), 0o644);
        store.put_config_map(cm(&[("a", "changed")]));
        plugin
            .set_up(&pod(), &cm_volume(None, false), &vol)
            .await
            .expect("resync");
        assert_eq!(
            std::fs::read_to_string(vol.join("a")).expect("a"),
            "changed"
        );
        assert!(
            std::fs::symlink_metadata(vol.join("b")).is_err(),
            "b removed"
        );
        plugin.tear_down("v", &vol).await.expect("tear down");
        assert!(!vol.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn items_select_keys_with_paths_and_modes() {
        let dir = tempdir();
        let store = StaticObjects::new();
        store.put_config_map(cm(&[("a", "1"), ("b", "2")]));
        let plugin = ConfigMapPlugin::new(Some(Arc::new(store)));
        let items = vec![KeyToPath {
            key: "b".into(),
            path: "sub/b.txt".into(),
            mode: Some(0o600),
        }];
        let vol = dir.join("v");
        plugin
            .set_up(&pod(), &cm_volume(Some(items.clone()), false), &vol)
            .await
            .expect("set up");
        assert_eq!(
            std::fs::read_to_string(vol.join("sub/b.txt")).expect("b"),
            "2"
        );
        assert_eq!(mode(&vol.join("sub/b.txt")), 0o600);
        assert!(std::fs::symlink_metadata(vol.join("a")).is_err());

        let missing = vec![KeyToPath {
            key: "nope".into(),
            path: "x".into(),
            mode: None,
        }];
        let err = plugin
            .set_up(&pod(), &cm_volume(Some(missing.clone()), false), &vol)
            .await
            .expect_err("missing key");
        assert_eq!(
            err.message(),
            "configmap references non-existent config key: nope"
        );
        plugin
            .set_up(&pod(), &cm_volume(Some(missing), true), &vol)
            .await
            .expect("optional key skipped");

        let traversal = vec![KeyToPath {
            key: "a".into(),
            path: "../../etc/x".into(),
            mode: None,
        }];
        let err = plugin
            .set_up(&pod(), &cm_volume(Some(traversal), false), &vol)
            .await
            .expect_err("traversal");
        assert!(err.message().contains("must not contain '..'"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn missing_objects_are_errors_unless_optional() {
        let dir = tempdir();
        let plugin = ConfigMapPlugin::new(Some(Arc::new(StaticObjects::new())));
        let vol = dir.join("v");
        let err = plugin
            .set_up(&pod(), &cm_volume(None, false), &vol)
            .await
            .expect_err("required");
        assert_eq!(err.message(), "configmap \"cfg\" not found");
        let path = plugin
            .set_up(&pod(), &cm_volume(None, true), &vol)
            .await
            .expect("optional gives an empty volume");
        assert!(path.join("..data").exists());

        let secrets = SecretPlugin::new(Some(Arc::new(StaticObjects::new())));
        let sv = Volume {
            name: "s".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some("tls".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let err = secrets
            .set_up(&pod(), &sv, &dir.join("s"))
            .await
            .expect_err("required secret");
        assert_eq!(err.message(), "secret \"tls\" not found");

        let none = ConfigMapPlugin::new(None);
        let err = none
            .set_up(&pod(), &cm_volume(None, true), &vol)
            .await
            .expect_err("no provider");
        assert!(
            err.message().contains("no ConfigMap/Secret provider"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn secret_volume_writes_bytes_with_default_mode() {
        let dir = tempdir();
        let store = StaticObjects::new();
        let mut s = Secret {
            data: Some(BTreeMap::from([(
                "key".to_string(),
                ByteString(vec![0, 1, 2, 255]),
            )])),
            ..Default::default()
        };
        s.metadata.name = Some("tls".into());
        s.metadata.namespace = Some("ns".into());
        store.put_secret(s);
        let plugin = SecretPlugin::new(Some(Arc::new(store)));
        let sv = Volume {
            name: "s".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some("tls".into()),
                default_mode: Some(0o400),
                ..Default::default()
            }),
            ..Default::default()
        };
        let vol = dir.join("s");
        plugin.set_up(&pod(), &sv, &vol).await.expect("set up");
        assert_eq!(
            std::fs::read(vol.join("key")).expect("key"),
            vec![0, 1, 2, 255]
        );
        assert_eq!(mode(&vol.join("key")), 0o400);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn downward_api_volume_writes_metadata_and_follows_label_changes() {
        use k8s_openapi::api::core::v1::{
            DownwardAPIVolumeFile, DownwardAPIVolumeSource, ObjectFieldSelector,
            ResourceFieldSelector,
        };
        let dir = tempdir();
        let item = |path: &str, field: &str| DownwardAPIVolumeFile {
            path: path.into(),
            field_ref: Some(ObjectFieldSelector {
                field_path: field.into(),
                api_version: None,
            }),
            ..Default::default()
        };
        let mut resource = DownwardAPIVolumeFile {
            path: "mem".into(),
            resource_field_ref: Some(ResourceFieldSelector {
                container_name: Some("app".into()),
                resource: "limits.memory".into(),
                divisor: Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(
                    "1Mi".into(),
                )),
            }),
            mode: Some(0o600),
            ..Default::default()
        };
        let volume = Volume {
            name: "info".into(),
            downward_api: Some(DownwardAPIVolumeSource {
                items: Some(vec![
                    item("labels", "metadata.labels"),
                    item("name", "metadata.name"),
                    item("sub/tier", "metadata.labels['tier']"),
                    resource.clone(),
                ]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut p = pod();
        p.metadata.labels = Some(BTreeMap::from([("tier".to_string(), "web".to_string())]));
        p.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            containers: vec![k8s_openapi::api::core::v1::Container {
                name: "app".into(),
                ..Default::default()
            }],
            ..Default::default()
        });
        let plugin = DownwardApiPlugin::new().with_node_capacity(crate::downward::NodeCapacity {
            cpu_milli: 2000,
            memory_bytes: 512 << 20,
            ephemeral_storage_bytes: 0,
        });
        assert!(plugin.can_support(&volume));
        let out = plugin.set_up(&p, &volume, &dir).await.expect("set up");
        let read = |f: &str| std::fs::read_to_string(out.join(f)).expect("file");
        assert_eq!(read("labels"), "tier=\"web\"");
        assert_eq!(read("name"), pod::name(&p));
        assert_eq!(read("sub/tier"), "web");
        assert_eq!(read("mem"), "512");
        assert_eq!(mode(&out.join("mem")), 0o600);
        assert_eq!(mode(&out.join("name")), 0o644);

        // A label change reaches the files on the next set-up, through the atomic swap.
        let before = std::fs::read_link(out.join("..data")).expect("..data");
        p.metadata.labels = Some(BTreeMap::from([("tier".to_string(), "db".to_string())]));
        plugin.set_up(&p, &volume, &dir).await.expect("set up");
        assert_eq!(read("labels"), "tier=\"db\"");
        assert_eq!(read("sub/tier"), "db");
        assert_ne!(
            std::fs::read_link(out.join("..data")).expect("..data"),
            before
        );

        // Bad items are errors naming the volume and the item.
        resource
            .resource_field_ref
            .as_mut()
            .expect("ref")
            .container_name = Some("nope".into());
        let bad = Volume {
            name: "info".into(),
            downward_api: Some(DownwardAPIVolumeSource {
                items: Some(vec![resource, item("node", "spec.nodeName")]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let e = plugin.set_up(&p, &bad, &dir).await.expect_err("bad item");
        assert!(
            e.message()
                .contains("\"mem\": container \"nope\" not found"),
            "{e}"
        );
        assert_eq!(read("labels"), "tier=\"db\"", "the old content stays");
        plugin.tear_down("info", &dir).await.expect("tear down");
        assert!(!dir.exists());
    }
}
