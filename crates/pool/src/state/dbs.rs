//! The databases the pool manages besides each template's live template database: one
//! record per database, keyed by its name, holding its phase (adoptable, being made, ready,
//! leased, kept for a look after a failed test, being dropped). Every count the pool needs (ready, leased, being made, drops
//! running, bytes) is derived from these records, so a database cannot sit in two places
//! and no counter can drift.
//!
//! This file knows nothing of rules: which phase follows which is decided by the callers in
//! the sibling modules. It only keeps the records and answers questions about them, and
//! frees the IntegreSQL test id of a database that leaves the pool while nobody holds it
//! (see [`TestIds`]).

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::lifecycle::Waiter;
use super::test_ids::TestIds;
use super::Made;
use crate::names::{DbName, LeaseId, TemplateName};
use crate::sql_error::SqlError;

/// The first pause after a failed drop; doubled per attempt up to [`DROP_RETRY_MAX`].
const DROP_RETRY_FIRST: Duration = Duration::from_secs(1);
/// The longest pause between attempts to drop a database that will not go.
const DROP_RETRY_MAX: Duration = Duration::from_secs(60);

/// One database and what the pool is doing with it.
#[derive(Debug)]
pub(super) struct Db {
    /// The template it belongs to (for a leftover queued for dropping: the template whose
    /// name it carries).
    pub template: TemplateName,
    /// For a clone: the template database (version) it was made from.
    pub made_from: Option<DbName>,
    /// What it costs in the byte budget (its version's size when made).
    pub bytes: u64,
    /// The IntegreSQL test id it carries: set when an IntegreSQL client gets it, kept when
    /// that client gives it back unchanged (unlock), so that it comes back under the same
    /// id; given up (vacant, see [`TestIds`]) when anyone else gets it, when its client
    /// has it recreated, or when it leaves the pool unheld; retired with it when it leaves
    /// while held (leased or kept).
    pub test_id: Option<u32>,
    /// What its clone job reported when it was made ready (its role's password, its
    /// stamp): set while it is ready, leased or kept, None otherwise.
    pub made: Option<Made>,
    /// What is being done with it.
    pub phase: Phase,
}

impl Db {
    /// Whether no client can hold it: it is not leased or kept (nor dropped already).
    fn unheld(&self) -> bool {
        matches!(
            self.phase,
            Phase::Adoptable { .. } | Phase::Making { .. } | Phase::Ready { .. }
        )
    }
}

/// Where a database is in its life.
#[derive(Debug)]
pub(super) enum Phase {
    /// A ready clone an earlier run left, waiting for its template's build of `fingerprint`.
    Adoptable { fingerprint: String },
    /// A clone job or a recycle job is running: `started` is set for clones (to time them)
    /// and only for them, which is how a finished job tells a clone from a recycle.
    Making { started: Option<Instant> },
    /// In its template's ready queue; the lowest `order` is handed out first.
    Ready { order: i64 },
    /// Held by a lease.
    Leased(Box<LeaseRecord>),
    /// Released with `keep`: left as its holder left it, for someone to look at, until
    /// `until`. It holds no place under `max_total` and no connections in the budget, but
    /// its bytes count (and it is evicted first when room is needed).
    Kept(Box<KeptRecord>),
    /// On its way out.
    Dropping(Dropping),
}

/// The steps of a drop, retried with back-off until it succeeds.
#[derive(Debug)]
pub(super) enum Dropping {
    /// Waiting for a worker; the lowest `order` goes first.
    Queued { order: i64, attempts: u32 },
    /// A drop job is running.
    Running { attempts: u32 },
    /// The last attempt failed; tried again at `retry_at`. Its files may still be there, so
    /// it still counts in the byte budget.
    Failed {
        attempts: u32,
        retry_at: Instant,
        error: String,
    },
}

/// An open lease of a clone.
#[derive(Debug)]
pub(super) struct LeaseRecord {
    pub id: LeaseId,
    /// The fingerprint of the version it was cloned from.
    pub fingerprint: String,
    pub expires_at: Instant,
    /// Its connection limit.
    pub connections: u32,
    /// Its number among the template's leases.
    pub number: u32,
    /// May be ended to make room (IntegreSQL test databases).
    pub reclaimable: bool,
    /// The request's label.
    pub label: Option<String>,
    pub granted_at: Instant,
    /// The request it was granted to, while its own connection limit is being set and it
    /// has not been handed over yet.
    pub pending: Option<Waiter>,
    /// A reclaimable lease's database had no session at the last look, taken once its
    /// client had had time to connect (`PoolState::lease_sessions`): its test has ended,
    /// and it is recreated before one a test may still be using.
    pub seen_idle: bool,
}

