//! `kubelet-core`: the vocabulary and the engine of the kubelet SDK.
#![forbid(unsafe_code)]

pub mod actions;
pub mod admission;
pub mod backoff;
pub mod builder;
pub mod cache;
pub mod config;
pub mod container;
pub mod error;
pub mod event;
pub mod kubelet;
pub mod merge;
pub mod pleg;
pub mod pod;
pub mod probe;
pub mod quantity;
pub mod runtime;
pub mod sink;
pub mod status_gen;
pub mod status_manager;
mod sync;
#[cfg(feature = "testing")]
pub mod testing;
pub mod volume;

pub use admission::{AdmitResult, KillPodOptions, PodAdmitHandler};
pub use builder::{KubeletBuilder, KubeletConfig, KubeletHandle, NotRunning};
pub use cache::{PodCache, PodCacheWriter, pod_cache};
pub use config::{PodOp, PodSource, PodUpdate, SourceSender, SourceSnapshot};
pub use error::{Error, ErrorKind, KubeletError, Result};
pub use event::{Event, EventRecorder, EventType, InvolvedObject};
pub use kubelet::Kubelet;
pub use merge::{PodConfig, PodStorage};
pub use pleg::{PlegHealth, PodLifecycleEvent, PodLifecycleEventGenerator, PodLifecycleEventType};
pub use probe::{ProbeContext, ProbeManager, ProbeResult, ProbeType, ProbeUpdate};
pub use runtime::{ContainerRuntime, PodRuntimeStatus, RuntimePod};
pub use sink::StatusSink;
pub use status_gen::{StatusInput, generate_pod_status, get_phase};
pub use status_manager::{StatusManager, StatusReader};
pub use volume::VolumePlugin;

/// Re-export of the Kubernetes API types the SDK is built on.
pub use k8s_openapi;
