//! The [`Client`]: connection pool, topic lookup and partition metadata.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use magnetar_model::TopicName;
use magnetar_protocol::proto::base_command::Type;
use magnetar_protocol::proto::command_lookup_topic_response::LookupType;
use magnetar_protocol::proto::command_partitioned_topic_metadata_response::LookupType as PartitionedLookup;
use magnetar_protocol::proto::{CommandLookupTopic, CommandPartitionedTopicMetadata};
use magnetar_protocol::{commands, BaseCommand};
use tokio::sync::Mutex;

use crate::auth::Credentials;
use crate::connection::{socket_address, Connection};
use crate::consumer::{ConsumerBuilder, ReaderBuilder};
use crate::error::{Error, Result};
use crate::producer::ProducerBuilder;

const MAX_REDIRECTS: usize = 20;

/// Handle to a Pulsar service. Cheap to clone; clones share the
/// connection pool.
///
/// ```no_run
/// # async fn demo() -> magnetar_client::Result<()> {
/// use magnetar_client::{Client, Compression, SubType};
/// use std::time::Duration;
///
/// let client = Client::connect("pulsar://127.0.0.1:6650").await?;
///
/// let producer = client
///     .producer("my-topic")
///     .batching(1000, 128 * 1024, Duration::from_millis(5))
///     .compression(Compression::Lz4)
///     .create()
///     .await?;
/// let id = producer.send("hello").await?;
///
/// let mut consumer = client
///     .consumer("my-topic")
///     .subscription("my-sub")
///     .sub_type(SubType::Shared)
///     .subscribe()
///     .await?;
/// let msg = consumer.receive().await?;
/// consumer.ack(&msg).await?;
/// # let _ = id;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
}

/// How a client connects: TLS trust and credentials (both optional).
#[derive(Debug, Clone, Default)]
pub struct ClientOptions {
    /// PEM CAs verifying `pulsar+ssl://` brokers (the official clients' `tlsTrustCertsFilePath`).
    pub tls_trust_certs_file: Option<std::path::PathBuf>,
    /// A token sent at CONNECT (`auth_method_name` `token`) and again when the broker
    /// challenges it.
    pub auth_token: Option<String>,
    /// A file holding the token, read afresh at each connection and each challenge (a token
    /// another process rotates: the official clients' `file://` token). Not with `auth_token`.
    pub auth_token_file: Option<std::path::PathBuf>,
    /// How long creating a producer or subscribing retries errors that may pass (a broker not
    /// ready, storage unavailable, a dropped connection) before failing with the last one
    /// (the official clients' `operationTimeout`) [`DEFAULT_OPERATION_TIMEOUT`: 30 s].
    ///
    /// [`DEFAULT_OPERATION_TIMEOUT`]: crate::DEFAULT_OPERATION_TIMEOUT
    pub operation_timeout: Option<std::time::Duration>,
}

#[derive(Debug)]
pub(crate) struct ClientInner {
    service_url: String,
    /// The token presented at CONNECT and at each AUTH_CHALLENGE, when the broker wants one.
    credentials: Option<Arc<Credentials>>,
    pool: Mutex<HashMap<String, Arc<Connection>>>,
    /// How `pulsar+ssl://` brokers are verified (None: plain `pulsar://` only).
    tls: Option<Arc<rustls::ClientConfig>>,
    next_id: AtomicU64,
    operation_timeout: std::time::Duration,
}

/// Where a topic is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookupResult {
    /// Where to connect (`pulsar://host:port`): the owner, or the service URL (a proxy).
    pub broker_url: String,
    /// Whether to connect through the service URL (a proxy) instead.
    pub proxy_through_service_url: bool,
    /// The owner's own URL (what the proxy is told to reach, in `proxy_to_broker_url`).
    pub owner_url: String,
}

/// Full topic name: `my-topic` → `persistent://public/default/my-topic`,
/// `tenant/ns/t` → `persistent://tenant/ns/t` (the rules of `magnetar_model`'s
/// `TopicName::expand`). A name those rules reject is passed on as written, so the broker
/// answers it with its own error.
pub fn full_topic_name(topic: &str) -> String {
    match TopicName::expand(topic) {
        Ok(name) => name.to_string(),
        Err(_) => topic.to_string(),
    }
}

/// Name of partition `index` of `topic`.
pub fn partition_topic_name(topic: &str, index: u32) -> String {
    match TopicName::expand(topic) {
        Ok(name) => name.partition(index).to_string(),
        Err(_) => format!("{topic}-partition-{index}"),
    }
}

impl Client {
    /// Connects to a service URL such as `pulsar://127.0.0.1:6650`
    /// (performs the handshake now, so a wrong address fails here).
    pub async fn connect(service_url: impl Into<String>) -> Result<Self> {
        Self::connect_with_options(service_url, ClientOptions::default()).await
    }

