//! Image pulls and disk hygiene flags (`kubelet-gc`), named and parsed as the kubelet's.

use std::time::Duration;

use kubelet::KubeletConfiguration;

/// Image pulls, image and container garbage collection, container log rotation.
#[derive(Debug, clap::Args)]
pub(crate) struct ImageFlags {
    /// Pull one image at a time (`serializeImagePulls`).
    #[arg(long = "serialize-image-pulls", default_value_t = true, action = clap::ArgAction::Set)]
    pub(crate) serialize_image_pulls: bool,
    /// How many pulls run at once when they are not serialized (`maxParallelImagePulls`);
    /// unset: no bound.
    #[arg(long = "max-parallel-image-pulls")]
    pub(crate) max_parallel_image_pulls: Option<u32>,
    /// Image pulls started per second (`registryPullQPS`); 0 for no limit.
    #[arg(long = "registry-qps", default_value_t = 5)]
    pub(crate) registry_qps: u32,
    /// Pulls that may start at once above `--registry-qps` (`registryBurst`).
    #[arg(long = "registry-burst", default_value_t = 10)]
    pub(crate) registry_burst: u32,
    /// Image filesystem usage (percent) at which image garbage collection starts; 100 turns
    /// it off (`imageGCHighThresholdPercent`).
    #[arg(long = "image-gc-high-threshold", default_value_t = 85)]
    pub(crate) image_gc_high_threshold: i32,
    /// Usage image garbage collection frees down to (`imageGCLowThresholdPercent`).
    #[arg(long = "image-gc-low-threshold", default_value_t = 80)]
    pub(crate) image_gc_low_threshold: i32,
    /// Minimum age of an unused image before it may be removed (`imageMinimumGCAge`).
    #[arg(long = "minimum-image-ttl-duration", default_value = "2m", value_parser = parse_duration)]
    pub(crate) minimum_image_ttl_duration: Duration,
    /// Unused images not used for this long are removed whatever the usage
    /// (`imageMaximumGCAge`; a configuration field of the kubelet, not a flag); 0: off.
    #[arg(long = "image-maximum-gc-age", default_value = "0s", value_parser = parse_duration)]
    pub(crate) image_maximum_gc_age: Duration,
    /// A container's log is rotated at this size (`containerLogMaxSize`).
    #[arg(long = "container-log-max-size", default_value = "10Mi")]
    pub(crate) container_log_max_size: String,
    /// Log files kept per container, the current one included (`containerLogMaxFiles`).
    #[arg(long = "container-log-max-files", default_value_t = 5)]
    pub(crate) container_log_max_files: i32,
    /// How often log sizes are checked (`containerLogMonitorInterval`; a configuration field
    /// of the kubelet, not a flag).
    #[arg(long = "container-log-monitor-interval", default_value = "10s", value_parser = parse_duration)]
    pub(crate) container_log_monitor_interval: Duration,
    /// Dead instances kept per container of a pod; negative: no limit.
    #[arg(
        long = "maximum-dead-containers-per-container",
        default_value_t = 1,
        allow_negative_numbers = true
    )]
    pub(crate) maximum_dead_containers_per_container: i32,
    /// Dead containers kept on the node; negative: no limit.
    #[arg(long = "maximum-dead-containers", default_value_t = -1, allow_negative_numbers = true)]
    pub(crate) maximum_dead_containers: i32,
    /// A dead container younger than this is not removed.
    #[arg(long = "minimum-container-ttl-duration", default_value = "0s", value_parser = parse_duration)]
    pub(crate) minimum_container_ttl_duration: Duration,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    match kubelet::core::duration::parse_go(s).map_err(|e| e.to_string())? {
        (false, d) => Ok(d),
        (true, _) => Err(format!("duration {s:?} must not be negative")),
    }
}

/// The flags that are fields of the kubelet's configuration.
pub(crate) fn configure(
    flags: &ImageFlags,
    given: &crate::Given<'_>,
    c: &mut KubeletConfiguration,
) {
    if given.has("serialize_image_pulls") {
        c.serialize_image_pulls = flags.serialize_image_pulls;
    }
    if given.has("max_parallel_image_pulls") {
        c.max_parallel_image_pulls = flags.max_parallel_image_pulls;
    }
    if given.has("registry_qps") {
        c.registry_pull_qps = flags.registry_qps;
    }
    if given.has("registry_burst") {
        c.registry_burst = flags.registry_burst;
    }
    if given.has("image_gc_high_threshold") {
        c.image_gc_high_threshold_percent = flags.image_gc_high_threshold;
    }
    if given.has("image_gc_low_threshold") {
        c.image_gc_low_threshold_percent = flags.image_gc_low_threshold;
    }
    if given.has("minimum_image_ttl_duration") {
        c.image_minimum_gc_age = flags.minimum_image_ttl_duration.into();
    }
    if given.has("image_maximum_gc_age") {
        c.image_maximum_gc_age = flags.image_maximum_gc_age.into();
    }
    if given.has("container_log_max_size") {
        c.container_log_max_size = flags.container_log_max_size.clone();
    }
    if given.has("container_log_max_files") {
        c.container_log_max_files = flags.container_log_max_files;
    }
    if given.has("container_log_monitor_interval") {
        c.container_log_monitor_interval = flags.container_log_monitor_interval.into();
    }
}

/// Container garbage collection's policy (flags only, as the kubelet's).
#[cfg(feature = "gc")]
pub(crate) fn container_gc_policy(flags: &ImageFlags) -> kubelet::gc::ContainerGcPolicy {
    let mut p = kubelet::gc::ContainerGcPolicy::default();
    p.max_per_pod_container = flags.maximum_dead_containers_per_container;
    p.max_containers = flags.maximum_dead_containers;
    p.min_age = flags.minimum_container_ttl_duration;
    p
}
