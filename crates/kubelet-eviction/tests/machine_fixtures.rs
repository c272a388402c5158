//! `MachineStats` against tempdir fixtures laid out like `/proc`, cgroupfs v1 and cgroup v2.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kubelet_api::ContainerRuntime;
use kubelet_api::runtime::ContainerStats;
use kubelet_core::testing::{FakeOp, FakeRuntime};
use kubelet_eviction::stats::MemoryCgroup;
use kubelet_eviction::{
    ActivePod, CgroupFs, FsLayout, IMAGE_FS_INFO_TIMEOUT, ImageFsSource, MachineStats,
    MachineStatsConfig, Signal, StatsProvider,
};
use kubelet_stats::fs::disk_usage;

const MI: u64 = 1 << 20;

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A `/proc` with 8 GiB of memory, 2 GiB free, 1 GiB inactive file cache, pid_max 4096 and
/// 400 tasks.
fn proc_fixture(root: &Path) {
    write(
        &root.join("meminfo"),
        "MemTotal:        8388608 kB\nMemFree:         2097152 kB\nMemAvailable:    4194304 kB\n\
         Buffers:           10000 kB\nCached:          3000000 kB\nInactive(file):  1048576 kB\n",
    );
    write(&root.join("loadavg"), "0.50 0.40 0.30 3/400 12345\n");
    write(&root.join("sys/kernel/pid_max"), "4096\n");
}

fn v1_memcg(dir: &Path, limit: u64, usage: u64, inactive: u64) {
    write(&dir.join("memory.limit_in_bytes"), &format!("{limit}\n"));
    write(&dir.join("memory.usage_in_bytes"), &format!("{usage}\n"));
    write(
        &dir.join("memory.stat"),
        &format!(
            "cache 1\nrss 2\ninactive_file 7\ntotal_cache 100\ntotal_rss 200\ntotal_inactive_file {inactive}\ntotal_active_file 5\n"
        ),
    );
}

fn v2_cg(dir: &Path, max: &str, current: u64, inactive: u64) {
    write(&dir.join("memory.max"), &format!("{max}\n"));
    write(&dir.join("memory.current"), &format!("{current}\n"));
    write(
        &dir.join("memory.stat"),
        &format!("anon 1000\nfile 2000\nactive_file 300\ninactive_file {inactive}\n"),
    );
    write(
        &dir.join("memory.events"),
        "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n",
    );
}

#[tokio::test]
async fn node_memory_on_cgroup_v1_is_root_usage_minus_total_inactive_file() {
    let tmp = tempfile::tempdir().unwrap();
    let proc = tmp.path().join("proc");
    proc_fixture(&proc);
    let mem = tmp.path().join("sys/fs/cgroup/memory");
    v1_memcg(&mem, u64::MAX >> 1, 5000 * MI, 1000 * MI);
    let stats = MachineStats::new(MachineStatsConfig::with_roots(
        &proc,
        Some(CgroupFs::V1 {
            memory: mem.clone(),
        }),
    ));
    let obs = stats.observe().await.unwrap();
    let m = obs[&Signal::MemoryAvailable];
    assert_eq!(m.capacity, 8192 * MI as i64);
    assert_eq!(m.available, (8192 - (5000 - 1000)) * MI as i64);
    let p = obs[&Signal::PidAvailable];
    assert_eq!((p.available, p.capacity), (4096 - 400, 4096));
    assert_eq!(stats.memory_cgroup(), Some(MemoryCgroup::V1(mem)));
}

#[tokio::test]
async fn node_memory_on_cgroup_v2_comes_from_meminfo() {
    let tmp = tempfile::tempdir().unwrap();
    let proc = tmp.path().join("proc");
    proc_fixture(&proc);
    let root = tmp.path().join("sys/fs/cgroup");
    std::fs::create_dir_all(&root).unwrap();
    let stats = MachineStats::new(MachineStatsConfig::with_roots(
        &proc,
        Some(CgroupFs::V2 { root }),
    ));
    let m = stats.observe_memory().await.unwrap()[&Signal::MemoryAvailable];
    // usage = total − free = 6 GiB; working set = 6 GiB − 1 GiB inactive file.
    assert_eq!(m.capacity, 8192 * MI as i64);
    assert_eq!(m.available, (8192 - 5120) * MI as i64);
}

