//! Cursor ledgers: the pure decisions ([`CursorLog`], [`loaded_state`]) and the driver against
//! in-memory ledgers and metadata, with injected failures and crashes between rollover steps.

use super::*;
use crate::cursor::{LedgerList, MAX_INLINE_STATE_BYTES};
use magnetar_ledger::hooked::{Hooked, StorageHooks};
use magnetar_ledger::{AppendCallback, MemoryLedgers};
use magnetar_metadata::{CountingStore, MemoryStore};
use parking_lot::Mutex;

const KEY: &str = "/cursors/persistent/t/n/x/sub";
const TOPIC_LEDGER: u64 = 3;

fn limits(max_entries: u64) -> CursorLedgerLimits {
    CursorLedgerLimits { max_entries, max_bytes: 64 << 20 }
}

fn layout() -> LedgerList {
    let mut ledgers = LedgerList::new();
    ledgers.set_entry_count(TOPIC_LEDGER, 1_000_000);
    ledgers
}

fn at(entry: u64) -> Position {
    Position::new(TOPIC_LEDGER, entry)
}

/// A state with many holes (too big to inline) and partially acknowledged batches; `step`
/// varies it.
fn holes_and_batches(step: u64) -> AckState {
    let ledgers = layout();
    let mut state = AckState::new(Some(at(step)));
    for entry in (step + 10..step + 50_000).step_by(37) {
        state.ack_individual(at(entry), &ledgers).unwrap();
    }
    state.ack_batch_indexes(at(step + 60_001), 100, &[0, 1, 2, 99], &ledgers).unwrap();
    state.ack_batch_indexes(at(step + 60_005), 10, &[5], &ledgers).unwrap();
    assert!(state.encode().len() > MAX_INLINE_STATE_BYTES, "{}", state.encode().len());
    state
}

/// Appends to one chosen ledger fail (an injected storage failure).
#[derive(Default)]
struct FailAppendsTo(Mutex<Option<u64>>);

impl StorageHooks for FailAppendsTo {
    fn on_append(
        &self,
        ledger: u64,
        done: AppendCallback,
    ) -> Result<Option<AppendCallback>, LedgerError> {
        if *self.0.lock() == Some(ledger) {
            done(Err(LedgerError::Unsupported("injected append failure".into())));
            return Ok(None);
        }
        Ok(Some(done))
    }
}

/// One storage and one metadata store shared by every "broker" of a test.
struct Env {
    storage: Arc<Hooked<FailAppendsTo>>,
    counting: Arc<CountingStore>,
    metadata: Arc<dyn MetadataStore>,
    backend: LedgerBackend,
}

impl Env {
    fn new() -> Env {
        let storage = Hooked::new(MemoryLedgers::new(), FailAppendsTo::default());
        let counting = Arc::new(CountingStore::new(Arc::new(MemoryStore::new())));
        let metadata: Arc<dyn MetadataStore> = counting.clone();
        let backend = LedgerBackend::new(storage.clone(), metadata.clone());
        Env { storage, counting, metadata, backend }
    }

    /// A cursor as a broker that just created the subscription (`loaded: None`) or loaded it.
    fn cursor(
        &self,
        loaded: Option<&LoadedCursor>,
        max_entries: u64,
    ) -> (CursorLedger, Arc<Fence>) {
        let fence = Fence::new("t".into());
        let cursor = CursorLedger::new(
            self.backend.clone(),
            self.metadata.clone(),
            fence.clone(),
            KEY.into(),
            "persistent://t/n/x",
            "sub",
            limits(max_entries),
            loaded.map(|l| l.version),
            loaded.map(|l| l.obsolete.clone()).unwrap_or_default(),
        );
        (cursor, fence)
    }

    /// Loads the stored cursor as a new owner would (fencing its ledger).
    async fn load(&self) -> LoadedCursor {
        let found = self.metadata.get(KEY).await.unwrap().expect("a stored cursor");
        load(&self.backend.storage, &found).await.unwrap()
    }

    fn exists(&self, ledger: u64) -> bool {
        match self.storage.info(ledger) {
            Ok(_) => true,
            Err(LedgerError::NoSuchLedger(_)) => false,
            Err(error) => panic!("{error}"),
        }
    }

