//! The conformance suite every [`MetadataStore`] / [`SessionStore`] implementation passes.
//!
//! Enabled by the `conformance` feature. Each case is a public async fn over a [`Subject`]
//! (a fresh store plus [`Hooks`] that let the suite drive what the trait cannot: wait for a
//! remote store's watch events, expire a session, open a second client). The
//! [`conformance_tests!`](crate::conformance_tests) macro instantiates every case as a
//! `#[tokio::test]` for one implementation; `tests/it/conformance.rs` does so for `MemoryStore`
//! and `EmbeddedStore`, and `magnetar-metadata-etcd` for `EtcdStore` on 1- and 3-node etcd.
//!
//! Invariants checked: CAS and version semantics, delete semantics, list / list_children,
//! key validation, watch order / filtering / lag signalling, close, exactly one winner per
//! version under concurrent CAS, and sessions: ephemeral keys follow put's rules, vanish when
//! the session expires or the store closes (and only those keys), session events arrive in
//! order with a fresh session id. Every wait is bounded by `tokio::time::timeout`; there are
//! no sleeps.

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::time::timeout;

use crate::{
    Event, EventKind, ExpectedVersion, MetadataError, MetadataStore, SessionEvent, SessionState,
    SessionStore, WatchEvent, WatchStream, MAX_KEY_LEN, MAX_VALUE_LEN,
};

/// Watch queue length every factory must configure, small so the lag cases are cheap.
pub const WATCH_CAPACITY: usize = 8;
/// Bound on every single wait of the suite.
pub const WAIT: Duration = Duration::from_secs(20);
/// Bound on one whole case.
pub const CASE_TIMEOUT: Duration = Duration::from_secs(120);

/// What the suite needs from an implementation beyond the traits.
#[async_trait]
pub trait Hooks: Send + Sync {
    /// Waits until every watch stream of the subject holds (or has dropped behind a `Lagged`
    /// marker) the events of every write the subject made so far. In-process stores queue
    /// events before a write returns, so the default does nothing.
    async fn settle(&self) {}

    /// Ends the subject's current session as if it had expired (a new one must follow).
    async fn expire_session(&self);

    /// Called after the subject was closed: a client of the same key space (a peer, a
    /// reopened directory, a new connection).
    async fn observer(&self) -> Arc<dyn MetadataStore>;
}

/// A store under test (fresh and empty, watch capacity [`WATCH_CAPACITY`]) and its hooks.
pub struct Subject {
    /// The store.
    pub store: Arc<dyn SessionStore>,
    /// Its hooks.
    pub hooks: Box<dyn Hooks>,
}

impl Subject {
    /// The store as a plain [`MetadataStore`].
    pub fn kv(&self) -> Arc<dyn MetadataStore> {
        self.store.clone()
    }
}

/// Creates a fresh subject, or `None` when the implementation cannot run here (the etcd
/// store without an etcd binary): the case is then skipped.
pub type Factory = fn() -> Pin<Box<dyn Future<Output = Option<Subject>>>>;

/// A conformance case.
pub type Case = for<'a> fn(&'a Subject) -> Pin<Box<dyn Future<Output = ()> + 'a>>;

/// Runs one case against a fresh subject from `factory`, bounded in time, then closes it.
pub async fn run_case(factory: Factory, case: Case) {
    let Some(subject) = factory().await else { return };
    timeout(CASE_TIMEOUT, case(&subject)).await.expect("conformance case timed out");
    timeout(WAIT, subject.store.close()).await.expect("close timed out").expect("close");
}

/// Instantiates every conformance case as a `#[tokio::test]` in module `$module`, each run
/// against a fresh subject from `$factory` (a [`Factory`]). The calling crate needs `tokio`
/// with the `macros` and `rt-multi-thread` features.
#[macro_export]
macro_rules! conformance_tests {
    ($module:ident, $factory:path) => {
        mod $module {
            $crate::conformance_tests!(@cases $factory;
                versions_start_at_one_and_increment,
                cas_absent,
                cas_exactly,
                delete_semantics,
                list_by_prefix,
                get_many_answers_each_key_in_order,
                list_children_like_zookeeper,
                invalid_keys_are_typed_errors,
                value_size_limit,
                watch_delivers_changes_in_order,
                several_watchers_see_the_same_order,
                watch_lag_is_signalled_and_recovers,
                concurrent_cas_has_one_winner_per_version,
                concurrent_create_and_update_stampede,
                close_ends_watches_and_rejects_calls,
                store_is_object_safe_and_shareable,
                ephemeral_put_follows_put_semantics,
                ephemeral_keys_vanish_when_the_session_expires,
                ephemeral_keys_vanish_when_the_store_closes,
                put_ephemeral_rejects_bad_input_and_closed_store,
            );
        }
    };
    (@cases $factory:path; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                $crate::conformance::run_case($factory, |s| {
                    Box::pin($crate::conformance::$name(s))
                })
                .await;
            }
        )*
    };
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

