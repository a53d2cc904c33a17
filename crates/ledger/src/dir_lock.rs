//! A directory held by one process: `LOCK` in it, under an exclusive advisory lock (`flock`)
//! for as long as the [`DirLock`] lives (as the embedded metadata store's). A ledger store locks
//! its directory, and a storage node its whole data directory before it reads its identity: a
//! second process on it (a node started by hand while the old one still runs) would interleave
//! its journal writes with the first's. The kernel drops the lock when the process dies.

use std::path::Path;

use magnetar_journal::JournalError;

use crate::error::LedgerError;

const LOCK_FILE: &str = "LOCK";

/// Held while alive; see the module docs.
#[derive(Debug)]
pub struct DirLock {
    _file: std::fs::File,
}

impl DirLock {
    /// Creates `dir` if needed and locks it; `LedgerError::InUse` if another holds it.
    pub fn acquire(dir: &Path) -> Result<DirLock, LedgerError> {
        let io = |what: &str, e| JournalError::io(format!("{what} {}", dir.display()), e);
        std::fs::create_dir_all(dir).map_err(|e| io("create", e))?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join(LOCK_FILE))
            .map_err(|e| io("open the LOCK file in", e))?;
        match file.try_lock() {
            Ok(()) => Ok(DirLock { _file: file }),
            Err(std::fs::TryLockError::WouldBlock) => {
                Err(LedgerError::InUse { dir: dir.display().to_string() })
            }
            Err(std::fs::TryLockError::Error(e)) => Err(io("lock the LOCK file in", e).into()),
        }
    }
}
