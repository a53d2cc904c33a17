//! The journal over the fault-injecting simulator: crashes with torn writes, bit flips, short
//! writes, fsync errors, write errors and a full disk. Every test checks the contract: an
//! acknowledged record is never lost, a partial record is never visible.

use magnetar_journal::record::RecordHeader;
use magnetar_journal::sim::{Faults, SimStorage};
use magnetar_journal::{Journal, JournalConfig, JournalError, RecordLocation};
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

fn small_config() -> JournalConfig {
    JournalConfig {
        segment_size_bytes: 256 << 10,
        max_group_bytes: 64 << 10,
        ..JournalConfig::default()
    }
}

fn payload(ledger: u64, entry: u64) -> Vec<u8> {
    let len = ((ledger * 7919 + entry * 104_729) % 3000) as usize;
    (0..len).map(|i| (i as u64 ^ entry ^ (ledger << 3)) as u8).collect()
}

fn header(ledger: u64, entry: u64) -> RecordHeader {
    RecordHeader { kind: 1, ledger_id: ledger, entry_id: entry }
}

/// Appends and waits for the result.
fn append_sync(journal: &Journal, ledger: u64, entry: u64) -> Result<RecordLocation, JournalError> {
    let (tx, rx) = mpsc::channel();
    let location = journal.append(
        header(ledger, entry),
        &payload(ledger, entry),
        Box::new(move |result| {
            let _ = tx.send(result);
        }),
    )?;
    let durable = rx.recv_timeout(WAIT).expect("completion arrives")?;
    assert_eq!(durable, location, "the completion reports the staged location");
    Ok(location)
}

/// Every record of every segment after reopening, keyed by (ledger, entry); later wins.
fn all_records(journal: &Journal) -> BTreeMap<(u64, u64), Vec<u8>> {
    let mut out = BTreeMap::new();
    for seq in journal.segments() {
        journal
            .scan(seq, |h, _, data| {
                out.insert((h.ledger_id, h.entry_id), data.to_vec());
            })
            .expect("scan");
    }
    out
}

