//! The OS user that every program pglease starts runs as — migration commands, `psql`,
//! `pg_restore` and their tools; postgres and initdb run as `--pg-user` instead — and whose
//! rights every template source is read with.
//!
//! The daemon may be root (to own and mount the server's files), and callers over HTTP name
//! files and send dumps. Nothing they name is opened with root's rights, and nothing they
//! send runs as root: children get this user's uid and gid, no supplementary groups and an
//! environment of only the variables listed in [`PASSED_ON`]; file reads run on a thread
//! whose file-system identity is this user's ([`ChildUser::read`]). The default user as root
//! is `nobody`, so a caller on loopback gets what any local user can read, and a child
//! cannot reach the server's private socket or data directory (they are the postgres
//! user's). When pglease is not root there is nobody to switch to: it is the current user.
//!
//! The one program that may run as another user is an operator's migration command, as the
//! owner who alone controls its files ([`control`] decides; `template/command/runner.rs`
//! launches it through [`ChildUser::command`] with that owner's identity).
//!
//! This module does not choose what runs; `template.rs` and `template/dump.rs` do.

use std::ffi::OsStr;
use std::path::PathBuf;

use nix::unistd::{geteuid, User};
use tracing::warn;

use crate::error::StartError;

pub(crate) mod control;

/// Variables of the daemon's environment a child gets (besides `HOME`, `USER`, `LOGNAME`
/// and what its caller sets): what finds programs and speaks the operator's language.
/// Nothing else passes: not the API token, not the daemon's own settings.
const PASSED_ON: &[&str] = &[
    "PATH",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "LC_MESSAGES",
    "TZ",
    "TMPDIR",
];

/// `PATH` for a child when the daemon has none.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Who children run as (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildUser {
    /// User name, for logs and errors.
    pub name: String,
    /// Its uid.
    pub uid: u32,
    /// Its primary gid.
    pub gid: u32,
    /// Its home directory (from the user database), as `HOME`.
    pub home: PathBuf,
    /// Whether to switch to it: the daemon is root.
    pub switch: bool,
}

impl ChildUser {
    /// When root: `configured`, else `nobody`. Otherwise the current user, since only
    /// root can switch. Root itself is refused.
    pub fn resolve(configured: Option<&str>) -> Result<ChildUser, StartError> {
        let euid = geteuid();
        if !euid.is_root() {
            let user = User::from_uid(euid).ok().flatten();
            let name = user
                .as_ref()
                .map(|u| u.name.clone())
                .unwrap_or_else(|| euid.to_string());
            if let Some(wanted) = configured.filter(|wanted| *wanted != name) {
                warn!(child_user = wanted, running_as = %name, "child_user is ignored: only root can run programs as another user");
            }
            return Ok(ChildUser {
                home: user.map(|u| u.dir).unwrap_or_else(|| PathBuf::from("/")),
                name,
                uid: euid.as_raw(),
                gid: nix::unistd::getegid().as_raw(),
                switch: false,
            });
        }
        let wanted = configured.unwrap_or("nobody");
        let user = User::from_name(wanted)
            .ok()
            .flatten()
            .ok_or_else(|| StartError::ChildUser {
                user: wanted.to_owned(),
                reason: "no such user".into(),
            })?;
        if user.uid.is_root() {
            return Err(StartError::ChildUser {
                user: wanted.to_owned(),
                reason: "it is root (uid 0), which is what it exists to avoid".into(),
            });
        }
        Ok(ChildUser {
            name: user.name,
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
            home: user.dir,
            switch: true,
        })
    }

    /// "user nobody (uid 65534)", for errors that a missing right may explain.
    pub fn describe(&self) -> String {
        format!("user {} (uid {})", self.name, self.uid)
    }

    /// `error`'s words with who read, where a missing right may explain it: a source a
    /// caller can read may still be closed to this user (a private home directory, a 0700
    /// dump).
    pub fn explain(&self, error: impl std::fmt::Display) -> String {
        let message = error.to_string();
        if self.switch && message.contains("Permission denied") {
            format!(
                "{message} (template sources are read as {}: make them readable by that user, or choose another with --child-user)",
                self.describe()
            )
        } else {
            message
        }
    }

