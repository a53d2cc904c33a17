//! `magnetar standalone`: broker, storage and metadata in one process.

use crate::cli::StandaloneArgs;
use anyhow::Context;
use magnetar_admin::AdminHooks;
use magnetar_broker::{BrokerConfig, BrokerService};
use magnetar_journal::{JournalConfig, SyncMode};
use magnetar_ledger::{LedgerStore, LedgerStoreConfig};
use magnetar_metadata::{EmbeddedStore, EmbeddedStoreConfig, MetadataStore};
use serde::Deserialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// The standalone configuration file. Every field is optional; see magnetar.example.toml.
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StandaloneConfig {
    /// Directory for ledgers (`ledgers/`) and metadata (`metadata/`).
    pub data_dir: PathBuf,
    /// Address the HTTP admin API listens on.
    pub web_bind_address: String,
    pub web_port: u16,
    /// Cluster name reported by the admin API.
    pub cluster: String,
    pub broker: BrokerConfig,
    pub storage: StorageSection,
}

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageSection {
    /// Journal segment size in bytes.
    pub segment_size_bytes: u64,
    /// Most bytes per group commit (one write, one flush).
    pub max_group_bytes: usize,
    /// Optional wait for a group to fill, in microseconds (0: flush when idle).
    pub max_wait_micros: u64,
    /// fdatasync (default), dsync, or none (tests only: acknowledged data may be lost).
    pub sync_mode: String,
    /// Write the journal with O_DIRECT.
    pub direct_io: bool,
    /// Memory for recently appended entries served to tailing readers.
    pub write_cache_bytes: usize,
}

impl Default for StandaloneConfig {
    fn default() -> Self {
        StandaloneConfig {
            data_dir: PathBuf::from("./data"),
            web_bind_address: "127.0.0.1".into(),
            web_port: 8080,
            cluster: "standalone".into(),
            broker: BrokerConfig::default(),
            storage: StorageSection::default(),
        }
    }
}

impl Default for StorageSection {
    fn default() -> Self {
        let journal = JournalConfig::default();
        StorageSection {
            segment_size_bytes: journal.segment_size_bytes,
            max_group_bytes: journal.max_group_bytes,
            max_wait_micros: 0,
            sync_mode: "fdatasync".into(),
            direct_io: journal.direct_io,
            write_cache_bytes: LedgerStoreConfig::default().write_cache_bytes,
        }
    }
}

impl StandaloneConfig {
    fn load(args: &StandaloneArgs) -> anyhow::Result<Self> {
        let mut config = match &args.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("read config file {}", path.display()))?;
                toml::from_str(&text)
                    .with_context(|| format!("parse config file {}", path.display()))?
            }
            None => StandaloneConfig::default(),
        };
        if let Some(dir) = &args.data_dir {
            config.data_dir = dir.clone();
        }
        if let Some(port) = args.broker_port {
            config.broker.broker_port = port;
        }
        if let Some(port) = args.web_port {
            config.web_port = port;
        }
        config.broker.validate().map_err(|e| anyhow::anyhow!("broker config: {e}"))?;
        Ok(config)
    }

    fn ledger_store_config(&self) -> anyhow::Result<LedgerStoreConfig> {
        let sync_mode: SyncMode =
            self.storage.sync_mode.parse().map_err(|e: String| anyhow::anyhow!(e))?;
        let journal = JournalConfig {
            segment_size_bytes: self.storage.segment_size_bytes,
            max_group_bytes: self.storage.max_group_bytes,
            max_wait: (self.storage.max_wait_micros > 0)
                .then(|| std::time::Duration::from_micros(self.storage.max_wait_micros)),
            sync_mode,
            direct_io: self.storage.direct_io,
            ..JournalConfig::default()
        };
        Ok(LedgerStoreConfig {
            dir: self.data_dir.join("ledgers"),
            journal,
            write_cache_bytes: self.storage.write_cache_bytes,
            ..LedgerStoreConfig::default()
        })
    }
}

