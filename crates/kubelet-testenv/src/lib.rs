//! Test support for the kubelet SDK: a private, real kube-apiserver per test.
//!
//! [`ApiServerEnv::start`] runs `scripts/apiserver-test-env.sh start` into a fresh directory:
//! Debian's etcd and a kube-apiserver 1.20.2 built from Debian's `kubernetes` source package, on
//! free ports of 127.0.0.1, with `--authorization-mode=Node,RBAC` and the `NodeRestriction`
//! admission plugin. It hands back two kubeconfigs: [`ApiServerEnv::admin_kubeconfig`]
//! (`system:masters`, for the test's own setup and checks) and [`ApiServerEnv::node_kubeconfig`]
//! (an x509 client certificate for `system:node:<node>` in `system:nodes`, what the agent under
//! test uses, so the API server enforces what a real cluster enforces on a kubelet). Dropping the
//! environment stops both processes and deletes the directory; if the test process dies without
//! dropping it, a watchdog started with it does the same.
//!
//! Environments are independent (own ports, own etcd, everything under their directory), so
//! tests can start them in parallel. The first start in a process runs the script's `install`
//! once (it builds kube-apiserver when no cached binary exists: minutes; the script holds a file
//! lock so parallel test processes build it once and the others wait for that build); later
//! starts take a few seconds.
//!
//! When the machine cannot provide one (no cached binary and no root or apt-get to build it),
//! [`ApiServerEnv::start`] prints `SKIP <test>: <why>` and returns `None`; with
//! `KUBELET_SDK_REQUIRE_ROOT=1` (CI) it panics instead, so that a broken environment fails the
//! run rather than skipping silently.
//!
//! No controller-manager or scheduler runs: create pods with `spec.nodeName` set. The
//! `ServiceAccount` admission plugin is off (no token controller would create the tokens it waits
//! for), so pods get no service-account volume.
//!
//! ```no_run
//! use kubelet_testenv::ApiServerEnv;
//!
//! let Some(env) = ApiServerEnv::start_for_node("node_registers_itself", "node-a") else {
//!     return; // skipped: the message says why
//! };
//! // Build the agent's client from env.node_kubeconfig(), the test's from env.admin_kubeconfig().
//! println!("{} {}", env.url(), env.node_kubeconfig().display());
//! env.stop_apiserver(); // the API server goes away (etcd keeps the data) ...
//! env.start_apiserver(); // ... and comes back on the same port
//! let requests = env.audit_events().iter().filter(|e| e.user == "system:node:node-a").count();
//! # let _ = requests;
//! ```
//!
//! [`Tmpfs`] mounts a small tmpfs and fills it, for tests of a full disk. [`free_port`] picks a
//! port for a server a test starts, outside the ephemeral range that outgoing connections use.
//!
//! This crate is for tests and benchmarks only (`publish = false`); it depends on nothing but
//! `serde_json`.

mod tmpfs;
pub use tmpfs::Tmpfs;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The node name [`ApiServerEnv::start`] issues node credentials for.
pub const DEFAULT_NODE_NAME: &str = "kubelet-sdk-node";

/// The script this crate drives (in the repository, next to `containerd-test-env.sh`).
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/apiserver-test-env.sh")
}

/// Whether missing prerequisites fail instead of skipping (`KUBELET_SDK_REQUIRE_ROOT=1`).
pub fn required() -> bool {
    std::env::var("KUBELET_SDK_REQUIRE_ROOT").is_ok_and(|v| v == "1")
}

/// Debian's `kubectl` (package `kubernetes-client`, 1.20), unpacked into the cache by the
/// script's `kubectl` (without installing the package, so a newer `kubectl` on the PATH stays).
/// `None` (after a `SKIP` line) when this machine cannot provide it; a panic instead under
/// `KUBELET_SDK_REQUIRE_ROOT=1`.
pub fn debian_kubectl(test: &str) -> Option<PathBuf> {
    static KUBECTL: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let found = KUBECTL
        .get_or_init(|| {
            let out = Command::new("bash")
                .arg(script())
                .arg("kubectl")
                .output()
                .map_err(|e| format!("running apiserver-test-env.sh kubectl: {e}"))?;
            if out.status.success() {
                Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
            } else {
                Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
            }
        })
        .clone();
    match found {
        Ok(p) => Some(p),
        Err(why) if required() => {
            panic!(
                "{test}: no Debian kubectl: {why} (KUBELET_SDK_REQUIRE_ROOT=1 makes this a failure)"
            )
        }
        Err(why) => {
            eprintln!("SKIP {test}: no Debian kubectl: {why}");
            None
        }
    }
}