    /// A command for `program` that runs as this user, with no supplementary groups and a
    /// clean environment (see [`PASSED_ON`]); the caller adds its own variables.
    pub fn command(&self, program: impl AsRef<OsStr>) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(program);
        command.env_clear();
        for name in PASSED_ON {
            if let Some(value) = std::env::var_os(name) {
                command.env(name, value);
            }
        }
        if std::env::var_os("PATH").is_none() {
            command.env("PATH", DEFAULT_PATH);
        }
        command
            .env("HOME", &self.home)
            .env("USER", &self.name)
            .env("LOGNAME", &self.name);
        if self.switch {
            // std clears the supplementary groups (setgroups(0)) when it switches uid as
            // root, then sets gid and uid, all in the child before exec.
            command.uid(self.uid).gid(self.gid);
        }
        command
    }

    /// Runs `work` — file I/O on paths a caller named — on a new thread whose file-system
    /// identity is this user's, and returns its result: what this user cannot read or
    /// traverse fails there with `EACCES`, whatever the daemon itself may do. The thread
    /// ends with `work`, so the identity never reaches another task; the rest of the
    /// process keeps root's.
    pub async fn read<T, F>(&self, work: F) -> Result<T, ReadAsError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (switch, uid, gid, who) = (self.switch, self.uid, self.gid, self.describe());
        std::thread::Builder::new()
            .name("pglease-read-as".into())
            .spawn(move || {
                let result = match switch.then(|| take_file_identity(uid, gid)) {
                    Some(Err(source)) => Err(ReadAsError::Identity { who, source }),
                    _ => Ok(work()),
                };
                let _ = tx.send(result);
            })
            .map_err(|source| ReadAsError::Thread { source })?;
        rx.await.map_err(|_| ReadAsError::ThreadDied)?
    }
}

/// Why [`ChildUser::read`] could not run its work (the work's own outcome is its result).
#[derive(Debug, thiserror::Error)]
pub enum ReadAsError {
    /// The reading thread could not take the user's file-system identity.
    #[error("cannot read as {who}: {source}")]
    Identity {
        /// The user ([`ChildUser::describe`]).
        who: String,
        /// Why.
        source: std::io::Error,
    },
    /// No thread could be started.
    #[error("cannot start a thread to read the template's sources: {source}")]
    Thread {
        /// Why.
        source: std::io::Error,
    },
    /// The thread ended without an answer (it panicked).
    #[error("the thread reading the template's sources died")]
    ThreadDied,
}

/// Makes the calling thread's file-system identity `uid`/`gid` with no supplementary
/// groups. Linux keeps credentials per thread; the raw system calls change this thread's
/// only (glibc's `setgroups` would change every thread's). Going from fsuid 0 to another
/// also drops the capabilities that bypass file permissions (`CAP_DAC_OVERRIDE`,
/// `CAP_DAC_READ_SEARCH`, `CAP_FOWNER`, …) from this thread's effective set.
#[allow(unsafe_code)]
fn take_file_identity(uid: u32, gid: u32) -> std::io::Result<()> {
    use nix::libc;
    // SAFETY: these system calls take plain integers (and a null list of length 0) and
    // change only the calling thread's credentials, which this thread owns until it ends.
    unsafe {
        if libc::syscall(libc::SYS_setgroups, 0usize, std::ptr::null::<libc::gid_t>()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        libc::syscall(libc::SYS_setfsgid, gid as libc::c_long);
        libc::syscall(libc::SYS_setfsuid, uid as libc::c_long);
        // Neither reports failure; an invalid id (-1) changes nothing and returns the
        // current one, which must now be ours.
        let fsgid = libc::syscall(libc::SYS_setfsgid, -1 as libc::c_long);
        let fsuid = libc::syscall(libc::SYS_setfsuid, -1 as libc::c_long);
        if fsuid != uid as libc::c_long || fsgid != gid as libc::c_long {
            return Err(std::io::Error::other(format!(
                "the file-system identity is still uid {fsuid} gid {fsgid}"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
