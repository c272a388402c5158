//! Pull admission: `serializeImagePulls` / `maxParallelImagePulls` (how many pulls run at once)
//! and `registryPullQPS` / `registryBurst` (how many may start per second), as the kubelet's
//! image puller and throttled image service.

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// The error of a pull refused by the rate limit (the kubelet's message).
pub(crate) const PULL_QPS_EXCEEDED: &str = "pull QPS exceeded";

/// Settings of the pull gate.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct PullLimits {
    /// `serializeImagePulls` (true): one pull at a time.
    pub serialize: bool,
    /// `maxParallelImagePulls`: the bound when pulls are not serialized; `None`: unbounded.
    pub max_parallel: Option<u32>,
    /// `registryPullQPS` (5): pulls started per second; 0 for no limit.
    pub qps: f64,
    /// `registryBurst` (10): pulls that may start at once above the rate.
    pub burst: u32,
}

impl Default for PullLimits {
    fn default() -> Self {
        Self {
            serialize: true,
            max_parallel: None,
            qps: 5.0,
            burst: 10,
        }
    }
}

/// A token bucket: `burst` tokens, refilled at `qps` per second (client-go's `TryAccept`).
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

/// Admits pulls: a token per pull (refused at once when none is left, as the kubelet does),
/// then a slot among the parallel ones (waited for).
#[derive(Debug)]
pub(crate) struct PullGate {
    limits: PullLimits,
    bucket: Mutex<Bucket>,
    slots: Option<Arc<Semaphore>>,
}

impl PullGate {
    pub(crate) fn new(limits: PullLimits) -> Self {
        let slots = if limits.serialize {
            Some(1)
        } else {
            limits.max_parallel.filter(|n| *n > 0)
        };
        Self {
            limits,
            bucket: Mutex::new(Bucket {
                tokens: f64::from(limits.burst.max(1)),
                last: Instant::now(),
            }),
            slots: slots.map(|n| Arc::new(Semaphore::new(n as usize))),
        }
    }

    /// Take a token; false when the rate is exceeded.
    pub(crate) fn try_accept(&self) -> bool {
        if self.limits.qps <= 0.0 {
            return true;
        }
        let mut b = self.bucket.lock();
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(b.last);
        b.last = now;
        let cap = f64::from(self.limits.burst.max(1));
        b.tokens = (b.tokens + elapsed.as_secs_f64() * self.limits.qps).min(cap);
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Wait for a pull slot; `None` when pulls are unbounded.
    pub(crate) async fn slot(&self) -> Option<OwnedSemaphorePermit> {
        match &self.slots {
            // The semaphore is never closed.
            Some(s) => s.clone().acquire_owned().await.ok(),
            None => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn the_bucket_admits_a_burst_then_the_rate() {
        let gate = PullGate::new(PullLimits {
            qps: 2.0,
            burst: 3,
            ..PullLimits::default()
        });
        assert_eq!((0..5).filter(|_| gate.try_accept()).count(), 3);
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(gate.try_accept());
        assert!(!gate.try_accept());
        let free = PullGate::new(PullLimits {
            qps: 0.0,
            ..PullLimits::default()
        });
        assert!((0..100).all(|_| free.try_accept()));
    }

    #[tokio::test(start_paused = true)]
    async fn serialized_pulls_take_turns_and_parallel_ones_are_bounded() {
        let serial = PullGate::new(PullLimits::default());
        let first = serial.slot().await;
        assert!(first.is_some());
        assert!(
            tokio::time::timeout(Duration::from_secs(1), serial.slot())
                .await
                .is_err()
        );
        drop(first);
        assert!(serial.slot().await.is_some());
        let parallel = PullGate::new(PullLimits {
            serialize: false,
            max_parallel: Some(2),
            ..PullLimits::default()
        });
        let (a, b) = (parallel.slot().await, parallel.slot().await);
        assert!(a.is_some() && b.is_some());
        assert!(
            tokio::time::timeout(Duration::from_secs(1), parallel.slot())
                .await
                .is_err()
        );
        let unbounded = PullGate::new(PullLimits {
            serialize: false,
            ..PullLimits::default()
        });
        assert!(unbounded.slot().await.is_none());
    }
}
