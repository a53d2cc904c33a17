//! Ledger store configuration.

use crate::error::LedgerError;
use magnetar_journal::JournalConfig;
use std::path::PathBuf;

#[derive(Debug, Clone)]
pub struct LedgerStoreConfig {
    /// Directory of journal segments, index files and the checkpoint.
    pub dir: PathBuf,
    pub journal: JournalConfig,
    /// Memory for recently appended entries, served to tailing readers without a disk read.
    /// Default 32 MiB. Only filled as entries arrive.
    pub write_cache_bytes: usize,
    /// A sealed segment whose live bytes fall below this fraction of its size has its live
    /// entries copied forward so that the whole file can be freed. Default 0.5; 0 disables.
    pub compaction_live_ratio: f64,
    /// Bytes of free disk below which the store reports itself short of disk
    /// ([`crate::LedgerStore::short_of_disk`], measured every 100 ms), until twice this is free
    /// again. It refuses nothing itself: a broker then refuses new messages while cursor
    /// writes, deletes and compaction go on in what is left, so that the disk can be reclaimed
    /// (a journal at ENOSPC cannot even record a delete). Default 0: off.
    pub min_free_bytes: u64,
    /// Bytes held back in a reserve file (`RESERVE`), given up when the journal or a side file
    /// meets a full disk anyway (another process filled it, or `min_free_bytes` is 0), so that
    /// deletes, checkpoints and compaction can still be written and the disk reclaimed; while
    /// it is given up the store is short of disk. Created again once twice it (plus
    /// `min_free_bytes`) is free. 0 or at least one journal segment. Default 0 (the servers'
    /// configuration sets two segments).
    pub reserve_bytes: u64,
}

impl Default for LedgerStoreConfig {
    fn default() -> Self {
        LedgerStoreConfig {
            dir: PathBuf::from("data/ledgers"),
            journal: JournalConfig::default(),
            write_cache_bytes: 32 << 20,
            compaction_live_ratio: 0.5,
            min_free_bytes: 0,
            reserve_bytes: 0,
        }
    }
}

impl LedgerStoreConfig {
    pub fn validate(&self) -> Result<(), LedgerError> {
        self.journal.validate()?;
        if !(0.0..1.0).contains(&self.compaction_live_ratio) {
            return Err(LedgerError::Config(format!(
                "compaction_live_ratio must be in [0, 1): {}",
                self.compaction_live_ratio
            )));
        }
        if self.reserve_bytes != 0 && self.reserve_bytes < self.journal.segment_size_bytes {
            return Err(LedgerError::Config(format!(
                "the disk reserve ({} bytes) must be 0 or at least one journal segment ({} \
                 bytes): it is where a full journal goes on",
                self.reserve_bytes, self.journal.segment_size_bytes
            )));
        }
        Ok(())
    }
}
