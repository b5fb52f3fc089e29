//! A template's sources on disk: their stamp (sizes and mtimes, the cheap change check),
//! their fingerprint (SHA-256 of names and contents), the files of a migrations directory.
//! The one way a source file is opened is `open.rs`'s (a dump's format is read through it
//! too).
//!
//! Every function here does blocking file I/O on paths a caller may have named: run it
//! through [`ChildUser::read`](crate::child_user::ChildUser::read), so that it has that
//! user's rights and not the daemon's. A source file must be a regular file (a device or a
//! FIFO would never end, or block the open); SQL read into memory is bounded by
//! [`MAX_SQL_FILE_BYTES`]. Errors ([`SourceError`]) name the path and the reason, never the
//! contents.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use sha2::{Digest, Sha256};

use super::open::{kind_of, open_regular};
use super::source_error::{SourceError, MAX_SQL_FILE_BYTES};
use crate::config::{TemplateConfig, TemplateSource};
use crate::names::TemplateName;

/// Reads a SQL file whole: a regular file of at most [`MAX_SQL_FILE_BYTES`], in UTF-8.
pub fn read_sql(path: &Path) -> Result<String, SourceError> {
    let file = open_sql(path)?;
    let mut sql = String::new();
    // Bounded again while reading: the file may grow after the check.
    file.take(MAX_SQL_FILE_BYTES + 1)
        .read_to_string(&mut sql)
        .map_err(|e| read_error(path, e))?;
    if sql.len() as u64 > MAX_SQL_FILE_BYTES {
        return Err(SourceError::Grew {
            path: path.to_owned(),
        });
    }
    Ok(sql)
}

/// An I/O error without the bytes that caused it (std's UTF-8 error carries none; this
/// keeps it that way if that changes).
fn read_error(path: &Path, error: std::io::Error) -> SourceError {
    if error.kind() == std::io::ErrorKind::InvalidData {
        SourceError::NotUtf8 {
            path: path.to_owned(),
        }
    } else {
        SourceError::Unreadable {
            path: path.to_owned(),
            source: error,
        }
    }
}

/// A path a source names (`role`: "dump", "watched path", "workdir") that cannot be used.
fn named(role: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> SourceError {
    let path = path.to_owned();
    move |source| SourceError::Named { role, path, source }
}

/// Sizes and modification times of a source's files: cheap to take, and compared before
/// paying for a hash when checking whether sources changed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SourceStamp(Vec<(PathBuf, u64, Option<SystemTime>)>);

impl SourceStamp {
    /// The bytes of the source's files, from the sizes the stamp took (directories enter
    /// with none).
    pub fn bytes(&self) -> u64 {
        self.0.iter().map(|(_, len, _)| len).sum()
    }
}

/// Takes the stamp of a source. Unreadable paths enter as such, so their repair shows.
pub fn stamp(source: &TemplateSource) -> SourceStamp {
    if let TemplateSource::Superuser(inner) = source {
        return stamp(inner);
    }
    let mut entries = Vec::new();
    let mut add = |path: &Path| {
        let meta = std::fs::metadata(path).ok();
        entries.push((
            path.to_path_buf(),
            // A directory's own size says nothing (its mtime tells a changed listing), and
            // leaving it out lets the sizes add up to the source's bytes.
            meta.as_ref().filter(|m| !m.is_dir()).map_or(0, |m| m.len()),
            meta.and_then(|m| m.modified().ok()),
        ));
    };
    match source {
        TemplateSource::Empty => {}
        TemplateSource::SqlFile(path) => add(path),
        TemplateSource::Migrations(dir) => {
            // The directory's own mtime moves when a file is added, removed or renamed.
            add(dir);
            for file in migration_files(dir).unwrap_or_default() {
                add(&file);
            }
        }
        // The client's hash stands for its sources; there is nothing to stat.
        TemplateSource::Client | TemplateSource::Superuser(_) => {}
        TemplateSource::Command(command) => {
            for root in &command.watch {
                add(root);
                for path in walk(root).unwrap_or_default() {
                    add(&path);
                }
            }
        }
        TemplateSource::Dump(dump) => {
            add(&dump.path);
            for path in walk(&dump.path).unwrap_or_default() {
                add(&path);
            }
        }
    }
    SourceStamp(entries)
}

/// Every file and directory below `root` (not following symlinked directories), sorted.
/// A file `root` yields nothing: the caller has it already.
fn walk(root: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    if !std::fs::symlink_metadata(root)?.is_dir() {
        return Ok(found);
    }
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                pending.push(path.clone());
            }
            found.push(path);
        }
    }
    found.sort();
    Ok(found)
}

