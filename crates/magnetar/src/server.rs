//! The server both `magnetar standalone` and `magnetar broker` run: one start-up and shutdown
//! path that differs only in the metadata store ([`MetadataBackend`]).
//!
//! Start-up, in order: the validated [`Settings`] (nothing opened before), the metadata store
//! (standalone: the embedded store, bootstrapped with `public/default`; broker: etcd, whose
//! cluster must have been initialized by `magnetar metadata init`), the ledger store, the
//! listeners, the broker's registration (an ephemeral key, `/brokers/{host}:{web-port}`,
//! see `magnetar_broker::registration`), then serving. Shutdown (SIGINT/SIGTERM): not ready,
//! listeners stop, ledger store closed, metadata store closed (which ends the session and so
//! deletes the registration).

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use bytes::Bytes;
use magnetar_admin::AdminHooks;
use magnetar_broker::registration::{Readiness, Registration};
use magnetar_broker::BrokerService;
use magnetar_ledger::{LedgerStorage, LedgerStore};
use magnetar_metadata::{
    EmbeddedStore, EmbeddedStoreConfig, ExpectedVersion, MetadataError, MetadataStore, SessionStore,
};
use magnetar_metadata_etcd::EtcdStore;
use magnetar_model::{keys, BrokerRegistration};
use thiserror::Error;

use crate::config::{MetadataBackend, Settings};

/// Start-up failures that are the operator's to fix (others carry their context as text).
/// One line each, the cause included as text (`main` prints `source` chains, which would
/// repeat it).
#[derive(Debug, Error)]
pub enum StartError {
    #[error(
        "cluster {cluster:?} is not initialized in etcd at {endpoints}: run `magnetar metadata \
         init --metadata {url} --cluster {cluster}` first"
    )]
    NotInitialized { cluster: String, endpoints: String, url: String },
    #[error("cannot reach etcd at {endpoints} (cluster {cluster:?}): {cause}")]
    EtcdUnreachable { endpoints: String, cluster: String, cause: String },
    /// This broker keeps its ledgers on its own disk, and another broker does too, or already
    /// serves the cluster: topics moved between them would lose their data.
    #[error(
        "cluster {cluster:?} already has a broker ({holder}): brokers that share a cluster keep \
         their ledgers on storage nodes ([ledgers] storage = \"nodes\"); a broker with local \
         ledgers must be the cluster's only one"
    )]
    LocalLedgersShared { cluster: String, holder: String },
    /// The cluster's ledgers are on another broker's own disk.
    #[error(
        "cluster {cluster:?} keeps its ledgers on the disk of broker {holder} \
         ([ledgers] storage = \"local\"): no other broker can serve its topics (key \
         {key} in etcd names it)"
    )]
    LedgersOnABrokersDisk { cluster: String, holder: String, key: String },
}

/// Threads for blocking work (disk reads, topic-load replays). Tokio's default is 512: 20,000
/// topics loading at once after a restart spawned 512 threads, each with its own allocator
/// arena, and RSS stayed higher after they exited. Reads are bounded by the disk, not by threads.
const MAX_BLOCKING_THREADS: usize = 64;

