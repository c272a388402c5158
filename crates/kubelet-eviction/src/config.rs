//! Eviction configuration as the kubelet reads it: `evictionHard`, `evictionSoft`,
//! `evictionSoftGracePeriod`, `evictionMinimumReclaim`, `evictionPressureTransitionPeriod`,
//! `evictionMaxPodGracePeriod` (`eviction/helpers.go` `ParseThresholdConfig`).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::error::EvictionError;
use crate::signal::Signal;

/// The kubelet's default `evictionHard` on Linux.
pub const DEFAULT_EVICTION_HARD: [(&str, &str); 4] = [
    ("memory.available", "100Mi"),
    ("nodefs.available", "10%"),
    ("nodefs.inodesFree", "5%"),
    ("imagefs.available", "15%"),
];

/// `evictionPressureTransitionPeriod` default.
pub const DEFAULT_PRESSURE_TRANSITION_PERIOD: Duration = Duration::from_secs(300);
/// `evictionMonitoringPeriod`: the full synchronisation period.
pub const DEFAULT_MONITORING_INTERVAL: Duration = Duration::from_secs(10);
/// Period of the cheap memory poll that drives fast detection.
pub const DEFAULT_FAST_POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Period of that poll while memory is far from every threshold or the kernel watches the
/// crossing (cgroup v1 memory threshold eventfd).
pub const DEFAULT_RELAXED_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Grace period override for hard evictions (`immediateEvictionGracePeriodSeconds`).
pub const IMMEDIATE_EVICTION_GRACE_PERIOD_SECONDS: i64 = 1;

/// How a quantity was written, which decides how the kubelet prints it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantityFormat {
    /// Binary suffixes (`Ki`, `Mi`, …).
    BinarySi,
    /// Decimal suffixes or none (`k`, `M`, plain numbers).
    DecimalSi,
}

/// A threshold value: an absolute quantity or a fraction of capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ThresholdValue {
    /// An absolute quantity (bytes, inodes or PIDs).
    Quantity {
        /// The value.
        value: i64,
        /// How to print it.
        format: QuantityFormat,
    },
    /// A fraction of capacity in `(0, 1]` (`10%` is `0.1`).
    Percentage(f64),
}

impl ThresholdValue {
    /// The value as a quantity given the signal's capacity (`GetThresholdQuantity`).
    pub fn quantity(&self, capacity: i64) -> i64 {
        match *self {
            ThresholdValue::Quantity { value, .. } => value,
            ThresholdValue::Percentage(p) => (capacity as f64 * p) as i64,
        }
    }

    /// The value as the kubelet prints it in eviction messages, given the capacity.
    pub fn display(&self, capacity: i64) -> String {
        match *self {
            ThresholdValue::Quantity { value, format } => format_quantity(value, format),
            ThresholdValue::Percentage(_) => {
                format_quantity(self.quantity(capacity), QuantityFormat::BinarySi)
            }
        }
    }
}

/// A threshold: `signal < value`, hard when `grace_period` is zero.
#[derive(Debug, Clone, PartialEq)]
pub struct Threshold {
    /// The signal.
    pub signal: Signal,
    /// The value below which the threshold is met.
    pub value: ThresholdValue,
    /// How long the threshold must be met before it drives eviction; zero for hard thresholds.
    pub grace_period: Duration,
    /// Extra to reclaim beyond the threshold once met (`evictionMinimumReclaim`).
    pub min_reclaim: Option<ThresholdValue>,
}

impl Threshold {
    /// A hard threshold (no grace period).
    pub fn hard(signal: Signal, value: ThresholdValue) -> Self {
        Self {
            signal,
            value,
            grace_period: Duration::ZERO,
            min_reclaim: None,
        }
    }

    /// True for a hard threshold (`isHardEvictionThreshold`).
    pub fn is_hard(&self) -> bool {
        self.grace_period.is_zero()
    }

