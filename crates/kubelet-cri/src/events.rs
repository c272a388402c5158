//! Container lifecycle events for an evented PLEG: what
//! [`CriRuntime::container_events`](kubelet_api::ContainerRuntime::container_events) streams.
//!
//! Two sources, chosen automatically and remembered per [`CriRuntime`](crate::CriRuntime) (and
//! its clones): CRI's where the runtime has it, else containerd's; or containerd's first with
//! [`CriConfig::prefer_containerd_events`] (on containerd ≥ 1.7 its exits then come with exit
//! hints, tens of milliseconds before CRI's own events):
//!
//! 1. **CRI `GetContainerEvents`** (containerd ≥ 1.7, CRI-O): each `ContainerEventResponse` maps
//!    to one event; the pod UID comes from the sandbox status it carries. containerd 1.7 records
//!    a change before it sends its event, and has one queue for all callers of
//!    `GetContainerEvents` (observed on 1.7.24): each event reaches only one open subscription;
//!    a subscription the client has dropped takes the next event with it (containerd notices
//!    the drop only when it sends); events made while nobody listened (up to 1000) reach the
//!    next subscription first. So one subscriber per containerd, and events lost around a
//!    resubscription are found by the consumer's relist.
//! 2. **containerd's native events** (containerd 1.6, whose CRI plugin answers
//!    `GetContainerEvents` with `Unimplemented`): `containerd.services.events.v1.Events/Subscribe`
//!    on the same socket, in the CRI plugin's namespace ([`CriConfig::containerd_namespace`],
//!    `k8s.io`), filtered to these topics:
//!
//!    | topic | payload | event |
//!    | --- | --- | --- |
//!    | `/containers/create` | `ContainerCreate` | `Created` |
//!    | `/tasks/start` | `TaskStart` | `Started` |
//!    | `/tasks/exit` | `TaskExit` of the init process | `Stopped` (twice, see below) |
//!    | `/containers/delete` | `ContainerDelete` | `Deleted` |
//!
//!    For CRI containers the containerd container and task ID is the CRI container ID. A pod
//!    sandbox is a containerd container too (its ID is the sandbox ID), so sandboxes produce the
//!    same events with the sandbox ID, as containerd ≥ 1.7's CRI events do for sandboxes. The
//!    exits of exec processes (`TaskExit` whose `id` is an exec ID) are skipped. `/tasks/delete`
//!    and `/tasks/oom` are followed but not reported themselves (below). Payloads of other types
//!    are skipped with a debug log, undecodable ones with a warning.
//!
//!    containerd publishes these events as it sees them, before its CRI plugin has recorded them,
//!    and they carry no pod. So each event is **confirmed through CRI** before it is yielded:
//!    `ContainerStatus` (or `PodSandboxStatus` for a sandbox ID) is asked until CRI shows what
//!    the event says (`Created`: the container or sandbox exists; `Started`: it is no longer
//!    `CREATED`; `Stopped`: it is `EXITED` / the sandbox `NOTREADY`; `Deleted`: it is gone), for
//!    at most [`CONFIRM_WITHIN`]; the answer gives the pod UID (the `io.kubernetes.pod.uid`
//!    label, the sandbox metadata; for `Deleted` the UID remembered from earlier events of that
//!    ID). So a consumer that inspects CRI on an event sees the change, as with containerd ≥
//!    1.7's CRI events. Events are confirmed concurrently; the events of one ID are yielded in
//!    order, those of different IDs each as soon as it is confirmed (so an exit does not wait
//!    while CRI catches up with another container's creation, which after a burst of creations
//!    takes tens of milliseconds per container). An ID CRI does not know within that time (a
//!    container made with `ctr` in `k8s.io`) is yielded without a pod UID. At most 8 status
//!    calls per stream are in flight. A creation or start that the runtime's own
//!    `RunPodSandbox`, `CreateContainer` or `StartContainer` made is confirmed by that call's
//!    return instead ([`crate::own`]): no status call, the call's pod UID, and a stamp no later
//!    than the return (containerd may publish the event after it). A creation or start of an
//!    ID nobody knows yet waits for the runtime's calls in flight (at most
//!    [`CriConfig::request_timeout`], which bounds those calls: containerd publishes a
//!    sandbox's creation seconds before a busy `RunPodSandbox` returns) before CRI is asked.
//!
//!    **Exits** are the exception, because the CRI plugin records an exit only after it has
//!    deleted the task (the `TaskDelete` that follows), 40–60 ms after the `TaskExit` on an idle
//!    machine and seconds later after a burst. The exit status and time of the `TaskExit` (and
//!    any `TaskOOM` before it) become an **exit hint** of the runtime ([`crate::exits`]): from
//!    then on the runtime's container reads report the container exited, with the values CRI
//!    will record. The `Stopped` event is yielded at once (once the earlier events of its
//!    container are), with the pod UID remembered from the container's earlier events (or asked
//!    once). It is yielded a second time once CRI has recorded the exit (after the task's
//!    `TaskDelete`, within [`CONFIRM_WITHIN`]); that confirmation holds back only later events
//!    of the same container. A consumer inspecting on the first sees the exit from the hint, on
//!    the second CRI's own record (the same exit, and the end of the log for
//!    `FallbackToLogsOnError`).
//!
//! Neither gRPC server answers a subscription until it has an event to send, so
//! `container_events` waits a short moment ([`PROBE`]) for an immediate refusal
//! (`Unimplemented`, the socket is gone) and otherwise hands out a stream whose subscription is
//! still being answered; a refusal that comes later ends up in that stream (an `Unimplemented`
//! from CRI then switches it to containerd's events). When neither source exists the call fails
//! with [`CriError::ContainerEventsUnsupported`] (`ErrorKind::Unimplemented`).
//!
//! The stream yields an error and ends when the connection breaks (containerd stops or
//! restarts); calling `container_events` again subscribes anew. Events in between are lost:
//! consumers treat events as hints and keep relisting.
//!
//! [`CriConfig::containerd_namespace`]: crate::CriConfig::containerd_namespace

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use futures::StreamExt;
use futures::channel::oneshot;
use futures::stream::FuturesUnordered;
use jiff::Timestamp;
use kubelet_api::runtime::{ContainerEvent, ContainerEventKind, ContainerEventStream, labels};
use kubelet_api::{Error, ErrorKind};
use prost::Message;
use tonic::codec::Streaming;
use tonic::transport::Channel;
use tracing::{debug, warn};

use crate::CriConfig;
use crate::error::CriError;
use crate::exits::{Exit, ExitHints};
use crate::own::OwnChanges;
use crate::proto::containerd::events as ctrd_events;
use crate::proto::containerd::services::events::v1 as ctrd;
use crate::proto::containerd::services::events::v1::events_client::EventsClient;
use crate::proto::v1 as cri;
use crate::proto::v1::runtime_service_client::RuntimeServiceClient;

