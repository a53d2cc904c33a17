//! `magnetar perf produce|consume|e2e`: load against any Pulsar-protocol broker (Magnetar or
//! Apache Pulsar) through our client, with the knobs pulsar-perf users know.
//!
//! - produce: publish latency is send-to-receipt (the broker has stored the message);
//! - consume: publish-to-receive latency from the broker's `publish_time` (millisecond clock);
//! - e2e: producer and consumer in one process; the payload carries the send instant, so the
//!   latency is send-to-receive on one monotonic clock.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use bytes::{BufMut, Bytes, BytesMut};
use magnetar_client::{
    Client, Compression, Consumer, InitialPosition, Producer, ProducerMessage, SendListener,
    StoredIds, SubType,
};
use serde::Serialize;
use tokio::sync::{watch, Notify};

use crate::pace::Pacer;
use crate::stats::{print_summary, Reporter, Stream, StreamSummary};

/// Where to send load and how many topics.
#[derive(Debug, Clone)]
pub struct Target {
    pub service_url: String,
    /// Admin REST base URL, used only to create partitioned topics.
    pub admin_url: String,
    pub topic: String,
    /// With more than one, topics are `<topic>-0`, `<topic>-1`, ... (as pulsar-perf names them).
    pub num_topics: usize,
    /// Create each topic as partitioned with this many partitions (0: leave as is).
    pub partitions: u32,
    /// PEM CAs to verify a `pulsar+ssl://` broker with.
    pub tls_trust_certs_file: Option<std::path::PathBuf>,
    /// A token for the broker's CONNECT and the admin API (`Authorization: Bearer`).
    pub auth_token: Option<String>,
    /// A file holding the token instead, read afresh at each connection and each time the
    /// broker challenges an expired one (a token another process rotates).
    pub auth_token_file: Option<std::path::PathBuf>,
}

/// When to stop and how to report.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Stop after this long (None: until the message count or Ctrl-C).
    pub duration: Option<Duration>,
    /// Stop after this many messages (published and acknowledged, or received).
    pub messages: Option<u64>,
    /// Not counted at the start (ignored with a message count, which counts everything).
    pub warmup: Duration,
    pub report_interval: Duration,
    /// Print the summary as JSON on stdout (live lines still go to stderr).
    pub json: bool,
    /// Client threads (1: a single-threaded runtime).
    pub threads: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchingOptions {
    pub max_messages: u32,
    pub max_bytes: usize,
    pub max_delay: Duration,
}

#[derive(Debug, Clone)]
pub struct ProduceOptions {
    /// Total messages per second over all producers (0: as fast as possible).
    pub rate: f64,
    pub size: usize,
    /// Producers per topic.
    pub producers: usize,
    pub batching: Option<BatchingOptions>,
    /// Messages in flight per producer.
    pub max_pending: usize,
    pub compression: PerfCompression,
    /// One message in flight per producer: send, wait for the receipt, send the next.
    pub sync: bool,
}

#[derive(Debug, Clone)]
pub struct ConsumeOptions {
    /// Consumers per topic (all on one subscription).
    pub consumers: usize,
    pub subscription: String,
    /// Remove the subscription when the run ends (a throw-away one, as e2e's own).
    pub unsubscribe_at_end: bool,
    pub sub_type: PerfSubType,
    pub receiver_queue: u32,
    pub initial_position: PerfPosition,
    /// With a message count: the run fails once nothing arrived for this long.
    pub idle_timeout: Option<Duration>,
}

/// Compression names as pulsar-perf spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerfCompression(pub Compression);

impl FromStr for PerfCompression {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(PerfCompression(match s.to_ascii_uppercase().as_str() {
            "NONE" => Compression::None,
            "LZ4" => Compression::Lz4,
            "ZLIB" => Compression::Zlib,
            "ZSTD" => Compression::Zstd,
            "SNAPPY" => Compression::Snappy,
            _ => return Err(format!("unknown compression {s:?}: NONE, LZ4, ZLIB, ZSTD, SNAPPY")),
        }))
    }
}

/// Subscription types as pulsar-perf spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerfSubType(pub SubType);

