//! The ledger API below the broker: what a managed ledger needs of ledger storage, whether the
//! ledgers live in this process ([`LedgerStore`]), on replicated storage nodes, or in tiered
//! storage. The broker sees only [`LedgerStorage`].
//!
//! Semantics every implementation keeps (checked by `tests/it/conformance.rs`):
//! * Ledger ids are chosen by the caller (allocated cluster-wide through the metadata store);
//!   creating an existing id is `LedgerExists`.
//! * Entries are dense, `0..n`. The writer assigns entry ids: an append names the id it
//!   expects, and anything but the ledger's next id is `UnexpectedEntryId`. Appends of one
//!   ledger complete in entry order; once one fails, every later one fails too.
//! * An append's callback runs once the entry is durable (or has failed); only then is it
//!   readable, and counted by `last_add_confirmed` and `info`.
//! * `fence` stops appends (`Fenced`) and resolves with the durable entry count; `close`
//!   does the same and makes that count final. Both are idempotent.
//! * `delete` removes the ledger; later calls on it are `NoSuchLedger`.
//! * `read` returns exactly the entries asked for, or `NoSuchEntry` if any is not durable.

use crate::error::LedgerError;
use crate::store::{LedgerInfo, LedgerStore};
use async_trait::async_trait;
use bytes::Bytes;
use magnetar_model::storage_nodes::IsolationGroups;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Runs once an append is durable (with its entry id) or has failed. Keep it short: it may run
/// on the storage's completion thread.
pub type AppendCallback = Box<dyn FnOnce(Result<u64, LedgerError>) + Send>;

/// How a ledger is stored: ensemble size E >= write quorum Qw >= ack quorum Qa >= 1
/// (BookKeeper's terms; a local store is E = Qw = Qa = 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerMetadata {
    pub ensemble_size: u32,
    pub write_quorum: u32,
    pub ack_quorum: u32,
    /// Free-form labels (the owning topic, for operators and auditors).
    pub properties: BTreeMap<String, String>,
    /// The storage node groups the ledger's copies keep to (a namespace's bookie affinity);
    /// `None`: any node. A local store has one place and ignores it.
    pub isolation: Option<IsolationGroups>,
}

impl LedgerMetadata {
    /// One copy, on this node.
    pub fn local() -> Self {
        LedgerMetadata {
            ensemble_size: 1,
            write_quorum: 1,
            ack_quorum: 1,
            properties: BTreeMap::new(),
            isolation: None,
        }
    }

    pub fn validate(&self) -> Result<(), LedgerError> {
        let (e, w, a) = (self.ensemble_size, self.write_quorum, self.ack_quorum);
        if a == 0 || a > w || w > e {
            return Err(LedgerError::Unsupported(format!(
                "need ensemble {e} >= write quorum {w} >= ack quorum {a} >= 1"
            )));
        }
        Ok(())
    }
}

#[async_trait]
pub trait LedgerStorage: Send + Sync + 'static {
    /// Creates ledger `id`; resolves once its creation is durable.
    async fn create(&self, id: u64, metadata: &LedgerMetadata) -> Result<(), LedgerError>;

    /// Stages entry `entry_id` of `ledger` (it must be the ledger's next); `done` runs once the
    /// entry is durable or has failed, exactly once, and a ledger's in entry order (a managed
    /// ledger delivers its appends' outcomes in order across ledgers: one never answered would
    /// hold back the topic's later ones). An error here means nothing was staged.
    fn append(
        &self,
        ledger: u64,
        entry_id: u64,
        data: Bytes,
        done: AppendCallback,
    ) -> Result<(), LedgerError>;

    /// Entries `first..=last`. May block on disk or network: call it off the async runtime.
    fn read(&self, ledger: u64, first: u64, last: u64) -> Result<Vec<Bytes>, LedgerError>;

    /// Entries `first..=last` if they can be had without blocking (a write cache); `None`
    /// otherwise.
    fn read_cached(&self, ledger: u64, first: u64, last: u64) -> Option<Vec<Bytes>>;

    /// The last durable entry id (`None`: no entry yet).
    fn last_add_confirmed(&self, ledger: u64) -> Result<Option<u64>, LedgerError>;

    /// Refuses appends from now on; resolves with the durable entry count.
    async fn fence(&self, ledger: u64) -> Result<u64, LedgerError>;

    /// Closes the ledger; resolves with its final entry count.
    async fn close(&self, ledger: u64) -> Result<u64, LedgerError>;

    async fn delete(&self, ledger: u64) -> Result<(), LedgerError>;

    fn info(&self, ledger: u64) -> Result<LedgerInfo, LedgerError>;

    /// [`LedgerStorage::info`] from async code. A storage whose `info` may wait on the network
    /// answers here without holding a runtime thread meanwhile: a broker taking over thousands
    /// of topics at once would otherwise park every worker in a blocking wait (the default
    /// calls `info`).
    async fn info_async(&self, ledger: u64) -> Result<LedgerInfo, LedgerError> {
        self.info(ledger)
    }

    /// Ids below this may be taken already by this storage (ledgers created before ids came
    /// from the cluster-wide allocator): the allocator starts at or above it.
    fn ledger_id_floor(&self) -> u64 {
        0
    }

    /// Writes the storage's own Prometheus series, each with `labels` (none by default).
    fn write_metrics(
        &self,
        _out: &mut magnetar_metrics::Exposition,
        _labels: magnetar_metrics::Labels,
    ) {
    }

    /// Why new messages should be refused now (a local disk short of space, so that what is
    /// left serves cursor writes, deletes and compaction); `None` by default.
    fn short_of_disk(&self) -> Option<String> {
        None
    }
}

