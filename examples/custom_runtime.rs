//! A toy `ContainerRuntime` written from the trait's documented contract: containers are plain
//! child processes of the agent (no isolation, no images), their output written to CRI-format
//! log files. It passes the SDK's runtime conformance suite, and the engine runs pods on it with
//! probes, restarts and status like on any other runtime.
//!
//! Run the conformance kit (the per-call checks and the engine section):
//! `cargo run -p kubelet --features testing --example custom_runtime`
//! Run static pods on it (`/pods` on the read-only port if one is given):
//! `cargo run -p kubelet --features testing --example custom_runtime -- MANIFEST_DIR ROOT_DIR [PORT]`

use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kubelet::Timestamp;
use kubelet::conformance::{EngineConformanceConfig, run_engine_conformance};
use kubelet::prelude::*;
use kubelet_api::conformance::{ConformanceConfig, run_conformance};
use kubelet_api::cri_log::{LogStream, format_record};
use kubelet_api::runtime::{
    Container, ContainerConfig, ContainerFilter, ContainerState, ContainerStatus, ExecResult,
    PodSandbox, PodSandboxConfig, PodSandboxStatus, RuntimeStatus, RuntimeVersion, SandboxFilter,
    SandboxState, labels_match,
};
use kubelet_api::{Error, Result};
use parking_lot::Mutex;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

struct Sandbox {
    config: PodSandboxConfig,
    state: SandboxState,
    created_at: Timestamp,
}

struct Proc {
    sandbox_id: String,
    config: ContainerConfig,
    log_path: PathBuf,
    state: ContainerState,
    created_at: Timestamp,
    started_at: Option<Timestamp>,
    finished_at: Option<Timestamp>,
    exit_code: i32,
    pid: Option<i32>,
}

impl Proc {
    fn status(&self, id: &str) -> ContainerStatus {
        // The contract: reasons `Completed` for exit 0 and `Error` otherwise, set by the runtime.
        let reason = match (self.state, self.exit_code) {
            (ContainerState::Exited, 0) => "Completed",
            (ContainerState::Exited, _) => "Error",
            _ => "",
        };
        {
            let mut v = ContainerStatus::default();
            v.id = id.to_string();
            v.metadata = self.config.metadata.clone();
            v.state = self.state;
            v.created_at = self.created_at;
            v.started_at = self.started_at;
            v.finished_at = self.finished_at;
            v.exit_code = self.exit_code;
            v.image = self.config.image.clone();
            v.reason = reason.to_string();
            v.labels = self.config.labels.clone();
            v.annotations = self.config.annotations.clone();
            v.log_path = self.log_path.clone();
            v
        }
    }
}

#[derive(Default)]
struct State {
    sandboxes: HashMap<String, Sandbox>,
    containers: HashMap<String, Proc>,
}

/// Containers as child processes; state in memory (an agent restart forgets them).
#[derive(Default)]
struct ToyRuntime {
    state: Arc<Mutex<State>>,
    next_id: AtomicU64,
}

fn not_found(what: &str, id: &str) -> Error {
    Error::not_found(format!("{what} {id} not found"))
}

impl ToyRuntime {
    fn id(&self, prefix: &str) -> String {
        format!("{prefix}{}", self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    /// Signal the container's process group (its process and whatever it started).
    fn signal(pid: i32, signal: nix::sys::signal::Signal) {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), signal);
    }

