//! `kubelet-podconfig`: where pods come from. Pod sources for the kubelet SDK, starting with
//! static pods from files ([`FileSource`], the kubelet's `--pod-manifest-path`), and the pod
//! config merge that turns the sources' snapshots into ADD / UPDATE / DELETE / REMOVE /
//! RECONCILE updates ([`PodConfig`], [`PodStorage`], defined in `kubelet-core` and re-exported
//! here so this crate is usable on its own).
//!
//! Start with [`FileSource::new`] and [`PodConfig`]: register the source, call
//! [`PodConfig::start`], spawn the future it returns and read [`PodUpdate`]s from the receiver.
//! The pieces a source is made of are public too: [`manifest`] (reading, decoding and the
//! kubelet's static pod defaulting, including the UID hash) and [`validation`].
//!
//! ```no_run
//! use std::sync::Arc;
//! use kubelet_podconfig::{EventRecorder, FileSource, PodConfig};
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let (recorder, _events) = EventRecorder::channel(100);
//! let mut config = PodConfig::new(recorder);
//! config.add_source(Arc::new(FileSource::new("/etc/kubernetes/manifests", "node-1")))?;
//! let shutdown = CancellationToken::new();
//! let (mut updates, run) = config.start(shutdown.clone());
//! tokio::spawn(run);
//! while let Some(update) = updates.recv().await {
//!     println!("{:?} from {}: {} pods", update.op, update.source, update.pods.len());
//! }
//! # Ok(()) }
//! ```
//!
//! `examples/watch_dir.rs` is the same as a runnable program:
//! `cargo run -p kubelet-podconfig --example watch_dir -- <dir> [node]`.
#![forbid(unsafe_code)]

pub mod error;
pub mod file;
pub mod http;
pub mod manifest;
pub mod push;
pub mod tls;
pub mod validation;

pub use error::PodConfigError;
pub use file::{FileSource, FileSourceConfig};
pub use http::{HttpSource, HttpSourceConfig};
pub use kubelet_core::config::{
    PodOp, PodSource, PodUpdate, SourceClosed, SourceSender, SourceSnapshot, annotations, sources,
};
pub use kubelet_core::merge::{PodConfig, PodStorage, SourcesSeen};
pub use kubelet_core::{Event, EventRecorder, EventType, InvolvedObject};
pub use manifest::{
    MAX_MANIFEST_SIZE, ManifestOrigin, apply_defaults, apply_defaults_with, decode_pod,
    decode_pods, load_manifest, load_pods,
};
pub use push::{PUSH_SOURCE, PushSource, PushSourceConfig};
pub use validation::{ValidationOptions, validate_pod, validate_pod_with};
