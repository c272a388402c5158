//! The checked-in CRI bindings (`src/generated/runtime.v1.rs`) are what protox + tonic-prost-build
//! produce from the CRI v1 `api.proto`, and the containerd event bindings
//! (`src/generated/containerd.*.rs`) what they produce from the containerd protos kept in
//! `proto/containerd`.
//!
//! The proto is not kept in this repository. The test reads it from the `k8s-cri` crate in the
//! local cargo registry (`cargo info k8s-cri@0.11.0` downloads it), or from `KUBELET_CRI_PROTO`.
//! Regenerate with `KUBELET_CRI_REGENERATE=1 cargo test -p kubelet-cri --test bindings_current`.
//! The containerd protos are in this repository, so their test never skips.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

const K8S_CRI_CRATE: &str = "k8s-cri-0.11.0";

fn cargo_home() -> Option<PathBuf> {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
}

/// Finds the upstream proto: `KUBELET_CRI_PROTO`, an unpacked `k8s-cri` source, or its `.crate`
/// archive in the registry cache (unpacked into `scratch`).
fn find_proto(scratch: &Path) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KUBELET_CRI_PROTO") {
        return Some(PathBuf::from(p));
    }
    let registry = cargo_home()?.join("registry");
    for index in std::fs::read_dir(registry.join("src"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let p = index.path().join(K8S_CRI_CRATE).join("proto/v1.proto");
        if p.is_file() {
            return Some(p);
        }
    }
    for index in std::fs::read_dir(registry.join("cache"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let archive = index.path().join(format!("{K8S_CRI_CRATE}.crate"));
        if archive.is_file() {
            let status = std::process::Command::new("tar")
                .arg("xzf")
                .arg(&archive)
                .arg("-C")
                .arg(scratch)
                .arg(format!("{K8S_CRI_CRATE}/proto/v1.proto"))
                .status()
                .ok()?;
            let p = scratch.join(K8S_CRI_CRATE).join("proto/v1.proto");
            if status.success() && p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

#[test]
fn checked_in_bindings_match_the_cri_v1_proto() {
    let scratch = tempfile::tempdir().unwrap();
    let Some(proto) = find_proto(scratch.path()) else {
        eprintln!(
            "SKIP checked_in_bindings_match_the_cri_v1_proto: CRI v1 proto not found \
             (run `cargo info k8s-cri@0.11.0` once, or set KUBELET_CRI_PROTO)"
        );
        return;
    };
    let include = proto.parent().unwrap();
    let fds = protox::compile([&proto], [include]).expect("compile the CRI proto");
    let out = scratch.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    tonic_prost_build::configure()
        .build_server(false)
        .build_transport(false)
        .out_dir(&out)
        .compile_fds(fds)
        .expect("generate the CRI bindings");
    let fresh = std::fs::read_to_string(out.join("runtime.v1.rs")).unwrap();
    let checked_in_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/generated/runtime.v1.rs");
    if std::env::var_os("KUBELET_CRI_REGENERATE").is_some() {
        std::fs::write(&checked_in_path, &fresh).unwrap();
        eprintln!("wrote {}", checked_in_path.display());
        return;
    }
    let checked_in = std::fs::read_to_string(&checked_in_path).unwrap_or_default();
    assert!(
        checked_in == fresh,
        "{} is stale: regenerate with KUBELET_CRI_REGENERATE=1 cargo test -p kubelet-cri --test bindings_current",
        checked_in_path.display()
    );
}

#[test]
fn checked_in_containerd_event_bindings_match_the_protos() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let include = dir.join("proto");
    let protos = [
        include.join("containerd/events_service.proto"),
        include.join("containerd/events.proto"),
    ];
    let fds = protox::compile(&protos, [&include]).expect("compile the containerd protos");
    let scratch = tempfile::tempdir().unwrap();
    tonic_prost_build::configure()
        .build_server(false)
        .build_transport(false)
        .out_dir(scratch.path())
        .compile_fds(fds)
        .expect("generate the containerd bindings");
    let mut stale = Vec::new();
    for file in ["containerd.services.events.v1.rs", "containerd.events.rs"] {
        let fresh = std::fs::read_to_string(scratch.path().join(file)).unwrap();
        let checked_in_path = dir.join("src/generated").join(file);
        if std::env::var_os("KUBELET_CRI_REGENERATE").is_some() {
            std::fs::write(&checked_in_path, &fresh).unwrap();
            eprintln!("wrote {}", checked_in_path.display());
            continue;
        }
        if std::fs::read_to_string(&checked_in_path).unwrap_or_default() != fresh {
            stale.push(checked_in_path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "{stale:?} stale: regenerate with KUBELET_CRI_REGENERATE=1 cargo test -p kubelet-cri --test bindings_current"
    );
}
