//! `EmbeddedStore`: the durable, crash-safe [`MetadataStore`] for standalone mode.
//!
//! Layout of the data directory:
//! * `LOCK`: held with an exclusive advisory lock while a store has the directory open;
//! * `snapshot`: the full key space as of log generation G (absent until the first
//!   snapshot), replaced atomically via `snapshot.tmp` + fsync + rename + fsync(dir);
//! * `log`: append-only CRC32C-checked records of generation G + 1, replaced atomically via
//!   `log.tmp` when a snapshot is taken.
//!
//! See `format.rs` for the byte layout and `committer.rs` for the write path (group commit:
//! one fdatasync per batch of concurrent writes, acknowledged only once durable).
//!
//! Ephemeral keys ([`SessionStore::put_ephemeral`]) live only in memory: they are never
//! written to the log or a snapshot, so they are gone after a restart (there is one session
//! per open store, and it ends with the process). Turning a persistent key ephemeral logs a
//! delete record, so the old persistent value cannot come back at recovery either; turning
//! it persistent again logs an ordinary put.
//!
//! Recovery on open: load and verify the snapshot (a bad snapshot is a hard `Corrupt`
//! error), discard a stale log whose generation the snapshot already covers (crash between
//! snapshot and log reset), replay the log up to the first torn or checksum-failing record,
//! and truncate the file there (fsynced) before accepting writes. Invariant: after `open`
//! returns, the in-memory state equals snapshot + every complete record, and the log on disk
//! ends exactly after the last complete record.

mod committer;
mod format;
mod io;

use std::fs::OpenOptions;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::oneshot;

use self::committer::{create_log, wrap_log, Committer, Request};
use self::format::{Record, LOG_HEADER_LEN};
pub use self::io::{FileLogIo, LogIo, LogIoWrapper};
use crate::error::{MetadataError, Result};
use crate::key::{validate_key, validate_path, validate_prefix, validate_value};
use crate::session::{SessionEvents, SessionId, SessionNotifier, SessionState, SessionStore};
use crate::state::KvState;
use crate::{ExpectedVersion, MetadataStore, Versioned, WatchStream};

/// Watch-stream owner id used by the embedded store (it has a single client).
const WATCH_OWNER: u64 = 0;
/// Id of the first session of an open store (later ones count up from it).
const FIRST_SESSION: u64 = 1;

const LOCK_FILE: &str = "LOCK";
const LOG_FILE: &str = "log";
const LOG_TMP_FILE: &str = "log.tmp";
const SNAPSHOT_FILE: &str = "snapshot";
const SNAPSHOT_TMP_FILE: &str = "snapshot.tmp";

/// Configuration of an [`EmbeddedStore`].
#[derive(Clone)]
pub struct EmbeddedStoreConfig {
    /// Data directory; created if missing. Only one store may have it open at a time.
    pub dir: PathBuf,
    /// A snapshot is taken once the log holds at least this many bytes of records (and the
    /// `snapshot_live_factor` condition holds). Default 4 MiB. Recovery time and disk use
    /// grow with this; write throughput shrinks a little when it is small.
    pub snapshot_threshold_bytes: u64,
    /// A snapshot is taken only when the log is at least this many times larger than the
    /// live data (keys + values), so large key spaces are not rewritten for little gain.
    /// Default 2; 0 disables the condition.
    pub snapshot_live_factor: u64,
    /// Upper bound on the record bytes gathered into one group commit (one fdatasync).
    /// A single larger write still goes through alone. Default 8 MiB.
    pub max_batch_bytes: usize,
    /// Queue length of each watch stream before it signals `Lagged`. Default 1024, min 2.
    pub watch_capacity: usize,
    /// Fault-injection seam: wraps the log sink each time a log file is opened. Leave `None`
    /// in production.
    pub log_io_wrapper: Option<LogIoWrapper>,
}

impl EmbeddedStoreConfig {
    /// Defaults for everything but the directory.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        EmbeddedStoreConfig {
            dir: dir.into(),
            snapshot_threshold_bytes: 4 * 1024 * 1024,
            snapshot_live_factor: 2,
            max_batch_bytes: 8 * 1024 * 1024,
            watch_capacity: crate::memory::DEFAULT_WATCH_CAPACITY,
            log_io_wrapper: None,
        }
    }
}

