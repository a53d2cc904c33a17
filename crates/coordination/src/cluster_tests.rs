//! The shell over an in-memory store whose clients are separate brokers: assignment by
//! lookup, redirects, takeover after a lost session or a dead owner, release, split.

use super::*;
use magnetar_metadata::{MemoryStore, MetadataStore};

const NS_DOC: &str = r#"{"bundles":{"boundaries":["0x00000000","0x40000000","0x80000000","0xc0000000","0xffffffff"],"numBundles":4}}"#;

fn urls(id: &str, web_port: u16) -> BrokerUrls {
    BrokerUrls {
        id: id.to_string(),
        service_url: format!("pulsar://{id}"),
        service_url_tls: None,
        web_url: format!("http://127.0.0.1:{web_port}"),
        web_url_tls: None,
        listeners: Default::default(),
    }
}

/// A closed loopback port: probes of it are refused.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

fn quiet() -> CoordinationConfig {
    CoordinationConfig { probe_interval: Duration::from_secs(3600), ..Default::default() }
}

async fn register(store: &MemoryStore, broker: &BrokerUrls) {
    let registration = serde_json::json!({
        "pulsarServiceUrl": broker.service_url,
        "webServiceUrl": broker.web_url,
        "startTimestamp": 0,
        "brokerVersion": "test",
    });
    store
        .put_ephemeral(
            &format!("/brokers/{}", broker.id),
            Bytes::from(registration.to_string()),
            ExpectedVersion::Any,
        )
        .await
        .unwrap();
}

struct Broker {
    store: Arc<MemoryStore>,
    ownership: Arc<ClusterOwnership>,
    /// Its web port: connections to it are accepted (by the kernel; nothing answers them).
    _web: Option<std::net::TcpListener>,
}

/// A broker whose web port listens (a lookup's probe finds it there).
async fn broker(shared: &MemoryStore, id: &str, config: CoordinationConfig) -> Broker {
    let web = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = web.local_addr().unwrap().port();
    start_broker(shared, id, config, port, Some(web)).await
}

/// A broker whose web port is closed: every probe of it is refused, though its session lives.
async fn deaf_broker(shared: &MemoryStore, id: &str, config: CoordinationConfig) -> Broker {
    start_broker(shared, id, config, closed_port(), None).await
}

async fn start_broker(
    shared: &MemoryStore,
    id: &str,
    config: CoordinationConfig,
    web_port: u16,
    web: Option<std::net::TcpListener>,
) -> Broker {
    let store = Arc::new(shared.peer());
    let me = urls(id, web_port);
    register(&store, &me).await;
    let ownership = ClusterOwnership::start(store.clone(), me, config).await.unwrap();
    Broker { store, ownership, _web: web }
}

/// Waits (bounded) until `done` holds: the shell applies watch events on tasks of its own.
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "not within 10 s: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn store_with_namespace() -> MemoryStore {
    let store = MemoryStore::new();
    store
        .put("/admin/namespaces/public/default", NS_DOC.into(), ExpectedVersion::Any)
        .await
        .unwrap();
    store
}

fn topic(name: &str) -> TopicName {
    TopicName::parse(&format!("persistent://public/default/{name}")).unwrap()
}

fn connect_id(answer: &Lookup) -> &str {
    match answer {
        Lookup::Connect(urls) => &urls.id,
        other => panic!("expected Connect, got {other:?}"),
    }
}

