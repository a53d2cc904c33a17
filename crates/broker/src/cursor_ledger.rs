//! Cursor ledgers: where a durable subscription's acknowledgement state is persisted (Pulsar's
//! `ManagedCursorImpl.persistPositionToLedger`).
//!
//! Each durable subscription owns a cursor ledger in the topic's ledger storage (id from the
//! cluster-wide allocator; properties name the topic and subscription). Every persist appends
//! the whole encoded [`AckState`] as one entry; the last durable entry is the current state.
//! The metadata store keeps, at the cursor key, only a small [`CursorRecord`]: the current
//! ledger, the ledgers still to delete, and a snapshot (mark-delete, the state itself if small).
//! The record is written by compare-and-set (through the topic's [`Fence`]) only when the
//! pointer changes: a new subscription, a rollover, a load. In steady state an ack batch costs
//! one ledger append and no metadata write.
//!
//! Rollover, when the ledger holds [`CursorLedgerLimits`] entries or bytes (or an append to it
//! failed): create a ledger, append the full state as its entry 0 and wait for it, CAS the
//! record to name it (the old ledger joins the record's obsolete list), then delete the
//! obsolete ledgers. A crash before the CAS leaves the old record valid (its ledger untouched);
//! after it, the next load deletes what the record lists as obsolete.
//!
//! Load ([`load`]): a record's ledger is fenced first (a previous owner's later appends fail,
//! and with them its persists: it is fenced, the BookKeeper way), then its last entry is read.
//! No entry or no ledger: the record's snapshot is used. The subscription then rolls over to a
//! fresh ledger at once (as Pulsar opens a new cursor ledger), which also converts an old-format
//! value (the raw state older versions stored at the key).
//!
//! Invariants:
//! - The ledger a stored record names holds, as its last durable entry, a state at least as new
//!   as every state whose persist completed (ack receipts wait for that persist).
//! - A ledger is deleted only once a record that no longer names it as current is stored.
//! - A record stays below [`crate::cursor::MAX_RECORD_BYTES`].
//! - A lost CAS or a fenced cursor-ledger append fences the topic ([`BrokerError::Fenced`]).
//!
//! Known gap: a crash between creating a ledger and the CAS that names it leaves that ledger
//! unreferenced (as the managed ledger's own rollover does); its properties name the topic and
//! subscription for an auditor to find it.
//!
//! The decisions (when to roll over, what the record says, which state a load takes) are the
//! pure [`CursorLog`] and [`loaded_state`]; [`CursorLedger`] carries them out.

use crate::cursor::{AckState, CursorRecord, CursorValue, Position, MAX_OBSOLETE_LEDGERS};
use crate::error::BrokerError;
use crate::fence::Fence;
use crate::managed_ledger::LedgerBackend;
use bytes::Bytes;
use magnetar_ledger::{LedgerError, LedgerStorage};
use magnetar_metadata::{ExpectedVersion, MetadataError, MetadataStore, Versioned};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// When a cursor ledger is rolled over (Pulsar's `managedLedgerCursorMaxEntriesPerLedger`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CursorLedgerLimits {
    pub max_entries: u64,
    pub max_bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct OpenLedger {
    id: u64,
    entries: u64,
    bytes: u64,
}

/// What the next persist does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Append the state to `ledger` as entry `entry`.
    Append { ledger: u64, entry: u64 },
    /// Start a new ledger with the state as its first entry and point the record at it.
    Roll,
}

/// The cursor's persistence state, without I/O: which ledger is written, how full it is, what
/// is left to delete, and the record's version for the next compare-and-set.
#[derive(Debug, Clone)]
pub struct CursorLog {
    limits: CursorLedgerLimits,
    current: Option<OpenLedger>,
    /// Ledgers no longer current, to delete once a record naming a newer one is stored.
    obsolete: Vec<u64>,
    /// The record's version as last written or read (`None`: no record).
    version: Option<u64>,
}

impl CursorLog {
    /// A log with no writable ledger yet (its first persist rolls over). `obsolete`: ledgers
    /// to delete after that rollover (a loaded record's ledger and obsolete list).
    pub fn new(limits: CursorLedgerLimits, version: Option<u64>, obsolete: Vec<u64>) -> Self {
        assert!(limits.max_entries > 0 && limits.max_bytes > 0, "{limits:?}");
        CursorLog { limits, current: None, obsolete, version }
    }

