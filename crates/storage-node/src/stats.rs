//! What a storage node has done, for its Prometheus endpoint (`magnetar storage
//! --metrics-listen`): requests by kind, counted as they arrive, next to the ledger store's own
//! series (journal groups and fdatasync times, reads, compaction) and the disk's state; and the
//! same facts under BookKeeper's names (`bookie_*`, `bookkeeper_server_*`: what a bookie's
//! Prometheus endpoint serves), so dashboards and alerts written for bookies read a node.

use crate::space::DiskSpace;
use magnetar_ledger::LedgerStore;
use magnetar_metrics::{Exposition, Histogram, Labels, RollingWindow, WindowReading};
use magnetar_replication::message::{Request, Response};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Request latency buckets (µs): a lone add on a local disk takes ~0.1 ms, on tmpfs ~0.03.
const LATENCY_US: &[u64] = &[
    25, 50, 75, 100, 150, 200, 300, 500, 750, 1_000, 1_500, 2_000, 3_000, 5_000, 7_500, 10_000,
    20_000, 50_000, 100_000, 200_000, 500_000, 1_000_000, 5_000_000,
];

/// The quantiles a bookie's latency summaries carry.
const QUANTILES: [(&str, f64); 7] = [
    ("0.5", 0.5),
    ("0.75", 0.75),
    ("0.95", 0.95),
    ("0.99", 0.99),
    ("0.999", 0.999),
    ("0.9999", 0.9999),
    ("1.0", 1.0),
];

/// The requests whose latency is measured (BookKeeper's ADD_ENTRY and READ_ENTRY).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Add,
    Read,
}

impl Op {
    pub(crate) fn of(request: &Request) -> Option<Op> {
        match request {
            Request::Add { .. } => Some(Op::Add),
            Request::Read { .. } => Some(Op::Read),
            Request::ReadLac { .. } | Request::WriteLac { .. } => None,
        }
    }

    /// Whether `response` answers the request as asked (a read of an absent entry does not,
    /// as a bookie counts it).
    pub(crate) fn succeeded(self, response: &Response) -> bool {
        matches!(
            (self, response),
            (Op::Add, Response::Added { .. }) | (Op::Read, Response::Entry { .. })
        )
    }
}

/// Latency of one kind of request, split by outcome, with the requests still unanswered.
#[derive(Debug)]
struct OpLatency {
    succeeded: Histogram,
    failed: Histogram,
    in_progress: AtomicU64,
}

impl OpLatency {
    fn new() -> Self {
        OpLatency {
            succeeded: Histogram::new(LATENCY_US),
            failed: Histogram::new(LATENCY_US),
            in_progress: AtomicU64::new(0),
        }
    }

    fn outcome(&self, succeeded: bool) -> &Histogram {
        if succeeded {
            &self.succeeded
        } else {
            &self.failed
        }
    }
}

/// The stats interval's windows of the latency summaries (quantiles are over the last one).
#[derive(Debug)]
struct Windows {
    add: [RollingWindow; 2],
    read: [RollingWindow; 2],
    journal_sync: RollingWindow,
}

#[derive(Debug)]
pub struct NodeStats {
    adds: AtomicU64,
    add_bytes: AtomicU64,
    recovery_adds: AtomicU64,
    refused_adds: AtomicU64,
    reads: AtomicU64,
    lac_reads: AtomicU64,
    fencing_requests: AtomicU64,
    explicit_lacs: AtomicU64,
    connections: AtomicU64,
    connections_open: AtomicU64,
    read_bytes: AtomicU64,
    deleted_ledgers: AtomicU64,
    add_latency: OpLatency,
    read_latency: OpLatency,
    windows: Mutex<Option<Windows>>,
    interval: Duration,
}

impl Default for NodeStats {
    /// Quantiles over the last minute, as a bookie's (`prometheusStatsLatencyRolloverSeconds`).
    fn default() -> Self {
        NodeStats::new(Duration::from_secs(60))
    }
}

impl NodeStats {
    /// Latency quantiles are over the last completed `interval`.
    pub fn new(interval: Duration) -> Self {
        NodeStats {
            adds: AtomicU64::new(0),
            add_bytes: AtomicU64::new(0),
            recovery_adds: AtomicU64::new(0),
            refused_adds: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            lac_reads: AtomicU64::new(0),
            fencing_requests: AtomicU64::new(0),
            explicit_lacs: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            connections_open: AtomicU64::new(0),
            read_bytes: AtomicU64::new(0),
            deleted_ledgers: AtomicU64::new(0),
            add_latency: OpLatency::new(),
            read_latency: OpLatency::new(),
            windows: Mutex::new(None),
            interval,
        }
    }

