//! Issue 41: snapshots an attacker who can write `--snapshot-dir` (a CI cache other jobs
//! share) re-packed. Each attack of the table is reproduced as such an attacker
//! would: an honest snapshot made by a daemon, unpacked, changed, packed again, with no
//! valid MAC (no trailer, the old trailer kept, or another key's). Each is passed over
//! before anything in it is used: the script never runs, nobody logs in over TCP, the log
//! says why, and a clean stop writes an authenticated snapshot over it. Two daemons that
//! share `--snapshot-key-file` adopt each other's snapshots.
//!
//! The trailer is written here independently of pglease's code, from the format
//! docs/snapshots.md describes: magic `PGLSNMAC`, version 1 (big-endian u32), 4 zero bytes,
//! the key id (the first 8 bytes of HMAC-SHA256(key, "pglease snapshot key id")), and the
//! HMAC-SHA256 of every byte before the tag.

use std::fs;
use std::path::{Path, PathBuf};

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::support::{cache_dir, connect, scratch_dir, TestDaemon};

/// The trailer's length.
const TRAILER: usize = 56;

/// HMAC-SHA256 of `data` under `key`.
fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("hmac key");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// `stream` with a valid trailer under `key`.
pub(crate) fn seal(stream: &[u8], key: &[u8]) -> Vec<u8> {
    let mut out = stream.to_vec();
    out.extend_from_slice(b"PGLSNMAC");
    out.extend_from_slice(&1u32.to_be_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&hmac(key, b"pglease snapshot key id")[..8]);
    let tag = hmac(key, &out);
    out.extend_from_slice(&tag);
    out
}

/// Whether the file at `path` carries a valid MAC under `key`.
pub(crate) fn sealed_by(path: &Path, key: &[u8]) -> bool {
    let bytes = fs::read(path).expect("read the snapshot");
    bytes.len() > TRAILER
        && bytes[bytes.len() - TRAILER..].starts_with(b"PGLSNMAC")
        && seal(&bytes[..bytes.len() - TRAILER], key) == bytes
}

/// The key a daemon of these tests uses by default: `snapshot.key` in the tests' cache
/// root. A test that seals before any daemon of its run has made the key (one run alone,
/// on a fresh cache) makes it as a daemon would: 32 random bytes, new, `0600`; whoever
/// comes second (a daemon or another test) reads the same key.
pub(crate) fn default_key() -> Vec<u8> {
    use std::io::{Read, Write};
    use std::os::unix::fs::OpenOptionsExt;
    let path = cache_dir().join("snapshot.key");
    if !path.exists() {
        // Whole before it appears: written aside, then linked in place (which fails if a
        // daemon or another test made it meanwhile), so nobody reads a key half written.
        let mut key = [0u8; 32];
        fs::File::open("/dev/urandom")
            .and_then(|mut random| random.read_exact(&mut key))
            .expect("random bytes");
        let aside = cache_dir().join(format!(
            "snapshot.key.{}.{:02x}{:02x}{:02x}{:02x}",
            std::process::id(),
            key[0],
            key[1],
            key[2],
            key[3]
        ));
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&aside)
            .and_then(|mut file| file.write_all(&key))
            .expect("write the key aside");
        let _ = fs::hard_link(&aside, &path);
        let _ = fs::remove_file(&aside);
    }
    fs::read(&path).expect("the tests' snapshot key")
}

/// One entry of an archive: its header and content.
pub(crate) type Entry = (tar::Header, Vec<u8>);

/// The entries of the snapshot at `path` (its trailer, if any, left out).
pub(crate) fn entries(path: &Path) -> Vec<Entry> {
    let bytes = fs::read(path).expect("read the snapshot");
    let stream = match bytes.len().checked_sub(TRAILER) {
        Some(end) if bytes[end..].starts_with(b"PGLSNMAC") => &bytes[..end],
        _ => &bytes[..],
    };
    let tar = zstd::decode_all(stream).expect("zstd");
    let mut archive = tar::Archive::new(tar.as_slice());
    archive
        .entries()
        .expect("tar")
        .map(|entry| {
            let mut entry = entry.expect("entry");
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut data).expect("read entry");
            (entry.header().clone(), data)
        })
        .collect()
}

