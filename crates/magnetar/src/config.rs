//! The server configuration, shared by `magnetar standalone` and `magnetar broker`: one file
//! format (magnetar.example.toml documents every knob and its default), command-line flags
//! over it, and [`Settings::load`], which validates all of it before any file is opened or any
//! connection made. The two commands differ only in [`MetadataBackend`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use magnetar_broker::BrokerConfig;
use magnetar_journal::{JournalConfig, SyncMode};
use magnetar_ledger::LedgerStoreConfig;
use magnetar_metadata_etcd::{parse_metadata_url, EtcdStoreConfig, MetadataUrlError};
use magnetar_model::names::is_valid_entity_name;
use magnetar_model::storage_nodes::IsolationGroups;
use magnetar_security::tls::{ServerTls, TlsConfig, TlsError};
use serde::Deserialize;
use std::sync::Arc;
use thiserror::Error;

use crate::cli::ServerArgs;

/// The configuration file. Every field is optional; see magnetar.example.toml.
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Directory for ledgers (`ledgers/`) and, standalone, metadata (`metadata/`).
    pub data_dir: PathBuf,
    /// Address the HTTP admin API listens on.
    pub web_bind_address: String,
    pub web_port: u16,
    /// Cluster name reported by the admin API (`magnetar broker` takes it from `--cluster`).
    pub cluster: String,
    pub broker: BrokerConfig,
    pub storage: StorageSection,
    /// `[ledgers]`: where topics' ledgers live (this broker's disk, or storage nodes).
    pub ledgers: LedgersSection,
    pub metadata: MetadataSection,
    /// `[load_manager]`: the cluster's load manager (`magnetar broker`; standalone ignores it).
    pub load_manager: LoadManagerSection,
    /// `[coordination]`: how brokers find each other dead (`magnetar broker`).
    pub coordination: CoordinationSection,
    pub log: LogSection,
    /// `[tls]`: `pulsar+ssl://` and HTTPS (see `magnetar_security::tls`).
    pub tls: TlsConfig,
    /// `[authentication]`: who may connect (see magnetar_security::authentication).
    pub authentication: magnetar_security::authentication::AuthenticationConfig,
    /// `[authorization]`: who may do what (off by default; see the security crate).
    pub authorization: magnetar_security::authorization::AuthorizationConfig,
}

/// `[log]`: what is logged and how. `RUST_LOG` overrides `level`, `--log-format` overrides
/// `format`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct LogSection {
    /// A `RUST_LOG`-style filter: `info` (default), `warn,magnetar_broker=debug`, ...
    pub level: String,
    /// `text` (coloured only on a terminal without NO_COLOR) or `json` (one object per line).
    pub format: String,
}

impl Default for LogSection {
    fn default() -> Self {
        LogSection { level: "info".into(), format: "text".into() }
    }
}

impl LogSection {
    /// The `[log]` section of the file at `path`, read before logging starts (so before the
    /// full configuration is validated: a file that does not parse gets the defaults here and
    /// its error from [`Settings::load`]).
    pub fn peek(path: &Path) -> LogSection {
        let Ok(text) = std::fs::read_to_string(path) else { return LogSection::default() };
        let Ok(value) = toml::from_str::<toml::Value>(&text) else { return LogSection::default() };
        value.get("log").and_then(|log| log.clone().try_into().ok()).unwrap_or_default()
    }
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
    /// fdatasync (default; lone groups are written O_DIRECT|O_DSYNC), dsync, or none (tests
    /// only: acknowledged data may be lost).
    pub sync_mode: String,
    /// Write the journal with O_DIRECT.
    pub direct_io: bool,
    /// Memory for recently appended entries served to tailing readers.
    pub write_cache_bytes: usize,
    /// Freed journal segment files kept for reuse: a reused file needs no zero-filling and a
    /// kept one no unlink, at the cost of this many segments of disk held while idle. Default
    /// 8 (the journal's own default is 1): unlinking a deleted ledger's segments at once put a
    /// 5-10 ms publish stall behind every retention pass at 50 MB/s (ARCHITECTURE.md, "Space
    /// reclamation").
    pub recycled_segments: usize,
    /// MiB of free disk below which the broker refuses new messages (a producer's send gets
    /// "disk full: N MiB free ... below the M MiB minimum"), until twice this is free: what is
    /// left keeps cursor writes, topic deletes, retention and compaction going, so the disk can
    /// be reclaimed (a journal out of space could not even record a delete). Default 1024; 0:
    /// off. A storage node ignores it (its `--min-free-mb` puts it in read-only mode).
    pub min_free_mb: u64,
    /// MiB held back in a reserve file (`ledgers/RESERVE`) for when the disk fills anyway
    /// (another process filled it, or `min_free_mb` is 0): the store gives it up so that topic
    /// deletes, retention and compaction can still be written and the disk reclaimed (a journal
    /// out of space could not even record a delete), and refuses new messages (a storage node:
    /// read-only) until it can hold it again with as much to spare. 0: none; otherwise at least
    /// one segment (`segment_size_bytes`). Default 128: two default segments. Brokers and
    /// storage nodes alike.
    pub reserve_mb: u64,
}

