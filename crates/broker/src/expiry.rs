//! Message expiry (TTL), as Pulsar's `PersistentMessageExpiryMonitor`: every message published
//! more than the topic's `message_ttl_seconds` ago is acknowledged on every durable
//! subscription (the mark-delete moves forward, persisted through the subscription's cursor like
//! a cumulative ack). A periodic pass over the loaded topics does it (`run`), and the admin API
//! asks for it on demand (`expire_by_time`, `expire_through`).
//!
//! Finding the boundary reads little: a closed ledger whose close time is older than the TTL
//! expires whole without being read; otherwise a binary search over publish times
//! (`ManagedLedger::first_published_at_or_after`) reads about log2(entries) entries.

use crate::cursor::{LedgerList, Position};
use crate::error::BrokerError;
use crate::managed_ledger::{ClosedLedger, ManagedLedger};
use crate::service::BrokerService;
use crate::subscription::{previous_position, Subscription};
use crate::topic::Topic;
use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

/// The last entry of the newest closed ledger closed before `cutoff_ms`: everything up to it
/// was published before the cutoff (a ledger's entries are older than its close).
pub fn whole_ledgers_expired(
    ledgers: &LedgerList,
    closed: &BTreeMap<u64, ClosedLedger>,
    cutoff_ms: u64,
) -> Option<Position> {
    ledgers
        .iter()
        .filter(|extent| extent.entry_count > 0)
        .filter(|extent| {
            closed
                .get(&extent.ledger_id)
                .is_some_and(|c| c.closed_at_ms > 0 && c.closed_at_ms < cutoff_ms)
        })
        .last()
        .map(|extent| Position::new(extent.ledger_id, extent.entry_count - 1))
}

/// Where the mark-delete goes when `first_kept` is the first entry not expired (`None`: every
/// entry up to `last_confirmed` expired). `None`: nothing expires.
pub fn expired_through(
    ledgers: &LedgerList,
    first_kept: Option<Position>,
    last_confirmed: Option<Position>,
) -> Option<Position> {
    match first_kept {
        Some(kept) => previous_position(ledgers, kept),
        None => last_confirmed,
    }
}

/// The last entry published before `cutoff_ms` (ms since the epoch). Blocks on disk reads.
pub fn expiry_position(
    managed_ledger: &ManagedLedger,
    cutoff_ms: u64,
) -> Result<Option<Position>, BrokerError> {
    let ledgers = managed_ledger.ledgers();
    let last_confirmed = managed_ledger.last_confirmed();
    let whole = whole_ledgers_expired(&ledgers, &managed_ledger.closed_ledgers(), cutoff_ms);
    if whole.is_some() && whole == last_confirmed {
        return Ok(whole);
    }
    let first_kept = managed_ledger.first_published_at_or_after(cutoff_ms)?;
    Ok(expired_through(&ledgers, first_kept, last_confirmed).max(whole))
}

/// The last entry older than `ttl_ms` now, found on a blocking thread.
async fn position_older_than(topic: &Topic, ttl_ms: u64) -> Result<Option<Position>, BrokerError> {
    let managed_ledger = topic.managed_ledger.clone();
    let cutoff = managed_ledger.clock().now_ms().saturating_sub(ttl_ms);
    tokio::task::spawn_blocking(move || expiry_position(&managed_ledger, cutoff))
        .await
        .map_err(|_| BrokerError::ShuttingDown)?
}

/// The durable subscriptions `subscription` names (`None`: all of them).
fn durable_subscriptions(
    topic: &Topic,
    subscription: Option<&str>,
) -> Result<Vec<Arc<Subscription>>, BrokerError> {
    let all = topic.subscriptions();
    match subscription {
        None => Ok(all.into_iter().filter(|s| s.durable).collect()),
        Some(name) => match all.into_iter().find(|s| s.name == name) {
            Some(found) => Ok(vec![found]),
            None => Err(BrokerError::no_subscription(name)),
        },
    }
}

