//! Cluster mode: `magnetar broker` (the server of `server.rs` on etcd metadata) and
//! `magnetar metadata init` (a cluster's initial keys, as Pulsar's
//! `initialize-cluster-metadata`).

use anyhow::Context;
use magnetar_metadata::MetadataStore;
use magnetar_metadata_etcd::{parse_metadata_url, EtcdStoreConfig};
use magnetar_model::names::is_valid_entity_name;
use magnetar_model::ClusterData;

use crate::cli::{BrokerArgs, MetadataInitArgs};
use crate::config::{ConfigError, Mode, Settings};

/// `magnetar broker`: validates everything, then runs the shared server on etcd.
pub fn broker(args: BrokerArgs) -> anyhow::Result<()> {
    let mode = Mode::Broker { metadata_url: &args.metadata, cluster: &args.cluster };
    let settings = Settings::load(&args.server, mode)?;
    crate::server::run(settings, "broker")
}

/// `magnetar metadata init`: creates what is missing, prints every key with what it did.
pub fn init(args: MetadataInitArgs) -> anyhow::Result<()> {
    let endpoints = parse_metadata_url(&args.metadata).map_err(ConfigError::from)?;
    if !is_valid_entity_name(&args.cluster) {
        return Err(ConfigError::ClusterName(args.cluster.clone()).into());
    }
    let etcd = EtcdStoreConfig::new(endpoints, &args.cluster);
    let data = ClusterData {
        service_url: args.web_service_url.clone(),
        broker_service_url: args.broker_service_url.clone(),
        service_url_tls: args.web_service_url_tls.clone(),
        broker_service_url_tls: args.broker_service_url_tls.clone(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async move {
        let store = crate::server::connect_etcd(&etcd, &args.cluster).await?;
        let result = magnetar_admin::initialize_cluster(&store, &args.cluster, &data).await;
        let closed = store.close().await;
        let report = result.context("initialize the cluster metadata")?;
        closed.context("close the etcd session")?;
        println!(
            "cluster {:?} on etcd {} (keys under {}):",
            args.cluster,
            etcd.endpoints.join(","),
            etcd.root
        );
        for (key, created) in &report.keys {
            println!("  {:<9} {key}", if *created { "created" } else { "exists" });
        }
        let created = report.created();
        if created == 0 {
            println!("already initialized: nothing changed");
        } else {
            println!("initialized: {created} of {} keys created", report.keys.len());
        }
        anyhow::Ok(())
    })
}
