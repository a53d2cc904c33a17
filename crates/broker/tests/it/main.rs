//! The crate's integration tests, one module per area, linked into one test binary (one link
//! and one instantiation of the shared generics instead of one per file: most of what
//! `cargo test` spent on this crate).

mod connection_loop;
mod cursor_ledgers;
mod fencing;
mod policy_watch;
mod unload;
