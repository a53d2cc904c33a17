//! The store's session: one etcd lease per store, kept alive by a background task.
//!
//! The keeper sends a keep-alive every TTL / 3 on a lease keep-alive stream. Its view of the
//! lease is conservative: the lease is known valid until `sent + ttl` of the last keep-alive
//! that etcd answered (etcd renewed it no earlier than it was sent), so the store reports
//! `SessionLost` no later than etcd can expire the lease, never after.
//! * A keep-alive that fails or is not answered within TTL / 3: `ConnectionLost` (once); the
//!   keeper reopens the stream and keeps trying.
//! * An answer with a positive TTL after `ConnectionLost`: `Reconnected`.
//! * An answer with TTL <= 0 (etcd expired or revoked the lease), a "lease not found", or
//!   the local validity running out: `SessionLost`. The lease is dropped for good (revoked
//!   in the background, in case etcd still has it), a new one is granted with retries, and
//!   `SessionReestablished` follows.
//!
//! Invariants: `lease` holds the lease the store puts ephemeral keys with, and is `None`
//! from the moment `SessionLost` is decided until the new lease is granted; state and event
//! change together (see `SessionNotifier`); a lease reported lost is never used again, and
//! no `put_ephemeral` with it succeeds after `SessionLost` (one in flight then fails with
//! `SessionExpired`; its key goes with the lease, revoked in the background or expired).

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, LeaseClient};
use magnetar_metadata::{
    MetadataError, Result, SessionEvent, SessionEvents, SessionId, SessionNotifier, SessionState,
};
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::{sleep, timeout, Instant};

use crate::config::EtcdStoreConfig;
use crate::errors::{classify, Failure};
use crate::kv::io_error;
use crate::Inner;

/// Pause between attempts to grant a new lease after a session was lost.
const GRANT_RETRY: Duration = Duration::from_millis(200);

fn session_id(lease: i64) -> SessionId {
    SessionId(lease as u64)
}

/// The session state shared by the store and its keeper task.
pub(crate) struct Session {
    lease_client: LeaseClient,
    notifier: SessionNotifier,
    /// The live lease, if any.
    lease: Mutex<Option<Lease>>,
    /// Asks the keeper to send a keep-alive now (after a revoke or a "lease not found").
    poke: Notify,
}

#[derive(Debug, Clone, Copy)]
struct Lease {
    id: i64,
    /// TTL granted by etcd (may exceed the requested one).
    ttl: Duration,
    /// When the grant request was sent: the lease is valid until at least `sent + ttl`.
    sent: Instant,
}

async fn grant(
    client: &LeaseClient,
    config: &EtcdStoreConfig,
) -> std::result::Result<Lease, Failure> {
    let sent = Instant::now();
    let mut client = client.clone();
    match timeout(config.request_timeout, client.grant(config.ttl_seconds(), None)).await {
        Ok(Ok(resp)) if resp.ttl() > 0 => {
            Ok(Lease { id: resp.id(), ttl: Duration::from_secs(resp.ttl().unsigned_abs()), sent })
        }
        Ok(Ok(resp)) => Err(Failure::Unavailable(
            std::io::ErrorKind::Other,
            format!("etcd refused a lease: {}", resp.error()),
        )),
        Ok(Err(e)) => Err(classify(&e)),
        Err(_) => Err(Failure::timed_out()),
    }
}

impl Session {
    /// Grants the first lease, retrying within `connect_timeout`.
    pub(crate) async fn start(client: &Client, config: &EtcdStoreConfig) -> Result<Session> {
        let lease_client = client.lease_client();
        let deadline = Instant::now() + config.connect_timeout;
        let lease = loop {
            match grant(&lease_client, config).await {
                Ok(lease) => break lease,
                Err(f) if f.is_retryable() && Instant::now() + GRANT_RETRY < deadline => {
                    sleep(GRANT_RETRY).await;
                }
                Err(f) => {
                    return Err(io_error("starting an etcd session (granting its lease)", &f))
                }
            }
        };
        Ok(Session {
            lease_client,
            notifier: SessionNotifier::new(session_id(lease.id)),
            lease: Mutex::new(Some(lease)),
            poke: Notify::new(),
        })
    }

    pub(crate) fn state(&self) -> SessionState {
        self.notifier.state()
    }

    pub(crate) fn subscribe(&self) -> SessionEvents {
        self.notifier.subscribe()
    }

    pub(crate) fn poke(&self) {
        self.poke.notify_one();
    }

    /// The lease to put an ephemeral key with, or `SessionExpired`.
    pub(crate) fn live_lease(&self) -> Result<i64> {
        match *self.lease.lock() {
            Some(lease) => Ok(lease.id),
            None => Err(MetadataError::SessionExpired {
                reason: "the etcd session was lost and no new one is established yet".into(),
            }),
        }
    }

    /// Whether `lease` is still the session's live lease.
    pub(crate) fn is_current(&self, lease: i64) -> bool {
        self.lease.lock().is_some_and(|l| l.id == lease)
    }

