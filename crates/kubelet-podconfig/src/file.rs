//! [`FileSource`]: static pods from a manifest directory or file (the kubelet's
//! `--pod-manifest-path`).
//!
//! # Change detection
//!
//! - A full re-list at start and then every [`FileSourceConfig::check_frequency`] (20 s by
//!   default, the kubelet's `fileCheckFrequency`).
//! - An inotify watch on the directory (for a single file: on its parent directory, filtered to
//!   that file's name, so editors that save by rename keep being seen). Editor artefacts are
//!   ignored, in listings and in events ([`is_ignored_name`]: dot-files such as swap files and
//!   the `.tmp` files of atomic saves, backups ending in `~`, Emacs `#auto-save#` files; the
//!   kubelet ignores only dot-files), and so are subdirectories.
//! - ConfigMap-style directories (visible symlinks into `..data`, which the writer swaps
//!   atomically) are followed: a change of `..data` re-reads the directory. When the path itself
//!   is a symlink to a directory, its parent is watched too, and a re-pointed link moves the
//!   watch to the new target.
//! - Watch events are debounced: after an event the source waits until no event came for
//!   [`FileSourceConfig::debounce`] (100 ms), and while a file is still open for writing
//!   (`IN_MODIFY` without `IN_CLOSE_WRITE`) up to [`FileSourceConfig::max_write_wait`] (2 s), so
//!   a file written in several chunks or saved by rename yields one snapshot.
//! - Every change lists the whole path and sends the full current set of pods; the merge
//!   ([`kubelet_core::merge::PodStorage`]) turns it into ADD / REMOVE / UPDATE operations. A
//!   file whose device, inode, size, modification and change times are those of its last
//!   good read is not read again: its pod is reused (only when that read happened at least a
//!   second after the file's last modification, so that a rewrite within the timestamps'
//!   granularity cannot go unseen). A file read sooner is read again by the next listing, but
//!   its bytes are decoded again only when they differ from those its pod was decoded from (by
//!   their 128-bit FNV-1a hash): a burst of new manifests is decoded once, not again at the
//!   first re-list after it. A re-list that finds every file as it was, all of them
//!   valid, sends nothing: at 1,000 static pods a periodic re-list is a directory listing and
//!   1,000 `stat`s, not 1,000 parses and a snapshot for the merge to compare.
//! - A missing path gives an empty snapshot (so the source counts as seen) and is retried every
//!   [`FileSourceConfig::missing_path_retry`] (1 s). A watch that cannot be set up is retried
//!   with backoff from 1 s to 20 s; the periodic re-list goes on meanwhile.
//!
//! # Invalid manifests
//!
//! As in the kubelet: when the re-list was triggered by a watch event, a file that fails to
//! read, decode or validate keeps the pod it last produced (if any) until the next periodic
//! re-list; a periodic re-list skips it, so its old pod is removed. Each failure is logged and
//! recorded as a `FailedValidation` warning event naming the file and the reason, once per
//! distinct error (a file that stays broken is not reported again every period). Other files'
//! pods are never affected.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use futures::StreamExt;
use inotify::{EventMask, EventStream, Inotify, WatchDescriptor, WatchMask};
use k8s_openapi::api::core::v1::Pod;
use kubelet_api::sources;
use kubelet_api::{EventRecorder, InvolvedObject, PodSource, SourceSender};
use kubelet_core::merge::REASON_FAILED_VALIDATION;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::PodConfigError;
use crate::manifest::{self, ManifestFailure};
use crate::validation::ValidationOptions;

/// Settings of a [`FileSource`]. Start from [`Default`] and adjust with the setters.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FileSourceConfig {
    /// Period of the full re-list (kubelet `fileCheckFrequency`, default 20 s).
    pub check_frequency: Duration,
    /// Quiet time after a watch event before re-reading (default 100 ms).
    pub debounce: Duration,
    /// Longest wait for a file that is still open for writing (default 2 s).
    pub max_write_wait: Duration,
    /// Retry period while the path does not exist (default 1 s, as the kubelet's).
    pub missing_path_retry: Duration,
    /// How manifests are validated (default: static pods without API references).
    pub validation: ValidationOptions,
}

impl Default for FileSourceConfig {
    fn default() -> Self {
        Self {
            check_frequency: Duration::from_secs(20),
            debounce: Duration::from_millis(100),
            max_write_wait: Duration::from_secs(2),
            missing_path_retry: Duration::from_secs(1),
            validation: ValidationOptions::static_pod(),
        }
    }
}

