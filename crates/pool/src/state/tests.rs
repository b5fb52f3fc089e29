use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use super::*;
use crate::config::{PoolLimits, TemplateConfig, TemplateSource};
use crate::error::{LeaseOpError, TemplateOpError};
use crate::template::SourceStamp;
use crate::types::{LeaseRequest, TemplateStatus};
use expiry::STARTING_GRACE;
use refill::CLONE_RETRY_DELAY;

fn name(text: &str) -> TemplateName {
    TemplateName::new(text).expect("valid name")
}

fn limits(min_ready: usize, max_total: usize) -> PoolLimits {
    PoolLimits {
        min_ready,
        max_total,
        clone_concurrency: 2,
        default_ttl: Duration::from_secs(60),
        max_ttl: Duration::from_secs(600),
        lease_connections: 10,
        max_bytes: None,
        max_kept: 2,
        max_keep: Duration::from_secs(300),
        max_waiting: 1024,
        build_timeout: Duration::from_secs(300),
        initialize_timeout: Duration::from_secs(900),
        reuse_unchanged: false,
        lease_max_bytes: crate::config::LeaseMaxBytes::Auto,
    }
}

fn pool(min_ready: usize, max_total: usize) -> PoolState {
    pool_with(limits(min_ready, max_total))
}

/// `default` and `app` (migrations) under `limits`.
fn pool_with(limits: PoolLimits) -> PoolState {
    let templates = vec![
        TemplateConfig {
            name: TemplateName::default_name(),
            source: TemplateSource::Empty,
            postgres_version: None,
        },
        TemplateConfig {
            name: name("app"),
            source: TemplateSource::Migrations(PathBuf::from("migrations")),
            postgres_version: None,
        },
    ];
    PoolState::new(limits, "t1".into(), &templates, false)
}

fn request(template: &str, wait_ms: u64) -> LeaseRequest {
    LeaseRequest {
        template: name(template),
        ttl: None,
        wait: Duration::from_millis(wait_ms),
        connections: None,
        reclaimable: false,
        postgres_version: None,
        label: None,
    }
}

/// A finished build of `template` with `fingerprint`.
fn built(template: &TemplateName, fingerprint: &str) -> Built {
    Built {
        fingerprint: fingerprint.to_owned(),
        db: DbName::template(template, fingerprint),
        elapsed: Duration::from_millis(30),
        size_bytes: 7_500_000,
        built_at: std::time::SystemTime::UNIX_EPOCH,
    }
}

/// Carries out actions the way the actor would, with every build and clone succeeding
/// at once; returns the grants and failures it saw.
struct Driver {
    state: PoolState,
    now: Instant,
    next_waiter: WaiterId,
    grants: Vec<(WaiterId, Grant)>,
    failures: Vec<(WaiterId, LeaseError)>,
    drops: Vec<DbName>,
    pending: Vec<Action>,
    builds: u32,
    /// How long each clone takes (the clock moves on by this much per clone).
    clone_duration: Duration,
    /// The clones made, and whether each was stamped for the proof.
    stamped: HashMap<DbName, bool>,
    /// Proofs run (recycles with `verify`); each finds the clone changed, as the actor
    /// reports it, when `proofs_find_changes`.
    proofs: usize,
    proofs_find_changes: bool,
}

impl Driver {
    fn new(state: PoolState) -> Self {
        Self::with_budget(state, 1000)
    }

    /// A driver whose server has room for `budget` lease connections.
    fn with_budget(state: PoolState, budget: u32) -> Self {
        let mut driver = Driver {
            state,
            now: Instant::now(),
            next_waiter: 1,
            grants: Vec::new(),
            failures: Vec::new(),
            drops: Vec::new(),
            pending: Vec::new(),
            builds: 0,
            clone_duration: Duration::ZERO,
            stamped: HashMap::new(),
            proofs: 0,
            proofs_find_changes: false,
        };
        let actions = driver.state.server_up(budget);
        driver.pending.extend(actions);
        driver
    }

    /// Runs actions until none are left; builds and clones succeed.
    fn settle(&mut self) {
        while let Some(action) = self.pending.pop() {
            let more = match action {
                Action::Build { template, .. } => {
                    // Every build yields a new version, as if the sources had changed.
                    self.builds += 1;
                    let fingerprint = format!("{:016x}", self.builds);
                    self.state.build_finished(
                        &template,
                        SourceStamp::default(),
                        Ok(built(&template, &fingerprint)),
                        self.now,
                    )
                }
                Action::Clone {
                    template,
                    template_db,
                    clone,
                    stamp,
                } => {
                    self.now += self.clone_duration;
                    self.stamped.insert(clone.clone(), stamp);
                    let made = super::Made {
                        stamp: stamp.then(crate::session::Stamp::for_tests),
                        ..made()
                    };
                    self.state
                        .clone_finished(&template, &template_db, clone, Ok(made), self.now)
                }
                Action::Recycle {
                    template,
                    template_db,
                    clone,
                    verify,
                    stamp,
                } => {
                    if verify {
                        assert!(
                            stamp.is_some(),
                            "{clone} was put to the proof without a stamp"
                        );
                        self.proofs += 1;
                    }
                    if verify && self.proofs_find_changes {
                        self.state.count_proof(&template, false);
                        self.state.clone_finished(
                            &template,
                            &template_db,
                            clone,
                            Err(crate::sql_error::SqlError::other(
                                "changed: 10 row(s) written",
                            )),
                            self.now,
                        )
                    } else {
                        self.state.clone_finished(
                            &template,
                            &template_db,
                            clone,
                            Ok(made()),
                            self.now,
                        )
                    }
                }
                Action::Drop { db } => {
                    self.drops.push(db.clone());
                    self.state.drop_finished(&db, Ok(()), self.now)
                }
                Action::SetLimit { lease_id, .. } => {
                    self.state.limit_set(&lease_id, Ok(()), self.now)
                }
                Action::OpenTemplate { template, db } => {
                    self.state
                        .template_opened(&template, db, Ok(()), self.now)
                        .1
                }
                Action::FinalizeTemplate { template, db, .. } => {
                    let built = Built {
                        db: db.clone(),
                        ..built(&template, template.as_str())
                    };
                    self.state
                        .template_finalized(&template, db, Ok(built), self.now)
                        .1
                }
                Action::Grant { waiter, grant } => {
                    self.grants.push((waiter, grant));
                    Vec::new()
                }
                Action::Fail { waiter, error } => {
                    self.failures.push((waiter, error));
                    Vec::new()
                }
            };
            self.pending.extend(more);
            if let Err(broken) = self.state.check_invariants() {
                panic!("invariant broken: {broken}");
            }
        }
    }

    fn lease(&mut self, template: &str, wait_ms: u64) -> WaiterId {
        self.lease_with(&request(template, wait_ms))
    }

    fn lease_with(&mut self, request: &LeaseRequest) -> WaiterId {
        let waiter = self.next_waiter;
        self.next_waiter += 1;
        let actions = self
            .state
            .request_lease(waiter, LeaseId::random(0), request, self.now);
        self.pending.extend(actions);
        waiter
    }

    fn grant_of(&self, waiter: WaiterId) -> Option<&Grant> {
        self.grants
            .iter()
            .find(|(w, _)| *w == waiter)
            .map(|(_, g)| g)
    }
}

fn default_status(state: &PoolState) -> TemplateStatus {
    state
        .template_status()
        .into_iter()
        .find(|t| t.name == TemplateName::default_name())
        .expect("default template")
}

#[test]
fn default_template_is_built_and_warmed_at_start() {
    let mut driver = Driver::new(pool(3, 10));
    driver.settle();
    let status = driver.state.template_status();
    let default = status
        .iter()
        .find(|t| t.name.as_str() == "default")
        .expect("default");
    assert_eq!((default.state, default.ready), ("ready", 3));
    let app = status
        .iter()
        .find(|t| t.name.as_str() == "app")
        .expect("app");
    assert_eq!(
        (app.state, app.ready),
        ("idle", 0),
        "app is built only on first need"
    );
    assert!(driver.state.ready_for_default());
}

#[test]
fn a_lease_is_granted_from_the_ready_queue_and_refilled() {
    let mut driver = Driver::new(pool(2, 10));
    driver.settle();
    let waiter = driver.lease("default", 1000);
    driver.settle();
    assert!(driver.grant_of(waiter).is_some());
    let default = default_status(&driver.state);
    assert_eq!((default.ready, default.leased), (2, 1));
}

#[test]
fn no_database_is_handed_out_twice() {
    let mut driver = Driver::new(pool(4, 64));
    driver.settle();
    let waiters: Vec<_> = (0..40).map(|_| driver.lease("default", 1000)).collect();
    driver.settle();
    let databases: HashSet<_> = driver
        .grants
        .iter()
        .map(|(_, g)| g.database.clone())
        .collect();
    assert_eq!(driver.grants.len(), waiters.len());
    assert_eq!(databases.len(), waiters.len());
    // Releasing with reuse puts a database back; it is then granted once more, not twice at once.
    let first = driver.grants[0].1.clone();
    let (result, actions) = driver.state.release(&first.lease_id, true, driver.now);
    assert!(result.is_ok());
    driver.pending.extend(actions);
    let again = driver.lease("default", 1000);
    driver.settle();
    let open: Vec<_> = driver
        .state
        .lease_list()
        .into_iter()
        .map(|l| l.database)
        .collect();
    let unique: HashSet<_> = open.iter().cloned().collect();
    assert_eq!(open.len(), unique.len());
    assert!(driver.grant_of(again).is_some());
}

#[test]
fn waiters_are_served_in_arrival_order_when_the_pool_is_exhausted() {
    let mut driver = Driver::new(pool(0, 1));
    driver.settle();
    let first = driver.lease("default", 10_000);
    driver.settle();
    let second = driver.lease("default", 10_000);
    let third = driver.lease("default", 10_000);
    driver.settle();
    assert!(driver.grant_of(first).is_some());
    assert!(driver.grant_of(second).is_none() && driver.grant_of(third).is_none());
    let first_id = driver.grant_of(first).expect("granted").lease_id.clone();
    let (result, actions) = driver.state.release(&first_id, false, driver.now);
    assert!(result.is_ok());
    driver.pending.extend(actions);
    driver.settle();
    assert!(
        driver.grant_of(second).is_some(),
        "the earlier waiter goes first"
    );
    assert!(driver.grant_of(third).is_none());
}

#[test]
fn a_waiter_times_out_when_nothing_frees_up() {
    let mut driver = Driver::new(pool(0, 1));
    driver.settle();
    driver.lease("default", 10_000);
    driver.settle();
    let late = driver.lease("default", 200);
    driver.settle();
    let actions = driver.state.tick(driver.now + Duration::from_millis(199));
    assert!(actions.is_empty());
    let actions = driver.state.tick(driver.now + Duration::from_millis(200));
    driver.pending.extend(actions);
    driver.settle();
    let (waiter, error) = driver.failures.last().expect("a failure");
    assert_eq!(*waiter, late);
    assert!(matches!(
        error,
        LeaseError::TimedOut {
            blocked_by: crate::error::Blocked::MaxTotal {
                leased: 1,
                max_total: 1
            },
            ..
        }
    ));
}

#[test]
fn expired_leases_are_dropped_and_their_ids_are_void() {
    let mut driver = Driver::new(pool(1, 4));
    driver.settle();
    let waiter = driver.lease("default", 1000);
    driver.settle();
    let grant = driver.grant_of(waiter).expect("granted").clone();
    assert_eq!(
        driver.state.next_deadline(),
        Some(driver.now + Duration::from_secs(60))
    );
    driver.now += Duration::from_secs(61);
    let actions = driver.state.tick(driver.now);
    driver.pending.extend(actions);
    driver.settle();
    assert!(driver.drops.contains(&grant.database));
    let (result, _) = driver.state.release(&grant.lease_id, false, driver.now);
    assert!(matches!(result, Err(LeaseOpError::NotFound(_))));
    assert!(matches!(
        driver.state.renew(&grant.lease_id, None, driver.now),
        Err(LeaseOpError::NotFound(_))
    ));
}

