//! Docs that stay true: every `--flag` that README.md, docs/, deploy/ or a client's README
//! names is one the `pglease` command line has (any subcommand), a flag of the pytest
//! plugin, or a flag of another program those pages show, listed below with its program.
//! A renamed or removed flag then fails here instead of misleading a reader
//! (`docs/postgres-versions.md` once named `--port`, which `serve` never had).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use clap::CommandFactory;

use super::Cli;

/// Flags of other programs that the pages show, by program. A flag here must not be one
/// a reader could take for pglease's own; keep each next to the program it belongs to.
const OTHER_PROGRAMS: &[(&str, &[&str])] = &[
    (
        "cargo",
        &[
            "--release",
            "--workspace",
            "--locked",
            "--all-targets",
            "--bin",
            "--path",
            "--test",
            "--lib",
            "--dry-run",
        ],
    ),
    (
        "docker and docker compose",
        &[
            "--rm",
            "--tmpfs",
            "--security-opt",
            "--read-only",
            "--privileged",
            "--cap-add",
            "--cap-drop",
            "--device",
            "--user",
            "--build",
            "--build-arg",
            "--exit-code-from",
            "--abort-on-container-exit",
        ],
    ),
    (
        "Django's manage.py and pytest-django",
        &[
            "--noinput",
            "--parallel",
            "--testrunner",
            "--create-db",
            "--reuse-db",
            "--nomigrations",
        ],
    ),
    (
        "pg_dump, pg_restore and psql",
        &[
            "--no-owner",
            "--no-privileges",
            "--single-transaction",
            "--exit-on-error",
            "--bindir",
            "--jobs",
            "--verbose",
        ],
    ),
    ("initdb", &["--nosync"]),
    ("debootstrap", &["--variant"]),
    ("cp", &["--reflink"]),
    ("dbmate", &["--no-dump-schema"]),
    ("liquibase", &["--url", "--changelog-file"]),
    (
        "docs/configuration.md's pattern for a switch and its negation",
        &["--x", "--no-x"],
    ),
    ("pip", &["--no-deps", "--find-links"]),
    ("npm", &["--save-dev"]),
    ("apt-get", &["--no-install-recommends"]),
    ("tar", &["--strip-components"]),
    ("node", &["--experimental-vm-modules", "--test"]),
    ("systemd's journalctl and systemctl", &["--now"]),
    (
        "this repository's scripts (bench/run.sh, bench/soak.py, deploy/test.sh, release/build.sh)",
        &["--only", "--minutes", "--build-only", "--image", "--check"],
    ),
];

/// The pages a user reads.
fn pages() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages = vec![root.join("README.md"), root.join("deploy/README.md")];
    for dir in ["docs", "clients/go", "clients/python", "clients/node"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        pages.extend(
            entries
                .flatten()
                .map(|entry| entry.path())
                .filter(|path| path.extension().is_some_and(|e| e == "md")),
        );
    }
    pages.sort();
    pages
}

/// Every long flag of every subcommand, with its visible aliases.
fn pglease_flags() -> BTreeSet<String> {
    fn walk(command: &clap::Command, flags: &mut BTreeSet<String>) {
        for argument in command.get_arguments() {
            for long in argument
                .get_long_and_visible_aliases()
                .into_iter()
                .flatten()
            {
                flags.insert(format!("--{long}"));
            }
        }
        for sub in command.get_subcommands() {
            walk(sub, flags);
        }
    }
    let mut flags = BTreeSet::from(["--help".to_owned(), "--version".to_owned()]);
    walk(&Cli::command(), &mut flags);
    flags
}

/// The pytest plugin's options, as `clients/python` adds them (`addoption("--pglease-…"`).
fn pytest_plugin_flags() -> BTreeSet<String> {
    let plugin =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/python/pytest_pglease/plugin.py");
    let text = std::fs::read_to_string(&plugin).expect("read the pytest plugin");
    flags_in(&text)
        .into_iter()
        .filter(|flag| flag.starts_with("--pglease-"))
        .collect()
}

/// The `--flag` words of `text`: two dashes at the start of a word, then a letter, then
/// letters, digits and dashes.
fn flags_in(text: &str) -> BTreeSet<String> {
    let bytes = text.as_bytes();
    let mut flags = BTreeSet::new();
    let mut at = 0;
    while let Some(found) = text[at..].find("--") {
        let start = at + found;
        let word_start = start == 0 || {
            let before = bytes[start - 1];
            !(before.is_ascii_alphanumeric() || before == b'-' || before == b'_')
        };
        let mut end = start + 2;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'-') {
            end += 1;
        }
        let name = &text[start + 2..end];
        let plain = name.starts_with(|c: char| c.is_ascii_lowercase())
            && !name.ends_with('-')
            && name.bytes().all(|b| !b.is_ascii_uppercase());
        if word_start && plain {
            flags.insert(text[start..end].to_owned());
        }
        at = end.max(start + 2);
    }
    flags
}

#[test]
fn flags_in_the_docs_are_flags_pglease_has() {
    let mut known = pglease_flags();
    known.extend(pytest_plugin_flags());
    for (_, flags) in OTHER_PROGRAMS {
        known.extend(flags.iter().map(|flag| (*flag).to_owned()));
    }
    let mut unknown = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("read a page");
        for flag in flags_in(&text) {
            if !known.contains(&flag) {
                unknown.push(format!("{}: {flag}", page.display()));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "these pages name flags that no `pglease` subcommand has (nor the pytest plugin, nor \
         a program listed in src/cli/doc_flags.rs OTHER_PROGRAMS):\n{}",
        unknown.join("\n")
    );
}

#[test]
fn another_programs_flag_is_not_taken_for_pglease_s_own() {
    // A flag both pglease and another program have would let a stale page pass: keep the
    // list to flags pglease does not have.
    let ours = pglease_flags();
    for (program, flags) in OTHER_PROGRAMS {
        for flag in *flags {
            assert!(
                !ours.contains(*flag),
                "{flag} is listed as {program}'s, but pglease has it too: remove it from \
                 OTHER_PROGRAMS"
            );
        }
    }
}

#[test]
fn flags_in_finds_words_that_start_with_two_dashes() {
    let found =
        flags_in("run `pglease serve --pg-port 5433 --no-x`, not a--b, --Upper or -- alone; --end");
    let expected: BTreeSet<String> = ["--pg-port", "--no-x", "--end"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(found, expected);
}
