//! The simulation: an event queue in virtual time, the actors (storage nodes, one writer,
//! recoveries), the network between them, the metadata store, and the invariant checks.

use crate::disk::Disk;
use crate::rng::Rng;
use bytes::Bytes;
use magnetar_autorecovery::{plan, CopyAction, FragmentCopy, Plan, PlanError};
use magnetar_model::storage_nodes::IsolationGroups;
use magnetar_replication::message::{Request, RequestId, Response};
use magnetar_replication::meta::{LedgerMeta, LedgerState};
use magnetar_replication::node::{NodeAction, NodeCore};
use magnetar_replication::placement::{allowed, choose_ensemble};
use magnetar_replication::recovery::{Recovery, RecoveryAction, RecoveryConfig};
use magnetar_replication::writer::{WriteError, Writer, WriterAction, WriterConfig};
use magnetar_replication::{EntryId, LedgerId, MetaWrite, NodeId, NodeInfo};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

const LEDGER: LedgerId = 1;
const TICK_MS: u64 = 50;
/// How long a re-replication copy waits for an answer before it asks again.
const COPY_TIMEOUT_MS: u64 = 500;

/// Who talks to the nodes: the writer, recovery number `k`, or the re-replication that runs
/// after a node is lost for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Client {
    Writer,
    Recovery(usize),
    Rereplication,
}

/// The peer number of [`Client::Rereplication`] (recoveries count up from 1).
const REREPLICATION_PEER: u64 = 1 << 32;

impl Client {
    fn peer(self) -> u64 {
        match self {
            Client::Writer => 0,
            Client::Recovery(k) => k as u64 + 1,
            Client::Rereplication => REREPLICATION_PEER,
        }
    }

    fn from_peer(peer: u64) -> Client {
        match peer {
            0 => Client::Writer,
            REREPLICATION_PEER => Client::Rereplication,
            k => Client::Recovery(k as usize - 1),
        }
    }
}

/// The copies of a lost node's fragments under way (`magnetar-autorecovery`'s plan and copies).
struct Rereplication {
    plan: Plan,
    copies: Vec<FragmentCopy>,
    /// Request id -> (copy, entry, whether it is an add, the node asked).
    requests: BTreeMap<RequestId, (usize, EntryId, bool, NodeId)>,
    next_request: u64,
    failed: Option<String>,
    /// The metadata write's outcome, once answered.
    written: Option<MetaWrite>,
}

/// The run's shape and fault rates; [`Knobs::random`] draws them from the seed.
#[derive(Debug, Clone)]
pub struct Knobs {
    pub nodes: usize,
    pub write_quorum: u32,
    pub ack_quorum: u32,
    /// Entries the writer adds, at most `window` unacknowledged at a time.
    pub entries: u64,
    pub window: usize,
    pub latency_ms: (u64, u64),
    pub fsync_ms: (u64, u64),
    pub meta_latency_ms: (u64, u64),
    pub drop_per_mille: u32,
    pub duplicate_per_mille: u32,
    /// Metadata writes whose answer is lost (applied or not).
    pub meta_unknown_per_mille: u32,
    /// Per append: the disk fails (the node crashes and restarts).
    pub disk_fault_per_mille: u32,
    /// Mean time between random node crashes; `None`: none.
    pub node_crash_every_ms: Option<u64>,
    pub node_down_ms: (u64, u64),
    /// Mean time between random partitions of a client from a node.
    pub partition_every_ms: Option<u64>,
    pub partition_ms: (u64, u64),
    pub writer_crash_at_ms: Option<u64>,
    /// Recoveries started at these times, whether the writer is alive or not.
    pub recoveries_at_ms: Vec<u64>,
    /// Rack labels (node i gets `racks[i % len]`); empty: none.
    pub racks: Vec<String>,
    /// Node groups (node i gets `groups[i % len]`); empty: none.
    pub groups: Vec<String>,
    /// The ledger's bookie affinity over `groups`: no fragment may name a node of another
    /// group (checked with the other invariants).
    pub isolation: Option<IsolationGroups>,
    /// The ledger is deleted this long after it is closed (by its writer or a recovery), and
    /// the nodes collect it while the run goes on: an old writer still sending must stay
    /// refused. `None`: never deleted.
    pub delete_after_close_ms: Option<u64>,
    pub writer: WriterConfig,
    pub recovery: RecoveryConfig,
}

impl Knobs {
    /// No faults: scenarios inject their own.
    pub fn quiet(nodes: usize, write_quorum: u32, ack_quorum: u32) -> Knobs {
        Knobs {
            nodes,
            write_quorum,
            ack_quorum,
            entries: 0,
            window: 1_000,
            latency_ms: (1, 3),
            fsync_ms: (1, 2),
            meta_latency_ms: (1, 3),
            drop_per_mille: 0,
            duplicate_per_mille: 0,
            meta_unknown_per_mille: 0,
            disk_fault_per_mille: 0,
            node_crash_every_ms: None,
            node_down_ms: (100, 300),
            partition_every_ms: None,
            partition_ms: (50, 400),
            writer_crash_at_ms: None,
            recoveries_at_ms: Vec::new(),
            racks: Vec::new(),
            groups: Vec::new(),
            isolation: None,
            delete_after_close_ms: None,
            writer: WriterConfig {
                add_timeout_ms: 200,
                explicit_lac_after_ms: 100,
                replacement_wait_ms: 0,
            },
            recovery: RecoveryConfig { retry_ms: 200, window: 64 },
        }
    }

