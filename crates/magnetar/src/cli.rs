//! Command-line interface: every subcommand and flag, validated before anything starts.

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(name = "magnetar", version, about = "Pulsar-protocol messaging and streaming platform")]
pub struct Cli {
    /// Log line format: `text` (coloured only on a terminal without NO_COLOR) or `json` (one
    /// object per line, for log shippers) [default: the config's `[log] format`, else text].
    /// The filter is RUST_LOG, else the config's `[log] level`, else `info`.
    #[arg(long, global = true, value_enum)]
    pub log_format: Option<LogFormat>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run broker, storage and metadata in one process.
    Standalone(ServerArgs),
    /// Run a broker with local storage and cluster metadata on etcd (see `metadata init`).
    Broker(BrokerArgs),
    /// Run a storage node: replicated ledgers for the brokers of a cluster.
    Storage(StorageArgs),
    /// Run a proxy: one address for clients that cannot reach every broker (Pulsar's proxy).
    Proxy(ProxyArgs),
    /// Cluster metadata tools.
    #[command(subcommand)]
    Metadata(MetadataCommand),
    /// Storage node operations: decommission (drain) a node, follow its drain, remove it.
    #[command(subcommand)]
    StorageNodes(StorageNodesCommand),
    /// Benchmarks (not tests): see docs/src/benchmarks/.
    #[command(subcommand)]
    Perf(PerfCommand),
    /// Token keys and tokens, as `pulsar tokens` (see `magnetar tokens --help`).
    #[command(subcommand)]
    Tokens(crate::tokens::TokensCommand),
    /// Measure the disk's write ceiling: M threads writing K-KiB blocks.
    DiskProbe(DiskProbeArgs),
    /// Internal tools used by the test suite.
    #[command(subcommand, hide = true)]
    Debug(DebugCommand),
}

/// Options of every server command (`standalone`, `broker`).
#[derive(Args, Debug, Default)]
pub struct ServerArgs {
    /// Configuration file (TOML); see magnetar.example.toml for every knob. Flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Directory for all persistent state [default: ./data].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Binary protocol port [default: 6650].
    #[arg(long)]
    pub broker_port: Option<u16>,
    /// HTTP admin port [default: 8080].
    #[arg(long)]
    pub web_port: Option<u16>,
    /// Host name or address clients and other brokers reach this broker at (LOOKUP answers,
    /// its registration) [default: 127.0.0.1].
    #[arg(long)]
    pub advertised_address: Option<String>,
}

#[derive(Args, Debug)]
pub struct BrokerArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    /// Metadata store: etcd://host:2379[,host2:2379...] (http://host:2379,... also accepted).
    #[arg(long)]
    pub metadata: String,
    /// Cluster name: the root of this cluster's keys in etcd (/magnetar/NAME). The cluster
    /// must have been initialized with `magnetar metadata init`.
    #[arg(long)]
    pub cluster: String,
}

#[derive(Args, Debug)]
pub struct ProxyArgs {
    /// Configuration file (TOML): `[proxy]`, `[authentication]`, `[tls]`, `[log]`; see
    /// docs/src/deployment/cluster.md. Flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The cluster's metadata store (etcd://host:2379[,...]): the brokers are found there.
    #[arg(long)]
    pub metadata: String,
    /// Cluster name (the root of its keys in etcd).
    #[arg(long)]
    pub cluster: String,
    /// Binary protocol port clients connect to [default: 6650].
    #[arg(long)]
    pub port: Option<u16>,
    /// HTTP port of the admin API, sent on to the brokers [default: 8080].
    #[arg(long)]
    pub web_port: Option<u16>,
}

#[derive(Subcommand, Debug)]
pub enum MetadataCommand {
    /// Create a cluster's initial metadata (as Pulsar's initialize-cluster-metadata): the
    /// cluster record, tenants public and pulsar, namespaces public/default and pulsar/system.
    /// Idempotent: what exists is left unchanged.
    Init(MetadataInitArgs),
}

