//! Records the commit the binary is built from, for `pglease --version`: the
//! `PGLEASE_COMMIT` environment variable when set (a build from an archive, or the
//! container image, neither of which has a git directory), else `git rev-parse
//! --short=12 HEAD`, else "unknown".

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    if !output.status.success() {
        return None;
    }
    Some(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

fn main() {
    println!("cargo:rerun-if-env-changed=PGLEASE_COMMIT");
    println!("cargo:rerun-if-changed=build.rs");
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
    let commit = std::env::var("PGLEASE_COMMIT")
        .ok()
        .filter(|commit| !commit.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=PGLEASE_COMMIT={commit}");
}
