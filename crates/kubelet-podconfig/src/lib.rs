//! `kubelet-podconfig`: where pods come from. The pod sources of the kubelet SDK and the pod
//! config merge that turns their snapshots into ADD / UPDATE / DELETE / REMOVE / RECONCILE
//! updates ([`PodConfig`](kubelet_core::merge::PodConfig) and
//! [`PodStorage`](kubelet_core::merge::PodStorage) in `kubelet_core::merge`, usable without the
//! rest of the engine).
//!
//! - [`FileSource`] (`file`): static pods from a directory or file (`--pod-manifest-path`),
//!   editor-safe.
//! - [`HttpSource`] (`http`): static pods from a manifest URL (`--manifest-url`), a Pod or a
//!   PodList, over HTTP or HTTPS.
//! - [`PushSource`] (`push`): an authenticated HTTP endpoint that accepts pod manifests
//!   (`POST`/`PUT`/`DELETE /pods`), off unless built.
//! - [`validation`]: the API server's pod validation, shared by all three, with its messages.
//!
//! Start with [`FileSource::new`] and [`PodConfig`](kubelet_core::merge::PodConfig): register
//! the source, call [`PodConfig::start`](kubelet_core::merge::PodConfig::start), spawn the
//! future it returns and read [`PodUpdate`](kubelet_api::PodUpdate)s from the receiver.
//! The pieces a source is made of are public too: [`manifest`] (reading, decoding and the
//! kubelet's static pod defaulting, including the UID hash) and [`validation`].
//!
//! ```no_run
//! use std::sync::Arc;
//! use kubelet_api::EventRecorder;
//! use kubelet_core::merge::PodConfig;
//! use kubelet_podconfig::FileSource;
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
//! `cargo run -p kubelet-podconfig --example watch_dir -- <dir or http(s) URL> [node]`.
#![forbid(unsafe_code)]

pub mod error;
pub mod file;
pub mod http;
pub mod manifest;
pub mod push;
pub mod validation;

pub use error::PodConfigError;
pub use file::{FileSource, FileSourceConfig};
pub use http::{HttpSource, HttpSourceConfig};
pub use manifest::{
    MAX_MANIFEST_SIZE, ManifestOrigin, apply_defaults, apply_defaults_with, decode_pod,
    decode_pods, load_manifest, load_pods,
};
pub use push::{PUSH_SOURCE, PushSource, PushSourceConfig};
pub use validation::{ValidationOptions, validate_pod, validate_pod_with};
