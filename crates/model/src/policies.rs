//! The JSON documents Magnetar stores in the metadata store and serves over the admin API,
//! with the field names of Pulsar's Jackson serialisation (`TenantInfoImpl`,
//! `PartitionedTopicMetadata`). Unknown fields are ignored, as Jackson does.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Pulsar's `TenantInfo`: who administers the tenant and which clusters it may use. Stored
/// as-is at `/admin/tenants/{tenant}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantInfo {
    /// Roles with admin rights on the tenant.
    #[serde(default, deserialize_with = "null_as_default")]
    pub admin_roles: Vec<String>,
    /// Clusters the tenant's namespaces may use.
    #[serde(default, deserialize_with = "null_as_default")]
    pub allowed_clusters: Vec<String>,
}

impl TenantInfo {
    /// A tenant allowed on `cluster`, with no admin roles.
    pub fn for_cluster(cluster: &str) -> Self {
        TenantInfo { admin_roles: Vec::new(), allowed_clusters: vec![cluster.to_string()] }
    }

    /// Sorts and de-duplicates both lists (Pulsar keeps them as sets).
    pub fn normalize(&mut self) {
        self.admin_roles.sort();
        self.admin_roles.dedup();
        self.allowed_clusters.sort();
        self.allowed_clusters.dedup();
    }
}

fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// Pulsar's `PartitionedTopicMetadata`, stored at
/// `/admin/partitioned-topics/{tenant}/{namespace}/{domain}/{encoded-topic}` and returned by
/// `GET …/partitions`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionedTopicMetadata {
    /// Number of partitions; 0 means "not partitioned".
    pub partitions: u32,
    /// Optional topic properties (Pulsar 2.11+).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub properties: Option<BTreeMap<String, String>>,
}

impl PartitionedTopicMetadata {
    /// Metadata with `partitions` partitions and no properties.
    pub fn new(partitions: u32) -> Self {
        PartitionedTopicMetadata { partitions, properties: None }
    }
}

/// Pulsar's `ClusterData` (the fields Magnetar uses), stored at `/admin/clusters/{cluster}` by
/// `magnetar metadata init` and returned by `GET /admin/v2/clusters/{cluster}`. Its presence
/// marks an initialized cluster: a broker refuses to start on a cluster without it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterData {
    /// HTTP admin URL of the cluster (`http://host:8080`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_url: Option<String>,
    /// Binary protocol URL of the cluster (`pulsar://host:6650`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broker_service_url: Option<String>,
    /// HTTPS admin URL of the cluster (`https://host:8443`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_url_tls: Option<String>,
    /// TLS binary protocol URL of the cluster (`pulsar+ssl://host:6651`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broker_service_url_tls: Option<String>,
}

/// What a running broker publishes about itself at `/brokers/{host}:{web-port}`, an ephemeral
/// key bound to its metadata session (field names after Pulsar's `BrokerLookupData`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BrokerRegistration {
    /// `pulsar://host:port` clients connect to.
    pub pulsar_service_url: String,
    /// `http://host:port` of its admin API.
    pub web_service_url: String,
    /// `pulsar+ssl://host:port`, when TLS is enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pulsar_service_url_tls: Option<String>,
    /// `https://host:port` of its admin API, when TLS is enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web_service_url_tls: Option<String>,
    /// Its advertised listeners by name (Pulsar's `advertisedListeners`), which lookups of its
    /// topics on any broker answer a client naming one with.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub advertised_listeners: BTreeMap<String, crate::listeners::Listener>,
    /// Which of them a client naming none is answered (`internalListenerName`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub internal_listener_name: Option<String>,
    /// When the broker process started, milliseconds since the Unix epoch.
    pub start_timestamp: u64,
    /// The broker's version (`CARGO_PKG_VERSION` of the binary).
    pub broker_version: String,
}
