//! Who serves a topic: the answer to LOOKUP, and whether this broker may load a topic. Standalone,
//! every topic is this broker's ([`SingleBroker`]); in a cluster, the owner of the topic's
//! namespace bundle decides (`magnetar-coordination`, wired in by the `magnetar broker` command).

use crate::error::BrokerError;
use async_trait::async_trait;
use magnetar_model::names::{NamespaceName, TopicName};
pub use magnetar_protocol::commands::AssignedBroker;

/// Where a client should go for a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LookupAnswer {
    /// `urls` (this broker, or the owner) serves the topic: connect there.
    Connect { urls: BrokerUrls },
    /// Ask `urls` instead; `authoritative` when that broker is to take the topic without asking
    /// further (Pulsar's leader-assigned redirect).
    Redirect { urls: BrokerUrls, authoritative: bool },
}

/// A broker's URLs as a lookup answers them: `broker_url_tls` (its `pulsar+ssl://` URL) for a
/// client connected with TLS, `web_url` / `web_url_tls` for an HTTP lookup.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BrokerUrls {
    pub broker_url: String,
    pub broker_url_tls: Option<String>,
    pub web_url: Option<String>,
    pub web_url_tls: Option<String>,
}

/// The bundles an unload stops serving, from [`Ownership::stop_serving`] to
/// [`Ownership::released`]: the broker closes the loaded topics [`Ownership::in_release`] picks
/// in between.
#[derive(Debug, Clone, Default)]
pub struct Release {
    /// The namespace (`None`: every namespace, a broker shutting down).
    pub namespace: Option<NamespaceName>,
    /// The one bundle asked for (`0xLOWER_0xUPPER`), if not all of the namespace's.
    pub bundle: Option<String>,
    /// The ownership keys released (empty for a broker that owns everything).
    pub bundles: Vec<String>,
    /// The broker the operator named to take the bundles (`--destinationBroker`), if any.
    pub destination: Option<String>,
}

#[async_trait]
pub trait Ownership: Send + Sync + 'static {
    /// Answers a LOOKUP of `topic`; `authoritative` is the client's flag from a redirect.
    async fn lookup(
        &self,
        topic: &TopicName,
        authoritative: bool,
    ) -> Result<LookupAnswer, BrokerError>;

    /// Whether this broker may serve `topic` now (load it, or create a live non-persistent
    /// one): an error clients retry (with a new lookup) when another broker owns its bundle.
    async fn check_serve(&self, _topic: &TopicName) -> Result<(), BrokerError> {
        Ok(())
    }

    /// Stops serving the bundles of `namespace` (`bundle`: one of them, `0xLOWER_0xUPPER`;
    /// `namespace` `None`: every bundle) before their topics are closed, and picks the broker
    /// each is handed over to, if any: `destination` (a broker id) when the operator names
    /// one, which must then be a live broker (an error, and nothing stops, otherwise).
    async fn stop_serving(
        &self,
        namespace: Option<&NamespaceName>,
        bundle: Option<&str>,
        destination: Option<&str>,
    ) -> Result<Release, BrokerError> {
        if let Some(broker) = destination {
            return Err(BrokerError::NotAllowed(format!(
                "Destination broker {broker}: a standalone broker serves every bundle itself"
            )));
        }
        let bundle = bundle.map(str::to_string);
        Ok(Release { namespace: namespace.cloned(), bundle, ..Release::default() })
    }

    /// Whether `topic` is in what `release` stops serving.
    fn in_release(&self, release: &Release, topic: &TopicName) -> bool {
        release.namespace.as_ref().is_none_or(|ns| topic.namespace() == ns)
    }

    /// The broker `topic` is handed over to by `release`, which its clients are told to
    /// reconnect to (PIP-307); `None`: they look the topic up again.
    fn assigned_to(&self, _release: &Release, _topic: &TopicName) -> Option<AssignedBroker> {
        None
    }

    /// The released bundles' topics are closed: other brokers may take them. (An unload of a
    /// namespace reaches the bundles other brokers own from here too.)
    async fn released(&self, _release: Release) -> Result<(), BrokerError> {
        Ok(())
    }
}

/// One broker serves every topic.
pub struct SingleBroker {
    pub urls: BrokerUrls,
}

#[async_trait]
impl Ownership for SingleBroker {
    async fn lookup(&self, _: &TopicName, _: bool) -> Result<LookupAnswer, BrokerError> {
        Ok(LookupAnswer::Connect { urls: self.urls.clone() })
    }
}
