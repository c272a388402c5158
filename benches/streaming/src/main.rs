//! `streaming-bench`: the streaming figures of the streaming issue, on a release
//! `minimal_kubelet` (process runtime, kubelet API with `AlwaysAllow`, one static pod), driven
//! over its kubelet API with the SPDY protocol kubectl speaks:
//!
//! * **exec round trip**: `--execs` times, a new TLS connection, `POST /exec/…?command=true`,
//!   the upgrade, the `error`/`stdout`/`stderr` streams, until the exit status arrives; against
//!   spawning `true` directly (what the process runtime itself does), measured in the same run.
//!   The goal is the difference of the medians (≤ 1 ms).
//! * **port-forward throughput**: `--megabytes` MiB read from a TCP server on the host through
//!   a forwarded SPDY data stream, against reading them from the server directly (goal ≥ 50 %).
//! * **memory per idle stream**: `--idle` port-forward connections, each with one forwarded
//!   connection that carries nothing; the agent's RSS growth divided by their number (goal
//!   ≤ 64 KiB).
//!
//! ```text
//! CARGO_TARGET_DIR=/work/target-perf cargo build --release -p minimal_kubelet -p streaming-bench
//! /work/target-perf/release/streaming-bench --agent /work/target-perf/release/minimal_kubelet
//! ```

use bench_support::{free_port, ms, percentile, rss_kib};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::BytesMut;
use clap::Parser;
use kubelet_server::spdy::{Frame, FrameReader, FrameWriter};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Debug, Parser)]
#[command(name = "streaming-bench", about)]
struct Args {
    /// Path of a release `minimal_kubelet` binary.
    #[arg(long)]
    agent: Option<PathBuf>,
    /// Exec round trips.
    #[arg(long, default_value_t = 200)]
    execs: usize,
    /// MiB to forward.
    #[arg(long, default_value_t = 256)]
    megabytes: usize,
    /// Idle forwarded streams.
    #[arg(long, default_value_t = 500)]
    idle: usize,
}

const NODE: &str = "bench-node";
const POD: &str = "stream-bench-node";

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run(args))
}

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// A TLS connection to the kubelet API, upgraded to SPDY for `path`.
async fn upgrade(port: u16, path: &str, protocol: &str) -> anyhow::Result<Box<dyn Io>> {
    let tls = tokio_rustls::TlsConnector::from(Arc::new(
        kubelet_net::http::insecure_tls_config().context("TLS client")?,
    ));
    let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
    tcp.set_nodelay(true)?;
    let mut s = tls
        .connect(ServerName::try_from("localhost")?.to_owned(), tcp)
        .await?;
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\
         X-Stream-Protocol-Version: {protocol}\r\nContent-Length: 0\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).await? == 0 {
            bail!("connection closed during the upgrade");
        }
        head.push(byte[0]);
    }
    if !head.starts_with(b"HTTP/1.1 101") {
        bail!("upgrade refused: {}", String::from_utf8_lossy(&head));
    }
    Ok(Box::new(s))
}

/// Read frames until `done` says so.
async fn read_until(
    io: &mut Box<dyn Io>,
    reader: &mut FrameReader,
    buf: &mut BytesMut,
    mut done: impl FnMut(&Frame) -> bool,
) -> anyhow::Result<()> {
    loop {
        while let Some(f) = reader.decode(buf)? {
            if done(&f) {
                return Ok(());
            }
        }
        if io.read_buf(buf).await? == 0 {
            bail!("connection closed");
        }
    }
}

async fn exec_once(port: u16) -> anyhow::Result<()> {
    let path = format!("/exec/default/{POD}/app?command=true&output=1&error=1");
    let mut io = upgrade(port, &path, "v4.channel.k8s.io").await?;
    let mut w = FrameWriter::new();
    let mut out = BytesMut::new();
    w.syn_stream(&mut out, 1, true, &[("streamtype", "error")])?;
    w.syn_stream(&mut out, 3, true, &[("streamtype", "stdout")])?;
    w.syn_stream(&mut out, 5, true, &[("streamtype", "stderr")])?;
    io.write_all(&out).await?;
    let (mut r, mut buf) = (FrameReader::new(), BytesMut::new());
    let mut status = Vec::new();
    read_until(&mut io, &mut r, &mut buf, |f| match f {
        Frame::Data {
            stream_id: 1,
            fin,
            data,
        } => {
            status.extend_from_slice(data);
            *fin
        }
        _ => false,
    })
    .await?;
    if !status.windows(7).any(|w| w == b"Success") {
        bail!("exec failed: {}", String::from_utf8_lossy(&status));
    }
    Ok(())
}

