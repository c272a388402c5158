//! Small helpers over `k8s-openapi` pods: identity, restart policy, container kinds, hashing,
//! decoding.

use k8s_openapi::api::core::v1::{Container, Pod, PodCondition, PodStatus};

use crate::source::{annotations, sources};

/// Decode a `Pod` from JSON text.
///
/// The SDK's crates decode pods through this one function (manifests, the API server's answers
/// and watch events, checkpoints), so a binary holds one copy of the `Pod` decoder, a few hundred
/// kilobytes of generated code, instead of one per crate and input type.
#[inline(never)]
pub fn from_json(text: &str) -> Result<Pod, serde_json::Error> {
    serde_json::from_str(text)
}

/// The file name of a container's legacy log link in `/var/log/containers` (the kubelet's
/// `logSymlink`): `<pod>_<namespace>_<container>-<container ID>.log`, cut to 255 bytes. The
/// engine creates the link, pointing at the container's log file; the log rotation reads it
/// back instead of asking the runtime for the log path.
pub fn log_link_name(pod_name: &str, namespace: &str, container: &str, id: &str) -> String {
    let mut name = format!("{pod_name}_{namespace}_{container}-{id}");
    let max = 255 - ".log".len();
    if name.len() > max {
        let mut cut = max;
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        name.truncate(cut);
    }
    name.push_str(".log");
    name
}

/// Encode a `Pod` as JSON text: the encoding counterpart of [`from_json`], one copy of the `Pod`
/// encoder for the SDK's crates (the kubelet API's `/pods`, the push source, static pod UIDs,
/// mirror pods).
#[inline(never)]
pub fn to_json(pod: &Pod) -> Vec<u8> {
    let mut out = Vec::new();
    // Empty when encoding failed (it cannot; see `write_json`): every caller handles that.
    write_json(&mut out, pod, None);
    out
}

/// A `v1` `PodList` of `pods` as JSON text, each item encoded as by [`to_json`].
pub fn list_to_json(pods: &mut dyn Iterator<Item = &Pod>) -> Vec<u8> {
    list_to_json_with_status(&mut pods.map(|p| (p, None)))
}

/// A `v1` `PodList` as JSON text, each item a pod with the status given next to it in place of
/// its own (`None`: its own): the kubelet API's `/pods`, whose pods and statuses are kept apart.
/// The pods are encoded where they are, without a copy of each with its status set.
pub fn list_to_json_with_status<'a>(
    pods: &mut dyn Iterator<Item = (&'a Pod, Option<&'a PodStatus>)>,
) -> Vec<u8> {
    let mut out = br#"{"kind":"PodList","apiVersion":"v1","metadata":{},"items":["#.to_vec();
    let first = out.len();
    for (pod, status) in pods {
        let before = out.len();
        if before > first {
            out.push(b',');
        }
        if !write_json(&mut out, pod, status) {
            // Left out whole, its separator too: the list stays valid JSON.
            out.truncate(before);
        }
    }
    out.extend_from_slice(b"]}");
    out
}

/// Appends `pod` as JSON text to `out`, with `status` in place of its own when given. A pod has
/// no map with non-string keys and no fallible field, so encoding cannot fail; were it to,
/// nothing is appended and the result is false.
#[inline(never)]
fn write_json(out: &mut Vec<u8>, pod: &Pod, status: Option<&PodStatus>) -> bool {
    let len = out.len();
    let ok = serde_json::to_writer(&mut *out, &WithStatus { pod, status }).is_ok();
    if !ok {
        out.truncate(len);
    }
    ok
}

/// A pod encoded with another status, field for field as `k8s-openapi` encodes a `Pod`.
struct WithStatus<'a> {
    pod: &'a Pod,
    status: Option<&'a PodStatus>,
}

impl serde::Serialize for WithStatus<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use k8s_openapi::Resource;
        use serde::ser::SerializeStruct;
        let status = self.status.or(self.pod.status.as_ref());
        let fields = 3 + usize::from(self.pod.spec.is_some()) + usize::from(status.is_some());
        let mut s = serializer.serialize_struct(Pod::KIND, fields)?;
        s.serialize_field("apiVersion", Pod::API_VERSION)?;
        s.serialize_field("kind", Pod::KIND)?;
        s.serialize_field("metadata", &self.pod.metadata)?;
        if let Some(spec) = &self.pod.spec {
            s.serialize_field("spec", spec)?;
        }
        if let Some(status) = status {
            s.serialize_field("status", status)?;
        }
        s.end()
    }
}

/// The pod's UID, empty if unset.
pub fn uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or("")
}

/// The pod's name, empty if unset.
pub fn name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or("")
}

