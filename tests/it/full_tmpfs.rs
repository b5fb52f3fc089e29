//! A full tmpfs: on a dedicated 300 MB tmpfs (`--tmpfs-size`, which needs root; the
//! databases get 204 MB of it), a template too big to build and clones that stop fitting
//! get clear errors, nothing half-made stays, everything that fits keeps being served, a
//! lease that fills it fails alone (with `--lease-max-bytes off`; by default it is ended
//! first), and releasing makes room again.

use std::fs;
use std::time::Duration;

use serde_json::json;

use crate::cow::write_in_a_lease_of;
use crate::lease_bytes::{bystander, fill_until_cut_off, is_cut_off, told_why};
use crate::support::disk_full::{
    assert_refused_for_room, churn_when_full, fill_to_the_last_rows, fill_until_refused,
    says_disk_full, FILL_TABLE,
};
use crate::support::{connect, id_of, poll_until, scratch_dir, TestDaemon};

#[tokio::test]
async fn a_full_tmpfs_gives_clear_errors_and_keeps_serving_what_fits() {
    if !nix::unistd::geteuid().is_root() {
        // Mounting the dedicated tmpfs needs root; CI and the dev machines run as root.
        eprintln!("skipped: --tmpfs-size needs root");
        return;
    }
    let huge = scratch_dir("tmpfs-huge");
    fs::write(
        huge.join("001.sql"),
        "CREATE TABLE big AS SELECT g, repeat('x', 1000) AS pad FROM generate_series(1, 300000) g;",
    )
    .expect("write");
    let mid = scratch_dir("tmpfs-mid");
    fs::write(
        mid.join("001.sql"),
        "CREATE TABLE mid AS SELECT g, repeat('x', 1000) AS pad FROM generate_series(1, 20000) g;",
    )
    .expect("write");
    let daemon = TestDaemon::builder()
        // A budget above the tmpfs' size: this is about a tmpfs that fills for reasons the
        // budget cannot see (tests writing into their databases), where postgres itself
        // says "no space" (the budget's own refusal, 507, is tested in budget.rs).
        .args([
            "--tmpfs-size",
            "300M",
            "--max-bytes",
            "1G",
            "--min-ready",
            "1",
        ])
        .args(["--template", &format!("huge=migrations:{}", huge.display())])
        .args(["--template", &format!("mid=migrations:{}", mid.display())])
        .start()
        .await;
    let instance_dir = {
        let status = daemon.status().await;
        let data_dir =
            std::path::PathBuf::from(status["postgres"]["data_dir"].as_str().expect("data dir"));
        data_dir.parent().expect("instance dir").to_path_buf()
    };

    // A template that cannot fit: a clear build error naming the file, 507 `disk_full` (the
    // room ran out, not the SQL: issue 27), and no half-built database.
    let (status, body) = daemon.lease(json!({ "template": "huge" })).await;
    assert_eq!(status, 507, "{body}");
    assert_eq!(body["error"]["code"], "disk_full", "{body}");
    let message = body["error"]["message"].as_str().expect("message");
    assert!(
        message.contains("001.sql") && says_disk_full(message),
        "{message}"
    );

    // Clones of a template that fits a few times: leases until the space runs out, then
    // 507 `disk_full` (issue 27: it was 503 `clone_failed`, which tells a client to retry a
    // server in trouble rather than that the room ran out).
    let mut held = Vec::new();
    let mut refused = None;
    for _ in 0..12 {
        let (status, body) = daemon
            .lease(json!({ "template": "mid", "wait_ms": 5000 }))
            .await;
        match status {
            201 => held.push(body),
            _ => {
                refused = Some((status, body));
                break;
            }
        }
    }
    let (status, refused) = refused.expect("the tmpfs never filled up");
    assert!(!held.is_empty(), "at least one clone fits");
    assert_eq!(status, 507, "{refused}");
    assert_eq!(refused["error"]["code"], "disk_full", "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(says_disk_full),
        "{refused}"
    );

    // What fits is still served, and postgres did not go down.
    daemon.lease_ok("default").await;
    let status = daemon.status().await;
    assert_eq!(status["postgres"]["restarts"], 0, "{status}");
    let mid_status = daemon.template_status("mid").await;
    assert_eq!(mid_status["leased"].as_u64(), Some(held.len() as u64));

    // Releasing makes room: the next lease of the same template works again.
    for lease in &held {
        let (status, _) = daemon.release(&id_of(lease), false).await;
        assert_eq!(status, 204);
    }
    poll_until(Duration::from_secs(20), "a clone to fit again", || async {
        let (status, body) = daemon
            .lease(json!({ "template": "mid", "wait_ms": 2000 }))
            .await;
        (status == 201).then_some(body)
    })
    .await;

    assert!(daemon.stop().await.success());
    assert!(
        !instance_dir.exists(),
        "the tmpfs is unmounted and its directory removed"
    );
}

