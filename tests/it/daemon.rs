//! The daemon's life: its tuned postgres, running postgres as an unprivileged user when
//! root, clean SIGTERM, surviving a dead postgres, not outliving a SIGKILL, and refusing
//! bad configuration.

use std::path::PathBuf;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::json;

use crate::support::{connect, id_of, poll_until, process_alive, scratch_dir, TestDaemon};

fn postgres_pid(status: &serde_json::Value) -> u32 {
    status["postgres"]["pid"].as_u64().expect("postgres pid") as u32
}

/// The real uid of a process, from /proc.
fn uid_of(pid: u32) -> u32 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    text.lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|uid| uid.parse().ok())
        .expect("Uid line")
}

#[tokio::test]
async fn postgres_is_tuned_unprivileged_and_gone_after_sigterm() {
    // A process: the test stops it with SIGTERM.
    let daemon = TestDaemon::builder()
        .process()
        .args(["--pg-setting", "work_mem=7MB"])
        .start()
        .await;
    let status = daemon.status().await;
    let settings = &status["postgres"]["settings"];
    for (name, value) in [
        ("fsync", "off"),
        ("synchronous_commit", "off"),
        ("full_page_writes", "off"),
        ("wal_level", "minimal"),
        ("jit", "off"),
        ("shared_buffers", "128MB"),
        ("checkpoint_timeout", "1d"),
    ] {
        assert_eq!(settings[name], value, "{name} in {settings}");
    }
    let pid = postgres_pid(&status);
    let data_dir = PathBuf::from(status["postgres"]["data_dir"].as_str().expect("data dir"));
    assert!(data_dir.starts_with("/dev/shm"), "{}", data_dir.display());
    assert!(data_dir.exists());
    if nix::unistd::geteuid().is_root() {
        assert_ne!(uid_of(pid), 0, "postgres must not run as root");
    } else {
        assert_eq!(uid_of(pid), nix::unistd::geteuid().as_raw());
    }
    let lease = daemon.lease_ok("default").await;
    let client = connect(&lease).await.expect("connect");
    let row = client.query_one("SHOW work_mem", &[]).await.expect("show");
    assert_eq!(
        row.get::<_, String>(0),
        "7MB",
        "--pg-setting reaches postgres"
    );
    drop(client);

    let exit = daemon.stop().await;
    assert!(exit.success(), "clean exit: {exit:?}");
    assert!(!process_alive(pid), "postmaster {pid} outlived the daemon");
    let instance_dir = data_dir.parent().expect("instance dir");
    assert!(
        !instance_dir.exists(),
        "{} was not removed",
        instance_dir.display()
    );
}

#[tokio::test]
async fn sigterm_answers_waiting_requests_with_503_and_exits() {
    // A process: the test stops it with SIGTERM.
    let daemon = TestDaemon::builder()
        .process()
        .args(["--min-ready", "1", "--max-total", "1"])
        .start()
        .await;
    let held = daemon.lease_ok("default").await;
    let pid = postgres_pid(&daemon.status().await);
    let waiter = daemon.lease_in_background(json!({ "wait_ms": 60000 }));
    daemon.wait_for_waiting("default", 1).await;
    let started = std::time::Instant::now();
    let exit = daemon.stop().await;
    let answer = waiter.await.expect("waiter");
    assert_eq!(answer.status, 503, "{answer:?}");
    assert!(answer.retry_after);
    assert_eq!(answer.body["error"]["code"], "shutting_down");
    assert!(exit.success(), "{exit:?}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "shutdown took {:?}",
        started.elapsed()
    );
    assert!(!process_alive(pid));
    drop(held);
}

#[tokio::test]
async fn keep_data_keeps_the_data_directory() {
    let daemon = TestDaemon::builder().args(["--keep-data"]).start().await;
    let status = daemon.status().await;
    let data_dir = PathBuf::from(status["postgres"]["data_dir"].as_str().expect("data dir"));
    assert!(daemon.stop().await.success());
    assert!(data_dir.join("PG_VERSION").exists());
    let _ = std::fs::remove_dir_all(data_dir.parent().expect("instance dir"));
}

