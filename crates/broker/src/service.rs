//! The broker service: the registry of loaded topics, topic-name rules, partition metadata
//! and what the admin API asks of topics.

use crate::config::BrokerConfig;
use crate::error::BrokerError;
use crate::managed_ledger::LedgerBackend;
use crate::metrics::BrokerMetrics;
use crate::non_persistent::NonPersistentTopic;
use crate::ownership::{AssignedBroker, BrokerUrls, Ownership, SingleBroker};
use crate::registration::Readiness;
use crate::schema_registry::SchemaRegistry;
use crate::topic::Topic;
use magnetar_ledger::LedgerStorage;
use magnetar_metadata::{ExpectedVersion, MetadataError, MetadataStore, Prefetched};
use magnetar_model::dynamic_config::DynamicValues;
use magnetar_model::keys;
use magnetar_model::names::{
    decode_topic_name, is_system_topic, NamespaceName, TopicDomain, TopicName,
};
use magnetar_model::policy::{Effective, PolicyDefaults};
use magnetar_model::PartitionedTopicMetadata;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::OnceCell;

pub struct BrokerService {
    pub config: BrokerConfig,
    pub ledgers: LedgerBackend,
    /// Who serves which topic (LOOKUP): this broker alone in standalone.
    pub ownership: Arc<dyn Ownership>,
    pub metadata: Arc<dyn MetadataStore>,
    pub schemas: SchemaRegistry,
    /// Whether this broker may load topics (see `registration`): not while its metadata
    /// session is lost. Topics already loaded are served regardless.
    pub readiness: Arc<Readiness>,
    topics: Mutex<HashMap<String, Arc<OnceCell<Arc<Topic>>>>>,
    /// Live non-persistent topics: in memory only, gone with the process (as in Pulsar).
    non_persistent: Mutex<HashMap<String, Arc<NonPersistentTopic>>>,
    next_key: AtomicU64,
    /// Loads under way at most (`max_concurrent_topic_loads`).
    load_permits: tokio::sync::Semaphore,
    /// Bumped before every policy refresh of the loaded topics: a topic whose load started
    /// before a bump re-reads its policies once loaded (it was not among the loaded ones).
    policy_changes: AtomicU64,
    /// The recent totals and topic series the web console charts (`history`: bounded, filled
    /// by the sampler task `history::start`).
    pub history: Mutex<crate::history::History>,
    /// Permission checks of protocol commands (see `authorization`).
    pub authorizer: Arc<crate::authorization::Authorizer>,
    /// The dynamic configuration's values (`pulsar-admin brokers update-dynamic-config`), and
    /// the policy defaults they make with the configuration file's, shared with the loaded
    /// topics (which layer their policies over them at each refresh).
    dynamic: Mutex<DynamicValues>,
    policy_defaults: SharedPolicyDefaults,
    /// The advertised listeners (`advertised_listeners`), parsed once.
    pub listeners: magnetar_model::listeners::AdvertisedListeners,
    /// Names for producers that bring none, unique across the cluster.
    pub producer_names: crate::ledger_ids::ProducerNames,
}

/// The broker-wide policy defaults, as the dynamic configuration last made them.
pub type SharedPolicyDefaults = Arc<parking_lot::RwLock<PolicyDefaults>>;

impl BrokerService {
    pub fn new(
        config: BrokerConfig,
        storage: Arc<dyn LedgerStorage>,
        metadata: Arc<dyn MetadataStore>,
    ) -> Arc<Self> {
        Self::build(
            config,
            storage,
            metadata,
            Arc::new(Readiness::ready()),
            BrokerMetrics::new(None),
            None,
        )
    }

