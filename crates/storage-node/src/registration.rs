//! The node's registration: an ephemeral key `/storage-nodes/{id}` bound to its metadata
//! session, written again when a lost session is re-established, and refreshed with the free
//! disk space every `refresh` so that placement prefers emptier nodes.

use bytes::Bytes;
use magnetar_metadata::{ExpectedVersion, SessionEvent, SessionStore};
use magnetar_replication::NodeId;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use magnetar_replication::placement::Registration;

/// Writes the registration now (an error if that fails), then keeps it current in a task
/// that ends when the store closes.
pub async fn register(
    store: Arc<dyn SessionStore>,
    node: NodeId,
    address: String,
    rack: Option<String>,
    data_dir: PathBuf,
    refresh: Duration,
) -> Result<tokio::task::JoinHandle<()>, magnetar_metadata::MetadataError> {
    let key = magnetar_model::keys::storage_node(node.0);
    let document = move || {
        let free_bytes = magnetar_ledger::store::free_bytes(&data_dir).unwrap_or(0);
        let info = Registration { address: address.clone(), free_bytes, rack: rack.clone() };
        Bytes::from(serde_json::to_vec(&info).expect("serializable"))
    };
    let mut events = store.session_events();
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
            }
            if let Err(e) = store.put_ephemeral(&key, document(), ExpectedVersion::Any).await {
                tracing::warn!(key, error = %e, "storage node registration not written");
            }
        }
    }))
}
