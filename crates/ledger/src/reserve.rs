//! The disk reserve: space held back in a file (`RESERVE`, next to the journal) so that a store
//! whose disk filled up can still write what frees it. Deleting a ledger is a journal record,
//! and compaction copies live entries into a new segment: both need space, and a journal at
//! ENOSPC has none, so without a reserve a full disk could not be reclaimed by deleting topics or
//! by retention (Pulsar's #15332; CockroachDB keeps a ballast file for the same reason).
//!
//! When the journal cannot prepare a segment, or a checkpoint or index file cannot be written,
//! for want of space, the store gives the reserve up (removes the file) and reports itself short
//! of disk: a broker refuses new messages and a storage node goes read-only, while deletes,
//! cursor writes, retention and compaction go on in the freed space. Once twice the reserve
//! (plus the store's minimum) is free, the reserve is created again and messages are taken.

use magnetar_journal::storage::Storage;
use parking_lot::Mutex;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub struct Reserve {
    storage: Arc<dyn Storage>,
    /// Bytes held back; 0: no reserve.
    size: u64,
    spent: AtomicBool,
    /// Serializes giving up and re-creating (the preparer thread and the maintenance thread).
    changing: Mutex<()>,
}

impl Reserve {
    /// Brings the reserve to `size` bytes when a store opens: kept if it has that size, created
    /// (or re-created at the new size) otherwise, removed when `size` is 0. Without room for it
    /// (ENOSPC), or with less than `needed` bytes free beside it (what the journal takes to
    /// start), the store opens with it given up.
    pub fn open(storage: Arc<dyn Storage>, size: u64, needed: u64) -> io::Result<Reserve> {
        let reserve =
            Reserve { storage, size, spent: AtomicBool::new(false), changing: Mutex::new(()) };
        let existing = reserve.storage.reserve_len()?;
        if size == 0 {
            if existing.is_some() {
                reserve.storage.remove_reserve()?;
            }
            return Ok(reserve);
        }
        if existing != Some(size) {
            reserve.storage.remove_reserve()?;
            match reserve.storage.create_reserve(size) {
                Ok(()) => {}
                Err(e) if magnetar_journal::error::is_out_of_space(&e) => {
                    tracing::warn!(size, "no room for the disk reserve: starting short of disk");
                    reserve.spent.store(true, Ordering::Release);
                    return Ok(reserve);
                }
                Err(e) => return Err(e),
            }
        }
        if reserve.storage.free_bytes().is_some_and(|free| free < needed) {
            reserve.give_up();
        }
        Ok(reserve)
    }

    /// Bytes held back (0: no reserve).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The reserve was given up and is not back yet: the store is short of disk.
    pub fn is_spent(&self) -> bool {
        self.spent.load(Ordering::Acquire)
    }

    /// Gives the reserve up for the writes that free space. True if that freed space (it was
    /// held, and its file is gone); false if there is no reserve, or it is spent already.
    pub fn give_up(&self) -> bool {
        let _changing = self.changing.lock();
        if self.size == 0 || self.is_spent() {
            return false;
        }
        // Spent before the file goes: nobody takes new messages into the space it leaves.
        self.spent.store(true, Ordering::Release);
        match self.storage.remove_reserve() {
            Ok(()) => {
                tracing::warn!(
                    size = self.size,
                    "disk full: the reserve was given up so that deletes and compaction can \
                     free space; new messages are refused until it is back"
                );
                true
            }
            Err(error) => {
                tracing::error!(%error, "could not give up the disk reserve");
                false
            }
        }
    }

    /// Free bytes at which a spent reserve is created again: itself, as much again to spare
    /// (so that taking messages does not fill the disk at once), and the store's minimum.
    pub fn restore_at(&self, min_free: u64) -> u64 {
        self.size.saturating_mul(2).saturating_add(min_free)
    }