    async fn record(&self) -> CursorRecord {
        let found = self.metadata.get(KEY).await.unwrap().expect("a record");
        CursorRecord::decode(&found.value).unwrap()
    }
}

async fn persist(cursor: &mut CursorLedger, state: &AckState) -> Result<(), BrokerError> {
    cursor.persist(state.encode().into(), state.mark_delete()).await
}

fn same(a: &AckState, b: &AckState) {
    assert_eq!(a.encode(), b.encode(), "states differ");
}

// --- The pure decisions ---

#[test]
fn the_log_appends_until_a_limit_then_rolls_over() {
    let mut log =
        CursorLog::new(CursorLedgerLimits { max_entries: 3, max_bytes: 100 }, None, vec![]);
    assert_eq!(log.step(), Step::Roll, "a new cursor starts a ledger");
    let record = log.roll_record(10, None, b"x");
    assert!(record.obsolete.is_empty());
    log.rolled(10, 5, 1);
    assert_eq!(log.step(), Step::Append { ledger: 10, entry: 1 });
    log.appended(10, 5);
    assert_eq!(log.step(), Step::Append { ledger: 10, entry: 2 });
    log.appended(10, 5);
    assert_eq!(log.step(), Step::Roll, "3 entries: full");
    let record = log.roll_record(11, Some(at(1)), b"y");
    assert_eq!((record.ledger, record.obsolete.clone()), (11, vec![10]));
    log.rolled(11, 5, 2);
    assert_eq!(log.obsolete(), &[10]);
    log.deleted(10);
    assert!(log.obsolete().is_empty());
    assert_eq!(log.version(), Some(2));
    // By bytes: one 100-byte entry fills it.
    log.appended(11, 95);
    assert_eq!(log.step(), Step::Roll);
}

#[test]
fn an_untrusted_ledger_is_rolled_away_from_and_listed_for_deletion() {
    let mut log = CursorLog::new(limits(1_000), Some(4), vec![7]);
    log.rolled(10, 1, 5);
    assert_eq!(log.obsolete(), &[7], "what a load left is still to delete");
    log.abandon_current();
    assert_eq!(log.step(), Step::Roll);
    log.abandon(11);
    let record = log.roll_record(12, None, b"z");
    assert_eq!(record.obsolete, vec![7, 10, 11]);
    assert_eq!(log.ledgers(), vec![7, 10, 11]);
    // The record names at most MAX_OBSOLETE_LEDGERS (the newest).
    for id in 100..140 {
        log.abandon(id);
    }
    let record = log.roll_record(200, None, b"z");
    assert_eq!(record.obsolete.len(), MAX_OBSOLETE_LEDGERS);
    assert_eq!(record.obsolete.last(), Some(&139));
    assert!(record.encode().len() <= crate::cursor::MAX_RECORD_BYTES);
}

#[test]
fn a_load_takes_the_ledger_then_the_inline_snapshot_then_the_mark_delete() {
    let big = holes_and_batches(5);
    let small = AckState::new(Some(at(40)));
    let with_inline = CursorRecord::new(9, vec![], small.mark_delete(), &small.encode());
    let without = CursorRecord::new(9, vec![], big.mark_delete(), &big.encode());

    let (state, source) = loaded_state(&without, LedgerTail::Entry(big.encode().into()));
    assert_eq!(source, LoadSource::Ledger);
    same(&state, &big);

    let (state, source) = loaded_state(&with_inline, LedgerTail::Empty);
    assert_eq!(source, LoadSource::Snapshot);
    same(&state, &small);

    let (state, source) = loaded_state(&without, LedgerTail::Gone);
    assert_eq!(source, LoadSource::Snapshot);
    same(&state, &AckState::new(big.mark_delete()));

    let garbage = LedgerTail::Entry(Bytes::from_static(b"MCAS not really"));
    let (state, source) = loaded_state(&with_inline, garbage);
    assert_eq!(source, LoadSource::Snapshot);
    same(&state, &small);
}

// --- The driver ---

