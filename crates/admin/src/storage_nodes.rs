//! Decommissioning storage nodes, over the metadata store: what the admin API's
//! `/admin/v2/bookies/{bookie}/decommission` routes and `magnetar storage-nodes` run. The
//! decisions are `magnetar_autorecovery::decommission`'s; the node turns itself read-only when
//! it sees its record, and the cluster's auditor moves its copies (ARCHITECTURE.md,
//! "Auto-recovery").
//!
//! [`overview`] is what the console's storage page and `GET /admin/v2/bookies/autorecovery`
//! show: every node, its state and drain, the auditor and the under-replicated ledgers.
//!
//! A node is named by its id or by its address (`host:port`, its "bookie id"), as the cookies
//! and registrations record them.

use std::collections::BTreeMap;

use bytes::Bytes;
use magnetar_autorecovery::{Drain, DrainState};
use magnetar_ledger_replicated::all_ledgers;
use magnetar_metadata::{ExpectedVersion, MetadataError, MetadataStore};
use magnetar_model::keys;
use magnetar_model::storage_nodes::{
    StorageNodeCookie, StorageNodeDecommission, StorageNodeRacks, StorageNodeRegistration,
};
use magnetar_replication::{LedgerId, NodeId};

#[derive(Debug, thiserror::Error)]
pub enum DecommissionError {
    #[error("storage node {0} is not known (no cookie, no registration)")]
    UnknownNode(String),
    #[error("storage node {0} is not being decommissioned")]
    NotDecommissioning(String),
    /// Removing a node some ledger still names, or that still runs.
    #[error("storage node {node} cannot be removed: it is {state}{why}")]
    NotRemovable { node: String, state: &'static str, why: &'static str },
    #[error(transparent)]
    Metadata(#[from] MetadataError),
}

/// A node as the operator named it, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageNode {
    pub id: u64,
    /// Its address at its latest start (empty if unknown).
    pub address: String,
}

/// Where a decommissioned node's drain stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainStatus {
    pub node: StorageNode,
    pub requested_at_ms: u64,
    pub registered: bool,
    pub drain: Drain,
    pub state: DrainState,
    /// Under-replicated markers naming the node (the auditor's to-do list).
    pub marked_ledgers: u64,
}

impl DrainStatus {
    /// The admin API's JSON.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "bookieId": self.node.address,
            "nodeId": self.node.id,
            "state": self.state.as_str(),
            "registered": self.registered,
            "requestedAtMs": self.requested_at_ms,
            "closedLedgers": self.drain.closed_ledgers,
            "openLedgers": self.drain.open_ledgers,
            "markedLedgers": self.marked_ledgers,
        })
    }
}

/// One node's documents: its cookie's address, its registration while it runs, and whether a
/// decommission record exists.
#[derive(Debug, Clone)]
pub struct NodeDocuments {
    pub node: StorageNode,
    pub registration: Option<StorageNodeRegistration>,
    pub decommissioned: bool,
}

/// Every node with a cookie or a registration (an older version's node runs without a cookie),
/// its documents read in one request. The address is the registration's, else the cookie's.
pub async fn known_nodes(store: &dyn MetadataStore) -> Result<Vec<NodeDocuments>, MetadataError> {
    let mut ids = std::collections::BTreeSet::new();
    for root in [keys::STORAGE_NODE_COOKIES_ROOT, keys::STORAGE_NODES_ROOT] {
        ids.extend(store.list_children(root).await?.iter().filter_map(|c| c.parse::<u64>().ok()));
    }
    let lookups: Vec<String> = ids
        .iter()
        .flat_map(|&id| {
            [
                keys::storage_node_cookie(id),
                keys::storage_node(id),
                keys::storage_node_decommission(id),
            ]
        })
        .collect();
    let found = store.get_many(&lookups).await?;
    let mut nodes = Vec::with_capacity(ids.len());
    for (id, three) in ids.into_iter().zip(found.chunks(3)) {
        let parsed = |i: usize| three[i].as_ref().map(|f| f.value.clone());
        let registration =
            parsed(1).and_then(|v| serde_json::from_slice::<StorageNodeRegistration>(&v).ok());
        let cookie = parsed(0).and_then(|v| serde_json::from_slice::<StorageNodeCookie>(&v).ok());
        if (three[0].is_some() && cookie.is_none())
            || (three[1].is_some() && registration.is_none())
        {
            tracing::warn!(node = id, "unreadable storage node document");
        }
        let address = (registration.as_ref().map(|r| r.address.clone()))
            .or(cookie.map(|c| c.address))
            .unwrap_or_default();
        nodes.push(NodeDocuments {
            node: StorageNode { id, address },
            registration,
            decommissioned: three[2].is_some(),
        });
    }
    Ok(nodes)
}