#[derive(Args, Debug)]
pub struct MetadataInitArgs {
    /// Metadata store: etcd://host:2379[,host2:2379...].
    #[arg(long)]
    pub metadata: String,
    /// Cluster name.
    #[arg(long)]
    pub cluster: String,
    /// The cluster's HTTP admin URL, recorded in its ClusterData (http://host:8080).
    #[arg(long)]
    pub web_service_url: Option<String>,
    /// The cluster's binary protocol URL, recorded in its ClusterData (pulsar://host:6650).
    #[arg(long)]
    pub broker_service_url: Option<String>,
    /// The cluster's HTTPS admin URL, recorded in its ClusterData (https://host:8443).
    #[arg(long)]
    pub web_service_url_tls: Option<String>,
    /// The cluster's TLS binary protocol URL, recorded in its ClusterData
    /// (pulsar+ssl://host:6651).
    #[arg(long)]
    pub broker_service_url_tls: Option<String>,
}

impl MetadataInitArgs {
    fn validate(&self) -> Result<(), String> {
        let flags = [
            ("--web-service-url", &self.web_service_url, &["http://", "https://"][..]),
            ("--broker-service-url", &self.broker_service_url, &["pulsar://", "pulsar+ssl://"]),
            ("--web-service-url-tls", &self.web_service_url_tls, &["https://"]),
            ("--broker-service-url-tls", &self.broker_service_url_tls, &["pulsar+ssl://"]),
        ];
        for (flag, url, schemes) in flags {
            if let Some(url) = url {
                if !schemes.iter().any(|scheme| url.starts_with(scheme)) {
                    return Err(format!("{flag} {url:?} must start with {}", schemes.join(" or ")));
                }
            }
        }
        Ok(())
    }
}

#[derive(Subcommand, Debug)]
pub enum StorageNodesCommand {
    /// Drain a node before removing it: it turns read-only (no new copies, writers move off
    /// it) and auto-recovery copies everything it holds to other nodes, reading from it too.
    Decommission {
        #[command(flatten)]
        node: StorageNodeTarget,
        /// Wait until no ledger names the node (at most this many seconds; exit 1 if not).
        #[arg(long)]
        wait_seconds: Option<u64>,
    },
    /// How far a node's drain has come (JSON: state draining, drained or removable).
    Status {
        #[command(flatten)]
        node: StorageNodeTarget,
    },
    /// Call a node's drain off: it takes adds and copies again.
    Cancel {
        #[command(flatten)]
        node: StorageNodeTarget,
    },
    /// Remove a drained node that has been stopped: its cookie, rack assignment and
    /// decommission record (it is listed no more). Refused while ledgers name it or it runs.
    Remove {
        #[command(flatten)]
        node: StorageNodeTarget,
    },
}

#[derive(Args, Debug)]
pub struct StorageNodeTarget {
    /// Metadata store: etcd://host:2379[,host2:2379...].
    #[arg(long)]
    pub metadata: String,
    /// Cluster name.
    #[arg(long)]
    pub cluster: String,
    /// The node: its id, or its address (`host:port`, its bookie id).
    #[arg(long)]
    pub node: String,
}

#[derive(Subcommand, Debug)]
pub enum PerfCommand {
    /// Publish load against any Pulsar-protocol broker; publish (send-to-receipt) latency.
    Produce(PerfProduceArgs),
    /// Consume from any Pulsar-protocol broker; publish-to-receive latency.
    Consume(PerfConsumeArgs),
    /// Produce and consume in one process; end-to-end (send-to-receive) latency.
    E2e(PerfE2eArgs),
    /// Storage engine appends next to the raw disk, measured in one run.
    Storage(PerfStorageArgs),
}

