//! The kubelet's configuration file (`--config`): a `KubeletConfiguration` of
//! `kubelet.config.k8s.io/v1beta1` in YAML or JSON, read as the kubelet reads it.
//!
//! - an empty file, a file that is not YAML, a wrong `apiVersion` or `kind`, a value of the wrong
//!   type or out of range are errors that name the file and the field (`syncFrequency: invalid
//!   duration "soon"`);
//! - fields the SDK does not know or does not support are listed in
//!   [`LoadedConfiguration::unknown_fields`] and otherwise ignored (the kubelet's lenient
//!   decoding: a file written for a newer kubelet, or by kubeadm, still loads);
//! - a zero value means "unset" where the kubelet's does (`syncFrequency: 0s` is the 1 m
//!   default; [`KubeletConfiguration::default_unset_fields`]); `null` is unset too;
//! - relative paths (`staticPodPath`, `authentication.x509.clientCAFile`, `tlsCertFile`,
//!   `tlsPrivateKeyFile`, `resolvConf`, `podLogsDir`) are resolved against the file's
//!   directory.
//!
//! Flags given on a command line override the file: apply them to
//! [`LoadedConfiguration::configuration`] afterwards (`minimal_kubelet` does).
//!
//! ```
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("config.yaml");
//! std::fs::write(&path, "\
//! apiVersion: kubelet.config.k8s.io/v1beta1
//! kind: KubeletConfiguration
//! staticPodPath: manifests
//! syncFrequency: 0s
//! hairpinMode: hairpin-veth
//! ").unwrap();
//! let loaded = kubelet::config_file::load(&path).unwrap();
//! let c = &loaded.configuration;
//! assert_eq!(c.static_pod_path, dir.path().join("manifests").to_str().unwrap());
//! assert_eq!(c.sync_frequency.as_duration(), std::time::Duration::from_secs(60));
//! assert_eq!(loaded.unknown_fields, ["hairpinMode"]);
//! ```

use std::path::{Path, PathBuf};

use kubelet_core::configuration::{
    AGENT_API_VERSION, AGENT_KIND, API_VERSION, AgentConfiguration, KIND, KubeletConfiguration,
};
use serde_json::{Map, Value};

/// Why a configuration file cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigFileError {
    /// The file cannot be read.
    #[error("reading the kubelet configuration file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The file is empty (the kubelet does not take that for "all defaults" either).
    #[error("kubelet config file {path} was empty")]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// The file is neither YAML nor JSON, or not a mapping at its top.
    #[error("kubelet config file {path} cannot be parsed: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// `apiVersion` or `kind` is not `kubelet.config.k8s.io/v1beta1` / `KubeletConfiguration`.
    #[error("kubelet config file {path} is {api_version:?}/{kind:?}, want {want}")]
    WrongKind {
        /// The file.
        path: PathBuf,
        /// The `apiVersion` found (empty when absent).
        api_version: String,
        /// The `kind` found (empty when absent).
        kind: String,
        /// What the document must be (`kubelet.config.k8s.io/v1beta1/KubeletConfiguration`, or
        /// the SDK's `agent.kubelet-sdk.io/v1alpha1/AgentConfiguration` for a second document).
        want: String,
    },
    /// A field has a value of the wrong type or out of range.
    #[error("kubelet config file {path}: {field}: {message}")]
    Field {
        /// The file.
        path: PathBuf,
        /// The field, as a path (`authentication.webhook.cacheTTL`).
        field: String,
        /// What is wrong.
        message: String,
    },
}

/// A configuration file, loaded.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LoadedConfiguration {
    /// The configuration: the file's values, the kubelet's defaults for the rest.
    pub configuration: KubeletConfiguration,
    /// Fields of the file the SDK does not know or support, as paths (`logging.format`); they
    /// are ignored. Worth one warning.
    pub unknown_fields: Vec<String>,
    /// The SDK's own settings, from a second YAML document of kind `AgentConfiguration`
    /// (`agent.kubelet-sdk.io/v1alpha1`); the defaults without one.
    pub agent: AgentConfiguration,
    /// The file, made absolute.
    pub path: PathBuf,
}

