//! Supervision of the embedded postgres: finding the binaries, the instance directory on
//! tmpfs (optionally a dedicated mount), the OS user when we are root, the initdb cache,
//! spawning postgres from a long-lived thread with a parent-death signal, readiness,
//! fast shutdown, and the sweep of instances a killed daemon left behind.
//!
//! It runs no SQL beyond the readiness probe and knows nothing of templates or leases;
//! the actor owns the values returned here.
//!
//! Submodules: `binaries` (which server, through `pglease-binaries`), `instance` (directory,
//! tmpfs, storage), `run_as` (the OS user), `marker` (whose instance it is), `sweep` (stale
//! instances), `filesystem` (tmpfs check, free space, mount points), `initdb` (initdb and
//! its cache), `spawn` (the spawner thread), `util` (shared helpers).

mod binaries;
mod cow;
mod filesystem;
mod initdb;
mod instance;
mod marker;
mod run_as;
pub mod snapshot;
mod space;
mod spawn;
mod storage;
mod sweep;
#[cfg(test)]
mod tests;
mod util;

pub use spawn::SCRUBBED_ENV;

use std::ffi::OsString;
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tracing::{error, info, warn};

use self::binaries::Binaries;
pub(crate) use self::cow::used_bytes;
use self::initdb::Cache;
use self::instance::{Instance, INITDB_TMP_PREFIX};
use self::run_as::RunAs;
use self::spawn::{CommandSpec, Output};
pub(crate) use self::storage::AUTO_MIN_TEMPLATE_BYTES;
use self::storage::{largest_template, StorageHints};
use self::util::{io_error, write_anew};
use crate::config::{EmbeddedConfig, LeaseAuth, TemplateConfig};
use crate::error::StartError;
use crate::types::StorageStatus;

/// The superuser role initdb creates; it connects only over the private unix socket.
pub const ADMIN_USER: &str = "postgres";

/// Ceiling on start-up: generous, since a loaded CI machine can be slow, and an early
/// exit is noticed at once anyway.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How often readiness is polled: a start takes ~150 ms, so this adds little latency.
const READY_POLL: Duration = Duration::from_millis(20);
/// How often shutdown checks whether the postmaster has exited.
const EXIT_POLL: Duration = Duration::from_millis(10);
/// Log lines quoted in start-up errors.
const ERROR_TAIL_LINES: usize = 20;

/// The `pg_hba.conf` written at every start (first match wins). Lease roles are named like
/// their databases, so `sameuser` lets each one open its own database and nothing else.
/// The IntegreSQL clients' role, if any, reaches a database only while it is a member of
/// the role named like it: a template being initialized (`samerole`; its name needs no
/// quoting, `names::check_role_name`).
fn pg_hba(lease_auth: LeaseAuth, integresql_role: Option<&str>) -> String {
    let method = match lease_auth {
        LeaseAuth::Scram { .. } => "scram-sha-256",
        LeaseAuth::Trust => "trust",
    };
    let integresql = match integresql_role {
        Some(role) => format!(
            "# The IntegreSQL clients' role (--integresql-pg-user): templates being initialized.\n\
             host    samerole   {role:<10} all       scram-sha-256\n"
        ),
        None => String::new(),
    };
    format!(
        "\
# Written by pglease at every start; edits are lost.
# The socket directory is private (mode 0700, owned by the server's OS user), so only the
# daemon (root or that user) can use the trusted local connections.
local   all        all                  trust
# The superuser never over TCP.
host    all        postgres   all       reject
{integresql}\
# A lease role (named like its database) reaches its own database only.
host    sameuser   all        all       {method}
"
    )
}
/// How a start obtained its cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterOrigin {
    /// Copied from the initdb cache; initdb did not run.
    CopiedFromCache,
    /// initdb ran and its result was stored in the cache for later starts.
    InitdbCached,
    /// initdb ran; the cache could not be used.
    InitdbUncached,
    /// The cluster a clean stop left in a kept data directory (`keep_data` with `data_dir`),
    /// with its templates and ready clones.
    Kept,
    /// Unpacked from a snapshot (`snapshot_dir`), with its templates.
    Snapshot,
}

