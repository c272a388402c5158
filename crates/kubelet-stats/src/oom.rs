//! The OOM watcher: kernel OOM kills read from `/dev/kmsg`, system OOMs reported as a
//! `SystemOOM` warning event on the Node (the kubelet's `oom_watcher_linux.go` over cAdvisor's
//! `oomparser`).
//!
//! A kill caused by a container's own memory limit is not reported here: it reaches the pod as
//! its container's `OOMKilled` termination, through the runtime.

use std::path::{Path, PathBuf};

use jiff::{SignedDuration, Timestamp};
use kubelet_api::{EventRecorder, InvolvedObject};
use tokio_util::sync::CancellationToken;

/// The kubelet's event reason for a system OOM.
pub const SYSTEM_OOM_REASON: &str = "SystemOOM";
/// The kernel log device.
pub const KMSG: &str = "/dev/kmsg";

/// One OOM kill, as the kernel logged it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OomInstance {
    /// When it happened (from the record's monotonic stamp and the boot time; `None` when the
    /// boot time is unknown).
    pub time: Option<Timestamp>,
    /// The killed process.
    pub pid: Option<u32>,
    /// The killed process' name.
    pub process_name: String,
    /// The cgroup of the killed task (`task_memcg`), `/` when unknown.
    pub container: String,
    /// The cgroup whose limit was hit (`oom_memcg`): `/` for a system-wide OOM.
    pub victim_container: String,
    /// `CONSTRAINT_MEMCG`, `CONSTRAINT_NONE`, … when the kernel says.
    pub constraint: String,
}

impl OomInstance {
    /// True for a system OOM (the whole machine ran out, not a cgroup's limit).
    pub fn is_system(&self) -> bool {
        self.victim_container == "/"
    }

    /// The kubelet's event message.
    pub fn message(&self) -> String {
        match self.pid {
            Some(pid) if !self.process_name.is_empty() => format!(
                "System OOM encountered, victim process: {}, pid: {pid}",
                self.process_name
            ),
            _ => "System OOM encountered".to_string(),
        }
    }
}

/// One `/dev/kmsg` record: `<prio>,<seq>,<usec since boot>,<flags>;<message>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KmsgRecord<'a> {
    /// Sequence number.
    pub sequence: u64,
    /// Microseconds since boot.
    pub micros: u64,
    /// The message.
    pub message: &'a str,
}

/// Parse one record; `None` for continuation lines and anything malformed.
pub fn parse_kmsg(record: &str) -> Option<KmsgRecord<'_>> {
    let (prefix, message) = record.split_once(';')?;
    let mut it = prefix.split(',');
    let (_prio, seq, micros) = (it.next()?, it.next()?, it.next()?);
    Some(KmsgRecord {
        sequence: seq.parse().ok()?,
        micros: micros.parse().ok()?,
        message: message.lines().next().unwrap_or("").trim_end(),
    })
}

/// The OOM state machine over kernel log messages (cAdvisor's `oomparser`): a line with
/// `invoked oom-killer:` opens an instance, an `oom-kill:` line (kernels ≥ 4.19) completes it,
/// or a legacy `Task in … killed as a result of limit of …` line names the cgroups and a
/// `Killed process <pid> (<name>)` line completes it.
#[derive(Debug, Default)]
pub struct OomParser {
    open: Option<OomInstance>,
}

impl OomParser {
    /// Feed one message logged at `time`; returns a completed instance.
    pub fn feed(&mut self, message: &str, time: Option<Timestamp>) -> Option<OomInstance> {
        if message.contains("invoked oom-killer:") {
            self.open = Some(OomInstance {
                time,
                pid: None,
                process_name: String::new(),
                container: "/".into(),
                victim_container: "/".into(),
                constraint: String::new(),
            });
            return None;
        }
        let open = self.open.as_mut()?;
        if let Some(rest) = message.trim_start().strip_prefix("oom-kill:") {
            for kv in rest.split(',') {
                let Some((k, v)) = kv.split_once('=') else {
                    continue;
                };
                match k.trim() {
                    "constraint" => open.constraint = v.to_string(),
                    "oom_memcg" => open.victim_container = v.to_string(),
                    "task_memcg" => open.container = v.to_string(),
                    "task" => open.process_name = v.to_string(),
                    "pid" => open.pid = v.trim().parse().ok(),
                    _ => {}
                }
            }
            return self.open.take();
        }
        if let Some(rest) = message.trim_start().strip_prefix("Task in ")
            && let Some((task, limit)) = rest.split_once(" killed as a result of limit of ")
        {
            open.container = slash(task);
            open.victim_container = slash(limit.trim());
            return None;
        }
        if let Some(i) = message.find("Killed process ") {
            let rest = &message[i + "Killed process ".len()..];
            let (pid, rest) = rest.split_once(' ').unwrap_or((rest, ""));
            open.pid = pid.parse().ok();
            if let Some(name) = rest.strip_prefix('(').and_then(|r| r.split_once(')')) {
                open.process_name = name.0.to_string();
            }
            return self.open.take();
        }
        None
    }
}

fn slash(path: &str) -> String {
    if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    }
}

