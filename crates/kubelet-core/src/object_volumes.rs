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

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{DownwardAPIVolumeFile, KeyToPath, Pod, Volume};
use parking_lot::Mutex;

use crate::atomic_writer::{AtomicWriter, FileProjection, Payload};
use crate::error::{Error, ErrorKind, Result};
use kubelet_api::ObjectProvider;
use kubelet_api::VolumePlugin;
use kubelet_api::pod;

/// Mode of projected files when the volume sets none (the API's default).
pub(crate) const DEFAULT_MODE: i32 = 0o644;

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

/// Write `payload` and, when it changed and the pod has an `fsGroup`, give the volume's files
/// to that group as the kubelet's `SetVolumeOwnership` does for read-only volumes.
async fn write_owned(dir: &Path, payload: Payload, fs_group: Option<i64>) -> Result<bool> {
    let writer = AtomicWriter::new(dir);
    let root = dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let changed = writer.write(&payload)?;
        if changed && let Some(gid) = fs_group.and_then(|g| u32::try_from(g).ok()) {
            set_volume_ownership(&root, gid);
        }
        Ok(changed)
    })
    .await
    .map_err(|e| Error::internal(format!("volume writer task failed: {e}")))?
}

/// The user every container of the pod runs as, when they all set the same one (the kubelet's
/// `FsUserFrom`): the owner of service-account token files.
fn fs_user(pod: &Pod) -> Option<i64> {
    let spec = pod.spec.as_ref()?;
    let pod_user = spec.security_context.as_ref().and_then(|s| s.run_as_user);
    let mut user = None;
    for c in spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
    {
        let u = c
            .security_context
            .as_ref()
            .and_then(|s| s.run_as_user)
            .or(pod_user)?;
        match user {
            Some(prev) if prev != u => return None,
            _ => user = Some(u),
        }
    }
    user
}

/// The pod's `fsGroup`.
fn fs_group(pod: &Pod) -> Option<i64> {
    pod.spec.as_ref()?.security_context.as_ref()?.fs_group
}

/// The kubelet's `SetVolumeOwnership` for a read-only volume: every file and directory below
/// `dir` (symlinks left alone) gets group `gid` and the group read bit (`0440` added);
/// directories also get setgid and the execute bits (`0110`). Best effort: without the
/// privilege to change ownership the files keep the agent's group, logged once.
fn set_volume_ownership(dir: &Path, gid: u32) {
    use std::os::unix::fs::PermissionsExt;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            continue;
        }
        if let Err(e) = std::os::unix::fs::lchown(&path, None, Some(gid)) {
            tracing::warn!(path = %path.display(), gid, error = %kubelet_api::chain(&e), "setting the fsGroup of a volume failed");
            return;
        }
        let mut mask = 0o440;
        if meta.is_dir() {
            mask |= 0o2110;
            if let Ok(entries) = std::fs::read_dir(&path) {
                stack.extend(entries.flatten().map(|e| e.path()));
            }
        }
        let mode = meta.permissions().mode() & 0o7777;
        if mode | mask != mode {
            let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode | mask));
        }
    }
}