impl FromStr for PerfSubType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(PerfSubType(match s.to_ascii_lowercase().replace('_', "").as_str() {
            "exclusive" => SubType::Exclusive,
            "shared" => SubType::Shared,
            "failover" => SubType::Failover,
            "keyshared" => SubType::KeyShared,
            _ => {
                return Err(format!(
                    "unknown subscription type {s:?}: Exclusive, Shared, Failover, Key_Shared"
                ))
            }
        }))
    }
}

/// Initial position of a new subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerfPosition(pub InitialPosition);

impl FromStr for PerfPosition {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(PerfPosition(match s.to_ascii_lowercase().as_str() {
            "latest" => InitialPosition::Latest,
            "earliest" => InitialPosition::Earliest,
            _ => return Err(format!("unknown position {s:?}: Latest, Earliest")),
        }))
    }
}

/// What a run measured, for `--json`.
#[derive(Debug, Serialize)]
pub struct Report {
    pub mode: &'static str,
    pub service_url: String,
    pub topics: Vec<String>,
    pub message_size: Option<usize>,
    pub streams: Vec<StreamSummary>,
}

/// Shared stop signal and message budget of a run.
struct Control {
    stop: watch::Receiver<bool>,
    /// `stop` as a plain flag for the send loop (`watch::Receiver::borrow` takes a lock).
    stopped: Arc<AtomicBool>,
    /// Messages still to send (produce) when a count was given.
    to_send: Option<AtomicU64>,
    /// Messages to count before the run is complete.
    target: Option<u64>,
    /// Signalled when `target` is reached.
    done: Notify,
}

impl Control {
    /// Takes one message from the send budget; false when none is left or the run stops.
    fn take_one(&self) -> bool {
        if self.stopped.load(Ordering::Relaxed) {
            return false;
        }
        match &self.to_send {
            None => true,
            Some(left) => left
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok(),
        }
    }

    /// Called after counting a message on `stream`.
    fn counted(&self, stream: &Stream) {
        if self.target.is_some_and(|t| stream.messages() >= t) {
            self.done.notify_one();
        }
    }
}

pub fn topics(target: &Target) -> Vec<String> {
    if target.num_topics <= 1 {
        vec![target.topic.clone()]
    } else {
        (0..target.num_topics).map(|i| format!("{}-{i}", target.topic)).collect()
    }
}

pub fn produce(
    target: &Target,
    run: &RunOptions,
    options: &ProduceOptions,
) -> anyhow::Result<Report> {
    runtime(run.threads)?.block_on(async {
        let client = connect(target).await?;
        let topics = prepare_topics(target)?;
        let publish = Arc::new(Stream::new("publish"));
        let (control, stop) = control(run, true);
        let pacer = pacer(options)?;
        let receipts = Receipts::new(&publish, &control, options.size, Instant::now());
        let mut workers = Vec::new();
        for producer in create_producers(&client, &topics, options, &receipts).await? {
            workers.push(tokio::spawn(produce_loop(
                producer,
                options.clone(),
                pacer.clone(),
                receipts.clone(),
                false,
            )));
        }
        let (streams, finished, _) =
            drive(run, &control, stop, vec![&publish], None, workers).await;
        client.close().await;
        let report = report("produce", target, topics, Some(options.size), streams, run.json);
        finished_or_error(finished)?;
        no_failed_sends(&publish)?;
        Ok(report)
    })
}

pub fn consume(
    target: &Target,
    run: &RunOptions,
    options: &ConsumeOptions,
) -> anyhow::Result<Report> {
    runtime(run.threads)?.block_on(async {
        let client = connect(target).await?;
        let topics = prepare_topics(target)?;
        let received = Arc::new(Stream::new("consume"));
        let (control, stop) = control(run, false);
        let mut workers = Vec::new();
        for consumer in create_consumers(&client, &topics, options).await? {
            workers.push(tokio::spawn(consume_loop(
                consumer,
                received.clone(),
                control.clone(),
                Latency::PublishTime,
                options.unsubscribe_at_end,
            )));
        }
        let idle = idle_watch(run, options, &received);
        let (streams, finished, idled) =
            drive(run, &control, stop, vec![&received], idle, workers).await;
        client.close().await;
        let report = report("consume", target, topics, None, streams, run.json);
        finished_or_error(finished)?;
        not_idle(idled, &received, run)?;
        Ok(report)
    })
}