pub fn run(args: StandaloneArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let config = StandaloneConfig::load(&args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        std::fs::create_dir_all(&config.data_dir)
            .with_context(|| format!("create data dir {}", config.data_dir.display()))?;
        let metadata =
            EmbeddedStore::open(EmbeddedStoreConfig::new(config.data_dir.join("metadata")))
                .await
                .context("open metadata store")?;
        // Every metadata write is counted (`magnetar_metadata_writes_total` on GET /metrics).
        let metadata = magnetar_metadata::CountingStore::new(Arc::new(metadata));
        let metrics = magnetar_broker::metrics::BrokerMetrics::new(Some(metadata.write_counter()));
        let metadata: Arc<dyn MetadataStore> = Arc::new(metadata);
        magnetar_admin::bootstrap(&*metadata, &config.cluster)
            .await
            .context("bootstrap metadata")?;
        let store_config = config.ledger_store_config()?;
        let (store, recovery) =
            tokio::task::spawn_blocking(move || LedgerStore::open(store_config))
                .await?
                .context("open ledger store")?;
        let store = Arc::new(store);
        let service = BrokerService::with_metrics(
            config.broker.clone(),
            store.clone(),
            metadata.clone(),
            metrics,
        );

        let broker_address =
            format!("{}:{}", config.broker.bind_address, config.broker.broker_port);
        let broker_listener = tokio::net::TcpListener::bind(&broker_address)
            .await
            .with_context(|| format!("listen on {broker_address}"))?;
        let web_address = format!("{}:{}", config.web_bind_address, config.web_port);
        let web_listener = tokio::net::TcpListener::bind(&web_address)
            .await
            .with_context(|| format!("listen on {web_address}"))?;
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let broker_task = tokio::spawn(magnetar_broker::connection::run_listener(
            service.clone(),
            broker_listener,
            stopped.clone(),
        ));
        let admin_state = magnetar_admin::AdminState::new(
            metadata.clone(),
            Arc::new(AdminHooks(service.clone())),
            config.cluster.clone(),
        )
        .with_cluster_urls(
            format!("http://{}:{}", config.web_bind_address, config.web_port),
            config.broker.service_url(),
        );
        let mut web_stop = stopped.clone();
        let web_task = tokio::spawn(magnetar_admin::serve(
            web_listener,
            magnetar_admin::router(admin_state),
            async move {
                let _ = web_stop.changed().await;
            },
        ));
        tracing::info!(
            broker = %format!("pulsar://{broker_address}"),
            web = %format!("http://{web_address}"),
            data_dir = %config.data_dir.display(),
            ledgers = recovery.ledgers,
            entries = recovery.entries,
            ready_ms = started.elapsed().as_millis() as u64,
            "magnetar standalone ready"
        );
        crate::shutdown_signal().await?;
        tracing::info!("shutting down");
        let _ = stop.send(true);
        let _ = broker_task.await;
        let _ = web_task.await;
        drop(service);
        tokio::task::spawn_blocking(move || store.close()).await?;
        metadata.close().await.context("close metadata store")?;
        tracing::info!("stopped");
        anyhow::Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_config_lists_every_knob_with_its_default() {
        let text = include_str!("../../../magnetar.example.toml");
        let parsed: StandaloneConfig = toml::from_str(text).expect("the example parses");
        let default = StandaloneConfig::default();
        assert_eq!(format!("{parsed:?}"), format!("{default:?}"), "example and defaults differ");
        // Every field of every section appears in the example (no knob left undocumented).
        let value: toml::Value = toml::from_str(text).unwrap();
        let broker = value["broker"].as_table().unwrap();
        let storage = value["storage"].as_table().unwrap();
        let debug = format!("{:?}", default.broker);
        let broker_fields = debug.matches(": ").count();
        assert_eq!(broker.len(), broker_fields, "every broker knob is in the example");
        let debug = format!("{:?}", default.storage);
        assert_eq!(
            storage.len(),
            debug.matches(": ").count(),
            "every storage knob is in the example"
        );
    }
}