async fn next(w: &mut WatchStream) -> WatchEvent {
    timeout(WAIT, w.recv())
        .await
        .expect("timed out waiting for a watch event")
        .expect("watch stream ended")
}

fn changed(key: &str, kind: EventKind) -> WatchEvent {
    WatchEvent::Changed(Event { key: key.to_string(), kind })
}

fn put_ev(key: &str, version: u64) -> WatchEvent {
    changed(key, EventKind::Put { version })
}

async fn next_session_event(events: &mut crate::SessionEvents) -> SessionEvent {
    timeout(WAIT, events.recv())
        .await
        .expect("timed out waiting for a session event")
        .expect("session events ended")
}

// ---------------------------------------------------------------- key-value cases

/// Conformance case `versions_start_at_one_and_increment`.
pub async fn versions_start_at_one_and_increment(t: &Subject) {
    let s = t.kv();
    assert_eq!(s.get("/a").await.unwrap(), None);
    assert_eq!(s.put("/a", b("x"), ExpectedVersion::Any).await.unwrap(), 1);
    assert_eq!(s.put("/a", b("y"), ExpectedVersion::Any).await.unwrap(), 2);
    assert_eq!(s.put("/a", b("z"), ExpectedVersion::Any).await.unwrap(), 3);
    let v = s.get("/a").await.unwrap().expect("present");
    assert_eq!((v.value, v.version), (b("z"), 3));
    // Versions are per key.
    assert_eq!(s.put("/b", b("x"), ExpectedVersion::Any).await.unwrap(), 1);
    // Empty and binary values round-trip.
    s.put("/empty", Bytes::new(), ExpectedVersion::Any).await.unwrap();
    assert_eq!(s.get("/empty").await.unwrap().unwrap().value, Bytes::new());
    let bin: Vec<u8> = (0..=255u8).collect();
    s.put("/bin", Bytes::from(bin.clone()), ExpectedVersion::Any).await.unwrap();
    assert_eq!(&s.get("/bin").await.unwrap().unwrap().value[..], &bin[..]);
}

/// Conformance case `cas_absent`.
pub async fn cas_absent(t: &Subject) {
    let s = t.kv();
    assert_eq!(s.put("/c", b("1"), ExpectedVersion::Absent).await.unwrap(), 1);
    match s.put("/c", b("2"), ExpectedVersion::Absent).await {
        Err(MetadataError::BadVersion { key, expected, actual }) => {
            assert_eq!(key, "/c");
            assert_eq!(expected, ExpectedVersion::Absent);
            assert_eq!(actual, Some(1));
        }
        other => panic!("expected BadVersion, got {other:?}"),
    }
    let v = s.get("/c").await.unwrap().unwrap();
    assert_eq!((v.value, v.version), (b("1"), 1), "failed CAS must not write");
}

/// Conformance case `cas_exactly`.
pub async fn cas_exactly(t: &Subject) {
    let s = t.kv();
    match s.put("/e", b("1"), ExpectedVersion::Exactly(1)).await {
        Err(MetadataError::BadVersion { actual, .. }) => assert_eq!(actual, None),
        other => panic!("expected BadVersion on absent key, got {other:?}"),
    }
    assert_eq!(s.get("/e").await.unwrap(), None);
    s.put("/e", b("1"), ExpectedVersion::Absent).await.unwrap();
    assert_eq!(s.put("/e", b("2"), ExpectedVersion::Exactly(1)).await.unwrap(), 2);
    for stale in [0, 1, 3, u64::MAX] {
        match s.put("/e", b("bad"), ExpectedVersion::Exactly(stale)).await {
            Err(MetadataError::BadVersion { expected, actual, .. }) => {
                assert_eq!(expected, ExpectedVersion::Exactly(stale));
                assert_eq!(actual, Some(2));
            }
            other => panic!("expected BadVersion for {stale}, got {other:?}"),
        }
    }
    let v = s.get("/e").await.unwrap().unwrap();
    assert_eq!((v.value, v.version), (b("2"), 2));
}

