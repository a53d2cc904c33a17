//! Randomised tests of [`AckState`] against a naive model, plus scale and hostile-input tests.
//!
//! The model keeps acked positions in a `BTreeSet` and walks the ledger layout one position at a
//! time, so it is obviously right and slow. Every operation's outcome is compared, and full
//! states (sets, counts, holes, encoding round trip, invariants) are compared periodically.
//! Seeds are fixed for reproducibility and printed; set `MAGNETAR_CURSOR_SEED` to run one seed.

use std::collections::{BTreeMap, BTreeSet};

use super::acked::ChunkKey;
use super::position::{entries_after, entry_count, next_position, position_exists};
use super::*;

/// SplitMix64: tiny, seedable, good enough to drive tests.
struct TestRng(u64);

impl TestRng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut mixed = self.0;
        mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        mixed ^ (mixed >> 31)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound
    }

    fn percent(&mut self, chance: u64) -> bool {
        self.below(100) < chance
    }

    /// Below `large` with probability `chance` percent, else below `small`.
    fn skewed(&mut self, chance: u64, large: u64, small: u64) -> u64 {
        let bound = if self.percent(chance) { large } else { small };
        self.below(bound)
    }
}

#[derive(Default)]
struct Model {
    mark_delete: Option<Position>,
    acked: BTreeSet<Position>,
    /// Partially acked batches: size and acked indexes.
    batches: BTreeMap<Position, (u32, BTreeSet<u32>)>,
}

type ModelResult = Result<u64, ()>;

impl Model {
    fn is_covered(&self, position: Position) -> bool {
        self.mark_delete.is_some_and(|mark_delete| position <= mark_delete)
    }

    fn is_acked(&self, position: Position) -> bool {
        self.is_covered(position) || self.acked.contains(&position)
    }

    fn advance(&mut self, ledgers: &LedgerList) {
        while let Some(next) = next_position(ledgers, self.mark_delete) {
            if !self.acked.remove(&next) {
                break;
            }
            self.mark_delete = Some(next);
        }
    }

    fn complete(&mut self, position: Position, ledgers: &LedgerList) -> u64 {
        if !self.acked.insert(position) {
            return 0;
        }
        self.batches.remove(&position);
        self.advance(ledgers);
        1
    }

    fn ack_individual(&mut self, position: Position, ledgers: &LedgerList) -> ModelResult {
        if self.is_covered(position) {
            return Ok(0);
        }
        if !position_exists(ledgers, position) {
            return Err(());
        }
        Ok(self.complete(position, ledgers))
    }

    fn ack_cumulative(&mut self, position: Position, ledgers: &LedgerList) -> ModelResult {
        if self.is_covered(position) {
            return Ok(0);
        }
        if !position_exists(ledgers, position) {
            return Err(());
        }
        let mut newly = 0;
        let mut walk = self.mark_delete;
        while let Some(next) = next_position(ledgers, walk).filter(|next| *next <= position) {
            newly += u64::from(!self.acked.contains(&next));
            walk = Some(next);
        }
        self.acked.retain(|acked| *acked > position);
        self.batches.retain(|batch, _| *batch > position);
        self.mark_delete = Some(position);
        self.advance(ledgers);
        Ok(newly)
    }

    fn ack_batch(
        &mut self,
        position: Position,
        batch_size: u32,
        acked_indexes: &[u32],
        ledgers: &LedgerList,
    ) -> ModelResult {
        if batch_size == 0 || batch_size > MAX_BATCH_SIZE {
            return Err(());
        }
        if acked_indexes.iter().any(|index| *index >= batch_size) {
            return Err(());
        }
        if self.is_acked(position) {
            return Ok(0);
        }
        if !position_exists(ledgers, position) {
            return Err(());
        }
        let (known_size, mut indexes) =
            self.batches.get(&position).cloned().unwrap_or((batch_size, BTreeSet::new()));
        if known_size != batch_size {
            return Err(());
        }
        indexes.extend(acked_indexes.iter().copied());
        if indexes.len() == batch_size as usize {
            return Ok(self.complete(position, ledgers));
        }
        if !indexes.is_empty() {
            self.batches.insert(position, (batch_size, indexes));
        }
        Ok(0)
    }

