//! Metadata-store key layout shared by the admin API and the broker.
//!
//! These functions are pure (no HTTP types, no I/O) so the broker can depend on this crate
//! for them without pulling the router in. The layout (see also the crate docs):
//!
//! | what | key | value |
//! | --- | --- | --- |
//! | tenant | `/admin/tenants/{tenant}` | JSON TenantInfo `{"adminRoles":[],"allowedClusters":["standalone"]}` |
//! | namespace | `/admin/namespaces/{tenant}/{namespace}` | JSON policies, `{}` by default |
//! | partitioned topic | `/admin/partitioned-topics/{tenant}/{namespace}/{domain}/{encoded-topic}` | JSON `{"partitions":N}` |
//! | topic policies | `/admin/topic-policies/{tenant}/{namespace}/{domain}/{encoded-topic}` | JSON, e.g. `{"deduplicationEnabled":true}` |
//! | non-partitioned topic (broker-owned) | `/topics/{tenant}/{namespace}/{domain}/{encoded-topic}` | owned by the broker |
//! | ledger id allocator | `/ledger-ids` | decimal: the next id not yet handed out in a block |
//! | managed ledger (broker) | `/managed-ledgers/{domain}/{tenant}/{namespace}/{encoded-topic}` | the topic's ledger list (CAS) |
//! | cursors (broker) | `/cursors/{domain}/{tenant}/{namespace}/{encoded-topic}/{encoded-subscription}` | a subscription's cursor (CAS) |
//! | dedup snapshot (broker) | `/dedup/{domain}/{tenant}/{namespace}/{encoded-topic}` | producer sequence ids (CAS) |
//! | schema history | `/schemas/{tenant}/{namespace}/{encoded-topic}` | JSON SchemaHistory (partitions share it) |
//! | cluster record (marks an initialized cluster) | `/admin/clusters/{cluster}` | JSON ClusterData (`magnetar metadata init`) |
//! | broker registration (ephemeral) | `/brokers/{advertised-host}:{web-port}` | JSON BrokerRegistration |
//!
//! `{domain}` is `persistent` or `non-persistent`; `{encoded-topic}` is the topic's local name
//! encoded with [`encode_topic_name`] (Java `URLEncoder` rules, as Pulsar's
//! `TopicName.getEncodedLocalName`), so a local name never introduces an extra path segment.
//! Partitions of a partitioned topic are ordinary topics named `{topic}-partition-{i}`.
//!
//! No other crate builds a metadata key by hand: every key comes from here.
//!
//! The functions taking `&str` parts do not validate them: callers pass names already
//! validated by [`crate::names`] (the typed variants take validated names).

pub use crate::names::{decode_topic_name, encode_topic_name};
use crate::names::{NamespaceName, TopicDomain, TopicName};

/// Parent of every tenant key.
pub const TENANTS_ROOT: &str = "/admin/tenants";
/// Parent of every namespace key (grouped by tenant).
pub const NAMESPACES_ROOT: &str = "/admin/namespaces";
/// Parent of every partitioned-topic key.
pub const PARTITIONED_TOPICS_ROOT: &str = "/admin/partitioned-topics";
/// Parent of every topic-policies key.
pub const TOPIC_POLICIES_ROOT: &str = "/admin/topic-policies";
/// Parent of every broker-owned non-partitioned topic key.
pub const TOPICS_ROOT: &str = "/topics";
/// The cluster-wide ledger id counter (the broker's `ledger_ids` takes blocks from it).
pub const LEDGER_IDS: &str = "/ledger-ids";

/// `/admin/tenants/{tenant}`.
pub fn tenant(tenant: &str) -> String {
    format!("{TENANTS_ROOT}/{tenant}")
}

/// `/admin/namespaces/{tenant}`: the parent of the tenant's namespace keys.
pub fn namespaces_of(tenant: &str) -> String {
    format!("{NAMESPACES_ROOT}/{tenant}")
}

/// `/admin/namespaces/{tenant}/{namespace}`.
pub fn namespace(tenant: &str, namespace: &str) -> String {
    format!("{NAMESPACES_ROOT}/{tenant}/{namespace}")
}

/// Key of a namespace given its typed name.
pub fn namespace_key(ns: &NamespaceName) -> String {
    namespace(ns.tenant(), ns.namespace())
}

