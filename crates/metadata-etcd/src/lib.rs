//! `EtcdStore`: Magnetar's metadata store on etcd v3, for cluster mode.
//!
//! Implements [`MetadataStore`] and [`SessionStore`] with exactly the semantics documented in
//! `magnetar-metadata` (and checked by its conformance suite, run here against 1- and 3-node
//! etcd clusters). It lives in its own crate so the gRPC stack (tonic, prost, and `protoc` at
//! build time) stays out of the trait crate and out of standalone builds.
//!
//! # Mapping onto etcd
//! * **Keys**: every key lives under the configured root, `/magnetar/<cluster>` by default
//!   (`/topics/t` is stored as `/magnetar/<cluster>/topics/t`), so clusters share one etcd.
//! * **Versions** are etcd's per-key `version` (1 on create, +1 per put, reset by delete).
//! * **put** is one txn: `If(version == v)` (or `create_revision == 0` for `Absent`, nothing
//!   for `Any`) `Then(put, read back version) Else(read version)`, so `BadVersion` carries
//!   the version the txn saw. `Exactly(0)` and versions etcd cannot hold never match.
//! * **delete** is `If(version == v) Then(delete) Else(read version)`; an absent key is
//!   `NotFound` whatever the expectation.
//! * **list** and **list_children** read keys-only pages of [`EtcdStoreConfig::list_page_size`]
//!   keys, every page at the revision of the first (one consistent snapshot; restarted if
//!   that revision is compacted meanwhile). `list_children` skips each child's subtree.
//! * **watch** reads the current revision R and watches from R + 1, then forwards events
//!   through a bounded queue (the trait's `Lagged` rules). After a broken stream it resumes
//!   from the revision after the last event it saw; if etcd has compacted that revision it
//!   queues `Lagged` (never a silent gap) and resumes from the oldest revision etcd still has.
//!   Watches use `require_leader`, so a member cut off from its cluster ends them.
//! * **Sessions**: one lease per store (per process), TTL [`EtcdStoreConfig::session_ttl`],
//!   kept alive every TTL / 3. Ephemeral keys are put with that lease. See `session.rs`.
//! * **Errors**: a write whose outcome is unknown (timeout, connection reset, leader change)
//!   is `Io`; reads retry within [`EtcdStoreConfig::request_timeout`]; a request that was
//!   never sent (connection refused) is retried even when it is a write. `BadVersion`,
//!   `NotFound`, `ValueTooLarge` and `SessionExpired` stay typed.
//!
//! Invariants: the store never reuses a lease it reported lost; every forwarded watch event
//! has a higher revision than the one before it on the same stream; an operation on a
//! closed store returns `Closed`.

mod batch;
mod config;
mod errors;
mod kv;
mod session;
mod url;
mod watch;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use magnetar_metadata::{
    ExpectedVersion, MetadataError, MetadataStore, Result, SessionEvents, SessionState,
    SessionStore, Versioned, WatchStream,
};
use tokio::sync::watch as signal;

pub use config::{
    EtcdStoreConfig, ETCD_DEFAULT_MAX_REQUEST_BYTES, MAX_ROOT_LEN, REQUIRED_MAX_REQUEST_BYTES,
};

pub use url::{parse_metadata_url, MetadataUrlError, DEFAULT_ETCD_PORT};

use crate::kv::Kv;
use crate::session::Session;
use crate::watch::WatchRegistry;

/// The metadata store on etcd. Cheap to share behind an `Arc`; one per process (one session).
pub struct EtcdStore {
    inner: Arc<Inner>,
}

/// State shared with the store's background tasks (session keeper, watch forwarders).
pub(crate) struct Inner {
    pub(crate) config: EtcdStoreConfig,
    pub(crate) kv: Kv,
    pub(crate) session: Session,
    pub(crate) watches: WatchRegistry,
    closed: AtomicBool,
    /// Flips to true when the store closes or is dropped; every task watches it.
    pub(crate) shutdown: signal::Sender<bool>,
}

impl Inner {
    pub(crate) fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(MetadataError::Closed);
        }
        Ok(())
    }
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.inner.config.endpoints)
            .field("root", &self.inner.config.root)
            .field("session", &self.inner.session.state())
            .finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// Connects to etcd and starts the session (grants the lease), retrying within
    /// `config.connect_timeout`. Fails with `Io` if etcd cannot be reached in that time.
    pub async fn connect(config: EtcdStoreConfig) -> Result<EtcdStore> {
        config.validate()?;
        let client = kv::connect_client(&config).await?;
        let kv = Kv::new(&client, &config);
        let (shutdown, _) = signal::channel(false);
        let session = Session::start(&client, &config).await?;
        let inner = Arc::new(Inner {
            config,
            kv,
            session,
            watches: WatchRegistry::new(client),
            closed: AtomicBool::new(false),
            shutdown,
        });
        session::spawn_keeper(inner.clone());
        Ok(EtcdStore { inner })
    }

    /// The configuration in use.
    pub fn config(&self) -> &EtcdStoreConfig {
        &self.inner.config
    }

    /// Ends the current session now, as if its lease had expired: revokes the lease (etcd
    /// deletes its ephemeral keys), after which the store publishes `SessionLost` and starts
    /// a new session. For tests and for releasing every ephemeral key at once.
    pub async fn expire_session(&self) -> Result<()> {
        self.inner.check_open()?;
        self.inner.session.revoke_current(&self.inner.config).await
    }

    /// Waits (at most `request_timeout`) until every watch stream of this store has been
    /// handed the events of every write this store has completed so far: what the
    /// in-process stores guarantee when a write returns. `close` does this first, so events
    /// of earlier writes are never cut off by it.
    pub async fn settle_watches(&self) {
        self.inner.watches.settle(self.inner.config.request_timeout).await;
    }
}

