//! Container events of the process runtime, for an evented PLEG: inotify on the state
//! directories the runtime and the shims write.
//!
//! Every record is written to a temporary name and renamed, so a rename into a container's
//! directory is the event: `config.json` (created), `started.json` (started), `exit.json`
//! (stopped; the shim writes it when the process exits, also when the agent that started it is
//! long gone). Every running container's shim is watched through a pidfd: a shim that dies
//! without writing `exit.json` (killed) is reported as stopped the moment it dies, and the
//! runtime records the exit itself when the container is next inspected. Where the kernel has
//! no pidfds, the close of the `shim.log` the shim holds open for writing serves instead.
//! Sandboxes: `sandbox.json` renamed in (started, or stopped once it says not ready). Removing a
//! container or sandbox directory is deleted.
//!
//! Watches are set on every existing directory when the stream is created, so a new agent
//! learns the exits of containers whose shim outlived the previous agent. When the state
//! directory itself goes (the root directory removed or replaced), the stream fails, so that
//! the PLEG relists (which lets the runtime restore what it knows) and subscribes again.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use inotify::{EventMask, EventStream, Inotify, WatchDescriptor, WatchMask};
use jiff::Timestamp;
use kubelet_api::runtime::{ContainerEvent, ContainerEventKind, ContainerEventStream, labels};
use parking_lot::Mutex;

use crate::error::ProcessError;
use crate::record::{
    CONFIG_FILE, ContainerRecord, EXIT_FILE, EXIT_SLOT_FILE, SANDBOX_FILE, SHIM_LOG_FILE,
    STARTED_FILE, SandboxRecord, StartedRecord, process_alive, read_exit, read_json, valid_id,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The state directory itself: its `containers` and `sandboxes` going away.
    Root,
    Containers,
    Sandboxes,
    Container,
    Sandbox,
}

struct Watcher {
    root: PathBuf,
    stream: EventStream<Vec<u8>>,
    /// What each watch descriptor watches: its kind and (for one object) its ID.
    watches: HashMap<WatchDescriptor, (Kind, String)>,
    /// Pod UID of every container and sandbox seen.
    pods: HashMap<String, String>,
    queue: VecDeque<ContainerEvent>,
    /// One future per watched shim, resolving to its container's ID when the shim exits.
    shims: FuturesUnordered<BoxFuture<'static, String>>,
    shim_watched: HashSet<String>,
    /// Shared with the runtime: the containers whose shim a stream watches and has not seen
    /// exit (nor their exit record). See [`WatchedShims`].
    vouched: WatchedShims,
    /// Set when a top-level state directory vanished: the stream fails with it.
    lost: Option<PathBuf>,
}

/// The containers some event stream vouches for as running: their shim is alive under a pidfd
/// watch and no exit record was seen. The runtime's list answers their state from it without
/// reading their exit files and `/proc`; any doubt (an exit, a removal, the stream gone) takes
/// the ID out, and the runtime reads the files again.
pub(crate) type WatchedShims = Arc<Mutex<HashSet<String>>>;

impl Drop for Watcher {
    /// A dropped stream sees no more exits: what it vouched for is unknown again.
    fn drop(&mut self) {
        let mut vouched = self.vouched.lock();
        for id in &self.shim_watched {
            vouched.remove(id);
        }
    }
}

fn watch_err(path: &Path, source: std::io::Error) -> ProcessError {
    ProcessError::State {
        op: "watching",
        path: path.to_path_buf(),
        source,
    }
}

const OBJECT_MASK: WatchMask = WatchMask::MOVED_TO.union(WatchMask::CLOSE_WRITE);
const PARENT_MASK: WatchMask = WatchMask::CREATE
    .union(WatchMask::DELETE)
    .union(WatchMask::MOVED_TO)
    .union(WatchMask::MOVE_SELF)
    .union(WatchMask::ONLYDIR);
/// A directory's own removal is reported (IN_DELETE_SELF) only once nothing holds it, and a
/// running container's working directory below it does: its parent's IN_DELETE comes at once.
const ROOT_MASK: WatchMask = WatchMask::DELETE
    .union(WatchMask::MOVED_FROM)
    .union(WatchMask::MOVE_SELF)
    .union(WatchMask::DELETE_SELF)
    .union(WatchMask::ONLYDIR);

