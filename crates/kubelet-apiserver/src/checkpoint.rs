//! [`Checkpoint`]: the pods bound to this node and the objects they use, kept under the root
//! directory, so that an agent that starts while the API server is unreachable runs its pods
//! again (edge autonomy; docs/autonomy.md).
//!
//! The API pod source writes every pod it delivers ([`Checkpoint::save_pods`]), and
//! [`CheckpointedObjects`] writes the ConfigMaps, Secrets, ServiceAccounts, RuntimeClasses,
//! service-account tokens and Services those pods were given. When the API server cannot be
//! reached at start, the source serves the checkpointed pods after
//! [`CheckpointConfig::offline_start_wait`], and lookups that fail because the API server is
//! unavailable are answered from the checkpoint.
//!
//! Layout under `<root-dir>/pod-checkpoint/` (directory 0700, every file 0600):
//!
//! ```text
//! state                          when the API server last confirmed the set of pods
//! pods/<uid>                     one file per pod
//! configmaps/<namespace>_<name>  secrets/…  serviceaccounts/…  runtimeclasses/<name>
//! tokens/<pod-uid>_<namespace>_<service-account>_<request-hash>
//! services                       the Services of the pods' namespaces and `default`
//! ```
//!
//! Each file is one header line (format version, node, kind, time written, length and FNV-1a
//! checksum of the rest) followed by the object's JSON. Files are replaced atomically (written
//! to a temporary file, synced, renamed), so a reader sees the old or the new file, never half
//! of one; a file whose length or checksum does not match is reported as corrupt and never
//! used. Nothing of a file's content is ever logged.

use std::collections::{BTreeSet, HashMap};
use std::hash::Hasher;
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use jiff::Timestamp;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::node::v1::RuntimeClass;
use kubelet_api::objects::ReferencedObjects;
use kubelet_api::{ErrorKind, ObjectProvider};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// The format version this agent writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// The checkpoint's directory under the root directory.
pub const DIR_NAME: &str = "pod-checkpoint";

/// How often the time of the last confirmation is written while the watch is healthy.
const CONFIRM_PERIOD: Duration = Duration::from_secs(30);

/// How often the Services are written at most.
const SERVICES_PERIOD: Duration = Duration::from_secs(10);

/// Settings of the checkpoint (the SDK's `AgentConfiguration.podCheckpoint`; the kubelet has no
/// such setting).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CheckpointConfig {
    /// How long a starting agent waits for the API server's first list of pods before it runs
    /// the checkpointed ones (5 s): a healthy start never uses the checkpoint.
    pub offline_start_wait: Duration,
    /// A pod the API server last confirmed longer ago than this is not started from the
    /// checkpoint (7 days); `None`: no limit.
    pub max_age: Option<Duration>,
    /// The most bytes the checkpoint holds (64 MiB); a write beyond is refused and reported.
    pub max_bytes: u64,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        Self {
            offline_start_wait: Duration::from_secs(5),
            max_age: Some(Duration::from_secs(7 * 24 * 3600)),
            max_bytes: 64 * 1024 * 1024,
        }
    }
}

impl CheckpointConfig {
    /// Set [`offline_start_wait`](Self::offline_start_wait).
    pub fn offline_start_wait(mut self, wait: Duration) -> Self {
        self.offline_start_wait = wait;
        self
    }

    /// Set [`max_age`](Self::max_age) (`None`: no limit).
    pub fn max_age(mut self, age: Option<Duration>) -> Self {
        self.max_age = age;
        self
    }

    /// Set [`max_bytes`](Self::max_bytes).
    pub fn max_bytes(mut self, bytes: u64) -> Self {
        self.max_bytes = bytes;
        self
    }
}

/// Why the checkpoint, or one of its files, cannot be written or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// A file operation failed (a full disk, permissions); what was there before stays valid.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A file is truncated, altered or not in the checkpoint format.
    #[error("checkpoint file {path} is corrupt: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The checkpoint was written by an agent of another node.
    #[error("checkpoint {path} was written for node {found:?}, not for {expected:?}")]
    OtherNode {
        /// The file.
        path: PathBuf,
        /// The node it names.
        found: String,
        /// This node.
        expected: String,
    },
    /// The checkpoint was written in a newer format; it is neither read nor overwritten.
    #[error(
        "checkpoint {path} has format version {found}, newer than this agent's {FORMAT_VERSION}: not read and not overwritten"
    )]
    NewerVersion {
        /// The file.
        path: PathBuf,
        /// Its version.
        found: u32,
    },
    /// Writing the file would take the checkpoint over its size limit.
    #[error(
        "checkpoint is full: {path} ({bytes} bytes) would take it over its limit of {limit} bytes"
    )]
    Full {
        /// The file.
        path: PathBuf,
        /// The file's size.
        bytes: u64,
        /// [`CheckpointConfig::max_bytes`].
        limit: u64,
    },
    /// There is no checkpoint (never written, or removed).
    #[error("no checkpoint in {path}")]
    Missing {
        /// The checkpoint's directory.
        path: PathBuf,
    },
    /// A name that cannot be a file name (empty, `/`, a leading `.`).
    #[error("cannot checkpoint {kind} {name:?}: not a valid object name")]
    InvalidName {
        /// The kind of object.
        kind: &'static str,
        /// The name.
        name: String,
    },
    /// An object could not be encoded.
    #[error("encoding {kind} for the checkpoint: {message}")]
    Encode {
        /// The kind of object.
        kind: &'static str,
        /// The encoder's message.
        message: String,
    },
}

/// The kinds of file in the checkpoint, with their directories.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Pod,
    ConfigMap,
    Secret,
    ServiceAccount,
    RuntimeClass,
    Token,
    Services,
    State,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Pod => "Pod",
            Kind::ConfigMap => "ConfigMap",
            Kind::Secret => "Secret",
            Kind::ServiceAccount => "ServiceAccount",
            Kind::RuntimeClass => "RuntimeClass",
            Kind::Token => "TokenRequest",
            Kind::Services => "ServiceList",
            Kind::State => "State",
        }
    }

    /// The directory of the kind's files (`None`: a single file at the top).
    fn dir(self) -> Option<&'static str> {
        match self {
            Kind::Pod => Some("pods"),
            Kind::ConfigMap => Some("configmaps"),
            Kind::Secret => Some("secrets"),
            Kind::ServiceAccount => Some("serviceaccounts"),
            Kind::RuntimeClass => Some("runtimeclasses"),
            Kind::Token => Some("tokens"),
            Kind::Services | Kind::State => None,
        }
    }

    const DIRS: [Kind; 6] = [
        Kind::Pod,
        Kind::ConfigMap,
        Kind::Secret,
        Kind::ServiceAccount,
        Kind::RuntimeClass,
        Kind::Token,
    ];
}

