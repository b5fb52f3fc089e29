//! Supervision of the embedded postgres: finding the binaries, the instance directory on
//! tmpfs (optionally a dedicated mount), the OS user when we are root, the initdb cache,
//! spawning postgres from a long-lived thread with a parent-death signal, readiness,
//! fast shutdown, and the sweep of instances a killed daemon left behind.
//!
//! It runs no SQL beyond the readiness probe and the check of an adopted cluster's roles
//! (`adopted_catalog.rs`), and knows nothing of leases or the pool's state; the actor owns
//! the values returned here.
//!
//! This file holds [`Embedded`], what the actor drives: a server prepared once, started
//! (again after a crash), its snapshot written at a stop, its directory removed. The other
//! files, each using only files listed after it (so none uses this one):
//! - `launch.rs`: one start: the cluster made, `pg_hba.conf` written, postgres spawned;
//! - `adopted_catalog.rs`: the roles of a cluster adopted from a snapshot, checked before
//!   TCP clients are let in;
//! - `running.rs`: the running postmaster: readiness, its exit, shutdown;
//! - `server_log.rs`: the server log, fed through a pipe and bounded;
//! - `settings.rs`: what it runs with: `pg_hba.conf`, its settings, port and host;
//! - `sweep.rs`: the instances a killed daemon left behind;
//! - `instance.rs`: the instance directory, its tmpfs and what the clusters live on, which
//!   `storage.rs` decides; `cow.rs` makes the copy-on-write store;
//! - `initdb.rs`: initdb and its cache; `snapshot.rs`: snapshot files, `adopted_config.rs`
//!   the configuration files of a cluster unpacked from one; `binaries.rs`:
//!   which server, through `pglease-binaries`; `spawn.rs`: the spawner thread;
//! - `room.rs`: the databases' room in `--databases-dir`; `space.rs`: the databases' tmpfs;
//! - `marker.rs`: whose instance a directory is; `run_as.rs`: the OS user;
//!   `filesystem.rs`: tmpfs check, free space, mount points; `util.rs`: shared helpers.

mod adopted_catalog;
mod adopted_config;
mod binaries;
mod cow;
mod filesystem;
mod initdb;
mod instance;
mod launch;
mod marker;
mod room;
mod run_as;
mod running;
mod server_log;
mod settings;
pub mod snapshot;
mod space;
mod spawn;
mod storage;
mod sweep;
#[cfg(test)]
mod tests;
mod util;

use std::path::{Path, PathBuf};
use std::time::Instant;

use tracing::{error, info, warn};

use self::binaries::Binaries;
pub(crate) use self::cow::used_bytes;
use self::initdb::Cache;
pub use self::initdb::ADMIN_USER;
pub use self::instance::check_databases_dir;
use self::instance::Instance;
use self::launch::{Launch, Launched};
use self::run_as::RunAs;
pub use self::running::{postmaster_status, ClusterOrigin, RunningPostgres};
use self::server_log::ServerLog;
use self::settings::advertised_host;
pub use self::settings::{IN_MEMORY_SETTINGS, TUNED_SETTINGS};
pub use self::spawn::SCRUBBED_ENV;
pub(crate) use self::storage::AUTO_MIN_TEMPLATE_BYTES;
use self::storage::{largest_template, StorageHints};
use crate::config::{EmbeddedConfig, TemplateConfig};
use crate::error::StartError;

/// Starts tried when another process takes the port pglease found free before postgres binds
/// it (a race with whatever else on the machine binds ports: test suites start many servers).
const PORT_ATTEMPTS: u32 = 3;

/// A prepared instance: binaries found, user resolved, directory made (and mounted), stale
/// instances swept. [`Embedded::start`] can run many times (after a crash, a restart).
#[derive(Debug)]
pub struct Embedded {
    /// Boxed: an `Embedded` travels inside the actor's messages, and the config is big.
    config: Box<EmbeddedConfig>,
    binaries: Binaries,
    run_as: RunAs,
    instance: Instance,
    cache: Option<Cache>,
    initdb_args: Vec<String>,
    /// The generation of the last start; each start uses `pgdata-<generation>`.
    generation: u32,
    /// A cleanly stopped cluster of a kept data directory, started again by the first
    /// start instead of a fresh one.
    kept_generation: Option<u32>,
    /// The port of the last start, reused when still free so clients' settings survive.
    last_port: Option<u16>,
    /// The snapshot the first start unpacks (taken by it).
    snapshot: Option<snapshot::Found>,
    /// The key that authenticates snapshots (with `snapshot_dir`).
    snapshot_key: Option<snapshot::SnapshotKey>,
    /// The manifest of the snapshot this server started from, if it did: a stop writes a
    /// new one only when the templates differ.
    adopted: Option<snapshot::Manifest>,
    /// The bounded server log every start's postmaster writes to.
    server_log: ServerLog,
}