/// The event stream over the runtime's state under `root`.
pub(crate) fn container_events(
    root: &Path,
    vouched: WatchedShims,
) -> Result<ContainerEventStream, ProcessError> {
    for sub in ["containers", "sandboxes"] {
        std::fs::create_dir_all(root.join(sub))
            .map_err(|e| crate::record::state_error("creating", &root.join(sub), e))?;
    }
    let inotify = Inotify::init().map_err(|e| watch_err(root, e))?;
    let stream = inotify
        .into_event_stream(vec![0u8; 16384])
        .map_err(|e| watch_err(root, e))?;
    let mut w = Watcher {
        root: root.to_path_buf(),
        stream,
        watches: HashMap::new(),
        pods: HashMap::new(),
        queue: VecDeque::new(),
        shims: FuturesUnordered::new(),
        shim_watched: HashSet::new(),
        vouched,
        lost: None,
    };
    for (kind, dir, mask) in [
        (Kind::Root, root.to_path_buf(), ROOT_MASK),
        (Kind::Containers, root.join("containers"), PARENT_MASK),
        (Kind::Sandboxes, root.join("sandboxes"), PARENT_MASK),
    ] {
        let wd = w
            .stream
            .watches()
            .add(&dir, mask)
            .map_err(|e| watch_err(&dir, e))?;
        w.watches.insert(wd, (kind, String::new()));
    }
    // Existing objects: watched from now on; their past is the relist's business.
    for (kind, sub) in [
        (Kind::Container, "containers"),
        (Kind::Sandbox, "sandboxes"),
    ] {
        let entries = std::fs::read_dir(root.join(sub)).map_err(|e| watch_err(root, e))?;
        for entry in entries.flatten() {
            if let Some(id) = entry.file_name().to_str() {
                w.watch_object(kind, id, false);
            }
        }
    }
    Ok(Box::pin(futures::stream::unfold(Some(w), |w| async move {
        let mut w = w?;
        loop {
            if let Some(ev) = w.queue.pop_front() {
                return Some((Ok(ev), Some(w)));
            }
            if let Some(dir) = w.lost.take() {
                let err = watch_err(
                    &dir,
                    std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        "the state directory was removed",
                    ),
                );
                // Fail once, then end: the consumer subscribes again.
                return Some((Err(err.into()), None));
            }
            tokio::select! {
                ev = w.stream.next() => match ev {
                    Some(Ok(ev)) => w.handle(ev.wd, ev.mask, ev.name),
                    Some(Err(e)) => {
                        let err = kubelet_api::Error::from(watch_err(&w.root, e));
                        return Some((Err(err), Some(w)));
                    }
                    None => return None,
                },
                Some(id) = w.shims.next(), if !w.shims.is_empty() => w.shim_exited(&id),
            }
        }
    })))
}

impl Watcher {
    fn dir_of(&self, kind: Kind, id: &str) -> PathBuf {
        match kind {
            Kind::Container => self.root.join("containers").join(id),
            _ => self.root.join("sandboxes").join(id),
        }
    }

    fn push(&mut self, id: &str, kind: ContainerEventKind) {
        let uid = self.pods.get(id).cloned();
        self.queue
            .push_back(ContainerEvent::new(id, kind, uid, Timestamp::now()));
    }

    /// Watch a container's or sandbox's directory; with `catch_up`, report what its files
    /// already say (they may have been renamed in before the watch existed).
    fn watch_object(&mut self, kind: Kind, id: &str, catch_up: bool) {
        if !valid_id(id) {
            return;
        }
        let dir = self.dir_of(kind, id);
        match self.stream.watches().add(&dir, OBJECT_MASK) {
            Ok(wd) => {
                self.watches.insert(wd, (kind, id.to_string()));
            }
            Err(e) => {
                tracing::debug!(dir = %dir.display(), error = %kubelet_api::chain(&e), "not watching a state directory");
                return;
            }
        }
        match kind {
            Kind::Container => {
                self.learn_container(id);
                self.watch_shim(id);
                if catch_up {
                    for file in [CONFIG_FILE, STARTED_FILE, EXIT_FILE] {
                        if dir.join(file).exists() {
                            self.file_event(kind, id, file);
                        }
                    }
                }
            }
            _ => {
                self.learn_sandbox(id);
                if catch_up && dir.join(SANDBOX_FILE).exists() {
                    self.file_event(kind, id, SANDBOX_FILE);
                }
            }
        }
    }

    fn learn_container(&mut self, id: &str) {
        let path = self.dir_of(Kind::Container, id).join(CONFIG_FILE);
        if let Ok(Some(rec)) = read_json::<ContainerRecord>(&path)
            && let Some(uid) = rec.labels.get(labels::POD_UID)
        {
            self.pods.insert(id.to_string(), uid.clone());
        }
    }

    fn learn_sandbox(&mut self, id: &str) -> Option<SandboxRecord> {
        let path = self.dir_of(Kind::Sandbox, id).join(SANDBOX_FILE);
        let rec = read_json::<SandboxRecord>(&path).ok().flatten()?;
        let uid = rec
            .labels
            .get(labels::POD_UID)
            .cloned()
            .unwrap_or_else(|| rec.uid.clone());
        if !uid.is_empty() {
            self.pods.insert(id.to_string(), uid);
        }
        Some(rec)
    }

