//! The fsync-delay shim of scenario 6: `bench/shim/fsync_delay.c`, an `LD_PRELOAD`
//! library that sleeps `FSYNC_DELAY_US` before each `fsync`, `fdatasync` and waiting
//! `sync_file_range`, and its probe, `bench/shim/fsync_delay_probe.c`, which times those
//! calls through the shim and straight to libc. Both sources are compiled into this binary (`include_str!`), written to
//! `<work dir>/shim/` and built there with the machine's C compiler (`$CC`, else `cc`).
//! A build is reused while the source written beside it is byte for byte the embedded one,
//! so editing a `.c` file and rebuilding the driver rebuilds the shim.
//!
//! It preloads nothing itself: the caller sets `LD_PRELOAD` on the process to slow down.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde::Serialize;

use crate::error::{BenchError, Result};
use crate::stats::round3;

/// The shim's source, as this binary was built with it.
const SHIM_SOURCE: &str = include_str!("../../../bench/shim/fsync_delay.c");
/// The probe's source.
const PROBE_SOURCE: &str = include_str!("../../../bench/shim/fsync_delay_probe.c");
/// The environment variable the shim reads, in microseconds.
pub const DELAY_VAR: &str = "FSYNC_DELAY_US";

/// The built shim and probe.
#[derive(Debug, Clone)]
pub struct Shim {
    /// The shared library to preload.
    pub library: PathBuf,
    /// The probe executable.
    pub probe: PathBuf,
    /// Whether either was compiled by this call (false: both reused).
    pub compiled: bool,
}

/// Builds (or reuses) the shim and the probe in `dir`.
pub fn build(dir: &Path) -> Result<Shim> {
    std::fs::create_dir_all(dir)
        .map_err(|e| BenchError::io(format!("cannot create {}", dir.display()), e))?;
    let library = dir.join("fsync_delay.so");
    let probe = dir.join("fsync_delay_probe");
    let compiled_library = compile(
        dir,
        "fsync_delay.c",
        SHIM_SOURCE,
        &library,
        &["-shared", "-fPIC"],
        &["-ldl"],
    )?;
    let compiled_probe = compile(
        dir,
        "fsync_delay_probe.c",
        PROBE_SOURCE,
        &probe,
        &[],
        &["-ldl"],
    )?;
    Ok(Shim {
        library,
        probe,
        compiled: compiled_library || compiled_probe,
    })
}

/// Compiles `source` (written to `dir/name`) into `output` unless an up-to-date build is
/// there. Returns whether it compiled.
fn compile(
    dir: &Path,
    name: &str,
    source: &str,
    output: &Path,
    flags: &[&str],
    libs: &[&str],
) -> Result<bool> {
    let source_path = dir.join(name);
    let current = std::fs::read_to_string(&source_path).ok();
    if output.is_file() && current.as_deref() == Some(source) {
        return Ok(false);
    }
    std::fs::write(&source_path, source)
        .map_err(|e| BenchError::io(format!("cannot write {}", source_path.display()), e))?;
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    // Built under a temporary name and renamed, so an interrupted build is never reused.
    let partial = output.with_extension("partial");
    let result = std::process::Command::new(&compiler)
        .args(["-O2", "-Wall", "-Wextra"])
        .args(flags)
        .arg("-o")
        .arg(&partial)
        .arg(&source_path)
        .args(libs)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            BenchError::io(
                format!("cannot run the C compiler `{compiler}` (set CC) to build {name}"),
                e,
            )
        })?;
    if !result.status.success() {
        // A stale source copy would make the next run skip the build: remove it.
        let _ = std::fs::remove_file(&source_path);
        return Err(BenchError::Other(format!(
            "`{compiler}` failed to build {name} ({}): {}",
            result.status,
            String::from_utf8_lossy(&result.stderr).trim()
        )));
    }
    std::fs::rename(&partial, output)
        .map_err(|e| BenchError::io(format!("cannot rename into {}", output.display()), e))?;
    Ok(true)
}

