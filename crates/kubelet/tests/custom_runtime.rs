//! `examples/custom_runtime.rs`: the toy runtime written from the trait's contract passes the
//! runtime conformance kit, its engine section included (the example exits non-zero otherwise
//! and lists the failures), and runs an ordinary (not host-network) pod as an agent.

use std::path::PathBuf;

fn example_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target profile directory");
    let bin = profile_dir.join("examples").join("custom_runtime");
    assert!(
        bin.exists(),
        "{} is missing: `cargo test` builds the examples",
        bin.display()
    );
    bin
}

#[test]
fn the_custom_runtime_example_passes_the_conformance_suite() {
    let out = std::process::Command::new(example_binary())
        .output()
        .expect("run custom_runtime");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "custom_runtime failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("16 passed, 0 failed"), "{stdout}");
}

/// Kills the agent when the test ends, also on a failed assertion, and the pod's processes
/// (the agent leaves pods running, and the toy runtime's containers are plain processes): the
/// process group of every process whose command line holds `token`.
struct Agent(std::process::Child, String);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&self.1) {
                // The toy runtime starts each container as its own process group.
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}

fn get_pods(port: u16) -> Option<serde_json::Value> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.write_all(b"GET /pods HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    let (_, json) = body.split_once("\r\n\r\n")?;
    serde_json::from_str(json).ok()
}

#[test]
fn the_custom_runtime_runs_an_ordinary_pod_as_an_agent_without_recreating_its_sandbox() {
    let dir = tempfile::tempdir().expect("tempdir");
    let manifests = dir.path().join("manifests");
    std::fs::create_dir_all(&manifests).expect("manifests dir");
    let token = format!("toy-agent-{}", std::process::id());
    std::fs::write(
        manifests.join("web.yaml"),
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: default\n\
             spec:\n  containers:\n  - name: app\n    image: none\n    \
             command: [\"/bin/sh\", \"-c\", \"sleep 3600\", \"{token}\"]\n"
        ),
    )
    .expect("manifest");
    let port = kubelet_testenv::free_port();
    let log = std::fs::File::create(dir.path().join("agent.log")).expect("log file");
    let agent = Agent(
        std::process::Command::new(example_binary())
            .arg(&manifests)
            .arg(dir.path().join("root"))
            .arg(port.to_string())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start the toy agent"),
        token,
    );
    let status = |pods: &serde_json::Value| pods["items"][0]["status"].clone();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let running = loop {
        if let Some(pods) = get_pods(port)
            && status(&pods)["phase"] == "Running"
        {
            break status(&pods);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "web not Running within 60 s; agent log:\n{}",
            std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    // An engine that re-creates the sandbox does so about once a second.
    std::thread::sleep(std::time::Duration::from_secs(8));
    let later = get_pods(port).map(|p| status(&p)).expect("/pods");
    drop(agent);
    let log = std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default();
    assert!(!log.contains("SandboxChanged"), "{log}");
    assert_eq!(later["phase"], "Running", "{later:#}");
    assert_eq!(
        later["containerStatuses"][0]["restartCount"], 0,
        "{later:#}"
    );
    assert_eq!(
        later["containerStatuses"][0]["containerID"],
        running["containerStatuses"][0]["containerID"],
        "the same container instance"
    );
    // The toy runtime has no pod networking: the pod shows the node's IP, as a host-network pod.
    assert!(
        !later["podIP"].as_str().unwrap_or("").is_empty(),
        "{later:#}"
    );
    assert_eq!(later["podIP"], later["hostIP"], "{later:#}");
}
