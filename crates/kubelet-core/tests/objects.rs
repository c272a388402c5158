//! ConfigMaps and Secrets through the engine (in-memory runtime, paused time): env references
//! that cannot be resolved hold the container in `CreateContainerConfigError` until the object
//! appears; `configMap` volumes are written before the container starts and follow updates on
//! later syncs; a volume whose object disappears keeps its content without blocking the pod.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapKeySelector, ConfigMapVolumeSource, Container, EnvVar, EnvVarSource, Pod,
    PodSpec, PodStatus, Volume, VolumeMount,
};
use kubelet_api::{ContainerRuntime, PodSource, SourceSender, StaticObjects};
use kubelet_core::testing::{FakeRuntime, RecordingSink};
use kubelet_core::{KubeletBuilder, KubeletConfig};
use kubelet_pleg::{GenericPleg, GenericPlegConfig};
use tokio_util::sync::CancellationToken;

struct OnePod(Pod);

#[async_trait]
impl PodSource for OnePod {
    fn name(&self) -> &str {
        "api"
    }
    async fn run(&self, out: SourceSender, shutdown: CancellationToken) {
        let _ = out.snapshot(vec![self.0.clone()]).await;
        shutdown.cancelled().await;
    }
}

fn config_map(name: &str, data: &str) -> ConfigMap {
    let mut cm = ConfigMap {
        data: Some([("key".to_string(), data.to_string())].into()),
        ..Default::default()
    };
    cm.metadata.name = Some(name.into());
    cm.metadata.namespace = Some("default".into());
    cm
}

fn pod() -> Pod {
    let mut p = Pod {
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "app".into(),
                image: Some("busybox:1".into()),
                env: Some(vec![EnvVar {
                    name: "SETTING".into(),
                    value_from: Some(EnvVarSource {
                        config_map_key_ref: Some(ConfigMapKeySelector {
                            name: "settings".into(),
                            key: "key".into(),
                            optional: None,
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                volume_mounts: Some(vec![VolumeMount {
                    name: "conf".into(),
                    mount_path: "/etc/conf".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }],
            volumes: Some(vec![
                Volume {
                    name: "conf".into(),
                    config_map: Some(ConfigMapVolumeSource {
                        name: "files".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                Volume {
                    name: "opt".into(),
                    config_map: Some(ConfigMapVolumeSource {
                        name: "absent".into(),
                        optional: Some(true),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ]),
            host_network: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    };
    p.metadata.name = Some("web".into());
    p.metadata.namespace = Some("default".into());
    p.metadata.uid = Some("uid-objects".into());
    p
}

fn waiting_reason(s: &PodStatus) -> Option<(String, String)> {
    s.container_statuses.iter().flatten().find_map(|c| {
        let w = c.state.as_ref()?.waiting.as_ref()?;
        Some((w.reason.clone()?, w.message.clone().unwrap_or_default()))
    })
}

#[tokio::test(start_paused = true)]
async fn missing_config_map_blocks_the_container_until_it_appears_and_volumes_follow_updates_until_it_is_deleted()
 {
    let dir = std::env::temp_dir().join(format!("kubelet-core-objects-{}", std::process::id()));
    let rt = Arc::new(FakeRuntime::new());
    let runtime: Arc<dyn ContainerRuntime> = rt.clone();
    let (pleg, pleg_events) = GenericPleg::new(runtime.clone(), GenericPlegConfig::default());
    let pleg = std::sync::Arc::new(pleg);
    let sink = Arc::new(RecordingSink::new());
    let objects = StaticObjects::new();
    objects.put_config_map(config_map("files", "v1"));
    let mut config = KubeletConfig::with_dirs(dir.join("root"), dir.join("logs"));
    config.sync_frequency = Duration::from_secs(10);
    let kubelet = KubeletBuilder::new("node-1")
        .config(config)
        .runtime(runtime)
        .pleg(pleg, pleg_events)
        .pod_source(Arc::new(OnePod(pod())))
        .status_sink(sink.clone())
        .object_provider(Arc::new(objects.clone()))
        .build()
        .expect("build");
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(kubelet.run(shutdown.clone()));

    let blocked = sink
        .wait_for(
            |r| {
                waiting_reason(&r.status)
                    .is_some_and(|(reason, _)| reason == "CreateContainerConfigError")
            },
            Duration::from_secs(120),
        )
        .await
        .expect("CreateContainerConfigError");
    assert_eq!(
        waiting_reason(&blocked.status).map(|(_, m)| m).as_deref(),
        Some("configmap \"settings\" not found")
    );
    assert!(
        sink.events()
            .iter()
            .any(|e| e.reason == "Failed" && e.message == "Error: configmap \"settings\" not found")
    );
    assert!(
        rt.calls()
            .iter()
            .all(|c| !c.starts_with("create_container"))
    );
    let volumes = dir.join("root/pods/uid-objects/volumes/kubernetes.io~configmap");
    let volume = volumes.join("conf");
    assert_eq!(
        std::fs::read_to_string(volume.join("key")).expect("volume file"),
        "v1"
    );
    let optional = volumes.join("opt");
    assert!(
        optional.join("..data").exists(),
        "an optional missing ConfigMap gives an empty volume"
    );
    assert_eq!(
        std::fs::read_dir(&optional).expect("opt").count(),
        2,
        "only ..data and the payload dir"
    );

    objects.put_config_map(config_map("settings", "s"));
    sink.wait_for(
        |r| r.status.phase.as_deref() == Some("Running"),
        Duration::from_secs(120),
    )
    .await
    .expect("Running once the ConfigMap exists");
    assert_eq!(
        std::fs::read_to_string(volume.join("key")).expect("volume file"),
        "v1"
    );
    let container = rt.find_container("uid-objects", "app").expect("created");
    let status = rt.container_status(&container).await.expect("status");
    assert!(
        status
            .mounts
            .iter()
            .any(|m| m.host_path == volume && m.container_path.as_os_str() == "/etc/conf"),
        "{:?}",
        status.mounts
    );

    // A later sync (resync every 10-15 s here) rewrites the changed content.
    objects.put_config_map(config_map("files", "v2"));
    tokio::time::sleep(Duration::from_secs(20)).await;
    for _ in 0..100 {
        if std::fs::read_to_string(volume.join("key")).ok().as_deref() == Some("v2") {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(
        std::fs::read_to_string(volume.join("key")).expect("volume file"),
        "v2"
    );

    // The volume's ConfigMap goes away while the pod runs: the volume keeps its last content, a
    // FailedMount event says why, and the pod is still synced (a crashed container restarts).
    objects.remove_config_map("default", "files");
    sink.wait_for_event(
        |e| {
            e.reason == "FailedMount"
                && e.message
                    == "MountVolume.SetUp failed for volume \"conf\" : configmap \"files\" not found"
        },
        Duration::from_secs(60),
    )
    .await
    .expect("FailedMount for the remount");
    let first = rt.find_container("uid-objects", "app").expect("container");
    rt.exit_container(&first, 1).expect("exit");
    sink.wait_for(
        |r| {
            r.status
                .container_statuses
                .iter()
                .flatten()
                .any(|c| c.restart_count == 1 && c.ready)
        },
        Duration::from_secs(120),
    )
    .await
    .expect("restarted although the volume's ConfigMap is gone");
    assert_eq!(
        std::fs::read_to_string(volume.join("key")).expect("volume file"),
        "v2"
    );

    shutdown.cancel();
    let _ = task.await;
    let _ = std::fs::remove_dir_all(&dir);
}
