//! The journal on a real file system: records written (small groups through the page cache,
//! large ones `O_DIRECT`) read back through the aligned, pooled read path, one by one and
//! coalesced, also after reopening.

use magnetar_journal::record::RecordHeader;
use magnetar_journal::storage::FsStorage;
use magnetar_journal::{Journal, JournalConfig, RecordLocation};
use std::sync::{mpsc, Arc};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

fn payload(entry: u64) -> Vec<u8> {
    // Sizes from 0 to ~70 KiB, so records start at every alignment and some span blocks.
    let len = ((entry * 104_729) % 70_000) as usize;
    (0..len).map(|i| (i as u64 ^ entry.wrapping_mul(31)) as u8).collect()
}

fn header(entry: u64) -> RecordHeader {
    RecordHeader { kind: 1, ledger_id: 9, entry_id: entry }
}

fn open(dir: &std::path::Path) -> Journal {
    let config = JournalConfig {
        segment_size_bytes: 4 << 20,
        max_group_bytes: 1 << 20,
        ..JournalConfig::default()
    };
    let storage = Arc::new(FsStorage::open(dir).unwrap());
    Journal::open(config, storage).unwrap().0
}

#[test]
fn records_read_back_through_the_aligned_read_path() {
    let dir = tempfile::tempdir().unwrap();
    let journal = open(dir.path());
    let (done, completions) = mpsc::channel();
    let mut locations: Vec<RecordLocation> = Vec::new();
    for entry in 0..200u64 {
        let done = done.clone();
        let callback = Box::new(move |result| {
            let _ = done.send(result);
        });
        locations.push(journal.append(header(entry), &payload(entry), callback).unwrap());
    }
    for _ in 0..200 {
        completions.recv_timeout(WAIT).expect("completion arrives").expect("durable");
    }
    let check = |journal: &Journal| {
        for (entry, location) in locations.iter().enumerate().step_by(7) {
            let read = journal.read(*location, header(entry as u64)).unwrap();
            assert_eq!(read, payload(entry as u64), "entry {entry}");
        }
        let requests: Vec<_> =
            locations.iter().enumerate().map(|(e, l)| (*l, header(e as u64))).collect();
        let read = journal.read_many(&requests).unwrap();
        assert_eq!(read.len(), 200);
        for (entry, data) in read.iter().enumerate() {
            assert_eq!(data, &payload(entry as u64), "entry {entry}");
        }
        // A wrong identity is refused, never handed out.
        assert!(journal.read(locations[3], header(4)).is_err());
    };
    check(&journal);
    journal.close();
    drop(journal);
    check(&open(dir.path()));
}
