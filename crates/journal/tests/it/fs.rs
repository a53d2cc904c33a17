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

/// Appends the records of `entries` (with the payload `data` gives each) and waits until
/// every one is durable; returns their locations.
fn append_durably(
    journal: &Journal,
    entries: std::ops::Range<u64>,
    data: impl Fn(u64) -> Vec<u8>,
) -> Vec<RecordLocation> {
    let (done, completions) = mpsc::channel();
    let locations: Vec<RecordLocation> = entries
        .map(|entry| {
            let done = done.clone();
            let callback = Box::new(move |result| {
                let _ = done.send(result);
            });
            journal.append(header(entry), &data(entry), callback).unwrap()
        })
        .collect();
    for _ in &locations {
        completions.recv_timeout(WAIT).expect("completion arrives").expect("durable");
    }
    locations
}

#[test]
fn records_read_back_through_the_aligned_read_path() {
    let dir = tempfile::tempdir().unwrap();
    let journal = open(dir.path());
    let locations = append_durably(&journal, 0..200, payload);
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

/// A restart seals the segment written last and starts a new one: the old one's unwritten
/// rest goes back to the file system (each restart left up to a segment of zeros on the disk),
/// its records still read back, and a truncated segment is never reused for writing.
#[test]
fn a_restart_gives_the_last_segment_s_unwritten_rest_back() {
    let dir = tempfile::tempdir().unwrap();
    let segment_size = 4u64 << 20;
    let journal = open(dir.path());
    let locations = append_durably(&journal, 0..10, payload);
    let first = locations[0].segment;
    assert!(locations.iter().all(|l| l.segment == first), "ten records fit one segment");
    journal.close();
    drop(journal);
    let file = dir.path().join(format!("{first:020}.journal"));
    assert_eq!(std::fs::metadata(&file).unwrap().len(), segment_size);

    let config = JournalConfig {
        segment_size_bytes: segment_size,
        max_group_bytes: 1 << 20,
        recycled_segments_kept: 4,
        ..JournalConfig::default()
    };
    let storage = Arc::new(FsStorage::open(dir.path()).unwrap());
    let (journal, report) = Journal::open(config, storage).unwrap();
    let (tail_seq, valid_end) = report.tail.expect("a tail");
    assert_eq!(tail_seq, first);
    let kept = std::fs::metadata(&file).unwrap().len();
    assert_eq!(kept, valid_end.next_multiple_of(4096), "truncated to its records' blocks");
    assert_eq!(report.freed_tail_bytes, segment_size - kept);
    for (entry, location) in locations.iter().enumerate() {
        assert_eq!(journal.read(*location, header(entry as u64)).unwrap(), payload(entry as u64));
    }

    // Released with room to keep it for reuse, the short segment is still not reused: the
    // segments the writer moves on to are all full-size.
    journal.release_segments(&[first]).unwrap();
    append_durably(&journal, 100..120, |_| vec![7u8; 900 << 10]);
    let segments = journal.segments();
    assert!(segments.len() >= 3, "the writer moved on: {segments:?}");
    for seq in segments {
        let path = dir.path().join(format!("{seq:020}.journal"));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), segment_size, "segment {seq}");
    }
    assert!(!file.exists(), "the truncated segment was removed, not reused");
}