/// `/admin/partitioned-topics/{tenant}/{namespace}/{domain}`: parent of the namespace's
/// partitioned topics in one domain (children are encoded local names).
pub fn partitioned_topics_of(tenant: &str, namespace: &str, domain: TopicDomain) -> String {
    format!("{PARTITIONED_TOPICS_ROOT}/{tenant}/{namespace}/{domain}")
}

/// `/admin/partitioned-topics/{tenant}/{namespace}`: parent of all the namespace's partitioned
/// topics, every domain.
pub fn partitioned_topics_of_namespace(tenant: &str, namespace: &str) -> String {
    format!("{PARTITIONED_TOPICS_ROOT}/{tenant}/{namespace}")
}

/// `/admin/partitioned-topics/{tenant}/{namespace}/{domain}/{encoded-topic}`; `local_name` is
/// the decoded local name (it is encoded here).
pub fn partitioned_topic(
    tenant: &str,
    namespace: &str,
    domain: TopicDomain,
    local_name: &str,
) -> String {
    format!(
        "{}/{}",
        partitioned_topics_of(tenant, namespace, domain),
        encode_topic_name(local_name)
    )
}

/// Partitioned-topic key of a typed topic name.
pub fn partitioned_topic_key(topic: &TopicName) -> String {
    partitioned_topic(
        topic.tenant(),
        topic.namespace().namespace(),
        topic.domain(),
        topic.local_name(),
    )
}

/// `/topics/{tenant}/{namespace}/{domain}`: parent of the namespace's broker-owned topics in
/// one domain (children are encoded local names).
pub fn topics_of(tenant: &str, namespace: &str, domain: TopicDomain) -> String {
    format!("{TOPICS_ROOT}/{tenant}/{namespace}/{domain}")
}

/// `/topics/{tenant}/{namespace}`: parent of all the namespace's broker-owned topics.
pub fn topics_of_namespace(tenant: &str, namespace: &str) -> String {
    format!("{TOPICS_ROOT}/{tenant}/{namespace}")
}

/// `/topics/{tenant}/{namespace}/{domain}/{encoded-topic}`; `local_name` is the decoded local
/// name (it is encoded here).
pub fn topic(tenant: &str, namespace: &str, domain: TopicDomain, local_name: &str) -> String {
    format!("{}/{}", topics_of(tenant, namespace, domain), encode_topic_name(local_name))
}

/// Broker-owned topic key of a typed topic name.
pub fn topic_key(topic: &TopicName) -> String {
    self::topic(topic.tenant(), topic.namespace().namespace(), topic.domain(), topic.local_name())
}

/// `/admin/topic-policies/{tenant}/{namespace}/{domain}/{encoded-topic}`: the policies set on
/// one topic (Pulsar keeps them in a system topic; one key per topic does here).
pub fn topic_policies_key(topic: &TopicName) -> String {
    format!(
        "{TOPIC_POLICIES_ROOT}/{}/{}/{}/{}",
        topic.tenant(),
        topic.namespace().namespace(),
        topic.domain(),
        encode_topic_name(topic.local_name())
    )
}

/// Parent of every managed-ledger record.
pub const MANAGED_LEDGERS_ROOT: &str = "/managed-ledgers";
/// Parent of every subscription cursor.
pub const CURSORS_ROOT: &str = "/cursors";
/// Parent of every deduplication snapshot.
pub const DEDUP_ROOT: &str = "/dedup";
/// Topics' compaction records (the compacted ledger in force and its horizon).
pub const COMPACTION_ROOT: &str = "/compaction";
/// Parent of every schema history.
pub const SCHEMAS_ROOT: &str = "/schemas";

/// `{domain}/{tenant}/{namespace}/{encoded-topic}`: where a topic's storage records live
/// below each broker-owned root.
fn storage_path(topic: &TopicName) -> String {
    format!(
        "{}/{}/{}/{}",
        topic.domain().as_str(),
        topic.tenant(),
        topic.namespace().namespace(),
        topic.encoded_local_name()
    )
}

/// The topic's managed-ledger record (its ledger list).
pub fn managed_ledger_key(topic: &TopicName) -> String {
    format!("{MANAGED_LEDGERS_ROOT}/{}", storage_path(topic))
}

