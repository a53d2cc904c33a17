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

/// The producer side of one watcher.
#[derive(Debug)]
struct WatcherSlot {
    prefix: String,
    tx: mpsc::Sender<WatchEvent>,
    lag_pending: Arc<AtomicBool>,
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

    pub(crate) fn register(&mut self, prefix: &str) -> WatchStream {
        let (tx, rx) = mpsc::channel(self.capacity);
        let lag_pending = Arc::new(AtomicBool::new(false));
        self.slots.push(WatcherSlot {
            prefix: prefix.to_string(),
            tx,
            lag_pending: lag_pending.clone(),
        });
        WatchStream { rx, lag_pending, prefix: prefix.to_string() }
    }

    /// Delivers one committed change to every interested watcher (see module docs).
    pub(crate) fn dispatch(&mut self, key: &str, kind: EventKind) {
        self.slots.retain(|slot| !slot.tx.is_closed());
        for slot in &self.slots {
            if !key.starts_with(&slot.prefix) {
                continue;
            }
            let free = slot.tx.capacity();
            if free >= 2 {
                let _ = slot.tx.try_send(WatchEvent::Changed(Event { key: key.to_string(), kind }));
            } else if free == 1 && !slot.lag_pending.load(Ordering::SeqCst) {
                slot.lag_pending.store(true, Ordering::SeqCst);
                if slot.tx.try_send(WatchEvent::Lagged).is_err() {
                    // Cannot happen (we are the only producer and saw a free slot), but if it
                    // did, leave the flag clear so the next event retries the marker.
                    slot.lag_pending.store(false, Ordering::SeqCst);
                }
            }
            // else: dropped; an unread Lagged marker precedes it.
        }
    }
}
