//! `PUT /templates/{name}`: CI jobs that bring their own schema register a template at run
//! time; sources are checked (absolute paths, no `..`, commands only when allowed).

use std::fs;

use serde_json::json;

use crate::support::{connect, scratch_dir, TestDaemon};

#[tokio::test]
async fn a_template_registered_over_http_is_leased_and_can_be_replaced() {
    let dir = scratch_dir("register");
    fs::create_dir_all(dir.join("v1")).expect("mkdir");
    fs::create_dir_all(dir.join("v2")).expect("mkdir");
    fs::write(dir.join("v1/001.sql"), "CREATE TABLE one (id int);").expect("write");
    fs::write(dir.join("v2/001.sql"), "CREATE TABLE two (id int);").expect("write");
    let daemon = TestDaemon::start().await;

    let (status, body) = daemon
        .put_template("ci-job", json!({ "migrations": dir.join("v1") }))
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["name"], "ci-job");
    let lease = daemon.lease_ok("ci-job").await;
    connect(&lease)
        .await
        .expect("connect")
        .query_one("SELECT count(*) FROM one", &[])
        .await
        .expect("v1");

    let (status, _) = daemon
        .put_template("ci-job", json!({ "migrations": dir.join("v1") }))
        .await;
    assert_eq!(status, 200, "the same source again changes nothing");
    let (status, _) = daemon
        .put_template("ci-job", json!({ "migrations": dir.join("v2") }))
        .await;
    assert_eq!(status, 200);
    let newer = daemon.lease_ok("ci-job").await;
    assert_ne!(newer["fingerprint"], lease["fingerprint"]);
    connect(&newer)
        .await
        .expect("connect")
        .query_one("SELECT count(*) FROM two", &[])
        .await
        .expect("v2");
    assert_eq!(daemon.template_status("ci-job").await["version"], 2);
}

#[tokio::test]
async fn hostile_or_unsafe_sources_are_refused() {
    let daemon = TestDaemon::start().await;
    let cases = [
        (
            "rel",
            json!({ "migrations": "migrations" }),
            422,
            "invalid_value",
        ),
        (
            "dots",
            json!({ "sql": "/tmp/../etc/shadow" }),
            422,
            "invalid_value",
        ),
        (
            "both",
            json!({ "sql": "/a.sql", "migrations": "/m" }),
            422,
            "invalid_value",
        ),
        (
            "extra",
            json!({ "sql": "/a.sql", "surprise": 1 }),
            422,
            "invalid_value",
        ),
        (
            "watch-no-cmd",
            json!({ "sql": "/a.sql", "watch": ["/x"] }),
            422,
            "invalid_value",
        ),
        (
            "cmd",
            json!({ "command": "touch /tmp/pwned", "workdir": "/tmp" }),
            403,
            "forbidden",
        ),
        ("default", json!({ "sql": "/a.sql" }), 422, "invalid_value"),
        ("Bad%20Name", json!({}), 422, "invalid_value"),
    ];
    for (name, body, expected, code) in cases {
        let (status, answer) = daemon.put_template(name, body.clone()).await;
        assert_eq!(status, expected, "{name} {body}: {answer}");
        assert_eq!(answer["error"]["code"], code, "{name}: {answer}");
    }
    let (status, _) = daemon
        .send(
            daemon
                .http
                .put(format!("{}/templates/x", daemon.base))
                .body("{nope"),
        )
        .await;
    assert_eq!(status, 400);
    assert!(!std::path::Path::new("/tmp/pwned").exists());
}

#[tokio::test]
async fn commands_over_http_need_the_operators_consent() {
    let dir = scratch_dir("register-command");
    let daemon = TestDaemon::builder()
        .args(["--allow-http-commands"])
        .start()
        .await;
    let (status, body) = daemon.put_template(
        "cmd",
        json!({ "command": "psql -v ON_ERROR_STOP=1 -qc 'CREATE TABLE made (id int)'", "workdir": dir, "timeout_secs": 30 }),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let lease = daemon.lease_ok("cmd").await;
    connect(&lease)
        .await
        .expect("connect")
        .query_one("SELECT count(*) FROM made", &[])
        .await
        .expect("made");
}
