//! Logging: `tracing` lines on stderr, filtered by `RUST_LOG` (default: info).
//!
//! Under systemd (stderr is the journal, `JOURNAL_STREAM` is set) a line carries no time
//! stamp or level word of its own but a `<N>` syslog priority prefix, which journald takes
//! as the entry's priority: `journalctl -u pglease -p warning` then shows warnings and errors.

use std::fmt;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::{Format, Full, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Sets up the global subscriber.
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // When stderr is gone (a log pipe whose reader died), tracing would report the
        // failed write with eprintln!, which panics on a closed stderr: lose the log line,
        // keep the daemon.
        .log_internal_errors(false);
    if std::env::var_os("JOURNAL_STREAM").is_some() {
        builder
            .with_ansi(false)
            .event_format(JournalFormat::new())
            .init();
    } else {
        builder.init();
    }
}

/// The default line without time and level, after a `<N>` syslog priority.
struct JournalFormat {
    inner: Format<Full, ()>,
}

impl JournalFormat {
    fn new() -> Self {
        JournalFormat {
            inner: tracing_subscriber::fmt::format()
                .without_time()
                .with_level(false)
                .with_ansi(false),
        }
    }
}

/// syslog(3) priorities: err 3, warning 4, info 6, debug 7.
fn priority(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

impl<S, N> FormatEvent<S, N> for JournalFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        write!(writer, "<{}>", priority(event.metadata().level()))?;
        self.inner.format_event(ctx, writer, event)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::JournalFormat;

    /// Collects what the subscriber writes.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("sink").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn journal_lines_start_with_their_syslog_priority() {
        let sink = Sink::default();
        let writer = sink.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_max_level(tracing::Level::DEBUG)
            .event_format(JournalFormat::new())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::error!(port = 5432, "postgres exited");
            tracing::warn!("template build failed");
            tracing::info!("listening");
            tracing::debug!("detail");
        });
        let text = String::from_utf8(sink.0.lock().expect("sink").clone()).expect("utf-8");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[0].starts_with("<3>"), "{text}");
        assert!(lines[0].contains("postgres exited port=5432"), "{text}");
        assert!(lines[1].starts_with("<4>"), "{text}");
        assert!(lines[2].starts_with("<6>"), "{text}");
        assert!(lines[3].starts_with("<7>"), "{text}");
        assert!(
            !text.contains("INFO") && !text.contains("  "),
            "no level word or padding: {text}"
        );
    }
}
