//! The node's cookie (BookKeeper's `Cookie`): proof that a data directory is the one a node
//! id's ledgers were written to, checked before the directory's ledger store is opened.
//!
//! Ensembles name node ids. A node started under an id that holds ledgers but on an emptied or
//! replaced directory (`--node-id` given on a fresh disk) would answer "no such entry" for
//! entries it held; with Qw = 3 and Qa = 2 two such answers are what a recovery takes for an
//! entry never written, so an acknowledged entry could be cut off. A directory started against
//! the wrong etcd (or cluster) would find none of its ledgers' metadata and garbage-collect
//! them all. So each id gets a cookie twice: `DATA_DIR/cookie` (id, cluster, a random instance)
//! and `/storage-node-cookies/{id}` in the metadata store (the instance, the latest address),
//! and a node starts only when the two agree, or when neither exists (a new node).
//!
//! The first start writes the local cookie (unregistered), then the metadata one (created only
//! if absent), then marks the local one registered: a start stopped in between completes the
//! registration next time, and a registered local cookie without a metadata one is refused.

use bytes::Bytes;
use magnetar_journal::storage::write_file_atomic;
use magnetar_metadata::{ExpectedVersion, MetadataError, MetadataStore};
use magnetar_model::keys;
use magnetar_model::storage_nodes::StorageNodeCookie;
use magnetar_replication::NodeId;
use std::path::{Path, PathBuf};

/// The local cookie's file name in the node's data directory.
pub const COOKIE_FILE: &str = "cookie";

/// What `DATA_DIR/cookie` holds (JSON).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LocalCookie {
    pub node_id: u64,
    pub cluster: String,
    pub instance: String,
    /// The metadata store has the matching cookie (written before this was set).
    pub registered: bool,
}

/// Why a node does not start on its directory.
#[derive(Debug, thiserror::Error)]
pub enum CookieError {
    #[error(
        "node {node} has a cookie in cluster {cluster:?} (last started at {address}) but {dir} \
         has none: this is not the directory node {node}'s ledgers were written to (emptied or \
         replaced?). Served with no data, it would answer \"no such entry\" for entries it held, \
         which a recovery can take for entries never written. Start node {node} on its own \
         directory, or start this one without --node-id (a new node with a new id)"
    )]
    MissingLocally { node: u64, cluster: String, address: String, dir: PathBuf },
    #[error(
        "{dir} holds node {node}'s cookie of cluster {cluster:?}, but the metadata store has no \
         cookie for node {node}: this is not the etcd (or cluster) the directory was registered \
         in, or its cookie was deleted. Refusing to start: the node would find none of its \
         ledgers' metadata and delete them as garbage"
    )]
    MissingInMetadata { node: u64, cluster: String, dir: PathBuf },
    #[error("{dir} belongs to cluster {theirs:?}, not {ours:?}")]
    OtherCluster { dir: PathBuf, theirs: String, ours: String },
    #[error("{dir} holds the cookie of node {cookie}, but its node id is {node}")]
    OtherNode { dir: PathBuf, cookie: u64, node: u64 },
    #[error(
        "{dir} holds node {node}'s cookie of instance {local}, but node {node}'s cookie in the \
         metadata store is instance {remote} (last started at {address}): another directory is \
         node {node}"
    )]
    OtherInstance { node: u64, dir: PathBuf, local: String, remote: String, address: String },
    #[error(
        "node {node}'s cookie changed in the metadata store while this node was starting: \
         another process is starting as node {node}"
    )]
    Raced { node: u64 },
    #[error("cookie {path}: {cause}")]
    Unreadable { path: PathBuf, cause: String },
    #[error("cookie {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("node cookie in the metadata store: {0}")]
    Metadata(#[from] MetadataError),
}

/// What a start does, decided from the two cookies alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// Neither exists: a new node. Write both.
    New,
    /// The local one was written, the metadata one not (a first start stopped in between).
    CompleteRegistration,
    /// They match. `address_changed`: the metadata one names another address (rewrite it).
    Known { address_changed: bool },
}

/// The decision: every mismatch is refused.
pub fn decide(
    node: NodeId,
    cluster: &str,
    dir: &Path,
    address: &str,
    local: Option<&LocalCookie>,
    remote: Option<&StorageNodeCookie>,
) -> Result<Start, CookieError> {
    if let Some(local) = local {
        if local.node_id != node.0 {
            return Err(CookieError::OtherNode {
                dir: dir.to_path_buf(),
                cookie: local.node_id,
                node: node.0,
            });
        }
        if local.cluster != cluster {
            return Err(CookieError::OtherCluster {
                dir: dir.to_path_buf(),
                theirs: local.cluster.clone(),
                ours: cluster.to_string(),
            });
        }
    }
    match (local, remote) {
        (None, None) => Ok(Start::New),
        (None, Some(remote)) => Err(CookieError::MissingLocally {
            node: node.0,
            cluster: cluster.to_string(),
            address: remote.address.clone(),
            dir: dir.to_path_buf(),
        }),
        (Some(local), None) if !local.registered => Ok(Start::CompleteRegistration),
        (Some(_), None) => Err(CookieError::MissingInMetadata {
            node: node.0,
            cluster: cluster.to_string(),
            dir: dir.to_path_buf(),
        }),
        (Some(local), Some(remote)) if local.instance != remote.instance => {
            Err(CookieError::OtherInstance {
                node: node.0,
                dir: dir.to_path_buf(),
                local: local.instance.clone(),
                remote: remote.instance.clone(),
                address: remote.address.clone(),
            })
        }
        (Some(_), Some(remote)) => Ok(Start::Known { address_changed: remote.address != address }),
    }
}

