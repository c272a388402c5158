//! Manifest decoding and validation never panic, whatever the input: a seeded corpus run
//! (the `cargo fuzz` target's corpus under `fuzz/corpus/decode_manifest`, plus a fixed number of
//! deterministic mutations of each seed), property tests over arbitrary bytes and arbitrary JSON
//! trees, and the classic hostile inputs (deep nesting, alias bombs, huge numbers, invalid
//! UTF-8, 10 MiB files).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kubelet_podconfig::manifest::{self, ManifestOrigin};
use kubelet_podconfig::validation::{ValidationOptions, validate_pod};
use kubelet_podconfig::{MAX_MANIFEST_SIZE, PodConfigError, load_manifest, load_pods};
use proptest::prelude::*;

/// Everything a source does with bytes, through every entry point.
fn exercise(data: &[u8]) {
    let options = ValidationOptions::static_pod();
    let file = Path::new("/etc/kubernetes/manifests/fuzz.yaml");
    let _ = load_pods(ManifestOrigin::File(file), data, "node-1", &options);
    let _ = load_pods(ManifestOrigin::Url("http://h/p"), data, "node-1", &options);
    let _ = load_pods(ManifestOrigin::Push("default/x"), data, "node-1", &options);
    if let Ok(pod) = manifest::decode_pod(file, data) {
        let _ = validate_pod(&pod);
    }
}

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/decode_manifest")
}

/// xorshift64*: a fixed, seeded mutation sequence (the same in every run).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

const INTERESTING: [&[u8]; 12] = [
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b":",
    b"\n  ",
    b"- ",
    b"&a ",
    b"*a",
    b"99999999999999999999999",
    b"\xff",
];

fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut data = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(data.len() + 1);
        match rng.below(5) {
            0 if !data.is_empty() => {
                let i = at.min(data.len() - 1);
                data[i] ^= 1 << rng.below(8);
            }
            1 => {
                let ins = INTERESTING[rng.below(INTERESTING.len())];
                data.splice(at..at, ins.iter().copied());
            }
            2 if !data.is_empty() => {
                let end = (at + rng.below(16)).min(data.len());
                data.drain(at.min(end)..end);
            }
            3 if !data.is_empty() => {
                // Duplicate a chunk (repeats keys, list items, nesting).
                let end = (at + rng.below(64)).min(data.len());
                let chunk = data[at.min(end)..end].to_vec();
                data.splice(end..end, chunk);
            }
            _ => data.truncate(at),
        }
    }
    data
}

#[test]
fn the_seeded_fuzz_corpus_and_its_mutations_never_panic() {
    let dir = corpus_dir();
    let mut seeds: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("fuzz corpus {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    seeds.sort();
    assert!(seeds.len() >= 5, "the corpus has its seeds");
    let mut rng = Rng(0x5eed_cafe_f00d_d00d);
    let mut ran = 0;
    for seed in &seeds {
        let data = std::fs::read(seed).expect("read seed");
        exercise(&data);
        for _ in 0..300 {
            exercise(&mutate(&mut rng, &data));
            ran += 1;
        }
    }
    assert_eq!(ran, seeds.len() * 300);
}

#[test]
fn the_valid_seeds_are_accepted_and_the_invalid_one_lists_every_problem() {
    let options = ValidationOptions::static_pod();
    let read = |n: &str| std::fs::read(corpus_dir().join(n)).expect("seed");
    let url = ManifestOrigin::Url("http://h/p");
    let file = ManifestOrigin::File(Path::new("/m/pod.yaml"));
    assert_eq!(
        load_pods(file, &read("pod.yaml"), "n", &options)
            .map(|p| p.len())
            .ok(),
        Some(1)
    );
    // successThreshold 2 is fine on a readiness probe.
    assert_eq!(
        load_pods(url, &read("pod.json"), "n", &options)
            .map(|p| p.len())
            .ok(),
        Some(1)
    );
    assert_eq!(
        load_pods(url, &read("podlist.json"), "n", &options)
            .map(|p| p.len())
            .ok(),
        Some(2)
    );
    match load_pods(file, &read("invalid.yaml"), "n", &options) {
        Err(PodConfigError::InvalidPod { reasons, .. }) => {
            assert!(reasons.len() >= 15, "{reasons:#?}");
            assert_eq!(
                reasons.last().map(String::as_str),
                Some("static pods may not reference serviceaccounts")
            );
        }
        other => panic!("expected InvalidPod, got {other:?}"),
    }
}

#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    for depth in [1_000, 100_000] {
        let json = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        exercise(json.as_bytes());
        let obj = format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth));
        exercise(obj.as_bytes());
        let yaml_flow = format!("a: {}{}", "[".repeat(depth), "]".repeat(depth));
        exercise(yaml_flow.as_bytes());
        let mut yaml_block = String::new();
        for i in 0..depth.min(5_000) {
            yaml_block.push_str(&" ".repeat(i));
            yaml_block.push_str("a:\n");
        }
        exercise(yaml_block.as_bytes());
        let in_pod = format!(
            "{{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{{\"name\":\"n\",\"annotations\":{}1{}}}}}",
            "{\"a\":".repeat(depth),
            "}".repeat(depth)
        );
        assert!(matches!(
            load_pods(
                ManifestOrigin::Url("u"),
                in_pod.as_bytes(),
                "n",
                &ValidationOptions::static_pod()
            ),
            Err(PodConfigError::DecodeManifest { .. })
        ));
    }
}

