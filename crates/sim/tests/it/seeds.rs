//! Thousands of randomized runs (each seed draws its own knobs and faults); any failure names
//! its seed, which replays exactly with
//! `cargo run -p magnetar-sim --release --example replication -- --seed N --trace`.
//! `MAGNETAR_SIM_SEEDS` sets how many (default 3,000; CI's release build runs them in seconds).

use magnetar_sim::run_seed;

#[test]
fn randomized_seeds_keep_every_invariant() {
    let seeds: u64 =
        std::env::var("MAGNETAR_SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(3_000);
    let mut acked = 0;
    let mut changed_ensembles = 0;
    let mut rereplicated = 0;
    for seed in 0..seeds {
        let outcome = run_seed(seed).unwrap_or_else(|why| {
            panic!("{why}\nreproduce: cargo run -p magnetar-sim --release --example replication -- --seed {seed} --trace")
        });
        acked += outcome.acked;
        changed_ensembles += u64::from(outcome.fragments > 1);
        rereplicated += u64::from(outcome.rereplicated);
    }
    eprintln!(
        "{seeds} runs: {acked} entries acknowledged, {changed_ensembles} changed ensembles, \
         {rereplicated} re-replicated a node lost for good"
    );
    // The runs did something: entries were acknowledged and ensembles changed.
    assert!(acked > seeds * 10, "{acked} entries acknowledged in {seeds} runs");
    assert!(changed_ensembles > seeds / 20, "{changed_ensembles} runs changed ensembles");
    // A node lost for good at the end of a run with a node to spare: its copies re-replicated,
    // every entry back on Qw nodes.
    assert!(rereplicated > seeds / 10, "{rereplicated} runs re-replicated a lost node");
}

#[test]
fn a_seed_replays_exactly() {
    for seed in [1, 42, 977] {
        assert_eq!(run_seed(seed), run_seed(seed));
    }
}
