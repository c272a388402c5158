//! A custom node agent that joins a real cluster: the built-in process runtime, liveness,
//! readiness and startup probes, node-pressure eviction (with its pressure conditions on the
//! Node), and every metric on the read-only port's `/metrics`.
//!
//! Run: `cargo run -p kubelet --all-features --example cluster_agent -- KUBECONFIG NODE ROOT_DIR [READ_ONLY_PORT]`
//! (the kubeconfig holds the node's credentials); Ctrl-C stops it and leaves pods running.

use kubelet::prelude::*;

fn main() -> anyhow::Result<std::process::ExitCode> {
    // The process runtime's per-container supervisor is this same binary.
    if let Some(code) = kubelet::process::shim::maybe_run_shim() {
        return Ok(code);
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [kubeconfig, node, root, ..] = args.as_slice() else {
        anyhow::bail!("usage: cluster_agent KUBECONFIG NODE ROOT_DIR [READ_ONLY_PORT]");
    };
    let mut configuration = KubeletConfiguration::default();
    configuration.pod_logs_dir = format!("{root}/logs");
    configuration.read_only_port = args.get(3).map_or(Ok(10255), |p| p.parse())?;
    configuration.healthz_port = 0;
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