/// What the probe saw, with the shim preloaded: each call made straight to libc and
/// through the shim, alternately (medians).
#[derive(Debug, Clone, Serialize)]
pub struct ProbeResult {
    /// `FSYNC_DELAY_US` of the run.
    pub delay_us: u64,
    /// Where the probe's file was (the stock cluster's file system).
    pub dir: String,
    /// Calls of each kind, each way.
    pub calls: u32,
    /// One entry per call kind.
    pub kinds: Vec<ProbeKind>,
}

/// One call kind in the probe.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeKind {
    /// `fsync`, `fdatasync`, `sync_file_range_write` or `sync_file_range_wait`.
    pub name: String,
    /// Median straight to libc, µs.
    pub direct_us: f64,
    /// Median through the shim, µs.
    pub shimmed_us: f64,
    /// Their difference, ms.
    pub added_ms: f64,
    /// Whether the shim is meant to delay this call.
    pub delayed_by_design: bool,
}

impl ProbeResult {
    /// Whether each call was delayed as designed: the delayed kinds by at least 90% of
    /// the delay, the others by less than half of it.
    pub fn as_designed(&self) -> bool {
        let delay_ms = self.delay_us as f64 / 1e3;
        !self.kinds.is_empty()
            && self.kinds.iter().all(|k| {
                if k.delayed_by_design {
                    k.added_ms >= 0.9 * delay_ms
                } else {
                    k.added_ms < 0.5 * delay_ms
                }
            })
    }
}

/// Whether the shim delays the call the probe names: every kind but the writeback hint.
pub fn delayed_by_design(name: &str) -> bool {
    name != "sync_file_range_write"
}