impl Embedded {
    /// Finds binaries (downloading them into the cache if need be), resolves the OS user,
    /// sweeps stale instances, creates (and mounts) the instance directory and checks that
    /// it is on tmpfs. `templates` are the server's: with `--storage auto` a big one makes
    /// the clusters go to a copy-on-write store (`storage.rs`).
    pub async fn prepare(
        config: &EmbeddedConfig,
        templates: &[TemplateConfig],
    ) -> Result<Embedded, StartError> {
        let run_as = RunAs::resolve(config.pg_user.as_deref())?;
        // The initdb cache and downloaded binaries share one root.
        let cache_root = config
            .cache_dir
            .clone()
            .unwrap_or_else(pglease_binaries::default_cache_root);
        let binaries = Binaries::resolve(config, &cache_root, run_as.switch).await?;
        let config = config.clone();
        let templates = templates.to_vec();
        // Runs processes, sleeps while stopping stale postmasters and walks directories.
        blocking(move || {
            Embedded::prepare_blocking(config, &templates, binaries, run_as, cache_root)
        })
        .await
    }

    /// The rest of [`Embedded::prepare`], on a thread that may block.
    fn prepare_blocking(
        config: EmbeddedConfig,
        templates: &[TemplateConfig],
        binaries: Binaries,
        run_as: RunAs,
        cache_root: PathBuf,
    ) -> Result<Embedded, StartError> {
        sweep_stale_instances(&config);
        let initdb_args = initdb::initdb_args(&config.encoding, &config.locale);
        let snapshot_key = snapshot_key(&config, &cache_root)?;
        let found = config
            .snapshot_dir
            .as_deref()
            .zip(snapshot_key.as_ref())
            .and_then(|(dir, key)| snapshot::find(dir, &binaries.version, &initdb_args, key));
        let hints = StorageHints {
            major: snapshot::major_of(&binaries.version),
            largest_template: largest_template(templates, found.as_ref().map(|f| &f.manifest)),
        };
        let instance = Instance::create(&config, &hints, &run_as)?;
        let server_log = open_server_log(&instance)?;
        let cache = Cache::open(cache_root, &binaries.version, &initdb_args);
        let generation = instance.last_generation();
        let kept_generation = kept_generation(&config, &instance, generation);
        let snapshot = found.filter(|_| kept_generation.is_none());
        info!(
            instance_dir = %instance.dir.display(),
            bin_dir = %binaries.bin_dir.display(),
            version = %binaries.version,
            pg_user = %run_as.name,
            initdb_cache = ?cache.as_ref().map(|cache| &cache.entry),
            "prepared the embedded postgres"
        );
        Ok(Embedded {
            config: Box::new(config),
            binaries,
            run_as,
            instance,
            cache,
            initdb_args,
            generation,
            kept_generation,
            last_port: None,
            snapshot,
            snapshot_key,
            adopted: None,
            server_log,
        })
    }

    /// Starts a fresh cluster (copied from the initdb cache) in a new data directory,
    /// removing the previous one, and returns once a connection succeeds.
    ///
    /// Call it again only once the previous [`RunningPostgres`] has exited or been shut
    /// down: its data directory is removed here. On error the new data directory is kept
    /// (and logged) until the next start.
    pub async fn start(&mut self) -> Result<RunningPostgres, StartError> {
        let mut attempt = 1;
        loop {
            // A kept cluster is started again, not a new one, if the port was lost.
            let kept = self.kept_generation;
            match self.start_with_snapshot().await {
                Err(error) if attempt < PORT_ATTEMPTS && self.lost_its_port(&error) => {
                    warn!(attempt, "the port pglease chose was taken before postgres bound it; starting again on another");
                    // Not the previous port again: someone else has it now.
                    self.last_port = None;
                    self.kept_generation = kept;
                    attempt += 1;
                }
                started => return started,
            }
        }
    }

