//! Authentication and authorization of requests to the kubelet API (the kubelet's
//! `pkg/kubelet/server/auth.go` and its `BuildAuth`).
//!
//! The server authenticates each request in this order, first identity wins:
//!
//! 1. an x509 client certificate that chained to `clientCAFile` during the TLS handshake
//!    (user = CN, groups = O values);
//! 2. a bearer token, checked by a [`TokenAuthenticator`] (the API server's `TokenReview` in
//!    `kubelet-apiserver`, or an embedder's own), its answers cached for `cacheTTL`;
//!    a token it rejects or cannot check is a 401 even when anonymous requests are allowed;
//! 3. anonymous (`system:anonymous` in `system:unauthenticated`) when `anonymous.enabled`.
//!
//! Authenticated users also get the group `system:authenticated`. Otherwise the answer is
//! `401 Unauthorized`.
//!
//! Then an [`Authorizer`] decides on the request's [`Attributes`] (verb from the method,
//! resource `nodes`, name = the node, subresource from the path, see [`request_attributes`]):
//! [`AlwaysAllow`], or a webhook (the API server's `SubjectAccessReview`) whose decisions the
//! server caches (5 m allowed, 30 s denied). A denial is `403` with the kubelet's
//! `Forbidden (user=…, verb=…, resource=nodes, subresource(s)=[…])` body; an authorizer error
//! is `500 Authorization error (…)`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use tokio::time::Instant;

/// Who made a request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct UserInfo {
    /// The user name (`system:node:n1`, `kube-apiserver-kubelet-client`).
    pub name: String,
    /// The user's UID, when the authenticator knows one.
    pub uid: String,
    /// The groups.
    pub groups: Vec<String>,
    /// Extra attributes (from a `TokenReview`), passed on to the authorizer.
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    /// A user named `name` in `groups`.
    pub fn new(name: impl Into<String>, groups: Vec<String>) -> Self {
        Self {
            name: name.into(),
            groups,
            ..Default::default()
        }
    }

    /// The anonymous user (`system:anonymous` in `system:unauthenticated`).
    pub fn anonymous() -> Self {
        Self::new(
            "system:anonymous",
            vec!["system:unauthenticated".to_string()],
        )
    }
}

/// An authenticator or authorizer could not decide (webhook down, timeout, bad answer).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// The remote check failed.
    #[error("{0}")]
    Webhook(String),
    /// The remote check did not answer in time.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
}

/// Checks bearer tokens (the kubelet's webhook token authenticator).
#[async_trait]
pub trait TokenAuthenticator: Send + Sync {
    /// The user `token` belongs to; `Ok(None)` when the token is not valid.
    async fn authenticate_token(&self, token: &str) -> Result<Option<UserInfo>, AuthError>;
}

/// What a request asks to do, as the kubelet describes it to its authorizer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Attributes {
    /// The authenticated user.
    pub user: UserInfo,
    /// `get`, `create`, `update`, `patch`, `delete`; empty for other methods.
    pub verb: String,
    /// Always `""` (the core group).
    pub api_group: String,
    /// Always `v1`.
    pub api_version: String,
    /// Always `nodes`.
    pub resource: String,
    /// `proxy`, `stats`, `log`, `metrics`, `pods`, `healthz`, `configz`, …
    pub subresource: String,
    /// The node's name.
    pub name: String,
    /// The request's path.
    pub path: String,
}

/// An authorizer's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decision {
    /// Allowed.
    Allow,
    /// Denied, with the reason the authorizer gave (logged, not sent).
    Deny(String),
}

/// Decides whether a request may proceed.
#[async_trait]
pub trait Authorizer: Send + Sync {
    /// The decision on `attributes`.
    async fn authorize(&self, attributes: &Attributes) -> Result<Decision, AuthError>;
}

/// `--authorization-mode=AlwaysAllow`.
#[derive(Debug, Clone, Copy, Default)]
pub struct AlwaysAllow;

