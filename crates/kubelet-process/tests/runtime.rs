//! Real-process tests of the process runtime.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kubelet_api::runtime::{
    ContainerConfig, ContainerFilter, ContainerMetadata, ContainerState, EnvVar, LinuxResources,
    Mount, PodSandboxConfig, PodSandboxMetadata, SandboxFilter, SandboxState, labels,
};
use kubelet_api::{ContainerRuntime, ErrorKind, EventRecorder, EventType};
use kubelet_process::{ProcessRuntime, ProcessRuntimeConfig};

const SHIM: &str = env!("CARGO_BIN_EXE_kubelet-process-shim");

fn config(root: &Path) -> ProcessRuntimeConfig {
    ProcessRuntimeConfig::new(root.join("state"))
        .shim_path(SHIM)
        .cgroup_parent("kubelet-sdk-test")
}

fn runtime(root: &Path) -> ProcessRuntime {
    ProcessRuntime::new(config(root)).expect("runtime")
}

fn sandbox_config(root: &Path, uid: &str) -> PodSandboxConfig {
    {
        let mut v = PodSandboxConfig::default();
        v.metadata = PodSandboxMetadata {
            name: format!("pod-{uid}"),
            namespace: "default".into(),
            uid: uid.into(),
            attempt: 0,
        };
        v.log_directory = root.join("logs").join(format!("default_pod-{uid}_{uid}"));
        v.labels = BTreeMap::from([
            (labels::POD_UID.to_string(), uid.to_string()),
            (labels::POD_NAME.to_string(), format!("pod-{uid}")),
            (labels::POD_NAMESPACE.to_string(), "default".to_string()),
        ]);
        v.host_network = true;
        v
    }
}

fn container_config(sb: &PodSandboxConfig, name: &str, script: &str) -> ContainerConfig {
    let mut l = sb.labels.clone();
    l.insert(labels::CONTAINER_NAME.into(), name.into());
    {
        let mut v = ContainerConfig::default();
        v.metadata = ContainerMetadata {
            name: name.into(),
            attempt: 0,
        };
        v.image = "busybox:latest".into();
        v.command = vec!["/bin/sh".into(), "-c".into()];
        v.args = vec![script.into()];
        v.labels = l;
        v.log_path = format!("{name}/0.log");
        v
    }
}

/// Sandbox + created + started container.
async fn run(
    rt: &ProcessRuntime,
    root: &Path,
    uid: &str,
    cfg: impl FnOnce(&PodSandboxConfig) -> ContainerConfig,
) -> (String, String, PodSandboxConfig) {
    let sb = sandbox_config(root, uid);
    let sid = rt.run_pod_sandbox(&sb).await.expect("sandbox");
    let cid = rt
        .create_container(&sid, &cfg(&sb), &sb)
        .await
        .expect("create");
    rt.start_container(&cid).await.expect("start");
    (sid, cid, sb)
}

async fn wait_state(rt: &ProcessRuntime, cid: &str, state: ContainerState, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let st = rt.container_status(cid).await.expect("status");
        if st.state == state {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "container {cid} still {:?} (wanted {state:?})",
            st.state
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_log(path: &Path, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(needle) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{needle:?} not in log {path:?}: {text:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Remove every sandbox (stopping its containers and removing their cgroups).
async fn cleanup(rt: &ProcessRuntime) {
    for s in rt
        .list_pod_sandboxes(&SandboxFilter::default())
        .await
        .expect("list")
    {
        rt.remove_pod_sandbox(&s.id).await.expect("remove sandbox");
    }
    assert!(
        rt.list_containers(&ContainerFilter::default())
            .await
            .expect("list")
            .is_empty()
    );
}

fn alive(pid: u32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_ok()
}

#[tokio::test]
async fn running_container_has_a_live_pid_and_cri_format_logs() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rt = runtime(tmp.path());
    let (sid, cid, sb) = run(&rt, tmp.path(), "u-run", |sb| {
        container_config(sb, "app", "echo hello; echo oops >&2; sleep 100")
    })
    .await;
    let st = rt.container_status(&cid).await.expect("status");
    assert_eq!(st.state, ContainerState::Running);
    assert!(st.started_at.is_some());
    assert_eq!(st.image, "busybox:latest");
    let pid = rt.container_pid(&cid).expect("pid").expect("running");
    assert!(alive(pid));
    let log = sb.log_directory.join("app/0.log");
    assert_eq!(st.log_path, log);
    let text = wait_log(&log, "oops").await;
    let lines: Vec<&str> = text.lines().collect();
    let hello = lines
        .iter()
        .find(|l| l.ends_with(" stdout F hello"))
        .expect("hello line");
    let ts = hello.split(' ').next().expect("timestamp");
    ts.parse::<jiff::Timestamp>().expect("RFC3339 timestamp");
    assert!(lines.iter().any(|l| l.ends_with(" stderr F oops")));

    let sst = rt.pod_sandbox_status(&sid).await.expect("sandbox status");
    assert!(sst.host_network);
    assert!(sst.ip.is_some());
    assert_eq!(sst.state, SandboxState::Ready);

    rt.stop_pod_sandbox(&sid).await.expect("stop sandbox");
    assert!(!alive(pid) || rt.container_pid(&cid).expect("pid").is_none());
    let st = rt.container_status(&cid).await.expect("status");
    assert_eq!(st.state, ContainerState::Exited);
    assert_eq!(st.exit_code, 143);
    let sst = rt.pod_sandbox_status(&sid).await.expect("sandbox status");
    assert_eq!(sst.state, SandboxState::NotReady);
    rt.remove_pod_sandbox(&sid).await.expect("remove");
    let err = rt.container_status(&cid).await.expect_err("removed");
    assert_eq!(err.kind(), ErrorKind::NotFound);
    let err = rt.pod_sandbox_status(&sid).await.expect_err("removed");
    assert_eq!(err.kind(), ErrorKind::NotFound);
    rt.remove_pod_sandbox(&sid)
        .await
        .expect("remove is idempotent");
}

#[tokio::test]
async fn exit_codes_and_reasons_propagate() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rt = runtime(tmp.path());
    let (_, failing, _) = run(&rt, tmp.path(), "u-exit3", |sb| {
        container_config(sb, "a", "exit 3")
    })
    .await;
    let (_, ok, _) = run(&rt, tmp.path(), "u-true", |sb| {
        let mut c = container_config(sb, "b", "");
        c.command = vec![];
        c.args = vec!["true".into()];
        c
    })
    .await;
    wait_state(
        &rt,
        &failing,
        ContainerState::Exited,
        Duration::from_secs(5),
    )
    .await;
    wait_state(&rt, &ok, ContainerState::Exited, Duration::from_secs(5)).await;
    let st = rt.container_status(&failing).await.expect("status");
    assert_eq!((st.exit_code, st.reason.as_str()), (3, "Error"));
    assert!(st.finished_at.is_some());
    let st = rt.container_status(&ok).await.expect("status");
    assert_eq!((st.exit_code, st.reason.as_str()), (0, "Completed"));
    cleanup(&rt).await;
}

#[tokio::test]
async fn missing_command_is_invalid_and_unknown_binary_is_a_start_error() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rt = runtime(tmp.path());
    let sb = sandbox_config(tmp.path(), "u-bad");
    let sid = rt.run_pod_sandbox(&sb).await.expect("sandbox");
    let mut c = container_config(&sb, "x", "");
    c.command.clear();
    c.args.clear();
    let err = rt
        .create_container(&sid, &c, &sb)
        .await
        .expect_err("no command");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.message().contains("needs command or args"), "{err}");

    c.command = vec!["/nonexistent/binary".into()];
    let cid = rt.create_container(&sid, &c, &sb).await.expect("create");
    let err = rt.start_container(&cid).await.expect_err("start fails");
    assert!(err.message().contains("/nonexistent/binary"), "{err}");
    let st = rt.container_status(&cid).await.expect("status");
    assert_eq!(st.state, ContainerState::Exited);
    assert_eq!((st.exit_code, st.reason.as_str()), (128, "StartError"));

    let err = rt
        .container_status("no-such-container")
        .await
        .expect_err("unknown");
    assert_eq!(err.kind(), ErrorKind::NotFound);
    let err = rt.container_status("../../etc").await.expect_err("bad id");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    cleanup(&rt).await;
}

