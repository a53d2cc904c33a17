//! BookKeeper's known replication bugs, replayed as fixed scenarios on the simulator (no
//! random faults: each scenario places its own). Each one ends with every invariant checked.

use magnetar_replication::meta::LedgerState;
use magnetar_sim::{Client, Knobs, Simulation};

const WRITER: Client = Client::Writer;
const RECOVERY: Client = Client::Recovery(0);

fn quiet(nodes: usize, write_quorum: u32, ack_quorum: u32) -> Simulation {
    Simulation::new(7, Knobs::quiet(nodes, write_quorum, ack_quorum))
}

fn ensemble(sim: &Simulation) -> Vec<usize> {
    sim.meta().0.last_fragment().ensemble.iter().map(|n| n.0 as usize).collect()
}

fn add_and_ack(sim: &mut Simulation, count: u64) {
    let target = sim.acked() + count;
    sim.writer_add_now(count);
    let deadline = sim.now() + 5_000;
    sim.run_until(|s| s.acked() >= target, deadline).expect("acknowledged");
}

/// bk#2614: recovery fenced only through its LAC reads and read entries without fencing. An
/// entry on a node fenced by the LAC read (stored just before) and on a node the LAC read did
/// not reach could be declared absent by that second node and one that lacks it, and then be
/// acknowledged by the old writer once its add reached the second node: an acknowledged entry
/// above the closed ledger. Recovery reads fence too, so the late add is refused.
#[test]
fn bk2614_an_entry_absent_to_recovery_is_never_acknowledged_afterwards() {
    let mut sim = quiet(3, 3, 2);
    let [a, b, c] = ensemble(&sim)[..] else { panic!("three nodes") };
    add_and_ack(&mut sim, 5);

    // Entry 5 reaches A; its adds to B and C wait on slow links.
    sim.hold_requests(WRITER, b);
    sim.hold_requests(WRITER, c);
    sim.writer_add_now(1);
    sim.run_for(20).unwrap();
    assert_eq!(sim.acked(), 5, "one copy is not Qa");

    // The recovery's LAC reads reach A and B only; its read of entry 5 never reaches A.
    sim.partition(RECOVERY, c);
    sim.start_recovery();
    sim.run_until(|s| s.is_fenced(a) && s.is_fenced(b), 1_000).unwrap();
    sim.heal(RECOVERY, c);
    sim.hold_requests(RECOVERY, a);
    sim.run_until(|s| !s.recovery_running(0), 5_000).unwrap();
    assert_eq!(sim.meta().0.state, LedgerState::Closed);
    assert_eq!(sim.meta().0.last_entry_id, Some(4), "B and C lack entry 5");
    assert!(sim.is_fenced(c), "the read of entry 5 fenced C");

    // The old writer's add of entry 5 now reaches C: refused, so entry 5 is never acknowledged.
    sim.release_requests(WRITER, b);
    sim.release_requests(WRITER, c);
    sim.run_for(2_000).unwrap();
    assert_eq!(sim.acked(), 5);
    assert!(sim.writer_outcome().is_some_and(|o| o.is_err()), "the old writer is fenced");
    sim.check("end").unwrap();
}

/// bk#1591: with a delayed ensemble change, entries were acknowledged with acks from the
/// replacement before the new ensemble was stored; a recovery reading the stored ensemble
/// could then miss them. Here nothing is acknowledged while the change is being recorded, and
/// the change's metadata write is lost with the writer.
#[test]
fn bk1591_nothing_is_acknowledged_while_an_ensemble_change_is_unrecorded() {
    let mut sim = quiet(4, 3, 2);
    let members = ensemble(&sim);
    let (x, y, z) = (members[0], members[1], members[2]);
    add_and_ack(&mut sim, 5);

    sim.hold_meta();
    sim.crash_node(x);
    sim.hold_requests(WRITER, y);
    sim.writer_add_now(3);
    // X times out, the change is asked for (held); Z alone answers.
    sim.run_for(1_000).unwrap();
    assert_eq!(sim.acked(), 5, "no acknowledgement while the change is unrecorded");
    assert_eq!(sim.meta().0.fragments.len(), 1);

    // The writer dies; its change never reaches the store.
    sim.crash_writer();
    sim.release_meta(true);
    sim.hold_requests(RECOVERY, z);
    sim.restart_node(x);
    sim.start_recovery();
    sim.run_until(|s| !s.recovery_running(0), 10_000).unwrap();
    sim.release_requests(RECOVERY, z);
    assert_eq!(sim.meta().0.state, LedgerState::Closed);
    assert!(sim.meta().0.last_entry_id >= Some(4));
    sim.check("end").unwrap();
}

