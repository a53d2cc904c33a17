//! The in-memory key space shared by every back end: map, version checks, listing, watchers.
//!
//! `KvState` is the single place that decides compare-and-set outcomes, so both
//! `MemoryStore` and `EmbeddedStore` have identical semantics. Invariants:
//! * every stored version is >= 1; the first put of an absent key yields version 1 and each
//!   later put yields the previous version + 1; a delete forgets the key, so re-creating it
//!   starts again at 1 (ZooKeeper / etcd per-key version semantics);
//! * `live_bytes` is the sum over entries of `key.len() + value.len() + ENTRY_OVERHEAD`;
//! * `ephemeral` maps each ephemeral key to the session that owns it; its keys are a subset
//!   of `map`'s (a plain put or a delete removes the binding);
//! * watchers are notified in the same order as mutations are applied, while the owner holds
//!   the lock around this struct.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use crate::error::{MetadataError, Result};
use crate::watch::{EventKind, WatchStream, Watchers};
use crate::{ExpectedVersion, Versioned};

/// Per-entry bookkeeping overhead counted into `live_bytes` (roughly its snapshot encoding).
pub(crate) const ENTRY_OVERHEAD: u64 = 16;

/// Map plus watchers.
#[derive(Debug)]
pub(crate) struct KvState {
    map: BTreeMap<String, Versioned>,
    live_bytes: u64,
    /// Ephemeral key -> owning session id.
    ephemeral: BTreeMap<String, u64>,
    pub(crate) watchers: Watchers,
}

/// Decides the outcome of a conditional put given the current version (`None` = absent).
/// Returns the version the key will have after the put.
pub(crate) fn check_put(key: &str, current: Option<u64>, expected: ExpectedVersion) -> Result<u64> {
    if !expected.matches(current) {
        return Err(MetadataError::BadVersion { key: key.to_string(), expected, actual: current });
    }
    Ok(current.map_or(1, |v| v + 1))
}

/// Decides the outcome of a conditional delete given the current version. `NotFound` takes
/// precedence over any version mismatch: deleting an absent key is always `NotFound`.
pub(crate) fn check_delete(
    key: &str,
    current: Option<u64>,
    expected: ExpectedVersion,
) -> Result<u64> {
    let Some(version) = current else {
        return Err(MetadataError::NotFound { key: key.to_string() });
    };
    if !expected.matches(current) {
        return Err(MetadataError::BadVersion { key: key.to_string(), expected, actual: current });
    }
    Ok(version)
}

fn entry_bytes(key: &str, value: &Versioned) -> u64 {
    key.len() as u64 + value.value.len() as u64 + ENTRY_OVERHEAD
}

impl KvState {
    pub(crate) fn new(watch_capacity: usize) -> Self {
        KvState {
            map: BTreeMap::new(),
            live_bytes: 0,
            ephemeral: BTreeMap::new(),
            watchers: Watchers::new(watch_capacity),
        }
    }

    /// Builds a state from recovered entries (no watchers are notified).
    pub(crate) fn from_map(map: BTreeMap<String, Versioned>, watch_capacity: usize) -> Self {
        let live_bytes = map.iter().map(|(k, v)| entry_bytes(k, v)).sum();
        KvState {
            map,
            live_bytes,
            ephemeral: BTreeMap::new(),
            watchers: Watchers::new(watch_capacity),
        }
    }

    pub(crate) fn get(&self, key: &str) -> Option<Versioned> {
        self.map.get(key).cloned()
    }

    pub(crate) fn version(&self, key: &str) -> Option<u64> {
        self.map.get(key).map(|v| v.version)
    }

    pub(crate) fn live_bytes(&self) -> u64 {
        self.live_bytes
    }

    /// The persistent entries (ephemeral keys excluded), in key order.
    pub(crate) fn persistent_entries(&self) -> impl Iterator<Item = (&String, &Versioned)> {
        self.map.iter().filter(|(k, _)| !self.ephemeral.contains_key(k.as_str()))
    }

    /// The session owning `key`, if it is ephemeral.
    pub(crate) fn ephemeral_owner(&self, key: &str) -> Option<u64> {
        self.ephemeral.get(key).copied()
    }

    /// Stores `value` at `version` (already decided by `check_put`), bound to session
    /// `owner` if `Some` (persistent otherwise), and notifies watchers.
    pub(crate) fn apply_put(
        &mut self,
        key: String,
        value: bytes::Bytes,
        version: u64,
        owner: Option<u64>,
    ) {
        match owner {
            Some(session) => {
                self.ephemeral.insert(key.clone(), session);
            }
            None => {
                self.ephemeral.remove(&key);
            }
        }
        let new = Versioned { value, version };
        self.live_bytes += entry_bytes(&key, &new);
        if let Some(old) = self.map.get(&key) {
            self.live_bytes -= entry_bytes(&key, old);
        }
        self.watchers.dispatch(&key, EventKind::Put { version });
        self.map.insert(key, new);
    }

    /// Removes `key` and notifies watchers (no-op for an absent key).
    pub(crate) fn apply_delete(&mut self, key: &str) {
        if let Some(old) = self.map.remove(key) {
            self.ephemeral.remove(key);
            self.live_bytes -= entry_bytes(key, &old);
            self.watchers.dispatch(key, EventKind::Delete);
        }
    }

