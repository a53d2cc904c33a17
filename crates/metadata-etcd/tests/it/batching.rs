//! Concurrent operations combined into few etcd requests (`src/batch.rs`), against a real
//! etcd on loopback: hundreds of callers at once each get their own operation's outcome
//! (creates, compare-and-set successes and conflicts, reads of what they wrote, a key written
//! by many at once), and etcd answers far fewer requests than there were operations.
//! Skipped with a notice when etcd is not installed, unless MAGNETAR_REQUIRE_ETCD=1.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use magnetar_etcd_testing::{etcd_or_skip, EtcdCluster};
use magnetar_metadata::{ExpectedVersion, MetadataError, MetadataStore};
use magnetar_metadata_etcd::{EtcdStore, EtcdStoreConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;

const WAIT: Duration = Duration::from_secs(30);
const CALLERS: usize = 300;

/// etcd's answered gRPC requests so far (Range and Txn), from its `/metrics`.
async fn etcd_requests(endpoint: &str) -> f64 {
    let address = endpoint.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address).await.expect("connect to etcd");
    let request = format!("GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("ask for metrics");
    let mut body = String::new();
    stream.read_to_string(&mut body).await.expect("read metrics");
    body.lines()
        .filter(|line| line.starts_with("grpc_server_handled_total{"))
        .filter(|line| {
            line.contains("grpc_method=\"Range\"") || line.contains("grpc_method=\"Txn\"")
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Runs `f(store, i)` for every caller at once; the outcomes in caller order.
async fn all<T, Fut>(store: &Arc<EtcdStore>, f: impl Fn(Arc<EtcdStore>, usize) -> Fut) -> Vec<T>
where
    T: Send + 'static,
    Fut: std::future::Future<Output = T> + Send + 'static,
{
    let tasks: Vec<_> = (0..CALLERS).map(|i| tokio::spawn(f(store.clone(), i))).collect();
    let mut out = Vec::new();
    for task in tasks {
        out.push(timeout(WAIT, task).await.expect("bounded").expect("no panic"));
    }
    out
}

async fn create(store: Arc<EtcdStore>, i: usize) -> Result<u64, MetadataError> {
    store.put(&format!("/k/{i}"), Bytes::from(format!("v{i}")), ExpectedVersion::Absent).await
}

/// Reads another caller's key, then a compare-and-set of its own from version 1 (even
/// callers) or from a version the key does not have (odd ones).
async fn update(store: Arc<EtcdStore>, i: usize) -> Result<u64, MetadataError> {
    let other = store.get(&format!("/k/{}", (i + 1) % CALLERS)).await?.expect("exists");
    assert!(other.version >= 1);
    let expected = ExpectedVersion::Exactly(if i.is_multiple_of(2) { 1 } else { 7 });
    store.put(&format!("/k/{i}"), Bytes::from(format!("u{i}")), expected).await
}

/// One compare-and-set of the hot key from the version read, retried on conflicts.
async fn bump(store: Arc<EtcdStore>, _i: usize) -> Result<u64, MetadataError> {
    loop {
        let current = store.get("/hot").await?.expect("exists");
        let expected = ExpectedVersion::Exactly(current.version);
        match store.put("/hot", current.value.clone(), expected).await {
            Err(MetadataError::BadVersion { .. }) => continue,
            other => return other,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_share_requests_and_each_gets_its_own_outcome() {
    let Some(binary) = etcd_or_skip("batching") else { return };
    let cluster = EtcdCluster::start(&binary, 1).await.expect("start etcd");
    let endpoint = cluster.endpoint(0);
    let config = EtcdStoreConfig::new(cluster.endpoints(), "batching");
    let store: Arc<EtcdStore> =
        Arc::new(timeout(WAIT, EtcdStore::connect(config)).await.unwrap().expect("connect"));
    let before = etcd_requests(&endpoint).await;

    for (i, outcome) in all(&store, create).await.into_iter().enumerate() {
        assert_eq!(outcome.unwrap(), 1, "create {i}");
    }
    // The same creates again: each a conflict naming version 1, nothing overwritten.
    for (i, outcome) in all(&store, create).await.into_iter().enumerate() {
        match outcome {
            Err(MetadataError::BadVersion { actual: Some(1), .. }) => {}
            other => panic!("create {i} again: {other:?}"),
        }
    }
    for (i, outcome) in all(&store, update).await.into_iter().enumerate() {
        match (i % 2, outcome) {
            (0, Ok(2)) => {}
            (1, Err(MetadataError::BadVersion { actual: Some(1), .. })) => {}
            (_, other) => panic!("update {i}: {other:?}"),
        }
    }
    // Every key holds what its own caller wrote.
    let keys: Vec<String> = (0..CALLERS).map(|i| format!("/k/{i}")).collect();
    for (i, found) in store.get_many(&keys).await.unwrap().into_iter().enumerate() {
        let found = found.expect("exists");
        let (value, version) =
            if i.is_multiple_of(2) { (format!("u{i}"), 2) } else { (format!("v{i}"), 1) };
        assert_eq!((found.value, found.version), (Bytes::from(value), version), "key {i}");
    }
    let operations = 4 * CALLERS + 1;
    let spent = etcd_requests(&endpoint).await - before;
    eprintln!("batching: {spent} etcd requests for {operations} operations");
    assert!(spent < (operations / 2) as f64, "{spent} requests for {operations} operations");

    // One key written by every caller at once, each from the version it read: no write lost
    // or applied twice (the versions acknowledged are distinct, the last is the count).
    store.put("/hot", Bytes::from_static(b"0"), ExpectedVersion::Absent).await.unwrap();
    let mut versions: Vec<u64> = all(&store, bump).await.into_iter().map(|v| v.unwrap()).collect();
    versions.sort_unstable();
    versions.dedup();
    assert_eq!(versions.len(), CALLERS, "every bump acknowledged at a version of its own");
    let hot = store.get("/hot").await.unwrap().unwrap();
    assert_eq!(hot.version, CALLERS as u64 + 1);
    store.close().await.unwrap();
}