    fn ack_cumulative_batch(
        &mut self,
        position: Position,
        batch_size: u32,
        last_acked_index: u32,
        ledgers: &LedgerList,
    ) -> ModelResult {
        if batch_size == 0 || batch_size > MAX_BATCH_SIZE || last_acked_index >= batch_size {
            return Err(());
        }
        if self.is_covered(position) {
            return Ok(0);
        }
        if !position_exists(ledgers, position) {
            return Err(());
        }
        if self.batches.get(&position).is_some_and(|(size, _)| *size != batch_size) {
            return Err(());
        }
        let mut newly = 0;
        let mut walk = self.mark_delete;
        while let Some(next) = next_position(ledgers, walk).filter(|next| *next < position) {
            newly += u64::from(self.acked.insert(next));
            self.batches.remove(&next);
            walk = Some(next);
        }
        let indexes: Vec<u32> = (0..=last_acked_index).collect();
        newly += self.ack_batch(position, batch_size, &indexes, ledgers)?;
        self.advance(ledgers);
        Ok(newly)
    }

    fn reconcile(&mut self, ledgers: &LedgerList) {
        self.acked.retain(|position| position_exists(ledgers, *position));
        self.batches.retain(|position, _| position_exists(ledgers, *position));
        self.advance(ledgers);
    }

    fn range_count(&self, ledgers: &LedgerList) -> u64 {
        let mut count = 0;
        let mut previous = None;
        for position in &self.acked {
            if previous.is_none() || next_position(ledgers, previous) != Some(*position) {
                count += 1;
            }
            previous = Some(*position);
        }
        count
    }

    /// Unacked positions after the mark-delete and before `end`, walking one by one.
    fn holes(&self, end: Position, ledgers: &LedgerList) -> Vec<Position> {
        let mut holes = Vec::new();
        let mut walk = self.mark_delete;
        while let Some(next) = next_position(ledgers, walk).filter(|next| *next < end) {
            if !self.acked.contains(&next) {
                holes.push(next);
            }
            walk = Some(next);
        }
        holes
    }
}

/// Acked indexes encoded by a Pulsar ack set (set bit = unacked, missing words = acked).
fn indexes_acked_by(ack_set: &[u64], batch_size: u32) -> Vec<u32> {
    (0..batch_size)
        .filter(|index| {
            let word = ack_set.get((index / 64) as usize).copied().unwrap_or(0);
            word >> (index % 64) & 1 == 0
        })
        .collect()
}

fn initial_ledgers() -> LedgerList {
    // Empty and missing ledgers, and ledgers spanning one and two chunk boundaries.
    [(1, 5), (3, 0), (4, 70_000), (6, 1), (7, 0), (9, 131_073), (10, 3)].into_iter().collect()
}

/// A position near an interesting spot: the mark-delete, ledger edges or chunk edges.
fn pick_position(rng: &mut TestRng, model: &Model, ledgers: &LedgerList) -> Position {
    let hot_spots = [
        next_position(ledgers, model.mark_delete).unwrap_or_default(),
        Position::new(1, 0),
        Position::new(4, 0),
        Position::new(4, 65_530),
        Position::new(4, 69_990),
        Position::new(6, 0),
        Position::new(9, 0),
        Position::new(9, 65_530),
        Position::new(9, 131_060),
        Position::new(10, 0),
        Position::new(2, 0),
        Position::new(rng.below(12), rng.below(140_000)),
    ];
    let spot = hot_spots[rng.below(hot_spots.len() as u64) as usize];
    let mut position = spot;
    for _ in 0..rng.below(20) {
        match next_position(ledgers, Some(position)) {
            Some(next) if !rng.percent(3) => position = next,
            _ => position.entry_id += 1,
        }
    }
    position
}

/// The position `steps` existing positions after the mark-delete (or the last one there is).
fn walk_from_mark_delete(model: &Model, ledgers: &LedgerList, steps: u64) -> Option<Position> {
    let mut walk = next_position(ledgers, model.mark_delete)?;
    for _ in 1..steps {
        match next_position(ledgers, Some(walk)) {
            Some(next) => walk = next,
            None => break,
        }
    }
    Some(walk)
}