impl FileSourceConfig {
    /// Set the full re-list period.
    pub fn check_frequency(mut self, period: Duration) -> Self {
        self.check_frequency = period;
        self
    }

    /// Set the debounce quiet time.
    pub fn debounce(mut self, quiet: Duration) -> Self {
        self.debounce = quiet;
        self
    }

    /// Set the longest wait for a file still open for writing.
    pub fn max_write_wait(mut self, wait: Duration) -> Self {
        self.max_write_wait = wait;
        self
    }

    /// Allow static pods to reference API objects (set when the agent has an API source).
    pub fn allow_api_references(mut self, allow: bool) -> Self {
        self.validation = self.validation.allow_api_references(allow);
        self
    }

    /// Set the retry period while the path is missing.
    pub fn missing_path_retry(mut self, period: Duration) -> Self {
        self.missing_path_retry = period;
        self
    }
}

/// Static pods from a directory of manifests or a single manifest file: a [`PodSource`] named
/// `file`. See the [module docs](self) for how it detects changes and handles bad manifests.
#[derive(Debug, Clone)]
pub struct FileSource {
    path: PathBuf,
    node_name: String,
    config: FileSourceConfig,
}

impl FileSource {
    /// A source reading `path` (a directory or a file; a trailing `/` is ignored) for node
    /// `node_name`, with the default settings.
    pub fn new(path: impl Into<PathBuf>, node_name: impl Into<String>) -> Self {
        let path = path.into();
        let text = path.to_string_lossy();
        let trimmed = text.trim_end_matches('/');
        let path = if trimmed.is_empty() || trimmed.len() == text.len() {
            path
        } else {
            PathBuf::from(trimmed)
        };
        Self {
            path,
            node_name: node_name.into(),
            config: FileSourceConfig::default(),
        }
    }

    /// Replace the settings.
    pub fn with_config(mut self, config: FileSourceConfig) -> Self {
        self.config = config;
        self
    }

    /// The manifest path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The node name static pods are defaulted for.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// The settings.
    pub fn config(&self) -> &FileSourceConfig {
        &self.config
    }
}

#[async_trait]
impl PodSource for FileSource {
    fn name(&self) -> &str {
        sources::FILE
    }

