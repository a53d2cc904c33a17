//! One fragment's entries copied to its replacement (BookKeeper's `LedgerFragmentReplicator`):
//! each entry read from a survivor (the next survivor when one has it not or fails), written to
//! the replacement with a recovery add carrying the last-add-confirmed the survivor holds, below
//! the entry (never more than what was confirmed: a node's LAC stays at or below the
//! acknowledged entries; and the wire takes no LAC at or above its entry)
//! (accepted by a fenced ledger at the ledger's epoch; a CLOSED ledger was fenced by its
//! recovery), strictly in entry order: a storage node keeps one run of entries per ledger, so an
//! entry past the next one would be refused. Up to `window` entries are read ahead. A request
//! unanswered for `timeout_ms` (a node down, a message lost) is asked again: a read of the next
//! survivor, an add of the replacement (the same bytes again are answered as stored), a few
//! rounds at most. The copy is done when the replacement has acknowledged every entry; only then
//! may the shell swap it into the metadata.

use std::collections::BTreeMap;

use bytes::Bytes;
use magnetar_replication::{EntryId, Epoch, LedgerId, NodeId, Request, Response};

use crate::plan::Transfer;

/// Rounds over the survivors (reads) or sends (adds) before a copy gives up on an entry.
const ATTEMPTS: u32 = 3;

/// What the shell is to do for the copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyAction {
    /// Send `request` to `to`; report its answer with [`FragmentCopy::on_read`] (reads) or
    /// [`FragmentCopy::on_added`] (adds), `None` when the connection failed; call
    /// [`FragmentCopy::tick`] now and then (unanswered requests are asked again).
    Send { to: NodeId, request: Request },
    /// Every entry is on the replacement.
    Done,
    /// The copy cannot finish (no survivor has an entry, or the replacement refused an add):
    /// the ledger is planned again later.
    Failed(String),
}

/// A read under way: which survivor was asked last, how many times the entry was asked, when.
#[derive(Debug, Clone, Copy)]
struct Asked {
    survivor: usize,
    times: u32,
    at_ms: u64,
}

#[derive(Debug)]
pub struct FragmentCopy {
    ledger: LedgerId,
    epoch: Epoch,
    to: NodeId,
    from: Vec<NodeId>,
    /// Entries still to read: the next to ask for, and the end (inclusive).
    next_read: EntryId,
    last: EntryId,
    window: u64,
    timeout_ms: u64,
    reading: BTreeMap<EntryId, Asked>,
    /// Read, waiting for their turn to be added: the bytes and the survivor's LAC.
    read: BTreeMap<EntryId, (Bytes, Option<EntryId>)>,
    /// The next entry to add, and its add under way (the request, times sent, when).
    next_add: EntryId,
    adding: Option<(Request, u32, u64)>,
    finished: bool,
}

impl FragmentCopy {
    /// A copy of `transfer` of ledger `ledger` at `epoch` (a fragment without entries is done
    /// at once), at `now_ms`. Pushes the first reads.
    pub fn start(
        ledger: LedgerId,
        epoch: Epoch,
        transfer: &Transfer,
        window: u64,
        timeout_ms: u64,
        now_ms: u64,
        out: &mut Vec<CopyAction>,
    ) -> FragmentCopy {
        let (first, last) = transfer.entries.unwrap_or((1, 0));
        let mut copy = FragmentCopy {
            ledger,
            epoch,
            to: transfer.to,
            from: transfer.from.clone(),
            next_read: first,
            last,
            window: window.max(1),
            timeout_ms,
            reading: BTreeMap::new(),
            read: BTreeMap::new(),
            next_add: first,
            adding: None,
            finished: false,
        };
        if transfer.entries.is_none() {
            copy.finish(CopyAction::Done, out);
        } else if copy.from.is_empty() {
            copy.finish(CopyAction::Failed("no survivor to copy from".into()), out);
        } else {
            copy.read_ahead(now_ms, out);
        }
        copy
    }

    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// The answer of `from` to a read of `entry` (`None`: the connection failed).
    pub fn on_read(
        &mut self,
        from: NodeId,
        entry: EntryId,
        answer: Option<Response>,
        now_ms: u64,
        out: &mut Vec<CopyAction>,
    ) {
        let Some(&asked) = self.reading.get(&entry) else { return };
        if self.finished {
            return;
        }
        match answer {
            // Any survivor's copy is the entry (a late answer of one asked before too).
            Some(Response::Entry { ledger, entry: got, data, lac })
                if ledger == self.ledger && got == entry =>
            {
                self.reading.remove(&entry);
                self.read.insert(entry, (data, lac));
                self.add_next(now_ms, out);
                self.read_ahead(now_ms, out);
            }
            // Not there, an error, or no answer from the survivor asked last: the next one.
            _ if self.from.get(asked.survivor) == Some(&from) => {
                self.ask_next_survivor(entry, asked, now_ms, out)
            }
            _ => {}
        }
    }

