//! The send timeout against a scripted fake broker that accepts a producer and then never
//! acknowledges a message (what a broker that cannot store, e.g. on a full disk, looks like):
//! the send fails with a timeout in bounded time instead of waiting for ever.

use crate::fake;

use std::sync::Arc;
use std::time::Duration;

use magnetar_client::{Client, Error};
use magnetar_protocol::commands;
use magnetar_protocol::proto::base_command::Type;
use tokio::time::timeout;

/// Answers CONNECT, LOOKUP (here), PARTITIONED_METADATA (0) and PRODUCER; swallows SEND.
fn silent_broker(url: String) -> fake::Script {
    Arc::new(move |frame| {
        if frame.command_type() == Some(Type::Producer) {
            let id = frame.command.producer.as_ref().map_or(0, |p| p.request_id);
            return vec![commands::producer_success(id, "p", -1, None)];
        }
        fake::topic_here(frame, &url).into_iter().collect() // SEND: never acknowledged
    })
}

#[tokio::test]
async fn a_send_the_broker_never_acknowledges_fails_with_a_timeout() {
    let (listener, url) = fake::listener().await;
    tokio::spawn(fake::serve(listener, silent_broker(url.clone())));
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
