//! The delayed-delivery index of a subscription, pure (no I/O, no clock: callers pass `now`).
//!
//! Two tiers keep memory bounded whatever the number of delayed messages:
//! - an exact tier, `(deliver_at, position)` in time order, of at most `exact_capacity` entries,
//!   holding the earliest deadlines;
//! - coarse buckets: per time slot (`bucket_ms` wide) only the span of ledger positions holding
//!   its messages and a count. At most `max_buckets` exist; beyond that the two latest merge.
//!
//! When the exact tier is full, the latest deadline moves into its bucket. A bucket is
//! re-read (a "pass") when its slot comes within `window_ms` of now and the exact tier has room,
//! or when its whole slot is already due: the dispatcher reads the bucket's position span from
//! the ledger (`rescan`) and hands back each entry's `deliver_at`; entries whose time falls in
//! the slot (and whose `(deliver_at, position)` is at or above the bucket's `floor`) are the
//! bucket's messages. A pass offers them to the exact tier, which keeps the earliest; due ones
//! go out directly. If some did not fit, the bucket stays with its floor raised to the smallest
//! key left out, so the next pass (once the exact tier has room again) continues in time order.
//! A re-read may meet a message twice (it may also sit in the exact tier or be delivered
//! already); the dispatcher skips entries that are acknowledged or pending, so a duplicate costs
//! a lookup, never a second delivery.
//!
//! Bound: `exact_capacity * ~40 B + max_buckets * ~80 B`, independent of the message count.

use crate::cursor::Position;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Clone, Copy)]
pub struct DelayConfig {
    pub exact_capacity: usize,
    pub bucket_ms: u64,
    pub max_buckets: usize,
    pub window_ms: u64,
}

impl Default for DelayConfig {
    fn default() -> Self {
        DelayConfig {
            exact_capacity: 50_000,
            bucket_ms: 60_000,
            max_buckets: 4_096,
            window_ms: 60_000,
        }
    }
}

type Key = (u64, Position);

#[derive(Debug, Clone)]
struct Bucket {
    /// Exclusive end of the time slot (start is the map key).
    end_ms: u64,
    first: Position,
    last: Position,
    count: u64,
    /// Keys below this were handed to the exact tier by an earlier pass (None: no pass yet).
    floor: Option<Key>,
    /// The current pass: where its next read starts (the position and whether it is included;
    /// a position read up to is excluded, the next one may not exist yet). None: no pass.
    scan_from: Option<(Position, bool)>,
    /// The smallest key the current pass could not keep.
    left_out: Option<Key>,
}

impl Bucket {
    fn behind_scan(&self, position: Position) -> bool {
        self.scan_from
            .is_some_and(|(at, inclusive)| position < at || (position == at && !inclusive))
    }

    fn effective_start(&self, start: u64) -> u64 {
        self.floor.map_or(start, |(at, _)| at.max(start))
    }
}

fn min_key(a: Option<Key>, b: Key) -> Option<Key> {
    Some(a.map_or(b, |a| a.min(b)))
}

/// A re-read the dispatcher should do: entries from `from` (included or not) up to and
/// including `last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rescan {
    pub bucket: u64,
    pub from: Position,
    pub inclusive: bool,
    pub last: Position,
}

#[derive(Debug, Default)]
pub struct DelayTracker {
    config: DelayConfig,
    exact: BTreeSet<(u64, Position)>,
    buckets: BTreeMap<u64, Bucket>,
}

impl DelayTracker {
    pub fn new(config: DelayConfig) -> Self {
        DelayTracker { config, exact: BTreeSet::new(), buckets: BTreeMap::new() }
    }

