//! The single writer of an open ledger (BookKeeper's `LedgerHandle` add path).
//!
//! * Entry `e` goes to every node of the ensemble the stored metadata names for `e`.
//! * It is acknowledged once Qa of **those** nodes have answered `Added`, strictly in entry
//!   order, and never while an ensemble change is being recorded (bk#1591: acks from a
//!   replacement that the stored metadata does not name would be lost to a recovery).
//! * A node that fails (error answer, time-out, lost connection) is replaced: a new fragment
//!   starting at LAC + 1 is written by compare-and-set first, then every pending entry goes to
//!   the replacement, whose acks are the only new ones that count. With no live node to take
//!   its place, the writer waits `replacement_wait_ms` for one to register before it fails.
//! * A conflicting metadata write or a `Fenced` answer means a recovery took the ledger: the
//!   writer stops and fails what it had not acknowledged.

use crate::message::{ErrorCode, Request, RequestId, Response};
use crate::meta::{Fragment, LedgerMeta, LedgerState};
use crate::placement::{replacement_within, NodeInfo};
use crate::{EntryId, LedgerId, MetaWrite, NodeId};
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriterConfig {
    /// A node that has not answered an add for this long is replaced.
    pub add_timeout_ms: u64,
    /// With no add for this long, the writer sends its LAC on its own (explicit LAC), so
    /// readers see the last entries.
    pub explicit_lac_after_ms: u64,
    /// A failed node with no live node to replace it: the writer waits this long for one to
    /// register (adds go on to the others meanwhile, acknowledged if they make Qa) before it
    /// fails its pending adds.
    pub replacement_wait_ms: u64,
}

