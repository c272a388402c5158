//! On-disk records: what a restarted agent needs to find sandboxes and containers again.
//!
//! Layout under the root directory:
//! - `sandboxes/<id>/sandbox.json` ([`SandboxRecord`]), `sandboxes/<id>/work/` (default working
//!   directory of the pod's containers);
//! - `containers/<id>/config.json` ([`ContainerRecord`], written at create, read by the shim),
//!   `started.json` ([`StartedRecord`], written by the shim once the process runs),
//!   `exit.json` ([`ExitRecord`], written by the shim when the process exits), `exit.slot`,
//!   `shim.log`.
//!
//! Every file is written to a temporary name and renamed, so readers never see half a record.
//! The one exception is `exit.slot`: 4 KiB of zeros written when the container is created, so
//! that a shim whose `exit.json` cannot be written (the disk is full) can still record the exit
//! in place, in blocks that are already allocated.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use jiff::Timestamp;
use kubelet_stats::procfs::{read_small, read_small_bytes};
use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::cgroup::CgroupPaths;
use crate::error::ProcessError;

/// A sandbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SandboxRecord {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) namespace: String,
    pub(crate) uid: String,
    pub(crate) attempt: u32,
    pub(crate) ready: bool,
    pub(crate) created_at: Timestamp,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) annotations: BTreeMap<String, String>,
    pub(crate) log_directory: PathBuf,
    pub(crate) ip: String,
    /// The pod cgroup the agent made (`PodSandboxConfig::cgroup_parent`); empty: the
    /// runtime's own `<cgroup_parent>/<sandbox id>`.
    #[serde(default)]
    pub(crate) cgroup_parent: String,
}

/// Resources as applied (mirror of `LinuxResources`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct ResourcesRecord {
    pub(crate) cpu_period: i64,
    pub(crate) cpu_quota: i64,
    pub(crate) cpu_shares: i64,
    pub(crate) memory_limit_in_bytes: i64,
    #[serde(default)]
    pub(crate) cpuset_cpus: String,
    #[serde(default)]
    pub(crate) cpuset_mems: String,
    #[serde(default)]
    pub(crate) oom_score_adj: Option<i64>,
}

impl ResourcesRecord {
    /// What the engine asked for.
    pub(crate) fn from_api(r: &kubelet_api::runtime::LinuxResources) -> Self {
        Self {
            cpu_period: r.cpu_period,
            cpu_quota: r.cpu_quota,
            cpu_shares: r.cpu_shares,
            memory_limit_in_bytes: r.memory_limit_in_bytes,
            cpuset_cpus: r.cpuset_cpus.clone(),
            cpuset_mems: r.cpuset_mems.clone(),
            oom_score_adj: r.oom_score_adj,
        }
    }

    /// As the runtime reports it.
    pub(crate) fn to_api(&self) -> kubelet_api::runtime::LinuxResources {
        let mut v = kubelet_api::runtime::LinuxResources::default();
        v.cpu_period = self.cpu_period;
        v.cpu_quota = self.cpu_quota;
        v.cpu_shares = self.cpu_shares;
        v.memory_limit_in_bytes = self.memory_limit_in_bytes;
        v.cpuset_cpus = self.cpuset_cpus.clone();
        v.cpuset_mems = self.cpuset_mems.clone();
        v.oom_score_adj = self.oom_score_adj;
        v
    }
}

/// A mount as requested (mirror of `Mount`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct MountRecord {
    pub(crate) container_path: PathBuf,
    pub(crate) host_path: PathBuf,
    pub(crate) readonly: bool,
}

