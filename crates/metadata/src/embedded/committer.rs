//! The embedded store's committer thread: group commit, apply, notify, snapshot.
//!
//! One dedicated OS thread owns the log file, so no blocking I/O runs on the tokio runtime.
//! Writers send requests over a channel and await a oneshot reply. The thread takes every
//! request that is already queued (up to `max_batch_bytes`) as one batch, decides each
//! compare-and-set against the committed state plus the earlier requests of the same batch,
//! appends all resulting records with one `append` and makes them durable with one `sync`
//! (fdatasync), then applies them to the shared in-memory state, notifies watchers and
//! replies. Invariants:
//! * a write is acknowledged (and visible to readers) only after its record is durable;
//! * exactly one fdatasync per batch that contains at least one record, none otherwise;
//! * the committer is the only mutator of the shared state, so decisions taken under a
//!   short read lock remain valid until the batch is applied;
//! * ephemeral keys never reach the log: an ephemeral put logs nothing, except a delete
//!   record when it turns a persistent key ephemeral; deleting an ephemeral key logs
//!   nothing; snapshots leave ephemeral keys out. So recovery never resurrects one;
//! * after any append/sync failure, or a failure after a snapshot was renamed into place,
//!   the committer is poisoned: it refuses all later writes with `Poisoned`.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::oneshot;

use super::format::{self, LOG_HEADER_LEN};
use super::io::{remove_if_exists, sync_dir, FileLogIo, LogIo};
use super::{
    EmbeddedStoreConfig, Shared, LOG_FILE, LOG_TMP_FILE, SNAPSHOT_FILE, SNAPSHOT_TMP_FILE,
};
use crate::error::{MetadataError, Result};
use crate::session::{SessionEvent, SessionId, SessionState};
use crate::state::{check_delete, check_put};
use crate::ExpectedVersion;

/// A request to the committer thread.
pub(crate) enum Request {
    Put {
        key: String,
        value: Bytes,
        expected: ExpectedVersion,
        /// Bind the key to the current session (and keep it out of the log).
        ephemeral: bool,
        reply: oneshot::Sender<Result<u64>>,
    },
    Delete {
        key: String,
        expected: ExpectedVersion,
        reply: oneshot::Sender<Result<()>>,
    },
    Compact {
        reply: oneshot::Sender<Result<()>>,
    },
    ExpireSession {
        reply: oneshot::Sender<SessionId>,
    },
    Shutdown {
        reply: oneshot::Sender<()>,
    },
}

impl Request {
    fn is_write(&self) -> bool {
        matches!(self, Request::Put { .. } | Request::Delete { .. })
    }

    fn encoded_len(&self) -> usize {
        match self {
            Request::Put { key, value, .. } => format::put_record_len(key, value.len()),
            Request::Delete { key, .. } => format::put_record_len(key, 0),
            _ => 0,
        }
    }
}

/// What the batch decided for one write.
enum Decision {
    Put { key: String, value: Bytes, version: u64, owner: Option<u64> },
    Delete { key: String },
    Rejected(MetadataError),
}

/// Opens (wraps) a log sink according to the config.
pub(crate) fn wrap_log(config: &EmbeddedStoreConfig, file: File) -> Box<dyn LogIo> {
    let sink: Box<dyn LogIo> = Box::new(FileLogIo::new(file));
    match &config.log_io_wrapper {
        Some(wrap) => wrap(sink),
        None => sink,
    }
}

/// Creates a fresh log with `generation` durably (write temp, fsync, rename, fsync dir) and
/// returns the open file positioned after the header.
pub(crate) fn create_log(dir: &Path, generation: u64) -> std::io::Result<File> {
    let tmp = dir.join(LOG_TMP_FILE);
    let mut file = OpenOptions::new().write(true).create(true).truncate(true).open(&tmp)?;
    file.write_all(&format::encode_log_header(generation))?;
    file.sync_all()?;
    std::fs::rename(&tmp, dir.join(LOG_FILE))?;
    sync_dir(dir)?;
    Ok(file)
}

pub(crate) struct Committer {
    pub(crate) dir: PathBuf,
    pub(crate) config: EmbeddedStoreConfig,
    pub(crate) shared: Arc<Shared>,
    pub(crate) rx: Receiver<Request>,
    pub(crate) log: Box<dyn LogIo>,
    pub(crate) log_len: u64,
    pub(crate) generation: u64,
    pub(crate) poisoned: Option<String>,
    /// Log length below which no automatic snapshot is attempted (raised after a failed
    /// attempt, so a persistent snapshot failure does not retry on every batch).
    pub(crate) next_snapshot_at: u64,
    /// Holds the directory lock for as long as the committer lives.
    pub(crate) _lock: File,
}