/// Where a broker keeps its ledgers. `local`: its own journal and ledger store in
/// `<data_dir>/ledgers` (one copy). `nodes`: the storage nodes (`magnetar storage`) registered
/// in the cluster's metadata, each entry on `write_quorum` of them and acknowledged once
/// `ack_quorum` have it durably (`magnetar broker` only). Pulsar's names for the quorums are
/// `managedLedgerDefaultEnsembleSize`, `...WriteQuorum` and `...AckQuorum`; its defaults, 2,
/// 2, 2, are these.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LedgersSection {
    /// `local` or `nodes`.
    pub storage: String,
    /// Nodes a ledger is placed on (equal to `write_quorum`: entries are not striped).
    pub ensemble_size: u32,
    /// Nodes each entry is written to.
    pub write_quorum: u32,
    /// Nodes that must have an entry durably before it is acknowledged.
    pub ack_quorum: u32,
    /// A node that has not answered an add for this long is replaced (milliseconds).
    pub add_timeout_millis: u64,
    /// A read's replica silent this long (milliseconds; no answer to anything since the
    /// entry was asked of it): the entry is also asked of the next replica.
    pub speculative_read_millis: u64,
    /// A read that gets no entry from any replica for this long fails (milliseconds;
    /// BookKeeper's `readEntryTimeoutSec`, 5 s), and the reader tries again later: frozen
    /// nodes whose connections stay open cannot hold a consumer for ever. Longer than
    /// `speculative_read_millis`.
    pub read_timeout_millis: u64,
    /// PEM CAs the certificates of storage nodes that serve TLS are verified against (Pulsar's
    /// `bookkeeperTLSTrustCertsFilePath`); empty: such nodes cannot be written to.
    pub tls_trust_certs_file: PathBuf,
    /// This broker's PEM certificate chain, presented to storage nodes that ask for one
    /// (mTLS; Pulsar's `bookkeeperTLSCertificateFilePath`); with `tls_key_file`.
    pub tls_cert_file: PathBuf,
    /// Its private key (Pulsar's `bookkeeperTLSKeyFilePath`).
    pub tls_key_file: PathBuf,
    /// Storage node groups (`pulsar-admin bookies set-bookie-rack -g`, comma-separated) the
    /// ledgers of namespaces without a bookie affinity keep to (Pulsar's
    /// `bookkeeperClientIsolationGroups`); empty: any node.
    pub isolation_groups: String,
    /// Groups they may use too when the primary ones have too few writable nodes (Pulsar's
    /// `bookkeeperClientSecondaryIsolationGroups`).
    pub secondary_isolation_groups: String,
}

impl Default for LedgersSection {
    fn default() -> Self {
        LedgersSection {
            storage: "local".into(),
            ensemble_size: 2,
            write_quorum: 2,
            ack_quorum: 2,
            add_timeout_millis: 5_000,
            speculative_read_millis: 200,
            read_timeout_millis: 5_000,
            tls_trust_certs_file: PathBuf::new(),
            tls_cert_file: PathBuf::new(),
            tls_key_file: PathBuf::new(),
            isolation_groups: String::new(),
            secondary_isolation_groups: String::new(),
        }
    }
}

/// The etcd metadata store of `magnetar broker` (standalone ignores this section).
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetadataSection {
    /// Time to live of the broker's etcd session (lease), whole seconds: after this long
    /// without contact, etcd deletes the broker's registration and the broker reports its
    /// session lost (not ready, no new topics) until a new session registers it again.
    pub session_ttl_seconds: u64,
    /// Bound on one etcd request, in seconds.
    pub request_timeout_seconds: u64,
    /// Bound on reaching etcd at start-up, in seconds: past it the broker exits with an error.
    pub connect_timeout_seconds: u64,
}

/// The load manager of `magnetar broker`: reports, shedding and automatic bundle splits (Pulsar's
/// `loadBalancer*` settings). The leader's values decide.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct LoadManagerSection {
    /// Seconds between a broker's load reports and the leader's decisions.
    pub interval_seconds: u64,
    /// Move bundles between brokers by load (Pulsar's `loadBalancerSheddingEnabled`).
    pub shedding_enabled: bool,
    /// Split a bundle past any threshold below (Pulsar's `loadBalancerAutoBundleSplitEnabled`).
    pub auto_bundle_split_enabled: bool,
    /// Topics a bundle may hold (Pulsar's `loadBalancerNamespaceBundleMaxTopics`).
    pub namespace_bundle_max_topics: u32,
    /// Messages per second in a bundle may take (`loadBalancerNamespaceBundleMaxMsgRate`).
    pub namespace_bundle_max_msg_rate: f64,
    /// Megabytes per second a bundle may carry (`loadBalancerNamespaceBundleMaxBandwidthMbytes`).
    pub namespace_bundle_max_bandwidth_mbytes: f64,
    /// Bundles a namespace may be split into (`loadBalancerNamespaceMaximumBundles`).
    pub namespace_maximum_bundles: usize,
}

impl Default for LoadManagerSection {
    fn default() -> Self {
        let manager = magnetar_coordination::LoadManagerConfig::default();
        LoadManagerSection {
            interval_seconds: manager.interval.as_secs(),
            shedding_enabled: manager.shedding_enabled,
            auto_bundle_split_enabled: manager.split.enabled,
            namespace_bundle_max_topics: manager.split.max_topics,
            namespace_bundle_max_msg_rate: manager.split.max_msg_rate,
            namespace_bundle_max_bandwidth_mbytes: manager.split.max_bandwidth / (1024.0 * 1024.0),
            namespace_maximum_bundles: manager.split.max_bundles,
        }
    }
}

/// How a broker of a cluster finds another dead (`magnetar broker`; standalone ignores this
/// section): it probes every other broker's web port, and a broker that stops answering has its
/// bundles taken over before its etcd lease runs out. Safety does not rest on it (a broker
/// taking a bundle fences the topics' ledgers); it decides how fast a failover is.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct CoordinationSection {
    /// Milliseconds between two probes of each other broker.
    pub probe_interval_ms: u64,
    /// Milliseconds a probe waits for an answer before it counts as timed out.
    pub probe_timeout_ms: u64,
    /// Refused connections in a row that make a broker dead (no process listens there).
    pub dead_after_refused_probes: u32,
    /// Timed-out probes in a row that make a broker dead (frozen or cut off, not just slow).
    pub dead_after_timed_out_probes: u32,
}