/// Options shared by produce, consume and e2e (named as in pulsar-perf where it has them).
#[derive(Args, Debug)]
pub struct PerfTargetArgs {
    /// Topic (short names go to public/default).
    #[arg(default_value = "perf")]
    pub topic: String,
    /// Pulsar binary protocol URL of the broker (`pulsar+ssl://` needs --tls-trust-certs-file).
    #[arg(long, short = 'u', default_value = "pulsar://127.0.0.1:6650")]
    pub service_url: String,
    /// PEM CAs that verify a `pulsar+ssl://` broker's certificate and name.
    #[arg(long)]
    pub tls_trust_certs_file: Option<std::path::PathBuf>,
    /// Admin REST URL (only used to create partitioned topics).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub admin_url: String,
    /// Number of topics: <topic>-0, <topic>-1, ... when more than one.
    #[arg(long, short = 't', default_value_t = 1)]
    pub num_topics: usize,
    /// Create the topics as partitioned topics with this many partitions.
    #[arg(long, default_value_t = 0)]
    pub partitions: u32,
    /// Stop after this many seconds (0: no limit).
    #[arg(long = "time", short = 'd', default_value_t = 0.0)]
    pub time: f64,
    /// Stop after this many messages, counted over all producers or consumers (0: no limit).
    #[arg(long = "num-messages", short = 'm', default_value_t = 0)]
    pub num_messages: u64,
    /// Seconds not counted at the start (ignored with --num-messages).
    #[arg(long, default_value_t = 1.0)]
    pub warmup_time: f64,
    /// Seconds between live lines.
    #[arg(long, default_value_t = 5.0)]
    pub report_interval: f64,
    /// Print the final summary as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Client threads; 1 runs everything on one thread (fastest for one producer on 2 cores).
    #[arg(long = "num-io-threads", short = 'i', default_value_t = 1)]
    pub threads: usize,
    /// A token (JWT) for a broker with token authentication (as pulsar-perf's --auth-params
    /// with AuthenticationToken).
    #[arg(long, conflicts_with = "auth_token_file")]
    pub auth_token: Option<String>,
    /// A file holding the token (whitespace around it ignored), read again at each connection
    /// and whenever the broker challenges an expired token: another process may rotate it.
    #[arg(long)]
    pub auth_token_file: Option<std::path::PathBuf>,
}

#[derive(Args, Debug)]
pub struct PerfProducerArgs {
    /// Messages per second over all producers (0: as fast as possible).
    #[arg(long, short = 'r', default_value_t = 0.0)]
    pub rate: f64,
    /// Message size in bytes.
    #[arg(long, short = 's', default_value_t = 1024)]
    pub size: usize,
    /// Producers per topic.
    #[arg(long = "num-producers", short = 'n', default_value_t = 1)]
    pub producers: usize,
    /// Batching window in milliseconds.
    #[arg(long = "batch-time-window", short = 'b', default_value_t = 1.0)]
    pub batch_time_window_ms: f64,
    /// Maximum messages per batch.
    #[arg(long = "batch-max-messages", default_value_t = 1000)]
    pub batch_max_messages: u32,
    /// Maximum bytes per batch.
    #[arg(long = "batch-max-bytes", default_value_t = 128 * 1024)]
    pub batch_max_bytes: usize,
    /// Send every message as its own entry.
    #[arg(long)]
    pub disable_batching: bool,
    /// Messages in flight per producer (pulsar-perf's --max-outstanding).
    #[arg(long = "max-outstanding", short = 'o', default_value_t = 1000)]
    pub max_pending: usize,
    /// NONE, LZ4, ZLIB, ZSTD or SNAPPY.
    #[arg(long, short = 'z', default_value = "NONE")]
    pub compression: magnetar_perf::pulsar::PerfCompression,
    /// One message in flight per producer (durable round-trip latency); implies no batching.
    #[arg(long)]
    pub sync: bool,
}

#[derive(Args, Debug)]
pub struct PerfConsumerArgs {
    /// Consumers per topic.
    #[arg(long = "num-consumers", short = 'c', default_value_t = 1)]
    pub consumers: usize,
    /// Subscription name [default: perf-sub; for e2e a new one per run, removed at the end, so
    /// that a backlog left by earlier runs is not measured].
    #[arg(long = "subscriptions", visible_alias = "subscription")]
    pub subscription: Option<String>,
    /// Exclusive, Shared, Failover or Key_Shared.
    #[arg(long = "subscription-type", short = 'T', default_value = "Exclusive")]
    pub sub_type: magnetar_perf::pulsar::PerfSubType,
    /// Receiver queue size per consumer.
    #[arg(long = "receiver-queue-size", short = 'q', default_value_t = 1000)]
    pub receiver_queue: u32,
    /// Where a new subscription starts: Latest or Earliest.
    #[arg(long = "subscription-position", default_value = "Latest")]
    pub position: magnetar_perf::pulsar::PerfPosition,
    /// With a message count (-m): give up when no message arrived for this many seconds
    /// (print the figures, exit 1), so a run that cannot finish does not wait for ever;
    /// 0: never. Without -m the run waits for producers as long as it is asked to.
    #[arg(long = "idle-timeout", default_value_t = 60.0)]
    pub idle_timeout: f64,
}

#[derive(Args, Debug)]
pub struct PerfProduceArgs {
    #[command(flatten)]
    pub target: PerfTargetArgs,
    #[command(flatten)]
    pub producer: PerfProducerArgs,
}

