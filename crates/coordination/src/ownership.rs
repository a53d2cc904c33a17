//! A bundle's ownership record and its transitions: PIP-192's `ServiceUnitState` and
//! `ServiceUnitStateData`, with the transitions Pulsar allows when the states live in a metadata
//! store (`validTransitionsOverMetadataStore`):
//!
//! ```text
//! Init -> Assigning          Free -> Assigning          Assigning -> Owned
//! Owned -> Releasing | Splitting                         Releasing -> Assigning | Free
//! Splitting -> Deleted       Deleted -> Init
//! ```
//!
//! An assignment names its broker (`Assigning{dst}` then `Owned{dst}`); a hand-over releases
//! (`Releasing{src, dst}`: the old owner stops serving and closes its ledgers), then assigns to
//! `dst`; an unload releases to Free. The one change outside the table is a **takeover** of a dead
//! broker's bundle (Pulsar's forced override in `handleBrokerDeletionEvent`): from any state
//! naming the dead broker to `Assigning{new}`. It is safe without the dead broker's agreement
//! because the new owner fences the ledgers of every topic it loads (a slow, not dead, previous
//! owner's next append or CAS fails), not because of any lease.
//!
//! Each change returns the next record with `version + 1`; the shell stores it by
//! compare-and-set on the version it read, so of two brokers deciding from one record, one wins.

/// PIP-192's service-unit states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnitState {
    Init,
    Free,
    Owned,
    Assigning,
    Releasing,
    Splitting,
    Deleted,
}

impl UnitState {
    pub const ALL: [UnitState; 7] = [
        UnitState::Init,
        UnitState::Free,
        UnitState::Owned,
        UnitState::Assigning,
        UnitState::Releasing,
        UnitState::Splitting,
        UnitState::Deleted,
    ];

    /// Whether a record may go from `self` to `to` (Pulsar's table over a metadata store).
    pub fn may_become(self, to: UnitState) -> bool {
        use UnitState::*;
        matches!(
            (self, to),
            (Init, Assigning)
                | (Free, Assigning)
                | (Owned, Splitting | Releasing)
                | (Assigning, Owned)
                | (Releasing, Assigning | Free)
                | (Splitting, Deleted)
                | (Deleted, Init)
        )
    }

    /// A change under way (Pulsar's `isInFlightState`).
    pub fn in_flight(self) -> bool {
        matches!(self, UnitState::Assigning | UnitState::Releasing | UnitState::Splitting)
    }

    /// Owned or changing (Pulsar's `isActiveState`).
    pub fn active(self) -> bool {
        self.in_flight() || self == UnitState::Owned
    }
}

/// A bundle's ownership record (PIP-192's `ServiceUnitStateData`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnershipRecord {
    pub state: UnitState,
    /// The broker it is assigned to or owned by.
    pub dst: Option<String>,
    /// The broker releasing it (a hand-over or unload).
    pub src: Option<String>,
    /// Bumped by every change; the compare-and-set key.
    pub version: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    #[error("a bundle cannot go from {from:?} to {to:?}")]
    Invalid { from: UnitState, to: UnitState },
    /// The record names another broker than the one acting.
    #[error("the bundle is {state:?} with {owner:?}, not {broker}")]
    NotYours { state: UnitState, owner: Option<String>, broker: String },
    /// A takeover of a broker the record does not name.
    #[error("the bundle does not belong to {0}")]
    NotTheDeadBroker(String),
}

impl OwnershipRecord {
    /// No record yet (a bundle never assigned).
    pub fn init() -> OwnershipRecord {
        OwnershipRecord { state: UnitState::Init, dst: None, src: None, version: 0 }
    }

    /// Whether `broker` may serve the bundle's topics now: only while it owns it.
    pub fn serves(&self, broker: &str) -> bool {
        self.state == UnitState::Owned && self.dst.as_deref() == Some(broker)
    }

    /// The broker a lookup should go to: the owner, or the one it is being assigned to.
    pub fn lookup_target(&self) -> Option<&str> {
        match self.state {
            UnitState::Owned | UnitState::Assigning => self.dst.as_deref(),
            _ => None,
        }
    }

    fn next(
        &self,
        state: UnitState,
        dst: Option<&str>,
        src: Option<&str>,
    ) -> Result<Self, TransitionError> {
        if !self.state.may_become(state) {
            return Err(TransitionError::Invalid { from: self.state, to: state });
        }
        Ok(OwnershipRecord {
            state,
            dst: dst.map(str::to_string),
            src: src.map(str::to_string),
            version: self.version + 1,
        })
    }

