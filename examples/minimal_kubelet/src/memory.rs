//! How the agent binary keeps its resident memory small (glibc's allocator on Linux; nothing
//! elsewhere). Process-wide settings, so they live in the binary, not in the library crates:
//!
//! - **Two malloc arenas** (`mallopt(M_ARENA_MAX, 2)`, one per async worker thread) instead of
//!   glibc's default of eight per core: each blocking-pool thread that allocates would otherwise
//!   get an arena of its own, and freed memory scattered over many arenas is rarely returned.
//! - **Freed memory is returned to the system** every [`TRIM_PERIOD`] (`malloc_trim(0)`) while
//!   the agent's resident memory grew by [`TRIM_GROWTH`] since the last trim, else every
//!   [`TRIM_IDLE_EVERY`]th period: glibc gives back only the top of its main heap by itself, so
//!   the memory a burst of pod starts used (request and response buffers, the futures of the
//!   start calls) would otherwise stay resident. One call walks the whole heap (about a
//!   millisecond at 1,000 pods); an idle agent has nothing new to give back every 5 s.
//!
//! Together with a 2 s keep-alive of the blocking-pool threads (their stacks go with them),
//! these take the agent with 110 pods on containerd from 23.8 MiB to about 19 MiB resident
//! (docs/performance.md, "Resident memory").

use std::time::Duration;

/// How often freed heap memory is returned to the system.
pub(crate) const TRIM_PERIOD: Duration = Duration::from_secs(5);

/// Growth of the resident memory since the last trim that makes the next period trim.
const TRIM_GROWTH: u64 = 1 << 20;

/// Without such growth, one period in this many trims (frees alone do not grow it).
const TRIM_IDLE_EVERY: u32 = 12;

/// Malloc arenas: one per async worker thread.
const MALLOC_ARENAS: i32 = 2;

/// Bounds the allocator's arenas. Call it first in `main`, before any thread is started.
pub(crate) fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        #[allow(unsafe_code)]
        // SAFETY: `mallopt` only sets an allocator parameter; M_ARENA_MAX takes any positive
        // value, and no other thread exists yet.
        let set = unsafe { libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS) };
        if set != 1 {
            tracing::debug!("mallopt(M_ARENA_MAX) was refused; the allocator keeps its default");
        }
    }
}

/// Returns freed heap memory to the system (see the module's documentation), until the
/// runtime stops.
pub(crate) async fn release_freed_memory() {
    let mut tick = tokio::time::interval(TRIM_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut after_last = None;
    let mut skipped = 0;
    loop {
        tick.tick().await;
        if trim_due(resident_bytes(), after_last, skipped) {
            trim();
            after_last = resident_bytes();
            skipped = 0;
        } else {
            skipped += 1;
        }
    }
}

/// Whether this period trims: the resident memory (`now`) grew by [`TRIM_GROWTH`] since the
/// last trim left it at `after_last`, or `skipped` periods in a row did not trim; when either
/// figure is unknown, always.
fn trim_due(now: Option<u64>, after_last: Option<u64>, skipped: u32) -> bool {
    match (now, after_last) {
        (Some(now), Some(last)) => {
            now >= last.saturating_add(TRIM_GROWTH) || skipped + 1 >= TRIM_IDLE_EVERY
        }
        _ => true,
    }
}

/// The agent's resident memory, bytes (`/proc/self/statm`).
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages.saturating_mul(page_size()))
}

fn page_size() -> u64 {
    #[cfg(target_os = "linux")]
    {
        #[allow(unsafe_code)]
        // SAFETY: `sysconf` only reads a system constant.
        let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if let Ok(size) = u64::try_from(size)
            && size > 0
        {
            return size;
        }
    }
    4096
}

fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        #[allow(unsafe_code)]
        // SAFETY: `malloc_trim` is thread-safe; it only releases free pages of the heap.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_agent_trims_once_in_a_while_a_growing_one_every_period() {
        let mib = 1 << 20;
        // Grown by a MiB since the last trim: trim.
        assert!(trim_due(Some(41 * mib), Some(40 * mib), 0));
        // Not grown: skip, until the twelfth period in a row.
        assert!(!trim_due(Some(40 * mib), Some(40 * mib), 0));
        assert!(!trim_due(Some(40 * mib + 1000), Some(40 * mib), 10));
        assert!(trim_due(Some(40 * mib), Some(40 * mib), 11));
        // Shrunk (another part of the process gave memory back): skip too.
        assert!(!trim_due(Some(30 * mib), Some(40 * mib), 3));
        // Unknown: trim, as before.
        assert!(trim_due(None, Some(40 * mib), 0));
        assert!(trim_due(Some(40 * mib), None, 0));
    }
}