#[tokio::test]
async fn a_v1_cgroup_with_a_limit_can_stand_for_the_node() {
    let tmp = tempfile::tempdir().unwrap();
    let proc = tmp.path().join("proc");
    proc_fixture(&proc);
    let mem = tmp.path().join("memory");
    v1_memcg(&mem, u64::MAX >> 1, 7000 * MI, 0);
    v1_memcg(&mem.join("slice"), 512 * MI, 400 * MI, 20 * MI);
    let cfg = MachineStatsConfig::with_roots(
        &proc,
        Some(CgroupFs::V1 {
            memory: mem.clone(),
        }),
    )
    .memory_cgroup("/slice");
    let stats = MachineStats::new(cfg);
    let m = stats.observe_memory().await.unwrap()[&Signal::MemoryAvailable];
    assert_eq!(m.capacity, 512 * MI as i64);
    assert_eq!(m.available, (512 - 380) * MI as i64);
    assert_eq!(
        stats.memory_cgroup(),
        Some(MemoryCgroup::V1(mem.join("slice")))
    );
}

#[tokio::test]
async fn a_v2_cgroup_without_a_limit_has_the_machine_as_capacity() {
    let tmp = tempfile::tempdir().unwrap();
    let proc = tmp.path().join("proc");
    proc_fixture(&proc);
    let root = tmp.path().join("cg");
    v2_cg(&root.join("pods"), "max", 3000 * MI, 500 * MI);
    v2_cg(
        &root.join("limited"),
        &(1024 * MI).to_string(),
        900 * MI,
        100 * MI,
    );
    let unlimited = MachineStats::new(
        MachineStatsConfig::with_roots(&proc, Some(CgroupFs::V2 { root: root.clone() }))
            .memory_cgroup("pods"),
    );
    let m = unlimited.observe_memory().await.unwrap()[&Signal::MemoryAvailable];
    assert_eq!(m.capacity, 8192 * MI as i64);
    assert_eq!(m.available, (8192 - 2500) * MI as i64);
    let limited = MachineStats::new(
        MachineStatsConfig::with_roots(&proc, Some(CgroupFs::V2 { root: root.clone() }))
            .memory_cgroup("limited")
            .allocatable("pods", 4096 * MI),
    );
    let obs = limited.observe_memory().await.unwrap();
    assert_eq!(
        obs[&Signal::MemoryAvailable].available,
        (1024 - 800) * MI as i64
    );
    let a = obs[&Signal::AllocatableMemoryAvailable];
    assert_eq!(
        (a.capacity, a.available),
        (4096 * MI as i64, (4096 - 2500) * MI as i64)
    );
}

#[tokio::test]
async fn malformed_files_are_typed_errors_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let proc = tmp.path().join("proc");
    proc_fixture(&proc);
    let mem = tmp.path().join("memory");
    v1_memcg(&mem, 1, 1, 1);
    write(&mem.join("memory.usage_in_bytes"), "lots\n");
    let stats = MachineStats::new(MachineStatsConfig::with_roots(
        &proc,
        Some(CgroupFs::V1 { memory: mem }),
    ));
    let e = stats.observe().await.unwrap_err().to_string();
    assert!(
        e.contains("memory.usage_in_bytes") && e.contains("not a number"),
        "{e}"
    );

    write(&proc.join("meminfo"), "nothing useful\n");
    let stats = MachineStats::new(MachineStatsConfig::with_roots(&proc, None));
    let e = stats.observe().await.unwrap_err().to_string();
    assert!(e.contains("meminfo") && e.contains("MemTotal"), "{e}");

    let stats = MachineStats::new(MachineStatsConfig::with_roots(
        tmp.path().join("absent"),
        None,
    ));
    assert!(stats.observe().await.is_err());
}

