//! Probe specifications: the domain form of a Kubernetes `Probe`, with the API defaults applied
//! and named ports resolved.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, EnvVar, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kubelet_api::ProbeType;

use kubelet_net::http::SpecError;

use crate::error::ProbeError;

/// `periodSeconds` default.
pub const DEFAULT_PERIOD: Duration = Duration::from_secs(10);
/// `timeoutSeconds` default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// `failureThreshold` default.
pub const DEFAULT_FAILURE_THRESHOLD: u32 = 3;

/// When and how often a probe runs, and how many equal results flip its state.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProbeTiming {
    /// `initialDelaySeconds`: no probe until the container has run this long.
    pub initial_delay: Duration,
    /// `periodSeconds`.
    pub period: Duration,
    /// `timeoutSeconds`: each probe attempt must finish within it.
    pub timeout: Duration,
    /// `successThreshold`: consecutive successes that make the result Success.
    pub success_threshold: u32,
    /// `failureThreshold`: consecutive failures that make the result Failure.
    pub failure_threshold: u32,
}

impl Default for ProbeTiming {
    fn default() -> Self {
        Self {
            initial_delay: Duration::ZERO,
            period: DEFAULT_PERIOD,
            timeout: DEFAULT_TIMEOUT,
            success_threshold: 1,
            failure_threshold: DEFAULT_FAILURE_THRESHOLD,
        }
    }
}

impl ProbeTiming {
    /// Timing with the given period and the other fields at their API defaults.
    pub fn with_period(period: Duration) -> Self {
        Self {
            period,
            ..Self::default()
        }
    }
}

use kubelet_net::http::HttpGetSpec;

/// What a probe does.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProbeHandler {
    /// Run a command in the container; exit code 0 is success.
    Exec {
        /// The command, `$(VAR)` references already expanded.
        command: Vec<String>,
    },
    /// An HTTP GET; status 200–399 is success.
    HttpGet(HttpGetSpec),
    /// A TCP connect; an established connection is success.
    TcpSocket {
        /// Host; `None` means the pod IP.
        host: Option<String>,
        /// Port.
        port: u16,
    },
    /// `grpc.health.v1.Health/Check`; `SERVING` is success.
    Grpc {
        /// Port (on the pod IP).
        port: u16,
        /// The `service` field of the request.
        service: String,
    },
}

impl ProbeHandler {
    /// Short name of the handler kind (`exec`, `http`, `tcp`, `grpc`).
    pub fn kind(&self) -> &'static str {
        match self {
            ProbeHandler::Exec { .. } => "exec",
            ProbeHandler::HttpGet(_) => "http",
            ProbeHandler::TcpSocket { .. } => "tcp",
            ProbeHandler::Grpc { .. } => "grpc",
        }
    }
}

/// A complete probe: handler, timing and the probe-level grace period.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProbeSpec {
    /// What to run.
    pub handler: ProbeHandler,
    /// When to run it and how results count.
    pub timing: ProbeTiming,
    /// Probe-level `terminationGracePeriodSeconds` (the engine applies it to kills caused by
    /// liveness and startup failures).
    pub termination_grace_period_seconds: Option<i64>,
}

impl ProbeSpec {
    /// A probe with the given handler and timing.
    pub fn new(handler: ProbeHandler, timing: ProbeTiming) -> Self {
        Self {
            handler,
            timing,
            termination_grace_period_seconds: None,
        }
    }

    /// Convert a Kubernetes probe of `container`: API defaults applied, named ports resolved
    /// from `container.ports`, exec commands expanded with the container's static environment.
    pub fn from_k8s(
        probe: &Probe,
        container: &Container,
        probe_type: ProbeType,
    ) -> Result<Self, ProbeError> {
        let timing = timing_from_k8s(probe, container, probe_type)?;
        let handler = handler_from_k8s(probe, container)?;
        // API validation: the probe-level grace period is for the kills liveness and startup
        // failures cause; readiness probes must not set it, and it must be positive.
        match (probe.termination_grace_period_seconds, probe_type) {
            (Some(_), ProbeType::Readiness) => {
                return Err(ProbeError::InvalidField {
                    container: container.name.clone(),
                    field: "terminationGracePeriodSeconds",
                    reason: "must not be set for readiness probes".to_string(),
                });
            }
            (Some(g), _) if g < 1 => {
                return Err(ProbeError::InvalidField {
                    container: container.name.clone(),
                    field: "terminationGracePeriodSeconds",
                    reason: format!("must be greater than 0, got {g}"),
                });
            }
            _ => {}
        }
        Ok(Self {
            handler,
            timing,
            termination_grace_period_seconds: probe.termination_grace_period_seconds,
        })
    }
}

