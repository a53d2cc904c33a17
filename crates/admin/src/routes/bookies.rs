//! Storage nodes in Pulsar's bookies API (`pulsar-admin bookies …`, super-user only, as every
//! route authorization does not list):
//!
//! - `GET /admin/v2/bookies/all`: every storage node with a cookie, up or not, at the address
//!   of its latest start, `{"bookies": [{"bookieId": "host:port"}]}` (as Pulsar lists every
//!   bookie with a cookie), and any registered node without one (an older version's).
//! - `GET /admin/v2/bookies/racks-info`: the operator's rack assignments, group -> address ->
//!   `{"rack", "hostname"}` (`{}` for none).
//! - `GET|DELETE /admin/v2/bookies/racks-info/{bookie}`: one node's assignment; 404 when it
//!   has none. `POST …?group=G` with a `BookieInfo` body assigns it (412 without a group or
//!   with a rack of more than one level, as Pulsar's rack-aware placement requires).
//!
//! - `PUT|POST /admin/v2/bookies/{bookie}/decommission`: drain the node (`{bookie}` is its
//!   address or its id; 404 when unknown): 204. `GET …/decommission`: how far the drain has
//!   come, `{"bookieId", "nodeId", "state": "draining"|"drained"|"removable", "registered",
//!   "requestedAtMs", "closedLedgers", "openLedgers", "markedLedgers"}` (404 when not being
//!   decommissioned). `DELETE …/decommission`: call it off, 204.
//! - `GET /admin/v2/bookies/autorecovery`: every node (state up, read-only or down, free disk,
//!   its drain), the auditor, the under-replicated ledgers (count, and the first 100).
//! - `DELETE /admin/v2/bookies/{bookie}`: remove a drained, stopped node (its cookie, rack
//!   assignment and decommission record): 204; 409 while ledgers name it or it still runs.
//!   Pulsar's bookies API has no such verbs (BookKeeper's shell has `decommissionbookie`).
//!
//! Assignments are kept at `/storage-node-racks` by compare-and-set; brokers writing to
//! storage nodes watch it, and their next placement puts a ledger's copies on different racks
//! (the assignment wins over a node's own `rack` setting). Addresses are taken verbatim and
//! need not be registered (Pulsar accepts racks for bookies to come).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::Json;
use magnetar_metadata::ExpectedVersion;
use magnetar_model::keys;
use magnetar_model::storage_nodes::{validate_rack, RackInfo, StorageNodeRacks};
use serde_json::{json, Value};
use std::collections::BTreeSet;

use super::{body_bytes, get_json, query_param, to_json_bytes, update_document, PathSegments};
use crate::error::AdminError;
use crate::storage_nodes::{self, DecommissionError, StorageNode};
use crate::AdminState;

/// `GET /admin/v2/bookies/all`.
pub(crate) async fn list_all(State(state): State<AdminState>) -> Result<Json<Value>, AdminError> {
    let nodes = storage_nodes::known_nodes(state.store.as_ref()).await?;
    let addresses: BTreeSet<String> =
        (nodes.into_iter().map(|n| n.node.address)).filter(|a| !a.is_empty()).collect();
    let bookies: Vec<Value> = addresses.into_iter().map(|a| json!({ "bookieId": a })).collect();
    Ok(Json(json!({ "bookies": bookies })))
}

/// `GET /admin/v2/bookies/racks-info`.
pub(crate) async fn racks(
    State(state): State<AdminState>,
) -> Result<Json<StorageNodeRacks>, AdminError> {
    Ok(Json(load(&state).await?.0))
}