/// A container: everything the runtime reports and the shim needs to run it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ContainerRecord {
    pub(crate) id: String,
    pub(crate) sandbox_id: String,
    pub(crate) name: String,
    pub(crate) attempt: u32,
    pub(crate) image: String,
    pub(crate) argv: Vec<String>,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) working_dir: PathBuf,
    pub(crate) log_path: PathBuf,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) annotations: BTreeMap<String, String>,
    pub(crate) created_at: Timestamp,
    pub(crate) resources: Option<ResourcesRecord>,
    pub(crate) mounts: Vec<MountRecord>,
    pub(crate) cgroup: Option<CgroupPaths>,
    pub(crate) uid: Option<u32>,
    pub(crate) gid: Option<u32>,
    /// Supplemental groups (the pod's `fsGroup` and `supplementalGroups`).
    #[serde(default)]
    pub(crate) groups: Vec<u32>,
    /// `allowPrivilegeEscalation: false`: the process starts with `no_new_privs`.
    #[serde(default)]
    pub(crate) no_new_privs: bool,
    pub(crate) termination_message_path: Option<PathBuf>,
    /// `stdin: true`: the shim gives the process a FIFO as standard input, which attach
    /// writes to.
    #[serde(default)]
    pub(crate) stdin: bool,
}

/// Written by the shim once the container's process runs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct StartedRecord {
    pub(crate) pid: u32,
    /// `starttime` of the process from `/proc/<pid>/stat`, guards against PID reuse.
    pub(crate) pid_start_time: u64,
    pub(crate) shim_pid: u32,
    pub(crate) shim_start_time: u64,
    pub(crate) started_at: Timestamp,
}

/// Written by the shim (or by the runtime when the shim vanished) when the process exited.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct ExitRecord {
    pub(crate) exit_code: i32,
    pub(crate) signal: Option<i32>,
    pub(crate) finished_at: Timestamp,
    pub(crate) reason: String,
    pub(crate) message: String,
}

pub(crate) const SANDBOX_FILE: &str = "sandbox.json";
pub(crate) const CONFIG_FILE: &str = "config.json";
pub(crate) const STARTED_FILE: &str = "started.json";
pub(crate) const EXIT_FILE: &str = "exit.json";
pub(crate) const SHIM_LOG_FILE: &str = "shim.log";
pub(crate) const EXIT_SLOT_FILE: &str = "exit.slot";
/// Size of `exit.slot`: one page or block.
const SLOT_SIZE: usize = 4096;