async fn remove(dir: &Path) -> Result<()> {
    match tokio::fs::remove_dir_all(dir).await {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The keys of ConfigMap `name` in the pod's namespace: `None` when it is missing and
/// `optional`, the kubelet's `configmap "x" not found` when it is missing otherwise.
async fn config_map_keys(
    provider: &dyn ObjectProvider,
    pod: &Pod,
    name: &str,
    optional: bool,
) -> Result<Option<Keys>> {
    match provider.config_map(pod::namespace(pod), name).await? {
        Some(cm) => Ok(Some(
            cm.data
                .into_iter()
                .flatten()
                .map(|(k, v)| (k, v.into_bytes()))
                .chain(cm.binary_data.into_iter().flatten().map(|(k, v)| (k, v.0)))
                .collect(),
        )),
        None if optional => Ok(None),
        None => Err(Error::not_found(format!("configmap {name:?} not found"))),
    }
}

/// The keys of Secret `name` in the pod's namespace, as [`config_map_keys`].
async fn secret_keys(
    provider: &dyn ObjectProvider,
    pod: &Pod,
    name: &str,
    optional: bool,
) -> Result<Option<Keys>> {
    match provider.secret(pod::namespace(pod), name).await? {
        Some(s) => Ok(Some(
            s.data
                .into_iter()
                .flatten()
                .map(|(k, v)| (k, v.0))
                .collect(),
        )),
        None if optional => Ok(None),
        None => Err(Error::not_found(format!("secret {name:?} not found"))),
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
pub(crate) struct ConfigMapPlugin {
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
    pub(crate) fn new(provider: Option<Arc<dyn ObjectProvider>>) -> Self {
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
        let keys = config_map_keys(provider.as_ref(), pod, &src.name, optional).await?;
        let payload = make_payload(
            keys.as_ref(),
            src.items.as_deref(),
            src.default_mode,
            optional,
            "configmap references non-existent config key",
        )?;
        if write_owned(dir, payload, fs_group(pod)).await? {
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
pub(crate) struct SecretPlugin {
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
    pub(crate) fn new(provider: Option<Arc<dyn ObjectProvider>>) -> Self {
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
        let keys = secret_keys(provider.as_ref(), pod, &name, optional).await?;
        let payload = make_payload(
            keys.as_ref(),
            src.items.as_deref(),
            src.default_mode,
            optional,
            "secret references non-existent secret key",
        )?;
        if write_owned(dir, payload, fs_group(pod)).await? {
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
pub(crate) struct DownwardApiPlugin {
    node: crate::downward::NodeCapacity,
}

impl Default for DownwardApiPlugin {
    fn default() -> Self {
        Self::new()
    }
}

impl DownwardApiPlugin {
    /// A plugin that gives containers without a limit this host's CPUs and memory.
    pub(crate) fn new() -> Self {
        Self {
            node: crate::downward::NodeCapacity::of_host(),
        }
    }

    /// Give containers without a limit `node` instead (e.g. the node's allocatable).
    #[cfg(test)]
    pub(crate) fn with_node_capacity(mut self, node: crate::downward::NodeCapacity) -> Self {
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
        let mut out = Payload::new();
        self.add_items(
            pod,
            src.items.as_deref().unwrap_or_default(),
            src.default_mode.unwrap_or(DEFAULT_MODE),
            &volume.name,
            &mut out,
        )?;
        Ok(out)
    }

    /// Add the files of downwardAPI `items` (of a `downwardAPI` volume or a projected source).
    fn add_items(
        &self,
        pod: &Pod,
        items: &[DownwardAPIVolumeFile],
        default_mode: i32,
        volume_name: &str,
        out: &mut Payload,
    ) -> Result<()> {
        for item in items {
            let bad = |m: String| {
                Error::invalid_argument(format!(
                    "downwardAPI volume {volume_name:?}, item {:?}: {m}",
                    item.path
                ))
            };
            let value = if let Some(f) = &item.field_ref {
                crate::downward::field_path_value(pod, &f.field_path)
                    .map_err(|e| bad(e.to_string()))?
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
                .map_err(|e| bad(e.to_string()))?
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
        Ok(())
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
        if write_owned(dir, payload, fs_group(pod)).await? {
            tracing::debug!(pod = %pod::full_name(pod), volume = %volume.name, "downwardAPI volume written");
        }
        Ok(dir.to_path_buf())
    }

    async fn tear_down(&self, _volume_name: &str, dir: &Path) -> Result<()> {
        remove(dir).await
    }
}

/// `projected` volumes (`kubernetes.io~projected`): the files of several sources in one
/// directory, written with the same atomic layout and rewritten on every sync when they change:
///
/// * `configMap` and `secret` sources, as the single-source volumes (`items`, `optional`, the
///   volume's `defaultMode` or an item's `mode`);
/// * `downwardAPI` sources, as the `downwardAPI` volume;
/// * `serviceAccountToken` sources: a token of the pod's service account from the TokenRequest
///   API ([`ObjectProvider::request_service_account_token`]), bound to the pod, for the
///   source's `audience` (the API server's audiences when empty) and `expirationSeconds`
///   (3600 by default). A token is requested again once 80 % of its lifetime has passed or it
///   is 24 hours old (the kubelet's token manager); when that fails and the old token is still
///   valid, the old one stays (logged). Every pod of a Kubernetes ≥ 1.21 cluster has such a
///   volume (`kube-api-access-*`: token, `ca.crt` from the `kube-root-ca.crt` ConfigMap and
///   the namespace).
///
/// With the pod's `fsGroup` the files belong to that group, readable by it. `clusterTrustBundle`
/// and `podCertificate` sources are rejected with a clear error.
pub(crate) struct ProjectedPlugin {
    provider: Option<Arc<dyn ObjectProvider>>,
    downward: DownwardApiPlugin,
    tokens: Mutex<HashMap<TokenKey, CachedToken>>,
}

impl std::fmt::Debug for ProjectedPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProjectedPlugin")
            .field("provider", &self.provider.is_some())
            .field("cached_tokens", &self.tokens.lock().len())
            .finish()
    }
}

/// What a cached token was requested for: namespace, service account, audiences, lifetime
/// and the pod it is bound to (the kubelet's token manager key).
type TokenKey = (String, String, Vec<String>, i64, String);

#[derive(Debug, Clone)]
struct CachedToken {
    token: String,
    issued: jiff::Timestamp,
    expires: jiff::Timestamp,
}

impl CachedToken {
    /// Older than 80 % of its lifetime or than 24 hours (`requiresRefresh`).
    fn requires_refresh(&self, now: jiff::Timestamp) -> bool {
        let ttl = self.expires.duration_since(self.issued);
        let age = now.duration_since(self.issued);
        age >= jiff::SignedDuration::from_hours(24) || age * 5 >= ttl * 4
    }
}

/// The token and its expiry from a TokenRequest answer.
fn issued_token(answer: &TokenRequest, now: jiff::Timestamp) -> Result<CachedToken> {
    let value = serde_json::to_value(answer)
        .map_err(|e| Error::internal(format!("reading the TokenRequest answer: {e}")))?;
    let status = &value["status"];
    let token = status["token"]
        .as_str()
        .filter(|t| !t.is_empty())
        .ok_or_else(|| Error::internal("the TokenRequest answer has no token".to_string()))?;
    let expires = status["expirationTimestamp"]
        .as_str()
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        .ok_or_else(|| {
            Error::internal("the TokenRequest answer has no expiration timestamp".to_string())
        })?;
    Ok(CachedToken {
        token: token.to_string(),
        issued: now,
        expires,
    })
}

/// The lifetime a `serviceAccountToken` source asks for when it sets none (the API's default).
pub(crate) const DEFAULT_TOKEN_EXPIRATION_SECONDS: i64 = 3600;

impl ProjectedPlugin {
    /// A plugin reading objects and tokens from `provider`; `None` makes every source but
    /// `downwardAPI` fail with a clear error.
    pub(crate) fn new(provider: Option<Arc<dyn ObjectProvider>>) -> Self {
        Self {
            provider,
            downward: DownwardApiPlugin::new(),
            tokens: Mutex::new(HashMap::new()),
        }
    }

    fn provider(&self, volume: &Volume) -> Result<&Arc<dyn ObjectProvider>> {
        self.provider
            .as_ref()
            .ok_or_else(|| no_provider("projected", volume))
    }

    /// The token for `source` of `pod`, from the cache while it needs no refresh.
    async fn token(
        &self,
        pod: &Pod,
        volume: &Volume,
        source: &k8s_openapi::api::core::v1::ServiceAccountTokenProjection,
    ) -> Result<String> {
        let namespace = pod::namespace(pod).to_string();
        let service_account = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".into());
        let audiences: Vec<String> = source
            .audience
            .iter()
            .filter(|a| !a.is_empty())
            .cloned()
            .collect();
        let expiration = source
            .expiration_seconds
            .unwrap_or(DEFAULT_TOKEN_EXPIRATION_SECONDS);
        let key: TokenKey = (
            namespace.clone(),
            service_account.clone(),
            audiences.clone(),
            expiration,
            pod::uid(pod).to_string(),
        );
        let now = jiff::Timestamp::now();
        let cached = {
            let mut tokens = self.tokens.lock();
            // Expired tokens of any pod are of no use any more.
            tokens.retain(|_, t| t.expires > now);
            tokens.get(&key).cloned()
        };
        if let Some(t) = &cached
            && !t.requires_refresh(now)
        {
            return Ok(t.token.clone());
        }
        // Built and read through JSON: the shape of `TokenRequest` differs between the
        // Kubernetes versions the application may pick (its fields became optional in 1.37).
        let request: TokenRequest = serde_json::from_value(serde_json::json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": audiences,
                "expirationSeconds": expiration,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod::name(pod),
                    "uid": pod::uid(pod),
                },
            },
        }))
        .map_err(|e| Error::internal(format!("building a TokenRequest: {e}")))?;
        let answer = self
            .provider(volume)?
            .request_service_account_token(&namespace, &service_account, &request)
            .await
            .and_then(|tr| issued_token(&tr, now));
        match (answer, cached) {
            (Ok(fresh), _) => {
                let token = fresh.token.clone();
                self.tokens.lock().insert(key, fresh);
                Ok(token)
            }
            (Err(e), Some(old)) if old.expires > now => {
                tracing::warn!(pod = %pod::full_name(pod), serviceAccount = %service_account, error = %kubelet_api::chain(&e), "refreshing a service account token failed; the current one stays until it expires");
                Ok(old.token)
            }
            (Err(e), _) => Err(Error::new(
                e.kind(),
                format!(
                    "failed to fetch token for service account {namespace}/{service_account}: {}",
                    e.message()
                ),
            )),
        }
    }

    async fn payload(&self, pod: &Pod, volume: &Volume) -> Result<Payload> {
        let Some(src) = &volume.projected else {
            return Err(Error::invalid_argument(format!(
                "volume {:?} is not a projected volume",
                volume.name
            )));
        };
        let default_mode = src.default_mode.unwrap_or(DEFAULT_MODE);
        let mut out = Payload::new();
        for source in src.sources.iter().flatten() {
            if let Some(c) = &source.config_map {
                let optional = c.optional.unwrap_or(false);
                let keys = config_map_keys(self.provider(volume)?.as_ref(), pod, &c.name, optional)
                    .await?;
                out.extend(make_payload(
                    keys.as_ref(),
                    c.items.as_deref(),
                    Some(default_mode),
                    optional,
                    "configmap references non-existent config key",
                )?);
            } else if let Some(sec) = &source.secret {
                let optional = sec.optional.unwrap_or(false);
                let keys =
                    secret_keys(self.provider(volume)?.as_ref(), pod, &sec.name, optional).await?;
                out.extend(make_payload(
                    keys.as_ref(),
                    sec.items.as_deref(),
                    Some(default_mode),
                    optional,
                    "secret references non-existent secret key",
                )?);
            } else if let Some(d) = &source.downward_api {
                self.downward.add_items(
                    pod,
                    d.items.as_deref().unwrap_or_default(),
                    default_mode,
                    &volume.name,
                    &mut out,
                )?;
            } else if let Some(t) = &source.service_account_token {
                let token = self.token(pod, volume, t).await?;
                // As the kubelet: only the pod's user (and its fsGroup) may read the token
                // when the pod has one.
                let mode = if fs_user(pod).is_some() || fs_group(pod).is_some() {
                    0o600
                } else {
                    (default_mode as u32) & 0o7777
                };
                out.insert(
                    t.path.clone(),
                    FileProjection {
                        data: token.into_bytes(),
                        mode,
                    },
                );
            } else {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!(
                        "projected volume {:?}: a source of a kind this agent does not support (it supports configMap, secret, downwardAPI and serviceAccountToken)",
                        volume.name
                    ),
                ));
            }
        }
        Ok(out)
    }

    /// Forget the tokens of the pod whose volume directory is `dir`
    /// (`<root>/pods/<uid>/volumes/kubernetes.io~projected/<name>`).
    fn forget_tokens_of(&self, dir: &Path) {
        let uid = dir
            .parent()
            .and_then(Path::parent)
            .and_then(Path::parent)
            .and_then(Path::file_name)
            .and_then(|u| u.to_str());
        if let Some(uid) = uid {
            self.tokens.lock().retain(|k, _| k.4 != uid);
        }
    }
}

#[async_trait]
impl VolumePlugin for ProjectedPlugin {
    fn name(&self) -> &str {
        "kubernetes.io~projected"
    }

    fn can_support(&self, volume: &Volume) -> bool {
        volume.projected.is_some()
    }

    async fn set_up(&self, pod: &Pod, volume: &Volume, dir: &Path) -> Result<PathBuf> {
        let payload = self.payload(pod, volume).await?;
        let tokens: Vec<String> = volume
            .projected
            .iter()
            .flat_map(|p| p.sources.iter().flatten())
            .filter_map(|s| s.service_account_token.as_ref().map(|t| t.path.clone()))
            .collect();
        if write_owned(dir, payload, fs_group(pod)).await? {
            tracing::debug!(pod = %pod::full_name(pod), volume = %volume.name, "projected volume written");
            // The token files belong to the pod's user when all its containers share one.
            if let Some(uid) = fs_user(pod).and_then(|u| u32::try_from(u).ok()) {
                for path in &tokens {
                    let file = dir.join(path);
                    if let Err(e) = std::os::unix::fs::chown(&file, Some(uid), None) {
                        tracing::warn!(pod = %pod::full_name(pod), file = %file.display(), uid, error = %kubelet_api::chain(&e), "giving the token file to the pod's user failed");
                    }
                }
            }
        }
        Ok(dir.to_path_buf())
    }

    async fn tear_down(&self, _volume_name: &str, dir: &Path) -> Result<()> {
        self.forget_tokens_of(dir);
        remove(dir).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::{
        ConfigMap, ConfigMapVolumeSource, Secret, SecretVolumeSource,
    };
    use kubelet_api::StaticObjects;
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

    /// Objects from a [`StaticObjects`], tokens valid for an hour numbered in order of request, or
    /// refused.
    struct Tokens {
        objects: StaticObjects,
        issued: parking_lot::Mutex<Vec<TokenRequest>>,
        refuse: std::sync::atomic::AtomicBool,
    }

    #[async_trait]
    impl ObjectProvider for Tokens {
        async fn config_map(
            &self,
            ns: &str,
            name: &str,
        ) -> Result<Option<k8s_openapi::api::core::v1::ConfigMap>> {
            self.objects.config_map(ns, name).await
        }
        async fn secret(&self, ns: &str, name: &str) -> Result<Option<Secret>> {
            self.objects.secret(ns, name).await
        }
        async fn request_service_account_token(
            &self,
            namespace: &str,
            service_account: &str,
            request: &TokenRequest,
        ) -> Result<TokenRequest> {
            if self.refuse.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(Error::new(
                    ErrorKind::PermissionDenied,
                    "serviceaccounts \"sa\" is forbidden",
                ));
            }
            let mut issued = self.issued.lock();
            issued.push(request.clone());
            Ok(TokenRequest {
                status: Some(k8s_openapi::api::authentication::v1::TokenRequestStatus {
                    token: format!("{namespace}/{service_account}#{}", issued.len()),
                    expiration_timestamp: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1),
                    ),
                }),
                ..request.clone()
            })
        }
    }

    /// A provider with the namespace's `kube-root-ca.crt` that issues tokens valid for an hour.
    fn token_provider() -> Arc<Tokens> {
        let objects = StaticObjects::new();
        let mut ca = cm(&[("ca.crt", "PEM")]);
        ca.metadata.name = Some("kube-root-ca.crt".into());
        objects.put_config_map(ca);
        Arc::new(Tokens {
            objects,
            issued: parking_lot::Mutex::new(Vec::new()),
            refuse: false.into(),
        })
    }

    fn access_volume(expiration: Option<i64>) -> Volume {
        use k8s_openapi::api::core::v1::{
            ConfigMapProjection, DownwardAPIProjection, DownwardAPIVolumeFile, ObjectFieldSelector,
            ProjectedVolumeSource, ServiceAccountTokenProjection, VolumeProjection,
        };
        Volume {
            name: "kube-api-access-x1y2z".into(),
            projected: Some(ProjectedVolumeSource {
                default_mode: Some(0o644),
                sources: Some(vec![
                    VolumeProjection {
                        service_account_token: Some(ServiceAccountTokenProjection {
                            path: "token".into(),
                            expiration_seconds: expiration,
                            audience: None,
                        }),
                        ..Default::default()
                    },
                    VolumeProjection {
                        config_map: Some(ConfigMapProjection {
                            name: "kube-root-ca.crt".into(),
                            items: Some(vec![KeyToPath {
                                key: "ca.crt".into(),
                                path: "ca.crt".into(),
                                mode: None,
                            }]),
                            optional: None,
                        }),
                        ..Default::default()
                    },
                    VolumeProjection {
                        downward_api: Some(DownwardAPIProjection {
                            items: Some(vec![DownwardAPIVolumeFile {
                                path: "namespace".into(),
                                field_ref: Some(ObjectFieldSelector {
                                    field_path: "metadata.namespace".into(),
                                    api_version: Some("v1".into()),
                                }),
                                ..Default::default()
                            }]),
                        }),
                        ..Default::default()
                    },
                ]),
            }),
            ..Default::default()
        }
    }

    fn sa_pod() -> Pod {
        let mut p = pod();
        p.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            service_account_name: Some("sa".into()),
            ..Default::default()
        });
        p
    }

    #[tokio::test]
    async fn projected_volume_writes_token_ca_and_namespace_like_kube_api_access() {
        let dir = tempdir();
        let provider = token_provider();
        let plugin = ProjectedPlugin::new(Some(provider.clone()));
        let volume = access_volume(Some(3607));
        assert!(plugin.can_support(&volume));
        let vol = dir.join("v");
        let out = plugin
            .set_up(&sa_pod(), &volume, &vol)
            .await
            .expect("set up");
        let read = |f: &str| std::fs::read_to_string(out.join(f)).expect("file");
        assert_eq!(read("token"), "ns/sa#1");
        assert_eq!(read("ca.crt"), "PEM");
        assert_eq!(read("namespace"), "ns");
        assert_eq!(mode(&out.join("token")), 0o644);
        // The request is bound to the pod, with the source's lifetime and no audience.
        {
            let issued = provider.issued.lock();
            let spec = &issued[0].spec;
            assert_eq!(spec.expiration_seconds, Some(3607));
            assert!(spec.audiences.is_empty());
            let bound = spec.bound_object_ref.as_ref().expect("bound");
            assert_eq!(
                (
                    bound.kind.as_deref(),
                    bound.name.as_deref(),
                    bound.uid.as_deref()
                ),
                (Some("Pod"), Some("p"), Some("u"))
            );
        }

        // A young token is reused on the next sync.
        plugin
            .set_up(&sa_pod(), &volume, &vol)
            .await
            .expect("resync");
        assert_eq!(provider.issued.lock().len(), 1);
        assert_eq!(read("token"), "ns/sa#1");

        // When the API server refuses, the missing token fails the set-up with its reason.
        provider
            .refuse
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let mut other = sa_pod();
        other.metadata.uid = Some("u2".into());
        let err = plugin
            .set_up(&other, &volume, &dir.join("w"))
            .await
            .expect_err("refused");
        assert_eq!(err.kind(), ErrorKind::PermissionDenied);
        assert!(
            err.message()
                .contains("failed to fetch token for service account ns/sa"),
            "{err}"
        );

        // A missing kube-root-ca.crt is the kubelet's error.
        provider
            .refuse
            .store(false, std::sync::atomic::Ordering::SeqCst);
        provider.objects.remove_config_map("ns", "kube-root-ca.crt");
        let err = plugin
            .set_up(&other, &volume, &dir.join("w"))
            .await
            .expect_err("no CA");
        assert!(
            err.message()
                .contains("configmap \"kube-root-ca.crt\" not found"),
            "{err}"
        );

        plugin.tear_down("v", &vol).await.expect("tear down");
        assert!(!vol.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn tokens_are_requested_again_after_80_percent_of_their_life() {
        let dir = tempdir();
        let provider = token_provider();
        let plugin = ProjectedPlugin::new(Some(provider.clone()));
        let volume = access_volume(None);
        let vol = dir.join("v");
        plugin
            .set_up(&sa_pod(), &volume, &vol)
            .await
            .expect("set up");
        assert_eq!(
            provider.issued.lock()[0].spec.expiration_seconds,
            Some(DEFAULT_TOKEN_EXPIRATION_SECONDS)
        );
        // 50 minutes later (more than 80 % of its life, 10 minutes before it expires): the
        // cached token is aged rather than the test waiting.
        for t in plugin.tokens.lock().values_mut() {
            t.issued -= jiff::SignedDuration::from_mins(50);
            t.expires -= jiff::SignedDuration::from_mins(50);
        }
        // A refused refresh keeps the token that is still valid.
        provider
            .refuse
            .store(true, std::sync::atomic::Ordering::SeqCst);
        plugin
            .set_up(&sa_pod(), &volume, &vol)
            .await
            .expect("old token kept");
        assert_eq!(
            std::fs::read_to_string(vol.join("token")).expect("token"),
            "ns/sa#1"
        );
        provider
            .refuse
            .store(false, std::sync::atomic::Ordering::SeqCst);
        plugin
            .set_up(&sa_pod(), &volume, &vol)
            .await
            .expect("refreshed");
        assert_eq!(
            std::fs::read_to_string(vol.join("token")).expect("token"),
            "ns/sa#2"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn token_files_of_pods_with_one_user_are_readable_by_that_user_only() {
        let dir = tempdir();
        let provider = token_provider();
        let plugin = ProjectedPlugin::new(Some(provider));
        let mut p = sa_pod();
        if let Some(spec) = p.spec.as_mut() {
            spec.security_context = Some(k8s_openapi::api::core::v1::PodSecurityContext {
                run_as_user: Some(1000),
                ..Default::default()
            });
            spec.containers = vec![k8s_openapi::api::core::v1::Container {
                name: "app".into(),
                ..Default::default()
            }];
        }
        assert_eq!(fs_user(&p), Some(1000));
        let out = plugin
            .set_up(&p, &access_volume(None), &dir.join("v"))
            .await
            .expect("set up");
        assert_eq!(mode(&out.join("token")), 0o600);
        assert_eq!(mode(&out.join("ca.crt")), 0o644);
        if nix::unistd::geteuid().is_root() {
            use std::os::unix::fs::MetadataExt;
            assert_eq!(
                std::fs::metadata(out.join("token")).expect("token").uid(),
                1000
            );
        }
        // Containers with different users: no single owner.
        if let Some(spec) = p.spec.as_mut() {
            let mut other = spec.containers[0].clone();
            other.name = "other".into();
            other.security_context = Some(k8s_openapi::api::core::v1::SecurityContext {
                run_as_user: Some(2000),
                ..Default::default()
            });
            spec.containers.push(other);
        }
        assert_eq!(fs_user(&p), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn refresh_rule_is_80_percent_of_the_lifetime_or_a_day() {
        let issued = jiff::Timestamp::now();
        let t = CachedToken {
            token: String::new(),
            issued,
            expires: issued + jiff::SignedDuration::from_secs(1000),
        };
        assert!(!t.requires_refresh(issued + jiff::SignedDuration::from_secs(799)));
        assert!(t.requires_refresh(issued + jiff::SignedDuration::from_secs(800)));
        let year = CachedToken {
            expires: issued + jiff::SignedDuration::from_hours(24 * 365),
            ..t
        };
        assert!(!year.requires_refresh(issued + jiff::SignedDuration::from_hours(23)));
        assert!(year.requires_refresh(issued + jiff::SignedDuration::from_hours(24)));
    }

    #[tokio::test]
    async fn fs_group_owns_projected_files_and_makes_them_group_readable() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: changing a file's group needs root");
            return;
        }
        let dir = tempdir();
        let store = StaticObjects::new();
        store.put_config_map(cm(&[("a", "1")]));
        let plugin = ConfigMapPlugin::new(Some(Arc::new(store)));
        let mut volume = cm_volume(None, false);
        if let Some(c) = volume.config_map.as_mut() {
            c.default_mode = Some(0o400);
        }
        let mut p = pod();
        p.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            security_context: Some(k8s_openapi::api::core::v1::PodSecurityContext {
                fs_group: Some(1234),
                ..Default::default()
            }),
            ..Default::default()
        });
        let out = plugin
            .set_up(&p, &volume, &dir.join("v"))
            .await
            .expect("set up");
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(out.join("a")).expect("a");
        assert_eq!(meta.gid(), 1234);
        assert_eq!(mode(&out.join("a")), 0o440);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
