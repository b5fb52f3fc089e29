//! Faults: the daemon killed (SIGKILL) at random moments while 32 workers lease, mark and
//! release, on a server that outlives it — no database is ever held by two workers, and
//! nothing is left behind that the pool does not know about.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::support::{connect, poll_until, PlainPostgres, TestDaemon};

/// Kill cycles: 20 in CI; `PGLEASE_KILL_CYCLES=50` for a longer soak.
fn cycles() -> usize {
    std::env::var("PGLEASE_KILL_CYCLES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(20)
}
const WORKERS: usize = 32;

/// What the workers saw.
#[derive(Default)]
struct Tally {
    tests: AtomicUsize,
    double_leases: AtomicUsize,
    errors: AtomicUsize,
}

/// One worker: lease → mark with its lease id → check no other mark → release (drop).
/// Errors are expected while the daemon is being killed; only a foreign mark is a failure.
async fn worker(base: String, stop: Arc<AtomicBool>, tally: Arc<Tally>) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client");
    while !stop.load(Ordering::Relaxed) {
        let lease: serde_json::Value = match http
            .post(format!("{base}/lease"))
            .json(&json!({ "wait_ms": 2000 }))
            .send()
            .await
        {
            Ok(response) if response.status().as_u16() == 201 => match response.json().await {
                Ok(lease) => lease,
                Err(_) => continue,
            },
            _ => {
                tally.errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let id = lease["id"].as_str().unwrap_or_default().to_owned();
        if let Ok(client) = connect(&lease).await {
            let marked = client
                .batch_execute(&format!(
                    "CREATE TABLE IF NOT EXISTS marker (lease text); INSERT INTO marker VALUES ('{id}')"
                ))
                .await;
            if marked.is_ok() {
                if let Ok(rows) = client
                    .query("SELECT lease FROM marker WHERE lease <> $1", &[&id])
                    .await
                {
                    if !rows.is_empty() {
                        tally.double_leases.fetch_add(1, Ordering::Relaxed);
                    }
                }
                tally.tests.fetch_add(1, Ordering::Relaxed);
            }
        }
        let _ = http.delete(format!("{base}/leases/{id}")).send().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_daemon_killed_under_load_never_double_leases_or_leaks() {
    let server = PlainPostgres::start("kill-cycles");
    let admin = server.connect().await;
    let args = vec![
        "--postgres-url".to_owned(),
        server.url(),
        "--min-ready".to_owned(),
        "4".to_owned(),
        "--max-total".to_owned(),
        "48".to_owned(),
        "--lease-connections".to_owned(),
        "2".to_owned(),
        // The fast opt-in: this test is about kills, and counts the work done between
        // them on a busy machine, where 4096-iteration logins leave fewer leases per cycle.
        "--scram-iterations".to_owned(),
        "16".to_owned(),
    ];
    let tally = Arc::new(Tally::default());
    // A simple generator for the moments of the kills (no test-only dependency needed).
    let mut seed = u64::from(std::process::id()) | 1;
    let cycles = cycles();
    for _ in 0..cycles {
        // A process: the test kills it (SIGKILL).
        let daemon = TestDaemon::builder()
            .args(args.clone())
            .process()
            .start()
            .await;
        let stop = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..WORKERS)
            .map(|_| tokio::spawn(worker(daemon.base.clone(), stop.clone(), tally.clone())))
            .collect();
        // Each daemon must serve again after the last one's kill: wait for this cycle's
        // first finished test, then kill at a random moment of the busy phase that follows.
        // (A fixed window from the start measured the sweep of the killed daemon's leftovers
        // on a busy machine, not the serving.)
        let before = tally.tests.load(Ordering::Relaxed);
        poll_until(
            Duration::from_secs(30),
            "a test done by this daemon",
            || {
                let tally = tally.clone();
                async move { (tally.tests.load(Ordering::Relaxed) > before).then_some(()) }
            },
        )
        .await;
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        tokio::time::sleep(Duration::from_millis(seed % 500)).await;
        daemon.kill();
        stop.store(true, Ordering::Relaxed);
        for worker in workers {
            let _ = worker.await;
        }
    }
    assert_eq!(
        tally.double_leases.load(Ordering::Relaxed),
        0,
        "a database was held by two workers"
    );

    // A last daemon sweeps what the killed ones left: every clone on the server is then
    // one of its own (ready, leased or being made), and every lease role has its database.
    let last = TestDaemon::builder().args(args).start().await;
    let status = poll_until(Duration::from_secs(20), "the pool to settle", || async {
        let status = last.template_status("default").await;
        (status["ready"] == 4 && status["in_progress"] == 0).then_some(status)
    })
    .await;
    let clones: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_database WHERE datname LIKE 'pglease\\_%' AND datname NOT LIKE 'pglease\\_tpl\\_%'",
            &[],
        )
        .await
        .expect("count")
        .get(0);
    assert_eq!(
        clones,
        status["ready"].as_i64().unwrap_or(-1) + status["leased"].as_i64().unwrap_or(-1)
    );
    let orphan_roles: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_roles r WHERE r.rolname LIKE 'pglease\\_%' AND r.rolname <> 'pglease_owner' \
             AND NOT EXISTS (SELECT 1 FROM pg_database d WHERE d.datname = r.rolname)",
            &[],
        )
        .await
        .expect("count")
        .get(0);
    assert_eq!(orphan_roles, 0, "every lease role has its database");
    eprintln!(
        "kill cycles: {cycles}, tests {}, double leases {}, expected errors during kills {}",
        tally.tests.load(Ordering::Relaxed),
        tally.double_leases.load(Ordering::Relaxed),
        tally.errors.load(Ordering::Relaxed)
    );
    assert!(last.stop().await.success());
}

/// Stops the workers and checks each ends within 15 s: nothing they asked for hangs.
async fn stop_workers(stop: &AtomicBool, workers: Vec<tokio::task::JoinHandle<()>>) {
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        tokio::time::timeout(Duration::from_secs(15), worker)
            .await
            .expect("no worker hangs")
            .expect("worker");
    }
}

