//! Strategic-merge patches of pod status, shaped like the kubelet's
//! (`statusutil.PatchPodStatus`): a two-way patch from the old status to the new one, carrying
//! `metadata.uid` as a precondition, `$setElementOrder` for the lists merged by key
//! (`conditions` by `type`, `podIPs` and `hostIPs` by `ip`) and `$patch: delete` for their
//! removed items; every other changed field is replaced, removed fields are set to `null`.

use k8s_openapi::api::core::v1::PodStatus;
use serde_json::{Map, Value, json};

use crate::wire::Decoded;

/// Lists of `PodStatus` that the API merges by a key, and the key.
const MERGED_LISTS: [(&str, &str); 3] =
    [("conditions", "type"), ("podIPs", "ip"), ("hostIPs", "ip")];

/// The status as a JSON object, without empty lists (an empty merged list with an empty
/// `$setElementOrder` is an error for the API server; an absent list means the same).
fn to_object(s: Option<&PodStatus>) -> Map<String, Value> {
    match s.map(serde_json::to_value) {
        Some(Ok(Value::Object(mut m))) => {
            m.retain(|_, v| !matches!(v, Value::Array(a) if a.is_empty()));
            m
        }
        _ => Map::new(),
    }
}

/// The patch turning `old` into `new` for the pod with `uid`, or `None` when nothing changed.
pub fn pod_status_patch(uid: &str, old: Option<&PodStatus>, new: &PodStatus) -> Option<Value> {
    let old = to_object(old);
    let new = to_object(Some(new));
    let mut status = Map::new();
    for (k, v) in &new {
        if old.get(k) == Some(v) {
            continue;
        }
        if let Some((_, key)) = MERGED_LISTS.iter().find(|(l, _)| l == k) {
            let items = v.as_array().cloned().unwrap_or_default();
            let keys: Vec<&Value> = items.iter().filter_map(|i| i.get(*key)).collect();
            let order: Vec<Value> = keys.iter().map(|kv| json!({ *key: kv })).collect();
            let mut list = items.clone();
            for o in old.get(k).and_then(Value::as_array).into_iter().flatten() {
                if let Some(ok) = o.get(*key)
                    && !keys.contains(&ok)
                {
                    list.push(json!({ "$patch": "delete", *key: ok }));
                }
            }
            status.insert(format!("$setElementOrder/{k}"), Value::Array(order));
            status.insert(k.clone(), Value::Array(list));
        } else {
            status.insert(k.clone(), v.clone());
        }
    }
    for k in old.keys() {
        if !new.contains_key(k) {
            status.insert(k.clone(), Value::Null);
        }
    }
    if status.is_empty() {
        return None;
    }
    Some(json!({ "metadata": { "uid": uid }, "status": status }))
}

/// The field an API server older than our types rejected in a strategic-merge patch
/// ("unable to find api field in struct PodStatus for the json field \"hostIPs\"").
pub(crate) fn rejected_field(e: &kube::Error) -> Option<String> {
    let kube::Error::Api(s) = e else { return None };
    let rest = s.message.split("for the json field \"").nth(1)?;
    Some(rest.split('"').next()?.to_string())
}

/// Drop `fields` (and their `$setElementOrder/` companions) from a status patch.
pub(crate) fn without_fields(
    mut patch: Value,
    fields: &std::collections::HashSet<String>,
) -> Value {
    if let Some(status) = patch.get_mut("status").and_then(Value::as_object_mut) {
        status.retain(|k, _| {
            let base = k.strip_prefix("$setElementOrder/").unwrap_or(k);
            !fields.contains(base)
        });
    }
    patch
}

/// Patch the status of pod `namespace/name`, learning which fields the server does not know
/// (an older API server than the types) and leaving them out from then on.
pub(crate) async fn patch_pod_status(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    patch: Value,
    unknown: &parking_lot::RwLock<std::collections::HashSet<String>>,
) -> Result<(), kube::Error> {
    let api: kube::Api<Decoded<k8s_openapi::api::core::v1::Pod>> =
        kube::Api::namespaced(client.clone(), namespace);
    for _ in 0..8 {
        let p = without_fields(patch.clone(), &unknown.read());
        let sent_status_has = |p: &Value, f: &str| {
            p.get("status").and_then(Value::as_object).is_some_and(|m| {
                m.contains_key(f) || m.contains_key(&format!("$setElementOrder/{f}"))
            })
        };
        if p.get("status")
            .and_then(Value::as_object)
            .is_none_or(|m| m.is_empty())
        {
            return Ok(());
        }
        match api
            .patch_status(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Strategic(p.clone()),
            )
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) => match rejected_field(&e) {
                // Retry without the field, unless it was not in this patch (no progress).
                Some(f) if sent_status_has(&p, &f) => {
                    if unknown.write().insert(f.clone()) {
                        tracing::info!(field = %f, "the API server does not know pod status field {f:?}; leaving it out");
                    }
                }
                _ => return Err(e),
            },
        }
    }
    Ok(())
}

