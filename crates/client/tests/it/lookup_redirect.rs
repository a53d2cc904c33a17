//! LOOKUP redirects and keep-alive against scripted fake brokers (no
//! Magnetar needed): broker A redirects to broker B, which answers Connect.

use crate::fake;

use std::sync::Arc;
use std::time::Duration;

use magnetar_client::Client;
use magnetar_protocol::commands;
use magnetar_protocol::proto::base_command::Type;
use magnetar_protocol::proto::command_lookup_topic_response::LookupType;
use tokio::sync::mpsc;
use tokio::time::timeout;

const WAIT: Duration = Duration::from_secs(10);

/// CONNECTED (and a PING), then LOOKUP answered with `answer`; every command type it sees
/// is reported on `seen`.
fn fake_broker(
    answer: (LookupType, String, bool),
    seen: mpsc::UnboundedSender<(Type, Option<bool>)>,
) -> fake::Script {
    Arc::new(move |frame| {
        let Some(kind) = frame.command_type() else { return Vec::new() };
        match kind {
            Type::Connect => {
                let version = frame.command.connect.as_ref().unwrap().protocol_version;
                assert_eq!(version, Some(19));
                vec![commands::connected("fake", 19, None, None), commands::ping()]
            }
            Type::Lookup => {
                let lookup = frame.command.lookup_topic.as_ref().unwrap();
                let _ = seen.send((kind, lookup.authoritative));
                let (response, url, authoritative) = answer.clone();
                let id = lookup.request_id;
                vec![commands::lookup_response(id, response, url, None, authoritative, false)]
            }
            other => {
                let _ = seen.send((other, None));
                Vec::new()
            }
        }
    })
}

#[tokio::test]
async fn lookup_follows_redirect_then_connect() {
    let (a, url_a) = fake::listener().await;
    let (b, url_b) = fake::listener().await;
    let (seen_a_tx, mut seen_a) = mpsc::unbounded_channel();
    let (seen_b_tx, mut seen_b) = mpsc::unbounded_channel();
    tokio::spawn(fake::serve(
        a,
        fake_broker((LookupType::Redirect, url_b.clone(), true), seen_a_tx),
    ));
    tokio::spawn(fake::serve(
        b,
        fake_broker((LookupType::Connect, url_b.clone(), true), seen_b_tx),
    ));

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
    let (a, url_a) = fake::listener().await;
    let (seen_tx, _seen) = mpsc::unbounded_channel();
    tokio::spawn(fake::serve(
        a,
        fake_broker((LookupType::Redirect, url_a.clone(), false), seen_tx),
    ));
    let client = Client::connect(&url_a).await.unwrap();
    let error = timeout(WAIT, client.lookup_topic("t")).await.unwrap().unwrap_err();
    assert!(matches!(error, magnetar_client::Error::TooManyRedirects(_)), "{error}");
}
