//! The crate's integration tests, one module per area, linked into one test binary (one link
//! and one instantiation of the shared generics instead of one per file: most of what
//! `cargo test` spent on this crate).

mod client;
mod common;
mod create_retry;
mod fake;
mod interop;
mod lookup_redirect;
mod send_timeout;