/// `entries` packed again as a snapshot's stream (no trailer).
pub(crate) fn pack(entries: &[Entry]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (header, data) in entries {
        builder.append(header, data.as_slice()).expect("append");
    }
    zstd::encode_all(builder.into_inner().expect("tar").as_slice(), 1).expect("zstd")
}

/// `entries` with the file `name` (top level) set to `data`: replaced when there, else
/// added.
pub(crate) fn with_file(mut entries: Vec<Entry>, name: &str, data: &[u8]) -> Vec<Entry> {
    entries.retain(|(header, _)| header.path().expect("path") != Path::new(name));
    let mut header = tar::Header::new_gnu();
    header.set_path(name).expect("name");
    header.set_size(data.len() as u64);
    header.set_mode(0o600);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_cksum();
    entries.push((header, data.to_vec()));
    entries
}

/// The content of the top-level file `name` in `entries`.
pub(crate) fn file_in(entries: &[Entry], name: &str) -> Vec<u8> {
    entries
        .iter()
        .find(|(header, _)| header.path().expect("path") == Path::new(name))
        .map(|(_, data)| data.clone())
        .unwrap_or_default()
}

pub(crate) fn migrations(dir: &Path) -> PathBuf {
    let migrations = dir.join("migrations");
    fs::create_dir_all(&migrations).expect("mkdir");
    fs::write(migrations.join("001.sql"), "CREATE TABLE built (id int);\n").expect("write");
    migrations
}

pub(crate) async fn daemon(snapshots: &Path, migrations: &Path, extra: &[&str]) -> TestDaemon {
    let mut args = vec![
        "--snapshot-dir".to_string(),
        snapshots.display().to_string(),
        "--template".to_string(),
        format!("app=migrations:{}", migrations.display()),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    TestDaemon::builder().args(args).start().await
}

/// An honest snapshot: a daemon builds the template and stops. Returns its file.
pub(crate) async fn honest_snapshot(
    snapshots: &Path,
    migrations: &Path,
    extra: &[&str],
) -> PathBuf {
    let first = daemon(snapshots, migrations, extra).await;
    first.lease_ok("app").await;
    let (status, log) = first.stop_with_log().await;
    assert!(status.success(), "{log}");
    assert!(log.contains("wrote the snapshot"), "{log}");
    let files: Vec<PathBuf> = fs::read_dir(snapshots)
        .expect("list")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "pgsnap"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files[0].clone()
}

/// A directory the server's user can write a marker into: a script that runs leaves it.
pub(crate) fn marker_dir(dir: &Path) -> PathBuf {
    let markers = dir.join("markers");
    fs::create_dir_all(&markers).expect("mkdir");
    fs::set_permissions(
        &markers,
        <fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o777),
    )
    .expect("chmod");
    markers
}

/// Row 1's change: a restore command that runs a script from the data directory, and the
/// signal that makes postgres run it.
pub(crate) fn with_restore_command(entries: Vec<Entry>, marker: &Path) -> Vec<Entry> {
    let mut auto = file_in(&entries, "postgresql.auto.conf");
    auto.extend_from_slice(b"restore_command = 'sh ./x.sh'\n");
    let entries = with_file(entries, "postgresql.auto.conf", &auto);
    let entries = with_file(entries, "recovery.signal", b"");
    with_file(
        entries,
        "x.sh",
        format!("touch {}\nexit 1\n", marker.display()).as_bytes(),
    )
}