#[tokio::test]
async fn a_lookup_assigns_the_bundle_once_and_every_broker_answers_the_owner() {
    let shared = store_with_namespace().await;
    let b1 = broker(&shared, "b1:1", quiet()).await;
    let b2 = broker(&shared, "b2:1", quiet()).await;
    eventually("both brokers see both", || {
        b1.ownership.load().len() == 2 && b2.ownership.load().len() == 2
    })
    .await;
    let t = topic("t1");
    let first = b1.ownership.lookup(&t, false).await.unwrap();
    let owner = match &first {
        Lookup::Connect(urls) => urls.id.clone(),
        Lookup::Redirect { broker, authoritative } => {
            assert!(*authoritative, "a redirect to the chosen broker is authoritative");
            assert_eq!(broker.id, "b2:1");
            let at_candidate = b2.ownership.lookup(&t, true).await.unwrap();
            connect_id(&at_candidate).to_string()
        }
    };
    let (owning, other) = if owner == "b1:1" { (&b1, &b2) } else { (&b2, &b1) };
    owning.ownership.check_serve(&t).await.unwrap();
    assert!(matches!(
        other.ownership.check_serve(&t).await,
        Err(CoordinationError::NotServed { .. })
    ));
    assert_eq!(connect_id(&other.ownership.lookup(&t, false).await.unwrap()), owner);
    // Even an authoritative lookup at the other broker answers the live owner.
    assert_eq!(connect_id(&other.ownership.lookup(&t, true).await.unwrap()), owner);
    assert_eq!(owning.ownership.owned_bundles().len(), 1);
    let record = shared
        .get(&ownership_key(t.namespace(), owning.ownership.bundle_of(&t).await.unwrap()))
        .await
        .unwrap()
        .unwrap();
    let stored: serde_json::Value = serde_json::from_slice(&record.value).unwrap();
    assert_eq!(stored["state"], "Owned");
    assert_eq!(stored["dst"], owner.as_str());
    assert_eq!(stored["nativeUrl"], format!("pulsar://{owner}"));
}

#[tokio::test]
async fn bundles_spread_over_the_brokers() {
    let shared = store_with_namespace().await;
    let brokers = [
        broker(&shared, "b1:1", quiet()).await,
        broker(&shared, "b2:1", quiet()).await,
        broker(&shared, "b3:1", quiet()).await,
    ];
    eventually("every broker sees three", || brokers.iter().all(|b| b.ownership.load().len() == 3))
        .await;
    // Topics until every one of the four bundles is owned.
    for i in 0..64 {
        let t = topic(&format!("spread-{i}"));
        let at = &brokers[i % 3];
        match at.ownership.lookup(&t, false).await.unwrap() {
            Lookup::Connect(_) => {}
            Lookup::Redirect { broker, .. } => {
                let target = brokers.iter().find(|b| b.ownership.me().id == broker.id).unwrap();
                target.ownership.lookup(&t, true).await.unwrap();
            }
        }
        // The counts every broker places by follow the records.
        let owned: usize = brokers.iter().map(|b| b.ownership.owned_bundles().len()).sum();
        eventually("counts follow", || {
            brokers.iter().all(|b| b.ownership.load().values().sum::<usize>() == owned)
        })
        .await;
    }
    let counts: Vec<usize> = brokers.iter().map(|b| b.ownership.owned_bundles().len()).collect();
    assert_eq!(counts.iter().sum::<usize>(), 4, "{counts:?}");
    assert!(counts.iter().all(|&n| (1..=2).contains(&n)), "least loaded first: {counts:?}");
}