#[test]
fn appended_records_read_back_and_groups_share_flushes() {
    let storage = SimStorage::new(1);
    let (journal, report) = Journal::open(small_config(), Arc::new(storage.clone())).unwrap();
    assert!(report.segments.is_empty());
    let journal = Arc::new(journal);
    let threads: Vec<_> = (0..8u64)
        .map(|ledger| {
            let journal = journal.clone();
            std::thread::spawn(move || {
                (0..200u64)
                    .map(|entry| (entry, append_sync(&journal, ledger, entry).unwrap()))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for (ledger, thread) in threads.into_iter().enumerate() {
        for (entry, location) in thread.join().unwrap() {
            let data = journal.read(location, header(ledger as u64, entry)).unwrap();
            assert_eq!(data.as_ref(), payload(ledger as u64, entry).as_slice());
        }
    }
    let groups = journal.stats().groups.load(std::sync::atomic::Ordering::Relaxed);
    assert!(groups < 1600, "8 concurrent appenders should share flushes: {groups} groups");
    assert!(journal.segments().len() > 1, "small segments roll over");
}

#[test]
fn reading_with_a_wrong_identity_or_corrupt_bytes_is_an_error() {
    let storage = SimStorage::new(2);
    let (journal, _) = Journal::open(small_config(), Arc::new(storage.clone())).unwrap();
    let location = append_sync(&journal, 1, 0).unwrap();
    assert!(matches!(journal.read(location, header(1, 1)), Err(JournalError::Corrupt { .. })));
    storage.flip_bit(location.segment, location.offset as usize + 40, 3);
    assert!(matches!(journal.read(location, header(1, 0)), Err(JournalError::Corrupt { .. })));
}

/// Crash at a random moment while 4 threads append (two of them writing their own groups when
/// the journal is idle); reopen; check the contract. Many seeds.
#[test]
fn crash_with_torn_writes_never_loses_an_acknowledged_record() {
    let base_seed = rand::random::<u64>();
    println!("base seed {base_seed}");
    for round in 0..40u64 {
        let seed = base_seed.wrapping_add(round);
        let storage = SimStorage::new(seed);
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let acked: Arc<Mutex<BTreeMap<(u64, u64), ()>>> = Arc::default();
        let mut next_entry: BTreeMap<u64, u64> = BTreeMap::new();
        for life in 0..3 {
            storage.restart();
            let (journal, _) = Journal::open(small_config(), Arc::new(storage.clone())).unwrap();
            let before = all_records(&journal);
            for key in acked.lock().keys() {
                let data = before.get(key).unwrap_or_else(|| panic!("seed {seed}: lost {key:?}"));
                assert_eq!(data, &payload(key.0, key.1), "seed {seed}: record {key:?} changed");
            }
            for ((ledger, entry), data) in &before {
                assert_eq!(data, &payload(*ledger, *entry), "seed {seed}: garbage visible");
            }
            let journal = Arc::new(journal);
            let crash_after = rng.gen_range(1..400u64);
            let (done_tx, done_rx) = mpsc::channel::<()>();
            let count = Arc::new(std::sync::atomic::AtomicU64::new(0));
            let threads: Vec<_> = (0..4u64)
                .map(|t| {
                    let ledger = life * 10 + t;
                    let first = *next_entry.entry(ledger).or_insert(0);
                    let (journal, acked, count, done_tx) =
                        (journal.clone(), acked.clone(), count.clone(), done_tx.clone());
                    std::thread::spawn(move || {
                        for entry in first..first + 10_000 {
                            let acked = acked.clone();
                            let count = count.clone();
                            let done_tx = done_tx.clone();
                            let completion =
                                Box::new(move |result: Result<RecordLocation, JournalError>| {
                                    if result.is_ok() {
                                        acked.lock().insert((ledger, entry), ());
                                        if count.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
                                            + 1
                                            == crash_after
                                        {
                                            let _ = done_tx.send(());
                                        }
                                    }
                                });
                            let data = payload(ledger, entry);
                            // Odd threads stage and commit (writing on their own thread when
                            // the journal is idle), even ones append.
                            let staged = if t % 2 == 1 {
                                let staged =
                                    journal.stage(header(ledger, entry), &data, completion);
                                journal.commit();
                                staged
                            } else {
                                journal.append(header(ledger, entry), &data, completion)
                            };
                            if staged.is_err() {
                                return;
                            }
                        }
                    })
                })
                .collect();
            drop(done_tx);
            let _ = done_rx.recv_timeout(WAIT);
            storage.crash();
            for thread in threads {
                thread.join().unwrap();
            }
            drop(journal);
            next_entry.values_mut().for_each(|e| *e += 10_000);
        }
    }
}

#[test]
fn bit_flip_in_the_last_record_discards_it_and_reports_bytes() {
    let storage = SimStorage::new(3);
    let location = {
        let (journal, _) = Journal::open(small_config(), Arc::new(storage.clone())).unwrap();
        append_sync(&journal, 1, 0).unwrap();
        append_sync(&journal, 1, 1).unwrap()
    };
    storage.flip_bit(location.segment, location.offset as usize + 35, 0);
    let (journal, report) = Journal::open(small_config(), Arc::new(storage.clone())).unwrap();
    assert!(report.discarded_bytes > 0, "{report:?}");
    let records = all_records(&journal);
    assert!(records.contains_key(&(1, 0)));
    assert!(!records.contains_key(&(1, 1)));
    drop(journal);
    let (_, again) = Journal::open(small_config(), Arc::new(storage.clone())).unwrap();
    assert_eq!(again.discarded_bytes, 0, "the torn tail was zeroed the first time");
}

#[test]
fn short_writes_are_completed_and_stay_intact() {
    let storage = SimStorage::new(4);
    storage.set_faults(Faults { short_writes: true, ..Faults::default() });
    {
        let (journal, _) = Journal::open(small_config(), Arc::new(storage.clone())).unwrap();
        for entry in 0..300 {
            append_sync(&journal, 5, entry).unwrap();
        }
    }
    storage.set_faults(Faults::default());
    let (journal, _) = Journal::open(small_config(), Arc::new(storage.clone())).unwrap();
    let records = all_records(&journal);
    for entry in 0..300 {
        assert_eq!(records.get(&(5, entry)), Some(&payload(5, entry)));
    }
}

#[test]
fn fsync_failure_fails_pending_and_later_appends_and_loses_nothing_acknowledged() {
    let storage = SimStorage::new(5);
    {
        let (journal, _) = Journal::open(small_config(), Arc::new(storage.clone())).unwrap();
        for entry in 0..50 {
            append_sync(&journal, 1, entry).unwrap();
        }
        storage.set_faults(Faults { fail_sync: true, ..Faults::default() });
        let error = append_sync(&journal, 1, 50).unwrap_err();
        assert!(matches!(error, JournalError::Failed(_)), "{error}");
        storage.set_faults(Faults::default());
        let later = append_sync(&journal, 1, 51).unwrap_err();
        assert!(matches!(later, JournalError::Failed(_)), "no retry after a failed fsync: {later}");
    }
    let (journal, _) = Journal::open(small_config(), Arc::new(storage.clone())).unwrap();
    let records = all_records(&journal);
    for entry in 0..50 {
        assert_eq!(records.get(&(1, entry)), Some(&payload(1, entry)));
    }
    append_sync(&journal, 1, 50).expect("a restarted journal accepts appends");
}

#[test]
fn write_error_stops_the_journal() {
    let storage = SimStorage::new(6);
    let (journal, _) = Journal::open(small_config(), Arc::new(storage.clone())).unwrap();
    append_sync(&journal, 1, 0).unwrap();
    storage.set_faults(Faults { fail_write: true, ..Faults::default() });
    assert!(matches!(append_sync(&journal, 1, 1), Err(JournalError::Failed(_))));
}

#[test]
fn disk_full_fails_appends_cleanly_and_they_resume_when_space_is_freed() {
    let storage = SimStorage::new(7);
    let config = small_config();
    let (journal, _) = Journal::open(config.clone(), Arc::new(storage.clone())).unwrap();
    append_sync(&journal, 1, 0).unwrap();
    // Room for what exists now (the active segment and the prepared spare), nothing more.
    let used = storage.used_bytes();
    storage.set_faults(Faults { capacity_bytes: Some(used), ..Faults::default() });
    let mut acked = vec![0u64];
    let mut entry = 1;
    let full_error = loop {
        match append_sync(&journal, 1, entry) {
            Ok(_) => acked.push(entry),
            Err(error) => break error,
        }
        entry += 1;
        assert!(entry < 10_000, "the disk never filled up");
    };
    assert!(matches!(full_error, JournalError::DiskFull(_)), "{full_error}");
    assert!(matches!(append_sync(&journal, 2, 0), Err(JournalError::DiskFull(_))));
    storage.set_faults(Faults::default());
    append_sync(&journal, 2, 0).expect("appends resume once space is freed");
    drop(journal);
    let (journal, _) = Journal::open(config, Arc::new(storage.clone())).unwrap();
    let records = all_records(&journal);
    for entry in acked {
        assert_eq!(records.get(&(1, entry)), Some(&payload(1, entry)), "lost entry {entry}");
    }
    assert!(records.contains_key(&(2, 0)));
}

/// A journal whose out-of-space hook frees space (gives up a reserve) goes on without a single
/// failed append: the segment it could not prepare is prepared again at once. Once the hook has
/// nothing left to free, appends fail with `DiskFull` as without one.
#[test]
fn an_out_of_space_hook_that_frees_space_spares_the_appends_their_failure() {
    use magnetar_journal::storage::Storage;
    let storage = SimStorage::new(9);
    let config = small_config();
    let reserve = 2 * config.segment_size_bytes;
    storage.create_reserve(reserve).unwrap();
    let (journal, _) = Journal::open(config, Arc::new(storage.clone())).unwrap();
    append_sync(&journal, 1, 0).unwrap();
    storage.set_faults(Faults { capacity_bytes: Some(storage.used_bytes()), ..Faults::default() });
    let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let hook_storage = storage.clone();
    let hook_asked = asked.clone();
    journal.set_out_of_space_hook(Box::new(move || {
        hook_asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let held = hook_storage.reserve_len().unwrap().is_some();
        hook_storage.remove_reserve().unwrap();
        held
    }));
    let mut entry = 1;
    // Two segments' worth more than the disk had: the reserve's.
    let full_error = loop {
        match append_sync(&journal, 1, entry) {
            Ok(_) => {}
            Err(error) => break error,
        }
        entry += 1;
        assert!(entry < 10_000, "the disk never filled up");
    };
    assert!(matches!(full_error, JournalError::DiskFull(_)), "{full_error}");
    assert_eq!(storage.reserve_len().unwrap(), None, "the reserve was given up");
    // One record per group, each a 4 KiB block, 64 a segment: the active segment and the spare
    // (if the preparer had made it before the disk filled) hold 64-128, the reserve's two
    // segments 128 more (without the hook: DiskFull after 64-128).
    let per_segment = small_config().segment_size_bytes / 4096;
    assert!(
        entry > 2 * per_segment + per_segment / 2,
        "appends went on into the reserve's space ({entry} records before DiskFull)"
    );
    assert!(asked.load(std::sync::atomic::Ordering::SeqCst) >= 2, "asked again once full");
}

#[test]
fn released_segments_are_recycled_and_their_stale_records_stay_invisible() {
    let storage = SimStorage::new(8);
    let config = JournalConfig { recycled_segments_kept: 4, ..small_config() };
    let (journal, _) = Journal::open(config.clone(), Arc::new(storage.clone())).unwrap();
    for entry in 0..400 {
        append_sync(&journal, 1, entry).unwrap();
    }
    let sealed: Vec<u64> = journal.segments().into_iter().rev().skip(1).collect();
    assert!(sealed.len() >= 2);
    for &seq in &sealed {
        journal.release_segments(&[seq]).unwrap();
    }
    for entry in 0..400 {
        append_sync(&journal, 2, entry).unwrap();
    }
    drop(journal);
    let (journal, _) = Journal::open(config, Arc::new(storage.clone())).unwrap();
    let records = all_records(&journal);
    for entry in 0..400 {
        assert_eq!(records.get(&(2, entry)), Some(&payload(2, entry)));
    }
    let ledger_one = records.keys().filter(|k| k.0 == 1).count();
    assert!(ledger_one < 400, "released segments' records must not all come back");
}

#[test]
fn max_wait_gathers_a_larger_group() {
    let storage = SimStorage::new(9);
    let config = JournalConfig { max_wait: Some(Duration::from_millis(50)), ..small_config() };
    let (journal, _) = Journal::open(config, Arc::new(storage.clone())).unwrap();
    append_sync(&journal, 9, 0).unwrap();
    let groups_before = journal.stats().groups.load(std::sync::atomic::Ordering::Relaxed);
    let (tx, rx) = mpsc::channel();
    for entry in 1..=10 {
        let tx = tx.clone();
        journal.append(header(9, entry), b"x", Box::new(move |r| tx.send(r).unwrap())).unwrap();
    }
    for _ in 0..10 {
        rx.recv_timeout(WAIT).unwrap().unwrap();
    }
    let groups = journal.stats().groups.load(std::sync::atomic::Ordering::Relaxed) - groups_before;
    assert_eq!(groups, 1, "ten appends within max_wait share one group");
}

/// Stages one record and commits; returns the completion's receiver.
fn stage_and_commit(
    journal: &Journal,
    ledger: u64,
    entry: u64,
) -> mpsc::Receiver<(Result<RecordLocation, JournalError>, std::thread::ThreadId)> {
    let (tx, rx) = mpsc::channel();
    journal
        .stage(
            header(ledger, entry),
            &payload(ledger, entry),
            Box::new(move |result| {
                let _ = tx.send((result, std::thread::current().id()));
            }),
        )
        .unwrap();
    journal.commit();
    rx
}

#[test]
fn a_committing_caller_writes_a_lone_record_on_its_own_thread() {
    let storage = SimStorage::new(10);
    let (journal, _) = Journal::open(small_config(), Arc::new(storage.clone())).unwrap();
    append_sync(&journal, 1, 0).unwrap(); // the writer thread opens the first segment
    let me = std::thread::current().id();
    let mut here = 0;
    for entry in 1..=200 {
        let rx = stage_and_commit(&journal, 1, entry);
        let (result, thread) = rx.recv_timeout(WAIT).expect("completion arrives");
        result.unwrap();
        if thread == me {
            // Written and completed by `commit` itself, before it returned.
            here += 1;
        }
    }
    // Not every one: the writer thread may still be finishing the previous group's bookkeeping
    // when the next commit looks (it then writes the group), or the completer its callbacks.
    assert!(here > 100, "an idle journal lets the caller write: {here} of 200 written here");
    let syncs = storage.syncs();
    drop(journal);
    let (journal, _) = Journal::open(small_config(), Arc::new(storage.clone())).unwrap();
    let records = all_records(&journal);
    for entry in 0..=200 {
        assert_eq!(records.get(&(1, entry)), Some(&payload(1, entry)), "entry {entry}");
    }
    assert!(syncs >= 200, "one flush per committed record: {syncs}");
}

#[test]
fn staged_and_appended_records_complete_in_order_under_concurrency() {
    let storage = SimStorage::new(11);
    let (journal, _) = Journal::open(small_config(), Arc::new(storage.clone())).unwrap();
    let journal = Arc::new(journal);
    let threads: Vec<_> = (0..6u64)
        .map(|ledger| {
            let journal = journal.clone();
            std::thread::spawn(move || {
                // Each thread keeps up to 8 records in flight: groups of several, some written
                // by the committing threads, some by the writer thread.
                let (tx, rx) = mpsc::channel();
                for entry in 0..600u64 {
                    let tx = tx.clone();
                    let completion =
                        Box::new(move |result: Result<RecordLocation, JournalError>| {
                            tx.send((entry, result.is_ok())).unwrap();
                        });
                    let data = payload(ledger, entry);
                    if ledger % 2 == 0 {
                        journal.stage(header(ledger, entry), &data, completion).unwrap();
                        journal.commit();
                    } else {
                        journal.append(header(ledger, entry), &data, completion).unwrap();
                    }
                    if entry >= 8 {
                        let (done, ok) = rx.recv_timeout(WAIT).expect("completion arrives");
                        assert!(ok);
                        assert_eq!(done, entry - 8, "a thread's records complete in order");
                    }
                }
                for expected in 592..600 {
                    let (done, ok) = rx.recv_timeout(WAIT).expect("completion arrives");
                    assert!(ok);
                    assert_eq!(done, expected);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    drop(journal);
    let (journal, _) = Journal::open(small_config(), Arc::new(storage.clone())).unwrap();
    let records = all_records(&journal);
    for ledger in 0..6 {
        for entry in 0..600 {
            assert_eq!(records.get(&(ledger, entry)), Some(&payload(ledger, entry)));
        }
    }
}

#[test]
fn a_flush_failing_on_the_committing_thread_stops_the_journal_cleanly() {
    let storage = SimStorage::new(12);
    let (journal, _) = Journal::open(small_config(), Arc::new(storage.clone())).unwrap();
    for entry in 0..20 {
        let (result, _) = stage_and_commit(&journal, 1, entry).recv_timeout(WAIT).unwrap();
        result.unwrap();
    }
    storage.set_faults(Faults { fail_sync: true, ..Faults::default() });
    let (result, _) = stage_and_commit(&journal, 1, 20).recv_timeout(WAIT).unwrap();
    assert!(matches!(result, Err(JournalError::Failed(_))), "{result:?}");
    storage.set_faults(Faults::default());
    let later = journal.stage(header(1, 21), b"x", Box::new(|_| {})).unwrap_err();
    assert!(matches!(later, JournalError::Failed(_)), "no retry after a failed flush: {later}");
    assert!(matches!(append_sync(&journal, 1, 21), Err(JournalError::Failed(_))));
    drop(journal); // the writer thread has stopped too: closing joins it
    let (journal, _) = Journal::open(small_config(), Arc::new(storage.clone())).unwrap();
    let records = all_records(&journal);
    for entry in 0..20 {
        assert_eq!(records.get(&(1, entry)), Some(&payload(1, entry)));
    }
}

#[test]
fn an_append_that_joins_a_staged_group_does_not_wait_for_its_commit() {
    let storage = SimStorage::new(13);
    let (journal, _) = Journal::open(small_config(), Arc::new(storage.clone())).unwrap();
    append_sync(&journal, 1, 0).unwrap();
    let (staged_tx, staged_rx) = mpsc::channel();
    journal
        .stage(header(1, 1), b"staged", Box::new(move |result| drop(staged_tx.send(result))))
        .unwrap();
    // No commit: a storage node awaits a ledger's creation (a plain append) between staging
    // and committing. The append joins the staged group and must still be written.
    append_sync(&journal, 2, 0).expect("the append completes without the stager's commit");
    staged_rx.recv_timeout(WAIT).expect("the staged record went with it").unwrap();
}

#[test]
fn the_last_segment_can_be_released_once_the_journal_is_closed() {
    let storage = SimStorage::new(14);
    let (journal, _) = Journal::open(small_config(), Arc::new(storage.clone())).unwrap();
    let location = append_sync(&journal, 1, 0).unwrap();
    journal.close();
    // The writer reports its last segment sealed when it ends; a ledger store that finds it
    // holds only deleted ledgers frees it then (this asserted "not sealed" before).
    journal.release_segments(&[location.segment]).unwrap();
}

/// A reader that raced compaction (its location looked up before the segment was released)
/// is told the segment is gone, which the ledger store answers by looking the entry up again,
/// not an I/O error (a consumer's read failed with "read segment 21: NotFound" this way).
#[test]
fn a_read_of_a_released_segment_says_released_not_an_io_error() {
    let storage = SimStorage::new(15);
    let (journal, _) = Journal::open(small_config(), Arc::new(storage.clone())).unwrap();
    let location = append_sync(&journal, 1, 0).unwrap();
    assert!(journal.read(location, header(1, 0)).is_ok());
    journal.close();
    journal.release_segments(&[location.segment]).unwrap();
    let read = journal.read(location, header(1, 0));
    assert!(
        matches!(read, Err(JournalError::Released { segment }) if segment == location.segment),
        "{read:?}"
    );
}

/// The last owner of a journal may let it go inside a completion, which runs on one of the
/// journal's own threads (the writer, for a lone group, or the completer): closing it there
/// must neither panic (a thread joining itself) nor hang (the writer waiting for the completer,
/// which waits for the writer).
#[test]
fn a_journal_dropped_inside_its_own_completion_closes_without_panic_or_hang() {
    for seed in 0..20 {
        let storage = SimStorage::new(100 + seed);
        let (journal, _) = Journal::open(small_config(), Arc::new(storage.clone())).unwrap();
        let journal = Arc::new(Mutex::new(Some(journal)));
        let (tx, rx) = mpsc::channel();
        let owner = journal.clone();
        let staging = journal.lock();
        let staged = staging.as_ref().unwrap();
        // Some appends before the one that drops it, so that either thread may complete it.
        for entry in 0..seed {
            staged.append(header(1, entry), &payload(1, entry), Box::new(|_| {})).unwrap();
        }
        staged
            .append(
                header(1, seed),
                &payload(1, seed),
                Box::new(move |result| {
                    let last = owner.lock().take();
                    drop(last);
                    let _ = tx.send(result.is_ok());
                }),
            )
            .unwrap();
        drop(staging);
        let durable = rx.recv_timeout(WAIT).expect("the completion that closed it returned");
        assert!(durable, "seed {seed}: the append itself succeeded");
    }
}