#[tokio::test]
async fn stop_sends_sigterm_first_and_sigkill_after_the_timeout() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rt = runtime(tmp.path());
    let (_, polite, sb) = run(&rt, tmp.path(), "u-term", |sb| {
        container_config(
            sb,
            "polite",
            "trap 'echo term; exit 0' TERM; echo ready; while :; do sleep 0.05; done",
        )
    })
    .await;
    let (_, stubborn, _) = run(&rt, tmp.path(), "u-kill", |sb| {
        container_config(
            sb,
            "stubborn",
            "trap '' TERM; echo ready; while :; do sleep 0.05; done",
        )
    })
    .await;
    wait_log(&sb.log_directory.join("polite/0.log"), "ready").await;
    let t = Instant::now();
    rt.stop_container(&polite, Duration::from_secs(5))
        .await
        .expect("stop");
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "took {:?}",
        t.elapsed()
    );
    let st = rt.container_status(&polite).await.expect("status");
    assert_eq!(
        (st.state, st.exit_code, st.reason.as_str()),
        (ContainerState::Exited, 0, "Completed")
    );
    wait_log(&sb.log_directory.join("polite/0.log"), "term").await;

    let log = tmp
        .path()
        .join("logs/default_pod-u-kill_u-kill/stubborn/0.log");
    wait_log(&log, "ready").await;
    let t = Instant::now();
    rt.stop_container(&stubborn, Duration::from_millis(700))
        .await
        .expect("stop");
    assert!(
        t.elapsed() >= Duration::from_millis(700),
        "took {:?}",
        t.elapsed()
    );
    let st = rt.container_status(&stubborn).await.expect("status");
    assert_eq!((st.exit_code, st.reason.as_str()), (137, "Error"));
    rt.stop_container(&stubborn, Duration::from_secs(1))
        .await
        .expect("stop is idempotent");
    cleanup(&rt).await;
}

#[tokio::test]
async fn sigkill_from_outside_gives_exit_code_137() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rt = runtime(tmp.path());
    let (_, cid, _) = run(&rt, tmp.path(), "u-ext", |sb| {
        container_config(sb, "a", "sleep 100")
    })
    .await;
    let pid = rt.container_pid(&cid).expect("pid").expect("running");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::SIGKILL,
    )
    .expect("kill");
    wait_state(&rt, &cid, ContainerState::Exited, Duration::from_secs(5)).await;
    let st = rt.container_status(&cid).await.expect("status");
    assert_eq!((st.exit_code, st.reason.as_str()), (137, "Error"));
    cleanup(&rt).await;
}

#[tokio::test]
async fn exec_sync_sees_container_env_and_workdir_and_times_out() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rt = runtime(tmp.path());
    let wd = tmp.path().join("wd");
    let (_, cid, _) = run(&rt, tmp.path(), "u-exec", |sb| {
        let mut c = container_config(sb, "a", "sleep 100");
        c.envs = vec![EnvVar {
            name: "GREETING".into(),
            value: "hi there".into(),
        }];
        c.working_dir = wd.display().to_string();
        c
    })
    .await;
    let sh = |s: &str| vec!["/bin/sh".to_string(), "-c".to_string(), s.to_string()];
    let r = rt
        .exec_sync(
            &cid,
            &sh("echo \"$GREETING\"; pwd; echo err >&2; exit 4"),
            Duration::from_secs(5),
        )
        .await
        .expect("exec");
    assert_eq!(r.exit_code, 4);
    assert_eq!(
        String::from_utf8_lossy(&r.stdout),
        format!("hi there\n{}\n", wd.display())
    );
    assert_eq!(r.stderr, b"err\n");
    let r = rt
        .exec_sync(&cid, &sh("env | sort"), Duration::from_secs(5))
        .await
        .expect("exec");
    let env = String::from_utf8_lossy(&r.stdout).into_owned();
    assert!(env.contains("GREETING=hi there"), "{env}");
    assert!(env.contains("PATH="), "{env}");
    assert!(!env.contains("CARGO"), "agent env leaked: {env}");

    let t = Instant::now();
    let err = rt
        .exec_sync(&cid, &sh("sleep 30"), Duration::from_millis(300))
        .await
        .expect_err("timeout");
    assert_eq!(err.kind(), ErrorKind::DeadlineExceeded);
    assert!(t.elapsed() < Duration::from_secs(5));
    let r = rt
        .exec_sync(
            &cid,
            &["/no/such/probe".to_string()],
            Duration::from_secs(5),
        )
        .await
        .expect("exec of a missing binary reports an exit code");
    assert_eq!(r.exit_code, 127);
    rt.stop_container(&cid, Duration::ZERO).await.expect("stop");
    let err = rt
        .exec_sync(&cid, &sh("true"), Duration::from_secs(1))
        .await
        .expect_err("not running");
    assert_eq!(err.kind(), ErrorKind::FailedPrecondition);
    cleanup(&rt).await;
}

