//! Magnetar's shared model, below the broker, the admin API and the client: what every layer
//! must agree on and nothing more.
//!
//! - [`names`]: tenant, namespace and topic names, parsed and validated as Pulsar does, and the
//!   encoding of a topic's local name in keys and URLs.
//! - [`listeners`]: advertised listeners (`advertisedListeners`) and the one a client names.
//! - [`keys`]: every metadata-store key. No other crate builds a key by hand, so the layout is
//!   read in one place (and moved under a cluster's root prefix by the store, not here).
//! - [`policies`]: the JSON documents stored for tenants, partitioned topics, the cluster record
//!   and broker registrations.
//! - [`policy`]: namespace and topic policies (retention, TTL, backlog quotas, limits, rates)
//!   and how they layer into what a topic obeys.
//! - [`schema`]: schema histories and the compatibility rules deciding what may join them.
//! - [`storage_nodes`]: storage node registrations and the operator's rack assignments.
//! - [`dynamic_config`]: the broker settings `pulsar-admin brokers update-dynamic-config`
//!   changes at run time, and their values.
//!
//! Pure: no I/O, no async, no clock (callers pass times in).

pub mod dynamic_config;
pub mod keys;
pub mod listeners;
pub mod names;
pub mod policies;
pub mod policy;
pub mod schema;
pub mod storage_nodes;

pub use names::{NameError, NamespaceName, TopicDomain, TopicName};
pub use policies::{BrokerRegistration, ClusterData, PartitionedTopicMetadata, TenantInfo};