impl Default for CoordinationSection {
    fn default() -> Self {
        let config = magnetar_coordination::CoordinationConfig::default();
        CoordinationSection {
            probe_interval_ms: config.probe_interval.as_millis() as u64,
            probe_timeout_ms: config.probe_timeout.as_millis() as u64,
            dead_after_refused_probes: config.liveness.refused_misses,
            dead_after_timed_out_probes: config.liveness.timeout_misses,
        }
    }
}

impl CoordinationSection {
    /// The shell's timings; an error names the key at fault.
    pub fn to_config(&self) -> Result<magnetar_coordination::CoordinationConfig, ConfigError> {
        let bad = |what: &'static str| ConfigError::CoordinationSection(what);
        if !(10..=60_000).contains(&self.probe_interval_ms) {
            return Err(bad("probe_interval_ms must be 10..=60000"));
        }
        if !(10..=60_000).contains(&self.probe_timeout_ms) {
            return Err(bad("probe_timeout_ms must be 10..=60000"));
        }
        if !(1..=100).contains(&self.dead_after_refused_probes)
            || !(1..=100).contains(&self.dead_after_timed_out_probes)
        {
            return Err(bad(
                "dead_after_refused_probes and dead_after_timed_out_probes must be 1..=100",
            ));
        }
        Ok(magnetar_coordination::CoordinationConfig {
            probe_interval: Duration::from_millis(self.probe_interval_ms),
            probe_timeout: Duration::from_millis(self.probe_timeout_ms),
            liveness: magnetar_coordination::LivenessConfig {
                refused_misses: self.dead_after_refused_probes,
                timeout_misses: self.dead_after_timed_out_probes,
            },
        })
    }
}

impl LoadManagerSection {
    /// The load manager's configuration; an error names the key at fault.
    pub fn to_config(&self) -> Result<magnetar_coordination::LoadManagerConfig, ConfigError> {
        let bad = |what: &'static str| ConfigError::LoadManagerSection(what);
        if !(1..=3600).contains(&self.interval_seconds) {
            return Err(bad("interval_seconds must be 1..=3600"));
        }
        if self.namespace_bundle_max_topics < 1 {
            return Err(bad("namespace_bundle_max_topics must be 1 or more"));
        }
        if !self.namespace_bundle_max_msg_rate.is_finite()
            || self.namespace_bundle_max_msg_rate <= 0.0
        {
            return Err(bad("namespace_bundle_max_msg_rate must be above 0"));
        }
        if !self.namespace_bundle_max_bandwidth_mbytes.is_finite()
            || self.namespace_bundle_max_bandwidth_mbytes <= 0.0
        {
            return Err(bad("namespace_bundle_max_bandwidth_mbytes must be above 0"));
        }
        if !(1..=4096).contains(&self.namespace_maximum_bundles) {
            return Err(bad("namespace_maximum_bundles must be 1..=4096"));
        }
        let mut config = magnetar_coordination::LoadManagerConfig {
            interval: Duration::from_secs(self.interval_seconds),
            shedding_enabled: self.shedding_enabled,
            ..Default::default()
        };
        config.split = magnetar_coordination::splitter::SplitConfig {
            enabled: self.auto_bundle_split_enabled,
            max_topics: self.namespace_bundle_max_topics,
            max_msg_rate: self.namespace_bundle_max_msg_rate,
            max_bandwidth: self.namespace_bundle_max_bandwidth_mbytes * 1024.0 * 1024.0,
            max_bundles: self.namespace_maximum_bundles,
        };
        Ok(config)
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            data_dir: PathBuf::from("./data"),
            web_bind_address: "127.0.0.1".into(),
            web_port: 8080,
            cluster: "standalone".into(),
            broker: BrokerConfig::default(),
            storage: StorageSection::default(),
            ledgers: LedgersSection::default(),
            metadata: MetadataSection::default(),
            load_manager: LoadManagerSection::default(),
            coordination: CoordinationSection::default(),
            log: LogSection::default(),
            tls: TlsConfig::default(),
            authentication: Default::default(),
            authorization: Default::default(),
        }
    }
}

/// See [`StorageSection::recycled_segments`].
const RECYCLED_SEGMENTS: usize = 8;

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
            recycled_segments: RECYCLED_SEGMENTS,
            min_free_mb: 1024,
            reserve_mb: 128,
        }
    }
}

impl Default for MetadataSection {
    fn default() -> Self {
        let etcd = EtcdStoreConfig::new(Vec::new(), "default");
        MetadataSection {
            session_ttl_seconds: etcd.session_ttl.as_secs(),
            request_timeout_seconds: etcd.request_timeout.as_secs(),
            connect_timeout_seconds: etcd.connect_timeout.as_secs(),
        }
    }
}

