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
    {
        let mut v = PodSandboxConfig::default();
        v.metadata = PodSandboxMetadata {
            name: format!("pod-{uid}"),
            namespace: "default".into(),
            uid: uid.into(),
            attempt: 0,
        };
        v.log_directory = root.join("logs").join(format!("default_pod-{uid}_{uid}"));
        v.labels = BTreeMap::from([
            (labels::POD_UID.to_string(), uid.to_string()),
            (labels::POD_NAME.to_string(), format!("pod-{uid}")),
            (labels::POD_NAMESPACE.to_string(), "default".to_string()),
        ]);
        v.host_network = true;
        v
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
    {
        let mut v = ContainerConfig::default();
        v.metadata = ContainerMetadata {
            name: name.into(),
            attempt: 0,
        };
        v.image = image.into();
        v.command = vec!["/bin/sh".into(), "-c".into()];
        v.args = vec![script.into()];
        v.labels = l;
        v.log_path = format!("{name}/0.log");
        v
    }
}
