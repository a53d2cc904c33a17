//! A storage node's decisions. The shell owns the log (the journal, or the simulator's disk):
//! it appends the records this core asks for, reports each one durable **in the order they
//! were asked for** (one log, synced in order), and answers reads from durable data only.
//!
//! Rules (BookKeeper's `BookieImpl`):
//! * an add is answered only once its record is durable;
//! * a fence takes effect at once for every later request (normal adds are refused from the
//!   moment it arrives), and is answered only once its record is durable; records asked for
//!   before it are durable by then too, so a fencing read sees every add this node ever
//!   acknowledged;
//! * a fenced ledger takes recovery adds of the fence's epoch or a newer one, nothing else;
//! * fencing a ledger the node has never seen creates it fenced (a late add from the old
//!   writer must find it fenced);
//! * a deleted ledger the node collected is forgotten, unless it is fenced here: its fence
//!   stays, so an old writer that wakes up after the ledger's recovery and deletion still
//!   finds it fenced on the nodes that fenced it. Fences come from recoveries only (a writer
//!   closes its ledgers without one), so what stays grows with recoveries, not with ledgers.

use crate::message::{ErrorCode, Request, RequestId, Response};
use crate::{EntryId, Epoch, LedgerId};
use bytes::Bytes;
use std::collections::BTreeMap;

/// Who sent a request: the shell's connection id.
pub type Peer = u64;
/// Names a record the core asked the shell to persist.
pub type Token = u64;

/// What the node's log holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Entry { ledger: LedgerId, entry: EntryId, lac: Option<EntryId>, recovery: bool, data: Bytes },
    Fence { ledger: LedgerId, epoch: Epoch },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeAction {
    /// Append `record` to the log; call [`NodeCore::persisted`] with `token` once it is
    /// durable (or failed). A second entry record for a stored entry is `Ok` if its bytes are
    /// the same, `Err(Conflict)` otherwise; it is never overwritten.
    Persist {
        token: Token,
        record: Record,
    },
    Reply {
        peer: Peer,
        request: RequestId,
        response: Response,
    },
    /// Read the durable `entry` and reply `Entry` (with `lac`) or `NoEntry`, or `Error(Io)`.
    ReadAndReply {
        peer: Peer,
        request: RequestId,
        ledger: LedgerId,
        entry: EntryId,
        lac: Option<EntryId>,
    },
}

/// What a durable log says about one ledger, for [`NodeCore::restore`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LedgerSummary {
    pub fence_epoch: Option<Epoch>,
    pub lac: Option<EntryId>,
    pub last_entry: Option<EntryId>,
}

impl LedgerSummary {
    /// Folds one durable record into the summary (records in log order).
    pub fn apply(&mut self, record: &Record) {
        match *record {
            Record::Entry { entry, lac, .. } => {
                self.last_entry = self.last_entry.max(Some(entry));
                self.lac = self.lac.max(lac);
            }
            Record::Fence { epoch, .. } => self.fence_epoch = self.fence_epoch.max(Some(epoch)),
        }
    }
}

#[derive(Debug)]
enum AfterPersist {
    Added { peer: Peer, request: RequestId, ledger: LedgerId, entry: EntryId, lac: Option<EntryId> },
    Fenced { peer: Peer, request: RequestId, ledger: LedgerId, then: FencedThen },
}

#[derive(Debug)]
enum FencedThen {
    Read(EntryId),
    ReadLac,
}

#[derive(Debug, Default)]
pub struct NodeCore {
    ledgers: BTreeMap<LedgerId, LedgerSummary>,
    waiting: BTreeMap<Token, AfterPersist>,
    next_token: Token,
}

impl NodeCore {
    pub fn new() -> NodeCore {
        NodeCore::default()
    }

    /// Rebuilds the state of a restarted node from its durable log.
    pub fn restore(ledgers: BTreeMap<LedgerId, LedgerSummary>) -> NodeCore {
        NodeCore { ledgers, ..NodeCore::default() }
    }

    pub fn summary(&self, ledger: LedgerId) -> LedgerSummary {
        self.ledgers.get(&ledger).copied().unwrap_or_default()
    }

    pub fn is_fenced(&self, ledger: LedgerId) -> bool {
        self.summary(ledger).fence_epoch.is_some()
    }

    /// How many ledgers the node keeps state for.
    pub fn ledgers(&self) -> usize {
        self.ledgers.len()
    }

