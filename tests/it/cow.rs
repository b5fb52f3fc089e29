//! `--storage cow`: the clusters live on a copy-on-write XFS that pglease makes in RAM and
//! loop-mounts (on /dev/shm, or inside a tmpfs data directory), or on a data directory that
//! clones. On PostgreSQL 18 a clone shares its template's blocks and is still a database of
//! its own; an older major copies there; a killed daemon's store (mount and loop device) is
//! gone after the next start; a kept one is started again; the store is refused where it
//! cannot apply. What `--storage auto` chooses is `storage_auto.rs`'s.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::{connect, poll_until, scratch_dir, TestDaemon, REQUIRE_TOOLS};

/// Whether this machine can make the store: root, and mkfs.xfs (skipped loudly otherwise,
/// failed under CI's PGLEASE_REQUIRE_TOOLS).
pub(crate) fn can_make_store(test: &str) -> bool {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED {test}: loop-mounting the store needs root");
        return false;
    }
    // mkfs.xfs answers -V, not --version.
    let found = std::process::Command::new("mkfs.xfs")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os(REQUIRE_TOOLS).is_none(),
            "mkfs.xfs is required here ({REQUIRE_TOOLS} is set): apt-get install xfsprogs"
        );
        eprintln!("SKIPPED {test}: mkfs.xfs not installed (apt-get install xfsprogs; bash .ci/run installs it)");
    }
    found
}

/// The mount points under `dir` in this mount namespace.
pub(crate) fn mounts_under(dir: &Path) -> Vec<String> {
    fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .filter_map(|line| line.split(' ').nth(4).map(str::to_owned))
        .filter(|point| Path::new(point).starts_with(dir))
        .collect()
}

