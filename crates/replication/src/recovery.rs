//! Recovery open (BookKeeper's `LedgerRecoveryOp`, with the fixes of bk#2614 and #2654): what
//! a new owner or the auditor runs on a ledger whose writer may be gone, concurrently with
//! that writer if it is not.
//!
//! 1. Compare-and-set the metadata to IN_RECOVERY with the epoch raised (a closed ledger is
//!    done already; a conflict starts again from what is stored).
//! 2. Fencing LAC reads to the last fragment's nodes until `Qw - Qa + 1` have answered: no
//!    write the old writer has not finished can reach Qa after that. LAC = the highest
//!    answered, and at least the last fragment's start - 1.
//! 3. From LAC + 1, fencing reads of each entry: found on any node, it is written back with
//!    recovery adds to the ensemble (Qa answers); absent only once `Qw - Qa + 1` nodes say
//!    they lack it, and the first absent entry ends the ledger. Up to `window` entries are in
//!    progress at once (read, or written back once every entry before it was found: nothing
//!    past an entry that may turn out absent is written); one at a time, a writer's pipeline of
//!    thousands of unconfirmed entries took seconds to recover (a round trip and a durable
//!    write each). A node that fails during the write-backs is replaced by a fragment starting
//!    at the first entry not yet written back (recorded at close), and every write-back from
//!    there is sent to the replacement: only the new ensemble's answers count for them.
//! 4. Compare-and-set CLOSED with the last entry written back and the new fragments.
//!
//! A `Fenced` answer means a newer recovery (higher epoch) took over: this one stops.

use crate::message::{ErrorCode, Request, RequestId, Response};
use crate::meta::{Fragment, LedgerMeta, LedgerState};
use crate::placement::{replacement_within, NodeInfo};
use crate::{EntryId, Epoch, LedgerId, MetaWrite, NodeId};
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryConfig {
    /// A request unanswered for this long is sent again (reads) or its node replaced (writes).
    pub retry_ms: u64,
    /// Entries read or written back at once (at least 1: one at a time).
    pub window: usize,
}

impl Default for RecoveryConfig {
    fn default() -> Self {
        RecoveryConfig { retry_ms: 2_000, window: 64 }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecoveryAction {
    Send {
        to: NodeId,
        request: RequestId,
        body: Request,
    },
    WriteMeta {
        meta: LedgerMeta,
        expected_version: u64,
    },
    ReadMeta,
    /// The ledger is closed at `last_entry` (by this recovery or another).
    Done {
        meta: LedgerMeta,
        version: u64,
    },
    /// A newer recovery took over.
    Superseded,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    MarkInRecovery(LedgerMeta),
    FenceLac {
        answers: BTreeMap<NodeId, Option<EntryId>>,
    },
    /// Reads and write-backs of the entries in `Recovery::slots`.
    Recover,
    Close(LedgerMeta),
    Done,
    Superseded,
}

/// An entry in progress.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Slot {
    Reading {
        lacking: BTreeSet<NodeId>,
    },
    /// Found; written back once every entry before it was found.
    Found {
        data: Bytes,
    },
    /// Written back; done once Qa nodes of the write ensemble answered.
    Writing {
        data: Bytes,
        acked: BTreeSet<NodeId>,
    },
}

#[derive(Debug, Clone, Copy)]
struct InFlight {
    node: NodeId,
    /// The entry read or written back (`None`: a fencing LAC read).
    entry: Option<EntryId>,
    write: bool,
    sent_ms: u64,
}

#[derive(Debug)]
pub struct Recovery {
    ledger: LedgerId,
    config: RecoveryConfig,
    meta: LedgerMeta,
    version: u64,
    live: Vec<NodeInfo>,
    phase: Phase,
    /// The last fragment's nodes: the only ones the old writer could still write to.
    read_ensemble: Vec<NodeId>,
    /// Where entries found are written back (the read ensemble with failed nodes replaced).
    write_ensemble: Vec<NodeId>,
    new_fragments: Vec<Fragment>,
    failed: BTreeSet<NodeId>,
    in_flight: BTreeMap<RequestId, InFlight>,
    next_request: RequestId,
    /// Entries in progress, from the first not yet written back; at most `config.window`.
    slots: BTreeMap<EntryId, Slot>,
    /// The next entry to read.
    next_read: EntryId,
    /// The first entry found absent: the ledger ends before it.
    first_absent: Option<EntryId>,
    last_found: Option<EntryId>,
    written_back: u64,
    /// The LAC the fencing reads established: entries up to it were acknowledged by the writer
    /// on ensembles the stored metadata names. Recovery adds carry this one, never a later
    /// entry they write back: those sit on ensembles recorded only at close, and a node's LAC
    /// must not let the next recovery skip them.
    fenced_lac: Option<EntryId>,
}

impl Recovery {
    /// Starts recovering `ledger`, whose stored metadata is `meta` at `version`.
    pub fn start(
        ledger: LedgerId,
        meta: LedgerMeta,
        version: u64,
        config: RecoveryConfig,
        out: &mut Vec<RecoveryAction>,
    ) -> Recovery {
        assert!(config.window >= 1, "at least one entry in progress");
        let mut recovery = Recovery {
            ledger,
            config,
            read_ensemble: Vec::new(),
            write_ensemble: Vec::new(),
            meta,
            version,
            live: Vec::new(),
            phase: Phase::Done,
            new_fragments: Vec::new(),
            failed: BTreeSet::new(),
            in_flight: BTreeMap::new(),
            next_request: 0,
            slots: BTreeMap::new(),
            next_read: 0,
            first_absent: None,
            last_found: None,
            written_back: 0,
            fenced_lac: None,
        };
        recovery.mark_in_recovery(out);
        recovery
    }

