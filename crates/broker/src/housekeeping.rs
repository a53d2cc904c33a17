//! The broker's housekeeping: one background task that, every
//! `retention_check_interval_seconds`, rolls over the ledgers of topics whose writer went idle
//! (so their data can go), trims what retention lets go, and every
//! `delete_inactive_topics_frequency_seconds` deletes the topics that stayed inactive, and
//! starts a compaction of each topic whose bytes not compacted passed its `compactionThreshold`
//! every `compaction_check_interval_seconds`.
//!
//! Never on the publish path: a pass reads memory, writes each trimmed topic's ledger list
//! (twice: see `ManagedLedger::trim`) and deletes at most `retention_max_deletes_per_pass`
//! ledgers per topic. The ledger store frees the journal segments the deleted ledgers leave
//! dead (and compacts mostly-dead ones) in its own maintenance thread.

use crate::service::BrokerService;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PassReport {
    pub ledgers_rolled: usize,
    pub ledgers_trimmed: usize,
    pub topics_deleted: usize,
    pub compactions_started: usize,
}

/// Starts the housekeeping task; it ends when the service is dropped.
pub fn start(service: &Arc<BrokerService>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(run(Arc::downgrade(service)))
}

async fn run(service: Weak<BrokerService>) {
    let (interval, inactive_every, compaction_every) = {
        let Some(service) = service.upgrade() else { return };
        let interval = service.config.retention_check_interval_seconds.max(1);
        let inactive = service.config.delete_inactive_topics_frequency_seconds;
        let compaction = service.config.compaction_check_interval_seconds;
        (
            Duration::from_secs(interval),
            inactive.div_ceil(interval).max(1),
            compaction.div_ceil(interval).max(1),
        )
    };
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await; // the first tick is immediate
    let mut round = 0u64;
    loop {
        ticks.tick().await;
        round += 1;
        let Some(service) = service.upgrade() else { return };
        let mut report = pass(&service, round.is_multiple_of(inactive_every)).await;
        if round.is_multiple_of(compaction_every) {
            report.compactions_started = start_due_compactions(&service);
        }
        if report != PassReport::default() {
            tracing::info!(?report, "housekeeping pass");
        }
    }
}

/// One pass over the loaded topics; `check_inactive`: also delete inactive topics.
pub async fn pass(service: &BrokerService, check_inactive: bool) -> PassReport {
    let mut report = PassReport::default();
    let rollover_after = Duration::from_secs(service.config.max_ledger_rollover_minutes * 60);
    for topic in service.loaded_topics() {
        if topic.is_deleted() || topic.is_fenced() {
            continue;
        }
        if check_inactive {
            if let Some(policy) = topic.policies().inactive_topic {
                if topic.inactive_for_deletion(&policy) {
                    match service.delete_topic(&topic.name, false).await {
                        Ok(true) => {
                            tracing::info!(topic = %topic.full_name, "deleted inactive topic");
                            report.topics_deleted += 1;
                            continue;
                        }
                        Ok(false) => continue,
                        // A client came back meanwhile (or the delete failed): next time.
                        Err(error) => {
                            tracing::debug!(topic = %topic.full_name, %error, "inactive topic kept")
                        }
                    }
                }
            }
        }
        if service.config.max_ledger_rollover_minutes > 0
            && topic.managed_ledger.roll_over_if_older_than(rollover_after)
        {
            report.ledgers_rolled += 1;
        }
        match topic.trim(service.config.retention_max_deletes_per_pass).await {
            Ok(trimmed) => report.ledgers_trimmed += trimmed,
            Err(error) => tracing::warn!(topic = %topic.full_name, %error, "trimming failed"),
        }
    }
    report
}

/// Starts a compaction of every loaded topic whose bytes after its compaction horizon passed
/// its `compactionThreshold` (Pulsar's `checkCompaction`); returns how many started.
pub fn start_due_compactions(service: &BrokerService) -> usize {
    let mut started = 0;
    for topic in service.loaded_topics() {
        if topic.is_deleted() || topic.is_fenced() {
            continue;
        }
        let threshold = topic.policies().compaction_threshold;
        if threshold == 0 || topic.compaction.status().0 == magnetar_compaction::RunStatus::Running
        {
            continue;
        }
        let uncompacted = topic.compaction.uncompacted_bytes();
        if magnetar_compaction::compaction_due(threshold, uncompacted)
            && topic.compaction.start().is_ok()
        {
            tracing::info!(topic = %topic.full_name, threshold, uncompacted, "compaction started (threshold)");
            started += 1;
        }
    }
    started
}

/// Loads every persistent topic whose ledger list still names ledgers to delete (a trim cut
/// short by a crash), so that its load finishes the deletion even if no client ever uses the
/// topic again. Only where this broker owns every topic (standalone): loading a topic takes
/// it over. Returns how many topics it loaded.
pub async fn finish_interrupted_trims(service: &BrokerService) -> usize {
    let metadata = &service.metadata;
    let root = magnetar_model::keys::MANAGED_LEDGERS_ROOT;
    let mut loaded = 0;
    let domain = "persistent";
    let domain_key = magnetar_model::keys::child(root, domain);
    let Ok(tenants) = metadata.list_children(&domain_key).await else { return 0 };
    for tenant in tenants {
        let tenant_key = magnetar_model::keys::child(&domain_key, &tenant);
        let Ok(namespaces) = metadata.list_children(&tenant_key).await else { continue };
        for namespace in namespaces {
            let namespace_key = magnetar_model::keys::child(&tenant_key, &namespace);
            let Ok(topics) = metadata.list_children(&namespace_key).await else { continue };
            for encoded in topics {
                let key = magnetar_model::keys::child(&namespace_key, &encoded);
                let Ok(Some(found)) = metadata.get(&key).await else { continue };
                let pending = serde_json::from_slice::<serde_json::Value>(&found.value)
                    .ok()
                    .and_then(|v| v.get("deleting").and_then(|d| d.as_array()).map(Vec::len))
                    .unwrap_or(0);
                if pending == 0 {
                    continue;
                }
                let local = magnetar_model::keys::decode_topic_name(&encoded).unwrap_or(encoded);
                let full = format!("{domain}://{tenant}/{namespace}/{local}");
                match magnetar_model::TopicName::parse(&full) {
                    Ok(name) => match service.topic(&name, false).await {
                        Ok(_) => loaded += 1,
                        Err(error) => {
                            tracing::warn!(topic = %full, %error, "interrupted trim not finished")
                        }
                    },
                    Err(error) => tracing::warn!(key, %error, "unparsable topic name"),
                }
            }
        }
    }
    if loaded > 0 {
        tracing::info!(topics = loaded, "finished trims a crash had interrupted");
    }
    loaded
}