    /// Same signal, value and grace period (`compareThresholdValue` + signal + grace).
    pub fn same(&self, other: &Threshold) -> bool {
        self.signal == other.signal
            && self.value == other.value
            && self.grace_period == other.grace_period
    }
}

impl fmt::Display for Threshold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = match self.value {
            ThresholdValue::Quantity { value, format } => format_quantity(value, format),
            ThresholdValue::Percentage(p) => format!("{}%", (p * 100.0 * 1e6).round() / 1e6),
        };
        write!(f, "{}<{}", self.signal, v)?;
        if !self.is_hard() {
            write!(f, " (grace {:?})", self.grace_period)?;
        }
        Ok(())
    }
}

/// The raw settings as a `KubeletConfiguration` holds them (maps of strings), before parsing.
///
/// Build it from the YAML maps directly, or from kubelet-style flags with
/// [`parse_threshold_flag`] and [`parse_map_flag`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EvictionSettings {
    /// `evictionHard`; `None` means the kubelet's defaults ([`DEFAULT_EVICTION_HARD`]).
    pub hard: Option<BTreeMap<String, String>>,
    /// `mergeDefaultEvictionSettings`: keep the default hard thresholds the user did not set.
    pub merge_default_hard: bool,
    /// `evictionSoft`.
    pub soft: BTreeMap<String, String>,
    /// `evictionSoftGracePeriod` (Go durations such as `1m30s`).
    pub soft_grace_period: BTreeMap<String, String>,
    /// `evictionMinimumReclaim`.
    pub minimum_reclaim: BTreeMap<String, String>,
    /// `evictionPressureTransitionPeriod` (Go duration); default 5 m.
    pub pressure_transition_period: Option<String>,
    /// `evictionMaxPodGracePeriod` in seconds; default 0.
    pub max_pod_grace_period: Option<i64>,
}

/// Parsed eviction configuration.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct EvictionConfig {
    /// Hard and soft thresholds.
    pub thresholds: Vec<Threshold>,
    /// How long a pressure condition stays after its last observation (5 m).
    pub pressure_transition_period: Duration,
    /// Upper bound of the grace period of soft evictions, seconds (0).
    pub max_pod_grace_period_seconds: i64,
    /// Full synchronisation period (10 s), the safety net.
    pub monitoring_interval: Duration,
    /// Period of the cheap memory poll (100 ms); `None` disables fast detection.
    pub fast_poll_interval: Option<Duration>,
    /// Period of the cheap memory poll (1 s) while it is not needed every
    /// [`fast_poll_interval`](Self::fast_poll_interval): when available memory is far from
    /// every memory threshold (above it by more than the threshold and by more than a tenth of
    /// capacity), or when the kernel signals the crossing itself (the cgroup v1 memory
    /// threshold eventfd is armed). An idle node then wakes once a second, not ten times.
    /// When the eventfd is armed, `memory.available` is the only memory signal with a
    /// threshold and memory is far from it, the check does not poll until the next full round.
    pub relaxed_poll_interval: Duration,
    /// Use kernel notifications (cgroup v1 memory threshold eventfd, PSI trigger, inotify on
    /// cgroup v2 `memory.events`) to wake the fast check early (`true`).
    pub kernel_notifications: bool,
    /// `localStorageCapacityIsolation`: evict pods over their emptyDir `sizeLimit` or
    /// ephemeral-storage limits (`true`).
    pub local_storage_capacity_isolation: bool,
    /// Policy: static and mirror pods are critical and never evicted (the kubelet's rule, `true`).
    /// A standalone agent whose pods all come from files sets it to `false` so that priority
    /// decides.
    pub static_pods_are_critical: bool,
}