#[test]
fn yaml_alias_bombs_are_rejected_quickly() {
    let mut bomb = String::from(
        "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
    );
    let names = ["b", "c", "d", "e", "f", "g", "h", "i"];
    let mut prev = "a";
    for n in names {
        bomb.push_str(&format!(
            "{n}: &{n} [{}]\n",
            vec![format!("*{prev}"); 9].join(",")
        ));
        prev = n;
    }
    let start = Instant::now();
    exercise(bomb.as_bytes());
    // Generous: expansion would take minutes and gigabytes.
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn huge_and_odd_numbers_are_decode_errors_or_validation_errors() {
    let options = ValidationOptions::static_pod();
    for value in [
        "1e400",
        "-1e400",
        "99999999999999999999999",
        "-99999999999999999999999",
        "2147483648",
        "-2147483649",
        "1.5",
        "NaN",
        "0x10",
        "\"80\"",
        "null",
        "[]",
        "{}",
    ] {
        let text = format!(
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"n"}},"spec":{{"containers":[{{"name":"c","image":"i","ports":[{{"containerPort":{value}}}]}}],"terminationGracePeriodSeconds":{value}}}}}"#
        );
        let _ = load_pods(ManifestOrigin::Url("u"), text.as_bytes(), "n", &options);
        let yaml = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: n}}\nspec:\n  activeDeadlineSeconds: {value}\n  containers: [{{name: c, image: i, ports: [{{containerPort: {value}}}]}}]\n"
        );
        let _ = load_pods(ManifestOrigin::Url("u"), yaml.as_bytes(), "n", &options);
    }
    // In range for the type but out of range for the API: a validation error.
    let text = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"n"},"spec":{"containers":[{"name":"c","image":"i","ports":[{"containerPort":2147483647}]}],"terminationGracePeriodSeconds":-9223372036854775808}}"#;
    match load_pods(ManifestOrigin::Url("u"), text.as_bytes(), "n", &options) {
        Err(PodConfigError::InvalidPod { reasons, .. }) => {
            assert_eq!(reasons.len(), 2, "{reasons:#?}")
        }
        other => panic!("expected InvalidPod, got {other:?}"),
    }
}

#[test]
fn invalid_utf8_is_a_decode_error() {
    for data in [
        &b"\xff\xfe"[..],
        b"apiVersion: v1\nkind: Pod\n\xc3\x28",
        b"{\"a\":\"\xed\xa0\x80\"}",
        b"\x00\x00\x00",
    ] {
        exercise(data);
        assert!(matches!(
            manifest::decode_pod(Path::new("x"), data),
            Err(PodConfigError::DecodeManifest { .. })
                | Err(PodConfigError::UnsupportedKind { .. })
        ));
    }
}

#[test]
fn ten_mib_files_are_read_and_anything_larger_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("big.json");
    let head =
        r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"big","annotations":{"blob":""#;
    let tail = r#""}},"spec":{"containers":[{"name":"c","image":"i"}]}}"#;
    let fill = MAX_MANIFEST_SIZE as usize - head.len() - tail.len();
    let text = format!("{head}{}{tail}", "x".repeat(fill));
    assert_eq!(text.len() as u64, MAX_MANIFEST_SIZE);
    std::fs::write(&path, &text).expect("write");
    let pod = load_manifest(&path, "n").expect("a 10 MiB manifest is within the limit");
    assert_eq!(pod.metadata.name.as_deref(), Some("big-n"));

    // One byte more: refused before decoding, from a file and from memory.
    std::fs::write(&path, format!("{text} ")).expect("write");
    assert!(matches!(
        load_manifest(&path, "n"),
        Err(PodConfigError::ManifestTooLarge { .. })
    ));
    let over = vec![b'x'; MAX_MANIFEST_SIZE as usize + 1];
    assert!(matches!(
        load_pods(
            ManifestOrigin::Url("u"),
            &over,
            "n",
            &ValidationOptions::static_pod()
        ),
        Err(PodConfigError::ManifestTooLarge { .. })
    ));

    // 10 MiB of garbage and of deep YAML nesting: errors, no panic.
    let garbage: Vec<u8> = (0..MAX_MANIFEST_SIZE)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) as u8)
        .collect();
    exercise(&garbage);
    let nested = "[".repeat(MAX_MANIFEST_SIZE as usize);
    exercise(nested.as_bytes());
}

fn json_tree() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f)
            .map_or(serde_json::Value::Null, serde_json::Value::Number)),
        "[a-zA-Z0-9_./ -]{0,12}".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(6, 64, 8, |inner| {
        let keys = prop_oneof![
            Just("name".to_string()),
            Just("image".to_string()),
            Just("containers".to_string()),
            Just("ports".to_string()),
            Just("containerPort".to_string()),
            Just("volumes".to_string()),
            Just("volumeMounts".to_string()),
            Just("livenessProbe".to_string()),
            Just("exec".to_string()),
            Just("httpGet".to_string()),
            Just("port".to_string()),
            Just("labels".to_string()),
            Just("initContainers".to_string()),
            Just("emptyDir".to_string()),
            Just("secret".to_string()),
            "[a-z]{1,8}",
        ];
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            prop::collection::btree_map(keys, inner, 0..5)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(data in prop::collection::vec(any::<u8>(), 0..512)) {
        exercise(&data);
    }

    #[test]
    fn arbitrary_pod_shaped_json_never_panics(metadata in json_tree(), spec in json_tree()) {
        let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec});
        let text = serde_json::to_vec(&pod).expect("serialize");
        exercise(&text);
        let with_name = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "n"}, "spec": spec});
        exercise(&serde_json::to_vec(&with_name).expect("serialize"));
    }
}
