//! The workspace's layering (docs/architecture.md, "Crates and their dependencies"), read from
//! `cargo metadata` and the sources:
//!
//! * the seam crate `kubelet-api` depends on no other crate of the workspace and, directly or
//!   not, on nothing that speaks a wire protocol (HTTP, TLS, gRPC, protobuf, the Kubernetes
//!   client, YAML);
//! * the engine `kubelet-core` depends on no subsystem crate (only the seams and the network
//!   crate), and not directly on a TLS library or an HTTP server;
//! * no crate but the facade `kubelet` re-exports another workspace crate's items: every item
//!   has one path.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// Packages the seam crate must not reach, by name prefix.
const WIRE_PROTOCOL_CRATES: &[&str] = &[
    "hyper",
    "h2",
    "http-body",
    "rustls",
    "tokio-rustls",
    "tonic",
    "prost",
    "kube",
    "serde-saphyr",
    "serde_yaml",
    "yaml-rust",
    "saphyr",
    "tungstenite",
    "tokio-tungstenite",
];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

fn metadata() -> Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked"])
        .current_dir(workspace_root())
        .output()
        .expect("running cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("cargo metadata JSON")
}

/// Package id → (name, normal dependencies' ids), from the resolved graph.
fn graph(meta: &Value) -> BTreeMap<String, (String, Vec<String>)> {
    let names: BTreeMap<String, String> = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| {
            (
                p["id"].as_str().expect("id").to_string(),
                p["name"].as_str().expect("name").to_string(),
            )
        })
        .collect();
    meta["resolve"]["nodes"]
        .as_array()
        .expect("resolve nodes")
        .iter()
        .map(|n| {
            let id = n["id"].as_str().expect("id").to_string();
            let deps = n["deps"]
                .as_array()
                .expect("deps")
                .iter()
                .filter(|d| {
                    d["dep_kinds"]
                        .as_array()
                        .is_some_and(|k| k.iter().any(|k| k["kind"].is_null()))
                })
                .map(|d| d["pkg"].as_str().expect("pkg").to_string())
                .collect();
            (id.clone(), (names[&id].clone(), deps))
        })
        .collect()
}

fn id_of(graph: &BTreeMap<String, (String, Vec<String>)>, name: &str) -> String {
    graph
        .iter()
        .find(|(_, (n, _))| n == name)
        .map(|(id, _)| id.clone())
        .unwrap_or_else(|| panic!("package {name} not in the workspace"))
}

/// Names of every package `from` depends on at build time, directly or not.
fn closure(graph: &BTreeMap<String, (String, Vec<String>)>, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![id_of(graph, from)];
    while let Some(id) = todo.pop() {
        for d in &graph[&id].1 {
            if seen.insert(d.clone()) {
                todo.push(d.clone());
            }
        }
    }
    seen.into_iter().map(|id| graph[&id].0.clone()).collect()
}

fn members(meta: &Value) -> Vec<(String, PathBuf)> {
    let ids: BTreeSet<&str> = meta["workspace_members"]
        .as_array()
        .expect("members")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .filter(|p| ids.contains(p["id"].as_str().unwrap_or("")))
        .map(|p| {
            let manifest = PathBuf::from(p["manifest_path"].as_str().expect("manifest"));
            (
                p["name"].as_str().expect("name").to_string(),
                manifest.parent().expect("dir").to_path_buf(),
            )
        })
        .collect()
}

#[test]
fn the_seam_crate_speaks_no_wire_protocol_and_depends_on_no_workspace_crate() {
    let meta = metadata();
    let g = graph(&meta);
    let deps = closure(&g, "kubelet-api");
    let workspace: BTreeSet<String> = members(&meta).into_iter().map(|(n, _)| n).collect();
    let own: Vec<_> = deps.intersection(&workspace).collect();
    assert!(own.is_empty(), "kubelet-api depends on {own:?}");
    let wire: Vec<_> = deps
        .iter()
        .filter(|d| {
            WIRE_PROTOCOL_CRATES
                .iter()
                .any(|w| d == w || d.starts_with(&format!("{w}-")))
        })
        .collect();
    assert!(
        wire.is_empty(),
        "kubelet-api reaches wire-protocol crates: {wire:?}"
    );
    // The check sees the crate's real dependencies (not an empty graph).
    assert!(deps.contains("k8s-openapi") && deps.contains("async-trait"));
}