    /// The replacement's answer to the add of `entry` (`None`: the connection failed, and the
    /// add is sent again at a tick).
    pub fn on_added(
        &mut self,
        entry: EntryId,
        answer: Option<Response>,
        now_ms: u64,
        out: &mut Vec<CopyAction>,
    ) {
        if self.finished || self.adding.is_none() || entry != self.next_add {
            return;
        }
        let Some(answer) = answer else { return };
        self.adding = None;
        match answer {
            Response::Added { ledger, entry: got } if ledger == self.ledger && got == entry => {
                if entry == self.last {
                    self.finish(CopyAction::Done, out);
                    return;
                }
                self.next_add = entry + 1;
                self.add_next(now_ms, out);
                self.read_ahead(now_ms, out);
            }
            other => {
                let why = format!(
                    "{} refused entry {entry} of ledger {}: {other:?}",
                    self.to, self.ledger
                );
                self.finish(CopyAction::Failed(why), out);
            }
        }
    }

    /// Asks again what went unanswered for `timeout_ms`: reads of the next survivor, the add
    /// of the replacement.
    pub fn tick(&mut self, now_ms: u64, out: &mut Vec<CopyAction>) {
        let overdue: Vec<(EntryId, Asked)> = self
            .reading
            .iter()
            .filter(|(_, asked)| now_ms.saturating_sub(asked.at_ms) >= self.timeout_ms)
            .map(|(entry, asked)| (*entry, *asked))
            .collect();
        for (entry, asked) in overdue {
            if self.finished {
                return;
            }
            self.ask_next_survivor(entry, asked, now_ms, out);
        }
        let Some((request, times, at_ms)) = &mut self.adding else { return };
        if self.finished || now_ms.saturating_sub(*at_ms) < self.timeout_ms {
            return;
        }
        if *times >= ATTEMPTS {
            let why = format!("{} did not acknowledge entry {}", self.to, self.next_add);
            self.finish(CopyAction::Failed(why), out);
            return;
        }
        *times += 1;
        *at_ms = now_ms;
        out.push(CopyAction::Send { to: self.to, request: request.clone() });
    }

    fn ask_next_survivor(
        &mut self,
        entry: EntryId,
        asked: Asked,
        now_ms: u64,
        out: &mut Vec<CopyAction>,
    ) {
        if asked.times >= ATTEMPTS * self.from.len() as u32 {
            let why = format!("no survivor could read entry {entry} of ledger {}", self.ledger);
            self.finish(CopyAction::Failed(why), out);
            return;
        }
        let survivor = (asked.survivor + 1) % self.from.len();
        self.reading.insert(entry, Asked { survivor, times: asked.times + 1, at_ms: now_ms });
        out.push(self.read_request(self.from[survivor], entry));
    }

    fn read_ahead(&mut self, now_ms: u64, out: &mut Vec<CopyAction>) {
        while self.next_read <= self.last
            && self.next_read < self.next_add.saturating_add(self.window)
        {
            let entry = self.next_read;
            self.reading.insert(entry, Asked { survivor: 0, times: 1, at_ms: now_ms });
            out.push(self.read_request(self.from[0], entry));
            self.next_read += 1;
        }
    }

