//! `PoolState`: the rules of the pool, with no I/O. It takes events (a lease requested, a
//! build or clone finished, a lease released or expired, postgres lost or back), each with
//! the current instant, and returns the [`Action`]s the actor must carry out.
//!
//! It never awaits, spawns or talks SQL; the actor owns it and is its only caller. Its data
//! has one owner per fact: every database the pool manages besides the live template
//! databases is one record in [`dbs`] (with its phase: adoptable, being made, ready,
//! leased, being dropped), and every count is derived from those records; a template's
//! entry ([`lifecycle`]) holds its build and its waiting requests. [`invariants`] states the
//! promises as code and runs after every event in tests and debug builds.
//!
//! The rules are split by concern: [`grants`] (requests and grants), [`release`]
//! (releases, renewals, a lease ended at once), [`expiry`] (expiry, timed-out requests,
//! reclaiming), [`refill`] (clones and drops to start, jobs that ended), [`budget`] (bytes
//! and eviction), [`build`] (configured templates), [`owner`] (whose a configured template
//! is, and who may change it), [`client`] (templates clients build),
//! [`test_ids`] (lease numbers and IntegreSQL test ids), [`demand`] (refilling ahead of
//! demand), [`proofs`] (stamps for `--reuse-unchanged`), [`kept`] (databases kept after a
//! failed test), [`lease_bytes`] (`--lease-max-bytes`), [`server`] (the server's lifecycle
//! and generation), [`space`] (the databases' tmpfs), [`status`].

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use crate::config::{PoolLimits, TemplateConfig};
use crate::error::LeaseError;
use crate::names::{DbName, LeaseId, TemplateName};
use crate::session::Stamp;
use crate::sql_error::SqlError;

/// SQLSTATE of `CREATE DATABASE` meeting a database of that name (`duplicate_database`).
const DUPLICATE_DATABASE: &str = "42P04";
pub(crate) use crate::template::Built;

mod budget;
mod build;
mod client;
mod dbs;
mod demand;
mod expiry;
mod grants;
mod invariants;
mod kept;
mod lease_bytes;
mod lifecycle;
mod owner;
mod proofs;
mod refill;
mod release;
mod server;
mod space;
mod status;
mod test_ids;

pub use build::Registered;
pub(crate) use client::Finalize;
pub use owner::Changer;

use dbs::Dbs;
use lifecycle::TemplateEntry;
use owner::Owner;
use server::{Probe, Server};

/// Identifies a parked lease request; the actor maps it to the reply channel.
pub(crate) type WaiterId = u64;

/// How many lost lease ids are remembered to answer "lost" rather than "not found".
const LOST_MEMORY: usize = 4096;

/// Why a lease ended without its holder's word, for the holder's next call on its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Its server was lost (or it was ended to make room, or its template discarded).
    Lost,
    /// Its database grew past `--lease-max-bytes` (`state/lease_bytes.rs`).
    ExceededMaxBytes {
        database: DbName,
        bytes: u64,
        limit: u64,
    },
}

/// What the actor must do next.
#[derive(Debug)]
pub(crate) enum Action {
    /// Compute the template's fingerprint and build its template database.
    Build {
        template: TemplateName,
        source: crate::config::TemplateSource,
        /// A complete template database of the same fingerprint may be taken as built
        /// (false for the first build in a run with `--verify-templates`).
        reuse_existing: bool,
    },
    /// `CREATE DATABASE clone TEMPLATE template_db`; reported with
    /// [`PoolState::clone_finished`].
    Clone {
        template: TemplateName,
        template_db: DbName,
        clone: DbName,
        /// Stamp it for the proof of `--reuse-unchanged` (`state/proofs.rs`).
        stamp: bool,
    },
    /// Lock out a reused clone's holder (or an adopted clone's unknown one) and give its role
    /// a new password; reported like a clone.
    Recycle {
        template: TemplateName,
        template_db: DbName,
        clone: DbName,
        /// Released without `reuse`: back to the ready queue only if the server proves it
        /// unchanged since it was made ready (else it is dropped and replaced).
        verify: bool,
        /// What it was when last made ready (None: nothing recorded it): with `verify`, what
        /// the proof compares against (none: it cannot be proven unchanged); otherwise where
        /// its next stamp may start from (`Session::restamp`).
        stamp: Option<Stamp>,
    },
    /// `DROP DATABASE db WITH (FORCE)`; reported with [`PoolState::drop_finished`].
    Drop { db: DbName },
    /// Give a granted clone's role the lease's own connection limit before it is handed
    /// over; reported with [`PoolState::limit_set`].
    SetLimit {
        lease_id: LeaseId,
        database: DbName,
        connections: u32,
    },
    /// Create the empty database of a client-built template and its login role; reported
    /// with [`PoolState::template_opened`].
    OpenTemplate { template: TemplateName, db: DbName },
    /// End the client's sessions on a client-built template, drop its login role and mark
    /// the database a template; reported with [`PoolState::template_finalized`].
    FinalizeTemplate {
        template: TemplateName,
        db: DbName,
        since: Instant,
    },
    /// Hand a lease to a parked request. If it cannot be delivered, the actor reports
    /// [`PoolState::grant_undelivered`].
    Grant { waiter: WaiterId, grant: Grant },
    /// Answer a parked request with an error.
    Fail { waiter: WaiterId, error: LeaseError },
}

