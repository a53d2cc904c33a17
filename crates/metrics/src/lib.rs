//! Metrics primitives every tier shares, with no dependency of their own:
//!
//! - [`Histogram`]: a fixed-bucket, lock-free histogram (one relaxed atomic add per bucket hit,
//!   no allocation), rendered as a Prometheus histogram (cumulative `le` buckets).
//! - [`WindowedBuckets`]: Pulsar's `StatsBuckets` semantics for the `pulsar_*_le_*` gauges:
//!   per-bucket counts over the last completed stats interval, not cumulative;
//!   [`RollingWindow`] gives any [`Histogram`] the same view, and [`WindowReading::quantile`]
//!   estimates quantiles from it (BookKeeper's latency summaries).
//! - [`Exposition`]: the text encoder, Prometheus text format 0.0.4 or OpenMetrics 1.0.0, with
//!   families kept contiguous however the samples arrive.
//!
//! Hot paths only touch atomics; everything that allocates happens at scrape time.

mod exposition;
mod histogram;

pub use exposition::{Exposition, Format, Kind, LabelSet, Labels, SampleLabels};
pub use histogram::{Histogram, RollingWindow, WindowReading, WindowedBuckets};