    fn require(&self, broker: &str, named: Option<&String>) -> Result<(), TransitionError> {
        if named.map(String::as_str) == Some(broker) {
            Ok(())
        } else {
            Err(TransitionError::NotYours {
                state: self.state,
                owner: self.dst.clone().or_else(|| self.src.clone()),
                broker: broker.to_string(),
            })
        }
    }

    /// Assigns a free (or never assigned) bundle to `broker`.
    pub fn assign(&self, broker: &str) -> Result<Self, TransitionError> {
        self.next(UnitState::Assigning, Some(broker), None)
    }

    /// The broker assigned takes ownership (once it is ready to serve: its topics load on use).
    pub fn own(&self, broker: &str) -> Result<Self, TransitionError> {
        if self.state == UnitState::Assigning {
            self.require(broker, self.dst.as_ref())?;
        }
        self.next(UnitState::Owned, Some(broker), None)
    }

    /// The owner releases the bundle, to `to` (a transfer) or to nobody (an unload).
    pub fn release(&self, owner: &str, to: Option<&str>) -> Result<Self, TransitionError> {
        if self.state == UnitState::Owned {
            self.require(owner, self.dst.as_ref())?;
        }
        self.next(UnitState::Releasing, to, Some(owner))
    }

    /// The releasing owner has closed its topics: the bundle goes to the transfer's target,
    /// or is free.
    pub fn released(&self, owner: &str) -> Result<Self, TransitionError> {
        if self.state == UnitState::Releasing {
            self.require(owner, self.src.as_ref())?;
        }
        match self.dst.clone() {
            Some(to) if self.state == UnitState::Releasing => {
                self.next(UnitState::Assigning, Some(&to), None)
            }
            _ => self.next(UnitState::Free, None, None),
        }
    }

    /// The owner starts splitting the bundle (its children get records of their own).
    pub fn split(&self, owner: &str) -> Result<Self, TransitionError> {
        if self.state == UnitState::Owned {
            self.require(owner, self.dst.as_ref())?;
        }
        self.next(UnitState::Splitting, Some(owner), None)
    }

    /// The split is done: the parent bundle is gone.
    pub fn split_done(&self) -> Result<Self, TransitionError> {
        self.next(UnitState::Deleted, None, None)
    }