#[tokio::test]
async fn a_lost_session_keeps_the_bundles_served_and_writes_their_records_again() {
    let shared = store_with_namespace().await;
    let b1 = broker(&shared, "b1:1", quiet()).await;
    let t = topic("t-lost");
    assert_eq!(connect_id(&b1.ownership.lookup(&t, false).await.unwrap()), "b1:1");
    let key = ownership_key(t.namespace(), b1.ownership.bundle_of(&t).await.unwrap());
    let before = shared.get(&key).await.unwrap().unwrap().version;
    b1.store.expire_session().unwrap();
    // The old record went with the session; the new session writes it again.
    let mut rewritten = false;
    for _ in 0..2000 {
        if shared.get(&key).await.unwrap().is_some_and(|v| v.version != before || v.version == 1) {
            rewritten = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(rewritten, "the record is written again under the new session");
    b1.ownership.check_serve(&t).await.unwrap();
    // The broker's registration comes back with the session too (`registration.rs` does it).
    register(&b1.store, b1.ownership.me()).await;
    let b2 = broker(&shared, "b2:1", quiet()).await;
    eventually("b2 sees b1", || b2.ownership.load().contains_key("b1:1")).await;
    assert_eq!(connect_id(&b2.ownership.lookup(&t, false).await.unwrap()), "b1:1");
}

#[tokio::test]
async fn a_broker_whose_bundle_was_taken_while_its_session_was_lost_gives_it_up() {
    let shared = store_with_namespace().await;
    let b1 = broker(&shared, "b1:1", quiet()).await;
    let t = topic("t-taken");
    b1.ownership.lookup(&t, false).await.unwrap();
    let key = ownership_key(t.namespace(), b1.ownership.bundle_of(&t).await.unwrap());
    // Another broker's record in its place (as after a takeover while b1 was cut off).
    let theirs = serde_json::json!({"state": "Owned", "dst": "b9:1", "src": null,
        "nativeUrl": "pulsar://b9:1", "nativeUrlTls": null, "httpUrl": "http://b9:1",
        "httpUrlTls": null, "disabled": false});
    let mut lost = b1.ownership.lost();
    shared.put(&key, Bytes::from(theirs.to_string()), ExpectedVersion::Any).await.unwrap();
    let gone = tokio::time::timeout(Duration::from_secs(10), lost.recv()).await.unwrap().unwrap();
    assert_eq!(ownership_key(&gone.namespace, gone.range), key);
    assert!(b1.ownership.check_serve(&t).await.is_err());
}

#[tokio::test]
async fn a_dead_owner_is_taken_over_before_its_session_ends_and_learns_it_lost() {
    let shared = store_with_namespace().await;
    let fast =
        CoordinationConfig { probe_interval: Duration::from_millis(20), ..Default::default() };
    // b1's web port is closed: b2's probes are refused, though b1's session lives on.
    let b1 = deaf_broker(&shared, "b1:1", quiet()).await;
    let t = topic("t-dead");
    assert_eq!(connect_id(&b1.ownership.lookup(&t, false).await.unwrap()), "b1:1");
    let mut lost = b1.ownership.lost();
    let b2 = broker(&shared, "b2:1", fast).await;
    eventually("b2 finds b1 dead", || b2.ownership.is_dead("b1:1")).await;
    assert_eq!(connect_id(&b2.ownership.lookup(&t, false).await.unwrap()), "b2:1");
    // b1 (slow, not dead) sees the record change and stops serving.
    let gone = tokio::time::timeout(Duration::from_secs(10), lost.recv()).await.unwrap().unwrap();
    assert_eq!(gone.namespace, *t.namespace());
    assert!(b1.ownership.check_serve(&t).await.is_err());
    let servers = [&b1, &b2].iter().filter(|b| b.ownership.owned_bundles().len() == 1).count();
    assert_eq!(servers, 1, "one broker serves the bundle");
    // b1, asked now, sends clients to b2 (b1 does not probe: b2 counts as alive).
    assert_eq!(connect_id(&b1.ownership.lookup(&t, false).await.unwrap()), "b2:1");
}

#[tokio::test]
async fn a_released_bundle_is_free_and_not_retaken_while_releasing() {
    let shared = store_with_namespace().await;
    let b1 = broker(&shared, "b1:1", quiet()).await;
    let t = topic("t-release");
    b1.ownership.lookup(&t, false).await.unwrap();
    let range = b1.ownership.bundle_of(&t).await.unwrap();
    let keys = b1.ownership.stop_serving(t.namespace(), Some(range));
    assert_eq!(keys, vec![ownership_key(t.namespace(), range)]);
    assert!(b1.ownership.in_bundles(&t, &keys));
    assert!(b1.ownership.check_serve(&t).await.is_err(), "not served while releasing");
    assert!(matches!(b1.ownership.lookup(&t, false).await, Err(CoordinationError::Releasing(_))));
    b1.ownership.released(&keys).await.unwrap();
    assert!(shared.get(&keys[0]).await.unwrap().is_none(), "the record is deleted: Free");
    assert_eq!(connect_id(&b1.ownership.lookup(&t, false).await.unwrap()), "b1:1");
}

#[tokio::test]
async fn a_restarted_broker_takes_its_old_records_back() {
    let shared = store_with_namespace().await;
    let first = broker(&shared, "b1:1", quiet()).await;
    let t = topic("t-restart");
    first.ownership.lookup(&t, false).await.unwrap();
    // The same broker id, a new process (session): the old one's lease has not run out.
    let second = broker(&shared, "b1:1", quiet()).await;
    assert_eq!(connect_id(&second.ownership.lookup(&t, false).await.unwrap()), "b1:1");
    second.ownership.check_serve(&t).await.unwrap();
    first.store.expire_session().unwrap();
    let key = ownership_key(t.namespace(), second.ownership.bundle_of(&t).await.unwrap());
    assert!(shared.get(&key).await.unwrap().is_some(), "bound to the new session now");
}

#[tokio::test]
async fn a_split_bundle_s_halves_stay_with_its_owner() {
    let shared = store_with_namespace().await;
    let b1 = broker(&shared, "b1:1", quiet()).await;
    let t = topic("t-split");
    b1.ownership.lookup(&t, false).await.unwrap();
    let parent = b1.ownership.bundle_of(&t).await.unwrap();
    let bundles = Bundles::even(4).unwrap();
    let middle = parent.lower + (parent.upper - parent.lower) / 2;
    let split = bundles.split_at(parent, middle).unwrap();
    let doc = serde_json::json!({"bundles": {"boundaries": split.boundary_strings(), "numBundles": split.len()}});
    shared
        .put("/admin/namespaces/public/default", doc.to_string().into(), ExpectedVersion::Any)
        .await
        .unwrap();
    eventually("the halves are owned", || b1.ownership.owned_bundles().len() == 2).await;
    b1.ownership.check_serve(&t).await.unwrap();
    assert!(shared.get(&ownership_key(t.namespace(), parent)).await.unwrap().is_none());
}

/// `b1` owns `t`'s bundle (an authoritative lookup there takes it) and `b2` knows it.
async fn owned_by_b1(shared: &MemoryStore, name: &str) -> (Broker, Broker, TopicName, String) {
    let b1 = broker(shared, "b1:1", quiet()).await;
    let b2 = broker(shared, "b2:1", quiet()).await;
    let t = topic(name);
    assert_eq!(connect_id(&b1.ownership.lookup(&t, true).await.unwrap()), "b1:1");
    let key = ownership_key(t.namespace(), b1.ownership.bundle_of(&t).await.unwrap());
    eventually("b2 sees b1's record", || b2.ownership.load().get("b1:1") == Some(&1)).await;
    (b1, b2, t, key)
}

async fn stored_state(shared: &MemoryStore, key: &str) -> (String, Option<String>) {
    let found = shared.get(key).await.unwrap().expect("a record");
    let record: StoredRecord = serde_json::from_slice(&found.value).unwrap();
    (record.state, record.dst)
}

#[tokio::test]
async fn an_unload_hands_the_bundle_over_and_its_clients_wait_there_for_the_old_owner() {
    let shared = store_with_namespace().await;
    let (b1, b2, t, key) = owned_by_b1(&shared, "t-hand-over").await;
    let range = b1.ownership.bundle_of(&t).await.unwrap();
    let keys = b1.ownership.stop_serving(t.namespace(), Some(range));
    let handed = b1.ownership.begin_hand_over(&keys, None).await;
    assert_eq!(handed.get(&key).map(|b| b.id.as_str()), Some("b2:1"));
    assert_eq!(b1.ownership.handed_over_to(&t).map(|b| b.id), Some("b2:1".to_string()));
    assert_eq!(stored_state(&shared, &key).await, ("Releasing".into(), Some("b2:1".into())));
    // Lookups anywhere send clients to b2, which holds them until b1 is done.
    assert_eq!(connect_id(&b1.ownership.lookup(&t, false).await.unwrap()), "b2:1");
    eventually("b2 sees the hand-over", || b2.ownership.load().get("b2:1") == Some(&1)).await;
    assert_eq!(connect_id(&b2.ownership.lookup(&t, false).await.unwrap()), "b2:1");
    let waiting = {
        let b2 = b2.ownership.clone();
        let t = t.clone();
        tokio::spawn(async move { b2.check_serve(&t).await })
    };
    tokio::pin!(waiting);
    eventually("b2 holds the request", || b2.ownership.hand_over_waits() == 1).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(200), &mut waiting).await.is_err(),
        "b2 serves nothing before b1 has closed the bundle's topics"
    );
    b1.ownership.released(&keys).await.unwrap();
    let served = tokio::time::timeout(HAND_OVER_WAIT, waiting).await.expect("b2 serves");
    served.unwrap().unwrap();
    assert_eq!(stored_state(&shared, &key).await, ("Owned".into(), Some("b2:1".into())));
    assert!(b1.ownership.check_serve(&t).await.is_err());
    assert_eq!(b1.ownership.handed_over_to(&t), None);
    eventually("b1 sees b2 own it", || b1.ownership.load().get("b2:1") == Some(&1)).await;
    assert_eq!(connect_id(&b1.ownership.lookup(&t, false).await.unwrap()), "b2:1");
}

