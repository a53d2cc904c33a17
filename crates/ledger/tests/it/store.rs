//! The ledger store's contract: dense durable entries, close/fence/delete, restart from
//! checkpoints and replay, crash safety, and disk space reclaimed after deletes.

use bytes::Bytes;
use magnetar_journal::sim::{Faults, SimStorage};
use magnetar_journal::JournalConfig;
use magnetar_ledger::{LedgerError, LedgerStore, LedgerStoreConfig};
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);

fn config() -> LedgerStoreConfig {
    LedgerStoreConfig {
        journal: JournalConfig {
            segment_size_bytes: 256 << 10,
            max_group_bytes: 64 << 10,
            ..JournalConfig::default()
        },
        write_cache_bytes: 64 << 10,
        ..LedgerStoreConfig::default()
    }
}

fn data(ledger: u64, entry: u64) -> Bytes {
    let len = 10 + ((ledger * 31 + entry * 17) % 2000) as usize;
    Bytes::from((0..len).map(|i| (i as u64 + ledger * 7 + entry) as u8).collect::<Vec<u8>>())
}

async fn timed<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, future).await.expect("bounded wait")
}

fn open(storage: &SimStorage) -> LedgerStore {
    LedgerStore::open_with_storage(config(), Arc::new(storage.clone())).expect("open").0
}

#[tokio::test]
async fn entries_are_dense_durable_and_readable() {
    let storage = SimStorage::new(1);
    let store = open(&storage);
    let ledger = timed(store.create_ledger()).await.unwrap();
    let mut pending = Vec::new();
    for entry in 0..500 {
        let append = store.append(ledger, data(ledger, entry)).unwrap();
        assert_eq!(append.entry_id(), entry);
        pending.push(append);
    }
    for (entry, append) in pending.into_iter().enumerate() {
        assert_eq!(timed(append).await.unwrap(), entry as u64);
    }
    assert_eq!(store.ledger_info(ledger).unwrap().entries, 500);
    let all = store.read_range(ledger, 0, 499).unwrap();
    for (entry, bytes) in all.iter().enumerate() {
        assert_eq!(bytes, &data(ledger, entry as u64));
    }
    assert!(matches!(
        store.read_entry(ledger, 500),
        Err(LedgerError::NoSuchEntry { entry: 500, .. })
    ));
    assert!(matches!(store.read_entry(999, 0), Err(LedgerError::NoSuchLedger(999))));

    // The cache-only read: the newest entries are cached (64 KiB budget), the oldest are not,
    // and a range past the end or of an unknown ledger is None, never a disk read.
    let tail = store.read_cached(ledger, 495, 499).expect("the newest entries are cached");
    assert_eq!(tail, (495..500).map(|e| data(ledger, e)).collect::<Vec<_>>());
    assert!(store.read_cached(ledger, 0, 499).is_none(), "500 entries exceed the cache");
    assert!(store.read_cached(ledger, 499, 500).is_none());
    assert!(store.read_cached(999, 0, 0).is_none());
}