/// The containerd namespace of the CRI plugin.
pub(crate) const CRI_NAMESPACE: &str = "k8s.io";

/// The gRPC metadata key that selects a containerd namespace.
const NAMESPACE_HEADER: &str = "containerd-namespace";

/// How long `container_events` waits for an immediate refusal of a subscription.
pub const PROBE: Duration = Duration::from_millis(250);

/// The CRI RPC.
const GET_CONTAINER_EVENTS: &str = "GetContainerEvents";

/// How long an event of containerd's native stream waits for CRI to show it (see the module
/// docs); it is yielded after that even if CRI does not.
///
/// containerd 1.6's CRI plugin handles exits one at a time (deleting each task takes tens of
/// milliseconds), so after a burst of exits the last ones are recorded seconds later.
pub const CONFIRM_WITHIN: Duration = Duration::from_secs(5);

/// How many native events may be in confirmation at a time (most of them just wait for their
/// task's deletion, which comes later in the stream: the buffer must hold a burst of exits).
const CONFIRM_BUFFER: usize = 1024;

/// How many CRI status calls the confirmations of one stream make at a time.
const CONFIRM_CALLS: usize = 8;

/// The most pod UIDs a native stream remembers for `Deleted` events (cleared when full).
const MAX_REMEMBERED: usize = 65_536;

/// The containerd topics the native subscription asks for.
const TOPICS: [&str; 6] = [
    "/containers/create",
    "/tasks/start",
    "/tasks/exit",
    "/tasks/oom",
    "/tasks/delete",
    "/containers/delete",
];

const SOURCE_UNKNOWN: u8 = 0;
const SOURCE_CRI: u8 = 1;
const SOURCE_CONTAINERD: u8 = 2;

/// Where a runtime's container events come from (see the module docs);
/// [`CriRuntime::container_event_source`](crate::CriRuntime::container_event_source).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ContainerEventSource {
    /// CRI `GetContainerEvents` (containerd ≥ 1.7, CRI-O).
    Cri,
    /// containerd's native events (containerd 1.6).
    Containerd,
}

/// Subscribes to container events; part of every [`CriRuntime`](crate::CriRuntime).
#[derive(Debug, Clone)]
pub(crate) struct EventSubscriber {
    cri: RuntimeServiceClient<Channel>,
    containerd: EventsClient<Channel>,
    namespace: String,
    /// Which source worked last (`SOURCE_*`), shared by clones.
    source: Arc<AtomicU8>,
    /// Exits seen on containerd's events that CRI has not recorded yet, shared by clones.
    hints: ExitHints,
    /// The creations and starts the runtime's own calls made, shared by clones.
    own: OwnChanges,
    /// [`CriConfig::request_timeout`]: the longest an event waits for the runtime's own calls.
    request_timeout: Duration,
    /// [`CriConfig::prefer_containerd_events`].
    prefer_containerd: bool,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;
type Subscription<T> = BoxFuture<Result<tonic::Response<Streaming<T>>, tonic::Status>>;

impl EventSubscriber {
    pub(crate) fn new(channel: &Channel, config: &CriConfig, max_message_size: usize) -> Self {
        Self {
            cri: RuntimeServiceClient::new(channel.clone())
                .max_decoding_message_size(max_message_size),
            containerd: EventsClient::new(channel.clone())
                .max_decoding_message_size(max_message_size),
            namespace: config.containerd_namespace.clone(),
            source: Arc::new(AtomicU8::new(SOURCE_UNKNOWN)),
            hints: ExitHints::default(),
            own: OwnChanges::default(),
            request_timeout: config.request_timeout,
            prefer_containerd: config.prefer_containerd_events,
        }
    }

    /// The creations and starts the runtime's own calls made ([`crate::own`]).
    pub(crate) fn own(&self) -> &OwnChanges {
        &self.own
    }

    /// The exit hints the native streams of this subscriber (and its clones) keep.
    pub(crate) fn exit_hints(&self) -> &ExitHints {
        &self.hints
    }

    /// The source that answered a subscription last, if one did.
    pub(crate) fn source(&self) -> Option<ContainerEventSource> {
        match self.source.load(Ordering::Relaxed) {
            SOURCE_CRI => Some(ContainerEventSource::Cri),
            SOURCE_CONTAINERD => Some(ContainerEventSource::Containerd),
            _ => None,
        }
    }

    /// A new event stream from the source that works; see the module docs.
    pub(crate) async fn subscribe(&self) -> Result<ContainerEventStream, CriError> {
        let source = self.source.load(Ordering::Relaxed);
        if source == SOURCE_CONTAINERD {
            return self.subscribe_containerd(None).await;
        }
        if self.prefer_containerd && source == SOURCE_UNKNOWN {
            match self.subscribe_containerd(None).await {
                Err(CriError::SubscribeEvents { status })
                    if status.code() == tonic::Code::Unimplemented =>
                {
                    debug!(
                        message = status.message(),
                        "containerd's events are unimplemented; using CRI GetContainerEvents"
                    );
                }
                other => return other,
            }
        }
        let mut call = self.call_cri();
        match tokio::time::timeout(PROBE, &mut call).await {
            Ok(Ok(resp)) => {
                self.source.store(SOURCE_CRI, Ordering::Relaxed);
                Ok(cri_stream(resp.into_inner()))
            }
            Ok(Err(status)) if status.code() == tonic::Code::Unimplemented => {
                debug!(
                    message = status.message(),
                    "CRI GetContainerEvents is unimplemented; using containerd's events"
                );
                self.subscribe_containerd(Some(status)).await
            }
            Ok(Err(status)) => Err(CriError::Rpc {
                op: GET_CONTAINER_EVENTS,
                status,
            }),
            // The runtime holds the call open until its first event: it is subscribed.
            Err(_) => {
                let this = self.clone();
                Ok(pending_stream(async move {
                    match call.await {
                        Ok(resp) => {
                            this.source.store(SOURCE_CRI, Ordering::Relaxed);
                            Ok(cri_stream(resp.into_inner()))
                        }
                        Err(status) if status.code() == tonic::Code::Unimplemented => {
                            this.subscribe_containerd(Some(status)).await
                        }
                        Err(status) => Err(CriError::Rpc {
                            op: GET_CONTAINER_EVENTS,
                            status,
                        }),
                    }
                }))
            }
        }
    }

    fn call_cri(&self) -> Subscription<cri::ContainerEventResponse> {
        let mut client = self.cri.clone();
        Box::pin(async move { client.get_container_events(cri::GetEventsRequest {}).await })
    }