impl std::fmt::Debug for EmbeddedStoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStoreConfig")
            .field("dir", &self.dir)
            .field("snapshot_threshold_bytes", &self.snapshot_threshold_bytes)
            .field("snapshot_live_factor", &self.snapshot_live_factor)
            .field("max_batch_bytes", &self.max_batch_bytes)
            .field("watch_capacity", &self.watch_capacity)
            .field("log_io_wrapper", &self.log_io_wrapper.is_some())
            .finish()
    }
}

/// What recovery found when the store was opened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Entries loaded from the snapshot (0 without one).
    pub snapshot_entries: usize,
    /// Log generation covered by the snapshot (0 without one).
    pub snapshot_generation: u64,
    /// Generation of the live log after open.
    pub log_generation: u64,
    /// Complete records replayed from the log.
    pub log_records: usize,
    /// Bytes of torn or checksum-failing tail removed from the log.
    pub truncated_bytes: u64,
    /// A log already covered by the snapshot was discarded.
    pub stale_log_discarded: bool,
}

/// Counters of the write path (since open).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EmbeddedStats {
    /// Group commits that wrote at least one record.
    pub batches: u64,
    /// Successful fdatasync calls on the log.
    pub syncs: u64,
    /// Snapshots taken.
    pub snapshots: u64,
    /// Current log length in bytes, header included.
    pub log_bytes: u64,
    /// The store refuses writes after an I/O failure.
    pub poisoned: bool,
}

#[derive(Debug, Default)]
struct AtomicStats {
    batches: AtomicU64,
    syncs: AtomicU64,
    snapshots: AtomicU64,
    log_bytes: AtomicU64,
    poisoned: AtomicBool,
}

/// State shared by the store handle and its committer thread.
#[derive(Debug)]
struct Shared {
    /// `None` once the store is closed.
    state: Mutex<Option<KvState>>,
    stats: AtomicStats,
    /// The current session id; changed only by the committer, under the `state` lock.
    session: AtomicU64,
    notifier: SessionNotifier,
}

/// Durable metadata store in a local directory.
pub struct EmbeddedStore {
    shared: Arc<Shared>,
    tx: Mutex<Option<mpsc::Sender<Request>>>,
    recovery: RecoveryReport,
    dir: PathBuf,
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStore")
            .field("dir", &self.dir)
            .field("recovery", &self.recovery)
            .finish_non_exhaustive()
    }
}

impl EmbeddedStore {
    /// Opens (creating if needed) the store in `config.dir`, running recovery on a blocking
    /// thread. Fails with `Locked` if another store has the directory open, `Corrupt` if the
    /// snapshot or log header is damaged.
    pub async fn open(config: EmbeddedStoreConfig) -> Result<EmbeddedStore> {
        tokio::task::spawn_blocking(move || open_blocking(config))
            .await
            .map_err(|e| MetadataError::io("joining the recovery task", std::io::Error::other(e)))?
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What recovery did when this store was opened.
    pub fn recovery(&self) -> &RecoveryReport {
        &self.recovery
    }

    /// Current write-path counters.
    pub fn stats(&self) -> EmbeddedStats {
        let s = &self.shared.stats;
        EmbeddedStats {
            batches: s.batches.load(Ordering::Relaxed),
            syncs: s.syncs.load(Ordering::Relaxed),
            snapshots: s.snapshots.load(Ordering::Relaxed),
            log_bytes: s.log_bytes.load(Ordering::Relaxed),
            poisoned: s.poisoned.load(Ordering::SeqCst),
        }
    }

    /// Ends the current session as if it had expired: its ephemeral keys are deleted
    /// (watchers see `Delete` events), subscribers get `SessionLost`, then a new session
    /// starts (`SessionReestablished`). Returns the new session. Meant for tests and for
    /// callers that want to drop every ephemeral key at once.
    pub async fn expire_session(&self) -> Result<SessionId> {
        let (reply, rx) = oneshot::channel();
        self.send(Request::ExpireSession { reply })?;
        rx.await.map_err(|_| MetadataError::Closed)
    }

    /// Takes a snapshot now and starts a fresh log (normally automatic, see
    /// [`EmbeddedStoreConfig::snapshot_threshold_bytes`]).
    pub async fn compact(&self) -> Result<()> {
        let (reply, rx) = oneshot::channel();
        self.send(Request::Compact { reply })?;
        rx.await.map_err(|_| MetadataError::Closed)?
    }

    fn send(&self, req: Request) -> Result<()> {
        let guard = self.tx.lock();
        match guard.as_ref() {
            Some(tx) => tx.send(req).map_err(|_| MetadataError::Closed),
            None => Err(MetadataError::Closed),
        }
    }

    fn read<T>(&self, f: impl FnOnce(&mut KvState) -> T) -> Result<T> {
        match self.shared.state.lock().as_mut() {
            Some(state) => Ok(f(state)),
            None => Err(MetadataError::Closed),
        }
    }
}

#[async_trait]
impl MetadataStore for EmbeddedStore {
    async fn get(&self, key: &str) -> Result<Option<Versioned>> {
        validate_key(key)?;
        self.read(|s| s.get(key))
    }

