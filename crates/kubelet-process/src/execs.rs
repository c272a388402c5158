//! Records of the commands exec'd into containers (`exec`, `exec_sync`, streaming sessions):
//! one file per running command, `<container dir>/execs/<pid>` holding its start time. A
//! command's session lives in the agent; when the agent dies (`kill -9`) its commands would
//! live on, belonging to no client, until their pod is deleted. A new runtime kills those whose
//! record is left ([`kill_stale`]); a command that ends removes its record ([`ExecRecord`]'s
//! drop).

use std::path::{Path, PathBuf};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

use crate::record::{proc_stat, process_alive};

/// The record of one running exec'd command; removed when dropped.
#[derive(Debug)]
pub(crate) struct ExecRecord(PathBuf);

impl ExecRecord {
    /// Record command `pid` of the container whose state directory is `container_dir`. `None`
    /// (nothing recorded, logged at debug) when the process is already gone or the directory
    /// cannot be written: the command runs unrecorded.
    pub(crate) fn create(container_dir: &Path, pid: u32) -> Option<Self> {
        let start = proc_stat(pid)?.start_time;
        let dir = container_dir.join("execs");
        let path = dir.join(pid.to_string());
        let written =
            std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, start.to_string()));
        match written {
            Ok(()) => Some(Self(path)),
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "could not record an exec'd command");
                None
            }
        }
    }
}

impl Drop for ExecRecord {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Kill the exec'd commands recorded under `root`'s containers whose process still runs (a
/// previous agent's sessions, which no client can reach any more), with their process groups,
/// and remove every record. Returns how many were killed.
pub(crate) fn kill_stale(root: &Path) -> usize {
    let Ok(containers) = std::fs::read_dir(root.join("containers")) else {
        return 0;
    };
    let mut killed = 0;
    for c in containers.flatten() {
        let Ok(records) = std::fs::read_dir(c.path().join("execs")) else {
            continue;
        };
        for r in records.flatten() {
            let pid = r.file_name().to_str().and_then(|n| n.parse::<u32>().ok());
            let start = std::fs::read_to_string(r.path())
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok());
            if let (Some(pid), Some(start)) = (pid, start)
                && process_alive(pid, start)
                && let Ok(raw) = i32::try_from(pid)
            {
                // Each command leads its own group (a terminal session or `process_group(0)`).
                let _ = killpg(Pid::from_raw(raw), Signal::SIGKILL);
                let _ = kill(Pid::from_raw(raw), Signal::SIGKILL);
                killed += 1;
            }
            let _ = std::fs::remove_file(r.path());
        }
    }
    if killed > 0 {
        tracing::warn!(root = %root.display(), killed, "killed commands exec'd by a previous agent whose sessions are gone");
    }
    killed
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    #[test]
    fn a_recorded_command_left_running_is_killed_and_an_ended_one_unrecorded() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("containers/c1");
        std::fs::create_dir_all(&dir).unwrap();
        let mut stale = std::process::Command::new("/bin/sleep")
            .arg("300")
            .process_group(0)
            .spawn()
            .unwrap();
        let record = ExecRecord::create(&dir, stale.id()).unwrap();
        let path = dir.join("execs").join(stale.id().to_string());
        assert!(path.exists());
        // The agent dies with its session: the record stays behind.
        std::mem::forget(record);
        // A record whose PID now names another process (another start time) kills nothing.
        std::fs::write(dir.join("execs/1"), "12345").unwrap();
        assert_eq!(kill_stale(root.path()), 1);
        let status = stale.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
        assert_eq!(std::fs::read_dir(dir.join("execs")).unwrap().count(), 0);

        let mut ended = std::process::Command::new("/bin/true").spawn().unwrap();
        let record = ExecRecord::create(&dir, ended.id());
        ended.wait().unwrap();
        drop(record);
        assert_eq!(std::fs::read_dir(dir.join("execs")).unwrap().count(), 0);
    }
}
