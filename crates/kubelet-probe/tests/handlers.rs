//! Each handler against a real peer on loopback: HTTP and HTTPS servers, TCP listeners, a gRPC
//! health server.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use kubelet_net::http::{HttpGetSpec, Scheme};
use kubelet_probe::{Outcome, ProbeHandler, Prober, ProberConfig, StaticTargets};

const T: Duration = Duration::from_secs(5);

async fn http(prober: &Prober, scheme: Scheme, port: u16, path: &str) -> Outcome {
    let h = ProbeHandler::HttpGet(HttpGetSpec::new(scheme, port, path));
    prober
        .probe_once(&h, Some("127.0.0.1"), "", T, &StaticTargets::new())
        .await
}

#[tokio::test]
async fn http_status_200_to_399_is_success_and_others_fail_without_the_body() {
    let srv = common::http_server(false).await;
    let (p, _updates) = Prober::new(ProberConfig::default());
    let port = srv.addr.port();
    assert_eq!(
        http(&p, Scheme::Http, port, "/ok").await,
        Outcome::Success("fine".into())
    );
    assert!(matches!(
        http(&p, Scheme::Http, port, "/created").await,
        Outcome::Success(_)
    ));
    assert_eq!(
        http(&p, Scheme::Http, port, "/fail").await,
        Outcome::Failure("HTTP probe failed with statuscode: 503".into())
    );
    assert_eq!(
        http(&p, Scheme::Http, port, "/notfound").await,
        Outcome::Failure("HTTP probe failed with statuscode: 404".into())
    );
}

