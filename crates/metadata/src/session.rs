//! Sessions: ephemeral keys bound to a store client's lifetime, and session events.
//!
//! A *session* is what etcd calls a lease and ZooKeeper a session: it belongs to one store
//! client (one process), stays alive while that client keeps it alive, and every key written
//! with [`SessionStore::put_ephemeral`] is deleted when the session ends, whether the client
//! closes it, the client loses contact with the store for longer than the session's time to
//! live, or the store side expires it. A lost session is never revived: the client starts a
//! new one (a new [`SessionId`]) and must re-create the ephemeral keys it still wants.
//!
//! Invariants:
//! * a [`SessionId`] is used for one session only; ids of one store client increase;
//! * every subscriber of [`SessionEvents`] sees the events of its store in the order they
//!   happened, or an explicit [`SessionEvent::Lagged`] in place of events it missed;
//! * `SessionLost { session: s }` is published before any `SessionReestablished` with a
//!   newer id, and no `put_ephemeral` bound to `s` succeeds after `SessionLost { s }` is
//!   published (a remote store may still be applying one then: it fails with
//!   `SessionExpired`, and its key goes with the session).

use std::fmt;

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::broadcast;

use crate::error::Result;
use crate::{ExpectedVersion, MetadataStore};

/// Queue length of each [`SessionEvents`] subscriber before it reads [`SessionEvent::Lagged`].
pub const SESSION_EVENTS_CAPACITY: usize = 64;

/// Identifies one session (an etcd lease id, or a counter for the in-process stores).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SessionId(pub u64);

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "session {:#x}", self.0)
    }
}

/// Where a store client's session stands right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionState {
    /// The session is alive and the client is in contact with the store.
    Connected(SessionId),
    /// The client lost contact with the store; the session may still be alive there (its
    /// ephemeral keys still exist) until its time to live runs out.
    Disconnected(SessionId),
    /// The last session ended (its ephemeral keys are gone or about to go) and no new one
    /// exists yet. `put_ephemeral` fails with `SessionExpired` meanwhile.
    Lost,
    /// The store was closed.
    Closed,
}

impl SessionState {
    /// The live session, if any (connected or not).
    pub fn id(self) -> Option<SessionId> {
        match self {
            SessionState::Connected(id) | SessionState::Disconnected(id) => Some(id),
            SessionState::Lost | SessionState::Closed => None,
        }
    }
}

/// A change of a store client's session, as published by [`SessionStore::session_events`].
///
/// Modelled on Pulsar's `SessionEvent`. A typical owner of ephemeral keys (a lock, a broker
/// registration) treats `ConnectionLost` as "stop starting new work that relies on the
/// keys", `SessionLost` as "the keys are gone: give up what they guarded", and
/// `SessionReestablished` / `Lagged` as "re-create or re-validate the keys".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEvent {
    /// Contact with the store was lost; the session may still be alive.
    ConnectionLost {
        /// The session at the time.
        session: SessionId,
    },
    /// Contact came back before the session expired: its ephemeral keys still exist.
    Reconnected {
        /// The session, unchanged.
        session: SessionId,
    },
    /// The session ended (expired or revoked); its ephemeral keys are deleted (or will be,
    /// once the store notices the expiry) and it will never be used again.
    SessionLost {
        /// The lost session.
        session: SessionId,
    },
    /// A new session started after `SessionLost`. Ephemeral keys of the old session are not
    /// re-created automatically.
    SessionReestablished {
        /// The new session.
        session: SessionId,
    },
    /// This subscriber fell more than [`SESSION_EVENTS_CAPACITY`] events behind and missed
    /// some. Read [`SessionStore::session`] and re-validate everything bound to the session.
    Lagged,
}

/// A subscription to a store client's session events (see [`SessionEvent`]).
///
/// Carries the events published after it was created, in order. Ends (`recv` returns `None`)
/// once the store is closed.
#[derive(Debug)]
pub struct SessionEvents {
    rx: broadcast::Receiver<SessionEvent>,
}

impl SessionEvents {
    /// Waits for the next event; `None` once the store is closed.
    pub async fn recv(&mut self) -> Option<SessionEvent> {
        match self.rx.recv().await {
            Ok(event) => Some(event),
            Err(broadcast::error::RecvError::Lagged(_)) => Some(SessionEvent::Lagged),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }

    /// The next event if one is queued, without waiting.
    pub fn try_recv(&mut self) -> Option<SessionEvent> {
        match self.rx.try_recv() {
            Ok(event) => Some(event),
            Err(broadcast::error::TryRecvError::Lagged(_)) => Some(SessionEvent::Lagged),
            Err(_) => None,
        }
    }
}

/// Building block for store implementations: holds a client's [`SessionState`] and
/// publishes [`SessionEvent`]s to every subscriber. State and events change together under
/// one lock, so a subscriber that reads `state()` after an event never sees an older state.
#[derive(Debug)]
pub struct SessionNotifier {
    inner: Mutex<NotifierInner>,
}

#[derive(Debug)]
struct NotifierInner {
    state: SessionState,
    /// `None` once closed, which ends every subscription.
    tx: Option<broadcast::Sender<SessionEvent>>,
}

impl SessionNotifier {
    /// A notifier whose session `initial` is connected.
    pub fn new(initial: SessionId) -> Self {
        let (tx, _) = broadcast::channel(SESSION_EVENTS_CAPACITY);
        SessionNotifier {
            inner: Mutex::new(NotifierInner {
                state: SessionState::Connected(initial),
                tx: Some(tx),
            }),
        }
    }