#[tokio::test]
async fn a_dead_postgres_is_restarted_and_open_leases_end_clearly() {
    let daemon = TestDaemon::builder()
        .args(["--min-ready", "2"])
        .start()
        .await;
    let lease = daemon.lease_ok("default").await;
    let old_pid = postgres_pid(&daemon.status().await);
    kill(Pid::from_raw(old_pid as i32), Signal::SIGKILL).expect("kill postmaster");

    // Requests during the outage get 503 with Retry-After or, once it is back, a lease.
    let new_lease = poll_until(Duration::from_secs(30), "leasing to work again", || async {
        let response = daemon
            .http
            .post(format!("{}/lease", daemon.base))
            .json(&json!({ "wait_ms": 2000 }))
            .send()
            .await
            .expect("request");
        let status = response.status().as_u16();
        let retry_after = response.headers().contains_key("retry-after");
        let body: serde_json::Value = response.json().await.expect("json");
        match status {
            201 => connect(&body).await.ok().map(|_| body),
            503 => {
                assert!(retry_after, "503 without Retry-After: {body}");
                None
            }
            other => panic!("unexpected {other} during restart: {body}"),
        }
    })
    .await;
    let status = daemon.status().await;
    assert_eq!(status["postgres"]["state"], "running");
    assert!(
        status["postgres"]["restarts"].as_u64() >= Some(1),
        "{status}"
    );
    assert_ne!(postgres_pid(&status), old_pid);
    assert!(
        status["postgres"]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("exited")),
        "{status}\n{}",
        daemon.log()
    );
    let (code, body) = daemon.release(&id_of(&lease), false).await;
    assert_eq!(code, 410, "{body}");
    assert_eq!(body["error"]["code"], "lease_lost");
    let (code, _) = daemon.release(&id_of(&new_lease), false).await;
    assert_eq!(code, 204);
}

#[tokio::test]
async fn a_killed_daemon_takes_postgres_with_it_and_the_next_start_sweeps_its_directory() {
    // A process: the test kills it (SIGKILL).
    let daemon = TestDaemon::builder().process().start().await;
    let status = daemon.status().await;
    let pid = postgres_pid(&status);
    let data_dir = PathBuf::from(status["postgres"]["data_dir"].as_str().expect("data dir"));
    let instance_dir = data_dir.parent().expect("instance dir").to_path_buf();
    daemon.kill();
    poll_until(
        Duration::from_secs(10),
        "the orphaned postmaster to die",
        || async { (!process_alive(pid)).then_some(()) },
    )
    .await;
    // Whichever daemon starts next (this test's, or a concurrent test's) sweeps it.
    let next = TestDaemon::start().await;
    assert!(
        !instance_dir.exists(),
        "the next start sweeps {}",
        instance_dir.display()
    );
    let log = next.log();
    let exit = next.stop().await;
    assert!(exit.success(), "{exit:?}\n{log}");
}

#[tokio::test]
async fn invalid_configuration_exits_64_with_one_line() {
    for args in [
        vec!["--min-ready", "5", "--max-total", "2"],
        vec!["--template", "Bad Name=empty"],
        vec!["--template", "app=tarball:/x"],
        vec!["--template", "default=migrations:/x"],
        vec!["--tmpfs-size", "lots"],
        vec!["--pg-setting", "no_equals_sign"],
        vec!["--pg-setting", "port=6000"],
        vec!["--pg-setting", "HBA_File=/tmp/pg_hba.conf"],
        vec!["--postgres-version", "12"],
    ] {
        let (status, log) = TestDaemon::builder().args(args.clone()).run_to_exit();
        assert_eq!(status.code(), Some(64), "{args:?}: {log}");
        assert_eq!(log.trim().lines().count(), 1, "{args:?}: {log}");
        assert!(log.starts_with("pglease: "), "{args:?}: {log}");
    }
}

/// A postgres setting pglease gives the server itself is refused at once, naming what to
/// use instead: `--pg-setting port=N` used to start postgres on N while the daemon waited
/// 30 s on the port it chose, then failed quoting postgres' log.
#[tokio::test]
async fn a_setting_pglease_makes_itself_is_refused_with_the_flag_to_use() {
    let (status, log) = TestDaemon::builder()
        .args(["--pg-setting", "port=6000"])
        .run_to_exit();
    assert_eq!(status.code(), Some(64), "{log}");
    assert!(log.contains("--pg-port"), "{log}");
    let dir = scratch_dir("own-setting");
    let config = dir.join("pglease.toml");
    std::fs::write(&config, "[postgres.settings]\nlisten_addresses = '*'\n").expect("config");
    let (status, log) = TestDaemon::builder()
        .args(["--config", config.to_str().expect("utf8")])
        .run_to_exit();
    assert_eq!(status.code(), Some(64), "{log}");
    assert!(log.contains("--pg-listen"), "{log}");
}

