//! ConfigMaps and Secrets from a real kube-apiserver (Node authorizer + NodeRestriction, node
//! credentials) into a pod bound to the node, watched through the API pod source and run by the
//! real process runtime: `envFrom` a ConfigMap and
//! `secretKeyRef` reach the process's environment, `configMap` and `secret` volumes are written
//! with the `..data` layout, and an update of the ConfigMap reaches the volume's files (and the
//! running process reading them) through the `Watch` strategy: one watch per mutable object,
//! none for an immutable one, a change syncing the pod at once (the agent's periodic sync is
//! set to 10 minutes, so nothing else could bring it), watches released with the pod. A
//! `downwardAPI` volume follows a label change; the watches survive an API server restart; a
//! ConfigMap deleted while mounted leaves the
//! files and the pod as they were, with a `FailedMount` event. Objects the node's pods do not
//! reference stay forbidden.
//!
//! Own `main` (`harness = false`): the process runtime starts each container's supervisor by
//! re-running this executable (`ShimCommand::CurrentExe`). Skips with a message when no
//! kube-apiserver can be provided; fails instead under `KUBELET_SDK_REQUIRE_ROOT=1`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use common::{log_text, wait_until};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapEnvSource, ConfigMapVolumeSource, Container, DownwardAPIVolumeFile,
    DownwardAPIVolumeSource, EnvFromSource, EnvVar, EnvVarSource, ObjectFieldSelector, Pod,
    PodSpec, Secret, SecretKeySelector, SecretVolumeSource, Volume,
};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kubelet_api::{ContainerRuntime, ErrorKind, ObjectProvider};
use kubelet_apiserver::{
    ApiObjects, ApiServer, ApiServerConfig, ChangeDetection, client_from_kubeconfig,
};
use kubelet_core::testing::RecordingSink;
use kubelet_core::{KubeletBuilder, KubeletConfig};
use kubelet_pleg::{GenericPleg, GenericPlegConfig};
use kubelet_process::{ProcessRuntime, ProcessRuntimeConfig, ShimCommand};
use kubelet_testenv::ApiServerEnv;
use tokio_util::sync::CancellationToken;

mod common;

const NODE: &str = "objects-node";
const NS: &str = "default";
const TEST: &str = "pod_sees_config_map_and_secret_from_the_api_server_and_volume_follows_updates";

fn main() -> ExitCode {
    common::run_one(TEST, run)
}

fn config_map(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    let mut cm = ConfigMap {
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..Default::default()
    };
    cm.metadata.name = Some(name.into());
    cm
}

