//! Broker configuration: every knob, its default and why.

use magnetar_model::dynamic_config::DynamicValues;
use magnetar_model::policy::{InactiveTopicDeleteMode, InactiveTopicPolicies};
use serde::Deserialize;
use std::time::Duration;

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BrokerConfig {
    /// Authorization (the server's `[authorization]` section, copied here by the server; not a
    /// `[broker]` key).
    #[serde(skip)]
    pub authorization: magnetar_security::authorization::AuthorizationConfig,
    /// How new ledgers are stored (the server's `[ledgers]` section, copied here by the
    /// server; not a `[broker]` key). One local copy by default.
    #[serde(skip, default = "magnetar_ledger::LedgerMetadata::local")]
    pub persistence: magnetar_ledger::LedgerMetadata,
    /// Whether namespace and topic `persistence` policies pick a topic's quorums (ledgers on
    /// storage nodes; set by the server with `persistence`).
    #[serde(skip)]
    pub persistence_policies: bool,
    /// Address the binary protocol listens on. Default loopback: standalone is for one machine.
    pub bind_address: String,
    /// Binary protocol port (Pulsar's default 6650).
    pub broker_port: u16,
    /// Host clients are told to connect to in LOOKUP answers.
    pub advertised_address: String,
    /// Pulsar's `advertisedListeners`: `name:pulsar://host:port` (and `name:pulsar+ssl://…`)
    /// entries, comma-separated; a client naming a listener (`listenerName`) is sent that
    /// listener's URL, one naming none the internal listener's. Empty: none.
    pub advertised_listeners: String,
    /// Pulsar's `internalListenerName` (empty: the first listener of `advertised_listeners`).
    pub internal_listener_name: String,
    /// Largest message (metadata plus payload) accepted, as in Pulsar (5 MiB default). Frames may
    /// be 10 KiB larger for the command around it.
    pub max_message_size: usize,
    /// Seconds of silence after which we ping a client; twice that and the connection closes.
    pub keepalive_seconds: u64,
    /// Create topics on first use, as Pulsar standalone does.
    pub allow_auto_topic_creation: bool,
    /// Bundles of a namespace created without `--bundles` (`public/default` included), 1..=128
    /// (Pulsar's `defaultNumberOfNamespaceBundles`). In a cluster a bundle is what a broker owns,
    /// so this is how many brokers a namespace's topics spread over before any split.
    pub default_number_of_namespace_bundles: u32,
    /// A topic's ledger is rolled over after this many entries (Pulsar: 50,000)...
    pub max_entries_per_ledger: u64,
    /// ...or this many bytes (Pulsar: 2 GiB)...
    pub max_bytes_per_ledger: u64,
    /// ...or this many seconds after it was opened, checked at the next append (Pulsar: 4 h).
    pub max_ledger_age_seconds: u64,
    /// A durable subscription's cursor ledger (its acknowledgement states, one per persist) is
    /// rolled over after this many entries (Pulsar's `managedLedgerCursorMaxEntriesPerLedger`,
    /// 50,000)...
    pub cursor_max_entries_per_ledger: u64,
    /// ...or this many bytes (a big ack-hole state costs up to 1 MiB per entry).
    pub cursor_max_bytes_per_ledger: u64,
    /// Most entries read and sent per dispatch round of a subscription.
    pub dispatch_batch_entries: usize,
    /// Producer deduplication where neither the topic nor its namespace sets it (Pulsar's
    /// `brokerDeduplicationEnabled`, default off).
    pub broker_deduplication_enabled: bool,
    /// Failover subscriptions: milliseconds a newly chosen active consumer waits before it is
    /// sent anything, so the previous one's in-flight acks land first and fewer messages are
    /// delivered twice (Pulsar's `activeConsumerFailoverDelayTimeMillis`, 1,000).
    pub active_consumer_failover_delay_ms: u64,
    /// Key_Shared AUTO_SPLIT: consistent hashing (true, Pulsar's default) or halving the largest
    /// hash range for each joining consumer (false) (Pulsar's
    /// `subscriptionKeySharedUseConsistentHashing`).
    pub key_shared_use_consistent_hashing: bool,
    /// The cluster this broker serves (picks the per-cluster rates of namespace policies; the
    /// server sets it from its own `cluster`, so it is not read from the file).
    #[serde(skip)]
    pub cluster_name: String,
    /// The authentication providers (built by the server from its `[authentication]` section,
    /// not read from this one). None: authentication is off and CONNECT is not checked.
    #[serde(skip)]
    pub authenticator: Option<std::sync::Arc<magnetar_security::authentication::Authenticator>>,
    /// Retention where neither the topic nor its namespace sets one: minutes and megabytes of
    /// consumed data kept, `-1` = unlimited (Pulsar's `defaultRetentionTimeInMinutes` and
    /// `defaultRetentionSizeInMB`, both 0: a ledger goes once every subscription is past it).
    pub default_retention_time_minutes: i32,
    pub default_retention_size_mb: i64,
    /// Seconds between retention passes over the loaded topics (Pulsar's
    /// `retentionCheckIntervalInSeconds`, 120; ours is shorter because a pass is cheap: it reads
    /// memory and deletes at most `retention_max_deletes_per_pass` ledgers per topic).
    pub retention_check_interval_seconds: u64,
    /// Most ledgers one topic deletes per retention pass (bounds the work of a pass).
    pub retention_max_deletes_per_pass: usize,
    /// Seconds between checks of the topics' `compactionThreshold` (Pulsar's
    /// `brokerServiceCompactionMonitorIntervalInSeconds`, 60). Checked at retention passes, so
    /// rounded up to a multiple of `retention_check_interval_seconds`.
    pub compaction_check_interval_seconds: u64,
    /// A ledger that has data is rolled over this many minutes after it was opened even when
    /// no append comes, so that an idle topic's data can be trimmed (Pulsar's
    /// `managedLedgerMaxLedgerRolloverTimeMinutes`, 240). 0: never (only at an append).
    pub max_ledger_rollover_minutes: u64,
    /// Delete topics that stay inactive (Pulsar's `brokerDeleteInactiveTopicsEnabled`). Pulsar
    /// defaults to true; Magnetar to false, because deleting a topic that still holds
    /// unconsumed messages after a minute without clients surprises users. A namespace turns
    /// it on with `inactive-topic-policies`.
    pub delete_inactive_topics_enabled: bool,
    /// `delete_when_no_subscriptions` (Pulsar's default) or
    /// `delete_when_subscriptions_caught_up` (`brokerDeleteInactiveTopicsMode`).
    pub delete_inactive_topics_mode: InactiveTopicDeleteMode,
    /// Seconds between inactive-topic checks (`brokerDeleteInactiveTopicsFrequencySeconds`, 60).
    pub delete_inactive_topics_frequency_seconds: u64,
    /// Seconds without producers and consumers before a topic counts as inactive
    /// (`brokerDeleteInactiveTopicsMaxInactiveDurationSeconds`, 60).
    pub delete_inactive_topics_max_inactive_duration_seconds: i32,
    /// Message time to live where neither the topic nor its namespace sets one, in seconds
    /// (Pulsar's `ttlDurationDefaultInSeconds`, 0: messages never expire).
    pub ttl_duration_default_seconds: u32,
    /// Seconds between two passes that expire messages older than their topic's TTL (Pulsar's
    /// `messageExpiryCheckIntervalInMinutes`, 5 minutes = 300 s).
    pub message_expiry_check_interval_seconds: u64,
    /// Backlog quota where neither the topic nor its namespace sets one: bytes of the slowest
    /// subscription's backlog (Pulsar's `backlogQuotaDefaultLimitBytes`, -1: none)...
    pub backlog_quota_default_limit_bytes: i64,
    /// ...and age in seconds of its oldest unacknowledged message (Pulsar's
    /// `backlogQuotaDefaultLimitSecond`, -1: none)...
    pub backlog_quota_default_limit_seconds: i32,
    /// ...and what happens when one is exceeded: `producer_request_hold` (Pulsar's default),
    /// `producer_exception` or `consumer_backlog_eviction` (Pulsar's
    /// `backlogQuotaDefaultRetentionPolicy`).
    pub backlog_quota_default_retention_policy: String,
    /// Seconds between two backlog quota checks of the loaded topics (Pulsar's
    /// `backlogQuotaCheckIntervalInSeconds`, 60). Producers are also checked when they connect.
    pub backlog_quota_check_interval_seconds: u64,
    /// A Shared or Key_Shared consumer with this many unacknowledged messages is sent nothing
    /// more until it is back to half (Pulsar's `maxUnackedMessagesPerConsumer`, 50,000; 0: no
    /// limit).
    pub max_unacked_messages_per_consumer: u32,
    /// The same for a whole Shared or Key_Shared subscription (Pulsar's
    /// `maxUnackedMessagesPerSubscription`, 200,000; 0: no limit).
    pub max_unacked_messages_per_subscription: u32,
    /// Producers one topic accepts (Pulsar's `maxProducersPerTopic`, 0: no limit).
    pub max_producers_per_topic: u32,
    /// Consumers one topic accepts, all subscriptions together (Pulsar's
    /// `maxConsumersPerTopic`, 0: no limit).
    pub max_consumers_per_topic: u32,
    /// Consumers one subscription accepts (Pulsar's `maxConsumersPerSubscription`, 0: no limit).
    pub max_consumers_per_subscription: u32,
    /// Subscriptions one topic accepts (Pulsar's `maxSubscriptionsPerTopic`, 0: no limit).
    pub max_subscriptions_per_topic: u32,
    /// Topics this broker loads at once (Pulsar's `maxConcurrentTopicLoadRequest`); more wait
    /// their turn. A broker taking over thousands of topics would otherwise send every load's
    /// metadata reads at once, and the metadata store answers none in time.
    pub max_concurrent_topic_loads: usize,
    /// A consumer may create its durable subscription by subscribing (Pulsar's
    /// `allowAutoSubscriptionCreation`, true); readers always may.
    pub allow_auto_subscription_creation: bool,
    /// Messages with a delivery time wait for it on Shared and Key_Shared subscriptions (Pulsar's
    /// `delayedDeliveryEnabled`, true); off, they are delivered at once.
    pub delayed_delivery_enabled: bool,
    /// Messages and bytes a topic dispatches per second, all subscriptions together (Pulsar's
    /// `dispatchThrottlingRatePerTopicInMsg` / `InByte`, 0: no limit).
    pub dispatch_throttling_rate_per_topic_in_msg: u32,
    pub dispatch_throttling_rate_per_topic_in_byte: u64,
    /// Messages and bytes one subscription dispatches per second (Pulsar's
    /// `dispatchThrottlingRatePerSubscriptionInMsg` / `InByte`, 0: no limit).
    pub dispatch_throttling_rate_per_subscription_in_msg: u32,
    pub dispatch_throttling_rate_per_subscription_in_byte: u64,
    /// Messages and bytes per second a topic accepts from its producers; past it the broker
    /// stops reading from the producers' connections until the rate allows more, as Pulsar
    /// (`maxPublishRatePerTopicInMessages` / `InBytes`, 0: no limit).
    pub max_publish_rate_per_topic_in_messages: u32,
    pub max_publish_rate_per_topic_in_bytes: u64,
    /// `GET /metrics` has one series per topic (and subscription); false: per namespace
    /// (Pulsar's `exposeTopicLevelMetricsInPrometheus`, true).
    pub expose_topic_level_metrics_in_prometheus: bool,
    /// A partition's series name its partitioned topic in `topic` and the index in
    /// `partition` (Pulsar's `splitTopicAndPartitionLabelInPrometheus`, false).
    pub split_topic_and_partition_label_in_prometheus: bool,
    /// With topic-level metrics, also one series per consumer (`pulsar_consumer_*`, labels
    /// `consumer_name`, `consumer_id`) and per producer (`pulsar_producer_*`, labels
    /// `producer_name`, `producer_id`) (Pulsar's `exposeConsumerLevelMetricsInPrometheus` and
    /// `exposeProducerLevelMetricsInPrometheus`, both false).
    pub expose_consumer_level_metrics_in_prometheus: bool,
    pub expose_producer_level_metrics_in_prometheus: bool,
    /// Seconds the `pulsar_*_le_*` bucket gauges count over (Pulsar's
    /// `statsUpdateFrequencyInSecs`, 60).
    pub stats_update_frequency_seconds: u64,
    /// `pulsar+ssl://host:port` of the TLS listener, when `[tls]` is enabled (set by the
    /// server once the port is bound; not a `[broker]` key).
    #[serde(skip)]
    pub service_url_tls: Option<String>,
    /// The plain-text listener is open (false with `[tls] plain_ports_enabled = false`; set by
    /// the server; not a `[broker]` key).
    #[serde(skip)]
    pub plain_port_enabled: bool,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            authorization: Default::default(),
            persistence: magnetar_ledger::LedgerMetadata::local(),
            persistence_policies: false,
            bind_address: "127.0.0.1".into(),
            broker_port: 6650,
            advertised_address: "127.0.0.1".into(),
            advertised_listeners: String::new(),
            internal_listener_name: String::new(),
            max_message_size: 5 * 1024 * 1024,
            keepalive_seconds: 30,
            allow_auto_topic_creation: true,
            default_number_of_namespace_bundles: 4,
            max_entries_per_ledger: 50_000,
            max_bytes_per_ledger: 2 << 30,
            max_ledger_age_seconds: 4 * 3600,
            cursor_max_entries_per_ledger: 50_000,
            cursor_max_bytes_per_ledger: 64 << 20,
            dispatch_batch_entries: 100,
            broker_deduplication_enabled: false,
            active_consumer_failover_delay_ms: 1_000,
            key_shared_use_consistent_hashing: true,
            cluster_name: "standalone".into(),
            authenticator: None,
            default_retention_time_minutes: 0,
            default_retention_size_mb: 0,
            retention_check_interval_seconds: 10,
            retention_max_deletes_per_pass: 100,
            max_ledger_rollover_minutes: 240,
            compaction_check_interval_seconds: 60,
            delete_inactive_topics_enabled: false,
            delete_inactive_topics_mode: InactiveTopicDeleteMode::DeleteWhenNoSubscriptions,
            delete_inactive_topics_frequency_seconds: 60,
            delete_inactive_topics_max_inactive_duration_seconds: 60,
            ttl_duration_default_seconds: 0,
            message_expiry_check_interval_seconds: 300,
            backlog_quota_default_limit_bytes: -1,
            backlog_quota_default_limit_seconds: -1,
            backlog_quota_default_retention_policy: "producer_request_hold".into(),
            backlog_quota_check_interval_seconds: 60,
            max_unacked_messages_per_consumer: 50_000,
            max_unacked_messages_per_subscription: 200_000,
            max_producers_per_topic: 0,
            max_consumers_per_topic: 0,
            max_consumers_per_subscription: 0,
            max_subscriptions_per_topic: 0,
            max_concurrent_topic_loads: 64,
            allow_auto_subscription_creation: true,
            delayed_delivery_enabled: true,
            dispatch_throttling_rate_per_topic_in_msg: 0,
            dispatch_throttling_rate_per_topic_in_byte: 0,
            dispatch_throttling_rate_per_subscription_in_msg: 0,
            dispatch_throttling_rate_per_subscription_in_byte: 0,
            max_publish_rate_per_topic_in_messages: 0,
            max_publish_rate_per_topic_in_bytes: 0,
            expose_topic_level_metrics_in_prometheus: true,
            split_topic_and_partition_label_in_prometheus: false,
            expose_consumer_level_metrics_in_prometheus: false,
            expose_producer_level_metrics_in_prometheus: false,
            stats_update_frequency_seconds: 60,
            service_url_tls: None,
            plain_port_enabled: true,
        }
    }
}