impl Default for EvictionConfig {
    fn default() -> Self {
        Self {
            thresholds: default_hard_thresholds(),
            pressure_transition_period: DEFAULT_PRESSURE_TRANSITION_PERIOD,
            max_pod_grace_period_seconds: 0,
            monitoring_interval: DEFAULT_MONITORING_INTERVAL,
            fast_poll_interval: Some(DEFAULT_FAST_POLL_INTERVAL),
            relaxed_poll_interval: DEFAULT_RELAXED_POLL_INTERVAL,
            kernel_notifications: true,
            local_storage_capacity_isolation: true,
            static_pods_are_critical: true,
        }
    }
}

fn default_hard_thresholds() -> Vec<Threshold> {
    let map = DEFAULT_EVICTION_HARD
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    parse_statements("evictionHard", &map).unwrap_or_default()
}

impl EvictionConfig {
    /// Parse the kubelet's settings (`ParseThresholdConfig`). Errors name the setting and entry.
    pub fn from_settings(s: &EvictionSettings) -> Result<Self, EvictionError> {
        let hard_map: BTreeMap<String, String> = match &s.hard {
            None => DEFAULT_EVICTION_HARD
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            Some(user) if s.merge_default_hard => {
                let mut m: BTreeMap<String, String> = DEFAULT_EVICTION_HARD
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
                m.extend(user.iter().map(|(k, v)| (k.clone(), v.clone())));
                m
            }
            Some(user) => user.clone(),
        };
        let mut thresholds = parse_statements("evictionHard", &hard_map)?;
        let mut soft = parse_statements("evictionSoft", &s.soft)?;
        let graces = parse_grace_periods(&s.soft_grace_period)?;
        let reclaims = parse_min_reclaims(&s.minimum_reclaim)?;
        for t in &mut soft {
            let Some(g) = graces.get(&t.signal) else {
                return Err(EvictionError::ParseSetting {
                    setting: "evictionSoft",
                    entry: format!("{}<{}", t.signal, raw_value(&s.soft, t.signal)),
                    reason: format!(
                        "grace period must be specified for the soft eviction threshold {}",
                        t.signal
                    ),
                });
            };
            t.grace_period = *g;
        }
        thresholds.extend(soft);
        for t in &mut thresholds {
            if let Some(r) = reclaims.get(&t.signal) {
                t.min_reclaim = Some(*r);
            }
        }
        let pressure_transition_period = match &s.pressure_transition_period {
            None => DEFAULT_PRESSURE_TRANSITION_PERIOD,
            Some(v) => match parse_go_duration(v) {
                Ok((false, d)) => d,
                Ok((true, _)) => {
                    return Err(EvictionError::ParseSetting {
                        setting: "evictionPressureTransitionPeriod",
                        entry: v.clone(),
                        reason: "must not be negative".into(),
                    });
                }
                Err(e) => {
                    return Err(EvictionError::ParseSetting {
                        setting: "evictionPressureTransitionPeriod",
                        entry: v.clone(),
                        reason: e.to_string(),
                    });
                }
            },
        };
        let max_pod_grace_period_seconds = match s.max_pod_grace_period {
            None => 0,
            Some(v) if v < 0 => {
                return Err(EvictionError::ParseSetting {
                    setting: "evictionMaxPodGracePeriod",
                    entry: v.to_string(),
                    reason: "must not be negative".into(),
                });
            }
            Some(v) => v,
        };
        Ok(Self {
            thresholds,
            pressure_transition_period,
            max_pod_grace_period_seconds,
            ..Self::default()
        })
    }

    /// Add `allocatableMemory.available` hard thresholds copied from the hard `memory.available`
    /// ones (`addAllocatableThresholds`), as the kubelet does when `enforceNodeAllocatable`
    /// contains `pods`.
    pub fn add_allocatable_thresholds(&mut self) {
        let extra: Vec<Threshold> = self
            .thresholds
            .iter()
            .filter(|t| t.is_hard() && t.signal == Signal::MemoryAvailable)
            .map(|t| Threshold {
                signal: Signal::AllocatableMemoryAvailable,
                ..t.clone()
            })
            .filter(|t| !self.thresholds.iter().any(|o| o.same(t)))
            .collect();
        self.thresholds.extend(extra);
    }
}

