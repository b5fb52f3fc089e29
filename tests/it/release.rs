//! Release means gone (issue 25, rows 4 and 5): whatever a holder does to its own database
//! and role — it owns both — the release undoes it. A dropped database goes with its role,
//! and a reused one comes back with its attributes and role settings reset and a new
//! password, so the former holder's credentials never work again and the drop never fails.
//!
//! An adversarial table: each row is what a holder runs before it releases, tried against
//! the three ways a release ends — a drop (`--no-reuse-unchanged`), the proof of
//! "unchanged" (the default), and `reuse=true`.

use serde_json::{json, Value};
use tokio_postgres::error::SqlState;

use crate::support::{connect, id_of, poll_until, TestDaemon};

/// What a holder does to its own database and role; `$DB` is its database's name.
const ATTACKS: &[(&str, &str)] = &[
    ("is_template", "ALTER DATABASE $DB IS_TEMPLATE true"),
    (
        "password_and_is_template",
        "ALTER ROLE CURRENT_USER PASSWORD 'mine'; ALTER DATABASE $DB IS_TEMPLATE true",
    ),
    ("connection_limit", "ALTER DATABASE $DB CONNECTION LIMIT 0"),
    ("password", "ALTER ROLE CURRENT_USER PASSWORD 'mine'"),
    (
        "role_settings",
        "ALTER ROLE CURRENT_USER SET search_path = 'trap'; ALTER ROLE CURRENT_USER PASSWORD 'mine'",
    ),
];

/// How the release ends.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Ending {
    /// Dropped: the daemon runs with `--no-reuse-unchanged`.
    Drop,
    /// A plain release on a daemon that proves databases unchanged (the default).
    Proof,
    /// `reuse=true`: back to the pool as it is.
    Reuse,
}

/// The lease's URL with the holder's own password.
fn with_password(lease: &Value, password: &str) -> String {
    let url = lease["url"].as_str().expect("url");
    url.replace(lease["password"].as_str().expect("password"), password)
}

async fn try_login(url: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// Whether `name` is still a database and a role on the server, seen from `observer`.
async fn still_there(observer: &tokio_postgres::Client, name: &str) -> (bool, bool) {
    let row = observer
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1), \
                    EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)",
            &[&name],
        )
        .await
        .expect("catalogs");
    (row.get(0), row.get(1))
}

async fn attack_then_release(ending: Ending) {
    let mut args = vec!["--min-ready", "1", "--max-total", "3"];
    if ending == Ending::Drop {
        args.push("--no-reuse-unchanged");
    }
    let daemon = TestDaemon::builder().args(args).start().await;
    // Another lease watches the catalogs (every role may read them).
    let watcher = daemon.lease_ok("default").await;
    let observer = connect(&watcher).await.expect("the watcher connects");
    for (name, attack) in ATTACKS {
        let lease = daemon.lease_ok("default").await;
        let database = lease["database"].as_str().expect("database").to_owned();
        let holder = connect(&lease).await.expect("the holder connects");
        holder
            .batch_execute(&attack.replace("$DB", &format!("\"{database}\"")))
            .await
            .unwrap_or_else(|e| panic!("{name}: the holder's own statements: {e}"));
        drop(holder);
        let (status, body) = daemon
            .release(&id_of(&lease), ending == Ending::Reuse)
            .await;
        assert_eq!(status, 204, "{name} {ending:?}: {body}");

        // The former holder's own password never works again: the release (its job runs
        // after the 204) ends in a refusal that says so. On the way, a login may also meet
        // the database being dropped (55000) or its session ended (57P01); those say
        // nothing yet, so the poll goes on until the lockout shows.
        let mine = with_password(&lease, "mine");
        let lockout = [
            SqlState::INVALID_PASSWORD,
            SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
            SqlState::UNDEFINED_DATABASE,
        ];
        let seen = std::cell::RefCell::new(Vec::new());
        let refused = poll_until(
            std::time::Duration::from_secs(10),
            "the release to lock the holder out",
            || async {
                let error = try_login(&mine).await.err()?;
                if error.code().is_some_and(|c| lockout.contains(c)) {
                    return Some(error);
                }
                seen.borrow_mut().push(format!("{error:?}"));
                None
            },
        )
        .await;
        assert!(
            refused.code().is_some_and(|c| lockout.contains(c)),
            "{name} {ending:?}: {refused} (before it: {:?})",
            seen.borrow()
        );
        match ending {
            Ending::Drop => {
                // Gone, database and role, however the holder left them.
                poll_until(
                    std::time::Duration::from_secs(10),
                    "the database and its role to be dropped",
                    || async {
                        (still_there(&observer, &database).await == (false, false)).then_some(())
                    },
                )
                .await;
            }
            Ending::Proof | Ending::Reuse => {
                // Gone, or back in the pool with everything a holder can set reset.
                poll_until(
                    std::time::Duration::from_secs(10),
                    "the database to be dropped or ready again",
                    || async {
                        let row = observer
                            .query_one(
                                "SELECT count(*) FROM pg_database WHERE datname = $1 \
                                   AND (datistemplate OR NOT datallowconn OR datconnlimit <> -1)",
                                &[&database],
                            )
                            .await
                            .expect("catalogs");
                        let settings = observer
                            .query_one(
                                "SELECT count(*) FROM pg_db_role_setting s \
                                   JOIN pg_roles r ON r.oid = s.setrole WHERE r.rolname = $1",
                                &[&database],
                            )
                            .await
                            .expect("catalogs");
                        (row.get::<_, i64>(0) == 0 && settings.get::<_, i64>(0) == 0).then_some(())
                    },
                )
                .await;
            }
        }
        // The pool goes on: a lease works, and no drop is failing.
        let next = daemon.lease_ok("default").await;
        connect(&next).await.expect("the next lease connects");
        let (status, _) = daemon.release(&id_of(&next), false).await;
        assert_eq!(status, 204);
        let drops = daemon.status().await["drops"].clone();
        assert_eq!(drops["failed"], json!(0), "{name} {ending:?}: {drops}");
    }
    let (_, metrics) = daemon.get("/metrics").await;
    let metrics = metrics.as_str().unwrap_or_default().to_owned();
    assert!(
        metrics
            .lines()
            .any(|line| line == "pglease_drops_failing 0"),
        "{metrics}"
    );
    assert!(daemon.stop().await.success());
}

#[tokio::test]
async fn a_dropped_database_goes_with_its_role_whatever_its_holder_did() {
    attack_then_release(Ending::Drop).await;
}

#[tokio::test]
async fn a_database_proven_unchanged_comes_back_reset_whatever_its_holder_did() {
    attack_then_release(Ending::Proof).await;
}

#[tokio::test]
async fn a_reused_database_comes_back_reset_whatever_its_holder_did() {
    attack_then_release(Ending::Reuse).await;
}