#[tokio::test]
async fn a_ledger_that_stopped_appending_gives_the_write_cache_back() {
    let storage = SimStorage::new(7);
    let store = open(&storage);
    let append_kib = |ledger: u64, entries: std::ops::Range<u64>| {
        let pending: Vec<_> = entries
            .map(|e| store.append(ledger, Bytes::from(vec![e as u8; 1024])).unwrap())
            .collect();
        async move {
            for append in pending {
                timed(append).await.unwrap();
            }
        }
    };
    let idle = timed(store.create_ledger()).await.unwrap();
    append_kib(idle, 0..64).await;
    assert!(store.read_cached(idle, 63, 63).is_some());

    // A new ledger keeps its newest entries even while the idle one holds the 64 KiB budget.
    let active = timed(store.create_ledger()).await.unwrap();
    append_kib(active, 0..4).await;
    assert!(store.read_cached(active, 3, 3).is_some(), "the newest entry is cached");

    // Once 64 KiB more were appended, the idle ledger's entries are stale and the
    // maintenance thread's sweep frees them (no append of the idle ledger needed).
    append_kib(active, 4..70).await;
    let swept = async {
        while store.read_cached(idle, 63, 63).is_some() {
            // Polling a background sweep, bounded by `timed`.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    timed(swept).await;
    append_kib(active, 70..100).await;
    assert!(
        store.read_cached(active, 70, 99).is_some(),
        "the active ledger has the budget to itself"
    );
}

#[tokio::test]
async fn close_fence_and_delete_refuse_appends() {
    let storage = SimStorage::new(2);
    let store = open(&storage);
    let a = timed(store.create_ledger()).await.unwrap();
    let b = timed(store.create_ledger()).await.unwrap();
    let c = timed(store.create_ledger()).await.unwrap();
    for ledger in [a, b, c] {
        for entry in 0..3 {
            timed(store.append(ledger, data(ledger, entry)).unwrap()).await.unwrap();
        }
    }
    assert_eq!(timed(store.close_ledger(a)).await.unwrap(), 3);
    assert!(matches!(store.append(a, data(a, 3)), Err(LedgerError::Closed(_))));
    assert_eq!(timed(store.fence_ledger(b)).await.unwrap(), 3);
    assert!(matches!(store.append(b, data(b, 3)), Err(LedgerError::Fenced(_))));
    timed(store.delete_ledger(c)).await.unwrap();
    assert!(matches!(store.append(c, data(c, 3)), Err(LedgerError::NoSuchLedger(_))));
    drop(store);
    let store = open(&storage);
    assert!(store.ledger_info(a).unwrap().closed);
    assert!(store.ledger_info(b).unwrap().fenced);
    assert!(matches!(store.ledger_info(c), Err(LedgerError::NoSuchLedger(_))));
    assert_eq!(store.read_entry(a, 2).unwrap(), data(a, 2));
    let d = timed(store.create_ledger()).await.unwrap();
    assert!(d > c, "ledger ids are never reused");
}

#[tokio::test]
async fn restart_uses_index_files_and_replays_only_the_tail() {
    let storage = SimStorage::new(3);
    let mut expected = BTreeMap::new();
    {
        let store = open(&storage);
        for _ in 0..4 {
            let ledger = timed(store.create_ledger()).await.unwrap();
            for entry in 0..300 {
                timed(store.append(ledger, data(ledger, entry)).unwrap()).await.unwrap();
            }
            expected.insert(ledger, 300u64);
        }
        store.run_maintenance().unwrap();
        assert!(store.stats().checkpoints.load(std::sync::atomic::Ordering::Relaxed) > 0);
    }
    let (store, report) =
        LedgerStore::open_with_storage(config(), Arc::new(storage.clone())).unwrap();
    assert!(report.segments_from_index > 0, "{report:?}");
    assert!(report.checkpoint_covered > 0);
    for (&ledger, &count) in &expected {
        assert_eq!(store.ledger_info(ledger).unwrap().entries, count);
        for entry in 0..count {
            assert_eq!(store.read_entry(ledger, entry).unwrap(), data(ledger, entry));
        }
        // An open ledger continues where it stopped.
        let next = timed(store.append(ledger, data(ledger, count)).unwrap()).await.unwrap();
        assert_eq!(next, count);
    }
}

#[tokio::test]
async fn deleting_ledgers_frees_segments_and_compaction_moves_live_entries() {
    let storage = SimStorage::new(4);
    let store = open(&storage);
    let keep = timed(store.create_ledger()).await.unwrap();
    let mut doomed = Vec::new();
    for round in 0..6u64 {
        let ledger = timed(store.create_ledger()).await.unwrap();
        doomed.push(ledger);
        for entry in 0..200 {
            timed(store.append(ledger, data(ledger, entry)).unwrap()).await.unwrap();
            if entry % 10 == 0 {
                let next = round * 20 + entry / 10;
                timed(store.append(keep, data(keep, next)).unwrap()).await.unwrap();
            }
        }
    }
    store.run_maintenance().unwrap();
    let used_before = storage.used_bytes();
    for ledger in &doomed {
        timed(store.delete_ledger(*ledger)).await.unwrap();
    }
    store.run_maintenance().unwrap();
    let used_after = storage.used_bytes();
    let freed = store.stats().segments_freed.load(std::sync::atomic::Ordering::Relaxed);
    assert!(freed > 0, "no segment freed");
    assert!(used_after < used_before, "disk usage {used_before} -> {used_after}");
    assert!(store.stats().entries_relocated.load(std::sync::atomic::Ordering::Relaxed) > 0);
    let kept = store.ledger_info(keep).unwrap().entries;
    assert_eq!(kept, 120);
    for entry in 0..kept {
        assert_eq!(store.read_entry(keep, entry).unwrap(), data(keep, entry));
    }
    drop(store);
    let store = open(&storage);
    for entry in 0..kept {
        assert_eq!(store.read_entry(keep, entry).unwrap(), data(keep, entry), "after restart");
    }
}

#[tokio::test]
async fn an_append_failure_fails_every_later_append_of_that_ledger() {
    let storage = SimStorage::new(5);
    let store = open(&storage);
    let ledger = timed(store.create_ledger()).await.unwrap();
    timed(store.append(ledger, data(ledger, 0)).unwrap()).await.unwrap();
    storage.set_faults(Faults { fail_sync: true, ..Faults::default() });
    let failed = timed(store.append(ledger, data(ledger, 1)).unwrap()).await;
    assert!(failed.is_err());
    storage.set_faults(Faults::default());
    assert!(store.append(ledger, data(ledger, 2)).is_err(), "no append after a hole");
    assert_eq!(store.ledger_info(ledger).unwrap().entries, 1);
}

/// Random crashes under concurrent appends, closes, deletes and maintenance, many seeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashes_never_lose_acknowledged_entries_or_leave_holes() {
    let base_seed = rand::random::<u64>();
    println!("base seed {base_seed}");
    for round in 0..12u64 {
        let seed = base_seed.wrapping_add(round);
        let storage = SimStorage::new(seed);
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        // ledger -> acknowledged count; deleted ledgers are removed.
        let acked: Arc<Mutex<BTreeMap<u64, u64>>> = Arc::default();
        for _life in 0..4 {
            storage.restart();
            let store = Arc::new(open(&storage));
            for (&ledger, &count) in acked.lock().iter() {
                let info = store.ledger_info(ledger).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
                assert!(info.entries >= count, "seed {seed}: ledger {ledger} lost entries");
                for entry in 0..info.entries {
                    assert_eq!(store.read_entry(ledger, entry).unwrap(), data(ledger, entry));
                }
            }
            let mut tasks = Vec::new();
            for _ in 0..3 {
                let store = store.clone();
                let acked = acked.clone();
                let appends = rng.gen_range(1..300);
                tasks.push(tokio::spawn(async move {
                    let Ok(ledger) = store.create_ledger().await else {
                        return;
                    };
                    acked.lock().insert(ledger, 0);
                    for entry in 0..appends {
                        let Ok(append) = store.append(ledger, data(ledger, entry)) else {
                            return;
                        };
                        if append.await.is_err() {
                            return;
                        }
                        let mut acked = acked.lock();
                        let count = acked.get_mut(&ledger).expect("ours");
                        assert_eq!(*count, entry, "acks arrive in entry order");
                        *count = entry + 1;
                    }
                    if store.delete_ledger(ledger).await.is_ok() {
                        acked.lock().remove(&ledger);
                    }
                }));
            }
            let crash_after = Duration::from_micros(rng.gen_range(100..30_000));
            tokio::time::sleep(crash_after).await;
            storage.crash();
            for task in tasks {
                timed(task).await.unwrap();
            }
            let store = Arc::try_unwrap(store).ok().expect("tasks finished");
            tokio::task::spawn_blocking(move || drop(store)).await.unwrap();
        }
    }
}

fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum()
}

