//! The node's certificates: the client certificate's TLS bootstrap and rotation
//! (`rotateCertificates`) and the kubelet API's serving certificate from the cluster
//! (`serverTLSBootstrap`, [`serving`]), as the kubelet's certificate managers do them.
//!
//! [`connect`] returns the API client of a node and, with rotation on, the
//! [`CertificateManager`] whose [`run`](CertificateManager::run) keeps the certificate
//! fresh:
//!
//! - **Bootstrap.** When `--kubeconfig` holds no valid client certificate (missing, unreadable,
//!   expired, or naming another node) and a bootstrap kubeconfig is given, the agent makes an
//!   ECDSA P-256 key, sends a `CertificateSigningRequest` (signer
//!   `kubernetes.io/kube-apiserver-client-kubelet`, subject `CN=system:node:<name>`,
//!   `O=system:nodes`, usages `digital signature`, `key encipherment`, `client auth`: the set
//!   every approver since Kubernetes 1.19 accepts; approvers of 1.27+ also accept the two
//!   without `key encipherment` an ECDSA key needs) with the bootstrap credentials, waits for
//!   approval and signing, stores the pair in `<cert-dir>/kubelet-client-<timestamp>.pem` (mode
//!   0600) with the symlink `kubelet-client-current.pem` to it, and writes `--kubeconfig`
//!   pointing at the symlink. A valid certificate is reused on restart; a half-written one is
//!   ignored.
//! - **Rotation.** At a random point between 70 % and 90 % of the certificate's lifetime a new
//!   key and CSR are sent with the current certificate (approved as `selfnodeclient`); the
//!   new pair replaces the symlink, every TLS handshake from then on presents it, and every
//!   open connection is closed so that none keeps using the old one (watches are re-established
//!   by their owners; pods are not touched). Failures are retried with backoff (2 s doubling, five
//!   times, then every 32 s).
//!
//! Metrics: `kubelet_certificate_manager_client_ttl_seconds` (seconds until the certificate
//! expires) and `kubelet_certificate_manager_client_expiration_renew_errors` (failed renewals);
//! for the serving certificate `kubelet_certificate_manager_server_ttl_seconds` and
//! `kubelet_server_expiration_renew_errors`.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use kube::api::{ObjectMeta, PostParams};
use kube::client::ConfigExt;
use kube::{Api, Client};
use kubelet_net::tls::ReloadingIdentity;
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::error::ApiServerError;

/// The signer of kubelet client certificates.
pub const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// The usages requested: those the approver of every supported Kubernetes release accepts.
pub const CLIENT_USAGES: [&str; 3] = ["digital signature", "key encipherment", "client auth"];
/// The symlink to the current client pair in the certificate directory.
pub const CLIENT_CURRENT: &str = "kubelet-client-current.pem";
/// The signer of kubelet serving certificates (`serverTLSBootstrap`); never auto-approved.
pub const SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";
/// The usages requested for a serving certificate.
pub const SERVING_USAGES: [&str; 3] = ["digital signature", "key encipherment", "server auth"];
/// The symlink to the current serving pair in the certificate directory.
pub const SERVING_CURRENT: &str = "kubelet-server-current.pem";

/// What a certificate is for: the signer, usages and subject alternative names of its requests,
/// and where its pairs are stored.
#[derive(Debug, Clone)]
struct Kind {
    signer: &'static str,
    usages: [&'static str; 3],
    /// `kubelet-client` or `kubelet-server`.
    prefix: &'static str,
    dns_names: Vec<String>,
    ips: Vec<std::net::IpAddr>,
}

impl Kind {
    fn client() -> Self {
        Self {
            signer: CLIENT_SIGNER,
            usages: CLIENT_USAGES,
            prefix: "kubelet-client",
            dns_names: Vec::new(),
            ips: Vec::new(),
        }
    }

    fn serving(dns_names: Vec<String>, ips: Vec<std::net::IpAddr>) -> Self {
        Self {
            signer: SERVING_SIGNER,
            usages: SERVING_USAGES,
            prefix: "kubelet-server",
            dns_names,
            ips,
        }
    }

    fn is_serving(&self) -> bool {
        self.signer == SERVING_SIGNER
    }
}

/// How long one CSR is waited for before a new one is sent.
const CSR_WAIT: Duration = Duration::from_secs(15 * 60);
/// How often a pending CSR is looked at.
const CSR_POLL: Duration = Duration::from_secs(1);

/// Where the node's client certificate comes from and goes to.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClientCertificateConfig {
    /// `--kubeconfig`: read when valid; written after a bootstrap.
    pub kubeconfig: PathBuf,
    /// `--bootstrap-kubeconfig`: the credentials a CSR is sent with when `kubeconfig` has no
    /// valid certificate.
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// `--cert-dir`: where the pairs are stored.
    pub cert_dir: PathBuf,
    /// `rotateCertificates`: renew before expiry.
    pub rotate: bool,
}

