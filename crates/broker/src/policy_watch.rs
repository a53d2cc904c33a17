//! Loaded topics follow policy changes made anywhere in the cluster.
//!
//! The admin API refreshes this broker's loaded topics when it changes a policy
//! (`policies_updated`), but in a cluster the change may come through another broker's admin
//! API: without this watch a loaded topic here would keep its old retention, TTL, rates and
//! limits until its next producer or consumer. [`follow_policy_changes`] watches the namespace
//! and topic-policy documents and re-reads the policies of the loaded topics each change
//! concerns (Pulsar's brokers follow namespace policies through their metadata cache and topic
//! policies through the system topic, to the same end).
//!
//! Ordering: the refreshes it starts and those of the admin API and producer / consumer
//! creation each read and apply under the topic's own lock, and every change is followed by a
//! refresh that starts after it was committed, so the last one applied reads the newest
//! documents. A topic that is still loading when a change arrives re-reads its policies once
//! loaded (`BrokerService::topic` compares the change counter this bumps).

use crate::error::BrokerError;
use crate::service::BrokerService;
use magnetar_metadata::{MetadataError, MetadataStore, WatchEvent, WatchStream};
use magnetar_model::keys;
use magnetar_model::names::{NamespaceName, TopicDomain, TopicName};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

/// Which loaded topics a changed policy document concerns.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PolicyScope {
    /// Every topic of the namespace (its policies document changed).
    Namespace(NamespaceName),
    /// The topic and, for a partitioned one, its partitions (its topic-policies document
    /// changed; policies are kept under the partitioned topic's name).
    Topic(TopicName),
    /// Every topic: changes were missed (a watch lagged or just started).
    Everything,
}

