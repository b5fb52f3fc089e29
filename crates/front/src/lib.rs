//! pglease-front: the PostgreSQL-protocol front. A client that connects to database
//! `<template>` on the front's port is given a fresh clone of that template: the front
//! leases it from the pools ([`Servers`]) as `POST /lease` would, logs in to postgres as the
//! lease, and from then on relays bytes both ways without reading them. When either side
//! closes, the lease is released as an HTTP release without `reuse` is.
//!
//! It speaks the protocol and runs no SQL of its own. Files, one concern each:
//! - `listener.rs` — the accept loop ([`serve`]), one task per connection
//! - `session.rs`  — one connection: start-up, lease, login, relay, release
//! - `startup.rs`  — the client's opening packets, protocol version and password
//! - `codec.rs`    — the messages the front parses and writes as a server
//! - `backend.rs`  — the lease's login at postgres (postgres-protocol's client side)
//! - `relay.rs`    — bytes both ways until either side closes
//! - `cancel.rs`   — the front's cancel keys and sending a CancelRequest on
//! - `error.rs`    — what a client is told, with which SQLSTATE
//!
//! Who may connect: anybody who reaches the port when no token is configured (the binary
//! allows that on loopback only, as for the HTTP API), else a client whose password is the
//! token ([`Token`]).

use std::time::Duration;

use pglease_pool::Servers;

mod backend;
mod cancel;
pub mod codec;
mod error;
mod listener;
#[cfg(test)]
mod proptest_config;
mod relay;
mod session;
mod startup;

pub use listener::serve;

/// How the front leases and whom it lets in.
#[derive(Debug, Clone)]
pub struct FrontConfig {
    /// How long a connection waits for a database: `POST /lease`'s default `wait_ms`.
    pub default_wait: Duration,
    /// The password every client must give; without one, any password (or none) will do.
    pub token: Option<Token>,
}

/// The password the front asks for (the daemon's API token); its `Debug` does not show it.
#[derive(Clone)]
pub struct Token(String);

impl Token {
    /// Wraps a token; empty ones are refused by the caller.
    pub fn new(token: String) -> Self {
        Token(token)
    }

    /// Compares in constant time, as the HTTP API does (`pglease-api`'s `require_token`):
    /// both sides are hashed first, so neither the time taken nor the lengths tell anything
    /// about the token.
    pub(crate) fn matches(&self, given: &[u8]) -> bool {
        use sha2::{Digest, Sha256};
        use subtle::ConstantTimeEq;
        let (expected, given) = (Sha256::digest(self.0.as_bytes()), Sha256::digest(given));
        expected.as_slice().ct_eq(given.as_slice()).into()
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(***)")
    }
}

/// What every session shares.
#[derive(Debug)]
struct Front {
    /// The pools leases come from.
    servers: Servers,
    /// How to lease, whom to let in.
    config: FrontConfig,
    /// The cancel keys of the connections being relayed.
    cancels: cancel::CancelMap,
}