/// Runs the server until SIGINT or SIGTERM. `name` is the command, for the log.
pub fn run(settings: Settings, name: &'static str) -> anyhow::Result<()> {
    let started = Instant::now();
    let start_timestamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .max_blocking_threads(MAX_BLOCKING_THREADS)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let config = &settings.config;
        let metadata = open_metadata(&settings).await?;
        std::fs::create_dir_all(&config.data_dir)
            .with_context(|| format!("create data dir {}", config.data_dir.display()))?;
        let on_nodes = config.ledgers.storage == "nodes";
        if !matches!(settings.metadata, MetadataBackend::Embedded) {
            // Before any ledger is opened (the id names this broker by its configured ports).
            if on_nodes {
                refuse_a_claimed_cluster(&settings, metadata.as_ref()).await?;
            } else {
                let id = keys::broker_id(&config.broker.advertised_address, config.web_port);
                claim_ledgers(&settings, metadata.as_ref(), &id).await?;
            }
        }
        let (storage, store, recovery) = open_ledgers(&settings, &metadata).await?;

        // Bind first: the registration carries the ports really bound (port 0 picks one).
        // `[tls] plain_ports_enabled = false` leaves only the TLS listeners.
        let plain = settings.tls.is_none() || config.tls.plain_ports_enabled;
        let (broker_host, web_host) = (&config.broker.bind_address, &config.web_bind_address);
        let broker_listener = bind_if(plain, broker_host, config.broker.broker_port).await?;
        let web_listener = bind_if(plain, web_host, config.web_port).await?;
        let tls_on = settings.tls.is_some();
        let broker_listener_tls = bind_if(tls_on, broker_host, config.tls.broker_port_tls).await?;
        let web_listener_tls = bind_if(tls_on, web_host, config.tls.web_port_tls).await?;
        let mut broker_config = config.broker.clone();
        let host = broker_config.advertised_address.clone();
        if let Some(listener) = &broker_listener {
            broker_config.broker_port = listener.local_addr()?.port();
        }
        broker_config.plain_port_enabled = plain;
        let port_of = |l: &Option<tokio::net::TcpListener>| -> std::io::Result<Option<u16>> {
            l.as_ref().map(|l| l.local_addr().map(|a| a.port())).transpose()
        };
        broker_config.service_url_tls =
            port_of(&broker_listener_tls)?.map(|port| format!("pulsar+ssl://{host}:{port}"));
        let web_url_tls = port_of(&web_listener_tls)?.map(|port| format!("https://{host}:{port}"));
        // With the plain ports off, the URLs and the registration key name the TLS ones.
        let (web_port, web_url) = match (port_of(&web_listener)?, &web_url_tls) {
            (Some(port), _) => (port, format!("http://{host}:{port}")),
            (None, Some(url)) => (port_of(&web_listener_tls)?.unwrap_or_default(), url.clone()),
            (None, None) => anyhow::bail!("no web listener"),
        };
        let service_url = broker_config.service_url();
        let service_url_tls = broker_config.service_url_tls.clone();
        let listeners = broker_config.listeners();

        let readiness = Arc::new(Readiness::not_ready("starting"));
        // Every metadata write of the broker and the admin API is counted
        // (`magnetar_metadata_writes_total` on GET /metrics); the registration's ephemeral key
        // goes to the session store directly.
        let counting = magnetar_metadata::CountingStore::new(metadata.clone());
        let metrics = magnetar_broker::metrics::BrokerMetrics::counting(&counting);
        let metadata_store: Arc<dyn MetadataStore> = Arc::new(counting);
        // A cluster's brokers share topics by namespace bundle (magnetar-coordination);
        // standalone serves every topic.
        let coordination = match settings.metadata {
            MetadataBackend::Embedded => None,
            _ => {
                let me = magnetar_coordination::BrokerUrls {
                    id: keys::broker_id(&host, web_port),
                    service_url: service_url.clone(),
                    service_url_tls: service_url_tls.clone(),
                    web_url: web_url.clone(),
                    web_url_tls: web_url_tls.clone(),
                    listeners: listeners.clone(),
                };
                let config = settings.config.coordination.to_config()?;
                let started =
                    magnetar_coordination::ClusterOwnership::start(metadata.clone(), me, config)
                        .await
                        .context("start bundle ownership")?;
                Some(started)
            }
        };
        let ownership = coordination.clone().map(|c| {
            Arc::new(crate::ownership::CoordinatedOwnership(c))
                as Arc<dyn magnetar_broker::ownership::Ownership>
        });
        let service = BrokerService::build(
            broker_config,
            storage,
            metadata_store.clone(),
            readiness.clone(),
            metrics,
            ownership,
        );
        if let Some(coordination) = &coordination {
            crate::ownership::close_lost_bundles(&service, coordination);
            let loads = Arc::new(crate::ownership::ServiceLoads::new(&service));
            let config = settings.config.load_manager.to_config()?;
            coordination.start_load_manager(loads, config);
        }
        // The dynamic configuration set through any broker's admin API (`brokers
        // update-dynamic-config`) applies over the configuration file from the start.
        if let Err(error) = service.reload_dynamic_configuration().await {
            tracing::warn!(%error, "dynamic configuration not applied (the file's values stand)");
        }
        // Authorization: cached tenant / namespace documents follow their changes (a no-op
        // while authorization is disabled).
        let authorizer = service.authorizer.clone();
        tokio::spawn(async move {
            if let Err(error) = authorizer.watch().await {
                tracing::error!(%error, "authorization: cannot watch permission changes");
            }
        });
        if !matches!(settings.metadata, MetadataBackend::Embedded) {
            // Policies changed through another broker reach the topics loaded here (this
            // broker's own admin API refreshes them directly; standalone has only that).
            let service = service.clone();
            tokio::spawn(async move {
                if let Err(error) =
                    magnetar_broker::policy_watch::follow_policy_changes(service).await
                {
                    tracing::error!(%error, "cannot watch policy changes");
                }
            });
        }
        // Retention, idle-ledger rollover and inactive-topic deletion.
        magnetar_broker::housekeeping::start(&service);
        // The recent totals and topic series the web console charts (bounded, in memory).
        magnetar_broker::history::start(&service);
        if matches!(settings.metadata, MetadataBackend::Embedded) {
            // Standalone owns every topic: finish trims a crash cut short, loaded or not.
            let service = service.clone();
            tokio::spawn(async move {
                magnetar_broker::housekeeping::finish_interrupted_trims(&service).await
            });
        }
        let registration = BrokerRegistration {
            pulsar_service_url: service_url.clone(),
            web_service_url: web_url.clone(),
            pulsar_service_url_tls: service_url_tls.clone(),
            web_service_url_tls: web_url_tls.clone(),
            advertised_listeners: listeners.listeners.clone(),
            internal_listener_name: listeners.internal.clone(),
            start_timestamp,
            broker_version: env!("CARGO_PKG_VERSION").to_string(),
        };
        let registration_key = keys::broker(&host, web_port);
        let registration = Registration::start(
            metadata.clone(),
            registration_key.clone(),
            Bytes::from(serde_json::to_vec(&registration)?),
            readiness,
        )
        .await
        .with_context(|| format!("register the broker at {registration_key}"))?;
        // Written (registered), then read: of a broker with local ledgers claiming the cluster
        // and this one starting at the same moment, one sees the other.
        if on_nodes && !matches!(settings.metadata, MetadataBackend::Embedded) {
            refuse_a_claimed_cluster(&settings, metadata.as_ref()).await?;
        }

        let (stop, stopped) = tokio::sync::watch::channel(false);
        magnetar_broker::limits::spawn_tasks(&service, stopped.clone());
        let mut tasks = Vec::new();
        if let Some(listener) = broker_listener {
            tasks.push(tokio::spawn(magnetar_broker::connection::run_listener(
                service.clone(),
                listener,
                stopped.clone(),
            )));
        }
        let mut admin_state = magnetar_admin::AdminState::new(
            metadata_store.clone(),
            Arc::new(AdminHooks(service.clone())),
            config.cluster.clone(),
        )
        .with_cluster_urls(web_url.clone(), service_url.clone())
        .with_authorization(config.authorization.clone())
        .with_default_bundles(config.broker.default_number_of_namespace_bundles);
        if let (Some(web), Some(broker)) = (&web_url_tls, &service_url_tls) {
            admin_state = admin_state.with_cluster_urls_tls(web.clone(), broker.clone());
        }
        admin_state.listeners = service.listeners.clone();
        let mut router = magnetar_admin::router(admin_state);
        if let Some(authenticator) = &config.broker.authenticator {
            router = magnetar_admin::authentication::require(router, authenticator.clone());
        }
        let stop_signal = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
            let _ = stopped.changed().await;
        };
        if let Some(listener) = web_listener {
            let serve =
                magnetar_admin::serve(listener, router.clone(), stop_signal(stopped.clone()));
            tasks.push(tokio::spawn(async move {
                if let Err(error) = serve.await {
                    tracing::warn!(%error, "admin listener failed");
                }
            }));
        }
        if let (Some(tls), Some(broker), Some(web)) =
            (&settings.tls, broker_listener_tls, web_listener_tls)
        {
            tasks.push(tokio::spawn(magnetar_broker::connection::run_tls_listener(
                service.clone(),
                broker,
                tls.clone(),
                stopped.clone(),
            )));
            let serve =
                magnetar_admin::serve_tls(web, router, tls.clone(), stop_signal(stopped.clone()));
            tasks.push(tokio::spawn(async move {
                if let Err(error) = serve.await {
                    tracing::warn!(%error, "HTTPS admin listener failed");
                }
            }));
        }
        tracing::info!(
            broker = %service_url,
            broker_tls = service_url_tls.as_deref().unwrap_or("-"),
            web = %web_url,
            web_tls = web_url_tls.as_deref().unwrap_or("-"),
            cluster = %config.cluster,
            metadata = %describe(&settings.metadata),
            registration = %registration_key,
            data_dir = %config.data_dir.display(),
            ledgers = recovery.0,
            entries = recovery.1,
            ready_ms = started.elapsed().as_millis() as u64,
            "magnetar {name} ready"
        );
        crate::shutdown_signal().await?;
        tracing::info!("shutting down");
        if coordination.is_some() {
            // Hand the bundles back before the session goes: other brokers take them at once
            // instead of after the lease.
            match service.unload_bundles(None, None, None).await {
                Ok(unloaded) => tracing::info!(unloaded, "bundles released"),
                Err(error) => tracing::warn!(%error, "bundles not all released"),
            }
            if let Some(coordination) = &coordination {
                coordination.hand_overs_settled(std::time::Duration::from_secs(3)).await;
            }
        }
        registration.stop().await;
        let _ = stop.send(true);
        for task in tasks {
            let _ = task.await;
        }
        drop(service);
        if let Some(store) = store {
            tokio::task::spawn_blocking(move || store.close()).await?;
        }
        metadata.close().await.context("close metadata store")?;
        tracing::info!("stopped");
        anyhow::Ok(())
    })
}

