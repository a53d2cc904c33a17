//! Raw disk measurements: what the hardware gives with no software in the way, so our figures
//! can be quoted as ratios measured in the same run.

use crate::latency::{self, Latency};
use serde::Serialize;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

/// Result of a write+fdatasync loop.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SyncLoop {
    pub block_bytes: usize,
    pub writes: u64,
    pub mb_per_s: f64,
    pub latency: Latency,
}

/// A directory of its own inside `dir` for one probe's files: removed with them when the probe
/// returns, an I/O error or a panic included.
fn scratch_dir(dir: &Path) -> io::Result<tempfile::TempDir> {
    tempfile::Builder::new().prefix("disk-probe-").tempdir_in(dir)
}

fn open_fresh(path: &Path, direct: bool) -> io::Result<File> {
    let flags = if direct { libc::O_DIRECT } else { 0 };
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(flags)
        .open(path)
}

/// Writes `block_bytes` blocks sequentially with an fdatasync after each, for `duration`.
/// `prewritten`: the file is filled with zeros and synced first, so each fdatasync flushes data
/// only (what the journal's preallocated segments see); otherwise the file grows with each write.
pub fn sync_loop(
    dir: &Path,
    block_bytes: usize,
    duration: Duration,
    prewritten: bool,
) -> io::Result<SyncLoop> {
    let scratch = scratch_dir(dir)?;
    let path = scratch.path().join(format!("raw-sync-{block_bytes}-{prewritten}.tmp"));
    let file = open_fresh(&path, false)?;
    let span: u64 = 256 << 20;
    if prewritten {
        let zeros = vec![0u8; 1 << 20];
        for i in 0..span / zeros.len() as u64 {
            file.write_all_at(&zeros, i * zeros.len() as u64)?;
        }
        file.sync_all()?;
    }
    let block = vec![0x5au8; block_bytes];
    let mut histogram = latency::histogram();
    let start = Instant::now();
    let mut offset = 0u64;
    let mut writes = 0u64;
    while start.elapsed() < duration {
        let begin = Instant::now();
        file.write_all_at(&block, offset)?;
        file.sync_data()?;
        latency::record(&mut histogram, begin.elapsed());
        writes += 1;
        offset += block_bytes as u64;
        if prewritten && offset + block_bytes as u64 > span {
            offset = 0;
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    drop(file);
    scratch.close()?;
    Ok(SyncLoop {
        block_bytes,
        writes,
        mb_per_s: (writes * block_bytes as u64) as f64 / seconds / 1e6,
        latency: Latency::of(&histogram),
    })
}

/// The model of BookKeeper's double write: every byte fdatasync'ed to a journal and written
/// again, buffered, to an entry log that is flushed every 64 MiB. Returns journal MB/s.
pub fn double_write_loop(dir: &Path, block_bytes: usize, duration: Duration) -> io::Result<f64> {
    let scratch = scratch_dir(dir)?;
    let journal_path = scratch.path().join("raw-double-journal.tmp");
    let log_path = scratch.path().join("raw-double-entrylog.tmp");
    let journal = open_fresh(&journal_path, false)?;
    let entry_log = open_fresh(&log_path, false)?;
    let block = vec![0x5au8; block_bytes];
    let start = Instant::now();
    let (mut offset, mut unflushed) = (0u64, 0u64);
    while start.elapsed() < duration {
        journal.write_all_at(&block, offset)?;
        journal.sync_data()?;
        entry_log.write_all_at(&block, offset)?;
        unflushed += block_bytes as u64;
        if unflushed >= 64 << 20 {
            entry_log.sync_data()?;
            unflushed = 0;
        }
        offset += block_bytes as u64;
    }
    entry_log.sync_data()?;
    let seconds = start.elapsed().as_secs_f64();
    drop((journal, entry_log));
    scratch.close()?;
    Ok(offset as f64 / seconds / 1e6)
}

/// One cell of the disk-probe table.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ProbeResult {
    pub threads: usize,
    pub block_kib: usize,
    pub mb_per_s: f64,
    pub writes_per_s: f64,
}

/// `threads` writers, each appending `block_kib` KiB blocks to its own file with an
/// fdatasync after each (or `O_DIRECT` without one when `direct`), for `duration`.
pub fn probe(
    dir: &Path,
    threads: usize,
    block_kib: usize,
    duration: Duration,
    direct: bool,
    sync: bool,
) -> io::Result<ProbeResult> {
    let scratch = scratch_dir(dir)?;
    let start = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let path = scratch.path().join(format!("probe-{t}.tmp"));
            std::thread::spawn(move || -> io::Result<u64> {
                let file = open_fresh(&path, direct)?;
                let block = magnetar_journal::aligned::AlignedBuf::with_capacity(block_kib << 10);
                let mut block = block;
                magnetar_journal::record::Sink::extend_zeros(&mut block, block_kib << 10);
                let mut offset = 0u64;
                let mut writes = 0u64;
                while start.elapsed() < duration {
                    file.write_all_at(block.as_slice(), offset)?;
                    if sync {
                        file.sync_data()?;
                    }
                    offset += (block_kib << 10) as u64;
                    writes += 1;
                }
                Ok(writes)
            })
        })
        .collect();
    let mut writes = 0;
    for worker in workers {
        writes += worker.join().map_err(|_| io::Error::other("probe thread panicked"))??;
    }
    let seconds = start.elapsed().as_secs_f64();
    scratch.close()?;
    Ok(ProbeResult {
        threads,
        block_kib,
        mb_per_s: ((writes * (block_kib as u64)) << 10) as f64 / seconds / 1e6,
        writes_per_s: writes as f64 / seconds,
    })
}