/// A lease decided by the state, to be completed with connection details by the actor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Grant {
    pub lease_id: LeaseId,
    pub template: TemplateName,
    pub fingerprint: String,
    pub database: DbName,
    pub ttl: Duration,
    /// The lease's connection limit.
    pub connections: u32,
    /// Its number among the template's leases.
    pub number: u32,
    /// The request's label.
    pub label: Option<String>,
    /// The password of the database's role, which opens it.
    pub password: String,
}

/// What a clone or recycle job reports of a clone it made ready: the record keeps it
/// until the database is dropped or recycled again.
#[derive(Debug, Clone)]
pub(crate) struct Made {
    /// The password of its role (named like the database).
    pub password: String,
    /// What it was on disk when made ready, for the proof that a released clone is
    /// unchanged (`--reuse-unchanged`); None when that proof is off or the stamp failed.
    pub stamp: Option<Stamp>,
}

/// What the proofs of released clones found.
#[derive(Debug, Clone, Copy, Default)]
struct Proven {
    unchanged: u64,
    changed: u64,
    /// Releases of clones made without a stamp (`state/proofs.rs`), dropped unproven.
    unstamped: u64,
}

/// The pool's bookkeeping. See the module docs.
#[derive(Debug)]
pub(crate) struct PoolState {
    limits: PoolLimits,
    instance: String,
    next_seq: u64,
    server: Server,
    templates: BTreeMap<TemplateName, TemplateEntry>,
    /// Every clone, and every database waiting to be dropped.
    dbs: Dbs,
    /// Leases ended without their holder's word, and why: what later calls on them hear.
    lost: HashMap<LeaseId, Ended>,
    lost_order: VecDeque<LeaseId>,
    /// Connections the server can give lease holders; leases are granted only while the
    /// sum of their connection limits fits.
    connection_budget: u32,
    /// Requests refused or timed out, by the limit that stopped them (event counts, for
    /// `/status`).
    refused: crate::types::Refusals,
    /// Reclaimable leases ended to make room, and abandoned client templates discarded.
    reclaimed: u64,
    abandoned: u64,
    /// Leases ended by their time to live since the start.
    expired: u64,
    /// Released clones proven unchanged (back to the ready queue) and found changed
    /// (dropped and made again), since the start.
    proven: Proven,
    /// Bytes in use on the server's copy-on-write store, as last measured, when its clones
    /// share their template's blocks (`--storage cow` on PostgreSQL 18+): the byte budget is
    /// judged by it instead of by each clone's size (`state/budget.rs`).
    store_used: Option<u64>,
    /// Every configured template is built at start (`--prebuild`): readiness waits for
    /// their first builds.
    prebuild: bool,
    /// Times the server was lost and brought up again (`server_lost`).
    restarts: u32,
    /// Why the server was last lost, or could last not be brought up (`/status`).
    last_server_error: Option<String>,
    /// Bumped whenever the server is lost: reports of jobs of an earlier generation
    /// describe a server that is gone, and the actor does not apply them.
    generation: u64,
    /// The second look at a server whose monitor connection closed.
    probe: Probe,
    /// When bringing the server up is tried again, after a failed try.
    restart_at: Option<Instant>,
    /// The databases' own tmpfs, while the server runs with one.
    space: Option<space::Space>,
    /// What last filled the databases' tmpfs, kept after room came back and across
    /// restarts (`state/space.rs`).
    last_filled_by: Option<crate::types::FilledBy>,
    /// Leases ended because their database grew past `--lease-max-bytes`, and the last of
    /// them (`state/lease_bytes.rs`).
    exceeded_max_bytes: u64,
    last_exceeded_max_bytes: Option<crate::types::ExceededMaxBytes>,
    /// The first build of each configured template in this run starts from scratch
    /// (`--verify-templates`).
    verify_templates: bool,
    /// Client-built templates' databases get IntegreSQL's names (`integresql_…`, see
    /// [`PoolState::with_integresql_names`]); off, and in state tests, they get ours.
    integresql_names: bool,
    /// Names someone else's databases have on the server (IntegreSQL's own, on an external
    /// one): never given to ours, and never dropped (`PoolState::names_taken`).
    taken: HashSet<DbName>,
    /// Databases of discarded client-built templates that a job still holds (being opened
    /// or finalized): gone from their entry, they are not free until the job reports and
    /// they are queued to drop.
    discarded_in_flight: HashSet<DbName>,
}