fn pod(root: &Path) -> Pod {
    // The process runtime has no mount namespace: the process reads the volumes at their host
    // paths, which it computes from its own UID.
    let vols = format!("{}/pods/$POD_UID/volumes", root.display());
    let script = format!(
        "echo \"GREETING=$GREETING PASSWORD=$PASSWORD\"; \
         echo \"secret-file=$(cat {vols}/kubernetes.io~secret/creds/password)\"; \
         while true; do echo \"conf-file=$(cat {vols}/kubernetes.io~configmap/conf/conf.txt)\"; sleep 0.5; done"
    );
    let mut p = Pod {
        spec: Some(PodSpec {
            node_name: Some(NODE.into()),
            termination_grace_period_seconds: Some(2),
            containers: vec![Container {
                name: "app".into(),
                image: Some("busybox:1".into()),
                command: Some(vec!["sh".into(), "-c".into(), script]),
                env_from: Some(vec![EnvFromSource {
                    config_map_ref: Some(ConfigMapEnvSource {
                        name: "app-config".into(),
                        optional: None,
                    }),
                    ..Default::default()
                }]),
                env: Some(vec![
                    EnvVar {
                        name: "PASSWORD".into(),
                        value_from: Some(EnvVarSource {
                            secret_key_ref: Some(SecretKeySelector {
                                name: "creds".into(),
                                key: "password".into(),
                                optional: None,
                            }),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                    EnvVar {
                        name: "POD_UID".into(),
                        value_from: Some(EnvVarSource {
                            field_ref: Some(ObjectFieldSelector {
                                field_path: "metadata.uid".into(),
                                api_version: None,
                            }),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }],
            volumes: Some(vec![
                Volume {
                    name: "conf".into(),
                    config_map: Some(ConfigMapVolumeSource {
                        name: "app-config".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                Volume {
                    name: "creds".into(),
                    secret: Some(SecretVolumeSource {
                        secret_name: Some("creds".into()),
                        default_mode: Some(0o400),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                Volume {
                    name: "frozen".into(),
                    config_map: Some(ConfigMapVolumeSource {
                        name: "frozen".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                Volume {
                    name: "info".into(),
                    downward_api: Some(DownwardAPIVolumeSource {
                        items: Some(vec![DownwardAPIVolumeFile {
                            path: "labels".into(),
                            field_ref: Some(ObjectFieldSelector {
                                field_path: "metadata.labels".into(),
                                api_version: None,
                            }),
                            ..Default::default()
                        }]),
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
    p.metadata.name = Some("objects".into());
    p.metadata.labels = Some([("tier".to_string(), "web".to_string())].into());
    p
}

async fn run() {
    let Some(env) = ApiServerEnv::start_for_node(TEST, NODE) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let root: PathBuf = dir.path().join("root");
    let logs = dir.path().join("logs");
    let admin = client_from_kubeconfig(env.admin_kubeconfig())
        .await
        .expect("admin client");
    let node = client_from_kubeconfig(env.node_kubeconfig())
        .await
        .expect("node client");

    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), NS);
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let pp = PostParams::default();
    cms.create(
        &pp,
        &config_map(
            "app-config",
            &[("GREETING", "hello"), ("conf.txt", "v1"), ("1bad", "x")],
        ),
    )
    .await
    .expect("create ConfigMap");
    cms.create(&pp, &config_map("unreferenced", &[("k", "v")]))
        .await
        .expect("create ConfigMap");
    let mut frozen = config_map("frozen", &[("k", "ice")]);
    frozen.immutable = Some(true);
    cms.create(&pp, &frozen).await.expect("create ConfigMap");
    let mut secret = Secret {
        data: Some([("password".to_string(), ByteString(b"s3cret".to_vec()))].into()),
        ..Default::default()
    };
    secret.metadata.name = Some("creds".into());
    secrets.create(&pp, &secret).await.expect("create Secret");
    let created = pods.create(&pp, &pod(&root)).await.expect("create Pod");
    let uid = created.metadata.uid.clone().expect("uid");

    // The default strategy: Watch. The plugin's own provider serves the agent.
    let api = ApiServer::new(
        node.clone(),
        NODE,
        ApiServerConfig::default().root_dir(&root),
    );
    let objects: ApiObjects = api.objects();
    assert_eq!(objects.strategy(), ChangeDetection::Watch);
    // The Node authorizer: the node may read only what its pods reference.
    let forbidden = objects
        .config_map(NS, "unreferenced")
        .await
        .expect_err("unreferenced ConfigMap is forbidden to the node");
    assert_eq!(forbidden.kind(), ErrorKind::PermissionDenied, "{forbidden}");

    let state = dir.path().join("state");
    let runtime = Arc::new(
        ProcessRuntime::new(
            ProcessRuntimeConfig::new(&state)
                .shim(ShimCommand::CurrentExe)
                .use_cgroups(false),
        )
        .expect("process runtime"),
    );
    let dyn_runtime: Arc<dyn ContainerRuntime> = runtime.clone();
    let (pleg, pleg_events) = GenericPleg::new(dyn_runtime.clone(), GenericPlegConfig::default());
    let pleg = std::sync::Arc::new(pleg);
    let sink = Arc::new(RecordingSink::new());
    let mut config = KubeletConfig::with_dirs(&root, &logs);
    // Only the watch can bring a change within the test's waits.
    config.sync_frequency = Duration::from_secs(600);
    let builder = KubeletBuilder::new(NODE).config(config);
    // The API-server integration as a plugin: pod source, status sink, object provider and its
    // loop (node registration and status), as an agent runs it.
    let kubelet = builder
        .runtime(dyn_runtime.clone())
        .pleg(pleg, pleg_events)
        .status_sink(sink.clone())
        .plugin(Arc::new(api))
        .build()
        .expect("build");
    let shutdown = CancellationToken::new();
    let agent = tokio::spawn(kubelet.run(shutdown.clone()));

    let running = sink
        .wait_for(
            |r| r.uid == uid && r.status.phase.as_deref() == Some("Running"),
            Duration::from_secs(60),
        )
        .await;
    assert!(running.is_some(), "pod Running: {:#?}", sink.latest(&uid));
    // The status reaches the API server through the node's status sink.
    let mut in_api = None;
    for _ in 0..100 {
        let p = pods.get("objects").await.expect("get pod");
        if p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
            in_api = Some(p);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(in_api.is_some(), "Running in the API");

    wait_until(
        "env and secret file in the log",
        Duration::from_secs(30),
        || {
            let t = log_text(&logs);
            t.contains("GREETING=hello PASSWORD=s3cret") && t.contains("secret-file=s3cret")
        },
    )
    .await;
    assert!(
        sink.events()
            .iter()
            .any(|e| e.reason == "InvalidEnvironmentVariableNames"
                && e.message
                    .contains("Keys [1bad] from the EnvFrom configMap default/app-config")),
        "{:?}",
        sink.events()
    );

    let vols = root.join("pods").join(&uid).join("volumes");
    let secret_dir = vols.join("kubernetes.io~secret/creds");
    assert_eq!(
        std::fs::read_link(secret_dir.join("password")).expect("symlink"),
        Path::new("..data/password")
    );
    assert!(std::fs::read_link(secret_dir.join("..data")).is_ok());
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(secret_dir.join("password"))
            .expect("secret file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o400);
    }
    let conf = vols.join("kubernetes.io~configmap/conf/conf.txt");
    assert_eq!(std::fs::read_to_string(&conf).expect("conf.txt"), "v1");
    assert_eq!(
        std::fs::read_to_string(vols.join("kubernetes.io~configmap/frozen/k")).expect("frozen"),
        "ice"
    );
    let labels = vols.join("kubernetes.io~downward-api/info/labels");
    assert_eq!(
        std::fs::read_to_string(&labels).expect("labels"),
        "tier=\"web\""
    );
    // app-config and creds are watched; the immutable ConfigMap was read once and is not.
    wait_until("two watches", Duration::from_secs(10), || {
        objects.active_watches() == 2
    })
    .await;
    assert_eq!(objects.cached_objects(), 3);

    // An update of the ConfigMap reaches the volume and the process reading it.
    let updated = std::time::Instant::now();
    cms.patch(
        "app-config",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "data": { "conf.txt": "v2" } })),
    )
    .await
    .expect("update ConfigMap");
    wait_until("updated volume file", Duration::from_secs(30), || {
        std::fs::read_to_string(&conf).ok().as_deref() == Some("v2")
    })
    .await;
    println!("ConfigMap update -> volume file: {:?}", updated.elapsed());
    wait_until(
        "the process sees the update",
        Duration::from_secs(30),
        || log_text(&logs).contains("conf-file=v2"),
    )
    .await;

    // A label change reaches the downwardAPI file.
    pods.patch(
        "objects",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "metadata": { "labels": { "tier": "db" } } })),
    )
    .await
    .expect("label the pod");
    wait_until("updated labels file", Duration::from_secs(30), || {
        std::fs::read_to_string(&labels).ok().as_deref() == Some("tier=\"db\"")
    })
    .await;

    // The watches break: the API server restarts. They come back by themselves (with backoff),
    // and an update made after the restart still reaches the file.
    tokio::task::block_in_place(|| {
        env.stop_apiserver();
        env.start_apiserver();
    });
    cms.patch(
        "app-config",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "data": { "conf.txt": "v3" } })),
    )
    .await
    .expect("update ConfigMap after the restart");
    wait_until(
        "the update after the restart",
        Duration::from_secs(60),
        || std::fs::read_to_string(&conf).ok().as_deref() == Some("v3"),
    )
    .await;
    assert_eq!(objects.active_watches(), 2);

    // The ConfigMap deleted while mounted: the watch sees it go, the pod syncs, the set-up fails
    // with FailedMount, and the files and the process stay as they were.
    cms.delete("app-config", &DeleteParams::default())
        .await
        .expect("delete ConfigMap");
    wait_until(
        "FailedMount for the deleted ConfigMap",
        Duration::from_secs(30),
        || {
            sink.events().iter().any(|e| {
                e.reason == "FailedMount"
                    && e.message.contains("configmap \"app-config\" not found")
            })
        },
    )
    .await;
    assert_eq!(std::fs::read_to_string(&conf).expect("conf.txt"), "v3");
    let before = log_text(&logs).matches("conf-file=v3").count();
    wait_until("the process keeps running", Duration::from_secs(10), || {
        log_text(&logs).matches("conf-file=v3").count() > before + 2
    })
    .await;

    // Delete the pod through the API: the agent stops the process, tears the volumes down and
    // the pod object goes away.
    pods.delete("objects", &DeleteParams::default())
        .await
        .expect("delete pod");
    let rt = dyn_runtime.clone();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let left = rt
            .list_containers(&Default::default())
            .await
            .expect("list containers");
        if left.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "containers left: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    wait_until("pod dir removed", Duration::from_secs(30), || {
        !root.join("pods").join(&uid).exists()
    })
    .await;
    // The last pod using the objects is gone: so are their watches.
    wait_until("watches released", Duration::from_secs(30), || {
        objects.active_watches() == 0 && objects.cached_objects() == 0
    })
    .await;
    let mut gone = false;
    for _ in 0..150 {
        if pods.get_opt("objects").await.expect("get pod").is_none() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        gone,
        "the pod object is deleted once its containers stopped"
    );
    shutdown.cancel();
    let _ = agent.await;
    drop(env);
}