    /// A service whose topic loads follow `readiness` (driven by a `registration::Registration`)
    /// and that counts into `metrics` (whose metadata-write counter, if any, is that of a
    /// counting store around `metadata`).
    /// `ownership`: who serves what in a cluster (`None`: this broker serves every topic).
    pub fn build(
        config: BrokerConfig,
        storage: Arc<dyn LedgerStorage>,
        metadata: Arc<dyn MetadataStore>,
        readiness: Arc<Readiness>,
        metrics: Arc<BrokerMetrics>,
        ownership: Option<Arc<dyn Ownership>>,
    ) -> Arc<Self> {
        let max_concurrent_topic_loads = config.max_concurrent_topic_loads;
        let ownership = ownership.unwrap_or_else(|| {
            Arc::new(SingleBroker {
                urls: BrokerUrls {
                    broker_url: config.service_url(),
                    broker_url_tls: config.service_url_tls.clone(),
                    web_url: None,
                    web_url_tls: None,
                    listeners: config.listeners(),
                },
            })
        });
        let authorizer = Arc::new(crate::authorization::Authorizer::new(
            config.authorization.clone(),
            metadata.clone(),
        ));
        let persistence = config.persistence.clone();
        let persistence_policies = config.persistence_policies;
        let policy_defaults = Arc::new(parking_lot::RwLock::new(config.policy_defaults()));
        let config_cluster = config.cluster_name.clone();
        Arc::new(BrokerService {
            listeners: config.listeners(),
            dynamic: Mutex::default(),
            policy_defaults,
            authorizer,
            config,
            ownership,
            ledgers: LedgerBackend::new(storage, metadata.clone())
                .with_metrics(metrics)
                .with_persistence(persistence)
                .with_persistence_policies(persistence_policies),
            schemas: SchemaRegistry::new(metadata.clone()),
            producer_names: crate::ledger_ids::ProducerNames::new(
                metadata.clone(),
                &config_cluster,
            ),
            metadata,
            readiness,
            topics: Mutex::default(),
            non_persistent: Mutex::default(),
            next_key: AtomicU64::new(1),
            load_permits: tokio::sync::Semaphore::new(max_concurrent_topic_loads),
            policy_changes: AtomicU64::new(0),
            history: Mutex::default(),
        })
    }

    /// The policy defaults now: the configuration file's, with the dynamic configuration's
    /// values over them.
    pub fn policy_defaults(&self) -> PolicyDefaults {
        self.policy_defaults.read().clone()
    }

    /// Whether a topic is created on first use (`allowAutoTopicCreation`, dynamic).
    pub fn allow_auto_topic_creation(&self) -> bool {
        self.dynamic
            .lock()
            .allow_auto_topic_creation
            .unwrap_or(self.config.allow_auto_topic_creation)
    }

    /// The dynamic configuration's values in force.
    pub fn dynamic_values(&self) -> DynamicValues {
        self.dynamic.lock().clone()
    }

    /// Reads the dynamic configuration ([`keys::DYNAMIC_CONFIGURATION`]) and applies it: the
    /// policy defaults are remade and every loaded topic re-reads its policies. At start-up,
    /// after this broker's admin API changed it, and (cluster) when the policy watch sees
    /// another broker change it. A value that does not parse (the document written by hand)
    /// is left out and logged.
    pub async fn reload_dynamic_configuration(&self) -> Result<(), BrokerError> {
        let document: std::collections::BTreeMap<String, String> =
            match self.metadata.get(keys::DYNAMIC_CONFIGURATION).await? {
                Some(found) => serde_json::from_slice(&found.value)
                    .map_err(|e| BrokerError::Metadata(format!("dynamic configuration: {e}")))?,
                None => Default::default(),
            };
        let (values, rejected) = DynamicValues::from_document(&document);
        if !rejected.is_empty() {
            tracing::warn!(?rejected, "dynamic configuration: settings left out (not dynamic, or their value does not parse)");
        }
        let changed = {
            let mut dynamic = self.dynamic.lock();
            let changed = *dynamic != values;
            *dynamic = values.clone();
            changed
        };
        if !changed {
            return Ok(());
        }
        *self.policy_defaults.write() = self.config.policy_defaults_with(&values);
        tracing::info!(?document, "dynamic configuration applied");
        self.refresh_policies_of(|_| true).await
    }

    /// A broker-wide unique key for producers and consumers.
    pub fn next_key(&self) -> u64 {
        self.next_key.fetch_add(1, Ordering::Relaxed)
    }

