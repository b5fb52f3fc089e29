//! Unpacking a snapshot's entries into a fresh data directory, as root, from a file that a
//! CI cache — which other jobs may write — handed us. Each entry is checked before it
//! touches the disk: only regular files and directories (a cluster holds nothing else:
//! pglease's own snapshots never contain links, devices or FIFOs), relative paths of plain
//! names (no `..`, no root), parents that are directories this unpacking made. Files are
//! created new (`O_CREAT|O_EXCL|O_NOFOLLOW`: never through something already there),
//! owner-only, and handed to the server's user through their open handle; directories
//! with `lchown`. So a hostile entry can neither write nor chown anything outside the data
//! directory, and the first one found fails the whole unpacking (the caller removes what
//! was made and starts a fresh cluster).

use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use tar::EntryType;

/// Unpacks every entry of `entries` but the manifest (`skip`) into `data_dir`, which must
/// exist and be empty, owned by `owner` when set. Returns the bytes unpacked.
pub(super) fn unpack<R: Read>(
    entries: tar::Entries<'_, R>,
    data_dir: &Path,
    skip: &Path,
    owner: Option<(u32, u32)>,
) -> Result<u64, String> {
    let mut bytes = 0u64;
    for entry in entries {
        let mut entry = entry.map_err(|e| format!("cannot read the archive: {e}"))?;
        let name = entry
            .path()
            .map_err(|e| format!("cannot read the archive: {e}"))?
            .into_owned();
        if name == skip {
            continue;
        }
        let relative = plain_path(&name)?;
        let target = data_dir.join(&relative);
        if let Some(parent) = relative.parent() {
            real_directory(data_dir, parent, &name)?;
        }
        match entry.header().entry_type() {
            EntryType::Directory => {
                std::fs::DirBuilder::new()
                    .mode(0o700)
                    .create(&target)
                    .map_err(|e| format!("cannot unpack {}: {e}", name.display()))?;
                if let Some((uid, gid)) = owner {
                    std::os::unix::fs::lchown(&target, Some(uid), Some(gid))
                        .map_err(|e| format!("cannot chown {}: {e}", target.display()))?;
                }
            }
            EntryType::Regular | EntryType::Continuous => {
                let mut file = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .custom_flags(nix::libc::O_NOFOLLOW)
                    .open(&target)
                    .map_err(|e| format!("cannot unpack {}: {e}", name.display()))?;
                bytes += std::io::copy(&mut entry, &mut file)
                    .map_err(|e| format!("cannot unpack {}: {e}", name.display()))?;
                if let Ok(mtime) = entry.header().mtime() {
                    // As the cluster had it; nothing depends on it, but a copy is faithful.
                    let _ = file.set_modified(UNIX_EPOCH + Duration::from_secs(mtime));
                }
                if let Some((uid, gid)) = owner {
                    std::os::unix::fs::fchown(&file, Some(uid), Some(gid))
                        .map_err(|e| format!("cannot chown {}: {e}", target.display()))?;
                }
            }
            other => {
                return Err(format!(
                    "the archive holds {} as {}: a snapshot holds only files and directories",
                    name.display(),
                    describe(other)
                ))
            }
        }
    }
    Ok(bytes)
}

/// `name` as a path of plain components (`.` dropped), or why not.
fn plain_path(name: &Path) -> Result<PathBuf, String> {
    let mut plain = PathBuf::new();
    for component in name.components() {
        match component {
            Component::Normal(part) => plain.push(part),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => {
                return Err(format!(
                    "the archive names {} by an absolute path",
                    name.display()
                ))
            }
            Component::ParentDir => {
                return Err(format!(
                    "the archive names {}, which leads out of the cluster",
                    name.display()
                ))
            }
        }
    }
    if plain.as_os_str().is_empty() {
        return Err(format!("the archive holds an entry named {:?}", name));
    }
    Ok(plain)
}

/// Every component of `parent` below `root` is a directory, not a link: defence in depth
/// (this unpacking makes no links, and makes files only where nothing was).
fn real_directory(root: &Path, parent: &Path, name: &Path) -> Result<(), String> {
    let mut path = root.to_path_buf();
    for component in parent.components() {
        path.push(component);
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.file_type().is_dir() => {}
            Ok(_) => {
                return Err(format!(
                    "the archive puts {} under {}, which is not a directory",
                    name.display(),
                    path.display()
                ))
            }
            Err(e) => {
                return Err(format!(
                    "the archive puts {} under {}, which it does not hold: {e}",
                    name.display(),
                    path.display()
                ))
            }
        }
    }
    Ok(())
}

/// "a symbolic link", for errors.
fn describe(kind: EntryType) -> String {
    match kind {
        EntryType::Symlink => "a symbolic link".into(),
        EntryType::Link => "a hard link".into(),
        EntryType::Char => "a character device".into(),
        EntryType::Block => "a block device".into(),
        EntryType::Fifo => "a FIFO".into(),
        other => format!("an entry of type {other:?}"),
    }
}