    /// A run drawn from the seed, FoundationDB-style: every knob randomized, so small windows,
    /// short timeouts and fault storms all get their turn.
    pub fn random(rng: &mut Rng) -> Knobs {
        let write_quorum = rng.range(1, 3) as u32;
        let ack_quorum = rng.range(1, u64::from(write_quorum)) as u32;
        let nodes =
            write_quorum as usize + if rng.chance(100) { 0 } else { rng.range(1, 2) as usize };
        let run_ms = rng.range(200, 2_000);
        let mut knobs = Knobs::quiet(nodes, write_quorum, ack_quorum);
        knobs.entries = rng.range(1, 200);
        knobs.window = rng.range(1, 64) as usize;
        knobs.latency_ms = (rng.range(0, 2), rng.range(2, 30));
        knobs.fsync_ms = (rng.range(0, 1), rng.range(1, 10));
        knobs.meta_latency_ms = (rng.range(1, 3), rng.range(3, 40));
        knobs.drop_per_mille = if rng.chance(500) { rng.range(0, 50) as u32 } else { 0 };
        knobs.duplicate_per_mille = if rng.chance(300) { rng.range(0, 50) as u32 } else { 0 };
        knobs.meta_unknown_per_mille = if rng.chance(300) { rng.range(0, 200) as u32 } else { 0 };
        knobs.disk_fault_per_mille = if rng.chance(200) { rng.range(0, 10) as u32 } else { 0 };
        knobs.node_crash_every_ms = rng.chance(600).then(|| rng.range(30, 600));
        knobs.node_down_ms = (rng.range(10, 100), rng.range(100, 1_000));
        knobs.partition_every_ms = rng.chance(400).then(|| rng.range(30, 600));
        knobs.writer_crash_at_ms = rng.chance(400).then(|| rng.range(0, run_ms));
        let recoveries = if rng.chance(500) { rng.range(1, 3) } else { 0 };
        knobs.recoveries_at_ms = (0..recoveries).map(|_| rng.range(0, run_ms)).collect();
        if rng.chance(300) {
            knobs.racks = vec!["a".into(), "b".into()];
        }
        knobs.writer.add_timeout_ms = rng.range(20, 500);
        knobs.writer.explicit_lac_after_ms = rng.range(10, 300);
        knobs.recovery.retry_ms = rng.range(20, 500);
        knobs.recovery.window = if rng.chance(300) { 1 } else { rng.range(2, 64) as usize };
        knobs.writer.replacement_wait_ms = if rng.chance(500) { 0 } else { rng.range(1, 1_000) };
        knobs.delete_after_close_ms = rng.chance(300).then(|| rng.range(0, 300));
        // Drawn last, so that the knobs above stay what each seed drew before groups existed.
        if rng.chance(300) {
            // Primary, secondary and another group's nodes, in turn; the ledger keeps to the
            // first two (when they are enough for its first ensemble).
            let layout = ["p", "s", "x"];
            let kept = (0..nodes).filter(|i| i % 3 != 2).count();
            if kept >= write_quorum as usize {
                knobs.groups = layout.iter().map(|g| g.to_string()).collect();
                knobs.isolation = IsolationGroups::parse("p", Some("s"));
            }
        }
        knobs
    }
}

/// What a finished run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub acked: u64,
    pub last_entry: Option<EntryId>,
    pub fragments: usize,
    /// A node was lost for good at the end and its copies re-replicated (Qw copies checked).
    pub rereplicated: bool,
    pub events: u64,
    pub virtual_ms: u64,
}

#[derive(Debug)]
enum Event {
    ToNode { node: usize, incarnation: u64, from: Client, request: RequestId, body: Request },
    ToClient { client: Client, node: usize, request: RequestId, body: Response },
    Sync { node: usize, incarnation: u64 },
    NodeRestart { node: usize },
    ConnectionReset { client: Client, node: usize },
    Heal { client: Client, node: usize },
    Tick { client: Client },
    WriterAdd,
    WriterCrash,
    StartRecovery,
    DeleteLedger,
    RandomCrash,
    RandomPartition,
    MetaApply { client: Client, op: MetaOp },
    MetaReply { client: Client, reply: MetaReply },
}

#[derive(Debug)]
enum MetaOp {
    Write { meta: LedgerMeta, expected: u64 },
    Read,
}

#[derive(Debug)]
enum MetaReply {
    Written(MetaWrite),
    Read(LedgerMeta, u64),
}

#[derive(Debug)]
struct SimNode {
    core: Option<NodeCore>,
    disk: Disk,
    incarnation: u64,
    sync_scheduled: bool,
    info: NodeInfo,
}

pub struct Simulation {
    pub seed: u64,
    pub knobs: Knobs,
    rng: Rng,
    now: u64,
    sequence: u64,
    events: u64,
    queue: BinaryHeap<Reverse<(u64, u64, usize)>>,
    slots: Vec<Option<Event>>,
    free_slots: Vec<usize>,
    nodes: Vec<SimNode>,
    writer: Option<Writer>,
    writer_added: u64,
    writer_crashed: bool,
    /// The highest LAC the writer has had (it must never go back).
    writer_lac: Option<EntryId>,
    recoveries: Vec<Option<Recovery>>,
    meta: LedgerMeta,
    meta_version: u64,
    held_meta: Option<Vec<(Client, MetaOp)>>,
    partitions: BTreeSet<(Client, usize)>,
    /// Requests from a client to a node kept back (not lost) until released.
    held_requests: BTreeMap<(Client, usize), Vec<(RequestId, Request)>>,
    faults: bool,
    acked: BTreeMap<EntryId, Bytes>,
    writer_outcome: Option<Result<Option<EntryId>, WriteError>>,
    recovered: Vec<Option<EntryId>>,
    /// The ledger was deleted and collected by the nodes: its entries are gone on purpose.
    deleted: bool,
    delete_scheduled: bool,
    violation: Option<String>,
    trace: Option<Vec<String>>,
    rereplication: Option<Rereplication>,
}

impl Simulation {
    pub fn new(seed: u64, knobs: Knobs) -> Simulation {
        assert!(knobs.nodes >= knobs.write_quorum as usize);
        let mut rng = Rng::new(seed.wrapping_add(1));
        let nodes: Vec<SimNode> = (0..knobs.nodes)
            .map(|i| SimNode {
                core: Some(NodeCore::new()),
                disk: Disk::default(),
                incarnation: 0,
                sync_scheduled: false,
                info: NodeInfo {
                    id: NodeId(i as u64),
                    free_bytes: rng.range(1, 1_000),
                    rack: (!knobs.racks.is_empty())
                        .then(|| knobs.racks[i % knobs.racks.len()].clone()),
                    group: (!knobs.groups.is_empty())
                        .then(|| knobs.groups[i % knobs.groups.len()].clone()),
                    read_only: false,
                },
            })
            .collect();
        let live: Vec<NodeInfo> = nodes.iter().map(|n| n.info.clone()).collect();
        let size = knobs.write_quorum as usize;
        let ensemble = choose_ensemble(&allowed(&live, knobs.isolation.as_ref(), size), size)
            .expect("enough nodes");
        let meta = LedgerMeta::new(ensemble, knobs.write_quorum, knobs.ack_quorum)
            .with_isolation(knobs.isolation.clone());
        let mut writer = Writer::new(LEDGER, meta.clone(), 1, knobs.writer.clone());
        writer.set_live_nodes(live);
        let mut sim = Simulation {
            seed,
            rng,
            now: 0,
            sequence: 0,
            events: 0,
            queue: BinaryHeap::new(),
            slots: Vec::new(),
            free_slots: Vec::new(),
            nodes,
            writer: Some(writer),
            writer_added: 0,
            writer_crashed: false,
            writer_lac: None,
            recoveries: Vec::new(),
            meta,
            meta_version: 1,
            held_meta: None,
            partitions: BTreeSet::new(),
            held_requests: BTreeMap::new(),
            faults: true,
            acked: BTreeMap::new(),
            writer_outcome: None,
            recovered: Vec::new(),
            deleted: false,
            delete_scheduled: false,
            violation: None,
            trace: None,
            rereplication: None,
            knobs,
        };
        sim.schedule(TICK_MS, Event::Tick { client: Client::Writer });
        sim
    }