#[async_trait]
impl Authorizer for AlwaysAllow {
    async fn authorize(&self, _: &Attributes) -> Result<Decision, AuthError> {
        Ok(Decision::Allow)
    }
}

/// Denies everything with a fixed reason (the authorizer of a `Webhook` mode server that has no
/// API server to ask).
#[derive(Debug, Clone)]
pub struct AlwaysDeny(pub String);

#[async_trait]
impl Authorizer for AlwaysDeny {
    async fn authorize(&self, _: &Attributes) -> Result<Decision, AuthError> {
        Ok(Decision::Deny(self.0.clone()))
    }
}

/// Most entries a cache keeps; beyond it expired entries are dropped, then the whole cache.
const CACHE_CAPACITY: usize = 4096;

struct TtlCache<K, V> {
    entries: Mutex<HashMap<K, (Instant, V)>>,
}

impl<K: std::hash::Hash + Eq, V: Clone> TtlCache<K, V> {
    fn new() -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn get(&self, key: &K) -> Option<V> {
        let mut entries = self.entries.lock();
        match entries.get(key) {
            Some((expires, v)) if *expires > Instant::now() => Some(v.clone()),
            Some(_) => {
                entries.remove(key);
                None
            }
            None => None,
        }
    }

    fn put(&self, key: K, value: V, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        let mut entries = self.entries.lock();
        if entries.len() >= CACHE_CAPACITY {
            let now = Instant::now();
            entries.retain(|_, (expires, _)| *expires > now);
            if entries.len() >= CACHE_CAPACITY {
                entries.clear();
            }
        }
        entries.insert(key, (Instant::now() + ttl, value));
    }
}

/// A [`TokenAuthenticator`] whose answers (valid or not) are cached for a TTL (the kubelet's
/// `authentication.webhook.cacheTTL`, 2 m); errors are not cached.
pub struct CachedTokenAuthenticator {
    inner: Arc<dyn TokenAuthenticator>,
    ttl: Duration,
    cache: TtlCache<String, Option<UserInfo>>,
}

impl std::fmt::Debug for CachedTokenAuthenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedTokenAuthenticator")
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl CachedTokenAuthenticator {
    /// Cache `inner`'s answers for `ttl`.
    pub fn new(inner: Arc<dyn TokenAuthenticator>, ttl: Duration) -> Self {
        Self {
            inner,
            ttl,
            cache: TtlCache::new(),
        }
    }
}

#[async_trait]
impl TokenAuthenticator for CachedTokenAuthenticator {
    async fn authenticate_token(&self, token: &str) -> Result<Option<UserInfo>, AuthError> {
        if let Some(hit) = self.cache.get(&token.to_string()) {
            return Ok(hit);
        }
        let answer = self.inner.authenticate_token(token).await?;
        self.cache.put(token.to_string(), answer.clone(), self.ttl);
        Ok(answer)
    }
}

/// An [`Authorizer`] whose decisions are cached: allowed for `authorized_ttl` (5 m), denied
/// for `unauthorized_ttl` (30 s), as the kubelet's webhook authorizer; errors are not cached.
pub struct CachedAuthorizer {
    inner: Arc<dyn Authorizer>,
    authorized_ttl: Duration,
    unauthorized_ttl: Duration,
    cache: TtlCache<String, Decision>,
}

impl std::fmt::Debug for CachedAuthorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedAuthorizer")
            .field("authorized_ttl", &self.authorized_ttl)
            .field("unauthorized_ttl", &self.unauthorized_ttl)
            .finish_non_exhaustive()
    }
}

impl CachedAuthorizer {
    /// Cache `inner`'s decisions.
    pub fn new(
        inner: Arc<dyn Authorizer>,
        authorized_ttl: Duration,
        unauthorized_ttl: Duration,
    ) -> Self {
        Self {
            inner,
            authorized_ttl,
            unauthorized_ttl,
            cache: TtlCache::new(),
        }
    }
}

