//! [`AtomicWriter`]: the kubelet's atomic update of a volume directory from a payload
//! (`pkg/volume/util/atomic_writer.go`), shared by the `configMap` and `secret` volumes.
//!
//! Layout of a target directory after a write:
//!
//! ```text
//! <target>/..2026_11_22_10_15_00.123456789/   the payload, files with their modes
//! <target>/..data -> ..2026_11_22_10_15_00.123456789
//! <target>/<key>  -> ..data/<key>              one symlink per top-level payload path
//! ```
//!
//! A write first compares the payload with the current `..data`; when nothing changed it touches
//! nothing. Otherwise it writes a new timestamped directory, creates the missing user-visible
//! symlinks, swaps `..data` by renaming a temporary symlink over it (an atomic `rename(2)`),
//! removes user-visible entries that are no longer in the payload, and finally removes the old
//! timestamped directory. A reader that resolves `<key>` always sees one complete version.

use std::collections::{BTreeMap, BTreeSet};
use std::io::ErrorKind as IoKind;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use rand::Rng;

use crate::error::{Error, Result};

/// Name of the symlink to the current payload directory.
pub(crate) const DATA_DIR_NAME: &str = "..data";
/// Name of the temporary symlink renamed over [`DATA_DIR_NAME`].
const NEW_DATA_DIR_NAME: &str = "..data_tmp";
/// `maxPathLength` of the kubelet's writer.
const MAX_PATH_LENGTH: usize = 4096;
/// `maxFileNameLength` of the kubelet's writer.
const MAX_FILE_NAME_LENGTH: usize = 255;

/// One file of a payload: content and permission bits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileProjection {
    /// File content.
    pub(crate) data: Vec<u8>,
    /// Permission bits (for example `0o644`).
    pub(crate) mode: u32,
}

/// Relative path → file; paths may contain `/` for nested files.
pub(crate) type Payload = BTreeMap<String, FileProjection>;

/// Writes payloads into one target directory with the `..data` symlink layout.
#[derive(Debug, Clone)]
pub(crate) struct AtomicWriter {
    target_dir: PathBuf,
}

/// Check a payload path the way the kubelet's `validatePath` does.
pub(crate) fn validate_path(p: &str) -> Result<()> {
    let bad = |why: &str| Err(Error::invalid_argument(format!("invalid path: {why}: {p}")));
    if p.is_empty() {
        return bad("must not be empty");
    }
    if p.starts_with('/') {
        return bad("must be relative path");
    }
    if p.len() > MAX_PATH_LENGTH {
        return bad(&format!(
            "must be less than or equal to {MAX_PATH_LENGTH} characters"
        ));
    }
    let items: Vec<&str> = p.split('/').collect();
    for item in &items {
        if *item == ".." {
            return bad("must not contain '..'");
        }
        if item.len() > MAX_FILE_NAME_LENGTH {
            return bad(&format!(
                "filenames must be less than or equal to {MAX_FILE_NAME_LENGTH} characters"
            ));
        }
    }
    if items[0].starts_with("..") && items[0].len() > 2 {
        return bad("must not start with '..'");
    }
    if p.contains('\0') {
        return bad("must not contain NUL");
    }
    Ok(())
}

/// `path.Clean` for a relative payload path: drops empty and `.` components.
fn clean(p: &str) -> String {
    Path::new(p)
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("/")
}

fn io_err(op: &str, path: &Path, e: std::io::Error) -> Error {
    let kind = Error::from(std::io::Error::from(e.kind())).kind();
    Error::new(kind, format!("{op} {}: {e}", path.display())).with_source(e)
}

impl AtomicWriter {
    /// A writer for `target_dir` (created on the first write if missing).
    pub(crate) fn new(target_dir: impl Into<PathBuf>) -> Self {
        Self {
            target_dir: target_dir.into(),
        }
    }

