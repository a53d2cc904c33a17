//! Runs a [`Recovery`] to its end: the ledger closed (by this recovery or another), or an
//! error when the metadata store or too many nodes stay unreachable past the deadline.

use crate::meta::{self, read_meta};
use crate::nodes::Nodes;
use crate::stats::RecoveryOutcome;
use magnetar_ledger::LedgerError;
use magnetar_metadata::MetadataStore;
use magnetar_replication::message::{RequestId, Response};
use magnetar_replication::meta::{LedgerMeta, LedgerState};
use magnetar_replication::recovery::{Recovery, RecoveryAction, RecoveryConfig};
use magnetar_replication::{LedgerId, MetaWrite, NodeId};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

enum Input {
    Reply { node: NodeId, request: RequestId, response: Option<Response> },
    MetaWritten(MetaWrite),
    MetaRead(LedgerMeta, u64),
}

/// How a recovery ended: the closed metadata, by whom, and the entries it wrote back.
pub(crate) struct Recovered {
    pub meta: LedgerMeta,
    pub outcome: RecoveryOutcome,
    pub written_back: u64,
}

/// Recovers and closes `ledger`.
pub(crate) async fn recover(
    id: LedgerId,
    metadata: Arc<dyn MetadataStore>,
    nodes: Arc<Nodes>,
    config: RecoveryConfig,
    tick: Duration,
    deadline: Duration,
) -> Result<Recovered, LedgerError> {
    let started = Instant::now();
    let now_ms = || started.elapsed().as_millis() as u64;
    let (meta, version) = read_meta(&*metadata, id).await?.ok_or(LedgerError::NoSuchLedger(id))?;
    // The core ends at once for a closed ledger (a graceful hand-over): nothing recovered.
    let closed_before = meta.state == LedgerState::Closed;
    let (inputs, mut receiver) = mpsc::unbounded_channel();
    let mut out = Vec::new();
    let mut core = Recovery::start(id, meta, version, config, &mut out);
    // Every live node: the core keeps a replacement to the ledger's groups (its metadata's).
    core.set_live_nodes(nodes.live());
    let mut ticks = tokio::time::interval(tick);
    loop {
        for action in out.drain(..) {
            match action {
                RecoveryAction::Send { to, request, body } => {
                    let inputs = inputs.clone();
                    nodes.send(
                        to,
                        &body,
                        Box::new(move |response| {
                            let _ = inputs.send(Input::Reply { node: to, request, response });
                        }),
                    );
                }
                RecoveryAction::WriteMeta { meta, expected_version } => {
                    let inputs = inputs.clone();
                    meta::spawn_write(
                        metadata.clone(),
                        id,
                        meta,
                        expected_version,
                        move |result| {
                            let _ = inputs.send(Input::MetaWritten(result));
                        },
                    );
                }
                RecoveryAction::ReadMeta => {
                    let inputs = inputs.clone();
                    meta::spawn_read(metadata.clone(), id, move |meta, version| {
                        let _ = inputs.send(Input::MetaRead(meta, version));
                    });
                }
                RecoveryAction::Done { meta, .. } => {
                    let written_back = core.written_back();
                    tracing::info!(
                        ledger = id,
                        last_entry = ?meta.last_entry_id,
                        written_back,
                        took_ms = started.elapsed().as_millis() as u64,
                        "ledger recovered and closed"
                    );
                    let outcome = match closed_before {
                        true => RecoveryOutcome::AlreadyClosed,
                        false => RecoveryOutcome::Closed,
                    };
                    return Ok(Recovered { meta, outcome, written_back });
                }
                RecoveryAction::Superseded => {
                    let within = deadline - started.elapsed().min(deadline);
                    let meta = wait_closed(&*metadata, id, within).await?;
                    let outcome = RecoveryOutcome::Superseded;
                    return Ok(Recovered { meta, outcome, written_back: core.written_back() });
                }
            }
        }
        if started.elapsed() > deadline {
            return Err(LedgerError::Unavailable(format!(
                "ledger {id}: recovery did not finish in {deadline:?}"
            )));
        }
        tokio::select! {
            Some(input) = receiver.recv() => match input {
                Input::Reply { node, request, response: Some(response) } => core.on_response(node, request, response, now_ms(), &mut out),
                Input::Reply { node, response: None, .. } => core.on_node_failed(node, now_ms(), &mut out),
                Input::MetaWritten(result) => core.on_meta_written(result, now_ms(), &mut out),
                Input::MetaRead(meta, version) => core.on_meta_read(meta, version, now_ms(), &mut out),
            },
            _ = ticks.tick() => {
                core.set_live_nodes(nodes.live());
                core.tick(now_ms(), &mut out);
            }
        }
    }
}

/// A newer recovery took over: wait for it to close the ledger.
async fn wait_closed(
    metadata: &dyn MetadataStore,
    id: LedgerId,
    within: Duration,
) -> Result<LedgerMeta, LedgerError> {
    let until = Instant::now() + within;
    loop {
        if let Some((meta, _)) = read_meta(metadata, id).await? {
            if meta.state == LedgerState::Closed {
                return Ok(meta);
            }
        }
        if Instant::now() > until {
            return Err(LedgerError::Unavailable(format!(
                "ledger {id}: another recovery did not close it in time"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
