//! One start of the embedded server, on a blocking thread (`Launch`): removing the previous
//! clusters, making the new one (the kept one, a snapshot unpacked, the initdb cache
//! copied, or initdb run), writing `pg_hba.conf`, choosing the port and spawning the
//! postmaster with its settings, its output going to the bounded log (`server_log.rs`).
//! Readiness is not its business: the spawned child goes back to `Embedded::start`, which
//! makes it a `RunningPostgres` and waits for it.
//!
//! It uses `running.rs` (`ClusterOrigin`), `settings.rs` and the files under them;
//! none of them uses it.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Instant;

use nix::sys::signal::Signal;
use tracing::{info, warn};

use super::binaries::Binaries;
use super::initdb::{self, Cache};
use super::instance::{self, INITDB_TMP_PREFIX};
use super::run_as::RunAs;
use super::running::ClusterOrigin;
use super::server_log::{Drain, ServerLog};
use super::settings::{choose_port, pg_hba, server_args, Place};
use super::spawn::{self, CommandSpec, Output};
use super::util::{self, io_error, write_anew};
use super::{adopted_catalog, adopted_config, room, snapshot, space};
use crate::config::EmbeddedConfig;
use crate::error::StartError;

/// Everything one start needs, detached from [`super::Embedded`] so it can run on a blocking thread.
pub(super) struct Launch {
    pub(super) binaries: Binaries,
    pub(super) run_as: RunAs,
    pub(super) instance_dir: PathBuf,
    /// Where the clusters go (the instance directory, or its copy-on-write store).
    pub(super) clusters_dir: PathBuf,
    pub(super) socket_dir: PathBuf,
    /// Where the log is, for errors.
    pub(super) log_path: PathBuf,
    /// The bounded log postgres' output goes to.
    pub(super) server_log: ServerLog,
    pub(super) data_dir: PathBuf,
    pub(super) in_memory: bool,
    /// The clusters' file system clones files.
    pub(super) clones: bool,
    /// The databases get a tmpfs of their own (`space.rs`), or room of their own.
    pub(super) databases_space: Option<space::Split>,
    /// The databases' room root in `--databases-dir` (`room.rs`): each cluster's `base/`
    /// is a link into it instead of a tmpfs.
    pub(super) databases_room: Option<PathBuf>,
    pub(super) cache: Option<Cache>,
    pub(super) initdb_args: Vec<String>,
    pub(super) config: EmbeddedConfig,
    pub(super) generation: u32,
    pub(super) previous_port: Option<u16>,
    /// Start the cluster already in `data_dir` (a kept one) instead of making one.
    pub(super) reuse_existing: bool,
    /// A snapshot to unpack instead of a fresh cluster (its MAC checked), with the key
    /// that checks it again as it is unpacked.
    pub(super) snapshot: Option<(snapshot::Found, snapshot::SnapshotKey)>,
}

/// A spawned (not yet ready) postmaster.
pub(super) struct Launched {
    pub(super) child: Child,
    pub(super) data_dir: PathBuf,
    pub(super) port: u16,
    pub(super) origin: ClusterOrigin,
    /// Whether its output has been read to the end, into the log.
    pub(super) log_drain: Drain,
}

impl Launch {
    /// Makes the cluster, configures it and spawns postgres.
    pub(super) fn run(self) -> Result<Launched, StartError> {
        self.remove_previous_clusters();
        let origin = self.obtain_cluster()?;
        self.write_hba(origin)?;
        let port = choose_port(
            self.config.port,
            self.previous_port,
            &self.config.listen_host,
        )?;
        let (child, log_drain) = self.spawn_postgres(port)?;
        Ok(Launched {
            child,
            data_dir: self.data_dir,
            port,
            origin,
            log_drain,
        })
    }

    /// Removes the clusters of earlier generations, and their databases' rooms.
    fn remove_previous_clusters(&self) {
        // First, so that a size-limited tmpfs has room for the new cluster. A new
        // directory per generation also gives the new postmaster a new SysV shared
        // memory key, so backends lingering from a killed one cannot block it.
        instance::remove_stale_clusters(&self.clusters_dir, &self.data_dir);
        if let Some(room_root) = &self.databases_room {
            // The rooms of those clusters' databases (the links to them went above).
            let keep = room::cluster_room(room_root, &self.data_dir);
            instance::remove_stale_clusters(room_root, &keep);
        }
    }