pub fn e2e(
    target: &Target,
    run: &RunOptions,
    produce: &ProduceOptions,
    consume: &ConsumeOptions,
) -> anyhow::Result<Report> {
    if produce.size < 8 {
        bail!("e2e needs messages of at least 8 bytes (they carry the send time)");
    }
    runtime(run.threads)?.block_on(async {
        let client = connect(target).await?;
        let topics = prepare_topics(target)?;
        let publish = Arc::new(Stream::new("publish"));
        let e2e = Arc::new(Stream::new("e2e"));
        // The consumers count toward the message target: the run ends when all arrived.
        let (control, stop) = control(run, false);
        let epoch = Instant::now();
        let mut workers = Vec::new();
        for consumer in create_consumers(&client, &topics, consume).await? {
            let latency = Latency::SendInstant(epoch);
            workers.push(tokio::spawn(consume_loop(
                consumer,
                e2e.clone(),
                control.clone(),
                latency,
                consume.unsubscribe_at_end,
            )));
        }
        let send_budget = run.messages.map(AtomicU64::new);
        let producer_control = Arc::new(Control {
            stop: control.stop.clone(),
            stopped: control.stopped.clone(),
            to_send: send_budget,
            target: None,
            done: Notify::new(),
        });
        let pacer = pacer(produce)?;
        let receipts = Receipts::new(&publish, &producer_control, produce.size, epoch);
        for producer in create_producers(&client, &topics, produce, &receipts).await? {
            workers.push(tokio::spawn(produce_loop(
                producer,
                produce.clone(),
                pacer.clone(),
                receipts.clone(),
                true,
            )));
        }
        let idle = idle_watch(run, consume, &e2e);
        let (streams, finished, idled) =
            drive(run, &control, stop, vec![&publish, &e2e], idle, workers).await;
        client.close().await;
        let report = report("e2e", target, topics, Some(produce.size), streams, run.json);
        finished_or_error(finished)?;
        no_failed_sends(&publish)?;
        not_idle(idled, &e2e, run)?;
        Ok(report)
    })
}

fn report(
    mode: &'static str,
    target: &Target,
    topics: Vec<String>,
    message_size: Option<usize>,
    streams: Vec<StreamSummary>,
    json: bool,
) -> Report {
    let report =
        Report { mode, service_url: target.service_url.clone(), topics, message_size, streams };
    if json {
        match serde_json::to_string_pretty(&report) {
            Ok(text) => println!("{text}"),
            Err(e) => eprintln!("error: cannot encode the report: {e}"),
        }
    } else {
        print_summary(&report.streams);
    }
    report
}

/// One thread (the default) runs the load and the client without cross-thread wake-ups, which
/// measured faster on 2 cores than a multi-threaded runtime (docs/benchmarks.md); more threads
/// help only with many producers or consumers.
fn runtime(threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(if threads <= 1 {
        tokio::runtime::Builder::new_current_thread().enable_all().build()?
    } else {
        tokio::runtime::Builder::new_multi_thread().worker_threads(threads).enable_all().build()?
    })
}

async fn connect(target: &Target) -> anyhow::Result<Client> {
    let options = magnetar_client::ClientOptions {
        tls_trust_certs_file: target.tls_trust_certs_file.clone(),
        auth_token: target.auth_token.clone(),
        auth_token_file: target.auth_token_file.clone(),
        ..Default::default()
    };
    Client::connect_with_options(target.service_url.clone(), options)
        .await
        .with_context(|| format!("cannot connect to {}", target.service_url))
}

fn control(run: &RunOptions, count_sends: bool) -> (Arc<Control>, watch::Sender<bool>) {
    let (stop_tx, stop_rx) = watch::channel(false);
    let control = Arc::new(Control {
        stop: stop_rx,
        stopped: Arc::new(AtomicBool::new(false)),
        to_send: if count_sends { run.messages.map(AtomicU64::new) } else { None },
        target: run.messages,
        done: Notify::new(),
    });
    (control, stop_tx)
}

