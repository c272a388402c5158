//! [`ApiServer`]: the connection to one API server for one node, and the future that keeps the
//! node registered, its status current and its Lease renewed.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeStatus};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kubelet_api::{EventRecorder, InvolvedObject};
use parking_lot::RwLock;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::ApiServerConfig;
use crate::error::{ApiServerError, is_status};
use crate::events::EventPoster;
use crate::lease::{self, INITIAL_BACKOFF, LEASE_NAMESPACE, next_backoff};
use crate::machine::{self, MachineInfo};
use crate::mirror::MirrorPods;
use crate::node::{self, NodeFacts, NodeStatusInputs};
use crate::sink::ApiStatusSink;
use crate::source::ApiPodSource;

/// State shared by the parts of one [`ApiServer`] (node loop, source, sink, mirror pods).
pub(crate) struct Shared {
    pub(crate) client: Client,
    pub(crate) node_name: String,
    pub(crate) config: ApiServerConfig,
    /// UID of the Node object, once registered or read.
    pub(crate) node_uid: RwLock<Option<String>>,
    pub(crate) recorder: RwLock<Option<EventRecorder>>,
    pub(crate) mirrors: MirrorPods,
    pub(crate) events: EventPoster,
    /// Pod status fields the API server rejected as unknown (it is older than our types).
    pub(crate) unknown_status_fields: RwLock<std::collections::HashSet<String>>,
    /// Every Service, for the pods' service environment variables.
    pub(crate) services: crate::services::ServiceCache,
    /// The ConfigMap/Secret provider handed to the agent (its watches ask the agent for syncs).
    pub(crate) objects: crate::objects::ApiObjects,
    /// The client certificate's rotation, when on.
    pub(crate) certificates: RwLock<Vec<Arc<crate::certificate::CertificateManager>>>,
    /// The pod checkpoint (edge autonomy), when on.
    pub(crate) checkpoint: Option<Arc<crate::checkpoint::Checkpoint>>,
}

/// One node's connection to the API server. Cheap to clone.
///
/// Add it to the [`KubeletBuilder`](kubelet_core::KubeletBuilder) as a plugin
/// (`.plugin(Arc::new(api))`): it brings the `api` pod source ([`ApiServer::pod_source`]), the
/// status sink ([`ApiServer::status_sink`]) and the object provider, and its loop registers the
/// Node, keeps its status and Lease current, and manages mirror pods.
#[derive(Clone)]
pub struct ApiServer {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer")
            .field("node_name", &self.shared.node_name)
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

/// Load a kube client from a kubeconfig file (token, client certificate, exec plugins: whatever
/// the file's current context names).
pub async fn client_from_kubeconfig(path: &Path) -> Result<Client, ApiServerError> {
    let kubeconfig = crate::kubeconfig::read_kubeconfig(path).map_err(|source| {
        ApiServerError::ReadKubeconfig {
            path: path.to_path_buf(),
            source,
        }
    })?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(|source| ApiServerError::LoadKubeconfig {
            path: path.to_path_buf(),
            source,
        })?;
    Client::try_from(config).map_err(ApiServerError::CreateClient)
}

impl ApiServer {
    /// An integration for node `node_name` over `client`.
    pub fn new(client: Client, node_name: impl Into<String>, config: ApiServerConfig) -> Self {
        let node_name = node_name.into();
        let services = crate::services::ServiceCache::default();
        let checkpoint = config.checkpoint.clone().and_then(|c| {
            match crate::checkpoint::Checkpoint::open(&config.root_dir, &node_name, c) {
                Ok(c) => Some(Arc::new(c)),
                Err(e) => {
                    tracing::error!(node = %node_name, "no pod checkpoint: {e}");
                    None
                }
            }
        });
        Self {
            shared: Arc::new(Shared {
                events: EventPoster::new(&node_name, config.event_qps, config.event_burst),
                node_uid: RwLock::new(None),
                recorder: RwLock::new(None),
                mirrors: MirrorPods::default(),
                unknown_status_fields: RwLock::new(std::collections::HashSet::new()),
                certificates: RwLock::new(Vec::new()),
                checkpoint,
                services: services.clone(),
                objects: crate::objects::ApiObjects::new(client.clone())
                    .with_strategy(config.change_detection)
                    .with_services(services),
                client,
                node_name,
                config,
            }),
        }
    }

