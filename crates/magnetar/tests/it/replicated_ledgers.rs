//! Replicated ledgers across real processes on loopback: etcd, three `magnetar storage` nodes,
//! and the replication client (`magnetar-ledger-replicated`) in this test process.
//! * Qw = Qa = 2: a node of the ensemble is SIGKILLed mid-stream; every append is still
//!   acknowledged (the writer replaces the node by an ensemble change), and every entry reads
//!   back with its bytes.
//! * Another client (its own etcd session, as another process would be) fences the ledger: it
//!   closes at or above every acknowledged entry, and the old writer's next append is refused.
//! * The killed node, restarted on its data directory, serves the entries it held (read from
//!   it alone once the other node of its fragment is killed).
//! * Deleted, the ledger is freed on the nodes that hold it (their garbage collection); a node
//!   that fenced it keeps the fence (the old writer is still refused), also after a restart.
//! * Reads go around a frozen (SIGSTOPped) replica after the speculative wait, and fail within
//!   the read timeout when every replica is frozen.
//! * A node short of disk registers read-only: no new ledger is placed on it, and it refuses a
//!   normal add sent to it directly while it still answers a fencing read.
//! * A node id that held data is refused on an emptied directory or in another cluster (its
//!   cookie), and a second node on a directory in use is refused.
//! * A node takes its journal settings from `--config` (a bad file refused before anything is
//!   created) and serves its metrics at `--metrics-listen`.
//! * Nodes with `[tls]` and client certificates required serve a client with the CA and a
//!   certificate it signed, and answer no plain-TCP request, no TLS client without a
//!   certificate or with another CA's; a client without a trust file places nothing on them.
//!
//! Every wait is bounded; only processes this test started are signalled, by PID. Skipped with
//! a notice without etcd, unless MAGNETAR_REQUIRE_ETCD=1.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use magnetar_etcd_testing::{etcd_or_skip, EtcdCluster};
use magnetar_ledger::{LedgerError, LedgerMetadata, LedgerStorage};
use magnetar_ledger_replicated::{ReplicatedConfig, ReplicatedLedgers};
use magnetar_metadata::{ExpectedVersion, MetadataStore};
use magnetar_metadata_etcd::{EtcdStore, EtcdStoreConfig};
use magnetar_model::keys;
use magnetar_model::storage_nodes::{
    IsolationGroups, RackInfo, StorageNodeCookie, StorageNodeRacks, StorageNodeRegistration,
};
use magnetar_replication::message::{ErrorCode, Request, Response};
use magnetar_replication::meta::{LedgerMeta, LedgerState};
use magnetar_replication::wire::{self, Message};
use magnetar_replication::NodeId;
use magnetar_test_support::tls::TestCa;
use tokio::sync::mpsc;

const WAIT: Duration = Duration::from_secs(60);

/// A `magnetar storage` child, killed (by PID) when dropped.
struct StorageNode {
    child: Child,
    id: u64,
    address: String,
    log: std::path::PathBuf,
}

impl StorageNode {
    fn start(url: &str, cluster: &str, dir: &Path) -> StorageNode {
        StorageNode::start_with(url, cluster, dir, &[])
    }

    /// Node number `i` of a test, its data in `dir/node{i}` (the same again after a restart).
    fn numbered(url: &str, cluster: &str, dir: &Path, i: usize) -> StorageNode {
        StorageNode::start(url, cluster, &dir.join(format!("node{i}")))
    }

    /// Nodes `0..n`, see [`StorageNode::numbered`].
    fn first(n: usize, url: &str, cluster: &str, dir: &Path) -> Vec<StorageNode> {
        (0..n).map(|i| StorageNode::numbered(url, cluster, dir, i)).collect()
    }

    fn start_with(url: &str, cluster: &str, dir: &Path, extra: &[&str]) -> StorageNode {
        let mut args = vec!["--metadata", url, "--cluster", cluster, "--gc-seconds", "1"];
        args.extend_from_slice(extra);
        StorageNode::spawn(&args, dir)
    }

