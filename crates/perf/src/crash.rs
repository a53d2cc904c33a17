//! The crash-test workload: a child process appends to several ledgers and prints
//! `ACK <ledger> <entry>` for each durable append, `DELETING <ledger>` before a delete and
//! `DEL <ledger>` once it is durable; the test kills it with SIGKILL and checks every
//! acknowledged entry after a restart. Payloads are a pure function of (ledger, entry)
//! so the checker knows what must be there.

use bytes::Bytes;
use magnetar_journal::JournalConfig;
use magnetar_ledger::{LedgerStore, LedgerStoreConfig};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

pub fn payload(ledger: u64, entry: u64) -> Bytes {
    let len =
        1 + ((ledger.wrapping_mul(2_654_435_761) ^ entry.wrapping_mul(40_503)) % 6000) as usize;
    Bytes::from(
        (0..len)
            .map(|i| (i as u64).wrapping_mul(31).wrapping_add(ledger ^ (entry << 7)) as u8)
            .collect::<Vec<u8>>(),
    )
}

/// Store settings for the crash test: small segments so that rollover, index files,
/// checkpoints and compaction all happen while the process may be killed.
pub fn config(dir: &Path) -> LedgerStoreConfig {
    LedgerStoreConfig {
        dir: dir.to_path_buf(),
        journal: JournalConfig {
            segment_size_bytes: 1 << 20,
            max_group_bytes: 256 << 10,
            ..JournalConfig::default()
        },
        ..LedgerStoreConfig::default()
    }
}

/// Runs until killed: continues every open ledger and starts new ones, `appenders` at a time.
pub fn run_writer(dir: &Path, appenders: usize) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let (store, _) = LedgerStore::open(config(dir))?;
        let store = Arc::new(store);
        let out = Arc::new(std::sync::Mutex::new(std::io::stdout()));
        let mut open: Vec<(u64, u64)> = Vec::new();
        for ledger in store.ledgers() {
            let info = store.ledger_info(ledger)?;
            if !info.closed && !info.fenced {
                open.push((ledger, info.entries));
            }
        }
        {
            let mut out = out.lock().expect("stdout lock");
            writeln!(out, "READY")?;
            out.flush()?;
        }
        let mut tasks = Vec::new();
        for task in 0..appenders {
            let (store, out) = (store.clone(), out.clone());
            let resume = open.get(task).copied();
            tasks.push(tokio::spawn(async move {
                let (mut ledger, mut entry) = match resume {
                    Some(position) => position,
                    None => (store.create_ledger().await?, 0),
                };
                loop {
                    store.append(ledger, payload(ledger, entry))?.await?;
                    {
                        let mut out = out.lock().expect("stdout lock");
                        writeln!(out, "ACK {ledger} {entry}")?;
                        out.flush()?;
                    }
                    entry += 1;
                    if entry % 400 == 0 {
                        store.close_ledger(ledger).await?;
                        if ledger % 2 == 0 {
                            // Announced first: a kill after the delete is durable but before
                            // `DEL` is printed leaves the ledger legitimately gone.
                            {
                                let mut out = out.lock().expect("stdout lock");
                                writeln!(out, "DELETING {ledger}")?;
                                out.flush()?;
                            }
                            store.delete_ledger(ledger).await?;
                            let mut out = out.lock().expect("stdout lock");
                            writeln!(out, "DEL {ledger}")?;
                            out.flush()?;
                        }
                        ledger = store.create_ledger().await?;
                        entry = 0;
                    }
                }
                #[allow(unreachable_code)]
                anyhow::Ok(())
            }));
        }
        for task in tasks {
            task.await??;
        }
        anyhow::Ok(())
    })
}