    /// An integration whose client comes from the kubeconfig at `path` (`--kubeconfig`).
    pub async fn from_kubeconfig(
        path: &Path,
        node_name: impl Into<String>,
        config: ApiServerConfig,
    ) -> Result<Self, ApiServerError> {
        Ok(Self::new(
            client_from_kubeconfig(path).await?,
            node_name,
            config,
        ))
    }

    /// Keep a certificate fresh with `manager`: the client certificate's (from
    /// [`certificate::connect`](crate::certificate::connect), the manager of the client this
    /// integration was made with) or the serving certificate's
    /// ([`certificate::serving`](crate::certificate::serving)). Its loop runs with the
    /// integration's, its metrics are the plugin's.
    pub fn with_certificate_manager(
        self,
        manager: Arc<crate::certificate::CertificateManager>,
    ) -> Self {
        self.shared.certificates.write().push(manager);
        self
    }

    /// Record node events (`NodeReady`, `NodeNotReady`) with the agent's recorder (see
    /// [`KubeletBuilder::recorder`](kubelet_core::KubeletBuilder::recorder)).
    pub fn with_recorder(self, recorder: EventRecorder) -> Self {
        *self.shared.recorder.write() = Some(recorder);
        self
    }

    /// The pod source (`api`): pods bound to this node. Add it to the agent with
    /// [`KubeletBuilder::pod_source`](kubelet_core::KubeletBuilder::pod_source).
    pub fn pod_source(&self) -> Arc<ApiPodSource> {
        Arc::new(ApiPodSource {
            shared: Arc::clone(&self.shared),
        })
    }

    /// The status sink: pod statuses, deletion of finished pods, mirror pod statuses, events.
    /// Add it with [`KubeletBuilder::status_sink`](kubelet_core::KubeletBuilder::status_sink).
    pub fn status_sink(&self) -> Arc<ApiStatusSink> {
        Arc::new(ApiStatusSink {
            shared: Arc::clone(&self.shared),
        })
    }

    /// The kube client.
    /// The ConfigMap and Secret provider of this integration (its
    /// [`ChangeDetection`](crate::ChangeDetection) is `ApiServerConfig::change_detection`), to
    /// hand to [`KubeletBuilder::object_provider`](kubelet_core::KubeletBuilder::object_provider)
    /// when the integration is not used as a plugin. With the `Watch` strategy, call
    /// [`ApiObjects::sync_pods_through`](crate::ApiObjects::sync_pods_through) with the agent's
    /// handle so that changes reach volumes at once.
    pub fn objects(&self) -> crate::objects::ApiObjects {
        self.shared.objects.clone()
    }

    /// The client this integration talks through.
    pub fn client(&self) -> Client {
        self.shared.client.clone()
    }

    /// The node's name.
    pub fn node_name(&self) -> &str {
        &self.shared.node_name
    }

    /// The settings.
    pub fn config(&self) -> &ApiServerConfig {
        &self.shared.config
    }

    /// The pod checkpoint ([`ApiServerConfig::checkpoint`]), when on.
    pub fn checkpoint(&self) -> Option<Arc<crate::checkpoint::Checkpoint>> {
        self.shared.checkpoint.clone()
    }

    /// UID of the Node object once the node is registered.
    pub fn node_uid(&self) -> Option<String> {
        self.shared.node_uid.read().clone()
    }

    /// Register the node (when `register_node`), keep its status and its Lease current, and
    /// manage mirror pods, until `shutdown` is cancelled. API errors are logged and retried with
    /// backoff; this future never fails.
    pub(crate) async fn run(&self, inputs: NodeStatusInputs, shutdown: CancellationToken) {
        // Services are watched from the start: pods wait for their first list.
        let services = self
            .shared
            .services
            .run(self.shared.client.clone(), shutdown.clone());
        let certificates = self.shared.certificates.read().clone();
        let rotation =
            futures::future::join_all(certificates.iter().map(|c| c.run(shutdown.clone())));
        let node = async {
            let Some(node) = self.register_until_done(&shutdown).await else {
                return;
            };
            tokio::join!(
                self.node_status_loop(inputs, node.status, &shutdown),
                self.lease_loop(&shutdown),
                self.extra_loops(&shutdown),
            );
        };
        tokio::join!(services, node, rotation);
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.shared.client.clone())
    }