/// Starts the workers on `base`, tallying into `tally`.
async fn run_workers(
    base: &str,
    tally: &Arc<Tally>,
) -> (Arc<AtomicBool>, Vec<tokio::task::JoinHandle<()>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let workers = (0..WORKERS)
        .map(|_| tokio::spawn(worker(base.to_owned(), stop.clone(), tally.clone())))
        .collect();
    (stop, workers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_killed_under_load_is_back_within_seconds_and_nothing_hangs() {
    let daemon = TestDaemon::builder()
        .args([
            "--min-ready",
            "4",
            "--max-total",
            "48",
            "--lease-connections",
            "2",
        ])
        .start()
        .await;
    let tally = Arc::new(Tally::default());
    let (stop, workers) = run_workers(&daemon.base, &tally).await;
    // The kill must come under load: waited for until a first test has finished (leases
    // flow end to end), rather than a fixed pause a busy machine can fill with nothing.
    poll_until(Duration::from_secs(30), "a first test to finish", || {
        let done = tally.tests.load(Ordering::Relaxed) > 0;
        async move { done.then_some(()) }
    })
    .await;
    let before = tally.tests.load(Ordering::Relaxed);
    let pid = daemon.status().await["postgres"]["pid"]
        .as_u64()
        .expect("pid") as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill");
    let killed_at = std::time::Instant::now();
    // Noticed within a second: /status says so (restarting or already back, restarts ≥ 1).
    let noticed = poll_until(Duration::from_secs(5), "the daemon to notice", || async {
        let status = daemon.status().await;
        (status["postgres"]["restarts"].as_u64() >= Some(1)).then_some(killed_at.elapsed())
    })
    .await;
    assert!(
        noticed < Duration::from_millis(1500),
        "noticed after {noticed:?}"
    );
    // Service resumes without a daemon restart: the workers get work done again.
    poll_until(Duration::from_secs(20), "tests to pass again", || async {
        (tally.tests.load(Ordering::Relaxed) > before + 50).then_some(())
    })
    .await;
    stop_workers(&stop, workers).await;
    assert_eq!(tally.double_leases.load(Ordering::Relaxed), 0);
    assert!(daemon.stop().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_under_load_stops_cleanly_within_the_grace_period() {
    let daemon = TestDaemon::builder()
        .args([
            "--min-ready",
            "4",
            "--max-total",
            "48",
            "--lease-connections",
            "2",
        ])
        .start()
        .await;
    let status = daemon.status().await;
    let pid = status["postgres"]["pid"].as_u64().expect("pid") as u32;
    let data_dir = std::path::PathBuf::from(status["postgres"]["data_dir"].as_str().expect("dir"));
    let tally = Arc::new(Tally::default());
    let (stop, workers) = run_workers(&daemon.base, &tally).await;
    // Under load for real: some tests done, others in flight. Waited for rather than a
    // fixed pause, which a busy machine can fill without finishing a single test.
    poll_until(Duration::from_secs(30), "a first test to finish", || {
        let done = tally.tests.load(Ordering::Relaxed) > 0;
        async move { done.then_some(()) }
    })
    .await;
    // And leases open as the signal goes: /status counts some that workers hold mid-test.
    poll_until(
        Duration::from_secs(30),
        "a lease held by a worker",
        || async {
            (daemon.template_status("default").await["leased"].as_u64() > Some(0)).then_some(())
        },
    )
    .await;
    let started = std::time::Instant::now();
    let exit = daemon.stop().await;
    let took = started.elapsed();
    stop_workers(&stop, workers).await;
    assert!(exit.success(), "{exit:?}");
    assert!(took < Duration::from_secs(15), "stopping took {took:?}");
    assert!(
        !crate::support::process_alive(pid),
        "postgres outlived the daemon"
    );
    assert!(
        !data_dir.parent().expect("instance").exists(),
        "the data directory remains"
    );
    assert_eq!(tally.double_leases.load(Ordering::Relaxed), 0);
    assert!(tally.tests.load(Ordering::Relaxed) > 0);
}

/// The daemon watches the server through one idle connection. If that connection alone
/// closes (an external server's idle_session_timeout, a proxy, an administrator) while
/// postgres runs on, nothing is lost: the daemon looks again before declaring the server
/// gone, and every lease stays valid.
#[tokio::test]
async fn a_closed_monitor_connection_alone_loses_no_lease() {
    let server = PlainPostgres::start("monitor");
    let admin = server.connect().await;
    let daemon = TestDaemon::builder()
        .args(["--postgres-url".to_owned(), server.url()])
        .start()
        .await;
    let lease = daemon.lease_ok("default").await;
    let ended = admin
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name = 'pglease monitor'",
            &[],
        )
        .await
        .expect("terminate the monitor connection");
    assert_eq!(ended.get::<_, i64>(0), 1, "one monitor connection");
    poll_until(
        Duration::from_secs(10),
        "a new monitor connection",
        || async {
            let row = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pglease monitor'",
                &[],
            )
            .await
            .ok()?;
            (row.get::<_, i64>(0) == 1).then_some(())
        },
    )
    .await;
    let client = connect(&lease).await.expect("the lease still connects");
    drop(client);
    let (status, body) = daemon
        .release(lease["id"].as_str().expect("id"), false)
        .await;
    assert_eq!(status, 204, "the lease is still open: {body}");
    assert_eq!(daemon.status().await["postgres"]["restarts"], 0);
    assert!(daemon.stop().await.success());
}

/// Issue 41, row 9: an operator's slip (`pkill postgres`, `pg_ctl stop` on the wrong
/// directory) sends pglease's postmaster SIGTERM. Postgres then sits in smart shutdown,
/// keeping the sessions it has and refusing every new one; before, pglease went on granting
/// leases on it whose URLs failed with "the database system is shutting down", and
/// `/status` said `running`, until the daemon itself was restarted.
#[tokio::test]
async fn a_postmaster_someone_else_stops_is_taken_back() {
    let daemon = TestDaemon::builder()
        .args(["--min-ready", "2"])
        .start()
        .await;
    // A holder's open session is what keeps a smart shutdown waiting.
    let held = daemon.lease_ok("default").await;
    let _session = connect(&held).await.expect("connect with the held lease");
    let before = daemon.status().await;
    let pid = before["postgres"]["pid"].as_u64().expect("postgres pid") as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM to the postmaster");
    let sent = std::time::Instant::now();
    // A new lease works again: granted, and its URL connects.
    poll_until(
        Duration::from_secs(15),
        "a lease whose URL connects",
        || async {
            let (code, lease) = daemon.lease(json!({ "template": "default" })).await;
            if code != 201 {
                return None;
            }
            connect(&lease).await.ok().map(|_| ())
        },
    )
    .await;
    let took = sent.elapsed();
    let after = daemon.status().await;
    assert!(
        took < Duration::from_secs(10),
        "leases worked again only after {took:?}"
    );
    assert!(
        after["postgres"]["restarts"].as_u64() > before["postgres"]["restarts"].as_u64(),
        "/status shows no restart: {after}"
    );
    assert_ne!(
        after["postgres"]["pid"].as_u64(),
        Some(pid as u64),
        "{after}"
    );
    let reason = after["postgres"]["last_error"].as_str().unwrap_or_default();
    assert!(reason.contains("shutting down"), "{reason}");
    // One sentence, not a source line's indentation in the middle of it.
    assert!(!reason.contains("  "), "{reason:?}");
    assert!(daemon.stop().await.success());
}
