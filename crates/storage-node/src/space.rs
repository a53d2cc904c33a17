//! Free disk space and read-only mode (BookKeeper's read-only bookie). Below `min_free` bytes
//! free the node refuses normal adds, so writers replace it and go on elsewhere (an ensemble
//! change, as for a failed node), and its registration says `readOnly`, so placement gives it
//! no new copies; it still serves reads, fences and recovery adds, which closing ledgers safely
//! needs. It takes adds again once twice `min_free` is free (a margin, so that it does not flap
//! around the threshold). Without this a full disk stops the journal and the node with it.
//! It is read-only too while its ledger store has given up its disk reserve (the disk filled
//! anyway: `magnetar_ledger::reserve`), whatever `min_free` is, until the reserve is back, and
//! while the operator decommissions it (`decommission.rs`): writers move off it as they would
//! off a full node, and auto-recovery copies what it holds elsewhere.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// Whether a node that is `read_only` now should be after measuring `free` bytes free, with a
/// threshold of `min_free` (0: never for want of free space measured): the ledger store's rule.
pub use magnetar_ledger::space::next_short as next_read_only;

pub struct DiskSpace {
    min_free: u64,
    /// Below `min_free` at the last measurement (with the margin).
    measured_short: AtomicBool,
    /// The ledger store short of disk (its reserve given up) at the last measurement.
    store_short: AtomicBool,
    /// Being decommissioned: read-only whatever the disk.
    decommissioned: AtomicBool,
    /// `measured_short`, `store_short` or `decommissioned`.
    read_only: AtomicBool,
    free: AtomicU64,
    changed: Notify,
}

impl DiskSpace {
    /// Starts writable with `free` bytes measured (or read-only, if that is already too few).
    pub fn new(min_free: u64, free: u64) -> Arc<DiskSpace> {
        let read_only = next_read_only(false, free, min_free);
        if read_only {
            tracing::warn!(free, min_free, "storage node starts read-only: too little free disk");
        }
        Arc::new(DiskSpace {
            min_free,
            measured_short: AtomicBool::new(read_only),
            store_short: AtomicBool::new(false),
            decommissioned: AtomicBool::new(false),
            read_only: AtomicBool::new(read_only),
            free: AtomicU64::new(free),
            changed: Notify::new(),
        })
    }

    pub fn is_read_only(&self) -> bool {
        self.read_only.load(Ordering::Acquire)
    }

    /// Free bytes at the last measurement.
    pub fn free(&self) -> u64 {
        self.free.load(Ordering::Relaxed)
    }

    /// Takes a measurement of free bytes and of whether the ledger store is short of disk
    /// (its reserve given up); wakes [`DiskSpace::changed`] waiters when the mode flips.
    pub fn observe(&self, free: u64, store_short: bool) {
        self.free.store(free, Ordering::Relaxed);
        let measured =
            next_read_only(self.measured_short.load(Ordering::Relaxed), free, self.min_free);
        self.measured_short.store(measured, Ordering::Relaxed);
        self.store_short.store(store_short, Ordering::Relaxed);
        self.settle();
    }

    /// The operator started (`true`) or called off (`false`) the node's decommissioning.
    pub fn set_decommissioned(&self, on: bool) {
        if self.decommissioned.swap(on, Ordering::AcqRel) != on {
            if on {
                tracing::warn!("storage node is being decommissioned: read-only until removed");
            } else {
                tracing::info!("storage node decommissioning called off");
            }
            self.settle();
        }
    }

    /// Sets the mode from its three causes; wakes [`DiskSpace::changed`] waiters on a flip.
    fn settle(&self) {
        let (measured, store_short, decommissioned) = (
            self.measured_short.load(Ordering::Relaxed),
            self.store_short.load(Ordering::Relaxed),
            self.decommissioned.load(Ordering::Acquire),
        );
        let now = measured || store_short || decommissioned;
        let was = self.read_only.swap(now, Ordering::AcqRel);
        if now == was {
            return;
        }
        let free = self.free();
        if now && !decommissioned {
            tracing::warn!(
                free,
                min_free = self.min_free,
                store_short,
                "storage node is read-only: disk short"
            );
        } else if !now {
            tracing::info!(free, "storage node takes adds again");
        }
        // A permit is kept if the waiter is busy (writing the registration): no flip is missed.
        self.changed.notify_one();
    }

    /// The journal could not get space before a measurement saw it short (its store is short
    /// of disk now: it marked the journal full): read-only at once rather than at the next
    /// measurement, which then goes by the store's word and, with a threshold, by its margin.
    pub fn journal_full(&self) {
        self.observe(0, true);
    }

    /// Resolves at the next change of mode (or at once, if one came since the last call). One
    /// waiter: the registration task.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    /// Measures `dir`'s file system every `every`, and asks `store_short` whether the ledger
    /// store is short of disk, until the task is aborted.
    pub fn watch(
        self: Arc<Self>,
        dir: PathBuf,
        every: Duration,
        store_short: impl Fn() -> bool + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            loop {
                ticks.tick().await;
                let measuring = dir.clone();
                let measured = tokio::task::spawn_blocking(move || {
                    magnetar_ledger::store::free_bytes(&measuring)
                })
                .await;
                match measured {
                    Ok(Some(free)) => self.observe(free, store_short()),
                    Ok(None) => tracing::warn!(dir = %dir.display(), "free disk space unknown"),
                    Err(_) => return, // the runtime is shutting down
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observing_flips_the_mode_with_the_margin() {
        let space = DiskSpace::new(100, 1_000);
        assert!(!space.is_read_only());
        space.observe(99, false);
        assert!(space.is_read_only());
        assert_eq!(space.free(), 99);
        space.observe(150, false);
        assert!(space.is_read_only());
        space.observe(200, false);
        assert!(!space.is_read_only());
        assert!(DiskSpace::new(100, 50).is_read_only());
    }

    #[test]
    fn a_store_that_gave_up_its_reserve_makes_the_node_read_only_whatever_is_free() {
        for min_free in [0, 100] {
            let space = DiskSpace::new(min_free, 1_000);
            space.observe(1_000, true);
            assert!(space.is_read_only(), "min_free {min_free}");
            space.observe(1_000, false);
            assert!(!space.is_read_only(), "min_free {min_free}");
        }
        // Short both ways: writable only when both are over.
        let space = DiskSpace::new(100, 1_000);
        space.observe(50, true);
        space.observe(150, true);
        assert!(space.is_read_only());
        space.observe(150, false);
        assert!(space.is_read_only(), "the measurement's margin still holds");
        space.observe(200, false);
        assert!(!space.is_read_only());
    }

    #[test]
    fn a_decommissioned_node_is_read_only_whatever_its_disk_until_called_off() {
        let space = DiskSpace::new(100, 1_000);
        space.set_decommissioned(true);
        assert!(space.is_read_only());
        space.observe(1_000, false);
        assert!(space.is_read_only(), "free disk does not end a decommissioning");
        space.observe(50, false);
        space.set_decommissioned(false);
        assert!(space.is_read_only(), "still short of disk");
        space.observe(200, false);
        assert!(!space.is_read_only());
    }
}
