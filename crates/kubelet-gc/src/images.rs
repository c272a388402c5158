//! [`ImageGc`]: the kubelet's image garbage collection (`image_gc_manager.go`).
//!
//! Every run first *detects*: it lists the runtime's images and every container (running or
//! not yet removed), records when each image was first seen, and marks the images containers
//! use as used now. Records live in memory (as the kubelet's), so after a restart every image
//! starts its minimum age again. Then:
//!
//! 1. with `imageMaximumGCAge` set, unused images not used for that long are removed;
//! 2. when the image filesystem's usage is at or above the high threshold, unused images are
//!    removed least recently used first (never used ones first, then by first detection) until
//!    usage is back at the low threshold. An image is never removed while a container uses it,
//!    when the runtime pins it or it is configured as pinned (the sandbox image), or before its
//!    minimum age.

use std::collections::{HashMap, HashSet};

use k8s_openapi::api::core::v1::ContainerImage;
use kubelet_api::ContainerRuntime;
use kubelet_api::runtime::{ContainerFilter, Image, ImageSpec};
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::config::ImageGcPolicy;
use crate::error::GcError;

/// What the collector knows of one image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Record {
    first_detected: Instant,
    /// `None`: never seen in use.
    last_used: Option<Instant>,
    size: u64,
    pinned: bool,
}

/// One image that may be removed, with what orders it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Image ID.
    pub id: String,
    /// Size in bytes.
    pub size: u64,
    /// When a container last used it; `None`: never.
    pub last_used: Option<Instant>,
    /// When the collector first saw it.
    pub first_detected: Instant,
}

/// Why images were removed (the `reason` label of `kubelet_image_garbage_collected_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Not used for longer than `imageMaximumGCAge`.
    Age,
    /// The image filesystem was above the high threshold (or eviction asked).
    Space,
}

/// What one run removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageGcOutcome {
    /// Image IDs removed, in order, with why.
    pub removed: Vec<(String, Reason)>,
    /// Bytes those images had.
    pub freed: u64,
    /// Usage of the image filesystem before the run, percent (`None`: unknown).
    pub usage_percent: Option<u8>,
}

/// The image filesystem's size and free space (from the stats service).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsUsage {
    /// Bytes.
    pub capacity: u64,
    /// Bytes free.
    pub available: u64,
}

/// The image collector's state; see the [module docs](self). Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct ImageGc {
    policy: ImageGcPolicy,
    records: Mutex<HashMap<String, Record>>,
    began: Instant,
}

/// Candidates in the kubelet's eviction order: never used first, then least recently used,
/// ties by first detection.
pub fn eviction_order(mut candidates: Vec<Candidate>) -> Vec<Candidate> {
    kubelet_api::sort::by(&mut candidates, |a, b| {
        a.last_used
            .cmp(&b.last_used)
            .then(a.first_detected.cmp(&b.first_detected))
            .then_with(|| a.id.cmp(&b.id))
    });
    candidates
}

/// The images to remove, in order, to free `bytes` from `ordered` (see [`eviction_order`]):
/// those used since `now` and those first seen less than `min_age` ago are skipped; stops as
/// soon as enough is freed.
pub fn plan_free(
    ordered: &[Candidate],
    bytes: u64,
    now: Instant,
    min_age: std::time::Duration,
) -> Vec<&Candidate> {
    let mut out = Vec::new();
    let mut freed = 0u64;
    for c in ordered {
        if freed >= bytes {
            break;
        }
        if c.last_used.is_some_and(|t| t >= now) {
            continue;
        }
        if now.saturating_duration_since(c.first_detected) < min_age {
            continue;
        }
        freed = freed.saturating_add(c.size);
        out.push(c);
    }
    out
}

/// How many images the node status lists (the kubelet's `nodeStatusMaxImages`).
pub const NODE_STATUS_MAX_IMAGES: usize = 50;

/// How many names of one image the node status lists (`maxNamesPerImageInNodeStatus`).
pub const MAX_NAMES_PER_IMAGE: usize = 5;

/// `status.images` of the node from the runtime's images, as the kubelet writes it: largest
/// first, at most `max` (0: all), each with its digest references then its tags (at most
/// [`MAX_NAMES_PER_IMAGE`]); images without a name are left out.
pub fn node_images(mut images: Vec<Image>, max: usize) -> Vec<ContainerImage> {
    kubelet_api::sort::by(&mut images, |a, b| {
        b.size.cmp(&a.size).then_with(|| a.id.cmp(&b.id))
    });
    let out = images.into_iter().filter_map(|i| {
        let names: Vec<String> = i
            .repo_digests
            .into_iter()
            .chain(i.repo_tags)
            .take(MAX_NAMES_PER_IMAGE)
            .collect();
        (!names.is_empty()).then(|| ContainerImage {
            names: Some(names),
            size_bytes: i64::try_from(i.size).ok(),
        })
    });
    match max {
        0 => out.collect(),
        n => out.take(n).collect(),
    }
}

