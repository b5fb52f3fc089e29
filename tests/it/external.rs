//! `--postgres-url`: attaching to a server pglease did not start. pglease creates and drops
//! only its own (prefixed, marked) databases, warns about fsync, and reuses its templates
//! across restarts.

use crate::support::{connect, scratch_dir, PlainPostgres, TestDaemon};

async fn database_names(client: &tokio_postgres::Client) -> Vec<String> {
    client
        .query("SELECT datname FROM pg_database ORDER BY datname", &[])
        .await
        .expect("list databases")
        .iter()
        .map(|row| row.get(0))
        .collect()
}

#[tokio::test]
async fn an_external_server_is_used_and_only_our_databases_are_touched() {
    let server = PlainPostgres::start("external");
    let admin = server.connect().await;
    // Someone else's databases, one of them with our prefix but without our marker.
    admin
        .batch_execute("CREATE DATABASE keepme")
        .await
        .expect("create");
    admin
        .batch_execute("CREATE DATABASE pglease_lookalike")
        .await
        .expect("create");
    let schema = scratch_dir("external-schema").join("schema.sql");
    std::fs::write(
        &schema,
        "CREATE TABLE t (id int); INSERT INTO t VALUES (1);",
    )
    .expect("write");
    let args = vec![
        "--postgres-url".to_owned(),
        server.url(),
        "--template".to_owned(),
        format!("app=sql:{}", schema.display()),
        "--min-ready".to_owned(),
        "2".to_owned(),
    ];

    let daemon = TestDaemon::builder().args(args.clone()).start().await;
    let lease = daemon.lease_ok("app").await;
    assert_eq!(lease["port"], server.port);
    let client = connect(&lease)
        .await
        .expect("connect to the external server");
    let row = client
        .query_one("SELECT count(*) FROM t", &[])
        .await
        .expect("template applied");
    assert_eq!(row.get::<_, i64>(0), 1);
    drop(client);
    let status = daemon.status().await;
    assert_eq!(status["postgres"]["external"], true);
    assert_eq!(status["postgres"]["settings"]["fsync"], "on");
    assert!(
        daemon.log().contains("fsync=on"),
        "warns about fsync:\n{}",
        daemon.log()
    );
    assert!(daemon.stop().await.success());

    // Clones are gone, templates stay for the next run, foreign databases are untouched.
    let names = database_names(&admin).await;
    for name in ["keepme", "pglease_lookalike", "postgres"] {
        assert!(
            names.contains(&name.to_owned()),
            "{name} missing from {names:?}"
        );
    }
    let ours: Vec<&String> = names
        .iter()
        .filter(|n| n.starts_with("pglease_") && *n != "pglease_lookalike")
        .collect();
    assert_eq!(ours.len(), 2, "only the two templates remain: {ours:?}");
    assert!(
        ours.iter().all(|n| n.starts_with("pglease_tpl_")),
        "{ours:?}"
    );

    // The next run reuses them instead of building again.
    let again = TestDaemon::builder().args(args.clone()).start().await;
    let leased = again.lease_ok("app").await;
    let leased_db = leased["database"].as_str().expect("db").to_owned();
    assert!(
        again.log().contains("template already built"),
        "{}",
        again.log()
    );
    // Killed, it cannot clean up: its clones and their roles stay until the next start.
    again.kill();
    assert!(database_names(&admin).await.contains(&leased_db));
    let third = TestDaemon::builder().args(args.clone()).start().await;
    let names = database_names(&admin).await;
    assert!(!names.contains(&leased_db), "swept: {names:?}");
    assert!(
        names.contains(&"keepme".to_owned()) && names.contains(&"pglease_lookalike".to_owned())
    );
    let role_left = admin
        .query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&leased_db])
        .await
        .expect("roles");
    assert!(
        role_left.is_none(),
        "the killed run's lease role was swept too"
    );
    assert!(third.stop().await.success());

    // --verify-templates builds from scratch once even though the fingerprint matches.
    let mut verify = args;
    verify.push("--verify-templates".to_owned());
    let verifying = TestDaemon::builder().args(verify).start().await;
    verifying.lease_ok("app").await;
    let log = verifying.log();
    assert!(!log.contains("template already built"), "{log}");
    assert!(log.contains("template built"), "{log}");
    assert!(verifying.stop().await.success());
}
