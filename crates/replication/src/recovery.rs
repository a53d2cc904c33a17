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
//!    they lack it. A node that fails during the write-back is replaced by a fragment starting
//!    at that entry (recorded at close).
//! 4. Compare-and-set CLOSED with the last entry found and the new fragments.
//!
//! A `Fenced` answer means a newer recovery (higher epoch) took over: this one stops.

use crate::message::{ErrorCode, Request, RequestId, Response};
use crate::meta::{Fragment, LedgerMeta, LedgerState};
use crate::placement::{choose_replacement, NodeInfo};
use crate::{EntryId, Epoch, LedgerId, MetaWrite, NodeId};
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryConfig {
    /// A request unanswered for this long is sent again (reads) or its node replaced (writes).
    pub retry_ms: u64,
}

impl Default for RecoveryConfig {
    fn default() -> Self {
        RecoveryConfig { retry_ms: 2_000 }
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
    FenceLac { answers: BTreeMap<NodeId, Option<EntryId>> },
    Read { entry: EntryId, lacking: BTreeSet<NodeId> },
    WriteBack { entry: EntryId, data: Bytes, acked: BTreeSet<NodeId> },
    Close(LedgerMeta),
    Done,
    Superseded,
}

#[derive(Debug, Clone, Copy)]
struct InFlight {
    node: NodeId,
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
    last_found: Option<EntryId>,
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
            last_found: None,
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
                    self.send(
                        node,
                        Request::ReadLac { ledger: self.ledger, fence: Some(self.meta.epoch) },
                        now_ms,
                        out,
                    );
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

    fn send(&mut self, to: NodeId, body: Request, now_ms: u64, out: &mut Vec<RecoveryAction>) {
        let request = self.next_request;
        self.next_request += 1;
        self.in_flight.insert(request, InFlight { node: to, sent_ms: now_ms });
        out.push(RecoveryAction::Send { to, request, body });
    }

    fn phase_request(&self, node: NodeId) -> Option<Request> {
        let ledger = self.ledger;
        let fence = Some(self.meta.epoch);
        match &self.phase {
            Phase::FenceLac { answers } => {
                (!answers.contains_key(&node)).then_some(Request::ReadLac { ledger, fence })
            }
            Phase::Read { entry, lacking } => {
                (!lacking.contains(&node)).then_some(Request::Read { ledger, entry: *entry, fence })
            }
            Phase::WriteBack { entry, data, acked } => {
                (!acked.contains(&node)).then(|| Request::Add {
                    ledger,
                    entry: *entry,
                    epoch: self.meta.epoch,
                    lac: self.fenced_lac,
                    recovery: true,
                    data: data.clone(),
                })
            }
            _ => None,
        }
    }

    fn phase_nodes(&self) -> Vec<NodeId> {
        match self.phase {
            Phase::WriteBack { .. } => self.write_ensemble.clone(),
            _ => self.read_ensemble.clone(),
        }
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
        match (&mut self.phase, response) {
            (Phase::FenceLac { answers }, Response::Lac { lac, .. }) => {
                answers.insert(from, lac);
                if answers.len() >= self.meta.absent_quorum() {
                    let start = self.meta.last_fragment().first_entry;
                    let answered = answers.values().copied().max().flatten();
                    let lac = answered.max(start.checked_sub(1));
                    self.last_found = lac;
                    self.fenced_lac = lac;
                    self.read(lac.map_or(0, |l| l + 1), now_ms, out);
                }
            }
            (Phase::Read { entry, .. }, Response::Entry { entry: got, data, .. })
                if got == *entry =>
            {
                let entry = *entry;
                self.phase = Phase::WriteBack { entry, data, acked: BTreeSet::new() };
                self.in_flight.clear();
                for node in self.write_ensemble.clone() {
                    let body = self.phase_request(node).expect("nothing acked yet");
                    self.send(node, body, now_ms, out);
                }
            }
            (Phase::Read { entry, lacking }, Response::NoEntry { entry: got, .. })
                if got == *entry =>
            {
                lacking.insert(from);
                if lacking.len() >= self.meta.absent_quorum() {
                    self.close(out);
                }
            }
            (Phase::WriteBack { entry, acked, .. }, Response::Added { entry: got, .. })
                if got == *entry =>
            {
                acked.insert(from);
                let entry = *entry;
                let count = self.write_ensemble.iter().filter(|n| acked.contains(n)).count();
                if count >= self.meta.ack_quorum as usize {
                    self.last_found = Some(entry);
                    self.read(entry + 1, now_ms, out);
                }
            }
            (_, Response::Error { .. }) => self.on_node_failed(from, now_ms, out),
            _ => {} // an answer to an earlier phase's request
        }
    }

    fn read(&mut self, entry: EntryId, now_ms: u64, out: &mut Vec<RecoveryAction>) {
        self.in_flight.clear();
        self.phase = Phase::Read { entry, lacking: BTreeSet::new() };
        for node in self.read_ensemble.clone() {
            let body = self.phase_request(node).expect("nobody answered yet");
            self.send(node, body, now_ms, out);
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

    /// `node` failed. Reads are simply asked again later; during a write-back the node is
    /// replaced (a new fragment from this entry on) when a live node can take its place.
    pub fn on_node_failed(&mut self, node: NodeId, now_ms: u64, out: &mut Vec<RecoveryAction>) {
        self.in_flight.retain(|_, s| s.node != node);
        let Phase::WriteBack { entry, .. } = self.phase else {
            return;
        };
        if !self.write_ensemble.contains(&node) {
            return;
        }
        self.failed.insert(node);
        let exclude: Vec<NodeId> = self.failed.iter().copied().collect();
        let Some(replacement) = choose_replacement(&self.live, &self.write_ensemble, &exclude)
        else {
            return; // asked again on a later tick
        };
        let slot = self.write_ensemble.iter().position(|&n| n == node).expect("checked");
        self.write_ensemble[slot] = replacement;
        let ensemble = self.write_ensemble.clone();
        match self.new_fragments.last_mut() {
            Some(last) if last.first_entry == entry => last.ensemble = ensemble,
            _ => self.new_fragments.push(Fragment { first_entry: entry, ensemble }),
        }
        let body = self.phase_request(replacement).expect("a replacement has nothing yet");
        self.send(replacement, body, now_ms, out);
    }

    /// Asks again what has gone unanswered for `retry_ms`.
    pub fn tick(&mut self, now_ms: u64, out: &mut Vec<RecoveryAction>) {
        let stale: Vec<NodeId> = self
            .in_flight
            .values()
            .filter(|s| now_ms.saturating_sub(s.sent_ms) >= self.config.retry_ms)
            .map(|s| s.node)
            .collect();
        for node in stale {
            self.on_node_failed(node, now_ms, out);
        }
        for node in self.phase_nodes() {
            let asked = self.in_flight.values().any(|s| s.node == node);
            if !asked {
                if let Some(body) = self.phase_request(node) {
                    self.send(node, body, now_ms, out);
                }
            }
        }
    }
}
