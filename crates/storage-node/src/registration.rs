//! The node's registration: an ephemeral key `/storage-nodes/{id}` bound to its metadata
//! session, written again when a lost session is re-established, refreshed with the free
//! disk space every `refresh` so that placement prefers emptier nodes, and at once when the
//! node turns read-only or writable again (`space.rs`). Each refresh also reads whether the
//! operator is decommissioning the node (`/storage-node-decommission/{id}`): read-only while so.

use bytes::Bytes;
use magnetar_metadata::{ExpectedVersion, SessionEvent, SessionStore};
use magnetar_replication::NodeId;
use std::sync::Arc;
use std::time::Duration;

use crate::space::DiskSpace;
use magnetar_model::storage_nodes::{StorageNodeDecommission, StorageNodeRegistration};

/// Writes the registration now (an error if that fails), then keeps it current in a task
/// that ends when the store closes. `node_info` gives what does not change while the node
/// runs (address, rack, TLS); its free space and read-only state come from `space`.
pub async fn register(
    store: Arc<dyn SessionStore>,
    node: NodeId,
    node_info: StorageNodeRegistration,
    space: Arc<DiskSpace>,
    refresh: Duration,
) -> Result<tokio::task::JoinHandle<()>, magnetar_metadata::MetadataError> {
    let key = magnetar_model::keys::storage_node(node.0);
    let document = {
        let space = space.clone();
        move || {
            let info = StorageNodeRegistration {
                free_bytes: space.free(),
                read_only: space.is_read_only(),
                plain_clients: node_info.tls && node_info.plain_clients,
                ..node_info.clone()
            };
            Bytes::from(serde_json::to_vec(&info).expect("serializable"))
        }
    };
    let mut events = store.session_events();
    // A node restarted in the middle of its decommissioning stays read-only from the start.
    if let Some(stored) =
        store.get(&magnetar_model::keys::storage_node_decommission(node.0)).await?
    {
        check_decommission(node, &stored.value);
        space.set_decommissioned(true);
    }
    // Any: a node restarted after a kill -9 takes its own key over before the old lease ends.
    store.put_ephemeral(&key, document(), ExpectedVersion::Any).await?;
    tracing::info!(key, "storage node registered");
    Ok(tokio::spawn(async move {
        let mut ticks = tokio::time::interval(refresh);
        ticks.tick().await;
        loop {
            tokio::select! {
                event = events.recv() => match event {
                    Some(SessionEvent::SessionReestablished { .. }) | Some(SessionEvent::Lagged) => {}
                    Some(_) => continue,
                    None => return,
                },
                _ = ticks.tick() => {}
                () = space.changed() => {}
            }
            let asked = magnetar_model::keys::storage_node_decommission(node.0);
            match store.get(&asked).await {
                Ok(stored) => {
                    if let Some(stored) = &stored {
                        check_decommission(node, &stored.value);
                    }
                    space.set_decommissioned(stored.is_some());
                }
                Err(e) => tracing::warn!(key = asked, error = %e, "decommissioning not read"),
            }
            if let Err(e) = store.put_ephemeral(&key, document(), ExpectedVersion::Any).await {
                tracing::warn!(key, error = %e, "storage node registration not written");
            }
        }
    }))
}

/// Logs a decommission record that does not parse (its presence is what counts).
fn check_decommission(node: NodeId, value: &[u8]) {
    if let Err(e) = serde_json::from_slice::<StorageNodeDecommission>(value) {
        tracing::warn!(node = node.0, error = %e, "decommission record not understood (draining)");
    }
}