#[tokio::test]
async fn a_state_with_holes_and_batches_survives_a_restart() {
    let env = Env::new();
    let (mut cursor, _) = env.cursor(None, 1_000);
    for step in 0..5 {
        persist(&mut cursor, &holes_and_batches(step)).await.unwrap();
    }
    let first_ledger = cursor.log().current_ledger().unwrap();
    let record = env.record().await;
    assert_eq!(record.ledger, first_ledger);
    assert!(record.inline_state.is_none(), "a big state is not inlined");

    let loaded = env.load().await;
    assert_eq!(loaded.source, LoadSource::Ledger);
    same(&loaded.ack, &holes_and_batches(4));
    assert_eq!(loaded.obsolete, vec![first_ledger]);

    // The new owner moves to its own ledger and deletes the loaded one.
    let (mut owner, _) = env.cursor(Some(&loaded), 1_000);
    persist(&mut owner, &loaded.ack).await.unwrap();
    let second_ledger = owner.log().current_ledger().unwrap();
    assert_ne!(second_ledger, first_ledger);
    assert!(!env.exists(first_ledger), "the loaded ledger is deleted");
    assert!(env.record().await.obsolete.contains(&first_ledger));
    same(&env.load().await.ack, &holes_and_batches(4));
}

#[tokio::test]
async fn rolls_over_after_n_entries_keeping_the_state_and_deleting_old_ledgers() {
    let env = Env::new();
    let (mut cursor, _) = env.cursor(None, 3);
    let mut seen = Vec::new();
    // (The id allocator's block write happens once, up front.)
    env.backend.ids.next().await.unwrap();
    let writes_before = env.counting.writes();
    for step in 0..10 {
        persist(&mut cursor, &holes_and_batches(step)).await.unwrap();
        let current = cursor.log().current_ledger().unwrap();
        if seen.last() != Some(&current) {
            seen.push(current);
        }
    }
    // Entries 0-2, 3-5, 6-8, 9: four ledgers, one record write each.
    assert_eq!(seen.len(), 4, "{seen:?}");
    assert_eq!(env.counting.writes() - writes_before, 4);
    let (current, old) = seen.split_last().unwrap();
    assert!(env.exists(*current));
    assert!(old.iter().all(|&id| !env.exists(id)), "old ledgers are deleted");
    assert!(cursor.log().obsolete().is_empty());
    same(&env.load().await.ack, &holes_and_batches(9));
}

#[tokio::test]
async fn a_crash_after_the_rollover_append_keeps_the_previous_record() {
    let env = Env::new();
    let (mut cursor, _) = env.cursor(None, 2);
    persist(&mut cursor, &holes_and_batches(1)).await.unwrap();
    persist(&mut cursor, &holes_and_batches(2)).await.unwrap();
    let old = cursor.log().current_ledger().unwrap();
    cursor.crash_at = Some(CrashPoint::AfterAppend);
    // The third persist rolls over and "crashes" before the CAS: it never completed, so no
    // receipt covers state 3.
    assert!(persist(&mut cursor, &holes_and_batches(3)).await.is_err());
    drop(cursor);
    assert_eq!(env.record().await.ledger, old, "the record still names the old ledger");
    let loaded = env.load().await;
    assert_eq!(loaded.source, LoadSource::Ledger);
    same(&loaded.ack, &holes_and_batches(2));
    let (mut owner, _) = env.cursor(Some(&loaded), 2);
    persist(&mut owner, &loaded.ack).await.unwrap();
    assert!(!env.exists(old));
    same(&env.load().await.ack, &holes_and_batches(2));
}

#[tokio::test]
async fn a_crash_after_the_rollover_cas_loads_the_new_state_and_deletes_the_old_ledger() {
    let env = Env::new();
    let (mut cursor, _) = env.cursor(None, 2);
    persist(&mut cursor, &holes_and_batches(1)).await.unwrap();
    persist(&mut cursor, &holes_and_batches(2)).await.unwrap();
    let old = cursor.log().current_ledger().unwrap();
    cursor.crash_at = Some(CrashPoint::AfterCas);
    assert!(persist(&mut cursor, &holes_and_batches(3)).await.is_err());
    drop(cursor);
    assert!(env.exists(old), "the crash left the old ledger");
    let record = env.record().await;
    assert_ne!(record.ledger, old);
    assert_eq!(record.obsolete, vec![old], "the record lists it for deletion");
    let loaded = env.load().await;
    same(&loaded.ack, &holes_and_batches(3));
    assert!(loaded.obsolete.contains(&old));
    let (mut owner, _) = env.cursor(Some(&loaded), 2);
    persist(&mut owner, &loaded.ack).await.unwrap();
    assert!(!env.exists(old), "the next owner deletes the orphan");
    assert!(!env.exists(record.ledger), "and the ledger it loaded from");
}

