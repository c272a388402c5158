//! The README's "Assembling an agent" example, compiled with the workspace so it stays true.
//!
//! Run: `cargo run -p minimal_kubelet --example assemble -- <manifest dir>`; Ctrl-C stops it.

use std::sync::Arc;

use kubelet_core::{ContainerRuntime, KubeletBuilder, KubeletConfig};
use kubelet_pleg::{GenericPleg, GenericPlegConfig};
use kubelet_podconfig::FileSource;
use kubelet_process::{ProcessRuntime, ProcessRuntimeConfig, ShimCommand};
use tokio_util::sync::CancellationToken;

async fn agent(manifests: &str) -> anyhow::Result<()> {
    let runtime: Arc<dyn ContainerRuntime> = Arc::new(ProcessRuntime::new(
        ProcessRuntimeConfig::new("/tmp/agent/runtime").shim(ShimCommand::CurrentExe),
    )?);
    let kubelet = KubeletBuilder::new("node-1")
        .config(KubeletConfig::with_dirs(
            "/tmp/agent/root",
            "/tmp/agent/logs",
        ))
        .pleg(Arc::new(GenericPleg::new(
            runtime.clone(),
            GenericPlegConfig::default(),
        )))
        .runtime(runtime)
        .pod_source(Arc::new(FileSource::new(manifests, "node-1")))
        .build()?;
    let statuses = kubelet.status_reader(); // pods and their statuses, for your own API
    let shutdown = CancellationToken::new(); // cancel it to stop; pods keep running
    let stop = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        stop.cancel();
    });
    kubelet.run(shutdown).await;
    println!("{} pods known at exit", statuses.list().len());
    Ok(())
}

fn main() -> anyhow::Result<()> {
    // The process runtime's per-container supervisor is this same binary.
    if let Some(code) = kubelet_process::shim::maybe_run_shim() {
        std::process::exit(if code == std::process::ExitCode::SUCCESS {
            0
        } else {
            1
        });
    }
    let manifests = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "examples/manifests".to_string());
    tokio::runtime::Runtime::new()?.block_on(agent(&manifests))
}
