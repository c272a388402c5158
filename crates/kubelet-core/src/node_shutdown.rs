//! Graceful node shutdown (`shutdownGracePeriod`, `shutdownGracePeriodCriticalPods`,
//! `shutdownGracePeriodByPodPriority`): [`NodeShutdown`], an agent plugin the host asks to
//! shut the node down.
//!
//! The kubelet learns of a shutdown from systemd-logind; a library never watches the system, so
//! here the host calls [`NodeShutdown::shut_down`] (`minimal_kubelet` does on `SIGTERM` when a
//! grace period is configured), then stops the agent. From that call on:
//!
//! - new pods are rejected (`NodeShutdown`: "Pod was rejected as the node is shutting down.");
//! - the node reports `Ready=False` with "node is shutting down" in the message (through
//!   [`AgentPlugin::ready_errors`]);
//! - pods are terminated by priority band, lowest first, each band's pods in parallel with a
//!   grace period of `min(terminationGracePeriodSeconds, band period)`, a band ending when its
//!   pods are gone or its period elapsed. Without `shutdownGracePeriodByPodPriority` there are
//!   two bands: ordinary pods get `shutdownGracePeriod − shutdownGracePeriodCriticalPods`,
//!   critical pods (priority ≥ 2000000000) `shutdownGracePeriodCriticalPods`. A terminated pod
//!   ends `Failed`, reason `Terminated`, message "Pod was terminated in response to imminent
//!   node shutdown.", with the `DisruptionTarget` condition.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use kubelet_api::{
    AdmitResult, AgentHandle, AgentPlugin, KillPodOptions, NodeConditionReader, NotRunning,
    PluginContext, PodAdmitHandler,
};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use crate::configuration::KubeletConfiguration;

/// The admission reason while the node shuts down.
pub const REJECT_REASON: &str = "NodeShutdown";
/// The admission message while the node shuts down.
pub const REJECT_MESSAGE: &str = "Pod was rejected as the node is shutting down.";
/// The reason of a pod terminated by the shutdown.
pub const POD_REASON: &str = "Terminated";
/// The message of a pod terminated by the shutdown.
pub const POD_MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";
/// What the node's `Ready` condition says while it shuts down.
pub const NOT_READY_MESSAGE: &str = "node is shutting down";

/// One priority band: pods with a priority from `priority` up (to the next band) get `period`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Band {
    /// The band's lowest priority.
    pub priority: i32,
    /// The time its pods get.
    pub period: Duration,
}

/// The bands of a configuration, lowest priority first; empty when graceful node shutdown is
/// off (every period zero).
pub fn bands(c: &KubeletConfiguration) -> Vec<Band> {
    if !c.shutdown_grace_period_by_pod_priority.is_empty() {
        let mut b: Vec<Band> = c
            .shutdown_grace_period_by_pod_priority
            .iter()
            .map(|e| Band {
                priority: e.priority,
                period: Duration::from_secs(e.shutdown_grace_period_seconds.max(0).unsigned_abs()),
            })
            .collect();
        kubelet_api::sort::by_key(&mut b, |b| b.priority);
        return b;
    }
    let total = c.shutdown_grace_period.as_duration();
    if total.is_zero() {
        return Vec::new();
    }
    let critical = c
        .shutdown_grace_period_critical_pods
        .as_duration()
        .min(total);
    vec![
        Band {
            priority: i32::MIN,
            period: total - critical,
        },
        Band {
            priority: kubelet_api::pod::SYSTEM_CRITICAL_PRIORITY,
            period: critical,
        },
    ]
}

/// The configuration's shutdown settings are consistent (the kubelet's validation): the
/// critical part not above the total, the priority list not mixed with them, no negative
/// period.
pub fn validate(c: &KubeletConfiguration) -> Result<(), String> {
    let total = c.shutdown_grace_period.as_duration();
    let critical = c.shutdown_grace_period_critical_pods.as_duration();
    if critical > total {
        return Err(format!(
            "shutdownGracePeriodCriticalPods ({critical:?}) must be <= shutdownGracePeriod ({total:?})"
        ));
    }
    if !c.shutdown_grace_period_by_pod_priority.is_empty() && !total.is_zero() {
        return Err(
            "shutdownGracePeriodByPodPriority and shutdownGracePeriod are mutually exclusive"
                .into(),
        );
    }
    if let Some(e) = c
        .shutdown_grace_period_by_pod_priority
        .iter()
        .find(|e| e.shutdown_grace_period_seconds < 0)
    {
        return Err(format!(
            "shutdownGracePeriodByPodPriority: priority {}: shutdownGracePeriodSeconds must not be negative",
            e.priority
        ));
    }
    Ok(())
}

