//! Key-value operations of the etcd store: get, compare-and-set put, delete, paginated
//! list and list_children, all under the configured root prefix.
//!
//! Invariants: every request is bounded by `request_timeout`; reads are linearizable (etcd's
//! default) and retried on retryable failures within that bound; a write is retried only
//! when its request provably never left (connection refused), so a write that returns `Io`
//! may or may not have been applied, and one that returns anything else was not; every page
//! of one listing is read at the same revision.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, GetResponse, KvClient, PutOptions, Txn,
    TxnOp, TxnOpResponse,
};
use magnetar_metadata::{ExpectedVersion, MetadataError, Result, Versioned};
use tokio::sync::oneshot;
use tokio::time::{timeout, Instant};

use crate::batch::{self, Queue, Read, Write};
use crate::config::{EtcdStoreConfig, MAX_DECODING_MESSAGE_BYTES};
use crate::errors::{classify, Failure};

/// First pause between retries of a read; doubles up to `RETRY_BACKOFF_MAX`.
const RETRY_BACKOFF_MIN: Duration = Duration::from_millis(20);
const RETRY_BACKOFF_MAX: Duration = Duration::from_millis(500);
/// A listing whose pinned revision gets compacted meanwhile starts over at most this often.
const LIST_RESTARTS_MAX: usize = 3;

/// Builds the gRPC client (connections are made lazily, per endpoint, balanced).
pub(crate) async fn connect_client(config: &EtcdStoreConfig) -> Result<Client> {
    let options = ConnectOptions::new()
        .with_connect_timeout(config.request_timeout)
        // etcd's default --grpc-keepalive-min-time is 5 s; pinging faster gets GOAWAY.
        .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
        .with_keep_alive_while_idle(false)
        // A member that lost its leader fails requests (and ends watches) instead of
        // serving stale data or hanging.
        .with_require_leader(true);
    Client::connect(&config.endpoints, Some(options)).await.map_err(|e| {
        let failure = classify(&e);
        io_error("connecting to etcd", &failure)
    })
}

pub(crate) fn io_error(context: &str, failure: &Failure) -> MetadataError {
    MetadataError::io(context, std::io::Error::new(failure.io_kind(), failure.message()))
}

/// Validates a write's key and value size against the store's limit.
pub(crate) fn check_write(config: &EtcdStoreConfig, key: &str, len: usize) -> Result<()> {
    magnetar_metadata::validate_key(key)?;
    if len > config.max_value_len {
        return Err(MetadataError::ValueTooLarge {
            key: key.to_string(),
            len,
            max: config.max_value_len,
        });
    }
    Ok(())
}

/// The etcd key of a metadata key (or prefix, or path).
/// Gets per read-only transaction: well under etcd's `--max-txn-ops` (128 by default).
const MAX_TXN_READS: usize = 64;

pub(crate) fn full_key(config: &EtcdStoreConfig, key: &str) -> String {
    format!("{}{key}", config.root)
}

/// The smallest key greater than every key starting with `prefix` (etcd's range end for a
/// prefix). Keys are UTF-8, which has no 0xff byte, so incrementing the last byte works.
pub(crate) fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0] // unreachable for UTF-8 input: "to the end of the key space"
}

/// Converts an etcd version (i64) to the trait's (u64); etcd versions are >= 1.
fn version_of(raw: i64) -> Result<u64> {
    u64::try_from(raw).ok().filter(|v| *v >= 1).ok_or_else(|| {
        MetadataError::io(
            "reading an etcd response",
            std::io::Error::new(std::io::ErrorKind::InvalidData, format!("bad version {raw}")),
        )
    })
}

fn header_revision(header: Option<&etcd_client::ResponseHeader>) -> i64 {
    header.map_or(0, |h| h.revision())
}

/// Runs `op` until it succeeds, fails for good, or `deadline` passes. `retry_all` retries
/// every retryable failure (reads); otherwise only requests that never left (writes).
async fn with_retries<T, F, Fut>(
    deadline: Instant,
    retry_all: bool,
    mut op: F,
) -> std::result::Result<T, Failure>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
{
    let mut backoff = RETRY_BACKOFF_MIN;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let failure = match timeout(left, op()).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(e)) => classify(&e),
            Err(_) => return Err(Failure::timed_out()),
        };
        let retry = match failure {
            Failure::NotSent(_) => true,
            ref f => retry_all && f.is_retryable(),
        };
        if !retry || Instant::now() + backoff >= deadline {
            return Err(failure);
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(RETRY_BACKOFF_MAX);
    }
}

