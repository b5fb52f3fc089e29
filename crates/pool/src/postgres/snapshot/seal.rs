//! The MAC that proves a snapshot file is ours: a fixed trailer after the zstd stream,
//!
//! ```text
//! magic "PGLSNMAC" (8 bytes) | version 1 (u32, big-endian) | 4 zero bytes |
//! key id (8 bytes, `key.rs`) | HMAC-SHA256 tag (32 bytes)
//! ```
//!
//! The tag covers every byte before it: the stream and the trailer's first 24 bytes. The
//! readers stop at the trailer (`Read::take` in effect), so the archive code is unchanged.
//!
//! A file is checked from one open descriptor, twice: [`Sealed::verify`] hashes it before
//! anything in it is parsed, and [`Sealed::reader`] hashes again what the unpacking reads
//! (positioned reads on the same descriptor), so that a file rewritten in place between the
//! two is caught by [`Reader::finish`] and the unpacked cluster thrown away. This file knows
//! nothing of tar or of clusters.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::key::SnapshotKey;

/// The trailer's first bytes.
const MAGIC: [u8; 8] = *b"PGLSNMAC";
/// This code's trailer layout.
const VERSION: u32 = 1;
/// Magic, version, reserved, key id: the part of the trailer the tag covers.
const HEADER_LEN: u64 = 24;
/// The tag's length.
const TAG_LEN: u64 = 32;
/// The whole trailer.
pub(super) const TRAILER_LEN: u64 = HEADER_LEN + TAG_LEN;
/// What a zstd stream starts with: tells an older pglease's snapshot from any other file.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
/// Bytes hashed per read.
const CHUNK: usize = 1 << 20;

/// Why a snapshot is not proven ours, as far as can be told (a tag that does not match
/// cannot say whether the bytes or the key differ; the key id beside it tells which).
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// No trailer: a snapshot of an older pglease (format 1), or one re-packed without it.
    #[error(
        "it carries no MAC: written by an older pglease (before snapshots were \
         authenticated), or re-packed by someone without the key"
    )]
    NoMac,
    /// Not even a zstd stream.
    #[error("it carries no MAC and is not a pglease snapshot at all")]
    NotASnapshot,
    /// A trailer of a layout this code does not know.
    #[error("its MAC is of version {0}, this pglease checks version {VERSION}")]
    UnknownVersion(u32),
    /// Sealed with another key (the key id says so; the tag cannot be checked).
    #[error(
        "its MAC was made with another key (key id {theirs}, this daemon's is {ours}): another \
         runner's, or someone else's; runners that share snapshots share one \
         --snapshot-key-file"
    )]
    OtherKey {
        /// The key id in the file.
        theirs: String,
        /// This daemon's.
        ours: String,
    },
    /// The tag does not match the bytes: altered (or truncated) after it was written.
    #[error(
        "its MAC does not match its content: the file was altered or cut after it was written"
    )]
    Altered,
    /// The file changed between the check and the unpacking (rewritten in place).
    #[error(
        "its content changed while it was unpacked (the file was rewritten after it was \
         checked): what was unpacked is thrown away"
    )]
    ChangedWhileRead,
    /// Reading the file failed.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The snapshot file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// A snapshot file opened once, whose MAC [`Sealed::verify`] checked.
#[derive(Debug)]
pub struct Sealed {
    file: File,
    path: PathBuf,
    /// The file's length when it was checked: every later read stays within it.
    length: u64,
}

