//! Records the commit the binary is built from, for `pglease --version`: the
//! `PGLEASE_COMMIT` environment variable when set (a build from an archive, or the
//! container image, neither of which has a git directory); in a crate from a registry
//! (`cargo install pglease`), the commit `cargo package` wrote into `.cargo_vcs_info.json`;
//! else `git rev-parse --short=12 HEAD`; else "unknown".
//!
//! A packaged crate never asks git: the repository around it, if any, is not its own (a
//! home directory kept in git around `~/.cargo/registry`, or the checkout whose `target/`
//! holds the crate that `cargo package` verifies).

use std::path::Path;
use std::process::Command;

/// The commit's length in `--version`.
const SHORT: usize = 12;

fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    if !output.status.success() {
        return None;
    }
    Some(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// The `"sha1"` of `.cargo_vcs_info.json` (`{"git": {"sha1": "…", …}, …}`), read without
/// a JSON parser: a build script's dependencies would be built for every build.
fn packaged_commit(text: &str) -> Option<String> {
    let after_key = &text[text.find("\"sha1\"")? + "\"sha1\"".len()..];
    let value = after_key.trim_start().strip_prefix(':')?.trim_start();
    let hex: String = value
        .strip_prefix('"')?
        .chars()
        .take_while(char::is_ascii_hexdigit)
        .collect();
    (hex.len() >= SHORT).then(|| hex[..SHORT].to_owned())
}

/// Asks git for the commit, and tells cargo to run this script again when it moves.
fn checkout_commit() -> Option<String> {
    // A commit or a checkout moves HEAD or the branch it names. Only paths that exist are
    // watched (a worktree's git directory is elsewhere; an archive has none): cargo runs
    // a script again at every build while a watched path is missing.
    // A linked worktree keeps its HEAD in its own git directory and the branches in the
    // common one.
    let dirs = [
        git(&["rev-parse", "--git-dir"]),
        git(&["rev-parse", "--git-common-dir"]),
    ];
    for dir in dirs.iter().flatten() {
        for name in ["HEAD", "refs/heads", "packed-refs"] {
            let path = Path::new(dir).join(name);
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
    git(&["rev-parse", &format!("--short={SHORT}"), "HEAD"])
}

fn main() {
    println!("cargo:rerun-if-env-changed=PGLEASE_COMMIT");
    println!("cargo:rerun-if-changed=build.rs");
    let from_env = std::env::var("PGLEASE_COMMIT")
        .ok()
        .filter(|commit| !commit.is_empty());
    let commit = match from_env {
        Some(commit) => Some(commit),
        None => match std::fs::read_to_string(".cargo_vcs_info.json") {
            Ok(text) => packaged_commit(&text),
            Err(_) => checkout_commit(),
        },
    };
    let commit = commit.unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=PGLEASE_COMMIT={commit}");
}
