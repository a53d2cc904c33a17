//! Key_Shared routing, pure (no I/O, no tokio): the sticky-key hash, the consumer selectors
//! (consistent hashing for AUTO_SPLIT, fixed ranges for STICKY) and the draining-hashes tracker
//! that keeps each key's order when hashes move between consumers.
//!
//! Matches Pulsar 4: hash = Murmur3_32 (seed 0, sign bit cleared) of the sticky key (ordering
//! key, else partition key, else `NONE_KEY`) modulo 65,536, with 0 mapped to 1 (0 means "unset"
//! in Pulsar's dispatcher). AUTO_SPLIT places 100 points per consumer on a ring at the hashes of
//! `name \0 index \0 point`, `index` telling apart consumers with the same name; a hash goes to
//! the first point at or after it (wrapping). STICKY uses the ranges the consumer asked for and
//! refuses a consumer whose ranges overlap another's.

use magnetar_protocol::proto::{KeySharedMeta, KeySharedMode};
use std::collections::{BTreeMap, HashMap};

/// Number of hash slots.
pub const HASH_RANGE_SIZE: u32 = 65_536;
/// Points per consumer on the consistent-hashing ring
/// (`subscriptionKeySharedConsistentHashingReplicaPoints`).
pub const REPLICA_POINTS: u32 = 100;
/// The sticky key of a message without ordering or partition key.
pub const NONE_KEY: &[u8] = b"NONE_KEY";

pub use magnetar_protocol::murmur3_32;

/// The hash slot of a sticky key, in `1..HASH_RANGE_SIZE`.
pub fn sticky_key_hash(key: &[u8]) -> u32 {
    match (murmur3_32(key, 0) & 0x7fff_ffff) % HASH_RANGE_SIZE {
        0 => 1,
        hash => hash,
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error("Fixed hash range start > end")]
    StartAfterEnd,
    #[error("Ranges for KeyShared policy must be in 0 to 65535")]
    OutOfBounds,
    #[error("Ranges for KeyShared policy must not be empty")]
    NoRanges,
    #[error("Range conflict with consumer {0}")]
    Conflict(String),
    #[error("No more range can assigned to new consumer, assigned consumers {0}")]
    NoRangeLeft(usize),
}

/// Which consumer owns a hash.
#[derive(Debug, Clone)]
pub enum Selector {
    AutoSplit(ConsistentRing),
    /// AUTO_SPLIT without consistent hashing (`subscriptionKeySharedUseConsistentHashing=false`).
    RangeSplit(HashRangeSplit),
    Sticky(StickyRanges),
}

impl Selector {
    pub fn select(&self, hash: u32) -> Option<u64> {
        match self {
            Selector::AutoSplit(ring) => ring.select(hash),
            Selector::RangeSplit(split) => split.select(hash),
            Selector::Sticky(ranges) => ranges.select(hash),
        }
    }

    pub fn remove(&mut self, consumer: u64) {
        match self {
            Selector::AutoSplit(ring) => ring.remove(consumer),
            Selector::RangeSplit(split) => split.remove(consumer),
            Selector::Sticky(ranges) => ranges.remove(consumer),
        }
    }

    pub fn is_sticky(&self) -> bool {
        matches!(self, Selector::Sticky(_))
    }

    /// The selector a Key_Shared subscription's first consumer asks for (`meta`): its STICKY
    /// ranges, else AUTO_SPLIT, by consistent hashing or by halving ranges
    /// (`subscriptionKeySharedUseConsistentHashing`).
    pub fn for_first_consumer(meta: Option<&KeySharedMeta>, consistent_hashing: bool) -> Self {
        if wants_sticky(meta) {
            Selector::Sticky(StickyRanges::default())
        } else if consistent_hashing {
            Selector::AutoSplit(ConsistentRing::default())
        } else {
            Selector::RangeSplit(HashRangeSplit::default())
        }
    }

    /// Adds a consumer: STICKY takes the ranges it asked for (refused where they overlap
    /// another's), AUTO_SPLIT gives it its share.
    pub fn add(
        &mut self,
        consumer: u64,
        name: &str,
        meta: Option<&KeySharedMeta>,
    ) -> Result<(), SelectorError> {
        match self {
            Selector::Sticky(ranges) => {
                let wanted: Vec<(i32, i32)> = meta
                    .map(|m| m.hash_ranges.iter().map(|r| (r.start, r.end)).collect())
                    .unwrap_or_default();
                ranges.add(consumer, name, &wanted)
            }
            Selector::AutoSplit(ring) => {
                ring.add(consumer, name);
                Ok(())
            }
            Selector::RangeSplit(split) => split.add(consumer),
        }
    }
}

