//! Magnetar's HTTP admin API: the subset of Apache Pulsar's `/admin/v2` REST API that
//! `pulsar-admin`, the official client libraries and the Helm charts need for clusters,
//! tenants, namespaces and partitioned topics, built on axum.
//!
//! # Use
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use std::sync::Arc;
//! use magnetar_admin::{bootstrap, router, serve, AdminState, NoopHooks};
//! use magnetar_metadata::MemoryStore;
//!
//! let store = Arc::new(MemoryStore::new());
//! bootstrap(store.as_ref(), "standalone").await.expect("bootstrap");
//! let state = AdminState::new(store, Arc::new(NoopHooks), "standalone");
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! serve(listener, router(state), std::future::pending()).await
//! # }
//! ```
//!
//! The HTTP layer above the broker core: [`AdminHooks`] answers [`BrokerHooks`] (what only the
//! broker knows: its topics, deleting topic data, health) with a `magnetar_broker::BrokerService`;
//! tests use [`NoopHooks`]. Names, metadata keys, policies documents and schema rules come from
//! `magnetar_model`, shared with the broker and the client.
//!
//! # Metadata layout
//!
//! The admin API and the broker share these metadata-store keys (`magnetar_model::keys` builds
//! them):
//!
//! | what | key | value |
//! | --- | --- | --- |
//! | tenant | `/admin/tenants/{tenant}` | JSON TenantInfo `{"adminRoles":[],"allowedClusters":["standalone"]}` |
//! | namespace | `/admin/namespaces/{tenant}/{namespace}` | JSON `magnetar_model::policy::NamespacePolicies` (Pulsar's `Policies` names; unknown fields kept) |
//! | topic policies | `/admin/topic-policies/{tenant}/{namespace}/{domain}/{encoded-topic}` | JSON `magnetar_model::policy::TopicPolicies` (partitions share their topic's) |
//! | partitioned topic | `/admin/partitioned-topics/{tenant}/{namespace}/{domain}/{encoded-topic}` | JSON `{"partitions":N}` (optionally `"properties"`) |
//! | non-partitioned topic | `/topics/{tenant}/{namespace}/{domain}/{encoded-topic}` | owned by the broker (`{}`); the admin API reads existence, lists children and keeps the topic's `"properties"` in it |
//! | topic schema history | `/schemas/{tenant}/{namespace}/{encoded-topic}` | JSON `magnetar_model::schema::SchemaHistory` (partitions share their topic's) |
//!
//! `{domain}` is `persistent` or `non-persistent`; `{encoded-topic}` is the local name encoded
//! like Java's `URLEncoder` (`magnetar_model::names::encode_topic_name`). Partitions are topics named
//! `{topic}-partition-{i}`. [`bootstrap`] creates tenants `public` and `pulsar` and namespaces
//! `public/default` and `pulsar/system` when absent.
//!
//! # Endpoints
//!
//! Errors carry Pulsar's JSON body `{"reason": "..."}`. `{d}` is `persistent` or
//! `non-persistent`.
//!
//! | method and path | success | errors |
//! | --- | --- | --- |
//! | `GET /admin/v2/brokers/health`, `GET /admin/v2/brokers/ready` | 200 `ok` | 503 with the reason (not ready), 500 |
//! | `GET /admin/v2/brokers/{c}`, `GET /admin/v2/brokers` | 200 `["host:web-port"]` (registered brokers) | 404 |
//! | `GET /admin/v2/brokers/leaderBroker` | 200 `{"brokerId","serviceUrl"}` (first registered broker; no election) | |
//! | `GET /admin/v2/brokers/version` | 200 version, plain text | |
//! | `GET /admin/v2/brokers/configuration` | 200 the dynamic settings' names (`magnetar_model::dynamic_config::NAMES`) | |
//! | `GET /admin/v2/brokers/configuration/values` | 200 `{name: value}` set at run time | |
//! | `GET /admin/v2/brokers/configuration/runtime` | 200 settings by Pulsar's names (those Magnetar has) | |
//! | `GET /admin/v2/brokers/internal-configuration` | 200 InternalConfigurationData, all null | |
//! | `POST /admin/v2/brokers/configuration/{name}/{value}`, `DELETE …/configuration/{name}` | 204, every broker applies it | 412 " Can't update non-dynamic configuration", " Invalid dynamic-config value" |
//! | `GET /admin/v2/bookies/all` | 200 `{"bookies":[{"bookieId":"host:port"}]}` (storage nodes with a cookie, up or not) | |
//! | `GET /admin/v2/bookies/racks-info` | 200 group -> address -> `{"rack","hostname"}` (`{}` for none) | |
//! | `GET /admin/v2/bookies/racks-info/{bookie}` | 200 `{"rack","hostname"}` | 404 none assigned |
//! | `POST /admin/v2/bookies/racks-info/{bookie}?group=G` `{"rack","hostname"}` | 204 (placement uses it from the next ledger) | 412 no group, rack empty or of more than one level; 400 body |
//! | `DELETE /admin/v2/bookies/racks-info/{bookie}` | 204 | 404 none assigned |
//! | `PUT\|POST /admin/v2/bookies/{bookie}/decommission` (`{bookie}`: address or node id) | 204 (the node turns read-only, its copies move) | 404 unknown node |
//! | `GET /admin/v2/bookies/{bookie}/decommission` | 200 `{"bookieId","nodeId","state":"draining"\|"drained"\|"removable","registered","requestedAtMs","closedLedgers","openLedgers","markedLedgers"}` | 404 not being decommissioned |
//! | `DELETE /admin/v2/bookies/{bookie}/decommission` | 204 (called off) | 404 not being decommissioned |
//! | `GET /admin/v2/bookies/autorecovery` | 200 `{"auditor","nodes":[{"bookieId","nodeId","state":"up"\|"read-only"\|"down","freeBytes","rack","decommission"}],"underReplicatedLedgers","underReplicated":[{"ledger","nodes"}]}` (the console's storage page) | |
//! | `DELETE /admin/v2/bookies/{bookie}` | 204 (cookie, rack and record removed: listed no more) | 409 ledgers still name it, or it still runs |
//! | `GET /admin/v2/broker-stats/{topics,bookieops}` / `{metrics,mbeans}` | 200 `{}` / `[]` (stubs) | |
//! | `GET /metrics` | 200 Prometheus text | |
//! | `GET /`, `GET /console/{app.js,app.css,favicon.svg}` | 200 the web console (embedded assets) | |
//! | `GET /console/api/history[?topic=…]` | 200 `{"intervalMs","capacity","points":[…]}` (recent totals, or one topic's series) | 400 bad topic name |
//! | `GET /admin/v2/clusters` | 200 `["standalone"]` | |
//! | `GET /admin/v2/clusters/{c}` | 200 ClusterData (stored record, else this broker's URLs) | 404 |
//! | `GET /admin/v2/tenants` | 200 names | |
//! | `PUT /admin/v2/tenants/{t}` | 204 | 400, 409, 412 |
//! | `GET /admin/v2/tenants/{t}` | 200 TenantInfo | 404 |
//! | `POST /admin/v2/tenants/{t}` | 204 | 400, 404, 409, 412 |
//! | `DELETE /admin/v2/tenants/{t}[?force=true]` | 204 (force: every namespace, forced, first) | 404, 409 (has namespaces, not forced) |
//! | `GET /admin/v2/namespaces/{t}` | 200 `["t/ns"]` | 404 |
//! | `PUT /admin/v2/namespaces/{t}/{ns}` | 204 | 400, 403, 404, 409, 412 |
//! | `GET /admin/v2/namespaces/{t}/{ns}` | 200 Policies | 404, 412 |
//! | `DELETE /admin/v2/namespaces/{t}/{ns}[?force=true]` | 204 (force: every topic deleted by the broker) | 404, 409 (not empty, not forced), 412 |
//! | `GET\|POST\|DELETE /admin/v2/namespaces/{t}/{ns}/{policy}` (see below) | 200 value / 204 unset; 204 | 400 body, 404, 412 value |
//! | `POST\|DELETE /admin/v2/namespaces/{t}/{ns}/backlogQuota[?backlogQuotaType=]` BacklogQuota | 204 | 400, 404, 412 (exceeds retention) |
//! | `GET /admin/v2/namespaces/{t}/{ns}/backlogQuotaMap` | 200 `{type: quota}` | 404 |
//! | `GET /admin/v2/namespaces/{t}/{ns}/permissions` | 200 `{role: [actions]}` | 404 |
//! | `POST\|DELETE /admin/v2/namespaces/{t}/{ns}/permissions/{role}` `["produce",…]` | 204 | 400, 404 |
//! | `GET /admin/v2/namespaces/{t}/{ns}/permissions/subscription` | 200 `{sub: [roles]}` | 404 |
//! | `POST …/permissions/subscription/{sub}` `[roles]`, `DELETE …/permissions/{sub}/{role}` | 204 | 400, 404 |
//! | `GET\|PUT\|DELETE /admin/v2/namespaces/{t}/{ns}/properties` | 200 map; 204 (PUT merges) | 400, 404 |
//! | `GET\|DELETE …/property/{key}`, `PUT …/property/{key}/{value}` | 200 text / 204 | 404 |
//! | `GET /admin/v2/namespaces/{t}/{ns}/bundles` | 200 BundlesData | 404 |
//! | `PUT /admin/v2/namespaces/{t}/{ns}/unload`, `PUT …/{bundle}/unload` | 204 (loaded topics unloaded) | 404, 412 bad bundle |
//! | `GET\|POST\|DELETE /admin/v2/{d}/{t}/{ns}/{topic}/{policy}[?applied=true]` (see below) | 200 / 204; 204 | 400, 404 (namespace), 412 |
//! | `POST\|DELETE /admin/v2/{d}/{t}/{ns}/{topic}/backlogQuota[?backlogQuotaType=]`, `GET …/backlogQuotaMap[?applied=true]` | 204 / 200 | 400, 404, 412 |
//! | `GET /admin/v2/namespaces/{t}/{ns}/topics` | 200 names | 400, 404, 412 |
//! | `GET /admin/v2/{d}/{t}/{ns}` | 200 topics incl. partitions | 404, 412 |
//! | `GET /admin/v2/{d}/{t}/{ns}/partitioned` | 200 partitioned topics | 404, 412 |
//! | `PUT /admin/v2/{d}/{t}/{ns}/{topic}` | 204 | 404, 409, 412 |
//! | `DELETE /admin/v2/{d}/{t}/{ns}/{topic}` | 204 | 404, 412, hook errors |
//! | `PUT /admin/v2/{d}/{t}/{ns}/{topic}/partitions` body `N` | 204 | 400, 404, 406, 409, 412 |
//! | `GET /admin/v2/{d}/{t}/{ns}/{topic}/partitions` | 200 `{"partitions":N}` | 404, 412 |
//! | `POST /admin/v2/{d}/{t}/{ns}/{topic}/partitions` body `N` | 204 | 400, 406, 409, 412, 422 |
//! | `DELETE /admin/v2/{d}/{t}/{ns}/{topic}/partitions` | 204 | 404, 409, 412, hook errors |
//! | `GET /admin/v2/{d}/{t}/{ns}/{topic}/stats` | 200 TopicStats | 404, 412 |
//! | `GET /admin/v2/persistent/{t}/{ns}/{topic}/internalStats` | 200 PersistentTopicInternalStats | 404, 405 (non-persistent) |
//! | `GET /admin/v2/{d}/{t}/{ns}/{topic}/partitioned-stats[?perPartition=…]` | 200 PartitionedTopicStats | 404 (not partitioned) |
//! | `GET /admin/v2/persistent/{t}/{ns}/{topic}/partitioned-internalStats` | 200 `{"metadata":…,"partitions":{…}}` | 404 |
//! | `GET /admin/v2/{d}/{t}/{ns}/{topic}/subscriptions` | 200 names (partitioned: of all partitions) | 404 |
//! | `PUT /admin/v2/persistent/{t}/{ns}/{topic}/subscription/{sub}` MessageId / ResetCursorData (default latest) | 204 (partitioned: on every partition) | 400, 404, 409 |
//! | `DELETE /admin/v2/persistent/{t}/{ns}/{topic}/subscription/{sub}[?force=true]` | 204 | 404, 412 (consumers connected) |
//! | `POST …/subscription/{sub}/skip/{n}` | 204 | 400, 404, 405 (partitioned) |
//! | `POST …/subscription/{sub}/skip_all` (clear backlog) | 204 (partitioned: every partition) | 404 |
//! | `POST …/subscription/{sub}/resetcursor/{timestamp}` | 204 (partitioned: every partition) | 400, 404 |
//! | `POST …/subscription/{sub}/resetcursor` ResetCursorData | 204 | 400, 404, 405 |
//! | `GET …/subscription/{sub}/position/{n}` (peek) | 200 entry, `X-Pulsar-*` headers | 404 "Message not found", 405 |
//! | `GET …/{topic}/examinemessage?initialPosition=earliest\|latest&messagePosition=n` | 200 entry | 400, 404, 405 |
//! | `GET …/{topic}/ledger/{l}/entry/{e}` | 200 entry | 404, 405 |
//! | `GET …/{topic}/lastMessageId` | 200 `{"ledgerId","entryId","partitionIndex","batchIndex"}` | 404, 405 |
//! | `PUT /admin/v2/{d}/{t}/{ns}/{topic}/unload` | 204 (partitioned: every partition) | 404 |
//! | `POST …/{topic}/terminate` | 200 last message id | 404, 405 (partitioned, non-persistent) |
//! | `POST …/{topic}/terminate/partitions` | 200 `{index: message id}` | 404 |
//! | `GET`, `PUT` (merge), `DELETE ?key=k` `…/{topic}/properties` | 200 map / 204 | 400, 404 |
//!
//! `…` is `/admin/v2/persistent/{t}/{ns}`. Topic stats: counters are per topic, producer,
//! subscription and consumer (`magnetar_broker::stats`); rates are computed when asked from the
//! counters' deltas since the previous stats request (over at least one second), not over
//! Pulsar's fixed 60 s window. Topic properties live in the partitioned-topic metadata, or in the
//! `/topics/…` value of a non-partitioned topic (`{"properties":{…}}`). A terminated topic
//! records it in its managed-ledger list (`"terminated":true`).
//! | `GET /admin/v2/schemas/{t}/{ns}/{topic}/schema` | 200 GetSchemaResponse | 404, 412 |
//! | `GET /admin/v2/schemas/{t}/{ns}/{topic}/schema/{version}` | 200 GetSchemaResponse | 400, 404, 412 |
//! | `GET /admin/v2/schemas/{t}/{ns}/{topic}/schemas` | 200 `{"getSchemaResponses":[…]}` | 404, 412 |
//! | `POST /admin/v2/schemas/{t}/{ns}/{topic}/schema` PostSchemaPayload | 202 `{"version":{"version":N}}` | 400, 409, 422 |
//! | `DELETE /admin/v2/schemas/{t}/{ns}/{topic}/schema[?force=true]` | 200 `{"version":N}` | 404, 412 |
//! | `POST /admin/v2/schemas/{t}/{ns}/{topic}/compatibility` PostSchemaPayload | 202 `{"compatibility":true,"schemaCompatibilityStrategy":…}` | 400, 409 incompatible |
//!
//! Each handler documents its exact semantics (see `routes`).
//!
//! # Policies
//!
//! Namespace `{policy}` (set with `POST` unless marked PUT; body a JSON value of Pulsar's type):
//! `retention`, `messageTTL`, `deduplication`, `maxUnackedMessagesPerConsumer`,
//! `maxUnackedMessagesPerSubscription`, `maxProducersPerTopic`, `maxConsumersPerTopic`,
//! `maxConsumersPerSubscription`, `dispatchRate`, `subscriptionDispatchRate`, `publishRate`
//! (these three per cluster, as Pulsar stores them), `inactiveTopicPolicies`,
//! `autoTopicCreation`, `autoSubscriptionCreation`, `subscriptionExpirationTime`,
//! `schemaCompatibilityStrategy` (PUT), `maxTopicsPerNamespace`, `persistence`,
//! `compactionThreshold` (PUT), `offloadThreshold` (PUT), `offloadThresholdInSeconds` (PUT),
//! `offloadDeletionLagMs` (PUT), `persistence/bookieAffinity`.
//!
//! Topic `{policy}`: `retention`, `messageTTL` (value in the `messageTTL` query parameter),
//! `deduplicationEnabled`, `maxUnackedMessagesOnConsumer`, `maxUnackedMessagesOnSubscription`,
//! `maxProducers`, `maxConsumers`, `maxConsumersPerSubscription`, `dispatchRate`,
//! `subscriptionDispatchRate`, `publishRate`, `inactiveTopicPolicies`, `maxMessageSize`,
//! `subscribeRate`, `persistence`, `compactionThreshold`. `?applied=true` answers the topic's
//! value, else its namespace's, else the broker's default ([`BrokerHooks::policy_defaults`]).
//! `isGlobal` is ignored (one cluster). Setting a policy on a topic that does not exist is
//! accepted (Pulsar 3+ answers 404).
//!
//! Values are checked as Pulsar's `NamespacesBase` / `PersistentTopicsBase` do: negative limits
//! and TTLs are 412 with Pulsar's reasons, retention follows `validateRetentionPolicies` (400),
//! a size backlog quota must stay below the retention size and time (412 either way round),
//! persistence follows `validatePersistencePolicies` with Pulsar's default maxima (5).
//!
//! Stored and served but **not enforced** by the broker (yet): the `offload*` policies (no
//! tiered storage), `subscriptionExpirationTime`, `maxTopicsPerNamespace`, the namespace's
//! `autoTopicCreation` override and `subscribeRate`; `persistence` and
//! `persistence/bookieAffinity` only on storage nodes (`[ledgers] storage = "nodes"`: the
//! quorums of a topic's new ledgers, and the node groups they keep to; with the local store
//! there is one copy whatever they say). Enforced: `schemaCompatibilityStrategy` (the
//! schema registry reads it) and permissions (when `[authorization]` is on). Which of the
//! others the broker enforces is the broker's to say (`magnetar_model::policy::Effective`).
//!
//! Bundles: one bundle (`0x00000000`–`0xffffffff`) per namespace unless created with
//! `bundles` (Pulsar's `defaultNumberOfNamespaceBundles` is 4; Magnetar does not split
//! ownership by hash range). Unloading a bundle unloads the whole namespace's loaded topics.