    pub fn set_live_nodes(&mut self, live: Vec<NodeInfo>) {
        self.live = live;
    }

    pub fn is_finished(&self) -> bool {
        matches!(self.phase, Phase::Done | Phase::Superseded)
    }

    pub fn epoch(&self) -> Epoch {
        self.meta.epoch
    }

    /// Entries found above the fenced LAC and written back so far.
    pub fn written_back(&self) -> u64 {
        self.written_back
    }

    fn mark_in_recovery(&mut self, out: &mut Vec<RecoveryAction>) {
        if self.meta.state == LedgerState::Closed {
            self.phase = Phase::Done;
            out.push(RecoveryAction::Done { meta: self.meta.clone(), version: self.version });
            return;
        }
        let mut proposed = self.meta.clone();
        proposed.state = LedgerState::InRecovery;
        proposed.epoch += 1;
        self.meta.validate_successor(&proposed).expect("marking in recovery is valid");
        self.phase = Phase::MarkInRecovery(proposed.clone());
        out.push(RecoveryAction::WriteMeta { meta: proposed, expected_version: self.version });
    }

    pub fn on_meta_written(
        &mut self,
        result: MetaWrite,
        now_ms: u64,
        out: &mut Vec<RecoveryAction>,
    ) {
        let proposed = match &self.phase {
            Phase::MarkInRecovery(meta) | Phase::Close(meta) => meta.clone(),
            _ => return,
        };
        match result {
            MetaWrite::Written(version) => self.meta_applied(proposed, version, now_ms, out),
            MetaWrite::Conflict { current, version } if *current == proposed => {
                self.meta_applied(proposed, version, now_ms, out)
            }
            MetaWrite::Conflict { current, version } => self.meta_lost(*current, version, out),
            MetaWrite::Unknown => out.push(RecoveryAction::ReadMeta),
        }
    }

    pub fn on_meta_read(
        &mut self,
        current: LedgerMeta,
        version: u64,
        now_ms: u64,
        out: &mut Vec<RecoveryAction>,
    ) {
        let proposed = match &self.phase {
            Phase::MarkInRecovery(meta) | Phase::Close(meta) => meta.clone(),
            _ => return,
        };
        if current == proposed {
            self.meta_applied(proposed, version, now_ms, out);
        } else if version == self.version {
            out.push(RecoveryAction::WriteMeta { meta: proposed, expected_version: version });
        } else {
            self.meta_lost(current, version, out);
        }
    }

