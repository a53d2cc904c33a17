//! Crash test of the storage engine: a child process appends and reports each acknowledged
//! entry; we SIGKILL it at a random moment (counted in acknowledgements, so no sleeps), restart
//! it on the same directory, and check that every acknowledged entry is readable and
//! byte-identical, that entry ids are dense, and that acknowledged deletes stay deleted.

use magnetar_ledger::{LedgerError, LedgerStore};
use magnetar_perf::crash::{config, payload};
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const ROUNDS: usize = 24;
const LINE_WAIT: Duration = Duration::from_secs(30);

#[test]
fn sigkill_at_random_moments_never_loses_an_acknowledged_entry() {
    let seed: u64 =
        std::env::var("CRASH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    println!("crash test seed {seed} (rerun with CRASH_SEED={seed})");
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let mut acked: BTreeMap<u64, u64> = BTreeMap::new(); // ledger -> acknowledged entry count
                                                         // Deletes announced but not yet confirmed: after a kill the ledger may or may not be there.
    let mut deleting: BTreeSet<u64> = BTreeSet::new();
    let mut deleted: BTreeSet<u64> = BTreeSet::new();
    let mut total_acks = 0u64;
    for round in 0..ROUNDS {
        let kill_after = rng.gen_range(1..2500u64);
        let mut child = Command::new(env!("CARGO_BIN_EXE_magnetar"))
            .args(["debug", "crash-writer", "--dir"])
            .arg(dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the writer");
        let stdout = child.stdout.take().unwrap();
        let (lines_tx, lines_rx) = mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if lines_tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut seen = 0u64;
        let record = |line: &str,
                      acked: &mut BTreeMap<u64, u64>,
                      deleting: &mut BTreeSet<u64>,
                      deleted: &mut BTreeSet<u64>| {
            let parts: Vec<&str> = line.split_whitespace().collect();
            match parts.as_slice() {
                ["ACK", ledger, entry] => {
                    let (ledger, entry): (u64, u64) =
                        (ledger.parse().unwrap(), entry.parse().unwrap());
                    let count = acked.entry(ledger).or_insert(0);
                    *count = (*count).max(entry + 1);
                    1
                }
                ["DELETING", ledger] => {
                    deleting.insert(ledger.parse().unwrap());
                    0
                }
                ["DEL", ledger] => {
                    let ledger: u64 = ledger.parse().unwrap();
                    acked.remove(&ledger);
                    deleting.remove(&ledger);
                    deleted.insert(ledger);
                    0
                }
                ["READY"] => 0,
                other => panic!("unexpected line from writer: {other:?}"),
            }
        };
        while seen < kill_after {
            let line = lines_rx.recv_timeout(LINE_WAIT).expect("writer makes progress");
            seen += record(&line, &mut acked, &mut deleting, &mut deleted);
        }
        // SAFETY: plain syscall on a child we own.
        let killed = unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        assert_eq!(killed, 0);
        child.wait().unwrap();
        reader.join().unwrap();
        // Lines printed before death are acknowledgements too.
        while let Ok(line) = lines_rx.try_recv() {
            seen += record(&line, &mut acked, &mut deleting, &mut deleted);
        }
        total_acks += seen;
        let (store, report) = LedgerStore::open(config(dir.path())).expect("reopen after kill");
        // An announced delete that became durable before the kill: the ledger must stay gone.
        let mut unconfirmed_deletes_done = 0;
        for &ledger in &deleting {
            if matches!(store.ledger_info(ledger), Err(LedgerError::NoSuchLedger(_))) {
                acked.remove(&ledger);
                deleted.insert(ledger);
                unconfirmed_deletes_done += 1;
            }
        }
        deleting.retain(|ledger| !deleted.contains(ledger));
        for (&ledger, &count) in &acked {
            let info = store
                .ledger_info(ledger)
                .unwrap_or_else(|e| {
                    panic!("round {round} seed {seed}: ledger {ledger} ({count} entries acknowledged): {e}")
                });
            assert!(
                info.entries >= count,
                "round {round} seed {seed}: ledger {ledger} has {} entries, {count} acknowledged",
                info.entries
            );
            // Dense: every id below the count reads back, byte-identical.
            let entries = store.read_range(ledger, 0, info.entries - 1).unwrap();
            for (entry, data) in entries.iter().enumerate() {
                assert_eq!(
                    data,
                    &payload(ledger, entry as u64),
                    "round {round} seed {seed}: {ledger}/{entry}"
                );
            }
        }
        for ledger in &deleted {
            assert!(
                store.ledger_info(*ledger).is_err(),
                "round {round}: deleted ledger {ledger} came back"
            );
        }
        println!(
            "round {round}: killed after {seen} acks; {} ledgers checked; {unconfirmed_deletes_done} \
             unconfirmed deletes found done; journal discarded {} torn bytes",
            acked.len(),
            report.journal.discarded_bytes
        );
        drop(store);
    }
    assert!(total_acks > ROUNDS as u64, "the writer acknowledged entries");
}
