//! Snapshots for cold runners (`--snapshot-dir`): a cleanly stopped cluster holding built
//! template databases, in one file a CI cache can keep between jobs.
//!
//! The format is physical, the whole cluster: a zstd-compressed tar whose first entry is
//! `pglease-snapshot.json` (the [`Manifest`]: postgres major, initdb settings, each
//! template's name and fingerprint), followed by the data directory's files. A cleanly
//! stopped cluster is exactly what postgres itself starts from, so adopting one is as safe
//! as a restart; a single database's files could not be moved into another cluster (their
//! transaction ids, WAL positions and role OIDs belong to the cluster they came from). A
//! logical dump would be portable, but restoring it costs about what building does for a
//! small schema (measured in `bench/`, scenario 11, and docs/templates.md).
//!
//! The file is authenticated, not inspected (`seal.rs`): an HMAC-SHA256 trailer under a key
//! kept outside the snapshot directory (`key.rs`) proves that this daemon, or a runner
//! sharing its key, wrote it. A file without a valid MAC (an older pglease's, altered, or
//! made with another key) is passed over before anything in it is parsed, and the cluster
//! is built fresh; the unpacking hashes again what it reads from the same descriptor, so a
//! file rewritten in place after the check is caught too.
//!
//! One file per postgres major: `pglease-pg<major>.pgsnap`. It is adopted at start instead
//! of the initdb cache's copy; the session's sweep then keeps the templates whose
//! fingerprint matches the current sources and drops the others (which are built again),
//! so a stale template is never used. This file knows nothing of templates beyond the
//! manifest's list.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::space;

mod error;
mod key;
mod seal;
mod unpack;

pub use error::{OpenError, Refusal, Step, UnpackError, WriteError};
pub use key::{
    default_path as default_key_path, load as load_key, load_or_create as load_or_create_key,
};
pub use key::{KeyError, SnapshotKey};
pub use seal::{SealError, Sealed, Sealing};

/// The snapshot files' extension.
pub const EXTENSION: &str = "pgsnap";

/// The archive's first entry.
const MANIFEST_ENTRY: &str = "pglease-snapshot.json";
/// This code's format; another one is ignored. 2: the file ends with a MAC (`seal.rs`).
const FORMAT: u32 = 2;
/// A manifest is a few hundred bytes; anything much bigger is not one.
const MANIFEST_LIMIT: u64 = 1 << 20;
/// zstd level 1: compression keeps up with the disk; higher levels cost seconds per GB
/// at save for a few percent.
const ZSTD_LEVEL: i32 = 1;

/// What a snapshot holds, as its first entry says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The format version (this code reads and writes 2; another is ignored).
    pub format: u32,
    /// The full server version it was made with, e.g. `15.14`.
    pub postgres_version: String,
    /// Its major: a data directory starts only under the same major.
    pub postgres_major: u32,
    /// initdb's arguments (encoding, locale, superuser name): they must match this run's.
    pub initdb_args: Vec<String>,
    /// The complete template databases it holds.
    pub templates: Vec<SnapshotTemplate>,
    /// When it was written, seconds since the Unix epoch.
    pub created_unix: u64,
    /// The pglease version that wrote it.
    pub pglease_version: String,
}

/// One template database in a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SnapshotTemplate {
    /// The template's name.
    pub name: String,
    /// The fingerprint of the sources it was built from.
    pub fingerprint: String,
    /// `pg_database_size` when saved.
    pub size_bytes: i64,
}

impl Manifest {
    /// A manifest for a snapshot made now.
    pub fn new(
        postgres_version: &str,
        initdb_args: &[String],
        mut templates: Vec<SnapshotTemplate>,
    ) -> Manifest {
        templates.sort();
        Manifest {
            format: FORMAT,
            postgres_version: version_number(postgres_version),
            postgres_major: major_of(postgres_version),
            initdb_args: initdb_args.to_vec(),
            templates,
            created_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            pglease_version: env!("CARGO_PKG_VERSION").to_owned(),
        }
    }