fn cache_key(a: &Attributes) -> String {
    // Every field that can change the decision; the user's groups and extra included.
    format!(
        "{}\u{0}{}\u{0}{:?}\u{0}{:?}\u{0}{}\u{0}{}\u{0}{}\u{0}{}",
        a.user.name,
        a.user.uid,
        a.user.groups,
        a.user.extra,
        a.verb,
        a.resource,
        a.subresource,
        a.name
    )
}

#[async_trait]
impl Authorizer for CachedAuthorizer {
    async fn authorize(&self, attributes: &Attributes) -> Result<Decision, AuthError> {
        let key = cache_key(attributes);
        if let Some(hit) = self.cache.get(&key) {
            return Ok(hit);
        }
        let decision = self.inner.authorize(attributes).await?;
        let ttl = match decision {
            Decision::Allow => self.authorized_ttl,
            Decision::Deny(_) => self.unauthorized_ttl,
        };
        self.cache.put(key, decision.clone(), ttl);
        Ok(decision)
    }
}

/// The verb of an HTTP method (`GET` → `get`, `POST` → `create`, …; others empty).
pub fn verb(method: &http::Method) -> &'static str {
    match *method {
        http::Method::GET => "get",
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE => "delete",
        _ => "",
    }
}

/// The endpoints that run a command in a container or stream into it: `/exec`, `/attach`,
/// `/portForward` and `/run`.
pub fn is_command_path(path: &str) -> bool {
    ["/exec", "/attach", "/portForward", "/run"]
        .iter()
        .any(|p| is_subpath(path, p))
}

fn is_subpath(path: &str, prefix: &str) -> bool {
    path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/') || prefix.ends_with('/'))
}

/// The subresources a request is checked against, in order (allowed on the first that is
/// allowed). With `fine_grained` (gate `KubeletFineGrainedAuthz`), `/pods`, `/runningpods`,
/// `/healthz` and `/configz` try their own subresource before `proxy`.
pub fn subresources(path: &str, fine_grained: bool) -> Vec<&'static str> {
    let fine = |own: &'static str| {
        if fine_grained {
            vec![own, "proxy"]
        } else {
            vec!["proxy"]
        }
    };
    if is_subpath(path, "/stats") {
        vec!["stats"]
    } else if is_subpath(path, "/metrics") {
        vec!["metrics"]
    } else if is_subpath(path, "/logs") {
        vec!["log"]
    } else if is_subpath(path, "/checkpoint") {
        vec!["checkpoint"]
    } else if is_subpath(path, "/pods") || is_subpath(path, "/runningpods") {
        fine("pods")
    } else if is_subpath(path, "/healthz") {
        fine("healthz")
    } else if is_subpath(path, "/configz") {
        fine("configz")
    } else {
        vec!["proxy"]
    }
}

/// The attribute sets of a request by `user` to `method path` on node `node`, one per
/// subresource of [`subresources`].
pub fn request_attributes(
    user: &UserInfo,
    method: &http::Method,
    path: &str,
    node: &str,
    fine_grained: bool,
) -> Vec<Attributes> {
    // Running a command or opening a stream into a container is a `create` whatever the
    // method: a WebSocket exec is a GET upgrade, and `get nodes/proxy` (what monitoring agents
    // commonly hold) must not run commands. Stricter than the Go kubelet, which authorizes a
    // WebSocket exec with `get`.
    let verb = if is_command_path(path) {
        "create"
    } else {
        verb(method)
    };
    subresources(path, fine_grained)
        .into_iter()
        .map(|sub| Attributes {
            user: user.clone(),
            verb: verb.to_string(),
            api_group: String::new(),
            api_version: "v1".to_string(),
            resource: "nodes".to_string(),
            subresource: sub.to_string(),
            name: node.to_string(),
            path: path.to_string(),
        })
        .collect()
}

/// The outcome of authorizing a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    Allowed,
    /// 403 with this body.
    Forbidden(String),
    /// 500 with this body.
    Error(String),
}