/// Parent of the topic's subscription cursors.
pub fn cursors_of(topic: &TopicName) -> String {
    format!("{CURSORS_ROOT}/{}", storage_path(topic))
}

/// One subscription's cursor (the subscription name is encoded like a topic's local name).
pub fn cursor_key(topic: &TopicName, subscription: &str) -> String {
    format!("{}/{}", cursors_of(topic), encode_topic_name(subscription))
}

/// A child of `parent` as `list_children` returned it (already encoded).
pub fn child(parent: &str, encoded_child: &str) -> String {
    format!("{parent}/{encoded_child}")
}

/// The topic's compaction record.
pub fn compaction_key(topic: &TopicName) -> String {
    format!("{COMPACTION_ROOT}/{}", storage_path(topic))
}

/// The topic's deduplication snapshot.
pub fn dedup_key(topic: &TopicName) -> String {
    format!("{DEDUP_ROOT}/{}", storage_path(topic))
}

/// The schema key of a topic: partitions share their partitioned topic's key, and the domain
/// plays no part (Pulsar's schema id is `tenant/namespace/topic`).
pub fn schema_key(topic: &TopicName) -> String {
    let base = topic.partitioned_topic();
    format!(
        "{SCHEMAS_ROOT}/{}/{}/{}",
        base.tenant(),
        base.namespace().namespace(),
        encode_topic_name(base.local_name())
    )
}

/// The broker settings changed at run time (`{name: value}`, Pulsar's dynamic configuration,
/// at Pulsar's key): every broker applies them.
pub const DYNAMIC_CONFIGURATION: &str = "/admin/configuration";
/// Parent of every cluster record.
pub const CLUSTERS_ROOT: &str = "/admin/clusters";
/// Parent of every broker registration (ephemeral keys; children are `host:web-port`).
pub const BROKERS_ROOT: &str = "/brokers";

/// `/admin/clusters/{cluster}`: the cluster record `magnetar metadata init` writes last, so its
/// presence means the cluster's initial keys all exist. `cluster` is a valid entity name.
pub fn cluster(cluster: &str) -> String {
    format!("{CLUSTERS_ROOT}/{cluster}")
}

/// The id of a broker in listings and in its registration key: `{host}:{web_port}`, the form
/// Pulsar's `GET /admin/v2/brokers/{cluster}` answers.
pub fn broker_id(advertised_host: &str, web_port: u16) -> String {
    format!("{advertised_host}:{web_port}")
}

/// `/brokers/{host}:{web_port}`: a running broker's registration. The host is an advertised
/// address already validated by the caller; it never contains `/` (asserted: a `/` would
/// make the key a different path).
pub fn broker(advertised_host: &str, web_port: u16) -> String {
    assert!(
        !advertised_host.is_empty() && !advertised_host.contains('/'),
        "advertised host must be validated before it names a key: {advertised_host:?}"
    );
    format!("{BROKERS_ROOT}/{}", broker_id(advertised_host, web_port))
}

/// Parent of every storage node registration (ephemeral keys; children are node ids).
pub const STORAGE_NODES_ROOT: &str = "/storage-nodes";
/// The operator's rack assignments of storage nodes ([`crate::storage_nodes::StorageNodeRacks`],
/// one JSON document; Pulsar's `/bookies`).
pub const STORAGE_NODE_RACKS: &str = "/storage-node-racks";
/// Parent of every storage node's cookie (persistent keys; children are node ids): BookKeeper's
/// `/ledgers/cookies`, the record that a node id holds data ([`crate::storage_nodes::StorageNodeCookie`]).
pub const STORAGE_NODE_COOKIES_ROOT: &str = "/storage-node-cookies";
/// Parent of the storage nodes the operator is decommissioning (persistent keys; children are
/// node ids, values [`crate::storage_nodes::StorageNodeDecommission`]).
pub const STORAGE_NODE_DECOMMISSION_ROOT: &str = "/storage-node-decommission";
/// Held by the cluster's auto-recovery auditor (ephemeral; the value is its node id).
pub const AUTORECOVERY_AUDITOR: &str = "/autorecovery/auditor";
/// Auto-recovery's under-replicated ledgers, one key each (children are ledger ids, values the
/// JSON list of the node ids whose copies move).
pub const AUTORECOVERY_UNDER_REPLICATED_ROOT: &str = "/autorecovery/under-replicated";
/// The one broker whose own disk holds a cluster's ledgers (`[ledgers] storage = "local"`,
/// persistent): while it exists no other broker may join the cluster, since a topic moved to
/// another broker could not read them.
pub const LOCAL_LEDGERS_OWNER: &str = "/local-ledgers-owner";
/// Parent of every replicated ledger's metadata.
pub const LEDGERS_ROOT: &str = "/ledgers";