impl ClientCertificateConfig {
    /// Certificates for `kubeconfig`, stored in `cert_dir`; no bootstrap, no rotation.
    pub fn new(kubeconfig: impl Into<PathBuf>, cert_dir: impl Into<PathBuf>) -> Self {
        Self {
            kubeconfig: kubeconfig.into(),
            bootstrap_kubeconfig: None,
            cert_dir: cert_dir.into(),
            rotate: false,
        }
    }

    /// Bootstrap with the credentials of `path` when needed.
    pub fn bootstrap_kubeconfig(mut self, path: impl Into<PathBuf>) -> Self {
        self.bootstrap_kubeconfig = Some(path.into());
        self
    }

    /// Renew the certificate before it expires.
    pub fn rotate(mut self, rotate: bool) -> Self {
        self.rotate = rotate;
        self
    }
}

/// Why a certificate could not be had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CertificateError {
    /// The kubeconfig has no valid client certificate and no bootstrap kubeconfig was given.
    #[error(
        "kubeconfig {path} has no valid client certificate ({reason}) and no bootstrap kubeconfig is given"
    )]
    NoValidCredential {
        /// The kubeconfig.
        path: PathBuf,
        /// Why its certificate is not usable.
        reason: String,
    },
    /// A file of the certificate store could not be written.
    #[error("writing {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The key or the request could not be made.
    #[error("generating a key and certificate request: {0}")]
    Generate(String),
    /// The CSR could not be created or read.
    #[error("certificate signing request")]
    Api(#[source] kube::Error),
    /// The CSR was denied (or failed) by the cluster.
    #[error("certificate signing request {name} was {condition}: {message}")]
    Refused {
        /// The CSR's name.
        name: String,
        /// `Denied` or `Failed`.
        condition: String,
        /// The condition's reason and message.
        message: String,
    },
    /// The CSR was not approved and signed in time.
    #[error("certificate signing request {name} was not approved and signed within {waited:?}")]
    Timeout {
        /// The CSR's name.
        name: String,
        /// How long it was waited for.
        waited: Duration,
    },
    /// The signed certificate is not usable (not PEM, not for this node, expired).
    #[error("the issued certificate is not usable: {0}")]
    Invalid(String),
}

/// A parsed certificate's facts.
#[derive(Debug, Clone)]
struct CertFacts {
    not_before: SystemTime,
    not_after: SystemTime,
    common_name: String,
    /// Issuer and subject are the same (a placeholder, not a certificate of the cluster).
    self_issued: bool,
}

/// The first certificate of a PEM bundle, and whether the bundle also holds a private key.
fn parse_pem_pair(pem: &[u8]) -> Result<(CertFacts, bool), String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let cert = CertificateDer::pem_slice_iter(pem)
        .next()
        .ok_or("no certificate")?
        .map_err(|e| format!("unreadable certificate: {e}"))?;
    let facts = cert_facts(&cert)?;
    let has_key = PrivateKeyDer::from_pem_slice(pem).is_ok();
    Ok((facts, has_key))
}

fn cert_facts(der: &[u8]) -> Result<CertFacts, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| format!("unparsable certificate: {e}"))?;
    let time = |t: x509_parser::time::ASN1Time| {
        let secs = t.timestamp();
        if secs >= 0 {
            SystemTime::UNIX_EPOCH + Duration::from_secs(secs.unsigned_abs())
        } else {
            SystemTime::UNIX_EPOCH
        }
    };
    let common_name = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default()
        .to_string();
    Ok(CertFacts {
        not_before: time(cert.validity().not_before),
        not_after: time(cert.validity().not_after),
        common_name,
        self_issued: cert.issuer() == cert.subject(),
    })
}

/// Whether `pem` is a usable pair for `node`: a certificate for `system:node:<node>`, not
/// expired, with its key.
fn check_pair(pem: &[u8], node: &str) -> Result<CertFacts, String> {
    let (facts, has_key) = parse_pem_pair(pem)?;
    if !has_key {
        return Err("no private key".into());
    }
    let want = format!("system:node:{node}");
    if facts.common_name != want {
        return Err(format!(
            "the certificate is for {:?}, not {want:?}",
            facts.common_name
        ));
    }
    if facts.not_after <= SystemTime::now() {
        return Err("the certificate has expired".into());
    }
    Ok(facts)
}

/// The context `current-context` names.
fn current_context(kc: &kube::config::Kubeconfig) -> Option<&kube::config::Context> {
    kc.current_context
        .as_deref()
        .and_then(|name| kc.contexts.iter().find(|c| c.name == name))
        .and_then(|c| c.context.as_ref())
}

