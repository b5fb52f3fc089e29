//! The marker file that makes a directory a pglease instance (`pglease-instance`, its
//! format described in `instance.rs`): writing it, reading it (only when we own it), and
//! judging from `/proc` whether the daemon it names still runs.
//!
//! The instance directory writes it; the sweep acts on its word. It uses only `util.rs`.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nix::unistd::geteuid;

use super::util::write_anew;
use crate::error::StartError;

/// Name of the marker file that makes a directory a pglease instance.
pub(crate) const MARKER_FILE: &str = "pglease-instance";

/// What a marker file says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Marker {
    /// The daemon that owns the instance.
    pub pid: Option<u32>,
    /// Its start time, which tells it apart from a later process with the same pid.
    pub start_time: Option<u64>,
    /// Left behind on purpose (`keep_data`).
    pub kept: bool,
}

/// Writes the marker naming this process.
pub(crate) fn write_marker(dir: &Path, kept: bool) -> Result<(), StartError> {
    let pid = std::process::id();
    let mut text = format!("pid={pid}\n");
    if let Some(stat) = proc_stat(pid) {
        text.push_str(&format!("start_time={}\n", stat.start_time));
    }
    if kept {
        text.push_str("kept=1\n");
    }
    // Anew, never through a link: the directory is the server user's, and a kept one
    // outlives this run.
    write_anew(&dir.join(MARKER_FILE), text.as_bytes(), None)
}

/// Reads the marker of `dir`; `None` unless it is a regular file owned by our euid: a
/// marker anyone else could have written (e.g. in world-writable /dev/shm) is ignored,
/// since the sweep kills processes on its word.
pub(crate) fn read_marker(dir: &Path) -> Option<Marker> {
    let path = dir.join(MARKER_FILE);
    let meta = std::fs::symlink_metadata(&path).ok()?;
    if !meta.is_file() || meta.uid() != geteuid().as_raw() {
        return None;
    }
    let text = std::fs::read_to_string(&path).ok()?;
    let mut marker = Marker {
        pid: None,
        start_time: None,
        kept: false,
    };
    for line in text.lines() {
        match line.split_once('=') {
            Some(("pid", value)) => marker.pid = value.trim().parse().ok(),
            Some(("start_time", value)) => marker.start_time = value.trim().parse().ok(),
            Some(("kept", value)) => marker.kept = value.trim() == "1",
            _ => {}
        }
    }
    Some(marker)
}

/// Whether the daemon a marker names is still running.
pub(crate) fn owner_alive(marker: &Marker) -> bool {
    let Some(pid) = marker.pid else {
        // Not a marker we wrote: not ours to judge.
        return true;
    };
    if pid == std::process::id() {
        return true;
    }
    let Some(stat) = proc_stat(pid).filter(|stat| stat.state != 'Z') else {
        return false;
    };
    match marker.start_time {
        // The same pid and start time can only be the same process.
        Some(start_time) => stat.start_time == start_time,
        // Without a start time, a live pid counts only if it looks like pglease.
        None => ["comm", "cmdline"].iter().any(|file| {
            std::fs::read(format!("/proc/{pid}/{file}"))
                .map(|bytes| String::from_utf8_lossy(&bytes).contains("pglease"))
                .unwrap_or(false)
        }),
    }
}

/// The fields of `/proc/<pid>/stat` we use.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ProcStat {
    /// R, S, D, Z, ...
    pub state: char,
    /// Clock ticks since boot.
    pub start_time: u64,
}

/// Reads `/proc/<pid>/stat`; `None` when there is no such process.
pub(crate) fn proc_stat(pid: u32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Field 3 (state) is fields[0]; field 22 (starttime) is fields[19].
    Some(ProcStat {
        state: fields.first()?.chars().next()?,
        start_time: fields.get(19)?.parse().ok()?,
    })
}

/// Whether `pid` is running (a zombie has finished running).
pub(crate) fn process_alive(pid: u32) -> bool {
    proc_stat(pid).is_some_and(|stat| stat.state != 'Z')
}