#[tokio::test]
async fn list_filters_by_id_state_sandbox_and_labels() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rt = runtime(tmp.path());
    let (sa, ca, _) = run(&rt, tmp.path(), "u-la", |sb| {
        container_config(sb, "a", "sleep 100")
    })
    .await;
    let (sb_id, cb, _) = run(&rt, tmp.path(), "u-lb", |sb| {
        container_config(sb, "b", "exit 0")
    })
    .await;
    wait_state(&rt, &cb, ContainerState::Exited, Duration::from_secs(5)).await;
    rt.stop_pod_sandbox(&sb_id).await.expect("stop");

    let sel = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
    let ids =
        |v: Vec<kubelet_api::runtime::Container>| v.into_iter().map(|c| c.id).collect::<Vec<_>>();
    let all = rt
        .list_containers(&ContainerFilter::default())
        .await
        .expect("list");
    assert_eq!(all.len(), 2);
    let a = all.iter().find(|c| c.id == ca).expect("a listed");
    assert_eq!(
        a.labels.get(labels::POD_UID).map(String::as_str),
        Some("u-la")
    );
    assert_eq!(a.pod_sandbox_id, sa);
    let f = ContainerFilter {
        label_selector: sel(labels::POD_UID, "u-lb"),
        ..Default::default()
    };
    assert_eq!(
        ids(rt.list_containers(&f).await.expect("list")),
        vec![cb.clone()]
    );
    let f = ContainerFilter {
        state: Some(ContainerState::Running),
        ..Default::default()
    };
    assert_eq!(
        ids(rt.list_containers(&f).await.expect("list")),
        vec![ca.clone()]
    );
    let f = ContainerFilter {
        pod_sandbox_id: Some(sb_id.clone()),
        ..Default::default()
    };
    assert_eq!(
        ids(rt.list_containers(&f).await.expect("list")),
        vec![cb.clone()]
    );
    let f = ContainerFilter {
        id: Some(ca.clone()),
        label_selector: sel(labels::CONTAINER_NAME, "b"),
        ..Default::default()
    };
    assert!(rt.list_containers(&f).await.expect("list").is_empty());

    let s = rt
        .list_pod_sandboxes(&SandboxFilter {
            state: Some(SandboxState::Ready),
            ..Default::default()
        })
        .await
        .expect("list");
    assert_eq!(
        s.iter().map(|s| s.id.clone()).collect::<Vec<_>>(),
        vec![sa.clone()]
    );
    let s = rt
        .list_pod_sandboxes(&SandboxFilter {
            label_selector: sel(labels::POD_UID, "u-lb"),
            ..Default::default()
        })
        .await
        .expect("list");
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].state, SandboxState::NotReady);
    assert_eq!(s[0].metadata.uid, "u-lb");
    let pods = kubelet_api::runtime::get_pods(&rt).await.expect("get_pods");
    assert_eq!(pods.len(), 2);
    rt.stop_pod_sandbox(&sa).await.expect("stop");
    cleanup(&rt).await;
}

#[tokio::test]
async fn there_are_no_images_and_the_runtime_answers_version_and_status() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rt = runtime(tmp.path());
    assert!(rt.images().is_none(), "host programs: nothing to pull");
    let v = rt.version().await.expect("version");
    assert_eq!(v.runtime_name, "process");
    let s = rt.status().await.expect("status");
    assert!(s.condition("RuntimeReady").is_some_and(|c| c.status));
    assert!(s.condition("NetworkReady").is_some_and(|c| c.status));
}

#[tokio::test]
async fn a_reopened_log_continues_in_a_new_file_after_the_old_one_was_renamed() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rt = runtime(tmp.path());
    let (_sid, cid, sb) = run(&rt, tmp.path(), "u-reopen", |sb| {
        container_config(
            sb,
            "app",
            "i=0; while [ $i -lt 400 ]; do echo line-$i; i=$((i+1)); sleep 0.01; done; sleep 100",
        )
    })
    .await;
    let log = sb.log_directory.join("app/0.log");
    wait_log(&log, "line-20").await;
    // Rotated five times while the container writes.
    let mut files = Vec::new();
    for n in 0..5 {
        let rotated = sb
            .log_directory
            .join(format!("app/0.log.20260101-00000{n}"));
        std::fs::rename(&log, &rotated).expect("rename");
        rt.reopen_container_log(&cid).await.expect("reopen");
        assert!(log.exists(), "the log is recreated before reopen returns");
        files.push(rotated);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    wait_log(&log, "line-399").await;
    for f in &files {
        let len = std::fs::metadata(f).expect("rotated").len();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            std::fs::metadata(f).expect("rotated").len(),
            len,
            "nothing is written to {} after its reopen",
            f.display()
        );
    }
    files.push(log.clone());
    // Every line is in exactly one of the files, in order.
    let mut lines = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("read");
        lines.extend(
            text.lines()
                .map(|l| l.rsplit(' ').next().unwrap_or("").to_string()),
        );
    }
    let want: Vec<String> = (0..400).map(|i| format!("line-{i}")).collect();
    assert_eq!(lines, want);
    // A container that is not running cannot reopen.
    rt.stop_container(&cid, Duration::ZERO).await.expect("stop");
    let err = rt.reopen_container_log(&cid).await.expect_err("stopped");
    assert_eq!(err.kind(), kubelet_api::ErrorKind::FailedPrecondition);
    cleanup(&rt).await;
}

