//! What a ledger client (writer, recovery, reader) and a storage node say to each other. The
//! wire encoding (length-prefixed, CRC-checked frames) belongs to the shells; these are the
//! decisions' vocabulary. Every request carries an id its response echoes, so requests are
//! pipelined on one connection.

use crate::{EntryId, Epoch, LedgerId};
use bytes::Bytes;

pub type RequestId = u64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Store `entry`. `lac` is the writer's last-add-confirmed when it sent this (piggybacked).
    /// A `recovery` add is accepted by a fenced ledger if `epoch` is at least the fence's.
    Add {
        ledger: LedgerId,
        entry: EntryId,
        epoch: Epoch,
        lac: Option<EntryId>,
        recovery: bool,
        data: Bytes,
    },
    /// Read `entry`; with `fence`, fence the ledger at that epoch first (recovery reads).
    Read { ledger: LedgerId, entry: EntryId, fence: Option<Epoch> },
    /// The node's last-add-confirmed and last stored entry; with `fence`, fence first.
    ReadLac { ledger: LedgerId, fence: Option<Epoch> },
    /// The writer's last-add-confirmed, sent when it has been idle (explicit LAC).
    WriteLac { ledger: LedgerId, lac: EntryId },
}

impl Request {
    pub fn ledger(&self) -> LedgerId {
        match self {
            Request::Add { ledger, .. }
            | Request::Read { ledger, .. }
            | Request::ReadLac { ledger, .. }
            | Request::WriteLac { ledger, .. } => *ledger,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// The ledger is fenced: a normal add, or a recovery add or fence of an older epoch.
    Fenced,
    /// The node could not store or read (disk error, full disk, shutting down).
    Io,
    /// The entry is stored with other bytes (a bug somewhere: never overwritten).
    Conflict,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    Added {
        ledger: LedgerId,
        entry: EntryId,
    },
    Entry {
        ledger: LedgerId,
        entry: EntryId,
        lac: Option<EntryId>,
        data: Bytes,
    },
    NoEntry {
        ledger: LedgerId,
        entry: EntryId,
        lac: Option<EntryId>,
    },
    /// `lac`: the highest last-add-confirmed the node has heard; `last_entry`: its highest
    /// stored entry.
    Lac {
        ledger: LedgerId,
        lac: Option<EntryId>,
        last_entry: Option<EntryId>,
    },
    LacWritten {
        ledger: LedgerId,
    },
    Error {
        ledger: LedgerId,
        code: ErrorCode,
    },
}