/// On a real file system: deleting ledgers frees journal segments and the directory shrinks.
#[tokio::test]
async fn deleting_ledgers_shrinks_the_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let config = LedgerStoreConfig { dir: dir.path().to_path_buf(), ..config() };
    let (store, _) = LedgerStore::open(config).unwrap();
    let mut ledgers = Vec::new();
    for _ in 0..4 {
        let ledger = timed(store.create_ledger()).await.unwrap();
        for entry in 0..300 {
            timed(store.append(ledger, data(ledger, entry)).unwrap()).await.unwrap();
        }
        ledgers.push(ledger);
    }
    store.run_maintenance().unwrap();
    let before = dir_bytes(dir.path());
    for ledger in &ledgers[..3] {
        timed(store.delete_ledger(*ledger)).await.unwrap();
    }
    store.run_maintenance().unwrap();
    let after = dir_bytes(dir.path());
    println!("data directory: {before} bytes before deleting 3 of 4 ledgers, {after} after");
    assert!(
        after * 2 < before,
        "deleting 3 of 4 ledgers should free most space: {before} -> {after}"
    );
    let kept = ledgers[3];
    for entry in 0..300 {
        assert_eq!(store.read_entry(kept, entry).unwrap(), data(kept, entry));
    }
}

/// Compaction reads live entries from disk to move them; it must not hold a lock the append
/// completion path takes while it does, or every append of the store waits for the disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_does_not_hold_up_appends() {
    const READ_DELAY: Duration = Duration::from_millis(200);
    let storage = SimStorage::new(9);
    let store = Arc::new(open(&storage));
    let keep = timed(store.create_ledger()).await.unwrap();
    let mut doomed = Vec::new();
    let mut kept = 0;
    for _ in 0..2 {
        let ledger = timed(store.create_ledger()).await.unwrap();
        doomed.push(ledger);
        for entry in 0..150 {
            timed(store.append(ledger, data(ledger, entry)).unwrap()).await.unwrap();
            if entry % 10 == 0 {
                timed(store.append(keep, data(keep, kept)).unwrap()).await.unwrap();
                kept += 1;
            }
        }
    }
    store.run_maintenance().unwrap();
    for ledger in &doomed {
        timed(store.delete_ledger(*ledger)).await.unwrap();
    }
    storage.set_faults(Faults { read_delay: Some(READ_DELAY), ..Faults::default() });
    let compacting = {
        let store = store.clone();
        tokio::task::spawn_blocking(move || store.run_maintenance())
    };
    // Append to the ledger whose entries are being moved until compaction is done.
    let mut slowest = Duration::ZERO;
    let mut appends = 0;
    let deadline = tokio::time::Instant::now() + WAIT;
    while !compacting.is_finished() && tokio::time::Instant::now() < deadline {
        let started = tokio::time::Instant::now();
        timed(store.append(keep, data(keep, kept)).unwrap()).await.unwrap();
        slowest = slowest.max(started.elapsed());
        kept += 1;
        appends += 1;
        // A steady trickle, not a flood: the point is latency, and 2 cores are shared.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    timed(compacting).await.unwrap().unwrap();
    storage.set_faults(Faults::default());
    let relocated = store.stats().entries_relocated.load(std::sync::atomic::Ordering::Relaxed);
    assert!(relocated > 0, "compaction moved nothing: the test measured nothing");
    assert!(appends > 0);
    assert!(
        slowest < READ_DELAY * 3 / 4,
        "an append took {slowest:?} while compaction read the disk ({READ_DELAY:?} a read)"
    );
    for entry in 0..kept {
        assert_eq!(store.read_entry(keep, entry).unwrap(), data(keep, entry));
    }
}