    fn latency(&self, op: Op) -> &OpLatency {
        match op {
            Op::Add => &self.add_latency,
            Op::Read => &self.read_latency,
        }
    }

    /// A request whose latency is measured arrived.
    pub(crate) fn started(&self, op: Op) {
        self.latency(op).in_progress.fetch_add(1, Ordering::Relaxed);
    }

    /// It was answered: `response` sent `received_at` after it arrived.
    pub(crate) fn finished(&self, op: Op, received_at: Instant, response: &Response) {
        let latency = self.latency(op);
        latency.in_progress.fetch_sub(1, Ordering::Relaxed);
        latency.outcome(op.succeeded(response)).record_duration_us(received_at.elapsed());
        if let Response::Entry { data, .. } = response {
            self.read_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        }
    }

    /// Its connection closed before it was answered.
    pub(crate) fn abandoned(&self, op: Op) {
        self.latency(op).in_progress.fetch_sub(1, Ordering::Relaxed);
    }

    /// Garbage collection freed a deleted ledger.
    pub(crate) fn ledger_deleted(&self) {
        self.deleted_ledgers.fetch_add(1, Ordering::Relaxed);
    }
    /// One request as it arrives (before the node decides on it).
    pub(crate) fn request(&self, request: &Request) {
        let bump = |counter: &AtomicU64| counter.fetch_add(1, Ordering::Relaxed);
        match request {
            Request::Add { recovery, data, .. } => {
                bump(if *recovery { &self.recovery_adds } else { &self.adds });
                self.add_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
            }
            Request::Read { fence, .. } => {
                bump(&self.reads);
                if fence.is_some() {
                    bump(&self.fencing_requests);
                }
            }
            Request::ReadLac { fence, .. } => {
                bump(&self.lac_reads);
                if fence.is_some() {
                    bump(&self.fencing_requests);
                }
            }
            Request::WriteLac { .. } => {
                bump(&self.explicit_lacs);
            }
        }
    }

