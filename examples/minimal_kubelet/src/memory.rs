//! How the agent binary keeps its resident memory small (glibc's allocator on Linux; nothing
//! elsewhere). Process-wide settings, so they live in the binary, not in the library crates:
//!
//! - **Two malloc arenas** (`mallopt(M_ARENA_MAX, 2)`, one per async worker thread) instead of
//!   glibc's default of eight per core: each blocking-pool thread that allocates would otherwise
//!   get an arena of its own, and freed memory scattered over many arenas is rarely returned.
//! - **Freed memory is returned to the system** every [`TRIM_PERIOD`] (`malloc_trim(0)`): glibc
//!   gives back only the top of its main heap by itself, so the memory a burst of pod starts
//!   used (request and response buffers, the futures of the start calls) would otherwise stay
//!   resident. One call takes well under a millisecond with a few MiB of heap.
//!
//! Together with a 2 s keep-alive of the blocking-pool threads (their stacks go with them),
//! these take the agent with 110 pods on containerd from 23.8 MiB to about 19 MiB resident
//! (docs/performance.md, "Resident memory").

use std::time::Duration;

/// How often freed heap memory is returned to the system.
pub(crate) const TRIM_PERIOD: Duration = Duration::from_secs(5);

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

/// Returns freed heap memory to the system every [`TRIM_PERIOD`], until the runtime stops.
pub(crate) async fn release_freed_memory() {
    let mut tick = tokio::time::interval(TRIM_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        trim();
    }
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
