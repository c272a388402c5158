//! Image pull credentials: the docker configurations in a pod's image pull secrets, and the
//! kubelet's keyring that picks which of them to try for an image.
//!
//! As the kubelet (`pkg/credentialprovider`):
//!
//! * Secrets of type `kubernetes.io/dockerconfigjson` (key `.dockerconfigjson`,
//!   `{"auths": {"<registry>": {…}}}`) and `kubernetes.io/dockercfg` (key `.dockercfg`, the same
//!   map without `auths`) are read; an entry's `auth` (`base64(user:password)`) overrides its
//!   `username` and `password`. Secrets of other types are not image pull secrets.
//! * A registry key is a URL without its scheme; `/v1/` and `/v2/` paths stand for the host
//!   alone, so `https://index.docker.io/v1/` is the key `index.docker.io`.
//! * An image matches a key when their hosts have as many DNS labels and each label matches
//!   (`*` in the key matches within one label: `*.example.com` matches `a.example.com`, not
//!   `example.com`), their ports are equal (a key without a port does not match an image with
//!   one), and the key's path is a prefix of the image's repository path.
//! * Matching credentials come most specific first (keys in reverse lexical order), each tried
//!   in turn by the puller; Docker Hub images (`nginx`, `docker.io/library/nginx`) also match a
//!   key for `index.docker.io`.
//!
//! ```
//! use kubelet_core::credentials::Keyring;
//!
//! let config = br#"{"auths": {"registry.example.com:5000/team": {"auth": "dXNlcjpwYXNz"}}}"#;
//! let mut keyring = Keyring::default();
//! keyring.add_docker_config_json("pull-secret", config).unwrap();
//! let creds = keyring.lookup("registry.example.com:5000/team/app:v1").unwrap();
//! assert_eq!(creds[0].username, "user");
//! assert!(keyring.lookup("registry.example.com/team/app").unwrap().is_empty());
//! ```

use std::collections::BTreeMap;

use base64::Engine as _;
use k8s_openapi::api::core::v1::Secret;
use kubelet_api::runtime::AuthConfig;

/// Secret type of a `.dockerconfigjson` pull secret.
pub const DOCKER_CONFIG_JSON_TYPE: &str = "kubernetes.io/dockerconfigjson";
/// Secret type of a legacy `.dockercfg` pull secret.
pub const DOCKERCFG_TYPE: &str = "kubernetes.io/dockercfg";

/// The registry Docker Hub images are pulled from, as keyrings name it.
const DEFAULT_REGISTRY_HOST: &str = "index.docker.io";

/// Why credentials could not be read or an image could not be matched. Messages name the
/// secret and the registry, never a credential.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CredentialError {
    /// The secret's docker configuration is not the JSON it should be.
    #[error("image pull secret {secret:?}: malformed {key}: {reason}")]
    Malformed {
        /// Secret name.
        secret: String,
        /// The data key (`.dockerconfigjson` or `.dockercfg`).
        key: &'static str,
        /// What is wrong (the JSON parser's message, without the input).
        reason: String,
    },
    /// The secret has the right type but not its data key.
    #[error("image pull secret {secret:?} of type {type_} has no {key} data")]
    MissingData {
        /// Secret name.
        secret: String,
        /// Secret type.
        type_: String,
        /// The missing data key.
        key: &'static str,
    },
    /// An entry's `auth` field is not `base64(user:password)`.
    #[error("image pull secret {secret:?}: unable to parse auth field of registry {registry:?}")]
    BadAuthField {
        /// Secret name.
        secret: String,
        /// The entry's registry key.
        registry: String,
    },
    /// The image reference does not parse.
    #[error("couldn't parse image name {0:?}: invalid reference format")]
    InvalidImage(String),
}

/// One registry entry of a docker configuration (`auths.<registry>`).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
struct Entry {
    username: String,
    password: String,
    auth: String,
    #[serde(rename = "identitytoken")]
    identity_token: String,
    #[serde(rename = "registrytoken")]
    registry_token: String,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
struct ConfigJson {
    auths: BTreeMap<String, Entry>,
}

/// A parsed registry key: host labels, port and path prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Location {
    host: String,
    port: Option<String>,
    path: String,
}

