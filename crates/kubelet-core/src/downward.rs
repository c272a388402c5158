//! The Downward API's values, shared by `downwardAPI` volumes and `valueFrom` env: a pod's
//! metadata by field path (the kubelet's `fieldpath.ExtractFieldPathAsString`, with label and
//! annotation maps formatted as `FormatMap` does) and a container's resources scaled by a
//! divisor (`ExtractContainerResourceValue`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use kubelet_api::pod;
use kubelet_api::quantity;

/// Why a Downward API value cannot be given (the kubelet's messages).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DownwardError {
    /// A `fieldRef` path the kubelet does not serve.
    #[error("unsupported fieldPath: {0}")]
    FieldPath(String),
    /// A `resourceFieldRef` resource other than `limits.*`/`requests.*` of CPU, memory or
    /// ephemeral storage.
    #[error("unsupported container resource : {0}")]
    Resource(String),
    /// The container's own quantity does not parse.
    #[error("invalid quantity {quantity:?} for {resource}")]
    Quantity { quantity: String, resource: String },
    /// The divisor does not parse.
    #[error("invalid divisor {divisor:?} for {resource}")]
    Divisor { divisor: String, resource: String },
    /// The divisor parses but is not one the API accepts.
    #[error("divisor {divisor:?} of {resource} is not supported (supported values: {supported})")]
    UnsupportedDivisor {
        divisor: String,
        resource: String,
        supported: &'static str,
    },
}

/// The value of `path` for a `downwardAPI` volume item: `metadata.name`, `metadata.namespace`,
/// `metadata.uid`, `metadata.labels`, `metadata.annotations` (each map as sorted `key="value"`
/// lines) and `metadata.labels['key']` / `metadata.annotations['key']` (empty when the key is
/// absent). Anything else is the kubelet's `unsupported fieldPath` error.
pub(crate) fn field_path_value(p: &Pod, path: &str) -> Result<String, DownwardError> {
    let labels = p.metadata.labels.as_ref();
    let annotations = p.metadata.annotations.as_ref();
    let subscript = |prefix: &str, map: Option<&BTreeMap<String, String>>| {
        let key = path.strip_prefix(prefix)?.strip_suffix("']")?;
        Some(map.and_then(|m| m.get(key)).cloned().unwrap_or_default())
    };
    match path {
        "metadata.name" => Ok(pod::name(p).to_string()),
        "metadata.namespace" => Ok(pod::namespace(p).to_string()),
        "metadata.uid" => Ok(pod::uid(p).to_string()),
        "metadata.labels" => Ok(format_map(labels)),
        "metadata.annotations" => Ok(format_map(annotations)),
        _ => subscript("metadata.labels['", labels)
            .or_else(|| subscript("metadata.annotations['", annotations))
            .ok_or_else(|| DownwardError::FieldPath(path.to_string())),
    }
}

/// The kubelet's `FormatMap`: one `key="value"` line per entry in key order, values quoted as
/// Go's `%q`, no trailing newline.
pub(crate) fn format_map(m: Option<&BTreeMap<String, String>>) -> String {
    let mut out = String::new();
    for (k, v) in m.into_iter().flatten() {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(k);
        out.push('=');
        go_quote(v, &mut out);
    }
    out
}

