//! The broker hooks: what the admin API asks the broker for, because only the broker knows.
//!
//! The admin API owns tenant, namespace and partitioned-topic metadata; the broker owns
//! topics themselves (the `/topics/…` keys, ledgers, in-memory non-persistent topics,
//! producers and subscriptions). The router calls [`BrokerHooks`] for everything on that side.
//! Every method has a default, so [`NoopHooks`] (used by tests and by a broker that has not
//! wired a method yet) is simply `impl BrokerHooks for NoopHooks {}`.
//!
//! Contract for implementors: hooks may be called concurrently, must not panic, and report
//! failures through [`HookError`], whose variant picks the HTTP status the client sees.

use async_trait::async_trait;
use thiserror::Error;

use std::collections::BTreeMap;

use magnetar_broker::history::HistoryView;
use magnetar_broker::stats::{AdminMessage, InternalStats, TopicStats};
pub use magnetar_broker::topic::{ExaminePosition, SubscriptionStart};
use magnetar_model::names::{NamespaceName, TopicDomain, TopicName};
use magnetar_model::policy::PolicyDefaults;

/// Where an admin `resetcursor` puts a subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetTarget {
    /// The first entry published at or after this time (ms), or the end.
    PublishTime(u64),
    /// A position (or the earliest / latest).
    Position(SubscriptionStart),
}

/// Another broker's answer for a topic (see [`BrokerHooks::topic_owner`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicOwner {
    pub broker_url: String,
    pub broker_url_tls: Option<String>,
    pub web_url: String,
    pub web_url_tls: Option<String>,
    /// The broker is to take the topic (a redirect to the broker chosen for a free bundle):
    /// the client asks it again with `authoritative=true`.
    pub redirect: bool,
    /// That broker's advertised listeners (an HTTP lookup's `listenerName`).
    pub listeners: magnetar_model::listeners::AdvertisedListeners,
}

fn no_broker(topic: &TopicName) -> HookError {
    HookError::NotFound(format!("Topic {topic} not found"))
}

/// A failure reported by a broker hook. The variant decides the HTTP status.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HookError {
    /// 404: the topic (or other resource) does not exist.
    #[error("{0}")]
    NotFound(String),
    /// 409: the topic already exists or is in a conflicting state.
    #[error("{0}")]
    Conflict(String),
    /// 412: e.g. "Topic has active producers/subscriptions" on a non-forced delete.
    #[error("{0}")]
    PreconditionFailed(String),
    /// 503: the broker is not ready to do this now.
    #[error("{0}")]
    Unavailable(String),
    /// 500: anything else.
    #[error("{0}")]
    Internal(String),
    /// Another broker's answer (the owner of a partition asked), passed on with its status.
    #[error("{1}")]
    Answered(u16, String),
}

/// Operations the admin router delegates to the broker.
#[async_trait]
pub trait BrokerHooks: Send + Sync {
    /// Topics the broker has in `namespace` / `domain` beyond the `/topics/…` keys of the
    /// metadata store (typically live non-persistent topics). Names may be full
    /// (`non-persistent://t/ns/x`) or local (`x`). The router merges them with the store's
    /// `/topics/…` children and the partitions of partitioned topics. Default: none.
    async fn list_topics(
        &self,
        namespace: &NamespaceName,
        domain: TopicDomain,
    ) -> Result<Vec<String>, HookError> {
        let _ = (namespace, domain);
        Ok(Vec::new())
    }

    /// Whether the broker has `topic` although no `/topics/…` key exists for it (e.g. a live
    /// non-persistent topic). Default: `false`.
    async fn topic_exists(&self, topic: &TopicName) -> Result<bool, HookError> {
        let _ = topic;
        Ok(false)
    }

    /// Creates the non-partitioned topic `topic` (`PUT /admin/v2/{domain}/{t}/{ns}/{topic}`).
    /// The router has already checked that the namespace exists and that neither a
    /// partitioned nor a non-partitioned topic of that name exists. Required: a default that
    /// did nothing once made `PUT` answer 204 and create nothing.
    async fn create_topic(&self, topic: &TopicName) -> Result<(), HookError>;

    /// Deletes the non-partitioned topic (or partition) `topic` and its data. Called for
    /// `DELETE …/{topic}` and for every partition by `DELETE …/{topic}/partitions` (where
    /// `NotFound` is ignored: a partition nobody used may not exist). Required, as
    /// `create_topic`.
    async fn delete_topic(&self, topic: &TopicName, force: bool) -> Result<(), HookError>;

    /// Called after partitioned-topic metadata was created (`old == 0`) or grown, so the
    /// broker can create partitions eagerly. An error is reported to the client, but the
    /// metadata change stays (as in Pulsar, where partition creation follows the metadata
    /// write). Default: no-op.
    async fn partitions_updated(
        &self,
        topic: &TopicName,
        old: u32,
        new: u32,
    ) -> Result<(), HookError> {
        let _ = (topic, old, new);
        Ok(())
    }