/// docs/security.md, "a lease holder fills the storage", with `--lease-max-bytes off` (by
/// default the filler is ended long before: the next test): its own writes fail with
/// "No space left on device" (SQLSTATE 53100), while postgres stays up and every other
/// lease keeps working; the log and `/status` name the database that filled it, also after
/// room came back, and a release makes room again. Before the databases had a tmpfs of
/// their own, postgres PANICked on its next WAL or checkpoint write and restarted, ending
/// every lease.
#[tokio::test]
async fn a_lease_that_fills_the_tmpfs_fails_alone() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: --tmpfs-size needs root");
        return;
    }
    let daemon = TestDaemon::builder()
        .args([
            "--tmpfs-size",
            "300M",
            "--min-ready",
            "1",
            "--lease-max-bytes",
            "off",
        ])
        .start()
        .await;
    assert!(
        daemon.status().await["limits"]["lease_max_bytes"].is_null(),
        "off"
    );
    let filler = daemon.lease_ok("default").await;
    let bystander = daemon.lease_ok("default").await;
    let other = connect(&bystander).await.expect("the bystander connects");
    other
        .batch_execute("CREATE TABLE mine (n int); INSERT INTO mine VALUES (1)")
        .await
        .expect("the bystander writes");

    // INSERTs into an existing table, as tests write: every row goes through WAL too.
    let client = connect(&filler).await.expect("the filler connects");
    client.batch_execute(FILL_TABLE).await.expect("create");
    assert_refused_for_room(&fill_until_refused(&client, 400).await);

    // Churn on the full tmpfs: WAL grows by every row, so it needs room of its own.
    churn_when_full(&client, "on the full tmpfs").await;

    // The server stayed up: the bystander's connection and data are there, it still
    // writes, and the filler's own session goes on too.
    let rows = other
        .query("SELECT count(*) FROM mine", &[])
        .await
        .expect("the bystander's connection survived");
    assert_eq!(rows[0].get::<_, i64>(0), 1);
    other
        .batch_execute("INSERT INTO mine VALUES (2)")
        .await
        .expect("a row that fits its page");
    client
        .batch_execute("SELECT 1")
        .await
        .expect("the filler's session survived");
    let status = daemon.status().await;
    assert_eq!(status["postgres"]["restarts"], 0, "{status}");

    // The log and /status say which database filled it.
    let database = filler["database"].as_str().expect("database").to_owned();
    let status = poll_until(
        Duration::from_secs(10),
        "/status to name the filler",
        || {
            let daemon = &daemon;
            let database = database.clone();
            async move {
                let status = daemon.status().await;
                (status["postgres"]["databases_space"]["filled_by"]["database"]
                    == database.as_str())
                .then_some(status)
            }
        },
    )
    .await;
    let space = &status["postgres"]["databases_space"];
    assert_eq!(space["filled_by"]["template"], "default", "{space}");
    assert_eq!(space["full"], true, "{space}");
    let log = daemon.log();
    let warning = log
        .lines()
        .find(|line| line.contains("the databases' tmpfs is full"))
        .unwrap_or_else(|| panic!("no warning in the log:\n{log}"));
    assert!(
        warning.contains(&database) && warning.contains(&id_of(&filler)),
        "{warning}"
    );

    // Releasing the filler makes room: leases are granted and written in again.
    drop(client);
    let (code, _) = daemon.release(&id_of(&filler), false).await;
    assert_eq!(code, 204);
    let status = poll_until(Duration::from_secs(20), "room again", || async {
        let status = daemon.status().await;
        (status["postgres"]["databases_space"]["full"] == false).then_some(status)
    })
    .await;
    // What filled it is still named once room came back.
    let space = &status["postgres"]["databases_space"];
    assert!(space["filled_by"].is_null(), "{space}");
    assert_eq!(
        space["last_filled_by"]["database"],
        database.as_str(),
        "{space}"
    );
    assert!(space["last_filled_by"]["at"].is_string(), "{space}");
    write_in_a_lease_of(
        &daemon,
        "default",
        "CREATE TABLE t AS SELECT g FROM generate_series(1, 1000) g",
    )
    .await;
    assert_eq!(daemon.status().await["postgres"]["restarts"], 0);
    assert!(daemon.stop().await.success());
}

