//! The release of a lease a session took alone, as a guard the session owns from the moment
//! the pool grants the lease. The normal close hands it over ([`LeaseGuard::release`]): the
//! lease is released as an HTTP release without `reuse` is, and the pool's answer awaited.
//! Any other end of the session — a panic that unwinds its task, the task aborted, a path
//! that forgot the release — drops the guard, which spawns the same release on the runtime
//! and logs that the session ended without its normal close.
//!
//! A key's lease is not here: it belongs to the key (`keys.rs`), and a session holds only
//! its membership (`keys::Member`), whose drop is the key's own guard — the key releases
//! its lease a grace after its last member has gone, whichever way each went.

use pglease_pool::{LeaseId, Servers};

/// A lease the session took alone; released when dropped unless [`LeaseGuard::release`]
/// released it first.
#[derive(Debug)]
pub(crate) struct LeaseGuard {
    servers: Servers,
    /// The lease, until the pool has answered its release.
    id: Option<LeaseId>,
}

impl LeaseGuard {
    /// Guards `id`, a lease the pool of `servers` has just granted.
    pub(crate) fn new(servers: Servers, id: LeaseId) -> Self {
        LeaseGuard {
            servers,
            id: Some(id),
        }
    }

    /// The normal close: releases the lease and waits for the pool's answer. The guard
    /// forgets the lease only once the pool has answered, so a session aborted while it
    /// waits still releases it on drop; the pool answers a second release of one id "not
    /// found" and touches nothing else, since ids are never handed out again.
    pub(crate) async fn release(mut self) {
        let Some(id) = self.id.clone() else {
            return;
        };
        if let Err(error) = self.servers.release(id.clone(), false).await {
            tracing::warn!(lease_id = %id, %error, "releasing a lease of the PostgreSQL front failed");
        }
        self.id = None;
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else {
            return;
        };
        tracing::warn!(lease_id = %id, "a session at the PostgreSQL front ended without its normal close; releasing its lease");
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime: the daemon is stopping, and its pools end every lease; a lease
            // left over is reclaimed by its time to live.
            return;
        };
        let servers = self.servers.clone();
        runtime.spawn(async move {
            if let Err(error) = servers.release(id.clone(), false).await {
                tracing::debug!(lease_id = %id, %error, "a dropped session's lease was gone");
            }
        });
    }
}
