//! Tests of postgres supervision, most against a real server: the tmpfs check,
//! start/connect/shutdown, restart after a crash, start-up errors, the stale sweep and
//! the initdb cache. They find the server through `PGLEASE_PG_BIN_DIR`, else the normal
//! discovery (`pg_config --bindir`, /usr/lib/postgresql/*/bin; the search itself is
//! tested in `pglease-binaries`).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;

use super::marker::{self, Marker};
use super::settings::{pg_hba, server_args, Place};
use super::util::write_anew;
use super::*;
use super::{filesystem, instance, run_as, sweep, util};
use crate::config::{LeaseAuth, PoolLimits};

/// The env var naming the server's bin directory for tests.
const BIN_DIR_VAR: &str = "PGLEASE_PG_BIN_DIR";

/// A directory removed when the test ends.
struct Scratch(PathBuf);

impl Scratch {
    /// A fresh directory under `parent`.
    fn under(parent: &Path, name: &str) -> Scratch {
        let dir = parent.join(format!("pglease-test-{name}-{}", util::random_hex(6)));
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        Scratch(dir)
    }

    /// A fresh directory under the system temp dir.
    fn new(name: &str) -> Scratch {
        Scratch::under(&std::env::temp_dir(), name)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // The databases' tmpfs of a cluster a test left (root, on tmpfs) first.
        super::space::unmount_inside(&self.0);
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The configured bin dir for tests, if any.
fn bin_dir_from_env() -> Option<PathBuf> {
    std::env::var_os(BIN_DIR_VAR).map(PathBuf::from)
}

/// A small server config with a private initdb cache.
fn test_config(cache: &Path) -> EmbeddedConfig {
    let mut config = EmbeddedConfig::for_limits(&PoolLimits::default(), 1);
    config.bin_dir = bin_dir_from_env();
    config.cache_dir = Some(cache.to_path_buf());
    config.shared_buffers = "16MB".into();
    config.max_connections = 20;
    config
}

/// `Embedded::prepare`, failing with a hint about the bin dir variable.
async fn prepare(config: &EmbeddedConfig) -> Embedded {
    match Embedded::prepare(config, &[]).await {
        Ok(embedded) => embedded,
        Err(e) => panic!("prepare failed: {e}\n(set {BIN_DIR_VAR} to the server's bin directory if postgres was not found)"),
    }
}

/// `Embedded::start`, failing with the error's message (which quotes the log).
async fn start(embedded: &mut Embedded) -> RunningPostgres {
    match embedded.start().await {
        Ok(running) => running,
        Err(e) => panic!("start failed: {e}"),
    }
}

/// Polls `done` every 20 ms until it holds, panicking after `timeout`.
async fn poll_until(timeout: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Connects as the superuser and returns one text value of `sql`.
async fn query_text(running: &RunningPostgres, sql: &str) -> String {
    let (client, connection) = running
        .admin_config()
        .connect(tokio_postgres::NoTls)
        .await
        .expect("connect over the unix socket");
    let task = tokio::spawn(connection);
    let messages = client.simple_query(sql).await.expect("query");
    drop(client);
    let _ = task.await;
    messages
        .iter()
        .find_map(|message| match message {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        })
        .expect("one row")
}

/// Pids of processes working inside `dir` (postgres backends chdir into their data dir).
fn processes_in(dir: &Path) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .expect("read /proc")
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd.starts_with(dir))
                && marker::process_alive(*pid)
        })
        .collect()
}

/// A pid that no longer runs: a child that has exited and been reaped.
fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true")
        .spawn()
        .expect("spawn true");
    let pid = child.id();
    child.wait().expect("wait for true");
    pid
}

/// A directory that is not on tmpfs or ramfs, for the refusal test.
fn directory_on_disk() -> PathBuf {
    let mut candidates = vec![std::env::temp_dir()];
    if let Ok(exe) = std::env::current_exe() {
        // target/debug/deps/<test binary> → target
        candidates.extend(exe.ancestors().nth(3).map(Path::to_path_buf));
    }
    candidates.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    candidates
        .into_iter()
        .find(|dir| filesystem::check_in_memory(dir, false).is_err())
        .expect("some test directory on persistent storage")
}

