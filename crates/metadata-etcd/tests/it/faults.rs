//! `EtcdStore` under faults, against real etcd processes on loopback:
//! * the etcd leader is killed under 100 concurrent compare-and-set writers: the key's full
//!   history (read back from etcd) shows no acknowledged write lost or applied twice, no
//!   rejected write applied, and every unknown outcome (`Io`) resolved one way exactly once;
//! * a client cut off from etcd (a black-holing proxy) for less than its session TTL sees
//!   `ConnectionLost` then `Reconnected` and keeps its ephemeral key; cut off past the TTL it
//!   sees `SessionLost`, its ephemeral key vanishes for others, and once the partition heals
//!   it sees `SessionReestablished` and can bind keys again;
//! * a real process holding an ephemeral key (this test binary, re-run as a child) is frozen
//!   with SIGSTOP past its TTL: the key vanishes for others; on SIGCONT the child reports
//!   `SessionLost`, then `SessionReestablished`, and binds the key again;
//! * a watcher whose connection is cut again and again delivers every later event, in order,
//!   with no `Lagged`; one whose resume point was compacted meanwhile gets `Lagged`, and every
//!   event after the compaction.
//!
//! Each test starts its own cluster. Every wait is bounded; nothing sleeps to synchronise.
//! Skipped with a notice without etcd, unless MAGNETAR_REQUIRE_ETCD=1.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use etcd_client::{EventType, GetOptions, WatchOptions};
use magnetar_etcd_testing::{etcd_or_skip, freeze_process, thaw_process, EtcdCluster, FaultProxy};
use magnetar_metadata::{
    Event, EventKind, ExpectedVersion, MetadataError, MetadataStore, SessionEvent, SessionEvents,
    SessionState, SessionStore, WatchEvent, WatchStream,
};
use magnetar_metadata_etcd::{EtcdStore, EtcdStoreConfig};
use tokio::time::timeout;

const WAIT: Duration = Duration::from_secs(20);

async fn within<T>(what: &str, bound: Duration, fut: impl Future<Output = T>) -> T {
    match timeout(bound, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {bound:?}: {what}"),
    }
}

async fn connect(endpoints: Vec<String>, cluster: &str, ttl_secs: u64) -> EtcdStore {
    let mut config = EtcdStoreConfig::new(endpoints, cluster);
    config.session_ttl = Duration::from_secs(ttl_secs);
    within("connect", WAIT, EtcdStore::connect(config)).await.expect("connect to etcd")
}

async fn next_watch(w: &mut WatchStream) -> WatchEvent {
    within("a watch event", WAIT, w.recv()).await.expect("watch stream ended")
}

/// The next session event.
async fn next_session(events: &mut SessionEvents) -> SessionEvent {
    within("a session event", WAIT, events.recv()).await.expect("session events ended")
}

// ------------------------------------------------------------------ leader kill under CAS

const WRITERS: usize = 100;
const COUNTER: &str = "/counter";

/// What one writer's attempt came to.
#[derive(Debug, Clone)]
enum Outcome {
    Acked { version: u64 },
    Rejected,
    Unknown,
}

#[derive(Default)]
struct History {
    /// (writer, attempt) -> outcome.
    attempts: Mutex<BTreeMap<(usize, u64), Outcome>>,
    acked: AtomicU64,
}

async fn writer(store: Arc<EtcdStore>, id: usize, history: Arc<History>, stop: Arc<AtomicBool>) {
    let mut attempt = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let Ok(Some(current)) = store.get(COUNTER).await else { continue };
        let text = std::str::from_utf8(&current.value).expect("utf-8 counter");
        let count: u64 = text.split(' ').next().and_then(|n| n.parse().ok()).expect("a count");
        attempt += 1;
        let value = format!("{} w{id} a{attempt}", count + 1);
        let result =
            store.put(COUNTER, Bytes::from(value), ExpectedVersion::Exactly(current.version)).await;
        let outcome = match result {
            Ok(version) => {
                assert_eq!(version, current.version + 1);
                history.acked.fetch_add(1, Ordering::SeqCst);
                Outcome::Acked { version }
            }
            Err(MetadataError::BadVersion { actual, .. }) => {
                assert!(actual != Some(current.version), "BadVersion yet version matched");
                Outcome::Rejected
            }
            Err(MetadataError::Io { .. }) => Outcome::Unknown,
            Err(e) => panic!("writer {id}: unexpected {e:?}"),
        };
        history.attempts.lock().unwrap().insert((id, attempt), outcome);
    }
}

