//! The SDK's one TLS loader: certificates, keys and CA bundles from PEM files, and
//! [`ReloadingIdentity`], a certificate and key that are read again when their files change.
//!
//! The same [`ReloadingIdentity`] is a server's certificate ([`ResolvesServerCert`]: the
//! kubelet API port, the pod push endpoint) and a client's identity ([`ResolvesClientCert`]: a
//! client that authenticates with a certificate). Whoever rotates the files (the kubelet's
//! certificate manager writes a new pair and swaps it in) needs nothing else: the next
//! handshake after a change, at most [`RELOAD_CHECK`] later, uses the new pair; established
//! connections keep the one they started with. A changed pair that cannot be loaded (a key
//! written before its certificate) is logged and the previous pair stays in use.
//!
//! ```no_run
//! use std::path::Path;
//! use kubelet_net::tls::{ReloadingIdentity, client_config, server_config};
//!
//! # fn demo() -> Result<(), kubelet_net::tls::TlsError> {
//! let identity = ReloadingIdentity::load(Path::new("kubelet.crt"), Path::new("kubelet.key"))?;
//! // Serve it, verifying client certificates against a CA when presented...
//! let server = server_config(identity.clone(), Some(Path::new("ca.crt")))?;
//! // ...and present it as a client, trusting the same CA.
//! let client = client_config(Some(Path::new("ca.crt")), Some(identity))?;
//! # let _ = (server, client);
//! # Ok(())
//! # }
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;
use rustls::client::ResolvesClientCert;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig, SignatureScheme};

/// How often, at most, a [`ReloadingIdentity`]'s files are checked for changes (on a
/// handshake).
pub const RELOAD_CHECK: Duration = Duration::from_secs(1);

/// Why TLS material could not be loaded or a configuration built. Each names the file at
/// fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A PEM file could not be read or parsed.
    #[error("reading {path}: {reason}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A certificate file holds no certificate.
    #[error("{path}: no certificates")]
    NoCertificates {
        /// The file.
        path: PathBuf,
    },
    /// A certificate is not usable as a trust anchor.
    #[error("{path}: {reason}")]
    BadCertificate {
        /// The file.
        path: PathBuf,
        /// What rustls said.
        reason: String,
    },
    /// A certificate and a key do not form a usable pair.
    #[error("{cert} and {key} do not form a usable pair: {reason}")]
    InvalidPair {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// What rustls said.
        reason: String,
    },
    /// The configuration could not be built (protocol versions, client verifier).
    #[error("TLS configuration: {0}")]
    Config(String),
}

impl TlsError {
    /// The file at fault, if one is.
    pub fn path(&self) -> Option<&Path> {
        match self {
            TlsError::Read { path, .. }
            | TlsError::NoCertificates { path }
            | TlsError::BadCertificate { path, .. } => Some(path),
            TlsError::InvalidPair { cert, .. } => Some(cert),
            TlsError::Config(_) => None,
        }
    }
}

/// The crypto provider of the SDK's TLS (ring).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificates in PEM file `path`, in order (a chain: leaf first); none is an error.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| TlsError::Read {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificates {
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

/// The private key in PEM file `path` (PKCS#8, PKCS#1 or SEC1).
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsError::Read {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// The CAs in PEM bundle `path` as trust anchors.
pub fn load_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for c in load_certs(path)? {
        roots.add(c).map_err(|e| TlsError::BadCertificate {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    }
    Ok(roots)
}

/// The system's trust anchors (unreadable ones are skipped, with a debug line).
pub fn system_roots() -> RootCertStore {
    let mut roots = RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for e in &native.errors {
        tracing::debug!(error = %e, "loading a system root certificate failed");
    }
    let (added, ignored) = roots.add_parsable_certificates(native.certs);
    tracing::debug!(added, ignored, "system root certificates loaded");
    roots
}

fn load_pair(
    cert: &Path,
    key: &Path,
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = load_certs(cert)?;
    let key_der = load_key(key)?;
    CertifiedKey::from_der(chain, key_der, provider)
        .map(Arc::new)
        .map_err(|e| TlsError::InvalidPair {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            reason: e.to_string(),
        })
}

/// What identifies a file's version (modification time, size, inode).
type Stamp = Option<(SystemTime, u64, u64)>;

fn stamp(path: &Path) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len(), m.ino()))
}