/// Runs the script's `install` once per process; every caller gets its outcome.
fn install_once() -> Result<(), String> {
    static INSTALL: OnceLock<Result<(), String>> = OnceLock::new();
    INSTALL
        .get_or_init(|| {
            let out = Command::new("bash")
                .arg(script())
                .arg("install")
                .output()
                .map_err(|e| format!("running apiserver-test-env.sh install: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "apiserver-test-env.sh install failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        })
        .clone()
}

/// A fresh directory under the system's temporary directory.
fn fresh_dir() -> std::io::Result<PathBuf> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("ksdk-api-{}-{n}-{nanos:08x}", std::process::id()));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Parses the script's `KEY=VALUE` output.
fn parse_vars(out: &str) -> BTreeMap<String, String> {
    out.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// One running etcd + kube-apiserver. Dropping it stops both and removes its directory.
#[derive(Debug)]
pub struct ApiServerEnv {
    dir: PathBuf,
    url: String,
    node_name: String,
    admin_kubeconfig: PathBuf,
    node_kubeconfig: PathBuf,
    ca_file: PathBuf,
    admin_token: String,
    audit_log: PathBuf,
    bootstrap_kubeconfig: Option<PathBuf>,
}

/// What kind of cluster [`ApiServerEnv`] starts.
#[derive(Debug, Clone, Copy)]
enum Kind<'a> {
    Plain,
    ServiceAccounts,
    /// Bootstrap tokens and the CSR controllers, certificates valid for the duration given.
    Bootstrap(&'a str),
}

impl ApiServerEnv {
    /// Starts one with node credentials for [`DEFAULT_NODE_NAME`]. `None` (after a `SKIP` line
    /// on stderr) when this machine cannot run one; a panic instead under
    /// `KUBELET_SDK_REQUIRE_ROOT=1`, or when the script fails on a machine that could run it.
    pub fn start(test: &str) -> Option<Self> {
        Self::start_for_node(test, DEFAULT_NODE_NAME)
    }

    /// Starts one with node credentials (`system:node:<node>`) for `node`.
    pub fn start_for_node(test: &str, node: &str) -> Option<Self> {
        Self::start_env(test, node, Kind::Plain)
    }

    /// Starts one that treats service accounts as a Kubernetes ≥ 1.21 cluster does: the gate
    /// `BoundServiceAccountTokenVolume` on, ServiceAccount admission giving every pod a
    /// projected `kube-api-access-*` volume (TokenRequest token, `kube-root-ca.crt`, namespace),
    /// and a kube-controller-manager making each namespace's `default` ServiceAccount and
    /// `kube-root-ca.crt` ConfigMap (`KUBELET_SDK_SERVICE_ACCOUNTS=1` of the script).
    pub fn start_with_service_accounts(test: &str, node: &str) -> Option<Self> {
        Self::start_env(test, node, Kind::ServiceAccounts)
    }

    /// Starts one a node joins as with kubeadm: what
    /// [`start_with_service_accounts`](Self::start_with_service_accounts) starts, plus
    /// bootstrap-token authentication, kubeadm's bootstrap bindings, and the controller-manager's
    /// CSR approver and signer issuing certificates valid for `signing_duration` (a Go
    /// duration such as `90s`); [`bootstrap_kubeconfig`](Self::bootstrap_kubeconfig) holds the
    /// token (`KUBELET_SDK_BOOTSTRAP=1` of the script).
    pub fn start_with_bootstrap(test: &str, node: &str, signing_duration: &str) -> Option<Self> {
        Self::start_env(test, node, Kind::Bootstrap(signing_duration))
    }

    fn start_env(test: &str, node: &str, kind: Kind<'_>) -> Option<Self> {
        let skip = |why: String| -> Option<Self> {
            if required() {
                panic!("{test}: {why} (KUBELET_SDK_REQUIRE_ROOT=1 makes this a failure)");
            }
            eprintln!("SKIP {test}: {why}");
            None
        };
        if let Err(why) = install_once() {
            return skip(format!("no kube-apiserver for the tests: {why}"));
        }
        let dir = match fresh_dir() {
            Ok(d) => d,
            Err(e) => return skip(format!("creating a temporary directory: {e}")),
        };
        let out = Command::new("bash")
            .arg(script())
            .arg("start")
            .arg(&dir)
            .arg(node)
            .env("KUBELET_SDK_ENV_OWNER_PID", std::process::id().to_string())
            .env(
                "KUBELET_SDK_SERVICE_ACCOUNTS",
                if matches!(kind, Kind::Plain) {
                    "0"
                } else {
                    "1"
                },
            )
            .env(
                "KUBELET_SDK_BOOTSTRAP",
                if matches!(kind, Kind::Bootstrap(_)) {
                    "1"
                } else {
                    "0"
                },
            )
            .env(
                "KUBELET_SDK_SIGNING_DURATION",
                match kind {
                    Kind::Bootstrap(d) => d,
                    _ => "8760h",
                },
            )
            .output();
        let out = match out {
            Ok(o) if o.status.success() => o,
            Ok(o) => {
                let _ = Command::new("bash")
                    .arg(script())
                    .arg("stop")
                    .arg(&dir)
                    .status();
                // The binary is there (install succeeded): a failing start is a real failure.
                panic!(
                    "{test}: apiserver-test-env.sh start failed: {}",
                    String::from_utf8_lossy(&o.stderr)
                );
            }
            Err(e) => return skip(format!("running apiserver-test-env.sh: {e}")),
        };
        let vars = parse_vars(&String::from_utf8_lossy(&out.stdout));
        let get = |k: &str| vars.get(k).cloned().unwrap_or_default();
        Some(Self {
            url: get("APISERVER_URL"),
            node_name: get("NODE_NAME"),
            admin_kubeconfig: PathBuf::from(get("ADMIN_KUBECONFIG")),
            node_kubeconfig: PathBuf::from(get("NODE_KUBECONFIG")),
            ca_file: PathBuf::from(get("CA_FILE")),
            admin_token: get("ADMIN_TOKEN"),
            audit_log: PathBuf::from(get("AUDIT_LOG")),
            bootstrap_kubeconfig: vars.get("BOOTSTRAP_KUBECONFIG").map(PathBuf::from),
            dir,
        })
    }

    /// The environment's directory (etcd data, certificates, logs: `apiserver.log`, `etcd.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The node the node credentials are for.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// A kubeconfig for `admin` in `system:masters` (client certificate, CA embedded).
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// A kubeconfig for `system:node:<node>` in `system:nodes` (client certificate, CA
    /// embedded): what a kubelet of that node would have.
    pub fn node_kubeconfig(&self) -> &Path {
        &self.node_kubeconfig
    }

    /// The CA certificate (PEM) that signed the serving and client certificates.
    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    /// The node's client certificate and key (PEM files), also embedded in
    /// [`node_kubeconfig`](Self::node_kubeconfig).
    pub fn node_cert_and_key(&self) -> (PathBuf, PathBuf) {
        (self.dir.join("pki/node.crt"), self.dir.join("pki/node.key"))
    }

    /// The admin's client certificate and key (PEM files), also embedded in
    /// [`admin_kubeconfig`](Self::admin_kubeconfig).
    pub fn admin_cert_and_key(&self) -> (PathBuf, PathBuf) {
        (
            self.dir.join("pki/admin.crt"),
            self.dir.join("pki/admin.key"),
        )
    }

    /// The client certificate and key (PEM files) the API server presents to kubelets
    /// (`kube-apiserver-kubelet-client`, no groups, issued by [`ca_file`](Self::ca_file)).
    pub fn kubelet_client_cert_and_key(&self) -> (PathBuf, PathBuf) {
        (
            self.dir.join("pki/kubelet-client.crt"),
            self.dir.join("pki/kubelet-client.key"),
        )
    }

    /// A bearer token for `admin` in `system:masters`.
    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// The kubeconfig with the bootstrap token (environments from
    /// [`start_with_bootstrap`](Self::start_with_bootstrap)).
    pub fn bootstrap_kubeconfig(&self) -> Option<&Path> {
        self.bootstrap_kubeconfig.as_deref()
    }

    /// The API server's audit log (one JSON event per line, level Metadata, every request).
    pub fn audit_log(&self) -> &Path {
        &self.audit_log
    }

    fn run_script(&self, cmd: &str) {
        let out = Command::new("bash")
            .arg(script())
            .arg(cmd)
            .arg(&self.dir)
            .output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => panic!(
                "apiserver-test-env.sh {cmd} failed: {}",
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => panic!("running apiserver-test-env.sh {cmd}: {e}"),
        }
    }

    /// Stops the API server (etcd and its data stay). Blocks until the process is gone.
    pub fn stop_apiserver(&self) {
        self.run_script("stop-apiserver");
    }

    /// Starts the API server again on the same port with the same etcd; blocks until it is
    /// ready (`/readyz`).
    pub fn start_apiserver(&self) {
        self.run_script("start-apiserver");
    }

    /// Every request the API server has completed so far, from its audit log, one entry per
    /// request (a watch counts once, also while still open).
    pub fn audit_events(&self) -> Vec<AuditEvent> {
        let text = std::fs::read_to_string(&self.audit_log).unwrap_or_default();
        let mut seen = BTreeSet::new();
        text.lines()
            .filter_map(AuditEvent::parse)
            .filter(|e| seen.insert(e.audit_id.clone()))
            .collect()
    }
}

impl Drop for ApiServerEnv {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(&self.dir)
            .status();
    }
}

/// One request, as the audit log records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEvent {
    /// `auditID`: unique per request.
    pub audit_id: String,
    /// `user.username`, e.g. `system:node:node-a` or `admin`.
    pub user: String,
    /// `verb`: get, list, watch, create, update, patch, delete…
    pub verb: String,
    /// `objectRef.resource` (empty for non-resource URLs).
    pub resource: String,
    /// `objectRef.subresource` (e.g. `status`), empty when none.
    pub subresource: String,
    /// `objectRef.namespace`, empty when cluster-scoped.
    pub namespace: String,
    /// `requestURI`.
    pub request_uri: String,
    /// `responseStatus.code`, 0 when not recorded.
    pub code: u16,
}

