//! What a storage node has done, for its Prometheus endpoint (`magnetar storage
//! --metrics-listen`): requests by kind, counted as they arrive, next to the ledger store's own
//! series (journal groups and fdatasync times, reads, compaction) and the disk's state.

use crate::space::DiskSpace;
use magnetar_metrics::{Exposition, Labels};
use magnetar_replication::message::Request;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
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
}

impl NodeStats {
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
}