impl Committer {
    /// Runs until the channel closes or a shutdown request arrives; returns the shutdown
    /// reply, which the caller sends after dropping the committer (closing every file).
    pub(crate) fn run(&mut self) -> Option<oneshot::Sender<()>> {
        let mut carried: Option<Request> = None;
        loop {
            let first = match carried.take() {
                Some(r) => r,
                None => match self.rx.recv() {
                    Ok(r) => r,
                    Err(_) => return None,
                },
            };
            match first {
                Request::Shutdown { reply } => return Some(reply),
                Request::Compact { reply } => {
                    let _ = reply.send(self.compact());
                }
                Request::ExpireSession { reply } => {
                    let _ = reply.send(self.expire_session());
                }
                write => {
                    let mut bytes = write.encoded_len();
                    let mut batch = vec![write];
                    while bytes < self.config.max_batch_bytes {
                        match self.rx.try_recv() {
                            Ok(r) if r.is_write() => {
                                bytes += r.encoded_len();
                                batch.push(r);
                            }
                            Ok(other) => {
                                carried = Some(other);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    self.commit_batch(batch);
                    self.maybe_snapshot();
                }
            }
        }
    }

    fn poison(&mut self, reason: String) {
        self.shared.stats.poisoned.store(true, Ordering::SeqCst);
        self.poisoned = Some(reason);
    }

    fn commit_batch(&mut self, batch: Vec<Request>) {
        if let Some(reason) = &self.poisoned {
            let reason = reason.clone();
            reply_all(batch, |_| MetadataError::Poisoned { reason: reason.clone() });
            return;
        }

        // Decide every request against committed state + earlier requests of this batch.
        let mut buf = Vec::new();
        let mut decisions = Vec::with_capacity(batch.len());
        {
            let guard = self.shared.state.lock();
            let Some(state) = guard.as_ref() else {
                drop(guard);
                reply_all(batch, |_| MetadataError::Closed);
                return;
            };
            // Key -> (version, ephemeral) after the earlier requests of this batch.
            let mut staged: HashMap<&str, Option<(u64, bool)>> = HashMap::new();
            let session = self.shared.session.load(Ordering::SeqCst);
            for req in &batch {
                let decision = match req {
                    Request::Put { key, value, expected, ephemeral, .. } => {
                        let current = match staged.get(key.as_str()) {
                            Some(v) => *v,
                            None => state
                                .version(key)
                                .map(|v| (v, state.ephemeral_owner(key).is_some())),
                        };
                        match check_put(key, current.map(|(v, _)| v), *expected) {
                            Ok(version) => {
                                match (ephemeral, current) {
                                    (false, _) => format::encode_put(&mut buf, key, version, value),
                                    // Persistent -> ephemeral: it must not survive a restart.
                                    (true, Some((old, false))) => {
                                        format::encode_delete(&mut buf, key, old)
                                    }
                                    (true, _) => {}
                                }
                                staged.insert(key, Some((version, *ephemeral)));
                                let owner = ephemeral.then_some(session);
                                Decision::Put {
                                    key: key.clone(),
                                    value: value.clone(),
                                    version,
                                    owner,
                                }
                            }
                            Err(e) => Decision::Rejected(e),
                        }
                    }
                    Request::Delete { key, expected, .. } => {
                        let current = match staged.get(key.as_str()) {
                            Some(v) => *v,
                            None => state
                                .version(key)
                                .map(|v| (v, state.ephemeral_owner(key).is_some())),
                        };
                        match check_delete(key, current.map(|(v, _)| v), *expected) {
                            Ok(version) => {
                                let was_ephemeral = current.is_some_and(|(_, e)| e);
                                if !was_ephemeral {
                                    format::encode_delete(&mut buf, key, version);
                                }
                                staged.insert(key, None);
                                Decision::Delete { key: key.clone() }
                            }
                            Err(e) => Decision::Rejected(e),
                        }
                    }
                    // Only writes are batched.
                    _ => Decision::Rejected(MetadataError::Closed),
                };
                decisions.push(decision);
            }
        }

        if !buf.is_empty() {
            if let Err((context, e)) = self.write_durably(&buf) {
                let reason = format!("{context}: {e}");
                self.poison(reason);
                let kind = e.kind();
                let msg = e.to_string();
                reply_all(batch, |_| {
                    MetadataError::io(
                        format!("{context} (write outcome unknown)"),
                        std::io::Error::new(kind, msg.clone()),
                    )
                });
                return;
            }
        }

        // Durable: apply in order (notifying watchers) and then reply.
        {
            let mut guard = self.shared.state.lock();
            if let Some(state) = guard.as_mut() {
                for d in &decisions {
                    match d {
                        Decision::Put { key, value, version, owner } => {
                            state.apply_put(key.clone(), value.clone(), *version, *owner)
                        }
                        Decision::Delete { key } => state.apply_delete(key),
                        Decision::Rejected(_) => {}
                    }
                }
            }
        }
        for (req, decision) in batch.into_iter().zip(decisions) {
            match (req, decision) {
                (Request::Put { reply, .. }, Decision::Put { version, .. }) => {
                    let _ = reply.send(Ok(version));
                }
                (Request::Delete { reply, .. }, Decision::Delete { .. }) => {
                    let _ = reply.send(Ok(()));
                }
                (req, Decision::Rejected(e)) => send_err(req, e),
                (req, _) => send_err(req, MetadataError::Closed),
            }
        }
    }

    /// Deletes the current session's ephemeral keys (nothing to log: they never were) and
    /// starts the next session; publishes both events under the state lock, so they follow
    /// the deletions' watch events.
    fn expire_session(&mut self) -> SessionId {
        let mut guard = self.shared.state.lock();
        let old = self.shared.session.load(Ordering::SeqCst);
        if let Some(state) = guard.as_mut() {
            state.expire_session(old);
        }
        let new = old + 1;
        self.shared.session.store(new, Ordering::SeqCst);
        let notifier = &self.shared.notifier;
        let old = SessionId(old);
        notifier.publish(SessionState::Lost, SessionEvent::SessionLost { session: old });
        let new = SessionId(new);
        notifier.publish(
            SessionState::Connected(new),
            SessionEvent::SessionReestablished { session: new },
        );
        new
    }

    /// One append + one fdatasync. On error returns what was being done.
    fn write_durably(&mut self, buf: &[u8]) -> Result<(), (&'static str, std::io::Error)> {
        let stats = &self.shared.stats;
        self.log.append(buf).map_err(|e| ("appending to the metadata log", e))?;
        self.log_len += buf.len() as u64;
        stats.log_bytes.store(self.log_len, Ordering::Relaxed);
        self.log.sync().map_err(|e| ("syncing the metadata log", e))?;
        stats.syncs.fetch_add(1, Ordering::Relaxed);
        stats.batches.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn maybe_snapshot(&mut self) {
        if self.poisoned.is_some() || self.log_len < self.next_snapshot_at {
            return;
        }
        let live = self.shared.state.lock().as_ref().map_or(0, |s| s.live_bytes());
        let record_bytes = self.log_len - LOG_HEADER_LEN;
        if record_bytes < self.config.snapshot_threshold_bytes
            || record_bytes < live.saturating_mul(self.config.snapshot_live_factor)
        {
            return;
        }
        if self.compact().is_err() && self.poisoned.is_none() {
            // The old log is intact; try again after another threshold's worth of records.
            self.next_snapshot_at =
                self.log_len.saturating_add(self.config.snapshot_threshold_bytes.max(1));
        }
    }

    /// Writes a snapshot of the committed state and starts a new, empty log.
    pub(crate) fn compact(&mut self) -> Result<()> {
        if let Some(reason) = &self.poisoned {
            return Err(MetadataError::Poisoned { reason: reason.clone() });
        }
        let entries: Vec<_> = match self.shared.state.lock().as_ref() {
            Some(state) => {
                state.persistent_entries().map(|(k, v)| (k.clone(), v.clone())).collect()
            }
            None => return Err(MetadataError::Closed),
        };

        // Phase 1: write the snapshot under a temporary name. Failure here is harmless.
        let tmp = self.dir.join(SNAPSHOT_TMP_FILE);
        if let Err(e) = write_snapshot_file(&tmp, self.generation, &entries) {
            let _ = remove_if_exists(&tmp);
            return Err(MetadataError::io("writing the metadata snapshot", e));
        }
        if let Err(e) = std::fs::rename(&tmp, self.dir.join(SNAPSHOT_FILE)) {
            let _ = remove_if_exists(&tmp);
            return Err(MetadataError::io("renaming the metadata snapshot", e));
        }

        // Phase 2: the snapshot may now be durable and covers the current log generation, so
        // no more records may go to that log. Any failure from here on poisons the store.
        let new_generation = self.generation + 1;
        let result = sync_dir(&self.dir)
            .map_err(|e| ("syncing the metadata directory after a snapshot", e))
            .and_then(|()| {
                create_log(&self.dir, new_generation)
                    .map_err(|e| ("starting a new metadata log", e))
            });
        match result {
            Ok(file) => {
                self.log = wrap_log(&self.config, file);
                self.log_len = LOG_HEADER_LEN;
                self.generation = new_generation;
                self.next_snapshot_at = 0;
                let stats = &self.shared.stats;
                stats.log_bytes.store(self.log_len, Ordering::Relaxed);
                stats.snapshots.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err((context, e)) => {
                self.poison(format!("{context}: {e}"));
                Err(MetadataError::io(context, e))
            }
        }
    }
}

fn write_snapshot_file(
    path: &Path,
    generation: u64,
    entries: &[(String, crate::Versioned)],
) -> std::io::Result<()> {
    let file = OpenOptions::new().write(true).create(true).truncate(true).open(path)?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    format::write_snapshot(&mut w, generation, entries)?;
    let file = w.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()
}

fn send_err(req: Request, e: MetadataError) {
    match req {
        Request::Put { reply, .. } => {
            let _ = reply.send(Err(e));
        }
        Request::Delete { reply, .. } => {
            let _ = reply.send(Err(e));
        }
        Request::Compact { reply } => {
            let _ = reply.send(Err(e));
        }
        Request::ExpireSession { .. } | Request::Shutdown { .. } => {}
    }
}

fn reply_all(batch: Vec<Request>, mut err: impl FnMut(&Request) -> MetadataError) {
    for req in batch {
        let e = err(&req);
        send_err(req, e);
    }
}
