//! Graceful hand-over of a bundle (PIP-307 over PIP-192's states): an unload moves a bundle to
//! another live broker instead of freeing it, and the clients of its topics are told where to
//! reconnect, so they reach the new owner without a lookup.
//!
//! ```text
//! owner:   Owned{owner} --(begin_hand_over)--> Releasing{src: owner, dst}
//!          close the topics: CLOSE_PRODUCER / CLOSE_CONSUMER name dst
//!          --(released)--> Assigning{dst}
//! dst:     Assigning{dst} --(watch, or the first client)--> Owned{dst}
//! ```
//!
//! Any broker may ask for a hand-over (an admin unload through a broker that does not own the
//! bundle) by writing `Releasing{src: owner, dst}` itself: the owner sees it through its watch and
//! does the rest. Each record is written by compare-and-set on the version read, bound to the
//! writer's session; if the writer's session ends mid-way the record goes and the bundle is free,
//! which is the plain unload (safe: whoever loads the topics next fences their ledgers).
//!
//! A client told to reconnect to `dst` may get there before the owner has closed everything:
//! `dst` holds its request (bounded by [`HAND_OVER_WAIT`]) until the record reaches Assigning and
//! takes the bundle then.

use std::collections::HashMap;
use std::time::Duration;

use magnetar_metadata::{ExpectedVersion, MetadataError};
use magnetar_model::names::TopicName;

use super::{
    owner_counts, ownership_key, parse_ownership_key, BrokerUrls, ClusterOwnership,
    CoordinationError, LostBundle,
};
use crate::ownership::{OwnershipRecord, UnitState};

/// How long a broker a bundle is being handed to holds a client's request for the hand-over to
/// finish before the client is told to retry (it then looks the topic up again).
pub const HAND_OVER_WAIT: Duration = Duration::from_secs(5);

impl ClusterOwnership {
    /// The broker a bundle now with `owner` is handed to: `wanted` (an operator's
    /// `--destinationBroker`) when it is live and not the owner, else, without `wanted`, the
    /// least-loaded live broker other than `owner` (`planned`: bundles already promised to
    /// each in this round); `None` when there is none.
    pub(super) fn pick_destination(
        &self,
        key: &str,
        owner: &str,
        planned: &HashMap<String, usize>,
        wanted: Option<&str>,
    ) -> Option<BrokerUrls> {
        let state = self.state.lock();
        if let Some(wanted) = wanted {
            let live = wanted != owner && !state.liveness.is_dead(wanted);
            return state.brokers.get(wanted).filter(|_| live).cloned();
        }
        let mut load = owner_counts(&state);
        for (id, n) in planned {
            *load.entry(id.clone()).or_default() += n;
        }
        let eligible = super::isolation::eligible(&state, key, Some(owner));
        let to = crate::placement::least_loaded(key, eligible.into_iter(), &load)?;
        state.brokers.get(&to).cloned()
    }

    /// Starts handing over `keys`, which this broker has stopped serving
    /// ([`ClusterOwnership::stop_serving`]): each goes to `wanted`, or without it to the
    /// least-loaded other live broker (`Releasing{src: me, dst}`). Returns where each went; a
    /// bundle missing from the answer (no other broker, or its record changed) is simply freed
    /// by `released`.
    pub async fn begin_hand_over(
        &self,
        keys: &[String],
        wanted: Option<&str>,
    ) -> HashMap<String, BrokerUrls> {
        let mut planned: HashMap<String, usize> = HashMap::new();
        let mut handed = HashMap::new();
        for key in keys {
            let Some(to) = self.pick_destination(key, &self.me.id, &planned, wanted) else {
                continue;
            };
            let started = async {
                let (record, _) = self.read_record(key).await?;
                if !record.serves(&self.me.id) {
                    return Ok(false);
                }
                let next = record.release(&self.me.id, Some(&to.id))?;
                self.write_transition(key, record.version, &next, &to).await
            };
            match started.await {
                Ok(true) => {
                    *planned.entry(to.id.clone()).or_default() += 1;
                    self.state.lock().handing_over.insert(key.clone(), to.clone());
                    tracing::info!(bundle = %key, to = %to.id, "bundle being handed over");
                    handed.insert(key.clone(), to);
                }
                Ok(false) => {}
                Err(error) => {
                    tracing::warn!(bundle = %key, %error, "hand-over not started: the bundle is freed instead")
                }
            }
        }
        handed
    }

