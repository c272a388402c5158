//! A conformance suite for [`ContainerRuntime`] implementations: the contract the engine relies
//! on (documented on the trait), checked against a real runtime in one call, as CRI runtimes
//! have `critest`.
//!
//! ```no_run
//! use kubelet_api::conformance::{ConformanceConfig, run_conformance};
//! # async fn demo(runtime: &dyn kubelet_api::ContainerRuntime) {
//! let dir = tempfile_dir();
//! let report = run_conformance(runtime, &ConformanceConfig::new("busybox", dir)).await;
//! report.assert_passed();
//! # }
//! # fn tempfile_dir() -> std::path::PathBuf { std::env::temp_dir() }
//! ```
//!
//! Each check creates its own sandbox (pod name `conformance-<check>`), and the suite removes
//! every sandbox it made, also after a failure. Containers run `shell + [script]`: a long
//! sleeper, and scripts that print a line and exit with a code.

use std::path::PathBuf;
use std::time::Duration;

use crate::ContainerRuntime;
use crate::error::{Error, ErrorKind};
use crate::runtime::{
    ContainerConfig, ContainerFilter, ContainerMetadata, ContainerState, ContainerStatus,
    ImageSpec, Labels, PodSandboxConfig, PodSandboxMetadata, SandboxFilter, SandboxState, labels,
};

/// How to run the suite against a runtime.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ConformanceConfig {
    /// Image of every container (pulled first when missing).
    pub image: String,
    /// The shell prefix of containers' commands (`["/bin/sh", "-c"]`).
    pub shell: Vec<String>,
    /// Directory under which sandboxes' log directories are made.
    pub log_root: PathBuf,
    /// Sandboxes share the host network (the process runtime has no other kind).
    pub host_network: bool,
    /// Run the `exec_sync` checks.
    pub exec: bool,
    /// Check the CRI-format log files containers write.
    pub logs: bool,
    /// How long to wait for a container to reach a state.
    pub timeout: Duration,
}

impl ConformanceConfig {
    /// Containers from `image` with `/bin/sh -c`, logs under `log_root`, host network, every
    /// check on, 20 s to reach a state.
    pub fn new(image: impl Into<String>, log_root: impl Into<PathBuf>) -> Self {
        Self {
            image: image.into(),
            shell: vec!["/bin/sh".into(), "-c".into()],
            log_root: log_root.into(),
            host_network: true,
            exec: true,
            logs: true,
            timeout: Duration::from_secs(20),
        }
    }

    /// Sets [`exec`](Self::exec).
    pub fn exec(mut self, on: bool) -> Self {
        self.exec = on;
        self
    }

    /// Sets [`logs`](Self::logs).
    pub fn logs(mut self, on: bool) -> Self {
        self.logs = on;
        self
    }

    /// Sets [`host_network`](Self::host_network).
    pub fn host_network(mut self, on: bool) -> Self {
        self.host_network = on;
        self
    }
}

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The runtime behaves as the engine expects.
    Passed,
    /// It does not; the message says how.
    Failed(String),
    /// Not run (switched off in the configuration).
    Skipped,
}

/// What the suite found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Each check's name and outcome, in order.
    pub checks: Vec<(&'static str, Outcome)>,
}

impl Report {
    /// The failed checks with their messages.
    pub fn failures(&self) -> Vec<(&'static str, &str)> {
        self.checks
            .iter()
            .filter_map(|(n, o)| match o {
                Outcome::Failed(m) => Some((*n, m.as_str())),
                _ => None,
            })
            .collect()
    }