    fn call_containerd(&self) -> Result<Subscription<ctrd::Envelope>, CriError> {
        let mut request = tonic::Request::new(ctrd::SubscribeRequest {
            filters: subscription_filters(&self.namespace),
        });
        let namespace = self
            .namespace
            .parse()
            .map_err(|_| CriError::InvalidNamespace {
                namespace: self.namespace.clone(),
                reason: "not valid as gRPC metadata (visible ASCII only)",
            })?;
        request.metadata_mut().insert(NAMESPACE_HEADER, namespace);
        let mut client = self.containerd.clone();
        Ok(Box::pin(async move { client.subscribe(request).await }))
    }

    /// Subscribes to containerd's events; `cri` is what `GetContainerEvents` answered, if it
    /// was tried (for the error when this fails too).
    async fn subscribe_containerd(
        &self,
        cri: Option<tonic::Status>,
    ) -> Result<ContainerEventStream, CriError> {
        if self.namespace.is_empty() {
            return Err(CriError::InvalidNamespace {
                namespace: String::new(),
                reason: "empty",
            });
        }
        let mut call = self.call_containerd()?;
        let refused = |status: tonic::Status, cri: Option<tonic::Status>| match cri {
            Some(cri) if status.code() == tonic::Code::Unimplemented => {
                CriError::ContainerEventsUnsupported {
                    cri,
                    containerd: status,
                }
            }
            _ => CriError::SubscribeEvents { status },
        };
        let namespace = self.namespace.clone();
        let confirm = Confirmer::new(
            self.cri.clone(),
            self.hints.clone(),
            self.own.clone(),
            self.request_timeout,
        );
        match tokio::time::timeout(PROBE, &mut call).await {
            Ok(Ok(resp)) => {
                self.source.store(SOURCE_CONTAINERD, Ordering::Relaxed);
                Ok(containerd_stream(resp.into_inner(), namespace, confirm))
            }
            Ok(Err(status)) => Err(refused(status, cri)),
            Err(_) => {
                self.source.store(SOURCE_CONTAINERD, Ordering::Relaxed);
                Ok(pending_stream(async move {
                    match call.await {
                        Ok(resp) => Ok(containerd_stream(resp.into_inner(), namespace, confirm)),
                        Err(status) => Err(refused(status, cri)),
                    }
                }))
            }
        }
    }
}

/// The filters of the native subscription: the topics of [`TOPICS`] in `namespace` (filters are
/// ORed, the conditions within one ANDed).
fn subscription_filters(namespace: &str) -> Vec<String> {
    TOPICS
        .iter()
        .map(|topic| format!("namespace=={namespace:?},topic=={topic:?}"))
        .collect()
}

/// A stream that first waits for its subscription to be answered.
fn pending_stream(
    subscribed: impl Future<Output = Result<ContainerEventStream, CriError>> + Send + 'static,
) -> ContainerEventStream {
    Box::pin(futures::stream::once(subscribed).flat_map(|r| match r {
        Ok(stream) => stream,
        Err(e) => {
            debug!(error = %kubelet_api::chain(&e), "container event subscription failed");
            Box::pin(futures::stream::iter([Err(Error::from(e))])) as ContainerEventStream
        }
    }))
}

/// Reads a gRPC stream, mapping each message with `map` (`None`: skip it); a transport or
/// status error is yielded once and ends the stream.
fn message_stream<T, O, F>(
    inner: Streaming<T>,
    map: F,
    on_error: fn(tonic::Status) -> CriError,
) -> futures::stream::BoxStream<'static, kubelet_api::Result<O>>
where
    T: Send + 'static,
    O: Send + 'static,
    F: Fn(T) -> Option<O> + Send + 'static,
{
    Box::pin(futures::stream::unfold(
        Some((inner, map)),
        move |state| async move {
            let (mut inner, map) = state?;
            loop {
                match inner.message().await {
                    Ok(Some(msg)) => {
                        if let Some(event) = map(msg) {
                            return Some((Ok(event), Some((inner, map))));
                        }
                    }
                    Ok(None) => {
                        debug!("container event stream ended");
                        return None;
                    }
                    Err(status) => {
                        let e = on_error(status);
                        debug!(error = %kubelet_api::chain(&e), "container event stream broke");
                        return Some((Err(Error::from(e)), None));
                    }
                }
            }
        },
    ))
}

fn cri_stream(inner: Streaming<cri::ContainerEventResponse>) -> ContainerEventStream {
    message_stream(inner, from_cri, |status| CriError::Rpc {
        op: GET_CONTAINER_EVENTS,
        status,
    })
}

fn containerd_stream(
    inner: Streaming<ctrd::Envelope>,
    namespace: String,
    confirm: Confirmer,
) -> ContainerEventStream {
    let decoded = message_stream(
        inner,
        move |envelope| match from_envelope(&envelope, &namespace) {
            Ok(decoded) => decoded,
            Err(e) => {
                warn!(error = %kubelet_api::chain(&e), "skipping a containerd event");
                None
            }
        },
        |status| CriError::SubscribeEvents { status },
    );
    Box::pin(NativeEvents {
        source: Some(decoded),
        pending: FuturesUnordered::new(),
        chains: HashMap::new(),
        error: None,
        confirm,
        ended: false,
    })
}

/// The native stream: decoded containerd events in, confirmed events out.
///
/// Events are confirmed concurrently. The events of one container (or sandbox) ID are yielded
/// in stream order, each once it is confirmed; events of different IDs do not wait for each
/// other, so an exit is not held back while CRI catches up with another container's creation
/// (the CRI plugin records a container tens of milliseconds after containerd's
/// `ContainerCreate`, and a burst of creations queues them). An exit is yielded as soon as the
/// events of its container before it are (its hint makes CRI reads show it, see
/// [`crate::exits`]), and again once CRI has recorded it.
struct NativeEvents {
    /// `None` once the subscription ended or failed.
    source: Option<futures::stream::BoxStream<'static, kubelet_api::Result<Decoded>>>,
    /// Events in confirmation.
    pending: FuturesUnordered<BoxFuture<ContainerEvent>>,
    /// Per ID, the completion of the newest event in `pending` (the next event of the ID waits
    /// for it).
    chains: HashMap<String, oneshot::Receiver<()>>,
    /// The subscription's error, yielded once the events before it are.
    error: Option<Error>,
    confirm: Confirmer,
    /// An error was yielded: the stream is over.
    ended: bool,
}

impl NativeEvents {
    fn take(&mut self, item: kubelet_api::Result<Decoded>) {
        let confirm = self.confirm.clone();
        match item {
            Err(e) => {
                self.source = None;
                self.error = Some(e);
            }
            Ok(Decoded::TaskDeleted(id)) => {
                // The CRI plugin records the exit right after this.
                if let Some(notify) = lock(&confirm.task_deletions).remove(&id) {
                    notify.notify_one();
                }
            }
            Ok(Decoded::Oom(id)) => confirm.hints.record_oom(&id),
            Ok(Decoded::Exit(event, exit)) => {
                confirm.hints.record_exit(&event.container_id, exit);
                let deleted = Arc::new(tokio::sync::Notify::new());
                lock(&confirm.task_deletions).insert(event.container_id.clone(), deleted.clone());
                let hinted = confirm.clone();
                let early = event.clone();
                self.enqueue(event.container_id.clone(), async move {
                    hinted.with_pod(early).await
                });
                self.enqueue(event.container_id.clone(), async move {
                    confirm.confirm(event, Some(deleted)).await
                });
            }
            Ok(Decoded::Event(event)) => {
                self.enqueue(event.container_id.clone(), async move {
                    confirm.confirm(event, None).await
                });
            }
        }
    }

