//! Images on a private containerd pulled from a private registry (TLS + htpasswd, started by
//! `scripts/registry-test-env.sh`): the image service over CRI, pods pulling with image pull
//! secrets through the engine, and log reopening. Needs root; skipped with a message otherwise
//! (a failure with `KUBELET_SDK_REQUIRE_ROOT=1`).
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Agent, ContainerdEnv, RegistryEnv, WITHIN, container, pod, running, start_pod};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{LocalObjectReference, Pod, PodStatus, Secret, ServiceAccount};
use kubelet_api::runtime::{AuthConfig, ImageSpec, PodSandboxConfig};
use kubelet_api::{ContainerRuntime, StaticObjects};
use tokio::sync::watch;

fn pull_secret(name: &str, json: &str) -> Secret {
    let mut s = Secret {
        type_: Some("kubernetes.io/dockerconfigjson".into()),
        data: Some(
            [(
                ".dockerconfigjson".to_string(),
                ByteString(json.as_bytes().to_vec()),
            )]
            .into_iter()
            .collect(),
        ),
        ..Default::default()
    };
    s.metadata.name = Some(name.into());
    s.metadata.namespace = Some("default".into());
    s
}

fn with_pull_secret(mut p: Pod, secret: &str) -> Pod {
    if let Some(spec) = p.spec.as_mut() {
        spec.image_pull_secrets = Some(vec![LocalObjectReference {
            name: secret.into(),
        }]);
    }
    p
}

