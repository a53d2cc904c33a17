//! The broker's clock, injected: decision code never reads the system clock itself (clippy's
//! `disallowed-methods` in this crate's `clippy.toml` enforces it), so a simulation can drive time.

pub use magnetar_clock::{Clock, ManualClock, SystemClock};
