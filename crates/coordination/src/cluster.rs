//! The shell of coordination over the metadata store (etcd in a cluster): bundle ownership
//! records bound to this broker's session, lookups answered from them, and the probes that tell
//! a dead owner from a live one. The decisions are the pure modules' ([`crate::ownership`],
//! [`crate::liveness`], [`crate::placement`]); this file reads, writes and watches.
//!
//! - A bundle's record is the ephemeral key `/namespace/{tenant}/{namespace}/{range}` (the path
//!   Pulsar's ownership cache uses), holding the record's state and the owner's URLs (Pulsar's
//!   `NamespaceEphemeralData`). Absent is Init/Free. The owner's session going (a broker killed
//!   and its lease run out, or its etcd contact lost) deletes it.
//! - A broker acquires a bundle for itself only, by compare-and-set on the version it read, so
//!   the key's lease is always its owner's: a lookup on another broker redirects there with
//!   `authoritative` (Pulsar's leader-chosen candidate), and the candidate acquires.
//! - A record naming a broker that is not registered, or that its probes say is dead, is taken
//!   over at the next lookup without waiting for its lease: the new owner fences the ledgers of
//!   every topic it loads, which is what keeps a slow (not dead) old owner from writing.
//! - A broker serves a topic only while its bundle is in `owned`; a record written by another
//!   broker, a deleted record, or a lost session removes it, and [`ClusterOwnership::lost`]
//!   tells the broker to close the bundle's topics (their clients look them up again).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use magnetar_metadata::{
    ExpectedVersion, MetadataError, SessionEvent, SessionStore, WatchEvent, WatchStream,
};
use magnetar_model::listeners::{AdvertisedListeners, Listener};
use magnetar_model::names::{NamespaceName, TopicName};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use crate::liveness::{Liveness, LivenessConfig, Probe};
use crate::ownership::{OwnershipRecord, TransitionError, UnitState};
use crate::{BundleRange, Bundles};

mod hand_over;
mod isolation;
mod load;
pub use hand_over::HAND_OVER_WAIT;
pub use isolation::ISOLATION_SUFFIX;
pub use load::{LoadManagerConfig, TopicLoad, TopicLoads, LEADER_KEY, LOAD_ROOT};

/// Parent of every bundle ownership record.
pub const OWNERSHIP_ROOT: &str = "/namespace";
/// Parent of every broker registration (`magnetar_model::keys::BROKERS_ROOT`).
const BROKERS_ROOT: &str = "/brokers";
/// Parent of every namespace's policies (`magnetar_model::keys::NAMESPACES_ROOT`).
const NAMESPACES_ROOT: &str = "/admin/namespaces";

/// `/namespace/{tenant}/{namespace}/{range}`.
pub fn ownership_key(ns: &NamespaceName, range: BundleRange) -> String {
    format!("{OWNERSHIP_ROOT}/{}/{}/{}", ns.tenant(), ns.namespace(), range.name())
}

/// The namespace and range an ownership key names.
fn parse_ownership_key(key: &str) -> Option<(NamespaceName, BundleRange)> {
    let rest = key.strip_prefix(OWNERSHIP_ROOT)?.strip_prefix('/')?;
    let mut parts = rest.split('/');
    let (tenant, namespace, range) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    Some((NamespaceName::new(tenant, namespace).ok()?, BundleRange::parse(range).ok()?))
}

/// Where a broker is reached: its id (`host:web-port`, its registration's name) and URLs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerUrls {
    pub id: String,
    pub service_url: String,
    pub service_url_tls: Option<String>,
    pub web_url: String,
    pub web_url_tls: Option<String>,
    /// Its advertised listeners: a client naming one is answered that listener's URLs.
    #[serde(default)]
    pub listeners: AdvertisedListeners,
}

/// A lookup's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// `broker` owns the topic's bundle (it may be this broker).
    Connect(BrokerUrls),
    /// Ask `broker`, which is to take the bundle (`authoritative`: Pulsar's flag telling it
    /// not to redirect again).
    Redirect { broker: BrokerUrls, authoritative: bool },
}

#[derive(Debug, thiserror::Error)]
pub enum CoordinationError {
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    #[error("Namespace bundle {bundle} for topic {topic} not served by this instance")]
    NotServed { topic: String, bundle: String },
    #[error("namespace bundle {0} is being unloaded: retry")]
    Releasing(String),
    #[error("namespace {0} does not exist")]
    NamespaceNotFound(String),
    #[error("no broker is available to own namespace bundle {0} now: retry")]
    NoBroker(String),
    #[error("Destination broker {0} is not an available broker of the cluster")]
    NotABroker(String),
    #[error("ownership of {key} kept changing: retry")]
    Contended { key: String },
    #[error("stored metadata at {key} is corrupt: {reason}")]
    Corrupt { key: String, reason: String },
    #[error(transparent)]
    Transition(#[from] TransitionError),
}

/// Timings of the shell. Defaults in [`Default`].
#[derive(Debug, Clone)]
pub struct CoordinationConfig {
    /// How often every other broker is probed. Default 500 ms.
    pub probe_interval: Duration,
    /// How long a probe waits for an answer. Default 1 s.
    pub probe_timeout: Duration,
    /// Missed probes that make a broker dead.
    pub liveness: LivenessConfig,
}

impl Default for CoordinationConfig {
    fn default() -> Self {
        CoordinationConfig {
            probe_interval: Duration::from_millis(500),
            probe_timeout: Duration::from_secs(1),
            liveness: LivenessConfig::default(),
        }
    }
}

/// The stored form of a record: the state, the brokers it names, and the owner's URLs (what a
/// lookup answers without another read).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredRecord {
    state: String,
    dst: Option<String>,
    src: Option<String>,
    native_url: Option<String>,
    native_url_tls: Option<String>,
    http_url: Option<String>,
    http_url_tls: Option<String>,
    disabled: bool,
}