    /// Whether `other` holds the same template versions (sizes aside).
    pub fn same_versions(&self, other: &Manifest) -> bool {
        self.templates.len() == other.templates.len()
            && self
                .templates
                .iter()
                .zip(&other.templates)
                .all(|(a, b)| a.name == b.name && a.fingerprint == b.fingerprint)
    }

    /// `name@fingerprint…` of each template, for logs.
    pub fn describe(&self) -> String {
        let list: Vec<String> = self
            .templates
            .iter()
            .map(|t| {
                format!(
                    "{}@{}",
                    t.name,
                    t.fingerprint.get(..12).unwrap_or(&t.fingerprint)
                )
            })
            .collect();
        if list.is_empty() {
            "no templates".into()
        } else {
            list.join(", ")
        }
    }
}

/// A snapshot found for this server, its MAC checked.
#[derive(Debug, Clone)]
pub struct Found {
    /// The file.
    pub path: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
    /// The file, open since its MAC was checked: it is unpacked from this descriptor.
    pub sealed: Arc<Sealed>,
}

/// The file of `major`'s snapshot in `dir`.
pub fn path_for(dir: &Path, major: u32) -> PathBuf {
    dir.join(format!("pglease-pg{major}.{EXTENSION}"))
}

/// Major and minor of what `postgres --version` printed (`postgres (PostgreSQL) 15.18
/// (Debian …)`), or of a bare version number (`15.18`).
fn parse(version: &str) -> Option<(u32, Option<u32>)> {
    pglease_binaries::parse_server_version(version)
        .or_else(|| pglease_binaries::parse_version_number(version))
}

/// The major of a version (`postgres --version`'s line or `15.14` → 15; 0 when unreadable).
pub fn major_of(version: &str) -> u32 {
    parse(version).map_or(0, |(major, _)| major)
}

/// `15.18` (or `18` for a beta) of a version.
fn version_number(version: &str) -> String {
    match parse(version) {
        Some((major, Some(minor))) => format!("{major}.{minor}"),
        Some((major, None)) => major.to_string(),
        None => version.to_owned(),
    }
}

/// The snapshot for `version` with `initdb_args` in `dir`, when there is a usable one whose
/// MAC `key` proves. Every reason to pass one over is logged: a snapshot never fails a
/// start.
pub fn find(dir: &Path, version: &str, initdb_args: &[String], key: &SnapshotKey) -> Option<Found> {
    remove_abandoned(dir);
    let major = major_of(version);
    let path = path_for(dir, major);
    if !path.exists() {
        info!(
            snapshot = %path.display(),
            "no snapshot for postgres {major} yet; templates are built, and a snapshot is \
             written at a clean stop"
        );
        return None;
    }
    let found = match open(&path, key) {
        Ok(found) => found,
        Err(OpenError::Unauthenticated(error)) => {
            warn!(
                snapshot = %path.display(),
                key = %key.path().display(),
                "passing over the snapshot, none of it is used: {error}; the cluster is built \
                 fresh, and a clean stop writes an authenticated snapshot over it"
            );
            return None;
        }
        Err(error) => {
            warn!(snapshot = %path.display(), %error, "ignoring an unreadable snapshot; it is replaced at the next clean stop");
            return None;
        }
    };
    let manifest = &found.manifest;
    let refused = if manifest.format != FORMAT {
        Some(format!(
            "it is format {}, this pglease reads {FORMAT}",
            manifest.format
        ))
    } else if manifest.postgres_major != major {
        Some(format!(
            "it is of postgres {}, this server is {major}",
            manifest.postgres_major
        ))
    } else if manifest.initdb_args != initdb_args {
        Some(format!(
            "it was made with initdb {:?}, this server uses {:?} (encoding or locale changed)",
            manifest.initdb_args, initdb_args
        ))
    } else {
        None
    };
    if let Some(reason) = refused {
        warn!(snapshot = %path.display(), "ignoring the snapshot: {reason}; it is replaced at the next clean stop");
        return None;
    }
    Some(found)
}