/// The key-value client of a store.
pub(crate) struct Kv {
    client: KvClient,
    /// What the batches' runners (tasks of their own) need.
    batches: Arc<Batches>,
}

/// Reads and writes waiting to be combined into one request (see `batch.rs`).
struct Batches {
    client: KvClient,
    config: EtcdStoreConfig,
    reads: Queue<Read>,
    writes: Queue<Write>,
}

impl Kv {
    pub(crate) fn new(client: &Client, config: &EtcdStoreConfig) -> Self {
        let client = client
            .kv_client()
            .max_decoding_message_size(MAX_DECODING_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_DECODING_MESSAGE_BYTES);
        let batches = Arc::new(Batches {
            client: client.clone(),
            config: config.clone(),
            reads: Queue::default(),
            writes: Queue::default(),
        });
        Kv { client, batches }
    }

    fn deadline(config: &EtcdStoreConfig) -> Instant {
        Instant::now() + config.request_timeout
    }

    /// How long a caller waits for its batched operation: its turn in the queue, then the
    /// request (itself bounded by `request_timeout`).
    fn batched_wait(config: &EtcdStoreConfig) -> Duration {
        config.request_timeout * 2
    }

    /// Gets `keys` (etcd keys) in a batch with other callers' gets.
    async fn read_batched(
        &self,
        config: &EtcdStoreConfig,
        keys: Vec<Vec<u8>>,
    ) -> Result<Vec<Option<Versioned>>> {
        let (reply, answer) = oneshot::channel();
        if self.batches.reads.push(Read { keys, reply }) {
            let batches = self.batches.clone();
            tokio::spawn(async move { batches.run_reads().await });
        }
        await_batched(config, answer, "reading from etcd (timed out in the queue)").await
    }

    /// A range read, retried within the request timeout.
    async fn range_raw(
        &self,
        config: &EtcdStoreConfig,
        key: Vec<u8>,
        options: GetOptions,
    ) -> std::result::Result<GetResponse, Failure> {
        with_retries(Self::deadline(config), true, || {
            let mut client = self.client.clone();
            let (key, options) = (key.clone(), options.clone());
            async move { client.get(key, Some(options)).await }
        })
        .await
    }

    async fn range(
        &self,
        config: &EtcdStoreConfig,
        key: Vec<u8>,
        options: GetOptions,
    ) -> Result<GetResponse> {
        self.range_raw(config, key, options).await.map_err(|f| io_error("reading from etcd", &f))
    }

    pub(crate) async fn get(
        &self,
        config: &EtcdStoreConfig,
        key: &str,
    ) -> Result<Option<Versioned>> {
        let keys = vec![full_key(config, key).into_bytes()];
        let mut found = self.read_batched(config, keys).await?;
        found.pop().ok_or_else(|| impossible("no answer to a get"))
    }

    /// Reads `keys` in read-only transactions of at most [`MAX_TXN_READS`] gets each (one
    /// round trip, one snapshot, for a topic's few keys), retried within the request timeout;
    /// a few keys share their transaction with other callers' gets.
    pub(crate) async fn get_many(
        &self,
        config: &EtcdStoreConfig,
        keys: &[String],
    ) -> Result<Vec<Option<Versioned>>> {
        let full = |key: &String| full_key(config, key).into_bytes();
        if keys.len() <= batch::MAX_BATCH_OPS {
            return self.read_batched(config, keys.iter().map(full).collect()).await;
        }
        let mut found = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(MAX_TXN_READS) {
            found.extend(read_keys(&self.client, config, chunk.iter().map(full).collect()).await?);
        }
        Ok(found)
    }

    /// The current revision of the cluster (a cheap count-only read of `key`).
    pub(crate) async fn current_revision(
        &self,
        config: &EtcdStoreConfig,
        key: &str,
    ) -> Result<i64> {
        let resp = self
            .range(config, full_key(config, key).into_bytes(), GetOptions::new().with_count_only())
            .await?;
        Ok(header_revision(resp.header()))
    }

    /// Runs a write txn: retried only while provably unsent. Maps failures to typed errors
    /// (`value_len` is reported if etcd refuses the request as too large).
    async fn txn(
        &self,
        config: &EtcdStoreConfig,
        key: &str,
        value_len: usize,
        txn: Txn,
    ) -> Result<etcd_client::TxnResponse> {
        let result = send_txn(&self.client, config, &txn).await;
        result.map_err(|f| write_error(config, key, value_len, &f))
    }