#[tokio::test]
async fn the_new_owner_takes_a_handed_over_bundle_with_no_client_asking() {
    let shared = store_with_namespace().await;
    let (b1, b2, t, key) = owned_by_b1(&shared, "t-eager").await;
    let keys = b1.ownership.stop_serving(t.namespace(), None);
    b1.ownership.begin_hand_over(&keys, None).await;
    b1.ownership.released(&keys).await.unwrap();
    eventually("b2 owns it", || b2.ownership.owned_bundles().len() == 1).await;
    assert_eq!(stored_state(&shared, &key).await, ("Owned".into(), Some("b2:1".into())));
}

#[tokio::test]
async fn an_unload_through_another_broker_asks_the_owner_to_hand_over() {
    let shared = store_with_namespace().await;
    let (b1, b2, t, key) = owned_by_b1(&shared, "t-asked").await;
    let mut lost = b1.ownership.lost();
    let range = b2.ownership.bundle_of(&t).await.unwrap();
    assert_eq!(b2.ownership.unload_elsewhere(t.namespace(), Some(range), None).await.unwrap(), 1);
    let asked = tokio::time::timeout(Duration::from_secs(10), lost.recv()).await.unwrap().unwrap();
    let release = asked.release.expect("a hand-over, not a loss");
    assert_eq!(release.key, key);
    assert_eq!(release.to.map(|b| b.id), Some("b2:1".to_string()));
    assert!(b1.ownership.check_serve(&t).await.is_err(), "b1 stopped serving it");
    assert_eq!(b1.ownership.handed_over_to(&t).map(|b| b.id), Some("b2:1".to_string()));
    // The broker closes the topics, then lets the bundle go.
    b1.ownership.released(std::slice::from_ref(&key)).await.unwrap();
    eventually("b2 owns it", || b2.ownership.owned_bundles().len() == 1).await;
    b2.ownership.check_serve(&t).await.unwrap();
}