/// A temporary file older than this was left by a writer that died (a save of even tens of
/// GB takes minutes); younger ones may be another daemon's save in progress.
const ABANDONED_AFTER: std::time::Duration = std::time::Duration::from_secs(3600);

/// Removes temporary files of saves that never finished (a daemon killed while writing).
fn remove_abandoned(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let temporary = name.starts_with('.') && name.contains(&format!(".{EXTENSION}.tmp-"));
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > ABANDONED_AFTER);
        if temporary && old && std::fs::remove_file(entry.path()).is_ok() {
            info!(file = %entry.path().display(), "removed the temporary file of a snapshot save that never finished");
        }
    }
}

/// Opens the snapshot file `path` once, checks its MAC under `key`, then reads its manifest
/// (the first entry) from the same descriptor.
pub fn open(path: &Path, key: &SnapshotKey) -> Result<Found, OpenError> {
    let file = open_file(path)?;
    let sealed = Sealed::verify(file, path, key).map_err(|error| match error {
        SealError::Io { path, source } => OpenError::Read { path, source },
        other => OpenError::Unauthenticated(other),
    })?;
    let manifest = read_manifest(&sealed, key)?;
    Ok(Found {
        path: path.to_path_buf(),
        manifest,
        sealed: Arc::new(sealed),
    })
}

/// Reads only the manifest (the first entry) of an authenticated file.
fn read_manifest(sealed: &Sealed, key: &SnapshotKey) -> Result<Manifest, OpenError> {
    let not_tar = |source| OpenError::NotTar { source };
    let mut archive =
        archive(sealed.reader(key)).map_err(|source| OpenError::NotZstd { source })?;
    let mut entries = archive.entries().map_err(not_tar)?;
    let first = entries.next().ok_or(OpenError::Empty)?.map_err(not_tar)?;
    let name = first.path().map_err(not_tar)?.into_owned();
    if name != Path::new(MANIFEST_ENTRY) {
        return Err(OpenError::NoManifest { first: name });
    }
    let mut text = String::new();
    first
        .take(MANIFEST_LIMIT)
        .read_to_string(&mut text)
        .map_err(|source| OpenError::ManifestUnreadable { source })?;
    serde_json::from_str(&text).map_err(|source| OpenError::ManifestInvalid { source })
}

/// The snapshot file `path`, opened once. It must be a regular file, not a link: pglease
/// renames a regular file into place, so a link or a FIFO there was put by someone else
/// (and a FIFO would hang the start).
fn open_file(path: &Path) -> Result<File, OpenError> {
    let path_buf = || path.to_path_buf();
    let file = File::options()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
        .open(path)
        .map_err(|source| match source.raw_os_error() {
            Some(nix::libc::ELOOP) => OpenError::Link { path: path_buf() },
            _ => OpenError::Open {
                path: path_buf(),
                source,
            },
        })?;
    let meta = file.metadata().map_err(|source| OpenError::Stat {
        path: path_buf(),
        source,
    })?;
    if !meta.is_file() {
        return Err(OpenError::NotAFile { path: path_buf() });
    }
    Ok(file)
}

/// The archive in an authenticated file's stream; an error when it is not zstd.
fn archive(
    reader: seal::Reader<'_>,
) -> std::io::Result<tar::Archive<zstd::stream::read::Decoder<'static, BufReader<seal::Reader<'_>>>>>
{
    Ok(tar::Archive::new(zstd::stream::read::Decoder::new(reader)?))
}

