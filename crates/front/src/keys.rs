//! Sharing a lease by key: every connection to database `<template>.<key>` gets the same
//! lease while any of them is open, for suites whose connection pool opens several
//! connections per test. The lease is released a grace after the last of them closes
//! (a pool that closes and reopens a connection keeps its database), or at once by
//! `DELETE /front/keys/<template>.<key>` ([`crate::FrontHandle::release_key`]).
//!
//! The table is the one owner of which keys exist and how many connections each has; a
//! key's lease sits behind an async lock of its own, so that the connections that arrive
//! together wait for the first one's lease instead of each taking one.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use pglease_pool::{DbName, Lease, LeaseId, Servers, TemplateName};

use crate::error::SessionError;

/// The character between the template and the key in a database name. Template names
/// cannot contain it, and every URL parser takes it as part of the path: `.` is unreserved
/// in RFC 3986. Not `@`, which looks natural but SQLAlchemy's URL parser reads
/// `postgresql://u@host:5481/app@k` as user `u@host`, password `5481/app`, host `k`.
pub const SEPARATOR: char = '.';
/// Longest key, in characters.
const MAX_KEY_CHARS: usize = 128;

/// A key: the template and the caller's key, written `<template>.<key>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KeyName {
    /// The template the shared lease is a clone of.
    pub template: TemplateName,
    key: String,
}

impl KeyName {
    /// Splits a database name: `app` is the template alone (`Ok(None)`), `app.k` is a key.
    pub fn parse(database: &str) -> Result<(TemplateName, Option<KeyName>), String> {
        let (template, key) = match database.split_once(SEPARATOR) {
            Some((template, key)) => (template, Some(key)),
            None => (database, None),
        };
        let template =
            TemplateName::new(template).map_err(|error| match database.contains('@') {
                true => format!("{error}; a key is written <template>{SEPARATOR}<key>"),
                false => error.to_string(),
            })?;
        let Some(key) = key else {
            return Ok((template, None));
        };
        if key.is_empty() || key.chars().count() > MAX_KEY_CHARS {
            return Err(format!(
                "the key after \"{SEPARATOR}\" must have 1 to {MAX_KEY_CHARS} characters"
            ));
        }
        if key.chars().any(char::is_control) {
            return Err("the key must not contain control characters".into());
        }
        let name = KeyName {
            template: template.clone(),
            key: key.to_owned(),
        };
        Ok((template, Some(name)))
    }
}

impl fmt::Display for KeyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{SEPARATOR}{}", self.template, self.key)
    }
}

/// One key's shared lease, in `/status`.
#[derive(Debug, Clone)]
pub struct KeyReport {
    /// `<template>.<key>`.
    pub name: String,
    /// Its lease, unless it is being made.
    pub lease_id: Option<LeaseId>,
    /// Its lease's database, unless it is being made.
    pub database: Option<DbName>,
    /// The connections that use it now.
    pub connections: usize,
    /// When no connection uses it: when it is released unless one comes.
    pub release_at: Option<SystemTime>,
}

/// Why a key could not be released.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The name is not `<template>.<key>`.
    #[error("\"{name}\" is not <template>{SEPARATOR}<key>: {reason}")]
    Invalid {
        /// What was given.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No lease is shared under this key.
    #[error("no lease is shared under key \"{0}\"")]
    NotFound(String),
}

/// The keys in use.
#[derive(Debug)]
pub(crate) struct Keys {
    servers: Servers,
    grace: Duration,
    table: Mutex<HashMap<KeyName, Slot>>,
}

#[derive(Debug)]
struct Slot {
    share: Arc<Share>,
    /// Connections that joined and have not left.
    open: usize,
    /// Counts joins: a grace timer started at one count is void once another join came.
    joins: u64,
    /// Set while `open` is 0: when the grace ends.
    release_at: Option<SystemTime>,
}

/// A key's lease: none until the first connection has leased it.
#[derive(Debug, Default)]
struct Share {
    lease: tokio::sync::Mutex<Option<Lease>>,
}

impl Keys {
    pub(crate) fn new(servers: Servers, grace: Duration) -> Self {
        Keys {
            servers,
            grace,
            table: Mutex::default(),
        }
    }

    /// A connection to `name` joins its key; it leaves when the result is dropped.
    pub(crate) fn join(self: &Arc<Self>, name: KeyName) -> Member {
        let mut table = self.lock();
        let slot = table.entry(name.clone()).or_insert_with(|| Slot {
            share: Arc::default(),
            open: 0,
            joins: 0,
            release_at: None,
        });
        slot.open += 1;
        slot.joins += 1;
        slot.release_at = None;
        Member {
            keys: Arc::clone(self),
            share: Arc::clone(&slot.share),
            name,
        }
    }

