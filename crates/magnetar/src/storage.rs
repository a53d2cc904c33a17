//! `magnetar storage`: a storage node. Opens its ledger store (journal, fsync before every
//! acknowledgement), binds the storage protocol, registers in etcd when given a cluster, and
//! serves until SIGINT/SIGTERM. Everything is checked before any file is opened, and in a
//! cluster the data directory's cookie before the ledger store is (`cookie.rs`).

use anyhow::Context;
use magnetar_ledger::LedgerStore;
use magnetar_ledger_replicated::autorecovery::AutoRecoveryStats;
use magnetar_metadata::{MetadataStore, SessionStore};
use magnetar_metadata_etcd::{parse_metadata_url, EtcdStoreConfig};
use magnetar_metrics::{Exposition, Format};
use magnetar_model::storage_nodes::StorageNodeRegistration;
use magnetar_replication::NodeId;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::cli::StorageArgs;
use crate::config::ConfigError;

const NODE_ID_FILE: &str = "node-id";
/// How often free disk space is measured (read-only mode). A node that reaches ENOSPC before it
/// sees the threshold stops (a failed journal takes nothing more), so the check runs often
/// enough that the default 1 GiB threshold would take 10 GiB/s of adds to overrun; a
/// measurement is one `statvfs` on the blocking pool (microseconds).
const SPACE_CHECK_EVERY: Duration = Duration::from_millis(100);

/// How long a start keeps trying a metadata step whose request timed out or failed in
/// transit: requests sent to an etcd member that stopped answering (frozen, cut off) time out
/// until the client's keep-alive (15 s) gives up its connection and the others serve them. The
/// nemesis found nodes that could not start while one member of three was frozen.
const START_RETRY_FOR: Duration = Duration::from_secs(30);

