//! What a package installs beside the binary, generated from the command line itself:
//! completion scripts, man pages, and a `--version` that says what was built.

use std::process::Output;

use crate::support::{binary, scratch_dir};

fn run(args: &[&str]) -> Output {
    binary().args(args).output().expect("run pglease")
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "pglease failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Every subcommand a user types.
const COMMANDS: [&str; 12] = [
    "serve",
    "lease",
    "release",
    "renew",
    "status",
    "kept",
    "ready",
    "postgres",
    "snapshot",
    "run",
    "completions",
    "man",
];

#[test]
fn completions_know_every_command_in_each_shell() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = stdout(&run(&["completions", shell]));
        for command in COMMANDS {
            assert!(
                script.contains(command),
                "the {shell} completions do not know `{command}`"
            );
        }
        assert!(
            script.contains("postgres-url"),
            "the {shell} completions do not know serve's --postgres-url"
        );
    }
    let refused = run(&["completions", "tcsh"]);
    assert!(!refused.status.success(), "an unknown shell is refused");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("bash"),
        "the refusal lists the shells it knows"
    );
}

#[test]
fn man_pages_are_printed_and_written_one_per_command() {
    let page = stdout(&run(&["man"]));
    assert!(page.contains(".TH pglease 1"), "a roff page: {page:.200}");
    let dir = scratch_dir("man-pages");
    let out = dir.join("man1");
    let printed = stdout(&run(&["man", "--out-dir", &out.display().to_string()]));
    assert_eq!(printed.trim(), out.display().to_string());
    for command in COMMANDS {
        let page = out.join(format!("pglease-{command}.1"));
        let text = std::fs::read_to_string(&page)
            .unwrap_or_else(|e| panic!("{} was not written: {e}", page.display()));
        assert!(text.contains(&format!(".TH pglease-{command} 1")));
    }
    let serve = std::fs::read_to_string(out.join("pglease-serve.1")).expect("serve's page");
    assert!(
        serve.contains("postgres\\-url"),
        "serve's page documents its options"
    );
    assert!(out.join("pglease.1").exists());
}

#[test]
fn version_says_the_commit_and_the_majors_it_serves() {
    let short = stdout(&run(&["-V"]));
    assert_eq!(
        short.trim(),
        format!("pglease {}", env!("CARGO_PKG_VERSION"))
    );
    let long = stdout(&run(&["--version"]));
    assert!(
        long.contains("serves PostgreSQL 13–18 (default 18)"),
        "{long}"
    );
    let commit = long
        .split("(commit ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .unwrap_or_else(|| panic!("no commit in {long:?}"));
    let checkout = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".git");
    if checkout.exists() {
        assert!(
            commit.len() == 12 && commit.chars().all(|c| c.is_ascii_hexdigit()),
            "a built checkout names its commit: {commit:?}"
        );
    }
    // A subcommand's --version says the same, under the subcommand's name.
    assert_eq!(
        stdout(&run(&["serve", "--version"])),
        long.replacen("pglease", "pglease-serve", 1)
    );
}

/// Flags the docs name that belong to other programs (each with the program), not pglease.
const OTHER_PROGRAMS_FLAGS: [(&str, &str); 36] = [
    ("--all-targets", "cargo"),
    ("--changelog-file", "liquibase"),
    ("--check", "cargo fmt"),
    ("--dry-run", "cargo publish"),
    ("--exit-on-error", "pg_restore"),
    ("--find-links", "pip"),
    ("--image", "release/build.sh"),
    ("--jobs", "pg_restore"),
    ("--locked", "cargo install"),
    ("--minutes", "bench/soak.py"),
    ("--no-deps", "pip"),
    ("--no-dump-schema", "dbmate"),
    ("--no-owner", "pg_restore"),
    ("--no-privileges", "pg_restore"),
    (
        "--no-x",
        "configuration.md's pattern for every boolean flag",
    ),
    ("--noinput", "django's manage.py"),
    ("--nosync", "initdb"),
    ("--now", "systemctl"),
    ("--only", "bench/run.sh"),
    ("--parallel", "django's manage.py test"),
    ("--path", "cargo install"),
    ("--pglease-keep-failed", "the pytest plugin"),
    ("--pglease-start", "the pytest plugin"),
    ("--pglease-template", "the pytest plugin"),
    ("--reflink", "cp"),
    ("--release", "cargo"),
    ("--rm", "docker"),
    ("--save-dev", "npm"),
    ("--single-transaction", "pg_restore"),
    ("--strip-components", "tar"),
    ("--test", "cargo test"),
    ("--tmpfs", "docker run"),
    ("--url", "liquibase"),
    ("--verbose", "pg_restore"),
    ("--workspace", "cargo"),
    ("--x", "configuration.md's pattern for every boolean flag"),
];

/// The `--flags` in `text` (a flag is `--`, a letter, then letters, digits and dashes).
fn flags_in(text: &str) -> std::collections::BTreeSet<String> {
    let mut flags = std::collections::BTreeSet::new();
    for (start, _) in text.match_indices("--") {
        let rest = &text[start + 2..];
        if !rest.starts_with(|c: char| c.is_ascii_lowercase()) {
            continue;
        }
        // Not the tail of a longer run of dashes (a table rule, `---`).
        if start > 0 && text.as_bytes()[start - 1] == b'-' {
            continue;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
            .collect();
        flags.insert(format!("--{}", name.trim_end_matches('-')));
    }
    flags
}

/// Issue 43: docs stay true about the flags. Every `--flag` that docs/*.md or README.md
/// name is one of pglease's (in the `--help` of some command) or one of another program's
/// listed above; a doc naming a flag pglease does not have (`--port` for `--pg-port`)
/// fails here.
#[test]
fn every_flag_the_docs_name_exists() {
    let mut help = String::new();
    for command in [&[][..], &["postgres"][..], &["snapshot"][..]]
        .into_iter()
        .map(<[&str]>::to_vec)
        .chain(COMMANDS.iter().map(|command| vec![*command]))
    {
        let mut args = command.clone();
        args.push("--help");
        let text = stdout(&run(&args));
        // The subcommands of `postgres` and `snapshot` have flags of their own.
        if command.len() == 1 && ["postgres", "snapshot"].contains(&command[0]) {
            let subcommands: Vec<String> = text
                .lines()
                .skip_while(|line| !line.starts_with("Commands:"))
                .skip(1)
                .take_while(|line| line.starts_with("  "))
                .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
                .filter(|name| name != "help")
                .collect();
            for subcommand in subcommands {
                help.push_str(&stdout(&run(&[command[0], &subcommand, "--help"])));
            }
        }
        help.push_str(&text);
    }
    let known = flags_in(&help);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs: Vec<std::path::PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|entry| entry.expect("an entry of docs/").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.push(root.join("README.md"));
    let mut unknown = Vec::new();
    for doc in &docs {
        let text = std::fs::read_to_string(doc).expect("a doc");
        for flag in flags_in(&text) {
            let others = OTHER_PROGRAMS_FLAGS.iter().any(|(name, _)| *name == flag);
            if !known.contains(&flag) && !others {
                unknown.push(format!("{}: {flag}", doc.display()));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "the docs name flags no pglease command has (or add another program's to \
         OTHER_PROGRAMS_FLAGS):\n{}",
        unknown.join("\n")
    );
    // The test catches what it is for.
    assert!(!known.contains("--port"), "pglease has no --port");
    assert!(flags_in("run with --port 5432").contains("--port"));
}