/// Checks the directory's cookie against the metadata store's, writing them on a first start;
/// returns what it decided. Called at start, before the ledger store is opened.
pub async fn check_or_create(
    store: &dyn MetadataStore,
    dir: &Path,
    node: NodeId,
    cluster: &str,
    address: &str,
) -> Result<Start, CookieError> {
    let path = dir.join(COOKIE_FILE);
    let local = read_local(&path)?;
    let key = keys::storage_node_cookie(node.0);
    let stored = store.get(&key).await?;
    let remote = match &stored {
        Some(stored) => {
            Some(serde_json::from_slice::<StorageNodeCookie>(&stored.value).map_err(|e| {
                CookieError::Unreadable { path: PathBuf::from(&key), cause: e.to_string() }
            })?)
        }
        None => None,
    };
    let start = decide(node, cluster, dir, address, local.as_ref(), remote.as_ref())?;
    let raced = |e: MetadataError| match e {
        MetadataError::BadVersion { .. } => CookieError::Raced { node: node.0 },
        e => CookieError::Metadata(e),
    };
    let document = |instance: &str| {
        let cookie = StorageNodeCookie { address: address.to_string(), instance: instance.into() };
        Bytes::from(serde_json::to_vec(&cookie).expect("serializable"))
    };
    // The metadata cookie to create (absent only), then the local one to mark registered.
    let mut local = match (&start, local) {
        (Start::New, _) => {
            let new = LocalCookie {
                node_id: node.0,
                cluster: cluster.to_string(),
                instance: format!("{:016x}", rand::random::<u64>()),
                registered: false,
            };
            write_local(dir, &new)?;
            tracing::info!(node = node.0, instance = new.instance, "new storage node");
            new
        }
        (Start::CompleteRegistration, Some(local)) => local,
        (Start::Known { address_changed }, Some(local)) => {
            let stored = stored.expect("decided from a metadata cookie");
            if *address_changed {
                store
                    .put(&key, document(&local.instance), ExpectedVersion::Exactly(stored.version))
                    .await
                    .map_err(raced)?;
            }
            local
        }
        (_, None) => unreachable!("decided from a local cookie"),
    };
    if matches!(start, Start::New | Start::CompleteRegistration) {
        store.put(&key, document(&local.instance), ExpectedVersion::Absent).await.map_err(raced)?;
    }
    // Also a first start whose metadata write landed but was not confirmed to it.
    if !local.registered {
        local.registered = true;
        write_local(dir, &local)?;
    }
    Ok(start)
}

fn read_local(path: &Path) -> Result<Option<LocalCookie>, CookieError> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            CookieError::Unreadable { path: path.to_path_buf(), cause: e.to_string() }
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(CookieError::Io { path: path.to_path_buf(), source }),
    }
}