    async fn run(&self, out: SourceSender, shutdown: CancellationToken) {
        let mut state = State::new(self.path.clone(), out.recorder().clone());
        let mut watcher: Option<Watcher> = None;
        let mut watch_backoff = WATCH_BACKOFF_MIN;
        let mut next_watch_attempt = Instant::now();
        let mut next_relist = Instant::now();
        tracing::info!(path = %self.path.display(), "watching static pod manifests");

        loop {
            let now = Instant::now();
            if watcher.is_none() && now >= next_watch_attempt && self.path.exists() {
                // Set up the watch before listing, so nothing written in between is missed.
                match Watcher::new(&self.path) {
                    Ok(w) => {
                        tracing::debug!(path = %self.path.display(), "inotify watch established");
                        watcher = Some(w);
                        watch_backoff = WATCH_BACKOFF_MIN;
                    }
                    Err(source) => {
                        let err = PodConfigError::Watch {
                            path: self.path.clone(),
                            source,
                        };
                        tracing::warn!(error = %kubelet_api::chain(&err), retry_in = ?watch_backoff, "static pod watch failed; re-listing periodically meanwhile");
                        next_watch_attempt = now + watch_backoff;
                        watch_backoff = (watch_backoff * 2).min(WATCH_BACKOFF_MAX);
                    }
                }
            }
            if now >= next_relist {
                let missing = self
                    .relist_and_send(&mut state, &out, Trigger::Periodic)
                    .await;
                let Some(missing) = missing else { return };
                next_relist = now
                    + if missing {
                        self.config.missing_path_retry
                    } else {
                        self.config.check_frequency
                    };
                if missing {
                    watcher = None;
                }
            }

            let wake = if watcher.is_none() {
                next_relist.min(next_watch_attempt.max(now))
            } else {
                next_relist
            };
            let event = async {
                match watcher.as_mut() {
                    Some(w) => w.stream.next().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep_until(wake) => {}
                ev = event => {
                    let Some(w) = watcher.as_mut() else { continue };
                    let mut burst = Burst::default();
                    burst.take(&w.filter, ev);
                    if !burst.relevant && burst.alive {
                        continue;
                    }
                    if burst.alive {
                        // Debounce: wait for quiet, and for writers to close their files.
                        let start = Instant::now();
                        let mut last = start;
                        loop {
                            let quiet = last + self.config.debounce;
                            let deadline = if burst.writing.is_empty() {
                                quiet
                            } else {
                                quiet.max(start + self.config.max_write_wait)
                            }
                            .min(start + self.config.max_write_wait.max(self.config.debounce));
                            tokio::select! {
                                _ = shutdown.cancelled() => return,
                                _ = tokio::time::sleep_until(deadline) => break,
                                ev = w.stream.next() => {
                                    burst.take(&w.filter, ev);
                                    last = Instant::now();
                                    if !burst.alive { break; }
                                }
                            }
                        }
                    }
                    if !burst.alive {
                        tracing::debug!(path = %self.path.display(), "static pod watch ended; re-establishing");
                        watcher = None;
                        next_watch_attempt = Instant::now();
                    }
                    if burst.relevant || !burst.alive {
                        let missing = self.relist_and_send(&mut state, &out, Trigger::Watch).await;
                        if missing.is_none() {
                            return;
                        }
                    }
                }
            }
        }
    }
}

impl FileSource {
    /// Re-list and send the snapshot. `None` when the receiver is gone; otherwise whether the
    /// path was missing.
    async fn relist_and_send(
        &self,
        state: &mut State,
        out: &SourceSender,
        trigger: Trigger,
    ) -> Option<bool> {
        let path = self.path.clone();
        let node = self.node_name.clone();
        let options = self.config.validation;
        // The listing reads the pods last sent (to reuse those of unchanged files), and takes
        // the read cache and gives it back.
        let mut cache = std::mem::take(&mut state.cache);
        let known = Arc::clone(&state.pods);
        let may_skip = state.applied && state.reported.is_empty();
        let listed = tokio::task::spawn_blocking(move || {
            let listed = list(&path, &node, &options, &mut cache, &known, may_skip);
            (listed, cache)
        })
        .await;
        let listing = match listed {
            Ok((listed, cache)) => {
                state.cache = cache;
                match listed {
                    Listed::Unchanged => {
                        tracing::trace!(path = %self.path.display(), ?trigger, "static pods unchanged");
                        return Some(false);
                    }
                    Listed::Changed(listing) => listing,
                }
            }
            Err(e) => {
                tracing::error!(error = %kubelet_api::chain(&e), "static pod listing task failed");
                return Some(false);
            }
        };
        let missing = matches!(listing, Listing::Missing);
        let Some(pods) = state.apply(listing, trigger) else {
            return Some(missing);
        };
        tracing::debug!(path = %self.path.display(), pods = pods.len(), ?trigger, "static pod snapshot");
        match out.snapshot(pods).await {
            Ok(()) => Some(missing),
            Err(_) => None,
        }
    }
}

const WATCH_BACKOFF_MIN: Duration = Duration::from_secs(1);
const WATCH_BACKOFF_MAX: Duration = Duration::from_secs(20);

/// What caused a re-list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trigger {
    /// Start or the periodic re-list: invalid files are skipped.
    Periodic,
    /// A watch event: invalid files keep their last good pod.
    Watch,
}

/// Result of reading the manifest path.
#[derive(Debug)]
enum Listing {
    /// The path does not exist.
    Missing,
    /// The directory could not be listed.
    Failed(PodConfigError),
    /// Every manifest file, in lexical order, with its pod or its failure.
    Files(Vec<(PathBuf, Result<Arc<Pod>, ManifestFailure>)>),
}