    /// Another broker takes over the bundle of `dead` (known dead: its registration is gone),
    /// whatever the state that names it.
    pub fn take_over(&self, dead: &str, new_owner: &str) -> Result<Self, TransitionError> {
        let names_dead = self.dst.as_deref() == Some(dead) || self.src.as_deref() == Some(dead);
        if !self.state.active() || !names_dead {
            return Err(TransitionError::NotTheDeadBroker(dead.to_string()));
        }
        Ok(OwnershipRecord {
            state: UnitState::Assigning,
            dst: Some(new_owner.to_string()),
            src: None,
            version: self.version + 1,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::UnitState::*;
    use super::*;

    #[test]
    fn the_transition_table_is_pulsars_over_a_metadata_store() {
        let allowed = [
            (Init, Assigning),
            (Free, Assigning),
            (Owned, Splitting),
            (Owned, Releasing),
            (Assigning, Owned),
            (Releasing, Assigning),
            (Releasing, Free),
            (Splitting, Deleted),
            (Deleted, Init),
        ];
        for from in UnitState::ALL {
            for to in UnitState::ALL {
                assert_eq!(
                    from.may_become(to),
                    allowed.contains(&(from, to)),
                    "{from:?} -> {to:?}"
                );
            }
        }
        assert!(Assigning.in_flight() && Releasing.in_flight() && Splitting.in_flight());
        assert!(Owned.active() && !Owned.in_flight() && !Free.active() && !Init.active());
    }

    #[test]
    fn an_assignment_serves_only_once_owned_and_only_there() {
        let assigning = OwnershipRecord::init().assign("b1").unwrap();
        assert_eq!((assigning.state, assigning.version), (Assigning, 1));
        assert!(!assigning.serves("b1"), "not before it owns it");
        assert_eq!(assigning.lookup_target(), Some("b1"));
        assert!(matches!(assigning.own("b2"), Err(TransitionError::NotYours { .. })));
        let owned = assigning.own("b1").unwrap();
        assert!(owned.serves("b1") && !owned.serves("b2"));
        assert_eq!(owned.version, 2);
        assert!(matches!(
            owned.assign("b2"),
            Err(TransitionError::Invalid { from: Owned, to: Assigning })
        ));
    }

    #[test]
    fn a_transfer_releases_then_assigns_the_target_and_an_unload_frees() {
        let owned = OwnershipRecord::init().assign("b1").unwrap().own("b1").unwrap();
        assert!(matches!(owned.release("b2", None), Err(TransitionError::NotYours { .. })));
        let releasing = owned.release("b1", Some("b2")).unwrap();
        assert!(!releasing.serves("b1") && !releasing.serves("b2"), "nobody serves while it moves");
        assert!(matches!(releasing.released("b2"), Err(TransitionError::NotYours { .. })));
        let assigning = releasing.released("b1").unwrap();
        assert_eq!((assigning.state, assigning.dst.as_deref()), (Assigning, Some("b2")));
        let owned = assigning.own("b2").unwrap();
        assert!(owned.serves("b2"));
        let free = owned.release("b2", None).unwrap().released("b2").unwrap();
        assert_eq!((free.state, free.dst.as_deref()), (Free, None));
        assert_eq!(free.version, 7);
        assert_eq!(free.assign("b3").unwrap().state, Assigning);
    }

    #[test]
    fn a_split_ends_the_parent() {
        let owned = OwnershipRecord::init().assign("b1").unwrap().own("b1").unwrap();
        let splitting = owned.split("b1").unwrap();
        assert!(!splitting.serves("b1"));
        let deleted = splitting.split_done().unwrap();
        assert_eq!(deleted.state, Deleted);
        assert!(matches!(deleted.assign("b1"), Err(TransitionError::Invalid { .. })));
    }

    #[test]
    fn a_dead_brokers_bundle_is_taken_over_from_any_active_state_naming_it() {
        let owned = OwnershipRecord::init().assign("b1").unwrap().own("b1").unwrap();
        for record in [
            owned.clone(),
            owned.release("b1", Some("b2")).unwrap(),
            OwnershipRecord::init().assign("b1").unwrap(),
            owned.split("b1").unwrap(),
        ] {
            let taken = record.take_over("b1", "b3").unwrap();
            assert_eq!((taken.state, taken.dst.as_deref()), (Assigning, Some("b3")));
            assert_eq!(taken.version, record.version + 1);
        }
        // Not a broker the record names, nor a bundle nobody holds.
        assert!(owned.take_over("b2", "b3").is_err());
        let free = owned.release("b1", None).unwrap().released("b1").unwrap();
        assert!(free.take_over("b1", "b3").is_err());
    }

    /// Two brokers decide from the same record; the shell's compare-and-set on the version takes
    /// the first write, and the second, still at the old version, is refused and re-read: at
    /// every step at most one broker serves.
    #[test]
    fn racing_decisions_leave_at_most_one_server() {
        let mut stored = OwnershipRecord::init();
        let cas = |stored: &mut OwnershipRecord, read_version: u64, next: OwnershipRecord| {
            if stored.version == read_version {
                *stored = next;
                true
            } else {
                false
            }
        };
        let read = stored.clone();
        assert!(cas(&mut stored, read.version, read.assign("b1").unwrap()));
        assert!(
            !cas(&mut stored, read.version, read.assign("b2").unwrap()),
            "b2 decided on a stale record"
        );
        let read = stored.clone();
        assert!(cas(&mut stored, read.version, read.own("b1").unwrap()));
        // b2 believes b1 dead (a slow b1) and takes over; b1, slow, tries to release to b3 from
        // its old read.
        let b1_read = stored.clone();
        let b2_read = stored.clone();
        assert!(cas(&mut stored, b2_read.version, b2_read.take_over("b1", "b2").unwrap()));
        assert!(!cas(&mut stored, b1_read.version, b1_read.release("b1", Some("b3")).unwrap()));
        let read = stored.clone();
        assert!(cas(&mut stored, read.version, read.own("b2").unwrap()));
        let servers: Vec<&str> =
            ["b1", "b2", "b3"].into_iter().filter(|b| stored.serves(b)).collect();
        assert_eq!(servers, ["b2"]);
    }
}
