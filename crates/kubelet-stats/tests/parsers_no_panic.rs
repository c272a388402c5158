//! The machine readers never panic: the `cargo fuzz` target's seeds (`fuzz/corpus/stats_parsers`:
//! mountinfo, meminfo, memory.stat, stat, net/dev, net/route, loadavg, /proc/<pid>/cgroup, kmsg,
//! a CPU list) and a fixed set of mutations of each go through every parser.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use kubelet_stats::{cgroup, oom, procfs};

fn exercise(data: &[u8]) {
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
}

/// xorshift64*: the same mutations in every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

const INTERESTING: [&[u8]; 10] = [
    b" - ",
    b":",
    b";",
    b",",
    b"=",
    b"-",
    b"/",
    b"\n",
    b"18446744073709551616",
    b"\xff",
];

fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut data = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(data.len() + 1);
        match rng.below(4) {
            0 if !data.is_empty() => {
                let i = at.min(data.len() - 1);
                data[i] ^= 1 << rng.below(8);
            }
            1 => {
                let ins = INTERESTING[rng.below(INTERESTING.len())];
                data.splice(at..at, ins.iter().copied());
            }
            2 if !data.is_empty() => {
                let end = (at + rng.below(16)).min(data.len());
                data.drain(at.min(end)..end);
            }
            _ => data.truncate(at),
        }
    }
    data
}

#[test]
fn the_seeded_fuzz_corpus_and_its_mutations_never_panic() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/stats_parsers");
    let mut seeds: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    seeds.sort();
    assert!(seeds.len() >= 10, "the corpus has its seeds");
    let mut rng = Rng(0x57a7_5eed_0bad_cafe);
    for seed in &seeds {
        let data = std::fs::read(seed).unwrap();
        exercise(&data);
        for _ in 0..500 {
            exercise(&mutate(&mut rng, &data));
        }
    }
    // The seeds themselves parse to figures.
    let read = |n: &str| std::fs::read_to_string(dir.join(n)).unwrap();
    assert!(procfs::parse_meminfo(&read("meminfo")).contains_key("MemTotal"));
    assert_eq!(procfs::parse_loadavg_tasks(&read("loadavg")), Some(431));
    assert!(!cgroup::parse_mountinfo(&read("mountinfo")).v1.is_empty());
    assert_eq!(cgroup::parse_mountinfo(&read("mountinfo-v2")).v2.len(), 1);
    assert_eq!(procfs::count_cpu_list(&read("cpu-online")), 7);
    let mut p = oom::OomParser::default();
    let ooms: Vec<_> = read("kmsg")
        .lines()
        .filter_map(|l| p.feed(oom::parse_kmsg(l)?.message, None))
        .collect();
    assert_eq!(ooms.len(), 1);
    assert_eq!(ooms[0].pid, Some(42));
}