    /// The ledger was deleted and its entries freed here (garbage collection): forget it, but
    /// for its fence. An add still in flight for it re-creates its state when it completes
    /// (its run is collected again by the next pass).
    pub fn collect(&mut self, ledger: LedgerId) {
        match self.ledgers.get(&ledger).and_then(|s| s.fence_epoch) {
            Some(fence_epoch) => {
                self.ledgers.insert(
                    ledger,
                    LedgerSummary { fence_epoch: Some(fence_epoch), ..LedgerSummary::default() },
                );
            }
            None => {
                self.ledgers.remove(&ledger);
            }
        }
    }

    pub fn handle(
        &mut self,
        peer: Peer,
        request: RequestId,
        req: Request,
        out: &mut Vec<NodeAction>,
    ) {
        let reply = |out: &mut Vec<NodeAction>, response| {
            out.push(NodeAction::Reply { peer, request, response })
        };
        if !ids_in_range(&req) {
            // No writer gets near the last id; the shell's arithmetic (`entry + 1`) may rely
            // on it. Refused like an add the node cannot store.
            reply(out, Response::Error { ledger: req.ledger(), code: ErrorCode::Io });
            return;
        }
        match req {
            Request::Add { ledger, entry, epoch, lac, recovery, data } => {
                let state = self.ledgers.entry(ledger).or_default();
                let refused = match state.fence_epoch {
                    None => false,
                    Some(fence) => !recovery || epoch < fence,
                };
                if refused {
                    reply(out, Response::Error { ledger, code: ErrorCode::Fenced });
                    return;
                }
                let token = self.persist(Record::Entry { ledger, entry, lac, recovery, data }, out);
                self.waiting
                    .insert(token, AfterPersist::Added { peer, request, ledger, entry, lac });
            }
            Request::Read { ledger, entry, fence: None } => {
                let lac = self.summary(ledger).lac;
                out.push(NodeAction::ReadAndReply { peer, request, ledger, entry, lac });
            }
            Request::ReadLac { ledger, fence: None } => {
                let s = self.summary(ledger);
                reply(out, Response::Lac { ledger, lac: s.lac, last_entry: s.last_entry });
            }
            Request::Read { ledger, entry, fence: Some(epoch) } => {
                self.fence(peer, request, ledger, epoch, FencedThen::Read(entry), out);
            }
            Request::ReadLac { ledger, fence: Some(epoch) } => {
                self.fence(peer, request, ledger, epoch, FencedThen::ReadLac, out);
            }
            Request::WriteLac { ledger, lac } => {
                // Kept only for a ledger the node has adds or a fence of: nothing reads a LAC
                // here otherwise, and a node must not keep state for any ledger id it is sent
                // (a late writer of a collected ledger, or a confused peer).
                if let Some(state) = self.ledgers.get_mut(&ledger) {
                    state.lac = state.lac.max(Some(lac));
                }
                reply(out, Response::LacWritten { ledger });
            }
        }
    }

    fn fence(
        &mut self,
        peer: Peer,
        request: RequestId,
        ledger: LedgerId,
        epoch: Epoch,
        then: FencedThen,
        out: &mut Vec<NodeAction>,
    ) {
        let state = self.ledgers.entry(ledger).or_default();
        if state.fence_epoch.is_some_and(|fence| epoch < fence) {
            out.push(NodeAction::Reply {
                peer,
                request,
                response: Response::Error { ledger, code: ErrorCode::Fenced },
            });
            return;
        }
        state.fence_epoch = Some(epoch);
        // Persisted again even when already fenced at this epoch: the answer must wait until
        // the fence and every add before it are durable, and the log syncs in order.
        let token = self.persist(Record::Fence { ledger, epoch }, out);
        self.waiting.insert(token, AfterPersist::Fenced { peer, request, ledger, then });
    }

    fn persist(&mut self, record: Record, out: &mut Vec<NodeAction>) -> Token {
        let token = self.next_token;
        self.next_token += 1;
        out.push(NodeAction::Persist { token, record });
        token
    }

