//! Who runs a migration command when pglease is root (issue 42): an operator's command in
//! a checkout one user alone controls runs as that user, with its HOME; one in a checkout
//! others may write runs as the child user, and an error it meets there says who ran it,
//! why and what it could not reach; a command registered over HTTP runs as the child user
//! whoever owns its directory. Each script records `id -u` and `$HOME` in a table the
//! lease reads.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::support::{connect, scratch_dir, TestDaemon};

fn as_root(test: &str) -> bool {
    let root = nix::unistd::geteuid().is_root();
    if !root {
        eprintln!("{test}: not root, so there is nobody to switch to; skipped");
    }
    root
}

fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("chmod");
}

fn user(name: &str) -> nix::unistd::User {
    nix::unistd::User::from_name(name)
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("the user {name}"))
}

/// The script every test runs: it records who ran it, its HOME and whether it may write
/// there (as Maven does into ~/.m2).
const WHO_SCRIPT: &str = "set -e\n\
    writable=no; if touch \"$HOME/.pglease-probe\" 2>/dev/null; then writable=yes; fi\n\
    psql -v ON_ERROR_STOP=1 -q -c \"CREATE TABLE who AS SELECT $(id -u) AS uid, '$HOME'::text AS home, '$writable'::text AS home_writable\"\n";

/// A checkout `<scratch>/<parent>/app` (the parent with `parent_mode`, the checkout 0755)
/// holding `migrate.sh` and a configuration file defining the template `app` as
/// `sh migrate.sh`. Returns the checkout and the configuration file.
fn checkout(name: &str, parent_mode: u32) -> (PathBuf, String) {
    let parent = scratch_dir(name);
    let app = parent.join("app");
    fs::create_dir_all(&app).expect("mkdir");
    chmod(&parent, parent_mode);
    chmod(&app, 0o755);
    fs::write(app.join("migrate.sh"), WHO_SCRIPT).expect("write");
    chmod(&app.join("migrate.sh"), 0o644);
    let config = app.join("pglease.toml");
    fs::write(
        &config,
        "[templates.app]\ncommand = \"sh migrate.sh\"\ntimeout_secs = 60\n",
    )
    .expect("write");
    (app, config.to_str().expect("utf8").to_owned())
}

/// `(uid, home, home_writable)` the template's script recorded.
async fn who(lease: &Value) -> (i32, String, String) {
    let client = connect(lease).await.expect("connect");
    let row = client
        .query_one("SELECT uid, home, home_writable FROM who", &[])
        .await
        .expect("the script's record");
    (row.get(0), row.get(1), row.get(2))
}

#[tokio::test]
async fn a_root_owned_checkout_no_one_else_can_write_runs_as_root() {
    if !as_root("a_root_owned_checkout_no_one_else_can_write_runs_as_root") {
        return;
    }
    // Under a 0700 parent only root may enter: as before issue 42, the child user could not
    // even start the command there.
    let (_app, config) = checkout("owner-root", 0o700);
    let daemon = TestDaemon::builder()
        .args(["--config", &config])
        .start()
        .await;
    let lease = daemon.lease_ok("app").await;
    let root_home = user("root").dir.to_str().expect("utf8").to_owned();
    assert_eq!(who(&lease).await, (0, root_home, "yes".to_owned()));
    let (status, log) = daemon.stop_with_log().await;
    assert!(status.success(), "{log}");
    assert!(
        log.contains("who runs the migration command") && log.contains("uid 0 owns"),
        "the log says which user and why: {log}"
    );
}

#[tokio::test]
async fn a_checkout_others_may_write_runs_as_the_child_user_and_its_error_says_why() {
    if !as_root("a_checkout_others_may_write_runs_as_the_child_user_and_its_error_says_why") {
        return;
    }
    let (app, config) = checkout("owner-shared", 0o755);
    // Its group may write it: nobody controls it alone.
    chmod(&app, 0o775);
    // A second template needs a tool only root may reach (as root's pyenv in issue 42).
    let private = app.parent().expect("parent").join("private");
    fs::create_dir_all(&private).expect("mkdir");
    fs::write(private.join("tool"), "#!/bin/sh\nexit 0\n").expect("write");
    chmod(&private.join("tool"), 0o755);
    chmod(&private, 0o700);
    let mut text = fs::read_to_string(&config).expect("read");
    text.push_str(&format!(
        "\n[templates.needs_root]\ncommand = \"sh migrate.sh && {}\"\n",
        private.join("tool").display()
    ));
    fs::write(&config, text).expect("write");
    let daemon = TestDaemon::builder()
        .args(["--config", &config])
        .start()
        .await;
    let nobody = user("nobody");
    let lease = daemon.lease_ok("app").await;
    let (uid, _, _) = who(&lease).await;
    assert_eq!(uid as u32, nobody.uid.as_raw(), "the child user ran it");

    let (status, body) = daemon.lease(json!({ "template": "needs_root" })).await;
    assert_eq!(status, 422, "{body}");
    let message = body["error"]["message"].as_str().expect("message");
    let expected = [
        "it ran as user nobody (uid 65534) because no one user controls its files alone: "
            .to_owned(),
        format!("{} is writable by its group (mode 0775)", app.display()),
        format!(
            "nobody could not reach {} ({} is closed to it: mode 0700)",
            private.join("tool").display(),
            private.display()
        ),
        "Run it from a checkout no other user can write".to_owned(),
        "--child-user".to_owned(),
    ];
    for part in expected {
        assert!(message.contains(&part), "{part:?} missing from: {message}");
    }
    assert!(daemon.stop().await.success());
}