/// Issue 43: a lease holds the databases' tmpfs full (`--lease-max-bytes off`), and a
/// template registered over HTTP is built into it: the build's own `CREATE DATABASE` meets
/// the full disk (SQLSTATE 53100). The lease that asked is answered 507 `disk_full` naming
/// the full storage, not 422 `template_build_failed`, which blames the template's SQL; once
/// the filler is released, the same template builds and is leased.
#[tokio::test]
async fn a_build_that_meets_a_full_tmpfs_is_507_not_the_sources_fault() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: --tmpfs-size needs root");
        return;
    }
    let sources = scratch_dir("tmpfs-build-full");
    let sql = sources.join("small.sql");
    fs::write(
        &sql,
        "CREATE TABLE small (n int); INSERT INTO small VALUES (1);",
    )
    .expect("write");
    let daemon = TestDaemon::builder()
        // The byte budget above the tmpfs' size, so that postgres, not the budget, says
        // the room is gone (the budget's own 507 is tested in budget.rs).
        .args([
            "--tmpfs-size",
            "300M",
            "--max-bytes",
            "1G",
            "--min-ready",
            "1",
            "--lease-max-bytes",
            "off",
        ])
        .start()
        .await;
    let filler = daemon.lease_ok("default").await;
    let client = connect(&filler).await.expect("the filler connects");
    // Without autovacuum on it, the pages of the failed INSERT stay allocated: nothing
    // gives room back before the release.
    client
        .batch_execute("CREATE TABLE fill (n int, pad text) WITH (autovacuum_enabled = false)")
        .await
        .expect("create");
    fill_to_the_last_rows(&client).await;

    let (status, body) = daemon
        .put_template("small", json!({ "sql": sql.display().to_string() }))
        .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = daemon
        .lease(json!({ "template": "small", "wait_ms": 20000 }))
        .await;
    assert_eq!(status, 507, "{body}");
    assert_eq!(body["error"]["code"], "disk_full", "{body}");
    let message = body["error"]["message"].as_str().expect("message");
    assert!(says_disk_full(message), "{message}");
    assert!(
        message.contains("creating the template database"),
        "names the step: {message}"
    );
    assert_eq!(daemon.status().await["postgres"]["restarts"], 0);

    // The room comes back with the release, and the same template builds.
    drop(client);
    let (code, _) = daemon.release(&id_of(&filler), false).await;
    assert_eq!(code, 204);
    let lease = poll_until(Duration::from_secs(30), "the template to build", || async {
        let (status, body) = daemon
            .lease(json!({ "template": "small", "wait_ms": 5000 }))
            .await;
        (status == 201).then_some(body)
    })
    .await;
    let client = connect(&lease).await.expect("connects");
    let row = client
        .query_one("SELECT count(*) FROM small", &[])
        .await
        .expect("the template's table");
    assert_eq!(row.get::<_, i64>(0), 1);
    assert!(daemon.stop().await.success());
}