impl AuditEvent {
    /// Parses one audit log line; `None` for anything that is not an audit event.
    fn parse(line: &str) -> Option<Self> {
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        let s = |ptr: &str| {
            v.pointer(ptr)
                .and_then(|x| x.as_str())
                .unwrap_or_default()
                .to_string()
        };
        let audit_id = v.get("auditID")?.as_str()?.to_string();
        Some(Self {
            audit_id,
            user: s("/user/username"),
            verb: s("/verb"),
            resource: s("/objectRef/resource"),
            subresource: s("/objectRef/subresource"),
            namespace: s("/objectRef/namespace"),
            request_uri: s("/requestURI"),
            code: v
                .pointer("/responseStatus/code")
                .and_then(|c| c.as_u64())
                .and_then(|c| u16::try_from(c).ok())
                .unwrap_or(0),
        })
    }
}

/// A TCP port of 127.0.0.1 that is free now, for a server a test is about to start (often in
/// another process, so the port cannot be handed over bound).
///
/// The port comes from 10300–19999, below the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`, 32768–60999 by default): a port that `bind(0)` handed out and
/// released can be taken by any outgoing connection of any process before the server binds it,
/// which made agents fail with "Address already in use" on busy machines. Below that range only
/// servers bind, and `apiserver-test-env.sh` claims its ports from 20000–31999. Each process
/// walks its own sequence (it starts at an offset derived from its PID), and a port is handed out
/// once per process and only after a trial bind succeeded.
pub fn free_port() -> u16 {
    const FIRST: u16 = 10_300;
    const LAST: u16 = 19_999;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let span = u64::from(LAST - FIRST) + 1;
    let offset = u64::from(std::process::id()).wrapping_mul(7_919) % span;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = u64::from(FIRST) + (offset + n) % span;
        let Ok(port) = u16::try_from(port) else {
            continue;
        };
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free TCP port of 127.0.0.1 between {FIRST} and {LAST}");
}