    /// Keeps a line per event (for `--trace`).
    pub fn enable_trace(&mut self) {
        self.trace = Some(Vec::new());
    }

    pub fn trace(&self) -> &[String] {
        self.trace.as_deref().unwrap_or(&[])
    }

    pub fn now(&self) -> u64 {
        self.now
    }

    pub fn meta(&self) -> (&LedgerMeta, u64) {
        (&self.meta, self.meta_version)
    }

    pub fn acked(&self) -> u64 {
        self.acked.len() as u64
    }

    pub fn writer_outcome(&self) -> Option<Result<Option<EntryId>, WriteError>> {
        self.writer_outcome
    }

    pub fn violation(&self) -> Option<&str> {
        self.violation.as_deref()
    }

    /// The bytes the writer gives entry `e` (recoveries copy them; any other bytes at `e` are
    /// a second value at one position).
    pub fn expected_data(&self, entry: EntryId) -> Bytes {
        Bytes::from(format!("{}:{entry}", self.seed))
    }

    fn schedule(&mut self, delay_ms: u64, event: Event) {
        let slot = match self.free_slots.pop() {
            Some(slot) => {
                self.slots[slot] = Some(event);
                slot
            }
            None => {
                self.slots.push(Some(event));
                self.slots.len() - 1
            }
        };
        self.sequence += 1;
        self.queue.push(Reverse((self.now + delay_ms, self.sequence, slot)));
    }

    fn violate(&mut self, why: String) {
        if self.violation.is_none() {
            self.violation = Some(format!("at {} ms: {why}", self.now));
        }
    }

    // ------------------------------------------------------------------ the run

    /// The randomized workload: writes, faults, crashes and recoveries as the knobs say, then
    /// a quiet end (faults off, nodes restarted, the ledger closed by its writer or a last
    /// recovery) and the end-state checks.
    pub fn run_workload(&mut self) -> Result<Outcome, String> {
        self.schedule(0, Event::WriterAdd);
        if let Some(at) = self.knobs.writer_crash_at_ms {
            self.schedule(at, Event::WriterCrash);
        }
        for at in self.knobs.recoveries_at_ms.clone() {
            self.schedule(at, Event::StartRecovery);
        }
        if let Some(every) = self.knobs.node_crash_every_ms {
            let first = self.rng.range(0, every * 2);
            self.schedule(first, Event::RandomCrash);
        }
        if let Some(every) = self.knobs.partition_every_ms {
            let first = self.rng.range(0, every * 2);
            self.schedule(first, Event::RandomPartition);
        }
        // With faults going on, progress is not owed: past this point the faults stop, and
        // from then on the ledger must close within a bound (`finish`).
        let busy_until = 5_000 + self.knobs.entries * 20;
        match self.run_until(|sim| sim.workload_done(), busy_until) {
            Ok(()) => {}
            Err(_) if self.violation.is_none() => {}
            Err(why) => return Err(why),
        }
        self.finish()
    }

    fn workload_done(&self) -> bool {
        let writer_done = self.writer.as_ref().is_none_or(|w| w.is_done());
        let recoveries_started = self.knobs.recoveries_at_ms.iter().all(|&at| at <= self.now);
        writer_done && recoveries_started && self.recoveries.iter().all(|r| r.is_none())
    }

    /// Faults off, partitions healed, every node up; the ledger closed by its writer or by a
    /// final recovery; then every end-state invariant.
    pub fn finish(&mut self) -> Result<Outcome, String> {
        self.faults = false;
        self.partitions.clear();
        let held: Vec<(Client, usize)> = self.held_requests.keys().copied().collect();
        for (client, node) in held {
            self.release_requests(client, node);
        }
        if let Some(held) = self.held_meta.take() {
            for (client, op) in held {
                self.schedule(1, Event::MetaApply { client, op });
            }
        }
        for node in 0..self.nodes.len() {
            if self.nodes[node].core.is_none() {
                self.schedule(1, Event::NodeRestart { node });
            }
        }
        let deadline = self.now + 60_000;
        if let Some(writer) = &mut self.writer {
            let mut out = Vec::new();
            writer.close(&mut out);
            self.writer_actions(out);
        }
        self.run_until(
            |sim| sim.meta.state == LedgerState::Closed || sim.writer_stuck(),
            deadline,
        )?;
        if self.meta.state != LedgerState::Closed {
            self.start_recovery();
            self.run_until(|sim| sim.meta.state == LedgerState::Closed, deadline)?;
        }
        if self.meta.state != LedgerState::Closed {
            return Err(format!("not closed 60 s after the faults stopped: {:?}", self.meta));
        }
        // Let recoveries still running finish or give up, then check everything.
        self.run_until(|sim| sim.recoveries.iter().all(|r| r.is_none()), self.now + 20_000)?;
        self.check("end")?;
        for (k, last) in self.recovered.iter().enumerate() {
            if *last != self.meta.last_entry_id {
                return Err(format!(
                    "recovery {k} ended at {last:?}, the ledger is closed at {:?}",
                    self.meta.last_entry_id
                ));
            }
        }
        let rereplicated = self.lose_a_node_and_rereplicate()?;
        Ok(Outcome {
            acked: self.acked.len() as u64,
            last_entry: self.meta.last_entry_id,
            fragments: self.meta.fragments.len(),
            rereplicated,
            events: self.events,
            virtual_ms: self.now,
        })
    }

    /// The writer is done (or gone) without closing: a recovery must close the ledger.
    fn writer_stuck(&self) -> bool {
        self.writer.as_ref().is_none_or(|w| w.is_done())
    }

    /// Runs events until `done` holds (checked after each event), or fails past `deadline`.
    pub fn run_until(
        &mut self,
        done: impl Fn(&Simulation) -> bool,
        deadline: u64,
    ) -> Result<(), String> {
        loop {
            if let Some(why) = &self.violation {
                return Err(why.clone());
            }
            if done(self) {
                return Ok(());
            }
            if !self.step() || self.now > deadline {
                return if done(self) {
                    Ok(())
                } else {
                    Err(format!("still running at {} ms", self.now))
                };
            }
        }
    }

