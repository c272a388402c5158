//! TLS for the kubelet API port: the serving certificate (configured files, else a self-signed
//! pair generated into the certificate directory and reused), reloaded when its files change,
//! `tlsMinVersion`, `tlsCipherSuites` with the kubelet's names, and client certificates checked
//! against `clientCAFile` (requested, not required: token and anonymous requests still work).
//!
//! Differences from the kubelet, all from rustls: TLS 1.0 and 1.1 do not exist (a
//! `tlsMinVersion` of `VersionTLS10`/`VersionTLS11` serves TLS 1.2 and later), only AEAD cipher
//! suites with forward secrecy exist (naming another suite is an error), and the generated key
//! is ECDSA P-256 where the kubelet generates RSA 2048.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use kubelet_net::tls::ReloadingIdentity;
use rustls::SupportedCipherSuite;
use rustls::crypto::CryptoProvider;
use rustls::crypto::ring::cipher_suite as suites;

use crate::ServerError;

pub use crate::TlsSettings;

/// The cipher suites by the names the kubelet accepts (Go's `tls.CipherSuiteName`s).
fn suite_by_name(name: &str) -> Option<SupportedCipherSuite> {
    Some(match name {
        "TLS_AES_128_GCM_SHA256" => suites::TLS13_AES_128_GCM_SHA256,
        "TLS_AES_256_GCM_SHA384" => suites::TLS13_AES_256_GCM_SHA384,
        "TLS_CHACHA20_POLY1305_SHA256" => suites::TLS13_CHACHA20_POLY1305_SHA256,
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256" => {
            suites::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
        }
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384" => {
            suites::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384
        }
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305"
        | "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256" => {
            suites::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
        }
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256" => suites::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384" => suites::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305" | "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256" => {
            suites::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256
        }
        _ => return None,
    })
}

fn tls_err(message: impl Into<String>) -> ServerError {
    ServerError::Tls(message.into())
}

/// The crypto provider with the configured cipher suites. As in Go, the TLS 1.3 suites are
/// always enabled when TLS 1.3 is; the list chooses among the TLS 1.2 suites.
fn provider(settings: &TlsSettings) -> Result<CryptoProvider, ServerError> {
    let mut provider = rustls::crypto::ring::default_provider();
    if !settings.cipher_suites.is_empty() {
        let mut chosen: Vec<SupportedCipherSuite> = provider
            .cipher_suites
            .iter()
            .filter(|s| s.tls13().is_some())
            .copied()
            .collect();
        for name in &settings.cipher_suites {
            let suite = suite_by_name(name.trim()).ok_or_else(|| {
                tls_err(format!(
                    "tlsCipherSuites: {name:?} is not supported (only ECDHE AEAD suites and the TLS 1.3 suites are)"
                ))
            })?;
            if !chosen.contains(&suite) {
                chosen.push(suite);
            }
        }
        provider.cipher_suites = chosen;
    }
    Ok(provider)
}

fn versions(min: &str) -> Result<Vec<&'static rustls::SupportedProtocolVersion>, ServerError> {
    match min {
        "" | "VersionTLS10" | "VersionTLS11" | "VersionTLS12" => {
            Ok(vec![&rustls::version::TLS13, &rustls::version::TLS12])
        }
        "VersionTLS13" => Ok(vec![&rustls::version::TLS13]),
        other => Err(tls_err(format!(
            "tlsMinVersion: unknown version {other:?} (VersionTLS12 or VersionTLS13)"
        ))),
    }
}