/// `GET /admin/v2/bookies/racks-info/{bookie}`.
pub(crate) async fn get_rack(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<RackInfo>, AdminError> {
    let address = bookie(&uri)?;
    let (racks, _) = load(&state).await?;
    racks.get(&address).cloned().map(Json).ok_or_else(|| not_found(&address))
}

/// `DELETE /admin/v2/bookies/racks-info/{bookie}`: 204, or 404 when it had no assignment.
pub(crate) async fn delete_rack(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<StatusCode, AdminError> {
    let address = bookie(&uri)?;
    update(&state, |racks| racks.remove(&address).then_some(()).ok_or_else(|| not_found(&address)))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /admin/v2/bookies/racks-info/{bookie}?group=G` with `{"rack", "hostname"}`: 204.
pub(crate) async fn set_rack(
    State(state): State<AdminState>,
    uri: Uri,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, AdminError> {
    let address = bookie(&uri)?;
    let group = query_param(&uri, "group").filter(|g| !g.is_empty()).ok_or_else(|| {
        AdminError::PreconditionFailed("Bookie 'group' parameters is missing".to_string())
    })?;
    let info: RackInfo = serde_json::from_slice(&body_bytes(body)?).map_err(|e| {
        AdminError::BadRequest(format!("Invalid bookie info: expected {{\"rack\": …}}: {e}"))
    })?;
    let rack = info.rack.as_deref().unwrap_or("");
    validate_rack(rack).map_err(AdminError::PreconditionFailed)?;
    update(&state, |racks| {
        racks.set(&address, &group, info.clone());
        Ok(())
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The `{bookie}` segment: an address, taken verbatim (percent-decoded).
fn bookie(uri: &Uri) -> Result<String, AdminError> {
    PathSegments::new(uri)
        .decoded(2)?
        .filter(|a| !a.is_empty())
        .ok_or_else(|| AdminError::PreconditionFailed("Bookie address is missing".to_string()))
}

fn not_found(address: &str) -> AdminError {
    AdminError::NotFound(format!("Bookie rack placement configuration not found: {address}"))
}

/// The stored assignments and what a compare-and-set of them must expect.
async fn load(state: &AdminState) -> Result<(StorageNodeRacks, ExpectedVersion), AdminError> {
    Ok(match get_json(state, keys::STORAGE_NODE_RACKS).await? {
        Some((racks, version)) => (racks, ExpectedVersion::Exactly(version)),
        None => (StorageNodeRacks::default(), ExpectedVersion::Absent),
    })
}

/// Applies `change` to the assignments by compare-and-set, retried on a concurrent change.
async fn update(
    state: &AdminState,
    change: impl Fn(&mut StorageNodeRacks) -> Result<(), AdminError>,
) -> Result<(), AdminError> {
    update_document(state, keys::STORAGE_NODE_RACKS, "No rack assignments", || async {
        let (mut racks, expected) = load(state).await?;
        change(&mut racks)?;
        Ok((to_json_bytes(&racks)?, expected))
    })
    .await
}

/// `PUT|POST /admin/v2/bookies/{bookie}/decommission`: 204.
pub(crate) async fn decommission(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<StatusCode, AdminError> {
    let node = named_node(&state, &uri).await?;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    storage_nodes::start(state.store.as_ref(), &node, now_ms).await?;
    tracing::info!(
        node = node.id,
        address = node.address,
        "storage node decommissioning asked for"
    );
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /admin/v2/bookies/{bookie}/decommission`.
pub(crate) async fn decommission_status(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<Json<Value>, AdminError> {
    let node = named_node(&state, &uri).await?;
    Ok(Json(storage_nodes::status(state.store.as_ref(), &node).await?.to_json()))
}

/// `DELETE /admin/v2/bookies/{bookie}/decommission`: 204.
pub(crate) async fn cancel_decommission(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<StatusCode, AdminError> {
    let node = named_node(&state, &uri).await?;
    storage_nodes::cancel(state.store.as_ref(), &node).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /admin/v2/bookies/{bookie}`: 204.
pub(crate) async fn remove(
    State(state): State<AdminState>,
    uri: Uri,
) -> Result<StatusCode, AdminError> {
    let node = named_node(&state, &uri).await?;
    storage_nodes::remove(state.store.as_ref(), &node).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The node `/admin/v2/bookies/{bookie}/…` names.
async fn named_node(state: &AdminState, uri: &Uri) -> Result<StorageNode, AdminError> {
    let name = PathSegments::new(uri)
        .decoded(1)?
        .filter(|a| !a.is_empty())
        .ok_or_else(|| AdminError::PreconditionFailed("Bookie address is missing".to_string()))?;
    Ok(storage_nodes::resolve(state.store.as_ref(), &name).await?)
}

impl From<DecommissionError> for AdminError {
    fn from(e: DecommissionError) -> Self {
        match e {
            DecommissionError::UnknownNode(_) | DecommissionError::NotDecommissioning(_) => {
                AdminError::NotFound(e.to_string())
            }
            DecommissionError::NotRemovable { .. } => AdminError::Conflict(e.to_string()),
            DecommissionError::Metadata(e) => e.into(),
        }
    }
}

/// `GET /admin/v2/bookies/autorecovery`.
pub(crate) async fn autorecovery(
    State(state): State<AdminState>,
) -> Result<Json<Value>, AdminError> {
    Ok(Json(storage_nodes::overview(state.store.as_ref()).await?.to_json()))
}
