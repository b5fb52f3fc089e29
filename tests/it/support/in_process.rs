//! The daemon in the test process: `pglease::Daemon` (the serve path the binary runs),
//! configured by the same clap `Cli` from the same arguments a test would give the binary,
//! on a tokio runtime of its own (on a thread of its own), so that a test's `Drop` can stop
//! it synchronously and a test's runtime ending does not cut it short.
//!
//! Each daemon's log is its own: a process-wide tracing subscriber writes each line to the
//! log of the daemon whose runtime thread emitted it (a thread-local set as each runtime
//! thread starts). Lines from threads the pool starts itself (postgres' output reader, the
//! source reader) are not captured; a test that reads those runs the daemon as a process.
//!
//! What only a process has stays with [`super::DaemonBuilder::process`]: a pid, signals,
//! kill -9, environment variables, a working directory, the binary's exit code and output.

use std::cell::RefCell;
use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex, Once};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use clap::Parser;
use pglease::cli::{Cli, Command};
use tracing_subscriber::fmt::MakeWriter;

/// A daemon's log lines, shared with whoever reads them.
pub type Log = Arc<Mutex<Vec<String>>>;

thread_local! {
    /// The log of the daemon whose runtime runs on this thread, if any.
    static SINK: RefCell<Option<Log>> = const { RefCell::new(None) };
}

/// Writes what the subscriber formats into the current thread's daemon log, if it has one.
struct ThreadSink;

/// One formatted event, bound for one daemon's log (or nowhere).
struct LineWriter(Option<Log>);

impl Write for LineWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Some(log) = &self.0 {
            let text = String::from_utf8_lossy(buf);
            let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
            log.extend(text.lines().map(str::to_owned));
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for ThreadSink {
    type Writer = LineWriter;

    fn make_writer(&'a self) -> LineWriter {
        LineWriter(SINK.with(|sink| sink.borrow().clone()))
    }
}

/// Once per test process: the subscriber that routes lines to their daemon's log, in the
/// format the binary writes with `RUST_LOG=info` on a pipe; and the open-files limit the
/// binary raises for itself, which the daemons in this process share.
fn init_process() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
            .with_writer(ThreadSink)
            .with_ansi(false)
            .log_internal_errors(false)
            .try_init();
        use nix::sys::resource::{getrlimit, setrlimit, Resource};
        if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    });
}

/// A daemon running in this process.
pub struct InProcess {
    /// Dropped or sent: the daemon stops.
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// The runtime's thread; its result is the daemon's.
    thread: Option<JoinHandle<Result<(), String>>>,
}

impl InProcess {
    /// Starts a daemon of `pglease serve <args>` and waits up to `timeout` until it
    /// listens; returns it with its HTTP address, or the reason it did not start.
    pub async fn start(
        args: Vec<String>,
        log: Log,
        timeout: Duration,
    ) -> Result<(InProcess, SocketAddr), String> {
        init_process();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<SocketAddr, String>>();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("pglease-in-process".into())
            .spawn(move || run(args, log, ready_tx, stop_rx))
            .map_err(|e| format!("cannot start the daemon's thread: {e}"))?;
        let mut daemon = InProcess {
            stop: Some(stop_tx),
            thread: Some(thread),
        };
        let ready = tokio::task::spawn_blocking(move || ready_rx.recv_timeout(timeout))
            .await
            .map_err(|e| format!("join: {e}"))?;
        match ready {
            Ok(Ok(address)) => Ok((daemon, address)),
            Ok(Err(message)) => Err(message),
            Err(_) => {
                daemon.stop_within(Duration::from_secs(20));
                Err(format!("the daemon did not listen within {timeout:?}"))
            }
        }
    }

    /// Stops the daemon as SIGTERM stops the binary, and waits up to `timeout`; returns
    /// the status the binary would exit with (0, else 1), or `None` if it is still going.
    pub fn stop_within(&mut self, timeout: Duration) -> Option<ExitStatus> {
        drop(self.stop.take());
        let thread = self.thread.take()?;
        let started = Instant::now();
        while !thread.is_finished() {
            if started.elapsed() > timeout {
                // A thread cannot be killed; it ends with the test process.
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let code = match thread.join() {
            Ok(Ok(())) => 0,
            _ => 1,
        };
        Some(ExitStatus::from_raw(code << 8))
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        // A failed test still stops its daemon cleanly, so no postgres or tmpfs dir is left.
        self.stop_within(Duration::from_secs(20));
    }
}

/// The daemon's thread: a runtime whose threads log into `log`, the binary's `serve`
/// path on it, and the runtime's end.
fn run(
    args: Vec<String>,
    log: Log,
    ready: std::sync::mpsc::Sender<Result<SocketAddr, String>>,
    stop: tokio::sync::oneshot::Receiver<()>,
) -> Result<(), String> {
    SINK.with(|sink| *sink.borrow_mut() = Some(Arc::clone(&log)));
    let thread_log = Arc::clone(&log);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        // What the binary gets on these 2-core machines, without taking more per daemon
        // on a bigger one where many tests run at once.
        .worker_threads(2)
        .enable_all()
        .on_thread_start(move || {
            SINK.with(|sink| *sink.borrow_mut() = Some(Arc::clone(&thread_log)));
        })
        .build()
        .map_err(|e| format!("cannot start the daemon's runtime: {e}"))?;
    let outcome = runtime.block_on(async {
        let cli = Cli::try_parse_from(args).map_err(|e| e.to_string())?;
        let Command::Serve(serve) = cli.command else {
            return Err("not a serve command".to_owned());
        };
        let config = serve.into_config()?;
        config.config_from.log();
        let daemon = pglease::Daemon::start(config)
            .await
            .map_err(|e| e.to_string())?;
        let _ = ready.send(Ok(daemon.http_address()));
        let stopped = async {
            let _ = stop.await;
            tracing::info!("shutting down");
        };
        daemon.serve_until(stopped).await.map_err(|e| e.to_string())
    });
    if let Err(message) = &outcome {
        // Before it listened, the waiting test learns why; after, this goes nowhere.
        let _ = ready.send(Err(message.clone()));
        tracing::error!("{message}");
    } else {
        tracing::info!("stopped");
    }
    // As the binary does: work left on blocking threads does not hold the stop.
    runtime.shutdown_timeout(Duration::from_secs(2));
    outcome
}
