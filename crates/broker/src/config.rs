//! Broker configuration: every knob, its default and why.

use magnetar_model::policy::{InactiveTopicDeleteMode, InactiveTopicPolicies};
use serde::Deserialize;
use std::time::Duration;

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BrokerConfig {
    /// Address the binary protocol listens on. Default loopback: standalone is for one machine.
    pub bind_address: String,
    /// Binary protocol port (Pulsar's default 6650).
    pub broker_port: u16,
    /// Host clients are told to connect to in LOOKUP answers.
    pub advertised_address: String,
    /// Largest message (metadata plus payload) accepted, as in Pulsar (5 MiB default). Frames may
    /// be 10 KiB larger for the command around it.
    pub max_message_size: usize,
    /// Seconds of silence after which we ping a client; twice that and the connection closes.
    pub keepalive_seconds: u64,
    /// Create topics on first use, as Pulsar standalone does.
    pub allow_auto_topic_creation: bool,
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
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            bind_address: "127.0.0.1".into(),
            broker_port: 6650,
            advertised_address: "127.0.0.1".into(),
            max_message_size: 5 * 1024 * 1024,
            keepalive_seconds: 30,
            allow_auto_topic_creation: true,
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
            default_retention_time_minutes: 0,
            default_retention_size_mb: 0,
            retention_check_interval_seconds: 10,
            retention_max_deletes_per_pass: 100,
            max_ledger_rollover_minutes: 240,
            delete_inactive_topics_enabled: false,
            delete_inactive_topics_mode: InactiveTopicDeleteMode::DeleteWhenNoSubscriptions,
            delete_inactive_topics_frequency_seconds: 60,
            delete_inactive_topics_max_inactive_duration_seconds: 60,
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
        if self.delete_inactive_topics_frequency_seconds == 0
            || self.delete_inactive_topics_max_inactive_duration_seconds < 0
        {
            return Err("delete_inactive_topics_frequency_seconds must be positive and the max \
                 inactive duration not negative"
                .into());
        }
        Ok(())
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
            ..Default::default()
        }
    }

    pub fn keepalive(&self) -> Duration {
        Duration::from_secs(self.keepalive_seconds)
    }

    pub fn service_url(&self) -> String {
        format!("pulsar://{}:{}", self.advertised_address, self.broker_port)
    }
}