/// A database kept after its lease ended.
#[derive(Debug)]
pub(super) struct KeptRecord {
    /// The id of the lease it was kept from; it names the kept database from then on.
    pub id: LeaseId,
    /// The lease's label.
    pub label: Option<String>,
    pub kept_at: Instant,
    /// When it is dropped.
    pub until: Instant,
}

/// Per-template counts derived from the records.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Counts {
    pub ready: usize,
    pub leased: usize,
    pub making: usize,
}

impl Counts {
    /// Clones that hold a place under `max_total`.
    pub fn total(&self) -> usize {
        self.ready + self.leased + self.making
    }
}

/// All records, the sequence that orders queues, and the test ids.
#[derive(Debug, Default)]
pub(super) struct Dbs {
    map: BTreeMap<DbName, Db>,
    /// Every template's lease numbers and IntegreSQL test ids; they outlive the records
    /// (and [`Dbs::clear`]).
    pub test_ids: TestIds,
    /// Orders for the back of a queue grow; orders for the front shrink.
    back: i64,
    front: i64,
}

impl Dbs {
    /// Adds a record for a new database. A name is generated once, so it cannot be present;
    /// if it somehow is, the existing record wins and the new one is refused (false).
    pub fn insert(&mut self, name: DbName, db: Db) -> bool {
        match self.map.entry(name) {
            std::collections::btree_map::Entry::Vacant(slot) => {
                slot.insert(db);
                true
            }
            std::collections::btree_map::Entry::Occupied(slot) => {
                tracing::error!(database = %slot.key(), "a database name was created twice; keeping the first");
                debug_assert!(false, "database {} created twice", slot.key());
                false
            }
        }
    }

    pub fn get(&self, name: &DbName) -> Option<&Db> {
        self.map.get(name)
    }

    pub fn get_mut(&mut self, name: &DbName) -> Option<&mut Db> {
        self.map.get_mut(name)
    }

    /// The password of `name`'s role, as its clone job reported it (empty if none did: the
    /// holder then cannot log in, which its first connection says).
    pub fn password(&self, name: &DbName) -> String {
        self.map
            .get(name)
            .and_then(|db| db.made.as_ref())
            .map(|made| made.password.clone())
            .unwrap_or_default()
    }

    pub fn remove(&mut self, name: &DbName) -> Option<Db> {
        self.map.remove(name)
    }

    /// Forgets every record (their server is gone). Ids of databases nobody held become
    /// vacant; those of leased and kept ones are retired.
    pub fn clear(&mut self) {
        for (_, db) in std::mem::take(&mut self.map) {
            if let (Some(id), true) = (db.test_id, db.unheld()) {
                self.test_ids.vacate(&db.template, id);
            }
        }
    }