    /// Connects to a `pulsar+ssl://host:port` service URL, verifying the brokers' certificates
    /// (and their names) with the PEM CAs in `trust_certs_file` (the official clients'
    /// `tlsTrustCertsFilePath`). Lookups then follow the brokers' TLS URLs.
    pub async fn connect_tls(
        service_url: impl Into<String>,
        trust_certs_file: impl AsRef<std::path::Path>,
    ) -> Result<Self> {
        let options = ClientOptions {
            tls_trust_certs_file: Some(trust_certs_file.as_ref().to_path_buf()),
            ..ClientOptions::default()
        };
        Self::connect_with_options(service_url, options).await
    }

    /// Like [`Client::connect`], authenticating every connection with `token` (Pulsar's
    /// token authentication: `auth_method_name` `token`, the JWT as `auth_data`).
    pub async fn connect_with_token(
        service_url: impl Into<String>,
        auth_token: Option<String>,
    ) -> Result<Self> {
        Self::connect_with_options(service_url, ClientOptions { auth_token, ..Default::default() })
            .await
    }

    /// Connects with TLS trust and credentials as `options` say.
    pub async fn connect_with_options(
        service_url: impl Into<String>,
        options: ClientOptions,
    ) -> Result<Self> {
        let service_url = service_url.into();
        let tls = match &options.tls_trust_certs_file {
            Some(file) => Some(Arc::new(tls_client_config(file)?)),
            None => None,
        };
        let credentials = match (options.auth_token, options.auth_token_file) {
            (Some(_), Some(_)) => {
                return Err(Error::Config("a token or a token file, not both".into()));
            }
            (Some(token), None) => Some(Credentials::Token(token)),
            (None, Some(path)) => Some(Credentials::TokenFile(path)),
            (None, None) => None,
        };
        if let Some(credentials) = &credentials {
            credentials.token()?; // a missing or empty token file fails here, not at first use
        }
        let credentials = credentials.map(Arc::new);
        let operation_timeout =
            options.operation_timeout.unwrap_or(crate::error::DEFAULT_OPERATION_TIMEOUT);
        socket_address(&service_url)?;
        let client = Client {
            inner: Arc::new(ClientInner {
                service_url,
                credentials,
                pool: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(1),
                tls,
                operation_timeout,
            }),
        };
        client.connection(&client.inner.service_url.clone()).await?;
        Ok(client)
    }

    /// How long creating a producer or subscribing retries ([`ClientOptions::operation_timeout`]).
    pub(crate) fn operation_timeout(&self) -> std::time::Duration {
        self.inner.operation_timeout
    }

    /// The service URL given to [`Client::connect`].
    pub fn service_url(&self) -> &str {
        &self.inner.service_url
    }

    /// Builder for a producer on `topic`.
    pub fn producer(&self, topic: impl Into<String>) -> ProducerBuilder {
        ProducerBuilder::new(self.clone(), topic.into())
    }

    /// Builder for a consumer on `topic`.
    pub fn consumer(&self, topic: impl Into<String>) -> ConsumerBuilder {
        ConsumerBuilder::new(self.clone(), topic.into())
    }

    /// Builder for a reader on `topic`.
    pub fn reader(&self, topic: impl Into<String>) -> ReaderBuilder {
        ReaderBuilder::new(self.clone(), topic.into())
    }

    /// Closes every pooled connection. Producers and consumers created
    /// from this client stop working.
    pub async fn close(&self) {
        let mut pool = self.inner.pool.lock().await;
        for (_, conn) in pool.drain() {
            conn.close();
        }
    }