#[tokio::test]
async fn refuses_a_directory_on_disk_unless_allowed() {
    let parent = Scratch::under(&directory_on_disk(), "on-disk");
    let cache = Scratch::new("cache-on-disk");
    let mut config = test_config(cache.path());
    let data_dir = parent.path().join("instance");
    config.data_dir = Some(data_dir.clone());
    match Embedded::prepare(&config, &[]).await {
        Err(StartError::NotTmpfs { path, fs_type }) => {
            assert_eq!(path, data_dir);
            assert!(!fs_type.contains("tmpfs"), "{fs_type}");
        }
        other => panic!("expected NotTmpfs, got {other:?}"),
    }
    // The refusal leaves nothing behind.
    assert!(!data_dir.exists());

    // Allowed: it starts there, here also with an unusable cache (a file, not a dir),
    // which only costs an initdb per start.
    config.allow_unsafe_on_disk = true;
    let not_a_dir = cache.path().join("file");
    std::fs::write(&not_a_dir, "").expect("write");
    config.cache_dir = Some(not_a_dir);
    let mut embedded = prepare(&config).await;
    assert_eq!(embedded.instance_dir(), data_dir);
    assert_eq!(embedded.initdb_cache_entry(), None);
    let running = start(&mut embedded).await;
    assert_eq!(running.cluster_origin, ClusterOrigin::InitdbUncached);
    assert_eq!(query_text(&running, "SELECT 1").await, "1");
    running.shutdown(Duration::from_secs(10)).await;
    embedded.cleanup();
    assert!(!data_dir.exists());
}

#[tokio::test]
async fn starts_connects_and_shuts_down_cleanly() {
    let cache = Scratch::new("cache-lifecycle");
    let mut embedded = prepare(&test_config(cache.path())).await;
    let instance_dir = embedded.instance_dir().to_path_buf();
    assert!(
        instance_dir.starts_with("/dev/shm"),
        "{}",
        instance_dir.display()
    );
    let marker = marker::read_marker(&instance_dir).expect("marker");
    assert_eq!(marker.pid, Some(std::process::id()));

    let running = start(&mut embedded).await;
    assert_eq!(running.generation, 1);
    assert_eq!(running.data_dir, instance_dir.join("pgdata-1"));
    assert!(running.version.contains("PostgreSQL"));
    assert_eq!(query_text(&running, "SELECT 1").await, "1");
    assert_eq!(query_text(&running, "SHOW fsync").await, "off");
    assert_eq!(query_text(&running, "SHOW wal_level").await, "minimal");
    assert_eq!(
        query_text(&running, "SHOW port").await,
        running.port.to_string()
    );
    assert_eq!(query_text(&running, "SHOW max_connections").await, "20");

    // The socket directory is private, and owned by the server's user.
    let socket_meta = std::fs::metadata(&running.socket_dir).expect("socket dir");
    assert_eq!(socket_meta.permissions().mode() & 0o777, 0o700);
    let data_meta = std::fs::metadata(&running.data_dir).expect("data dir");
    assert_eq!(data_meta.permissions().mode() & 0o777, 0o700);
    if nix::unistd::geteuid().is_root() {
        // Running as root, postgres runs as another user that owns its files.
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", running.pid)).expect("status");
        let uid_line = status
            .lines()
            .find(|line| line.starts_with("Uid:"))
            .expect("Uid line");
        assert!(
            !uid_line.split_whitespace().skip(1).any(|uid| uid == "0"),
            "{uid_line}"
        );
        assert_ne!(data_meta.uid(), 0);
        assert_eq!(socket_meta.uid(), data_meta.uid());
    }

    let pid = running.pid;
    assert!(!processes_in(&instance_dir).is_empty());
    running.shutdown(Duration::from_secs(10)).await;
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "postmaster {pid} left behind"
    );
    assert_eq!(
        processes_in(&instance_dir),
        Vec::<u32>::new(),
        "backends left behind"
    );
    embedded.cleanup();
    assert!(!instance_dir.exists());
}

