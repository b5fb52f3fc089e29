//! The one way a template's source file is opened: a regular file, or refused before a
//! byte of it is read (a device or a FIFO would never end, or block the open). The sources
//! (`sources.rs`) and a dump's format (`dump.rs`) both read through it, so it sits below
//! both.
//!
//! Run it through [`ChildUser::read`](crate::child_user::ChildUser::read), so that it has
//! that user's rights and not the daemon's. Errors name the path and the reason
//! ([`SourceError`]).

use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::source_error::SourceError;

/// Opens a source file for reading, refusing anything but a regular file before a byte is
/// read. `O_NONBLOCK` keeps the open of a FIFO from waiting for a writer.
pub fn open_regular(path: &Path) -> Result<(std::fs::File, u64), SourceError> {
    let unreadable = |source| SourceError::Unreadable {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(path)
        .map_err(unreadable)?;
    let meta = file.metadata().map_err(unreadable)?;
    if !meta.is_file() {
        return Err(SourceError::NotRegular {
            path: path.to_owned(),
            kind: kind_of(&meta.file_type()),
        });
    }
    Ok((file, meta.len()))
}

/// What a non-regular file is, for errors (a migrations directory's entries too).
pub(super) fn kind_of(file_type: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if file_type.is_dir() {
        "a directory"
    } else if file_type.is_char_device() {
        "a character device"
    } else if file_type.is_block_device() {
        "a block device"
    } else if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_socket() {
        "a socket"
    } else {
        "not a file"
    }
}