fn state_name(state: UnitState) -> &'static str {
    match state {
        UnitState::Init => "Init",
        UnitState::Free => "Free",
        UnitState::Owned => "Owned",
        UnitState::Assigning => "Assigning",
        UnitState::Releasing => "Releasing",
        UnitState::Splitting => "Splitting",
        UnitState::Deleted => "Deleted",
    }
}

fn parse_state(name: &str) -> Option<UnitState> {
    UnitState::ALL.into_iter().find(|s| state_name(*s) == name)
}

/// A bundle this broker lost, or was asked to hand over, for the broker to close its topics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostBundle {
    pub namespace: NamespaceName,
    pub range: BundleRange,
    /// Another broker asked for a hand-over: close the topics telling clients `to`, then call
    /// [`ClusterOwnership::released`] with `key`.
    pub release: Option<HandOver>,
}

/// A hand-over another broker asked of this one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandOver {
    pub key: String,
    /// The broker the bundle goes to (`None`: it is freed).
    pub to: Option<BrokerUrls>,
}

#[derive(Default)]
struct State {
    /// Bundles this broker serves: ownership key -> the version it wrote.
    owned: HashMap<String, u64>,
    /// Bundles this broker is releasing (not served, not re-acquired by a lookup here).
    releasing: HashSet<String>,
    /// Of those, the ones handed over to another broker: key -> that broker.
    handing_over: HashMap<String, BrokerUrls>,
    /// Bundles this broker handed over (Assigning to another broker, bound to this broker's
    /// session until that broker owns them).
    handed_off: HashSet<String>,
    /// Namespace bundles, read on first use, forgotten when the namespace's policies change.
    bundles: HashMap<NamespaceName, Bundles>,
    /// Registered brokers (this one included).
    brokers: BTreeMap<String, BrokerUrls>,
    /// Every ownership record seen: key -> the broker it names.
    owners: HashMap<String, String>,
    /// The metadata session is lost: this broker's records are gone (or going) with it, and it
    /// keeps serving its bundles until a new session writes them again (or finds them taken).
    session_lost: bool,
    /// The session this broker's records were last written under: a record deleted by the end of
    /// an older one is re-written, not lost.
    owned_session: Option<magnetar_metadata::SessionId>,
    liveness: Liveness,
    /// When each other broker was last probed on a lookup's behalf ([`ON_DEMAND_PROBE_GAP`]).
    probed_on_demand: HashMap<String, std::time::Instant>,
    /// The cluster's namespace isolation policies, as last read.
    isolation: crate::isolation::IsolationPolicies,
    /// The load manager's leader, as last read.
    leader: Option<String>,
}

/// Bundle ownership for one broker of a cluster.
pub struct ClusterOwnership {
    store: Arc<dyn SessionStore>,
    me: BrokerUrls,
    state: Mutex<State>,
    lost: broadcast::Sender<LostBundle>,
    /// Woken at every change of an ownership record (a hand-over waits on it).
    changed: tokio::sync::Notify,
    /// Requests held for a hand-over to this broker to finish, now.
    hand_over_waits: std::sync::atomic::AtomicUsize,
    /// Refused probes in a row that make a broker dead ([`LivenessConfig::refused_misses`]).
    refused_misses: u32,
}

/// A lookup that would send its client to another broker probes that broker first, at most this
/// often per broker (see [`ClusterOwnership::probe_owner_now`]).
const ON_DEMAND_PROBE_GAP: Duration = Duration::from_millis(100);
/// How long a lookup's probe waits for the connection (loopback or a LAN: microseconds).
const ON_DEMAND_PROBE_TIMEOUT: Duration = Duration::from_millis(100);

/// A lookup reads, decides and writes at most this many times before it gives up (each retry
/// follows a compare-and-set lost to another broker).
const MAX_ATTEMPTS: usize = 5;

impl ClusterOwnership {
    /// Reads the registered brokers and the ownership records, then follows their changes, this
    /// broker's session and the namespaces' bundles, and probes the other brokers, until the
    /// store closes or the returned handle is dropped.
    pub async fn start(
        store: Arc<dyn SessionStore>,
        me: BrokerUrls,
        config: CoordinationConfig,
    ) -> Result<Arc<ClusterOwnership>, CoordinationError> {
        let (lost, _) = broadcast::channel(1024);
        let state = State { liveness: Liveness::new(config.liveness), ..State::default() };
        let changed = tokio::sync::Notify::new();
        let this = Arc::new(ClusterOwnership {
            store,
            me,
            state: Mutex::new(state),
            lost,
            changed,
            hand_over_waits: Default::default(),
            refused_misses: config.liveness.refused_misses,
        });
        // Watches first, then the reads: nothing changed in between is missed.
        let brokers = this.store.watch(&format!("{BROKERS_ROOT}/")).await?;
        let records = this.store.watch(&format!("{OWNERSHIP_ROOT}/")).await?;
        let namespaces = this.store.watch(&format!("{NAMESPACES_ROOT}/")).await?;
        let clusters = this.store.watch(&format!("{}/", isolation::CLUSTERS_ROOT)).await?;
        this.reload_brokers().await?;
        this.reload_isolation().await?;
        this.reload_records().await?;
        let mut sessions = this.store.session_events();
        let weak = Arc::downgrade(&this);
        tokio::spawn(follow(weak.clone(), brokers, Watched::Brokers));
        tokio::spawn(follow(weak.clone(), records, Watched::Records));
        tokio::spawn(follow(weak.clone(), namespaces, Watched::Namespaces));
        tokio::spawn(follow(weak.clone(), clusters, Watched::Clusters));
        let session_weak = weak.clone();
        tokio::spawn(async move {
            while let Some(event) = sessions.recv().await {
                let Some(this) = session_weak.upgrade() else { return };
                match event {
                    SessionEvent::SessionLost { .. } => {
                        // Pulsar's `reconnect` policy: the loaded topics stay served (their
                        // ledgers fence a broker that takes them meanwhile) until a new session
                        // writes the records again or finds them taken.
                        this.state.lock().session_lost = true;
                        tracing::warn!("metadata session lost: bundles kept until it is back");
                    }
                    SessionEvent::SessionReestablished { .. } | SessionEvent::Lagged => {
                        this.reacquire().await;
                    }
                    _ => {}
                }
            }
        });
        tokio::spawn(probe_brokers(weak, config));
        Ok(this)
    }

