//! Which of a topic's ledgers may go: the retention decision, pure (no I/O, no clock).
//!
//! Pulsar's `ManagedLedgerImpl.internalTrimLedgers`, restated: walking the closed ledgers from
//! the oldest, a ledger may be deleted while
//! - every subscription has consumed it (its mark-delete position is at or past the ledger's
//!   last entry; a topic with no subscription has consumed everything), and
//! - the retention policy no longer covers it: its age (since it was closed) is over the
//!   retention time, or the topic without it still holds at least the retention size. `-1`
//!   (unlimited) never expires / is never over; `0` always is. (Pulsar deletes a ledger while
//!   the topic is over the size *before* deleting it, so a big ledger can take the topic far
//!   below its retention size; here what the size covers always stays readable.)
//!
//! The walk stops at the first ledger that must stay, so what is kept is always a suffix of
//! the topic: a reader starting at "earliest" sees the retained messages without holes. The
//! ledger being written is never deleted (it is not in the list given here).

use crate::cursor::Position;

/// A closed ledger as retention sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClosedLedgerFacts {
    pub id: u64,
    pub entries: u64,
    /// Bytes of entry data.
    pub size: u64,
    /// When it was closed (ms since the epoch; 0 = unknown, counts as long ago).
    pub closed_at_ms: u64,
}

/// How far every subscription has consumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Consumed {
    /// No subscription: everything counts as consumed (retention alone decides).
    Everything,
    /// The slowest subscription's mark-delete position; `None`: it has consumed nothing.
    UpTo(Option<Position>),
}

impl Consumed {
    /// The slowest of several subscriptions' mark-delete positions.
    pub fn slowest(mark_deletes: impl IntoIterator<Item = Option<Position>>) -> Consumed {
        let mut slowest = Consumed::Everything;
        for position in mark_deletes {
            slowest = match slowest {
                Consumed::Everything => Consumed::UpTo(position),
                Consumed::UpTo(current) => Consumed::UpTo(match (current, position) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    _ => None,
                }),
            };
        }
        slowest
    }

    fn covers(self, ledger: &ClosedLedgerFacts) -> bool {
        match self {
            Consumed::Everything => true,
            Consumed::UpTo(None) => false,
            Consumed::UpTo(Some(md)) => {
                ledger.id < md.ledger_id
                    || (ledger.id == md.ledger_id
                        && md.entry_id.saturating_add(1) >= ledger.entries)
            }
        }
    }
}

/// The retention limits in the units the decision uses (`None` = unlimited).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionLimits {
    pub time_ms: Option<u64>,
    pub size_bytes: Option<u64>,
}

