//! A custom node agent that joins a real cluster: the built-in process runtime, liveness,
//! readiness and startup probes, node-pressure eviction (with its pressure conditions on the
//! Node), and every metric on the read-only port's `/metrics` (when `readOnlyPort` is set).
//!
//! Run: `cargo run -p kubelet --all-features --example cluster_agent -- KUBECONFIG NODE ROOT_DIR [CONFIGURATION_JSON]`
//! (the kubeconfig holds the node's credentials; the optional file is a `KubeletConfiguration`
//! as JSON, e.g. `{"readOnlyPort": 10255}`); Ctrl-C stops it and leaves pods running.

use kubelet::prelude::*;

fn main() -> anyhow::Result<std::process::ExitCode> {
    // The process runtime's per-container supervisor is this same binary.
    if let Some(code) = kubelet::process::shim::maybe_run_shim() {
        return Ok(code);
    }
    tracing_subscriber::fmt()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [kubeconfig, node, root, ..] = args.as_slice() else {
        anyhow::bail!("usage: cluster_agent KUBECONFIG NODE ROOT_DIR [CONFIGURATION_JSON]");
    };
    // The kubelet's configuration (its field names and defaults), from a file when given.
    let configuration: KubeletConfiguration = match args.get(3) {
        Some(path) => serde_json::from_slice(&std::fs::read(path)?)?,
        None => KubeletConfiguration::default(),
    };
    tokio::runtime::Runtime::new()?.block_on(async {
        let agent = AgentBuilder::new(node.as_str())
            .configuration(configuration)
            .root_dir(root)
            .kubeconfig(kubeconfig)
            .build()
            .await?;
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        tokio::spawn(async move { (tokio::signal::ctrl_c().await, stop.cancel()) });
        agent.run(shutdown).await;
        Ok(std::process::ExitCode::SUCCESS)
    })
}
