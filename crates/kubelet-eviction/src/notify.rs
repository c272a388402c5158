//! Kernel notifications that wake the fast memory check early: a cgroup v1 memory threshold
//! (eventfd registered through `cgroup.event_control`), a PSI trigger on memory pressure, and an
//! inotify watch on cgroup v2 `memory.events`. Each is optional: what cannot be set up is
//! logged and skipped, and the cheap periodic poll still runs.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use futures::StreamExt;
use inotify::{EventStream, Inotify, WatchMask};
use nix::sys::eventfd::{EfdFlags, EventFd};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use crate::error::EvictionError;
use crate::stats::MemoryCgroup;

/// Descriptors this module owns outright (closed only on drop).
trait OwnedDescriptor: AsRawFd {}
impl OwnedDescriptor for EventFd {}
impl OwnedDescriptor for File {}

/// Register an owned descriptor with the tokio reactor.
#[allow(unsafe_code)]
fn register<T: OwnedDescriptor>(inner: T, interest: Interest) -> std::io::Result<AsyncFd<T>> {
    // SAFETY: `inner` is an `EventFd` or a `File` moved into the `AsyncFd`: it owns an open
    // descriptor, closes it only when dropped (which only happens when the `AsyncFd` is dropped
    // or unwrapped), and `as_raw_fd` always returns that same descriptor.
    let r = unsafe { AsyncFd::register_with_interest(inner, interest) };
    r.map_err(std::io::Error::from)
}

/// A cgroup v1 memory threshold: the eventfd fires when `memory.usage_in_bytes` crosses the
/// registered value in either direction. Closing the eventfd unregisters it.
#[derive(Debug)]
pub struct MemcgThreshold {
    fd: AsyncFd<EventFd>,
    // Kept open while the threshold is registered.
    _usage: File,
    /// The usage value registered.
    pub threshold: u64,
}

impl MemcgThreshold {
    /// Register `threshold` bytes of usage on the v1 memory cgroup `dir`.
    pub fn register(dir: &Path, threshold: u64) -> Result<Self, EvictionError> {
        let err = |path: PathBuf, reason: String| EvictionError::NotifierSetup {
            what: "memory cgroup threshold",
            path,
            reason,
        };
        let usage_path = dir.join("memory.usage_in_bytes");
        let usage = File::open(&usage_path).map_err(|e| err(usage_path.clone(), e.to_string()))?;
        let efd = EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
            .map_err(|e| err(dir.to_path_buf(), e.to_string()))?;
        let control = dir.join("cgroup.event_control");
        let line = format!("{} {} {}", efd.as_raw_fd(), usage.as_raw_fd(), threshold);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&control)
            .and_then(|mut f| f.write_all(line.as_bytes()))
            .map_err(|e| err(control.clone(), e.to_string()))?;
        let fd =
            register(efd, Interest::READABLE).map_err(|e| err(dir.to_path_buf(), e.to_string()))?;
        Ok(Self {
            fd,
            _usage: usage,
            threshold,
        })
    }

    /// Wait for the next crossing.
    pub async fn crossed(&self) {
        loop {
            let Ok(mut guard) = self.fd.readable().await else {
                return std::future::pending().await;
            };
            match guard.try_io(|inner| inner.get_ref().read().map_err(std::io::Error::from)) {
                Ok(Ok(_)) => return,
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Ok(Err(e)) => {
                    tracing::debug!(error = %kubelet_api::chain(&e), "memcg threshold eventfd failed");
                    return std::future::pending().await;
                }
                Err(_would_block) => continue,
            }
        }
    }
}

/// A PSI trigger (`some <stall us> <window us>`) on a pressure file; fires (POLLPRI) when tasks
/// stalled on memory for longer than the stall time within the window.
#[derive(Debug)]
pub struct PsiTrigger {
    fd: AsyncFd<File>,
}

impl PsiTrigger {
    /// Register a trigger on `path` (`/proc/pressure/memory` or a v2 cgroup's
    /// `memory.pressure`). The window is 2 s, the smallest allowed without `CAP_SYS_RESOURCE`.
    pub fn register(path: &Path, stall_us: u64) -> Result<Self, EvictionError> {
        let err = |reason: String| EvictionError::NotifierSetup {
            what: "PSI trigger",
            path: path.to_path_buf(),
            reason,
        };
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| err(e.to_string()))?;
        f.write_all(format!("some {stall_us} 2000000\0").as_bytes())
            .map_err(|e| err(e.to_string()))?;
        let fd = register(f, Interest::PRIORITY).map_err(|e| err(e.to_string()))?;
        Ok(Self { fd })
    }

    /// Wait for the trigger to fire.
    pub async fn fired(&self) {
        match self.fd.ready(Interest::PRIORITY).await {
            Ok(mut guard) => guard.clear_ready(),
            Err(_) => std::future::pending().await,
        }
    }
}

