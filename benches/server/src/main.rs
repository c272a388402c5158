//! `server-bench`: the kubelet API of `kubelet-server` measured against baselines taken in the
//! same run.
//!
//! A child process (`server-bench serve`) runs an agent on the in-memory runtime with N pods and
//! the server on 127.0.0.1 over TLS (anonymous, `AlwaysAllow`); the first pod's log is a
//! generated CRI-format file of `--log-mib` MiB. The parent measures:
//!
//! * `/containerLogs` of the whole file, in file MiB/s, against `cat file > /dev/null`;
//! * `tailLines=100` latency (p50/p99, kept-alive connection) against `/healthz` on the same
//!   connection (the per-request floor);
//! * `/pods` latency with N pods against the same floor;
//! * TCP connect + TLS handshake against TCP connect alone;
//! * the server's RSS growth per idle `follow` stream.
//!
//! Run: `cargo run --release -p server-bench -- --log-mib 1024`.

use bench_support::{ms, percentile, rss_kib};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

#[derive(Debug, Parser)]
#[command(name = "server-bench", about)]
struct Args {
    /// Size of the generated container log, MiB.
    #[arg(long, default_value_t = 1024)]
    log_mib: u64,
    /// Pods the agent runs (`/pods` size).
    #[arg(long, default_value_t = 110)]
    pods: usize,
    /// Requests per latency figure.
    #[arg(long, default_value_t = 500)]
    requests: usize,
    /// Idle follow streams for the memory figure.
    #[arg(long, default_value_t = 200)]
    followers: usize,
    /// Connections for the handshake figure.
    #[arg(long, default_value_t = 200)]
    handshakes: usize,
    /// Work directory (default: a temporary one; the log is large).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Internal: run the agent and server.
    #[arg(long, hide = true)]
    serve: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    if args.serve {
        let dir = args.dir.clone().context("--serve needs --dir")?;
        return rt.block_on(serve::run(dir, args.pods));
    }
    rt.block_on(bench(args))
}

mod serve {
    //! The measured side: an agent on the in-memory runtime with the server.

    use std::path::PathBuf;
    use std::sync::Arc;
    use std::time::Duration;

    use async_trait::async_trait;
    use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
    use kubelet_api::{ContainerRuntime, PodSource, SourceSender};
    use kubelet_core::configuration::KubeletConfiguration;
    use kubelet_core::testing::FakeRuntime;
    use kubelet_core::{KubeletBuilder, KubeletConfig};
    use kubelet_server::{KubeletServer, ServerConfig};
    use tokio_util::sync::CancellationToken;

    struct Pods(Vec<Pod>);

    #[async_trait]
    impl PodSource for Pods {
        fn name(&self) -> &str {
            "file"
        }
        async fn run(&self, out: SourceSender, shutdown: CancellationToken) {
            let _ = out.snapshot(self.0.clone()).await;
            shutdown.cancelled().await;
        }
    }

