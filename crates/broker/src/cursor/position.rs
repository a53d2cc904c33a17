//! Positions in a topic and the ledger layout that gives them a successor.
//!
//! A topic is a sequence of ledgers (ascending ids, possibly with gaps where ledgers were
//! deleted), each holding entry ids `0..entry_count`. Positions order lexicographically by
//! `(ledger_id, entry_id)`. Entry ids are dense inside a ledger, but only the ledger layout knows
//! where a ledger ends, so "the position after P" needs a [`LedgerBoundaries`]. Empty ledgers and
//! ledgers missing from the layout hold no positions and are skipped.
//!
//! Invariant of the helpers here: they only ever return positions the layout says exist.

use std::collections::BTreeMap;
use std::fmt;

/// The address of one entry: ledger id, then entry id inside that ledger.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    pub ledger_id: u64,
    pub entry_id: u64,
}

impl Position {
    pub const fn new(ledger_id: u64, entry_id: u64) -> Self {
        Self { ledger_id, entry_id }
    }
}

impl fmt::Display for Position {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}:{}", self.ledger_id, self.entry_id)
    }
}

/// Entries `first_entry_id..=last_entry_id` of a single ledger.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryRange {
    pub ledger_id: u64,
    pub first_entry_id: u64,
    pub last_entry_id: u64,
}

impl EntryRange {
    pub fn first(&self) -> Position {
        Position::new(self.ledger_id, self.first_entry_id)
    }

    pub fn last(&self) -> Position {
        Position::new(self.ledger_id, self.last_entry_id)
    }

    pub fn entry_count(&self) -> u64 {
        self.last_entry_id - self.first_entry_id + 1
    }

    pub fn contains(&self, position: Position) -> bool {
        position.ledger_id == self.ledger_id
            && (self.first_entry_id..=self.last_entry_id).contains(&position.entry_id)
    }

    pub fn positions(self) -> impl Iterator<Item = Position> {
        (self.first_entry_id..=self.last_entry_id)
            .map(move |entry| Position::new(self.ledger_id, entry))
    }
}

/// A closed range of positions that may span ledger boundaries (every existing position between
/// `first` and `last` is included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PositionRange {
    pub first: Position,
    pub last: Position,
}

/// One ledger of the topic and how many entries it holds (for the open ledger: how many are
/// readable so far, i.e. last-add-confirmed + 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LedgerExtent {
    pub ledger_id: u64,
    pub entry_count: u64,
}

/// The topic's ledger layout as the cursor needs it. Implemented by whatever owns the ledger
/// list (the managed ledger); [`LedgerList`] is a plain in-memory implementation.
pub trait LedgerBoundaries {
    /// The known ledger with the smallest id `>= ledger_id`, if any.
    fn ledger_at_or_after(&self, ledger_id: u64) -> Option<LedgerExtent>;
}

/// Number of entries in `ledger_id`, or `None` when the layout does not have that ledger.
pub fn entry_count<L: LedgerBoundaries + ?Sized>(ledgers: &L, ledger_id: u64) -> Option<u64> {
    ledgers
        .ledger_at_or_after(ledger_id)
        .filter(|extent| extent.ledger_id == ledger_id)
        .map(|extent| extent.entry_count)
}

/// Whether the layout holds an entry at `position`.
pub fn position_exists<L: LedgerBoundaries + ?Sized>(ledgers: &L, position: Position) -> bool {
    entry_count(ledgers, position.ledger_id).is_some_and(|count| position.entry_id < count)
}

/// The first existing position strictly after `after` (`None` means "before the whole topic"),
/// skipping empty and missing ledgers. `None` when nothing exists after it yet.
pub fn next_position<L: LedgerBoundaries + ?Sized>(
    ledgers: &L,
    after: Option<Position>,
) -> Option<Position> {
    let mut search_from = match after {
        None => 0,
        Some(position) => {
            let next_entry = position.entry_id.checked_add(1);
            let count = entry_count(ledgers, position.ledger_id);
            if let (Some(next_entry), Some(count)) = (next_entry, count) {
                if next_entry < count {
                    return Some(Position::new(position.ledger_id, next_entry));
                }
            }
            position.ledger_id.checked_add(1)?
        }
    };
    loop {
        let extent = ledgers.ledger_at_or_after(search_from)?;
        if extent.entry_count > 0 {
            return Some(Position::new(extent.ledger_id, 0));
        }
        search_from = extent.ledger_id.checked_add(1)?;
    }
}