    /// Whether postgres exited at start-up because another process bound the port pglease
    /// had found free (between the check and postgres' bind): a port chosen, not configured.
    fn lost_its_port(&self, error: &StartError) -> bool {
        self.config.port.is_none()
            && matches!(error, StartError::EarlyExit { tail, .. } if tail.contains("Address already in use"))
    }

    /// [`Embedded::start`]'s one attempt: from the snapshot if there is one, else (or if it
    /// does not start) a fresh cluster.
    async fn start_with_snapshot(&mut self) -> Result<RunningPostgres, StartError> {
        let snapshot = self.snapshot.take();
        match self.start_once(snapshot.clone()).await {
            Ok(running) => {
                if let (ClusterOrigin::Snapshot, Some(found)) = (running.cluster_origin, snapshot) {
                    info!(
                        snapshot = %found.path.display(),
                        templates = %found.manifest.describe(),
                        postgres = %found.manifest.postgres_version,
                        "started from the snapshot; its templates whose sources are unchanged \
                         are used as they are, the others are built again"
                    );
                    self.adopted = Some(found.manifest);
                }
                Ok(running)
            }
            // Not the snapshot's fault: tried again, from the snapshot, on another port.
            Err(error) if snapshot.is_some() && self.lost_its_port(&error) => {
                self.snapshot = snapshot;
                Err(error)
            }
            // A snapshot that does not start (damaged in a way unpacking could not see):
            // a fresh cluster instead.
            Err(error) if snapshot.is_some() => {
                warn!(%error, "postgres did not start from the snapshot; starting a fresh cluster");
                self.start_once(None).await
            }
            Err(error) => Err(error),
        }
    }

    /// One start: the kept cluster, else `snapshot` unpacked, else a fresh cluster.
    async fn start_once(
        &mut self,
        snapshot: Option<snapshot::Found>,
    ) -> Result<RunningPostgres, StartError> {
        let started = Instant::now();
        let reuse = self.kept_generation.take();
        match reuse {
            Some(kept) => self.generation = kept,
            None => self.generation += 1,
        }
        let launch = self.launch(reuse.is_some(), snapshot);
        let launched = blocking(move || launch.run()).await?;
        self.last_port = Some(launched.port);
        // From here on the value owns the child: if this future is dropped, Drop kills it.
        let running = self.running(launched);
        self.until_ready(running, started).await
    }

    /// What this generation's start needs, detached from `self` for a blocking thread.
    fn launch(&self, reuse_existing: bool, snapshot: Option<snapshot::Found>) -> Launch {
        Launch {
            binaries: self.binaries.clone(),
            run_as: self.run_as.clone(),
            instance_dir: self.instance.dir.clone(),
            clusters_dir: self.instance.clusters(),
            socket_dir: self.instance.socket_dir.clone(),
            log_path: self.instance.log_path.clone(),
            server_log: self.server_log.clone(),
            data_dir: self.instance.cluster_dir(self.generation),
            in_memory: self.instance.in_memory,
            clones: self.instance.clones(),
            databases_space: self.instance.databases_space,
            databases_room: self.instance.databases_room(),
            cache: self.cache.clone(),
            initdb_args: self.initdb_args.clone(),
            config: (*self.config).clone(),
            generation: self.generation,
            previous_port: self.last_port,
            reuse_existing,
            snapshot: snapshot.zip(self.snapshot_key.clone()),
        }
    }

    /// The spawned postmaster as a [`RunningPostgres`], which owns (and on drop kills) it.
    fn running(&self, launched: Launched) -> RunningPostgres {
        let databases_space = Some(launched.data_dir.join(space::DIR))
            .filter(|base| filesystem::is_mount_point(base));
        RunningPostgres {
            pid: launched.child.id(),
            port: launched.port,
            host: advertised_host(&self.config),
            data_dir: launched.data_dir,
            socket_dir: self.instance.socket_dir.clone(),
            log_path: self.instance.log_path.clone(),
            version: self.binaries.version.clone(),
            generation: self.generation,
            cluster_origin: launched.origin,
            storage: self.instance.storage(),
            store_base: self.instance.store_base,
            databases_space,
            child: Some(launched.child),
            log_drain: launched.log_drain,
        }
    }