/// The pod's namespace, `default` if unset.
pub fn namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

/// `name_namespace`, the kubelet's full name of a pod.
pub fn full_name(pod: &Pod) -> String {
    format!("{}_{}", name(pod), namespace(pod))
}

/// The source annotation (`kubernetes.io/config.source`).
pub fn source(pod: &Pod) -> Option<&str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::CONFIG_SOURCE))
        .map(String::as_str)
}

/// A static pod comes from any source other than the API server.
pub fn is_static(pod: &Pod) -> bool {
    source(pod).is_some_and(|s| s != sources::API)
}

/// A mirror pod carries `kubernetes.io/config.mirror`.
pub fn is_mirror(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(annotations::CONFIG_MIRROR))
}

/// Pod restart policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RestartPolicy {
    /// Restart after any exit (the default).
    Always,
    /// Restart after a non-zero exit.
    OnFailure,
    /// Never restart.
    Never,
}

/// The pod's restart policy; unset or unknown values mean `Always`, the API default.
pub fn restart_policy(pod: &Pod) -> RestartPolicy {
    match pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) {
        Some("OnFailure") => RestartPolicy::OnFailure,
        Some("Never") => RestartPolicy::Never,
        _ => RestartPolicy::Always,
    }
}

/// A container's image pull policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PullPolicy {
    /// Pull on every start.
    Always,
    /// Pull when the image is not present.
    IfNotPresent,
    /// Never pull; a missing image is an error.
    Never,
}

/// Container `c`'s pull policy: the one it sets, else the API's default (`Always` for an image
/// without a tag or tagged `:latest`, `IfNotPresent` for another tag or a digest). An unknown
/// value (which the API rejects) is `Always`.
pub fn pull_policy(c: &Container) -> PullPolicy {
    match c.image_pull_policy.as_deref() {
        Some("Never") => PullPolicy::Never,
        Some("IfNotPresent") => PullPolicy::IfNotPresent,
        Some(_) => PullPolicy::Always,
        None => {
            let image = c.image.as_deref().unwrap_or("");
            let last = image.rsplit('/').next().unwrap_or("");
            if image.contains('@') || (last.contains(':') && !last.ends_with(":latest")) {
                PullPolicy::IfNotPresent
            } else {
                PullPolicy::Always
            }
        }
    }
}

/// The pod condition types the kubelet writes (`PodConditionByKubelet`) or shares with other
/// writers (`PodConditionSharedByKubelet`). Conditions of other types (readiness gates,
/// another controller's) stay strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PodConditionType {
    /// `PodReadyToStartContainers`: the sandbox is up and networked.
    PodReadyToStartContainers,
    /// `Initialized`: every init container completed (sidecars started).
    Initialized,
    /// `Ready`: the pod serves (containers ready and readiness gates true).
    Ready,
    /// `ContainersReady`: every container is ready.
    ContainersReady,
    /// `PodScheduled`: the pod is bound to a node.
    PodScheduled,
    /// `DisruptionTarget`: the pod is about to be terminated by a disruption (eviction,
    /// preemption, node shutdown); shared with the controllers that set it.
    DisruptionTarget,
}

impl PodConditionType {
    /// Every type, in the order the kubelet lists its own first.
    pub const ALL: [Self; 6] = [
        Self::PodReadyToStartContainers,
        Self::Initialized,
        Self::Ready,
        Self::ContainersReady,
        Self::PodScheduled,
        Self::DisruptionTarget,
    ];

    /// The type as the API writes it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::PodReadyToStartContainers => "PodReadyToStartContainers",
            Self::Initialized => "Initialized",
            Self::Ready => "Ready",
            Self::ContainersReady => "ContainersReady",
            Self::PodScheduled => "PodScheduled",
            Self::DisruptionTarget => "DisruptionTarget",
        }
    }

    /// The type written `s`, if it is one of these.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// True for the types the kubelet owns: every one but `DisruptionTarget`.
    pub const fn is_kubelet_owned(self) -> bool {
        !matches!(self, Self::DisruptionTarget)
    }
}

impl std::fmt::Display for PodConditionType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<PodConditionType> for String {
    fn eq(&self, other: &PodConditionType) -> bool {
        self == other.as_str()
    }
}

impl PartialEq<PodConditionType> for str {
    fn eq(&self, other: &PodConditionType) -> bool {
        self == other.as_str()
    }
}

impl PartialEq<PodConditionType> for &str {
    fn eq(&self, other: &PodConditionType) -> bool {
        *self == other.as_str()
    }
}

impl From<PodConditionType> for String {
    fn from(t: PodConditionType) -> Self {
        t.as_str().to_string()
    }
}

