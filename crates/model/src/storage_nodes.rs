//! The documents that describe a cluster's storage nodes: each node's registration (written by
//! the node itself, ephemeral), its cookie (persistent) and the racks the operator assigned (`pulsar-admin bookies
//! set-bookie-rack`, one document for the cluster, as Pulsar's `/bookies`).

use std::collections::{BTreeMap, BTreeSet};

/// What a storage node writes at `/storage-nodes/{id}` (ephemeral, JSON).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StorageNodeRegistration {
    /// `host:port` of its storage protocol listener (its "bookie id" in the admin API).
    pub address: String,
    pub free_bytes: u64,
    /// The rack label of the node's own configuration (the operator's assignment wins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rack: Option<String>,
    /// Below its free-disk threshold, or being decommissioned: it refuses normal adds (until
    /// space is freed, or the drain is called off).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
    /// Its listener speaks TLS: clients connect with TLS, or not at all unless
    /// `plain_clients` says otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tls: bool,
    /// With `tls`: plain-text clients are served too, on the same port (a move to TLS in
    /// progress, `[tls] storage_plain_clients`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub plain_clients: bool,
}

/// What a storage node keeps at `/storage-node-cookies/{id}` (persistent, JSON): BookKeeper's
/// cookie. Written when the node id first registers, it says the id holds data, in the data
/// directory that carries the same `instance`; a node whose directory does not match refuses
/// to start (`magnetar_storage_node::cookie`). The admin API lists nodes by their cookies.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StorageNodeCookie {
    /// The node's address at its latest start (`host:port`, its "bookie id").
    pub address: String,
    /// Drawn at random with the data directory: which directory is this id's.
    pub instance: String,
}

/// What the operator writes at `/storage-node-decommission/{id}` (persistent, JSON) to drain a
/// node before removing it: the node turns read-only (placement gives it nothing, writers
/// replace it), and the auditor has every ledger naming it copied elsewhere, reading from the
/// node itself among the others.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StorageNodeDecommission {
    /// The node's address when the drain was asked for (its "bookie id").
    pub address: String,
    /// When the drain was asked for, milliseconds since the Unix epoch.
    pub requested_at_ms: u64,
}

/// One node's assignment: Pulsar's `BookieInfo`.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct RackInfo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rack: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
}

/// The operator's rack assignments, stored at `/storage-node-racks`: group -> node address ->
/// assignment (Pulsar's `BookiesRackConfiguration`). A node is in one group at most.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct StorageNodeRacks {
    pub groups: BTreeMap<String, BTreeMap<String, RackInfo>>,
}

impl StorageNodeRacks {
    /// The assignment of the node at `address`, in whichever group.
    pub fn get(&self, address: &str) -> Option<&RackInfo> {
        self.groups.values().find_map(|nodes| nodes.get(address))
    }

    /// Assigns `info` to `address` in `group`, moving it out of any other group.
    pub fn set(&mut self, address: &str, group: &str, info: RackInfo) {
        self.remove(address);
        self.groups.entry(group.to_string()).or_default().insert(address.to_string(), info);
    }

    /// Drops the assignment of `address` (and a group it leaves empty); false if it had none.
    pub fn remove(&mut self, address: &str) -> bool {
        let mut removed = false;
        self.groups.retain(|_, nodes| {
            removed |= nodes.remove(address).is_some();
            !nodes.is_empty()
        });
        removed
    }

    /// The group the node at `address` is assigned to.
    pub fn group_of(&self, address: &str) -> Option<&str> {
        self.groups.iter().find(|(_, nodes)| nodes.contains_key(address)).map(|(g, _)| g.as_str())
    }

    /// The rack placement compares for the node at `address`: its assignment's, without the
    /// leading and trailing `/` (Pulsar takes `rack1` and `/rack1` for the same rack).
    pub fn rack_of(&self, address: &str) -> Option<&str> {
        let rack = self.get(address)?.rack.as_deref()?;
        Some(rack.trim_matches('/')).filter(|r| !r.is_empty())
    }
}

/// A namespace's bookie affinity (`pulsar-admin namespaces set-bookie-affinity-group`): its
/// new ledgers go to nodes of the primary groups, then of the secondary ones when the primary
/// have too few, then to nodes of no group; never to another group's (Pulsar's
/// `IsolatedBookieEnsemblePlacementPolicy`; placement applies it).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct IsolationGroups {
    pub primary: BTreeSet<String>,
    pub secondary: BTreeSet<String>,
}