/// What [`write_pod_status`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StatusWrite {
    /// The API's copy already had this status: nothing was sent.
    Unchanged,
    /// The status was patched.
    Patched,
}

/// Write `status` to pod `namespace/name` (UID `uid`) as a patch from `old`, the status in the
/// caller's copy of the pod. That copy may lag behind the caller's own last write (the watch has
/// not brought it back yet): merged lists then keep items the patch did not know to delete (two
/// pod IPs of one family) and the API server refuses the result (422). The patch is then made
/// again from the pod as the API server has it now, once.
pub(crate) async fn write_pod_status(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    uid: &str,
    old: Option<&PodStatus>,
    status: &PodStatus,
    unknown: &parking_lot::RwLock<std::collections::HashSet<String>>,
) -> Result<StatusWrite, kube::Error> {
    let Some(patch) = pod_status_patch(uid, old, status) else {
        return Ok(StatusWrite::Unchanged);
    };
    let first = patch_pod_status(client, namespace, name, patch, unknown).await;
    let Err(refused) = first else {
        return Ok(StatusWrite::Patched);
    };
    if !crate::error::is_status(&refused, 422) {
        return Err(refused);
    }
    let api: kube::Api<Decoded<k8s_openapi::api::core::v1::Pod>> =
        kube::Api::namespaced(client.clone(), namespace);
    let fresh = match api.get(name).await {
        Ok(Decoded(p)) if p.metadata.uid.as_deref() == Some(uid) => p,
        _ => return Err(refused),
    };
    tracing::debug!(pod = %format!("{namespace}/{name}"), "status patch refused; patching again from the API server's copy");
    match pod_status_patch(uid, fresh.status.as_ref(), status) {
        None => Ok(StatusWrite::Unchanged),
        Some(patch) => patch_pod_status(client, namespace, name, patch, unknown)
            .await
            .map(|()| StatusWrite::Patched),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodIP};

    fn cond(t: &str, s: &str) -> PodCondition {
        PodCondition {
            type_: t.into(),
            status: s.into(),
            ..Default::default()
        }
    }

    #[test]
    fn unchanged_status_gives_no_patch() {
        let s = PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        };
        assert_eq!(pod_status_patch("u", Some(&s), &s), None);
    }

    #[test]
    fn patch_carries_the_uid_changed_fields_and_condition_order() {
        let old = PodStatus {
            phase: Some("Pending".into()),
            message: Some("waiting".into()),
            conditions: Some(vec![
                cond("Initialized", "True"),
                cond("Ready", "False"),
                cond("Custom", "True"),
            ]),
            ..Default::default()
        };
        let new = PodStatus {
            phase: Some("Running".into()),
            pod_ip: Some("10.0.0.1".into()),
            pod_ips: Some(vec![PodIP {
                ip: "10.0.0.1".into(),
            }]),
            conditions: Some(vec![cond("Initialized", "True"), cond("Ready", "True")]),
            ..Default::default()
        };
        let p = pod_status_patch("uid-1", Some(&old), &new).expect("a patch");
        assert_eq!(p["metadata"]["uid"], "uid-1");
        let s = &p["status"];
        assert_eq!(s["phase"], "Running");
        assert_eq!(s["message"], Value::Null, "removed fields are nulled");
        assert_eq!(s["podIP"], "10.0.0.1");
        assert_eq!(
            s["$setElementOrder/conditions"],
            json!([{"type": "Initialized"}, {"type": "Ready"}])
        );
        assert_eq!(s["$setElementOrder/podIPs"], json!([{"ip": "10.0.0.1"}]));
        let conds = s["conditions"].as_array().expect("list");
        assert!(conds.contains(&json!({"$patch": "delete", "type": "Custom"})));
        assert_eq!(conds.len(), 3);
    }

    #[test]
    fn empty_lists_are_not_sent_and_a_list_that_became_empty_is_removed() {
        let old = PodStatus {
            phase: Some("Pending".into()),
            conditions: Some(vec![cond("Custom", "True")]),
            ..Default::default()
        };
        let new = PodStatus {
            phase: Some("Failed".into()),
            conditions: Some(vec![]),
            container_statuses: Some(vec![]),
            ..Default::default()
        };
        let p = pod_status_patch("u", Some(&old), &new).expect("a patch");
        assert_eq!(p["status"], json!({"phase": "Failed", "conditions": null}));
        let p = pod_status_patch("u", None, &new).expect("a patch");
        assert_eq!(p["status"], json!({"phase": "Failed"}));
    }

    #[test]
    fn first_patch_without_an_old_status_sends_everything() {
        let new = PodStatus {
            phase: Some("Pending".into()),
            ..Default::default()
        };
        let p = pod_status_patch("u", None, &new).expect("a patch");
        assert_eq!(p["status"], json!({"phase": "Pending"}));
    }
}
