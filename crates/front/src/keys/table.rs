//! [`Keyed`]: the one owner of what the front knows about the leases it shares by key, and
//! every rule about them, with no I/O. It takes events (a connection joins or leaves a key,
//! begins leasing, gets its lease or fails to, a grace ends, a renewal succeeds or finds the
//! lease gone, a release over HTTP), each with the current instant where time matters, and
//! returns the [`Action`]s the caller (`keys/shared.rs`) must carry out: arm a grace timer,
//! start or stop the key's one renewal task, release a lease through the pool, wake the
//! connections waiting for a key's lease. [`Keyed::check_invariants`] states its promises
//! as code; the tests call it after every event (`keys/interleavings.rs`).
//!
//! What the front keeps about leases, and who changes it:
//! - **A key's slot** (`<template>.<key>` → [`Slot`]): made by the first connection that
//!   joins, removed when its lease is released (a grace after its last member left, or over
//!   HTTP) or when its last member leaves while it holds no lease. Changed only here.
//! - **Its members**: the connections joined to it, by id. A session joins before it leases
//!   and leaves when its `Member` is dropped (`keys/shared.rs`), on every path out of it.
//! - **Its lease** ([`Share`]): none; being made by one member (the others wait, so a key has
//!   one lease at a time); or held. Set by [`Keyed::leased`]; cleared by a release, by a
//!   failed lease, by the maker leaving, or by [`Keyed::lease_lost`] when the pool says the
//!   lease is gone (released by its id over HTTP, expired).
//! - **Its grace**: while it holds a lease and has no member, when it is released unless
//!   somebody joins. A timer armed then calls [`Keyed::grace_expired`]; a timer whose grace
//!   was cancelled (a join) or replaced (another leave) finds nothing to do.
//! - **Its renewal**: one task per held lease, however many connections use it, started and
//!   stopped by the actions here and owned by `keys/shared.rs` (its abort handle, by slot).
//! - Outside this table: a lease a connection took alone is the session's, held by its guard
//!   (`release.rs`) and renewed by its own relay (`session.rs`); the connections' rows for
//!   `/status` are `held.rs`'s; the cancel keys `cancel.rs`'s.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, SystemTime};

use pglease_pool::{Lease, LeaseId};
use tokio::time::Instant;

use super::{KeyName, KeyReport};

/// A connection's membership of a key, as [`Keyed::join`] hands it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Joined {
    /// The connection's id, unique for the table's life.
    pub(crate) member: u64,
    /// The slot it joined: a key released and taken again is another slot.
    pub(crate) slot: u64,
}

/// The leases shared by key.
#[derive(Debug)]
pub(crate) struct Keyed {
    /// How long a key's lease outlives its last member.
    grace: Duration,
    slots: HashMap<KeyName, Slot>,
    /// The next member's or slot's id.
    next_id: u64,
}

/// One key in use.
#[derive(Debug)]
struct Slot {
    id: u64,
    /// The connections joined to it.
    members: BTreeSet<u64>,
    share: Share,
    /// Set while it holds a lease and has no member: when the lease is released.
    release_at: Option<Instant>,
}

/// A key's lease.
#[derive(Debug)]
enum Share {
    /// None: the next member to lease makes it.
    None,
    /// One member is leasing; the others wait for it.
    Making(u64),
    /// Held, and renewed by the key's renewal task (boxed: a lease is large, the other
    /// states are not).
    Held(Box<Lease>),
}

/// What a member does to get its key's lease ([`Keyed::begin`]).
#[derive(Debug)]
pub(crate) enum Begin {
    /// Use this lease (after checking with the pool that it is still there).
    Use(Box<Lease>),
    /// Lease one: the key has none, and this member makes it.
    Make,
    /// Another member is making it: wait for a [`Action::Wake`] and begin again.
    Wait,
    /// The slot this member joined was released over HTTP: its connections end with it.
    Released,
}

