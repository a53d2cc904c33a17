//! Runs the replicated-ledger simulation over many seeds, or one seed with its event trace.
//!
//! ```text
//! cargo run -p magnetar-sim --release --example replication -- --seeds 1000000
//! cargo run -p magnetar-sim --release --example replication -- --first 5000 --seeds 100
//! cargo run -p magnetar-sim --release --example replication -- --seed 1234 --trace
//! ```
//! Exits 1 at the first failing seed, printing it; `--keep-going` lists every failing seed.

use magnetar_sim::{run_seed, Knobs, Rng, Simulation};
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| -> Option<u64> {
        let at = args.iter().position(|a| a == flag)?;
        let text = args.get(at + 1).unwrap_or_else(|| panic!("{flag} needs a number"));
        Some(text.parse().unwrap_or_else(|_| panic!("{flag} needs a number, not {text}")))
    };
    if let Some(seed) = value("--seed") {
        let knobs = Knobs::random(&mut Rng::new(seed));
        println!("seed {seed}: {knobs:#?}");
        let mut sim = Simulation::new(seed, knobs);
        if args.iter().any(|a| a == "--trace") {
            sim.enable_trace();
        }
        let result = sim.run_workload();
        for line in sim.trace() {
            println!("{line}");
        }
        return match result {
            Ok(outcome) => {
                println!("seed {seed}: ok {outcome:?}");
                ExitCode::SUCCESS
            }
            Err(why) => {
                println!("seed {seed}: FAILED: {why}");
                ExitCode::FAILURE
            }
        };
    }
    let first = value("--first").unwrap_or(0);
    let seeds = value("--seeds").unwrap_or(10_000);
    let keep_going = args.iter().any(|a| a == "--keep-going");
    let (mut failed, mut acked, mut events) = (0u64, 0u64, 0u64);
    for seed in first..first + seeds {
        match run_seed(seed) {
            Ok(outcome) => {
                acked += outcome.acked;
                events += outcome.events;
            }
            Err(why) => {
                failed += 1;
                println!("FAILED {why}");
                if !keep_going {
                    println!("reproduce: cargo run -p magnetar-sim --release --example replication -- --seed {seed} --trace");
                    return ExitCode::FAILURE;
                }
            }
        }
        if (seed - first + 1) % 10_000 == 0 {
            println!(
                "{} seeds, {failed} failed, {acked} entries acknowledged, {events} events",
                seed - first + 1
            );
        }
    }
    println!("{seeds} seeds from {first}: {failed} failed, {acked} entries acknowledged, {events} events");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
