//! `CriRuntime` and the engine against a real, private containerd 1.6 (one per test, started by
//! `scripts/containerd-test-env.sh`). Needs root; skipped with a message otherwise, and failing
//! instead when `KUBELET_SDK_REQUIRE_ROOT=1` (CI).

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{
    Agent, ContainerdEnv, container, container_ids, containers_of, eventually, phase, pod, running,
    sandboxes_of,
};
use k8s_openapi::api::core::v1::{
    EnvVar, EnvVarSource, HostPathVolumeSource, ObjectFieldSelector, ResourceRequirements,
    SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kubelet_api::ErrorKind;
use kubelet_api::runtime::{
    ContainerConfig, ContainerMetadata, ContainerState, ImageSpec, Labels, PodSandboxConfig,
    PodSandboxMetadata, RuntimeStatus, SandboxState,
};
use kubelet_api::{ContainerRuntime, ImageService};
use tokio::sync::watch;

const LONG: Duration = Duration::from_secs(90);

fn sandbox_config(uid: &str, host_network: bool, env: &ContainerdEnv) -> PodSandboxConfig {
    let mut labels = Labels::new();
    labels.insert(kubelet_api::runtime::labels::POD_UID.into(), uid.into());
    {
        let mut v = PodSandboxConfig::default();
        v.metadata = PodSandboxMetadata {
            name: format!("direct-{uid}"),
            namespace: "default".into(),
            uid: uid.into(),
            attempt: 0,
        };
        v.hostname = format!("direct-{uid}");
        v.log_directory = env.dir.join("logs").join(uid);
        v.labels = labels;
        v.host_network = host_network;
        v
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_calls_cover_a_pods_life_on_containerd() {
    let Some(env) = ContainerdEnv::start("direct_calls_cover_a_pods_life_on_containerd") else {
        return;
    };
    let rt = env.runtime().await;

    let v = rt.version().await.unwrap();
    assert_eq!(v.runtime_name, "containerd");
    assert_eq!(v.runtime_api_version, "v1");
    let status = rt.status().await.unwrap();
    for cond in [RuntimeStatus::RUNTIME_READY, RuntimeStatus::NETWORK_READY] {
        assert!(
            status.condition(cond).is_some_and(|c| c.status),
            "{cond} not true: {status:?}"
        );
    }
    assert_eq!(
        rt.sandbox_image().await.unwrap().as_deref(),
        Some(env.pause.as_str())
    );
    let check = rt.ensure_sandbox_image(&env.pause).await.unwrap();
    assert!(check.matches_runtime && !check.pulled, "{check:?}");
    let check = rt.ensure_sandbox_image(&env.busybox).await.unwrap();
    assert!(!check.matches_runtime && !check.pulled, "{check:?}");
    let e = rt
        .ensure_sandbox_image("localhost:1/kubelet-sdk/absent:1")
        .await
        .unwrap_err();
    assert!(e.to_string().contains("PullImage"), "{e}");

    let present = rt
        .image_status(&ImageSpec::new(env.busybox.clone()))
        .await
        .unwrap();
    assert!(present.is_some_and(|i| !i.id.is_empty()));
    let missing = rt
        .image_status(&ImageSpec::new("localhost/kubelet-sdk/absent:1"))
        .await
        .unwrap();
    assert!(missing.is_none());

    // The image filesystem is containerd's overlayfs snapshotter root, under the private root.
    let fs = rt.image_fs_info().await.unwrap();
    assert_eq!(fs.image_filesystems.len(), 1, "{fs:?}");
    let image_fs = &fs.image_filesystems[0];
    assert!(
        image_fs.mountpoint.starts_with(env.dir.join("root")) && image_fs.mountpoint.is_dir(),
        "{fs:?}"
    );
    assert!(
        image_fs.used_bytes.is_some() && image_fs.inodes_used.is_some(),
        "{fs:?}"
    );
    assert!(image_fs.timestamp > jiff::Timestamp::UNIX_EPOCH, "{fs:?}");

    // A pod-network sandbox gets an IP from the bridge network; a host-network one does not.
    let bridge_cfg = sandbox_config("direct-bridge", false, &env);
    let bridge = rt.run_pod_sandbox(&bridge_cfg).await.unwrap();
    let st = rt.pod_sandbox_status(&bridge).await.unwrap();
    assert_eq!(st.state, SandboxState::Ready);
    assert!(!st.host_network);
    let ip = st.ip.clone().expect("pod IP");
    let prefix = env.subnet.rsplit_once('.').unwrap().0;
    assert!(ip.starts_with(prefix), "{ip} not in {}", env.subnet);

    let host_cfg = sandbox_config("direct-host", true, &env);
    let host = rt.run_pod_sandbox(&host_cfg).await.unwrap();
    let st = rt.pod_sandbox_status(&host).await.unwrap();
    assert!(st.host_network);

    let mut cfg = {
        let mut vv = ContainerConfig::default();
        vv.metadata = ContainerMetadata {
            name: "app".into(),
            attempt: 0,
        };
        vv.image = env.busybox.clone();
        vv.command = vec!["/bin/sh".into(), "-c".into()];
        vv.args = vec!["echo started; exec sleep 1000".into()];
        vv.working_dir = "/tmp".into();
        vv.envs = vec![kubelet_api::runtime::EnvVar {
            name: "GREETING".into(),
            value: "hello".into(),
        }];
        vv.log_path = "app/0.log".into();
        vv.resources = Some({
            let mut v = kubelet_api::runtime::LinuxResources::default();
            v.memory_limit_in_bytes = 64 << 20;
            v.cpu_shares = 256;
            v.cpu_period = 100_000;
            v.cpu_quota = 50_000;
            v
        });
        vv
    };
    cfg.labels = bridge_cfg.labels.clone();
    let id = rt
        .create_container(&bridge, &cfg, &bridge_cfg)
        .await
        .unwrap();
    assert_eq!(
        rt.container_status(&id).await.unwrap().state,
        ContainerState::Created
    );
    rt.start_container(&id).await.unwrap();
    let cs = rt.container_status(&id).await.unwrap();
    assert_eq!(cs.state, ContainerState::Running);
    assert!(cs.started_at.is_some());
    assert_eq!(cs.log_path, env.dir.join("logs/direct-bridge/app/0.log"));

    let out = rt
        .exec_sync(
            &id,
            &["/bin/sh".into(), "-c".into(), "echo $GREETING; pwd; cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max".into()],
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert_eq!(out.exit_code, 0, "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines, ["hello", "/tmp", &(64u64 << 20).to_string()]);
    let failing = rt
        .exec_sync(
            &id,
            &["/bin/sh".into(), "-c".into(), "exit 3".into()],
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert_eq!(failing.exit_code, 3);
    let slow = rt
        .exec_sync(
            &id,
            &["/bin/sleep".into(), "30".into()],
            Duration::from_secs(1),
        )
        .await
        .unwrap_err();
    assert_eq!(slow.kind(), ErrorKind::DeadlineExceeded, "{slow}");

    let stats = rt.container_stats(&id).await.unwrap();
    assert!(stats.memory_working_set_bytes.is_some(), "{stats:?}");
    assert!(stats.cpu_usage_core_nanoseconds.is_some(), "{stats:?}");
    assert!(stats.writable_layer_bytes.is_some(), "{stats:?}");

    let listed = rt
        .list_containers(&kubelet_api::runtime::ContainerFilter {
            pod_sandbox_id: Some(bridge.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, id);

    // sh ignores SIGTERM as PID 1 without a trap: the stop escalates to SIGKILL after 1 s.
    rt.stop_container(&id, Duration::from_secs(1))
        .await
        .unwrap();
    let cs = rt.container_status(&id).await.unwrap();
    assert_eq!(cs.state, ContainerState::Exited);
    assert_eq!(cs.exit_code, 137);
    let log = std::fs::read_to_string(&cs.log_path).unwrap();
    assert!(log.contains(" stdout F started"), "{log}");

    rt.remove_container(&id).await.unwrap();
    rt.remove_container(&id).await.unwrap();
    let e = rt.container_status(&id).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");

    for s in [&bridge, &host] {
        rt.stop_pod_sandbox(s).await.unwrap();
        rt.stop_pod_sandbox(s).await.unwrap();
        rt.remove_pod_sandbox(s).await.unwrap();
        rt.remove_pod_sandbox(s).await.unwrap();
    }
    assert!(
        rt.list_pod_sandboxes(&Default::default())
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_and_bridge_network_pods_reach_running_with_their_spec_applied() {
    let Some(env) =
        ContainerdEnv::start("host_and_bridge_network_pods_reach_running_with_their_spec_applied")
    else {
        return;
    };
    let rt = env.runtime().await;
    let host_dir = env.dir.join("hostpath");
    std::fs::create_dir_all(&host_dir).unwrap();

    let field = |path: &str| EnvVar {
        name: path.replace(['.', '/'], "_").to_uppercase(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut app = container(
        "app",
        &env.busybox,
        "echo $METADATA_NAME > /host/name; echo $STATUS_PODIP > /host/ip; \
         echo from-app > /scratch/x; exec sleep 1000",
    );
    app.env = Some(vec![
        field("metadata.name"),
        field("metadata.namespace"),
        field("metadata.uid"),
        field("status.podIP"),
        field("spec.nodeName"),
    ]);
    app.volume_mounts = Some(vec![
        VolumeMount {
            name: "host".into(),
            mount_path: "/host".into(),
            ..Default::default()
        },
        VolumeMount {
            name: "scratch".into(),
            mount_path: "/scratch".into(),
            ..Default::default()
        },
    ]);
    app.resources = Some(ResourceRequirements {
        limits: Some(
            [
                ("memory".to_string(), Quantity("32Mi".into())),
                ("cpu".to_string(), Quantity("250m".into())),
            ]
            .into(),
        ),
        ..Default::default()
    });
    let mut bridge_pod = pod("bridge", false, vec![app]);
    if let Some(spec) = bridge_pod.spec.as_mut() {
        spec.volumes = Some(vec![
            Volume {
                name: "host".into(),
                host_path: Some(HostPathVolumeSource {
                    path: host_dir.to_string_lossy().into_owned(),
                    type_: None,
                }),
                ..Default::default()
            },
            Volume {
                name: "scratch".into(),
                empty_dir: Some(Default::default()),
                ..Default::default()
            },
        ]);
    }
    let mut nobody = container("nobody", &env.busybox, "exec sleep 1000");
    nobody.security_context = Some(SecurityContext {
        run_as_user: Some(65534),
        ..Default::default()
    });
    let mut privileged = container("privileged", &env.busybox, "exec sleep 1000");
    privileged.security_context = Some(SecurityContext {
        privileged: Some(true),
        ..Default::default()
    });
    // A host-network pod's IP is the node's, in its status and in the downward API alike
    // (containerd reports no IP for a host-network sandbox).
    let mut host_app = container("app", &env.busybox, "exec sleep 1000");
    host_app.env = Some(vec![field("status.podIP"), field("status.hostIP")]);
    let host_pod = pod("host", true, vec![host_app, nobody, privileged]);
    let (_tx, rx) = watch::channel(vec![bridge_pod, host_pod]);
    let agent = Agent::start(&env, rt.clone(), rx);

    let st = agent.wait_for("bridge", LONG, "Running", running).await;
    let ip = st.pod_ip.clone().expect("pod IP");
    let prefix = env.subnet.rsplit_once('.').unwrap().0;
    assert!(ip.starts_with(prefix), "{ip} not in {}", env.subnet);
    let host = agent.wait_for("host", LONG, "Running", running).await;

    // fieldRef env and the hostPath volume: the container wrote its name and IP to the host.
    let written = eventually(LONG, "files from the container", || {
        let host_dir = host_dir.clone();
        async move {
            let name = std::fs::read_to_string(host_dir.join("name")).ok()?;
            let ip = std::fs::read_to_string(host_dir.join("ip")).ok()?;
            Some((name, ip))
        }
    })
    .await;
    assert_eq!(written.0.trim(), "pod-bridge");
    assert_eq!(written.1.trim(), ip);

    // exec in the engine-created container: env, the emptyDir and the memory limit.
    let (_, id, _) = container_ids(&st).remove(0);
    let out = rt
        .exec_sync(
            &id,
            &[
                "/bin/sh".into(),
                "-c".into(),
                "echo $METADATA_NAMESPACE $METADATA_UID $SPEC_NODENAME; cat /scratch/x; \
                 cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max; \
                 hostname"
                    .into(),
            ],
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "default bridge node-1",
            "from-app",
            &(32u64 << 20).to_string(),
            "pod-bridge"
        ],
        "{out:?}"
    );
    let cs = rt.container_status(&id).await.unwrap();
    let res = cs.resources.expect("resources in the status");
    assert_eq!(res.memory_limit_in_bytes, 32 << 20);
    assert_eq!(res.cpu_quota, 25_000);

    assert_eq!(host.pod_ip.as_deref(), Some(common::NODE_IP));
    assert_eq!(host.host_ip.as_deref(), Some(common::NODE_IP));
    let host_ids = container_ids(&host);
    let host_app_id = &host_ids.iter().find(|c| c.0 == "app").unwrap().1;
    let out = rt
        .exec_sync(
            host_app_id,
            &[
                "/bin/sh".into(),
                "-c".into(),
                "echo $STATUS_PODIP $STATUS_HOSTIP".into(),
            ],
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("{} {}", common::NODE_IP, common::NODE_IP)
    );

    // runAsUser and privileged: the uid, and the capability set (a privileged container gets
    // every capability, the others the runtime's default set).
    let ids = container_ids(&host);
    let id_of = |name: &str| ids.iter().find(|c| c.0 == name).unwrap().1.clone();
    let probe = "id -u; grep CapEff /proc/self/status | cut -f2";
    let mut seen = Vec::new();
    for name in ["app", "nobody", "privileged"] {
        let out = rt
            .exec_sync(
                &id_of(name),
                &["/bin/sh".into(), "-c".into(), probe.into()],
                Duration::from_secs(10),
            )
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut words = text.split_whitespace();
        let uid = words.next().unwrap_or("").to_string();
        let caps = u64::from_str_radix(words.next().unwrap_or(""), 16).unwrap();
        seen.push((uid, caps));
    }
    assert_eq!(seen[0].0, "0");
    assert_eq!(seen[1].0, "65534");
    assert_eq!(seen[2].0, "0");
    // CAP_SYS_ADMIN (bit 21) only in the privileged container.
    let sys_admin = 1u64 << 21;
    assert_eq!(seen[0].1 & sys_admin, 0, "{seen:?}");
    assert_ne!(seen[2].1 & sys_admin, 0, "{seen:?}");
    assert!(seen[2].1.count_ones() > seen[0].1.count_ones(), "{seen:?}");
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashing_container_restarts_with_backoff_and_dead_instances_are_collected() {
    let Some(env) = ContainerdEnv::start(
        "a_crashing_container_restarts_with_backoff_and_dead_instances_are_collected",
    ) else {
        return;
    };
    let rt = env.runtime().await;
    let mut crasher = container("crasher", &env.busybox, "echo bye; exit 1");
    crasher.termination_message_policy = Some("FallbackToLogsOnError".into());
    let p = pod("crash", true, vec![crasher]);
    let (_tx, rx) = watch::channel(vec![p]);
    let agent = Agent::start(&env, rt.clone(), rx);

    // First restart at once, the next after 10 s: restartCount 2 and CrashLoopBackOff.
    let st = agent
        .wait_for("crash", LONG, "two restarts and CrashLoopBackOff", |s| {
            s.container_statuses.iter().flatten().any(|c| {
                c.restart_count >= 2
                    && c.state
                        .as_ref()
                        .and_then(|st| st.waiting.as_ref())
                        .is_some_and(|w| w.reason.as_deref() == Some("CrashLoopBackOff"))
            })
        })
        .await;
    let c = &st.container_statuses.as_ref().unwrap()[0];
    let last = c
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .expect("lastState.terminated");
    assert_eq!(last.exit_code, 1);
    assert_eq!(last.message.as_deref().map(str::trim), Some("bye"));

    // GC keeps the newest dead instance only (plus a running one, if any).
    eventually(LONG, "dead instances collected", || {
        let rt = rt.clone();
        async move {
            let cs = containers_of(rt.as_ref(), "crash").await;
            let dead = cs
                .iter()
                .filter(|c| c.state == ContainerState::Exited)
                .count();
            (dead <= 1).then_some(())
        }
    })
    .await;
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_pod_delivers_sigterm_within_the_grace_period_and_removes_it() {
    let Some(env) = ContainerdEnv::start(
        "deleting_a_pod_delivers_sigterm_within_the_grace_period_and_removes_it",
    ) else {
        return;
    };
    let rt = env.runtime().await;
    let host_dir = env.dir.join("term");
    std::fs::create_dir_all(&host_dir).unwrap();
    let mut c = container(
        "graceful",
        &env.busybox,
        "trap 'echo TERM > /out/got-term; exit 0' TERM; echo ready > /out/ready; \
         while :; do sleep 1; done",
    );
    c.volume_mounts = Some(vec![VolumeMount {
        name: "out".into(),
        mount_path: "/out".into(),
        ..Default::default()
    }]);
    let mut p = pod("graceful", false, vec![c]);
    if let Some(spec) = p.spec.as_mut() {
        spec.termination_grace_period_seconds = Some(60);
        spec.volumes = Some(vec![Volume {
            name: "out".into(),
            host_path: Some(HostPathVolumeSource {
                path: host_dir.to_string_lossy().into_owned(),
                type_: None,
            }),
            ..Default::default()
        }]);
    }
    let keep = pod(
        "keep",
        true,
        vec![container("app", &env.busybox, "exec sleep 1000")],
    );
    let (tx, rx) = watch::channel(vec![p, keep.clone()]);
    let agent = Agent::start(&env, rt.clone(), rx);
    agent.wait_for("graceful", LONG, "Running", running).await;
    eventually(LONG, "container ready", || {
        let f = host_dir.join("ready");
        async move { f.exists().then_some(()) }
    })
    .await;
    let pod_dir = env.dir.join("kubelet/pods/graceful");
    let log_dir = env.dir.join("logs/default_pod-graceful_graceful");
    assert!(
        pod_dir.exists() && log_dir.exists(),
        "the pod's directories"
    );

    let started = tokio::time::Instant::now();
    tx.send(vec![keep]).unwrap();
    eventually(LONG, "pod removed from containerd", || {
        let rt = rt.clone();
        async move {
            let s = sandboxes_of(rt.as_ref(), "graceful").await;
            let c = containers_of(rt.as_ref(), "graceful").await;
            (s.is_empty() && c.is_empty()).then_some(())
        }
    })
    .await;
    // SIGTERM reached the trap, and the container did not wait for the 60 s SIGKILL.
    assert_eq!(
        std::fs::read_to_string(host_dir.join("got-term"))
            .unwrap()
            .trim(),
        "TERM"
    );
    assert!(
        started.elapsed() < Duration::from_secs(55),
        "{:?}",
        started.elapsed()
    );
    // The status manager reports the removal once the pod worker has finished, which can be
    // just after the runtime's last object is gone.
    eventually(LONG, "the removal reported to the sink", || {
        let removed = agent.sink.removed();
        async move { removed.contains(&"graceful".to_string()).then_some(()) }
    })
    .await;
    // Its pod directory and log directory went with it.
    eventually(LONG, "the pod and log directories removed", || {
        let gone = !pod_dir.exists() && !log_dir.exists();
        async move { gone.then_some(()) }
    })
    .await;
    // The other pod is untouched.
    let st = agent.status("keep").unwrap();
    assert!(running(&st), "{st:?}");
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_adopts_running_containers() {
    let Some(env) = ContainerdEnv::start("a_restarted_agent_adopts_running_containers") else {
        return;
    };
    let rt = env.runtime().await;
    let pods = vec![
        pod(
            "adopt-a",
            true,
            vec![container("app", &env.busybox, "exec sleep 1000")],
        ),
        pod(
            "adopt-b",
            false,
            vec![
                container("one", &env.busybox, "exec sleep 1000"),
                container("two", &env.busybox, "exec sleep 1000"),
            ],
        ),
    ];
    let (_tx, rx) = watch::channel(pods);
    let agent = Agent::start(&env, rt.clone(), rx.clone());
    let a = agent.wait_for("adopt-a", LONG, "Running", running).await;
    let b = agent.wait_for("adopt-b", LONG, "Running", running).await;
    agent.stop().await;

    // A new agent process would start with a new runtime client too.
    let rt2 = env.runtime().await;
    let agent = Agent::start(&env, rt2.clone(), rx);
    let a2 = agent.wait_for("adopt-a", LONG, "Running", running).await;
    let b2 = agent.wait_for("adopt-b", LONG, "Running", running).await;
    assert_eq!(container_ids(&a), container_ids(&a2));
    assert_eq!(container_ids(&b), container_ids(&b2));
    // Give a wrong decision time to show, then check nothing was recreated.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for uid in ["adopt-a", "adopt-b"] {
        assert_eq!(sandboxes_of(rt2.as_ref(), uid).await.len(), 1, "{uid}");
    }
    assert_eq!(containers_of(rt2.as_ref(), "adopt-b").await.len(), 2);
    assert_eq!(
        container_ids(&agent.status("adopt-b").unwrap()),
        container_ids(&b)
    );
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarting_containerd_mid_run_loses_and_duplicates_nothing() {
    let Some(env) =
        ContainerdEnv::start("restarting_containerd_mid_run_loses_and_duplicates_nothing")
    else {
        return;
    };
    let rt = env.runtime().await;
    let pods = vec![
        pod(
            "survive-host",
            true,
            vec![container("app", &env.busybox, "exec sleep 1000")],
        ),
        pod(
            "survive-bridge",
            false,
            vec![container("app", &env.busybox, "exec sleep 1000")],
        ),
    ];
    let (tx, rx) = watch::channel(pods.clone());
    let agent = Agent::start(&env, rt.clone(), rx);
    let h = agent
        .wait_for("survive-host", LONG, "Running", running)
        .await;
    let b = agent
        .wait_for("survive-bridge", LONG, "Running", running)
        .await;

    env.kill_containerd();
    let e = rt.list_containers(&Default::default()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    // Several relists fail while containerd is away.
    tokio::time::sleep(Duration::from_secs(4)).await;
    env.restart_containerd();

    // The same client reaches the new containerd.
    eventually(LONG, "containerd answers again", || {
        let rt = rt.clone();
        async move { rt.version().await.ok() }
    })
    .await;
    // A pod added after the restart starts normally.
    let mut more = pods.clone();
    more.push(pod(
        "after-restart",
        true,
        vec![container("app", &env.busybox, "exec sleep 1000")],
    ));
    tx.send(more).unwrap();
    agent
        .wait_for("after-restart", LONG, "Running", running)
        .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let h2 = agent.status("survive-host").unwrap();
    let b2 = agent.status("survive-bridge").unwrap();
    assert!(running(&h2) && running(&b2), "{h2:?} {b2:?}");
    assert_eq!(container_ids(&h), container_ids(&h2));
    assert_eq!(container_ids(&b), container_ids(&b2));
    assert_eq!(b.pod_ip, b2.pod_ip);
    for uid in ["survive-host", "survive-bridge", "after-restart"] {
        assert_eq!(sandboxes_of(rt.as_ref(), uid).await.len(), 1, "{uid}");
        assert_eq!(containers_of(rt.as_ref(), uid).await.len(), 1, "{uid}");
    }
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_policy_never_with_a_missing_image_waits_with_err_image_never_pull() {
    let Some(env) = ContainerdEnv::start(
        "pull_policy_never_with_a_missing_image_waits_with_err_image_never_pull",
    ) else {
        return;
    };
    let rt = env.runtime().await;
    let mut never = container("app", "localhost/kubelet-sdk/absent:1", "exec sleep 1000");
    never.image_pull_policy = Some("Never".into());
    let mut present = container("app", &env.busybox, "exec sleep 1000");
    present.image_pull_policy = Some("Never".into());
    let mut pull = container("app", "localhost:1/kubelet-sdk/absent:1", "exec sleep 1000");
    pull.image_pull_policy = Some("IfNotPresent".into());
    let pods = vec![
        pod("never", true, vec![never]),
        pod("present", true, vec![present]),
        pod("pull", true, vec![pull]),
    ];
    let (_tx, rx) = watch::channel(pods);
    let agent = Agent::start(&env, rt.clone(), rx);

    let waiting_reason = |s: &k8s_openapi::api::core::v1::PodStatus| {
        s.container_statuses
            .iter()
            .flatten()
            .find_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone())
    };
    let st = agent
        .wait_for("never", LONG, "ErrImageNeverPull", |s| {
            waiting_reason(s).as_deref() == Some("ErrImageNeverPull")
        })
        .await;
    assert_eq!(phase(&st), "Pending");
    // An image that cannot be pulled (no registry answers) fails with ErrImagePull, then the
    // next attempts wait in ImagePullBackOff.
    agent
        .wait_for("pull", LONG, "ErrImagePull", |s| {
            waiting_reason(s).as_deref() == Some("ErrImagePull")
        })
        .await;
    agent
        .wait_for("pull", LONG, "ImagePullBackOff", |s| {
            waiting_reason(s).as_deref() == Some("ImagePullBackOff")
        })
        .await;
    agent.wait_for("present", LONG, "Running", running).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(running(&agent.status("present").unwrap()));
    assert!(containers_of(rt.as_ref(), "never").await.is_empty());
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_termination_message_file_reaches_the_status() {
    let Some(env) = ContainerdEnv::start("a_termination_message_file_reaches_the_status") else {
        return;
    };
    let rt = env.runtime().await;
    let c = container(
        "job",
        &env.busybox,
        "echo all done > /dev/termination-log; exit 0",
    );
    let mut p = pod("msg", true, vec![c]);
    if let Some(spec) = p.spec.as_mut() {
        spec.restart_policy = Some("Never".into());
    }
    let (_tx, rx) = watch::channel(vec![p]);
    let agent = Agent::start(&env, rt.clone(), rx);
    let st = agent
        .wait_for("msg", LONG, "Succeeded", |s| phase(s) == "Succeeded")
        .await;
    let term = st.container_statuses.as_ref().unwrap()[0]
        .state
        .as_ref()
        .and_then(|s| s.terminated.clone())
        .expect("terminated");
    assert_eq!(term.exit_code, 0);
    assert_eq!(term.message.as_deref().map(str::trim), Some("all done"));
    let _ = Arc::clone(&rt);
    agent.stop().await;
}

/// The container security context and the kubelet's volume and file modes reach containerd:
/// a read-only root filesystem, `no_new_privs` for `allowPrivilegeEscalation: false`, the pod's
/// `fsGroup` and `supplementalGroups`, dropped capabilities, a memory-backed `emptyDir` as a
/// tmpfs, and a termination message file a non-root user can write (each container reports
/// what it sees through it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_context_tmpfs_and_termination_messages_reach_the_container() {
    use k8s_openapi::api::core::v1::{Capabilities, EmptyDirVolumeSource, PodSecurityContext};
    let Some(env) =
        ContainerdEnv::start("security_context_tmpfs_and_termination_messages_reach_the_container")
    else {
        return;
    };
    let rt = env.runtime().await;
    let report = |name: &str, script: &str| {
        container(
            name,
            &env.busybox,
            &format!("({script}) > /dev/termination-log 2>&1"),
        )
    };
    let mut ro = report(
        "ro",
        "if touch /probe 2>/dev/null; then echo writable; else echo read-only; fi",
    );
    ro.security_context = Some(SecurityContext {
        read_only_root_filesystem: Some(true),
        ..Default::default()
    });
    let mut nnp = report("nnp", "grep NoNewPrivs /proc/self/status; id -u; id -G");
    nnp.security_context = Some(SecurityContext {
        allow_privilege_escalation: Some(false),
        ..Default::default()
    });
    let mut caps = report("caps", "grep CapEff /proc/self/status");
    caps.security_context = Some(SecurityContext {
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        ..Default::default()
    });
    let mut mem = report("mem", "grep ' /mem ' /proc/mounts; ls -ld /scratch");
    mem.volume_mounts = Some(vec![
        VolumeMount {
            name: "mem".into(),
            mount_path: "/mem".into(),
            ..Default::default()
        },
        VolumeMount {
            name: "scratch".into(),
            mount_path: "/scratch".into(),
            ..Default::default()
        },
    ]);
    let mut p = pod("sec", true, vec![ro, nnp, caps, mem]);
    if let Some(spec) = p.spec.as_mut() {
        spec.restart_policy = Some("Never".into());
        spec.security_context = Some(PodSecurityContext {
            run_as_user: Some(1000),
            fs_group: Some(2000),
            supplemental_groups: Some(vec![3000]),
            ..Default::default()
        });
        spec.volumes = Some(vec![
            Volume {
                name: "mem".into(),
                empty_dir: Some(EmptyDirVolumeSource {
                    medium: Some("Memory".into()),
                    size_limit: Some(Quantity("5Mi".into())),
                }),
                ..Default::default()
            },
            Volume {
                name: "scratch".into(),
                empty_dir: Some(Default::default()),
                ..Default::default()
            },
        ]);
    }
    let (_tx, rx) = watch::channel(vec![p]);
    let agent = Agent::start(&env, rt.clone(), rx);
    let st = agent
        .wait_for("sec", LONG, "Succeeded", |s| {
            matches!(phase(s), "Succeeded" | "Failed")
        })
        .await;
    let message = |name: &str| {
        st.container_statuses
            .iter()
            .flatten()
            .find(|c| c.name == name)
            .and_then(|c| c.state.as_ref()?.terminated.as_ref()?.message.clone())
            .unwrap_or_default()
    };
    assert_eq!(phase(&st), "Succeeded", "{st:#?}");
    // Every container runs as UID 1000 and could still write its message (a 0666 file).
    assert_eq!(message("ro").trim(), "read-only");
    let nnp = message("nnp");
    assert!(nnp.contains("NoNewPrivs:\t1"), "{nnp}");
    let mut lines = nnp.lines().skip(1);
    assert_eq!(lines.next(), Some("1000"), "{nnp}");
    let groups = lines.next().unwrap_or_default();
    assert!(
        groups.split(' ').any(|g| g == "2000") && groups.split(' ').any(|g| g == "3000"),
        "groups {groups:?}"
    );
    assert_eq!(message("caps").trim(), "CapEff:\t0000000000000000");
    let mem = message("mem");
    assert!(mem.starts_with("tmpfs /mem tmpfs"), "{mem}");
    assert!(mem.contains("size=5120k"), "{mem}");
    assert!(mem.contains("drwxrwxrwx"), "{mem}");
    agent.stop().await;
}

/// The container manager on containerd: each pod's sandbox and containers land in its pod
/// cgroup under its QoS tier (containerd's runc, cgroupfs driver), the pod cgroup has the
/// kubelet's values, containers their own limits, and a deleted pod's cgroup is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qos_pods_land_in_their_pod_cgroups_on_containerd() {
    let Some(env) = ContainerdEnv::start("qos_pods_land_in_their_pod_cgroups_on_containerd") else {
        return;
    };
    let root = format!("kubelet-cri-cm-test-{}", std::process::id());
    let mut config = kubelet_cm::CmConfig::default();
    config.root_dir = env.dir.join("cm");
    config.cgroup_root = format!("/{root}");
    let cm = kubelet_cm::ContainerManager::new("node-1", config).unwrap();
    let Some(h) = cm.hierarchy().cloned() else {
        panic!("no pod cgroups: {:?}", cm.cgroups_disabled_reason());
    };
    let resources = |req: &[(&str, &str)], lim: &[(&str, &str)]| {
        let map = |kv: &[(&str, &str)]| {
            (!kv.is_empty()).then(|| {
                kv.iter()
                    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                    .collect()
            })
        };
        Some(k8s_openapi::api::core::v1::ResourceRequirements {
            requests: map(req),
            limits: map(lim),
            ..Default::default()
        })
    };
    let mut g = container("app", &env.busybox, "exec sleep 1000");
    g.resources = resources(&[], &[("cpu", "500m"), ("memory", "64Mi")]);
    let mut b = container("app", &env.busybox, "exec sleep 1000");
    b.resources = resources(&[("cpu", "100m")], &[("memory", "96Mi")]);
    let e = container("app", &env.busybox, "exec sleep 1000");
    let pods = vec![
        pod("cm-guaranteed", true, vec![g]),
        pod("cm-burstable", false, vec![b]),
        pod("cm-besteffort", true, vec![e]),
    ];
    let (tx, rx) = watch::channel(pods);
    let agent = Agent::start_with_plugin(&env, env.runtime().await, rx, Arc::new(cm));
    let mut ids = Vec::new();
    for (uid, qos) in [
        (
            "cm-guaranteed",
            kubelet_api::resources::QosClass::Guaranteed,
        ),
        ("cm-burstable", kubelet_api::resources::QosClass::Burstable),
        (
            "cm-besteffort",
            kubelet_api::resources::QosClass::BestEffort,
        ),
    ] {
        let st = agent.wait_for(uid, LONG, "Running", running).await;
        let id = container_ids(&st)[0].1.clone();
        let id = id.rsplit("://").next().unwrap().to_string();
        ids.push((uid, qos, id));
    }
    let read = |d: std::path::PathBuf, f: &str| {
        std::fs::read_to_string(d.join(f))
            .unwrap_or_else(|e| panic!("{}: {e}", d.join(f).display()))
            .trim()
            .to_string()
    };
    let pod_dir = |c: &str, uid: &str, q| h.dir(c, &h.pod(q, uid)).unwrap();
    for (uid, qos, id) in &ids {
        // runc made the container's cgroup inside the pod cgroup.
        let c = pod_dir("memory", uid, *qos).join(id);
        assert!(c.is_dir(), "{uid}: no {}", c.display());
    }
    let (g_uid, g_q, g_id) = &ids[0];
    assert_eq!(read(pod_dir("cpu", g_uid, *g_q), "cpu.shares"), "512");
    assert_eq!(
        read(pod_dir("cpu", g_uid, *g_q), "cpu.cfs_quota_us"),
        "50000"
    );
    assert_eq!(
        read(pod_dir("memory", g_uid, *g_q), "memory.limit_in_bytes"),
        (64u64 << 20).to_string()
    );
    assert_eq!(
        read(
            pod_dir("memory", g_uid, *g_q).join(g_id),
            "memory.limit_in_bytes"
        ),
        (64u64 << 20).to_string()
    );
    let (b_uid, b_q, b_id) = &ids[1];
    assert_eq!(read(pod_dir("cpu", b_uid, *b_q), "cpu.shares"), "102");
    assert_eq!(
        read(pod_dir("cpu", b_uid, *b_q).join(b_id), "cpu.shares"),
        "102"
    );
    let (e_uid, e_q, _) = &ids[2];
    assert_eq!(read(pod_dir("cpu", e_uid, *e_q), "cpu.shares"), "2");

    // Deleted: the pod cgroups go, in every hierarchy runc used.
    tx.send(vec![]).unwrap();
    eventually(LONG, "pod cgroups removed", || async {
        ids.iter()
            .all(|(uid, q, _)| {
                !pod_dir("memory", uid, *q).exists() && !pod_dir("cpu", uid, *q).exists()
            })
            .then_some(())
    })
    .await;
    agent.stop().await;
    // The test's cgroup root.
    for mp in [
        "memory",
        "cpu",
        "cpuacct",
        "pids",
        "cpuset",
        "devices",
        "freezer",
        "blkio",
        "hugetlb",
        "net_cls",
        "net_prio",
        "perf_event",
        "systemd",
        "rdma",
        "misc",
        "unified",
    ] {
        let top = std::path::Path::new("/sys/fs/cgroup").join(mp).join(&root);
        for sub in ["kubepods/burstable", "kubepods/besteffort", "kubepods", ""] {
            let _ = std::fs::remove_dir(top.join(sub));
        }
    }
}