    /// The record asked for with `token` is durable (`Ok`) or failed. Tokens complete in the
    /// order they were issued.
    pub fn persisted(
        &mut self,
        token: Token,
        result: Result<(), ErrorCode>,
        out: &mut Vec<NodeAction>,
    ) {
        let first = self.waiting.keys().next().copied();
        assert_eq!(first, Some(token), "persist completions come in log order");
        let after = self.waiting.remove(&token).expect("checked above");
        match after {
            AfterPersist::Added { peer, request, ledger, entry, lac } => {
                let response = match result {
                    Ok(()) => {
                        let state = self.ledgers.entry(ledger).or_default();
                        state.last_entry = state.last_entry.max(Some(entry));
                        state.lac = state.lac.max(lac);
                        Response::Added { ledger, entry }
                    }
                    Err(code) => Response::Error { ledger, code },
                };
                out.push(NodeAction::Reply { peer, request, response });
            }
            AfterPersist::Fenced { peer, request, ledger, then } => {
                if let Err(code) = result {
                    let response = Response::Error { ledger, code };
                    out.push(NodeAction::Reply { peer, request, response });
                    return;
                }
                let s = self.summary(ledger);
                assert!(s.fence_epoch.is_some(), "a fence is never lifted");
                match then {
                    FencedThen::Read(entry) => out.push(NodeAction::ReadAndReply {
                        peer,
                        request,
                        ledger,
                        entry,
                        lac: s.lac,
                    }),
                    FencedThen::ReadLac => out.push(NodeAction::Reply {
                        peer,
                        request,
                        response: Response::Lac { ledger, lac: s.lac, last_entry: s.last_entry },
                    }),
                }
            }
        }
    }

    /// Records whose outcome is still awaited (a shell that loses its log fails them all).
    pub fn in_flight(&self) -> usize {
        self.waiting.len()
    }
}