#[tokio::test]
async fn restarts_in_a_new_generation_after_a_kill() {
    let cache = Scratch::new("cache-restart");
    let mut embedded = prepare(&test_config(cache.path())).await;
    let mut first = start(&mut embedded).await;
    let port = first.port;
    nix::sys::signal::kill(Pid::from_raw(first.pid as i32), Signal::SIGKILL).expect("kill -9");
    poll_until(Duration::from_secs(5), "the postmaster to die", || {
        first.poll_exit().is_some()
    })
    .await;
    assert!(first.poll_exit().expect("status").contains("signal: 9"));

    let second = start(&mut embedded).await;
    assert_eq!(second.generation, 2);
    assert_eq!(second.cluster_origin, ClusterOrigin::CopiedFromCache);
    assert_eq!(second.port, port, "the port is kept across restarts");
    assert_eq!(query_text(&second, "SELECT 1").await, "1");
    // The dead generation's directory is gone.
    assert!(!first.data_dir.exists());
    drop(first);
    second.shutdown(Duration::from_secs(10)).await;
    embedded.cleanup();
}

#[tokio::test]
async fn an_early_exit_quotes_the_server_log() {
    let cache = Scratch::new("cache-early-exit");
    let mut config = test_config(cache.path());
    config
        .settings
        .push(("pglease_bogus_setting".into(), "1".into()));
    let mut embedded = prepare(&config).await;
    match embedded.start().await {
        Err(StartError::EarlyExit {
            status,
            log_path,
            tail,
        }) => {
            assert!(status.contains("exit status"), "{status}");
            assert_eq!(log_path, embedded.instance_dir().join("postgres.log"));
            assert!(tail.contains("pglease_bogus_setting"), "tail:\n{tail}");
        }
        Err(other) => panic!("expected EarlyExit, got {other}"),
        Ok(running) => panic!("expected EarlyExit, got a server on port {}", running.port),
    }
    // The failed cluster is kept for inspection.
    assert!(embedded
        .instance_dir()
        .join("pgdata-1")
        .join("PG_VERSION")
        .exists());
    embedded.cleanup();
}

/// When another process binds the port pglease found free before postgres does (many
/// servers starting at once, as in a test suite), postgres exits at start-up with "Address
/// already in use"; the start is tried again on another port, three attempts in all. Here
/// the port stays taken (a `port` setting of one the test holds: the command line refuses
/// it, the library does not), so every attempt meets it and the start fails with postgres'
/// words.
#[tokio::test]
async fn a_port_taken_before_postgres_binds_it_is_tried_again_then_reported() {
    let held = std::net::TcpListener::bind("127.0.0.1:0").expect("a port to hold");
    let port = held.local_addr().expect("its address").port();
    let cache = Scratch::new("cache-port-taken");
    let mut config = test_config(cache.path());
    config.settings.push(("port".into(), port.to_string()));
    let mut embedded = prepare(&config).await;
    match embedded.start().await {
        Err(StartError::EarlyExit { tail, log_path, .. }) => {
            assert!(tail.contains("Address already in use"), "tail:\n{tail}");
            let log = std::fs::read_to_string(&log_path).expect("the server log");
            let attempts = log.matches("---- pglease: starting generation").count();
            assert_eq!(attempts, 3, "three attempts:\n{log}");
        }
        Err(other) => panic!("expected EarlyExit, got {other}"),
        Ok(running) => panic!("expected EarlyExit, got a server on port {}", running.port),
    }
    drop(held);
    embedded.cleanup();
}