pub mod authentication;
mod authz;
mod bootstrap;
mod broker_hooks;
mod error;
mod hooks;
mod model;
mod remote;
mod routes;
pub mod storage_nodes;

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use magnetar_metadata::MetadataStore;

pub use bootstrap::{
    bootstrap, bootstrap_with_bundles, cluster_initialized, initialize_cluster, BootstrapReport,
    BOOTSTRAP_NAMESPACES,
};
pub use broker_hooks::AdminHooks;
pub use error::AdminError;
pub use hooks::{
    BrokerHooks, ExaminePosition, HookError, NoopHooks, ResetTarget, SubscriptionStart, TopicOwner,
};
pub use magnetar_model::{
    NameError, NamespaceName, PartitionedTopicMetadata, TenantInfo, TopicDomain, TopicName,
};

/// Default cap on the partitions of one topic. Pulsar's `maxNumPartitionsPerPartitionedTopic`
/// defaults to unlimited; Magnetar caps it so a single request cannot make the broker create
/// (and listings enumerate) billions of partitions. Set 0 for unlimited.
pub const DEFAULT_MAX_PARTITIONS_PER_TOPIC: u32 = 10_000;
/// Bundles of a namespace created without any, as Pulsar's `defaultNumberOfNamespaceBundles`.
pub const DEFAULT_NUMBER_OF_NAMESPACE_BUNDLES: u32 = 4;

