//! Who serves a topic: the answer to LOOKUP. Standalone, every topic is this broker's
//! ([`SingleBroker`]); in a cluster, the owner of the topic's namespace bundle (an ephemeral key
//! in etcd), found or assigned by the implementation of [`Ownership`] that comes with it.

use crate::error::BrokerError;
use async_trait::async_trait;
use magnetar_model::names::TopicName;

/// Where a client should go for a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LookupAnswer {
    /// This broker (or `broker_url`) serves the topic: connect there (`broker_url_tls`, its
    /// `pulsar+ssl://` URL, for a client connected with TLS).
    Connect { broker_url: String, broker_url_tls: Option<String> },
    /// Ask `broker_url` (`broker_url_tls`) instead; `authoritative` when that broker is to take
    /// the topic without asking further (Pulsar's leader-assigned redirect).
    Redirect { broker_url: String, broker_url_tls: Option<String>, authoritative: bool },
}

#[async_trait]
pub trait Ownership: Send + Sync + 'static {
    /// Answers a LOOKUP of `topic`; `authoritative` is the client's flag from a redirect.
    async fn lookup(
        &self,
        topic: &TopicName,
        authoritative: bool,
    ) -> Result<LookupAnswer, BrokerError>;
}

/// One broker serves every topic.
pub struct SingleBroker {
    pub broker_url: String,
    pub broker_url_tls: Option<String>,
}

#[async_trait]
impl Ownership for SingleBroker {
    async fn lookup(&self, _: &TopicName, _: bool) -> Result<LookupAnswer, BrokerError> {
        Ok(LookupAnswer::Connect {
            broker_url: self.broker_url.clone(),
            broker_url_tls: self.broker_url_tls.clone(),
        })
    }
}
