//! One range read across the replicas of its entries (BookKeeper's `PendingReadOp`): a core
//! that decides whom to ask, driven by `ReplicatedLedgers::read_range` with the answers and
//! a clock reading (an offset from the read's start, so the core is tested without time).
//!
//! * Each entry is asked of one replica first, a different one per entry
//!   (`(entry + attempt) % replicas`) to spread the load.
//! * After an error, a "no entry" or a failed connection, of the next replica; the entry is
//!   absent (`NoSuchEntry`) only when every replica said so, and unavailable when the others
//!   failed (a failed replica may hold the only copy left; readers skip an absent entry).
//! * An entry whose replica has answered nothing in this read for `speculative` since it was
//!   asked is asked of the next replica too (a speculative read); the first copy wins. A
//!   replica that keeps answering other entries is busy, not gone: its entries wait for it,
//!   as BookKeeper's "heard from" rule has it, so a loaded node's queue is not copied onto the
//!   others. (Counting silence per replica, not per read, is what keeps a fast replica's
//!   answers from hiding a silent one.)
//! * With no entry found for `timeout`, the read fails (`Unavailable`): replicas that are
//!   frozen or cut off but whose connections stay open get an error, not a wait for ever.

use bytes::Bytes;
use magnetar_ledger::LedgerError;
use magnetar_replication::message::Response;
use magnetar_replication::meta::LedgerMeta;
use magnetar_replication::{EntryId, LedgerId, NodeId};
use std::collections::BTreeMap;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReadTimes {
    /// A replica silent this long since an entry was asked of it: ask the next one too.
    pub speculative: Duration,
    /// No entry found for this long: the read fails.
    pub timeout: Duration,
}

/// Ask entry `first + index` of `node`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ask {
    pub index: usize,
    pub node: NodeId,
}

#[derive(Debug)]
struct EntryRead {
    found: Option<Bytes>,
    /// Replicas asked so far (in ensemble order from the entry's first).
    asked: usize,
    /// Replicas that said they have no such entry.
    said_no: usize,
    /// Replicas that failed instead (an error answer, a failed connection).
    failed: usize,
    /// The replica asked last, and when.
    asked_of: NodeId,
    asked_at: Duration,
}

#[derive(Debug)]
pub(crate) struct RangeRead {
    ledger: LedgerId,
    meta: LedgerMeta,
    first: EntryId,
    times: ReadTimes,
    entries: Vec<EntryRead>,
    remaining: usize,
    /// When each replica last answered anything in this read.
    heard: BTreeMap<NodeId, Duration>,
    last_found: Duration,
    failed: Option<LedgerError>,
    /// The outcome was taken: later answers and ticks change nothing.
    over: bool,
    /// Entries asked of another replica after an error or a "no entry" / after silence.
    pub retries: u64,
    pub speculative: u64,
    /// The read failed for want of any entry within `timeout` (not for failed replicas).
    pub timed_out: bool,
}

impl RangeRead {
    /// The read of `first..=last` of `ledger` at time zero; pushes the first asks.
    pub fn new(
        ledger: LedgerId,
        meta: LedgerMeta,
        first: EntryId,
        last: EntryId,
        times: ReadTimes,
        asks: &mut Vec<Ask>,
    ) -> RangeRead {
        assert!(first <= last, "an empty range is answered before any read");
        assert!(times.speculative < times.timeout, "validated with the configuration");
        let count = (last - first + 1) as usize;
        let mut entries = Vec::with_capacity(count);
        for index in 0..count {
            let node = Self::replica(&meta, first + index as u64, 0);
            entries.push(EntryRead {
                found: None,
                asked: 1,
                said_no: 0,
                failed: 0,
                asked_of: node,
                asked_at: Duration::ZERO,
            });
            asks.push(Ask { index, node });
        }
        RangeRead {
            ledger,
            meta,
            first,
            times,
            entries,
            remaining: count,
            heard: BTreeMap::new(),
            last_found: Duration::ZERO,
            failed: None,
            over: false,
            retries: 0,
            speculative: 0,
            timed_out: false,
        }
    }

    fn replica(meta: &LedgerMeta, entry: EntryId, attempt: usize) -> NodeId {
        let ensemble = meta.ensemble_for(entry);
        ensemble[(entry as usize + attempt) % ensemble.len()]
    }

    fn replicas(&self, index: usize) -> usize {
        self.meta.ensemble_for(self.first + index as u64).len()
    }

    fn ask_next(&mut self, index: usize, now: Duration, asks: &mut Vec<Ask>) {
        let read = &mut self.entries[index];
        let node = Self::replica(&self.meta, self.first + index as u64, read.asked);
        read.asked += 1;
        read.asked_of = node;
        read.asked_at = now;
        asks.push(Ask { index, node });
    }

