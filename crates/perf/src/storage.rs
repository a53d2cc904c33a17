//! `magnetar perf storage`: the storage engine's append path under 1..256 concurrent appenders
//! and several entry sizes, next to the raw disk measured in the same run.
//!
//! Each appender is a tokio task appending to its own ledger with one append in flight (the
//! shape of a broker with many producers), so throughput comes from group commit alone.

use crate::disk;
use crate::latency::{self, Latency};
use bytes::Bytes;
use magnetar_journal::{JournalConfig, SyncMode};
use magnetar_ledger::{LedgerStore, LedgerStoreConfig};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct StorageBenchOptions {
    /// Scratch directory (on the disk to measure); each case uses a fresh subdirectory.
    pub dir: PathBuf,
    pub appenders: Vec<usize>,
    pub entry_sizes: Vec<usize>,
    pub seconds_per_case: f64,
    pub sync_mode: SyncMode,
    pub direct_io: bool,
    /// Also measure the raw disk (write+fdatasync loops) for the ratios.
    pub raw: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct CaseResult {
    pub appenders: usize,
    pub entry_bytes: usize,
    pub entries_per_s: f64,
    pub mb_per_s: f64,
    pub latency: Latency,
    /// Appends per journal flush.
    pub entries_per_group: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct RawDisk {
    /// 4 KiB write + fdatasync into a pre-written file (what journal segments see).
    pub sync_4k_prewritten: disk::SyncLoop,
    /// 4 KiB write + fdatasync appending to a growing file.
    pub sync_4k_growing: disk::SyncLoop,
    /// 1 MiB write + fdatasync appending to a growing file.
    pub seq_1m_growing: disk::SyncLoop,
    /// 1 MiB write + fdatasync into a pre-written file.
    pub seq_1m_prewritten: disk::SyncLoop,
    /// The double-write model (journal + entry log), journal MB/s at 1 MiB blocks.
    pub double_write_1m_mb_per_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct StorageReport {
    pub raw: Option<RawDisk>,
    pub cases: Vec<CaseResult>,
}

pub fn run(options: &StorageBenchOptions) -> anyhow::Result<StorageReport> {
    std::fs::create_dir_all(&options.dir)?;
    let raw_seconds = Duration::from_secs_f64(options.seconds_per_case.clamp(1.0, 5.0));
    let raw = if options.raw {
        let raw = RawDisk {
            sync_4k_prewritten: disk::sync_loop(&options.dir, 4096, raw_seconds, true)?,
            sync_4k_growing: disk::sync_loop(&options.dir, 4096, raw_seconds, false)?,
            seq_1m_growing: disk::sync_loop(&options.dir, 1 << 20, raw_seconds, false)?,
            seq_1m_prewritten: disk::sync_loop(&options.dir, 1 << 20, raw_seconds, true)?,
            double_write_1m_mb_per_s: disk::double_write_loop(&options.dir, 1 << 20, raw_seconds)?,
        };
        print_raw(&raw);
        Some(raw)
    } else {
        None
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let mut cases = Vec::new();
    for &appenders in &options.appenders {
        for &entry_bytes in &options.entry_sizes {
            let case = runtime.block_on(run_case(options, appenders, entry_bytes))?;
            print_case(&case, raw.as_ref());
            cases.push(case);
        }
    }
    Ok(StorageReport { raw, cases })
}

async fn run_case(
    options: &StorageBenchOptions,
    appenders: usize,
    entry_bytes: usize,
) -> anyhow::Result<CaseResult> {
    let dir = options.dir.join(format!("case-{appenders}-{entry_bytes}"));
    let _ = std::fs::remove_dir_all(&dir);
    let config = LedgerStoreConfig {
        dir: dir.clone(),
        journal: JournalConfig {
            sync_mode: options.sync_mode,
            direct_io: options.direct_io,
            ..JournalConfig::default()
        },
        ..LedgerStoreConfig::default()
    };
    let (store, _) = LedgerStore::open(config)?;
    let store = Arc::new(store);
    let payload = Bytes::from(vec![0xabu8; entry_bytes]);
    let warmup = Duration::from_secs_f64((options.seconds_per_case / 5.0).clamp(0.3, 2.0));
    let measure = Duration::from_secs_f64(options.seconds_per_case);
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..appenders {
        let ledger = store.create_ledger().await?;
        let (store, payload, measuring, stop) =
            (store.clone(), payload.clone(), measuring.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut histogram = latency::histogram();
            while !stop.load(Ordering::Relaxed) {
                let begin = Instant::now();
                store.append(ledger, payload.clone())?.await?;
                if measuring.load(Ordering::Relaxed) {
                    latency::record(&mut histogram, begin.elapsed());
                }
            }
            anyhow::Ok(histogram)
        }));
    }
    tokio::time::sleep(warmup).await;
    let stats = store.journal().stats();
    let groups_before = stats.groups.load(Ordering::Relaxed);
    let records_before = stats.records.load(Ordering::Relaxed);
    measuring.store(true, Ordering::Relaxed);
    let start = Instant::now();
    tokio::time::sleep(measure).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = start.elapsed().as_secs_f64();
    let groups = stats.groups.load(Ordering::Relaxed) - groups_before;
    let records = stats.records.load(Ordering::Relaxed) - records_before;
    stop.store(true, Ordering::Relaxed);
    let mut histogram = latency::histogram();
    for task in tasks {
        histogram.add(task.await??)?;
    }
    let count = histogram.len() as f64;
    let store = Arc::try_unwrap(store).ok().expect("tasks are done");
    tokio::task::spawn_blocking(move || drop(store)).await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(CaseResult {
        appenders,
        entry_bytes,
        entries_per_s: count / elapsed,
        mb_per_s: count * entry_bytes as f64 / elapsed / 1e6,
        latency: Latency::of(&histogram),
        entries_per_group: records as f64 / groups.max(1) as f64,
    })
}

fn print_raw(raw: &RawDisk) {
    let line = |name: &str, r: &disk::SyncLoop| {
        let writes_per_s = r.mb_per_s * 1e6 / r.block_bytes as f64;
        println!(
            "raw {name:<28} {:>9.1} MB/s {writes_per_s:>8.0} writes/s  {}",
            r.mb_per_s, r.latency
        );
    };
    line("4 KiB fdatasync, pre-written", &raw.sync_4k_prewritten);
    line("4 KiB fdatasync, growing", &raw.sync_4k_growing);
    line("1 MiB fdatasync, growing", &raw.seq_1m_growing);
    line("1 MiB fdatasync, pre-written", &raw.seq_1m_prewritten);
    println!("raw double-write model (1 MiB)   {:>9.1} MB/s", raw.double_write_1m_mb_per_s);
}

fn print_case(case: &CaseResult, raw: Option<&RawDisk>) {
    print!(
        "storage {:>3} appenders {:>6} B  {:>10.0} entries/s {:>8.1} MB/s  {}  {:>6.1}/group",
        case.appenders,
        case.entry_bytes,
        case.entries_per_s,
        case.mb_per_s,
        case.latency,
        case.entries_per_group
    );
    if let Some(raw) = raw {
        let base = &raw.sync_4k_prewritten.latency;
        print!(
            "  | p50 {:.2}x p99 {:.2}x raw 4K; {:.0}% of raw 1M seq",
            case.latency.p50_us as f64 / base.p50_us as f64,
            case.latency.p99_us as f64 / base.p99_us as f64,
            100.0 * case.mb_per_s / raw.seq_1m_growing.mb_per_s
        );
    }
    println!();
}