    /// Waits until `running` takes connections (and, adopted from a snapshot, its roles
    /// pass the check). A refused snapshot stops it; any other failure leaves its data
    /// directory for inspection.
    async fn until_ready(
        &self,
        mut running: RunningPostgres,
        started: Instant,
    ) -> Result<RunningPostgres, StartError> {
        let ready = match running.wait_ready().await {
            // An adopted cluster admits only the superuser over the socket until its roles
            // are checked (`adopted_catalog.rs`).
            Ok(()) if running.cluster_origin == ClusterOrigin::Snapshot => {
                self.check_adopted(&running).await
            }
            other => other,
        };
        match ready {
            Ok(()) => {
                info!(
                    pid = running.pid,
                    port = running.port,
                    generation = running.generation,
                    cluster_origin = ?running.cluster_origin,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "postgres is ready"
                );
                Ok(running)
            }
            Err(e @ StartError::SnapshotCatalog { .. }) => {
                // Running, but refused: stopped now, and the caller builds a fresh cluster.
                running.shutdown(std::time::Duration::from_secs(10)).await;
                Err(e)
            }
            Err(e) => {
                error!(
                    data_dir = %running.data_dir.display(),
                    log = %running.log_path.display(),
                    error = %e,
                    "postgres failed to start; its data directory is kept for inspection"
                );
                Err(e)
            }
        }
    }

    /// Checks the role catalog of a cluster adopted from a snapshot, then writes the usual
    /// `pg_hba.conf` and reloads it; a refused catalog stops the server.
    async fn check_adopted(&self, running: &RunningPostgres) -> Result<(), StartError> {
        let started = Instant::now();
        let integresql = self.config.integresql_role.as_deref();
        // The start's error names the reason in words: the snapshot is refused either way,
        // and nothing decides by how.
        if let Err(error) = adopted_catalog::check(running, integresql).await {
            return Err(StartError::SnapshotCatalog {
                reason: error.to_string(),
            });
        }
        util::write_anew(
            &running.data_dir.join("pg_hba.conf"),
            settings::pg_hba(self.config.lease_auth, integresql).as_bytes(),
            self.run_as.owner(),
        )?;
        adopted_catalog::open_up(running)
            .await
            .map_err(|error| StartError::SnapshotCatalog {
                reason: error.to_string(),
            })?;
        info!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            "checked the role catalog of the snapshot's cluster; TCP clients may log in"
        );
        Ok(())
    }

    /// The instance directory.
    pub fn instance_dir(&self) -> &Path {
        &self.instance.dir
    }

    /// The size of each cluster's databases' tmpfs, when they get one (`space.rs`).
    pub fn databases_space(&self) -> Option<u64> {
        self.instance.databases_space.map(|split| split.databases)
    }

    /// The initdb cache entry for this server version and settings (it exists once a
    /// start has filled it), or `None` when the cache is unusable.
    pub fn initdb_cache_entry(&self) -> Option<&Path> {
        self.cache.as_ref().map(|cache| cache.entry.as_path())
    }

    /// Whether a stop saves a snapshot (`snapshot_dir` is set).
    pub fn saves_snapshots(&self) -> bool {
        self.config.snapshot_dir.is_some()
    }

    /// The snapshot a stop with these templates built writes: none when no template is
    /// built, or when the snapshot this server started from (still there) holds exactly
    /// these versions.
    pub fn snapshot_plan(
        &self,
        templates: Vec<snapshot::SnapshotTemplate>,
    ) -> Option<snapshot::Manifest> {
        let dir = self.config.snapshot_dir.as_ref()?;
        let manifest =
            snapshot::Manifest::new(&self.binaries.version, &self.initdb_args, templates);
        let path = snapshot::path_for(dir, manifest.postgres_major);
        if manifest.templates.is_empty() {
            info!(snapshot = %path.display(), "no template was built: no snapshot to write");
            return None;
        }
        let unchanged = self
            .adopted
            .as_ref()
            .is_some_and(|adopted| adopted.same_versions(&manifest) && path.exists());
        if unchanged {
            info!(snapshot = %path.display(), templates = %manifest.describe(), "the snapshot is up to date");
            return None;
        }
        Some(manifest)
    }

    /// Writes the stopped cluster at `cluster` as the snapshot `manifest` describes (see
    /// [`Embedded::snapshot_plan`]). Failures are logged: a snapshot is a shortcut, never a
    /// reason to fail a stop.
    pub fn save_snapshot(&self, cluster: &Path, manifest: &snapshot::Manifest) {
        let (Some(dir), Some(key)) = (&self.config.snapshot_dir, &self.snapshot_key) else {
            return;
        };
        let path = snapshot::path_for(dir, manifest.postgres_major);
        info!(snapshot = %path.display(), templates = %manifest.describe(), "writing a snapshot of the stopped cluster");
        if let Err(error) = snapshot::write(cluster, manifest, &path, key) {
            warn!(snapshot = %path.display(), %error, "could not write the snapshot");
        }
    }

    /// Removes the instance directory (unless `keep_data`) and unmounts its tmpfs.
    /// Call it after the [`RunningPostgres`] has been shut down.
    pub fn cleanup(self) {
        self.instance.cleanup(self.config.keep_data);
    }
}

