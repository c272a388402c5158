//! Watch a static pod directory (or poll a manifest URL) and print the merged pod updates,
//! using only `kubelet-podconfig`.
//!
//! ```text
//! cargo run -p kubelet-podconfig --example watch_dir -- /etc/kubernetes/manifests my-node
//! cargo run -p kubelet-podconfig --example watch_dir -- http://127.0.0.1:8000/pods.yaml my-node
//! ```
//!
//! Drop, edit or delete manifests in the directory and watch ADD / REMOVE updates arrive;
//! invalid manifests show up as `FailedValidation` warnings. Ctrl-C stops.

use std::sync::Arc;

use kubelet_api::EventRecorder;
use kubelet_core::merge::PodConfig;
use kubelet_podconfig::{FileSource, HttpSource, HttpSourceConfig};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let mut args = std::env::args().skip(1);
    let dir = args.next().ok_or_else(|| {
        anyhow::anyhow!("usage: watch_dir <manifest dir, file or URL> [node name]")
    })?;
    let node = args.next().unwrap_or_else(|| "localhost".to_string());

    let (recorder, mut events) = EventRecorder::channel(100);
    let mut config = PodConfig::new(recorder);
    if dir.starts_with("http://") || dir.starts_with("https://") {
        config.add_source(Arc::new(HttpSource::new(
            dir,
            node,
            HttpSourceConfig::default(),
        )?))?;
    } else {
        config.add_source(Arc::new(FileSource::new(dir, node)))?;
    }

    let shutdown = CancellationToken::new();
    let (mut updates, run) = config.start(shutdown.clone());
    let run = tokio::spawn(run);

    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            Some(ev) = events.recv() => {
                println!("EVENT {} {}: {}", ev.type_.as_str(), ev.reason, ev.message);
            }
            update = updates.recv() => {
                let Some(update) = update else { break };
                let pods: Vec<String> = update
                    .pods
                    .iter()
                    .map(|p| {
                        format!(
                            "{}/{} ({})",
                            p.metadata.namespace.as_deref().unwrap_or(""),
                            p.metadata.name.as_deref().unwrap_or(""),
                            p.metadata.uid.as_deref().unwrap_or("")
                        )
                    })
                    .collect();
                println!("{:?} from {}: [{}]", update.op, update.source, pods.join(", "));
            }
        }
    }
    shutdown.cancel();
    run.await?;
    Ok(())
}