#[test]
fn release_without_reuse_drops_and_replaces() {
    let mut driver = Driver::new(pool(1, 4));
    driver.settle();
    let waiter = driver.lease("default", 1000);
    driver.settle();
    let grant = driver.grant_of(waiter).expect("granted").clone();
    let (result, actions) = driver.state.release(&grant.lease_id, false, driver.now);
    assert!(result.is_ok());
    driver.pending.extend(actions);
    driver.settle();
    assert_eq!(driver.drops, vec![grant.database.clone()]);
    let default = default_status(&driver.state);
    assert_eq!((default.ready, default.leased), (1, 0));
    let (again, _) = driver.state.release(&grant.lease_id, false, driver.now);
    assert!(matches!(again, Err(LeaseOpError::NotFound(_))));
}

#[test]
fn max_total_caps_clones_per_template() {
    let mut driver = Driver::new(pool(8, 3));
    driver.settle();
    let default = default_status(&driver.state);
    assert_eq!(default.ready, 3);
}

#[test]
fn a_failed_build_fails_its_waiters_and_is_retried_on_the_next_request() {
    let mut state = pool(1, 4);
    let _ = state.server_up(1000);
    let now = Instant::now();
    let actions = state.request_lease(1, LeaseId::random(0), &request("app", 1000), now);
    assert!(actions.iter().any(|a| matches!(a, Action::Build { .. })));
    let actions = state.build_finished(
        &name("app"),
        SourceStamp::default(),
        Err("001.sql: syntax error at line 3".into()),
        now,
    );
    assert!(matches!(
        actions.as_slice(),
        [Action::Fail {
            waiter: 1,
            error: LeaseError::BuildFailed { .. }
        }]
    ));
    let actions = state.request_lease(2, LeaseId::random(0), &request("app", 1000), now);
    assert!(
        actions.iter().any(|a| matches!(a, Action::Build { .. })),
        "retried"
    );
}

/// Issue 27: a build whose connection was lost is the server's trouble, not the sources'.
#[test]
fn a_build_that_lost_its_connection_fails_waiters_as_the_servers_trouble_and_is_not_failed() {
    let mut state = pool(1, 4);
    let _ = state.server_up(1000);
    let now = Instant::now();
    let _ = state.request_lease(1, LeaseId::random(0), &request("app", 1000), now);
    let actions = state.build_finished(
        &name("app"),
        SourceStamp::default(),
        Err(crate::sql_error::SqlError {
            kind: crate::sql_error::SqlErrorKind::ConnectionLost,
            sqlstate: Some("57P01".into()),
            message: "FATAL: terminating connection due to administrator command".into(),
        }),
        now,
    );
    assert!(
        matches!(
            actions.as_slice(),
            [Action::Fail {
                waiter: 1,
                error: LeaseError::PostgresDown(_)
            }]
        ),
        "{actions:?}"
    );
    assert!(
        !state.has_failed(&name("app")),
        "its sources are not to blame"
    );
    let actions = state.request_lease(2, LeaseId::random(0), &request("app", 1000), now);
    assert!(
        actions.iter().any(|a| matches!(a, Action::Build { .. })),
        "built again"
    );
}

/// Issue 43: a build postgres refused a connection slot (53300) fails its waiters as the
/// connection budget's trouble (`too_many_connections`, 503), and its sources are not
/// blamed: the template is not marked failed and the next request builds it again.
#[test]
fn a_build_refused_a_connection_slot_is_the_budgets_trouble_and_is_not_failed() {
    let mut state = pool(1, 4);
    let _ = state.server_up(1000);
    let now = Instant::now();
    let _ = state.request_lease(1, LeaseId::random(0), &request("app", 1000), now);
    let actions = state.build_finished(
        &name("app"),
        SourceStamp::default(),
        Err(crate::sql_error::SqlError {
            kind: crate::sql_error::SqlErrorKind::TooManyConnections,
            sqlstate: Some("53300".into()),
            message:
                "cannot connect to template database x: FATAL: sorry, too many clients already"
                    .into(),
        }),
        now,
    );
    assert!(
        matches!(
            actions.as_slice(),
            [Action::Fail {
                waiter: 1,
                error: LeaseError::BuildFailed {
                    cause: crate::sql_error::SqlErrorKind::TooManyConnections,
                    ..
                }
            }]
        ),
        "{actions:?}"
    );
    assert!(
        !state.has_failed(&name("app")),
        "its sources are not to blame"
    );
    let actions = state.request_lease(2, LeaseId::random(0), &request("app", 1000), now);
    assert!(
        actions.iter().any(|a| matches!(a, Action::Build { .. })),
        "built again"
    );
}

#[test]
fn unknown_templates_are_refused() {
    let mut driver = Driver::new(pool(1, 4));
    driver.settle();
    let waiter = driver.lease("nope", 1000);
    driver.settle();
    assert!(matches!(
        driver.failures.as_slice(),
        [(w, LeaseError::UnknownTemplate { .. })] if *w == waiter
    ));
}

#[test]
fn an_undelivered_grant_returns_its_database_to_the_queue() {
    let mut driver = Driver::new(pool(1, 1));
    driver.settle();
    let waiter = driver.lease("default", 1000);
    driver.settle();
    let grant = driver.grant_of(waiter).expect("granted").clone();
    let actions = driver.state.grant_undelivered(&grant.lease_id, driver.now);
    driver.pending.extend(actions);
    driver.settle();
    let default = default_status(&driver.state);
    assert_eq!((default.ready, default.leased), (1, 0));
    assert!(driver.drops.is_empty());
}

#[test]
fn losing_postgres_fails_waiters_and_marks_leases_lost() {
    let mut driver = Driver::new(pool(0, 1));
    driver.settle();
    let holder = driver.lease("default", 1000);
    let waiting = driver.lease("default", 1000);
    driver.settle();
    let grant = driver.grant_of(holder).expect("granted").clone();
    let actions = driver.state.server_lost("postmaster exited");
    driver.pending.extend(actions);
    driver.settle();
    assert!(matches!(
        driver.failures.as_slice(),
        [(w, LeaseError::PostgresDown(_))] if *w == waiting
    ));
    let (result, _) = driver.state.release(&grant.lease_id, false, driver.now);
    assert!(matches!(result, Err(LeaseOpError::Lost(_))));
    let refused = driver.lease("default", 1000);
    driver.settle();
    assert!(driver
        .failures
        .iter()
        .any(|(w, e)| *w == refused && matches!(e, LeaseError::PostgresDown(_))));
    // Back up: the wanted templates are rebuilt.
    let actions = driver.state.server_up(1000);
    assert!(actions
        .iter()
        .any(|a| matches!(a, Action::Build { template, .. } if template.as_str() == "default")));
}

#[test]
fn clone_failures_fail_waiters_and_pause_that_template() {
    let mut state = pool(1, 4);
    let now = Instant::now();
    let _ = state.server_up(1000);
    let default = TemplateName::default_name();
    let template_db = DbName::template(&default, "ff");
    let mut actions = state.build_finished(
        &default,
        SourceStamp::default(),
        Ok(built(&default, "ff")),
        now,
    );
    actions.extend(state.request_lease(7, LeaseId::random(0), &request("default", 1000), now));
    // min_ready 1 + one waiter: two clones in flight, at most clone_concurrency.
    let clones: Vec<DbName> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Clone { clone, .. } => Some(clone.clone()),
            _ => None,
        })
        .collect();
    assert!(!clones.is_empty());
    let actions = state.clone_finished(
        &default,
        &template_db,
        clones[0].clone(),
        Err(crate::sql_error::SqlError {
            kind: crate::sql_error::SqlErrorKind::DiskFull,
            sqlstate: Some("53100".into()),
            message: "could not write to file: No space left on device".into(),
        }),
        now,
    );
    // The waiter learns why, by kind (the API answers a full disk with 507).
    assert!(actions.iter().any(|a| matches!(
        a,
        Action::Fail {
            waiter: 7,
            error: LeaseError::CloneFailed {
                cause: crate::sql_error::SqlErrorKind::DiskFull,
                ..
            }
        }
    )));
    assert!(actions
        .iter()
        .any(|a| matches!(a, Action::Drop { db } if *db == clones[0])));
    assert!(
        !actions.iter().any(|a| matches!(a, Action::Clone { .. })),
        "paused"
    );
    for clone in &clones[1..] {
        let actions = state.clone_finished(
            &default,
            &template_db,
            clone.clone(),
            Err("disk full".into()),
            now,
        );
        assert!(
            !actions.iter().any(|a| matches!(a, Action::Clone { .. })),
            "still paused"
        );
    }
    let later = state.tick(now + CLONE_RETRY_DELAY);
    assert!(
        later.iter().any(|a| matches!(a, Action::Clone { .. })),
        "resumed"
    );
}

#[test]
fn stopping_refuses_new_requests() {
    let mut driver = Driver::new(pool(1, 2));
    driver.settle();
    let actions = driver.state.stopping();
    driver.pending.extend(actions);
    let waiter = driver.lease("default", 1000);
    driver.settle();
    assert!(matches!(
        driver.failures.as_slice(),
        [(w, LeaseError::ShuttingDown)] if *w == waiter
    ));
}

#[test]
fn a_rebuild_replaces_ready_clones_and_the_old_template() {
    let mut driver = Driver::new(pool(2, 10));
    driver.settle();
    let before = default_status(&driver.state);
    assert_eq!((before.version, before.ready), (1, 2));
    let old_fingerprint = before.fingerprint.clone().expect("built");
    let held = driver.lease("default", 1000);
    driver.settle();
    let held = driver.grant_of(held).expect("granted").clone();
    let ready_before: Vec<DbName> = driver.drops.clone();
    assert!(ready_before.is_empty());

    let actions = driver
        .state
        .rebuild(&TemplateName::default_name(), driver.now);
    driver.pending.extend(actions);
    driver.settle();
    let after = default_status(&driver.state);
    assert_eq!(after.version, 2);
    assert_ne!(after.fingerprint.as_deref(), Some(old_fingerprint.as_str()));
    assert_eq!(after.ready, 2, "refilled from the new version");
    // The two old ready clones and the old template database were dropped.
    let old_template = DbName::template(&TemplateName::default_name(), &old_fingerprint);
    assert!(driver.drops.contains(&old_template), "{:?}", driver.drops);
    assert_eq!(driver.drops.len(), 3, "{:?}", driver.drops);
    // The old version's leased clone is dropped on release, even with reuse.
    let (result, actions) = driver.state.release(&held.lease_id, true, driver.now);
    assert!(result.is_ok());
    assert!(actions
        .iter()
        .any(|a| matches!(a, Action::Drop { db } if *db == held.database)));
    assert!(!actions.iter().any(|a| matches!(a, Action::Recycle { .. })));
}

#[test]
fn a_clone_of_a_replaced_version_is_never_leased() {
    let mut state = pool(1, 4);
    let now = Instant::now();
    let default = TemplateName::default_name();
    let _ = state.server_up(1000);
    let actions = state.build_finished(
        &default,
        SourceStamp::default(),
        Ok(built(&default, "aa")),
        now,
    );
    let (old_db, clone) = actions
        .iter()
        .find_map(|a| match a {
            Action::Clone {
                template_db, clone, ..
            } => Some((template_db.clone(), clone.clone())),
            _ => None,
        })
        .expect("a clone of the first version");
    // The sources change while that clone is being made.
    let _ = state.rebuild(&default, now);
    let _ = state.build_finished(
        &default,
        SourceStamp::default(),
        Ok(built(&default, "bb")),
        now,
    );
    let actions = state.clone_finished(&default, &old_db, clone.clone(), Ok(made()), now);
    assert!(actions
        .iter()
        .any(|a| matches!(a, Action::Drop { db } if *db == clone)));
    let waiter = state.request_lease(9, LeaseId::random(0), &request("default", 1000), now);
    assert!(
        !waiter
            .iter()
            .any(|a| matches!(a, Action::Grant { grant, .. } if grant.database == clone)),
        "the stale clone must not be granted"
    );
}