    /// Called after a namespace's or a topic's policies changed (`topic` is `None` for a
    /// namespace), so loaded topics can apply them. Default: no-op.
    async fn policies_updated(
        &self,
        namespace: &NamespaceName,
        topic: Option<&TopicName>,
    ) -> Result<(), HookError> {
        let _ = (namespace, topic);
        Ok(())
    }

    /// Unloads the bundles of `namespace` (`bundle`: one of them, `0xLOWER_0xUPPER`) this broker
    /// serves (`PUT …/{namespace}/unload`, `…/{bundle}/unload`): their topics close their
    /// producers and consumers, which look them up again and reconnect, at `destination` (a
    /// broker id, `?destinationBroker=`) when given. Returns how many topics were unloaded.
    /// Default: none.
    async fn unload_namespace(
        &self,
        namespace: &NamespaceName,
        bundle: Option<&str>,
        destination: Option<&str>,
    ) -> Result<usize, HookError> {
        let _ = (namespace, bundle, destination);
        Ok(0)
    }

    /// Which broker serves `topic` (an HTTP lookup, or an admin operation on the topic):
    /// `None` when it is this one, or there is only this one. Default: `None`.
    async fn topic_owner(
        &self,
        topic: &TopicName,
        authoritative: bool,
    ) -> Result<Option<TopicOwner>, HookError> {
        let _ = (topic, authoritative);
        Ok(None)
    }

    /// The broker defaults policies fall back to (`?applied=true` answers, the topic
    /// `maxMessageSize` cap). Default: Pulsar's (`PolicyDefaults::default()`).
    fn policy_defaults(&self) -> PolicyDefaults {
        PolicyDefaults::default()
    }

    /// Called after the dynamic configuration changed, so the broker applies it. Default:
    /// no-op.
    async fn dynamic_configuration_changed(&self) -> Result<(), HookError> {
        Ok(())
    }

    /// The broker's configuration as Pulsar names it, for
    /// `GET /admin/v2/brokers/configuration/runtime`. Default: empty.
    fn runtime_configuration(&self) -> BTreeMap<String, String> {
        BTreeMap::new()
    }

    /// `TopicStats` of a non-partitioned topic or partition (loading it if it exists).
    /// `NotFound` when there is no such topic. Default: `NotFound`.
    async fn topic_stats(&self, topic: &TopicName) -> Result<TopicStats, HookError> {
        Err(no_broker(topic))
    }

    /// `PersistentTopicInternalStats` of a persistent topic or partition. Default: `NotFound`.
    async fn topic_internal_stats(&self, topic: &TopicName) -> Result<InternalStats, HookError> {
        Err(no_broker(topic))
    }

    /// The subscriptions of a topic or partition. Default: `NotFound`.
    async fn subscriptions(&self, topic: &TopicName) -> Result<Vec<String>, HookError> {
        Err(no_broker(topic))
    }

    /// Creates durable subscription `name` at `start`; `Conflict` when it exists.
    /// Default: `NotFound`.
    async fn create_subscription(
        &self,
        topic: &TopicName,
        name: &str,
        start: SubscriptionStart,
    ) -> Result<(), HookError> {
        let _ = (name, start);
        Err(no_broker(topic))
    }

    /// Removes subscription `name` (`PreconditionFailed` while consumers are connected
    /// unless `force`). Default: `NotFound`.
    async fn delete_subscription(
        &self,
        topic: &TopicName,
        name: &str,
        force: bool,
    ) -> Result<(), HookError> {
        let _ = (name, force);
        Err(no_broker(topic))
    }

    /// Skips the next `count` unacknowledged entries of subscription `name`, or all of them
    /// (`None`: clear the backlog). Default: `NotFound`.
    async fn skip_messages(
        &self,
        topic: &TopicName,
        name: &str,
        count: Option<u64>,
    ) -> Result<(), HookError> {
        let _ = (name, count);
        Err(no_broker(topic))
    }

    /// Resets subscription `name` (its consumers reconnect). Default: `NotFound`.
    async fn reset_cursor(
        &self,
        topic: &TopicName,
        name: &str,
        target: ResetTarget,
    ) -> Result<(), HookError> {
        let _ = (name, target);
        Err(no_broker(topic))
    }

    /// The `n`th (from 1) unacknowledged entry of subscription `name`. Default: `NotFound`.
    async fn peek_message(
        &self,
        topic: &TopicName,
        name: &str,
        n: u64,
    ) -> Result<AdminMessage, HookError> {
        let _ = (name, n);
        Err(no_broker(topic))
    }

    /// The `n`th (from 1) entry from the first or the last. Default: `NotFound`.
    async fn examine_message(
        &self,
        topic: &TopicName,
        from: ExaminePosition,
        n: u64,
    ) -> Result<AdminMessage, HookError> {
        let _ = (from, n);
        Err(no_broker(topic))
    }

