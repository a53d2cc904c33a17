//! The storage protocol on the wire: length-prefixed, CRC-checked protobuf frames, pipelined
//! on one connection per client and node (requests carry ids their responses echo).
//!
//! ```text
//! +-----------+-------------+---------------------------+
//! | len: u32  | crc32c: u32 | body: protobuf `Frame`    |
//! +-----------+-------------+---------------------------+
//!   big-endian; len counts crc + body; crc32c covers the body
//! ```
//! The messages are declared here with prost's derive (no `.proto` file, no protoc). Decoding
//! never panics: a short buffer asks for more, anything malformed is a typed [`WireError`].

use crate::message::{ErrorCode, Request, RequestId, Response};
use crate::{EntryId, NodeId};
use bytes::{Buf, BufMut, BytesMut};
use prost::Message as _;

/// The largest body a frame may carry: an entry (the broker's 5 MiB message limit plus its
/// metadata) with room to spare.
pub const MAX_FRAME_BODY: usize = 16 * 1024 * 1024;
const HEADER: usize = 8;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("frame of {0} bytes is over the {MAX_FRAME_BODY}-byte limit")]
    TooLarge(usize),
    #[error("frame length {0} is shorter than its checksum")]
    TooShort(usize),
    #[error("frame checksum mismatch: header {expected:#010x}, body {actual:#010x}")]
    Checksum { expected: u32, actual: u32 },
    #[error("malformed frame: {0}")]
    Malformed(String),
}

/// What travels on a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Request(Request),
    Response(Response),
    /// Asks a node who it is and how full it is.
    StatusRequest,
    Status(NodeStatus),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    pub node: NodeId,
    pub free_bytes: u64,
    pub ledgers: u64,
}

/// Appends one frame to `out`.
pub fn encode(request: RequestId, message: &Message, out: &mut BytesMut) {
    let frame = proto::Frame { request, body: Some(proto::Body::from(message)) };
    let len = frame.encoded_len();
    assert!(len <= MAX_FRAME_BODY, "callers bound entry sizes below the frame limit");
    out.reserve(HEADER + len);
    out.put_u32((len + 4) as u32);
    let crc_at = out.len();
    out.put_u32(0);
    let body_at = out.len();
    frame.encode(out).expect("reserved enough");
    let crc = crc32c::crc32c(&out[body_at..]);
    out[crc_at..crc_at + 4].copy_from_slice(&crc.to_be_bytes());
}

/// Takes one whole frame off the front of `buf`; `Ok(None)` until one is there.
pub fn decode(buf: &mut BytesMut) -> Result<Option<(RequestId, Message)>, WireError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_be_bytes(buf[..4].try_into().expect("4 bytes")) as usize;
    if len < 4 {
        return Err(WireError::TooShort(len));
    }
    if len - 4 > MAX_FRAME_BODY {
        return Err(WireError::TooLarge(len - 4));
    }
    if buf.len() < 4 + len {
        buf.reserve(4 + len - buf.len());
        return Ok(None);
    }
    buf.advance(4);
    let expected = buf.get_u32();
    let body = buf.split_to(len - 4).freeze();
    let actual = crc32c::crc32c(&body);
    if actual != expected {
        return Err(WireError::Checksum { expected, actual });
    }
    let frame = proto::Frame::decode(body).map_err(|e| WireError::Malformed(e.to_string()))?;
    let body = frame.body.ok_or_else(|| WireError::Malformed("frame without a body".into()))?;
    Ok(Some((frame.request, Message::try_from(body)?)))
}

