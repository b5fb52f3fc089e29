//! The key that proves a snapshot is ours (`--snapshot-key-file`): 32 random bytes made at
//! the first start in the daemon's cache root (beside the initdb cache, never in the
//! snapshot directory, which a CI cache lets other jobs write), or a file the operator
//! shares among the runners of one cache.
//!
//! The file is opened once, never through a link, must be a regular file private to the
//! daemon's user (a key others can read lets them forge a snapshot, one they can write lets
//! them swap it), and is read bounded. Errors name the file and the reason, never its
//! content. This file does not seal or check snapshots (`seal.rs` does).

use std::fmt;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use hmac::{Hmac, KeyInit, Mac};
use rand::TryRng;
use sha2::Sha256;

/// The key file's name in the cache root when `--snapshot-key-file` is not given.
pub const DEFAULT_FILE_NAME: &str = "snapshot.key";
/// The bytes a key made here has.
const MADE_LENGTH: usize = 32;
/// A shorter key would be weaker than the tag it makes.
const MIN_LENGTH: usize = 32;
/// A key file is a few dozen bytes; anything much bigger is not one.
const MAX_LENGTH: u64 = 4096;

pub use crate::error::KeyError;

/// A snapshot key, read from its file. Its bytes are never printed.
#[derive(Clone)]
pub struct SnapshotKey {
    bytes: Vec<u8>,
    /// Where it was read from, for logs.
    path: PathBuf,
}

impl fmt::Debug for SnapshotKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SnapshotKey")
            .field("path", &self.path)
            .field("id", &hex::encode(self.id()))
            .finish_non_exhaustive()
    }
}

impl SnapshotKey {
    /// A key from its bytes (tests; a file is read by [`load_or_create`] or [`load`]).
    pub fn from_bytes(bytes: &[u8], path: &Path) -> SnapshotKey {
        SnapshotKey {
            bytes: bytes.to_vec(),
            path: path.to_path_buf(),
        }
    }

    /// The file it was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A fresh MAC under this key.
    pub(super) fn mac(&self) -> Hmac<Sha256> {
        // HMAC takes a key of any length: this cannot fail.
        <Hmac<Sha256> as KeyInit>::new_from_slice(&self.bytes)
            .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"))
    }

    /// A short public name of the key, written beside each tag: it tells "made with another
    /// key" from "altered" in the log (an attacker can copy it, so it proves nothing).
    pub fn id(&self) -> [u8; 8] {
        let mut mac = self.mac();
        mac.update(b"pglease snapshot key id");
        let full = mac.finalize().into_bytes();
        let mut id = [0u8; 8];
        id.copy_from_slice(&full[..8]);
        id
    }
}

/// The key file in `cache_root` when none is configured.
pub fn default_path(cache_root: &Path) -> PathBuf {
    cache_root.join(DEFAULT_FILE_NAME)
}

/// The key in `path`, made first (32 random bytes, mode 0600, owned by this process' user)
/// when there is no file there.
pub fn load_or_create(path: &Path) -> Result<SnapshotKey, KeyError> {
    match load(path) {
        Err(KeyError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            create(path)?;
            load(path)
        }
        other => other,
    }
}

/// The key in `path`, which must exist.
pub fn load(path: &Path) -> Result<SnapshotKey, KeyError> {
    let io = |action, source| KeyError::Io {
        path: path.to_path_buf(),
        action,
        source,
    };
    // O_NONBLOCK: a FIFO put there must not hang the start (it is refused below).
    let file = File::options()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(nix::libc::ELOOP) => KeyError::Link {
                path: path.to_path_buf(),
            },
            _ => io("open", e),
        })?;
    let meta = file.metadata().map_err(|e| io("stat", e))?;
    if !meta.is_file() {
        return Err(KeyError::NotRegular {
            path: path.to_path_buf(),
        });
    }
    if meta.mode() & 0o077 != 0 {
        return Err(KeyError::Exposed {
            path: path.to_path_buf(),
            mode: meta.mode() & 0o7777,
        });
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me && meta.uid() != 0 {
        return Err(KeyError::NotOurs {
            path: path.to_path_buf(),
            owner: meta.uid(),
            me,
        });
    }
    let mut bytes = Vec::with_capacity(64);
    // One byte over the limit tells a file that is too long from one exactly at it.
    file.take(MAX_LENGTH + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| io("read", e))?;
    let length = bytes.len() as u64;
    if bytes.len() < MIN_LENGTH || length > MAX_LENGTH {
        return Err(KeyError::BadLength {
            path: path.to_path_buf(),
            length: meta.len().max(length),
            min: MIN_LENGTH,
            max: MAX_LENGTH,
        });
    }
    Ok(SnapshotKey {
        bytes,
        path: path.to_path_buf(),
    })
}

/// Makes the key file: written whole under a temporary name (created with O_EXCL|O_NOFOLLOW,
/// mode 0600), then linked into place, which fails when the name exists. So two daemons
/// starting at once never read half a key: the second one's link fails and it reads the
/// first one's.
fn create(path: &Path) -> Result<(), KeyError> {
    let io = |action, source| KeyError::Io {
        path: path.to_path_buf(),
        action,
        source,
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| io("create its directory", e))?;
    let mut bytes = [0u8; MADE_LENGTH];
    // Straight from the kernel (getrandom), not a user-space generator.
    rand::rngs::SysRng
        .try_fill_bytes(&mut bytes)
        .map_err(|e| io("draw random bytes", std::io::Error::other(e.to_string())))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        path.file_name()
            .map_or_else(Default::default, |n| n.to_string_lossy()),
        super::super::util::random_hex(4)
    ));
    let written = File::options()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(&tmp)
        .and_then(|mut file| {
            file.write_all(&bytes)?;
            file.sync_all()
        })
        .map_err(|e| io("write", e))
        .and_then(|()| match std::fs::hard_link(&tmp, path) {
            // Another daemon made it first: its key is the one.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
            other => other.map_err(|e| io("create", e)),
        });
    let _ = std::fs::remove_file(&tmp);
    written?;
    tracing::info!(key = %path.display(), "made a snapshot key: snapshots written from now on carry its MAC");
    Ok(())
}

#[cfg(test)]
mod tests;