impl BrokerConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.max_message_size < 1024 || self.max_message_size > 100 << 20 {
            return Err(format!(
                "max_message_size {} must be 1 KiB..100 MiB",
                self.max_message_size
            ));
        }
        if self.active_consumer_failover_delay_ms > 60_000 {
            return Err("active_consumer_failover_delay_ms must be at most 60000".into());
        }
        if self.stats_update_frequency_seconds == 0 {
            return Err("stats_update_frequency_seconds must be at least 1".into());
        }
        if !(1..=100_000).contains(&self.max_concurrent_topic_loads) {
            return Err("max_concurrent_topic_loads must be 1..=100000".into());
        }
        if !(1..=128).contains(&self.default_number_of_namespace_bundles) {
            return Err("default_number_of_namespace_bundles must be 1..=128".into());
        }
        if self.keepalive_seconds == 0 {
            return Err("keepalive_seconds must be at least 1".into());
        }
        if self.max_entries_per_ledger == 0
            || self.max_bytes_per_ledger == 0
            || self.max_ledger_age_seconds == 0
            || self.dispatch_batch_entries == 0
        {
            return Err("ledger rollover limits and dispatch_batch_entries must be positive".into());
        }
        if self.cursor_max_entries_per_ledger == 0 || self.cursor_max_bytes_per_ledger == 0 {
            return Err("cursor ledger rollover limits must be positive".into());
        }
        if self.default_retention_time_minutes < -1 || self.default_retention_size_mb < -1 {
            return Err("default retention time and size must be -1 (unlimited) or more".into());
        }
        if self.retention_check_interval_seconds == 0 || self.retention_max_deletes_per_pass == 0 {
            return Err(
                "retention_check_interval_seconds and retention_max_deletes_per_pass must be positive"
                    .into(),
            );
        }
        if self.compaction_check_interval_seconds == 0 {
            return Err("compaction_check_interval_seconds must be positive".into());
        }
        if self.delete_inactive_topics_frequency_seconds == 0
            || self.delete_inactive_topics_max_inactive_duration_seconds < 0
        {
            return Err("delete_inactive_topics_frequency_seconds must be positive and the max \
                 inactive duration not negative"
                .into());
        }
        if self.message_expiry_check_interval_seconds == 0
            || self.backlog_quota_check_interval_seconds == 0
        {
            return Err("message_expiry_check_interval_seconds and \
                 backlog_quota_check_interval_seconds must be positive"
                .into());
        }
        magnetar_model::listeners::AdvertisedListeners::parse(
            &self.advertised_listeners,
            &self.internal_listener_name,
        )?;
        if self.backlog_quota_policy().is_none() {
            return Err(format!(
                "backlog_quota_default_retention_policy {:?} must be producer_request_hold, \
                 producer_exception or consumer_backlog_eviction",
                self.backlog_quota_default_retention_policy
            ));
        }
        if self.backlog_quota_default_limit_bytes < -1
            || self.backlog_quota_default_limit_seconds < -1
        {
            return Err("backlog quota default limits must be -1 (none) or more".into());
        }
        Ok(())
    }

    fn backlog_quota_policy(&self) -> Option<magnetar_model::policy::BacklogQuotaPolicy> {
        serde_json::from_value(serde_json::Value::String(
            self.backlog_quota_default_retention_policy.clone(),
        ))
        .ok()
    }

    pub fn dispatch_settings(&self) -> crate::subscription::DispatchSettings {
        crate::subscription::DispatchSettings {
            batch_entries: self.dispatch_batch_entries,
            failover_delay_ms: self.active_consumer_failover_delay_ms,
            key_shared_consistent_hashing: self.key_shared_use_consistent_hashing,
        }
    }

    pub fn cursor_ledger_limits(&self) -> crate::cursor_ledger::CursorLedgerLimits {
        crate::cursor_ledger::CursorLedgerLimits {
            max_entries: self.cursor_max_entries_per_ledger,
            max_bytes: self.cursor_max_bytes_per_ledger,
        }
    }

    /// The broker-wide defaults policies fall back to.
    pub fn policy_defaults(&self) -> magnetar_model::policy::PolicyDefaults {
        self.policy_defaults_with(&DynamicValues::default())
    }

    /// The broker-wide defaults with the dynamic configuration's values over this file's.
    pub fn policy_defaults_with(
        &self,
        dynamic: &DynamicValues,
    ) -> magnetar_model::policy::PolicyDefaults {
        magnetar_model::policy::PolicyDefaults {
            retention: magnetar_model::policy::RetentionPolicies {
                retention_time_in_minutes: self.default_retention_time_minutes,
                retention_size_in_mb: self.default_retention_size_mb,
            },
            deduplication_enabled: self.broker_deduplication_enabled,
            max_message_size: u32::try_from(self.max_message_size).unwrap_or(u32::MAX),
            inactive_topic: Some(InactiveTopicPolicies {
                inactive_topic_delete_mode: self.delete_inactive_topics_mode,
                max_inactive_duration_seconds: self
                    .delete_inactive_topics_max_inactive_duration_seconds,
                delete_while_inactive: self.delete_inactive_topics_enabled,
            }),
            message_ttl_seconds: self.ttl_duration_default_seconds,
            backlog_quotas: self.default_backlog_quotas(),
            max_producers_per_topic: self.max_producers_per_topic,
            max_consumers_per_topic: self.max_consumers_per_topic,
            max_consumers_per_subscription: self.max_consumers_per_subscription,
            max_subscriptions_per_topic: self.max_subscriptions_per_topic,
            allow_auto_subscription_creation: dynamic
                .allow_auto_subscription_creation
                .unwrap_or(self.allow_auto_subscription_creation),
            delayed_delivery_enabled: self.delayed_delivery_enabled,
            max_unacked_messages_per_consumer: self.max_unacked_messages_per_consumer,
            max_unacked_messages_per_subscription: self.max_unacked_messages_per_subscription,
            dispatch_rate: dispatch_rate(
                dynamic
                    .dispatch_rate_per_topic_msg
                    .unwrap_or(self.dispatch_throttling_rate_per_topic_in_msg),
                dynamic
                    .dispatch_rate_per_topic_byte
                    .unwrap_or(self.dispatch_throttling_rate_per_topic_in_byte),
            ),
            subscription_dispatch_rate: dispatch_rate(
                dynamic
                    .dispatch_rate_per_subscription_msg
                    .unwrap_or(self.dispatch_throttling_rate_per_subscription_in_msg),
                dynamic
                    .dispatch_rate_per_subscription_byte
                    .unwrap_or(self.dispatch_throttling_rate_per_subscription_in_byte),
            ),
            publish_rate: {
                let messages = dynamic
                    .publish_rate_per_topic_messages
                    .unwrap_or(self.max_publish_rate_per_topic_in_messages);
                let bytes = dynamic
                    .publish_rate_per_topic_bytes
                    .unwrap_or(self.max_publish_rate_per_topic_in_bytes);
                (messages > 0 || bytes > 0).then(|| magnetar_model::policy::PublishRate {
                    publish_throttling_rate_in_msg: clamp_i32(messages),
                    publish_throttling_rate_in_byte: clamp_i64(bytes),
                })
            },
        }
    }

    /// The default backlog quotas (Pulsar's: one quota of each type, from the same policy).
    fn default_backlog_quotas(
        &self,
    ) -> std::collections::BTreeMap<
        magnetar_model::policy::BacklogQuotaType,
        magnetar_model::policy::BacklogQuota,
    > {
        use magnetar_model::policy::{BacklogQuota, BacklogQuotaType};
        let mut quotas = std::collections::BTreeMap::new();
        let Some(policy) = self.backlog_quota_policy() else { return quotas };
        if self.backlog_quota_default_limit_bytes > 0 {
            quotas.insert(
                BacklogQuotaType::DestinationStorage,
                BacklogQuota {
                    limit_size: self.backlog_quota_default_limit_bytes,
                    limit_time: -1,
                    policy,
                },
            );
        }
        if self.backlog_quota_default_limit_seconds > 0 {
            quotas.insert(
                BacklogQuotaType::MessageAge,
                BacklogQuota {
                    limit_size: -1,
                    limit_time: self.backlog_quota_default_limit_seconds,
                    policy,
                },
            );
        }
        quotas
    }

    pub fn message_expiry_check_interval(&self) -> Duration {
        Duration::from_secs(self.message_expiry_check_interval_seconds)
    }

    pub fn backlog_quota_check_interval(&self) -> Duration {
        Duration::from_secs(self.backlog_quota_check_interval_seconds)
    }

    pub fn keepalive(&self) -> Duration {
        Duration::from_secs(self.keepalive_seconds)
    }

    /// The advertised listeners (validated: none if they do not parse).
    pub fn listeners(&self) -> magnetar_model::listeners::AdvertisedListeners {
        magnetar_model::listeners::AdvertisedListeners::parse(
            &self.advertised_listeners,
            &self.internal_listener_name,
        )
        .unwrap_or_default()
    }

    /// The `pulsar://` URL clients are sent to (the TLS one when the plain port is off).
    pub fn service_url(&self) -> String {
        match (&self.service_url_tls, self.plain_port_enabled) {
            (Some(tls), false) => tls.clone(),
            _ => format!("pulsar://{}:{}", self.advertised_address, self.broker_port),
        }
    }
}

fn clamp_i32(value: u32) -> i32 {
    i32::try_from(value).unwrap_or(i32::MAX)
}

fn clamp_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// A broker default dispatch rate per second (`None` when both are 0: unlimited).
fn dispatch_rate(messages: u32, bytes: u64) -> Option<magnetar_model::policy::DispatchRate> {
    (messages > 0 || bytes > 0).then(|| magnetar_model::policy::DispatchRate {
        dispatch_throttling_rate_in_msg: clamp_i32(messages),
        dispatch_throttling_rate_in_byte: clamp_i64(bytes),
        relative_to_publish_rate: false,
        rate_period_in_second: 1,
    })
}