impl Location {
    /// `host[:port][/path]`, with or without an `http(s)://` scheme.
    fn parse(s: &str) -> Option<Self> {
        let s = s
            .strip_prefix("https://")
            .or_else(|| s.strip_prefix("http://"))
            .unwrap_or(s);
        let (authority, path) = match s.find('/') {
            Some(i) => (&s[..i], &s[i..]),
            None => (s, ""),
        };
        if authority.is_empty() {
            return None;
        }
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
                (h, Some(p.to_string()))
            }
            Some(_) => return None,
            None => (authority, None),
        };
        Some(Self {
            host: host.to_ascii_lowercase(),
            port,
            path: path.to_string(),
        })
    }

    /// Does this key (possibly with `*` labels) match the image location `target`?
    fn matches(&self, target: &Location) -> bool {
        let globs: Vec<&str> = self.host.split('.').collect();
        let labels: Vec<&str> = target.host.split('.').collect();
        globs.len() == labels.len()
            && self.port == target.port
            && globs.iter().zip(&labels).all(|(g, l)| glob_match(g, l))
            && target.path.starts_with(&self.path)
    }
}

/// Shell-style match of one DNS label: `*` any run of characters, `?` one character.
fn glob_match(glob: &str, s: &str) -> bool {
    let (g, t) = (glob.as_bytes(), s.as_bytes());
    let (mut gi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match g.get(gi) {
            Some(b'*') => {
                star = Some((gi, ti));
                gi += 1;
            }
            Some(&c) if c == b'?' || c == t[ti] => {
                gi += 1;
                ti += 1;
            }
            _ => match star {
                Some((sg, st)) => {
                    gi = sg + 1;
                    ti = st + 1;
                    star = Some((sg, st + 1));
                }
                None => return false,
            },
        }
    }
    g[gi..].iter().all(|&c| c == b'*')
}

/// The registry and repository of an image reference, as the kubelet normalises it before a
/// keyring lookup: `nginx:1.25` is `docker.io/library/nginx`, `localhost:5000/a/b@sha256:…`
/// is `localhost:5000/a/b`.
pub fn repository_of(image: &str) -> Result<String, CredentialError> {
    let invalid = || CredentialError::InvalidImage(image.to_string());
    if image.is_empty() || image.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(invalid());
    }
    // Drop the digest, then a tag (a `:` after the last `/`).
    let name = image.split_once('@').map_or(image, |(n, _)| n);
    let name = match name.rfind(':') {
        Some(i) if !name[i..].contains('/') => &name[..i],
        _ => name,
    };
    if name.is_empty() || name.ends_with('/') || name.contains("//") {
        return Err(invalid());
    }
    let (first, rest) = match name.split_once('/') {
        Some((f, r)) => (f, Some(r)),
        None => (name, None),
    };
    let is_registry = |f: &str| f.contains('.') || f.contains(':') || f == "localhost";
    let repo = match rest {
        Some(rest) if is_registry(first) => return Ok(format!("{first}/{rest}")),
        Some(_) => name.to_string(),
        None => format!("library/{name}"),
    };
    if repo.chars().any(|c| c.is_ascii_uppercase()) {
        return Err(invalid());
    }
    Ok(format!("docker.io/{repo}"))
}

/// Is `repository` (normalised) on Docker Hub?
fn is_default_registry(repository: &str) -> bool {
    matches!(
        repository.split_once('/').map(|(h, _)| h),
        Some("docker.io" | "index.docker.io")
    )
}

/// Registry credentials keyed by registry location, from image pull secrets; see the
/// [module docs](self).
#[derive(Default, Clone)]
pub struct Keyring {
    /// `(key, location, credentials)`, kept sorted by key, descending.
    entries: Vec<(String, Location, AuthConfig)>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The keys only: credentials never reach a log line.
        f.debug_list()
            .entries(self.entries.iter().map(|(k, _, _)| k))
            .finish()
    }
}