    /// Whether the probes say `broker` is dead.
    pub fn is_dead(&self, broker: &str) -> bool {
        self.state.lock().liveness.is_dead(broker)
    }

    /// This broker.
    pub fn me(&self) -> &BrokerUrls {
        &self.me
    }

    /// Bundles this broker lost (to another broker, or with its session): close their topics.
    pub fn lost(&self) -> broadcast::Receiver<LostBundle> {
        self.lost.subscribe()
    }

    /// The bundles this broker owns, as `{tenant}/{namespace}/{range}`, sorted.
    pub fn owned_bundles(&self) -> Vec<String> {
        let state = self.state.lock();
        let mut out: Vec<String> = state
            .owned
            .keys()
            .filter_map(|k| k.strip_prefix(OWNERSHIP_ROOT).map(|k| k[1..].to_string()))
            .collect();
        out.sort();
        out
    }

    /// Who owns what: broker id -> the number of bundles its records name.
    pub fn load(&self) -> BTreeMap<String, usize> {
        let state = self.state.lock();
        let mut counts: BTreeMap<String, usize> =
            state.brokers.keys().map(|id| (id.clone(), 0)).collect();
        counts.extend(owner_counts(&state));
        counts
    }

    /// The bundle `topic` hashes into.
    pub async fn bundle_of(&self, topic: &TopicName) -> Result<BundleRange, CoordinationError> {
        let ns = topic.namespace();
        if let Some(bundles) = self.state.lock().bundles.get(ns) {
            return Ok(bundles.find_topic(&topic.to_string()));
        }
        let bundles = self.read_bundles(ns).await?;
        let range = bundles.find_topic(&topic.to_string());
        self.state.lock().bundles.insert(ns.clone(), bundles);
        Ok(range)
    }

    /// The bundle `topic` is in, if the namespace's bundles are known here (no I/O).
    pub fn cached_bundle_of(&self, topic: &TopicName) -> Option<BundleRange> {
        let state = self.state.lock();
        state.bundles.get(topic.namespace()).map(|b| b.find_topic(&topic.to_string()))
    }

