//! Bootstrap: the tenants and namespaces a fresh Pulsar cluster has, and the cluster record.
//!
//! Pulsar standalone creates tenant `public` with namespace `public/default`, and tenant
//! `pulsar` with namespace `pulsar/system`, all allowed on the local cluster. [`bootstrap`]
//! does the same, creating only what is absent (create-if-absent via
//! `ExpectedVersion::Absent`), so it is idempotent and safe to run concurrently; existing
//! values are never modified.
//!
//! [`initialize_cluster`] is `magnetar metadata init` (Pulsar's
//! `initialize-cluster-metadata`): the same keys, then the cluster record
//! (`/admin/clusters/{cluster}`), written last so that its presence means every initial key
//! exists. Brokers check it before they start.

use bytes::Bytes;
use magnetar_metadata::{ExpectedVersion, MetadataError, MetadataStore};

use crate::error::AdminError;
use crate::model::TenantInfo;
use crate::DEFAULT_NUMBER_OF_NAMESPACE_BUNDLES;
use magnetar_model::keys;
use magnetar_model::names::is_valid_entity_name;
use magnetar_model::ClusterData;

/// Tenants and namespaces created by [`bootstrap`].
pub const BOOTSTRAP_NAMESPACES: [(&str, &str); 2] = [("public", "default"), ("pulsar", "system")];

/// Creates, when absent, tenants `public` and `pulsar` (allowed on `cluster`) and namespaces
/// `public/default` and `pulsar/system` (with [`DEFAULT_NUMBER_OF_NAMESPACE_BUNDLES`] bundles).
/// Errors: 412 for an invalid cluster name, otherwise metadata-store failures.
pub async fn bootstrap(
    store: &dyn MetadataStore,
    cluster: &str,
) -> Result<BootstrapReport, AdminError> {
    bootstrap_with_bundles(store, cluster, DEFAULT_NUMBER_OF_NAMESPACE_BUNDLES).await
}

/// [`bootstrap`], the namespaces created with `bundles` bundles (1..=128).
pub async fn bootstrap_with_bundles(
    store: &dyn MetadataStore,
    cluster: &str,
    bundles: u32,
) -> Result<BootstrapReport, AdminError> {
    check_cluster_name(cluster)?;
    let policies = serde_json::to_vec(&serde_json::json!({
        "bundles": crate::routes::namespaces::bundles_data(bundles)
    }))
    .map_err(|e| AdminError::Internal(format!("cannot serialise policies: {e}")))?;
    let tenant_info = serde_json::to_vec(&TenantInfo::for_cluster(cluster))
        .map_err(|e| AdminError::Internal(format!("cannot serialise tenant info: {e}")))?;
    let mut report = BootstrapReport::default();
    for (tenant, namespace) in BOOTSTRAP_NAMESPACES {
        let key = keys::tenant(tenant);
        let created = create_if_absent(store, &key, Bytes::from(tenant_info.clone())).await?;
        report.keys.push((key, created));
        let key = keys::namespace(tenant, namespace);
        let created = create_if_absent(store, &key, Bytes::from(policies.clone())).await?;
        report.keys.push((key, created));
    }
    Ok(report)
}

/// What [`bootstrap`] or [`initialize_cluster`] did: every key it ensures, in order, with
/// whether this run created it (`false`: it existed and was left unchanged).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BootstrapReport {
    pub keys: Vec<(String, bool)>,
}

impl BootstrapReport {
    /// Keys this run created.
    pub fn created(&self) -> usize {
        self.keys.iter().filter(|(_, created)| *created).count()
    }
}

/// `magnetar metadata init`: [`bootstrap`] for `cluster`, then its record `data` at
/// `/admin/clusters/{cluster}` (last: it marks the cluster initialized). Idempotent: a second
/// run creates nothing and changes nothing (an existing record is kept as it is).
pub async fn initialize_cluster(
    store: &dyn MetadataStore,
    cluster: &str,
    data: &ClusterData,
) -> Result<BootstrapReport, AdminError> {
    let mut report = bootstrap(store, cluster).await?;
    let record = serde_json::to_vec(data)
        .map_err(|e| AdminError::Internal(format!("cannot serialise cluster data: {e}")))?;
    let key = keys::cluster(cluster);
    let created = create_if_absent(store, &key, Bytes::from(record)).await?;
    report.keys.push((key, created));
    Ok(report)
}

/// Whether `cluster` has been initialized (its record exists).
pub async fn cluster_initialized(
    store: &dyn MetadataStore,
    cluster: &str,
) -> Result<bool, AdminError> {
    check_cluster_name(cluster)?;
    Ok(store.get(&keys::cluster(cluster)).await?.is_some())
}

fn check_cluster_name(cluster: &str) -> Result<(), AdminError> {
    if !is_valid_entity_name(cluster) {
        return Err(AdminError::PreconditionFailed(format!(
            "Cluster name is not valid: {cluster:?}"
        )));
    }
    Ok(())
}

/// Creates `key` unless it exists; returns whether it was created.
async fn create_if_absent(
    store: &dyn MetadataStore,
    key: &str,
    value: Bytes,
) -> Result<bool, AdminError> {
    match store.put(key, value, ExpectedVersion::Absent).await {
        Ok(_) => Ok(true),
        Err(MetadataError::BadVersion { .. }) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use magnetar_metadata::MemoryStore;

    async fn versions(store: &MemoryStore, report: &BootstrapReport) -> Vec<u64> {
        let mut out = Vec::new();
        for (key, _) in &report.keys {
            out.push(store.get(key).await.unwrap().unwrap().version);
        }
        out
    }

    #[tokio::test]
    async fn initialize_is_idempotent_and_writes_the_record_last() {
        let store = MemoryStore::new();
        assert!(!cluster_initialized(&store, "c1").await.unwrap());
        let data = ClusterData {
            service_url: Some("http://h:8080".into()),
            broker_service_url: Some("pulsar://h:6650".into()),
            service_url_tls: Some("https://h:8443".into()),
            broker_service_url_tls: None,
        };
        let first = initialize_cluster(&store, "c1", &data).await.unwrap();
        assert_eq!(first.created(), 5);
        assert_eq!(first.keys.last().unwrap(), &(keys::cluster("c1"), true));
        assert!(cluster_initialized(&store, "c1").await.unwrap());
        let before = versions(&store, &first).await;
        let other = ClusterData { service_url: Some("http://elsewhere".into()), ..data };
        let second = initialize_cluster(&store, "c1", &other).await.unwrap();
        assert_eq!(second.created(), 0);
        assert_eq!(versions(&store, &first).await, before, "nothing rewritten");
        let stored = store.get(&keys::cluster("c1")).await.unwrap().unwrap();
        let stored: ClusterData = serde_json::from_slice(&stored.value).unwrap();
        assert_eq!(stored.service_url.as_deref(), Some("http://h:8080"), "record kept");
        assert_eq!(stored.service_url_tls.as_deref(), Some("https://h:8443"));
        let json = String::from_utf8(
            store.get(&keys::cluster("c1")).await.unwrap().unwrap().value.to_vec(),
        )
        .unwrap();
        assert!(
            json.contains(r#""serviceUrlTls":"https://h:8443""#),
            "Pulsar's field name: {json}"
        );
        assert!(!json.contains("brokerServiceUrlTls"), "unset fields are left out: {json}");
        assert!(initialize_cluster(&store, "", &ClusterData::default()).await.is_err());
    }
}
