//! Two brokers on one metadata store: policies written through one (here: straight into the
//! store, as its admin API does) reach the topics loaded on the other through
//! `policy_watch::follow_policy_changes`, without a new producer or consumer there.

use magnetar_broker::policy_watch::follow_policy_changes;
use magnetar_broker::{BrokerConfig, BrokerService};
use magnetar_journal::sim::SimStorage;
use magnetar_ledger::{LedgerStore, LedgerStoreConfig};
use magnetar_metadata::{ExpectedVersion, MemoryStore, MetadataStore};
use magnetar_model::keys;
use std::sync::Arc;
use std::time::Duration;

/// Polls `done` every few milliseconds until it holds, for at most five seconds (no event
/// tells when a refresh has been applied).
async fn eventually(what: &str, done: impl Fn() -> bool) {
    let waited = tokio::time::timeout(Duration::from_secs(5), async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "not applied within 5 s: {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loaded_topics_follow_policies_changed_elsewhere() {
    let metadata: Arc<dyn MetadataStore> = Arc::new(MemoryStore::new());
    let storage = Arc::new(
        LedgerStore::open_with_storage(LedgerStoreConfig::default(), Arc::new(SimStorage::new(1)))
            .unwrap()
            .0,
    );
    let broker = BrokerService::new(BrokerConfig::default(), storage, metadata.clone());
    let persistent = BrokerService::topic_name("persistent://public/default/watched").unwrap();
    let partition =
        BrokerService::topic_name("persistent://public/default/parted-partition-1").unwrap();
    let volatile = BrokerService::topic_name("non-persistent://public/default/watched").unwrap();
    let topic = broker.topic(&persistent, true).await.unwrap();
    let part = broker.topic(&partition, true).await.unwrap();
    let (np, _) = broker.non_persistent_topic_with_policies(&volatile, true).await.unwrap();
    assert_eq!(topic.policies().message_ttl_seconds, 0);
    assert!(!np.exceeds_max_message_size(2_000));

    let watch = tokio::spawn(follow_policy_changes(broker.clone()));
    let put = |key: String, value: &'static str| {
        let metadata = metadata.clone();
        async move { metadata.put(&key, value.into(), ExpectedVersion::Any).await.unwrap() }
    };

    // The namespace's document: every topic of the namespace, both domains.
    let namespace = persistent.namespace().clone();
    put(keys::namespace_key(&namespace), r#"{"message_ttl_in_seconds":60}"#).await;
    eventually("namespace TTL on the topic", || topic.policies().message_ttl_seconds == 60).await;
    eventually("namespace TTL on the partition", || part.policies().message_ttl_seconds == 60)
        .await;

    // A topic's own document: that topic only; a partitioned topic's reaches its partitions.
    put(keys::topic_policies_key(&persistent), r#"{"maxMessageSize":1000}"#).await;
    eventually("topic size limit", || topic.policies().max_message_size == 1000).await;
    put(keys::topic_policies_key(&partition.partitioned_topic()), r#"{"messageTTLInSeconds":7}"#)
        .await;
    eventually("partitioned topic's TTL", || part.policies().message_ttl_seconds == 7).await;
    assert_eq!(topic.policies().message_ttl_seconds, 60, "another topic's document");
    assert_ne!(part.policies().max_message_size, 1000, "another topic's document");
    put(keys::topic_policies_key(&volatile), r#"{"maxMessageSize":1000}"#).await;
    eventually("non-persistent size limit", || np.exceeds_max_message_size(2_000)).await;

    // Removed: back to the namespace's and the broker's values.
    metadata.delete(&keys::topic_policies_key(&persistent), ExpectedVersion::Any).await.unwrap();
    let default_size = BrokerConfig::default().policy_defaults().max_message_size;
    eventually("topic document removed", || topic.policies().max_message_size == default_size)
        .await;
    assert_eq!(topic.policies().message_ttl_seconds, 60);

    // The dynamic configuration (another broker's `brokers update-dynamic-config`): the policy
    // defaults under every loaded topic; a value that does not parse is left out.
    assert!(topic.policies().allow_auto_subscription_creation);
    put(
        keys::DYNAMIC_CONFIGURATION.to_string(),
        r#"{"allowAutoSubscriptionCreation":"false","allowAutoTopicCreation":"maybe"}"#,
    )
    .await;
    eventually("dynamic allowAutoSubscriptionCreation", || {
        !topic.policies().allow_auto_subscription_creation
            && !part.policies().allow_auto_subscription_creation
    })
    .await;
    assert!(broker.allow_auto_topic_creation(), "an unparsable value is left out");
    metadata.delete(keys::DYNAMIC_CONFIGURATION, ExpectedVersion::Any).await.unwrap();
    eventually("dynamic configuration removed", || {
        topic.policies().allow_auto_subscription_creation
    })
    .await;
    watch.abort();
}