/// What identifies a manifest file's content without reading it (of the file a symlink
/// points to: a ConfigMap-style swap changes it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileKey {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileKey {
    fn of(m: &std::fs::Metadata) -> Self {
        Self {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

/// How long after a file's last modification its read is trusted for later re-lists: a
/// rewrite within the file system's timestamp granularity of the read could keep every field
/// of its [`FileKey`].
const SETTLED: Duration = Duration::from_secs(1);

/// The key every manifest file had when the pod [`State`] keeps for it was read.
#[derive(Debug, Default)]
struct ReadCache {
    keys: HashMap<PathBuf, FileKey>,
    /// Of each valid file read before it settled, the hash of the bytes the pod [`State`]
    /// keeps for it was decoded from: a later read of the same bytes takes that pod instead of
    /// decoding them again (a burst of new manifests is read once when written and, at the
    /// first re-list after it, read again but not decoded).
    unsettled: HashMap<PathBuf, u128>,
}

impl ReadCache {
    /// The pod `known` holds for `file` when the file's key is the cached one: the file has not
    /// changed since that pod was read from it.
    fn hit<'a>(
        &self,
        file: &Path,
        meta: &std::fs::Metadata,
        known: &'a BTreeMap<PathBuf, Arc<Pod>>,
    ) -> Option<&'a Arc<Pod>> {
        if self.keys.get(file) == Some(&FileKey::of(meta)) {
            known.get(file)
        } else {
            None
        }
    }
}

/// What [`list`] found.
#[derive(Debug)]
enum Listed {
    /// Every file is one the cache holds, with its key, and there is no other: the pods last
    /// sent stand.
    Unchanged,
    /// Something changed (or the caller asked for the listing anyway).
    Changed(Listing),
}

/// A regular file of the manifest path, or one whose `stat` failed.
type Entry = (PathBuf, std::io::Result<std::fs::Metadata>);

/// Read every manifest under `path` (blocking), taking the pod of a file whose key the cache
/// holds from `known` (the pods last sent, by file) instead of reading it again. With
/// `may_skip`, a listing where nothing changed is [`Listed::Unchanged`]. `cache` is left with
/// the keys of this listing's settled, valid files.
fn list(
    path: &Path,
    node_name: &str,
    options: &ValidationOptions,
    cache: &mut ReadCache,
    known: &BTreeMap<PathBuf, Arc<Pod>>,
    may_skip: bool,
) -> Listed {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            cache.keys.clear();
            cache.unsettled.clear();
            return Listed::Changed(Listing::Missing);
        }
        Err(source) => {
            return Listed::Changed(Listing::Failed(PodConfigError::ListManifestDir {
                path: path.to_path_buf(),
                source,
            }));
        }
    };
    let started = SystemTime::now();
    let entries = if meta.is_dir() {
        match entries(path) {
            Ok(e) => e,
            Err(e) => return Listed::Changed(Listing::Failed(e)),
        }
    } else {
        vec![(path.to_path_buf(), Ok(meta))]
    };
    if may_skip
        && entries.len() == cache.keys.len()
        && entries.len() == known.len()
        && entries.iter().all(|(file, m)| {
            m.as_ref()
                .is_ok_and(|m| cache.hit(file, m, known).is_some())
        })
    {
        return Listed::Unchanged;
    }
    let mut files = Vec::with_capacity(entries.len());
    for (file, meta) in entries {
        let result = match meta {
            Ok(m) => read_cached(&file, &m, started, node_name, options, cache, known),
            Err(source) => {
                cache.keys.remove(&file);
                Err(PodConfigError::ReadManifest {
                    path: file.clone(),
                    source,
                }
                .into())
            }
        };
        files.push((file, result));
    }
    let present: HashSet<&PathBuf> = files.iter().map(|(p, _)| p).collect();
    cache.keys.retain(|p, _| present.contains(p));
    cache.unsettled.retain(|p, _| present.contains(p));
    Listed::Changed(Listing::Files(files))
}