    pub fn step(&self) -> Step {
        match self.current {
            Some(open)
                if open.entries < self.limits.max_entries && open.bytes < self.limits.max_bytes =>
            {
                Step::Append { ledger: open.id, entry: open.entries }
            }
            _ => Step::Roll,
        }
    }

    /// Entry `bytes` long appended (durably) to the current ledger.
    pub fn appended(&mut self, ledger: u64, bytes: u64) {
        let open = self.current.as_mut().expect("appended to the current ledger");
        assert_eq!(open.id, ledger, "appended to the current ledger");
        open.entries += 1;
        open.bytes += bytes;
    }

    /// The current ledger cannot be trusted any more (an append failed, or a record write's
    /// outcome is unknown): the next persist rolls over, and it will be deleted after that.
    pub fn abandon_current(&mut self) {
        if let Some(open) = self.current.take() {
            self.obsolete.push(open.id);
        }
    }

    /// A ledger that was never named current (created for a rollover that did not complete):
    /// delete it with the obsolete ones.
    pub fn abandon(&mut self, ledger: u64) {
        if !self.obsolete.contains(&ledger) {
            self.obsolete.push(ledger);
        }
    }

    /// The record a rollover to `ledger` stores. Its obsolete list holds the current ledger
    /// and what is still to delete (the newest [`MAX_OBSOLETE_LEDGERS`]).
    pub fn roll_record(
        &self,
        ledger: u64,
        mark_delete: Option<Position>,
        encoded_state: &[u8],
    ) -> CursorRecord {
        let mut obsolete = self.obsolete.clone();
        obsolete.extend(self.current.map(|open| open.id));
        obsolete.retain(|&id| id != ledger);
        let excess = obsolete.len().saturating_sub(MAX_OBSOLETE_LEDGERS);
        obsolete.drain(..excess);
        CursorRecord::new(ledger, obsolete, mark_delete, encoded_state)
    }

    /// The record naming `ledger` (whose entry 0 is `bytes` long) is stored at `version`.
    pub fn rolled(&mut self, ledger: u64, bytes: u64, version: u64) {
        self.abandon_current();
        self.obsolete.retain(|&id| id != ledger);
        self.current = Some(OpenLedger { id: ledger, entries: 1, bytes });
        self.version = Some(version);
    }

    /// Ledgers to delete now (after a rollover's CAS).
    pub fn obsolete(&self) -> &[u64] {
        &self.obsolete
    }

    pub fn deleted(&mut self, ledger: u64) {
        self.obsolete.retain(|&id| id != ledger);
    }

    pub fn version(&self) -> Option<u64> {
        self.version
    }

    pub fn current_ledger(&self) -> Option<u64> {
        self.current.map(|open| open.id)
    }

    /// Every ledger this cursor still holds (to delete with the subscription).
    pub fn ledgers(&self) -> Vec<u64> {
        self.current.map(|open| open.id).into_iter().chain(self.obsolete.iter().copied()).collect()
    }

    /// The record is gone (unsubscribed).
    pub fn forget(&mut self) {
        self.current = None;
        self.obsolete.clear();
        self.version = None;
    }
}

/// What a load found at the end of a record's ledger (after fencing it).
#[derive(Debug)]
pub enum LedgerTail {
    /// The last durable entry.
    Entry(Bytes),
    /// The ledger has no entry.
    Empty,
    /// The ledger does not exist.
    Gone,
}

/// Where a loaded state came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadSource {
    /// The cursor ledger's last entry (the normal case).
    Ledger,
    /// The record's snapshot: the ledger was empty, gone, or its last entry unreadable.
    Snapshot,
    /// An old-format value: the raw state itself.
    Legacy,
}