    /// Checks and applies a put in one step (used by `MemoryStore`); `owner` as in
    /// `apply_put`.
    pub(crate) fn put(
        &mut self,
        key: &str,
        value: bytes::Bytes,
        expected: ExpectedVersion,
        owner: Option<u64>,
    ) -> Result<u64> {
        let version = check_put(key, self.version(key), expected)?;
        self.apply_put(key.to_string(), value, version, owner);
        Ok(version)
    }

    /// Deletes every key bound to `session`, in key order, notifying watchers. Returns how
    /// many keys went.
    pub(crate) fn expire_session(&mut self, session: u64) -> usize {
        let doomed: Vec<String> = self
            .ephemeral
            .iter()
            .filter(|(_, owner)| **owner == session)
            .map(|(k, _)| k.clone())
            .collect();
        for key in &doomed {
            self.apply_delete(key);
        }
        debug_assert!(self.ephemeral.values().all(|owner| *owner != session));
        doomed.len()
    }

    /// Checks and applies a delete in one step (used by `MemoryStore`).
    pub(crate) fn delete(&mut self, key: &str, expected: ExpectedVersion) -> Result<()> {
        check_delete(key, self.version(key), expected)?;
        self.apply_delete(key);
        Ok(())
    }

    /// All keys starting with `prefix`, sorted.
    pub(crate) fn list(&self, prefix: &str) -> Vec<String> {
        self.map
            .range::<str, _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Names of the immediate children of `path`, sorted and de-duplicated. A child exists if
    /// any key lies under it, even when the child itself holds no value.
    pub(crate) fn list_children(&self, path: &str) -> Vec<String> {
        let base = if path == "/" { "/".to_string() } else { format!("{path}/") };
        let mut children = BTreeSet::new();
        let mut from = base.clone();
        loop {
            let next = self
                .map
                .range::<str, _>((Bound::Included(from.as_str()), Bound::Unbounded))
                .next()
                .map(|(k, _)| k.as_str())
                .filter(|k| k.starts_with(base.as_str()));
            let Some(key) = next else { break };
            let rest = &key[base.len()..];
            match rest.find('/') {
                Some(slash) => {
                    let child = &rest[..slash];
                    children.insert(child.to_string());
                    // Skip the whole "<base><child>/" subtree: '0' sorts right after '/'.
                    from = format!("{base}{child}0");
                }
                None => {
                    children.insert(rest.to_string());
                    from = format!("{key}\u{0}");
                }
            }
        }
        children.into_iter().collect()
    }

    pub(crate) fn watch(&mut self, prefix: &str, owner: u64) -> WatchStream {
        self.watchers.register(prefix, owner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn children_skip_subtrees_and_interleaved_names() {
        let mut s = KvState::new(4);
        for k in ["/a/b", "/a/b!x", "/a/b/c", "/a/b/c/d", "/a/c", "/ab", "/a/b0/z"] {
            s.put(k, Bytes::from_static(b"v"), ExpectedVersion::Any, None).unwrap();
        }
        assert_eq!(s.list_children("/a"), vec!["b", "b!x", "b0", "c"]);
        assert_eq!(s.list_children("/"), vec!["a", "ab"]);
        assert_eq!(s.list_children("/a/b"), vec!["c"]);
        assert!(s.list_children("/zz").is_empty());
    }

    #[test]
    fn live_bytes_tracks_entries() {
        let mut s = KvState::new(4);
        s.put("/k", Bytes::from_static(b"abc"), ExpectedVersion::Any, None).unwrap();
        assert_eq!(s.live_bytes(), 2 + 3 + ENTRY_OVERHEAD);
        s.put("/k", Bytes::from_static(b"a"), ExpectedVersion::Any, None).unwrap();
        assert_eq!(s.live_bytes(), 2 + 1 + ENTRY_OVERHEAD);
        s.delete("/k", ExpectedVersion::Any).unwrap();
        assert_eq!(s.live_bytes(), 0);
    }

    #[test]
    fn expiring_a_session_deletes_only_its_keys() {
        let mut s = KvState::new(16);
        let v = || Bytes::from_static(b"v");
        s.put("/p", v(), ExpectedVersion::Any, None).unwrap();
        s.put("/e1", v(), ExpectedVersion::Any, Some(1)).unwrap();
        s.put("/e2", v(), ExpectedVersion::Any, Some(2)).unwrap();
        s.put("/back", v(), ExpectedVersion::Any, Some(1)).unwrap();
        s.put("/back", v(), ExpectedVersion::Any, None).unwrap(); // persistent again
        assert_eq!(s.ephemeral_owner("/e1"), Some(1));
        assert_eq!(s.ephemeral_owner("/back"), None);
        let persistent: Vec<_> = s.persistent_entries().map(|(k, _)| k.as_str()).collect();
        assert_eq!(persistent, vec!["/back", "/p"]);
        assert_eq!(s.expire_session(1), 1);
        assert_eq!(s.list("/"), vec!["/back", "/e2", "/p"]);
        s.delete("/e2", ExpectedVersion::Any).unwrap();
        assert_eq!(s.expire_session(2), 0);
    }
}