impl PoolState {
    /// A pool whose server is not up yet. `default` is wanted from the start so `/readyz`
    /// and the first lease do not wait for a build; others only with `prebuild`.
    pub fn new(
        limits: PoolLimits,
        instance: String,
        templates: &[TemplateConfig],
        prebuild: bool,
    ) -> Self {
        let mut entries = BTreeMap::new();
        for template in templates {
            let wanted = prebuild || template.name == TemplateName::default_name();
            entries.insert(
                template.name.clone(),
                TemplateEntry::configured(template.source.clone(), wanted, Owner::Operator),
            );
        }
        PoolState {
            limits,
            instance,
            next_seq: 1,
            server: Server::Down("starting".into()),
            templates: entries,
            dbs: Dbs::default(),
            lost: HashMap::new(),
            lost_order: VecDeque::new(),
            connection_budget: 0,
            refused: Default::default(),
            reclaimed: 0,
            expired: 0,
            proven: Proven::default(),
            abandoned: 0,
            store_used: None,
            prebuild,
            restarts: 0,
            last_server_error: None,
            generation: 1,
            probe: Probe::Idle,
            restart_at: None,
            space: None,
            last_filled_by: None,
            exceeded_max_bytes: 0,
            last_exceeded_max_bytes: None,
            verify_templates: false,
            integresql_names: false,
            taken: HashSet::new(),
            discarded_in_flight: HashSet::new(),
        }
    }

    /// Names client-built templates' databases as IntegreSQL does
    /// (`integresql_template_<hash>`, `integresql_test_<hash>_<n>`) where they fit in a
    /// postgres identifier and no database has the name yet: neither one of the pool nor
    /// one of [`PoolState::names_taken`]. A create that still meets someone else's
    /// database of the name (made since the start) leaves it alone
    /// ([`PoolState::drop_after_failed_create`]).
    pub fn with_integresql_names(mut self, on: bool) -> Self {
        self.integresql_names = on;
        self
    }

    /// `--verify-templates`: the first build of each configured template in this run
    /// starts from scratch, even where a template database of its fingerprint exists.
    pub fn with_verified_builds(mut self, on: bool) -> Self {
        self.verify_templates = on;
        self
    }

    /// Postgres accepts connections (first start, restart or reconnect), with room for
    /// `connection_budget` lease connections: build what is wanted.
    pub fn server_up(&mut self, connection_budget: u32) -> Vec<Action> {
        if self.server == Server::Stopping {
            return Vec::new();
        }
        self.server = Server::Up;
        self.restart_at = None;
        self.connection_budget = connection_budget;
        let mut actions = Vec::new();
        for (name, entry) in &mut self.templates {
            if let lifecycle::Lifecycle::Configured(configured) = &mut entry.lifecycle {
                if entry.wanted && matches!(configured.build, lifecycle::Build::Idle) {
                    actions.push(configured.start_build(name, None, self.verify_templates));
                }
            }
        }
        actions
    }