/// One manifest file: its known pod when its key is the cached one, else read (and its key
/// cached when it is valid and settled); the bytes read are decoded unless they are those
/// the known pod was decoded from before the file settled.
fn read_cached(
    file: &Path,
    meta: &std::fs::Metadata,
    started: SystemTime,
    node_name: &str,
    options: &ValidationOptions,
    cache: &mut ReadCache,
    known: &BTreeMap<PathBuf, Arc<Pod>>,
) -> Result<Arc<Pod>, ManifestFailure> {
    if let Some(pod) = cache.hit(file, meta, known) {
        return Ok(pod.clone());
    }
    let data = match manifest::read_manifest_file(file) {
        Ok(data) => data,
        Err(e) => {
            cache.keys.remove(file);
            cache.unsettled.remove(file);
            return Err(e.into());
        }
    };
    let settled = meta
        .modified()
        .ok()
        .and_then(|m| m.checked_add(SETTLED))
        .is_some_and(|m| m <= started);
    // Hashed only when it is kept (the file has not settled) or compared (a hash is kept).
    let hash = (!settled || cache.unsettled.contains_key(file)).then(|| {
        let mut hash = manifest::Fnv128a::new();
        hash.write(&data);
        hash.sum()
    });
    let same = hash.is_some() && cache.unsettled.get(file) == hash.as_ref();
    let result = match known.get(file).filter(|_| same) {
        // The bytes the known pod was decoded from: the same pod.
        Some(pod) => Ok(pod.clone()),
        // Marked here, the pod the source keeps is the one the merge stores (no copy per pod).
        None => manifest::load_data(file, &data, node_name, options).map(|mut pod| {
            kubelet_api::mark_seen(&mut pod, sources::FILE);
            Arc::new(pod)
        }),
    };
    match (&result, settled) {
        (Ok(_), true) => {
            cache.keys.insert(file.to_path_buf(), FileKey::of(meta));
            cache.unsettled.remove(file);
        }
        (Ok(_), false) => {
            cache.keys.remove(file);
            if let Some(hash) = hash {
                cache.unsettled.insert(file.to_path_buf(), hash);
            }
        }
        (Err(_), _) => {
            cache.keys.remove(file);
            cache.unsettled.remove(file);
        }
    }
    result
}

/// The regular files of directory `path`, in lexical order, with their metadata (blocking).
fn entries(path: &Path) -> Result<Vec<Entry>, PodConfigError> {
    let failed = |source| PodConfigError::ListManifestDir {
        path: path.to_path_buf(),
        source,
    };
    let mut names: Vec<OsString> = Vec::new();
    for entry in std::fs::read_dir(path).map_err(failed)? {
        let name = entry.map_err(failed)?.file_name();
        if !is_ignored_name(&name.to_string_lossy()) {
            names.push(name);
        }
    }
    kubelet_api::sort::by(&mut names, Ord::cmp);
    let mut files = Vec::with_capacity(names.len());
    for name in names {
        let file = path.join(&name);
        match std::fs::metadata(&file) {
            Ok(m) if m.is_dir() => {
                tracing::debug!(path = %file.display(), "not recursing into manifest path");
            }
            Ok(m) if !m.is_file() => {
                tracing::debug!(path = %file.display(), "manifest path is not a regular file; skipping");
            }
            // Deleted between listing and stat: it is simply gone.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            m => files.push((file, m)),
        }
    }
    Ok(files)
}

/// The file source's memory: the last good pod of every manifest file, and the errors already
/// reported.
struct State {
    root: PathBuf,
    recorder: EventRecorder,
    /// Shared with the blocking listing task, which reuses the pods of unchanged files: a
    /// listing that fails (or panics) leaves them in place.
    pods: Arc<BTreeMap<PathBuf, Arc<Pod>>>,
    reported: HashMap<PathBuf, String>,
    /// Which file each pod full name (`name_namespace`) belongs to.
    owners: HashMap<String, PathBuf>,
    /// The pods of the files read before, for the next listing.
    cache: ReadCache,
    /// Set once a listing has been applied (and its snapshot sent).
    applied: bool,
}

impl State {
    fn new(root: PathBuf, recorder: EventRecorder) -> Self {
        Self {
            root,
            recorder,
            pods: Arc::default(),
            reported: HashMap::new(),
            owners: HashMap::new(),
            cache: ReadCache::default(),
            applied: false,
        }
    }

    /// Two files naming the same pod: the file that already had the name keeps it, else the
    /// first in lexical order; the other is left out with a warning that names both files (so a
    /// new file can never replace a running pod by reusing its name).
    fn resolve_duplicates(&mut self, pods: &mut BTreeMap<PathBuf, Arc<Pod>>) {
        let mut owners: HashMap<String, PathBuf> = HashMap::new();
        for (file, pod) in pods.iter() {
            let name = kubelet_api::pod::full_name(pod);
            if self.owners.get(&name) == Some(file) {
                owners.insert(name, file.clone());
            }
        }
        for (file, pod) in pods.iter() {
            owners
                .entry(kubelet_api::pod::full_name(pod))
                .or_insert_with(|| file.clone());
        }
        let mut losers = Vec::new();
        for (file, pod) in pods.iter() {
            let name = kubelet_api::pod::full_name(pod);
            if let Some(owner) = owners.get(&name).filter(|o| *o != file) {
                losers.push((file.clone(), owner.clone(), pod.clone()));
            }
        }
        for (file, owner, pod) in losers {
            pods.remove(&file);
            let message = format!(
                "static pod {:?} of {} is ignored: {} already defines a pod of that name in namespace {:?}",
                kubelet_api::pod::name(&pod),
                file.display(),
                owner.display(),
                kubelet_api::pod::namespace(&pod)
            );
            if self.reported.get(&file) != Some(&message) {
                tracing::warn!(path = %file.display(), owner = %owner.display(), "duplicate static pod name; ignoring the file");
                self.recorder.warning(
                    InvolvedObject::file(&file),
                    REASON_FAILED_VALIDATION,
                    message.clone(),
                );
                self.reported.insert(file, message);
            }
        }
        self.owners = owners;
    }