/// What [`Keyed::leased`] made of a lease a member got.
#[derive(Debug)]
pub(crate) enum Granted {
    /// The key holds it now.
    Held(Vec<Action>),
    /// Nobody can use it (the member's slot is gone): it is released at once.
    Orphan(Vec<Action>),
}

/// What [`Keyed::release_now`] found.
#[derive(Debug)]
pub(crate) enum ReleaseNow {
    /// The key's lease, taken out of the table, to release with the actions.
    Released(LeaseId, Vec<Action>),
    /// A member is making the key's lease: wait for a [`Action::Wake`] and try again.
    Making,
    /// No lease is held under this key.
    NotFound,
}

/// Why a lease is released, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Why {
    /// Its grace ended with no member.
    Grace,
    /// `DELETE /front/keys/{name}`.
    Http,
    /// It was granted to a member of a slot released meanwhile.
    Orphan,
}

impl Why {
    /// Its words in the log line.
    pub(crate) fn words(self) -> &'static str {
        match self {
            Why::Grace => "after its last connection closed",
            Why::Http => "over HTTP",
            Why::Orphan => "as its key was released while it was being made",
        }
    }
}

/// A side effect the caller carries out.
#[derive(Debug)]
pub(crate) enum Action {
    /// At `at`, call [`Keyed::grace_expired`] for this slot.
    ArmGrace {
        name: KeyName,
        slot: u64,
        at: Instant,
    },
    /// Start the slot's renewal task for `lease` (it has none).
    StartRenew {
        name: KeyName,
        slot: u64,
        lease: Lease,
    },
    /// Stop the slot's renewal task.
    StopRenew { slot: u64 },
    /// Release `lease` through the pool, as an HTTP release without `reuse`.
    Release {
        name: KeyName,
        lease: Lease,
        why: Why,
    },
    /// The members waiting for a key's lease may begin again.
    Wake,
}

