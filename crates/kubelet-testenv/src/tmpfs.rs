//! A small tmpfs for disk-full tests: mounted on a directory for the guard's lifetime, filled
//! to the last byte on demand.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs mounted on a directory; unmounted (and the directory removed) on drop.
#[derive(Debug)]
pub struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    /// Mount a tmpfs of `size` (`mount`'s syntax: `2m`, `512k`) on `dir`, creating it. Needs
    /// root; the error says what `mount` answered.
    pub fn mount(dir: &Path, size: &str) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| format!("running mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs on {}: {}",
                dir.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs {
            dir: dir.to_path_buf(),
        })
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Fill the filesystem to the last byte with one file; returns its path (remove it to give
    /// the space back). A second call tops the same file up, taking whatever was freed since.
    pub fn fill(&self) -> PathBuf {
        let path = self.dir.join(".filler");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path);
        if let Ok(mut f) = file {
            let chunk = vec![0x55u8; 64 * 1024];
            while f.write_all(&chunk).is_ok() {}
            while f.write(&[0u8]).is_ok_and(|n| n == 1) {}
        }
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        let _ = std::fs::remove_dir(&self.dir);
    }
}
