//! Cluster mode's answer to "who serves this topic": the broker's `Ownership` over
//! `magnetar-coordination`'s bundle records, and the task that closes the topics of bundles this
//! broker loses.

use std::sync::Arc;

use async_trait::async_trait;
use magnetar_broker::ownership::{AssignedBroker, BrokerUrls, LookupAnswer, Ownership, Release};
use magnetar_broker::{BrokerError, BrokerService};
use magnetar_coordination::{BundleRange, ClusterOwnership, CoordinationError, Lookup};
use magnetar_model::names::{NamespaceName, TopicName};

pub struct CoordinatedOwnership(pub Arc<ClusterOwnership>);

/// A coordination error as clients see it: ServiceNotReady (they look the topic up again) for
/// everything that passes.
fn broker_error(error: CoordinationError) -> BrokerError {
    match error {
        CoordinationError::NotABroker(_) => BrokerError::NotAllowed(error.to_string()),
        CoordinationError::NamespaceNotFound(ns) => {
            BrokerError::TopicNotFound(format!("Namespace {ns} does not exist"))
        }
        CoordinationError::Metadata(e) => BrokerError::Metadata(e.to_string()),
        CoordinationError::Corrupt { .. } | CoordinationError::Transition(_) => {
            BrokerError::Metadata(error.to_string())
        }
        CoordinationError::NotServed { .. }
        | CoordinationError::Releasing(_)
        | CoordinationError::NoBroker(_)
        | CoordinationError::Contended { .. } => BrokerError::ServiceNotReady(error.to_string()),
    }
}

fn assigned(broker: magnetar_coordination::BrokerUrls) -> AssignedBroker {
    AssignedBroker { service_url: broker.service_url, service_url_tls: broker.service_url_tls }
}

fn urls(broker: magnetar_coordination::BrokerUrls) -> BrokerUrls {
    BrokerUrls {
        broker_url: broker.service_url,
        broker_url_tls: broker.service_url_tls,
        web_url: Some(broker.web_url),
        web_url_tls: broker.web_url_tls,
        listeners: broker.listeners,
    }
}

#[async_trait]
impl Ownership for CoordinatedOwnership {
    async fn lookup(
        &self,
        topic: &TopicName,
        authoritative: bool,
    ) -> Result<LookupAnswer, BrokerError> {
        Ok(match self.0.lookup(topic, authoritative).await.map_err(broker_error)? {
            Lookup::Connect(broker) => LookupAnswer::Connect { urls: urls(broker) },
            Lookup::Redirect { broker, authoritative } => {
                LookupAnswer::Redirect { urls: urls(broker), authoritative }
            }
        })
    }

    async fn check_serve(&self, topic: &TopicName) -> Result<(), BrokerError> {
        self.0.check_serve(topic).await.map_err(broker_error)
    }

    async fn stop_serving(
        &self,
        namespace: Option<&NamespaceName>,
        bundle: Option<&str>,
        destination: Option<&str>,
    ) -> Result<Release, BrokerError> {
        if let Some(broker) = destination {
            self.0.check_destination(broker).map_err(broker_error)?;
        }
        let bundles = match namespace {
            // The bundles asked for that this broker owns stay, when they are to come here.
            _ if destination == Some(self.0.me().id.as_str()) => Vec::new(),
            None => self.0.stop_serving_all(),
            Some(ns) => {
                let range = bundle.and_then(|b| BundleRange::parse(b).ok());
                self.0.stop_serving(ns, range)
            }
        };
        self.0.begin_hand_over(&bundles, destination).await;
        Ok(Release {
            namespace: namespace.cloned(),
            bundle: bundle.map(str::to_string),
            bundles,
            destination: destination.map(str::to_string),
        })
    }

    fn in_release(&self, release: &Release, topic: &TopicName) -> bool {
        self.0.in_bundles(topic, &release.bundles)
    }

    fn assigned_to(&self, _release: &Release, topic: &TopicName) -> Option<AssignedBroker> {
        self.0.handed_over_to(topic).map(assigned)
    }