impl Keyring {
    /// Add the docker configurations of image pull secret `secret`; secrets of other types
    /// add nothing (`Ok(false)`).
    pub fn add_secret(&mut self, secret: &Secret) -> Result<bool, CredentialError> {
        let name = secret.metadata.name.clone().unwrap_or_default();
        let type_ = secret.type_.as_deref().unwrap_or("");
        let key = match type_ {
            DOCKER_CONFIG_JSON_TYPE => ".dockerconfigjson",
            DOCKERCFG_TYPE => ".dockercfg",
            _ => return Ok(false),
        };
        let data = secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|b| b.0.clone())
            .or_else(|| {
                secret
                    .string_data
                    .as_ref()
                    .and_then(|d| d.get(key))
                    .map(|s| s.clone().into_bytes())
            })
            .ok_or_else(|| CredentialError::MissingData {
                secret: name.clone(),
                type_: type_.to_string(),
                key,
            })?;
        if key == ".dockerconfigjson" {
            self.add_docker_config_json(&name, &data)?;
        } else {
            self.add_dockercfg(&name, &data)?;
        }
        Ok(true)
    }

    /// Add a `.dockerconfigjson` document (`{"auths": {…}}`) read from secret `secret`.
    pub fn add_docker_config_json(
        &mut self,
        secret: &str,
        json: &[u8],
    ) -> Result<(), CredentialError> {
        let config: ConfigJson = parse(secret, ".dockerconfigjson", json)?;
        self.add_entries(secret, config.auths)
    }

    /// Add a legacy `.dockercfg` document (the registry map without `auths`) read from secret
    /// `secret`.
    pub fn add_dockercfg(&mut self, secret: &str, json: &[u8]) -> Result<(), CredentialError> {
        let entries: BTreeMap<String, Entry> = parse(secret, ".dockercfg", json)?;
        self.add_entries(secret, entries)
    }

    fn add_entries(
        &mut self,
        secret: &str,
        entries: BTreeMap<String, Entry>,
    ) -> Result<(), CredentialError> {
        for (registry, e) in entries {
            let Some(mut loc) = Location::parse(&registry) else {
                tracing::warn!(
                    secret,
                    registry,
                    "image pull secret: registry key does not parse; entry skipped"
                );
                continue;
            };
            // `/v1/` and `/v2/` name the registry itself (docker's ResolveAuthConfig).
            for api in ["/v1/", "/v2/"] {
                if let Some(rest) = loc.path.strip_prefix(api) {
                    loc.path = format!("/{rest}");
                }
            }
            if loc.path == "/" {
                loc.path.clear();
            }
            let mut auth = AuthConfig::default();
            auth.username = e.username;
            auth.password = e.password;
            if !e.auth.is_empty() {
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(e.auth.trim())
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok());
                let Some((user, password)) = decoded.as_deref().and_then(|d| d.split_once(':'))
                else {
                    return Err(CredentialError::BadAuthField {
                        secret: secret.to_string(),
                        registry,
                    });
                };
                auth.username = user.to_string();
                auth.password = password.to_string();
            }
            auth.identity_token = e.identity_token;
            auth.registry_token = e.registry_token;
            let host_port = match &loc.port {
                Some(p) => format!("{}:{p}", loc.host),
                None => loc.host.clone(),
            };
            // `server_address` stays empty, as the kubelet leaves it: containerd parses it as
            // a URL and rejects a bare `host:port`.
            let key = format!("{host_port}{}", loc.path);
            self.entries.push((key, loc, auth));
        }
        // Most specific first; a stable sort keeps the secrets' order for equal keys.
        kubelet_api::sort::by(&mut self.entries, |a, b| b.0.cmp(&a.0));
        Ok(())
    }

    /// Is there no credential at all?
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The credentials to try for `image`, most specific first; empty: pull anonymously.
    pub fn lookup(&self, image: &str) -> Result<Vec<AuthConfig>, CredentialError> {
        let repository = repository_of(image)?;
        let target = Location::parse(&repository)
            .ok_or_else(|| CredentialError::InvalidImage(image.to_string()))?;
        let mut out: Vec<AuthConfig> = self
            .entries
            .iter()
            .filter(|(_, loc, _)| loc.matches(&target))
            .map(|(_, _, a)| a.clone())
            .collect();
        if out.is_empty() && is_default_registry(&repository) {
            out = self
                .entries
                .iter()
                .filter(|(_, loc, _)| loc.host == DEFAULT_REGISTRY_HOST && loc.port.is_none())
                .map(|(_, _, a)| a.clone())
                .collect();
        }
        Ok(out)
    }
}

