//! pglease-front: the PostgreSQL-protocol front. A client that connects to database
//! `<template>` on the front's port is given a fresh clone of that template: the front
//! leases it from the pools ([`Servers`]) as `POST /lease` would, logs in to postgres as the
//! lease, and from then on relays bytes both ways without reading them. When either side
//! closes, the lease is released as an HTTP release without `reuse` is. Connections to
//! `<template>.<key>` share one lease while any of them is open (`keys.rs`).
//!
//! It speaks the protocol and runs no SQL of its own. Files, one concern each:
//! - `listener.rs` — the accept loop ([`serve`]), one task per connection
//! - `session.rs`  — one connection: start-up, lease, login, relay, release
//! - `startup.rs`  — the client's opening packets, protocol version and password
//! - `tls.rs`      — TLS at the front: the certificate (files or self-signed), the acceptor
//! - `client.rs`   — the client's connection, plain or TLS, and how the relay splits it
//! - `codec.rs`    — the messages the front parses and writes as a server
//! - `backend.rs`  — the lease's login at postgres (postgres-protocol's client side)
//! - `relay.rs`    — bytes both ways until either side closes
//! - `release.rs`  — the guard that releases a session's own lease, however the session ends
//! - `cancel.rs`   — the front's cancel keys and sending a CancelRequest on
//! - `keys.rs`     — leases shared by key, released a grace after their last connection;
//!   `keys/table.rs` is the one owner of that state and its rules, `keys/shared.rs` its
//!   timers, its one renewal task per lease and its calls to the pools
//! - `held.rs`     — the open connections, for `/status` and `/metrics` ([`FrontHandle::report`])
//! - `error.rs`    — what a client is told, with which SQLSTATE
//!
//! Who may connect: anybody who reaches the port when no token is configured (the binary
//! allows that on loopback only, as for the HTTP API), else a client whose password is the
//! token ([`Token`]). With [`FrontConfig::tls`], a client that asks for TLS gets it; one
//! that does not is served in plain text all the same.

use std::sync::Arc;
use std::time::Duration;

use pglease_pool::{LeaseId, Servers};

mod backend;
mod cancel;
mod client;
pub mod codec;
mod error;
mod held;
mod keys;
mod listener;
mod relay;
mod release;
mod session;
mod startup;
mod tls;

pub use held::{ConnectionReport, Stage};
pub use keys::{KeyError, KeyName, KeyReport};
pub use listener::serve;
pub use tls::{FrontTls, TlsError, TlsSource};

/// How the front leases and whom it lets in.
#[derive(Debug, Clone)]
pub struct FrontConfig {
    /// How long a connection waits for a database: `POST /lease`'s default `wait_ms`.
    pub default_wait: Duration,
    /// The password every client must give; without one, any password (or none) will do.
    pub token: Option<Token>,
    /// How long a key's lease outlives its last connection.
    pub key_grace: Duration,
    /// The most connections open at once, in any stage; more are refused with `53300`.
    /// Each takes two file descriptors (the client's, postgres') while relayed.
    pub max_connections: usize,
    /// TLS for clients that ask for it (SSLRequest); without it they are told `N` and go
    /// on in plain text, or give up if they require TLS.
    pub tls: Option<FrontTls>,
    /// Refuse clients that do not ask for TLS (`28000`, before any password): needs `tls`.
    pub require_tls: bool,
}

impl FrontConfig {
    /// Whether clients that do not ask for TLS are refused: `require_tls` with TLS to offer.
    pub fn requires_tls(&self) -> bool {
        self.require_tls && self.tls.is_some()
    }
}

/// The most connections at the front at once unless configured: more than the daemon's
/// postgres has for lease holders by default, few enough that their file descriptors fit
/// any sane limit.
pub const DEFAULT_MAX_CONNECTIONS: usize = 2048;

/// How long a key's lease outlives its last connection unless configured: long enough for
/// a connection pool that closes a connection and opens another, short enough that the next
/// test's key is not kept waiting for a database.
pub const DEFAULT_KEY_GRACE: Duration = Duration::from_secs(2);

/// The password the front asks for: the daemon's API token.
pub use pglease_pool::Token;

/// What every session shares.
#[derive(Debug)]
struct Front {
    /// The pools leases come from.
    servers: Servers,
    /// How to lease, whom to let in.
    config: FrontConfig,
    /// The cancel keys of the connections being relayed.
    cancels: cancel::CancelMap,
    /// The connections open now.
    connections: held::Connections,
    /// The leases shared by key.
    keys: Arc<keys::Keys>,
    /// Tests only: a session panics as its relay begins, as a bug in it would, so that a
    /// test sees its lease released all the same (`session/tests.rs`).
    #[cfg(test)]
    panic_when_relaying: bool,
}

/// The front, for the daemon to serve ([`serve`]) and for the HTTP API to report on and to
/// release keys through. Cloneable; clones share one front.
#[derive(Debug, Clone)]
pub struct FrontHandle {
    front: Arc<Front>,
}

/// What the front holds now.
#[derive(Debug, Clone)]
pub struct FrontReport {
    /// Its open connections, oldest first.
    pub connections: Vec<ConnectionReport>,
    /// Connections accepted since the start.
    pub accepted: u64,
    /// The leases shared by key.
    pub keys: Vec<KeyReport>,
    /// Where its TLS certificate comes from, if it serves TLS.
    pub tls: Option<TlsSource>,
    /// Whether clients that do not ask for TLS are refused.
    pub tls_required: bool,
}

impl FrontHandle {
    /// A front that leases from `servers`.
    pub fn new(servers: Servers, config: FrontConfig) -> Self {
        let keys = Arc::new(keys::Keys::new(servers.clone(), config.key_grace));
        FrontHandle {
            front: Arc::new(Front {
                servers,
                config,
                cancels: cancel::CancelMap::default(),
                connections: held::Connections::default(),
                keys,
                #[cfg(test)]
                panic_when_relaying: false,
            }),
        }
    }

    /// Whether clients must give a password (the token).
    pub fn asks_password(&self) -> bool {
        self.front.config.token.is_some()
    }

    /// Where its TLS certificate comes from, if it serves TLS.
    pub fn tls(&self) -> Option<&TlsSource> {
        self.front.config.tls.as_ref().map(FrontTls::source)
    }

    /// Whether clients that do not ask for TLS are refused.
    pub fn requires_tls(&self) -> bool {
        self.front.config.requires_tls()
    }

    /// Its connections and keys now.
    pub fn report(&self) -> FrontReport {
        let (connections, accepted) = self.front.connections.report();
        FrontReport {
            connections,
            accepted,
            keys: self.front.keys.report(),
            tls: self.tls().cloned(),
            tls_required: self.requires_tls(),
        }
    }

    /// Releases the lease shared under `name` (`<template>.<key>`) now; the connections
    /// that use it are ended with it, and the next connection to the key gets a new one.
    pub async fn release_key(&self, name: &str) -> Result<LeaseId, KeyError> {
        self.front.keys.release(name).await
    }
}
