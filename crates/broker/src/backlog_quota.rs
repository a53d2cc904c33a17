//! Backlog quotas, as Pulsar's `BacklogQuotaManager` and `PersistentTopic.isBacklogExceeded`:
//! the backlog of a topic is that of its slowest durable subscription, measured in bytes
//! (`destination_storage`, estimated from ledger sizes as Pulsar's `getEstimatedBacklogSize`)
//! and in age (`message_age`, the publish time of its oldest unacknowledged entry).
//!
//! Checked periodically over the loaded topics (`run`) and when a producer connects
//! (`producer_admission`). When exceeded:
//! - `producer_exception` / `producer_request_hold`: the topic's producers are disconnected
//!   (CLOSE_PRODUCER); their reconnection, like any new producer, is refused with
//!   `ProducerBlockedQuotaExceededException` (the client fails its pending sends) or
//!   `ProducerBlockedQuotaExceededError` (the client keeps retrying, its sends wait) until
//!   the backlog is back under the quota;
//! - `consumer_backlog_eviction`: the oldest backlog of the subscriptions over the quota is
//!   acknowledged away until they are at 90% of it (Pulsar's reduction factor).

use crate::cursor::{next_position, LedgerList, Position};
use crate::error::BrokerError;
use crate::service::BrokerService;
use crate::subscription::Subscription;
use crate::topic::Topic;
use magnetar_model::policy::{BacklogQuota, BacklogQuotaPolicy, BacklogQuotaType};
use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

/// Pulsar drops the backlog to this share of the quota when evicting.
const EVICTION_TARGET: f64 = 0.9;

/// The backlog of one subscription.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Estimated bytes not acknowledged.
    pub size_bytes: u64,
    /// Publish time (ms) of the oldest unacknowledged entry; `None`: no backlog or not asked.
    pub oldest_publish_ms: Option<u64>,
}

/// The first quota `usage` exceeds (size first, then age, as Pulsar checks them).
pub fn exceeded(
    quotas: &BTreeMap<BacklogQuotaType, BacklogQuota>,
    usage: &Usage,
    now_ms: u64,
) -> Option<(BacklogQuotaType, BacklogQuota)> {
    if let Some(quota) = quotas.get(&BacklogQuotaType::DestinationStorage) {
        if quota.limit_size > 0 && usage.size_bytes >= quota.limit_size as u64 {
            return Some((BacklogQuotaType::DestinationStorage, *quota));
        }
    }
    if let Some(quota) = quotas.get(&BacklogQuotaType::MessageAge) {
        let limit_ms = u64::try_from(quota.limit_time).unwrap_or(0).saturating_mul(1000);
        if limit_ms > 0
            && usage.oldest_publish_ms.is_some_and(|t| now_ms.saturating_sub(t) > limit_ms)
        {
            return Some((BacklogQuotaType::MessageAge, *quota));
        }
    }
    None
}

/// Estimated bytes after `mark_delete`: whole ledgers after its ledger, and its own ledger's
/// share of the entries left (ledgers of unknown size count nothing).
pub fn backlog_bytes(
    ledgers: &LedgerList,
    sizes: &BTreeMap<u64, u64>,
    mark_delete: Option<Position>,
) -> u64 {
    let mut total = 0u64;
    for extent in ledgers.iter().filter(|e| e.entry_count > 0) {
        let size = sizes.get(&extent.ledger_id).copied().unwrap_or(0);
        match mark_delete {
            Some(md) if extent.ledger_id < md.ledger_id => {}
            Some(md) if extent.ledger_id == md.ledger_id => {
                let left = extent.entry_count.saturating_sub(md.entry_id + 1);
                total +=
                    (u128::from(size) * u128::from(left) / u128::from(extent.entry_count)) as u64;
            }
            _ => total += size,
        }
    }
    total
}

/// Entries to acknowledge away so that `backlog_bytes` (of `backlog_entries` entries) comes
/// down to `target` bytes (Pulsar's skip factor). 0 when already there.
pub fn entries_to_evict(backlog_bytes: u64, backlog_entries: u64, target: u64) -> u64 {
    if backlog_bytes <= target || backlog_bytes == 0 {
        return 0;
    }
    let share = (backlog_bytes - target) as f64 / backlog_bytes as f64;
    ((share * backlog_entries as f64).ceil() as u64).clamp(1, backlog_entries)
}

/// The position `count` entries after `from` (`None`: before the first entry), or the last
/// entry when fewer exist.
pub fn advance(ledgers: &LedgerList, from: Option<Position>, count: u64) -> Option<Position> {
    let mut left = count;
    let mut at = from;
    for extent in ledgers.iter().filter(|e| e.entry_count > 0) {
        let first = match at {
            Some(p) if p.ledger_id > extent.ledger_id => continue,
            Some(p) if p.ledger_id == extent.ledger_id => p.entry_id + 1,
            _ => 0,
        };
        let available = extent.entry_count.saturating_sub(first);
        if available == 0 {
            continue;
        }
        if left <= available {
            return if left == 0 {
                at
            } else {
                Some(Position::new(extent.ledger_id, first + left - 1))
            };
        }
        left -= available;
        at = Some(Position::new(extent.ledger_id, extent.entry_count - 1));
    }
    at
}