    /// Compare-and-set put; `lease` binds the key to a session (`None` = persistent, which
    /// also detaches a lease the key had). Returns (new version, revision of the write).
    pub(crate) async fn put(
        &self,
        config: &EtcdStoreConfig,
        key: &str,
        value: Bytes,
        expected: ExpectedVersion,
        lease: Option<i64>,
    ) -> Result<(u64, i64)> {
        let full = full_key(config, key);
        let compare = match expected {
            ExpectedVersion::Any => None,
            ExpectedVersion::Absent => {
                Some(Compare::create_revision(full.clone(), CompareOp::Equal, 0))
            }
            ExpectedVersion::Exactly(v) => match i64::try_from(v) {
                Ok(v) if v >= 1 => Some(Compare::version(full.clone(), CompareOp::Equal, v)),
                // Version 0 or beyond etcd's range: can never match.
                _ => return Err(self.bad_version(config, key, expected).await),
            },
        };
        if lease.is_none() && value.len() <= batch::MAX_BATCHED_VALUE {
            let (reply, answer) = oneshot::channel();
            let write = Write { key: key.to_string(), full, value, expected, compare, reply };
            if self.batches.writes.push(write) {
                let batches = self.batches.clone();
                tokio::spawn(batches.run_writes());
            }
            let why = "writing to etcd (outcome unknown: timed out in the queue)";
            return await_batched(config, answer, why).await;
        }
        let len = value.len();
        let txn = cas_txn(&full, &value, compare, lease);
        let resp = self.txn(config, key, len, txn).await?;
        put_outcome(key, expected, &resp, header_revision(resp.header()))
    }

    /// `BadVersion` with the key's current version (for expectations that cannot match).
    async fn bad_version(
        &self,
        config: &EtcdStoreConfig,
        key: &str,
        expected: ExpectedVersion,
    ) -> MetadataError {
        match self.get(config, key).await {
            Ok(current) => MetadataError::BadVersion {
                key: key.to_string(),
                expected,
                actual: current.map(|v| v.version),
            },
            Err(e) => e,
        }
    }

    /// Conditional delete; returns the revision of the delete.
    pub(crate) async fn delete(
        &self,
        config: &EtcdStoreConfig,
        key: &str,
        expected: ExpectedVersion,
    ) -> Result<i64> {
        let full = full_key(config, key);
        let compare = match expected {
            ExpectedVersion::Any => Compare::version(full.clone(), CompareOp::Greater, 0),
            ExpectedVersion::Exactly(v) => match i64::try_from(v) {
                Ok(v) if v >= 1 => Compare::version(full.clone(), CompareOp::Equal, v),
                _ => return Err(self.not_deleted(config, key, expected).await),
            },
            ExpectedVersion::Absent => return Err(self.not_deleted(config, key, expected).await),
        };
        let txn = Txn::new()
            .when(vec![compare])
            .and_then(vec![TxnOp::delete(full.clone(), None)])
            .or_else(vec![TxnOp::get(full, Some(GetOptions::new().with_keys_only()))]);
        let resp = self.txn(config, key, 0, txn).await?;
        if resp.succeeded() {
            return Ok(header_revision(resp.header()));
        }
        match read_back_version(&resp)? {
            None => Err(MetadataError::NotFound { key: key.to_string() }),
            actual => Err(MetadataError::BadVersion { key: key.to_string(), expected, actual }),
        }
    }

    /// The error of a delete whose expectation cannot match: `NotFound` beats `BadVersion`.
    async fn not_deleted(
        &self,
        config: &EtcdStoreConfig,
        key: &str,
        expected: ExpectedVersion,
    ) -> MetadataError {
        match self.bad_version(config, key, expected).await {
            MetadataError::BadVersion { actual: None, .. } => {
                MetadataError::NotFound { key: key.to_string() }
            }
            e => e,
        }
    }