/// SHA-256 (hex) of a source and the postgres major version. File names and contents count;
/// for a migrations directory, only its `*.sql` files, in the order they are applied.
pub fn fingerprint(source: &TemplateSource, pg_major: u32) -> Result<String, SourceError> {
    let mut hasher = Sha256::new();
    hasher.update(format!("pglease-template-v1\0postgres-{pg_major}\0").as_bytes());
    match source {
        TemplateSource::Client => return Err(SourceError::ClientBuilt),
        // Applied with other rights, it is another version.
        TemplateSource::Superuser(inner) => {
            hasher.update(b"superuser\0");
            hasher.update(fingerprint(inner, pg_major)?.as_bytes());
        }
        TemplateSource::Empty => hasher.update(b"empty\0"),
        TemplateSource::SqlFile(path) => {
            hasher.update(b"sql\0");
            hash_file(&mut hasher, path)?;
        }
        TemplateSource::Migrations(dir) => {
            hasher.update(b"migrations\0");
            for path in migration_files(dir)? {
                hash_file(&mut hasher, &path)?;
            }
        }
        TemplateSource::Dump(dump) => {
            // The contents only: the same dump anywhere is the same version.
            hasher.update(b"dump\0");
            let meta = std::fs::metadata(&dump.path).map_err(named("dump", &dump.path))?;
            if meta.is_file() {
                hash_file(&mut hasher, &dump.path)?;
            } else {
                let files = walk(&dump.path).map_err(named("dump", &dump.path))?;
                for path in files.iter().filter(|p| p.is_file()) {
                    let relative = path.strip_prefix(&dump.path).unwrap_or(path);
                    hasher.update(format!("{}\0", relative.display()).as_bytes());
                    hash_file(&mut hasher, path)?;
                }
            }
        }
        TemplateSource::Command(command) => {
            hasher.update(format!("command\0{}\0", command.command).as_bytes());
            for root in &command.watch {
                hasher.update(format!("watch\0{}\0", root.display()).as_bytes());
                let meta = std::fs::metadata(root).map_err(named("watched path", root))?;
                if meta.is_file() {
                    hash_file(&mut hasher, root)?;
                    continue;
                }
                let files = walk(root).map_err(named("watched path", root))?;
                for path in files.iter().filter(|p| p.is_file()) {
                    // Relative names, so moving the checkout does not change the fingerprint.
                    let relative = path.strip_prefix(root).unwrap_or(path);
                    hasher.update(format!("{}\0", relative.display()).as_bytes());
                    hash_file(&mut hasher, path)?;
                }
            }
        }
    }
    Ok(hex::encode(hasher.finalize()))
}

/// The current fingerprint of every configured template whose sources can be read, by name
/// (file I/O: call it where blocking is allowed). A template in `known` (its sources' stamp
/// and the fingerprint hashed from them) keeps that fingerprint while the stamp has not
/// moved: a stat per file instead of hashing a dump of tens of GB again.
pub fn current_versions(
    templates: &[TemplateConfig],
    pg_major: u32,
    known: &HashMap<TemplateName, (SourceStamp, String)>,
) -> Vec<(TemplateName, String)> {
    templates
        .iter()
        .filter_map(|t| {
            let fingerprint = match known.get(&t.name) {
                Some((stamp, fingerprint)) if self::stamp(&t.source) == *stamp => {
                    fingerprint.clone()
                }
                _ => fingerprint(&t.source, pg_major).ok()?,
            };
            Some((t.name.clone(), fingerprint))
        })
        .collect()
}

