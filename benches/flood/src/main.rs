//! `flood-bench`: a release `minimal_kubelet` under connection floods, against the same agent
//! quiet, in one run. Two scenarios (`--scenario read-only|api|all`, default all):
//!
//! **api**: the kubelet API (HTTPS, port `--port`) flooded by clients that need no credentials.
//! An authorized client (anonymous, `AlwaysAllow`) GETs `/pods` on a new connection each time
//! (TCP, TLS handshake, request: what every new client of the API pays), `--api-requests`
//! times per phase; phases: quiet, 5,000 and 20,000 idle connections (`--api-idle`), 1,000
//! stalled TLS handshakes (`--api-stalled`: the first bytes of a TLS record, then nothing).
//! Reported per phase: p50/p99 and failures of the authorized requests, the agent's peak RSS and
//! peak descriptor count (sampled every 50 ms) against its open-file limit, and how many of
//! the flood's connections were established. No Go kubelet was at hand to flood as a reference.
//!
//! **read-only**: the harness starts the agent on its process runtime with `2 × --samples` static pods, each a
//! container blocked reading its own FIFO (`restartPolicy: Never`). It measures, first quiet,
//! then flooded:
//!
//! * **exit → status**: the harness writes a line into one pod's FIFO (the container reads it
//!   and exits) and polls `/pods` on the kubelet API port (HTTPS, its own listener) until the
//!   container is reported terminated; p50/p99 over `--samples` pods;
//! * **`/healthz`** on the healthz port: `--healthz-requests` GETs, each on a new connection
//!   (as a prober makes them); p50/p99;
//! * the agent's **RSS**.
//!
//! The flood: `--idle` connections that send nothing (opened by `--workers` child processes,
//! at `nice 19`, so that no process needs more descriptors than the machine's hard limit; each
//! reconnects when the agent closes it or the connect times out), and `--slow` clients that send a request's headers one line per second
//! (slowloris); both on the read-only port. Reported as well: how many of the flood's
//! connections were established, and the agent's log lines during the flood per message per
//! second (JSON log, grouped by message).
//!
//! Run:
//! ```text
//! CARGO_TARGET_DIR=/work/target-perf cargo build --release -p minimal_kubelet -p flood-bench
//! /work/target-perf/release/flood-bench --agent /work/target-perf/release/minimal_kubelet
//! ```

use bench_support::{free_port, ms, percentile, rss_kib};
use std::collections::BTreeMap;
use std::io::{BufRead, Read, Write};
use std::net::TcpStream as StdTcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Debug, Parser)]
#[command(name = "flood-bench", about)]
struct Args {
    /// Path of a release `minimal_kubelet` binary.
    #[arg(long)]
    agent: Option<PathBuf>,
    /// Idle connections to the read-only port.
    #[arg(long, default_value_t = 20_000)]
    idle: usize,
    /// Slow-header clients on the read-only port.
    #[arg(long, default_value_t = 200)]
    slow: usize,
    /// Child processes that hold the idle connections.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Exits measured per phase.
    #[arg(long, default_value_t = 20)]
    samples: usize,
    /// `/healthz` requests per phase.
    #[arg(long, default_value_t = 200)]
    healthz_requests: usize,
    /// Run the agent on these CPUs only (`taskset -c`), e.g. `0`; start the harness itself on
    /// the others (`taskset -c 1 flood-bench …`) so that the flood's clients do not share the
    /// agent's cores, as a flood from other machines would not.
    #[arg(long)]
    agent_cpus: Option<String>,
    /// Which floods to run: `read-only`, `api` or `all`.
    #[arg(long, default_value = "all")]
    scenario: String,
    /// Sizes of the idle floods on the kubelet API, one phase each.
    #[arg(long, value_delimiter = ',', default_values_t = [5_000usize, 20_000])]
    api_idle: Vec<usize>,
    /// Stalled TLS handshakes on the kubelet API (one phase).
    #[arg(long, default_value_t = 1_000)]
    api_stalled: usize,
    /// Authorized `/pods` requests per kubelet API phase.
    #[arg(long, default_value_t = 200)]
    api_requests: usize,
    /// Internal: hold COUNT connections to 127.0.0.1:PORT; STALL 1 sends the start of a TLS
    /// record on each, 0 nothing.
    #[arg(long, hide = true, num_args = 3, value_names = ["PORT", "COUNT", "STALL"])]
    flood_worker: Option<Vec<usize>>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    raise_nofile();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    if let Some(w) = &args.flood_worker {
        let port = u16::try_from(w[0]).context("port")?;
        return rt.block_on(flood_worker(port, w[1], w[2] == 1));
    }
    let scenario = args.scenario.clone();
    if !["all", "read-only", "api"].contains(&scenario.as_str()) {
        bail!("--scenario: read-only, api or all, not {scenario:?}");
    }
    if scenario != "api" {
        rt.block_on(bench(&args))?;
    }
    if scenario != "read-only" {
        rt.block_on(api_bench(&args))?;
    }
    Ok(())
}