    /// Create the Node if missing (or read it when registration is off); returns it once done,
    /// `None` if cancelled first.
    async fn register_until_done(&self, shutdown: &CancellationToken) -> Option<Node> {
        let mut backoff = INITIAL_BACKOFF;
        loop {
            match self.register().await {
                Ok(node) => return Some(node),
                Err(e) => {
                    tracing::warn!(node = %self.shared.node_name, "unable to register node with the API server, will retry: {}", kubelet_api::chain(&e))
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return None,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = next_backoff(backoff);
        }
    }

    /// One registration attempt (the kubelet's `tryRegisterWithAPIServer`).
    pub async fn register(&self) -> Result<Node, ApiServerError> {
        let name = &self.shared.node_name;
        let config = &self.shared.config;
        let err = |source| ApiServerError::RegisterNode {
            node: name.clone(),
            source,
        };
        let api = self.nodes();
        let node = if config.register_node {
            let wanted = node::initial_node(name, config);
            match api.create(&PostParams::default(), &wanted).await {
                Ok(n) => {
                    tracing::info!(node = %name, "successfully registered node");
                    n
                }
                Err(e) if is_status(&e, 409) => {
                    let existing = api.get(name).await.map_err(err)?;
                    self.reconcile_labels(&api, existing, &wanted).await?
                }
                Err(e) => return Err(err(e)),
            }
        } else {
            api.get(name).await.map_err(err)?
        };
        *self.shared.node_uid.write() = node.metadata.uid.clone();
        Ok(node)
    }

    /// An existing Node gets the default labels the agent would set (the kubelet's
    /// `updateDefaultLabels`); other labels are left alone.
    async fn reconcile_labels(
        &self,
        api: &Api<Node>,
        existing: Node,
        wanted: &Node,
    ) -> Result<Node, ApiServerError> {
        let name = &self.shared.node_name;
        let have = existing.metadata.labels.clone().unwrap_or_default();
        let missing: std::collections::BTreeMap<&String, &String> = wanted
            .metadata
            .labels
            .iter()
            .flatten()
            .filter(|(k, v)| have.get(*k) != Some(*v))
            .collect();
        if missing.is_empty() {
            return Ok(existing);
        }
        let patch = serde_json::json!({ "metadata": { "labels": missing } });
        api.patch(name, &PatchParams::default(), &Patch::Strategic(patch))
            .await
            .map_err(|source| ApiServerError::RegisterNode {
                node: name.clone(),
                source,
            })
    }

    fn facts(&self) -> NodeFacts {
        let config = &self.shared.config;
        NodeFacts {
            machine: MachineInfo::detect(&config.root_dir),
            node_ip: config
                .node_ip
                .clone()
                .or_else(|| machine::default_route_ip().map(|ip| ip.to_string())),
            hostname: config.hostname.clone().unwrap_or_else(machine::hostname),
        }
    }

    /// Patch the node status once.
    pub(crate) async fn post_node_status(
        &self,
        status: &NodeStatus,
    ) -> Result<Node, ApiServerError> {
        let patch = node::node_status_patch(status);
        self.nodes()
            .patch_status(
                &self.shared.node_name,
                &PatchParams::default(),
                &Patch::Strategic(patch),
            )
            .await
            .map_err(|source| ApiServerError::UpdateNodeStatus {
                node: self.shared.node_name.clone(),
                source,
            })
    }

    async fn node_status_loop(
        &self,
        inputs: NodeStatusInputs,
        initial: Option<NodeStatus>,
        shutdown: &CancellationToken,
    ) {
        let config = &self.shared.config;
        let name = &self.shared.node_name;
        let mut last: Option<NodeStatus> = initial;
        let mut last_report: Option<Instant> = None;
        let mut facts = self.facts();
        let mut facts_at = Instant::now();
        loop {
            if facts_at.elapsed() >= config.node_status_report_frequency {
                facts = self.facts();
                facts_at = Instant::now();
            }
            let obs = inputs.observe().await;
            let status = node::node_status(&facts, config, &obs, last.as_ref(), Timestamp::now());
            let due =
                last_report.is_none_or(|t| t.elapsed() >= config.node_status_report_frequency);
            let changed = last
                .as_ref()
                .is_none_or(|l| node::node_status_changed(l, &status));
            if due || changed {
                match self.post_node_status(&status).await {
                    Ok(_) => {
                        let was = last
                            .as_ref()
                            .and_then(|l| node::ready_status(l).map(str::to_string));
                        let now = node::ready_status(&status).map(str::to_string);
                        if was != now {
                            self.record_ready(now.as_deref() == Some("True"));
                        }
                        last = Some(status);
                        last_report = Some(Instant::now());
                    }
                    Err(e) => {
                        tracing::warn!(node = %name, "error updating node status, will retry: {}", kubelet_api::chain(&e));
                        if e.status_code() == Some(404) && config.register_node {
                            self.register_again(&mut last).await;
                        }
                    }
                }
            } else if config.register_node {
                // Nothing to post: make sure the Node still exists (the kubelet reads it on
                // every tick too), so that a deleted Node is registered again within one
                // period instead of at the next forced report.
                match self.nodes().get_metadata_opt(name).await {
                    Ok(None) => self.register_again(&mut last).await,
                    Ok(Some(_)) => {}
                    Err(e) => {
                        tracing::debug!(node = %name, "reading the node: {}", kubelet_api::chain(&e));
                    }
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => {
                    self.final_node_status(&inputs, &facts, last.as_ref()).await;
                    return;
                }
                _ = tokio::time::sleep(config.node_status_update_frequency) => {}
                // A plugin's conditions changed (node shutdown): post now.
                _ = inputs.changed() => {}
            }
        }
    }

    /// When the agent stops: post the node status once more if it changed since the last post
    /// (a node shutting down says so before the agent goes).
    async fn final_node_status(
        &self,
        inputs: &NodeStatusInputs,
        facts: &NodeFacts,
        last: Option<&NodeStatus>,
    ) {
        let obs = inputs.observe().await;
        let status = node::node_status(facts, &self.shared.config, &obs, last, Timestamp::now());
        if last.is_some_and(|l| !node::node_status_changed(l, &status)) {
            return;
        }
        if let Err(e) = self.post_node_status(&status).await {
            tracing::warn!(node = %self.shared.node_name, "posting the node status at stop: {}", kubelet_api::chain(&e));
        }
    }

    /// The Node was deleted while the agent runs: create it again, with the same labels and
    /// taints (and keep its new UID); its whole status is posted on the next tick. The
    /// kubelet needs a restart for this.
    async fn register_again(&self, last: &mut Option<NodeStatus>) {
        let name = &self.shared.node_name;
        tracing::warn!(node = %name, "the Node object is gone: registering the node again");
        match self.register().await {
            Ok(_) => *last = None,
            Err(e) => {
                tracing::warn!(node = %name, "re-registering node: {}", kubelet_api::chain(&e));
            }
        }
    }

    fn record_ready(&self, ready: bool) {
        let name = &self.shared.node_name;
        if let Some(r) = self.shared.recorder.read().as_ref() {
            let (reason, message) = if ready {
                ("NodeReady", format!("Node {name} status is now: NodeReady"))
            } else {
                (
                    "NodeNotReady",
                    format!("Node {name} status is now: NodeNotReady"),
                )
            };
            r.normal(InvolvedObject::node(name), reason, message);
        }
    }

    async fn lease_loop(&self, shutdown: &CancellationToken) {
        let config = &self.shared.config;
        let name = &self.shared.node_name;
        let api: Api<Lease> = Api::namespaced(self.shared.client.clone(), LEASE_NAMESPACE);
        let mut last: Option<Lease> = None;
        let mut backoff = INITIAL_BACKOFF;
        loop {
            let uid = self.node_uid();
            let wait = match lease::renew(
                &api,
                name,
                uid.as_deref(),
                config.node_lease_duration_seconds,
                last.take(),
            )
            .await
            {
                Ok(l) => {
                    tracing::trace!(node = %name, "node lease renewed");
                    last = Some(l);
                    backoff = INITIAL_BACKOFF;
                    config.node_lease_renew_interval
                }
                Err(e) => {
                    tracing::warn!(node = %name, "failed to renew the node lease, will retry in {backoff:?}: {}", kubelet_api::chain(&e));
                    let w = backoff;
                    backoff = next_backoff(backoff);
                    w
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Mirror pods: reconciled on every change the source or the sink reports, and every 10 s.
    async fn extra_loops(&self, shutdown: &CancellationToken) {
        let shared = &self.shared;
        loop {
            let uid = self.node_uid();
            shared
                .mirrors
                .reconcile(
                    &shared.client,
                    &shared.unknown_status_fields,
                    &shared.node_name,
                    uid.as_deref(),
                )
                .await;
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = shared.mirrors.wait() => {}
            }
        }
    }
}

/// How long the plugin's loop waits at most between attempts after errors.
pub const MAX_RETRY: Duration = lease::MAX_BACKOFF;
