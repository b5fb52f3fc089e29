//! The search for installed servers: against fake servers (shell scripts answering
//! `--version`) in fake places, and against this machine's own server. The latter is
//! found through `PGLEASE_PG_BIN_DIR`, else the normal discovery.

use super::*;
use crate::testing::{fake_server, write_executable, Scratch};

/// The env var naming the server's bin directory for tests.
const BIN_DIR_VAR: &str = "PGLEASE_PG_BIN_DIR";

/// Places with nothing installed, under `root`.
fn empty_places(root: &Path) -> Places {
    Places {
        pg_config: root.join("no-pg_config").into_os_string(),
        debian_root: root.join("debian"),
        path: Some(root.join("empty-path").into_os_string()),
    }
}

/// A fake `pg_config` printing `bin_dir`.
fn fake_pg_config(root: &Path, bin_dir: &Path) -> OsString {
    let program = root.join("tools").join("pg_config");
    write_executable(
        &program,
        &format!("#!/bin/sh\necho '{}'\n", bin_dir.display()),
    );
    program.into_os_string()
}

#[test]
fn bin_dir_discovery_accepts_a_server_dir_and_rejects_others() {
    let found = match std::env::var_os(BIN_DIR_VAR) {
        Some(dir) => PathBuf::from(dir),
        None => {
            find(&Places::system(), None, &mut Vec::new())
                .unwrap_or_else(|| panic!("no server installed (set {BIN_DIR_VAR})"))
                .bin_dir
        }
    };
    assert!(has_server(&found), "{}", found.display());
    // An explicit, valid directory is taken as is.
    let server = configured(&found, None).expect("explicit dir");
    assert_eq!(server.bin_dir, found);
    assert!(server.version.contains("PostgreSQL"), "{}", server.version);
    // With its own major asked for too.
    let own = VersionSpec::Major(server.major);
    assert_eq!(configured(&found, Some(own)).expect("same major"), server);
    // An explicit directory without a server is an error, not a reason to look elsewhere.
    let empty = Scratch::new("no-postgres");
    match configured(empty.path(), None) {
        Err(BinariesError::BinDirWithoutPostgres { bin_dir }) => assert_eq!(bin_dir, empty.path()),
        other => panic!("expected BinDirWithoutPostgres, got {other:?}"),
    }
}

#[test]
fn versioned_bin_dirs_sort_numerically() {
    let root = Scratch::new("debian-root");
    let make = |version: &str, server: bool| {
        let bin = root.path().join(version).join("bin");
        std::fs::create_dir_all(&bin).expect("mkdir");
        if server {
            fake_server(&bin, version);
        }
    };
    make("9.6", true);
    make("10", true);
    make("9", true);
    make("15", true);
    // Higher, but without a server: skipped.
    make("16", false);
    make("not-a-version", true);
    let dirs = debian_bin_dirs(root.path());
    let names: Vec<String> = dirs
        .iter()
        .map(|dir| dir.parent().expect("version dir").display().to_string())
        .collect();
    let expected: Vec<String> = ["15", "10", "9.6", "9"]
        .iter()
        .map(|v| root.path().join(v).display().to_string())
        .collect();
    assert_eq!(names, expected);
    assert!(debian_bin_dirs(&root.path().join("missing")).is_empty());
}

#[test]
fn a_configured_dir_of_another_version_is_an_error() {
    let root = Scratch::new("configured-mismatch");
    let bin = root.path().join("bin");
    fake_server(&bin, "16.4");
    let exact = |major, minor| Some(VersionSpec::Exact { major, minor });
    assert!(configured(&bin, Some(VersionSpec::Major(16))).is_ok());
    assert!(configured(&bin, exact(16, 4)).is_ok());
    for wanted in [Some(VersionSpec::Major(17)), exact(16, 5)] {
        match configured(&bin, wanted) {
            Err(e @ BinariesError::BinDirVersionMismatch { .. }) => {
                let message = e.to_string();
                assert!(message.contains("16.4"), "{message}");
                assert!(message.contains(&bin.display().to_string()), "{message}");
            }
            other => panic!("expected a mismatch for {wanted:?}, got {other:?}"),
        }
    }
}

#[test]
fn a_requested_major_is_looked_for_in_pg_config_debian_and_path_in_that_order() {
    let root = Scratch::new("requested");
    let mut places = empty_places(root.path());
    // pg_config names a 15, Debian has 16 and 17, PATH has a 17 too.
    let custom = root.path().join("custom-15").join("bin");
    fake_server(&custom, "15.3");
    places.pg_config = fake_pg_config(root.path(), &custom);
    fake_server(&places.debian_root.join("16").join("bin"), "16.4");
    fake_server(&places.debian_root.join("17").join("bin"), "17.5");
    let on_path = root.path().join("opt-17.6").join("bin");
    fake_server(&on_path, "17.6");
    places.path = Some(on_path.clone().into_os_string());

    let found = |wanted: &str| {
        let mut tried = Vec::new();
        let server = find(&places, Some(wanted.parse().expect("spec")), &mut tried);
        (server.map(|server| server.bin_dir), tried)
    };
    assert_eq!(found("15").0, Some(custom.clone()));
    assert_eq!(found("16").0, Some(places.debian_root.join("16/bin")));
    // Debian's 17 comes before PATH's; an exact minor takes the one that is that minor.
    assert_eq!(found("17").0, Some(places.debian_root.join("17/bin")));
    assert_eq!(found("17.6").0, Some(on_path.clone()));
    let (none, tried) = found("17.7");
    assert_eq!(none, None);
    let tried = tried.join("\n");
    assert!(tried.contains("PostgreSQL 15.3"), "{tried}");
    assert!(tried.contains("PostgreSQL 17.5"), "{tried}");
    assert!(tried.contains("PostgreSQL 17.6"), "{tried}");
    let (none, tried) = found("18");
    assert_eq!(none, None);
    assert!(
        tried.iter().any(|t| t.contains("18/bin: no postgres")),
        "{tried:?}"
    );

    // Without a version: the newest of them all.
    assert_eq!(
        find(&places, None, &mut Vec::new()).map(|s| s.bin_dir),
        Some(on_path)
    );
    let listed: Vec<String> = all(&places).iter().map(Server::short_version).collect();
    assert_eq!(listed, ["17.6", "17.5", "16.4", "15.3"]);
}

#[test]
fn nothing_installed_says_where_it_looked() {
    let root = Scratch::new("nothing");
    let places = empty_places(root.path());
    let mut tried = Vec::new();
    assert_eq!(find(&places, None, &mut tried), None);
    let tried = tried.join("\n");
    assert!(tried.contains("pg_config"), "{tried}");
    assert!(
        tried.contains(&places.debian_root.display().to_string()),
        "{tried}"
    );
    assert!(tried.contains("`postgres` is not on PATH"), "{tried}");
    assert!(all(&places).is_empty());
}

#[test]
fn postgres_on_path_resolves_symlinks_to_the_real_directory() {
    let root = Scratch::new("symlinked");
    let real = root.path().join("real").join("bin");
    fake_server(&real, "16.2");
    let links = root.path().join("links");
    std::fs::create_dir_all(&links).expect("mkdir");
    std::os::unix::fs::symlink(real.join("postgres"), links.join("postgres")).expect("symlink");
    let path = std::env::join_paths([root.path().join("nowhere"), links]).expect("join");
    let found = postgres_on_path(Some(&path)).expect("found");
    assert_eq!(found, std::fs::canonicalize(&real).expect("canonical"));
}
