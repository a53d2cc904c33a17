//! Creating a producer or a consumer retries what may pass, as the official clients do: a
//! scripted fake broker refuses the first attempts (storage unavailable, not ready) and the
//! creation succeeds once it accepts; an error that asking again cannot change (no
//! authorization) fails at once; a refusal that lasts fails with that error after the client's
//! operation timeout.

use crate::fake;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use magnetar_client::{Client, ClientOptions, Error};
use magnetar_protocol::commands;
use magnetar_protocol::proto::base_command::Type;
use magnetar_protocol::proto::ServerError;
use tokio::time::timeout;

/// A broker serving a topic that answers the `n`-th PRODUCER or SUBSCRIBE (from 0) with the
/// error `refusal(n)` gives, or with success when it gives None; `attempts` counts them.
async fn client_of(
    refusal: impl Fn(usize) -> Option<ServerError> + Send + Sync + 'static,
    operation_timeout: Duration,
) -> (Client, Arc<AtomicUsize>) {
    let (listener, url) = fake::listener().await;
    let attempts = Arc::new(AtomicUsize::new(0));
    let counted = attempts.clone();
    let script_url = url.clone();
    let script: fake::Script = Arc::new(move |frame| {
        let c = &frame.command;
        let (request_id, success) = match frame.command_type() {
            Some(Type::Producer) => {
                let id = c.producer.as_ref().map_or(0, |p| p.request_id);
                (id, commands::producer_success(id, "p", -1, None))
            }
            Some(Type::Subscribe) => {
                let id = c.subscribe.as_ref().map_or(0, |s| s.request_id);
                (id, commands::success(id))
            }
            _ => return fake::topic_here(frame, &script_url).into_iter().collect(),
        };
        let reply = match refusal(counted.fetch_add(1, Ordering::SeqCst)) {
            Some(code) => commands::error(request_id, code, "refused by script"),
            None => success,
        };
        vec![reply]
    });
    tokio::spawn(fake::serve(listener, script));
    let options =
        ClientOptions { operation_timeout: Some(operation_timeout), ..Default::default() };
    (Client::connect_with_options(url, options).await.unwrap(), attempts)
}

const BOUND: Duration = Duration::from_secs(20);

#[tokio::test]
async fn a_producer_is_created_once_storage_is_available_again() {
    let refusal = |n| (n < 2).then_some(ServerError::PersistenceError);
    let (client, attempts) = client_of(refusal, Duration::from_secs(10)).await;
    let created = timeout(BOUND, client.producer("t").create()).await.expect("bounded");
    assert!(created.is_ok(), "{:?}", created.err());
    assert_eq!(attempts.load(Ordering::SeqCst), 3, "two refusals, then accepted");
}

#[tokio::test]
async fn a_subscription_is_made_once_the_broker_is_ready() {
    let refusal = |n| (n < 1).then_some(ServerError::ServiceNotReady);
    let (client, attempts) = client_of(refusal, Duration::from_secs(10)).await;
    let subscribed =
        timeout(BOUND, client.consumer("t").subscription("s").subscribe()).await.expect("bounded");
    assert!(subscribed.is_ok(), "{:?}", subscribed.err());
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn an_error_asking_again_cannot_change_fails_at_once() {
    let (client, attempts) =
        client_of(|_| Some(ServerError::AuthorizationError), Duration::from_secs(10)).await;
    let started = tokio::time::Instant::now();
    let created = timeout(BOUND, client.producer("t").create()).await.expect("bounded");
    assert!(
        matches!(created, Err(Error::Server { code: Some(ServerError::AuthorizationError), .. })),
        "{:?}",
        created.err()
    );
    assert_eq!(attempts.load(Ordering::SeqCst), 1, "not retried");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn a_lasting_refusal_fails_with_it_after_the_operation_timeout() {
    let (client, attempts) =
        client_of(|_| Some(ServerError::ServiceNotReady), Duration::from_millis(500)).await;
    let started = tokio::time::Instant::now();
    let created = timeout(BOUND, client.producer("t").create()).await.expect("bounded");
    assert!(
        matches!(created, Err(Error::Server { code: Some(ServerError::ServiceNotReady), .. })),
        "{:?}",
        created.err()
    );
    assert!(attempts.load(Ordering::SeqCst) >= 2, "retried meanwhile");
    assert!(started.elapsed() < Duration::from_secs(5), "gave up near the timeout");
}
