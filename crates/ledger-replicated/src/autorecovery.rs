//! Auto-recovery's shell (issue 48), run by every storage node: the decisions are
//! `magnetar-autorecovery`'s; here are the metadata store and the connections to the nodes.
//!
//! Each round (`audit_interval`):
//! - **auditor**: the node holding the ephemeral key [`AUDITOR_KEY`] (taken by whoever finds it
//!   free: one per cluster) reads every ledger's metadata and the registrations, and marks each
//!   ledger a lost node leaves short of copies at `/autorecovery/under-replicated/{ledger}`
//!   (the lost nodes' ids, JSON); a marker whose ledger no longer names a lost node is removed.
//! - **worker**: for each marker of a CLOSED ledger (an open one's metadata is its writer's), the
//!   first node to take its ephemeral lock
//!   (`/autorecovery/locks/{ledger}`) plans the ledger, copies each fragment entry by entry to its
//!   replacement, then swaps the replacements into the metadata by compare-and-set (against the
//!   version it planned from: a writer's change meanwhile makes it plan again next round),
//!   removes the marker and releases the lock. A session lost mid-copy drops the lock with it;
//!   a copy is idempotent (the same bytes again are answered as stored).
//!
//! Copies are throttled per node ([`Throttle`], `copy_bytes_per_second`); progress is counted in
//! [`AutoRecoveryStats`] (the node's `/metrics`). A node the operator decommissions
//! (`/storage-node-decommission/{id}`) is marked like a lost one, at once, and read from while
//! it runs (`magnetar_autorecovery::decommission`). Not yet: open ledgers' closed fragments
//! (left until the ledger closes), wiped-disk detection (a node back with a new instance).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use magnetar_autorecovery::audit::{named_nodes, under_replicated};
use magnetar_autorecovery::{plan, Auditor, CopyAction, FragmentCopy, PlanError};
use magnetar_metadata::{ExpectedVersion, MetadataError, SessionStore};
use magnetar_metrics::{Exposition, Labels};
use magnetar_replication::meta::LedgerState;
use magnetar_replication::{LedgerId, MetaWrite, NodeId, Request, Response};
use tokio::sync::mpsc;

use crate::meta::{all_ledgers, read_meta, write_meta};
use crate::Nodes;

/// Held by the cluster's auditor (ephemeral: it goes with the auditor's session).
pub const AUDITOR_KEY: &str = magnetar_model::keys::AUTORECOVERY_AUDITOR;
/// Under-replicated ledgers, one key each.
pub const UNDER_REPLICATED_ROOT: &str = magnetar_model::keys::AUTORECOVERY_UNDER_REPLICATED_ROOT;
/// A worker's lock on a ledger it re-replicates (ephemeral).
pub const LOCKS_ROOT: &str = "/autorecovery/locks";

/// Auto-recovery's settings. Defaults in [`Default`].
#[derive(Debug, Clone)]
pub struct AutoRecoveryConfig {
    /// How long a node may be unregistered before its copies are made again elsewhere
    /// (BookKeeper's `lostBookieRecoveryDelay`): a restart or an upgrade takes less. 60 s.
    pub lost_node_recovery_delay: Duration,
    /// How often the auditor looks and the workers pick up markers. 5 s.
    pub audit_interval: Duration,
    /// Entries read ahead per fragment copy. 16.
    pub copy_window: u64,
    /// How long a copy's request may go unanswered before it is asked again. 5 s.
    pub request_timeout: Duration,
    /// Bytes per second this node copies at most (so that re-replication does not starve
    /// publishing); 0: no limit. 50 MB/s.
    pub copy_bytes_per_second: u64,
}

impl Default for AutoRecoveryConfig {
    fn default() -> Self {
        AutoRecoveryConfig {
            lost_node_recovery_delay: Duration::from_secs(60),
            audit_interval: Duration::from_secs(5),
            copy_window: 16,
            request_timeout: Duration::from_secs(5),
            copy_bytes_per_second: 50_000_000,
        }
    }
}

/// Auto-recovery's progress, for the node's `/metrics`.
#[derive(Debug, Default)]
pub struct AutoRecoveryStats {
    /// 1 while this node is the cluster's auditor.
    auditor: AtomicU64,
    /// Under-replicated ledgers at the auditor's last round (0 on other nodes).
    under_replicated: AtomicU64,
    /// Nodes being decommissioned that ledgers still name, at the auditor's last round.
    draining: AtomicU64,
    rereplicated: AtomicU64,
    failed: AtomicU64,
    copied_entries: AtomicU64,
    copied_bytes: AtomicU64,
}