#[async_trait]
impl LedgerStorage for LedgerStore {
    async fn create(&self, id: u64, metadata: &LedgerMetadata) -> Result<(), LedgerError> {
        metadata.validate()?;
        if metadata.write_quorum > 1 {
            return Err(LedgerError::Unsupported(format!(
                "a local store keeps one copy, not {}",
                metadata.write_quorum
            )));
        }
        self.create_ledger_with_id(id).await
    }

    fn append(
        &self,
        ledger: u64,
        entry_id: u64,
        data: Bytes,
        done: AppendCallback,
    ) -> Result<(), LedgerError> {
        self.append_at(ledger, entry_id, data, done, crate::Commit::Writer)
    }

    fn read(&self, ledger: u64, first: u64, last: u64) -> Result<Vec<Bytes>, LedgerError> {
        self.read_range(ledger, first, last)
    }

    fn read_cached(&self, ledger: u64, first: u64, last: u64) -> Option<Vec<Bytes>> {
        LedgerStore::read_cached(self, ledger, first, last)
    }

    fn last_add_confirmed(&self, ledger: u64) -> Result<Option<u64>, LedgerError> {
        Ok(self.ledger_info(ledger)?.entries.checked_sub(1))
    }

    async fn fence(&self, ledger: u64) -> Result<u64, LedgerError> {
        self.fence_ledger(ledger).await
    }

    async fn close(&self, ledger: u64) -> Result<u64, LedgerError> {
        self.close_ledger(ledger).await
    }

    async fn delete(&self, ledger: u64) -> Result<(), LedgerError> {
        self.delete_ledger(ledger).await
    }

    fn info(&self, ledger: u64) -> Result<LedgerInfo, LedgerError> {
        self.ledger_info(ledger)
    }

    fn ledger_id_floor(&self) -> u64 {
        self.next_local_ledger_id()
    }

    fn write_metrics(
        &self,
        out: &mut magnetar_metrics::Exposition,
        labels: magnetar_metrics::Labels,
    ) {
        LedgerStore::write_metrics(self, out, labels);
    }

    fn short_of_disk(&self) -> Option<String> {
        LedgerStore::short_of_disk(self)
    }
}

/// Ledgers in memory: nothing survives the process. For tests and simulations of the layers
/// above; appends complete at once, in order.
#[derive(Default)]
pub struct MemoryLedgers {
    ledgers: Mutex<BTreeMap<u64, MemoryLedger>>,
}

#[derive(Default)]
struct MemoryLedger {
    entries: Vec<Bytes>,
    fenced: bool,
    closed: bool,
}

impl MemoryLedgers {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    fn with<T>(
        &self,
        ledger: u64,
        f: impl FnOnce(&mut MemoryLedger) -> Result<T, LedgerError>,
    ) -> Result<T, LedgerError> {
        let mut ledgers = self.ledgers.lock();
        f(ledgers.get_mut(&ledger).ok_or(LedgerError::NoSuchLedger(ledger))?)
    }
}

#[async_trait]
impl LedgerStorage for MemoryLedgers {
    async fn create(&self, id: u64, metadata: &LedgerMetadata) -> Result<(), LedgerError> {
        metadata.validate()?;
        let mut ledgers = self.ledgers.lock();
        if ledgers.contains_key(&id) {
            return Err(LedgerError::LedgerExists(id));
        }
        ledgers.insert(id, MemoryLedger::default());
        Ok(())
    }

    fn append(
        &self,
        ledger: u64,
        entry_id: u64,
        data: Bytes,
        done: AppendCallback,
    ) -> Result<(), LedgerError> {
        self.with(ledger, |state| {
            if state.closed {
                return Err(LedgerError::Closed(ledger));
            }
            if state.fenced {
                return Err(LedgerError::Fenced(ledger));
            }
            let expected = state.entries.len() as u64;
            if entry_id != expected {
                return Err(LedgerError::UnexpectedEntryId { ledger, expected, given: entry_id });
            }
            state.entries.push(data);
            Ok(())
        })?;
        done(Ok(entry_id));
        Ok(())
    }

    fn read(&self, ledger: u64, first: u64, last: u64) -> Result<Vec<Bytes>, LedgerError> {
        self.with(ledger, |state| {
            if first > last || last >= state.entries.len() as u64 {
                return Err(LedgerError::NoSuchEntry { ledger, entry: last });
            }
            Ok(state.entries[first as usize..=last as usize].to_vec())
        })
    }

    fn read_cached(&self, ledger: u64, first: u64, last: u64) -> Option<Vec<Bytes>> {
        self.read(ledger, first, last).ok()
    }

    fn last_add_confirmed(&self, ledger: u64) -> Result<Option<u64>, LedgerError> {
        self.with(ledger, |state| Ok((state.entries.len() as u64).checked_sub(1)))
    }

    async fn fence(&self, ledger: u64) -> Result<u64, LedgerError> {
        self.with(ledger, |state| {
            state.fenced = true;
            Ok(state.entries.len() as u64)
        })
    }

    async fn close(&self, ledger: u64) -> Result<u64, LedgerError> {
        self.with(ledger, |state| {
            state.closed = true;
            Ok(state.entries.len() as u64)
        })
    }

    async fn delete(&self, ledger: u64) -> Result<(), LedgerError> {
        self.ledgers.lock().remove(&ledger).map(|_| ()).ok_or(LedgerError::NoSuchLedger(ledger))
    }

    fn info(&self, ledger: u64) -> Result<LedgerInfo, LedgerError> {
        self.with(ledger, |state| {
            Ok(LedgerInfo {
                id: ledger,
                entries: state.entries.len() as u64,
                closed: state.closed,
                fenced: state.fenced,
            })
        })
    }
}