/// The client certificate and key the kubeconfig's current user has, as PEM: from files
/// (relative to the kubeconfig) or embedded data.
fn kubeconfig_pair(path: &Path) -> Result<(Vec<u8>, Option<PathBuf>), String> {
    use base64::Engine as _;
    use secrecy::ExposeSecret as _;
    let kc =
        crate::kubeconfig::read_kubeconfig(path).map_err(|e| kubelet_api::chain(&e).to_string())?;
    let context = current_context(&kc).ok_or("no current context")?;
    let user = kc
        .auth_infos
        .iter()
        .find(|a| a.name == context.user.as_deref().unwrap_or_default())
        .and_then(|a| a.auth_info.as_ref())
        .ok_or("the current context names no user")?;
    let dir = path.parent().unwrap_or(Path::new("/"));
    let read = |p: &str| {
        let p = dir.join(p);
        std::fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))
    };
    let b64 = |s: &str| {
        base64::engine::general_purpose::STANDARD
            .decode(s.trim())
            .map_err(|e| format!("invalid base64: {e}"))
    };
    let (cert, cert_file) = match (&user.client_certificate, &user.client_certificate_data) {
        (Some(file), _) => (read(file)?, Some(dir.join(file))),
        (None, Some(data)) => (b64(data)?, None),
        (None, None) => return Err("no client certificate".into()),
    };
    let key = match (&user.client_key, &user.client_key_data) {
        (Some(file), _) if Some(dir.join(file)) == cert_file => Vec::new(),
        (Some(file), _) => read(file)?,
        (None, Some(data)) => b64(data.expose_secret())?,
        (None, None) => return Err("no client key".into()),
    };
    let mut pem = cert;
    if !key.is_empty() {
        pem.push(b'\n');
        pem.extend_from_slice(&key);
    }
    Ok((pem, cert_file))
}

/// The pair store of a certificate directory (`kubelet-client-*.pem`).
#[derive(Debug, Clone)]
struct Store {
    dir: PathBuf,
    /// `kubelet-client` or `kubelet-server`.
    prefix: &'static str,
}

impl Store {
    fn current(&self) -> PathBuf {
        self.dir.join(format!("{}-current.pem", self.prefix))
    }

    /// Write `pem` as a new dated file and point the current symlink at it (atomically).
    fn put(&self, pem: &[u8]) -> Result<PathBuf, CertificateError> {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let w = |path: &Path| {
            let path = path.to_path_buf();
            move |source| CertificateError::Write { path, source }
        };
        std::fs::create_dir_all(&self.dir).map_err(w(&self.dir))?;
        let stamp = jiff::Zoned::now().strftime("%Y-%m-%d-%H-%M-%S").to_string();
        let prefix = self.prefix;
        let mut name = format!("{prefix}-{stamp}.pem");
        let mut n = 1;
        while self.dir.join(&name).exists() {
            name = format!("{prefix}-{stamp}-{n}.pem");
            n += 1;
        }
        let file = self.dir.join(&name);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&file)
            .map_err(w(&file))?;
        f.write_all(pem).map_err(w(&file))?;
        f.sync_all().map_err(w(&file))?;
        let tmp = self.dir.join(format!(".{prefix}-current.pem.tmp"));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&name, &tmp).map_err(w(&tmp))?;
        std::fs::rename(&tmp, self.current()).map_err(w(&self.current()))?;
        Ok(file)
    }
}

/// Write the kubeconfig the kubelet writes after a bootstrap: the bootstrap kubeconfig's server
/// and CA, the user's certificate and key both the store's current symlink.
fn write_kubeconfig(path: &Path, bootstrap: &Path, current: &Path) -> Result<(), CertificateError> {
    let invalid = |e: String| CertificateError::NoValidCredential {
        path: bootstrap.to_path_buf(),
        reason: e,
    };
    let kc = crate::kubeconfig::read_kubeconfig(bootstrap)
        .map_err(|e| invalid(kubelet_api::chain(&e).to_string()))?;
    let cluster_name = current_context(&kc)
        .map(|c| c.cluster.clone())
        .ok_or_else(|| invalid("no current context".into()))?;
    let cluster = kc
        .clusters
        .iter()
        .find(|c| c.name == cluster_name)
        .and_then(|c| c.cluster.as_ref())
        .ok_or_else(|| invalid(format!("no cluster {cluster_name:?}")))?;
    let dir = bootstrap.parent().unwrap_or(Path::new("/"));
    let mut c = serde_json::json!({ "server": cluster.server.clone().unwrap_or_default() });
    if let Some(ca) = &cluster.certificate_authority {
        c["certificate-authority"] = dir.join(ca).to_string_lossy().into_owned().into();
    }
    if let Some(data) = &cluster.certificate_authority_data {
        c["certificate-authority-data"] = data.clone().into();
    }
    if cluster.insecure_skip_tls_verify == Some(true) {
        c["insecure-skip-tls-verify"] = true.into();
    }
    let current = current.to_string_lossy();
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "default-cluster", "cluster": c}],
        "users": [{"name": "default-auth", "user": {
            "client-certificate": current, "client-key": current}}],
        "contexts": [{"name": "default-context", "context": {
            "cluster": "default-cluster", "user": "default-auth", "namespace": "default"}}],
        "current-context": "default-context",
    });
    let w = |source| CertificateError::Write {
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(w)?;
    }
    let text = serde_json::to_vec_pretty(&doc).unwrap_or_default();
    crate::checkpoint::write_file_atomically(path, &text).map_err(|(_, e)| w(e))
}

