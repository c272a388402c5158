//! Every Service of the cluster, from a watch (the kubelet's service informer), for the pods'
//! service environment variables: [`ServiceCache`] is read by [`ApiObjects`](crate::ApiObjects)
//! on each container start and filled by a watch the agent runs. Until the
//! first list has arrived, reads fail as the kubelet's do ("services have not yet been read at
//! least once, cannot construct envvars"), so early containers wait rather than start without
//! their variables.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::Client;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use crate::wire::{self, Decoded};

/// At most one watch-error log line per this period.
const ERROR_LOG_EVERY: Duration = Duration::from_secs(30);

/// The Services, as a watch sees them. Cheap to clone.
#[derive(Clone, Default)]
pub struct ServiceCache {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    state: Mutex<State>,
    /// Whether a watch runs (one per cache).
    running: AtomicBool,
    /// Whether the first list has arrived.
    ready: AtomicBool,
}

/// The Services by namespace and name, and the next list while one arrives (it replaces them
/// whole when done, so Services deleted while the watch was down go).
#[derive(Default)]
struct State {
    services: HashMap<(String, String), Arc<Service>>,
    relisting: Option<HashMap<(String, String), Arc<Service>>>,
}

impl State {
    fn apply(&mut self, event: Event<Service>) -> bool {
        let key = |s: &Service| {
            (
                s.metadata.namespace.clone().unwrap_or_default(),
                s.metadata.name.clone().unwrap_or_default(),
            )
        };
        match event {
            Event::Init => self.relisting = Some(HashMap::new()),
            Event::InitApply(s) => {
                self.relisting
                    .get_or_insert_with(HashMap::new)
                    .insert(key(&s), Arc::new(s));
            }
            Event::InitDone => {
                if let Some(listed) = self.relisting.take() {
                    self.services = listed;
                }
                return true;
            }
            Event::Apply(s) => {
                self.services.insert(key(&s), Arc::new(s));
            }
            Event::Delete(s) => {
                self.services.remove(&key(&s));
            }
        }
        false
    }
}

impl std::fmt::Debug for ServiceCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceCache")
            .field("ready", &self.inner.ready.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl ServiceCache {
    /// The Services, once listed; an error before that.
    pub fn services(&self) -> Result<Vec<Arc<Service>>, String> {
        if self.inner.ready.load(Ordering::Acquire) {
            Ok(self.inner.state.lock().services.values().cloned().collect())
        } else {
            Err("services have not yet been read at least once, cannot construct envvars".into())
        }
    }

    /// Watch every Service through `client` until `shutdown` (once per cache; later calls
    /// return at once). Watch errors are retried with backoff and logged at most every 30 s.
    pub async fn run(&self, client: Client, shutdown: CancellationToken) {
        if self.inner.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let api: Api<Decoded<Service>> = Api::all(client);
        let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
        let mut stream = std::pin::pin!(stream);
        let mut last_error: Option<Instant> = None;
        loop {
            let next = tokio::select! {
                _ = shutdown.cancelled() => return,
                n = stream.next() => n,
            };
            match next {
                Some(Ok(event)) => {
                    let listed = self.inner.state.lock().apply(wire::event(event));
                    if listed && !self.inner.ready.swap(true, Ordering::AcqRel) {
                        tracing::debug!(
                            services = self.inner.state.lock().services.len(),
                            "services listed"
                        );
                    }
                }
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn service(namespace: &str, name: &str, ip: &str) -> Service {
        let mut s = Service::default();
        s.metadata.namespace = Some(namespace.into());
        s.metadata.name = Some(name.into());
        s.spec = Some(k8s_openapi::api::core::v1::ServiceSpec {
            cluster_ip: Some(ip.into()),
            ..Default::default()
        });
        s
    }

    fn ips(state: &State) -> Vec<String> {
        let mut ips: Vec<String> = state
            .services
            .values()
            .filter_map(|s| s.spec.as_ref()?.cluster_ip.clone())
            .collect();
        ips.sort_unstable();
        ips
    }

    #[test]
    fn a_relist_replaces_the_services_whole_and_events_apply_between() {
        let mut state = State::default();
        assert!(!state.apply(Event::Init));
        assert!(!state.apply(Event::InitApply(service("a", "x", "10.0.0.1"))));
        assert!(!state.apply(Event::InitApply(service("b", "x", "10.0.0.2"))));
        assert!(ips(&state).is_empty(), "a list in progress is not served");
        assert!(state.apply(Event::InitDone));
        assert_eq!(ips(&state), ["10.0.0.1", "10.0.0.2"]);
        state.apply(Event::Apply(service("a", "x", "10.0.0.3")));
        state.apply(Event::Apply(service("a", "y", "10.0.0.4")));
        state.apply(Event::Delete(service("b", "x", "10.0.0.2")));
        assert_eq!(ips(&state), ["10.0.0.3", "10.0.0.4"]);
        // The watch restarts: what the new list lacks is gone.
        state.apply(Event::Init);
        state.apply(Event::InitApply(service("a", "y", "10.0.0.4")));
        assert_eq!(ips(&state).len(), 2, "still served until the list is done");
        state.apply(Event::InitDone);
        assert_eq!(ips(&state), ["10.0.0.4"]);
    }
}
