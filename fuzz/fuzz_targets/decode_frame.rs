//! cargo-fuzz target: feeds arbitrary bytes to every decoding entry point of
//! magnetar-protocol (the three `FrameDecoder` flavours, the stored-entry
//! parser and the batch parser). None may panic, and every frame that does
//! decode must re-encode to bytes that decode to the same frame.

#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use magnetar_protocol::{
    encode_command, encode_payload_command, parse_batch, parse_metadata_and_payload, Frame,
    FrameDecoder,
};

/// Upper bound on batch messages walked per input, to keep runs fast.
const MAX_BATCH_MESSAGES: u32 = 1024;

fn walk_batch(payload: Bytes, num_messages: u32) {
    for message in parse_batch(payload, num_messages.min(MAX_BATCH_MESSAGES)) {
        if message.is_err() {
            break;
        }
    }
}

fn encode(frame: &Frame) -> BytesMut {
    let mut out = BytesMut::new();
    match &frame.payload {
        None => encode_command(&frame.command, &mut out).expect("re-encode command"),
        Some(p) => encode_payload_command(
            &frame.command,
            p.broker_entry_metadata_raw.as_deref(),
            &p.metadata_and_payload,
            &mut out,
        )
        .expect("re-encode payload frame"),
    }
    out
}

/// Decoded frames survive an encode/decode cycle. Bytes are compared rather
/// than frames because floats (consumer stats) may be NaN.
fn check_round_trip(frame: &Frame) {
    let first = encode(frame);
    let (again, used) = FrameDecoder::new(usize::MAX)
        .decode(&first)
        .expect("re-encoded frame decodes")
        .expect("re-encoded frame is complete");
    assert_eq!(used, first.len());
    assert_eq!(encode(&again), first);
}

fuzz_target!(|data: &[u8]| {
    // The first byte picks a small or the default frame limit, so both the
    // size-limit paths and large frames get exercised.
    let decoder = match data.first() {
        Some(b) if b & 1 == 1 => FrameDecoder::new(4096),
        _ => FrameDecoder::default(),
    };

    let _ = decoder.decode(data);
    let bytes = Bytes::copy_from_slice(data);
    let _ = decoder.decode_bytes(&bytes);

    let mut buf = BytesMut::from(data);
    loop {
        match decoder.decode_buf(&mut buf) {
            Ok(Some(frame)) => {
                check_round_trip(&frame);
                if let Some(p) = frame.payload {
                    let (metadata, payload) = parse_metadata_and_payload(&p.metadata_and_payload)
                        .expect("entry of a decoded frame re-parses");
                    assert_eq!(payload, p.payload);
                    let n = u32::try_from(metadata.num_messages_in_batch()).unwrap_or(0);
                    walk_batch(p.payload, n);
                }
            }
            // The bad frame was consumed; carry on with the next one.
            Err(e) if !e.is_fatal() => {}
            Ok(None) | Err(_) => break,
        }
    }

    let _ = parse_metadata_and_payload(&bytes);
    walk_batch(bytes, 64);
});