/// bk#4651: an ensemble change recorded acknowledged entries under an ensemble that did not
/// hold them. Two changes in a row (two nodes fail one after the other while entries keep
/// coming): every fragment starts right after the entries acknowledged under the previous
/// ensemble, and every acknowledged entry is durable on Qa nodes of its recorded ensemble.
#[test]
fn bk4651_each_fragment_starts_after_what_the_previous_ensemble_acknowledged() {
    let mut sim = quiet(5, 3, 2);
    let members = ensemble(&sim);
    add_and_ack(&mut sim, 10);
    sim.crash_node(members[0]);
    add_and_ack(&mut sim, 10);
    let first_change = sim.meta().0.fragments.clone();
    assert_eq!(first_change.len(), 2, "{first_change:?}");
    assert_eq!(first_change[1].first_entry, 10, "the change starts right after LAC 9");
    sim.check("after the first change").unwrap();

    sim.crash_node(members[1]);
    add_and_ack(&mut sim, 10);
    let second_change = sim.meta().0.fragments.clone();
    assert_eq!(second_change.len(), 3, "{second_change:?}");
    assert_eq!(second_change[2].first_entry, 20);
    let id = |n: usize| magnetar_replication::NodeId(n as u64);
    assert!(!second_change[1].ensemble.contains(&id(members[0])), "{second_change:?}");
    assert!(!second_change[2].ensemble.contains(&id(members[1])), "{second_change:?}");
    sim.writer_close();
    sim.run_until(|s| s.meta().0.state == LedgerState::Closed, sim.now() + 5_000).unwrap();
    assert_eq!(sim.meta().0.last_entry_id, Some(29));
    sim.check("end").unwrap();
}

/// bk#2615: a recovery that had to replace a node while writing entries back recorded an
/// invalid ensemble. The replacement here is a node outside the ensemble, the fragment starts
/// at the entry being written back, and the closed metadata is valid (the store checks every
/// stored successor).
#[test]
fn bk2615_a_node_replaced_during_recovery_gives_a_valid_ensemble() {
    let mut sim = quiet(3, 2, 2);
    let members = ensemble(&sim);
    let b = members[1];
    let spare = (0..3).find(|n| !members.contains(n)).expect("a spare node");
    add_and_ack(&mut sim, 3);

    // Three more entries reach A only; the writer dies.
    sim.hold_requests(WRITER, b);
    sim.writer_add_now(3);
    sim.run_for(20).unwrap();
    sim.crash_writer();

    // The recovery never hears from B: its fencing LAC read is covered by A alone
    // (Qw - Qa + 1 = 1), and B fails the write-back of entry 3, so it is replaced.
    sim.hold_requests(RECOVERY, b);
    sim.start_recovery();
    sim.run_until(|s| !s.recovery_running(0), 10_000).unwrap();

    let (meta, _) = sim.meta();
    assert_eq!(meta.state, LedgerState::Closed);
    assert_eq!(meta.last_entry_id, Some(5), "every entry A holds is recovered");
    let last = meta.last_fragment();
    assert_eq!(last.first_entry, 3, "{meta:?}");
    assert!(last.ensemble.contains(&magnetar_replication::NodeId(spare as u64)), "{meta:?}");
    meta.validate().unwrap();
    sim.check("end").unwrap();
}

/// A recovery while the writer still writes: the writer is fenced, and the closed ledger holds
/// everything it acknowledged.
#[test]
fn a_recovery_fences_a_live_writer() {
    let mut sim = quiet(3, 3, 2);
    add_and_ack(&mut sim, 20);
    sim.writer_add_now(10);
    sim.start_recovery();
    sim.writer_add_now(10);
    sim.run_until(|s| !s.recovery_running(0), 10_000).unwrap();
    sim.writer_add_now(1);
    sim.run_for(1_000).unwrap();
    assert!(sim.writer_outcome().is_some_and(|o| o.is_err()), "fenced");
    let last = sim.meta().0.last_entry_id.expect("entries");
    assert!(last + 1 >= sim.acked(), "closed at {last}, {} acknowledged", sim.acked());
    sim.check("end").unwrap();
}