fn parse<T: serde::de::DeserializeOwned>(
    secret: &str,
    key: &'static str,
    json: &[u8],
) -> Result<T, CredentialError> {
    serde_json::from_slice(json).map_err(|e| CredentialError::Malformed {
        secret: secret.to_string(),
        key,
        // serde_json's messages name the position and the expected token, not the input.
        reason: e.to_string(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn keyring(json: &str) -> Keyring {
        let mut k = Keyring::default();
        k.add_docker_config_json("s", json.as_bytes()).unwrap();
        k
    }

    fn users(k: &Keyring, image: &str) -> Vec<String> {
        k.lookup(image)
            .unwrap()
            .into_iter()
            .map(|a| a.username)
            .collect()
    }

    #[test]
    fn images_normalise_as_the_kubelet_does() {
        for (image, want) in [
            ("nginx", "docker.io/library/nginx"),
            ("nginx:1.25", "docker.io/library/nginx"),
            ("team/app", "docker.io/team/app"),
            (
                "docker.io/library/nginx@sha256:abc",
                "docker.io/library/nginx",
            ),
            (
                "localhost/kubelet-sdk/pause:test",
                "localhost/kubelet-sdk/pause",
            ),
            ("127.0.0.1:5000/a/b:v1", "127.0.0.1:5000/a/b"),
            ("reg.example.com:443/a@sha256:0", "reg.example.com:443/a"),
        ] {
            assert_eq!(repository_of(image).unwrap(), want, "{image}");
        }
        for bad in ["", "a b", "UPPER", "a//b", "reg.io/"] {
            assert!(repository_of(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn matching_is_by_labels_port_and_path_prefix_most_specific_first() {
        let k = keyring(
            r#"{"auths": {
                "reg.example.com": {"username": "host", "password": "p"},
                "https://reg.example.com/team": {"username": "team", "password": "p"},
                "*.example.com": {"username": "wild", "password": "p"},
                "reg.example.com:5000": {"username": "port", "password": "p"},
                "https://index.docker.io/v1/": {"username": "hub", "password": "p"}
            }}"#,
        );
        assert_eq!(
            users(&k, "reg.example.com/team/app:v1"),
            ["team", "host", "wild"]
        );
        assert_eq!(users(&k, "reg.example.com/other/app"), ["host", "wild"]);
        assert_eq!(users(&k, "a.example.com/x"), ["wild"]);
        assert!(users(&k, "example.com/x").is_empty(), "* is one label");
        assert!(
            users(&k, "a.b.example.com/x").is_empty(),
            "label counts differ"
        );
        assert_eq!(users(&k, "reg.example.com:5000/x"), ["port"]);
        assert!(users(&k, "reg.example.com:5001/x").is_empty());
        assert_eq!(users(&k, "nginx"), ["hub"]);
        assert_eq!(users(&k, "docker.io/library/nginx:1"), ["hub"]);
        assert!(users(&k, "quay.io/x").is_empty());
    }

    #[test]
    fn auth_overrides_username_and_password_and_must_hold_a_colon() {
        let k = keyring(
            r#"{"auths": {"r.io": {"username": "u", "password": "p", "auth": "YWxpY2U6czNjcjN0OmV4dHJh"}}}"#,
        );
        let a = &k.lookup("r.io/x").unwrap()[0];
        assert_eq!(
            (a.username.as_str(), a.password.as_str()),
            ("alice", "s3cr3t:extra")
        );
        assert!(a.server_address.is_empty());
        let mut k = Keyring::default();
        let err = k
            .add_docker_config_json("s", br#"{"auths": {"r.io": {"auth": "bm9jb2xvbg=="}}}"#)
            .unwrap_err();
        assert!(matches!(err, CredentialError::BadAuthField { .. }), "{err}");
        let err = k
            .add_docker_config_json("s", br#"{"auths": {"r.io": {"auth": "!!"}}}"#)
            .unwrap_err();
        assert!(matches!(err, CredentialError::BadAuthField { .. }), "{err}");
    }

    #[test]
    fn secrets_of_both_types_are_read_and_others_ignored() {
        let secret = |type_: &str, key: &str, json: &str| Secret {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("s".into()),
                ..Default::default()
            },
            type_: Some(type_.into()),
            data: Some(
                [(key.to_string(), ByteString(json.as_bytes().to_vec()))]
                    .into_iter()
                    .collect(),
            ),
            ..Default::default()
        };
        let mut k = Keyring::default();
        assert!(
            k.add_secret(&secret(
                DOCKERCFG_TYPE,
                ".dockercfg",
                r#"{"old.io": {"username": "legacy", "password": "p"}}"#
            ))
            .unwrap()
        );
        assert!(!k.add_secret(&secret("Opaque", ".dockercfg", "{}")).unwrap());
        assert_eq!(users(&k, "old.io/a"), ["legacy"]);
        let err = k
            .add_secret(&secret(
                DOCKER_CONFIG_JSON_TYPE,
                ".dockerconfigjson",
                "{nope",
            ))
            .unwrap_err();
        assert!(matches!(err, CredentialError::Malformed { .. }), "{err}");
        let err = k
            .add_secret(&secret(DOCKER_CONFIG_JSON_TYPE, "other", "{}"))
            .unwrap_err();
        assert!(matches!(err, CredentialError::MissingData { .. }), "{err}");
    }

    #[test]
    fn no_credential_reaches_debug_output() {
        let k = keyring(r#"{"auths": {"r.io": {"username": "alice", "password": "hunter2"}}}"#);
        let text = format!("{k:?} {:?}", k.lookup("r.io/x").unwrap());
        assert!(
            !text.contains("hunter2") && !text.contains("alice"),
            "{text}"
        );
        let err = Keyring::default()
            .add_docker_config_json("s", br#"{"auths": {"r.io": {"password": hunter2}}}"#)
            .unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }

    #[test]
    fn globs_match_within_a_label() {
        assert!(glob_match("*", "abc"));
        assert!(glob_match("a*c", "abbbc"));
        assert!(glob_match("a?c", "abc"));
        assert!(!glob_match("a?c", "ac"));
        assert!(!glob_match("*.x", "a"));
    }
}