#[tokio::test]
async fn an_unload_with_a_destination_broker_hands_the_bundle_to_that_broker() {
    let shared = store_with_namespace().await;
    let (b1, b2, t, key) = owned_by_b1(&shared, "t-destination").await;
    let b3 = broker(&shared, "b3:1", quiet()).await;
    eventually("b2 knows b3", || b2.ownership.check_destination("b3:1").is_ok()).await;
    assert!(matches!(
        b2.ownership.check_destination("nowhere:1"),
        Err(CoordinationError::NotABroker(_))
    ));
    let mut lost = b1.ownership.lost();
    let range = b2.ownership.bundle_of(&t).await.unwrap();
    // The owner itself as the destination: nothing to do.
    assert_eq!(
        b2.ownership.unload_elsewhere(t.namespace(), Some(range), Some("b1:1")).await.unwrap(),
        0
    );
    assert_eq!(
        b2.ownership.unload_elsewhere(t.namespace(), Some(range), Some("b3:1")).await.unwrap(),
        1
    );
    let asked = tokio::time::timeout(Duration::from_secs(10), lost.recv()).await.unwrap().unwrap();
    assert_eq!(asked.release.and_then(|r| r.to).map(|b| b.id), Some("b3:1".to_string()));
    b1.ownership.released(std::slice::from_ref(&key)).await.unwrap();
    eventually("b3 owns it", || b3.ownership.owned_bundles().len() == 1).await;
    assert_eq!(stored_state(&shared, &key).await, ("Owned".into(), Some("b3:1".into())));
    // And from the owner: b3 hands it back to b1, not to the least-loaded b2.
    eventually("b3 knows b1", || b3.ownership.check_destination("b1:1").is_ok()).await;
    let keys = b3.ownership.stop_serving(t.namespace(), None);
    let handed = b3.ownership.begin_hand_over(&keys, Some("b1:1")).await;
    assert_eq!(handed.get(&key).map(|b| b.id.as_str()), Some("b1:1"));
}

