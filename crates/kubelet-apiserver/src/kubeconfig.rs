//! Reading a kubeconfig file: [`read_kubeconfig`].
//!
//! The file is read as client-go reads it: YAML is converted to JSON values first, and the
//! kubeconfig types are decoded from those (so an unquoted `name: 1` is a number, not a string,
//! in both). `kube`'s own `Kubeconfig::read_from` decodes the YAML straight into the types, which
//! puts a second YAML deserializer of every kubeconfig type into the binary (about half a
//! megabyte); this reader reuses the YAML-to-value parser that manifests and the configuration
//! file already go through. What `read_from` does beyond parsing, this does the same way: UTF-8
//! text with or without a byte order mark, or UTF-16 with one; several documents merged with
//! `Kubeconfig::merge` (the first name wins); relative certificate, key, token-file and exec
//! command paths resolved against the file's directory (an exec command only when it holds a
//! `/`, so a bare command is still looked up in `PATH`).

use std::path::Path;

use kube::config::{Kubeconfig, KubeconfigError};
use serde_json::Value;

/// Why a kubeconfig file could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KubeconfigFileError {
    /// The file could not be read.
    #[error("reading the file")]
    Read(#[source] std::io::Error),
    /// The file is neither UTF-8 nor UTF-16 with a byte order mark.
    #[error("the file is not UTF-8 text (nor UTF-16 with a byte order mark)")]
    Encoding,
    /// The text is not YAML.
    #[error("invalid YAML")]
    Yaml(#[source] Box<serde_saphyr::Error>),
    /// A document is YAML but not a kubeconfig (a field of the wrong type, say).
    #[error("document {document} is not a kubeconfig")]
    Decode {
        /// The document's position in the file, from 1.
        document: usize,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// Two documents disagree on `kind` or `apiVersion`.
    #[error("merging the file's documents")]
    Merge(#[source] KubeconfigError),
}

/// Read the kubeconfig at `path` (see the [module docs](self) for what is resolved).
pub fn read_kubeconfig(path: &Path) -> Result<Kubeconfig, KubeconfigFileError> {
    let bytes = std::fs::read(path).map_err(KubeconfigFileError::Read)?;
    let text = decode_text(bytes)?;
    parse_kubeconfig(&text, path.parent())
}

/// Parse kubeconfig text; relative paths in it are resolved against `dir` when given.
pub fn parse_kubeconfig(text: &str, dir: Option<&Path>) -> Result<Kubeconfig, KubeconfigFileError> {
    let documents: Vec<Value> =
        serde_saphyr::from_multiple(text).map_err(|e| KubeconfigFileError::Yaml(Box::new(e)))?;
    let mut merged: Option<Kubeconfig> = None;
    for (i, document) in documents.into_iter().enumerate() {
        let document = match document {
            // An empty document (or a file of comments) is an empty kubeconfig.
            Value::Null => Value::Object(Default::default()),
            other => other,
        };
        let mut config: Kubeconfig =
            serde_json::from_value(document).map_err(|source| KubeconfigFileError::Decode {
                document: i + 1,
                source,
            })?;
        if let Some(dir) = dir {
            make_absolute(&mut config, dir);
        }
        merged = Some(match merged {
            None => config,
            Some(first) => first.merge(config).map_err(KubeconfigFileError::Merge)?,
        });
    }
    Ok(merged.unwrap_or_default())
}

/// The file's text: UTF-8 (a leading byte order mark dropped) or UTF-16 with a byte order mark.
fn decode_text(bytes: Vec<u8>) -> Result<String, KubeconfigFileError> {
    let utf16 = |rest: &[u8], from: fn([u8; 2]) -> u16| {
        if !rest.len().is_multiple_of(2) {
            return Err(KubeconfigFileError::Encoding);
        }
        let units: Vec<u16> = rest.chunks_exact(2).map(|c| from([c[0], c[1]])).collect();
        String::from_utf16(&units).map_err(|_| KubeconfigFileError::Encoding)
    };
    match bytes.as_slice() {
        [0xFF, 0xFE, rest @ ..] => utf16(rest, u16::from_le_bytes),
        [0xFE, 0xFF, rest @ ..] => utf16(rest, u16::from_be_bytes),
        [0xEF, 0xBB, 0xBF, rest @ ..] => {
            String::from_utf8(rest.to_vec()).map_err(|_| KubeconfigFileError::Encoding)
        }
        _ => String::from_utf8(bytes).map_err(|_| KubeconfigFileError::Encoding),
    }
}

/// Resolve the relative file references of `config` against `dir`.
fn make_absolute(config: &mut Kubeconfig, dir: &Path) {
    let absolute = |field: &mut Option<String>| {
        if let Some(path) = field.as_deref()
            && Path::new(path).is_relative()
            && let Some(joined) = dir.join(path).to_str()
        {
            *field = Some(joined.to_owned());
        }
    };
    for cluster in config
        .clusters
        .iter_mut()
        .filter_map(|c| c.cluster.as_mut())
    {
        absolute(&mut cluster.certificate_authority);
    }
    for user in config
        .auth_infos
        .iter_mut()
        .filter_map(|a| a.auth_info.as_mut())
    {
        absolute(&mut user.client_certificate);
        absolute(&mut user.client_key);
        absolute(&mut user.token_file);
        if let Some(exec) = user.exec.as_mut()
            && exec.command.as_deref().is_some_and(|c| c.contains('/'))
        {
            absolute(&mut exec.command);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const TWO_DOCUMENTS: &str = r#"
apiVersion: v1
kind: Config
current-context: node
clusters:
- name: local
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority: pki/ca.crt
contexts:
- name: node
  context: {cluster: local, user: node}
users:
- name: node
  user:
    client-certificate: /abs/node.crt
    client-key: keys/node.key
    tokenFile: token
    exec: {command: ./bin/helper, apiVersion: client.authentication.k8s.io/v1}
---
users:
- name: node
  user: {token: from-the-second-document}
- name: other
  user:
    exec: {command: helper, apiVersion: client.authentication.k8s.io/v1}
"#;

    #[test]
    fn documents_merge_first_name_wins_and_relative_paths_are_resolved() {
        let kc = parse_kubeconfig(TWO_DOCUMENTS, Some(Path::new("/etc/kubelet"))).unwrap();
        assert_eq!(kc.current_context.as_deref(), Some("node"));
        let cluster = kc.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:6443"));
        assert_eq!(
            cluster.certificate_authority.as_deref(),
            Some("/etc/kubelet/pki/ca.crt")
        );
        assert_eq!(kc.auth_infos.len(), 2);
        let node = kc.auth_infos[0].auth_info.as_ref().unwrap();
        assert_eq!(node.client_certificate.as_deref(), Some("/abs/node.crt"));
        assert_eq!(
            node.client_key.as_deref(),
            Some("/etc/kubelet/keys/node.key")
        );
        assert_eq!(node.token_file.as_deref(), Some("/etc/kubelet/token"));
        assert!(node.token.is_none(), "the first document's user wins whole");
        let exec = node.exec.as_ref().unwrap();
        assert_eq!(exec.command.as_deref(), Some("/etc/kubelet/./bin/helper"));
        let other = kc.auth_infos[1].auth_info.as_ref().unwrap();
        assert_eq!(
            other.exec.as_ref().unwrap().command.as_deref(),
            Some("helper")
        );
        assert_eq!(
            kc.contexts[0].context.as_ref().unwrap().user.as_deref(),
            Some("node")
        );
    }

    #[test]
    fn encodings_and_empty_files() {
        let text = "current-context: c\n";
        let mut utf16le = vec![0xFF, 0xFE];
        utf16le.extend(text.encode_utf16().flat_map(u16::to_le_bytes));
        let mut utf16be = vec![0xFE, 0xFF];
        utf16be.extend(text.encode_utf16().flat_map(u16::to_be_bytes));
        let mut bom = vec![0xEF, 0xBB, 0xBF];
        bom.extend(text.bytes());
        for bytes in [text.as_bytes().to_vec(), utf16le, utf16be, bom] {
            let kc = parse_kubeconfig(&decode_text(bytes).unwrap(), None).unwrap();
            assert_eq!(kc.current_context.as_deref(), Some("c"));
        }
        assert!(matches!(
            decode_text(vec![0xFF, 0xFE, 0x41]),
            Err(KubeconfigFileError::Encoding)
        ));
        assert!(matches!(
            decode_text(vec![0x66, 0xFF]),
            Err(KubeconfigFileError::Encoding)
        ));
        let empty = parse_kubeconfig("", None).unwrap();
        assert!(empty.clusters.is_empty() && empty.current_context.is_none());
        let comments = parse_kubeconfig("# nothing here\n", None).unwrap();
        assert!(comments.auth_infos.is_empty());
    }

    #[test]
    fn bad_input_gets_a_typed_error() {
        assert!(matches!(
            parse_kubeconfig("clusters: [unclosed", None),
            Err(KubeconfigFileError::Yaml(_))
        ));
        assert!(matches!(
            parse_kubeconfig("clusters: 3\n", None),
            Err(KubeconfigFileError::Decode { document: 1, .. })
        ));
        assert!(matches!(
            parse_kubeconfig("kind: Config\n---\nkind: Other\n", None),
            Err(KubeconfigFileError::Merge(_))
        ));
        let missing = read_kubeconfig(Path::new("/nonexistent/kubeconfig"));
        assert!(matches!(missing, Err(KubeconfigFileError::Read(_))));
    }

    #[test]
    fn unknown_fields_are_kept() {
        let kc = parse_kubeconfig("current-context: c\nx-extra: {a: 1}\n", None).unwrap();
        assert_eq!(kc.other.get("x-extra"), Some(&serde_json::json!({"a": 1})));
    }
}