    async fn put(&self, key: &str, value: Bytes, expected: ExpectedVersion) -> Result<u64> {
        validate_key(key)?;
        validate_value(key, value.len())?;
        let (reply, rx) = oneshot::channel();
        self.send(Request::Put { key: key.to_string(), value, expected, ephemeral: false, reply })?;
        rx.await.map_err(|_| MetadataError::Closed)?
    }

    async fn delete(&self, key: &str, expected: ExpectedVersion) -> Result<()> {
        validate_key(key)?;
        let (reply, rx) = oneshot::channel();
        self.send(Request::Delete { key: key.to_string(), expected, reply })?;
        rx.await.map_err(|_| MetadataError::Closed)?
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        validate_prefix(prefix)?;
        self.read(|s| s.list(prefix))
    }

    async fn list_children(&self, path: &str) -> Result<Vec<String>> {
        validate_path(path)?;
        self.read(|s| s.list_children(path))
    }

    async fn watch(&self, prefix: &str) -> Result<WatchStream> {
        validate_prefix(prefix)?;
        self.read(|s| s.watch(prefix, WATCH_OWNER))
    }

    /// Waits for writes already submitted, stops the committer thread (closing the log and
    /// releasing the directory lock), ends the session (its ephemeral keys are deleted, which
    /// watchers see) and then ends watch streams. Idempotent.
    async fn close(&self) -> Result<()> {
        let tx = self.tx.lock().take();
        if let Some(tx) = tx {
            let (reply, rx) = oneshot::channel();
            if tx.send(Request::Shutdown { reply }).is_ok() {
                // Err means the thread is already gone, which is just as good.
                let _ = rx.await;
            }
        }
        // The committer is gone, so nothing else mutates the state any more.
        let mut state = self.shared.state.lock();
        if let Some(s) = state.as_mut() {
            s.expire_session(self.shared.session.load(Ordering::SeqCst));
        }
        state.take();
        drop(state);
        self.shared.notifier.close();
        Ok(())
    }
}

#[async_trait]
impl SessionStore for EmbeddedStore {
    async fn put_ephemeral(
        &self,
        key: &str,
        value: Bytes,
        expected: ExpectedVersion,
    ) -> Result<u64> {
        validate_key(key)?;
        validate_value(key, value.len())?;
        let (reply, rx) = oneshot::channel();
        self.send(Request::Put { key: key.to_string(), value, expected, ephemeral: true, reply })?;
        rx.await.map_err(|_| MetadataError::Closed)?
    }

    fn session(&self) -> SessionState {
        self.shared.notifier.state()
    }

    fn session_events(&self) -> SessionEvents {
        self.shared.notifier.subscribe()
    }
}

fn corrupt(path: &Path, offset: u64, reason: impl Into<String>) -> MetadataError {
    MetadataError::Corrupt { path: path.to_path_buf(), offset, reason: reason.into() }
}

fn io_err(context: &str, path: &Path) -> impl FnOnce(std::io::Error) -> MetadataError {
    let context = format!("{context} {}", path.display());
    move |e| MetadataError::io(context, e)
}

fn open_blocking(config: EmbeddedStoreConfig) -> Result<EmbeddedStore> {
    let dir = config.dir.clone();
    if !dir.is_dir() {
        std::fs::create_dir_all(&dir).map_err(io_err("creating", &dir))?;
        // Make the new directory's own entry durable.
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            io::sync_dir(parent).map_err(io_err("syncing", parent))?;
        }
    }