    /// Queues `confirmed`, to be yielded after the queued events of `id`.
    fn enqueue(
        &mut self,
        id: String,
        confirmed: impl std::future::Future<Output = ContainerEvent> + Send + 'static,
    ) {
        if self.chains.len() >= CONFIRM_BUFFER {
            // Forget the IDs whose events are all yielded (their signal was sent) or dropped.
            self.chains
                .retain(|_, done| matches!(done.try_recv(), Ok(None)));
        }
        let (done_tx, done_rx) = oneshot::channel();
        let before = self.chains.insert(id, done_rx);
        self.pending.push(Box::pin(async move {
            if let Some(before) = before {
                // Sent when the event before is yielded; an error means it was dropped.
                let _ = before.await;
            }
            let event = confirmed.await;
            let _ = done_tx.send(());
            event
        }));
    }
}

impl futures::Stream for NativeEvents {
    type Item = kubelet_api::Result<ContainerEvent>;

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        let this = &mut *self;
        if this.ended {
            return Poll::Ready(None);
        }
        while this.pending.len() < CONFIRM_BUFFER {
            let Some(source) = this.source.as_mut() else {
                break;
            };
            match source.poll_next_unpin(cx) {
                Poll::Ready(Some(item)) => this.take(item),
                Poll::Ready(None) => this.source = None,
                Poll::Pending => break,
            }
        }
        // A future resolves right after it signals the next event of its ID, so it is yielded
        // before that one can be.
        if let Poll::Ready(Some(event)) = this.pending.poll_next_unpin(cx) {
            return Poll::Ready(Some(Ok(event)));
        }
        if this.pending.is_empty() {
            if let Some(e) = this.error.take() {
                this.ended = true;
                return Poll::Ready(Some(Err(e)));
            }
            if this.source.is_none() {
                return Poll::Ready(None);
            }
        }
        Poll::Pending
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What CRI says about an ID.
#[derive(Debug, Clone, PartialEq, Eq)]
enum CriView {
    Container {
        state: cri::ContainerState,
        pod_uid: Option<String>,
    },
    Sandbox {
        ready: bool,
        pod_uid: Option<String>,
    },
    /// Neither a container nor a sandbox of that ID.
    Absent,
    /// CRI did not answer; stop asking.
    Failed,
}

impl CriView {
    fn pod_uid(&self) -> Option<&str> {
        match self {
            CriView::Container { pod_uid, .. } | CriView::Sandbox { pod_uid, .. } => {
                pod_uid.as_deref()
            }
            CriView::Absent | CriView::Failed => None,
        }
    }

    /// Whether CRI has recorded an exit of this ID, or does not know it as a running container
    /// (a sandbox, or an ID it never had).
    fn recorded_exit(&self) -> bool {
        use cri::ContainerState as S;
        match self {
            CriView::Container { state, .. } => {
                matches!(state, S::ContainerExited | S::ContainerUnknown)
            }
            CriView::Sandbox { .. } | CriView::Absent => true,
            CriView::Failed => false,
        }
    }

    /// Whether CRI already shows what an event of `kind` says.
    fn shows(&self, kind: ContainerEventKind) -> bool {
        use cri::ContainerState as S;
        match (kind, self) {
            (_, CriView::Failed) => true,
            (ContainerEventKind::Deleted, view) => *view == CriView::Absent,
            (_, CriView::Absent) => kind == ContainerEventKind::Stopped,
            (ContainerEventKind::Created, _) => true,
            (ContainerEventKind::Started, CriView::Container { state, .. }) => {
                *state != S::ContainerCreated
            }
            (ContainerEventKind::Started, CriView::Sandbox { .. }) => true,
            (ContainerEventKind::Stopped, CriView::Container { state, .. }) => {
                matches!(state, S::ContainerExited | S::ContainerUnknown)
            }
            (ContainerEventKind::Stopped, CriView::Sandbox { ready, .. }) => !ready,
            // Kinds added later are not waited for.
            _ => true,
        }
    }
}

/// Confirms native events through CRI and fills in their pod UID.
#[derive(Debug, Clone)]
struct Confirmer {
    cri: RuntimeServiceClient<Channel>,
    /// Pod UIDs by container or sandbox ID, for `Deleted` events (CRI no longer knows the ID).
    pods: Arc<std::sync::Mutex<HashMap<String, String>>>,
    /// `Stopped` events waiting for their task's `TaskDelete`, by container ID.
    task_deletions: Arc<std::sync::Mutex<HashMap<String, Arc<tokio::sync::Notify>>>>,
    /// Bounds the CRI calls in flight ([`CONFIRM_CALLS`]).
    calls: Arc<tokio::sync::Semaphore>,
    /// The runtime's exit hints: set on `TaskExit` and `TaskOOM`, dropped once CRI shows the
    /// exit.
    hints: ExitHints,
    /// The creations and starts of the runtime's own calls: such an event is confirmed by the
    /// call's return.
    own: OwnChanges,
    /// How long a creation or start waits for the runtime's calls in flight.
    own_call_within: Duration,
}

impl Confirmer {
    fn new(
        cri: RuntimeServiceClient<Channel>,
        hints: ExitHints,
        own: OwnChanges,
        own_call_within: Duration,
    ) -> Self {
        Self {
            cri,
            pods: Arc::default(),
            task_deletions: Arc::default(),
            calls: Arc::new(tokio::sync::Semaphore::new(CONFIRM_CALLS)),
            hints,
            own,
            own_call_within,
        }
    }

    /// For a creation or a start: whether the runtime's own call that made it confirms it,
    /// waiting (until `deadline`) while such calls are in flight, since the event may be theirs
    /// (containerd publishes a creation before the call returns, and CRI shows it only then:
    /// asking CRI meanwhile only finds it absent, and a burst of such questions held up every
    /// confirmation). `false` when no call of the runtime is in flight and none confirms it: CRI
    /// is asked.
    async fn wait_for_own_call(
        &self,
        event: &mut ContainerEvent,
        deadline: tokio::time::Instant,
    ) -> bool {
        if !matches!(
            event.kind,
            ContainerEventKind::Created | ContainerEventKind::Started
        ) {
            return false;
        }
        loop {
            let ended = self.own.call_ended();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if self.confirmed_by_own_call(event) {
                return true;
            }
            if !self.own.calls_in_flight() {
                return false;
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                return false;
            }
        }
    }

