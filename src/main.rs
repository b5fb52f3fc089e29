//! The `pglease` binary: parses the command line, and either runs the daemon (the
//! library's `pglease::Daemon`, with the process-wide parts around it: logging, signals,
//! rlimits, sd_notify, exit codes), acts as a client of one, or manages server binaries
//! (`pglease postgres`). It only wires the crates together.

mod client;
mod docs;
mod download_bar;
mod logging;
mod open_files;
mod postgres;
mod signal;
mod snapshot;
mod systemd;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use cli::{Cli, Command, ServeArgs, SnapshotCommand};
// The command line is the library's (tests parse serve's flags with it too); the client
// modules here reach it as `crate::cli`.
use pglease::cli;

/// Exit code for configuration that parses but does not validate (EX_USAGE).
pub(crate) const EXIT_CONFIG: u8 = 64;

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("pglease: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => serve(*args).await,
            Command::Lease(args) => client::lease(args).await.map(|()| ExitCode::SUCCESS),
            Command::Release(args) => client::release(args).await.map(|()| ExitCode::SUCCESS),
            Command::Renew(args) => client::renew(args).await.map(|()| ExitCode::SUCCESS),
            Command::Status(args) => client::status(args).await.map(|()| ExitCode::SUCCESS),
            Command::Kept(args) => client::kept(args).await.map(|()| ExitCode::SUCCESS),
            Command::Ready(args) => client::ready(args).await.map(|()| ExitCode::SUCCESS),
            Command::Run(args) => client::run(args).await,
            Command::Postgres(command) => Ok(postgres::run(command).await),
            Command::Snapshot(SnapshotCommand::Save(args)) => Ok(snapshot::save(*args).await),
            Command::Snapshot(SnapshotCommand::Show(args)) => Ok(snapshot::show(args)),
            Command::Completions(args) => Ok(docs::completions(&args)),
            Command::Man(args) => Ok(docs::man(&args)),
        }
        .or_else(|client::ClientError(message)| {
            eprintln!("pglease: {message}");
            Ok::<_, ()>(ExitCode::FAILURE)
        })
    });
    // Work still running on the runtime's blocking threads (a copy, a hash of a huge
    // source) must not hold the exit: dropping the runtime would wait for it without end.
    runtime.shutdown_timeout(Duration::from_secs(2));
    outcome.unwrap_or(ExitCode::FAILURE)
}

/// Runs the daemon until SIGTERM/SIGINT (the library's [`pglease::Daemon`]), with what is
/// process-wide around it: signal handlers, the open-files limit, systemd's notifications,
/// and the exit code.
async fn serve(args: ServeArgs) -> Result<ExitCode, client::ClientError> {
    let mut config = match args.into_config() {
        Ok(config) => config,
        Err(message) => {
            eprintln!("pglease: {message}");
            return Ok(ExitCode::from(EXIT_CONFIG));
        }
    };
    download_bar::DownloadBar::show_for(&mut config.pool);
    config.config_from.log();
    let mut shutdown = match signal::ShutdownSignal::install() {
        Ok(shutdown) => shutdown,
        Err(error) => {
            tracing::error!(%error, "cannot install signal handlers");
            return Ok(ExitCode::FAILURE);
        }
    };
    open_files::raise();
    let daemon = match pglease::Daemon::start(config).await {
        Ok(daemon) => daemon,
        // What could not be bound is logged where it failed.
        Err(pglease::RunError::Bind) => return Ok(ExitCode::FAILURE),
        Err(error) => {
            tracing::error!("{error}");
            return Ok(ExitCode::FAILURE);
        }
    };
    systemd::spawn(daemon.pool().clone());
    let shutdown = async move {
        shutdown.recv().await;
        systemd::stopping();
    };
    match daemon.serve_until(shutdown).await {
        Ok(()) => {
            tracing::info!("stopped");
            Ok(ExitCode::SUCCESS)
        }
        Err(pglease::RunError::ShutdownTimeout { grace }) => {
            tracing::warn!(
                grace_secs = grace.as_secs(),
                "shutdown did not finish in time; exiting anyway"
            );
            Ok(ExitCode::FAILURE)
        }
        Err(error) => {
            tracing::error!("{error}");
            Ok(ExitCode::FAILURE)
        }
    }
}