    /// The cluster to start: the kept one, else the snapshot unpacked, else a new one.
    fn obtain_cluster(&self) -> Result<ClusterOrigin, StartError> {
        if self.reuse_existing {
            return Ok(ClusterOrigin::Kept);
        }
        self.fresh_data_dir()?;
        match self.unpack_snapshot()? {
            Some(origin) => Ok(origin),
            None => self.make_cluster(),
        }
    }

    /// Writes the cluster's `pg_hba.conf`.
    fn write_hba(&self, origin: ClusterOrigin) -> Result<(), StartError> {
        let hba = self.data_dir.join("pg_hba.conf");
        // A cluster from a snapshot admits only the superuser over the socket until its
        // roles are checked (`adopted_catalog.rs`), which then writes the usual rules.
        let rules = match origin {
            ClusterOrigin::Snapshot => adopted_catalog::superuser_only_hba(),
            _ => pg_hba(
                self.config.lease_auth,
                self.config.integresql_role.as_deref(),
            ),
        };
        write_anew(&hba, rules.as_bytes(), self.run_as.owner())?;
        Ok(())
    }

    /// Spawns the postmaster on `port`, its output going to the log; returns the child and
    /// the log's drain.
    fn spawn_postgres(&self, port: u16) -> Result<(Child, Drain), StartError> {
        // postgres writes to a pipe the daemon reads into the capped log (`server_log.rs`).
        let (pipe, drain) = self
            .server_log
            .pipe()
            .map_err(|e| io_error("cannot make the log pipe for", &self.log_path, e))?;
        let spec = self.postgres_command(port, pipe);
        // A header line separates generations in the shared log.
        self.server_log.note(&format!(
            "---- pglease: starting generation {}: {spec}",
            self.generation
        ));
        info!(
            command = %spec,
            user = %self.run_as.name,
            data_dir = %self.data_dir.display(),
            port,
            generation = self.generation,
            log = %self.log_path.display(),
            "starting postgres"
        );
        let child =
            spawn::spawn(spec).map_err(|e| io_error("cannot run", &self.binaries.postgres(), e))?;
        Ok((child, drain))
    }

    /// The postmaster's command line, its output going to `pipe`.
    fn postgres_command(&self, port: u16, pipe: OwnedFd) -> CommandSpec {
        CommandSpec {
            program: self.binaries.postgres(),
            args: server_args(
                &self.config,
                &self.data_dir,
                &self.socket_dir,
                port,
                &Place {
                    in_memory: self.in_memory,
                    clones: self.clones,
                    major: snapshot::major_of(&self.binaries.version),
                    rest: self.databases_space.map(|split| split.rest),
                    notify_queue: self.databases_space.and_then(|split| split.notify_queue),
                },
            ),
            cwd: self.instance_dir.clone(),
            user: self.run_as.owner(),
            // SIGQUIT, not SIGKILL: it is an immediate shutdown, so the postmaster at once
            // stops its backends (SIGKILLing them after 5 s) and releases its shared
            // memory. After a SIGKILL the backends are orphaned and a backend in a long
            // query runs on until it next checks for postmaster death; the next start's
            // stale sweep escalates to SIGKILL should SIGQUIT ever not be enough.
            death_signal: Signal::SIGQUIT,
            output: Output::Log(pipe),
        }
    }

