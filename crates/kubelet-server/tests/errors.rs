//! Error messages name each cause once, and a taken port the configuration fields that set it.

use kubelet_server::{KubeletServer, ServerConfig};

#[tokio::test]
async fn a_taken_port_names_its_cause_once() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    let port = taken.local_addr().expect("local address").port();
    let config = ServerConfig::default()
        .port(0)
        .read_only_port(0)
        .healthz_port(port);
    let Err(e) = KubeletServer::bind(config).await else {
        panic!("port {port} is taken, yet binding it succeeded");
    };
    // The message names the configuration fields to change.
    let head = format!(
        "binding 127.0.0.1:{port} (set by `healthzPort, healthzBindAddress`; 0 turns the port off)"
    );
    assert_eq!(e.to_string(), head);
    let text = kubelet_api::chain(&e).to_string();
    assert!(text.starts_with(&format!("{head}: ")), "{text}");
    assert_eq!(text.matches("in use").count(), 1, "{text}");
}