/// One seed's run: where it is, for failure messages, and what it exercised, printed so a reader
/// can see the test reaches the interesting cases.
#[derive(Debug, Default)]
struct RunLog {
    seed: u64,
    step: usize,
    rejected: u64,
    mark_delete_moves: u64,
    most_acked: u64,
    most_bitmap_chunks: usize,
    most_partial_batches: usize,
}

impl RunLog {
    fn observe(&mut self, state: &AckState) {
        self.most_acked = self.most_acked.max(state.individually_acked_count());
        let bitmaps = state.acked().chunks().filter(|(_, chunk)| chunk.is_bitmap()).count();
        self.most_bitmap_chunks = self.most_bitmap_chunks.max(bitmaps);
        self.most_partial_batches = self.most_partial_batches.max(state.partial_batch_count());
    }

    /// Compares one operation's outcome with the model's.
    fn check(
        &mut self,
        what: &str,
        actual: Result<AckOutcome, AckError>,
        expected: ModelResult,
        mark_delete_before: Option<Position>,
        model: &Model,
    ) {
        let context = format!("seed {} step {}: {what}", self.seed, self.step);
        match (actual, expected) {
            (Ok(outcome), Ok(newly)) => {
                self.mark_delete_moves += u64::from(outcome.mark_delete_moved);
                assert_eq!(outcome.newly_acked_entries, newly, "{context}");
                let moved = mark_delete_before != model.mark_delete;
                assert_eq!(outcome.mark_delete_moved, moved, "{context}");
            }
            (Err(_), Err(())) => self.rejected += 1,
            (actual, expected) => panic!("{context}: state {actual:?}, model {expected:?}"),
        }
    }
}

fn check_full(seed: u64, step: usize, state: &AckState, model: &Model, ledgers: &LedgerList) {
    let context = format!("seed {seed} step {step}");
    assert_eq!(state.mark_delete(), model.mark_delete, "{context}");
    assert_eq!(state.individually_acked_count(), model.acked.len() as u64, "{context}");
    let acked: BTreeSet<Position> =
        state.acked().ledger_runs().flat_map(EntryRange::positions).collect();
    assert!(acked == model.acked, "{context}: acked sets differ");
    assert_eq!(state.acked_range_count(ledgers), model.range_count(ledgers), "{context}");
    assert_eq!(state.partial_batch_count(), model.batches.len(), "{context}");
    for (position, (batch_size, indexes)) in &model.batches {
        let batch = state.partial_batch(*position).expect("partial batch present");
        assert_eq!(batch.batch_size(), *batch_size, "{context}");
        let acked_indexes = indexes_acked_by(batch.ack_set(), *batch_size);
        assert!(acked_indexes.iter().eq(indexes.iter()), "{context}");
    }
    // Invariants.
    if let (Some(first), Some(mark_delete)) = (model.acked.first(), model.mark_delete) {
        assert!(*first > mark_delete, "{context}");
    }
    if let Some(next) = next_position(ledgers, state.mark_delete()) {
        assert!(!state.is_acked(next), "{context}: mark-delete not advanced");
    }
    let read_position = walk_from_mark_delete(model, ledgers, 3000)
        .and_then(|last| next_position(ledgers, Some(last)))
        .unwrap_or(Position::new(u64::MAX, 0));
    let holes: Vec<Position> = state.unacked_positions(read_position, ledgers).collect();
    assert!(holes == model.holes(read_position, ledgers), "{context}: holes differ");
    assert_eq!(
        state.backlog_entries(ledgers),
        entries_after(ledgers, model.mark_delete) - model.acked.len() as u64,
        "{context}"
    );
    let decoded = AckState::decode(&state.encode());
    assert_eq!(decoded.as_ref(), Ok(state), "{context}: encoding round trip");
}

