use super::*;

fn message(key: Option<&str>, payload: &str) -> MessageShape {
    MessageShape {
        key: key.map(str::to_string),
        payload_len: payload.len(),
        null_value: false,
        compacted_out: false,
    }
}

fn single(key: &str, payload: &str) -> EntryShape {
    EntryShape::Single(message(Some(key), payload))
}

fn tombstone(key: &str) -> EntryShape {
    EntryShape::Single(MessageShape { null_value: true, ..message(Some(key), "") })
}

/// Runs both phases over `entries` (positions 1:0, 1:1, ...): what phase two keeps of each.
fn compact(entries: &[EntryShape]) -> (LatestPerKey, Vec<Keep>) {
    let mut latest = LatestPerKey::new();
    for (entry, shape) in (0u64..).zip(entries) {
        latest.observe(1, entry, shape);
    }
    let kept = (0u64..).zip(entries).map(|(entry, shape)| latest.keep(1, entry, shape)).collect();
    (latest, kept)
}

#[test]
fn the_latest_value_of_each_key_is_kept() {
    // Pulsar's python test_publish_compact_and_consume: hello-0, hello-1 under key0.
    let (latest, kept) = compact(&[single("key0", "hello-0"), single("key0", "hello-1")]);
    assert_eq!(kept, vec![Keep::Nothing, Keep::Whole]);
    assert_eq!(latest.latest("key0"), Some(MessageId::entry(1, 1)));
    assert_eq!((latest.len(), latest.removed, latest.last_read), (1, 1, Some((1, 1))));
}

#[test]
fn a_null_value_deletes_its_key_and_is_not_kept_itself() {
    // Pulsar's python test_null_value_compaction: key2 and key4 remain.
    let entries = [
        single("key1", "hello-1"),
        tombstone("key1"),
        single("key2", "hello-2"),
        single("key3", "hello-3"),
        tombstone("key3"),
        single("key4", "hello-4"),
    ];
    let (latest, kept) = compact(&entries);
    use Keep::{Nothing, Whole};
    assert_eq!(kept, vec![Nothing, Nothing, Whole, Nothing, Nothing, Whole]);
    assert_eq!(latest.len(), 2);
    // An empty payload deletes too; a key set again after its deletion is back.
    let (latest, kept) = compact(&[single("k", "a"), single("k", ""), single("k", "b")]);
    assert_eq!(kept, vec![Nothing, Nothing, Whole]);
    assert_eq!(latest.latest("k"), Some(MessageId::entry(1, 2)));
}

#[test]
fn messages_without_a_key_and_markers_are_dropped_opaque_entries_kept() {
    let keyless = EntryShape::Single(message(None, "x"));
    let (latest, kept) = compact(&[keyless, EntryShape::Marker, EntryShape::Opaque]);
    assert_eq!(kept, vec![Keep::Nothing, Keep::Nothing, Keep::Whole]);
    assert_eq!((latest.len(), latest.removed), (0, 2));
}

#[test]
fn a_batch_keeps_the_messages_that_are_latest_for_their_keys() {
    let batch = EntryShape::Batch(vec![
        message(Some("a"), "a1"),
        message(Some("b"), "b1"),
        message(Some("a"), "a2"),
        message(None, "n"),
    ]);
    let later = single("b", "b2");
    let (latest, kept) = compact(&[batch.clone(), later]);
    assert_eq!(kept, vec![Keep::Messages(vec![2]), Keep::Whole]);
    assert_eq!(latest.latest("a"), Some(MessageId { ledger: 1, entry: 0, batch_index: Some(2) }));
    // A batch whose messages are all latest is kept whole; one with none is dropped.
    let (_, kept) =
        compact(&[EntryShape::Batch(vec![message(Some("x"), "1"), message(Some("y"), "2")])]);
    assert_eq!(kept, vec![Keep::Whole]);
    let (_, kept) = compact(&[batch, single("a", "a3"), single("b", "b3")]);
    assert_eq!(kept[0], Keep::Nothing);
}

#[test]
fn a_second_run_over_a_compacted_batch_skips_what_was_compacted_out() {
    // The previous compacted ledger holds the batch with message 0 compacted out.
    let mut out = message(Some("a"), "a1");
    out.compacted_out = true;
    let rewritten = EntryShape::Batch(vec![out, message(Some("b"), "b1")]);
    let (latest, kept) = compact(&[rewritten]);
    assert_eq!(latest.latest("a"), None, "a compacted-out message sets no key");
    assert_eq!(kept, vec![Keep::Messages(vec![1])]);
}

#[test]
#[should_panic(expected = "topic order")]
fn entries_must_come_in_topic_order() {
    let mut latest = LatestPerKey::new();
    latest.observe(2, 0, &single("k", "v"));
    latest.observe(1, 9, &single("k", "v"));
}

#[test]
fn one_run_at_a_time_and_a_failed_run_leaves_the_compacted_ledger_in_force() {
    let first = Compacted { ledger: 10, horizon: (3, 7) };
    let mut state = CompactionState::recovered(Some(first));
    assert!(state.reads_compacted((3, 7)) && state.reads_compacted((1, 0)));
    assert!(!state.reads_compacted((3, 8)));
    state.begin().unwrap();
    assert_eq!(state.begin(), Err(CompactionRefused::AlreadyRunning));
    // Crash or error mid-run: nothing changes but the run's end.
    state.fail();
    assert_eq!(state.committed, Some(first));
    assert!(!state.is_running());
    state.begin().unwrap();
    let second = Compacted { ledger: 11, horizon: (4, 2) };
    assert_eq!(state.commit(second), Some(10), "the replaced ledger is handed back");
    assert_eq!(state.committed, Some(second));
    assert!(state.reads_compacted((4, 0)));
}

#[test]
fn a_compacted_read_starts_at_the_first_kept_entry_at_or_after_its_position() {
    let kept = [(1, 2), (1, 5), (2, 0)];
    assert_eq!(start_index(&kept, (0, 0)), 0);
    assert_eq!(start_index(&kept, (1, 2)), 0);
    assert_eq!(start_index(&kept, (1, 3)), 1);
    assert_eq!(start_index(&kept, (2, 0)), 2);
    assert_eq!(start_index(&kept, (2, 1)), 3, "past the last kept: on in the topic");
    assert_eq!(start_index(&[], (1, 1)), 0);
}

#[test]
fn automatic_compaction_is_due_past_a_set_threshold() {
    assert!(!compaction_due(0, u64::MAX), "0: disabled");
    assert!(!compaction_due(1_000, 1_000));
    assert!(compaction_due(1_000, 1_001));
}
