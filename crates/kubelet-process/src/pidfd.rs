//! The two places where the runtime needs the kernel directly, each a single system call:
//! process file descriptors (`pidfd_open(2)`, Linux ≥ 5.3), which become readable the moment
//! their process exits, and the parent-death signal the shim gives each container's process.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;

use nix::sys::signal::Signal;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use crate::record::process_alive;

/// A descriptor for process `pid` (close-on-exec). Fails with `ESRCH` when there is no such
/// process and `ENOSYS` on kernels before 5.3.
pub(crate) fn open(pid: u32) -> io::Result<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    #[allow(unsafe_code)]
    // SAFETY: pidfd_open reads only its two integer arguments and returns a new descriptor or
    // -1; it touches no memory of this process.
    let ret = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0 as libc::c_uint) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = RawFd::try_from(ret).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    #[allow(unsafe_code)]
    // SAFETY: the kernel has just returned this descriptor to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Watch process `pid` started at `start_time` (`/proc/<pid>/stat` field 22): the returned
/// descriptor becomes readable when that process exits. `None` when it is already gone, the
/// PID now names another process, or the kernel has no pidfds.
pub(crate) fn watch(pid: u32, start_time: u64) -> Option<AsyncFd<OwnedFd>> {
    let fd = open(pid).ok()?;
    // Checked after opening: a PID reused before the open would have another start time.
    if !process_alive(pid, start_time) {
        return None;
    }
    #[allow(unsafe_code)]
    // SAFETY: `fd` is an `OwnedFd` moved into the `AsyncFd`: it stays open until the `AsyncFd`
    // is dropped, and `as_raw_fd` always returns that same descriptor.
    let registered = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) };
    registered.ok()
}

/// Make the process `cmd` starts receive SIGKILL when its parent, process `parent` (the
/// caller), dies: no container outlives its supervisor.
pub(crate) fn die_with_parent(cmd: &mut std::process::Command, parent: u32) {
    let parent = nix::unistd::Pid::from_raw(i32::try_from(parent).unwrap_or(i32::MAX));
    let hook = move || -> io::Result<()> {
        nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
            .map_err(|e| io::Error::from_raw_os_error(e as i32))?;
        // The parent may have died between fork and prctl: then nobody would send the signal.
        if nix::unistd::getppid() != parent {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        Ok(())
    };
    #[allow(unsafe_code)]
    // SAFETY: the hook runs in the child between fork and exec. It makes two system calls
    // (prctl, getppid), allocates nothing and takes no lock. It is installed after the
    // credentials are changed (std runs pre_exec hooks after setuid/setgid), so the
    // parent-death signal, which a credential change clears, stays set.
    unsafe {
        cmd.pre_exec(hook);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_pidfd_becomes_readable_when_its_process_exits() {
        let mut child = std::process::Command::new("/bin/sleep")
            .arg("0.2")
            .spawn()
            .expect("spawn sleep");
        let pid = child.id();
        let start = crate::record::proc_stat(pid).expect("stat").start_time;
        let fd = watch(pid, start).expect("pidfd");
        assert!(
            watch(pid, start + 1).is_none(),
            "a wrong start time is refused"
        );
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), fd.readable())
            .await
            .expect("readable within 10 s")
            .expect("poll");
        child.wait().expect("reap");
    }
}
