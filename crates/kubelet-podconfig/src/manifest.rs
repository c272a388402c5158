//! Static pod manifests: reading (with the 10 MiB cap), decoding (YAML or JSON, exactly one
//! `v1` `Pod`), the kubelet's `applyDefaults` (identity and defaults of a static pod) and
//! validation.

use std::io::Read;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Pod, PodStatus, Toleration};
use kubelet_api::annotations;

use crate::error::PodConfigError;
use crate::validation::{self, ValidationOptions};

/// The largest manifest the kubelet reads (`maxConfigLength`, 10 MiB).
pub const MAX_MANIFEST_SIZE: u64 = 10 * 1024 * 1024;

/// Where a static pod came from; it is part of the pod's UID hash.
#[derive(Debug, Clone, Copy)]
pub enum ManifestOrigin<'a> {
    /// A file (the UID hash covers `host:<node>` and `file:<path>`).
    File(&'a Path),
    /// A manifest URL (the UID hash covers `url:<url>`).
    Url(&'a str),
    /// The push endpoint, with the pod's `<namespace>/<name>` as submitted (the UID hash covers
    /// `host:<node>` and `push:<namespace>/<name>`).
    Push(&'a str),
}

/// A manifest that failed, with the pod if it got as far as decoding (so an event can name it).
#[derive(Debug)]
pub(crate) struct ManifestFailure {
    pub(crate) error: PodConfigError,
    pub(crate) pod: Option<Box<Pod>>,
}

impl From<PodConfigError> for ManifestFailure {
    fn from(error: PodConfigError) -> Self {
        Self { error, pod: None }
    }
}

/// Read a file of at most [`MAX_MANIFEST_SIZE`] bytes.
pub fn read_manifest_file(path: &Path) -> Result<Vec<u8>, PodConfigError> {
    let read_err = |source| PodConfigError::ReadManifest {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_err)?;
    let too_large = || PodConfigError::ManifestTooLarge {
        path: path.to_path_buf(),
        limit: MAX_MANIFEST_SIZE,
    };
    if file.metadata().map_err(read_err)?.len() > MAX_MANIFEST_SIZE {
        return Err(too_large());
    }
    let mut data = Vec::new();
    file.take(MAX_MANIFEST_SIZE + 1)
        .read_to_end(&mut data)
        .map_err(read_err)?;
    if data.len() as u64 > MAX_MANIFEST_SIZE {
        return Err(too_large());
    }
    Ok(data)
}

/// Decode one `v1` `Pod` from YAML or JSON. Anything else (a `PodList`, another kind, several
/// YAML documents) is rejected.
pub fn decode_pod(path: &Path, data: &[u8]) -> Result<Pod, PodConfigError> {
    let decode_err = |reason: String| PodConfigError::DecodeManifest {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::str::from_utf8(data).map_err(|e| decode_err(format!("not UTF-8: {e}")))?;
    if text.trim().is_empty() {
        return Err(PodConfigError::EmptyManifest {
            path: path.to_path_buf(),
        });
    }
    let value = parse_value(text).map_err(decode_err)?;
    let Some(obj) = value.as_object() else {
        return Err(decode_err(
            "the manifest is not an object (expected a v1 Pod)".to_string(),
        ));
    };
    let field = |k: &str| {
        obj.get(k)
            .and_then(serde_json::Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let (kind, api_version) = (field("kind"), field("apiVersion"));
    if kind != "Pod" || api_version != "v1" {
        return Err(PodConfigError::UnsupportedKind {
            path: path.to_path_buf(),
            kind,
            api_version,
        });
    }
    pod_from_value(&value).map_err(|e| decode_err(format!("not a valid Pod: {e}")))
}

/// The `Pod` in `value`, decoded from JSON text by [`kubelet_api::pod::from_json`] (one
/// deserializer of the whole `Pod` type in the binary, not a second one over `Value`). The
/// error names what is wrong without a position: a line and column of the re-encoded text
/// would not point into the manifest.
fn pod_from_value(value: &serde_json::Value) -> Result<Pod, String> {
    let text = serde_json::to_string(value).map_err(|e| e.to_string())?;
    kubelet_api::pod::from_json(&text).map_err(|e| {
        let mut message = e.to_string();
        if e.line() != 0
            && let Some(at) = message.rfind(" at line ")
        {
            message.truncate(at);
        }
        message
    })
}

/// Decode the body of a manifest URL (or of a push request): one `v1` `Pod`, or a `v1`
/// `PodList` whose items are pods. `origin` names the body in errors.
pub fn decode_pods(origin: &str, data: &[u8]) -> Result<Vec<Pod>, PodConfigError> {
    let path = Path::new(origin);
    match decode_pod(path, data) {
        Ok(pod) => Ok(vec![pod]),
        Err(PodConfigError::UnsupportedKind {
            kind, api_version, ..
        }) if kind == "PodList" && api_version == "v1" => {
            let text = std::str::from_utf8(data).map_err(|e| PodConfigError::DecodeManifest {
                path: path.to_path_buf(),
                reason: format!("not UTF-8: {e}"),
            })?;
            let decode_err = |reason: String| PodConfigError::DecodeManifest {
                path: path.to_path_buf(),
                reason,
            };
            let value = parse_value(text).map_err(decode_err)?;
            let items = match value.get("items") {
                None | Some(serde_json::Value::Null) => return Ok(Vec::new()),
                Some(serde_json::Value::Array(items)) => items.clone(),
                Some(_) => return Err(decode_err("PodList items is not a list".to_string())),
            };
            let mut pods = Vec::with_capacity(items.len());
            for (i, mut item) in items.into_iter().enumerate() {
                let Some(obj) = item.as_object_mut() else {
                    return Err(decode_err(format!("PodList item {i} is not an object")));
                };
                obj.entry("apiVersion").or_insert_with(|| "v1".into());
                obj.entry("kind").or_insert_with(|| "Pod".into());
                if obj.get("apiVersion").and_then(|v| v.as_str()) != Some("v1")
                    || obj.get("kind").and_then(|v| v.as_str()) != Some("Pod")
                {
                    return Err(decode_err(format!("PodList item {i} is not a v1 Pod")));
                }
                pods.push(pod_from_value(&item).map_err(|e| {
                    decode_err(format!("PodList item {i} is not a valid Pod: {e}"))
                })?);
            }
            Ok(pods)
        }
        Err(e) => Err(e),
    }
}

/// Deepest nesting a manifest may have (flow brackets, or block indentation columns for YAML).
/// Real pods stay far below; the YAML parser is slow (super-linear) on pathological nesting, so
/// such input is refused by a linear scan before parsing. JSON has its own limit (128 levels).
pub const MAX_NESTING: usize = 256;

fn parse_value(text: &str) -> Result<serde_json::Value, String> {
    if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| format!("invalid JSON: {e}"))
    } else {
        check_yaml_nesting(text)?;
        // Through `from_multiple`, as the configuration file and the kubeconfig are read: one
        // YAML-to-value decoder in the binary. A manifest holds one pod, so one document.
        let mut documents: Vec<serde_json::Value> =
            serde_saphyr::from_multiple::<serde_json::Value>(text)
                .map_err(|e| format!("invalid YAML: {e}"))?
                .into_iter()
                .filter(|d| !d.is_null())
                .collect();
        match documents.len() {
            0 => Ok(serde_json::Value::Null),
            1 => Ok(documents.remove(0)),
            n => Err(format!(
                "invalid YAML: {n} documents; a manifest holds one pod"
            )),
        }
    }
}

/// Refuse YAML whose flow nesting (`[`, `{` outside quotes) or block indentation exceeds
/// [`MAX_NESTING`] (indentation counted in columns, so the limit on levels is generous).
fn check_yaml_nesting(text: &str) -> Result<(), String> {
    let mut depth = 0usize;
    let mut quote: Option<char> = None;
    let mut at_line_start = true;
    let mut indent = 0usize;
    for c in text.chars() {
        if at_line_start {
            if c == ' ' {
                indent += 1;
                if indent > MAX_NESTING * 4 {
                    return Err(format!(
                        "invalid YAML: indentation deeper than {} columns",
                        MAX_NESTING * 4
                    ));
                }
                continue;
            }
            at_line_start = false;
        }
        match (quote, c) {
            (_, '\n') => {
                // Quotes rarely span lines in manifests; resetting keeps a stray apostrophe
                // (`# it's`) from hiding what follows.
                quote = None;
                at_line_start = true;
                indent = 0;
            }
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '[' | '{') => {
                depth += 1;
                if depth > MAX_NESTING {
                    return Err(format!(
                        "invalid YAML: nesting deeper than {MAX_NESTING} levels"
                    ));
                }
            }
            (None, ']' | '}') => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}

/// FNV-1a, 128 bits (Go's `hash/fnv.New128a`).
#[derive(Debug, Clone, Copy)]
pub struct Fnv128a(u128);

impl Fnv128a {
    const OFFSET_BASIS: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013B;

    /// A fresh hasher.
    pub fn new() -> Self {
        Self(Self::OFFSET_BASIS)
    }

    /// Feed bytes.
    pub fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u128::from(*b);
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
    }

    /// The hash.
    pub fn sum(&self) -> u128 {
        self.0
    }

    /// The hash, as lowercase hex of its 16 big-endian bytes (Go's `hex.EncodeToString(h.Sum(nil))`).
    pub fn hex(&self) -> String {
        format!("{:032x}", self.0)
    }
}

impl Default for Fnv128a {
    fn default() -> Self {
        Self::new()
    }
}

/// The kubelet's `applyDefaults` for a static pod, then validation.
///
/// Rejects a pod without `metadata.name`; sets the UID (if empty) to the FNV-1a 128 hash of the
/// pod as read (serialized as JSON) followed by the origin; renames it to
/// `<name>-<lowercase node>`; defaults the namespace to `default`; sets `spec.nodeName`, the
/// `kubernetes.io/config.hash` annotation (= UID), for files the toleration
/// `{operator: Exists, effect: NoExecute}`, and `status.phase = Pending`. Then validates it
/// (see [`validation::validate_pod`]).
pub fn apply_defaults(
    pod: &mut Pod,
    origin: ManifestOrigin<'_>,
    node_name: &str,
) -> Result<(), PodConfigError> {
    apply_defaults_with(pod, origin, node_name, &ValidationOptions::static_pod())
}

/// [`apply_defaults`] with explicit validation options (for example
/// [`ValidationOptions::allow_api_references`] when the agent also has an API source).
pub fn apply_defaults_with(
    pod: &mut Pod,
    origin: ManifestOrigin<'_>,
    node_name: &str,
    options: &ValidationOptions,
) -> Result<(), PodConfigError> {
    let path = match origin {
        ManifestOrigin::File(p) => p.to_path_buf(),
        ManifestOrigin::Url(u) => PathBuf::from(u),
        ManifestOrigin::Push(key) => PathBuf::from(format!("push:{key}")),
    };
    let name = match pod.metadata.name.as_deref() {
        Some(n) if !n.is_empty() => n.to_string(),
        _ => {
            return Err(PodConfigError::InvalidPod {
                path,
                reasons: vec!["invalid pod: name is needed for the pod".to_string()],
            });
        }
    };
    if pod.metadata.uid.as_deref().is_none_or(str::is_empty) {
        let mut h = Fnv128a::new();
        h.write(&kubelet_api::pod::to_json(pod));
        match origin {
            ManifestOrigin::File(p) => {
                h.write(format!("host:{node_name}").as_bytes());
                h.write(format!("file:{}", p.display()).as_bytes());
            }
            ManifestOrigin::Url(u) => h.write(format!("url:{u}").as_bytes()),
            ManifestOrigin::Push(key) => {
                h.write(format!("host:{node_name}").as_bytes());
                h.write(format!("push:{key}").as_bytes());
            }
        }
        pod.metadata.uid = Some(h.hex());
    }
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    pod.metadata.name = Some(format!("{name}-{}", node_name.to_lowercase()));
    if pod.metadata.namespace.as_deref().is_none_or(str::is_empty) {
        pod.metadata.namespace = Some("default".to_string());
    }
    pod.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(annotations::CONFIG_HASH.to_string(), uid);
    if let Some(spec) = pod.spec.as_mut() {
        spec.node_name = Some(node_name.to_string());
        if matches!(origin, ManifestOrigin::File(_)) {
            let toleration = Toleration {
                operator: Some("Exists".to_string()),
                effect: Some("NoExecute".to_string()),
                ..Default::default()
            };
            let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
            if !tolerations.contains(&toleration) {
                tolerations.push(toleration);
            }
        }
    }
    pod.status.get_or_insert_with(PodStatus::default).phase = Some("Pending".to_string());

    let reasons = validation::validate_pod_with(pod, options);
    if reasons.is_empty() {
        Ok(())
    } else {
        Err(PodConfigError::InvalidPod { path, reasons })
    }
}

/// Decode, default and validate a manifest body already in memory, as the sources do: for a
/// [`ManifestOrigin::File`] exactly one `Pod`, otherwise a `Pod` or a `PodList`. Bodies over
/// [`MAX_MANIFEST_SIZE`] are rejected before decoding. Never panics, whatever the bytes.
pub fn load_pods(
    origin: ManifestOrigin<'_>,
    data: &[u8],
    node_name: &str,
    options: &ValidationOptions,
) -> Result<Vec<Pod>, PodConfigError> {
    let name = match origin {
        ManifestOrigin::File(p) => p.display().to_string(),
        ManifestOrigin::Url(u) => u.to_string(),
        ManifestOrigin::Push(key) => format!("push:{key}"),
    };
    if data.len() as u64 > MAX_MANIFEST_SIZE {
        return Err(PodConfigError::ManifestTooLarge {
            path: PathBuf::from(name),
            limit: MAX_MANIFEST_SIZE,
        });
    }
    let mut pods = match origin {
        ManifestOrigin::File(p) => vec![decode_pod(p, data)?],
        _ => decode_pods(&name, data)?,
    };
    for pod in &mut pods {
        apply_defaults_with(pod, origin, node_name, options)?;
    }
    Ok(pods)
}

/// Read, decode, default and validate one manifest file: the pod the file source delivers.
pub fn load_manifest(path: &Path, node_name: &str) -> Result<Pod, PodConfigError> {
    load(path, node_name, &ValidationOptions::static_pod()).map_err(|f| f.error)
}

pub(crate) fn load(
    path: &Path,
    node_name: &str,
    options: &ValidationOptions,
) -> Result<Pod, ManifestFailure> {
    let data = read_manifest_file(path)?;
    load_data(path, &data, node_name, options)
}

/// [`load`] of the bytes `data` read from `path`.
pub(crate) fn load_data(
    path: &Path,
    data: &[u8],
    node_name: &str,
    options: &ValidationOptions,
) -> Result<Pod, ManifestFailure> {
    let mut pod = decode_pod(path, data)?;
    match apply_defaults_with(&mut pod, ManifestOrigin::File(path), node_name, options) {
        Ok(()) => Ok(pod),
        Err(error) => {
            let decoded = pod.metadata.name.is_some().then(|| Box::new(pod));
            Err(ManifestFailure {
                error,
                pod: decoded,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: app\n    image: busybox\n";

    #[test]
    fn fnv1a_128_matches_reference_vectors() {
        // Go: fnv.New128a() over "" and "a".
        assert_eq!(Fnv128a::new().hex(), "6c62272e07bb014262b821756295c58d");
        let mut h = Fnv128a::new();
        h.write(b"a");
        assert_eq!(h.hex(), "d228cb696f1a8caf78912b704e4a8964");
    }

    #[test]
    fn defaults_give_the_static_pod_its_identity() {
        let path = Path::new("/etc/kubernetes/manifests/web.yaml");
        let mut pod = decode_pod(path, POD.as_bytes()).expect("decodes");
        apply_defaults(&mut pod, ManifestOrigin::File(path), "Node-A").expect("valid");
        assert_eq!(pod.metadata.name.as_deref(), Some("web-node-a"));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("default"));
        let uid = pod.metadata.uid.clone().expect("uid");
        assert_eq!(uid.len(), 32);
        assert!(uid.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(
            pod.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(annotations::CONFIG_HASH)),
            Some(&uid)
        );
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.node_name.as_deref(), Some("Node-A"));
        assert_eq!(
            spec.tolerations.as_ref().map(|t| t.len()),
            Some(1),
            "one NoExecute toleration"
        );
        assert_eq!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Pending")
        );
    }

    #[test]
    fn uid_depends_on_content_node_and_path_but_is_stable() {
        let uid = |text: &str, node: &str, path: &str| {
            let path = Path::new(path);
            let mut pod = decode_pod(path, text.as_bytes()).expect("decodes");
            apply_defaults(&mut pod, ManifestOrigin::File(path), node).expect("valid");
            pod.metadata.uid.unwrap_or_default()
        };
        let base = uid(POD, "n1", "/m/web.yaml");
        assert_eq!(base, uid(POD, "n1", "/m/web.yaml"));
        assert_ne!(base, uid(POD, "n2", "/m/web.yaml"));
        assert_ne!(base, uid(POD, "n1", "/m/other.yaml"));
        assert_ne!(
            base,
            uid(&POD.replace("busybox", "nginx"), "n1", "/m/web.yaml")
        );
        let with_uid = POD.replace("  name: web\n", "  name: web\n  uid: fixed\n");
        assert_eq!(uid(&with_uid, "n1", "/m/web.yaml"), "fixed");
    }

    #[test]
    fn json_manifests_decode_like_yaml() {
        let json = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web"},"spec":{"containers":[{"name":"app","image":"busybox"}]}}"#;
        let a = decode_pod(Path::new("a"), json.as_bytes()).expect("json");
        let b = decode_pod(Path::new("a"), POD.as_bytes()).expect("yaml");
        assert_eq!(a, b);
    }

    #[test]
    fn a_pod_of_the_wrong_shape_is_named_without_a_position_of_the_reencoded_text() {
        let yaml = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers: 5\n";
        let decoded = decode_pod(Path::new("/m/web.yaml"), yaml.as_bytes());
        let Err(PodConfigError::DecodeManifest { reason, .. }) = &decoded else {
            panic!("{decoded:?}");
        };
        assert!(
            reason.starts_with("not a valid Pod: invalid type: integer `5`"),
            "{reason}"
        );
        assert!(!reason.contains(" at line "), "{reason}");
    }

    #[test]
    fn pod_lists_other_kinds_and_multiple_documents_are_rejected() {
        let list = "apiVersion: v1\nkind: PodList\nitems: []\n";
        let err = decode_pod(Path::new("/m/list.yaml"), list.as_bytes()).expect_err("rejected");
        assert!(
            matches!(err, PodConfigError::UnsupportedKind { ref kind, .. } if kind == "PodList")
        );
        assert!(err.to_string().contains("/m/list.yaml"), "{err}");
        let two = format!("{POD}---\n{POD}");
        assert!(matches!(
            decode_pod(Path::new("x"), two.as_bytes()),
            Err(PodConfigError::DecodeManifest { .. })
        ));
        assert!(matches!(
            decode_pod(Path::new("x"), b"   \n"),
            Err(PodConfigError::EmptyManifest { .. })
        ));
        assert!(matches!(
            decode_pod(Path::new("x"), b"key: [unclosed"),
            Err(PodConfigError::DecodeManifest { .. })
        ));
    }

    #[test]
    fn a_manifest_without_name_is_rejected_with_the_kubelet_message() {
        let text = POD.replace("  name: web\n", "  labels: {a: b}\n");
        let mut pod = decode_pod(Path::new("x"), text.as_bytes()).expect("decodes");
        let err = apply_defaults(&mut pod, ManifestOrigin::File(Path::new("/m/x")), "n")
            .expect_err("rejected");
        assert!(
            err.to_string()
                .contains("invalid pod: name is needed for the pod"),
            "{err}"
        );
    }

    #[test]
    fn oversized_files_are_rejected_before_decoding() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("big.yaml");
        std::fs::write(&path, vec![b'#'; (MAX_MANIFEST_SIZE + 1) as usize]).expect("write");
        let err = read_manifest_file(&path).expect_err("too large");
        assert!(
            err.to_string()
                .ends_with("exceeds the maximum size of 10485760 bytes"),
            "{err}"
        );
        std::fs::write(&path, vec![b'#'; MAX_MANIFEST_SIZE as usize]).expect("write");
        assert!(read_manifest_file(&path).is_ok());
    }
}