/// One pacer for all producers (`--rate` is the total, as in pulsar-perf); none when unlimited.
fn pacer(options: &ProduceOptions) -> anyhow::Result<Option<Arc<Pacer>>> {
    if options.rate > 0.0 {
        Ok(Some(Arc::new(Pacer::start(options.rate)?)))
    } else {
        Ok(None)
    }
}

/// Creates partitioned topics through the admin API when asked to.
fn prepare_topics(target: &Target) -> anyhow::Result<Vec<String>> {
    let topics = topics(target);
    if target.partitions > 0 {
        for topic in &topics {
            let token = admin_token(target)?;
            create_partitioned_topic(
                &target.admin_url,
                token.as_deref(),
                topic,
                target.partitions,
            )?;
        }
    }
    Ok(topics)
}

/// The token for the admin API: the given one, or the token file's current content.
fn admin_token(target: &Target) -> anyhow::Result<Option<String>> {
    match (&target.auth_token, &target.auth_token_file) {
        (Some(token), _) => Ok(Some(token.clone())),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the token file {}", path.display()))?;
            Ok(Some(text.trim().to_string()))
        }
        (None, None) => Ok(None),
    }
}

/// Producers created at once, at most: a broker's topic-load rate is measured, not our round
/// trips (pulsar-perf also creates its producers concurrently).
const CREATE_CONCURRENCY: usize = 1_000;

async fn create_producers(
    client: &Client,
    topics: &[String],
    options: &ProduceOptions,
    receipts: &Arc<Receipts>,
) -> anyhow::Result<Vec<Producer>> {
    let started = Instant::now();
    let wanted: Vec<&String> =
        topics.iter().flat_map(|topic| std::iter::repeat_n(topic, options.producers)).collect();
    let mut producers = Vec::with_capacity(wanted.len());
    for chunk in wanted.chunks(CREATE_CONCURRENCY) {
        let created = futures_util::future::try_join_all(chunk.iter().map(|&topic| {
            let mut builder = client
                .producer(topic.clone())
                .max_pending(if options.sync { 1 } else { options.max_pending })
                .compression(options.compression.0)
                .listener(receipts.clone());
            if let Some(b) = options.batching {
                builder = builder.batching(b.max_messages, b.max_bytes, b.max_delay);
            }
            async move {
                builder
                    .create()
                    .await
                    .with_context(|| format!("cannot create a producer on {topic}"))
            }
        }))
        .await?;
        producers.extend(created);
    }
    if producers.len() > 1 {
        let seconds = started.elapsed().as_secs_f64();
        eprintln!(
            "created {} producers in {seconds:.2} s ({:.0} per second)",
            producers.len(),
            producers.len() as f64 / seconds.max(1e-9)
        );
    }
    Ok(producers)
}

async fn create_consumers(
    client: &Client,
    topics: &[String],
    options: &ConsumeOptions,
) -> anyhow::Result<Vec<Consumer>> {
    let mut consumers = Vec::new();
    for topic in topics {
        for _ in 0..options.consumers {
            consumers.push(
                client
                    .consumer(topic.clone())
                    .subscription(options.subscription.clone())
                    .sub_type(options.sub_type.0)
                    .receiver_queue(options.receiver_queue)
                    .initial_position(options.initial_position.0)
                    .subscribe()
                    .await
                    .with_context(|| format!("cannot subscribe to {topic}"))?,
            );
        }
    }
    Ok(consumers)
}

/// The stream a consuming run watches for idleness, and for how long: only with a message
/// count (a run without one waits for producers as long as it is asked to).
fn idle_watch<'a>(
    run: &RunOptions,
    options: &ConsumeOptions,
    stream: &'a Stream,
) -> Option<(&'a Stream, Duration)> {
    run.messages.and(options.idle_timeout).map(|limit| (stream, limit))
}

/// A consuming run that gave up for want of messages fails (its figures are printed).
fn not_idle(idled: Option<Duration>, stream: &Stream, run: &RunOptions) -> anyhow::Result<()> {
    match idled {
        None => Ok(()),
        Some(limit) => bail!(
            "no message arrived for {} s: {} of {} received (a backlog smaller than -m, a \
             subscription created after the messages were trimmed, or a stuck broker)",
            limit.as_secs_f64(),
            stream.messages(),
            run.messages.unwrap_or(0)
        ),
    }
}

