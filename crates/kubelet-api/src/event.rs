//! Kubernetes-style events (`Normal` / `Warning` with a reason), recorded by every part of the
//! agent and delivered to the [`StatusSink`](crate::StatusSink)s.

use std::collections::BTreeMap;

use jiff::Timestamp;
use tokio::sync::mpsc;

/// Event severity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    /// Something normal happened.
    Normal,
    /// Something a user should look at.
    Warning,
}

impl EventType {
    /// `Normal` or `Warning`, as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// The object an event is about.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InvolvedObject {
    /// `Pod`, `Node`, …
    pub kind: String,
    /// Namespace, empty for cluster-scoped objects.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID, if known.
    pub uid: String,
    /// Field path within the object, e.g. `spec.containers{app}`.
    pub field_path: String,
}

impl InvolvedObject {
    /// Reference to a pod.
    pub fn pod(pod: &k8s_openapi::api::core::v1::Pod) -> Self {
        Self {
            kind: "Pod".to_string(),
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            field_path: String::new(),
        }
    }

    /// Reference to a container of a pod (`spec.containers{name}`).
    pub fn container(pod: &k8s_openapi::api::core::v1::Pod, container: &str) -> Self {
        Self {
            field_path: format!("spec.containers{{{container}}}"),
            ..Self::pod(pod)
        }
    }

    /// Reference to container `container` of the pod `namespace/name` with `uid`, for code
    /// that knows the pod only by what a runtime recorded (its labels or sandbox metadata).
    pub fn pod_container(
        namespace: impl Into<String>,
        name: impl Into<String>,
        uid: impl Into<String>,
        container: &str,
    ) -> Self {
        Self {
            kind: "Pod".to_string(),
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
            field_path: format!("spec.containers{{{container}}}"),
        }
    }

    /// Reference to the node.
    pub fn node(name: &str) -> Self {
        Self {
            kind: "Node".to_string(),
            name: name.to_string(),
            uid: name.to_string(),
            ..Default::default()
        }
    }

    /// Reference to a file that is not (yet) a pod, e.g. an invalid static pod manifest.
    pub fn file(path: &std::path::Path) -> Self {
        Self {
            kind: "File".to_string(),
            name: path.display().to_string(),
            ..Default::default()
        }
    }
}

/// One event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// What it is about.
    pub involved: InvolvedObject,
    /// Severity.
    pub type_: EventType,
    /// Machine-readable reason (`Started`, `BackOff`, `FailedValidation`, …).
    pub reason: String,
    /// Human-readable message.
    pub message: String,
    /// When it happened.
    pub timestamp: Timestamp,
    /// Annotations for the API object (`metadata.annotations` of the posted `Event`), as the
    /// kubelet's `AnnotatedEventf` attaches them: e.g. the `Evicted` event carries
    /// `offending_containers`, `offending_containers_usage` and `starved_resource`. Empty for
    /// most events.
    pub annotations: BTreeMap<String, String>,
}

/// Cheap, cloneable handle that records events: each event is logged through `tracing` and, if
/// the recorder is connected, queued for the status sinks. A full queue drops the event (after
/// logging it) rather than blocking the caller.
#[derive(Debug, Clone)]
pub struct EventRecorder {
    tx: Option<mpsc::Sender<Event>>,
}

impl EventRecorder {
    /// A recorder connected to a queue of `capacity` events, and the queue's receiver.
    pub fn channel(capacity: usize) -> (Self, mpsc::Receiver<Event>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        (Self { tx: Some(tx) }, rx)
    }

    /// A recorder that only logs.
    pub fn log_only() -> Self {
        Self { tx: None }
    }

    /// Record an event.
    pub fn record(
        &self,
        involved: InvolvedObject,
        type_: EventType,
        reason: &str,
        message: impl Into<String>,
    ) {
        self.record_with_annotations(involved, type_, reason, message, BTreeMap::new());
    }

    /// Record an event that carries annotations (the kubelet's `AnnotatedEventf`).
    pub fn record_with_annotations(
        &self,
        involved: InvolvedObject,
        type_: EventType,
        reason: &str,
        message: impl Into<String>,
        annotations: BTreeMap<String, String>,
    ) {
        let message = message.into();
        // Logged only when there are some.
        let logged = (!annotations.is_empty()).then(|| format!("{annotations:?}"));
        let logged = logged.as_deref();
        match type_ {
            EventType::Normal => tracing::info!(
                kind = %involved.kind, object = %format_args!("{}/{}", involved.namespace, involved.name),
                reason, annotations = logged, "{message}"
            ),
            EventType::Warning => tracing::warn!(
                kind = %involved.kind, object = %format_args!("{}/{}", involved.namespace, involved.name),
                reason, annotations = logged, "{message}"
            ),
        }
        if let Some(tx) = &self.tx {
            let ev = Event {
                involved,
                type_,
                reason: reason.to_string(),
                message,
                timestamp: Timestamp::now(),
                annotations,
            };
            if tx.try_send(ev).is_err() {
                tracing::debug!(reason, "event queue full or closed; event dropped");
            }
        }
    }

    /// Record a `Normal` event.
    pub fn normal(&self, involved: InvolvedObject, reason: &str, message: impl Into<String>) {
        self.record(involved, EventType::Normal, reason, message);
    }

    /// Record a `Warning` event.
    pub fn warning(&self, involved: InvolvedObject, reason: &str, message: impl Into<String>) {
        self.record(involved, EventType::Warning, reason, message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_events_carry_their_annotations_and_plain_ones_none() {
        let (recorder, mut rx) = EventRecorder::channel(4);
        recorder.warning(InvolvedObject::node("n"), "Plain", "no annotations");
        let annotations = BTreeMap::from([("starved_resource".to_string(), "memory".to_string())]);
        recorder.record_with_annotations(
            InvolvedObject::node("n"),
            EventType::Warning,
            "Annotated",
            "with annotations",
            annotations.clone(),
        );
        let plain = rx.try_recv().expect("plain event queued");
        assert_eq!(plain.reason, "Plain");
        assert!(plain.annotations.is_empty());
        let annotated = rx.try_recv().expect("annotated event queued");
        assert_eq!(annotated.reason, "Annotated");
        assert_eq!(annotated.type_, EventType::Warning);
        assert_eq!(annotated.annotations, annotations);
    }
}
