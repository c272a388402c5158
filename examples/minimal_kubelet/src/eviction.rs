//! The node-pressure eviction flags (`kubelet-eviction`), named and parsed as the kubelet's.

use anyhow::Context;
use kubelet::KubeletConfiguration;
use kubelet::eviction::{parse_map_flag, parse_threshold_flag};

/// The kubelet's eviction flags.
#[derive(Debug, clap::Args)]
pub(crate) struct EvictionFlags {
    /// Hard eviction thresholds, e.g. `memory.available<100Mi,nodefs.available<10%`.
    /// Unset: the kubelet's defaults.
    #[arg(long = "eviction-hard")]
    pub(crate) eviction_hard: Option<String>,
    /// Soft eviction thresholds (each needs a grace period).
    #[arg(long = "eviction-soft", default_value = "")]
    pub(crate) eviction_soft: String,
    /// Grace periods of soft thresholds, e.g. `memory.available=1m30s`.
    #[arg(long = "eviction-soft-grace-period", default_value = "")]
    pub(crate) eviction_soft_grace_period: String,
    /// Minimum reclaim per signal, e.g. `memory.available=0Mi,nodefs.available=500Mi`.
    #[arg(long = "eviction-minimum-reclaim", default_value = "")]
    pub(crate) eviction_minimum_reclaim: String,
    /// How long a pressure condition stays after it was last observed (Go duration).
    #[arg(long = "eviction-pressure-transition-period", default_value = "5m")]
    pub(crate) eviction_pressure_transition_period: String,
    /// Upper bound of the grace period of soft evictions, seconds.
    #[arg(long = "eviction-max-pod-grace-period", default_value_t = 0)]
    pub(crate) eviction_max_pod_grace_period: i64,
    /// Let eviction take static pods (all of this agent's pods come from files): priority then
    /// decides. The kubelet never evicts static pods.
    #[arg(long = "evict-static-pods", default_value_t = false)]
    pub(crate) evict_static_pods: bool,
}

/// The flags that are fields of the kubelet's configuration.
pub(crate) fn configure(
    flags: &EvictionFlags,
    given: &crate::Given<'_>,
    c: &mut KubeletConfiguration,
) -> anyhow::Result<()> {
    if let Some(f) = flags.eviction_hard.as_deref() {
        c.eviction_hard = Some(parse_threshold_flag("--eviction-hard", f)?);
    }
    if given.has("eviction_soft") {
        c.eviction_soft = parse_threshold_flag("--eviction-soft", &flags.eviction_soft)?;
    }
    if given.has("eviction_soft_grace_period") {
        c.eviction_soft_grace_period = parse_map_flag(
            "--eviction-soft-grace-period",
            &flags.eviction_soft_grace_period,
        )?;
    }
    if given.has("eviction_minimum_reclaim") {
        c.eviction_minimum_reclaim = parse_map_flag(
            "--eviction-minimum-reclaim",
            &flags.eviction_minimum_reclaim,
        )?;
    }
    if given.has("eviction_pressure_transition_period") {
        let (negative, transition) =
            kubelet::core::duration::parse_go(&flags.eviction_pressure_transition_period)
                .context("--eviction-pressure-transition-period")?;
        if negative {
            anyhow::bail!("--eviction-pressure-transition-period must not be negative");
        }
        c.eviction_pressure_transition_period = transition.into();
    }
    if given.has("eviction_max_pod_grace_period") {
        c.eviction_max_pod_grace_period = i32::try_from(flags.eviction_max_pod_grace_period)
            .context("--eviction-max-pod-grace-period")?;
    }
    Ok(())
}