/// Load the configuration file at `path` (made absolute against the working directory).
pub fn load(path: &Path) -> Result<LoadedConfiguration, ConfigFileError> {
    let path = std::path::absolute(path).map_err(|source| ConfigFileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let text = std::fs::read_to_string(&path).map_err(|source| ConfigFileError::Read {
        path: path.clone(),
        source,
    })?;
    let dir = path.parent().unwrap_or(Path::new("/")).to_path_buf();
    let (configuration, agent, unknown_fields) = parse(&text, &dir).map_err(|e| e.at(&path))?;
    Ok(LoadedConfiguration {
        configuration,
        unknown_fields,
        agent,
        path,
    })
}

/// An error of [`parse`], before it knows the file's name.
#[derive(Debug)]
enum ParseError {
    Empty,
    Parse(String),
    WrongKind(String, String, String),
    Field(String, String),
}

impl ParseError {
    fn at(self, path: &Path) -> ConfigFileError {
        let path = path.to_path_buf();
        match self {
            Self::Empty => ConfigFileError::Empty { path },
            Self::Parse(message) => ConfigFileError::Parse { path, message },
            Self::WrongKind(api_version, kind, want) => ConfigFileError::WrongKind {
                path,
                api_version,
                kind,
                want,
            },
            Self::Field(field, message) => ConfigFileError::Field {
                path,
                field,
                message,
            },
        }
    }
}

/// Parse a configuration file's text; relative paths are resolved against `dir`. A second
/// document, when there is one, is the SDK's `AgentConfiguration`.
fn parse(
    text: &str,
    dir: &Path,
) -> Result<(KubeletConfiguration, AgentConfiguration, Vec<String>), ParseError> {
    if text.trim().is_empty() {
        return Err(ParseError::Empty);
    }
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(text).map_err(|e| ParseError::Parse(e.to_string()))?;
    let mut docs = docs.into_iter().filter(|d| !d.is_null());
    let Some(Value::Object(mut object)) = docs.next() else {
        return Err(ParseError::Parse(
            "the top level is not a mapping".to_string(),
        ));
    };
    check_kind(&object, API_VERSION, KIND)?;
    remove_nulls(&mut object);
    let mut unknown = Vec::new();
    strip_unknown(&mut object, &schema(), "", &mut unknown);
    let update_given = object.contains_key("nodeStatusUpdateFrequency");
    let report_given = object.contains_key("nodeStatusReportFrequency");
    let mut configuration: KubeletConfiguration = deserialize(object, "")?;
    configuration.default_unset_fields(update_given, report_given);
    resolve_paths(&mut configuration, dir);
    let agent = match docs.next() {
        None => AgentConfiguration::default(),
        Some(Value::Object(mut object)) => {
            check_kind(&object, AGENT_API_VERSION, AGENT_KIND)?;
            object.remove("apiVersion");
            object.remove("kind");
            remove_nulls(&mut object);
            let schema = match serde_json::to_value(AgentConfiguration::default()) {
                Ok(Value::Object(o)) => o,
                _ => Map::new(),
            };
            strip_unknown(&mut object, &schema, AGENT_KIND, &mut unknown);
            deserialize(object, AGENT_KIND)?
        }
        Some(_) => {
            return Err(ParseError::Parse(
                "the second document is not a mapping".to_string(),
            ));
        }
    };
    if docs.next().is_some() {
        return Err(ParseError::Parse(format!(
            "more than two documents: the file holds a {KIND} and optionally an {AGENT_KIND}"
        )));
    }
    Ok((configuration, agent, unknown))
}

/// `apiVersion` and `kind` of a document must be `api_version` / `kind`.
fn check_kind(
    object: &Map<String, Value>,
    api_version: &str,
    kind: &str,
) -> Result<(), ParseError> {
    let text_of = |k: &str| {
        object
            .get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let (found_version, found_kind) = (text_of("apiVersion"), text_of("kind"));
    if found_version != api_version || found_kind != kind {
        return Err(ParseError::WrongKind(
            found_version,
            found_kind,
            format!("{api_version}/{kind}"),
        ));
    }
    Ok(())
}

/// Deserialize a document, naming the field (under `prefix`) that failed.
fn deserialize<T: k8s_openapi::serde::de::DeserializeOwned>(
    object: Map<String, Value>,
    prefix: &str,
) -> Result<T, ParseError> {
    serde_path_to_error::deserialize(Value::Object(object)).map_err(|e| {
        let field = if prefix.is_empty() {
            e.path().to_string()
        } else {
            format!("{prefix}.{}", e.path())
        };
        ParseError::Field(field, e.into_inner().to_string())
    })
}

/// Drop `null` values (unset, as the kubelet reads them).
fn remove_nulls(object: &mut Map<String, Value>) {
    object.retain(|_, v| !v.is_null());
    for v in object.values_mut() {
        if let Value::Object(o) = v {
            remove_nulls(o);
        }
    }
}

/// The fields the SDK knows: its configuration's serialised defaults (nested structures are
/// objects with fields; maps are empty objects and taken whole) and the optional fields.
fn schema() -> Map<String, Value> {
    let mut schema = match serde_json::to_value(KubeletConfiguration::default()) {
        Ok(Value::Object(o)) => o,
        _ => Map::new(),
    };
    for optional in ["evictionHard", "maxParallelImagePulls"] {
        schema.insert(optional.to_string(), Value::Null);
    }
    schema
}

/// Remove the fields of `object` that `schema` lacks, recording their paths in `unknown`.
fn strip_unknown(
    object: &mut Map<String, Value>,
    schema: &Map<String, Value>,
    prefix: &str,
    unknown: &mut Vec<String>,
) {
    let keys: Vec<String> = object.keys().cloned().collect();
    for key in keys {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        match schema.get(&key) {
            None => {
                object.remove(&key);
                unknown.push(path);
            }
            // A structure of the configuration (a non-empty object): look inside.
            Some(Value::Object(inner)) if !inner.is_empty() => {
                if let Some(Value::Object(o)) = object.get_mut(&key) {
                    strip_unknown(o, inner, &path, unknown);
                }
            }
            Some(_) => {}
        }
    }
}

fn resolve_paths(c: &mut KubeletConfiguration, dir: &Path) {
    let resolve = |p: &mut String| {
        if !p.is_empty() && Path::new(p.as_str()).is_relative() {
            *p = dir.join(p.as_str()).to_string_lossy().into_owned();
        }
    };
    resolve(&mut c.static_pod_path);
    resolve(&mut c.tls_cert_file);
    resolve(&mut c.tls_private_key_file);
    resolve(&mut c.resolv_conf);
    resolve(&mut c.pod_logs_dir);
    resolve(&mut c.authentication.x509.client_ca_file);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn parse_ok(text: &str) -> (KubeletConfiguration, Vec<String>) {
        let (c, _, unknown) = parse(text, Path::new("/etc/kubelet")).unwrap();
        (c, unknown)
    }

    const HEAD: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

    /// The file kubeadm 1.31–1.33 writes on a systemd-resolved host.
    const KUBEADM: &str = include_str!("../tests/fixtures/kubeadm-config.yaml");

    #[test]
    fn a_kubeadm_file_loads_with_the_kubelets_defaults() {
        let (c, unknown) = parse_ok(KUBEADM);
        let d = KubeletConfiguration::default();
        assert_eq!(c.sync_frequency, d.sync_frequency);
        assert_eq!(
            c.file_check_frequency.as_duration(),
            Duration::from_secs(20)
        );
        assert_eq!(
            c.node_status_update_frequency.as_duration(),
            Duration::from_secs(10)
        );
        assert_eq!(
            c.node_status_report_frequency.as_duration(),
            Duration::from_secs(300)
        );
        assert_eq!(
            c.runtime_request_timeout.as_duration(),
            Duration::from_secs(120)
        );
        assert_eq!(
            c.authorization.webhook.cache_authorized_ttl.as_duration(),
            Duration::from_secs(300)
        );
        assert_eq!(
            c.authentication.webhook.cache_ttl.as_duration(),
            Duration::from_secs(120)
        );
        assert_eq!(
            c.streaming_connection_idle_timeout.as_duration(),
            Duration::from_secs(4 * 3600)
        );
        assert_eq!(c.cgroup_driver, "systemd");
        assert_eq!(c.cluster_dns, ["10.96.0.10"]);
        assert_eq!(c.cluster_domain, "cluster.local");
        assert_eq!(c.resolv_conf, "/run/systemd/resolve/resolv.conf");
        assert_eq!(c.static_pod_path, "/etc/kubernetes/manifests");
        assert_eq!(
            c.authentication.x509.client_ca_file,
            "/etc/kubernetes/pki/ca.crt"
        );
        assert!(c.rotate_certificates);
        assert!(!c.authentication.anonymous.enabled);
        assert_eq!(c.container_runtime_endpoint, "");
        assert_eq!(unknown, ["crashLoopBackOff", "logging", "memorySwap"]);
    }

    #[test]
    fn json_loads_and_relative_paths_follow_the_file() {
        let (c, unknown) = parse_ok(
            r#"{"apiVersion":"kubelet.config.k8s.io/v1beta1","kind":"KubeletConfiguration",
                "staticPodPath":"manifests","tlsCertFile":"pki/kubelet.crt",
                "authentication":{"x509":{"clientCAFile":"ca.crt"},"unknownInner":1},
                "podLogsDir":"/var/log/pods","resolvConf":""}"#,
        );
        assert_eq!(c.static_pod_path, "/etc/kubelet/manifests");
        assert_eq!(c.tls_cert_file, "/etc/kubelet/pki/kubelet.crt");
        assert_eq!(c.authentication.x509.client_ca_file, "/etc/kubelet/ca.crt");
        assert_eq!(c.pod_logs_dir, "/var/log/pods");
        // An empty resolvConf switches the host resolver off: kept empty.
        assert_eq!(c.resolv_conf, "");
        assert_eq!(unknown, ["authentication.unknownInner"]);
    }

    #[test]
    fn the_report_frequency_follows_a_set_update_frequency() {
        let (c, _) = parse_ok(&format!("{HEAD}nodeStatusUpdateFrequency: 20s\n"));
        assert_eq!(
            c.node_status_report_frequency.as_duration(),
            Duration::from_secs(20)
        );
        let (c, _) = parse_ok(&format!(
            "{HEAD}nodeStatusUpdateFrequency: 20s\nnodeStatusReportFrequency: 1m\n"
        ));
        assert_eq!(
            c.node_status_report_frequency.as_duration(),
            Duration::from_secs(60)
        );
        let (c, _) = parse_ok(HEAD);
        assert_eq!(
            c.node_status_report_frequency.as_duration(),
            Duration::from_secs(300)
        );
    }

    #[test]
    fn bad_files_are_errors_that_name_the_field() {
        let e = parse("  \n", Path::new("/")).unwrap_err();
        assert!(matches!(e, ParseError::Empty), "{e:?}");
        let e = parse("a: [", Path::new("/")).unwrap_err();
        assert!(matches!(e, ParseError::Parse(_)), "{e:?}");
        let e = parse(
            "apiVersion: kubelet.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n",
            Path::new("/"),
        )
        .unwrap_err();
        assert!(
            matches!(e, ParseError::WrongKind(ref v, _, _) if v == "kubelet.config.k8s.io/v1alpha1"),
            "{e:?}"
        );
        let e = parse(&format!("{HEAD}syncFrequency: -1s\n"), Path::new("/")).unwrap_err();
        let ParseError::Field(field, message) = e else {
            panic!("{e:?}")
        };
        assert_eq!(field, "syncFrequency");
        assert!(message.contains("negative"), "{message}");
        let e = parse(
            &format!("{HEAD}authentication:\n  webhook:\n    cacheTTL: soon\n"),
            Path::new("/"),
        )
        .unwrap_err();
        assert!(
            matches!(e, ParseError::Field(ref f, _) if f == "authentication.webhook.cacheTTL"),
            "{e:?}"
        );
        let e = parse(&format!("{HEAD}port: 70000\n"), Path::new("/")).unwrap_err();
        assert!(
            matches!(e, ParseError::Field(ref f, _) if f == "port"),
            "{e:?}"
        );
        let e = parse(&format!("{HEAD}maxPods: many\n"), Path::new("/")).unwrap_err();
        assert!(
            matches!(e, ParseError::Field(ref f, _) if f == "maxPods"),
            "{e:?}"
        );
        // A misspelt field is not an error: it is listed.
        let (_, unknown) = parse_ok(&format!("{HEAD}syncFrequncy: 1m\n"));
        assert_eq!(unknown, ["syncFrequncy"]);
    }

    #[test]
    fn a_second_document_is_the_sdks_agent_configuration() {
        let (_, agent, unknown) = parse(HEAD, Path::new("/")).unwrap();
        assert!(agent.pod_checkpoint.enabled, "on by default");
        assert_eq!(
            agent.pod_checkpoint.offline_start_wait.as_duration(),
            Duration::from_secs(5)
        );
        assert!(unknown.is_empty());
        let text = format!(
            "{HEAD}---\napiVersion: agent.kubelet-sdk.io/v1alpha1\nkind: AgentConfiguration\npodCheckpoint:\n  offlineStartWait: 2s\n  maxAge: 0s\n  colour: red\n"
        );
        let (_, agent, unknown) = parse(&text, Path::new("/")).unwrap();
        let p = &agent.pod_checkpoint;
        assert!(p.enabled);
        assert_eq!(p.offline_start_wait.as_duration(), Duration::from_secs(2));
        assert!(p.max_age.as_duration().is_zero());
        assert_eq!(
            p.max_size_bytes,
            64 * 1024 * 1024,
            "unset fields keep their defaults"
        );
        assert_eq!(unknown, ["AgentConfiguration.podCheckpoint.colour"]);
        let text = format!(
            "{HEAD}---\napiVersion: agent.kubelet-sdk.io/v1alpha1\nkind: AgentConfiguration\npodCheckpoint:\n  enabled: false\n"
        );
        assert!(
            !parse(&text, Path::new("/"))
                .unwrap()
                .1
                .pod_checkpoint
                .enabled
        );
        // A wrong second document, or a wrong value in it, names what is wrong.
        let e = parse(&format!("{HEAD}---\n{HEAD}"), Path::new("/")).unwrap_err();
        assert!(
            matches!(e, ParseError::WrongKind(_, ref k, ref want) if k == "KubeletConfiguration" && want.ends_with("/AgentConfiguration")),
            "{e:?}"
        );
        let text = format!(
            "{HEAD}---\napiVersion: agent.kubelet-sdk.io/v1alpha1\nkind: AgentConfiguration\npodCheckpoint:\n  maxAge: long\n"
        );
        let e = parse(&text, Path::new("/")).unwrap_err();
        assert!(
            matches!(e, ParseError::Field(ref f, _) if f == "AgentConfiguration.podCheckpoint.maxAge"),
            "{e:?}"
        );
    }

    #[test]
    fn load_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        std::fs::write(&path, "").unwrap();
        let e = load(&path).unwrap_err();
        assert!(e.to_string().contains("c.yaml"), "{e}");
        let e = load(&dir.path().join("absent.yaml")).unwrap_err();
        assert!(matches!(e, ConfigFileError::Read { .. }), "{e}");
        std::fs::write(
            &path,
            format!(
                "{HEAD}registerWithTaints:\n- key: edge\n  value: \"true\"\n  effect: NoSchedule\n"
            ),
        )
        .unwrap();
        let loaded = load(&path).unwrap();
        assert_eq!(loaded.configuration.register_with_taints.len(), 1);
        assert_eq!(
            loaded.configuration.register_with_taints[0].effect,
            "NoSchedule"
        );
        assert!(loaded.unknown_fields.is_empty());
    }
}
