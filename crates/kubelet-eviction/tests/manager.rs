//! The manager loop with scripted stats and a recording pod control, under paused time.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kubelet_api::{KillPodOptions, NodeReclaimer};
use kubelet_eviction::{
    ActivePod, ContainerUsage, EvictionConfig, EvictionError, EvictionManager, EvictionSettings,
    FsLayout, ManagerEvent, NodeCondition, Observations, PodControl, PodUsage, Signal,
    SignalObservation, StatsProvider,
};
use parking_lot::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const MI: i64 = 1 << 20;

/// Stats whose values the test sets.
#[derive(Default)]
struct Scripted {
    available: Mutex<HashMap<Signal, (i64, i64)>>,
    usage: Mutex<HashMap<String, PodUsage>>,
}

impl Scripted {
    fn set(&self, s: Signal, available: i64, capacity: i64) {
        self.available.lock().insert(s, (available, capacity));
    }
}

#[async_trait]
impl StatsProvider for Scripted {
    async fn observe(&self) -> Result<Observations, EvictionError> {
        let now = Instant::now();
        Ok(self
            .available
            .lock()
            .iter()
            .map(|(s, (a, c))| {
                (
                    *s,
                    SignalObservation {
                        available: *a,
                        capacity: *c,
                        time: now,
                    },
                )
            })
            .collect())
    }
    async fn pod_usage(&self, _pods: &[ActivePod]) -> HashMap<String, PodUsage> {
        self.usage.lock().clone()
    }
}

/// Pods that die when killed, recording the kill options; with `counted`, it reports a count
/// of changes to its pods (bumped by the test and by each kill) and counts its listings.
#[derive(Default)]
struct Recording {
    pods: Mutex<Vec<Pod>>,
    kills: Mutex<Vec<(String, KillPodOptions, Instant)>>,
    counted: bool,
    changes: std::sync::atomic::AtomicU64,
    listings: std::sync::atomic::AtomicUsize,
}

#[async_trait]
impl PodControl for Recording {
    async fn active_pods(&self) -> Vec<ActivePod> {
        self.listings
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.pods
            .lock()
            .iter()
            .map(|p| ActivePod {
                pod: Arc::new(p.clone()),
                containers: vec![],
            })
            .collect()
    }
    async fn kill_pod(&self, pod: &Pod, options: KillPodOptions) -> Result<(), EvictionError> {
        let uid = kubelet_api::pod::uid(pod).to_string();
        self.pods.lock().retain(|p| kubelet_api::pod::uid(p) != uid);
        self.changes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.kills
            .lock()
            .push((uid.clone(), options, Instant::now()));
        Ok(())
    }
    fn changes(&self) -> Option<u64> {
        self.counted
            .then(|| self.changes.load(std::sync::atomic::Ordering::SeqCst))
    }
}

fn pod(name: &str, priority: i32, request: Option<&str>, static_pod: bool) -> Pod {
    let mut c = Container {
        name: "app".into(),
        ..Default::default()
    };
    if let Some(r) = request {
        c.resources = Some(ResourceRequirements {
            requests: Some([("memory".to_string(), Quantity(r.into()))].into()),
            ..Default::default()
        });
    }
    let mut p = Pod {
        spec: Some(PodSpec {
            containers: vec![c],
            priority: Some(priority),
            ..Default::default()
        }),
        ..Default::default()
    };
    p.metadata.name = Some(name.into());
    p.metadata.namespace = Some("default".into());
    p.metadata.uid = Some(name.into());
    if static_pod {
        p.metadata.annotations = Some(
            [(
                "kubernetes.io/config.source".to_string(),
                "file".to_string(),
            )]
            .into(),
        );
    }
    p
}

/// Pod `name` with an emptyDir volume `scratch` limited to 10Mi.
fn pod_with_scratch_limit(name: &str) -> Pod {
    use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, Volume};
    let mut p = pod(name, 0, None, false);
    p.spec.as_mut().unwrap().volumes = Some(vec![Volume {
        name: "scratch".into(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: Some(Quantity("10Mi".into())),
            ..Default::default()
        }),
        ..Default::default()
    }]);
    p
}