    let lock_path = dir.join(LOCK_FILE);
    let lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .map_err(io_err("opening", &lock_path))?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(MetadataError::Locked { dir: dir.clone() })
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(io_err("locking", &lock_path)(e)),
    }

    for tmp in [SNAPSHOT_TMP_FILE, LOG_TMP_FILE] {
        let path = dir.join(tmp);
        io::remove_if_exists(&path).map_err(io_err("removing", &path))?;
    }

    let mut report = RecoveryReport::default();

    // 1. Snapshot.
    let snapshot_path = dir.join(SNAPSHOT_FILE);
    let (mut map, snapshot_generation) = match std::fs::read(&snapshot_path) {
        Ok(data) => {
            let snap = format::decode_snapshot(&data)
                .map_err(|reason| corrupt(&snapshot_path, 0, reason))?;
            report.snapshot_entries = snap.entries.len();
            (snap.entries, snap.generation)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (Default::default(), 0),
        Err(e) => return Err(io_err("reading", &snapshot_path)(e)),
    };
    report.snapshot_generation = snapshot_generation;

    // 2. Log.
    let log_path = dir.join(LOG_FILE);
    let expected_generation = snapshot_generation + 1;
    let existing = match OpenOptions::new().read(true).append(true).open(&log_path) {
        Ok(file) => Some(file),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io_err("opening", &log_path)(e)),
    };
    let (log_file, log_len) = match existing {
        None => (
            create_log(&dir, expected_generation).map_err(io_err("creating", &log_path))?,
            LOG_HEADER_LEN,
        ),
        Some(mut file) => {
            let mut data = Vec::new();
            file.read_to_end(&mut data).map_err(io_err("reading", &log_path))?;
            let generation =
                format::decode_log_header(&data).map_err(|reason| corrupt(&log_path, 0, reason))?;
            if generation < expected_generation {
                // Crash after the snapshot was renamed but before the log was replaced: the
                // snapshot already contains everything in this log.
                report.stale_log_discarded = true;
                drop(file);
                (
                    create_log(&dir, expected_generation).map_err(io_err("creating", &log_path))?,
                    LOG_HEADER_LEN,
                )
            } else if generation > expected_generation {
                return Err(corrupt(
                    &log_path,
                    8,
                    format!(
                        "log generation {generation} but the snapshot covers only {snapshot_generation} (snapshot missing?)"
                    ),
                ));
            } else {
                let body = &data[LOG_HEADER_LEN as usize..];
                let scan = format::scan_records(body).map_err(|e| {
                    corrupt(
                        &log_path,
                        LOG_HEADER_LEN + e.offset as u64,
                        format!("checksum-valid record does not decode: {}", e.reason),
                    )
                })?;
                for record in scan.records.iter().cloned() {
                    match record {
                        Record::Put { key, version, value } => {
                            map.insert(key, Versioned { value, version });
                        }
                        Record::Delete { key, .. } => {
                            map.remove(&key);
                        }
                    }
                }
                report.log_records = scan.records.len();
                let valid_len = LOG_HEADER_LEN + scan.valid_len as u64;
                let file_len = data.len() as u64;
                if valid_len < file_len {
                    file.set_len(valid_len)
                        .map_err(io_err("truncating the torn tail of", &log_path))?;
                    file.sync_all().map_err(io_err("syncing the truncated", &log_path))?;
                    report.truncated_bytes = file_len - valid_len;
                }
                (file, valid_len)
            }
        }
    };
    report.log_generation = expected_generation;

    let state = KvState::from_map(map, config.watch_capacity);
    let shared = Arc::new(Shared {
        state: Mutex::new(Some(state)),
        stats: AtomicStats::default(),
        session: AtomicU64::new(FIRST_SESSION),
        notifier: SessionNotifier::new(SessionId(FIRST_SESSION)),
    });
    shared.stats.log_bytes.store(log_len, Ordering::Relaxed);

    let (tx, rx) = mpsc::channel();
    let mut committer = Committer {
        dir: dir.clone(),
        log: wrap_log(&config, log_file),
        config,
        shared: shared.clone(),
        rx,
        log_len,
        generation: expected_generation,
        poisoned: None,
        next_snapshot_at: 0,
        _lock: lock,
    };
    std::thread::Builder::new()
        .name("magnetar-metadata-log".into())
        .spawn(move || {
            let reply = committer.run();
            drop(committer); // closes the log and releases the directory lock
            if let Some(reply) = reply {
                let _ = reply.send(());
            }
        })
        .map_err(|e| MetadataError::io("spawning the metadata committer thread", e))?;

    Ok(EmbeddedStore { shared, tx: Mutex::new(Some(tx)), recovery: report, dir })
}