fn raw_value(map: &BTreeMap<String, String>, signal: Signal) -> String {
    map.get(signal.as_str()).cloned().unwrap_or_default()
}

/// Parse `evictionHard` / `evictionSoft` statements (`parseThresholdStatements`). `0%` and
/// `100%` disable a signal.
pub fn parse_statements(
    setting: &'static str,
    map: &BTreeMap<String, String>,
) -> Result<Vec<Threshold>, EvictionError> {
    let mut out = Vec::new();
    for (key, val) in map {
        let err = |reason: String| EvictionError::ParseSetting {
            setting,
            entry: format!("{key}<{val}"),
            reason,
        };
        let signal: Signal = key
            .parse()
            .map_err(|e: crate::signal::UnknownSignal| err(e.to_string()))?;
        let val = val.trim();
        if let Some(pct) = val.strip_suffix('%') {
            if val == "0%" || val == "100%" {
                continue;
            }
            let p = parse_percentage(pct).map_err(&err)?;
            if p < 0.0 {
                return Err(err(format!(
                    "eviction percentage threshold {signal} must be >= 0%: {val}"
                )));
            }
            if p > 1.0 {
                return Err(err(format!(
                    "eviction percentage threshold {signal} must be <= 100%: {val}"
                )));
            }
            if p == 0.0 {
                continue;
            }
            out.push(Threshold::hard(signal, ThresholdValue::Percentage(p)));
            continue;
        }
        let (value, format) = parse_quantity(val).map_err(&err)?;
        if value <= 0 {
            return Err(err(format!(
                "eviction threshold {signal} must be positive: {val}"
            )));
        }
        out.push(Threshold::hard(
            signal,
            ThresholdValue::Quantity { value, format },
        ));
    }
    Ok(out)
}

fn parse_percentage(num: &str) -> Result<f64, String> {
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("invalid percentage {num}%"))?;
    if !v.is_finite() {
        return Err(format!("invalid percentage {num}%"));
    }
    Ok(v / 100.0)
}

/// Parse a quantity into an integer (rounded up) and remember its format.
fn parse_quantity(s: &str) -> Result<(i64, QuantityFormat), String> {
    let nanos = kubelet_api::quantity::parse_nanos(s)
        .ok_or_else(|| format!("quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {s:?}"))?;
    let v = if nanos >= 0 {
        (nanos + 999_999_999) / 1_000_000_000
    } else {
        -((-nanos) / 1_000_000_000)
    };
    let v = i64::try_from(v).map_err(|_| format!("quantity {s} is too large"))?;
    let binary = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
        .iter()
        .any(|suf| s.trim().ends_with(suf));
    let format = if binary {
        QuantityFormat::BinarySi
    } else {
        QuantityFormat::DecimalSi
    };
    Ok((v, format))
}

fn parse_grace_periods(
    map: &BTreeMap<String, String>,
) -> Result<BTreeMap<Signal, Duration>, EvictionError> {
    let mut out = BTreeMap::new();
    for (key, val) in map {
        let err = |reason: String| EvictionError::ParseSetting {
            setting: "evictionSoftGracePeriod",
            entry: format!("{key}={val}"),
            reason,
        };
        let signal: Signal = key
            .parse()
            .map_err(|e: crate::signal::UnknownSignal| err(e.to_string()))?;
        let (neg, d) = parse_go_duration(val).map_err(|e| err(e.to_string()))?;
        if neg && !d.is_zero() {
            return Err(err(format!(
                "invalid eviction grace period specified: {val}, must be a positive value"
            )));
        }
        out.insert(signal, d);
    }
    Ok(out)
}