/// Conformance case `delete_semantics`.
pub async fn delete_semantics(t: &Subject) {
    let s = t.kv();
    for expected in [ExpectedVersion::Any, ExpectedVersion::Absent, ExpectedVersion::Exactly(1)] {
        let err = s.delete("/d", expected).await.unwrap_err();
        assert!(err.is_not_found(), "absent key with {expected}: {err:?}");
    }
    s.put("/d", b("1"), ExpectedVersion::Any).await.unwrap();
    s.put("/d", b("2"), ExpectedVersion::Any).await.unwrap();
    for expected in [ExpectedVersion::Absent, ExpectedVersion::Exactly(1)] {
        match s.delete("/d", expected).await {
            Err(MetadataError::BadVersion { actual, .. }) => assert_eq!(actual, Some(2)),
            other => panic!("expected BadVersion for {expected}, got {other:?}"),
        }
    }
    assert_eq!(s.get("/d").await.unwrap().unwrap().version, 2);
    s.delete("/d", ExpectedVersion::Exactly(2)).await.unwrap();
    assert_eq!(s.get("/d").await.unwrap(), None);
    assert!(s.delete("/d", ExpectedVersion::Any).await.unwrap_err().is_not_found());
    // Re-creation restarts the version at 1.
    assert_eq!(s.put("/d", b("3"), ExpectedVersion::Absent).await.unwrap(), 1);
    s.delete("/d", ExpectedVersion::Any).await.unwrap();
    assert_eq!(s.list("/").await.unwrap(), Vec::<String>::new());
}

/// Conformance case `list_by_prefix`.
pub async fn list_by_prefix(t: &Subject) {
    let s = t.kv();
    for k in ["/t/a", "/t/b/c", "/t/b/d", "/tz", "/u", "/t/a!"] {
        s.put(k, b("v"), ExpectedVersion::Any).await.unwrap();
    }
    assert_eq!(s.list("/t/").await.unwrap(), vec!["/t/a", "/t/a!", "/t/b/c", "/t/b/d"]);
    assert_eq!(s.list("/t").await.unwrap(), vec!["/t/a", "/t/a!", "/t/b/c", "/t/b/d", "/tz"]);
    assert_eq!(s.list("/t/b/c").await.unwrap(), vec!["/t/b/c"]);
    assert_eq!(s.list("/").await.unwrap().len(), 6);
    assert!(s.list("/nothing").await.unwrap().is_empty());
    s.delete("/t/b/c", ExpectedVersion::Any).await.unwrap();
    assert_eq!(s.list("/t/b").await.unwrap(), vec!["/t/b/d"]);
}

/// Conformance case `get_many_answers_each_key_in_order`.
pub async fn get_many_answers_each_key_in_order(t: &Subject) {
    let s = t.kv();
    s.put("/m/a", b("1"), ExpectedVersion::Any).await.unwrap();
    s.put("/m/c", b("3"), ExpectedVersion::Any).await.unwrap();
    s.put("/m/c", b("33"), ExpectedVersion::Any).await.unwrap();
    let keys: Vec<String> = ["/m/c", "/m/b", "/m/a"].iter().map(|k| k.to_string()).collect();
    let found = s.get_many(&keys).await.unwrap();
    assert_eq!(found.len(), 3);
    let c = found[0].as_ref().expect("/m/c");
    assert_eq!((&c.value[..], c.version), (&b"33"[..], 2));
    assert!(found[1].is_none());
    assert_eq!(&found[2].as_ref().expect("/m/a").value[..], b"1");
    assert!(s.get_many(&[]).await.unwrap().is_empty());
    // More keys than one etcd transaction takes.
    let many: Vec<String> = (0..150).map(|i| format!("/m/many/{i}")).collect();
    s.put("/m/many/149", b("last"), ExpectedVersion::Any).await.unwrap();
    let found = s.get_many(&many).await.unwrap();
    assert_eq!(found.len(), 150);
    assert!(found[..149].iter().all(Option::is_none));
    assert_eq!(&found[149].as_ref().expect("the last").value[..], b"last");
    assert!(matches!(
        s.get_many(&["bad key".to_string()]).await,
        Err(MetadataError::InvalidKey { .. })
    ));
}