/// Issue 27: a request that waits for a look at its template's sources is the state's
/// waiter: it counts, gets no clone of a version the look may replace, and is served once
/// the look ends — by the new version when the sources changed.
#[test]
fn a_request_waiting_for_a_source_check_is_served_after_it_and_by_the_new_version() {
    let mut state = pool(1, 4);
    let now = Instant::now();
    let default = TemplateName::default_name();
    let _ = state.server_up(1000);
    default_built_with_its_clones_ready(&mut state, now);
    assert!(state.begin_sources_check(&default));
    assert!(!state.begin_sources_check(&default), "one look at a time");
    let actions = state.request_lease(1, LeaseId::random(0), &request("default", 1000), now);
    assert!(
        !actions.iter().any(|a| matches!(a, Action::Grant { .. })),
        "no grant while the look runs: {actions:?}"
    );
    assert_eq!(default_status(&state).waiting, 1, "it shows");
    // The sources changed: a new version is built, and the waiter gets one of it.
    let actions = state.sources_checked(&default, true, SourceStamp::default(), "", now);
    assert!(
        actions.iter().any(|a| matches!(a, Action::Build { .. })),
        "{actions:?}"
    );
    assert!(!actions.iter().any(|a| matches!(a, Action::Grant { .. })));
    let actions = state.build_finished(
        &default,
        SourceStamp::default(),
        Ok(built(&default, "bb")),
        now,
    );
    let new_db = DbName::template(&default, "bb");
    let mut granted = None;
    for action in actions {
        if let Action::Clone {
            template_db, clone, ..
        } = action
        {
            assert_eq!(template_db, new_db);
            for action in state.clone_finished(&default, &template_db, clone, Ok(made()), now) {
                if let Action::Grant { waiter: 1, grant } = action {
                    granted = Some(grant);
                }
            }
        }
    }
    assert!(granted.is_some(), "the waiter is served by the new version");
}

#[test]
fn a_failed_rebuild_drops_the_stale_version_too() {
    let mut state = pool(0, 4);
    let now = Instant::now();
    let default = TemplateName::default_name();
    let _ = state.server_up(1000);
    let _ = state.build_finished(
        &default,
        SourceStamp::default(),
        Ok(built(&default, "aa")),
        now,
    );
    let _ = state.rebuild(&default, now);
    let actions = state.build_finished(
        &default,
        SourceStamp::default(),
        Err("002.sql: syntax error".into()),
        now,
    );
    let old = DbName::template(&default, "aa");
    assert!(actions
        .iter()
        .any(|a| matches!(a, Action::Drop { db } if *db == old)));
    assert_eq!(default_status(&state).state, "failed");
}

#[test]
fn leases_wait_while_their_connections_do_not_fit() {
    let mut state = pool(2, 10);
    let now = Instant::now();
    let default = TemplateName::default_name();
    let _ = state.server_up(25);
    let mut actions = state.build_finished(
        &default,
        SourceStamp::default(),
        Ok(built(&default, "aa")),
        now,
    );
    // Two ready clones appear.
    for action in std::mem::take(&mut actions) {
        if let Action::Clone {
            template,
            template_db,
            clone,
            ..
        } = action
        {
            actions.extend(state.clone_finished(&template, &template_db, clone, Ok(made()), now));
        }
    }
    let ask = |connections| LeaseRequest {
        template: TemplateName::default_name(),
        ttl: None,
        wait: Duration::from_secs(10),
        connections: Some(connections),
        reclaimable: false,
        postgres_version: None,
        label: None,
    };
    let granted = |actions: &[Action], waiter| {
        actions
            .iter()
            .any(|a| matches!(a, Action::Grant { waiter: w, .. } if *w == waiter))
    };
    // A lease of its own connection limit goes out once that limit is set.
    let first = state.request_lease(1, LeaseId::random(0), &ask(20), now);
    let first_id = first
        .iter()
        .find_map(|a| match a {
            Action::SetLimit { lease_id, .. } => Some(lease_id.clone()),
            _ => None,
        })
        .expect("a limit to set");
    assert!(!granted(&first, 1));
    assert!(granted(&state.limit_set(&first_id, Ok(()), now), 1));
    // 20 + 10 > 25: the second waits although a clone is ready.
    let second = state.request_lease(2, LeaseId::random(0), &ask(10), now);
    assert!(!granted(&second, 2));
    assert_eq!(default_status(&state).waiting, 1);
    // More than the whole budget can never fit: refused at once.
    let huge = state.request_lease(3, LeaseId::random(0), &ask(26), now);
    assert!(huge.iter().any(|a| matches!(
        a,
        Action::Fail {
            waiter: 3,
            error: LeaseError::TooManyConnections {
                requested: 26,
                budget: 25
            }
        }
    )));
    // Releasing the first frees its 20 connections: the second is served.
    let (result, actions) = state.release(&first_id, false, now);
    assert!(result.is_ok());
    assert!(granted(&actions, 2));
}

#[test]
fn a_byte_budget_evicts_what_nobody_waits_for_then_refuses_with_out_of_space() {
    // Every version is 7.5 MB (see `built`); the budget holds exactly four databases.
    let mut limits = limits(2, 10);
    limits.max_bytes = Some(4 * 7_500_000);
    let mut driver = Driver::new(pool_with(limits));
    driver.settle();
    // default: its template and two warm clones.
    assert_eq!(default_status(&driver.state).ready, 2);

    // app is built (4th database) and its first lease evicts a warm clone of default.
    let first = driver.lease("app", 1000);
    driver.settle();
    assert!(driver.grant_of(first).is_some());
    assert_eq!(
        default_status(&driver.state).ready,
        1,
        "one warm clone was evicted"
    );
    let second = driver.lease("app", 1000);
    driver.settle();
    assert!(driver.grant_of(second).is_some());
    assert_eq!(default_status(&driver.state).ready, 0, "the other one too");
    // Keeping default warm never evicts app's leases or template: nothing is refilled.
    assert_eq!(driver.state.bytes_in_use(), 4 * 7_500_000);

    // Nothing left to evict (default's template stays for /readyz): 507.
    let third = driver.lease("app", 1000);
    driver.settle();
    assert!(matches!(
        driver.failures.as_slice(),
        [(w, LeaseError::OutOfSpace { needed: 7_500_000, budget: 30_000_000, .. })] if *w == third
    ));
    // A release makes room again.
    let id = driver.grant_of(first).expect("granted").lease_id.clone();
    let (result, actions) = driver.state.release(&id, false, driver.now);
    assert!(result.is_ok());
    driver.pending.extend(actions);
    driver.settle();
    let fourth = driver.lease("app", 1000);
    driver.settle();
    assert!(driver.grant_of(fourth).is_some());
}

#[test]
fn on_a_store_whose_clones_share_blocks_the_budget_is_the_measured_usage() {
    // The same budget as above (four 7.5 MB databases by their logical size), but clones
    // share their template's blocks: the measured store usage decides, and a new clone
    // adds nothing to it.
    let mut limits = limits(2, 10);
    limits.max_bytes = Some(4 * 7_500_000);
    let mut driver = Driver::new(pool_with(limits));
    driver.state.store_usage(Some(25_000_000));
    driver.settle();
    assert_eq!(default_status(&driver.state).ready, 2);
    let leases: Vec<WaiterId> = (0..4).map(|_| driver.lease("app", 1000)).collect();
    driver.settle();
    for waiter in &leases {
        assert!(driver.grant_of(*waiter).is_some(), "{:?}", driver.failures);
    }
    assert!(driver.state.logical_bytes() > 4 * 7_500_000);
    assert_eq!(
        default_status(&driver.state).ready,
        2,
        "nothing was evicted for clones that take no room"
    );

    // Tests wrote past the budget: a request that needs a new clone gets 507, and nothing
    // is evicted on a stale figure.
    driver.state.store_usage(Some(31_000_000));
    let app_ready = driver
        .state
        .template_status()
        .into_iter()
        .find(|t| t.name.as_str() == "app")
        .map_or(0, |t| t.ready);
    for _ in 0..app_ready {
        let waiter = driver.lease("app", 1000);
        driver.settle();
        assert!(driver.grant_of(waiter).is_some());
    }
    let refused = driver.lease("app", 1000);
    driver.settle();
    assert!(
        matches!(driver.failures.as_slice(), [(w, LeaseError::OutOfSpace { .. })] if *w == refused),
        "{:?}",
        driver.failures
    );
    assert_eq!(default_status(&driver.state).ready, 2);

    // Room again once the store shrinks (their drops freed what they wrote).
    driver.state.store_usage(Some(10_000_000));
    let granted = driver.lease("app", 1000);
    driver.settle();
    assert!(driver.grant_of(granted).is_some(), "{:?}", driver.failures);
}

#[test]
fn a_failed_clone_of_a_replaced_version_does_not_fail_todays_waiters() {
    let mut state = pool(0, 4);
    let now = Instant::now();
    let default = TemplateName::default_name();
    let _ = state.server_up(1000);
    let _ = state.build_finished(
        &default,
        SourceStamp::default(),
        Ok(built(&default, "aa")),
        now,
    );
    let old_db = DbName::template(&default, "aa");
    let _ = state.rebuild(&default, now);
    let _ = state.build_finished(
        &default,
        SourceStamp::default(),
        Ok(built(&default, "bb")),
        now,
    );
    let parked = state.request_lease(8, LeaseId::random(0), &request("default", 1000), now);
    assert!(!parked.iter().any(|a| matches!(a, Action::Fail { .. })));
    // A clone of the old version fails because its template was dropped under it.
    let failed = state.clone_finished(
        &default,
        &old_db,
        DbName::clone_db("t1", 999),
        Err("template database does not exist".into()),
        now,
    );
    assert!(
        !failed.iter().any(|a| matches!(a, Action::Fail { .. })),
        "{failed:?}"
    );
    assert_eq!(
        default_status(&state).waiting,
        1,
        "the waiter still waits for the new version"
    );
}

// Client-built templates (the IntegreSQL API).

/// A lease request of the IntegreSQL API: reclaimable, waiting up to a minute.
fn test_request(hash: &str) -> LeaseRequest {
    LeaseRequest {
        reclaimable: true,
        postgres_version: None,
        label: None,
        ..request(hash, 60_000)
    }
}

/// Initializes `hash` and carries out the open.
fn initialize(driver: &mut Driver, hash: &str) -> Result<(), TemplateOpError> {
    let actions = driver.state.initialize(&name(hash), driver.now)?;
    driver.pending.extend(actions);
    driver.settle();
    Ok(())
}

fn finalize(driver: &mut Driver, hash: &str) {
    match driver.state.finalize(&name(hash)) {
        Ok(Finalize::Start(action)) => driver.pending.push(action),
        other => panic!("expected a finalize to start, got {other:?}"),
    }
    driver.settle();
}

#[test]
fn only_the_first_initializer_gets_a_client_template_and_getters_wait_for_finalize() {
    let mut driver = Driver::new(pool(2, 8));
    driver.settle();
    initialize(&mut driver, "abc123").expect("first initialize");
    assert!(matches!(
        initialize(&mut driver, "abc123"),
        Err(TemplateOpError::AlreadyInitialized(_))
    ));
    // A configured template counts as initialized too.
    assert!(matches!(
        initialize(&mut driver, "app"),
        Err(TemplateOpError::AlreadyInitialized(_))
    ));
    let first = driver.lease_with(&test_request("abc123"));
    let second = driver.lease_with(&test_request("abc123"));
    driver.settle();
    assert!(driver.grants.is_empty(), "no test database before finalize");
    finalize(&mut driver, "abc123");
    let numbers: Vec<u32> = [first, second]
        .iter()
        .map(|w| driver.grant_of(*w).expect("granted after finalize").number)
        .collect();
    assert_eq!(numbers, vec![0, 1]);
    // Finalizing again is fine; finalizing what nobody initialized is not.
    assert!(matches!(
        driver.state.finalize(&name("abc123")),
        Ok(Finalize::Done)
    ));
    assert!(matches!(
        driver.state.finalize(&name("nope")),
        Err(TemplateOpError::UnknownTemplate(_))
    ));
}