impl AutoRecoveryStats {
    pub fn write_metrics(&self, out: &mut Exposition, labels: Labels) {
        let load = |value: &AtomicU64| value.load(Ordering::Relaxed);
        out.gauge(
            "magnetar_autorecovery_auditor",
            "1 while this node is the cluster's auto-recovery auditor.",
            labels,
            load(&self.auditor) as f64,
        );
        out.gauge(
            "magnetar_autorecovery_under_replicated_ledgers",
            "Ledgers with a copy on a lost node, at the auditor's last round (0 elsewhere).",
            labels,
            load(&self.under_replicated) as f64,
        );
        out.gauge(
            "magnetar_autorecovery_draining_nodes",
            "Decommissioned nodes some ledger still names, at the auditor's last round (0 \
             elsewhere).",
            labels,
            load(&self.draining) as f64,
        );
        let counters: [(&'static str, &'static str, &AtomicU64); 4] = [
            (
                "magnetar_autorecovery_rereplicated_ledgers",
                "Ledgers this node re-replicated (copies made, metadata swapped).",
                &self.rereplicated,
            ),
            (
                "magnetar_autorecovery_failed_rereplications",
                "Re-replications this node gave up on for a round (tried again the next).",
                &self.failed,
            ),
            (
                "magnetar_autorecovery_copied_entries",
                "Entries this node copied to replacements.",
                &self.copied_entries,
            ),
            (
                "magnetar_autorecovery_copied_bytes",
                "Entry bytes this node copied to replacements.",
                &self.copied_bytes,
            ),
        ];
        for (name, help, value) in counters {
            out.counter(name, help, labels, load(value));
        }
    }
}

/// Runs auto-recovery for the node `me` until the task is dropped, counting into `stats`.
pub async fn run(
    metadata: Arc<dyn SessionStore>,
    nodes: Arc<Nodes>,
    me: NodeId,
    config: AutoRecoveryConfig,
    stats: Arc<AutoRecoveryStats>,
) {
    let started = Instant::now();
    let mut auditor = Auditor::new(config.lost_node_recovery_delay.as_millis() as u64);
    let throttle = tokio::sync::Mutex::new(Throttle::new(config.copy_bytes_per_second));
    let mut interval = tokio::time::interval(config.audit_interval);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let now_ms = started.elapsed().as_millis() as u64;
        if let Err(error) = audit(&*metadata, me, &mut auditor, now_ms, &stats).await {
            tracing::warn!(%error, "auto-recovery: audit round failed");
        }
        if let Err(error) = work(&*metadata, &nodes, &config, &stats, &throttle).await {
            tracing::warn!(%error, "auto-recovery: re-replication round failed");
        }
    }
}