    /// `event` confirmed by the runtime's own call that made its change, if that call has
    /// returned: stamped no later than the return, with the call's pod. See [`crate::own`].
    fn confirmed_by_own_call(&self, event: &mut ContainerEvent) -> bool {
        let Some((at, uid)) = self.own.returned(&event.container_id, event.kind) else {
            return false;
        };
        event.created_at = event.created_at.min(at);
        self.remember_uid(&event.container_id, &uid);
        event.pod_uid = Some(uid);
        true
    }

    /// `event` with its pod UID, without waiting for CRI to show it: the UID remembered from
    /// earlier events of its ID, or else the one CRI reports now.
    async fn with_pod(&self, mut event: ContainerEvent) -> ContainerEvent {
        let known = lock(&self.pods).get(&event.container_id).cloned();
        event.pod_uid = match known {
            Some(uid) => Some(uid),
            None => {
                let deadline = tokio::time::Instant::now() + CONFIRM_WITHIN;
                let view = self.look_up(&event.container_id, deadline).await;
                self.remember(&event.container_id, &view)
            }
        };
        event
    }

    /// Remembers the pod UID `view` gives for `id`; returns it, or the one remembered earlier.
    fn remember(&self, id: &str, view: &CriView) -> Option<String> {
        match view.pod_uid() {
            Some(uid) => {
                self.remember_uid(id, uid);
                Some(uid.to_string())
            }
            None => lock(&self.pods).get(id).cloned(),
        }
    }

    /// Remembers `uid` as the pod of `id`.
    fn remember_uid(&self, id: &str, uid: &str) {
        let mut pods = lock(&self.pods);
        if pods.len() >= MAX_REMEMBERED {
            pods.clear();
        }
        pods.insert(id.to_string(), uid.to_string());
    }

    /// Waits until CRI shows `event` (at most [`CONFIRM_WITHIN`]) and fills in its pod UID. A
    /// `Stopped` event first waits for its task's deletion (`deleted`): containerd's CRI plugin
    /// records an exit right after deleting the task, so asking CRI earlier only finds the
    /// container still running.
    async fn confirm(
        &self,
        mut event: ContainerEvent,
        deleted: Option<Arc<tokio::sync::Notify>>,
    ) -> ContainerEvent {
        let own_deadline = tokio::time::Instant::now() + self.own_call_within;
        if self.wait_for_own_call(&mut event, own_deadline).await {
            return event;
        }
        let deadline = tokio::time::Instant::now() + CONFIRM_WITHIN;
        let mut view = self.look_up(&event.container_id, deadline).await;
        if let Some(deleted) = deleted {
            // Wait only for what CRI knows and has not recorded yet (a task made without CRI
            // may never be deleted).
            let known = matches!(view, CriView::Container { .. } | CriView::Sandbox { .. });
            if known
                && !view.shows(event.kind)
                && tokio::time::timeout_at(deadline, deleted.notified())
                    .await
                    .is_err()
            {
                debug!(containerID = %event.container_id, "no TaskDelete after the exit");
            }
            lock(&self.task_deletions).remove(&event.container_id);
        }
        let mut delay = Duration::from_millis(1);
        loop {
            if view.shows(event.kind) {
                break;
            }
            if tokio::time::Instant::now() + delay >= deadline {
                debug!(
                    containerID = %event.container_id,
                    kind = ?event.kind,
                    ?view,
                    "CRI does not show the containerd event yet; yielding it anyway"
                );
                break;
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_millis(20));
            if self.confirmed_by_own_call(&mut event) {
                return event;
            }
            view = self.look_up(&event.container_id, deadline).await;
        }
        event.pod_uid = self.remember(&event.container_id, &view);
        match event.kind {
            ContainerEventKind::Deleted => {
                lock(&self.pods).remove(&event.container_id);
            }
            // CRI has recorded the exit (or never knew the ID): the hint has done its work.
            ContainerEventKind::Stopped if view.recorded_exit() => {
                self.hints.forget(&event.container_id);
            }
            _ => {}
        }
        event
    }

    async fn look_up(&self, id: &str, deadline: tokio::time::Instant) -> CriView {
        let Ok(Ok(_permit)) = tokio::time::timeout_at(deadline, self.calls.acquire()).await else {
            return CriView::Failed;
        };
        let mut c = self.cri.clone();
        let status = tokio::time::timeout_at(
            deadline,
            c.container_status(cri::ContainerStatusRequest {
                container_id: id.to_string(),
                verbose: false,
            }),
        )
        .await;
        match status {
            Ok(Ok(resp)) => {
                let Some(s) = resp.into_inner().status else {
                    return CriView::Failed;
                };
                return CriView::Container {
                    state: cri::ContainerState::try_from(s.state)
                        .unwrap_or(cri::ContainerState::ContainerUnknown),
                    pod_uid: s.labels.get(labels::POD_UID).cloned(),
                };
            }
            Ok(Err(status)) if crate::error::status_kind(&status) == ErrorKind::NotFound => {}
            Ok(Err(status)) => {
                debug!(containerID = id, error = %status, "ContainerStatus for an event failed");
                return CriView::Failed;
            }
            Err(_) => return CriView::Failed,
        }
        let status = tokio::time::timeout_at(
            deadline,
            c.pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: id.to_string(),
                verbose: false,
            }),
        )
        .await;
        match status {
            Ok(Ok(resp)) => {
                let Some(s) = resp.into_inner().status else {
                    return CriView::Failed;
                };
                CriView::Sandbox {
                    ready: s.state == cri::PodSandboxState::SandboxReady as i32,
                    pod_uid: s.metadata.map(|m| m.uid).filter(|u| !u.is_empty()),
                }
            }
            Ok(Err(status)) if crate::error::status_kind(&status) == ErrorKind::NotFound => {
                CriView::Absent
            }
            Ok(Err(status)) => {
                debug!(sandbox = id, error = %status, "PodSandboxStatus for an event failed");
                CriView::Failed
            }
            Err(_) => CriView::Failed,
        }
    }
}

/// One CRI `ContainerEventResponse` as an event; `None` (logged) for an unknown event type or a
/// response without a container ID.
pub(crate) fn from_cri(resp: cri::ContainerEventResponse) -> Option<ContainerEvent> {
    let kind = match cri::ContainerEventType::try_from(resp.container_event_type) {
        Ok(cri::ContainerEventType::ContainerCreatedEvent) => ContainerEventKind::Created,
        Ok(cri::ContainerEventType::ContainerStartedEvent) => ContainerEventKind::Started,
        Ok(cri::ContainerEventType::ContainerStoppedEvent) => ContainerEventKind::Stopped,
        Ok(cri::ContainerEventType::ContainerDeletedEvent) => ContainerEventKind::Deleted,
        Err(_) => {
            debug!(
                containerID = %resp.container_id,
                event_type = resp.container_event_type,
                "skipping a CRI container event of unknown type"
            );
            return None;
        }
    };
    if resp.container_id.is_empty() {
        warn!("skipping a CRI container event without a container ID");
        return None;
    }
    let pod_uid = resp
        .pod_sandbox_status
        .and_then(|s| s.metadata)
        .map(|m| m.uid)
        .filter(|uid| !uid.is_empty());
    Some(ContainerEvent::new(
        resp.container_id,
        kind,
        pod_uid,
        crate::convert::time_out(resp.created_at).unwrap_or_else(Timestamp::now),
    ))
}

