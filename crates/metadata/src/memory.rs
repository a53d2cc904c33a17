//! `MemoryStore`: the in-memory [`MetadataStore`] for tests and embedding.
//!
//! All state lives in one `KvState` (a `BTreeMap` plus watchers) behind a `parking_lot`
//! mutex; every operation takes the lock once, so operations are linearizable and watch
//! events follow mutation order. Nothing is persisted.
//!
//! Several *clients* can share one key space ([`MemoryStore::peer`]), the way several
//! processes share one etcd: each client has its own session (ephemeral keys) and its own
//! watch streams, and [`MemoryStore::expire_session`] simulates the loss of a client's session
//! deterministically. Invariants: a client's session id only changes under the state lock,
//! so a `put_ephemeral` is bound either to the session before an expiry (and deleted by it)
//! or to the one after; once a client is closed, its every operation returns `Closed`, its
//! ephemeral keys are gone and its watch streams have ended, while other clients go on.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;

use crate::error::{MetadataError, Result};
use crate::key::{validate_key, validate_path, validate_prefix, validate_value};
use crate::session::{
    SessionEvent, SessionEvents, SessionId, SessionNotifier, SessionState, SessionStore,
};
use crate::state::KvState;
use crate::{ExpectedVersion, MetadataStore, Versioned, WatchStream};

/// Default queue length of each watch stream.
pub const DEFAULT_WATCH_CAPACITY: usize = 1024;

/// The key space shared by the clients of one in-memory store.
#[derive(Debug)]
struct Shared {
    state: KvState,
    /// Source of client ids and session ids (never reused).
    next_id: u64,
}

impl Shared {
    fn allocate_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }
}

/// In-memory metadata store (one client of a possibly shared key space).
#[derive(Debug)]
pub struct MemoryStore {
    shared: Arc<Mutex<Shared>>,
    /// This client's id (owner of its watch streams).
    client: u64,
    /// This client's current session; written only under the `shared` lock.
    session: AtomicU64,
    /// Set (under the `shared` lock) by `close`.
    closed: AtomicBool,
    notifier: SessionNotifier,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store whose watch streams buffer [`DEFAULT_WATCH_CAPACITY`] events.
    pub fn new() -> Self {
        Self::with_watch_capacity(DEFAULT_WATCH_CAPACITY)
    }

    /// An empty store whose watch streams buffer `capacity` events (minimum 2) before
    /// signalling `Lagged`.
    pub fn with_watch_capacity(capacity: usize) -> Self {
        let shared = Shared { state: KvState::new(capacity), next_id: 0 };
        Self::client_of(Arc::new(Mutex::new(shared)))
    }

    fn client_of(shared: Arc<Mutex<Shared>>) -> Self {
        let (client, session) = {
            let mut s = shared.lock();
            (s.allocate_id(), s.allocate_id())
        };
        MemoryStore {
            shared,
            client,
            session: AtomicU64::new(session),
            closed: AtomicBool::new(false),
            notifier: SessionNotifier::new(SessionId(session)),
        }
    }

    /// Another client of the same key space, with its own session and watch streams (like a
    /// second process connected to the same etcd). Works even after this client is closed.
    pub fn peer(&self) -> MemoryStore {
        Self::client_of(self.shared.clone())
    }

    /// Simulates the loss of this client's session (as after a partition longer than its
    /// time to live): its ephemeral keys are deleted (watchers see `Delete` events),
    /// subscribers get `SessionLost`, then a new session starts (`SessionReestablished`).
    /// Returns the new session. Fails with `Closed` after `close`.
    pub fn expire_session(&self) -> Result<SessionId> {
        let mut shared = self.shared.lock();
        if self.closed.load(Ordering::SeqCst) {
            return Err(MetadataError::Closed);
        }
        let old = SessionId(self.session.load(Ordering::SeqCst));
        shared.state.expire_session(old.0);
        let new = SessionId(shared.allocate_id());
        self.session.store(new.0, Ordering::SeqCst);
        // Published under the state lock so events follow the deletions' order.
        self.notifier.publish(SessionState::Lost, SessionEvent::SessionLost { session: old });
        self.notifier.publish(
            SessionState::Connected(new),
            SessionEvent::SessionReestablished { session: new },
        );
        Ok(new)
    }

    fn with_state<T>(&self, f: impl FnOnce(&mut KvState, u64) -> Result<T>) -> Result<T> {
        let mut shared = self.shared.lock();
        if self.closed.load(Ordering::SeqCst) {
            return Err(MetadataError::Closed);
        }
        f(&mut shared.state, self.session.load(Ordering::SeqCst))
    }
}

#[async_trait]
impl MetadataStore for MemoryStore {
    async fn get(&self, key: &str) -> Result<Option<Versioned>> {
        validate_key(key)?;
        self.with_state(|s, _| Ok(s.get(key)))
    }