/// Where the broker's ledgers live: its own ledger store (`[ledgers] storage = "local"`), or
/// the storage nodes registered in the cluster (`"nodes"`). The local store, if any, and what
/// its recovery found (ledgers, entries).
async fn open_ledgers(
    settings: &Settings,
    metadata: &Arc<dyn SessionStore>,
) -> anyhow::Result<(Arc<dyn LedgerStorage>, Option<Arc<LedgerStore>>, (u64, u64))> {
    let section = &settings.config.ledgers;
    if section.storage == "nodes" {
        let config = magnetar_ledger_replicated::ReplicatedConfig {
            add_timeout: std::time::Duration::from_millis(section.add_timeout_millis),
            speculative_read: std::time::Duration::from_millis(section.speculative_read_millis),
            read_timeout: std::time::Duration::from_millis(section.read_timeout_millis),
            default_write_quorum: section.write_quorum,
            tls: settings.ledger_client_tls.clone(),
            ..Default::default()
        };
        let metadata: Arc<dyn MetadataStore> = metadata.clone();
        let ledgers = magnetar_ledger_replicated::ReplicatedLedgers::start(metadata, config)
            .await
            .context("find the storage nodes")?;
        tracing::info!(
            nodes = ledgers.nodes().live().len(),
            write_quorum = section.write_quorum,
            ack_quorum = section.ack_quorum,
            "ledgers on storage nodes"
        );
        return Ok((ledgers, None, (0, 0)));
    }
    let store_config = settings.ledger.clone();
    let (store, recovery) = tokio::task::spawn_blocking(move || LedgerStore::open(store_config))
        .await?
        .context("open ledger store")?;
    let store = Arc::new(store);
    Ok((store.clone(), Some(store), (recovery.ledgers as u64, recovery.entries)))
}