#[test]
fn discard_fails_waiting_and_later_getters_until_initialized_again() {
    let mut driver = Driver::new(pool(2, 8));
    driver.settle();
    initialize(&mut driver, "h1").expect("initialize");
    let waiting = driver.lease_with(&test_request("h1"));
    driver.settle();
    let actions = driver
        .state
        .discard(&name("h1"), driver.now)
        .expect("discard");
    driver.pending.extend(actions);
    driver.settle();
    assert!(driver
        .failures
        .iter()
        .any(|(w, e)| *w == waiting && matches!(e, LeaseError::Discarded(_))));
    let later = driver.lease_with(&test_request("h1"));
    driver.settle();
    assert!(driver
        .failures
        .iter()
        .any(|(w, e)| *w == later && matches!(e, LeaseError::Discarded(_))));
    // Its database went.
    assert!(driver.drops.iter().any(DbName::is_template));
    assert!(matches!(
        driver.state.discard(&name("h1"), driver.now),
        Err(TemplateOpError::UnknownTemplate(_))
    ));
    // A configured template cannot be discarded.
    assert!(matches!(
        driver.state.discard(&name("app"), driver.now),
        Err(TemplateOpError::NotClientBuilt(_))
    ));
    initialize(&mut driver, "h1").expect("initialize again");
    finalize(&mut driver, "h1");
    let again = driver.lease_with(&test_request("h1"));
    driver.settle();
    assert!(driver.grant_of(again).is_some());
}

#[test]
fn a_full_client_template_recreates_its_longest_held_test_database() {
    let mut driver = Driver::new(pool(0, 2));
    driver.settle();
    initialize(&mut driver, "full").expect("initialize");
    finalize(&mut driver, "full");
    let first = driver.lease_with(&test_request("full"));
    driver.settle();
    driver.now += Duration::from_millis(10);
    let second = driver.lease_with(&test_request("full"));
    driver.settle();
    let (first_db, second_db) = (
        driver.grant_of(first).expect("first").database.clone(),
        driver.grant_of(second).expect("second").database.clone(),
    );
    // Neither is given back; a third getter still gets one: the oldest is recreated.
    let third = driver.lease_with(&test_request("full"));
    driver.settle();
    let third_grant = driver.grant_of(third).expect("third granted").clone();
    assert!(driver.drops.contains(&first_db));
    assert!(!driver.drops.contains(&second_db));
    assert_ne!(third_grant.database, first_db);
    assert_eq!(third_grant.number, 2);
    assert!(matches!(
        driver.state.lease_by_number(&name("full"), 0),
        Err(TemplateOpError::UnknownTest { number: 0, .. })
    ));
    assert!(driver.state.lease_by_number(&name("full"), 1).is_ok());
    // Ordinary leases are never taken back: a full `app` makes requests wait.
    let mut driver = Driver::new(pool(0, 1));
    let held = driver.lease("app", 60_000);
    let blocked = driver.lease("app", 60_000);
    driver.settle();
    assert!(driver.grant_of(held).is_some());
    assert!(driver.grant_of(blocked).is_none());
}

/// IntegreSQL's clients never say when a test is done with its database: of the test
/// databases a full template may recreate, one seen without a session goes before an older
/// one a test may still be using, and one held too briefly to have been connected to does
/// not count as idle.
#[test]
fn a_full_client_template_recreates_a_test_database_seen_without_a_session_first() {
    let mut driver = Driver::new(pool(0, 3));
    driver.settle();
    initialize(&mut driver, "full").expect("initialize");
    finalize(&mut driver, "full");
    let mut grants = Vec::new();
    for _ in 0..3 {
        let waiter = driver.lease_with(&test_request("full"));
        driver.settle();
        grants.push(driver.grant_of(waiter).expect("granted").clone());
        driver.now += Duration::from_secs(1);
    }
    let [running, ended, starting] = [&grants[0], &grants[1], &grants[2]];
    // A look, now: the oldest has a session; the two others none, but the newest was
    // granted a second ago and its client may not have connected yet.
    let seen: Vec<(LeaseId, DbName, bool)> = grants
        .iter()
        .map(|g| {
            (
                g.lease_id.clone(),
                g.database.clone(),
                g.lease_id == running.lease_id,
            )
        })
        .collect();
    driver.state.lease_sessions(&seen, driver.now);
    let fourth = driver.lease_with(&test_request("full"));
    driver.settle();
    assert!(driver.grant_of(fourth).is_some(), "room was made");
    assert!(driver.drops.contains(&ended.database), "{:?}", driver.drops);
    assert!(
        !driver.drops.contains(&running.database),
        "the running test kept its database"
    );
    assert!(!driver.drops.contains(&starting.database));
    // With none seen idle, the longest-held goes, as before.
    let fifth = driver.lease_with(&test_request("full"));
    driver.settle();
    assert!(driver.grant_of(fifth).is_some());
    assert!(driver.drops.contains(&running.database));
}

/// The same choice when the connection budget, not the template's size, makes the room.
#[test]
fn the_connection_budget_reclaims_a_test_database_seen_without_a_session_first() {
    let (mut driver, held) = budget_full_of_test_databases();
    let grants: Vec<_> = held
        .iter()
        .map(|w| driver.grant_of(*w).expect("granted").clone())
        .collect();
    driver.now += STARTING_GRACE;
    let seen: Vec<(LeaseId, DbName, bool)> = grants
        .iter()
        .enumerate()
        .map(|(i, g)| (g.lease_id.clone(), g.database.clone(), i != 1))
        .collect();
    driver.state.lease_sessions(&seen, driver.now);
    let next = driver.lease_with(&test_request("bbb222"));
    driver.settle();
    assert!(driver.grant_of(next).is_some());
    assert!(
        driver.drops.contains(&grants[1].database),
        "{:?}",
        driver.drops
    );
    assert!(
        !driver.drops.contains(&grants[0].database),
        "the oldest is in use"
    );
}

#[test]
fn a_lease_of_a_discarded_version_never_joins_the_new_one() {
    let mut driver = Driver::new(pool(0, 8));
    driver.settle();
    initialize(&mut driver, "v").expect("initialize");
    finalize(&mut driver, "v");
    let old = driver.lease_with(&test_request("v"));
    driver.settle();
    let old_grant = driver.grant_of(old).expect("granted").clone();
    let actions = driver
        .state
        .discard(&name("v"), driver.now)
        .expect("discard");
    driver.pending.extend(actions);
    initialize(&mut driver, "v").expect("initialize again");
    finalize(&mut driver, "v");
    // Given back "unchanged": it was cloned from the discarded version, so it is dropped.
    let (result, actions) = driver.state.release(&old_grant.lease_id, true, driver.now);
    result.expect("released");
    driver.pending.extend(actions);
    driver.settle();
    assert!(driver.drops.contains(&old_grant.database));
    // Its client gave its id back: the new version's first test database gets it.
    let new = driver.lease_with(&test_request("v"));
    driver.settle();
    let new = driver.grant_of(new).expect("granted");
    assert_eq!(new.number, old_grant.number);
    assert_ne!(new.database, old_grant.database);
}

#[test]
fn client_templates_go_with_their_server() {
    let mut driver = Driver::new(pool(1, 8));
    driver.settle();
    initialize(&mut driver, "gone").expect("initialize");
    let waiting = driver.lease_with(&test_request("gone"));
    driver.settle();
    let actions = driver.state.server_lost("postgres died");
    driver.pending.extend(actions);
    driver.settle();
    assert!(driver.failures.iter().any(|(w, _)| *w == waiting));
    let actions = driver.state.server_up(1000);
    driver.pending.extend(actions);
    driver.settle();
    assert!(matches!(
        driver.state.finalize(&name("gone")),
        Err(TemplateOpError::UnknownTemplate(_))
    ));
    initialize(&mut driver, "gone").expect("initialized anew");
}

// Refilling ahead of demand.

/// Leases `count` databases of `default` one after the other and releases each (with or
/// without `reuse`), clones taking 100 ms; returns the template's counts at the end.
fn churn(reuse: bool, count: usize) -> TemplateStatus {
    let mut driver = Driver::new(pool(1, 32));
    driver.clone_duration = Duration::from_millis(100);
    driver.settle();
    for _ in 0..count {
        let waiter = driver.lease("default", 1000);
        driver.settle();
        let id = driver.grant_of(waiter).expect("granted").lease_id.clone();
        let (result, actions) = driver.state.release(&id, reuse, driver.now);
        result.expect("released");
        driver.pending.extend(actions);
        driver.settle();
    }
    default_status(&driver.state)
}

#[test]
fn a_pool_whose_clones_are_used_up_fast_keeps_more_ready() {
    let status = churn(false, 20);
    assert!(
        status.ready >= 2,
        "a database used up every 100 ms while clones take 100 ms: more than min_ready \
         should be ready, got {}",
        status.ready
    );
    assert!(
        status.ready + status.leased + status.in_progress <= 32,
        "max_total holds"
    );
}

#[test]
fn a_pool_whose_clones_come_back_keeps_min_ready() {
    let status = churn(true, 20);
    // min_ready's one, plus the one that came back after a replacement was made while it
    // was out; no more: reused databases use nothing up.
    assert_eq!(status.ready, 2);
}

#[test]
fn demand_counts_what_is_used_up_within_its_window() {
    let mut demand = demand::Demand::default();
    let start = Instant::now();
    assert_eq!(demand.ahead(start), 0, "no clone time known yet");
    demand.cloned(Duration::from_millis(100));
    for _ in 0..20 {
        demand.taken(start);
    }
    // 20 in the 2 s window: 10/s; two clone times of 100 ms: 2 clones.
    assert_eq!(demand.ahead(start), 2);
    for _ in 0..10 {
        demand.returned(start);
    }
    assert_eq!(demand.ahead(start), 1);
    // Old events are forgotten.
    assert_eq!(demand.ahead(start + Duration::from_secs(3)), 0);
}

#[test]
fn the_integresql_side_reaches_neither_configured_templates_nor_native_leases() {
    let mut driver = Driver::new(pool(1, 8));
    driver.settle();
    // A native lease of a configured template gets a number too…
    let native = driver.lease_with(&request("default", 1000));
    driver.settle();
    let number = driver.grant_of(native).expect("native lease").number;
    // …but the IntegreSQL API (no token on its port) can neither give it back nor
    // recreate it, nor lease from a configured template itself.
    assert!(matches!(
        driver
            .state
            .lease_by_number(&TemplateName::default_name(), number),
        Err(TemplateOpError::UnknownTest { .. })
    ));
    let compat = driver.lease_with(&test_request("default"));
    driver.settle();
    assert!(driver.grant_of(compat).is_none());
    assert!(matches!(
        driver.failures.last(),
        Some((waiter, LeaseError::UnknownTemplate { .. })) if *waiter == compat
    ));
    // Its own test databases it does reach.
    initialize(&mut driver, "c0ffee").expect("initialize");
    finalize(&mut driver, "c0ffee");
    let test = driver.lease_with(&test_request("c0ffee"));
    driver.settle();
    let number = driver.grant_of(test).expect("test database").number;
    assert!(driver
        .state
        .lease_by_number(&name("c0ffee"), number)
        .is_ok());
}