impl ImageGc {
    /// A collector with `policy`, no image seen yet.
    pub fn new(policy: ImageGcPolicy) -> Self {
        Self {
            policy,
            records: Mutex::new(HashMap::new()),
            began: Instant::now(),
        }
    }

    /// The policy.
    pub fn policy(&self) -> &ImageGcPolicy {
        &self.policy
    }

    fn configured_pin(&self, image: &Image) -> bool {
        self.policy.pinned_images.iter().any(|p| {
            *p == image.id || image.repo_tags.contains(p) || image.repo_digests.contains(p)
        })
    }

    /// List images and containers and update the records; returns the unused, unpinned
    /// images as candidates (unordered).
    pub async fn detect(
        &self,
        runtime: &dyn ContainerRuntime,
        now: Instant,
    ) -> Result<Vec<Candidate>, GcError> {
        let Some(images) = runtime.images() else {
            self.records.lock().clear();
            return Ok(Vec::new());
        };
        let listed = images
            .list_images()
            .await
            .map_err(GcError::runtime("list_images"))?;
        let containers = runtime
            .list_containers(&ContainerFilter::default())
            .await
            .map_err(GcError::runtime("list_containers"))?;
        // A container names its image by ID (`image_ref`) or by the reference it was created
        // with; both lead to the listed image.
        let mut by_name: HashMap<&str, &str> = HashMap::new();
        for i in &listed {
            by_name.insert(i.id.as_str(), i.id.as_str());
            for n in i.repo_tags.iter().chain(&i.repo_digests) {
                by_name.insert(n.as_str(), i.id.as_str());
            }
        }
        let in_use: HashSet<&str> = containers
            .iter()
            .flat_map(|c| [c.image_ref.as_str(), c.image.as_str()])
            .filter_map(|n| by_name.get(n).copied())
            .collect();
        let mut records = self.records.lock();
        records.retain(|id, _| by_name.get(id.as_str()) == Some(&id.as_str()));
        let mut candidates = Vec::new();
        for i in &listed {
            let r = records.entry(i.id.clone()).or_insert(Record {
                first_detected: now,
                last_used: None,
                size: i.size,
                pinned: false,
            });
            r.size = i.size;
            r.pinned = i.pinned || self.configured_pin(i);
            if in_use.contains(i.id.as_str()) {
                r.last_used = Some(now);
                continue;
            }
            if r.pinned {
                continue;
            }
            candidates.push(Candidate {
                id: i.id.clone(),
                size: r.size,
                last_used: r.last_used,
                first_detected: r.first_detected,
            });
        }
        Ok(candidates)
    }

    /// One collection: age-based removal, then space-based removal when `usage` is at or
    /// above the high threshold. `usage` `None` (no stats yet): space-based removal is
    /// skipped.
    pub async fn collect(
        &self,
        runtime: &dyn ContainerRuntime,
        usage: Option<FsUsage>,
    ) -> Result<ImageGcOutcome, GcError> {
        let now = Instant::now();
        let mut candidates = self.detect(runtime, now).await?;
        let mut out = ImageGcOutcome::default();
        let max_age = self.policy.max_age;
        if !max_age.is_zero() && now.saturating_duration_since(self.began) > max_age {
            let (old, young): (Vec<Candidate>, Vec<Candidate>) =
                candidates.into_iter().partition(|c| {
                    let since = c.last_used.unwrap_or(c.first_detected);
                    now.saturating_duration_since(since) > max_age
                        && now.saturating_duration_since(c.first_detected) >= self.policy.min_age
                });
            for c in &old {
                self.remove(runtime, c, Reason::Age, &mut out).await;
            }
            candidates = young;
        }
        let Some(usage) = usage else {
            return Ok(out);
        };
        if usage.capacity == 0 {
            return Err(GcError::InvalidDiskCapacity);
        }
        let available = usage.available.min(usage.capacity);
        let percent = 100 - (u128::from(available) * 100 / u128::from(usage.capacity)) as u8;
        out.usage_percent = Some(percent);
        if self.policy.high_threshold_percent >= 100 || percent < self.policy.high_threshold_percent
        {
            return Ok(out);
        }
        let target =
            u128::from(usage.capacity) * u128::from(100 - self.policy.low_threshold_percent) / 100;
        let wanted = target.saturating_sub(u128::from(available)) as u64;
        let freed = self
            .free(runtime, eviction_order(candidates), wanted, now, &mut out)
            .await;
        if freed < wanted {
            return Err(GcError::FreeDiskSpace { wanted, freed });
        }
        Ok(out)
    }