/// Row 2's change: postgres reads its hba rules from a file in the snapshot that admits
/// anyone over TCP. (The data directory of a daemon's first start is `pgdata-1`, relative
/// to the instance directory, postgres' working directory.)
pub(crate) fn with_open_hba(entries: Vec<Entry>) -> Vec<Entry> {
    let mut auto = file_in(&entries, "postgresql.auto.conf");
    auto.extend_from_slice(b"hba_file = 'pgdata-1/open_hba.conf'\n");
    let entries = with_file(entries, "postgresql.auto.conf", &auto);
    with_file(
        entries,
        "open_hba.conf",
        b"local all all trust\nhost all all 127.0.0.1/32 trust\n",
    )
}

/// Tries to log in over TCP as `user` with `password` (what the attacker set, or none);
/// the error when refused.
pub(crate) async fn login(
    port: u16,
    user: &str,
    database: &str,
    password: &str,
) -> Result<(), String> {
    let config = format!(
        "host=127.0.0.1 port={port} user={user} dbname={database} password='{password}' \
         connect_timeout=10"
    );
    match tokio_postgres::connect(&config, tokio_postgres::NoTls).await {
        Ok((client, connection)) => {
            tokio::spawn(connection);
            let row = client
                .query_one(
                    "SELECT rolsuper FROM pg_roles WHERE rolname = current_user",
                    &[],
                )
                .await
                .map_err(|e| e.to_string())?;
            let superuser: bool = row.get(0);
            panic!("logged in over TCP as {user} (superuser: {superuser})");
        }
        Err(error) => Err(error_text(&error)),
    }
}

fn error_text(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => error.to_string(),
    }
}

/// The port the daemon's postgres listens on, from a lease.
pub(crate) async fn port_of(daemon: &TestDaemon) -> u16 {
    let lease = daemon.lease_ok("app").await;
    let client = connect(&lease).await.expect("connect with the lease");
    drop(client);
    lease["port"].as_u64().expect("lease port") as u16
}

/// After a daemon passed `path` over: a clean stop writes an authenticated snapshot over
/// it.
async fn replaced_at_the_stop(daemon: TestDaemon, path: &Path, key: &[u8]) -> String {
    let (status, log) = daemon.stop_with_log().await;
    assert!(status.success(), "{log}");
    assert!(log.contains("wrote the snapshot"), "{log}");
    assert!(
        sealed_by(path, key),
        "the snapshot written at the stop is not authenticated"
    );
    log
}

/// Row 1 with no MAC at all (the trailer left out, as an older pglease wrote them): the
/// restore command never runs.
#[tokio::test]
async fn row1_a_restore_command_in_an_unauthenticated_snapshot_never_runs() {
    let dir = scratch_dir("hostile-row1");
    let snapshots = dir.join("snapshots");
    let migrations = migrations(&dir);
    let path = honest_snapshot(&snapshots, &migrations, &[]).await;
    let marker = marker_dir(&dir).join("ran");
    let hostile = with_restore_command(entries(&path), &marker);
    fs::write(&path, pack(&hostile)).expect("write the hostile snapshot");

    let second = daemon(&snapshots, &migrations, &[]).await;
    let port = port_of(&second).await;
    assert!(!marker.exists(), "the snapshot's restore command ran");
    let refused = login(port, "postgres", "postgres", "")
        .await
        .expect_err("logged in");
    assert!(refused.contains("28000"), "{refused}");
    let log = replaced_at_the_stop(second, &path, &default_key()).await;
    assert!(
        log.contains("passing over the snapshot, none of it is used: it carries no MAC"),
        "{log}"
    );
    assert!(log.contains("the cluster is built fresh"), "{log}");
    assert!(!log.contains("started from the snapshot"), "{log}");
    assert!(!marker.exists(), "the snapshot's restore command ran");
    let _ = fs::remove_dir_all(&dir);
}

