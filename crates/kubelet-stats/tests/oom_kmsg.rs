#![allow(clippy::unwrap_used)]
//! The OOM watcher against the real kernel log: lines written to `/dev/kmsg` (as root) in the
//! kernel's formats come back through the watcher as a `SystemOOM` event on the Node, and a
//! cgroup's OOM makes none.

use std::time::Duration;

use kubelet_api::{EventRecorder, EventType};
use tokio_util::sync::CancellationToken;

fn kmsg_writable_or_skip() -> bool {
    let required = std::env::var("KUBELET_SDK_REQUIRE_ROOT").as_deref() == Ok("1");
    let ok = nix::unistd::geteuid().is_root()
        && std::fs::OpenOptions::new()
            .write(true)
            .open(kubelet_stats::oom::KMSG)
            .is_ok();
    if !ok {
        assert!(
            !required,
            "KUBELET_SDK_REQUIRE_ROOT=1 but /dev/kmsg is not writable as root"
        );
        println!("SKIPPED: needs root and a writable /dev/kmsg");
    }
    ok
}

fn log(line: &str) {
    // One write is one record.
    std::fs::write(kubelet_stats::oom::KMSG, format!("<3>{line}\n")).expect("write /dev/kmsg");
}

#[tokio::test]
async fn a_system_oom_in_the_kernel_log_becomes_a_node_event_and_a_cgroup_oom_does_not() {
    if !kmsg_writable_or_skip() {
        return;
    }
    let (recorder, mut events) = EventRecorder::channel(16);
    let shutdown = CancellationToken::new();
    let watcher = {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            kubelet_stats::oom::watch(
                std::path::Path::new(kubelet_stats::oom::KMSG),
                None,
                "oom-node",
                &recorder,
                &shutdown,
            )
            .await
        })
    };
    // The watcher starts at the end of the log: give it a moment to open it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let token = format!("kubelet-sdk-oom-test-{}", std::process::id());
    // A cgroup's OOM (its limit): no event.
    log(&format!(
        "{token}-c invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0"
    ));
    log(&format!(
        "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/kubelet-sdk/s/c,task_memcg=/kubelet-sdk/s/c,task={token}-c,pid=4241,uid=0"
    ));
    // A system OOM.
    log(&format!(
        "{token} invoked oom-killer: gfp_mask=0x100cca(GFP_HIGHUSER_MOVABLE), order=0, oom_score_adj=0"
    ));
    log("Mem-Info:");
    log(&format!(
        "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/user.slice,task={token},pid=4242,uid=0"
    ));
    let event = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let e = events.recv().await.expect("the recorder is open");
            if e.message.contains(&token) {
                return e;
            }
        }
    })
    .await
    .expect("a SystemOOM event within 10 s");
    assert_eq!(event.reason, "SystemOOM");
    assert_eq!(event.type_, EventType::Warning);
    assert_eq!(event.involved.kind, "Node");
    assert_eq!(event.involved.name, "oom-node");
    assert_eq!(
        event.message,
        format!("System OOM encountered, victim process: {token}, pid: 4242")
    );
    // Nothing for the cgroup OOM, before or after.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    while let Ok(e) = events.try_recv() {
        assert!(!e.message.contains(&format!("{token}-c")), "{e:?}");
    }
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), watcher)
        .await
        .expect("the watcher stops at shutdown")
        .expect("no panic");
}

#[tokio::test]
async fn an_unreadable_kernel_log_ends_the_watcher_quietly() {
    let (recorder, _events) = EventRecorder::channel(1);
    let shutdown = CancellationToken::new();
    tokio::time::timeout(
        Duration::from_secs(5),
        kubelet_stats::oom::watch(
            std::path::Path::new("/nonexistent/kmsg"),
            None,
            "n",
            &recorder,
            &shutdown,
        ),
    )
    .await
    .expect("returns at once");
}