/// A containerd event as the native stream uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decoded {
    /// An event to report.
    Event(ContainerEvent),
    /// A `Stopped` event: the init process of the task exited.
    Exit(ContainerEvent, Exit),
    /// The task of this container (its init process) was deleted.
    TaskDeleted(String),
    /// The OOM killer killed a process of this container.
    Oom(String),
}

/// One containerd event envelope decoded: `Ok(None)` for events of another namespace, of types
/// this does not report (logged at debug) and for exec processes; an error for a payload that
/// does not decode or lacks the container ID.
pub(crate) fn from_envelope(
    envelope: &ctrd::Envelope,
    namespace: &str,
) -> Result<Option<Decoded>, CriError> {
    if envelope.namespace != namespace {
        return Ok(None);
    }
    let Some(any) = &envelope.event else {
        return Err(decode_error(envelope, "", "the envelope has no event"));
    };
    // containerd 1.6 writes the bare message name, newer releases may prefix a host.
    let name = any.type_url.rsplit('/').next().unwrap_or_default();
    let bad = |e: prost::DecodeError| decode_error(envelope, &any.type_url, &e.to_string());
    let no_id = || decode_error(envelope, &any.type_url, "the event has no container ID");
    let at = envelope
        .timestamp
        .and_then(|t| Timestamp::new(t.seconds, t.nanos).ok())
        .unwrap_or_else(Timestamp::now);
    let (id, kind) = match name {
        "containerd.events.ContainerCreate" => {
            let e = ctrd_events::ContainerCreate::decode(any.value.as_slice()).map_err(bad)?;
            (e.id, ContainerEventKind::Created)
        }
        "containerd.events.TaskStart" => {
            let e = ctrd_events::TaskStart::decode(any.value.as_slice()).map_err(bad)?;
            (e.container_id, ContainerEventKind::Started)
        }
        "containerd.events.TaskExit" => {
            let e = ctrd_events::TaskExit::decode(any.value.as_slice()).map_err(bad)?;
            if !e.id.is_empty() && e.id != e.container_id {
                debug!(containerID = %e.container_id, exec = %e.id, "skipping an exec process exit");
                return Ok(None);
            }
            if e.container_id.is_empty() {
                return Err(no_id());
            }
            let exit = Exit {
                // The CRI plugin stores the exit status as an int32 too.
                code: e.exit_status as i32,
                at: e
                    .exited_at
                    .and_then(|t| Timestamp::new(t.seconds, t.nanos).ok())
                    .unwrap_or(at),
            };
            let event = ContainerEvent::new(e.container_id, ContainerEventKind::Stopped, None, at);
            return Ok(Some(Decoded::Exit(event, exit)));
        }
        "containerd.events.TaskOOM" => {
            let e = ctrd_events::TaskOom::decode(any.value.as_slice()).map_err(bad)?;
            if e.container_id.is_empty() {
                return Err(no_id());
            }
            return Ok(Some(Decoded::Oom(e.container_id)));
        }
        "containerd.events.TaskDelete" => {
            // Follows the TaskExit (already reported) when the CRI plugin records the exit.
            let e = ctrd_events::TaskDelete::decode(any.value.as_slice()).map_err(bad)?;
            if e.container_id.is_empty() {
                return Err(no_id());
            }
            if !e.id.is_empty() && e.id != e.container_id {
                return Ok(None);
            }
            return Ok(Some(Decoded::TaskDeleted(e.container_id)));
        }
        "containerd.events.ContainerDelete" => {
            let e = ctrd_events::ContainerDelete::decode(any.value.as_slice()).map_err(bad)?;
            (e.id, ContainerEventKind::Deleted)
        }
        _ => {
            debug!(
                topic = %envelope.topic,
                type_url = %any.type_url,
                "skipping a containerd event of a type not reported"
            );
            return Ok(None);
        }
    };
    if id.is_empty() {
        return Err(no_id());
    }
    Ok(Some(Decoded::Event(ContainerEvent::new(
        id, kind, None, at,
    ))))
}

