//! Magnetar broker: serves topics over the Pulsar binary protocol.
//!
//! - `connection`: one client connection, frames in and out, command handling.
//! - `service`: the registry of loaded topics, topic names, partition metadata.
//! - `topic`: a topic's producers and subscriptions over its managed ledger.
//! - `managed_ledger`: a topic's ledgers in the ledger store, rolled over by size.
//! - `subscription`: cursor, consumers and the dispatcher task.
//! - `cursor`: the acknowledgement-state core and the cursor record's format (pure, no I/O).
//! - `cursor_ledger`: durable subscriptions' states in cursor ledgers, a pointer in metadata.
//! - `key_shared`: Key_Shared hashing, selectors and draining hashes (pure).
//! - `delayed`: the bounded delayed-delivery index (pure).
//! - `dedup`: producer deduplication state (pure).
//! - `compaction_host`: what topic compaction (`magnetar_compaction`) reads and writes of a topic.
//! - `non_persistent`: in-memory, at-most-once topics and their subscriptions.
//! - `registration`: the broker's ephemeral registration key and readiness across metadata
//!   session loss (pure state machine plus a small tokio shell).
//! - `limits`, `expiry`, `backlog_quota`: per-topic limits read without a lock (rates as token
//!   buckets, unacked-message blocking), message TTL, backlog quotas (see ARCHITECTURE.md).
//! - `metrics`: counters for `GET /metrics` (Prometheus text).
//! - `stats`: topic statistics as the admin API reports them, and their meters.
//! - `history`: the bounded recent history (totals and some topics) the web console charts.
//! - `schema_registry`: schema histories in the metadata store (the rules are in `magnetar_model::schema`).
//!
//! Names, metadata keys, policies documents and schema rules come from `magnetar_model`; the
//! HTTP admin API (`magnetar_admin`) sits above this crate.

pub mod admission;
mod append_order;
pub mod authorization;
pub mod backlog_quota;
pub mod clock;
mod compaction_host;
pub mod config;
pub mod connection;
pub mod cursor;
pub mod cursor_ledger;
pub mod dedup;
pub mod delayed;
pub mod error;
pub mod expiry;
pub mod fence;
pub mod history;
pub mod housekeeping;
pub mod key_shared;
pub mod ledger_ids;
pub mod limits;
pub mod managed_ledger;
pub mod metrics;
pub mod non_persistent;
pub mod ownership;
pub mod policy_watch;
pub mod prometheus;
pub mod registration;
pub mod retention;
pub mod schema_registry;
pub mod service;
pub mod stats;
pub mod subscription;
pub mod topic;

pub use config::BrokerConfig;
pub use error::BrokerError;
pub use service::BrokerService;
