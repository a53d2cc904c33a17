//! Deterministic simulation of replicated ledgers (issue 15's proof).
//!
//! One seed drives everything: the knobs of the run ([`Knobs::random`]), message latencies
//! (so reordering), drops, duplicates, partitions, node crashes that lose or keep unsynced
//! records, disk faults, metadata writes whose outcome is unknown, a writer that crashes and
//! recoveries that run while it still writes. The cores are the real ones from
//! `magnetar-replication`; only the network, the disks, the metadata store and time are
//! simulated. After every step that can break one, the invariants are checked
//! ([`Simulation::check`]); a failing seed prints its number and reproduces exactly:
//! `cargo run -p magnetar-sim --release --example replication -- --seed N --trace`.

mod disk;
mod rng;
mod sim;

pub use disk::Disk;
pub use rng::Rng;
pub use sim::{Client, Knobs, Outcome, Simulation};

/// Runs one randomized seed to its end and checks the end state. `Err` names the seed and
/// the violated invariant, or the assertion a core failed (a panic is caught: the seed that
/// found it must still be printed).
pub fn run_seed(seed: u64) -> Result<Outcome, String> {
    let run = std::panic::catch_unwind(|| {
        let knobs = Knobs::random(&mut Rng::new(seed));
        Simulation::new(seed, knobs).run_workload()
    });
    match run {
        Ok(result) => result.map_err(|why| format!("seed {seed}: {why}")),
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("(no message)");
            Err(format!("seed {seed}: panicked: {message}"))
        }
    }
}