fn generate_error(e: rcgen::Error) -> CertificateError {
    CertificateError::Generate(e.to_string())
}

/// A new ECDSA P-256 key, and the subject (`O=system:nodes`, `CN=system:node:<node>`) and
/// subject alternative names (`kind`'s) of a certificate for `node`.
fn key_and_params(
    node: &str,
    kind: &Kind,
) -> Result<(rcgen::KeyPair, rcgen::CertificateParams), CertificateError> {
    let key =
        rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(generate_error)?;
    let mut params = rcgen::CertificateParams::default();
    for name in &kind.dns_names {
        let name = name.clone().try_into().map_err(generate_error)?;
        params.subject_alt_names.push(rcgen::SanType::DnsName(name));
    }
    for ip in &kind.ips {
        params
            .subject_alt_names
            .push(rcgen::SanType::IpAddress(*ip));
    }
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::OrganizationName, "system:nodes");
    dn.push(rcgen::DnType::CommonName, format!("system:node:{node}"));
    params.distinguished_name = dn;
    Ok((key, params))
}

/// A new ECDSA P-256 key and a CSR for `node` (with `kind`'s names), both PEM.
fn key_and_request(node: &str, kind: &Kind) -> Result<(String, String), CertificateError> {
    let (key, params) = key_and_params(node, kind)?;
    let csr = params.serialize_request(&key).map_err(generate_error)?;
    Ok((key.serialize_pem(), csr.pem().map_err(generate_error)?))
}

/// Send a CSR for `node` with `client` and wait for its certificate; returns the pair (PEM,
/// certificate first).
async fn request_certificate(
    client: &Client,
    node: &str,
    kind: &Kind,
    wait: Duration,
) -> Result<Vec<u8>, CertificateError> {
    let (key_pem, csr_pem) = key_and_request(node, kind)?;
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta {
            generate_name: Some("csr-".into()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(csr_pem.into_bytes()),
            signer_name: kind.signer.into(),
            usages: Some(kind.usages.iter().map(|u| u.to_string()).collect()),
            ..Default::default()
        },
        status: None,
    };
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let created = api
        .create(&PostParams::default(), &csr)
        .await
        .map_err(CertificateError::Api)?;
    let name = created.metadata.name.unwrap_or_default();
    tracing::info!(csr = %name, node, signer = kind.signer, "waiting for the certificate signing request to be approved and signed");
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let csr = api.get(&name).await.map_err(CertificateError::Api)?;
        let status = csr.status.unwrap_or_default();
        for c in status.conditions.iter().flatten() {
            if (c.type_ == "Denied" || c.type_ == "Failed") && c.status == "True" {
                return Err(CertificateError::Refused {
                    name,
                    condition: c.type_.clone(),
                    message: format!(
                        "{}: {}",
                        c.reason.clone().unwrap_or_default(),
                        c.message.clone().unwrap_or_default()
                    ),
                });
            }
        }
        let approved = status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Approved" && c.status == "True");
        if let Some(cert) = status.certificate.filter(|c| approved && !c.0.is_empty()) {
            let mut pem = cert.0;
            if !pem.ends_with(b"\n") {
                pem.push(b'\n');
            }
            pem.extend_from_slice(key_pem.as_bytes());
            check_pair(&pem, node).map_err(CertificateError::Invalid)?;
            tracing::info!(csr = %name, node, signer = kind.signer, "certificate issued");
            return Ok(pem);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(CertificateError::Timeout { name, waited: wait });
        }
        tokio::time::sleep(CSR_POLL).await;
    }
}

/// The backoff of failed requests: 2 s doubling for five attempts, then every 32 s.
fn retry_delay(failures: u32) -> Duration {
    match failures {
        0 => Duration::ZERO,
        1..=5 => Duration::from_secs(2u64 << (failures - 1)),
        _ => Duration::from_secs(32),
    }
}

