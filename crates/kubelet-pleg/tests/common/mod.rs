//! Shared by the real-runtime PLEG tests: pod and container configs. The fault-injecting
//! runtime wrapper they use is `kubelet_core::testing::FaultyRuntime`.

#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::path::Path;

use kubelet_api::runtime::{
    ContainerConfig, ContainerMetadata, PodSandboxConfig, PodSandboxMetadata, labels,
};

/// A sandbox config of pod `uid` (host network, logs under `root`).
pub fn sandbox_config(root: &Path, uid: &str) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: PodSandboxMetadata {
            name: format!("pod-{uid}"),
            namespace: "default".into(),
            uid: uid.into(),
            attempt: 0,
        },
        log_directory: root.join("logs").join(format!("default_pod-{uid}_{uid}")),
        labels: BTreeMap::from([
            (labels::POD_UID.to_string(), uid.to_string()),
            (labels::POD_NAME.to_string(), format!("pod-{uid}")),
            (labels::POD_NAMESPACE.to_string(), "default".to_string()),
        ]),
        host_network: true,
        ..Default::default()
    }
}

/// A container `name` of the pod running `sh -c script`.
pub fn shell_container(
    sandbox: &PodSandboxConfig,
    name: &str,
    image: &str,
    script: &str,
) -> ContainerConfig {
    let mut l = sandbox.labels.clone();
    l.insert(labels::CONTAINER_NAME.into(), name.into());
    ContainerConfig {
        metadata: ContainerMetadata {
            name: name.into(),
            attempt: 0,
        },
        image: image.into(),
        command: vec!["/bin/sh".into(), "-c".into()],
        args: vec![script.into()],
        labels: l,
        log_path: format!("{name}/0.log"),
        ..Default::default()
    }
}
