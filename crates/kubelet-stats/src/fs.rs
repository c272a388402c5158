//! Filesystem figures: `statvfs` of a filesystem and the usage of a directory tree.

use std::path::Path;

/// Size and free space of the filesystem holding a path (`statvfs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FsCapacity {
    /// Size, bytes.
    pub capacity: u64,
    /// Free for unprivileged users, bytes.
    pub available: u64,
    /// Used, bytes (size minus free, root's reserve included).
    pub used: u64,
    /// Inodes of the filesystem (0 when it has no fixed count).
    pub inodes: u64,
    /// Free inodes.
    pub inodes_free: u64,
    /// True on tmpfs (memory-backed).
    pub tmpfs: bool,
}

/// `statvfs` of the filesystem holding `path`; `None` when it cannot be read.
#[allow(clippy::useless_conversion)] // fsblkcnt_t and friends are not u64 on every target
pub fn capacity(path: &Path) -> Option<FsCapacity> {
    let st = nix::sys::statvfs::statvfs(path).ok()?;
    let frsize = u64::from(st.fragment_size());
    let tmpfs = nix::sys::statfs::statfs(path)
        .map(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
        .unwrap_or(false);
    Some(FsCapacity {
        capacity: u64::from(st.blocks()).saturating_mul(frsize),
        available: u64::from(st.blocks_available()).saturating_mul(frsize),
        used: u64::from(st.blocks())
            .saturating_sub(u64::from(st.blocks_free()))
            .saturating_mul(frsize),
        inodes: u64::from(st.files()),
        inodes_free: u64::from(st.files_free()),
        tmpfs,
    })
}

/// Bytes (allocated blocks) and inodes used under `dir`, not following symlinks and not
/// crossing into other filesystems (`du -x`); `None` when `dir` does not exist. Entries that
/// vanish during the walk are skipped.
pub fn disk_usage(dir: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let root = std::fs::symlink_metadata(dir).ok()?;
    let dev = root.dev();
    let mut bytes = 0u64;
    let mut inodes = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(md) = std::fs::symlink_metadata(&d) else {
            continue;
        };
        if md.dev() != dev {
            continue;
        }
        bytes = bytes.saturating_add(md.blocks().saturating_mul(512));
        inodes += 1;
        if md.is_dir()
            && let Ok(rd) = std::fs::read_dir(&d)
        {
            stack.extend(rd.filter_map(|e| e.ok()).map(|e| e.path()));
        }
    }
    Some((bytes, inodes))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_is_measured_and_a_missing_one_is_none() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/b/f"), vec![1u8; 1 << 20]).unwrap();
        std::os::unix::fs::symlink("/", dir.path().join("a/root")).unwrap();
        let (bytes, inodes) = disk_usage(dir.path()).unwrap();
        assert!(bytes >= 1 << 20, "{bytes}");
        assert!(bytes < 2 << 20, "the symlink is not followed: {bytes}");
        assert_eq!(inodes, 5);
        assert_eq!(disk_usage(&dir.path().join("gone")), None);
        let c = capacity(dir.path()).unwrap();
        assert!(c.capacity > 0 && c.available <= c.capacity && c.used <= c.capacity);
        assert_eq!(capacity(&dir.path().join("gone")), None);
    }
}
