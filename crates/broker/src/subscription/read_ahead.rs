//! Reading a catching-up subscription's next entries while its consumers work through the
//! current ones.
//!
//! Without it a backlog drain waits on the disk once per FLOW: the consumer asks for more, the
//! dispatcher reads, then sends. With it the read for the next FLOW is already done (or under
//! way) when that FLOW arrives. Owned by the subscription's dispatcher task, so no locking.
//!
//! Memory: at most one span of the size the last round asked for (the consumers' permits turned
//! into entries), plus what was read and not yet asked for; dropped on a seek or a close.

use crate::cursor::{next_position, LedgerList, Position};
use crate::error::BrokerError;
use crate::managed_ledger::ManagedLedger;
use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::Arc;
use tokio::task::JoinHandle;

type Entries = Vec<(Position, Bytes)>;

#[derive(Default)]
pub(super) struct ReadAhead {
    /// Entries read before they were asked for, consecutive.
    ready: VecDeque<(Position, Bytes)>,
    /// A read of the entries right after `ready`, from the given position.
    in_flight: Option<(Position, JoinHandle<Result<Entries, BrokerError>>)>,
}

impl ReadAhead {
    /// Up to `count` entries from `from` on, if they were read ahead (waiting for a read still
    /// in flight). `None` when nothing read ahead starts at `from` (what was is dropped).
    pub async fn take(
        &mut self,
        from: Position,
        count: usize,
    ) -> Option<Result<Entries, BrokerError>> {
        let starts_here = match (self.ready.front(), &self.in_flight) {
            (Some((first, _)), _) => *first == from,
            (None, Some((start, _))) => *start == from,
            (None, None) => false,
        };
        if !starts_here {
            self.clear();
            return None;
        }
        if self.ready.len() < count {
            if let Some((_, read)) = self.in_flight.take() {
                match read.await {
                    Ok(Ok(entries)) => self.ready.extend(entries),
                    Ok(Err(error)) => {
                        self.clear();
                        return Some(Err(error));
                    }
                    Err(_) => return Some(Err(BrokerError::ShuttingDown)),
                }
            }
        }
        if self.ready.is_empty() {
            return None;
        }
        let count = count.min(self.ready.len());
        Some(Ok(self.ready.drain(..count).collect()))
    }

    /// Starts reading the `count` entries after `last` (or after what is ready), unless a read
    /// is in flight, enough is ready, or they are still in the write cache (a tailing reader
    /// needs no read-ahead). `ledgers` is the round's snapshot: a ledger that appeared since
    /// is found next round.
    pub fn start(
        &mut self,
        managed_ledger: &Arc<ManagedLedger>,
        ledgers: &LedgerList,
        last: Position,
        count: usize,
    ) {
        if self.in_flight.is_some() || self.ready.len() >= count {
            return;
        }
        let after = self.ready.back().map_or(last, |(position, _)| *position);
        let Some(next) = next_position(ledgers, Some(after)) else {
            return;
        };
        if managed_ledger.read_cached(next, 1).is_some() {
            return;
        }
        let managed_ledger = managed_ledger.clone();
        let read = tokio::task::spawn_blocking(move || managed_ledger.read_from(next, count));
        self.in_flight = Some((next, read));
    }

    /// Drops everything read ahead (a read in flight finishes on its own and is discarded).
    pub fn clear(&mut self) {
        self.ready.clear();
        self.in_flight = None;
    }
}
