//! Links the agent with packed relative relocations (`DT_RELR`, the linker's
//! `-z pack-relative-relocs`) when the target's C library loads them (glibc 2.36 and later):
//! the table of relative relocations of a position-independent binary shrinks from 24 bytes per
//! pointer to a few bits, which takes about 600 KB off the release binary and the relocation
//! work off its start. Elsewhere (cross builds, musl, an older glibc) the binary is linked as
//! before. `MINIMAL_KUBELET_NO_RELR=1` turns it off.

use std::env;
use std::process::Command;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=MINIMAL_KUBELET_NO_RELR");
    println!("cargo::rerun-if-env-changed=CC");
    let (Ok(target), Ok(host)) = (env::var("TARGET"), env::var("HOST")) else {
        return;
    };
    if target != host
        || !target.ends_with("-linux-gnu")
        || env::var_os("MINIMAL_KUBELET_NO_RELR").is_some()
    {
        return;
    }
    if libc_loads_relr() {
        println!("cargo::rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}

/// Whether the C library the linker would use defines `GLIBC_ABI_DT_RELR`, the symbol version a
/// `DT_RELR` binary requires of it (so the dynamic loader refuses such a binary on a C library
/// without the support, rather than misloading it).
fn libc_loads_relr() -> bool {
    let cc = env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let Ok(out) = Command::new(cc).arg("-print-file-name=libc.so.6").output() else {
        return false;
    };
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || !path.starts_with('/') {
        return false;
    }
    std::fs::read(&path).is_ok_and(|bytes| {
        bytes
            .windows(b"GLIBC_ABI_DT_RELR".len())
            .any(|w| w == b"GLIBC_ABI_DT_RELR")
    })
}