/// Unpacks the cluster of `snapshot` into `data_dir` (which must not exist, or be empty
/// but for `base` and `pg_notify`: tmpfs mounts, or links into `room`, the cluster's room in
/// `--databases-dir`, where `base/` then goes), owned by `owner` when set, mode 0700 as
/// postgres requires. Returns the bytes unpacked. An entry
/// that is not a plain file or directory inside the cluster fails it, naming the entry and
/// the reason (`unpack.rs`). On error the caller removes `data_dir`.
///
/// The file is read from the descriptor whose MAC [`open`] checked, hashing it again: when
/// the bytes differ from the checked ones (rewritten in place since), it fails after the
/// unpacking, and the caller throws the cluster away before postgres sees it.
pub fn extract(
    found: &Found,
    key: &SnapshotKey,
    data_dir: &Path,
    owner: Option<(u32, u32)>,
    room: Option<&Path>,
) -> Result<u64, UnpackError> {
    let started = Instant::now();
    let snapshot = &found.path;
    let mut archive =
        archive(found.sealed.reader(key)).map_err(|source| UnpackError::NotZstd { source })?;
    make_data_dir(data_dir)?;
    // Everything below happens through this handle, never by a path someone could swap.
    let root = unpack::open_directory(data_dir)?;
    // With the cluster's room in `--databases-dir`, `base` and `pg_notify` are links into
    // it (`room.rs`): their directories there are opened here, once, by their own paths
    // (never through the links), and what the archive puts under `base/` goes through that
    // handle (nothing goes under `pg_notify/`, `unpack.rs`).
    let open_part = |name: &str| {
        room.map(|room| unpack::open_directory(&room.join(name)))
            .transpose()
    };
    let base = open_part(space::DIR)?;
    let notify_queue = open_part(space::NOTIFY_QUEUE_DIR)?;
    let into = unpack::Into {
        root: &root,
        base: base.as_ref(),
        notify_queue: notify_queue.as_ref(),
        data_dir,
    };
    let entries = archive
        .entries()
        .map_err(|source| UnpackError::Archive { source })?;
    let bytes = unpack::unpack(entries, &into, Path::new(MANIFEST_ENTRY), owner)?;
    // The rest of the stream and the trailer, hashed: the tag must be the checked one.
    archive
        .into_inner()
        .finish()
        .into_inner()
        .finish()
        .map_err(UnpackError::Trailer)?;
    let complete = data_dir.join("PG_VERSION").is_file()
        && data_dir.join("global").join("pg_control").is_file();
    if !complete {
        return Err(UnpackError::Incomplete);
    }
    unpack::make_private(&root, data_dir, owner)?;
    info!(
        snapshot = %snapshot.display(),
        to = %data_dir.display(),
        bytes,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "unpacked the snapshot"
    );
    Ok(bytes)
}

/// Makes the data directory `data_dir`, unless it is there already.
fn make_data_dir(data_dir: &Path) -> Result<(), UnpackError> {
    match std::fs::create_dir(data_dir) {
        // Made already, empty, with its databases' tmpfs (`space.rs`): the handle the
        // caller opens on it refuses a link.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        result => result.map_err(|source| UnpackError::CreateDataDir {
            path: data_dir.to_path_buf(),
            source,
        }),
    }
}

