//! The one Magnetar binary. `cli.rs` says what each subcommand takes; this file wires them up.

mod cli;
mod cluster;
mod config;
#[cfg(test)]
mod config_reference;
mod ownership;
mod perf;
mod proxy;
mod server;
mod standalone;
mod storage;
mod storage_nodes;
mod tokens;

use clap::Parser;
use cli::{Cli, Command, DebugCommand, DiskProbeArgs, LogFormat, MetadataCommand, PerfCommand};
use std::time::Duration;

fn main() {
    let cli = Cli::parse();
    if matches!(cli.command, Command::DiskProbe(_) | Command::Tokens(_)) {
        // A tool without sockets whose output goes to a pipe that closes (`| head`) ends
        // quietly, as Unix tools do, instead of panicking in `println!`. The rest keep Rust's
        // default (SIGPIPE ignored): a closed log pipe must not kill a server, and a vectored
        // write to a socket the peer closed (no MSG_NOSIGNAL there) must be an error, not a
        // silent death.
        // SAFETY: no other thread exists yet; SIG_DFL is a valid disposition for SIGPIPE.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    if let Err(why) = cli.validate() {
        eprintln!("error: {why}");
        std::process::exit(2);
    }
    let log = match &cli.command {
        Command::Standalone(args) => args.config.as_deref(),
        Command::Broker(args) => args.server.config.as_deref(),
        Command::Storage(args) => args.config.as_deref(),
        Command::Proxy(args) => args.config.as_deref(),
        _ => None,
    }
    .map(config::LogSection::peek)
    .unwrap_or_default();
    if let Err(why) = init_logging(cli.log_format, &log) {
        eprintln!("error: {why}");
        std::process::exit(2);
    }
    // One line that says what went wrong, and a non-zero exit; no backtrace (RUST_BACKTRACE
    // would otherwise add one to an anyhow error, which reads like a crash).
    if let Err(error) = run(cli.command) {
        eprintln!("error: {error:#}");
        std::process::exit(1);
    }
}

fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Standalone(args) => standalone::run(args),
        Command::Broker(args) => cluster::broker(args),
        Command::Storage(args) => storage::run(args),
        Command::Proxy(args) => proxy::run(args),
        Command::Metadata(MetadataCommand::Init(args)) => cluster::init(args),
        Command::StorageNodes(command) => storage_nodes::run(command),
        Command::Perf(PerfCommand::Produce(args)) => perf::produce(args),
        Command::Perf(PerfCommand::Consume(args)) => perf::consume(args),
        Command::Perf(PerfCommand::E2e(args)) => perf::e2e(args),
        Command::Perf(PerfCommand::Storage(args)) => {
            let options = magnetar_perf::storage::StorageBenchOptions {
                dir: args.dir,
                appenders: args.appenders,
                entry_sizes: args.sizes,
                seconds_per_case: args.seconds,
                sync_mode: args.sync_mode,
                direct_io: !args.buffered_io,
                raw: !args.no_raw,
            };
            let report = magnetar_perf::storage::run(&options)?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            }
            Ok(())
        }
        Command::DiskProbe(args) => disk_probe(args),
        Command::Tokens(command) => tokens::run(command),
        Command::Debug(DebugCommand::CrashWriter { dir, appenders }) => {
            magnetar_perf::crash::run_writer(&dir, appenders)
        }
    }
}

/// Logs go to stderr. Colour codes only reach a terminal: a file, a pipe or a journal gets plain
/// text (and nobody gets colour with NO_COLOR set, https://no-color.org). The filter is
/// RUST_LOG, else the config's `[log] level`; the format the flag, else `[log] format`.
fn init_logging(flag: Option<LogFormat>, config: &config::LogSection) -> Result<(), String> {
    use std::io::IsTerminal;
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.is_empty() => {
            tracing_subscriber::EnvFilter::try_new(&directives)
                .map_err(|e| format!("RUST_LOG {directives:?}: {e}"))?
        }
        _ => tracing_subscriber::EnvFilter::try_new(&config.level)
            .map_err(|e| format!("[log] level {:?}: {e}", config.level))?,
    };
    let format = match (flag, config.format.as_str()) {
        (Some(format), _) => format,
        (None, "text") => LogFormat::Text,
        (None, "json") => LogFormat::Json,
        (None, other) => return Err(format!("[log] format {other:?}: expected text or json")),
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().with_current_span(false).init(),
        LogFormat::Text => {
            let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
            builder.with_ansi(std::io::stderr().is_terminal() && !no_color).init()
        }
    }
    Ok(())
}

pub(crate) async fn shutdown_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate())?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result?,
        _ = terminate.recv() => {}
    }
    Ok(())
}

fn disk_probe(args: DiskProbeArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.dir)?;
    let duration = Duration::from_secs_f64(args.seconds);
    if args.lockstep {
        let title = format!(
            "disk-probe --lockstep: p50 ms until all of a round's writes are durable (each \
             thread one O_DIRECT | O_DSYNC block per round), {:.1} s per cell, dir {}",
            args.seconds,
            args.dir.display()
        );
        return probe_table(&args, &title, |threads, kib| {
            let result = magnetar_perf::disk::probe_lockstep(&args.dir, threads, kib, duration)?;
            let shown = format!("{:.3}", result.round.p50_us as f64 / 1000.0);
            Ok((serde_json::to_value(result)?, shown))
        });
    }
    let mode = match (args.direct, args.no_sync) {
        (true, true) => "O_DIRECT, no fdatasync",
        (true, false) => "O_DIRECT + fdatasync per block",
        (false, true) => "buffered, no fdatasync",
        (false, false) => "buffered + fdatasync per block",
    };
    let title = format!(
        "disk-probe: MB/s ({mode}), {:.1} s per cell, dir {}",
        args.seconds,
        args.dir.display()
    );
    probe_table(&args, &title, |threads, kib| {
        let result = magnetar_perf::disk::probe(
            &args.dir,
            threads,
            kib,
            duration,
            args.direct,
            !args.no_sync,
        )?;
        let shown = format!("{:.1}", result.mb_per_s);
        Ok((serde_json::to_value(result)?, shown))
    })
}

/// Prints a disk-probe table, a row per thread count and a column per block size, of what
/// `cell` measured (as JSON) and shows (its cell's text); then the JSON if asked.
fn probe_table(
    args: &DiskProbeArgs,
    title: &str,
    mut cell: impl FnMut(usize, usize) -> anyhow::Result<(serde_json::Value, String)>,
) -> anyhow::Result<()> {
    use std::io::Write;
    println!("{title}");
    print!("{:>8}", "threads");
    for kib in &args.block_size {
        print!("{:>12}", format!("{kib} KiB"));
    }
    println!();
    let mut results = Vec::new();
    for &threads in &args.threads {
        print!("{threads:>8}");
        for &kib in &args.block_size {
            let (result, shown) = cell(threads, kib)?;
            print!("{shown:>12}");
            std::io::stdout().flush()?;
            results.push(result);
        }
        println!();
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    }
    Ok(())
}
