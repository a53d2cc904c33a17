//! The crate's integration tests, one module per area, linked into one test binary (one link
//! and one instantiation of the shared generics instead of one per file: most of what
//! `cargo test` spent on this crate).

mod batching;
mod conformance;
mod faults;