/// Row 2 with the honest trailer kept (so the file looks sealed): the tag does not match
/// the changed bytes, and nobody logs in over TCP through the snapshot's hba file.
#[tokio::test]
async fn row2_an_hba_file_in_an_altered_snapshot_is_not_read() {
    let dir = scratch_dir("hostile-row2");
    let snapshots = dir.join("snapshots");
    let migrations = migrations(&dir);
    let path = honest_snapshot(&snapshots, &migrations, &[]).await;
    let honest = fs::read(&path).expect("read");
    let trailer = honest[honest.len() - TRAILER..].to_vec();
    let mut hostile = pack(&with_open_hba(entries(&path)));
    hostile.extend_from_slice(&trailer);
    fs::write(&path, &hostile).expect("write the hostile snapshot");

    let second = daemon(&snapshots, &migrations, &[]).await;
    let port = port_of(&second).await;
    let refused = login(port, "postgres", "postgres", "")
        .await
        .expect_err("logged in");
    assert!(refused.contains("28000"), "{refused}");
    let log = replaced_at_the_stop(second, &path, &default_key()).await;
    assert!(
        log.contains("none of it is used: its MAC does not match its content"),
        "{log}"
    );
    assert!(!log.contains("started from the snapshot"), "{log}");
    let _ = fs::remove_dir_all(&dir);
}

/// Row 3: a superuser `backdoor` in the catalog of a snapshot sealed with another key
/// (another runner's daemon, which had it made through a superuser lease). The daemon with
/// its own key passes it over and says so; `backdoor` cannot log in.
#[tokio::test]
async fn row3_a_backdoor_role_in_another_keys_snapshot_cannot_log_in() {
    let dir = scratch_dir("hostile-row3");
    let snapshots = dir.join("snapshots");
    let migrations = migrations(&dir);
    let other_key = dir.join("other.key");
    fs::write(&other_key, [0x5a; 32]).expect("write the other key");
    fs::set_permissions(
        &other_key,
        <fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o600),
    )
    .expect("chmod");
    let other_key_arg = other_key.display().to_string();
    let attacker = daemon(
        &snapshots,
        &migrations,
        &["--snapshot-key-file", &other_key_arg, "--lease-superuser"],
    )
    .await;
    let lease = attacker.lease_ok("app").await;
    let client = connect(&lease).await.expect("connect");
    client
        .batch_execute("CREATE ROLE backdoor SUPERUSER LOGIN PASSWORD 'open-sesame'")
        .await
        .expect("the backdoor role");
    client
        .batch_execute("CREATE DATABASE backdoor")
        .await
        .expect("the backdoor database");
    drop(client);
    let (status, log) = attacker.stop_with_log().await;
    assert!(status.success(), "{log}");
    let path = snapshots.join(
        fs::read_dir(&snapshots)
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .find(|n| n.to_string_lossy().ends_with(".pgsnap"))
            .expect("the attacker's snapshot"),
    );
    assert!(sealed_by(&path, &[0x5a; 32]));

    let second = daemon(&snapshots, &migrations, &[]).await;
    let port = port_of(&second).await;
    let refused = login(port, "backdoor", "backdoor", "open-sesame")
        .await
        .expect_err("logged in");
    assert!(refused.contains("28P01"), "{refused}");
    let log = replaced_at_the_stop(second, &path, &default_key()).await;
    assert!(
        log.contains("none of it is used: its MAC was made with another key"),
        "{log}"
    );
    assert!(!log.contains("started from the snapshot"), "{log}");
    let _ = fs::remove_dir_all(&dir);
}

