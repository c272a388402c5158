use std::sync::Arc;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

fn target() -> Target {
    Target {
        scheme: Scheme::Http,
        host: "10.0.0.1".into(),
        port: 8080,
        path: "/a/b?x=1".into(),
        authority: "10.0.0.1:8080".into(),
    }
}

#[test]
fn redirect_locations_resolve_like_a_browser() {
    let t = target();
    let r = resolve_redirect(&t, "/c", None).unwrap();
    assert_eq!(
        (r.host.as_str(), r.port, r.path.as_str()),
        ("10.0.0.1", 8080, "/c")
    );
    let r = resolve_redirect(&t, "c", None).unwrap();
    assert_eq!(r.path, "/a/c");
    let r = resolve_redirect(&t, "http://example.com/x", None).unwrap();
    assert_eq!(
        (r.host.as_str(), r.port, r.path.as_str()),
        ("example.com", 80, "/x")
    );
    let r = resolve_redirect(&t, "https://[::1]:8443", None).unwrap();
    assert_eq!(
        (r.host.as_str(), r.port, r.path.as_str()),
        ("::1", 8443, "/")
    );
    assert_eq!(r.scheme, Scheme::Https);
    let r = resolve_redirect(&t, "//other:81/y", None).unwrap();
    assert_eq!((r.host.as_str(), r.port), ("other", 81));
    assert!(resolve_redirect(&t, "ftp://x/", None).is_none());
}

#[test]
fn a_custom_host_header_survives_only_relative_redirects() {
    let t = target();
    let r = resolve_redirect(&t, "/c", Some("svc.local")).unwrap();
    assert_eq!(r.authority, "svc.local");
    let r = resolve_redirect(&t, "http://10.0.0.1:8080/c", Some("svc.local")).unwrap();
    assert_eq!(r.authority, "10.0.0.1:8080");
}

fn values(h: &[(String, String)], n: &str) -> Vec<String> {
    h.iter()
        .filter(|(k, _)| k == n)
        .map(|(_, v)| v.clone())
        .collect()
}

#[test]
fn default_headers_are_user_agent_and_accept_unless_overridden() {
    let spec = HttpGetSpec::new(Scheme::Http, 80, "/");
    let (h, host) = request_headers("kube-probe/1.33", &spec);
    assert_eq!(values(&h, "User-Agent"), ["kube-probe/1.33"]);
    assert_eq!(values(&h, "Accept"), ["*/*"]);
    assert_eq!(host, None);
    let spec = HttpGetSpec::new(Scheme::Http, 80, "/")
        .header("accept", "")
        .header("user-agent", "mine")
        .header("Host", "svc.local")
        .header("host", "second.local")
        .header("x-multi", "1")
        .header("X-Multi", "2")
        .header("Content-Length", "5")
        .header("bad name", "x")
        .header("X-Split", "a\r\nInjected: 1");
    let (h, host) = request_headers("kube-probe/1.33", &spec);
    assert!(
        values(&h, "Accept").is_empty(),
        "an empty Accept removes it"
    );
    assert_eq!(values(&h, "User-Agent"), ["mine"]);
    assert_eq!(host.as_deref(), Some("svc.local"), "the first Host wins");
    assert_eq!(
        values(&h, "X-Multi"),
        ["1", "2"],
        "names canonicalized, values kept"
    );
    assert!(values(&h, "Content-Length").is_empty());
    assert_eq!(h.len(), 3, "{h:?}");
    let spec = HttpGetSpec::new(Scheme::Http, 80, "/").header("User-Agent", "");
    let (h, _) = request_headers("kube-probe/1.33", &spec);
    assert!(
        values(&h, "User-Agent").is_empty(),
        "an empty User-Agent removes it"
    );
}

#[test]
fn actions_become_specs_with_named_ports_schemes_and_paths() {
    use k8s_openapi::api::core::v1::{ContainerPort, HTTPHeader};
    let container = Container {
        name: "app".into(),
        ports: Some(vec![ContainerPort {
            name: Some("web".into()),
            container_port: 8080,
            ..Default::default()
        }]),
        ..Default::default()
    };
    let action = HTTPGetAction {
        port: IntOrString::String("web".into()),
        path: Some("healthz".into()),
        scheme: Some("HTTPS".into()),
        host: Some(String::new()),
        http_headers: Some(vec![HTTPHeader {
            name: "X-A".into(),
            value: "1".into(),
        }]),
    };
    let spec = HttpGetSpec::from_action(&action, &container).unwrap();
    assert_eq!(spec.scheme, Scheme::Https);
    assert_eq!((spec.port, spec.path.as_str()), (8080, "/healthz"));
    assert_eq!(spec.host, None, "an empty host means the pod IP");
    assert_eq!(spec.headers, [("X-A".to_string(), "1".to_string())]);
    assert_eq!(spec.url("fd00::1"), "https://[fd00::1]:8080/healthz");

    let numeric = HTTPGetAction {
        port: IntOrString::String("9090".into()),
        ..Default::default()
    };
    assert_eq!(
        HttpGetSpec::from_action(&numeric, &container).unwrap().port,
        9090
    );
    for bad in [
        HTTPGetAction {
            port: IntOrString::String("nope".into()),
            ..Default::default()
        },
        HTTPGetAction {
            port: IntOrString::Int(70000),
            ..Default::default()
        },
    ] {
        assert!(matches!(
            HttpGetSpec::from_action(&bad, &container),
            Err(SpecError::InvalidPort { .. })
        ));
    }
    let ftp = HTTPGetAction {
        port: IntOrString::Int(80),
        scheme: Some("FTP".into()),
        ..Default::default()
    };
    assert_eq!(
        HttpGetSpec::from_action(&ftp, &container),
        Err(SpecError::UnsupportedScheme("ftp".into()))
    );
}