/// Ledger sizes: closed ledgers as recorded, the current one as appended so far.
fn ledger_sizes(topic: &Topic) -> BTreeMap<u64, u64> {
    let managed_ledger = &topic.managed_ledger;
    let mut sizes: BTreeMap<u64, u64> =
        managed_ledger.closed_ledgers().into_iter().map(|(id, c)| (id, c.size)).collect();
    let (current, size) = managed_ledger.current_ledger_size();
    sizes.insert(current, size);
    sizes
}

/// The slowest durable subscription and its backlog (`read_age`: also read the publish time
/// of its oldest unacknowledged entry).
async fn slowest(
    topic: &Topic,
    read_age: bool,
) -> Result<Option<(Arc<Subscription>, Usage)>, BrokerError> {
    let Some(slowest) = topic.subscriptions().into_iter().filter(|s| s.durable).min_by_key(|s| {
        s.mark_delete().map_or((0, 0), |p| (p.ledger_id, p.entry_id.saturating_add(1)))
    }) else {
        return Ok(None);
    };
    let ledgers = topic.managed_ledger.ledgers();
    let mark_delete = slowest.mark_delete();
    let size_bytes = backlog_bytes(&ledgers, &ledger_sizes(topic), mark_delete);
    let mut usage = Usage { size_bytes, oldest_publish_ms: None };
    if read_age {
        if let Some(oldest) = next_position(&ledgers, mark_delete) {
            let managed_ledger = topic.managed_ledger.clone();
            let entries =
                tokio::task::spawn_blocking(move || managed_ledger.read_positions(&[oldest]))
                    .await
                    .map_err(|_| BrokerError::ShuttingDown)??;
            usage.oldest_publish_ms = entries.first().and_then(|(_, data)| {
                magnetar_protocol::parse_metadata_and_payload(data)
                    .ok()
                    .map(|(metadata, _)| metadata.publish_time)
            });
        }
    }
    Ok(Some((slowest, usage)))
}

/// The quota the topic exceeds now, if any.
pub async fn check(topic: &Topic) -> Result<Option<(BacklogQuotaType, BacklogQuota)>, BrokerError> {
    let policies = topic.policies();
    if policies.backlog_quotas.is_empty() {
        return Ok(None);
    }
    let read_age = policies.backlog_quotas.contains_key(&BacklogQuotaType::MessageAge);
    let Some((_, usage)) = slowest(topic, read_age).await? else { return Ok(None) };
    Ok(exceeded(&policies.backlog_quotas, &usage, topic.managed_ledger.clock().now_ms()))
}

/// PRODUCER: refused while a producer policy's quota is exceeded (Pulsar's `handleProducer`).
pub async fn producer_admission(topic: &Topic) -> Result<(), BrokerError> {
    let why = "Cannot create producer on topic with backlog quota exceeded";
    match check(topic).await? {
        Some((_, quota)) => match quota.policy {
            BacklogQuotaPolicy::ProducerRequestHold => {
                Err(BrokerError::ProducerBlockedQuotaExceededError(why.into()))
            }
            BacklogQuotaPolicy::ProducerException => {
                Err(BrokerError::ProducerBlockedQuotaExceededException(why.into()))
            }
            BacklogQuotaPolicy::ConsumerBacklogEviction => Ok(()),
        },
        None => Ok(()),
    }
}

/// Checks the topic and applies the policy of an exceeded quota. Returns the quota exceeded.
pub async fn enforce(topic: &Arc<Topic>) -> Result<Option<BacklogQuotaType>, BrokerError> {
    let Some((kind, quota)) = check(topic).await? else { return Ok(None) };
    tracing::debug!(topic = %topic.full_name, ?kind, policy = ?quota.policy, "backlog quota exceeded");
    match quota.policy {
        BacklogQuotaPolicy::ProducerException | BacklogQuotaPolicy::ProducerRequestHold => {
            if topic.producer_count() > 0 {
                tracing::info!(topic = %topic.full_name, ?kind, policy = ?quota.policy,
                    "backlog quota exceeded: disconnecting producers");
                // In a task of its own: it waits for the sends in flight to be answered
                // (bounded), which must not hold up this pass over the other topics.
                let topic = topic.clone();
                tokio::spawn(async move { topic.disconnect_producers().await });
            }
        }
        BacklogQuotaPolicy::ConsumerBacklogEviction => match kind {
            BacklogQuotaType::DestinationStorage => {
                let target = (quota.limit_size as f64 * EVICTION_TARGET) as u64;
                let ledgers = topic.managed_ledger.ledgers();
                let sizes = ledger_sizes(topic);
                for subscription in topic.subscriptions().into_iter().filter(|s| s.durable) {
                    let mark_delete = subscription.mark_delete();
                    let bytes = backlog_bytes(&ledgers, &sizes, mark_delete);
                    let entries = subscription.backlog_entries();
                    let evict = entries_to_evict(bytes, entries, target);
                    if let Some(through) =
                        advance(&ledgers, mark_delete, evict).filter(|_| evict > 0)
                    {
                        subscription.expire_through(through);
                    }
                }
            }
            BacklogQuotaType::MessageAge => {
                let age_ms = (f64::from(quota.limit_time) * 1000.0 * EVICTION_TARGET) as u64;
                crate::expiry::expire_by_time(topic, None, age_ms).await?;
            }
        },
    }
    Ok(Some(kind))
}

