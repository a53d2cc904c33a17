//! A bounded FIFO cache of recently appended entries, so tailing readers are served from
//! memory. Entries enter at append time; readers only ask for entries already durable.

use bytes::Bytes;
use std::collections::{HashMap, VecDeque};

pub struct WriteCache {
    entries: HashMap<(u64, u64), Bytes>,
    order: VecDeque<(u64, u64)>,
    bytes: usize,
    capacity: usize,
}

impl WriteCache {
    pub fn new(capacity: usize) -> Self {
        WriteCache {
            entries: HashMap::new(),
            order: VecDeque::new(),
            bytes: 0,
            capacity,
        }
    }

    pub fn insert(&mut self, ledger: u64, entry: u64, data: Bytes) {
        if data.len() > self.capacity {
            return;
        }
        self.bytes += data.len();
        if let Some(old) = self.entries.insert((ledger, entry), data) {
            self.bytes -= old.len();
        } else {
            self.order.push_back((ledger, entry));
        }
        while self.bytes > self.capacity {
            let Some(key) = self.order.pop_front() else {
                break;
            };
            if let Some(evicted) = self.entries.remove(&key) {
                self.bytes -= evicted.len();
            }
        }
    }

    pub fn get(&self, ledger: u64, entry: u64) -> Option<Bytes> {
        self.entries.get(&(ledger, entry)).cloned()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_within_capacity_evicting_oldest_first() {
        let mut cache = WriteCache::new(1000);
        for entry in 0..100 {
            cache.insert(1, entry, Bytes::from(vec![0u8; 100]));
            assert!(cache.bytes() <= 1000);
        }
        assert!(cache.get(1, 89).is_none());
        assert!(cache.get(1, 90).is_some());
        cache.insert(1, 99, Bytes::from(vec![1u8; 50]));
        assert_eq!(cache.get(1, 99).unwrap()[0], 1);
        assert!(cache.bytes() <= 1000);
    }
}