#[test]
fn the_memory_hierarchy_is_found_in_mountinfo() {
    let v1 = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
              41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
    assert_eq!(
        CgroupFs::from_mountinfo(v1),
        Some(CgroupFs::V1 {
            memory: "/sys/fs/cgroup/memory".into()
        })
    );
    let tmp = tempfile::tempdir().unwrap();
    write(
        &tmp.path().join("cgroup.controllers"),
        "cpuset cpu io memory pids\n",
    );
    let v2 = format!(
        "30 23 0:26 / {} rw - cgroup2 cgroup2 rw,nsdelegate\n",
        tmp.path().display()
    );
    assert_eq!(
        CgroupFs::from_mountinfo(&v2),
        Some(CgroupFs::V2 {
            root: tmp.path().to_path_buf()
        })
    );
    assert_eq!(CgroupFs::from_mountinfo("garbage\n"), None);
}

#[tokio::test]
async fn filesystems_are_observed_with_statvfs() {
    let tmp = tempfile::tempdir().unwrap();
    let proc = tmp.path().join("proc");
    proc_fixture(&proc);
    let stats = MachineStats::new(
        MachineStatsConfig::with_roots(&proc, None)
            .root_dir(tmp.path())
            .imagefs(tmp.path()),
    );
    let obs = stats.observe().await.unwrap();
    for s in [Signal::NodeFsAvailable, Signal::ImageFsAvailable] {
        let o = obs[&s];
        assert!(
            o.capacity > 0 && o.available >= 0 && o.available <= o.capacity,
            "{s}: {o:?}"
        );
    }
    let st = nix::sys::statvfs::statvfs(tmp.path()).unwrap();
    assert_eq!(
        obs[&Signal::NodeFsAvailable].capacity,
        st.blocks() as i64 * st.fragment_size() as i64
    );
}