/// `/storage-nodes/{id}`: a running storage node's registration (address, free disk, rack).
pub fn storage_node(id: u64) -> String {
    format!("{STORAGE_NODES_ROOT}/{id}")
}

/// `/storage-node-cookies/{id}`: node `id`'s cookie, written at its first registration and
/// kept while it lives on (the registration comes and goes with the process).
pub fn storage_node_cookie(id: u64) -> String {
    format!("{STORAGE_NODE_COOKIES_ROOT}/{id}")
}

/// `/storage-node-decommission/{id}`: present while node `id` is being drained: it takes no
/// new copies and no adds, and auto-recovery moves every copy it holds to other nodes.
pub fn storage_node_decommission(id: u64) -> String {
    format!("{STORAGE_NODE_DECOMMISSION_ROOT}/{id}")
}

/// `/ledgers/{id}`: a replicated ledger's metadata (ensembles, quorums, state), changed only
/// by compare-and-set.
pub fn ledger(id: u64) -> String {
    format!("{LEDGERS_ROOT}/{id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        assert_eq!(tenant("public"), "/admin/tenants/public");
        assert_eq!(namespace("public", "default"), "/admin/namespaces/public/default");
        assert_eq!(namespaces_of("public"), "/admin/namespaces/public");
        assert_eq!(
            partitioned_topic("public", "default", TopicDomain::Persistent, "my topic/x"),
            "/admin/partitioned-topics/public/default/persistent/my+topic%2Fx"
        );
        assert_eq!(
            topic("t", "n", TopicDomain::NonPersistent, "a-partition-0"),
            "/topics/t/n/non-persistent/a-partition-0"
        );
        let t = TopicName::parse("persistent://t/n/x y").unwrap();
        assert_eq!(topic_key(&t), "/topics/t/n/persistent/x+y");
        assert_eq!(partitioned_topic_key(&t), "/admin/partitioned-topics/t/n/persistent/x+y");
        assert_eq!(namespace_key(t.namespace()), "/admin/namespaces/t/n");
        assert_eq!(topic_policies_key(&t), "/admin/topic-policies/t/n/persistent/x+y");
        assert_eq!(managed_ledger_key(&t), "/managed-ledgers/persistent/t/n/x+y");
        assert_eq!(cursor_key(&t, "s/1"), "/cursors/persistent/t/n/x+y/s%2F1");
        assert_eq!(dedup_key(&t), "/dedup/persistent/t/n/x+y");
        assert_eq!(schema_key(&t), "/schemas/t/n/x+y");
        assert_eq!(cluster("c-1"), "/admin/clusters/c-1");
        assert_eq!(broker_id("10.0.0.1", 8080), "10.0.0.1:8080");
        assert_eq!(broker("host.example", 8080), "/brokers/host.example:8080");
        assert_eq!(child(BROKERS_ROOT, &broker_id("h", 1)), broker("h", 1));
    }

    #[test]
    #[should_panic(expected = "advertised host")]
    fn a_broker_key_never_takes_a_slash() {
        broker("a/b", 1);
    }

    #[test]
    fn keys_are_valid_metadata_keys() {
        let long = "é".repeat(crate::names::MAX_ENCODED_TOPIC_LEN / 6);
        let ns_name = "n".repeat(crate::names::MAX_NAME_LEN);
        let ns = NamespaceName::new(&ns_name, &ns_name).unwrap();
        let t = TopicName::new(TopicDomain::NonPersistent, ns, &long).unwrap();
        for key in
            [topic_key(&t), partitioned_topic_key(&t), topic_key(&t.partition(i32::MAX as u32))]
        {
            magnetar_metadata::validate_key(&key).unwrap();
        }
        for key in [cluster("standalone"), broker("127.0.0.1", 8080), broker("[::1]", 80)] {
            magnetar_metadata::validate_key(&key).unwrap();
        }
    }
}
