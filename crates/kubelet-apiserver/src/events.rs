//! Posting events to the API server as the kubelet's event recorder does: core/v1 `Event`s with
//! source component `kubelet` and the node as host, a client-side token bucket
//! (`eventRecordQPS` 5, `eventBurst` 10), and repeats of the same event aggregated into one
//! object whose `count` and `lastTimestamp` move (the client-go correlator's behaviour for
//! identical events).

use std::collections::HashMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Event as ApiEvent, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kubelet_api::Event;
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::error::{ApiServerError, is_status};

/// Identical events remembered for aggregation (the oldest half is forgotten when full).
const AGGREGATION_CACHE: usize = 4096;

/// A token bucket: `burst` tokens, refilled at `qps` per second.
#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            qps: if qps > 0.0 { qps } else { f64::INFINITY },
            burst,
            tokens: burst,
            last: Instant::now(),
        }
    }

    /// Take a token at `now`: `None` if one was available, else how long to wait before trying
    /// again.
    pub fn try_take(&mut self, now: Instant) -> Option<Duration> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            None
        } else {
            Some(Duration::from_secs_f64((1.0 - self.tokens) / self.qps))
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    kind: String,
    namespace: String,
    name: String,
    uid: String,
    field_path: String,
    type_: &'static str,
    reason: String,
    message: String,
}

#[derive(Debug, Clone)]
struct Seen {
    name: String,
    count: i32,
    at: u64,
}

/// Posts [`Event`]s for one node.
#[derive(Debug)]
pub(crate) struct EventPoster {
    node_name: String,
    bucket: Mutex<TokenBucket>,
    seen: Mutex<(u64, HashMap<Key, Seen>)>,
}

/// The API object for `ev` (first occurrence).
pub fn api_event(
    ev: &Event,
    node_name: &str,
    name: String,
    namespace: &str,
    count: i32,
    first: Timestamp,
) -> ApiEvent {
    let inv = &ev.involved;
    let opt = |s: &str| (!s.is_empty()).then(|| s.to_string());
    ApiEvent {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace.to_string()),
            annotations: (!ev.annotations.is_empty()).then(|| ev.annotations.clone()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: opt(&inv.kind),
            namespace: opt(&inv.namespace),
            name: opt(&inv.name),
            uid: opt(&inv.uid),
            field_path: opt(&inv.field_path),
            ..Default::default()
        },
        reason: Some(ev.reason.clone()),
        message: Some(ev.message.clone()),
        type_: Some(ev.type_.as_str().to_string()),
        source: Some(EventSource {
            component: Some("kubelet".into()),
            host: Some(node_name.to_string()),
        }),
        count: Some(count),
        first_timestamp: Some(Time(first)),
        last_timestamp: Some(Time(ev.timestamp)),
        event_time: None::<MicroTime>,
        reporting_component: Some("kubelet".into()),
        reporting_instance: Some(node_name.to_string()),
        ..Default::default()
    }
}

/// The namespace an event about `ev.involved` lives in (`default` for cluster objects).
pub fn event_namespace(ev: &Event) -> &str {
    if ev.involved.namespace.is_empty() {
        "default"
    } else {
        &ev.involved.namespace
    }
}

impl EventPoster {
    pub(crate) fn new(node_name: &str, qps: f64, burst: u32) -> Self {
        Self {
            node_name: node_name.to_string(),
            bucket: Mutex::new(TokenBucket::new(qps, burst)),
            seen: Mutex::new((0, HashMap::new())),
        }
    }

    async fn wait_for_token(&self) {
        loop {
            let wait = self.bucket.lock().try_take(Instant::now());
            match wait {
                None => return,
                Some(d) => tokio::time::sleep(d).await,
            }
        }
    }