#[tokio::test]
async fn compaction_reads_the_live_entries_not_the_whole_segment() {
    // Segments of 4 MiB, entries of ~48 KiB: a kept ledger with ~1 MiB in each segment (more
    // than compaction keeps staged at once) and a doomed one with the rest.
    let config = LedgerStoreConfig {
        journal: JournalConfig {
            segment_size_bytes: 4 << 20,
            max_group_bytes: 256 << 10,
            ..JournalConfig::default()
        },
        write_cache_bytes: 64 << 10,
        ..LedgerStoreConfig::default()
    };
    let big = |ledger: u64, entry: u64| -> Bytes {
        Bytes::from(vec![(ledger * 13 + entry) as u8; 48 << 10])
    };
    let storage = SimStorage::new(11);
    let open_big = || {
        LedgerStore::open_with_storage(config.clone(), Arc::new(storage.clone())).expect("open").0
    };
    let store = open_big();
    let keep = timed(store.create_ledger()).await.unwrap();
    let doomed = timed(store.create_ledger()).await.unwrap();
    let mut kept = 0;
    for entry in 0..400 {
        timed(store.append(doomed, big(doomed, entry)).unwrap()).await.unwrap();
        if entry % 4 == 0 {
            timed(store.append(keep, big(keep, kept)).unwrap()).await.unwrap();
            kept += 1;
        }
    }
    store.run_maintenance().unwrap();
    timed(store.delete_ledger(doomed)).await.unwrap();
    let read_before = storage.segment_bytes_read();
    store.run_maintenance().unwrap();
    let read = storage.segment_bytes_read() - read_before;
    let relocated = store.stats().bytes_relocated.load(std::sync::atomic::Ordering::Relaxed);
    assert!(relocated > 2 << 20, "compaction moved {relocated} bytes: the test measured nothing");
    // The live entries (plus block rounding), not the segments they were in (~4x as much).
    assert!(read < relocated * 3 / 2, "read {read} bytes to move {relocated}");
    for entry in 0..kept {
        assert_eq!(store.read_entry(keep, entry).unwrap(), big(keep, entry));
    }
    drop(store);
    let store = open_big();
    for entry in 0..kept {
        assert_eq!(store.read_entry(keep, entry).unwrap(), big(keep, entry), "after restart");
    }
}