fn decode_error(envelope: &ctrd::Envelope, type_url: &str, reason: &str) -> CriError {
    CriError::DecodeEvent {
        topic: envelope.topic.clone(),
        type_url: type_url.to_string(),
        reason: reason.to_string(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn envelope(topic: &str, type_url: &str, value: Vec<u8>) -> ctrd::Envelope {
        ctrd::Envelope {
            timestamp: Some(prost_types::Timestamp {
                seconds: 1_700_000_000,
                nanos: 5,
            }),
            namespace: CRI_NAMESPACE.into(),
            topic: topic.into(),
            event: Some(prost_types::Any {
                type_url: type_url.into(),
                value,
            }),
        }
    }

    fn exit(container_id: &str, id: &str) -> Vec<u8> {
        ctrd_events::TaskExit {
            container_id: container_id.into(),
            id: id.into(),
            pid: 42,
            exit_status: 1,
            exited_at: None,
        }
        .encode_to_vec()
    }

    #[test]
    fn task_and_container_events_map_to_kinds() {
        let cases = [
            (
                envelope(
                    "/containers/create",
                    "containerd.events.ContainerCreate",
                    ctrd_events::ContainerCreate {
                        id: "c1".into(),
                        image: "busybox".into(),
                    }
                    .encode_to_vec(),
                ),
                ContainerEventKind::Created,
            ),
            (
                envelope(
                    "/tasks/start",
                    "containerd.events.TaskStart",
                    ctrd_events::TaskStart {
                        container_id: "c1".into(),
                        pid: 7,
                    }
                    .encode_to_vec(),
                ),
                ContainerEventKind::Started,
            ),
            (
                envelope(
                    "/tasks/exit",
                    "containerd.events.TaskExit",
                    exit("c1", "c1"),
                ),
                ContainerEventKind::Stopped,
            ),
            (
                envelope(
                    "/containers/delete",
                    "containerd.events.ContainerDelete",
                    ctrd_events::ContainerDelete { id: "c1".into() }.encode_to_vec(),
                ),
                ContainerEventKind::Deleted,
            ),
        ];
        for (env, kind) in cases {
            let e = match from_envelope(&env, CRI_NAMESPACE).unwrap() {
                Some(Decoded::Event(e)) => e,
                Some(Decoded::Exit(e, exit)) => {
                    // `exited_at` missing: the envelope's time.
                    assert_eq!(exit.code, 1);
                    assert_eq!(exit.at, e.created_at);
                    e
                }
                other => panic!("{env:?} is no event: {other:?}"),
            };
            assert_eq!(e.container_id, "c1");
            assert_eq!(e.kind, kind);
            assert_eq!(e.pod_uid, None);
            assert_eq!(e.created_at, Timestamp::new(1_700_000_000, 5).unwrap());
        }
    }

    #[test]
    fn a_type_url_with_a_host_prefix_decodes() {
        let env = envelope(
            "/tasks/exit",
            "types.containerd.io/containerd.events.TaskExit",
            exit("c1", ""),
        );
        let Some(Decoded::Exit(e, _)) = from_envelope(&env, CRI_NAMESPACE).unwrap() else {
            panic!("{env:?} is no exit");
        };
        assert_eq!(e.kind, ContainerEventKind::Stopped);
    }

    #[test]
    fn an_exit_carries_its_status_and_time_and_an_oom_its_container() {
        let env = envelope(
            "/tasks/exit",
            "containerd.events.TaskExit",
            ctrd_events::TaskExit {
                container_id: "c1".into(),
                id: "c1".into(),
                pid: 42,
                exit_status: 137,
                exited_at: Some(prost_types::Timestamp {
                    seconds: 1_700_000_001,
                    nanos: 9,
                }),
            }
            .encode_to_vec(),
        );
        let Some(Decoded::Exit(e, exit)) = from_envelope(&env, CRI_NAMESPACE).unwrap() else {
            panic!("{env:?} is no exit");
        };
        assert_eq!(e.container_id, "c1");
        assert_eq!(exit.code, 137);
        assert_eq!(exit.at, Timestamp::new(1_700_000_001, 9).unwrap());
        let oom = envelope(
            "/tasks/oom",
            "containerd.events.TaskOOM",
            ctrd_events::TaskOom {
                container_id: "c1".into(),
            }
            .encode_to_vec(),
        );
        assert_eq!(
            from_envelope(&oom, CRI_NAMESPACE).unwrap(),
            Some(Decoded::Oom("c1".into()))
        );
        let no_id = envelope("/tasks/oom", "containerd.events.TaskOOM", Vec::new());
        assert!(matches!(
            from_envelope(&no_id, CRI_NAMESPACE),
            Err(CriError::DecodeEvent { .. })
        ));
    }

    #[test]
    fn exec_processes_other_namespaces_and_unknown_types_are_skipped() {
        let exec = envelope(
            "/tasks/exit",
            "containerd.events.TaskExit",
            exit("c1", "exec-1"),
        );
        assert_eq!(from_envelope(&exec, CRI_NAMESPACE).unwrap(), None);
        let delete = |id: &str| {
            envelope(
                "/tasks/delete",
                "containerd.events.TaskDelete",
                ctrd_events::TaskDelete {
                    container_id: "c1".into(),
                    id: id.into(),
                    ..Default::default()
                }
                .encode_to_vec(),
            )
        };
        assert_eq!(
            from_envelope(&delete("exec-1"), CRI_NAMESPACE).unwrap(),
            None
        );
        assert_eq!(
            from_envelope(&delete("c1"), CRI_NAMESPACE).unwrap(),
            Some(Decoded::TaskDeleted("c1".into()))
        );
        let mut other_ns = envelope("/tasks/exit", "containerd.events.TaskExit", exit("c1", ""));
        other_ns.namespace = "moby".into();
        assert_eq!(from_envelope(&other_ns, CRI_NAMESPACE).unwrap(), None);
        let unknown = envelope(
            "/tasks/paused",
            "containerd.events.TaskPaused",
            vec![0x0a, 0x01, b'x'],
        );
        assert_eq!(from_envelope(&unknown, CRI_NAMESPACE).unwrap(), None);
        let garbage_unknown = envelope("/x", "example.Unknown", vec![0xff, 0xff, 0xff]);
        assert_eq!(
            from_envelope(&garbage_unknown, CRI_NAMESPACE).unwrap(),
            None
        );
    }

    #[test]
    fn bad_payloads_are_typed_errors() {
        // A truncated length-delimited field.
        let truncated = envelope(
            "/tasks/exit",
            "containerd.events.TaskExit",
            vec![0x0a, 0x10, b'c'],
        );
        let e = from_envelope(&truncated, CRI_NAMESPACE).unwrap_err();
        assert!(
            matches!(&e, CriError::DecodeEvent { topic, type_url, .. }
                if topic == "/tasks/exit" && type_url == "containerd.events.TaskExit"),
            "{e}"
        );
        assert_eq!(e.kind(), kubelet_api::ErrorKind::Internal);
        // No container ID.
        let empty = envelope("/tasks/start", "containerd.events.TaskStart", Vec::new());
        assert!(matches!(
            from_envelope(&empty, CRI_NAMESPACE),
            Err(CriError::DecodeEvent { .. })
        ));
        // No payload at all.
        let mut none = envelope("/tasks/start", "containerd.events.TaskStart", Vec::new());
        none.event = None;
        assert!(matches!(
            from_envelope(&none, CRI_NAMESPACE),
            Err(CriError::DecodeEvent { .. })
        ));
        // A payload of another type under a known type URL: wire-type mismatch.
        let mismatched = envelope(
            "/containers/delete",
            "containerd.events.ContainerDelete",
            vec![0x08, 0x01],
        );
        assert!(from_envelope(&mismatched, CRI_NAMESPACE).is_err());
    }

    #[test]
    fn cri_events_map_with_the_pod_uid() {
        let resp = cri::ContainerEventResponse {
            container_id: "c1".into(),
            container_event_type: cri::ContainerEventType::ContainerStoppedEvent as i32,
            created_at: 1_700_000_000_000_000_005,
            pod_sandbox_status: Some(cri::PodSandboxStatus {
                metadata: Some(cri::PodSandboxMetadata {
                    uid: "uid-1".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            containers_statuses: Vec::new(),
        };
        let e = from_cri(resp).unwrap();
        assert_eq!(e.kind, ContainerEventKind::Stopped);
        assert_eq!(e.pod_uid.as_deref(), Some("uid-1"));
        assert_eq!(e.created_at, Timestamp::new(1_700_000_000, 5).unwrap());
        let unknown = cri::ContainerEventResponse {
            container_id: "c1".into(),
            container_event_type: 99,
            ..Default::default()
        };
        assert_eq!(from_cri(unknown), None);
        let no_id = cri::ContainerEventResponse {
            container_event_type: cri::ContainerEventType::ContainerCreatedEvent as i32,
            ..Default::default()
        };
        assert_eq!(from_cri(no_id), None);
    }

    #[test]
    fn cri_confirms_an_event_once_it_shows_the_change() {
        use cri::ContainerState as S;
        let c = |state| CriView::Container {
            state,
            pod_uid: Some("u".into()),
        };
        let sb = |ready| CriView::Sandbox {
            ready,
            pod_uid: Some("u".into()),
        };
        let k = ContainerEventKind::Stopped;
        assert!(!c(S::ContainerRunning).shows(k));
        assert!(c(S::ContainerExited).shows(k));
        assert!(!sb(true).shows(k) && sb(false).shows(k));
        assert!(CriView::Absent.shows(k));
        let k = ContainerEventKind::Started;
        assert!(!c(S::ContainerCreated).shows(k));
        assert!(c(S::ContainerRunning).shows(k) && c(S::ContainerExited).shows(k));
        assert!(!CriView::Absent.shows(k) && sb(true).shows(k));
        let k = ContainerEventKind::Created;
        assert!(!CriView::Absent.shows(k) && c(S::ContainerCreated).shows(k));
        let k = ContainerEventKind::Deleted;
        assert!(!c(S::ContainerExited).shows(k) && !sb(false).shows(k));
        assert!(CriView::Absent.shows(k));
        assert!(CriView::Failed.shows(k));
        assert_eq!(c(S::ContainerRunning).pod_uid(), Some("u"));
    }

    /// Events of one ID keep their order; a slow confirmation holds back no other ID.
    #[tokio::test]
    async fn events_wait_only_for_the_earlier_events_of_their_id() {
        let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:1").connect_lazy();
        let mut events = NativeEvents {
            source: None,
            pending: FuturesUnordered::new(),
            chains: HashMap::new(),
            error: Some(Error::new(ErrorKind::Unavailable, "the subscription broke")),
            confirm: Confirmer::new(
                RuntimeServiceClient::new(channel),
                ExitHints::default(),
                OwnChanges::default(),
                Duration::from_secs(120),
            ),
            ended: false,
        };
        let event =
            |id: &str, kind| ContainerEvent::new(id.to_string(), kind, None, Timestamp::now());
        let (slow_tx, slow_rx) = tokio::sync::oneshot::channel::<()>();
        // "a" is created (confirmed late, as CRI catches up), then exits; "b" exits meanwhile.
        let created = event("a", ContainerEventKind::Created);
        events.enqueue("a".into(), async move {
            let _ = slow_rx.await;
            created
        });
        let a_exit = event("a", ContainerEventKind::Stopped);
        events.enqueue("a".into(), async move { a_exit });
        let b_exit = event("b", ContainerEventKind::Stopped);
        events.enqueue("b".into(), async move { b_exit });
        let next = |e: Option<kubelet_api::Result<ContainerEvent>>| {
            let e = e.expect("an item").expect("an event");
            (e.container_id, e.kind)
        };
        assert_eq!(
            next(events.next().await),
            ("b".to_string(), ContainerEventKind::Stopped)
        );
        let waiting = tokio::time::timeout(Duration::from_millis(50), events.next()).await;
        assert!(waiting.is_err(), "a's exit overtook its creation");
        slow_tx.send(()).expect("the confirmation waits");
        assert_eq!(
            next(events.next().await),
            ("a".to_string(), ContainerEventKind::Created)
        );
        assert_eq!(
            next(events.next().await),
            ("a".to_string(), ContainerEventKind::Stopped)
        );
        // The subscription's error comes after every event before it, and ends the stream.
        assert!(matches!(events.next().await, Some(Err(_))));
        assert!(events.next().await.is_none());
        // Yielded IDs are forgotten when the chains are pruned.
        assert!(
            events
                .chains
                .values_mut()
                .all(|done| !matches!(done.try_recv(), Ok(None)))
        );
    }

    /// A creation or start the runtime's own call made is confirmed by that call's return, with
    /// its pod and stamp, without asking CRI (unreachable here); others are asked.
    #[tokio::test]
    async fn the_runtimes_own_changes_are_confirmed_by_their_calls() {
        let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:1").connect_lazy();
        let own = OwnChanges::default();
        let confirm = Confirmer::new(
            RuntimeServiceClient::new(channel),
            ExitHints::default(),
            own.clone(),
            Duration::from_secs(120),
        );
        let returned = Timestamp::now();
        own.container_created("c1", "pod-a", returned);
        own.container_started("c1", returned);
        // Published after the call returned (a shim's late event): stamped with the return.
        let late = returned + jiff::SignedDuration::from_millis(300);
        for kind in [ContainerEventKind::Created, ContainerEventKind::Started] {
            let e = confirm
                .confirm(ContainerEvent::new("c1", kind, None, late), None)
                .await;
            assert_eq!(e.pod_uid.as_deref(), Some("pod-a"), "{kind:?}");
            assert_eq!(e.created_at, returned, "{kind:?}");
        }
        // Published before the return: its own stamp stays.
        let early = returned - jiff::SignedDuration::from_millis(5);
        let e = confirm
            .confirm(
                ContainerEvent::new("c1", ContainerEventKind::Started, None, early),
                None,
            )
            .await;
        assert_eq!(e.created_at, early);
        // Published before its call returned: it waits for the call instead of asking CRI.
        let call = own.call();
        let waiting = tokio::spawn({
            let confirm = confirm.clone();
            async move {
                confirm
                    .confirm(
                        ContainerEvent::new("s9", ContainerEventKind::Created, None, early),
                        None,
                    )
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiting.is_finished(), "confirmed before the call returned");
        own.sandbox_ran("s9", "pod-b", returned);
        drop(call);
        let e = tokio::time::timeout(Duration::from_secs(2), waiting)
            .await
            .expect("confirmed once the call returned")
            .expect("no panic");
        assert_eq!(e.pod_uid.as_deref(), Some("pod-b"));
        assert_eq!(e.created_at, early);
        // An ID the runtime did not make is asked through CRI (which fails here: no pod).
        let e = confirm
            .confirm(
                ContainerEvent::new("other", ContainerEventKind::Started, None, late),
                None,
            )
            .await;
        assert_eq!(e.pod_uid, None);
        assert_eq!(e.created_at, late);
        // A removal is never taken from the calls; the pod remembered for the ID names it.
        let e = confirm
            .confirm(
                ContainerEvent::new("c1", ContainerEventKind::Deleted, None, late),
                None,
            )
            .await;
        assert_eq!(e.pod_uid.as_deref(), Some("pod-a"));
    }

    #[test]
    fn filters_select_the_namespace_and_topics() {
        let f = subscription_filters("k8s.io");
        assert_eq!(f.len(), TOPICS.len());
        assert_eq!(f[2], r#"namespace=="k8s.io",topic=="/tasks/exit""#);
        assert_eq!(f[3], r#"namespace=="k8s.io",topic=="/tasks/oom""#);
    }
}