fn run_model(seed: u64, steps: usize) {
    eprintln!("cursor model test seed = {seed}");
    let mut rng = TestRng(seed);
    let mut ledgers = initial_ledgers();
    let mut state = AckState::new(None);
    let mut model = Model::default();
    let mut log = RunLog { seed, ..RunLog::default() };
    for step in 0..steps {
        log.step = step;
        let mark_delete_before = model.mark_delete;
        let roll = rng.below(100);
        match roll {
            0..=44 => {
                let position = pick_position(&mut rng, &model, &ledgers);
                let actual = state.ack_individual(position, &ledgers);
                let expected = model.ack_individual(position, &ledgers);
                let what = format!("ack_individual({position})");
                log.check(&what, actual, expected, mark_delete_before, &model);
            }
            45..=59 => {
                let position = pick_position(&mut rng, &model, &ledgers);
                let batch_size = 1 + rng.skewed(10, 300, 8) as u32;
                let count = rng.below(4);
                let indexes: Vec<u32> =
                    (0..count).map(|_| rng.below(u64::from(batch_size) + 1) as u32).collect();
                let actual = state.ack_batch_indexes(position, batch_size, &indexes, &ledgers);
                let expected = model.ack_batch(position, batch_size, &indexes, &ledgers);
                let what = format!("ack_batch_indexes({position}, {batch_size}, {indexes:?})");
                log.check(&what, actual, expected, mark_delete_before, &model);
            }
            60..=64 => {
                let position = pick_position(&mut rng, &model, &ledgers);
                let batch_size = 1 + rng.below(130) as u32;
                let words = rng.below(4) as usize;
                let ack_set: Vec<u64> =
                    (0..words).map(|_| rng.next_u64() | rng.next_u64() | rng.next_u64()).collect();
                let acked_indexes = indexes_acked_by(&ack_set, batch_size);
                let actual = state.ack_batch_ack_set(position, batch_size, &ack_set, &ledgers);
                let expected = model.ack_batch(position, batch_size, &acked_indexes, &ledgers);
                let what = format!("ack_batch_ack_set({position}, {batch_size}, {ack_set:x?})");
                log.check(&what, actual, expected, mark_delete_before, &model);
            }
            65..=69 => {
                let steps_ahead = 1 + rng.skewed(20, 3000, 40);
                let Some(position) = walk_from_mark_delete(&model, &ledgers, steps_ahead) else {
                    continue;
                };
                let actual = state.ack_cumulative(position, &ledgers);
                let expected = model.ack_cumulative(position, &ledgers);
                let what = format!("ack_cumulative({position})");
                log.check(&what, actual, expected, mark_delete_before, &model);
            }
            70..=72 => {
                let Some(position) = walk_from_mark_delete(&model, &ledgers, 1 + rng.below(60))
                else {
                    continue;
                };
                let batch_size = 1 + rng.below(6) as u32;
                let last_index = rng.below(u64::from(batch_size) + 1) as u32;
                let actual = state.ack_cumulative_batch(position, batch_size, last_index, &ledgers);
                let expected =
                    model.ack_cumulative_batch(position, batch_size, last_index, &ledgers);
                let what = format!("ack_cumulative_batch({position}, {batch_size}, {last_index})");
                log.check(&what, actual, expected, mark_delete_before, &model);
            }
            73..=75 => {
                // Every other entry over a window: pushes chunks into bitmap form.
                let start = pick_position(&mut rng, &model, &ledgers);
                let Some(count) = entry_count(&ledgers, start.ledger_id) else {
                    continue;
                };
                let end = count.min(start.entry_id + 2 * (500 + rng.below(5000)));
                for entry_id in (start.entry_id..end).step_by(2) {
                    let position = Position::new(start.ledger_id, entry_id);
                    let before = model.mark_delete;
                    let actual = state.ack_individual(position, &ledgers);
                    let expected = model.ack_individual(position, &ledgers);
                    log.check("alternating fill", actual, expected, before, &model);
                }
            }
            76..=89 => {
                // Fill a contiguous window: merges runs, turns bitmaps back into runs.
                let start = pick_position(&mut rng, &model, &ledgers);
                let mut position = start;
                for _ in 0..1 + rng.skewed(10, 4000, 200) {
                    let before = model.mark_delete;
                    let actual = state.ack_individual(position, &ledgers);
                    let expected = model.ack_individual(position, &ledgers);
                    log.check("contiguous fill", actual, expected, before, &model);
                    match next_position(&ledgers, Some(position)) {
                        Some(next) => position = next,
                        None => break,
                    }
                }
            }
            90..=93 => {
                // The open ledger grows, or a new ledger (sometimes empty) is added.
                let last =
                    ledgers.iter().last().unwrap_or(LedgerExtent { ledger_id: 0, entry_count: 0 });
                if rng.percent(70) {
                    let grown = last.entry_count + 1 + rng.below(100);
                    ledgers.set_entry_count(last.ledger_id, grown);
                } else {
                    let entries = if rng.percent(30) { 0 } else { rng.below(300) };
                    ledgers.set_entry_count(last.ledger_id + 1 + rng.below(2), entries);
                }
            }
            94 => {
                // A ledger is deleted (TTL / retention); both sides reconcile.
                let ids: Vec<u64> = ledgers.iter().map(|extent| extent.ledger_id).collect();
                let victim = ids[rng.below(ids.len() as u64) as usize];
                ledgers.remove_ledger(victim);
                state.reconcile(&ledgers);
                model.reconcile(&ledgers);
            }
            _ => check_full(seed, step, &state, &model, &ledgers),
        }
        log.observe(&state);
        if step % 97 == 0 {
            check_full(seed, step, &state, &model, &ledgers);
        }
    }
    check_full(seed, steps, &state, &model, &ledgers);
    eprintln!("{log:?}, final mark-delete {:?}", state.mark_delete());
}