/// Conformance case `list_children_like_zookeeper`.
pub async fn list_children_like_zookeeper(t: &Subject) {
    let s = t.kv();
    for k in [
        "/topics/public/default/t1",
        "/topics/public/default/t2",
        "/topics/public/other/t3",
        "/topics/public",
        "/topics/public!odd/x",
        "/schemas/s1",
    ] {
        s.put(k, b("v"), ExpectedVersion::Any).await.unwrap();
    }
    assert_eq!(s.list_children("/").await.unwrap(), vec!["schemas", "topics"]);
    assert_eq!(s.list_children("/topics").await.unwrap(), vec!["public", "public!odd"]);
    assert_eq!(s.list_children("/topics/public").await.unwrap(), vec!["default", "other"]);
    assert_eq!(s.list_children("/topics/public/default").await.unwrap(), vec!["t1", "t2"]);
    assert!(s.list_children("/topics/public/default/t1").await.unwrap().is_empty());
    assert!(s.list_children("/missing").await.unwrap().is_empty());
    s.delete("/topics/public/default/t1", ExpectedVersion::Any).await.unwrap();
    assert_eq!(s.list_children("/topics/public/default").await.unwrap(), vec!["t2"]);
}

fn assert_invalid<T: std::fmt::Debug>(r: Result<T, MetadataError>, what: &str) {
    match r {
        Err(MetadataError::InvalidKey { .. }) => {}
        other => panic!("{what}: expected InvalidKey, got {other:?}"),
    }
}

/// Conformance case `invalid_keys_are_typed_errors`.
pub async fn invalid_keys_are_typed_errors(t: &Subject) {
    let s = t.kv();
    let long = format!("/{}", "k".repeat(MAX_KEY_LEN));
    let bad_keys =
        ["", "a", "a/b", "/", "/a/", "//a", "/a//b", "/a/./b", "/a/../b", "/a\0b", &long];
    for k in bad_keys {
        assert_invalid(s.get(k).await, &format!("get {k:?}"));
        assert_invalid(s.put(k, b("v"), ExpectedVersion::Any).await, &format!("put {k:?}"));
        assert_invalid(s.delete(k, ExpectedVersion::Any).await, &format!("delete {k:?}"));
    }
    for p in ["", "a", "/a/", "//", &long] {
        assert_invalid(s.list_children(p).await, &format!("list_children {p:?}"));
    }
    for p in ["", "x", "/\0", &long] {
        assert_invalid(s.list(p).await, &format!("list {p:?}"));
        assert_invalid(s.watch(p).await, &format!("watch {p:?}"));
    }
    assert!(s.list("/").await.unwrap().is_empty(), "nothing was written");
}

/// Conformance case `value_size_limit`.
pub async fn value_size_limit(t: &Subject) {
    let s = t.kv();
    let big = Bytes::from(vec![7u8; MAX_VALUE_LEN + 1]);
    match s.put("/big", big, ExpectedVersion::Any).await {
        Err(MetadataError::ValueTooLarge { len, max, .. }) => {
            assert_eq!((len, max), (MAX_VALUE_LEN + 1, MAX_VALUE_LEN))
        }
        other => panic!("expected ValueTooLarge, got {other:?}"),
    }
    assert_eq!(s.get("/big").await.unwrap(), None);
    // A schema-sized value (3 MiB) is fine.
    let schema = Bytes::from(vec![3u8; 3 << 20]);
    s.put("/big", schema.clone(), ExpectedVersion::Any).await.unwrap();
    assert_eq!(s.get("/big").await.unwrap().unwrap().value, schema);
}

/// Conformance case `watch_delivers_changes_in_order`.
pub async fn watch_delivers_changes_in_order(t: &Subject) {
    let s = t.kv();
    s.put("/w/before", b("0"), ExpectedVersion::Any).await.unwrap();
    let mut w = s.watch("/w/").await.unwrap();
    assert_eq!(w.prefix(), "/w/");
    assert_eq!(w.try_recv(), None, "changes before watch() are not delivered");

    s.put("/w/a", b("1"), ExpectedVersion::Any).await.unwrap();
    s.put("/other", b("1"), ExpectedVersion::Any).await.unwrap();
    s.put("/w", b("1"), ExpectedVersion::Any).await.unwrap(); // not under "/w/"
    s.put("/w/a", b("2"), ExpectedVersion::Exactly(1)).await.unwrap();
    // Failed writes produce no event.
    assert!(s.put("/w/a", b("x"), ExpectedVersion::Exactly(1)).await.is_err());
    assert!(s.delete("/w/missing", ExpectedVersion::Any).await.is_err());
    s.put("/w/b/c", b("1"), ExpectedVersion::Any).await.unwrap();
    s.delete("/w/a", ExpectedVersion::Any).await.unwrap();
    s.delete("/w/before", ExpectedVersion::Exactly(1)).await.unwrap();

    let expected = vec![
        put_ev("/w/a", 1),
        put_ev("/w/a", 2),
        put_ev("/w/b/c", 1),
        changed("/w/a", EventKind::Delete),
        changed("/w/before", EventKind::Delete),
    ];
    let mut got = Vec::new();
    for _ in 0..expected.len() {
        got.push(next(&mut w).await);
    }
    assert_eq!(got, expected);
    // Nothing else is pending (in-process stores queue a write's event before the write
    // returns; `settle` waits for a remote store's).
    t.hooks.settle().await;
    assert_eq!(w.try_recv(), None);
}