fn usage(mib: u64) -> PodUsage {
    PodUsage {
        containers: vec![ContainerUsage {
            name: "app".into(),
            memory_working_set: Some(mib << 20),
            processes: Some(1),
            disk_bytes: None,
        }],
        ..Default::default()
    }
}

fn config(hard: &str, soft: &str, grace: &str) -> EvictionConfig {
    let mut s = EvictionSettings::default();
    s.hard = Some(kubelet_eviction::parse_threshold_flag("evictionHard", hard).unwrap());
    s.soft = kubelet_eviction::parse_threshold_flag("evictionSoft", soft).unwrap();
    s.soft_grace_period =
        kubelet_eviction::parse_map_flag("evictionSoftGracePeriod", grace).unwrap();
    EvictionConfig::from_settings(&s).unwrap()
}

struct Setup {
    stats: Arc<Scripted>,
    pods: Arc<Recording>,
    manager: EvictionManager,
}

fn setup(cfg: EvictionConfig, pods: Vec<Pod>, usages: &[(&str, u64)]) -> Setup {
    let stats = Arc::new(Scripted::default());
    stats.set(Signal::MemoryAvailable, 900 * MI, 1000 * MI);
    *stats.usage.lock() = usages
        .iter()
        .map(|(n, m)| (n.to_string(), usage(*m)))
        .collect();
    let control = Arc::new(Recording::default());
    *control.pods.lock() = pods;
    let manager = EvictionManager::new(cfg, stats.clone(), control.clone());
    Setup {
        stats,
        pods: control,
        manager,
    }
}