#[derive(Args, Debug)]
pub struct PerfConsumeArgs {
    #[command(flatten)]
    pub target: PerfTargetArgs,
    #[command(flatten)]
    pub consumer: PerfConsumerArgs,
}

#[derive(Args, Debug)]
pub struct PerfE2eArgs {
    #[command(flatten)]
    pub target: PerfTargetArgs,
    #[command(flatten)]
    pub producer: PerfProducerArgs,
    #[command(flatten)]
    pub consumer: PerfConsumerArgs,
}

impl PerfTargetArgs {
    fn validate(&self) -> Result<(), String> {
        let tls = self.service_url.starts_with("pulsar+ssl://");
        if !self.service_url.starts_with("pulsar://") && !tls {
            return Err("--service-url must be pulsar://host:port or pulsar+ssl://host:port".into());
        }
        if tls && self.tls_trust_certs_file.is_none() {
            return Err("--service-url pulsar+ssl:// needs --tls-trust-certs-file".into());
        }
        if self.num_topics == 0 || self.num_topics > 100_000 {
            return Err("--num-topics must be between 1 and 100000".into());
        }
        if !(0.0..=86_400.0 * 365.0).contains(&self.time) {
            return Err("--time must be between 0 and a year of seconds".into());
        }
        if !(0.0..=3600.0).contains(&self.warmup_time) {
            return Err("--warmup-time must be between 0 and 3600".into());
        }
        if !(0.1..=3600.0).contains(&self.report_interval) {
            return Err("--report-interval must be between 0.1 and 3600".into());
        }
        if self.threads == 0 || self.threads > 1024 {
            return Err("--num-io-threads must be between 1 and 1024".into());
        }
        Ok(())
    }
}

impl PerfProducerArgs {
    fn validate(&self) -> Result<(), String> {
        if !(0.0..=1e9).contains(&self.rate) {
            return Err("--rate must be between 0 (unlimited) and 1e9".into());
        }
        if self.size > 256 << 20 {
            return Err("--size must be at most 256 MiB".into());
        }
        if self.producers == 0 || self.producers > 10_000 {
            return Err("--num-producers must be between 1 and 10000".into());
        }
        if self.max_pending == 0 {
            return Err("--max-outstanding must be at least 1".into());
        }
        if !(0.0..=60_000.0).contains(&self.batch_time_window_ms) {
            return Err("--batch-time-window must be between 0 and 60000 ms".into());
        }
        if self.batch_max_messages == 0 || self.batch_max_bytes == 0 {
            return Err("--batch-max-messages and --batch-max-bytes must be at least 1".into());
        }
        Ok(())
    }
}

impl PerfConsumerArgs {
    fn validate(&self) -> Result<(), String> {
        if self.consumers == 0 || self.consumers > 10_000 {
            return Err("--num-consumers must be between 1 and 10000".into());
        }
        if self.receiver_queue == 0 {
            return Err("--receiver-queue-size must be at least 1".into());
        }
        if self.subscription.as_deref() == Some("") {
            return Err("--subscription must not be empty".into());
        }
        Ok(())
    }
}

#[derive(Args, Debug)]
pub struct PerfStorageArgs {
    /// Scratch directory on the disk to measure.
    #[arg(long, default_value = "./perf-data")]
    pub dir: PathBuf,
    /// Concurrent appenders (comma-separated list).
    #[arg(long, value_delimiter = ',', default_value = "1,16,256")]
    pub appenders: Vec<usize>,
    /// Entry sizes in bytes (comma-separated list).
    #[arg(long, value_delimiter = ',', default_value = "128,1024,16384")]
    pub sizes: Vec<usize>,
    /// Measured seconds per case (after a short warm-up).
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// fdatasync (default), dsync or none.
    #[arg(long, default_value = "fdatasync")]
    pub sync_mode: magnetar_journal::SyncMode,
    /// Write the journal through the page cache instead of with O_DIRECT (the default).
    #[arg(long)]
    pub buffered_io: bool,
    /// Skip the raw disk measurements.
    #[arg(long)]
    pub no_raw: bool,
    /// Print the report as JSON at the end.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct DiskProbeArgs {
    /// Scratch directory on the disk to measure.
    #[arg(long, default_value = "./perf-data")]
    pub dir: PathBuf,
    /// Writer threads (comma-separated list: one row each).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    pub threads: Vec<usize>,
    /// Block sizes in KiB (comma-separated list: one column each).
    #[arg(long, value_delimiter = ',', default_value = "4,64,1024")]
    pub block_size: Vec<usize>,
    /// Seconds per cell.
    #[arg(long, default_value_t = 2.0)]
    pub seconds: f64,
    /// Open with O_DIRECT.
    #[arg(long)]
    pub direct: bool,
    /// Do not fdatasync after each block (measures buffered or O_DIRECT bandwidth).
    #[arg(long)]
    pub no_sync: bool,
    /// Latency instead of bandwidth: every thread writes one block durably at the same instant
    /// (O_DIRECT | O_DSYNC, as the journal writes a lone add), round after round; the table
    /// shows the p50 ms until all of a round's writes are durable. With 2 threads: what a
    /// write quorum of 2 waits for when both storage nodes share this disk.
    #[arg(long, conflicts_with_all = ["direct", "no_sync"])]
    pub lockstep: bool,
    #[arg(long)]
    pub json: bool,
}