/// The rotation deadline: a random point between 70 % and 90 % of the lifetime.
fn rotation_deadline(facts: &CertFacts) -> SystemTime {
    let total = facts
        .not_after
        .duration_since(facts.not_before)
        .unwrap_or_default();
    let fraction = 0.7 + 0.2 * rand::random::<f64>();
    facts.not_before + total.mul_f64(fraction)
}

/// Connections that close when the certificate they were opened with is replaced.
#[derive(Clone, Default)]
struct Generations {
    current: Arc<Mutex<CancellationToken>>,
}

impl Generations {
    /// End the current generation: its connections fail their next read or write (and any
    /// pending one) and are dropped by the HTTP client.
    fn next(&self) {
        let old = std::mem::replace(&mut *self.current.lock(), CancellationToken::new());
        old.cancel();
    }

    fn token(&self) -> CancellationToken {
        self.current.lock().clone()
    }
}

/// An HTTP connector whose connections belong to the generation they were made in.
#[derive(Clone)]
struct GenerationalConnector<C> {
    inner: C,
    generations: Generations,
}

impl<C> tower::Service<http::Uri> for GenerationalConnector<C>
where
    C: tower::Service<http::Uri> + Send,
    C::Future: Send + 'static,
    C::Response: Send + 'static,
{
    type Response = GenerationalIo<C::Response>;
    type Error = C::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let ended = Box::pin(self.generations.token().cancelled_owned());
        let connecting = self.inner.call(uri);
        Box::pin(async move {
            Ok(GenerationalIo {
                io: connecting.await?,
                ended,
            })
        })
    }
}

/// A connection that fails once its generation has ended.
struct GenerationalIo<T> {
    io: T,
    ended: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl<T> GenerationalIo<T> {
    fn check(&mut self, cx: &mut Context<'_>) -> std::io::Result<()> {
        match self.ended.as_mut().poll(cx) {
            Poll::Ready(()) => Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "the client certificate was rotated: reconnecting",
            )),
            Poll::Pending => Ok(()),
        }
    }
}

use std::future::Future as _;

impl<T: hyper::rt::Read + Unpin> hyper::rt::Read for GenerationalIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        this.check(cx)?;
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<T: hyper::rt::Write + Unpin> hyper::rt::Write for GenerationalIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        this.check(cx)?;
        Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl<T: hyper_util::client::legacy::connect::Connection>
    hyper_util::client::legacy::connect::Connection for GenerationalIo<T>
{
    fn connected(&self) -> hyper_util::client::legacy::connect::Connected {
        self.io.connected()
    }
}

/// A client of the kubeconfig's server and CA that presents `identity` (read again when its
/// files change) and whose connections close when `generations` moves on.
async fn rotating_client(
    kubeconfig: &Path,
    identity: Arc<ReloadingIdentity>,
    generations: Generations,
) -> Result<Client, ApiServerError> {
    let kc = crate::kubeconfig::read_kubeconfig(kubeconfig).map_err(|source| {
        ApiServerError::ReadKubeconfig {
            path: kubeconfig.to_path_buf(),
            source,
        }
    })?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|source| ApiServerError::LoadKubeconfig {
            path: kubeconfig.to_path_buf(),
            source,
        })?;
    let mut tls = config
        .rustls_client_config()
        .map_err(ApiServerError::CreateClient)?;
    tls.client_auth_cert_resolver = identity;
    // A resumed session would present the certificate it was made with.
    tls.resumption = rustls::client::Resumption::disabled();
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    let mut connector = hyper_timeout::TimeoutConnector::new(GenerationalConnector {
        inner: https,
        generations,
    });
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    let http_client: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(connector);
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer().map_err(ApiServerError::CreateClient)?)
        .layer(
            config
                .extra_headers_layer()
                .map_err(ApiServerError::CreateClient)?,
        )
        .map_err(tower::BoxError::from)
        .service(http_client);
    Ok(Client::new(service, config.default_namespace))
}

/// The rotation manager of one of the node's certificates (see the [module docs](self)): the
/// client certificate ([`connect`]) or the kubelet API's serving certificate ([`serving`]).
pub struct CertificateManager {
    node: String,
    kind: Kind,
    store: Store,
    /// The client identity and its connections (the client certificate only).
    client_identity: Option<(Arc<ReloadingIdentity>, Generations)>,
    client: Client,
    ttl_seconds: Gauge<i64, AtomicI64>,
    renew_errors: Counter,
}

impl std::fmt::Debug for CertificateManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateManager")
            .field("node", &self.node)
            .field("signer", &self.kind.signer)
            .field("store", &self.store.dir)
            .finish_non_exhaustive()
    }
}

