//! Who runs a migration command, and what its error says when that user could not reach
//! something (issue 42).
//!
//! When pglease is root, a command from the operator's configuration runs as the owner of
//! its working directory if that user alone controls the directory, its parents and the
//! files the command names (`child_user::control`): root for a root-owned checkout, who
//! could change its scripts anyway. It gets that user's `HOME` (or a private one made for
//! the run, 0700, removed after it, where the user has none of its own) and the daemon's
//! `PATH`, and otherwise the child user's clean environment. Every other command — one a
//! caller registered over HTTP, a dump's restore, an operator's command in a directory
//! others may write — runs as the child user, as before. This file does not run the
//! command; `command.rs` does.

use std::path::{Path, PathBuf};

use crate::child_user::control::{who_controls, CommandUser};
use crate::child_user::ChildUser;
use crate::config::{CommandOrigin, CommandSource};

/// The user a command runs as, why, and the home made for it (if one was).
pub(super) struct Runner {
    /// Who runs it (the child user, or the owner in the child user's launcher).
    pub user: ChildUser,
    /// Why this user, as a clause: "… because {why}".
    pub why: String,
    /// Whether it is the child user (and not the owner of the command's files).
    pub is_child_user: bool,
    /// Where the command runs: for the owner, the canonical path that was checked; for the
    /// child user, the configured one (as before). Relative paths in its output resolve
    /// against it too.
    pub workdir: PathBuf,
    /// A home made for this run, removed when the runner is dropped.
    _home: Option<TempHome>,
}

/// Why no user could be chosen to run a command.
#[derive(Debug, thiserror::Error)]
pub(super) enum RunnerError {
    /// The blocking check of who owns the working directory did not finish.
    #[error("checking who owns {}: {source}", workdir.display())]
    Check {
        /// The command's working directory.
        workdir: PathBuf,
        /// Why the check's task ended early.
        source: tokio::task::JoinError,
    },
    /// The owner has no home of its own, and none could be made for the run.
    #[error("cannot make a home for uid {uid} in {}: {source}", dir.display())]
    MakeHome {
        /// The owner.
        uid: u32,
        /// Where the home was to be made.
        dir: PathBuf,
        /// Why not.
        source: nix::Error,
    },
    /// The home made for the run could not be given to the owner.
    #[error("cannot give {} to uid {uid}: {source}", home.display())]
    GiveHome {
        /// The home made.
        home: PathBuf,
        /// The owner.
        uid: u32,
        /// Why not.
        source: std::io::Error,
    },
}

/// Chooses who runs `source` (see the module docs), checking the file system on a
/// blocking thread. Fails only when the owner needs a home and none can be made.
pub(super) async fn choose(
    child_user: &ChildUser,
    source: &CommandSource,
) -> Result<Runner, RunnerError> {
    let as_child = |why: String| Runner {
        user: child_user.clone(),
        why,
        is_child_user: true,
        workdir: source.workdir.clone(),
        _home: None,
    };
    if !child_user.switch {
        return Ok(as_child(
            "pglease is not root and runs every program as itself".into(),
        ));
    }
    if source.origin == CommandOrigin::Caller {
        return Ok(as_child(
            "a command a caller registered over HTTP (or a dump's restore) always runs as the child user (--child-user)".into(),
        ));
    }
    let (workdir, command) = (source.workdir.clone(), source.command.clone());
    // `lstat` of a whole checkout, and the user database: blocking I/O.
    let decided = tokio::task::spawn_blocking(move || match who_controls(&workdir, &command) {
        CommandUser::Owner {
            workdir,
            uid,
            gid,
            why,
        } => owner(uid, gid).map(|(user, home)| Ok((user, home, workdir, why))),
        CommandUser::ChildUser { reason } => Ok(Err(reason)),
    })
    .await
    .map_err(|source_error| RunnerError::Check {
        workdir: source.workdir.clone(),
        source: source_error,
    })??;
    let runner = match decided {
        Ok((user, home, workdir, why)) => Runner {
            user,
            why,
            is_child_user: false,
            workdir,
            _home: home,
        },
        Err(reason) => as_child(format!("no one user controls its files alone: {reason}")),
    };
    tracing::info!(
        workdir = %runner.workdir.display(),
        user = %runner.user.name,
        uid = runner.user.uid,
        why = %runner.why,
        "who runs the migration command"
    );
    Ok(runner)
}

/// The owner `uid` as a user to run commands as: its name, group and home from the user
/// database, or, for a uid it does not know, the working directory's group `gid` and a
/// home made for the run. A home it does not own (or that does not exist:
/// `/nonexistent`) is replaced by one made for the run, so that tools that keep caches
/// there (Maven's `~/.m2`) work.
fn owner(uid: u32, gid: u32) -> Result<(ChildUser, Option<TempHome>), RunnerError> {
    let known = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten();
    let (name, gid, home) = match known {
        Some(user) => (user.name, user.gid.as_raw(), Some(user.dir)),
        None => (uid.to_string(), gid, None),
    };
    let own_home = home.filter(|home| {
        std::fs::symlink_metadata(home)
            .is_ok_and(|meta| meta.is_dir() && std::os::unix::fs::MetadataExt::uid(&meta) == uid)
    });
    let (home, made) = match own_home {
        Some(home) => (home, None),
        None => {
            let made = TempHome::create(uid, gid)?;
            (made.path.clone(), Some(made))
        }
    };
    Ok((
        ChildUser {
            name,
            uid,
            gid,
            home,
            switch: true,
        },
        made,
    ))
}

/// A private home made for one run (0700, owned by the user), removed after it.
struct TempHome {
    path: PathBuf,
}

