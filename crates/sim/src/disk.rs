//! A storage node's log in memory: records are appended, become durable at the next sync, and
//! a crash keeps the synced prefix plus a random part of what was not synced yet (the rest is
//! lost or torn, which recovery of a real journal also cuts off at the first bad record).

use crate::rng::Rng;
use bytes::Bytes;
use magnetar_replication::message::ErrorCode;
use magnetar_replication::node::{LedgerSummary, Record, Token};
use magnetar_replication::{EntryId, LedgerId};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

#[derive(Debug, Default)]
pub struct Disk {
    records: Vec<Record>,
    synced: usize,
    entries: BTreeMap<(LedgerId, EntryId), usize>,
    fenced: BTreeSet<LedgerId>,
    /// Completions owed, in log order.
    pending: VecDeque<(Token, Result<(), ErrorCode>)>,
}

impl Disk {
    /// Appends `record` (a stored entry with the same bytes is not written again; other
    /// bytes are refused). Returns `Err` with the invariant it would break if this is a
    /// normal add after a fence of its ledger.
    pub fn append(&mut self, token: Token, record: Record) -> Result<(), String> {
        let result = match &record {
            Record::Entry { ledger, entry, recovery, data, .. } => {
                if !recovery && self.fenced.contains(ledger) {
                    return Err(format!("a fenced node stored a normal add of {ledger}:{entry}"));
                }
                match self.entries.get(&(*ledger, *entry)) {
                    Some(&at) if entry_data(&self.records[at]) == data => Ok(()),
                    Some(_) => Err(ErrorCode::Conflict),
                    None => {
                        self.entries.insert((*ledger, *entry), self.records.len());
                        self.records.push(record);
                        Ok(())
                    }
                }
            }
            Record::Fence { ledger, .. } => {
                self.fenced.insert(*ledger);
                self.records.push(record);
                Ok(())
            }
        };
        self.pending.push_back((token, result));
        Ok(())
    }

    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Makes everything appended durable; the completions owed, in order.
    pub fn sync(&mut self) -> Vec<(Token, Result<(), ErrorCode>)> {
        self.synced = self.records.len();
        self.pending.drain(..).collect()
    }

    /// A write error: every completion owed fails (the node then crashes, as a journal that
    /// failed a write accepts nothing more).
    pub fn fail_pending(&mut self) -> Vec<(Token, Result<(), ErrorCode>)> {
        self.pending.drain(..).map(|(token, _)| (token, Err(ErrorCode::Io))).collect()
    }

    /// A crash: the synced prefix stays, plus a random prefix of the rest.
    pub fn crash(&mut self, rng: &mut Rng) {
        let unsynced = (self.records.len() - self.synced) as u64;
        let kept = self.synced + rng.below(unsynced + 1) as usize;
        self.records.truncate(kept);
        self.synced = kept;
        self.pending.clear();
        self.entries.retain(|_, at| *at < kept);
        self.fenced = self
            .records
            .iter()
            .filter_map(|r| match r {
                Record::Fence { ledger, .. } => Some(*ledger),
                Record::Entry { .. } => None,
            })
            .collect();
    }

    /// Garbage collection of a deleted ledger: its entries go, its fences stay (as a node's
    /// fence log outlives the ledgers it names).
    pub fn collect(&mut self, ledger: LedgerId) {
        let is_entry_of = |r: &Record| matches!(r, Record::Entry { ledger: l, .. } if *l == ledger);
        let synced_gone = self.records[..self.synced].iter().filter(|r| is_entry_of(r)).count();
        self.synced -= synced_gone;
        self.records.retain(|r| !is_entry_of(r));
        self.entries = self
            .records
            .iter()
            .enumerate()
            .filter_map(|(at, r)| match r {
                Record::Entry { ledger, entry, .. } => Some(((*ledger, *entry), at)),
                Record::Fence { .. } => None,
            })
            .collect();
    }

    /// What a restarted node rebuilds from its log.
    pub fn summaries(&self) -> BTreeMap<LedgerId, LedgerSummary> {
        let mut summaries: BTreeMap<LedgerId, LedgerSummary> = BTreeMap::new();
        for record in &self.records {
            let ledger = match record {
                Record::Entry { ledger, .. } | Record::Fence { ledger, .. } => *ledger,
            };
            summaries.entry(ledger).or_default().apply(record);
        }
        summaries
    }

    /// The durable bytes of an entry.
    pub fn read(&self, ledger: LedgerId, entry: EntryId) -> Option<&Bytes> {
        let &at = self.entries.get(&(ledger, entry))?;
        (at < self.synced).then(|| entry_data(&self.records[at]))
    }
}

fn entry_data(record: &Record) -> &Bytes {
    match record {
        Record::Entry { data, .. } => data,
        Record::Fence { .. } => unreachable!("the entry index points at entries"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(e: EntryId, recovery: bool) -> Record {
        Record::Entry { ledger: 1, entry: e, lac: None, recovery, data: Bytes::from(vec![e as u8]) }
    }

    #[test]
    fn only_synced_records_are_read_and_a_crash_keeps_them() {
        let mut disk = Disk::default();
        disk.append(0, entry(0, false)).unwrap();
        assert!(disk.read(1, 0).is_none(), "not durable yet");
        assert_eq!(disk.sync(), vec![(0, Ok(()))]);
        disk.append(1, entry(1, false)).unwrap();
        disk.crash(&mut Rng::new(7));
        assert!(disk.read(1, 0).is_some());
        assert!(!disk.has_pending());
    }

    #[test]
    fn a_normal_add_after_a_fence_is_reported() {
        let mut disk = Disk::default();
        disk.append(0, Record::Fence { ledger: 1, epoch: 1 }).unwrap();
        assert!(disk.append(1, entry(0, false)).is_err());
        disk.append(2, entry(0, true)).unwrap();
        disk.append(
            3,
            Record::Entry {
                ledger: 1,
                entry: 0,
                lac: None,
                recovery: true,
                data: Bytes::from_static(b"x"),
            },
        )
        .unwrap();
        assert_eq!(disk.sync(), vec![(0, Ok(())), (2, Ok(())), (3, Err(ErrorCode::Conflict))]);
    }
}