    /// `magnetar storage ARGS` on a free port, its data in `dir` and its log beside it;
    /// returns once it says it listens.
    fn spawn(args: &[&str], dir: &Path) -> StorageNode {
        let mut child = storage_command(args, dir)
            .stderr(std::fs::File::create(dir.with_extension("log")).unwrap())
            .spawn()
            .unwrap();
        // The node prints one line once registered and listening; read it on a thread so the
        // wait is bounded.
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx
            .recv_timeout(WAIT)
            .unwrap_or_else(|_| panic!("storage node in {dir:?} did not start"));
        // "storage node ID listening on ADDRESS"
        let (id, address) = line
            .strip_prefix("storage node ")
            .and_then(|rest| rest.split_once(" listening on "))
            .and_then(|(id, address)| Some((id.parse().ok()?, address.trim().to_string())))
            .unwrap_or_else(|| {
                panic!("unexpected first line {line:?}; log in {:?}", dir.with_extension("log"))
            });
        StorageNode { child, id, address, log: dir.with_extension("log") }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for StorageNode {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One etcd on loopback, ready, and its `etcd://` URL for `magnetar storage --metadata`;
/// `None` (the test passes as skipped) without an etcd binary.
async fn one_etcd(test: &str) -> Option<(EtcdCluster, String)> {
    let etcd_binary = etcd_or_skip(test)?;
    let mut etcd = EtcdCluster::start(&etcd_binary, 1).await.unwrap();
    etcd.wait_ready(WAIT).await.unwrap();
    let url = format!("etcd://{}", etcd.endpoint(0).trim_start_matches("http://"));
    Some((etcd, url))
}

async fn client(endpoints: Vec<String>, cluster: &str) -> (Arc<EtcdStore>, Arc<ReplicatedLedgers>) {
    let config =
        ReplicatedConfig { add_timeout: Duration::from_secs(2), ..ReplicatedConfig::default() };
    client_with(endpoints, cluster, config).await
}

async fn client_with(
    endpoints: Vec<String>,
    cluster: &str,
    config: ReplicatedConfig,
) -> (Arc<EtcdStore>, Arc<ReplicatedLedgers>) {
    let store = Arc::new(
        tokio::time::timeout(WAIT, EtcdStore::connect(EtcdStoreConfig::new(endpoints, cluster)))
            .await
            .expect("connect in time")
            .expect("connect to etcd"),
    );
    let ledgers =
        ReplicatedLedgers::start(store.clone(), config).await.expect("replication client");
    (store, ledgers)
}

async fn stored_meta(store: &EtcdStore, ledger: u64) -> LedgerMeta {
    let value =
        store.get(&magnetar_model::keys::ledger(ledger)).await.unwrap().expect("ledger metadata");
    LedgerMeta::from_json(&value.value).unwrap()
}

/// The value of the sample `name{...}` (labels holding `labels`) in the client's metrics, 0
/// when absent.
fn client_metric(ledgers: &ReplicatedLedgers, name: &str, labels: &str) -> f64 {
    let mut out = magnetar_metrics::Exposition::new(magnetar_metrics::Format::Prometheus);
    LedgerStorage::write_metrics(ledgers, &mut out, &[("cluster", "replicated")]);
    let text = out.finish();
    text.lines()
        .filter(|line| line.starts_with(&format!("{name}{{")) && line.contains(labels))
        .filter_map(|line| line.rsplit_once(' ')?.1.parse().ok())
        .next()
        .unwrap_or(0.0)
}

fn data(entry: u64) -> Bytes {
    Bytes::from(format!("entry {entry} ").repeat(8))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_writes_survive_a_killed_node_and_a_recovery_fences_the_writer() {
    let Some((etcd, url)) = one_etcd("replicated ledgers").await else { return };
    let dir = tempfile::tempdir().unwrap();
    let cluster = "replicated";
    let mut nodes: Vec<StorageNode> = StorageNode::first(3, &url, cluster, dir.path());

    let (store, ledgers) = client(etcd.endpoints(), cluster).await;
    assert_eq!(ledgers.nodes().live().len(), 3, "every node registered before it printed its line");
    let ledger = 1;
    let persistence = LedgerMetadata {
        ensemble_size: 2,
        write_quorum: 2,
        ack_quorum: 2,
        properties: BTreeMap::new(),
        isolation: None,
    };
    ledgers.create(ledger, &persistence).await.unwrap();
    let first_ensemble = stored_meta(&store, ledger).await.fragments[0].ensemble.clone();
    // A second ledger stays empty until the kill (two 2-node ensembles of 3 nodes share one).
    let empty = 2;
    ledgers.create(empty, &persistence).await.unwrap();
    let empty_ensemble = stored_meta(&store, empty).await.fragments[0].ensemble.clone();

    // 3,000 entries, at most 256 unacknowledged; a node of the ensemble is killed after 1,000.
    let total = 3_000u64;
    let (acks, mut acked) = mpsc::unbounded_channel();
    let mut outcomes = BTreeMap::new();
    let mut killed = None;
    for entry in 0..total {
        while entry - outcomes.len() as u64 >= 256 {
            let (e, result) =
                tokio::time::timeout(WAIT, acked.recv()).await.expect("acks keep coming").unwrap();
            outcomes.insert(e, result);
        }
        if entry == 1_000 {
            let in_both = |n: &&mut StorageNode| {
                first_ensemble.contains(&NodeId(n.id)) && empty_ensemble.contains(&NodeId(n.id))
            };
            let victim = nodes.iter_mut().find(in_both).unwrap();
            victim.kill();
            killed = Some(NodeId(victim.id));
        }
        let acks = acks.clone();
        ledgers
            .append(
                ledger,
                entry,
                data(entry),
                Box::new(move |result| drop(acks.send((entry, result)))),
            )
            .unwrap();
    }
    while (outcomes.len() as u64) < total {
        let (e, result) =
            tokio::time::timeout(WAIT, acked.recv()).await.expect("every add answered").unwrap();
        outcomes.insert(e, result);
    }
    for (entry, result) in &outcomes {
        assert_eq!(result.as_ref().ok(), Some(entry), "entry {entry}: {result:?}");
    }

    let meta = stored_meta(&store, ledger).await;
    println!("after the kill: {meta:?}");
    assert!(meta.fragments.len() >= 2, "an ensemble change was recorded: {meta:?}");
    assert!(!meta.last_fragment().ensemble.contains(&killed.unwrap()), "{meta:?}");
    // The client's metrics count the change and the requests the killed node left unanswered.
    let changes = client_metric(&ledgers, "magnetar_ledger_client_ensemble_changes_total", "");
    assert_eq!(changes, (meta.fragments.len() - 1) as f64, "{meta:?}");
    assert!(client_metric(&ledgers, "magnetar_ledger_client_unanswered_requests_total", "") >= 1.0);
    assert_eq!(client_metric(&ledgers, "magnetar_ledger_client_open_ledgers", ""), 2.0);
    // The empty ledger's first add finds the node dead: its one fragment's nodes are replaced
    // in place (no entry of it was acknowledged), which counts as an ensemble change too.
    let (tx, mut rx) = mpsc::unbounded_channel();
    ledgers.append(empty, 0, data(0), Box::new(move |r| drop(tx.send(r)))).unwrap();
    let result = tokio::time::timeout(WAIT, rx.recv()).await.expect("answered").unwrap();
    assert_eq!(result.ok(), Some(0), "the empty ledger's first add");
    let replaced = stored_meta(&store, empty).await;
    assert_eq!(replaced.fragments.len(), 1, "{replaced:?}");
    assert!(!replaced.fragments[0].ensemble.contains(&killed.unwrap()), "{replaced:?}");
    let changes_after =
        client_metric(&ledgers, "magnetar_ledger_client_ensemble_changes_total", "");
    assert_eq!(changes_after, changes + 1.0, "{replaced:?}");
    // (Its writer task ends after the close is answered: the open-ledger gauge drops later.)
    assert_eq!(tokio::time::timeout(WAIT, ledgers.close(empty)).await.unwrap().unwrap(), 1);
    // Registered nodes (the killed one's until its lease expires), none short of disk.
    let writable = client_metric(&ledgers, "magnetar_ledger_client_storage_nodes", "writable");
    assert_eq!(writable, ledgers.nodes().live().len() as f64);
    assert!(writable >= 2.0, "{writable}");
    let read_only = client_metric(&ledgers, "magnetar_ledger_client_storage_nodes", "read_only");
    assert_eq!(read_only, 0.0);
    let reader = ledgers.clone();
    let entries = tokio::task::spawn_blocking(move || reader.read(ledger, 0, total - 1))
        .await
        .unwrap()
        .unwrap();
    for (entry, bytes) in entries.iter().enumerate() {
        assert_eq!(*bytes, data(entry as u64), "entry {entry} reads back");
    }

    // Another process's client recovers the ledger while this writer still holds it.
    let (other_store, other) = client(etcd.endpoints(), cluster).await;
    let count =
        tokio::time::timeout(WAIT, other.fence(ledger)).await.expect("recovery in time").unwrap();
    assert!(count >= total, "closed with {count} entries, {total} were acknowledged");
    let closed = stored_meta(&other_store, ledger).await;
    println!("recovered: {closed:?}");
    assert_eq!(closed.state, LedgerState::Closed);
    assert_eq!(closed.last_entry_id, Some(count - 1));
    let recoveries = |outcome: &str| {
        let labels = format!("outcome=\"{outcome}\"");
        client_metric(&other, "magnetar_ledger_client_recoveries_total", &labels)
    };
    assert_eq!((recoveries("closed"), recoveries("failed")), (1.0, 0.0));
    assert_eq!(client_metric(&other, "magnetar_ledger_client_recovery_seconds_count", ""), 1.0);
    // Fencing it again finds it closed: nothing recovered, nothing counted.
    assert_eq!(other.fence(ledger).await.unwrap(), count);
    assert_eq!(recoveries("closed"), 1.0);
    // Its copy of every entry reads the same.
    let reader = other.clone();
    let entries = tokio::task::spawn_blocking(move || reader.read(ledger, 0, total - 1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(entries.len() as u64, total);
    assert!(entries.iter().enumerate().all(|(e, b)| *b == data(e as u64)));

    // The old writer is fenced: its next add fails.
    let (tx, mut rx) = mpsc::unbounded_channel();
    match ledgers.append(ledger, total, data(total), Box::new(move |r| drop(tx.send(r)))) {
        Err(e) => panic!("staging is refused only once the writer knows: {e}"),
        Ok(()) => {
            let result = tokio::time::timeout(WAIT, rx.recv()).await.expect("answered").unwrap();
            assert!(matches!(result, Err(LedgerError::Fenced(_))), "{result:?}");
        }
    }

    // The killed node restarts on its data, and the first fragment's entries read from it alone
    // once the other node of that fragment is killed too.
    let killed = killed.unwrap();
    let index = nodes.iter().position(|n| NodeId(n.id) == killed).unwrap();
    nodes[index] = StorageNode::numbered(&url, cluster, dir.path(), index);
    assert_eq!(NodeId(nodes[index].id), killed, "a restarted node keeps its identity");
    // It answers LAC reads with the LAC its last entry carried (at most 256 adds were
    // unacknowledged), not with none: a recovery asking it reads forward from there.
    match ask_node(&nodes[index].address, Request::ReadLac { ledger, fence: None }).await {
        Response::Lac { lac: Some(lac), last_entry: Some(last), .. } => {
            assert!(lac < last && last - lac <= 256, "LAC {lac}, last entry {last}")
        }
        other => panic!("a restarted node forgot its LAC: {other:?}"),
    }
    let survivor = *first_ensemble.iter().find(|&&n| n != killed).unwrap();
    nodes.iter_mut().find(|n| NodeId(n.id) == survivor).unwrap().kill();
    other.nodes().refresh().await.unwrap();
    let first_end = closed.fragments[1].first_entry;
    let reader = other.clone();
    let entries = tokio::task::spawn_blocking(move || reader.read(ledger, 0, first_end - 1))
        .await
        .unwrap()
        .expect("read from the restarted node");
    assert_eq!(entries.len() as u64, first_end);
    // Half the entries were asked of the killed survivor first, then of the restarted node
    // (after its error, or after the speculative-read wait were its connection to hang).
    let retries = client_metric(&other, "magnetar_ledger_client_read_retries_total", "")
        + client_metric(&other, "magnetar_ledger_client_speculative_reads_total", "");
    assert!(retries >= 1.0, "reads asked of the other replica: {retries}");
    assert!(entries.iter().enumerate().all(|(e, b)| *b == data(e as u64)));

    // Deleted, its entries are freed on every live node that held them.
    ledgers.delete(ledger).await.unwrap();
    let holders: Vec<&StorageNode> = nodes
        .iter()
        .filter(|n| NodeId(n.id) != survivor)
        .filter(|n| closed.fragments.iter().any(|f| f.ensemble.contains(&NodeId(n.id))))
        .collect();
    assert!(!holders.is_empty());
    let deadline = std::time::Instant::now() + WAIT;
    for node in holders {
        loop {
            let log = std::fs::read_to_string(&node.log).unwrap_or_default();
            if log.contains("deleted ledger freed") {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "node {} never freed the ledger:\n{log}",
                node.id
            );
            // Another process's log: no event to wait on.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // A node that fenced the ledger (the last fragment's, in the recovery) forgets the deleted
    // ledger's entries but not its fence, also across a restart: the old writer, were it to
    // wake up now, is still refused there.
    let fenced = closed.fragments.last().unwrap().ensemble.clone();
    let index = nodes
        .iter()
        .position(|n| NodeId(n.id) != survivor && fenced.contains(&NodeId(n.id)))
        .expect("a live node of the last fragment");
    let late_add = || Request::Add {
        ledger,
        entry: first_end + 10_000,
        epoch: 0,
        lac: None,
        recovery: false,
        data: data(0),
    };
    for restarted in [false, true] {
        if restarted {
            nodes[index].kill();
            nodes[index] = StorageNode::numbered(&url, cluster, dir.path(), index);
        }
        match ask_node(&nodes[index].address, late_add()).await {
            Response::Error { code: ErrorCode::Fenced, .. } => {}
            other => {
                panic!("a collected, fenced ledger took an add (restarted: {restarted}): {other:?}")
            }
        }
    }
}

/// A ledger's bookie affinity is stored with it, so a recovery by another client keeps to
/// its groups too: the node it replaces while writing back (the writer's node died) comes
/// from the ledger's groups, not from another group's node that placement would otherwise
/// prefer (a rack no copy is on yet).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_replaces_a_node_within_the_ledger_s_groups() {
    let Some((etcd, url)) = one_etcd("recovery within groups").await else { return };
    let dir = tempfile::tempdir().unwrap();
    let cluster = "replicated";
    let mut nodes: Vec<StorageNode> = StorageNode::first(4, &url, cluster, dir.path());
    let (store, ledgers) = client(etcd.endpoints(), cluster).await;
    let (other_store, other) = client(etcd.endpoints(), cluster).await;
    // Three nodes of group g0 on one rack; the fourth, of g1, alone on another rack.
    let mut racks = StorageNodeRacks::default();
    for (i, node) in nodes.iter().enumerate() {
        let (group, rack) = if i == 3 { ("g1", "rack-2") } else { ("g0", "rack-1") };
        racks.set(&node.address, group, RackInfo { rack: Some(rack.into()), hostname: None });
    }
    let racks_json = serde_json::to_vec(&racks).unwrap();
    store.put(keys::STORAGE_NODE_RACKS, racks_json.into(), ExpectedVersion::Any).await.unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    for client in [&ledgers, &other] {
        while client_metric(client, "magnetar_ledger_client_storage_node_racks", "") != 2.0 {
            assert!(tokio::time::Instant::now() < deadline, "the clients see both racks");
            tokio::time::sleep(Duration::from_millis(10)).await; // a watch in another task
        }
    }
    let group_g0: Vec<NodeId> = nodes[..3].iter().map(|n| NodeId(n.id)).collect();

    let ledger = 1;
    let persistence = LedgerMetadata {
        ensemble_size: 2,
        write_quorum: 2,
        ack_quorum: 2,
        properties: BTreeMap::new(),
        isolation: IsolationGroups::parse("g0", None),
    };
    ledgers.create(ledger, &persistence).await.unwrap();
    let created = stored_meta(&store, ledger).await;
    assert_eq!(created.isolation, persistence.isolation, "the groups are stored");
    let ensemble = created.fragments[0].ensemble.clone();
    assert!(ensemble.iter().all(|n| group_g0.contains(n)), "{ensemble:?}");
    let total = 10u64;
    let (acks, mut acked) = mpsc::unbounded_channel();
    for entry in 0..total {
        let acks = acks.clone();
        let done = Box::new(move |result| drop(acks.send(result)));
        ledgers.append(ledger, entry, data(entry), done).unwrap();
    }
    for _ in 0..total {
        let result = tokio::time::timeout(WAIT, acked.recv()).await.expect("acked").unwrap();
        assert!(result.is_ok(), "{result:?}");
    }

    // The last entry is on both nodes, the LAC they hold one below it: the recovery writes it
    // back, and one node of the ensemble is gone (well before the writer's idle LAC, 1 s on).
    let victim = nodes.iter_mut().find(|n| NodeId(n.id) == ensemble[0]).unwrap();
    victim.kill();
    let count = tokio::time::timeout(WAIT, other.fence(ledger)).await.expect("in time").unwrap();
    assert_eq!(count, total);
    let closed = stored_meta(&other_store, ledger).await;
    assert_eq!(closed.state, LedgerState::Closed);
    let last = &closed.last_fragment().ensemble;
    assert!(!last.contains(&ensemble[0]), "the dead node was replaced: {closed:?}");
    assert!(last.iter().all(|n| group_g0.contains(n)), "kept to g0: {closed:?}");
    let reader = other.clone();
    let entries =
        tokio::task::spawn_blocking(move || reader.read(ledger, 0, total - 1)).await.unwrap();
    assert_eq!(entries.unwrap().len() as u64, total);
}

/// One request on a fresh connection to a node, and its answer.
async fn ask_node(address: &str, request: Request) -> Response {
    let stream =
        tokio::time::timeout(WAIT, tokio::net::TcpStream::connect(address)).await.unwrap().unwrap();
    ask_over(stream, request).await.expect("the node closed the connection")
}

/// One request over `stream` and its answer; None when the node closes the connection (or
/// the stream fails) without one, or sends bytes that are not a frame (a TLS alert).
async fn ask_over(
    stream: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    request: Request,
) -> Option<Response> {
    match exchange(stream, Message::Request(request)).await? {
        Message::Response(response) => Some(response),
        other => panic!("not a response: {other:?}"),
    }
}

/// One message over `stream` and the node's answer, as [`ask_over`].
async fn exchange(
    mut stream: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    message: Message,
) -> Option<Message> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut frame = bytes::BytesMut::new();
    wire::encode(7, &message, &mut frame);
    stream.write_all(&frame).await.ok()?;
    stream.flush().await.ok()?;
    let mut buf = bytes::BytesMut::new();
    loop {
        if let Some((id, message)) = wire::decode(&mut buf).ok()? {
            assert_eq!(id, 7);
            return Some(message);
        }
        match tokio::time::timeout(WAIT, stream.read_buf(&mut buf)).await.expect("bounded") {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

/// A test CA's certificate, and one it signs for `cn`, written as PEM files into `dir`:
/// (CA path, certificate path, key path).
fn tls_files(dir: &Path, ca: &TestCa, ca_name: &str, cn: &str) -> (PathBuf, PathBuf, PathBuf) {
    let ca_path = dir.join(format!("{ca_name}.pem"));
    std::fs::write(&ca_path, ca.cert.pem()).unwrap();
    let (cert, key) = ca.leaf(cn);
    let (cert_path, key_path) = (dir.join(format!("{cn}.pem")), dir.join(format!("{cn}.key")));
    std::fs::write(&cert_path, cert).unwrap();
    std::fs::write(&key_path, key).unwrap();
    (ca_path, cert_path, key_path)
}

/// Two storage nodes with `[tls]` on and client certificates required (plus `extra_tls`, keys
/// of the same section), in cluster `cluster`, and what the tests around them need.
struct TlsNodes {
    nodes: Vec<StorageNode>,
    store: Arc<EtcdStore>,
    /// A replication client with the CA and a certificate it signed (a broker's).
    trusted: Arc<ReplicatedLedgers>,
    /// The CA file, and a certificate and key another CA signed.
    ca_path: PathBuf,
    stranger: (PathBuf, PathBuf),
}

async fn tls_nodes(
    etcd: &EtcdCluster,
    url: &str,
    dir: &Path,
    cluster: &str,
    extra_tls: &str,
) -> TlsNodes {
    let (ca, other_ca) = (TestCa::new("cluster-ca"), TestCa::new("other-ca"));
    let (ca_path, node_cert, node_key) = tls_files(dir, &ca, "cluster-ca", "storage-node");
    let (_, broker_cert, broker_key) = tls_files(dir, &ca, "cluster-ca", "broker");
    let (_, stranger_cert, stranger_key) = tls_files(dir, &other_ca, "other-ca", "stranger");
    let config = dir.join("node.toml");
    std::fs::write(
        &config,
        format!(
            "[tls]\nenabled = true\ncert_file = {node_cert:?}\nkey_file = {node_key:?}\n\
             trust_certs_file = {ca_path:?}\nrequire_trusted_client_cert = true\n{extra_tls}"
        ),
    )
    .unwrap();
    let config_arg = config.to_str().unwrap();
    let nodes: Vec<StorageNode> = (0..2)
        .map(|i| {
            let dir = dir.join(format!("node{i}"));
            StorageNode::start_with(url, cluster, &dir, &["--config", config_arg])
        })
        .collect();
    let store = Arc::new(
        EtcdStore::connect(EtcdStoreConfig::new(etcd.endpoints(), cluster)).await.unwrap(),
    );
    let trusted = magnetar_security::tls::client_config(
        &ca_path,
        Some((broker_cert.as_path(), broker_key.as_path())),
    )
    .unwrap();
    let config = ReplicatedConfig {
        add_timeout: Duration::from_secs(2),
        tls: Some(Arc::new(trusted)),
        ..ReplicatedConfig::default()
    };
    let trusted = ReplicatedLedgers::start(store.clone(), config).await.unwrap();
    TlsNodes { nodes, store, trusted, ca_path, stranger: (stranger_cert, stranger_key) }
}

impl TlsNodes {
    /// The nodes' registrations in etcd.
    async fn registrations(&self) -> Vec<StorageNodeRegistration> {
        let mut found = Vec::new();
        for node in &self.nodes {
            let key = magnetar_model::keys::storage_node(node.id);
            let value = self.store.get(&key).await.unwrap().expect("registered");
            found.push(serde_json::from_slice(&value.value).unwrap());
        }
        found
    }
}

/// Ensemble 2, write quorum 2, ack quorum 2.
fn two_copies() -> LedgerMetadata {
    LedgerMetadata {
        ensemble_size: 2,
        write_quorum: 2,
        ack_quorum: 2,
        properties: BTreeMap::new(),
        isolation: None,
    }
}

/// Appends `entries` to `ledger` through `ledgers` and waits for each acknowledgement, in order.
async fn append_all(ledgers: &Arc<ReplicatedLedgers>, ledger: u64, entries: std::ops::Range<u64>) {
    let (acks, mut acked) = mpsc::unbounded_channel();
    for entry in entries.clone() {
        let acks = acks.clone();
        let done = Box::new(move |result| drop(acks.send(result)));
        ledgers.append(ledger, entry, data(entry), done).unwrap();
    }
    for entry in entries {
        let result = tokio::time::timeout(WAIT, acked.recv()).await.unwrap().unwrap();
        assert_eq!(result.ok(), Some(entry), "ledger {ledger}: entry {entry} acknowledged");
    }
}

/// Whether a TLS client presenting `client_cert` (and trusting `ca_path`) is answered a request
/// by the node at `address`.
async fn answered_over_tls(
    address: &str,
    ca_path: &Path,
    client_cert: Option<(&Path, &Path)>,
    request: Request,
) -> bool {
    let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
    let config = magnetar_security::tls::client_config(ca_path, client_cert).unwrap();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let server_name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    // TLS 1.3: the client may finish its side before the node checks its certificate; either
    // the handshake or the request then fails.
    match connector.connect(server_name, tcp).await {
        Ok(stream) => ask_over(stream, request).await.is_some(),
        Err(_) => false,
    }
}

/// Storage nodes with `[tls]` on and client certificates required: a replication client with
/// the CA and a certificate it signed writes and reads a quorum-2 ledger through them (their
/// registrations say TLS); a plain-TCP request, a TLS client without a certificate and one with
/// a certificate of another CA get no answer, and the nodes go on serving the trusted client.
/// Failed handshakes are logged, a line a second at most however many come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_nodes_over_tls_answer_only_trusted_clients() {
    let Some((etcd, url)) = one_etcd("storage nodes over TLS").await else { return };
    let dir = tempfile::tempdir().unwrap();
    let cluster = "tls";
    let tls = tls_nodes(&etcd, &url, dir.path(), cluster, "").await;
    for registration in tls.registrations().await {
        assert!(registration.tls && !registration.plain_clients, "{registration:?}");
    }
    let ledgers = &tls.trusted;
    ledgers.create(1, &two_copies()).await.unwrap();
    append_all(ledgers, 1, 0..200).await;
    let reader = ledgers.clone();
    let entries =
        tokio::task::spawn_blocking(move || reader.read(1, 0, 199)).await.unwrap().unwrap();
    assert!(entries.iter().enumerate().all(|(e, b)| *b == data(e as u64)));

    let lac = || Request::ReadLac { ledger: 1, fence: None };
    let address = tls.nodes[0].address.clone();
    let tcp = || async { tokio::net::TcpStream::connect(&address).await.unwrap() };
    let refusals_began = std::time::Instant::now();
    assert_eq!(ask_over(tcp().await, lac()).await, None, "a plain-TCP request is answered");
    let stranger = (tls.stranger.0.as_path(), tls.stranger.1.as_path());
    for (who, client_cert) in
        [("no certificate", None), ("another CA's certificate", Some(stranger))]
    {
        let answered = answered_over_tls(&address, &tls.ca_path, client_cert, lac()).await;
        assert!(!answered, "a client with {who} is answered");
    }
    // A peer that keeps failing handshakes does not flood the log: a line a second at most.
    let flood = 30;
    for _ in 0..flood {
        assert_eq!(ask_over(tcp().await, lac()).await, None, "a plain-TCP request is answered");
    }
    let refusing = refusals_began.elapsed();
    // The nodes go on serving the trusted client, on its open connections and new ones.
    append_all(ledgers, 1, 200..300).await;
    ledgers.create(2, &two_copies()).await.unwrap();
    append_all(ledgers, 2, 0..10).await;
    let log = std::fs::read_to_string(&tls.nodes[0].log).unwrap();
    let lines = log.matches("TLS handshake failed").count() as u64;
    let at_most = refusing.as_secs() + 2;
    assert!((1..=at_most).contains(&lines), "{} failures, {lines} lines:\n{log}", flood + 3);

    // A client without a trust file places nothing on nodes that serve TLS (it cannot reach
    // them): new ledgers are refused at once, with why.
    let (_, plain) = client(etcd.endpoints(), cluster).await;
    assert!(plain.nodes().live().is_empty());
    let refused = plain.create(3, &two_copies()).await;
    assert!(matches!(refused, Err(LedgerError::Unavailable(_))), "{refused:?}");
}

/// A move to TLS one broker at a time: nodes with `[tls]` on and `storage_plain_clients` say so
/// in their registrations and serve both a TLS client (with a trusted certificate) and a
/// plain-text one on the same port, each writing and reading a quorum-2 ledger; a TLS client
/// with another CA's certificate is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_nodes_serve_tls_and_plain_clients_while_brokers_move_to_tls() {
    let Some((etcd, url)) = one_etcd("storage nodes, TLS and plain").await else { return };
    let dir = tempfile::tempdir().unwrap();
    let cluster = "tls-and-plain";
    let extra = "storage_plain_clients = true\n";
    let tls = tls_nodes(&etcd, &url, dir.path(), cluster, extra).await;
    for registration in tls.registrations().await {
        assert!(registration.tls && registration.plain_clients, "{registration:?}");
    }
    let (_, plain) = client(etcd.endpoints(), cluster).await;
    for (ledger, ledgers) in [(1, &tls.trusted), (2, &plain)] {
        let deadline = tokio::time::Instant::now() + WAIT;
        while ledgers.nodes().live().len() < 2 {
            assert!(tokio::time::Instant::now() < deadline, "ledger {ledger}: nodes not seen");
            tokio::time::sleep(Duration::from_millis(10)).await; // polled: no event to await
        }
        ledgers.create(ledger, &two_copies()).await.unwrap();
        append_all(ledgers, ledger, 0..50).await;
        let reader = ledgers.clone();
        let entries =
            tokio::task::spawn_blocking(move || reader.read(ledger, 0, 49)).await.unwrap().unwrap();
        assert!(entries.iter().enumerate().all(|(e, b)| *b == data(e as u64)), "ledger {ledger}");
    }
    // TLS clients still need a certificate the node's CAs signed.
    let address = tls.nodes[0].address.clone();
    let stranger = (tls.stranger.0.as_path(), tls.stranger.1.as_path());
    let lac = |ledger| Request::ReadLac { ledger, fence: None };
    assert!(!answered_over_tls(&address, &tls.ca_path, Some(stranger), lac(1)).await);
    // A plain-text request on a fresh connection is answered.
    let answer = ask_node(&address, lac(2)).await;
    assert!(matches!(answer, Response::Lac { .. }), "a plain-text request: {answer:?}");
}

/// Whatever a peer sends, a node answers with an error or closes that one connection, and
/// goes on serving the others: bytes that are not a frame (an HTTP request, a length under the
/// checksum's, a length over the limit), a damaged checksum, a body that is not a message, a
/// response sent to the node, a frame cut off by a peer that goes away, an add of the one
/// entry id no ledger reaches, an add to the node's own fence log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_node_survives_bad_input_and_keeps_serving() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // Held to the end: dropping the cluster stops etcd.
    let Some((_etcd, url)) = one_etcd("storage node bad input").await else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut node = StorageNode::start(&url, "hostile", &dir.path().join("node"));

    // Sends `bytes` on a fresh connection; the node must close it (bounded wait).
    async fn closed_after(address: &str, bytes: &[u8], what: &str) {
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        stream.write_all(bytes).await.unwrap();
        let mut buf = [0u8; 256];
        let read = tokio::time::timeout(WAIT, stream.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("{what}: the connection stayed open"));
        assert!(matches!(read, Ok(0) | Err(_)), "{what}: answered {read:?}");
    }
    let frame = |message: &Message| {
        let mut out = bytes::BytesMut::new();
        wire::encode(9, message, &mut out);
        out
    };
    let status = frame(&Message::StatusRequest);
    let mut bad_crc = status.clone();
    bad_crc[4] ^= 0xff;
    let mut not_a_message = bytes::BytesMut::new();
    let body = [0xffu8; 12];
    not_a_message.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    not_a_message.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
    not_a_message.extend_from_slice(&body);
    let response = frame(&Message::Response(Response::Added { ledger: 1, entry: 0 }));
    let cases: [(&[u8], &str); 6] = [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "an HTTP request"),
        (&[0, 0, 0, 2, 0, 0], "a length under the checksum's"),
        (&[0x7f, 0xff, 0xff, 0xff], "a length over the limit"),
        (&bad_crc, "a damaged checksum"),
        (&not_a_message, "a body that is not a message"),
        (&response, "a response sent to a node"),
    ];
    for (bytes, what) in cases {
        closed_after(&node.address, bytes, what).await;
    }
    // Half a frame, then the peer goes away.
    {
        let mut stream = tokio::net::TcpStream::connect(&node.address).await.unwrap();
        stream.write_all(&status[..status.len() / 2]).await.unwrap();
    }
    // Requests that decode but no writer sends: answered with an error, nothing stored.
    let last_id = Request::Add {
        ledger: 77,
        entry: u64::MAX,
        epoch: 0,
        lac: None,
        recovery: false,
        data: data(0),
    };
    let fence_log = Request::Add {
        ledger: u64::MAX - 1,
        entry: 0,
        epoch: 0,
        lac: None,
        recovery: false,
        data: data(0),
    };
    for request in [last_id, fence_log] {
        let ledger = request.ledger();
        assert_eq!(
            ask_node(&node.address, request).await,
            Response::Error { ledger, code: ErrorCode::Io }
        );
    }
    // Still serving, still the same process, and it said why it closed those connections.
    match ask_node(&node.address, Request::ReadLac { ledger: 77, fence: None }).await {
        Response::Lac { lac: None, last_entry: None, .. } => {}
        other => panic!("ledger 77 should be unknown: {other:?}"),
    }
    assert!(node.child.try_wait().unwrap().is_none(), "the node exited");
    let log = std::fs::read_to_string(&node.log).unwrap();
    assert!(log.contains("bad frame"), "{log}");
    node.kill();
}

/// A storage node stopped with SIGSTOP, continued (SIGCONT) when dropped: its connections
/// stay open and nothing answers, as a node in a long pause or behind a silent partition.
struct Frozen(u32);

impl Frozen {
    /// Returns once every thread of the node is stopped (a stop takes effect a little after
    /// the signal: until then the node may still answer what it is sent).
    fn new(node: &StorageNode) -> Frozen {
        let pid = node.child.id();
        // SAFETY: signals a child this test started, by its PID.
        assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) }, 0);
        let stopped = || {
            let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the node's threads");
            tasks.flatten().all(|task| {
                let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
                // "pid (name) S ...": the state follows the name's closing parenthesis.
                matches!(stat.rsplit_once(") ").map(|(_, rest)| rest.as_bytes()[0]), Some(b'T'))
            })
        };
        let deadline = std::time::Instant::now() + WAIT;
        while !stopped() {
            assert!(std::time::Instant::now() < deadline, "node {} never stopped", node.id);
            // Another process's state: nothing to await but /proc.
            std::thread::sleep(Duration::from_millis(1));
        }
        Frozen(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::kill(self.0 as libc::pid_t, libc::SIGCONT) };
    }
}

/// Reads of a ledger on two nodes: with one node frozen, the entries asked of it go to the
/// other after the speculative wait (no error to retry on: the wait alone moves them) and the
/// read succeeds; with both frozen it fails with `Unavailable` once the read timeout passes
/// without an entry, instead of waiting for ever; continued, the nodes serve it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_go_around_a_frozen_replica_and_fail_in_bounded_time_when_all_are_frozen() {
    let Some((etcd, url)) = one_etcd("frozen replicas").await else { return };
    let dir = tempfile::tempdir().unwrap();
    let cluster = "replicated";
    let nodes = StorageNode::first(2, &url, cluster, dir.path());
    let (_store, writer) = client(etcd.endpoints(), cluster).await;
    let (ledger, count) = (1, 40);
    writer.create(ledger, &two_copies()).await.unwrap();
    append_all(&writer, ledger, 0..count).await;
    assert_eq!(tokio::time::timeout(WAIT, writer.close(ledger)).await.unwrap().unwrap(), count);

    // A reader of its own (the writer's cache of recent entries would answer), quick to move on.
    let times = (Duration::from_millis(100), Duration::from_millis(1_500));
    let config = ReplicatedConfig {
        speculative_read: times.0,
        read_timeout: times.1,
        ..ReplicatedConfig::default()
    };
    let (_reader_store, reader) = client_with(etcd.endpoints(), cluster, config).await;
    let read_all = || {
        let reader = reader.clone();
        async move {
            let started = std::time::Instant::now();
            let result = tokio::time::timeout(
                WAIT,
                tokio::task::spawn_blocking(move || reader.read(ledger, 0, count - 1)),
            )
            .await
            .expect("a read ends by itself")
            .unwrap();
            (result, started.elapsed())
        }
    };
    let metric = |name: &str| client_metric(&reader, name, "");
    let (both_up, _) = read_all().await;
    assert_eq!(both_up.unwrap().len() as u64, count);
    assert_eq!(metric("magnetar_ledger_client_speculative_reads_total"), 0.0);

    // Node status (the protocol's fifth request): its id, the ledger it holds, free disk.
    let stream = tokio::time::timeout(WAIT, tokio::net::TcpStream::connect(&nodes[0].address))
        .await
        .unwrap()
        .unwrap();
    match exchange(stream, Message::StatusRequest).await {
        Some(Message::Status(status)) => {
            assert_eq!(status.node, NodeId(nodes[0].id));
            assert_eq!(status.ledgers, 1, "{status:?}");
            assert!(status.free_bytes > 0, "{status:?}");
        }
        other => panic!("a status request answered {other:?}"),
    }

    let first_frozen = Frozen::new(&nodes[0]);
    let (around, took) = read_all().await;
    let entries = around.expect("read from the replica that answers");
    assert!(entries.iter().enumerate().all(|(e, b)| *b == data(e as u64)));
    assert!(took < times.1, "moved on after the speculative wait, not the timeout: {took:?}");
    // Half the entries were asked of the frozen node first; each went to the other once
    // (and the other's own entries too if it was slower than the wait: at most once each).
    let speculative = metric("magnetar_ledger_client_speculative_reads_total");
    assert!((count / 2) as f64 <= speculative && speculative <= count as f64, "{speculative}");
    assert_eq!(metric("magnetar_ledger_client_read_retries_total"), 0.0, "no error to retry on");

    let second_frozen = Frozen::new(&nodes[1]);
    let (nothing, took) = read_all().await;
    match nothing {
        Err(LedgerError::Unavailable(why)) => {
            assert!(why.contains("no replica answered"), "{why}")
        }
        other => panic!("a read of frozen replicas: {:?}", other.map(|e| e.len())),
    }
    assert!(took >= times.1 && took < times.1 + Duration::from_secs(5), "{took:?}");
    assert_eq!(metric("magnetar_ledger_client_read_timeouts_total"), 1.0);

    drop((first_frozen, second_frozen));
    let (again, _) = read_all().await;
    assert_eq!(again.expect("continued nodes serve the ledger").len() as u64, count);
}

/// A node that registers while a client runs is known to it at once (a watch on the
/// registrations), not at the client's next periodic re-read, here a minute away: a writer that
/// needs a replacement for a failed or full node finds the one just started, with the rack
/// label it registered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_registers_is_seen_by_a_running_client_at_once() {
    let Some((etcd, url)) = one_etcd("storage node registration watch").await else { return };
    let dir = tempfile::tempdir().unwrap();
    let cluster = "watched";
    let store = Arc::new(
        EtcdStore::connect(EtcdStoreConfig::new(etcd.endpoints(), cluster)).await.unwrap(),
    );
    let config = ReplicatedConfig { refresh: Duration::from_secs(60), ..Default::default() };
    let ledgers = ReplicatedLedgers::start(store.clone(), config).await.unwrap();
    assert!(ledgers.nodes().live().is_empty(), "no node yet");
    let node = StorageNode::start_with(&url, cluster, &dir.path().join("node"), &["--rack", "r7"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let seen = loop {
        if let Some(seen) = ledgers.nodes().live().into_iter().find(|n| n.id.0 == node.id) {
            break seen;
        }
        assert!(std::time::Instant::now() < deadline, "not seen within 10 s (the period is 60)");
        // The watch's update lands on the client's task: nothing here to await but the state.
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // With its own `--rack` label (no operator assignment to win over it) and its free disk.
    assert_eq!(seen.rack.as_deref(), Some("r7"), "{seen:?}");
    assert!(seen.free_bytes > 0 && !seen.read_only, "{seen:?}");
    drop(node);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_short_of_disk_is_read_only_and_gets_no_new_copies() {
    let Some((etcd, url)) = one_etcd("read-only storage node").await else { return };
    let dir = tempfile::tempdir().unwrap();
    let cluster = "readonly";
    let _writable: Vec<StorageNode> = StorageNode::first(2, &url, cluster, dir.path());
    // A threshold of 1 PiB free: short of disk on any machine, from the start.
    let full = StorageNode::start_with(
        &url,
        cluster,
        &dir.path().join("full"),
        &["--min-free-mb", "1073741824"],
    );

    let (store, ledgers) = client(etcd.endpoints(), cluster).await;
    let live = ledgers.nodes().live();
    assert_eq!(live.len(), 3, "{live:?}");
    let read_only: Vec<u64> = live.iter().filter(|n| n.read_only).map(|n| n.id.0).collect();
    assert_eq!(read_only, vec![full.id], "only the node short of disk says so: {live:?}");

    let copies = |n: u32| LedgerMetadata {
        ensemble_size: n,
        write_quorum: n,
        ack_quorum: n,
        properties: BTreeMap::new(),
        isolation: None,
    };
    for ledger in 1..=4 {
        ledgers.create(ledger, &copies(2)).await.unwrap();
        let ensemble = stored_meta(&store, ledger).await.fragments[0].ensemble.clone();
        assert!(!ensemble.contains(&NodeId(full.id)), "ledger {ledger} placed on it: {ensemble:?}");
        let (tx, rx) = tokio::sync::oneshot::channel();
        ledgers.append(ledger, 0, data(0), Box::new(move |r| drop(tx.send(r)))).unwrap();
        let acked = tokio::time::timeout(WAIT, rx).await.expect("acked in time").unwrap();
        assert_eq!(acked.ok(), Some(0), "the writable nodes take it");
    }
    match ledgers.create(9, &copies(3)).await {
        Err(LedgerError::Unavailable(why)) => assert!(why.contains("read-only"), "{why}"),
        other => panic!("three copies with two writable nodes: {other:?}"),
    }

    let registration =
        store.get(&magnetar_model::keys::storage_node(full.id)).await.unwrap().expect("registered");
    let registration: StorageNodeRegistration =
        serde_json::from_slice(&registration.value).unwrap();
    assert!(registration.read_only, "{registration:?}");
    let add =
        Request::Add { ledger: 77, entry: 0, epoch: 0, lac: None, recovery: false, data: data(0) };
    assert_eq!(
        ask_node(&registration.address, add).await,
        Response::Error { ledger: 77, code: ErrorCode::Io },
        "a normal add is refused"
    );
    match ask_node(&registration.address, Request::ReadLac { ledger: 78, fence: Some(1) }).await {
        Response::Lac { ledger: 78, .. } => {}
        other => panic!("a fencing read is answered: {other:?}"),
    }
}

/// A node id that holds data, started again on an emptied directory (`--node-id` on a new
/// disk), is refused before it opens anything: its cookie in etcd names another directory, and
/// served empty it would answer "no such entry" for entries it held. Its own directory
/// started against another cluster is refused too (its garbage collection would find none of
/// its ledgers). Its own directory in its own cluster starts and serves what it held; the
/// emptied directory without `--node-id` is a new node. Cookies outlive the process (the
/// admin API lists nodes by them, so a stopped node stays listed, as a bookie does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_id_with_data_is_refused_on_an_emptied_directory() {
    let Some((etcd, url)) = one_etcd("storage node cookies").await else { return };
    let dir = tempfile::tempdir().unwrap();
    let cluster = "cookies";
    let own = dir.path().join("own");
    let id = ["--node-id", "4242"];
    let mut node = StorageNode::start_with(&url, cluster, &own, &id);
    assert_eq!(node.id, 4242);
    let (store, ledgers) = client(etcd.endpoints(), cluster).await;
    let one_copy = LedgerMetadata {
        ensemble_size: 1,
        write_quorum: 1,
        ack_quorum: 1,
        properties: BTreeMap::new(),
        isolation: None,
    };
    ledgers.create(1, &one_copy).await.unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    ledgers.append(1, 0, data(0), Box::new(move |r| drop(tx.send(r)))).unwrap();
    let acked = tokio::time::timeout(WAIT, rx).await.expect("acked in time").unwrap();
    assert_eq!(acked.ok(), Some(0));
    node.kill();

    let emptied = dir.path().join("emptied");
    let refused = run_storage(&["--metadata", &url, "--cluster", cluster, id[0], id[1]], &emptied);
    assert!(!refused.status.success(), "an id with data on an empty directory is refused");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("node 4242 has a cookie") && stderr.contains("without --node-id"),
        "the error says why and what to do: {stderr}"
    );
    assert!(!emptied.join("ledgers").exists(), "no ledger store created");

    let refused = run_storage(&["--metadata", &url, "--cluster", "elsewhere"], &own);
    assert!(!refused.status.success(), "a directory of another cluster is refused");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains(r#"belongs to cluster "cookies""#), "{stderr}");

    let node = StorageNode::start_with(&url, cluster, &own, &id);
    match ask_node(&node.address, Request::Read { ledger: 1, entry: 0, fence: None }).await {
        Response::Entry { data: held, .. } => assert_eq!(held, data(0)),
        other => panic!("its own directory serves what it held: {other:?}"),
    }
    let stopped = node.address.clone();
    drop(node);
    let new = StorageNode::start(&url, cluster, &emptied);
    assert_ne!(new.id, 4242, "a new node, a new id");

    let mut cookies = store.list_children(keys::STORAGE_NODE_COOKIES_ROOT).await.unwrap();
    cookies.sort();
    let mut expected = vec!["4242".to_string(), new.id.to_string()];
    expected.sort();
    assert_eq!(cookies, expected, "one cookie per node id");
    let cookie = store.get(&keys::storage_node_cookie(4242)).await.unwrap().expect("kept");
    let cookie: StorageNodeCookie = serde_json::from_slice(&cookie.value).unwrap();
    assert_eq!(cookie.address, stopped, "the stopped node's cookie names its latest address");
}

/// One process per data directory: a second node started on a directory in use (by hand,
/// while the old one still runs) is refused before it reads anything, and the first serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_node_on_a_data_directory_in_use_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("node");
    let first = StorageNode::spawn(&[], &data_dir);
    let add =
        Request::Add { ledger: 5, entry: 0, epoch: 0, lac: None, recovery: false, data: data(0) };
    assert_eq!(ask_node(&first.address, add).await, Response::Added { ledger: 5, entry: 0 });
    let refused = run_storage(&[], &data_dir);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "a second node on the same directory is refused");
    assert!(stderr.contains("in use by another process"), "{stderr}");
    let read = ask_node(&first.address, Request::Read { ledger: 5, entry: 0, fence: None }).await;
    assert!(matches!(read, Response::Entry { .. }), "the first serves on: {read:?}");
}

/// `magnetar storage ARGS` on a free port, its data in `dir`, its stdout piped.
fn storage_command(args: &[&str], dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_magnetar"));
    command
        .env("NO_COLOR", "1")
        .args(["storage", "--listen", "127.0.0.1:0"])
        .args(args)
        .arg("--data-dir")
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    command
}

/// `magnetar storage ARGS --data-dir DIR` run to its exit (bounded: killed by PID after WAIT).
fn run_storage(args: &[&str], dir: &Path) -> std::process::Output {
    let child = storage_command(args, dir).stderr(Stdio::piped()).spawn().unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || drop(tx.send(child.wait_with_output())));
    match rx.recv_timeout(WAIT) {
        Ok(output) => output.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("magnetar storage {args:?} did not exit within {WAIT:?}");
        }
    }
}