/// `attempt` until it succeeds, fails with an error `transient` does not pick, or
/// [`START_RETRY_FOR`] has passed (then its last error). Each step retried this way must be
/// safe to run again after an unknown outcome (the cookie check and the registration are).
async fn retry_at_start<T, E, Fut>(
    step: &str,
    mut attempt: impl FnMut() -> Fut,
    transient: impl Fn(&E) -> bool,
) -> Result<T, E>
where
    Fut: std::future::Future<Output = Result<T, E>>,
    E: std::fmt::Display,
{
    let deadline = tokio::time::Instant::now() + START_RETRY_FOR;
    loop {
        match attempt().await {
            Err(error) if transient(&error) && tokio::time::Instant::now() < deadline => {
                tracing::warn!(step, %error, "metadata store not answering at start-up; trying again");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            outcome => return outcome,
        }
    }
}

pub fn run(args: StorageArgs) -> anyhow::Result<()> {
    if args.audit_interval_seconds == 0 {
        anyhow::bail!("--audit-interval-seconds must be at least 1");
    }
    anyhow::ensure!(args.worker_threads != Some(0), "--worker-threads must be at least 1");
    // Fail-stop: a panic on any thread (a journal thread's broken invariant, say) ends the
    // node at once instead of leaving it up with a dead journal, answering nothing.
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        std::process::abort();
    }));
    let etcd = match (&args.metadata, &args.cluster) {
        (Some(url), Some(cluster)) => {
            let endpoints = parse_metadata_url(url).map_err(ConfigError::from)?;
            if !magnetar_model::names::is_valid_entity_name(cluster) {
                return Err(ConfigError::ClusterName(cluster.clone()).into());
            }
            Some((EtcdStoreConfig::new(endpoints, cluster), cluster.clone()))
        }
        _ => None,
    };
    let (store_config, tls, plain_clients) =
        crate::config::storage_node_config(args.config.as_deref(), &args.data_dir)?;
    store_config.validate().context("ledger store configuration")?;
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("create data dir {}", args.data_dir.display()))?;
    // Before the node reads its identity: one process per data directory.
    let _data_dir_lock = magnetar_ledger::DirLock::acquire(&args.data_dir)?;
    let (node, drawn) = node_id(&args.data_dir, args.node_id)?;

    let runtime = match args.worker_threads {
        Some(1) => tokio::runtime::Builder::new_current_thread().enable_all().build()?,
        Some(n) => {
            tokio::runtime::Builder::new_multi_thread().worker_threads(n).enable_all().build()?
        }
        // At least two: the node task writes a lone add's group itself, blocking its worker
        // for the write (a disk that stalls must not stall reading, metrics and the etcd lease).
        None => {
            let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(cores.max(2))
                .enable_all()
                .build()?
        }
    };
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&args.listen)
            .await
            .with_context(|| format!("listen on {}", args.listen))?;
        let bound = listener.local_addr()?;
        let host = args.advertised_address.clone().unwrap_or_else(|| bound.ip().to_string());
        let address = format!("{host}:{}", bound.port());
        let metadata = match &etcd {
            Some((config, cluster)) => {
                Some(Arc::new(crate::server::connect_etcd(config, cluster).await?))
            }
            None => None,
        };
        if let (Some(etcd), Some(cluster)) = (&metadata, &args.cluster) {
            let start = retry_at_start(
                "cookie check",
                || {
                    magnetar_storage_node::cookie::check_or_create(
                        etcd.as_ref(),
                        &args.data_dir,
                        node,
                        cluster,
                        &address,
                    )
                },
                |e| {
                    matches!(
                        e,
                        magnetar_storage_node::cookie::CookieError::Metadata(
                            magnetar_metadata::MetadataError::Io { .. }
                        )
                    )
                },
            )
            .await?;
            tracing::info!(?start, "storage node cookie checked");
        }
        if drawn {
            keep_node_id(&args.data_dir, node)?;
        }
        let (store, recovery) =
            tokio::task::spawn_blocking(move || LedgerStore::open(store_config))
                .await?
                .context("open ledger store")?;
        tracing::info!(?recovery, "ledger store recovered");
        let store = Arc::new(store);
        let free = magnetar_ledger::store::free_bytes(&args.data_dir)
            .with_context(|| format!("free space of {}", args.data_dir.display()))?;
        let space = magnetar_storage_node::DiskSpace::new(args.min_free_mb << 20, free);
        // A store that opened without room for its reserve: read-only from the start.
        space.observe(free, store.short_of_disk().is_some());
        let asked = store.clone();
        let watcher = space.clone().watch(args.data_dir.clone(), SPACE_CHECK_EVERY, move || {
            asked.short_of_disk().is_some()
        });
        let registration = match &metadata {
            Some(etcd) => {
                let session: Arc<dyn SessionStore> = etcd.clone();
                let refresh = Duration::from_secs(args.refresh_seconds);
                let registration = StorageNodeRegistration {
                    address: address.clone(),
                    rack: args.rack.clone(),
                    tls: tls.is_some(),
                    plain_clients,
                    free_bytes: 0,
                    read_only: false,
                };
                Some(
                    retry_at_start(
                        "registration",
                        || {
                            magnetar_storage_node::register(
                                session.clone(),
                                node,
                                registration.clone(),
                                space.clone(),
                                refresh,
                            )
                        },
                        |e| matches!(e, magnetar_metadata::MetadataError::Io { .. }),
                    )
                    .await
                    .context("register the storage node")?,
                )
            }
            None => None,
        };
        // Auto-recovery: the cluster's auditor (if elected) and a re-replication worker.
        let autorecovery = match (&metadata, args.no_autorecovery) {
            (Some(etcd), false) => {
                let store: Arc<dyn MetadataStore> = etcd.clone();
                let config = magnetar_ledger_replicated::ReplicatedConfig::default();
                let ledgers = magnetar_ledger_replicated::ReplicatedLedgers::start(store, config)
                    .await
                    .context("auto-recovery: find the storage nodes")?;
                let config = magnetar_ledger_replicated::autorecovery::AutoRecoveryConfig {
                    lost_node_recovery_delay: Duration::from_secs(
                        args.lost_node_recovery_delay_seconds,
                    ),
                    audit_interval: Duration::from_secs(args.audit_interval_seconds),
                    copy_bytes_per_second: args.rereplication_rate_mb.saturating_mul(1_000_000),
                    ..Default::default()
                };
                let session: Arc<dyn SessionStore> = etcd.clone();
                let stats = Arc::new(AutoRecoveryStats::default());
                let run = magnetar_ledger_replicated::autorecovery::run(
                    session,
                    ledgers.nodes().clone(),
                    node,
                    config,
                    stats.clone(),
                );
                Some((ledgers, stats, tokio::spawn(run)))
            }
            _ => None,
        };
        let stats = Arc::new(magnetar_storage_node::NodeStats::new(Duration::from_secs(
            args.stats_interval_seconds,
        )));
        let metrics = match &args.metrics_listen {
            Some(at) => {
                let listener = tokio::net::TcpListener::bind(at)
                    .await
                    .with_context(|| format!("metrics listener on {at}"))?;
                tracing::info!(address = %listener.local_addr()?, "metrics at /metrics");
                let scrape = Scrape {
                    node,
                    cluster: args.cluster.clone().unwrap_or_default(),
                    store: store.clone(),
                    space: space.clone(),
                    stats: stats.clone(),
                    autorecovery: autorecovery.as_ref().map(|(_, stats, _)| stats.clone()),
                };
                Some(tokio::spawn(serve_metrics(listener, Arc::new(scrape))))
            }
            None => None,
        };
        // The line test harnesses and operators wait for.
        tracing::info!(tls = tls.is_some(), plain_clients, "storage protocol listener");
        println!("storage node {} listening on {address}", node.0);
        let gc = metadata.as_ref().map(|etcd| magnetar_storage_node::GarbageCollection {
            metadata: etcd.clone(),
            every: Duration::from_secs(args.gc_seconds),
        });
        let listener = magnetar_storage_node::Listener { tcp: listener, tls, plain_clients };
        let served =
            magnetar_storage_node::serve(node, store.clone(), space, listener, gc, stats, async {
                if let Err(e) = crate::shutdown_signal().await {
                    tracing::warn!(error = %e, "no signal handler; serving until killed");
                    std::future::pending::<()>().await;
                }
            })
            .await;
        watcher.abort();
        if let Some((_ledgers, _, task)) = autorecovery {
            task.abort();
        }
        if let Some(task) = metrics {
            task.abort();
        }
        if let Some(task) = registration {
            task.abort();
        }
        if let Some(etcd) = metadata {
            let _ = etcd.close().await;
        }
        let stats = store.journal().stats();
        tracing::info!(
            groups = stats.groups.load(std::sync::atomic::Ordering::Relaxed),
            records = stats.records.load(std::sync::atomic::Ordering::Relaxed),
            bytes = stats.bytes.load(std::sync::atomic::Ordering::Relaxed),
            "journal totals (one fdatasync per group)"
        );
        let closing = store.clone();
        tokio::task::spawn_blocking(move || closing.close()).await?;
        served.context("storage node")?;
        tracing::info!("storage node stopped");
        anyhow::Ok(())
    })
}