    fn meta_applied(
        &mut self,
        stored: LedgerMeta,
        version: u64,
        now_ms: u64,
        out: &mut Vec<RecoveryAction>,
    ) {
        assert!(version > self.version, "versions only grow");
        self.version = version;
        self.meta = stored;
        match self.meta.state {
            LedgerState::InRecovery => {
                self.read_ensemble = self.meta.last_fragment().ensemble.clone();
                self.write_ensemble = self.read_ensemble.clone();
                self.phase = Phase::FenceLac { answers: BTreeMap::new() };
                for node in self.read_ensemble.clone() {
                    let fence = Some(self.meta.epoch);
                    let body = Request::ReadLac { ledger: self.ledger, fence };
                    self.send(node, None, body, now_ms, out);
                }
            }
            LedgerState::Closed => {
                self.phase = Phase::Done;
                out.push(RecoveryAction::Done { meta: self.meta.clone(), version });
            }
            LedgerState::Open => unreachable!("recovery never writes OPEN"),
        }
    }

    fn meta_lost(&mut self, current: LedgerMeta, version: u64, out: &mut Vec<RecoveryAction>) {
        match self.phase {
            // Someone else moved the ledger on first: start again from what is stored (a
            // newer recovery is superseded by this one in turn, or it closed the ledger).
            Phase::MarkInRecovery(_) => {
                self.meta = current;
                self.version = version;
                self.mark_in_recovery(out);
            }
            _ if current.state == LedgerState::Closed => {
                self.phase = Phase::Done;
                out.push(RecoveryAction::Done { meta: current, version });
            }
            _ => self.supersede(out),
        }
    }

    fn supersede(&mut self, out: &mut Vec<RecoveryAction>) {
        self.phase = Phase::Superseded;
        self.in_flight.clear();
        out.push(RecoveryAction::Superseded);
    }

    fn send(
        &mut self,
        to: NodeId,
        entry: Option<EntryId>,
        body: Request,
        now_ms: u64,
        out: &mut Vec<RecoveryAction>,
    ) {
        let request = self.next_request;
        self.next_request += 1;
        let write = matches!(body, Request::Add { .. });
        self.in_flight.insert(request, InFlight { node: to, entry, write, sent_ms: now_ms });
        out.push(RecoveryAction::Send { to, request, body });
    }

    fn read_request(&self, entry: EntryId) -> Request {
        Request::Read { ledger: self.ledger, entry, fence: Some(self.meta.epoch) }
    }

    fn write_back_request(&self, entry: EntryId, data: &Bytes) -> Request {
        Request::Add {
            ledger: self.ledger,
            entry,
            epoch: self.meta.epoch,
            lac: self.fenced_lac,
            recovery: true,
            data: data.clone(),
        }
    }

    /// Forgets the requests still out for `entry` (`write`: its write-backs, else its reads):
    /// their answers no longer matter, and they must not count as a node's time-out.
    fn settled(&mut self, entry: EntryId, write: bool) {
        self.in_flight.retain(|_, f| !(f.entry == Some(entry) && f.write == write));
    }

