//! Exec probes against real processes run by the process runtime (`kubelet-process`), alone and
//! through the engine. Runs without the libtest harness: this binary is also the runtime's shim
//! (`ShimCommand::CurrentExe`), so `main` hands over to the shim first.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, ExecAction, Pod, PodSpec, PodStatus, Probe};
use kubelet_api::ContainerRuntime;
use kubelet_api::runtime::{ContainerConfig, PodSandboxConfig};
use kubelet_core::testing::{RecordingSink, WatchSource};
use kubelet_core::{KubeletBuilder, KubeletConfig};
use kubelet_pleg::{GenericPleg, GenericPlegConfig};
use kubelet_probe::{Outcome, ProbeHandler, Prober, ProberConfig, StaticTargets};
use kubelet_process::{ProcessRuntime, ProcessRuntimeConfig, ShimCommand};
use tokio_util::sync::CancellationToken;

fn main() -> ExitCode {
    if let Some(code) = kubelet_process::shim::maybe_run_shim() {
        return code;
    }
    let tests: [(&str, TestFn); 2] = [
        (
            "exec_probes_run_in_real_containers_with_exit_codes_output_and_timeouts",
            |d| Box::pin(exec_probes_run_in_real_containers(d)) as Fut,
        ),
        (
            "an_exec_liveness_probe_restarts_a_process_container_through_the_engine",
            |d| Box::pin(exec_liveness_restarts_through_the_engine(d)) as Fut,
        ),
    ];
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        for (name, _) in &tests {
            println!("{name}: test");
        }
        return ExitCode::SUCCESS;
    }
    let filter = args.iter().find(|a| !a.starts_with('-')).cloned();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut passed = 0;
    let mut failed = 0;
    for (name, test) in tests {
        if filter.as_deref().is_some_and(|f| !name.contains(f)) {
            continue;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let result = rt.block_on(async move { tokio::spawn(test(&path)).await });
        match result {
            Ok(()) => {
                println!("test {name} ... ok");
                passed += 1;
            }
            Err(e) => {
                println!("test {name} ... FAILED: {e}");
                failed += 1;
            }
        }
    }
    println!(
        "\ntest result: {}. {passed} passed; {failed} failed; 0 ignored; 0 measured; 0 filtered out",
        if failed == 0 { "ok" } else { "FAILED" }
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

type Fut = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'static>>;
type TestFn = fn(&Path) -> Fut;

fn runtime(dir: &Path) -> Arc<ProcessRuntime> {
    Arc::new(
        ProcessRuntime::new(
            ProcessRuntimeConfig::new(dir.join("state"))
                .shim(ShimCommand::CurrentExe)
                .use_cgroups(false),
        )
        .unwrap(),
    )
}

fn exec_probes_run_in_real_containers(
    dir: &Path,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let dir = dir.to_path_buf();
    async move {
        let rt = runtime(&dir);
        let sb = {
            let mut v = PodSandboxConfig::default();
            v.log_directory = dir.join("logs");
            v
        };
        let sid = rt.run_pod_sandbox(&sb).await.unwrap();
        let c = {
            let mut v = ContainerConfig::default();
            v.command = vec!["/bin/sh".into(), "-c".into(), "sleep 120".into()];
            v.log_path = "c/0.log".into();
            v
        };
        let cid = rt.create_container(&sid, &c, &sb).await.unwrap();
        rt.start_container(&cid).await.unwrap();

        let (prober, _updates) = Prober::new(ProberConfig::default());
        let targets = StaticTargets::with_runtime(rt.clone());
        let exec = |script: &str| ProbeHandler::Exec {
            command: vec!["/bin/sh".into(), "-c".into(), script.into()],
        };
        let t = Duration::from_secs(10);
        assert!(matches!(
            prober
                .probe_once(&exec("exit 0"), None, &cid, t, &targets)
                .await,
            Outcome::Success(_)
        ));
        assert_eq!(
            prober
                .probe_once(&exec("echo unhealthy; exit 3"), None, &cid, t, &targets)
                .await,
            Outcome::Failure("unhealthy\n".into())
        );
        match prober
            .probe_once(
                &exec("head -c 50000 /dev/zero | tr '\\0' x"),
                None,
                &cid,
                t,
                &targets,
            )
            .await
        {
            Outcome::Success(out) => assert_eq!(out.len(), 10 * 1024, "output capped at 10 KiB"),
            other => panic!("big output: {other:?}"),
        }
        assert_eq!(
            prober
                .probe_once(
                    &exec("sleep 30"),
                    None,
                    &cid,
                    Duration::from_secs(1),
                    &targets
                )
                .await,
            Outcome::Failure("command \"/bin/sh -c sleep 30\" timed out".into())
        );
        match prober
            .probe_once(&exec("exit 0"), None, "no-such-container", t, &targets)
            .await
        {
            Outcome::Error(_) => {}
            other => panic!("unknown container must be an error: {other:?}"),
        }
        rt.stop_pod_sandbox(&sid).await.unwrap();
        rt.remove_pod_sandbox(&sid).await.unwrap();
    }
}

fn restarts(s: &PodStatus) -> i32 {
    s.container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == "app")
        .map_or(0, |c| c.restart_count)
}

fn running_and_ready(s: &PodStatus) -> bool {
    s.container_statuses.iter().flatten().any(|c| {
        c.name == "app" && c.ready && c.state.as_ref().is_some_and(|st| st.running.is_some())
    })
}

async fn wait(
    sink: &RecordingSink,
    from: usize,
    what: &str,
    f: impl Fn(&PodStatus) -> bool,
) -> PodStatus {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(s) = sink
            .statuses("exec-1")
            .into_iter()
            .skip(from)
            .find(|s| f(s))
        {
            return s;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}: {:#?}",
            sink.latest("exec-1")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn exec_liveness_restarts_through_the_engine(
    dir: &Path,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let dir = dir.to_path_buf();
    async move {
        let healthy = dir.join("healthy");
        std::fs::write(&healthy, b"").unwrap();
        let probe = |failure: i32| Probe {
            exec: Some(ExecAction {
                command: Some(vec![
                    "/bin/sh".into(),
                    "-c".into(),
                    format!("test -f {}", healthy.display()),
                ]),
            }),
            period_seconds: Some(1),
            failure_threshold: Some(failure),
            ..Default::default()
        };
        let mut p = Pod {
            spec: Some(PodSpec {
                restart_policy: Some("Always".into()),
                containers: vec![Container {
                    name: "app".into(),
                    image: Some("host".into()),
                    command: Some(vec!["/bin/sh".into(), "-c".into(), "sleep 3600".into()]),
                    liveness_probe: Some(probe(2)),
                    readiness_probe: Some(probe(1)),
                    ..Default::default()
                }],
                host_network: Some(true),
                termination_grace_period_seconds: Some(1),
                ..Default::default()
            }),
            ..Default::default()
        };
        p.metadata.name = Some("exec".into());
        p.metadata.namespace = Some("default".into());
        p.metadata.uid = Some("exec-1".into());

        let runtime: Arc<dyn ContainerRuntime> = runtime(&dir);
        let (pleg, pleg_events) = GenericPleg::new(runtime.clone(), GenericPlegConfig::default());
        let pleg = std::sync::Arc::new(pleg);
        let sink = Arc::new(RecordingSink::new());
        let (source, tx) = WatchSource::new(Some(vec![p]));
        let (prober, probe_updates) = Prober::new(ProberConfig::default());
        let kubelet = KubeletBuilder::new("node-1")
            .config(KubeletConfig::with_dirs(dir.join("root"), dir.join("logs")))
            .runtime(runtime.clone())
            .pleg(pleg, pleg_events)
            .pod_source(Arc::new(source))
            .status_sink(sink.clone())
            .prober(Arc::new(prober), probe_updates)
            .build()
            .unwrap();
        let shutdown = CancellationToken::new();
        let agent = tokio::spawn(kubelet.run(shutdown.clone()));

        let s = wait(&sink, 0, "running and ready", running_and_ready).await;
        assert_eq!(restarts(&s), 0);
        let mark = sink.statuses("exec-1").len();
        std::fs::remove_file(&healthy).unwrap();
        let ev = sink
            .wait_for_event(
                |e| e.reason == "Unhealthy" && e.message.starts_with("Liveness probe failed"),
                Duration::from_secs(120),
            )
            .await
            .unwrap();
        assert_eq!(ev.involved.name, "exec");
        wait(&sink, mark, "unready", |s| {
            s.container_statuses
                .iter()
                .flatten()
                .any(|c| c.name == "app" && !c.ready)
                && restarts(s) == 0
        })
        .await;
        let kill = sink
            .wait_for_event(|e| e.reason == "Killing", Duration::from_secs(120))
            .await
            .unwrap();
        assert!(
            kill.message.contains("failed liveness probe"),
            "{}",
            kill.message
        );
        std::fs::write(&healthy, b"").unwrap();
        let s = wait(&sink, mark, "restarted and ready", |s| {
            restarts(s) >= 1 && running_and_ready(s)
        })
        .await;
        assert!(restarts(&s) >= 1);

        // Remove the pod so that the engine stops its processes, then stop the agent.
        tx.send(Some(Vec::new())).unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        while !sink.removed().iter().any(|u| u == "exec-1") {
            assert!(tokio::time::Instant::now() < deadline, "pod not removed");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        shutdown.cancel();
        let _ = agent.await;
        let left = runtime
            .list_containers(&Default::default())
            .await
            .unwrap()
            .into_iter()
            .filter(|c| c.state == kubelet_api::runtime::ContainerState::Running)
            .count();
        assert_eq!(left, 0, "no container left running");
    }
}