fn parse_min_reclaims(
    map: &BTreeMap<String, String>,
) -> Result<BTreeMap<Signal, ThresholdValue>, EvictionError> {
    let mut out = BTreeMap::new();
    for (key, val) in map {
        let err = |reason: String| EvictionError::ParseSetting {
            setting: "evictionMinimumReclaim",
            entry: format!("{key}={val}"),
            reason,
        };
        let signal: Signal = key
            .parse()
            .map_err(|e: crate::signal::UnknownSignal| err(e.to_string()))?;
        let val = val.trim();
        if let Some(pct) = val.strip_suffix('%') {
            let p = parse_percentage(pct).map_err(&err)?;
            if p < 0.0 {
                return Err(err(format!(
                    "eviction percentage minimum reclaim {signal} must be positive: {val}"
                )));
            }
            if p > 1.0 {
                return Err(err(format!(
                    "eviction percentage minimum reclaim {signal} must be <= 100%: {val}"
                )));
            }
            out.insert(signal, ThresholdValue::Percentage(p));
            continue;
        }
        let (value, format) = parse_quantity(val).map_err(&err)?;
        if value < 0 {
            return Err(err(format!("negative reclaim defined for signal {signal}")));
        }
        out.insert(signal, ThresholdValue::Quantity { value, format });
    }
    Ok(out)
}

/// Parse a kubelet `--eviction-hard` / `--eviction-soft` flag: `sig<val,sig<val` (a
/// `LangleSeparatedMapStringString`). Errors name the entry.
pub fn parse_threshold_flag(
    setting: &'static str,
    flag: &str,
) -> Result<BTreeMap<String, String>, EvictionError> {
    split_flag(setting, flag, '<')
}

/// Parse a kubelet `key=value,key=value` flag (`--eviction-soft-grace-period`,
/// `--eviction-minimum-reclaim`). Errors name the entry.
pub fn parse_map_flag(
    setting: &'static str,
    flag: &str,
) -> Result<BTreeMap<String, String>, EvictionError> {
    split_flag(setting, flag, '=')
}

fn split_flag(
    setting: &'static str,
    flag: &str,
    sep: char,
) -> Result<BTreeMap<String, String>, EvictionError> {
    let mut out = BTreeMap::new();
    for entry in flag.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((k, v)) = entry.split_once(sep) else {
            return Err(EvictionError::ParseSetting {
                setting,
                entry: entry.to_string(),
                reason: format!("malformed pair, expect string{sep}string"),
            });
        };
        out.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(out)
}

use kubelet_core::duration::parse_go as parse_go_duration;