    /// Creates a spent reserve again when `free` bytes reach [`Self::restore_at`]. True if it
    /// is back (the store takes new messages again, unless short of disk for other reasons).
    pub fn restore(&self, free: u64, min_free: u64) -> bool {
        let _changing = self.changing.lock();
        if !self.is_spent() || free < self.restore_at(min_free) {
            return false;
        }
        match self.storage.create_reserve(self.size) {
            Ok(()) => {
                self.spent.store(false, Ordering::Release);
                tracing::info!(size = self.size, free, "the disk reserve is back");
                true
            }
            Err(error) => {
                tracing::warn!(%error, "could not create the disk reserve again");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use magnetar_journal::sim::{Faults, SimStorage};

    const MIB: u64 = 1 << 20;

    fn with_capacity(capacity: u64) -> SimStorage {
        let storage = SimStorage::new(1);
        storage.set_faults(Faults { capacity_bytes: Some(capacity), ..Faults::default() });
        storage
    }

    #[test]
    fn a_reserve_is_created_kept_resized_and_removed_with_its_setting() {
        let storage = with_capacity(100 * MIB);
        let reserve = Reserve::open(Arc::new(storage.clone()), 8 * MIB, MIB).unwrap();
        assert!(!reserve.is_spent());
        assert_eq!(storage.reserve_len().unwrap(), Some(8 * MIB));
        let reserve = Reserve::open(Arc::new(storage.clone()), 8 * MIB, MIB).unwrap();
        assert!(!reserve.is_spent());
        let reserve = Reserve::open(Arc::new(storage.clone()), 4 * MIB, MIB).unwrap();
        assert_eq!(storage.reserve_len().unwrap(), Some(4 * MIB));
        assert_eq!(reserve.size(), 4 * MIB);
        let reserve = Reserve::open(Arc::new(storage.clone()), 0, MIB).unwrap();
        assert_eq!(storage.reserve_len().unwrap(), None);
        assert!(!reserve.is_spent());
        assert!(!reserve.give_up(), "no reserve, nothing to give up");
    }

    #[test]
    fn a_reserve_is_given_up_once_and_back_only_with_room_to_spare() {
        let storage = with_capacity(100 * MIB);
        let reserve = Reserve::open(Arc::new(storage.clone()), 8 * MIB, MIB).unwrap();
        assert!(reserve.give_up());
        assert!(reserve.is_spent());
        assert_eq!(storage.reserve_len().unwrap(), None);
        assert!(!reserve.give_up(), "given up already: no more space to free");
        assert!(!reserve.restore(16 * MIB + 2 * MIB - 1, 2 * MIB), "below twice itself + min");
        assert!(reserve.is_spent());
        assert!(reserve.restore(18 * MIB, 2 * MIB));
        assert!(!reserve.is_spent());
        assert_eq!(storage.reserve_len().unwrap(), Some(8 * MIB));
        assert!(!reserve.restore(100 * MIB, 0), "held: nothing to restore");
    }

    #[test]
    fn a_store_opens_short_of_disk_when_the_reserve_does_not_fit_or_leaves_too_little() {
        // No room for it at all.
        let storage = with_capacity(4 * MIB);
        let reserve = Reserve::open(Arc::new(storage.clone()), 8 * MIB, MIB).unwrap();
        assert!(reserve.is_spent());
        assert_eq!(storage.reserve_len().unwrap(), None);
        // Room for it, but then not for the journal's first segments.
        let storage = with_capacity(10 * MIB);
        let reserve = Reserve::open(Arc::new(storage.clone()), 8 * MIB, 4 * MIB).unwrap();
        assert!(reserve.is_spent());
        assert_eq!(storage.reserve_len().unwrap(), None);
        // An existing reserve on a disk that filled up meanwhile.
        let storage = with_capacity(100 * MIB);
        drop(Reserve::open(Arc::new(storage.clone()), 8 * MIB, MIB).unwrap());
        storage.set_faults(Faults { capacity_bytes: Some(9 * MIB), ..Faults::default() });
        let reserve = Reserve::open(Arc::new(storage.clone()), 8 * MIB, 4 * MIB).unwrap();
        assert!(reserve.is_spent());
        assert_eq!(storage.free_bytes(), Some(9 * MIB));
    }
}