impl Sealed {
    /// Checks the MAC of the open `file` (named `path` in errors) under `key`, reading it
    /// whole; nothing in it is parsed before the tag matches.
    pub fn verify(file: File, path: &Path, key: &SnapshotKey) -> Result<Sealed, SealError> {
        let io = |source| SealError::Io {
            path: path.to_path_buf(),
            source,
        };
        let length = file.metadata().map_err(io)?.len();
        let mut start = [0u8; 4];
        let is_zstd = file.read_exact_at(&mut start, 0).is_ok() && start == ZSTD_MAGIC;
        if length < TRAILER_LEN {
            return Err(if is_zstd {
                SealError::NoMac
            } else {
                SealError::NotASnapshot
            });
        }
        let mut trailer = [0u8; TRAILER_LEN as usize];
        file.read_exact_at(&mut trailer, length - TRAILER_LEN)
            .map_err(io)?;
        if trailer[..8] != MAGIC {
            return Err(if is_zstd {
                SealError::NoMac
            } else {
                SealError::NotASnapshot
            });
        }
        let version = u32::from_be_bytes([trailer[8], trailer[9], trailer[10], trailer[11]]);
        if version != VERSION {
            return Err(SealError::UnknownVersion(version));
        }
        let ours = key.id();
        if trailer[16..24] != ours {
            return Err(SealError::OtherKey {
                theirs: hex::encode(&trailer[16..24]),
                ours: hex::encode(ours),
            });
        }
        let sealed = Sealed {
            file,
            path: path.to_path_buf(),
            length,
        };
        let mut reader = sealed.reader(key);
        let mut sink = vec![0u8; CHUNK];
        while reader.read(&mut sink).map_err(io)? > 0 {}
        reader.finish().map_err(|error| match error {
            SealError::ChangedWhileRead => SealError::Altered,
            other => other,
        })?;
        Ok(sealed)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A reader of the zstd stream (the trailer left out) that hashes what it reads again;
    /// `Reader::finish` says whether it was the checked content.
    pub fn reader<'a>(&'a self, key: &SnapshotKey) -> Reader<'a> {
        Reader {
            sealed: self,
            position: 0,
            end: self.length - TRAILER_LEN,
            mac: key.mac(),
        }
    }
}

/// Reads a [`Sealed`] file's stream from its descriptor (positioned reads: several readers
/// do not disturb each other), hashing every byte.
pub struct Reader<'a> {
    sealed: &'a Sealed,
    position: u64,
    end: u64,
    mac: Hmac<Sha256>,
}

impl Read for Reader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = (self.end - self.position).min(buf.len() as u64) as usize;
        if left == 0 {
            return Ok(0);
        }
        let read = self.sealed.file.read_at(&mut buf[..left], self.position)?;
        if read == 0 {
            // Shorter than when it was checked: cut while we read.
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the snapshot file became shorter while it was read",
            ));
        }
        self.mac.update(&buf[..read]);
        self.position += read as u64;
        Ok(read)
    }
}

impl Reader<'_> {
    /// Hashes the rest of the stream (what the archive reader left unread) and the trailer,
    /// and compares the tag in constant time.
    pub fn finish(mut self) -> Result<(), SealError> {
        let io = |source| SealError::Io {
            path: self.sealed.path.clone(),
            source,
        };
        let mut sink = vec![0u8; CHUNK];
        while self.read(&mut sink).map_err(io)? > 0 {}
        let mut trailer = [0u8; TRAILER_LEN as usize];
        self.sealed
            .file
            .read_exact_at(&mut trailer, self.end)
            .map_err(io)?;
        self.mac.update(&trailer[..HEADER_LEN as usize]);
        self.mac
            .verify_slice(&trailer[HEADER_LEN as usize..])
            .map_err(|_| SealError::ChangedWhileRead)
    }
}

/// A writer that hashes what it writes; [`Sealing::seal`] appends the trailer.
pub struct Sealing<W: Write> {
    inner: W,
    mac: Hmac<Sha256>,
    key_id: [u8; 8],
}

impl<W: Write> Sealing<W> {
    /// Writes through to `inner`, hashing under `key`.
    pub fn new(inner: W, key: &SnapshotKey) -> Sealing<W> {
        Sealing {
            inner,
            mac: key.mac(),
            key_id: key.id(),
        }
    }

    /// Appends the trailer (its header hashed too, then the tag) and returns the writer.
    pub fn seal(mut self) -> std::io::Result<W> {
        let mut header = [0u8; HEADER_LEN as usize];
        header[..8].copy_from_slice(&MAGIC);
        header[8..12].copy_from_slice(&VERSION.to_be_bytes());
        header[16..24].copy_from_slice(&self.key_id);
        self.write_all(&header)?;
        let tag = self.mac.finalize().into_bytes();
        self.inner.write_all(&tag)?;
        Ok(self.inner)
    }
}

impl<W: Write> Write for Sealing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let written = self.inner.write(buf)?;
        self.mac.update(&buf[..written]);
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests;