/// Whether a consumer's Key_Shared metadata asks for STICKY (fixed ranges).
pub fn wants_sticky(meta: Option<&KeySharedMeta>) -> bool {
    meta.is_some_and(|m| m.key_shared_mode() == KeySharedMode::Sticky)
}

/// AUTO_SPLIT: consistent hashing ring.
#[derive(Debug, Clone, Default)]
pub struct ConsistentRing {
    points: BTreeMap<u32, u64>,
    /// consumer -> (name, name index)
    members: HashMap<u64, (String, u32)>,
}

impl ConsistentRing {
    fn point_hash(name: &str, index: u32, point: u32) -> u32 {
        sticky_key_hash(format!("{name}\0{index}\0{point}").as_bytes())
    }

    pub fn add(&mut self, consumer: u64, name: &str) {
        // The lowest index not used by a live consumer of the same name, as Pulsar's
        // ConsumerNameIndexTracker does, so same-named consumers get distinct points.
        let mut index = 0;
        while self.members.values().any(|(n, i)| n == name && *i == index) {
            index += 1;
        }
        for point in 0..REPLICA_POINTS {
            // A collision replaces the earlier point (as Pulsar): rare and harmless.
            self.points.insert(Self::point_hash(name, index, point), consumer);
        }
        self.members.insert(consumer, (name.to_string(), index));
    }

    pub fn remove(&mut self, consumer: u64) {
        let Some((name, index)) = self.members.remove(&consumer) else {
            return;
        };
        for point in 0..REPLICA_POINTS {
            let hash = Self::point_hash(&name, index, point);
            if self.points.get(&hash) == Some(&consumer) {
                self.points.remove(&hash);
            }
        }
    }

    pub fn select(&self, hash: u32) -> Option<u64> {
        self.points
            .range(hash..)
            .next()
            .or_else(|| self.points.iter().next())
            .map(|(_, &consumer)| consumer)
    }
}

/// AUTO_SPLIT by halving ranges, as Pulsar's `HashRangeAutoSplitStickyKeyConsumerSelector`:
/// the first consumer owns every hash; each joining one takes the lower half of the largest
/// range (the first such range on ties); a leaving consumer's range goes to its upper neighbour
/// (the last range to its lower neighbour). Ranges are keyed by their inclusive end.
#[derive(Debug, Clone, Default)]
pub struct HashRangeSplit {
    /// range end -> consumer; a range runs from the previous end (exclusive) to its end.
    ends: BTreeMap<u32, u64>,
}

impl HashRangeSplit {
    pub fn add(&mut self, consumer: u64) -> Result<(), SelectorError> {
        if self.ends.is_empty() {
            self.ends.insert(HASH_RANGE_SIZE, consumer);
            return Ok(());
        }
        let mut largest = (0, HASH_RANGE_SIZE);
        let mut start = 0;
        for &end in self.ends.keys() {
            if end - start > largest.0 {
                largest = (end - start, end);
            }
            start = end;
        }
        let end = largest.1;
        let lower = self.ends.range(..end).next_back().map_or(0, |(&e, _)| e);
        if end - lower <= 1 {
            return Err(SelectorError::NoRangeLeft(self.ends.len()));
        }
        self.ends.insert((lower + end) / 2, consumer);
        Ok(())
    }

    pub fn remove(&mut self, consumer: u64) {
        let Some(&end) = self.ends.iter().find(|(_, &c)| c == consumer).map(|(e, _)| e) else {
            return;
        };
        self.ends.remove(&end);
        if end == HASH_RANGE_SIZE {
            // The last range keeps its end: the consumer below takes it over.
            if let Some((&lower, &owner)) = self.ends.iter().next_back() {
                self.ends.remove(&lower);
                self.ends.insert(HASH_RANGE_SIZE, owner);
            }
        }
    }

    pub fn select(&self, hash: u32) -> Option<u64> {
        self.ends.range(hash % HASH_RANGE_SIZE..).next().map(|(_, &consumer)| consumer)
    }
}

/// STICKY: fixed, non-overlapping inclusive ranges chosen by the consumers.
#[derive(Debug, Clone, Default)]
pub struct StickyRanges {
    /// start -> (end, consumer, consumer name)
    ranges: BTreeMap<u32, (u32, u64, String)>,
}