/// Build the server's TLS configuration: errors name the file or setting at fault.
pub(crate) fn server_config(
    settings: &TlsSettings,
) -> Result<Arc<rustls::ServerConfig>, ServerError> {
    let provider = Arc::new(provider(settings)?);
    let (cert, key) = serving_pair(settings)?;
    let identity = ReloadingIdentity::load_with(&cert, &key, provider.clone())
        .map_err(|e| tls_err(format!("tlsCertFile/tlsPrivateKeyFile: {e}")))?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions(&settings.min_version)?)
        .map_err(|e| tls_err(format!("tlsCipherSuites/tlsMinVersion: {e}")))?;
    let builder = if settings.client_ca_file.as_os_str().is_empty() {
        builder.with_no_client_auth()
    } else {
        builder.with_client_cert_verifier(
            kubelet_net::tls::client_verifier(&settings.client_ca_file, provider)
                .map_err(|e| tls_err(format!("clientCAFile: {e}")))?,
        )
    };
    let mut config = builder.with_cert_resolver(identity);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The certificate and key files to serve: the configured pair, else the self-signed pair in
/// the certificate directory, generated when missing or unreadable.
fn serving_pair(settings: &TlsSettings) -> Result<(PathBuf, PathBuf), ServerError> {
    let cert_set = !settings.cert_file.as_os_str().is_empty();
    let key_set = !settings.key_file.as_os_str().is_empty();
    match (cert_set, key_set) {
        (true, true) => return Ok((settings.cert_file.clone(), settings.key_file.clone())),
        (true, false) | (false, true) => {
            return Err(tls_err(
                "tlsCertFile and tlsPrivateKeyFile must be set together",
            ));
        }
        (false, false) => {}
    }
    let cert = settings.cert_dir.join("kubelet.crt");
    let key = settings.cert_dir.join("kubelet.key");
    if ReloadingIdentity::load(&cert, &key).is_ok() {
        return Ok((cert, key));
    }
    let (cert_pem, key_pem) = self_signed(&settings.hostname, &settings.addresses)?;
    std::fs::create_dir_all(&settings.cert_dir).map_err(|e| {
        tls_err(format!(
            "creating the certificate directory {}: {e}",
            settings.cert_dir.display()
        ))
    })?;
    write_file(&cert, cert_pem.as_bytes(), 0o644)?;
    write_file(&key, key_pem.as_bytes(), 0o600)?;
    tracing::info!(cert = %cert.display(), key = %key.display(), host = %settings.hostname, "generated a self-signed serving certificate");
    Ok((cert, key))
}

fn write_file(path: &Path, data: &[u8], mode: u32) -> Result<(), ServerError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| tls_err(format!("writing {}: {e}", path.display())))
}

/// A throw-away CA and a serving certificate it signs, as the kubelet's
/// `GenerateSelfSignedCertKey`: CA `<host>-ca@<unix seconds>`, leaf `<host>@<unix seconds>`,
/// valid from an hour ago for a year; SANs: the host (DNS or IP) and `addresses`. Returns the
/// certificate file (leaf then CA) and the key, PEM.
pub fn self_signed(host: &str, addresses: &[IpAddr]) -> Result<(String, String), ServerError> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
        KeyUsagePurpose, SanType,
    };
    let gen_err = |e: rcgen::Error| tls_err(format!("generating a self-signed certificate: {e}"));
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let not_before = time::OffsetDateTime::now_utc() - time::Duration::hours(1);
    let not_after = not_before + time::Duration::days(365);

    let ca_key = KeyPair::generate().map_err(gen_err)?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(gen_err)?;
    ca.distinguished_name
        .push(DnType::CommonName, format!("{host}-ca@{now}"));
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    ca.not_before = not_before;
    ca.not_after = not_after;
    let ca_cert = ca.self_signed(&ca_key).map_err(gen_err)?;

    let key = KeyPair::generate().map_err(gen_err)?;
    let mut leaf = CertificateParams::new(vec![host.to_string()]).map_err(gen_err)?;
    for ip in addresses {
        if !leaf
            .subject_alt_names
            .iter()
            .any(|s| matches!(s, SanType::IpAddress(a) if a == ip))
        {
            leaf.subject_alt_names.push(SanType::IpAddress(*ip));
        }
    }
    leaf.distinguished_name
        .push(DnType::CommonName, format!("{host}@{now}"));
    leaf.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.not_before = not_before;
    leaf.not_after = not_after;
    let leaf_cert = leaf.signed_by(&key, &ca_cert, &ca_key).map_err(gen_err)?;
    Ok((
        format!(
            "{}{}",
            pem_block("CERTIFICATE", leaf_cert.der()),
            pem_block("CERTIFICATE", ca_cert.der())
        ),
        pem_block("PRIVATE KEY", &key.serialize_der()),
    ))
}