/// The ledgers to delete now, oldest first, at most `max`. `closed` lists the closed ledgers
/// oldest first; `total_size` is the topic's whole size (closed ledgers and the current one).
pub fn ledgers_to_delete(
    closed: &[ClosedLedgerFacts],
    total_size: u64,
    consumed: Consumed,
    limits: RetentionLimits,
    now_ms: u64,
    max: usize,
) -> Vec<u64> {
    let mut doomed = Vec::new();
    let mut size_deleted = 0u64;
    for ledger in closed {
        if doomed.len() >= max || !consumed.covers(ledger) {
            break;
        }
        let expired = limits.time_ms.is_some_and(|keep| {
            // An unknown close time counts as long ago.
            now_ms.saturating_sub(ledger.closed_at_ms) > keep
                || (keep == 0 && ledger.closed_at_ms <= now_ms)
        });
        let over_size = limits.size_bytes.is_some_and(|keep| {
            total_size.saturating_sub(size_deleted).saturating_sub(ledger.size) >= keep
        });
        if !(expired || over_size) {
            break;
        }
        size_deleted += ledger.size;
        doomed.push(ledger.id);
    }
    doomed
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 10_000_000;

    /// Ledgers 1..=n, 10 entries and 100 bytes each, closed 1 minute apart ending a minute ago.
    fn ledgers(n: u64) -> Vec<ClosedLedgerFacts> {
        (1..=n)
            .map(|id| ClosedLedgerFacts {
                id,
                entries: 10,
                size: 100,
                closed_at_ms: NOW - (n + 1 - id) * 60_000,
            })
            .collect()
    }

    const NONE: RetentionLimits = RetentionLimits { time_ms: Some(0), size_bytes: Some(0) };
    const INFINITE: RetentionLimits = RetentionLimits { time_ms: None, size_bytes: None };

    fn at(ledger: u64, entry: u64) -> Option<Position> {
        Some(Position::new(ledger, entry))
    }

    #[test]
    fn without_retention_consumed_ledgers_go_and_the_slowest_subscription_holds_the_rest() {
        let closed = ledgers(5);
        let consumed = Consumed::slowest([at(4, 2), at(3, 9)]);
        assert_eq!(ledgers_to_delete(&closed, 600, consumed, NONE, NOW, 100), vec![1, 2, 3]);
        // Mid-ledger: the ledger stays.
        let consumed = Consumed::slowest([at(3, 8)]);
        assert_eq!(ledgers_to_delete(&closed, 600, consumed, NONE, NOW, 100), vec![1, 2]);
        // A subscription that consumed nothing holds everything.
        let consumed = Consumed::slowest([at(5, 9), None]);
        assert!(ledgers_to_delete(&closed, 600, consumed, NONE, NOW, 100).is_empty());
        // The work of one pass is bounded.
        let all = Consumed::Everything;
        assert_eq!(ledgers_to_delete(&closed, 600, all, NONE, NOW, 2), vec![1, 2]);
    }

    #[test]
    fn retention_time_keeps_ledgers_closed_within_it() {
        let closed = ledgers(5); // closed 5, 4, 3, 2 and 1 minutes ago
        let limits = RetentionLimits { time_ms: Some(150_000), size_bytes: Some(0) };
        // Size 0 is always over: with a size limit of 0 the time limit does not keep anything.
        assert_eq!(
            ledgers_to_delete(&closed, 600, Consumed::Everything, limits, NOW, 100).len(),
            5
        );
        let limits = RetentionLimits { time_ms: Some(150_000), size_bytes: None };
        assert_eq!(
            ledgers_to_delete(&closed, 600, Consumed::Everything, limits, NOW, 100),
            vec![1, 2, 3]
        );
    }

    #[test]
    fn retention_size_keeps_the_newest_ledgers_within_it() {
        let closed = ledgers(5);
        let limits = RetentionLimits { time_ms: None, size_bytes: Some(250) };
        // Total 600 (current ledger 100): delete while at least 250 remain without the ledger.
        assert_eq!(
            ledgers_to_delete(&closed, 600, Consumed::Everything, limits, NOW, 100),
            vec![1, 2, 3]
        );
        let limits = RetentionLimits { time_ms: None, size_bytes: Some(300) };
        assert_eq!(
            ledgers_to_delete(&closed, 600, Consumed::Everything, limits, NOW, 100),
            vec![1, 2, 3]
        );
    }

    #[test]
    fn infinite_retention_keeps_everything_and_unconsumed_data_is_never_deleted() {
        let closed = ledgers(5);
        assert!(
            ledgers_to_delete(&closed, 600, Consumed::Everything, INFINITE, NOW, 100).is_empty()
        );
        let limits = RetentionLimits { time_ms: Some(0), size_bytes: Some(0) };
        assert!(ledgers_to_delete(&closed, 600, Consumed::UpTo(None), limits, NOW, 100).is_empty());
    }

    #[test]
    fn an_unknown_close_time_counts_as_old() {
        let mut closed = ledgers(2);
        closed[0].closed_at_ms = 0;
        let limits = RetentionLimits { time_ms: Some(3_600_000), size_bytes: None };
        assert_eq!(
            ledgers_to_delete(&closed, 300, Consumed::Everything, limits, NOW, 100),
            vec![1]
        );
    }
}
