//! Print this machine's stats Summary as the kubelet's `/stats/summary` would (the node only:
//! no runtime is asked). `cargo run -p kubelet-stats --example summary [root-dir]`.

use kubelet_api::AgentDirs;
use kubelet_stats::{Collector, StatsConfig};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let root_dir = std::env::args().nth(1).unwrap_or_else(|| "/".into());
    let dirs = AgentDirs {
        root_dir: root_dir.into(),
        pod_log_dir: "/var/log/pods".into(),
    };
    let mut collector = Collector::new("this-machine", dirs, StatsConfig::default());
    // Two samples a second apart, so the CPU rate is known.
    collector.collect(None).await;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let summary = collector.collect(None).await;
    match serde_json::to_string_pretty(&summary) {
        Ok(text) => println!("{text}"),
        Err(e) => eprintln!("encoding the summary: {e}"),
    }
}