#[tokio::test]
async fn a_second_owner_loading_the_cursor_fences_the_first() {
    let env = Env::new();
    let (mut first, first_fence) = env.cursor(None, 1_000);
    persist(&mut first, &holes_and_batches(1)).await.unwrap();
    persist(&mut first, &holes_and_batches(2)).await.unwrap();

    let loaded = env.load().await;
    same(&loaded.ack, &holes_and_batches(2));
    // The first owner's next append hits the fenced ledger: it is fenced, not rolled over.
    let lost = persist(&mut first, &holes_and_batches(3)).await;
    assert!(matches!(lost, Err(BrokerError::Fenced(_))), "{lost:?}");
    assert!(first_fence.is_fenced());

    let (mut second, second_fence) = env.cursor(Some(&loaded), 1_000);
    persist(&mut second, &holes_and_batches(4)).await.unwrap();
    assert!(!second_fence.is_fenced());
    same(&env.load().await.ack, &holes_and_batches(4));
}

#[tokio::test]
async fn a_lost_record_cas_fences_and_leaves_no_ledger_behind() {
    let env = Env::new();
    let (mut first, _) = env.cursor(None, 1_000);
    persist(&mut first, &holes_and_batches(1)).await.unwrap();
    // Two brokers load the same record; the second to roll over loses the CAS.
    let a = env.load().await;
    let b = env.load().await;
    let (mut winner, _) = env.cursor(Some(&a), 1_000);
    let (mut loser, loser_fence) = env.cursor(Some(&b), 1_000);
    persist(&mut winner, &holes_and_batches(2)).await.unwrap();
    let lost = persist(&mut loser, &holes_and_batches(3)).await;
    assert!(matches!(lost, Err(BrokerError::Fenced(_))), "{lost:?}");
    assert!(loser_fence.is_fenced());
    let winner_ledger = winner.log().current_ledger().unwrap();
    // The loser's new ledger took the next id and was deleted again.
    assert!(!env.exists(winner_ledger + 1));
    same(&env.load().await.ack, &holes_and_batches(2));
}

#[tokio::test]
async fn a_failed_append_rolls_over_to_a_new_ledger() {
    let env = Env::new();
    let (mut cursor, fence) = env.cursor(None, 1_000);
    persist(&mut cursor, &holes_and_batches(1)).await.unwrap();
    let broken = cursor.log().current_ledger().unwrap();
    *env.storage.hooks.0.lock() = Some(broken);
    persist(&mut cursor, &holes_and_batches(2)).await.unwrap();
    assert!(!fence.is_fenced());
    assert_ne!(cursor.log().current_ledger(), Some(broken));
    assert!(!env.exists(broken), "the broken ledger is deleted");
    same(&env.load().await.ack, &holes_and_batches(2));
}

#[tokio::test]
async fn an_old_format_value_loads_and_is_converted() {
    let env = Env::new();
    let old = holes_and_batches(7);
    env.metadata.put(KEY, old.encode().into(), ExpectedVersion::Absent).await.unwrap();
    let loaded = env.load().await;
    assert_eq!(loaded.source, LoadSource::Legacy);
    same(&loaded.ack, &old);
    assert!(loaded.obsolete.is_empty());
    let (mut cursor, _) = env.cursor(Some(&loaded), 1_000);
    persist(&mut cursor, &loaded.ack).await.unwrap();
    let record = env.record().await;
    assert_eq!(Some(record.ledger), cursor.log().current_ledger());
    let reloaded = env.load().await;
    assert_eq!(reloaded.source, LoadSource::Ledger);
    same(&reloaded.ack, &old);
}