    /// A client-unique id for a producer or consumer.
    pub(crate) fn next_id(&self) -> u64 {
        self.inner.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The pooled connection to `url`, (re)connecting if needed.
    pub(crate) async fn connection(&self, url: &str) -> Result<Arc<Connection>> {
        self.connection_via(url, None).await
    }

    /// The pooled connection to `url`, which is a proxy forwarding it to the broker at
    /// `proxy_to` (`proxy_to_broker_url`) when that is given.
    pub(crate) async fn connection_via(
        &self,
        url: &str,
        proxy_to: Option<&str>,
    ) -> Result<Arc<Connection>> {
        let key = match proxy_to {
            Some(to) => format!("{url} -> {to}"),
            None => url.to_string(),
        };
        let mut pool = self.inner.pool.lock().await;
        if let Some(conn) = pool.get(&key) {
            if !conn.is_closed() {
                return Ok(conn.clone());
            }
        }
        let proxy_to = proxy_to.map(crate::connection::socket_address).transpose()?;
        let conn = Connection::connect(
            url,
            self.inner.tls.as_ref(),
            self.inner.credentials.clone(),
            proxy_to,
        )
        .await?;
        pool.insert(key, conn.clone());
        Ok(conn)
    }

    /// Number of partitions of `topic` (0 for a non-partitioned topic).
    pub async fn partitioned_topic_metadata(&self, topic: &str) -> Result<u32> {
        let conn = self.connection(&self.inner.service_url).await?;
        let request_id = conn.request_id();
        let command = BaseCommand {
            partition_metadata: Some(Box::new(CommandPartitionedTopicMetadata {
                topic: full_topic_name(topic),
                request_id,
                ..Default::default()
            })),
            ..commands::base(Type::PartitionedMetadata)
        };
        let reply = conn.request(request_id, &command, "PARTITIONED_METADATA").await?;
        let response = reply
            .partition_metadata_response
            .ok_or_else(|| Error::Protocol("unexpected reply to PARTITIONED_METADATA".into()))?;
        if response.response == Some(PartitionedLookup::Failed as i32) {
            return Err(Error::server(response.error.unwrap_or(0), response.message()));
        }
        Ok(response.partitions.unwrap_or(0))
    }

    /// Finds the broker serving `topic`, following redirects.
    pub async fn lookup_topic(&self, topic: &str) -> Result<LookupResult> {
        let topic = full_topic_name(topic);
        let mut url = self.inner.service_url.clone();
        let mut authoritative = false;
        for _ in 0..MAX_REDIRECTS {
            let conn = self.connection(&url).await?;
            let request_id = conn.request_id();
            let command = BaseCommand {
                lookup_topic: Some(Box::new(CommandLookupTopic {
                    topic: topic.clone(),
                    request_id,
                    authoritative: Some(authoritative),
                    ..Default::default()
                })),
                ..commands::base(Type::Lookup)
            };
            let reply = conn.request(request_id, &command, "LOOKUP").await?;
            let response = reply
                .lookup_topic_response
                .ok_or_else(|| Error::Protocol("unexpected reply to LOOKUP".into()))?;
            // Connected with TLS: the broker's pulsar+ssl:// URL, as the official clients do.
            let tls_target = response.broker_service_url_tls.clone().unwrap_or_default();
            let target = if crate::connection::is_tls_url(&self.inner.service_url)
                && !tls_target.is_empty()
            {
                tls_target
            } else {
                response.broker_service_url.clone().unwrap_or_default()
            };
            match response.response.and_then(|r| LookupType::try_from(r).ok()) {
                Some(LookupType::Connect) => {
                    let proxy = response.proxy_through_service_url();
                    let broker_url = if proxy || target.is_empty() {
                        self.inner.service_url.clone()
                    } else {
                        target.clone()
                    };
                    return Ok(LookupResult {
                        broker_url,
                        proxy_through_service_url: proxy,
                        owner_url: target,
                    });
                }
                Some(LookupType::Redirect) => {
                    if !target.is_empty() {
                        url = target;
                    }
                    authoritative = response.authoritative();
                }
                _ => {
                    return Err(Error::server(response.error.unwrap_or(0), response.message()));
                }
            }
        }
        Err(Error::TooManyRedirects(topic))
    }

    /// Connection to the broker serving `topic`.
    pub(crate) async fn topic_connection(&self, topic: &str) -> Result<Arc<Connection>> {
        let lookup = self.lookup_topic(topic).await?;
        if lookup.proxy_through_service_url && !lookup.owner_url.is_empty() {
            return self.connection_via(&lookup.broker_url, Some(&lookup.owner_url)).await;
        }
        self.connection(&lookup.broker_url).await
    }

    /// `topic`'s partitions, or the topic itself when it has none.
    pub(crate) async fn topic_partitions(&self, topic: &str) -> Result<Vec<(String, i32)>> {
        let partitions = self.partitioned_topic_metadata(topic).await?;
        Ok(if partitions == 0 {
            vec![(full_topic_name(topic), -1)]
        } else {
            (0..partitions).map(|i| (partition_topic_name(topic, i), i as i32)).collect()
        })
    }
}

/// A rustls client configuration trusting the PEM CAs of `path`.
fn tls_client_config(path: &std::path::Path) -> Result<rustls::ClientConfig> {
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    let what = |cause: String| Error::Config(format!("TLS trust file {}: {cause}", path.display()));
    let pem = std::fs::read(path).map_err(|e| what(e.to_string()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        roots.add(cert.map_err(|e| what(e.to_string()))?).map_err(|e| what(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(what("no CERTIFICATE in it".into()));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| what(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names() {
        assert_eq!(full_topic_name("t"), "persistent://public/default/t");
        assert_eq!(full_topic_name("a/b/t"), "persistent://a/b/t");
        assert_eq!(full_topic_name("non-persistent://a/b/t"), "non-persistent://a/b/t");
        assert_eq!(partition_topic_name("t", 2), "persistent://public/default/t-partition-2");
    }
}