fn raise_nofile() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
    {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

/// The first bytes of a TLS handshake record that never completes.
const STALLED_HANDSHAKE: [u8; 6] = [0x16, 0x03, 0x01, 0x02, 0x00, 0x01];

/// Hold `count` connections that send nothing (`stall`: the start of a TLS record); reconnect
/// each one the agent closes. Prints `CONNECTED <n>` once the first round of connects is done.
async fn flood_worker(port: u16, count: usize, stall: bool) -> anyhow::Result<()> {
    let connected = Arc::new(AtomicUsize::new(0));
    let first_round = Arc::new(AtomicUsize::new(0));
    for _ in 0..count {
        let connected = connected.clone();
        let first_round = first_round.clone();
        tokio::spawn(async move {
            let mut first = true;
            loop {
                let c = tokio::time::timeout(
                    Duration::from_secs(5),
                    TcpStream::connect(("127.0.0.1", port)),
                )
                .await;
                if first {
                    first_round.fetch_add(1, Ordering::Relaxed);
                }
                match c {
                    Ok(Ok(mut s)) => {
                        if first {
                            connected.fetch_add(1, Ordering::Relaxed);
                        }
                        first = false;
                        if stall && s.write_all(&STALLED_HANDSHAKE).await.is_err() {
                            continue;
                        }
                        let mut buf = [0u8; 64];
                        // Until the agent closes it.
                        while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
                    }
                    _ => {
                        first = false;
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        });
    }
    while first_round.load(Ordering::Relaxed) < count {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("CONNECTED {}", connected.load(Ordering::Relaxed));
    std::io::stdout().flush()?;
    // Until the parent closes stdin.
    tokio::task::spawn_blocking(|| {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
    })
    .await?;
    Ok(())
}

/// A client that sends a request's headers one line per second, forever (reconnecting).
fn slow_client(port: u16, closed: Arc<AtomicUsize>) {
    tokio::spawn(async move {
        loop {
            let Ok(Ok(mut s)) = tokio::time::timeout(
                Duration::from_secs(5),
                TcpStream::connect(("127.0.0.1", port)),
            )
            .await
            else {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            let mut line = b"GET /pods HTTP/1.1\r\n".to_vec();
            let mut i = 0u64;
            while s.write_all(&line).await.is_ok() {
                tokio::time::sleep(Duration::from_secs(1)).await;
                i += 1;
                line = format!("X-Slow-{i}: x\r\n").into_bytes();
            }
            closed.fetch_add(1, Ordering::Relaxed);
        }
    });
}

fn default_agent() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/release/minimal_kubelet")
}

type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

async fn connect_api(port: u16) -> anyhow::Result<Sender> {
    let tls = match kubelet_net::http::insecure_tls_config() {
        Ok(c) => tokio_rustls::TlsConnector::from(Arc::new(c)),
        Err(e) => bail!("client TLS configuration: {e}"),
    };
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

async fn get_json(sender: &mut Sender, path: &str) -> anyhow::Result<serde_json::Value> {
    sender.ready().await?;
    let req = hyper::Request::get(path)
        .header("host", "localhost")
        .body(Empty::<Bytes>::new())?;
    let resp = sender.send_request(req).await?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    if status != 200 {
        bail!("{path}: HTTP {status}: {}", String::from_utf8_lossy(&body));
    }
    Ok(serde_json::from_slice(&body)?)
}

/// State of the first container of pod `name` in a `/pods` answer: `running`, `terminated`…
fn container_state(pods: &serde_json::Value, name: &str) -> Option<String> {
    let pod = pods["items"]
        .as_array()?
        .iter()
        .find(|p| p["metadata"]["name"] == name)?;
    let state = pod["status"]["containerStatuses"][0]["state"].as_object()?;
    state.keys().next().cloned()
}

fn healthz_once(port: u16) -> anyhow::Result<()> {
    let mut s = StdTcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    if !out.starts_with(b"HTTP/1.1 200") {
        bail!("/healthz: {}", String::from_utf8_lossy(&out));
    }
    Ok(())
}

/// CPU time (user + system) of process `pid` so far.
fn cpu_time(pid: u32) -> Duration {
    let ticks = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let rest = s[s.rfind(')')? + 1..].to_string();
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
        })
        .unwrap_or(0);
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|&h| h > 0)
        .unwrap_or(100) as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

/// Busy and total jiffies of the whole machine (`cpu` line of `/proc/stat`).
fn machine_jiffies() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = text
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let total: u64 = v.iter().sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// One phase's figures.
struct Phase {
    exit_p50: Duration,
    exit_p99: Duration,
    healthz_p50: Duration,
    healthz_p99: Duration,
    rss_kib: u64,
    /// The agent's CPU use during the phase, in % of one core.
    cpu_percent: f64,
    /// The whole machine's CPU use during the phase, in % of all cores.
    machine_percent: f64,
}

struct Agent {
    child: Child,
    dir: tempfile::TempDir,
    api_port: u16,
    ro_port: u16,
    healthz_port: u16,
    stderr: PathBuf,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Agent {
    /// Delete every manifest and wait (60 s at most) until the agent has stopped the pods, so
    /// that no container outlives the run (an agent that exits leaves its containers running,
    /// as the kubelet does); then SIGKILL whatever still runs under the run's directory.
    async fn remove_pods(&self) {
        let manifests = self.dir.path().join("manifests");
        if let Ok(entries) = std::fs::read_dir(&manifests) {
            for e in entries.flatten() {
                let _ = std::fs::remove_file(e.path());
            }
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            let left = async {
                let mut api = connect_api(self.api_port).await?;
                let pods = get_json(&mut api, "/pods").await?;
                anyhow::Ok(pods["items"].as_array().map_or(0, Vec::len))
            };
            if matches!(left.await, Ok(0)) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        kill_processes_under(self.dir.path(), self.child.id());
    }
}

/// SIGKILL every process but `except` whose command line names a path under `dir`.
fn kill_processes_under(dir: &Path, except: u32) {
    let needle = dir.to_string_lossy().into_owned();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        if u32::try_from(pid) == Ok(except) || u32::try_from(pid) == Ok(std::process::id()) {
            continue;
        }
        let cmdline = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(&needle) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

fn pod_name(i: usize) -> String {
    format!("exit-{i}")
}

fn start_agent(binary: &Path, pods: usize, cpus: Option<&str>) -> anyhow::Result<Agent> {
    let dir = tempfile::Builder::new().prefix("flood-bench-").tempdir()?;
    let base = dir.path();
    for d in ["manifests", "root", "logs", "fifos"] {
        std::fs::create_dir_all(base.join(d))?;
    }
    for i in 0..pods {
        let fifo = base.join("fifos").join(pod_name(i));
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))?;
        let pod = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": { "name": pod_name(i) },
            "spec": {
                "restartPolicy": "Never",
                "containers": [{
                    "name": "main",
                    "image": "busybox",
                    "command": ["/bin/sh", "-c", "read x < \"$0\"; exit 0", fifo],
                }],
            },
        });
        std::fs::write(
            base.join("manifests").join(format!("{}.json", pod_name(i))),
            pod.to_string(),
        )?;
    }
    let (api_port, ro_port, healthz_port) = (free_port()?, free_port()?, free_port()?);
    let stderr = base.join("agent.log");
    let mut command = match cpus {
        Some(list) => {
            let mut c = Command::new("taskset");
            c.args(["-c", list]).arg(binary);
            c
        }
        None => Command::new(binary),
    };
    let child = command
        .arg("--root-dir")
        .arg(base.join("root"))
        .arg("--pod-log-dir")
        .arg(base.join("logs"))
        .arg("--pod-manifest-path")
        .arg(base.join("manifests"))
        .args([
            "--address",
            "127.0.0.1",
            "--healthz-bind-address",
            "127.0.0.1",
        ])
        .args(["--read-only-port", &ro_port.to_string()])
        .args(["--healthz-port", &healthz_port.to_string()])
        .args(["--port", &api_port.to_string()])
        .args(["--anonymous-auth", "--authorization-mode", "AlwaysAllow"])
        .args(["--node-name", "flood", "--file-check-frequency", "60s"])
        .args(["--eviction-hard", "memory.available<1Mi"])
        .args(["--log-format", "json"])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr)?)
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    Ok(Agent {
        child,
        dir,
        api_port,
        ro_port,
        healthz_port,
        stderr,
    })
}

async fn phase(
    agent: &Agent,
    api: &mut Sender,
    pods: std::ops::Range<usize>,
    n: usize,
) -> anyhow::Result<Phase> {
    let (start, cpu_start) = (Instant::now(), cpu_time(agent.child.id()));
    let machine_start = machine_jiffies();
    let mut hz = Vec::with_capacity(n);
    for _ in 0..n {
        let port = agent.healthz_port;
        let t = Instant::now();
        tokio::task::spawn_blocking(move || healthz_once(port)).await??;
        hz.push(t.elapsed());
    }
    hz.sort();
    let mut exits = Vec::new();
    for i in pods {
        let name = format!("{}-flood", pod_name(i));
        let fifo = agent.dir.path().join("fifos").join(pod_name(i));
        let t0 = Instant::now();
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            let mut f = std::fs::OpenOptions::new().write(true).open(fifo)?;
            f.write_all(b"go\n")
        })
        .await??;
        let deadline = t0 + Duration::from_secs(60);
        loop {
            let pods = get_json(api, "/pods").await?;
            if container_state(&pods, &name).as_deref() == Some("terminated") {
                exits.push(t0.elapsed());
                break;
            }
            if Instant::now() > deadline {
                bail!("{name}: no terminated state within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    exits.sort();
    Ok(Phase {
        exit_p50: percentile(&exits, 0.5),
        exit_p99: percentile(&exits, 0.99),
        healthz_p50: percentile(&hz, 0.5),
        healthz_p99: percentile(&hz, 0.99),
        rss_kib: rss_kib(agent.child.id()),
        cpu_percent: (cpu_time(agent.child.id()) - cpu_start).as_secs_f64() * 100.0
            / start.elapsed().as_secs_f64(),
        machine_percent: {
            let (busy, total) = machine_jiffies();
            (busy - machine_start.0) as f64 * 100.0 / (total - machine_start.1).max(1) as f64
        },
    })
}

/// Log lines from `from` on, per message.
fn log_messages(path: &Path, from: usize) -> (usize, BTreeMap<String, usize>) {
    let mut by = BTreeMap::new();
    let mut total = 0;
    if let Ok(f) = std::fs::File::open(path) {
        for line in std::io::BufReader::new(f).lines().map_while(Result::ok) {
            total += 1;
            if total <= from {
                continue;
            }
            let msg = serde_json::from_str::<serde_json::Value>(&line)
                .ok()
                .and_then(|v| v["fields"]["message"].as_str().map(str::to_string))
                .unwrap_or(line);
            *by.entry(msg).or_insert(0) += 1;
        }
    }
    (total, by)
}

async fn bench(args: &Args) -> anyhow::Result<()> {
    let binary = args.agent.clone().unwrap_or_else(default_agent);
    let agent = start_agent(&binary, 2 * args.samples, args.agent_cpus.as_deref())?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut api = loop {
        match connect_api(agent.api_port).await {
            Ok(s) => break s,
            Err(e) if Instant::now() > deadline => bail!("the agent's API did not answer: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    loop {
        let pods = get_json(&mut api, "/pods").await?;
        let running = (0..2 * args.samples)
            .filter(|&i| {
                container_state(&pods, &format!("{}-flood", pod_name(i))).as_deref()
                    == Some("running")
            })
            .count();
        if running == 2 * args.samples {
            break;
        }
        if Instant::now() > deadline {
            bail!("only {running} pods running after 60 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pid = agent.child.id();
    let idle_rss = rss_kib(pid);
    let quiet = phase(&agent, &mut api, 0..args.samples, args.healthz_requests).await?;

    // The flood.
    let (lines_before, _) = log_messages(&agent.stderr, 0);
    let flood_start = Instant::now();
    let mut workers = spawn_workers(agent.ro_port, args.idle, args.workers, false)?;
    let closed = Arc::new(AtomicUsize::new(0));
    for _ in 0..args.slow {
        slow_client(agent.ro_port, closed.clone());
    }
    let established = wait_connected(&mut workers).await?;
    let connect_time = flood_start.elapsed();
    let flooded = phase(
        &agent,
        &mut api,
        args.samples..2 * args.samples,
        args.healthz_requests,
    )
    .await?;
    let flood_secs = flood_start.elapsed().as_secs_f64();
    let (_, messages) = log_messages(&agent.stderr, lines_before);
    stop_workers(workers);
    agent.remove_pods().await;

    println!(
        "flood-bench: {} idle connections ({} established in {:.1} s) + {} slow-header clients on the read-only port",
        args.idle,
        established,
        connect_time.as_secs_f64(),
        args.slow
    );
    println!(
        "exit -> status: quiet p50 {:.1} ms p99 {:.1} ms | flooded p50 {:.1} ms p99 {:.1} ms | ratio p50 {:.2}x p99 {:.2}x",
        ms(quiet.exit_p50),
        ms(quiet.exit_p99),
        ms(flooded.exit_p50),
        ms(flooded.exit_p99),
        ms(flooded.exit_p50) / ms(quiet.exit_p50).max(0.001),
        ms(flooded.exit_p99) / ms(quiet.exit_p99).max(0.001),
    );
    println!(
        "/healthz (new connection each): quiet p50 {:.3} ms p99 {:.3} ms | flooded p50 {:.3} ms p99 {:.3} ms | ratio p50 {:.2}x p99 {:.2}x",
        ms(quiet.healthz_p50),
        ms(quiet.healthz_p99),
        ms(flooded.healthz_p50),
        ms(flooded.healthz_p99),
        ms(flooded.healthz_p50) / ms(quiet.healthz_p50).max(0.001),
        ms(flooded.healthz_p99) / ms(quiet.healthz_p99).max(0.001),
    );
    println!(
        "agent RSS: idle {} KiB, after the quiet phase {} KiB, flooded {} KiB",
        idle_rss, quiet.rss_kib, flooded.rss_kib
    );
    println!(
        "CPU: agent {:.1}% of a core quiet, {:.1}% flooded (most of it serving the harness's /pods polls); machine {:.0}% busy quiet, {:.0}% flooded (the flood's clients share the cores)",
        quiet.cpu_percent, flooded.cpu_percent, quiet.machine_percent, flooded.machine_percent
    );
    println!(
        "slow-header connections closed by the agent during the flood: {}",
        closed.load(Ordering::Relaxed)
    );
    println!("agent log lines during the flood ({flood_secs:.1} s), per message:");
    if messages.is_empty() {
        println!("  none");
    }
    for (msg, n) in &messages {
        println!("  {:>6} ({:.2}/s) {msg}", n, *n as f64 / flood_secs);
    }
    Ok(())
}

/// Start flood workers holding `count` connections to `port` between them, at the lowest
/// priority: a real flood's clients are on other machines; here they share the cores, and only
/// the kernel's side of their connections is the agent's machine's to carry.
fn spawn_workers(
    port: u16,
    count: usize,
    workers: usize,
    stall: bool,
) -> anyhow::Result<Vec<Child>> {
    let exe = std::env::current_exe()?;
    let per = count.div_ceil(workers.max(1));
    let mut left = count;
    let mut children = Vec::new();
    while left > 0 {
        let n = per.min(left);
        left -= n;
        children.push(
            Command::new("nice")
                .args(["-n", "19"])
                .arg(&exe)
                .args(["--flood-worker", &port.to_string(), &n.to_string()])
                .arg(if stall { "1" } else { "0" })
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()?,
        );
    }
    Ok(children)
}

/// Wait until every worker has made its first round of connects; how many were established.
async fn wait_connected(workers: &mut [Child]) -> anyhow::Result<usize> {
    let mut established = 0;
    for w in workers {
        let out = w.stdout.take().context("worker stdout")?;
        let line = tokio::task::spawn_blocking(move || {
            let mut l = String::new();
            let _ = std::io::BufReader::new(out).read_line(&mut l);
            l
        })
        .await?;
        established += line
            .trim()
            .strip_prefix("CONNECTED ")
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(0);
    }
    Ok(established)
}

fn stop_workers(workers: Vec<Child>) {
    for mut w in workers {
        drop(w.stdin.take());
        let _ = w.kill();
        let _ = w.wait();
    }
}

/// Descriptors process `pid` holds.
fn fd_count(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64)
}

/// The soft open-file limit of process `pid`.
fn nofile_limit(pid: u32) -> Option<u64> {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// Samples process `pid`'s RSS and descriptor count every 50 ms until stopped; keeps the peaks.
struct PeakSampler {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<(u64, u64)>,
}

impl PeakSampler {
    fn start(pid: u32) -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut rss, mut fds) = (0, 0);
            while !flag.load(Ordering::Relaxed) {
                rss = rss.max(rss_kib(pid));
                fds = fds.max(fd_count(pid));
                std::thread::sleep(Duration::from_millis(50));
            }
            (rss, fds)
        });
        Self { stop, thread }
    }

    /// Peak RSS (KiB) and peak descriptors.
    fn finish(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or((0, 0))
    }
}

/// One kubelet API phase's figures.
struct ApiPhase {
    name: String,
    established: usize,
    p50: Duration,
    p99: Duration,
    failed: usize,
    peak_rss_kib: u64,
    peak_fds: u64,
    /// The agent's CPU use during the phase, in % of one core.
    cpu_percent: f64,
}

/// `n` authorized `/pods` requests, each on a new connection; latencies (sorted) and failures
/// (no answer within 10 s, or an error).
async fn api_requests(port: u16, n: usize) -> (Vec<Duration>, usize) {
    let mut times = Vec::with_capacity(n);
    let mut failed = 0;
    for _ in 0..n {
        let t = Instant::now();
        let one = async {
            let mut api = connect_api(port).await?;
            get_json(&mut api, "/pods").await
        };
        match tokio::time::timeout(Duration::from_secs(10), one).await {
            Ok(Ok(_)) => times.push(t.elapsed()),
            Ok(Err(e)) => {
                failed += 1;
                eprintln!(
                    "an authorized request failed after {:?}: {e:#}",
                    t.elapsed()
                );
            }
            Err(_) => {
                failed += 1;
                eprintln!("an authorized request got no answer within 10 s");
            }
        }
    }
    times.sort();
    (times, failed)
}

async fn api_phase(
    agent: &Agent,
    args: &Args,
    name: String,
    flood: Option<(usize, bool)>,
) -> anyhow::Result<ApiPhase> {
    let pid = agent.child.id();
    let sampler = PeakSampler::start(pid);
    let (start, cpu_start) = (Instant::now(), cpu_time(pid));
    let (workers, established) = match flood {
        Some((count, stall)) => {
            let mut w = spawn_workers(agent.api_port, count, args.workers, stall)?;
            let established = wait_connected(&mut w).await?;
            (w, established)
        }
        None => (Vec::new(), 0),
    };
    let (times, failed) = api_requests(agent.api_port, args.api_requests).await;
    let (peak_rss_kib, peak_fds) = sampler.finish();
    let cpu_percent =
        (cpu_time(pid) - cpu_start).as_secs_f64() * 100.0 / start.elapsed().as_secs_f64();
    stop_workers(workers);
    // Until the agent has let go of the flood's connections.
    let quiet_fds = fd_count(pid);
    let deadline = Instant::now() + Duration::from_secs(30);
    while fd_count(pid) > quiet_fds && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(ApiPhase {
        name,
        established,
        p50: percentile(&times, 0.5),
        p99: percentile(&times, 0.99),
        failed,
        peak_rss_kib,
        peak_fds,
        cpu_percent,
    })
}

async fn api_bench(args: &Args) -> anyhow::Result<()> {
    let binary = args.agent.clone().unwrap_or_else(default_agent);
    let pods = 10;
    let agent = start_agent(&binary, pods, args.agent_cpus.as_deref())?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let up = async {
            let mut api = connect_api(agent.api_port).await?;
            get_json(&mut api, "/pods").await
        };
        match up.await {
            Ok(pods_json) => {
                let running = (0..pods)
                    .filter(|&i| {
                        container_state(&pods_json, &format!("{}-flood", pod_name(i))).as_deref()
                            == Some("running")
                    })
                    .count();
                if running == pods {
                    break;
                }
            }
            Err(e) if Instant::now() > deadline => bail!("the agent's API did not answer: {e}"),
            Err(_) => {}
        }
        if Instant::now() > deadline {
            bail!("the pods did not run within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pid = agent.child.id();
    let limit = nofile_limit(pid);
    let mut phases = vec![api_phase(&agent, args, "quiet".into(), None).await?];
    for &idle in &args.api_idle {
        phases.push(api_phase(&agent, args, format!("{idle} idle"), Some((idle, false))).await?);
    }
    phases.push(
        api_phase(
            &agent,
            args,
            format!("{} stalled handshakes", args.api_stalled),
            Some((args.api_stalled, true)),
        )
        .await?,
    );
    agent.remove_pods().await;
    println!(
        "flood-bench api: authorized GET /pods on the kubelet API, a new TLS connection each ({} per phase); agent open-file limit {}; agent CPUs {}",
        args.api_requests,
        limit.map_or("unknown".to_string(), |l| l.to_string()),
        args.agent_cpus.as_deref().unwrap_or("all")
    );
    let quiet_p99 = ms(phases[0].p99).max(0.001);
    println!(
        "| phase | flood established | p50 ms | p99 ms | p99 / quiet p99 | failed | peak RSS KiB | peak fds | agent CPU % |"
    );
    for p in &phases {
        println!(
            "| {} | {} | {:.2} | {:.2} | {:.2}x | {} | {} | {} | {:.0} |",
            p.name,
            p.established,
            ms(p.p50),
            ms(p.p99),
            ms(p.p99) / quiet_p99,
            p.failed,
            p.peak_rss_kib,
            p.peak_fds,
            p.cpu_percent
        );
    }
    Ok(())
}