    async fn wait_exited(&self, id: &str, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match self.state.lock().containers.get(id) {
                Some(c) if c.state == ContainerState::Running => {}
                _ => return true,
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Copy one output stream to the log file in the CRI format (`<time> <stream> F <line>`).
async fn pump(
    output: impl tokio::io::AsyncRead + Unpin,
    stream: LogStream,
    log: Arc<tokio::sync::Mutex<tokio::fs::File>>,
) {
    let mut lines = BufReader::new(output).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let record = format_record(Timestamp::now(), stream, false, line.as_bytes());
        let _ = log.lock().await.write_all(&record).await;
    }
}

#[async_trait]
impl ContainerRuntime for ToyRuntime {
    async fn version(&self) -> Result<RuntimeVersion> {
        Ok(RuntimeVersion {
            runtime_name: "toy".into(),
            runtime_version: "0.1.0".into(),
            ..Default::default()
        })
    }
    async fn status(&self) -> Result<RuntimeStatus> {
        Ok(RuntimeStatus::all_ready())
    }
    async fn run_pod_sandbox(&self, config: &PodSandboxConfig) -> Result<String> {
        let id = self.id("sandbox-");
        let sandbox = Sandbox {
            config: config.clone(),
            state: SandboxState::Ready,
            created_at: Timestamp::now(),
        };
        self.state.lock().sandboxes.insert(id.clone(), sandbox);
        Ok(id)
    }
    async fn stop_pod_sandbox(&self, sandbox_id: &str) -> Result<()> {
        let ids: Vec<String> = {
            let mut st = self.state.lock();
            if let Some(s) = st.sandboxes.get_mut(sandbox_id) {
                s.state = SandboxState::NotReady;
            }
            let of_sandbox = st
                .containers
                .iter()
                .filter(|(_, c)| c.sandbox_id == sandbox_id);
            of_sandbox.map(|(id, _)| id.clone()).collect()
        };
        for id in ids {
            self.stop_container(&id, Duration::ZERO).await?;
        }
        Ok(())
    }
    async fn remove_pod_sandbox(&self, sandbox_id: &str) -> Result<()> {
        self.stop_pod_sandbox(sandbox_id).await?;
        let mut st = self.state.lock();
        st.containers.retain(|_, c| c.sandbox_id != sandbox_id);
        st.sandboxes.remove(sandbox_id);
        Ok(())
    }
    async fn pod_sandbox_status(&self, sandbox_id: &str) -> Result<PodSandboxStatus> {
        let st = self.state.lock();
        let s = st
            .sandboxes
            .get(sandbox_id)
            .ok_or_else(|| not_found("sandbox", sandbox_id))?;
        Ok({
            let mut v = PodSandboxStatus::default();
            v.id = sandbox_id.to_string();
            v.metadata = s.config.metadata.clone();
            v.state = s.state;
            v.created_at = s.created_at;
            v.host_network = true;
            v.labels = s.config.labels.clone();
            v.annotations = s.config.annotations.clone();
            v
        })
    }
    async fn list_pod_sandboxes(&self, filter: &SandboxFilter) -> Result<Vec<PodSandbox>> {
        let st = self.state.lock();
        let listed = st.sandboxes.iter().filter(|(id, s)| {
            filter.id.as_ref().is_none_or(|f| f == *id)
                && filter.state.is_none_or(|f| f == s.state)
                && labels_match(&s.config.labels, &filter.label_selector)
        });
        Ok(listed
            .map(|(id, s)| PodSandbox {
                id: id.clone(),
                metadata: s.config.metadata.clone(),
                state: s.state,
                created_at: s.created_at,
                labels: s.config.labels.clone(),
                annotations: s.config.annotations.clone(),
            })
            .collect())
    }
    async fn create_container(
        &self,
        sandbox_id: &str,
        config: &ContainerConfig,
        sandbox_config: &PodSandboxConfig,
    ) -> Result<String> {
        if config.command.is_empty() && config.args.is_empty() {
            return Err(Error::invalid_argument(
                "the toy runtime has no images: set a command",
            ));
        }
        let id = self.id("container-");
        let mut st = self.state.lock();
        if !st.sandboxes.contains_key(sandbox_id) {
            return Err(not_found("sandbox", sandbox_id));
        }
        let container = Proc {
            sandbox_id: sandbox_id.to_string(),
            config: config.clone(),
            log_path: sandbox_config.log_directory.join(&config.log_path),
            state: ContainerState::Created,
            created_at: Timestamp::now(),
            started_at: None,
            finished_at: None,
            exit_code: 0,
            pid: None,
        };
        st.containers.insert(id.clone(), container);
        Ok(id)
    }
    async fn start_container(&self, container_id: &str) -> Result<()> {
        let (argv, envs, log_path) = {
            let st = self.state.lock();
            let c = st
                .containers
                .get(container_id)
                .ok_or_else(|| not_found("container", container_id))?;
            if c.state != ContainerState::Created {
                let message = format!("container {container_id} is {:?}, not Created", c.state);
                return Err(Error::failed_precondition(message));
            }
            let argv: Vec<String> = c
                .config
                .command
                .iter()
                .chain(&c.config.args)
                .cloned()
                .collect();
            let envs: Vec<(String, String)> = c
                .config
                .envs
                .iter()
                .map(|e| (e.name.clone(), e.value.clone()))
                .collect();
            (argv, envs, c.log_path.clone())
        };
        if let Some(dir) = log_path.parent() {
            tokio::fs::create_dir_all(dir).await?;
        }
        let log = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .await?;
        let log = Arc::new(tokio::sync::Mutex::new(log));
        let mut child = tokio::process::Command::new(&argv[0])
            .args(&argv[1..])
            .envs(envs)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .process_group(0)
            .spawn()?;
        let pumps = [
            child
                .stdout
                .take()
                .map(|s| tokio::spawn(pump(s, LogStream::Stdout, log.clone()))),
            child
                .stderr
                .take()
                .map(|s| tokio::spawn(pump(s, LogStream::Stderr, log))),
        ];
        if let Some(c) = self.state.lock().containers.get_mut(container_id) {
            c.state = ContainerState::Running;
            c.started_at = Some(Timestamp::now());
            c.pid = child.id().and_then(|p| i32::try_from(p).ok());
        }
        let state = self.state.clone();
        let id = container_id.to_string();
        tokio::spawn(async move {
            let status = child.wait().await;
            // Descendants that left the process group may hold the pipes open: wait a little.
            for p in pumps.into_iter().flatten() {
                let _ = tokio::time::timeout(Duration::from_secs(2), p).await;
            }
            // The contract: 128 + n for a container killed by signal n.
            let code = match status {
                Ok(s) => s.code().or(s.signal().map(|n| 128 + n)).unwrap_or(255),
                Err(_) => 255,
            };
            if let Some(c) = state.lock().containers.get_mut(&id) {
                c.state = ContainerState::Exited;
                c.exit_code = code;
                c.finished_at = Some(Timestamp::now());
                c.pid = None;
            }
        });
        Ok(())
    }
    async fn stop_container(&self, container_id: &str, timeout: Duration) -> Result<()> {
        let pid = {
            let st = self.state.lock();
            let c = st
                .containers
                .get(container_id)
                .ok_or_else(|| not_found("container", container_id))?;
            c.pid
        };
        let Some(pid) = pid else { return Ok(()) };
        Self::signal(pid, nix::sys::signal::Signal::SIGTERM);
        if !self.wait_exited(container_id, timeout).await {
            Self::signal(pid, nix::sys::signal::Signal::SIGKILL);
            self.wait_exited(container_id, Duration::from_secs(10))
                .await;
        }
        Ok(())
    }
    async fn remove_container(&self, container_id: &str) -> Result<()> {
        if self.state.lock().containers.contains_key(container_id) {
            self.stop_container(container_id, Duration::ZERO).await?;
        }
        self.state.lock().containers.remove(container_id);
        Ok(())
    }
    async fn list_containers(&self, filter: &ContainerFilter) -> Result<Vec<Container>> {
        let st = self.state.lock();
        let listed = st.containers.iter().filter(|(id, c)| {
            filter.id.as_ref().is_none_or(|f| f == *id)
                && filter.state.is_none_or(|f| f == c.state)
                && filter
                    .pod_sandbox_id
                    .as_ref()
                    .is_none_or(|f| *f == c.sandbox_id)
                && labels_match(&c.config.labels, &filter.label_selector)
        });
        Ok(listed
            .map(|(id, c)| Container {
                id: id.clone(),
                pod_sandbox_id: c.sandbox_id.clone(),
                metadata: c.config.metadata.clone(),
                image: c.config.image.clone(),
                image_ref: c.config.image.clone(),
                state: c.state,
                created_at: c.created_at,
                labels: c.config.labels.clone(),
                annotations: c.config.annotations.clone(),
            })
            .collect())
    }
    async fn container_status(&self, container_id: &str) -> Result<ContainerStatus> {
        let st = self.state.lock();
        let c = st
            .containers
            .get(container_id)
            .ok_or_else(|| not_found("container", container_id))?;
        Ok(c.status(container_id))
    }
    async fn exec_sync(
        &self,
        container_id: &str,
        cmd: &[String],
        timeout: Duration,
    ) -> Result<ExecResult> {
        let state = self.container_status(container_id).await?.state;
        let (Some(program), ContainerState::Running) = (cmd.first(), state) else {
            let message = format!("cannot exec {cmd:?} in container {container_id} ({state:?})");
            return Err(Error::failed_precondition(message));
        };
        let run = tokio::process::Command::new(program)
            .args(&cmd[1..])
            .kill_on_drop(true)
            .output();
        match tokio::time::timeout(timeout, run).await {
            Ok(out) => {
                let out = out?;
                let exit_code = out.status.code().unwrap_or(255);
                Ok(ExecResult {
                    stdout: out.stdout,
                    stderr: out.stderr,
                    exit_code,
                })
            }
            Err(_) => Err(Error::deadline_exceeded(format!("exec {cmd:?} timed out"))),
        }
    }
    // No `images()`: containers are host programs, so nothing is pulled.
}

fn main() -> anyhow::Result<std::process::ExitCode> {
    tracing_subscriber::fmt()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    tokio::runtime::Runtime::new()?.block_on(async {
        if let [manifests, root, rest @ ..] = args.as_slice() {
            // An agent on the toy runtime: static pods from `manifests`, state and logs under
            // `root`, no kubelet API or healthz port, `/pods` on the read-only port if given.
            let mut configuration = KubeletConfiguration::default();
            configuration.static_pod_path = manifests.clone();
            configuration.pod_logs_dir = format!("{root}/logs");
            configuration.port = 0;
            configuration.healthz_port = 0;
            configuration.read_only_port = match rest.first() {
                Some(port) => port.parse()?,
                None => 0,
            };
            let agent = AgentBuilder::new("toy-node")
                .configuration(configuration)
                .root_dir(root)
                .runtime(Arc::new(ToyRuntime::default()))
                .build()
                .await?;
            let shutdown = CancellationToken::new();
            let stop = shutdown.clone();
            tokio::spawn(async move { (tokio::signal::ctrl_c().await, stop.cancel()) });
            agent.run(shutdown).await;
            return Ok(std::process::ExitCode::SUCCESS);
        }
        // The kit: the per-call checks, then the engine section (pods driven by the engine).
        let dir = std::env::temp_dir().join(format!("toy-runtime-{}", std::process::id()));
        let mut report = run_conformance(
            &ToyRuntime::default(),
            &ConformanceConfig::new("none", dir.join("calls")),
        )
        .await;
        let engine = run_engine_conformance(
            Arc::new(ToyRuntime::default()),
            &EngineConformanceConfig::new("none", dir.join("engine")),
        )
        .await;
        report.checks.extend(engine.checks);
        let _ = std::fs::remove_dir_all(&dir);
        for (check, outcome) in &report.checks {
            println!("{check}: {outcome:?}");
        }
        let failed = report.failures().len();
        println!("{} passed, {failed} failed", report.checks.len() - failed);
        Ok(if failed == 0 {
            std::process::ExitCode::SUCCESS
        } else {
            std::process::ExitCode::FAILURE
        })
    })
}
