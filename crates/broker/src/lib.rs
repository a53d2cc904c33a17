//! Magnetar broker: topics, subscriptions and cursors. For now it holds only the cursor
//! acknowledgement-state core (`cursor`), a pure data structure with no I/O.

pub mod cursor;