#[tokio::test]
async fn the_sweep_stops_a_stale_postmaster_and_removes_its_dir() {
    let cache = Scratch::new("cache-sweep");
    // A private parent, so that sweeps of /dev/shm by concurrent tests cannot race ours.
    let shm = Scratch::under(Path::new(instance::SHM_ROOT), "sweep");
    let stale_dir = shm.path().join("pglease-stale");
    let mut config = test_config(cache.path());
    config.data_dir = Some(stale_dir.clone());
    let mut orphaned = prepare(&config).await;
    let mut postmaster = start(&mut orphaned).await;

    // While its daemon (us) lives, nothing is swept.
    assert_eq!(sweep::sweep_stale(shm.path(), None), Vec::<PathBuf>::new());
    // A directory without our marker is never touched.
    let foreign = shm.path().join("pglease-foreign");
    std::fs::create_dir(&foreign).expect("mkdir");
    // Pretend the daemon died: the marker now names a dead pid.
    std::fs::write(
        stale_dir.join(marker::MARKER_FILE),
        format!("pid={}\n", dead_pid()),
    )
    .expect("rewrite marker");

    let swept = sweep::sweep_stale(shm.path(), None);
    assert_eq!(swept, vec![stale_dir.clone()]);
    assert!(!stale_dir.exists());
    assert!(foreign.exists());
    // The postmaster (still our child, so reaped here) got the signal and stopped.
    poll_until(
        Duration::from_secs(5),
        "the stale postmaster to exit",
        || postmaster.poll_exit().is_some(),
    )
    .await;
    assert_eq!(processes_in(&stale_dir), Vec::<u32>::new());
    drop(postmaster);
    orphaned.cleanup();

    // prepare sweeps a stale configured directory too, then uses it.
    let mut second = prepare(&config).await;
    let mut abandoned = start(&mut second).await;
    std::fs::write(
        stale_dir.join(marker::MARKER_FILE),
        format!("pid={}\n", dead_pid()),
    )
    .expect("rewrite marker");
    let mut third = prepare(&config).await;
    poll_until(
        Duration::from_secs(5),
        "the stale postmaster to exit",
        || abandoned.poll_exit().is_some(),
    )
    .await;
    let marker = marker::read_marker(&stale_dir).expect("new marker");
    assert_eq!(marker.pid, Some(std::process::id()));
    assert!(marker.start_time.is_some());
    let fresh = start(&mut third).await;
    assert_eq!(fresh.generation, 1);
    assert_eq!(query_text(&fresh, "SELECT 1").await, "1");
    fresh.shutdown(Duration::from_secs(10)).await;
    third.cleanup();
    assert!(!stale_dir.exists());
    // `second` lost its directory to the sweep: dropped without cleanup, which would
    // remove the directory `third` reused.
    drop(abandoned);
    drop(second);
}

#[test]
fn marker_liveness_uses_pid_and_start_time() {
    let dir = Scratch::new("marker");
    marker::write_marker(dir.path(), false).expect("write");
    let ours = marker::read_marker(dir.path()).expect("read");
    assert_eq!(ours.pid, Some(std::process::id()));
    assert!(!ours.kept);
    let own_start = marker::proc_stat(std::process::id())
        .expect("stat")
        .start_time;
    assert_eq!(ours.start_time, Some(own_start));
    marker::write_marker(dir.path(), true).expect("write kept");
    assert!(marker::read_marker(dir.path()).expect("read").kept);

    assert!(
        marker::owner_alive(&ours),
        "our own marker names a live daemon"
    );

    let marker = |pid: u32, start_time: Option<u64>| Marker {
        pid: Some(pid),
        start_time,
        kept: false,
    };
    assert!(!marker::owner_alive(&marker(dead_pid(), None)));
    // A live process that is not pglease, found by name when the start time is missing,
    // and by start time otherwise (a reused pid).
    let mut sleeper = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .expect("spawn sleep");
    let sleeper_pid = sleeper.id();
    let sleeper_start = marker::proc_stat(sleeper_pid).expect("stat").start_time;
    assert!(!marker::owner_alive(&marker(sleeper_pid, None)));
    assert!(!marker::owner_alive(&marker(
        sleeper_pid,
        Some(sleeper_start + 1)
    )));
    assert!(marker::owner_alive(&marker(
        sleeper_pid,
        Some(sleeper_start)
    )));
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    // A zombie or a reaped process is dead.
    assert!(!marker::owner_alive(&marker(
        sleeper_pid,
        Some(sleeper_start)
    )));

    // The file round-trips, and a missing one reads as no marker.
    std::fs::write(
        dir.path().join(marker::MARKER_FILE),
        format!("pid={sleeper_pid}\nstart_time={sleeper_start}\n"),
    )
    .expect("write");
    assert_eq!(
        marker::read_marker(dir.path()),
        Some(marker(sleeper_pid, Some(sleeper_start)))
    );
    assert_eq!(marker::read_marker(&dir.path().join("missing")), None);
}