/// A configuration that cannot be used. Each renders as one line, its cause included (no
/// `source` chain: `main` prints the chain, which would repeat it).
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("[load_manager] {0}")]
    LoadManagerSection(&'static str),
    #[error("[coordination] {0}")]
    CoordinationSection(&'static str),
    #[error("read config file {path}: {cause}")]
    Read { path: PathBuf, cause: std::io::Error },
    #[error("parse config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("broker config: {0}")]
    Broker(String),
    #[error("{0}")]
    Authentication(#[from] magnetar_security::authentication::ConfigError),
    #[error("authorization: {0}")]
    Authorization(&'static str),
    #[error("storage.sync_mode: {0}")]
    SyncMode(String),
    #[error("storage.min_free_mb: {0} is more than 2^40 (a disk of a zettabyte)")]
    MinFree(u64),
    #[error(
        "storage.reserve_mb: {reserve_mb} MiB is less than one journal segment \
         (storage.segment_size_bytes = {segment_size_bytes}): a full journal goes on in it; set \
         it to at least one segment (two are the default) or to 0 for none"
    )]
    Reserve { reserve_mb: u64, segment_size_bytes: u64 },
    #[error("storage.reserve_mb: {0} is more than 2^40 (a disk of a zettabyte)")]
    ReserveTooLarge(u64),
    /// The ledger store's own checks (journal limits tied together), run at load so that a bad
    /// `[storage]` section stops the server before it opens anything.
    #[error("[storage]: {0}")]
    Storage(magnetar_ledger::LedgerError),
    #[error("--metadata: {0}")]
    MetadataUrl(MetadataUrlError),
    #[error(
        "cluster name {0:?} is not valid: use 1-255 letters, digits, '-', '_', '.', ':' or '='"
    )]
    ClusterName(String),
    #[error(
        "advertised address {0:?} is not valid: a host name or IP address (no scheme, port or \
         '/')"
    )]
    AdvertisedAddress(String),
    #[error("metadata.{0}")]
    MetadataSection(&'static str),
    #[error("ledgers.{0}")]
    LedgersSection(String),
    #[error("{0}")]
    Tls(TlsError),
}

impl From<MetadataUrlError> for ConfigError {
    fn from(error: MetadataUrlError) -> Self {
        ConfigError::MetadataUrl(error)
    }
}

/// Which metadata store the server runs on.
#[derive(Debug, Clone)]
pub enum MetadataBackend {
    /// `magnetar standalone`: the embedded store in `<data_dir>/metadata`, bootstrapped with
    /// `public/default` on every start.
    Embedded,
    /// `magnetar broker`: etcd, under the cluster's root; the cluster must be initialized.
    Etcd(EtcdStoreConfig),
}

/// What a server command asks for, before validation.
pub enum Mode<'a> {
    Standalone,
    Broker { metadata_url: &'a str, cluster: &'a str },
}

/// A validated server configuration.
#[derive(Debug)]
pub struct Settings {
    pub config: ServerConfig,
    pub ledger: LedgerStoreConfig,
    pub metadata: MetadataBackend,
    /// The TLS listeners' configuration, loaded from the `[tls]` files (None: TLS off).
    pub tls: Option<Arc<ServerTls>>,
    /// TLS to storage nodes that serve it, from `[ledgers] tls_*` (None: not configured).
    pub ledger_client_tls: Option<Arc<magnetar_security::tls::ClientConfig>>,
}