/// Everything the admin handlers need; cheap to clone.
#[derive(Clone)]
#[non_exhaustive]
pub struct AdminState {
    /// The metadata store holding tenants, namespaces and partitioned topics.
    pub store: Arc<dyn MetadataStore>,
    /// The broker's side of the API.
    pub hooks: Arc<dyn BrokerHooks>,
    /// The (only) cluster's name, e.g. `standalone`.
    pub cluster: String,
    /// Upper bound on partitions per topic (406 on create, 422 on update); 0 = unlimited.
    pub max_partitions_per_topic: u32,
    /// `serviceUrl` reported by `GET /admin/v2/clusters/{cluster}`.
    pub service_url: Option<String>,
    /// `brokerServiceUrl` reported by `GET /admin/v2/clusters/{cluster}`.
    pub broker_service_url: Option<String>,
    /// `serviceUrlTls` (`https://`), when TLS is enabled.
    pub service_url_tls: Option<String>,
    /// `brokerServiceUrlTls` (`pulsar+ssl://`), when TLS is enabled.
    pub broker_service_url_tls: Option<String>,
    /// Who may do what (the `[authorization]` section; off by default). See `authz`.
    pub authorization: magnetar_security::authorization::AuthorizationConfig,
    /// The broker's advertised listeners (the HTTP lookup's `listenerName`).
    pub listeners: magnetar_model::listeners::AdvertisedListeners,
    /// Bundles of a namespace created without any (`defaultNumberOfNamespaceBundles`).
    pub default_bundles: u32,
}