/// Go's `strconv.Quote` for a valid UTF-8 string.
fn go_quote(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x80 && (c < ' ' || c == '\u{7f}') => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_control() => {
                if (c as u32) < 0x10000 {
                    out.push_str(&format!("\\u{:04x}", c as u32));
                } else {
                    out.push_str(&format!("\\U{:08x}", c as u32));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The node's capacity a container without a limit is given in the Downward API (the
/// kubelet uses the node's allocatable).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct NodeCapacity {
    /// CPUs, in millicores.
    pub(crate) cpu_milli: i64,
    /// Memory, in bytes.
    pub(crate) memory_bytes: i64,
    /// Ephemeral storage, in bytes (0 when unknown).
    pub(crate) ephemeral_storage_bytes: i64,
}

impl NodeCapacity {
    /// This host's CPUs (those the agent may use) and `MemTotal`.
    pub(crate) fn of_host() -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let memory_kib = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find_map(|l| l.strip_prefix("MemTotal:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok())
            })
            .unwrap_or(0);
        Self {
            cpu_milli: i64::try_from(cpus).unwrap_or(1).saturating_mul(1000),
            memory_bytes: memory_kib.saturating_mul(1024),
            ephemeral_storage_bytes: 0,
        }
    }
}

/// The value of `resource` (`limits.cpu`, `requests.memory`, `limits.ephemeral-storage`, …) of
/// container `c`, divided by `divisor` and rounded up, as the kubelet's
/// `ExtractContainerResourceValue`. An unset or zero divisor is 1 (the API server stores an
/// unset divisor as `"0"`); otherwise it must be one the API accepts (`1m` or `1` for CPU, `1`,
/// `1k` … `1E`, `1Ki` … `1Ei` for memory and storage). An unset limit is the node's allocatable
/// (`node`); an unset request is 0.
pub(crate) fn container_resource_value(
    c: &Container,
    resource: &str,
    divisor: Option<&Quantity>,
    node: &NodeCapacity,
) -> Result<String, DownwardError> {
    let unsupported = || DownwardError::Resource(resource.to_string());
    let (kind, name) = resource.split_once('.').ok_or_else(unsupported)?;
    let r = c.resources.as_ref();
    let map = match kind {
        "limits" => r.and_then(|r| r.limits.as_ref()),
        "requests" => r.and_then(|r| r.requests.as_ref()),
        _ => return Err(unsupported()),
    };
    let set = map.and_then(|m| m.get(name));
    let divisor = divisor.map(|d| d.0.trim()).unwrap_or("");
    let bad = |q: &str| DownwardError::Quantity {
        quantity: q.to_string(),
        resource: resource.to_string(),
    };
    match name {
        "cpu" => {
            let milli = match set {
                Some(q) => quantity::parse_milli(&q.0).map_err(|_| bad(&q.0))?,
                None if kind == "limits" => node.cpu_milli,
                None => 0,
            };
            let d = divisor_value(divisor, resource, quantity::parse_milli, CPU_DIVISORS)?;
            Ok(div_ceil(milli, d).to_string())
        }
        "memory" | "ephemeral-storage" => {
            let bytes = match set {
                Some(q) => quantity::parse_bytes(&q.0).map_err(|_| bad(&q.0))?,
                None if kind == "limits" && name == "memory" => node.memory_bytes,
                None if kind == "limits" => node.ephemeral_storage_bytes,
                None => 0,
            };
            let d = divisor_value(divisor, resource, quantity::parse_bytes, BYTE_DIVISORS)?;
            Ok(div_ceil(bytes, d).to_string())
        }
        _ => Err(unsupported()),
    }
}

/// The divisors the API accepts for CPU (`validContainerResourceDivisorForCPU`), in millicores.
const CPU_DIVISORS: (&[i64], &str) = (&[1, 1000], "1m, 1");
/// The divisors the API accepts for memory and storage, in bytes.
const BYTE_DIVISORS: (&[i64], &str) = (
    &[
        1,
        1_000,
        1_000_000,
        1_000_000_000,
        1_000_000_000_000,
        1_000_000_000_000_000,
        1_000_000_000_000_000_000,
        1 << 10,
        1 << 20,
        1 << 30,
        1 << 40,
        1 << 50,
        1 << 60,
    ],
    "1, 1k, 1M, 1G, 1T, 1P, 1E, 1Ki, 1Mi, 1Gi, 1Ti, 1Pi, 1Ei",
);

/// `divisor` in the unit of `parse`: 1 (one core or one byte) when empty or zero, else one of
/// `allowed`.
fn divisor_value(
    divisor: &str,
    resource: &str,
    parse: fn(&str) -> Result<i64, quantity::QuantityError>,
    (allowed, names): (&[i64], &'static str),
) -> Result<i64, DownwardError> {
    let one = parse("1").unwrap_or(1);
    if divisor.is_empty() {
        return Ok(one);
    }
    let value = parse(divisor).map_err(|_| DownwardError::Divisor {
        divisor: divisor.to_string(),
        resource: resource.to_string(),
    })?;
    match value {
        0 => Ok(one),
        v if allowed.contains(&v) => Ok(v),
        _ => Err(DownwardError::UnsupportedDivisor {
            divisor: divisor.to_string(),
            resource: resource.to_string(),
            supported: names,
        }),
    }
}

fn div_ceil(v: i64, d: i64) -> i64 {
    v.div_euclid(d) + i64::from(v.rem_euclid(d) != 0)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ResourceRequirements;

    fn pod() -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("web".into());
        p.metadata.namespace = Some("ns".into());
        p.metadata.uid = Some("u-1".into());
        p.metadata.labels = Some(
            [("b", "two"), ("a", "one \"quoted\"\nline")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        p
    }

    #[test]
    fn field_paths_and_maps_are_formatted_as_the_kubelet_does() {
        let p = pod();
        assert_eq!(field_path_value(&p, "metadata.name").unwrap(), "web");
        assert_eq!(field_path_value(&p, "metadata.namespace").unwrap(), "ns");
        assert_eq!(field_path_value(&p, "metadata.uid").unwrap(), "u-1");
        assert_eq!(
            field_path_value(&p, "metadata.labels").unwrap(),
            "a=\"one \\\"quoted\\\"\\nline\"\nb=\"two\""
        );
        assert_eq!(field_path_value(&p, "metadata.labels['b']").unwrap(), "two");
        assert_eq!(field_path_value(&p, "metadata.labels['zz']").unwrap(), "");
        assert_eq!(field_path_value(&p, "metadata.annotations").unwrap(), "");
        assert_eq!(
            field_path_value(&p, "spec.nodeName")
                .unwrap_err()
                .to_string(),
            "unsupported fieldPath: spec.nodeName"
        );
        let mut q = String::new();
        go_quote("tab\there \u{1} \u{7f} é \u{85}", &mut q);
        assert_eq!(q, "\"tab\\there \\x01 \\x7f é \\u0085\"");
    }

    #[test]
    fn resources_are_divided_and_rounded_up_with_the_node_as_the_default_limit() {
        let c = Container {
            resources: Some(ResourceRequirements {
                limits: Some(
                    [("cpu".to_string(), Quantity("250m".into()))]
                        .into_iter()
                        .collect(),
                ),
                requests: Some(
                    [("memory".to_string(), Quantity("64Mi".into()))]
                        .into_iter()
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        let node = NodeCapacity {
            cpu_milli: 4000,
            memory_bytes: 8 << 30,
            ephemeral_storage_bytes: 0,
        };
        let v = |r: &str, d: Option<&str>| {
            container_resource_value(&c, r, d.map(|d| Quantity(d.into())).as_ref(), &node)
        };
        assert_eq!(v("limits.cpu", None).unwrap(), "1");
        assert_eq!(v("limits.cpu", Some("1m")).unwrap(), "250");
        assert_eq!(v("requests.memory", Some("1Mi")).unwrap(), "64");
        assert_eq!(v("requests.memory", None).unwrap(), "67108864");
        assert_eq!(v("limits.memory", Some("1Gi")).unwrap(), "8");
        assert_eq!(v("requests.cpu", None).unwrap(), "0");
        assert!(v("limits.gpu", None).is_err());
        // The API server stores an unset divisor as "0": the kubelet reads it as 1.
        assert_eq!(v("limits.cpu", Some("0")).unwrap(), "1");
        assert_eq!(v("requests.memory", Some("0")).unwrap(), "67108864");
        assert_eq!(v("limits.memory", Some("1G")).unwrap(), "9");
        let err = v("limits.cpu", Some("-1")).unwrap_err().to_string();
        assert!(err.contains("divisor \"-1\""), "{err}");
        let err = v("limits.cpu", Some("1Mi")).unwrap_err();
        assert!(
            matches!(&err, DownwardError::UnsupportedDivisor { supported, .. } if *supported == "1m, 1"),
            "{err}"
        );
        assert!(err.to_string().contains("supported values: 1m, 1"), "{err}");
        let err = v("limits.memory", Some("3")).unwrap_err().to_string();
        assert!(err.contains("not supported"), "{err}");
        assert!(v("limits.memory", Some("x")).is_err());
    }
}
