//! The kernel wake-up paths of the fast memory check against the real kernel, as root: a PSI
//! trigger on a cgroup v2 `memory.pressure` file and on `/proc/pressure/memory` fire when a
//! process in a memory-limited test cgroup stalls on reclaim; where the v2 hierarchy holds the
//! memory controller, the inotify watch on `memory.events` fires too.
//!
//! Works on cgroup v2 and on hybrid cgroup v1 hosts: the limit is set wherever the memory
//! controller lives (v1 `memory.limit_in_bytes` or v2 `memory.max`) and the stalling process
//! joins both test cgroups, since PSI is accounted per cgroup of the unified hierarchy whatever
//! the controller layout. Skipped with a message (failing under `KUBELET_SDK_REQUIRE_ROOT=1`)
//! without root, PSI or a cgroup2 mount.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kubelet_eviction::CgroupFs;
use kubelet_eviction::notify::KernelWakers;
use kubelet_eviction::stats::MemoryCgroup;

const LIMIT: u64 = 16 << 20;
const WAIT: Duration = Duration::from_secs(30);

fn skip(test: &str, reason: &str) {
    if std::env::var("KUBELET_SDK_REQUIRE_ROOT").as_deref() == Ok("1") {
        panic!("{test}: KUBELET_SDK_REQUIRE_ROOT=1 but {reason}");
    }
    eprintln!("SKIP {test}: {reason}");
}

/// The unified (cgroup2) mount point, if any: `/sys/fs/cgroup` on v2 hosts,
/// `/sys/fs/cgroup/unified` on hybrid ones.
fn cgroup2_mount() -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    text.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        let mount_point = pre.split_whitespace().nth(4)?;
        (post.split_whitespace().next()? == "cgroup2").then(|| PathBuf::from(mount_point))
    })
}

/// Test cgroups (a v2 one, plus a v1 memory cgroup on hybrid hosts) and the stalling process
/// in them; everything is killed and removed on drop, also when the test fails.
struct Stall {
    v2: PathBuf,
    v1: Option<PathBuf>,
    file: PathBuf,
    child: Option<Child>,
}

impl Stall {
    fn cgroups(v2_root: &Path, memory: &CgroupFs, name: &str) -> std::io::Result<Self> {
        let v2 = v2_root.join(name);
        let mut s = Stall {
            v2: v2.clone(),
            v1: None,
            file: Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}.data")),
            child: None,
        };
        match memory {
            CgroupFs::V2 { .. } => {
                let _ = std::fs::write(v2_root.join("cgroup.subtree_control"), "+memory");
                std::fs::create_dir(&v2)?;
                std::fs::write(v2.join("memory.max"), LIMIT.to_string())?;
                let _ = std::fs::write(v2.join("memory.swap.max"), "0");
            }
            CgroupFs::V1 { memory } => {
                std::fs::create_dir(&v2)?;
                let v1 = memory.join(name);
                s.v1 = Some(v1.clone());
                std::fs::create_dir(&v1)?;
                std::fs::write(v1.join("memory.limit_in_bytes"), LIMIT.to_string())?;
            }
        }
        Ok(s)
    }

    /// A shell that joins the test cgroups and keeps rewriting a 64 MiB file: with 16 MiB of
    /// memory, every pass reclaims (and writes back) its own page cache, stalling on memory.
    fn start(&mut self) {
        let mut join = format!("echo $$ > {}/cgroup.procs", self.v2.display());
        if let Some(v1) = &self.v1 {
            join += &format!(" && echo $$ > {}/cgroup.procs", v1.display());
        }
        let script = format!(
            "{join} && while :; do dd if=/dev/zero of={} bs=1M count=64 conv=notrunc 2>/dev/null; done",
            self.file.display()
        );
        self.child = Some(
            Command::new("sh")
                .arg("-c")
                .arg(script)
                .stdin(Stdio::null())
                .spawn()
                .unwrap(),
        );
    }

    fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.v2.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }
}

impl Drop for Stall {
    fn drop(&mut self) {
        // Only our shell and its dd live in the test cgroup: kill them by PID until it is empty.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let pids = self.pids();
            if pids.is_empty() || Instant::now() > deadline {
                break;
            }
            for pid in pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
        for d in [Some(&self.v2), self.v1.as_ref()].into_iter().flatten() {
            if d.is_dir()
                && let Err(e) = std::fs::remove_dir(d)
            {
                eprintln!("removing test cgroup {}: {e}", d.display());
            }
        }
        let _ = std::fs::remove_file(&self.file);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psi_triggers_fire_on_a_real_memory_stall() {
    const TEST: &str = "psi_triggers_fire_on_a_real_memory_stall";
    if !nix::unistd::Uid::effective().is_root() {
        return skip(TEST, "needs root to create cgroups and PSI triggers");
    }
    if !Path::new("/proc/pressure/memory").exists() {
        return skip(
            TEST,
            "no /proc/pressure/memory (kernel without PSI, or psi=0)",
        );
    }
    let Some(v2_root) = cgroup2_mount() else {
        return skip(TEST, "no cgroup2 mount for per-cgroup memory.pressure");
    };
    let Some(memory) = CgroupFs::detect(Path::new("/proc")) else {
        return skip(TEST, "no memory cgroup controller to impose a limit");
    };
    let name = format!("kubelet-sdk-psi-test-{}", std::process::id());
    let mut stall = Stall::cgroups(&v2_root, &memory, &name).unwrap();

    // What the manager sets up for a v2 memory cgroup, and for the node (v1 or no cgroup).
    let mut cgroup_wakers = KernelWakers::new(
        Some(&MemoryCgroup::V2(stall.v2.clone())),
        Path::new("/proc"),
    );
    let node_wakers = KernelWakers::new(None, Path::new("/proc"));
    let cgroup_psi = cgroup_wakers
        .psi
        .take()
        .expect("PSI trigger on the test cgroup's memory.pressure");
    let node_psi = node_wakers
        .psi
        .as_ref()
        .expect("PSI trigger on /proc/pressure/memory");
    let v2_memory = matches!(memory, CgroupFs::V2 { .. });
    assert_eq!(
        cgroup_wakers.events.is_some(),
        v2_memory,
        "memory.events is watched exactly when the v2 hierarchy has the memory controller"
    );

    // Nothing runs in the test cgroup yet: its trigger stays quiet.
    assert!(
        tokio::time::timeout(Duration::from_millis(500), cgroup_psi.fired())
            .await
            .is_err(),
        "the test cgroup's PSI trigger fired before anything ran in it"
    );

    let started = Instant::now();
    stall.start();
    tokio::time::timeout(WAIT, cgroup_psi.fired())
        .await
        .expect("the cgroup's memory.pressure trigger fires on a real stall");
    let cgroup_after = started.elapsed();
    tokio::time::timeout(WAIT, node_psi.fired())
        .await
        .expect("the /proc/pressure/memory trigger fires on a real stall");
    if let Some(events) = cgroup_wakers.events.as_mut() {
        tokio::time::timeout(WAIT, events.changed())
            .await
            .expect("memory.events changes when the cgroup hits memory.max");
    }
    eprintln!(
        "{TEST}: cgroup memory.pressure trigger fired {cgroup_after:?} after the stall began \
         (memory.events watched: {v2_memory})"
    );
    drop(stall);
    assert!(
        !v2_root.join(&name).exists(),
        "test cgroup removed after the test"
    );
}