/// Runs the probe in `dir` with the shim preloaded at `delay_us`, `calls` calls of each
/// kind each way.
pub async fn probe(shim: &Shim, dir: &Path, delay_us: u64, calls: u32) -> Result<ProbeResult> {
    let output = tokio::process::Command::new(&shim.probe)
        .arg(dir)
        .arg(calls.to_string())
        .stdin(Stdio::null())
        .env("LD_PRELOAD", &shim.library)
        .env(DELAY_VAR, delay_us.to_string())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| BenchError::io(format!("cannot run {}", shim.probe.display()), e))?;
    if !output.status.success() {
        return Err(BenchError::Other(format!(
            "the shim probe failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(ProbeResult {
        delay_us,
        dir: dir.display().to_string(),
        calls,
        kinds: parse_probe(&String::from_utf8_lossy(&output.stdout))?,
    })
}

/// Parses the probe's `<name> <direct µs> <through the shim µs>` lines.
pub fn parse_probe(text: &str) -> Result<Vec<ProbeKind>> {
    let mut kinds = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let parsed = match fields.as_slice() {
            [name, direct, shimmed] => direct
                .parse::<f64>()
                .ok()
                .zip(shimmed.parse::<f64>().ok())
                .map(|(direct_us, shimmed_us)| ProbeKind {
                    name: name.to_string(),
                    direct_us,
                    shimmed_us,
                    added_ms: round3((shimmed_us - direct_us) / 1e3),
                    delayed_by_design: delayed_by_design(name),
                }),
            _ => None,
        };
        match parsed {
            Some(kind) => kinds.push(kind),
            None => {
                return Err(BenchError::Other(format!(
                    "unexpected line from the shim probe: {line:?}"
                )))
            }
        }
    }
    if kinds.is_empty() {
        return Err(BenchError::Other("the shim probe printed nothing".into()));
    }
    Ok(kinds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_probe_output() {
        let kinds = parse_probe(
            "fsync 230.7 1294.6\nfdatasync 169.2 1293.5\nsync_file_range_write 0.3 0.3\n\n",
        )
        .expect("three lines");
        assert_eq!(kinds.len(), 3);
        assert_eq!(kinds[1].name, "fdatasync");
        assert_eq!(kinds[1].added_ms, 1.124);
        assert!(kinds[1].delayed_by_design);
        assert!(!kinds[2].delayed_by_design);
        assert!(parse_probe("").is_err());
        assert!(parse_probe("fsync slow 1\n").is_err());
        assert!(parse_probe("fsync 1\n").is_err());
        assert!(parse_probe("fsync 1 2 3\n").is_err());
    }

    #[test]
    fn only_the_writeback_hint_is_not_delayed() {
        assert!(delayed_by_design("fsync"));
        assert!(delayed_by_design("fdatasync"));
        assert!(delayed_by_design("sync_file_range_wait"));
        assert!(!delayed_by_design("sync_file_range_write"));
    }

    fn kind(name: &str, added_ms: f64) -> ProbeKind {
        ProbeKind {
            name: name.into(),
            direct_us: 50.0,
            shimmed_us: 50.0 + added_ms * 1e3,
            added_ms,
            delayed_by_design: delayed_by_design(name),
        }
    }

    #[test]
    fn judges_the_probe_against_the_design() {
        let mut result = ProbeResult {
            delay_us: 1_000,
            dir: "/var/tmp".into(),
            calls: 20,
            kinds: vec![
                kind("fsync", 1.05),
                kind("fdatasync", 0.97),
                kind("sync_file_range_write", 0.01),
                kind("sync_file_range_wait", 1.2),
            ],
        };
        assert!(result.as_designed());
        // The hint delayed: not as designed.
        result.kinds[2] = kind("sync_file_range_write", 1.0);
        assert!(!result.as_designed());
        // fdatasync not delayed: not as designed.
        result.kinds[2] = kind("sync_file_range_write", 0.0);
        result.kinds[1] = kind("fdatasync", 0.1);
        assert!(!result.as_designed());
        result.kinds.clear();
        assert!(!result.as_designed());
    }

    /// Builds the real shim with the machine's compiler and checks, through the probe,
    /// which calls it delays. Needs a C compiler; without one (and without
    /// PGLEASE_REQUIRE_TOOLS, which CI sets) it says so and passes.
    #[tokio::test]
    async fn the_built_shim_delays_syncs_but_not_the_writeback_hint() {
        let dir =
            std::env::temp_dir().join(format!("pglease-bench-shim-test-{}", std::process::id()));
        let shim = match build(&dir) {
            Ok(shim) => shim,
            Err(error) if std::env::var_os("PGLEASE_REQUIRE_TOOLS").is_none() => {
                eprintln!("skipped: cannot build the shim (no C compiler?): {error}");
                let _ = std::fs::remove_dir_all(&dir);
                return;
            }
            Err(error) => panic!("cannot build the shim: {error}"),
        };
        assert!(shim.compiled, "a fresh directory needs a build");
        // The same source again: reused.
        let again = build(&dir).expect("second build");
        assert!(!again.compiled, "an up-to-date build is reused");
        // The probe's file goes to tmpfs when there is one: syncs cost nothing there, so
        // a busy disk cannot blur the 20 ms the shim adds.
        let shm = Path::new("/dev/shm");
        let probe_dir = if shm.is_dir() { shm } else { dir.as_path() };
        let result = probe(&shim, probe_dir, 20_000, 3).await;
        let _ = std::fs::remove_dir_all(&dir);
        let result = result.expect("probe");
        for kind in &result.kinds {
            if kind.delayed_by_design {
                assert!(
                    kind.shimmed_us >= 20_000.0 && kind.added_ms >= 15.0,
                    "{kind:?} should be delayed by 20 ms"
                );
            } else {
                assert!(kind.shimmed_us < 10_000.0, "{kind:?} should not be delayed");
            }
        }
        assert_eq!(result.kinds.len(), 4, "{result:?}");
    }
}