/// One cell of the lock-step disk-probe table.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct LockstepResult {
    pub threads: usize,
    pub block_kib: usize,
    pub rounds: u64,
    /// From the first write of a round starting to the last one being durable.
    pub round: Latency,
    /// Each write on its own.
    pub each: Latency,
}

/// `threads` writers that each write one `block_kib` KiB block durably at the same instant,
/// round after round, for `duration`: the time until all of a round's writes are durable is
/// what a replicated add waits for when its storage nodes share this disk (their journals
/// write a lone add as this does: `O_DIRECT | O_DSYNC`, into a file written before).
pub fn probe_lockstep(
    dir: &Path,
    threads: usize,
    block_kib: usize,
    duration: Duration,
) -> io::Result<LockstepResult> {
    assert!(threads > 0 && block_kib > 0 && block_kib.is_multiple_of(4), "checked by the caller");
    const SPAN: u64 = 64 << 20;
    let block_bytes = (block_kib << 10) as u64;
    let scratch = scratch_dir(dir)?;
    let mut files = Vec::with_capacity(threads);
    for t in 0..threads {
        let path = scratch.path().join(format!("lockstep-{t}.tmp"));
        let file = open_fresh(&path, false)?;
        let zeros = vec![0u8; 1 << 20];
        for i in 0..SPAN / zeros.len() as u64 {
            file.write_all_at(&zeros, i * zeros.len() as u64)?;
        }
        file.sync_all()?;
        drop(file);
        let file = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT | libc::O_DSYNC)
            .open(&path)?;
        files.push(file);
    }
    // Every round starts when all writers are at the barrier; a writer's (start, end) per round.
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(threads));
    let deadline = Instant::now() + duration;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = files
        .iter()
        .map(|file| file.try_clone())
        .collect::<io::Result<Vec<_>>>()?
        .into_iter()
        .enumerate()
        .map(|(t, file)| {
            let (barrier, stop) = (barrier.clone(), stop.clone());
            std::thread::spawn(move || -> io::Result<Vec<(Instant, Instant)>> {
                let mut block =
                    magnetar_journal::aligned::AlignedBuf::with_capacity(block_bytes as usize);
                magnetar_journal::record::Sink::extend_zeros(&mut block, block_bytes as usize);
                let mut times = Vec::new();
                let mut offset = 0u64;
                loop {
                    // The first writer decides, between two barriers, whether another round runs.
                    barrier.wait();
                    if t == 0 && Instant::now() >= deadline {
                        stop.store(true, std::sync::atomic::Ordering::Release);
                    }
                    barrier.wait();
                    if stop.load(std::sync::atomic::Ordering::Acquire) {
                        return Ok(times);
                    }
                    let start = Instant::now();
                    file.write_all_at(block.as_slice(), offset)?;
                    times.push((start, Instant::now()));
                    offset = (offset + block_bytes) % SPAN;
                }
            })
        })
        .collect();
    let mut per_writer = Vec::with_capacity(threads);
    for worker in workers {
        per_writer.push(worker.join().map_err(|_| io::Error::other("probe thread panicked"))??);
    }
    drop(files);
    scratch.close()?;
    let (mut round, mut each) = (latency::histogram(), latency::histogram());
    let rounds = per_writer.iter().map(Vec::len).min().unwrap_or(0);
    for r in 0..rounds {
        let first_start = per_writer.iter().map(|w| w[r].0).min().expect("a writer");
        let last_end = per_writer.iter().map(|w| w[r].1).max().expect("a writer");
        latency::record(&mut round, last_end - first_start);
        for writer in &per_writer {
            latency::record(&mut each, writer[r].1 - writer[r].0);
        }
    }
    Ok(LockstepResult {
        threads,
        block_kib,
        rounds: rounds as u64,
        round: Latency::of(&round),
        each: Latency::of(&each),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lockstep_round_lasts_at_least_as_long_as_each_of_its_writes() {
        // O_DIRECT needs a disk file system (not the tmpfs /tmp may be): next to the sources.
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).expect("temp dir");
        let result = probe_lockstep(dir.path(), 2, 4, Duration::from_millis(200)).expect("probe");
        assert!(result.rounds > 0, "{result:?}");
        assert!(result.round.p50_us >= result.each.p50_us, "{result:?}");
        assert!(result.round.max_us >= result.each.max_us, "{result:?}");
        assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 0, "files removed");
    }
}