    /// A normal add refused because the node is short of disk.
    pub(crate) fn refused_add(&self) {
        self.refused_adds.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn connected(&self) {
        self.connections.fetch_add(1, Ordering::Relaxed);
        self.connections_open.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn disconnected(&self) {
        self.connections_open.fetch_sub(1, Ordering::Relaxed);
    }

    /// The node's series (`magnetar_storage_node_*`), each with `labels`.
    pub fn write_metrics(&self, space: &DiskSpace, out: &mut Exposition, labels: Labels) {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let counters: [(&'static str, &'static str, &AtomicU64); 9] = [
            (
                "magnetar_storage_node_adds",
                "Normal adds received from writers (not those refused for want of disk).",
                &self.adds,
            ),
            (
                "magnetar_storage_node_add_bytes",
                "Entry bytes in the adds received (normal and recovery).",
                &self.add_bytes,
            ),
            (
                "magnetar_storage_node_recovery_adds",
                "Recovery adds received (write-back of a recovered ledger's entries).",
                &self.recovery_adds,
            ),
            (
                "magnetar_storage_node_refused_adds",
                "Normal adds refused because the node was read-only (short of disk).",
                &self.refused_adds,
            ),
            ("magnetar_storage_node_reads", "Entry reads received.", &self.reads),
            (
                "magnetar_storage_node_lac_reads",
                "Last-add-confirmed reads received.",
                &self.lac_reads,
            ),
            (
                "magnetar_storage_node_fencing_requests",
                "Reads that fenced their ledger first (recoveries).",
                &self.fencing_requests,
            ),
            (
                "magnetar_storage_node_explicit_lacs",
                "Explicit last-add-confirmed messages received (idle writers).",
                &self.explicit_lacs,
            ),
            (
                "magnetar_storage_node_connections",
                "Client connections accepted.",
                &self.connections,
            ),
        ];
        for (name, help, counter) in counters {
            out.counter(name, help, labels, load(counter));
        }
        out.gauge(
            "magnetar_storage_node_open_connections",
            "Client connections open now.",
            labels,
            load(&self.connections_open) as f64,
        );
        out.gauge(
            "magnetar_storage_node_free_bytes",
            "Free bytes on the data directory's file system at the last check.",
            labels,
            space.free() as f64,
        );
        out.gauge(
            "magnetar_storage_node_read_only",
            "1 while the node refuses normal adds for want of disk.",
            labels,
            if space.is_read_only() { 1.0 } else { 0.0 },
        );
    }

    /// The node's facts under a bookie's names. Latency summaries are in milliseconds, their
    /// quantiles over the last completed stats interval, `_count`/`_sum` since start, split by
    /// `success`; `bookkeeper_server_ADD_ENTRY` and `_ADD_ENTRY_REQUEST` (and the READ pair)
    /// carry the same measure, arrival to answer sent (a bookie has both, and dashboards for
    /// the V2 protocol Pulsar speaks read the first). Counters keep a bookie's names, which
    /// lack `_total`, so they are untyped.
    pub fn write_bookkeeper_metrics(
        &self,
        store: &LedgerStore,
        space: &DiskSpace,
        out: &mut Exposition,
        labels: Labels,
    ) {
        let writable = if space.is_read_only() { 0.0 } else { 1.0 };
        out.gauge(
            "bookie_SERVER_STATUS",
            "1 while the node takes writes, 0 while read-only (short of disk).",
            labels,
            writable,
        );
        out.gauge(
            "bookie_ledger_writable_dirs",
            "Data directories taking writes (the node has one).",
            labels,
            writable,
        );
        // Untyped: promtool's lint refuses a gauge named `_count` (Pulsar's are served so too).
        let ledgers = store.ledger_count() as f64;
        out.untyped("bookie_ledgers_count", "Ledgers stored.", labels, ledgers);
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed) as f64;
        out.untyped(
            "bookie_WRITE_BYTES",
            "Entry bytes received in adds.",
            labels,
            load(&self.add_bytes),
        );
        out.untyped(
            "bookie_READ_BYTES",
            "Entry bytes sent in reads.",
            labels,
            load(&self.read_bytes),
        );
        out.untyped(
            "bookie_DELETED_LEDGER_COUNT",
            "Ledgers freed since start because their metadata was deleted.",
            labels,
            load(&self.deleted_ledgers),
        );
        out.gauge(
            "bookkeeper_server_ADD_ENTRY_IN_PROGRESS",
            "Adds received and not yet answered.",
            labels,
            load(&self.add_latency.in_progress),
        );
        out.gauge(
            "bookkeeper_server_READ_ENTRY_IN_PROGRESS",
            "Reads received and not yet answered.",
            labels,
            load(&self.read_latency.in_progress),
        );

        let journal = &store.journal().stats().fsync_us;
        let now = Instant::now();
        let mut windows = self.windows.lock();
        let windows = windows.get_or_insert_with(|| {
            let window = || RollingWindow::new(LATENCY_US.len() + 1, self.interval);
            Windows {
                add: [window(), window()],
                read: [window(), window()],
                journal_sync: RollingWindow::new(journal.bounds().len() + 1, self.interval),
            }
        });
        let ops = [
            (
                Op::Add,
                &mut windows.add,
                ["bookkeeper_server_ADD_ENTRY_REQUEST", "bookkeeper_server_ADD_ENTRY"],
            ),
            (
                Op::Read,
                &mut windows.read,
                ["bookkeeper_server_READ_ENTRY_REQUEST", "bookkeeper_server_READ_ENTRY"],
            ),
        ];
        for (op, windows, names) in ops {
            let latency = self.latency(op);
            for (window, succeeded) in windows.iter_mut().zip([true, false]) {
                let histogram = latency.outcome(succeeded);
                let reading = window.read(now, histogram.snapshot());
                let success = if succeeded { "true" } else { "false" };
                let labels: Vec<(&str, &str)> =
                    labels.iter().copied().chain([("success", success)]).collect();
                for name in names {
                    write_summary(out, name, OP_HELP, &labels, histogram, &reading);
                }
            }
        }
        let reading = windows.journal_sync.read(now, journal.snapshot());
        let labels: Vec<(&str, &str)> =
            labels.iter().copied().chain([("success", "true")]).collect();
        write_summary(
            out,
            "bookie_journal_JOURNAL_SYNC",
            "Time each journal group commit took to become durable: its fdatasync, or its O_DSYNC write (ms).",
            &labels,
            journal,
            &reading,
        );
    }
}

const OP_HELP: &str = "Request latency (ms), arrival to answer sent.";

/// A summary in milliseconds from a histogram in microseconds: quantiles from `reading` (the
/// last interval), count and sum since start.
fn write_summary(
    out: &mut Exposition,
    name: &'static str,
    help: &'static str,
    labels: &Vec<(&str, &str)>,
    histogram: &Histogram,
    reading: &WindowReading,
) {
    let quantiles =
        QUANTILES.map(|(label, q)| (label, reading.quantile(histogram.bounds(), q) / 1e3));
    let (cumulative, sum_us) = histogram.cumulative();
    let count = cumulative.last().copied().unwrap_or(0);
    out.summary_quantiles(name, help, labels, &quantiles, count, sum_us as f64 / 1e3);
}