#[tokio::test]
async fn mounts_and_unenforceable_limits_are_reported_as_warnings() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (recorder, mut events) = EventRecorder::channel(16);
    let rt = ProcessRuntime::with_recorder(config(tmp.path()).use_cgroups(false), recorder)
        .expect("runtime");
    let (sid, cid, _) = run(&rt, tmp.path(), "u-warn", |sb| {
        let mut c = container_config(sb, "a", "sleep 100");
        c.mounts = vec![Mount {
            container_path: "/data".into(),
            host_path: "/srv/data".into(),
            readonly: false,
        }];
        c.resources = Some({
            let mut v = LinuxResources::default();
            v.memory_limit_in_bytes = 32 << 20;
            v.cpu_shares = 2;
            v
        });
        c
    })
    .await;
    let mut reasons = Vec::new();
    while let Ok(ev) = events.try_recv() {
        assert_eq!(ev.type_, EventType::Warning);
        assert_eq!(ev.involved.uid, "u-warn");
        assert_eq!(ev.involved.kind, "Pod");
        if ev.reason == "MountsNotSupported" {
            assert!(ev.message.contains("/srv/data"), "{}", ev.message);
        }
        reasons.push(ev.reason);
    }
    reasons.sort();
    assert_eq!(reasons, ["MountsNotSupported", "ResourceLimitsNotEnforced"]);
    // The process joins its cgroup as it starts: its usage shows once it has run a little.
    let mut usage = None;
    for _ in 0..50 {
        usage = rt
            .container_stats(&cid)
            .await
            .expect("stats")
            .memory_usage_bytes;
        if usage.is_some_and(|m| m > 0) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(usage.is_some_and(|m| m > 0), "memory usage {usage:?}");
    rt.stop_pod_sandbox(&sid).await.expect("stop");
    rt.remove_pod_sandbox(&sid).await.expect("remove");
}

/// Helper run in a child process by `containers_survive_the_agent_and_are_found_again`: starts a
/// container under `KUBELET_PROCESS_TEST_ROOT`, prints `<container id> <pid>` and exits.
#[tokio::test]
#[ignore = "helper: run by containers_survive_the_agent_and_are_found_again"]
async fn helper_start_container_and_exit() {
    let root = PathBuf::from(std::env::var_os("KUBELET_PROCESS_TEST_ROOT").expect("root env"));
    let rt = runtime(&root);
    let (_, cid, _) = run(&rt, &root, "u-survive", |sb| {
        container_config(sb, "a", "echo started; sleep 100")
    })
    .await;
    let pid = rt.container_pid(&cid).expect("pid").expect("running");
    println!("CONTAINER {cid} {pid}");
}

#[tokio::test]
async fn containers_survive_the_agent_and_are_found_again() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = std::process::Command::new(std::env::current_exe().expect("exe"))
        .args([
            "--ignored",
            "--exact",
            "helper_start_container_and_exit",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("KUBELET_PROCESS_TEST_ROOT", tmp.path())
        .output()
        .expect("run helper");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "helper failed: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("CONTAINER ").map(|(_, rest)| rest))
        .expect("helper printed the container");
    let (cid, pid) = line.split_once(' ').expect("id and pid");
    let pid: u32 = pid.trim().parse().expect("pid");

    // The agent process that started it is gone; a new runtime finds the container.
    let rt = runtime(tmp.path());
    let running = rt
        .list_containers(&ContainerFilter {
            state: Some(ContainerState::Running),
            ..Default::default()
        })
        .await
        .expect("list");
    assert_eq!(running.len(), 1);
    assert_eq!(running[0].id, cid);
    assert_eq!(rt.container_pid(cid).expect("pid"), Some(pid));
    assert!(alive(pid));
    rt.stop_container(cid, Duration::from_secs(3))
        .await
        .expect("stop");
    let st = rt.container_status(cid).await.expect("status");
    assert_eq!(st.state, ContainerState::Exited);
    assert!(
        matches!(st.exit_code, 143 | 137),
        "exit code {}",
        st.exit_code
    );
    assert!(!alive(pid));
    let sid = running[0].pod_sandbox_id.clone();
    rt.remove_pod_sandbox(&sid).await.expect("remove");
}

/// True when root tests can run; panics when `KUBELET_SDK_REQUIRE_ROOT=1` and they cannot.
fn root_with_cgroups(rt: &ProcessRuntime) -> bool {
    let ok = nix::unistd::geteuid().is_root() && rt.cgroup_version().is_some();
    if !ok {
        assert!(
            std::env::var("KUBELET_SDK_REQUIRE_ROOT").as_deref() != Ok("1"),
            "KUBELET_SDK_REQUIRE_ROOT=1 but not root or no cgroup hierarchy"
        );
        eprintln!("SKIP: needs root and a cgroup hierarchy with the memory controller");
    }
    ok
}

#[tokio::test]
async fn as_root_containers_get_a_memory_limited_cgroup_and_stats() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rt = runtime(tmp.path());
    if !root_with_cgroups(&rt) {
        return;
    }
    let (sid, cid, _) = run(&rt, tmp.path(), "u-cg", |sb| {
        let mut c = container_config(sb, "a", "sleep 100");
        c.resources = Some({
            let mut v = LinuxResources::default();
            v.memory_limit_in_bytes = 32 << 20;
            v.cpu_shares = 512;
            v.cpu_quota = 50_000;
            v.cpu_period = 100_000;
            v
        });
        c
    })
    .await;
    let pid = rt.container_pid(&cid).expect("pid").expect("running");
    let dirs = rt.container_cgroup_dirs(&cid).expect("dirs");
    assert!(!dirs.is_empty());
    let mem_dir = dirs
        .iter()
        .find(|d| d.join("memory.limit_in_bytes").exists() || d.join("memory.max").exists())
        .expect("memory cgroup");
    let limit = std::fs::read_to_string(mem_dir.join("memory.limit_in_bytes"))
        .or_else(|_| std::fs::read_to_string(mem_dir.join("memory.max")))
        .expect("limit");
    assert_eq!(limit.trim(), (32u64 << 20).to_string());
    let procs = std::fs::read_to_string(mem_dir.join("cgroup.procs")).expect("procs");
    assert!(
        procs.lines().any(|l| l.trim() == pid.to_string()),
        "{pid} not in {procs}"
    );
    let r = rt
        .exec_sync(
            &cid,
            &["/bin/cat".into(), "/proc/self/cgroup".into()],
            Duration::from_secs(5),
        )
        .await
        .expect("exec");
    assert!(
        String::from_utf8_lossy(&r.stdout).contains(&cid),
        "exec not in the container cgroup"
    );
    let stats = rt.container_stats(&cid).await.expect("stats");
    assert!(stats.memory_usage_bytes.is_some_and(|m| m > 0), "{stats:?}");
    assert!(stats.memory_working_set_bytes.is_some());
    assert!(stats.cpu_usage_core_nanoseconds.is_some());
    assert!(stats.process_count.is_some_and(|n| n >= 1), "{stats:?}");
    rt.stop_pod_sandbox(&sid).await.expect("stop");
    rt.remove_pod_sandbox(&sid).await.expect("remove");
    for d in &dirs {
        assert!(!d.exists(), "cgroup {d:?} left behind");
    }
}