impl Drop for EtcdStore {
    /// Stops the background tasks. The lease is not revoked (that needs a request): without
    /// `close`, ephemeral keys last until the session TTL runs out.
    fn drop(&mut self) {
        self.inner.shutdown.send_replace(true);
    }
}

#[async_trait]
impl MetadataStore for EtcdStore {
    async fn get(&self, key: &str) -> Result<Option<Versioned>> {
        magnetar_metadata::validate_key(key)?;
        self.inner.check_open()?;
        self.inner.kv.get(&self.inner.config, key).await
    }

    async fn get_many(&self, keys: &[String]) -> Result<Vec<Option<Versioned>>> {
        for key in keys {
            magnetar_metadata::validate_key(key)?;
        }
        self.inner.check_open()?;
        self.inner.kv.get_many(&self.inner.config, keys).await
    }

    async fn put(&self, key: &str, value: Bytes, expected: ExpectedVersion) -> Result<u64> {
        kv::check_write(&self.inner.config, key, value.len())?;
        self.inner.check_open()?;
        let (version, revision) =
            self.inner.kv.put(&self.inner.config, key, value, expected, None).await?;
        self.inner.watches.note_write(&self.inner.config.root, key, revision);
        Ok(version)
    }

    async fn delete(&self, key: &str, expected: ExpectedVersion) -> Result<()> {
        magnetar_metadata::validate_key(key)?;
        self.inner.check_open()?;
        let revision = self.inner.kv.delete(&self.inner.config, key, expected).await?;
        self.inner.watches.note_write(&self.inner.config.root, key, revision);
        Ok(())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        magnetar_metadata::validate_prefix(prefix)?;
        self.inner.check_open()?;
        self.inner.kv.list(&self.inner.config, prefix).await
    }

    async fn list_children(&self, path: &str) -> Result<Vec<String>> {
        magnetar_metadata::validate_path(path)?;
        self.inner.check_open()?;
        self.inner.kv.list_children(&self.inner.config, path).await
    }

    async fn watch(&self, prefix: &str) -> Result<WatchStream> {
        magnetar_metadata::validate_prefix(prefix)?;
        self.inner.check_open()?;
        watch::start(&self.inner, prefix).await
    }

    /// Waits (bounded) until watch streams hold the events of this store's earlier writes,
    /// then revokes the session's lease (deleting its ephemeral keys; if etcd cannot be
    /// reached they go when the TTL runs out) and ends the session events and watch streams.
    /// Later calls return `Closed`. Idempotent.
    async fn close(&self) -> Result<()> {
        if self.inner.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        self.inner.watches.settle(self.inner.config.request_timeout).await;
        self.inner.shutdown.send_replace(true);
        self.inner.session.close(&self.inner.config).await;
        Ok(())
    }
}

#[async_trait]
impl SessionStore for EtcdStore {
    async fn put_ephemeral(
        &self,
        key: &str,
        value: Bytes,
        expected: ExpectedVersion,
    ) -> Result<u64> {
        kv::check_write(&self.inner.config, key, value.len())?;
        self.inner.check_open()?;
        let lease = self.inner.session.live_lease()?;
        let result = self.inner.kv.put(&self.inner.config, key, value, expected, Some(lease)).await;
        match result {
            Ok((version, revision)) => {
                self.inner.watches.note_write(&self.inner.config.root, key, revision);
                if !self.inner.session.is_current(lease) {
                    // The session was declared lost while the write was in flight: the key
                    // goes with the lease (revoked, or expired), so do not report success
                    // after `SessionLost`.
                    return Err(MetadataError::SessionExpired {
                        reason: "the etcd session ended while the write was in flight".into(),
                    });
                }
                Ok(version)
            }
            Err(e) => {
                if e.is_session_expired() {
                    // etcd no longer knows the lease: let the keeper find out now.
                    self.inner.session.poke();
                }
                Err(e)
            }
        }
    }

    fn session(&self) -> SessionState {
        self.inner.session.state()
    }

    fn session_events(&self) -> SessionEvents {
        self.inner.session.subscribe()
    }
}