    /// Reads keys-only pages of `[from, end)` at one revision, handing each page's keys (as
    /// etcd keys) to `visit`, which returns where the next page starts (or `None` to stop).
    async fn scan(
        &self,
        config: &EtcdStoreConfig,
        start: Vec<u8>,
        end: Vec<u8>,
        mut visit: impl FnMut(&[Vec<u8>], bool) -> Option<Vec<u8>>,
    ) -> std::result::Result<(), Failure> {
        let limit = i64::try_from(config.list_page_size).unwrap_or(i64::MAX);
        let mut from = start;
        let mut revision = 0;
        loop {
            let mut options =
                GetOptions::new().with_range(end.clone()).with_keys_only().with_limit(limit);
            if revision > 0 {
                options = options.with_revision(revision);
            }
            let mut resp = self.range_raw(config, from.clone(), options).await?;
            if revision == 0 {
                revision = header_revision(resp.header());
            }
            let more = resp.more();
            let keys: Vec<Vec<u8>> =
                resp.take_kvs().into_iter().map(|kv| kv.into_key_value().0).collect();
            match visit(&keys, more) {
                Some(next) if more => {
                    debug_assert!(next > from, "pagination must advance");
                    from = next;
                }
                _ => return Ok(()),
            }
        }
    }

    /// `scan`, started over if its pinned revision is compacted meanwhile.
    async fn scan_consistent<S>(
        &self,
        config: &EtcdStoreConfig,
        start: &[u8],
        end: &[u8],
        init: impl Fn() -> S,
        visit: impl Fn(&mut S, &[Vec<u8>], bool) -> Option<Vec<u8>>,
    ) -> Result<S> {
        let mut attempt = 0;
        loop {
            let mut state = init();
            let result = self
                .scan(config, start.to_vec(), end.to_vec(), |keys, more| {
                    visit(&mut state, keys, more)
                })
                .await;
            match result {
                Ok(()) => return Ok(state),
                Err(Failure::Compacted) if attempt + 1 < LIST_RESTARTS_MAX => {
                    attempt += 1; // compacted while paging: take a new snapshot
                }
                Err(f) => return Err(io_error("listing etcd keys", &f)),
            }
        }
    }

    pub(crate) async fn list(&self, config: &EtcdStoreConfig, prefix: &str) -> Result<Vec<String>> {
        let full = full_key(config, prefix);
        let root_len = config.root.len();
        self.scan_consistent(
            config,
            full.as_bytes(),
            &prefix_end(&full),
            Vec::new,
            |out: &mut Vec<String>, keys, _more| {
                for key in keys {
                    if let Some(k) = strip_root(key, root_len) {
                        out.push(k);
                    }
                }
                keys.last().map(|last| successor(last))
            },
        )
        .await
    }

    pub(crate) async fn list_children(
        &self,
        config: &EtcdStoreConfig,
        path: &str,
    ) -> Result<Vec<String>> {
        let base =
            if path == "/" { full_key(config, "/") } else { full_key(config, &format!("{path}/")) };
        let base_len = base.len();
        let children = self
            .scan_consistent(
                config,
                base.as_bytes(),
                &prefix_end(&base),
                BTreeSet::new,
                |out: &mut BTreeSet<String>, keys, _more| {
                    let mut next = None;
                    for key in keys {
                        let Some(rest) =
                            key.get(base_len..).and_then(|r| std::str::from_utf8(r).ok())
                        else {
                            continue;
                        };
                        match rest.find('/') {
                            Some(slash) => {
                                let child = &rest[..slash];
                                out.insert(child.to_string());
                                // Skip the child's subtree: '0' sorts right after '/'.
                                let mut skip = key[..base_len + slash].to_vec();
                                skip.push(b'0');
                                next = Some(skip);
                            }
                            None => {
                                out.insert(rest.to_string());
                                next = Some(successor(key));
                            }
                        }
                    }
                    next
                },
            )
            .await?;
        Ok(children.into_iter().collect())
    }
}

impl Batches {
    /// Takes read batches until none is left: one read-only transaction each.
    async fn run_reads(&self) {
        while let Some(batch) = self.reads.next(batch::take_reads) {
            let batch = batch.together;
            let keys: Vec<Vec<u8>> = batch.iter().flat_map(|read| read.keys.clone()).collect();
            match read_keys(&self.client, &self.config, keys).await {
                Ok(found) => {
                    let mut found = found.into_iter();
                    for read in batch {
                        let mine: Vec<_> = found.by_ref().take(read.keys.len()).collect();
                        let _ = read.reply.send(Ok(mine));
                    }
                }
                Err(error) => {
                    let why = error.to_string();
                    for read in batch {
                        let _ = read.reply.send(Err(MetadataError::io(
                            "reading from etcd",
                            std::io::Error::other(why.clone()),
                        )));
                    }
                }
            }
        }
    }