/// Runs until the duration, the message target, Ctrl-C or (with `idle`) a stream that stays
/// still for its limit; prints live lines meanwhile. Returns the summaries, whether the workers
/// finished, and the idle limit that ended the run, if one did.
async fn drive(
    run: &RunOptions,
    control: &Control,
    stop: watch::Sender<bool>,
    streams: Vec<&Stream>,
    idle: Option<(&Stream, Duration)>,
    workers: Vec<tokio::task::JoinHandle<()>>,
) -> (Vec<StreamSummary>, bool, Option<Duration>) {
    let mut reporter = Reporter::new(streams, false);
    if run.messages.is_none() && !run.warmup.is_zero() {
        tokio::time::sleep(run.warmup).await;
    }
    reporter.start();
    let deadline = run.duration.map(|d| tokio::time::Instant::now() + d);
    let mut ticks = tokio::time::interval(run.report_interval);
    ticks.tick().await; // the first tick is immediate
    let mut idle_checks = tokio::time::interval(IDLE_CHECK_EVERY);
    let mut last_seen = (idle.map_or(0, |(stream, _)| stream.messages()), Instant::now());
    let mut idled = None;
    loop {
        let until_deadline = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = ticks.tick() => reporter.tick(),
            () = until_deadline => break,
            () = control.done.notified() => break,
            _ = tokio::signal::ctrl_c() => break,
            _ = idle_checks.tick(), if idle.is_some() => {
                let (stream, limit) = idle.expect("checked");
                let now = stream.messages();
                if now != last_seen.0 {
                    last_seen = (now, Instant::now());
                } else if last_seen.1.elapsed() >= limit {
                    idled = Some(limit);
                    break;
                }
            }
        }
    }
    let summaries = reporter.summaries();
    control.stopped.store(true, Ordering::Relaxed);
    let _ = stop.send(true);
    // Workers finish their in-flight messages; do not wait forever on a stuck broker.
    let join = futures_join(workers);
    let finished = tokio::time::timeout(WORKERS_STOP_TIMEOUT, join).await.is_ok();
    (summaries, finished, idled)
}

/// How often a consuming run with an idle limit looks at its message count.
const IDLE_CHECK_EVERY: Duration = Duration::from_millis(250);

/// How long producers and consumers get to finish what is in flight once a run ends.
const WORKERS_STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// A run whose producers or consumers could not finish (the broker stopped answering) is a
/// failed run: its figures are printed, and the tool exits with an error, not a success.
fn finished_or_error(finished: bool) -> anyhow::Result<()> {
    if finished {
        return Ok(());
    }
    bail!(
        "the broker stopped answering: producers or consumers still had messages in flight {} s \
         after the run ended (neither acknowledged nor failed)",
        WORKERS_STOP_TIMEOUT.as_secs()
    )
}

/// Failed sends (the broker refused them, or they timed out: a full disk, say) make the run
/// a failure too: its figures are printed, and the tool exits 1.
fn no_failed_sends(publish: &Stream) -> anyhow::Result<()> {
    match publish.errors() {
        0 => Ok(()),
        failed => bail!("{failed} messages failed to send (first errors above)"),
    }
}

async fn futures_join(workers: Vec<tokio::task::JoinHandle<()>>) {
    for worker in workers {
        let _ = worker.await;
    }
}

/// Records publish latencies as receipts arrive: each message is tagged with its send time,
/// and a whole batch is recorded with one clock read and one lock. The send time is a raw
/// TSC reading (`quanta`, which falls back to the OS clock where the TSC is not invariant):
/// cheaper than a `clock_gettime`, and it is read per message.
struct Receipts {
    publish: Arc<Stream>,
    control: Arc<Control>,
    size: usize,
    /// Start of the e2e payload stamps.
    epoch: Instant,
    clock: quanta::Clock,
}

impl Receipts {
    fn new(
        publish: &Arc<Stream>,
        control: &Arc<Control>,
        size: usize,
        epoch: Instant,
    ) -> Arc<Self> {
        let (publish, control) = (publish.clone(), control.clone());
        Arc::new(Receipts { publish, control, size, epoch, clock: quanta::Clock::new() })
    }

