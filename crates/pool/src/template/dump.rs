//! Templates from a `pg_dump` output: which format a dump is, which tool restores it, and
//! the command line that does — run like a migration command (`run_command`: a temporary
//! login role acting as the owner role, a timeout, the output's tail in errors).
//!
//! Custom and directory dumps restore with `pg_restore -j N` (parallel), tar dumps with
//! `pg_restore` (tar cannot be restored in parallel), plain SQL with `psql` in one
//! transaction, decompressed first when it is `.gz` or `.zst`. `--no-owner --no-privileges`
//! (pg_restore) leave every object to the build role, i.e. the owner role, so leases can
//! alter them, and a dump naming roles this server lacks still restores.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::source_error::SourceError;
use crate::child_user::ChildUser;
use crate::config::{CommandOrigin, CommandSource, DumpSource};

/// What a dump is, by its first bytes (not its name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// `pg_dump -Fc`: starts with "PGDMP".
    Custom,
    /// `pg_dump -Fd`: a directory with `toc.dat`.
    Directory,
    /// `pg_dump -Ft`: a tar archive.
    Tar,
    /// `pg_dump -Fp`, or any SQL script.
    Plain,
    /// Plain SQL compressed with gzip.
    PlainGzip,
    /// Plain SQL compressed with zstd.
    PlainZstd,
}

impl Format {
    /// Looks at `path`.
    pub(crate) fn of(path: &Path) -> Result<Format, SourceError> {
        let unreadable = |source| SourceError::Named {
            role: "dump",
            path: path.to_owned(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(unreadable)?;
        if meta.is_dir() {
            return if path.join("toc.dat").is_file() {
                Ok(Format::Directory)
            } else {
                Err(SourceError::NotADirectoryDump {
                    path: path.to_owned(),
                })
            };
        }
        let mut head = [0u8; 512];
        // A device or FIFO is refused before a byte is read.
        let (mut file, _) = super::open::open_regular(path)
            .map_err(|error| SourceError::DumpFile(Box::new(error)))?;
        let mut read = 0;
        while read < head.len() {
            match file.read(&mut head[read..]) {
                Ok(0) => break,
                Ok(n) => read += n,
                Err(e) => return Err(unreadable(e)),
            }
        }
        let head = &head[..read];
        Ok(if head.starts_with(b"PGDMP") {
            Format::Custom
        } else if head.starts_with(&[0x1f, 0x8b]) {
            Format::PlainGzip
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Format::PlainZstd
        } else if head.len() >= 262 && &head[257..262] == b"ustar" {
            Format::Tar
        } else {
            Format::Plain
        })
    }

    /// A psql script (plain SQL, compressed or not), as opposed to a pg_restore archive.
    fn is_script(self) -> bool {
        matches!(self, Format::Plain | Format::PlainGzip | Format::PlainZstd)
    }

    fn tool(self) -> &'static str {
        match self {
            Format::Custom | Format::Directory | Format::Tar => "pg_restore",
            Format::Plain | Format::PlainGzip | Format::PlainZstd => "psql",
        }
    }
}

/// A restore about to run: its command, the dump's format, the tool's version (for the log
/// and errors), for pg_restore the number of entries in the dump's table of contents, and
/// which of its output lines count an entry (for progress).
pub(crate) struct Restore {
    pub command: CommandSource,
    pub format: Format,
    pub tool: String,
    pub entries: Option<u64>,
    pub counts: fn(&str) -> bool,
}

/// Refuses a plain-SQL dump where no script may run (see [`DumpSource::allow_script`]).
pub(crate) fn check_script(dump: &DumpSource, format: Format) -> Result<(), SourceError> {
    if format.is_script() && !dump.allow_script {
        return Err(SourceError::ScriptRefused {
            path: dump.path.clone(),
        });
    }
    Ok(())
}

/// A line of `pg_restore --verbose --jobs N` that counts an entry: "processing item …"
/// (the serial first phase), "finished item …" and "skipping item …" (the parallel loop).
/// The "creating …" lines it also prints are the same entries again.
pub(crate) fn parallel_entry(line: &str) -> bool {
    starts_with_any(
        line,
        &["processing item ", "finished item ", "skipping item "],
    )
}

/// A line of a serial `pg_restore --verbose` that begins an entry.
pub(crate) fn serial_entry(line: &str) -> bool {
    starts_with_any(line, &["creating ", "processing data ", "executing "])
}

fn starts_with_any(line: &str, starts: &[&str]) -> bool {
    line.strip_prefix("pg_restore: ")
        .is_some_and(|rest| starts.iter().any(|start| rest.starts_with(start)))
}

/// Why no command can restore a dump.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RestoreError {
    /// The dump could not be looked at as the child user at all.
    #[error(transparent)]
    ReadAs(#[from] crate::child_user::ReadAsError),
    /// The dump cannot be used (its words, with who read it where a right was missing).
    #[error("{0}")]
    Source(String),
    /// The tool its format needs is not installed.
    #[error(
        "{tool} not found (on PATH or in /usr/lib/postgresql/*/bin): a {format:?} dump \
         needs it; install the PostgreSQL client tools (Debian: postgresql-client)"
    )]
    ToolNotFound {
        /// `pg_restore` or `psql`.
        tool: &'static str,
        /// The dump's format.
        format: Format,
    },
}