/// Issue 41 row 7: without `--lease-max-bytes`, as root on tmpfs, one lease may grow to a
/// share of the databases' own tmpfs (a quarter, at least 256M or half, whichever is less:
/// half of these 204 MB); a holder filling the whole tmpfs is cut off there, told why, and
/// every other lease keeps writing, instead of failing every other lease's writes for as
/// long as the filler lives.
#[tokio::test]
async fn by_default_a_filler_of_the_whole_tmpfs_is_ended_and_the_others_keep_writing() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: --tmpfs-size needs root");
        return;
    }
    let daemon = TestDaemon::builder()
        .args(["--tmpfs-size", "300M", "--min-ready", "1"])
        .start()
        .await;
    let status = poll_until(Duration::from_secs(5), "the tmpfs measured", || async {
        let status = daemon.status().await;
        (status["postgres"]["databases_space"]["bytes"].as_u64() > Some(0)).then_some(status)
    })
    .await;
    let room = status["postgres"]["databases_space"]["bytes"]
        .as_u64()
        .expect("room");
    let limit = (room / 4).max((256 << 20u64).min(room / 2));
    assert_eq!(status["limits"]["lease_max_bytes"], limit, "{status}");
    let filler = daemon.lease_ok("default").await;
    let (_, other) = bystander(&daemon).await;

    // The whole tmpfs is 204 MB: 40 batches of 10 MB would fill it twice over.
    let (error, batches) = fill_until_cut_off(&filler, &other, 40).await;
    assert!(is_cut_off(&error), "after {batches} batches: {error:?}");
    told_why(&daemon, &filler, limit).await;
    let status = daemon.status().await;
    assert_eq!(status["limits"]["exceeded_max_bytes"], 1, "{status}");
    assert_eq!(
        status["limits"]["last_exceeded_max_bytes"]["database"], filler["database"],
        "{status}"
    );
    other
        .batch_execute("INSERT INTO mine SELECT g FROM generate_series(1, 100000) g")
        .await
        .expect("the bystander writes after");
    assert_eq!(status["postgres"]["restarts"], 0, "{status}");
    assert!(daemon.stop().await.success());
}

/// Issue 41 row 8: the instance tmpfs pglease mounts (`--tmpfs-size`) is `noexec` (and
/// `nosuid`, `nodev`), also after the databases' split resized it with a remount, which
/// sets the flags anew; the log says so at start. Nothing pglease or postgres runs lives
/// there, while a file a holder makes postgres write there must not become a program.
#[tokio::test]
async fn the_instance_tmpfs_pglease_mounts_is_noexec() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: --tmpfs-size needs root");
        return;
    }
    let daemon = TestDaemon::builder()
        .args(["--tmpfs-size", "300M", "--min-ready", "1"])
        .start()
        .await;
    let status = daemon.status().await;
    assert!(
        status["postgres"]["databases_space"].is_object(),
        "the split (and its remount) happened: {status}"
    );
    let instance_dir =
        std::path::PathBuf::from(status["postgres"]["data_dir"].as_str().expect("data dir"))
            .parent()
            .expect("instance dir")
            .to_path_buf();
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    // Fields: id, parent id, major:minor, root, mount point, the mount's own options, …
    let options = mountinfo
        .lines()
        .map(|line| line.split(' ').collect::<Vec<_>>())
        .find(|fields| fields.get(4) == Some(&instance_dir.to_str().expect("utf-8")))
        .and_then(|fields| fields.get(5).map(|options| options.to_string()))
        .unwrap_or_else(|| {
            panic!(
                "{} is not a mount point:\n{mountinfo}",
                instance_dir.display()
            )
        });
    for flag in ["noexec", "nosuid", "nodev"] {
        assert!(
            options.split(',').any(|option| option == flag),
            "{}: {options}",
            instance_dir.display()
        );
    }
    assert!(
        daemon
            .log()
            .contains("the instance directory's file system is noexec"),
        "{}",
        daemon.log()
    );
    // postgres runs, as it must with nothing of its own to execute there.
    write_in_a_lease_of(&daemon, "default", "CREATE TABLE t (n int)").await;
    assert!(daemon.stop().await.success());
}