/// Feeds everything `reader` gives to `hasher`, 64 KiB at a time; returns the bytes read.
/// (sha2 0.11's hashers are no `io::Write`, which `io::copy` needed.)
fn hash_stream(reader: &mut impl std::io::Read, hasher: &mut Sha256) -> std::io::Result<u64> {
    let mut buffer = vec![0u8; 64 * 1024];
    let mut copied = 0u64;
    loop {
        match reader.read(&mut buffer) {
            Ok(0) => return Ok(copied),
            Ok(n) => {
                hasher.update(&buffer[..n]);
                copied += n as u64;
            }
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
}

/// Hashes a file's name, length and contents, streamed: a dump of tens of GB is never held
/// in memory.
fn hash_file(hasher: &mut Sha256, path: &Path) -> Result<(), SourceError> {
    let unreadable = |source| SourceError::Unreadable {
        path: path.to_owned(),
        source,
    };
    let (mut file, len) = open_regular(path)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    hasher.update(format!("{name}\0{len}\0").as_bytes());
    let copied = hash_stream(&mut file, hasher).map_err(unreadable)?;
    if copied != len {
        return Err(SourceError::Changed {
            path: path.to_owned(),
            len,
            copied,
        });
    }
    Ok(())
}

/// The `*.sql` files of a directory in lexical (byte) order of their names. A `*.sql`
/// that is neither a file nor a directory (a FIFO, a device, a dangling link) is an error,
/// not a migration silently left out.
pub fn migration_files(dir: &Path) -> Result<Vec<PathBuf>, SourceError> {
    let unlisted = |source| SourceError::MigrationsDir {
        dir: dir.to_owned(),
        source,
    };
    let entries = std::fs::read_dir(dir).map_err(unlisted)?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(unlisted)?;
        let path = entry.path();
        if path.extension().is_none_or(|ext| ext != "sql") {
            continue;
        }
        match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() => files.push(path),
            Ok(meta) if meta.is_dir() => {}
            Ok(meta) => {
                return Err(SourceError::MigrationNotRegular {
                    kind: kind_of(&meta.file_type()),
                    path,
                })
            }
            Err(source) => return Err(SourceError::Unreadable { path, source }),
        }
    }
    files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    Ok(files)
}

/// Checks a source before it is registered, as its build will read it: every file it names
/// exists and is a regular file (a directory for migrations and a directory-format dump),
/// SQL files within [`MAX_SQL_FILE_BYTES`], a plain-SQL dump only where scripts may run,
/// and a command's working directory a directory. Run it with the child user's rights: what
/// that user cannot read is refused here, without a byte of it in the answer.
pub fn check(source: &TemplateSource) -> Result<(), SourceError> {
    match source {
        TemplateSource::Empty | TemplateSource::Client => Ok(()),
        TemplateSource::Superuser(inner) => check(inner),
        TemplateSource::SqlFile(path) => check_sql_file(path),
        TemplateSource::Migrations(dir) => {
            for file in migration_files(dir)? {
                check_sql_file(&file)?;
            }
            Ok(())
        }
        TemplateSource::Dump(dump) => {
            let format = super::dump::Format::of(&dump.path)?;
            super::dump::check_script(dump, format)
        }
        TemplateSource::Command(command) => {
            let meta =
                std::fs::metadata(&command.workdir).map_err(named("workdir", &command.workdir))?;
            if !meta.is_dir() {
                return Err(SourceError::WorkdirNotADirectory {
                    path: command.workdir.clone(),
                });
            }
            std::fs::read_dir(&command.workdir)
                .map(drop)
                .map_err(named("workdir", &command.workdir))
        }
    }
}

/// A SQL file as [`read_sql`] will want it, without reading it.
fn check_sql_file(path: &Path) -> Result<(), SourceError> {
    open_sql(path).map(drop)
}

/// Opens a SQL file: a regular file of at most [`MAX_SQL_FILE_BYTES`].
fn open_sql(path: &Path) -> Result<std::fs::File, SourceError> {
    let (file, len) = open_regular(path)?;
    if len > MAX_SQL_FILE_BYTES {
        return Err(SourceError::TooBig {
            path: path.to_owned(),
            len,
        });
    }
    Ok(file)
}