/// The manager of the kubelet API's serving certificate (`serverTLSBootstrap`): its pairs are
/// `<cert_dir>/kubelet-server-<timestamp>.pem` with the symlink `kubelet-server-current.pem`,
/// which the kubelet API serves ([`CertificateManager::current_path`] as both `tlsCertFile` and
/// `tlsPrivateKeyFile`; the server reads it again when it changes, established connections go
/// on). Its requests (signer `kubernetes.io/kubelet-serving`, usages `digital signature`,
/// `key encipherment`, `server auth`, the node's `dns_names` and `ips` as subject alternative
/// names) are sent with `client`; no controller approves them (an administrator does, with
/// `kubectl certificate approve`, or an approver of the cluster's). Until one is issued the
/// server presents a self-signed placeholder made here, which [`run`](CertificateManager::run)
/// replaces at once.
pub fn serving(
    node: &str,
    client: Client,
    cert_dir: &Path,
    dns_names: Vec<String>,
    ips: Vec<std::net::IpAddr>,
) -> Result<Arc<CertificateManager>, ApiServerError> {
    let kind = Kind::serving(dns_names, ips);
    let store = Store {
        dir: cert_dir.to_path_buf(),
        prefix: kind.prefix,
    };
    let usable = std::fs::read(store.current())
        .ok()
        .is_some_and(|pem| check_pair(&pem, node).is_ok());
    if !usable {
        let placeholder = self_signed_placeholder(node, &kind)
            .map_err(|e| ApiServerError::Certificate(Box::new(e)))?;
        store
            .put(&placeholder)
            .map_err(|e| ApiServerError::Certificate(Box::new(e)))?;
    }
    let manager = CertificateManager {
        node: node.to_string(),
        kind,
        store,
        client_identity: None,
        client,
        ttl_seconds: Gauge::default(),
        renew_errors: Counter::default(),
    };
    manager.update_ttl();
    Ok(Arc::new(manager))
}

/// A self-signed pair for `node` with `kind`'s names, valid for a year: served until the
/// cluster signs one.
fn self_signed_placeholder(node: &str, kind: &Kind) -> Result<Vec<u8>, CertificateError> {
    let (key, mut params) = key_and_params(node, kind)?;
    let now = jiff::Timestamp::now().as_second();
    params.not_before = time::OffsetDateTime::from_unix_timestamp(now - 60)
        .map_err(|e| CertificateError::Generate(e.to_string()))?;
    params.not_after = time::OffsetDateTime::from_unix_timestamp(now + 365 * 24 * 3600)
        .map_err(|e| CertificateError::Generate(e.to_string()))?;
    let cert = params.self_signed(&key).map_err(generate_error)?;
    Ok(format!("{}{}", cert.pem(), key.serialize_pem()).into_bytes())
}