impl TempHome {
    fn create(uid: u32, gid: u32) -> Result<TempHome, RunnerError> {
        // mkdtemp makes a new directory of a name nobody could have taken, 0700.
        let template = std::env::temp_dir().join("pglease-home-XXXXXX");
        let path = nix::unistd::mkdtemp(&template).map_err(|source| RunnerError::MakeHome {
            uid,
            dir: template.clone(),
            source,
        })?;
        let home = TempHome { path };
        std::os::unix::fs::lchown(&home.path, Some(uid), Some(gid)).map_err(|source| {
            RunnerError::GiveHome {
                home: home.path.clone(),
                uid,
                source,
            }
        })?;
        Ok(home)
    }
}

impl Drop for TempHome {
    fn drop(&mut self) {
        // remove_dir_all does not follow links the user may have left in it.
        if let Err(error) = std::fs::remove_dir_all(&self.path) {
            tracing::warn!(path = %self.path.display(), %error, "could not remove a command's temporary home");
        }
    }
}

impl Runner {
    /// What to change, for a command that failed with `code` (126: not executable, 127:
    /// not found), whose output (`tail`) says "Permission denied", or names a `HOME` that
    /// does not exist (Maven's `Could not create local repository at /nonexistent/.m2`):
    /// which user it ran as and why, which path that user could not reach, and what would
    /// let it. None for another failure, where the user is not the likely cause.
    pub(super) fn recipe(&self, code: Option<i32>, tail: &[String]) -> Option<String> {
        let denied = tail
            .iter()
            .rev()
            .find(|line| line.contains("Permission denied"));
        let home = self.user.home.to_string_lossy();
        let homeless =
            !self.user.home.exists() && tail.iter().any(|line| line.contains(home.as_ref()));
        if denied.is_none() && !homeless && !matches!(code, Some(126 | 127)) {
            return None;
        }
        let mut text = format!("it ran as {} because {}", self.user.describe(), self.why);
        let what = denied.and_then(|line| unreachable_path(line));
        if let Some(what) = &what {
            text.push_str(&format!("; {} could not reach {what}", self.user.name));
            if let Some((closed, mode)) = self.closed_on_the_way(what) {
                text.push_str(&format!(
                    " ({} is closed to it: mode {mode:04o})",
                    closed.display()
                ));
            }
        }
        if homeless {
            text.push_str(&format!(
                "; its HOME, {home}, does not exist (the user database's)"
            ));
        }
        // Where a program was found but may not run, the shell says 127 too.
        if code == Some(127) && denied.is_none() {
            text.push_str(&format!(
                "; a program was not found in the PATH it ran with ({})",
                std::env::var("PATH").unwrap_or_default()
            ));
        }
        let reach = match (&what, homeless) {
            (Some(what), _) => what.as_str(),
            (None, true) => "a home directory",
            (None, false) => "what it needs",
        };
        if self.is_child_user {
            text.push_str(&format!(
                ". Run it from a checkout no other user can write (it then runs as the checkout's owner), make {reach} reachable by {}, or choose another user with --child-user",
                self.user.name
            ));
        } else {
            text.push_str(&format!(
                ". Make {reach} reachable by {}, or install the tool where that user can run it",
                self.user.name
            ));
        }
        Some(text)
    }

    /// The first directory on the way to `what` (a path, or a program looked up in the
    /// daemon's `PATH`) that this user may not enter, with its mode.
    fn closed_on_the_way(&self, what: &str) -> Option<(PathBuf, u32)> {
        let path = if what.contains('/') {
            self.workdir.join(what)
        } else {
            std::env::var_os("PATH")
                .map(|path| {
                    std::env::split_paths(&path)
                        .map(|dir| dir.join(what))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
                .into_iter()
                .find(|candidate| candidate.exists())?
        };
        first_closed(&path, self.user.uid, self.user.gid)
    }
}

/// The first directory from `/` down to `path`'s parent that `uid`/`gid` (no
/// supplementary groups) may not search, with its permission bits.
fn first_closed(path: &Path, uid: u32, gid: u32) -> Option<(PathBuf, u32)> {
    use std::os::unix::fs::MetadataExt;
    if uid == 0 {
        return None;
    }
    let parents: Vec<&Path> = path.ancestors().skip(1).collect();
    parents.into_iter().rev().find_map(|dir| {
        let meta = std::fs::metadata(dir).ok()?;
        let mode = meta.mode() & 0o7777;
        let bit = if meta.uid() == uid {
            0o100
        } else if meta.gid() == gid {
            0o010
        } else {
            0o001
        };
        (mode & bit == 0).then(|| (dir.to_path_buf(), mode))
    })
}

/// The path or program a "Permission denied" line names: a quoted path if it has one
/// (`can't open file '/x/manage.py': [Errno 13]`), else the last part before the message
/// that is not a line number (`sh: 1: python: Permission denied`,
/// `/nonexistent/.m2 (Permission denied)`).
fn unreachable_path(line: &str) -> Option<String> {
    let before = &line[..line.find("Permission denied")?];
    // A quoted path: the last piece between quotes that starts like a path and has no
    // blank (an apostrophe, as in "can't", also splits).
    let quoted = before
        .split(['\'', '"', '\u{2018}', '\u{2019}'])
        .rfind(|piece| {
            (piece.starts_with('/') || piece.starts_with("./"))
                && !piece.contains(char::is_whitespace)
        });
    if let Some(quoted) = quoted {
        return Some(quoted.to_owned());
    }
    before
        .trim_end_matches([':', ' ', '('])
        .rsplit(": ")
        .map(str::trim)
        .find(|part| {
            !part.is_empty() && !part.starts_with("[Errno") && part.parse::<u64>().is_err()
        })
        .map(|part| part.rsplit(' ').next().unwrap_or(part).to_owned())
}

#[cfg(test)]
mod tests;