#[derive(Debug)]
struct State {
    current: Arc<CertifiedKey>,
    stamps: (Stamp, Stamp),
    checked: Instant,
}

/// A certificate (chain) and key read from two PEM files and read again when either changes
/// (checked on a handshake, at most every [`RELOAD_CHECK`]). Serves as a server certificate
/// and as a client identity.
pub struct ReloadingIdentity {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    state: Mutex<State>,
}

impl std::fmt::Debug for ReloadingIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingIdentity")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl ReloadingIdentity {
    /// Read the pair now (an error names the file at fault) with the SDK's provider.
    pub fn load(cert: &Path, key: &Path) -> Result<Arc<Self>, TlsError> {
        Self::load_with(cert, key, provider())
    }

    /// Read the pair now with `provider` (a server with restricted cipher suites).
    pub fn load_with(
        cert: &Path,
        key: &Path,
        provider: Arc<CryptoProvider>,
    ) -> Result<Arc<Self>, TlsError> {
        let stamps = (stamp(cert), stamp(key));
        let current = load_pair(cert, key, &provider)?;
        Ok(Arc::new(Self {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            provider,
            state: Mutex::new(State {
                current,
                stamps,
                checked: Instant::now(),
            }),
        }))
    }

    /// Read the files again now (a pair just written), whatever the last look; on an error
    /// the previous pair stays (and the error is logged).
    pub fn reload_now(&self) {
        let mut state = self.state.lock();
        state.checked = Instant::now();
        state.stamps = (stamp(&self.cert), stamp(&self.key));
        match load_pair(&self.cert, &self.key, &self.provider) {
            Ok(pair) => state.current = pair,
            Err(e) => {
                tracing::warn!(error = %e, "the certificate files cannot be loaded; using the previous pair");
            }
        }
    }

    /// The certificate file.
    pub fn cert_path(&self) -> &Path {
        &self.cert
    }

    /// The pair to use now: re-read first when the files changed since the last look (and the
    /// last look is [`RELOAD_CHECK`] old).
    pub fn current(&self) -> Arc<CertifiedKey> {
        let mut state = self.state.lock();
        if state.checked.elapsed() >= RELOAD_CHECK {
            state.checked = Instant::now();
            let stamps = (stamp(&self.cert), stamp(&self.key));
            if stamps != state.stamps {
                // Tried once per change of the files: a key written before its certificate
                // fails here and is picked up when the certificate's write changes them again.
                state.stamps = stamps;
                match load_pair(&self.cert, &self.key, &self.provider) {
                    Ok(pair) => {
                        tracing::info!(cert = %self.cert.display(), "certificate reloaded");
                        state.current = pair;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the certificate files changed but cannot be loaded; using the previous pair");
                    }
                }
            }
        }
        state.current.clone()
    }
}