/// File in a local-ledgers broker's data directory naming its ledger store (drawn at random
/// once): the identity its claim on the cluster carries, whatever ports it listens on.
const LEDGERS_INSTANCE_FILE: &str = "local-ledgers-instance";

/// What [`keys::LOCAL_LEDGERS_OWNER`] holds.
#[derive(serde::Serialize, serde::Deserialize)]
struct LocalLedgersOwner {
    instance: String,
    broker: String,
}

/// The broker a claim at [`keys::LOCAL_LEDGERS_OWNER`] names.
fn claim_holder(found: &magnetar_metadata::Versioned) -> String {
    serde_json::from_slice::<LocalLedgersOwner>(&found.value)
        .map_or_else(|_| "unknown".to_string(), |owner| owner.broker)
}

/// A broker on storage nodes is refused while a broker's own disk holds the cluster's ledgers.
async fn refuse_a_claimed_cluster(
    settings: &Settings,
    metadata: &dyn SessionStore,
) -> anyhow::Result<()> {
    let key = keys::LOCAL_LEDGERS_OWNER;
    match metadata.get(key).await? {
        Some(found) => Err(StartError::LedgersOnABrokersDisk {
            cluster: settings.config.cluster.clone(),
            holder: claim_holder(&found),
            key: key.into(),
        }
        .into()),
        None => Ok(()),
    }
}