    /// Runs events until virtual time `until`.
    pub fn run_for(&mut self, ms: u64) -> Result<(), String> {
        let until = self.now + ms;
        while self.queue.peek().is_some_and(|Reverse((at, _, _))| *at <= until) {
            self.step();
            if let Some(why) = &self.violation {
                return Err(why.clone());
            }
        }
        self.now = until;
        Ok(())
    }

    /// One event; false when none is left.
    pub fn step(&mut self) -> bool {
        let Some(Reverse((at, _, slot))) = self.queue.pop() else {
            return false;
        };
        let event = self.slots[slot].take().expect("a scheduled slot holds its event");
        self.free_slots.push(slot);
        assert!(at >= self.now, "time never goes back");
        self.now = at;
        self.events += 1;
        if let Some(trace) = &mut self.trace {
            trace.push(format!("{at:>7} {event:?}"));
        }
        self.handle(event);
        self.check_lacs();
        if let Some(delay) = self.knobs.delete_after_close_ms {
            if self.meta.state == LedgerState::Closed && !self.delete_scheduled {
                self.delete_scheduled = true;
                self.schedule(delay, Event::DeleteLedger);
            }
        }
        true
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::ToNode { node, incarnation, from, request, body } => {
                if self.nodes[node].incarnation == incarnation {
                    self.node_request(node, from, request, body);
                }
            }
            Event::ToClient { client, node, request, body } => {
                self.client_response(client, node, request, body)
            }
            Event::Sync { node, incarnation } => {
                if self.nodes[node].incarnation == incarnation {
                    self.nodes[node].sync_scheduled = false;
                    let done = self.nodes[node].disk.sync();
                    self.complete(node, done);
                }
            }
            Event::NodeRestart { node } => self.restart_node(node),
            Event::ConnectionReset { client, node } => self.node_failed_at(client, node),
            Event::Heal { client, node } => {
                self.partitions.remove(&(client, node));
            }
            Event::Tick { client } => self.tick(client),
            Event::WriterAdd => self.writer_add(),
            Event::WriterCrash => self.crash_writer(),
            Event::StartRecovery => {
                // A deleted ledger has no metadata left to recover from.
                if !self.deleted {
                    self.start_recovery();
                }
            }
            Event::DeleteLedger => self.delete_ledger(),
            Event::RandomCrash => {
                if self.faults {
                    let node = self.rng.below(self.nodes.len() as u64) as usize;
                    self.crash_node(node);
                    let every = self.knobs.node_crash_every_ms.expect("scheduled only with it");
                    let next = self.rng.range(1, every * 2);
                    self.schedule(next, Event::RandomCrash);
                }
            }
            Event::RandomPartition => {
                if self.faults {
                    let clients = 1 + self.recoveries.len() as u64;
                    let k = self.rng.below(clients);
                    let client =
                        if k == 0 { Client::Writer } else { Client::Recovery(k as usize - 1) };
                    let node = self.rng.below(self.nodes.len() as u64) as usize;
                    self.partition(client, node);
                    let heal = self.rng.range(self.knobs.partition_ms.0, self.knobs.partition_ms.1);
                    self.schedule(heal, Event::Heal { client, node });
                    let every = self.knobs.partition_every_ms.expect("scheduled only with it");
                    let next = self.rng.range(1, every * 2);
                    self.schedule(next, Event::RandomPartition);
                }
            }
            Event::MetaApply { client, op } => self.meta_apply(client, op),
            Event::MetaReply { client, reply } => self.meta_reply(client, reply),
        }
    }

    // ------------------------------------------------------------------ network

    fn latency(&mut self) -> u64 {
        self.rng.range(self.knobs.latency_ms.0, self.knobs.latency_ms.1)
    }

    fn lost(&mut self, client: Client, node: usize) -> bool {
        self.partitions.contains(&(client, node))
            || (self.faults && self.rng.chance(self.knobs.drop_per_mille))
    }

    fn duplicated(&mut self) -> bool {
        self.faults && self.rng.chance(self.knobs.duplicate_per_mille)
    }

    fn send_to_node(&mut self, from: Client, to: NodeId, request: RequestId, body: Request) {
        let node = to.0 as usize;
        if self.lost(from, node) {
            return;
        }
        if let Some(held) = self.held_requests.get_mut(&(from, node)) {
            held.push((request, body));
            return;
        }
        let incarnation = self.nodes[node].incarnation;
        if self.duplicated() {
            let delay = self.latency();
            let body = body.clone();
            self.schedule(delay, Event::ToNode { node, incarnation, from, request, body });
        }
        let delay = self.latency();
        self.schedule(delay, Event::ToNode { node, incarnation, from, request, body });
    }

    fn send_to_client(&mut self, node: usize, client: Client, request: RequestId, body: Response) {
        if self.lost(client, node) {
            return;
        }
        if self.duplicated() {
            let delay = self.latency();
            self.schedule(delay, Event::ToClient { client, node, request, body: body.clone() });
        }
        let delay = self.latency();
        self.schedule(delay, Event::ToClient { client, node, request, body });
    }

    /// Cuts `client` off from `node` in both directions until healed.
    pub fn partition(&mut self, client: Client, node: usize) {
        self.partitions.insert((client, node));
    }

    pub fn heal(&mut self, client: Client, node: usize) {
        self.partitions.remove(&(client, node));
    }

    /// Keeps `client`'s requests to `node` back (a slow link: nothing is lost) until
    /// [`Self::release_requests`].
    pub fn hold_requests(&mut self, client: Client, node: usize) {
        self.held_requests.entry((client, node)).or_default();
    }

    /// Sends what was held, in order.
    pub fn release_requests(&mut self, client: Client, node: usize) {
        for (request, body) in self.held_requests.remove(&(client, node)).unwrap_or_default() {
            self.send_to_node(client, NodeId(node as u64), request, body);
        }
    }

    /// Whether `node` (up) has fenced the ledger.
    pub fn is_fenced(&self, node: usize) -> bool {
        self.nodes[node].core.as_ref().is_some_and(|core| core.is_fenced(LEDGER))
    }

    // ------------------------------------------------------------------ storage nodes

    fn node_request(&mut self, node: usize, from: Client, request: RequestId, body: Request) {
        let Some(core) = &mut self.nodes[node].core else {
            return;
        };
        let mut out = Vec::new();
        core.handle(from.peer(), request, body, &mut out);
        self.node_actions(node, out);
    }

    fn node_actions(&mut self, node: usize, actions: Vec<NodeAction>) {
        for action in actions {
            match action {
                NodeAction::Persist { token, record } => {
                    if self.faults && self.rng.chance(self.knobs.disk_fault_per_mille) {
                        // The write fails: everything owed fails, and the node goes down (a
                        // journal that failed a write accepts nothing more).
                        let mut failed = self.nodes[node].disk.fail_pending();
                        failed.push((token, Err(magnetar_replication::ErrorCode::Io)));
                        self.complete(node, failed);
                        self.crash_node(node);
                        return;
                    }
                    if let Err(why) = self.nodes[node].disk.append(token, record) {
                        self.violate(format!("node {node}: {why}"));
                    }
                    if !self.nodes[node].sync_scheduled {
                        self.nodes[node].sync_scheduled = true;
                        let delay = self.rng.range(self.knobs.fsync_ms.0, self.knobs.fsync_ms.1);
                        let incarnation = self.nodes[node].incarnation;
                        self.schedule(delay, Event::Sync { node, incarnation });
                    }
                }
                NodeAction::Reply { peer, request, response } => {
                    self.send_to_client(node, Client::from_peer(peer), request, response)
                }
                NodeAction::ReadAndReply { peer, request, ledger, entry, lac } => {
                    let response = match self.nodes[node].disk.read(ledger, entry) {
                        Some(data) => Response::Entry { ledger, entry, lac, data: data.clone() },
                        None => Response::NoEntry { ledger, entry, lac },
                    };
                    self.send_to_client(node, Client::from_peer(peer), request, response);
                }
            }
        }
    }

    fn complete(
        &mut self,
        node: usize,
        done: Vec<(u64, Result<(), magnetar_replication::ErrorCode>)>,
    ) {
        let mut out = Vec::new();
        if let Some(core) = &mut self.nodes[node].core {
            for (token, result) in done {
                core.persisted(token, result, &mut out);
            }
        }
        self.node_actions(node, out);
    }

    /// The node's process dies: unsynced records are lost (or partly kept), requests on the
    /// wire to it are lost, clients may hear of it through a reset connection.
    pub fn crash_node(&mut self, node: usize) {
        if self.nodes[node].core.is_none() {
            return;
        }
        let n = &mut self.nodes[node];
        n.core = None;
        n.incarnation += 1;
        n.sync_scheduled = false;
        n.disk.crash(&mut self.rng);
        let down = self.rng.range(self.knobs.node_down_ms.0, self.knobs.node_down_ms.1);
        self.schedule(down, Event::NodeRestart { node });
        let mut clients = vec![Client::Writer];
        clients.extend((0..self.recoveries.len()).map(Client::Recovery));
        for client in clients {
            if self.rng.chance(500) {
                let delay = self.latency();
                self.schedule(delay, Event::ConnectionReset { client, node });
            }
        }
        self.check_now("node crash");
    }

    pub fn restart_node(&mut self, node: usize) {
        let n = &mut self.nodes[node];
        if n.core.is_none() {
            n.core = Some(NodeCore::restore(n.disk.summaries()));
        }
    }

    /// The closed ledger is deleted: every node collects it, up or down (a real node that is
    /// down collects it on a pass after it comes back, and until then holds the ledger as it
    /// was, fence included: collecting at once is the harder case). Its entries are gone from
    /// then on; the check still holds every acknowledgement to the closed length.
    pub fn delete_ledger(&mut self) {
        assert_eq!(self.meta.state, LedgerState::Closed, "only a closed ledger is deleted");
        for node in &mut self.nodes {
            node.disk.collect(LEDGER);
            if let Some(core) = &mut node.core {
                core.collect(LEDGER);
            }
        }
        self.deleted = true;
        self.check_now("ledger deleted");
    }

    pub fn is_up(&self, node: usize) -> bool {
        self.nodes[node].core.is_some()
    }

    /// The durable bytes node `node` holds for `entry`.
    pub fn stored(&self, node: usize, entry: EntryId) -> Option<Bytes> {
        self.nodes[node].disk.read(LEDGER, entry).cloned()
    }

    // ------------------------------------------------------------------ clients

    fn live_view(&mut self) -> Vec<NodeInfo> {
        let mut live = Vec::new();
        for i in 0..self.nodes.len() {
            // A crashed node's registration lingers for a while: sometimes it is still listed.
            let stale = self.faults && self.rng.chance(300);
            if self.nodes[i].core.is_some() || stale {
                live.push(self.nodes[i].info.clone());
            }
        }
        live
    }

    fn tick(&mut self, client: Client) {
        let live = self.live_view();
        let now = self.now;
        match client {
            Client::Writer => {
                let Some(writer) = &mut self.writer else { return };
                let mut out = Vec::new();
                writer.set_live_nodes(live);
                writer.tick(now, &mut out);
                let done = writer.is_done();
                self.writer_actions(out);
                if !done {
                    self.schedule(TICK_MS, Event::Tick { client });
                }
            }
            Client::Recovery(k) => {
                let Some(recovery) = &mut self.recoveries[k] else { return };
                let mut out = Vec::new();
                recovery.set_live_nodes(live);
                recovery.tick(now, &mut out);
                self.recovery_actions(k, out);
                if self.recoveries[k].is_some() {
                    self.schedule(TICK_MS, Event::Tick { client });
                }
            }
            Client::Rereplication => {
                let Some(r) = &mut self.rereplication else { return };
                let mut pending = Vec::new();
                for (k, copy) in r.copies.iter_mut().enumerate() {
                    let mut out = Vec::new();
                    copy.tick(now, &mut out);
                    pending.push((k, out));
                }
                let running = r.failed.is_none() && !r.copies.iter().all(FragmentCopy::is_finished);
                for (k, out) in pending {
                    self.rereplication_actions(k, out);
                }
                if running {
                    self.schedule(TICK_MS, Event::Tick { client });
                }
            }
        }
    }

    fn client_response(&mut self, client: Client, node: usize, request: RequestId, body: Response) {
        let now = self.now;
        let from = NodeId(node as u64);
        match client {
            Client::Writer => {
                let Some(writer) = &mut self.writer else { return };
                let mut out = Vec::new();
                writer.on_response(from, request, body, now, &mut out);
                self.writer_actions(out);
            }
            Client::Recovery(k) => {
                let Some(recovery) = &mut self.recoveries[k] else { return };
                let mut out = Vec::new();
                recovery.on_response(from, request, body, now, &mut out);
                self.recovery_actions(k, out);
            }
            Client::Rereplication => self.rereplication_answer(request, from, Some(body)),
        }
    }

    fn node_failed_at(&mut self, client: Client, node: usize) {
        let now = self.now;
        let node = NodeId(node as u64);
        match client {
            Client::Writer => {
                let Some(writer) = &mut self.writer else { return };
                let mut out = Vec::new();
                writer.on_node_failed(node, now, &mut out);
                self.writer_actions(out);
            }
            Client::Recovery(k) => {
                let Some(recovery) = &mut self.recoveries[k] else { return };
                let mut out = Vec::new();
                recovery.on_node_failed(node, now, &mut out);
                self.recovery_actions(k, out);
            }
            Client::Rereplication => {
                let asked: Vec<RequestId> =
                    self.rereplication.as_ref().map_or_else(Vec::new, |r| {
                        r.requests.iter().filter(|(_, q)| q.3 == node).map(|(id, _)| *id).collect()
                    });
                for request in asked {
                    self.rereplication_answer(request, node, None);
                }
            }
        }
    }

    fn writer_add(&mut self) {
        let now = self.now;
        let data = self.expected_data(self.writer_added);
        let Some(writer) = &mut self.writer else { return };
        if self.writer_added >= self.knobs.entries {
            let mut out = Vec::new();
            writer.close(&mut out);
            self.writer_actions(out);
            return;
        }
        if writer.pending() < self.knobs.window {
            let mut out = Vec::new();
            match writer.add(data, now, &mut out) {
                Ok(entry) => {
                    assert_eq!(entry, self.writer_added, "entry ids are dense");
                    self.writer_added += 1;
                }
                Err(_) => return, // fenced or failed: the workload is over for this writer
            }
            self.writer_actions(out);
        }
        let delay = self.rng.range(0, 3);
        self.schedule(delay, Event::WriterAdd);
    }

    /// Adds `count` entries now (scenarios).
    pub fn writer_add_now(&mut self, count: u64) {
        for _ in 0..count {
            let now = self.now;
            let data = self.expected_data(self.writer_added);
            let Some(writer) = &mut self.writer else { return };
            let mut out = Vec::new();
            if writer.add(data, now, &mut out).is_ok() {
                self.writer_added += 1;
            }
            self.writer_actions(out);
        }
    }

    pub fn writer_close(&mut self) {
        if let Some(writer) = &mut self.writer {
            let mut out = Vec::new();
            writer.close(&mut out);
            self.writer_actions(out);
        }
    }

    /// The writer's process dies; what it sent is still on the wire.
    pub fn crash_writer(&mut self) {
        self.writer = None;
        self.writer_crashed = true;
    }

    pub fn writer_pending(&self) -> usize {
        self.writer.as_ref().map_or(0, |w| w.pending())
    }

    /// Starts a recovery open of the ledger; its number.
    pub fn start_recovery(&mut self) -> usize {
        let k = self.recoveries.len();
        let mut out = Vec::new();
        let config = self.knobs.recovery.clone();
        let mut recovery =
            Recovery::start(LEDGER, self.meta.clone(), self.meta_version, config, &mut out);
        let live = self.live_view();
        recovery.set_live_nodes(live);
        self.recoveries.push(Some(recovery));
        self.recovery_actions(k, out);
        if self.recoveries[k].is_some() {
            self.schedule(TICK_MS, Event::Tick { client: Client::Recovery(k) });
        }
        k
    }

    pub fn recovery_running(&self, k: usize) -> bool {
        self.recoveries.get(k).is_some_and(|r| r.is_some())
    }

    fn writer_actions(&mut self, actions: Vec<WriterAction>) {
        for action in actions {
            match action {
                WriterAction::Send { to, request, body } => {
                    self.send_to_node(Client::Writer, to, request, body)
                }
                WriterAction::WriteMeta { meta, expected_version } => self.meta_request(
                    Client::Writer,
                    MetaOp::Write { meta, expected: expected_version },
                ),
                WriterAction::ReadMeta => self.meta_request(Client::Writer, MetaOp::Read),
                WriterAction::Acked { entry } => self.on_acked(entry),
                WriterAction::Failed { .. } => {}
                WriterAction::Closed { last_entry } => self.writer_outcome = Some(Ok(last_entry)),
            }
        }
        if let Some(writer) = &self.writer {
            if writer.is_done() && self.writer_outcome.is_none() {
                let error = writer.refusal().unwrap_or(WriteError::Closed);
                self.writer_outcome = Some(Err(error));
            }
        }
    }

    fn recovery_actions(&mut self, k: usize, actions: Vec<RecoveryAction>) {
        for action in actions {
            match action {
                RecoveryAction::Send { to, request, body } => {
                    self.send_to_node(Client::Recovery(k), to, request, body)
                }
                RecoveryAction::WriteMeta { meta, expected_version } => self.meta_request(
                    Client::Recovery(k),
                    MetaOp::Write { meta, expected: expected_version },
                ),
                RecoveryAction::ReadMeta => self.meta_request(Client::Recovery(k), MetaOp::Read),
                RecoveryAction::Done { meta, .. } => {
                    if meta.state != LedgerState::Closed {
                        self.violate(format!("recovery {k} done with an unclosed ledger"));
                    }
                    self.recovered.push(meta.last_entry_id);
                    self.recoveries[k] = None;
                }
                RecoveryAction::Superseded => self.recoveries[k] = None,
            }
        }
    }

    // ------------------------------------------------------------------ metadata store

    fn meta_request(&mut self, client: Client, op: MetaOp) {
        let delay = self.rng.range(self.knobs.meta_latency_ms.0, self.knobs.meta_latency_ms.1);
        self.schedule(delay, Event::MetaApply { client, op });
    }

    /// From now on metadata requests wait (a slow metadata store) until [`Self::release_meta`].
    pub fn hold_meta(&mut self) {
        self.held_meta.get_or_insert_with(Vec::new);
    }

    /// Applies the held requests, or drops them (`lose`: they never reached the store).
    pub fn release_meta(&mut self, lose: bool) {
        for (client, op) in self.held_meta.take().unwrap_or_default() {
            if !lose {
                self.schedule(0, Event::MetaApply { client, op });
            }
        }
    }

    fn meta_apply(&mut self, client: Client, op: MetaOp) {
        if let Some(held) = &mut self.held_meta {
            held.push((client, op));
            return;
        }
        let unknown = self.faults && self.rng.chance(self.knobs.meta_unknown_per_mille);
        let apply = !unknown || self.rng.chance(500);
        let reply = match op {
            MetaOp::Read => MetaReply::Read(self.meta.clone(), self.meta_version),
            MetaOp::Write { meta, expected } if expected == self.meta_version => {
                if !apply {
                    MetaReply::Written(MetaWrite::Unknown)
                } else {
                    let valid = match client {
                        Client::Rereplication => self.meta.validate_replacement(&meta),
                        _ => self.meta.validate_successor(&meta),
                    };
                    if let Err(e) = valid {
                        self.violate(format!(
                            "{client:?} stored an invalid successor: {e}: {meta:?}"
                        ));
                    }
                    self.meta = meta;
                    self.meta_version += 1;
                    self.check_now("metadata change");
                    MetaReply::Written(if unknown {
                        MetaWrite::Unknown
                    } else {
                        MetaWrite::Written(self.meta_version)
                    })
                }
            }
            MetaOp::Write { .. } => MetaReply::Written(if unknown {
                MetaWrite::Unknown
            } else {
                MetaWrite::Conflict {
                    current: Box::new(self.meta.clone()),
                    version: self.meta_version,
                }
            }),
        };
        let delay = self.rng.range(self.knobs.meta_latency_ms.0, self.knobs.meta_latency_ms.1);
        self.schedule(delay, Event::MetaReply { client, reply });
    }

    fn meta_reply(&mut self, client: Client, reply: MetaReply) {
        let now = self.now;
        match client {
            Client::Writer => {
                let Some(writer) = &mut self.writer else { return };
                let mut out = Vec::new();
                match reply {
                    MetaReply::Written(result) => writer.on_meta_written(result, now, &mut out),
                    MetaReply::Read(meta, version) => {
                        writer.on_meta_read(meta, version, now, &mut out)
                    }
                }
                self.writer_actions(out);
            }
            Client::Recovery(k) => {
                let Some(recovery) = &mut self.recoveries[k] else { return };
                let mut out = Vec::new();
                match reply {
                    MetaReply::Written(result) => recovery.on_meta_written(result, now, &mut out),
                    MetaReply::Read(meta, version) => {
                        recovery.on_meta_read(meta, version, now, &mut out)
                    }
                }
                self.recovery_actions(k, out);
            }
            Client::Rereplication => {
                if let (Some(r), MetaReply::Written(result)) = (&mut self.rereplication, reply) {
                    r.written = Some(result);
                }
            }
        }
    }

    // ------------------------------------------------------------------ re-replication

    /// After the end checks: one node of the ledger's ensembles is lost for good (its disk with
    /// it), the auditor's plan moves its copies to nodes that hold none of the ledger, the copies
    /// run over the simulated network, the metadata is swapped by compare-and-set, and then every
    /// entry must be on as many nodes of its ensemble as before the loss (the replacement holds
    /// whatever a survivor held), at least Qa. The node lost is one whose every entry has another
    /// copy (with Qa = 1 an entry may have none: its loss is data loss, which the copy reports
    /// and no plan can undo). Skipped when no such node is there, or no node is free to take a
    /// copy. Returns whether it ran.
    fn lose_a_node_and_rereplicate(&mut self) -> Result<bool, String> {
        // A ledger deleted (or about to be: its nodes collect it) has nothing to restore.
        if self.deleted || self.delete_scheduled || self.meta.write_quorum < 2 {
            return Ok(false);
        }
        let Some(last) = self.meta.last_entry_id else { return Ok(false) };
        let holders = |sim: &Simulation, entry: EntryId| -> Vec<NodeId> {
            let expected = sim.expected_data(entry);
            (sim.meta.ensemble_for(entry).iter().copied())
                .filter(|n| sim.nodes[n.0 as usize].disk.read(LEDGER, entry) == Some(&expected))
                .collect()
        };
        let before: Vec<Vec<NodeId>> = (0..=last).map(|e| holders(self, e)).collect();
        let named: BTreeSet<NodeId> =
            self.meta.fragments.iter().flat_map(|f| f.ensemble.iter().copied()).collect();
        let safe: Vec<NodeId> = named
            .into_iter()
            .filter(|n| before.iter().all(|h| !h.contains(n) || h.len() > 1))
            .collect();
        if safe.is_empty() {
            return Ok(false);
        }
        let lost = safe[self.rng.below(safe.len() as u64) as usize];
        let n = &mut self.nodes[lost.0 as usize];
        n.core = None;
        n.incarnation += 1;
        n.disk = Disk::default();
        let live: Vec<NodeInfo> = (0..self.nodes.len())
            .filter(|&i| self.nodes[i].core.is_some())
            .map(|i| self.nodes[i].info.clone())
            .collect();
        let plan = match plan(&self.meta, &BTreeSet::from([lost]), &live) {
            Ok(plan) => plan,
            Err(PlanError::NoReplacement { .. }) => return Ok(false),
            Err(e) => return Err(format!("re-replication of {lost}: {e}")),
        };
        assert!(!plan.left_to_writer, "the ledger is closed");
        let (epoch, now) = (self.meta.epoch, self.now);
        let mut copies = Vec::new();
        let mut sends = Vec::new();
        for transfer in &plan.transfers {
            let mut out = Vec::new();
            copies.push(FragmentCopy::start(
                LEDGER,
                epoch,
                transfer,
                4,
                COPY_TIMEOUT_MS,
                now,
                &mut out,
            ));
            sends.push(out);
        }
        self.rereplication = Some(Rereplication {
            plan,
            copies,
            requests: BTreeMap::new(),
            next_request: 0,
            failed: None,
            written: None,
        });
        for (k, out) in sends.into_iter().enumerate() {
            self.rereplication_actions(k, out);
        }
        self.schedule(TICK_MS, Event::Tick { client: Client::Rereplication });
        let deadline = self.now + 60_000;
        self.run_until(
            |sim| {
                sim.rereplication.as_ref().is_some_and(|r| {
                    r.failed.is_some() || r.copies.iter().all(FragmentCopy::is_finished)
                })
            },
            deadline,
        )
        .map_err(|why| {
            let r = self.rereplication.as_ref().expect("set above");
            format!("re-replication of {lost}: {why}: requests {:?}, copies {:?}, plan {:?}, metadata {:?}", r.requests, r.copies, r.plan, self.meta)
        })?;
        let r = self.rereplication.as_ref().expect("set above");
        if let Some(why) = &r.failed {
            return Err(format!(
                "re-replication of {lost} failed: {why} (before: {before:?}; metadata {:?}; \
                 plan {:?})",
                self.meta, r.plan
            ));
        }
        let next = r.plan.apply(&self.meta).map_err(|e| format!("re-replication plan: {e}"))?;
        let expected = self.meta_version;
        self.meta_request(Client::Rereplication, MetaOp::Write { meta: next, expected });
        self.run_until(
            |sim| sim.rereplication.as_ref().is_some_and(|r| r.written.is_some()),
            deadline,
        )?;
        match self.rereplication.as_ref().and_then(|r| r.written.clone()) {
            Some(MetaWrite::Written(_)) => {}
            other => return Err(format!("re-replication's metadata write: {other:?}")),
        }
        self.check("after re-replication")?;
        for (entry, had) in before.iter().enumerate() {
            let now = holders(self, entry as EntryId);
            if now.len() < had.len() {
                return Err(format!(
                    "entry {entry} had copies on {had:?} before {lost} was lost, now on {now:?} \
                     only (metadata {:?})",
                    self.meta
                ));
            }
        }
        Ok(true)
    }

    fn rereplication_actions(&mut self, copy: usize, actions: Vec<CopyAction>) {
        for action in actions {
            let Some(r) = &mut self.rereplication else { return };
            match action {
                CopyAction::Send { to, request } => {
                    let (entry, add) = match &request {
                        Request::Add { entry, .. } => (*entry, true),
                        Request::Read { entry, .. } => (*entry, false),
                        other => panic!("a copy sends reads and adds, not {other:?}"),
                    };
                    r.next_request += 1;
                    let id = r.next_request;
                    r.requests.insert(id, (copy, entry, add, to));
                    self.send_to_node(Client::Rereplication, to, id, request);
                }
                CopyAction::Done => {}
                CopyAction::Failed(why) => {
                    r.failed.get_or_insert(why);
                }
            }
        }
    }

    /// `from`'s answer to request `id` of a copy (`None`: its connection failed).
    fn rereplication_answer(&mut self, id: RequestId, from: NodeId, answer: Option<Response>) {
        let Some(r) = &mut self.rereplication else { return };
        let Some(&(copy, entry, add, to)) = r.requests.get(&id) else { return };
        if to != from {
            return;
        }
        r.requests.remove(&id);
        let (mut out, now) = (Vec::new(), self.now);
        if add {
            r.copies[copy].on_added(entry, answer, now, &mut out);
        } else {
            r.copies[copy].on_read(from, entry, answer, now, &mut out);
        }
        self.rereplication_actions(copy, out);
    }

    // ------------------------------------------------------------------ invariants

    fn on_acked(&mut self, entry: EntryId) {
        let expected = self.acked.keys().next_back().map_or(0, |last| last + 1);
        if entry != expected {
            return self.violate(format!("entry {entry} acknowledged out of order (expected {expected}): LAC went back or skipped"));
        }
        let data = self.expected_data(entry);
        self.acked.insert(entry, data);
        if let Err(why) = self.check_entry(entry) {
            self.violate(format!("acknowledged {why}"));
        }
        if self.meta.state == LedgerState::Closed && self.meta.last_entry_id < Some(entry) {
            self.violate(format!(
                "entry {entry} acknowledged above the closed ledger's last entry {:?}",
                self.meta.last_entry_id
            ));
        }
    }

    /// After every event: the writer's LAC never goes back, and no node holds a LAC above
    /// what the writer acknowledged (a reader trusts a node's LAC as confirmed, and a recovery
    /// starts from it: one too high would close the ledger over entries never at Qa).
    fn check_lacs(&mut self) {
        if let Some(writer) = &self.writer {
            let lac = writer.last_add_confirmed();
            if lac < self.writer_lac {
                let before = self.writer_lac;
                return self
                    .violate(format!("the writer's LAC went back from {before:?} to {lac:?}"));
            }
            self.writer_lac = lac;
        }
        if self.deleted {
            return;
        }
        let acked = self.acked.keys().next_back().copied();
        for (index, node) in self.nodes.iter().enumerate() {
            let Some(core) = &node.core else { continue };
            let lac = core.summary(LEDGER).lac;
            if lac > acked {
                return self.violate(format!(
                    "node {index} holds LAC {lac:?} above the highest acknowledged entry {acked:?}"
                ));
            }
        }
    }

    /// Entry `entry` is durable, with the writer's bytes, on Qa nodes of the ensemble the
    /// stored metadata names for it.
    fn check_entry(&self, entry: EntryId) -> Result<(), String> {
        self.check_entry_copies(entry, self.meta.ack_quorum)
    }

    /// Entry `entry` is durable, with the writer's bytes, on `wanted` nodes of its ensemble.
    fn check_entry_copies(&self, entry: EntryId, wanted: u32) -> Result<(), String> {
        let expected = self.expected_data(entry);
        let ensemble = self.meta.ensemble_for(entry);
        let mut copies = 0;
        for node in ensemble {
            match self.nodes[node.0 as usize].disk.read(LEDGER, entry) {
                Some(data) if *data == expected => copies += 1,
                Some(data) => {
                    return Err(format!("entry {entry} holds {data:?} on {node}, not {expected:?}"))
                }
                None => {}
            }
        }
        if copies < wanted {
            return Err(format!(
                "entry {entry} is durable on {copies} of {ensemble:?}, fewer than {wanted} (Qw {}, \
                 Qa {}; metadata {:?})",
                self.meta.write_quorum, self.meta.ack_quorum, self.meta
            ));
        }
        Ok(())
    }

    fn check_now(&mut self, when: &str) {
        if let Err(why) = self.check(when) {
            self.violate(why);
        }
    }

    /// Every invariant over the current state.
    pub fn check(&self, when: &str) -> Result<(), String> {
        self.meta.validate().map_err(|e| format!("{when}: stored metadata invalid: {e}"))?;
        if let Some(groups) = &self.meta.isolation {
            for fragment in &self.meta.fragments {
                for node in &fragment.ensemble {
                    let group = self.nodes[node.0 as usize].info.group.as_ref();
                    if group.is_some_and(|g| {
                        !groups.primary.contains(g) && !groups.secondary.contains(g)
                    }) {
                        return Err(format!(
                            "{when}: {node} of group {group:?} holds a fragment of a ledger kept to {groups:?}: {:?}",
                            self.meta.fragments
                        ));
                    }
                }
            }
        }
        if !self.deleted {
            for &entry in self.acked.keys() {
                self.check_entry(entry).map_err(|why| format!("{when}: acknowledged {why}"))?;
            }
        }
        if self.meta.state == LedgerState::Closed {
            let last = self.meta.last_entry_id;
            if let Some(&top) = self.acked.keys().next_back() {
                if last < Some(top) {
                    return Err(format!(
                        "{when}: closed at {last:?} below the acknowledged entry {top}"
                    ));
                }
            }
            if let Some(last) = last.filter(|_| !self.deleted) {
                for entry in 0..=last {
                    self.check_entry(entry)
                        .map_err(|why| format!("{when}: closed ledger's {why}"))?;
                }
            }
        }
        Ok(())
    }
}

impl std::fmt::Debug for Simulation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Simulation")
            .field("seed", &self.seed)
            .field("now", &self.now)
            .finish_non_exhaustive()
    }
}