#[tokio::test]
async fn as_root_exceeding_the_memory_limit_is_oom_killed() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rt = runtime(tmp.path());
    if !root_with_cgroups(&rt) {
        return;
    }
    let (sid, cid, _) = run(&rt, tmp.path(), "u-oom", |sb| {
        let mut c = container_config(
            sb,
            "hog",
            "x=$(head -c 100000000 /dev/zero | tr '\\0' a); sleep 1",
        );
        c.resources = Some({
            let mut v = LinuxResources::default();
            v.memory_limit_in_bytes = 32 << 20;
            v
        });
        c
    })
    .await;
    wait_state(&rt, &cid, ContainerState::Exited, Duration::from_secs(20)).await;
    let st = rt.container_status(&cid).await.expect("status");
    assert_eq!(
        st.reason, "OOMKilled",
        "exit {} {:?}",
        st.exit_code, st.message
    );
    rt.remove_pod_sandbox(&sid).await.expect("remove");
}

// ---------------------------------------------------------------------------------------------
// Faults: a killed supervisor, the state directory removed, a full disk, stray cgroups.
// ---------------------------------------------------------------------------------------------

/// The parent PID of `pid` (`/proc/<pid>/stat` field 4).
fn parent_of(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let rest = &stat[stat.rfind(')').expect("comm") + 1..];
    rest.split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("ppid")
}

/// Send `sig` to process `pid`.
fn send(pid: u32, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig).expect("signal");
}

/// Wait up to 5 s for a `Stopped` event of container `cid`.
async fn stopped_event(events: &mut kubelet_api::runtime::ContainerEventStream, cid: &str) {
    next_event_for(
        events,
        cid,
        kubelet_api::runtime::ContainerEventKind::Stopped,
        Duration::from_secs(5),
    )
    .await;
}

async fn next_event_for(
    events: &mut kubelet_api::runtime::ContainerEventStream,
    cid: &str,
    kind: kubelet_api::runtime::ContainerEventKind,
    within: Duration,
) {
    use futures::StreamExt;
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, events.next()).await {
            Ok(Some(Ok(ev))) if ev.container_id == cid && ev.kind == kind => return,
            Ok(Some(Ok(_))) => {}
            other => panic!("no {kind:?} event for {cid} within {within:?}: {other:?}"),
        }
    }
}

/// Processes whose command line has `token` as an argument.
fn procs_with(token: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if let Ok(cmd) = std::fs::read(entry.path().join("cmdline"))
            && cmd.split(|&b| b == 0).any(|a| a == token.as_bytes())
            && std::fs::read_to_string(entry.path().join("stat")).is_ok_and(|s| !s.contains(") Z "))
        {
            out.push(pid);
        }
    }
    out
}

/// Waits until exactly `n` live processes carry `token`: `sh -c` forks its command, and between
/// that fork and the command's exec the child still shows the shell's arguments.
async fn wait_procs(token: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while procs_with(token).len() != n {
        assert!(
            Instant::now() < deadline,
            "wanted {n} processes of {token}, found {:?}",
            procs_with(token)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_no_procs(token: &str) {
    wait_procs(token, 0).await;
}

#[tokio::test]
async fn a_killed_shim_takes_its_container_with_it_and_the_exit_is_reported_at_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rt = runtime(tmp.path());
    let token = format!("shimkill-{}", std::process::id());
    let (bsid, bcid, _) = run(&rt, tmp.path(), "u-bystander-shim", |sb| {
        container_config(sb, "by", "sleep 300")
    })
    .await;
    let bystander = rt.container_pid(&bcid).expect("pid").expect("running");
    let (sid, cid, _) = run(&rt, tmp.path(), "u-shimkill", |sb| {
        let mut c = container_config(
            sb,
            "app",
            "sh -c 'while :; do sleep 1; done' \"$0\" & while :; do sleep 1; done",
        );
        c.args.push(token.clone());
        c
    })
    .await;
    let pid = rt.container_pid(&cid).expect("pid").expect("running");
    let shim = parent_of(pid);
    let mut events = rt.container_events().await.expect("events");
    send(shim, nix::sys::signal::Signal::SIGKILL);
    // The pidfd watch reports it at once, not when the container exits on its own.
    stopped_event(&mut events, &cid).await;
    let st = rt.container_status(&cid).await.expect("status");
    assert_eq!(st.state, ContainerState::Exited);
    assert_eq!(st.exit_code, 137, "{st:?}");
    assert!(st.message.contains("supervisor"), "{}", st.message);
    // No process of the container runs without its supervisor: the main process died with the
    // shim, the background child was killed by the runtime.
    wait_no_procs(&token).await;
    assert_eq!(rt.container_pid(&bcid).expect("pid"), Some(bystander));
    rt.remove_pod_sandbox(&sid).await.expect("remove");
    rt.remove_pod_sandbox(&bsid)
        .await
        .expect("remove bystander");
    assert!(!alive(bystander));
}

#[tokio::test]
async fn a_state_directory_removed_under_the_runtime_is_restored_and_nothing_runs_twice() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rt = runtime(tmp.path());
    let (sid, cid, _) = run(&rt, tmp.path(), "u-lost", |sb| {
        container_config(sb, "app", "read line < /dev/null; sleep 300")
    })
    .await;
    let pid = rt.container_pid(&cid).expect("pid").expect("running");
    let (dsid, dcid, _) = run(&rt, tmp.path(), "u-lost-done", |sb| {
        container_config(sb, "done", "exit 3")
    })
    .await;
    wait_state(&rt, &dcid, ContainerState::Exited, Duration::from_secs(10)).await;
    let mut events = rt.container_events().await.expect("events");

    std::fs::remove_dir_all(tmp.path().join("state")).expect("remove the state directory");

    // The event stream fails (the PLEG relists and subscribes again).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        use futures::StreamExt;
        match tokio::time::timeout_at(deadline, events.next()).await {
            Ok(Some(Ok(_))) => {}
            Ok(Some(Err(_)) | None) => break,
            Err(_) => panic!("the event stream did not notice the state directory going"),
        }
    }
    // A listing restores both: the running one with its process, the exited one with its exit.
    let listed = rt
        .list_containers(&ContainerFilter::default())
        .await
        .expect("list");
    let by_id = |id: &str| listed.iter().find(|c| c.id == id).map(|c| c.state);
    assert_eq!(by_id(&cid), Some(ContainerState::Running), "{listed:?}");
    assert_eq!(by_id(&dcid), Some(ContainerState::Exited), "{listed:?}");
    assert_eq!(rt.container_pid(&cid).expect("pid"), Some(pid));
    assert_eq!(
        rt.container_status(&dcid).await.expect("status").exit_code,
        3
    );
    let sandboxes = rt
        .list_pod_sandboxes(&SandboxFilter::default())
        .await
        .expect("sandboxes");
    assert_eq!(sandboxes.len(), 2, "{sandboxes:?}");
    assert!(
        tmp.path()
            .join("state/containers")
            .join(&cid)
            .join("started.json")
            .exists()
    );

    // Events work again on a new subscription, and the shim records the exit into the
    // restored directory.
    let mut events = rt.container_events().await.expect("events again");
    send(pid, nix::sys::signal::Signal::SIGTERM);
    stopped_event(&mut events, &cid).await;
    let st = rt.container_status(&cid).await.expect("status");
    assert_eq!(
        (st.state, st.exit_code),
        (ContainerState::Exited, 143),
        "{st:?}"
    );
    assert!(
        !st.message.contains("supervisor"),
        "the shim recorded it: {st:?}"
    );
    rt.remove_pod_sandbox(&sid).await.expect("remove");
    rt.remove_pod_sandbox(&dsid).await.expect("remove");
    cleanup(&rt).await;
}