    /// Takes write batches until none is left: a lone write as its own compare-and-set
    /// transaction, several as transactions nested in one.
    async fn run_writes(self: Arc<Self>) {
        while let Some(taken) = self.writes.next(batch::take_writes) {
            for write in taken.alone {
                let batches = self.clone();
                tokio::spawn(async move {
                    let outcome = batches.write_alone(&write).await;
                    let _ = write.reply.send(outcome);
                });
            }
            let mut batch = taken.together;
            if batch.len() == 1 {
                let write = batch.pop().expect("one write");
                let outcome = self.write_alone(&write).await;
                let _ = write.reply.send(outcome);
                continue;
            }
            let nested: Vec<TxnOp> = batch
                .iter()
                .map(|w| TxnOp::txn(cas_txn(&w.full, &w.value, w.compare.clone(), None)))
                .collect();
            let txn = Txn::new().and_then(nested);
            match send_txn(&self.client, &self.config, &txn).await {
                Ok(resp) => {
                    let revision = header_revision(resp.header());
                    let answers = resp.op_responses();
                    if answers.len() != batch.len() {
                        for write in batch {
                            let _ = write.reply.send(Err(impossible("a batch lost answers")));
                        }
                        continue;
                    }
                    for (write, answer) in batch.into_iter().zip(answers) {
                        let outcome = match answer {
                            TxnOpResponse::Txn(one) => {
                                put_outcome(&write.key, write.expected, &one, revision)
                            }
                            _ => Err(impossible("a nested write answered otherwise")),
                        };
                        let _ = write.reply.send(outcome);
                    }
                }
                // Too large together after all: each on its own.
                Err(Failure::TooLarge) => {
                    for write in batch {
                        let outcome = self.write_alone(&write).await;
                        let _ = write.reply.send(outcome);
                    }
                }
                Err(failure) => {
                    for write in batch {
                        let why = "writing to etcd (outcome unknown)";
                        let _ = write.reply.send(Err(io_error(why, &failure)));
                    }
                }
            }
        }
    }

    async fn write_alone(&self, write: &Write) -> Result<(u64, i64)> {
        let config = &self.config;
        let txn = cas_txn(&write.full, &write.value, write.compare.clone(), None);
        let resp = (send_txn(&self.client, config, &txn).await)
            .map_err(|f| write_error(config, &write.key, write.value.len(), &f))?;
        put_outcome(&write.key, write.expected, &resp, header_revision(resp.header()))
    }
}

/// Sends a write transaction, retried within the request timeout (never after an unknown
/// outcome: `with_retries`' `idempotent` is false).
async fn send_txn(
    client: &KvClient,
    config: &EtcdStoreConfig,
    txn: &Txn,
) -> std::result::Result<etcd_client::TxnResponse, Failure> {
    with_retries(Kv::deadline(config), false, || {
        let mut client = client.clone();
        let txn = txn.clone();
        async move { client.txn(txn).await }
    })
    .await
}

/// A failed write of `key` (a value of `value_len` bytes) as the store's error.
fn write_error(
    config: &EtcdStoreConfig,
    key: &str,
    value_len: usize,
    f: &Failure,
) -> MetadataError {
    match f {
        Failure::LeaseNotFound => MetadataError::SessionExpired {
            reason: "etcd no longer knows the session's lease".into(),
        },
        // etcd's --max-request-bytes is below what this store was configured for.
        Failure::TooLarge => MetadataError::ValueTooLarge {
            key: key.to_string(),
            len: value_len,
            max: config.max_value_len,
        },
        f => io_error("writing to etcd (outcome unknown)", f),
    }
}

/// Waits for a batched operation's outcome, at most [`Kv::batched_wait`]; a caller that stops
/// waiting drops its operation if it has not been sent yet.
async fn await_batched<T>(
    config: &EtcdStoreConfig,
    answer: oneshot::Receiver<Result<T>>,
    timed_out: &str,
) -> Result<T> {
    match timeout(Kv::batched_wait(config), answer).await {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(_)) => Err(MetadataError::Closed), // the runtime is shutting down
        Err(_) => Err(io_error(timed_out, &Failure::timed_out())),
    }
}