/// Writes the stopped cluster at `cluster` with `manifest` as `path` (through a temporary
/// file renamed into place, so a reader never sees half a snapshot). Returns the file's
/// size.
/// The file ends with a MAC under `key` (`seal.rs`).
pub fn write(
    cluster: &Path,
    manifest: &Manifest,
    path: &Path,
    key: &SnapshotKey,
) -> Result<u64, WriteError> {
    let started = Instant::now();
    let dir = path.parent().unwrap_or(Path::new("."));
    // Private to the service user: a snapshot holds the whole cluster, password verifiers
    // included.
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| WriteError::CreateDir {
            path: dir.to_path_buf(),
            source,
        })?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        path.file_name()
            .map_or_else(Default::default, |n| n.to_string_lossy()),
        super::util::random_hex(4)
    ));
    let result = write_archive(cluster, manifest, &tmp, key).and_then(|()| {
        std::fs::rename(&tmp, path).map_err(|source| WriteError::Rename {
            path: tmp.clone(),
            source,
        })
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result?;
    let size = std::fs::metadata(path).map_or(0, |m| m.len());
    info!(
        snapshot = %path.display(),
        bytes = size,
        templates = %manifest.describe(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "wrote the snapshot"
    );
    Ok(size)
}

/// Writes the archive of `cluster`, `manifest` first, sealed under `key`, into the new file
/// `tmp`, and syncs it.
fn write_archive(
    cluster: &Path,
    manifest: &Manifest,
    tmp: &Path,
    key: &SnapshotKey,
) -> Result<(), WriteError> {
    let file = File::options()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(tmp)
        .map_err(|source| WriteError::CreateFile {
            path: tmp.to_path_buf(),
            source,
        })?;
    let write_failed = |source| WriteError::Write {
        path: tmp.to_path_buf(),
        source,
    };
    // Every byte of the stream goes through the MAC on its way to the file.
    let sealing = seal::Sealing::new(BufWriter::new(file), key);
    let compressor = |source| WriteError::Compressor { source };
    let mut encoder = zstd::stream::write::Encoder::new(sealing, ZSTD_LEVEL).map_err(compressor)?;
    // Both cores: a save runs while nothing else does (at stop).
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    encoder.multithread(threads).map_err(compressor)?;
    let mut builder = tar::Builder::new(encoder);
    builder.follow_symlinks(false);
    let json =
        serde_json::to_vec_pretty(manifest).map_err(|source| WriteError::Manifest { source })?;
    let mut header = tar::Header::new_gnu();
    header.set_size(json.len() as u64);
    header.set_mode(0o644);
    header.set_mtime(manifest.created_unix);
    header.set_cksum();
    builder
        .append_data(&mut header, MANIFEST_ENTRY, json.as_slice())
        .map_err(write_failed)?;
    append_cluster(&mut builder, cluster, manifest.created_unix)?;
    let encoder = builder.into_inner().map_err(write_failed)?;
    let mut writer = encoder
        .finish()
        .and_then(seal::Sealing::seal)
        .map_err(write_failed)?;
    writer.flush().map_err(write_failed)?;
    writer.get_ref().sync_all().map_err(write_failed)
}

/// Appends the stopped cluster's top-level entries (`postmaster.*` aside) to `builder`:
/// `pg_wal` with only the segments a start needs, `pg_notify` empty, the databases' room
/// as `base`.
fn append_cluster<W: Write>(
    builder: &mut tar::Builder<W>,
    cluster: &Path,
    created_unix: u64,
) -> Result<(), WriteError> {
    let unreadable = |source| WriteError::ReadCluster {
        path: cluster.to_path_buf(),
        source,
    };
    for entry in std::fs::read_dir(cluster).map_err(unreadable)? {
        let entry = entry.map_err(unreadable)?;
        let name = entry.file_name();
        // Written by each start; a stale one would only mislead.
        if name == "postmaster.pid" || name == "postmaster.opts" {
            continue;
        }
        let from = entry.path();
        let kind = match entry.file_type() {
            Ok(kind) => kind,
            Err(source) => return Err(WriteError::Stat { path: from, source }),
        };
        let written = if name == "pg_wal" && kind.is_dir() {
            append_wal(builder, cluster, &from)
        } else if name == space::NOTIFY_QUEUE_DIR {
            // LISTEN/NOTIFY's queue, which postgres empties at its start: only the
            // directory goes in, whatever it holds (up to gigabytes of notifications nobody
            // read) and whatever it is here (a directory, a tmpfs, a link into the
            // databases' room, `room.rs`), so that any daemon can unpack it.
            append_empty_dir(builder, &name, created_unix)
        } else if name == "base" && kind.is_symlink() {
            // The databases' room in `--databases-dir` (`room.rs`): what it holds goes in,
            // as a directory `base`, never the link (which no unpacking would take).
            std::fs::read_link(&from).and_then(|room| builder.append_dir_all(&name, &room))
        } else if kind.is_dir() {
            builder.append_dir_all(&name, &from)
        } else {
            builder.append_path_with_name(&from, &name)
        };
        if let Err(source) = written {
            return Err(WriteError::Archive { path: from, source });
        }
    }
    Ok(())
}

/// Appends an empty directory `name` (mode 0700, as postgres makes its directories).
fn append_empty_dir<W: Write>(
    builder: &mut tar::Builder<W>,
    name: &std::ffi::OsStr,
    mtime: u64,
) -> std::io::Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Directory);
    header.set_size(0);
    header.set_mode(0o700);
    header.set_mtime(mtime);
    header.set_cksum();
    builder.append_data(&mut header, name, std::io::empty())
}

