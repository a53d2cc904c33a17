//! Write cache: each ledger keeps its most recent entries in memory so that tailing readers
//! are served without a disk read. One global byte budget bounds all ledgers together; a
//! ledger that appends while the budget is spent first drops its own oldest entries, so the
//! append path never takes a lock beyond the ledger's own.

use bytes::Bytes;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The global budget shared by every ledger's cache.
#[derive(Debug)]
pub struct CacheBudget {
    capacity: usize,
    used: AtomicUsize,
}

impl CacheBudget {
    pub fn new(capacity: usize) -> Self {
        CacheBudget { capacity, used: AtomicUsize::new(0) }
    }

    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn over(&self) -> bool {
        self.used() > self.capacity
    }
}

/// One ledger's recent entries: `entries[i]` is entry `first + i`.
#[derive(Debug, Default)]
pub struct LedgerCache {
    first: u64,
    entries: VecDeque<Bytes>,
    bytes: usize,
}

impl LedgerCache {
    /// Caches entry `entry` (the ledger's next one), evicting this ledger's oldest entries
    /// while the global budget is spent. Skips the entry if the budget cannot take it.
    pub fn push(&mut self, budget: &CacheBudget, entry: u64, data: Bytes) {
        if self.first + self.entries.len() as u64 != entry {
            self.clear(budget);
            self.first = entry;
        }
        budget.used.fetch_add(data.len(), Ordering::Relaxed);
        self.bytes += data.len();
        self.entries.push_back(data);
        while budget.over() {
            let Some(oldest) = self.entries.pop_front() else { break };
            self.first += 1;
            self.bytes -= oldest.len();
            budget.used.fetch_sub(oldest.len(), Ordering::Relaxed);
        }
    }

    pub fn get(&self, entry: u64) -> Option<Bytes> {
        let index = entry.checked_sub(self.first)?;
        self.entries.get(usize::try_from(index).ok()?).cloned()
    }

    pub fn clear(&mut self, budget: &CacheBudget) {
        budget.used.fetch_sub(self.bytes, Ordering::Relaxed);
        self.entries.clear();
        self.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ledgers_share_one_budget_and_evict_their_own_oldest_entries() {
        let budget = CacheBudget::new(1000);
        let (mut a, mut b) = (LedgerCache::default(), LedgerCache::default());
        for entry in 0..8 {
            a.push(&budget, entry, Bytes::from(vec![1u8; 100]));
        }
        for entry in 0..5 {
            b.push(&budget, entry, Bytes::from(vec![2u8; 100]));
            assert!(budget.used() <= 1000);
        }
        assert!(b.get(0).is_none(), "b evicted its own oldest to stay in budget");
        assert_eq!(b.get(4).unwrap()[0], 2);
        assert_eq!(a.get(7).unwrap()[0], 1);
        assert!(a.get(8).is_none());
        a.push(&budget, 20, Bytes::from(vec![3u8; 10]));
        assert!(a.get(7).is_none(), "a gap restarts the cache");
        assert_eq!(a.get(20).unwrap()[0], 3);
        a.clear(&budget);
        b.clear(&budget);
        assert_eq!(budget.used(), 0);
    }
}