    /// `node`'s answer for entry `first + index` (`None`: its connection failed first).
    pub fn on_reply(
        &mut self,
        index: usize,
        node: NodeId,
        response: Option<Response>,
        now: Duration,
        asks: &mut Vec<Ask>,
    ) {
        if response.is_some() {
            self.heard.insert(node, now);
        }
        if self.is_over() || self.entries[index].found.is_some() {
            return;
        }
        if let Some(Response::Entry { data, .. }) = response {
            self.entries[index].found = Some(data);
            self.remaining -= 1;
            self.last_found = now;
            return;
        }
        // No entry there, an error, or the node failed: the next replica.
        let replicas = self.replicas(index);
        let read = &mut self.entries[index];
        match response {
            Some(Response::NoEntry { .. }) => read.said_no += 1,
            _ => read.failed += 1,
        }
        if read.asked < replicas {
            self.retries += 1;
            self.ask_next(index, now, asks);
        } else if read.said_no + read.failed == replicas {
            let entry = self.first + index as u64;
            // Absent only if every replica says so: a failed one may hold the only copy left,
            // and a reader told "no such entry" skips it (a redelivery does).
            self.failed = Some(match read.failed {
                0 => LedgerError::NoSuchEntry { ledger: self.ledger, entry },
                failed => LedgerError::Unavailable(format!(
                    "ledger {}: entry {entry} not read: {failed} of its {replicas} replicas \
                     failed, the others have no such entry",
                    self.ledger
                )),
            });
        }
    }

    /// Asks again what silent replicas hold; fails the read after `timeout` without progress.
    pub fn on_tick(&mut self, now: Duration, asks: &mut Vec<Ask>) {
        if self.is_over() {
            return;
        }
        if now.saturating_sub(self.last_found) >= self.times.timeout {
            let missing: Vec<EntryId> = (0..self.entries.len())
                .filter(|&i| self.entries[i].found.is_none())
                .map(|i| self.first + i as u64)
                .collect();
            let asked: std::collections::BTreeSet<u64> =
                self.entries.iter().filter(|e| e.found.is_none()).map(|e| e.asked_of.0).collect();
            self.timed_out = true;
            self.failed = Some(LedgerError::Unavailable(format!(
                "ledger {}: {} entries ({}..={}) not read: no replica answered with them for {} \
                 ms (last asked of nodes {asked:?})",
                self.ledger,
                missing.len(),
                missing[0],
                missing[missing.len() - 1],
                self.times.timeout.as_millis(),
            )));
            return;
        }
        for index in 0..self.entries.len() {
            let read = &self.entries[index];
            if read.found.is_some() || read.asked >= self.replicas(index) {
                continue;
            }
            let heard = self.heard.get(&read.asked_of).copied().unwrap_or(Duration::ZERO);
            if now.saturating_sub(read.asked_at.max(heard)) >= self.times.speculative {
                self.speculative += 1;
                self.ask_next(index, now, asks);
            }
        }
    }

    fn is_over(&self) -> bool {
        self.over || self.remaining == 0 || self.failed.is_some()
    }

