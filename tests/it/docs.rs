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
