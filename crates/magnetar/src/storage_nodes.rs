//! `magnetar storage-nodes …`: decommissioning storage nodes from the command line, straight on
//! the cluster's etcd (as `metadata init`); the admin API's `/admin/v2/bookies/{bookie}/…`
//! routes run the same code (`magnetar_admin::storage_nodes`).

use std::time::{Duration, Instant};

use anyhow::Context;
use magnetar_admin::storage_nodes::{self, DrainStatus};
use magnetar_autorecovery::DrainState;
use magnetar_metadata::MetadataStore;
use magnetar_metadata_etcd::{parse_metadata_url, EtcdStoreConfig};
use magnetar_model::names::is_valid_entity_name;

use crate::cli::{StorageNodeTarget, StorageNodesCommand};
use crate::config::ConfigError;

/// How often `decommission --wait-seconds` looks again.
const POLL_EVERY: Duration = Duration::from_secs(1);

pub fn run(command: StorageNodesCommand) -> anyhow::Result<()> {
    let target = match &command {
        StorageNodesCommand::Decommission { node, .. }
        | StorageNodesCommand::Status { node }
        | StorageNodesCommand::Cancel { node }
        | StorageNodesCommand::Remove { node } => node,
    };
    let etcd = etcd_config(target)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let store = crate::server::connect_etcd(&etcd, &target.cluster).await?;
        let result = run_on(&store, &command, target).await;
        let _ = store.close().await;
        result
    })
}

fn etcd_config(target: &StorageNodeTarget) -> anyhow::Result<EtcdStoreConfig> {
    let endpoints = parse_metadata_url(&target.metadata).map_err(ConfigError::from)?;
    if !is_valid_entity_name(&target.cluster) {
        return Err(ConfigError::ClusterName(target.cluster.clone()).into());
    }
    Ok(EtcdStoreConfig::new(endpoints, &target.cluster))
}

async fn run_on(
    store: &dyn MetadataStore,
    command: &StorageNodesCommand,
    target: &StorageNodeTarget,
) -> anyhow::Result<()> {
    let node = storage_nodes::resolve(store, &target.node).await?;
    match command {
        StorageNodesCommand::Decommission { wait_seconds, .. } => {
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            storage_nodes::start(store, &node, now_ms).await?;
            println!("storage node {} ({}) is being decommissioned", node.id, node.address);
            let Some(wait) = wait_seconds else {
                print_status(&storage_nodes::status(store, &node).await?);
                return Ok(());
            };
            let deadline = Instant::now() + Duration::from_secs(*wait);
            loop {
                let status = storage_nodes::status(store, &node).await?;
                if status.state != DrainState::Draining {
                    print_status(&status);
                    return Ok(());
                }
                if Instant::now() >= deadline {
                    print_status(&status);
                    anyhow::bail!(
                        "storage node {} still drains after {wait} s: {} closed and {} open \
                         ledgers name it (an open ledger's earlier fragments move once it is \
                         closed: unload its topic)",
                        node.id,
                        status.drain.closed_ledgers,
                        status.drain.open_ledgers
                    );
                }
                tokio::time::sleep(POLL_EVERY).await;
            }
        }
        StorageNodesCommand::Status { .. } => {
            print_status(&storage_nodes::status(store, &node).await?);
        }
        StorageNodesCommand::Cancel { .. } => {
            storage_nodes::cancel(store, &node).await?;
            println!("storage node {} decommissioning called off", node.id);
        }
        StorageNodesCommand::Remove { .. } => {
            storage_nodes::remove(store, &node)
                .await
                .with_context(|| format!("remove storage node {}", node.id))?;
            println!("storage node {} ({}) removed", node.id, node.address);
        }
    }
    Ok(())
}

fn print_status(status: &DrainStatus) {
    println!("{}", serde_json::to_string_pretty(&status.to_json()).expect("serializes"));
}