#[tokio::test(start_paused = true)]
async fn a_hard_threshold_evicts_the_top_ranked_pod_with_one_second_grace() {
    let mut s = setup(
        config("memory.available<100Mi", "", ""),
        vec![
            pod("small", 0, Some("100Mi"), false),
            pod("hog", 0, Some("50Mi"), false),
            pod("system", 2_000_000_000, None, false),
        ],
        &[("small", 50), ("hog", 700), ("system", 900)],
    );
    let r = s.manager.synchronize().await.unwrap();
    assert!(r.evicted.is_none() && r.round.conditions.is_empty());

    s.stats.set(Signal::MemoryAvailable, 80 * MI, 1000 * MI);
    tokio::time::advance(Duration::from_millis(10)).await;
    let r = s.manager.synchronize().await.unwrap();
    let ev = r.evicted.expect("one pod evicted");
    assert_eq!(ev.uid, "hog");
    assert_eq!(ev.grace_period_seconds, 1);
    assert!(r.round.conditions.contains(&NodeCondition::MemoryPressure));
    let kills = s.pods.kills.lock().clone();
    assert_eq!(kills.len(), 1, "one pod per round");
    let (uid, opts, _) = &kills[0];
    assert_eq!(uid, "hog");
    assert!(opts.evict);
    assert_eq!(opts.reason, "Evicted");
    assert_eq!(opts.grace_period_override, Some(1));
    assert_eq!(
        opts.message,
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 80Mi. \
         Container app was using 700Mi, request is 50Mi, has larger consumption of memory. "
    );
    let cond = opts.condition.as_ref().unwrap();
    assert_eq!(
        (cond.type_.as_str(), cond.status.as_str()),
        ("DisruptionTarget", "True")
    );
    assert_eq!(cond.reason.as_deref(), Some("TerminationByKubelet"));
    assert_eq!(cond.message.as_deref(), Some(opts.message.as_str()));
    assert_eq!(s.manager.metrics().evictions.get("memory.available"), 1);

    // Still under pressure: the next round takes the next pod, never the critical one.
    tokio::time::advance(Duration::from_millis(10)).await;
    let r = s.manager.synchronize().await.unwrap();
    assert_eq!(r.evicted.map(|e| e.uid).as_deref(), Some("small"));
    tokio::time::advance(Duration::from_millis(10)).await;
    let r = s.manager.synchronize().await.unwrap();
    assert!(r.evicted.is_none(), "only a critical pod is left");
    assert_eq!(s.pods.pods.lock().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_evicted_event_carries_the_kubelets_annotations() {
    let (recorder, mut events) = kubelet_api::EventRecorder::channel(16);
    let mut s = setup(
        config("memory.available<100Mi", "", ""),
        vec![pod("hog", 0, Some("50Mi"), false)],
        &[],
    );
    let mut two = usage(700);
    two.containers.push(ContainerUsage {
        name: "side".into(),
        memory_working_set: Some(5000),
        processes: Some(1),
        disk_bytes: None,
    });
    let mut hog = pod("hog", 0, Some("50Mi"), false);
    hog.spec.as_mut().unwrap().containers.push(Container {
        name: "side".into(),
        ..Default::default()
    });
    *s.pods.pods.lock() = vec![hog];
    s.stats.usage.lock().insert("hog".into(), two);
    s.manager = s.manager.with_recorder(recorder, "node-a");
    s.stats.set(Signal::MemoryAvailable, 80 * MI, 1000 * MI);
    let r = s.manager.synchronize().await.unwrap();
    let ev = r.evicted.expect("the hog is evicted");

    let threshold_met = events.try_recv().unwrap();
    assert_eq!(
        (
            threshold_met.reason.as_str(),
            threshold_met.involved.kind.as_str()
        ),
        ("EvictionThresholdMet", "Node")
    );
    assert_eq!(threshold_met.message, "Attempting to reclaim memory");
    assert!(threshold_met.annotations.is_empty());

    let evicted = events.try_recv().unwrap();
    assert_eq!(evicted.reason, "Evicted");
    assert_eq!(evicted.type_, kubelet_api::EventType::Warning);
    assert_eq!(
        (
            evicted.involved.kind.as_str(),
            evicted.involved.name.as_str()
        ),
        ("Pod", "hog")
    );
    assert_eq!(evicted.message, ev.message);
    let expected: std::collections::BTreeMap<String, String> = [
        ("offending_containers", "app,side"),
        ("offending_containers_usage", "700Mi,5000"),
        ("starved_resource", "memory"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(evicted.annotations, expected);
    assert_eq!(ev.annotations, expected);
    assert!(events.try_recv().is_err(), "two events in the round");
}

#[tokio::test(start_paused = true)]
async fn static_pods_are_spared_unless_the_policy_is_switched_off() {
    let pods = vec![
        pod("static-hog", 0, None, true),
        pod("api-pod", 100, None, false),
    ];
    let usages = [("static-hog", 800), ("api-pod", 10)];
    let mut s = setup(
        config("memory.available<100Mi", "", ""),
        pods.clone(),
        &usages,
    );
    s.stats.set(Signal::MemoryAvailable, 50 * MI, 1000 * MI);
    let r = s.manager.synchronize().await.unwrap();
    assert_eq!(r.evicted.map(|e| e.uid).as_deref(), Some("api-pod"));

    let mut cfg = config("memory.available<100Mi", "", "");
    cfg.static_pods_are_critical = false;
    let mut s = setup(cfg, pods, &usages);
    s.stats.set(Signal::MemoryAvailable, 50 * MI, 1000 * MI);
    let r = s.manager.synchronize().await.unwrap();
    assert_eq!(
        r.evicted.map(|e| e.uid).as_deref(),
        Some("static-hog"),
        "lower priority goes first"
    );
}

#[tokio::test(start_paused = true)]
async fn a_soft_threshold_evicts_only_after_its_grace_period_with_the_max_pod_grace() {
    let mut cfg = config("", "memory.available<300Mi", "memory.available=30s");
    cfg.max_pod_grace_period_seconds = 20;
    let s = setup(cfg, vec![pod("p", 0, None, false)], &[("p", 100)]);
    s.stats.set(Signal::MemoryAvailable, 200 * MI, 1000 * MI);
    let shutdown = CancellationToken::new();
    let start = Instant::now();
    let task = tokio::spawn(s.manager.run(shutdown.clone()));
    tokio::time::sleep(Duration::from_secs(29)).await;
    assert!(s.pods.kills.lock().is_empty(), "grace period not over");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let kills = s.pods.kills.lock().clone();
    assert_eq!(kills.len(), 1);
    let waited = kills[0].2 - start;
    assert!(
        waited >= Duration::from_secs(30) && waited < Duration::from_secs(31),
        "{waited:?}"
    );
    assert_eq!(
        kills[0].1.grace_period_override,
        Some(20),
        "min(max pod grace, pod's 30 s)"
    );
    shutdown.cancel();
    task.await.unwrap();
}

/// One hog pod under `memory.available<100Mi`, the fast check every 100 ms.
fn fast_check_setup(kernel_notifications: bool) -> Setup {
    let mut cfg = config("memory.available<100Mi", "", "");
    cfg.fast_poll_interval = Some(Duration::from_millis(100));
    cfg.kernel_notifications = kernel_notifications;
    setup(cfg, vec![pod("hog", 0, None, false)], &[("hog", 900)])
}

#[tokio::test(start_paused = true)]
async fn the_fast_check_detects_a_crossing_long_before_the_full_sync() {
    let s = fast_check_setup(true);
    // Near the threshold (180Mi available, 100Mi threshold): polled every 100 ms.
    s.stats.set(Signal::MemoryAvailable, 180 * MI, 1000 * MI);
    let mut events = s.manager.subscribe();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(s.manager.run(shutdown.clone()));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(s.pods.kills.lock().is_empty());
    let crossed_at = Instant::now();
    s.stats.set(Signal::MemoryAvailable, 60 * MI, 1000 * MI);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let kills = s.pods.kills.lock().clone();
    assert_eq!(kills.len(), 1, "evicted before the 10 s sync");
    let latency = kills[0].2 - crossed_at;
    assert!(
        latency <= Duration::from_millis(100),
        "detected within one poll: {latency:?}"
    );
    let mut saw_crossing = false;
    while let Ok(e) = events.try_recv() {
        if let ManagerEvent::Crossed { signal, source, .. } = e {
            assert_eq!(signal, Signal::MemoryAvailable);
            assert!(
                ["poll", "psi", "memcg threshold", "memory.events"].contains(&source),
                "{source}"
            );
            saw_crossing = true;
        }
    }
    assert!(saw_crossing);
    shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn far_from_the_threshold_the_fast_check_polls_once_a_second() {
    let s = fast_check_setup(false);
    // 900Mi available: far from the 100Mi threshold, so one poll a second (at 0.1 s, 1.1 s,
    // 2.1 s, 3.1 s: the crossing at 2.15 s waits for the one at 3.1 s).
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(s.manager.run(shutdown.clone()));
    tokio::time::sleep(Duration::from_millis(2150)).await;
    let crossed_at = Instant::now();
    s.stats.set(Signal::MemoryAvailable, 60 * MI, 1000 * MI);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        s.pods.kills.lock().is_empty(),
        "not polled 10 times a second when far from the threshold"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    let kills = s.pods.kills.lock().clone();
    assert_eq!(kills.len(), 1, "the relaxed poll still sees it within 1 s");
    assert!(kills[0].2 - crossed_at <= Duration::from_secs(1));
    shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn without_fast_detection_the_full_sync_runs_every_ten_seconds() {
    let mut cfg = config("memory.available<100Mi", "", "");
    cfg.fast_poll_interval = None;
    let s = setup(cfg, vec![pod("hog", 0, None, false)], &[("hog", 900)]);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(s.manager.run(shutdown.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let crossed_at = Instant::now();
    s.stats.set(Signal::MemoryAvailable, 60 * MI, 1000 * MI);
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert!(s.pods.kills.lock().is_empty());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let kills = s.pods.kills.lock().clone();
    assert_eq!(kills.len(), 1);
    assert!(kills[0].2 - crossed_at >= Duration::from_millis(9500));
    shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn memory_pressure_persists_for_the_transition_period_and_drives_admission() {
    let mut s = setup(config("memory.available<100Mi", "", ""), vec![], &[]);
    let admit = s.manager.admit_handler();
    let conditions = s.manager.node_conditions();
    let best_effort = pod("new", 0, None, false);
    let burstable = pod("new2", 0, Some("10Mi"), false);
    assert!(admit.admit(&best_effort, &[]).admit);
    s.stats.set(Signal::MemoryAvailable, 50 * MI, 1000 * MI);
    s.manager.synchronize().await.unwrap();
    let r = admit.admit(&best_effort, &[]);
    assert!(!r.admit);
    assert_eq!(r.reason, "Evicted");
    assert_eq!(r.message, "The node had condition: [MemoryPressure]. ");
    assert!(admit.admit(&burstable, &[]).admit);
    let report: Vec<_> = conditions
        .report()
        .into_iter()
        .map(|c| (c.type_, c.status, c.reason.unwrap(), c.message.unwrap()))
        .collect();
    let has = |t: &str, s: &str, r: &str, m: &str| {
        report
            .iter()
            .any(|c| (c.0.as_str(), c.1.as_str(), c.2.as_str(), c.3.as_str()) == (t, s, r, m))
    };
    assert!(has(
        "MemoryPressure",
        "True",
        "KubeletHasInsufficientMemory",
        "kubelet has insufficient memory available"
    ));
    assert!(has(
        "DiskPressure",
        "False",
        "KubeletHasNoDiskPressure",
        "kubelet has no disk pressure"
    ));

    s.stats.set(Signal::MemoryAvailable, 500 * MI, 1000 * MI);
    tokio::time::advance(Duration::from_secs(299)).await;
    s.manager.synchronize().await.unwrap();
    assert!(
        !admit.admit(&best_effort, &[]).admit,
        "pressure kept for 5 minutes"
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    s.manager.synchronize().await.unwrap();
    assert!(admit.admit(&best_effort, &[]).admit);
    assert!(conditions.active().is_empty());
}

struct FreeingReclaimer {
    stats: Arc<Scripted>,
    calls: Mutex<Vec<&'static str>>,
    frees: bool,
}

#[async_trait]
impl NodeReclaimer for FreeingReclaimer {
    async fn delete_unused_containers(&self) -> kubelet_api::Result<()> {
        self.calls.lock().push("containers");
        Ok(())
    }
    async fn delete_unused_images(&self) -> kubelet_api::Result<()> {
        self.calls.lock().push("images");
        if self.frees {
            self.stats.set(Signal::NodeFsAvailable, 500, 1000);
        }
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn disk_pressure_runs_node_level_reclaim_before_evicting() {
    for frees in [true, false] {
        let s = setup(
            config("nodefs.available<10%", "", ""),
            vec![pod("p", 0, None, false)],
            &[("p", 1)],
        );
        s.stats.set(Signal::NodeFsAvailable, 50, 1000);
        let reclaimer = Arc::new(FreeingReclaimer {
            stats: s.stats.clone(),
            calls: Mutex::new(vec![]),
            frees,
        });
        let mut manager = s
            .manager
            .with_reclaimer(reclaimer.clone(), FsLayout::Single);
        let r = manager.synchronize().await.unwrap();
        assert_eq!(*reclaimer.calls.lock(), vec!["containers", "images"]);
        assert!(r.round.conditions.contains(&NodeCondition::DiskPressure));
        if frees {
            assert!(r.reclaimed && r.evicted.is_none());
        } else {
            assert_eq!(
                r.evicted.map(|e| e.signal).as_deref(),
                Some("nodefs.available")
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn pods_over_their_local_storage_limits_are_evicted_before_thresholds_are_considered() {
    let over = pod_with_scratch_limit("over");
    let mut s = setup(
        config("memory.available<100Mi", "", ""),
        vec![over, pod("hog", 0, None, false)],
        &[("hog", 900)],
    );
    let mut u = usage(10);
    u.volumes.insert("scratch".into(), 20 << 20);
    s.stats.usage.lock().insert("over".into(), u);
    s.stats.set(Signal::MemoryAvailable, 50 * MI, 1000 * MI);
    let r = s.manager.synchronize().await.unwrap();
    assert!(
        r.evicted.is_none(),
        "the round ends after local-storage evictions"
    );
    assert_eq!(r.local_storage_evictions.len(), 1);
    let e = &r.local_storage_evictions[0];
    assert_eq!(
        (e.uid.as_str(), e.signal.as_str()),
        ("over", "emptydirfs.limit")
    );
    assert_eq!(e.grace_period_seconds, 1);
    assert!(
        e.annotations.is_empty(),
        "local-storage evictions carry no annotations, as in the kubelet"
    );
    let kills = s.pods.kills.lock().clone();
    assert_eq!(kills.len(), 1);
    assert_eq!(
        kills[0].1.message,
        "Usage of EmptyDir volume \"scratch\" exceeds the limit \"10Mi\". "
    );
    assert_eq!(s.manager.metrics().evictions.get("emptydirfs.limit"), 1);
    // Next round: the memory threshold takes the hog.
    tokio::time::advance(Duration::from_millis(10)).await;
    let r = s.manager.synchronize().await.unwrap();
    assert_eq!(r.evicted.map(|e| e.uid).as_deref(), Some("hog"));
}

/// While the pod control's count of changes stands still, rounds that found no pod with a
/// local-storage limit do not list the pods again; a pod with a limit that comes with a change
/// is measured and evicted at the next round.
#[tokio::test(start_paused = true)]
async fn rounds_without_local_storage_limits_list_the_pods_again_only_after_a_change() {
    use std::sync::atomic::Ordering;
    let stats = Arc::new(Scripted::default());
    stats.set(Signal::MemoryAvailable, 900 * MI, 1000 * MI);
    let control = Arc::new(Recording {
        counted: true,
        ..Default::default()
    });
    *control.pods.lock() = vec![pod("plain", 0, None, false)];
    let mut manager = EvictionManager::new(
        config("memory.available<100Mi", "", ""),
        stats.clone(),
        control.clone(),
    );
    for _ in 0..3 {
        let r = manager.synchronize().await.unwrap();
        assert!(r.local_storage_evictions.is_empty());
        tokio::time::advance(Duration::from_secs(10)).await;
    }
    assert_eq!(
        control.listings.load(Ordering::SeqCst),
        1,
        "listed once for three rounds without a change"
    );

    let over = pod_with_scratch_limit("over");
    let mut u = usage(10);
    u.volumes.insert("scratch".into(), 20 << 20);
    stats.usage.lock().insert("over".into(), u);
    control.pods.lock().push(over);
    control.changes.fetch_add(1, Ordering::SeqCst);
    let r = manager.synchronize().await.unwrap();
    assert_eq!(control.listings.load(Ordering::SeqCst), 2);
    assert_eq!(
        r.local_storage_evictions
            .iter()
            .map(|e| e.uid.as_str())
            .collect::<Vec<_>>(),
        ["over"]
    );
}

/// Pods that survive kills (a control that cannot kill).
struct Immortal(Vec<Pod>, Mutex<Vec<String>>);

#[async_trait]
impl PodControl for Immortal {
    async fn active_pods(&self) -> Vec<ActivePod> {
        self.0
            .iter()
            .map(|p| ActivePod {
                pod: Arc::new(p.clone()),
                containers: vec![],
            })
            .collect()
    }
    async fn kill_pod(&self, pod: &Pod, _options: KillPodOptions) -> Result<(), EvictionError> {
        self.1.lock().push(kubelet_api::pod::uid(pod).to_string());
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_pod_just_evicted_is_not_chosen_again_until_the_cleanup_timeout() {
    let stats = Arc::new(Scripted::default());
    stats.set(Signal::MemoryAvailable, 50 * MI, 1000 * MI);
    *stats.usage.lock() = [("a".to_string(), usage(900)), ("b".to_string(), usage(100))].into();
    let control = Arc::new(Immortal(
        vec![pod("a", 0, None, false), pod("b", 0, None, false)],
        Mutex::new(vec![]),
    ));
    let mut m = EvictionManager::new(
        config("memory.available<100Mi", "", ""),
        stats,
        control.clone(),
    );
    for _ in 0..3 {
        m.synchronize().await.unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    assert_eq!(
        *control.1.lock(),
        vec!["a", "b"],
        "each pod once, then nothing left to choose"
    );
    tokio::time::advance(Duration::from_secs(30)).await;
    m.synchronize().await.unwrap();
    assert_eq!(
        control.1.lock().last().map(String::as_str),
        Some("a"),
        "after 30 s the survivor is chosen again"
    );
}