/// The band index of a pod of priority `p` (the highest band whose priority is not above it;
/// the lowest band for pods below every band).
fn band_of(bands: &[Band], p: i32) -> usize {
    bands.iter().rposition(|b| b.priority <= p).unwrap_or(0)
}

/// What a shutdown did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// The pods terminated (`namespace/name`), in the order their bands ran.
    pub terminated: Vec<String>,
    /// Bands whose period elapsed with pods still terminating.
    pub bands_timed_out: usize,
}

/// Graceful node shutdown (see the [module docs](self)). Cheap to clone.
#[derive(Clone)]
pub struct NodeShutdown {
    inner: Arc<Inner>,
}

struct Inner {
    bands: Vec<Band>,
    shutting_down: AtomicBool,
    handle: Mutex<Option<(Arc<dyn AgentHandle>, NodeConditionReader)>>,
}

impl std::fmt::Debug for NodeShutdown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeShutdown")
            .field("bands", &self.inner.bands)
            .field("shutting_down", &self.is_shutting_down())
            .finish()
    }
}

impl NodeShutdown {
    /// A shutdown with `bands` (lowest priority first).
    pub fn new(bands: Vec<Band>) -> Self {
        Self {
            inner: Arc::new(Inner {
                bands,
                shutting_down: AtomicBool::new(false),
                handle: Mutex::new(None),
            }),
        }
    }

    /// The configuration's shutdown, `None` when graceful node shutdown is off.
    pub fn from_configuration(c: &KubeletConfiguration) -> Option<Self> {
        let bands = bands(c);
        (!bands.is_empty()).then(|| Self::new(bands))
    }

    /// Whether [`shut_down`](Self::shut_down) was called.
    pub fn is_shutting_down(&self) -> bool {
        self.inner.shutting_down.load(Ordering::SeqCst)
    }

    /// The longest the shutdown takes: the sum of the bands' periods.
    pub fn total_period(&self) -> Duration {
        self.inner.bands.iter().map(|b| b.period).sum()
    }

    /// Shut the node down: reject new pods, report NotReady, and terminate the running pods
    /// band by band. Returns when every band is done (at most [`total_period`](Self::total_period));
    /// [`NotRunning`] when the agent has not started this plugin (or stopped).
    pub async fn shut_down(&self) -> Result<ShutdownReport, NotRunning> {
        let (handle, status) = self.inner.handle.lock().clone().ok_or(NotRunning)?;
        self.inner.shutting_down.store(true, Ordering::SeqCst);
        // The node status says so now, not at its next period.
        status.notify_changed();
        tracing::info!(bands = self.inner.bands.len(), total = ?self.total_period(), "shutdown manager: node shutting down, terminating pods");
        let bands = &self.inner.bands;
        let mut groups: Vec<Vec<Arc<Pod>>> = vec![Vec::new(); bands.len()];
        for p in handle.statuses().list() {
            let terminal = matches!(
                p.status.phase.as_deref(),
                Some("Succeeded") | Some("Failed")
            );
            if terminal {
                continue;
            }
            groups[band_of(bands, kubelet_api::pod::priority(&p.pod))].push(p.pod.clone());
        }
        let mut report = ShutdownReport::default();
        for (band, pods) in bands.iter().zip(groups) {
            if pods.is_empty() {
                continue;
            }
            let grace = i64::try_from(band.period.as_secs()).unwrap_or(i64::MAX);
            let kills = pods.iter().map(|pod| {
                let handle = handle.clone();
                let uid = kubelet_api::pod::uid(pod).to_string();
                let own = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
                    .unwrap_or(30);
                let options = KillPodOptions {
                    grace_period_override: Some(own.min(grace)),
                    evict: true,
                    reason: POD_REASON.into(),
                    message: POD_MESSAGE.into(),
                    condition: Some(kubelet_api::pod::disruption_condition(POD_MESSAGE)),
                };
                async move { handle.kill_pod(&uid, options).await }
            });
            tracing::info!(priority = band.priority, period = ?band.period, pods = pods.len(), "shutdown manager: terminating a priority band");
            let uids: Vec<String> = pods
                .iter()
                .map(|p| kubelet_api::pod::uid(p).to_string())
                .collect();
            let statuses = handle.statuses();
            let all = async {
                futures::future::join_all(kills).await;
                // The terminal statuses are generated (and so delivered before the agent
                // stops) once every pod of the band shows a terminal phase.
                while !uids.iter().all(|uid| {
                    statuses.get(uid).is_none_or(|p| {
                        matches!(
                            p.status.phase.as_deref(),
                            Some("Succeeded") | Some("Failed")
                        )
                    })
                }) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            };
            if tokio::time::timeout(band.period, all).await.is_err() {
                report.bands_timed_out += 1;
                tracing::warn!(priority = band.priority, period = ?band.period, "shutdown manager: the band's period elapsed with pods still terminating");
            }
            report
                .terminated
                .extend(pods.iter().map(|p| kubelet_api::pod::full_name(p)));
        }
        tracing::info!(
            terminated = report.terminated.len(),
            "shutdown manager: done terminating pods"
        );
        Ok(report)
    }
}

