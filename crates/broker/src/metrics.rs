//! The broker's own counters (connections, cursor-ledger appends, metadata writes and
//! latencies). `prometheus.rs` renders them with the topics' and the storage's series on
//! `GET /metrics`.

use magnetar_metadata::OperationLatency;
use magnetar_metrics::{Exposition, Labels};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Debug, Default)]
pub struct BrokerMetrics {
    /// Cursor states appended to cursor ledgers (each durable subscription persist).
    pub cursor_ledger_appends: AtomicU64,
    /// Binary-protocol connections accepted, those whose CONNECT was accepted, those closed
    /// before it was, and those closed (Pulsar's `pulsar_connection_*` counts).
    pub connections_created: AtomicU64,
    pub connections_succeeded: AtomicU64,
    pub connections_failed: AtomicU64,
    pub connections_closed: AtomicU64,
    /// The metadata store's write counter, if the store is wrapped in a counting store.
    metadata_writes: Option<Arc<AtomicU64>>,
    /// The counting store's operation latencies, when there is one.
    metadata_latency: Option<Arc<OperationLatency>>,
}

impl BrokerMetrics {
    /// Counters; `metadata_writes` is the counting store's (None: not counted, not exported).
    pub fn new(metadata_writes: Option<Arc<AtomicU64>>) -> Arc<Self> {
        Arc::new(BrokerMetrics { metadata_writes, ..BrokerMetrics::default() })
    }

    /// Counters with the metadata store counted and timed through `store`.
    pub fn counting(store: &magnetar_metadata::CountingStore) -> Arc<Self> {
        Arc::new(BrokerMetrics {
            metadata_writes: Some(store.write_counter()),
            metadata_latency: Some(store.latency()),
            ..BrokerMetrics::default()
        })
    }

    /// Writes the connection series (Pulsar's names and labels: `cluster`, `broker`,
    /// `metric="broker_connection"`) and Magnetar's own counters (`cluster`).
    pub fn write(&self, out: &mut Exposition, cluster: &str, broker: &str) {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let connection: Labels =
            &[("cluster", cluster), ("broker", broker), ("metric", "broker_connection")];
        let created = load(&self.connections_created);
        let closed = load(&self.connections_closed);
        out.gauge(
            "pulsar_active_connections",
            "Binary-protocol connections open now.",
            connection,
            created.saturating_sub(closed) as f64,
        );
        // Pulsar's `_count` names: typed as summaries with a count only (promtool's lint
        // reserves `_count` for summaries and histograms).
        let counts = [
            ("pulsar_connection_created_total", "Connections accepted.", created),
            (
                "pulsar_connection_create_success",
                "Connections whose CONNECT was accepted.",
                load(&self.connections_succeeded),
            ),
            (
                "pulsar_connection_create_fail",
                "Connections closed before a CONNECT was accepted.",
                load(&self.connections_failed),
            ),
            ("pulsar_connection_closed_total", "Connections closed.", closed),
        ];
        for (name, help, value) in counts {
            out.summary_count(name, help, connection, value);
        }
        let labels: Labels = &[("cluster", cluster)];
        if let Some(writes) = &self.metadata_writes {
            out.counter(
                "magnetar_metadata_writes",
                "Metadata-store writes (puts and deletes) made by this process.",
                labels,
                writes.load(Ordering::Relaxed),
            );
        }
        if let Some(latency) = &self.metadata_latency {
            latency.write_metrics(out, labels);
        }
        out.counter(
            "magnetar_cursor_ledger_appends",
            "Acknowledgement states appended to cursor ledgers.",
            labels,
            load(&self.cursor_ledger_appends),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use magnetar_metrics::Format;

    #[test]
    fn renders_connection_counts_and_leaves_out_an_uncounted_store() {
        let metrics = BrokerMetrics::new(Some(Arc::new(AtomicU64::new(7))));
        metrics.cursor_ledger_appends.fetch_add(3, Ordering::Relaxed);
        metrics.connections_created.fetch_add(5, Ordering::Relaxed);
        metrics.connections_succeeded.fetch_add(4, Ordering::Relaxed);
        metrics.connections_failed.fetch_add(1, Ordering::Relaxed);
        metrics.connections_closed.fetch_add(2, Ordering::Relaxed);
        let mut out = Exposition::new(Format::Prometheus);
        metrics.write(&mut out, "c", "b:1");
        let text = out.finish();
        let labels = "{cluster=\"c\",broker=\"b:1\",metric=\"broker_connection\"}";
        for expected in [
            format!("\npulsar_active_connections{labels} 3\n"),
            format!("\npulsar_connection_created_total_count{labels} 5\n"),
            format!("\npulsar_connection_create_success_count{labels} 4\n"),
            format!("\npulsar_connection_create_fail_count{labels} 1\n"),
            format!("\npulsar_connection_closed_total_count{labels} 2\n"),
            "\nmagnetar_metadata_writes_total{cluster=\"c\"} 7\n".to_string(),
            "\nmagnetar_cursor_ledger_appends_total{cluster=\"c\"} 3\n".to_string(),
        ] {
            assert!(text.contains(&expected), "{expected} in {text}");
        }
        let mut bare = Exposition::new(Format::Prometheus);
        BrokerMetrics::new(None).write(&mut bare, "c", "b");
        assert!(!bare.finish().contains("metadata_writes"));
    }
}
