//! The `pglease` binary: parses the command line, and either runs the daemon (pool + HTTP
//! API), acts as a client of one, or manages server binaries (`pglease postgres`). It only
//! wires the crates together.

mod cli;
mod client;
mod docs;
mod listen;
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

/// Exit code for configuration that parses but does not validate (EX_USAGE).
pub(crate) const EXIT_CONFIG: u8 = 64;
/// How long shutdown may take before the daemon gives up waiting.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// With `--snapshot-dir` a stop may write a snapshot: seconds per GB of templates.
const SNAPSHOT_SHUTDOWN_GRACE: Duration = Duration::from_secs(600);

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

/// Runs the daemon until SIGTERM/SIGINT: binds, starts the pool, serves, then stops in
/// order — stop accepting HTTP and PostgreSQL-front connections, stop the pool (postgres,
/// data dir), within a grace period.
async fn serve(args: ServeArgs) -> Result<ExitCode, client::ClientError> {
    let config = match args.into_config() {
        Ok(config) => config,
        Err(message) => {
            eprintln!("pglease: {message}");
            return Ok(ExitCode::from(EXIT_CONFIG));
        }
    };
    config.config_from.log();
    let mut shutdown = match signal::ShutdownSignal::install() {
        Ok(shutdown) => shutdown,
        Err(error) => {
            tracing::error!(%error, "cannot install signal handlers");
            return Ok(ExitCode::FAILURE);
        }
    };
    open_files::raise();
    // Both ports before postgres starts, so a taken port fails fast.
    let Ok(listeners) = listen::bind(&config).await else {
        return Ok(ExitCode::FAILURE);
    };
    let listener = listeners.http;
    let grace = match &config.pool.server {
        pglease_pool::ServerConfig::Embedded(e) if e.snapshot_dir.is_some() => {
            SNAPSHOT_SHUTDOWN_GRACE
        }
        _ => SHUTDOWN_GRACE,
    };
    let (servers, mut pool_task) = match pglease_pool::Servers::start(config.pool).await {
        Ok(started) => started,
        Err(error) => {
            tracing::error!("cannot start: {error}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let auth = match config.api.token {
        Some(_) => " -H \"Authorization: Bearer $PGLEASE_TOKEN\"",
        None => "",
    };
    let front = listeners.front.map(|listener| {
        (
            listener,
            pglease_front::FrontHandle::new(servers.clone(), config.front),
        )
    });
    let mut state = pglease_api::AppState::new(servers.clone(), config.api);
    if let Some((_, front)) = &front {
        state = state.with_front(front.clone());
    }
    systemd::spawn(servers.primary().clone());
    let stop_http = tokio_util::sync::CancellationToken::new();
    let address = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let base = listen::local_url_base(&listener);
    tracing::info!(addr = %address, "listening; lease with: curl -X POST{auth} {base}/lease");
    let server = tokio::spawn(pglease_api::serve(
        listener,
        state.clone(),
        stop_http.clone().cancelled_owned(),
    ));
    let integresql_server = listeners.integresql.map(|listener| {
        let address = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
        let base = listen::local_url_base(&listener);
        tracing::info!(addr = %address, "serving the IntegreSQL API: INTEGRESQL_CLIENT_BASE_URL={base}/api");
        let stop = stop_http.clone().cancelled_owned();
        tokio::spawn(pglease_api::serve_integresql(listener, state.clone(), stop))
    });
    let front_server =
        front.map(|(listener, front)| listen::spawn_front(listener, front, stop_http.clone()));
    tokio::select! {
        () = shutdown.recv() => {}
        _ = &mut pool_task => {
            tracing::error!("the pool stopped unexpectedly");
            return Ok(ExitCode::FAILURE);
        }
    }
    systemd::stopping();
    state.begin_shutdown();
    stop_http.cancel();
    let stopped = tokio::time::timeout(grace, async {
        servers.shutdown().await;
        let _ = pool_task.await;
        let _ = server.await;
        if let Some(integresql_server) = integresql_server {
            let _ = integresql_server.await;
        }
        if let Some(front_server) = front_server {
            let _ = front_server.await;
        }
    })
    .await;
    if stopped.is_err() {
        tracing::warn!(
            grace_secs = grace.as_secs(),
            "shutdown did not finish in time; exiting anyway"
        );
        return Ok(ExitCode::FAILURE);
    }
    tracing::info!("stopped");
    Ok(ExitCode::SUCCESS)
}
