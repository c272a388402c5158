//! Merge throughput of the pod config: 10,000 pods across 3 sources (`file`, `http`, `api`),
//! each snapshot a full listing of one source in which 1% of the pods changed (a new image: an
//! UPDATE). Prints the time and the allocations per snapshot of [`PodStorage::merge`], against
//! two baselines measured in the same run: deep-cloning the snapshot (what handing a full
//! snapshot over costs at least) and merging an unchanged snapshot.
//!
//! ```text
//! cargo run --release -p podconfig-bench [-- <pods> <snapshots>]
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use kubelet_api::{EventRecorder, SourceSnapshot};
use kubelet_core::merge::PodStorage;

/// Counts allocations and allocated bytes.
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; the counters are atomics.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn counters() -> (u64, u64) {
    (
        ALLOCS.load(Ordering::Relaxed),
        BYTES.load(Ordering::Relaxed),
    )
}

const SOURCES: [&str; 3] = ["file", "http", "api"];

fn pod(source: &str, i: usize, generation: u64) -> Pod {
    let mut p = Pod::default();
    p.metadata.name = Some(format!("{source}-pod-{i}"));
    p.metadata.namespace = Some("default".into());
    p.metadata.uid = Some(format!("{source}-uid-{i:08}"));
    p.metadata.labels = Some([("app".to_string(), format!("app-{}", i % 50))].into());
    p.metadata.annotations = Some([("team".to_string(), "platform".to_string())].into());
    p.spec = Some(PodSpec {
        containers: vec![
            Container {
                name: "app".into(),
                image: Some(format!("registry.example/app:{generation}")),
                command: Some(vec!["/bin/app".into(), "--port=8080".into()]),
                ..Default::default()
            },
            Container {
                name: "sidecar".into(),
                image: Some("registry.example/proxy:1.0".into()),
                ..Default::default()
            },
        ],
        restart_policy: Some("Always".into()),
        node_name: Some("node-1".into()),
        ..Default::default()
    });
    p
}

struct Sample {
    time: Duration,
    allocs: u64,
    bytes: u64,
}

fn per_snapshot(samples: &[Sample]) -> (f64, f64, f64, f64) {
    let n = samples.len() as f64;
    let mut times: Vec<f64> = samples.iter().map(|s| s.time.as_secs_f64() * 1e3).collect();
    times.sort_by(f64::total_cmp);
    let mean = times.iter().sum::<f64>() / n;
    let p50 = times[times.len() / 2];
    let allocs = samples.iter().map(|s| s.allocs as f64).sum::<f64>() / n;
    let bytes = samples.iter().map(|s| s.bytes as f64).sum::<f64>() / n;
    (mean, p50, allocs, bytes)
}

fn measure<T>(f: impl FnOnce() -> T) -> (T, Sample) {
    let (a0, b0) = counters();
    let start = Instant::now();
    let out = f();
    let time = start.elapsed();
    let (a1, b1) = counters();
    (
        out,
        Sample {
            time,
            allocs: a1 - a0,
            bytes: b1 - b0,
        },
    )
}

fn main() {
    let mut args = std::env::args().skip(1);
    let total: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let snapshots: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(300);
    let per_source = total / SOURCES.len();
    let changing = (per_source / 100).max(1);
    let recorder = EventRecorder::log_only();

    // Current desired state of every source, and each pod's generation.
    let mut state: Vec<Vec<Pod>> = SOURCES
        .iter()
        .map(|s| (0..per_source).map(|i| pod(s, i, 0)).collect())
        .collect();
    let mut generation: Vec<Vec<u64>> = vec![vec![0; per_source]; SOURCES.len()];
    let mut storage = PodStorage::new(SOURCES);
    for (s, pods) in SOURCES.iter().zip(&state) {
        storage.merge(
            SourceSnapshot {
                source: s.to_string(),
                pods: pods.iter().cloned().map(Arc::new).collect(),
            },
            &recorder,
        );
    }

    let mut clone_samples = Vec::new();
    let mut merge_samples = Vec::new();
    let mut unchanged_samples = Vec::new();
    let mut updates_seen = 0usize;
    let mut cursor = 0usize;
    for k in 0..snapshots {
        let si = k % SOURCES.len();
        let source = SOURCES[si];
        // 1% of this source's pods change (a rolling window, so every pod changes in turn).
        for j in 0..changing {
            let i = (cursor + j) % per_source;
            generation[si][i] += 1;
            state[si][i] = pod(source, i, generation[si][i]);
        }
        cursor = (cursor + changing) % per_source;

        // Baseline 1: the deep copy of a full snapshot.
        let (pods, sample) =
            measure(|| state[si].iter().cloned().map(Arc::new).collect::<Vec<_>>());
        clone_samples.push(sample);

        let (updates, sample) = measure(|| {
            storage.merge(
                SourceSnapshot {
                    source: source.to_string(),
                    pods,
                },
                &recorder,
            )
        });
        merge_samples.push(sample);
        let updated: usize = updates.iter().map(|u| u.pods.len()).sum();
        assert_eq!(updated, changing, "every changed pod is one UPDATE");
        updates_seen += updated;
        drop(updates);

        // Baseline 2: the same snapshot again (nothing changed).
        let pods: Vec<Arc<Pod>> = state[si].iter().cloned().map(Arc::new).collect();
        let (updates, sample) = measure(|| {
            storage.merge(
                SourceSnapshot {
                    source: source.to_string(),
                    pods,
                },
                &recorder,
            )
        });
        assert!(updates.is_empty());
        unchanged_samples.push(sample);
    }

    let (c_mean, c_p50, c_allocs, c_bytes) = per_snapshot(&clone_samples);
    let (m_mean, m_p50, m_allocs, m_bytes) = per_snapshot(&merge_samples);
    let (u_mean, u_p50, u_allocs, u_bytes) = per_snapshot(&unchanged_samples);
    println!(
        "podconfig merge: {} pods in {} sources ({} per source), {} changed per snapshot (1%), {} snapshots, {} updates",
        per_source * SOURCES.len(),
        SOURCES.len(),
        per_source,
        changing,
        snapshots,
        updates_seen
    );
    println!(
        "{:<34} {:>10} {:>10} {:>12} {:>12}",
        "per snapshot", "mean ms", "p50 ms", "allocs", "MiB alloc"
    );
    let row = |name: &str, mean: f64, p50: f64, allocs: f64, bytes: f64| {
        println!(
            "{name:<34} {mean:>10.3} {p50:>10.3} {allocs:>12.0} {:>12.2}",
            bytes / (1024.0 * 1024.0)
        )
    };
    row(
        "baseline: deep clone of snapshot",
        c_mean,
        c_p50,
        c_allocs,
        c_bytes,
    );
    row("merge, 1% changed", m_mean, m_p50, m_allocs, m_bytes);
    row("merge, unchanged", u_mean, u_p50, u_allocs, u_bytes);
    println!(
        "ratios to the clone baseline: merge 1% changed {:.2}x time, {:.2}x allocs; merge unchanged {:.2}x time, {:.2}x allocs",
        m_mean / c_mean,
        m_allocs / c_allocs,
        u_mean / c_mean,
        u_allocs / c_allocs
    );
    println!(
        "throughput: {:.0} snapshots/s, {:.0} pods compared/s",
        1e3 / m_mean,
        per_source as f64 * 1e3 / m_mean
    );
}
