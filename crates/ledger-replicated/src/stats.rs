//! What this process's replication client has done, for the broker's `/metrics`
//! (`magnetar_ledger_client_*`): the events an operator of a cluster watches for (ensemble
//! changes after a node failed, recoveries after a broker failed, reads that waited for a slow
//! replica, requests a node never answered) and the storage nodes the client sees. BookKeeper's
//! client counts the same events (`bookkeeper_client_NUM_ENSEMBLE_CHANGE`,
//! `SPECULATIVE_READ_COUNT`, `LEDGER_RECOVER`); the names are ours because a Pulsar broker
//! serves those only under an opt-in flag and a prefix of its own.

use magnetar_metrics::{Exposition, Histogram, Labels};
use magnetar_replication::placement::NodeInfo;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Recovery time buckets (ms): a recovery with live nodes takes a few round trips and two
/// metadata writes; one waiting for a node or a frozen writer's replacement, seconds.
const RECOVERY_MS: &[u64] =
    &[5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000];

/// How a recovery run by this process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RecoveryOutcome {
    /// It closed the ledger.
    Closed,
    /// Another recovery took over and closed it.
    Superseded,
    /// It gave up (metadata unavailable, deadline passed).
    Failed,
    /// The ledger was closed already (a graceful hand-over): nothing to recover, not counted.
    AlreadyClosed,
}

#[derive(Debug)]
pub(crate) struct ClientStats {
    ensemble_changes: AtomicU64,
    recoveries: [AtomicU64; 3],
    recovery_ms: Histogram,
    recovered_entries_written_back: AtomicU64,
    speculative_reads: AtomicU64,
    read_retries: AtomicU64,
    read_timeouts: AtomicU64,
    fenced_writers: AtomicU64,
    unanswered_requests: AtomicU64,
    /// The write quorum of new ledgers when no namespace policy names one.
    default_write_quorum: u32,
}

impl ClientStats {
    pub(crate) fn new(default_write_quorum: u32) -> ClientStats {
        ClientStats {
            ensemble_changes: AtomicU64::new(0),
            recoveries: Default::default(),
            recovery_ms: Histogram::new(RECOVERY_MS),
            recovered_entries_written_back: AtomicU64::new(0),
            speculative_reads: AtomicU64::new(0),
            read_retries: AtomicU64::new(0),
            read_timeouts: AtomicU64::new(0),
            fenced_writers: AtomicU64::new(0),
            unanswered_requests: AtomicU64::new(0),
            default_write_quorum,
        }
    }