/// The header line of every file.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Header {
    version: u32,
    node: String,
    kind: String,
    saved_at: Timestamp,
    length: u64,
    checksum: String,
}

fn fnv64(bytes: &[u8]) -> u64 {
    let mut h = fnv::FnvHasher::default();
    h.write(bytes);
    h.finish()
}

/// What the checkpoint's state file says.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct State {
    /// The last time the API server's list of pods was known to be this checkpoint's.
    confirmed_at: Timestamp,
}

/// What a checkpointed pod references, for pruning the objects no pod needs any more.
#[derive(Debug, Clone, Default)]
struct PodRefs {
    /// The `resourceVersion` of the pod as written: an unchanged version is not written again.
    version: Option<String>,
    namespace: String,
    objects: ReferencedObjects,
    service_account: Option<String>,
    runtime_class: Option<String>,
}

impl PodRefs {
    fn of(pod: &Pod) -> Self {
        let spec = pod.spec.as_ref();
        Self {
            version: pod.metadata.resource_version.clone(),
            namespace: kubelet_api::pod::namespace(pod).to_string(),
            objects: ReferencedObjects::of_pod(pod),
            service_account: spec
                .and_then(|s| s.service_account_name.clone())
                .filter(|s| !s.is_empty())
                .or_else(|| Some("default".to_string())),
            runtime_class: spec.and_then(|s| s.runtime_class_name.clone()),
        }
    }
}

#[derive(Debug, Default)]
struct Index {
    /// Files on disk (path relative to the directory) → (checksum, size) of their objects.
    files: HashMap<PathBuf, (u64, u64)>,
    /// Bytes of all files.
    total: u64,
    /// The checkpointed pods by UID.
    pods: HashMap<String, PodRefs>,
    /// A newer format's checkpoint: neither read nor written.
    newer: Option<u32>,
    /// Another node's checkpoint: not read; removed by the first write.
    foreign: Option<String>,
    /// When the state was written last.
    confirmed: Option<Instant>,
    /// When the Services were written last.
    services_written: Option<Instant>,
}

/// The pods of a checkpoint, as [`Checkpoint::load_pods`] reads them.
#[derive(Debug, Clone)]
pub struct CheckpointedPods {
    /// When the API server last confirmed this set of pods.
    pub confirmed_at: Timestamp,
    /// The pods, each with the time its file was written.
    pub pods: Vec<(Pod, Timestamp)>,
}

impl CheckpointedPods {
    /// How long ago the API server last confirmed `saved_at`'s pod (the later of the set's
    /// confirmation and the pod's own write), as of `now`.
    pub fn age(&self, saved_at: Timestamp, now: Timestamp) -> Duration {
        let seen = self.confirmed_at.max(saved_at);
        Duration::try_from(now.duration_since(seen)).unwrap_or(Duration::ZERO)
    }
}

/// The checkpoint of one node's pods and objects (see the [module docs](self)). Cheap to share
/// (`Arc`); every operation is a short blocking file operation, serialised by one lock.
#[derive(Debug)]
pub struct Checkpoint {
    dir: PathBuf,
    node: String,
    config: CheckpointConfig,
    index: Mutex<Index>,
}

impl Checkpoint {
    /// The checkpoint of `node` under `root_dir` (`<root_dir>/pod-checkpoint`), created when
    /// missing. What is there already is indexed (not read whole): a newer format's or another
    /// node's checkpoint is reported here and by [`load_pods`](Self::load_pods).
    pub fn open(
        root_dir: &Path,
        node: &str,
        config: CheckpointConfig,
    ) -> Result<Self, CheckpointError> {
        let dir = root_dir.join(DIR_NAME);
        let mkdir = |p: &Path| {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(p)
                .map_err(|source| CheckpointError::Io {
                    op: "creating",
                    path: p.to_path_buf(),
                    source,
                })
        };
        mkdir(&dir)?;
        for k in Kind::DIRS {
            if let Some(d) = k.dir() {
                mkdir(&dir.join(d))?;
            }
        }
        let cp = Self {
            dir,
            node: node.to_string(),
            config,
            index: Mutex::new(Index::default()),
        };
        cp.index_existing();
        Ok(cp)
    }

    /// The settings.
    pub fn config(&self) -> &CheckpointConfig {
        &self.config
    }

    /// The checkpoint's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Bytes the checkpoint holds now.
    pub fn size(&self) -> u64 {
        self.index.lock().total
    }

    fn index_existing(&self) {
        let mut idx = self.index.lock();
        let state = self.dir.join("state");
        match std::fs::read(&state) {
            Ok(bytes) => match self.decode(&state, &bytes) {
                Err(CheckpointError::NewerVersion { found, .. }) => {
                    tracing::error!(dir = %self.dir.display(), version = found, "pod checkpoint has a newer format: it is neither read nor overwritten, and no checkpoint is kept");
                    idx.newer = Some(found);
                }
                Err(CheckpointError::OtherNode { found, .. }) => {
                    tracing::error!(dir = %self.dir.display(), node = %found, "pod checkpoint was written for another node: it is not used, and is replaced by this node's");
                    idx.foreign = Some(found);
                }
                _ => {}
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(path = %state.display(), "reading the pod checkpoint: {e}"),
        }
        let mut files = Vec::new();
        for single in ["state", "services"] {
            files.push(PathBuf::from(single));
        }
        for k in Kind::DIRS {
            let Some(d) = k.dir() else { continue };
            let Ok(entries) = std::fs::read_dir(self.dir.join(d)) else {
                continue;
            };
            for e in entries.flatten() {
                let name = e.file_name();
                let name = name.to_string_lossy();
                if name.ends_with(".tmp") {
                    // A write that never finished: never read.
                    let _ = std::fs::remove_file(e.path());
                    continue;
                }
                files.push(Path::new(d).join(name.as_ref()));
            }
        }
        for rel in files {
            let path = self.dir.join(&rel);
            let Ok(bytes) = std::fs::read(&path) else {
                continue;
            };
            // A corrupt file is indexed with checksum 0, so that it is replaced or pruned.
            let sum = self
                .decode(&path, &bytes)
                .map(|(_, body)| fnv64(body))
                .unwrap_or(0);
            idx.total += bytes.len() as u64;
            idx.files.insert(rel, (sum, bytes.len() as u64));
        }
    }

    /// Split a file into its verified header and body.
    fn decode<'a>(
        &self,
        path: &Path,
        bytes: &'a [u8],
    ) -> Result<(Header, &'a [u8]), CheckpointError> {
        let corrupt = |reason: String| CheckpointError::Corrupt {
            path: path.to_path_buf(),
            reason,
        };
        let nl = bytes
            .iter()
            .position(|b| *b == b'\n')
            .ok_or_else(|| corrupt("no header line".to_string()))?;
        let header: Header = serde_json::from_slice(&bytes[..nl])
            .map_err(|e| corrupt(format!("unreadable header: {e}")))?;
        if header.version > FORMAT_VERSION {
            return Err(CheckpointError::NewerVersion {
                path: path.to_path_buf(),
                found: header.version,
            });
        }
        if header.version != FORMAT_VERSION {
            return Err(corrupt(format!(
                "unknown format version {}",
                header.version
            )));
        }
        if header.node != self.node {
            return Err(CheckpointError::OtherNode {
                path: path.to_path_buf(),
                found: header.node,
                expected: self.node.clone(),
            });
        }
        let body = &bytes[nl + 1..];
        if body.len() as u64 != header.length {
            return Err(corrupt(format!(
                "{} bytes where the header says {}",
                body.len(),
                header.length
            )));
        }
        if format!("{:016x}", fnv64(body)) != header.checksum {
            return Err(corrupt("checksum mismatch".to_string()));
        }
        Ok((header, body))
    }

