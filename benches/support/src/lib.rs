//! What the benchmark harnesses under `benches/` share, so that every harness computes its
//! quantiles and reads memory the same way.

use std::time::Duration;

/// The `p` quantile (0 to 1) of `sorted` (ascending): the element at index
/// `round((len − 1) · p)`; `T::default()` for an empty slice.
pub fn percentile<T: Copy + Default>(sorted: &[T], p: f64) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// `d` in milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `VmRSS` of process `pid` in KiB (`/proc/<pid>/status`); 0 when it cannot be read.
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_round_to_the_nearest_index() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&v, 0.5), Duration::from_millis(51));
        assert_eq!(percentile(&v, 0.99), Duration::from_millis(99));
        assert_eq!(percentile(&v, 1.0), Duration::from_millis(100));
        assert_eq!(percentile::<Duration>(&[], 0.5), Duration::ZERO);
        assert_eq!(ms(Duration::from_micros(1500)), 1.5);
    }

    #[test]
    fn this_process_has_resident_memory_and_a_port_is_found() {
        assert!(rss_kib(std::process::id()) > 0);
        assert_eq!(rss_kib(u32::MAX), 0);
        assert!(free_port().expect("port") > 0);
    }
}
