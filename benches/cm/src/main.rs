//! cm-bench: what node resource management costs.
//!
//! * `admission`: the container manager's admit handlers deciding on the 110th pod with 109
//!   admitted pods (requests of every pod cached, as in the engine), against the **floor** of
//!   the same run: computing that one pod's requests.
//! * `cgroups` (root): a pod cgroup's setup (every level created, values written) and teardown
//!   on this machine's cgroups, against a plain `mkdir` + `rmdir` of one cgroup in the memory
//!   hierarchy.
//! * `start` (root): 30 pods to Running on the process runtime through the engine, with pod
//!   cgroups (`cgroupsPerQOS`) and without, alternating.
//!
//! `cargo run --release -p cm-bench -- admission` (or `cgroups`, `start`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bench_support::{ms, percentile};
use clap::{Parser, Subcommand};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kubelet_api::ContainerRuntime;
use kubelet_api::resources::QosClass;
use kubelet_cm::admission::{NodeFacts, ResourceAdmitHandler};
use kubelet_cm::cgroups::{CgroupDriver, Hierarchy};
use kubelet_cm::{CmConfig, ContainerManager};
use kubelet_core::testing::{RecordingSink, WatchSource};
use kubelet_core::{KubeletBuilder, KubeletConfig};

#[derive(Parser, Debug)]
struct Flags {
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand, Debug)]
enum What {
    /// Admission of the 110th pod.
    Admission {
        /// Decisions measured.
        #[arg(long, default_value_t = 20_000)]
        rounds: usize,
    },
    /// Pod cgroup setup and teardown.
    Cgroups {
        /// Pods set up and torn down.
        #[arg(long, default_value_t = 300)]
        pods: usize,
    },
    /// 30 pods to Running with and without pod cgroups.
    Start {
        /// Pods per run.
        #[arg(long, default_value_t = 30)]
        pods: usize,
        /// Runs of each variant.
        #[arg(long, default_value_t = 4)]
        rounds: usize,
    },
}

fn main() -> std::process::ExitCode {
    if let Some(code) = kubelet_process::shim::maybe_run_shim() {
        return code;
    }
    let flags = Flags::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let r = match flags.what {
        What::Admission { rounds } => admission(rounds),
        What::Cgroups { pods } => cgroups(pods),
        What::Start { pods, rounds } => rt.block_on(start(pods, rounds)),
    };
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cm-bench: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn pod(i: usize, cpu: &str, memory: &str) -> Pod {
    let q = |v: &str| Quantity(v.to_string());
    let mut p = Pod {
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "app".into(),
                image: Some("host".into()),
                command: Some(vec!["/bin/sh".into(), "-c".into(), "sleep 600".into()]),
                resources: Some(ResourceRequirements {
                    requests: Some(
                        [
                            ("cpu".to_string(), q(cpu)),
                            ("memory".to_string(), q(memory)),
                        ]
                        .into(),
                    ),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            host_network: Some(true),
            termination_grace_period_seconds: Some(1),
            ..Default::default()
        }),
        ..Default::default()
    };
    p.metadata.name = Some(format!("bench-{i}"));
    p.metadata.namespace = Some("default".into());
    p.metadata.uid = Some(format!("cm-bench-{}-{i}", std::process::id()));
    p
}

fn admission(rounds: usize) -> anyhow::Result<()> {
    use kubelet_api::PodAdmitHandler;
    let facts = NodeFacts {
        node_name: "bench".into(),
        labels: Default::default(),
        allocatable: [
            ("cpu".to_string(), 64_000),
            ("memory".into(), 256 << 30),
            ("pods".into(), 110),
        ]
        .into(),
    };
    let handler = ResourceAdmitHandler::new(Arc::new(parking_lot::RwLock::new(facts)));
    let active: Vec<Arc<Pod>> = (0..109)
        .map(|i| Arc::new(pod(i, "100m", "128Mi")))
        .collect();
    for p in &active {
        assert!(handler.admit(p, &[]).admit);
    }
    let new = pod(109, "250m", "256Mi");
    let mut decide = Vec::with_capacity(rounds);
    let mut floor = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        handler.forget(new.metadata.uid.as_deref().unwrap_or_default());
        let t = Instant::now();
        let r = handler.admit(&new, &active);
        decide.push(t.elapsed());
        assert!(r.admit, "{r:?}");
        let t = Instant::now();
        let req = kubelet_api::resources::pod_requests(&new)?;
        floor.push(t.elapsed());
        std::hint::black_box(req);
    }
    decide.sort();
    floor.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "admission of the 110th pod ({rounds} decisions): p50 {:.1} µs, p99 {:.1} µs (goal ≤ 100 µs)",
        us(percentile(&decide, 0.5)),
        us(percentile(&decide, 0.99))
    );
    println!(
        "floor (that pod's requests alone): p50 {:.2} µs, p99 {:.2} µs; ratio p50 {:.1}×",
        us(percentile(&floor, 0.5)),
        us(percentile(&floor, 0.99)),
        percentile(&decide, 0.5).as_secs_f64() / percentile(&floor, 0.5).as_secs_f64()
    );
    Ok(())
}