    fn read<T: DeserializeOwned>(
        &self,
        rel: &Path,
    ) -> Result<Option<(T, Timestamp)>, CheckpointError> {
        let path = self.dir.join(rel);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(CheckpointError::Io {
                    op: "reading",
                    path,
                    source,
                });
            }
        };
        let (header, body) = self.decode(&path, &bytes)?;
        // From text, as the API client decodes: one deserializer of each type in the binary.
        let value = std::str::from_utf8(body)
            .map_err(|e| e.to_string())
            .and_then(|text| serde_json::from_str(text).map_err(|e| e.to_string()))
            .map_err(|e| CheckpointError::Corrupt {
                path: path.clone(),
                reason: format!("unreadable {}: {e}", header.kind),
            })?;
        Ok(Some((value, header.saved_at)))
    }

    /// Write `value` as `rel` unless the file already holds it. The previous file stays valid
    /// when the write fails.
    fn write<T: Serialize>(
        &self,
        idx: &mut Index,
        rel: PathBuf,
        kind: Kind,
        value: &T,
    ) -> Result<(), CheckpointError> {
        if let Some(found) = idx.newer {
            return Err(CheckpointError::NewerVersion {
                path: self.dir.join("state"),
                found,
            });
        }
        if idx.foreign.take().is_some() {
            self.wipe(idx);
        }
        let body = serde_json::to_vec(value).map_err(|e| CheckpointError::Encode {
            kind: kind.name(),
            message: e.to_string(),
        })?;
        let sum = fnv64(&body);
        let old = idx.files.get(&rel).copied();
        if old.is_some_and(|(s, _)| s == sum) && kind != Kind::State {
            return Ok(());
        }
        let header = Header {
            version: FORMAT_VERSION,
            node: self.node.clone(),
            kind: kind.name().to_string(),
            saved_at: Timestamp::now(),
            length: body.len() as u64,
            checksum: format!("{sum:016x}"),
        };
        let mut bytes = serde_json::to_vec(&header).map_err(|e| CheckpointError::Encode {
            kind: kind.name(),
            message: e.to_string(),
        })?;
        bytes.push(b'\n');
        bytes.extend_from_slice(&body);
        let size = bytes.len() as u64;
        let path = self.dir.join(&rel);
        let after = idx.total - old.map_or(0, |(_, s)| s) + size;
        if after > self.config.max_bytes {
            return Err(CheckpointError::Full {
                path,
                bytes: size,
                limit: self.config.max_bytes,
            });
        }
        write_file_atomically(&path, &bytes).map_err(|(op, source)| CheckpointError::Io {
            op,
            path,
            source,
        })?;
        idx.total = after;
        idx.files.insert(rel, (sum, size));
        Ok(())
    }

    fn remove(&self, idx: &mut Index, rel: &Path) {
        if let Some((_, size)) = idx.files.remove(rel) {
            idx.total -= size;
        }
        match std::fs::remove_file(self.dir.join(rel)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %self.dir.join(rel).display(), "removing a pod checkpoint file: {e}")
            }
        }
    }

    /// Remove every file (another node's checkpoint).
    fn wipe(&self, idx: &mut Index) {
        let all: Vec<PathBuf> = idx.files.keys().cloned().collect();
        for rel in all {
            self.remove(idx, &rel);
        }
        idx.pods.clear();
    }

    fn write_state(&self, idx: &mut Index) -> Result<(), CheckpointError> {
        self.write(
            idx,
            PathBuf::from("state"),
            Kind::State,
            &State {
                confirmed_at: Timestamp::now(),
            },
        )?;
        idx.confirmed = Some(Instant::now());
        Ok(())
    }

    /// The API server's current set of pods for this node is `pods`: write the new and changed
    /// ones, remove the others with their tokens, prune objects no pod references any more,
    /// and record the confirmation. Every failure is returned (and nothing half-written is ever
    /// read back); the pods that could be written are.
    pub fn save_pods(&self, pods: &[Pod]) -> Vec<CheckpointError> {
        let mut errors = Vec::new();
        let mut idx = self.index.lock();
        let mut old = std::mem::take(&mut idx.pods);
        let mut wanted = HashMap::with_capacity(pods.len());
        let mut changed = false;
        for pod in pods {
            let uid = kubelet_api::pod::uid(pod);
            if !valid_name(uid) {
                errors.push(CheckpointError::InvalidName {
                    kind: "Pod",
                    name: uid.to_string(),
                });
                continue;
            }
            // The API server's resourceVersion changes with every change of the pod: an
            // unchanged one is neither serialised nor written again.
            if let Some(version) = &pod.metadata.resource_version
                && let Some(refs) = old
                    .remove(uid)
                    .filter(|r| r.version.as_ref() == Some(version))
            {
                wanted.insert(uid.to_string(), refs);
                continue;
            }
            changed = true;
            match self.write(&mut idx, Path::new("pods").join(uid), Kind::Pod, pod) {
                Ok(()) => {
                    wanted.insert(uid.to_string(), PodRefs::of(pod));
                }
                // A pod that could not be written keeps its old file (if any), valid, and its
                // references.
                Err(e) => {
                    if let Some(refs) = old.remove(uid) {
                        wanted.insert(uid.to_string(), refs);
                    }
                    errors.push(e);
                }
            }
        }
        changed |= old.keys().any(|uid| !wanted.contains_key(uid));
        idx.pods = wanted;
        if changed {
            self.prune(&mut idx);
        }
        if let Err(e) = self.write_state(&mut idx) {
            errors.push(e);
        }
        errors
    }

    /// Record that the API server's list of pods is still this checkpoint's (at most every
    /// 30 s; the watch calls it while healthy).
    pub fn confirm(&self) -> Result<(), CheckpointError> {
        let mut idx = self.index.lock();
        if idx
            .confirmed
            .is_some_and(|at| at.elapsed() < CONFIRM_PERIOD)
            || idx.newer.is_some()
        {
            return Ok(());
        }
        self.write_state(&mut idx)
    }

    /// Remove files no checkpointed pod needs.
    fn prune(&self, idx: &mut Index) {
        let mut keep: BTreeSet<PathBuf> = BTreeSet::new();
        for (uid, r) in &idx.pods {
            keep.insert(Path::new("pods").join(uid));
            for cm in &r.objects.config_maps {
                keep.insert(object_path(Kind::ConfigMap, &r.namespace, cm));
            }
            for s in &r.objects.secrets {
                keep.insert(object_path(Kind::Secret, &r.namespace, s));
            }
            if let Some(sa) = &r.service_account {
                keep.insert(object_path(Kind::ServiceAccount, &r.namespace, sa));
            }
            if let Some(rc) = &r.runtime_class {
                keep.insert(object_path(Kind::RuntimeClass, "", rc));
            }
        }
        let gone: Vec<PathBuf> = idx
            .files
            .keys()
            .filter(|rel| {
                let Some(top) = rel.iter().next().and_then(|c| c.to_str()) else {
                    return false;
                };
                match top {
                    "state" | "services" => false,
                    "tokens" => {
                        let file = rel.file_name().and_then(|f| f.to_str()).unwrap_or("");
                        let uid = file.split('_').next().unwrap_or("");
                        !idx.pods.contains_key(uid)
                    }
                    _ => !keep.contains(*rel),
                }
            })
            .cloned()
            .collect();
        for rel in gone {
            self.remove(idx, &rel);
        }
    }

    /// The checkpointed pods, every file verified. A missing, corrupt, truncated, newer or
    /// foreign checkpoint is an error: none of it is used.
    pub fn load_pods(&self) -> Result<CheckpointedPods, CheckpointError> {
        let mut idx = self.index.lock();
        if let Some(found) = idx.newer {
            return Err(CheckpointError::NewerVersion {
                path: self.dir.join("state"),
                found,
            });
        }
        if let Some(found) = &idx.foreign {
            return Err(CheckpointError::OtherNode {
                path: self.dir.join("state"),
                found: found.clone(),
                expected: self.node.clone(),
            });
        }
        let Some((state, _)) = self.read::<State>(Path::new("state"))? else {
            return Err(CheckpointError::Missing {
                path: self.dir.clone(),
            });
        };
        let mut pods = Vec::new();
        let dir = self.dir.join("pods");
        let entries = std::fs::read_dir(&dir).map_err(|source| CheckpointError::Io {
            op: "listing",
            path: dir.clone(),
            source,
        })?;
        for e in entries.flatten() {
            let rel = Path::new("pods").join(e.file_name());
            if let Some((pod, saved)) = self.read::<Pod>(&rel)? {
                pods.push((pod, saved));
            }
        }
        kubelet_api::sort::by(&mut pods, |a, b| {
            kubelet_api::pod::uid(&a.0).cmp(kubelet_api::pod::uid(&b.0))
        });
        idx.pods = pods
            .iter()
            .map(|(p, _)| (kubelet_api::pod::uid(p).to_string(), PodRefs::of(p)))
            .collect();
        Ok(CheckpointedPods {
            confirmed_at: state.confirmed_at,
            pods,
        })
    }

    fn referenced(&self, idx: &Index, kind: Kind, namespace: &str, name: &str) -> bool {
        idx.pods.values().any(|r| match kind {
            Kind::ConfigMap => {
                r.namespace == namespace && r.objects.config_maps.iter().any(|n| n == name)
            }
            Kind::Secret => r.namespace == namespace && r.objects.secrets.iter().any(|n| n == name),
            Kind::ServiceAccount => {
                r.namespace == namespace && r.service_account.as_deref() == Some(name)
            }
            Kind::RuntimeClass => r.runtime_class.as_deref() == Some(name),
            _ => false,
        })
    }

    fn put_object<T: Serialize>(
        &self,
        kind: Kind,
        namespace: &str,
        name: &str,
        value: Option<&T>,
    ) -> Result<(), CheckpointError> {
        if !valid_name(name) || !(namespace.is_empty() || valid_name(namespace)) {
            return Err(CheckpointError::InvalidName {
                kind: kind.name(),
                name: format!("{namespace}/{name}"),
            });
        }
        let mut idx = self.index.lock();
        let rel = object_path(kind, namespace, name);
        match value {
            // Only what a checkpointed pod references is kept.
            Some(v) if self.referenced(&idx, kind, namespace, name) => {
                self.write(&mut idx, rel, kind, v)
            }
            Some(_) => Ok(()),
            // Gone from the API server: gone from the checkpoint.
            None => {
                self.remove(&mut idx, &rel);
                Ok(())
            }
        }
    }

    fn get_object<T: DeserializeOwned>(
        &self,
        kind: Kind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<T>, CheckpointError> {
        if !valid_name(name) || !(namespace.is_empty() || valid_name(namespace)) {
            return Ok(None);
        }
        let _idx = self.index.lock();
        Ok(self
            .read::<T>(&object_path(kind, namespace, name))?
            .map(|(v, _)| v))
    }

    /// The pod a token request is bound to (`spec.boundObjectRef.uid`) and a hash of its spec;
    /// read through JSON, as the spec's Rust shape differs between Kubernetes versions.
    fn token_request_key(request: &TokenRequest) -> (String, u64) {
        let spec = serde_json::to_value(request)
            .ok()
            .and_then(|mut v| v.get_mut("spec").map(serde_json::Value::take))
            .unwrap_or_default();
        let pod = spec
            .pointer("/boundObjectRef/uid")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .to_string();
        (pod, fnv64(spec.to_string().as_bytes()))
    }

    fn token_path(namespace: &str, service_account: &str, request: &TokenRequest) -> PathBuf {
        let (pod, hash) = Self::token_request_key(request);
        Path::new("tokens").join(format!("{pod}_{namespace}_{service_account}_{hash:016x}"))
    }

    fn put_token(
        &self,
        namespace: &str,
        service_account: &str,
        request: &TokenRequest,
        answer: &TokenRequest,
    ) -> Result<(), CheckpointError> {
        let (pod, _) = Self::token_request_key(request);
        if !valid_name(namespace) || !valid_name(service_account) {
            return Err(CheckpointError::InvalidName {
                kind: "TokenRequest",
                name: format!("{namespace}/{service_account}"),
            });
        }
        let mut idx = self.index.lock();
        if !idx.pods.contains_key(&pod) {
            return Ok(());
        }
        self.write(
            &mut idx,
            Self::token_path(namespace, service_account, request),
            Kind::Token,
            answer,
        )
    }

    fn get_token(
        &self,
        namespace: &str,
        service_account: &str,
        request: &TokenRequest,
    ) -> Result<Option<TokenRequest>, CheckpointError> {
        if !valid_name(namespace) || !valid_name(service_account) {
            return Ok(None);
        }
        let _idx = self.index.lock();
        Ok(self
            .read::<TokenRequest>(&Self::token_path(namespace, service_account, request))?
            .map(|(v, _)| v))
    }

    /// Write the Services of the checkpointed pods' namespaces and `default` (at most every
    /// 10 s, and only when they changed), for the pods' service environment variables.
    /// [`CheckpointedObjects`] calls it with the API server's Services.
    pub fn save_services(&self, services: &[Arc<Service>]) -> Result<(), CheckpointError> {
        let mut idx = self.index.lock();
        if idx
            .services_written
            .is_some_and(|at| at.elapsed() < SERVICES_PERIOD)
        {
            return Ok(());
        }
        idx.services_written = Some(Instant::now());
        let namespaces: BTreeSet<&str> = idx
            .pods
            .values()
            .map(|r| r.namespace.as_str())
            .chain(["default"])
            .collect();
        let mut kept: Vec<&Service> = services
            .iter()
            .map(|s| s.as_ref())
            .filter(|s| namespaces.contains(s.metadata.namespace.as_deref().unwrap_or("")))
            .collect();
        kubelet_api::sort::by(&mut kept, |a, b| {
            (&a.metadata.namespace, &a.metadata.name)
                .cmp(&(&b.metadata.namespace, &b.metadata.name))
        });
        self.write(&mut idx, PathBuf::from("services"), Kind::Services, &kept)
    }

    fn get_services(&self) -> Result<Option<Vec<Arc<Service>>>, CheckpointError> {
        let _idx = self.index.lock();
        Ok(self
            .read::<Vec<Service>>(Path::new("services"))?
            .map(|(v, _)| v.into_iter().map(Arc::new).collect()))
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty() && !name.contains('/') && !name.starts_with('.') && !name.contains('\0')
}

fn object_path(kind: Kind, namespace: &str, name: &str) -> PathBuf {
    let dir = kind.dir().unwrap_or("");
    if namespace.is_empty() {
        Path::new(dir).join(name)
    } else {
        // `_` is in neither a namespace nor an object name.
        Path::new(dir).join(format!("{namespace}_{name}"))
    }
}

/// Write `bytes` to `path` (mode 0600) through a synced temporary file renamed over it; on
/// failure the temporary file is removed and `path` is untouched.
pub(crate) fn write_file_atomically(
    path: &Path,
    bytes: &[u8],
) -> Result<(), (&'static str, std::io::Error)> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| ("creating", e))?;
        f.write_all(bytes).map_err(|e| ("writing", e))?;
        f.sync_all().map_err(|e| ("syncing", e))?;
        std::fs::rename(&tmp, path).map_err(|e| ("renaming", e))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// An [`ObjectProvider`] that keeps what `inner` answers for the checkpointed pods in the
/// [`Checkpoint`], and answers from it when `inner` fails because the API server is unavailable
/// ([`ErrorKind::Unavailable`]: unreachable, timing out, 5xx, 429). Objects the API server says
/// do not exist are removed from the checkpoint; permission errors are never answered from it.
pub struct CheckpointedObjects<P> {
    inner: P,
    checkpoint: Arc<Checkpoint>,
}

impl<P> std::fmt::Debug for CheckpointedObjects<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckpointedObjects")
            .field("dir", &self.checkpoint.dir)
            .finish_non_exhaustive()
    }
}