#[tokio::test]
async fn http_probes_send_the_kubelet_headers_and_custom_ones() {
    let srv = common::http_server(false).await;
    let (p, _updates) = Prober::new(ProberConfig::default());
    let port = srv.addr.port();
    assert!(matches!(
        http(&p, Scheme::Http, port, "/ok").await,
        Outcome::Success(_)
    ));
    let headers = srv.state.last_headers.lock().clone();
    let get = |n: &str| {
        headers
            .iter()
            .filter(|(k, _)| k == n)
            .map(|(_, v)| v.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(get("user-agent"), vec!["kube-probe/1.33".to_string()]);
    assert_eq!(get("accept"), vec!["*/*".to_string()]);
    assert_eq!(get("host"), vec![format!("127.0.0.1:{port}")]);
    assert!(
        get("accept-encoding").is_empty(),
        "no compression requested"
    );

    let spec = HttpGetSpec::new(Scheme::Http, port, "/ok")
        .header("Host", "svc.example")
        .header("X-Probe", "a")
        .header("X-Probe", "b")
        .header("Accept", "");
    let out = p
        .probe_once(
            &ProbeHandler::HttpGet(spec),
            Some("127.0.0.1"),
            "",
            T,
            &StaticTargets::new(),
        )
        .await;
    assert!(matches!(out, Outcome::Success(_)));
    let headers = srv.state.last_headers.lock().clone();
    let get = |n: &str| {
        headers
            .iter()
            .filter(|(k, _)| k == n)
            .map(|(_, v)| v.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(get("host"), vec!["svc.example".to_string()]);
    assert_eq!(get("x-probe"), vec!["a".to_string(), "b".to_string()]);
    assert!(get("accept").is_empty(), "an empty Accept removes it");
}

#[tokio::test]
async fn same_host_redirects_are_followed_and_other_hosts_are_a_warning() {
    let srv = common::http_server(false).await;
    let (p, _updates) = Prober::new(ProberConfig::default());
    let port = srv.addr.port();
    assert_eq!(
        http(&p, Scheme::Http, port, "/same-host").await,
        Outcome::Success("fine".into())
    );
    assert_eq!(
        http(&p, Scheme::Http, port, "/same-host-absolute").await,
        Outcome::Success("fine".into())
    );
    assert_eq!(
        http(&p, Scheme::Http, port, "/same-host-to-fail").await,
        Outcome::Failure("HTTP probe failed with statuscode: 503".into())
    );
    assert_eq!(
        http(&p, Scheme::Http, port, "/other-host").await,
        Outcome::Warning("Probe terminated redirects, Response body: moved".into())
    );
    let before = srv.state.requests.load(Ordering::SeqCst);
    match http(&p, Scheme::Http, port, "/loop").await {
        Outcome::Failure(msg) => assert!(msg.contains("stopped after 10 redirects"), "{msg}"),
        other => panic!("redirect loop: {other:?}"),
    }
    assert_eq!(srv.state.requests.load(Ordering::SeqCst) - before, 11);
}

#[tokio::test]
async fn http_bodies_are_read_up_to_10_kib() {
    let srv = common::http_server(false).await;
    let (p, _updates) = Prober::new(ProberConfig::default());
    match http(&p, Scheme::Http, srv.addr.port(), "/big").await {
        Outcome::Success(body) => assert_eq!(body.len(), 10 * 1024),
        other => panic!("big body: {other:?}"),
    }
}

#[tokio::test]
async fn https_probes_skip_certificate_verification() {
    let srv = common::http_server(true).await;
    let (p, _updates) = Prober::new(ProberConfig::default());
    let port = srv.addr.port();
    assert_eq!(
        http(&p, Scheme::Https, port, "/ok").await,
        Outcome::Success("fine".into())
    );
    assert_eq!(
        http(&p, Scheme::Https, port, "/fail").await,
        Outcome::Failure("HTTP probe failed with statuscode: 503".into())
    );
    // Plain HTTP against the TLS port is a failure, not an error.
    assert!(matches!(
        http(&p, Scheme::Http, port, "/ok").await,
        Outcome::Failure(_)
    ));
}

#[tokio::test]
async fn http_timeouts_and_refused_connections_are_failures() {
    let srv = common::http_server(false).await;
    let (p, _updates) = Prober::new(ProberConfig::default());
    let h = ProbeHandler::HttpGet(HttpGetSpec::new(Scheme::Http, srv.addr.port(), "/slow"));
    let out = p
        .probe_once(
            &h,
            Some("127.0.0.1"),
            "",
            Duration::from_millis(300),
            &StaticTargets::new(),
        )
        .await;
    match out {
        Outcome::Failure(msg) => assert!(msg.contains("context deadline exceeded"), "{msg}"),
        other => panic!("slow: {other:?}"),
    }
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    match http(&p, Scheme::Http, closed, "/").await {
        Outcome::Failure(msg) => assert!(msg.contains("refused"), "{msg}"),
        other => panic!("refused: {other:?}"),
    }
}

/// TIME-WAIT sockets whose local or remote port is `port` (IPv4 loopback).
fn time_wait_on(port: u16) -> usize {
    let text = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let hex = format!(":{port:04X}");
    text.lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[3] == "06" && (f[1].ends_with(&hex) || f[2].ends_with(&hex))
        })
        .count()
}

#[tokio::test]
async fn many_http_and_tcp_probes_leave_no_time_wait_sockets_behind() {
    if !std::path::Path::new("/proc/net/tcp").exists() {
        println!("skip: no /proc/net/tcp");
        return;
    }
    let srv = common::http_server(false).await;
    let (p, _updates) = Prober::new(ProberConfig::default());
    let port = srv.addr.port();
    let n = 200;
    for _ in 0..n {
        assert!(matches!(
            http(&p, Scheme::Http, port, "/ok").await,
            Outcome::Success(_)
        ));
        let tcp = ProbeHandler::TcpSocket { host: None, port };
        let out = p
            .probe_once(&tcp, Some("127.0.0.1"), "", T, &StaticTargets::new())
            .await;
        assert!(matches!(out, Outcome::Success(_)));
    }
    let tw = time_wait_on(port);
    assert!(
        tw < n / 4,
        "{tw} TIME-WAIT sockets after {n} HTTP and {n} TCP probes"
    );
}

#[tokio::test]
async fn tcp_probes_succeed_on_a_listening_port_and_fail_otherwise() {
    let (p, _updates) = Prober::new(ProberConfig::default());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let h = ProbeHandler::TcpSocket { host: None, port };
    assert!(matches!(
        p.probe_once(&h, Some("127.0.0.1"), "", T, &StaticTargets::new())
            .await,
        Outcome::Success(_)
    ));
    let explicit = ProbeHandler::TcpSocket {
        host: Some("localhost".into()),
        port,
    };
    assert!(matches!(
        p.probe_once(&explicit, Some("192.0.2.1"), "", T, &StaticTargets::new())
            .await,
        Outcome::Success(_)
    ));
    drop(l);
    match p
        .probe_once(&h, Some("127.0.0.1"), "", T, &StaticTargets::new())
        .await
    {
        Outcome::Failure(msg) => assert!(msg.starts_with("dial tcp 127.0.0.1:"), "{msg}"),
        other => panic!("closed port: {other:?}"),
    }
}

#[tokio::test]
async fn grpc_serving_is_success_and_other_statuses_fail() {
    let srv = common::grpc_server().await;
    let (p, _updates) = Prober::new(ProberConfig::default());
    let port = srv.addr.port();
    let probe = |service: &str| ProbeHandler::Grpc {
        port,
        service: service.to_string(),
    };
    let t = StaticTargets::new();
    assert_eq!(
        p.probe_once(&probe(""), Some("127.0.0.1"), "", T, &t).await,
        Outcome::Success("service healthy".into())
    );
    srv.reporter
        .set_service_status("db", tonic_health::ServingStatus::NotServing)
        .await;
    assert_eq!(
        p.probe_once(&probe("db"), Some("127.0.0.1"), "", T, &t)
            .await,
        Outcome::Failure("service unhealthy (responded with \"NOT_SERVING\")".into())
    );
    srv.reporter
        .set_service_status("db", tonic_health::ServingStatus::Serving)
        .await;
    assert!(matches!(
        p.probe_once(&probe("db"), Some("127.0.0.1"), "", T, &t)
            .await,
        Outcome::Success(_)
    ));
    match p
        .probe_once(&probe("nope"), Some("127.0.0.1"), "", T, &t)
        .await
    {
        Outcome::Failure(msg) => assert!(msg.contains("health rpc probe failed"), "{msg}"),
        other => panic!("unknown service: {other:?}"),
    }
}

#[tokio::test]
async fn grpc_probes_fail_against_servers_without_the_health_service_or_without_a_listener() {
    let (p, _updates) = Prober::new(ProberConfig::default());
    let t = StaticTargets::new();
    // An HTTP/1 server is not a gRPC server.
    let http = common::http_server(false).await;
    let h = ProbeHandler::Grpc {
        port: http.addr.port(),
        service: String::new(),
    };
    assert!(matches!(
        p.probe_once(&h, Some("127.0.0.1"), "", T, &t).await,
        Outcome::Failure(_)
    ));
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let h = ProbeHandler::Grpc {
        port: closed,
        service: String::new(),
    };
    match p.probe_once(&h, Some("127.0.0.1"), "", T, &t).await {
        Outcome::Failure(msg) => assert!(msg.contains("failed to connect service"), "{msg}"),
        other => panic!("no listener: {other:?}"),
    }
}

#[tokio::test]
async fn exec_without_a_runtime_is_an_error_not_a_failure() {
    let (p, _updates) = Prober::new(ProberConfig::default());
    let h = ProbeHandler::Exec {
        command: vec!["true".into()],
    };
    assert!(matches!(
        p.probe_once(&h, None, "c1", T, &StaticTargets::new()).await,
        Outcome::Error(_)
    ));
}

#[tokio::test]
async fn an_http_body_cut_short_is_a_probe_error_and_a_chunked_body_is_read() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // A raw server: the first connection gets a body shorter than its Content-Length, the
    // second a chunked body.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        for answer in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort"[..],
            &b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n3\r\n!!!\r\n0\r\n\r\n"[..],
        ] {
            let (mut s, _) = l.accept().await.unwrap();
            let mut req = Vec::new();
            let mut b = [0u8; 1024];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut b).await.unwrap();
                if n == 0 {
                    break;
                }
                req.extend_from_slice(&b[..n]);
            }
            s.write_all(answer).await.unwrap();
            s.shutdown().await.unwrap();
        }
    });
    let (p, _updates) = Prober::new(ProberConfig::default());
    assert_eq!(
        http(&p, Scheme::Http, port, "/").await,
        Outcome::BodyError("unexpected EOF".into())
    );
    assert_eq!(
        http(&p, Scheme::Http, port, "/").await,
        Outcome::Success("ok!!!".into())
    );
}