/// Authorize `attrs` in order: allowed on the first allowed set; an error stops with 500.
pub(crate) async fn authorize_all(authorizer: &dyn Authorizer, attrs: &[Attributes]) -> Verdict {
    let Some(first) = attrs.first() else {
        return Verdict::Forbidden(
            "Authorization error: could not determine attributes for request".to_string(),
        );
    };
    for a in attrs {
        match authorizer.authorize(a).await {
            Ok(Decision::Allow) => return Verdict::Allowed,
            Ok(Decision::Deny(reason)) => {
                tracing::debug!(user = %a.user.name, verb = %a.verb, subresource = %a.subresource, %reason, "kubelet API request denied");
            }
            Err(e) => {
                tracing::warn!(user = %a.user.name, verb = %a.verb, subresource = %a.subresource, error = %kubelet_api::chain(&e), "authorizing a kubelet API request failed");
                return Verdict::Error(format!(
                    "Authorization error (user={}, verb={}, resource={}, subresource={})",
                    a.user.name, a.verb, a.resource, a.subresource
                ));
            }
        }
    }
    let subs: Vec<&str> = attrs.iter().map(|a| a.subresource.as_str()).collect();
    Verdict::Forbidden(format!(
        "Forbidden (user={}, verb={}, resource={}, subresource(s)=[{}])\n",
        first.user.name,
        first.verb,
        first.resource,
        subs.join(" ")
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn paths_map_to_the_kubelets_subresources() {
        assert_eq!(subresources("/stats/summary", true), ["stats"]);
        assert_eq!(subresources("/metrics", true), ["metrics"]);
        assert_eq!(subresources("/metrics/probes", true), ["metrics"]);
        assert_eq!(subresources("/logs/syslog", true), ["log"]);
        assert_eq!(subresources("/pods", true), ["pods", "proxy"]);
        assert_eq!(subresources("/pods", false), ["proxy"]);
        assert_eq!(subresources("/runningpods/", true), ["pods", "proxy"]);
        assert_eq!(subresources("/healthz/ping", true), ["healthz", "proxy"]);
        assert_eq!(subresources("/configz", true), ["configz", "proxy"]);
        assert_eq!(subresources("/containerLogs/ns/p/c", true), ["proxy"]);
        assert_eq!(subresources("/exec/ns/p/c", true), ["proxy"]);
        // A prefix that is not a path segment is not a subpath.
        assert_eq!(subresources("/metricsfoo", true), ["proxy"]);
        assert_eq!(subresources("/podsx", true), ["proxy"]);
    }

    #[test]
    fn command_endpoints_need_create_whatever_the_method() {
        let user = UserInfo::new("monitor".to_string(), Vec::new());
        for path in [
            "/exec/ns/pod/c",
            "/attach/ns/pod/c",
            "/portForward/ns/pod",
            "/run/ns/pod/c",
        ] {
            for method in [http::Method::GET, http::Method::POST] {
                let attrs = request_attributes(&user, &method, path, "n1", true);
                assert!(
                    attrs
                        .iter()
                        .all(|a| a.verb == "create" && a.subresource == "proxy"),
                    "{method} {path}: {attrs:?}"
                );
            }
        }
        let attrs = request_attributes(
            &user,
            &http::Method::GET,
            "/containerLogs/ns/p/c",
            "n1",
            true,
        );
        assert_eq!(attrs[0].verb, "get");
        assert!(!is_command_path("/runningpods/"));
        assert!(!is_command_path("/execute"));
    }

    #[test]
    fn methods_map_to_verbs() {
        assert_eq!(verb(&http::Method::GET), "get");
        assert_eq!(verb(&http::Method::POST), "create");
        assert_eq!(verb(&http::Method::PUT), "update");
        assert_eq!(verb(&http::Method::PATCH), "patch");
        assert_eq!(verb(&http::Method::DELETE), "delete");
        assert_eq!(verb(&http::Method::HEAD), "");
    }

    struct Counting {
        calls: AtomicUsize,
        allow_sub: &'static str,
        fail: bool,
    }

    #[async_trait]
    impl Authorizer for Counting {
        async fn authorize(&self, a: &Attributes) -> Result<Decision, AuthError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if self.fail {
                return Err(AuthError::Webhook("down".into()));
            }
            Ok(if a.subresource == self.allow_sub {
                Decision::Allow
            } else {
                Decision::Deny("no".into())
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn decisions_are_cached_with_their_ttls() {
        let inner = Arc::new(Counting {
            calls: AtomicUsize::new(0),
            allow_sub: "proxy",
            fail: false,
        });
        let cached = CachedAuthorizer::new(
            inner.clone(),
            Duration::from_secs(300),
            Duration::from_secs(30),
        );
        let user = UserInfo::new("u", vec![]);
        let attrs = request_attributes(&user, &http::Method::GET, "/pods", "n1", true);
        assert_eq!(authorize_all(&cached, &attrs).await, Verdict::Allowed);
        assert_eq!(
            inner.calls.load(Ordering::SeqCst),
            2,
            "pods denied, then proxy"
        );
        assert_eq!(authorize_all(&cached, &attrs).await, Verdict::Allowed);
        assert_eq!(inner.calls.load(Ordering::SeqCst), 2, "both answers cached");
        tokio::time::advance(Duration::from_secs(31)).await;
        authorize_all(&cached, &attrs).await;
        assert_eq!(inner.calls.load(Ordering::SeqCst), 3, "the denial expired");
        tokio::time::advance(Duration::from_secs(300)).await;
        authorize_all(&cached, &attrs).await;
        assert_eq!(inner.calls.load(Ordering::SeqCst), 5, "both expired");
    }

    #[tokio::test]
    async fn denials_and_errors_have_the_kubelets_bodies() {
        let deny = Counting {
            calls: AtomicUsize::new(0),
            allow_sub: "none",
            fail: false,
        };
        let user = UserInfo::new("alice", vec![]);
        let attrs = request_attributes(&user, &http::Method::GET, "/pods", "n1", true);
        assert_eq!(
            authorize_all(&deny, &attrs).await,
            Verdict::Forbidden(
                "Forbidden (user=alice, verb=get, resource=nodes, subresource(s)=[pods proxy])\n"
                    .into()
            )
        );
        let failing = Counting {
            calls: AtomicUsize::new(0),
            allow_sub: "none",
            fail: true,
        };
        let attrs = request_attributes(&user, &http::Method::POST, "/exec/ns/p/c", "n1", true);
        assert_eq!(
            authorize_all(&failing, &attrs).await,
            Verdict::Error(
                "Authorization error (user=alice, verb=create, resource=nodes, subresource=proxy)"
                    .into()
            )
        );
        assert_eq!(
            authorize_all(&failing, &[]).await,
            Verdict::Forbidden(
                "Authorization error: could not determine attributes for request".into()
            )
        );
    }

    struct Tokens(AtomicUsize);

    #[async_trait]
    impl TokenAuthenticator for Tokens {
        async fn authenticate_token(&self, token: &str) -> Result<Option<UserInfo>, AuthError> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok((token == "good").then(|| UserInfo::new("bob", vec![])))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn token_answers_are_cached_for_the_ttl() {
        let inner = Arc::new(Tokens(AtomicUsize::new(0)));
        let cached = CachedTokenAuthenticator::new(inner.clone(), Duration::from_secs(120));
        assert_eq!(
            cached
                .authenticate_token("good")
                .await
                .unwrap()
                .unwrap()
                .name,
            "bob"
        );
        assert!(cached.authenticate_token("bad").await.unwrap().is_none());
        cached.authenticate_token("good").await.unwrap();
        cached.authenticate_token("bad").await.unwrap();
        assert_eq!(inner.0.load(Ordering::SeqCst), 2);
        tokio::time::advance(Duration::from_secs(121)).await;
        cached.authenticate_token("good").await.unwrap();
        assert_eq!(inner.0.load(Ordering::SeqCst), 3);
    }
}