/// Watches the kernel log from now on and records a `SystemOOM` warning on node `node_name`
/// for each system OOM. Returns when `shutdown` is cancelled; when the log cannot be read (no
/// `/dev/kmsg`, no permission) it says so once and returns, and system OOMs go unreported.
pub async fn watch(
    kmsg: &Path,
    boot_time: Option<Timestamp>,
    node_name: &str,
    recorder: &EventRecorder,
    shutdown: &CancellationToken,
) {
    let file = match open_at_end(kmsg) {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(path = %kmsg.display(), error = %e, "the kernel log cannot be read: system OOMs are not reported");
            return;
        }
    };
    let mut parser = OomParser::default();
    let mut buf = vec![0u8; 8192];
    loop {
        // Each read returns one record; drain what is there, then look again a moment later
        // (a non-blocking read per second: OOM events need no faster reaction).
        loop {
            match nix::unistd::read(&file, &mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let text = String::from_utf8_lossy(&buf[..n]);
                    let Some(record) = parse_kmsg(&text) else {
                        tracing::debug!(record = %text.trim_end(), "unexpected kernel log record");
                        continue;
                    };
                    let micros = i64::try_from(record.micros).unwrap_or(i64::MAX);
                    let time = boot_time
                        .and_then(|b| b.checked_add(SignedDuration::from_micros(micros)).ok());
                    if let Some(oom) = parser.feed(record.message, time) {
                        report(&oom, node_name, recorder);
                    }
                }
                Err(nix::errno::Errno::EAGAIN) => break,
                // Records were overwritten before they were read: go on with the next.
                Err(nix::errno::Errno::EPIPE | nix::errno::Errno::EINTR) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "reading the kernel log failed: system OOMs are no longer reported");
                    return;
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(KMSG_POLL) => {}
        }
    }
}

/// How often the kernel log is read.
pub const KMSG_POLL: std::time::Duration = std::time::Duration::from_secs(1);

fn report(oom: &OomInstance, node_name: &str, recorder: &EventRecorder) {
    if oom.is_system() {
        tracing::warn!(pid = ?oom.pid, process = %oom.process_name, "system OOM");
        recorder.warning(
            InvolvedObject::node(node_name),
            SYSTEM_OOM_REASON,
            oom.message(),
        );
    } else {
        tracing::debug!(cgroup = %oom.victim_container, pid = ?oom.pid, process = %oom.process_name, "cgroup OOM kill");
    }
}

fn open_at_end(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(path)?;
    // Only what is logged from now on (the kubelet without a checkpoint does the same).
    nix::unistd::lseek(&file, 0, nix::unistd::Whence::SeekEnd).map_err(std::io::Error::from)?;
    Ok(file)
}

/// Where the kernel log is read, by default.
pub fn default_kmsg() -> PathBuf {
    PathBuf::from(KMSG)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn records_parse_and_continuations_do_not() {
        let r =
            parse_kmsg("6,1870,13914613785,-;perl invoked oom-killer: gfp_mask=0xcc0\n").unwrap();
        assert_eq!((r.sequence, r.micros), (1870, 13_914_613_785));
        assert_eq!(r.message, "perl invoked oom-killer: gfp_mask=0xcc0");
        assert_eq!(parse_kmsg(" SUBSYSTEM=pci"), None);
        assert_eq!(parse_kmsg("x,y,z,-;m"), None);
    }

    #[test]
    fn a_modern_system_oom_is_one_instance_with_the_victim() {
        let mut p = OomParser::default();
        let t = Some(Timestamp::UNIX_EPOCH);
        assert_eq!(p.feed("stress invoked oom-killer: gfp_mask=0x100cca(GFP_HIGHUSER_MOVABLE), order=0, oom_score_adj=0", t), None);
        assert_eq!(p.feed("Mem-Info:", t), None);
        let oom = p
            .feed("oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/user.slice,task=stress,pid=4242,uid=0", t)
            .unwrap();
        assert!(oom.is_system());
        assert_eq!(oom.pid, Some(4242));
        assert_eq!(oom.process_name, "stress");
        assert_eq!(oom.container, "/user.slice");
        assert_eq!(oom.constraint, "CONSTRAINT_NONE");
        assert_eq!(
            oom.message(),
            "System OOM encountered, victim process: stress, pid: 4242"
        );
        // The following "Out of memory: Killed process" line opens nothing.
        assert_eq!(
            p.feed(
                "Out of memory: Killed process 4242 (stress) total-vm:1kB",
                t
            ),
            None
        );
    }

    #[test]
    fn a_cgroup_oom_names_its_cgroup_and_legacy_kernels_are_understood() {
        let mut p = OomParser::default();
        p.feed(
            "perl invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0",
            None,
        );
        let oom = p
            .feed("oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/kubelet-sdk/s1/c1,task_memcg=/kubelet-sdk/s1/c1,task=perl,pid=77,uid=0", None)
            .unwrap();
        assert!(!oom.is_system());
        assert_eq!(oom.victim_container, "/kubelet-sdk/s1/c1");

        p.feed("java invoked oom-killer: gfp_mask=0x24000c0, order=0", None);
        assert_eq!(
            p.feed(
                "Task in /docker/abc killed as a result of limit of /docker/abc",
                None
            ),
            None
        );
        let oom = p
            .feed(
                "Memory cgroup out of memory: Killed process 9 (java) total-vm:1kB",
                None,
            )
            .unwrap();
        assert_eq!((oom.pid, oom.process_name.as_str()), (Some(9), "java"));
        assert_eq!(oom.victim_container, "/docker/abc");

        // A legacy system OOM: no Task line, straight to the kill.
        p.feed("a invoked oom-killer: gfp_mask=0x0", None);
        let oom = p
            .feed("Out of memory: Killed process 5 (a) score 1", None)
            .unwrap();
        assert!(oom.is_system());
        // Lines outside an instance, and garbage, do nothing.
        assert_eq!(p.feed("Killed process 6 (b)", None), None);
        assert_eq!(p.feed("", None), None);
    }
}