/// Conformance case `several_watchers_see_the_same_order`.
pub async fn several_watchers_see_the_same_order(t: &Subject) {
    let s = t.kv();
    let mut all = s.watch("/").await.unwrap();
    let mut narrow = s.watch("/x/1").await.unwrap();
    let writers: Vec<_> = (0..4)
        .map(|t| {
            let s = s.clone();
            tokio::spawn(async move {
                for i in 0..3 {
                    s.put(&format!("/x/{t}/{i}"), b("v"), ExpectedVersion::Any).await.unwrap();
                }
            })
        })
        .collect();
    for h in writers {
        timeout(WAIT, h).await.unwrap().unwrap();
    }
    t.hooks.settle().await;
    // 12 events exceed the queue of 8: the broad watcher must see a prefix in order, then
    // Lagged; the narrow watcher (3 events) sees all of its own.
    let mut seen = Vec::new();
    while let WatchEvent::Changed(e) = next(&mut all).await {
        seen.push(e.key);
    }
    assert_eq!(seen.len(), WATCH_CAPACITY - 1);
    let mut narrow_seen = Vec::new();
    for _ in 0..3 {
        match next(&mut narrow).await {
            WatchEvent::Changed(e) => narrow_seen.push(e.key),
            WatchEvent::Lagged => panic!("narrow watcher must not lag"),
        }
    }
    assert_eq!(narrow_seen, vec!["/x/1/0", "/x/1/1", "/x/1/2"]);
    // Both watchers agree on the relative order of the events they share.
    let shared: Vec<_> = seen.iter().filter(|k| k.starts_with("/x/1/")).cloned().collect();
    assert_eq!(shared, narrow_seen[..shared.len()].to_vec());
}

/// Conformance case `watch_lag_is_signalled_and_recovers`.
pub async fn watch_lag_is_signalled_and_recovers(t: &Subject) {
    let s = t.kv();
    let mut w = s.watch("/lag/").await.unwrap();
    let total = 3 * WATCH_CAPACITY as u64;
    for i in 1..=total {
        assert_eq!(s.put("/lag/k", b("v"), ExpectedVersion::Any).await.unwrap(), i);
    }
    t.hooks.settle().await;
    // A prefix of the changes in order, then exactly one Lagged marker, then nothing.
    let mut versions = Vec::new();
    loop {
        match next(&mut w).await {
            WatchEvent::Changed(Event { kind: EventKind::Put { version }, .. }) => {
                versions.push(version)
            }
            WatchEvent::Changed(e) => panic!("unexpected {e:?}"),
            WatchEvent::Lagged => break,
        }
    }
    assert!(!versions.is_empty() && (versions.len() as u64) < total);
    assert_eq!(versions, (1..=versions.len() as u64).collect::<Vec<_>>());
    assert_eq!(w.try_recv(), None, "only one Lagged marker");
    // The watcher re-reads and sees the latest state...
    assert_eq!(s.get("/lag/k").await.unwrap().unwrap().version, total);
    // ...and later changes are delivered again.
    s.put("/lag/k", b("v"), ExpectedVersion::Any).await.unwrap();
    assert_eq!(next(&mut w).await, put_ev("/lag/k", total + 1));
    // Dropping a watcher does not disturb writers or other watchers.
    let mut w2 = s.watch("/lag/").await.unwrap();
    drop(w);
    s.delete("/lag/k", ExpectedVersion::Any).await.unwrap();
    assert_eq!(next(&mut w2).await, changed("/lag/k", EventKind::Delete));
}

