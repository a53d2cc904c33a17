//! The I/O seam of the embedded store's log, plus small durable-file helpers.
//!
//! Every log append and fdatasync goes through [`LogIo`], so tests can wrap the real file
//! (via `EmbeddedStoreConfig::log_io_wrapper`) and inject failures: a failing `append` or
//! `sync` makes the store poison itself instead of acknowledging a write it cannot vouch for.
//! Invariant: a `sync` that returns `Ok` means every byte passed to earlier `append` calls is
//! durable.

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;
use std::sync::Arc;

/// Append-only sink for log records.
pub trait LogIo: Send {
    /// Appends all of `buf` at the end of the log (not yet durable).
    fn append(&mut self, buf: &[u8]) -> io::Result<()>;
    /// Makes every appended byte durable (fdatasync for files).
    fn sync(&mut self) -> io::Result<()>;
}

/// Wraps the log sink each time the store opens or replaces its log file; a fault-injection
/// seam for tests. Production code leaves it unset.
pub type LogIoWrapper = Arc<dyn Fn(Box<dyn LogIo>) -> Box<dyn LogIo> + Send + Sync>;

/// [`LogIo`] over a real file positioned at its end.
#[derive(Debug)]
pub struct FileLogIo {
    file: File,
}

impl FileLogIo {
    /// Wraps a file whose write position is at the end of the log.
    pub fn new(file: File) -> Self {
        FileLogIo { file }
    }
}

impl LogIo for FileLogIo {
    fn append(&mut self, buf: &[u8]) -> io::Result<()> {
        self.file.write_all(buf)
    }

    fn sync(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }
}

/// Fsyncs a directory so that renames and creations inside it are durable.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Removes a file, treating "not found" as success.
pub(crate) fn remove_if_exists(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
