//! Standalone bootstrap: the tenants and namespaces a fresh Pulsar standalone has.
//!
//! Pulsar standalone creates tenant `public` with namespace `public/default`, and tenant
//! `pulsar` with namespace `pulsar/system`, all allowed on the local cluster. [`bootstrap`]
//! does the same, creating only what is absent (create-if-absent via
//! `ExpectedVersion::Absent`), so it is idempotent and safe to run concurrently; existing
//! values are never modified.

use bytes::Bytes;
use magnetar_metadata::{ExpectedVersion, MetadataError, MetadataStore};

use crate::error::AdminError;
use crate::model::TenantInfo;
use magnetar_model::keys;
use magnetar_model::names::is_valid_entity_name;

/// Tenants and namespaces created by [`bootstrap`].
pub const BOOTSTRAP_NAMESPACES: [(&str, &str); 2] = [("public", "default"), ("pulsar", "system")];

/// Creates, when absent, tenants `public` and `pulsar` (allowed on `cluster`) and namespaces
/// `public/default` and `pulsar/system` (policies `{}`). Errors: 412 for an invalid cluster
/// name, otherwise metadata-store failures.
pub async fn bootstrap(store: &dyn MetadataStore, cluster: &str) -> Result<(), AdminError> {
    if !is_valid_entity_name(cluster) {
        return Err(AdminError::PreconditionFailed(format!(
            "Cluster name is not valid: {cluster:?}"
        )));
    }
    let tenant_info = serde_json::to_vec(&TenantInfo::for_cluster(cluster))
        .map_err(|e| AdminError::Internal(format!("cannot serialise tenant info: {e}")))?;
    for (tenant, namespace) in BOOTSTRAP_NAMESPACES {
        create_if_absent(store, &keys::tenant(tenant), Bytes::from(tenant_info.clone())).await?;
        create_if_absent(store, &keys::namespace(tenant, namespace), Bytes::from_static(b"{}"))
            .await?;
    }
    Ok(())
}

async fn create_if_absent(
    store: &dyn MetadataStore,
    key: &str,
    value: Bytes,
) -> Result<(), AdminError> {
    match store.put(key, value, ExpectedVersion::Absent).await {
        Ok(_) | Err(MetadataError::BadVersion { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
