//! [`Keys`]: the table of keyed leases (`keys/table.rs`) behind one lock, and the side
//! effects its actions ask for: a grace timer per grace, one renewal task per held lease
//! (however many connections use it), the releases through the pool, and waking the
//! connections that wait for a key's lease. A connection holds a [`Member`]; dropping it
//! leaves the key, on every path out of the session, so it is the key's release guard.
//!
//! The lock is a plain mutex held for no await: the table decides, this file carries out,
//! and the pool is called with the lock released.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use pglease_pool::{Lease, LeaseId, Servers};
use tokio::sync::Notify;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::table::{Action, Begin, Granted, Joined, Keyed, ReleaseNow, Why};
use super::{KeyError, KeyName, KeyReport, SEPARATOR};
use crate::error::{Refusal, SessionError};

/// The shortest wait between two renewals of a key's lease.
const MIN_RENEW_INTERVAL: Duration = Duration::from_secs(1);

/// The keys in use.
#[derive(Debug)]
pub(crate) struct Keys {
    servers: Servers,
    inner: Mutex<Inner>,
    /// Told whenever a key's lease is made, fails, or its maker leaves.
    changed: Notify,
}

#[derive(Debug)]
struct Inner {
    table: Keyed,
    /// The renewal task of each slot that holds a lease.
    renewers: HashMap<u64, AbortHandle>,
}

/// A release the table asked for, carried out with the lock released.
type Release = (KeyName, Lease, Why);

impl Keys {
    pub(crate) fn new(servers: Servers, grace: Duration) -> Self {
        Keys {
            servers,
            inner: Mutex::new(Inner {
                table: Keyed::new(grace),
                renewers: HashMap::new(),
            }),
            changed: Notify::new(),
        }
    }

    /// A connection to `name` joins its key; it leaves when the result is dropped.
    pub(crate) fn join(self: &Arc<Self>, name: KeyName) -> Member {
        let joined = self.lock().table.join(&name);
        Member {
            keys: Arc::clone(self),
            name,
            joined,
        }
    }