fn cgroups(pods: usize) -> anyhow::Result<()> {
    anyhow::ensure!(nix::unistd::Uid::effective().is_root(), "needs root");
    let root = format!("/cm-bench-{}", std::process::id());
    let h = Hierarchy::detect(CgroupDriver::Cgroupfs, &root)
        .ok_or_else(|| anyhow::anyhow!("no cgroup hierarchy"))?;
    let p = pod(0, "250m", "64Mi");
    let values = kubelet_cm::cgroups::pod_values(&p, QosClass::Burstable, true, 1024)?;
    // Create the tiers first, as the manager does at its start.
    h.ensure(&h.tier(QosClass::Burstable), &Default::default())?;
    let memory_root = h
        .dir("memory", &kubelet_cm::cgroups::root_name(&root))
        .ok_or_else(|| anyhow::anyhow!("no memory hierarchy"))?;
    let (mut setup, mut teardown, mut floor) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..pods {
        let name = h.pod(QosClass::Burstable, &format!("bench{i}"));
        let t = Instant::now();
        h.ensure(&name, &values)?;
        setup.push(t.elapsed());
        let t = Instant::now();
        h.destroy(&name)?;
        teardown.push(t.elapsed());
        let plain = memory_root.join(format!("plain{i}"));
        let t = Instant::now();
        std::fs::create_dir(&plain)?;
        std::fs::remove_dir(&plain)?;
        floor.push(t.elapsed());
    }
    h.destroy(h.kubepods())?;
    for d in
        kubelet_stats::cgroup::parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo")?)
            .all_v1
    {
        let _ = std::fs::remove_dir(d.join(root.trim_start_matches('/')));
    }
    for v in [&mut setup, &mut teardown, &mut floor] {
        v.sort();
    }
    let p = |v: &[Duration], q: f64| ms(percentile(v, q));
    println!(
        "pod cgroup ({:?}, {pods} pods): setup p50 {:.3} ms p99 {:.3} ms; teardown p50 {:.3} ms p99 {:.3} ms",
        h.version(),
        p(&setup, 0.5),
        p(&setup, 0.99),
        p(&teardown, 0.5),
        p(&teardown, 0.99)
    );
    println!(
        "floor (mkdir + rmdir of one memory cgroup): p50 {:.3} ms; setup + teardown / floor = {:.1}×",
        p(&floor, 0.5),
        (p(&setup, 0.5) + p(&teardown, 0.5)) / p(&floor, 0.5)
    );
    Ok(())
}