/// Every value the counter key ever had, by version, read from etcd's history.
async fn counter_history(cluster: &EtcdCluster, root: &str) -> BTreeMap<u64, String> {
    let key = format!("{root}{COUNTER}");
    let mut client = cluster.raw_client().await.expect("raw client");
    let resp = client.get(key.clone(), None).await.expect("read the counter");
    let kv = resp.kvs().first().expect("the counter exists");
    let (created, last_version) = (kv.create_revision(), kv.version());
    let options = WatchOptions::new().with_start_revision(created);
    let (_watcher, mut stream) = client.watch(key, Some(options)).await.expect("watch").split();
    let mut history = BTreeMap::new();
    while (history.len() as i64) < last_version {
        let resp = within("counter history", WAIT, stream.message())
            .await
            .expect("history stream")
            .expect("history stream ended");
        for event in resp.events() {
            assert_eq!(event.event_type(), EventType::Put, "the counter is never deleted");
            let kv = event.kv().expect("event kv");
            let value = String::from_utf8(kv.value().to_vec()).expect("utf-8");
            assert!(history.insert(kv.version() as u64, value).is_none(), "version twice");
        }
    }
    history
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_under_cas_writers_loses_and_duplicates_nothing() {
    let Some(binary) = etcd_or_skip("leader kill") else { return };
    let mut cluster = EtcdCluster::start(&binary, 3).await.expect("start etcd");
    let store = Arc::new(connect(cluster.endpoints(), "leader-kill", 10).await);
    let root = store.config().root.clone();
    store.put(COUNTER, Bytes::from_static(b"0 init"), ExpectedVersion::Absent).await.unwrap();

    let history = Arc::new(History::default());
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..WRITERS)
        .map(|id| tokio::spawn(writer(store.clone(), id, history.clone(), stop.clone())))
        .collect();
    let acked_at_least = |n: u64| {
        let history = history.clone();
        async move {
            while history.acked.load(Ordering::SeqCst) < n {
                tokio::task::yield_now().await;
            }
        }
    };
    within("acks before the kill", Duration::from_secs(30), acked_at_least(150)).await;
    let leader = within("find the leader", WAIT, cluster.leader()).await.expect("a leader");
    cluster.kill(leader);
    let acked_at_kill = history.acked.load(Ordering::SeqCst);
    // The two survivors elect a leader and writes go on.
    within("acks after the kill", Duration::from_secs(30), acked_at_least(acked_at_kill + 150))
        .await;
    stop.store(true, Ordering::SeqCst);
    for w in writers {
        within("writer to stop", WAIT, w).await.expect("writer panicked");
    }

    // Check the history etcd kept against what the writers were told.
    let versions = counter_history(&cluster, &root).await;
    let attempts = history.attempts.lock().unwrap().clone();
    let mut applied = BTreeMap::new(); // "w<id> a<attempt>" -> version
    for (version, value) in &versions {
        let mut parts = value.splitn(2, ' ');
        let count: u64 = parts.next().unwrap().parse().unwrap();
        assert_eq!(count + 1, *version, "version {version} holds count {count}: lost update");
        let tag = parts.next().unwrap().to_string();
        assert!(applied.insert(tag.clone(), *version).is_none(), "{tag} applied twice");
    }
    let (mut acked, mut unknown_applied, mut unknown_not_applied) = (0, 0, 0);
    for ((id, attempt), outcome) in &attempts {
        let tag = format!("w{id} a{attempt}");
        match (outcome, applied.remove(&tag)) {
            (Outcome::Acked { version }, Some(v)) => {
                assert_eq!(*version, v, "{tag} acknowledged at {version}, applied at {v}");
                acked += 1;
            }
            (Outcome::Acked { version }, None) => panic!("{tag} acknowledged at {version}, lost"),
            (Outcome::Rejected, Some(v)) => panic!("{tag} rejected but applied at {v}"),
            (Outcome::Rejected, None) => {}
            (Outcome::Unknown, Some(_)) => unknown_applied += 1,
            (Outcome::Unknown, None) => unknown_not_applied += 1,
        }
    }
    applied.remove("init");
    assert!(applied.is_empty(), "writes nobody attempted: {applied:?}");
    assert_eq!(versions.len() as u64, 1 + acked + unknown_applied);
    eprintln!(
        "leader kill: {} attempts, {acked} acknowledged, {unknown_applied} unknown and applied, \
         {unknown_not_applied} unknown and not applied, final version {}",
        attempts.len(),
        versions.len()
    );
    store.close().await.unwrap();
}