    fn file_event(&mut self, kind: Kind, id: &str, file: &str) {
        match (kind, file) {
            (Kind::Container, CONFIG_FILE) => {
                self.learn_container(id);
                self.push(id, ContainerEventKind::Created);
            }
            (Kind::Container, STARTED_FILE) => {
                self.push(id, ContainerEventKind::Started);
                self.watch_shim(id);
            }
            (Kind::Container, EXIT_FILE) => {
                self.vouched.lock().remove(id);
                self.push(id, ContainerEventKind::Stopped);
            }
            (Kind::Sandbox, SANDBOX_FILE) => match self.learn_sandbox(id) {
                Some(rec) if rec.ready => self.push(id, ContainerEventKind::Started),
                Some(_) => self.push(id, ContainerEventKind::Stopped),
                None => {}
            },
            _ => {}
        }
    }

    /// Watch the shim of a started container that has not exited, through a pidfd.
    fn watch_shim(&mut self, id: &str) {
        if self.shim_watched.contains(id) {
            return;
        }
        let dir = self.dir_of(Kind::Container, id);
        let Ok(Some(started)) = read_json::<StartedRecord>(&dir.join(STARTED_FILE)) else {
            return;
        };
        if dir.join(EXIT_FILE).exists() {
            return;
        }
        let Some(fd) = crate::pidfd::watch(started.shim_pid, started.shim_start_time) else {
            return;
        };
        self.shim_watched.insert(id.to_string());
        self.vouched.lock().insert(id.to_string());
        let id = id.to_string();
        self.shims.push(Box::pin(async move {
            // An error from the reactor ends the watch just the same.
            let _ = fd.readable().await;
            id
        }));
    }

    /// A watched shim exited. With an exit record, its rename has been (or will be) reported;
    /// without one the shim was killed: report the container stopped now.
    fn shim_exited(&mut self, id: &str) {
        self.shim_watched.remove(id);
        self.vouched.lock().remove(id);
        let dir = self.dir_of(Kind::Container, id);
        if dir.exists() && matches!(read_exit(&dir), Ok(None)) {
            self.push(id, ContainerEventKind::Stopped);
        }
    }

    /// `shim.log` closed by a writer: the agent closes its copy right after spawning the shim,
    /// the shim closes its copy when it exits. Only the latter, without an exit record, is news.
    fn shim_closed(&mut self, id: &str) {
        let dir = self.dir_of(Kind::Container, id);
        if dir.join(EXIT_FILE).exists() {
            return;
        }
        let Ok(Some(started)) = read_json::<StartedRecord>(&dir.join(STARTED_FILE)) else {
            return;
        };
        if !process_alive(started.shim_pid, started.shim_start_time) {
            self.push(id, ContainerEventKind::Stopped);
        }
    }

    fn handle(&mut self, wd: WatchDescriptor, mask: EventMask, name: Option<OsString>) {
        let Some((kind, id)) = self.watches.get(&wd).cloned() else {
            return;
        };
        let top = matches!(kind, Kind::Root | Kind::Containers | Kind::Sandboxes);
        if mask.contains(EventMask::IGNORED) {
            self.watches.remove(&wd);
            if top {
                self.lost = Some(self.root.clone());
            }
            return;
        }
        if top && (mask.contains(EventMask::MOVE_SELF) || mask.contains(EventMask::DELETE_SELF)) {
            self.lost = Some(self.root.clone());
            return;
        }
        if kind == Kind::Root {
            // `containers` or `sandboxes` removed or moved away.
            if name
                .as_ref()
                .is_some_and(|n| n == "containers" || n == "sandboxes")
            {
                self.lost = Some(self.root.clone());
            }
            return;
        }
        let Some(name) = name.as_ref().and_then(|n| n.to_str()).map(str::to_string) else {
            return;
        };
        match kind {
            Kind::Root => {}
            Kind::Containers | Kind::Sandboxes => {
                let object = if kind == Kind::Containers {
                    Kind::Container
                } else {
                    Kind::Sandbox
                };
                if mask.contains(EventMask::CREATE) || mask.contains(EventMask::MOVED_TO) {
                    if mask.contains(EventMask::ISDIR) {
                        self.watch_object(object, &name, true);
                    }
                } else if mask.contains(EventMask::DELETE) && mask.contains(EventMask::ISDIR) {
                    self.vouched.lock().remove(&name);
                    self.push(&name, ContainerEventKind::Deleted);
                    self.pods.remove(&name);
                }
            }
            Kind::Container | Kind::Sandbox => {
                if mask.contains(EventMask::MOVED_TO) {
                    self.file_event(kind, &id, &name);
                } else if mask.contains(EventMask::CLOSE_WRITE) && kind == Kind::Container {
                    if name == SHIM_LOG_FILE {
                        self.shim_closed(&id);
                    } else if name == EXIT_SLOT_FILE
                        && crate::record::read_exit_slot(&self.dir_of(kind, &id)).is_some()
                    {
                        // The disk was full: the shim recorded the exit in place.
                        self.vouched.lock().remove(&id);
                        self.push(&id, ContainerEventKind::Stopped);
                    }
                }
            }
        }
    }
}
