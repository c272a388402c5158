//! The node Lease (`coordination.k8s.io/v1`, namespace `kube-node-lease`): the node's
//! heartbeat, renewed every 10 s with a 40 s duration, as the kubelet's lease controller does.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use kube::Api;
use kube::api::PostParams;

use crate::error::{ApiServerError, is_status};

/// Namespace of node leases.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";
/// Longest wait between retries after errors (the kubelet's `maxBackoff`).
pub const MAX_BACKOFF: Duration = Duration::from_secs(7);
/// First wait after an error.
pub const INITIAL_BACKOFF: Duration = Duration::from_millis(200);

/// Owner reference to a Node (kind Node, API version v1).
pub fn node_owner(node_name: &str, node_uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: node_name.to_string(),
        uid: node_uid.to_string(),
        ..Default::default()
    }
}

/// The lease the node holds, renewed at `now`.
pub fn desired_lease(
    node_name: &str,
    node_uid: Option<&str>,
    duration_seconds: i32,
    now: Timestamp,
    base: Option<Lease>,
) -> Lease {
    let mut lease = base.unwrap_or_else(|| Lease {
        metadata: ObjectMeta {
            name: Some(node_name.to_string()),
            namespace: Some(LEASE_NAMESPACE.to_string()),
            ..Default::default()
        },
        ..Default::default()
    });
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = Some(node_name.to_string());
    spec.lease_duration_seconds = Some(duration_seconds);
    spec.renew_time = Some(MicroTime(now));
    if let Some(uid) = node_uid {
        let owners = lease.metadata.owner_references.get_or_insert_with(Vec::new);
        if !owners.iter().any(|o| o.kind == "Node" && o.uid == uid) {
            owners.retain(|o| o.kind != "Node");
            owners.push(node_owner(node_name, uid));
        }
    }
    lease
}

/// Renew (or create) the lease once. Returns the lease as stored.
pub(crate) async fn renew(
    api: &Api<Lease>,
    node_name: &str,
    node_uid: Option<&str>,
    duration_seconds: i32,
    last: Option<Lease>,
) -> Result<Lease, ApiServerError> {
    let err = |source| ApiServerError::RenewLease {
        node: node_name.to_string(),
        source,
    };
    let pp = PostParams::default();
    // Update from the last lease we wrote (one request); on a conflict or without one, read it.
    if let Some(last) = last {
        let lease = desired_lease(
            node_name,
            node_uid,
            duration_seconds,
            Timestamp::now(),
            Some(last),
        );
        match api.replace(node_name, &pp, &lease).await {
            Ok(l) => return Ok(l),
            Err(e) if is_status(&e, 409) || is_status(&e, 404) => {}
            Err(e) => return Err(err(e)),
        }
    }
    match api.get_opt(node_name).await.map_err(err)? {
        Some(current) => {
            let lease = desired_lease(
                node_name,
                node_uid,
                duration_seconds,
                Timestamp::now(),
                Some(current),
            );
            api.replace(node_name, &pp, &lease).await.map_err(err)
        }
        None => {
            let lease = desired_lease(
                node_name,
                node_uid,
                duration_seconds,
                Timestamp::now(),
                None,
            );
            api.create(&pp, &lease).await.map_err(err)
        }
    }
}

/// Next backoff after `current`: doubled, capped at [`MAX_BACKOFF`].
pub fn next_backoff(current: Duration) -> Duration {
    (current * 2).min(MAX_BACKOFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_holds_the_node_for_forty_seconds_owned_by_the_node() {
        let l = desired_lease("node-1", Some("uid-n"), 40, Timestamp::UNIX_EPOCH, None);
        let spec = l.spec.as_ref().expect("spec");
        assert_eq!(spec.holder_identity.as_deref(), Some("node-1"));
        assert_eq!(spec.lease_duration_seconds, Some(40));
        assert_eq!(l.metadata.namespace.as_deref(), Some(LEASE_NAMESPACE));
        let owners = l.metadata.owner_references.as_ref().expect("owner");
        assert_eq!(
            (
                owners[0].kind.as_str(),
                owners[0].name.as_str(),
                owners[0].uid.as_str()
            ),
            ("Node", "node-1", "uid-n")
        );
        // Renewing keeps one owner and moves the renew time.
        let later = Timestamp::UNIX_EPOCH + jiff::SignedDuration::from_secs(10);
        let l2 = desired_lease("node-1", Some("uid-n"), 40, later, Some(l));
        assert_eq!(l2.metadata.owner_references.as_ref().map(Vec::len), Some(1));
        assert_eq!(l2.spec.and_then(|s| s.renew_time), Some(MicroTime(later)));
    }

    #[test]
    fn backoff_doubles_up_to_seven_seconds() {
        let mut b = INITIAL_BACKOFF;
        let mut seen = vec![];
        for _ in 0..8 {
            seen.push(b);
            b = next_backoff(b);
        }
        assert_eq!(seen[1], Duration::from_millis(400));
        assert_eq!(*seen.last().expect("some"), MAX_BACKOFF);
    }
}