/// Replaces the local cookie durably (`write_file_atomic`).
fn write_local(dir: &Path, cookie: &LocalCookie) -> Result<(), CookieError> {
    let bytes = serde_json::to_vec_pretty(cookie).expect("serializable");
    write_file_atomic(dir, COOKIE_FILE, &bytes)
        .map_err(|source| CookieError::Io { path: dir.join(COOKIE_FILE), source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use magnetar_metadata::MemoryStore;

    const CLUSTER: &str = "c1";

    async fn start(
        store: &MemoryStore,
        dir: &Path,
        node: u64,
        address: &str,
    ) -> Result<Start, CookieError> {
        check_or_create(store, dir, NodeId(node), CLUSTER, address).await
    }

    #[tokio::test]
    async fn a_new_node_writes_both_cookies_and_starts_again_on_them() {
        let store = MemoryStore::new();
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(start(&store, dir.path(), 7, "h:1").await.unwrap(), Start::New);
        let local = read_local(&dir.path().join(COOKIE_FILE)).unwrap().unwrap();
        assert!(local.registered && local.node_id == 7 && local.cluster == CLUSTER);
        let remote = store.get(&keys::storage_node_cookie(7)).await.unwrap().unwrap();
        let remote: StorageNodeCookie = serde_json::from_slice(&remote.value).unwrap();
        assert_eq!(remote, StorageNodeCookie { address: "h:1".into(), instance: local.instance });
        assert_eq!(
            start(&store, dir.path(), 7, "h:1").await.unwrap(),
            Start::Known { address_changed: false }
        );
        // A restart at another address keeps the identity and records the address.
        assert_eq!(
            start(&store, dir.path(), 7, "h:2").await.unwrap(),
            Start::Known { address_changed: true }
        );
        let remote = store.get(&keys::storage_node_cookie(7)).await.unwrap().unwrap();
        assert!(String::from_utf8_lossy(&remote.value).contains("h:2"));
    }

    #[tokio::test]
    async fn an_emptied_directory_under_a_known_id_is_refused() {
        let store = MemoryStore::new();
        let dir = tempfile::tempdir().unwrap();
        start(&store, dir.path(), 7, "h:1").await.unwrap();
        let emptied = tempfile::tempdir().unwrap();
        let refused = start(&store, emptied.path(), 7, "h:1").await.unwrap_err();
        assert!(matches!(refused, CookieError::MissingLocally { node: 7, .. }), "{refused}");
        assert!(refused.to_string().contains("without --node-id"), "{refused}");
        assert!(std::fs::read_dir(emptied.path()).unwrap().next().is_none(), "nothing written");
        // Another id on the same empty directory is a new node.
        assert_eq!(start(&store, emptied.path(), 8, "h:1").await.unwrap(), Start::New);
    }

    #[tokio::test]
    async fn a_directory_is_refused_by_another_metadata_store_cluster_or_instance() {
        let store = MemoryStore::new();
        let dir = tempfile::tempdir().unwrap();
        start(&store, dir.path(), 7, "h:1").await.unwrap();

        let other_etcd = MemoryStore::new();
        let refused = start(&other_etcd, dir.path(), 7, "h:1").await.unwrap_err();
        assert!(matches!(refused, CookieError::MissingInMetadata { node: 7, .. }), "{refused}");
        assert!(other_etcd.get(&keys::storage_node_cookie(7)).await.unwrap().is_none());

        let refused =
            check_or_create(&store, dir.path(), NodeId(7), "c2", "h:1").await.unwrap_err();
        assert!(matches!(refused, CookieError::OtherCluster { .. }), "{refused}");

        let refused = start(&store, dir.path(), 9, "h:1").await.unwrap_err();
        assert!(matches!(refused, CookieError::OtherNode { cookie: 7, node: 9, .. }));

        // A second directory made node 7 (the first one's cookie deleted and re-created):
        // the first directory is no longer node 7.
        let second = tempfile::tempdir().unwrap();
        store.delete(&keys::storage_node_cookie(7), ExpectedVersion::Any).await.unwrap();
        start(&store, second.path(), 7, "h:3").await.unwrap();
        let refused = start(&store, dir.path(), 7, "h:1").await.unwrap_err();
        assert!(matches!(refused, CookieError::OtherInstance { node: 7, .. }), "{refused}");
    }

    #[tokio::test]
    async fn a_first_start_stopped_between_its_writes_completes_next_time() {
        let store = MemoryStore::new();
        let dir = tempfile::tempdir().unwrap();
        let half = LocalCookie {
            node_id: 7,
            cluster: CLUSTER.into(),
            instance: "00000000000000aa".into(),
            registered: false,
        };
        write_local(dir.path(), &half).unwrap();
        assert_eq!(start(&store, dir.path(), 7, "h:1").await.unwrap(), Start::CompleteRegistration);
        assert!(read_local(&dir.path().join(COOKIE_FILE)).unwrap().unwrap().registered);
        assert_eq!(
            start(&store, dir.path(), 7, "h:1").await.unwrap(),
            Start::Known { address_changed: false }
        );

        // The metadata write landed but its answer was lost: the next start completes it.
        let other = tempfile::tempdir().unwrap();
        let half = LocalCookie { node_id: 8, instance: "00000000000000bb".into(), ..half };
        write_local(other.path(), &half).unwrap();
        let landed = StorageNodeCookie { address: "h:2".into(), instance: half.instance.clone() };
        let value = Bytes::from(serde_json::to_vec(&landed).unwrap());
        store.put(&keys::storage_node_cookie(8), value, ExpectedVersion::Absent).await.unwrap();
        assert_eq!(
            start(&store, other.path(), 8, "h:2").await.unwrap(),
            Start::Known { address_changed: false }
        );
        assert!(read_local(&other.path().join(COOKIE_FILE)).unwrap().unwrap().registered);
    }

    #[tokio::test]
    async fn two_first_starts_of_one_id_leave_one_node() {
        let store = MemoryStore::new();
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (first, second) =
            tokio::join!(start(&store, a.path(), 7, "h:1"), start(&store, b.path(), 7, "h:2"));
        let outcomes = [first.is_ok(), second.is_ok()];
        assert_eq!(outcomes.iter().filter(|ok| **ok).count(), 1, "{first:?} {second:?}");
        for refused in [first, second].into_iter().filter_map(Result::err) {
            assert!(
                matches!(refused, CookieError::Raced { .. } | CookieError::MissingLocally { .. }),
                "{refused}"
            );
        }
    }

    #[test]
    fn an_unreadable_local_cookie_is_an_error_not_a_new_node() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(COOKIE_FILE), b"{not json").unwrap();
        let refused = read_local(&dir.path().join(COOKIE_FILE)).unwrap_err();
        assert!(matches!(refused, CookieError::Unreadable { .. }), "{refused}");
    }
}
