//! The shell of namespace isolation ([`crate::isolation`]): the cluster's policies, read at
//! start and kept current by a watch, and the brokers each bundle may go to, which assignment,
//! hand-over, reassignment and the shedder all ask. The leader also moves a bundle whose owner
//! a policy no longer allows (a policy set after the bundle was placed) to a broker it allows;
//! while no allowed broker is live the bundle stays where it is, served.

use std::collections::HashMap;

use super::{parse_ownership_key, ClusterOwnership, CoordinationError, State};
use crate::isolation::{IsolationPolicies, StoredPolicies};
use crate::shedder::Transfer;

/// Parent of every cluster's document (`magnetar_model::keys::CLUSTERS_ROOT`).
pub(super) const CLUSTERS_ROOT: &str = "/admin/clusters";
/// A cluster's isolation policies are at `{CLUSTERS_ROOT}/{cluster}{ISOLATION_SUFFIX}`, as in
/// Pulsar's configuration store.
pub const ISOLATION_SUFFIX: &str = "/namespaceIsolationPolicies";

/// The live brokers (registered, not found dead) that the policies let own `key`'s bundle,
/// `except` left out: the broker it leaves, which does not count as an available primary
/// either (the only primary shutting down hands its bundles to the secondaries).
pub(super) fn eligible<'a>(state: &'a State, key: &str, except: Option<&str>) -> Vec<&'a String> {
    let live: Vec<&str> = state
        .brokers
        .keys()
        .filter(|id| Some(id.as_str()) != except && !state.liveness.is_dead(id))
        .map(String::as_str)
        .collect();
    let allowed = match parse_ownership_key(key) {
        Some((ns, _)) => state.isolation.candidates(&ns.to_string(), &live),
        None => live,
    };
    state.brokers.keys().filter(|id| allowed.contains(&id.as_str())).collect()
}

impl ClusterOwnership {
    /// Reads the policies again (the watch saw a change, or lagged).
    pub(super) async fn reload_isolation(&self) -> Result<(), CoordinationError> {
        let mut stored = StoredPolicies::new();
        for key in self.store.list(&format!("{CLUSTERS_ROOT}/")).await? {
            if !key.ends_with(ISOLATION_SUFFIX) {
                continue;
            }
            let Some(found) = self.store.get(&key).await? else { continue };
            match serde_json::from_slice::<StoredPolicies>(&found.value) {
                Ok(policies) => stored.extend(policies),
                Err(error) => tracing::warn!(key, %error, "isolation policies not understood"),
            }
        }
        let (policies, rejected) = IsolationPolicies::new(&stored);
        for (name, reason) in rejected {
            tracing::warn!(policy = %name, %reason, "isolation policy left out");
        }
        self.state.lock().isolation = policies;
        Ok(())
    }

    /// Whether the policies let `to` own `bundle` now (the shedder's transfers are checked).
    pub(super) fn may_own(&self, bundle: &str, to: &str) -> bool {
        let state = self.state.lock();
        state.isolation.is_empty() || eligible(&state, bundle, None).iter().any(|id| *id == to)
    }

    /// Moves every bundle whose live owner the policies do not allow to the least-loaded broker
    /// they allow, by hand-over. Returns how many were asked for.
    pub(super) async fn move_misplaced(&self) -> Result<usize, CoordinationError> {
        let misplaced: Vec<(String, String)> = {
            let state = self.state.lock();
            if state.isolation.is_empty() {
                return Ok(0);
            }
            state
                .owners
                .iter()
                .filter(|(_, owner)| {
                    state.brokers.contains_key(*owner) && !state.liveness.is_dead(owner)
                })
                .filter(|(key, owner)| !eligible(&state, key, None).contains(owner))
                .map(|(key, owner)| (key.clone(), owner.clone()))
                .collect()
        };
        let mut planned = HashMap::new();
        let mut moved = 0;
        for (bundle, from) in misplaced {
            let Some(to) = self.pick_destination(&bundle, &from, &planned, None) else { continue };
            let transfer = Transfer { bundle, from, to: to.id.clone() };
            if self.transfer(&transfer, &to).await? {
                *planned.entry(to.id.clone()).or_default() += 1;
                moved += 1;
                tracing::info!(bundle = %transfer.bundle, from = %transfer.from, to = %to.id,
                    "isolation: bundle moved to a broker its policy allows");
            }
        }
        Ok(moved)
    }
}
