//! The broker's authorizer: the decision core of `magnetar_security::authorization` over the
//! tenant and namespace documents of the metadata store, cached.
//!
//! Decisions are taken at PRODUCER, SUBSCRIBE, LOOKUP, PARTITIONED_METADATA,
//! GET_TOPICS_OF_NAMESPACE and the schema commands, never per message. The documents they need
//! (a tenant's `adminRoles`, a namespace's `auth_policies` and `subscription_auth_mode`) are
//! cached per tenant / namespace. A metadata watch on the tenant and namespace keys drops a
//! cached document as soon as it changes (on this broker or, through etcd, on another one) and
//! announces the change on [`Authorizer::changes`]: every connection with open producers or
//! consumers in that namespace re-checks them and closes the ones no longer allowed
//! (CLOSE_PRODUCER / CLOSE_CONSUMER; the client reconnects and meets the AuthorizationError).
//! The admin API also calls [`Authorizer::invalidate_namespace`] after a permission change (a
//! belt to the watch's braces; both are cheap). With authorization disabled nothing is read,
//! cached or watched.

use crate::error::BrokerError;
use magnetar_metadata::{MetadataStore, WatchEvent};
use magnetar_model::keys;
use magnetar_model::names::{NamespaceName, TopicName};
use magnetar_security::authorization::{
    AuthorizationConfig, Denied, Facts, NamespaceAuth, NamespaceOperation, TopicOperation,
};
use magnetar_security::Principal;
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::broadcast;

/// What changed: the permissions of one namespace, of a whole tenant, or unknown (a watch that
/// lagged: everything is re-checked).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PermissionChange {
    /// `tenant/namespace`.
    Namespace(String),
    Tenant(String),
    All,
}