#[tokio::test]
async fn a_hand_over_whose_old_owner_vanishes_is_taken_by_the_waiting_broker() {
    let shared = store_with_namespace().await;
    let (b1, b2, t, key) = owned_by_b1(&shared, "t-vanish").await;
    let keys = b1.ownership.stop_serving(t.namespace(), None);
    b1.ownership.begin_hand_over(&keys, None).await;
    eventually("b2 sees the hand-over", || b2.ownership.load().get("b2:1") == Some(&1)).await;
    let waiting = {
        let b2 = b2.ownership.clone();
        let t = t.clone();
        tokio::spawn(async move { b2.check_serve(&t).await })
    };
    eventually("b2 holds the request", || b2.ownership.hand_over_waits() == 1).await;
    // b1's session ends mid-way (a crash): its Releasing record goes with it.
    b1.store.expire_session().unwrap();
    let served = tokio::time::timeout(HAND_OVER_WAIT, waiting).await.expect("b2 serves");
    served.unwrap().unwrap();
    assert_eq!(stored_state(&shared, &key).await, ("Owned".into(), Some("b2:1".into())));
}

#[tokio::test]
async fn with_no_other_broker_an_unload_frees_the_bundle() {
    let shared = store_with_namespace().await;
    let b1 = broker(&shared, "b1:1", quiet()).await;
    let t = topic("t-alone");
    b1.ownership.lookup(&t, false).await.unwrap();
    let keys = b1.ownership.stop_serving(t.namespace(), None);
    assert!(b1.ownership.begin_hand_over(&keys, None).await.is_empty());
    b1.ownership.released(&keys).await.unwrap();
    assert!(shared.get(&keys[0]).await.unwrap().is_none(), "Free");
}

struct NoTraffic;

impl TopicLoads for NoTraffic {
    fn topic_loads(&self) -> Vec<TopicLoad> {
        Vec::new()
    }
}

/// Topics loaded on a broker, each with a little traffic.
struct Loaded(Vec<TopicName>);

impl TopicLoads for Loaded {
    fn topic_loads(&self) -> Vec<TopicLoad> {
        let load =
            |name: &TopicName| TopicLoad { name: name.clone(), throughput: 1.0, msg_rate: 1.0 };
        self.0.iter().map(load).collect()
    }
}

#[tokio::test]
async fn the_leader_splits_a_bundle_past_its_topic_threshold_and_its_owner_keeps_the_halves() {
    let shared = store_with_namespace().await;
    let b1 = broker(&shared, "b1:1", quiet()).await;
    // Topics of the first bundle (0x00000000_0x40000000) only, loaded on b1.
    let mut topics = Vec::new();
    for i in 0..200 {
        let t = topic(&format!("t-{i}"));
        if b1.ownership.bundle_of(&t).await.unwrap().lower == 0 {
            b1.ownership.lookup(&t, true).await.unwrap();
            topics.push(t);
        }
    }
    assert!(topics.len() > 5, "{} topics in the first bundle", topics.len());
    let split = crate::splitter::SplitConfig { max_topics: 5, ..Default::default() };
    let config = LoadManagerConfig { split, ..fast_load_manager() };
    b1.ownership.start_load_manager(Arc::new(Loaded(topics.clone())), config);
    eventually("the bundle split, its halves owned by b1", || {
        let owned = b1.ownership.owned_bundles();
        owned.iter().any(|b| b.ends_with("/0x00000000_0x20000000"))
            && owned.iter().any(|b| b.ends_with("/0x20000000_0x40000000"))
    })
    .await;
    // Split again while past the threshold (each half still holds more than 5 of them).
    eventually("split further", || b1.ownership.owned_bundles().len() >= 3).await;
    let doc = shared.get("/admin/namespaces/public/default").await.unwrap().unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&doc.value).unwrap();
    assert!(doc["bundles"]["numBundles"].as_u64().unwrap() >= 5, "{doc}");
    for t in &topics {
        b1.ownership.check_serve(t).await.unwrap(); // every topic still served by its owner
    }
}

fn fast_load_manager() -> LoadManagerConfig {
    LoadManagerConfig { interval: Duration::from_millis(20), ..Default::default() }
}

/// Does what the broker does with a hand-over it is asked for: (no topics to close) lets go.
fn answer_hand_overs(broker: &Broker) {
    let mut lost = broker.ownership.lost();
    let ownership = Arc::downgrade(&broker.ownership);
    tokio::spawn(async move {
        while let Ok(bundle) = lost.recv().await {
            let (Some(release), Some(ownership)) = (bundle.release, ownership.upgrade()) else {
                continue;
            };
            ownership.released(std::slice::from_ref(&release.key)).await.unwrap();
        }
    });
}