/// A forwarded connection to `target`: the SPDY stream after its reply.
async fn forward(
    port: u16,
    target: u16,
    id: u32,
) -> anyhow::Result<(Box<dyn Io>, FrameReader, BytesMut)> {
    let mut io = upgrade(
        port,
        &format!("/portForward/default/{POD}"),
        "portforward.k8s.io",
    )
    .await?;
    let mut w = FrameWriter::new();
    let mut out = BytesMut::new();
    let (t, rid) = (target.to_string(), id.to_string());
    w.syn_stream(
        &mut out,
        1,
        true,
        &[("streamtype", "error"), ("port", &t), ("requestid", &rid)],
    )?;
    w.syn_stream(
        &mut out,
        3,
        false,
        &[("streamtype", "data"), ("port", &t), ("requestid", &rid)],
    )?;
    io.write_all(&out).await?;
    Ok((io, FrameReader::new(), BytesMut::new()))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let agent_bin = args.agent.clone().unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/release/minimal_kubelet")
    });
    let dir = tempfile::tempdir()?;
    let manifests = dir.path().join("manifests");
    std::fs::create_dir_all(&manifests)?;
    std::fs::write(
        manifests.join("stream.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: stream\n  namespace: default\nspec:\n  \
         containers:\n  - name: app\n    image: busybox\n    command: [sleep, \"100000\"]\n",
    )?;
    let port = free_port()?;
    let child = Command::new(&agent_bin)
        .args(["--node-name", NODE, "--address", "127.0.0.1"])
        .args(["--port", &port.to_string(), "--healthz-port", "0"])
        .args([
            "--anonymous-auth=true",
            "--authorization-mode",
            "AlwaysAllow",
        ])
        .arg("--pod-manifest-path")
        .arg(&manifests)
        .arg("--root-dir")
        .arg(dir.path().join("root"))
        .arg("--pod-log-dir")
        .arg(dir.path().join("logs"))
        .arg("--cert-dir")
        .arg(dir.path().join("pki"))
        .args([
            "--eviction-hard",
            "memory.available<1Mi,nodefs.available<1%",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", agent_bin.display()))?;
    let pid = child.id();
    let _agent = Agent(child);
    // Wait until exec works (the pod runs).
    let deadline = Instant::now() + Duration::from_secs(60);
    while exec_once(port).await.is_err() {
        if Instant::now() > deadline {
            bail!("the bench pod never accepted an exec");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Exec round trip against spawning directly, interleaved.
    let (mut through, mut direct) = (Vec::new(), Vec::new());
    for _ in 0..args.execs {
        let t = Instant::now();
        exec_once(port).await?;
        through.push(t.elapsed());
        let t = Instant::now();
        tokio::process::Command::new("true").status().await?;
        direct.push(t.elapsed());
    }
    through.sort();
    direct.sort();
    println!(
        "exec `true`, {} round trips (new TLS connection each)",
        args.execs
    );
    println!("                                   p50 ms    p99 ms");
    println!(
        "  spawning directly (baseline)   {:>8.2}  {:>8.2}",
        ms(percentile(&direct, 0.5)),
        ms(percentile(&direct, 0.99))
    );
    println!(
        "  through the kubelet API        {:>8.2}  {:>8.2}",
        ms(percentile(&through, 0.5)),
        ms(percentile(&through, 0.99))
    );
    println!(
        "  overhead (p50)                 {:>8.2}",
        ms(percentile(&through, 0.5).saturating_sub(percentile(&direct, 0.5)))
    );

    // Port-forward throughput: a server that writes N MiB and closes.
    let size = args.megabytes * 1024 * 1024;
    let source = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let source_port = source.local_addr()?.port();
    tokio::spawn(async move {
        let chunk = vec![7u8; 64 * 1024];
        while let Ok((mut c, _)) = source.accept().await {
            let chunk = chunk.clone();
            tokio::spawn(async move {
                let mut left = size;
                while left > 0 {
                    let n = left.min(chunk.len());
                    if c.write_all(&chunk[..n]).await.is_err() {
                        return;
                    }
                    left -= n;
                }
            });
        }
    });
    let t = Instant::now();
    let mut c = TcpStream::connect(("127.0.0.1", source_port)).await?;
    let mut sink = vec![0u8; 64 * 1024];
    let mut got = 0;
    loop {
        let n = c.read(&mut sink).await?;
        if n == 0 {
            break;
        }
        got += n;
    }
    let direct_rate = got as f64 / t.elapsed().as_secs_f64() / 1048576.0;
    let t = Instant::now();
    let (mut io, mut r, mut buf) = forward(port, source_port, 0).await?;
    let mut forwarded = 0usize;
    read_until(&mut io, &mut r, &mut buf, |f| match f {
        Frame::Data {
            stream_id: 3,
            fin,
            data,
        } => {
            forwarded += data.len();
            *fin
        }
        _ => false,
    })
    .await?;
    let pf_rate = forwarded as f64 / t.elapsed().as_secs_f64() / 1048576.0;
    if forwarded != size {
        bail!("forwarded {forwarded} of {size} bytes");
    }
    println!("port-forward, {} MiB", args.megabytes);
    println!("  direct loopback copy (baseline) {direct_rate:>8.0} MiB/s");
    println!(
        "  through the kubelet API         {pf_rate:>8.0} MiB/s ({:.0} %)",
        pf_rate / direct_rate * 100.0
    );

    // Memory per idle forwarded stream: a server that accepts and holds.
    let idle_server = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let idle_port = idle_server.local_addr()?.port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((c, _)) = idle_server.accept().await {
            held.push(c);
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = rss_kib(pid);
    let mut open = Vec::new();
    for i in 0..args.idle {
        open.push(forward(port, idle_port, i as u32).await?);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = rss_kib(pid);
    let per = (after.saturating_sub(before)) as f64 / args.idle.max(1) as f64;
    println!(
        "idle forwarded streams: {} open, agent RSS {before} -> {after} KiB, {per:.1} KiB per stream",
        args.idle
    );
    drop(open);
    Ok(())
}
