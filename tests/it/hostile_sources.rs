//! What a caller over HTTP can make the daemon read or run (issue 25, rows 1, 2 and 8):
//! nothing as root. Sources are read with the child user's rights (`nobody` when the daemon
//! is root, as in CI), so a root-only file is refused without a byte of it in the answer or
//! the log; a device or FIFO is refused before a byte is read; a plain-SQL dump (a psql
//! script, which can run programs) is restored over HTTP only with --allow-http-commands,
//! and then, like every program the daemon starts, as the child user with none of the
//! daemon's environment. The daemon keeps serving everyone else throughout.
//!
//! The fences exist only where there is someone to switch to: as another user than root
//! these tests say so and pass.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::{connect, daemon_hashing_a_huge_source, scratch_dir, TestDaemon};

/// What a file only root may read holds: seen in no answer and no log line.
const SECRET: &str = "pglease-secret-7f3a91";

/// The daemon's default child user as root.
fn child_user() -> nix::unistd::User {
    nix::unistd::User::from_name("nobody")
        .ok()
        .flatten()
        .expect("the user nobody")
}

fn as_root(test: &str) -> bool {
    let root = nix::unistd::geteuid().is_root();
    if !root {
        eprintln!("{test}: not root, so there is no child user to switch to; skipped");
    }
    root
}

/// A scratch directory anyone may enter and write to (the child user leaves its marks
/// there).
fn open_dir(name: &str) -> PathBuf {
    let dir = scratch_dir(name);
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).expect("chmod");
    dir
}

fn write_mode(path: &Path, text: &[u8], mode: u32) {
    fs::write(path, text).expect("write");
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("chmod");
}

/// `PUT /templates/{name}` must be refused with 422 `invalid_source`, saying `why`.
async fn refused(daemon: &TestDaemon, name: &str, body: Value, why: &str) -> String {
    let started = Instant::now();
    let (status, answer) = daemon.put_template(name, body.clone()).await;
    assert_eq!(status, 422, "{body}: {answer}");
    assert_eq!(
        answer["error"]["code"], "invalid_source",
        "{body}: {answer}"
    );
    let message = answer["error"]["message"].as_str().unwrap_or("").to_owned();
    assert!(message.contains(why), "{body}: {message}");
    assert!(
        !message.contains(SECRET),
        "{body}: the answer quotes the file"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{body}: refused only after {:?}",
        started.elapsed()
    );
    // Nothing was registered.
    let (status, _) = daemon.get(&format!("/templates/{name}")).await;
    assert_eq!(status, 404, "{body}: registered all the same");
    message
}

#[tokio::test]
async fn a_file_the_child_user_cannot_read_is_refused_without_a_byte_of_it() {
    if !as_root("a_file_the_child_user_cannot_read_is_refused_without_a_byte_of_it") {
        return;
    }
    let dir = scratch_dir("hostile-read");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).expect("chmod");
    // Root's own: as SQL it would fail with a syntax error quoting its first word.
    let secret = dir.join("secret.sql");
    write_mode(&secret, format!("{SECRET} is not SQL;\n").as_bytes(), 0o600);
    let private = dir.join("private");
    fs::create_dir(&private).expect("mkdir");
    write_mode(&private.join("001.sql"), b"CREATE TABLE t ();", 0o644);
    fs::set_permissions(&private, fs::Permissions::from_mode(0o700)).expect("chmod");
    let daemon = TestDaemon::start().await;

    let message = refused(
        &daemon,
        "shadow",
        json!({"sql": "/etc/shadow"}),
        "Permission denied",
    )
    .await;
    assert!(
        message.contains("nobody"),
        "the answer names who read: {message}"
    );
    refused(
        &daemon,
        "dumped",
        json!({"dump": "/etc/shadow"}),
        "Permission denied",
    )
    .await;
    refused(
        &daemon,
        "secret",
        json!({"sql": secret}),
        "Permission denied",
    )
    .await;
    refused(
        &daemon,
        "hidden",
        json!({"migrations": private}),
        "Permission denied",
    )
    .await;
    refused(
        &daemon,
        "inside",
        json!({"sql": private.join("001.sql")}),
        "Permission denied",
    )
    .await;

    // The same file, made readable to everyone, is a template like any other: the refusal
    // was the child user's rights, not the path.
    write_mode(&secret, b"CREATE TABLE fine ();", 0o644);
    let (status, body) = daemon.put_template("secret", json!({"sql": secret})).await;
    assert_eq!(status, 201, "{body}");
    let lease = daemon.lease_ok("secret").await;
    connect(&lease).await.expect("connect");
    assert!(!daemon.log().contains(SECRET), "the log quotes the file");
    assert!(daemon.stop().await.success());
}

