//! The kubelet API's authentication and authorization through the API server (the kubelet's
//! webhook authenticator and authorizer): [`TokenReviewAuthenticator`] checks bearer tokens with
//! a `TokenReview`, [`SubjectAccessReviewAuthorizer`] asks a `SubjectAccessReview` per request.
//! Both use the agent's own credentials (the node identity may create both reviews). The
//! server in `kubelet-server` caches their answers (`cacheTTL` 2 m; 5 m allowed, 30 s denied);
//! a call that does not answer within [`REVIEW_TIMEOUT`] is an error (401, or 500 for
//! authorization), never a hang.

use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::authentication::v1::TokenReview;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};
use kubelet_server::{Attributes, AuthError, Authorizer, Decision, TokenAuthenticator, UserInfo};

/// How long a review may take.
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);

async fn bounded<T>(
    what: &str,
    fut: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, AuthError> {
    match tokio::time::timeout(REVIEW_TIMEOUT, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(AuthError::Webhook(format!("{what}: {e}"))),
        Err(_) => Err(AuthError::Timeout(REVIEW_TIMEOUT)),
    }
}

/// Bearer tokens checked with a `TokenReview` (`authentication.k8s.io/v1`).
#[derive(Clone)]
pub struct TokenReviewAuthenticator {
    client: Client,
    audiences: Vec<String>,
}

impl std::fmt::Debug for TokenReviewAuthenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenReviewAuthenticator")
            .field("audiences", &self.audiences)
            .finish_non_exhaustive()
    }
}

impl TokenReviewAuthenticator {
    /// Reviews through `client`, with the API server's audiences.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            audiences: Vec::new(),
        }
    }

    /// Ask for these audiences (`spec.audiences`).
    pub fn audiences(mut self, audiences: Vec<String>) -> Self {
        self.audiences = audiences;
        self
    }
}

#[async_trait]
impl TokenAuthenticator for TokenReviewAuthenticator {
    async fn authenticate_token(&self, token: &str) -> Result<Option<UserInfo>, AuthError> {
        // Built through JSON: `spec.token` is optional before Kubernetes 1.37 and required
        // from then on, and the application picks the version.
        let mut spec = serde_json::json!({ "token": token });
        if !self.audiences.is_empty() {
            spec["audiences"] = serde_json::json!(self.audiences);
        }
        let review: TokenReview = serde_json::from_value(serde_json::json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": spec,
        }))
        .map_err(|e| AuthError::Webhook(format!("building a TokenReview: {e}")))?;
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let answer = bounded("TokenReview", api.create(&PostParams::default(), &review)).await?;
        let Some(status) = answer.status else {
            return Err(AuthError::Webhook("TokenReview without a status".into()));
        };
        if let Some(e) = status.error.filter(|e| !e.is_empty()) {
            tracing::debug!(error = %e, "TokenReview rejected a token");
        }
        if status.authenticated != Some(true) {
            return Ok(None);
        }
        let Some(user) = status.user else {
            return Ok(None);
        };
        let mut info = UserInfo::new(
            user.username.unwrap_or_default(),
            user.groups.unwrap_or_default(),
        );
        info.uid = user.uid.unwrap_or_default();
        info.extra = user.extra.unwrap_or_default().into_iter().collect();
        Ok(Some(info))
    }
}

/// Requests authorized with a `SubjectAccessReview` (`authorization.k8s.io/v1`).
#[derive(Clone)]
pub struct SubjectAccessReviewAuthorizer {
    client: Client,
}

impl std::fmt::Debug for SubjectAccessReviewAuthorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubjectAccessReviewAuthorizer")
            .finish_non_exhaustive()
    }
}

impl SubjectAccessReviewAuthorizer {
    /// Reviews through `client`.
    pub fn new(client: Client) -> Self {
        Self { client }
    }
}

/// The review the kubelet sends for `a`.
pub fn access_review(a: &Attributes) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(a.user.name.clone()),
            uid: (!a.user.uid.is_empty()).then(|| a.user.uid.clone()),
            groups: Some(a.user.groups.clone()),
            extra: (!a.user.extra.is_empty()).then(|| a.user.extra.clone().into_iter().collect()),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(a.verb.clone()),
                group: Some(a.api_group.clone()),
                version: Some(a.api_version.clone()),
                resource: Some(a.resource.clone()),
                subresource: Some(a.subresource.clone()),
                name: Some(a.name.clone()),
                namespace: Some(String::new()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    }
}

#[async_trait]
impl Authorizer for SubjectAccessReviewAuthorizer {
    async fn authorize(&self, attributes: &Attributes) -> Result<Decision, AuthError> {
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answer = bounded(
            "SubjectAccessReview",
            api.create(&PostParams::default(), &access_review(attributes)),
        )
        .await?;
        let Some(status) = answer.status else {
            return Err(AuthError::Webhook(
                "SubjectAccessReview without a status".into(),
            ));
        };
        if status.allowed {
            Ok(Decision::Allow)
        } else {
            Ok(Decision::Deny(
                status
                    .reason
                    .or(status.evaluation_error)
                    .unwrap_or_default(),
            ))
        }
    }
}