    /// The tag of a message sent now.
    fn now(&self) -> u64 {
        self.clock.raw()
    }
}

impl SendListener for Receipts {
    fn on_stored(&self, tags: &[u64], _ids: StoredIds) {
        let now = self.now();
        let latencies = tags.iter().map(|&sent| self.clock.delta(sent, now));
        self.publish.record_all(self.size, latencies);
        self.control.counted(&self.publish);
    }

    fn on_failed(&self, tags: &[u64], error: &magnetar_client::Error) {
        for _ in tags {
            report_error(&self.publish, error);
        }
        self.control.counted(&self.publish);
    }
}

/// Sends until the budget or the run ends. `stamp` writes the send time into the payload
/// (for e2e).
async fn produce_loop(
    producer: Producer,
    options: ProduceOptions,
    pacer: Option<Arc<Pacer>>,
    receipts: Arc<Receipts>,
    stamp: bool,
) {
    // Leaked once per producer: cloning a static `Bytes` touches no reference count, which is
    // two atomic operations per message less at millions of messages a second.
    let template = Bytes::from_static(Vec::leak(payload_template(options.size).to_vec()));
    let (publish, control) = (&receipts.publish, &receipts.control);
    while control.take_one() {
        if let Some(pacer) = &pacer {
            pacer.wait().await;
        }
        let payload = if stamp { stamped(&template, receipts.epoch) } else { template.clone() };
        if options.sync {
            let sent_at = Instant::now();
            match producer.send(ProducerMessage::new(payload)).await {
                Ok(_) => publish.record(options.size, Some(sent_at.elapsed())),
                Err(e) => report_error(publish, &e),
            }
            control.counted(publish);
        } else if let Err(e) =
            producer.send_tagged(ProducerMessage::new(payload), receipts.now()).await
        {
            report_error(publish, &e);
        }
    }
    if let Err(e) = producer.flush().await {
        report_error(publish, &e);
    }
    let _ = tokio::time::timeout(Duration::from_secs(10), producer.close()).await;
}

fn report_error(stream: &Stream, error: &magnetar_client::Error) {
    // Print the first few, count all.
    if stream.errors() < 10 {
        eprintln!("{}: {error}", stream.name);
    }
    stream.error();
}

#[derive(Clone, Copy)]
enum Latency {
    /// From the message's publish time (milliseconds since the epoch).
    PublishTime,
    /// From the send instant written into the first 8 payload bytes (nanoseconds since `epoch`).
    SendInstant(Instant),
}

async fn consume_loop(
    mut consumer: Consumer,
    received: Arc<Stream>,
    control: Arc<Control>,
    latency: Latency,
    unsubscribe_at_end: bool,
) {
    let mut stop = control.stop.clone();
    loop {
        let message = tokio::select! {
            message = consumer.receive() => message,
            _ = stop.wait_for(|stopped| *stopped) => break,
        };
        let message = match message {
            Ok(message) => message,
            Err(e) => {
                report_error(&received, &e);
                break;
            }
        };
        let elapsed = match latency {
            Latency::PublishTime => {
                let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
                Some(now.saturating_sub(Duration::from_millis(message.publish_time)))
            }
            Latency::SendInstant(epoch) => message.payload.get(..8).map(|stamp| {
                let sent = u64::from_be_bytes(stamp.try_into().unwrap_or_default());
                epoch.elapsed().saturating_sub(Duration::from_nanos(sent))
            }),
        };
        received.record(message.payload.len(), elapsed);
        if let Err(e) = consumer.ack_grouped(&message) {
            report_error(&received, &e);
        }
        control.counted(&received);
    }
    // Best effort either way: the run's figures are already taken.
    if unsubscribe_at_end {
        let _ = tokio::time::timeout(Duration::from_secs(10), consumer.unsubscribe()).await;
    } else {
        let _ = tokio::time::timeout(Duration::from_secs(10), consumer.close()).await;
    }
}

/// A payload of `size` bytes that compresses like text, not like zeros.
fn payload_template(size: usize) -> Bytes {
    let pattern = b"magnetar perf payload 0123456789 abcdefghijklmnopqrstuvwxyz ";
    let mut payload = BytesMut::with_capacity(size);
    while payload.len() < size {
        let n = (size - payload.len()).min(pattern.len());
        payload.put_slice(&pattern[..n]);
    }
    payload.freeze()
}

