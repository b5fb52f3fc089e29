//! The daemon's serve path as a library: [`Daemon::start`] binds the ports, starts the pool
//! and spawns the HTTP, IntegreSQL and PostgreSQL-front servers; [`Daemon::serve_until`]
//! serves until a shutdown future resolves and then stops in order (stop accepting
//! connections, stop the pool, within a grace period). [`run`] is both in one call.
//!
//! The binary and the in-process integration tests (tests/it/support) call the same code.
//! Nothing here is process-wide: no signal handlers, no tracing subscriber, no rlimits, no
//! sd_notify and no exit codes; those belong to `main.rs`, which wraps this.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::cli::ServeConfig;
use crate::listen;

/// How long shutdown may take before the daemon gives up waiting.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// With `--snapshot-dir` a stop may write a snapshot: seconds per GB of templates.
const SNAPSHOT_SHUTDOWN_GRACE: Duration = Duration::from_secs(600);

/// Why the daemon could not start, or did not stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A port could not be bound; what and why is logged where it failed.
    #[error("cannot listen on the configured ports")]
    Bind,
    /// The pool (postgres, the template of `default`) could not start.
    #[error("cannot start: {0}")]
    Start(#[source] pglease_pool::StartError),
    /// The pool's task ended while the daemon was serving.
    #[error("the pool stopped unexpectedly")]
    PoolStopped,
    /// Shutdown did not finish within its grace period.
    #[error("shutdown did not finish within {} s", grace.as_secs())]
    ShutdownTimeout {
        /// The grace period that ran out.
        grace: Duration,
    },
}

/// A started daemon: its ports are bound, its pool runs, its servers accept connections.
/// Dropping it without [`Daemon::serve_until`] leaves its tasks to the runtime.
pub struct Daemon {
    http_address: SocketAddr,
    integresql_address: Option<SocketAddr>,
    front_address: Option<SocketAddr>,
    servers: pglease_pool::Servers,
    pool_task: JoinHandle<()>,
    state: pglease_api::AppState,
    stop_http: CancellationToken,
    server: JoinHandle<std::io::Result<()>>,
    integresql_server: Option<JoinHandle<std::io::Result<()>>>,
    front_server: Option<JoinHandle<()>>,
    grace: Duration,
}

impl Daemon {
    /// Binds every configured port (before postgres starts, so that a taken port fails
    /// fast), starts the pool and spawns the servers on the current runtime.
    pub async fn start(config: ServeConfig) -> Result<Daemon, RunError> {
        let listeners = listen::bind(&config).await.map_err(|()| RunError::Bind)?;
        let listener = listeners.http;
        let grace = match &config.pool.server {
            pglease_pool::ServerConfig::Embedded(e) if e.snapshot_dir.is_some() => {
                SNAPSHOT_SHUTDOWN_GRACE
            }
            _ => SHUTDOWN_GRACE,
        };
        let (servers, pool_task) = pglease_pool::Servers::start(config.pool)
            .await
            .map_err(RunError::Start)?;
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
        let stop_http = CancellationToken::new();
        // A bound listener knows its address; the fallback only keeps a log line whole.
        let http_address = listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        let base = listen::local_url_base(&listener);
        // Tests and scripts read `addr=` from this line: it stays the last field.
        tracing::info!(addr = %http_address, "listening; lease with: curl -X POST{auth} {base}/lease");
        let server = tokio::spawn(pglease_api::serve(
            listener,
            state.clone(),
            stop_http.clone().cancelled_owned(),
        ));
        let mut integresql_address = None;
        let integresql_server = listeners.integresql.map(|listener| {
            integresql_address = listener.local_addr().ok();
            let address = integresql_address.map(|a| a.to_string()).unwrap_or_default();
            let base = listen::local_url_base(&listener);
            tracing::info!(addr = %address, "serving the IntegreSQL API: INTEGRESQL_CLIENT_BASE_URL={base}/api");
            let stop = stop_http.clone().cancelled_owned();
            tokio::spawn(pglease_api::serve_integresql(listener, state.clone(), stop))
        });
        let mut front_address = None;
        let front_server = front.map(|(listener, front)| {
            front_address = listener.local_addr().ok();
            listen::spawn_front(listener, front, stop_http.clone())
        });
        Ok(Daemon {
            http_address,
            integresql_address,
            front_address,
            servers,
            pool_task,
            state,
            stop_http,
            server,
            integresql_server,
            front_server,
            grace,
        })
    }

    /// The address the HTTP API listens on (with port 0, the one it got).
    pub fn http_address(&self) -> SocketAddr {
        self.http_address
    }

    /// The address the IntegreSQL API listens on, when it has a port of its own.
    pub fn integresql_address(&self) -> Option<SocketAddr> {
        self.integresql_address
    }

    /// The address the PostgreSQL front listens on, when it runs.
    pub fn front_address(&self) -> Option<SocketAddr> {
        self.front_address
    }

    /// The primary server's pool, for what watches it from outside (systemd's readiness).
    pub fn pool(&self) -> &pglease_pool::PoolHandle {
        self.servers.primary()
    }

    /// Serves until `shutdown` resolves, then stops in order: stop accepting HTTP and
    /// PostgreSQL-front connections, stop the pool (postgres, its data dir), wait for the
    /// servers, all within the grace period. Fails when the pool stops by itself first.
    pub async fn serve_until(
        mut self,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), RunError> {
        tokio::select! {
            () = shutdown => {}
            _ = &mut self.pool_task => {
                // The servers go too, so that a caller in the same process keeps no
                // half-alive daemon behind.
                self.stop_http.cancel();
                return Err(RunError::PoolStopped);
            }
        }
        self.state.begin_shutdown();
        self.stop_http.cancel();
        let grace = self.grace;
        let stopped = tokio::time::timeout(grace, async {
            self.servers.shutdown().await;
            let _ = self.pool_task.await;
            let _ = self.server.await;
            if let Some(integresql_server) = self.integresql_server {
                let _ = integresql_server.await;
            }
            if let Some(front_server) = self.front_server {
                let _ = front_server.await;
            }
        })
        .await;
        match stopped {
            Ok(()) => Ok(()),
            Err(_) => Err(RunError::ShutdownTimeout { grace }),
        }
    }
}

/// Runs the daemon of `config` until `shutdown` resolves: [`Daemon::start`], then
/// [`Daemon::serve_until`].
pub async fn run(
    config: ServeConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), RunError> {
    Daemon::start(config).await?.serve_until(shutdown).await
}
