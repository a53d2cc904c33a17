//! The send timeout against a scripted fake broker that accepts a producer and then never
//! acknowledges a message (what a broker that cannot store, e.g. on a full disk, looks like):
//! the send fails with a timeout in bounded time instead of waiting for ever.

use std::time::Duration;

use bytes::BytesMut;
use magnetar_client::{Client, Error};
use magnetar_protocol::proto::base_command::Type;
use magnetar_protocol::proto::command_lookup_topic_response::LookupType;
use magnetar_protocol::{commands, encode_command, FrameDecoder};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::time::timeout;

/// Answers CONNECT, LOOKUP (here), PARTITIONED_METADATA (0) and PRODUCER; swallows SEND.
async fn silent_broker(listener: TcpListener, url: String) {
    loop {
        let Ok((mut socket, _)) = listener.accept().await else { return };
        let url = url.clone();
        tokio::spawn(async move {
            let decoder = FrameDecoder::default();
            let mut buf = BytesMut::new();
            loop {
                while let Ok(Some(frame)) = decoder.decode_buf(&mut buf) {
                    let mut out = BytesMut::new();
                    let c = &frame.command;
                    let reply = match frame.command_type() {
                        Some(Type::Connect) => Some(commands::connected("fake", 19, None, None)),
                        Some(Type::Lookup) => {
                            let id = c.lookup_topic.as_ref().map_or(0, |l| l.request_id);
                            Some(commands::lookup_response(
                                id,
                                LookupType::Connect,
                                url.clone(),
                                None,
                                true,
                                false,
                            ))
                        }
                        Some(Type::PartitionedMetadata) => {
                            let id = c.partition_metadata.as_ref().map_or(0, |p| p.request_id);
                            Some(commands::partitioned_metadata_response(id, 0))
                        }
                        Some(Type::Producer) => {
                            let id = c.producer.as_ref().map_or(0, |p| p.request_id);
                            Some(commands::producer_success(id, "p", -1, None))
                        }
                        _ => None, // SEND: never acknowledged
                    };
                    if let Some(reply) = reply {
                        encode_command(&reply, &mut out).unwrap();
                        if socket.write_all(&out).await.is_err() {
                            return;
                        }
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

#[tokio::test]
async fn a_send_the_broker_never_acknowledges_fails_with_a_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("pulsar://{}", listener.local_addr().unwrap());
    tokio::spawn(silent_broker(listener, url.clone()));
    let client = Client::connect(&url).await.unwrap();
    let producer = timeout(
        Duration::from_secs(10),
        client.producer("t").send_timeout(Duration::from_millis(300)).create(),
    )
    .await
    .unwrap()
    .unwrap();
    let started = tokio::time::Instant::now();
    let first = producer.send_async(b"one".to_vec()).await.unwrap();
    let second = producer.send_async(b"two".to_vec()).await.unwrap();
    let first = timeout(Duration::from_secs(10), first).await.expect("the send fails in time");
    assert!(matches!(first, Err(Error::Timeout(_))), "{first:?}");
    // Everything pending behind it fails with it.
    let second = timeout(Duration::from_secs(10), second).await.unwrap();
    assert!(matches!(second, Err(Error::Timeout(_))), "{second:?}");
    assert!(started.elapsed() >= Duration::from_millis(300), "not before the timeout");
}
