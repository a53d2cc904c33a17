//! Who serves a topic: the answer to LOOKUP, and whether this broker may load a topic. Standalone,
//! every topic is this broker's ([`SingleBroker`]); in a cluster, the owner of the topic's
//! namespace bundle decides (`magnetar-coordination`, wired in by the `magnetar broker` command).

use crate::error::BrokerError;
use async_trait::async_trait;
use magnetar_model::listeners::AdvertisedListeners;
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
    /// The broker's advertised listeners (Pulsar's `advertisedListeners`).
    pub listeners: AdvertisedListeners,
}

impl BrokerUrls {
    /// These URLs as a client naming listener `name` (LOOKUP's `advertised_listener_name`,
    /// the HTTP lookup's `listenerName`) is to see them: that listener's, or the internal
    /// listener's when it names none. `Err` with Pulsar's "the broker do not have X listener"
    /// (which clients match on) when the broker has no such listener. A broker without
    /// listeners answers an unnamed lookup with its URLs as they are.
    pub fn for_listener(mut self, name: Option<&str>) -> Result<BrokerUrls, String> {
        if let Some(listener) = self.listeners.select(name)? {
            if let Some(url) = &listener.broker_url {
                self.broker_url = url.clone();
            }
            self.broker_url_tls = listener.broker_url_tls.clone().or(self.broker_url_tls);
            self.web_url = listener.web_url.clone().or(self.web_url);
            self.web_url_tls = listener.web_url_tls.clone().or(self.web_url_tls);
        }
        Ok(self)
    }
}

impl LookupAnswer {
    /// The answer for a client naming listener `name` (see [`BrokerUrls::for_listener`]).
    pub fn for_listener(self, name: Option<&str>) -> Result<LookupAnswer, String> {
        Ok(match self {
            LookupAnswer::Connect { urls } => {
                LookupAnswer::Connect { urls: urls.for_listener(name)? }
            }
            LookupAnswer::Redirect { urls, authoritative } => {
                LookupAnswer::Redirect { urls: urls.for_listener(name)?, authoritative }
            }
        })
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(listeners: &str) -> BrokerUrls {
        BrokerUrls {
            broker_url: "pulsar://10.0.0.2:6650".into(),
            broker_url_tls: None,
            web_url: Some("http://10.0.0.2:8080".into()),
            web_url_tls: None,
            listeners: AdvertisedListeners::parse(listeners, "").unwrap(),
        }
    }

    #[test]
    fn an_answer_takes_the_owners_url_for_the_listener_named() {
        let urls = owner(
            "internal:pulsar://10.0.0.2:6650,external:pulsar://b2.example:16650,\
             external:http://b2.example:18080,secure:pulsar+ssl://b2.example:16651",
        );
        let answer = LookupAnswer::Redirect { urls: urls.clone(), authoritative: true };
        let LookupAnswer::Redirect { urls: external, authoritative } =
            answer.for_listener(Some("external")).unwrap()
        else {
            panic!("a redirect stays a redirect");
        };
        assert!(authoritative);
        assert_eq!(external.broker_url, "pulsar://b2.example:16650");
        assert_eq!(external.broker_url_tls, None);
        assert_eq!(external.web_url.as_deref(), Some("http://b2.example:18080"));
        let secure = urls.clone().for_listener(Some("secure")).unwrap();
        assert_eq!(secure.broker_url_tls.as_deref(), Some("pulsar+ssl://b2.example:16651"));
        assert_eq!(secure.broker_url, "pulsar://10.0.0.2:6650", "no plain URL: the owner's");
        // None named: the internal listener's; an unknown name: Pulsar's error text.
        assert_eq!(urls.clone().for_listener(None).unwrap().broker_url, "pulsar://10.0.0.2:6650");
        assert_eq!(
            urls.for_listener(Some("nope")).unwrap_err(),
            "the broker do not have nope listener"
        );
    }

    #[test]
    fn an_owner_without_listeners_keeps_its_urls_unless_one_is_named() {
        let urls = owner("");
        assert_eq!(urls.clone().for_listener(None).unwrap(), urls);
        assert_eq!(
            urls.for_listener(Some("external")).unwrap_err(),
            "the broker do not have external listener"
        );
    }
}