/// The template with its first 8 bytes replaced by the nanoseconds since `epoch`.
fn stamped(template: &Bytes, epoch: Instant) -> Bytes {
    let mut payload = BytesMut::with_capacity(template.len());
    payload.put_u64(epoch.elapsed().as_nanos() as u64);
    payload.put_slice(&template[8..]);
    payload.freeze()
}

/// PUT /admin/v2/{persistent|non-persistent}/{tenant}/{ns}/{topic}/partitions; an existing
/// partitioned topic (409) is fine.
fn create_partitioned_topic(
    admin_url: &str,
    token: Option<&str>,
    topic: &str,
    partitions: u32,
) -> anyhow::Result<()> {
    let full = magnetar_client::full_topic_name(topic);
    let (domain, rest) = full.split_once("://").context("topic name without domain")?;
    let path = format!("/admin/v2/{domain}/{rest}/partitions");
    let status = http_put(admin_url, token, &path, &partitions.to_string())?;
    match status {
        200..=299 | 409 => Ok(()),
        _ => bail!("creating {full} with {partitions} partitions: HTTP {status}"),
    }
}

/// A minimal HTTP/1.1 PUT (the benchmark needs one request; no HTTP client dependency).
fn http_put(base_url: &str, token: Option<&str>, path: &str, body: &str) -> anyhow::Result<u16> {
    let host = base_url
        .strip_prefix("http://")
        .with_context(|| format!("admin URL {base_url:?} must start with http://"))?
        .trim_end_matches('/');
    let address = host
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve {host}"))?
        .next()
        .with_context(|| format!("no address for {host}"))?;
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(5))
        .with_context(|| format!("cannot connect to {base_url}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let authorization = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    write!(
        stream,
        "PUT {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         {authorization}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut response = Vec::new();
    stream.take(64 * 1024).read_to_end(&mut response)?;
    let text = String::from_utf8_lossy(&response);
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| text.strip_prefix("HTTP/1.0 "))
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .with_context(|| format!("bad HTTP response from {base_url}: {:?}", text.lines().next()))?;
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_as_pulsar_perf_spells_them() {
        assert_eq!("lz4".parse::<PerfCompression>().unwrap().0, Compression::Lz4);
        assert_eq!("Key_Shared".parse::<PerfSubType>().unwrap().0, SubType::KeyShared);
        assert_eq!("Earliest".parse::<PerfPosition>().unwrap().0, InitialPosition::Earliest);
        assert!("gzip".parse::<PerfCompression>().is_err());
        assert!("Queue".parse::<PerfSubType>().is_err());
    }

    #[test]
    fn topics_are_numbered_only_when_several() {
        let mut target = Target {
            service_url: String::new(),
            admin_url: String::new(),
            topic: "t".into(),
            num_topics: 1,
            partitions: 0,
            tls_trust_certs_file: None,
            auth_token: None,
            auth_token_file: None,
        };
        assert_eq!(topics(&target), vec!["t"]);
        target.num_topics = 3;
        assert_eq!(topics(&target), vec!["t-0", "t-1", "t-2"]);
    }

    #[test]
    fn stamped_payload_keeps_size_and_carries_the_time() {
        let template = payload_template(100);
        assert_eq!(template.len(), 100);
        let epoch = Instant::now() - Duration::from_millis(5);
        let payload = stamped(&template, epoch);
        assert_eq!(payload.len(), 100);
        assert_eq!(payload[8..], template[8..]);
        let nanos = u64::from_be_bytes(payload[..8].try_into().unwrap());
        assert!(nanos >= 5_000_000, "{nanos}");
    }

    #[test]
    fn send_budget_runs_out() {
        let (control, _stop) = control(
            &RunOptions {
                duration: None,
                messages: Some(2),
                warmup: Duration::ZERO,
                report_interval: Duration::from_secs(1),
                json: false,
                threads: 1,
            },
            true,
        );
        assert!(control.take_one());
        assert!(control.take_one());
        assert!(!control.take_one());
    }
}
