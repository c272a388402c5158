//! The stats endpoints over the agent's [`StatsService`]: `/stats/summary`,
//! `/metrics/resource` (what metrics-server scrapes for `kubectl top` and autoscalers) and
//! `/metrics/cadvisor` (the common cAdvisor series dashboards read). Rendered from the latest
//! sample: nothing is collected on the request's path.

use std::fmt::Write as _;

use jiff::Timestamp;
use kubelet_api::stats::{ContainerStats, CpuStats, Machine, MemoryStats, PodStats, Summary};

/// The Prometheus text format the kubelet's `/metrics/resource` and `/metrics/cadvisor` use.
pub(crate) const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// True when the query asks for `only_cpu_and_memory` exactly once, with the value `true` (the
/// kubelet's rule).
pub(crate) fn only_cpu_and_memory(query: &str) -> bool {
    let values: Vec<&str> = query
        .split('&')
        .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
        .filter(|(k, _)| *k == "only_cpu_and_memory")
        .map(|(_, v)| v)
        .collect();
    values == ["true"]
}

/// The `/stats/summary` body.
pub(crate) fn summary_json(
    summary: &Summary,
    only_cpu_and_memory: bool,
) -> serde_json::Result<String> {
    if only_cpu_and_memory {
        serde_json::to_string(&summary.cpu_and_memory())
    } else {
        serde_json::to_string(summary)
    }
}

/// One metric family being written: `# HELP`, `# TYPE`, then samples.
struct Family<'a> {
    out: &'a mut String,
}

