//! Broker counters, served as Prometheus text by the admin API's `GET /metrics`.
//!
//! - `magnetar_metadata_writes_total`: puts and deletes sent to the metadata store (counted by
//!   a [`magnetar_metadata::CountingStore`] around the store, when the process installed one).
//! - `magnetar_cursor_ledger_appends_total`: acknowledgement states appended to cursor ledgers.
//!
//! A benchmark samples them twice and divides by the time between (see docs/benchmarks.md).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Debug, Default)]
pub struct BrokerMetrics {
    /// Cursor states appended to cursor ledgers (each durable subscription persist).
    pub cursor_ledger_appends: AtomicU64,
    /// The metadata store's write counter, if the store is wrapped in a counting store.
    metadata_writes: Option<Arc<AtomicU64>>,
}

impl BrokerMetrics {
    /// Counters; `metadata_writes` is the counting store's (None: not counted, not exported).
    pub fn new(metadata_writes: Option<Arc<AtomicU64>>) -> Arc<Self> {
        Arc::new(BrokerMetrics { cursor_ledger_appends: AtomicU64::new(0), metadata_writes })
    }

    /// Prometheus text exposition format (version 0.0.4).
    pub fn prometheus_text(&self) -> String {
        let mut out = String::new();
        let mut counter = |name: &str, help: &str, value: u64| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            let _ = writeln!(out, "{name} {value}");
        };
        if let Some(writes) = &self.metadata_writes {
            counter(
                "magnetar_metadata_writes_total",
                "Metadata-store writes (puts and deletes) made by this process.",
                writes.load(Ordering::Relaxed),
            );
        }
        counter(
            "magnetar_cursor_ledger_appends_total",
            "Acknowledgement states appended to cursor ledgers.",
            self.cursor_ledger_appends.load(Ordering::Relaxed),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_leaves_out_an_uncounted_store() {
        let writes = Arc::new(AtomicU64::new(7));
        let metrics = BrokerMetrics::new(Some(writes.clone()));
        metrics.cursor_ledger_appends.fetch_add(3, Ordering::Relaxed);
        let text = metrics.prometheus_text();
        assert!(text.contains("# TYPE magnetar_metadata_writes_total counter\n"), "{text}");
        assert!(text.contains("\nmagnetar_metadata_writes_total 7\n"), "{text}");
        assert!(text.contains("\nmagnetar_cursor_ledger_appends_total 3\n"), "{text}");
        let bare = BrokerMetrics::new(None).prometheus_text();
        assert!(!bare.contains("metadata_writes"), "{bare}");
    }
}