/// Whether the request's entry ids and LAC stay below `EntryId::MAX` (the one id no ledger can
/// reach, so `id + 1` never overflows on a node).
fn ids_in_range(req: &Request) -> bool {
    match *req {
        Request::Add { entry, lac, .. } => entry < EntryId::MAX && lac < Some(EntryId::MAX),
        Request::WriteLac { lac, .. } => lac < EntryId::MAX,
        Request::Read { .. } | Request::ReadLac { .. } => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(entry: EntryId, recovery: bool, epoch: Epoch) -> Request {
        Request::Add {
            ledger: 7,
            entry,
            epoch,
            lac: entry.checked_sub(1),
            recovery,
            data: Bytes::from(vec![entry as u8]),
        }
    }

    fn replies(out: &[NodeAction]) -> Vec<Response> {
        out.iter()
            .filter_map(|a| match a {
                NodeAction::Reply { response, .. } => Some(response.clone()),
                _ => None,
            })
            .collect()
    }

    fn tokens(out: &[NodeAction]) -> Vec<Token> {
        out.iter()
            .filter_map(|a| match a {
                NodeAction::Persist { token, .. } => Some(*token),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn an_add_is_answered_only_once_durable() {
        let mut node = NodeCore::new();
        let mut out = Vec::new();
        node.handle(1, 10, add(0, false, 0), &mut out);
        assert!(replies(&out).is_empty());
        let token = tokens(&out)[0];
        out.clear();
        node.persisted(token, Ok(()), &mut out);
        assert_eq!(replies(&out), vec![Response::Added { ledger: 7, entry: 0 }]);
        assert_eq!(node.summary(7).last_entry, Some(0));
    }

    #[test]
    fn a_fence_refuses_normal_adds_at_once_and_answers_once_durable() {
        let mut node = NodeCore::new();
        let mut out = Vec::new();
        node.handle(1, 1, add(0, false, 0), &mut out);
        node.handle(2, 2, Request::ReadLac { ledger: 7, fence: Some(1) }, &mut out);
        node.handle(1, 3, add(1, false, 0), &mut out);
        assert_eq!(replies(&out), vec![Response::Error { ledger: 7, code: ErrorCode::Fenced }]);
        let t = tokens(&out);
        out.clear();
        node.persisted(t[0], Ok(()), &mut out);
        node.persisted(t[1], Ok(()), &mut out);
        assert_eq!(
            replies(&out),
            vec![
                Response::Added { ledger: 7, entry: 0 },
                Response::Lac { ledger: 7, lac: None, last_entry: Some(0) }
            ]
        );
        // Recovery adds of the fence's epoch pass, older ones and older fences do not.
        out.clear();
        node.handle(2, 4, add(1, true, 0), &mut out);
        node.handle(3, 5, Request::Read { ledger: 7, entry: 0, fence: Some(0) }, &mut out);
        assert_eq!(replies(&out).len(), 2);
        assert!(replies(&out)
            .iter()
            .all(|r| matches!(r, Response::Error { code: ErrorCode::Fenced, .. })));
        out.clear();
        node.handle(2, 6, add(1, true, 1), &mut out);
        assert_eq!(tokens(&out).len(), 1);
    }

    #[test]
    fn fencing_an_unknown_ledger_creates_it_fenced() {
        let mut node = NodeCore::new();
        let mut out = Vec::new();
        node.handle(2, 1, Request::Read { ledger: 7, entry: 0, fence: Some(2) }, &mut out);
        assert!(node.is_fenced(7));
        node.handle(1, 2, add(0, false, 0), &mut out);
        assert_eq!(replies(&out), vec![Response::Error { ledger: 7, code: ErrorCode::Fenced }]);
    }

    #[test]
    fn restore_rebuilds_fence_and_lac_from_the_log() {
        let mut summary = LedgerSummary::default();
        summary.apply(&Record::Entry {
            ledger: 7,
            entry: 4,
            lac: Some(3),
            recovery: false,
            data: Bytes::new(),
        });
        summary.apply(&Record::Fence { ledger: 7, epoch: 2 });
        let node = NodeCore::restore(BTreeMap::from([(7, summary)]));
        assert_eq!(
            node.summary(7),
            LedgerSummary { fence_epoch: Some(2), lac: Some(3), last_entry: Some(4) }
        );
    }

    #[test]
    fn a_collected_ledger_is_forgotten_but_for_its_fence() {
        let mut node = NodeCore::new();
        let mut out = Vec::new();
        for (ledger, request) in [(7, 1), (8, 2)] {
            let add = Request::Add {
                ledger,
                entry: 0,
                epoch: 0,
                lac: None,
                recovery: false,
                data: Bytes::from_static(b"x"),
            };
            node.handle(1, request, add, &mut out);
        }
        node.handle(2, 3, Request::ReadLac { ledger: 8, fence: Some(1) }, &mut out);
        for token in tokens(&out) {
            node.persisted(token, Ok(()), &mut out);
        }
        assert_eq!(node.ledgers(), 2);
        node.collect(7);
        node.collect(8);
        node.collect(9); // never known: nothing to forget
        assert_eq!(node.ledgers(), 1, "only the fenced ledger stays");
        assert_eq!(node.summary(7), LedgerSummary::default());
        assert_eq!(node.summary(8), LedgerSummary { fence_epoch: Some(1), ..Default::default() });
        // The old writer of the fenced one, back after the deletion, is still refused.
        out.clear();
        let late = Request::Add {
            ledger: 8,
            entry: 1,
            epoch: 0,
            lac: Some(0),
            recovery: false,
            data: Bytes::from_static(b"y"),
        };
        node.handle(1, 4, late, &mut out);
        assert_eq!(replies(&out), vec![Response::Error { ledger: 8, code: ErrorCode::Fenced }]);
    }

    #[test]
    fn an_explicit_lac_is_kept_only_for_a_ledger_the_node_has() {
        let mut node = NodeCore::new();
        let mut out = Vec::new();
        node.handle(1, 1, Request::WriteLac { ledger: 9, lac: 4 }, &mut out);
        assert_eq!(replies(&out), vec![Response::LacWritten { ledger: 9 }]);
        assert_eq!(node.ledgers(), 0, "nothing kept for an unknown ledger");
        node.handle(1, 2, add(0, false, 0), &mut out);
        node.handle(1, 3, Request::WriteLac { ledger: 7, lac: 0 }, &mut out);
        assert_eq!(node.summary(7).lac, Some(0), "kept once the node has an add of it");
    }

    #[test]
    fn the_last_entry_id_is_refused_before_anything_is_stored() {
        let mut node = NodeCore::new();
        let mut out = Vec::new();
        node.handle(1, 1, add(u64::MAX, false, 0), &mut out);
        node.handle(1, 2, Request::WriteLac { ledger: 7, lac: u64::MAX }, &mut out);
        let mut lac_max = add(3, false, 0);
        if let Request::Add { lac, .. } = &mut lac_max {
            *lac = Some(u64::MAX);
        }
        node.handle(1, 3, lac_max, &mut out);
        assert!(tokens(&out).is_empty(), "nothing persisted: {out:?}");
        assert_eq!(replies(&out), vec![Response::Error { ledger: 7, code: ErrorCode::Io }; 3]);
        assert_eq!(node.ledgers(), 0, "no state kept for them");
    }

    #[test]
    #[should_panic(expected = "log order")]
    fn out_of_order_completions_are_a_bug() {
        let mut node = NodeCore::new();
        let mut out = Vec::new();
        node.handle(1, 1, add(0, false, 0), &mut out);
        node.handle(1, 2, add(1, false, 0), &mut out);
        let t = tokens(&out);
        node.persisted(t[1], Ok(()), &mut out);
    }
}