#[test]
fn the_engine_depends_on_no_subsystem_crate() {
    let meta = metadata();
    let g = graph(&meta);
    let deps = closure(&g, "kubelet-core");
    let workspace: BTreeSet<String> = members(&meta).into_iter().map(|(n, _)| n).collect();
    let own: Vec<_> = deps.intersection(&workspace).cloned().collect();
    assert_eq!(
        own,
        ["kubelet-api", "kubelet-net"],
        "kubelet-core's workspace dependencies"
    );
    // TLS and HTTP come from the network crate, not from the engine itself.
    let direct: Vec<&str> = g[&id_of(&g, "kubelet-core")]
        .1
        .iter()
        .map(|id| g[id].0.as_str())
        .collect();
    for forbidden in ["rustls", "tokio-rustls", "hyper", "httparse", "socket2"] {
        assert!(
            !direct.contains(&forbidden),
            "kubelet-core depends on {forbidden} directly: {direct:?}"
        );
    }
    assert!(direct.contains(&"kubelet-net"));
}

#[test]
fn the_stats_and_gc_crates_depend_on_the_seam_crate_alone() {
    let meta = metadata();
    let g = graph(&meta);
    let workspace: BTreeSet<String> = members(&meta).into_iter().map(|(n, _)| n).collect();
    for krate in ["kubelet-stats", "kubelet-gc"] {
        let deps = closure(&g, krate);
        let own: Vec<_> = deps.intersection(&workspace).cloned().collect();
        assert_eq!(own, ["kubelet-api"], "{krate}'s workspace dependencies");
    }
}

#[test]
fn the_container_manager_depends_on_the_seam_and_stats_crates_alone() {
    let meta = metadata();
    let g = graph(&meta);
    let workspace: BTreeSet<String> = members(&meta).into_iter().map(|(n, _)| n).collect();
    let deps = closure(&g, "kubelet-cm");
    let own: Vec<_> = deps.intersection(&workspace).cloned().collect();
    assert_eq!(
        own,
        ["kubelet-api", "kubelet-stats"],
        "kubelet-cm's workspace dependencies"
    );
}

#[test]
fn the_network_crate_depends_on_no_workspace_crate() {
    let meta = metadata();
    let g = graph(&meta);
    let deps = closure(&g, "kubelet-net");
    let workspace: BTreeSet<String> = members(&meta).into_iter().map(|(n, _)| n).collect();
    let own: Vec<_> = deps.intersection(&workspace).collect();
    assert!(own.is_empty(), "kubelet-net depends on {own:?}");
}

/// Modules a crate root declares (`mod kubelet;` in `kubelet-core` is not the facade).
fn local_modules(src: &Path) -> BTreeSet<String> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap_or_default();
    lib.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l.strip_prefix("pub ").unwrap_or(l);
            l.strip_prefix("mod ")?
                .strip_suffix(';')
                .map(|m| m.trim().to_string())
        })
        .collect()
}

/// `pub use` items of another workspace crate, per file of `dir` (recursively).
fn reexports(dir: &Path, crates: &BTreeSet<String>, out: &mut Vec<String>) {
    let local = local_modules(dir);
    let crates: BTreeSet<String> = crates.difference(&local).cloned().collect();
    reexports_in(dir, &crates, out);
}

fn reexports_in(dir: &Path, crates: &BTreeSet<String>, out: &mut Vec<String>) {
    for e in std::fs::read_dir(dir).expect("read dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            reexports_in(&p, crates, out);
            continue;
        }
        if p.extension().is_none_or(|x| x != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&p).expect("read source");
        for (n, line) in text.lines().enumerate() {
            let l = line.trim_start();
            let Some(rest) = l.strip_prefix("pub use ") else {
                continue;
            };
            let first = rest
                .trim_start_matches("::")
                .split([':', ' ', ';', '{'])
                .next()
                .unwrap_or("");
            if crates.contains(first) {
                out.push(format!("{}:{}: {}", p.display(), n + 1, l));
            }
        }
    }
}

#[test]
fn only_the_facade_re_exports_workspace_crates() {
    let meta = metadata();
    let all = members(&meta);
    let crates: BTreeSet<String> = all.iter().map(|(n, _)| n.replace('-', "_")).collect();
    let mut found = Vec::new();
    let mut scanned = 0;
    for (name, dir) in &all {
        if name == "kubelet" {
            continue;
        }
        let src = dir.join("src");
        if src.is_dir() {
            scanned += 1;
            reexports(&src, &crates, &mut found);
        }
    }
    assert!(scanned >= 10, "only {scanned} crates scanned");
    assert!(
        found.is_empty(),
        "re-exports of workspace crates outside the facade:\n{}",
        found.join("\n")
    );
    // The scan finds the facade's own re-exports, so it would find others'.
    let mut facade = Vec::new();
    let dir = all
        .iter()
        .find(|(n, _)| n == "kubelet")
        .map(|(_, d)| d.join("src"))
        .expect("facade");
    reexports(&dir, &crates, &mut facade);
    assert!(facade.iter().any(|l| l.contains("pub use kubelet_api")));
}
