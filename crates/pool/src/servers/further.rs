//! Starting a further server: the first request that needs a major starts its server in a
//! task of its own, later ones wait for the same start, and a failed start answers every
//! request for a while with the same error instead of starting (or downloading) anew.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use pglease_binaries::VersionSpec;
use tokio::sync::watch;
use tokio::time::Instant;

use super::ids;
use super::registry::{Server, Slot, StartOutcome};
use super::Servers;
use crate::config::{PoolConfig, ServerConfig};
use crate::error::{LeaseError, StartError};
use crate::handle::PoolHandle;
use crate::names::TemplateName;

/// A server whose start failed is not tried again for this long: requests meanwhile get
/// the same error at once instead of each starting (or downloading) anew.
const START_RETRY_AFTER: Duration = Duration::from_secs(10);

/// How long a template operation waits for its server to start.
pub(super) const START_WAIT: Duration = Duration::from_secs(600);

impl Servers {
    /// The server of `major`, started now if it is not running: the first caller starts it
    /// (in a task of its own, so a caller that gives up does not cancel it), later callers
    /// wait for the same start, up to `wait`.
    pub(super) async fn server(
        &self,
        major: u32,
        asked: Option<VersionSpec>,
        wait: Duration,
    ) -> Result<Server, LeaseError> {
        let Some(base) = &self.inner.base else {
            return Err(LeaseError::VersionNotServed {
                template: TemplateName::default_name(),
                asked: asked.map_or_else(|| major.to_string(), |v| v.to_string()),
                serving: self.inner.primary.version.clone(),
            });
        };
        let mut outcome = {
            let mut registry = self.inner.registry.lock().await;
            match registry.slots.get(&major) {
                Some(Slot::Running(server)) => return Ok(server.clone()),
                Some(Slot::Failed { at, error }) if at.elapsed() < START_RETRY_AFTER => {
                    return Err(start_failed(major, error));
                }
                Some(Slot::Starting(outcome)) => outcome.clone(),
                Some(Slot::Failed { .. }) | None => {
                    if registry.stopping {
                        return Err(LeaseError::ShuttingDown);
                    }
                    let offered =
                        base.majors_on_request || self.inner.configured_majors.contains(&major);
                    let stamp = ids::stamp_of(major).filter(|_| offered);
                    let Some(stamp) = stamp else {
                        return Err(LeaseError::VersionNotOffered {
                            asked: asked.map_or_else(|| major.to_string(), |v| v.to_string()),
                            offered: self.offered(),
                        });
                    };
                    let (send, outcome) = watch::channel(None);
                    registry
                        .slots
                        .insert(major, Slot::Starting(outcome.clone()));
                    let config = further_config(base, &registry.placed, major, asked);
                    let servers = self.clone();
                    tokio::spawn(
                        async move { servers.start_further(major, stamp, config, send).await },
                    );
                    outcome
                }
            }
        };
        let waited = tokio::time::timeout(wait, outcome.wait_for(Option::is_some)).await;
        match waited {
            Err(_) => Err(LeaseError::PostgresDown(format!(
                "the PostgreSQL {major} server is still starting (a first start may download \
                 its binaries); try again shortly"
            ))),
            Ok(Err(_)) => Err(LeaseError::ShuttingDown),
            Ok(Ok(result)) => match result.as_ref() {
                Some(Ok(server)) => Ok(server.clone()),
                Some(Err(error)) => Err(start_failed(major, error)),
                None => Err(LeaseError::Internal("a server start ended unseen".into())),
            },
        }
    }

    /// Starts the `major` server, records how that went, and tells those waiting for it.
    async fn start_further(
        self,
        major: u32,
        stamp: u8,
        config: PoolConfig,
        send: watch::Sender<Option<StartOutcome>>,
    ) {
        tracing::info!(
            major,
            "starting a PostgreSQL {major} server (first needed now)"
        );
        let started = async {
            let (handle, task) = crate::start(config, stamp).await?;
            let Some((_, version)) = server_version(&handle).await else {
                return Err(StartError::StoppedDuringStart);
            };
            let server = Server {
                major,
                version,
                handle,
                stamp,
            };
            Ok((server, task))
        }
        .await;
        let (outcome, task): (StartOutcome, _) = match started {
            Ok((server, task)) => {
                tracing::info!(major, version = %server.version, "PostgreSQL {major} server started");
                (Ok(server), Some(task))
            }
            Err(error) => {
                tracing::error!(major, %error, "cannot start the PostgreSQL {major} server");
                (Err(Arc::new(error)), None)
            }
        };
        // Recorded under the lock, which shutdown also takes: either shutdown sees this
        // server running and stops it, or this sees shutdown begun and stops it here.
        let stop_now = {
            let mut registry = self.inner.registry.lock().await;
            let slot = match &outcome {
                Ok(server) => Slot::Running(server.clone()),
                Err(error) => Slot::Failed {
                    at: Instant::now(),
                    error: Arc::clone(error),
                },
            };
            registry.slots.insert(major, slot);
            match task {
                Some(task) if registry.stopping => Some(task),
                Some(task) => {
                    registry.tasks.push(task);
                    None
                }
                None => None,
            }
        };
        if let (Some(task), Ok(server)) = (stop_now, &outcome) {
            server.handle.shutdown().await;
            let _ = task.await;
        }
        let _ = send.send(Some(outcome));
    }
}

/// The configuration of the `major` server: the primary's, with that version, the
/// configured templates placed there, a free port and a data directory of its own.
fn further_config(
    base: &PoolConfig,
    placed: &std::collections::HashMap<TemplateName, u32>,
    major: u32,
    asked: Option<VersionSpec>,
) -> PoolConfig {
    let mut config = base.clone();
    config.templates = base
        .templates
        .iter()
        .filter(|t| placed.get(&t.name) == Some(&major))
        .cloned()
        .map(|mut t| {
            t.postgres_version = None;
            t
        })
        .collect();
    if let ServerConfig::Embedded(embedded) = &mut config.server {
        embedded.postgres_version = Some(match asked {
            Some(spec) if spec.major() == major => spec,
            _ => VersionSpec::Major(major),
        });
        embedded.bin_dir = None;
        embedded.port = None;
        embedded.data_dir = embedded.data_dir.as_ref().map(|dir| sibling(dir, major));
    }
    config
}

/// What a request for a server whose start failed gets (503, naming why).
fn start_failed(major: u32, error: &Arc<StartError>) -> LeaseError {
    LeaseError::ServerStart {
        major,
        source: Arc::clone(error),
    }
}

/// `<dir>-pg<major>` beside the primary's data directory.
fn sibling(dir: &Path, major: u32) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(format!("-pg{major}"));
    dir.with_file_name(name)
}

/// The server's major and `server_version`, from its pool's status.
pub(super) async fn server_version(handle: &PoolHandle) -> Option<(u32, String)> {
    let version = handle.status().await?.postgres.version?;
    let (major, _) = pglease_binaries::parse_version_number(&version)?;
    Some((major, version))
}