impl PolicyScope {
    /// The scope of a changed key under the watched prefixes; `None` for any other key (a
    /// tenant's namespace list, a malformed key).
    pub fn of_key(key: &str) -> Option<PolicyScope> {
        let under = |root: &str| key.strip_prefix(root).and_then(|rest| rest.strip_prefix('/'));
        if let Some(rest) = under(keys::NAMESPACES_ROOT) {
            let (tenant, namespace) = rest.split_once('/')?;
            return NamespaceName::new(tenant, namespace).ok().map(PolicyScope::Namespace);
        }
        let rest = under(keys::TOPIC_POLICIES_ROOT)?;
        let mut parts = rest.splitn(4, '/');
        let (Some(tenant), Some(namespace), Some(domain), Some(encoded)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        let namespace = NamespaceName::new(tenant, namespace).ok()?;
        let domain = TopicDomain::parse(domain).ok()?;
        let local_name = keys::decode_topic_name(encoded)?;
        TopicName::new(domain, namespace, &local_name).ok().map(PolicyScope::Topic)
    }

    /// The scopes a topic named `name` is in: every topic, its namespace, and its own (for a
    /// partition, its partitioned topic's) policies.
    pub fn covering(name: &TopicName) -> [PolicyScope; 3] {
        [
            PolicyScope::Everything,
            PolicyScope::Namespace(name.namespace().clone()),
            PolicyScope::Topic(name.partitioned_topic()),
        ]
    }

    /// Whether a topic named `name` is in this scope.
    pub fn covers(&self, name: &TopicName) -> bool {
        PolicyScope::covering(name).contains(self)
    }
}

/// Watches the namespace and topic-policy documents for as long as the metadata store lives,
/// refreshing the loaded topics each change concerns (a burst of changes is read off the
/// watches first and refreshed once). Errors of a refresh are logged and the watch goes on; a
/// watch that cannot start yet (etcd unreachable) is retried. Returns once the store closes.
pub async fn follow_policy_changes(service: Arc<BrokerService>) -> Result<(), BrokerError> {
    let metadata = service.metadata.clone();
    let namespace_prefix = format!("{}/", keys::NAMESPACES_ROOT);
    let Some(mut namespaces) = watch_retrying(&*metadata, &namespace_prefix).await else {
        return Ok(());
    };
    let topic_prefix = format!("{}/", keys::TOPIC_POLICIES_ROOT);
    let Some(mut topics) = watch_retrying(&*metadata, &topic_prefix).await else {
        return Ok(());
    };
    // The dynamic configuration: its values change the policy defaults under every topic.
    let Some(mut dynamic) = watch_retrying(&*metadata, keys::DYNAMIC_CONFIGURATION).await else {
        return Ok(());
    };
    // Whatever changed before the watches started is not announced by them.
    let mut pending = HashSet::from([PolicyScope::Everything]);
    let mut reload_dynamic = true;
    loop {
        if std::mem::take(&mut reload_dynamic) {
            // Refreshes every loaded topic itself when the values changed.
            if let Err(error) = service.reload_dynamic_configuration().await {
                tracing::warn!(%error, "the dynamic configuration changed but could not be applied");
            }
        }
        if !pending.is_empty() {
            let scopes = std::mem::take(&mut pending);
            // Looked up per loaded topic: a burst of many changes costs no scope-by-topic scan.
            let affected = |name: &TopicName| {
                PolicyScope::covering(name).iter().any(|scope| scopes.contains(scope))
            };
            if let Err(error) = service.refresh_policies_of(affected).await {
                tracing::warn!(%error, "policies changed but a loaded topic could not re-read them");
            }
        }
        let first = tokio::select! {
            event = namespaces.recv() => event,
            event = topics.recv() => event,
            event = dynamic.recv() => {
                reload_dynamic = true;
                event
            }
        };
        let Some(first) = first else { return Ok(()) };
        // (The dynamic configuration's key is no policy scope: `note` passes it by.)
        note(first, &mut pending);
        drain(&mut namespaces, &mut pending);
        drain(&mut topics, &mut pending);
        while dynamic.try_recv().is_some() {
            reload_dynamic = true;
        }
    }
}

/// Starts a watch on `prefix`, retrying (backing off to 5 s) while the store cannot answer;
/// `None` once the store is closed.
pub(crate) async fn watch_retrying(
    metadata: &dyn MetadataStore,
    prefix: &str,
) -> Option<WatchStream> {
    let mut backoff = Duration::from_millis(100);
    loop {
        match metadata.watch(prefix).await {
            Ok(watch) => return Some(watch),
            Err(MetadataError::Closed) => return None,
            Err(error) => {
                tracing::warn!(prefix, %error, retry_in = ?backoff, "cannot start a metadata watch");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Adds what `event` asks to refresh to `pending`.
fn note(event: WatchEvent, pending: &mut HashSet<PolicyScope>) {
    let scope = match event {
        WatchEvent::Changed(change) => match PolicyScope::of_key(&change.key) {
            Some(scope) => scope,
            None => return,
        },
        WatchEvent::Lagged => PolicyScope::Everything,
    };
    pending.insert(scope);
}

/// Notes every event already queued on `watch`.
fn drain(watch: &mut WatchStream, pending: &mut HashSet<PolicyScope>) {
    while let Some(event) = watch.try_recv() {
        note(event, pending);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topic(name: &str) -> TopicName {
        TopicName::parse(name).expect("topic name")
    }

    #[test]
    fn scopes_of_keys() {
        let namespace = NamespaceName::new("acme", "orders").unwrap();
        assert_eq!(
            PolicyScope::of_key(&keys::namespace_key(&namespace)),
            Some(PolicyScope::Namespace(namespace.clone()))
        );
        let partitioned = topic("persistent://acme/orders/odd name");
        let key = keys::topic_policies_key(&partitioned);
        assert_eq!(PolicyScope::of_key(&key), Some(PolicyScope::Topic(partitioned)));
        // A tenant's namespace list, other roots and malformed keys concern no topic.
        assert_eq!(PolicyScope::of_key(&keys::namespaces_of("acme")), None);
        assert_eq!(PolicyScope::of_key("/admin/namespaces/acme/orders/extra"), None);
        assert_eq!(PolicyScope::of_key("/admin/topic-policies/acme/orders/bogus/t"), None);
        assert_eq!(PolicyScope::of_key("/admin/tenants/acme"), None);
        assert_eq!(PolicyScope::of_key("/admin/namespacesX/acme/orders"), None);
    }

    #[test]
    fn scopes_cover_their_topics_and_partitions() {
        let namespace = NamespaceName::new("acme", "orders").unwrap();
        let partition = topic("persistent://acme/orders/t-partition-3");
        let other = topic("non-persistent://acme/other/t");
        assert!(PolicyScope::Namespace(namespace.clone()).covers(&partition));
        assert!(!PolicyScope::Namespace(namespace).covers(&other));
        let partitioned = PolicyScope::Topic(topic("persistent://acme/orders/t"));
        assert!(partitioned.covers(&partition));
        assert!(partitioned.covers(&topic("persistent://acme/orders/t")));
        assert!(!partitioned.covers(&topic("non-persistent://acme/orders/t")));
        assert!(!partitioned.covers(&topic("persistent://acme/orders/t2")));
        assert!(PolicyScope::Everything.covers(&other));
    }

    /// The first watches it sees fail, as an unreachable etcd's do.
    struct FailingWatches(std::sync::atomic::AtomicU32);

    #[async_trait::async_trait]
    impl magnetar_metadata::Interceptor for FailingWatches {
        async fn before(
            &self,
            operation: magnetar_metadata::Operation<'_>,
        ) -> magnetar_metadata::Result<()> {
            use std::sync::atomic::Ordering::SeqCst;
            if matches!(operation, magnetar_metadata::Operation::Watch(_))
                && self.0.fetch_update(SeqCst, SeqCst, |left| left.checked_sub(1)).is_ok()
            {
                return Err(MetadataError::Io {
                    context: "starting a watch".into(),
                    source: std::io::Error::other("etcd unreachable"),
                });
            }
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_watch_that_cannot_start_is_retried_until_the_store_closes() {
        let store = magnetar_metadata::InterceptedStore {
            inner: magnetar_metadata::MemoryStore::new(),
            interceptor: FailingWatches(std::sync::atomic::AtomicU32::new(2)),
        };
        let started = tokio::time::Instant::now();
        let watch = tokio::time::timeout(
            Duration::from_secs(10),
            watch_retrying(&store, "/admin/namespaces/"),
        )
        .await
        .expect("bounded");
        assert!(watch.is_some(), "started on the third try");
        assert!(started.elapsed() >= Duration::from_millis(300), "backed off 100 + 200 ms");
        assert_eq!(store.interceptor.0.load(std::sync::atomic::Ordering::SeqCst), 0);
        store.close().await.unwrap();
        assert!(watch_retrying(&store, "/admin/namespaces/").await.is_none(), "closed: given up");
    }

    #[test]
    fn a_burst_is_noted_once_and_a_lag_means_everything() {
        let mut pending = HashSet::new();
        let change = |key: String| {
            WatchEvent::Changed(magnetar_metadata::Event {
                key,
                kind: magnetar_metadata::EventKind::Delete,
            })
        };
        let namespace = NamespaceName::new("acme", "orders").unwrap();
        note(change(keys::namespace_key(&namespace)), &mut pending);
        note(change(keys::namespace_key(&namespace)), &mut pending);
        note(change("/admin/namespaces/acme".into()), &mut pending);
        assert_eq!(pending, HashSet::from([PolicyScope::Namespace(namespace)]));
        note(WatchEvent::Lagged, &mut pending);
        assert!(pending.contains(&PolicyScope::Everything));
    }
}