// ------------------------------------------------------------------ sessions under partition

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_client_loses_its_session_past_the_ttl_and_reestablishes() {
    let Some(binary) = etcd_or_skip("partitioned session") else { return };
    let cluster = EtcdCluster::start(&binary, 1).await.expect("start etcd");
    let proxy = FaultProxy::start(cluster.client_addr(0)).await.expect("proxy");
    const TTL: u64 = 4;
    let client = connect(vec![proxy.endpoint()], "partition", TTL).await;
    let observer = connect(cluster.endpoints(), "partition", TTL).await;
    let first = client.session().id().expect("a session");
    client
        .put_ephemeral("/owner", Bytes::from_static(b"me"), ExpectedVersion::Absent)
        .await
        .unwrap();
    let mut events = client.session_events();
    let mut watch = observer.watch("/owner").await.unwrap();

    // 1. A partition shorter than the TTL: contact flickers, the session and key survive.
    proxy.pause();
    assert_eq!(next_session(&mut events).await, SessionEvent::ConnectionLost { session: first });
    assert_eq!(client.session(), SessionState::Disconnected(first));
    proxy.resume();
    assert_eq!(next_session(&mut events).await, SessionEvent::Reconnected { session: first });
    assert_eq!(client.session(), SessionState::Connected(first));
    assert!(observer.get("/owner").await.unwrap().is_some(), "the key survived");

    // 2. A partition past the TTL (a process frozen by SIGSTOP looks the same to etcd).
    proxy.pause();
    assert_eq!(next_session(&mut events).await, SessionEvent::ConnectionLost { session: first });
    // The client gives the session up no later than etcd can expire it...
    assert_eq!(next_session(&mut events).await, SessionEvent::SessionLost { session: first });
    assert_eq!(client.session(), SessionState::Lost);
    match client.put_ephemeral("/owner", Bytes::from_static(b"me"), ExpectedVersion::Any).await {
        Err(MetadataError::SessionExpired { .. }) => {}
        other => panic!("expected SessionExpired without a session, got {other:?}"),
    }
    // ...and etcd deletes its key, which others see.
    let gone = WatchEvent::Changed(Event { key: "/owner".into(), kind: EventKind::Delete });
    assert_eq!(next_watch(&mut watch).await, gone);

    // 3. The partition heals: a new session, and keys can be bound to it.
    proxy.resume();
    let second = match next_session(&mut events).await {
        SessionEvent::SessionReestablished { session } => session,
        other => panic!("expected SessionReestablished, got {other:?}"),
    };
    assert_ne!(second, first);
    assert_eq!(client.session(), SessionState::Connected(second));
    let v = client.put_ephemeral("/owner", Bytes::from_static(b"me"), ExpectedVersion::Absent);
    assert_eq!(v.await.unwrap(), 1);
    let back =
        WatchEvent::Changed(Event { key: "/owner".into(), kind: EventKind::Put { version: 1 } });
    assert_eq!(next_watch(&mut watch).await, back);

    // Closing revokes the lease at once (no waiting for the TTL).
    client.close().await.unwrap();
    assert_eq!(next_watch(&mut watch).await, gone);
    observer.close().await.unwrap();
}

// ------------------------------------------------------------------ a frozen process

/// Set in the child's environment to the etcd endpoint it should use.
const CHILD_ENV: &str = "MAGNETAR_ETCD_FROZEN_CHILD";
const FROZEN_TTL: u64 = 2;