/// Conformance case `concurrent_cas_has_one_winner_per_version`.
pub async fn concurrent_cas_has_one_winner_per_version(t: &Subject) {
    let s = t.kv();
    const TASKS: usize = 8;
    const INCREMENTS: usize = 15;
    s.put("/counter", b("0"), ExpectedVersion::Absent).await.unwrap();
    let handles: Vec<_> = (0..TASKS)
        .map(|_| {
            let s = s.clone();
            tokio::spawn(async move {
                let mut won = Vec::new();
                let mut conflicts = 0u64;
                while won.len() < INCREMENTS {
                    let cur = s.get("/counter").await.unwrap().unwrap();
                    let n: u64 = std::str::from_utf8(&cur.value).unwrap().parse().unwrap();
                    match s
                        .put(
                            "/counter",
                            b(&(n + 1).to_string()),
                            ExpectedVersion::Exactly(cur.version),
                        )
                        .await
                    {
                        Ok(v) => {
                            assert_eq!(v, cur.version + 1);
                            won.push(v);
                        }
                        Err(MetadataError::BadVersion { actual, .. }) => {
                            assert!(actual > Some(cur.version));
                            conflicts += 1;
                        }
                        Err(e) => panic!("unexpected {e:?}"),
                    }
                }
                (won, conflicts)
            })
        })
        .collect();
    let mut all = Vec::new();
    for h in handles {
        let (won, _conflicts) = timeout(WAIT * 3, h).await.unwrap().unwrap();
        all.extend(won);
    }
    all.sort_unstable();
    let n = (TASKS * INCREMENTS) as u64;
    assert_eq!(all, (2..=n + 1).collect::<Vec<_>>(), "one winner per version");
    let v = s.get("/counter").await.unwrap().unwrap();
    assert_eq!(v.version, n + 1);
    assert_eq!(v.value, b(&n.to_string()), "no lost update");
}