/// Timing of a Kubernetes probe with API defaults (an unset or zero field takes its default).
pub fn timing_from_k8s(
    probe: &Probe,
    container: &Container,
    probe_type: ProbeType,
) -> Result<ProbeTiming, ProbeError> {
    let field = |name: &'static str, v: Option<i32>, default: i64, min: i64| {
        let v = i64::from(v.unwrap_or(0));
        let v = if v == 0 { default } else { v };
        if v < min {
            return Err(ProbeError::InvalidField {
                container: container.name.clone(),
                field: name,
                reason: format!("must be at least {min}, got {v}"),
            });
        }
        Ok(v)
    };
    let secs = |v: i64| Duration::from_secs(u64::try_from(v).unwrap_or(0));
    let initial_delay = field("initialDelaySeconds", probe.initial_delay_seconds, 0, 0)?;
    let period = field("periodSeconds", probe.period_seconds, 10, 1)?;
    let timeout = field("timeoutSeconds", probe.timeout_seconds, 1, 1)?;
    let success = field("successThreshold", probe.success_threshold, 1, 1)?;
    let failure = field("failureThreshold", probe.failure_threshold, 3, 1)?;
    if success != 1 && probe_type != ProbeType::Readiness {
        return Err(ProbeError::InvalidField {
            container: container.name.clone(),
            field: "successThreshold",
            reason: format!("must be 1 for liveness and startup probes, got {success}"),
        });
    }
    Ok(ProbeTiming {
        initial_delay: secs(initial_delay),
        period: secs(period),
        timeout: secs(timeout),
        success_threshold: u32::try_from(success).unwrap_or(u32::MAX),
        failure_threshold: u32::try_from(failure).unwrap_or(u32::MAX),
    })
}

fn handler_from_k8s(probe: &Probe, container: &Container) -> Result<ProbeHandler, ProbeError> {
    let found = usize::from(probe.exec.is_some())
        + usize::from(probe.http_get.is_some())
        + usize::from(probe.tcp_socket.is_some())
        + usize::from(probe.grpc.is_some());
    if found != 1 {
        return Err(ProbeError::HandlerCount {
            container: container.name.clone(),
            found,
        });
    }
    if let Some(exec) = &probe.exec {
        let env = container.env.as_deref().unwrap_or_default();
        let command = exec
            .command
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(|arg| expand_static(arg, env))
            .collect();
        return Ok(ProbeHandler::Exec { command });
    }
    if let Some(h) = &probe.http_get {
        return HttpGetSpec::from_action(h, container)
            .map(ProbeHandler::HttpGet)
            .map_err(|e| spec_error(container, e));
    }
    if let Some(t) = &probe.tcp_socket {
        return Ok(ProbeHandler::TcpSocket {
            host: t.host.clone().filter(|s| !s.is_empty()),
            port: resolve_port(&t.port, container)?,
        });
    }
    if let Some(g) = &probe.grpc {
        let port = u16::try_from(g.port)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| ProbeError::InvalidPort {
                container: container.name.clone(),
                port: g.port.to_string(),
                reason: "must be in 1..=65535".to_string(),
            })?;
        return Ok(ProbeHandler::Grpc {
            port,
            service: g.service.clone().unwrap_or_default(),
        });
    }
    Err(ProbeError::HandlerCount {
        container: container.name.clone(),
        found: 0,
    })
}

/// Resolve a probe port: a number, or the name of one of the container's ports (a string that
/// names no port but parses as a number is taken as that number, as the kubelet does).
pub fn resolve_port(port: &IntOrString, container: &Container) -> Result<u16, ProbeError> {
    kubelet_net::http::resolve_port(port, container).map_err(|e| spec_error(container, e))
}

fn spec_error(container: &Container, e: SpecError) -> ProbeError {
    match e {
        SpecError::InvalidPort { port, reason } => ProbeError::InvalidPort {
            container: container.name.clone(),
            port,
            reason,
        },
        other => ProbeError::InvalidField {
            container: container.name.clone(),
            field: "scheme",
            reason: other.to_string(),
        },
    }
}