    /// Parses a topic name as clients send it; short names are completed as Pulsar does
    /// (`t` -> `persistent://public/default/t`, `a/b/t` -> `persistent://a/b/t`).
    pub fn topic_name(raw: &str) -> Result<TopicName, BrokerError> {
        let full = if raw.contains("://") {
            raw.to_string()
        } else {
            match raw.split('/').count() {
                1 => format!("persistent://public/default/{raw}"),
                3 => format!("persistent://{raw}"),
                _ => return Err(BrokerError::InvalidTopicName(raw.to_string())),
            }
        };
        TopicName::parse(&full).map_err(|_| BrokerError::InvalidTopicName(raw.to_string()))
    }

    /// Partition count of a topic (0: not partitioned).
    pub async fn partitions(&self, name: &TopicName) -> Result<u32, BrokerError> {
        read_partitions(&*self.metadata, name).await
    }

    /// Whether `name` is a persistent topic loaded on this broker (and not fenced).
    pub fn is_loaded(&self, name: &TopicName) -> bool {
        self.topics
            .lock()
            .get(&name.to_string())
            .and_then(|cell| cell.get())
            .is_some_and(|topic| !topic.is_fenced())
    }

    pub async fn topic_exists(&self, name: &TopicName) -> Result<bool, BrokerError> {
        if name.domain() == TopicDomain::NonPersistent {
            return Ok(self.non_persistent.lock().contains_key(&name.to_string()));
        }
        if self.topics.lock().get(&name.to_string()).is_some_and(|cell| cell.initialized()) {
            return Ok(true);
        }
        Ok(self.metadata.get(&keys::topic_key(name)).await?.is_some())
    }

    /// The loaded topic, loading (and, if allowed, creating) it first.
    pub async fn topic(&self, name: &TopicName, create: bool) -> Result<Arc<Topic>, BrokerError> {
        Ok(self.topic_loading(name, create).await?.0)
    }