/// The API client of node `node` per `config`: bootstrapped first when needed (waiting for the
/// certificate and retrying with backoff for as long as it takes: drop the future to give up),
/// with the rotation manager when `config.rotate`. Without bootstrap and rotation this is
/// [`client_from_kubeconfig`](crate::client_from_kubeconfig).
pub async fn connect(
    node: &str,
    config: &ClientCertificateConfig,
) -> Result<(Client, Option<Arc<CertificateManager>>), ApiServerError> {
    if !config.rotate && config.bootstrap_kubeconfig.is_none() {
        return Ok((
            crate::client_from_kubeconfig(&config.kubeconfig).await?,
            None,
        ));
    }
    let store = Store {
        dir: config.cert_dir.clone(),
        prefix: Kind::client().prefix,
    };
    let cert_err = |e| ApiServerError::Certificate(Box::new(e));
    let usable = match kubeconfig_pair(&config.kubeconfig) {
        Ok((pem, file)) => match check_pair(&pem, node) {
            Ok(_) => Ok((pem, file)),
            Err(reason) => Err(reason),
        },
        Err(reason) => Err(reason),
    };
    match usable {
        Ok((pem, file)) => {
            tracing::info!(kubeconfig = %config.kubeconfig.display(), "current kubeconfig file contents are still valid, no bootstrap necessary");
            // Rotation writes into the store: seed it with a pair kept elsewhere.
            let in_store = file
                .as_deref()
                .and_then(|f| std::fs::canonicalize(f).ok())
                .zip(std::fs::canonicalize(store.current()).ok())
                .is_some_and(|(a, b)| a == b || file.as_deref() == Some(&store.current()));
            if config.rotate && !in_store {
                store.put(&pem).map_err(cert_err)?;
            }
        }
        Err(reason) => {
            let Some(bootstrap) = &config.bootstrap_kubeconfig else {
                return Err(cert_err(CertificateError::NoValidCredential {
                    path: config.kubeconfig.clone(),
                    reason,
                }));
            };
            tracing::info!(kubeconfig = %config.kubeconfig.display(), %reason, "no usable client certificate: bootstrapping one");
            // A pair stored by an earlier run whose kubeconfig was not written.
            let stored = std::fs::read(store.current())
                .ok()
                .filter(|pem| check_pair(pem, node).is_ok());
            if stored.is_none() {
                let client = crate::client_from_kubeconfig(bootstrap).await?;
                let mut failures = 0u32;
                let pem = loop {
                    match request_certificate(&client, node, &Kind::client(), CSR_WAIT).await {
                        Ok(pem) => break pem,
                        Err(e) => {
                            failures += 1;
                            let delay = retry_delay(failures);
                            tracing::warn!(error = %kubelet_api::chain(&e), retry_in = ?delay, "failed to get a client certificate with the bootstrap credentials");
                            tokio::time::sleep(delay).await;
                        }
                    }
                };
                store.put(&pem).map_err(cert_err)?;
            }
            write_kubeconfig(&config.kubeconfig, bootstrap, &store.current()).map_err(cert_err)?;
            tracing::info!(kubeconfig = %config.kubeconfig.display(), "wrote the kubeconfig of the bootstrapped client certificate");
        }
    }
    if !config.rotate {
        return Ok((
            crate::client_from_kubeconfig(&config.kubeconfig).await?,
            None,
        ));
    }
    let current = store.current();
    let identity = ReloadingIdentity::load(&current, &current)
        .map_err(|e| cert_err(CertificateError::Invalid(e.to_string())))?;
    let generations = Generations::default();
    let client = rotating_client(&config.kubeconfig, identity.clone(), generations.clone()).await?;
    let manager = CertificateManager {
        node: node.to_string(),
        kind: Kind::client(),
        store,
        client_identity: Some((identity, generations)),
        client: client.clone(),
        ttl_seconds: Gauge::default(),
        renew_errors: Counter::default(),
    };
    manager.update_ttl();
    Ok((client, Some(Arc::new(manager))))
}

impl CertificateManager {
    /// The current certificate's facts.
    fn facts(&self) -> Option<CertFacts> {
        let pem = std::fs::read(self.store.current()).ok()?;
        parse_pem_pair(&pem).ok().map(|(f, _)| f)
    }

    fn update_ttl(&self) {
        let ttl = self
            .facts()
            .and_then(|f| f.not_after.duration_since(SystemTime::now()).ok())
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        self.ttl_seconds.set(ttl);
    }

