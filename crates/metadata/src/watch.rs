//! Watch streams: bounded per-watcher queues of change events with explicit lag signalling.
//!
//! Each watcher owns a bounded tokio mpsc queue. The store dispatches events while holding its
//! state lock, so every watcher sees changes in commit order. A watcher that does not keep up
//! never blocks writers; instead the producer follows these rules (with `free` = free slots):
//!
//! * `free >= 2`: enqueue the event;
//! * `free == 1` and no unread `Lagged` marker: enqueue [`WatchEvent::Lagged`] instead of
//!   the event;
//! * otherwise: drop the event.
//!
//! Invariant: every dropped event is preceded in the queue by a `Lagged` marker that the
//! watcher has not read yet. So after reading `Lagged` the watcher re-reads the state it
//! cares about (`get` / `list`) and sees every dropped change; events after the marker may
//! repeat changes that re-read already reflects, but no change is ever silently lost.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

/// What happened to a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// The key was created or overwritten and now has this version.
    Put {
        /// The new version.
        version: u64,
    },
    /// The key was deleted.
    Delete,
}

/// One committed change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The changed key.
    pub key: String,
    /// What happened.
    pub kind: EventKind,
}

/// An item delivered by a [`WatchStream`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// A change under the watched prefix, in commit order.
    Changed(Event),
    /// The watcher fell behind and some events were dropped. Re-read the watched state now;
    /// later events are delivered normally.
    Lagged,
}

/// A stream of changes under a prefix, created by [`crate::MetadataStore::watch`].
///
/// It delivers changes committed after `watch` returned, in commit order. It ends (`recv`
/// returns `None`) once the store is closed or dropped and the buffered items are read.
/// Dropping the stream unregisters the watcher.
#[derive(Debug)]
pub struct WatchStream {
    rx: mpsc::Receiver<WatchEvent>,
    lag_pending: Arc<AtomicBool>,
    prefix: String,
}

impl WatchStream {
    /// The prefix this stream watches.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Waits for the next item; `None` when the store is closed and the queue is drained.
    pub async fn recv(&mut self) -> Option<WatchEvent> {
        let item = self.rx.recv().await;
        self.note(&item);
        item
    }

    /// Returns the next item if one is queued, without waiting. `None` means nothing is
    /// queued right now (or the stream ended).
    pub fn try_recv(&mut self) -> Option<WatchEvent> {
        let item = self.rx.try_recv().ok();
        self.note(&item);
        item
    }

    fn note(&self, item: &Option<WatchEvent>) {
        if matches!(item, Some(WatchEvent::Lagged)) {
            self.lag_pending.store(false, Ordering::SeqCst);
        }
    }
}

/// Creates a watch stream and its producer side, for store implementations outside this
/// crate (the in-process stores use it too). `capacity` is the queue length (minimum 2, one
/// slot is reserved for the `Lagged` marker).
pub fn watch_channel(prefix: &str, capacity: usize) -> (WatchSender, WatchStream) {
    let (tx, rx) = mpsc::channel(capacity.max(2));
    let lag_pending = Arc::new(AtomicBool::new(false));
    let sender = WatchSender { tx, lag_pending: lag_pending.clone() };
    (sender, WatchStream { rx, lag_pending, prefix: prefix.to_string() })
}

/// The producer side of one [`WatchStream`]: never blocks, follows the module's lag rules.
/// Dropping it ends the stream once its queue is read.
#[derive(Debug)]
pub struct WatchSender {
    tx: mpsc::Sender<WatchEvent>,
    lag_pending: Arc<AtomicBool>,
}

impl WatchSender {
    /// Queues a change, or a `Lagged` marker in its place, or drops it (see module docs).
    pub fn send(&self, key: &str, kind: EventKind) {
        let free = self.tx.capacity();
        if free >= 2 {
            let _ = self.tx.try_send(WatchEvent::Changed(Event { key: key.to_string(), kind }));
        } else if free == 1 {
            self.send_lagged();
        }
        // else: dropped; an unread Lagged marker precedes it (only a marker ever takes the
        // last free slot, so a full queue ends with one).
    }

    /// Signals that changes were lost for a reason other than this queue filling up (for
    /// example a watch that resumed from an already compacted revision). After this call an
    /// unread `Lagged` marker is in the queue, so the watcher re-reads after every change
    /// committed so far.
    pub fn send_lagged(&self) {
        if self.lag_pending.load(Ordering::SeqCst) {
            return; // an unread marker is already queued
        }
        self.lag_pending.store(true, Ordering::SeqCst);
        if self.tx.try_send(WatchEvent::Lagged).is_err() {
            // Only possible if the stream was dropped: nobody is left to tell.
            self.lag_pending.store(false, Ordering::SeqCst);
        }
    }

    /// True once the stream was dropped (the producer can stop).
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Waits until the stream is dropped.
    pub async fn closed(&self) {
        self.tx.closed().await
    }
}

/// The producer side of one watcher of an in-process store.
#[derive(Debug)]
struct WatcherSlot {
    prefix: String,
    /// Which store client registered it (a `MemoryStore` peer ends only its own streams).
    owner: u64,
    sender: WatchSender,
}

/// All registered watchers of a store. Lives inside the store's state lock.
#[derive(Debug)]
pub(crate) struct Watchers {
    slots: Vec<WatcherSlot>,
    capacity: usize,
}

impl Watchers {
    /// `capacity` is the queue length of each watcher; values below 2 are raised to 2 (one
    /// slot is reserved for the `Lagged` marker).
    pub(crate) fn new(capacity: usize) -> Self {
        Watchers { slots: Vec::new(), capacity: capacity.max(2) }
    }

    pub(crate) fn register(&mut self, prefix: &str, owner: u64) -> WatchStream {
        let (sender, stream) = watch_channel(prefix, self.capacity);
        self.slots.push(WatcherSlot { prefix: prefix.to_string(), owner, sender });
        stream
    }

    /// Ends the streams registered by `owner` (their queued items stay readable).
    pub(crate) fn remove_owner(&mut self, owner: u64) {
        self.slots.retain(|slot| slot.owner != owner);
    }

    /// Delivers one committed change to every interested watcher (see module docs).
    pub(crate) fn dispatch(&mut self, key: &str, kind: EventKind) {
        self.slots.retain(|slot| !slot.sender.is_closed());
        for slot in &self.slots {
            if key.starts_with(&slot.prefix) {
                slot.sender.send(key, kind);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forced_lag_is_queued_once_and_survives_a_full_queue() {
        let (tx, mut rx) = watch_channel("/", 3);
        tx.send("/a", EventKind::Delete);
        tx.send_lagged();
        tx.send_lagged(); // already pending: no second marker
        tx.send("/b", EventKind::Delete); // one free slot left: a marker is pending, dropped
        assert!(matches!(rx.try_recv(), Some(WatchEvent::Changed(_))));
        assert_eq!(rx.try_recv(), Some(WatchEvent::Lagged));
        assert_eq!(rx.try_recv(), None);
        tx.send("/c", EventKind::Delete);
        assert!(matches!(rx.try_recv(), Some(WatchEvent::Changed(_))));
        drop(tx);
        assert_eq!(rx.try_recv(), None);
    }
}