/// Runners that share `--snapshot-key-file` adopt each other's snapshots; a daemon with
/// another key does not.
#[tokio::test]
async fn daemons_sharing_a_key_file_adopt_each_others_snapshots() {
    let dir = scratch_dir("shared-key");
    let snapshots = dir.join("snapshots");
    let migrations = migrations(&dir);
    let keys = dir.join("keys");
    fs::create_dir_all(&keys).expect("mkdir");
    let key = keys.join("ci.key");
    let key_arg = key.display().to_string();
    // The first runner makes the key (none there yet) and writes the snapshot.
    let path = honest_snapshot(&snapshots, &migrations, &["--snapshot-key-file", &key_arg]).await;
    let shared = fs::read(&key).expect("the first runner made the key");
    assert!(sealed_by(&path, &shared));
    // Another runner, another cache root, the same key: adopted.
    let second_cache = dir.join("second-cache");
    let second = TestDaemon::builder()
        .default_cache()
        .args([
            "--snapshot-dir",
            &snapshots.display().to_string(),
            "--template",
            &format!("app=migrations:{}", migrations.display()),
            "--snapshot-key-file",
            &key_arg,
            "--cache-dir",
            &second_cache.display().to_string(),
        ])
        .start()
        .await;
    second.lease_ok("app").await;
    let (status, log) = second.stop_with_log().await;
    assert!(status.success(), "{log}");
    assert!(log.contains("started from the snapshot"), "{log}");
    assert!(log.contains("template already built template=app"), "{log}");
    // Its own key instead: passed over, and said why.
    let third = daemon(&snapshots, &migrations, &[]).await;
    third.lease_ok("app").await;
    let log = replaced_at_the_stop(third, &path, &default_key()).await;
    assert!(log.contains("its MAC was made with another key"), "{log}");
    let _ = fs::remove_dir_all(&dir);
}

/// The key never sits in the snapshot directory: whoever writes snapshots could read it.
#[test]
fn a_key_file_inside_the_snapshot_directory_is_refused() {
    let dir = scratch_dir("key-inside");
    let snapshots = dir.join("snapshots");
    fs::create_dir_all(&snapshots).expect("mkdir");
    let inside = snapshots.join("sub/../snapshot.key").display().to_string();
    let (status, log) = TestDaemon::builder()
        .args([
            "--snapshot-dir",
            &snapshots.display().to_string(),
            "--snapshot-key-file",
            &inside,
        ])
        .run_to_exit();
    assert_eq!(status.code(), Some(64), "{log}");
    assert!(log.contains("is inside --snapshot-dir"), "{log}");
    assert_eq!(
        log.lines().filter(|l| l.contains("pglease:")).count(),
        1,
        "{log}"
    );
    // The default key inside it too (the cache root in the snapshot directory).
    let (status, log) = TestDaemon::builder()
        .default_cache()
        .args([
            "--snapshot-dir",
            &snapshots.display().to_string(),
            "--cache-dir",
            &snapshots.join("cache").display().to_string(),
        ])
        .run_to_exit();
    assert_eq!(status.code(), Some(64), "{log}");
    assert!(log.contains("is inside --snapshot-dir"), "{log}");
    let _ = fs::remove_dir_all(&dir);
}

// Defence in depth (issue 41, step 2): a snapshot whose MAC is valid — signed here with the
// daemon's own key, as a leaked key would allow — still configures nothing and starts no
// recovery.

/// Row 1 signed: the recovery signal and the script are refused at unpacking; the script
/// never runs, and the cluster is built fresh.
#[tokio::test]
async fn a_signed_snapshot_with_a_recovery_signal_is_refused() {
    let dir = scratch_dir("signed-row1");
    let snapshots = dir.join("snapshots");
    let migrations = migrations(&dir);
    let path = honest_snapshot(&snapshots, &migrations, &[]).await;
    let marker = marker_dir(&dir).join("ran");
    let hostile = with_restore_command(entries(&path), &marker);
    fs::write(&path, seal(&pack(&hostile), &default_key())).expect("write");

    let second = daemon(&snapshots, &migrations, &[]).await;
    port_of(&second).await;
    assert!(!marker.exists(), "the snapshot's restore command ran");
    let log = replaced_at_the_stop(second, &path, &default_key()).await;
    assert!(log.contains("cannot unpack the snapshot: refused"), "{log}");
    assert!(
        log.contains("would start recovery (which runs restore_command)"),
        "{log}"
    );
    assert!(!marker.exists(), "the snapshot's restore command ran");
    let _ = fs::remove_dir_all(&dir);
}

