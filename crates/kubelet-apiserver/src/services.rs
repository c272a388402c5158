//! Every Service of the cluster, from a watch (the kubelet's service informer), for the pods'
//! service environment variables: [`ServiceCache`] is read by [`ApiObjects`](crate::ApiObjects)
//! on each container start and filled by a kube-runtime reflector the agent runs. Until the
//! first list has arrived, reads fail as the kubelet's do ("services have not yet been read at
//! least once, cannot construct envvars"), so early containers wait rather than start without
//! their variables.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::Client;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::watcher::{self, Event};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

/// At most one watch-error log line per this period.
const ERROR_LOG_EVERY: Duration = Duration::from_secs(30);

/// The Services, as a watch sees them. Cheap to clone.
#[derive(Clone)]
pub struct ServiceCache {
    store: Store<Service>,
    writer: Arc<Mutex<Option<Writer<Service>>>>,
    ready: Arc<AtomicBool>,
}

impl std::fmt::Debug for ServiceCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceCache")
            .field("ready", &self.ready.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Default for ServiceCache {
    fn default() -> Self {
        let (store, writer) = reflector::store();
        Self {
            store,
            writer: Arc::new(Mutex::new(Some(writer))),
            ready: Arc::new(AtomicBool::new(false)),
        }
    }
}

impl ServiceCache {
    /// The Services, once listed; an error before that.
    pub fn services(&self) -> Result<Vec<Arc<Service>>, String> {
        if self.ready.load(Ordering::Acquire) {
            Ok(self.store.state())
        } else {
            Err("services have not yet been read at least once, cannot construct envvars".into())
        }
    }

    /// Watch every Service through `client` until `shutdown` (once per cache; later calls
    /// return at once). Watch errors are retried with backoff and logged at most every 30 s.
    pub async fn run(&self, client: Client, shutdown: CancellationToken) {
        let Some(writer) = self.writer.lock().take() else {
            return;
        };
        let api: Api<Service> = Api::all(client);
        let stream =
            reflector::reflector(writer, watcher::watcher(api, watcher::Config::default()))
                .default_backoff();
        let mut stream = std::pin::pin!(stream);
        let mut last_error: Option<Instant> = None;
        loop {
            let next = tokio::select! {
                _ = shutdown.cancelled() => return,
                n = stream.next() => n,
            };
            match next {
                Some(Ok(Event::InitDone)) => {
                    if !self.ready.swap(true, Ordering::AcqRel) {
                        tracing::debug!(services = self.store.state().len(), "services listed");
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    if last_error.is_none_or(|t| t.elapsed() >= ERROR_LOG_EVERY) {
                        tracing::warn!(error = %kubelet_api::chain(&e), "watching services failed; retrying");
                        last_error = Some(Instant::now());
                    }
                }
                None => return,
            }
        }
    }
}