    pub fn on_response(
        &mut self,
        from: NodeId,
        request: RequestId,
        response: Response,
        now_ms: u64,
        out: &mut Vec<RecoveryAction>,
    ) {
        let Some(sent) = self.in_flight.remove(&request) else {
            return;
        };
        assert_eq!(sent.node, from);
        if let Response::Error { code: ErrorCode::Fenced, .. } = response {
            return self.supersede(out);
        }
        if let Phase::FenceLac { answers } = &mut self.phase {
            if let Response::Lac { lac, .. } = response {
                answers.insert(from, lac);
                if answers.len() >= self.meta.absent_quorum() {
                    let start = self.meta.last_fragment().first_entry;
                    let answered = answers.values().copied().max().flatten();
                    let lac = answered.max(start.checked_sub(1));
                    self.last_found = lac;
                    self.fenced_lac = lac;
                    self.in_flight.clear();
                    self.phase = Phase::Recover;
                    self.next_read = lac.map_or(0, |l| l + 1);
                    self.advance(now_ms, out);
                }
            } else if let Response::Error { .. } = response {
                self.on_node_failed(from, now_ms, out);
            }
            return;
        }
        if self.phase != Phase::Recover {
            return; // an answer to an earlier phase's request
        }
        match response {
            Response::Entry { entry, data, .. } => {
                if let Some(slot @ Slot::Reading { .. }) = self.slots.get_mut(&entry) {
                    *slot = Slot::Found { data };
                    self.settled(entry, false);
                }
            }
            Response::NoEntry { entry, .. } => {
                let Some(Slot::Reading { lacking }) = self.slots.get_mut(&entry) else {
                    return;
                };
                lacking.insert(from);
                if lacking.len() >= self.meta.absent_quorum() {
                    // The ledger ends before it: nothing after it was acknowledged (acks come
                    // in entry order), and nothing after it is written back.
                    // (An entry before it may still turn out absent too, and end it earlier.)
                    assert!(self.first_absent.is_none_or(|a| entry < a), "slots past it went");
                    self.first_absent = Some(entry);
                    self.slots.split_off(&entry);
                    self.in_flight.retain(|_, f| f.entry.is_none_or(|e| e < entry));
                }
            }
            Response::Added { entry, .. } => {
                let Some(Slot::Writing { acked, .. }) = self.slots.get_mut(&entry) else {
                    return;
                };
                acked.insert(from);
            }
            Response::Error { .. } => return self.on_node_failed(from, now_ms, out),
            _ => return,
        }
        self.advance(now_ms, out);
    }

    /// Whether the write-back of a `Writing` slot has its Qa answers from the write ensemble.
    fn written(&self, acked: &BTreeSet<NodeId>) -> bool {
        let count = self.write_ensemble.iter().filter(|n| acked.contains(n)).count();
        count >= self.meta.ack_quorum as usize
    }

    /// Moves the window along: retires the entries written back (in order), writes back what
    /// was found after them, reads further, and closes once the first absent entry is known and
    /// everything before it is written back.
    fn advance(&mut self, now_ms: u64, out: &mut Vec<RecoveryAction>) {
        loop {
            while let Some((&entry, slot)) = self.slots.first_key_value() {
                let done = matches!(slot, Slot::Writing { acked, .. } if self.written(acked));
                if !done {
                    break;
                }
                self.slots.remove(&entry);
                self.settled(entry, true);
                self.last_found = Some(entry);
                self.written_back += 1;
            }
            let found: Vec<(EntryId, Bytes)> = self
                .slots
                .iter()
                .take_while(|(_, slot)| !matches!(slot, Slot::Reading { .. }))
                .filter_map(|(&entry, slot)| match slot {
                    Slot::Found { data } => Some((entry, data.clone())),
                    _ => None,
                })
                .collect();
            for (entry, data) in found {
                self.slots
                    .insert(entry, Slot::Writing { data: data.clone(), acked: BTreeSet::new() });
                for node in self.write_ensemble.clone() {
                    let body = self.write_back_request(entry, &data);
                    self.send(node, Some(entry), body, now_ms, out);
                }
            }
            if self.first_absent.is_some() {
                if self.slots.is_empty() {
                    self.close(out);
                }
                return;
            }
            if self.slots.len() >= self.config.window {
                return;
            }
            let entry = self.next_read;
            self.next_read += 1;
            self.slots.insert(entry, Slot::Reading { lacking: BTreeSet::new() });
            for node in self.read_ensemble.clone() {
                let body = self.read_request(entry);
                self.send(node, Some(entry), body, now_ms, out);
            }
        }
    }

    fn close(&mut self, out: &mut Vec<RecoveryAction>) {
        self.in_flight.clear();
        let mut proposed = self.meta.clone();
        for fragment in &self.new_fragments {
            let last = proposed.fragments.last_mut().expect("one at least");
            if last.first_entry == fragment.first_entry {
                last.ensemble = fragment.ensemble.clone();
            } else {
                proposed.fragments.push(fragment.clone());
            }
        }
        proposed.state = LedgerState::Closed;
        proposed.last_entry_id = self.last_found;
        self.meta.validate_successor(&proposed).expect("closing after recovery is valid");
        self.phase = Phase::Close(proposed.clone());
        out.push(RecoveryAction::WriteMeta { meta: proposed, expected_version: self.version });
    }

