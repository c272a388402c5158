//! `kubelet-process`: the kubelet SDK's built-in container runtime. Each container runs as a
//! supervised process on the host; no images, no namespaces.
//!
//! Start with [`ProcessRuntime`] (a [`ContainerRuntime`](kubelet_api::ContainerRuntime)) and
//! [`ProcessRuntimeConfig`]; hand the runtime to the engine's builder.
//!
//! # What a "container" is here
//! - **Command.** `command` + `args` run directly (no shell); when `command` is empty, `args`
//!   alone is the command line. With neither, `create_container` fails with `InvalidArgument`.
//! - **Images are recorded, not pulled.** `image_status` always reports the image as present
//!   (its ID is the image string) and `pull_image` returns the image string; the process runs
//!   from the host's filesystem.
//! - **Environment.** Exactly the (already expanded) env the engine passes, plus `PATH` when
//!   absent; nothing is inherited from the agent.
//! - **Working directory.** `workingDir`, created if missing; default: a directory shared by
//!   the pod's containers under the sandbox's state directory.
//! - **Logs.** stdout/stderr are written in the CRI log format
//!   (`<RFC3339Nano> stdout|stderr F|P <line>`) to `<sandbox log_directory>/<log_path>`.
//! - **Exit.** Exit code and reason (`Completed`, `Error`, `OOMKilled` when the cgroup's
//!   OOM-kill counter says so); 128+n when killed by signal n (137 for SIGKILL). A command that
//!   cannot be executed leaves the container `Exited` with code 128, reason `StartError`.
//! - **Stop.** SIGTERM to the container's process group, SIGKILL after the timeout.
//! - **Network.** Always the host network: the pod IP is the host's primary IP (or
//!   `127.0.0.1`), and sandbox status says `host_network = true`.
//! - **Mounts** cannot be applied without a mount namespace: a container with mounts gets a
//!   Warning event `MountsNotSupported` naming them, and runs on the host filesystem.
//! - **Resources.** As root, with a cgroup hierarchy (v1 or v2, detected from
//!   `/proc/self/mountinfo`), every container gets its own cgroup with the memory limit, CPU
//!   shares/quota and cpuset applied: `<hierarchy>/<pod cgroup>/<container id>` when the
//!   sandbox was given a cgroup parent (the agent's pod cgroup), else
//!   `<hierarchy>/<cgroup_parent>/<sandbox id>/<container id>`; `container_stats` reads usage
//!   from it, `update_container_resources` rewrites it, and the shim sets the container's
//!   `oom_score_adj` (a lower value needs `CAP_SYS_RESOURCE`; without it the inherited one
//!   stays). Without root or cgroups the
//!   container runs unlimited and a Warning event `ResourceLimitsNotEnforced` says so.
//!
//! # Events
//! [`container_events`](kubelet_api::ContainerRuntime::container_events) reports container
//! and sandbox changes as they happen, from inotify on the state directory (the records the
//! runtime and the shims rename into place), for an evented PLEG. A new agent watches the
//! containers a previous agent left running and learns their exits too.
//!
//! # Exec, attach and port-forward
//!
//! The runtime serves them itself ([`ContainerRuntime::streaming`](kubelet_api::ContainerRuntime::streaming)):
//! exec runs the command like an exec probe (the container's environment, working directory,
//! user and cgroup; a pseudo-terminal with `tty`); attach follows the container's log and, for
//! `stdin: true` containers, writes to the FIFO the shim gives the process as standard input;
//! port-forward connects to the host's loopback. `kubelet-server` carries them to kubectl.
//!
//! # Surviving the agent
//! Every container has a supervisor process, the [`shim`], in its own session. Containers keep
//! running when the agent exits, and a new `ProcessRuntime` on the same root directory finds
//! them (same PID) and still learns their exit status. The shim is either the
//! `kubelet-process-shim` binary of this crate or the host binary itself (see
//! [`ShimCommand`] and [`shim::maybe_run_shim`]). A service manager that kills the agent's whole
//! cgroup on stop (systemd's default `KillMode=control-group`) would take the shims with it:
//! run the agent with `KillMode=process`.
//!
//! # Faults
//! - **A killed shim** takes its container with it (the container's parent-death signal is
//!   SIGKILL); the event stream sees the shim die through a pidfd, and the runtime records the
//!   exit (137, or the status a zombie still holds) and kills what is left.
//! - **State removed under it** (the root directory deleted or replaced): the runtime puts back
//!   the records of the containers it knows that still run or whose exit it knows, from memory,
//!   and logs one warning; the event stream fails so that the consumer relists and
//!   resubscribes. No container is started twice.
//! - **A full disk**: state writes fail with [`ProcessError::NoSpace`]; exits are still recorded
//!   (in place, in a preallocated `exit.slot`, or in memory until there is room); removing works.
//!
//! See docs/architecture.md, "The process runtime", for the details.
//!
//! # Example
//! ```no_run
//! use kubelet_api::ContainerRuntime;
//! use kubelet_api::runtime::{ContainerConfig, ContainerMetadata, PodSandboxConfig};
//! use kubelet_process::{ProcessRuntime, ProcessRuntimeConfig, ShimCommand};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let runtime = ProcessRuntime::new(
//!     ProcessRuntimeConfig::new("/tmp/kubelet-process")
//!         .shim(ShimCommand::Path("/usr/local/bin/kubelet-process-shim".into())),
//! )?;
//! // The runtime model's structs are `#[non_exhaustive]`: start from a constructor (or
//! // `Default`) and set the fields.
//! let mut sandbox = PodSandboxConfig::default();
//! sandbox.log_directory = "/tmp/kubelet-process/logs/default_demo_uid1".into();
//! let sid = runtime.run_pod_sandbox(&sandbox).await?;
//! let mut container = ContainerConfig::new(ContainerMetadata::default(), "");
//! container.command = vec!["/bin/sh".into(), "-c".into(), "echo hello; sleep 10".into()];
//! container.log_path = "demo/0.log".into();
//! let cid = runtime.create_container(&sid, &container, &sandbox).await?;
//! runtime.start_container(&cid).await?;
//! runtime.stop_container(&cid, std::time::Duration::from_secs(2)).await?;
//! # Ok(()) }
//! ```

mod cgroup;
pub mod config;
pub mod error;
mod events;
mod execs;
mod pidfd;
mod record;
pub mod runtime;
pub mod shim;
mod streaming;

pub use config::{ProcessRuntimeConfig, ShimCommand};
pub use error::ProcessError;
pub use runtime::{ProcessRuntime, container_env};