fn waiting_reason(s: &PodStatus) -> Option<String> {
    s.container_statuses
        .iter()
        .flatten()
        .find_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_service_pulls_with_credentials_lists_and_removes() {
    let Some(env) = ContainerdEnv::start("images_service") else {
        return;
    };
    let registry = RegistryEnv::start(&env);
    let rt = env.runtime().await;
    let images = rt.images().expect("CRI has images");
    let spec = ImageSpec::new(registry.private_image.clone());
    let sandbox = PodSandboxConfig::default();

    let anonymous = images
        .pull_image(&spec, None, &sandbox)
        .await
        .expect_err("the registry wants credentials");
    let wrong = AuthConfig::basic(&registry.user, "not-the-password");
    let err = images
        .pull_image(&spec, Some(&wrong), &sandbox)
        .await
        .expect_err("wrong password");
    for e in [&anonymous, &err] {
        let text = kubelet_api::chain(e).to_string();
        assert!(!text.contains("not-the-password"), "{text}");
        assert!(
            text.contains("401") || text.to_lowercase().contains("unauthorized"),
            "the registry's answer: {text}"
        );
    }

    let good = AuthConfig::basic(&registry.user, &registry.password);
    let image_ref = images
        .pull_image(&spec, Some(&good), &sandbox)
        .await
        .expect("pull with credentials");
    let status = images
        .image_status(&spec)
        .await
        .unwrap()
        .expect("present after the pull");
    assert_eq!(status.id, image_ref);
    assert!(status.size > 0);
    assert!(
        status
            .repo_digests
            .iter()
            .any(|d| d.starts_with(&format!("{}/private/busybox@sha256:", registry.host))),
        "{status:?}"
    );
    let listed = images.list_images().await.unwrap();
    assert!(listed.iter().any(|i| i.id == image_ref));
    // containerd pins its sandbox image from 1.7 on (`pinned`); 1.6 pins nothing.
    // A digest reference and a registry with a port resolve to the same image.
    let by_digest = ImageSpec::new(status.repo_digests[0].clone());
    assert_eq!(
        images.image_status(&by_digest).await.unwrap().map(|i| i.id),
        Some(image_ref.clone())
    );

    images
        .remove_image(&ImageSpec::new(image_ref.clone()))
        .await
        .unwrap();
    assert!(images.image_status(&spec).await.unwrap().is_none());
    images
        .remove_image(&ImageSpec::new(image_ref))
        .await
        .expect("removing an absent image is not an error");
    let fs = images.image_fs_info().await.unwrap();
    assert!(!fs.image_filesystems.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_pull_with_their_image_pull_secrets_and_a_wrong_password_backs_off() {
    let Some(env) = ContainerdEnv::start("images_pull_secrets") else {
        return;
    };
    let registry = RegistryEnv::start(&env);
    let rt = env.runtime().await;
    let objects = StaticObjects::new();
    objects.put_secret(pull_secret(
        "registry",
        &registry.docker_config_json(&registry.password),
    ));
    objects.put_secret(pull_secret(
        "wrong",
        &registry.docker_config_json("wr0ng-password"),
    ));
    let app = |uid: &str, secret: &str| {
        let mut c = container("app", &registry.private_image, "sleep 3600");
        c.image_pull_policy = Some("IfNotPresent".into());
        with_pull_secret(pod(uid, true, vec![c]), secret)
    };
    let mut sa = ServiceAccount {
        image_pull_secrets: Some(vec![LocalObjectReference {
            name: "registry".into(),
        }]),
        ..Default::default()
    };
    sa.metadata.name = Some("builder".into());
    sa.metadata.namespace = Some("default".into());
    objects.put_service_account(sa);
    let (tx, rx) = watch::channel(vec![app("u-good", "registry"), app("u-bad", "wrong")]);
    let runtime: Arc<dyn ContainerRuntime> = rt.clone();
    let agent = Agent::start_with_objects(&env, runtime, rx, Arc::new(objects));
    agent
        .wait_for("u-good", WITHIN, "running with the secret", running)
        .await;
    // The bad pod raced the good one for the image: once the good pull is done, the image is
    // present and `IfNotPresent` starts the bad pod too. So the wrong password is checked on
    // an image of its own, pulled `Always`.
    let mut c = container("app", &registry.private_image, "sleep 3600");
    c.image_pull_policy = Some("Always".into());
    let always_bad = with_pull_secret(pod("u-always-bad", true, vec![c]), "wrong");
    // A second pod with the image present and `IfNotPresent` does not pull.
    let again = app("u-again", "registry");
    // A pod that names no secret pulls with its service account's (`Always`: a real pull).
    let mut c = container("app", &registry.private_image, "sleep 3600");
    c.image_pull_policy = Some("Always".into());
    let mut by_sa = pod("u-sa", true, vec![c]);
    if let Some(spec) = by_sa.spec.as_mut() {
        spec.service_account_name = Some("builder".into());
    }
    tx.send_replace(vec![app("u-good", "registry"), always_bad, again, by_sa]);
    agent
        .wait_for("u-always-bad", WITHIN, "ErrImagePull", |s| {
            waiting_reason(s).as_deref() == Some("ErrImagePull")
        })
        .await;
    agent
        .wait_for(
            "u-always-bad",
            Duration::from_secs(60),
            "ImagePullBackOff",
            |s| waiting_reason(s).as_deref() == Some("ImagePullBackOff"),
        )
        .await;
    agent
        .wait_for("u-again", WITHIN, "running without a pull", running)
        .await;
    agent
        .wait_for(
            "u-sa",
            WITHIN,
            "running with the service account's secret",
            running,
        )
        .await;
    let events = agent.sink.events();
    let pulling = |uid: &str| {
        events
            .iter()
            .filter(|e| e.reason == "Pulling" && e.involved.uid == uid)
            .count()
    };
    assert_eq!(pulling("u-again"), 0, "IfNotPresent with the image present");
    assert_eq!(
        pulling("u-sa"),
        1,
        "Always pulls, with the service account's secret"
    );
    assert!(pulling("u-good") == 1, "{events:#?}");
    let text = format!("{events:?} {:?}", agent.status("u-always-bad"));
    assert!(!text.contains("wr0ng-password") && !text.contains(&registry.password));
    let failed = events
        .iter()
        .find(|e| e.reason == "Failed" && e.involved.uid == "u-always-bad")
        .expect("a Failed event");
    assert!(
        failed.message.starts_with(&format!(
            "Failed to pull image {:?}:",
            registry.private_image
        )),
        "{}",
        failed.message
    );
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reopened_log_continues_in_a_new_file() {
    let Some(env) = ContainerdEnv::start("images_reopen_log") else {
        return;
    };
    let rt = env.runtime().await;
    let (_sid, cid) = start_pod(
        &env,
        rt.as_ref(),
        "u-reopen",
        "i=0; while [ $i -lt 300 ]; do echo line-$i; i=$((i+1)); sleep 0.02; done; sleep 3600",
    )
    .await;
    let log = rt.container_status(&cid).await.unwrap().log_path;
    let contains = |path: &std::path::Path, needle: &str| {
        std::fs::read_to_string(path).is_ok_and(|t| t.contains(needle))
    };
    common::eventually(WITHIN, "line-10 in the log", || {
        let ok = contains(&log, "line-10 ") || contains(&log, "line-10\n");
        async move { ok.then_some(()) }
    })
    .await;
    let rotated = log.with_extension("log.20260101-000000");
    std::fs::rename(&log, &rotated).unwrap();
    rt.reopen_container_log(&cid).await.unwrap();
    common::eventually(WITHIN, "line-299 in the new log", || {
        let ok = contains(&log, "line-299");
        async move { ok.then_some(()) }
    })
    .await;
    let mut lines = Vec::new();
    for f in [&rotated, &log] {
        let text = std::fs::read_to_string(f).unwrap();
        lines.extend(
            text.lines()
                .map(|l| l.rsplit(' ').next().unwrap_or("").to_string()),
        );
    }
    let want: Vec<String> = (0..300).map(|i| format!("line-{i}")).collect();
    assert_eq!(
        lines, want,
        "every line once, in order, across the two files"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_gc_on_containerd_removes_unused_images_least_recently_used_first() {
    let Some(env) = ContainerdEnv::start("images_gc") else {
        return;
    };
    let registry = RegistryEnv::start(&env);
    let rt = env.runtime().await;
    let images = rt.images().expect("CRI has images");
    let auth = AuthConfig::basic(&registry.user, &registry.password);
    let mut ids = Vec::new();
    for image in &registry.extra_images {
        let id = images
            .pull_image(
                &ImageSpec::new(image.clone()),
                Some(&auth),
                &PodSandboxConfig::default(),
            )
            .await
            .unwrap();
        ids.push(id);
    }
    // A running pod uses busybox.
    start_pod(&env, rt.as_ref(), "u-busy", "sleep 3600").await;
    let mut policy = kubelet_gc::ImageGcPolicy::default();
    policy.min_age = Duration::ZERO;
    policy.high_threshold_percent = 1;
    policy.low_threshold_percent = 0;
    // containerd 1.6 does not pin its sandbox image: the agent's configuration does.
    policy.pinned_images = vec![env.pause.clone()];
    let gc = kubelet_gc::images::ImageGc::new(policy);
    // The second extra image is used by a container that is then removed: of the unused
    // images, it is the most recently used.
    let sandbox = common::sandbox_config("u-extra", &env);
    let sid = rt.run_pod_sandbox(&sandbox).await.unwrap();
    let mut config = common::pod_container(&env, &sandbox, "extra", "true");
    config.image = registry.extra_images[1].clone();
    let cid = rt.create_container(&sid, &config, &sandbox).await.unwrap();
    gc.detect(rt.as_ref(), tokio::time::Instant::now())
        .await
        .unwrap();
    rt.remove_container(&cid).await.unwrap();
    rt.stop_pod_sandbox(&sid).await.unwrap();
    rt.remove_pod_sandbox(&sid).await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;

    let listed = images.list_images().await.unwrap();
    let size = |id: &str| listed.iter().find(|i| i.id == id).map(|i| i.size).unwrap();
    // Everything in use: to free the first and third extra images' bytes exactly.
    let wanted = size(&ids[0]) + size(&ids[2]);
    let out = gc
        .collect(
            rt.as_ref(),
            Some(kubelet_gc::images::FsUsage {
                capacity: wanted,
                available: 0,
            }),
        )
        .await
        .unwrap();
    let mut removed: Vec<String> = out.removed.iter().map(|(id, _)| id.clone()).collect();
    removed.sort();
    let mut want = vec![ids[0].clone(), ids[2].clone()];
    want.sort();
    assert_eq!(
        removed, want,
        "the never used ones, not the recently used one"
    );
    let left: Vec<String> = images
        .list_images()
        .await
        .unwrap()
        .into_iter()
        .flat_map(|i| i.repo_tags)
        .collect();
    for keep in [&registry.extra_images[1], &env.busybox, &env.pause] {
        assert!(left.contains(keep), "{keep} kept: {left:?}");
    }
    // Asked to free everything it may: the recently used extra image goes, busybox (in use)
    // and the sandbox image (pinned) stay.
    let out = gc.delete_unused(rt.as_ref()).await.unwrap();
    assert_eq!(out.removed.len(), 1, "{out:?}");
    let left: Vec<String> = images
        .list_images()
        .await
        .unwrap()
        .into_iter()
        .flat_map(|i| i.repo_tags)
        .collect();
    assert!(
        left.contains(&env.busybox) && left.contains(&env.pause),
        "{left:?}"
    );
    assert!(!left.contains(&registry.extra_images[1]));
}
