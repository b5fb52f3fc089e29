//! The keys' interleaving test: generated sequences of events drive [`Keyed`] the way
//! `keys/shared.rs` and the sessions do — connections join keys, begin leasing, get their
//! lease or fail, leave (however their session ends); grace timers go off as time passes;
//! keys are released over HTTP; the key's renewal finds its lease renewed or gone (released
//! by its id, expired) — while a harness plays the pool and the timers and carries out the
//! actions. After every step the table's invariants and the harness's promises are checked:
//! a key's lease is never released while a connection is joined to it (but over HTTP, which
//! ends them), never released twice nor after the pool ended it, a held lease has exactly
//! one renewal task, and a connection waiting for its key's lease always has a maker to wait
//! for. At the end every connection leaves and the graces pass: then every lease the pool
//! granted has been released exactly once or ended by the pool, and the table is empty.
//!
//! `PGLEASE_KEY_INTERLEAVINGS=N` runs N cases instead of the default.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use pglease_pool::{ConnectInfo, DbName, Lease, LeaseId};
use proptest::prelude::*;
use tokio::time::Instant;

use super::table::{Action, Begin, Granted, Joined, Keyed, ReleaseNow, Why};
use super::KeyName;

/// Cases when `PGLEASE_KEY_INTERLEAVINGS` is not set: about 40,000 steps, a few seconds in a debug build.
const DEFAULT_CASES: u32 = 200;
const KEYS: [&str; 3] = ["app.a", "app.b", "other.c"];
const GRACE: Duration = Duration::from_secs(2);

#[derive(Debug, Clone)]
enum Event {
    Join {
        key: usize,
    },
    Begin {
        conn: usize,
    },
    Granted {
        conn: usize,
    },
    Failed {
        conn: usize,
    },
    Leave {
        conn: usize,
    },
    Advance {
        ms: u64,
    },
    HttpRelease {
        key: usize,
    },
    RenewOk {
        key: usize,
    },
    /// The pool says the key's lease is gone: released by its id, or expired.
    RenewFailed {
        key: usize,
    },
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        4 => (0..KEYS.len()).prop_map(|key| Event::Join { key }),
        4 => any::<usize>().prop_map(|conn| Event::Begin { conn }),
        3 => any::<usize>().prop_map(|conn| Event::Granted { conn }),
        1 => any::<usize>().prop_map(|conn| Event::Failed { conn }),
        3 => any::<usize>().prop_map(|conn| Event::Leave { conn }),
        3 => (0..3_000u64).prop_map(|ms| Event::Advance { ms }),
        1 => (0..KEYS.len()).prop_map(|key| Event::HttpRelease { key }),
        1 => (0..KEYS.len()).prop_map(|key| Event::RenewOk { key }),
        1 => (0..KEYS.len()).prop_map(|key| Event::RenewFailed { key }),
    ]
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Joined; will begin leasing.
    Joined,
    /// Waits for another member to make the key's lease.
    Waiting,
    /// Makes the key's lease.
    Making,
    /// Relays on this lease.
    Using(LeaseId),
}

#[derive(Debug)]
struct Conn {
    name: KeyName,
    joined: Joined,
    state: State,
}

/// The pool, the timers and the sessions around a [`Keyed`].
struct Harness {
    table: Keyed,
    now: Instant,
    conns: Vec<Conn>,
    timers: Vec<(KeyName, u64, Instant)>,
    /// The renewal task of each slot, with the lease it renews.
    renewing: BTreeMap<u64, (KeyName, LeaseId)>,
    /// Every lease the pool granted, with the slot it was granted for.
    granted: BTreeMap<LeaseId, u64>,
    released: BTreeMap<LeaseId, Why>,
    /// Leases the pool ended on its own.
    lost: BTreeSet<LeaseId>,
}

fn key(index: usize) -> KeyName {
    match KeyName::parse(KEYS[index]) {
        Ok((_, Some(key))) => key,
        other => panic!("{} is a key: {other:?}", KEYS[index]),
    }
}

fn lease_of(name: &KeyName, number: u32) -> Lease {
    Lease {
        id: LeaseId::random(0),
        template: name.template.clone(),
        fingerprint: "f00d".repeat(16),
        connect: ConnectInfo {
            host: "127.0.0.1".into(),
            port: 5432,
            user: "pglease_lease".into(),
            password: "s3cret".into(),
            database: DbName::from_server(format!("pglease_{}_{number}", name.template)),
            ssl: false,
        },
        expires_at: SystemTime::now() + Duration::from_secs(60),
        number,
        local_socket: None,
    }
}

impl Harness {
    fn new() -> Self {
        Harness {
            table: Keyed::new(GRACE),
            now: Instant::now(),
            conns: Vec::new(),
            timers: Vec::new(),
            renewing: BTreeMap::new(),
            granted: BTreeMap::new(),
            released: BTreeMap::new(),
            lost: BTreeSet::new(),
        }
    }