impl Settings {
    /// Reads the file (if any), applies the flags, and checks everything. Opens nothing.
    pub fn load(args: &ServerArgs, mode: Mode<'_>) -> Result<Settings, ConfigError> {
        let mut config = match &args.config {
            Some(path) => read_file(path)?,
            None => ServerConfig::default(),
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
        if let Some(address) = &args.advertised_address {
            config.broker.advertised_address = address.clone();
        }
        let metadata = match mode {
            Mode::Standalone => MetadataBackend::Embedded,
            Mode::Broker { metadata_url, cluster } => {
                config.cluster = cluster.to_string();
                let endpoints = parse_metadata_url(metadata_url)?;
                MetadataBackend::Etcd(etcd_config(&config.metadata, endpoints, cluster)?)
            }
        };
        Self::validate(config, metadata)
    }

    fn validate(
        mut config: ServerConfig,
        metadata: MetadataBackend,
    ) -> Result<Settings, ConfigError> {
        if !is_valid_entity_name(&config.cluster) {
            return Err(ConfigError::ClusterName(config.cluster.clone()));
        }
        if !valid_host(&config.broker.advertised_address) {
            return Err(ConfigError::AdvertisedAddress(config.broker.advertised_address.clone()));
        }
        config.broker.cluster_name = config.cluster.clone();
        config.broker.validate().map_err(ConfigError::Broker)?;
        // Keys and users files are loaded and parsed here, before anything opens.
        if config.authentication.enabled {
            let authenticator = magnetar_security::authentication::Authenticator::from_config(
                &config.authentication,
            )?;
            config.broker.authenticator = Some(std::sync::Arc::new(authenticator));
        }
        if config.authorization.enabled && !config.authentication.enabled {
            // Without authentication no caller has a role, and every request would be refused.
            return Err(ConfigError::Authorization(
                "[authorization] enabled needs [authentication] enabled",
            ));
        }
        config.broker.authorization = config.authorization.clone();
        config.broker.persistence = persistence(&config.ledgers, &metadata)?;
        config.broker.persistence_policies = config.ledgers.storage == "nodes";
        config.load_manager.to_config()?;
        config.coordination.to_config()?;
        let ledger = ledger_store_config(&config)?;
        config
            .tls
            .validate(config.broker.broker_port, config.web_port)
            .map_err(ConfigError::Tls)?;
        let tls = match config.tls.enabled {
            true => Some(Arc::new(ServerTls::load(&config.tls).map_err(ConfigError::Tls)?)),
            false => None,
        };
        let ledger_client_tls = ledger_client_tls(&config.ledgers)?.map(Arc::new);
        Ok(Settings { config, ledger, metadata, tls, ledger_client_tls })
    }
}

/// The client side of TLS to storage nodes, from `[ledgers] tls_*`: files read and checked
/// here, before anything opens. None when no trust file is set.
fn ledger_client_tls(
    section: &LedgersSection,
) -> Result<Option<magnetar_security::tls::ClientConfig>, ConfigError> {
    let set = |path: &PathBuf| !path.as_os_str().is_empty();
    let (trust, cert, key) =
        (&section.tls_trust_certs_file, &section.tls_cert_file, &section.tls_key_file);
    if set(cert) != set(key) {
        return Err(ConfigError::LedgersSection(
            "tls_cert_file and tls_key_file go together".into(),
        ));
    }
    if !set(trust) {
        if set(cert) {
            return Err(ConfigError::LedgersSection(
                "tls_cert_file needs tls_trust_certs_file (the nodes' CAs)".into(),
            ));
        }
        return Ok(None);
    }
    let client_cert = set(cert).then_some((cert.as_path(), key.as_path()));
    magnetar_security::tls::client_config(trust, client_cert)
        .map(Some)
        .map_err(|e| ConfigError::LedgersSection(format!("tls_*: {e}")))
}

/// How new ledgers are stored: one local copy, or the `[ledgers]` quorums on storage nodes
/// (which need the cluster's metadata store to find them).
fn persistence(
    section: &LedgersSection,
    metadata: &MetadataBackend,
) -> Result<magnetar_ledger::LedgerMetadata, ConfigError> {
    let invalid = |why: String| Err(ConfigError::LedgersSection(why));
    match section.storage.as_str() {
        "local" => return Ok(magnetar_ledger::LedgerMetadata::local()),
        "nodes" => {}
        other => return invalid(format!("storage must be \"local\" or \"nodes\", not {other:?}")),
    }
    if matches!(metadata, MetadataBackend::Embedded) {
        return invalid(
            "storage = \"nodes\" needs `magnetar broker` (storage nodes register in etcd)".into(),
        );
    }
    let (e, w, a) = (section.ensemble_size, section.write_quorum, section.ack_quorum);
    if !(a >= 1 && a <= w && w <= e && e <= 16) {
        return invalid(format!(
            "need 16 >= ensemble_size {e} >= write_quorum {w} >= ack_quorum {a} >= 1"
        ));
    }
    if e != w {
        return invalid(format!("ensemble_size {e} must equal write_quorum {w} (no striping yet)"));
    }
    if !(10..=600_000).contains(&section.add_timeout_millis) {
        return invalid("add_timeout_millis must be 10..=600000".into());
    }
    if !(1..=60_000).contains(&section.speculative_read_millis) {
        return invalid("speculative_read_millis must be 1..=60000".into());
    }
    let (speculative, timeout) = (section.speculative_read_millis, section.read_timeout_millis);
    if !(speculative < timeout && timeout <= 600_000) {
        return invalid(format!(
            "need speculative_read_millis {speculative} < read_timeout_millis {timeout} <= 600000"
        ));
    }
    let isolation = IsolationGroups::parse(
        &section.isolation_groups,
        Some(section.secondary_isolation_groups.as_str()),
    );
    if isolation.is_none() && !section.secondary_isolation_groups.trim().is_empty() {
        return invalid("secondary_isolation_groups needs isolation_groups".into());
    }
    Ok(magnetar_ledger::LedgerMetadata {
        ensemble_size: e,
        write_quorum: w,
        ack_quorum: a,
        properties: Default::default(),
        isolation,
    })
}

fn read_file(path: &Path) -> Result<ServerConfig, ConfigError> {
    read_toml(path)
}

/// A configuration file of any command (`T`: its sections), parsed; the error is one line.
pub fn read_toml<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|cause| ConfigError::Read { path: path.to_path_buf(), cause })?;
    toml::from_str(&text).map_err(|e| ConfigError::Parse {
        path: path.to_path_buf(),
        // toml's message spans lines (a snippet of the file): keep the error one line.
        message: e.to_string().split_whitespace().collect::<Vec<_>>().join(" "),
    })
}

fn etcd_config(
    section: &MetadataSection,
    endpoints: Vec<String>,
    cluster: &str,
) -> Result<EtcdStoreConfig, ConfigError> {
    if !is_valid_entity_name(cluster) {
        return Err(ConfigError::ClusterName(cluster.to_string()));
    }
    if !(1..=3600).contains(&section.session_ttl_seconds) {
        return Err(ConfigError::MetadataSection("session_ttl_seconds must be 1..=3600"));
    }
    if !(1..=600).contains(&section.request_timeout_seconds) {
        return Err(ConfigError::MetadataSection("request_timeout_seconds must be 1..=600"));
    }
    if !(1..=3600).contains(&section.connect_timeout_seconds) {
        return Err(ConfigError::MetadataSection("connect_timeout_seconds must be 1..=3600"));
    }
    let mut etcd = EtcdStoreConfig::new(endpoints, cluster);
    etcd.session_ttl = Duration::from_secs(section.session_ttl_seconds);
    etcd.request_timeout = Duration::from_secs(section.request_timeout_seconds);
    etcd.connect_timeout = Duration::from_secs(section.connect_timeout_seconds);
    Ok(etcd)
}

/// A host name or an IP address as it appears in a URL (IPv6 in brackets).
fn valid_host(host: &str) -> bool {
    if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return !v6.is_empty() && v6.bytes().all(|b| b.is_ascii_hexdigit() || b == b':');
    }
    !host.is_empty()
        && host.len() <= 253
        && host.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
}