    /// Fold a listing into the state; returns the snapshot to send, or `None` when the listing
    /// failed and nothing should be sent.
    fn apply(&mut self, listing: Listing, trigger: Trigger) -> Option<Vec<Arc<Pod>>> {
        let files = match listing {
            Listing::Missing => {
                if self
                    .reported
                    .insert(self.root.clone(), "missing".into())
                    .is_none()
                {
                    tracing::info!(path = %self.root.display(), "static pod path does not exist; retrying");
                }
                self.pods = Arc::default();
                return Some(Vec::new());
            }
            Listing::Failed(err) => {
                self.report(None, &err);
                return None;
            }
            Listing::Files(files) => files,
        };
        self.reported.remove(&self.root);
        self.applied = true;
        let mut pods = BTreeMap::new();
        let mut present = HashSet::new();
        for (file, result) in files {
            present.insert(file.clone());
            match result {
                Ok(pod) => {
                    if self.reported.remove(&file).is_some() {
                        tracing::info!(path = %file.display(), "static pod manifest is valid again");
                    }
                    pods.insert(file, pod);
                }
                Err(failure) => {
                    self.report(failure.pod.as_deref(), &failure.error);
                    match (trigger, self.pods.get(&file).cloned()) {
                        (Trigger::Watch, Some(old)) => {
                            tracing::info!(path = %file.display(), "keeping the last good pod of the invalid manifest until the next periodic re-list");
                            pods.insert(file, old);
                        }
                        (Trigger::Periodic, Some(_)) => {
                            tracing::warn!(path = %file.display(), "static pod manifest is invalid; removing its pod");
                        }
                        (_, None) => {}
                    }
                }
            }
        }
        self.reported
            .retain(|path, _| present.contains(path) || *path == self.root);
        self.resolve_duplicates(&mut pods);
        let snapshot = pods.values().cloned().collect();
        self.pods = Arc::new(pods);
        Some(snapshot)
    }

    /// Log and record a failure once per distinct message.
    fn report(&mut self, pod: Option<&Pod>, err: &PodConfigError) {
        let message = kubelet_api::chain(err).to_string();
        let path = err.path().to_path_buf();
        if self.reported.get(&path) == Some(&message) {
            tracing::debug!(error = %message, "static pod manifest still invalid");
            return;
        }
        tracing::warn!(path = %path.display(), error = %message, "could not process static pod manifest");
        let involved = match pod {
            Some(p) => InvolvedObject::pod(p),
            None => InvolvedObject::file(&path),
        };
        self.recorder
            .warning(involved, REASON_FAILED_VALIDATION, message.clone());
        self.reported.insert(path, message);
    }
}

/// An inotify watch on the manifest directory (or on the parent of a manifest file), plus, when
/// the path is a symlink, a watch on the link's directory so a re-pointed link is noticed.
struct Watcher {
    stream: EventStream<Vec<u8>>,
    filter: Filter,
}

/// Which events of a [`Watcher`] count.
#[derive(Debug, Default)]
struct Filter {
    /// For a single-file path: the only name whose events count.
    only: Option<OsString>,
    /// For a symlinked path: the watch on the link's parent and the link's name; an event on
    /// that name means the link was replaced, so the watch must be set up again.
    link: Option<(WatchDescriptor, OsString)>,
}