impl<'a> Family<'a> {
    fn new(out: &'a mut String, name: &str, kind: &str, help: &str) -> Self {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        Self { out }
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64, at: Option<Timestamp>) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape(v));
            }
            self.out.push('}');
        }
        let _ = write!(self.out, " {}", format_value(value));
        if let Some(at) = at {
            let _ = write!(self.out, " {}", at.as_millisecond());
        }
        self.out.push('\n');
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn format_value(v: f64) -> String {
    if v.is_finite() && v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

fn cpu_seconds(c: &Option<CpuStats>) -> Option<(f64, Timestamp)> {
    let c = c.as_ref()?;
    Some((c.usage_core_nano_seconds? as f64 / 1e9, c.time))
}

fn working_set(m: &Option<MemoryStats>) -> Option<(f64, Timestamp)> {
    let m = m.as_ref()?;
    Some((m.working_set_bytes? as f64, m.time))
}

fn containers(summary: &Summary) -> impl Iterator<Item = (&PodStats, &ContainerStats)> {
    summary
        .pods
        .iter()
        .flat_map(|p| p.containers.iter().map(move |c| (p, c)))
}

/// `/metrics/resource`: the kubelet's resource metrics (names, labels, help, explicit
/// timestamps), families in name order as the kubelet's registry writes them.
pub(crate) fn resource_metrics(summary: &Summary) -> String {
    let mut out = String::new();
    let mut f = Family::new(
        &mut out,
        "container_cpu_usage_seconds_total",
        "counter",
        "[STABLE] Cumulative cpu time consumed by the container in core-seconds",
    );
    for (p, c) in containers(summary) {
        if let Some((v, at)) = cpu_seconds(&c.cpu) {
            let labels = [
                ("container", c.name.as_str()),
                ("namespace", p.pod_ref.namespace.as_str()),
                ("pod", p.pod_ref.name.as_str()),
            ];
            f.sample("container_cpu_usage_seconds_total", &labels, v, Some(at));
        }
    }
    let mut f = Family::new(
        &mut out,
        "container_memory_working_set_bytes",
        "gauge",
        "[STABLE] Current working set of the container in bytes",
    );
    for (p, c) in containers(summary) {
        if let Some((v, at)) = working_set(&c.memory) {
            let labels = [
                ("container", c.name.as_str()),
                ("namespace", p.pod_ref.namespace.as_str()),
                ("pod", p.pod_ref.name.as_str()),
            ];
            f.sample("container_memory_working_set_bytes", &labels, v, Some(at));
        }
    }
    let mut f = Family::new(
        &mut out,
        "container_start_time_seconds",
        "gauge",
        "[STABLE] Start time of the container since unix epoch in seconds",
    );
    for (p, c) in containers(summary) {
        if let Some(t) = c.start_time {
            let labels = [
                ("container", c.name.as_str()),
                ("namespace", p.pod_ref.namespace.as_str()),
                ("pod", p.pod_ref.name.as_str()),
            ];
            let secs = t.as_nanosecond() as f64 / 1e9;
            f.sample("container_start_time_seconds", &labels, secs, None);
        }
    }
    let mut f = Family::new(
        &mut out,
        "node_cpu_usage_seconds_total",
        "counter",
        "[STABLE] Cumulative cpu time consumed by the node in core-seconds",
    );
    if let Some((v, at)) = cpu_seconds(&summary.node.cpu) {
        f.sample("node_cpu_usage_seconds_total", &[], v, Some(at));
    }
    let mut f = Family::new(
        &mut out,
        "node_memory_working_set_bytes",
        "gauge",
        "[STABLE] Current working set of the node in bytes",
    );
    if let Some((v, at)) = working_set(&summary.node.memory) {
        f.sample("node_memory_working_set_bytes", &[], v, Some(at));
    }
    let mut f = Family::new(
        &mut out,
        "pod_cpu_usage_seconds_total",
        "counter",
        "[STABLE] Cumulative cpu time consumed by the pod in core-seconds",
    );
    for p in &summary.pods {
        if let Some((v, at)) = cpu_seconds(&p.cpu) {
            let labels = [
                ("namespace", p.pod_ref.namespace.as_str()),
                ("pod", p.pod_ref.name.as_str()),
            ];
            f.sample("pod_cpu_usage_seconds_total", &labels, v, Some(at));
        }
    }
    let mut f = Family::new(
        &mut out,
        "pod_memory_working_set_bytes",
        "gauge",
        "[STABLE] Current working set of the pod in bytes",
    );
    for p in &summary.pods {
        if let Some((v, at)) = working_set(&p.memory) {
            let labels = [
                ("namespace", p.pod_ref.namespace.as_str()),
                ("pod", p.pod_ref.name.as_str()),
            ];
            f.sample("pod_memory_working_set_bytes", &labels, v, Some(at));
        }
    }
    // The sample is served whole or not at all: there is no partial scrape failure.
    let mut f = Family::new(
        &mut out,
        "resource_scrape_error",
        "gauge",
        "[STABLE] 1 if there was an error while getting container metrics, 0 otherwise",
    );
    f.sample("resource_scrape_error", &[], 0.0, None);
    let mut f = Family::new(
        &mut out,
        "scrape_error",
        "gauge",
        "[ALPHA] (Deprecated since 1.29.0) 1 if there was an error while getting container metrics, 0 otherwise",
    );
    f.sample("scrape_error", &[], 0.0, None);
    out
}

/// `/metrics/cadvisor`: the machine's capacity and the common container series, labelled as
/// cAdvisor labels them for the kubelet (`container`, `id`, `image`, `name`, `namespace`,
/// `pod`). Containers' `id` and `name` are the runtime's container ID; the pod rows have an
/// empty `container` and `image`; the node row has `id="/"`.
pub(crate) fn cadvisor_metrics(summary: &Summary, machine: Machine) -> String {
    struct Row<'a> {
        container: &'a str,
        id: String,
        image: &'a str,
        namespace: &'a str,
        pod: &'a str,
        cpu: &'a Option<CpuStats>,
        memory: &'a Option<MemoryStats>,
        fs_used: Option<(f64, Timestamp)>,
        start: Option<Timestamp>,
    }
    let mut rows = vec![Row {
        container: "",
        id: "/".into(),
        image: "",
        namespace: "",
        pod: "",
        cpu: &summary.node.cpu,
        memory: &summary.node.memory,
        fs_used: None,
        start: summary.node.start_time,
    }];
    for p in &summary.pods {
        rows.push(Row {
            container: "",
            id: format!("/pod{}", p.pod_ref.uid),
            image: "",
            namespace: &p.pod_ref.namespace,
            pod: &p.pod_ref.name,
            cpu: &p.cpu,
            memory: &p.memory,
            fs_used: None,
            start: p.start_time,
        });
        for c in &p.containers {
            rows.push(Row {
                container: &c.name,
                id: c.container_id.clone(),
                image: &c.image,
                namespace: &p.pod_ref.namespace,
                pod: &p.pod_ref.name,
                cpu: &c.cpu,
                memory: &c.memory,
                fs_used: c
                    .rootfs
                    .as_ref()
                    .and_then(|r| Some((r.used_bytes? as f64, r.time))),
                start: c.start_time,
            });
        }
    }
    let labels = |r: &'_ Row<'_>| -> Vec<(&'static str, String)> {
        vec![
            ("container", r.container.to_string()),
            ("id", r.id.clone()),
            ("image", r.image.to_string()),
            (
                "name",
                if r.container.is_empty() {
                    String::new()
                } else {
                    r.id.clone()
                },
            ),
            ("namespace", r.namespace.to_string()),
            ("pod", r.pod.to_string()),
        ]
    };
    type Pick = fn(&Row<'_>) -> Option<(f64, Option<Timestamp>)>;
    let families: [(&str, &str, &str, Pick); 6] = [
        (
            "container_cpu_usage_seconds_total",
            "counter",
            "Cumulative cpu time consumed in seconds.",
            |r| cpu_seconds(r.cpu).map(|(v, t)| (v, Some(t))),
        ),
        (
            "container_fs_usage_bytes",
            "gauge",
            "Number of bytes that are consumed by the container on this filesystem.",
            |r| r.fs_used.map(|(v, t)| (v, Some(t))),
        ),
        (
            "container_memory_rss",
            "gauge",
            "Size of RSS in bytes.",
            |r| {
                let m = r.memory.as_ref()?;
                Some((m.rss_bytes? as f64, Some(m.time)))
            },
        ),
        (
            "container_memory_usage_bytes",
            "gauge",
            "Current memory usage in bytes, including all memory regardless of when it was accessed",
            |r| {
                let m = r.memory.as_ref()?;
                Some((m.usage_bytes? as f64, Some(m.time)))
            },
        ),
        (
            "container_memory_working_set_bytes",
            "gauge",
            "Current working set in bytes.",
            |r| working_set(r.memory).map(|(v, t)| (v, Some(t))),
        ),
        (
            "container_start_time_seconds",
            "gauge",
            "Start time of the container since unix epoch in seconds.",
            |r| Some((r.start?.as_nanosecond() as f64 / 1e9, None)),
        ),
    ];
    let mut out = String::new();
    for (name, kind, help, pick) in families {
        let mut f = Family::new(&mut out, name, kind, help);
        for r in &rows {
            if let Some((v, at)) = pick(r) {
                let l = labels(r);
                let l: Vec<(&str, &str)> = l.iter().map(|(k, v)| (*k, v.as_str())).collect();
                f.sample(name, &l, v, at);
            }
        }
    }
    let mut f = Family::new(
        &mut out,
        "machine_cpu_cores",
        "gauge",
        "Number of logical CPU cores.",
    );
    f.sample("machine_cpu_cores", &[], machine.num_cores as f64, None);
    let mut f = Family::new(
        &mut out,
        "machine_memory_bytes",
        "gauge",
        "Amount of memory installed on the machine.",
    );
    f.sample(
        "machine_memory_bytes",
        &[],
        machine.memory_capacity as f64,
        None,
    );
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use kubelet_api::stats::{PodReference, PodStats};

    fn t() -> Timestamp {
        "2026-11-27T04:00:00Z".parse().expect("a timestamp")
    }

    fn sample() -> Summary {
        let mut s = Summary::new("n");
        let mut cpu = CpuStats::new(t());
        cpu.usage_core_nano_seconds = Some(2_500_000_000);
        let mut mem = MemoryStats::new(t());
        mem.working_set_bytes = Some(1024);
        mem.rss_bytes = Some(512);
        s.node.cpu = Some(cpu.clone());
        s.node.memory = Some(mem.clone());
        let mut p = PodStats::new(PodReference::new("default", "web", "u1"));
        p.cpu = Some(cpu.clone());
        p.memory = Some(mem.clone());
        let mut c = ContainerStats::new("app\"x");
        c.cpu = Some(cpu);
        c.memory = Some(mem);
        c.start_time = Some(t());
        c.container_id = "cid".into();
        c.image = "busybox:1".into();
        p.containers.push(c);
        s.pods.push(p);
        s
    }

    #[test]
    fn only_cpu_and_memory_needs_exactly_one_true() {
        assert!(only_cpu_and_memory("only_cpu_and_memory=true"));
        assert!(only_cpu_and_memory("a=b&only_cpu_and_memory=true"));
        assert!(!only_cpu_and_memory("only_cpu_and_memory=TRUE"));
        assert!(!only_cpu_and_memory(
            "only_cpu_and_memory=true&only_cpu_and_memory=true"
        ));
        assert!(!only_cpu_and_memory(""));
    }

    #[test]
    fn resource_metrics_have_the_kubelets_names_labels_and_timestamps() {
        let text = resource_metrics(&sample());
        assert!(
            text.contains("# TYPE node_cpu_usage_seconds_total counter\n"),
            "{text}"
        );
        assert!(
            text.contains("node_cpu_usage_seconds_total 2.5 1795752000000\n"),
            "{text}"
        );
        assert!(
            text.contains("node_memory_working_set_bytes 1024 1795752000000\n"),
            "{text}"
        );
        assert!(
            text.contains("container_cpu_usage_seconds_total{container=\"app\\\"x\",namespace=\"default\",pod=\"web\"} 2.5 1795752000000\n"),
            "{text}"
        );
        assert!(text.contains("container_start_time_seconds{container=\"app\\\"x\",namespace=\"default\",pod=\"web\"} 1795752000\n"), "{text}");
        assert!(text.contains("pod_memory_working_set_bytes{namespace=\"default\",pod=\"web\"} 1024 1795752000000\n"), "{text}");
        assert!(text.contains("\nresource_scrape_error 0\n"), "{text}");
        // Families come in name order, each once.
        let names: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .collect();
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(names, sorted);
    }

    #[test]
    fn cadvisor_metrics_label_containers_pods_and_the_machine() {
        let text = cadvisor_metrics(&sample(), Machine::new(2, 4096));
        assert!(text.contains("machine_cpu_cores 2\n"), "{text}");
        assert!(text.contains("machine_memory_bytes 4096\n"), "{text}");
        assert!(
            text.contains("container_memory_rss{container=\"app\\\"x\",id=\"cid\",image=\"busybox:1\",name=\"cid\",namespace=\"default\",pod=\"web\"} 512 1795752000000\n"),
            "{text}"
        );
        assert!(
            text.contains("container_cpu_usage_seconds_total{container=\"\",id=\"/podu1\",image=\"\",name=\"\",namespace=\"default\",pod=\"web\"} 2.5"),
            "{text}"
        );
        assert!(
            text.contains("container_memory_working_set_bytes{container=\"\",id=\"/\",image=\"\",name=\"\",namespace=\"\",pod=\"\"} 1024"),
            "{text}"
        );
    }
}
