//! Ledger metadata in the metadata store: `/ledgers/{id}`, JSON, compare-and-set only.

use bytes::Bytes;
use magnetar_ledger::LedgerError;
use magnetar_metadata::{ExpectedVersion, MetadataError, MetadataStore};
use magnetar_replication::meta::LedgerMeta;
use magnetar_replication::{LedgerId, MetaWrite};
use std::sync::Arc;
use std::time::Duration;

pub(crate) fn unavailable(e: MetadataError) -> LedgerError {
    LedgerError::Unavailable(format!("metadata store: {e}"))
}

/// Every ledger's metadata now (a ledger deleted meanwhile is left out, one not understood is
/// logged and left out).
pub async fn all_ledgers(
    metadata: &dyn MetadataStore,
) -> Result<std::collections::BTreeMap<LedgerId, LedgerMeta>, MetadataError> {
    let ids: Vec<String> = metadata.list_children(magnetar_model::keys::LEDGERS_ROOT).await?;
    let ids: Vec<LedgerId> = ids.iter().filter_map(|id| id.parse().ok()).collect();
    let keys: Vec<String> = ids.iter().map(|&id| magnetar_model::keys::ledger(id)).collect();
    let mut ledgers = std::collections::BTreeMap::new();
    for (id, found) in ids.into_iter().zip(metadata.get_many(&keys).await?) {
        let Some(found) = found else { continue };
        match LedgerMeta::from_json(&found.value) {
            Ok(meta) => {
                ledgers.insert(id, meta);
            }
            Err(error) => tracing::warn!(ledger = id, %error, "ledger metadata not understood"),
        }
    }
    Ok(ledgers)
}

/// The stored metadata and its version; `None` if the ledger does not exist.
pub(crate) async fn read_meta(
    metadata: &dyn MetadataStore,
    id: LedgerId,
) -> Result<Option<(LedgerMeta, u64)>, LedgerError> {
    let Some(stored) =
        metadata.get(&magnetar_model::keys::ledger(id)).await.map_err(unavailable)?
    else {
        return Ok(None);
    };
    let meta = LedgerMeta::from_json(&stored.value).map_err(|e| LedgerError::Corrupt {
        file: magnetar_model::keys::ledger(id),
        why: e.to_string(),
    })?;
    Ok(Some((meta, stored.version)))
}

/// Creates the metadata of a new ledger; its version.
pub(crate) async fn create_meta(
    metadata: &dyn MetadataStore,
    id: LedgerId,
    meta: &LedgerMeta,
) -> Result<u64, LedgerError> {
    let key = magnetar_model::keys::ledger(id);
    match metadata.put(&key, Bytes::from(meta.to_json()), ExpectedVersion::Absent).await {
        Ok(version) => Ok(version),
        Err(MetadataError::BadVersion { .. }) => Err(LedgerError::LedgerExists(id)),
        Err(e) => Err(unavailable(e)),
    }
}

/// A core's compare-and-set, with its outcome in the cores' terms.
pub(crate) async fn write_meta(
    metadata: &dyn MetadataStore,
    id: LedgerId,
    meta: &LedgerMeta,
    expected: u64,
) -> MetaWrite {
    let key = magnetar_model::keys::ledger(id);
    match metadata.put(&key, Bytes::from(meta.to_json()), ExpectedVersion::Exactly(expected)).await
    {
        Ok(version) => MetaWrite::Written(version),
        Err(MetadataError::BadVersion { .. }) => match read_meta(metadata, id).await {
            Ok(Some((current, version))) => {
                MetaWrite::Conflict { current: Box::new(current), version }
            }
            _ => MetaWrite::Unknown,
        },
        Err(e) => {
            tracing::warn!(ledger = id, error = %e, "ledger metadata write failed; reading it back");
            MetaWrite::Unknown
        }
    }
}

/// A core's `WriteMeta`, carried out off the core's task; `deliver` gets the outcome.
pub(crate) fn spawn_write(
    metadata: Arc<dyn MetadataStore>,
    id: LedgerId,
    meta: LedgerMeta,
    expected: u64,
    deliver: impl FnOnce(MetaWrite) + Send + 'static,
) {
    tokio::spawn(async move { deliver(write_meta(&*metadata, id, &meta, expected).await) });
}

/// A core's `ReadMeta` (after an unknown outcome), retried for a while: the core cannot go on
/// without knowing what is stored. `deliver` is not called if the ledger is gone or the store
/// stays unreadable (the core's own deadline then ends it).
pub(crate) fn spawn_read(
    metadata: Arc<dyn MetadataStore>,
    id: LedgerId,
    deliver: impl FnOnce(LedgerMeta, u64) + Send + 'static,
) {
    tokio::spawn(async move {
        for attempt in 0..50u64 {
            match read_meta(&*metadata, id).await {
                Ok(Some((meta, version))) => return deliver(meta, version),
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(ledger = id, attempt, error = %e, "ledger metadata unreadable; retrying");
                    tokio::time::sleep(Duration::from_millis(100 * (attempt + 1).min(10))).await;
                }
            }
        }
    });
}