/// Print a quantity as Kubernetes' canonical form does (`resource.Quantity.String`).
pub fn format_quantity(value: i64, format: QuantityFormat) -> String {
    if value == 0 {
        return "0".into();
    }
    match format {
        QuantityFormat::BinarySi if value.unsigned_abs() >= 1024 => {
            let suffixes = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
            let mut v = value;
            let mut i = 0;
            while i < suffixes.len() - 1 && v % 1024 == 0 {
                v /= 1024;
                i += 1;
            }
            format!("{v}{}", suffixes[i])
        }
        _ => {
            let suffixes = ["", "k", "M", "G", "T", "P", "E"];
            let mut v = value;
            let mut i = 0;
            while i < suffixes.len() - 1 && v % 1000 == 0 {
                v /= 1000;
                i += 1;
            }
            format!("{v}{}", suffixes[i])
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn q(value: i64, format: QuantityFormat) -> ThresholdValue {
        ThresholdValue::Quantity { value, format }
    }

    #[test]
    fn defaults_are_the_kubelets_linux_hard_thresholds() {
        let c = EvictionConfig::from_settings(&EvictionSettings::default()).unwrap();
        assert_eq!(c, EvictionConfig::default());
        let mut got: Vec<String> = c.thresholds.iter().map(|t| t.to_string()).collect();
        got.sort();
        assert_eq!(
            got,
            vec![
                "imagefs.available<15%",
                "memory.available<100Mi",
                "nodefs.available<10%",
                "nodefs.inodesFree<5%"
            ]
        );
        assert_eq!(c.pressure_transition_period, Duration::from_secs(300));
        assert_eq!(c.max_pod_grace_period_seconds, 0);
        assert_eq!(c.monitoring_interval, Duration::from_secs(10));
        assert!(c.static_pods_are_critical);
    }

    #[test]
    fn statements_parse_as_the_kubelet_parses_them() {
        use QuantityFormat::*;
        type Want = Result<Option<ThresholdValue>, &'static str>;
        let table: Vec<(&str, &str, Want)> = vec![
            (
                "memory.available",
                "100Mi",
                Ok(Some(q(100 << 20, BinarySi))),
            ),
            (
                "memory.available",
                "1G",
                Ok(Some(q(1_000_000_000, DecimalSi))),
            ),
            ("memory.available", "1.5Gi", Ok(Some(q(3 << 29, BinarySi)))),
            (
                "nodefs.available",
                "10%",
                Ok(Some(ThresholdValue::Percentage(0.1))),
            ),
            (
                "nodefs.inodesFree",
                "5%",
                Ok(Some(ThresholdValue::Percentage(0.05))),
            ),
            ("pid.available", "1000", Ok(Some(q(1000, DecimalSi)))),
            ("imagefs.available", "0%", Ok(None)),
            ("imagefs.available", "100%", Ok(None)),
            ("memory.available", "0", Err("must be positive")),
            ("memory.available", "-1Mi", Err("must be positive")),
            ("memory.available", "150%", Err("must be <= 100%")),
            ("memory.available", "-5%", Err("must be >= 0%")),
            ("memory.available", "lots", Err("quantities must match")),
            (
                "memory.free",
                "1Gi",
                Err("unsupported eviction signal memory.free"),
            ),
        ];
        for (sig, val, want) in table {
            let got = parse_statements("evictionHard", &map(&[(sig, val)]));
            match (got, want) {
                (Ok(ts), Ok(v)) => {
                    assert_eq!(ts.first().map(|t| t.value), v, "{sig}<{val}");
                    if let Some(t) = ts.first() {
                        assert_eq!(t.signal.as_str(), sig);
                        assert!(t.is_hard());
                    }
                }
                (Err(e), Err(frag)) => {
                    let msg = e.to_string();
                    assert!(msg.contains(frag), "{sig}<{val}: {msg}");
                    assert!(
                        msg.contains(&format!("\"{sig}<{val}\"")),
                        "names the entry: {msg}"
                    );
                    assert!(msg.starts_with("evictionHard"), "{msg}");
                }
                (got, want) => panic!("{sig}<{val}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn soft_thresholds_need_a_grace_period() {
        let s = EvictionSettings {
            soft: map(&[("memory.available", "300Mi")]),
            ..Default::default()
        };
        let e = EvictionConfig::from_settings(&s).unwrap_err().to_string();
        assert!(
            e.contains(
                "grace period must be specified for the soft eviction threshold memory.available"
            ),
            "{e}"
        );
        assert!(e.contains("memory.available<300Mi"), "{e}");

        let s = EvictionSettings {
            soft: map(&[("memory.available", "300Mi")]),
            soft_grace_period: map(&[("memory.available", "1m30s")]),
            minimum_reclaim: map(&[("memory.available", "50Mi"), ("nodefs.available", "1%")]),
            ..Default::default()
        };
        let c = EvictionConfig::from_settings(&s).unwrap();
        let soft = c.thresholds.iter().find(|t| !t.is_hard()).unwrap();
        assert_eq!(soft.grace_period, Duration::from_secs(90));
        assert_eq!(
            soft.min_reclaim,
            Some(q(50 << 20, QuantityFormat::BinarySi))
        );
        let hard_mem = c
            .thresholds
            .iter()
            .find(|t| t.is_hard() && t.signal == Signal::MemoryAvailable)
            .unwrap();
        assert_eq!(
            hard_mem.min_reclaim, soft.min_reclaim,
            "min reclaim applies to every threshold of the signal"
        );
        let nodefs = c
            .thresholds
            .iter()
            .find(|t| t.signal == Signal::NodeFsAvailable)
            .unwrap();
        assert_eq!(nodefs.min_reclaim, Some(ThresholdValue::Percentage(0.01)));
    }

    #[test]
    fn bad_grace_periods_and_reclaims_name_their_entry() {
        let cases = [
            (
                EvictionSettings {
                    soft: map(&[("memory.available", "1Gi")]),
                    soft_grace_period: map(&[("memory.available", "-1m")]),
                    ..Default::default()
                },
                "evictionSoftGracePeriod: bad entry \"memory.available=-1m\": invalid eviction grace period specified: -1m, must be a positive value",
            ),
            (
                EvictionSettings {
                    soft_grace_period: map(&[("memory.available", "soon")]),
                    ..Default::default()
                },
                "evictionSoftGracePeriod: bad entry \"memory.available=soon\"",
            ),
            (
                EvictionSettings {
                    minimum_reclaim: map(&[("nodefs.available", "-1Gi")]),
                    ..Default::default()
                },
                "evictionMinimumReclaim: bad entry \"nodefs.available=-1Gi\": negative reclaim defined for signal nodefs.available",
            ),
            (
                EvictionSettings {
                    minimum_reclaim: map(&[("nodefs.available", "120%")]),
                    ..Default::default()
                },
                "must be <= 100%",
            ),
            (
                EvictionSettings {
                    pressure_transition_period: Some("5 minutes".into()),
                    ..Default::default()
                },
                "evictionPressureTransitionPeriod: bad entry \"5 minutes\"",
            ),
            (
                EvictionSettings {
                    max_pod_grace_period: Some(-3),
                    ..Default::default()
                },
                "evictionMaxPodGracePeriod: bad entry \"-3\"",
            ),
        ];
        for (s, frag) in cases {
            let e = EvictionConfig::from_settings(&s).unwrap_err().to_string();
            assert!(e.contains(frag), "{e}\n  want {frag}");
        }
    }

    #[test]
    fn user_hard_thresholds_replace_the_defaults_unless_merged() {
        let user = map(&[("memory.available", "500Mi")]);
        let s = EvictionSettings {
            hard: Some(user.clone()),
            ..Default::default()
        };
        let c = EvictionConfig::from_settings(&s).unwrap();
        assert_eq!(c.thresholds.len(), 1);
        let s = EvictionSettings {
            hard: Some(user),
            merge_default_hard: true,
            ..Default::default()
        };
        let c = EvictionConfig::from_settings(&s).unwrap();
        assert_eq!(c.thresholds.len(), 4);
        let mem = c
            .thresholds
            .iter()
            .find(|t| t.signal == Signal::MemoryAvailable)
            .unwrap();
        assert_eq!(mem.value, q(500 << 20, QuantityFormat::BinarySi));
    }

    #[test]
    fn flags_split_into_entries_and_bad_pairs_are_named() {
        let m = parse_threshold_flag(
            "evictionHard",
            "memory.available<100Mi, nodefs.available<10%",
        )
        .unwrap();
        assert_eq!(
            m,
            map(&[("memory.available", "100Mi"), ("nodefs.available", "10%")])
        );
        let m = parse_map_flag("evictionSoftGracePeriod", "memory.available=1m30s").unwrap();
        assert_eq!(m, map(&[("memory.available", "1m30s")]));
        let e = parse_threshold_flag("evictionHard", "memory.available=100Mi").unwrap_err();
        assert_eq!(
            e.to_string(),
            "evictionHard: bad entry \"memory.available=100Mi\": malformed pair, expect string<string"
        );
        assert!(parse_threshold_flag("evictionHard", "").unwrap().is_empty());
    }

    #[test]
    fn allocatable_thresholds_copy_the_hard_memory_ones() {
        let mut c = EvictionConfig::default();
        c.add_allocatable_thresholds();
        c.add_allocatable_thresholds();
        let alloc: Vec<_> = c
            .thresholds
            .iter()
            .filter(|t| t.signal == Signal::AllocatableMemoryAvailable)
            .collect();
        assert_eq!(alloc.len(), 1);
        assert_eq!(alloc[0].value, q(100 << 20, QuantityFormat::BinarySi));
    }

    #[test]
    fn go_durations_parse() {
        let ok = [
            ("0", 0.0),
            ("300ms", 0.3),
            ("1m30s", 90.0),
            ("1.5h", 5400.0),
            ("5m", 300.0),
            ("10us", 0.00001),
        ];
        for (s, secs) in ok {
            let (neg, d) = parse_go_duration(s).unwrap();
            assert!(!neg);
            assert!((d.as_secs_f64() - secs).abs() < 1e-9, "{s}");
        }
        assert_eq!(
            parse_go_duration("-1m").unwrap(),
            (true, Duration::from_secs(60))
        );
        for bad in ["", "5", "1x", "m", "1..5s", "five"] {
            assert!(parse_go_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn quantities_print_in_canonical_form() {
        use QuantityFormat::*;
        assert_eq!(format_quantity(100 << 20, BinarySi), "100Mi");
        assert_eq!(format_quantity(1 << 30, BinarySi), "1Gi");
        assert_eq!(format_quantity(1536 << 10, BinarySi), "1536Ki");
        assert_eq!(format_quantity(123_456_789, BinarySi), "123456789");
        assert_eq!(format_quantity(512, BinarySi), "512");
        assert_eq!(format_quantity(1_000_000_000, DecimalSi), "1G");
        assert_eq!(format_quantity(1500, DecimalSi), "1500");
        assert_eq!(format_quantity(0, BinarySi), "0");
    }

    proptest! {
        #[test]
        fn any_binary_quantity_round_trips(mib in 1i64..1_000_000) {
            let m = map(&[("memory.available", &format!("{mib}Mi"))]);
            let ts = parse_statements("evictionHard", &m).unwrap();
            prop_assert_eq!(ts.len(), 1);
            prop_assert_eq!(ts[0].value.quantity(0), mib << 20);
            prop_assert_eq!(format_quantity(mib << 20, QuantityFormat::BinarySi).replace("Gi", "").is_empty(), false);
        }

        #[test]
        fn percentages_scale_capacity(pct in 1u32..100, cap in 1i64..(1i64 << 42)) {
            let m = map(&[("nodefs.available", &format!("{pct}%"))]);
            let ts = parse_statements("evictionHard", &m).unwrap();
            let got = ts[0].value.quantity(cap);
            let want = cap as f64 * f64::from(pct) / 100.0;
            prop_assert!((got as f64 - want).abs() <= want * 1e-6 + 1.0);
        }

        #[test]
        fn parsing_never_panics_and_errors_name_the_entry(key in "[a-zA-Z.]{0,20}", val in "\\PC{0,12}") {
            let m = map(&[(&key, &val)]);
            if let Err(e) = parse_statements("evictionSoft", &m) {
                let msg = e.to_string();
                prop_assert!(msg.contains(&format!("{key}<")), "{}", msg);
            }
        }

        #[test]
        fn go_duration_of_seconds_and_millis(s in 0u64..100_000, ms in 0u64..1000) {
            let (neg, d) = parse_go_duration(&format!("{s}s{ms}ms")).unwrap();
            prop_assert!(!neg);
            prop_assert_eq!(d.as_millis(), u128::from(s * 1000 + ms));
        }
    }
}