/// An init container with `restartPolicy: Always` is a sidecar.
pub fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// A pod's total of a per-container amount as the kubelet aggregates requests and limits
/// (`PodRequests`/`PodLimits`, without pod-level resources or overhead): the sum of the regular
/// containers and the sidecars, at least any init container's amount plus the sidecars started
/// before it. `None` when `per_container` is `None` for any container (a limit some container
/// does not set leaves the pod unlimited).
pub fn aggregate_resource(
    pod: &Pod,
    per_container: impl Fn(&Container) -> Option<i64>,
) -> Option<i64> {
    let spec = pod.spec.as_ref()?;
    let mut sum = 0i64;
    for c in &spec.containers {
        sum = sum.saturating_add(per_container(c)?);
    }
    let mut sidecars = 0i64;
    let mut init_max = 0i64;
    for c in spec.init_containers.iter().flatten() {
        let v = per_container(c)?;
        if is_sidecar(c) {
            sidecars = sidecars.saturating_add(v);
            init_max = init_max.max(sidecars);
        } else {
            init_max = init_max.max(sidecars.saturating_add(v));
        }
    }
    Some(sum.saturating_add(sidecars).max(init_max))
}

/// The pod's regular containers.
pub fn containers(pod: &Pod) -> &[Container] {
    pod.spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or(&[])
}

/// The pod's init containers (regular and sidecars), in order.
pub fn init_containers(pod: &Pod) -> &[Container] {
    pod.spec
        .as_ref()
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or(&[])
}

/// `spec.terminationGracePeriodSeconds`, default 30.
pub fn termination_grace_period(pod: &Pod) -> i64 {
    pod.spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30)
}