    /// Revokes the current lease on etcd (its keys go at once) and lets the keeper notice.
    pub(crate) async fn revoke_current(&self, config: &EtcdStoreConfig) -> Result<()> {
        let Some(lease) = *self.lease.lock() else { return Ok(()) };
        let mut client = self.lease_client.clone();
        let result = timeout(config.request_timeout, client.revoke(lease.id)).await;
        self.poke();
        match result {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => match classify(&e) {
                Failure::LeaseNotFound => Ok(()),
                f => Err(io_error("revoking the etcd session lease", &f)),
            },
            Err(_) => Err(io_error("revoking the etcd session lease", &Failure::timed_out())),
        }
    }

    /// Ends the session for good: revokes the lease (bounded; if etcd cannot be reached the
    /// keys go when the TTL runs out) and ends the event subscriptions.
    pub(crate) async fn close(&self, config: &EtcdStoreConfig) {
        let lease = self.lease.lock().take();
        if let Some(lease) = lease {
            let mut client = self.lease_client.clone();
            let _ = timeout(config.request_timeout, client.revoke(lease.id)).await;
        }
        self.notifier.close();
    }

    /// Publishes `SessionLost` for `lease` unless the store is closing, and forgets it.
    fn lose(&self, lease: Lease) {
        let mut current = self.lease.lock();
        if current.is_some_and(|l| l.id == lease.id) {
            *current = None;
        }
        let session = session_id(lease.id);
        self.notifier.publish(SessionState::Lost, SessionEvent::SessionLost { session });
    }
}

/// Starts the keeper task, which runs until the store shuts down.
pub(crate) fn spawn_keeper(inner: Arc<Inner>) {
    tokio::spawn(async move {
        let mut shutdown = inner.shutdown.subscribe();
        tokio::select! {
            _ = shutdown.wait_for(|closed| *closed) => {}
            _ = keep_sessions(&inner) => {}
        }
    });
}

/// Keeps the current lease alive; when it is lost, grants the next one. Never returns.
async fn keep_sessions(inner: &Inner) {
    let session = &inner.session;
    let config = &inner.config;
    loop {
        let current = *session.lease.lock();
        let Some(lease) = current else {
            // Lost: grant the next lease (retrying), then announce it.
            match grant(&session.lease_client, config).await {
                Ok(lease) => {
                    *session.lease.lock() = Some(lease);
                    let id = session_id(lease.id);
                    session.notifier.publish(
                        SessionState::Connected(id),
                        SessionEvent::SessionReestablished { session: id },
                    );
                }
                Err(_) => sleep(GRANT_RETRY).await,
            }
            continue;
        };
        let lost = keep_alive(inner, lease).await;
        session.lose(lost);
        // Best effort, in the background: if etcd still has the lease (we gave up on it
        // locally first), its keys must not linger until its TTL runs out.
        let mut client = session.lease_client.clone();
        let bound = config.request_timeout;
        tokio::spawn(async move {
            let _ = timeout(bound, client.revoke(lost.id)).await;
        });
    }
}

/// Keeps `lease` alive until it is lost; returns it then.
async fn keep_alive(inner: &Inner, mut lease: Lease) -> Lease {
    let session = &inner.session;
    let interval = (lease.ttl / 3).max(Duration::from_millis(100));
    let id = session_id(lease.id);
    let mut connected = true;
    let mut stream = None;
    loop {
        let now = Instant::now();
        let valid_until = lease.sent + lease.ttl;
        if now >= valid_until {
            return lease;
        }
        let bound = interval.min(valid_until - now);
        let sent = Instant::now();
        let answer = timeout(bound, async {
            let Some((keeper, responses)) = stream.as_mut() else {
                // Opening the stream sends the first keep-alive and waits for its answer.
                let mut client = session.lease_client.clone();
                stream = Some(client.keep_alive(lease.id).await?);
                return Ok(Some(lease.ttl.as_secs() as i64));
            };
            keeper.keep_alive().await?;
            match responses.message().await? {
                Some(resp) => Ok(Some(resp.ttl())),
                None => Ok(None),
            }
        })
        .await;
        match answer {
            Ok(Ok(Some(ttl))) if ttl > 0 => {
                lease.sent = sent;
                lease.ttl = Duration::from_secs(ttl.unsigned_abs());
                if !connected {
                    connected = true;
                    session.notifier.publish(
                        SessionState::Connected(id),
                        SessionEvent::Reconnected { session: id },
                    );
                }
            }
            // etcd answered: the lease is gone (expired or revoked).
            Ok(Ok(Some(_))) => return lease,
            Ok(Err(e)) if matches!(classify(&e), Failure::LeaseNotFound) => return lease,
            // Stream ended, failed, or no answer in time.
            Ok(Ok(None)) | Ok(Err(_)) | Err(_) => {
                stream = None;
                if connected {
                    connected = false;
                    session.notifier.publish(
                        SessionState::Disconnected(id),
                        SessionEvent::ConnectionLost { session: id },
                    );
                }
            }
        }
        let now = Instant::now();
        let wake = (sent + interval).min(lease.sent + lease.ttl);
        if wake > now {
            tokio::select! {
                _ = sleep(wake - now) => {}
                _ = session.poke.notified() => {}
            }
        }
    }
}