/// An inotify watch on a cgroup v2 `memory.events` file (modified on `high`, `max`, `oom`).
pub struct MemoryEventsWatch {
    stream: EventStream<Vec<u8>>,
}

impl std::fmt::Debug for MemoryEventsWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryEventsWatch").finish_non_exhaustive()
    }
}

impl MemoryEventsWatch {
    /// Watch `<dir>/memory.events`.
    pub fn register(dir: &Path) -> Result<Self, EvictionError> {
        let path = dir.join("memory.events");
        let err = |reason: String| EvictionError::NotifierSetup {
            what: "inotify watch",
            path: path.clone(),
            reason,
        };
        if !path.exists() {
            return Err(err("no such file".into()));
        }
        let inotify = Inotify::init().map_err(|e| err(e.to_string()))?;
        inotify
            .watches()
            .add(&path, WatchMask::MODIFY)
            .map_err(|e| err(e.to_string()))?;
        let stream = inotify
            .into_event_stream(vec![0u8; 1024])
            .map_err(|e| err(e.to_string()))?;
        Ok(Self { stream })
    }

    /// Wait for the file to change.
    pub async fn changed(&mut self) {
        match self.stream.next().await {
            Some(Ok(_)) => {}
            _ => std::future::pending().await,
        }
    }
}

/// The kernel notification sources for one memory cgroup, each optional.
#[derive(Debug, Default)]
pub struct KernelWakers {
    /// v1 threshold, re-registered by the manager after each full synchronisation.
    pub memcg: Option<MemcgThreshold>,
    /// PSI trigger.
    pub psi: Option<PsiTrigger>,
    /// v2 `memory.events` watch.
    pub events: Option<MemoryEventsWatch>,
}

impl KernelWakers {
    /// Set up PSI and inotify for `cgroup` (the memcg threshold is set by
    /// [`arm_threshold`](Self::arm_threshold) once a value is known). `proc_root` locates
    /// `/proc/pressure/memory`.
    pub fn new(cgroup: Option<&MemoryCgroup>, proc_root: &Path) -> Self {
        let mut w = KernelWakers::default();
        let psi_path = match cgroup {
            Some(MemoryCgroup::V2(dir)) if dir.join("memory.pressure").exists() => {
                dir.join("memory.pressure")
            }
            _ => proc_root.join("pressure/memory"),
        };
        match PsiTrigger::register(&psi_path, 100_000) {
            Ok(t) => w.psi = Some(t),
            Err(e) => {
                tracing::debug!(error = %kubelet_api::chain(&e), "no PSI trigger; polling only")
            }
        }
        if let Some(MemoryCgroup::V2(dir)) = cgroup {
            match MemoryEventsWatch::register(dir) {
                Ok(t) => w.events = Some(t),
                Err(e) => {
                    tracing::debug!(error = %kubelet_api::chain(&e), "no memory.events watch")
                }
            }
        }
        w
    }

    /// (Re)register the v1 threshold at `usage` bytes on `cgroup` (a no-op for v2).
    pub fn arm_threshold(&mut self, cgroup: Option<&MemoryCgroup>, usage: u64) {
        let Some(MemoryCgroup::V1(dir)) = cgroup else {
            return;
        };
        if self.memcg.as_ref().is_some_and(|m| m.threshold == usage) {
            return;
        }
        self.memcg = None;
        match MemcgThreshold::register(dir, usage) {
            Ok(t) => self.memcg = Some(t),
            Err(e) => {
                tracing::debug!(error = %kubelet_api::chain(&e), "no memcg threshold notification")
            }
        }
    }

    /// Wait for any source to fire; pends forever when none is set up.
    pub async fn wait(&mut self) -> &'static str {
        let memcg = async {
            match &self.memcg {
                Some(m) => m.crossed().await,
                None => std::future::pending().await,
            }
        };
        let psi = async {
            match &self.psi {
                Some(p) => p.fired().await,
                None => std::future::pending().await,
            }
        };
        let events = async {
            match &mut self.events {
                Some(e) => e.changed().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = memcg => "memcg threshold",
            _ = psi => "psi",
            _ = events => "memory.events",
        }
    }
}
