//! An agent assembled with only a root directory (and a static pod directory, since it needs a
//! pod source, and the ports switched off, since other tests run beside it) writes every file
//! under that root: pod directories, the process runtime's state, the pod's logs and their
//! `containers` links, the container manager's state. Nothing appears in the kubelet's own
//! `/var/lib/kubelet`, `/var/log/pods` or `/var/log/containers`.
//!
//! Runs without the libtest harness: `main` is the process runtime's shim host.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use kubelet::{AgentBuilder, KubeletConfiguration};
use tokio_util::sync::CancellationToken;

fn main() -> ExitCode {
    #[cfg(feature = "process")]
    if let Some(code) = kubelet::process::shim::maybe_run_shim() {
        return code;
    }
    const NAME: &str = "an_agent_with_only_a_root_dir_writes_nothing_outside_it";
    if std::env::args().any(|a| a == "--list") {
        println!("{NAME}: test");
        return ExitCode::SUCCESS;
    }
    #[cfg(feature = "process")]
    {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        rt.block_on(an_agent_with_only_a_root_dir_writes_nothing_outside_it());
        println!("test {NAME} ... ok");
    }
    ExitCode::SUCCESS
}

/// Every file and directory below `dir` (symbolic links not followed).
fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        out.push(p.clone());
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            walk(&p, out);
        }
    }
}

#[cfg(feature = "process")]
async fn an_agent_with_only_a_root_dir_writes_nothing_outside_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("root");
    let manifests = tmp.path().join("manifests");
    std::fs::create_dir_all(&manifests).expect("manifest dir");
    let uid_marker = format!("rootdir-{}", std::process::id());
    std::fs::write(
        manifests.join("talker.yaml"),
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {uid_marker}\n  namespace: default\n\
             spec:\n  containers:\n  - name: talker\n    image: busybox\n    \
             command: [\"/bin/sh\", \"-c\", \"echo written-under-the-root; sleep 3600\"]\n"
        ),
    )
    .expect("manifest");
    let kubelet_dirs = ["/var/lib/kubelet", "/var/log/pods", "/var/log/containers"];
    let before: Vec<Vec<std::path::PathBuf>> = kubelet_dirs
        .iter()
        .map(|d| {
            let mut v = Vec::new();
            walk(Path::new(d), &mut v);
            v
        })
        .collect();

    let mut configuration = KubeletConfiguration::default();
    configuration.static_pod_path = manifests.to_string_lossy().into_owned();
    configuration.port = 0;
    configuration.healthz_port = 0;
    let agent = AgentBuilder::new("root-dir-node")
        .configuration(configuration)
        .root_dir(&root)
        .build()
        .await
        .expect("agent");
    let statuses = agent.status_reader();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(agent.run(shutdown.clone()));
    let begin = std::time::Instant::now();
    let uid = loop {
        if let Some(p) = statuses
            .list()
            .into_iter()
            .find(|p| p.status.phase.as_deref() == Some("Running"))
        {
            break p.pod.metadata.uid.clone().unwrap_or_default();
        }
        assert!(begin.elapsed() < Duration::from_secs(60), "pod not Running");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The container's output reaches its log under the root.
    let pod_logs = root
        .join("logs")
        .join("pods")
        .join(format!("default_{uid_marker}-root-dir-node_{uid}"));
    let log = pod_logs.join("talker").join("0.log");
    let begin = std::time::Instant::now();
    while !std::fs::read_to_string(&log).is_ok_and(|t| t.contains("written-under-the-root")) {
        assert!(
            begin.elapsed() < Duration::from_secs(30),
            "{} has no output",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let links: Vec<String> = std::fs::read_dir(root.join("logs").join("containers"))
        .expect("the containers link directory under the root")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        links.iter().any(|l| l.starts_with(&uid_marker)),
        "{links:?}"
    );
    assert!(root.join("pods").join(&uid).is_dir(), "pod directory");

    // Nothing new in the kubelet's own directories.
    for (dir, before) in kubelet_dirs.iter().zip(&before) {
        let mut after = Vec::new();
        walk(Path::new(dir), &mut after);
        let new: Vec<_> = after.iter().filter(|p| !before.contains(p)).collect();
        assert!(new.is_empty(), "the agent wrote under {dir}: {new:?}");
    }
    // Everything of the pod, in particular, is under the root.
    for dir in kubelet_dirs {
        let mut all = Vec::new();
        walk(Path::new(dir), &mut all);
        assert!(
            !all.iter()
                .any(|p| p.to_string_lossy().contains(&uid_marker)
                    || p.to_string_lossy().contains(&uid)),
            "{dir} holds files of the pod"
        );
    }
    shutdown.cancel();
    let _ = task.await;
    // Stop the pod's processes: the agent leaves pods running when it stops.
    if let Ok(runtime) = kubelet::process::ProcessRuntime::new(
        kubelet::process::ProcessRuntimeConfig::new(root.join("runtime").join("process")),
    ) {
        use kubelet::seams::ContainerRuntime;
        for s in runtime
            .list_pod_sandboxes(&Default::default())
            .await
            .unwrap_or_default()
        {
            let _ = runtime.stop_pod_sandbox(&s.id).await;
            let _ = runtime.remove_pod_sandbox(&s.id).await;
        }
    }
}