#[tokio::test]
async fn a_removed_container_is_never_restored() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rt = runtime(tmp.path());
    let (sid, cid, _) = run(&rt, tmp.path(), "u-gone", |sb| {
        container_config(sb, "a", "exit 0")
    })
    .await;
    wait_state(&rt, &cid, ContainerState::Exited, Duration::from_secs(10)).await;
    rt.remove_container(&cid).await.expect("remove");
    assert!(
        rt.list_containers(&ContainerFilter::default())
            .await
            .expect("list")
            .is_empty()
    );
    assert!(!tmp.path().join("state/containers").join(&cid).exists());
    rt.remove_pod_sandbox(&sid).await.expect("remove");
}

#[tokio::test]
async fn as_root_a_full_disk_fails_with_enospc_and_exits_are_still_reported() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let probe = runtime(tmp.path());
    if !root_with_cgroups(&probe) {
        return;
    }
    drop(probe);
    let fs = kubelet_testenv::Tmpfs::mount(&tmp.path().join("small"), "2m").expect("mount a tmpfs");
    let rt = ProcessRuntime::new(
        ProcessRuntimeConfig::new(tmp.path().join("small/state"))
            .shim_path(SHIM)
            .cgroup_parent("kubelet-sdk-test"),
    )
    .expect("runtime");
    let token = format!("diskfull-{}", std::process::id());
    let (bsid, bcid, _) = run(&rt, tmp.path(), "u-full-by", |sb| {
        let mut c = container_config(sb, "by", "sleep 300");
        c.args.push(format!("by-{token}"));
        c
    })
    .await;
    let bystander = rt.container_pid(&bcid).expect("pid").expect("running");
    let (esid, ecid, _) = run(&rt, tmp.path(), "u-full-exit", |sb| {
        let mut c = container_config(sb, "ex", "read x < /dev/null; sleep 300");
        c.args.push(token.clone());
        c
    })
    .await;
    let epid = rt.container_pid(&ecid).expect("pid").expect("running");
    let (ksid, kcid, _) = run(&rt, tmp.path(), "u-full-kill", |sb| {
        let mut c = container_config(sb, "k", "sleep 300");
        c.args.push(token.clone());
        c
    })
    .await;
    let kpid = rt.container_pid(&kcid).expect("pid").expect("running");
    let mut events = rt.container_events().await.expect("events");
    // This one has no exit slot (as a container created by an older runtime): its exit can
    // only be kept in memory until there is room.
    let kdir = tmp.path().join("small/state/containers").join(&kcid);
    std::fs::remove_file(kdir.join("exit.slot")).expect("remove the slot");

    let filler = fs.fill();

    // New work fails with a typed error naming ENOSPC.
    let err = rt
        .run_pod_sandbox(&sandbox_config(tmp.path(), "u-full-new"))
        .await
        .expect_err("no room for a sandbox");
    assert_eq!(err.kind(), ErrorKind::ResourceExhausted, "{err}");
    assert!(err.to_string().contains("ENOSPC"), "{err}");

    // A container that exits is reported exited with its real code (the shim writes in place).
    send(epid, nix::sys::signal::Signal::SIGTERM);
    stopped_event(&mut events, &ecid).await;
    let st = rt.container_status(&ecid).await.expect("status");
    assert_eq!(
        (st.state, st.exit_code),
        (ContainerState::Exited, 143),
        "{st:?}"
    );

    // A killed supervisor: the exit is decided by the runtime and kept in memory.
    send(parent_of(kpid), nix::sys::signal::Signal::SIGKILL);
    wait_state(&rt, &kcid, ContainerState::Exited, Duration::from_secs(5)).await;
    assert_eq!(
        rt.container_status(&kcid).await.expect("status").exit_code,
        137
    );
    assert!(!kdir.join("exit.json").exists());

    // Stopping a sandbox needs its record rewritten: reported not ready all the same.
    rt.stop_pod_sandbox(&esid)
        .await
        .expect("stop on a full disk");
    let st = rt.pod_sandbox_status(&esid).await.expect("sandbox status");
    assert_eq!(st.state, SandboxState::NotReady);
    // Removing frees space and works.
    rt.remove_pod_sandbox(&esid)
        .await
        .expect("remove on a full disk");

    // Space returns: what was kept in memory is written on the next look, and the exits
    // recorded in place last: a new runtime on the same state reads them.
    std::fs::remove_file(&filler).expect("free the disk");
    assert_eq!(
        rt.container_status(&kcid).await.expect("status").exit_code,
        137
    );
    assert!(
        kdir.join("exit.json").exists(),
        "the exit kept in memory was not written"
    );
    let again = ProcessRuntime::new(
        ProcessRuntimeConfig::new(tmp.path().join("small/state"))
            .shim_path(SHIM)
            .cgroup_parent("kubelet-sdk-test"),
    )
    .expect("runtime");
    assert_eq!(
        again
            .container_status(&kcid)
            .await
            .expect("status")
            .exit_code,
        137
    );
    // New work runs again.
    let (nsid, ncid, _) = run(&rt, tmp.path(), "u-full-after", |sb| {
        container_config(sb, "after", "exit 0")
    })
    .await;
    wait_state(&rt, &ncid, ContainerState::Exited, Duration::from_secs(10)).await;
    rt.remove_pod_sandbox(&nsid).await.expect("remove");
    assert_eq!(rt.container_pid(&bcid).expect("pid"), Some(bystander));
    wait_no_procs(&token).await;
    rt.remove_pod_sandbox(&ksid).await.expect("remove");
    rt.remove_pod_sandbox(&bsid).await.expect("remove");
    cleanup(&rt).await;
}

