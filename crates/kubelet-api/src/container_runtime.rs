//! The [`ContainerRuntime`] trait: the seam a backend implements. Its model types live in
//! [`crate::runtime`].

use std::time::Duration;

use async_trait::async_trait;

use crate::error::Result;
use crate::runtime::{
    Container, ContainerConfig, ContainerEventStream, ContainerFilter, ContainerStats,
    ContainerStatus, ExecResult, PodSandbox, PodSandboxConfig, PodSandboxStatus, RuntimeStatus,
    RuntimeVersion, SandboxFilter,
};

/// A container runtime, shaped like CRI v1's RuntimeService and ImageService.
///
/// Implement this to plug a new backend into the engine; everything above it (restarts, backoff,
/// init and sidecar ordering, probes, eviction, status) comes from the SDK. Every method must be
/// safe to call concurrently.
///
/// # The contract the engine relies on
///
/// `kubelet_api::conformance` (feature `testing`) checks all of it
/// against a runtime in one call; `examples/custom_runtime.rs` is a toy runtime that passes it.
///
/// * **Identity is in the labels.** The engine keeps no state of its own: it rebuilds pods from
///   the runtime after a restart. Sandboxes must echo their config's `metadata`, `labels` and
///   `annotations` in [`pod_sandbox_status`](Self::pod_sandbox_status) and
///   [`list_pod_sandboxes`](Self::list_pod_sandboxes); containers their `metadata`, `labels` and
///   `annotations` in [`container_status`](Self::container_status) and
///   [`list_containers`](Self::list_containers) (extra entries of the runtime's own are fine).
///   Label selectors in filters match when every selector entry is present.
/// * **States.** A new sandbox is `Ready`, a stopped one `NotReady`. A created container is
///   `Created`, `Running` after [`start_container`](Self::start_container) (with `started_at`),
///   `Exited` once its process ended (with `finished_at` and `exit_code`).
/// * **Reasons and exit codes are the runtime's.** An exited container's `reason` is
///   `Completed` for exit code 0 and `Error` otherwise (`OOMKilled` when the kernel killed it for
///   memory); a container ended by signal `n` exits `128 + n` (143 after the `SIGTERM` of
///   [`stop_container`](Self::stop_container), 137 after `SIGKILL`).
/// * **Errors.** Unknown IDs are [`ErrorKind::NotFound`](crate::ErrorKind) in status calls.
///   Stop and remove are idempotent: on objects already stopped or gone they return `Ok`.
///   Starting a container that is not `Created`, and `exec_sync` in a container that is not
///   running, fail (use [`ErrorKind::FailedPrecondition`](crate::ErrorKind); the engine does not
///   branch on the kind). `exec_sync` reports the command's exit code in `Ok`, not as an
///   error; a command past its timeout is [`ErrorKind::DeadlineExceeded`](crate::ErrorKind).
/// * **The newest instance** of a container name in a pod is the one with the highest
///   `metadata.attempt` (the engine sets it to the restart count); the engine removes older dead
///   instances itself.
/// * **Logs.** A container writes its stdout and stderr to `log_directory` of its sandbox joined
///   with its config's `log_path`, in the CRI log format (`<RFC 3339 time> <stdout|stderr> <F|P>
///   <text>` per line), and reports that absolute path as `log_path` in its status. The engine
///   creates `log_directory` before [`run_pod_sandbox`](Self::run_pod_sandbox).
/// * **Networking.** A sandbox IP is optional: host-network sandboxes have none, and the engine
///   reports the node's IP then. A runtime without pod networking may treat every sandbox as
///   host-network and say so in [`pod_sandbox_status`](Self::pod_sandbox_status).
///
/// # Growing without breaking implementors
///
/// Optional capabilities are default methods answering [`Error::unsupported`](crate::Error)
/// ([`ErrorKind::Unimplemented`](crate::ErrorKind)): [`container_stats`](Self::container_stats),
/// [`reopen_container_log`](Self::reopen_container_log),
/// [`container_events`](Self::container_events). Callers
/// check [`Error::is_unsupported`](crate::Error::is_unsupported) and fall back (relisting,
/// nodefs) or pass the clear message on. A capability with several operations (streaming,
/// image management, stats, resource updates) is a small trait of its own, reached through one
/// default method returning `None` here (as CRI splits its runtime and image services), so an
/// implementor adds it by implementing that trait and overriding one method. A new capability
/// is added only with a real implementation in a built-in runtime.
#[async_trait]
pub trait ContainerRuntime: Send + Sync + 'static {
    /// Runtime name and version.
    async fn version(&self) -> Result<RuntimeVersion>;
    /// Runtime health conditions.
    async fn status(&self) -> Result<RuntimeStatus>;

    /// Create and start a sandbox; returns its ID.
    async fn run_pod_sandbox(&self, config: &PodSandboxConfig) -> Result<String>;
    /// Stop a sandbox and every container in it. Idempotent.
    async fn stop_pod_sandbox(&self, sandbox_id: &str) -> Result<()>;
    /// Remove a stopped sandbox and its containers. Idempotent.
    async fn remove_pod_sandbox(&self, sandbox_id: &str) -> Result<()>;
    /// Status of one sandbox.
    async fn pod_sandbox_status(&self, sandbox_id: &str) -> Result<PodSandboxStatus>;
    /// List sandboxes matching `filter`.
    async fn list_pod_sandboxes(&self, filter: &SandboxFilter) -> Result<Vec<PodSandbox>>;

    /// Create a container in a sandbox; returns its ID. The container is not started.
    async fn create_container(
        &self,
        sandbox_id: &str,
        config: &ContainerConfig,
        sandbox_config: &PodSandboxConfig,
    ) -> Result<String>;
    /// Start a created container.
    async fn start_container(&self, container_id: &str) -> Result<()>;
    /// Stop a container: the stop signal, then SIGKILL after `timeout` (0 = kill at once).
    async fn stop_container(&self, container_id: &str, timeout: Duration) -> Result<()>;
    /// Remove a container. Idempotent.
    async fn remove_container(&self, container_id: &str) -> Result<()>;
    /// List containers matching `filter`.
    async fn list_containers(&self, filter: &ContainerFilter) -> Result<Vec<Container>>;
    /// Status of one container.
    async fn container_status(&self, container_id: &str) -> Result<ContainerStatus>;
    /// Run a command in a container and wait for it, at most `timeout`.
    /// A command that times out returns [`ErrorKind::DeadlineExceeded`](crate::ErrorKind).
    async fn exec_sync(
        &self,
        container_id: &str,
        cmd: &[String],
        timeout: Duration,
    ) -> Result<ExecResult>;

    /// Usage figures for one container. Optional: the default reports
    /// [`ErrorKind::Unimplemented`](crate::ErrorKind).
    async fn container_stats(&self, container_id: &str) -> Result<ContainerStats> {
        Err(crate::Error::new(
            crate::ErrorKind::Unimplemented,
            format!("container_stats is not supported by this runtime ({container_id})"),
        ))
    }

    /// Usage figures of every container (CRI `ListContainerStats`): one call for a stats
    /// collection instead of one per container. The default lists the containers and asks
    /// [`container_stats`](Self::container_stats) for each running one, leaving out those
    /// that vanish meanwhile; a runtime with a listing call overrides it.
    async fn list_container_stats(&self) -> Result<Vec<ContainerStats>> {
        let filter = crate::runtime::ContainerFilter {
            state: Some(crate::runtime::ContainerState::Running),
            ..Default::default()
        };
        let mut out = Vec::new();
        for c in self.list_containers(&filter).await? {
            match self.container_stats(&c.id).await {
                Ok(s) => out.push(s),
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Usage figures of every ready pod sandbox (CRI `ListPodSandboxStats`), for what only the
    /// sandbox has: its network interfaces. Optional: the default reports
    /// [`ErrorKind::Unimplemented`](crate::ErrorKind) (a runtime whose pods share the host's
    /// network, such as the process runtime, has nothing to add).
    async fn list_pod_sandbox_stats(&self) -> Result<Vec<crate::runtime::PodSandboxStats>> {
        Err(crate::Error::new(
            crate::ErrorKind::Unimplemented,
            "list_pod_sandbox_stats is not supported by this runtime",
        ))
    }

    /// Change the resources of a running container (CRI `UpdateContainerResources`): its CPU
    /// shares, quota and period, memory limit and cpuset, as in `resources` (the CPU manager
    /// moves containers between CPU sets with it). Optional: the default reports
    /// [`ErrorKind::Unimplemented`](crate::ErrorKind).
    async fn update_container_resources(
        &self,
        container_id: &str,
        resources: &crate::runtime::LinuxResources,
    ) -> Result<()> {
        let _ = (container_id, resources);
        Err(crate::Error::unsupported("update_container_resources"))
    }

    /// Reopen the log file of a running container (CRI `ReopenContainerLog`): the runtime
    /// closes the file it writes the container's output to and opens `log_path` anew, so that a
    /// log rotator can rename the full file away. Optional: the default reports
    /// [`ErrorKind::Unimplemented`](crate::ErrorKind), and logs of such a runtime are not
    /// rotated.
    async fn reopen_container_log(&self, container_id: &str) -> Result<()> {
        let _ = container_id;
        Err(crate::Error::unsupported("reopen_container_log"))
    }

    /// A stream of container lifecycle events pushed by the runtime (CRI `GetContainerEvents`,
    /// containerd task events, the process runtime's exit notifications), for an evented PLEG.
    ///
    /// Optional: the default reports [`ErrorKind::Unimplemented`](crate::ErrorKind), and a PLEG
    /// then relies on relisting alone. The stream ends or yields an error when the connection
    /// breaks; the caller calls again to resubscribe. Events may be lost or duplicated across a
    /// resubscription: consumers must treat them as hints and keep a relist as the safety net.
    async fn container_events(&self) -> Result<ContainerEventStream> {
        Err(crate::Error::unsupported("container_events"))
    }

    /// The runtime's images ([`ImageService`](crate::ImageService)): listing, inspection,
    /// pulls with credentials, removal and the image filesystem's usage. `None`, the default:
    /// the runtime runs programs of the host (the process runtime) and has no images, and so no
    /// root filesystems of its own; the engine then pulls nothing, records no
    /// `Pulling`/`Pulled` events and mounts no kubelet-managed `/etc/hosts`, and image garbage
    /// collection has nothing to do. Wrappers must pass the inner runtime's answer on (or
    /// answer with themselves, wrapping the inner one's).
    fn images(&self) -> Option<&dyn crate::ImageService> {
        None
    }

    /// Exec, attach and port-forward ([`StreamingRuntime`](crate::StreamingRuntime)), for the
    /// kubelet API's `/exec`, `/attach`, `/portForward` and `/run`. `None`, the default: the
    /// runtime has none, and the server answers those requests with a clear "not supported"
    /// error. Wrappers must pass the inner runtime's answer on.
    fn streaming(&self) -> Option<&dyn crate::StreamingRuntime> {
        None
    }

    /// Register the runtime's own metrics (the CRI runtime's `kubelet_runtime_operations_*`)
    /// in the agent's registry; called once by
    /// the engine's `KubeletBuilder::build`. The default registers nothing.
    fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        let _ = registry;
    }
}