/// Sweeps the instances a killed daemon left (on /dev/shm, and the rooms of their databases
/// in `--databases-dir`), and logs what went.
fn sweep_stale_instances(config: &EmbeddedConfig) {
    let mut swept = sweep::sweep_stale(Path::new(instance::SHM_ROOT), config.data_dir.as_deref());
    // The rooms of the databases a killed daemon left in `--databases-dir`.
    if let Some(dir) = &config.databases_dir {
        swept.extend(sweep::sweep_stale(dir, None));
    }
    if !swept.is_empty() {
        info!(count = swept.len(), dirs = ?swept, "swept stale pglease instances");
    }
}

/// The key that authenticates snapshots, when there is a snapshot directory.
///
/// The key is kept outside the snapshot directory (made at the first start in the cache
/// root, beside the initdb cache): whoever can write the snapshots cannot forge one. A key
/// that cannot be read fails the start: without it no snapshot could be trusted nor
/// written.
fn snapshot_key(
    config: &EmbeddedConfig,
    cache_root: &Path,
) -> Result<Option<snapshot::SnapshotKey>, StartError> {
    if config.snapshot_dir.is_none() {
        return Ok(None);
    }
    let path = config
        .snapshot_key_file
        .clone()
        .unwrap_or_else(|| snapshot::default_key_path(cache_root));
    Ok(Some(snapshot::load_or_create_key(&path)?))
}

/// Opens the bounded server log. The log lives with WAL and the catalogs: its cap is a
/// share of their room (the rest the databases' tmpfs leaves, else the whole file system).
fn open_server_log(instance: &Instance) -> Result<ServerLog, StartError> {
    let room = match instance.databases_space {
        Some(split) => split.rest,
        None => filesystem::total_bytes(&instance.dir)?,
    };
    ServerLog::open(&instance.log_path, server_log::cap_for(room))
        .map_err(|e| util::io_error("cannot open", &instance.log_path, e))
}

/// The generation of a kept cluster to start again instead of a fresh one. Only a
/// configured, kept directory is reused, and only a cluster stopped cleanly: a
/// postmaster.pid left behind means it crashed (or was killed) mid-flight.
fn kept_generation(config: &EmbeddedConfig, instance: &Instance, generation: u32) -> Option<u32> {
    (config.keep_data && config.data_dir.is_some() && generation > 0)
        .then(|| instance.cluster_dir(generation))
        .filter(|dir| dir.join("PG_VERSION").exists() && !dir.join("postmaster.pid").exists())
        .map(|_| generation)
}

/// Runs `work` on tokio's blocking pool, re-raising its panic if it panics.
async fn blocking<T, F>(work: F) -> Result<T, StartError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, StartError> + Send + 'static,
{
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result,
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            // Only when the runtime is shutting down.
            Err(e) => Err(StartError::Io {
                action: "interrupted while preparing postgres in",
                path: PathBuf::from(instance::SHM_ROOT),
                source: std::io::Error::other(e),
            }),
        },
    }
}