/// A storage node's ledger store: the `[storage]` section of the file at `path` (the
/// defaults without one), in `<data_dir>/ledgers` (checked by `LedgerStoreConfig::validate`);
/// and its listener's TLS, from the `[tls]` section (its files read and checked here).
/// What a storage node takes from the configuration file: its ledger store's settings, its
/// TLS (None: plain text only) and whether it serves plain-text clients next to TLS ones.
pub fn storage_node_config(
    path: Option<&Path>,
    data_dir: &Path,
) -> Result<(LedgerStoreConfig, Option<Arc<ServerTls>>, bool), ConfigError> {
    let mut config = match path {
        Some(path) => read_file(path)?,
        None => ServerConfig::default(),
    };
    config.data_dir = data_dir.to_path_buf();
    // The node's own `--min-free-mb` (read-only mode) applies, not the broker's refusal.
    let ledger = LedgerStoreConfig { min_free_bytes: 0, ..ledger_store_config(&config)? };
    // One listener, TLS or not: the broker-side ports of the section do not apply.
    config.tls.validate(0, 0).map_err(ConfigError::Tls)?;
    let tls = match config.tls.enabled {
        true => Some(Arc::new(ServerTls::load(&config.tls).map_err(ConfigError::Tls)?)),
        false => None,
    };
    Ok((ledger, tls, config.tls.storage_plain_clients))
}

