//! Records the commit the binary is built from, for `pglease --version`: the
//! `PGLEASE_COMMIT` environment variable when set (a release build from an archive, which
//! has no git directory), else `git rev-parse --short=12 HEAD` with `-dirty` when the tree
//! has changes, else "unknown".

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
    // A new commit or checkout moves HEAD or the branch it names.
    for path in [
        ".git/HEAD",
        ".git/refs/heads",
        ".git/packed-refs",
        ".git/index",
    ] {
        println!("cargo:rerun-if-changed={path}");
    }
    let commit = std::env::var("PGLEASE_COMMIT")
        .ok()
        .filter(|commit| !commit.is_empty())
        .or_else(|| {
            let head = git(&["rev-parse", "--short=12", "HEAD"])?;
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|changes| !changes.is_empty());
            Some(if dirty { format!("{head}-dirty") } else { head })
        })
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=PGLEASE_COMMIT={commit}");
}
