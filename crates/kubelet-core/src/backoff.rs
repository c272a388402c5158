//! Per-key exponential backoff, as the kubelet's `flowcontrol.Backoff` (no jitter): used for
//! CrashLoopBackOff (10 s doubling to 300 s) and image pulls.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

/// The kubelet's `containerBackOffPeriod`.
pub(crate) const CONTAINER_BACKOFF_INITIAL: Duration = Duration::from_secs(10);
/// The kubelet's `MaxContainerBackOff`.
pub(crate) const CONTAINER_BACKOFF_MAX: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, Copy)]
struct Entry {
    backoff: Duration,
    last_update: Instant,
}

/// Exponential backoff per key. An entry resets when more than twice the maximum passed between
/// its last update and a new event, so a container that stays up for 10 minutes starts again at
/// the initial delay.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    entries: HashMap<String, Entry>,
}

impl Backoff {
    /// Backoff starting at `initial`, doubling up to `max`.
    pub(crate) fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            entries: HashMap::new(),
        }
    }

    /// The kubelet's CrashLoopBackOff schedule: 10 s doubling to 300 s.
    pub(crate) fn crash_loop() -> Self {
        Self::new(CONTAINER_BACKOFF_INITIAL, CONTAINER_BACKOFF_MAX)
    }

    fn expired(&self, event_time: Instant, last_update: Instant) -> bool {
        event_time.saturating_duration_since(last_update) > self.max * 2
    }

    /// Current delay of `key`, zero if none.
    pub(crate) fn get(&self, key: &str) -> Duration {
        self.entries.get(key).map(|e| e.backoff).unwrap_or_default()
    }

    /// Whether `key` is still backing off from an event at `event_time`; returns the remaining
    /// wait if so.
    pub(crate) fn remaining_since(
        &self,
        key: &str,
        event_time: Instant,
        now: Instant,
    ) -> Option<Duration> {
        let e = self.entries.get(key)?;
        if self.expired(event_time, e.last_update) {
            return None;
        }
        let since = now.saturating_duration_since(event_time);
        (since < e.backoff).then(|| e.backoff - since)
    }

    /// Record an attempt after an event at `event_time`: start at the initial delay, or double.
    pub(crate) fn next(&mut self, key: &str, event_time: Instant, now: Instant) {
        let backoff = match self.entries.get(key) {
            Some(e) if !self.expired(event_time, e.last_update) => (e.backoff * 2).min(self.max),
            _ => self.initial,
        };
        self.entries.insert(
            key.to_string(),
            Entry {
                backoff,
                last_update: now,
            },
        );
    }

    /// Whether `key` is still backing off from its last [`next`](Self::next) (the kubelet's
    /// `IsInBackOffSinceUpdate`, used for ImagePullBackOff); returns the remaining wait if so.
    pub(crate) fn remaining_since_update(&self, key: &str, now: Instant) -> Option<Duration> {
        let e = self.entries.get(key)?;
        if self.expired(now, e.last_update) {
            return None;
        }
        let since = now.saturating_duration_since(e.last_update);
        (since < e.backoff).then(|| e.backoff - since)
    }

    /// Drop every entry whose key starts with `prefix` (a pod that went away).
    pub(crate) fn remove_prefix(&mut self, prefix: &str) {
        self.entries.retain(|k, _| !k.starts_with(prefix));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn image_pull_backoff_counts_from_the_last_failure_and_doubles() {
        let mut b = Backoff::crash_loop();
        let t0 = Instant::now();
        assert_eq!(b.remaining_since_update("img", t0), None);
        b.next("img", t0, t0);
        assert_eq!(
            b.remaining_since_update("img", t0 + Duration::from_secs(4)),
            Some(Duration::from_secs(6))
        );
        assert_eq!(
            b.remaining_since_update("img", t0 + Duration::from_secs(10)),
            None
        );
        let t1 = t0 + Duration::from_secs(11);
        b.next("img", t1, t1);
        assert_eq!(b.get("img"), Duration::from_secs(20));
        assert_eq!(
            b.remaining_since_update("img", t1 + Duration::from_secs(15)),
            Some(Duration::from_secs(5))
        );
        // Idle for more than twice the maximum: forgotten.
        assert_eq!(
            b.remaining_since_update("img", t1 + Duration::from_secs(601)),
            None
        );
    }

    #[tokio::test(start_paused = true)]
    async fn crash_loop_doubles_to_the_cap_and_resets_after_ten_minutes() {
        let mut b = Backoff::crash_loop();
        let mut delays = Vec::new();
        for _ in 0..7 {
            let crash = Instant::now();
            if let Some(wait) = b.remaining_since("k", crash, Instant::now()) {
                tokio::time::advance(wait).await;
            }
            b.next("k", crash, Instant::now());
            delays.push(b.get("k").as_secs());
        }
        assert_eq!(delays, vec![10, 20, 40, 80, 160, 300, 300]);
        // Running for more than 10 minutes before the next crash resets the schedule.
        tokio::time::advance(Duration::from_secs(601)).await;
        let crash = Instant::now();
        assert_eq!(b.remaining_since("k", crash, Instant::now()), None);
        b.next("k", crash, Instant::now());
        assert_eq!(b.get("k"), Duration::from_secs(10));
    }
}