    fn add_next(&mut self, now_ms: u64, out: &mut Vec<CopyAction>) {
        if self.adding.is_some() {
            return;
        }
        let Some((data, lac)) = self.read.remove(&self.next_add) else { return };
        // A piggybacked LAC is below its entry (the wire refuses any other).
        let entry = self.next_add;
        let lac = lac.and_then(|lac| entry.checked_sub(1).map(|below| lac.min(below)));
        let request = Request::Add {
            ledger: self.ledger,
            entry,
            epoch: self.epoch,
            lac,
            recovery: true,
            data,
        };
        self.adding = Some((request.clone(), 1, now_ms));
        out.push(CopyAction::Send { to: self.to, request });
    }

    fn read_request(&self, to: NodeId, entry: EntryId) -> CopyAction {
        CopyAction::Send { to, request: Request::Read { ledger: self.ledger, entry, fence: None } }
    }

    fn finish(&mut self, how: CopyAction, out: &mut Vec<CopyAction>) {
        assert!(!self.finished, "a copy finishes once");
        self.finished = true;
        self.reading.clear();
        self.read.clear();
        self.adding = None;
        out.push(how);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use magnetar_replication::ErrorCode;

    const LEDGER: LedgerId = 9;

    fn transfer(first: EntryId, last: EntryId) -> Transfer {
        Transfer {
            fragment: 0,
            lost: NodeId(1),
            to: NodeId(4),
            from: vec![NodeId(2), NodeId(3)],
            entries: Some((first, last)),
        }
    }

    fn entry(e: EntryId) -> Option<Response> {
        Some(Response::Entry { ledger: LEDGER, entry: e, lac: Some(12), data: data(e) })
    }

    fn data(e: EntryId) -> Bytes {
        Bytes::from(format!("entry-{e}"))
    }

    fn added(e: EntryId) -> Option<Response> {
        Some(Response::Added { ledger: LEDGER, entry: e })
    }

    fn sends(out: &mut Vec<CopyAction>) -> Vec<(NodeId, Request)> {
        out.drain(..)
            .map(|a| match a {
                CopyAction::Send { to, request } => (to, request),
                other => panic!("not a send: {other:?}"),
            })
            .collect()
    }

    fn read(to: u64, e: EntryId) -> (NodeId, Request) {
        (NodeId(to), Request::Read { ledger: LEDGER, entry: e, fence: None })
    }

    fn add(e: EntryId) -> (NodeId, Request) {
        let request = Request::Add {
            ledger: LEDGER,
            entry: e,
            epoch: 3,
            lac: e.checked_sub(1).map(|below| below.min(12)),
            recovery: true,
            data: data(e),
        };
        (NodeId(4), request)
    }

    #[test]
    fn entries_are_read_ahead_and_added_in_order() {
        let mut out = Vec::new();
        let mut copy = FragmentCopy::start(LEDGER, 3, &transfer(10, 12), 2, 100, 0, &mut out);
        assert_eq!(sends(&mut out), vec![read(2, 10), read(2, 11)]);
        // 11 arrives first: held until 10 is added.
        copy.on_read(NodeId(2), 11, entry(11), 1, &mut out);
        assert!(out.is_empty());
        copy.on_read(NodeId(2), 10, entry(10), 1, &mut out);
        assert_eq!(sends(&mut out), vec![add(10)]);
        copy.on_added(10, added(10), 2, &mut out);
        assert_eq!(sends(&mut out), vec![add(11), read(2, 12)]);
        copy.on_read(NodeId(2), 12, entry(12), 3, &mut out);
        assert!(out.is_empty(), "one add at a time");
        copy.on_added(11, added(11), 4, &mut out);
        assert_eq!(sends(&mut out), vec![add(12)]);
        copy.on_added(12, added(12), 5, &mut out);
        assert_eq!(out, vec![CopyAction::Done]);
        assert!(copy.is_finished());
    }

    #[test]
    fn a_survivor_without_the_entry_hands_over_to_the_next() {
        let mut out = Vec::new();
        let mut copy = FragmentCopy::start(LEDGER, 3, &transfer(5, 5), 4, 100, 0, &mut out);
        assert_eq!(sends(&mut out), vec![read(2, 5)]);
        let missing = Some(Response::NoEntry { ledger: LEDGER, entry: 5, lac: None });
        copy.on_read(NodeId(2), 5, missing, 1, &mut out);
        assert_eq!(sends(&mut out), vec![read(3, 5)]);
        copy.on_read(NodeId(2), 5, None, 2, &mut out);
        assert!(out.is_empty(), "a failure of a survivor no longer asked changes nothing");
        copy.on_read(NodeId(3), 5, entry(5), 3, &mut out);
        assert_eq!(sends(&mut out), vec![add(5)]);
    }

    #[test]
    fn unanswered_requests_are_asked_again_at_a_tick() {
        let mut out = Vec::new();
        let mut copy = FragmentCopy::start(LEDGER, 3, &transfer(0, 0), 4, 100, 0, &mut out);
        assert_eq!(sends(&mut out), vec![read(2, 0)]);
        copy.tick(99, &mut out);
        assert!(out.is_empty(), "not yet overdue");
        copy.tick(100, &mut out);
        assert_eq!(sends(&mut out), vec![read(3, 0)], "the next survivor");
        copy.on_read(NodeId(3), 0, entry(0), 150, &mut out);
        assert_eq!(sends(&mut out), vec![add(0)]);
        copy.on_added(0, None, 160, &mut out);
        assert!(out.is_empty(), "a lost connection waits for the tick");
        copy.tick(250, &mut out);
        assert_eq!(sends(&mut out), vec![add(0)], "the same add again");
        copy.tick(350, &mut out);
        assert_eq!(sends(&mut out), vec![add(0)]);
        copy.tick(450, &mut out);
        assert!(matches!(out.as_slice(), [CopyAction::Failed(why)] if why.contains("entry 0")));
    }

    #[test]
    fn every_survivor_failing_or_the_replacement_refusing_fails_the_copy() {
        let mut out = Vec::new();
        let mut copy = FragmentCopy::start(LEDGER, 3, &transfer(0, 3), 1, 100, 0, &mut out);
        let mut asked = sends(&mut out)[0].0;
        for now in 1..=10 {
            copy.on_read(asked, 0, None, now, &mut out);
            if copy.is_finished() {
                break;
            }
            asked = sends(&mut out)[0].0;
        }
        assert!(copy.is_finished(), "three rounds over both survivors, then given up");
        assert!(matches!(out.as_slice(), [CopyAction::Failed(why)] if why.contains("entry 0")));

        let mut out = Vec::new();
        let mut copy = FragmentCopy::start(LEDGER, 3, &transfer(0, 3), 1, 100, 0, &mut out);
        out.clear();
        copy.on_read(NodeId(2), 0, entry(0), 1, &mut out);
        out.clear();
        let refused = Some(Response::Error { ledger: LEDGER, code: ErrorCode::Io });
        copy.on_added(0, refused, 2, &mut out);
        assert!(matches!(out.as_slice(), [CopyAction::Failed(_)]));
        copy.on_read(NodeId(2), 1, entry(1), 3, &mut out);
        copy.tick(1_000, &mut out);
        assert_eq!(out.len(), 1, "nothing more once failed");
    }

    #[test]
    fn a_fragment_without_entries_is_done_at_once() {
        let mut out = Vec::new();
        let mut empty = transfer(0, 0);
        empty.entries = None;
        let copy = FragmentCopy::start(LEDGER, 3, &empty, 8, 100, 0, &mut out);
        assert_eq!(out, vec![CopyAction::Done]);
        assert!(copy.is_finished());
    }
}