    /// Checks that `broker` (an unload's `--destinationBroker`, a broker id `host:web-port`) is
    /// a live broker of the cluster, before anything is unloaded.
    pub fn check_destination(&self, broker: &str) -> Result<(), CoordinationError> {
        let state = self.state.lock();
        match state.brokers.contains_key(broker) && !state.liveness.is_dead(broker) {
            true => Ok(()),
            false => Err(CoordinationError::NotABroker(broker.to_string())),
        }
    }

    /// How many requests wait here for a hand-over to finish now.
    pub fn hand_over_waits(&self) -> usize {
        self.hand_over_waits.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The broker `topic`'s bundle is being handed to by this broker, if it is.
    pub fn handed_over_to(&self, topic: &TopicName) -> Option<BrokerUrls> {
        let range = self.cached_bundle_of(topic)?;
        self.state.lock().handing_over.get(&ownership_key(topic.namespace(), range)).cloned()
    }

    /// Asks the owner of each bundle of `keys` it serves (another broker, alive) to hand it over
    /// to `wanted`, or without it to the least-loaded other broker, by writing
    /// `Releasing{src: owner, dst}`; a record whose owner is dead, or with no other broker to go
    /// to, is deleted (the bundle is free). A bundle `wanted` owns already stays. Returns how
    /// many bundles were asked for.
    pub(super) async fn hand_over_elsewhere(
        &self,
        keys: Vec<String>,
        wanted: Option<&str>,
    ) -> Result<usize, CoordinationError> {
        let mut planned: HashMap<String, usize> = HashMap::new();
        let mut asked = 0;
        for key in keys {
            let (record, _) = self.read_record(&key).await?;
            let Some(owner) = record.dst.clone().filter(|_| record.state == UnitState::Owned)
            else {
                continue;
            };
            if owner == self.me.id || wanted == Some(owner.as_str()) {
                continue;
            }
            let alive = self.state.lock().brokers.contains_key(&owner) && !self.is_dead(&owner);
            let to = alive.then(|| self.pick_destination(&key, &owner, &planned, wanted)).flatten();
            let Some(to) = to else {
                match self.store.delete(&key, ExpectedVersion::Exactly(record.version)).await {
                    Ok(()) => asked += 1,
                    Err(MetadataError::NotFound { .. } | MetadataError::BadVersion { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
                continue;
            };
            let next = record.release(&owner, Some(&to.id))?;
            if self.write_transition(&key, record.version, &next, &to).await? {
                *planned.entry(to.id.clone()).or_default() += 1;
                asked += 1;
                tracing::info!(bundle = %key, %owner, to = %to.id, "hand-over asked of the owner");
            }
        }
        Ok(asked)
    }

    /// Stores `next`, a record in a hand-over (not one this broker serves by), by
    /// compare-and-set on `read_version`, with `to`'s URLs (what lookups answer meanwhile).
    pub(super) async fn write_transition(
        &self,
        key: &str,
        read_version: u64,
        next: &OwnershipRecord,
        to: &BrokerUrls,
    ) -> Result<bool, CoordinationError> {
        Ok(self.put_record(key, read_version, next, to).await?.is_some())
    }

    /// A record of a bundle in hand-over changed. On the owner asked by another broker
    /// (`Releasing{src: me}` while it serves the bundle): stop serving it and tell the broker
    /// to close its topics and then call `released`. On the destination (`Assigning{dst: me}`):
    /// take it. Returns whether the change was a hand-over's.
    pub(super) async fn on_hand_over_record(
        &self,
        key: &str,
        record: &OwnershipRecord,
    ) -> Result<bool, CoordinationError> {
        let me = self.me.id.as_str();
        match (record.state, record.src.as_deref(), record.dst.as_deref()) {
            (UnitState::Releasing, Some(src), dst) if src == me => {
                let to = {
                    let mut state = self.state.lock();
                    if state.owned.remove(key).is_none() {
                        return Ok(true); // this broker's own hand-over, under way already
                    }
                    state.releasing.insert(key.to_string());
                    let to = dst.and_then(|d| state.brokers.get(d).cloned());
                    if let Some(to) = &to {
                        state.handing_over.insert(key.to_string(), to.clone());
                    }
                    to
                };
                tracing::info!(bundle = %key, to = ?to.as_ref().map(|t| &t.id), "hand-over asked by another broker");
                if let Some((namespace, range)) = parse_ownership_key(key) {
                    let release = Some(super::HandOver { key: key.to_string(), to });
                    let _ = self.lost.send(LostBundle { namespace, range, release });
                }
                Ok(true)
            }
            (UnitState::Assigning, _, Some(dst)) if dst == me => {
                if !self.state.lock().owned.contains_key(key) {
                    let next = record.own(me)?;
                    if self.write_record(key, record.version, &next).await? {
                        tracing::info!(bundle = %key, "bundle owned: handed over to this broker");
                    }
                }
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// On a broker a client reached for a bundle it does not own: when the bundle is being
    /// handed to this broker, waits (at most [`HAND_OVER_WAIT`]) for the old owner to finish,
    /// then owns it. Whether this broker owns the bundle now.
    pub(super) async fn await_hand_over(&self, key: &str) -> Result<bool, CoordinationError> {
        let me = self.me.id.as_str();
        let deadline = tokio::time::Instant::now() + HAND_OVER_WAIT;
        let mut waited = false;
        loop {
            if tokio::time::Instant::now() >= deadline {
                return Ok(false);
            }
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.state.lock().owned.contains_key(key) {
                return Ok(true);
            }
            let (record, _) = self.read_record(key).await?;
            match (record.state, record.src.as_deref(), record.dst.as_deref()) {
                (UnitState::Assigning, _, Some(dst)) if dst == me => {
                    let next = record.own(me)?;
                    if self.write_record(key, record.version, &next).await? {
                        return Ok(true);
                    }
                    continue; // changed meanwhile: read it again
                }
                (UnitState::Releasing, Some(src), Some(dst)) if dst == me && !self.is_dead(src) => {
                    waited = true;
                    self.hand_over_waits.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let woken = tokio::time::timeout_at(deadline, changed).await;
                    self.hand_over_waits.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    if woken.is_err() {
                        return Ok(false);
                    }
                }
                // The old owner's session ended before this broker took the bundle: the
                // client was sent here, so take it.
                (UnitState::Init | UnitState::Free, _, _) if waited => {
                    let next = record.assign(me)?.own(me)?;
                    return self.write_record(key, record.version, &next).await;
                }
                _ => return Ok(false),
            }
        }
    }

    /// Waits (at most `limit`) until no bundle this broker handed over is still on its way
    /// (Assigning, not yet Owned by the broker it went to): a broker shutting down calls it
    /// before its session, and the records bound to it, go. Whether all arrived.
    pub async fn hand_overs_settled(&self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        let keys: Vec<String> = self.state.lock().handed_off.drain().collect();
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let mut pending = 0;
            for key in &keys {
                match self.read_record(key).await {
                    Ok((record, _)) if record.state == UnitState::Assigning => pending += 1,
                    _ => {}
                }
            }
            if pending == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                tracing::warn!(pending, "hand-overs not all taken before the session goes");
                return false;
            }
        }
    }
}