/// Whether an I/O error means the filesystem is full (`ENOSPC`, or `EDQUOT`: over quota).
pub(crate) fn is_no_space(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

/// The error for a failed state operation: [`ProcessError::NoSpace`] when the disk is full.
pub(crate) fn state_error(op: &'static str, path: &Path, source: std::io::Error) -> ProcessError {
    if is_no_space(&source) {
        ProcessError::NoSpace {
            op,
            path: path.to_path_buf(),
            source,
        }
    } else {
        ProcessError::State {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Write `value` as JSON to `path` atomically (temporary file + rename).
pub(crate) fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), ProcessError> {
    let bytes = serde_json::to_vec_pretty(value).map_err(|source| ProcessError::StateParse {
        path: path.to_path_buf(),
        source,
    })?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp.{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    if let Err(source) = std::fs::write(&tmp, bytes) {
        // A partly written temporary file holds blocks a full disk needs back.
        let _ = std::fs::remove_file(&tmp);
        return Err(state_error("writing", &tmp, source));
    }
    std::fs::rename(&tmp, path).map_err(|source| {
        let _ = std::fs::remove_file(&tmp);
        state_error("renaming into", path, source)
    })
}

/// Create `dir/exit.slot`: [`SLOT_SIZE`] zero bytes, flushed to disk.
pub(crate) fn create_exit_slot(dir: &Path) -> Result<(), ProcessError> {
    use std::io::Write;
    let path = dir.join(EXIT_SLOT_FILE);
    let mut f = std::fs::File::create(&path).map_err(|e| state_error("creating", &path, e))?;
    f.write_all(&[0u8; SLOT_SIZE])
        .and_then(|()| f.sync_all())
        .map_err(|e| state_error("writing", &path, e))
}

/// Record `rec` in `dir/exit.slot`, in place (no new blocks are needed). A message that does
/// not fit is cut.
pub(crate) fn write_exit_slot(dir: &Path, rec: &ExitRecord) -> Result<(), ProcessError> {
    use std::os::unix::fs::FileExt;
    let path = dir.join(EXIT_SLOT_FILE);
    let parse_err = |source| ProcessError::StateParse {
        path: path.clone(),
        source,
    };
    let mut bytes = serde_json::to_vec(rec).map_err(parse_err)?;
    if bytes.len() > SLOT_SIZE {
        let mut short = rec.clone();
        let room = short
            .message
            .len()
            .saturating_sub(bytes.len() - SLOT_SIZE + 16);
        let mut cut = room;
        while !short.message.is_char_boundary(cut) {
            cut -= 1;
        }
        short.message.truncate(cut);
        bytes = serde_json::to_vec(&short).map_err(parse_err)?;
    }
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .map_err(|e| state_error("opening", &path, e))?;
    f.write_all_at(&bytes, 0)
        .and_then(|()| f.sync_data())
        .map_err(|e| state_error("writing", &path, e))
}

/// The exit recorded in `dir/exit.slot`, if any.
pub(crate) fn read_exit_slot(dir: &Path) -> Option<ExitRecord> {
    let bytes = read_small_bytes(&dir.join(EXIT_SLOT_FILE)).ok()?;
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    if end == 0 {
        return None;
    }
    serde_json::from_slice(&bytes[..end]).ok()
}

/// The container's exit: `exit.json`, else what `exit.slot` holds.
pub(crate) fn read_exit(dir: &Path) -> Result<Option<ExitRecord>, ProcessError> {
    match read_json::<ExitRecord>(&dir.join(EXIT_FILE))? {
        Some(e) => Ok(Some(e)),
        None => Ok(read_exit_slot(dir)),
    }
}

/// Record an exit: `exit.json`, or in place in `exit.slot` when the disk is full.
pub(crate) fn write_exit(dir: &Path, rec: &ExitRecord) -> Result<(), ProcessError> {
    match write_json(&dir.join(EXIT_FILE), rec) {
        Err(ProcessError::NoSpace { .. }) if dir.join(EXIT_SLOT_FILE).exists() => {
            write_exit_slot(dir, rec)
        }
        r => r,
    }
}

/// When the host booted (`btime` of `/proc/stat`).
pub(crate) fn boot_time() -> Option<Timestamp> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let secs = text
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse::<i64>()
        .ok()?;
    Timestamp::from_second(secs).ok()
}

/// Exit code and signal from a wait status (as `waitpid` reports it): `(code, None)` for a
/// normal exit, `(128 + n, Some(n))` for a death by signal `n`.
pub(crate) fn decode_wait_status(status: i32) -> (i32, Option<i32>) {
    let sig = status & 0x7f;
    if sig == 0 {
        ((status >> 8) & 0xff, None)
    } else {
        (128 + sig, Some(sig))
    }
}

/// Read JSON from `path`; `Ok(None)` when the file does not exist.
pub(crate) fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, ProcessError> {
    let bytes = match read_small_bytes(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(ProcessError::State {
                op: "reading",
                path: path.to_path_buf(),
                source,
            });
        }
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|source| ProcessError::StateParse {
            path: path.to_path_buf(),
            source,
        })
}

/// True when `id` is safe to use as a directory name.
pub(crate) fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A fresh random ID (32 hex digits).
pub(crate) fn new_id() -> String {
    let v: u128 = rand::random();
    format!("{v:032x}")
}

/// `starttime` (field 22) and state (field 3) of `/proc/<pid>/stat`, if the process exists.
pub(crate) fn proc_stat(pid: u32) -> Option<ProcStat> {
    let text = read_small(Path::new(&format!("/proc/{pid}/stat"))).ok()?;
    parse_proc_stat(&text)
}

/// Selected fields of `/proc/<pid>/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcStat {
    pub(crate) state: char,
    pub(crate) utime: u64,
    pub(crate) stime: u64,
    pub(crate) start_time: u64,
    pub(crate) rss_pages: u64,
    /// Field 52: a zombie's wait status, as `waitpid` would report it (Linux ≥ 3.5).
    pub(crate) exit_status: Option<i32>,
}

pub(crate) fn parse_proc_stat(text: &str) -> Option<ProcStat> {
    // The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state); field n is fields[n - 3].
    let get = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
    Some(ProcStat {
        state: fields.first()?.chars().next()?,
        utime: get(14)?,
        stime: get(15)?,
        start_time: get(22)?,
        rss_pages: get(24)?,
        exit_status: get(52).and_then(|v| i32::try_from(v).ok()),
    })
}

/// True when `pid` exists, is the process started at `start_time`, and is not a zombie.
pub(crate) fn process_alive(pid: u32, start_time: u64) -> bool {
    matches!(proc_stat(pid), Some(s) if s.start_time == start_time && s.state != 'Z')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_parses_names_with_spaces_and_parens() {
        let line = "1234 (my (odd) name) S 1 1234 1234 0 -1 4194304 100 0 0 0 7 3 0 0 20 0 1 0 \
                    98765 1000000 250 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0";
        let s = parse_proc_stat(line).expect("parses");
        assert_eq!(s.state, 'S');
        assert_eq!(s.utime, 7);
        assert_eq!(s.stime, 3);
        assert_eq!(s.start_time, 98765);
        assert_eq!(s.rss_pages, 250);
        assert_eq!(s.exit_status, None, "field 52 is absent from this line");
        let zombie = "99 (sh) Z 1 99 99 0 -1 4194316 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0 \
                      18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 \
                      1792";
        let z = parse_proc_stat(zombie).expect("parses");
        assert_eq!(z.state, 'Z');
        assert_eq!(z.exit_status, Some(1792));
        assert_eq!(decode_wait_status(1792), (7, None));
    }

    #[test]
    fn wait_statuses_decode_as_the_kubelet_reports_them() {
        assert_eq!(decode_wait_status(0), (0, None));
        assert_eq!(decode_wait_status(1 << 8), (1, None));
        assert_eq!(decode_wait_status(9), (137, Some(9)));
        assert_eq!(
            decode_wait_status(15 | 0x80),
            (143, Some(15)),
            "core dump bit ignored"
        );
    }

    #[test]
    fn an_exit_fits_in_its_slot_in_place_and_long_messages_are_cut() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(read_exit_slot(dir.path()).is_none(), "no slot yet");
        create_exit_slot(dir.path()).expect("slot");
        assert!(
            read_exit_slot(dir.path()).is_none(),
            "an empty slot is no exit"
        );
        let rec = ExitRecord {
            exit_code: 3,
            signal: None,
            finished_at: Timestamp::UNIX_EPOCH,
            reason: "Error".into(),
            message: "é".repeat(5000),
        };
        write_exit_slot(dir.path(), &rec).expect("write slot");
        let back = read_exit(dir.path()).expect("read").expect("an exit");
        assert_eq!(back.exit_code, 3);
        assert!(back.message.len() < 4096 && back.message.starts_with('é'));
        let meta = std::fs::metadata(dir.path().join(EXIT_SLOT_FILE)).expect("stat");
        assert_eq!(meta.len(), 4096, "written in place");
        // exit.json, when there is one, wins.
        let json = ExitRecord {
            exit_code: 0,
            reason: "Completed".into(),
            message: String::new(),
            ..rec
        };
        write_json(&dir.path().join(EXIT_FILE), &json).expect("json");
        assert_eq!(read_exit(dir.path()).expect("read"), Some(json));
    }

    #[test]
    fn ids_with_path_characters_are_rejected() {
        assert!(valid_id(&new_id()));
        assert!(!valid_id("../etc"));
        assert!(!valid_id("a/b"));
        assert!(!valid_id(""));
    }

    #[test]
    fn json_records_round_trip_atomically() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("exit.json");
        let rec = ExitRecord {
            exit_code: 137,
            signal: Some(9),
            finished_at: Timestamp::UNIX_EPOCH,
            reason: "Error".into(),
            message: String::new(),
        };
        write_json(&path, &rec).expect("write");
        let back: Option<ExitRecord> = read_json(&path).expect("read");
        assert_eq!(back, Some(rec));
        let missing: Option<ExitRecord> = read_json(&dir.path().join("nope")).expect("read");
        assert!(missing.is_none());
        assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 1);
    }
}