impl<P: ObjectProvider> CheckpointedObjects<P> {
    /// `inner`'s answers, kept in and answered from `checkpoint`.
    pub fn new(inner: P, checkpoint: Arc<Checkpoint>) -> Self {
        Self { inner, checkpoint }
    }

    async fn blocking<T: Send + 'static>(
        &self,
        what: impl FnOnce(&Checkpoint) -> Result<T, CheckpointError> + Send + 'static,
    ) -> Result<T, CheckpointError> {
        let cp = Arc::clone(&self.checkpoint);
        match tokio::task::spawn_blocking(move || what(&cp)).await {
            Ok(r) => r,
            Err(e) => Err(CheckpointError::Io {
                op: "running",
                path: self.checkpoint.dir.clone(),
                source: std::io::Error::other(e.to_string()),
            }),
        }
    }

    /// Keep `got` (or its absence) for `kind` `namespace/name`.
    async fn keep<T: Serialize + Clone + Send + Sync + 'static>(
        &self,
        kind: Kind,
        namespace: &str,
        name: &str,
        got: &Option<T>,
    ) {
        let (ns, n, v) = (namespace.to_string(), name.to_string(), got.clone());
        if let Err(e) = self
            .blocking(move |cp| cp.put_object(kind, &ns, &n, v.as_ref()))
            .await
        {
            tracing::warn!(kind = kind.name(), namespace, name, "pod checkpoint: {e}");
        }
    }

    /// The checkpoint's copy, when `err` says the API server is unavailable.
    async fn fallback<T: DeserializeOwned + Send + 'static>(
        &self,
        kind: Kind,
        namespace: &str,
        name: &str,
        err: kubelet_api::Error,
    ) -> kubelet_api::Result<Option<T>> {
        if err.kind() != ErrorKind::Unavailable {
            return Err(err);
        }
        let (ns, n) = (namespace.to_string(), name.to_string());
        match self
            .blocking(move |cp| cp.get_object::<T>(kind, &ns, &n))
            .await
        {
            Ok(Some(v)) => {
                tracing::debug!(
                    kind = kind.name(),
                    namespace,
                    name,
                    "API server unavailable: answered from the pod checkpoint"
                );
                Ok(Some(v))
            }
            Ok(None) => Err(err),
            Err(e) => {
                tracing::warn!(kind = kind.name(), namespace, name, "pod checkpoint: {e}");
                Err(err)
            }
        }
    }
}