    /// Postgres died or the connection to it was lost: everything on it is gone. Open leases
    /// become "lost", waiting requests fail (so do grants whose connection limit was being
    /// set: that job's report will never count), builds must be redone, and client-built
    /// templates are forgotten (nothing here can rebuild them; the next session's sweep
    /// brings them back if the server kept them).
    pub fn server_lost(&mut self, reason: &str) -> Vec<Action> {
        if self.server != Server::Stopping {
            self.server = Server::Down(reason.to_owned());
        }
        self.restarts += 1;
        self.last_server_error = Some(reason.to_owned());
        self.generation += 1;
        self.probe = Probe::Idle;
        self.space = None;
        self.store_used = None;
        let mut actions = Vec::new();
        let leases: Vec<(LeaseId, Option<WaiterId>)> = self
            .dbs
            .leases()
            .map(|(_, _, record)| (record.id.clone(), record.pending.as_ref().map(|w| w.id)))
            .collect();
        for (id, pending) in leases {
            match pending {
                Some(waiter) => actions.push(Action::Fail {
                    waiter,
                    error: LeaseError::PostgresDown(reason.to_owned()),
                }),
                None => self.remember_lost(id),
            }
        }
        self.dbs.clear();
        for (name, entry) in &mut self.templates {
            let client_built = entry.is_client_built();
            for waiter in entry.waiters.drain(..) {
                let error = if client_built {
                    LeaseError::unknown_template(name.clone())
                } else {
                    LeaseError::PostgresDown(reason.to_owned())
                };
                actions.push(Action::Fail {
                    waiter: waiter.id,
                    error,
                });
            }
            entry.clones_paused_until = None;
            // A look at its sources that was under way reports against a server that is
            // gone, and is not applied: nothing waits for it any more.
            entry.checking_sources = false;
            if let lifecycle::Lifecycle::Configured(configured) = &mut entry.lifecycle {
                configured.build = lifecycle::Build::Idle;
            }
        }
        self.templates.retain(|_, e| !e.is_client_built());
        actions
    }

    /// The daemon is stopping: refuse new work and answer everyone waiting.
    pub fn stopping(&mut self) -> Vec<Action> {
        self.server = Server::Stopping;
        let mut actions = Vec::new();
        for entry in self.templates.values_mut() {
            for waiter in entry.waiters.drain(..) {
                actions.push(Action::Fail {
                    waiter: waiter.id,
                    error: LeaseError::ShuttingDown,
                });
            }
        }
        actions
    }

    /// Connections held against the budget: open leases' limits, and those of the roles
    /// of client-built templates not finalized yet.
    pub(crate) fn connections_in_use(&self) -> u32 {
        self.dbs.connections_in_use() + self.client_connections()
    }

    /// A fresh database name for a clone of `template`: IntegreSQL's for a client-built
    /// one when it is on and the name is free (an adopted clone of an earlier run may
    /// hold it), ours otherwise.
    fn next_clone_name(&mut self, template: &TemplateName) -> DbName {
        let seq = self.next_seq;
        self.next_seq += 1;
        let client_built = self
            .templates
            .get(template)
            .is_some_and(TemplateEntry::is_client_built);
        self.integresql_names
            .then_some(())
            .filter(|()| client_built)
            .and_then(|()| DbName::integresql_test(template, seq))
            .filter(|name| self.name_is_free(name))
            .unwrap_or_else(|| DbName::clone_db(&self.instance, seq))
    }

    /// Whether no database the pool knows has the name `name`: no record, and no
    /// template's own database.
    fn name_is_free(&self, name: &DbName) -> bool {
        !self.taken.contains(name)
            && !self.discarded_in_flight.contains(name)
            && self.dbs.get(name).is_none()
            && self
                .templates
                .values()
                .all(|entry| !entry.template_dbs().contains(&name))
    }

    /// The databases someone else has under names ours could take (found at each start of
    /// the server: `Session::others_integresql_names`).
    pub fn names_taken(&mut self, names: Vec<DbName>) {
        self.taken = names.into_iter().collect();
    }

    /// After a failed `CREATE DATABASE db`: drops what it may have left, unless the name
    /// was someone else's database (42P04, `duplicate_database`: a real IntegreSQL's made
    /// on an external server since the start). That one is left alone, and its name is
    /// not used again.
    fn drop_after_failed_create(&mut self, db: DbName, template: &TemplateName, error: &SqlError) {
        if error.sqlstate.as_deref() == Some(DUPLICATE_DATABASE) {
            tracing::warn!(database = %db, "a database of that name is someone else's: left alone, and the name not used again");
            self.dbs.remove(&db);
            self.taken.insert(db);
        } else {
            self.dbs.queue_drop(db, template, 0);
        }
    }

    fn remember_lost(&mut self, id: LeaseId) {
        self.remember_ended(id, Ended::Lost);
    }

    /// Remembers why lease `id` ended (the last [`LOST_MEMORY`] of them).
    fn remember_ended(&mut self, id: LeaseId, why: Ended) {
        if self.lost_order.len() >= LOST_MEMORY {
            if let Some(old) = self.lost_order.pop_front() {
                self.lost.remove(&old);
            }
        }
        if self.lost.insert(id.clone(), why).is_none() {
            self.lost_order.push_back(id);
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod interleavings;
