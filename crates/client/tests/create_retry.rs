//! Creating a producer or a consumer retries what may pass, as the official clients do: a
//! scripted fake broker refuses the first attempts (storage unavailable, not ready) and the
//! creation succeeds once it accepts; an error that asking again cannot change (no
//! authorization) fails at once; a refusal that lasts fails with that error after the client's
//! operation timeout.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use magnetar_client::{Client, ClientOptions, Error};
use magnetar_protocol::proto::base_command::Type;
use magnetar_protocol::proto::command_lookup_topic_response::LookupType;
use magnetar_protocol::proto::ServerError;
use magnetar_protocol::{commands, encode_command, FrameDecoder};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::time::timeout;

/// A broker that answers the `n`-th PRODUCER or SUBSCRIBE (from 0) with `refusal(n)`, or
/// with success when that is None; counts the attempts.
struct Script {
    attempts: AtomicUsize,
    refusal: Box<dyn Fn(usize) -> Option<ServerError> + Send + Sync>,
}

async fn scripted_broker(listener: TcpListener, url: String, script: Arc<Script>) {
    loop {
        let Ok((mut socket, _)) = listener.accept().await else { return };
        let (url, script) = (url.clone(), script.clone());
        tokio::spawn(async move {
            let decoder = FrameDecoder::default();
            let mut buf = BytesMut::new();
            loop {
                while let Ok(Some(frame)) = decoder.decode_buf(&mut buf) {
                    let c = &frame.command;
                    let attach = |request_id: u64, success| {
                        let n = script.attempts.fetch_add(1, Ordering::SeqCst);
                        match (script.refusal)(n) {
                            Some(code) => commands::error(request_id, code, "refused by script"),
                            None => success,
                        }
                    };
                    let reply = match frame.command_type() {
                        Some(Type::Connect) => Some(commands::connected("fake", 19, None, None)),
                        Some(Type::Lookup) => {
                            let id = c.lookup_topic.as_ref().map_or(0, |l| l.request_id);
                            let connect = LookupType::Connect;
                            Some(commands::lookup_response(
                                id,
                                connect,
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
                            Some(attach(id, commands::producer_success(id, "p", -1, None)))
                        }
                        Some(Type::Subscribe) => {
                            let id = c.subscribe.as_ref().map_or(0, |s| s.request_id);
                            Some(attach(id, commands::success(id)))
                        }
                        _ => None,
                    };
                    if let Some(reply) = reply {
                        let mut out = BytesMut::new();
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

async fn client_of(
    refusal: impl Fn(usize) -> Option<ServerError> + Send + Sync + 'static,
    operation_timeout: Duration,
) -> (Client, Arc<Script>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("pulsar://{}", listener.local_addr().unwrap());
    let script = Arc::new(Script { attempts: AtomicUsize::new(0), refusal: Box::new(refusal) });
    tokio::spawn(scripted_broker(listener, url.clone(), script.clone()));
    let options =
        ClientOptions { operation_timeout: Some(operation_timeout), ..Default::default() };
    (Client::connect_with_options(url, options).await.unwrap(), script)
}

const BOUND: Duration = Duration::from_secs(20);

#[tokio::test]
async fn a_producer_is_created_once_storage_is_available_again() {
    let refusal = |n| (n < 2).then_some(ServerError::PersistenceError);
    let (client, script) = client_of(refusal, Duration::from_secs(10)).await;
    let created = timeout(BOUND, client.producer("t").create()).await.expect("bounded");
    assert!(created.is_ok(), "{:?}", created.err());
    assert_eq!(script.attempts.load(Ordering::SeqCst), 3, "two refusals, then accepted");
}

#[tokio::test]
async fn a_subscription_is_made_once_the_broker_is_ready() {
    let refusal = |n| (n < 1).then_some(ServerError::ServiceNotReady);
    let (client, script) = client_of(refusal, Duration::from_secs(10)).await;
    let subscribed =
        timeout(BOUND, client.consumer("t").subscription("s").subscribe()).await.expect("bounded");
    assert!(subscribed.is_ok(), "{:?}", subscribed.err());
    assert_eq!(script.attempts.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn an_error_asking_again_cannot_change_fails_at_once() {
    let (client, script) =
        client_of(|_| Some(ServerError::AuthorizationError), Duration::from_secs(10)).await;
    let started = tokio::time::Instant::now();
    let created = timeout(BOUND, client.producer("t").create()).await.expect("bounded");
    assert!(
        matches!(created, Err(Error::Server { code: Some(ServerError::AuthorizationError), .. })),
        "{:?}",
        created.err()
    );
    assert_eq!(script.attempts.load(Ordering::SeqCst), 1, "not retried");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn a_lasting_refusal_fails_with_it_after_the_operation_timeout() {
    let (client, script) =
        client_of(|_| Some(ServerError::ServiceNotReady), Duration::from_millis(500)).await;
    let started = tokio::time::Instant::now();
    let created = timeout(BOUND, client.producer("t").create()).await.expect("bounded");
    assert!(
        matches!(created, Err(Error::Server { code: Some(ServerError::ServiceNotReady), .. })),
        "{:?}",
        created.err()
    );
    assert!(script.attempts.load(Ordering::SeqCst) >= 2, "retried meanwhile");
    assert!(started.elapsed() < Duration::from_secs(5), "gave up near the timeout");
}
