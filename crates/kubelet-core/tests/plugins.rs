//! The agent plugin seam with the real engine (in-memory runtime, relist PLEG, paused time):
//! what plugins contribute at build (sources, admit handlers, metrics) is used, their node
//! conditions are readable by the others, and a plugin that fails or panics is reported with its
//! name while the agent and its pods go on.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use kubelet_api::AgentHandle;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Container, NodeCondition, Pod, PodSpec};
use kubelet_api::{
    AdmitResult, AgentPlugin, PluginContext, PluginState, PodAdmitHandler, PodSource, SourceSender,
};
use kubelet_core::prometheus_client::metrics::counter::Counter;
use kubelet_core::prometheus_client::registry::Registry;
use kubelet_core::testing::{FakeRuntime, RecordingSink};
use kubelet_core::{KubeletBuilder, KubeletConfig, KubeletError};
use kubelet_pleg::GenericPleg;
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

fn pod(name: &str) -> Pod {
    let mut p = Pod {
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "app".into(),
                image: Some("busybox".into()),
                ..Default::default()
            }],
            host_network: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    };
    p.metadata.name = Some(name.into());
    p.metadata.namespace = Some("default".into());
    p.metadata.uid = Some(format!("uid-{name}"));
    p
}

/// A source with fixed pods.
struct Pods(Vec<Pod>);

#[async_trait]
impl PodSource for Pods {
    fn name(&self) -> &str {
        "file"
    }
    async fn run(&self, out: SourceSender, shutdown: CancellationToken) {
        let _ = out.snapshot(self.0.clone()).await;
        shutdown.cancelled().await;
    }
}

/// Rejects pods named `denied`.
struct DenyNamed;

impl PodAdmitHandler for DenyNamed {
    fn admit(&self, pod: &Pod, _: &[std::sync::Arc<Pod>]) -> AdmitResult {
        if pod.metadata.name.as_deref() == Some("denied") {
            AdmitResult::reject("Denied", "the test plugin says no")
        } else {
            AdmitResult::admit()
        }
    }
}

/// Contributes a source, an admit handler, a metric and a condition; its loop reads every
/// plugin's conditions and counts into its metric until shutdown.
#[derive(Default)]
struct Contributor {
    counter: Counter,
    seen_conditions: Mutex<Vec<String>>,
}

#[async_trait]
impl AgentPlugin for Contributor {
    fn name(&self) -> &str {
        "contributor"
    }
    fn pod_sources(&self) -> Vec<Arc<dyn PodSource>> {
        vec![Arc::new(Pods(vec![pod("ok"), pod("denied")]))]
    }
    fn admit_handlers(&self) -> Vec<Arc<dyn PodAdmitHandler>> {
        vec![Arc::new(DenyNamed)]
    }
    fn register_metrics(&self, registry: &mut Registry) {
        registry.register("test_plugin_ticks", "Ticks.", self.counter.clone());
    }
    fn node_conditions(&self) -> Vec<NodeCondition> {
        vec![NodeCondition {
            type_: "TestCondition".into(),
            status: "False".into(),
            ..Default::default()
        }]
    }
    async fn run(
        &self,
        ctx: PluginContext,
        shutdown: CancellationToken,
    ) -> kubelet_api::Result<()> {
        assert_eq!(ctx.node_name(), "node-1");
        *self.seen_conditions.lock() = ctx
            .node_conditions()
            .conditions()
            .into_iter()
            .map(|c| c.type_)
            .collect();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = tokio::time::sleep(Duration::from_secs(1)) => { self.counter.inc(); }
            }
        }
    }
}

/// Fails at once.
struct Failing;

#[async_trait]
impl AgentPlugin for Failing {
    fn name(&self) -> &str {
        "failing"
    }
    fn node_conditions(&self) -> Vec<NodeCondition> {
        vec![NodeCondition {
            type_: "FailingCondition".into(),
            status: "Unknown".into(),
            ..Default::default()
        }]
    }
    async fn run(&self, _: PluginContext, _: CancellationToken) -> kubelet_api::Result<()> {
        Err(kubelet_api::Error::unavailable("backend unreachable"))
    }
}

/// Panics in its loop.
struct Panicking;

#[async_trait]
impl AgentPlugin for Panicking {
    fn name(&self) -> &str {
        "panicking"
    }
    async fn run(&self, _: PluginContext, _: CancellationToken) -> kubelet_api::Result<()> {
        tokio::time::sleep(Duration::from_millis(10)).await;
        panic!("plugin bug");
    }
}

fn builder(dir: &std::path::Path) -> KubeletBuilder {
    let runtime = Arc::new(FakeRuntime::new());
    let (pleg, pleg_events) = GenericPleg::new(runtime.clone(), Default::default());
    let pleg = std::sync::Arc::new(pleg);
    KubeletBuilder::new("node-1")
        .config(KubeletConfig::with_dirs(dir.join("root"), dir.join("logs")))
        .runtime(runtime)
        .pleg(pleg, pleg_events)
}

