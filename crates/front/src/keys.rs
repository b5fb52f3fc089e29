//! Sharing a lease by key: every connection to database `<template>.<key>` gets the same
//! lease while any of them is open, for suites whose connection pool opens several
//! connections per test. The lease is released a grace after the last of them closes
//! (a pool that closes and reopens a connection keeps its database), or at once by
//! `DELETE /front/keys/<template>.<key>` ([`crate::FrontHandle::release_key`]).
//!
//! Files, one concern each:
//! - `keys.rs`        — the names (`<template>.<key>`) and what `/status` shows of a key
//! - `keys/table.rs`  — `Keyed`, the one owner of the keyed leases and all their rules, pure
//!   (its `//!` lists every piece of state the front keeps about leases, and who changes it)
//! - `keys/shared.rs` — `Keys`, the table behind a lock and the side effects it asks for:
//!   grace timers, one renewal task per lease, releases through the pool; `Member`, a
//!   connection's membership, which leaves the key when dropped

use std::fmt;
use std::time::SystemTime;

use pglease_pool::{DbName, LeaseId, TemplateName};

#[cfg(test)]
mod interleavings;
#[cfg(test)]
mod real_pool;
mod shared;
mod table;
#[cfg(test)]
mod tests;

pub(crate) use shared::{Keys, Member};

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

#[cfg(test)]
mod names {
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