/// The periodic check: every `backlog_quota_check_interval_seconds`, each loaded topic with a
/// backlog quota. Ends with the service or at `shutdown`.
pub async fn run(service: Weak<BrokerService>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let interval = match service.upgrade() {
        Some(service) => service.config.backlog_quota_check_interval(),
        None => return,
    };
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.changed() => return,
        }
        let Some(service) = service.upgrade() else { return };
        for topic in service.loaded_topics() {
            if topic.is_deleted() || topic.is_fenced() {
                continue;
            }
            if let Err(error) = enforce(&topic).await {
                tracing::warn!(topic = %topic.full_name, %error, "backlog quota check failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quotas(
        size: i64,
        time: i32,
        policy: BacklogQuotaPolicy,
    ) -> BTreeMap<BacklogQuotaType, BacklogQuota> {
        let mut quotas = BTreeMap::new();
        if size > 0 {
            quotas.insert(
                BacklogQuotaType::DestinationStorage,
                BacklogQuota { limit_size: size, limit_time: -1, policy },
            );
        }
        if time > 0 {
            quotas.insert(
                BacklogQuotaType::MessageAge,
                BacklogQuota { limit_size: -1, limit_time: time, policy },
            );
        }
        quotas
    }

    #[test]
    fn size_and_age_quotas() {
        let hold = BacklogQuotaPolicy::ProducerRequestHold;
        let q = quotas(1_000, 10, hold);
        let now = 100_000;
        let under = Usage { size_bytes: 999, oldest_publish_ms: Some(now - 10_000) };
        assert_eq!(exceeded(&q, &under, now), None);
        let big = Usage { size_bytes: 1_000, ..under };
        assert_eq!(
            exceeded(&q, &big, now).map(|(k, _)| k),
            Some(BacklogQuotaType::DestinationStorage)
        );
        let old = Usage { oldest_publish_ms: Some(now - 10_001), ..under };
        assert_eq!(exceeded(&q, &old, now).map(|(k, _)| k), Some(BacklogQuotaType::MessageAge));
        let none = Usage { size_bytes: u64::MAX, oldest_publish_ms: Some(0) };
        assert_eq!(exceeded(&quotas(-1, -1, hold), &none, now), None, "-1: no quota");
    }

    #[test]
    fn backlog_bytes_are_estimated_from_ledger_sizes() {
        let ledgers: LedgerList = [(1, 10), (2, 0), (3, 4)].into_iter().collect();
        let sizes: BTreeMap<u64, u64> = [(1, 1_000), (3, 400)].into_iter().collect();
        assert_eq!(backlog_bytes(&ledgers, &sizes, None), 1_400);
        assert_eq!(backlog_bytes(&ledgers, &sizes, Some(Position::new(1, 4))), 500 + 400);
        assert_eq!(backlog_bytes(&ledgers, &sizes, Some(Position::new(3, 1))), 200);
        assert_eq!(backlog_bytes(&ledgers, &sizes, Some(Position::new(3, 3))), 0);
    }

    #[test]
    fn eviction_skips_the_oldest_entries_down_to_the_target() {
        assert_eq!(entries_to_evict(1_000, 10, 900), 1);
        assert_eq!(entries_to_evict(2_000, 20, 900), 11);
        assert_eq!(entries_to_evict(800, 10, 900), 0);
        let ledgers: LedgerList = [(1, 3), (2, 0), (3, 4)].into_iter().collect();
        assert_eq!(advance(&ledgers, None, 1), Some(Position::new(1, 0)));
        assert_eq!(advance(&ledgers, None, 4), Some(Position::new(3, 0)));
        assert_eq!(advance(&ledgers, Some(Position::new(1, 1)), 2), Some(Position::new(3, 0)));
        assert_eq!(advance(&ledgers, Some(Position::new(1, 1)), 99), Some(Position::new(3, 3)));
        assert_eq!(advance(&ledgers, Some(Position::new(3, 1)), 0), Some(Position::new(3, 1)));
    }
}
