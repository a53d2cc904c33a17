//! LOOKUP redirects and keep-alive against scripted fake brokers (no
//! Magnetar needed): broker A redirects to broker B, which answers Connect.

use std::time::Duration;

use bytes::BytesMut;
use magnetar_client::Client;
use magnetar_protocol::proto::base_command::Type;
use magnetar_protocol::proto::command_lookup_topic_response::LookupType;
use magnetar_protocol::{commands, encode_command, FrameDecoder};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::timeout;

const WAIT: Duration = Duration::from_secs(10);

/// Serves connections: CONNECTED, then answers LOOKUP with `answer` and
/// reports every command type it sees on `seen`. Sends a PING first.
async fn fake_broker(
    listener: TcpListener,
    answer: (LookupType, String, bool),
    seen: mpsc::UnboundedSender<(Type, Option<bool>)>,
) {
    loop {
        let Ok((mut socket, _)) = listener.accept().await else { return };
        let answer = answer.clone();
        let seen = seen.clone();
        tokio::spawn(async move {
            let decoder = FrameDecoder::default();
            let mut buf = BytesMut::new();
            loop {
                while let Ok(Some(frame)) = decoder.decode_buf(&mut buf) {
                    let Some(kind) = frame.command_type() else { continue };
                    let mut out = BytesMut::new();
                    match kind {
                        Type::Connect => {
                            let version = frame.command.connect.as_ref().unwrap().protocol_version;
                            assert_eq!(version, Some(19));
                            encode_command(&commands::connected("fake", 19, None, None), &mut out)
                                .unwrap();
                            encode_command(&commands::ping(), &mut out).unwrap();
                        }
                        Type::Lookup => {
                            let lookup = frame.command.lookup_topic.as_ref().unwrap();
                            let _ = seen.send((kind, lookup.authoritative));
                            let (response, url, authoritative) = answer.clone();
                            let reply = commands::lookup_response(
                                lookup.request_id,
                                response,
                                url,
                                None,
                                authoritative,
                                false,
                            );
                            encode_command(&reply, &mut out).unwrap();
                        }
                        other => {
                            let _ = seen.send((other, None));
                        }
                    }
                    if socket.write_all(&out).await.is_err() {
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

#[tokio::test]
async fn lookup_follows_redirect_then_connect() {
    let a = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let b = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url_a = format!("pulsar://{}", a.local_addr().unwrap());
    let url_b = format!("pulsar://{}", b.local_addr().unwrap());
    let (seen_a_tx, mut seen_a) = mpsc::unbounded_channel();
    let (seen_b_tx, mut seen_b) = mpsc::unbounded_channel();
    tokio::spawn(fake_broker(a, (LookupType::Redirect, url_b.clone(), true), seen_a_tx));
    tokio::spawn(fake_broker(b, (LookupType::Connect, url_b.clone(), true), seen_b_tx));

    let client = Client::connect(&url_a).await.unwrap();
    // The client answers the broker's PING.
    let (kind, _) = timeout(WAIT, seen_a.recv()).await.unwrap().unwrap();
    assert_eq!(kind, Type::Pong);

    let result = timeout(WAIT, client.lookup_topic("t")).await.unwrap().unwrap();
    assert_eq!(result.broker_url, url_b);
    assert!(!result.proxy_through_service_url);
    // A saw a non-authoritative lookup; B the authoritative retry.
    assert_eq!(timeout(WAIT, seen_a.recv()).await.unwrap().unwrap(), (Type::Lookup, Some(false)));
    let mut b_events = Vec::new();
    while b_events.len() < 2 {
        b_events.push(timeout(WAIT, seen_b.recv()).await.unwrap().unwrap());
    }
    assert!(b_events.contains(&(Type::Pong, None)), "{b_events:?}");
    assert!(b_events.contains(&(Type::Lookup, Some(true))), "{b_events:?}");
}

#[tokio::test]
async fn lookup_gives_up_on_a_redirect_loop() {
    let a = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url_a = format!("pulsar://{}", a.local_addr().unwrap());
    let (seen_tx, _seen) = mpsc::unbounded_channel();
    tokio::spawn(fake_broker(a, (LookupType::Redirect, url_a.clone(), false), seen_tx));
    let client = Client::connect(&url_a).await.unwrap();
    let error = timeout(WAIT, client.lookup_topic("t")).await.unwrap().unwrap_err();
    assert!(matches!(error, magnetar_client::Error::TooManyRedirects(_)), "{error}");
}