    /// The client of the test database `name` gave it back to be recreated: its id is
    /// vacant (handed to the next getter, as IntegreSQL recreates under the same id).
    pub fn give_back_id(&mut self, name: &DbName) {
        let Some(db) = self.map.get_mut(name) else {
            return;
        };
        if let Some(id) = db.test_id.take() {
            self.test_ids.vacate(&db.template, id);
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (&DbName, &Db)> {
        self.map.iter()
    }

    /// A phase at the back of the ready queue.
    pub fn ready_at_back(&mut self) -> Phase {
        self.back += 1;
        Phase::Ready { order: self.back }
    }

    /// A phase at the front of the ready queue (a clone nobody has seen goes first).
    pub fn ready_at_front(&mut self) -> Phase {
        self.front -= 1;
        Phase::Ready { order: self.front }
    }

    /// Queues `name` for dropping: an existing record changes phase (one already on its way
    /// out stays as it is); an unknown database (a template version, a leftover) gets a
    /// record of its own, costing `bytes` should its drop fail.
    pub fn queue_drop(&mut self, name: DbName, template: &TemplateName, bytes: u64) {
        self.back += 1;
        let queued = Phase::Dropping(Dropping::Queued {
            order: self.back,
            attempts: 0,
        });
        match self.map.get_mut(&name) {
            Some(Db {
                phase: Phase::Dropping(_),
                ..
            }) => {}
            Some(db) => {
                // A test database given back unchanged, on its way out: nobody holds its id.
                if db.unheld() {
                    if let Some(id) = db.test_id.take() {
                        self.test_ids.vacate(&db.template, id);
                    }
                }
                db.phase = queued;
                db.made = None;
            }
            None => {
                self.map.insert(
                    name,
                    Db {
                        template: template.clone(),
                        made_from: None,
                        bytes,
                        test_id: None,
                        made: None,
                        phase: queued,
                    },
                );
            }
        }
    }

    /// The first database waiting for a drop worker, now marked running.
    pub fn start_next_drop(&mut self) -> Option<DbName> {
        let (name, attempts) = self
            .map
            .iter()
            .filter_map(|(name, db)| match db.phase {
                Phase::Dropping(Dropping::Queued { order, attempts }) => {
                    Some((order, name, attempts))
                }
                _ => None,
            })
            .min_by_key(|(order, _, _)| *order)
            .map(|(_, name, attempts)| (name.clone(), attempts))?;
        if let Some(db) = self.map.get_mut(&name) {
            db.phase = Phase::Dropping(Dropping::Running { attempts });
        }
        Some(name)
    }

    /// A drop job ended: the record goes, or waits to be tried again with back-off.
    /// False when no drop of `name` was running.
    pub fn drop_ended(
        &mut self,
        name: &DbName,
        outcome: Result<(), SqlError>,
        now: Instant,
    ) -> bool {
        let attempts = match self.map.get(name).map(|db| &db.phase) {
            Some(Phase::Dropping(Dropping::Running { attempts })) => *attempts,
            _ => return false,
        };
        match outcome {
            Ok(()) => {
                self.map.remove(name);
            }
            Err(error) => {
                let attempts = attempts + 1;
                let pause = DROP_RETRY_FIRST
                    .saturating_mul(1 << attempts.saturating_sub(1).min(16))
                    .min(DROP_RETRY_MAX);
                if let Some(db) = self.map.get_mut(name) {
                    db.phase = Phase::Dropping(Dropping::Failed {
                        attempts,
                        retry_at: now + pause,
                        error: error.message,
                    });
                }
            }
        }
        true
    }

    /// Failed drops whose pause is over go back into the queue.
    pub fn retry_failed_drops(&mut self, now: Instant) {
        for db in self.map.values_mut() {
            if let Phase::Dropping(Dropping::Failed {
                attempts, retry_at, ..
            }) = db.phase
            {
                if retry_at <= now {
                    self.back += 1;
                    db.phase = Phase::Dropping(Dropping::Queued {
                        order: self.back,
                        attempts,
                    });
                }
            }
        }
    }

    /// When the next failed drop is due again.
    pub fn next_drop_retry(&self) -> Option<Instant> {
        self.map
            .values()
            .filter_map(|db| match db.phase {
                Phase::Dropping(Dropping::Failed { retry_at, .. }) => Some(retry_at),
                _ => None,
            })
            .min()
    }

    /// The front of `template`'s ready queue.
    pub fn ready_front(&self, template: &TemplateName) -> Option<DbName> {
        self.ready_of(template)
            .min_by_key(|(order, _)| *order)
            .map(|(_, name)| name.clone())
    }

    /// The back of `template`'s ready queue (evicted first).
    pub fn ready_back(&self, template: &TemplateName) -> Option<DbName> {
        self.ready_of(template)
            .max_by_key(|(order, _)| *order)
            .map(|(_, name)| name.clone())
    }

    /// `template`'s ready clones with their places in the queue.
    fn ready_of<'a>(
        &'a self,
        template: &'a TemplateName,
    ) -> impl Iterator<Item = (i64, &'a DbName)> + 'a {
        self.map
            .iter()
            .filter(move |(_, db)| db.template == *template)
            .filter_map(|(name, db)| match db.phase {
                Phase::Ready { order } => Some((order, name)),
                _ => None,
            })
    }

    /// The databases of `template` in a phase `select` picks.
    pub fn of(&self, template: &TemplateName, select: fn(&Phase) -> bool) -> Vec<DbName> {
        self.map
            .iter()
            .filter(|(_, db)| db.template == *template && select(&db.phase))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Ready, leased and being-made clones of one template.
    pub fn counts(&self, template: &TemplateName) -> Counts {
        let mut counts = Counts::default();
        for db in self.map.values() {
            if db.template == *template {
                counts.add(&db.phase);
            }
        }
        counts
    }

    /// [`Dbs::counts`] of every template at once.
    pub fn all_counts(&self) -> BTreeMap<TemplateName, Counts> {
        let mut all: BTreeMap<TemplateName, Counts> = BTreeMap::new();
        for db in self.map.values() {
            all.entry(db.template.clone()).or_default().add(&db.phase);
        }
        all
    }

    /// Clone and recycle jobs running.
    pub fn making(&self) -> usize {
        self.map
            .values()
            .filter(|db| matches!(db.phase, Phase::Making { .. }))
            .count()
    }

    /// Drop jobs running.
    pub fn drops_running(&self) -> usize {
        self.map
            .values()
            .filter(|db| matches!(db.phase, Phase::Dropping(Dropping::Running { .. })))
            .count()
    }

    /// Databases on their way out, how many of those failed at least once, and the error
    /// of one that is waiting to be tried again.
    pub fn dropping(&self) -> (usize, usize, Option<String>) {
        let (mut dropping, mut failed, mut last_error) = (0, 0, None);
        for db in self.map.values() {
            let Phase::Dropping(step) = &db.phase else {
                continue;
            };
            dropping += 1;
            let attempts = match step {
                Dropping::Queued { attempts, .. } | Dropping::Running { attempts } => *attempts,
                Dropping::Failed {
                    attempts, error, ..
                } => {
                    last_error = Some(error.clone());
                    *attempts
                }
            };
            if attempts > 0 {
                failed += 1;
            }
        }
        (dropping, failed, last_error)
    }

    /// The lease with this id: its database and record.
    pub fn lease(&self, id: &LeaseId) -> Option<(&DbName, &Db, &LeaseRecord)> {
        self.map.iter().find_map(|(name, db)| match &db.phase {
            Phase::Leased(record) if record.id == *id => Some((name, db, &**record)),
            _ => None,
        })
    }

    /// The database leased under `id`.
    pub fn leased_db(&self, id: &LeaseId) -> Option<DbName> {
        self.lease(id).map(|(name, _, _)| name.clone())
    }

    /// Every open lease: database, record and its template.
    pub fn leases(&self) -> impl Iterator<Item = (&DbName, &Db, &LeaseRecord)> {
        self.map.iter().filter_map(|(name, db)| match &db.phase {
            Phase::Leased(record) => Some((name, db, &**record)),
            _ => None,
        })
    }

    /// Every kept database with its record, oldest first.
    pub fn kept(&self) -> Vec<(&DbName, &Db, &KeptRecord)> {
        let mut kept: Vec<_> = self
            .map
            .iter()
            .filter_map(|(name, db)| match &db.phase {
                Phase::Kept(record) => Some((name, db, &**record)),
                _ => None,
            })
            .collect();
        kept.sort_by_key(|(_, _, record)| record.kept_at);
        kept
    }

    /// The database kept under `id`.
    pub fn kept_db(&self, id: &LeaseId) -> Option<DbName> {
        self.map.iter().find_map(|(name, db)| match &db.phase {
            Phase::Kept(record) if record.id == *id => Some(name.clone()),
            _ => None,
        })
    }

    /// Connections held by open leases (their limits, summed).
    pub fn connections_in_use(&self) -> u32 {
        self.leases().map(|(_, _, r)| r.connections).sum()
    }

    /// Bytes held by clones: everything but what waits to be adopted and what is being
    /// dropped (queued or running drops free theirs soon; a failed one keeps counting).
    pub fn bytes(&self) -> u64 {
        self.map
            .values()
            .filter(|db| match &db.phase {
                Phase::Adoptable { .. } => false,
                Phase::Dropping(step) => matches!(step, Dropping::Failed { .. }),
                Phase::Making { .. } | Phase::Ready { .. } | Phase::Leased(_) | Phase::Kept(_) => {
                    true
                }
            })
            .map(|db| db.bytes)
            .sum()
    }
}

impl Counts {
    fn add(&mut self, phase: &Phase) {
        match phase {
            Phase::Ready { .. } => self.ready += 1,
            Phase::Leased(_) => self.leased += 1,
            Phase::Making { .. } => self.making += 1,
            Phase::Adoptable { .. } | Phase::Kept(_) | Phase::Dropping(_) => {}
        }
    }
}
