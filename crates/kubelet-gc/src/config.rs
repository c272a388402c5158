//! [`GcConfig`]: the garbage collectors' policies, named and defaulted as the kubelet's.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::GcError;

/// Image garbage collection (`imageGC*` of the kubelet's configuration).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ImageGcPolicy {
    /// `imageGCHighThresholdPercent` (85): image filesystem usage at which collection starts;
    /// 100 switches usage-based collection off.
    pub high_threshold_percent: u8,
    /// `imageGCLowThresholdPercent` (80): the usage collection frees down to.
    pub low_threshold_percent: u8,
    /// `imageMinimumGCAge` (2 m): an image first seen less long ago is never removed.
    pub min_age: Duration,
    /// `imageMaximumGCAge` (0, off): an unused image not used for this long is removed
    /// whatever the usage.
    pub max_age: Duration,
    /// How often collection runs (the kubelet's `ImageGCPeriod`, 5 m).
    pub period: Duration,
    /// Images never removed whatever the runtime says about them (by tag or ID): the sandbox
    /// image (`--pod-infra-container-image`), for runtimes that do not pin it.
    pub pinned_images: Vec<String>,
}

impl Default for ImageGcPolicy {
    fn default() -> Self {
        Self {
            high_threshold_percent: 85,
            low_threshold_percent: 80,
            min_age: Duration::from_secs(120),
            max_age: Duration::ZERO,
            period: Duration::from_secs(300),
            pinned_images: Vec::new(),
        }
    }
}

/// Container garbage collection (the kubelet's `GCPolicy` and flags).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ContainerGcPolicy {
    /// `--minimum-container-ttl-duration` (0): a dead container created less long ago stays.
    pub min_age: Duration,
    /// `--maximum-dead-containers-per-container` (1): dead instances kept per container of a
    /// pod, newest first (so `kubectl logs --previous` works); negative: no limit.
    pub max_per_pod_container: i32,
    /// `--maximum-dead-containers` (-1): dead containers kept on the node; negative: no limit.
    pub max_containers: i32,
    /// How often collection runs (the kubelet's `ContainerGCPeriod`, 1 m).
    pub period: Duration,
    /// A pod log or pod directory of an unknown pod is removed only when it has not changed
    /// for this long (1 m), so that a pod that has just arrived is never touched.
    pub orphan_grace: Duration,
}

impl Default for ContainerGcPolicy {
    fn default() -> Self {
        Self {
            min_age: Duration::ZERO,
            max_per_pod_container: 1,
            max_containers: -1,
            period: Duration::from_secs(60),
            orphan_grace: Duration::from_secs(60),
        }
    }
}

/// Container log rotation (`containerLog*` of the kubelet's configuration).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LogRotationPolicy {
    /// `containerLogMaxSize` (10 MiB), bytes: a log is rotated at this size; 0 switches
    /// rotation off (the kubelet's negative size).
    pub max_size: u64,
    /// `containerLogMaxFiles` (5): files kept per container, the current one included; at
    /// least 2.
    pub max_files: usize,
    /// `containerLogMonitorInterval` (10 s): how often sizes are checked.
    pub monitor_interval: Duration,
}

impl Default for LogRotationPolicy {
    fn default() -> Self {
        Self {
            max_size: 10 * 1024 * 1024,
            max_files: 5,
            monitor_interval: Duration::from_secs(10),
        }
    }
}

/// Everything the garbage collectors need to know.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct GcConfig {
    /// Image garbage collection.
    pub images: ImageGcPolicy,
    /// Container garbage collection.
    pub containers: ContainerGcPolicy,
    /// Container log rotation.
    pub logs: LogRotationPolicy,
    /// The directory of the log links (`/var/log/containers`); dangling links there are
    /// removed. `None`: no links are looked at.
    pub container_log_dir: Option<PathBuf>,
}

impl GcConfig {
    /// The kubelet's defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Check the policies as the kubelet validates its configuration.
    pub fn validate(&self) -> Result<(), GcError> {
        let i = &self.images;
        if i.high_threshold_percent > 100 {
            return Err(GcError::InvalidConfig(format!(
                "imageGCHighThresholdPercent ({}) must be between 0 and 100",
                i.high_threshold_percent
            )));
        }
        if i.low_threshold_percent > i.high_threshold_percent {
            return Err(GcError::InvalidConfig(format!(
                "LowThresholdPercent {} can not be higher than HighThresholdPercent {}",
                i.low_threshold_percent, i.high_threshold_percent
            )));
        }
        if !i.max_age.is_zero() && i.max_age < i.min_age {
            return Err(GcError::InvalidConfig(format!(
                "imageMaximumGCAge {:?} must be greater than imageMinimumGCAge {:?}",
                i.max_age, i.min_age
            )));
        }
        if self.logs.max_size > 0 && self.logs.max_files < 2 {
            return Err(GcError::InvalidConfig(format!(
                "invalid MaxFiles {}, must be > 1",
                self.logs.max_files
            )));
        }
        for (name, d) in [
            ("image GC period", i.period),
            ("container GC period", self.containers.period),
            ("containerLogMonitorInterval", self.logs.monitor_interval),
        ] {
            if d.is_zero() {
                return Err(GcError::InvalidConfig(format!("{name} must be positive")));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_kubelets_and_validation_names_the_field() {
        let c = GcConfig::new();
        assert_eq!(c.images.high_threshold_percent, 85);
        assert_eq!(c.images.low_threshold_percent, 80);
        assert_eq!(c.images.min_age, Duration::from_secs(120));
        assert_eq!(c.containers.max_per_pod_container, 1);
        assert_eq!(c.containers.max_containers, -1);
        assert_eq!(c.logs.max_size, 10 << 20);
        assert_eq!(c.logs.max_files, 5);
        assert!(c.validate().is_ok());
        let mut bad = c.clone();
        bad.images.low_threshold_percent = 90;
        let e = bad.validate().unwrap_err().to_string();
        assert!(
            e.contains("LowThresholdPercent 90 can not be higher than HighThresholdPercent 85"),
            "{e}"
        );
        let mut bad = c;
        bad.logs.max_files = 1;
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("invalid MaxFiles 1")
        );
    }
}
