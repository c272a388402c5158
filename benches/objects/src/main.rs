//! `objects-bench`: the ConfigMap figures of the cluster-environment issue, on a private etcd +
//! kube-apiserver 1.20.2 (`kubelet-testenv`; needs root like the tests).
//!
//! 1. **Watch fan-in.** `--pods` pod objects (default 1,000) bound to the node share
//!    `--config-maps` ConfigMaps (default 10), one volume each. An [`ApiObjects`] with the node's
//!    credentials and the default `Watch` strategy registers every pod and reads each pod's
//!    ConfigMap as a volume set-up does. Printed: the watches it keeps open, the node's
//!    `list`/`watch`/`get` requests on ConfigMaps from the API server's audit log, the time of the
//!    first reads (watches listing) and of a second round (served from the watches), and the
//!    watches left after the pods are unregistered.
//! 2. **Update → file.** A real agent (the engine with the API-server plugin, the process
//!    runtime, the default evented PLEG or `--relist`, and the kubelet's 1-minute sync period) runs `--agent-pods` pods (default 20)
//!    mounting the same ConfigMaps. Each of `--updates` rounds patches one ConfigMap and polls the
//!    files of the pods that mount it every millisecond. The baseline, measured in the same
//!    run: an admin watch on the same ConfigMap, from the patch to the event's arrival (the API
//!    server's own propagation). Printed: p50/p99 of both and the ratio.
//!
//! ```text
//! CARGO_TARGET_DIR=/work/target-perf cargo build --release -p objects-bench
//! /work/target-perf/release/objects-bench
//! ```

use bench_support::{ms, percentile};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kubelet_api::{ContainerRuntime, ObjectProvider};
use kubelet_apiserver::kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kubelet_apiserver::kube::runtime::watcher;
use kubelet_apiserver::kube::{Api, Client};
use kubelet_apiserver::{ApiObjects, ApiServer, ApiServerConfig, client_from_kubeconfig};
use kubelet_core::{KubeletBuilder, KubeletConfig};
use kubelet_pleg::{PlegKind, new_pleg};
use kubelet_process::{ProcessRuntime, ProcessRuntimeConfig, ShimCommand};
use kubelet_testenv::ApiServerEnv;
use tokio_util::sync::CancellationToken;

const NODE: &str = "objects-bench-node";
const NS: &str = "default";

/// Command-line flags.
#[derive(Debug, Parser)]
#[command(
    name = "objects-bench",
    about = "ConfigMap watch fan-in and update-to-file delay"
)]
struct Args {
    /// Pod objects sharing the ConfigMaps in the fan-in phase.
    #[arg(long, default_value_t = 1000)]
    pods: usize,
    /// ConfigMaps.
    #[arg(long, default_value_t = 10)]
    config_maps: usize,
    /// Running pods in the update phase.
    #[arg(long, default_value_t = 20)]
    agent_pods: usize,
    /// ConfigMap updates in the update phase.
    #[arg(long, default_value_t = 50)]
    updates: usize,
    /// Run the agent on the relist PLEG (`EventedPLEG=false`) instead of the default evented
    /// one.
    #[arg(long)]
    relist: bool,
}

fn main() -> ExitCode {
    // The process runtime's per-container supervisor is this executable.
    if let Some(code) = kubelet_process::shim::maybe_run_shim() {
        return code;
    }
    let args = Args::parse();
    // Diagnostics on stderr when RUST_LOG is set (`level` or `target=level` directives).
    if let Some(filter) = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| v.parse::<tracing_subscriber::filter::Targets>().ok())
    {
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::util::SubscriberInitExt;
        tracing_subscriber::registry()
            .with(filter)
            .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
            .init();
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("objects-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("objects-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn cm_name(i: usize) -> String {
    format!("shared-{i}")
}

fn pod(name: &str, config_map: &str, label: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name, "labels": { "bench": label } },
        "spec": {
            "nodeName": NODE, "hostNetwork": true, "terminationGracePeriodSeconds": 1,
            "volumes": [{ "name": "conf", "configMap": { "name": config_map } }],
            "containers": [{
                "name": "app", "image": "busybox",
                "command": ["/bin/sh", "-c", "exec sleep 100000", name],
            }],
        },
    }))?)
}

/// The ConfigMap a bench pod mounts.
fn mounted_config_map(p: &Pod) -> String {
    p.spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .and_then(|v| v.first())
        .and_then(|v| v.config_map.as_ref())
        .map(|c| c.name.clone())
        .unwrap_or_default()
}

async fn create_pods(api: &Api<Pod>, pods: Vec<Pod>) -> anyhow::Result<Vec<Pod>> {
    futures::stream::iter(pods)
        .map(|p| {
            let api = api.clone();
            async move { api.create(&PostParams::default(), &p).await }
        })
        .buffer_unordered(16)
        .try_collect()
        .await
        .context("creating pods")
}