impl PodAdmitHandler for NodeShutdown {
    fn admit(&self, _pod: &Pod, _active: &[Arc<Pod>]) -> AdmitResult {
        if self.is_shutting_down() {
            AdmitResult::reject(REJECT_REASON, REJECT_MESSAGE)
        } else {
            AdmitResult::admit()
        }
    }
}

#[async_trait]
impl AgentPlugin for NodeShutdown {
    fn name(&self) -> &str {
        "node-shutdown"
    }

    fn admit_handlers(&self) -> Vec<Arc<dyn PodAdmitHandler>> {
        vec![Arc::new(self.clone())]
    }

    fn ready_errors(&self) -> Vec<String> {
        if self.is_shutting_down() {
            vec![NOT_READY_MESSAGE.to_string()]
        } else {
            Vec::new()
        }
    }

    async fn run(
        &self,
        ctx: PluginContext,
        shutdown: CancellationToken,
    ) -> kubelet_api::Result<()> {
        *self.inner.handle.lock() = Some((ctx.handle(), ctx.node_conditions()));
        shutdown.cancelled().await;
        *self.inner.handle.lock() = None;
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::configuration::ShutdownGracePeriodByPodPriority;

    #[test]
    fn two_bands_without_the_priority_list_and_none_when_off() {
        let mut c = KubeletConfiguration::default();
        assert!(bands(&c).is_empty());
        c.shutdown_grace_period = Duration::from_secs(30).into();
        c.shutdown_grace_period_critical_pods = Duration::from_secs(10).into();
        let b = bands(&c);
        assert_eq!(b[0].period, Duration::from_secs(20));
        assert_eq!(
            b[1],
            Band {
                priority: 2_000_000_000,
                period: Duration::from_secs(10)
            }
        );
        assert_eq!(band_of(&b, 0), 0);
        assert_eq!(band_of(&b, -5), 0);
        assert_eq!(band_of(&b, 2_000_001_000), 1);
        validate(&c).unwrap();
        c.shutdown_grace_period_critical_pods = Duration::from_secs(40).into();
        assert!(validate(&c).unwrap_err().contains("must be <="));
    }

    #[test]
    fn the_priority_list_makes_sorted_bands() {
        let c = KubeletConfiguration {
            shutdown_grace_period_by_pod_priority: vec![
                ShutdownGracePeriodByPodPriority::new(100000, 5),
                ShutdownGracePeriodByPodPriority::new(0, 3),
            ],
            ..Default::default()
        };
        let b = bands(&c);
        assert_eq!(
            b.iter().map(|b| b.priority).collect::<Vec<_>>(),
            [0, 100000]
        );
        assert_eq!(band_of(&b, 99999), 0);
        assert_eq!(band_of(&b, 100000), 1);
        validate(&c).unwrap();
        let both = KubeletConfiguration {
            shutdown_grace_period: Duration::from_secs(3).into(),
            ..c
        };
        assert!(validate(&both).unwrap_err().contains("mutually exclusive"));
    }

    #[test]
    fn new_pods_are_rejected_only_while_shutting_down() {
        let s = NodeShutdown::new(vec![Band {
            priority: 0,
            period: Duration::from_secs(1),
        }]);
        let pod = Pod::default();
        assert!(s.admit(&pod, &[]).admit);
        assert!(s.ready_errors().is_empty());
        s.inner.shutting_down.store(true, Ordering::SeqCst);
        let r = s.admit(&pod, &[]);
        assert_eq!(
            (r.reason.as_str(), r.message.as_str()),
            (REJECT_REASON, REJECT_MESSAGE)
        );
        assert_eq!(s.ready_errors(), [NOT_READY_MESSAGE]);
    }
}