    /// Remove every unused image past its minimum age (eviction's reclaim,
    /// `DeleteUnusedImages`).
    pub async fn delete_unused(
        &self,
        runtime: &dyn ContainerRuntime,
    ) -> Result<ImageGcOutcome, GcError> {
        let now = Instant::now();
        let candidates = eviction_order(self.detect(runtime, now).await?);
        let mut out = ImageGcOutcome::default();
        self.free(runtime, candidates, u64::MAX, now, &mut out)
            .await;
        Ok(out)
    }

    async fn free(
        &self,
        runtime: &dyn ContainerRuntime,
        ordered: Vec<Candidate>,
        bytes: u64,
        now: Instant,
        out: &mut ImageGcOutcome,
    ) -> u64 {
        let before = out.freed;
        for c in plan_free(&ordered, bytes, now, self.policy.min_age) {
            self.remove(runtime, c, Reason::Space, out).await;
        }
        out.freed - before
    }

    /// Remove one image; a refusal (in use, say) is logged and the run goes on.
    async fn remove(
        &self,
        runtime: &dyn ContainerRuntime,
        c: &Candidate,
        reason: Reason,
        out: &mut ImageGcOutcome,
    ) {
        let Some(images) = runtime.images() else {
            return;
        };
        match images.remove_image(&ImageSpec::new(c.id.clone())).await {
            Ok(()) => {
                tracing::info!(image = %c.id, size = c.size, ?reason, "removed unused image");
                self.records.lock().remove(&c.id);
                out.freed = out.freed.saturating_add(c.size);
                out.removed.push((c.id.clone(), reason));
            }
            Err(e) => {
                tracing::warn!(image = %c.id, error = %kubelet_api::chain(&e), "removing an unused image failed");
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn cand(id: &str, size: u64, used: Option<u64>, detected: u64, base: Instant) -> Candidate {
        Candidate {
            id: id.into(),
            size,
            last_used: used.map(|s| base + Duration::from_secs(s)),
            first_detected: base + Duration::from_secs(detected),
        }
    }

    #[test]
    fn the_node_lists_its_largest_images_digests_first_with_at_most_five_names() {
        let mut big = Image::new(
            "sha256:b",
            (0..6).map(|i| format!("r/big:{i}")).collect(),
            300,
        );
        big.repo_digests = vec!["r/big@sha256:b".into()];
        let list = vec![
            Image::new("sha256:a", vec!["r/small:1".into()], 100),
            big,
            Image::new("sha256:c", vec![], 999),
            Image::new("sha256:d", vec!["r/mid:1".into()], 200),
        ];
        let out = node_images(list.clone(), 2);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].size_bytes, Some(300));
        let names = out[0].names.as_ref().unwrap();
        assert_eq!(names.len(), MAX_NAMES_PER_IMAGE);
        assert_eq!(names[0], "r/big@sha256:b");
        assert_eq!(out[1].names.as_deref(), Some(&["r/mid:1".to_string()][..]));
        assert_eq!(
            node_images(list, 0).len(),
            3,
            "the unnamed image is left out"
        );
    }

    #[test]
    fn never_used_images_go_first_then_least_recently_used_then_first_detected() {
        let t = Instant::now();
        let order = eviction_order(vec![
            cand("used-late", 1, Some(50), 0, t),
            cand("never-b", 1, None, 20, t),
            cand("used-early", 1, Some(10), 0, t),
            cand("never-a", 1, None, 10, t),
        ]);
        let ids: Vec<&str> = order.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["never-a", "never-b", "used-early", "used-late"]);
    }

    #[test]
    fn a_plan_stops_once_enough_is_freed_and_skips_young_and_just_used_images() {
        let t = Instant::now();
        let now = t + Duration::from_secs(1000);
        let ordered = eviction_order(vec![
            cand("young", 100, None, 990, t),
            cand("a", 10, None, 0, t),
            cand("b", 20, Some(100), 0, t),
            cand("now", 30, Some(1000), 0, t),
            cand("c", 40, Some(200), 0, t),
        ]);
        let plan: Vec<&str> = plan_free(&ordered, 25, now, Duration::from_secs(120))
            .iter()
            .map(|c| c.id.as_str())
            .collect();
        assert_eq!(plan, ["a", "b"]);
        let all: Vec<&str> = plan_free(&ordered, u64::MAX, now, Duration::from_secs(120))
            .iter()
            .map(|c| c.id.as_str())
            .collect();
        assert_eq!(all, ["a", "b", "c"]);
    }
}