mod proto {
    use bytes::Bytes;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Frame {
        #[prost(uint64, tag = "1")]
        pub request: u64,
        #[prost(oneof = "Body", tags = "2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13")]
        pub body: Option<Body>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Body {
        #[prost(message, tag = "2")]
        Add(Add),
        #[prost(message, tag = "3")]
        Read(Read),
        #[prost(message, tag = "4")]
        ReadLac(ReadLac),
        #[prost(message, tag = "5")]
        WriteLac(WriteLac),
        #[prost(message, tag = "6")]
        StatusRequest(StatusRequest),
        #[prost(message, tag = "7")]
        Added(Added),
        #[prost(message, tag = "8")]
        Entry(Entry),
        #[prost(message, tag = "9")]
        NoEntry(NoEntry),
        #[prost(message, tag = "10")]
        Lac(Lac),
        #[prost(message, tag = "11")]
        LacWritten(LacWritten),
        #[prost(message, tag = "12")]
        Error(Error),
        #[prost(message, tag = "13")]
        Status(Status),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Add {
        #[prost(uint64, tag = "1")]
        pub ledger: u64,
        #[prost(uint64, tag = "2")]
        pub entry: u64,
        #[prost(uint64, tag = "3")]
        pub epoch: u64,
        #[prost(uint64, optional, tag = "4")]
        pub lac: Option<u64>,
        #[prost(bool, tag = "5")]
        pub recovery: bool,
        #[prost(bytes = "bytes", tag = "6")]
        pub data: Bytes,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Read {
        #[prost(uint64, tag = "1")]
        pub ledger: u64,
        #[prost(uint64, tag = "2")]
        pub entry: u64,
        #[prost(uint64, optional, tag = "3")]
        pub fence_epoch: Option<u64>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ReadLac {
        #[prost(uint64, tag = "1")]
        pub ledger: u64,
        #[prost(uint64, optional, tag = "2")]
        pub fence_epoch: Option<u64>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct WriteLac {
        #[prost(uint64, tag = "1")]
        pub ledger: u64,
        #[prost(uint64, tag = "2")]
        pub lac: u64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct StatusRequest {}

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Added {
        #[prost(uint64, tag = "1")]
        pub ledger: u64,
        #[prost(uint64, tag = "2")]
        pub entry: u64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Entry {
        #[prost(uint64, tag = "1")]
        pub ledger: u64,
        #[prost(uint64, tag = "2")]
        pub entry: u64,
        #[prost(uint64, optional, tag = "3")]
        pub lac: Option<u64>,
        #[prost(bytes = "bytes", tag = "4")]
        pub data: Bytes,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NoEntry {
        #[prost(uint64, tag = "1")]
        pub ledger: u64,
        #[prost(uint64, tag = "2")]
        pub entry: u64,
        #[prost(uint64, optional, tag = "3")]
        pub lac: Option<u64>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Lac {
        #[prost(uint64, tag = "1")]
        pub ledger: u64,
        #[prost(uint64, optional, tag = "2")]
        pub lac: Option<u64>,
        #[prost(uint64, optional, tag = "3")]
        pub last_entry: Option<u64>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LacWritten {
        #[prost(uint64, tag = "1")]
        pub ledger: u64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Error {
        #[prost(uint64, tag = "1")]
        pub ledger: u64,
        /// 1 fenced, 2 I/O, 3 conflict.
        #[prost(uint32, tag = "2")]
        pub code: u32,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Status {
        #[prost(uint64, tag = "1")]
        pub node: u64,
        #[prost(uint64, tag = "2")]
        pub free_bytes: u64,
        #[prost(uint64, tag = "3")]
        pub ledgers: u64,
    }
}

impl From<&Message> for proto::Body {
    fn from(message: &Message) -> proto::Body {
        use proto::Body as B;
        match message.clone() {
            Message::Request(Request::Add { ledger, entry, epoch, lac, recovery, data }) => {
                B::Add(proto::Add { ledger, entry, epoch, lac, recovery, data })
            }
            Message::Request(Request::Read { ledger, entry, fence }) => {
                B::Read(proto::Read { ledger, entry, fence_epoch: fence })
            }
            Message::Request(Request::ReadLac { ledger, fence }) => {
                B::ReadLac(proto::ReadLac { ledger, fence_epoch: fence })
            }
            Message::Request(Request::WriteLac { ledger, lac }) => {
                B::WriteLac(proto::WriteLac { ledger, lac })
            }
            Message::Response(Response::Added { ledger, entry }) => {
                B::Added(proto::Added { ledger, entry })
            }
            Message::Response(Response::Entry { ledger, entry, lac, data }) => {
                B::Entry(proto::Entry { ledger, entry, lac, data })
            }
            Message::Response(Response::NoEntry { ledger, entry, lac }) => {
                B::NoEntry(proto::NoEntry { ledger, entry, lac })
            }
            Message::Response(Response::Lac { ledger, lac, last_entry }) => {
                B::Lac(proto::Lac { ledger, lac, last_entry })
            }
            Message::Response(Response::LacWritten { ledger }) => {
                B::LacWritten(proto::LacWritten { ledger })
            }
            Message::Response(Response::Error { ledger, code }) => {
                let code = match code {
                    ErrorCode::Fenced => 1,
                    ErrorCode::Io => 2,
                    ErrorCode::Conflict => 3,
                };
                B::Error(proto::Error { ledger, code })
            }
            Message::StatusRequest => B::StatusRequest(proto::StatusRequest {}),
            Message::Status(NodeStatus { node, free_bytes, ledgers }) => {
                B::Status(proto::Status { node: node.0, free_bytes, ledgers })
            }
        }
    }
}

impl TryFrom<proto::Body> for Message {
    type Error = WireError;

    fn try_from(body: proto::Body) -> Result<Message, WireError> {
        use proto::Body as B;
        Ok(match body {
            B::Add(proto::Add { ledger, entry, epoch, lac, recovery, data }) => {
                check_lac(lac, Some(entry))?;
                Message::Request(Request::Add { ledger, entry, epoch, lac, recovery, data })
            }
            B::Read(proto::Read { ledger, entry, fence_epoch }) => {
                Message::Request(Request::Read { ledger, entry, fence: fence_epoch })
            }
            B::ReadLac(proto::ReadLac { ledger, fence_epoch }) => {
                Message::Request(Request::ReadLac { ledger, fence: fence_epoch })
            }
            B::WriteLac(proto::WriteLac { ledger, lac }) => {
                Message::Request(Request::WriteLac { ledger, lac })
            }
            B::StatusRequest(_) => Message::StatusRequest,
            B::Added(proto::Added { ledger, entry }) => {
                Message::Response(Response::Added { ledger, entry })
            }
            B::Entry(proto::Entry { ledger, entry, lac, data }) => {
                Message::Response(Response::Entry { ledger, entry, lac, data })
            }
            B::NoEntry(proto::NoEntry { ledger, entry, lac }) => {
                Message::Response(Response::NoEntry { ledger, entry, lac })
            }
            B::Lac(proto::Lac { ledger, lac, last_entry }) => {
                Message::Response(Response::Lac { ledger, lac, last_entry })
            }
            B::LacWritten(proto::LacWritten { ledger }) => {
                Message::Response(Response::LacWritten { ledger })
            }
            B::Error(proto::Error { ledger, code }) => {
                let code = match code {
                    1 => ErrorCode::Fenced,
                    2 => ErrorCode::Io,
                    3 => ErrorCode::Conflict,
                    other => {
                        return Err(WireError::Malformed(format!("unknown error code {other}")))
                    }
                };
                Message::Response(Response::Error { ledger, code })
            }
            B::Status(proto::Status { node, free_bytes, ledgers }) => {
                Message::Status(NodeStatus { node: NodeId(node), free_bytes, ledgers })
            }
        })
    }
}

/// A writer's LAC is always below the entry it sends.
fn check_lac(lac: Option<EntryId>, entry: Option<EntryId>) -> Result<(), WireError> {
    match (lac, entry) {
        (Some(lac), Some(entry)) if lac >= entry => {
            Err(WireError::Malformed(format!("LAC {lac} is not below entry {entry}")))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn all_messages() -> Vec<Message> {
        let data = Bytes::from_static(b"payload");
        vec![
            Message::Request(Request::Add {
                ledger: 1,
                entry: 5,
                epoch: 2,
                lac: Some(4),
                recovery: true,
                data: data.clone(),
            }),
            Message::Request(Request::Add {
                ledger: 1,
                entry: 0,
                epoch: 0,
                lac: None,
                recovery: false,
                data: Bytes::new(),
            }),
            Message::Request(Request::Read { ledger: 1, entry: 5, fence: Some(3) }),
            Message::Request(Request::Read { ledger: 1, entry: 0, fence: None }),
            Message::Request(Request::ReadLac { ledger: 9, fence: Some(0) }),
            Message::Request(Request::WriteLac { ledger: 9, lac: 7 }),
            Message::Response(Response::Added { ledger: 1, entry: 5 }),
            Message::Response(Response::Entry { ledger: 1, entry: 5, lac: Some(0), data }),
            Message::Response(Response::NoEntry { ledger: 1, entry: 5, lac: None }),
            Message::Response(Response::Lac { ledger: 1, lac: None, last_entry: Some(3) }),
            Message::Response(Response::LacWritten { ledger: 1 }),
            Message::Response(Response::Error { ledger: 1, code: ErrorCode::Fenced }),
            Message::Response(Response::Error { ledger: 1, code: ErrorCode::Conflict }),
            Message::StatusRequest,
            Message::Status(NodeStatus { node: NodeId(3), free_bytes: 1 << 40, ledgers: 12 }),
        ]
    }

    #[test]
    fn every_message_round_trips_even_split_across_reads() {
        let mut wire = BytesMut::new();
        for (id, message) in all_messages().iter().enumerate() {
            encode(id as u64, message, &mut wire);
        }
        let whole = wire.clone().freeze();
        // Fed one byte at a time: every frame comes out whole, in order.
        let mut buf = BytesMut::new();
        let mut decoded = Vec::new();
        for byte in whole.iter() {
            buf.put_u8(*byte);
            while let Some(frame) = decode(&mut buf).unwrap() {
                decoded.push(frame);
            }
        }
        let expected: Vec<(u64, Message)> =
            all_messages().into_iter().enumerate().map(|(i, m)| (i as u64, m)).collect();
        assert_eq!(decoded, expected);
        assert!(buf.is_empty());
    }

    #[test]
    fn damaged_frames_are_errors_not_panics() {
        let mut good = BytesMut::new();
        encode(1, &all_messages()[0], &mut good);
        let mut flipped = good.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 0x40;
        assert!(matches!(decode(&mut flipped), Err(WireError::Checksum { .. })));
        let mut short = BytesMut::from(&[0u8, 0, 0, 2, 1, 2][..]);
        assert_eq!(decode(&mut short), Err(WireError::TooShort(2)));
        let mut huge = BytesMut::from(&[0xffu8, 0xff, 0xff, 0xff][..]);
        assert!(matches!(decode(&mut huge), Err(WireError::TooLarge(_))));
        // A valid checksum over bytes that are not a frame.
        let junk = [0xffu8, 0xff, 0xff];
        let mut bad = BytesMut::new();
        bad.put_u32(4 + junk.len() as u32);
        bad.put_u32(crc32c::crc32c(&junk));
        bad.put_slice(&junk);
        assert!(matches!(decode(&mut bad), Err(WireError::Malformed(_))));
        // A frame without a body, and a LAC at or above its entry.
        let mut empty = BytesMut::new();
        let body = proto::Frame { request: 1, body: None }.encode_to_vec();
        empty.put_u32(4 + body.len() as u32);
        empty.put_u32(crc32c::crc32c(&body));
        empty.put_slice(&body);
        assert!(matches!(decode(&mut empty), Err(WireError::Malformed(_))));
        let add = proto::Frame {
            request: 1,
            body: Some(proto::Body::Add(proto::Add {
                ledger: 1,
                entry: 3,
                epoch: 0,
                lac: Some(3),
                recovery: false,
                data: Bytes::new(),
            })),
        }
        .encode_to_vec();
        let mut lac = BytesMut::new();
        lac.put_u32(4 + add.len() as u32);
        lac.put_u32(crc32c::crc32c(&add));
        lac.put_slice(&add);
        assert!(matches!(decode(&mut lac), Err(WireError::Malformed(_))));
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut state = 0x1234_5678_u64;
        for _ in 0..2_000 {
            let mut buf = BytesMut::new();
            let len = (state % 64) as usize;
            for _ in 0..len {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                buf.put_u8((state >> 33) as u8);
            }
            if state.is_multiple_of(3) && buf.len() >= 8 {
                // Make the length and checksum right, so the protobuf decoder sees junk.
                let body = buf[8..].to_vec();
                buf[..4].copy_from_slice(&(4 + body.len() as u32).to_be_bytes());
                buf[4..8].copy_from_slice(&crc32c::crc32c(&body).to_be_bytes());
            }
            let _ = decode(&mut buf);
        }
    }
}