impl Watcher {
    fn new(path: &Path) -> std::io::Result<Self> {
        let inotify = Inotify::init()?;
        let mask = WatchMask::CREATE
            | WatchMask::MODIFY
            | WatchMask::CLOSE_WRITE
            | WatchMask::ATTRIB
            | WatchMask::DELETE
            | WatchMask::MOVED_FROM
            | WatchMask::MOVED_TO
            | WatchMask::DELETE_SELF
            | WatchMask::MOVE_SELF;
        let parent = || match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let is_dir = std::fs::metadata(path)?.is_dir();
        let (dir, only) = if is_dir {
            (path.to_path_buf(), None)
        } else {
            (parent(), path.file_name().map(OsString::from))
        };
        inotify.watches().add(&dir, mask)?;
        let mut link = None;
        if is_dir
            && std::fs::symlink_metadata(path)?.file_type().is_symlink()
            && let Some(name) = path.file_name()
        {
            let wd = inotify.watches().add(
                parent(),
                WatchMask::CREATE
                    | WatchMask::DELETE
                    | WatchMask::MOVED_FROM
                    | WatchMask::MOVED_TO
                    | WatchMask::DONT_FOLLOW,
            )?;
            link = Some((wd, OsString::from(name)));
        }
        let stream = inotify.into_event_stream(vec![0u8; 4096])?;
        Ok(Self {
            stream,
            filter: Filter { only, link },
        })
    }
}

/// True for names that are editor or tool artefacts, never manifests: dot-files (swap files,
/// `.tmp` files of atomic saves, the `..data` machinery of ConfigMap mounts), backups ending in
/// `~`, and Emacs auto-save files `#name#`.
pub fn is_ignored_name(name: &str) -> bool {
    name.starts_with('.')
        || name.ends_with('~')
        || (name.len() > 1 && name.starts_with('#') && name.ends_with('#'))
}

/// True for the names of a ConfigMap/Secret volume's atomic writer (`..data`, `..data_tmp`,
/// `..<timestamp>`): ignored as manifests, but a change to them is a change of the manifests
/// the visible symlinks point to.
fn is_atomic_writer_name(name: &str) -> bool {
    name.starts_with("..")
}

/// What a run of watch events amounts to.
#[derive(Debug)]
struct Burst {
    /// Some event touched a manifest.
    relevant: bool,
    /// The watch still works.
    alive: bool,
    /// Files modified and not yet closed.
    writing: HashSet<OsString>,
}

impl Default for Burst {
    fn default() -> Self {
        Self {
            relevant: false,
            alive: true,
            writing: HashSet::new(),
        }
    }
}