impl StickyRanges {
    pub fn add(
        &mut self,
        consumer: u64,
        name: &str,
        ranges: &[(i32, i32)],
    ) -> Result<(), SelectorError> {
        if ranges.is_empty() {
            return Err(SelectorError::NoRanges);
        }
        let mut checked: Vec<(u32, u32)> = Vec::with_capacity(ranges.len());
        for &(start, end) in ranges {
            if start > end {
                return Err(SelectorError::StartAfterEnd);
            }
            if start < 0 || end >= HASH_RANGE_SIZE as i32 {
                return Err(SelectorError::OutOfBounds);
            }
            let (start, end) = (start as u32, end as u32);
            if let Some(owner) = self.overlapping(start, end) {
                return Err(SelectorError::Conflict(owner));
            }
            if checked.iter().any(|&(s, e)| s <= end && start <= e) {
                return Err(SelectorError::Conflict(name.to_string()));
            }
            checked.push((start, end));
        }
        for (start, end) in checked {
            self.ranges.insert(start, (end, consumer, name.to_string()));
        }
        Ok(())
    }

    fn overlapping(&self, start: u32, end: u32) -> Option<String> {
        // The range starting last at or before `end` is the only candidate that can overlap
        // from the left; any range starting inside [start, end] overlaps too.
        self.ranges
            .range(..=end)
            .next_back()
            .filter(|(_, (e, _, _))| *e >= start)
            .map(|(_, (_, _, name))| name.clone())
    }

    pub fn remove(&mut self, consumer: u64) {
        self.ranges.retain(|_, (_, owner, _)| *owner != consumer);
    }

    pub fn select(&self, hash: u32) -> Option<u64> {
        self.ranges
            .range(..=hash)
            .next_back()
            .filter(|(_, (end, _, _))| *end >= hash)
            .map(|(_, (_, consumer, _))| *consumer)
    }
}

/// Hashes whose messages are still unacknowledged at a consumer that no longer owns them
/// (PIP-379). While a hash drains, its messages go to nobody else, so a key's messages are never
/// processed by two consumers at once; other hashes keep flowing.
#[derive(Debug, Default, Clone)]
pub struct DrainingHashes {
    /// hash -> (consumer holding its messages, number of those messages)
    draining: HashMap<u32, (u64, u32)>,
}

impl DrainingHashes {
    /// Counts one more unacknowledged message of `hash` held by `consumer`.
    pub fn add(&mut self, hash: u32, consumer: u64) {
        let entry = self.draining.entry(hash).or_insert((consumer, 0));
        if entry.0 == consumer {
            entry.1 += 1;
        }
    }

    /// One message of `hash` held by `consumer` was acknowledged or taken back.
    /// Returns whether the hash finished draining.
    pub fn release(&mut self, hash: u32, consumer: u64) -> bool {
        if let Some(entry) = self.draining.get_mut(&hash) {
            if entry.0 == consumer {
                entry.1 = entry.1.saturating_sub(1);
                if entry.1 == 0 {
                    self.draining.remove(&hash);
                    return true;
                }
            }
        }
        false
    }

    /// Whether a message of `hash` must not go to `target` yet.
    pub fn blocks(&self, hash: u32, target: u64) -> bool {
        self.draining.get(&hash).is_some_and(|(holder, _)| *holder != target)
    }

    /// Whether `consumer` holds messages of a draining `hash`.
    pub fn is_draining_at(&self, hash: u32, consumer: u64) -> bool {
        self.draining.get(&hash).is_some_and(|(holder, _)| *holder == consumer)
    }

    /// The consumer left: its messages were taken back, nothing of it drains any more.
    pub fn clear_consumer(&mut self, consumer: u64) {
        self.draining.retain(|_, (holder, _)| *holder != consumer);
    }

    pub fn len(&self) -> usize {
        self.draining.len()
    }