#[tokio::test]
async fn a_data_directory_on_disk_is_refused_unless_allowed() {
    let dir = scratch_dir("on-disk");
    let on_disk = nix::sys::statfs::statfs(&dir)
        .expect("statfs")
        .filesystem_type()
        != nix::sys::statfs::TMPFS_MAGIC;
    let (status, log) = TestDaemon::builder()
        .args(["--data-dir", dir.to_str().expect("utf8")])
        .run_to_exit();
    if on_disk {
        assert_eq!(status.code(), Some(1), "{log}");
        assert!(log.contains("--allow-unsafe-on-disk"), "{log}");
        let daemon = TestDaemon::builder()
            .args([
                "--data-dir",
                dir.to_str().expect("utf8"),
                "--allow-unsafe-on-disk",
            ])
            .start()
            .await;
        daemon.lease_ok("default").await;
        assert!(daemon.stop().await.success());
    }
}

#[tokio::test]
async fn an_unusable_postgres_binary_directory_is_a_clear_start_error() {
    let dir = scratch_dir("no-binaries");
    let (status, log) = TestDaemon::builder()
        .args(["--pg-bin-dir", dir.to_str().expect("utf8")])
        .run_to_exit();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains(dir.to_str().expect("utf8")),
        "names the directory: {log}"
    );
}

#[tokio::test]
async fn a_closed_log_pipe_does_not_kill_the_daemon() {
    use std::io::{BufRead, BufReader};
    let mut command = crate::support::binary();
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--cache-dir"])
        .arg(crate::support::cache_dir())
        .env("RUST_LOG", "info")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    if let Ok(bin_dir) = std::env::var(crate::support::PG_BIN_ENV) {
        command.arg("--pg-bin-dir").arg(bin_dir);
    }
    let mut child = KillOnDrop(command.spawn().expect("spawn"));
    let stderr = child.0.stderr.take().expect("piped");
    let addr = tokio::task::spawn_blocking(move || {
        let mut reader = BufReader::new(stderr);
        let mut line = String::new();
        while reader.read_line(&mut line).unwrap_or(0) > 0 {
            if let Some(addr) = line
                .split("addr=")
                .nth(1)
                .filter(|_| line.contains("listening"))
            {
                return addr.split_whitespace().next().map(str::to_owned);
            }
            line.clear();
        }
        None
        // The reader is dropped here: the daemon's stderr now has no reader.
    })
    .await
    .expect("join")
    .expect("listening line");
    let http = reqwest::Client::new();
    for _ in 0..5 {
        let response = http
            .post(format!("http://{addr}/lease"))
            .json(&json!({}))
            .send()
            .await
            .expect("the daemon still answers");
        assert_eq!(response.status().as_u16(), 201);
    }
    let pid = Pid::from_raw(child.0.id() as i32);
    kill(pid, Signal::SIGTERM).expect("sigterm");
    let status = tokio::task::spawn_blocking(move || child.0.wait())
        .await
        .expect("join")
        .expect("wait");
    assert!(status.success(), "{status:?}");
}

/// A child process killed (and reaped) if the test fails before it ends it.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[tokio::test]
async fn a_kept_data_directory_is_started_again_with_its_templates_and_ready_clones() {
    let dir = PathBuf::from(format!("/dev/shm/pglease-test-kept-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let args = vec![
        "--data-dir".to_owned(),
        dir.display().to_string(),
        "--keep-data".to_owned(),
        "--min-ready".to_owned(),
        "2".to_owned(),
    ];
    let first = TestDaemon::builder().args(args.clone()).start().await;
    let leased = first.lease_ok("default").await;
    let fingerprint = leased["fingerprint"].clone();
    poll_until(Duration::from_secs(10), "two warm clones", || async {
        (first.template_status("default").await["ready"] == 2).then_some(())
    })
    .await;
    assert!(first.stop().await.success());

    let second = TestDaemon::builder().args(args).start().await;
    poll_until(Duration::from_secs(10), "the adopted clones", || async {
        let status = second.template_status("default").await;
        (status["ready"] == 2 && status["in_progress"] == 0).then_some(())
    })
    .await;
    let log = second.log();
    assert!(log.contains("cluster_origin=Kept"), "{log}");
    assert!(log.contains("template already built"), "{log}");
    assert!(log.contains("adopting a ready clone"), "{log}");
    let lease = second.lease_ok("default").await;
    assert_eq!(lease["fingerprint"], fingerprint);
    assert_ne!(
        lease["database"], leased["database"],
        "the leased clone was dropped at the stop"
    );
    connect(&lease)
        .await
        .expect("an adopted clone with a new password");
    assert!(second.stop().await.success());
    let _ = std::fs::remove_dir_all(&dir);
}