/// Expires messages older than `ttl_ms` on `subscription` (`None`: every durable one). Returns
/// the number of subscriptions whose mark-delete moved.
pub async fn expire_by_time(
    topic: &Topic,
    subscription: Option<&str>,
    ttl_ms: u64,
) -> Result<usize, BrokerError> {
    let subscriptions = durable_subscriptions(topic, subscription)?;
    if subscriptions.is_empty() {
        return Ok(0);
    }
    let Some(through) = position_older_than(topic, ttl_ms).await? else { return Ok(0) };
    Ok(subscriptions.iter().filter(|s| s.expire_through(through)).count())
}

/// Expires everything up to and including `through` on `subscription` (Pulsar's
/// expire-by-position), bounded by the last entry. Returns whether the mark-delete moved.
pub fn expire_through(
    topic: &Topic,
    subscription: &str,
    through: Position,
) -> Result<bool, BrokerError> {
    let subscriptions = durable_subscriptions(topic, Some(subscription))?;
    let Some(last) = topic.managed_ledger.last_confirmed() else { return Ok(false) };
    let through = through.min(last);
    Ok(subscriptions.iter().any(|s| s.expire_through(through)))
}

/// The periodic pass: every `message_expiry_check_interval_seconds`, each loaded topic with a
/// TTL has its expired messages acknowledged. Ends with the service or at `shutdown`.
pub async fn run(service: Weak<BrokerService>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let interval = match service.upgrade() {
        Some(service) => service.config.message_expiry_check_interval(),
        None => return,
    };
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.changed() => return,
        }
        let Some(service) = service.upgrade() else { return };
        for topic in service.loaded_topics() {
            let ttl = topic.policies().message_ttl_seconds;
            if ttl == 0 || topic.is_deleted() || topic.is_fenced() {
                continue;
            }
            match expire_by_time(&topic, None, u64::from(ttl) * 1000).await {
                Ok(0) => {}
                Ok(moved) => {
                    tracing::debug!(topic = %topic.full_name, subscriptions = moved, "messages expired")
                }
                Err(error) => {
                    tracing::warn!(topic = %topic.full_name, %error, "message expiry failed")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> LedgerList {
        [(1, 3), (2, 0), (3, 2), (5, 4)].into_iter().collect()
    }

    fn closed(at: &[(u64, u64)]) -> BTreeMap<u64, ClosedLedger> {
        at.iter()
            .map(|&(id, closed_at_ms)| (id, ClosedLedger { entries: 0, size: 0, closed_at_ms }))
            .collect()
    }

    #[test]
    fn closed_ledgers_older_than_the_ttl_expire_whole() {
        let ledgers = layout();
        let closed = closed(&[(1, 1_000), (2, 1_500), (3, 2_000)]);
        assert_eq!(whole_ledgers_expired(&ledgers, &closed, 1_000), None, "closed at the cutoff");
        assert_eq!(whole_ledgers_expired(&ledgers, &closed, 1_001), Some(Position::new(1, 2)));
        // The empty ledger 2 is skipped; ledger 3 ends at entry 1.
        assert_eq!(whole_ledgers_expired(&ledgers, &closed, 5_000), Some(Position::new(3, 1)));
        // An unknown close time (0) never counts.
        let unknown = super::tests::closed(&[(1, 0)]);
        assert_eq!(whole_ledgers_expired(&ledgers, &unknown, 5_000), None);
    }

    #[test]
    fn everything_before_the_first_kept_entry_expires() {
        let ledgers = layout();
        let last = Some(Position::new(5, 3));
        assert_eq!(expired_through(&ledgers, None, last), last, "all expired");
        assert_eq!(expired_through(&ledgers, Some(Position::new(1, 0)), last), None, "none");
        assert_eq!(
            expired_through(&ledgers, Some(Position::new(5, 0)), last),
            Some(Position::new(3, 1)),
            "back across the gap"
        );
        assert_eq!(
            expired_through(&ledgers, Some(Position::new(3, 1)), last),
            Some(Position::new(3, 0))
        );
    }
}