/// A directory is one store's while it is open: a second open (another process, or a node
/// started by hand while the old one runs) is refused with `InUse` before it touches the
/// journal, and the directory is free again once the first store is closed and dropped.
#[tokio::test]
async fn a_directory_open_by_one_store_is_refused_to_another() {
    let dir = tempfile::tempdir().unwrap();
    let config = LedgerStoreConfig { dir: dir.path().to_path_buf(), ..config() };
    let (store, _) = LedgerStore::open(config.clone()).unwrap();
    let ledger = timed(store.create_ledger()).await.unwrap();
    timed(store.append(ledger, data(ledger, 0)).unwrap()).await.unwrap();
    let segments = |dir: &std::path::Path| {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    // The journal prepares its spare segment in the background (a temporary file, then a
    // rename): wait until it is there, so that only the refused open could change the listing.
    let settled = |names: &[String]| {
        names.iter().filter(|n| n.ends_with(".journal")).count() >= 2
            && !names.iter().any(|n| n.starts_with("tmp-"))
    };
    for _ in 0..2_000 {
        if settled(&segments(dir.path())) {
            break;
        }
        std::thread::sleep(Duration::from_millis(5)); // polling the directory: no event to wait on
    }
    assert!(
        settled(&segments(dir.path())),
        "no spare segment after 10 s: {:?}",
        segments(dir.path())
    );
    let before = segments(dir.path());
    match LedgerStore::open(config.clone()) {
        Err(LedgerError::InUse { dir: named }) => {
            assert_eq!(named, dir.path().display().to_string());
        }
        other => panic!("a second store on an open directory: {:?}", other.map(|_| ())),
    }
    assert_eq!(segments(dir.path()), before, "the refused open touched nothing");
    assert_eq!(store.read_entry(ledger, 0).unwrap(), data(ledger, 0), "the first still serves");
    tokio::task::spawn_blocking(move || {
        store.close();
        drop(store);
    })
    .await
    .unwrap();
    let (reopened, _) = LedgerStore::open(config).unwrap();
    assert_eq!(reopened.read_entry(ledger, 0).unwrap(), data(ledger, 0));
    tokio::task::spawn_blocking(move || reopened.close()).await.unwrap();
}

/// Below `min_free_bytes` a store says it is short of disk, with why, once a measurement saw
/// it (every 100 ms, and at each maintenance run); it refuses nothing itself (a broker refuses
/// new messages: see the managed ledger), so appends of cursor ledgers and deletes go on.
/// Without a minimum it never says so.
#[tokio::test]
async fn a_store_short_of_disk_says_why_and_still_appends_and_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let short = LedgerStoreConfig {
        dir: dir.path().join("short"),
        min_free_bytes: 1 << 60, // more than any disk has
        ..config()
    };
    let (store, _) = LedgerStore::open(short).unwrap();
    store.run_maintenance().unwrap();
    let why = store.short_of_disk().expect("short of disk");
    assert!(why.contains("MiB free") && why.contains("below the"), "{why}");
    let ledger = timed(store.create_ledger()).await.unwrap();
    timed(store.append(ledger, data(ledger, 0)).unwrap()).await.unwrap();
    timed(store.delete_ledger(ledger)).await.unwrap();
    tokio::task::spawn_blocking(move || store.close()).await.unwrap();

    let off = LedgerStoreConfig { dir: dir.path().join("off"), ..config() };
    let (store, _) = LedgerStore::open(off).unwrap();
    store.run_maintenance().unwrap();
    assert_eq!(store.short_of_disk(), None);
    tokio::task::spawn_blocking(move || store.close()).await.unwrap();
}

/// Appends an entry to each of `ledgers` in turn until an append fails (or, with
/// `stop_when_short`, until the store says it is short of disk, as a broker stops taking
/// messages); returns the (ledger, entry) pairs acknowledged.
async fn fill_until_full(
    store: &LedgerStore,
    ledgers: &[u64],
    stop_when_short: bool,
) -> std::collections::BTreeSet<(u64, u64)> {
    let mut written = std::collections::BTreeSet::new();
    for entry in 0.. {
        assert!(entry < 100_000, "the disk never filled up");
        if stop_when_short && store.short_of_disk().is_some() {
            break;
        }
        let pending: Vec<_> = ledgers
            .iter()
            .filter_map(|&l| store.append(l, data(l, entry)).ok().map(|p| (l, p)))
            .collect();
        let staged = pending.len();
        let mut acknowledged = 0;
        for (ledger, append) in pending {
            if let Ok(id) = timed(append).await {
                written.insert((ledger, id));
                acknowledged += 1;
            }
        }
        if acknowledged < ledgers.len() || staged < ledgers.len() {
            break;
        }
    }
    written
}

