//! The OS user that runs initdb and postgres ([`RunAs`]), resolved once at preparation
//! (root hands the server to `postgres` or `nobody`; anyone else runs it as themselves),
//! and giving it the directories we make for it, privately.
//!
//! Separate from the instance directory because initdb, the databases' tmpfs and every
//! start use it too. It uses only `util.rs`.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use nix::unistd::{geteuid, User};
use tracing::warn;

use super::util::io_error;
use crate::error::StartError;

/// The OS user that runs initdb and postgres.
#[derive(Debug, Clone)]
pub(crate) struct RunAs {
    /// User name, for logs.
    pub name: String,
    /// Its uid.
    pub uid: u32,
    /// Its primary gid.
    pub gid: u32,
    /// Whether the children switch to this user (the daemon is root) and files we create
    /// are chowned to it.
    pub switch: bool,
}

impl RunAs {
    /// When root: `configured`, else `postgres` if that user exists, else `nobody`.
    /// Otherwise the current user, since only root can switch.
    pub fn resolve(configured: Option<&str>) -> Result<RunAs, StartError> {
        let euid = geteuid();
        if !euid.is_root() {
            let name = User::from_uid(euid)
                .ok()
                .flatten()
                .map(|user| user.name)
                .unwrap_or_else(|| euid.to_string());
            if let Some(wanted) = configured.filter(|wanted| *wanted != name) {
                warn!(
                    pg_user = wanted,
                    running_as = %name,
                    "pg_user is ignored: only root can run postgres as another user"
                );
            }
            return Ok(RunAs {
                name,
                uid: euid.as_raw(),
                gid: nix::unistd::getegid().as_raw(),
                switch: false,
            });
        }
        let lookup = |name: &str| User::from_name(name).ok().flatten();
        let user = match configured {
            Some(name) => lookup(name).ok_or_else(|| StartError::UserNotFound {
                user: name.to_owned(),
            })?,
            None => lookup("postgres")
                .or_else(|| lookup("nobody"))
                .ok_or_else(|| StartError::UserNotFound {
                    user: "postgres".to_owned(),
                })?,
        };
        if user.uid.is_root() {
            // postgres would refuse to start; say so now rather than in the server log.
            return Err(StartError::UserNotFound {
                user: format!("{} (uid 0 cannot run postgres)", user.name),
            });
        }
        Ok(RunAs {
            name: user.name,
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
            switch: true,
        })
    }

    /// `(uid, gid)` for children and chown, when switching.
    pub fn owner(&self) -> Option<(u32, u32)> {
        self.switch.then_some((self.uid, self.gid))
    }

    /// Hands `path` to the server's user (a no-op when not root).
    pub fn chown(&self, path: &Path) -> Result<(), StartError> {
        match self.owner() {
            Some((uid, gid)) => std::os::unix::fs::chown(path, Some(uid), Some(gid))
                .map_err(|source| io_error("cannot chown", path, source)),
            None => Ok(()),
        }
    }
}

/// Gives the directory `path` mode 0700 and the server's user, through a handle opened
/// without following a link at its last component: `path` lies in the instance directory,
/// which that user owns, so a link there (left in a kept directory) must not lead root's
/// chmod and chown elsewhere.
pub(super) fn make_private_dir(path: &Path, run_as: &RunAs) -> Result<(), StartError> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = std::fs::File::options()
        .read(true)
        .custom_flags(nix::libc::O_DIRECTORY | nix::libc::O_NOFOLLOW)
        .open(path)
        .map_err(|source| match source.raw_os_error() {
            // O_DIRECTORY|O_NOFOLLOW on a link: ENOTDIR (or ELOOP).
            Some(nix::libc::ENOTDIR | nix::libc::ELOOP) => {
                io_error("refusing a link or a non-directory at", path, source)
            }
            _ => io_error("cannot open", path, source),
        })?;
    dir.set_permissions(std::fs::Permissions::from_mode(0o700))
        .map_err(|source| io_error("cannot chmod", path, source))?;
    match run_as.owner() {
        Some((uid, gid)) => std::os::unix::fs::fchown(&dir, Some(uid), Some(gid))
            .map_err(|source| io_error("cannot chown", path, source)),
        None => Ok(()),
    }
}