#[test]
fn a_failed_reopen_keeps_the_numbers_of_an_earlier_versions_open_test_databases() {
    let mut driver = Driver::new(pool(0, 8));
    driver.settle();
    initialize(&mut driver, "feed").expect("initialize");
    finalize(&mut driver, "feed");
    let old = driver.lease_with(&test_request("feed"));
    driver.settle();
    let old_number = driver.grant_of(old).expect("test database").number;
    let now = driver.now;
    driver
        .pending
        .extend(driver.state.discard(&name("feed"), now).expect("discard"));
    driver.settle();
    // Initialized again, but making its database fails.
    let opened = driver.state.initialize(&name("feed"), now);
    let Ok([Action::OpenTemplate { db, .. }]) = opened.as_deref() else {
        panic!("expected an open");
    };
    let db = db.clone();
    let (result, actions) =
        driver
            .state
            .template_opened(&name("feed"), db, Err("disk full".into()), now);
    assert!(result.is_err());
    driver.pending.extend(actions);
    driver.settle();
    // The next version numbers on from the old one's lease, which is still found.
    initialize(&mut driver, "feed").expect("initialize again");
    finalize(&mut driver, "feed");
    let new = driver.lease_with(&test_request("feed"));
    driver.settle();
    let new_number = driver.grant_of(new).expect("test database").number;
    assert_ne!(new_number, old_number, "a number handed out twice");
    assert!(driver
        .state
        .lease_by_number(&name("feed"), old_number)
        .is_ok());
}

#[test]
fn a_kept_client_template_whose_name_is_now_configured_is_dropped() {
    let mut driver = Driver::new(pool(0, 8));
    driver.settle();
    let kept = DbName::template(&name("app"), "0123abcd");
    assert!(!driver.state.restore_client_built(&name("app"), &kept));
    // Dropped at the next dispatch, like any database nobody owns.
    driver.lease_with(&request("default", 1000));
    driver.settle();
    assert!(driver.drops.contains(&kept), "{:?}", driver.drops);
}

/// Found by the interleaving test: a grant whose connection limit was being set while its
/// client-built template was discarded and initialized again must still be answered (it
/// used to be parked on the discarded entry, which the new initialization replaced).
#[test]
fn a_grant_held_for_its_limit_is_answered_after_its_template_is_discarded_and_reinitialized() {
    let mut driver = Driver::new(pool(1, 8));
    driver.settle();
    initialize(&mut driver, "abc123").expect("initialize");
    finalize(&mut driver, "abc123");
    let waiter = driver.next_waiter;
    driver.next_waiter += 1;
    let request = LeaseRequest {
        connections: Some(20),
        ..test_request("abc123")
    };
    let actions = driver
        .state
        .request_lease(waiter, LeaseId::random(0), &request, driver.now);
    let lease_id = actions
        .iter()
        .find_map(|a| match a {
            Action::SetLimit { lease_id, .. } => Some(lease_id.clone()),
            _ => None,
        })
        .expect("the limit is set first");
    let actions = driver
        .state
        .discard(&name("abc123"), driver.now)
        .expect("discard");
    driver.pending.extend(actions);
    driver.settle();
    let actions = driver.state.limit_set(&lease_id, Ok(()), driver.now);
    driver.pending.extend(actions);
    driver.settle();
    initialize(&mut driver, "abc123").expect("initialize again");
    driver.now += Duration::from_secs(61);
    let actions = driver.state.tick(driver.now);
    driver.pending.extend(actions);
    driver.settle();
    assert!(
        driver.failures.iter().any(|(w, _)| *w == waiter) || driver.grant_of(waiter).is_some(),
        "the request is answered"
    );
}

// Budgets shared with client-built templates (issue 18).

/// A pool with room for three default leases' connections in all.
fn small_budget_driver() -> Driver {
    let mut driver = Driver::with_budget(pool(1, 8), 30);
    driver.settle();
    driver
}

/// Client-built templates `aaa111` and `bbb222` on a small budget, which three test
/// databases of `aaa111` fill (IntegreSQL clients never give them back).
fn budget_full_of_test_databases() -> (Driver, Vec<WaiterId>) {
    let mut driver = small_budget_driver();
    for hash in ["aaa111", "bbb222"] {
        initialize(&mut driver, hash).expect("initialize");
        finalize(&mut driver, hash);
    }
    let held: Vec<WaiterId> = (0..3)
        .map(|_| driver.lease_with(&test_request("aaa111")))
        .collect();
    driver.settle();
    (driver, held)
}

#[test]
fn a_request_kept_from_a_ready_clone_by_the_connection_budget_reclaims_the_oldest_integresql_lease()
{
    let (mut driver, held) = budget_full_of_test_databases();
    let oldest = driver.grant_of(held[0]).expect("granted").clone();
    let next = driver.lease_with(&test_request("bbb222"));
    driver.settle();
    assert!(
        driver.grant_of(next).is_some(),
        "served at once, not after a silent wait"
    );
    assert!(driver.drops.contains(&oldest.database), "the oldest went");
    let (result, _) = driver.state.release(&oldest.lease_id, false, driver.now);
    assert!(matches!(result, Err(LeaseOpError::Lost(_))));
    assert_eq!(driver.state.limit_status().reclaimed, 1);
}

#[test]
fn a_request_the_connection_budget_keeps_waiting_times_out_naming_that_budget() {
    let mut driver = small_budget_driver();
    for _ in 0..3 {
        driver.lease("default", 1000);
    }
    driver.settle();
    let late = driver.lease("default", 500);
    driver.settle();
    assert_eq!(
        default_status(&driver.state).blocked_by,
        Some("connection_budget")
    );
    driver.now += Duration::from_millis(500);
    let actions = driver.state.tick(driver.now);
    driver.pending.extend(actions);
    driver.settle();
    let (waiter, error) = driver.failures.last().expect("a failure");
    assert_eq!(*waiter, late);
    assert!(
        matches!(
            error,
            LeaseError::TimedOut {
                blocked_by: crate::error::Blocked::ConnectionBudget {
                    in_use: 30,
                    budget: 30,
                    leases: 3,
                    ..
                },
                ..
            }
        ),
        "{error}"
    );
    assert!(error.to_string().contains("connection budget"), "{error}");
    assert_eq!(driver.state.limit_status().refused.connection_budget, 1);
}

#[test]
fn an_initialization_nobody_finalizes_is_discarded_after_the_initialize_timeout() {
    let mut driver = Driver::new(pool(1, 8));
    driver.settle();
    initialize(&mut driver, "abc123").expect("initialize");
    let getter = driver.lease_with(&LeaseRequest {
        wait: Duration::from_secs(3600),
        ..test_request("abc123")
    });
    driver.settle();
    assert_eq!(
        driver.state.next_deadline(),
        Some(driver.now + Duration::from_secs(900)),
        "the tick comes when the initialization is abandoned"
    );
    driver.now += Duration::from_secs(899);
    let actions = driver.state.tick(driver.now);
    driver.pending.extend(actions);
    driver.settle();
    let status = driver.state.status_of(&name("abc123")).expect("status");
    assert_eq!(status.state, "migrating");
    driver.now += Duration::from_secs(1);
    let actions = driver.state.tick(driver.now);
    driver.pending.extend(actions);
    driver.settle();
    let status = driver.state.status_of(&name("abc123")).expect("status");
    assert_eq!(status.state, "discarded");
    assert!(matches!(
        driver.failures.as_slice(),
        [(w, LeaseError::Discarded(_))] if *w == getter
    ));
    assert_eq!(driver.state.limit_status().abandoned, 1);
    // A client may initialize it again.
    initialize(&mut driver, "abc123").expect("initialize again");
}

#[test]
fn a_lease_held_back_for_its_connection_limit_lives_its_whole_ttl_from_handover() {
    let mut driver = Driver::new(pool(1, 4));
    driver.settle();
    let request = LeaseRequest {
        connections: Some(20),
        ..request("default", 1000)
    };
    let actions = driver
        .state
        .request_lease(1, LeaseId::random(0), &request, driver.now);
    let lease_id = actions
        .iter()
        .find_map(|a| match a {
            Action::SetLimit { lease_id, .. } => Some(lease_id.clone()),
            _ => None,
        })
        .expect("the limit is set first");
    // The limit job takes a while (a loaded server).
    driver.now += Duration::from_secs(30);
    let actions = driver.state.limit_set(&lease_id, Ok(()), driver.now);
    assert!(actions
        .iter()
        .any(|a| matches!(a, Action::Grant { grant, .. } if grant.ttl == Duration::from_secs(60))));
    assert_eq!(
        driver.state.next_deadline(),
        Some(driver.now + Duration::from_secs(60)),
        "the ttl counts from the handover"
    );
}

#[test]
fn a_failed_recycle_replaces_the_database_and_its_waiter_keeps_waiting() {
    let mut driver = Driver::new(pool(0, 1));
    driver.settle();
    let first = driver.lease("default", 10_000);
    driver.settle();
    let first_id = driver.grant_of(first).expect("granted").lease_id.clone();
    let waiting = driver.lease("default", 10_000);
    driver.settle();
    assert!(driver.grant_of(waiting).is_none(), "max_total 1 is taken");
    let (result, actions) = driver.state.release(&first_id, true, driver.now);
    assert!(result.is_ok());
    // The recycle fails (say a login is stuck in authentication); the rest runs as usual.
    let mut recycled = None;
    for action in actions {
        match action {
            Action::Recycle {
                template,
                template_db,
                clone,
                ..
            } => {
                let more = driver.state.clone_finished(
                    &template,
                    &template_db,
                    clone.clone(),
                    Err("a login is stuck in authentication".into()),
                    driver.now,
                );
                driver.pending.extend(more);
                recycled = Some(clone);
            }
            other => driver.pending.push(other),
        }
    }
    let recycled = recycled.expect("a reuse release recycles");
    driver.settle();
    assert!(driver.drops.contains(&recycled), "the database is dropped");
    assert!(driver.failures.is_empty(), "{:?}", driver.failures);
    let grant = driver.grant_of(waiting).expect("served by the replacement");
    assert_ne!(grant.database, recycled);
    assert_eq!(default_status(&driver.state).last_error, None);
}

/// A lease of `default` granted and delivered.
fn granted(driver: &mut Driver) -> Grant {
    let waiter = driver.lease("default", 1000);
    driver.settle();
    driver.grant_of(waiter).expect("granted").clone()
}

#[test]
fn a_kept_database_outlives_its_lease_until_its_keep_ends() {
    let mut driver = Driver::new(pool(1, 4));
    driver.settle();
    let grant = granted(&mut driver);
    let (kept_for, actions) =
        driver
            .state
            .keep(&grant.lease_id, Duration::from_secs(30), driver.now);
    assert_eq!(kept_for.expect("kept"), Duration::from_secs(30));
    driver.pending.extend(actions);
    driver.settle();
    assert!(driver.drops.is_empty(), "nothing dropped yet");
    let kept = driver.state.kept_list();
    assert_eq!(kept.len(), 1);
    assert_eq!(
        (&kept[0].id, &kept[0].database),
        (&grant.lease_id, &grant.database)
    );
    // The lease itself is over, and it holds no place among the template's clones.
    let (again, _) = driver.state.release(&grant.lease_id, false, driver.now);
    assert!(matches!(again, Err(LeaseOpError::NotFound(_))));
    assert_eq!(default_status(&driver.state).leased, 0);
    assert_eq!(
        driver.state.next_deadline(),
        Some(driver.now + Duration::from_secs(30))
    );
    driver.now += Duration::from_secs(31);
    let actions = driver.state.tick(driver.now);
    driver.pending.extend(actions);
    driver.settle();
    assert_eq!(driver.drops, vec![grant.database]);
    assert!(driver.state.kept_list().is_empty());
    let (gone, _) = driver.state.drop_kept(&grant.lease_id, driver.now);
    assert!(matches!(gone, Err(LeaseOpError::NotKept(_))));
}

