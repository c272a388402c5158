//! Fuzz manifest decoding, static pod defaulting and validation through every source's entry
//! point. Run: `cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run decode_manifest`. The seeds in
//! `corpus/decode_manifest` also run, with fixed mutations, in `cargo test -p kubelet-podconfig
//! --test no_panic`.
#![no_main]

use std::path::Path;

use kubelet_podconfig::manifest::ManifestOrigin;
use kubelet_podconfig::validation::{ValidationOptions, validate_pod};
use kubelet_podconfig::{decode_pod, load_pods};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let options = ValidationOptions::static_pod();
    let file = Path::new("/etc/kubernetes/manifests/fuzz.yaml");
    let _ = load_pods(ManifestOrigin::File(file), data, "node-1", &options);
    let _ = load_pods(ManifestOrigin::Url("http://h/p"), data, "node-1", &options);
    let _ = load_pods(ManifestOrigin::Push("default/x"), data, "node-1", &options);
    if let Ok(pod) = decode_pod(file, data) {
        let _ = validate_pod(&pod);
    }
});