impl IsolationGroups {
    /// From Pulsar's comma-separated group lists; `None` when no primary group is named.
    pub fn parse(primary: &str, secondary: Option<&str>) -> Option<IsolationGroups> {
        let split = |list: &str| -> BTreeSet<String> {
            list.split(',').map(str::trim).filter(|g| !g.is_empty()).map(str::to_string).collect()
        };
        let groups =
            IsolationGroups { primary: split(primary), secondary: split(secondary.unwrap_or("")) };
        (!groups.primary.is_empty()).then_some(groups)
    }

    /// `*` among the primary groups: every node may be used.
    pub fn is_unrestricted(&self) -> bool {
        self.primary.contains("*")
    }
}

/// Checks a rack name as Pulsar's rack-aware placement does: one level (`rack1` or
/// `/rack1`, no `/` inside once the outer ones are trimmed), and not empty.
pub fn validate_rack(rack: &str) -> Result<(), String> {
    let inner = rack.trim_matches('/');
    if inner.is_empty() {
        return Err("Bookie 'rack' parameter is missing or empty".to_string());
    }
    if inner.contains('/') {
        return Err(format!(
            "Bookie 'rack' parameter is invalid, When `RackawareEnsemblePlacementPolicy` is \
             enabled, the rack name is not allowed to contain slash (`/`) except for the \
             beginning and end of the rack name string: {rack}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(rack: &str) -> RackInfo {
        RackInfo { rack: Some(rack.to_string()), hostname: None }
    }

    #[test]
    fn a_node_moves_between_groups_and_empty_groups_go() {
        let mut racks = StorageNodeRacks::default();
        racks.set("h:1", "default", info("/r1"));
        racks.set("h:2", "default", info("r2"));
        racks.set("h:1", "other", info("r3"));
        assert_eq!(racks.groups["default"].len(), 1, "{racks:?}");
        assert_eq!(racks.rack_of("h:1"), Some("r3"));
        assert_eq!(racks.rack_of("h:2"), Some("r2"));
        assert!(racks.remove("h:1"));
        assert!(!racks.groups.contains_key("other"), "{racks:?}");
        assert!(!racks.remove("h:1"));
        assert_eq!(racks.rack_of("h:1"), None);
    }

    #[test]
    fn stored_as_pulsar_writes_it() {
        let mut racks = StorageNodeRacks::default();
        racks.set("127.0.0.1:3181", "default", info("/rack1"));
        let text = serde_json::to_string(&racks).expect("serializes");
        assert_eq!(text, r#"{"default":{"127.0.0.1:3181":{"rack":"/rack1"}}}"#);
        let back: StorageNodeRacks = serde_json::from_str(&text).expect("parses");
        assert_eq!(back, racks);
    }

    #[test]
    fn affinity_groups_from_pulsars_lists() {
        let groups = IsolationGroups::parse("g1, g2,", Some("g3")).expect("a primary group");
        assert_eq!(groups.primary.iter().collect::<Vec<_>>(), ["g1", "g2"]);
        assert_eq!(groups.secondary.iter().collect::<Vec<_>>(), ["g3"]);
        assert!(!groups.is_unrestricted());
        assert_eq!(IsolationGroups::parse(" , ", Some("g3")), None);
        assert!(IsolationGroups::parse("*", None).expect("parsed").is_unrestricted());
        let mut racks = StorageNodeRacks::default();
        racks.set("h:1", "g1", info("r1"));
        assert_eq!(racks.group_of("h:1"), Some("g1"));
        assert_eq!(racks.group_of("h:2"), None);
    }

    #[test]
    fn racks_of_one_level_only() {
        assert!(validate_rack("rack1").is_ok());
        assert!(validate_rack("/rack1/").is_ok());
        assert!(validate_rack("/region/rack1").is_err());
        assert!(validate_rack("/").is_err());
        assert!(validate_rack("").is_err());
    }

    #[test]
    fn registrations_read_without_the_optional_fields() {
        let old: StorageNodeRegistration =
            serde_json::from_str(r#"{"address":"h:1","freeBytes":5}"#).expect("parses");
        assert!(!old.read_only && !old.tls && !old.plain_clients && old.rack.is_none());
        let full = StorageNodeRegistration { read_only: true, ..old.clone() };
        let text = serde_json::to_string(&full).expect("serializes");
        assert!(text.contains(r#""readOnly":true"#), "{text}");
        assert!(!serde_json::to_string(&old).expect("serializes").contains("readOnly"));
    }
}