    async fn read_bundles(&self, ns: &NamespaceName) -> Result<Bundles, CoordinationError> {
        let key = format!("{NAMESPACES_ROOT}/{}/{}", ns.tenant(), ns.namespace());
        let Some(found) = self.store.get(&key).await? else {
            return Err(CoordinationError::NamespaceNotFound(ns.to_string()));
        };
        let corrupt = |reason: String| CoordinationError::Corrupt { key: key.clone(), reason };
        let doc: serde_json::Value =
            serde_json::from_slice(&found.value).map_err(|e| corrupt(e.to_string()))?;
        let boundaries: Vec<String> = doc["bundles"]["boundaries"]
            .as_array()
            .map(|b| b.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
            .unwrap_or_default();
        if boundaries.is_empty() {
            // A namespace written before bundles were kept: one bundle, as the admin API shows.
            return Bundles::even(1).map_err(|e| corrupt(e.to_string()));
        }
        Bundles::from_boundaries(&boundaries).map_err(|e| corrupt(e.to_string()))
    }

    /// Whether this broker may serve `topic` now: only while it owns the topic's bundle.
    pub async fn check_serve(&self, topic: &TopicName) -> Result<(), CoordinationError> {
        let range = self.bundle_of(topic).await?;
        let key = ownership_key(topic.namespace(), range);
        if self.state.lock().owned.contains_key(&key) || self.await_hand_over(&key).await? {
            return Ok(());
        }
        Err(CoordinationError::NotServed { topic: topic.to_string(), bundle: range.name() })
    }

    /// Answers a lookup of `topic` (`authoritative`: the client was redirected here to take it).
    pub async fn lookup(
        &self,
        topic: &TopicName,
        authoritative: bool,
    ) -> Result<Lookup, CoordinationError> {
        let ns = topic.namespace();
        for _ in 0..MAX_ATTEMPTS {
            let range = self.bundle_of(topic).await?;
            let key = ownership_key(ns, range);
            {
                let state = self.state.lock();
                if state.owned.contains_key(&key) {
                    return Ok(Lookup::Connect(self.me.clone()));
                }
                if let Some(to) = state.handing_over.get(&key) {
                    return Ok(Lookup::Connect(to.clone()));
                }
                if state.releasing.contains(&key) {
                    return Err(CoordinationError::Releasing(range.name()));
                }
            }
            let (record, stored) = self.read_record(&key).await?;
            self.learn_brokers_named(&record).await?;
            self.probe_owner_now(&record).await;
            let decision = self.decide(&key, &record, stored.as_ref(), authoritative);
            match decision {
                Decision::Connect(owner) => return Ok(Lookup::Connect(owner)),
                Decision::Redirect(to) => {
                    return Ok(Lookup::Redirect { broker: to, authoritative: true })
                }
                Decision::HandOver => return Err(CoordinationError::Releasing(range.name())),
                Decision::Wait => return Err(CoordinationError::NoBroker(range.name())),
                Decision::StaleBundles => {
                    self.state.lock().bundles.remove(ns);
                }
                Decision::Acquire(next) => {
                    if self.write_record(&key, record.version, &next).await? {
                        tracing::info!(bundle = %key, "bundle owned");
                        return Ok(Lookup::Connect(self.me.clone()));
                    }
                }
            }
        }
        Err(CoordinationError::Contended { key: ownership_key(ns, self.bundle_of(topic).await?) })
    }

    /// A record may name a broker whose registration this broker has not read yet: its watch of
    /// the registrations lags the record's (as after this process was paused). Read it, so that
    /// a live owner is not taken for a dead one and its bundle taken from it.
    async fn learn_brokers_named(&self, record: &OwnershipRecord) -> Result<(), CoordinationError> {
        for id in [record.dst.as_deref(), record.src.as_deref()].into_iter().flatten() {
            if id == self.me.id || self.state.lock().brokers.contains_key(id) {
                continue;
            }
            if let Some(urls) = self.read_broker(&format!("{BROKERS_ROOT}/{id}")).await? {
                tracing::info!(broker = %id, "registration read ahead of its watch");
                self.state.lock().brokers.entry(id.to_string()).or_insert(urls);
            }
        }
        Ok(())
    }

    /// Right after an owner dies its clients look up again (within 100 ms), long before the
    /// next periodic probe finds it dead, and every answer naming it costs each client a
    /// reconnect back-off that doubles. So a lookup about to name another broker first checks
    /// that something listens there, with a bare connect: refusals count as the periodic
    /// probes' do (the probe is repeated while refused, up to the refusals that make a broker
    /// dead), anything else is left to the periodic probes (a frozen process's kernel still
    /// accepts connections). At most one per broker per [`ON_DEMAND_PROBE_GAP`].
    async fn probe_owner_now(&self, record: &OwnershipRecord) {
        if record.state != UnitState::Owned {
            return;
        }
        let Some(owner) = record.dst.as_deref().filter(|o| *o != self.me.id) else { return };
        let address = {
            let mut state = self.state.lock();
            if state.liveness.is_dead(owner) {
                return;
            }
            let Some(urls) = state.brokers.get(owner) else { return };
            let address = host_port(&urls.web_url);
            let now = std::time::Instant::now();
            if state
                .probed_on_demand
                .get(owner)
                .is_some_and(|at| now.duration_since(*at) < ON_DEMAND_PROBE_GAP)
            {
                return;
            }
            state.probed_on_demand.insert(owner.to_string(), now);
            address
        };
        for _ in 0..self.refused_misses {
            let connect = tokio::net::TcpStream::connect(&address);
            let refused = match tokio::time::timeout(ON_DEMAND_PROBE_TIMEOUT, connect).await {
                Ok(Err(error)) => error.kind() == std::io::ErrorKind::ConnectionRefused,
                Ok(Ok(_)) | Err(_) => false,
            };
            if !refused {
                return;
            }
            if self.state.lock().liveness.observe(owner, Probe::Refused) {
                tracing::warn!(broker = %owner, "broker unreachable (a lookup's probe): its bundles may be taken over");
                return;
            }
        }
    }

    fn decide(
        &self,
        key: &str,
        record: &OwnershipRecord,
        stored: Option<&StoredRecord>,
        authoritative: bool,
    ) -> Decision {
        let state = self.state.lock();
        let alive = |id: &str| state.brokers.contains_key(id) && !state.liveness.is_dead(id);
        let candidate = || {
            if authoritative {
                return Some(self.me.id.clone());
            }
            let load = owner_counts(&state);
            let eligible = isolation::eligible(&state, key, None);
            crate::placement::least_loaded(key, eligible.into_iter(), &load)
        };
        let me = self.me.id.as_str();
        let take = |next: Result<OwnershipRecord, TransitionError>| match (candidate(), next) {
            // Without a session this broker's record would die with the old lease: it takes
            // nothing until the new session is there (the client retries).
            (Some(c), Ok(_)) if c == me && state.session_lost => Decision::Wait,
            (Some(c), Ok(next)) if c == me => Decision::Acquire(next),
            (Some(c), _) => match state.brokers.get(&c) {
                Some(urls) => Decision::Redirect(urls.clone()),
                None => Decision::Wait,
            },
            (None, _) => Decision::Wait,
        };
        match (record.state, record.dst.as_deref(), record.src.as_deref()) {
            (UnitState::Owned | UnitState::Assigning, Some(owner), _) if owner != me => {
                if alive(owner) {
                    let urls = state
                        .brokers
                        .get(owner)
                        .cloned()
                        .or_else(|| stored.and_then(|s| urls_of(owner, s)));
                    return urls.map_or(Decision::Wait, Decision::Connect);
                }
                take(record.take_over(owner, me).and_then(|r| r.own(me)))
            }
            // Handed over to this broker: take it.
            (UnitState::Assigning, Some(_), _) if !state.session_lost => {
                record.own(me).map_or(Decision::Wait, Decision::Acquire)
            }
            (UnitState::Assigning, Some(_), _) => Decision::Wait,
            // This broker's own record from before a restart (an older session's lease): take
            // it back under this session.
            (UnitState::Owned, Some(_), _) => {
                take(record.take_over(me, me).and_then(|r| r.own(me)))
            }
            // A hand-over under way: the client goes to the broker it goes to, which holds the
            // request until the old owner is done.
            (UnitState::Releasing, Some(dst), Some(src)) if alive(src) && alive(dst) => {
                let urls = state.brokers.get(dst).cloned();
                urls.map_or(Decision::HandOver, Decision::Connect)
            }
            (UnitState::Releasing, _, Some(src)) if alive(src) && src != me => Decision::HandOver,
            (UnitState::Releasing | UnitState::Splitting, _, _) => {
                let dead = record.src.as_deref().or(record.dst.as_deref()).unwrap_or(me);
                take(record.take_over(dead, me).and_then(|r| r.own(me)))
            }
            (UnitState::Deleted, _, _) => Decision::StaleBundles,
            _ => take(record.assign(me).and_then(|r| r.own(me))),
        }
    }

    async fn read_record(
        &self,
        key: &str,
    ) -> Result<(OwnershipRecord, Option<StoredRecord>), CoordinationError> {
        let Some(found) = self.store.get(key).await? else {
            return Ok((OwnershipRecord::init(), None));
        };
        let corrupt = |reason: String| CoordinationError::Corrupt { key: key.into(), reason };
        let stored: StoredRecord =
            serde_json::from_slice(&found.value).map_err(|e| corrupt(e.to_string()))?;
        let state = parse_state(&stored.state).ok_or_else(|| corrupt(stored.state.clone()))?;
        let record = OwnershipRecord {
            state,
            dst: stored.dst.clone(),
            src: stored.src.clone(),
            version: found.version,
        };
        Ok((record, Some(stored)))
    }

    /// Stores `next` (a record naming this broker) by compare-and-set on `read_version`, bound
    /// to this broker's session; `false` when another write came first.
    async fn write_record(
        &self,
        key: &str,
        read_version: u64,
        next: &OwnershipRecord,
    ) -> Result<bool, CoordinationError> {
        assert!(next.serves(&self.me.id), "a broker writes only records it owns by");
        let Some(version) = self.put_record(key, read_version, next, &self.me).await? else {
            return Ok(false);
        };
        let session = self.store.session().id();
        let mut state = self.state.lock();
        state.owned_session = session;
        state.owned.insert(key.to_string(), version);
        state.owners.insert(key.to_string(), self.me.id.clone());
        Ok(true)
    }

    /// Writes `next` at `key` if the record is still at `read_version` (0: absent), naming
    /// `urls` as where the bundle is served; the new version, or None when another write won.
    async fn put_record(
        &self,
        key: &str,
        read_version: u64,
        next: &OwnershipRecord,
        urls: &BrokerUrls,
    ) -> Result<Option<u64>, CoordinationError> {
        let stored = StoredRecord {
            state: state_name(next.state).to_string(),
            dst: next.dst.clone(),
            src: next.src.clone(),
            native_url: Some(urls.service_url.clone()),
            native_url_tls: urls.service_url_tls.clone(),
            http_url: Some(urls.web_url.clone()),
            http_url_tls: urls.web_url_tls.clone(),
            disabled: false,
        };
        let value = Bytes::from(serde_json::to_vec(&stored).expect("a record serializes"));
        let expected = match read_version {
            0 => ExpectedVersion::Absent,
            v => ExpectedVersion::Exactly(v),
        };
        match self.store.put_ephemeral(key, value, expected).await {
            Ok(version) => Ok(Some(version)),
            Err(MetadataError::BadVersion { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Stops serving the bundles of `ns` this broker owns (`range`: one of them), and returns
    /// them: close their topics, then [`ClusterOwnership::released`] frees them.
    pub fn stop_serving(&self, ns: &NamespaceName, range: Option<BundleRange>) -> Vec<String> {
        let mut state = self.state.lock();
        let keys: Vec<String> = state
            .owned
            .keys()
            .filter(|key| {
                parse_ownership_key(key)
                    .is_some_and(|(n, r)| &n == ns && range.is_none_or(|want| want == r))
            })
            .cloned()
            .collect();
        for key in &keys {
            state.owned.remove(key);
            state.releasing.insert(key.clone());
        }
        keys
    }

    /// Stops serving every bundle (a broker shutting down).
    pub fn stop_serving_all(&self) -> Vec<String> {
        let mut state = self.state.lock();
        let keys: Vec<String> = state.owned.drain().map(|(k, _)| k).collect();
        state.releasing.extend(keys.iter().cloned());
        keys
    }

    /// Whether this broker owns (serves) the bundle `range` of `ns`.
    pub fn owns(&self, ns: &NamespaceName, range: BundleRange) -> bool {
        self.state.lock().owned.contains_key(&ownership_key(ns, range))
    }

    /// Whether `topic`'s bundle is among `keys` (as returned by `stop_serving`).
    pub fn in_bundles(&self, topic: &TopicName, keys: &[String]) -> bool {
        self.cached_bundle_of(topic)
            .is_some_and(|range| keys.contains(&ownership_key(topic.namespace(), range)))
    }

    /// Lets go of the bundles `stop_serving` returned, once their topics are closed: a bundle
    /// in hand-over is assigned to its new broker (`Assigning{dst}`), any other is freed (its
    /// record deleted), so the next lookup assigns it afresh.
    pub async fn released(&self, keys: &[String]) -> Result<(), CoordinationError> {
        let mut first_error = None;
        for key in keys {
            if let Err(error) = self.release_one(key).await {
                first_error.get_or_insert(error);
            }
            let mut state = self.state.lock();
            state.releasing.remove(key);
            state.handing_over.remove(key);
        }
        first_error.map_or(Ok(()), Err)
    }

    async fn release_one(&self, key: &str) -> Result<(), CoordinationError> {
        let me = self.me.id.as_str();
        let (record, _) = self.read_record(key).await?;
        let handed = record.state == UnitState::Releasing && record.src.as_deref() == Some(me);
        if handed {
            let next = record.released(me)?;
            let to = next.dst.as_deref().and_then(|d| self.state.lock().brokers.get(d).cloned());
            if let Some(to) = to.filter(|_| next.state == UnitState::Assigning) {
                if self.write_transition(key, record.version, &next, &to).await? {
                    self.state.lock().handed_off.insert(key.to_string());
                    tracing::info!(bundle = %key, to = %to.id, "bundle handed over");
                }
                return Ok(());
            }
        }
        if handed || record.dst.as_deref() == Some(me) {
            match self.store.delete(key, ExpectedVersion::Exactly(record.version)).await {
                Ok(()) | Err(MetadataError::NotFound { .. }) => {}
                Err(MetadataError::BadVersion { .. }) => {} // someone else's now
                Err(e) => return Err(e.into()),
            }
        }
        tracing::info!(bundle = %key, "bundle released");
        Ok(())
    }

    /// Unloads the bundles of `ns` (`range`: one of them) that other brokers own: each owner is
    /// asked to hand its bundle over to another broker through the bundle's record (a dead
    /// owner's record is deleted). Pulsar forwards such an unload to the owner; a record in the
    /// store reaches it just as well, and needs no route to it. Returns how many.
    pub async fn unload_elsewhere(
        &self,
        ns: &NamespaceName,
        range: Option<BundleRange>,
        wanted: Option<&str>,
    ) -> Result<usize, CoordinationError> {
        let prefix = format!("{OWNERSHIP_ROOT}/{}/{}/", ns.tenant(), ns.namespace());
        let mut keys = Vec::new();
        for key in self.store.list(&prefix).await? {
            let Some((_, r)) = parse_ownership_key(&key) else { continue };
            if range.is_some_and(|want| want != r) || self.state.lock().owned.contains_key(&key) {
                continue;
            }
            keys.push(key);
        }
        self.hand_over_elsewhere(keys, wanted).await
    }

    fn lose(&self, key: &str, why: &str) {
        let removed = self.state.lock().owned.remove(key).is_some();
        if removed {
            tracing::warn!(bundle = %key, why, "bundle lost");
            if let Some((namespace, range)) = parse_ownership_key(key) {
                let _ = self.lost.send(LostBundle { namespace, range, release: None });
            }
        }
    }

    /// After a new session: each bundle still served here gets its record back under the new
    /// session, or is given up when another broker took it meanwhile.
    async fn reacquire(&self) {
        let keys: Vec<String> = self.state.lock().owned.keys().cloned().collect();
        for key in keys {
            let written = async {
                let (record, _) = self.read_record(&key).await?;
                let next = match record.dst.as_deref() {
                    None => record.assign(&self.me.id).and_then(|r| r.own(&self.me.id)),
                    Some(owner) if owner == self.me.id && record.state.active() => {
                        // Still there, bound to the old session's lease: bind it to the new.
                        record.take_over(owner, owner).and_then(|r| r.own(owner))
                    }
                    Some(_) => return Ok(false),
                };
                match next {
                    Ok(next) => self.write_record(&key, record.version, &next).await,
                    Err(_) => Ok(false),
                }
            }
            .await;
            match written {
                Ok(true) => {
                    tracing::info!(bundle = %key, "bundle owned again under the new session")
                }
                Ok(false) => self.lose(&key, "another broker took it while the session was lost"),
                Err(error) => {
                    tracing::warn!(bundle = %key, %error, "bundle not re-acquired");
                    self.lose(&key, "its record could not be written again");
                }
            }
        }
        self.state.lock().session_lost = false;
    }

    async fn reload_brokers(&self) -> Result<(), CoordinationError> {
        let mut brokers = BTreeMap::new();
        for key in self.store.list(&format!("{BROKERS_ROOT}/")).await? {
            if let Some(urls) = self.read_broker(&key).await? {
                brokers.insert(urls.id.clone(), urls);
            }
        }
        self.state.lock().brokers = brokers;
        Ok(())
    }

    async fn read_broker(&self, key: &str) -> Result<Option<BrokerUrls>, CoordinationError> {
        let Some(id) = key.strip_prefix(BROKERS_ROOT).and_then(|k| k.strip_prefix('/')) else {
            return Ok(None);
        };
        let Some(found) = self.store.get(key).await? else { return Ok(None) };
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Registration {
            pulsar_service_url: String,
            web_service_url: String,
            #[serde(default)]
            pulsar_service_url_tls: Option<String>,
            #[serde(default)]
            web_service_url_tls: Option<String>,
            #[serde(default)]
            advertised_listeners: BTreeMap<String, Listener>,
            #[serde(default)]
            internal_listener_name: Option<String>,
        }
        match serde_json::from_slice::<Registration>(&found.value) {
            Ok(r) => Ok(Some(BrokerUrls {
                id: id.to_string(),
                service_url: r.pulsar_service_url,
                service_url_tls: r.pulsar_service_url_tls,
                web_url: r.web_service_url,
                web_url_tls: r.web_service_url_tls,
                listeners: AdvertisedListeners {
                    listeners: r.advertised_listeners,
                    internal: r.internal_listener_name,
                },
            })),
            Err(error) => {
                tracing::warn!(key, %error, "broker registration not understood: left out");
                Ok(None)
            }
        }
    }

    async fn reload_records(&self) -> Result<(), CoordinationError> {
        let mut owners = HashMap::new();
        for key in self.store.list(&format!("{OWNERSHIP_ROOT}/")).await? {
            if let Ok((record, _)) = self.read_record(&key).await {
                if let Some(owner) = record.dst.filter(|_| record.state.active()) {
                    owners.insert(key, owner);
                }
            }
        }
        let gone: Vec<String> = {
            let mut state = self.state.lock();
            state.owners = owners;
            let me = &self.me.id;
            let owned: Vec<String> = state.owned.keys().cloned().collect();
            owned.into_iter().filter(|k| state.owners.get(k) != Some(me)).collect()
        };
        for key in gone {
            // A hand-over asked of this broker is done as such; anything else is lost.
            self.on_record_changed(&key).await?;
        }
        Ok(())
    }

    /// Decides from the record as it is now, not from the event (a deletion may be followed by
    /// this broker's own write already).
    async fn on_record_changed(&self, key: &str) -> Result<(), CoordinationError> {
        let changed = self.record_changed(key).await;
        self.changed.notify_waiters();
        changed
    }

    async fn record_changed(&self, key: &str) -> Result<(), CoordinationError> {
        let (record, _) = self.read_record(key).await?;
        if record.version == 0 {
            let mut state = self.state.lock();
            state.owners.remove(key);
            let session_changed = self.store.session().id() != state.owned_session;
            let expected = state.releasing.contains(key) || state.session_lost || session_changed;
            drop(state);
            if !expected {
                self.lose(key, "its record was deleted");
            }
            return Ok(());
        }
        let names_me = record.serves(&self.me.id);
        {
            let mut state = self.state.lock();
            match record.dst.clone().filter(|_| record.state.active()) {
                Some(owner) => state.owners.insert(key.to_string(), owner),
                None => state.owners.remove(key),
            };
        }
        if !names_me && !self.on_hand_over_record(key, &record).await? {
            self.lose(key, "another broker took it");
        }
        Ok(())
    }

    async fn on_namespace_changed(&self, key: &str) -> Result<(), CoordinationError> {
        let Some(rest) = key.strip_prefix(NAMESPACES_ROOT).and_then(|k| k.strip_prefix('/')) else {
            return Ok(());
        };
        let Some((tenant, namespace)) = rest.split_once('/') else { return Ok(()) };
        let Ok(ns) = NamespaceName::new(tenant, namespace) else { return Ok(()) };
        self.state.lock().bundles.remove(&ns);
        let mine: Vec<(String, BundleRange)> = {
            let state = self.state.lock();
            state
                .owned
                .keys()
                .filter_map(|k| parse_ownership_key(k).filter(|(n, _)| n == &ns))
                .map(|(_, r)| (ownership_key(&ns, r), r))
                .collect()
        };
        if mine.is_empty() {
            return Ok(());
        }
        let bundles = match self.read_bundles(&ns).await {
            Ok(bundles) => bundles,
            Err(CoordinationError::NamespaceNotFound(_)) => {
                for (key, _) in &mine {
                    self.lose(key, "its namespace was deleted");
                }
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        // A bundle this broker owned was split: it owns the halves (Pulsar keeps a split
        // bundle's children on its broker), then the parent's record goes.
        for (parent_key, parent) in mine.into_iter().filter(|(_, r)| !bundles.has(*r)) {
            for child in
                bundles.ranges().filter(|c| c.lower >= parent.lower && c.upper <= parent.upper)
            {
                let child_key = ownership_key(&ns, child);
                let next = OwnershipRecord::init().assign(&self.me.id)?.own(&self.me.id)?;
                if !self.write_record(&child_key, 0, &next).await? {
                    tracing::warn!(bundle = %child_key, "split child already has an owner");
                }
            }
            self.state.lock().releasing.insert(parent_key.clone());
            self.state.lock().owned.remove(&parent_key);
            self.released(std::slice::from_ref(&parent_key)).await?;
            tracing::info!(bundle = %parent_key, "bundle split: its children owned here");
        }
        self.state.lock().bundles.insert(ns, bundles);
        Ok(())
    }

    async fn on_broker_changed(&self, key: &str, deleted: bool) -> Result<(), CoordinationError> {
        let Some(id) = key.strip_prefix(BROKERS_ROOT).and_then(|k| k.strip_prefix('/')) else {
            return Ok(());
        };
        if deleted {
            {
                let mut state = self.state.lock();
                state.brokers.remove(id);
                state.liveness.forget(id);
            }
            if self.is_leader() {
                self.reassign_dead().await?;
            }
            return Ok(());
        }
        if let Some(urls) = self.read_broker(key).await? {
            let mut state = self.state.lock();
            state.liveness.forget(id);
            state.brokers.insert(id.to_string(), urls);
        }
        Ok(())
    }
}

enum Decision {
    Connect(BrokerUrls),
    Redirect(BrokerUrls),
    Acquire(OwnershipRecord),
    /// A hand-over is under way: the client retries.
    HandOver,
    /// No broker can take the bundle now (none registered and alive): the client retries.
    Wait,
    /// The record is a split parent's: the namespace's bundles changed.
    StaleBundles,
}

fn owner_counts(state: &State) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for owner in state.owners.values() {
        *counts.entry(owner.clone()).or_default() += 1;
    }
    counts
}

fn urls_of(id: &str, stored: &StoredRecord) -> Option<BrokerUrls> {
    Some(BrokerUrls {
        id: id.to_string(),
        service_url: stored.native_url.clone()?,
        service_url_tls: stored.native_url_tls.clone(),
        web_url: stored.http_url.clone()?,
        web_url_tls: stored.http_url_tls.clone(),
        // A record does not carry listeners: only for an owner whose registration is not read.
        listeners: AdvertisedListeners::default(),
    })
}

#[derive(Clone, Copy)]
enum Watched {
    Brokers,
    Records,
    Namespaces,
    /// The clusters' documents, for the isolation policies among them.
    Clusters,
}

/// Applies a watch's changes until the store closes or the ownership is dropped; a lagged
/// watch re-reads everything it covers.
async fn follow(this: Weak<ClusterOwnership>, mut stream: WatchStream, what: Watched) {
    while let Some(event) = stream.recv().await {
        let Some(this) = this.upgrade() else { return };
        let applied = match (&event, what) {
            (WatchEvent::Lagged, Watched::Brokers) => this.reload_brokers().await,
            (WatchEvent::Lagged, Watched::Records) => this.reload_records().await,
            (WatchEvent::Lagged, Watched::Namespaces) => {
                this.state.lock().bundles.clear();
                Ok(())
            }
            (WatchEvent::Lagged, Watched::Clusters) => this.reload_isolation().await,
            (WatchEvent::Changed(change), what) => {
                let deleted = change.kind == magnetar_metadata::EventKind::Delete;
                match what {
                    Watched::Brokers => this.on_broker_changed(&change.key, deleted).await,
                    Watched::Records => this.on_record_changed(&change.key).await,
                    Watched::Namespaces => this.on_namespace_changed(&change.key).await,
                    Watched::Clusters if change.key.ends_with(ISOLATION_SUFFIX) => {
                        this.reload_isolation().await
                    }
                    Watched::Clusters => Ok(()),
                }
            }
        };
        if let Err(error) = applied {
            tracing::warn!(%error, "coordination: a metadata change not applied");
        }
    }
}

/// Probes every other registered broker each `probe_interval`, feeding [`Liveness`].
async fn probe_brokers(this: Weak<ClusterOwnership>, config: CoordinationConfig) {
    let mut tick = tokio::time::interval(config.probe_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(strong) = this.upgrade() else { return };
        let targets: Vec<BrokerUrls> = {
            let state = strong.state.lock();
            state.brokers.values().filter(|b| b.id != strong.me.id).cloned().collect()
        };
        drop(strong);
        let started = tokio::time::Instant::now();
        let mut probes = tokio::task::JoinSet::new();
        for broker in targets {
            let timeout = config.probe_timeout;
            probes.spawn(async move { (broker.id, probe(&broker.web_url, timeout).await) });
        }
        let mut results: Vec<(String, Probe)> = probes.join_all().await;
        if !crate::liveness::round_measured_others(started.elapsed(), config.probe_timeout) {
            // This process stalled (frozen, starved) while its probes ran: their time-outs
            // measured this broker, not the others.
            tracing::warn!(
                took_ms = started.elapsed().as_millis() as u64,
                "probe round stalled: its time-outs not counted"
            );
            results.retain(|(_, probe)| *probe != Probe::TimedOut);
        }
        let Some(strong) = this.upgrade() else { return };
        let mut newly_dead = false;
        {
            let mut state = strong.state.lock();
            for (id, probe) in results {
                let was_dead = state.liveness.is_dead(&id);
                let dead = state.liveness.observe(&id, probe);
                if dead != was_dead {
                    if dead {
                        newly_dead = true;
                        tracing::warn!(broker = %id, ?probe, "broker unreachable: its bundles may be taken over");
                    } else {
                        tracing::info!(broker = %id, "broker reachable again");
                    }
                }
            }
        }
        // The leader gives a dead broker's bundles away at once, not at the next lookup.
        if newly_dead && strong.is_leader() {
            if let Err(error) = strong.reassign_dead().await {
                tracing::warn!(%error, "dead broker's bundles not reassigned");
            }
        }
    }
}

/// `host:port` of a URL.
fn host_port(url: &str) -> String {
    url.split_once("://").map_or(url, |(_, rest)| rest).trim_end_matches('/').to_string()
}

/// One probe of a broker's web port: a connection and an HTTP request; any reaction (an answer
/// of any status, or the connection closed, as a TLS port does to plain text) is life. Only a
/// refused or reset connection, or silence past `timeout` (a frozen process, whose kernel still
/// accepts the connection), count against it.
async fn probe(web_url: &str, timeout: Duration) -> Probe {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = host_port(web_url);
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect(&address).await?;
        let request = format!(
            "GET /admin/v2/brokers/health HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await?;
        let mut byte = [0u8; 1];
        // One byte or none (closed): either way the process reacted.
        let _answered = stream.read(&mut byte).await?;
        std::io::Result::Ok(())
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(Ok(())) => Probe::Answered,
        Ok(Err(error)) => match error.kind() {
            std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::ConnectionAborted => Probe::Refused,
            _ => Probe::TimedOut,
        },
        Err(_) => Probe::TimedOut,
    }
}

#[cfg(test)]
#[path = "cluster_tests.rs"]
mod tests;