#[test]
fn a_keep_is_bounded_in_time_and_in_number() {
    // `limits` keeps at most 2 databases for at most 300 s.
    let mut driver = Driver::new(pool(1, 8));
    driver.settle();
    let grants: Vec<Grant> = (0..3).map(|_| granted(&mut driver)).collect();
    for (n, grant) in grants.iter().enumerate() {
        driver.now += Duration::from_secs(1);
        let (kept_for, actions) =
            driver
                .state
                .keep(&grant.lease_id, Duration::from_secs(86_400), driver.now);
        assert_eq!(kept_for.expect("kept"), Duration::from_secs(300), "#{n}");
        driver.pending.extend(actions);
        driver.settle();
    }
    assert_eq!(
        driver.drops,
        vec![grants[0].database.clone()],
        "the oldest goes"
    );
    let ids: Vec<LeaseId> = driver.state.kept_list().into_iter().map(|k| k.id).collect();
    assert_eq!(
        ids,
        [grants[1].lease_id.clone(), grants[2].lease_id.clone()]
    );
    let (dropped, actions) = driver.state.drop_kept(&grants[2].lease_id, driver.now);
    dropped.expect("dropped on request");
    driver.pending.extend(actions);
    driver.settle();
    assert!(driver.drops.contains(&grants[2].database));
}

#[test]
fn kept_databases_are_evicted_first_when_a_clone_needs_room() {
    // Every version is 7.5 MB (see `built`); the budget holds four databases.
    let mut limits = limits(1, 10);
    limits.max_bytes = Some(4 * 7_500_000);
    let mut driver = Driver::new(pool_with(limits));
    driver.settle();
    // default's template, a kept database and a warm clone: three of four.
    let grant = granted(&mut driver);
    let (kept, actions) = driver
        .state
        .keep(&grant.lease_id, Duration::from_secs(60), driver.now);
    kept.expect("kept");
    driver.pending.extend(actions);
    driver.settle();
    assert_eq!(default_status(&driver.state).ready, 1);
    // app's template is the fourth; its clone needs room: the kept database goes, not
    // default's warm clone.
    let waiter = driver.lease("app", 1000);
    driver.settle();
    assert!(driver.grant_of(waiter).is_some());
    assert!(driver.drops.contains(&grant.database), "{:?}", driver.drops);
    assert!(driver.state.kept_list().is_empty());
    assert_eq!(default_status(&driver.state).ready, 1);
}

#[test]
fn an_unlocked_test_database_comes_back_under_its_id_before_any_other() {
    let mut driver = Driver::new(pool(2, 8));
    driver.settle();
    initialize(&mut driver, "abc123").expect("initialize");
    finalize(&mut driver, "abc123");
    driver.settle();
    let first = driver.lease_with(&test_request("abc123"));
    let second = driver.lease_with(&test_request("abc123"));
    driver.settle();
    let grant = |driver: &Driver, waiter| driver.grant_of(waiter).expect("granted").clone();
    let (first, second) = (grant(&driver, first), grant(&driver, second));
    assert_eq!((first.number, second.number), (0, 1));
    // Test 0 unlocked (given back unchanged): recycled, then first in line under id 0.
    let (released, actions) = driver.state.release(&first.lease_id, true, driver.now);
    released.expect("released");
    driver.pending.extend(actions);
    driver.settle();
    let again = driver.lease_with(&test_request("abc123"));
    driver.settle();
    let again = grant(&driver, again);
    assert_eq!(
        (again.number, &again.database),
        (0, &first.database),
        "the same database under the same id"
    );
    // Recreated (dropped and replaced): its id goes to the replacement, as IntegreSQL
    // recreates a test database under the same id.
    let (released, actions) = driver.state.release(&second.lease_id, false, driver.now);
    released.expect("released");
    driver.pending.extend(actions);
    driver.settle();
    assert!(driver.drops.contains(&second.database), "dropped");
    let fresh = driver.lease_with(&test_request("abc123"));
    driver.settle();
    let fresh = grant(&driver, fresh);
    assert_eq!(fresh.number, 1, "the recreated id is handed out again");
    assert_ne!(fresh.database, second.database);
    // The native API may lease from the same template: it gets the database first in
    // line (the unlocked one), not its id, which goes to the next IntegreSQL getter.
    let (released, actions) = driver.state.release(&again.lease_id, true, driver.now);
    released.expect("released");
    driver.pending.extend(actions);
    driver.settle();
    let native = driver.lease("abc123", 1000);
    driver.settle();
    let native = grant(&driver, native);
    assert_eq!(
        native.database, first.database,
        "the recycled one is first in line"
    );
    assert!(
        ![0, 1].contains(&native.number),
        "a native lease takes no test id ({})",
        native.number
    );
    let test = driver.lease_with(&test_request("abc123"));
    driver.settle();
    let test = grant(&driver, test);
    assert_eq!(test.number, 0, "the id the native lease freed");
    assert_ne!(test.database, first.database);
}

#[test]
fn a_test_id_whose_client_may_still_hold_it_is_never_handed_out_again() {
    let mut driver = Driver::new(pool(1, 8));
    driver.settle();
    initialize(&mut driver, "abc123").expect("initialize");
    finalize(&mut driver, "abc123");
    let expired = driver.lease_with(&test_request("abc123"));
    driver.settle();
    let expired = driver.grant_of(expired).expect("granted").clone();
    // Its lease runs out; its client, who never gave it back, is not told.
    driver.now += Duration::from_secs(61);
    let actions = driver.state.tick(driver.now);
    driver.pending.extend(actions);
    driver.settle();
    let held = driver.lease_with(&test_request("abc123"));
    driver.settle();
    let held = driver.grant_of(held).expect("granted").clone();
    assert_ne!(
        held.number, expired.number,
        "an expired test's id is retired"
    );
    // The reset forgets the template; its clients are not told either.
    let actions = driver
        .state
        .discard_all_client_built(driver.now)
        .expect("reset");
    driver.pending.extend(actions);
    driver.settle();
    initialize(&mut driver, "abc123").expect("initialize again");
    finalize(&mut driver, "abc123");
    let next = driver.lease_with(&test_request("abc123"));
    driver.settle();
    let next = driver.grant_of(next).expect("granted").clone();
    assert!(
        ![expired.number, held.number].contains(&next.number),
        "test id {} handed out again while a client may hold it",
        next.number
    );
    // An unlock by the old holder reaches nobody else's database.
    for number in [expired.number, held.number] {
        assert!(matches!(
            driver.state.lease_by_number(&name("abc123"), number),
            Err(TemplateOpError::UnknownTest { .. })
        ));
    }
}

#[test]
fn the_reset_drops_the_kept_databases_of_client_templates() {
    let mut driver = Driver::new(pool(1, 8));
    driver.settle();
    initialize(&mut driver, "abc123").expect("initialize");
    finalize(&mut driver, "abc123");
    let test = driver.lease_with(&test_request("abc123"));
    driver.settle();
    let test = driver.grant_of(test).expect("granted").clone();
    let (kept, actions) = driver
        .state
        .keep(&test.lease_id, Duration::from_secs(60), driver.now);
    kept.expect("kept");
    driver.pending.extend(actions);
    driver.settle();
    // "Every template and test database dropped": a kept one too, not left without its
    // template (the invariants, checked at every step of `settle`, would say so).
    let actions = driver
        .state
        .discard_all_client_built(driver.now)
        .expect("reset");
    driver.pending.extend(actions);
    driver.settle();
    assert!(driver.state.kept_list().is_empty());
    assert!(driver.drops.contains(&test.database));
}

/// docs/security.md, "an IntegreSQL client": the role of a template a client builds may
/// hold a lease's connections until it is finalized, so they count against the budget; an
/// initialize the budget has no room for is refused, and a finalize gives them back.
#[test]
fn client_built_templates_count_against_the_connection_budget_until_finalized() {
    let mut driver = small_budget_driver();
    for hash in ["first", "second", "third"] {
        initialize(&mut driver, hash).expect("room for three");
    }
    assert_eq!(driver.state.limit_status().connections_in_use, 30);
    match initialize(&mut driver, "fourth") {
        Err(TemplateOpError::TooManyConnections {
            needed: 10,
            in_use: 30,
            budget: 30,
        }) => {}
        other => panic!("expected TooManyConnections, got {other:?}"),
    }
    // No lease fits beside them: it waits for the budget.
    let waiting = driver.lease("default", 1000);
    driver.settle();
    assert!(driver.grant_of(waiting).is_none());
    assert_eq!(
        default_status(&driver.state).blocked_by,
        Some("connection_budget")
    );
    // A finalized template's role holds nothing: the waiting lease gets its connections.
    finalize(&mut driver, "first");
    let actions = driver.state.tick(driver.now);
    driver.pending.extend(actions);
    driver.settle();
    assert!(driver.grant_of(waiting).is_some());
    assert_eq!(driver.state.limit_status().connections_in_use, 30);
}

/// IntegreSQL's clients never give their test databases back and expect the server to
/// recycle them when it is full: an initialize the budget has no room for recreates the
/// longest-held of those first, and is refused only when that is not enough.
#[test]
fn an_initialize_recreates_test_databases_nobody_gave_back_for_its_connections() {
    let mut driver = small_budget_driver();
    initialize(&mut driver, "feed").expect("room");
    finalize(&mut driver, "feed");
    let first = driver.lease_with(&test_request("feed"));
    let second = driver.lease_with(&test_request("feed"));
    driver.settle();
    assert!(driver.grant_of(first).is_some() && driver.grant_of(second).is_some());
    initialize(&mut driver, "other").expect("room beside two test databases");
    assert_eq!(driver.state.limit_status().connections_in_use, 30);
    initialize(&mut driver, "third").expect("the oldest test database makes room");
    assert_eq!(driver.state.limit_status().reclaimed, 1);
    initialize(&mut driver, "fourth").expect("the other one makes room");
    assert_eq!(driver.state.limit_status().reclaimed, 2);
    assert!(matches!(
        initialize(&mut driver, "fifth"),
        Err(TemplateOpError::TooManyConnections { in_use: 30, .. })
    ));
    assert_eq!(driver.state.limit_status().reclaimed, 2);
}

#[test]
fn a_configured_template_whose_sources_are_missing_holds_readiness_until_it_is_built() {
    let mut state = pool(1, 4);
    state.sources_unusable(
        &name("app"),
        "cannot read migrations directory /src/migratoins".into(),
        SourceStamp::default(),
    );
    let actions = state.server_up(1000);
    // Not built at start (it is not wanted), and not retried by the server coming up.
    assert!(actions
        .iter()
        .all(|a| !matches!(a, Action::Build { template, .. } if *template == name("app"))));
    let now = Instant::now();
    let _ = state.build_finished(
        &TemplateName::default_name(),
        SourceStamp::default(),
        Ok(built(&TemplateName::default_name(), "d1")),
        now,
    );
    let readiness = state.readiness();
    assert!(!readiness.is_ready());
    assert!(readiness.is_serving());
    assert_eq!(
        readiness.failed_templates,
        vec![(
            name("app"),
            "cannot read migrations directory /src/migratoins".to_owned()
        )]
    );
    assert!(state.has_failed(&name("app")));
    // Its sources changed (the actor saw their stamp move): built again, and ready only
    // once that build succeeds.
    let actions = state.rebuild(&name("app"), now);
    assert!(actions
        .iter()
        .any(|a| matches!(a, Action::Build { template, .. } if *template == name("app"))));
    let readiness = state.readiness();
    assert!(readiness.failed_templates.is_empty());
    assert_eq!(readiness.building_templates, vec![name("app")]);
    assert!(!readiness.is_ready());
    let _ = state.build_finished(
        &name("app"),
        SourceStamp::default(),
        Ok(built(&name("app"), "a1")),
        now,
    );
    assert!(state.readiness().is_ready(), "{:?}", state.readiness());
}

