//! Small helpers the files of `postgres/` share: the [`StartError::Io`] they report, random
//! names for temporary directories, and writing a file anew without following a link.
//!
//! A leaf: it uses no other file of the module, so that any of them can use it.

use std::path::Path;

use crate::error::StartError;

/// `bytes` random bytes as lowercase hex.
pub(crate) fn random_hex(bytes: usize) -> String {
    let raw: Vec<u8> = (0..bytes).map(|_| rand::random::<u8>()).collect();
    hex::encode(raw)
}

/// A [`StartError::Io`].
pub(crate) fn io_error(action: &'static str, path: &Path, source: std::io::Error) -> StartError {
    StartError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `path` anew, owner-only and given to `owner`: whatever is there — a link a
/// hostile snapshot or a kept directory left, say — is removed, not written through.
pub(super) fn write_anew(
    path: &Path,
    bytes: &[u8],
    owner: Option<(u32, u32)>,
) -> Result<(), StartError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::symlink_metadata(path) {
        Ok(_) => std::fs::remove_file(path).map_err(|e| io_error("cannot replace", path, e))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_error("cannot stat", path, e)),
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| io_error("cannot create", path, e))?;
    file.write_all(bytes)
        .map_err(|e| io_error("cannot write", path, e))?;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::fchown(&file, Some(uid), Some(gid))
            .map_err(|e| io_error("cannot chown", path, e))?;
    }
    Ok(())
}