/// `magnetar storage`: serves ledgers over the storage protocol from its own journal.
#[derive(Args, Debug)]
pub struct StorageArgs {
    /// Directory of this node's journal, ledgers and identity [default: ./data-storage].
    #[arg(long, default_value = "data-storage")]
    pub data_dir: PathBuf,
    /// Configuration file (magnetar.example.toml's format): the node takes its journal and
    /// ledger store settings from the `[storage]` section (the standalone's defaults without
    /// one), validated before any data is opened.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Address the storage protocol listens on (port 0: any free port, printed at start).
    #[arg(long, default_value = "127.0.0.1:3181")]
    pub listen: String,
    /// Host name or address writers reach this node at [default: the listen address's host].
    #[arg(long)]
    pub advertised_address: Option<String>,
    /// Metadata store to register in (etcd://host:2379[,...]); without it the node serves
    /// unregistered (writers must be told its address).
    #[arg(long, requires = "cluster")]
    pub metadata: Option<String>,
    /// Cluster name (the root of its keys in etcd).
    #[arg(long, requires = "metadata")]
    pub cluster: Option<String>,
    /// Failure-domain label: writers spread a ledger's copies over different racks.
    #[arg(long)]
    pub rack: Option<String>,
    /// This node's id; chosen at random and kept in DATA_DIR/node-id on first start. Given,
    /// it must match what DATA_DIR holds; in a cluster, an id whose cookie (etcd) names
    /// another data directory is refused (a node id that held ledgers on an emptied disk).
    #[arg(long)]
    pub node_id: Option<u64>,
    /// Seconds between registration refreshes (free disk space).
    #[arg(long, default_value_t = 10)]
    pub refresh_seconds: u64,
    /// Seconds between garbage collections: ledgers whose metadata was deleted are freed.
    #[arg(long, default_value_t = 60)]
    pub gc_seconds: u64,
    /// MiB of free disk below which the node goes read-only: it refuses new adds (writers
    /// move those ledgers to other nodes) and keeps serving reads; it takes adds again at
    /// twice this. 0: no threshold (the node still turns read-only when its disk fills anyway
    /// and its store gives up its reserve, `[storage] reserve_mb`, until the reserve is back).
    #[arg(long, default_value_t = 1024)]
    pub min_free_mb: u64,
    /// Address of an HTTP listener serving the node's Prometheus metrics at `/metrics`
    /// (journal, ledger store, requests, disk): e.g. 127.0.0.1:8000. None by default.
    #[arg(long)]
    pub metrics_listen: Option<String>,
    /// Seconds of the window the latency quantiles of the metrics are taken over (a bookie's
    /// `prometheusStatsLatencyRolloverSeconds`); `_count` and `_sum` count since start.
    #[arg(long, default_value_t = 60)]
    pub stats_interval_seconds: u64,
    /// Threads serving the network (the node's decisions are one task, which also writes a
    /// lone add to disk; larger batches go to the journal's own threads). Default: one per
    /// core, at least 2. 1 runs every connection and that task on one thread.
    #[arg(long)]
    pub worker_threads: Option<usize>,
    /// Seconds a storage node may be unregistered before auto-recovery copies its ledgers'
    /// lost copies to other nodes (BookKeeper's `lostBookieRecoveryDelay`); every node runs
    /// the auditor (one per cluster, elected through etcd) and a re-replication worker.
    #[arg(long, default_value_t = 60)]
    pub lost_node_recovery_delay_seconds: u64,
    /// Seconds between auto-recovery rounds (the auditor's look, the workers' pick-up).
    #[arg(long, default_value_t = 5)]
    pub audit_interval_seconds: u64,
    /// MB per second this node copies at most when it re-replicates (publishing keeps the rest
    /// of its disk and network); 0: no limit.
    #[arg(long, default_value_t = 50)]
    pub rereplication_rate_mb: u64,
    /// No auto-recovery on this node (it neither audits nor re-replicates).
    #[arg(long)]
    pub no_autorecovery: bool,
}