impl ClusterOrigin {
    /// Whether initdb ran for this start.
    pub fn ran_initdb(self) -> bool {
        matches!(
            self,
            ClusterOrigin::InitdbCached | ClusterOrigin::InitdbUncached
        )
    }
}

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
    /// The manifest of the snapshot this server started from, if it did: a stop writes a
    /// new one only when the templates differ.
    adopted: Option<snapshot::Manifest>,
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
        let swept = sweep::sweep_stale(Path::new(instance::SHM_ROOT), config.data_dir.as_deref());
        if !swept.is_empty() {
            info!(count = swept.len(), dirs = ?swept, "swept stale pglease instances");
        }
        let initdb_args = initdb::initdb_args(&config.encoding, &config.locale);
        let found = config
            .snapshot_dir
            .as_deref()
            .and_then(|dir| snapshot::find(dir, &binaries.version, &initdb_args));
        let hints = StorageHints {
            major: snapshot::major_of(&binaries.version),
            largest_template: largest_template(templates, found.as_ref()),
        };
        let instance = Instance::create(&config, &hints, &run_as)?;
        let cache = Cache::open(cache_root, &binaries.version, &initdb_args);
        let generation = instance.last_generation();
        // Only a configured, kept directory is reused, and only a cluster stopped cleanly:
        // a postmaster.pid left behind means it crashed (or was killed) mid-flight.
        let kept_generation = (config.keep_data && config.data_dir.is_some() && generation > 0)
            .then(|| instance.cluster_dir(generation))
            .filter(|dir| dir.join("PG_VERSION").exists() && !dir.join("postmaster.pid").exists())
            .map(|_| generation);
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
            adopted: None,
        })
    }

    /// Starts a fresh cluster (copied from the initdb cache) in a new data directory,
    /// removing the previous one, and returns once a connection succeeds.
    ///
    /// Call it again only once the previous [`RunningPostgres`] has exited or been shut
    /// down: its data directory is removed here. On error the new data directory is kept
    /// (and logged) until the next start.
    pub async fn start(&mut self) -> Result<RunningPostgres, StartError> {
        let snapshot = self.snapshot.take();
        match self
            .start_once(snapshot.as_ref().map(|s| s.path.clone()))
            .await
        {
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
        snapshot: Option<PathBuf>,
    ) -> Result<RunningPostgres, StartError> {
        let started = Instant::now();
        let reuse = self.kept_generation.take();
        match reuse {
            Some(kept) => self.generation = kept,
            None => self.generation += 1,
        }
        let launch = Launch {
            binaries: self.binaries.clone(),
            run_as: self.run_as.clone(),
            instance_dir: self.instance.dir.clone(),
            clusters_dir: self.instance.clusters(),
            socket_dir: self.instance.socket_dir.clone(),
            log_path: self.instance.log_path.clone(),
            data_dir: self.instance.cluster_dir(self.generation),
            in_memory: self.instance.in_memory,
            clones: self.instance.clones(),
            databases_space: self.instance.databases_space,
            cache: self.cache.clone(),
            initdb_args: self.initdb_args.clone(),
            config: (*self.config).clone(),
            generation: self.generation,
            previous_port: self.last_port,
            reuse_existing: reuse.is_some(),
            snapshot,
        };
        let launched = blocking(move || launch.run()).await?;
        self.last_port = Some(launched.port);
        // From here on the value owns the child: if this future is dropped, Drop kills it.
        let databases_space = Some(launched.data_dir.join(space::DIR))
            .filter(|base| filesystem::is_mount_point(base));
        let mut running = RunningPostgres {
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
        };
        match running.wait_ready().await {
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
        let Some(dir) = &self.config.snapshot_dir else {
            return;
        };
        let path = snapshot::path_for(dir, manifest.postgres_major);
        info!(snapshot = %path.display(), templates = %manifest.describe(), "writing a snapshot of the stopped cluster");
        if let Err(error) = snapshot::write(cluster, manifest, &path) {
            warn!(snapshot = %path.display(), %error, "could not write the snapshot");
        }
    }

    /// Removes the instance directory (unless `keep_data`) and unmounts its tmpfs.
    /// Call it after the [`RunningPostgres`] has been shut down.
    pub fn cleanup(self) {
        self.instance.cleanup(self.config.keep_data);
    }
}

/// Everything one start needs, detached from [`Embedded`] so it can run on a blocking thread.
struct Launch {
    binaries: Binaries,
    run_as: RunAs,
    instance_dir: PathBuf,
    /// Where the clusters go (the instance directory, or its copy-on-write store).
    clusters_dir: PathBuf,
    socket_dir: PathBuf,
    log_path: PathBuf,
    data_dir: PathBuf,
    in_memory: bool,
    /// The clusters' file system clones files.
    clones: bool,
    /// The databases get a tmpfs of their own (`space.rs`).
    databases_space: Option<space::Split>,
    cache: Option<Cache>,
    initdb_args: Vec<String>,
    config: EmbeddedConfig,
    generation: u32,
    previous_port: Option<u16>,
    /// Start the cluster already in `data_dir` (a kept one) instead of making one.
    reuse_existing: bool,
    /// A snapshot to unpack instead of a fresh cluster.
    snapshot: Option<PathBuf>,
}

/// A spawned (not yet ready) postmaster.
struct Launched {
    child: Child,
    data_dir: PathBuf,
    port: u16,
    origin: ClusterOrigin,
}

impl Launch {
    /// Makes the cluster, configures it and spawns postgres.
    fn run(self) -> Result<Launched, StartError> {
        // First, so that a size-limited tmpfs has room for the new cluster. A new
        // directory per generation also gives the new postmaster a new SysV shared
        // memory key, so backends lingering from a killed one cannot block it.
        instance::remove_stale_clusters(&self.clusters_dir, &self.data_dir);
        let origin = if self.reuse_existing {
            ClusterOrigin::Kept
        } else {
            self.fresh_data_dir()?;
            match self.unpack_snapshot()? {
                Some(origin) => origin,
                None => self.make_cluster()?,
            }
        };
        let hba = self.data_dir.join("pg_hba.conf");
        write_anew(
            &hba,
            pg_hba(
                self.config.lease_auth,
                self.config.integresql_role.as_deref(),
            )
            .as_bytes(),
            self.run_as.owner(),
        )?;
        let port = choose_port(
            self.config.port,
            self.previous_port,
            &self.config.listen_host,
        )?;

        // Never through a link: the instance directory is the server user's.
        use std::os::unix::fs::OpenOptionsExt;
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&self.log_path)
            .map_err(|e| io_error("cannot open", &self.log_path, e))?;
        let spec = CommandSpec {
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
            output: Output::File(
                log.try_clone()
                    .map_err(|e| io_error("cannot open", &self.log_path, e))?,
            ),
        };
        // A header line separates generations in the shared log.
        let _ = writeln!(
            log,
            "---- pglease: starting generation {}: {spec}",
            self.generation
        );
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
        Ok(Launched {
            child,
            data_dir: self.data_dir,
            port,
            origin,
        })
    }

    /// Removes whatever the data directory holds (its databases' tmpfs first) and, when
    /// the databases get a tmpfs of their own, makes it anew, empty, with that tmpfs;
    /// else the fill makes the directory.
    fn fresh_data_dir(&self) -> Result<(), StartError> {
        space::unmount_inside(&self.data_dir);
        match std::fs::remove_dir_all(&self.data_dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(io_error("cannot remove", &self.data_dir, e))
            }
            _ => {}
        }
        match self.databases_space {
            Some(split) => space::mount(&self.data_dir, split.databases, &self.run_as),
            None => Ok(()),
        }
    }

    /// Fills the data directory from the snapshot, if there is one and it unpacks.
    fn unpack_snapshot(&self) -> Result<Option<ClusterOrigin>, StartError> {
        let Some(path) = self.snapshot.as_ref() else {
            return Ok(None);
        };
        match snapshot::extract(path, &self.data_dir, self.run_as.owner()) {
            Ok(_) => Ok(Some(ClusterOrigin::Snapshot)),
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
            match initdb::copy_tree(entry, &self.data_dir, owner) {
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

    /// Puts initdb's output in place: renamed, or copied into the databases' tmpfs.
    fn move_into_place(&self, fresh: &Path) -> Result<(), StartError> {
        if self.databases_space.is_none() {
            return std::fs::rename(fresh, &self.data_dir)
                .map_err(|e| io_error("cannot rename into", &self.data_dir, e));
        }
        initdb::copy_tree(fresh, &self.data_dir, self.run_as.owner())?;
        std::fs::remove_dir_all(fresh).map_err(|e| io_error("cannot remove", fresh, e))
    }
}

/// What the cluster lives on, as far as postgres' settings care.
#[derive(Debug, Clone, Copy)]
struct Place {
    /// On tmpfs or ramfs.
    in_memory: bool,
    /// The file system clones files.
    clones: bool,
    /// The server's major version.
    major: u32,
    /// With the databases on a tmpfs of their own: the bytes the rest of the cluster has.
    rest: Option<u64>,
}

/// The settings every embedded server runs with, first on its command line (sizes, the
/// address and what depends on the file system follow; the user's settings come last and
/// override them): unsafe on purpose, tuned for throw-away data. Public so that the
/// benchmark's hand-tuned baseline runs exactly these.
pub const TUNED_SETTINGS: &[(&str, &str)] = &[
    // The data is thrown away: crash safety buys nothing.
    ("fsync", "off"),
    ("synchronous_commit", "off"),
    ("full_page_writes", "off"),
    ("wal_level", "minimal"),
    // Required by wal_level=minimal.
    ("max_wal_senders", "0"),
    // JIT compilation slows the short queries tests run.
    ("jit", "off"),
    ("checkpoint_timeout", "1d"),
    ("password_encryption", "scram-sha-256"),
    // stderr goes to our log file; a collector would write elsewhere.
    ("logging_collector", "off"),
];

/// Added to [`TUNED_SETTINGS`] when the cluster is in memory (tmpfs or ramfs).
pub const IN_MEMORY_SETTINGS: &[(&str, &str)] = &[
    // Dynamic shared memory as files in the data directory's pg_dynshmem instead of
    // /dev/shm/PostgreSQL.*: just as fast on tmpfs, counted against a dedicated tmpfs'
    // size, and removed with the instance even when postgres was killed (a killed
    // postmaster leaves its /dev/shm segments behind for good).
    ("dynamic_shared_memory_type", "mmap"),
];

/// postgres' command line after the binary: tuned for throw-away data on tmpfs.
fn server_args(
    config: &EmbeddedConfig,
    data_dir: &Path,
    socket_dir: &Path,
    port: u16,
    place: &Place,
) -> Vec<OsString> {
    let mut settings: Vec<(String, String)> = TUNED_SETTINGS
        .iter()
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect();
    settings.extend([
        ("shared_buffers".to_string(), config.shared_buffers.clone()),
        (
            "max_connections".to_string(),
            config.max_connections.to_string(),
        ),
        ("listen_addresses".to_string(), config.listen_host.clone()),
        ("port".to_string(), port.to_string()),
        (
            "unix_socket_directories".to_string(),
            guc_list_element(&socket_dir.to_string_lossy()),
        ),
    ]);
    settings.extend(match place.rest {
        // WAL shares the rest with the shared catalogs: checkpoints recycle it long
        // before it can fill that (`space.rs`), at RAM speed.
        Some(rest) => [
            ("max_wal_size".to_string(), space::max_wal_size(rest)),
            ("min_wal_size".to_string(), space::max_wal_size(rest)),
        ],
        // Checkpoints only when CREATE/DROP DATABASE force them.
        None => [
            ("max_wal_size".to_string(), "8GB".to_string()),
            ("min_wal_size".to_string(), "80MB".to_string()),
        ],
    });
    if place.in_memory {
        settings.extend(
            IN_MEMORY_SETTINGS
                .iter()
                .map(|(key, value)| (key.to_string(), value.to_string())),
        );
    }
    if place.clones && place.major >= 18 {
        // On a file system that clones, a FILE_COPY clone shares its template's blocks.
        // Before 18 postgres only copies; those servers work there all the same.
        settings.push(("file_copy_method".to_string(), "clone".to_string()));
    }
    // Last, so that the user's settings override ours.
    settings.extend(config.settings.iter().cloned());

    let mut args: Vec<OsString> = vec!["-D".into(), data_dir.into()];
    for (key, value) in settings {
        args.push("-c".into());
        args.push(format!("{key}={value}").into());
    }
    args
}

/// Double-quotes one element of a list setting when it holds a separator.
fn guc_list_element(value: &str) -> String {
    if value.contains([',', ' ', '"']) {
        format!("\"{}\"", value.replace('"', "\"\""))
    } else {
        value.to_owned()
    }
}

/// The host lease holders should use: `advertise_host`, else the first listen address,
/// with a wildcard replaced by the loopback address.
fn advertised_host(config: &EmbeddedConfig) -> String {
    if let Some(host) = &config.advertise_host {
        return host.clone();
    }
    let first = config.listen_host.split(',').next().unwrap_or("").trim();
    match first {
        "" | "*" | "0.0.0.0" | "::" => "127.0.0.1".to_owned(),
        host => host.to_owned(),
    }
}

/// The port to use: the configured one, else the previous one if still free, else a
/// free one the kernel picks. (Another process may take it before postgres binds it;
/// postgres then fails at start-up with a clear log line.)
fn choose_port(
    configured: Option<u16>,
    previous: Option<u16>,
    listen_host: &str,
) -> Result<u16, StartError> {
    if let Some(port) = configured {
        return Ok(port);
    }
    let host = match listen_host.split(',').next().unwrap_or("").trim() {
        "" | "*" => "0.0.0.0",
        host => host,
    };
    if let Some(port) = previous {
        if TcpListener::bind((host, port)).is_ok() {
            return Ok(port);
        }
        warn!(port, "the previous port is taken; postgres gets a new one");
    }
    TcpListener::bind((host, 0))
        .or_else(|_| TcpListener::bind(("127.0.0.1", 0)))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(|e| io_error("cannot find a free port on", Path::new(listen_host), e))
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
    /// What `postgres --version` printed, e.g. "postgres (PostgreSQL) 15.18 (Debian ...)".
    pub version: String,
    /// Which start of the instance this is (1 for the first); names `pgdata-<generation>`.
    pub generation: u32,
    /// Whether initdb ran or the cluster came from the cache.
    pub cluster_origin: ClusterOrigin,
    /// What the cluster lives on (`--storage`), and why.
    pub storage: StorageStatus,
    /// Where clones share blocks: what the store held before any cluster was put there.
    pub store_base: Option<u64>,
    /// The databases' tmpfs (`<data_dir>/base`), when they have one of their own.
    pub databases_space: Option<PathBuf>,
    /// The postmaster; `None` once reaped by shutdown.
    child: Option<Child>,
}

impl RunningPostgres {
    /// Connection settings for the superuser over the unix socket, database `postgres`.
    pub fn admin_config(&self) -> tokio_postgres::Config {
        let mut config = tokio_postgres::Config::new();
        config
            .host_path(&self.socket_dir)
            .port(self.port)
            .user(ADMIN_USER)
            .dbname("postgres")
            .application_name("pglease")
            // A local socket answers at once unless the server is overloaded.
            .connect_timeout(Duration::from_secs(5));
        config
    }

    /// `Some(status)` once the postmaster has exited (reaping it); never blocks.
    pub fn poll_exit(&mut self) -> Option<String> {
        let Some(child) = self.child.as_mut() else {
            return Some("already stopped".to_owned());
        };
        match child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            Ok(None) => None,
            // ECHILD: it was reaped elsewhere, so it is gone.
            Err(e) => Some(format!("cannot wait for it ({e})")),
        }
    }

    /// The last `lines` lines of the server log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail_lines(&self.log_path, lines)
            .unwrap_or_else(|e| format!("(cannot read {}: {e})", self.log_path.display()))
    }

    /// Fast shutdown (SIGINT), then SIGKILL after `timeout`; always reaps.
    pub async fn shutdown(mut self, timeout: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let started = Instant::now();
        if let Ok(Some(status)) = child.try_wait() {
            info!(pid = self.pid, %status, "postgres had already exited");
            return;
        }
        // SIGINT is postgres' fast shutdown: sessions are ended, a checkpoint is written.
        if let Err(e) = signal(self.pid, Signal::SIGINT) {
            warn!(pid = self.pid, error = %e, "cannot send SIGINT to postgres");
        }
        if let Some(status) = wait_exit(&mut child, timeout).await {
            info!(
                pid = self.pid,
                %status,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "postgres stopped"
            );
            return;
        }
        warn!(
            pid = self.pid,
            timeout_ms = timeout.as_millis() as u64,
            "postgres did not stop in time; sending SIGKILL"
        );
        let _ = signal(self.pid, Signal::SIGKILL);
        // SIGKILL completes unless the process is stuck in the kernel.
        match wait_exit(&mut child, Duration::from_secs(10)).await {
            Some(status) => info!(pid = self.pid, %status, "postgres killed"),
            None => error!(
                pid = self.pid,
                "postgres survived SIGKILL for 10 s; leaving it"
            ),
        }
    }

    /// Polls until a connection succeeds, the postmaster exits, or [`READY_TIMEOUT`].
    async fn wait_ready(&mut self) -> Result<(), StartError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut config = self.admin_config();
        config.connect_timeout(Duration::from_secs(2));
        loop {
            if let Some(status) = self.poll_exit() {
                return Err(StartError::EarlyExit {
                    status,
                    log_path: self.log_path.clone(),
                    tail: self.log_tail(ERROR_TAIL_LINES),
                });
            }
            // postmaster.pid says when it accepts connections (PG 10+); probing before
            // that would only fill the log with "the database system is starting up".
            let status = postmaster_status(&self.data_dir);
            if !matches!(status.as_deref(), Some("starting" | "stopping")) {
                let attempt = tokio::time::timeout(
                    Duration::from_secs(3),
                    config.connect(tokio_postgres::NoTls),
                );
                if let Ok(Ok((client, connection))) = attempt.await {
                    // The handshake succeeding is the readiness signal; close at once.
                    drop(client);
                    drop(connection);
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                self.kill_and_reap();
                return Err(StartError::NotReady {
                    pid: self.pid,
                    timeout_secs: READY_TIMEOUT.as_secs(),
                    log_path: self.log_path.clone(),
                    tail: self.log_tail(ERROR_TAIL_LINES),
                });
            }
            tokio::time::sleep(READY_POLL).await;
        }
    }

    /// SIGKILL and reap, without the warning of `Drop`.
    fn kill_and_reap(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = signal(self.pid, Signal::SIGKILL);
            let _ = child.wait();
        }
    }
}