/// The command that restores `dump` into `$DATABASE_URL`, run (like every tool here) as
/// `user`, who must be able to read the dump.
pub(crate) async fn restore_command(
    dump: &DumpSource,
    user: &ChildUser,
) -> Result<Restore, RestoreError> {
    let path = dump.path.clone();
    let format = user
        .read(move || Format::of(&path))
        .await?
        .map_err(|e| RestoreError::Source(user.explain(e)))?;
    check_script(dump, format).map_err(|e| RestoreError::Source(e.to_string()))?;
    let tool_name = format.tool();
    let tool = find_tool(tool_name).ok_or(RestoreError::ToolNotFound {
        tool: tool_name,
        format,
    })?;
    let version = user
        .command(&tool)
        .arg("--version")
        .output()
        .await
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| tool.display().to_string());
    let file = quote(&dump.path.display().to_string());
    let tool_q = quote(&tool.display().to_string());
    let jobs = dump
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let restore = "--no-owner --no-privileges --exit-on-error --verbose --dbname \"$DATABASE_URL\"";
    let psql = format!(
        "{tool_q} -X -q -v ON_ERROR_STOP=1 --single-transaction --dbname \"$DATABASE_URL\""
    );
    let parallel = jobs > 1 && matches!(format, Format::Custom | Format::Directory);
    let command = match format {
        Format::Custom | Format::Directory if parallel => {
            format!("{tool_q} {restore} --jobs {jobs} {file}")
        }
        Format::Custom | Format::Directory | Format::Tar => format!("{tool_q} {restore} {file}"),
        Format::Plain => format!("{psql} -f {file}"),
        // Checked whole first: a truncated stream would otherwise reach psql as a script
        // that merely ends early.
        Format::PlainGzip => format!("gzip -t {file} && gzip -dc {file} | {psql} -f -"),
        Format::PlainZstd => format!("zstd -qt {file} && zstd -qdc {file} | {psql} -f -"),
    };
    let workdir = dump
        .path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("/"));
    let entries = match format {
        Format::Custom | Format::Directory | Format::Tar => {
            toc_entries(user, &tool, &dump.path).await
        }
        _ => None,
    };
    Ok(Restore {
        command: CommandSource {
            command,
            workdir,
            watch: vec![dump.path.clone()],
            timeout: dump.timeout,
            // pg_restore or psql reading a dump runs as the child user, like every read of
            // a dump: the configured one's too.
            origin: CommandOrigin::Caller,
        },
        format,
        tool: version,
        entries,
        counts: if parallel {
            parallel_entry
        } else {
            serial_entry
        },
    })
}

/// The entries of a dump's table of contents (`pg_restore -l`), None if it cannot be read
/// (the restore then says why).
async fn toc_entries(user: &ChildUser, tool: &Path, path: &Path) -> Option<u64> {
    let out = user.command(tool).arg("-l").arg(path).output().await.ok()?;
    out.status.success().then(|| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|line| !line.trim().is_empty() && !line.starts_with(';'))
            .count() as u64
    })
}