    pub fn is_empty(&self) -> bool {
        self.draining.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur3_matches_reference_vectors() {
        // Published MurmurHash3_x86_32 vectors.
        assert_eq!(murmur3_32(b"", 0), 0);
        assert_eq!(murmur3_32(b"", 1), 0x514e_28b7);
        assert_eq!(murmur3_32(b"test", 0), 0xba6b_d213);
        assert_eq!(murmur3_32(b"Hello, world!", 0), 0xc036_3e43);
        assert_eq!(murmur3_32(b"The quick brown fox jumps over the lazy dog", 0), 0x2e4f_f723);
        assert_eq!(murmur3_32(b"abc", 0), 0xb3dd_93fa);
    }

    #[test]
    fn sticky_hash_is_in_range_and_never_zero() {
        for i in 0..20_000u32 {
            let hash = sticky_key_hash(format!("key-{i}").as_bytes());
            assert!((1..HASH_RANGE_SIZE).contains(&hash));
        }
        assert_eq!(sticky_key_hash(b"test"), (0xba6b_d213u32 & 0x7fff_ffff) % 65_536);
    }

    #[test]
    fn ring_splits_keys_roughly_evenly_and_is_stable() {
        let mut ring = ConsistentRing::default();
        for consumer in 1..=4 {
            ring.add(consumer, &format!("c{consumer}"));
        }
        let mut counts = HashMap::new();
        for hash in 1..HASH_RANGE_SIZE {
            *counts.entry(ring.select(hash).expect("owner")).or_insert(0u32) += 1;
        }
        assert_eq!(counts.len(), 4);
        for (&consumer, &count) in &counts {
            assert!(count > 65_536 / 4 / 2, "consumer {consumer} owns only {count}");
        }
        // Removing a consumer moves only its own hashes.
        let before: Vec<_> = (1..HASH_RANGE_SIZE).map(|h| ring.select(h)).collect();
        ring.remove(3);
        for (i, owner) in before.iter().enumerate() {
            let after = ring.select(i as u32 + 1);
            if *owner != Some(3) {
                assert_eq!(after, *owner);
            } else {
                assert_ne!(after, Some(3));
            }
        }
        // Adding it back restores the original assignment (deterministic points).
        ring.add(3, "c3");
        let again: Vec<_> = (1..HASH_RANGE_SIZE).map(|h| ring.select(h)).collect();
        assert_eq!(before, again);
    }

    #[test]
    fn same_named_consumers_get_distinct_points() {
        let mut ring = ConsistentRing::default();
        ring.add(1, "same");
        ring.add(2, "same");
        let owners: std::collections::HashSet<_> =
            (1..HASH_RANGE_SIZE).filter_map(|h| ring.select(h)).collect();
        assert_eq!(owners.len(), 2);
    }

    #[test]
    fn sticky_ranges_select_and_refuse_overlaps() {
        let mut ranges = StickyRanges::default();
        ranges.add(1, "a", &[(0, 99), (200, 299)]).unwrap();
        ranges.add(2, "b", &[(100, 199)]).unwrap();
        assert_eq!(ranges.select(0), Some(1));
        assert_eq!(ranges.select(150), Some(2));
        assert_eq!(ranges.select(299), Some(1));
        assert_eq!(ranges.select(300), None);
        assert_eq!(ranges.add(3, "c", &[(250, 400)]), Err(SelectorError::Conflict("a".into())));
        assert_eq!(ranges.add(3, "c", &[(50, 150)]), Err(SelectorError::Conflict("b".into())));
        assert_eq!(
            ranges.add(3, "c", &[(300, 310), (305, 320)]),
            Err(SelectorError::Conflict("c".into()))
        );
        assert_eq!(ranges.add(3, "c", &[(10, 5)]), Err(SelectorError::StartAfterEnd));
        assert_eq!(ranges.add(3, "c", &[(0, 65_536)]), Err(SelectorError::OutOfBounds));
        // A refused consumer left nothing behind.
        assert_eq!(ranges.select(305), None);
        ranges.remove(1);
        assert_eq!(ranges.select(0), None);
        ranges.add(3, "c", &[(0, 99)]).unwrap();
        assert_eq!(ranges.select(42), Some(3));
    }

    #[test]
    fn draining_blocks_other_consumers_until_released() {
        let mut draining = DrainingHashes::default();
        draining.add(7, 1);
        draining.add(7, 1);
        assert!(draining.blocks(7, 2));
        assert!(!draining.blocks(7, 1));
        assert!(!draining.blocks(8, 2));
        assert!(!draining.release(7, 2));
        assert!(!draining.release(7, 1));
        assert!(draining.blocks(7, 2));
        assert!(draining.release(7, 1));
        assert!(!draining.blocks(7, 2));
        draining.add(9, 3);
        draining.clear_consumer(3);
        assert!(draining.is_empty());
    }

    #[test]
    fn range_split_halves_the_largest_range_for_each_joining_consumer() {
        let mut split = HashRangeSplit::default();
        split.add(1).unwrap();
        assert_eq!(split.select(1), Some(1));
        assert_eq!(split.select(65_535), Some(1));
        // The second takes the lower half; both get keys from a handful.
        split.add(2).unwrap();
        assert_eq!(split.select(1), Some(2));
        assert_eq!(split.select(32_768), Some(2));
        assert_eq!(split.select(32_769), Some(1));
        // The third halves the first (lowest) of the two equal halves.
        split.add(3).unwrap();
        assert_eq!(split.select(16_384), Some(3));
        assert_eq!(split.select(16_385), Some(2));
        assert_eq!(split.select(40_000), Some(1));
        // The top range's owner leaves: its lower neighbour takes it over, keeping its own.
        split.remove(1);
        assert_eq!(split.select(65_535), Some(2));
        assert_eq!(split.select(20_000), Some(2));
        assert_eq!(split.select(100), Some(3));
        // A middle one leaves: the hashes go to the next range up.
        split.remove(3);
        assert_eq!(split.select(100), Some(2));
    }
}