/// What a scrape of the node's `/metrics` reads.
struct Scrape {
    node: NodeId,
    cluster: String,
    store: Arc<LedgerStore>,
    space: Arc<magnetar_storage_node::DiskSpace>,
    stats: Arc<magnetar_storage_node::NodeStats>,
    autorecovery: Option<Arc<AutoRecoveryStats>>,
}

impl Scrape {
    fn render(&self, format: Format) -> String {
        let node = self.node.0.to_string();
        let both = [("cluster", self.cluster.as_str()), ("node", node.as_str())];
        // An unregistered node (no --cluster) has no cluster to name.
        let labels: &[(&str, &str)] = if self.cluster.is_empty() { &both[1..] } else { &both };
        let mut out = Exposition::new(format);
        self.stats.write_metrics(&self.space, &mut out, labels);
        self.store.write_metrics(&mut out, labels);
        self.stats.write_bookkeeper_metrics(&self.store, &self.space, &mut out, labels);
        if let Some(autorecovery) = &self.autorecovery {
            autorecovery.write_metrics(&mut out, labels);
        }
        out.finish()
    }
}

async fn serve_metrics(listener: tokio::net::TcpListener, scrape: Arc<Scrape>) {
    use axum::http::{header, HeaderMap};
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move |headers: HeaderMap| async move {
            let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
            let format = Format::negotiate(accept);
            // The disk-usage gauge walks the data directory: off the runtime's threads.
            let body = tokio::task::spawn_blocking(move || scrape.render(format))
                .await
                .unwrap_or_default();
            ([(header::CONTENT_TYPE, format.content_type())], body)
        }),
    );
    if let Err(e) = axum::serve(listener, app).await {
        tracing::warn!(error = %e, "metrics listener stopped");
    }
}

/// The node's identity: kept in DATA_DIR/node-id, or else `given`, or else drawn at random;
/// true when it is not kept yet ([`keep_node_id`] once the cookie check let it start).
fn node_id(data_dir: &Path, given: Option<u64>) -> anyhow::Result<(NodeId, bool)> {
    let path = data_dir.join(NODE_ID_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let stored: u64 = text
                .trim()
                .parse()
                .with_context(|| format!("{} is not a node id", path.display()))?;
            if let Some(given) = given.filter(|&g| g != stored) {
                anyhow::bail!("--node-id {given} does not match {} in {}", stored, path.display());
            }
            Ok((NodeId(stored), false))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Ok((NodeId(given.unwrap_or_else(|| rand::random::<u64>() >> 24)), true))
        }
        Err(e) => Err(e).with_context(|| format!("read {}", path.display())),
    }
}

/// Writes DATA_DIR/node-id durably.
fn keep_node_id(data_dir: &Path, node: NodeId) -> anyhow::Result<()> {
    let text = format!("{}\n", node.0);
    magnetar_journal::storage::write_file_atomic(data_dir, NODE_ID_FILE, text.as_bytes())
        .with_context(|| format!("write {}", data_dir.join(NODE_ID_FILE).display()))
}