#[tokio::test]
async fn as_root_removing_a_sandbox_removes_cgroups_and_processes_it_has_no_record_of() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rt = runtime(tmp.path());
    if !root_with_cgroups(&rt) {
        return;
    }
    let (sid, cid, _) = run(&rt, tmp.path(), "u-stray", |sb| {
        container_config(sb, "a", "sleep 300")
    })
    .await;
    let dirs = rt.container_cgroup_dirs(&cid).expect("dirs");
    // A cgroup beside the container's, of a container the runtime has no record of, with a
    // process in it (what a lost record leaves behind).
    let token = format!("stray-{}", std::process::id());
    let mut stray = std::process::Command::new("/bin/sh")
        .args(["-c", "sleep 300", &token])
        .spawn()
        .expect("spawn");
    let mut stray_dirs = Vec::new();
    for d in &dirs {
        let s = d.parent().expect("sandbox cgroup").join("strayed");
        std::fs::create_dir_all(&s).expect("stray cgroup");
        // A v1 cpuset cgroup takes processes once it has CPUs and memory nodes.
        for f in ["cpuset.cpus", "cpuset.mems"] {
            if s.join(f).exists() {
                let parent = std::fs::read_to_string(d.join(f)).expect("parent cpuset");
                std::fs::write(s.join(f), parent.trim()).expect("cpuset");
            }
        }
        std::fs::write(s.join("cgroup.procs"), stray.id().to_string()).expect("join");
        stray_dirs.push(s);
    }
    rt.remove_pod_sandbox(&sid).await.expect("remove");
    let status = stray.wait().expect("reap");
    assert_eq!(status.signal_or_code(), Some(9), "{status:?}");
    for d in dirs.iter().chain(&stray_dirs) {
        assert!(!d.exists(), "{d:?} left behind");
        assert!(
            !d.parent().expect("parent").exists(),
            "sandbox cgroup left behind"
        );
    }
}

trait SignalOrCode {
    fn signal_or_code(&self) -> Option<i32>;
}

impl SignalOrCode for std::process::ExitStatus {
    fn signal_or_code(&self) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        self.signal().or(self.code())
    }
}

#[tokio::test]
async fn a_new_runtime_kills_the_containers_whose_state_is_gone() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let token = format!("orphan-{}", std::process::id());
    let first = runtime(tmp.path());
    let (_, cid, _) = run(&first, tmp.path(), "u-orphan", |sb| {
        let mut c = container_config(sb, "a", "sleep 300");
        c.args.push(token.clone());
        c
    })
    .await;
    let dirs = first.container_cgroup_dirs(&cid).expect("dirs");
    wait_procs(&token, 1).await;
    drop(first);
    // The state goes while no runtime runs: nothing can restore it.
    std::fs::remove_dir_all(tmp.path().join("state")).expect("remove the state");
    let rt = runtime(tmp.path());
    wait_no_procs(&token).await;
    assert!(
        rt.list_containers(&ContainerFilter::default())
            .await
            .expect("list")
            .is_empty()
    );
    for d in &dirs {
        assert!(!d.exists(), "{d:?} left behind");
        assert!(
            !d.parent().expect("sandbox").exists(),
            "sandbox cgroup left behind"
        );
    }
}

/// What a host process can get of its security context is applied (`no_new_privs`, and as root
/// the user and the supplemental groups); what it cannot (read-only root filesystem,
/// capabilities, seccomp) is named in a `SecurityContextNotSupported` warning.
#[tokio::test]
async fn security_settings_a_process_can_take_are_applied_and_the_rest_reported() {
    use kubelet_api::runtime::{SecurityContext, SecurityProfile};
    let tmp = tempfile::tempdir().expect("tempdir");
    let (recorder, mut events) = EventRecorder::channel(16);
    let rt = ProcessRuntime::with_recorder(config(tmp.path()).use_cgroups(false), recorder)
        .expect("runtime");
    let root = nix::unistd::geteuid().is_root();
    let (sid, _cid, sb) = run(&rt, tmp.path(), "u-sec", |sb| {
        let mut c = container_config(
            sb,
            "a",
            "grep NoNewPrivs /proc/self/status; echo \"uid=$(id -u) groups=$(id -G)\"; sleep 100",
        );
        c.security = {
            let mut v = SecurityContext::default();
            v.no_new_privs = true;
            v.run_as_user = root.then_some(1000);
            v.run_as_group = root.then_some(1000);
            v.supplemental_groups = if root { vec![2000, 3000] } else { Vec::new() };
            v.readonly_rootfs = true;
            v.drop_capabilities = vec!["ALL".into()];
            v.seccomp = SecurityProfile::RuntimeDefault;
            v
        };
        c
    })
    .await;
    let log = sb.log_directory.join("a/0.log");
    let text = wait_log(&log, "uid=").await;
    assert!(text.contains("NoNewPrivs:\t1"), "{text}");
    if root {
        assert!(text.contains("uid=1000 groups=1000 2000 3000"), "{text}");
    }
    let ev = events.try_recv().expect("a warning");
    assert_eq!(ev.type_, EventType::Warning);
    assert_eq!(ev.reason, "SecurityContextNotSupported");
    assert!(
        ev.message
            .contains("readOnlyRootFilesystem, capabilities, seccompProfile"),
        "{}",
        ev.message
    );
    rt.stop_pod_sandbox(&sid).await.expect("stop");
    rt.remove_pod_sandbox(&sid).await.expect("remove");
}

