use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use pglease_pool::config::DumpSource;
use pglease_pool::{CloneStrategy, EmbeddedConfig, ServerConfig, Storage, TemplateSource};

use super::config::FrontListen;
use super::file::{found_file_is_ours, ConfigFrom};
use super::merge::parse_size;
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
fn lease_max_bytes_takes_a_size_or_off_from_the_flag_or_the_file() {
    use pglease_pool::LeaseMaxBytes;
    let limit = |args: &[&str]| {
        serve_args(args)
            .into_config()
            .map(|config| config.pool.limits.lease_max_bytes)
    };
    assert_eq!(limit(&[]), Ok(LeaseMaxBytes::Auto), "derived by default");
    assert_eq!(
        limit(&["--lease-max-bytes", "512MiB"]),
        Ok(LeaseMaxBytes::Bytes(512 << 20))
    );
    assert_eq!(limit(&["--lease-max-bytes", "off"]), Ok(LeaseMaxBytes::Off));
    assert_eq!(limit(&["--lease-max-bytes", "0"]), Ok(LeaseMaxBytes::Off));
    let error = limit(&["--lease-max-bytes", "lots"]).expect_err("not a size");
    assert!(error.starts_with("--lease-max-bytes: "), "{error}");
    let dir = std::env::temp_dir().join(format!("pglease-cli-lmb-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("pglease.toml");
    std::fs::write(&file, "lease_max_bytes = \"1G\"\n").expect("write");
    let path = file.to_str().expect("utf8");
    assert_eq!(
        limit(&["--config", path]),
        Ok(LeaseMaxBytes::Bytes(1 << 30))
    );
    assert_eq!(
        limit(&["--config", path, "--lease-max-bytes", "off"]),
        Ok(LeaseMaxBytes::Off),
        "the flag wins"
    );
    let _ = std::fs::remove_dir_all(&dir);
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

/// The on/off options the config file can set, as (flag, top-level key or `postgres.` key).
const SWITCHES: [(&str, &str); 5] = [
    ("prebuild", "prebuild"),
    ("lease-superuser", "lease_superuser"),
    ("verify-templates", "verify_templates"),
    ("allow-unsafe-on-disk", "postgres.allow_unsafe_on_disk"),
    ("keep-data", "postgres.keep_data"),
];

/// Writes a config file setting every switch to `value`; returns its path.
fn switches_file(name: &str, value: bool) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pglease-cli-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("pglease.toml");
    let mut top = String::new();
    let mut postgres = String::from("[postgres]\n");
    for (_, key) in SWITCHES {
        match key.strip_prefix("postgres.") {
            Some(key) => postgres.push_str(&format!("{key} = {value}\n")),
            None => top.push_str(&format!("{key} = {value}\n")),
        }
    }
    std::fs::write(&file, top + &postgres).expect("write");
    file
}

/// The five switches of a valid configuration, in `SWITCHES` order.
fn switches(config: &ServeConfig) -> [bool; 5] {
    let embedded = embedded(config);
    [
        config.pool.prebuild,
        config.pool.lease_superuser,
        config.pool.verify_templates,
        embedded.allow_unsafe_on_disk,
        embedded.keep_data,
    ]
}

fn switches_with(file: Option<&Path>, flags: &[String]) -> [bool; 5] {
    let mut args: Vec<&str> = Vec::new();
    if let Some(file) = file {
        args.extend(["--config", file.to_str().expect("utf8")]);
    }
    args.extend(flags.iter().map(String::as_str));
    switches(&serve_args(&args).into_config().expect("valid"))
}

#[test]
fn a_no_flag_turns_off_what_the_config_file_turns_on() {
    let file = switches_file("switches-on", true);
    assert_eq!(
        switches_with(Some(&file), &[]),
        [true; 5],
        "the file counts"
    );
    for (index, (flag, _)) in SWITCHES.iter().enumerate() {
        let mut expected = [true; 5];
        expected[index] = false;
        assert_eq!(
            switches_with(Some(&file), &[format!("--no-{flag}")]),
            expected,
            "--no-{flag} beats the file"
        );
    }
    let _ = std::fs::remove_dir_all(file.parent().expect("dir"));
}

#[test]
fn a_flag_turns_on_what_the_config_file_turns_off() {
    let file = switches_file("switches-off", false);
    assert_eq!(switches_with(Some(&file), &[]), [false; 5]);
    for (index, (flag, _)) in SWITCHES.iter().enumerate() {
        let mut expected = [false; 5];
        expected[index] = true;
        assert_eq!(
            switches_with(Some(&file), &[format!("--{flag}")]),
            expected,
            "--{flag} beats the file"
        );
    }
    let _ = std::fs::remove_dir_all(file.parent().expect("dir"));
}

#[test]
fn the_last_of_a_flag_and_its_no_form_wins() {
    let on = switches_file("switches-last-on", true);
    let off = switches_file("switches-last-off", false);
    for file in [None, Some(on.as_path()), Some(off.as_path())] {
        for (flag, _) in SWITCHES {
            let yes = format!("--{flag}");
            let no = format!("--no-{flag}");
            let last_on = switches_with(file, &[no.clone(), yes.clone()]);
            let last_off = switches_with(file, &[yes.clone(), no.clone()]);
            let repeated = switches_with(file, &[yes.clone(), no.clone(), yes.clone()]);
            let index = SWITCHES
                .iter()
                .position(|(f, _)| *f == flag)
                .expect("known");
            assert!(last_on[index], "{no} {yes} with {file:?}");
            assert!(!last_off[index], "{yes} {no} with {file:?}");
            assert!(repeated[index], "{yes} {no} {yes} with {file:?}");
        }
    }
    let _ = std::fs::remove_dir_all(on.parent().expect("dir"));
    let _ = std::fs::remove_dir_all(off.parent().expect("dir"));
}

#[test]
fn the_no_flags_are_explained_in_long_help_only() {
    use clap::CommandFactory;
    let mut command = Cli::command();
    let serve = command.find_subcommand_mut("serve").expect("serve");
    let short = serve.render_help().to_string();
    let long = serve.render_long_help().to_string();
    for (flag, key) in SWITCHES {
        let key = key.trim_start_matches("postgres.");
        assert!(short.contains(&format!("--{flag}")), "-h lists --{flag}");
        assert!(!short.contains(&format!("--no-{flag}")), "-h stays short");
        assert!(
            long.contains(&format!("--no-{flag}")),
            "--help lists --no-{flag}"
        );
        assert!(
            long.contains(&format!("Overrides {key} = true in the config file")),
            "--help explains --no-{flag}"
        );
    }
}

#[test]
fn the_token_can_come_from_a_file_and_only_from_one_place() {
    let dir = std::env::temp_dir().join(format!("pglease-token-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("token");
    std::fs::write(&file, "s3cret\n").expect("write");
    let path = file.to_str().expect("utf8");
    let config = serve_args(&["--listen", "0.0.0.0:5480", "--token-file", path])
        .into_config()
        .expect("a token file stands for --token");
    assert!(config.api.token.is_some());
    let both = serve_args(&["--token", "x", "--token-file", path]).into_config();
    assert!(both.is_err_and(|e| e.contains("not both")));
    std::fs::write(&file, " \n").expect("write");
    let empty = serve_args(&["--token-file", path]).into_config();
    assert!(empty.is_err_and(|e| e.contains("is empty")));
    let missing = dir.join("nope");
    let missing = serve_args(&["--token-file", missing.to_str().expect("utf8")]).into_config();
    assert!(missing.is_err_and(|e| e.contains("nope")));
}

#[test]
fn the_postgresql_front_is_on_loopback_by_default_and_beyond_loopback_needs_a_token() {
    let front = |args: &[&str]| serve_args(args).into_config().map(|c| c.front_listen);
    let at = |address: &str, chosen: bool| {
        Ok(Some(FrontListen {
            address: address.parse().expect("an address"),
            chosen,
        }))
    };
    // The default: loopback, beside the HTTP port; not chosen, so a taken port is skipped.
    assert_eq!(front(&[]), at("127.0.0.1:5481", false));
    assert_eq!(
        front(&["--listen", "127.0.0.1:0"]),
        at("127.0.0.1:0", false)
    );
    assert_eq!(front(&["--listen", "[::1]:7000"]), at("[::1]:7001", false));
    assert_eq!(
        front(&["--listen", "0.0.0.0:5480", "--token", "t"]),
        at("127.0.0.1:5481", false),
        "loopback, even when the API is not"
    );
    assert_eq!(front(&["--front-listen", "off"]), Ok(None));
    assert_eq!(
        front(&["--front-listen", "127.0.0.1:5433"]),
        at("127.0.0.1:5433", true)
    );
    let error = Cli::try_parse_from(["pglease", "serve", "--front-listen", "nowhere"])
        .expect_err("not an address")
        .to_string();
    assert!(
        error.contains("nowhere") && error.contains("off"),
        "{error}"
    );
    let config = serve_args(&[]).into_config().expect("valid");
    assert!(config.front.token.is_none());
    assert_eq!(config.front.default_wait, config.api.default_wait);
    let error = front(&["--front-listen", "0.0.0.0:5433"])
        .expect_err("any user and password, beyond loopback");
    assert!(
        error.contains("--front-listen 0.0.0.0:5433") && error.contains("--token"),
        "{error}"
    );
    let config = serve_args(&["--front-listen", "0.0.0.0:5433", "--token", "t"])
        .into_config()
        .expect("the token is the password");
    assert!(
        config.front.token.is_some(),
        "the API's token guards the front"
    );

    let dir = std::env::temp_dir().join(format!("pglease-front-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("pglease.toml");
    std::fs::write(&file, "front_listen = \"127.0.0.1:6543\"\n").expect("write");
    let path = file.to_str().expect("utf8");
    assert_eq!(
        front(&["--config", path]),
        at("127.0.0.1:6543", true),
        "the config file's key"
    );
    assert_eq!(
        front(&["--config", path, "--front-listen", "127.0.0.1:7000"]),
        at("127.0.0.1:7000", true),
        "the flag wins"
    );
    assert_eq!(
        front(&["--config", path, "--front-listen", "off"]),
        Ok(None),
        "the flag turns it off"
    );
    std::fs::write(&file, "front_listen = \"off\"\n").expect("write");
    assert_eq!(front(&["--config", path]), Ok(None), "off in the file");
    std::fs::write(&file, "front_listen = \"0.0.0.0:6543\"\n").expect("write");
    assert!(front(&["--config", path]).is_err());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn tls_at_the_front_is_off_by_default_self_signed_or_the_operators_files() {
    use pglease_front::TlsSource;
    let tls = |args: &[&str]| {
        serve_args(args)
            .into_config()
            .map(|c| c.front.tls.map(|tls| tls.source().clone()))
    };
    assert_eq!(tls(&[]), Ok(None), "off by default");
    assert_eq!(tls(&["--front-tls", "off"]), Ok(None));
    assert_eq!(
        tls(&["--front-tls", "self-signed"]),
        Ok(Some(TlsSource::SelfSigned))
    );
    assert_eq!(
        tls(&["--front-tls", "self-signed", "--front-listen", "off"]),
        Ok(None),
        "no front, nothing to encrypt"
    );
    // A certificate without its key, or beside a mode, is clap's to refuse.
    for args in [
        &["--front-tls-cert", "c.pem"][..],
        &["--front-tls-key", "k.pem"],
        &[
            "--front-tls",
            "self-signed",
            "--front-tls-cert",
            "c.pem",
            "--front-tls-key",
            "k.pem",
        ],
        &["--front-tls", "on"],
    ] {
        let argv = ["pglease", "serve"].iter().chain(args);
        assert!(Cli::try_parse_from(argv).is_err(), "{args:?}");
    }

    let dir = std::env::temp_dir().join(format!("pglease-front-tls-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let key = rcgen::KeyPair::generate().expect("a key");
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .expect("params")
        .self_signed(&key)
        .expect("a certificate");
    let (cert_file, key_file) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert_file, cert.pem()).expect("write");
    std::fs::write(&key_file, key.serialize_pem()).expect("write");
    let files = || {
        Ok(Some(TlsSource::Files {
            cert: cert_file.clone(),
            key: key_file.clone(),
        }))
    };
    let (cert_arg, key_arg) = (
        cert_file.to_str().expect("utf8"),
        key_file.to_str().expect("utf8"),
    );
    assert_eq!(
        tls(&["--front-tls-cert", cert_arg, "--front-tls-key", key_arg]),
        files()
    );
    let missing = dir.join("missing-key.pem");
    let error = tls(&[
        "--front-tls-cert",
        cert_arg,
        "--front-tls-key",
        missing.to_str().expect("utf8"),
    ])
    .expect_err("no key file");
    assert!(
        error.contains("missing-key.pem") && error.contains("cannot read"),
        "{error}"
    );

    // The config file's keys, relative to the file; the flags win.
    let file = dir.join("pglease.toml");
    let path = file.to_str().expect("utf8");
    std::fs::write(
        &file,
        "front_tls_cert = \"cert.pem\"\nfront_tls_key = \"key.pem\"\n",
    )
    .expect("write");
    assert_eq!(tls(&["--config", path]), files(), "relative to the file");
    assert_eq!(
        tls(&["--config", path, "--front-tls", "off"]),
        Ok(None),
        "the flag wins"
    );
    std::fs::write(&file, "front_tls = \"self-signed\"\n").expect("write");
    assert_eq!(tls(&["--config", path]), Ok(Some(TlsSource::SelfSigned)));
    for (text, expected) in [
        ("front_tls_cert = \"cert.pem\"\n", "go together"),
        (
            "front_tls = \"self-signed\"\nfront_tls_key = \"key.pem\"\n",
            "give one",
        ),
    ] {
        std::fs::write(&file, text).expect("write");
        let error = tls(&["--config", path]).expect_err(text);
        assert!(error.contains(expected), "{text}: {error}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn requiring_tls_at_the_front_needs_tls_there() {
    let required = |args: &[&str]| serve_args(args).into_config().map(|c| c.front.require_tls);
    assert_eq!(required(&[]), Ok(false), "off by default");
    assert_eq!(
        required(&["--front-tls", "self-signed", "--front-require-tls"]),
        Ok(true)
    );
    let error = required(&["--front-require-tls"]).expect_err("no TLS to require");
    assert!(error.contains("needs TLS at the front"), "{error}");
    assert!(required(&["--front-require-tls", "--front-tls", "off"]).is_err());
    assert_eq!(
        required(&["--front-require-tls", "--front-listen", "off"]),
        Ok(true),
        "no front, nothing to refuse"
    );
}

#[test]
fn superuser_templates_come_from_the_config_file() {
    let dir = std::env::temp_dir().join(format!("pglease-superuser-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("pglease.toml");
    std::fs::write(
        &file,
        "[templates.ext]\nsql = \"ext.sql\"\nsuperuser = true\n\n[templates.app]\nsql = \"app.sql\"\n",
    )
    .expect("write");
    let config = serve_args(&["--config", file.to_str().expect("utf8")])
        .into_config()
        .expect("valid");
    let source = |name: &str| {
        config
            .pool
            .templates
            .iter()
            .find(|t| t.name.as_str() == name)
            .map(|t| t.source.clone())
            .expect("template")
    };
    assert_eq!(
        source("ext"),
        TemplateSource::Superuser(Box::new(TemplateSource::SqlFile(dir.join("ext.sql"))))
    );
    assert_eq!(source("app"), TemplateSource::SqlFile(dir.join("app.sql")));
}

#[test]
fn the_initialize_timeout_is_a_flag() {
    let config = serve_args(&["--initialize-timeout", "5"])
        .into_config()
        .expect("valid");
    assert_eq!(
        config.pool.limits.initialize_timeout,
        Duration::from_secs(5)
    );
    assert!(serve_args(&["--initialize-timeout", "0"])
        .into_config()
        .is_err());
}

#[test]
fn the_command_line_definition_is_consistent() {
    // clap checks its definition (unique names, e.g. no argument named like --version)
    // only when a command is parsed; this checks every subcommand at once.
    <Cli as clap::CommandFactory>::command().debug_assert();
}

#[test]
fn the_postgres_version_comes_from_the_flag_or_the_config_file() {
    use pglease_binaries::VersionSpec;
    let embedded_version = |args: &[&str]| -> Result<Option<VersionSpec>, String> {
        serve_args(args)
            .into_config()
            .map(|config| embedded(&config).postgres_version)
    };
    assert_eq!(embedded_version(&[]), Ok(None));
    assert_eq!(
        embedded_version(&["--postgres-version", "17"]),
        Ok(Some(VersionSpec::Major(17)))
    );
    assert_eq!(
        embedded_version(&["--postgres-version", "16.4"]),
        Ok(Some(VersionSpec::Exact {
            major: 16,
            minor: 4
        }))
    );
    let error = embedded_version(&["--postgres-version", "12"]).expect_err("12");
    assert!(error.starts_with("--postgres-version: "), "{error}");
    assert!(error.contains("13 to 18"), "{error}");

    let dir = std::env::temp_dir().join(format!("pglease-cli-version-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("pglease.toml");
    let path = file.to_str().expect("utf8");
    let from_file = |table: &str, flags: &[&str]| {
        std::fs::write(&file, format!("[postgres]\n{table}\n")).expect("write");
        let mut args = vec!["--config", path];
        args.extend_from_slice(flags);
        embedded_version(&args)
    };
    assert_eq!(
        from_file("postgres_version = 15", &[]),
        Ok(Some(VersionSpec::Major(15)))
    );
    assert_eq!(
        from_file("postgres_version = \"17.6\"", &[]),
        Ok(Some(VersionSpec::Exact {
            major: 17,
            minor: 6
        }))
    );
    assert_eq!(
        from_file("postgres_version = 15", &["--postgres-version", "18"]),
        Ok(Some(VersionSpec::Major(18))),
        "the flag wins"
    );
    let error = from_file("postgres_version = 17.6", &[]).expect_err("a float");
    assert!(error.contains("\"17.6\""), "{error}");
    let error = from_file("postgres_version = \"11\"", &[]).expect_err("11");
    assert!(error.contains("13 to 18"), "{error}");

    std::fs::write(
        &file,
        "[postgres]\npostgres_repository = \"https://mirror.example/maven2\"\n",
    )
    .expect("write");
    let config = serve_args(&["--config", path])
        .into_config()
        .expect("valid");
    assert_eq!(
        embedded(&config).binaries_repository,
        "https://mirror.example/maven2"
    );
    let config = serve_args(&[]).into_config().expect("valid");
    assert_eq!(
        embedded(&config).binaries_repository,
        pglease_binaries::DEFAULT_REPOSITORY
    );
    let error = serve_args(&["--postgres-repository", "ftp://x"])
        .into_config()
        .expect_err("not http");
    assert!(error.contains("http(s) URL"), "{error}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_postgres_version_with_an_external_server_is_refused() {
    let error = serve_args(&[
        "--postgres-url",
        "postgres://postgres@127.0.0.1:5432/postgres",
        "--postgres-version",
        "17",
    ])
    .into_config()
    .expect_err("refused");
    assert!(error.contains("give one or the other"), "{error}");
}

#[test]
fn a_template_names_its_postgres_version_in_the_flag_or_the_config_file() {
    use pglease_binaries::VersionSpec;
    let versions = |config: &ServeConfig| -> Vec<(String, Option<VersionSpec>)> {
        config
            .pool
            .templates
            .iter()
            .map(|t| (t.name.to_string(), t.postgres_version))
            .collect()
    };
    let config = serve_args(&["--template", "old=empty", "--template", "new@18=empty"])
        .into_config()
        .expect("valid");
    assert_eq!(
        versions(&config),
        [
            ("old".to_owned(), None),
            ("new".to_owned(), Some(VersionSpec::Major(18)))
        ]
    );
    let error = serve_args(&["--template", "new@12=empty"])
        .into_config()
        .expect_err("12 is not supported");
    assert!(error.contains("13 to 18"), "{error}");
    let error = serve_args(&["--template", "default@16=empty"])
        .into_config()
        .expect_err("default is on every server");
    assert!(error.contains("exists on every server"), "{error}");

    let dir = std::env::temp_dir().join(format!("pglease-cli-tversion-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("pglease.toml");
    std::fs::write(
        &file,
        "[templates.app16]\npostgres_version = 16\n\n[templates.app17]\npostgres_version = \"17.6\"\n",
    )
    .expect("write");
    let config = serve_args(&["--config", file.to_str().expect("utf8")])
        .into_config()
        .expect("valid");
    let mut found = versions(&config);
    found.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        found,
        [
            ("app16".to_owned(), Some(VersionSpec::Major(16))),
            (
                "app17".to_owned(),
                Some(VersionSpec::Exact {
                    major: 17,
                    minor: 6
                })
            )
        ]
    );
    std::fs::write(&file, "[templates.app]\npostgres_version = 16.4\n").expect("write");
    let error = serve_args(&["--config", file.to_str().expect("utf8")])
        .into_config()
        .expect_err("a float");
    assert!(error.contains("template \"app\""), "{error}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_dump_template_comes_from_the_flag_or_the_config_file() {
    let config = serve_args(&["--template", "big=dump:/data/prod.dump"])
        .into_config()
        .expect("valid");
    assert_eq!(
        config.pool.templates[0].source,
        TemplateSource::Dump(DumpSource {
            path: "/data/prod.dump".into(),
            jobs: None,
            timeout: pglease_pool::config::DEFAULT_DUMP_TIMEOUT,
            allow_script: true,
        })
    );
    let dir = std::env::temp_dir().join(format!("pglease-cli-dump-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("pglease.toml");
    let path = file.to_str().expect("utf8");
    std::fs::write(
        &file,
        "[templates.big]\ndump = \"prod.dump\"\njobs = 4\ntimeout_secs = 7200\n",
    )
    .expect("write");
    let config = serve_args(&["--config", path])
        .into_config()
        .expect("valid");
    assert_eq!(
        config.pool.templates[0].source,
        TemplateSource::Dump(DumpSource {
            path: dir.join("prod.dump"),
            jobs: Some(4),
            timeout: Duration::from_secs(7200),
            allow_script: true,
        })
    );
    for (table, why) in [
        (
            "[templates.x]\nsql = \"a.sql\"\njobs = 2\n",
            "jobs goes with dump",
        ),
        (
            "[templates.x]\ndump = \"a.dump\"\nsql = \"a.sql\"\n",
            "one of",
        ),
        ("[templates.x]\ndump = \"a.dump\"\njobs = 0\n", "at least 1"),
    ] {
        std::fs::write(&file, table).expect("write");
        let error = serve_args(&["--config", path])
            .into_config()
            .expect_err(why);
        assert!(error.contains(why), "{table}: {error}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn storage_defaults_to_auto_and_each_way_is_named() {
    let storage = |args: &[&str]| embedded(&serve_args(args).into_config().expect("valid")).storage;
    assert_eq!(storage(&[]), Storage::Auto);
    assert_eq!(storage(&["--storage", "auto"]), Storage::Auto);
    assert_eq!(storage(&["--storage", "tmpfs"]), Storage::Tmpfs);
    assert_eq!(storage(&["--storage", "cow"]), Storage::Cow);
    // auto on an external server is no choice at all: accepted; cow is refused.
    serve_args(&["--storage", "auto", "--postgres-url", "postgres://x@h/db"])
        .into_config()
        .expect("auto has nothing to choose on an external server");
    let error = serve_args(&["--storage", "cow", "--postgres-url", "postgres://x@h/db"])
        .into_config()
        .expect_err("cow is the embedded server's");
    assert!(error.contains("--storage cow"), "{error}");
}

#[test]
fn the_integresql_role_needs_its_password_and_a_name_of_its_own() {
    let role = |args: &[&str]| {
        serve_args(args)
            .into_config()
            .map(|c| c.pool.integresql_role)
    };
    assert_eq!(role(&[]).expect("none"), None);
    let made = role(&[
        "--integresql-pg-user",
        "dbuser",
        "--integresql-pg-password",
        "dbpass",
    ])
    .expect("valid")
    .expect("a role");
    assert_eq!(
        (made.name.as_str(), made.password.as_str()),
        ("dbuser", "dbpass")
    );
    assert!(
        !format!("{made:?}").contains("dbpass"),
        "no password in logs"
    );
    let error = role(&["--integresql-pg-user", "dbuser"]).expect_err("no password");
    assert!(error.contains("--integresql-pg-password"), "{error}");
    let error = role(&["--integresql-pg-password", "dbpass"]).expect_err("no name");
    assert!(error.contains("--integresql-pg-user"), "{error}");
    for taken in ["postgres", "pglease_x", "pg_monitor", "Db-User", "1db"] {
        let error = role(&[
            "--integresql-pg-user",
            taken,
            "--integresql-pg-password",
            "dbpass",
        ])
        .expect_err(taken);
        assert!(error.contains("role name"), "{taken}: {error}");
    }
}

/// Compose's layout: `--integresql-pg-user` naming the `--postgres-url`'s own user is that
/// login, password from the URL (or given, and then the same), any name the server has.
#[test]
fn the_integresql_user_may_be_the_external_servers_own() {
    let role = |args: &[&str]| {
        serve_args(args)
            .into_config()
            .map(|c| (c.pool.integresql_role, c.api.integresql_server_login))
    };
    let url = "postgres://dbuser:dbpass@db:5432/postgres";
    let (pool, api) = role(&["--postgres-url", url, "--integresql-pg-user", "dbuser"])
        .expect("the URL's password");
    let pool = pool.expect("a role");
    assert_eq!(
        (
            pool.name.as_str(),
            pool.password.as_str(),
            pool.server_login
        ),
        ("dbuser", "dbpass", true)
    );
    assert_eq!(api, Some(pool));
    let (pool, _) = role(&[
        "--postgres-url",
        "postgres://postgres@db/postgres",
        "--integresql-pg-user",
        "postgres",
        "--integresql-pg-password",
        "secret",
    ])
    .expect("the server's user may be called postgres");
    assert!(pool.expect("a role").server_login);
    let error = role(&[
        "--postgres-url",
        url,
        "--integresql-pg-user",
        "dbuser",
        "--integresql-pg-password",
        "other",
    ])
    .expect_err("two passwords");
    assert!(error.contains("differs"), "{error}");
    let error = role(&[
        "--postgres-url",
        "postgres://postgres@db/postgres",
        "--integresql-pg-user",
        "postgres",
    ])
    .expect_err("no password anywhere");
    assert!(error.contains("--integresql-pg-password"), "{error}");
    // Another name on that server is a role pglease makes, as on its own server.
    let (pool, api) = role(&[
        "--postgres-url",
        url,
        "--integresql-pg-user",
        "suites",
        "--integresql-pg-password",
        "x",
    ])
    .expect("a role of its own");
    assert!(!pool.expect("a role").server_login);
    assert_eq!(api, None);
}

/// The environment variable an argument of a subcommand falls back to.
fn env_of(subcommand: &str, argument: &str) -> Option<String> {
    use clap::CommandFactory;
    let command = Cli::command();
    let subcommand = command.find_subcommand(subcommand).expect("a subcommand");
    let argument = subcommand
        .get_arguments()
        .find(|a| a.get_id() == argument)
        .expect("an argument");
    argument
        .get_env()
        .map(|name| name.to_string_lossy().into_owned())
}

#[test]
fn lease_and_run_take_the_template_from_pglease_template() {
    for subcommand in ["lease", "run"] {
        assert_eq!(
            env_of(subcommand, "template").as_deref(),
            Some("PGLEASE_TEMPLATE"),
            "{subcommand}"
        );
    }
    // serve's --template is NAME=SOURCE, another thing: the variable must not reach it.
    assert_eq!(env_of("serve", "templates"), None);
}

#[test]
fn serve_takes_the_config_file_from_pglease_config() {
    assert_eq!(env_of("serve", "config").as_deref(), Some("PGLEASE_CONFIG"));
}

#[test]
fn serve_finds_pglease_toml_in_its_working_directory() {
    let dir = std::env::temp_dir().join(format!("pglease-found-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    assert_eq!(ConfigFrom::resolve(None, Some(&dir)), ConfigFrom::Nowhere);
    assert_eq!(ConfigFrom::resolve(None, None), ConfigFrom::Nowhere);
    // A directory of that name is not a config file.
    std::fs::create_dir(dir.join("pglease.toml")).expect("dir");
    assert_eq!(ConfigFrom::resolve(None, Some(&dir)), ConfigFrom::Nowhere);
    std::fs::remove_dir(dir.join("pglease.toml")).expect("rmdir");
    std::fs::write(dir.join("pglease.toml"), "min_ready = 1\n").expect("write");
    assert_eq!(
        ConfigFrom::resolve(None, Some(&dir)),
        ConfigFrom::Found(dir.join("pglease.toml"))
    );
    // One named wins over the one found.
    let named = PathBuf::from("/etc/pglease/pglease.toml");
    assert_eq!(
        ConfigFrom::resolve(Some(named.clone()), Some(&dir)),
        ConfigFrom::Named(named)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn two_sources_in_one_template_are_refused_naming_every_kind() {
    let dir = std::env::temp_dir().join(format!("pglease-kinds-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("pglease.toml");
    for table in [
        "sql = \"a.sql\"\ncommand = \"true\"",
        "migrations = \"m\"\nsql = \"a.sql\"",
        "dump = \"a.dump\"\nsql = \"a.sql\"",
    ] {
        std::fs::write(&file, format!("[templates.app]\n{table}\n")).expect("write");
        let error = serve_args(&["--config", file.to_str().expect("utf8")])
            .into_config()
            .expect_err("two sources");
        for kind in ["migrations", "sql", "dump", "command"] {
            assert!(error.contains(kind), "{kind} in: {error}");
        }
        assert!(error.contains("empty database"), "{error}");
    }
    // The flag's usage lists the same kinds, and `empty`.
    let error = serve_args(&["--template", "app=tarball:/a"])
        .into_config()
        .expect_err("an unknown kind");
    for form in [
        "NAME=migrations:DIR",
        "NAME=sql:FILE",
        "NAME=dump:FILE",
        "NAME=command:CMD",
        "NAME=empty",
    ] {
        assert!(error.contains(form), "{form} in: {error}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn watch_flags_add_paths_to_a_command_template_and_nothing_else() {
    let config = serve_args(&[
        "--template",
        "app=command:dbmate migrate",
        "--watch",
        "app=db/migrations",
        "--watch",
        "app=/abs/schema.sql",
    ])
    .into_config()
    .expect("valid");
    let cwd = std::env::current_dir().expect("cwd");
    let app = config
        .pool
        .templates
        .iter()
        .find(|t| t.name.as_str() == "app")
        .expect("app");
    match &app.source {
        TemplateSource::Command(command) => assert_eq!(
            command.watch,
            vec![cwd.join("db/migrations"), PathBuf::from("/abs/schema.sql")]
        ),
        other => panic!("not a command: {other:?}"),
    }
    for (template, watch, why) in [
        ("app=command:true", "other=db", "no template \"other\""),
        ("app=empty", "app=db", "is not a command template"),
        ("app=command:true", "app=", "expected NAME=PATH"),
        ("app=command:true", "app", "expected NAME=PATH"),
    ] {
        let error = serve_args(&["--template", template, "--watch", watch])
            .into_config()
            .expect_err(watch);
        assert!(error.contains(why), "{watch}: {error}");
    }
}

#[test]
fn a_found_config_file_is_read_only_if_ours_and_nobody_elses_to_write() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("pglease-found-owner-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("pglease.toml");
    std::fs::write(&file, "min_ready = 1\n").expect("write");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    assert_eq!(found_file_is_ours(&file), Ok(()));
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let error = found_file_is_ours(&file).expect_err("writable by others");
    assert!(
        error.contains("others may write it") && error.contains("--config"),
        "{error}"
    );
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    if nix::unistd::geteuid().is_root() {
        // Someone else's file, as a shared directory holds.
        nix::unistd::chown(&file, Some(nix::unistd::Uid::from_raw(65534)), None).expect("chown");
        let error = found_file_is_ours(&file).expect_err("someone else's");
        assert!(error.contains("belongs to uid 65534"), "{error}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