    /// [`BrokerService::topic`], and whether this call loaded it (its policies were read
    /// during the call: a producer or consumer created on it need not read them again).
    pub async fn topic_loading(
        &self,
        name: &TopicName,
        create: bool,
    ) -> Result<(Arc<Topic>, bool), BrokerError> {
        let full = name.to_string();
        let cell = {
            let mut topics = self.topics.lock();
            let cell = topics.entry(full.clone()).or_default();
            if cell.get().is_some_and(|topic| topic.is_fenced()) {
                // Another broker wrote its metadata: what this one holds is stale; load anew.
                *cell = Arc::default();
            }
            cell.clone()
        };
        if let Some(topic) = cell.get() {
            return Ok((topic.clone(), false));
        }
        // Held through the load (and through a wait on another request's load of the same
        // topic: that one holds a permit too, so the waits always end).
        let _permit = self.load_permits.acquire().await.map_err(|_| BrokerError::ShuttingDown)?;
        if let Some(topic) = cell.get() {
            return Ok((topic.clone(), false)); // loaded by another request meanwhile
        }
        // Loading a topic relies on this broker's registration (its metadata session): refuse
        // new loads, with an error clients retry, while it is lost; and on owning its bundle.
        self.readiness.check()?;
        self.ownership.check_serve(name).await?;
        // Every key the load reads, in one request (on etcd, a load's round trips are what
        // bound how fast a new owner serves the topics of a dead broker).
        let cursors = Some(keys::cursors_of(name));
        let ahead = Prefetched::read(self.metadata.clone(), load_keys(name), cursors).await?;
        let metadata: Arc<dyn MetadataStore> = ahead.clone();
        let exists = match name.domain() {
            TopicDomain::NonPersistent => self.topic_exists(name).await?,
            TopicDomain::Persistent => metadata.get(&keys::topic_key(name)).await?.is_some(),
        };
        if !exists {
            if !(create && self.allow_auto_topic_creation()) {
                return Err(BrokerError::TopicNotFound(full));
            }
            if read_partitions(&*metadata, name).await? > 0 {
                return Err(BrokerError::NotAllowed(format!(
                    "{full} is a partitioned topic: use its partitions"
                )));
            }
            match metadata.put(&keys::topic_key(name), "{}".into(), ExpectedVersion::Absent).await {
                Ok(_) | Err(MetadataError::BadVersion { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let policy_changes = self.policy_changes.load(Ordering::SeqCst);
        let loaded_here = AtomicBool::new(false);
        let topic = cell
            .get_or_try_init(|| async {
                loaded_here.store(true, Ordering::SeqCst);
                let loaded = Topic::load(
                    name.clone(),
                    &self.config,
                    self.policy_defaults.clone(),
                    &self.ledgers,
                    metadata.clone(),
                )
                .await;
                let topic = loaded.inspect_err(|error| {
                    // The client is told too, and retries: a line a second at most here.
                    magnetar_clock::warn_limited!(
                        self.ledgers.clock.now_ms(),
                        topic = %full,
                        %error,
                        "topic not loaded"
                    );
                })?;
                tracing::info!(topic = %topic.full_name, "topic loaded");
                Ok::<_, BrokerError>(topic)
            })
            .await;
        ahead.finish();
        let topic = topic?;
        if self.policy_changes.load(Ordering::SeqCst) != policy_changes {
            // Policies changed while it loaded, and the refresh did not see it yet.
            topic.refresh_policies().await?;
        }
        Ok((topic.clone(), loaded_here.load(Ordering::SeqCst)))
    }

    /// [`BrokerService::non_persistent_topic`] with its policies read again (its size,
    /// producer and consumer limits applied; the schema policies returned), as a producer or
    /// consumer is created: persistent topics re-read theirs at the same moments.
    pub async fn non_persistent_topic_with_policies(
        &self,
        name: &TopicName,
        create: bool,
    ) -> Result<(Arc<NonPersistentTopic>, Effective), BrokerError> {
        let topic = self.non_persistent_topic(name, create).await?;
        let effective = self.apply_non_persistent_policies(&topic).await?;
        Ok((topic, effective))
    }

    /// Reads a non-persistent topic's policies (topic over namespace over broker) and applies
    /// them to it; returns them.
    async fn apply_non_persistent_policies(
        &self,
        topic: &NonPersistentTopic,
    ) -> Result<Effective, BrokerError> {
        // Read and applied under the topic's lock: a refresh that read older documents
        // cannot apply them after one that read newer.
        let _serial = topic.policy_refresh.lock().await;
        let defaults = self.policy_defaults();
        let cluster = &self.config.cluster_name;
        let effective =
            crate::topic::read_effective(&*self.metadata, &topic.name, &defaults, cluster).await?;
        topic.apply_policies(&effective, defaults.max_message_size, self.ledgers.clock.now_ms());
        Ok(effective)
    }

    /// The live non-persistent topic `name`, created on first use if allowed. Nothing about it
    /// is stored.
    pub async fn non_persistent_topic(
        &self,
        name: &TopicName,
        create: bool,
    ) -> Result<Arc<NonPersistentTopic>, BrokerError> {
        let full = name.to_string();
        if let Some(topic) = self.non_persistent.lock().get(&full) {
            return Ok(topic.clone());
        }
        if !(create && self.allow_auto_topic_creation()) {
            return Err(BrokerError::TopicNotFound(full));
        }
        self.ownership.check_serve(name).await?;
        if self.partitions(name).await? > 0 {
            return Err(BrokerError::NotAllowed(format!(
                "{full} is a partitioned topic: use its partitions"
            )));
        }
        let topic = self
            .non_persistent
            .lock()
            .entry(full)
            .or_insert_with(|| NonPersistentTopic::new(name.clone()))
            .clone();
        Ok(topic)
    }

    /// Live non-persistent topics of a namespace.
    pub fn non_persistent_topics_of(&self, ns: &NamespaceName) -> Vec<String> {
        self.non_persistent
            .lock()
            .values()
            .filter(|topic| topic.name.namespace() == ns)
            .map(|topic| topic.full_name.clone())
            .collect()
    }

    /// The user topics of a namespace in the given domains, sorted: every non-partitioned topic
    /// and partition the broker created (`/topics/...`) plus every partition of the partitioned
    /// topics (`/admin/partitioned-topics/...`), as Pulsar's `getListOfUserTopics` (system
    /// topics left out).
    pub async fn topics_of_namespace(
        &self,
        ns: &NamespaceName,
        domains: &[TopicDomain],
    ) -> Result<Vec<String>, BrokerError> {
        let mut out = std::collections::BTreeSet::new();
        for &domain in domains {
            let parent = keys::topics_of(ns.tenant(), ns.namespace(), domain);
            for child in self.metadata.list_children(&parent).await? {
                if let Some(topic) = decode_topic_name(&child)
                    .and_then(|local| TopicName::new(domain, ns.clone(), &local).ok())
                {
                    out.insert(topic);
                }
            }
            let parent = keys::partitioned_topics_of(ns.tenant(), ns.namespace(), domain);
            for child in self.metadata.list_children(&parent).await? {
                let Some(base) = decode_topic_name(&child)
                    .and_then(|local| TopicName::new(domain, ns.clone(), &local).ok())
                else {
                    continue;
                };
                let partitions = self.partitions(&base).await?;
                out.extend((0..partitions).map(|i| base.partition(i)));
            }
            if domain == TopicDomain::NonPersistent {
                out.extend(
                    self.non_persistent_topics_of(ns)
                        .iter()
                        .filter_map(|name| TopicName::parse(name).ok()),
                );
            }
        }
        Ok(out.into_iter().filter(|t| !is_system_topic(t)).map(|t| t.to_string()).collect())
    }

    /// Creates a topic on request (admin `PUT`), whatever `allow_auto_topic_creation` says.
    /// `Ok(false)` when it existed already.
    pub async fn create_topic(&self, name: &TopicName) -> Result<bool, BrokerError> {
        if name.domain() == TopicDomain::NonPersistent {
            let mut live = self.non_persistent.lock();
            let created = !live.contains_key(&name.to_string());
            live.entry(name.to_string()).or_insert_with(|| NonPersistentTopic::new(name.clone()));
            return Ok(created);
        }
        match self.metadata.put(&keys::topic_key(name), "{}".into(), ExpectedVersion::Absent).await
        {
            Ok(_) => Ok(true),
            Err(MetadataError::BadVersion { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes a topic and everything it holds (see [`Topic::delete`]). `Ok(false)` when there
    /// was no such topic. The deleted topic stays in the map until its data is gone, so a client
    /// reconnecting meanwhile is refused (and retries) rather than loading what is being
    /// deleted.
    pub async fn delete_topic(&self, name: &TopicName, force: bool) -> Result<bool, BrokerError> {
        let full = name.to_string();
        if name.domain() == TopicDomain::NonPersistent {
            let Some(topic) = self.non_persistent.lock().remove(&full) else {
                return Ok(false);
            };
            topic.producers.close_all();
            return Ok(true);
        }
        if !self.topic_exists(name).await? {
            return Ok(false);
        }
        let topic = self.topic(name, false).await?;
        let deleted = topic.delete(force).await;
        if deleted.is_ok() || topic.is_deleted() {
            // Gone, or half gone: a later load starts from what is left.
            self.topics.lock().remove(&full);
        }
        deleted?;
        // Its schema too (partitions share their partitioned topic's, which goes with it).
        if name.partition_index().is_none() {
            if let Err(error) = self.schemas.delete(name, true).await {
                tracing::warn!(topic = %name, %error, "schema of a deleted topic not deleted");
            }
        }
        Ok(true)
    }

    /// Unloads a topic (admin `unload`): its producers and consumers are closed (clients
    /// reconnect and carry on) and it leaves the map of loaded topics, so the next use loads it
    /// afresh. `Ok(false)` when it was not loaded here. A non-persistent topic, which lives
    /// only in memory, is closed and forgotten the same way (its subscriptions with it).
    pub async fn unload_topic(&self, name: &TopicName) -> Result<bool, BrokerError> {
        self.unload_topic_to(name, None).await
    }

    /// [`BrokerService::unload_topic`], telling its clients the broker it moves to (PIP-307).
    async fn unload_topic_to(
        &self,
        name: &TopicName,
        assigned: Option<&AssignedBroker>,
    ) -> Result<bool, BrokerError> {
        let full = name.to_string();
        if name.domain() == TopicDomain::NonPersistent {
            let Some(topic) = self.non_persistent.lock().remove(&full) else {
                return Ok(false);
            };
            topic.close_clients_to(assigned);
            return Ok(true);
        }
        let loaded = self.topics.lock().get(&full).and_then(|cell| cell.get().cloned());
        let Some(topic) = loaded else { return Ok(false) };
        topic.unload_to(assigned).await;
        let mut topics = self.topics.lock();
        if topics.get(&full).and_then(|cell| cell.get()).is_some_and(|t| Arc::ptr_eq(t, &topic)) {
            topics.remove(&full);
        }
        tracing::info!(topic = %full, "topic unloaded");
        Ok(true)
    }

    /// Unloads the bundles of `namespace` this broker serves (`bundle`: one of them;
    /// `namespace` `None`: all, as a broker shutting down): they stop being served and are
    /// handed over to another broker where there is one, their loaded topics are closed
    /// (clients reconnect to that broker, or look them up again), then the other broker owns
    /// them, or they are free for any. Returns how many topics were unloaded.
    pub async fn unload_bundles(
        &self,
        namespace: Option<&NamespaceName>,
        bundle: Option<&str>,
        destination: Option<&str>,
    ) -> Result<usize, BrokerError> {
        let release = self.ownership.stop_serving(namespace, bundle, destination).await?;
        let unloaded = self
            .unload_where_to(
                |topic| self.ownership.in_release(&release, topic),
                |topic| self.ownership.assigned_to(&release, topic),
            )
            .await;
        self.ownership.released(release).await?;
        Ok(unloaded)
    }

    /// Unloads every loaded topic, persistent or not, that `picked` picks (a bundle lost to
    /// another broker, or unloaded). Returns how many.
    pub async fn unload_where(&self, picked: impl Fn(&TopicName) -> bool) -> usize {
        self.unload_where_to(picked, |_| None).await
    }

    /// [`BrokerService::unload_where`], telling each topic's clients the broker `assigned`
    /// names for it (the one it is handed over to).
    pub async fn unload_where_to(
        &self,
        picked: impl Fn(&TopicName) -> bool,
        assigned: impl Fn(&TopicName) -> Option<AssignedBroker>,
    ) -> usize {
        let mut names: Vec<TopicName> =
            self.loaded_topics().iter().map(|t| t.name.clone()).filter(|n| picked(n)).collect();
        names.extend(
            self.loaded_non_persistent_topics()
                .iter()
                .map(|t| t.name.clone())
                .filter(|n| picked(n)),
        );
        let mut unloaded = 0;
        for name in names {
            match self.unload_topic_to(&name, assigned(&name).as_ref()).await {
                Ok(true) => unloaded += 1,
                Ok(false) => {}
                Err(error) => tracing::warn!(topic = %name, %error, "topic not unloaded"),
            }
        }
        unloaded
    }

    /// `GET /metrics` (see `prometheus.rs`).
    pub fn metrics_parts(&self, format: magnetar_metrics::Format) -> Vec<String> {
        crate::prometheus::render(self, format).finish_parts()
    }

    /// Non-persistent topics loaded now.
    pub fn loaded_non_persistent_topics(&self) -> Vec<Arc<NonPersistentTopic>> {
        self.non_persistent.lock().values().cloned().collect()
    }

    /// Topics loaded now.
    pub fn loaded_topics(&self) -> Vec<Arc<Topic>> {
        self.topics.lock().values().filter_map(|cell| cell.get().cloned()).collect()
    }

    /// Re-reads and applies the policies of every loaded topic, persistent or not, that
    /// `affected` picks (a policy changed: through this broker's admin API, or anywhere in the
    /// cluster as `policy_watch` learns). Every topic is tried; the first error is returned.
    pub async fn refresh_policies_of(
        &self,
        affected: impl Fn(&TopicName) -> bool,
    ) -> Result<(), BrokerError> {
        self.policy_changes.fetch_add(1, Ordering::SeqCst);
        let mut first_error = None;
        for topic in self.loaded_topics() {
            if affected(&topic.name) {
                if let Err(error) = topic.refresh_policies().await {
                    first_error.get_or_insert(error);
                }
            }
        }
        let live: Vec<Arc<NonPersistentTopic>> =
            self.non_persistent.lock().values().filter(|t| affected(&t.name)).cloned().collect();
        for topic in live {
            if let Err(error) = self.apply_non_persistent_policies(&topic).await {
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Pulsar's `TopicList.filterTopics`: the topics whose name (partitions: their partitioned
/// topic's name), without the `domain://` scheme, fully matches `pattern` (itself stripped of
/// any scheme). `None` when the pattern is not a valid regular expression.
pub fn filter_topics(topics: &[String], pattern: &str) -> Option<Vec<String>> {
    let pattern = pattern.split_once("://").map_or(pattern, |(_, rest)| rest);
    let regex = regex::Regex::new(&format!("^(?:{pattern})$")).ok()?;
    Some(
        topics
            .iter()
            .filter(|topic| {
                let base = TopicName::parse(topic)
                    .map(|t| t.partitioned_topic().to_string())
                    .unwrap_or_else(|_| topic.to_string());
                let without_scheme = base.split_once("://").map_or(base.as_str(), |(_, r)| r);
                regex.is_match(without_scheme)
            })
            .cloned()
            .collect(),
    )
}

/// Pulsar's `TopicList.calculateHash`: CRC32C of the sorted names joined by `,`, rendered as
/// Guava's `HashCode.toString()` does (the hash's bytes, little-endian, in lowercase hex).
pub fn topics_hash(topics: &[String]) -> String {
    let mut sorted: Vec<&str> = topics.iter().map(String::as_str).collect();
    sorted.sort_unstable();
    let crc = crc32c::crc32c(sorted.join(",").as_bytes());
    crc.to_le_bytes().iter().map(|b| format!("{b:02x}")).collect()
}

/// Partition count of a topic (0: not partitioned), read from `metadata`.
async fn read_partitions(
    metadata: &dyn MetadataStore,
    name: &TopicName,
) -> Result<u32, BrokerError> {
    if name.partition_index().is_some() {
        return Ok(0);
    }
    match metadata.get(&keys::partitioned_topic_key(name)).await? {
        Some(found) => {
            let metadata: PartitionedTopicMetadata = serde_json::from_slice(&found.value)
                .map_err(|e| BrokerError::Metadata(format!("partition metadata of {name}: {e}")))?;
            Ok(metadata.partitions)
        }
        None => Ok(0),
    }
}

/// The keys a topic's load reads (besides its cursors): its own, its partitioned topic's (to
/// refuse creating a name that is one), its ledger list, compaction and dedup records, and the
/// policies of the topic (kept per partitioned topic) and of its namespace.
fn load_keys(name: &TopicName) -> Vec<String> {
    vec![
        keys::topic_key(name),
        keys::partitioned_topic_key(name),
        keys::managed_ledger_key(name),
        keys::compaction_key(name),
        keys::dedup_key(name),
        keys::topic_policies_key(&name.partitioned_topic()),
        keys::namespace_key(name.namespace()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_topics_like_pulsar() {
        let topics: Vec<String> = [
            "persistent://public/default/pat-a",
            "persistent://public/default/pat-b-partition-0",
            "persistent://public/default/pat-b-partition-1",
            "persistent://public/default/other",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let matched = filter_topics(&topics, "persistent://public/default/pat-.*").unwrap();
        assert_eq!(matched, topics[..3].to_vec());
        // A full match is needed; partitions match through their partitioned topic's name.
        assert_eq!(filter_topics(&topics, "public/default/pat-b").unwrap(), topics[1..3].to_vec());
        assert_eq!(filter_topics(&topics, "public/default/pat").unwrap(), Vec::<String>::new());
        assert!(filter_topics(&topics, "public/default/(").is_none());
    }

    #[test]
    fn hash_is_crc32c_of_sorted_names_in_guava_hex() {
        let a = vec!["b".to_string(), "a".to_string()];
        let expected = crc32c::crc32c(b"a,b").to_le_bytes();
        let hex: String = expected.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(topics_hash(&a), hex);
        assert_eq!(topics_hash(&a), topics_hash(&["a".to_string(), "b".to_string()]));
        // Guava: crc32c of nothing is 0 -> "00000000".
        assert_eq!(topics_hash(&[]), "00000000");
    }
}