#[tokio::test]
async fn one_leader_is_elected_and_a_new_broker_gets_bundles_from_the_fullest() {
    let shared = store_with_namespace().await;
    let b1 = broker(&shared, "b1:1", quiet()).await;
    for i in 0..40 {
        // Authoritative: b1 takes every bundle itself.
        b1.ownership.lookup(&topic(&format!("t-{i}")), true).await.unwrap();
    }
    assert_eq!(b1.ownership.owned_bundles().len(), 4);
    answer_hand_overs(&b1);
    b1.ownership.start_load_manager(Arc::new(NoTraffic), fast_load_manager());
    eventually("b1 leads", || b1.ownership.is_leader()).await;
    let b2 = broker(&shared, "b2:1", quiet()).await;
    answer_hand_overs(&b2);
    b2.ownership.start_load_manager(Arc::new(NoTraffic), fast_load_manager());
    eventually("b2 owns a bundle", || b2.ownership.owned_bundles().len() == 1).await;
    eventually("b2 sees the leader", || b2.ownership.leader().is_some()).await;
    assert_eq!(b2.ownership.leader().as_deref(), Some("b1:1"), "one leader");
    assert!(!b2.ownership.is_leader());
    assert_eq!(b1.ownership.owned_bundles().len(), 3);
    let moved = b2.ownership.owned_bundles().pop().unwrap();
    let key = format!("{OWNERSHIP_ROOT}/{moved}");
    assert_eq!(stored_state(&shared, &key).await, ("Owned".into(), Some("b2:1".into())));
}

#[tokio::test]
async fn the_leader_gives_a_dead_brokers_bundles_to_the_live_ones_at_once() {
    let shared = store_with_namespace().await;
    let b1 = broker(&shared, "b1:1", quiet()).await;
    for i in 0..40 {
        b1.ownership.lookup(&topic(&format!("t-{i}")), true).await.unwrap();
    }
    let leader = broker(&shared, "b2:1", quiet()).await;
    leader.ownership.start_load_manager(Arc::new(NoTraffic), fast_load_manager());
    eventually("b2 leads", || leader.ownership.is_leader()).await;
    let b3 = broker(&shared, "b3:1", quiet()).await;
    eventually("b2 sees b3", || leader.ownership.load().contains_key("b3:1")).await;
    // b1 is gone (its registration deleted; its records not yet, as before its lease ends).
    shared.delete("/brokers/b1:1", ExpectedVersion::Any).await.unwrap();
    eventually("b2 and b3 own b1's four bundles", || {
        leader.ownership.owned_bundles().len() + b3.ownership.owned_bundles().len() == 4
    })
    .await;
    assert_eq!(leader.ownership.owned_bundles().len(), 2, "spread over the live brokers");
}

async fn set_isolation(store: &MemoryStore, primary: &str, secondary: &str) {
    let policies = serde_json::json!({ "iso": {
        "namespaces": ["public/default"], "primary": [primary], "secondary": [secondary],
        "auto_failover_policy": {"policy_type": "min_available",
                                 "parameters": {"min_limit": "1", "usage_threshold": "80"}}
    }});
    let key = format!("/admin/clusters/c{ISOLATION_SUFFIX}");
    store.put(&key, Bytes::from(policies.to_string()), ExpectedVersion::Any).await.unwrap();
}