/// A pod's sandboxes and containers, asked for by its UID label (as the PLEG inspects one
/// pod): exactly that pod's, before the first full list and after it, for records of a
/// previous runtime on the same state and for ones created, stopped or removed since.
#[tokio::test]
async fn a_pods_records_are_listed_by_its_uid_label_before_and_after_a_full_list() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let by_uid = |uid: &str| {
        (
            SandboxFilter {
                label_selector: BTreeMap::from([(labels::POD_UID.to_string(), uid.to_string())]),
                ..Default::default()
            },
            ContainerFilter {
                label_selector: BTreeMap::from([(labels::POD_UID.to_string(), uid.to_string())]),
                ..Default::default()
            },
        )
    };
    let sleeper = |sb: &PodSandboxConfig| container_config(sb, "app", "sleep 300");
    let before = runtime(tmp.path());
    let (sa, ca, _) = run(&before, tmp.path(), "uid-a", sleeper).await;
    let (sb, cb, _) = run(&before, tmp.path(), "uid-b", sleeper).await;
    drop(before);

    // A new runtime on the same state: nothing listed yet.
    let rt = runtime(tmp.path());
    for round in 0..2 {
        for (uid, sid, cid) in [("uid-a", &sa, &ca), ("uid-b", &sb, &cb)] {
            let (sf, cf) = by_uid(uid);
            let sandboxes = rt.list_pod_sandboxes(&sf).await.expect("runtime call");
            assert_eq!(
                sandboxes.iter().map(|s| &s.id).collect::<Vec<_>>(),
                vec![sid],
                "round {round}"
            );
            let containers = rt.list_containers(&cf).await.expect("runtime call");
            assert_eq!(
                containers.iter().map(|c| &c.id).collect::<Vec<_>>(),
                vec![cid],
                "round {round}"
            );
        }
        // Round 1 runs after a full list.
        assert_eq!(
            rt.list_pod_sandboxes(&SandboxFilter::default())
                .await
                .expect("runtime call")
                .len(),
            2
        );
        assert_eq!(
            rt.list_containers(&ContainerFilter::default())
                .await
                .expect("runtime call")
                .len(),
            2
        );
    }
    // Created since, stopped, removed: each seen through the pod's filter.
    let (sc, cc, _) = run(&rt, tmp.path(), "uid-c", sleeper).await;
    let (sf, cf) = by_uid("uid-c");
    assert_eq!(
        rt.list_pod_sandboxes(&sf).await.expect("runtime call")[0].id,
        sc
    );
    assert_eq!(
        rt.list_containers(&cf).await.expect("runtime call")[0].id,
        cc
    );
    rt.stop_pod_sandbox(&sc).await.expect("runtime call");
    let stopped = rt.list_pod_sandboxes(&sf).await.expect("runtime call");
    assert_eq!(stopped[0].state, SandboxState::NotReady);
    assert_eq!(
        rt.list_containers(&cf).await.expect("runtime call")[0].state,
        ContainerState::Exited
    );
    rt.remove_pod_sandbox(&sc).await.expect("runtime call");
    assert!(
        rt.list_pod_sandboxes(&sf)
            .await
            .expect("runtime call")
            .is_empty()
    );
    assert!(
        rt.list_containers(&cf)
            .await
            .expect("runtime call")
            .is_empty()
    );
    cleanup(&rt).await;
}

/// The state of container `cid` in a full list (`None`: not listed).
async fn listed_state(rt: &ProcessRuntime, cid: &str) -> Option<ContainerState> {
    rt.list_containers(&ContainerFilter::default())
        .await
        .expect("list")
        .into_iter()
        .find(|c| c.id == cid)
        .map(|c| c.state)
}

/// A list answers the state of a container an event stream watches from the watch (no file of
/// it is read), and from its files again as soon as anything casts doubt: the runtime's own
/// stop, an exit the stream reported, the stream dropped.
#[tokio::test]
async fn a_list_trusts_a_live_event_streams_watch_until_an_exit_or_the_stream_goes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rt = runtime(tmp.path());
    let (_, stopped, _) = run(&rt, tmp.path(), "u-vouch-stop", |sb| {
        container_config(sb, "app", "sleep 300")
    })
    .await;
    let (_, exits, _) = run(&rt, tmp.path(), "u-vouch-exit", |sb| {
        container_config(sb, "app", "sleep 300")
    })
    .await;
    let (_, unwatched, _) = run(&rt, tmp.path(), "u-vouch-drop", |sb| {
        container_config(sb, "app", "sleep 300")
    })
    .await;
    assert_eq!(
        listed_state(&rt, &stopped).await,
        Some(ContainerState::Running)
    );
    let mut events = rt.container_events().await.expect("events");

    // Watched: the list does not read the container's exit record (a broken one here, which
    // the status, reading it, reports).
    let exit_file = tmp
        .path()
        .join("state/containers")
        .join(&stopped)
        .join("exit.json");
    std::fs::write(&exit_file, b"{").expect("write a broken exit record");
    assert_eq!(
        listed_state(&rt, &stopped).await,
        Some(ContainerState::Running)
    );
    assert!(rt.container_status(&stopped).await.is_err());
    std::fs::remove_file(&exit_file).expect("remove it");

    // The runtime's own stop: listed as exited at once, the stream not polled since.
    rt.stop_container(&stopped, Duration::ZERO)
        .await
        .expect("stop");
    assert_eq!(
        listed_state(&rt, &stopped).await,
        Some(ContainerState::Exited)
    );

    // An exit from outside: listed as exited once the stream reported it.
    let pid = rt.container_pid(&exits).expect("pid").expect("running");
    send(pid, nix::sys::signal::Signal::SIGKILL);
    stopped_event(&mut events, &exits).await;
    assert_eq!(
        listed_state(&rt, &exits).await,
        Some(ContainerState::Exited)
    );

    // The stream dropped: nothing vouches any more, the list reads the files again.
    drop(events);
    let pid = rt.container_pid(&unwatched).expect("pid").expect("running");
    send(pid, nix::sys::signal::Signal::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(10);
    while listed_state(&rt, &unwatched).await != Some(ContainerState::Exited) {
        assert!(
            Instant::now() < deadline,
            "a container killed after its stream was dropped is still listed running"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cleanup(&rt).await;
}