/// Row 2 signed, the hba file hidden inside `base/` (which unpacks): the snapshot is
/// adopted, but postgres reads pglease's configuration, not the snapshot's
/// `postgresql.auto.conf`, so nobody logs in over TCP as the superuser.
#[tokio::test]
async fn a_signed_snapshot_configures_nothing() {
    let dir = scratch_dir("signed-row2");
    let snapshots = dir.join("snapshots");
    let migrations = migrations(&dir);
    let path = honest_snapshot(&snapshots, &migrations, &[]).await;
    let entries = entries(&path);
    let mut auto = file_in(&entries, "postgresql.auto.conf");
    auto.extend_from_slice(b"hba_file = 'pgdata-1/base/open_hba.conf'\n");
    let entries = with_file(entries, "postgresql.auto.conf", &auto);
    let entries = with_file(
        entries,
        "base/open_hba.conf",
        b"local all all trust\nhost all all 127.0.0.1/32 trust\n",
    );
    fs::write(&path, seal(&pack(&entries), &default_key())).expect("write");

    let second = daemon(&snapshots, &migrations, &[]).await;
    let port = port_of(&second).await;
    let refused = login(port, "postgres", "postgres", "")
        .await
        .expect_err("logged in");
    assert!(refused.contains("28000"), "{refused}");
    let (status, log) = second.stop_with_log().await;
    assert!(status.success(), "{log}");
    assert!(log.contains("started from the snapshot"), "{log}");
    let _ = fs::remove_dir_all(&dir);
}

/// Row 3 signed (issue 41, step 3): the attacker's catalog, with a superuser `backdoor`,
/// re-sealed with the daemon's own key. The catalog is checked before any TCP client can
/// log in: refused, the server stopped, a fresh cluster built; `backdoor` cannot log in.
#[tokio::test]
async fn a_signed_snapshot_with_a_backdoor_role_is_refused_before_tcp_opens() {
    let dir = scratch_dir("signed-row3");
    let snapshots = dir.join("snapshots");
    let migrations = migrations(&dir);
    // The attacker's daemon (its own key, a superuser lease) makes the backdoor; its stop
    // writes the snapshot.
    let other_key = dir.join("other.key");
    fs::write(&other_key, [0x77; 32]).expect("write the other key");
    fs::set_permissions(
        &other_key,
        <fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o600),
    )
    .expect("chmod");
    let other_key_arg = other_key.display().to_string();
    let attacker = daemon(
        &snapshots,
        &migrations,
        &["--snapshot-key-file", &other_key_arg, "--lease-superuser"],
    )
    .await;
    let lease = attacker.lease_ok("app").await;
    let client = connect(&lease).await.expect("connect");
    client
        .batch_execute("CREATE ROLE backdoor SUPERUSER LOGIN PASSWORD 'open-sesame'")
        .await
        .expect("the backdoor role");
    client
        .batch_execute("CREATE DATABASE backdoor")
        .await
        .expect("the backdoor database");
    drop(client);
    let (status, log) = attacker.stop_with_log().await;
    assert!(status.success(), "{log}");
    assert!(log.contains("wrote the snapshot"), "{log}");
    let path = snapshots.join(
        fs::read_dir(&snapshots)
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .find(|n| n.to_string_lossy().ends_with(".pgsnap"))
            .expect("the attacker's snapshot"),
    );
    // Re-sealed with the daemon's own key, as a leaked key would allow.
    let bytes = fs::read(&path).expect("read");
    fs::write(&path, seal(&bytes[..bytes.len() - TRAILER], &default_key())).expect("re-seal");

    let second = daemon(&snapshots, &migrations, &[]).await;
    let port = port_of(&second).await;
    let refused = login(port, "backdoor", "backdoor", "open-sesame")
        .await
        .expect_err("logged in");
    assert!(refused.contains("28P01"), "{refused}");
    let log = replaced_at_the_stop(second, &path, &default_key()).await;
    assert!(
        log.contains(
            "the snapshot's cluster is refused: its catalog has roles pglease does not make"
        ),
        "{log}"
    );
    assert!(log.contains("backdoor"), "{log}");
    let _ = fs::remove_dir_all(&dir);
}