/// One auditor round, if this node is (or becomes) the auditor.
async fn audit(
    metadata: &dyn SessionStore,
    me: NodeId,
    auditor: &mut Auditor,
    now_ms: u64,
    stats: &AutoRecoveryStats,
) -> Result<(), MetadataError> {
    let mine = Bytes::from(me.0.to_string());
    match metadata.put_ephemeral(AUDITOR_KEY, mine.clone(), ExpectedVersion::Absent).await {
        Ok(_) => tracing::info!(node = %me, "auto-recovery: this node is the auditor"),
        Err(MetadataError::BadVersion { .. }) => {
            let holder = metadata.get(AUDITOR_KEY).await?.map(|found| found.value);
            if holder.as_ref() != Some(&mine) {
                stats.auditor.store(0, Ordering::Relaxed);
                stats.under_replicated.store(0, Ordering::Relaxed);
                stats.draining.store(0, Ordering::Relaxed);
                return Ok(());
            }
        }
        Err(e) => return Err(e),
    }
    // Registered, whether this node can reach it or not (a TLS-only node it has no TLS for is
    // not lost).
    let root = magnetar_model::keys::STORAGE_NODES_ROOT;
    let registered: BTreeSet<NodeId> = (metadata.list_children(root).await?.iter())
        .filter_map(|child| child.parse::<u64>().ok().map(NodeId))
        .collect();
    let ledgers = all_ledgers(metadata).await?;
    let named = named_nodes(ledgers.values());
    let mut moving = auditor.observe(&named, &registered, &BTreeSet::new(), now_ms);
    // Decommissioned nodes' copies move at once, whether the node still runs or not.
    let decommissioned = (metadata
        .list_children(magnetar_model::keys::STORAGE_NODE_DECOMMISSION_ROOT))
    .await?
    .iter()
    .filter_map(|child| child.parse::<u64>().ok().map(NodeId))
    .filter(|node| named.contains(node))
    .collect::<BTreeSet<_>>();
    stats.draining.store(decommissioned.len() as u64, Ordering::Relaxed);
    moving.extend(decommissioned);
    let short = under_replicated(&ledgers, &moving);
    stats.auditor.store(1, Ordering::Relaxed);
    stats.under_replicated.store(short.len() as u64, Ordering::Relaxed);
    for (ledger, gone) in &short {
        let key = format!("{UNDER_REPLICATED_ROOT}/{ledger}");
        let value: Vec<u64> = gone.iter().map(|n| n.0).collect();
        let value = Bytes::from(serde_json::to_vec(&value).expect("ids serialize"));
        if metadata.get(&key).await?.map(|f| f.value) != Some(value.clone()) {
            tracing::warn!(ledger, lost = ?gone, "auto-recovery: ledger under-replicated");
            metadata.put(&key, value, ExpectedVersion::Any).await?;
        }
    }
    for ledger in metadata.list_children(UNDER_REPLICATED_ROOT).await? {
        let known = ledger.parse::<LedgerId>().is_ok_and(|id| short.contains_key(&id));
        if !known {
            let key = format!("{UNDER_REPLICATED_ROOT}/{ledger}");
            match metadata.delete(&key, ExpectedVersion::Any).await {
                Ok(()) | Err(MetadataError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// One worker round: every marked ledger whose lock this node takes.
async fn work(
    metadata: &dyn SessionStore,
    nodes: &Nodes,
    config: &AutoRecoveryConfig,
    stats: &AutoRecoveryStats,
    throttle: &tokio::sync::Mutex<Throttle>,
) -> Result<(), MetadataError> {
    for ledger in metadata.list_children(UNDER_REPLICATED_ROOT).await? {
        let Ok(id) = ledger.parse::<LedgerId>() else { continue };
        let Some(marker) = metadata.get(&format!("{UNDER_REPLICATED_ROOT}/{id}")).await? else {
            continue;
        };
        let Ok(lost) = serde_json::from_slice::<Vec<u64>>(&marker.value) else { continue };
        let lost: BTreeSet<NodeId> = lost.into_iter().map(NodeId).collect();
        let lock = format!("{LOCKS_ROOT}/{id}");
        match metadata.put_ephemeral(&lock, Bytes::new(), ExpectedVersion::Absent).await {
            Ok(_) => {}
            Err(MetadataError::BadVersion { .. }) => continue, // another node's
            Err(e) => return Err(e),
        }
        let outcome = rereplicate(metadata, nodes, id, &lost, config, stats, throttle).await;
        match &outcome {
            Ok(true) => {
                stats.rereplicated.fetch_add(1, Ordering::Relaxed);
                tracing::info!(ledger = id, ?lost, "auto-recovery: ledger re-replicated");
                let key = format!("{UNDER_REPLICATED_ROOT}/{id}");
                match metadata.delete(&key, ExpectedVersion::Exactly(marker.version)).await {
                    Ok(())
                    | Err(MetadataError::NotFound { .. } | MetadataError::BadVersion { .. }) => {}
                    Err(e) => tracing::warn!(ledger = id, error = %e, "auto-recovery: marker kept"),
                }
            }
            Ok(false) => {}
            Err(why) => {
                stats.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(ledger = id, %why, "auto-recovery: not re-replicated (again next round)")
            }
        }
        match metadata.delete(&lock, ExpectedVersion::Any).await {
            Ok(()) | Err(MetadataError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Plans ledger `id` and runs its copies; `Ok(true)` once the metadata names the replacements.
async fn rereplicate(
    metadata: &dyn SessionStore,
    nodes: &Nodes,
    id: LedgerId,
    lost: &BTreeSet<NodeId>,
    config: &AutoRecoveryConfig,
    stats: &AutoRecoveryStats,
    throttle: &tokio::sync::Mutex<Throttle>,
) -> Result<bool, String> {
    let Some((meta, version)) = read_meta(metadata, id).await.map_err(|e| e.to_string())? else {
        return Ok(true); // deleted: nothing to restore
    };
    // An open ledger's metadata is its writer's to change (a swap under it would conflict with
    // its next ensemble change): its copies wait until it is closed.
    if meta.state != LedgerState::Closed {
        return Ok(false);
    }
    nodes.refresh().await.map_err(|e| e.to_string())?;
    let plan = match plan(&meta, lost, &nodes.live()) {
        Ok(plan) => plan,
        Err(e @ PlanError::NoReplacement { .. }) => return Err(e.to_string()),
        Err(e) => return Err(format!("cannot be restored: {e}")),
    };
    if plan.transfers.is_empty() {
        return Ok(false); // only the writer's open fragment: its writer replaces the node
    }
    for transfer in &plan.transfers {
        copy_fragment(nodes, id, meta.epoch, transfer, config, stats, throttle).await?;
    }
    let next = plan.apply(&meta).map_err(|e| e.to_string())?;
    match write_meta(metadata, id, &next, version).await {
        MetaWrite::Written(_) => Ok(!plan.left_to_writer),
        other => Err(format!("metadata changed meanwhile: {other:?}")),
    }
}

/// One fragment's copy, driven to its end.
async fn copy_fragment(
    nodes: &Nodes,
    ledger: LedgerId,
    epoch: u64,
    transfer: &magnetar_autorecovery::Transfer,
    config: &AutoRecoveryConfig,
    stats: &AutoRecoveryStats,
    throttle: &tokio::sync::Mutex<Throttle>,
) -> Result<(), String> {
    let started = Instant::now();
    let now = || started.elapsed().as_millis() as u64;
    let timeout = config.request_timeout.as_millis() as u64;
    let (answers, mut answered) = mpsc::unbounded_channel::<(NodeId, Request, Option<Response>)>();
    let mut out = Vec::new();
    let mut copy =
        FragmentCopy::start(ledger, epoch, transfer, config.copy_window, timeout, now(), &mut out);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        for action in out.drain(..) {
            match action {
                CopyAction::Send { to, request } => {
                    if let Request::Add { data, .. } = &request {
                        throttle.lock().await.take(data.len() as u64).await;
                    }
                    let answers = answers.clone();
                    let asked = request.clone();
                    nodes.send(
                        to,
                        &request,
                        Box::new(move |answer| {
                            let _ = answers.send((to, asked, answer));
                        }),
                    );
                }
                CopyAction::Done => return Ok(()),
                CopyAction::Failed(why) => return Err(why),
            }
        }
        tokio::select! {
            Some((from, request, answer)) = answered.recv() => match request {
                Request::Add { entry, data, .. } => {
                    if matches!(answer, Some(Response::Added { .. })) {
                        stats.copied_entries.fetch_add(1, Ordering::Relaxed);
                        stats.copied_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                    }
                    copy.on_added(entry, answer, now(), &mut out)
                }
                Request::Read { entry, .. } => copy.on_read(from, entry, answer, now(), &mut out),
                _ => {}
            },
            _ = tick.tick() => copy.tick(now(), &mut out),
        }
    }
}

/// The copy rate's bound: bytes may go out at `rate` per second on average since the first.
#[derive(Debug)]
pub struct Throttle {
    rate: u64,
    since: Option<tokio::time::Instant>,
    sent: u64,
}

impl Throttle {
    /// `rate` bytes per second; 0: no bound.
    pub fn new(rate: u64) -> Throttle {
        Throttle { rate, since: None, sent: 0 }
    }

    /// Waits until `bytes` more may go out.
    pub async fn take(&mut self, bytes: u64) {
        if self.rate == 0 {
            return;
        }
        let now = tokio::time::Instant::now();
        // A pause (nothing to copy) is no credit for a burst afterwards: start again.
        if self
            .since
            .is_some_and(|since| now.duration_since(self.due(since)) > Duration::from_secs(1))
        {
            (self.since, self.sent) = (None, 0);
        }
        let since = *self.since.get_or_insert(now);
        self.sent += bytes;
        tokio::time::sleep_until(self.due(since)).await;
    }

    /// When what was sent since `since` may all have gone out.
    fn due(&self, since: tokio::time::Instant) -> tokio::time::Instant {
        since + Duration::from_secs_f64(self.sent as f64 / self.rate as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_throttle_keeps_the_average_rate() {
        let mut throttle = Throttle::new(1_000_000);
        let started = tokio::time::Instant::now();
        for _ in 0..10 {
            throttle.take(500_000).await;
        }
        // 5 MB at 1 MB/s: the last take waits until 5 s after the first.
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        let mut unbounded = Throttle::new(0);
        let again = tokio::time::Instant::now();
        unbounded.take(u64::MAX / 2).await;
        assert_eq!(again.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_pause_is_no_credit_for_a_burst() {
        let mut throttle = Throttle::new(1_000_000);
        throttle.take(1_000_000).await;
        tokio::time::sleep(Duration::from_secs(60)).await;
        let after = tokio::time::Instant::now();
        throttle.take(1_000_000).await; // forgets the pause: a fresh start
        throttle.take(1_000_000).await;
        assert_eq!(after.elapsed(), Duration::from_secs(2));
    }
}