/// A loopback server answering each connection with the next of `answers` (the last one
/// repeats) and recording the request heads it read.
async fn server(bind: &str, answers: Vec<String>) -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind((bind, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        let mut n = 0usize;
        while let Ok((mut s, _)) = listener.accept().await {
            let answer = answers[n.min(answers.len() - 1)].clone();
            n += 1;
            let log = log.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut b = [0u8; 1024];
                // A TLS client hello (record type 0x16) gets the answer at once.
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.first() != Some(&0x16) {
                    match s.read(&mut b).await {
                        Ok(0) | Err(_) => break,
                        Ok(k) => head.extend_from_slice(&b[..k]),
                    }
                }
                log.lock().push(String::from_utf8_lossy(&head).into_owned());
                let _ = s.write_all(answer.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    (port, seen)
}

#[tokio::test]
async fn ipv6_literals_are_dialled_and_bracketed_in_the_host_header() {
    let (port, seen) = server(
        "::1",
        vec!["HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".into()],
    )
    .await;
    let client = HttpClient::insecure("kube-lifecycle/1.33");
    let resp = client
        .get(&HttpGetSpec::new(Scheme::Http, port, "/x"), "::1")
        .await
        .unwrap();
    assert_eq!((resp.status, resp.body.as_slice()), (200, &b"ok"[..]));
    let head = seen.lock()[0].clone();
    assert!(
        head.starts_with(&format!(
            "GET /x HTTP/1.1\r\nHost: [::1]:{port}\r\nUser-Agent: kube-lifecycle/1.33\r\n"
        )),
        "{head}"
    );
}

#[tokio::test]
async fn same_host_redirects_are_followed_and_other_hosts_returned() {
    let (port, seen) = server(
        "127.0.0.1",
        vec![
            "HTTP/1.1 302 Found\r\nLocation: /second\r\nContent-Length: 0\r\n\r\n".into(),
            "HTTP/1.1 301 Moved\r\nLocation: http://other.invalid/x\r\nContent-Length: 4\r\n\r\nmove"
                .into(),
        ],
    )
    .await;
    let client = HttpClient::insecure("ua");
    let resp = client
        .get(&HttpGetSpec::new(Scheme::Http, port, "/first"), "127.0.0.1")
        .await
        .unwrap();
    assert_eq!(resp.status, 301, "the other host's redirect is returned");
    assert_eq!(resp.body, b"move");
    let heads = seen.lock().clone();
    assert_eq!(heads.len(), 2);
    assert!(heads[1].starts_with("GET /second "), "{}", heads[1]);

    let (port, _) = server(
        "127.0.0.1",
        vec!["HTTP/1.1 302 Found\r\nLocation: /again\r\nContent-Length: 0\r\n\r\n".into()],
    )
    .await;
    let err = client
        .get(&HttpGetSpec::new(Scheme::Http, port, "/"), "127.0.0.1")
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("stopped after 10 redirects"),
        "{err}"
    );
}

#[tokio::test]
async fn bodies_past_the_limit_are_cut_and_flagged() {
    let body = "x".repeat(5000);
    let (port, _) = server(
        "127.0.0.1",
        vec![format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )],
    )
    .await;
    let spec = HttpGetSpec::new(Scheme::Http, port, "/");
    let small = HttpClient::insecure("ua").max_body(100);
    let resp = small.get(&spec, "127.0.0.1").await.unwrap();
    assert_eq!((resp.body.len(), resp.truncated), (100, true));
    let big = HttpClient::insecure("ua").max_body(5000);
    let resp = big.get(&spec, "127.0.0.1").await.unwrap();
    assert_eq!((resp.body.len(), resp.truncated), (5000, false));
}

#[tokio::test]
async fn an_https_request_answered_in_plain_http_is_told_apart() {
    let (port, _) = server(
        "127.0.0.1",
        vec!["HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n".into()],
    )
    .await;
    let err = HttpClient::insecure("ua")
        .get(&HttpGetSpec::new(Scheme::Https, port, "/"), "127.0.0.1")
        .await
        .unwrap_err();
    assert_eq!(
        err,
        HttpError::HttpResponseToHttps {
            url: format!("https://127.0.0.1:{port}/")
        }
    );
    // A closed port is a plain transport error naming the URL.
    let err = HttpClient::insecure("ua")
        .get(&HttpGetSpec::new(Scheme::Https, 1, "/"), "127.0.0.1")
        .await
        .unwrap_err();
    assert!(matches!(err, HttpError::Transport { .. }), "{err:?}");
    assert!(
        err.to_string()
            .starts_with("Get \"https://127.0.0.1:1/\": dial tcp"),
        "{err}"
    );
}