/// The child: binds `/frozen`, then reports every session event (one `CHILD ...` line
/// each) and re-binds the key after a new session starts.
async fn frozen_child(endpoint: String) {
    let store = connect(vec![endpoint], "frozen", FROZEN_TTL).await;
    let mut events = store.session_events();
    store
        .put_ephemeral("/frozen", Bytes::from_static(b"child"), ExpectedVersion::Absent)
        .await
        .unwrap();
    println!("CHILD READY");
    while let Some(event) = events.recv().await {
        println!("CHILD EVENT {event:?}");
        if let SessionEvent::SessionReestablished { .. } = event {
            let v = store.put_ephemeral(
                "/frozen",
                Bytes::from_static(b"child"),
                ExpectedVersion::Absent,
            );
            println!("CHILD REBOUND {:?}", v.await.map_err(|e| e.to_string()));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_frozen_past_its_ttl_loses_its_session_then_reestablishes() {
    if let Ok(endpoint) = std::env::var(CHILD_ENV) {
        return frozen_child(endpoint).await;
    }
    let Some(binary) = etcd_or_skip("frozen process") else { return };
    let cluster = EtcdCluster::start(&binary, 1).await.expect("start etcd");
    let observer = connect(cluster.endpoints(), "frozen", 10).await;
    let mut watch = observer.watch("/frozen").await.unwrap();

    let child = std::process::Command::new(std::env::current_exe().unwrap())
        // The test's name in the harness: its module path inside the test binary, then itself.
        .args([
            "--exact",
            "faults::a_process_frozen_past_its_ttl_loses_its_session_then_reestablishes",
        ])
        .args(["--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, cluster.endpoint(0))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the child");
    let mut child = KillOnDrop(child);
    let stdout = child.0.stdout.take().unwrap();
    let (lines_tx, mut lines) = tokio::sync::mpsc::channel::<String>(64);
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            // The harness may have written "test <name> ... " on the same line first.
            if let Some(at) = line.find("CHILD ") {
                if lines_tx.blocking_send(line[at + "CHILD ".len()..].to_string()).is_err() {
                    return;
                }
            }
        }
    });
    assert_eq!(next_line(&mut lines).await, "READY");
    let put =
        WatchEvent::Changed(Event { key: "/frozen".into(), kind: EventKind::Put { version: 1 } });
    assert_eq!(next_watch(&mut watch).await, put);
    // Freeze the child past its TTL: etcd expires its lease and deletes its key.
    let pid = child.0.id();
    freeze_process(pid);
    let gone = WatchEvent::Changed(Event { key: "/frozen".into(), kind: EventKind::Delete });
    assert_eq!(next_watch(&mut watch).await, gone);
    thaw_process(pid);
    // Thawed, the child finds its session lost, starts a new one and binds the key again.
    let mut seen = Vec::new();
    loop {
        let line = next_line(&mut lines).await;
        if line.starts_with("REBOUND") {
            assert_eq!(line, "REBOUND Ok(1)", "after {seen:?}");
            break;
        }
        seen.push(line);
    }
    let lost = seen.iter().position(|l| l.starts_with("EVENT SessionLost"));
    let back = seen.iter().position(|l| l.starts_with("EVENT SessionReestablished"));
    assert!(lost.is_some() && back.is_some() && lost < back, "child saw {seen:?}");
    assert_eq!(next_watch(&mut watch).await, put);
    drop(child);
    observer.close().await.unwrap();
}

async fn next_line(lines: &mut tokio::sync::mpsc::Receiver<String>) -> String {
    within("a line from the child", WAIT, lines.recv()).await.expect("child output ended")
}

/// Kills (SIGKILL) and reaps the child when the test ends, even by a panic.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        thaw_process(self.0.id());
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

// ------------------------------------------------------------------ watches under cuts

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_whose_connection_is_cut_delivers_every_later_event() {
    let Some(binary) = etcd_or_skip("watch cut") else { return };
    let cluster = EtcdCluster::start(&binary, 1).await.expect("start etcd");
    let proxy = FaultProxy::start(cluster.client_addr(0)).await.expect("proxy");
    let watcher = connect(vec![proxy.endpoint()], "watch-cut", 10).await;
    let writer = Arc::new(connect(cluster.endpoints(), "watch-cut", 10).await);
    let mut watch = watcher.watch("/w/").await.unwrap();

    const PUTS: u64 = 300;
    const CUTS: u64 = 5;
    let writing = {
        let writer = writer.clone();
        tokio::spawn(async move {
            for i in 1..=PUTS {
                // Two keys in one stream, so order across keys is checked too.
                let key = if i % 2 == 0 { "/w/even" } else { "/w/odd" };
                writer.put(key, Bytes::from(i.to_string()), ExpectedVersion::Any).await.unwrap();
            }
        })
    };
    let mut seen = Vec::new();
    while (seen.len() as u64) < PUTS {
        match next_watch(&mut watch).await {
            WatchEvent::Changed(Event { key, kind: EventKind::Put { version } }) => {
                seen.push((key, version));
            }
            other => panic!("unexpected {other:?} after {} events", seen.len()),
        }
        // Cut the watcher's connection every PUTS / (CUTS + 1) events, while writes go on.
        if (seen.len() as u64).is_multiple_of(PUTS / (CUTS + 1)) {
            proxy.cut();
        }
    }
    within("writer", WAIT, writing).await.unwrap();
    let expected: Vec<(String, u64)> = (1..=PUTS)
        .map(|i| (if i % 2 == 0 { "/w/even" } else { "/w/odd" }.to_string(), i.div_ceil(2)))
        .collect();
    assert_eq!(seen, expected, "every event once, in commit order");
    watcher.settle_watches().await;
    assert_eq!(watch.try_recv(), None);
    watcher.close().await.unwrap();
    writer.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_resuming_from_a_compacted_revision_reports_lagged() {
    let Some(binary) = etcd_or_skip("watch compaction") else { return };
    let cluster = EtcdCluster::start(&binary, 1).await.expect("start etcd");
    let proxy = FaultProxy::start(cluster.client_addr(0)).await.expect("proxy");
    let watcher = connect(vec![proxy.endpoint()], "watch-compact", 10).await;
    let writer = connect(cluster.endpoints(), "watch-compact", 10).await;
    let mut watch = watcher.watch("/c/").await.unwrap();
    let put = |i: u64| writer.put("/c/k", Bytes::from(i.to_string()), ExpectedVersion::Any);

    assert_eq!(put(1).await.unwrap(), 1);
    let first =
        WatchEvent::Changed(Event { key: "/c/k".into(), kind: EventKind::Put { version: 1 } });
    assert_eq!(next_watch(&mut watch).await, first);
    // Partition the watcher, change the key while it cannot hear, and compact that history.
    proxy.pause();
    for i in 2..=10 {
        put(i).await.unwrap();
    }
    let compacted = cluster.compact().await.expect("compact");
    proxy.cut();
    proxy.resume();
    // The watcher cannot replay versions 2..=10: it must say so, not skip silently.
    let mut before_lag = Vec::new();
    loop {
        match next_watch(&mut watch).await {
            WatchEvent::Lagged => break,
            WatchEvent::Changed(e) => before_lag.push(e),
        }
    }
    // Anything delivered before the marker is part of the history, in order.
    for (i, e) in before_lag.iter().enumerate() {
        assert_eq!(e.kind, EventKind::Put { version: i as u64 + 2 });
    }
    // After re-reading, the watcher is up to date, and later changes arrive again.
    assert_eq!(watcher.get("/c/k").await.unwrap().unwrap().version, 10);
    assert_eq!(put(11).await.unwrap(), 11);
    loop {
        // Events from the compaction point on may repeat what the re-read showed.
        match next_watch(&mut watch).await {
            WatchEvent::Changed(Event { kind: EventKind::Put { version: 11 }, .. }) => break,
            WatchEvent::Changed(Event { kind: EventKind::Put { version }, .. }) => {
                assert!(version >= 10, "only the compaction point may repeat, got {version}")
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(compacted > 0);
    watcher.close().await.unwrap();
    writer.close().await.unwrap();
}

/// `list` pages through far more keys than one page holds and sees one snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_page_through_large_key_sets() {
    let Some(binary) = etcd_or_skip("pagination") else { return };
    let cluster = EtcdCluster::start(&binary, 1).await.expect("start etcd");
    let mut config = EtcdStoreConfig::new(cluster.endpoints(), "pages");
    config.list_page_size = 7;
    let store = within("connect", WAIT, EtcdStore::connect(config)).await.unwrap();
    let mut expected = BTreeSet::new();
    let mut children = BTreeSet::new();
    for t in 0..20 {
        children.insert(format!("t{t:02}"));
        for l in 0..(t % 4) {
            let key = format!("/topics/t{t:02}/ledgers/{l}");
            store.put(&key, Bytes::from_static(b"v"), ExpectedVersion::Any).await.unwrap();
            expected.insert(key);
        }
        if t % 4 == 0 {
            let key = format!("/topics/t{t:02}");
            store.put(&key, Bytes::from_static(b"v"), ExpectedVersion::Any).await.unwrap();
            expected.insert(key);
        }
    }
    let listed = store.list("/topics/").await.unwrap();
    assert_eq!(listed, expected.into_iter().collect::<Vec<_>>());
    let names = store.list_children("/topics").await.unwrap();
    assert_eq!(names, children.into_iter().collect::<Vec<_>>());
    assert_eq!(store.list_children("/topics/t03/ledgers").await.unwrap(), vec!["0", "1", "2"]);
    // The root prefix keeps clusters apart in one etcd.
    let other = connect(cluster.endpoints(), "pages-other", 10).await;
    assert!(other.list("/").await.unwrap().is_empty());
    let mut raw = cluster.raw_client().await.unwrap();
    let all = raw.get("/magnetar/pages/", Some(GetOptions::new().with_prefix().with_count_only()));
    assert_eq!(all.await.unwrap().count(), listed.len() as i64);
    other.close().await.unwrap();
    store.close().await.unwrap();
}