    fn pod(i: usize) -> Pod {
        let mut p = Pod {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "app".into(),
                    image: Some("busybox".into()),
                    ..Default::default()
                }],
                host_network: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        };
        p.metadata.name = Some(format!("p{i}"));
        p.metadata.namespace = Some("default".into());
        p.metadata.uid = Some(format!("uid-p{i}"));
        p
    }

    pub(crate) async fn run(dir: PathBuf, pods: usize) -> anyhow::Result<()> {
        let mut c = KubeletConfiguration::default();
        c.address = "127.0.0.1".into();
        c.authentication.anonymous.enabled = true;
        c.authentication.webhook.enabled = false;
        c.authorization.mode = "AlwaysAllow".into();
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let config = ServerConfig::from_configuration(&c)
            .port(port)
            .healthz_port(0)
            .cert_dir(dir.join("pki"))
            .hostname("localhost");
        let server = KubeletServer::bind(config).await?;
        let runtime = Arc::new(FakeRuntime::new());
        let (pleg, pleg_events) = kubelet_pleg::GenericPleg::new(
            runtime.clone() as Arc<dyn ContainerRuntime>,
            Default::default(),
        );
        let pleg = std::sync::Arc::new(pleg);
        let logs = dir.join("logs");
        let kubelet = KubeletBuilder::new("bench-node")
            .config(KubeletConfig::with_dirs(dir.join("root"), &logs))
            .runtime(runtime)
            .pleg(pleg, pleg_events)
            .pod_source(Arc::new(Pods((0..pods).map(pod).collect())))
            .plugin(Arc::new(server))
            .build()?;
        let reader = kubelet.status_reader();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(kubelet.run(shutdown.clone()));
        for _ in 0..600 {
            let running = reader
                .list()
                .iter()
                .filter(|p| {
                    p.status
                        .container_statuses
                        .iter()
                        .flatten()
                        .any(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
                })
                .count();
            if running == pods {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The first pod's log is the generated file.
        let pod_dir = std::fs::read_dir(&logs)?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.to_string_lossy().contains("_p0_"))
            .ok_or_else(|| anyhow::anyhow!("no log directory of p0"))?;
        std::fs::create_dir_all(pod_dir.join("app"))?;
        let _ = std::fs::remove_file(pod_dir.join("app/0.log"));
        std::os::unix::fs::symlink(dir.join("big.log"), pod_dir.join("app/0.log"))?;
        println!("READY {port}");
        // Run until the parent closes stdin.
        let _ = tokio::task::spawn_blocking(|| {
            use std::io::Read;
            let mut buf = [0u8; 64];
            while std::io::stdin().read(&mut buf).unwrap_or(0) > 0 {}
        })
        .await;
        shutdown.cancel();
        let _ = task.await;
        Ok(())
    }
}

fn connector() -> tokio_rustls::TlsConnector {
    match kubelet_net::http::insecure_tls_config() {
        Ok(c) => tokio_rustls::TlsConnector::from(Arc::new(c)),
        Err(e) => panic!("client TLS configuration: {e}"),
    }
}

type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

async fn connect(port: u16, tls: &tokio_rustls::TlsConnector) -> anyhow::Result<Sender> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
    tcp.set_nodelay(true)?;
    let stream = tls
        .connect(ServerName::try_from("localhost")?.to_owned(), tcp)
        .await?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// One GET on a kept-alive connection: (status, body bytes).
async fn get(sender: &mut Sender, path: &str) -> anyhow::Result<(u16, u64)> {
    sender.ready().await?;
    let req = hyper::Request::get(path)
        .header("host", "localhost")
        .body(Empty::<Bytes>::new())?;
    let resp = sender.send_request(req).await?;
    let status = resp.status().as_u16();
    let mut body = resp.into_body();
    let mut n = 0u64;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            n += data.len() as u64;
        }
    }
    Ok((status, n))
}

async fn latencies(
    sender: &mut Sender,
    path: &str,
    n: usize,
) -> anyhow::Result<(Duration, Duration, u64)> {
    let mut times = Vec::with_capacity(n);
    let mut bytes = 0;
    for _ in 0..n {
        let t = Instant::now();
        let (status, b) = get(sender, path).await?;
        times.push(t.elapsed());
        if status != 200 {
            bail!("{path}: HTTP {status}");
        }
        bytes = b;
    }
    times.sort();
    Ok((percentile(&times, 0.5), percentile(&times, 0.99), bytes))
}

fn generate_log(path: &Path, mib: u64) -> anyhow::Result<()> {
    let want = mib * 1024 * 1024;
    if std::fs::metadata(path).is_ok_and(|m| m.len() >= want) {
        return Ok(());
    }
    let mut f = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    let mut written = 0u64;
    let mut i = 0u64;
    let filler = "x".repeat(80);
    while written < want {
        let line = format!(
            "2024-01-01T00:00:{:02}.{:09}Z {} F line {i} {filler}\n",
            (i / 1_000_000) % 60,
            i % 1_000_000_000,
            if i.is_multiple_of(7) {
                "stderr"
            } else {
                "stdout"
            },
        );
        f.write_all(line.as_bytes())?;
        written += line.len() as u64;
        i += 1;
    }
    f.flush()?;
    Ok(())
}