/// Root without CAP_SYS_ADMIN (a container's root, by default) cannot give the databases a
/// tmpfs of their own: the daemon says so and serves on one tmpfs, instead of failing to
/// start on the mount.
#[tokio::test]
async fn root_that_cannot_mount_serves_without_the_databases_own_tmpfs() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root (to drop CAP_SYS_ADMIN from it)");
        return;
    }
    let daemon = TestDaemon::builder()
        .wrapped_in(
            "setpriv",
            ["--bounding-set", "-sys_admin", "--inh-caps", "-sys_admin"],
        )
        .start()
        .await;
    write_in_a_lease_of(&daemon, "default", "CREATE TABLE t (n int)").await;
    let status = daemon.status().await;
    assert!(status["postgres"]["databases_space"].is_null(), "{status}");
    assert!(
        daemon
            .log()
            .contains("cannot mount a tmpfs for the databases"),
        "{}",
        daemon.log()
    );
    assert!(daemon.stop().await.success());
}

/// Issue 41, row 4: a lease holder floods the server log (`RAISE WARNING` of 1 MB, 200
/// times: 200 MB). The log lives with WAL and the catalogs, in the rest the databases'
/// tmpfs leaves (96 MB here); before it was bounded, it filled that room in seconds and
/// postgres PANICked writing WAL, restarted, and lost every lease, again and again. Now
/// postgres' output goes through the daemon, which rotates the log at its cap: the flood
/// succeeds, the server stays up, every other lease keeps working, and the log takes at
/// most twice its cap (3 MB for that room).
#[tokio::test]
async fn a_lease_that_floods_the_server_log_fails_nobody() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: --tmpfs-size needs root");
        return;
    }
    let daemon = TestDaemon::builder()
        .args(["--tmpfs-size", "300M", "--min-ready", "1"])
        .start()
        .await;
    let before = daemon.status().await;
    let instance_dir =
        std::path::PathBuf::from(before["postgres"]["data_dir"].as_str().expect("data dir"))
            .parent()
            .expect("instance dir")
            .to_path_buf();
    let flooder = daemon.lease_ok("default").await;
    let bystander = daemon.lease_ok("default").await;
    let other = connect(&bystander).await.expect("the bystander connects");
    other
        .batch_execute("CREATE TABLE mine (n int); INSERT INTO mine VALUES (1)")
        .await
        .expect("the bystander writes");
    let flood = connect(&flooder).await.expect("the flooder connects");
    // The warnings go to the flooder's own session too; it only wants them in the log.
    flood
        .batch_execute(
            "SET client_min_messages = error; \
             DO $$ BEGIN FOR i IN 1..200 LOOP RAISE WARNING '%', repeat('x', 1000000); \
             END LOOP; END $$",
        )
        .await
        .expect("the flood runs to its end");
    // The bystander writes after the flood, ~60 MB of WAL: more than the segments already
    // there, so postgres needs room for new ones in the rest, which the log must have left.
    other
        .batch_execute("INSERT INTO mine SELECT g FROM generate_series(1, 1500000) g")
        .await
        .expect("the bystander writes after the flood");
    let after = daemon.status().await;
    assert_eq!(
        after["postgres"]["pid"], before["postgres"]["pid"],
        "{after}"
    );
    assert_eq!(
        after["postgres"]["restarts"], before["postgres"]["restarts"],
        "{after}"
    );
    let size = |name: &str| fs::metadata(instance_dir.join(name)).map_or(0, |m| m.len());
    let logged = size("postgres.log") + size("postgres.log.1");
    assert!(
        logged <= 2 * (3 << 20),
        "the log takes {logged} bytes, more than twice its cap"
    );
    // The log holds the latest warnings and says that older ones were rotated away.
    let log = fs::read_to_string(instance_dir.join("postgres.log")).expect("the log");
    assert!(
        log.contains("---- pglease: the log passed"),
        "{}",
        &log[..log.len().min(500)]
    );
    // New leases still work.
    let fresh = daemon.lease_ok("default").await;
    let client = connect(&fresh).await.expect("a new lease connects");
    client
        .batch_execute("SELECT 1")
        .await
        .expect("a new lease queries");
    assert!(daemon.stop().await.success());
}