#[tokio::test]
async fn the_initdb_cache_is_filled_once_then_reused() {
    let cache = Scratch::new("cache-reuse");
    let config = test_config(cache.path());

    let cold_started = Instant::now();
    let mut first = prepare(&config).await;
    let entry = first
        .initdb_cache_entry()
        .expect("cache usable")
        .to_path_buf();
    assert!(entry.starts_with(cache.path()));
    let running = start(&mut first).await;
    let cold = cold_started.elapsed();
    assert_eq!(running.cluster_origin, ClusterOrigin::InitdbCached);
    assert!(running.cluster_origin.ran_initdb());
    assert!(entry.join("PG_VERSION").is_file());
    running.shutdown(Duration::from_secs(10)).await;
    first.cleanup();

    // A new instance (a new daemon) with the same version and settings copies the entry.
    let warm_started = Instant::now();
    let mut second = prepare(&config).await;
    assert_eq!(second.initdb_cache_entry(), Some(entry.as_path()));
    let running = start(&mut second).await;
    let warm = warm_started.elapsed();
    assert_eq!(running.cluster_origin, ClusterOrigin::CopiedFromCache);
    assert!(!running.cluster_origin.ran_initdb());
    assert_eq!(query_text(&running, "SHOW server_encoding").await, "UTF8");
    // The hba rules were written over the cached ones.
    let hba = std::fs::read_to_string(running.data_dir.join("pg_hba.conf")).expect("hba");
    assert!(hba.contains("host    all        postgres   all       reject"));
    assert!(hba.contains("host    sameuser   all        all       scram-sha-256"));
    eprintln!("cold start (initdb + cache fill): {cold:?}; warm start (cache copy): {warm:?}");
    running.shutdown(Duration::from_secs(10)).await;
    second.cleanup();

    // Other settings are another entry.
    let mut other = config.clone();
    other.locale = "C.UTF-8".into();
    let third = prepare(&other).await;
    assert_ne!(third.initdb_cache_entry(), Some(entry.as_path()));
    third.cleanup();
}

#[tokio::test]
async fn a_dedicated_tmpfs_is_mounted_and_unmounted() {
    let cache = Scratch::new("cache-mount");
    // Deliberately on disk: the mount is what makes it tmpfs.
    let parent = Scratch::new("mount");
    let mount_point = parent.path().join("instance");
    let mut config = test_config(cache.path());
    config.data_dir = Some(mount_point.clone());
    config.tmpfs_size = Some(256 * 1024 * 1024);
    if !nix::unistd::geteuid().is_root() {
        match Embedded::prepare(&config, &[]).await {
            Err(StartError::MountNeedsRoot { path }) => assert_eq!(path, mount_point),
            other => panic!("expected MountNeedsRoot, got {other:?}"),
        }
        return;
    }
    let mut embedded = prepare(&config).await;
    let parent_dev = std::fs::metadata(parent.path()).expect("stat").dev();
    assert_ne!(
        std::fs::metadata(&mount_point).expect("stat").dev(),
        parent_dev,
        "not mounted"
    );
    let running = start(&mut embedded).await;
    assert_eq!(query_text(&running, "SELECT 1").await, "1");
    running.shutdown(Duration::from_secs(10)).await;
    embedded.cleanup();
    assert!(!mount_point.exists());
    let mounts = std::fs::read_to_string("/proc/self/mounts").expect("mounts");
    assert!(
        !mounts.contains(mount_point.to_string_lossy().as_ref()),
        "still mounted"
    );
}

#[tokio::test]
async fn a_configured_dir_with_foreign_files_is_refused() {
    let cache = Scratch::new("cache-foreign");
    let shm = Scratch::under(Path::new(instance::SHM_ROOT), "foreign");
    std::fs::write(shm.path().join("precious"), "data").expect("write");
    let mut config = test_config(cache.path());
    config.data_dir = Some(shm.path().to_path_buf());
    match Embedded::prepare(&config, &[]).await {
        Err(StartError::InstanceDirNotOurs { path }) => assert_eq!(path, shm.path()),
        other => panic!("expected InstanceDirNotOurs, got {other:?}"),
    }
    assert!(shm.path().join("precious").exists());
}

