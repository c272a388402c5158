//! The smallest build: `cargo build -p minimal_kubelet --no-default-features` (process runtime,
//! file source, healthz and read-only ports; no kubelet API, TLS, CRI, cluster, probes or
//! eviction) is built into its own target directory and run: a static pod runs, `/pods` serves
//! it, and a `--port` given anyway stays closed with a warning.
//!
//! Building takes minutes, so the test runs when `KUBELET_SDK_REQUIRE_ROOT=1` (CI) or
//! `KUBELET_SDK_NO_DEFAULT_FEATURES_TEST=1` is set, and says it skipped otherwise.

mod common;

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn wanted() -> bool {
    [
        "KUBELET_SDK_REQUIRE_ROOT",
        "KUBELET_SDK_NO_DEFAULT_FEATURES_TEST",
    ]
    .iter()
    .any(|v| std::env::var(v).is_ok_and(|v| v == "1"))
}

/// Where the workspace's builds go (the test binary lives in `<target>/<profile>/deps`).
fn target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_minimal_kubelet"));
    exe.parent()
        .and_then(|p| p.parent())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target"))
}

#[test]
fn the_build_without_default_features_runs_a_static_pod_without_the_kubelet_api() {
    if !wanted() {
        eprintln!(
            "skipped: set KUBELET_SDK_NO_DEFAULT_FEATURES_TEST=1 to build and run the \
             --no-default-features binary (CI does, through KUBELET_SDK_REQUIRE_ROOT=1)"
        );
        return;
    }
    let target = target_dir().join("no-default-features");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let built = Command::new(cargo)
        .args([
            "build",
            "-q",
            "-p",
            "minimal_kubelet",
            "--no-default-features",
        ])
        .arg("--target-dir")
        .arg(&target)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("running cargo build");
    assert!(built.success(), "cargo build --no-default-features failed");
    let bin = target.join("debug").join("minimal_kubelet");
    assert!(bin.exists(), "{} was not built", bin.display());

    let dir = tempfile::tempdir().expect("temp dir");
    let manifests = dir.path().join("manifests");
    std::fs::create_dir_all(&manifests).expect("manifest dir");
    let token = format!("3600.{}", std::process::id());
    std::fs::write(
        manifests.join("lite.json"),
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": { "name": "lite" },
            "spec": { "containers": [{ "name": "c", "image": "host", "command": ["sleep", token] }] },
        })
        .to_string(),
    )
    .expect("manifest");
    let read_only = common::free_port();
    let api = common::free_port();
    let log = dir.path().join("agent.log");
    let mut child = Command::new(&bin)
        .arg("--pod-manifest-path")
        .arg(&manifests)
        .arg("--root-dir")
        .arg(dir.path().join("root"))
        .arg("--pod-log-dir")
        .arg(dir.path().join("logs"))
        .args(["--node-name", "lite", "--address", "127.0.0.1"])
        .args(["--read-only-port", &read_only.to_string()])
        .args(["--port", &api.to_string(), "--healthz-port", "0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("starting the agent");

    let deadline = Instant::now() + Duration::from_secs(60);
    let running = loop {
        if let Ok((200, body)) = common::http_get(read_only, "/pods")
            && body.contains("\"lite-lite\"")
            && body.contains("\"phase\":\"Running\"")
        {
            break true;
        }
        if Instant::now() > deadline || child.try_wait().ok().flatten().is_some() {
            break false;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let api_open = TcpStream::connect(("127.0.0.1", api)).is_ok();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    );
    let _ = child.wait();
    common::kill_token_processes(std::slice::from_ref(&token));
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(running, "the static pod never ran; agent log:\n{log}");
    assert!(
        !api_open,
        "port {api} (the kubelet API) answered; agent log:\n{log}"
    );
    assert!(
        log.contains("the kubelet API is not served"),
        "no warning that the kubelet API is not built in; agent log:\n{log}"
    );
}