/// Gets `keys` (etcd keys, at most [`batch::MAX_BATCH_OPS`]) in one request: a range
/// for one key, a read-only transaction (one snapshot) for several; retried within the request
/// timeout.
async fn read_keys(
    client: &KvClient,
    config: &EtcdStoreConfig,
    keys: Vec<Vec<u8>>,
) -> Result<Vec<Option<Versioned>>> {
    let deadline = Kv::deadline(config);
    let found = |kv: Option<etcd_client::KeyValue>| -> Result<Option<Versioned>> {
        let Some(kv) = kv else { return Ok(None) };
        let version = version_of(kv.version())?;
        let (_, value) = kv.into_key_value();
        Ok(Some(Versioned { value: Bytes::from(value), version }))
    };
    if let [key] = &keys[..] {
        let mut resp = with_retries(deadline, true, || {
            let mut client = client.clone();
            let key = key.clone();
            async move { client.get(key, None).await }
        })
        .await
        .map_err(|f| io_error("reading from etcd", &f))?;
        return Ok(vec![found(resp.take_kvs().into_iter().next())?]);
    }
    let reads: Vec<TxnOp> = keys.iter().map(|key| TxnOp::get(key.clone(), None)).collect();
    let txn = Txn::new().and_then(reads);
    let response = with_retries(deadline, true, || {
        let mut client = client.clone();
        let txn = txn.clone();
        async move { client.txn(txn).await }
    })
    .await
    .map_err(|f| io_error("reading from etcd", &f))?;
    let answers = response.op_responses();
    if answers.len() != keys.len() {
        return Err(MetadataError::io(
            "reading an etcd response",
            std::io::Error::other(format!("{} answers to {} reads", answers.len(), keys.len())),
        ));
    }
    let mut out = Vec::with_capacity(keys.len());
    for answer in answers {
        let TxnOpResponse::Get(mut get) = answer else {
            return Err(MetadataError::io(
                "reading an etcd response",
                std::io::Error::other("a read transaction answered a write"),
            ));
        };
        out.push(found(get.take_kvs().into_iter().next())?);
    }
    Ok(out)
}

/// A compare-and-set put: `If(compare) Then(put, read back version) Else(read version)`.
fn cas_txn(full: &str, value: &Bytes, compare: Option<Compare>, lease: Option<i64>) -> Txn {
    let options = lease.map(|id| PutOptions::new().with_lease(id));
    let read_back = || TxnOp::get(full, Some(GetOptions::new().with_keys_only()));
    Txn::new()
        .when(compare.into_iter().collect::<Vec<_>>())
        .and_then(vec![TxnOp::put(full, value.to_vec(), options), read_back()])
        .or_else(vec![read_back()])
}

/// The outcome of one compare-and-set put from its transaction's answer: (new version,
/// `revision`), or `BadVersion` with the version the transaction saw.
fn put_outcome(
    key: &str,
    expected: ExpectedVersion,
    resp: &etcd_client::TxnResponse,
    revision: i64,
) -> Result<(u64, i64)> {
    let current = read_back_version(resp)?;
    if !resp.succeeded() {
        return Err(MetadataError::BadVersion { key: key.to_string(), expected, actual: current });
    }
    let version = current.ok_or_else(|| impossible("a put left no key"))?;
    match expected {
        ExpectedVersion::Absent if version != 1 => {
            return Err(impossible("create gave version != 1"))
        }
        ExpectedVersion::Exactly(v) if version != v + 1 => {
            return Err(impossible("compare-and-set skipped a version"))
        }
        _ => {}
    }
    Ok((version, revision))
}

/// The smallest key after `key`.
fn successor(key: &[u8]) -> Vec<u8> {
    let mut next = key.to_vec();
    next.push(0);
    next
}

/// A metadata key from an etcd key under the root (`None` for non-UTF-8 foreign keys).
pub(crate) fn strip_root(key: &[u8], root_len: usize) -> Option<String> {
    key.get(root_len..).and_then(|k| std::str::from_utf8(k).ok()).map(str::to_string)
}

fn impossible(what: &str) -> MetadataError {
    MetadataError::io(
        "checking an etcd response",
        std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string()),
    )
}

/// The version read back by the last op of a txn branch (`None` = key absent).
fn read_back_version(resp: &etcd_client::TxnResponse) -> Result<Option<u64>> {
    let ops = resp.op_responses();
    let Some(TxnOpResponse::Get(get)) = ops.last() else {
        return Err(impossible("txn without its read-back"));
    };
    get.kvs().first().map(|kv| version_of(kv.version())).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_and_successor() {
        assert_eq!(prefix_end("/m/c1/"), b"/m/c10".to_vec());
        assert_eq!(prefix_end("/a"), b"/b".to_vec());
        assert_eq!(successor(b"/a"), b"/a\0".to_vec());
        assert_eq!(strip_root(b"/m/c1/x", 5), Some("/x".to_string()));
    }
}