fn seeds() -> Vec<u64> {
    match std::env::var("MAGNETAR_CURSOR_SEED") {
        Ok(seed) => vec![seed.parse().expect("MAGNETAR_CURSOR_SEED must be a u64")],
        Err(_) => (1..=6).collect(),
    }
}

#[test]
fn random_operations_match_the_naive_model() {
    for seed in seeds() {
        run_model(seed, 1500);
    }
}

#[test]
fn ten_million_entries_with_every_other_acked_use_a_bit_per_entry() {
    let ledgers: LedgerList = (1..=200).map(|ledger_id| (ledger_id, 50_000)).collect();
    let mut state = AckState::new(None);
    for ledger_id in 1..=200 {
        for entry_id in (1..50_000).step_by(2) {
            state.ack_individual(Position::new(ledger_id, entry_id), &ledgers).unwrap();
        }
    }
    let ranges = state.individually_acked_count();
    assert_eq!(ranges, 5_000_000);
    let heap_bytes = state.approximate_heap_bytes();
    let bytes_per_range = heap_bytes as f64 / ranges as f64;
    println!("10M entries, 5M ranges: {heap_bytes} heap bytes, {bytes_per_range:.3} bytes/range");
    assert!(bytes_per_range < 0.5, "{bytes_per_range} bytes per range");
    // Filling every hole drains the state completely and moves the mark-delete to the end.
    for ledger_id in 1..=200 {
        for entry_id in (0..50_000).step_by(2) {
            state.ack_individual(Position::new(ledger_id, entry_id), &ledgers).unwrap();
        }
    }
    assert_eq!(state.mark_delete(), Some(Position::new(200, 49_999)));
    assert_eq!(state.individually_acked_count(), 0);
    assert_eq!(state.approximate_heap_bytes(), 0);
}

#[test]
fn sparse_acks_cost_a_few_bytes_per_range_in_memory() {
    let ledgers: LedgerList = [(1, 10_000_000)].into_iter().collect();
    let mut state = AckState::new(None);
    for entry_id in (1..10_000_000).step_by(50) {
        state.ack_individual(Position::new(1, entry_id), &ledgers).unwrap();
    }
    let ranges = state.individually_acked_count();
    let bytes_per_range = state.approximate_heap_bytes() as f64 / ranges as f64;
    println!("{ranges} sparse ranges: {bytes_per_range:.3} heap bytes/range");
    assert!(bytes_per_range < 8.0, "{bytes_per_range} bytes per range");
}