#[tokio::test]
async fn pod_usage_combines_runtime_stats_with_volume_and_log_directories() {
    let tmp = tempfile::tempdir().unwrap();
    let proc = tmp.path().join("proc");
    proc_fixture(&proc);
    let root = tmp.path().join("root");
    let logs = tmp.path().join("logs");
    let vol = root.join("pods/uid-1/volumes/kubernetes.io~empty-dir/cache");
    write(&vol.join("blob"), &"x".repeat(64 * 1024));
    write(&logs.join("default_web_uid-1/app/0.log"), "hello\n");
    let rt = Arc::new(FakeRuntime::new());
    let sb = kubelet_api::runtime::PodSandboxConfig::default();
    let sid = rt.run_pod_sandbox(&sb).await.unwrap();
    let cfg = kubelet_api::runtime::ContainerConfig::default();
    let cid = rt.create_container(&sid, &cfg, &sb).await.unwrap();
    rt.set_container_stats(&cid, {
        let mut v = ContainerStats::default();
        v.container_id = cid.clone();
        v.memory_working_set_bytes = Some(300 * MI);
        v.process_count = Some(7);
        v.writable_layer_bytes = Some(5 * MI);
        v.writable_layer_inodes = Some(100);
        v
    });
    let stats = MachineStats::new(
        MachineStatsConfig::with_roots(&proc, None)
            .root_dir(&root)
            .pod_log_dir(&logs),
    )
    .with_runtime(rt);
    let mut pod = Pod {
        spec: Some(k8s_openapi::api::core::v1::PodSpec {
            containers: vec![k8s_openapi::api::core::v1::Container {
                name: "app".into(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    pod.metadata.name = Some("web".into());
    pod.metadata.namespace = Some("default".into());
    pod.metadata.uid = Some("uid-1".into());
    let active = vec![ActivePod {
        pod: Arc::new(pod),
        containers: vec![("app".into(), cid.clone())],
    }];
    let usage = stats.pod_usage(&active).await;
    let u = &usage["uid-1"];
    assert_eq!(u.memory(), Some(300 * MI));
    assert_eq!(u.processes(), Some(7));
    assert!(
        u.volumes["cache"] >= 64 * 1024,
        "per-emptyDir usage: {:?}",
        u.volumes
    );
    assert!(
        u.containers[0].disk_bytes.unwrap() > 5 * MI,
        "the container's writable layer and log directory count: {:?}",
        u.containers[0].disk_bytes
    );
    let disk = u.disk().unwrap();
    assert!(disk >= 64 * 1024, "volume bytes counted: {disk}");
    assert!(
        u.inodes.unwrap() >= 106,
        "directories and files counted: {:?}",
        u.inodes
    );
    let (b, i) = disk_usage(&vol).unwrap();
    assert!(b >= 64 * 1024 && i == 2);
}

/// A directory on another filesystem than the tempdirs, to stand for a dedicated image
/// filesystem: `/dev/shm` (tmpfs) where there is one.
fn other_fs() -> std::path::PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        Path::new("/").to_path_buf()
    }
}

fn fs_usage(mountpoint: &Path) -> kubelet_api::runtime::FilesystemUsage {
    {
        let mut v = kubelet_api::runtime::FilesystemUsage::default();
        v.mountpoint = mountpoint.to_path_buf();
        v.used_bytes = Some(1 << 20);
        v.inodes_used = Some(10);
        v
    }
}

fn statvfs_capacity(path: &Path) -> (i64, i64) {
    let st = nix::sys::statvfs::statvfs(path).unwrap();
    (
        st.blocks() as i64 * st.fragment_size() as i64,
        st.files() as i64,
    )
}

fn same_device(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(a).unwrap().dev() == std::fs::metadata(b).unwrap().dev()
}

#[tokio::test]
async fn imagefs_is_read_at_the_mountpoint_the_runtime_reports() {
    let tmp = tempfile::tempdir().unwrap();
    let proc = tmp.path().join("proc");
    proc_fixture(&proc);
    let image_dir = other_fs();
    let rt = Arc::new(FakeRuntime::new());
    rt.set_image_fs_info(Some({
        let mut v = kubelet_api::runtime::ImageFsInfo::default();
        v.image_filesystems = vec![fs_usage(&image_dir)];
        v.container_filesystems = vec![];
        v
    }));
    let stats = MachineStats::new(
        MachineStatsConfig::with_roots(&proc, None)
            .root_dir(tmp.path())
            .imagefs(tmp.path().join("configured")),
    )
    .with_runtime(rt.clone());
    assert_eq!(
        stats.image_fs().await,
        Some(ImageFsSource::Runtime(image_dir.clone())),
        "the runtime's report wins over the configured path"
    );
    let obs = stats.observe().await.unwrap();
    let (bytes, inodes) = statvfs_capacity(&image_dir);
    assert_eq!(obs[&Signal::ImageFsAvailable].capacity, bytes);
    if inodes > 0 {
        assert_eq!(obs[&Signal::ImageFsInodesFree].capacity, inodes);
    }
    assert_eq!(
        obs[&Signal::NodeFsAvailable].capacity,
        statvfs_capacity(tmp.path()).0
    );
    let expected = if same_device(&image_dir, tmp.path()) {
        FsLayout::Single
    } else {
        FsLayout::SeparateImageFs
    };
    assert_eq!(stats.fs_layout().await, expected);

    // Images apart, writable layers on nodefs: a split layout.
    rt.set_image_fs_info(Some({
        let mut v = kubelet_api::runtime::ImageFsInfo::default();
        v.image_filesystems = vec![fs_usage(&image_dir)];
        v.container_filesystems = vec![fs_usage(tmp.path())];
        v
    }));
    if expected == FsLayout::SeparateImageFs {
        assert_eq!(stats.fs_layout().await, FsLayout::SplitContainerFs);
    }
}

#[tokio::test]
async fn without_a_runtime_image_filesystem_imagefs_is_nodefs_or_the_configured_path() {
    let tmp = tempfile::tempdir().unwrap();
    let proc = tmp.path().join("proc");
    proc_fixture(&proc);
    // FakeRuntime without an image filesystem answers Unimplemented, as the process runtime.
    let rt = Arc::new(FakeRuntime::new());
    let stats = MachineStats::new(MachineStatsConfig::with_roots(&proc, None).root_dir(tmp.path()))
        .with_runtime(rt.clone());
    assert_eq!(
        stats.image_fs().await,
        Some(ImageFsSource::NodeFs(tmp.path().to_path_buf()))
    );
    let obs = stats.observe().await.unwrap();
    assert_eq!(
        obs[&Signal::ImageFsAvailable].capacity,
        obs[&Signal::NodeFsAvailable].capacity
    );
    assert_eq!(
        obs[&Signal::ImageFsInodesFree].capacity,
        obs[&Signal::NodeFsInodesFree].capacity
    );
    assert_eq!(stats.fs_layout().await, FsLayout::Single);

    // An empty report means the same.
    rt.set_image_fs_info(Some(kubelet_api::runtime::ImageFsInfo::default()));
    assert_eq!(
        stats.image_fs().await,
        Some(ImageFsSource::NodeFs(tmp.path().to_path_buf()))
    );

    // A configured path stands in for runtimes that report nothing.
    let other = other_fs();
    let stats = MachineStats::new(
        MachineStatsConfig::with_roots(&proc, None)
            .root_dir(tmp.path())
            .imagefs(&other),
    )
    .with_runtime(Arc::new(FakeRuntime::new()));
    assert_eq!(
        stats.image_fs().await,
        Some(ImageFsSource::Configured(other.clone()))
    );
    let obs = stats.observe().await.unwrap();
    assert_eq!(
        obs[&Signal::ImageFsAvailable].capacity,
        statvfs_capacity(&other).0
    );

    // No runtime, no nodefs, no configured path: imagefs is not observed.
    let stats = MachineStats::new(MachineStatsConfig::with_roots(&proc, None));
    assert_eq!(stats.image_fs().await, None);
    let obs = stats.observe().await.unwrap();
    assert!(!obs.contains_key(&Signal::ImageFsAvailable));
}

#[tokio::test(start_paused = true)]
async fn a_failing_or_stuck_runtime_keeps_the_last_reported_image_filesystem() {
    let tmp = tempfile::tempdir().unwrap();
    let proc = tmp.path().join("proc");
    proc_fixture(&proc);
    let image_dir = other_fs();
    let rt = Arc::new(FakeRuntime::new());
    rt.set_image_fs_info(Some({
        let mut v = kubelet_api::runtime::ImageFsInfo::default();
        v.image_filesystems = vec![fs_usage(&image_dir)];
        v.container_filesystems = vec![];
        v
    }));
    let stats = MachineStats::new(MachineStatsConfig::with_roots(&proc, None).root_dir(tmp.path()))
        .with_runtime(rt.clone());
    let reported = Some(ImageFsSource::Runtime(image_dir.clone()));
    assert_eq!(stats.image_fs().await, reported);

    rt.fail_always(
        FakeOp::ImageFsInfo,
        kubelet_api::ErrorKind::Unavailable,
        "runtime restarting",
    );
    assert_eq!(stats.image_fs().await, reported);
    rt.clear_failures(FakeOp::ImageFsInfo);

    rt.set_op_delay(FakeOp::ImageFsInfo, Duration::from_secs(60));
    let started = tokio::time::Instant::now();
    assert_eq!(stats.image_fs().await, reported);
    assert_eq!(started.elapsed(), IMAGE_FS_INFO_TIMEOUT);
    rt.set_op_delay(FakeOp::ImageFsInfo, Duration::ZERO);

    // The runtime now says it has none: nodefs.
    rt.set_image_fs_info(None);
    assert_eq!(
        stats.image_fs().await,
        Some(ImageFsSource::NodeFs(tmp.path().to_path_buf()))
    );
}