/// Finds the node `name` (an id, or an address a cookie or registration holds).
pub async fn resolve(
    store: &dyn MetadataStore,
    name: &str,
) -> Result<StorageNode, DecommissionError> {
    let known = known_nodes(store).await?;
    let by_id = name.parse::<u64>().ok().and_then(|id| known.iter().find(|n| n.node.id == id));
    by_id
        .or_else(|| known.iter().find(|n| n.node.address == name))
        .map(|n| n.node.clone())
        .ok_or_else(|| DecommissionError::UnknownNode(name.to_string()))
}

/// Starts draining `node` (idempotent: a drain already asked for keeps its start time).
pub async fn start(
    store: &dyn MetadataStore,
    node: &StorageNode,
    now_ms: u64,
) -> Result<(), DecommissionError> {
    let record = StorageNodeDecommission { address: node.address.clone(), requested_at_ms: now_ms };
    let value = Bytes::from(serde_json::to_vec(&record).expect("serializes"));
    match store.put(&keys::storage_node_decommission(node.id), value, ExpectedVersion::Absent).await
    {
        Ok(_) | Err(MetadataError::BadVersion { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Calls off the drain of `node`: it takes adds and copies again (what moved stays moved).
pub async fn cancel(
    store: &dyn MetadataStore,
    node: &StorageNode,
) -> Result<(), DecommissionError> {
    match store.delete(&keys::storage_node_decommission(node.id), ExpectedVersion::Any).await {
        Ok(()) => Ok(()),
        Err(MetadataError::NotFound { .. }) => {
            Err(DecommissionError::NotDecommissioning(node.id.to_string()))
        }
        Err(e) => Err(e.into()),
    }
}

/// How far the drain of `node` has come.
pub async fn status(
    store: &dyn MetadataStore,
    node: &StorageNode,
) -> Result<DrainStatus, DecommissionError> {
    let Some(record) = store.get(&keys::storage_node_decommission(node.id)).await? else {
        return Err(DecommissionError::NotDecommissioning(node.id.to_string()));
    };
    let requested_at_ms = serde_json::from_slice::<StorageNodeDecommission>(&record.value)
        .map(|r| r.requested_at_ms)
        .unwrap_or(0);
    let registered = store.get(&keys::storage_node(node.id)).await?.is_some();
    let drain = Drain::of(&all_ledgers(store).await?, NodeId(node.id));
    let mut marked_ledgers = 0;
    let root = magnetar_model::keys::AUTORECOVERY_UNDER_REPLICATED_ROOT;
    let children = store.list_children(root).await?;
    let marker_keys: Vec<String> = children.iter().map(|c| format!("{root}/{c}")).collect();
    for found in store.get_many(&marker_keys).await?.into_iter().flatten() {
        let nodes: Vec<u64> = serde_json::from_slice(&found.value).unwrap_or_default();
        marked_ledgers += u64::from(nodes.contains(&node.id));
    }
    Ok(DrainStatus {
        node: node.clone(),
        requested_at_ms,
        registered,
        drain,
        state: drain.state(registered),
        marked_ledgers,
    })
}

/// Removes a drained, stopped node: its cookie, rack assignment and decommission record go, so
/// that it is listed no more (`bookies list-bookies`) and its id could start afresh.
pub async fn remove(
    store: &dyn MetadataStore,
    node: &StorageNode,
) -> Result<(), DecommissionError> {
    let status = status(store, node).await?;
    if status.state != DrainState::Removable {
        let why = match status.state {
            DrainState::Drained => ": stop it first",
            _ => ": ledgers still name it",
        };
        return Err(DecommissionError::NotRemovable {
            node: node.id.to_string(),
            state: status.state.as_str(),
            why,
        });
    }
    // The rack assignment first: a failure after it leaves a node still listed, never a cookie
    // without its record.
    loop {
        let Some(found) = store.get(keys::STORAGE_NODE_RACKS).await? else { break };
        let Ok(mut racks) = serde_json::from_slice::<StorageNodeRacks>(&found.value) else { break };
        if node.address.is_empty() || !racks.remove(&node.address) {
            break;
        }
        let value = Bytes::from(serde_json::to_vec(&racks).expect("serializes"));
        match store
            .put(keys::STORAGE_NODE_RACKS, value, ExpectedVersion::Exactly(found.version))
            .await
        {
            Ok(_) => break,
            Err(MetadataError::BadVersion { .. }) => continue, // changed meanwhile: again
            Err(e) => return Err(e.into()),
        }
    }
    for key in [keys::storage_node_cookie(node.id), keys::storage_node_decommission(node.id)] {
        match store.delete(&key, ExpectedVersion::Any).await {
            Ok(()) | Err(MetadataError::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    tracing::info!(node = node.id, address = node.address, "storage node removed");
    Ok(())
}

/// How many under-replicated ledgers [`Overview`] names (the count is always whole).
pub const OVERVIEW_LEDGERS: usize = 100;

/// The storage nodes and auto-recovery at a glance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overview {
    /// The node holding the auditor key, if any.
    pub auditor: Option<u64>,
    pub nodes: Vec<NodeOverview>,
    /// Under-replicated ledgers: how many, and the first [`OVERVIEW_LEDGERS`] with the nodes
    /// whose copies move.
    pub under_replicated: u64,
    pub marked: Vec<(LedgerId, Vec<u64>)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeOverview {
    pub node: StorageNode,
    /// Its registration, while it runs.
    pub registration: Option<StorageNodeRegistration>,
    /// With a decommission record: how far its drain has come.
    pub drain: Option<(Drain, DrainState)>,
}

impl Overview {
    /// The admin API's JSON.
    pub fn to_json(&self) -> serde_json::Value {
        let nodes: Vec<serde_json::Value> = self
            .nodes
            .iter()
            .map(|n| {
                let state = match &n.registration {
                    None => "down",
                    Some(r) if r.read_only => "read-only",
                    Some(_) => "up",
                };
                serde_json::json!({
                    "bookieId": n.node.address,
                    "nodeId": n.node.id,
                    "state": state,
                    "freeBytes": n.registration.as_ref().map(|r| r.free_bytes),
                    "rack": n.registration.as_ref().and_then(|r| r.rack.clone()),
                    "decommission": n.drain.map(|(drain, state)| serde_json::json!({
                        "state": state.as_str(),
                        "closedLedgers": drain.closed_ledgers,
                        "openLedgers": drain.open_ledgers,
                    })),
                })
            })
            .collect();
        let marked: Vec<serde_json::Value> = (self.marked.iter())
            .map(|(ledger, nodes)| serde_json::json!({ "ledger": ledger, "nodes": nodes }))
            .collect();
        serde_json::json!({
            "auditor": self.auditor,
            "nodes": nodes,
            "underReplicatedLedgers": self.under_replicated,
            "underReplicated": marked,
        })
    }
}

/// Every node with a cookie or a registration, the auditor, and the under-replicated ledgers.
/// Reads every ledger's metadata only while some node is being decommissioned.
pub async fn overview(store: &dyn MetadataStore) -> Result<Overview, MetadataError> {
    let known = known_nodes(store).await?;
    let draining = known.iter().any(|n| n.decommissioned);
    let ledgers = if draining { all_ledgers(store).await? } else { BTreeMap::new() };
    let nodes = known
        .into_iter()
        .map(|n| {
            let drain = n.decommissioned.then(|| {
                let drain = Drain::of(&ledgers, NodeId(n.node.id));
                (drain, drain.state(n.registration.is_some()))
            });
            NodeOverview { node: n.node, registration: n.registration, drain }
        })
        .collect();
    let auditor = (store.get(keys::AUTORECOVERY_AUDITOR).await?)
        .and_then(|f| std::str::from_utf8(&f.value).ok().and_then(|v| v.parse().ok()));
    let root = keys::AUTORECOVERY_UNDER_REPLICATED_ROOT;
    let mut children: Vec<LedgerId> =
        store.list_children(root).await?.iter().filter_map(|c| c.parse().ok()).collect();
    children.sort_unstable();
    let under_replicated = children.len() as u64;
    children.truncate(OVERVIEW_LEDGERS);
    let marker_keys: Vec<String> = children.iter().map(|id| format!("{root}/{id}")).collect();
    let mut marked = Vec::with_capacity(children.len());
    for (id, found) in children.into_iter().zip(store.get_many(&marker_keys).await?) {
        let nodes = found.and_then(|f| serde_json::from_slice::<Vec<u64>>(&f.value).ok());
        marked.push((id, nodes.unwrap_or_default()));
    }
    Ok(Overview { auditor, nodes, under_replicated, marked })
}
