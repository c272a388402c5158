//! The README's "Assembling an agent" example, compiled with the workspace so it stays true:
//! static pods from a directory on the built-in process runtime, with probes, eviction and the
//! healthz port.
//!
//! Run: `cargo run -p kubelet --example assemble -- <manifest dir>`; Ctrl-C stops it.

use kubelet::prelude::*;

async fn agent(manifests: String) -> anyhow::Result<()> {
    let mut configuration = KubeletConfiguration::default();
    configuration.static_pod_path = manifests;
    configuration.pod_logs_dir = "/tmp/agent/logs".into();
    let kubelet = AgentBuilder::new("node-1")
        .configuration(configuration)
        .root_dir("/tmp/agent/root")
        .build()
        .await?;
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

fn main() -> anyhow::Result<std::process::ExitCode> {
    // The process runtime's per-container supervisor is this same binary.
    if let Some(code) = kubelet::process::shim::maybe_run_shim() {
        return Ok(code);
    }
    tracing_subscriber::fmt()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    let manifests = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "examples/manifests".into());
    tokio::runtime::Runtime::new()?.block_on(agent(manifests))?;
    Ok(std::process::ExitCode::SUCCESS)
}
