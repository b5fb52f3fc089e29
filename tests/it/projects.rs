//! Real migration projects as CI runs them (issue 42): pglease as root, a root-owned
//! checkout no other user can write, and a tool only root can reach (pip's or pyenv's
//! `alembic` under `/root`, Maven with its repository in `/root/.m2`). The template command
//! is the documented one-liner (docs/templates.md) and nothing else: the lease must see
//! the migrated tables. The projects live in `tests/projects/`; each test copies one into
//! a fresh checkout. A missing tool skips the test with a message, unless
//! `PGLEASE_REQUIRE_TOOLS` is set (`.ci/run` installs them and downloads the Maven plugins
//! once, so that Maven runs offline here).

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::support::{connect, scratch_dir, tool_available, TestDaemon, REQUIRE_TOOLS};

fn project(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/projects")
        .join(name)
}

/// Copies `from` into `to` with the modes a checkout has under umask 022 (directories 0755,
/// files 0644), whatever the modes of this checkout's files are.
fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).expect("mkdir");
    fs::set_permissions(to, fs::Permissions::from_mode(0o755)).expect("chmod");
    for entry in fs::read_dir(from).expect("read the project") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            fs::copy(entry.path(), &target).expect("copy");
            fs::set_permissions(&target, fs::Permissions::from_mode(0o644)).expect("chmod");
        }
    }
}