/// Loop devices whose backing file lies under `dir`.
pub(crate) fn loop_devices_under(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in fs::read_dir("/sys/block").into_iter().flatten().flatten() {
        let backing = entry.path().join("loop/backing_file");
        if let Ok(file) = fs::read_to_string(&backing) {
            if Path::new(file.trim()).starts_with(dir) {
                found.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
    }
    found
}

/// Bytes in use on the file system holding `path`.
fn used_bytes(path: &Path) -> u64 {
    let stat = nix::sys::statvfs::statvfs(path).expect("statvfs");
    (stat.blocks() - stat.blocks_free()) * stat.fragment_size()
}

/// Rows of `big`, and how many of them a write changed.
async fn count(client: &tokio_postgres::Client) -> (i64, i64) {
    let row = client
        .query_one(
            "SELECT count(*), count(*) FILTER (WHERE note = 'changed') FROM big",
            &[],
        )
        .await
        .expect("count");
    (row.get(0), row.get(1))
}

/// Leases `default` and writes in it: the store serves clones.
async fn write_in_a_lease(daemon: &TestDaemon) {
    write_in_a_lease_of(daemon, "default", "CREATE TABLE t (i int)").await;
}

/// Leases `template` and runs `sql`, a write, in it.
pub(crate) async fn write_in_a_lease_of(daemon: &TestDaemon, template: &str, sql: &str) {
    let lease = daemon.lease_ok(template).await;
    connect(&lease)
        .await
        .expect("connect")
        .batch_execute(sql)
        .await
        .expect("a write in a clone");
}

/// A directory of this test process on /dev/shm (a tmpfs, as a container's volume would
/// be), not yet made; the test removes it.
fn shm_root(name: &str) -> PathBuf {
    PathBuf::from(format!(
        "/dev/shm/pglease-test-{name}-{}",
        std::process::id()
    ))
}

pub(crate) async fn data_dir(daemon: &TestDaemon) -> PathBuf {
    PathBuf::from(
        daemon.status().await["postgres"]["data_dir"]
            .as_str()
            .expect("data_dir"),
    )
}

/// Six ready clones and the template of ~40 MB take about one template's blocks, not
/// seven; a write to one clone shows in no other.
#[tokio::test]
async fn clones_share_their_templates_blocks_and_stay_independent() {
    if !can_make_store("clones_share_their_templates_blocks_and_stay_independent") {
        return;
    }
    let dir = scratch_dir("cow-share");
    let schema = dir.join("schema.sql");
    fs::write(
        &schema,
        "CREATE TABLE big AS SELECT g AS id, md5(g::text) AS note FROM generate_series(1, 500000) g;",
    )
    .expect("write");
    let daemon = TestDaemon::of_major("18")
        .args([
            "--storage",
            "cow",
            "--template",
            &format!("big=sql:{}", schema.display()),
            "--prebuild",
            "--min-ready",
            "6",
            // A store of a known size (its metadata grows with it), and a budget that
            // twelve 42 MB clones and their template exceed by their logical size.
            "--tmpfs-size",
            "4G",
            "--max-bytes",
            "500M",
        ])
        .start()
        .await;
    let status = daemon.status().await;
    assert_eq!(
        status["postgres"]["settings"]["file_copy_method"], "clone",
        "{status}"
    );
    let store = data_dir(&daemon)
        .await
        .parent()
        .expect("the store")
        .to_path_buf();
    assert!(
        store.ends_with("cow") && mounts_under(&store).contains(&store.display().to_string()),
        "{} is not a mount",
        store.display()
    );
    let six_ready = || async {
        poll_until(Duration::from_secs(60), "six ready clones", || async {
            let status = daemon.template_status("big").await;
            (status["ready"].as_u64() >= Some(6) && status["in_progress"].as_u64() == Some(0))
                .then_some(())
        })
        .await
    };
    six_ready().await;
    let before = used_bytes(&store);
    // Six leases: the pool makes six more clones.
    let mut leases = Vec::new();
    for _ in 0..6 {
        leases.push(daemon.lease_ok("big").await);
    }
    six_ready().await;
    let grown = used_bytes(&store).saturating_sub(before);
    let a = connect(&leases[0]).await.expect("connect a");
    let b = connect(&leases[1]).await.expect("connect b");
    let size: i64 = a
        .query_one("SELECT pg_database_size(current_database())", &[])
        .await
        .expect("size")
        .get(0);
    assert!(size > 30_000_000, "the template is only {size} bytes");
    // The budget is judged by what the store holds, not by each clone's size.
    let limits = daemon.status().await["limits"].clone();
    eprintln!("limits: {limits}");
    let budget = limits["byte_budget"].as_u64().expect("a budget");
    assert!(limits["logical_bytes"].as_u64() > Some(budget), "{limits}");
    assert!(limits["store_bytes"].as_u64() < Some(budget), "{limits}");
    // Copies would have taken six times the template.
    assert!(
        (grown as i64) < size,
        "six more clones of a {size}-byte template took {grown} bytes of the store: they do not share blocks"
    );

    a.batch_execute(
        "UPDATE big SET note = 'changed' WHERE id <= 1000; DELETE FROM big WHERE id > 400000",
    )
    .await
    .expect("write a");
    assert_eq!(count(&a).await, (400_000, 1000));
    assert_eq!(
        count(&b).await,
        (500_000, 0),
        "a write to one clone showed in another"
    );
    let third = daemon.lease_ok("big").await;
    let c = connect(&third).await.expect("connect c");
    assert_eq!(
        count(&c).await,
        (500_000, 0),
        "a write to a clone showed in the template"
    );
    assert!(daemon.stop().await.success());
    assert!(mounts_under(&store).is_empty(), "the store stayed mounted");
}

/// A daemon killed with SIGKILL leaves its store mounted; the next start unmounts it (its
/// loop device goes with it) and removes its directory. A server before 18 runs on the
/// store too, copying.
#[tokio::test]
async fn a_killed_daemons_store_is_gone_after_the_next_start() {
    if !can_make_store("a_killed_daemons_store_is_gone_after_the_next_start") {
        return;
    }
    let daemon = TestDaemon::builder()
        .args(["--storage", "cow", "--min-ready", "1"])
        // A process: the test kills it (SIGKILL).
        .process()
        .start()
        .await;
    write_in_a_lease(&daemon).await;
    let status = daemon.status().await;
    assert!(
        status["postgres"]["settings"]
            .get("file_copy_method")
            .is_none(),
        "{status}"
    );
    let instance = data_dir(&daemon)
        .await
        .ancestors()
        .nth(2)
        .expect("the instance directory")
        .to_path_buf();
    assert_eq!(mounts_under(&instance).len(), 1, "{}", instance.display());
    assert_eq!(loop_devices_under(&instance).len(), 1);
    daemon.kill();
    assert_eq!(
        mounts_under(&instance).len(),
        1,
        "the store outlives a killed daemon"
    );

    let next = TestDaemon::start().await;
    assert!(mounts_under(&instance).is_empty(), "{}", next.log());
    assert!(loop_devices_under(&instance).is_empty(), "{}", next.log());
    assert!(!instance.exists(), "{}", next.log());
    assert!(next.stop().await.success());
}

/// With an external server the store does not apply: the daemon says so and does not start.
#[test]
fn storage_cow_is_refused_with_an_external_server() {
    let (status, log) = TestDaemon::builder()
        .args([
            "--storage",
            "cow",
            "--postgres-url",
            "postgres://postgres@127.0.0.1:1/postgres",
        ])
        .run_to_exit();
    assert!(!status.success());
    assert!(
        log.contains("--storage cow is the store of the cluster"),
        "{log}"
    );
}

/// An XFS with reflinks the test mounts itself, unmounted when dropped.
struct ClonableDir {
    root: PathBuf,
    mount: PathBuf,
}

impl ClonableDir {
    fn make(name: &str) -> ClonableDir {
        let root = PathBuf::from(format!(
            "/dev/shm/pglease-test-{name}-{}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&root);
        let mount = root.join("mnt");
        fs::create_dir_all(&mount).expect("mkdir");
        let image = root.join("fs.xfs");
        fs::File::create(&image)
            .and_then(|f| f.set_len(1 << 30))
            .expect("image");
        let run = |program: &str, args: &[&str]| {
            let out = std::process::Command::new(program)
                .args(args)
                .output()
                .expect(program);
            assert!(
                out.status.success(),
                "{program}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let image = image.display().to_string();
        run("mkfs.xfs", &["-q", "-f", "-m", "reflink=1", &image]);
        run(
            "mount",
            &["-o", "loop", &image, &mount.display().to_string()],
        );
        ClonableDir { root, mount }
    }
}

impl Drop for ClonableDir {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(&self.mount)
            .status();
        let _ = fs::remove_dir_all(&self.root);
    }
}

/// A `--data-dir` on a file system that clones is used as the store (no mount of ours);
/// one that cannot clone is used too, copying, and the log says why.
#[tokio::test]
async fn a_data_dir_that_clones_is_the_store_and_one_that_cannot_copies() {
    if !can_make_store("a_data_dir_that_clones_is_the_store_and_one_that_cannot_copies") {
        return;
    }
    let xfs = ClonableDir::make("cow-data-dir");
    let plain = scratch_dir("cow-plain-dir");
    for (dir, method, said) in [
        (
            xfs.mount.join("data"),
            "clone",
            "the data directory's file system clones",
        ),
        (plain.join("data"), "copy", "cannot clone files"),
    ] {
        let daemon = TestDaemon::of_major("18")
            .args(["--storage", "cow", "--allow-unsafe-on-disk", "--data-dir"])
            .args([dir.display().to_string()])
            .start()
            .await;
        let status = daemon.status().await;
        assert_eq!(
            status["postgres"]["settings"]["file_copy_method"], method,
            "{status}"
        );
        assert!(daemon.log().contains(said), "{}", daemon.log());
        let kind = if method == "clone" {
            "data_dir"
        } else {
            "disk"
        };
        assert_eq!(status["postgres"]["storage"]["kind"], kind, "{status}");
        assert!(
            mounts_under(&dir).is_empty(),
            "pglease mounted nothing of its own"
        );
        write_in_a_lease(&daemon).await;
        assert!(daemon.stop().await.success());
    }
}

/// A tmpfs too small for a store is refused at start with what to change, instead of a store
/// larger than the memory under it.
#[test]
fn a_tmpfs_too_small_for_the_store_is_refused() {
    if !can_make_store("a_tmpfs_too_small_for_the_store_is_refused") {
        return;
    }
    let (status, log) = TestDaemon::builder()
        .args(["--storage", "cow", "--tmpfs-size", "256M"])
        .run_to_exit();
    assert!(!status.success());
    assert!(
        log.contains("mkfs.xfs makes no file system under 512 MB"),
        "{log}"
    );
    assert!(log.contains("--tmpfs-size"), "{log}");
}

/// `/status`' word on the storage: its kind and reason, and the server's file_copy_method.
pub(crate) async fn storage(daemon: &TestDaemon) -> Storage {
    let status = daemon.status().await;
    let postgres = &status["postgres"];
    let text = |value: &serde_json::Value| value.as_str().map(str::to_owned);
    Storage {
        kind: text(&postgres["storage"]["kind"]).expect("storage.kind"),
        reason: text(&postgres["storage"]["reason"]).expect("storage.reason"),
        method: text(&postgres["settings"]["file_copy_method"]),
    }
}

/// A server's storage in `/status`.
pub(crate) struct Storage {
    /// `postgres.storage.kind`.
    pub kind: String,
    /// `postgres.storage.reason`.
    pub reason: String,
    /// `postgres.settings.file_copy_method`, absent before PostgreSQL 18.
    pub method: Option<String>,
}

/// `--storage cow` with a data directory on tmpfs makes its store inside it (a container's
/// tmpfs volume), and a clean stop takes it away again.
#[tokio::test]
async fn cow_makes_its_store_inside_a_tmpfs_data_dir() {
    if !can_make_store("cow_makes_its_store_inside_a_tmpfs_data_dir") {
        return;
    }
    let root = shm_root("cow-in-dir");
    let dir = root.join("data");
    let daemon = TestDaemon::of_major("18")
        .args(["--storage", "cow", "--data-dir"])
        .args([dir.display().to_string()])
        .start()
        .await;
    let storage = storage(&daemon).await;
    assert_eq!(storage.kind, "cow");
    assert_eq!(storage.method.as_deref(), Some("clone"));
    assert_eq!(
        mounts_under(&dir),
        vec![dir.join("cow").display().to_string()]
    );
    write_in_a_lease(&daemon).await;
    assert!(daemon.stop().await.success());
    assert!(mounts_under(&dir).is_empty(), "unmounted at stop");
    assert!(loop_devices_under(&dir).is_empty(), "loop device freed");
    let _ = fs::remove_dir_all(&root);
}

/// A kept data directory's store stays mounted between runs: the next start uses it as it
/// is (its cluster and templates), and a run without --keep-data takes it away.
#[tokio::test]
async fn a_kept_store_is_started_again_and_removed_by_a_run_that_does_not_keep() {
    if !can_make_store("a_kept_store_is_started_again_and_removed_by_a_run_that_does_not_keep") {
        return;
    }
    let root = shm_root("cow-kept");
    let dir = root.join("data");
    let args = |keep: bool| {
        let mut args = vec![
            "--storage".to_owned(),
            "cow".to_owned(),
            "--data-dir".to_owned(),
            dir.display().to_string(),
        ];
        if keep {
            args.push("--keep-data".to_owned());
        }
        args
    };
    let first = TestDaemon::of_major("18").args(args(true)).start().await;
    let fingerprint = first.lease_ok("default").await["fingerprint"].clone();
    assert!(first.stop().await.success());
    assert_eq!(mounts_under(&dir).len(), 1, "a kept store stays mounted");

    let second = TestDaemon::of_major("18").args(args(true)).start().await;
    let storage = storage(&second).await;
    assert_eq!(storage.kind, "cow");
    assert!(storage.reason.contains("kept"), "{}", storage.reason);
    assert!(
        second.log().contains("cluster_origin=Kept"),
        "{}",
        second.log()
    );
    let lease = second.lease_ok("default").await;
    assert_eq!(lease["fingerprint"], fingerprint);
    write_in_a_lease(&second).await;
    assert!(second.stop().await.success());

    let third = TestDaemon::of_major("18").args(args(false)).start().await;
    write_in_a_lease(&third).await;
    assert!(third.stop().await.success());
    assert!(
        mounts_under(&dir).is_empty(),
        "unmounted by the run that keeps nothing"
    );
    assert!(loop_devices_under(&root).is_empty(), "loop device freed");
    let _ = fs::remove_dir_all(&root);
}

/// A major before 18 runs on the store all the same, copying (it has no file_copy_method).
#[tokio::test]
async fn a_major_before_18_runs_on_the_store_and_copies() {
    if !can_make_store("a_major_before_18_runs_on_the_store_and_copies") {
        return;
    }
    let daemon = TestDaemon::of_major("16")
        .args(["--storage", "cow"])
        .start()
        .await;
    let storage = storage(&daemon).await;
    assert_eq!(storage.kind, "cow", "{}", storage.reason);
    assert_eq!(storage.method, None, "no file_copy_method before 18");
    write_in_a_lease(&daemon).await;
    assert!(daemon.stop().await.success());
}

/// A data directory that clones but is on a disk, not in memory, still needs
/// --allow-unsafe-on-disk: pglease runs postgres with fsync off.
#[test]
fn a_data_dir_that_clones_on_a_disk_needs_allow_unsafe_on_disk() {
    if !can_make_store("a_data_dir_that_clones_on_a_disk_needs_allow_unsafe_on_disk") {
        return;
    }
    let xfs = ClonableDir::make("cow-unsafe");
    let (status, log) = TestDaemon::of_major("18")
        .args(["--storage", "cow", "--data-dir"])
        .args([xfs.mount.join("data").display().to_string()])
        .run_to_exit();
    assert!(!status.success());
    assert!(log.contains("is on xfs, not tmpfs"), "{log}");
    assert!(log.contains("allow-unsafe-on-disk"), "{log}");
}
