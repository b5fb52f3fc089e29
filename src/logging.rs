//! Logging: `tracing` lines on stderr, filtered by `RUST_LOG` (default: info).

use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};

/// Sets up the global subscriber. Under systemd (stderr is the journal, `JOURNAL_STREAM`
/// is set) lines carry no time stamp of their own: the journal adds one.
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_timer(Stamp {
            enabled: std::env::var_os("JOURNAL_STREAM").is_none(),
        })
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // When stderr is gone (a log pipe whose reader died), tracing would report the
        // failed write with eprintln!, which panics on a closed stderr: lose the log line,
        // keep the daemon.
        .log_internal_errors(false)
        .init();
}

/// The wall-clock time stamp, or none.
struct Stamp {
    enabled: bool,
}

impl FormatTime for Stamp {
    fn format_time(&self, w: &mut Writer<'_>) -> std::fmt::Result {
        if self.enabled {
            SystemTime.format_time(w)
        } else {
            Ok(())
        }
    }
}