    async fn released(&self, release: Release) -> Result<(), BrokerError> {
        self.0.released(&release.bundles).await.map_err(broker_error)?;
        if let Some(ns) = &release.namespace {
            // An admin unload: the bundles other brokers own unload there.
            let range = release.bundle.as_deref().and_then(|b| BundleRange::parse(b).ok());
            let destination = release.destination.as_deref();
            self.0.unload_elsewhere(ns, range, destination).await.map_err(broker_error)?;
        }
        Ok(())
    }
}

/// Closes the topics of every bundle this broker loses (another broker took it over, or the
/// metadata session went): their clients reconnect and look them up again. A hand-over another
/// broker asked for closes them the same way, telling the clients where the bundle goes, and
/// then lets the bundle go there.
pub fn close_lost_bundles(service: &Arc<BrokerService>, ownership: &Arc<ClusterOwnership>) {
    let mut lost = ownership.lost();
    let (service, ownership) = (Arc::downgrade(service), ownership.clone());
    tokio::spawn(async move {
        loop {
            let bundle = match lost.recv().await {
                Ok(bundle) => Some(bundle),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => None,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            };
            let Some(service) = service.upgrade() else { return };
            let to = bundle.as_ref().and_then(|b| b.release.as_ref()).and_then(|r| r.to.clone());
            let closed = service
                .unload_where_to(
                    |topic| match &bundle {
                        Some(b) => {
                            topic.namespace() == &b.namespace
                                && ownership.cached_bundle_of(topic) == Some(b.range)
                        }
                        // Missed some: close whatever this broker no longer owns.
                        None => ownership
                            .cached_bundle_of(topic)
                            .is_none_or(|r| !ownership.owns(topic.namespace(), r)),
                    },
                    |_| to.clone().map(assigned),
                )
                .await;
            tracing::info!(?bundle, closed, "topics of a lost bundle closed");
            if let Some(release) = bundle.as_ref().and_then(|b| b.release.as_ref()) {
                if let Err(error) = ownership.released(std::slice::from_ref(&release.key)).await {
                    tracing::warn!(bundle = %release.key, %error, "hand-over not finished");
                }
            }
        }
    });
}

/// The load manager's view of this broker's topics: bytes and messages per second published to
/// each loaded topic since the previous reading.
pub struct ServiceLoads {
    service: std::sync::Weak<BrokerService>,
    /// When the previous reading was, and each topic's (bytes, messages) then.
    last: std::sync::Mutex<Reading>,
}

type Reading = (std::time::Instant, std::collections::HashMap<String, (u64, u64)>);

impl ServiceLoads {
    pub fn new(service: &Arc<BrokerService>) -> ServiceLoads {
        let last = (std::time::Instant::now(), Default::default());
        ServiceLoads { service: Arc::downgrade(service), last: std::sync::Mutex::new(last) }
    }
}

impl magnetar_coordination::TopicLoads for ServiceLoads {
    fn topic_loads(&self) -> Vec<magnetar_coordination::TopicLoad> {
        let Some(service) = self.service.upgrade() else { return Vec::new() };
        let now = std::time::Instant::now();
        let mut last = self.last.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let seconds = now.duration_since(last.0).as_secs_f64().max(1e-3);
        let mut counts = std::collections::HashMap::new();
        let mut out = Vec::new();
        for topic in service.loaded_topics() {
            let now_counts = (topic.in_meter.bytes(), topic.in_meter.messages());
            let before = last.1.get(&topic.full_name).copied().unwrap_or(now_counts);
            out.push(magnetar_coordination::TopicLoad {
                name: topic.name.clone(),
                throughput: now_counts.0.saturating_sub(before.0) as f64 / seconds,
                msg_rate: now_counts.1.saturating_sub(before.1) as f64 / seconds,
            });
            counts.insert(topic.full_name.clone(), now_counts);
        }
        *last = (now, counts);
        out
    }
}