#[test]
fn server_args_put_user_settings_last() {
    let mut config = EmbeddedConfig::for_limits(&PoolLimits::default(), 1);
    config.settings.push(("fsync".into(), "on".into()));
    let args: Vec<String> = server_args(
        &config,
        Path::new("/d"),
        Path::new("/s p"),
        5433,
        &Place {
            in_memory: true,
            clones: false,
            major: 15,
            rest: None,
            notify_queue: None,
        },
    )
    .into_iter()
    .map(|arg| arg.to_string_lossy().into_owned())
    .collect();
    assert_eq!(&args[..2], ["-D", "/d"]);
    assert_eq!(args.last().map(String::as_str), Some("fsync=on"));
    let first_fsync = args
        .iter()
        .position(|arg| arg == "fsync=off")
        .expect("ours");
    assert!(first_fsync < args.len() - 1);
    assert!(args.contains(&"port=5433".to_owned()));
    assert!(args.contains(&"unix_socket_directories=\"/s p\"".to_owned()));
    assert!(args.contains(&"listen_addresses=127.0.0.1".to_owned()));
    assert!(args.contains(&"dynamic_shared_memory_type=mmap".to_owned()));
    let on_disk = server_args(
        &config,
        Path::new("/d"),
        Path::new("/s"),
        5433,
        &Place {
            in_memory: false,
            clones: false,
            major: 15,
            rest: Some(96 << 20),
            notify_queue: Some(6 << 20),
        },
    );
    assert!(!on_disk.iter().any(|arg| arg
        .to_string_lossy()
        .starts_with("dynamic_shared_memory_type")));
    // WAL kept to a quarter of what the rest of a split cluster has.
    assert!(on_disk.iter().any(|arg| arg == "max_wal_size=32MB"));
    assert!(args.contains(&"max_wal_size=8GB".to_owned()));
    // No max_notify_queue_pages before 17: those servers refuse a setting they lack.
    assert!(!args
        .iter()
        .any(|arg| arg.starts_with("max_notify_queue_pages")));
}

/// From PostgreSQL 17 the notification queue is bounded at half its tmpfs, or at half of
/// `space::NOTIFY_QUEUE_MAX` without one (postgres' default is 8 GB).
#[test]
fn from_17_the_notify_queue_is_bounded() {
    let config = EmbeddedConfig::for_limits(&PoolLimits::default(), 1);
    let args_for = |notify_queue: Option<u64>| -> Vec<String> {
        server_args(
            &config,
            Path::new("/d"),
            Path::new("/s"),
            5433,
            &Place {
                in_memory: true,
                clones: false,
                major: 17,
                rest: notify_queue.map(|_| 90 << 20),
                notify_queue,
            },
        )
        .into_iter()
        .map(|arg| arg.to_string_lossy().into_owned())
        .collect()
    };
    assert!(args_for(Some(6 << 20)).contains(&"max_notify_queue_pages=384".to_owned()));
    assert!(args_for(None).contains(&"max_notify_queue_pages=4096".to_owned()));
}

/// Turns [`helper_daemon_that_dies`] into a daemon for [`postgres_dies_with_its_daemon`].
const HELPER_DIR_VAR: &str = "PGLEASE_TEST_DAEMON_DIR";

/// A no-op in normal runs. Run by [`postgres_dies_with_its_daemon`] in a child process
/// with [`HELPER_DIR_VAR`] set, it starts postgres and dies by SIGKILL, like a daemon
/// killed without any chance to clean up.
#[tokio::test]
async fn helper_daemon_that_dies() {
    let Some(dir) = std::env::var_os(HELPER_DIR_VAR).map(PathBuf::from) else {
        return;
    };
    let mut config = test_config(&dir.join("cache"));
    config.data_dir = Some(dir.join("pglease-daemon"));
    let mut embedded = prepare(&config).await;
    let running = start(&mut embedded).await;
    std::fs::write(dir.join("postmaster.pid"), running.pid.to_string()).expect("write pid");
    let _ = nix::sys::signal::kill(nix::unistd::getpid(), Signal::SIGKILL);
    unreachable!("SIGKILL returned");
}