/// A root-owned checkout of the project `name` (0755, as git leaves one under umask 022:
/// the child user may read it, and reads the watched files with its own rights). Its
/// parents must be closed to other users' writes, or pglease (rightly) runs the command as
/// the child user. The tests' scratch directory is used when its parents are (this
/// checkout's may not be: a clone under `/tmp`), else one under `/var/lib`, which is root's.
fn root_checkout(name: &str) -> PathBuf {
    let scratch = scratch_dir(&format!("project-{name}"));
    let parent = if closed_to_others(&scratch) {
        scratch
    } else {
        let _ = fs::remove_dir_all(&scratch);
        let dir = PathBuf::from("/var/lib/pglease-tests")
            .join(format!("project-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("create a scratch dir under /var/lib");
        for made in [dir.parent().expect("parent"), dir.as_path()] {
            fs::set_permissions(made, fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        assert!(
            closed_to_others(&dir),
            "{} has a parent that is not root's or that others may write: a checkout below it \
             is nobody's alone, so these tests cannot run here",
            dir.display()
        );
        dir
    };
    fs::set_permissions(&parent, fs::Permissions::from_mode(0o755)).expect("chmod");
    let app = parent.join("app");
    copy_tree(&project(name), &app);
    app
}

/// Whether every parent of `dir` is root's and closed to other users' writes.
fn closed_to_others(dir: &Path) -> bool {
    dir.ancestors().skip(1).all(|parent| {
        fs::symlink_metadata(parent).is_ok_and(|meta| meta.uid() == 0 && meta.mode() & 0o022 == 0)
    })
}

fn as_root(test: &str) -> bool {
    let root = nix::unistd::geteuid().is_root();
    if !root {
        eprintln!("SKIPPED {test}: not root; the issue is about pglease as root");
    }
    root
}

/// The tables a lease of the template holds, sorted.
async fn tables(lease: &Value) -> Vec<String> {
    let client = connect(lease).await.expect("connect");
    client
        .query(
            "SELECT tablename::text FROM pg_tables WHERE schemaname = 'public' ORDER BY 1",
            &[],
        )
        .await
        .expect("tables")
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// Whether Maven and the plugin at `path` (under `~/.m2/repository`) are there; skipped
/// or failed like [`tool_available`] when not.
fn maven_plugin_cached(test: &str, path: &str) -> bool {
    if !tool_available("mvn", test, "apt-get install maven default-jdk-headless") {
        return false;
    }
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let cached = Path::new(&home).join(".m2/repository").join(path).is_dir();
    if !cached {
        assert!(
            std::env::var_os(REQUIRE_TOOLS).is_none(),
            "{path} is not in ~/.m2 ({REQUIRE_TOOLS} is set): bash .ci/run downloads it"
        );
        eprintln!("SKIPPED {test}: {path} is not in ~/.m2 (bash .ci/run downloads it)");
    }
    cached
}

#[tokio::test]
async fn alembic_from_a_root_checkout_builds_a_template() {
    let test = "alembic_from_a_root_checkout_builds_a_template";
    if !as_root(test) || !tool_available("alembic", test, "pip install alembic psycopg2-binary") {
        return;
    }
    let app = root_checkout("alembic");
    // The documented command line, run in the checkout: the template's workdir is the
    // daemon's working directory.
    let daemon = TestDaemon::builder()
        .current_dir(&app)
        .args([
            "--template",
            "app=command:alembic upgrade head",
            "--watch",
            "app=migrations",
        ])
        .start()
        .await;
    let lease = daemon.lease_ok("app").await;
    assert_eq!(tables(&lease).await, ["alembic_version", "posts", "users"]);
    let client = connect(&lease).await.expect("connect");
    let head: String = client
        .query_one("SELECT version_num FROM alembic_version", &[])
        .await
        .expect("alembic's bookkeeping")
        .get(0);
    assert_eq!(head, "0002");
    client
        .batch_execute("INSERT INTO users (id, email) VALUES (1, 'a@example.com'); INSERT INTO posts (id, user_id, title) VALUES (1, 1, 'hello');")
        .await
        .expect("use the schema");
    assert!(daemon.stop().await.success());
}

/// The Flyway one-liner of docs/templates.md.
const FLYWAY_COMMAND: &str = "mvn -q -o flyway:migrate -Dflyway.url=\"$JDBC_DATABASE_URL\" -Dflyway.user=\"$JDBC_DATABASE_USERNAME\" -Dflyway.password=\"$JDBC_DATABASE_PASSWORD\"";

/// The Liquibase one-liner of docs/templates.md.
const LIQUIBASE_COMMAND: &str = "mvn -q -o liquibase:update -Dliquibase.url=\"$JDBC_DATABASE_URL\" -Dliquibase.username=\"$JDBC_DATABASE_USERNAME\" -Dliquibase.password=\"$JDBC_DATABASE_PASSWORD\"";

/// Builds the template `app` of the Maven project `name` with `command`, watching
/// `watch` (a TOML array), from a root checkout and returns a lease of it.
async fn maven_template(name: &str, command: &str, watch: &str) -> (TestDaemon, Value) {
    let app = root_checkout(name);
    let config = app.join("pglease.toml");
    fs::write(
        &config,
        format!("[templates.app]\ncommand = '{command}'\nwatch = {watch}\n"),
    )
    .expect("write");
    let daemon = TestDaemon::builder()
        .args(["--config", config.to_str().expect("utf8")])
        .start()
        .await;
    let lease = daemon.lease_ok("app").await;
    (daemon, lease)
}

#[tokio::test]
async fn flyway_through_maven_from_a_root_checkout_builds_a_template() {
    let test = "flyway_through_maven_from_a_root_checkout_builds_a_template";
    if !as_root(test)
        || !maven_plugin_cached(test, "org/flywaydb/flyway-database-postgresql/13.12.0")
    {
        return;
    }
    let (daemon, lease) =
        maven_template("flyway", FLYWAY_COMMAND, r#"["pom.xml", "db/migration"]"#).await;
    assert_eq!(
        tables(&lease).await,
        ["flyway_schema_history", "posts", "users"]
    );
    let client = connect(&lease).await.expect("connect");
    let applied: i64 = client
        .query_one(
            "SELECT count(*) FROM flyway_schema_history WHERE success AND version IS NOT NULL",
            &[],
        )
        .await
        .expect("flyway's bookkeeping")
        .get(0);
    assert_eq!(applied, 2);
    assert!(daemon.stop().await.success());
}

#[tokio::test]
async fn liquibase_through_maven_from_a_root_checkout_builds_a_template() {
    let test = "liquibase_through_maven_from_a_root_checkout_builds_a_template";
    if !as_root(test) || !maven_plugin_cached(test, "org/liquibase/liquibase-maven-plugin/4.33.0") {
        return;
    }
    let (daemon, lease) = maven_template(
        "liquibase",
        LIQUIBASE_COMMAND,
        r#"["pom.xml", "changelog.sql"]"#,
    )
    .await;
    assert_eq!(
        tables(&lease).await,
        [
            "databasechangelog",
            "databasechangeloglock",
            "posts",
            "users"
        ]
    );
    let client = connect(&lease).await.expect("connect");
    let applied: i64 = client
        .query_one("SELECT count(*) FROM databasechangelog", &[])
        .await
        .expect("liquibase's bookkeeping")
        .get(0);
    assert_eq!(applied, 2);
    assert!(daemon.stop().await.success());
}