    /// Make the target directory hold exactly `payload`. Returns `true` when something was
    /// written, `false` when the directory already matched. Blocking: call from a blocking task.
    pub(crate) fn write(&self, payload: &Payload) -> Result<bool> {
        let mut clean_payload = BTreeMap::new();
        for (p, f) in payload {
            validate_path(p)?;
            let c = clean(p);
            if c.is_empty() {
                return Err(Error::invalid_argument(format!(
                    "invalid path: must not be empty: {p}"
                )));
            }
            clean_payload.insert(c, f);
        }
        let target = &self.target_dir;
        std::fs::create_dir_all(target).map_err(|e| io_err("creating", target, e))?;

        let data_link = target.join(DATA_DIR_NAME);
        let old_ts = match std::fs::read_link(&data_link) {
            Ok(t) => Some(t),
            Err(e) if e.kind() == IoKind::NotFound => None,
            Err(e) => return Err(io_err("reading link", &data_link, e)),
        };
        let old_ts_path = old_ts.as_ref().map(|t| target.join(t));
        let old_files = match &old_ts_path {
            Some(dir) => list_files(dir)?,
            None => BTreeSet::new(),
        };
        let new_files: BTreeSet<String> = clean_payload.keys().cloned().collect();
        let visible_missing = new_files.iter().any(|p| {
            let first = p.split('/').next().unwrap_or(p);
            std::fs::symlink_metadata(target.join(first)).is_err()
        });
        let unchanged = old_ts_path.is_some()
            && old_files == new_files
            && !visible_missing
            && clean_payload.iter().all(|(p, f)| {
                old_ts_path
                    .as_ref()
                    .is_some_and(|dir| file_matches(&dir.join(p), f))
            });
        if unchanged {
            return Ok(false);
        }

        // A fresh timestamped directory for the new payload.
        let ts_name = format!(
            "..{}.{:09}",
            jiff::Timestamp::now().strftime("%Y_%m_%d_%H_%M_%S"),
            rand::rng().random_range(0..1_000_000_000u32)
        );
        let ts_path = target.join(&ts_name);
        std::fs::create_dir(&ts_path).map_err(|e| io_err("creating", &ts_path, e))?;
        set_mode(&ts_path, 0o755)?;
        if let Err(e) = write_payload(&ts_path, &clean_payload) {
            let _ = std::fs::remove_dir_all(&ts_path);
            return Err(e);
        }

        // User-visible symlinks for top-level entries.
        let mut top_level = BTreeSet::new();
        for p in &new_files {
            top_level.insert(p.split('/').next().unwrap_or(p).to_string());
        }
        for first in &top_level {
            let visible = target.join(first);
            if std::fs::symlink_metadata(&visible).is_err() {
                let dest = Path::new(DATA_DIR_NAME).join(first);
                std::os::unix::fs::symlink(&dest, &visible)
                    .map_err(|e| io_err("creating symlink", &visible, e))?;
            }
        }

        // Swap `..data` atomically.
        let tmp_link = target.join(NEW_DATA_DIR_NAME);
        match std::fs::remove_file(&tmp_link) {
            Ok(()) => {}
            Err(e) if e.kind() == IoKind::NotFound => {}
            Err(e) => return Err(io_err("removing", &tmp_link, e)),
        }
        std::os::unix::fs::symlink(&ts_name, &tmp_link)
            .map_err(|e| io_err("creating symlink", &tmp_link, e))?;
        std::fs::rename(&tmp_link, &data_link).map_err(|e| io_err("renaming", &tmp_link, e))?;

        // Remove user-visible entries the payload no longer has.
        let old_top: BTreeSet<String> = old_files
            .iter()
            .map(|p| p.split('/').next().unwrap_or(p).to_string())
            .collect();
        for gone in old_top.difference(&top_level) {
            let visible = target.join(gone);
            match std::fs::remove_file(&visible) {
                Ok(()) => {}
                Err(e) if e.kind() == IoKind::NotFound => {}
                Err(e) => return Err(io_err("removing", &visible, e)),
            }
        }
        // Remove the previous payload and any stale timestamped directories left by an
        // interrupted write.
        for entry in std::fs::read_dir(target).map_err(|e| io_err("reading", target, e))? {
            let entry = entry.map_err(|e| io_err("reading", target, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("..")
                && name != DATA_DIR_NAME
                && name != ts_name
                && entry.file_type().is_ok_and(|t| t.is_dir())
            {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        Ok(true)
    }
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| io_err("setting mode of", path, e))
}

fn file_matches(path: &Path, f: &FileProjection) -> bool {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return false;
    };
    if !meta.is_file() || meta.permissions().mode() & 0o7777 != f.mode & 0o7777 {
        return false;
    }
    std::fs::read(path).is_ok_and(|d| d == f.data)
}

fn write_payload(dir: &Path, payload: &BTreeMap<String, &FileProjection>) -> Result<()> {
    for (p, f) in payload {
        let full = dir.join(p);
        if let Some(parent) = full.parent()
            && parent != dir
        {
            std::fs::create_dir_all(parent).map_err(|e| io_err("creating", parent, e))?;
        }
        std::fs::write(&full, &f.data).map_err(|e| io_err("writing", &full, e))?;
        set_mode(&full, f.mode)?;
    }
    Ok(())
}

/// Relative paths of the regular files under `dir`.
fn list_files(dir: &Path) -> Result<BTreeSet<String>> {
    let mut out = BTreeSet::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let here = dir.join(&rel);
        let entries = match std::fs::read_dir(&here) {
            Ok(e) => e,
            Err(e) if e.kind() == IoKind::NotFound => continue,
            Err(e) => return Err(io_err("reading", &here, e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| io_err("reading", &here, e))?;
            let child = rel.join(entry.file_name());
            match entry.file_type() {
                Ok(t) if t.is_dir() => stack.push(child),
                Ok(_) => {
                    out.insert(child.to_string_lossy().into_owned());
                }
                Err(e) => return Err(io_err("reading", &entry.path(), e)),
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn tempdir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "atomic-writer-{}-{}",
            std::process::id(),
            rand::rng().random_range(0..u64::MAX)
        ));
        std::fs::create_dir_all(&d).expect("tempdir");
        d
    }

    fn file(data: &str, mode: u32) -> FileProjection {
        FileProjection {
            data: data.as_bytes().to_vec(),
            mode,
        }
    }

    fn payload(entries: &[(&str, &str, u32)]) -> Payload {
        entries
            .iter()
            .map(|(p, d, m)| (p.to_string(), file(d, *m)))
            .collect()
    }

    fn visible_entries(dir: &Path) -> BTreeSet<String> {
        std::fs::read_dir(dir)
            .expect("read")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with(".."))
            .collect()
    }

    #[test]
    fn writes_the_data_symlink_layout() {
        let dir = tempdir();
        let w = AtomicWriter::new(dir.join("vol"));
        let changed = w
            .write(&payload(&[("a", "1", 0o644), ("b", "2", 0o400)]))
            .expect("write");
        assert!(changed);
        let vol = dir.join("vol");
        let ts = std::fs::read_link(vol.join("..data")).expect("..data is a symlink");
        let ts = ts.to_string_lossy().into_owned();
        assert!(ts.starts_with("..") && ts.len() > 20, "{ts}");
        assert_eq!(
            std::fs::read_link(vol.join("a")).expect("a is a symlink"),
            Path::new("..data/a")
        );
        assert_eq!(std::fs::read_to_string(vol.join("a")).expect("a"), "1");
        assert_eq!(std::fs::read_to_string(vol.join("b")).expect("b"), "2");
        let mode = |p: &str| {
            std::fs::metadata(vol.join(p))
                .expect("meta")
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode("a"), 0o644);
        assert_eq!(mode("b"), 0o400);
        assert_eq!(
            visible_entries(&vol),
            BTreeSet::from(["a".into(), "b".into()])
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn unchanged_payload_is_not_rewritten() {
        let dir = tempdir();
        let w = AtomicWriter::new(&dir);
        let p = payload(&[("a", "1", 0o644)]);
        assert!(w.write(&p).expect("first"));
        let ts = std::fs::read_link(dir.join("..data")).expect("link");
        assert!(!w.write(&p).expect("second"));
        assert_eq!(std::fs::read_link(dir.join("..data")).expect("link"), ts);
        // A mode change alone is a change.
        assert!(w.write(&payload(&[("a", "1", 0o600)])).expect("third"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn update_swaps_data_and_removes_stale_keys_and_the_old_payload() {
        let dir = tempdir();
        let w = AtomicWriter::new(&dir);
        w.write(&payload(&[("a", "1", 0o644), ("gone", "x", 0o644)]))
            .expect("first");
        let old_ts = std::fs::read_link(dir.join("..data")).expect("link");
        w.write(&payload(&[("a", "2", 0o644), ("new", "y", 0o644)]))
            .expect("second");
        let new_ts = std::fs::read_link(dir.join("..data")).expect("link");
        assert_ne!(old_ts, new_ts);
        assert!(!dir.join(&old_ts).exists(), "old payload dir removed");
        assert!(!dir.join("..data_tmp").exists());
        assert_eq!(std::fs::read_to_string(dir.join("a")).expect("a"), "2");
        assert_eq!(std::fs::read_to_string(dir.join("new")).expect("new"), "y");
        assert_eq!(
            visible_entries(&dir),
            BTreeSet::from(["a".into(), "new".into()])
        );
        // Exactly one timestamped dir remains.
        let ts_dirs = std::fs::read_dir(&dir)
            .expect("read")
            .filter_map(|e| e.ok())
            .filter(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.starts_with("..") && n != "..data"
            })
            .count();
        assert_eq!(ts_dirs, 1);
        // An empty payload leaves no user-visible entries.
        w.write(&Payload::new()).expect("empty");
        assert!(visible_entries(&dir).is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn nested_item_paths_get_a_top_level_symlink() {
        let dir = tempdir();
        let w = AtomicWriter::new(&dir);
        w.write(&payload(&[
            ("conf/app/settings.ini", "x=1", 0o640),
            ("conf/other", "o", 0o644),
            ("./top", "t", 0o644),
        ]))
        .expect("write");
        assert_eq!(
            std::fs::read_link(dir.join("conf")).expect("conf is a symlink"),
            Path::new("..data/conf")
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("conf/app/settings.ini")).expect("nested"),
            "x=1"
        );
        assert_eq!(std::fs::read_to_string(dir.join("top")).expect("top"), "t");
        assert_eq!(
            std::fs::metadata(dir.join("conf/app/settings.ini"))
                .expect("meta")
                .permissions()
                .mode()
                & 0o777,
            0o640
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn path_traversal_and_reserved_names_are_rejected() {
        let dir = tempdir();
        let w = AtomicWriter::new(dir.join("vol"));
        for bad in [
            "../escape",
            "a/../../escape",
            "/etc/passwd",
            "..data",
            "..hidden/x",
            "",
        ] {
            let err = w
                .write(&payload(&[(bad, "x", 0o644)]))
                .expect_err("rejected");
            assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{bad}: {err}");
            assert!(err.message().starts_with("invalid path"), "{err}");
        }
        let long = "x".repeat(256);
        assert!(w.write(&payload(&[(long.as_str(), "x", 0o644)])).is_err());
        assert!(!dir.join("escape").exists());
        assert!(validate_path("a/..b/c").is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