/// Appends `pg_wal` with only the segments a start needs: those from the last checkpoint's
/// redo point to the checkpoint record, as `global/pg_control` names them. The others are
/// finished (before the checkpoint) or recycled for later use, and can be gigabytes after
/// a big restore. When pg_control cannot be read as expected, every segment goes in.
fn append_wal<W: Write>(
    builder: &mut tar::Builder<W>,
    cluster: &Path,
    wal: &Path,
) -> std::io::Result<()> {
    let mut segments = Vec::new();
    builder.append_dir("pg_wal", wal)?;
    for entry in std::fs::read_dir(wal)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            builder.append_dir_all(format!("pg_wal/{name}"), &path)?;
        } else if is_segment_name(&name) {
            segments.push((name, path));
        } else {
            builder.append_path_with_name(&path, format!("pg_wal/{name}"))?;
        }
    }
    let needed = needed_segments(cluster, &segments);
    if needed.is_none() {
        warn!("cannot tell the needed WAL segments from pg_control; the snapshot keeps them all");
    }
    for (name, path) in &segments {
        if needed
            .as_ref()
            .is_none_or(|(first, last)| first <= name && name <= last)
        {
            builder.append_path_with_name(path, format!("pg_wal/{name}"))?;
        }
    }
    Ok(())
}

/// 24 hex digits: a WAL segment (not a `.history`, `.partial` or `.backup` file).
fn is_segment_name(name: &str) -> bool {
    name.len() == 24 && name.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The names of the first and last segment a start of the stopped `cluster` reads: the
/// last checkpoint's redo point and the checkpoint record itself (one segment after a
/// clean stop). `None` unless pg_control says the cluster was shut down cleanly and the
/// segment it names is among `segments`.
///
/// `ControlFileData` begins alike in every supported major (13 to 18): system identifier
/// (u64), pg_control version and catalog version (u32 each), state (an enum, 1 =
/// shut down), the time (i64, aligned to 8), the checkpoint's location (u64), then the
/// checkpoint itself, whose first fields are the redo location (u64) and the timeline
/// (u32). The segment size is that of the segment files.
fn needed_segments(cluster: &Path, segments: &[(String, PathBuf)]) -> Option<(String, String)> {
    const SHUT_DOWN: u32 = 1;
    let control = std::fs::read(cluster.join("global").join("pg_control")).ok()?;
    let u32_at = |at: usize| {
        Some(u32::from_ne_bytes(
            control.get(at..at + 4)?.try_into().ok()?,
        ))
    };
    let u64_at = |at: usize| {
        Some(u64::from_ne_bytes(
            control.get(at..at + 8)?.try_into().ok()?,
        ))
    };
    if u32_at(16)? != SHUT_DOWN {
        return None;
    }
    let checkpoint = u64_at(32)?;
    let redo = u64_at(40)?;
    let timeline = u32_at(48)?;
    let segment_size = std::fs::metadata(&segments.first()?.1).ok()?.len();
    if segment_size == 0 || !segment_size.is_power_of_two() || redo > checkpoint {
        return None;
    }
    let name = |location: u64| {
        let segment = location / segment_size;
        let per_id = 0x1_0000_0000 / segment_size;
        format!(
            "{timeline:08X}{:08X}{:08X}",
            segment / per_id,
            segment % per_id
        )
    };
    let (first, last) = (name(redo), name(checkpoint));
    segments
        .iter()
        .any(|(n, _)| *n == first)
        .then_some((first, last))
}

#[cfg(test)]
mod tests;