#[derive(Subcommand, Debug)]
pub enum DebugCommand {
    /// Append until killed, printing each acknowledged entry (crash test child).
    CrashWriter {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 6)]
        appenders: usize,
    },
}

impl Cli {
    /// Checks what can be checked without touching any file.
    pub fn validate(&self) -> Result<(), String> {
        match &self.command {
            Command::Perf(PerfCommand::Produce(args)) => {
                args.target.validate()?;
                args.producer.validate()?;
            }
            Command::Perf(PerfCommand::Consume(args)) => {
                args.target.validate()?;
                args.consumer.validate()?;
            }
            Command::Perf(PerfCommand::E2e(args)) => {
                args.target.validate()?;
                args.producer.validate()?;
                args.consumer.validate()?;
                if args.producer.size < 8 {
                    return Err(
                        "e2e needs --size of at least 8 (messages carry the send time)".into()
                    );
                }
            }
            Command::Perf(PerfCommand::Storage(args)) => {
                if args.appenders.iter().any(|&a| a == 0 || a > 100_000) {
                    return Err("--appenders must be between 1 and 100000".into());
                }
                if args.sizes.iter().any(|&s| s == 0 || s > 4 << 20) {
                    return Err("--sizes must be between 1 byte and 4 MiB".into());
                }
                if !(0.1..=3600.0).contains(&args.seconds) {
                    return Err("--seconds must be between 0.1 and 3600".into());
                }
            }
            Command::Storage(args) => {
                if args.refresh_seconds == 0 || args.refresh_seconds > 3600 {
                    return Err("--refresh-seconds must be between 1 and 3600".into());
                }
                if args.gc_seconds == 0 || args.gc_seconds > 86_400 {
                    return Err("--gc-seconds must be between 1 and 86400".into());
                }
                if args.stats_interval_seconds == 0 || args.stats_interval_seconds > 3600 {
                    return Err("--stats-interval-seconds must be between 1 and 3600".into());
                }
                if args.min_free_mb > 1 << 40 {
                    return Err("--min-free-mb must be at most 1099511627776 (1 EiB)".into());
                }
                if args.listen.parse::<std::net::SocketAddr>().is_err() {
                    return Err(format!(
                        "--listen needs HOST:PORT with an IP address, not {:?}",
                        args.listen
                    ));
                }
                if args
                    .advertised_address
                    .as_deref()
                    .is_some_and(|a| a.is_empty() || a.contains('/'))
                {
                    return Err("--advertised-address must be a host name or address".into());
                }
            }
            Command::DiskProbe(args) => {
                if args.threads.iter().any(|&t| t == 0 || t > 1024) {
                    return Err("--threads must be between 1 and 1024".into());
                }
                if args.block_size.iter().any(|&k| k == 0 || k > 64 << 10) {
                    return Err("--block-size must be between 1 and 65536 KiB".into());
                }
                if (args.direct || args.lockstep) && args.block_size.iter().any(|&k| k % 4 != 0) {
                    return Err("--direct and --lockstep need block sizes that are multiples of \
                                4 KiB"
                        .into());
                }
                if !(0.1..=3600.0).contains(&args.seconds) {
                    return Err("--seconds must be between 0.1 and 3600".into());
                }
            }
            Command::Metadata(MetadataCommand::Init(args)) => args.validate()?,
            Command::StorageNodes(StorageNodesCommand::Decommission { wait_seconds, .. }) => {
                if wait_seconds.is_some_and(|s| s > 30 * 86_400) {
                    return Err("--wait-seconds must be at most 2592000 (30 days)".into());
                }
            }
            Command::StorageNodes(_) => {}
            // Server commands validate their whole configuration (file included) in
            // `config::Settings::load`, before anything is opened.
            Command::Standalone(_)
            | Command::Broker(_)
            | Command::Proxy(_)
            | Command::Debug(_)
            | Command::Tokens(_) => {}
        }
        Ok(())
    }
}