#[test]
fn with_prebuild_readiness_waits_for_every_configured_template_and_fails_with_a_build() {
    let templates = vec![TemplateConfig {
        name: name("app"),
        source: TemplateSource::Migrations(PathBuf::from("migrations")),
        postgres_version: None,
    }];
    let mut state = PoolState::new(limits(1, 4), "t1".into(), &templates, true);
    let _ = state.server_up(1000);
    let now = Instant::now();
    let _ = state.build_finished(
        &TemplateName::default_name(),
        SourceStamp::default(),
        Ok(built(&TemplateName::default_name(), "d1")),
        now,
    );
    assert_eq!(state.readiness().building_templates, vec![name("app")]);
    let _ = state.build_finished(
        &name("app"),
        SourceStamp::default(),
        Err("001.sql: syntax error".into()),
        now,
    );
    let readiness = state.readiness();
    assert_eq!(
        readiness.failed_templates,
        vec![(name("app"), "001.sql: syntax error".to_owned())]
    );
    assert!(readiness
        .reason()
        .is_some_and(|r| r.contains("template app cannot be built: 001.sql: syntax error")));
    // A template registered over HTTP does not hold readiness, failed or not.
    let source = TemplateSource::Migrations(PathBuf::from("other"));
    let _ = state.register(name("adhoc"), source, Changer::Anyone, now);
    let _ = state.request_lease(1, LeaseId::random(0), &request("adhoc", 1000), now);
    let _ = state.build_finished(
        &name("adhoc"),
        SourceStamp::default(),
        Err("broken".into()),
        now,
    );
    assert_eq!(state.readiness().failed_templates.len(), 1);
}

/// Issue 27: the server's history is the state's (the actor kept it beside it).
#[test]
fn the_server_history_counts_losses_and_keeps_the_last_reason() {
    let mut state = pool(1, 4);
    let _ = state.server_up(1000);
    assert_eq!(state.server_history(), (0, None));
    let _ = state.server_lost("postgres exited unexpectedly (signal 9)");
    let now = Instant::now();
    state.server_start_failed(
        "could not bind to port".into(),
        now + Duration::from_secs(5),
    );
    assert!(!state.restart_due(now), "not before its time");
    assert!(state.restart_due(now + Duration::from_secs(5)));
    assert!(
        !state.restart_due(now + Duration::from_secs(6)),
        "one try per failure"
    );
    let _ = state.server_up(1000);
    assert_eq!(state.server_history(), (1, Some("could not bind to port")));
    let _ = state.stopping();
    assert!(state.is_stopping() && !state.server_is_up());
}

/// What a clone job reports of a clone it made (no stamp: the proof is not under test).
/// Under `--reuse-unchanged`, where every test writes: clones are stamped for the proof
/// until a template's last sixteen proofs all found changes, then one in eight is; a release
/// of an unstamped clone drops it at once, with no proof run.
#[test]
fn clones_of_a_template_whose_tests_all_write_are_rarely_stamped() {
    let mut limits = limits(1, 4);
    limits.reuse_unchanged = true;
    let mut driver = Driver::new(pool_with(limits));
    driver.proofs_find_changes = true;
    driver.settle();
    let mut released = Vec::new();
    for _ in 0..40 {
        let waiter = driver.lease("default", 1000);
        driver.settle();
        let grant = driver.grant_of(waiter).expect("granted").clone();
        let (result, actions) = driver.state.release(&grant.lease_id, false, driver.now);
        result.expect("released");
        driver.pending.extend(actions);
        driver.settle();
        released.push(driver.stamped[&grant.database]);
    }
    assert_eq!(driver.failures.len(), 0);
    assert!(
        released[..16].iter().all(|s| *s),
        "stamped until sixteen proofs say so: {released:?}"
    );
    // Every release of a stamped clone was put to the proof, and no other.
    assert_eq!(driver.proofs, released.iter().filter(|s| **s).count());
    let later = released[17..].iter().filter(|s| **s).count();
    assert!(
        (2..=4).contains(&later),
        "one in eight stamped once only writers show: {released:?}"
    );
    assert_eq!(driver.drops.len(), 40, "every written clone dropped");
}

fn made() -> super::Made {
    super::Made {
        password: "secret".into(),
        stamp: None,
    }
}

#[test]
fn a_lost_server_starts_a_new_generation_and_forgets_its_probe() {
    let mut state = pool(1, 4);
    let _ = state.server_up(1000);
    let first = state.generation();
    assert!(
        state.begin_probe(),
        "the monitor closed: a second look starts"
    );
    assert!(!state.begin_probe(), "one look at a time");
    state.probe_ended(Err("connection refused".into()));
    assert_eq!(state.probe_failure(), Some("connection refused"));
    let _ = state.server_lost("the connection to postgres was lost");
    assert!(
        state.generation() > first,
        "reports of the lost server are stale"
    );
    assert_eq!(
        state.probe_failure(),
        None,
        "the new server is not suspected"
    );
    let _ = state.server_up(1000);
    assert!(state.begin_probe(), "the new server gets a look of its own");
    state.probe_ended(Ok(()));
    assert_eq!(state.probe_failure(), None);
}

#[test]
fn a_full_databases_tmpfs_is_told_once_named_and_forgotten_with_its_server() {
    let mut state = pool(1, 4);
    let _ = state.server_up(1000);
    state.space_at(Some(PathBuf::from("/instance/data/base")));
    assert!(!state.space_measured(100, 50), "half free is not full");
    assert!(
        state.space_measured(100, 1),
        "the step to full asks what filled it"
    );
    assert!(!state.space_measured(100, 1), "once per filling");
    let _ = state.space_filled(
        Ok(vec![("template1".into(), 10), ("pglease_x".into(), 90)]),
        std::time::SystemTime::UNIX_EPOCH,
        Instant::now(),
    );
    let space = state.space_status().expect("watched");
    assert!(space.full);
    let filled_by = space.filled_by.expect("named");
    assert_eq!(filled_by.database.as_str(), "pglease_x");
    assert_eq!(filled_by.bytes, 90);
    assert!(!state.space_measured(100, 4), "not room again below 5%");
    assert!(state.space_status().is_some_and(|s| s.full));
    assert!(!state.space_measured(100, 6));
    let space = state.space_status().expect("watched");
    assert!(!space.full, "room again");
    assert!(space.filled_by.is_none(), "nothing fills it now");
    assert_eq!(
        space
            .last_filled_by
            .map(|f| f.database.to_string())
            .as_deref(),
        Some("pglease_x"),
        "what last filled it is still named after room came back"
    );
    let _ = state.server_lost("postgres exited");
    assert!(state.space_status().is_none(), "gone with its server");
    state.space_at(Some(PathBuf::from("/instance/data/base")));
    assert_eq!(
        state
            .space_status()
            .and_then(|s| s.last_filled_by)
            .map(|f| f.database.to_string())
            .as_deref(),
        Some("pglease_x"),
        "and after a restart"
    );
}

/// A pool whose leases may each grow to `limit` bytes.
fn pool_with_lease_max_bytes(limit: crate::config::LeaseMaxBytes) -> Driver {
    let mut driver = Driver::new(pool_with(PoolLimits {
        lease_max_bytes: limit,
        ..limits(2, 8)
    }));
    driver.settle();
    driver
}

/// Two leases of `default`, granted.
fn two_leases(driver: &mut Driver) -> (Grant, Grant) {
    let first = driver.lease("default", 1000);
    let second = driver.lease("default", 1000);
    driver.settle();
    (
        driver.grant_of(first).expect("granted").clone(),
        driver.grant_of(second).expect("granted").clone(),
    )
}

#[test]
fn a_leased_database_past_lease_max_bytes_is_ended_and_its_holder_told_why() {
    let mut driver = pool_with_lease_max_bytes(crate::config::LeaseMaxBytes::Bytes(100));
    let (filler, bystander) = two_leases(&mut driver);
    let mut measured = driver.state.leases_to_measure();
    measured.sort();
    let mut expected = vec![
        (filler.lease_id.clone(), filler.database.clone()),
        (bystander.lease_id.clone(), bystander.database.clone()),
    ];
    expected.sort();
    assert_eq!(measured, expected, "every open lease is measured");
    let at = std::time::SystemTime::UNIX_EPOCH;
    let actions = driver.state.lease_sizes(
        &[
            (filler.lease_id.clone(), filler.database.clone(), 101),
            (bystander.lease_id.clone(), bystander.database.clone(), 100),
        ],
        at,
        driver.now,
    );
    driver.pending.extend(actions);
    driver.settle();
    assert_eq!(
        driver.drops,
        vec![filler.database.clone()],
        "the filler's database is dropped (which ends its sessions), the bystander's not"
    );
    let told = |error: LeaseOpError| match error {
        LeaseOpError::ExceededMaxBytes {
            id,
            database,
            bytes,
            limit,
        } => {
            assert_eq!(id, filler.lease_id.to_string());
            assert_eq!(database, filler.database.to_string());
            assert_eq!((bytes, limit), (101, 100));
        }
        other => panic!("told {other:?}"),
    };
    told(
        driver
            .state
            .renew(&filler.lease_id, None, driver.now)
            .expect_err("renewing an ended lease"),
    );
    let (released, _) = driver.state.release(&filler.lease_id, false, driver.now);
    told(released.expect_err("releasing an ended lease"));
    let (kept, _) = driver
        .state
        .keep(&filler.lease_id, Duration::from_secs(60), driver.now);
    told(kept.expect_err("keeping an ended lease"));
    assert!(driver
        .state
        .renew(&bystander.lease_id, None, driver.now)
        .is_ok());
    let limits = driver.state.limit_status();
    assert_eq!(limits.lease_max_bytes, Some(100));
    assert_eq!(limits.exceeded_max_bytes, 1);
    let last = limits.last_exceeded_max_bytes.expect("named");
    assert_eq!(last.database, filler.database);
    assert_eq!(last.lease_id, filler.lease_id);
    assert_eq!((last.bytes, last.limit), (101, 100));
}

#[test]
fn lease_max_bytes_spares_what_is_under_it_ended_or_handed_to_another() {
    let mut driver = pool_with_lease_max_bytes(crate::config::LeaseMaxBytes::Bytes(100));
    let (released, kept) = two_leases(&mut driver);
    let (result, actions) = driver.state.release(&released.lease_id, false, driver.now);
    result.expect("released");
    driver.pending.extend(actions);
    let (result, actions) = driver
        .state
        .keep(&kept.lease_id, Duration::from_secs(60), driver.now);
    result.expect("kept");
    driver.pending.extend(actions);
    driver.settle();
    assert!(driver.state.leases_to_measure().is_empty());
    let drops_before = driver.drops.clone();
    // Sizes measured while they were leased arrive after the release and the keep.
    let actions = driver.state.lease_sizes(
        &[
            (released.lease_id.clone(), released.database.clone(), 500),
            (kept.lease_id.clone(), kept.database.clone(), 500),
        ],
        std::time::SystemTime::UNIX_EPOCH,
        driver.now,
    );
    assert!(actions.is_empty(), "{actions:?}");
    driver.settle();
    assert_eq!(driver.drops, drops_before, "nothing more is dropped");
    assert_eq!(driver.state.kept_list().len(), 1, "the kept database stays");
    let (result, _) = driver.state.release(&released.lease_id, false, driver.now);
    assert!(
        matches!(result, Err(LeaseOpError::NotFound(_))),
        "{result:?}"
    );
    // A database handed to another lease is not judged by the old lease's measure.
    let next = driver.lease("default", 1000);
    driver.settle();
    let next = driver.grant_of(next).expect("granted").clone();
    let actions = driver.state.lease_sizes(
        &[(kept.lease_id.clone(), next.database.clone(), 500)],
        std::time::SystemTime::UNIX_EPOCH,
        driver.now,
    );
    assert!(actions.is_empty(), "{actions:?}");
    assert!(driver.state.renew(&next.lease_id, None, driver.now).is_ok());
    assert_eq!(driver.state.limit_status().exceeded_max_bytes, 0);
}

