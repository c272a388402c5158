//! `kubelet-pleg`: the pod lifecycle event generator (PLEG) of the kubelet SDK.
//!
//! A PLEG watches a [`ContainerRuntime`](kubelet_core::ContainerRuntime), keeps the pod status
//! cache ([`kubelet_core::PodCache`]) current, and tells the engine which pods changed through
//! [`PodLifecycleEvent`](kubelet_core::PodLifecycleEvent)s (`ContainerStarted`, `ContainerDied`,
//! `ContainerRemoved`). Start with [`GenericPleg`]: the kubelet's relist PLEG, which lists every
//! sandbox and container once per second, diffs the result against the previous list, inspects
//! the pods that changed, and publishes their statuses. A dead container is therefore noticed
//! within about one relist period rather than at the next one-minute resync.
//!
//! It is usable without the engine: take its event receiver, run it, and read the cache.
//!
//! ```no_run
//! use std::sync::Arc;
//! use kubelet_core::{ContainerRuntime, PodLifecycleEventGenerator};
//! use kubelet_pleg::{GenericPleg, GenericPlegConfig};
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn example(runtime: Arc<dyn ContainerRuntime>) {
//! let pleg = Arc::new(GenericPleg::new(runtime, GenericPlegConfig::default()));
//! let mut events = pleg.take_events().expect("first call returns the receiver");
//! let cache = pleg.cache();
//! let shutdown = CancellationToken::new();
//! tokio::spawn({
//!     let pleg = pleg.clone();
//!     let shutdown = shutdown.clone();
//!     async move { pleg.run(shutdown).await }
//! });
//! while let Some(event) = events.recv().await {
//!     let status = cache.get(&event.pod_uid);
//!     println!("{:?} {} {}: {:?}", event.kind, event.pod_uid, event.container_id, status);
//! }
//! # }
//! ```
//!
//! Semantics follow the upstream kubelet's `pkg/kubelet/pleg/generic.go`; where this crate
//! differs (concurrent, time-bounded inspections of changed pods) the items say so.

#![forbid(unsafe_code)]

mod diff;
mod error;
mod generic;

pub use error::PlegError;
pub use generic::{
    DEFAULT_INSPECT_TIMEOUT, DEFAULT_MAX_CONCURRENT_INSPECTIONS, GENERIC_PLEG_RELIST_PERIOD,
    GENERIC_PLEG_RELIST_THRESHOLD, GenericPleg, GenericPlegConfig, RelistReport,
};
pub use kubelet_core::pleg::PLEG_CHANNEL_CAPACITY;

/// Format a duration the way Go's `time.Duration.String` does (`3m0s`, `1.5s`, `250ms`), so
/// health messages read like the kubelet's.
pub fn format_go_duration(d: std::time::Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_string();
    }
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    if nanos < 1_000_000 {
        return format!("{}µs", trim_fraction(nanos, 1_000));
    }
    if nanos < 1_000_000_000 {
        return format!("{}ms", trim_fraction(nanos, 1_000_000));
    }
    let total_secs = d.as_secs();
    let hours = total_secs / 3600;
    let minutes = (total_secs % 3600) / 60;
    let secs_nanos = u128::from(total_secs % 60) * 1_000_000_000 + u128::from(d.subsec_nanos());
    let secs = trim_fraction(secs_nanos, 1_000_000_000);
    let mut out = String::new();
    if hours > 0 {
        out.push_str(&format!("{hours}h"));
    }
    if hours > 0 || minutes > 0 {
        out.push_str(&format!("{minutes}m"));
    }
    out.push_str(&format!("{secs}s"));
    out
}

/// `value / unit` with the fraction written out and trailing zeros trimmed.
fn trim_fraction(value: u128, unit: u128) -> String {
    let whole = value / unit;
    let frac = value % unit;
    if frac == 0 {
        return whole.to_string();
    }
    let width = unit.ilog10() as usize;
    let frac = format!("{frac:0width$}");
    format!("{whole}.{}", frac.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::format_go_duration;
    use std::time::Duration;

    #[test]
    fn durations_are_formatted_like_go() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(15), "15ns"),
            (Duration::from_micros(1500), "1.5ms"),
            (Duration::from_millis(250), "250ms"),
            (Duration::from_secs(1), "1s"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_secs(180), "3m0s"),
            (Duration::from_secs(181), "3m1s"),
            (Duration::from_secs(3723), "1h2m3s"),
            (Duration::from_secs(3600), "1h0m0s"),
        ];
        for (d, want) in cases {
            assert_eq!(format_go_duration(d), want, "{d:?}");
        }
    }
}
