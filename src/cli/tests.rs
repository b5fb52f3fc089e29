use std::path::PathBuf;

use clap::Parser;

use super::*;

fn serve_args(args: &[&str]) -> ServeArgs {
    let mut argv = vec!["pglease", "serve"];
    argv.extend_from_slice(args);
    match Cli::try_parse_from(argv).expect("parses").command {
        Command::Serve(args) => *args,
        other => panic!("not serve: {other:?}"),
    }
}

fn embedded(config: &ServeConfig) -> &EmbeddedConfig {
    match &config.pool.server {
        ServerConfig::Embedded(embedded) => embedded,
        ServerConfig::External(_) => panic!("expected the embedded server"),
    }
}

#[test]
fn no_flags_give_the_embedded_default() {
    let config = serve_args(&[]).into_config().expect("valid");
    assert_eq!(config.listen.to_string(), DEFAULT_LISTEN);
    assert_eq!(config.pool.limits.min_ready, 4);
    assert_eq!(config.pool.limits.max_total, 32);
    assert_eq!(config.pool.clone_strategy, CloneStrategy::FileCopy);
    assert!(
        config.pool.templates.is_empty(),
        "default is added by the pool"
    );
    let embedded = embedded(&config);
    assert_eq!(
        (embedded.locale.as_str(), embedded.encoding.as_str()),
        ("C", "UTF8")
    );
    assert_eq!(embedded.listen_host, "127.0.0.1");
}

#[test]
fn sizes_parse_with_units_and_refuse_nonsense() {
    assert_eq!(parse_size("64M"), Ok(64 << 20));
    assert_eq!(parse_size("2G"), Ok(2 << 30));
    assert_eq!(parse_size("512mb"), Ok(512 << 20));
    assert_eq!(parse_size("1GiB"), Ok(1 << 30));
    assert!(parse_size("1M").is_err(), "too small for a cluster");
    assert!(parse_size("lots").is_err());
    assert!(parse_size("5T").is_err());
    assert!(parse_size("99999999999999999999G").is_err());
}

#[test]
fn template_flags_take_three_forms() {
    let config = serve_args(&[
        "--template",
        "app=migrations:db/migrations",
        "--template",
        "one=sql:/abs/schema.sql",
        "--template",
        "blank=empty",
    ])
    .into_config()
    .expect("valid");
    let sources: Vec<(&str, &TemplateSource)> = config
        .pool
        .templates
        .iter()
        .map(|t| (t.name.as_str(), &t.source))
        .collect();
    let cwd = std::env::current_dir().expect("cwd");
    assert_eq!(
        sources,
        vec![
            (
                "app",
                &TemplateSource::Migrations(cwd.join("db/migrations"))
            ),
            (
                "one",
                &TemplateSource::SqlFile(PathBuf::from("/abs/schema.sql"))
            ),
            ("blank", &TemplateSource::Empty),
        ]
    );
    for bad in [
        "noequals",
        "x=tarball:/a",
        "x=sql:",
        "Bad=empty",
        "default=sql:/x.sql",
    ] {
        assert!(
            serve_args(&["--template", bad]).into_config().is_err(),
            "{bad}"
        );
    }
}

#[test]
fn the_config_file_is_read_relative_to_itself_and_flags_win() {
    let dir = std::env::temp_dir().join(format!("pglease-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("pglease.toml");
    std::fs::write(
        &file,
        r#"
listen = "127.0.0.1:6000"
min_ready = 2
max_total = 8
clone_strategy = "wal_log"

[templates.app]
migrations = "migrations"

[postgres]
tmpfs_size = "1G"
port = 5433
settings = { work_mem = "8MB", max_parallel_workers = 0 }
"#,
    )
    .expect("write");
    let path = file.to_str().expect("utf8");
    let config = serve_args(&[
        "--config",
        path,
        "--min-ready",
        "3",
        "--pg-setting",
        "work_mem=16MB",
    ])
    .into_config()
    .expect("valid");
    assert_eq!(config.listen.to_string(), "127.0.0.1:6000");
    assert_eq!(config.pool.limits.min_ready, 3, "the flag wins");
    assert_eq!(config.pool.limits.max_total, 8);
    assert_eq!(config.pool.clone_strategy, CloneStrategy::WalLog);
    assert_eq!(
        config.pool.templates[0].source,
        TemplateSource::Migrations(dir.join("migrations"))
    );
    let embedded = embedded(&config);
    assert_eq!(embedded.tmpfs_size, Some(1 << 30));
    assert_eq!(embedded.port, Some(5433));
    assert_eq!(
        embedded.settings,
        vec![
            ("max_parallel_workers".to_owned(), "0".to_owned()),
            ("work_mem".to_owned(), "8MB".to_owned()),
            ("work_mem".to_owned(), "16MB".to_owned()),
        ],
        "flags come after the file, so postgres takes them"
    );
    std::fs::write(&file, "min_ready = 1\nunknown_key = true\n").expect("write");
    let error = serve_args(&["--config", path])
        .into_config()
        .expect_err("unknown key");
    assert!(error.contains("unknown_key"), "{error}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_postgres_url_selects_the_external_server() {
    let config = serve_args(&[
        "--postgres-url",
        "postgres://postgres@db:5432/postgres",
        "--advertise-host",
        "pglease",
    ])
    .into_config()
    .expect("valid");
    match config.pool.server {
        ServerConfig::External(external) => {
            assert_eq!(external.url, "postgres://postgres@db:5432/postgres");
            assert_eq!(external.advertise_host.as_deref(), Some("pglease"));
        }
        ServerConfig::Embedded(_) => panic!("expected the external server"),
    }
}

#[test]
fn limits_are_checked() {
    assert!(serve_args(&["--min-ready", "5", "--max-total", "2"])
        .into_config()
        .is_err());
    assert!(serve_args(&["--max-total", "0"]).into_config().is_err());
    assert!(serve_args(&["--clone-concurrency", "0"])
        .into_config()
        .is_err());
    assert!(serve_args(&["--default-ttl", "0"]).into_config().is_err());
    assert!(serve_args(&["--pg-setting", "bad key=1"])
        .into_config()
        .is_err());
}