    /// The current state.
    pub fn state(&self) -> SessionState {
        self.inner.lock().state
    }

    /// A new subscription (an ended one after `close`).
    pub fn subscribe(&self) -> SessionEvents {
        let inner = self.inner.lock();
        match &inner.tx {
            Some(tx) => SessionEvents { rx: tx.subscribe() },
            None => {
                let (tx, rx) = broadcast::channel(1);
                drop(tx);
                SessionEvents { rx }
            }
        }
    }

    /// Moves to `state` and publishes `event` (ignored once closed). Returns false when the
    /// notifier is closed.
    pub fn publish(&self, state: SessionState, event: SessionEvent) -> bool {
        let mut inner = self.inner.lock();
        let Some(tx) = &inner.tx else { return false };
        // No subscriber is fine: the event is simply not seen by anyone.
        let _ = tx.send(event);
        inner.state = state;
        true
    }

    /// Moves to [`SessionState::Closed`] and ends every subscription. Idempotent.
    pub fn close(&self) {
        let mut inner = self.inner.lock();
        inner.tx = None;
        inner.state = SessionState::Closed;
    }
}

/// A [`MetadataStore`] with sessions: ephemeral keys and session events.
///
/// A separate trait (rather than new `MetadataStore` methods) so that wrappers and stores
/// without sessions keep compiling; every store in this crate implements it. Semantics (see
/// the crate docs, checked by the conformance suite):
/// * `put_ephemeral` is `put` (same versions, same compare-and-set, same errors) that also
///   binds the key to the client's current session. A later plain `put` unbinds it again
///   (the key becomes persistent); a later `put_ephemeral` keeps it bound (to the then
///   current session). `delete` works on ephemeral keys like on any other.
/// * When the session ends, every key still bound to it is deleted; watchers see ordinary
///   `Delete` events.
/// * `close` ends the session: the client's ephemeral keys are deleted.
#[async_trait]
pub trait SessionStore: MetadataStore {
    /// Writes `value` if the key's version satisfies `expected` and binds the key to the
    /// current session; returns the new version. Errors: those of `put`, plus
    /// `SessionExpired` when there is no live session right now (between `SessionLost` and
    /// `SessionReestablished`) or the session ended before the write applied.
    async fn put_ephemeral(
        &self,
        key: &str,
        value: Bytes,
        expected: ExpectedVersion,
    ) -> Result<u64>;

    /// The client's session right now.
    fn session(&self) -> SessionState;

    /// Subscribes to the session events published from now on.
    fn session_events(&self) -> SessionEvents;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn subscribers_see_events_in_order_and_end_on_close() {
        let n = SessionNotifier::new(SessionId(1));
        let mut early = n.subscribe();
        assert_eq!(n.state(), SessionState::Connected(SessionId(1)));
        assert!(n.publish(SessionState::Lost, SessionEvent::SessionLost { session: SessionId(1) }));
        let mut late = n.subscribe();
        let re = SessionEvent::SessionReestablished { session: SessionId(2) };
        assert!(n.publish(SessionState::Connected(SessionId(2)), re));
        assert_eq!(early.recv().await, Some(SessionEvent::SessionLost { session: SessionId(1) }));
        assert_eq!(early.recv().await, Some(re));
        assert_eq!(late.recv().await, Some(re), "a subscription starts at its creation");
        n.close();
        assert_eq!(early.recv().await, None);
        assert_eq!(n.subscribe().recv().await, None);
        assert!(!n.publish(SessionState::Lost, SessionEvent::Lagged));
        assert_eq!(n.state(), SessionState::Closed);
    }

    #[tokio::test]
    async fn a_slow_subscriber_reads_lagged() {
        let n = SessionNotifier::new(SessionId(1));
        let mut slow = n.subscribe();
        for i in 0..(SESSION_EVENTS_CAPACITY as u64 + 5) {
            let event = SessionEvent::ConnectionLost { session: SessionId(i) };
            n.publish(SessionState::Disconnected(SessionId(i)), event);
        }
        assert_eq!(slow.try_recv(), Some(SessionEvent::Lagged));
        assert!(matches!(slow.try_recv(), Some(SessionEvent::ConnectionLost { .. })));
    }
}