impl AdminState {
    /// State with [`DEFAULT_MAX_PARTITIONS_PER_TOPIC`] and no cluster URLs.
    pub fn new(
        store: Arc<dyn MetadataStore>,
        hooks: Arc<dyn BrokerHooks>,
        cluster: impl Into<String>,
    ) -> Self {
        AdminState {
            store,
            hooks,
            cluster: cluster.into(),
            max_partitions_per_topic: DEFAULT_MAX_PARTITIONS_PER_TOPIC,
            service_url: None,
            broker_service_url: None,
            service_url_tls: None,
            broker_service_url_tls: None,
            authorization: Default::default(),
            listeners: Default::default(),
            default_bundles: DEFAULT_NUMBER_OF_NAMESPACE_BUNDLES,
        }
    }

    /// Sets the bundles of a namespace created without any (1..=128).
    pub fn with_default_bundles(mut self, bundles: u32) -> Self {
        self.default_bundles = bundles;
        self
    }

    /// Enforces `authorization` on every route (see `authz`).
    pub fn with_authorization(
        mut self,
        authorization: magnetar_security::authorization::AuthorizationConfig,
    ) -> Self {
        self.authorization = authorization;
        self
    }

    /// Sets the partition cap (0 = unlimited).
    pub fn with_max_partitions_per_topic(mut self, max: u32) -> Self {
        self.max_partitions_per_topic = max;
        self
    }