async fn start(pods: usize, rounds: usize) -> anyhow::Result<()> {
    anyhow::ensure!(nix::unistd::Uid::effective().is_root(), "needs root");
    let mut with = Vec::new();
    let mut without = Vec::new();
    for round in 0..rounds * 2 {
        let cgroups = round % 2 == 0;
        let d = one_start(pods, cgroups, round).await?;
        println!(
            "round {round}: {pods} pods Running in {:.0} ms ({})",
            ms(d),
            if cgroups {
                "pod cgroups"
            } else {
                "no pod cgroups"
            }
        );
        if cgroups {
            with.push(d);
        } else {
            without.push(d);
        }
    }
    with.sort();
    without.sort();
    let (a, b) = (percentile(&with, 0.5), percentile(&without, 0.5));
    println!(
        "{pods} pods to Running, median of {rounds}: with pod cgroups {:.0} ms, without {:.0} ms: {:.3}× (goal ≤ 1.05×)",
        ms(a),
        ms(b),
        a.as_secs_f64() / b.as_secs_f64()
    );
    Ok(())
}

async fn one_start(pods: usize, cgroups: bool, round: usize) -> anyhow::Result<Duration> {
    let dir = tempfile::tempdir()?;
    let root_name = format!("cm-bench-start-{}-{round}", std::process::id());
    let runtime: Arc<dyn ContainerRuntime> = Arc::new(kubelet_process::ProcessRuntime::new(
        kubelet_process::ProcessRuntimeConfig::new(dir.path().join("runtime"))
            .shim(kubelet_process::ShimCommand::CurrentExe)
            .cgroup_parent(format!("{root_name}-rt")),
    )?);
    let mut config = CmConfig::default();
    config.root_dir = dir.path().join("root");
    config.cgroups_per_qos = cgroups;
    config.cgroup_root = format!("/{root_name}");
    let cm = ContainerManager::new("bench", config)?;
    let list: Vec<Pod> = (0..pods)
        .map(|i| {
            let mut p = pod(i, "10m", "16Mi");
            p.metadata.uid = Some(format!("{root_name}-{i}"));
            p
        })
        .collect();
    let uids: Vec<String> = list.iter().filter_map(|p| p.metadata.uid.clone()).collect();
    let (pleg, pleg_events) = kubelet_pleg::GenericPleg::new(runtime.clone(), Default::default());
    let sink = Arc::new(RecordingSink::new());
    let (source, tx) = WatchSource::new(None);
    let kubelet = KubeletBuilder::new("bench")
        .config(KubeletConfig::with_dirs(
            dir.path().join("root"),
            dir.path().join("logs"),
        ))
        .runtime(runtime.clone())
        .pleg(Arc::new(pleg), pleg_events)
        .pod_source(Arc::new(source))
        .status_sink(sink.clone())
        .plugin(Arc::new(cm))
        .build()?;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(kubelet.run(shutdown.clone()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = Instant::now();
    tx.send(Some(list))?;
    loop {
        let running = uids
            .iter()
            .filter(|u| {
                sink.latest(u)
                    .is_some_and(|s| s.phase.as_deref() == Some("Running"))
            })
            .count();
        if running == uids.len() {
            break;
        }
        anyhow::ensure!(t.elapsed() < Duration::from_secs(120), "pods did not start");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = t.elapsed();
    // Tear down: the pods go, then the agent.
    tx.send(Some(vec![]))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !runtime
        .list_pod_sandboxes(&Default::default())
        .await?
        .is_empty()
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    shutdown.cancel();
    let _ = task.await;
    let mounts =
        kubelet_stats::cgroup::parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo")?);
    for m in mounts.all_v1.iter().chain(&mounts.v2) {
        for name in [root_name.clone(), format!("{root_name}-rt")] {
            for sub in ["kubepods/burstable", "kubepods/besteffort", "kubepods", ""] {
                let _ = std::fs::remove_dir(m.join(&name).join(sub));
            }
        }
    }
    Ok(took)
}