    /// Register the metrics in `registry` (the kubelet's names: `…_client_…` or `…_server_…`).
    pub fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        let (ttl, errors, what) = if self.kind.is_serving() {
            (
                "kubelet_certificate_manager_server_ttl_seconds",
                "kubelet_server_expiration_renew_errors",
                "serving",
            )
        } else {
            (
                "kubelet_certificate_manager_client_ttl_seconds",
                "kubelet_certificate_manager_client_expiration_renew_errors",
                "client",
            )
        };
        registry.register(
            ttl,
            format!("Seconds until the kubelet's {what} certificate expires"),
            self.ttl_seconds.clone(),
        );
        registry.register(
            errors,
            format!("Failed renewals of the kubelet's {what} certificate"),
            self.renew_errors.clone(),
        );
    }

    /// The path of the current pair (`<cert-dir>/kubelet-client-current.pem` or
    /// `kubelet-server-current.pem`).
    pub fn current_path(&self) -> PathBuf {
        self.store.current()
    }

    /// Renew the certificate now: a new key and CSR; on success the new pair is current (for
    /// the client certificate: every open connection is closed).
    pub async fn rotate_now(&self) -> Result<(), CertificateError> {
        let pem = request_certificate(&self.client, &self.node, &self.kind, CSR_WAIT).await?;
        self.store.put(&pem)?;
        self.update_ttl();
        match &self.client_identity {
            Some((identity, generations)) => {
                identity.reload_now();
                generations.next();
                tracing::info!(node = %self.node, "certificate rotation detected, shutting down client connections to start using new credentials");
            }
            None => {
                tracing::info!(node = %self.node, "serving certificate rotated; new connections get it");
            }
        }
        Ok(())
    }

    /// Renew the certificate at 70–90 % of its lifetime, again and again, until `shutdown`.
    pub async fn run(&self, shutdown: CancellationToken) {
        let mut failures = 0u32;
        loop {
            self.update_ttl();
            let wait = if failures > 0 {
                retry_delay(failures)
            } else {
                match self.facts() {
                    // The placeholder of a serving certificate: ask for a real one now.
                    Some(facts) if facts.self_issued => Duration::ZERO,
                    Some(facts) => {
                        let deadline = rotation_deadline(&facts);
                        tracing::info!(
                            expiration = %jiff::Timestamp::try_from(facts.not_after).map(|t| t.to_string()).unwrap_or_default(),
                            deadline = %jiff::Timestamp::try_from(deadline).map(|t| t.to_string()).unwrap_or_default(),
                            "certificate expiration and rotation deadline"
                        );
                        deadline
                            .duration_since(SystemTime::now())
                            .unwrap_or_default()
                    }
                    None => Duration::ZERO,
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            match self.rotate_now().await {
                Ok(()) => failures = 0,
                Err(e) => {
                    failures += 1;
                    self.renew_errors.inc();
                    tracing::warn!(error = %kubelet_api::chain(&e), failures, signer = self.kind.signer, "renewing the certificate failed");
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn signed(node: &str, secs: i64) -> Vec<u8> {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::default();
        let mut dn = rcgen::DistinguishedName::new();
        dn.push(rcgen::DnType::CommonName, format!("system:node:{node}"));
        params.distinguished_name = dn;
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::minutes(5);
        params.not_after = now + time::Duration::seconds(secs);
        let cert = params.self_signed(&key).unwrap();
        format!("{}{}", cert.pem(), key.serialize_pem()).into_bytes()
    }

    #[test]
    fn pairs_are_checked_for_node_expiry_key_and_truncation() {
        let good = signed("n1", 3600);
        let facts = check_pair(&good, "n1").unwrap();
        assert_eq!(facts.common_name, "system:node:n1");
        assert!(
            check_pair(&good, "n2")
                .unwrap_err()
                .contains("system:node:n1")
        );
        let expired = signed("n1", -60);
        assert!(check_pair(&expired, "n1").unwrap_err().contains("expired"));
        let cert_only: Vec<u8> = String::from_utf8(good.clone())
            .unwrap()
            .split("-----BEGIN PRIVATE KEY")
            .next()
            .unwrap()
            .as_bytes()
            .to_vec();
        assert!(
            check_pair(&cert_only, "n1")
                .unwrap_err()
                .contains("no private key")
        );
        let truncated = &good[..good.len() / 3];
        assert!(check_pair(truncated, "n1").is_err());
        assert!(check_pair(b"", "n1").is_err());
    }

    #[test]
    fn the_rotation_deadline_is_between_70_and_90_percent() {
        let not_before = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let facts = CertFacts {
            not_before,
            not_after: not_before + Duration::from_secs(1000),
            common_name: String::new(),
            self_issued: false,
        };
        for _ in 0..200 {
            let d = rotation_deadline(&facts)
                .duration_since(not_before)
                .unwrap();
            assert!(
                d >= Duration::from_secs(700) && d <= Duration::from_secs(900),
                "{d:?}"
            );
        }
        assert_eq!(retry_delay(1), Duration::from_secs(2));
        assert_eq!(retry_delay(5), Duration::from_secs(32));
        assert_eq!(retry_delay(9), Duration::from_secs(32));
    }

    #[test]
    fn the_store_swaps_the_current_symlink_and_the_kubeconfig_points_at_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store {
            dir: dir.path().join("pki"),
            prefix: "kubelet-client",
        };
        let a = store.put(&signed("n1", 3600)).unwrap();
        let b = store.put(&signed("n1", 7200)).unwrap();
        assert_ne!(a, b);
        assert_eq!(
            std::fs::read_link(store.current()).unwrap(),
            b.file_name().map(PathBuf::from).unwrap()
        );
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(
            std::fs::metadata(&b).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let bootstrap = dir.path().join("bootstrap.conf");
        std::fs::write(
            &bootstrap,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority: ca.crt\nusers:\n- name: u\n  user:\n    token: abcdef.0123456789abcdef\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n",
        )
        .unwrap();
        let kubeconfig = dir.path().join("kubelet.conf");
        write_kubeconfig(&kubeconfig, &bootstrap, &store.current()).unwrap();
        let (pem, file) = kubeconfig_pair(&kubeconfig).unwrap();
        assert_eq!(file.as_deref(), Some(store.current().as_path()));
        check_pair(&pem, "n1").unwrap();
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&kubeconfig).unwrap()).unwrap();
        assert_eq!(
            v["clusters"][0]["cluster"]["certificate-authority"],
            dir.path().join("ca.crt").to_string_lossy().as_ref()
        );
    }

    #[test]
    fn requests_name_the_node_with_one_organisation() {
        let (key, csr) = key_and_request("edge-1", &Kind::client()).unwrap();
        assert!(key.contains("PRIVATE KEY"));
        assert!(csr.contains("CERTIFICATE REQUEST"));
    }
}