#[tokio::test]
async fn an_unreadable_value_is_an_error_not_a_panic() {
    let env = Env::new();
    env.metadata.put(KEY, Bytes::from_static(b"garbage"), ExpectedVersion::Absent).await.unwrap();
    let found = env.metadata.get(KEY).await.unwrap().unwrap();
    let error = load(&env.backend.storage, &found).await.unwrap_err();
    assert!(matches!(error, LoadError::Unreadable(_)), "{error:?}");
    delete_stored(&env.backend.storage, &*env.metadata, KEY).await.unwrap();
    assert!(env.metadata.get(KEY).await.unwrap().is_none());
}

#[tokio::test]
async fn unsubscribing_deletes_every_ledger_and_the_record() {
    let env = Env::new();
    let (mut cursor, _) = env.cursor(None, 2);
    let mut seen = Vec::new();
    for step in 0..5 {
        persist(&mut cursor, &holes_and_batches(step)).await.unwrap();
        seen.extend(cursor.log().current_ledger());
    }
    cursor.delete().await.unwrap();
    assert!(seen.iter().all(|&id| !env.exists(id)), "{seen:?}");
    assert!(env.metadata.get(KEY).await.unwrap().is_none());
    // Nothing is written after an unsubscribe.
    persist(&mut cursor, &holes_and_batches(9)).await.unwrap();
    assert!(env.metadata.get(KEY).await.unwrap().is_none());
}

#[tokio::test]
async fn a_stored_cursor_nobody_holds_is_deleted_with_its_ledgers() {
    let env = Env::new();
    let (mut cursor, _) = env.cursor(None, 1_000);
    persist(&mut cursor, &holes_and_batches(1)).await.unwrap();
    let ledger = cursor.log().current_ledger().unwrap();
    drop(cursor);
    delete_stored(&env.backend.storage, &*env.metadata, KEY).await.unwrap();
    assert!(!env.exists(ledger));
    assert!(env.metadata.get(KEY).await.unwrap().is_none());
}

#[tokio::test]
async fn acks_in_steady_state_write_no_metadata() {
    let env = Env::new();
    let (mut cursor, _) = env.cursor(None, 50_000);
    let ledgers = layout();
    let mut state = AckState::new(None);
    state.ack_individual(at(0), &ledgers).unwrap();
    persist(&mut cursor, &state).await.unwrap();
    let writes = env.counting.writes();
    let appends = env.backend.metrics.cursor_ledger_appends.load(Ordering::Relaxed);
    for entry in 1..2_000 {
        // Every other entry: the holes grow with every batch.
        state.ack_individual(at(entry * 2), &ledgers).unwrap();
        persist(&mut cursor, &state).await.unwrap();
    }
    assert_eq!(env.counting.writes(), writes, "no metadata write per ack batch");
    let appended = env.backend.metrics.cursor_ledger_appends.load(Ordering::Relaxed) - appends;
    assert_eq!(appended, 1_999, "one cursor-ledger append per persist");
    same(&env.load().await.ack, &state);
}

#[tokio::test]
async fn closing_on_unload_closes_the_ledger_in_storage_and_refuses_later_persists() {
    let env = Env::new();
    let (mut cursor, _) = env.cursor(None, 1_000);
    let last = holes_and_batches(2);
    persist(&mut cursor, &holes_and_batches(1)).await.unwrap();
    persist(&mut cursor, &last).await.unwrap();
    let ledger = cursor.log().current_ledger().expect("a cursor ledger");
    assert!(!env.storage.info(ledger).unwrap().closed);

    cursor.close().await.unwrap();
    let info = env.storage.info(ledger).unwrap();
    assert!(info.closed, "{info:?}");
    assert_eq!(info.entries, 2);
    let refused = persist(&mut cursor, &holes_and_batches(3)).await;
    assert!(matches!(refused, Err(BrokerError::ServiceNotReady(_))), "{refused:?}");
    cursor.close().await.unwrap();

    // The next owner loads the last state persisted before the close.
    let loaded = env.load().await;
    assert_eq!(loaded.source, LoadSource::Ledger);
    same(&loaded.ack, &last);
}