    /// Messages tracked (exact ones plus the bucket counts; a count may include duplicates).
    pub fn len(&self) -> u64 {
        self.exact.len() as u64 + self.buckets.values().map(|b| b.count).sum::<u64>()
    }

    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.buckets.is_empty()
    }

    pub fn exact_len(&self) -> usize {
        self.exact.len()
    }

    pub fn bucket_count(&self) -> usize {
        self.buckets.len()
    }

    pub fn clear(&mut self) {
        self.exact.clear();
        self.buckets.clear();
    }

    /// Tracks a message to deliver at `deliver_at` (ms since the epoch).
    pub fn add(&mut self, deliver_at: u64, position: Position) {
        let full = self.exact.len() >= self.config.exact_capacity;
        let later_than_all = self.exact.last().is_some_and(|&(at, _)| deliver_at >= at);
        if full && later_than_all {
            self.add_to_bucket(deliver_at, position);
            return;
        }
        self.exact.insert((deliver_at, position));
        if self.exact.len() > self.config.exact_capacity {
            if let Some((at, evicted)) = self.exact.pop_last() {
                self.add_to_bucket(at, evicted);
            }
        }
    }

    fn add_to_bucket(&mut self, deliver_at: u64, position: Position) {
        let covering = self
            .buckets
            .range_mut(..=deliver_at)
            .next_back()
            .filter(|(_, bucket)| bucket.end_ms > deliver_at);
        if let Some((_, bucket)) = covering {
            let key = (deliver_at, position);
            bucket.first = bucket.first.min(position);
            bucket.last = bucket.last.max(position);
            bucket.count += 1;
            if bucket.floor.is_some_and(|floor| key < floor) {
                bucket.floor = Some(key);
            }
            if bucket.behind_scan(position) {
                // The current pass has gone past it: the next pass must take it.
                bucket.left_out = min_key(bucket.left_out, key);
            }
            return;
        }
        let width = self.config.bucket_ms.max(1);
        let start = deliver_at - deliver_at % width;
        // The slot may be cut short by a (merged) bucket starting inside it.
        let end = self
            .buckets
            .range(start + 1..)
            .next()
            .map_or(start + width, |(&next, _)| next.min(start + width));
        let bucket = Bucket {
            end_ms: end,
            first: position,
            last: position,
            count: 1,
            scan_from: None,
            floor: None,
            left_out: None,
        };
        self.buckets.insert(start, bucket);
        if self.buckets.len() > self.config.max_buckets {
            self.merge_latest();
        }
    }

    /// Merges the two latest buckets (the least urgent) into one.
    fn merge_latest(&mut self) {
        let Some((_, last)) = self.buckets.pop_last() else { return };
        let Some((_, previous)) = self.buckets.iter_mut().next_back() else { return };
        previous.end_ms = last.end_ms;
        previous.first = previous.first.min(last.first);
        previous.last = previous.last.max(last.last);
        previous.count += last.count;
        // A merged bucket starts a fresh pass from the lower of the two floors.
        previous.floor = match (previous.floor, last.floor) {
            (Some(a), Some(b)) => Some(a.min(b)),
            _ => None,
        };
        previous.scan_from = None;
        previous.left_out = None;
    }

    /// Takes up to `max` positions whose time has come, earliest first.
    pub fn pop_due(&mut self, now: u64, max: usize) -> Vec<Position> {
        let mut due = Vec::new();
        while due.len() < max {
            match self.exact.first() {
                Some(&(at, position)) if at <= now => {
                    self.exact.pop_first();
                    due.push(position);
                }
                _ => break,
            }
        }
        due
    }

    /// The bucket to re-read now, if any: the earliest one, when its slot is within the window
    /// and the exact tier has room, or when its whole slot is due.
    pub fn rescan(&self, now: u64) -> Option<Rescan> {
        let (&start, bucket) = self.buckets.iter().next()?;
        let near = bucket.effective_start(start) <= now.saturating_add(self.config.window_ms);
        let room = self.exact.len() < self.config.exact_capacity;
        let all_due = bucket.end_ms <= now.saturating_add(1);
        if near && (room || all_due) {
            let (from, inclusive) = bucket.scan_from.unwrap_or((bucket.first, true));
            Some(Rescan { bucket: start, from, inclusive, last: bucket.last })
        } else {
            None
        }
    }

    /// Entries re-read for `rescan`, in position order, with their `deliver_at` (None: not a
    /// delayed message). Returns the bucket's messages that are already due, for immediate
    /// dispatch; the others go to the exact tier, which keeps the earliest.
    pub fn on_rescanned(
        &mut self,
        rescan: Rescan,
        entries: &[(Position, Option<u64>)],
        now: u64,
    ) -> Vec<Position> {
        let Some(bucket) = self.buckets.get(&rescan.bucket).cloned() else {
            return Vec::new();
        };
        let slot = rescan.bucket..bucket.end_ms;
        let mut due = Vec::new();
        let mut left_out = bucket.left_out;
        let mut evicted_elsewhere = Vec::new();
        let mut scanned_to = None;
        let mut past_end = entries.is_empty();
        for &(position, deliver_at) in entries {
            if position < rescan.from || (position == rescan.from && !rescan.inclusive) {
                continue;
            }
            if position > bucket.last {
                past_end = true;
                break;
            }
            scanned_to = Some(position);
            let Some(at) = deliver_at.filter(|at| slot.contains(at)) else { continue };
            let key = (at, position);
            if bucket.floor.is_some_and(|floor| key < floor) {
                continue; // handed out by an earlier pass
            }
            if at <= now {
                due.push(position);
                continue;
            }
            if self.exact.len() < self.config.exact_capacity {
                self.exact.insert(key);
                continue;
            }
            match self.exact.last().copied() {
                Some(latest) if key < latest => {
                    self.exact.pop_last();
                    self.exact.insert(key);
                    if slot.contains(&latest.0) {
                        left_out = min_key(left_out, latest);
                    } else {
                        evicted_elsewhere.push(latest);
                    }
                }
                _ => left_out = min_key(left_out, key),
            }
        }
        if let Some(stored) = self.buckets.get_mut(&rescan.bucket) {
            stored.left_out = left_out;
            let finished = past_end || scanned_to.is_some_and(|p| p >= stored.last);
            match scanned_to {
                Some(position) if !finished => stored.scan_from = Some((position, false)),
                _ if !finished => {}
                _ => match stored.left_out.take() {
                    // Some did not fit: the next pass continues from the smallest of them.
                    Some(key) => {
                        stored.floor = Some(key);
                        stored.scan_from = None;
                    }
                    None => {
                        self.buckets.remove(&rescan.bucket);
                    }
                },
            }
        }
        for (at, position) in evicted_elsewhere {
            self.add_to_bucket(at, position);
        }
        due
    }

    /// When the caller should look again (ms since the epoch), if anything is tracked.
    pub fn next_wake(&self) -> Option<u64> {
        let exact = self.exact.first().map(|&(at, _)| at);
        // A bucket is re-read when near and the exact tier has room, or else once all due.
        let room = self.exact.len() < self.config.exact_capacity;
        let bucket = self.buckets.iter().next().map(|(&start, bucket)| {
            if room {
                bucket.effective_start(start).saturating_sub(self.config.window_ms)
            } else {
                bucket.end_ms.saturating_sub(1)
            }
        });
        match (exact, bucket) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(entry: u64) -> Position {
        Position::new(1, entry)
    }

    fn small() -> DelayConfig {
        DelayConfig { exact_capacity: 4, bucket_ms: 100, max_buckets: 3, window_ms: 50 }
    }

    /// Drives a tracker to the end like a dispatcher would, over a ledger of `(position, at)`.
    fn drain(
        tracker: &mut DelayTracker,
        ledger: &[(Position, Option<u64>)],
        until: u64,
    ) -> Vec<(u64, Position)> {
        let mut delivered = Vec::new();
        let mut now = 0;
        while now <= until {
            loop {
                let mut progress = false;
                for position in tracker.pop_due(now, usize::MAX) {
                    delivered.push((now, position));
                    progress = true;
                }
                if let Some(rescan) = tracker.rescan(now) {
                    let read: Vec<_> = ledger
                        .iter()
                        .copied()
                        .filter(|(p, _)| {
                            *p > rescan.from || (rescan.inclusive && *p == rescan.from)
                        })
                        .take(3)
                        .collect();
                    for position in tracker.on_rescanned(rescan, &read, now) {
                        delivered.push((now, position));
                    }
                    progress = true;
                }
                if !progress {
                    break;
                }
            }
            now += 10;
        }
        delivered
    }

    #[test]
    fn delivers_in_time_order_not_before_its_time() {
        let mut tracker = DelayTracker::new(DelayConfig::default());
        tracker.add(300, pos(1));
        tracker.add(100, pos(2));
        tracker.add(200, pos(3));
        assert!(tracker.pop_due(99, 10).is_empty());
        assert_eq!(tracker.next_wake(), Some(100));
        assert_eq!(tracker.pop_due(250, 10), vec![pos(2), pos(3)]);
        assert_eq!(tracker.pop_due(1_000, 10), vec![pos(1)]);
        assert!(tracker.is_empty());
    }

    #[test]
    fn overflow_goes_to_buckets_and_every_message_comes_back_on_time() {
        let mut tracker = DelayTracker::new(small());
        let mut ledger = Vec::new();
        // 40 delayed messages with times spread over 0..2000, interleaved with plain entries.
        for i in 0..80u64 {
            let at = if i % 2 == 0 { Some((i * 7_919) % 2_000 + 1) } else { None };
            ledger.push((pos(i), at));
            if let Some(at) = at {
                tracker.add(at, pos(i));
            }
        }
        assert!(tracker.exact_len() <= 4);
        assert!(tracker.bucket_count() <= 3);
        let delivered = drain(&mut tracker, &ledger, 3_000);
        let mut seen = std::collections::HashSet::new();
        for (when, position) in &delivered {
            let at = ledger[position.entry_id as usize].1.expect("only delayed ones");
            assert!(*when >= at, "{position:?} delivered at {when}, due at {at}");
            seen.insert(*position);
        }
        let expected: std::collections::HashSet<_> =
            ledger.iter().filter(|(_, at)| at.is_some()).map(|(p, _)| *p).collect();
        assert_eq!(seen, expected);
        assert!(tracker.is_empty());
    }

    #[test]
    fn memory_stays_bounded() {
        let config =
            DelayConfig { exact_capacity: 100, bucket_ms: 10, max_buckets: 20, window_ms: 5 };
        let mut tracker = DelayTracker::new(config);
        for i in 0..100_000u64 {
            tracker.add(1_000 + (i * 104_729) % 1_000_000, pos(i));
        }
        assert_eq!(tracker.exact_len(), 100);
        assert!(tracker.bucket_count() <= 20);
        assert_eq!(tracker.len(), 100_000);
    }

    #[test]
    fn a_late_eviction_into_a_bucket_being_scanned_is_not_missed() {
        let config =
            DelayConfig { exact_capacity: 1, bucket_ms: 100, max_buckets: 8, window_ms: 1_000 };
        let mut tracker = DelayTracker::new(config);
        tracker.add(150, pos(10));
        tracker.add(160, pos(20));
        tracker.add(170, pos(30)); // bucket [100, 200) spans 20..=30
        assert_eq!(tracker.pop_due(150, 10), vec![pos(10)]);
        let rescan = tracker.rescan(150).expect("room in the exact tier");
        assert_eq!((rescan.from, rescan.inclusive), (pos(20), true));
        let read = [(pos(20), Some(160)), (pos(30), Some(170))];
        assert!(tracker.on_rescanned(rescan, &read, 150).is_empty());
        // 20 was promoted; 30 did not fit: the bucket stays, its floor at 30.
        assert_eq!(tracker.exact_len(), 1);
        // A nearer deadline evicts 20 back into the bucket, behind the scan point.
        tracker.add(110, pos(5));
        let ledger = vec![(pos(5), Some(110)), (pos(20), Some(160)), (pos(30), Some(170))];
        let delivered = drain(&mut tracker, &ledger, 500);
        for (when, position) in &delivered {
            let at = ledger.iter().find(|(p, _)| p == position).and_then(|(_, at)| *at).unwrap();
            assert!(*when >= at);
        }
        let seen: std::collections::HashSet<_> = delivered.into_iter().map(|(_, p)| p).collect();
        assert_eq!(seen, [pos(5), pos(20), pos(30)].into_iter().collect());
        assert!(tracker.is_empty());
    }
}