#[tokio::test(start_paused = true)]
async fn plugins_contribute_at_build_and_failing_ones_do_not_take_the_agent_down() {
    let tmp = tempfile::tempdir().unwrap();
    let sink = Arc::new(RecordingSink::new());
    let contributor = Arc::new(Contributor::default());
    let kubelet = builder(tmp.path())
        .status_sink(sink.clone())
        .plugin(Arc::new(Failing))
        .plugin(Arc::new(Panicking))
        .plugin(contributor.clone())
        .build()
        .unwrap();
    let handle = kubelet.handle();
    let names: Vec<String> = handle.plugins().into_iter().map(|p| p.name).collect();
    assert_eq!(names, ["failing", "panicking", "contributor"]);
    assert!(
        handle
            .plugins()
            .iter()
            .all(|p| p.state == PluginState::Registered)
    );
    let shutdown = CancellationToken::new();
    let agent = tokio::spawn(kubelet.run(shutdown.clone()));

    // The plugin's source runs pods; its admit handler rejects one.
    let running = sink
        .wait_for(
            |r| r.name == "ok" && r.status.phase.as_deref() == Some("Running"),
            Duration::from_secs(30),
        )
        .await;
    assert!(running.is_some(), "the plugin's pod runs");
    let denied = sink
        .wait_for(
            |r| r.name == "denied" && r.status.phase.as_deref() == Some("Failed"),
            Duration::from_secs(30),
        )
        .await
        .expect("the plugin's admit handler rejects `denied`");
    assert_eq!(denied.status.reason.as_deref(), Some("Denied"));

    // Failures are reported with the plugin's name.
    for (name, text) in [
        (
            "failing",
            "plugin failing failed: unavailable: backend unreachable",
        ),
        ("panicking", "plugin panicking panicked: plugin bug"),
    ] {
        let event = sink
            .wait_for_event(
                |e| e.reason == "PluginFailed" && e.message.contains(name),
                Duration::from_secs(30),
            )
            .await
            .unwrap_or_else(|| panic!("no PluginFailed event for {name}"));
        assert_eq!(event.message, text);
    }
    let states: Vec<PluginState> = handle.plugins().into_iter().map(|p| p.state).collect();
    assert_eq!(
        states,
        [
            PluginState::Failed("unavailable: backend unreachable".into()),
            PluginState::Panicked("plugin bug".into()),
            PluginState::Running,
        ]
    );
    // Every plugin's conditions are readable, the failed one's included.
    assert_eq!(
        *contributor.seen_conditions.lock(),
        ["FailingCondition", "TestCondition"]
    );

    // The agent goes on: the contributor keeps ticking, registered once in the agent's registry.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut text = String::new();
    kubelet_core::prometheus_client::encoding::text::encode(&mut text, &handle.metrics()).unwrap();
    assert_eq!(
        text.matches("# TYPE test_plugin_ticks counter").count(),
        1,
        "{text}"
    );
    assert!(contributor.counter.get() >= 5);
    assert!(
        text.contains("kubelet_pleg_relist_duration_seconds"),
        "the PLEG's metrics are registered by the builder:\n{text}"
    );

    shutdown.cancel();
    agent.await.unwrap();
    assert_eq!(handle.plugins()[2].state, PluginState::Stopped);
}

#[test]
fn two_plugins_with_one_name_are_a_build_error() {
    let tmp = tempfile::tempdir().unwrap();
    let err = builder(tmp.path())
        .plugin(Arc::new(Failing))
        .plugin(Arc::new(Failing))
        .build()
        .unwrap_err();
    assert!(
        matches!(err, KubeletError::BuildDuplicatePlugin(ref n) if n == "failing"),
        "{err}"
    );
}

/// Reports `conditions` as they are, however many and repeated.
struct Reports(&'static str, Vec<NodeCondition>);

#[async_trait]
impl AgentPlugin for Reports {
    fn name(&self) -> &str {
        self.0
    }
    fn node_conditions(&self) -> Vec<NodeCondition> {
        self.1.clone()
    }
    async fn run(&self, _: PluginContext, shutdown: CancellationToken) -> kubelet_api::Result<()> {
        shutdown.cancelled().await;
        Ok(())
    }
}

fn condition(type_: &str, status: &str) -> NodeCondition {
    NodeCondition {
        type_: type_.into(),
        status: status.into(),
        ..Default::default()
    }
}

#[tokio::test(start_paused = true)]
async fn the_handle_shows_every_plugins_node_conditions_merged_as_the_node_status_has_them() {
    let tmp = tempfile::tempdir().unwrap();
    let first = Reports(
        "first",
        vec![
            condition("MemoryPressure", "False"),
            condition("Ready", "True"),
            condition("EdgeLink", "True"),
            condition("EdgeLink", "False"),
        ],
    );
    // A huge list that repeats one type.
    let flood = Reports(
        "flood",
        (0..500)
            .map(|i| condition(&format!("Flood{}", i % 100), "True"))
            .chain([condition("EdgeLink", "Unknown")])
            .collect(),
    );
    let kubelet = builder(tmp.path())
        .plugin(Arc::new(first))
        .plugin(Arc::new(flood))
        .build()
        .unwrap();
    let handle = kubelet.handle();
    let shutdown = CancellationToken::new();
    let agent = tokio::spawn(kubelet.run(shutdown.clone()));
    let got = handle.node_conditions();
    assert_eq!(got.len(), kubelet_api::MAX_NODE_CONDITIONS);
    let types: Vec<&str> = got.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(&types[..3], ["MemoryPressure", "EdgeLink", "Flood0"]);
    assert!(
        !types.contains(&"Ready"),
        "Ready is the node status writer's"
    );
    let edge = got.iter().find(|c| c.type_ == "EdgeLink").unwrap();
    assert_eq!(
        edge.status, "True",
        "the first plugin's condition of a type wins"
    );
    let mut unique = types.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), types.len(), "one condition per type");
    // Reading again gives the same (and does not log again).
    assert_eq!(handle.node_conditions(), got);
    shutdown.cancel();
    agent.await.unwrap();
}