/// Number of existing positions `p` with `after < p <= through` (`after == None`: from the start).
pub fn entries_between<L: LedgerBoundaries + ?Sized>(
    ledgers: &L,
    after: Option<Position>,
    through: Position,
) -> u64 {
    let mut total = 0;
    let mut search_from = after.map_or(0, |position| position.ledger_id);
    while let Some(extent) = ledgers.ledger_at_or_after(search_from) {
        if extent.ledger_id > through.ledger_id {
            break;
        }
        // Entries of this ledger inside the window, as a half-open entry-id interval.
        let window_start = match after {
            Some(position) if position.ledger_id == extent.ledger_id => {
                position.entry_id.saturating_add(1)
            }
            _ => 0,
        };
        let window_end = if extent.ledger_id == through.ledger_id {
            through.entry_id.saturating_add(1).min(extent.entry_count)
        } else {
            extent.entry_count
        };
        total += window_end.saturating_sub(window_start);
        match extent.ledger_id.checked_add(1) {
            Some(next) => search_from = next,
            None => break,
        }
    }
    total
}

/// Number of existing positions strictly after `after` (`None`: the whole topic).
pub fn entries_after<L: LedgerBoundaries + ?Sized>(ledgers: &L, after: Option<Position>) -> u64 {
    entries_between(ledgers, after, Position::new(u64::MAX, u64::MAX))
}

/// A plain ledger layout: ledger id -> entry count.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LedgerList {
    entry_counts: BTreeMap<u64, u64>,
}

impl LedgerList {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a ledger or updates its entry count (the open ledger grows as entries are confirmed).
    pub fn set_entry_count(&mut self, ledger_id: u64, entry_count: u64) {
        self.entry_counts.insert(ledger_id, entry_count);
    }

    pub fn remove_ledger(&mut self, ledger_id: u64) {
        self.entry_counts.remove(&ledger_id);
    }

    pub fn iter(&self) -> impl Iterator<Item = LedgerExtent> + '_ {
        self.entry_counts
            .iter()
            .map(|(&ledger_id, &entry_count)| LedgerExtent { ledger_id, entry_count })
    }
}

impl FromIterator<(u64, u64)> for LedgerList {
    fn from_iter<I: IntoIterator<Item = (u64, u64)>>(ledgers: I) -> Self {
        Self { entry_counts: ledgers.into_iter().collect() }
    }
}

impl LedgerBoundaries for LedgerList {
    fn ledger_at_or_after(&self, ledger_id: u64) -> Option<LedgerExtent> {
        self.entry_counts
            .range(ledger_id..)
            .next()
            .map(|(&ledger_id, &entry_count)| LedgerExtent { ledger_id, entry_count })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> LedgerList {
        // Ledger 2 is empty, ledger 4 was deleted (absent).
        [(1, 3), (2, 0), (3, 2), (5, 1)].into_iter().collect()
    }

    #[test]
    fn next_position_walks_entries_then_skips_empty_and_missing_ledgers() {
        let ledgers = layout();
        let mut walk = Vec::new();
        let mut cursor = None;
        while let Some(position) = next_position(&ledgers, cursor) {
            walk.push(position);
            cursor = Some(position);
        }
        let expected = [(1, 0), (1, 1), (1, 2), (3, 0), (3, 1), (5, 0)]
            .map(|(ledger, entry)| Position::new(ledger, entry));
        assert_eq!(walk, expected);
    }

    #[test]
    fn next_position_from_unknown_positions_moves_to_the_next_ledger() {
        let ledgers = layout();
        assert_eq!(next_position(&ledgers, Some(Position::new(4, 7))), Some(Position::new(5, 0)));
        assert_eq!(
            next_position(&ledgers, Some(Position::new(0, u64::MAX))),
            Some(Position::new(1, 0))
        );
        assert_eq!(next_position(&ledgers, Some(Position::new(u64::MAX, 0))), None);
    }

    #[test]
    fn entries_between_counts_only_existing_positions() {
        let ledgers = layout();
        assert_eq!(entries_after(&ledgers, None), 6);
        assert_eq!(entries_after(&ledgers, Some(Position::new(1, 0))), 5);
        assert_eq!(entries_after(&ledgers, Some(Position::new(3, 1))), 1);
        assert_eq!(entries_after(&ledgers, Some(Position::new(5, 0))), 0);
        assert_eq!(entries_between(&ledgers, Some(Position::new(1, 1)), Position::new(3, 0)), 2);
        assert_eq!(entries_between(&ledgers, None, Position::new(1, 99)), 3);
    }

    #[test]
    fn position_exists_respects_ledger_ends() {
        let ledgers = layout();
        assert!(position_exists(&ledgers, Position::new(1, 2)));
        assert!(!position_exists(&ledgers, Position::new(1, 3)));
        assert!(!position_exists(&ledgers, Position::new(2, 0)));
        assert!(!position_exists(&ledgers, Position::new(4, 0)));
    }
}