impl PermissionChange {
    /// Whether a topic of `namespace` may be affected.
    pub fn affects(&self, namespace: &NamespaceName) -> bool {
        match self {
            PermissionChange::Namespace(ns) => *ns == namespace.to_string(),
            PermissionChange::Tenant(tenant) => tenant == namespace.tenant(),
            PermissionChange::All => true,
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct TenantDoc {
    #[serde(rename = "adminRoles")]
    admin_roles: Vec<String>,
}

#[derive(Default)]
struct Cache {
    /// Bumped by every invalidation: a document read while it changed is not cached (the read
    /// may predate the change).
    generation: u64,
    /// tenant → its admin roles (`None`: no such tenant).
    tenants: HashMap<String, Option<Arc<Vec<String>>>>,
    /// `tenant/namespace` → its authorization policies (`None`: no such namespace).
    namespaces: HashMap<String, Option<Arc<NamespaceAuth>>>,
}

/// Authorization of protocol commands, with cached documents (see the module docs).
pub struct Authorizer {
    config: AuthorizationConfig,
    metadata: Arc<dyn MetadataStore>,
    cache: Mutex<Cache>,
    changes: broadcast::Sender<PermissionChange>,
}

/// An authorization failure, or a failure to read what the decision needs.
#[derive(Debug, thiserror::Error)]
pub enum AuthzError {
    #[error("{0}")]
    Denied(#[from] Denied),
    #[error(transparent)]
    Broker(#[from] BrokerError),
}

impl From<AuthzError> for BrokerError {
    fn from(error: AuthzError) -> Self {
        match error {
            AuthzError::Denied(denied) => BrokerError::Unauthorized(denied.0),
            AuthzError::Broker(error) => error,
        }
    }
}

impl Authorizer {
    pub fn new(config: AuthorizationConfig, metadata: Arc<dyn MetadataStore>) -> Authorizer {
        let (changes, _) = broadcast::channel(256);
        Authorizer { config, metadata, cache: Mutex::default(), changes }
    }

    /// Authorization is enforced.
    pub fn enabled(&self) -> bool {
        self.config.enabled
    }

    pub fn config(&self) -> &AuthorizationConfig {
        &self.config
    }

    /// Permission changes, for connections to re-check their producers and consumers.
    pub fn changes(&self) -> broadcast::Receiver<PermissionChange> {
        self.changes.subscribe()
    }

    /// The decision needs no document: authorization is off, there is no role (refused) or
    /// the role is a super-user.
    fn without_documents(&self, principal: Option<&Principal>) -> Option<Result<(), AuthzError>> {
        if !self.config.enabled {
            return Some(Ok(()));
        }
        match principal {
            None => Some(Err(Denied("Authentication required".to_string()).into())),
            Some(p) if self.config.is_super_user(&p.role) => Some(Ok(())),
            Some(_) => None,
        }
    }

    async fn tenant_admins(&self, tenant: &str) -> Result<Option<Arc<Vec<String>>>, BrokerError> {
        let generation = {
            let cache = self.lock();
            if let Some(found) = cache.tenants.get(tenant) {
                return Ok(found.clone());
            }
            cache.generation
        };
        let read = match self.metadata.get(&keys::tenant(tenant)).await? {
            Some(found) => {
                let doc: TenantDoc = serde_json::from_slice(&found.value)
                    .map_err(|e| BrokerError::Metadata(format!("tenant {tenant}: {e}")))?;
                Some(Arc::new(doc.admin_roles))
            }
            None => None,
        };
        let mut cache = self.lock();
        if cache.generation == generation {
            cache.tenants.insert(tenant.to_string(), read.clone());
        }
        Ok(read)
    }

    async fn namespace_auth(
        &self,
        namespace: &NamespaceName,
    ) -> Result<Option<Arc<NamespaceAuth>>, BrokerError> {
        let name = namespace.to_string();
        let generation = {
            let cache = self.lock();
            if let Some(found) = cache.namespaces.get(&name) {
                return Ok(found.clone());
            }
            cache.generation
        };
        let key = keys::namespace(namespace.tenant(), namespace.namespace());
        let read = match self.metadata.get(&key).await? {
            Some(found) => {
                Some(Arc::new(NamespaceAuth::from_policies_json(&found.value).map_err(|e| {
                    BrokerError::Metadata(format!("policies of namespace {name}: {e}"))
                })?))
            }
            None => None,
        };
        let mut cache = self.lock();
        if cache.generation == generation {
            cache.namespaces.insert(name, read.clone());
        }
        Ok(read)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// May `principal` do `op` on `topic` (`subscription` for consume operations)?
    pub async fn check_topic(
        &self,
        principal: Option<&Principal>,
        topic: &TopicName,
        op: TopicOperation,
        subscription: Option<&str>,
    ) -> Result<(), AuthzError> {
        if let Some(decided) = self.without_documents(principal) {
            return decided;
        }
        let admins = self.tenant_admins(topic.tenant()).await?;
        if admins.is_none() {
            // Pulsar's `validateTenantAdminAccess` throws NOT_FOUND, which its ServerCnx
            // answers as TopicNotFound: existence is checked before permission.
            return Err(BrokerError::TopicNotFound(format!(
                "Tenant or namespace or topic does not exist: {}",
                topic.namespace()
            ))
            .into());
        }
        let namespace = self.namespace_auth(topic.namespace()).await?;
        let facts = Facts {
            role: principal.map(|p| p.role.as_str()),
            tenant_admin_roles: admins.as_deref().map(Vec::as_slice),
            namespace: namespace.as_deref(),
        };
        let name = topic.to_string();
        self.config.allow_topic_operation(&facts, &name, op, subscription)?;
        Ok(())
    }

    /// May `principal` do `op` on `namespace`?
    pub async fn check_namespace(
        &self,
        principal: Option<&Principal>,
        namespace: &NamespaceName,
        op: NamespaceOperation,
    ) -> Result<(), AuthzError> {
        if let Some(decided) = self.without_documents(principal) {
            return decided;
        }
        let admins = self.tenant_admins(namespace.tenant()).await?;
        let auth = self.namespace_auth(namespace).await?;
        let facts = Facts {
            role: principal.map(|p| p.role.as_str()),
            tenant_admin_roles: admins.as_deref().map(Vec::as_slice),
            namespace: auth.as_deref(),
        };
        self.config.allow_namespace_operation(&facts, op)?;
        Ok(())
    }

    /// A namespace's permissions changed: its cached document is dropped and connections
    /// re-check their producers and consumers there.
    pub fn invalidate_namespace(&self, namespace: &NamespaceName) {
        if !self.config.enabled {
            return;
        }
        let name = namespace.to_string();
        {
            let mut cache = self.lock();
            cache.generation += 1;
            cache.namespaces.remove(&name);
        }
        let _ = self.changes.send(PermissionChange::Namespace(name));
    }

    /// A tenant document changed (its admins).
    pub fn invalidate_tenant(&self, tenant: &str) {
        if !self.config.enabled {
            return;
        }
        {
            let mut cache = self.lock();
            cache.generation += 1;
            cache.tenants.remove(tenant);
        }
        let _ = self.changes.send(PermissionChange::Tenant(tenant.to_string()));
    }

    /// Everything may have changed (a lagged watch).
    pub fn invalidate_all(&self) {
        if !self.config.enabled {
            return;
        }
        {
            let mut cache = self.lock();
            let generation = cache.generation + 1;
            *cache = Cache { generation, ..Cache::default() };
        }
        let _ = self.changes.send(PermissionChange::All);
    }

    /// Reacts to a changed metadata key (a tenant or namespace document; others are ignored).
    fn key_changed(&self, key: &str) {
        if let Some(tenant) = key.strip_prefix(keys::TENANTS_ROOT).and_then(|k| k.strip_prefix('/'))
        {
            if !tenant.contains('/') {
                self.invalidate_tenant(tenant);
            }
        } else if let Some(rest) =
            key.strip_prefix(keys::NAMESPACES_ROOT).and_then(|k| k.strip_prefix('/'))
        {
            if let Some((tenant, namespace)) = rest.split_once('/') {
                if let Ok(ns) = NamespaceName::new(tenant, namespace) {
                    self.invalidate_namespace(&ns);
                }
            }
        }
    }

    /// Watches the tenant and namespace documents while the store lives, dropping cached
    /// documents as they change (this broker's writes and, with etcd, every other broker's).
    /// Returns at once when authorization is disabled.
    pub async fn watch(self: Arc<Self>) -> Result<(), BrokerError> {
        if !self.config.enabled {
            return Ok(());
        }
        let retrying = crate::policy_watch::watch_retrying;
        let tenant_prefix = format!("{}/", keys::TENANTS_ROOT);
        let Some(mut tenants) = retrying(&*self.metadata, &tenant_prefix).await else {
            return Ok(());
        };
        let namespace_prefix = format!("{}/", keys::NAMESPACES_ROOT);
        let Some(mut namespaces) = retrying(&*self.metadata, &namespace_prefix).await else {
            return Ok(());
        };
        // Anything cached before the watches started may be stale.
        self.invalidate_all();
        loop {
            let event = tokio::select! {
                event = tenants.recv() => event,
                event = namespaces.recv() => event,
            };
            match event {
                Some(WatchEvent::Changed(event)) => self.key_changed(&event.key),
                Some(WatchEvent::Lagged) => self.invalidate_all(),
                None => return Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use magnetar_metadata::{ExpectedVersion, MemoryStore};

    fn principal(role: &str) -> Principal {
        Principal { role: role.to_string(), method: "token".to_string(), expires_at_ms: None }
    }

    async fn put(store: &dyn MetadataStore, key: &str, value: &str) {
        store.put(key, Bytes::from(value.to_string()), ExpectedVersion::Any).await.expect("put");
    }

    #[tokio::test]
    async fn decides_from_cached_documents_and_forgets_them_on_change() {
        let store: Arc<dyn MetadataStore> = Arc::new(MemoryStore::new());
        put(&*store, "/admin/tenants/acme", r#"{"adminRoles":["boss"]}"#).await;
        put(
            &*store,
            "/admin/namespaces/acme/ns",
            r#"{"auth_policies":{"namespace_auth":{"writer":["produce"]}}}"#,
        )
        .await;
        let config = AuthorizationConfig {
            enabled: true,
            super_user_roles: vec!["root".into()],
            ..Default::default()
        };
        let authorizer = Arc::new(Authorizer::new(config, store.clone()));
        let watcher = tokio::spawn(authorizer.clone().watch());
        let mut changes = authorizer.changes();
        // The watch starts by dropping everything: wait for it so later events are seen.
        let first = tokio::time::timeout(std::time::Duration::from_secs(5), changes.recv()).await;
        assert_eq!(first.expect("in time").expect("open"), PermissionChange::All);
        let topic = TopicName::parse("persistent://acme/ns/t").expect("name");
        let produce = TopicOperation::Produce;
        let writer = principal("writer");
        assert!(authorizer.check_topic(Some(&writer), &topic, produce, None).await.is_ok());
        assert!(authorizer
            .check_topic(Some(&principal("boss")), &topic, TopicOperation::Consume, Some("s"))
            .await
            .is_ok());
        assert!(authorizer
            .check_topic(Some(&principal("root")), &topic, produce, None)
            .await
            .is_ok());
        let denied = authorizer.check_topic(Some(&principal("x")), &topic, produce, None).await;
        assert!(matches!(denied, Err(AuthzError::Denied(_))));
        assert!(authorizer.check_topic(None, &topic, produce, None).await.is_err());
        // Revoke: the watch drops the cached document and announces the namespace.
        put(&*store, "/admin/namespaces/acme/ns", r#"{"auth_policies":{}}"#).await;
        let change = tokio::time::timeout(std::time::Duration::from_secs(5), changes.recv()).await;
        assert_eq!(
            change.expect("in time").expect("open"),
            PermissionChange::Namespace("acme/ns".into())
        );
        let revoked = authorizer.check_topic(Some(&writer), &topic, produce, None).await;
        assert!(matches!(revoked, Err(AuthzError::Denied(_))), "{revoked:?}");
        // A tenant's admins change the same way.
        put(&*store, "/admin/tenants/acme", r#"{"adminRoles":[]}"#).await;
        let change = tokio::time::timeout(std::time::Duration::from_secs(5), changes.recv()).await;
        assert_eq!(
            change.expect("in time").expect("open"),
            PermissionChange::Tenant("acme".into())
        );
        let boss = authorizer.check_topic(Some(&principal("boss")), &topic, produce, None).await;
        assert!(boss.is_err());
        // Namespace operations: GET_TOPICS needs produce or consume at namespace level.
        let ns = NamespaceName::new("acme", "ns").expect("name");
        let listed =
            authorizer.check_namespace(Some(&writer), &ns, NamespaceOperation::GetTopics).await;
        assert!(listed.is_err());
        watcher.abort();
    }

    #[tokio::test]
    async fn disabled_reads_nothing() {
        let store: Arc<dyn MetadataStore> = Arc::new(MemoryStore::new());
        let authorizer = Authorizer::new(AuthorizationConfig::default(), store);
        let topic = TopicName::parse("persistent://nobody/ns/t").expect("name");
        assert!(authorizer.check_topic(None, &topic, TopicOperation::Produce, None).await.is_ok());
        assert!(authorizer.lock().tenants.is_empty());
    }

    #[test]
    fn changes_affect_their_namespaces() {
        let ns = NamespaceName::new("acme", "ns").expect("name");
        assert!(PermissionChange::Namespace("acme/ns".into()).affects(&ns));
        assert!(!PermissionChange::Namespace("acme/other".into()).affects(&ns));
        assert!(PermissionChange::Tenant("acme".into()).affects(&ns));
        assert!(!PermissionChange::Tenant("acme2".into()).affects(&ns));
        assert!(PermissionChange::All.affects(&ns));
    }
}
