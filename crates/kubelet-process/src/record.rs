//! On-disk records: what a restarted agent needs to find sandboxes and containers again.
//!
//! Layout under the root directory:
//! - `sandboxes/<id>/sandbox.json` ([`SandboxRecord`]), `sandboxes/<id>/work/` (default working
//!   directory of the pod's containers);
//! - `containers/<id>/config.json` ([`ContainerRecord`], written at create, read by the shim),
//!   `started.json` ([`StartedRecord`], written by the shim once the process runs),
//!   `exit.json` ([`ExitRecord`], written by the shim when the process exits), `shim.log`.
//!
//! Every file is written to a temporary name and renamed, so readers never see half a record.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use jiff::Timestamp;
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
}

/// Resources as applied (mirror of `LinuxResources`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct ResourcesRecord {
    pub(crate) cpu_period: i64,
    pub(crate) cpu_quota: i64,
    pub(crate) cpu_shares: i64,
    pub(crate) memory_limit_in_bytes: i64,
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
    pub(crate) termination_message_path: Option<PathBuf>,
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

/// Write `value` as JSON to `path` atomically (temporary file + rename).
pub(crate) fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), ProcessError> {
    let bytes = serde_json::to_vec_pretty(value).map_err(|source| ProcessError::StateParse {
        path: path.to_path_buf(),
        source,
    })?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp.{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, bytes).map_err(|source| ProcessError::State {
        op: "writing",
        path: tmp.clone(),
        source,
    })?;
    std::fs::rename(&tmp, path).map_err(|source| ProcessError::State {
        op: "renaming into",
        path: path.to_path_buf(),
        source,
    })
}

/// Read JSON from `path`; `Ok(None)` when the file does not exist.
pub(crate) fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, ProcessError> {
    let bytes = match std::fs::read(path) {
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
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
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