async fn run(args: Args) -> anyhow::Result<()> {
    let Some(env) = ApiServerEnv::start_for_node("objects-bench", NODE) else {
        bail!("no API server environment (run as root; see scripts/apiserver-test-env.sh)");
    };
    let admin = client_from_kubeconfig(env.admin_kubeconfig()).await?;
    let node = client_from_kubeconfig(env.node_kubeconfig()).await?;
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    for i in 0..args.config_maps {
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": cm_name(i) },
            "data": { "value": "0" },
        }))?;
        cms.create(&PostParams::default(), &cm).await?;
    }

    fan_in(&args, &env, &node, &pods).await?;
    update_to_file(&args, &env, &cms, &pods).await
}

async fn fan_in(
    args: &Args,
    env: &ApiServerEnv,
    node: &Client,
    pods: &Api<Pod>,
) -> anyhow::Result<()> {
    let wanted = (0..args.pods)
        .map(|i| pod(&format!("fan-{i}"), &cm_name(i % args.config_maps), "fan"))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let created = create_pods(pods, wanted).await?;
    let objects = ApiObjects::new(node.clone());
    let started = Instant::now();
    for p in &created {
        objects.register_pod(p);
    }
    let register = started.elapsed();
    let read_all = |objects: ApiObjects, created: Vec<Pod>| async move {
        let started = Instant::now();
        for p in &created {
            let name = mounted_config_map(p);
            let got = objects.config_map(NS, &name).await?;
            if got.is_none() {
                bail!("ConfigMap {name} not found");
            }
        }
        Ok::<_, anyhow::Error>(started.elapsed())
    };
    let first = read_all(objects.clone(), created.clone()).await?;
    let second = read_all(objects.clone(), created.clone()).await?;
    let open = objects.active_watches();
    for p in &created {
        objects.unregister_pod(p);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let left = objects.active_watches();
    // A watch reaches the audit log when it ends: count after unregistering closed them.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let user = format!("system:node:{NODE}");
    let mut by_verb: HashMap<String, HashSet<String>> = HashMap::new();
    for e in env.audit_events() {
        if e.user == user && e.resource == "configmaps" {
            by_verb.entry(e.verb).or_default().insert(e.audit_id);
        }
    }
    let count = |v: &str| by_verb.get(v).map_or(0, HashSet::len);
    pods.delete_collection(
        &DeleteParams::default().grace_period(0),
        &ListParams::default().labels("bench=fan"),
    )
    .await?;

    println!(
        "fan-in: {} pods sharing {} ConfigMaps (Watch strategy)",
        args.pods, args.config_maps
    );
    println!("  watches open                     {open}");
    println!(
        "  node requests on configmaps      list {} · watch {} · get {}",
        count("list"),
        count("watch"),
        count("get")
    );
    println!(
        "  register {} pods                {:>8.2} ms",
        args.pods,
        ms(register)
    );
    println!(
        "  first reads (watches listing)    {:>8.2} ms for {} reads",
        ms(first),
        args.pods
    );
    println!(
        "  later reads (from the watches)   {:>8.2} µs per read",
        second.as_secs_f64() * 1e6 / args.pods.max(1) as f64
    );
    println!("  watches after unregistering      {left}");
    println!(
        "JSON {}",
        serde_json::json!({
            "phase": "fan-in", "pods": args.pods, "config_maps": args.config_maps,
            "watches_open": open, "watches_after": left,
            "node_lists": count("list"), "node_watches": count("watch"), "node_gets": count("get"),
            "first_reads_ms": ms(first), "later_read_us": second.as_secs_f64() * 1e6 / args.pods.max(1) as f64,
        })
    );
    Ok(())
}

/// Arrival times of each ConfigMap `resourceVersion` at a plain admin watch: the baseline.
type Seen = Arc<std::sync::Mutex<HashMap<String, Instant>>>;

fn baseline_watch(cms: Api<ConfigMap>, shutdown: CancellationToken) -> Seen {
    let seen: Seen = Default::default();
    let out = seen.clone();
    tokio::spawn(async move {
        let stream = watcher::watcher(cms, watcher::Config::default());
        let mut stream = std::pin::pin!(stream);
        loop {
            let next = tokio::select! {
                _ = shutdown.cancelled() => return,
                n = stream.next() => n,
            };
            match next {
                Some(Ok(watcher::Event::Apply(cm))) => {
                    if let Some(rv) = cm.metadata.resource_version
                        && let Ok(mut s) = out.lock()
                    {
                        s.insert(rv, Instant::now());
                    }
                }
                Some(_) => {}
                None => return,
            }
        }
    });
    seen
}

async fn update_to_file(
    args: &Args,
    env: &ApiServerEnv,
    cms: &Api<ConfigMap>,
    pods: &Api<Pod>,
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let root = dir.path().join("root");
    let runtime = Arc::new(ProcessRuntime::new(
        ProcessRuntimeConfig::new(dir.path().join("state"))
            .shim(ShimCommand::CurrentExe)
            .use_cgroups(false),
    )?);
    let runtime: Arc<dyn ContainerRuntime> = runtime;
    let kind = if args.relist {
        PlegKind::Relist
    } else {
        PlegKind::Evented
    };
    let (pleg, pleg_events) = new_pleg(kind, runtime.clone());
    let api = ApiServer::from_kubeconfig(
        env.node_kubeconfig(),
        NODE,
        ApiServerConfig::default().root_dir(&root),
    )
    .await?;
    // The kubelet's 1-minute sync period: only the watch brings an update sooner.
    let config = KubeletConfig::with_dirs(&root, dir.path().join("logs"));
    let kubelet = KubeletBuilder::new(NODE)
        .config(config)
        .runtime(runtime.clone())
        .pleg(pleg, pleg_events)
        .plugin(Arc::new(api))
        .build()?;
    let shutdown = CancellationToken::new();
    let agent = tokio::spawn(kubelet.run(shutdown.clone()));

    let wanted = (0..args.agent_pods)
        .map(|i| pod(&format!("run-{i}"), &cm_name(i % args.config_maps), "run"))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let created = create_pods(pods, wanted).await?;
    let file = |p: &Pod| -> PathBuf {
        root.join("pods")
            .join(p.metadata.uid.as_deref().unwrap_or_default())
            .join("volumes/kubernetes.io~configmap/conf/value")
    };
    // `created` is in completion order: group the files by the ConfigMap each pod mounts.
    let by_cm: Vec<Vec<PathBuf>> = (0..args.config_maps)
        .map(|c| {
            created
                .iter()
                .filter(|p| mounted_config_map(p) == cm_name(c))
                .map(file)
                .collect()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !created.iter().all(|p| file(p).exists()) {
        if Instant::now() > deadline {
            bail!("the pods' volumes were not set up within 120 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stop_baseline = CancellationToken::new();
    let seen = baseline_watch(cms.clone(), stop_baseline.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;

    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    let (mut baseline, mut each, mut all) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..args.updates {
        let c = round % args.config_maps;
        let value = format!("{}", round + 1);
        let files = &by_cm[c];
        let t0 = Instant::now();
        let patched = cms
            .patch(
                &cm_name(c),
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "data": { "value": value } })),
            )
            .await?;
        let rv = patched.metadata.resource_version.unwrap_or_default();
        let mut pending: Vec<&PathBuf> = files.iter().collect();
        let limit = t0 + Duration::from_secs(30);
        while !pending.is_empty() {
            pending.retain(|f| {
                if read(f) == value {
                    each.push(t0.elapsed());
                    false
                } else {
                    true
                }
            });
            if Instant::now() > limit {
                bail!(
                    "update {round} did not reach {} files in 30 s",
                    pending.len()
                );
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        all.push(t0.elapsed());
        let base = loop {
            if let Some(at) = seen.lock().ok().and_then(|s| s.get(&rv).copied()) {
                break at.saturating_duration_since(t0);
            }
            if Instant::now() > limit {
                bail!("the baseline watch never saw update {round}");
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        baseline.push(base);
        // Let the pods settle between rounds.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop_baseline.cancel();
    for v in [&mut baseline, &mut each, &mut all] {
        v.sort();
    }
    let per = args.agent_pods / args.config_maps.max(1);
    println!(
        "update → file: {} updates, {} running pods, {per} per ConfigMap, sync period 1 m, {:?} PLEG",
        args.updates, args.agent_pods, kind
    );
    println!("                                   p50 ms    p99 ms");
    let row = |name: &str, v: &[Duration]| {
        println!(
            "  {name:<32} {:>7.1}   {:>7.1}",
            ms(percentile(v, 0.5)),
            ms(percentile(v, 0.99))
        );
    };
    row("admin watch sees it (baseline)", &baseline);
    row("one pod's file updated", &each);
    row("all pods' files updated", &all);
    let ratio = |p: f64| ms(percentile(&each, p)) / ms(percentile(&baseline, p)).max(0.001);
    println!(
        "  file / baseline                  {:>7.2}×  {:>7.2}×",
        ratio(0.5),
        ratio(0.99)
    );
    println!(
        "JSON {}",
        serde_json::json!({
            "phase": "update-to-file", "updates": args.updates, "pods": args.agent_pods,
            "pleg": format!("{kind:?}"),
            "baseline_p50_ms": ms(percentile(&baseline, 0.5)), "baseline_p99_ms": ms(percentile(&baseline, 0.99)),
            "file_p50_ms": ms(percentile(&each, 0.5)), "file_p99_ms": ms(percentile(&each, 0.99)),
            "all_p50_ms": ms(percentile(&all, 0.5)), "all_p99_ms": ms(percentile(&all, 0.99)),
        })
    );

    pods.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels("bench=run"),
    )
    .await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !runtime
        .list_containers(&Default::default())
        .await?
        .is_empty()
    {
        if Instant::now() > deadline {
            bail!("containers left after deleting the pods");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    shutdown.cancel();
    let _ = agent.await;
    Ok(())
}
