//! Direct postgres access: the daemon's superuser over its private unix socket (root can
//! reach it), connections with a lease's URL, and the checks built on them — finding a
//! template database, waiting until the pool is idle. Every connection's driver task is
//! spawned here and awaited on [`Conn::close`], so a "disconnect" is a real one.

use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tokio_postgres::{Client, Config, NoTls};

use crate::api::Api;
use crate::daemon::ServerInfo;
use crate::error::{BenchError, Result};

/// The superuser initdb creates; it may connect only over the unix socket.
pub const SUPERUSER: &str = "postgres";
/// How often [`wait_idle`] polls.
const IDLE_POLL: Duration = Duration::from_millis(20);

/// A connection and its driver task.
pub struct Conn {
    /// The client.
    pub client: Client,
    driver: JoinHandle<()>,
}

impl Conn {
    /// Closes the connection (Terminate) and waits until the socket is closed.
    pub async fn close(self) {
        drop(self.client);
        let _ = self.driver.await;
    }
}

/// Connects with `config` and spawns the driver task.
pub async fn connect_config(config: &Config, what: &str) -> Result<Conn> {
    let (client, connection) = config
        .connect(NoTls)
        .await
        .map_err(|e| BenchError::postgres(format!("cannot connect ({what})"), e))?;
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(Conn { client, driver })
}

/// Connects with a `postgres://` URL (a lease's).
pub async fn connect_url(url: &str) -> Result<Conn> {
    let config: Config = url
        .parse()
        .map_err(|e| BenchError::postgres("cannot parse a lease URL", e))?;
    connect_config(&config, "lease URL").await
}

/// The superuser's connection settings for `dbname` over the daemon's socket.
pub fn superuser_config(server: &ServerInfo, dbname: &str) -> Config {
    socket_config(&server.socket_dir, server.port, dbname)
}

/// The superuser's connection settings for `dbname` over the socket in `socket_dir`
/// (a daemon's, or a server the bench runs itself).
pub fn socket_config(socket_dir: &std::path::Path, port: u16, dbname: &str) -> Config {
    let mut config = Config::new();
    config
        .host_path(socket_dir)
        .port(port)
        .user(SUPERUSER)
        .dbname(dbname)
        .application_name("pglease-bench");
    config
}

/// Connects as the superuser to `dbname`.
pub async fn superuser(server: &ServerInfo, dbname: &str) -> Result<Conn> {
    connect_config(
        &superuser_config(server, dbname),
        &format!("superuser over {}", server.socket_dir.display()),
    )
    .await
}

/// The template database built for `template_name` with `fingerprint`:
/// `pglease_tpl_<name hash>_<first 16 hex of the fingerprint>`.
pub async fn template_database(admin: &Client, fingerprint: &str) -> Result<String> {
    let prefix: String = fingerprint.chars().take(16).collect();
    let rows = admin
        .query(
            "SELECT datname FROM pg_database \
             WHERE datistemplate AND datname LIKE 'pglease\\_tpl\\_%' AND right(datname, 17) = '_' || $1",
            &[&prefix],
        )
        .await
        .map_err(|e| BenchError::postgres("looking up the template database", e))?;
    match rows.as_slice() {
        [row] => Ok(row.get(0)),
        [] => Err(BenchError::Other(format!(
            "no template database for fingerprint {prefix}…"
        ))),
        _ => Err(BenchError::Other(format!(
            "several template databases for fingerprint {prefix}…"
        ))),
    }
}

/// Databases the daemon made that are not templates (ready, leased, or not yet dropped).
pub async fn clone_count(admin: &Client) -> Result<usize> {
    let row = admin
        .query_one(
            "SELECT count(*) FROM pg_database \
             WHERE NOT datistemplate AND datname LIKE 'pglease\\_%' AND datname NOT LIKE 'pglease\\_tpl\\_%'",
            &[],
        )
        .await
        .map_err(|e| BenchError::postgres("counting clones", e))?;
    let count: i64 = row.get(0);
    Ok(usize::try_from(count).unwrap_or(0))
}

/// Waits until the daemon's pool is idle: no lease open, nothing waiting or being made,
/// every template's ready queue at least `min_ready` (`template` only), and no drop
/// pending (the server holds exactly the ready clones). Returns how long it took.
pub async fn wait_idle(
    api: &Api,
    admin: &Client,
    template: &str,
    min_ready: usize,
    limit: Duration,
) -> Result<Duration> {
    let started = Instant::now();
    loop {
        let status = api.status().await?;
        let busy = status
            .templates
            .iter()
            .any(|t| t.leased > 0 || t.in_progress > 0 || t.waiting > 0);
        let ready_here = crate::api::template(&status, template).map_or(0, |t| t.ready);
        let ready_all: usize = status.templates.iter().map(|t| t.ready).sum();
        if !busy && ready_here >= min_ready && clone_count(admin).await? == ready_all {
            return Ok(started.elapsed());
        }
        if started.elapsed() > limit {
            return Err(BenchError::Other(format!(
                "the pool did not become idle within {}s (template {template}: {:?})",
                limit.as_secs(),
                crate::api::template(&status, template)
            )));
        }
        tokio::time::sleep(IDLE_POLL).await;
    }
}

/// Waits until the daemon's pool is quiet: no clone being made, nobody waiting, no drop
/// pending (the server holds exactly the ready and leased clones); leases may be open.
/// Taking a lease starts a refill clone and a release a drop: pglease's background work,
/// which on 2 cores would slow whatever is measured next.
pub async fn wait_quiet(api: &Api, admin: &Client, limit: Duration) -> Result<()> {
    let started = Instant::now();
    loop {
        let status = api.status().await?;
        let quiet = status
            .templates
            .iter()
            .all(|t| t.in_progress == 0 && t.waiting == 0);
        let held: usize = status.templates.iter().map(|t| t.ready + t.leased).sum();
        if quiet && clone_count(admin).await? == held {
            return Ok(());
        }
        if started.elapsed() > limit {
            return Err(BenchError::Other(format!(
                "the pool did not settle within {}s",
                limit.as_secs()
            )));
        }
        tokio::time::sleep(IDLE_POLL).await;
    }
}

/// Runs statements one by one, each outside a transaction (CREATE/DROP DATABASE cannot
/// share a multi-statement batch, which postgres runs as one implicit transaction).
pub async fn execute_each(client: &Client, statements: &[String], what: &str) -> Result<()> {
    for statement in statements {
        client
            .batch_execute(statement)
            .await
            .map_err(|e| BenchError::postgres(what.to_string(), e))?;
    }
    Ok(())
}

/// The SQLSTATE of a postgres error, if it is one the server sent.
pub fn sqlstate(error: &tokio_postgres::Error) -> Option<&str> {
    error.code().map(|code| code.code())
}

/// Quotes an identifier.
pub fn quote_ident(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}
