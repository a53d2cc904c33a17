//! Command-line interface: every subcommand and flag, validated before anything starts.

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(name = "magnetar", version, about = "Pulsar-protocol messaging and streaming platform")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run broker, storage and metadata in one process.
    Standalone(StandaloneArgs),
    /// Benchmarks (not tests): see docs/benchmarks.md.
    #[command(subcommand)]
    Perf(PerfCommand),
    /// Measure the disk's write ceiling: M threads writing K-KiB blocks.
    DiskProbe(DiskProbeArgs),
    /// Internal tools used by the test suite.
    #[command(subcommand, hide = true)]
    Debug(DebugCommand),
}

#[derive(Args, Debug)]
pub struct StandaloneArgs {
    /// Configuration file (TOML); see magnetar.example.toml for every knob. Flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Directory for all persistent state [default: ./data].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Binary protocol port [default: 6650].
    #[arg(long)]
    pub broker_port: Option<u16>,
    /// HTTP admin port [default: 8080].
    #[arg(long)]
    pub web_port: Option<u16>,
}

#[derive(Subcommand, Debug)]
pub enum PerfCommand {
    /// Storage engine appends next to the raw disk, measured in one run.
    Storage(PerfStorageArgs),
}

#[derive(Args, Debug)]
pub struct PerfStorageArgs {
    /// Scratch directory on the disk to measure.
    #[arg(long, default_value = "./perf-data")]
    pub dir: PathBuf,
    /// Concurrent appenders (comma-separated list).
    #[arg(long, value_delimiter = ',', default_value = "1,16,256")]
    pub appenders: Vec<usize>,
    /// Entry sizes in bytes (comma-separated list).
    #[arg(long, value_delimiter = ',', default_value = "128,1024,16384")]
    pub sizes: Vec<usize>,
    /// Measured seconds per case (after a short warm-up).
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// fdatasync (default), dsync or none.
    #[arg(long, default_value = "fdatasync")]
    pub sync_mode: magnetar_journal::SyncMode,
    /// Write the journal through the page cache instead of with O_DIRECT (the default).
    #[arg(long)]
    pub buffered_io: bool,
    /// Skip the raw disk measurements.
    #[arg(long)]
    pub no_raw: bool,
    /// Print the report as JSON at the end.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct DiskProbeArgs {
    /// Scratch directory on the disk to measure.
    #[arg(long, default_value = "./perf-data")]
    pub dir: PathBuf,
    /// Writer threads (comma-separated list: one row each).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    pub threads: Vec<usize>,
    /// Block sizes in KiB (comma-separated list: one column each).
    #[arg(long, value_delimiter = ',', default_value = "4,64,1024")]
    pub block_size: Vec<usize>,
    /// Seconds per cell.
    #[arg(long, default_value_t = 2.0)]
    pub seconds: f64,
    /// Open with O_DIRECT.
    #[arg(long)]
    pub direct: bool,
    /// Do not fdatasync after each block (measures buffered or O_DIRECT bandwidth).
    #[arg(long)]
    pub no_sync: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
pub enum DebugCommand {
    /// Append until killed, printing each acknowledged entry (crash test child).
    CrashWriter {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 6)]
        appenders: usize,
    },
}

impl Cli {
    /// Checks what can be checked without touching any file.
    pub fn validate(&self) -> Result<(), String> {
        match &self.command {
            Command::Perf(PerfCommand::Storage(args)) => {
                if args.appenders.iter().any(|&a| a == 0 || a > 100_000) {
                    return Err("--appenders must be between 1 and 100000".into());
                }
                if args.sizes.iter().any(|&s| s == 0 || s > 4 << 20) {
                    return Err("--sizes must be between 1 byte and 4 MiB".into());
                }
                if !(0.1..=3600.0).contains(&args.seconds) {
                    return Err("--seconds must be between 0.1 and 3600".into());
                }
            }
            Command::DiskProbe(args) => {
                if args.threads.iter().any(|&t| t == 0 || t > 1024) {
                    return Err("--threads must be between 1 and 1024".into());
                }
                if args.block_size.iter().any(|&k| k == 0 || k > 64 << 10) {
                    return Err("--block-size must be between 1 and 65536 KiB".into());
                }
                if args.direct && args.block_size.iter().any(|&k| k % 4 != 0) {
                    return Err("--direct needs block sizes that are multiples of 4 KiB".into());
                }
                if !(0.1..=3600.0).contains(&args.seconds) {
                    return Err("--seconds must be between 0.1 and 3600".into());
                }
            }
            Command::Standalone(_) | Command::Debug(_) => {}
        }
        Ok(())
    }
}
