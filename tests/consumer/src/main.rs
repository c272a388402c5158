//! The README's agent, built as an application would build it.

use kubelet::prelude::*;

async fn agent(dir: &std::path::Path) -> anyhow::Result<()> {
    let mut configuration = KubeletConfiguration::default(); // the kubelet's fields and defaults
    configuration.static_pod_path = dir.join("manifests").display().to_string();
    configuration.pod_logs_dir = dir.join("logs").display().to_string();
    let kubelet = AgentBuilder::new("node-1")
        .configuration(configuration)
        .root_dir(dir.join("root"))
        .without_server()
        .build() // process runtime, PLEG, prober, eviction
        .await?;
    let statuses = kubelet.status_reader(); // pods and their statuses, for your own API
    let shutdown = CancellationToken::new(); // cancel it to stop; pods keep running
    shutdown.cancel();
    kubelet.run(shutdown).await;
    println!("{} pods", statuses.list().len());
    Ok(())
}

/// The application's own API types and client come from the same `k8s-openapi` and `kube`.
fn own_types() -> (api::Pod, k8s_openapi::api::core::v1::Node, Option<kube::Client>) {
    (api::Pod::default(), Default::default(), None)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = own_types();
    let dir = std::env::temp_dir().join(format!("kubelet-sdk-consumer-{}", std::process::id()));
    let result = agent(&dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}
