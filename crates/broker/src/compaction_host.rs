//! What topic compaction (`magnetar_compaction`) needs of a topic: its entries, a ledger id,
//! and its record written by compare-and-set through the topic's fence (a broker that lost the
//! topic writes no record).

use crate::cursor::{next_position, Position};
use crate::fence::Fence;
use crate::managed_ledger::ManagedLedger;
use async_trait::async_trait;
use bytes::Bytes;
use magnetar_compaction::topic::Pos;
use magnetar_compaction::CompactionError;
use magnetar_ledger::LedgerMetadata;
use magnetar_metadata::MetadataStore;
use std::sync::Arc;

pub struct CompactionHostImpl {
    pub managed_ledger: Arc<ManagedLedger>,
    pub metadata: Arc<dyn MetadataStore>,
    pub fence: Arc<Fence>,
    pub key: String,
    pub topic: String,
    /// The record's version as last read or written.
    pub version: tokio::sync::Mutex<Option<u64>>,
}

fn topic_error(error: impl std::fmt::Display) -> CompactionError {
    CompactionError::Topic(error.to_string())
}

#[async_trait]
impl magnetar_compaction::CompactionHost for CompactionHostImpl {
    fn read_after(
        &self,
        after: Option<Pos>,
        count: usize,
    ) -> Result<Vec<(Pos, Bytes)>, CompactionError> {
        let ledgers = self.managed_ledger.ledgers();
        let after = after.map(|(l, e)| Position::new(l, e));
        let Some(from) = next_position(&ledgers, after) else { return Ok(Vec::new()) };
        let entries = self.managed_ledger.read_from(from, count).map_err(topic_error)?;
        Ok(entries.into_iter().map(|(p, data)| ((p.ledger_id, p.entry_id), data)).collect())
    }

    fn last_confirmed(&self) -> Option<Pos> {
        self.managed_ledger.last_confirmed().map(|p| (p.ledger_id, p.entry_id))
    }

    fn size_after(&self, after: Option<Pos>) -> u64 {
        self.managed_ledger.size_after(after.map(|(l, e)| Position::new(l, e)))
    }

    async fn new_ledger(&self) -> Result<(u64, LedgerMetadata), CompactionError> {
        let backend = self.managed_ledger.backend();
        let id = backend.ids.next().await.map_err(topic_error)?;
        let mut metadata = backend.persistence();
        metadata.properties.insert("component".into(), "compacted-ledger".into());
        metadata.properties.insert("topic".into(), self.topic.clone());
        Ok((id, metadata))
    }

    async fn load_record(&self) -> Result<Option<Bytes>, CompactionError> {
        let found = self.metadata.get(&self.key).await.map_err(topic_error)?;
        *self.version.lock().await = found.as_ref().map(|f| f.version);
        Ok(found.map(|f| f.value))
    }

    async fn store_record(&self, value: Bytes) -> Result<(), CompactionError> {
        let mut version = self.version.lock().await;
        self.fence.put(&*self.metadata, &self.key, value, &mut version).await.map_err(topic_error)
    }
}