/// `$(VAR)` expansion with the container's literal environment only (the kubelet's
/// `ExpandContainerCommandOnlyStatic`): `$(VAR)` of a defined variable is replaced, of an
/// undefined one kept as written; `$$` is a literal `$`.
pub fn expand_static(input: &str, env: &[EnvVar]) -> String {
    let lookup = |name: &str| {
        env.iter()
            .rev()
            .find(|e| e.name == name && e.value_from.is_none())
            .map(|e| e.value.clone().unwrap_or_default())
    };
    kubelet_core::container::expand(input, &lookup)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerPort, ExecAction, GRPCAction, HTTPGetAction, HTTPHeader, TCPSocketAction,
    };
    use kubelet_net::http::Scheme;

    fn container() -> Container {
        Container {
            name: "app".into(),
            ports: Some(vec![ContainerPort {
                name: Some("http".into()),
                container_port: 8080,
                ..Default::default()
            }]),
            env: Some(vec![
                EnvVar {
                    name: "GREETING".into(),
                    value: Some("hi".into()),
                    ..Default::default()
                },
                EnvVar {
                    name: "FROM_API".into(),
                    value_from: Some(Default::default()),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }
    }

    #[test]
    fn api_defaults_apply_to_unset_and_zero_fields() {
        let probe = Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(80),
                ..Default::default()
            }),
            period_seconds: Some(0),
            ..Default::default()
        };
        let s = ProbeSpec::from_k8s(&probe, &container(), ProbeType::Liveness).unwrap();
        assert_eq!(s.timing, ProbeTiming::default());
        assert_eq!(s.timing.period, Duration::from_secs(10));
        assert_eq!(s.timing.timeout, Duration::from_secs(1));
        assert_eq!(s.timing.failure_threshold, 3);
    }

    #[test]
    fn named_ports_resolve_from_the_container_and_numeric_strings_are_numbers() {
        let c = container();
        assert_eq!(
            resolve_port(&IntOrString::String("http".into()), &c),
            Ok(8080)
        );
        assert_eq!(
            resolve_port(&IntOrString::String("9090".into()), &c),
            Ok(9090)
        );
        assert!(matches!(
            resolve_port(&IntOrString::String("metrics".into()), &c),
            Err(ProbeError::InvalidPort { .. })
        ));
        assert!(resolve_port(&IntOrString::Int(0), &c).is_err());
        assert!(resolve_port(&IntOrString::Int(70000), &c).is_err());
    }

    #[test]
    fn http_get_defaults_to_root_path_and_http_and_keeps_headers_in_order() {
        let probe = Probe {
            http_get: Some(HTTPGetAction {
                port: IntOrString::String("http".into()),
                path: Some("healthz".into()),
                scheme: Some("HTTPS".into()),
                http_headers: Some(vec![
                    HTTPHeader {
                        name: "X-A".into(),
                        value: "1".into(),
                    },
                    HTTPHeader {
                        name: "X-A".into(),
                        value: "2".into(),
                    },
                ]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let s = ProbeSpec::from_k8s(&probe, &container(), ProbeType::Readiness).unwrap();
        let ProbeHandler::HttpGet(h) = s.handler else {
            panic!("not http")
        };
        assert_eq!(h.scheme, Scheme::Https);
        assert_eq!(h.port, 8080);
        assert_eq!(h.path, "/healthz");
        assert_eq!(h.host, None);
        assert_eq!(h.headers.len(), 2);
    }

    #[test]
    fn a_probe_needs_exactly_one_handler() {
        let none = Probe::default();
        assert!(matches!(
            ProbeSpec::from_k8s(&none, &container(), ProbeType::Readiness),
            Err(ProbeError::HandlerCount { found: 0, .. })
        ));
        let two = Probe {
            exec: Some(ExecAction::default()),
            grpc: Some(GRPCAction {
                port: 1,
                service: None,
            }),
            ..Default::default()
        };
        assert!(matches!(
            ProbeSpec::from_k8s(&two, &container(), ProbeType::Readiness),
            Err(ProbeError::HandlerCount { found: 2, .. })
        ));
    }

    #[test]
    fn liveness_success_threshold_must_be_one() {
        let probe = Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(80),
                ..Default::default()
            }),
            success_threshold: Some(2),
            ..Default::default()
        };
        assert!(ProbeSpec::from_k8s(&probe, &container(), ProbeType::Liveness).is_err());
        assert_eq!(
            ProbeSpec::from_k8s(&probe, &container(), ProbeType::Readiness)
                .unwrap()
                .timing
                .success_threshold,
            2
        );
    }

    #[test]
    fn probe_level_grace_is_for_liveness_and_startup_only_and_positive() {
        let probe = |g: i64| Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(80),
                ..Default::default()
            }),
            termination_grace_period_seconds: Some(g),
            ..Default::default()
        };
        for t in [ProbeType::Liveness, ProbeType::Startup] {
            let s = ProbeSpec::from_k8s(&probe(7), &container(), t).unwrap();
            assert_eq!(s.termination_grace_period_seconds, Some(7));
            assert!(ProbeSpec::from_k8s(&probe(0), &container(), t).is_err());
        }
        match ProbeSpec::from_k8s(&probe(7), &container(), ProbeType::Readiness) {
            Err(ProbeError::InvalidField { field, .. }) => {
                assert_eq!(field, "terminationGracePeriodSeconds")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn exec_commands_expand_only_static_variables() {
        let env = container().env.unwrap();
        assert_eq!(expand_static("echo $(GREETING)", &env), "echo hi");
        assert_eq!(expand_static("$(FROM_API)", &env), "$(FROM_API)");
        assert_eq!(expand_static("$(MISSING)x", &env), "$(MISSING)x");
        assert_eq!(expand_static("$$(GREETING)", &env), "$(GREETING)");
        assert_eq!(expand_static("cost $5 $(", &env), "cost $5 $(");
        assert_eq!(expand_static("ünï $(GREETING)", &env), "ünï hi");
    }
}