    /// Sets the URLs reported as the cluster's `serviceUrl` and `brokerServiceUrl`.
    pub fn with_cluster_urls(
        mut self,
        service_url: impl Into<String>,
        broker_service_url: impl Into<String>,
    ) -> Self {
        self.service_url = Some(service_url.into());
        self.broker_service_url = Some(broker_service_url.into());
        self
    }

    /// Sets the URLs reported as `serviceUrlTls` and `brokerServiceUrlTls` (TLS enabled).
    pub fn with_cluster_urls_tls(
        mut self,
        service_url_tls: impl Into<String>,
        broker_service_url_tls: impl Into<String>,
    ) -> Self {
        self.service_url_tls = Some(service_url_tls.into());
        self.broker_service_url_tls = Some(broker_service_url_tls.into());
        self
    }
}

impl fmt::Debug for AdminState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminState")
            .field("cluster", &self.cluster)
            .field("max_partitions_per_topic", &self.max_partitions_per_topic)
            .field("service_url", &self.service_url)
            .field("broker_service_url", &self.broker_service_url)
            .field("service_url_tls", &self.service_url_tls)
            .field("broker_service_url_tls", &self.broker_service_url_tls)
            .finish_non_exhaustive()
    }
}

/// The admin API router (all endpoints in the crate docs, plus a JSON 404 fallback).
pub fn router(state: AdminState) -> axum::Router {
    routes::build(state)
}