    /// `node` failed. Reads are simply asked again later; while a write-back waits for it,
    /// the node is replaced (a new fragment from the first entry not yet written back) when a
    /// live node can take its place.
    pub fn on_node_failed(&mut self, node: NodeId, now_ms: u64, out: &mut Vec<RecoveryAction>) {
        self.in_flight.retain(|_, s| s.node != node);
        if self.phase != Phase::Recover || !self.write_ensemble.contains(&node) {
            return;
        }
        let waits_for_it = self
            .slots
            .values()
            .any(|slot| matches!(slot, Slot::Writing { acked, .. } if !acked.contains(&node)));
        if !waits_for_it {
            return;
        }
        self.failed.insert(node);
        let exclude: Vec<NodeId> = self.failed.iter().copied().collect();
        let groups = self.meta.isolation.as_ref();
        let Some(replacement) =
            replacement_within(&self.live, groups, &self.write_ensemble, &exclude)
        else {
            return; // asked again on a later tick
        };
        // Everything before the window is written back where the metadata will say; the window
        // (its first entry is not written back yet) goes to the new ensemble.
        let start = *self.slots.keys().next().expect("a write-back waits");
        let position = self.write_ensemble.iter().position(|&n| n == node).expect("checked");
        self.write_ensemble[position] = replacement;
        let ensemble = self.write_ensemble.clone();
        match self.new_fragments.last_mut() {
            Some(last) if last.first_entry == start => last.ensemble = ensemble,
            last => {
                assert!(last.is_none_or(|l| l.first_entry < start), "fragments only move on");
                self.new_fragments.push(Fragment { first_entry: start, ensemble });
            }
        }
        let writing: Vec<(EntryId, Bytes)> = self
            .slots
            .iter()
            .filter_map(|(&entry, slot)| match slot {
                Slot::Writing { data, .. } => Some((entry, data.clone())),
                _ => None,
            })
            .collect();
        for (entry, data) in writing {
            let body = self.write_back_request(entry, &data);
            self.send(replacement, Some(entry), body, now_ms, out);
        }
    }

    /// Asks again what has gone unanswered for `retry_ms`, and what a failed node left unasked.
    pub fn tick(&mut self, now_ms: u64, out: &mut Vec<RecoveryAction>) {
        let stale: BTreeSet<NodeId> = self
            .in_flight
            .values()
            .filter(|s| now_ms.saturating_sub(s.sent_ms) >= self.config.retry_ms)
            .map(|s| s.node)
            .collect();
        for node in stale {
            self.on_node_failed(node, now_ms, out);
        }
        let asked: BTreeSet<(NodeId, Option<EntryId>, bool)> =
            self.in_flight.values().map(|f| (f.node, f.entry, f.write)).collect();
        let mut requests = Vec::new();
        match &self.phase {
            Phase::FenceLac { answers } => {
                for &node in &self.read_ensemble {
                    if !answers.contains_key(&node) && !asked.contains(&(node, None, false)) {
                        let fence = Some(self.meta.epoch);
                        requests.push((
                            node,
                            None,
                            Request::ReadLac { ledger: self.ledger, fence },
                        ));
                    }
                }
            }
            Phase::Recover => {
                for (&entry, slot) in &self.slots {
                    match slot {
                        Slot::Reading { lacking } => {
                            for &node in &self.read_ensemble {
                                if !lacking.contains(&node)
                                    && !asked.contains(&(node, Some(entry), false))
                                {
                                    requests.push((node, Some(entry), self.read_request(entry)));
                                }
                            }
                        }
                        Slot::Writing { data, acked } => {
                            for &node in &self.write_ensemble {
                                if !acked.contains(&node)
                                    && !asked.contains(&(node, Some(entry), true))
                                {
                                    let body = self.write_back_request(entry, data);
                                    requests.push((node, Some(entry), body));
                                }
                            }
                        }
                        Slot::Found { .. } => {}
                    }
                }
            }
            _ => {}
        }
        for (node, entry, body) in requests {
            self.send(node, entry, body, now_ms, out);
        }
    }
}
