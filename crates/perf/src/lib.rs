//! Benchmarks and test workloads, kept out of the test suite: `magnetar perf ...` and
//! `magnetar disk-probe` call into this crate.

pub mod crash;
pub mod disk;
pub mod latency;
pub mod pace;
pub mod pulsar;
pub mod stats;
pub mod storage;
