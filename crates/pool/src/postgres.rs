//! Supervision of the embedded postgres: finding the binaries, the instance directory on
//! tmpfs (optionally a dedicated mount), the OS user when we are root, the initdb cache,
//! spawning postgres from a long-lived thread with a parent-death signal, readiness,
//! fast shutdown, and the sweep of instances a killed daemon left behind.
//!
//! It runs no SQL beyond the readiness probe and knows nothing of templates or leases;
//! the actor owns the values returned here.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::EmbeddedConfig;
use crate::error::StartError;

/// The superuser role initdb creates; it connects only over the private unix socket.
pub const ADMIN_USER: &str = "postgres";

/// A prepared instance: binaries found, user resolved, directory made (and mounted), stale
/// instances swept. [`Embedded::start`] can run many times (after a crash, a restart).
#[derive(Debug)]
pub struct Embedded {
    _private: (),
}

impl Embedded {
    /// Finds binaries, resolves the OS user, sweeps stale instances, creates (and mounts)
    /// the instance directory and checks that it is on tmpfs.
    pub async fn prepare(config: &EmbeddedConfig) -> Result<Embedded, StartError> {
        let _ = config;
        todo!()
    }

    /// Starts a fresh cluster (copied from the initdb cache) in a new data directory,
    /// removing the previous one, and returns once a connection succeeds.
    pub async fn start(&mut self) -> Result<RunningPostgres, StartError> {
        todo!()
    }

    /// The instance directory.
    pub fn instance_dir(&self) -> &Path {
        todo!()
    }

    /// Removes the instance directory (unless `keep_data`) and unmounts its tmpfs.
    pub fn cleanup(self) {
        todo!()
    }
}

/// A running postmaster, child of this daemon.
#[derive(Debug)]
pub struct RunningPostgres {
    /// The postmaster's pid.
    pub pid: u32,
    /// TCP port for lease holders.
    pub port: u16,
    /// Host lease holders use (advertise_host or listen_host).
    pub host: String,
    /// The cluster's data directory.
    pub data_dir: PathBuf,
    /// Directory of the unix socket the daemon connects through.
    pub socket_dir: PathBuf,
    /// The server log.
    pub log_path: PathBuf,
}

impl RunningPostgres {
    /// Connection settings for the superuser over the unix socket, database `postgres`.
    pub fn admin_config(&self) -> tokio_postgres::Config {
        todo!()
    }

    /// `Some(status)` once the postmaster has exited (reaping it); never blocks.
    pub fn poll_exit(&mut self) -> Option<String> {
        todo!()
    }

    /// The last `lines` lines of the server log.
    pub fn log_tail(&self, lines: usize) -> String {
        let _ = lines;
        todo!()
    }

    /// Fast shutdown (SIGINT), then SIGKILL after `timeout`; always reaps.
    pub async fn shutdown(self, timeout: Duration) {
        let _ = timeout;
        todo!()
    }
}