#[tokio::test]
async fn postgres_dies_with_its_daemon() {
    let shm = Scratch::under(Path::new(instance::SHM_ROOT), "daemon-death");
    let exe = std::env::current_exe().expect("test binary");
    let dir = shm.path().to_path_buf();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(exe)
            .args([
                "--exact",
                "postgres::tests::helper_daemon_that_dies",
                "--nocapture",
            ])
            .env(HELPER_DIR_VAR, dir)
            .output()
    })
    .await
    .expect("join")
    .expect("run the helper daemon");
    assert_eq!(
        output.status.signal(),
        Some(9),
        "the helper should have killed itself ({}); its output:\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let pid: u32 = std::fs::read_to_string(shm.path().join("postmaster.pid"))
        .expect("the helper's postmaster pid")
        .parse()
        .expect("a pid");

    // The parent-death signal stops the postmaster and, through it, its backends.
    let instance_dir = shm.path().join("pglease-daemon");
    poll_until(
        Duration::from_secs(10),
        "the orphaned postmaster to exit",
        || !marker::process_alive(pid),
    )
    .await;
    poll_until(
        Duration::from_secs(10),
        "the orphaned backends to exit",
        || processes_in(&instance_dir).is_empty(),
    )
    .await;
    // What is left is the directory, which the next daemon's sweep removes.
    assert!(instance_dir.join(marker::MARKER_FILE).exists());
    assert_eq!(
        sweep::sweep_stale(shm.path(), None),
        vec![instance_dir.clone()]
    );
    assert!(!instance_dir.exists());
}

/// A file outside every directory pglease writes, owned by whoever runs the test: its
/// content, owner and mode, to compare after an attempt to reach it.
fn victim_state(path: &Path) -> (String, u32, u32, u32) {
    let meta = std::fs::symlink_metadata(path).expect("stat the victim");
    let content = std::fs::read_to_string(path).expect("read the victim");
    (content, meta.uid(), meta.gid(), meta.mode())
}

/// The server's user as a start running as root resolves it (`nobody` here), so that a
/// chown through a link would show on the victim; the current user otherwise.
fn test_run_as() -> run_as::RunAs {
    let root = nix::unistd::geteuid().is_root();
    run_as::RunAs {
        name: "nobody".into(),
        uid: if root {
            65534
        } else {
            nix::unistd::geteuid().as_raw()
        },
        gid: if root {
            65534
        } else {
            nix::unistd::getegid().as_raw()
        },
        switch: root,
    }
}

/// Issue 25, row 3: `pg_hba.conf` is written as root at every start into a data directory
/// a snapshot filled or the server's user owns. A link there is replaced by a plain,
/// owner-only file of the server's user; what it pointed at is untouched.
#[test]
fn pg_hba_conf_is_written_anew_never_through_a_link() {
    let scratch = Scratch::new("hba-link");
    let victim = scratch.path().join("victim");
    std::fs::write(&victim, "precious").expect("write");
    let before = victim_state(&victim);
    let data_dir = scratch.path().join("data");
    std::fs::create_dir(&data_dir).expect("mkdir");
    let hba = data_dir.join("pg_hba.conf");
    std::os::unix::fs::symlink(&victim, &hba).expect("symlink");
    let owner = test_run_as().owner();
    let rules = pg_hba(LeaseAuth::Trust, None);
    write_anew(&hba, rules.as_bytes(), owner).expect("write pg_hba.conf");
    assert_eq!(victim_state(&victim), before, "the victim changed");
    let meta = std::fs::symlink_metadata(&hba).expect("stat");
    assert!(meta.file_type().is_file(), "{:?}", meta.file_type());
    assert_eq!(meta.mode() & 0o777, 0o600);
    if let Some((uid, gid)) = owner {
        assert_eq!((meta.uid(), meta.gid()), (uid, gid));
    }
    assert_eq!(std::fs::read_to_string(&hba).expect("read"), rules);
}

/// The instance marker is written as root into the instance directory, which the server's
/// user owns and a kept one outlives the run: a link there is replaced, not written through.
#[test]
fn the_instance_marker_is_written_anew_never_through_a_link() {
    let scratch = Scratch::new("marker-link");
    let victim = scratch.path().join("victim");
    std::fs::write(&victim, "precious").expect("write");
    let before = victim_state(&victim);
    let dir = scratch.path().join("instance");
    std::fs::create_dir(&dir).expect("mkdir");
    std::os::unix::fs::symlink(&victim, dir.join(marker::MARKER_FILE)).expect("symlink");
    marker::write_marker(&dir, true).expect("write the marker");
    assert_eq!(victim_state(&victim), before, "the victim changed");
    let marker = marker::read_marker(&dir).expect("a marker of ours");
    assert_eq!(marker.pid, Some(std::process::id()));
    assert!(marker.kept);
}

