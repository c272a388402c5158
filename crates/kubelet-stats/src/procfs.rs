//! `/proc` and `/sys` readers: memory, process counts and limits, boot time, network
//! interfaces, CPUs. Each takes the root it reads under (`/proc`, `/sys`), so tests lay out
//! fixtures.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

/// The buffer [`read_small`] starts with: more than any single cgroup or `/proc/<pid>` file the
/// agent samples holds.
const SMALL_FILE: usize = 4096;

/// The bytes of a small `/proc`, `/sys` or record file with fewer system calls than
/// `std::fs::read`: `open`, `read` into a 4 KiB buffer until a `read` returns 0, `close`; no
/// `statx` for a size hint (pseudo files report none) and no buffer growth for a file that
/// fits. A collection reads several of these per container, so with many pods this is most of
/// the agent's idle cost.
pub fn read_small_bytes(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut file = std::fs::File::open(path)?;
    let mut buf = vec![0u8; SMALL_FILE];
    let mut len = 0;
    loop {
        if len == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(len);
    Ok(buf)
}

/// [`read_small_bytes`] as text; invalid UTF-8 is an `InvalidData` error.
pub fn read_small(path: &Path) -> std::io::Result<String> {
    String::from_utf8(read_small_bytes(path)?)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// `/proc/meminfo` in bytes, by key (`MemTotal`, `MemFree`, `Inactive(file)`, …).
pub fn parse_meminfo(text: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some((k, rest)) = line.split_once(':') else {
            continue;
        };
        let mut it = rest.split_whitespace();
        let Some(Ok(v)) = it.next().map(str::parse::<u64>) else {
            continue;
        };
        let mult = match it.next() {
            Some("kB") => 1024,
            _ => 1,
        };
        out.insert(k.trim().to_string(), v.saturating_mul(mult));
    }
    out
}

/// The total of the `running/total` field of `/proc/loadavg`: tasks that exist now.
pub fn parse_loadavg_tasks(text: &str) -> Option<u64> {
    text.split_whitespace()
        .nth(3)?
        .split_once('/')?
        .1
        .parse()
        .ok()
}

/// `btime` of `/proc/stat`: when the machine booted, seconds since the epoch.
pub fn parse_boot_time(text: &str) -> Option<i64> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The machine's cumulative CPU time from the `cpu` line of `/proc/stat`, in ns: every field
/// but idle and iowait, in `USER_HZ` ticks (100 per second on Linux).
pub fn parse_stat_cpu_ns(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    if fields.len() < 4 {
        return None;
    }
    let busy: u64 = fields
        .iter()
        .enumerate()
        // user nice system idle iowait irq softirq steal (guest is counted in user).
        .filter(|(i, _)| *i != 3 && *i != 4 && *i < 8)
        .map(|(_, v)| *v)
        .sum();
    Some(busy.saturating_mul(10_000_000))
}

/// A process's cumulative CPU time from its `/proc/<pid>/stat` text, in ns: `utime` plus
/// `stime` (all its threads), in `USER_HZ` ticks.
pub fn parse_pid_stat_cpu_ns(text: &str) -> Option<u64> {
    // The command name may hold spaces and parentheses: the fields start after the last `)`.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime.saturating_add(stime).saturating_mul(10_000_000))
}

/// One line of `/proc/<pid>/net/dev`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct InterfaceCounters {
    /// Interface name.
    pub name: String,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Receive errors.
    pub rx_errors: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Send errors.
    pub tx_errors: u64,
}

/// The interfaces of a `/proc/<pid>/net/dev` text, loopback left out (as cAdvisor).
pub fn parse_net_dev(text: &str) -> Vec<InterfaceCounters> {
    text.lines()
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let name = name.trim();
            if name == "lo" || name.contains('|') {
                return None;
            }
            let f: Vec<u64> = rest
                .split_whitespace()
                .filter_map(|v| v.parse().ok())
                .collect();
            if f.len() < 11 {
                return None;
            }
            Some(InterfaceCounters {
                name: name.to_string(),
                rx_bytes: f[0],
                rx_errors: f[2],
                tx_bytes: f[8],
                tx_errors: f[10],
            })
        })
        .collect()
}

/// How many CPUs a list like `/sys/devices/system/cpu/online` (`0-3,8,10-11`) names.
pub fn count_cpu_list(text: &str) -> u64 {
    text.trim()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|r| match r.split_once('-') {
            Some((a, b)) => match (a.parse::<u64>(), b.parse::<u64>()) {
                (Ok(a), Ok(b)) if b >= a => b - a + 1,
                _ => 0,
            },
            None => u64::from(r.parse::<u64>().is_ok()),
        })
        .sum()
}

