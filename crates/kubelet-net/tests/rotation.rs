//! A server and a client built from `kubelet_net::tls` over real TLS connections: the server
//! verifies the client's certificate against a CA and reports who connected; after the
//! client's certificate files are replaced (a rotation), the next connection presents the new
//! certificate, and the server's own rotated certificate is served, without rebuilding either
//! configuration.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kubelet_net::tls::{RELOAD_CHECK, ReloadingIdentity, client_config, server_config};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

struct Ca {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

impl Ca {
    fn new() -> Self {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name.push(rcgen::DnType::CommonName, "ca");
        Self {
            cert: p.self_signed(&key).unwrap(),
            key,
        }
    }

    /// Write a pair for `cn` (valid for `localhost`) to `cert`/`key`.
    fn issue(&self, cn: &str, cert: &Path, key: &Path) {
        let k = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let c = p.signed_by(&k, &self.cert, &self.key).unwrap();
        // Key first, then the certificate: the order a rotation that writes in place uses.
        std::fs::write(key, k.serialize_pem()).unwrap();
        std::fs::write(cert, c.pem()).unwrap();
    }
}

/// Does `der` carry `name` (the test's CNs are unique strings)?
fn names(der: &[u8], name: &str) -> bool {
    der.windows(name.len()).any(|w| w == name.as_bytes())
}

/// One connection: returns (the server certificate the client saw, the client certificate the
/// server saw).
async fn connect(
    port: u16,
    client: Arc<rustls::ClientConfig>,
    seen_by_server: tokio::sync::oneshot::Receiver<Vec<u8>>,
) -> (Vec<u8>, Vec<u8>) {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(client)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    tls.write_all(b"hello").await.unwrap();
    let mut buf = [0u8; 2];
    tls.read_exact(&mut buf).await.unwrap();
    let server_cert = tls.get_ref().1.peer_certificates().unwrap()[0]
        .as_ref()
        .to_vec();
    (server_cert, seen_by_server.await.unwrap())
}

#[tokio::test]
async fn rotated_server_and_client_certificates_are_used_by_the_next_connection() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = Ca::new();
    std::fs::write(d.join("ca.crt"), ca.cert.pem()).unwrap();
    ca.issue("server-one", &d.join("server.crt"), &d.join("server.key"));
    ca.issue("client-one", &d.join("client.crt"), &d.join("client.key"));

    let server_id = ReloadingIdentity::load(&d.join("server.crt"), &d.join("server.key")).unwrap();
    let client_id = ReloadingIdentity::load(&d.join("client.crt"), &d.join("client.key")).unwrap();
    let server = server_config(server_id, Some(&d.join("ca.crt"))).unwrap();
    let client = client_config(Some(&d.join("ca.crt")), Some(client_id)).unwrap();

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let acceptor = tokio_rustls::TlsAcceptor::from(server);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<tokio::sync::oneshot::Sender<Vec<u8>>>(4);
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut tls = acceptor.accept(tcp).await.unwrap();
            let mut buf = [0u8; 5];
            tls.read_exact(&mut buf).await.unwrap();
            let peer = tls.get_ref().1.peer_certificates().unwrap()[0]
                .as_ref()
                .to_vec();
            tls.write_all(b"ok").await.unwrap();
            let reply = rx.recv().await.unwrap();
            let _ = reply.send(peer);
        }
    });

    let (s, c) = {
        let (reply, seen) = tokio::sync::oneshot::channel();
        tx.send(reply).await.unwrap();
        connect(port, client.clone(), seen).await
    };
    assert!(names(&s, "server-one") && names(&c, "client-one"));

    ca.issue("server-two", &d.join("server.crt"), &d.join("server.key"));
    ca.issue("client-two", &d.join("client.crt"), &d.join("client.key"));
    tokio::time::sleep(RELOAD_CHECK + Duration::from_millis(100)).await;

    let (s, c) = {
        let (reply, seen) = tokio::sync::oneshot::channel();
        tx.send(reply).await.unwrap();
        connect(port, client.clone(), seen).await
    };
    assert!(
        names(&s, "server-two"),
        "the rotated server certificate is served"
    );
    assert!(
        names(&c, "client-two"),
        "the rotated client certificate is presented"
    );
}