#[tokio::test]
async fn devices_fifos_and_oversized_files_are_refused_before_a_byte_is_read() {
    if !as_root("devices_fifos_and_oversized_files_are_refused_before_a_byte_is_read") {
        return;
    }
    let dir = open_dir("hostile-kinds");
    let fifo = dir.join("pipe.sql");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o666)).expect("mkfifo");
    let migrations = dir.join("migrations");
    fs::create_dir(&migrations).expect("mkdir");
    nix::unistd::mkfifo(
        &migrations.join("001.sql"),
        nix::sys::stat::Mode::from_bits_truncate(0o666),
    )
    .expect("mkfifo");
    // 300 MiB of nothing (sparse): over the bound on SQL held in memory.
    let huge = dir.join("huge.sql");
    fs::File::create(&huge)
        .and_then(|file| file.set_len(300 << 20))
        .expect("sparse file");
    fs::set_permissions(&huge, fs::Permissions::from_mode(0o644)).expect("chmod");
    let daemon = TestDaemon::start().await;

    refused(
        &daemon,
        "zero",
        json!({"sql": "/dev/zero"}),
        "a character device",
    )
    .await;
    refused(
        &daemon,
        "zerodump",
        json!({"dump": "/dev/zero"}),
        "a character device",
    )
    .await;
    refused(&daemon, "fifo", json!({"sql": fifo}), "a FIFO").await;
    refused(
        &daemon,
        "fifodir",
        json!({"migrations": migrations}),
        "a FIFO",
    )
    .await;
    refused(
        &daemon,
        "huge",
        json!({"sql": huge}),
        "more than the 256 MiB",
    )
    .await;
    refused(&daemon, "dir", json!({"sql": dir}), "a directory").await;

    // Everyone else is still served.
    let lease = daemon.lease_ok("default").await;
    connect(&lease).await.expect("connect");
    assert!(daemon.stop().await.success());
}

/// A plain-SQL dump that runs a program when psql restores it: `\!` writes who ran it.
fn trapped_dumps(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let proof = dir.join("proof");
    let script = format!(
        "CREATE TABLE restored (id int);\n\\! id -u > {}\n",
        proof.display()
    );
    let plain = dir.join("trap.sql");
    write_mode(&plain, script.as_bytes(), 0o644);
    let gzipped = dir.join("trap.sql.gz");
    let mut encoder = std::process::Command::new("gzip")
        .arg("-c")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("gzip");
    encoder
        .stdin
        .take()
        .expect("stdin")
        .write_all(script.as_bytes())
        .expect("write");
    let out = encoder.wait_with_output().expect("gzip");
    write_mode(&gzipped, &out.stdout, 0o644);
    (plain, gzipped, proof)
}

#[tokio::test]
async fn a_plain_dump_over_http_runs_no_program_unless_commands_are_allowed() {
    if !as_root("a_plain_dump_over_http_runs_no_program_unless_commands_are_allowed") {
        return;
    }
    let dir = open_dir("hostile-dump");
    let (plain, gzipped, proof) = trapped_dumps(&dir);
    let daemon = TestDaemon::start().await;
    for (name, dump) in [("plain", &plain), ("gzipped", &gzipped)] {
        let message = refused(&daemon, name, json!({"dump": dump}), "plain-SQL dump").await;
        assert!(message.contains("--allow-http-commands"), "{message}");
    }
    assert!(!proof.exists(), "the dump's program ran");
    assert!(daemon.stop().await.success());

    // Where the operator allows commands, it restores — as the child user, not as root.
    let daemon = TestDaemon::builder()
        .args(["--allow-http-commands"])
        .env("PGLEASE_PROBE_SECRET", SECRET)
        .start()
        .await;
    let (status, body) = daemon.put_template("plain", json!({"dump": plain})).await;
    assert_eq!(status, 201, "{body}");
    let lease = daemon.lease_ok("plain").await;
    connect(&lease).await.expect("connect");
    let uid = fs::read_to_string(&proof).expect("the trap ran");
    let nobody = child_user();
    assert_eq!(
        uid.trim(),
        nobody.uid.to_string(),
        "psql ran as the child user"
    );
    assert!(daemon.stop().await.success());
}

#[tokio::test]
async fn a_configured_command_runs_as_the_child_user_without_the_daemons_environment() {
    if !as_root("a_configured_command_runs_as_the_child_user_without_the_daemons_environment") {
        return;
    }
    // A directory anyone may write gives no one control of the command (issue 42), so it
    // runs as the child user (tests/it/command_user.rs has the other cases).
    let dir = open_dir("hostile-command");
    let out = dir.join("env");
    let config = dir.join("pglease.toml");
    fs::write(
        &config,
        format!(
            "[templates.app]\ncommand = \"(id -u; id -G; env) > {}\"\n",
            out.display()
        ),
    )
    .expect("write");
    let daemon = TestDaemon::builder()
        .args(["--config", config.to_str().expect("utf8")])
        .env("PGLEASE_PROBE_SECRET", SECRET)
        .start()
        .await;
    daemon.lease_ok("app").await;
    let seen = fs::read_to_string(&out).expect("the command ran");
    let nobody = child_user();
    let mut lines = seen.lines();
    assert_eq!(lines.next(), Some(nobody.uid.to_string().as_str()));
    assert_eq!(
        lines.next(),
        Some(nobody.gid.to_string().as_str()),
        "no supplementary groups"
    );
    assert!(
        !seen.contains(SECRET),
        "the daemon's environment reached the command"
    );
    assert!(seen.contains("DATABASE_URL="), "{seen}");
    assert!(daemon.stop().await.success());
}

#[tokio::test]
async fn a_stop_while_a_source_is_hashed_finishes_within_the_grace_period() {
    let (daemon, hashing, schema) = daemon_hashing_a_huge_source("hostile-stop").await;
    let started = Instant::now();
    let (status, log) = daemon.stop_with_log().await;
    assert!(status.success(), "{status:?}\n{log}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the stop took {:?}",
        started.elapsed()
    );
    assert!(log.contains("stopped"), "{log}");
    let _ = hashing.await;
    let _ = fs::remove_file(&schema);
}