/// The state a load takes from a record and what its ledger's end holds.
pub fn loaded_state(record: &CursorRecord, tail: LedgerTail) -> (AckState, LoadSource) {
    match tail {
        LedgerTail::Entry(bytes) => match AckState::decode(&bytes) {
            Ok(state) => (state, LoadSource::Ledger),
            Err(error) => {
                tracing::error!(ledger = record.ledger, %error, "cursor ledger entry unreadable; using the record's snapshot");
                (record.snapshot(), LoadSource::Snapshot)
            }
        },
        LedgerTail::Empty | LedgerTail::Gone => {
            tracing::warn!(
                ledger = record.ledger,
                ?tail,
                "cursor ledger without state; using the record's snapshot"
            );
            (record.snapshot(), LoadSource::Snapshot)
        }
    }
}

/// A cursor as loaded from the metadata store and its ledger.
#[derive(Debug)]
pub struct LoadedCursor {
    pub ack: AckState,
    pub source: LoadSource,
    /// The record's version (the next CAS expects it).
    pub version: u64,
    /// Ledgers to delete once the subscription has rolled over to its own ledger.
    pub obsolete: Vec<u64>,
}

/// Why a stored cursor could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The value is neither format (or is corrupt): the subscription is skipped (logged).
    #[error("cursor value unreadable: {0}")]
    Unreadable(#[from] crate::cursor::CursorStateError),
    /// Storage failed: the topic load fails (and may be retried), nothing is guessed.
    #[error(transparent)]
    Broker(#[from] BrokerError),
}

/// Loads the cursor stored as `found`: fences its ledger and reads the last entry (off the
/// async runtime), falling back to the record's snapshot (see [`loaded_state`]).
pub async fn load(
    storage: &Arc<dyn LedgerStorage>,
    found: &Versioned,
) -> Result<LoadedCursor, LoadError> {
    let record = match CursorValue::decode(&found.value)? {
        CursorValue::Legacy(ack) => {
            return Ok(LoadedCursor {
                ack,
                source: LoadSource::Legacy,
                version: found.version,
                obsolete: Vec::new(),
            });
        }
        CursorValue::Record(record) => record,
    };
    let tail = read_tail(storage, record.ledger).await?;
    let (ack, source) = loaded_state(&record, tail);
    let mut obsolete = record.obsolete.clone();
    obsolete.push(record.ledger);
    Ok(LoadedCursor { ack, source, version: found.version, obsolete })
}

/// Fences `ledger` and reads its last durable entry.
async fn read_tail(
    storage: &Arc<dyn LedgerStorage>,
    ledger: u64,
) -> Result<LedgerTail, BrokerError> {
    match storage.fence(ledger).await {
        Ok(_) => {}
        Err(LedgerError::NoSuchLedger(_)) => return Ok(LedgerTail::Gone),
        Err(error) => return Err(error.into()),
    }
    let Some(last) = storage.last_add_confirmed(ledger)? else {
        return Ok(LedgerTail::Empty);
    };
    let storage = storage.clone();
    let read = tokio::task::spawn_blocking(move || storage.read(ledger, last, last))
        .await
        .map_err(|_| BrokerError::ShuttingDown)?;
    match read {
        Ok(mut entries) => Ok(entries.pop().map_or(LedgerTail::Empty, LedgerTail::Entry)),
        Err(LedgerError::NoSuchLedger(_)) => Ok(LedgerTail::Gone),
        Err(error) => Err(error.into()),
    }
}

/// Deletes a stored cursor that no subscription holds (topic delete): its ledgers, then its
/// key. An unreadable value is deleted as it is.
pub async fn delete_stored(
    storage: &Arc<dyn LedgerStorage>,
    metadata: &dyn MetadataStore,
    key: &str,
) -> Result<(), BrokerError> {
    let Some(found) = metadata.get(key).await? else { return Ok(()) };
    if let Ok(CursorValue::Record(record)) = CursorValue::decode(&found.value) {
        for ledger in record.obsolete.iter().copied().chain([record.ledger]) {
            delete_ledger(storage, ledger).await?;
        }
    }
    match metadata.delete(key, ExpectedVersion::Exactly(found.version)).await {
        Ok(()) | Err(MetadataError::NotFound { .. }) => Ok(()),
        Err(error) => Err(error.into()),
    }
}

async fn delete_ledger(storage: &Arc<dyn LedgerStorage>, ledger: u64) -> Result<(), BrokerError> {
    match storage.delete(ledger).await {
        Ok(()) | Err(LedgerError::NoSuchLedger(_)) => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// Where a test stops a rollover, as a crash would.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashPoint {
    /// After the new ledger's first entry is durable, before the record names it.
    AfterAppend,
    /// After the record names the new ledger, before the old one is deleted.
    AfterCas,
}

/// A durable subscription's cursor persistence: carries out the [`CursorLog`]'s steps against
/// the ledger storage and the metadata store.
pub struct CursorLedger {
    backend: LedgerBackend,
    metadata: Arc<dyn MetadataStore>,
    fence: Arc<Fence>,
    key: String,
    /// Properties of the cursor's ledgers (their quorums are the backend's at creation).
    ledger_properties: BTreeMap<String, String>,
    log: CursorLog,
    /// Unsubscribed: nothing is written any more.
    deleted: bool,
    /// Closed with its topic (an unload): persists are refused.
    closed: bool,
    #[cfg(test)]
    pub(crate) crash_at: Option<CrashPoint>,
}

impl CursorLedger {
    /// The cursor of subscription `subscription` of `topic`, stored at `key`; `version` and
    /// `obsolete` as loaded (a new subscription: `None` and nothing).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        backend: LedgerBackend,
        metadata: Arc<dyn MetadataStore>,
        fence: Arc<Fence>,
        key: String,
        topic: &str,
        subscription: &str,
        limits: CursorLedgerLimits,
        version: Option<u64>,
        obsolete: Vec<u64>,
    ) -> Self {
        let ledger_properties = BTreeMap::from([
            ("magnetar.kind".to_string(), "cursor".to_string()),
            ("magnetar.topic".to_string(), topic.to_string()),
            ("magnetar.subscription".to_string(), subscription.to_string()),
        ]);
        CursorLedger {
            backend,
            metadata,
            fence,
            key,
            ledger_properties,
            log: CursorLog::new(limits, version, obsolete),
            deleted: false,
            closed: false,
            #[cfg(test)]
            crash_at: None,
        }
    }

    /// A new subscription's cursor on `managed_ledger`'s backend, for tests.
    #[cfg(test)]
    pub(crate) fn for_test(
        managed_ledger: &crate::managed_ledger::ManagedLedger,
        metadata: Arc<dyn MetadataStore>,
        key: &str,
        limits: CursorLedgerLimits,
    ) -> Self {
        let backend = managed_ledger.backend().clone();
        let fence = managed_ledger.fence().clone();
        CursorLedger::new(backend, metadata, fence, key.into(), "t", "sub", limits, None, vec![])
    }

    pub fn log(&self) -> &CursorLog {
        &self.log
    }

    /// Persists `state` (an [`AckState`] encoding whose mark-delete is `mark_delete`):
    /// resolves once it is durable and a restart would load it.
    pub async fn persist(
        &mut self,
        state: Bytes,
        mark_delete: Option<Position>,
    ) -> Result<(), BrokerError> {
        if self.deleted {
            return Ok(());
        }
        if self.closed {
            return Err(BrokerError::ServiceNotReady(format!(
                "cursor {} is closed: its topic is being unloaded",
                self.key
            )));
        }
        if self.fence.is_fenced() {
            return Err(self.fence.error());
        }
        match self.log.step() {
            Step::Append { ledger, entry } => {
                let bytes = state.len() as u64;
                match self.append(ledger, entry, state.clone()).await {
                    Ok(()) => {
                        self.log.appended(ledger, bytes);
                        Ok(())
                    }
                    Err(LedgerError::Fenced(_)) => Err(self.fence.fence(&self.key)),
                    Err(error) => {
                        // Nothing more can go to this ledger: carry on in a new one.
                        tracing::warn!(key = %self.key, ledger, %error, "cursor ledger append failed; rolling over");
                        self.log.abandon_current();
                        self.roll(state, mark_delete).await
                    }
                }
            }
            Step::Roll => self.roll(state, mark_delete).await,
        }
    }

    async fn append(&self, ledger: u64, entry: u64, data: Bytes) -> Result<(), LedgerError> {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        self.backend.storage.append(
            ledger,
            entry,
            data,
            Box::new(move |result| {
                let _ = sender.send(result);
            }),
        )?;
        let written = receiver.await.map_err(|_| LedgerError::Closed(ledger))??;
        assert_eq!(written, entry, "the storage wrote the entry id asked for");
        self.backend.metrics.cursor_ledger_appends.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    async fn roll(
        &mut self,
        state: Bytes,
        mark_delete: Option<Position>,
    ) -> Result<(), BrokerError> {
        let ledger = self.backend.ids.next().await?;
        let mut ledger_metadata = self.backend.persistence();
        ledger_metadata.properties.extend(self.ledger_properties.clone());
        self.backend.storage.create(ledger, &ledger_metadata).await?;
        if let Err(error) = self.append(ledger, 0, state.clone()).await {
            let _ = delete_ledger(&self.backend.storage, ledger).await;
            return Err(error.into());
        }
        #[cfg(test)]
        if self.crash_at == Some(CrashPoint::AfterAppend) {
            return Err(BrokerError::ShuttingDown);
        }
        let record = self.log.roll_record(ledger, mark_delete, &state);
        let mut version = self.log.version();
        let written =
            self.fence.put(&*self.metadata, &self.key, record.encode().into(), &mut version).await;
        match (written, version) {
            (Ok(()), Some(version)) => self.log.rolled(ledger, state.len() as u64, version),
            (Ok(()), None) => unreachable!("a successful put records its version"),
            (Err(error @ BrokerError::Fenced(_)), _) => {
                // Nobody else knows this ledger.
                let _ = delete_ledger(&self.backend.storage, ledger).await;
                return Err(error);
            }
            (Err(error), _) => {
                // The write's outcome is unknown: the record may name the new ledger or the
                // current one. Append to neither; the next rollover's CAS settles which (a
                // stale version fences this writer).
                self.log.abandon_current();
                self.log.abandon(ledger);
                return Err(error);
            }
        }
        #[cfg(test)]
        if self.crash_at == Some(CrashPoint::AfterCas) {
            return Err(BrokerError::ShuttingDown);
        }
        for old in self.log.obsolete().to_vec() {
            match delete_ledger(&self.backend.storage, old).await {
                Ok(()) => self.log.deleted(old),
                // Still listed in the record: the next load deletes it.
                Err(error) => {
                    tracing::warn!(key = %self.key, ledger = old, %error, "old cursor ledger not deleted")
                }
            }
        }
        Ok(())
    }

    /// Topic unload, after the last persist: closes the current ledger in storage, so the next
    /// load reads its length instead of recovering it (on storage nodes: fencing reads and
    /// writes on every node of its ensemble), and refuses persists from then on. The record is
    /// unchanged: the next owner still fences and reads the ledger it names, then rolls over.
    pub async fn close(&mut self) -> Result<(), BrokerError> {
        if self.deleted || self.closed {
            return Ok(());
        }
        self.closed = true;
        if self.fence.is_fenced() {
            return Err(self.fence.error());
        }
        if let Some(ledger) = self.log.current_ledger() {
            self.backend.storage.close(ledger).await?;
        }
        Ok(())
    }

    /// Unsubscribe: deletes the cursor's ledgers, then its record (by compare-and-set: a
    /// record another owner wrote fences this one instead). A crash in between leaves a record
    /// naming a deleted ledger, which loads from its snapshot (the subscription is back, and
    /// may be deleted again); no ledger is left behind.
    pub async fn delete(&mut self) -> Result<(), BrokerError> {
        if self.deleted {
            return Ok(());
        }
        if self.fence.is_fenced() {
            return Err(self.fence.error());
        }
        self.deleted = true;
        for ledger in self.log.ledgers() {
            delete_ledger(&self.backend.storage, ledger).await?;
        }
        let expected = self.log.version().map_or(ExpectedVersion::Any, ExpectedVersion::Exactly);
        self.log.forget();
        match self.metadata.delete(&self.key, expected).await {
            Ok(()) | Err(MetadataError::NotFound { .. }) => Ok(()),
            Err(MetadataError::BadVersion { .. }) => Err(self.fence.fence(&self.key)),
            Err(error) => Err(error.into()),
        }
    }
}

#[cfg(test)]
mod tests;
