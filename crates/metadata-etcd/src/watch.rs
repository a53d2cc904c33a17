//! Watches on etcd: one etcd watch stream per `watch` call, forwarded by a task into a
//! bounded `WatchStream` (the trait's `Lagged` rules).
//!
//! `start` reads the current revision R and the forwarder watches from R + 1, so exactly
//! the changes committed after `watch` returns (and possibly a few just before) arrive.
//! The forwarder remembers the revision after the last event it handed on (`next`); when the
//! etcd stream breaks or is cancelled it reopens from `next` with a bounded backoff, so no
//! revision is skipped or repeated (etcd never splits one revision's events across batches).
//! If etcd has compacted `next` away, the forwarder queues `Lagged` and resumes from the
//! oldest revision etcd still has: a gap is always explicit.
//!
//! For `settle` (and `close`), the registry tracks per stream the highest revision of this
//! store's own writes under its prefix and the revision the forwarder has handed on.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, EventType, WatchClient, WatchOptions};
use magnetar_metadata::{watch_channel, EventKind, Result, WatchSender, WatchStream};
use parking_lot::Mutex;
use tokio::sync::watch as signal;
use tokio::time::{sleep, timeout, Instant};

use crate::kv::{full_key, strip_root};
use crate::Inner;

const REOPEN_BACKOFF_MIN: Duration = Duration::from_millis(50);
const REOPEN_BACKOFF_MAX: Duration = Duration::from_secs(2);
/// Largest watch response decoded: like etcd's own client (math.MaxInt32), since one
/// response may batch many revisions, each with values up to `MAX_VALUE_LEN`.
const WATCH_MAX_DECODING_BYTES: usize = i32::MAX as usize;

/// Progress of one forwarder, for `settle`.
struct Progress {
    /// The etcd prefix watched.
    prefix: String,
    /// Highest revision of this store's own writes under `prefix`.
    expected: AtomicI64,
    /// Highest revision handed on (`i64::MAX` once the forwarder ended).
    delivered: signal::Sender<i64>,
}

/// The store's watch client and its forwarders' progress.
pub(crate) struct WatchRegistry {
    client: WatchClient,
    progress: Mutex<Vec<Arc<Progress>>>,
}

impl WatchRegistry {
    pub(crate) fn new(client: Client) -> Self {
        let client = client.watch_client().max_decoding_message_size(WATCH_MAX_DECODING_BYTES);
        WatchRegistry { client, progress: Mutex::new(Vec::new()) }
    }

    /// Records that this store wrote `key` at `revision`.
    pub(crate) fn note_write(&self, root: &str, key: &str, revision: i64) {
        let full = format!("{root}{key}");
        let mut all = self.progress.lock();
        all.retain(|p| *p.delivered.borrow() != i64::MAX);
        for p in all.iter().filter(|p| full.starts_with(&p.prefix)) {
            p.expected.fetch_max(revision, Ordering::SeqCst);
        }
    }

    /// Waits, at most `bound` in total, until every forwarder has handed on the events of
    /// every write recorded so far.
    pub(crate) async fn settle(&self, bound: Duration) {
        let deadline = Instant::now() + bound;
        let all: Vec<Arc<Progress>> = self.progress.lock().clone();
        for p in all {
            let target = p.expected.load(Ordering::SeqCst);
            let mut delivered = p.delivered.subscribe();
            let left = deadline.saturating_duration_since(Instant::now());
            let _ = timeout(left, delivered.wait_for(|d| *d >= target)).await;
        }
    }
}

/// Starts a watch of `prefix` (a validated trait prefix).
pub(crate) async fn start(inner: &Arc<Inner>, prefix: &str) -> Result<WatchStream> {
    let revision = inner.kv.current_revision(&inner.config, prefix).await?;
    let (sender, stream) = watch_channel(prefix, inner.config.watch_capacity);
    let (delivered, _) = signal::channel(revision);
    let progress = Arc::new(Progress {
        prefix: full_key(&inner.config, prefix),
        expected: AtomicI64::new(0),
        delivered,
    });
    inner.watches.progress.lock().push(progress.clone());
    let inner = inner.clone();
    tokio::spawn(async move {
        let mut shutdown = inner.shutdown.subscribe();
        tokio::select! {
            _ = shutdown.wait_for(|closed| *closed) => {}
            _ = sender.closed() => {}
            _ = forward(&inner, &sender, &progress, revision + 1) => {}
        }
        progress.delivered.send_replace(i64::MAX);
    });
    Ok(stream)
}

/// Forwards etcd events from revision `next` on; returns only if the stream was dropped.
async fn forward(inner: &Inner, sender: &WatchSender, progress: &Progress, mut next: i64) {
    let root_len = inner.config.root.len();
    let mut backoff = REOPEN_BACKOFF_MIN;
    loop {
        let options = WatchOptions::new().with_prefix().with_start_revision(next);
        let mut client = inner.watches.client.clone();
        let opened = timeout(
            inner.config.request_timeout,
            client.watch(progress.prefix.clone(), Some(options)),
        )
        .await;
        if let Ok(Ok(stream)) = opened {
            let (_requests, mut responses) = stream.split();
            while let Ok(Some(resp)) = responses.message().await {
                if resp.compact_revision() > 0 {
                    // `next` is gone from etcd's history: say so, resume from what is left.
                    sender.send_lagged();
                    next = next.max(resp.compact_revision());
                    break;
                }
                if resp.canceled() {
                    break; // e.g. the member lost its leader: reopen
                }
                for event in resp.events() {
                    let Some(kv) = event.kv() else { continue };
                    let revision = kv.mod_revision();
                    // Non-decreasing (one revision may hold several events, e.g. a revoke).
                    debug_assert!(revision + 1 >= next, "etcd went back to {revision} < {next}");
                    next = next.max(revision + 1);
                    let Some(key) = strip_root(kv.key(), root_len) else { continue };
                    let kind = match event.event_type() {
                        EventType::Put => EventKind::Put { version: kv.version().unsigned_abs() },
                        EventType::Delete => EventKind::Delete,
                    };
                    sender.send(&key, kind);
                }
                progress.delivered.send_if_modified(|d| {
                    let advanced = next - 1 > *d;
                    *d = (*d).max(next - 1);
                    advanced
                });
                backoff = REOPEN_BACKOFF_MIN;
            }
        }
        sleep(backoff).await;
        backoff = (backoff * 2).min(REOPEN_BACKOFF_MAX);
    }
}