/// `name` on PATH, else in the newest `/usr/lib/postgresql/<major>/bin`.
fn find_tool(name: &str) -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
    });
    on_path.or_else(|| {
        let mut majors: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|entry| {
                let entry = entry.ok()?;
                let major = entry.file_name().to_str()?.parse().ok()?;
                let tool = entry.path().join("bin").join(name);
                tool.is_file().then_some((major, tool))
            })
            .collect();
        majors.sort();
        majors.pop().map(|(_, tool)| tool)
    })
}

/// Single-quoted for `sh`.
fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("pglease-dump-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        dir
    }

    #[test]
    fn formats_are_told_by_their_bytes_not_their_names() {
        let dir = scratch("formats");
        let write = |name: &str, bytes: &[u8]| {
            let path = dir.join(name);
            std::fs::write(&path, bytes).expect("write");
            path
        };
        assert_eq!(
            Format::of(&write("a.sql", b"PGDMP\x01\x0e")).ok(),
            Some(Format::Custom)
        );
        assert_eq!(
            Format::of(&write("b.dump", b"CREATE TABLE t ();")).ok(),
            Some(Format::Plain)
        );
        assert_eq!(
            Format::of(&write("c", &[0x1f, 0x8b, 8, 0])).ok(),
            Some(Format::PlainGzip)
        );
        assert_eq!(
            Format::of(&write("d", &[0x28, 0xb5, 0x2f, 0xfd, 0])).ok(),
            Some(Format::PlainZstd)
        );
        let mut tar = vec![0u8; 512];
        tar[257..262].copy_from_slice(b"ustar");
        assert_eq!(Format::of(&write("e.tar", &tar)).ok(), Some(Format::Tar));
        let directory = dir.join("dir");
        std::fs::create_dir_all(&directory).expect("dir");
        let error = Format::of(&directory).expect_err("no toc.dat").to_string();
        assert!(error.contains("toc.dat"), "{error}");
        write("dir/toc.dat", b"PGDMP");
        assert_eq!(Format::of(&directory).ok(), Some(Format::Directory));
        let error = Format::of(&dir.join("missing"))
            .expect_err("missing")
            .to_string();
        assert!(error.contains("missing"), "{error}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn entries_are_counted_once_from_pg_restores_verbose_lines() {
        // As `pg_restore -v -j 2` printed them for a function, a table, its data and an
        // index (5 entries with the schema's ACL).
        let parallel_run = [
            "pg_restore: connecting to database for restore",
            "pg_restore: processing item 215 FUNCTION slow(integer)",
            "pg_restore: creating FUNCTION \"public.slow(integer)\"",
            "pg_restore: processing item 214 TABLE t",
            "pg_restore: creating TABLE \"public.t\"",
            "pg_restore: entering main parallel loop",
            "pg_restore: launching item 3340 TABLE DATA t",
            "pg_restore: processing data for table \"public.t\"",
            "pg_restore: finished item 3340 TABLE DATA t",
            "pg_restore: launching item 3197 INDEX t_slow",
            "pg_restore: creating INDEX \"public.t_slow\"",
            "pg_restore: finished item 3197 INDEX t_slow",
            "pg_restore: skipping item 3348 ACL SCHEMA public",
            "pg_restore: finished main parallel loop",
        ];
        assert_eq!(parallel_run.iter().filter(|l| parallel_entry(l)).count(), 5);
        let serial_run = [
            "pg_restore: creating FUNCTION \"public.slow(integer)\"",
            "pg_restore: creating TABLE \"public.t\"",
            "pg_restore: processing data for table \"public.t\"",
            "pg_restore: executing SEQUENCE SET t_id_seq",
            "pg_restore: creating INDEX \"public.t_slow\"",
            "creating TABLE",
        ];
        assert_eq!(serial_run.iter().filter(|l| serial_entry(l)).count(), 5);
    }

    #[test]
    fn paths_are_quoted_for_the_shell() {
        assert_eq!(quote("/a b/it's.dump"), r"'/a b/it'\''s.dump'");
    }
}