/// The interface of the default route in a `/proc/net/route` text.
pub fn default_route_interface(text: &str) -> Option<String> {
    text.lines().skip(1).find_map(|l| {
        let mut it = l.split_whitespace();
        let (iface, dest) = (it.next()?, it.next()?);
        (dest == "00000000").then(|| iface.to_string())
    })
}

/// Read `path` as text; `None` when it cannot be read.
pub(crate) fn read(path: &Path) -> Option<String> {
    read_small(path).ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn small_reads_return_the_whole_file_short_long_and_pseudo() {
        let dir = tempfile::tempdir().unwrap();
        for len in [
            0,
            1,
            SMALL_FILE - 1,
            SMALL_FILE,
            SMALL_FILE + 1,
            3 * SMALL_FILE + 7,
        ] {
            let text: String = (0..len)
                .map(|i| char::from(b'a' + (i % 26) as u8))
                .collect();
            let path = dir.path().join(format!("f{len}"));
            std::fs::write(&path, &text).unwrap();
            assert_eq!(read_small(&path).unwrap(), text, "{len} bytes");
        }
        // A pseudo file longer than one page is read to its end, not to the first short read.
        let mountinfo = Path::new("/proc/self/mountinfo");
        if let Ok(expected) = std::fs::read_to_string(mountinfo) {
            let got = read_small(mountinfo).unwrap();
            assert_eq!(got.lines().count(), expected.lines().count());
        }
        assert_eq!(
            read_small(&dir.path().join("missing")).unwrap_err().kind(),
            std::io::ErrorKind::NotFound
        );
        std::fs::write(dir.path().join("bad"), [0xff, 0xfe]).unwrap();
        assert_eq!(
            read_small(&dir.path().join("bad")).unwrap_err().kind(),
            std::io::ErrorKind::InvalidData
        );
    }

    #[test]
    fn a_process_cpu_time_is_utime_plus_stime_after_the_command_name() {
        let stat = "4242 (minimal (kube) let) S 1 4242 4242 0 -1 4194560 3125 0 0 0 \
                    250 75 0 0 20 0 9 0 1234 123456789 4321 18446744073709551615\n";
        assert_eq!(parse_pid_stat_cpu_ns(stat), Some(325 * 10_000_000));
        assert_eq!(parse_pid_stat_cpu_ns("4242 (x) S 1"), None);
        assert_eq!(parse_pid_stat_cpu_ns("no parenthesis"), None);
    }

    #[test]
    fn proc_texts_parse() {
        let mi = parse_meminfo(
            "MemTotal:       24575520 kB\nMemFree: 1 kB\nHugePages_Total: 0\nbad line\n",
        );
        assert_eq!(mi["MemTotal"], 24_575_520 * 1024);
        assert_eq!(mi["HugePages_Total"], 0);
        assert_eq!(mi.len(), 3);
        assert_eq!(
            parse_loadavg_tasks("0.10 0.20 0.30 2/431 12345\n"),
            Some(431)
        );
        assert_eq!(parse_loadavg_tasks("0.10"), None);
        assert_eq!(
            parse_boot_time("cpu 1 2\nbtime 1700000000\n"),
            Some(1_700_000_000)
        );
        // user nice system idle iowait irq softirq steal guest: idle and iowait left out.
        assert_eq!(
            parse_stat_cpu_ns("cpu  100 0 50 9999 9999 1 2 3 100\ncpu0 1\n"),
            Some(156 * 10_000_000)
        );
        assert_eq!(parse_stat_cpu_ns("intr 1\n"), None);
        assert_eq!(count_cpu_list("0-3,8,10-11\n"), 7);
        assert_eq!(count_cpu_list("0"), 1);
        assert_eq!(count_cpu_list("3-1,x"), 0);
    }

    #[test]
    fn net_dev_and_route_parse() {
        let dev = "Inter-|   Receive                                                |  Transmit\n \
                   face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
                   lo: 100 1 0 0 0 0 0 0 100 1 0 0 0 0 0 0\n  \
                   eth0: 5000 10 2 0 0 0 0 0 7000 12 3 0 0 0 0 0\n";
        let ifs = parse_net_dev(dev);
        assert_eq!(ifs.len(), 1);
        assert_eq!(
            ifs[0],
            InterfaceCounters {
                name: "eth0".into(),
                rx_bytes: 5000,
                rx_errors: 2,
                tx_bytes: 7000,
                tx_errors: 3
            }
        );
        let route =
            "Iface\tDestination\tGateway\nksdk0\t0000A8C0\t00000000\neth0\t00000000\t0101A8C0\n";
        assert_eq!(default_route_interface(route).as_deref(), Some("eth0"));
        assert_eq!(default_route_interface("Iface\n"), None);
    }
}