/// In a cluster, ledgers on one broker's disk are that broker's alone: a broker with
/// `[ledgers] storage = "local"` claims the cluster, refused if another broker's disk holds it
/// or, at its first claim, if another broker is registered.
async fn claim_ledgers(
    settings: &Settings,
    metadata: &dyn SessionStore,
    broker_id: &str,
) -> anyhow::Result<()> {
    let cluster = settings.config.cluster.clone();
    let key = keys::LOCAL_LEDGERS_OWNER;
    let instance = ledgers_instance(&settings.config.data_dir)?;
    let mine = LocalLedgersOwner { instance: instance.clone(), broker: broker_id.to_string() };
    let value = Bytes::from(serde_json::to_vec(&mine)?);
    if let Some(found) = metadata.get(key).await? {
        let owner = serde_json::from_slice::<LocalLedgersOwner>(&found.value).ok();
        if owner.is_some_and(|owner| owner.instance == instance) {
            return Ok(()); // this data directory's claim: a restart
        }
        return Err(StartError::LocalLedgersShared { cluster, holder: claim_holder(&found) }.into());
    }
    match metadata.put(key, value, ExpectedVersion::Absent).await {
        Ok(_) => {}
        Err(MetadataError::BadVersion { .. }) => {
            let holder = "another broker starting now".into();
            return Err(StartError::LocalLedgersShared { cluster, holder }.into());
        }
        Err(e) => return Err(e.into()),
    }
    // The first claim: no other broker may be serving the cluster already.
    let others: Vec<String> = (metadata.list_children(keys::BROKERS_ROOT).await?.into_iter())
        .filter(|id| id != broker_id)
        .collect();
    if let Some(holder) = others.into_iter().next() {
        let _ = metadata.delete(key, ExpectedVersion::Any).await;
        return Err(StartError::LocalLedgersShared { cluster, holder }.into());
    }
    tracing::info!(key, instance, "this broker's disk holds the cluster's ledgers");
    Ok(())
}

/// The data directory's ledger-store identity, drawn and kept on first use.
fn ledgers_instance(data_dir: &std::path::Path) -> anyhow::Result<String> {
    let path = data_dir.join(LEDGERS_INSTANCE_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) if !text.trim().is_empty() => Ok(text.trim().to_string()),
        Ok(_) => anyhow::bail!("{} is empty", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let drawn = format!("{:032x}", rand::random::<u128>());
            magnetar_journal::storage::write_file_atomic(
                data_dir,
                LEDGERS_INSTANCE_FILE,
                format!("{drawn}\n").as_bytes(),
            )
            .with_context(|| format!("write {}", path.display()))?;
            Ok(drawn)
        }
        Err(e) => Err(e).with_context(|| format!("read {}", path.display())),
    }
}

/// Binds `host:port` when `wanted` (port 0 picks a free one).
async fn bind_if(
    wanted: bool,
    host: &str,
    port: u16,
) -> anyhow::Result<Option<tokio::net::TcpListener>> {
    if !wanted {
        return Ok(None);
    }
    let address = format!("{host}:{port}");
    let listener = tokio::net::TcpListener::bind(&address)
        .await
        .with_context(|| format!("listen on {address}"))?;
    Ok(Some(listener))
}

fn describe(backend: &MetadataBackend) -> String {
    match backend {
        MetadataBackend::Embedded => "embedded".to_string(),
        MetadataBackend::Etcd(etcd) => format!("etcd {} {}", etcd.endpoints.join(","), etcd.root),
    }
}

/// Opens the metadata store of `settings`: the only difference between the two commands.
async fn open_metadata(settings: &Settings) -> anyhow::Result<Arc<dyn SessionStore>> {
    let config = &settings.config;
    match &settings.metadata {
        MetadataBackend::Embedded => {
            std::fs::create_dir_all(&config.data_dir)
                .with_context(|| format!("create data dir {}", config.data_dir.display()))?;
            let store =
                EmbeddedStore::open(EmbeddedStoreConfig::new(config.data_dir.join("metadata")))
                    .await
                    .context("open metadata store")?;
            let bundles = config.broker.default_number_of_namespace_bundles;
            magnetar_admin::bootstrap_with_bundles(&store, &config.cluster, bundles)
                .await
                .context("bootstrap metadata")?;
            Ok(Arc::new(store))
        }
        MetadataBackend::Etcd(etcd) => {
            let store = connect_etcd(etcd, &config.cluster).await?;
            let initialized = magnetar_admin::cluster_initialized(&store, &config.cluster)
                .await
                .context("read the cluster record")?;
            if !initialized {
                let _ = store.close().await;
                return Err(StartError::NotInitialized {
                    cluster: config.cluster.clone(),
                    endpoints: etcd.endpoints.join(","),
                    url: format!("etcd://{}", strip_http(&etcd.endpoints).join(",")),
                }
                .into());
            }
            Ok(Arc::new(store))
        }
    }
}

/// Connects to etcd (bounded by the config's connect timeout).
pub async fn connect_etcd(
    etcd: &magnetar_metadata_etcd::EtcdStoreConfig,
    cluster: &str,
) -> Result<EtcdStore, StartError> {
    EtcdStore::connect(etcd.clone()).await.map_err(|cause| StartError::EtcdUnreachable {
        endpoints: etcd.endpoints.join(","),
        cluster: cluster.to_string(),
        cause: cause.to_string(),
    })
}

fn strip_http(endpoints: &[String]) -> Vec<&str> {
    endpoints.iter().map(|e| e.strip_prefix("http://").unwrap_or(e)).collect()
}