/// The socket directory and the copy-on-write store are made private (chmod 0700, chown to
/// the server's user) as root inside the instance directory: a link in their place is
/// refused, and the directory it points at keeps its mode and owner.
#[test]
fn a_private_directory_is_never_reached_through_a_link() {
    let scratch = Scratch::new("private-dir-link");
    let outside = scratch.path().join("outside");
    std::fs::create_dir(&outside).expect("mkdir");
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let before = std::fs::metadata(&outside).expect("stat");
    let socket_dir = scratch.path().join("socket");
    std::os::unix::fs::symlink(&outside, &socket_dir).expect("symlink");
    let error = run_as::make_private_dir(&socket_dir, &test_run_as())
        .expect_err("made a link's target private");
    let message = error.to_string();
    assert!(
        message.contains("refusing a link or a non-directory at") && message.contains("socket"),
        "{message}"
    );
    let after = std::fs::metadata(&outside).expect("stat");
    assert_eq!(
        (after.mode(), after.uid(), after.gid()),
        (before.mode(), before.uid(), before.gid())
    );
    // A real directory is made private, through its handle.
    let real = scratch.path().join("real");
    std::fs::create_dir(&real).expect("mkdir");
    run_as::make_private_dir(&real, &test_run_as()).expect("make private");
    let meta = std::fs::metadata(&real).expect("stat");
    assert_eq!(meta.mode() & 0o777, 0o700);
}

/// Issue 25, row 3, end to end: a start that finds a hostile snapshot for its server
/// (`pg_hba.conf` a link to a file outside) refuses it, uses none of it and starts a fresh
/// cluster, whose `pg_hba.conf` is pglease's own; the file outside is untouched, and as
/// nothing was adopted a clean stop would replace the snapshot.
#[tokio::test]
async fn a_hostile_snapshot_is_refused_and_a_fresh_cluster_starts() {
    let cache = Scratch::new("cache-hostile-snapshot");
    let snapshots = Scratch::new("hostile-snapshots");
    let victim = cache.path().join("victim");
    std::fs::write(&victim, "precious").expect("write");
    let before = victim_state(&victim);
    let mut config = test_config(cache.path());
    // A manifest this server accepts: its version and initdb settings.
    let probe = prepare(&config).await;
    let manifest = snapshot::Manifest::new(&probe.binaries.version, &probe.initdb_args, vec![]);
    probe.cleanup();
    let mut builder = tar::Builder::new(Vec::new());
    let json = serde_json::to_vec(&manifest).expect("json");
    let mut header = tar::Header::new_gnu();
    header.set_size(json.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    builder
        .append_data(&mut header, "pglease-snapshot.json", json.as_slice())
        .expect("manifest");
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Symlink);
    header.set_size(0);
    header.set_mode(0o777);
    builder
        .append_link(&mut header, "pg_hba.conf", &victim)
        .expect("link");
    let tar = builder.into_inner().expect("tar");
    let path = snapshot::path_for(snapshots.path(), manifest.postgres_major);
    // Sealed with the key the daemon uses (made in its cache root): the unpacking must
    // refuse the link even in a snapshot whose MAC is valid.
    let key =
        snapshot::load_or_create_key(&snapshot::default_key_path(cache.path())).expect("the key");
    let mut sealing = snapshot::Sealing::new(Vec::new(), &key);
    std::io::Write::write_all(
        &mut sealing,
        &zstd::encode_all(tar.as_slice(), 1).expect("zstd"),
    )
    .expect("seal");
    std::fs::write(&path, sealing.seal().expect("seal")).expect("write");

    config.snapshot_dir = Some(snapshots.path().to_path_buf());
    let mut embedded = prepare(&config).await;
    assert!(embedded.snapshot.is_some(), "the snapshot was not found");
    let running = start(&mut embedded).await;
    assert_ne!(running.cluster_origin, ClusterOrigin::Snapshot);
    assert!(embedded.adopted.is_none());
    assert_eq!(victim_state(&victim), before, "the victim changed");
    let hba = running.data_dir.join("pg_hba.conf");
    assert!(std::fs::symlink_metadata(&hba)
        .expect("stat")
        .file_type()
        .is_file());
    assert!(std::fs::read_to_string(&hba)
        .expect("read")
        .contains("host    all        postgres   all       reject"));
    assert_eq!(query_text(&running, "SELECT 1").await, "1");
    running.shutdown(Duration::from_secs(10)).await;
    embedded.cleanup();
}