#[tokio::test]
async fn a_plain_users_checkout_runs_as_that_user_with_a_home_of_its_own() {
    if !as_root("a_plain_users_checkout_runs_as_that_user_with_a_home_of_its_own") {
        return;
    }
    // The checkout is nobody's; the child user is another (daemon, uid 1), so that the two
    // cannot be mistaken. nobody's home in the user database is /nonexistent: it gets a
    // private one for the run, removed after it.
    let owner = user("nobody");
    let (app, config) = checkout("owner-plain", 0o755);
    for path in [app.clone(), app.join("migrate.sh")] {
        nix::unistd::chown(&path, Some(owner.uid), Some(owner.gid)).expect("chown");
    }
    let daemon = TestDaemon::builder()
        .args(["--config", &config, "--child-user", "daemon"])
        .start()
        .await;
    let lease = daemon.lease_ok("app").await;
    let (uid, home, writable) = who(&lease).await;
    assert_eq!(
        uid as u32,
        owner.uid.as_raw(),
        "the checkout's owner ran it"
    );
    assert!(
        home.contains("pglease-home-"),
        "a home made for the run, not {home}"
    );
    assert_eq!(writable, "yes", "its home is its own");
    assert!(
        !Path::new(&home).exists(),
        "the home made for the run is removed after it"
    );
    assert!(daemon.stop().await.success());

    // A user whose home in the user database is its own gets that home.
    let Some(postgres) = nix::unistd::User::from_name("postgres").ok().flatten() else {
        eprintln!("no user postgres: a user's own home is not tried");
        return;
    };
    let owns_home = fs::metadata(&postgres.dir)
        .is_ok_and(|meta| std::os::unix::fs::MetadataExt::uid(&meta) == postgres.uid.as_raw());
    if !owns_home {
        eprintln!("postgres does not own its home: a user's own home is not tried");
        return;
    }
    for path in [app.clone(), app.join("migrate.sh")] {
        nix::unistd::chown(&path, Some(postgres.uid), Some(postgres.gid)).expect("chown");
    }
    let daemon = TestDaemon::builder()
        .args(["--config", &config, "--child-user", "daemon"])
        .start()
        .await;
    let lease = daemon.lease_ok("app").await;
    let home = postgres.dir.to_str().expect("utf8").to_owned();
    assert_eq!(
        who(&lease).await,
        (postgres.uid.as_raw() as i32, home, "yes".to_owned())
    );
    let _ = fs::remove_file(postgres.dir.join(".pglease-probe"));
    assert!(daemon.stop().await.success());
}

#[tokio::test]
async fn a_command_registered_over_http_runs_as_the_child_user_in_a_root_checkout() {
    if !as_root("a_command_registered_over_http_runs_as_the_child_user_in_a_root_checkout") {
        return;
    }
    // The same root-owned checkout a configured command would run as root in.
    let (app, _config) = checkout("owner-http", 0o755);
    let daemon = TestDaemon::builder()
        .args(["--allow-http-commands"])
        .start()
        .await;
    let (status, body) = daemon
        .put_template(
            "app",
            json!({ "command": "sh migrate.sh", "workdir": app.to_str().expect("utf8") }),
        )
        .await;
    assert!(status == 200 || status == 201, "{status}: {body}");
    let lease = daemon.lease_ok("app").await;
    let (uid, _, _) = who(&lease).await;
    assert_eq!(
        uid as u32,
        user("nobody").uid.as_raw(),
        "the child user ran it"
    );
    assert!(daemon.stop().await.success());
}
