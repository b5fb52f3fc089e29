//! The connections the front holds now, for `/status` and `/metrics`: one row per client
//! connection from its accept to its close, with the stage it is in and the lease it holds.
//! A session's [`Tracked`] row is removed when it is dropped, on every path out of the
//! session, so the table never shows a connection that is gone.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Mutex, PoisonError};
use std::time::SystemTime;

use pglease_pool::{DbName, LeaseId, TemplateName};

/// Where a connection at the front is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Sending its start-up packets, authenticating.
    Starting,
    /// Waiting for its lease (or for the key's lease another connection is making).
    Leasing,
    /// Logged in to its database; its bytes are relayed.
    Relaying,
}

impl Stage {
    /// Every stage, in the order a connection goes through them.
    pub const ALL: [Stage; 3] = [Stage::Starting, Stage::Leasing, Stage::Relaying];

    /// Its name in `/status` and `/metrics`.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Starting => "starting",
            Stage::Leasing => "leasing",
            Stage::Relaying => "relaying",
        }
    }
}

/// One client connection at the front.
#[derive(Debug, Clone)]
pub struct ConnectionReport {
    /// The client's address.
    pub peer: SocketAddr,
    /// Where it is.
    pub stage: Stage,
    /// When it was accepted.
    pub since: SystemTime,
    /// The template it asked for, once its start-up named one.
    pub template: Option<TemplateName>,
    /// The key it shares a lease by (`<template>.<key>`), if it gave one.
    pub key: Option<String>,
    /// Its lease, once it has one.
    pub lease_id: Option<LeaseId>,
    /// Its lease's database, once it has one.
    pub database: Option<DbName>,
    /// Whether it speaks TLS (from its handshake on).
    pub tls: bool,
}

/// The front's open connections.
#[derive(Debug, Default)]
pub(crate) struct Connections {
    table: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    /// Connections accepted since the start; the next row's id.
    accepted: u64,
    open: BTreeMap<u64, ConnectionReport>,
}

impl Connections {
    /// Adds a row for a connection just accepted, removed when the result is dropped.
    pub(crate) fn open(&self, peer: SocketAddr) -> Tracked<'_> {
        let mut table = self.lock();
        let id = table.accepted;
        table.accepted += 1;
        table.open.insert(
            id,
            ConnectionReport {
                peer,
                stage: Stage::Starting,
                since: SystemTime::now(),
                template: None,
                key: None,
                lease_id: None,
                database: None,
                tls: false,
            },
        );
        Tracked {
            connections: self,
            id,
        }
    }

    /// The open connections, oldest first, and how many were accepted since the start.
    pub(crate) fn report(&self) -> (Vec<ConnectionReport>, u64) {
        let table = self.lock();
        (table.open.values().cloned().collect(), table.accepted)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A connection's row; dropping it removes the row.
#[derive(Debug)]
pub(crate) struct Tracked<'a> {
    connections: &'a Connections,
    id: u64,
}

impl Tracked<'_> {
    /// Changes the row.
    pub(crate) fn update(&self, change: impl FnOnce(&mut ConnectionReport)) {
        if let Some(row) = self.connections.lock().open.get_mut(&self.id) {
            change(row);
        }
    }
}

impl Drop for Tracked<'_> {
    fn drop(&mut self) {
        self.connections.lock().open.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_lives_as_long_as_its_connection_and_the_count_goes_on() {
        let connections = Connections::default();
        let peer: SocketAddr = "127.0.0.1:4000".parse().expect("address");
        let first = connections.open(peer);
        let second = connections.open(peer);
        second.update(|row| row.stage = Stage::Relaying);
        let (open, accepted) = connections.report();
        assert_eq!(accepted, 2);
        let stages: Vec<Stage> = open.iter().map(|row| row.stage).collect();
        assert_eq!(stages, [Stage::Starting, Stage::Relaying], "oldest first");
        drop(first);
        let (open, accepted) = connections.report();
        assert_eq!((open.len(), accepted), (1, 2));
        drop(second);
        let (open, accepted) = connections.report();
        assert!(open.is_empty());
        assert_eq!(accepted, 2);
    }
}