    /// Releases a key's lease now; its connections are ended with it.
    pub(crate) async fn release(self: &Arc<Self>, name: &str) -> Result<LeaseId, KeyError> {
        let key = match KeyName::parse(name) {
            Ok((_, Some(key))) => key,
            Ok((_, None)) => {
                return Err(KeyError::Invalid {
                    name: name.to_owned(),
                    reason: format!("no \"{SEPARATOR}\" and key"),
                })
            }
            Err(reason) => {
                return Err(KeyError::Invalid {
                    name: name.to_owned(),
                    reason,
                })
            }
        };
        loop {
            // Registered before the table is read, so that no wake-up falls between.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let released = {
                let mut inner = self.lock();
                match inner.table.release_now(&key) {
                    ReleaseNow::Released(id, actions) => {
                        Some((id, self.apply(&mut inner, actions)))
                    }
                    ReleaseNow::NotFound => return Err(KeyError::NotFound(name.to_owned())),
                    // A connection making the lease now finishes first.
                    ReleaseNow::Making => None,
                }
            };
            match released {
                Some((id, releases)) => {
                    self.carry_out(releases).await;
                    return Ok(id);
                }
                None => changed.await,
            }
        }
    }

    /// Every key in use, by name.
    pub(crate) fn report(&self) -> Vec<KeyReport> {
        self.lock().table.report(Instant::now(), SystemTime::now())
    }

    /// Carries out the table's actions but the releases, which it returns for the caller
    /// to await with the lock released.
    fn apply(self: &Arc<Self>, inner: &mut Inner, actions: Vec<Action>) -> Vec<Release> {
        // In debug builds (and so in every test run), the table's promises are checked
        // after every event; a broken one stops the front loudly rather than share a
        // database it should not.
        if cfg!(debug_assertions) {
            if let Err(broken) = inner.table.check_invariants() {
                panic!("the keys' table broke a promise: {broken}");
            }
        }
        let mut releases = Vec::new();
        // No runtime: the daemon is stopping, and its pools end every lease.
        let runtime = tokio::runtime::Handle::try_current().ok();
        for action in actions {
            match action {
                Action::ArmGrace { name, slot, at } => {
                    if let Some(runtime) = &runtime {
                        let keys = Arc::clone(self);
                        runtime.spawn(async move { keys.expire(name, slot, at).await });
                    }
                }
                Action::StartRenew { name, slot, lease } => {
                    if let Some(runtime) = &runtime {
                        let keys = Arc::clone(self);
                        let task =
                            runtime.spawn(async move { keys.renew(name, slot, lease).await });
                        if let Some(old) = inner.renewers.insert(slot, task.abort_handle()) {
                            old.abort();
                        }
                    }
                }
                Action::StopRenew { slot } => {
                    if let Some(task) = inner.renewers.remove(&slot) {
                        task.abort();
                    }
                }
                Action::Release { name, lease, why } => releases.push((name, lease, why)),
                Action::Wake => self.changed.notify_waiters(),
            }
        }
        releases
    }

    /// Releases leases through the pool, as an HTTP release without `reuse` is.
    async fn carry_out(&self, releases: Vec<Release>) {
        for (name, lease, why) in releases {
            let why = why.words();
            match self.servers.release(lease.id.clone(), false).await {
                Ok(()) => {
                    tracing::info!(key = %name, lease_id = %lease.id, "released the lease of a key {why}")
                }
                // Released or expired meanwhile: nothing is left to do.
                Err(error) => {
                    tracing::debug!(key = %name, lease_id = %lease.id, %error, "a key's lease was gone")
                }
            }
        }
    }

    /// A grace timer: at `at`, the key's lease is released if nobody joined since.
    async fn expire(self: Arc<Self>, name: KeyName, slot: u64, at: Instant) {
        tokio::time::sleep_until(at).await;
        let releases = {
            let mut inner = self.lock();
            let actions = inner.table.grace_expired(&name, slot, Instant::now());
            self.apply(&mut inner, actions)
        };
        self.carry_out(releases).await;
    }

    /// The key's one renewal task: renews its lease whenever half of its time to live has
    /// passed, until the table stops it (the lease released) or the pool says the lease is
    /// gone (released by its id, expired), which the table then forgets.
    async fn renew(self: Arc<Self>, name: KeyName, slot: u64, lease: Lease) {
        let mut expires_at = lease.expires_at;
        loop {
            let left = expires_at
                .duration_since(SystemTime::now())
                .unwrap_or_default();
            tokio::time::sleep((left / 2).max(MIN_RENEW_INTERVAL)).await;
            match self.servers.renew(lease.id.clone(), None).await {
                Ok(renewed) => {
                    expires_at = renewed;
                    self.lock().table.renewed(&name, slot, &lease.id, renewed);
                }
                Err(error) => {
                    tracing::debug!(key = %name, lease_id = %lease.id, %error, "a key's lease cannot be renewed");
                    self.lost(&name, slot, &lease.id);
                    return;
                }
            }
        }
    }

    /// The pool says a key's lease is gone.
    fn lost(self: &Arc<Self>, name: &KeyName, slot: u64, id: &LeaseId) {
        let mut inner = self.lock();
        let actions = inner.table.lease_lost(name, slot, id);
        // Nothing to release: the pool has ended the lease already.
        let releases = self.apply(&mut inner, actions);
        debug_assert!(releases.is_empty(), "a lost lease is not released again");
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A connection's membership of a key; dropping it leaves the key.
#[derive(Debug)]
pub(crate) struct Member {
    keys: Arc<Keys>,
    name: KeyName,
    joined: Joined,
}

impl Member {
    /// The key's lease: the one it holds if the pool still has it (renewed now, as the
    /// connection that joins will use it for a while), else a new one from `make`. The
    /// key's connections wait here for the one making it, so a key has one lease at a time.
    pub(crate) async fn lease(
        &self,
        make: impl Future<Output = Result<Lease, SessionError>>,
    ) -> Result<Lease, SessionError> {
        let keys = &self.keys;
        loop {
            let changed = keys.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let begin = keys.lock().table.begin(&self.name, self.joined);
            match begin {
                Begin::Use(mut lease) => match keys.servers.renew(lease.id.clone(), None).await {
                    Ok(expires_at) => {
                        keys.lock().table.renewed(
                            &self.name,
                            self.joined.slot,
                            &lease.id,
                            expires_at,
                        );
                        lease.expires_at = expires_at;
                        return Ok(*lease);
                    }
                    // Released by its id over HTTP, or expired: the key gets a new one.
                    Err(error) => {
                        tracing::info!(key = %self.name, lease_id = %lease.id, %error, "a key's lease has ended; leasing anew");
                        keys.lost(&self.name, self.joined.slot, &lease.id);
                    }
                },
                Begin::Make => break,
                Begin::Wait => changed.await,
                Begin::Released => return Err(self.released()),
            }
        }
        let made = make.await;
        let orphan = {
            let mut inner = keys.lock();
            match &made {
                Ok(lease) => match inner.table.leased(&self.name, self.joined, lease.clone()) {
                    Granted::Held(actions) => {
                        keys.apply(&mut inner, actions);
                        None
                    }
                    Granted::Orphan(actions) => Some(keys.apply(&mut inner, actions)),
                },
                Err(_) => {
                    let actions = inner.table.lease_failed(&self.name, self.joined);
                    keys.apply(&mut inner, actions);
                    None
                }
            }
        };
        match orphan {
            Some(releases) => {
                keys.carry_out(releases).await;
                Err(self.released())
            }
            None => made,
        }
    }

    /// What a member of a key released over HTTP is told.
    fn released(&self) -> SessionError {
        // admin_shutdown: what postgres says to a connection an administrator ends.
        SessionError::Refused(Refusal::new(
            "57P01",
            format!(
                "the lease of key \"{}\" was released (DELETE /front/keys); connect again for a new one",
                self.name
            ),
        ))
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let mut inner = self.keys.lock();
        let actions = inner.table.leave(&self.name, self.joined, Instant::now());
        // Leaving starts a grace at most; it releases nothing by itself.
        let releases = self.keys.apply(&mut inner, actions);
        debug_assert!(
            releases.is_empty(),
            "leaving a key releases nothing at once"
        );
    }
}