impl Keyed {
    /// An empty table whose leases outlive their last member by `grace`.
    pub(crate) fn new(grace: Duration) -> Self {
        Keyed {
            grace,
            slots: HashMap::new(),
            next_id: 0,
        }
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// A connection joins `name` (making its slot if the key is not in use); a grace that
    /// was running is cancelled.
    pub(crate) fn join(&mut self, name: &KeyName) -> Joined {
        let member = self.id();
        // An id for the slot if the key is not in use; ids only need to be unique.
        let fresh = self.id();
        let slot = self.slots.entry(name.clone()).or_insert_with(|| Slot {
            id: fresh,
            members: BTreeSet::new(),
            share: Share::None,
            release_at: None,
        });
        slot.members.insert(member);
        slot.release_at = None;
        Joined {
            member,
            slot: slot.id,
        }
    }

    /// The slot `joined` refers to, if it is still the key's.
    fn slot_mut(&mut self, name: &KeyName, slot: u64) -> Option<&mut Slot> {
        self.slots.get_mut(name).filter(|s| s.id == slot)
    }

    /// What a member does to get the key's lease.
    pub(crate) fn begin(&mut self, name: &KeyName, joined: Joined) -> Begin {
        let Some(slot) = self.slot_mut(name, joined.slot) else {
            return Begin::Released;
        };
        match &slot.share {
            Share::Held(lease) => Begin::Use(lease.clone()),
            Share::Making(by) if *by != joined.member => Begin::Wait,
            Share::Making(_) | Share::None => {
                slot.share = Share::Making(joined.member);
                Begin::Make
            }
        }
    }

    /// The member that makes the key's lease got `lease`.
    pub(crate) fn leased(&mut self, name: &KeyName, joined: Joined, lease: Lease) -> Granted {
        match self.slot_mut(name, joined.slot) {
            Some(slot) if matches!(slot.share, Share::Making(by) if by == joined.member) => {
                slot.share = Share::Held(Box::new(lease.clone()));
                Granted::Held(vec![
                    Action::StartRenew {
                        name: name.clone(),
                        slot: joined.slot,
                        lease,
                    },
                    Action::Wake,
                ])
            }
            // Not reached while the maker is a member (a slot is released over HTTP only
            // once its lease is made), but a lease nobody holds must not stay leased.
            _ => Granted::Orphan(vec![Action::Release {
                name: name.clone(),
                lease,
                why: Why::Orphan,
            }]),
        }
    }

    /// The member that makes the key's lease failed: the next member to begin makes it.
    pub(crate) fn lease_failed(&mut self, name: &KeyName, joined: Joined) -> Vec<Action> {
        match self.slot_mut(name, joined.slot) {
            Some(slot) if matches!(slot.share, Share::Making(by) if by == joined.member) => {
                slot.share = Share::None;
                vec![Action::Wake]
            }
            _ => Vec::new(),
        }
    }

    /// The key's lease was renewed until `expires_at`.
    pub(crate) fn renewed(&mut self, name: &KeyName, slot: u64, id: &LeaseId, until: SystemTime) {
        if let Some(Slot {
            share: Share::Held(lease),
            ..
        }) = self.slot_mut(name, slot)
        {
            if &lease.id == id {
                lease.expires_at = until;
            }
        }
    }

    /// The pool says the key's lease `id` is gone (released by its id, expired): nothing
    /// to release, its renewal stops, and the key's next member leases anew.
    pub(crate) fn lease_lost(&mut self, name: &KeyName, slot: u64, id: &LeaseId) -> Vec<Action> {
        let Some(entry) = self.slot_mut(name, slot) else {
            return Vec::new();
        };
        if !matches!(&entry.share, Share::Held(lease) if &lease.id == id) {
            return Vec::new();
        }
        entry.share = Share::None;
        entry.release_at = None;
        if entry.members.is_empty() {
            self.slots.remove(name);
        }
        vec![Action::StopRenew { slot }]
    }

    /// A member leaves (its connection ended, however). The last member to leave a slot
    /// that holds a lease starts its grace; one that holds none is forgotten.
    pub(crate) fn leave(&mut self, name: &KeyName, joined: Joined, now: Instant) -> Vec<Action> {
        let grace = self.grace;
        let Some(slot) = self.slot_mut(name, joined.slot) else {
            return Vec::new(); // released over HTTP meanwhile
        };
        let mut actions = Vec::new();
        slot.members.remove(&joined.member);
        if matches!(slot.share, Share::Making(by) if by == joined.member) {
            // It left before its lease came: another member makes it.
            slot.share = Share::None;
            actions.push(Action::Wake);
        }
        if !slot.members.is_empty() {
            return actions;
        }
        match slot.share {
            Share::Held(_) => {
                let at = now + grace;
                slot.release_at = Some(at);
                actions.push(Action::ArmGrace {
                    name: name.clone(),
                    slot: joined.slot,
                    at,
                });
            }
            Share::None | Share::Making(_) => {
                self.slots.remove(name);
            }
        }
        actions
    }

    /// A grace timer of `slot` went off at `now`: its lease is released if the slot has no
    /// member and its grace (the latest one) has ended.
    pub(crate) fn grace_expired(&mut self, name: &KeyName, slot: u64, now: Instant) -> Vec<Action> {
        let due = self
            .slot_mut(name, slot)
            .is_some_and(|s| s.members.is_empty() && s.release_at.is_some_and(|at| at <= now));
        if !due {
            return Vec::new();
        }
        match self.slots.remove(name).map(|s| s.share) {
            Some(Share::Held(lease)) => vec![
                Action::StopRenew { slot },
                Action::Release {
                    name: name.clone(),
                    lease: *lease,
                    why: Why::Grace,
                },
            ],
            _ => Vec::new(),
        }
    }

    /// `DELETE /front/keys/{name}`: the key's lease is taken out now, with its slot; its
    /// members' connections end with the lease, and the key's next connection gets a new
    /// slot.
    pub(crate) fn release_now(&mut self, name: &KeyName) -> ReleaseNow {
        let Some(slot) = self.slots.get(name) else {
            return ReleaseNow::NotFound;
        };
        match slot.share {
            Share::Making(_) => return ReleaseNow::Making,
            Share::None => return ReleaseNow::NotFound,
            Share::Held(_) => {}
        }
        let Some(Slot {
            id,
            share: Share::Held(lease),
            ..
        }) = self.slots.remove(name)
        else {
            return ReleaseNow::NotFound;
        };
        let lease_id = lease.id.clone();
        let actions = vec![
            Action::StopRenew { slot: id },
            Action::Release {
                name: name.clone(),
                lease: *lease,
                why: Why::Http,
            },
            // Members of the slot waiting for its lease learn that it is gone.
            Action::Wake,
        ];
        ReleaseNow::Released(lease_id, actions)
    }

    /// Every key in use, by name; `now` and `wall` are the same instant on both clocks.
    pub(crate) fn report(&self, now: Instant, wall: SystemTime) -> Vec<KeyReport> {
        let mut keys: Vec<KeyReport> = self
            .slots
            .iter()
            .map(|(name, slot)| {
                let lease = match &slot.share {
                    Share::Held(lease) => Some(&**lease),
                    Share::None | Share::Making(_) => None,
                };
                KeyReport {
                    name: name.to_string(),
                    lease_id: lease.map(|l| l.id.clone()),
                    database: lease.map(|l| l.connect.database.clone()),
                    connections: slot.members.len(),
                    release_at: slot
                        .release_at
                        .map(|at| wall + at.saturating_duration_since(now)),
                }
            })
            .collect();
        keys.sort_by(|a, b| a.name.cmp(&b.name));
        keys
    }

    /// The slots that hold a lease, by id: those that must have a renewal task.
    #[cfg(test)]
    pub(crate) fn held_slots(&self) -> BTreeSet<u64> {
        self.slots
            .values()
            .filter(|s| matches!(s.share, Share::Held(_)))
            .map(|s| s.id)
            .collect()
    }

    /// The slot `name` is now, and its members.
    #[cfg(test)]
    pub(crate) fn members(&self, name: &KeyName) -> Option<(u64, BTreeSet<u64>)> {
        self.slots.get(name).map(|s| (s.id, s.members.clone()))
    }

    /// Checks every promise the table keeps; the first broken one is described.
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        let mut slot_ids = BTreeSet::new();
        let mut members = BTreeSet::new();
        let mut leases = BTreeSet::new();
        for (name, slot) in &self.slots {
            if slot.id > self.next_id || !slot_ids.insert(slot.id) {
                return Err(format!(
                    "{name}: slot id {} reused or never issued",
                    slot.id
                ));
            }
            for member in &slot.members {
                if *member > self.next_id || !members.insert(*member) {
                    return Err(format!(
                        "{name}: member {member} in two slots or never issued"
                    ));
                }
            }
            match &slot.share {
                Share::Making(by) if !slot.members.contains(by) => {
                    return Err(format!("{name}: its lease is made by {by}, not a member"));
                }
                Share::Held(lease) => {
                    if lease.template != name.template {
                        return Err(format!("{name} holds a lease of {}", lease.template));
                    }
                    if !leases.insert(lease.id.clone()) {
                        return Err(format!("{name}: lease {} held by two keys", lease.id));
                    }
                }
                Share::Making(_) | Share::None => {}
            }
            let idle = slot.members.is_empty();
            let held = matches!(slot.share, Share::Held(_));
            if idle && !held {
                return Err(format!("{name}: no member and no lease, yet kept"));
            }
            if slot.release_at.is_some() != (idle && held) {
                return Err(format!(
                    "{name}: a grace {:?} with {} members and {:?}",
                    slot.release_at,
                    slot.members.len(),
                    slot.share
                ));
            }
        }
        Ok(())
    }
}
