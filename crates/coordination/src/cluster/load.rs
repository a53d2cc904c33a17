//! The load manager's shell: every broker reports its load to the store; one broker, the leader
//! (elected by an ephemeral key), runs the [`Shedder`] over the reports and moves bundles by
//! hand-over, and gives a dead broker's bundles to live brokers as soon as it is known dead.
//!
//! - `/loadbalance/brokers/{id}`: the broker's report (ephemeral, rewritten each interval):
//!   CPU and memory of the process as fractions of the machine, network as a fraction of
//!   `bandwidth_limit`, and the throughput of every bundle it owns.
//! - `/loadbalance/leader`: the leader's id (ephemeral: a leader whose session ends leaves the
//!   key to the next broker that tries, within one interval).
//! - A transfer is a hand-over the owner is asked for (`Releasing{src: owner, dst}`), so
//!   clients move without an error, as on an admin unload.
//! - Before shedding, the leader splits the bundles the [`crate::splitter`] picks (their topics,
//!   message and byte rates are in the reports) in their namespaces' policies; their owners
//!   adopt the halves through their watches, and that cycle sheds nothing.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use magnetar_metadata::{ExpectedVersion, MetadataError};
use magnetar_model::names::TopicName;
use serde::{Deserialize, Serialize};

use super::{
    ownership_key, parse_ownership_key, BrokerUrls, ClusterOwnership, CoordinationError,
    NAMESPACES_ROOT,
};
use crate::ownership::UnitState;
use crate::shedder::{BundleLoad, LoadReport, Shedder, ShedderConfig, Transfer};
use crate::splitter::SplitConfig;
use crate::Bundles;

/// Parent of the brokers' load reports.
pub const LOAD_ROOT: &str = "/loadbalance/brokers";
/// The leader's id.
pub const LEADER_KEY: &str = "/loadbalance/leader";

/// One loaded topic's traffic since the previous reading.
#[derive(Debug, Clone, PartialEq)]
pub struct TopicLoad {
    pub name: TopicName,
    /// Bytes per second in and out.
    pub throughput: f64,
    /// Messages per second in.
    pub msg_rate: f64,
}

/// The broker's side: its topics' traffic.
pub trait TopicLoads: Send + Sync + 'static {
    /// Each loaded topic's traffic.
    fn topic_loads(&self) -> Vec<TopicLoad>;
}

/// Timings and limits of the load manager. Defaults in [`Default`].
#[derive(Debug, Clone)]
pub struct LoadManagerConfig {
    /// How often each broker reports and the leader decides. Default 5 s.
    pub interval: Duration,
    /// The network a broker may use, bytes per second in each direction. Default 125 MB/s
    /// (1 Gbit/s).
    pub bandwidth_limit: f64,
    /// Move bundles between brokers by load (Pulsar's `loadBalancerSheddingEnabled`). Default
    /// true.
    pub shedding_enabled: bool,
    pub shedder: ShedderConfig,
    /// Automatic bundle splits.
    pub split: SplitConfig,
}