    /// The index of the `n`th live connection (modulo) whose state `wanted` accepts.
    fn pick(&self, n: usize, wanted: impl Fn(&State) -> bool) -> Option<usize> {
        let matching: Vec<usize> = (0..self.conns.len())
            .filter(|&i| wanted(&self.conns[i].state))
            .collect();
        (!matching.is_empty()).then(|| matching[n % matching.len()])
    }

    fn carry_out(&mut self, actions: Vec<Action>) -> Result<(), String> {
        for action in actions {
            match action {
                Action::ArmGrace { name, slot, at } => self.timers.push((name, slot, at)),
                Action::StartRenew { name, slot, lease } => {
                    if let Some(old) = self.renewing.insert(slot, (name, lease.id)) {
                        return Err(format!("slot {slot} got a second renewal task ({old:?})"));
                    }
                }
                Action::StopRenew { slot } => {
                    if self.renewing.remove(&slot).is_none() {
                        return Err(format!("slot {slot} stops a renewal task it has not"));
                    }
                }
                Action::Release { name, lease, why } => {
                    let Some(&slot) = self.granted.get(&lease.id) else {
                        return Err(format!("{name} releases {}, never granted", lease.id));
                    };
                    if self.lost.contains(&lease.id) {
                        return Err(format!(
                            "{name} releases {}, which the pool ended",
                            lease.id
                        ));
                    }
                    if let Some(before) = self.released.insert(lease.id.clone(), why) {
                        return Err(format!("{} released twice ({before:?}, {why:?})", lease.id));
                    }
                    let joined = self.conns.iter().filter(|c| c.joined.slot == slot).count();
                    if why != Why::Http && joined > 0 {
                        return Err(format!(
                            "{} released ({why:?}) with {joined} connections joined",
                            lease.id
                        ));
                    }
                }
                Action::Wake => {
                    for conn in &mut self.conns {
                        if conn.state == State::Waiting {
                            conn.state = State::Joined;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Connection `i`'s session ends: its membership is dropped.
    fn leave(&mut self, i: usize) -> Result<(), String> {
        let conn = self.conns.remove(i);
        let actions = self.table.leave(&conn.name, conn.joined, self.now);
        self.carry_out(actions)
    }

    fn fire_timers(&mut self) -> Result<(), String> {
        let now = self.now;
        let (due, later): (Vec<_>, Vec<_>) = self.timers.drain(..).partition(|t| t.2 <= now);
        self.timers = later;
        for (name, slot, _) in due {
            let actions = self.table.grace_expired(&name, slot, now);
            self.carry_out(actions)?;
        }
        Ok(())
    }

    fn step(&mut self, event: &Event) -> Result<(), String> {
        match *event {
            Event::Join { key: k } => {
                let name = key(k);
                let joined = self.table.join(&name);
                self.conns.push(Conn {
                    name,
                    joined,
                    state: State::Joined,
                });
            }
            Event::Begin { conn } => {
                let Some(i) = self.pick(conn, |s| *s == State::Joined) else {
                    return Ok(());
                };
                let (name, joined) = (self.conns[i].name.clone(), self.conns[i].joined);
                match self.table.begin(&name, joined) {
                    Begin::Use(lease) if self.lost.contains(&lease.id) => {
                        // The member's renewal finds it gone, and the member begins again.
                        let actions = self.table.lease_lost(&name, joined.slot, &lease.id);
                        self.carry_out(actions)?;
                    }
                    Begin::Use(lease) => {
                        if let Some(why) = self.released.get(&lease.id) {
                            return Err(format!(
                                "{name} hands out {}, released ({why:?})",
                                lease.id
                            ));
                        }
                        self.conns[i].state = State::Using(lease.id);
                    }
                    Begin::Make => self.conns[i].state = State::Making,
                    Begin::Wait => self.conns[i].state = State::Waiting,
                    // Its key was released over HTTP: the session ends.
                    Begin::Released => self.leave(i)?,
                }
            }
            Event::Granted { conn } => {
                let Some(i) = self.pick(conn, |s| *s == State::Making) else {
                    return Ok(());
                };
                let (name, joined) = (self.conns[i].name.clone(), self.conns[i].joined);
                let number = u32::try_from(self.granted.len()).expect("a few hundred leases");
                let lease = lease_of(&name, number);
                self.granted.insert(lease.id.clone(), joined.slot);
                match self.table.leased(&name, joined, lease.clone()) {
                    Granted::Held(actions) => {
                        self.conns[i].state = State::Using(lease.id);
                        self.carry_out(actions)?;
                    }
                    Granted::Orphan(actions) => {
                        self.carry_out(actions)?;
                        self.leave(i)?;
                    }
                }
            }
            Event::Failed { conn } => {
                let Some(i) = self.pick(conn, |s| *s == State::Making) else {
                    return Ok(());
                };
                let (name, joined) = (self.conns[i].name.clone(), self.conns[i].joined);
                let actions = self.table.lease_failed(&name, joined);
                self.carry_out(actions)?;
                self.leave(i)?;
            }
            Event::Leave { conn } => {
                if let Some(i) = self.pick(conn, |_| true) {
                    self.leave(i)?;
                }
            }
            Event::Advance { ms } => {
                self.now += Duration::from_millis(ms);
                self.fire_timers()?;
            }
            Event::HttpRelease { key: k } => {
                let name = key(k);
                match self.table.release_now(&name) {
                    ReleaseNow::Released(id, actions) => {
                        self.carry_out(actions)?;
                        if self.released.get(&id) != Some(&Why::Http) {
                            return Err(format!("{name}: {id} answered, not released"));
                        }
                    }
                    ReleaseNow::Making | ReleaseNow::NotFound => {}
                }
            }
            Event::RenewOk { key: k } => {
                let name = key(k);
                let found = self.renewing.iter().find(|(_, (n, _))| *n == name);
                if let Some((&slot, (_, id))) = found {
                    let id = id.clone();
                    let until = SystemTime::now() + Duration::from_secs(120);
                    self.table.renewed(&name, slot, &id, until);
                }
            }
            Event::RenewFailed { key: k } => {
                let name = key(k);
                let found = self.renewing.iter().find(|(_, (n, _))| *n == name);
                if let Some((&slot, (_, id))) = found {
                    let id = id.clone();
                    self.lost.insert(id.clone());
                    let actions = self.table.lease_lost(&name, slot, &id);
                    self.carry_out(actions)?;
                }
            }
        }
        self.check()
    }

    /// The harness's promises, beside the table's own.
    fn check(&self) -> Result<(), String> {
        self.table.check_invariants()?;
        let renewing: BTreeSet<u64> = self.renewing.keys().copied().collect();
        let held = self.table.held_slots();
        if renewing != held {
            return Err(format!(
                "renewal tasks of slots {renewing:?}, leases held by {held:?}"
            ));
        }
        for conn in &self.conns {
            match &conn.state {
                State::Waiting => {
                    let maker = self
                        .conns
                        .iter()
                        .any(|c| c.joined.slot == conn.joined.slot && c.state == State::Making);
                    if !maker {
                        return Err(format!(
                            "member {} of {} waits for a lease nobody makes",
                            conn.joined.member, conn.name
                        ));
                    }
                }
                State::Using(id) => match self.released.get(id) {
                    Some(Why::Http) | None => {}
                    Some(why) => {
                        return Err(format!(
                            "member {} relays on {id}, released ({why:?})",
                            conn.joined.member
                        ))
                    }
                },
                State::Joined | State::Making => {}
            }
            // A joined connection is a member of its slot while the slot is its key's.
            if let Some((slot, members)) = self.table.members(&conn.name) {
                if slot == conn.joined.slot && !members.contains(&conn.joined.member) {
                    return Err(format!(
                        "member {} fell out of {}",
                        conn.joined.member, conn.name
                    ));
                }
            }
        }
        Ok(())
    }

    /// Every connection leaves and time runs out.
    fn finish(&mut self) -> Result<(), String> {
        while !self.conns.is_empty() {
            self.leave(self.conns.len() - 1)?;
            self.check()?;
        }
        self.now += GRACE;
        self.fire_timers()?;
        self.check()?;
        let left = self.table.report(self.now, SystemTime::now());
        if !left.is_empty() {
            return Err(format!(
                "keys left after every connection and grace: {left:?}"
            ));
        }
        if !self.renewing.is_empty() || !self.timers.is_empty() {
            return Err(format!(
                "tasks left: {:?}, {:?}",
                self.renewing, self.timers
            ));
        }
        for id in self.granted.keys() {
            let released = self.released.contains_key(id);
            if released == self.lost.contains(id) {
                return Err(format!(
                    "{id}: released {released}, ended by the pool {}",
                    self.lost.contains(id)
                ));
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(pglease_pool::testing::proptest_config("PGLEASE_KEY_INTERLEAVINGS", DEFAULT_CASES, 2_000))]

    #[test]
    fn every_interleaving_keeps_the_keys_promises(events in proptest::collection::vec(event(), 1..400)) {
        let mut harness = Harness::new();
        for (n, event) in events.iter().enumerate() {
            if let Err(broken) = harness.step(event) {
                return Err(TestCaseError::fail(format!("step {n} ({event:?}): {broken}")));
            }
        }
        if let Err(broken) = harness.finish() {
            return Err(TestCaseError::fail(format!("at the end: {broken}")));
        }
    }
}