impl ResolvesServerCert for ReloadingIdentity {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

impl ResolvesClientCert for ReloadingIdentity {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        let pair = self.current();
        pair.key.choose_scheme(sigschemes).is_some().then_some(pair)
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// A client configuration trusting the CAs in `ca_file` (the system's when `None`), presenting
/// `identity` when a server asks for a certificate. With an identity, sessions are not resumed
/// (a resumed session would keep presenting the identity it was made with).
pub fn client_config(
    ca_file: Option<&Path>,
    identity: Option<Arc<ReloadingIdentity>>,
) -> Result<Arc<ClientConfig>, TlsError> {
    let roots = match ca_file {
        Some(path) => load_roots(path)?,
        None => system_roots(),
    };
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(roots);
    let config = match identity {
        Some(id) => {
            let mut config = builder.with_client_cert_resolver(id);
            // A resumed session keeps the identity it was made with: every connection does a
            // full handshake, so a rotated certificate is presented from the next one on.
            config.resumption = rustls::client::Resumption::disabled();
            config
        }
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// A server configuration serving `identity`, with the safe default protocol versions. With
/// `client_ca_file`, client certificates signed by those CAs are verified when presented
/// (requested, not required: clients without one may still authenticate otherwise).
pub fn server_config(
    identity: Arc<ReloadingIdentity>,
    client_ca_file: Option<&Path>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = identity.provider.clone();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match client_ca_file {
        Some(ca) => builder.with_client_cert_verifier(client_verifier(ca, provider)?),
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(builder.with_cert_resolver(identity)))
}

/// A verifier of client certificates signed by the CAs in `ca_file`; a client without a
/// certificate is let through (to authenticate otherwise).
pub fn client_verifier(
    ca_file: &Path,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    WebPkiClientVerifier::builder_with_provider(Arc::new(load_roots(ca_file)?), provider)
        .allow_unauthenticated()
        .build()
        .map_err(|e| TlsError::BadCertificate {
            path: ca_file.to_path_buf(),
            reason: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CA certificate and its key.
    fn ca() -> (rcgen::Certificate, rcgen::KeyPair) {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "test-ca");
        (p.self_signed(&key).expect("ca"), key)
    }

    fn leaf(cn: &str, ca: &(rcgen::Certificate, rcgen::KeyPair)) -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut p = rcgen::CertificateParams::new(vec!["localhost".to_string()]).expect("params");
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let cert = p.signed_by(&key, &ca.0, &ca.1).expect("leaf");
        (cert.pem(), key.serialize_pem())
    }

    /// Does the pair's leaf carry `name` (the tests' CNs are unique strings)?
    fn carries(pair: &CertifiedKey, name: &str) -> bool {
        pair.cert[0]
            .as_ref()
            .windows(name.len())
            .any(|w| w == name.as_bytes())
    }

    #[test]
    fn loading_errors_name_the_file() {
        let dir = tempfile::tempdir().expect("dir");
        let missing = dir.path().join("missing.crt");
        let e = ReloadingIdentity::load(&missing, &missing).expect_err("missing");
        assert!(e.to_string().contains("missing.crt"), "{e}");
        let empty = dir.path().join("empty.crt");
        std::fs::write(&empty, "").expect("write");
        let e = load_certs(&empty).expect_err("empty");
        assert!(matches!(e, TlsError::NoCertificates { .. }), "{e}");
        // A key that does not go with the certificate.
        let ca = ca();
        let (c1, _) = leaf("one", &ca);
        let (_, k2) = leaf("two", &ca);
        let (cert, key) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        std::fs::write(&cert, c1).expect("write");
        std::fs::write(&key, k2).expect("write");
        let e = ReloadingIdentity::load(&cert, &key).expect_err("mismatch");
        assert!(matches!(e, TlsError::InvalidPair { .. }), "{e}");
    }

    #[test]
    fn a_rotated_pair_is_served_and_presented_after_the_next_check() {
        let dir = tempfile::tempdir().expect("dir");
        let ca = ca();
        let (cert, key) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        let (c1, k1) = leaf("first-identity", &ca);
        std::fs::write(&cert, &c1).expect("write");
        std::fs::write(&key, &k1).expect("write");
        let id = ReloadingIdentity::load(&cert, &key).expect("load");
        assert!(carries(&id.current(), "first-identity"));
        let schemes = [
            SignatureScheme::ECDSA_NISTP256_SHA256,
            SignatureScheme::ED25519,
            SignatureScheme::RSA_PSS_SHA256,
        ];
        let presented = ResolvesClientCert::resolve(id.as_ref(), &[], &schemes).expect("client");
        assert!(carries(&presented, "first-identity"));

        // A half-written rotation (new key, old certificate) keeps the old pair.
        let (c2, k2) = leaf("second-identity", &ca);
        std::fs::write(&key, &k2).expect("write");
        std::thread::sleep(RELOAD_CHECK + Duration::from_millis(50));
        assert!(carries(&id.current(), "first-identity"));
        // Once the certificate is in place too, the next check takes the new pair.
        std::fs::write(&cert, &c2).expect("write");
        std::thread::sleep(RELOAD_CHECK + Duration::from_millis(50));
        assert!(carries(&id.current(), "second-identity"));
        let presented = ResolvesClientCert::resolve(id.as_ref(), &[], &schemes).expect("client");
        assert!(carries(&presented, "second-identity"));
    }
}