    /// Panic with every failure listed unless all checks passed or were skipped.
    pub fn assert_passed(&self) {
        let failures = self.failures();
        assert!(
            failures.is_empty(),
            "runtime conformance: {} of {} checks failed:\n{}",
            failures.len(),
            self.checks.len(),
            failures
                .iter()
                .map(|(n, m)| format!("  {n}: {m}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

type CheckResult = Result<(), String>;

fn fail<T>(what: impl Into<String>) -> Result<T, String> {
    Err(what.into())
}

fn call<T>(what: &str, r: Result<T, Error>) -> Result<T, String> {
    r.map_err(|e| format!("{what}: {e}"))
}

/// Run every check against `runtime`.
pub async fn run_conformance(runtime: &dyn ContainerRuntime, config: &ConformanceConfig) -> Report {
    let suite = Suite { runtime, config };
    let mut report = Report::default();
    let checks: [(&'static str, bool); 11] = [
        ("version_names_the_runtime", true),
        ("image_is_present_or_pulled", true),
        ("sandbox_echoes_metadata_labels_and_annotations", true),
        ("container_lifecycle_echoes_labels_and_reports_states", true),
        ("exit_codes_and_completed_or_error_reasons", true),
        ("stop_container_ends_it_with_a_signal_exit_code", true),
        (
            "exec_sync_returns_output_exit_code_and_deadline",
            config.exec,
        ),
        (
            "logs_are_written_in_the_cri_format_at_log_path",
            config.logs,
        ),
        ("unknown_ids_are_not_found_and_removal_is_idempotent", true),
        ("stopping_and_removing_a_sandbox_takes_its_containers", true),
        (
            "update_container_resources_applies_or_is_unimplemented",
            true,
        ),
    ];
    for (name, enabled) in checks {
        if !enabled {
            report.checks.push((name, Outcome::Skipped));
            continue;
        }
        let result = suite.run(name).await;
        suite.cleanup(name).await;
        report.checks.push((
            name,
            match result {
                Ok(()) => Outcome::Passed,
                Err(m) => Outcome::Failed(m),
            },
        ));
    }
    report
}

struct Suite<'a> {
    runtime: &'a dyn ContainerRuntime,
    config: &'a ConformanceConfig,
}

impl Suite<'_> {
    async fn run(&self, name: &'static str) -> CheckResult {
        match name {
            "version_names_the_runtime" => self.version().await,
            "image_is_present_or_pulled" => self.image().await,
            "sandbox_echoes_metadata_labels_and_annotations" => self.sandbox(name).await,
            "container_lifecycle_echoes_labels_and_reports_states" => self.lifecycle(name).await,
            "exit_codes_and_completed_or_error_reasons" => self.exits(name).await,
            "stop_container_ends_it_with_a_signal_exit_code" => self.stop(name).await,
            "exec_sync_returns_output_exit_code_and_deadline" => self.exec(name).await,
            "logs_are_written_in_the_cri_format_at_log_path" => self.logs(name).await,
            "unknown_ids_are_not_found_and_removal_is_idempotent" => self.not_found(name).await,
            "stopping_and_removing_a_sandbox_takes_its_containers" => self.teardown(name).await,
            "update_container_resources_applies_or_is_unimplemented" => self.update(name).await,
            other => fail(format!("unknown check {other}")),
        }
    }

    fn pod_name(check: &str) -> String {
        format!("conformance-{}", check.replace('_', "-"))
    }

    fn sandbox_config(&self, check: &str) -> PodSandboxConfig {
        let name = Self::pod_name(check);
        let uid = format!("{name}-uid");
        let mut l = Labels::new();
        l.insert(labels::POD_NAME.into(), name.clone());
        l.insert(labels::POD_NAMESPACE.into(), "conformance".into());
        l.insert(labels::POD_UID.into(), uid.clone());
        l.insert("example.com/check".into(), "yes".into());
        let mut annotations = Labels::new();
        annotations.insert("example.com/note".into(), "echo me".into());
        PodSandboxConfig {
            metadata: PodSandboxMetadata {
                name: name.clone(),
                namespace: "conformance".into(),
                uid: uid.clone(),
                attempt: 0,
            },
            log_directory: self
                .config
                .log_root
                .join(format!("conformance_{name}_{uid}")),
            labels: l,
            annotations,
            host_network: self.config.host_network,
            ..Default::default()
        }
    }

    async fn new_sandbox(&self, check: &str) -> Result<(String, PodSandboxConfig), String> {
        let config = self.sandbox_config(check);
        std::fs::create_dir_all(&config.log_directory)
            .map_err(|e| format!("creating {}: {e}", config.log_directory.display()))?;
        let id = call(
            "run_pod_sandbox",
            self.runtime.run_pod_sandbox(&config).await,
        )?;
        Ok((id, config))
    }

    fn container_config(
        &self,
        sandbox: &PodSandboxConfig,
        name: &str,
        script: &str,
    ) -> ContainerConfig {
        let mut l = sandbox.labels.clone();
        l.retain(|k, _| k.starts_with("io.kubernetes.pod."));
        l.insert(labels::CONTAINER_NAME.into(), name.into());
        let mut annotations = Labels::new();
        annotations.insert(labels::CONTAINER_HASH.into(), "1234".into());
        annotations.insert(labels::CONTAINER_RESTART_COUNT.into(), "0".into());
        let mut command = self.config.shell.clone();
        command.push(script.into());
        ContainerConfig {
            metadata: ContainerMetadata {
                name: name.into(),
                attempt: 0,
            },
            image: self.config.image.clone(),
            command,
            labels: l,
            annotations,
            log_path: format!("{name}/0.log"),
            ..Default::default()
        }
    }

    async fn start(
        &self,
        sandbox: &(String, PodSandboxConfig),
        name: &str,
        script: &str,
    ) -> Result<String, String> {
        let config = self.container_config(&sandbox.1, name, script);
        let id = call(
            "create_container",
            self.runtime
                .create_container(&sandbox.0, &config, &sandbox.1)
                .await,
        )?;
        call("start_container", self.runtime.start_container(&id).await)?;
        Ok(id)
    }

    async fn wait_state(&self, id: &str, state: ContainerState) -> Result<ContainerStatus, String> {
        let deadline = tokio::time::Instant::now() + self.config.timeout;
        loop {
            let s = call("container_status", self.runtime.container_status(id).await)?;
            if s.state == state {
                return Ok(s);
            }
            if tokio::time::Instant::now() >= deadline {
                return fail(format!(
                    "container {id} is {:?}, not {state:?}, after {:?}",
                    s.state, self.config.timeout
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stop and remove every sandbox this check made.
    async fn cleanup(&self, check: &str) {
        let mut selector = Labels::new();
        selector.insert(labels::POD_NAME.into(), Self::pod_name(check));
        let filter = SandboxFilter {
            label_selector: selector,
            ..Default::default()
        };
        for s in self
            .runtime
            .list_pod_sandboxes(&filter)
            .await
            .unwrap_or_default()
        {
            let _ = self.runtime.stop_pod_sandbox(&s.id).await;
            let _ = self.runtime.remove_pod_sandbox(&s.id).await;
        }
    }

    async fn version(&self) -> CheckResult {
        let v = call("version", self.runtime.version().await)?;
        if v.runtime_name.is_empty() {
            return fail(
                "version().runtime_name is empty (it becomes the container ID scheme, `<name>://<id>`)",
            );
        }
        Ok(())
    }

    /// A runtime without images passes; one with an [`ImageService`](crate::ImageService)
    /// finds or pulls the image, then lists it, and removing an absent image is `Ok`.
    async fn image(&self) -> CheckResult {
        let Some(images) = self.runtime.images() else {
            return Ok(());
        };
        let spec = ImageSpec::new(self.config.image.clone());
        let image = match call("image_status", images.image_status(&spec).await)? {
            Some(i) => i,
            None => {
                call(
                    "pull_image",
                    images
                        .pull_image(&spec, None, &PodSandboxConfig::default())
                        .await,
                )?;
                match call("image_status", images.image_status(&spec).await)? {
                    Some(i) => i,
                    None => {
                        return fail(
                            "image_status reports the image missing right after pull_image",
                        );
                    }
                }
            }
        };
        let listed = call("list_images", images.list_images().await)?;
        if !listed.iter().any(|i| i.id == image.id) {
            return fail(format!(
                "list_images does not list {} (image_status's ID {})",
                self.config.image, image.id
            ));
        }
        let absent = ImageSpec::new("conformance.invalid/no-such-image:absent");
        call(
            "remove_image of an absent image",
            images.remove_image(&absent).await,
        )?;
        Ok(())
    }

    async fn sandbox(&self, check: &str) -> CheckResult {
        let (id, config) = self.new_sandbox(check).await?;
        let s = call(
            "pod_sandbox_status",
            self.runtime.pod_sandbox_status(&id).await,
        )?;
        if s.metadata != config.metadata {
            return fail(format!(
                "status metadata {:?}, want {:?}",
                s.metadata, config.metadata
            ));
        }
        if s.state != SandboxState::Ready {
            return fail(format!("a new sandbox is {:?}, not Ready", s.state));
        }
        if let Err(e) = s.check_network(config.host_network) {
            return fail(format!(
                "{e} (the sandbox network contract on PodSandboxStatus)"
            ));
        }
        echoes("sandbox status labels", &s.labels, &config.labels)?;
        echoes(
            "sandbox status annotations",
            &s.annotations,
            &config.annotations,
        )?;
        let mut selector = Labels::new();
        selector.insert(labels::POD_UID.into(), config.metadata.uid.clone());
        let listed = call(
            "list_pod_sandboxes",
            self.runtime
                .list_pod_sandboxes(&SandboxFilter {
                    label_selector: selector,
                    ..Default::default()
                })
                .await,
        )?;
        match listed.as_slice() {
            [one] if one.id == id => {
                echoes("listed sandbox labels", &one.labels, &config.labels)?;
                echoes(
                    "listed sandbox annotations",
                    &one.annotations,
                    &config.annotations,
                )
            }
            other => fail(format!(
                "listing by the pod UID label gave {} sandboxes, want exactly {id}",
                other.len()
            )),
        }
    }

    async fn lifecycle(&self, check: &str) -> CheckResult {
        let sandbox = self.new_sandbox(check).await?;
        let config = self.container_config(&sandbox.1, "sleeper", "sleep 600");
        let id = call(
            "create_container",
            self.runtime
                .create_container(&sandbox.0, &config, &sandbox.1)
                .await,
        )?;
        let created = call("container_status", self.runtime.container_status(&id).await)?;
        if created.state != ContainerState::Created {
            return fail(format!(
                "a created container is {:?}, not Created",
                created.state
            ));
        }
        if created.metadata != config.metadata {
            return fail(format!(
                "status metadata {:?}, want {:?}",
                created.metadata, config.metadata
            ));
        }
        echoes("container status labels", &created.labels, &config.labels)?;
        echoes(
            "container status annotations",
            &created.annotations,
            &config.annotations,
        )?;
        call("start_container", self.runtime.start_container(&id).await)?;
        let running = self.wait_state(&id, ContainerState::Running).await?;
        if running.started_at.is_none() {
            return fail("a running container has no started_at");
        }
        let listed = call(
            "list_containers",
            self.runtime
                .list_containers(&ContainerFilter {
                    pod_sandbox_id: Some(sandbox.0.clone()),
                    state: Some(ContainerState::Running),
                    ..Default::default()
                })
                .await,
        )?;
        match listed.as_slice() {
            [one] if one.id == id => {
                echoes("listed container labels", &one.labels, &config.labels)?;
                echoes(
                    "listed container annotations",
                    &one.annotations,
                    &config.annotations,
                )?;
            }
            other => {
                return fail(format!(
                    "listing the sandbox's running containers gave {} containers, want exactly {id}",
                    other.len()
                ));
            }
        }
        match self.runtime.start_container(&id).await {
            Ok(()) => fail(
                "start_container on a running container succeeded; it must fail (FailedPrecondition)",
            ),
            Err(_) => Ok(()),
        }
    }

    async fn exits(&self, check: &str) -> CheckResult {
        let sandbox = self.new_sandbox(check).await?;
        for (name, code, reason) in [("fails", 3, "Error"), ("succeeds", 0, "Completed")] {
            let id = self.start(&sandbox, name, &format!("exit {code}")).await?;
            let s = self.wait_state(&id, ContainerState::Exited).await?;
            if s.exit_code != code || s.reason != reason {
                return fail(format!(
                    "{name}: exit code {} reason {:?}, want {code} {reason:?}",
                    s.exit_code, s.reason
                ));
            }
            // Both times are required; their order is not: containerd stamps a container that
            // exits within a millisecond with a finish time before its start time.
            if s.started_at.is_none() || s.finished_at.is_none() {
                return fail(format!(
                    "{name}: started_at {:?} finished_at {:?}, want both",
                    s.started_at, s.finished_at
                ));
            }
        }
        Ok(())
    }

    async fn stop(&self, check: &str) -> CheckResult {
        let sandbox = self.new_sandbox(check).await?;
        let id = self.start(&sandbox, "sleeper", "sleep 600").await?;
        self.wait_state(&id, ContainerState::Running).await?;
        call(
            "stop_container",
            self.runtime
                .stop_container(&id, Duration::from_secs(2))
                .await,
        )?;
        let s = self.wait_state(&id, ContainerState::Exited).await?;
        if s.exit_code <= 128 {
            return fail(format!(
                "a container stopped by a signal exited {}, want 128 + the signal (143 for SIGTERM, 137 for SIGKILL)",
                s.exit_code
            ));
        }
        call(
            "stop_container on an exited container",
            self.runtime
                .stop_container(&id, Duration::from_secs(2))
                .await,
        )
    }

    async fn update(&self, check: &str) -> CheckResult {
        let sandbox = self.new_sandbox(check).await?;
        let id = self.start(&sandbox, "resized", "sleep 600").await?;
        self.wait_state(&id, ContainerState::Running).await?;
        let r = crate::runtime::LinuxResources {
            cpu_shares: 512,
            cpu_period: 100_000,
            cpu_quota: 50_000,
            memory_limit_in_bytes: 256 << 20,
            ..Default::default()
        };
        match self.runtime.update_container_resources(&id, &r).await {
            Ok(()) => {}
            // Optional: a runtime without it says so.
            Err(e) if e.kind() == crate::ErrorKind::Unimplemented => return Ok(()),
            Err(e) => return fail(format!("update_container_resources: {e}")),
        }
        // The container keeps running under its new resources.
        self.wait_state(&id, ContainerState::Running).await?;
        not_found(
            "update_container_resources of an unknown container",
            self.runtime
                .update_container_resources("no-such-container", &r)
                .await,
        )
    }

    async fn exec(&self, check: &str) -> CheckResult {
        let sandbox = self.new_sandbox(check).await?;
        let id = self.start(&sandbox, "sleeper", "sleep 600").await?;
        self.wait_state(&id, ContainerState::Running).await?;
        let mut cmd = self.config.shell.clone();
        cmd.push("echo conformance; exit 7".into());
        let r = call(
            "exec_sync",
            self.runtime
                .exec_sync(&id, &cmd, Duration::from_secs(10))
                .await,
        )?;
        if r.exit_code != 7 || !String::from_utf8_lossy(&r.stdout).contains("conformance") {
            return fail(format!(
                "exec_sync gave exit {} stdout {:?}, want exit 7 (as Ok, not an error) and `conformance`",
                r.exit_code,
                String::from_utf8_lossy(&r.stdout)
            ));
        }
        let mut slow = self.config.shell.clone();
        slow.push("sleep 30".into());
        match self
            .runtime
            .exec_sync(&id, &slow, Duration::from_secs(1))
            .await
        {
            Err(e) if e.kind() == ErrorKind::DeadlineExceeded => {}
            other => {
                return fail(format!(
                    "an exec past its timeout gave {other:?}, want DeadlineExceeded"
                ));
            }
        }
        call(
            "stop_container",
            self.runtime.stop_container(&id, Duration::ZERO).await,
        )?;
        self.wait_state(&id, ContainerState::Exited).await?;
        match self
            .runtime
            .exec_sync(&id, &cmd, Duration::from_secs(5))
            .await
        {
            Ok(r) => fail(format!(
                "exec_sync in an exited container succeeded (exit {}); it must fail",
                r.exit_code
            )),
            Err(_) => Ok(()),
        }
    }

    async fn logs(&self, check: &str) -> CheckResult {
        let sandbox = self.new_sandbox(check).await?;
        let id = self
            .start(
                &sandbox,
                "talker",
                "echo conformance-out; echo conformance-err >&2",
            )
            .await?;
        let s = self.wait_state(&id, ContainerState::Exited).await?;
        let want = sandbox.1.log_directory.join("talker/0.log");
        if s.log_path != want {
            return fail(format!(
                "status log_path {}, want {} (the sandbox's log directory joined with the container's log_path)",
                s.log_path.display(),
                want.display()
            ));
        }
        // The runtime may flush the log shortly after the exit.
        let deadline = tokio::time::Instant::now() + self.config.timeout;
        loop {
            let text = std::fs::read_to_string(&want).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let cri = |stream: &str, msg: &str| {
                lines.iter().any(|l| {
                    let mut parts = l.splitn(4, ' ');
                    let ts = parts.next().unwrap_or_default();
                    ts.parse::<jiff::Timestamp>().is_ok()
                        && parts.next() == Some(stream)
                        && parts.next() == Some("F")
                        && parts.next() == Some(msg)
                })
            };
            if cri("stdout", "conformance-out") && cri("stderr", "conformance-err") {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return fail(format!(
                    "{} does not hold `<RFC 3339 time> stdout F conformance-out` and `... stderr F conformance-err`: {text:?}",
                    want.display()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn not_found(&self, check: &str) -> CheckResult {
        for (what, r) in [
            (
                "container_status",
                self.runtime
                    .container_status("no-such-container")
                    .await
                    .map(|_| ()),
            ),
            (
                "pod_sandbox_status",
                self.runtime
                    .pod_sandbox_status("no-such-sandbox")
                    .await
                    .map(|_| ()),
            ),
        ] {
            not_found(&format!("{what} of an unknown ID"), r)?;
        }
        let sandbox = self.new_sandbox(check).await?;
        let id = self.start(&sandbox, "quick", "exit 0").await?;
        self.wait_state(&id, ContainerState::Exited).await?;
        call("remove_container", self.runtime.remove_container(&id).await)?;
        not_found(
            "status of a removed container",
            self.runtime.container_status(&id).await,
        )?;
        call(
            "remove_container again",
            self.runtime.remove_container(&id).await,
        )
    }

    async fn teardown(&self, check: &str) -> CheckResult {
        let sandbox = self.new_sandbox(check).await?;
        let id = self.start(&sandbox, "sleeper", "sleep 600").await?;
        self.wait_state(&id, ContainerState::Running).await?;
        call(
            "stop_pod_sandbox",
            self.runtime.stop_pod_sandbox(&sandbox.0).await,
        )?;
        let s = call(
            "pod_sandbox_status",
            self.runtime.pod_sandbox_status(&sandbox.0).await,
        )?;
        if s.state != SandboxState::NotReady {
            return fail(format!("a stopped sandbox is {:?}, not NotReady", s.state));
        }
        let c = call("container_status", self.runtime.container_status(&id).await)?;
        if c.state != ContainerState::Exited {
            return fail(format!(
                "a stopped sandbox's container is {:?}, not Exited",
                c.state
            ));
        }
        call(
            "stop_pod_sandbox again",
            self.runtime.stop_pod_sandbox(&sandbox.0).await,
        )?;
        call(
            "remove_pod_sandbox",
            self.runtime.remove_pod_sandbox(&sandbox.0).await,
        )?;
        not_found(
            "status of a removed sandbox",
            self.runtime.pod_sandbox_status(&sandbox.0).await,
        )?;
        not_found(
            "a removed sandbox's container",
            self.runtime.container_status(&id).await,
        )?;
        call(
            "remove_pod_sandbox again",
            self.runtime.remove_pod_sandbox(&sandbox.0).await,
        )
    }
}

/// `r` is a `NotFound` error.
fn not_found<T: std::fmt::Debug>(what: &str, r: Result<T, Error>) -> CheckResult {
    match r {
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        other => fail(format!("{what} gave {other:?}, want NotFound")),
    }
}

/// Every entry of `want` is in `got` (runtimes may add their own).
fn echoes(what: &str, got: &Labels, want: &Labels) -> CheckResult {
    let missing: Vec<String> = want
        .iter()
        .filter(|(k, v)| got.get(*k) != Some(*v))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        fail(format!("{what} do not echo {}", missing.join(", ")))
    }
}