    /// Releases a key's lease now; its connections are ended with it.
    pub(crate) async fn release(&self, name: &str) -> Result<LeaseId, KeyError> {
        let parsed = match KeyName::parse(name) {
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
        let slot = self.lock().remove(&parsed);
        let lease = match slot {
            // A connection making the lease now finishes first.
            Some(slot) => slot.share.lease.lock().await.take(),
            None => None,
        };
        let lease = lease.ok_or_else(|| KeyError::NotFound(name.to_owned()))?;
        self.release_lease(&parsed, &lease, "over HTTP").await;
        Ok(lease.id)
    }

    /// Every key in use, by name.
    pub(crate) fn report(&self) -> Vec<KeyReport> {
        let table = self.lock();
        let mut keys: Vec<KeyReport> = table
            .iter()
            .map(|(name, slot)| {
                // Locked while a connection makes the lease: shown without one.
                let lease = slot.share.lease.try_lock().ok().and_then(|l| l.clone());
                KeyReport {
                    name: name.to_string(),
                    lease_id: lease.as_ref().map(|l| l.id.clone()),
                    database: lease.map(|l| l.connect.database),
                    connections: slot.open,
                    release_at: slot.release_at,
                }
            })
            .collect();
        keys.sort_by(|a, b| a.name.cmp(&b.name));
        keys
    }

    /// A connection left: when it was the last, the lease is released after the grace
    /// unless another joins meanwhile.
    fn leave(self: &Arc<Self>, name: &KeyName, share: &Arc<Share>) {
        let mut table = self.lock();
        let Some(slot) = table.get_mut(name) else {
            return; // released over HTTP meanwhile
        };
        if !Arc::ptr_eq(&slot.share, share) {
            return; // … and taken again by another connection since
        }
        slot.open = slot.open.saturating_sub(1);
        if slot.open > 0 {
            return;
        }
        slot.release_at = Some(SystemTime::now() + self.grace);
        let joins = slot.joins;
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // the daemon is stopping: its pools end every lease
        };
        let keys = Arc::clone(self);
        let name = name.clone();
        runtime.spawn(async move { keys.expire(name, joins).await });
    }

    /// The end of a grace: releases the key's lease if nobody joined since it began.
    async fn expire(&self, name: KeyName, joins: u64) {
        tokio::time::sleep(self.grace).await;
        let slot = {
            let mut table = self.lock();
            match table.get(&name) {
                Some(slot) if slot.open == 0 && slot.joins == joins => table.remove(&name),
                _ => None,
            }
        };
        // Nobody holds the lock: every connection that took it has left.
        let lease = slot.and_then(|slot| slot.share.lease.try_lock().ok()?.take());
        if let Some(lease) = lease {
            self.release_lease(&name, &lease, "after its last connection closed")
                .await;
        }
    }

    async fn release_lease(&self, name: &KeyName, lease: &Lease, why: &str) {
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

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<KeyName, Slot>> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A connection's membership of a key; dropping it leaves the key.
#[derive(Debug)]
pub(crate) struct Member {
    keys: Arc<Keys>,
    share: Arc<Share>,
    name: KeyName,
}

impl Member {
    /// The key's lease: the one it has if it is still open (renewed now, as the connection
    /// that joins will use it for a while), else a new one from `lease`. Connections of one
    /// key wait here for each other, so a key has one lease at a time.
    pub(crate) async fn lease(
        &self,
        lease: impl std::future::Future<Output = Result<Lease, SessionError>>,
    ) -> Result<Lease, SessionError> {
        let mut held = self.share.lease.lock().await;
        if let Some(current) = held.as_ref() {
            match self.keys.servers.renew(current.id.clone(), None).await {
                Ok(expires_at) => {
                    let mut current = current.clone();
                    current.expires_at = expires_at;
                    return Ok(current);
                }
                // Released by its id over HTTP, or expired: the key gets a new one.
                Err(error) => {
                    tracing::info!(key = %self.name, lease_id = %current.id, %error, "a key's lease has ended; leasing anew");
                    *held = None;
                }
            }
        }
        let lease = lease.await?;
        *held = Some(lease.clone());
        Ok(lease)
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.keys.leave(&self.name, &self.share);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_name_is_a_template_or_a_template_and_a_key() {
        let (template, key) = KeyName::parse("app").expect("a template");
        assert_eq!((template.as_str(), key), ("app", None));
        let (template, key) = KeyName::parse("app.test_42").expect("a key");
        let key = key.expect("a key");
        assert_eq!(template.as_str(), "app");
        assert_eq!(key.to_string(), "app.test_42");
        // Only the first . splits: the key may hold more.
        let (_, key) = KeyName::parse("app.a.b").expect("a key");
        assert_eq!(key.expect("a key").to_string(), "app.a.b");
        let error = KeyName::parse("app@k").expect_err("not a template");
        assert!(error.contains("<template>.<key>"), "{error}");
        for bad in [
            "app.",
            ".k",
            "app.\u{1}",
            &format!("app.{}", "k".repeat(129)),
        ] {
            assert!(KeyName::parse(bad).is_err(), "{bad:?}");
        }
    }
}
