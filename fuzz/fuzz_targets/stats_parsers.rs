//! Fuzz the machine readers of `kubelet-stats`: mountinfo, `/proc/<pid>/cgroup`, flat-keyed
//! cgroup files, `/proc/meminfo`, `loadavg`, `stat`, `net/dev`, `net/route`, CPU lists and
//! kernel log records through the OOM parser. Whatever the kernel (or a fixture) says, parsing
//! ends in figures or nothing, never a panic. Run: `cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run
//! stats_parsers`. The seeds in `corpus/stats_parsers` also run, with fixed mutations, in
//! `cargo test -p kubelet-stats --test parsers_no_panic`.
#![no_main]

use kubelet_stats::{cgroup, oom, procfs};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mounts = cgroup::parse_mountinfo(&text);
    if let Some(setup) = cgroup::CgroupSetup::from_mounts(&mounts) {
        let _ = setup.cgroup_of(&text);
    }
    let _ = cgroup::parse_keyed(&text);
    let _ = cgroup::parse_u64(&text);
    let _ = procfs::parse_meminfo(&text);
    let _ = procfs::parse_loadavg_tasks(&text);
    let _ = procfs::parse_boot_time(&text);
    let _ = procfs::parse_stat_cpu_ns(&text);
    let _ = procfs::parse_net_dev(&text);
    let _ = procfs::count_cpu_list(&text);
    let _ = procfs::default_route_interface(&text);
    let mut parser = oom::OomParser::default();
    for line in text.lines() {
        if let Some(record) = oom::parse_kmsg(line) {
            let _ = parser.feed(record.message, None);
        }
        let _ = parser.feed(line, None);
    }
});