#[test]
fn lease_max_bytes_off_ends_nothing_and_measures_nothing() {
    for limit in [
        crate::config::LeaseMaxBytes::Off,
        // Derived from the databases' tmpfs, which this server has none of.
        crate::config::LeaseMaxBytes::Auto,
    ] {
        let mut driver = pool_with_lease_max_bytes(limit);
        let (lease, _) = two_leases(&mut driver);
        assert!(driver.state.leases_to_measure().is_empty(), "{limit:?}");
        assert_eq!(driver.state.lease_max_bytes(), None);
        let actions = driver.state.lease_sizes(
            &[(lease.lease_id.clone(), lease.database.clone(), u64::MAX)],
            std::time::SystemTime::UNIX_EPOCH,
            driver.now,
        );
        assert!(actions.is_empty(), "{limit:?}: {actions:?}");
        assert!(driver
            .state
            .renew(&lease.lease_id, None, driver.now)
            .is_ok());
    }
}

#[test]
fn lease_max_bytes_defaults_to_a_share_of_the_databases_tmpfs_and_a_full_one_ends_its_filler() {
    use crate::config::LeaseMaxBytes;
    assert_eq!(LeaseMaxBytes::derived(0), None, "not measured yet");
    assert_eq!(LeaseMaxBytes::derived(8 << 30), Some(2 << 30), "a quarter");
    assert_eq!(
        LeaseMaxBytes::derived(600 << 20),
        Some(256 << 20),
        "at least 256M"
    );
    assert_eq!(
        LeaseMaxBytes::derived(200 << 20),
        Some(100 << 20),
        "but never more than half"
    );
    let mut driver = pool_with_lease_max_bytes(LeaseMaxBytes::Auto);
    let (filler, bystander) = two_leases(&mut driver);
    driver
        .state
        .space_at(Some(PathBuf::from("/instance/data/base")));
    assert_eq!(driver.state.lease_max_bytes(), None, "not measured yet");
    assert!(driver.state.space_measured(200 << 20, 1 << 20), "full");
    assert_eq!(driver.state.lease_max_bytes(), Some(100 << 20));
    assert_eq!(driver.state.leases_to_measure().len(), 2);
    // The step to full brings every database's size: the filler is ended at once.
    let actions = driver.state.space_filled(
        Ok(vec![
            (filler.database.to_string(), 180 << 20),
            (bystander.database.to_string(), 8 << 20),
        ]),
        std::time::SystemTime::UNIX_EPOCH,
        driver.now,
    );
    driver.pending.extend(actions);
    driver.settle();
    assert_eq!(driver.drops, vec![filler.database.clone()]);
    assert!(matches!(
        driver.state.renew(&filler.lease_id, None, driver.now),
        Err(LeaseOpError::ExceededMaxBytes { .. })
    ));
    assert!(driver
        .state
        .renew(&bystander.lease_id, None, driver.now)
        .is_ok());
    let space = driver.state.space_status().expect("watched");
    assert_eq!(
        space.filled_by.map(|f| f.database),
        Some(filler.database.clone())
    );
}

#[test]
fn a_connection_limit_that_fails_for_a_full_disk_tells_the_caller_so() {
    let mut state = pool(1, 10);
    let now = Instant::now();
    let _ = state.server_up(100);
    default_built_with_its_clones_ready(&mut state, now);
    let own_limit = LeaseRequest {
        connections: Some(3),
        ..request("default", 1000)
    };
    let set = state.request_lease(1, LeaseId::random(0), &own_limit, now);
    let lease_id = set
        .iter()
        .find_map(|a| match a {
            Action::SetLimit { lease_id, .. } => Some(lease_id.clone()),
            _ => None,
        })
        .expect("a limit to set");
    let full = crate::sql_error::SqlError {
        kind: crate::sql_error::SqlErrorKind::DiskFull,
        sqlstate: Some("53100".into()),
        message: "could not extend file: No space left on device".into(),
    };
    let failed = state.limit_set(&lease_id, Err(full), now);
    let cause = failed.iter().find_map(|a| match a {
        Action::Fail {
            waiter: 1,
            error: LeaseError::CloneFailed { cause, .. },
        } => Some(*cause),
        _ => None,
    });
    assert_eq!(
        cause,
        Some(crate::sql_error::SqlErrorKind::DiskFull),
        "{failed:?}"
    );
}

/// Builds `default` (version "aa") on a server that is up, and finishes the clones that
/// build starts: its ready queue is full.
fn default_built_with_its_clones_ready(state: &mut PoolState, now: Instant) {
    let default = TemplateName::default_name();
    let actions = state.build_finished(
        &default,
        SourceStamp::default(),
        Ok(built(&default, "aa")),
        now,
    );
    for action in actions {
        if let Action::Clone {
            template_db, clone, ..
        } = action
        {
            let _ = state.clone_finished(&default, &template_db, clone, Ok(made()), now);
        }
    }
}

/// Issue 41: a template the operator defined is changed only by the configuration and a
/// holder of the API's token; a caller the API cannot tell apart from anybody else gets
/// `ConfiguredTemplate` for a new source, the same source, and a rebuild, and the source
/// stays the operator's.
#[test]
fn only_the_configuration_and_token_holders_change_the_operators_templates() {
    let mut state = pool(1, 4);
    let _ = state.server_up(1000);
    let now = Instant::now();
    let operators = TemplateSource::Migrations(PathBuf::from("migrations"));
    let evil = TemplateSource::SqlFile(PathBuf::from("/tmp/evil.sql"));
    for source in [evil.clone(), operators.clone()] {
        match state.register(name("app"), source, Changer::Anyone, now) {
            Err(LeaseError::ConfiguredTemplate(template)) => assert_eq!(template, name("app")),
            other => panic!("anybody changed the operator's template: {other:?}"),
        }
    }
    assert_eq!(state.source_of(&name("app")), Some(operators.clone()));
    assert!(matches!(
        state.request_rebuild(&name("app"), Changer::Anyone, now),
        Err(LeaseError::ConfiguredTemplate(_))
    ));
    assert!(matches!(
        state.request_rebuild(&TemplateName::default_name(), Changer::Anyone, now),
        Err(LeaseError::ConfiguredTemplate(_))
    ));

    let (registered, _) = state
        .register(name("app"), evil.clone(), Changer::TokenHolder, now)
        .expect("a token holder may");
    assert_eq!(registered, Registered::Replaced);
    assert_eq!(state.source_of(&name("app")), Some(evil.clone()));
    assert!(state
        .request_rebuild(&name("app"), Changer::TokenHolder, now)
        .is_ok());
    // A token holder's new source does not make the template anybody's.
    assert!(matches!(
        state.register(name("app"), operators, Changer::Anyone, now),
        Err(LeaseError::ConfiguredTemplate(_))
    ));
}

/// A template registered over HTTP stays anybody's, even one a token holder registered:
/// without a token every caller may replace and rebuild it.
#[test]
fn templates_registered_over_http_stay_replaceable_by_any_caller() {
    let mut state = pool(1, 4);
    let _ = state.server_up(1000);
    let now = Instant::now();
    for first in [Changer::Anyone, Changer::TokenHolder] {
        let template = name(&format!("adhoc_{first:?}").to_lowercase());
        let one = TemplateSource::SqlFile(PathBuf::from("/tmp/one.sql"));
        let two = TemplateSource::SqlFile(PathBuf::from("/tmp/two.sql"));
        let (created, _) = state
            .register(template.clone(), one, first, now)
            .expect("registered");
        assert_eq!(created, Registered::Created);
        let (replaced, _) = state
            .register(template.clone(), two.clone(), Changer::Anyone, now)
            .expect("anybody replaces it");
        assert_eq!(replaced, Registered::Replaced);
        assert_eq!(state.source_of(&template), Some(two));
        assert!(state
            .request_rebuild(&template, Changer::Anyone, now)
            .is_ok());
    }
}

/// A template the configuration registers at start (one naming the primary's major) is the
/// operator's like one given to the pool at its start: nobody without the token changes it,
/// and readiness waits on it.
#[test]
fn a_template_the_configuration_registers_is_the_operators() {
    let mut state = pool(1, 4);
    let _ = state.server_up(1000);
    let now = Instant::now();
    let source = TemplateSource::Migrations(PathBuf::from("versioned"));
    let _ = state
        .register(name("versioned"), source, Changer::Configuration, now)
        .expect("registered");
    assert!(matches!(
        state.register(
            name("versioned"),
            TemplateSource::Empty,
            Changer::Anyone,
            now
        ),
        Err(LeaseError::ConfiguredTemplate(_))
    ));
    let _ = state.request_lease(1, LeaseId::random(0), &request("versioned", 1000), now);
    let _ = state.build_finished(
        &name("versioned"),
        SourceStamp::default(),
        Err("broken".into()),
        now,
    );
    assert_eq!(
        state.readiness().failed_templates,
        vec![(name("versioned"), "broken".to_owned())]
    );
}

/// A client-built template's `CREATE DATABASE` that meets someone else's database of its
/// IntegreSQL name (42P04: a real IntegreSQL's on an external server, made since the
/// start) leaves that database alone, and the next initialize takes another name.
#[test]
fn a_create_that_meets_someone_elses_database_neither_drops_it_nor_takes_its_name_again() {
    let mut driver = Driver::new(pool(0, 8).with_integresql_names(true));
    driver.settle();
    let now = driver.now;
    let opened = driver.state.initialize(&name("feed"), now);
    let Ok([Action::OpenTemplate { db, .. }]) = opened.as_deref() else {
        panic!("expected an open");
    };
    let theirs = db.clone();
    assert_eq!(theirs.as_str(), "integresql_template_feed");
    let exists = SqlError {
        kind: crate::sql_error::SqlErrorKind::Other,
        sqlstate: Some("42P04".into()),
        message: "database \"integresql_template_feed\" already exists".into(),
    };
    let (result, actions) =
        driver
            .state
            .template_opened(&name("feed"), theirs.clone(), Err(exists), now);
    assert!(result.is_err());
    driver.pending.extend(actions);
    driver.settle();
    assert!(!driver.drops.contains(&theirs), "{:?}", driver.drops);
    let opened = driver.state.initialize(&name("feed"), now);
    let Ok([Action::OpenTemplate { db, .. }]) = opened.as_deref() else {
        panic!("expected an open");
    };
    assert_ne!(*db, theirs);
}

/// A template discarded while its database is being made keeps that name taken until the
/// job reports: initialized again at once, it gets another name, so the old job's report
/// (and the drop it queues) cannot be taken for the new one's.
#[test]
fn a_template_discarded_while_opening_does_not_give_its_name_to_the_next_initialize() {
    let mut driver = Driver::new(pool(0, 8).with_integresql_names(true));
    driver.settle();
    let now = driver.now;
    let opened = driver.state.initialize(&name("beef"), now);
    let Ok([Action::OpenTemplate { db, .. }]) = opened.as_deref() else {
        panic!("expected an open");
    };
    let first = db.clone();
    driver
        .pending
        .extend(driver.state.discard(&name("beef"), now).expect("discard"));
    let opened = driver.state.initialize(&name("beef"), now);
    let Ok([Action::OpenTemplate { db, .. }]) = opened.as_deref() else {
        panic!("expected an open");
    };
    let second = db.clone();
    assert_ne!(first, second);
    // The first job reports: its database goes, the new one stays the template's.
    let (result, actions) = driver
        .state
        .template_opened(&name("beef"), first.clone(), Ok(()), now);
    assert!(result.is_err());
    driver.pending.extend(actions);
    driver.settle();
    assert!(driver.drops.contains(&first), "{:?}", driver.drops);
    assert!(!driver.drops.contains(&second), "{:?}", driver.drops);
}