    async fn put(&self, key: &str, value: Bytes, expected: ExpectedVersion) -> Result<u64> {
        validate_key(key)?;
        validate_value(key, value.len())?;
        self.with_state(|s, _| s.put(key, value, expected, None))
    }

    async fn delete(&self, key: &str, expected: ExpectedVersion) -> Result<()> {
        validate_key(key)?;
        self.with_state(|s, _| s.delete(key, expected))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        validate_prefix(prefix)?;
        self.with_state(|s, _| Ok(s.list(prefix)))
    }

    async fn list_children(&self, path: &str) -> Result<Vec<String>> {
        validate_path(path)?;
        self.with_state(|s, _| Ok(s.list_children(path)))
    }

    async fn watch(&self, prefix: &str) -> Result<WatchStream> {
        validate_prefix(prefix)?;
        self.with_state(|s, _| Ok(s.watch(prefix, self.client)))
    }

    /// Ends this client's session (deleting its ephemeral keys) and its watch streams.
    /// Other clients of the key space are not affected. Idempotent.
    async fn close(&self) -> Result<()> {
        {
            let mut shared = self.shared.lock();
            if !self.closed.swap(true, Ordering::SeqCst) {
                shared.state.expire_session(self.session.load(Ordering::SeqCst));
                // Dropping the senders ends the streams once their queues are read.
                shared.state.watchers.remove_owner(self.client);
            }
        }
        self.notifier.close();
        Ok(())
    }
}

#[async_trait]
impl SessionStore for MemoryStore {
    async fn put_ephemeral(
        &self,
        key: &str,
        value: Bytes,
        expected: ExpectedVersion,
    ) -> Result<u64> {
        validate_key(key)?;
        validate_value(key, value.len())?;
        self.with_state(|s, session| s.put(key, value, expected, Some(session)))
    }

    fn session(&self) -> SessionState {
        self.notifier.state()
    }

    fn session_events(&self) -> SessionEvents {
        self.notifier.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EventKind, WatchEvent};

    fn v() -> Bytes {
        Bytes::from_static(b"v")
    }

    #[tokio::test]
    async fn peers_share_keys_but_not_sessions_or_streams() {
        let a = MemoryStore::new();
        let b = a.peer();
        assert_ne!(a.session().id(), b.session().id());
        a.put_ephemeral("/a", v(), ExpectedVersion::Absent).await.unwrap();
        b.put_ephemeral("/b", v(), ExpectedVersion::Absent).await.unwrap();
        let mut a_watch = a.watch("/").await.unwrap();
        let mut b_watch = b.watch("/").await.unwrap();
        let mut b_events = b.session_events();

        // Expiring a's session removes only a's keys; b hears nothing about sessions.
        let new = a.expire_session().unwrap();
        assert_eq!(a.session(), SessionState::Connected(new));
        assert_eq!(b.list("/").await.unwrap(), vec!["/b"]);
        let deleted =
            WatchEvent::Changed(crate::Event { key: "/a".into(), kind: EventKind::Delete });
        assert_eq!(b_watch.try_recv(), Some(deleted));
        assert_eq!(b_events.try_recv(), None);

        // Closing a ends a's streams and nothing of b's.
        a.put_ephemeral("/a2", v(), ExpectedVersion::Absent).await.unwrap();
        a.close().await.unwrap();
        assert!(matches!(a.get("/b").await, Err(MetadataError::Closed)));
        assert!(matches!(a.expire_session(), Err(MetadataError::Closed)));
        assert!(matches!(a_watch.try_recv(), Some(WatchEvent::Changed(_)))); // /a delete
        assert!(matches!(a_watch.try_recv(), Some(WatchEvent::Changed(_)))); // /a2 put
        assert!(matches!(a_watch.try_recv(), Some(WatchEvent::Changed(_)))); // /a2 delete
        assert_eq!(a_watch.recv().await, None);
        assert_eq!(b.list("/").await.unwrap(), vec!["/b"]);
        b.put("/c", v(), ExpectedVersion::Absent).await.unwrap();
        // b saw /a2 come and go with a's session, then its own /c.
        let mut keys = Vec::new();
        while let Some(WatchEvent::Changed(e)) = b_watch.try_recv() {
            keys.push((e.key, e.kind));
        }
        assert_eq!(
            keys,
            vec![
                ("/a2".to_string(), EventKind::Put { version: 1 }),
                ("/a2".to_string(), EventKind::Delete),
                ("/c".to_string(), EventKind::Put { version: 1 }),
            ]
        );
        // A peer of a closed client still works.
        let c = a.peer();
        assert_eq!(c.list("/").await.unwrap(), vec!["/b", "/c"]);
    }
}