impl Burst {
    fn take(&mut self, filter: &Filter, ev: Option<std::io::Result<inotify::EventOwned>>) {
        let ev = match ev {
            Some(Ok(ev)) => ev,
            Some(Err(e)) => {
                tracing::warn!(error = %kubelet_api::chain(&e), "reading static pod watch events failed");
                self.alive = false;
                return;
            }
            None => {
                self.alive = false;
                return;
            }
        };
        if ev.mask.contains(EventMask::Q_OVERFLOW) {
            self.relevant = true;
            return;
        }
        if ev.mask.intersects(
            EventMask::DELETE_SELF | EventMask::MOVE_SELF | EventMask::IGNORED | EventMask::UNMOUNT,
        ) {
            self.alive = false;
            return;
        }
        let Some(name) = ev.name else { return };
        if let Some((wd, link)) = &filter.link
            && ev.wd == *wd
        {
            if name == *link {
                // The symlinked path now points elsewhere: re-list and watch the new target.
                self.relevant = true;
                self.alive = false;
            }
            return;
        }
        let text = name.to_string_lossy();
        if is_atomic_writer_name(&text) {
            // `..data` swapped: every manifest behind the visible symlinks may have changed.
            self.relevant = true;
            return;
        }
        if is_ignored_name(&text) || ev.mask.contains(EventMask::ISDIR) {
            return;
        }
        if filter.only.as_ref().is_some_and(|only| *only != name) {
            return;
        }
        self.relevant = true;
        if ev.mask.contains(EventMask::MODIFY) {
            self.writing.insert(name);
        } else if ev
            .mask
            .intersects(EventMask::CLOSE_WRITE | EventMask::DELETE | EventMask::MOVED_FROM)
        {
            self.writing.remove(&name);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn trailing_slashes_are_trimmed() {
        assert_eq!(
            FileSource::new("/etc/kubernetes/manifests/", "n").path(),
            Path::new("/etc/kubernetes/manifests")
        );
        assert_eq!(FileSource::new("/", "n").path(), Path::new("/"));
        assert_eq!(FileSource::new("rel//", "n").path(), Path::new("rel"));
    }

    fn pod(name: &str) -> Arc<Pod> {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        Arc::new(p)
    }

    fn bad(path: &Path) -> Result<Arc<Pod>, ManifestFailure> {
        Err(PodConfigError::EmptyManifest {
            path: path.to_path_buf(),
        }
        .into())
    }

    #[test]
    fn an_invalid_file_keeps_its_pod_on_watch_events_and_loses_it_on_periodic_relists() {
        let (recorder, mut events) = EventRecorder::channel(10);
        let mut state = State::new(PathBuf::from("/m"), recorder);
        let a = PathBuf::from("/m/a.yaml");
        let b = PathBuf::from("/m/b.yaml");
        let names = |pods: Option<Vec<Arc<Pod>>>| -> Vec<String> {
            pods.unwrap_or_default()
                .iter()
                .map(|p| p.metadata.name.clone().unwrap_or_default())
                .collect()
        };
        let ok = |p: &Path, n: &str| (p.to_path_buf(), Ok(pod(n)));

        let listing = Listing::Files(vec![ok(&a, "a"), ok(&b, "b")]);
        assert_eq!(names(state.apply(listing, Trigger::Periodic)), ["a", "b"]);

        let listing = Listing::Files(vec![(a.clone(), bad(&a)), ok(&b, "b")]);
        assert_eq!(names(state.apply(listing, Trigger::Watch)), ["a", "b"]);
        let ev = events.try_recv().expect("reported");
        assert_eq!(ev.reason, "FailedValidation");
        assert_eq!(ev.involved.name, "/m/a.yaml");

        let listing = Listing::Files(vec![(a.clone(), bad(&a)), ok(&b, "b")]);
        assert_eq!(names(state.apply(listing, Trigger::Periodic)), ["b"]);
        assert!(events.try_recv().is_err(), "same error reported once");

        // A file that never had a good pod gives nothing, even on a watch event.
        let listing = Listing::Files(vec![(a.clone(), bad(&a)), ok(&b, "b")]);
        assert_eq!(names(state.apply(listing, Trigger::Watch)), ["b"]);

        // A missing path empties the set; a failed listing sends nothing.
        assert_eq!(
            names(state.apply(Listing::Missing, Trigger::Periodic)),
            Vec::<String>::new()
        );
        let failed = Listing::Failed(PodConfigError::ListManifestDir {
            path: PathBuf::from("/m"),
            source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        });
        assert!(state.apply(failed, Trigger::Periodic).is_none());
    }

    /// A file read before it settled is read again by the next listing, but decoded again only
    /// when its bytes changed; a rewrite of the same size at once is seen.
    #[test]
    fn a_file_read_before_it_settled_is_decoded_again_only_when_its_bytes_changed() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("web.yaml");
        let manifest = |image: &str| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: app\n    image: {image}\n"
            )
        };
        std::fs::write(&file, manifest("busybox")).unwrap();
        let options = ValidationOptions::static_pod();
        let mut cache = ReadCache::default();
        let mut listed = |known: &BTreeMap<PathBuf, Arc<Pod>>| match list(
            dir.path(),
            "node",
            &options,
            &mut cache,
            known,
            true,
        ) {
            Listed::Changed(Listing::Files(files)) => files
                .into_iter()
                .map(|(p, r)| (p, r.unwrap()))
                .collect::<BTreeMap<_, _>>(),
            other => panic!("{other:?}"),
        };
        let image = |pods: &BTreeMap<PathBuf, Arc<Pod>>| {
            pods[&dir.path().join("web.yaml")]
                .spec
                .as_ref()
                .unwrap()
                .containers[0]
                .image
                .clone()
                .unwrap()
        };
        let first = listed(&BTreeMap::new());
        let second = listed(&first);
        assert!(
            Arc::ptr_eq(&first[&file], &second[&file]),
            "the same bytes: the same pod"
        );
        std::fs::write(&file, manifest("busyboy")).unwrap();
        let third = listed(&second);
        assert_eq!(image(&third), "busyboy");
        assert_eq!(image(&second), "busybox");
    }

    #[test]
    fn default_check_frequency_is_the_kubelets() {
        let c = FileSourceConfig::default();
        assert_eq!(c.check_frequency, Duration::from_secs(20));
        assert_eq!(c.missing_path_retry, Duration::from_secs(1));
    }
}
