//! Test support: scripted fake brokers on loopback (no Magnetar needed). The script sees each
//! frame a client sends and says what to answer; the accept loop, the frame decoding and the
//! writing are here once.
#![allow(dead_code)]

use std::sync::Arc;

use bytes::BytesMut;
use magnetar_protocol::proto::base_command::Type;
use magnetar_protocol::proto::command_lookup_topic_response::LookupType;
use magnetar_protocol::{commands, encode_command, BaseCommand, Frame, FrameDecoder};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// What a fake broker answers a frame with (nothing, one command or several).
pub type Script = Arc<dyn Fn(&Frame) -> Vec<BaseCommand> + Send + Sync>;

/// Serves `listener` until it fails: one task per connection, each frame answered by `script`.
pub async fn serve(listener: TcpListener, script: Script) {
    loop {
        let Ok((mut socket, _)) = listener.accept().await else { return };
        let script = script.clone();
        tokio::spawn(async move {
            let decoder = FrameDecoder::default();
            let mut buf = BytesMut::new();
            loop {
                while let Ok(Some(frame)) = decoder.decode_buf(&mut buf) {
                    let mut out = BytesMut::new();
                    for reply in script(&frame) {
                        encode_command(&reply, &mut out).unwrap();
                    }
                    if !out.is_empty() && socket.write_all(&out).await.is_err() {
                        return;
                    }
                }
                match socket.read_buf(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        });
    }
}

/// A listener on a free loopback port and its `pulsar://` URL.
pub async fn listener() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("pulsar://{}", listener.local_addr().unwrap());
    (listener, url)
}

/// The answers every topic-level test needs from a broker serving `url`: CONNECTED, a LOOKUP
/// that says "here", a non-partitioned topic. None for any other frame.
pub fn topic_here(frame: &Frame, url: &str) -> Option<BaseCommand> {
    let c = &frame.command;
    match frame.command_type()? {
        Type::Connect => Some(commands::connected("fake", 19, None, None)),
        Type::Lookup => {
            let id = c.lookup_topic.as_ref().map_or(0, |l| l.request_id);
            let here = LookupType::Connect;
            Some(commands::lookup_response(id, here, url.to_string(), None, true, false))
        }
        Type::PartitionedMetadata => {
            let id = c.partition_metadata.as_ref().map_or(0, |p| p.request_id);
            Some(commands::partitioned_metadata_response(id, 0))
        }
        _ => None,
    }
}