/// True when the pod has a deletion timestamp.
pub fn is_deleted(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// The kubelet's container hash (`HashContainer` since v1.31): FNV-32a over the JSON of the
/// container's name and image only, so only an image change restarts a container.
pub fn container_hash(c: &Container) -> u64 {
    #[derive(serde::Serialize)]
    struct Hashed<'a> {
        name: &'a str,
        image: &'a str,
    }
    let json = serde_json::to_vec(&Hashed {
        name: &c.name,
        image: c.image.as_deref().unwrap_or(""),
    })
    .unwrap_or_default();
    let mut h: u32 = 0x811c_9dc5;
    for b in json {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    u64::from(h)
}

/// True when any (init or regular) container of the pod asks to run privileged (the kubelet's
/// `HasPrivilegedContainer`), so its sandbox must be privileged too.
pub fn has_privileged_container(pod: &Pod) -> bool {
    init_containers(pod).iter().chain(containers(pod)).any(|c| {
        c.security_context
            .as_ref()
            .and_then(|s| s.privileged)
            .unwrap_or(false)
    })
}

/// `SystemCriticalPriority`: pods at or above it are critical (eviction spares them, node
/// shutdown terminates them last).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// `spec.priority`, 0 when unset.
pub fn priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

/// The `DisruptionTarget` condition (reason `TerminationByKubelet`) the kubelet adds to pods it
/// terminates itself (eviction, node shutdown), carrying `message`.
pub fn disruption_condition(message: &str) -> PodCondition {
    PodCondition {
        type_: PodConditionType::DisruptionTarget.into(),
        status: "True".into(),
        reason: Some("TerminationByKubelet".into()),
        message: Some(message.to_string()),
        ..Default::default()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn log_link_names_are_the_kubelets_and_fit_a_file_name() {
        assert_eq!(log_link_name("p", "ns", "c", "abc"), "p_ns_c-abc.log");
        // Cut to 255 bytes on a character boundary, `.log` kept.
        let long = "é".repeat(200);
        let name = log_link_name(&long, "ns", "c", "abc");
        assert!(name.len() <= 255 && name.len() >= 250, "{}", name.len());
        assert!(name.ends_with("é.log"));
    }

    #[test]
    fn a_pod_listed_with_a_status_is_encoded_as_k8s_openapi_encodes_it_with_that_status() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u", "annotations": {"a": "b"}},
            "spec": {"containers": [{"name": "c", "image": "i", "command": ["sleep", "1"]}]},
            "status": {"phase": "Pending"},
        }))
        .unwrap();
        let status: PodStatus = serde_json::from_value(serde_json::json!({
            "phase": "Running", "podIP": "10.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}],
        }))
        .unwrap();
        let no_spec = Pod {
            metadata: pod.metadata.clone(),
            ..Default::default()
        };
        let listed = list_to_json_with_status(
            &mut [(&pod, Some(&status)), (&pod, None), (&no_spec, None)].into_iter(),
        );
        let own = serde_json::to_vec(&pod).unwrap();
        let bare = serde_json::to_vec(&no_spec).unwrap();
        pod.status = Some(status);
        let replaced = serde_json::to_vec(&pod).unwrap();
        let mut expected =
            br#"{"kind":"PodList","apiVersion":"v1","metadata":{},"items":["#.to_vec();
        for (i, item) in [replaced, own, bare].iter().enumerate() {
            if i > 0 {
                expected.push(b',');
            }
            expected.extend_from_slice(item);
        }
        expected.extend_from_slice(b"]}");
        assert_eq!(
            String::from_utf8(listed).unwrap(),
            String::from_utf8(expected).unwrap()
        );
        assert_eq!(to_json(&no_spec), serde_json::to_vec(&no_spec).unwrap());
    }

    #[test]
    fn pods_and_lists_round_trip_through_json_text() {
        let mut pod = Pod::default();
        pod.metadata.name = Some("p".into());
        pod.metadata.namespace = Some("ns".into());
        let text = String::from_utf8(to_json(&pod)).unwrap();
        assert_eq!(from_json(&text).unwrap(), pod);
        let mut other = pod.clone();
        other.metadata.name = Some("q".into());
        let list = list_to_json(&mut [&pod, &other].into_iter());
        let v: serde_json::Value = serde_json::from_slice(&list).unwrap();
        assert_eq!(v["kind"], "PodList");
        assert_eq!(v["apiVersion"], "v1");
        assert_eq!(v["items"][1]["metadata"]["name"], "q");
        let empty: serde_json::Value =
            serde_json::from_slice(&list_to_json(&mut std::iter::empty())).unwrap();
        assert_eq!(empty["items"], serde_json::json!([]));
        assert!(from_json(r#"{"metadata":{"name":1}}"#).is_err());
    }

    #[test]
    fn pull_policy_defaults_like_the_api() {
        let c = |image: &str, policy: Option<&str>| Container {
            image: Some(image.into()),
            image_pull_policy: policy.map(Into::into),
            ..Default::default()
        };
        assert_eq!(pull_policy(&c("busybox", None)), PullPolicy::Always);
        assert_eq!(pull_policy(&c("busybox:latest", None)), PullPolicy::Always);
        assert_eq!(
            pull_policy(&c("busybox:1.36", None)),
            PullPolicy::IfNotPresent
        );
        assert_eq!(
            pull_policy(&c("reg:5000/busybox", None)),
            PullPolicy::Always
        );
        assert_eq!(
            pull_policy(&c("busybox@sha256:ab", None)),
            PullPolicy::IfNotPresent
        );
        assert_eq!(pull_policy(&c("busybox", Some("Never"))), PullPolicy::Never);
        assert_eq!(
            pull_policy(&c("busybox:1", Some("Always"))),
            PullPolicy::Always
        );
    }

    #[test]
    fn port_protocols_read_the_api_spelling() {
        use crate::runtime::Protocol;
        assert_eq!(Protocol::from_api(None), Protocol::Tcp);
        assert_eq!(Protocol::from_api(Some("UDP")), Protocol::Udp);
        assert_eq!(Protocol::from_api(Some("sctp")), Protocol::Sctp);
        assert_eq!(Protocol::Udp.as_str(), "UDP");
    }

    #[test]
    fn a_pod_is_privileged_when_any_container_is() {
        use k8s_openapi::api::core::v1::{PodSpec, SecurityContext};
        let plain = Container {
            name: "a".into(),
            ..Default::default()
        };
        let mut privileged = plain.clone();
        privileged.name = "p".into();
        privileged.security_context = Some(SecurityContext {
            privileged: Some(true),
            ..Default::default()
        });
        let pod = |inits: Vec<Container>, cs: Vec<Container>| Pod {
            spec: Some(PodSpec {
                init_containers: Some(inits),
                containers: cs,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(!has_privileged_container(&pod(vec![], vec![plain.clone()])));
        assert!(has_privileged_container(&pod(
            vec![],
            vec![plain.clone(), privileged.clone()]
        )));
        assert!(has_privileged_container(&pod(
            vec![privileged],
            vec![plain]
        )));
    }

    #[test]
    fn hash_depends_on_name_and_image_only() {
        let a = Container {
            name: "a".into(),
            image: Some("busybox".into()),
            ..Default::default()
        };
        let mut b = a.clone();
        b.args = Some(vec!["x".into()]);
        assert_eq!(container_hash(&a), container_hash(&b));
        b.image = Some("busybox:2".into());
        assert_ne!(container_hash(&a), container_hash(&b));
    }
}
