//! Where `pglease serve` takes its config file from: `--config`, else `PGLEASE_CONFIG`, else
//! `pglease.toml` in its working directory; the log says which file it read.

use crate::support::{connect, scratch_dir, TestDaemon};

/// A directory with a `pglease.toml` defining the template `name`, whose database has a
/// table of that name, so a lease shows which file the daemon read.
fn config_dir(test: &str, name: &str) -> std::path::PathBuf {
    let dir = scratch_dir(test);
    std::fs::write(
        dir.join("pglease.toml"),
        format!("min_ready = 1\n\n[templates.{name}]\nsql = \"schema.sql\"\n"),
    )
    .expect("write the config file");
    std::fs::write(
        dir.join("schema.sql"),
        format!("CREATE TABLE {name} (id int);\n"),
    )
    .expect("write the schema");
    dir
}

/// Leases `template` and checks its database has the table of that name.
async fn lease_has_table(daemon: &TestDaemon, template: &str) {
    let lease = daemon.lease_ok(template).await;
    let client = connect(&lease).await.expect("connect");
    client
        .simple_query(&format!("SELECT count(*) FROM {template}"))
        .await
        .unwrap_or_else(|e| panic!("the table {template}: {e}"));
}

#[tokio::test]
async fn serve_reads_pglease_toml_from_its_working_directory() {
    let dir = config_dir("config-found", "from_the_found_file");
    let daemon = TestDaemon::builder().current_dir(&dir).start().await;
    lease_has_table(&daemon, "from_the_found_file").await;
    let log = daemon.log();
    assert!(
        log.contains("read the config file found in the working directory")
            && log.contains(&dir.join("pglease.toml").display().to_string()),
        "{log}"
    );
}

#[tokio::test]
async fn pglease_config_names_the_file_and_wins_over_the_one_found() {
    let found = config_dir("config-env-found", "from_the_found_file");
    let named = config_dir("config-env-named", "from_the_named_file");
    let named_file = named.join("pglease.toml");
    let daemon = TestDaemon::builder()
        .current_dir(&found)
        .env("PGLEASE_CONFIG", named_file.to_str().expect("utf8"))
        .start()
        .await;
    lease_has_table(&daemon, "from_the_named_file").await;
    let (status, body) = daemon
        .lease(serde_json::json!({"template": "from_the_found_file"}))
        .await;
    assert_eq!(status, 404, "{body}");
    let log = daemon.log();
    assert!(
        log.contains("read the config file") && log.contains(&named_file.display().to_string()),
        "{log}"
    );
}