/// A random state reached through the public API.
fn random_state(rng: &mut TestRng, ledgers: &LedgerList) -> AckState {
    let mut state = AckState::new(None);
    let model = Model::default();
    for _ in 0..rng.below(400) {
        let position = pick_position(rng, &model, ledgers);
        let _ = if rng.percent(20) {
            let batch_size = 1 + rng.below(200) as u32;
            let index = rng.below(u64::from(batch_size)) as u32;
            state.ack_batch_indexes(position, batch_size, &[index], ledgers)
        } else if rng.percent(5) {
            let _ = state.ack_cumulative(position, ledgers);
            Ok(AckOutcome::default())
        } else {
            let end = position.entry_id + rng.skewed(10, 9000, 3);
            for entry_id in (position.entry_id..=end).step_by(1 + rng.below(3) as usize) {
                let _ = state.ack_individual(Position::new(position.ledger_id, entry_id), ledgers);
            }
            Ok(AckOutcome::default())
        };
    }
    state
}

#[test]
fn random_states_round_trip_exactly() {
    let ledgers = initial_ledgers();
    for seed in 100..140 {
        let mut rng = TestRng(seed);
        let state = random_state(&mut rng, &ledgers);
        let decoded = AckState::decode(&state.encode());
        assert_eq!(decoded.as_ref(), Ok(&state), "seed {seed}");
    }
}

/// Decoding must return errors, never panic, whatever the bytes.
#[test]
fn hostile_input_never_panics() {
    let ledgers = initial_ledgers();
    let mut rng = TestRng(7);
    for round in 0..300 {
        let state = random_state(&mut rng, &ledgers);
        let good = state.encode();
        for cut in 0..good.len().min(64) {
            assert!(AckState::decode(&good[..cut]).is_err(), "round {round} cut {cut}");
        }
        let cut = rng.below(good.len() as u64) as usize;
        assert!(AckState::decode(&good[..cut]).is_err());
        // Mutations behind a valid checksum reach the parser itself.
        for _ in 0..20 {
            let mut mutated = good.clone();
            for _ in 0..1 + rng.below(4) {
                let index = 6 + rng.below((mutated.len() - 10) as u64 + 1) as usize;
                if index < mutated.len() - 4 {
                    mutated[index] = rng.next_u64() as u8;
                }
            }
            if rng.percent(20) {
                let keep = 6 + rng.below((mutated.len() - 6) as u64) as usize;
                mutated.truncate(keep);
                mutated.extend_from_slice(&[0; 4]);
            }
            reseal(&mut mutated);
            if let Ok(decoded) = AckState::decode(&mutated) {
                // Whatever decodes must be a consistent state that round-trips.
                assert_eq!(AckState::decode(&decoded.encode()).as_ref(), Ok(&decoded));
                if let (Some(first), Some(mark_delete)) =
                    (decoded.acked().first_position(), decoded.mark_delete())
                {
                    assert!(first > mark_delete);
                }
            }
        }
    }
    for length in 0..200 {
        let mut garbage: Vec<u8> = (0..length).map(|_| rng.next_u64() as u8).collect();
        let _ = AckState::decode(&garbage);
        if garbage.len() >= 10 {
            garbage[..6].copy_from_slice(b"MCAS\x01\x01");
            reseal(&mut garbage);
            let _ = AckState::decode(&garbage);
        }
    }
}

#[test]
fn chunk_keys_cover_the_whole_entry_id_space() {
    let position = Position::new(3, u64::MAX);
    let (key, offset) = ChunkKey::of(position);
    assert_eq!(key.position(offset), position);
    let ledgers: LedgerList = [(3, u64::MAX)].into_iter().collect();
    let mut state = AckState::new(None);
    state.ack_individual(Position::new(3, u64::MAX - 1), &ledgers).unwrap();
    assert_eq!(AckState::decode(&state.encode()).as_ref(), Ok(&state));
}

fn reseal(bytes: &mut [u8]) {
    let body_len = bytes.len() - 4;
    let checksum = crc32c::crc32c(&bytes[..body_len]);
    bytes[body_len..].copy_from_slice(&checksum.to_le_bytes());
}