    pub(crate) async fn post(
        &self,
        client: &kube::Client,
        ev: &Event,
    ) -> Result<(), ApiServerError> {
        if ev.involved.kind == "File" {
            // Not an API object: the kubelet logs these only.
            return Ok(());
        }
        self.wait_for_token().await;
        let namespace = event_namespace(ev).to_string();
        let api: Api<ApiEvent> = Api::namespaced(client.clone(), &namespace);
        let key = Key {
            kind: ev.involved.kind.clone(),
            namespace: ev.involved.namespace.clone(),
            name: ev.involved.name.clone(),
            uid: ev.involved.uid.clone(),
            field_path: ev.involved.field_path.clone(),
            type_: ev.type_.as_str(),
            reason: ev.reason.clone(),
            message: ev.message.clone(),
        };
        let err = |source| ApiServerError::PostEvent {
            reason: ev.reason.clone(),
            object: format!(
                "{} {}/{}",
                ev.involved.kind, ev.involved.namespace, ev.involved.name
            ),
            source,
        };
        let previous = self.seen.lock().1.get(&key).cloned();
        if let Some(prev) = previous {
            let count = prev.count.saturating_add(1);
            let patch = serde_json::json!({
                "count": count,
                "lastTimestamp": Time(ev.timestamp),
                "message": ev.message,
            });
            match api
                .patch(&prev.name, &PatchParams::default(), &Patch::Merge(patch))
                .await
            {
                Ok(_) => {
                    self.remember(key, Seen { count, ..prev });
                    return Ok(());
                }
                Err(e) if is_status(&e, 404) => {}
                Err(e) => return Err(err(e)),
            }
        }
        let name = format!(
            "{}.{:x}",
            if ev.involved.name.is_empty() {
                &self.node_name
            } else {
                &ev.involved.name
            },
            ev.timestamp.as_nanosecond()
        );
        let obj = api_event(
            ev,
            &self.node_name,
            name.clone(),
            &namespace,
            1,
            ev.timestamp,
        );
        match api.create(&PostParams::default(), &obj).await {
            Ok(_) => {}
            Err(e) if is_status(&e, 409) => {}
            Err(e) => return Err(err(e)),
        }
        self.remember(
            key,
            Seen {
                name,
                count: 1,
                at: 0,
            },
        );
        Ok(())
    }

    fn remember(&self, key: Key, mut seen: Seen) {
        let mut guard = self.seen.lock();
        let (clock, map) = &mut *guard;
        *clock += 1;
        seen.at = *clock;
        if map.len() >= AGGREGATION_CACHE && !map.contains_key(&key) {
            let cutoff = *clock - (AGGREGATION_CACHE as u64 / 2);
            map.retain(|_, s| s.at > cutoff);
        }
        map.insert(key, seen);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubelet_api::{EventType, InvolvedObject};
    use std::collections::BTreeMap;

    #[tokio::test(start_paused = true)]
    async fn token_bucket_allows_a_burst_then_the_rate() {
        let mut b = TokenBucket::new(5.0, 10);
        let now = Instant::now();
        for _ in 0..10 {
            assert_eq!(b.try_take(now), None);
        }
        let wait = b.try_take(now).expect("empty");
        assert!((wait.as_secs_f64() - 0.2).abs() < 1e-6, "{wait:?}");
        assert_eq!(b.try_take(now + Duration::from_millis(200)), None);
    }

    #[test]
    fn api_event_has_the_kubelet_source_and_counts() {
        let ev = Event {
            involved: InvolvedObject {
                kind: "Pod".into(),
                namespace: "ns".into(),
                name: "p".into(),
                uid: "u".into(),
                field_path: "spec.containers{app}".into(),
            },
            type_: EventType::Warning,
            reason: "BackOff".into(),
            message: "Back-off restarting failed container".into(),
            timestamp: Timestamp::UNIX_EPOCH,
            annotations: BTreeMap::from([("a".to_string(), "b".to_string())]),
        };
        let e = api_event(
            &ev,
            "node-1",
            "p.1".into(),
            event_namespace(&ev),
            1,
            ev.timestamp,
        );
        assert_eq!(
            e.source.as_ref().and_then(|s| s.component.as_deref()),
            Some("kubelet")
        );
        assert_eq!(
            e.source.as_ref().and_then(|s| s.host.as_deref()),
            Some("node-1")
        );
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(e.count, Some(1));
        assert_eq!(
            e.involved_object.field_path.as_deref(),
            Some("spec.containers{app}")
        );
        assert_eq!(
            e.metadata.annotations.as_ref().map(|a| a["a"].as_str()),
            Some("b")
        );
        let node_ev = Event {
            involved: InvolvedObject::node("node-1"),
            ..ev
        };
        assert_eq!(event_namespace(&node_ev), "default");
    }
}