    /// Removes whatever the data directory holds (its databases' tmpfs first) and, when
    /// the databases get a tmpfs of their own, makes it anew, empty, with that tmpfs and
    /// the notification queue's, or with `base` and `pg_notify` links to their fresh room
    /// in `--databases-dir`; else the fill makes the directory.
    fn fresh_data_dir(&self) -> Result<(), StartError> {
        space::unmount_inside(&self.data_dir);
        match std::fs::remove_dir_all(&self.data_dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(io_error("cannot remove", &self.data_dir, e))
            }
            _ => {}
        }
        match (&self.databases_room, self.databases_space) {
            (Some(room_root), _) => room::make_cluster_dir(&self.data_dir, room_root, &self.run_as),
            (None, Some(split)) => {
                space::mount(&self.data_dir, split.databases, &self.run_as)?;
                match split.notify_queue {
                    Some(bytes) => space::mount_notify_queue(&self.data_dir, bytes, &self.run_as),
                    None => Ok(()),
                }
            }
            (None, None) => Ok(()),
        }
    }

    /// This cluster's room in `--databases-dir`, whose `base/` and `pg_notify/` its `base`
    /// and `pg_notify` link to (`room.rs`), if any.
    fn cluster_room(&self) -> Option<PathBuf> {
        let room_root = self.databases_room.as_ref()?;
        Some(room::cluster_room(room_root, &self.data_dir))
    }

    /// Fills the data directory from the snapshot, if there is one and it unpacks.
    fn unpack_snapshot(&self) -> Result<Option<ClusterOrigin>, StartError> {
        let Some((found, key)) = self.snapshot.as_ref() else {
            return Ok(None);
        };
        let path = &found.path;
        let room = self.cluster_room();
        let unpacked = snapshot::extract(
            found,
            key,
            &self.data_dir,
            self.run_as.owner(),
            room.as_deref(),
        );
        match unpacked {
            Ok(_) => {
                // No configuration from the snapshot: pglease's own files instead.
                adopted_config::write(
                    &self.data_dir,
                    self.cache.as_ref().and_then(Cache::lookup),
                    &self.config.locale,
                    self.run_as.owner(),
                )?;
                Ok(Some(ClusterOrigin::Snapshot))
            }
            // Refused (a hostile entry: `error` names it and why) or broken: nothing of it
            // is used, and as nothing was adopted, a clean stop writes a snapshot over it.
            Err(error) => {
                warn!(
                    snapshot = %path.display(),
                    %error,
                    "cannot unpack the snapshot: refused, none of it is used; starting a \
                     fresh cluster"
                );
                // remove_dir_all removes a link it meets, never what the link points at.
                self.fresh_data_dir()?;
                Ok(None)
            }
        }
    }

    /// Fills the data directory: from the cache, else by initdb (filling the cache).
    fn make_cluster(&self) -> Result<ClusterOrigin, StartError> {
        let owner = self.run_as.owner();
        let Some(cache) = &self.cache else {
            let fresh = self.run_initdb_beside()?;
            self.move_into_place(&fresh)?;
            return Ok(ClusterOrigin::InitdbUncached);
        };
        if let Some(entry) = cache.lookup() {
            let started = Instant::now();
            match initdb::copy_tree(entry, &self.data_dir, owner, self.cluster_room().as_deref()) {
                Ok(()) => {
                    info!(
                        from = %entry.display(),
                        to = %self.data_dir.display(),
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "copied the cached initdb result"
                    );
                    return Ok(ClusterOrigin::CopiedFromCache);
                }
                // E.g. an entry made by another user that we cannot read: the cache is
                // only a shortcut, so fall back to initdb.
                Err(e) => {
                    warn!(entry = %entry.display(), error = %e, "cannot copy the cached initdb result; running initdb");
                    self.fresh_data_dir()?;
                }
            }
        }
        let fresh = self.run_initdb_beside()?;
        let origin = match cache.store(&fresh) {
            Ok(()) => {
                info!(entry = %cache.entry.display(), "stored the initdb result in the cache");
                ClusterOrigin::InitdbCached
            }
            Err(e) => {
                warn!(
                    entry = %cache.entry.display(),
                    error = %e,
                    "cannot store the initdb result in the cache; initdb will run again next start"
                );
                ClusterOrigin::InitdbUncached
            }
        };
        self.move_into_place(&fresh)?;
        Ok(origin)
    }

    /// Runs initdb as the server's user into a new directory in the instance (on tmpfs,
    /// owned by that user: the cache directory may not be reachable for it, e.g. under
    /// /root), beside the cluster directory: on the same file system, for the rename.
    fn run_initdb_beside(&self) -> Result<PathBuf, StartError> {
        let fresh = self
            .clusters_dir
            .join(format!("{INITDB_TMP_PREFIX}{}", util::random_hex(4)));
        initdb::run_initdb(
            &self.binaries,
            &self.run_as,
            &self.initdb_args,
            &fresh,
            &self.instance_dir,
        )?;
        Ok(fresh)
    }

    /// Puts initdb's output in place: renamed, or copied into the databases' tmpfs or room.
    fn move_into_place(&self, fresh: &Path) -> Result<(), StartError> {
        if self.databases_space.is_none() {
            return std::fs::rename(fresh, &self.data_dir)
                .map_err(|e| io_error("cannot rename into", &self.data_dir, e));
        }
        initdb::copy_tree(
            fresh,
            &self.data_dir,
            self.run_as.owner(),
            self.cluster_room().as_deref(),
        )?;
        std::fs::remove_dir_all(fresh).map_err(|e| io_error("cannot remove", fresh, e))
    }
}