    /// The entries, once all are found, or why the read failed; `None` while it goes on.
    pub fn outcome(&mut self) -> Option<Result<Vec<Bytes>, LedgerError>> {
        if self.over {
            return None;
        }
        if let Some(error) = self.failed.take() {
            self.over = true;
            return Some(Err(error));
        }
        if self.remaining > 0 {
            return None;
        }
        self.over = true;
        let entries = std::mem::take(&mut self.entries);
        Some(Ok(entries.into_iter().map(|e| e.found.expect("every entry found")).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMES: ReadTimes =
        ReadTimes { speculative: Duration::from_millis(200), timeout: Duration::from_secs(5) };

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn entry(n: EntryId) -> Option<Response> {
        Some(Response::Entry { ledger: 1, entry: n, lac: None, data: Bytes::from(vec![n as u8]) })
    }

    /// Entries 0..4 over nodes 1 and 2 (Qw = Qa = 2): even entries asked of 1, odd of 2.
    fn four_entries(asks: &mut Vec<Ask>) -> RangeRead {
        let meta = LedgerMeta::new(vec![NodeId(1), NodeId(2)], 2, 2);
        RangeRead::new(1, meta, 0, 3, TIMES, asks)
    }

    /// [`four_entries`] with its first asks sent (taken out of the buffer).
    fn four_entries_asked() -> (RangeRead, Vec<Ask>) {
        let mut asks = Vec::new();
        let read = four_entries(&mut asks);
        asks.clear();
        (read, asks)
    }

    fn nodes(asks: &[Ask]) -> Vec<(usize, u64)> {
        asks.iter().map(|a| (a.index, a.node.0)).collect()
    }

    #[test]
    fn each_entry_is_asked_of_one_replica_spread_over_the_ensemble() {
        let mut asks = Vec::new();
        let mut read = four_entries(&mut asks);
        assert_eq!(nodes(&asks), [(0, 1), (1, 2), (2, 1), (3, 2)]);
        asks.clear();
        for (i, node) in [(0, 1), (1, 2), (2, 1)] {
            read.on_reply(i, NodeId(node), entry(i as u64), ms(1), &mut asks);
            assert!(read.outcome().is_none());
        }
        read.on_reply(3, NodeId(2), entry(3), ms(2), &mut asks);
        let got = read.outcome().expect("done").unwrap();
        assert_eq!(got, (0..4u8).map(|n| Bytes::from(vec![n])).collect::<Vec<_>>());
        assert!(asks.is_empty());
        assert_eq!((read.retries, read.speculative), (0, 0));
    }

    #[test]
    fn a_silent_replica_s_entries_go_to_the_next_while_the_other_s_answers_keep_coming() {
        let (mut read, mut asks) = four_entries_asked();
        // Node 2 answers entry 1 at 150 ms; node 1 says nothing.
        read.on_reply(1, NodeId(2), entry(1), ms(150), &mut asks);
        read.on_tick(ms(199), &mut asks);
        assert!(asks.is_empty(), "not yet {} ms of silence", 199);
        // At 200 ms node 1 has been silent since it was asked: its entries go to node 2, even
        // though node 2 answered 50 ms ago (a per-read timer would have waited on).
        read.on_tick(ms(200), &mut asks);
        assert_eq!(nodes(&asks), [(0, 2), (2, 2)]);
        assert_eq!(read.speculative, 2);
        asks.clear();
        // Entries 0 and 2 have been asked of both; entry 3's replica, node 2, has said nothing
        // since 150 ms (it is silent about 0 and 2 too): at 450 ms entry 3 goes to node 1.
        read.on_tick(ms(450), &mut asks);
        assert_eq!(nodes(&asks), [(3, 1)]);
        asks.clear();
        read.on_reply(0, NodeId(2), entry(0), ms(460), &mut asks);
        read.on_reply(2, NodeId(2), entry(2), ms(460), &mut asks);
        read.on_reply(3, NodeId(2), entry(3), ms(460), &mut asks);
        assert_eq!(read.outcome().expect("done").unwrap().len(), 4);
        // The late copy from node 1 changes nothing.
        read.on_reply(0, NodeId(1), entry(0), ms(470), &mut asks);
        assert!(asks.is_empty());
    }

    #[test]
    fn a_replica_that_keeps_answering_is_waited_for() {
        let (mut read, mut asks) = four_entries_asked();
        // Node 1 answers entry 0 at 150 ms, node 2 answers entry 1 at 150 ms: at 300 ms
        // neither has been silent for 200 ms, so entries 2 and 3 are not asked again.
        read.on_reply(0, NodeId(1), entry(0), ms(150), &mut asks);
        read.on_reply(1, NodeId(2), entry(1), ms(150), &mut asks);
        read.on_tick(ms(300), &mut asks);
        assert!(asks.is_empty(), "{asks:?}");
        read.on_tick(ms(350), &mut asks);
        assert_eq!(nodes(&asks), [(2, 2), (3, 1)]);
    }

    fn no_entry(n: EntryId) -> Option<Response> {
        Some(Response::NoEntry { ledger: 1, entry: n, lac: None })
    }

    #[test]
    fn an_entry_every_replica_says_it_lacks_is_absent() {
        let (mut read, mut asks) = four_entries_asked();
        read.on_reply(3, NodeId(2), no_entry(3), ms(3), &mut asks);
        assert_eq!(nodes(&asks), [(3, 1)], "a no goes to the next replica");
        assert!(read.outcome().is_none());
        read.on_reply(3, NodeId(1), no_entry(3), ms(4), &mut asks);
        let result = read.outcome().expect("over");
        assert!(
            matches!(result, Err(LedgerError::NoSuchEntry { ledger: 1, entry: 3 })),
            "{result:?}"
        );
    }

    #[test]
    fn an_entry_is_unavailable_not_absent_when_a_replica_failed() {
        let (mut read, mut asks) = four_entries_asked();
        read.on_reply(0, NodeId(1), None, ms(1), &mut asks);
        assert_eq!(nodes(&asks), [(0, 2)], "a failure goes to the next replica");
        assert_eq!(read.retries, 1);
        read.on_reply(0, NodeId(2), no_entry(0), ms(2), &mut asks);
        match read.outcome() {
            Some(Err(LedgerError::Unavailable(why))) => {
                assert!(
                    why.contains("entry 0") && why.contains("1 of its 2 replicas failed"),
                    "{why}"
                );
                assert!(!read.timed_out, "failed replicas, not a time-out");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn no_entry_for_the_timeout_fails_the_read_with_the_nodes_asked() {
        let (mut read, mut asks) = four_entries_asked();
        read.on_reply(0, NodeId(1), entry(0), ms(10), &mut asks);
        read.on_tick(ms(300), &mut asks);
        assert_eq!(asks.len(), 3, "the silent entries asked of the other replica");
        read.on_tick(ms(5_009), &mut asks);
        assert!(read.outcome().is_none(), "5 s after the last entry found, not after the start");
        read.on_tick(ms(5_010), &mut asks);
        match read.outcome() {
            Some(Err(LedgerError::Unavailable(why))) => {
                assert!(why.contains("3 entries (1..=3)") && why.contains("5000 ms"), "{why}");
                assert!(read.timed_out);
            }
            other => panic!("{other:?}"),
        }
        // Answers and ticks after the failure change nothing.
        asks.clear();
        read.on_reply(1, NodeId(2), None, ms(5_020), &mut asks);
        read.on_tick(ms(5_300), &mut asks);
        assert!(asks.is_empty() && read.outcome().is_none());
    }
}