    /// The entry at `ledger:entry`. Default: `NotFound`.
    async fn get_message(
        &self,
        topic: &TopicName,
        ledger: u64,
        entry: u64,
    ) -> Result<AdminMessage, HookError> {
        let _ = (ledger, entry);
        Err(no_broker(topic))
    }

    /// The last entry's `(ledger, entry)`; `(current ledger, -1)` without entries.
    /// Default: `NotFound`.
    async fn last_message_id(&self, topic: &TopicName) -> Result<(u64, i64), HookError> {
        Err(no_broker(topic))
    }

    /// The first entry published at or after `publish_time` (ms): `(ledger, entry)`, `None`
    /// when every entry is older. Default: `NotFound`.
    async fn message_id_by_publish_time(
        &self,
        topic: &TopicName,
        publish_time: u64,
    ) -> Result<Option<(u64, u64)>, HookError> {
        let _ = publish_time;
        Err(no_broker(topic))
    }

    /// Starts compacting the topic in the background (`PUT …/compaction`); `Conflict` while a
    /// run is under way. Default: unavailable.
    async fn compact_topic(&self, topic: &TopicName) -> Result<(), HookError> {
        Err(HookError::Unavailable(format!("no broker to compact {topic}")))
    }

    /// The last compaction run's status (`NOT_RUN`, `RUNNING`, `SUCCESS`, `ERROR`) and its
    /// error (`GET …/compaction`). Default: unavailable.
    async fn compaction_status(&self, topic: &TopicName) -> Result<(String, String), HookError> {
        Err(HookError::Unavailable(format!("no broker to compact {topic}")))
    }

    /// Unloads the topic if loaded (clients reconnect). Default: no-op.
    async fn unload_topic(&self, topic: &TopicName) -> Result<(), HookError> {
        let _ = topic;
        Ok(())
    }

    /// Terminates the topic; returns its last entry's `(ledger, entry)` (`(current, -1)`
    /// without entries). Default: `NotFound`.
    async fn terminate_topic(&self, topic: &TopicName) -> Result<(u64, i64), HookError> {
        Err(no_broker(topic))
    }

    /// Expires (acknowledges) the messages of `topic` (a non-partitioned topic or a partition)
    /// published more than `expire_time_seconds` ago, on `subscription` or, for `None`, on
    /// every durable subscription (`…/expireMessages/{s}`, `…/all_subscription/…`). Default:
    /// unavailable.
    async fn expire_messages(
        &self,
        topic: &TopicName,
        subscription: Option<&str>,
        expire_time_seconds: u64,
    ) -> Result<(), HookError> {
        let _ = (subscription, expire_time_seconds);
        Err(HookError::Unavailable(format!("no broker to expire messages of {topic}")))
    }

    /// Expires the messages of `subscription` up to and including entry
    /// `(ledger_id, entry_id)`, or up to just before it when `excluded` (`POST
    /// …/expireMessages` with a message id). Default: unavailable.
    async fn expire_messages_through(
        &self,
        topic: &TopicName,
        subscription: &str,
        ledger_id: u64,
        entry_id: u64,
        excluded: bool,
    ) -> Result<(), HookError> {
        let _ = (subscription, ledger_id, entry_id, excluded);
        Err(HookError::Unavailable(format!("no broker to expire messages of {topic}")))
    }

    /// Liveness check behind `GET /admin/v2/brokers/health`. Default: healthy.
    async fn health_check(&self) -> Result<(), HookError> {
        Ok(())
    }

    /// Readiness behind `GET /admin/v2/brokers/ready`: `Ok` when ready, otherwise the reason
    /// (`Unavailable`: 503, e.g. while the broker's metadata session is lost). Default: ready.
    async fn ready(&self) -> Result<(), HookError> {
        Ok(())
    }

    /// The exposition served at `GET /metrics`, in `format`, as parts sent one after the other
    /// (`Exposition::finish_parts`). Default: empty.
    async fn metrics(&self, format: magnetar_metrics::Format) -> Vec<String> {
        let _ = format;
        Vec::new()
    }

    /// The recent history the web console charts (`GET /console/api/history`): the broker's
    /// totals, or for `Some(topic)` that topic's series (no points when none is kept).
    /// Default: no points (no sampler).
    fn history(&self, topic: Option<&TopicName>) -> HistoryView {
        HistoryView { topic: topic.map(|t| t.to_string()), ..HistoryView::default() }
    }
}

/// Hooks of an admin API without a broker (tests of the router alone): no topics of its own
/// (delete finds none: 404), create refused with 503, always healthy.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopHooks;

#[async_trait]
impl BrokerHooks for NoopHooks {
    async fn create_topic(&self, topic: &TopicName) -> Result<(), HookError> {
        Err(HookError::Unavailable(format!("no broker to create {topic}")))
    }

    async fn delete_topic(&self, topic: &TopicName, _force: bool) -> Result<(), HookError> {
        Err(HookError::NotFound(format!("Topic {topic} not found")))
    }
}