    /// A writer recorded a failed node's replacement in the ledger's metadata (a new fragment,
    /// or the last one's nodes replaced in place).
    pub(crate) fn ensemble_changed(&self) {
        self.ensemble_changes.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn recovered(&self, outcome: RecoveryOutcome, took: Duration, written_back: u64) {
        if outcome == RecoveryOutcome::AlreadyClosed {
            return;
        }
        self.recoveries[outcome as usize].fetch_add(1, Ordering::Relaxed);
        self.recovery_ms.record(took.as_millis() as u64);
        self.recovered_entries_written_back.fetch_add(written_back, Ordering::Relaxed);
    }

    /// Entries asked of another replica because the one asked had been silent too long.
    pub(crate) fn speculative_reads(&self, count: u64) {
        self.speculative_reads.fetch_add(count, Ordering::Relaxed);
    }

    /// An entry asked of another replica after an error or a "no entry".
    pub(crate) fn read_retries(&self, count: u64) {
        self.read_retries.fetch_add(count, Ordering::Relaxed);
    }

    /// A read that found no entry for `read_timeout` and failed.
    pub(crate) fn read_timed_out(&self) {
        self.read_timeouts.fetch_add(1, Ordering::Relaxed);
    }

    /// A writer of this process found its ledger fenced by another's recovery and stopped.
    pub(crate) fn writer_fenced(&self) {
        self.fenced_writers.fetch_add(1, Ordering::Relaxed);
    }

    /// A request whose node failed (or was not live) before it answered.
    pub(crate) fn unanswered(&self) {
        self.unanswered_requests.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn write_metrics(
        &self,
        out: &mut Exposition,
        labels: Labels,
        live: &[NodeInfo],
        open_ledgers: usize,
    ) {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let read_only = live.iter().filter(|n| n.read_only).count();
        for (state, count) in [("writable", live.len() - read_only), ("read_only", read_only)] {
            let labels: Vec<(&str, &str)> =
                labels.iter().copied().chain([("state", state)]).collect();
            out.gauge(
                "magnetar_ledger_client_storage_nodes",
                "Storage nodes registered in the cluster that this broker can write to (one \
                 serving TLS only with [ledgers] tls_trust_certs_file, unless it serves \
                 plain-text clients too) as it last read them, by state (read_only: short of \
                 disk, refusing new entries).",
                &labels,
                count as f64,
            );
        }
        let mut racks: Vec<&str> =
            live.iter().filter(|n| !n.read_only).filter_map(|n| n.rack.as_deref()).collect();
        racks.sort_unstable();
        racks.dedup();
        out.gauge(
            "magnetar_ledger_client_storage_node_racks",
            "Racks among the writable storage nodes this broker can write to (the operator's \
             assignments, else the nodes' own labels; 0 when none is labelled): fewer than a \
             ledger's write quorum and its copies cannot all be on different racks.",
            labels,
            racks.len() as f64,
        );
        out.gauge(
            "magnetar_ledger_client_default_write_quorum",
            "Write quorum of new ledgers where no namespace persistence policy names one: \
             fewer writable storage nodes than this and new ledgers cannot be placed.",
            labels,
            self.default_write_quorum as f64,
        );
        out.gauge(
            "magnetar_ledger_client_open_ledgers",
            "Ledgers this broker is writing.",
            labels,
            open_ledgers as f64,
        );
        for (outcome, index) in [
            ("closed", RecoveryOutcome::Closed),
            ("superseded", RecoveryOutcome::Superseded),
            ("failed", RecoveryOutcome::Failed),
        ] {
            let labels: Vec<(&str, &str)> =
                labels.iter().copied().chain([("outcome", outcome)]).collect();
            out.counter(
                "magnetar_ledger_client_recoveries",
                "Ledger recoveries run by this broker (taking over a ledger another writer left \
                 open), by outcome: closed it, another recovery closed it, or gave up.",
                &labels,
                load(&self.recoveries[index as usize]),
            );
        }
        let (cumulative, sum_ms) = self.recovery_ms.cumulative();
        out.histogram(
            "magnetar_ledger_client_recovery_seconds",
            "Time a ledger recovery took, start to closed (or given up).",
            labels,
            self.recovery_ms.bounds(),
            &cumulative,
            sum_ms,
            1e3,
        );
        let counters: [(&'static str, &'static str, &AtomicU64); 7] = [
            (
                "magnetar_ledger_client_ensemble_changes",
                "Ensemble changes: a storage node of an open ledger failed and was replaced, the \
                 change recorded in the ledger's metadata (a new fragment, or the last one's \
                 nodes replaced in place when none of its entries was acknowledged yet; \
                 BookKeeper's NUM_ENSEMBLE_CHANGE).",
                &self.ensemble_changes,
            ),
            (
                "magnetar_ledger_client_recovery_written_back_entries",
                "Entries recoveries wrote back to a write quorum (found on fewer nodes).",
                &self.recovered_entries_written_back,
            ),
            (
                "magnetar_ledger_client_speculative_reads",
                "Entry reads also asked of another replica because the one asked had answered \
                 nothing for speculative_read_millis (BookKeeper's SPECULATIVE_READ_COUNT).",
                &self.speculative_reads,
            ),
            (
                "magnetar_ledger_client_read_retries",
                "Entry reads asked of another replica after an error or a missing entry.",
                &self.read_retries,
            ),
            (
                "magnetar_ledger_client_read_timeouts",
                "Entry reads that failed because no replica answered with an entry for \
                 read_timeout_millis (nodes frozen or cut off with their connections open); \
                 the reader tries again later.",
                &self.read_timeouts,
            ),
            (
                "magnetar_ledger_client_fenced_writers",
                "Ledgers this broker was writing that another process's recovery fenced: its \
                 adds were refused from then on (a broker that was frozen or cut off while \
                 another took its topics over; the topic is fenced here too).",
                &self.fenced_writers,
            ),
            (
                "magnetar_ledger_client_unanswered_requests",
                "Requests to storage nodes that failed unanswered: the node's connection failed \
                 or closed, or it was not registered.",
                &self.unanswered_requests,
            ),
        ];
        for (name, help, counter) in counters {
            out.counter(name, help, labels, load(counter));
        }
    }
}