fn ledger_store_config(config: &ServerConfig) -> Result<LedgerStoreConfig, ConfigError> {
    let sync_mode: SyncMode = config.storage.sync_mode.parse().map_err(ConfigError::SyncMode)?;
    let journal = JournalConfig {
        segment_size_bytes: config.storage.segment_size_bytes,
        max_group_bytes: config.storage.max_group_bytes,
        max_wait: (config.storage.max_wait_micros > 0)
            .then(|| Duration::from_micros(config.storage.max_wait_micros)),
        sync_mode,
        direct_io: config.storage.direct_io,
        recycled_segments_kept: config.storage.recycled_segments,
        ..JournalConfig::default()
    };
    let storage = &config.storage;
    if storage.min_free_mb > 1 << 40 {
        return Err(ConfigError::MinFree(storage.min_free_mb));
    }
    if storage.reserve_mb > 1 << 40 {
        return Err(ConfigError::ReserveTooLarge(storage.reserve_mb));
    }
    let reserve_bytes = storage.reserve_mb << 20;
    if storage.reserve_mb != 0 && reserve_bytes < storage.segment_size_bytes {
        let (reserve_mb, segment_size_bytes) = (storage.reserve_mb, storage.segment_size_bytes);
        return Err(ConfigError::Reserve { reserve_mb, segment_size_bytes });
    }
    let ledger = LedgerStoreConfig {
        dir: config.data_dir.join("ledgers"),
        min_free_bytes: storage.min_free_mb << 20,
        reserve_bytes,
        journal,
        write_cache_bytes: config.storage.write_cache_bytes,
        ..LedgerStoreConfig::default()
    };
    ledger.validate().map_err(ConfigError::Storage)?;
    Ok(ledger)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_config_lists_every_knob_with_its_default() {
        let text = include_str!("../../../magnetar.example.toml");
        let parsed: ServerConfig = toml::from_str(text).expect("the example parses");
        let default = ServerConfig::default();
        assert_eq!(format!("{parsed:?}"), format!("{default:?}"), "example and defaults differ");
        // Every field of every section appears in the example (no knob left undocumented).
        let value: toml::Value = toml::from_str(text).unwrap();
        let sections = [
            ("broker", format!("{:?}", default.broker)),
            ("storage", format!("{:?}", default.storage)),
            ("ledgers", format!("{:?}", default.ledgers)),
            ("metadata", format!("{:?}", default.metadata)),
            ("load_manager", format!("{:?}", default.load_manager)),
            ("coordination", format!("{:?}", default.coordination)),
            ("log", format!("{:?}", default.log)),
            ("tls", format!("{:?}", default.tls)),
            ("authentication", format!("{:?}", default.authentication)),
            ("authorization", format!("{:?}", default.authorization)),
        ];
        for (section, debug) in sections {
            let table = value[section].as_table().unwrap();
            // Not read from the file: `broker.cluster_name` (from `cluster`),
            // `service_url_tls` and `plain_port_enabled` (from `[tls]`), `authenticator` and
            // `authorization`, a struct (from `[authentication]` and `[authorization]`).
            // `persistence` and `persistence_policies` (from `[ledgers]`) neither.
            let authorization = format!("{:?}", default.broker.authorization);
            let persistence = format!("{:?}", default.broker.persistence);
            let nested = authorization.matches(": ").count() + persistence.matches(": ").count();
            let not_in_file = if section == "broker" { 7 + nested } else { 0 };
            let knobs = debug.matches(": ").count() - not_in_file;
            assert_eq!(table.len(), knobs, "every {section} knob is listed");
        }
    }

    #[test]
    fn probe_timings_out_of_range_are_refused_before_anything_opens() {
        let refused = |f: &dyn Fn(&mut CoordinationSection)| {
            let mut config = ServerConfig::default();
            f(&mut config.coordination);
            let error = Settings::validate(config, MetadataBackend::Embedded).unwrap_err();
            assert!(matches!(error, ConfigError::CoordinationSection(_)), "{error}");
            error.to_string()
        };
        assert!(refused(&|c| c.probe_interval_ms = 0).contains("probe_interval_ms"));
        assert!(refused(&|c| c.probe_timeout_ms = 120_000).contains("probe_timeout_ms"));
        assert!(refused(&|c| c.dead_after_timed_out_probes = 0).contains("dead_after"));
        let config = CoordinationSection { probe_interval_ms: 200, ..Default::default() };
        let shell = config.to_config().unwrap();
        assert_eq!(shell.probe_interval, Duration::from_millis(200));
        assert_eq!(shell.liveness, magnetar_coordination::LivenessConfig::default());
    }

    #[test]
    fn the_disk_reserve_is_two_segments_by_default_and_none_or_at_least_one() {
        let ledger = ledger_store_config(&ServerConfig::default()).unwrap();
        assert_eq!(ledger.reserve_bytes, 2 * ledger.journal.segment_size_bytes);
        let with = |reserve_mb: u64, segment_size_bytes: u64| {
            let mut config = ServerConfig::default();
            config.storage.reserve_mb = reserve_mb;
            config.storage.segment_size_bytes = segment_size_bytes;
            config.storage.max_group_bytes = 1 << 20; // a segment holds two groups at least
            ledger_store_config(&config)
        };
        assert_eq!(with(0, 64 << 20).unwrap().reserve_bytes, 0);
        assert_eq!(with(4, 4 << 20).unwrap().reserve_bytes, 4 << 20);
        let refused = with(128, 256 << 20).unwrap_err();
        assert!(matches!(refused, ConfigError::Reserve { reserve_mb: 128, .. }), "{refused}");
        assert!(refused.to_string().contains("at least one segment"), "{refused}");
        assert!(matches!(with(1 << 41, 64 << 20), Err(ConfigError::ReserveTooLarge(_))));
    }

    #[test]
    fn journal_limits_are_checked_at_load_before_anything_opens() {
        let refused = |f: &dyn Fn(&mut StorageSection)| {
            let mut config = ServerConfig::default();
            f(&mut config.storage);
            let error = Settings::validate(config, MetadataBackend::Embedded).unwrap_err();
            assert!(matches!(error, ConfigError::Storage(_)), "{error}");
            error.to_string()
        };
        let why = refused(&|storage| storage.segment_size_bytes = 1000);
        assert!(why.contains("segment_size_bytes (1000)"), "{why}");
        // Two groups no longer fit a default segment.
        let why = refused(&|storage| storage.max_group_bytes = 48 << 20);
        assert!(why.contains("at least twice max_group_bytes"), "{why}");
        assert!(storage_node_config(None, Path::new("unused")).is_ok(), "the defaults are valid");
    }

    #[test]
    fn ledgers_on_storage_nodes_need_etcd_and_valid_quorums() {
        let etcd = MetadataBackend::Etcd(EtcdStoreConfig::new(vec!["127.0.0.1:2379".into()], "c"));
        let with = |f: &dyn Fn(&mut LedgersSection), metadata: &MetadataBackend| {
            let mut config = ServerConfig::default();
            config.ledgers.storage = "nodes".into();
            f(&mut config.ledgers);
            Settings::validate(config, metadata.clone())
        };
        let settings = with(&|_| {}, &etcd).expect("Pulsar's 2/2/2 on etcd");
        let persistence = &settings.config.broker.persistence;
        assert_eq!(
            (persistence.ensemble_size, persistence.write_quorum, persistence.ack_quorum),
            (2, 2, 2)
        );
        let refused = |f: &dyn Fn(&mut LedgersSection), metadata: &MetadataBackend| {
            let result = with(f, metadata);
            assert!(matches!(result, Err(ConfigError::LedgersSection(_))), "{result:?}");
        };
        refused(&|_| {}, &MetadataBackend::Embedded);
        refused(&|l| l.storage = "s3".into(), &etcd);
        refused(&|l| l.ack_quorum = 3, &etcd);
        refused(&|l| l.ack_quorum = 0, &etcd);
        refused(&|l| l.ensemble_size = 3, &etcd);
        refused(&|l| l.add_timeout_millis = 0, &etcd);
        refused(&|l| l.speculative_read_millis = 0, &etcd);
        refused(&|l| l.read_timeout_millis = 200, &etcd);
        refused(&|l| l.read_timeout_millis = 600_001, &etcd);
        refused(&|l| l.secondary_isolation_groups = "g2".into(), &etcd);
        let isolated = with(
            &|l| {
                l.isolation_groups = "g1".into();
                l.secondary_isolation_groups = "g2".into();
            },
            &etcd,
        )
        .expect("broker-wide isolation groups");
        let groups = isolated.config.broker.persistence.isolation.expect("groups");
        assert!(groups.primary.contains("g1") && groups.secondary.contains("g2"), "{groups:?}");
        let local = Settings::validate(ServerConfig::default(), MetadataBackend::Embedded).unwrap();
        assert_eq!(local.config.broker.persistence, magnetar_ledger::LedgerMetadata::local());
    }

    #[test]
    fn authorization_needs_authentication() {
        let mut config = ServerConfig::default();
        config.authorization.enabled = true;
        config.authorization.super_user_roles = vec!["admin".into()];
        let refused = Settings::validate(config, MetadataBackend::Embedded);
        assert!(matches!(refused, Err(ConfigError::Authorization(_))), "{refused:?}");
        let mut config = ServerConfig::default();
        config.authorization.super_user_roles = vec!["admin".into()];
        let settings = Settings::validate(config, MetadataBackend::Embedded).expect("valid");
        assert_eq!(settings.config.broker.authorization.super_user_roles, ["admin"]);
    }

    fn broker_args() -> ServerArgs {
        ServerArgs::default()
    }

    fn load_broker(url: &str, cluster: &str) -> Result<Settings, ConfigError> {
        Settings::load(&broker_args(), Mode::Broker { metadata_url: url, cluster })
    }

    #[test]
    fn broker_settings_on_etcd() {
        let settings = load_broker("etcd://10.0.0.1:2379,10.0.0.2:2379", "c1").unwrap();
        let MetadataBackend::Etcd(etcd) = &settings.metadata else { panic!("etcd expected") };
        assert_eq!(etcd.endpoints, ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]);
        assert_eq!(etcd.root, "/magnetar/c1");
        assert_eq!(etcd.session_ttl, Duration::from_secs(10));
        assert_eq!(settings.config.cluster, "c1");
        let standalone = Settings::load(&broker_args(), Mode::Standalone).unwrap();
        assert!(matches!(standalone.metadata, MetadataBackend::Embedded));
        assert_eq!(standalone.config.cluster, "standalone");
    }

    #[test]
    fn bad_input_is_refused_with_one_line() {
        let cases = [
            load_broker("etcd://", "c1"),
            load_broker("zk://h:2181", "c1"),
            load_broker("etcd://h:99999", "c1"),
            load_broker("etcd://h:2379", ""),
            load_broker("etcd://h:2379", "a/b"),
        ];
        for result in cases {
            let error = result.expect_err("refused");
            let line = error.to_string();
            assert!(!line.is_empty() && !line.contains('\n'), "{line:?}");
        }
        assert!(matches!(load_broker("etcd://h", ""), Err(ConfigError::ClusterName(_))));
        let args = ServerArgs { advertised_address: Some("pulsar://h:1".into()), ..broker_args() };
        assert!(matches!(
            Settings::load(&args, Mode::Standalone),
            Err(ConfigError::AdvertisedAddress(_))
        ));
        assert!(valid_host("[::1]") && valid_host("broker-0.example") && !valid_host(""));
    }

    #[test]
    fn tls_section_is_checked_before_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tls.toml");
        let args = ServerArgs { config: Some(path.clone()), ..broker_args() };
        let missing = dir.path().join("missing.pem");
        std::fs::write(
            &path,
            format!("[tls]\nenabled = true\ncert_file = {missing:?}\nkey_file = {missing:?}\n"),
        )
        .unwrap();
        let error = Settings::load(&args, Mode::Standalone).expect_err("missing file");
        assert!(matches!(error, ConfigError::Tls(TlsError::Read { what: "cert_file", .. })));
        assert!(error.to_string().contains("missing.pem"), "{error}");
        std::fs::write(&path, "[tls]\nplain_ports_enabled = false\n").unwrap();
        let error = Settings::load(&args, Mode::Standalone).expect_err("no listener");
        assert!(matches!(error, ConfigError::Tls(TlsError::NoListener)), "{error}");
        std::fs::write(
            &path,
            "web_port = 6651\n[tls]\nenabled = true\ncert_file = \"c\"\nkey_file = \"k\"\n",
        )
        .unwrap();
        let error = Settings::load(&args, Mode::Standalone).expect_err("port clash");
        assert!(
            matches!(error, ConfigError::Tls(TlsError::PortClash { port: 6651, .. })),
            "{error}"
        );
        let plain = Settings::load(&broker_args(), Mode::Standalone).unwrap();
        assert!(plain.tls.is_none());
    }

    #[test]
    fn tls_to_storage_nodes_is_checked_before_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledgers.toml");
        let args = ServerArgs { config: Some(path.clone()), ..broker_args() };
        let load = |ledgers: &str| {
            std::fs::write(&path, format!("[ledgers]\n{ledgers}")).unwrap();
            Settings::load(&args, Mode::Standalone)
        };
        let error = load("tls_cert_file = \"c.pem\"\n").expect_err("a certificate without key");
        assert!(error.to_string().contains("go together"), "{error}");
        let error = load("tls_cert_file = \"c\"\ntls_key_file = \"k\"\n").expect_err("no CAs");
        assert!(error.to_string().contains("needs tls_trust_certs_file"), "{error}");
        let missing = dir.path().join("missing-ca.pem");
        let error = load(&format!("tls_trust_certs_file = {missing:?}\n")).expect_err("no file");
        assert!(error.to_string().contains("missing-ca.pem"), "{error}");
        let settings = load("").unwrap();
        assert!(settings.ledger_client_tls.is_none());
    }

    #[test]
    fn a_storage_node_s_tls_is_checked_before_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        let missing = dir.path().join("missing.pem");
        std::fs::write(
            &path,
            format!("[tls]\nenabled = true\ncert_file = {missing:?}\nkey_file = {missing:?}\n"),
        )
        .unwrap();
        let error = storage_node_config(Some(&path), dir.path()).expect_err("missing file");
        assert!(matches!(error, ConfigError::Tls(TlsError::Read { what: "cert_file", .. })));
        std::fs::write(&path, "[tls]\nenabled = true\n").unwrap();
        let error = storage_node_config(Some(&path), dir.path()).expect_err("no cert_file");
        assert!(matches!(error, ConfigError::Tls(TlsError::Missing { key: "cert_file" })));
        let (_, tls, plain_clients) = storage_node_config(None, dir.path()).unwrap();
        assert!(tls.is_none() && !plain_clients);
        // Plain-text clients next to TLS ones only where TLS is on.
        std::fs::write(&path, "[tls]\nstorage_plain_clients = true\n").unwrap();
        let error = storage_node_config(Some(&path), dir.path()).expect_err("TLS off");
        assert!(matches!(error, ConfigError::Tls(TlsError::PlainClientsWithoutTls)), "{error}");
    }

    #[test]
    fn a_bad_file_is_one_line_too() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, "[storage]\nsync_mode = \"sometimes\"\n").unwrap();
        let args = ServerArgs { config: Some(path.clone()), ..broker_args() };
        assert!(matches!(Settings::load(&args, Mode::Standalone), Err(ConfigError::SyncMode(_))));
        std::fs::write(&path, "[metadata]\nsession_ttl = 3\n").unwrap();
        let error = Settings::load(&args, Mode::Standalone).expect_err("unknown field");
        assert!(!error.to_string().contains('\n'), "{error}");
        std::fs::write(&path, "[metadata]\nsession_ttl_seconds = 0\n").unwrap();
        let result = Settings::load(&args, Mode::Broker { metadata_url: "etcd://h", cluster: "c" });
        assert!(matches!(result, Err(ConfigError::MetadataSection(_))));
    }
}