/// Raise this process's open-file limit to `want` descriptors: the soft limit up to the hard
/// one, and the hard one too where the process may (root). Returns the soft limit in force
/// afterwards, which the caller sizes its test by when it is below `want`.
pub fn raise_nofile_limit(want: u64) -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 0;
    };
    if soft >= want {
        return soft;
    }
    if setrlimit(Resource::RLIMIT_NOFILE, want, hard.max(want)).is_ok() {
        return want;
    }
    let capped = hard.min(want);
    if setrlimit(Resource::RLIMIT_NOFILE, capped, hard).is_ok() {
        capped
    } else {
        soft
    }
}

/// Poll `f` every 250 ms until it yields a value; panics naming `what` once `timeout` has
/// passed. The end-to-end tests' wait for the cluster or the agent to get somewhere.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nofile_limit_is_raised_as_far_as_the_process_may() {
        use nix::sys::resource::{Resource, getrlimit};
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
        let want = hard.min(4_096);
        let got = raise_nofile_limit(want);
        assert!(got >= want, "{got} < {want}");
        assert_eq!(
            getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit").0,
            got
        );
        // Asking for less lowers nothing.
        assert_eq!(raise_nofile_limit(16), got);
    }

    #[test]
    fn free_ports_are_distinct_bindable_and_outside_the_ephemeral_range() {
        let ports: BTreeSet<u16> = (0..50).map(|_| free_port()).collect();
        assert_eq!(ports.len(), 50, "a port was handed out twice: {ports:?}");
        let ephemeral: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|s| s.split_whitespace().next().and_then(|p| p.parse().ok()))
            .unwrap_or(32_768);
        for p in ports {
            assert!(p < ephemeral, "{p} is in the ephemeral range");
            std::net::TcpListener::bind(("127.0.0.1", p)).expect("the port is free");
        }
    }

    #[test]
    fn parses_an_audit_log_line() {
        let line = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"5c1e","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/default/pods/p/status","verb":"patch","user":{"username":"system:node:n1","groups":["system:nodes","system:authenticated"]},"sourceIPs":["127.0.0.1"],"objectRef":{"resource":"pods","namespace":"default","name":"p","apiVersion":"v1","subresource":"status"},"responseStatus":{"metadata":{},"code":200},"annotations":{"authorization.k8s.io/decision":"allow","authorization.k8s.io/reason":"a \"quoted\" {reason}"}}"#;
        let e = AuditEvent::parse(line).expect("parse");
        assert_eq!(
            e,
            AuditEvent {
                audit_id: "5c1e".into(),
                user: "system:node:n1".into(),
                verb: "patch".into(),
                resource: "pods".into(),
                subresource: "status".into(),
                namespace: "default".into(),
                request_uri: "/api/v1/namespaces/default/pods/p/status".into(),
                code: 200,
            }
        );
    }

    #[test]
    fn non_resource_requests_have_empty_resource_fields() {
        let line = r#"{"auditID":"a1","requestURI":"/readyz","verb":"get","user":{"username":"admin"},"responseStatus":{"code":200}}"#;
        let e = AuditEvent::parse(line).expect("parse");
        assert_eq!(e.resource, "");
        assert_eq!(e.namespace, "");
        assert_eq!(e.user, "admin");
        assert_eq!(e.code, 200);
        assert!(AuditEvent::parse("not json").is_none());
    }

    #[test]
    fn script_output_becomes_variables() {
        let vars = parse_vars("APISERVER_URL=https://127.0.0.1:1\nNODE_NAME=n\nnoise\n");
        assert_eq!(vars["APISERVER_URL"], "https://127.0.0.1:1");
        assert_eq!(vars["NODE_NAME"], "n");
        assert_eq!(vars.len(), 2);
    }
}