impl Drop for RunningPostgres {
    /// A last resort: the actor shuts postgres down explicitly. Blocks briefly to reap.
    fn drop(&mut self) {
        let still_running = self
            .child
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)));
        if still_running {
            warn!(pid = self.pid, "postgres dropped while running; killing it");
            self.kill_and_reap();
        }
    }
}

/// Waits up to `timeout` for `child` to exit, polling without blocking the runtime.
async fn wait_exit(child: &mut Child, timeout: Duration) -> Option<String> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status.to_string()),
            Ok(None) => {}
            Err(e) => return Some(format!("cannot wait for it ({e})")),
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(EXIT_POLL).await;
    }
}

/// Sends `signal` to `pid`.
fn signal(pid: u32, signal: Signal) -> nix::Result<()> {
    let pid = i32::try_from(pid).map_err(|_| nix::Error::EINVAL)?;
    nix::sys::signal::kill(Pid::from_raw(pid), signal)
}

/// Line 8 of `postmaster.pid`: "starting", "ready", "stopping" or "standby" (PG 10+).
fn postmaster_status(data_dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(data_dir.join("postmaster.pid")).ok()?;
    Some(text.lines().nth(7)?.trim().to_owned())
}

/// The last `lines` lines of the file at `path`, reading at most its last 64 KiB.
fn tail_lines(path: &Path, lines: usize) -> std::io::Result<String> {
    const WINDOW: u64 = 64 * 1024;
    let mut file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(WINDOW)))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    let text = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = text.lines().collect();
    Ok(all[all.len().saturating_sub(lines)..].join("\n"))
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