/// Gives the simulated disk room for `room` bytes more than it holds, then creates ten ledgers.
async fn ten_ledgers_with_room_for(
    store: &LedgerStore,
    storage: &SimStorage,
    room: u64,
) -> Vec<u64> {
    storage.set_faults(Faults {
        capacity_bytes: Some(storage.used_bytes() + room),
        ..Faults::default()
    });
    let mut ledgers = Vec::new();
    for _ in 0..10 {
        ledgers.push(timed(store.create_ledger()).await.unwrap());
    }
    ledgers
}

/// Ten ledgers written in turn until the disk is full, so that every segment holds entries of
/// all ten, then nine deleted: the disk comes back only through compaction, which needs a
/// segment to copy the tenth's entries into, and the deletes themselves are journal records.
/// Without a reserve the first delete already fails (`DiskFull`); with one, the store gives it
/// up when the journal meets the full disk and says it is short of disk (a broker refuses new
/// messages then), the deletes and the compaction run in the space it gave, and once they have
/// freed enough the reserve is back and the store takes messages again.
#[tokio::test]
async fn a_full_disk_is_reclaimed_by_deletes_and_compaction_through_the_reserve() {
    let segment = config().journal.segment_size_bytes;
    // Without a reserve: the disk fills and nothing can be deleted.
    let storage = SimStorage::new(11);
    let store = open(&storage);
    let ledgers = ten_ledgers_with_room_for(&store, &storage, 16 * segment).await;
    fill_until_full(&store, &ledgers, false).await;
    let why = store.short_of_disk().expect("a journal out of space is short of disk");
    assert!(why.contains("no space for a new segment"), "{why}");
    let refused = timed(store.delete_ledger(ledgers[0])).await;
    assert!(
        matches!(refused, Err(LedgerError::Journal(magnetar_journal::JournalError::DiskFull(_)))),
        "without a reserve a full journal cannot record a delete: {refused:?}"
    );
    tokio::task::spawn_blocking(move || store.close()).await.unwrap();

    // With one.
    let storage = SimStorage::new(12);
    // Freed segments would all be kept for reuse (servers keep 8), which gives the file system
    // nothing back: while short of disk they are removed instead, or the reserve never returns.
    let mut with_reserve = LedgerStoreConfig { reserve_bytes: 2 * segment, ..config() };
    with_reserve.journal.recycled_segments_kept = 64;
    let store = LedgerStore::open_with_storage(with_reserve, Arc::new(storage.clone())).unwrap().0;
    use magnetar_journal::storage::Storage;
    assert_eq!(storage.reserve_len().unwrap(), Some(2 * segment));
    let ledgers = ten_ledgers_with_room_for(&store, &storage, 16 * segment).await;
    let written = fill_until_full(&store, &ledgers, true).await;
    let why = store.short_of_disk().expect("short of disk once the reserve is given up");
    assert!(why.contains("reserve") && why.contains("filled up"), "{why}");
    assert_eq!(storage.reserve_len().unwrap(), None, "the reserve was given up");
    assert!(written.len() > 1000, "the disk filled with entries: {}", written.len());
    for &ledger in &ledgers[..9] {
        timed(store.delete_ledger(ledger)).await.expect("a delete is recorded in the reserve");
    }
    // The deletes' segments hold the tenth ledger's entries: compaction moves them, then the
    // segments go; the reserve is back once twice its size is free.
    let store = Arc::new(store);
    for _ in 0..5 {
        let maintained = store.clone();
        tokio::task::spawn_blocking(move || maintained.run_maintenance()).await.unwrap().unwrap();
        if store.short_of_disk().is_none() {
            break;
        }
    }
    assert_eq!(store.short_of_disk(), None, "the reserve is back and messages are taken");
    assert_eq!(storage.reserve_len().unwrap(), Some(2 * segment));
    assert!(store.stats().entries_relocated.load(std::sync::atomic::Ordering::Relaxed) > 0);
    let tenth = ledgers[9];
    for &(ledger, entry) in &written {
        if ledger == tenth {
            assert_eq!(store.read_entry(ledger, entry).unwrap(), data(ledger, entry));
        }
    }
    let next = store.ledger_info(tenth).unwrap().entries;
    timed(store.append(tenth, data(tenth, next)).unwrap()).await.expect("appends again");
    tokio::task::spawn_blocking(move || store.close()).await.unwrap();
}