#[async_trait]
impl<P: ObjectProvider> ObjectProvider for CheckpointedObjects<P> {
    async fn config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> kubelet_api::Result<Option<ConfigMap>> {
        match self.inner.config_map(namespace, name).await {
            Ok(got) => {
                self.keep(Kind::ConfigMap, namespace, name, &got).await;
                Ok(got)
            }
            Err(e) => self.fallback(Kind::ConfigMap, namespace, name, e).await,
        }
    }

    async fn secret(&self, namespace: &str, name: &str) -> kubelet_api::Result<Option<Secret>> {
        match self.inner.secret(namespace, name).await {
            Ok(got) => {
                self.keep(Kind::Secret, namespace, name, &got).await;
                Ok(got)
            }
            Err(e) => self.fallback(Kind::Secret, namespace, name, e).await,
        }
    }

    fn register_pod(&self, pod: &Pod) {
        self.inner.register_pod(pod);
    }

    fn unregister_pod(&self, pod: &Pod) {
        self.inner.unregister_pod(pod);
    }

    async fn request_service_account_token(
        &self,
        namespace: &str,
        service_account: &str,
        request: &TokenRequest,
    ) -> kubelet_api::Result<TokenRequest> {
        match self
            .inner
            .request_service_account_token(namespace, service_account, request)
            .await
        {
            Ok(answer) => {
                let (ns, sa, req, ans) = (
                    namespace.to_string(),
                    service_account.to_string(),
                    request.clone(),
                    answer.clone(),
                );
                if let Err(e) = self
                    .blocking(move |cp| cp.put_token(&ns, &sa, &req, &ans))
                    .await
                {
                    tracing::warn!(namespace, service_account, "pod checkpoint: {e}");
                }
                Ok(answer)
            }
            Err(e) if e.kind() == ErrorKind::Unavailable => {
                let (ns, sa, req) = (
                    namespace.to_string(),
                    service_account.to_string(),
                    request.clone(),
                );
                match self.blocking(move |cp| cp.get_token(&ns, &sa, &req)).await {
                    Ok(Some(token)) => {
                        tracing::debug!(
                            namespace,
                            service_account,
                            "API server unavailable: token answered from the pod checkpoint"
                        );
                        Ok(token)
                    }
                    Ok(None) => Err(e),
                    Err(c) => {
                        tracing::warn!(namespace, service_account, "pod checkpoint: {c}");
                        Err(e)
                    }
                }
            }
            Err(e) => Err(e),
        }
    }