/// Conformance case `concurrent_create_and_update_stampede`.
pub async fn concurrent_create_and_update_stampede(t: &Subject) {
    let s = t.kv();
    const TASKS: usize = 16;
    let barrier = Arc::new(tokio::sync::Barrier::new(TASKS));
    let create: Vec<_> = (0..TASKS)
        .map(|i| {
            let s = s.clone();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                s.put("/leader", b(&i.to_string()), ExpectedVersion::Absent).await
            })
        })
        .collect();
    let mut winners = 0;
    for h in create {
        match timeout(WAIT, h).await.unwrap().unwrap() {
            Ok(v) => {
                assert_eq!(v, 1);
                winners += 1;
            }
            Err(MetadataError::BadVersion { actual, .. }) => assert_eq!(actual, Some(1)),
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    assert_eq!(winners, 1);

    let update: Vec<_> = (0..TASKS)
        .map(|i| {
            let s = s.clone();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                s.put("/leader", b(&i.to_string()), ExpectedVersion::Exactly(1)).await
            })
        })
        .collect();
    let mut winners = 0;
    for h in update {
        match timeout(WAIT, h).await.unwrap().unwrap() {
            Ok(v) => {
                assert_eq!(v, 2);
                winners += 1;
            }
            Err(MetadataError::BadVersion { actual, .. }) => assert_eq!(actual, Some(2)),
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    assert_eq!(winners, 1);
}

/// Conformance case `close_ends_watches_and_rejects_calls`.
pub async fn close_ends_watches_and_rejects_calls(t: &Subject) {
    let s = t.kv();
    s.put("/k", b("v"), ExpectedVersion::Any).await.unwrap();
    let mut w = s.watch("/").await.unwrap();
    s.put("/k", b("v2"), ExpectedVersion::Any).await.unwrap();
    s.close().await.unwrap();
    s.close().await.unwrap(); // idempotent
                              // Events of writes made before close are still readable, then the stream ends.
    assert_eq!(next(&mut w).await, put_ev("/k", 2));
    assert_eq!(timeout(WAIT, w.recv()).await.unwrap(), None);
    assert!(matches!(s.get("/k").await, Err(MetadataError::Closed)));
    assert!(matches!(s.put("/k", b("v"), ExpectedVersion::Any).await, Err(MetadataError::Closed)));
    assert!(matches!(s.delete("/k", ExpectedVersion::Any).await, Err(MetadataError::Closed)));
    assert!(matches!(s.list("/").await, Err(MetadataError::Closed)));
    assert!(matches!(s.list_children("/").await, Err(MetadataError::Closed)));
    assert!(matches!(s.watch("/").await, Err(MetadataError::Closed)));
}

/// Conformance case `store_is_object_safe_and_shareable`.
pub async fn store_is_object_safe_and_shareable(t: &Subject) {
    let s = t.kv();
    fn assert_send_sync<T: Send + Sync + ?Sized>(_: &T) {}
    assert_send_sync(&*s);
    let s2 = s.clone();
    let h = tokio::spawn(async move { s2.put("/spawned", b("v"), ExpectedVersion::Any).await });
    assert_eq!(timeout(WAIT, h).await.unwrap().unwrap().unwrap(), 1);
    assert_eq!(s.get("/spawned").await.unwrap().unwrap().version, 1);
}

// ---------------------------------------------------------------- session cases

/// Conformance case `ephemeral_put_follows_put_semantics`.
pub async fn ephemeral_put_follows_put_semantics(t: &Subject) {
    let s = &t.store;
    assert!(s.session().id().is_some(), "a new store has a session: {:?}", s.session());
    assert_eq!(s.put_ephemeral("/eph/a", b("1"), ExpectedVersion::Absent).await.unwrap(), 1);
    assert_eq!(s.put_ephemeral("/eph/a", b("2"), ExpectedVersion::Any).await.unwrap(), 2);
    assert_eq!(s.put_ephemeral("/eph/a", b("3"), ExpectedVersion::Exactly(2)).await.unwrap(), 3);
    match s.put_ephemeral("/eph/a", b("x"), ExpectedVersion::Exactly(2)).await {
        Err(MetadataError::BadVersion { expected, actual, .. }) => {
            assert_eq!((expected, actual), (ExpectedVersion::Exactly(2), Some(3)));
        }
        other => panic!("expected BadVersion, got {other:?}"),
    }
    match s.put_ephemeral("/eph/a", b("x"), ExpectedVersion::Absent).await {
        Err(MetadataError::BadVersion { actual, .. }) => assert_eq!(actual, Some(3)),
        other => panic!("expected BadVersion, got {other:?}"),
    }
    match s.put_ephemeral("/eph/none", b("x"), ExpectedVersion::Exactly(1)).await {
        Err(MetadataError::BadVersion { actual, .. }) => assert_eq!(actual, None),
        other => panic!("expected BadVersion, got {other:?}"),
    }
    let v = s.get("/eph/a").await.unwrap().unwrap();
    assert_eq!((v.value, v.version), (b("3"), 3));
    // Ephemeral and persistent keys share one key space, listing and versions.
    s.put("/eph/p", b("p"), ExpectedVersion::Absent).await.unwrap();
    assert_eq!(s.list("/eph/").await.unwrap(), vec!["/eph/a", "/eph/p"]);
    assert_eq!(s.list_children("/eph").await.unwrap(), vec!["a", "p"]);
    // A persistent key turned ephemeral keeps counting versions, and back.
    assert_eq!(s.put_ephemeral("/eph/p", b("e"), ExpectedVersion::Exactly(1)).await.unwrap(), 2);
    assert_eq!(s.put("/eph/p", b("p"), ExpectedVersion::Exactly(2)).await.unwrap(), 3);
    // Delete works on ephemeral keys like on any other.
    let mut w = s.watch("/eph/").await.unwrap();
    match s.delete("/eph/a", ExpectedVersion::Exactly(1)).await {
        Err(MetadataError::BadVersion { actual, .. }) => assert_eq!(actual, Some(3)),
        other => panic!("expected BadVersion, got {other:?}"),
    }
    s.delete("/eph/a", ExpectedVersion::Exactly(3)).await.unwrap();
    assert_eq!(s.get("/eph/a").await.unwrap(), None);
    assert_eq!(next(&mut w).await, changed("/eph/a", EventKind::Delete));
    assert_eq!(s.put_ephemeral("/eph/a", b("again"), ExpectedVersion::Absent).await.unwrap(), 1);
    assert_eq!(next(&mut w).await, put_ev("/eph/a", 1));
}

/// Conformance case `ephemeral_keys_vanish_when_the_session_expires`.
pub async fn ephemeral_keys_vanish_when_the_session_expires(t: &Subject) {
    let s = &t.store;
    let old = s.session().id().expect("a live session");
    s.put("/s/persistent", b("p"), ExpectedVersion::Any).await.unwrap();
    s.put_ephemeral("/s/e1", b("1"), ExpectedVersion::Absent).await.unwrap();
    s.put_ephemeral("/s/e2/deep", b("2"), ExpectedVersion::Absent).await.unwrap();
    // Persistent turned ephemeral: goes with the session.
    s.put("/s/conv", b("p"), ExpectedVersion::Absent).await.unwrap();
    s.put_ephemeral("/s/conv", b("e"), ExpectedVersion::Exactly(1)).await.unwrap();
    // Ephemeral turned persistent: stays.
    s.put_ephemeral("/s/back", b("e"), ExpectedVersion::Absent).await.unwrap();
    s.put("/s/back", b("p"), ExpectedVersion::Exactly(1)).await.unwrap();

    let mut w = s.watch("/s/").await.unwrap();
    let mut events = s.session_events();
    let mut events2 = s.session_events();
    t.hooks.expire_session().await;

    // Watchers see ordinary deletes of exactly the session's keys.
    let mut deleted = BTreeSet::new();
    while deleted.len() < 3 {
        match next(&mut w).await {
            WatchEvent::Changed(Event { key, kind: EventKind::Delete }) => {
                assert!(deleted.insert(key.clone()), "{key} deleted twice");
            }
            other => panic!("unexpected watch event {other:?}"),
        }
    }
    let expected: BTreeSet<String> =
        ["/s/conv", "/s/e1", "/s/e2/deep"].iter().map(|k| k.to_string()).collect();
    assert_eq!(deleted, expected);

    // Every subscriber: SessionLost for the old session, then a new one.
    let mut new = None;
    for events in [&mut events, &mut events2] {
        let mut seen = Vec::new();
        loop {
            match next_session_event(events).await {
                // Contact may flicker while a remote store notices the expiry.
                SessionEvent::ConnectionLost { .. } | SessionEvent::Reconnected { .. } => {}
                SessionEvent::Lagged => panic!("two events cannot overflow a subscription"),
                e @ SessionEvent::SessionLost { session } => {
                    assert_eq!(session, old);
                    seen.push(e);
                }
                e @ SessionEvent::SessionReestablished { session } => {
                    assert!(!seen.is_empty(), "SessionReestablished before SessionLost");
                    assert_ne!(session, old, "a lost session is never reused");
                    assert!(new.is_none() || new == Some(session));
                    new = Some(session);
                    seen.push(e);
                    break;
                }
            }
        }
    }
    let new = new.expect("a new session");
    assert_eq!(s.session(), SessionState::Connected(new));

    assert_eq!(s.list("/s/").await.unwrap(), vec!["/s/back", "/s/persistent"]);
    assert_eq!(s.get("/s/back").await.unwrap().unwrap().version, 2);
    // Keys can be bound to the new session; a gone key starts again at version 1.
    assert_eq!(s.put_ephemeral("/s/e1", b("1"), ExpectedVersion::Absent).await.unwrap(), 1);
    assert_eq!(next(&mut w).await, put_ev("/s/e1", 1));
    t.hooks.settle().await;
    assert_eq!(w.try_recv(), None, "the new session's key stays");
    assert_eq!(s.get("/s/e1").await.unwrap().unwrap().version, 1);
}

/// Conformance case `ephemeral_keys_vanish_when_the_store_closes`.
pub async fn ephemeral_keys_vanish_when_the_store_closes(t: &Subject) {
    let s = &t.store;
    s.put_ephemeral("/c/eph", b("e"), ExpectedVersion::Absent).await.unwrap();
    s.put("/c/persistent", b("p"), ExpectedVersion::Absent).await.unwrap();
    s.put("/c/conv", b("p"), ExpectedVersion::Absent).await.unwrap();
    s.put_ephemeral("/c/conv", b("e"), ExpectedVersion::Exactly(1)).await.unwrap();
    let mut events = s.session_events();
    s.close().await.unwrap();
    assert_eq!(s.session(), SessionState::Closed);
    // The subscription ends (possibly after events the close itself caused).
    let end = timeout(WAIT, async {
        while let Some(e) = events.recv().await {
            assert!(!matches!(e, SessionEvent::SessionReestablished { .. }), "{e:?}");
        }
    });
    end.await.expect("session events did not end on close");
    let other = t.hooks.observer().await;
    assert_eq!(other.list("/c/").await.unwrap(), vec!["/c/persistent"]);
    assert_eq!(other.get("/c/persistent").await.unwrap().unwrap().version, 1);
    other.close().await.unwrap();
}

/// Conformance case `put_ephemeral_rejects_bad_input_and_closed_store`.
pub async fn put_ephemeral_rejects_bad_input_and_closed_store(t: &Subject) {
    let s = &t.store;
    for k in ["", "a", "/", "/a/", "//a", "/a/../b", "/a\0b"] {
        assert_invalid(s.put_ephemeral(k, b("v"), ExpectedVersion::Any).await, k);
    }
    let big = Bytes::from(vec![1u8; MAX_VALUE_LEN + 1]);
    assert!(matches!(
        s.put_ephemeral("/big", big, ExpectedVersion::Any).await,
        Err(MetadataError::ValueTooLarge { .. })
    ));
    assert!(s.list("/").await.unwrap().is_empty(), "nothing was written");
    s.close().await.unwrap();
    assert!(matches!(
        s.put_ephemeral("/k", b("v"), ExpectedVersion::Any).await,
        Err(MetadataError::Closed)
    ));
    assert_eq!(s.session_events().recv().await, None);
}