/// A writer with 200 entries acknowledged but no LAC sent yet dies: recovery finds all 200
/// above the LAC. With a window of entries in progress it takes a few round trips, not 200
/// reads and durable write-backs one after the other (seconds under load, found on real
/// processes: a broker's failover waited 2.3 s for one such ledger).
#[test]
fn a_writer_s_whole_pipeline_is_recovered_a_window_at_a_time() {
    let recover = |window: usize| {
        let mut knobs = Knobs::quiet(2, 2, 2);
        knobs.recovery.window = window;
        let mut sim = Simulation::new(11, knobs);
        add_and_ack(&mut sim, 200);
        sim.crash_writer(); // before its explicit LAC: the nodes' LAC is what the adds carried
        let started = sim.now();
        sim.start_recovery();
        sim.run_until(|s| !s.recovery_running(0), 60_000).unwrap();
        assert_eq!(sim.meta().0.state, LedgerState::Closed);
        assert_eq!(sim.meta().0.last_entry_id, Some(199), "every acknowledged entry is kept");
        sim.check("end").unwrap();
        sim.now() - started
    };
    let one_at_a_time = recover(1);
    let windowed = recover(64);
    println!("recovery of 200 entries: {one_at_a_time} ms one at a time, {windowed} ms windowed");
    assert!(
        windowed * 10 < one_at_a_time,
        "a window of 64 took {windowed} ms, one at a time {one_at_a_time} ms"
    );
}

/// A node of the ensemble fails while the only other node is down too: no replacement. The
/// writer waits for one (`replacement_wait_ms`) instead of failing its adds at once, and when
/// the spare is back it changes the ensemble and acknowledges them. Without the wait, the same
/// adds fail (what a broker saw when a spare registered ~20 ms after a node filled up: 1,000
/// to 2,500 failed sends, which clients had to resend).
#[test]
fn a_writer_waits_for_a_replacement_node_to_come_up() {
    let run = |wait_ms: u64| {
        let mut knobs = Knobs::quiet(3, 2, 2);
        knobs.writer.replacement_wait_ms = wait_ms;
        knobs.node_down_ms = (600, 600);
        let mut sim = Simulation::new(5, knobs);
        let members = ensemble(&sim);
        let spare = (0..3).find(|n| !members.contains(n)).expect("a spare node");
        add_and_ack(&mut sim, 3);
        sim.crash_node(spare); // back in 600 ms
        sim.crash_node(members[0]); // found failed by the add time-out (200 ms) at the latest
        sim.writer_add_now(5);
        sim.run_for(2_000).unwrap();
        (sim.acked(), sim.writer_outcome(), ensemble(&sim).contains(&spare))
    };
    let (acked, outcome, spare_in) = run(1_000);
    assert_eq!(acked, 8, "the adds wait for the spare and are acknowledged: {outcome:?}");
    assert!(outcome.is_none(), "the writer goes on: {outcome:?}");
    assert!(spare_in, "the spare replaced the failed node");
    let (acked, outcome, _) = run(0);
    assert_eq!(acked, 3, "without the wait the adds fail");
    assert!(
        matches!(outcome, Some(Err(magnetar_replication::writer::WriteError::NotEnoughNodes))),
        "{outcome:?}"
    );
}

/// An old writer that wakes up after its ledger was recovered, closed and deleted (a broker
/// frozen for longer than the ledger lived): the nodes collected the ledger but kept its fence,
/// also across a restart, so its adds are refused and nothing is acknowledged above the
/// closed length. (A node that forgot the fence with the entries would store the adds: the
/// disk model reports a normal add stored after a fence as a violation.)
#[test]
fn a_writer_back_after_its_ledger_was_recovered_and_deleted_is_refused() {
    let mut sim = quiet(3, 3, 2);
    let nodes = ensemble(&sim);
    add_and_ack(&mut sim, 5);

    // The writer freezes with entry 5 on its way to every node.
    for &node in &nodes {
        sim.hold_requests(WRITER, node);
    }
    sim.writer_add_now(1);
    sim.start_recovery();
    sim.run_until(|s| !s.recovery_running(0), 5_000).unwrap();
    assert_eq!(sim.meta().0.state, LedgerState::Closed);
    assert_eq!(sim.meta().0.last_entry_id, Some(4));
    assert!(nodes.iter().all(|&n| sim.is_fenced(n)), "the recovery fenced every node");

    sim.delete_ledger();
    sim.crash_node(nodes[0]);
    sim.restart_node(nodes[0]);
    assert!(nodes.iter().all(|&n| sim.is_fenced(n)), "the fences outlive the ledger");

    // The writer wakes up: its adds reach the nodes and are refused.
    for &node in &nodes {
        sim.release_requests(WRITER, node);
    }
    sim.run_for(2_000).unwrap();
    assert_eq!(sim.acked(), 5);
    assert!(sim.writer_outcome().is_some_and(|o| o.is_err()), "the old writer is fenced");
    assert!(sim.violation().is_none(), "{:?}", sim.violation());
    sim.check("end").unwrap();
}