/// A node takes its journal settings from `--config`'s `[storage]` section (here a 16 MiB
/// segment instead of 64 MiB, seen in the size of the segment files it writes), and a file it
/// cannot use is refused with the setting named, before the data directory is created. Its
/// `/metrics` (`--metrics-listen`) counts what it did, under our names and a bookie's (with
/// latency quantiles over the last `--stats-interval-seconds`). Runs without etcd: an
/// unregistered node, sent adds and reads directly (so its journal segment is in use).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_node_takes_its_settings_from_the_config_file_and_serves_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("node.toml");
    std::fs::write(&config, "[storage]\nsegment_size_bytes = 16777216\n").unwrap();
    let data_dir = dir.path().join("node");
    let metrics_port = magnetar_test_support::free_port().unwrap();
    let metrics_at = format!("127.0.0.1:{metrics_port}");
    let config_arg = config.to_str().unwrap();
    let args =
        ["--config", config_arg, "--metrics-listen", &metrics_at, "--stats-interval-seconds", "1"];
    let mut node = StorageNode::spawn(&args, &data_dir);
    // The first scrape starts the first stats interval (quantiles cover completed ones).
    let before = scrape(metrics_port).await;
    let add =
        Request::Add { ledger: 5, entry: 0, epoch: 0, lac: None, recovery: false, data: data(0) };
    let answer = ask_node(&node.address, add).await;
    let read = ask_node(&node.address, Request::Read { ledger: 5, entry: 0, fence: None }).await;
    let absent = ask_node(&node.address, Request::Read { ledger: 5, entry: 9, fence: None }).await;
    let metrics = scrape(metrics_port).await;
    // Then scrape until an interval holding the add has completed (bounded).
    let deadline = std::time::Instant::now() + WAIT;
    let add_p50 = r#"bookkeeper_server_ADD_ENTRY_REQUEST{node=""#;
    let later = loop {
        let later = scrape(metrics_port).await;
        let p50 = later
            .lines()
            .find(|l| l.starts_with(add_p50) && l.contains(r#"success="true",quantile="0.5"}"#))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap());
        if p50.is_some_and(|ms| ms > 0.0) || std::time::Instant::now() > deadline {
            break later;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    node.kill();
    assert_eq!(answer, Response::Added { ledger: 5, entry: 0 }, "stored durably");
    assert!(matches!(read, Response::Entry { .. }), "{read:?}");
    assert!(matches!(absent, Response::NoEntry { .. }), "{absent:?}");
    let sample_in = |metrics: &str, name: &str, labels: &str| -> f64 {
        let line = metrics
            .lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with('{') && l.contains(labels))
            .unwrap_or_else(|| panic!("no {name} with {labels} in {metrics}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let sample = |name: &str| sample_in(&metrics, name, "");
    assert_eq!(sample("magnetar_storage_node_adds_total"), 1.0, "{metrics}");
    assert_eq!(sample("magnetar_storage_node_add_bytes_total"), data(0).len() as f64);
    assert_eq!(sample("magnetar_storage_node_read_only"), 0.0);
    assert!(sample("magnetar_journal_groups_total") >= 1.0, "{metrics}");
    assert!(metrics.contains("node=\""), "labelled with the node: {metrics}");

    // A bookie's names for the same facts.
    let ok = r#"success="true"}"#;
    let failed = r#"success="false"}"#;
    assert_eq!(sample("bookie_SERVER_STATUS"), 1.0, "writable");
    assert_eq!(sample("bookie_WRITE_BYTES"), data(0).len() as f64);
    assert_eq!(sample("bookie_READ_BYTES"), data(0).len() as f64, "one entry read");
    assert_eq!(sample_in(&before, "bookkeeper_server_ADD_ENTRY_count", ok), 0.0);
    for name in ["bookkeeper_server_ADD_ENTRY_count", "bookkeeper_server_ADD_ENTRY_REQUEST_count"] {
        assert_eq!(sample_in(&metrics, name, ok), 1.0, "{name}: {metrics}");
        assert_eq!(sample_in(&metrics, name, failed), 0.0, "{name}");
    }
    assert_eq!(sample_in(&metrics, "bookkeeper_server_READ_ENTRY_count", ok), 1.0);
    assert_eq!(
        sample_in(&metrics, "bookkeeper_server_READ_ENTRY_count", failed),
        1.0,
        "a read of an absent entry counts as failed, as on a bookie"
    );
    assert_eq!(sample("bookkeeper_server_ADD_ENTRY_IN_PROGRESS"), 0.0, "all answered");
    assert!(sample_in(&metrics, "bookie_journal_JOURNAL_SYNC_count", ok) >= 1.0);
    let quantile = |q: &str| {
        let labels = format!(r#"success="true",quantile="{q}"}}"#);
        sample_in(&later, "bookkeeper_server_ADD_ENTRY_REQUEST", &labels)
    };
    let (p50, max) = (quantile("0.5"), quantile("1.0"));
    assert!(p50 > 0.0 && p50 <= max, "add latency in ms over the last interval: {later}");
    assert!(max < WAIT.as_millis() as f64, "{later}");

    let segments: Vec<u64> = std::fs::read_dir(data_dir.join("ledgers"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".journal"))
        .map(|e| e.metadata().unwrap().len())
        .collect();
    assert!(segments.contains(&(16 << 20)), "a segment of the configured size: {segments:?}");
    assert!(
        segments.iter().all(|&len| len <= 16 << 20),
        "segments of the configured size: {segments:?}"
    );

    std::fs::write(&config, "[storage]\nsync_mode = \"sometimes\"\n").unwrap();
    let refused = dir.path().join("refused");
    let output = Command::new(env!("CARGO_BIN_EXE_magnetar"))
        .env("NO_COLOR", "1")
        .args(["storage", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .arg("--data-dir")
        .arg(&refused)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "a bad config is refused");
    assert!(stderr.contains("sync_mode"), "the error names the setting: {stderr}");
    assert!(!refused.exists(), "nothing created before the config was checked");
}

/// The body of one `GET /metrics` from a node's metrics listener.
async fn scrape(port: u16) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream =
        tokio::time::timeout(WAIT, tokio::net::TcpStream::connect(("127.0.0.1", port)))
            .await
            .expect("connect in time")
            .expect("the metrics listener is up");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    tokio::time::timeout(WAIT, stream.read_to_string(&mut response))
        .await
        .expect("answered in time")
        .unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default()
}