    async fn service_account(
        &self,
        namespace: &str,
        name: &str,
    ) -> kubelet_api::Result<Option<ServiceAccount>> {
        match self.inner.service_account(namespace, name).await {
            Ok(got) => {
                self.keep(Kind::ServiceAccount, namespace, name, &got).await;
                Ok(got)
            }
            Err(e) => {
                self.fallback(Kind::ServiceAccount, namespace, name, e)
                    .await
            }
        }
    }

    fn services(&self) -> kubelet_api::Result<Option<Vec<Arc<Service>>>> {
        match self.inner.services() {
            Ok(Some(list)) => {
                // Called for every container start: written in the background, rate-limited.
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    let cp = Arc::clone(&self.checkpoint);
                    let copy = list.clone();
                    rt.spawn_blocking(move || {
                        if let Err(e) = cp.save_services(&copy) {
                            tracing::warn!("pod checkpoint: {e}");
                        }
                    });
                }
                Ok(Some(list))
            }
            Ok(None) => Ok(None),
            Err(e) if e.kind() == ErrorKind::Unavailable => match self.checkpoint.get_services() {
                Ok(Some(list)) => Ok(Some(list)),
                Ok(None) => Err(e),
                Err(c) => {
                    tracing::warn!("pod checkpoint: {c}");
                    Err(e)
                }
            },
            Err(e) => Err(e),
        }
    }

    async fn runtime_class(&self, name: &str) -> kubelet_api::Result<Option<RuntimeClass>> {
        match self.inner.runtime_class(name).await {
            Ok(got) => {
                self.keep(Kind::RuntimeClass, "", name, &got).await;
                Ok(got)
            }
            Err(e) => self.fallback(Kind::RuntimeClass, "", name, e).await,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequestSpec};
    use std::collections::BTreeMap;

    fn pod(uid: &str, config_map: &str, secret: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": format!("p-{uid}"), "namespace": "ns", "uid": uid },
            "spec": {
                "volumes": [
                    { "name": "c", "configMap": { "name": config_map } },
                    { "name": "s", "secret": { "secretName": secret } },
                ],
                "containers": [{ "name": "app", "image": "busybox" }],
            },
        }))
        .unwrap()
    }

    fn config_map(name: &str, value: &str) -> ConfigMap {
        ConfigMap {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            data: Some(BTreeMap::from([("k".to_string(), value.to_string())])),
            ..Default::default()
        }
    }

    fn open(dir: &Path) -> Checkpoint {
        Checkpoint::open(dir, "node-a", CheckpointConfig::default()).unwrap()
    }

    fn uids(cp: &Checkpoint) -> Vec<String> {
        cp.load_pods()
            .unwrap()
            .pods
            .iter()
            .map(|(p, _)| kubelet_api::pod::uid(p).to_string())
            .collect()
    }

    #[test]
    fn pods_and_the_objects_they_use_round_trip_and_go_with_their_pods() {
        let dir = tempfile::tempdir().unwrap();
        let cp = open(dir.path());
        assert!(matches!(
            cp.load_pods(),
            Err(CheckpointError::Missing { .. })
        ));
        assert!(
            cp.save_pods(&[pod("u1", "cm1", "s1"), pod("u2", "cm2", "s1")])
                .is_empty()
        );
        cp.put_object(
            Kind::ConfigMap,
            "ns",
            "cm1",
            Some(&config_map("cm1", "one")),
        )
        .unwrap();
        cp.put_object(
            Kind::ConfigMap,
            "ns",
            "cm2",
            Some(&config_map("cm2", "two")),
        )
        .unwrap();
        // Not referenced by a checkpointed pod: not kept.
        cp.put_object(
            Kind::ConfigMap,
            "ns",
            "other",
            Some(&config_map("other", "x")),
        )
        .unwrap();
        assert!(
            cp.get_object::<ConfigMap>(Kind::ConfigMap, "ns", "other")
                .unwrap()
                .is_none()
        );
        // Files are private.
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(DIR_NAME).join("configmaps/ns_cm1"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);

        // A new agent reads it back.
        let cp = open(dir.path());
        assert_eq!(uids(&cp), ["u1", "u2"]);
        let cm: ConfigMap = cp
            .get_object(Kind::ConfigMap, "ns", "cm1")
            .unwrap()
            .unwrap();
        assert_eq!(cm.data.unwrap()["k"], "one");

        // u2 goes: its ConfigMap goes with it, the shared Secret's reference stays.
        assert!(cp.save_pods(&[pod("u1", "cm1", "s1")]).is_empty());
        assert_eq!(uids(&cp), ["u1"]);
        assert!(
            cp.get_object::<ConfigMap>(Kind::ConfigMap, "ns", "cm2")
                .unwrap()
                .is_none()
        );
        assert!(
            cp.get_object::<ConfigMap>(Kind::ConfigMap, "ns", "cm1")
                .unwrap()
                .is_some()
        );
        // Deleted in the API server: deleted here.
        cp.put_object::<ConfigMap>(Kind::ConfigMap, "ns", "cm1", None)
            .unwrap();
        assert!(
            cp.get_object::<ConfigMap>(Kind::ConfigMap, "ns", "cm1")
                .unwrap()
                .is_none()
        );
        let size = cp.size();
        assert!(size > 0 && size < 4096, "{size}");
    }

    #[test]
    fn a_pod_whose_resource_version_is_unchanged_is_not_written_again() {
        let dir = tempfile::tempdir().unwrap();
        let cp = open(dir.path());
        let mut p = pod("u1", "a", "b");
        p.metadata.resource_version = Some("7".into());
        assert!(cp.save_pods(std::slice::from_ref(&p)).is_empty());
        // Same version, other content: taken as unchanged (the API server changes the version
        // with every change), so the file keeps the first content.
        p.metadata.labels = Some(BTreeMap::from([("v".to_string(), "2".to_string())]));
        assert!(cp.save_pods(std::slice::from_ref(&p)).is_empty());
        let read = |cp: &Checkpoint| cp.load_pods().unwrap().pods[0].0.metadata.labels.clone();
        assert!(read(&cp).is_none());
        // A new version is written.
        p.metadata.resource_version = Some("8".into());
        assert!(cp.save_pods(std::slice::from_ref(&p)).is_empty());
        assert!(read(&cp).is_some());
        // A new agent knows the versions on disk.
        let cp = open(dir.path());
        cp.load_pods().unwrap();
        p.metadata.labels = None;
        assert!(cp.save_pods(std::slice::from_ref(&p)).is_empty());
        assert!(read(&cp).is_some(), "version 8 again: not rewritten");
    }

    #[test]
    fn a_corrupt_or_truncated_file_makes_the_checkpoint_unusable() {
        let dir = tempfile::tempdir().unwrap();
        let cp = open(dir.path());
        assert!(
            cp.save_pods(&[pod("u1", "a", "b"), pod("u2", "a", "b")])
                .is_empty()
        );
        let file = dir.path().join(DIR_NAME).join("pods/u2");
        let mut bytes = std::fs::read(&file).unwrap();
        let last = bytes.len() - 2;
        bytes[last] ^= 0x20;
        std::fs::write(&file, &bytes).unwrap();
        let e = open(dir.path()).load_pods().unwrap_err();
        assert!(
            matches!(&e, CheckpointError::Corrupt { reason, .. } if reason.contains("checksum")),
            "{e}"
        );
        std::fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
        let e = open(dir.path()).load_pods().unwrap_err();
        assert!(matches!(e, CheckpointError::Corrupt { .. }), "{e}");
        std::fs::write(dir.path().join(DIR_NAME).join("state"), b"").unwrap();
        let e = open(dir.path()).load_pods().unwrap_err();
        assert!(matches!(e, CheckpointError::Corrupt { .. }), "{e}");
        // The next save replaces what is broken.
        let cp = open(dir.path());
        assert!(cp.save_pods(&[pod("u2", "a", "b")]).is_empty());
        assert_eq!(uids(&cp), ["u2"]);
    }

    #[test]
    fn another_nodes_checkpoint_is_not_read_and_is_replaced_a_newer_one_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let other = Checkpoint::open(dir.path(), "node-b", CheckpointConfig::default()).unwrap();
        assert!(other.save_pods(&[pod("b1", "a", "b")]).is_empty());
        let cp = open(dir.path());
        let e = cp.load_pods().unwrap_err();
        assert!(
            matches!(&e, CheckpointError::OtherNode { found, .. } if found == "node-b"),
            "{e}"
        );
        assert!(cp.save_pods(&[pod("a1", "a", "b")]).is_empty());
        assert_eq!(uids(&open(dir.path())), ["a1"], "node-b's pods are gone");

        // A newer format: neither read nor overwritten.
        let state = dir.path().join(DIR_NAME).join("state");
        let text = std::fs::read_to_string(&state).unwrap();
        let newer = text.replacen("\"version\":1", "\"version\":2", 1);
        std::fs::write(&state, &newer).unwrap();
        let cp = open(dir.path());
        assert!(matches!(
            cp.load_pods(),
            Err(CheckpointError::NewerVersion { found: 2, .. })
        ));
        let errors = cp.save_pods(&[pod("a2", "a", "b")]);
        assert!(
            matches!(errors.first(), Some(CheckpointError::NewerVersion { .. })),
            "{errors:?}"
        );
        assert_eq!(std::fs::read_to_string(&state).unwrap(), newer);
        assert!(!dir.path().join(DIR_NAME).join("pods/a2").exists());
    }

    #[test]
    fn a_write_over_the_size_limit_is_refused_and_the_previous_file_stays() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open(
            dir.path(),
            "node-a",
            CheckpointConfig::default().max_bytes(2500),
        )
        .unwrap();
        assert!(cp.save_pods(&[pod("u1", "a", "b")]).is_empty());
        let mut big = pod("u1", "a", "b");
        big.metadata.annotations = Some(BTreeMap::from([("big".to_string(), "x".repeat(4000))]));
        let errors = cp.save_pods(&[big]);
        assert!(
            matches!(
                errors.first(),
                Some(CheckpointError::Full { limit: 2500, .. })
            ),
            "{errors:?}"
        );
        let loaded = open(dir.path()).load_pods().unwrap();
        assert_eq!(loaded.pods.len(), 1);
        assert!(
            loaded.pods[0].0.metadata.annotations.is_none(),
            "the old pod"
        );
    }

    /// A full disk while writing: the previous checkpoint stays valid (root: a real tmpfs).
    #[test]
    fn a_full_disk_leaves_the_previous_checkpoint_valid() {
        if !nix::unistd::geteuid().is_root() {
            assert!(!kubelet_testenv::required(), "needs root to mount a tmpfs");
            eprintln!("SKIP: needs root");
            return;
        }
        let outer = tempfile::tempdir().unwrap();
        let fs = kubelet_testenv::Tmpfs::mount(&outer.path().join("fs"), "256k").unwrap();
        let cp = open(fs.path());
        assert!(cp.save_pods(&[pod("u1", "a", "b")]).is_empty());
        let filler = fs.fill();
        let mut changed = pod("u1", "a", "b");
        changed.metadata.labels = Some(BTreeMap::from([("v".to_string(), "2".to_string())]));
        let errors = cp.save_pods(&[changed.clone(), pod("u2", "a", "b")]);
        assert!(
            errors
                .iter()
                .any(|e| matches!(e, CheckpointError::Io { .. })),
            "{errors:?}"
        );
        let loaded = open(fs.path()).load_pods().unwrap();
        let (p, _) = loaded
            .pods
            .iter()
            .find(|(p, _)| kubelet_api::pod::uid(p) == "u1")
            .unwrap();
        assert!(p.metadata.labels.is_none(), "the previous version of u1");
        assert!(
            std::fs::read_dir(fs.path().join(DIR_NAME).join("pods"))
                .unwrap()
                .all(|e| !e.unwrap().file_name().to_string_lossy().ends_with(".tmp")),
            "no temporary file left"
        );
        std::fs::remove_file(filler).unwrap();
        assert!(cp.save_pods(&[changed, pod("u2", "a", "b")]).is_empty());
        assert_eq!(uids(&open(fs.path())), ["u1", "u2"]);
    }

    #[test]
    fn age_counts_from_the_later_of_the_confirmation_and_the_write() {
        let t = |s: &str| s.parse::<Timestamp>().unwrap();
        let pods = CheckpointedPods {
            confirmed_at: t("2026-01-01T10:00:00Z"),
            pods: Vec::new(),
        };
        let now = t("2026-01-01T12:00:00Z");
        assert_eq!(
            pods.age(t("2026-01-01T09:00:00Z"), now),
            Duration::from_secs(7200)
        );
        assert_eq!(
            pods.age(t("2026-01-01T11:00:00Z"), now),
            Duration::from_secs(3600)
        );
    }

    /// An inner provider that fails with a given kind, or answers.
    struct Inner {
        fail: Mutex<Option<ErrorKind>>,
        config_map: Option<ConfigMap>,
    }

    #[async_trait]
    impl ObjectProvider for Inner {
        async fn config_map(&self, _: &str, _: &str) -> kubelet_api::Result<Option<ConfigMap>> {
            match *self.fail.lock() {
                Some(k) => Err(kubelet_api::Error::new(k, "no")),
                None => Ok(self.config_map.clone()),
            }
        }
        async fn secret(&self, _: &str, _: &str) -> kubelet_api::Result<Option<Secret>> {
            Err(kubelet_api::Error::new(ErrorKind::Unavailable, "down"))
        }
        async fn request_service_account_token(
            &self,
            _: &str,
            _: &str,
            request: &TokenRequest,
        ) -> kubelet_api::Result<TokenRequest> {
            match *self.fail.lock() {
                Some(k) => Err(kubelet_api::Error::new(k, "no")),
                None => {
                    let mut answer = request.clone();
                    answer.status =
                        Some(k8s_openapi::api::authentication::v1::TokenRequestStatus {
                            token: "the-token".to_string(),
                            expiration_timestamp:
                                k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                                ),
                        });
                    Ok(answer)
                }
            }
        }
        fn services(&self) -> kubelet_api::Result<Option<Vec<Arc<Service>>>> {
            match *self.fail.lock() {
                Some(k) => Err(kubelet_api::Error::new(k, "not listed yet")),
                None => Ok(Some(vec![Arc::new(Service {
                    metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                        name: Some("web".into()),
                        namespace: Some("ns".into()),
                        ..Default::default()
                    },
                    ..Default::default()
                })])),
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lookups_are_answered_from_the_checkpoint_only_while_the_api_server_is_unavailable() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Arc::new(open(dir.path()));
        assert!(cp.save_pods(&[pod("u1", "cm1", "s1")]).is_empty());
        let objects = CheckpointedObjects::new(
            Inner {
                fail: Mutex::new(None),
                config_map: Some(config_map("cm1", "one")),
            },
            Arc::clone(&cp),
        );
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: vec!["api".into()],
                bound_object_ref: Some(BoundObjectReference {
                    kind: Some("Pod".into()),
                    name: Some("p-u1".into()),
                    uid: Some("u1".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        // Online: answers are kept.
        assert!(objects.config_map("ns", "cm1").await.unwrap().is_some());
        objects
            .request_service_account_token("ns", "default", &request)
            .await
            .unwrap();
        assert!(objects.services().unwrap().unwrap().len() == 1);
        // The Services are written in the background.
        for _ in 0..100 {
            if dir.path().join(DIR_NAME).join("services").exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        // Unavailable: answered from the checkpoint.
        *objects.inner.fail.lock() = Some(ErrorKind::Unavailable);
        let cm = objects.config_map("ns", "cm1").await.unwrap().unwrap();
        assert_eq!(cm.data.unwrap()["k"], "one");
        let token = objects
            .request_service_account_token("ns", "default", &request)
            .await
            .unwrap();
        assert_eq!(token.status.unwrap().token, "the-token");
        assert_eq!(objects.services().unwrap().unwrap().len(), 1);
        // Nothing kept for it: the API server's error.
        let e = objects.secret("ns", "s1").await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable);

        // Permission errors are never answered from the checkpoint.
        *objects.inner.fail.lock() = Some(ErrorKind::PermissionDenied);
        let e = objects.config_map("ns", "cm1").await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::PermissionDenied);
        assert!(objects.services().is_err());

        // The API server says it is gone (a Secret removed while offline, say): gone here too.
        let gone = CheckpointedObjects::new(
            Inner {
                fail: Mutex::new(None),
                config_map: None,
            },
            Arc::clone(&cp),
        );
        assert!(gone.config_map("ns", "cm1").await.unwrap().is_none());
        *gone.inner.fail.lock() = Some(ErrorKind::Unavailable);
        assert!(gone.config_map("ns", "cm1").await.is_err());
    }
}