#[tokio::test]
async fn isolation_policies_steer_assignment_hand_over_and_misplaced_bundles() {
    let shared = store_with_namespace().await;
    let (b1, b2, t, key) = owned_by_b1(&shared, "t-isolated").await;
    let b3 = broker(&shared, "b3:1", quiet()).await;
    eventually("b1 knows b3", || b1.ownership.check_destination("b3:1").is_ok()).await;
    set_isolation(&shared, "b3:.*", "b2:1").await;
    let seen = |b: &Broker| !b.ownership.state.lock().isolation.is_empty();
    eventually("every broker sees the policy", || seen(&b1) && seen(&b2) && seen(&b3)).await;
    // A new bundle of the namespace: only the primary is a candidate, wherever the lookup lands.
    let other = (0..1000)
        .map(|i| topic(&format!("t-isolated-{i}")))
        .find(|o| b1.ownership.cached_bundle_of(o) != b1.ownership.cached_bundle_of(&t))
        .expect("a topic in another bundle");
    match b1.ownership.lookup(&other, false).await.unwrap() {
        Lookup::Redirect { broker, .. } => assert_eq!(broker.id, "b3:1"),
        answer => panic!("expected a redirect to b3, got {answer:?}"),
    }
    // b1 owns a bundle the policy gives to b3: the leader's pass moves it there.
    let mut lost = b1.ownership.lost();
    assert_eq!(b2.ownership.move_misplaced().await.unwrap(), 1);
    let asked = tokio::time::timeout(Duration::from_secs(10), lost.recv()).await.unwrap().unwrap();
    assert_eq!(asked.release.and_then(|r| r.to).map(|b| b.id), Some("b3:1".to_string()));
    b1.ownership.released(std::slice::from_ref(&key)).await.unwrap();
    let range = b1.ownership.bundle_of(&t).await.unwrap();
    eventually("b3 owns it", || b3.ownership.owns(t.namespace(), range)).await;
    assert_eq!(b2.ownership.move_misplaced().await.unwrap(), 0, "nothing left to move");
    // The primary gone: its bundles go to the secondary, never to b1.
    let keys = b3.ownership.stop_serving(t.namespace(), None);
    let handed = b3.ownership.begin_hand_over(&keys, None).await;
    assert_eq!(handed.get(&key).map(|b| b.id.as_str()), Some("b2:1"), "b3 is the only primary");
}

#[tokio::test]
async fn an_owner_whose_registration_was_not_read_yet_is_not_taken_for_dead() {
    let shared = store_with_namespace().await;
    let b1 = broker(&shared, "b1:1", quiet()).await;
    let b2 = broker(&shared, "b2:1", quiet()).await;
    eventually("b1 sees b2", || b1.ownership.load().contains_key("b2:1")).await;
    let t = topic("lagging-watch");
    assert_eq!(connect_id(&b2.ownership.lookup(&t, true).await.unwrap()), "b2:1");
    // As after a pause: b1 reads the record before its watch delivers b2's registration.
    b1.ownership.state.lock().brokers.remove("b2:1");
    let answer = b1.ownership.lookup(&t, true).await.unwrap();
    assert_eq!(connect_id(&answer), "b2:1", "the live owner keeps its bundle");
    assert!(b2.ownership.check_serve(&t).await.is_ok());
}

#[tokio::test]
async fn a_broker_without_a_session_takes_no_bundle() {
    let shared = store_with_namespace().await;
    let b1 = broker(&shared, "b1:1", quiet()).await;
    b1.ownership.state.lock().session_lost = true;
    let refused = b1.ownership.lookup(&topic("no-session"), true).await;
    assert!(matches!(refused, Err(CoordinationError::NoBroker(_))), "{refused:?}");
    b1.ownership.state.lock().session_lost = false;
    assert_eq!(connect_id(&b1.ownership.lookup(&topic("no-session"), true).await.unwrap()), "b1:1");
}

#[tokio::test]
async fn a_lookup_that_would_name_a_dead_owner_probes_it_and_takes_the_bundle_at_once() {
    let shared = store_with_namespace().await;
    let b1 = deaf_broker(&shared, "b1:1", quiet()).await;
    let t = topic("t-probed");
    assert_eq!(connect_id(&b1.ownership.lookup(&t, false).await.unwrap()), "b1:1");
    // b2 never probes on its own (an hour apart): its lookup's probes find nobody at b1's port.
    let b2 = broker(&shared, "b2:1", quiet()).await;
    eventually("b2 sees b1", || b2.ownership.load().contains_key("b1:1")).await;
    assert!(!b2.ownership.is_dead("b1:1"));
    assert_eq!(connect_id(&b2.ownership.lookup(&t, false).await.unwrap()), "b2:1");
    assert!(b2.ownership.is_dead("b1:1"), "two refused connections in a row");
    // A live owner (its port listens, though nothing answers: as a frozen one) keeps its bundle.
    let b3 = broker(&shared, "b3:1", quiet()).await;
    eventually("b3 sees b2", || b3.ownership.load().contains_key("b2:1")).await;
    assert_eq!(connect_id(&b3.ownership.lookup(&t, false).await.unwrap()), "b2:1");
    assert!(!b3.ownership.is_dead("b2:1"));
}
