//! `pglease postgres fetch` and `pglease postgres list`: the server binaries without a
//! daemon, through `pglease-binaries`. Only the paths go to stdout; logs go to stderr.

use std::process::ExitCode;

use pglease_binaries::{Available, Request, DEFAULT_REPOSITORY};

use crate::cli::{FetchArgs, ListArgs, PostgresCommand};

/// Runs a `pglease postgres` subcommand.
pub async fn run(command: PostgresCommand) -> ExitCode {
    match command {
        PostgresCommand::Fetch(args) => fetch(args).await,
        PostgresCommand::List(args) => list(args).await,
    }
}

/// Downloads the version into the cache (unless there) and prints its bin directory.
async fn fetch(args: FetchArgs) -> ExitCode {
    let request = Request {
        bin_dir: None,
        version: args.postgres_version,
        cache_root: args
            .cache_dir
            .unwrap_or_else(pglease_binaries::default_cache_root),
        repository: args
            .postgres_repository
            .unwrap_or_else(|| DEFAULT_REPOSITORY.to_owned()),
        progress: crate::download_bar::DownloadBar::shared(),
    };
    match pglease_binaries::fetch(&request).await {
        Ok(resolved) => {
            tracing::info!(origin = %resolved.origin, version = %resolved.version, "fetched");
            println!("{}", resolved.bin_dir.display());
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("pglease: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Prints one line per server: where it is from, its version, its bin directory.
async fn list(args: ListArgs) -> ExitCode {
    let cache_root = args
        .cache_dir
        .unwrap_or_else(pglease_binaries::default_cache_root);
    // It runs `postgres --version` for each server found.
    let listing = tokio::task::spawn_blocking(move || pglease_binaries::list(&cache_root)).await;
    let Ok(listing) = listing else {
        eprintln!("pglease: listing the servers failed");
        return ExitCode::FAILURE;
    };
    let line = |origin: &str, server: &Available| {
        println!(
            "{origin:<9} {:<7} {}",
            server.short_version,
            server.bin_dir.display()
        );
    };
    for server in &listing.installed {
        line("installed", server);
    }
    for server in &listing.cached {
        line("cached", server);
    }
    ExitCode::SUCCESS
}