impl Default for WriterConfig {
    fn default() -> Self {
        WriterConfig {
            add_timeout_ms: 5_000,
            explicit_lac_after_ms: 1_000,
            replacement_wait_ms: 5_000,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    #[error("the ledger was fenced by a recovery")]
    Fenced,
    #[error("not enough live storage nodes to replace a failed one")]
    NotEnoughNodes,
    #[error("the ledger is closed or closing")]
    Closed,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriterAction {
    Send {
        to: NodeId,
        request: RequestId,
        body: Request,
    },
    /// Compare-and-set the ledger's metadata; answer with [`Writer::on_meta_written`].
    WriteMeta {
        meta: LedgerMeta,
        expected_version: u64,
    },
    /// Read the metadata back (after an unknown outcome); answer with [`Writer::on_meta_read`].
    ReadMeta,
    Acked {
        entry: EntryId,
    },
    Failed {
        entry: EntryId,
        error: WriteError,
    },
    /// The writer closed the ledger (or found it closed by a recovery) at `last_entry`.
    Closed {
        last_entry: Option<EntryId>,
    },
}

#[derive(Debug)]
struct Pending {
    entry: EntryId,
    data: Bytes,
    acked: BTreeSet<NodeId>,
    /// Nodes with a request for this entry outstanding.
    asked: BTreeSet<NodeId>,
}

#[derive(Debug, Clone, Copy)]
struct InFlight {
    node: NodeId,
    entry: EntryId,
    sent_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum MetaOp {
    EnsembleChange(LedgerMeta),
    Close(LedgerMeta),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Terminal {
    Closed,
    Fenced,
    Failed(WriteError),
}

#[derive(Debug)]
pub struct Writer {
    ledger: LedgerId,
    config: WriterConfig,
    meta: LedgerMeta,
    version: u64,
    live: Vec<NodeInfo>,
    next_entry: EntryId,
    lac: Option<EntryId>,
    pending: VecDeque<Pending>,
    in_flight: BTreeMap<RequestId, InFlight>,
    next_request: RequestId,
    failed: BTreeSet<NodeId>,
    meta_op: Option<MetaOp>,
    closing: bool,
    terminal: Option<Terminal>,
    last_add_ms: u64,
    lac_sent: Option<EntryId>,
    /// Since when a failed node has had no replacement (see `replacement_wait_ms`).
    no_replacement_since_ms: Option<u64>,
}

impl Writer {
    /// The writer of a ledger just created with `meta` (OPEN, no entry) at `version`.
    pub fn new(ledger: LedgerId, meta: LedgerMeta, version: u64, config: WriterConfig) -> Writer {
        assert_eq!(meta.state, LedgerState::Open);
        assert_eq!(meta.fragments.len(), 1);
        meta.validate().expect("a new ledger's metadata is valid");
        Writer {
            ledger,
            config,
            meta,
            version,
            live: Vec::new(),
            next_entry: 0,
            lac: None,
            pending: VecDeque::new(),
            in_flight: BTreeMap::new(),
            next_request: 0,
            failed: BTreeSet::new(),
            meta_op: None,
            closing: false,
            terminal: None,
            last_add_ms: 0,
            lac_sent: None,
            no_replacement_since_ms: None,
        }
    }

    pub fn meta(&self) -> &LedgerMeta {
        &self.meta
    }

    pub fn last_add_confirmed(&self) -> Option<EntryId> {
        self.lac
    }

    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    pub fn is_writable(&self) -> bool {
        self.terminal.is_none() && !self.closing
    }

    pub fn is_done(&self) -> bool {
        self.terminal.is_some() && self.meta_op.is_none()
    }

    /// Why adds are refused now, if they are.
    pub fn refusal(&self) -> Option<WriteError> {
        match self.terminal {
            Some(Terminal::Fenced) => Some(WriteError::Fenced),
            Some(Terminal::Failed(error)) => Some(error),
            Some(Terminal::Closed) => Some(WriteError::Closed),
            None if self.closing => Some(WriteError::Closed),
            None => None,
        }
    }

    /// The live nodes replacements are chosen from (the shell refreshes it from registrations).
    pub fn set_live_nodes(&mut self, live: Vec<NodeInfo>) {
        self.live = live;
    }

    /// Stages the next entry; its outcome comes as `Acked` or `Failed`.
    pub fn add(
        &mut self,
        data: Bytes,
        now_ms: u64,
        out: &mut Vec<WriterAction>,
    ) -> Result<EntryId, WriteError> {
        if let Some(error) = self.refusal() {
            return Err(error);
        }
        let entry = self.next_entry;
        self.next_entry += 1;
        self.last_add_ms = now_ms;
        self.pending.push_back(Pending {
            entry,
            data,
            acked: BTreeSet::new(),
            asked: BTreeSet::new(),
        });
        let ensemble = self.meta.ensemble_for(entry).to_vec();
        for node in ensemble {
            if !self.failed.contains(&node) {
                self.send_add(node, self.pending.len() - 1, now_ms, out);
            }
        }
        Ok(entry)
    }

    /// No more adds; closes the ledger once every pending add is acknowledged or failed.
    pub fn close(&mut self, out: &mut Vec<WriterAction>) {
        self.closing = true;
        self.maybe_close(out);
    }

    fn send_add(&mut self, node: NodeId, index: usize, now_ms: u64, out: &mut Vec<WriterAction>) {
        let pending = &mut self.pending[index];
        pending.asked.insert(node);
        let request = self.next_request;
        self.next_request += 1;
        self.in_flight.insert(request, InFlight { node, entry: pending.entry, sent_ms: now_ms });
        out.push(WriterAction::Send {
            to: node,
            request,
            body: Request::Add {
                ledger: self.ledger,
                entry: pending.entry,
                epoch: self.meta.epoch,
                lac: self.lac,
                recovery: false,
                data: pending.data.clone(),
            },
        });
    }

    pub fn on_response(
        &mut self,
        from: NodeId,
        request: RequestId,
        response: Response,
        now_ms: u64,
        out: &mut Vec<WriterAction>,
    ) {
        let Some(sent) = self.in_flight.remove(&request) else {
            return; // abandoned when its node failed, or an explicit LAC's answer
        };
        assert_eq!(sent.node, from, "answers come from the node asked");
        if let Some(index) = self.index_of(sent.entry) {
            self.pending[index].asked.remove(&from);
        }
        match response {
            Response::Added { entry, .. } => {
                assert_eq!(entry, sent.entry);
                if let Some(index) = self.index_of(entry) {
                    self.pending[index].acked.insert(from);
                }
                self.try_ack(out);
            }
            Response::Error { code: ErrorCode::Fenced, .. } => self.fence(out),
            _ => self.on_node_failed(from, now_ms, out),
        }
    }

    /// `node` failed (error, time-out, lost connection): its requests are abandoned and it is
    /// replaced if the current ensemble holds it.
    pub fn on_node_failed(&mut self, node: NodeId, now_ms: u64, out: &mut Vec<WriterAction>) {
        self.in_flight.retain(|_, sent| sent.node != node);
        for pending in &mut self.pending {
            pending.asked.remove(&node);
        }
        if self.terminal.is_some() || !self.meta.last_fragment().ensemble.contains(&node) {
            return;
        }
        self.failed.insert(node);
        if self.meta_op.is_none() {
            self.start_ensemble_change(now_ms, out);
        }
    }

    pub fn tick(&mut self, now_ms: u64, out: &mut Vec<WriterAction>) {
        let timed_out: BTreeSet<NodeId> = self
            .in_flight
            .values()
            .filter(|s| now_ms.saturating_sub(s.sent_ms) >= self.config.add_timeout_ms)
            .map(|s| s.node)
            .collect();
        for node in timed_out {
            self.on_node_failed(node, now_ms, out);
        }
        if self.no_replacement_since_ms.is_some()
            && self.meta_op.is_none()
            && self.terminal.is_none()
        {
            // Still waiting for a node to take a failed one's place: one may have registered.
            self.start_ensemble_change(now_ms, out);
        }
        let idle = now_ms.saturating_sub(self.last_add_ms) >= self.config.explicit_lac_after_ms;
        if idle && self.terminal.is_none() && self.lac > self.lac_sent {
            let lac = self.lac.expect("greater than None");
            self.lac_sent = self.lac;
            for node in self.meta.last_fragment().ensemble.clone() {
                let request = self.next_request;
                self.next_request += 1;
                let body = Request::WriteLac { ledger: self.ledger, lac };
                out.push(WriterAction::Send { to: node, request, body });
            }
        }
    }

    fn index_of(&self, entry: EntryId) -> Option<usize> {
        let first = self.pending.front()?.entry;
        let index = entry.checked_sub(first)? as usize;
        (index < self.pending.len()).then_some(index)
    }

    fn try_ack(&mut self, out: &mut Vec<WriterAction>) {
        if matches!(self.meta_op, Some(MetaOp::EnsembleChange(_))) || self.terminal.is_some() {
            return;
        }
        while let Some(front) = self.pending.front() {
            let ensemble = self.meta.ensemble_for(front.entry);
            let acks = ensemble.iter().filter(|n| front.acked.contains(n)).count();
            if acks < self.meta.ack_quorum as usize {
                break;
            }
            let entry = front.entry;
            assert_eq!(
                Some(entry),
                self.lac.map_or(Some(0), |l| l.checked_add(1)),
                "acks in order"
            );
            self.pending.pop_front();
            self.lac = Some(entry);
            out.push(WriterAction::Acked { entry });
        }
        self.maybe_close(out);
    }

    fn start_ensemble_change(&mut self, now_ms: u64, out: &mut Vec<WriterAction>) {
        assert!(self.meta_op.is_none());
        let last = self.meta.last_fragment().clone();
        let mut ensemble = last.ensemble.clone();
        let excluded: Vec<NodeId> = self.failed.iter().copied().collect();
        for slot in 0..ensemble.len() {
            if self.failed.contains(&ensemble[slot]) {
                let groups = self.meta.isolation.as_ref();
                match replacement_within(&self.live, groups, &ensemble, &excluded) {
                    Some(replacement) => ensemble[slot] = replacement,
                    None => {
                        let since = *self.no_replacement_since_ms.get_or_insert(now_ms);
                        if now_ms.saturating_sub(since) >= self.config.replacement_wait_ms {
                            self.no_replacement_since_ms = None;
                            return self
                                .fail_all(Terminal::Failed(WriteError::NotEnoughNodes), out);
                        }
                        return; // tried again at each tick
                    }
                }
            }
        }
        self.no_replacement_since_ms = None;
        let first_entry = self.lac.map_or(0, |l| l + 1);
        assert!(first_entry >= last.first_entry, "LAC never goes below the last fragment");
        let mut proposed = self.meta.clone();
        if first_entry == last.first_entry {
            proposed.fragments.last_mut().expect("one at least").ensemble = ensemble;
        } else {
            proposed.fragments.push(Fragment { first_entry, ensemble });
        }
        self.meta.validate_successor(&proposed).expect("an ensemble change is a valid successor");
        self.meta_op = Some(MetaOp::EnsembleChange(proposed.clone()));
        out.push(WriterAction::WriteMeta { meta: proposed, expected_version: self.version });
    }

    fn maybe_close(&mut self, out: &mut Vec<WriterAction>) {
        let failed_writer = matches!(self.terminal, Some(Terminal::Failed(_)));
        if !self.closing || self.meta_op.is_some() || !self.pending.is_empty() {
            return;
        }
        if self.terminal.is_some() && !failed_writer {
            return;
        }
        let mut proposed = self.meta.clone();
        proposed.state = LedgerState::Closed;
        proposed.last_entry_id = self.lac;
        self.meta.validate_successor(&proposed).expect("closing is a valid successor");
        self.meta_op = Some(MetaOp::Close(proposed.clone()));
        out.push(WriterAction::WriteMeta { meta: proposed, expected_version: self.version });
    }

    pub fn on_meta_written(&mut self, result: MetaWrite, now_ms: u64, out: &mut Vec<WriterAction>) {
        let Some(op) = self.meta_op.clone() else {
            return;
        };
        let proposed = match &op {
            MetaOp::EnsembleChange(meta) | MetaOp::Close(meta) => meta,
        };
        match result {
            MetaWrite::Written(version) => self.meta_applied(op, version, now_ms, out),
            MetaWrite::Conflict { current, version } if *current == *proposed => {
                self.meta_applied(op, version, now_ms, out)
            }
            MetaWrite::Conflict { current, .. } => self.meta_lost(&current, out),
            MetaWrite::Unknown => out.push(WriterAction::ReadMeta),
        }
    }

    pub fn on_meta_read(
        &mut self,
        current: LedgerMeta,
        version: u64,
        now_ms: u64,
        out: &mut Vec<WriterAction>,
    ) {
        let Some(op) = self.meta_op.clone() else {
            return;
        };
        let proposed = match &op {
            MetaOp::EnsembleChange(meta) | MetaOp::Close(meta) => meta.clone(),
        };
        if current == proposed {
            self.meta_applied(op, version, now_ms, out);
        } else if version == self.version {
            out.push(WriterAction::WriteMeta { meta: proposed, expected_version: self.version });
        } else {
            self.meta_lost(&current, out);
        }
    }

    fn meta_applied(&mut self, op: MetaOp, version: u64, now_ms: u64, out: &mut Vec<WriterAction>) {
        assert!(version > self.version, "versions only grow");
        self.meta_op = None;
        self.version = version;
        match op {
            MetaOp::Close(meta) => {
                self.meta = meta;
                self.terminal = Some(Terminal::Closed);
                out.push(WriterAction::Closed { last_entry: self.lac });
            }
            MetaOp::EnsembleChange(meta) => {
                self.meta = meta;
                let ensemble = self.meta.last_fragment().ensemble.clone();
                self.failed.retain(|n| ensemble.contains(n));
                // What the replacements lack: every pending entry (all at or after the new
                // fragment's start).
                for index in 0..self.pending.len() {
                    for &node in &ensemble {
                        let pending = &self.pending[index];
                        if !pending.asked.contains(&node)
                            && !pending.acked.contains(&node)
                            && !self.failed.contains(&node)
                        {
                            self.send_add(node, index, now_ms, out);
                        }
                    }
                }
                if !self.failed.is_empty() {
                    self.start_ensemble_change(now_ms, out);
                } else {
                    self.try_ack(out);
                }
            }
        }
    }

    fn meta_lost(&mut self, current: &LedgerMeta, out: &mut Vec<WriterAction>) {
        self.meta_op = None;
        if current.state == LedgerState::Closed && self.closing && self.pending.is_empty() {
            // A recovery closed it meanwhile; it covers everything this writer acknowledged.
            self.terminal = Some(Terminal::Closed);
            out.push(WriterAction::Closed { last_entry: current.last_entry_id });
            return;
        }
        self.fence(out);
    }

    fn fence(&mut self, out: &mut Vec<WriterAction>) {
        self.fail_all(Terminal::Fenced, out);
    }

    fn fail_all(&mut self, terminal: Terminal, out: &mut Vec<WriterAction>) {
        if self.terminal.is_some()
            && self.terminal != Some(Terminal::Failed(WriteError::NotEnoughNodes))
        {
            return;
        }
        let error = match terminal {
            Terminal::Fenced => WriteError::Fenced,
            Terminal::Failed(error) => error,
            Terminal::Closed => WriteError::Closed,
        };
        self.terminal = Some(terminal);
        self.in_flight.clear();
        for pending in self.pending.drain(..) {
            out.push(WriterAction::Failed { entry: pending.entry, error });
        }
        if terminal == Terminal::Fenced {
            self.meta_op = None;
        }
        self.maybe_close(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEDGER: LedgerId = 7;

    fn adds(out: &[WriterAction]) -> Vec<(NodeId, RequestId, EntryId)> {
        out.iter()
            .filter_map(|action| match action {
                WriterAction::Send { to, request, body: Request::Add { entry, .. } } => {
                    Some((*to, *request, *entry))
                }
                _ => None,
            })
            .collect()
    }

    fn explicit_lacs(out: &[WriterAction]) -> Vec<(NodeId, EntryId)> {
        out.iter()
            .filter_map(|action| match action {
                WriterAction::Send { to, body: Request::WriteLac { lac, .. }, .. } => {
                    Some((*to, *lac))
                }
                _ => None,
            })
            .collect()
    }

    /// Adds an entry at `now_ms` and has every node answer `Added`; it is acknowledged.
    fn add_and_ack(writer: &mut Writer, now_ms: u64) -> EntryId {
        let mut out = Vec::new();
        let entry = writer.add(Bytes::from_static(b"entry"), now_ms, &mut out).unwrap();
        let sent = adds(&out);
        assert_eq!(sent.len(), 2, "{out:?}");
        out.clear();
        for (node, request, _) in sent {
            let added = Response::Added { ledger: LEDGER, entry };
            writer.on_response(node, request, added, now_ms, &mut out);
        }
        assert!(out.contains(&WriterAction::Acked { entry }), "{out:?}");
        entry
    }

    #[test]
    fn an_idle_writer_sends_each_new_lac_once_to_the_last_fragment_s_nodes() {
        let meta = LedgerMeta::new(vec![NodeId(1), NodeId(2)], 2, 2);
        let mut writer = Writer::new(LEDGER, meta, 1, WriterConfig::default());
        let mut out = Vec::new();
        writer.tick(5_000, &mut out);
        assert!(explicit_lacs(&out).is_empty(), "no entry, no LAC to send");

        assert_eq!(add_and_ack(&mut writer, 10_000), 0);
        writer.tick(10_999, &mut out);
        assert!(explicit_lacs(&out).is_empty(), "not idle yet: {out:?}");
        writer.tick(11_000, &mut out);
        assert_eq!(explicit_lacs(&out), [(NodeId(1), 0), (NodeId(2), 0)]);
        out.clear();
        writer.tick(20_000, &mut out);
        assert!(explicit_lacs(&out).is_empty(), "the same LAC is sent once: {out:?}");

        assert_eq!(add_and_ack(&mut writer, 30_000), 1);
        writer.tick(31_000, &mut out);
        assert_eq!(explicit_lacs(&out), [(NodeId(1), 1), (NodeId(2), 1)]);
    }
}
