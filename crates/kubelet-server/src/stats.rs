//! The stats endpoints over the agent's [`StatsService`]: `/stats/summary`,
//! `/metrics/resource` (what metrics-server scrapes for `kubectl top` and autoscalers) and
//! `/metrics/cadvisor` (the common cAdvisor series dashboards read). Rendered from the latest
//! sample: nothing is collected on the request's path.

use std::fmt::Write as _;

use jiff::Timestamp;
use kubelet_api::stats::{
    ContainerStats, CpuStats, FsStats, InterfaceStats, Machine, MemoryStats, NetworkStats,
    NodeStats, PodStats, Summary,
};

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

/// One metric family being written: `# HELP`, `# TYPE`, then its samples.
struct Family<'a> {
    out: &'a mut String,
    name: &'a str,
}

impl<'a> Family<'a> {
    fn new(out: &'a mut String, name: &'a str, kind: &str, help: &str) -> Self {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        Self { out, name }
    }

    fn sample(&mut self, labels: &[(&str, &str)], value: f64, at: Option<Timestamp>) {
        self.out.push_str(self.name);
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

/// A value and the time of its sample (none for a start time, as the kubelet writes it).
type Value = Option<(f64, Option<Timestamp>)>;

fn cpu_seconds(c: &Option<CpuStats>) -> Value {
    let c = c.as_ref()?;
    Some((c.usage_core_nano_seconds? as f64 / 1e9, Some(c.time)))
}

fn working_set(m: &Option<MemoryStats>) -> Value {
    let m = m.as_ref()?;
    Some((m.working_set_bytes? as f64, Some(m.time)))
}

fn start_seconds(t: Option<Timestamp>) -> Value {
    Some((t?.as_nanosecond() as f64 / 1e9, None))
}

/// `/metrics/resource`: the kubelet's resource metrics (names, labels, help, explicit
/// timestamps), families in name order as the kubelet's registry writes them.
pub(crate) fn resource_metrics(summary: &Summary) -> String {
    type Pick<T> = fn(&T) -> Value;
    let container: [(&str, &str, &str, Pick<ContainerStats>); 3] = [
        (
            "container_cpu_usage_seconds_total",
            "counter",
            "[STABLE] Cumulative cpu time consumed by the container in core-seconds",
            |c| cpu_seconds(&c.cpu),
        ),
        (
            "container_memory_working_set_bytes",
            "gauge",
            "[STABLE] Current working set of the container in bytes",
            |c| working_set(&c.memory),
        ),
        (
            "container_start_time_seconds",
            "gauge",
            "[STABLE] Start time of the container since unix epoch in seconds",
            |c| start_seconds(c.start_time),
        ),
    ];
    let node: [(&str, &str, &str, Pick<NodeStats>); 2] = [
        (
            "node_cpu_usage_seconds_total",
            "counter",
            "[STABLE] Cumulative cpu time consumed by the node in core-seconds",
            |n| cpu_seconds(&n.cpu),
        ),
        (
            "node_memory_working_set_bytes",
            "gauge",
            "[STABLE] Current working set of the node in bytes",
            |n| working_set(&n.memory),
        ),
    ];
    let pod: [(&str, &str, &str, Pick<PodStats>); 2] = [
        (
            "pod_cpu_usage_seconds_total",
            "counter",
            "[STABLE] Cumulative cpu time consumed by the pod in core-seconds",
            |p| cpu_seconds(&p.cpu),
        ),
        (
            "pod_memory_working_set_bytes",
            "gauge",
            "[STABLE] Current working set of the pod in bytes",
            |p| working_set(&p.memory),
        ),
    ];
    let mut out = String::new();
    for (name, kind, help, pick) in container {
        let mut f = Family::new(&mut out, name, kind, help);
        for p in &summary.pods {
            for c in &p.containers {
                if let Some((v, at)) = pick(c) {
                    let labels = [
                        ("container", c.name.as_str()),
                        ("namespace", p.pod_ref.namespace.as_str()),
                        ("pod", p.pod_ref.name.as_str()),
                    ];
                    f.sample(&labels, v, at);
                }
            }
        }
    }
    for (name, kind, help, pick) in node {
        let mut f = Family::new(&mut out, name, kind, help);
        if let Some((v, at)) = pick(&summary.node) {
            f.sample(&[], v, at);
        }
    }
    for (name, kind, help, pick) in pod {
        let mut f = Family::new(&mut out, name, kind, help);
        for p in &summary.pods {
            if let Some((v, at)) = pick(p) {
                let labels = [
                    ("namespace", p.pod_ref.namespace.as_str()),
                    ("pod", p.pod_ref.name.as_str()),
                ];
                f.sample(&labels, v, at);
            }
        }
    }
    // The sample is served whole or not at all: there is no partial scrape failure.
    for (name, help) in [
        (
            "resource_scrape_error",
            "[STABLE] 1 if there was an error while getting container metrics, 0 otherwise",
        ),
        (
            "scrape_error",
            "[ALPHA] (Deprecated since 1.29.0) 1 if there was an error while getting container metrics, 0 otherwise",
        ),
    ] {
        Family::new(&mut out, name, "gauge", help).sample(&[], 0.0, None);
    }
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
        rootfs: Option<&'a FsStats>,
        start: Option<Timestamp>,
        network: Option<&'a NetworkStats>,
    }
    let mut rows = vec![Row {
        container: "",
        id: "/".into(),
        image: "",
        namespace: "",
        pod: "",
        cpu: &summary.node.cpu,
        memory: &summary.node.memory,
        rootfs: None,
        start: summary.node.start_time,
        network: summary.node.network.as_ref(),
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
            rootfs: None,
            start: p.start_time,
            network: p.network.as_ref(),
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
                rootfs: c.rootfs.as_ref(),
                start: c.start_time,
                network: None,
            });
        }
    }
    type Pick = fn(&Row<'_>) -> Value;
    let families: [(&str, &str, &str, Pick); 6] = [
        (
            "container_cpu_usage_seconds_total",
            "counter",
            "Cumulative cpu time consumed in seconds.",
            |r| cpu_seconds(r.cpu),
        ),
        (
            "container_fs_usage_bytes",
            "gauge",
            "Number of bytes that are consumed by the container on this filesystem.",
            |r| {
                let f = r.rootfs?;
                Some((f.used_bytes? as f64, Some(f.time)))
            },
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
            |r| working_set(r.memory),
        ),
        (
            "container_start_time_seconds",
            "gauge",
            "Start time of the container since unix epoch in seconds.",
            |r| start_seconds(r.start),
        ),
    ];
    let mut out = String::new();
    for (name, kind, help, pick) in families {
        let mut f = Family::new(&mut out, name, kind, help);
        for r in &rows {
            if let Some((v, at)) = pick(r) {
                // Containers are named by their ID; pod and node rows have no name.
                let name = if r.container.is_empty() {
                    ""
                } else {
                    r.id.as_str()
                };
                let labels = [
                    ("container", r.container),
                    ("id", r.id.as_str()),
                    ("image", r.image),
                    ("name", name),
                    ("namespace", r.namespace),
                    ("pod", r.pod),
                ];
                f.sample(&labels, v, at);
            }
        }
    }
    // Network: the node's and each pod sandbox's interfaces (containers share their pod's).
    type PickIf = fn(&InterfaceStats) -> Option<u64>;
    let network: [(&str, &str, PickIf); 4] = [
        (
            "container_network_receive_bytes_total",
            "Cumulative count of bytes received",
            |i| i.rx_bytes,
        ),
        (
            "container_network_receive_errors_total",
            "Cumulative count of errors encountered while receiving",
            |i| i.rx_errors,
        ),
        (
            "container_network_transmit_bytes_total",
            "Cumulative count of bytes transmitted",
            |i| i.tx_bytes,
        ),
        (
            "container_network_transmit_errors_total",
            "Cumulative count of errors encountered while transmitting",
            |i| i.tx_errors,
        ),
    ];
    for (name, help, pick) in network {
        let mut f = Family::new(&mut out, name, "counter", help);
        for r in &rows {
            let Some(net) = r.network else { continue };
            let mut seen = std::collections::BTreeSet::new();
            let all = std::iter::once(&net.default).chain(net.interfaces.iter());
            for i in all.filter(|i| !i.name.is_empty() && seen.insert(i.name.as_str())) {
                if let Some(v) = pick(i) {
                    let labels = [
                        ("container", ""),
                        ("id", r.id.as_str()),
                        ("image", ""),
                        ("interface", i.name.as_str()),
                        ("name", ""),
                        ("namespace", r.namespace),
                        ("pod", r.pod),
                    ];
                    f.sample(&labels, v as f64, Some(net.time));
                }
            }
        }
    }
    Family::new(
        &mut out,
        "machine_cpu_cores",
        "gauge",
        "Number of logical CPU cores.",
    )
    .sample(&[], machine.num_cores as f64, None);
    Family::new(
        &mut out,
        "machine_memory_bytes",
        "gauge",
        "Amount of memory installed on the machine.",
    )
    .sample(&[], machine.memory_capacity as f64, None);
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
        assert!(
            !text.contains("container_network_receive_bytes_total{"),
            "no network figures: no series"
        );
    }

    #[test]
    fn cadvisor_network_series_are_the_pod_sandboxes_interfaces() {
        let mut s = sample();
        let mut net = NetworkStats::new(t());
        let mut eth0 = InterfaceStats::new("eth0");
        eth0.rx_bytes = Some(1500);
        eth0.tx_bytes = Some(700);
        eth0.rx_errors = Some(0);
        net.default = eth0.clone();
        net.interfaces = vec![eth0, InterfaceStats::new("lo")];
        s.pods[0].network = Some(net);
        let text = cadvisor_metrics(&s, Machine::new(2, 4096));
        assert!(
            text.contains("container_network_receive_bytes_total{container=\"\",id=\"/podu1\",image=\"\",interface=\"eth0\",name=\"\",namespace=\"default\",pod=\"web\"} 1500 1795752000000\n"),
            "{text}"
        );
        assert!(text.contains("container_network_transmit_bytes_total{container=\"\",id=\"/podu1\",image=\"\",interface=\"eth0\",name=\"\",namespace=\"default\",pod=\"web\"} 700 "), "{text}");
        assert_eq!(
            text.matches("interface=\"eth0\"").count(),
            3,
            "eth0 once per family that has a figure (the default is also listed): {text}"
        );
        assert!(
            !text.contains("interface=\"lo\""),
            "no figures, no series: {text}"
        );
        assert!(
            text.contains("# TYPE container_network_receive_bytes_total counter\n"),
            "{text}"
        );
    }
}
