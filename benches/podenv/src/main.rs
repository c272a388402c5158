//! `podenv-bench`: the cost of a container's environment when the cluster has many Services.
//!
//! Builds `--services` Services (a tenth of them in the pod's namespace, the rest spread over
//! nine others, two ports each, plus `kubernetes` in `default`) and times, over `--runs`
//! iterations, the service variables (`kubelet_core::services::service_env`) plus the
//! container's environment (`make_environment`, ten variables, one `$(VAR)` reference to a
//! service variable), against the same environment without Services in the same run.
//!
//! Run: `cargo run --release -p podenv-bench -- --services 1000`.

use bench_support::percentile;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use k8s_openapi::api::core::v1::{Container, EnvVar, Pod, Service, ServicePort, ServiceSpec};
use kubelet_core::EnvObjects;
use kubelet_core::container::{ConfigContext, make_environment};

#[derive(Debug, Parser)]
#[command(name = "podenv-bench", about)]
struct Args {
    /// Services in the cluster.
    #[arg(long, default_value_t = 1000)]
    services: usize,
    /// Iterations per figure.
    #[arg(long, default_value_t = 2000)]
    runs: usize,
}

fn service(ns: &str, name: &str, i: usize) -> Arc<Service> {
    let mut s = Service {
        spec: Some(ServiceSpec {
            cluster_ip: Some(format!(
                "10.{}.{}.{}",
                (i >> 16) & 255,
                (i >> 8) & 255,
                i & 255
            )),
            ports: Some(vec![
                ServicePort {
                    name: Some("http".into()),
                    port: 80,
                    ..Default::default()
                },
                ServicePort {
                    name: Some("metrics".into()),
                    port: 9090,
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }),
        ..Default::default()
    };
    s.metadata.name = Some(name.into());
    s.metadata.namespace = Some(ns.into());
    Arc::new(s)
}

fn main() {
    let args = Args::parse();
    let mut services = vec![service("default", "kubernetes", 1)];
    for i in 0..args.services {
        let ns = if i % 10 == 0 {
            "shop".to_string()
        } else {
            format!("ns{}", i % 10)
        };
        services.push(service(&ns, &format!("svc-{i}"), i + 2));
    }
    let mut pod = Pod::default();
    pod.metadata.name = Some("web".into());
    pod.metadata.namespace = Some("shop".into());
    let mut env: Vec<EnvVar> = (0..9)
        .map(|i| EnvVar {
            name: format!("VAR_{i}"),
            value: Some(format!("value-{i}")),
            ..Default::default()
        })
        .collect();
    env.push(EnvVar {
        name: "TARGET".into(),
        value: Some("$(SVC_0_SERVICE_HOST):$(SVC_0_SERVICE_PORT)".into()),
        ..Default::default()
    });
    let c = Container {
        name: "app".into(),
        env: Some(env),
        ..Default::default()
    };
    let volumes = HashMap::new();
    let time = |with_services: bool| {
        let mut times = Vec::with_capacity(args.runs);
        let mut vars = 0;
        for _ in 0..args.runs {
            let t = Instant::now();
            let service_env = if with_services {
                kubelet_core::services::service_env(&services, "shop", true)
            } else {
                Default::default()
            };
            let objects = EnvObjects::from_objects([], []).with_service_env(service_env);
            let ctx = ConfigContext {
                node_name: "n1",
                pod_ips: &[],
                host_ip: "",
                volume_paths: &volumes,
                restart_count: 0,
                container_type: "",
                objects: &objects,
                recorder: None,
                seccomp_profile_root: std::path::Path::new("/var/lib/kubelet/seccomp"),
            };
            let out = make_environment(&pod, &c, &ctx);
            times.push(t.elapsed());
            vars = out.map(|v| v.len()).unwrap_or(0);
        }
        times.sort();
        (percentile(&times, 0.5), percentile(&times, 0.99), vars)
    };
    let (b50, b99, bvars) = time(false);
    let (s50, s99, svars) = time(true);
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "without Services: p50 {:.1} us, p99 {:.1} us ({bvars} variables)",
        us(b50),
        us(b99)
    );
    println!(
        "with {} Services ({} in the pod's namespace): p50 {:.1} us, p99 {:.1} us ({svars} variables; p50 {:.1}x)",
        args.services,
        args.services / 10,
        us(s50),
        us(s99),
        s50.as_secs_f64() / b50.as_secs_f64()
    );
}