/// `der` as one PEM block (RFC 7468: base64 in lines of 64 characters) labelled `label`.
fn pem_block(label: &str, der: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// The user of a verified client certificate: CN as the name, O values as groups.
pub(crate) fn certificate_user(der: &[u8]) -> Option<crate::auth::UserInfo> {
    let attributes = subject_attributes(der)?;
    let name = attributes
        .iter()
        .find(|(oid, _)| *oid == OID_COMMON_NAME)?
        .1
        .clone();
    let groups = attributes
        .iter()
        .filter(|(oid, _)| *oid == OID_ORGANIZATION)
        .map(|(_, v)| v.clone())
        .collect();
    Some(crate::auth::UserInfo::new(name, groups))
}

/// `2.5.4.3` and `2.5.4.10`, DER-encoded.
const OID_COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];
const OID_ORGANIZATION: &[u8] = &[0x55, 0x04, 0x0a];

/// One DER element of `input`: its tag, its content and what follows it.
fn der_element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// The subject's attributes (OID, text) of a certificate the TLS layer has already verified:
/// `Certificate → TBSCertificate → subject`, each `RDN` a `SET` of `(OID, string)`. Text values
/// are UTF8String, PrintableString or IA5String; attributes of other string types are left out.
fn subject_attributes(cert: &[u8]) -> Option<Vec<(&[u8], String)>> {
    const SEQUENCE: u8 = 0x30;
    const SET: u8 = 0x31;
    const OID: u8 = 0x06;
    const VERSION: u8 = 0xa0;
    let (SEQUENCE, cert, _) = der_element(cert)? else {
        return None;
    };
    let (SEQUENCE, mut tbs, _) = der_element(cert)? else {
        return None;
    };
    if let (VERSION, _, rest) = der_element(tbs)? {
        tbs = rest;
    }
    // serialNumber, signature, issuer, validity, then the subject.
    for _ in 0..4 {
        tbs = der_element(tbs)?.2;
    }
    let (SEQUENCE, mut name, _) = der_element(tbs)? else {
        return None;
    };
    let mut out = Vec::new();
    while !name.is_empty() {
        let (SET, mut rdn, rest) = der_element(name)? else {
            return None;
        };
        name = rest;
        while !rdn.is_empty() {
            let (SEQUENCE, attribute, rest) = der_element(rdn)? else {
                return None;
            };
            rdn = rest;
            let (OID, oid, value) = der_element(attribute)? else {
                return None;
            };
            let (tag, text, _) = der_element(value)?;
            if matches!(tag, 0x0c | 0x13 | 0x16) {
                out.push((oid, std::str::from_utf8(text).ok()?.to_string()));
            }
        }
    }
    Some(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_user_of_a_client_certificate_is_its_cn_and_its_organizations() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:nodes");
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "system:node:n1");
        p.distinguished_name.push(rcgen::DnType::CountryName, "DE");
        let cert = p.self_signed(&key).unwrap();
        let user = certificate_user(cert.der()).unwrap();
        assert_eq!(user.name, "system:node:n1");
        assert_eq!(user.groups, ["system:nodes".to_string()]);
        // No CN is no user.
        let mut p = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name
            .push(rcgen::DnType::OrganizationName, "a");
        let cert = p.self_signed(&key).unwrap();
        assert!(certificate_user(cert.der()).is_none());
        // Garbage and truncated input are no user, never a panic.
        assert!(certificate_user(b"").is_none());
        assert!(certificate_user(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]).is_none());
        let der = cert.der().to_vec();
        for cut in 0..der.len() {
            let _ = certificate_user(&der[..cut]);
        }
    }

    #[test]
    fn pem_blocks_are_what_a_pem_encoder_writes() {
        let key = rcgen::KeyPair::generate().unwrap();
        let p = rcgen::CertificateParams::new(vec!["node-a".into()]).unwrap();
        let cert = p.self_signed(&key).unwrap();
        assert_eq!(pem_block("CERTIFICATE", cert.der()), cert.pem());
        assert_eq!(
            pem_block("PRIVATE KEY", &key.serialize_der()),
            key.serialize_pem()
        );
        // A generated pair loads as a certificate chain and a key.
        let (chain, key) = self_signed("node-a", &[]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("c.pem"), chain).unwrap();
        std::fs::write(dir.path().join("k.pem"), key).unwrap();
        let certs = kubelet_net::tls::load_certs(&dir.path().join("c.pem")).unwrap();
        assert_eq!(certs.len(), 2);
        kubelet_net::tls::load_key(&dir.path().join("k.pem")).unwrap();
    }

    #[test]
    fn self_signed_pairs_are_generated_once_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let settings = TlsSettings {
            cert_dir: dir.path().join("pki"),
            hostname: "node-a".into(),
            addresses: vec!["10.1.2.3".parse().unwrap()],
            ..Default::default()
        };
        let (cert, key) = serving_pair(&settings).unwrap();
        assert_eq!(cert, dir.path().join("pki/kubelet.crt"));
        let first = std::fs::read(&cert).unwrap();
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&key).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        // Leaf then CA; SANs hold the host and the address.
        let chain = kubelet_net::tls::load_certs(&cert).unwrap();
        assert_eq!(chain.len(), 2);
        let (_, leaf) = x509_parser::parse_x509_certificate(&chain[0]).unwrap();
        let cn = leaf.subject().iter_common_name().next().unwrap();
        assert!(cn.as_str().unwrap().starts_with("node-a@"));
        let san = format!(
            "{:?}",
            leaf.subject_alternative_name().unwrap().unwrap().value
        );
        assert!(
            san.contains("\"node-a\"") && san.contains("[10, 1, 2, 3]"),
            "{san}"
        );
        // A restart reuses the pair.
        serving_pair(&settings).unwrap();
        assert_eq!(std::fs::read(&cert).unwrap(), first);
        // A broken pair is replaced.
        std::fs::write(&key, "garbage").unwrap();
        serving_pair(&settings).unwrap();
        assert_ne!(std::fs::read(&cert).unwrap(), first);
        server_config(&settings).unwrap();
    }

    #[test]
    fn bad_settings_are_errors_that_name_them() {
        let dir = tempfile::tempdir().unwrap();
        let base = TlsSettings {
            cert_dir: dir.path().to_path_buf(),
            hostname: "n".into(),
            ..Default::default()
        };
        let err = |s: TlsSettings| server_config(&s).unwrap_err().to_string();
        assert!(
            err(TlsSettings {
                min_version: "VersionTLS99".into(),
                ..base.clone()
            })
            .contains("tlsMinVersion")
        );
        assert!(
            err(TlsSettings {
                cipher_suites: vec!["TLS_RSA_WITH_RC4_128_SHA".into()],
                ..base.clone()
            })
            .contains("TLS_RSA_WITH_RC4_128_SHA")
        );
        assert!(
            err(TlsSettings {
                cert_file: dir.path().join("missing.crt"),
                ..base.clone()
            })
            .contains("together")
        );
        assert!(
            err(TlsSettings {
                cert_file: dir.path().join("missing.crt"),
                key_file: dir.path().join("missing.key"),
                ..base.clone()
            })
            .contains("missing.crt")
        );
        assert!(
            err(TlsSettings {
                client_ca_file: dir.path().join("ca.pem"),
                ..base.clone()
            })
            .contains("clientCAFile")
        );
        // The kubelet's names of the supported suites are accepted.
        server_config(&TlsSettings {
            cipher_suites: vec![
                "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".into(),
                "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305".into(),
            ],
            min_version: "VersionTLS13".into(),
            ..base
        })
        .unwrap();
    }
}
