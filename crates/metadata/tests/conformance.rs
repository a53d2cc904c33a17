//! Conformance suite for `MetadataStore` implementations.
//!
//! Every case is a generic async fn over `&dyn MetadataStore`; `run_case` takes a store
//! factory and a case, and the `conformance!` macro instantiates every case as a separate
//! test for each implementation (`MemoryStore`, `EmbeddedStore`). Invariants checked: CAS
//! and version semantics, delete semantics, list / list_children, key validation, watch
//! order / filtering / lag signalling, close, and exactly one winner per version under
//! concurrent CAS. Every wait is bounded by `tokio::time::timeout`; there are no sleeps.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use magnetar_metadata::{
    EmbeddedStore, EmbeddedStoreConfig, Event, EventKind, ExpectedVersion, MemoryStore,
    MetadataError, MetadataStore, WatchEvent, WatchStream, MAX_KEY_LEN, MAX_VALUE_LEN,
};
use tokio::time::timeout;

/// Watch queue length used by every factory, small so the lag case is cheap.
const WATCH_CAPACITY: usize = 8;
const WAIT: Duration = Duration::from_secs(20);

/// A store under test plus whatever must outlive it (the embedded store's directory).
struct TestStore {
    store: Arc<dyn MetadataStore>,
    _guard: Option<tempfile::TempDir>,
}

type StoreFuture = Pin<Box<dyn Future<Output = TestStore>>>;

fn memory_factory() -> StoreFuture {
    Box::pin(async {
        TestStore {
            store: Arc::new(MemoryStore::with_watch_capacity(WATCH_CAPACITY)),
            _guard: None,
        }
    })
}

fn embedded_factory() -> StoreFuture {
    Box::pin(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = EmbeddedStoreConfig::new(dir.path().join("meta"));
        config.watch_capacity = WATCH_CAPACITY;
        let store = EmbeddedStore::open(config).await.expect("open embedded store");
        TestStore { store: Arc::new(store), _guard: Some(dir) }
    })
}

/// Runs one case against a fresh store from `factory`, bounded in time.
async fn run_case<F, C, Fut>(factory: F, case: C)
where
    F: Fn() -> StoreFuture,
    C: FnOnce(Arc<dyn MetadataStore>) -> Fut,
    Fut: Future<Output = ()>,
{
    let t = factory().await;
    timeout(Duration::from_secs(120), case(t.store.clone()))
        .await
        .expect("conformance case timed out");
    t.store.close().await.expect("close");
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

// ---------------------------------------------------------------- cases

async fn versions_start_at_one_and_increment(s: Arc<dyn MetadataStore>) {
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

async fn cas_absent(s: Arc<dyn MetadataStore>) {
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

async fn cas_exactly(s: Arc<dyn MetadataStore>) {
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

async fn delete_semantics(s: Arc<dyn MetadataStore>) {
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

async fn list_by_prefix(s: Arc<dyn MetadataStore>) {
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

async fn list_children_like_zookeeper(s: Arc<dyn MetadataStore>) {
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

async fn invalid_keys_are_typed_errors(s: Arc<dyn MetadataStore>) {
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

async fn value_size_limit(s: Arc<dyn MetadataStore>) {
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

async fn watch_delivers_changes_in_order(s: Arc<dyn MetadataStore>) {
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
    // Each write's event is queued before the write returns, so nothing else is pending.
    assert_eq!(w.try_recv(), None);
}

async fn several_watchers_see_the_same_order(s: Arc<dyn MetadataStore>) {
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

async fn watch_lag_is_signalled_and_recovers(s: Arc<dyn MetadataStore>) {
    let mut w = s.watch("/lag/").await.unwrap();
    let total = 3 * WATCH_CAPACITY as u64;
    for i in 1..=total {
        assert_eq!(s.put("/lag/k", b("v"), ExpectedVersion::Any).await.unwrap(), i);
    }
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

async fn concurrent_cas_has_one_winner_per_version(s: Arc<dyn MetadataStore>) {
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

async fn concurrent_create_and_update_stampede(s: Arc<dyn MetadataStore>) {
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

async fn close_ends_watches_and_rejects_calls(s: Arc<dyn MetadataStore>) {
    s.put("/k", b("v"), ExpectedVersion::Any).await.unwrap();
    let mut w = s.watch("/").await.unwrap();
    s.put("/k", b("v2"), ExpectedVersion::Any).await.unwrap();
    s.close().await.unwrap();
    s.close().await.unwrap(); // idempotent
                              // Buffered events are still readable, then the stream ends.
    assert_eq!(next(&mut w).await, put_ev("/k", 2));
    assert_eq!(timeout(WAIT, w.recv()).await.unwrap(), None);
    assert!(matches!(s.get("/k").await, Err(MetadataError::Closed)));
    assert!(matches!(s.put("/k", b("v"), ExpectedVersion::Any).await, Err(MetadataError::Closed)));
    assert!(matches!(s.delete("/k", ExpectedVersion::Any).await, Err(MetadataError::Closed)));
    assert!(matches!(s.list("/").await, Err(MetadataError::Closed)));
    assert!(matches!(s.list_children("/").await, Err(MetadataError::Closed)));
    assert!(matches!(s.watch("/").await, Err(MetadataError::Closed)));
}

async fn store_is_object_safe_and_shareable(s: Arc<dyn MetadataStore>) {
    fn assert_send_sync<T: Send + Sync + ?Sized>(_: &T) {}
    assert_send_sync(&*s);
    let s2 = s.clone();
    let h = tokio::spawn(async move { s2.put("/spawned", b("v"), ExpectedVersion::Any).await });
    assert_eq!(timeout(WAIT, h).await.unwrap().unwrap().unwrap(), 1);
    assert_eq!(s.get("/spawned").await.unwrap().unwrap().version, 1);
}

// ---------------------------------------------------------------- instantiation

macro_rules! conformance {
    ($module:ident, $factory:path) => {
        mod $module {
            use super::*;

            macro_rules! case {
                ($name:ident) => {
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $name() {
                        run_case($factory, super::$name).await;
                    }
                };
            }

            case!(versions_start_at_one_and_increment);
            case!(cas_absent);
            case!(cas_exactly);
            case!(delete_semantics);
            case!(list_by_prefix);
            case!(list_children_like_zookeeper);
            case!(invalid_keys_are_typed_errors);
            case!(value_size_limit);
            case!(watch_delivers_changes_in_order);
            case!(several_watchers_see_the_same_order);
            case!(watch_lag_is_signalled_and_recovers);
            case!(concurrent_cas_has_one_winner_per_version);
            case!(concurrent_create_and_update_stampede);
            case!(close_ends_watches_and_rejects_calls);
            case!(store_is_object_safe_and_shareable);
        }
    };
}

conformance!(memory, memory_factory);
conformance!(embedded, embedded_factory);