impl Default for LoadManagerConfig {
    fn default() -> Self {
        LoadManagerConfig {
            interval: Duration::from_secs(5),
            bandwidth_limit: 125e6,
            shedding_enabled: true,
            shedder: ShedderConfig::default(),
            split: SplitConfig::default(),
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredReport {
    cpu: f64,
    memory: f64,
    bandwidth_in: f64,
    bandwidth_out: f64,
    /// Ownership key -> bytes per second.
    bundles: BTreeMap<String, f64>,
    /// Ownership key -> topics loaded (absent in a report of an older broker).
    #[serde(default)]
    topics: BTreeMap<String, u32>,
    /// Ownership key -> messages per second in.
    #[serde(default)]
    msg_rates: BTreeMap<String, f64>,
}

impl ClusterOwnership {
    /// Starts reporting this broker's load and, while it is the leader, shedding load and
    /// reassigning dead brokers' bundles, until the ownership is dropped.
    pub fn start_load_manager(
        self: &Arc<Self>,
        loads: Arc<dyn TopicLoads>,
        config: LoadManagerConfig,
    ) {
        tokio::spawn(run(Arc::downgrade(self), loads, config));
    }

    /// The leader this broker last saw (`None`: none yet).
    pub fn leader(&self) -> Option<String> {
        self.state.lock().leader.clone()
    }

    /// Whether this broker is the leader.
    pub fn is_leader(&self) -> bool {
        self.leader().as_deref() == Some(self.me.id.as_str())
    }

    /// Takes the leadership if nobody holds it; returns the leader.
    async fn elect(&self) -> Result<Option<String>, CoordinationError> {
        let me = Bytes::from(self.me.id.clone());
        let leader = match self.store.put_ephemeral(LEADER_KEY, me, ExpectedVersion::Absent).await {
            Ok(_) => {
                tracing::info!(broker = %self.me.id, "this broker is the load manager's leader");
                Some(self.me.id.clone())
            }
            Err(MetadataError::BadVersion { .. }) => self
                .store
                .get(LEADER_KEY)
                .await?
                .map(|found| String::from_utf8_lossy(&found.value).into_owned()),
            Err(e) => return Err(e.into()),
        };
        self.state.lock().leader = leader.clone();
        Ok(leader)
    }

    fn report(&self, loads: &dyn TopicLoads, usage: (f64, f64), limit: f64) -> StoredReport {
        let mut bundles: BTreeMap<String, f64> =
            self.state.lock().owned.keys().map(|k| (k.clone(), 0.0)).collect();
        let mut topics: BTreeMap<String, u32> = BTreeMap::new();
        let mut msg_rates: BTreeMap<String, f64> = BTreeMap::new();
        let mut total = 0.0;
        for load in loads.topic_loads() {
            total += load.throughput;
            let Some(range) = self.cached_bundle_of(&load.name) else { continue };
            let key = ownership_key(load.name.namespace(), range);
            if let Some(sum) = bundles.get_mut(&key) {
                *sum += load.throughput;
                *topics.entry(key.clone()).or_default() += 1;
                *msg_rates.entry(key).or_default() += load.msg_rate;
            }
        }
        let network = if limit > 0.0 { total / 2.0 / limit } else { 0.0 };
        StoredReport {
            cpu: usage.0,
            memory: usage.1,
            bandwidth_in: network,
            bandwidth_out: network,
            bundles,
            topics,
            msg_rates,
        }
    }

    async fn write_report(&self, report: &StoredReport) -> Result<(), CoordinationError> {
        let key = format!("{LOAD_ROOT}/{}", self.me.id);
        let value = Bytes::from(serde_json::to_vec(report).expect("a report serializes"));
        self.store.put_ephemeral(&key, value, ExpectedVersion::Any).await?;
        Ok(())
    }

    /// The reports of the live brokers (registered, not found dead).
    async fn read_reports(&self) -> Result<BTreeMap<String, LoadReport>, CoordinationError> {
        let mut reports = BTreeMap::new();
        for key in self.store.list(&format!("{LOAD_ROOT}/")).await? {
            let Some(id) = key.strip_prefix(LOAD_ROOT).and_then(|k| k.strip_prefix('/')) else {
                continue;
            };
            let alive = self.state.lock().brokers.contains_key(id) && !self.is_dead(id);
            let Some(found) = self.store.get(&key).await? else { continue };
            let Ok(stored) = serde_json::from_slice::<StoredReport>(&found.value) else {
                tracing::warn!(key, "load report not understood: left out");
                continue;
            };
            if !alive {
                continue;
            }
            let bundles = stored
                .bundles
                .into_iter()
                .map(|(key, throughput)| BundleLoad {
                    topics: stored.topics.get(&key).copied().unwrap_or(0),
                    msg_rate: stored.msg_rates.get(&key).copied().unwrap_or(0.0),
                    key,
                    throughput,
                })
                .collect();
            let report = LoadReport {
                cpu: stored.cpu,
                memory: stored.memory,
                bandwidth_in: stored.bandwidth_in,
                bandwidth_out: stored.bandwidth_out,
                bundles,
            };
            reports.insert(id.to_string(), report);
        }
        Ok(reports)
    }

    /// Splits the bundles the splitter picks from `reports`; how many were split.
    async fn split_hot_bundles(
        &self,
        reports: &BTreeMap<String, LoadReport>,
        config: &SplitConfig,
    ) -> usize {
        if !config.enabled {
            return 0;
        }
        let namespace_of = |key: &str| parse_ownership_key(key).map(|(ns, _)| ns.to_string());
        let counts: std::collections::HashMap<String, usize> = {
            let state = self.state.lock();
            state.bundles.iter().map(|(ns, b)| (ns.to_string(), b.ranges().count())).collect()
        };
        // A namespace whose bundles this broker has not read yet: `split_bundle` reads them.
        let count = |ns: &str| Some(counts.get(ns).copied().unwrap_or(0));
        let mut split = 0;
        for key in crate::splitter::bundles_to_split(reports, &namespace_of, &count, config) {
            match self.split_bundle(&key, config.max_bundles).await {
                Ok(true) => {
                    split += 1;
                    tracing::info!(bundle = %key, "bundle split: past a load threshold");
                }
                Ok(false) => {}
                Err(error) => tracing::warn!(bundle = %key, %error, "bundle not split"),
            }
        }
        split
    }

    /// Splits the bundle `key` at the middle of its range in its namespace's policies, by
    /// compare-and-set (the owner adopts the halves through its watch, as after
    /// `namespaces split-bundle`). False when the bundle is gone or the namespace is full.
    pub async fn split_bundle(
        &self,
        key: &str,
        max_bundles: usize,
    ) -> Result<bool, CoordinationError> {
        let Some((ns, range)) = parse_ownership_key(key) else { return Ok(false) };
        let doc_key = format!("{NAMESPACES_ROOT}/{}/{}", ns.tenant(), ns.namespace());
        let Some(found) = self.store.get(&doc_key).await? else { return Ok(false) };
        let corrupt = |reason: String| CoordinationError::Corrupt { key: doc_key.clone(), reason };
        let mut doc: serde_json::Value =
            serde_json::from_slice(&found.value).map_err(|e| corrupt(e.to_string()))?;
        let bundles = self.read_bundles(&ns).await?;
        if !bundles.has(range) || bundles.ranges().count() >= max_bundles {
            return Ok(false);
        }
        let Some(at) = Bundles::split_point(range, crate::SplitAlgorithm::RangeEquallyDivide, &[])
        else {
            return Ok(false);
        };
        let split = bundles.split_at(range, at).map_err(|e| corrupt(e.to_string()))?;
        let Some(object) = doc.as_object_mut() else { return Err(corrupt("not an object".into())) };
        object.insert(
            "bundles".into(),
            serde_json::json!({ "boundaries": split.boundary_strings(), "numBundles": split.ranges().count() }),
        );
        let value = Bytes::from(serde_json::to_vec(&doc).expect("a document serializes"));
        match self.store.put(&doc_key, value, ExpectedVersion::Exactly(found.version)).await {
            Ok(_) => Ok(true),
            Err(magnetar_metadata::MetadataError::BadVersion { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Asks each transfer's owner for the hand-over (skipped if the record changed meanwhile).
    async fn apply(&self, transfers: Vec<Transfer>) {
        for transfer in transfers {
            let to = self.state.lock().brokers.get(&transfer.to).cloned();
            let Some(to) = to else { continue };
            match self.transfer(&transfer, &to).await {
                Ok(true) => tracing::info!(bundle = %transfer.bundle, from = %transfer.from,
                    to = %transfer.to, "load shedding: bundle transferred"),
                Ok(false) => {}
                Err(error) => {
                    tracing::warn!(bundle = %transfer.bundle, %error, "transfer not asked")
                }
            }
        }
    }

    pub(super) async fn transfer(
        &self,
        transfer: &Transfer,
        to: &BrokerUrls,
    ) -> Result<bool, CoordinationError> {
        let (record, _) = self.read_record(&transfer.bundle).await?;
        if !record.serves(&transfer.from) {
            return Ok(false);
        }
        let next = record.release(&transfer.from, Some(&transfer.to))?;
        self.write_transition(&transfer.bundle, record.version, &next, to).await
    }

    /// Gives every bundle a dead (or unregistered) broker's record names to the least-loaded
    /// live broker (`Assigning{dst}`: that broker takes it through its watch). Returns how many.
    pub(super) async fn reassign_dead(&self) -> Result<usize, CoordinationError> {
        let orphans: Vec<(String, String)> = {
            let state = self.state.lock();
            state
                .owners
                .iter()
                .filter(|(_, owner)| {
                    !state.brokers.contains_key(*owner) || state.liveness.is_dead(owner)
                })
                .map(|(k, o)| (k.clone(), o.clone()))
                .collect()
        };
        let mut planned = std::collections::HashMap::new();
        let mut moved = 0;
        for (key, dead) in orphans {
            let (record, _) = self.read_record(&key).await?;
            if record.dst.as_deref() != Some(dead.as_str()) || !record.state.active() {
                continue;
            }
            let Some(to) = self.pick_destination(&key, &dead, &planned, None) else { continue };
            let Ok(next) = record.take_over(&dead, &to.id) else { continue };
            if next.state == UnitState::Assigning
                && self.write_transition(&key, record.version, &next, &to).await?
            {
                *planned.entry(to.id.clone()).or_default() += 1;
                moved += 1;
                tracing::info!(bundle = %key, %dead, to = %to.id, "dead broker's bundle reassigned");
            }
        }
        Ok(moved)
    }
}

async fn run(this: Weak<ClusterOwnership>, loads: Arc<dyn TopicLoads>, config: LoadManagerConfig) {
    let mut shedder = Shedder::new(config.shedder.clone());
    let mut usage = ProcessUsage::default();
    let started = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(config.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(this) = this.upgrade() else { return };
        let report = this.report(loads.as_ref(), usage.sample(), config.bandwidth_limit);
        if let Err(error) = this.write_report(&report).await {
            tracing::warn!(%error, "load report not written");
        }
        let leader = match this.elect().await {
            Ok(leader) => leader,
            Err(error) => {
                tracing::warn!(%error, "leader election failed");
                continue;
            }
        };
        if leader.as_deref() != Some(this.me.id.as_str()) {
            shedder = Shedder::new(config.shedder.clone()); // a new leader starts afresh
            continue;
        }
        if let Err(error) = this.reassign_dead().await {
            tracing::warn!(%error, "dead brokers' bundles not reassigned");
        }
        if let Err(error) = this.move_misplaced().await {
            tracing::warn!(%error, "bundles the isolation policies disallow not moved");
        }
        match this.read_reports().await {
            Ok(reports) => {
                // A split's halves are the owner's once it sees them: no shedding meanwhile.
                if this.split_hot_bundles(&reports, &config.split).await > 0 {
                    continue;
                }
                if !config.shedding_enabled {
                    continue;
                }
                let now_ms = started.elapsed().as_millis() as u64;
                let may_own = |bundle: &str, to: &str| this.may_own(bundle, to);
                let transfers = shedder.decide(&reports, now_ms, &may_own);
                this.apply(transfers).await;
            }
            Err(error) => tracing::warn!(%error, "load reports not read"),
        }
    }
}

/// This process's CPU (share of all cores since the last sample) and memory (share of the
/// machine's), from `/proc`; zeros where `/proc` is not there.
#[derive(Default)]
struct ProcessUsage {
    last: Option<(std::time::Instant, u64)>,
}

impl ProcessUsage {
    fn sample(&mut self) -> (f64, f64) {
        let now = std::time::Instant::now();
        let ticks = cpu_ticks();
        let cpu = match (self.last, ticks) {
            (Some((at, before)), Some(ticks)) => {
                let seconds = now.duration_since(at).as_secs_f64().max(1e-3);
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
                // /proc counts in USER_HZ, 100 per second on Linux.
                (ticks.saturating_sub(before) as f64 / 100.0 / seconds / cores).min(1.0)
            }
            _ => 0.0,
        };
        if let Some(ticks) = ticks {
            self.last = Some((now, ticks));
        }
        (cpu, memory_share().unwrap_or(0.0))
    }
}

fn cpu_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

fn memory_share() -> Option<f64> {
    let kib = |text: &str, field: &str| -> Option<f64> {
        let line = text.lines().find(|l| l.starts_with(field))?;
        line.split_whitespace().nth(1)?.parse::<f64>().ok()
    };
    let rss = kib(&std::fs::read_to_string("/proc/self/status").ok()?, "VmRSS:")?;
    let total = kib(&std::fs::read_to_string("/proc/meminfo").ok()?, "MemTotal:")?;
    (total > 0.0).then(|| rss / total)
}

#[cfg(test)]
mod tests {
    #[test]
    fn process_usage_reads_proc() {
        if std::path::Path::new("/proc/self/stat").exists() {
            assert!(super::cpu_ticks().is_some());
            let share = super::memory_share().expect("a memory share");
            assert!(share > 0.0 && share < 1.0, "{share}");
        }
    }
}
