//! The brokers a proxy forwards to: the cluster's registrations (`/brokers/{id}`, each broker's
//! `BrokerRegistration`), read from the metadata store and kept for a second.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use magnetar_metadata::MetadataStore;
use magnetar_model::BrokerRegistration;
use parking_lot::Mutex;

use crate::ProxyError;

/// Where a registered broker is reached: its binary protocol's and its admin API's `host:port`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct BrokerAddress {
    pub service: String,
    pub web: String,
}

/// Where the registered brokers are found.
#[async_trait]
pub trait Directory: Send + Sync {
    /// The registered brokers (`fresh`: read again, not from a cache).
    async fn brokers(&self, fresh: bool) -> Result<Vec<BrokerAddress>, ProxyError>;
}

/// `host:port` of a `pulsar://host:port` (or `pulsar+ssl://`) URL; the address itself when it
/// has no scheme.
pub fn host_port(url: &str) -> &str {
    url.split_once("://").map_or(url, |(_, rest)| rest).trim_end_matches('/')
}

/// A fixed list (tests).
pub struct StaticDirectory(pub Vec<BrokerAddress>);

#[async_trait]
impl Directory for StaticDirectory {
    async fn brokers(&self, _fresh: bool) -> Result<Vec<BrokerAddress>, ProxyError> {
        Ok(self.0.clone())
    }
}

/// How long a read of the registrations is used before it is read again.
const CACHE_FOR: Duration = Duration::from_secs(1);

/// The registrations in the cluster's metadata store.
pub struct MetadataDirectory {
    store: Arc<dyn MetadataStore>,
    cached: Mutex<Option<(Instant, Vec<BrokerAddress>)>>,
}

impl MetadataDirectory {
    pub fn new(store: Arc<dyn MetadataStore>) -> MetadataDirectory {
        MetadataDirectory { store, cached: Mutex::new(None) }
    }

    async fn read(&self) -> Result<Vec<BrokerAddress>, ProxyError> {
        let prefix = format!("{}/", magnetar_model::keys::BROKERS_ROOT);
        let error = |e: magnetar_metadata::MetadataError| ProxyError::Directory(e.to_string());
        let keys = self.store.list(&prefix).await.map_err(error)?;
        let values = self.store.get_many(&keys).await.map_err(error)?;
        let mut brokers = Vec::new();
        for (key, value) in keys.iter().zip(values) {
            let Some(value) = value else { continue }; // gone since the listing
            match serde_json::from_slice::<BrokerRegistration>(&value.value) {
                Ok(registration) => brokers.push(BrokerAddress {
                    service: host_port(&registration.pulsar_service_url).to_string(),
                    web: host_port(&registration.web_service_url).to_string(),
                }),
                Err(error) => {
                    tracing::warn!(key, %error, "proxy: a broker registration not understood")
                }
            }
        }
        brokers.sort();
        Ok(brokers)
    }
}

#[async_trait]
impl Directory for MetadataDirectory {
    async fn brokers(&self, fresh: bool) -> Result<Vec<BrokerAddress>, ProxyError> {
        if !fresh {
            if let Some((at, brokers)) = self.cached.lock().as_ref() {
                if at.elapsed() < CACHE_FOR {
                    return Ok(brokers.clone());
                }
            }
        }
        let brokers = self.read().await?;
        *self.cached.lock() = Some((Instant::now(), brokers.clone()));
        Ok(brokers)
    }
}

/// Round robin over a directory's brokers, and the check of a client's target.
pub struct Brokers {
    directory: Arc<dyn Directory>,
    next: AtomicUsize,
}

impl Brokers {
    pub fn new(directory: Arc<dyn Directory>) -> Brokers {
        Brokers { directory, next: AtomicUsize::new(0) }
    }

    /// The next broker to ask (Pulsar's proxy: round robin over the available brokers).
    pub async fn pick(&self) -> Result<BrokerAddress, ProxyError> {
        let brokers = self.directory.brokers(false).await?;
        if brokers.is_empty() {
            return Err(ProxyError::NoBroker);
        }
        Ok(brokers[self.next.fetch_add(1, Ordering::Relaxed) % brokers.len()].clone())
    }

    /// Whether `target` (a client's `proxy_to_broker_url`, `host:port`) is a registered broker's
    /// binary protocol address: the proxy connects only to those.
    pub async fn is_broker(&self, target: &str) -> Result<bool, ProxyError> {
        let target = host_port(target);
        self.registered(|b| b.service == target).await
    }

    /// Whether `target` (`host:port`, a redirect's) is a registered broker's admin API.
    pub async fn is_web(&self, target: &str) -> Result<bool, ProxyError> {
        let target = host_port(target);
        self.registered(|b| b.web == target).await
    }

    /// A broker registered a moment ago is found by reading the registrations again.
    async fn registered(&self, test: impl Fn(&BrokerAddress) -> bool) -> Result<bool, ProxyError> {
        if self.directory.brokers(false).await?.iter().any(&test) {
            return Ok(true);
        }
        Ok(self.directory.brokers(true).await?.iter().any(&test))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use magnetar_metadata::{ExpectedVersion, MemoryStore};

    fn registration(port: u16) -> Bytes {
        let r = BrokerRegistration {
            pulsar_service_url: format!("pulsar://127.0.0.1:{port}"),
            web_service_url: format!("http://127.0.0.1:{}", port + 1),
            pulsar_service_url_tls: None,
            web_service_url_tls: None,
            advertised_listeners: Default::default(),
            internal_listener_name: None,
            start_timestamp: 0,
            broker_version: "test".into(),
        };
        Bytes::from(serde_json::to_vec(&r).unwrap())
    }

    #[tokio::test]
    async fn registered_brokers_are_asked_in_turn_and_nothing_else_is_a_target() {
        let store = Arc::new(MemoryStore::new());
        for port in [7000u16, 7100] {
            let key = format!("/brokers/127.0.0.1:{}", port + 1);
            store.put(&key, registration(port), ExpectedVersion::Any).await.unwrap();
        }
        store.put("/brokers/bad", Bytes::from_static(b"{"), ExpectedVersion::Any).await.unwrap();
        let brokers = Brokers::new(Arc::new(MetadataDirectory::new(store.clone())));
        let mut picks = Vec::new();
        for _ in 0..3 {
            picks.push(brokers.pick().await.unwrap().service);
        }
        assert_eq!(picks, ["127.0.0.1:7000", "127.0.0.1:7100", "127.0.0.1:7000"]);
        assert!(brokers.is_broker("127.0.0.1:7100").await.unwrap());
        assert!(brokers.is_web("127.0.0.1:7101").await.unwrap());
        assert!(!brokers.is_web("127.0.0.1:7100").await.unwrap(), "a service port is no web port");
        assert!(!brokers.is_broker("127.0.0.1:22").await.unwrap(), "not an open relay");
        // Registered after the last read: found by reading again.
        let key = "/brokers/127.0.0.1:7201";
        store.put(key, registration(7200), ExpectedVersion::Any).await.unwrap();
        assert!(brokers.is_broker("127.0.0.1:7200").await.unwrap());
    }

    #[tokio::test]
    async fn no_registered_broker_is_an_error_not_a_panic() {
        let brokers = Brokers::new(Arc::new(StaticDirectory(vec![])));
        assert!(matches!(brokers.pick().await, Err(ProxyError::NoBroker)));
        assert_eq!(host_port("pulsar+ssl://h:6651/"), "h:6651");
    }
}