async fn bench(args: Args) -> anyhow::Result<()> {
    let tmp;
    let dir = match &args.dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            d.clone()
        }
        None => {
            tmp = tempfile::Builder::new()
                .prefix("server-bench-")
                .tempdir_in("/var/tmp")?;
            tmp.path().to_path_buf()
        }
    };
    let log = dir.join("big.log");
    let t = Instant::now();
    generate_log(&log, args.log_mib)?;
    let file_bytes = std::fs::metadata(&log)?.len();
    eprintln!(
        "log: {} MiB ready in {:.1}s",
        file_bytes >> 20,
        t.elapsed().as_secs_f64()
    );

    let mut child = Command::new(std::env::current_exe()?)
        .args(["--serve", "--pods", &args.pods.to_string(), "--dir"])
        .arg(&dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let pid = child.id();
    let stdout = child.stdout.take().context("child stdout")?;
    let port: u16 = {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(stdout).read_line(&mut line)?;
        line.trim()
            .strip_prefix("READY ")
            .context("the server did not start")?
            .parse()?
    };
    let tls = connector();

    // Throughput: `cat` into a pipe this process drains (page cache warm) vs the server.
    let cat = || -> anyhow::Result<Duration> {
        use std::io::Read;
        let t = Instant::now();
        let mut child = Command::new("cat")
            .arg(&log)
            .stdout(Stdio::piped())
            .spawn()?;
        let mut out = child.stdout.take().context("cat stdout")?;
        let mut buf = vec![0u8; 128 * 1024];
        let mut n = 0u64;
        loop {
            let r = out.read(&mut buf)?;
            if r == 0 {
                break;
            }
            n += r as u64;
        }
        if !child.wait()?.success() || n == 0 {
            bail!("cat failed");
        }
        Ok(t.elapsed())
    };
    cat()?;
    let cat_time = cat()?.min(cat()?);
    let mut sender = connect(port, &tls).await?;
    let mut best = Duration::MAX;
    let mut sent = 0;
    for _ in 0..2 {
        let t = Instant::now();
        let (status, n) = get(&mut sender, "/containerLogs/default/p0/app").await?;
        if status != 200 {
            bail!("containerLogs: HTTP {status}");
        }
        best = best.min(t.elapsed());
        sent = n;
    }
    let mib = file_bytes as f64 / (1024.0 * 1024.0);
    let cat_rate = mib / cat_time.as_secs_f64();
    let server_rate = mib / best.as_secs_f64();
    println!(
        "containerLogs whole file: {server_rate:.0} MiB/s of file ({} MiB sent) vs cat through a pipe {cat_rate:.0} MiB/s: {:.0}%",
        sent >> 20,
        100.0 * server_rate / cat_rate
    );

    // Latencies on one kept-alive connection.
    let (h50, h99, _) = latencies(&mut sender, "/healthz", args.requests).await?;
    let (t50, t99, tbytes) = latencies(
        &mut sender,
        "/containerLogs/default/p0/app?tailLines=100",
        args.requests,
    )
    .await?;
    let (p50, p99, pbytes) = latencies(&mut sender, "/pods", args.requests).await?;
    println!(
        "floor /healthz: p50 {:.3} ms, p99 {:.3} ms",
        ms(h50),
        ms(h99)
    );
    println!(
        "tailLines=100 on {} MiB: p50 {:.3} ms, p99 {:.3} ms ({tbytes} B; p99 {:.1}x the floor)",
        file_bytes >> 20,
        ms(t50),
        ms(t99),
        t99.as_secs_f64() / h99.as_secs_f64()
    );
    println!(
        "/pods with {} pods: p50 {:.3} ms, p99 {:.3} ms ({} KiB; p99 {:.1}x the floor)",
        args.pods,
        ms(p50),
        ms(p99),
        pbytes >> 10,
        p99.as_secs_f64() / h99.as_secs_f64()
    );

    // Handshakes: TCP connect + TLS vs TCP connect alone.
    let mut tcp_only = Vec::new();
    let mut with_tls = Vec::new();
    for _ in 0..args.handshakes {
        let t = Instant::now();
        let s = TcpStream::connect(("127.0.0.1", port)).await?;
        tcp_only.push(t.elapsed());
        drop(s);
        let t = Instant::now();
        let s = TcpStream::connect(("127.0.0.1", port)).await?;
        let stream = tls
            .connect(ServerName::try_from("localhost")?.to_owned(), s)
            .await?;
        with_tls.push(t.elapsed());
        drop(stream);
    }
    tcp_only.sort();
    with_tls.sort();
    println!(
        "TLS handshake (connect + handshake): p50 {:.3} ms, p99 {:.3} ms vs TCP connect p50 {:.3} ms",
        ms(percentile(&with_tls, 0.5)),
        ms(percentile(&with_tls, 0.99)),
        ms(percentile(&tcp_only, 0.5))
    );

    // Memory per idle follow stream: the server's RSS growth.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = rss_kib(pid);
    let mut followers = Vec::new();
    for _ in 0..args.followers {
        let mut s = connect(port, &tls).await?;
        s.ready().await?;
        let req = hyper::Request::get("/containerLogs/default/p0/app?follow=true&tailLines=0")
            .header("host", "localhost")
            .body(Empty::<Bytes>::new())?;
        let resp = s.send_request(req).await?;
        if resp.status() != 200 {
            bail!("follow: HTTP {}", resp.status());
        }
        followers.push((s, resp));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = rss_kib(pid);
    println!(
        "idle follow streams: {} streams, server RSS {before} KiB -> {after} KiB: {:.1} KiB per stream",
        args.followers,
        after.saturating_sub(before) as f64 / args.followers as f64
    );
    drop(followers);
    drop(child.stdin.take());
    let _ = child.wait();
    Ok(())
}