/// Serves `router` on `listener` (plain HTTP) until `shutdown` completes, then stops accepting
/// and waits for in-flight requests to finish (graceful shutdown). Every request carries the
/// extension `TransportIdentity::default()` (not TLS).
pub async fn serve<F>(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    shutdown: F,
) -> std::io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    let router = router.layer(axum::Extension(magnetar_security::TransportIdentity::default()));
    axum::serve(listener, router).with_graceful_shutdown(shutdown).await
}

/// Serves `router` over HTTPS on `listener` until `shutdown` completes, then stops accepting
/// and waits for open connections to finish their requests (graceful shutdown, as [`serve`]).
/// axum's `serve` does no TLS: this accept loop hands each connection to its own task, which
/// runs the TLS handshake (bounded by `magnetar_security::tls::HANDSHAKE_TIMEOUT`, so a stalled
/// client holds nothing else) and then HTTP/1.1 with hyper. Every request carries the
/// connection's `TransportIdentity` (its client certificate's CN, with mTLS) as an extension.
pub async fn serve_tls<F>(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    tls: Arc<magnetar_security::tls::ServerTls>,
    shutdown: F,
) -> std::io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    use tower::ServiceExt;
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    // Handshakes still running at shutdown are abandoned (not waited for, unlike requests).
    let (stopping, stop_handshakes) = tokio::sync::watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (socket, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "HTTPS accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let (tls, router, watcher) = (tls.clone(), router.clone(), graceful.watcher());
        let mut stop_handshake = stop_handshakes.clone();
        tokio::spawn(async move {
            let _ = socket.set_nodelay(true);
            let peer = peer.to_string();
            let accepted = tokio::select! {
                accepted = magnetar_security::tls::accept(&tls, socket, &peer) => accepted,
                _ = stop_handshake.wait_for(|stop| *stop) => None,
            };
            let Some((stream, identity)) = accepted else { return };
            let service = hyper::service::service_fn(
                move |mut request: hyper::Request<hyper::body::Incoming>| {
                    request.extensions_mut().insert(identity.clone());
                    router.clone().oneshot(request)
                },
            );
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            if let Err(error) = watcher.watch(connection).await {
                tracing::debug!(%peer, %error, "HTTPS connection ended with an error");
            }
        });
    }
    drop(listener);
    let _ = stopping.send(true);
    graceful.shutdown().await;
    Ok(())
}
