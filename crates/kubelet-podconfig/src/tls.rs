//! TLS material for the manifest URL client and the push endpoint (rustls, ring provider, no
//! native TLS library).

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::error::PodConfigError;

fn tls_err(path: &Path, reason: impl std::fmt::Display) -> PodConfigError {
    PodConfigError::LoadTls {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate in a PEM file (at least one).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, PodConfigError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| tls_err(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls_err(path, e))?;
    if certs.is_empty() {
        return Err(tls_err(path, "no certificate found"));
    }
    Ok(certs)
}

/// The first private key (PKCS#8, PKCS#1 or SEC1) in a PEM file.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, PodConfigError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| tls_err(path, e))
}

fn roots_from(path: &Path) -> Result<RootCertStore, PodConfigError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(path)? {
        roots.add(cert).map_err(|e| tls_err(path, e))?;
    }
    Ok(roots)
}

/// A client configuration trusting the CAs in `ca_file`, or the system's roots when `None`.
pub fn client_config(ca_file: Option<&Path>) -> Result<Arc<ClientConfig>, PodConfigError> {
    let roots = match ca_file {
        Some(path) => roots_from(path)?,
        None => {
            let mut roots = RootCertStore::empty();
            let native = rustls_native_certs::load_native_certs();
            for e in &native.errors {
                tracing::debug!(error = %e, "loading a system root certificate failed");
            }
            let (added, ignored) = roots.add_parsable_certificates(native.certs);
            tracing::debug!(added, ignored, "system root certificates loaded");
            roots
        }
    };
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_err(ca_file.unwrap_or(Path::new("")), e))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// A server configuration serving `cert_file`/`key_file`. With `client_ca_file`, client
/// certificates signed by those CAs are verified when presented (clients without one may still
/// authenticate with a bearer token).
pub fn server_config(
    cert_file: &Path,
    key_file: &Path,
    client_ca_file: Option<&Path>,
) -> Result<Arc<ServerConfig>, PodConfigError> {
    let certs = load_certs(cert_file)?;
    let key = load_key(key_file)?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_err(cert_file, e))?;
    let builder = match client_ca_file {
        Some(ca) => {
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots_from(ca)?),
                provider(),
            )
            .allow_unauthenticated()
            .build()
            .map_err(|e| tls_err(ca, e))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let config = builder
        .with_single_cert(certs, key)
        .map_err(|e| tls_err(key_file, e))?;
    Ok(Arc::new(config))
}
