//! `Servers`: one daemon, several PostgreSQL majors. The primary server is the configured
//! one (`--postgres-version`, or the default); a template that names another major
//! (`postgres_version = "16"`), or a lease request for the `default` template of another
//! major, gets a server of that major — its own tuned postgres on tmpfs with a pool of its
//! own, started when first needed and supervised, restarted and budgeted like the primary.
//!
//! Each server is an ordinary pool ([`crate::start`], a [`PoolHandle`]); this router only
//! decides which pool a request goes to, from two facts kept once, in one [`Registry`]
//! behind one `tokio::sync::Mutex`: which further servers exist (by major) and which
//! templates live on one of them (every other template is the primary's).
//!
//! * A registration holds that lock from its check to its act — where the template lives
//!   now, whether the primary has it, placing it, the pool's own register — so two
//!   registrations of one name are one after the other by construction: the second sees
//!   where the first put it. Each pool request made under it is bounded
//!   (`POOL_ANSWER_WAIT`): a stuck pool fails that registration, not every caller queued
//!   on the lock. A server start is never under the lock (it can take minutes
//!   to download): a registration first decides without the lock and starts the server it
//!   needs, then takes the lock and decides again, now for good; templates are placed only
//!   on running servers.
//! * Leases, status and shutdown take the lock only to look things up.
//! * A lease id names its server (`ids.rs`), so a release, renew, keep or drop goes to one
//!   pool, without asking the others.
//!
//! The IntegreSQL API, readiness and systemd speak for the primary.

mod further;
mod ids;
mod registry;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use pglease_binaries::VersionSpec;
use tokio::sync::Mutex;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::child_user::ChildUser;
use crate::config::{PoolConfig, ServerConfig, TemplateConfig, TemplateSource};
use crate::error::{LeaseError, LeaseOpError, StartError};
use crate::handle::PoolHandle;
use crate::names::{LeaseId, TemplateName};
use crate::state::{Changer, Registered};
use crate::types::{
    KeptDatabase, Lease, LeaseRequest, Readiness, ServerStatus, StatusReport, TemplateStatus,
};
use further::{server_version, START_WAIT};
use registry::{home, needs_primary, Ask, Registry, Server};

/// How long a registration waits for a pool's answer (the pool's `register`, the primary's
/// status when it must ask whether the primary has the template). A pool's actor answers
/// both without awaiting SQL (a build runs in a worker), so an answer normally takes
/// microseconds and 30 s means the actor is stuck; without a bound, the registry lock held
/// meanwhile would hang every registration, lease routing and status call behind it for
/// ever. Generous all the same: an actor busy with a burst of commands on a loaded machine
/// is slow, not stuck.
const POOL_ANSWER_WAIT: Duration = Duration::from_secs(30);

/// How often a registration decides again when its template's place changed while the
/// server it needed was starting; more means something keeps moving it.
const REGISTER_ATTEMPTS: usize = 3;

/// The pools of every PostgreSQL server this daemon runs. Cloneable; all clones share one
/// router.
#[derive(Debug, Clone)]
pub struct Servers {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    primary: Server,
    /// What further servers are started from: the primary's configuration, embedded only.
    /// None when the primary is an external server (it serves only its own major).
    base: Option<PoolConfig>,
    /// The further servers and the templates placed on them: see the module's doc.
    registry: Mutex<Registry>,
    /// The majors the operator made available: the primary's and those configured templates
    /// name. Without `PoolConfig::majors_on_request` no request starts another.
    configured_majors: BTreeSet<u32>,
    /// Whose rights a registered source is checked with (the builds read it as that user);
    /// None over a fake pool, which reads no files.
    child_user: Option<ChildUser>,
}

impl Servers {
    /// Starts the primary server and its pool; further servers start when first needed,
    /// or now for templates that name them when `prebuild` is set. Returns the router and
    /// the primary pool's task (it ends when the pool stops).
    pub async fn start(config: PoolConfig) -> Result<(Servers, JoinHandle<()>), StartError> {
        warn_of_unwatched(&config);
        let (own, versioned): (Vec<TemplateConfig>, Vec<TemplateConfig>) = config
            .templates
            .iter()
            .cloned()
            .partition(|t| t.postgres_version.is_none());
        let (primary, task) = start_primary(&config, own).await?;
        let external = matches!(config.server, ServerConfig::External(_));
        let placed = match place_versioned(&primary, versioned, &config).await {
            Ok(placed) => placed,
            Err(error) => {
                primary.handle.shutdown().await;
                return Err(error);
            }
        };
        let child_user = ChildUser::resolve(config.child_user.as_deref())?;
        let configured_majors = configured_majors(primary.major, &config);
        let prebuild: Vec<u32> = if config.prebuild && !external {
            placed.values().copied().collect()
        } else {
            Vec::new()
        };
        let servers = Servers::new(Inner {
            child_user: Some(child_user),
            configured_majors,
            primary,
            base: (!external).then_some(config),
            registry: Mutex::new(Registry {
                placed,
                ..Registry::default()
            }),
        });
        servers.start_in_background(prebuild);
        Ok((servers, task))
    }

    /// Starts the servers of `majors` in the background, for `prebuild`.
    fn start_in_background(&self, majors: Vec<u32>) {
        for major in majors {
            let servers = self.clone();
            tokio::spawn(async move {
                // Failures are logged by the start itself and retried on demand.
                let _ = servers.server(major, None, Duration::from_secs(3600)).await;
            });
        }
    }

    /// A router over one pool: for tests of the HTTP API with a fake pool.
    pub fn single(handle: PoolHandle, major: u32, version: impl Into<String>) -> Servers {
        Servers::new(Inner {
            primary: Server {
                major,
                version: version.into(),
                handle,
                stamp: ids::PRIMARY,
            },
            base: None,
            registry: Mutex::new(Registry::default()),
            child_user: None,
            configured_majors: std::iter::once(major).collect(),
        })
    }

    /// A router over pools already running: the primary (PostgreSQL `major`) and further
    /// servers by major, with the templates placed on them. For in-process tests of real
    /// pools on fake servers (`actor/interleavings.rs`); `base` is what a further server
    /// would start from, but every major it offers runs already.
    #[cfg(test)]
    pub(crate) fn over(
        base: PoolConfig,
        primary: PoolHandle,
        major: u32,
        further: Vec<(u32, PoolHandle)>,
        placed: Vec<(TemplateName, u32)>,
    ) -> Servers {
        let configured_majors = std::iter::once(major)
            .chain(further.iter().map(|(major, _)| *major))
            .collect();
        let slots = further
            .into_iter()
            .filter_map(|(major, handle)| {
                let server = Server {
                    major,
                    version: format!("{major}.1"),
                    handle,
                    stamp: ids::stamp_of(major)?,
                };
                Some((major, registry::Slot::Running(server)))
            })
            .collect();
        Servers::new(Inner {
            primary: Server {
                major,
                version: format!("{major}.1"),
                handle: primary,
                stamp: ids::PRIMARY,
            },
            base: Some(base),
            registry: Mutex::new(Registry {
                slots,
                placed: placed.into_iter().collect(),
                ..Registry::default()
            }),
            child_user: None,
            configured_majors,
        })
    }

    fn new(inner: Inner) -> Servers {
        Servers {
            inner: Arc::new(inner),
        }
    }

    /// The primary server's pool: the one the IntegreSQL API, `/readyz` and systemd's
    /// readiness speak for.
    pub fn primary(&self) -> &PoolHandle {
        &self.inner.primary.handle
    }

    /// Leases a database. A template on a further server is leased there; the `default`
    /// template of a major other than the primary's comes from that major's server
    /// (started now if need be). Every server checks the request's version against its own.
    pub async fn lease(&self, request: LeaseRequest) -> Result<Lease, LeaseError> {
        let started = Instant::now();
        let major = match self.placement(&request.template).await {
            Some(major) => Some(major),
            None if request.template == TemplateName::default_name() => request
                .postgres_version
                .map(VersionSpec::major)
                .filter(|&major| major != self.inner.primary.major && self.inner.base.is_some()),
            None => None,
        };
        let Some(major) = major else {
            return match self.inner.primary.handle.lease(request).await {
                // The primary knows its own templates; those of further servers count too.
                Err(LeaseError::UnknownTemplate {
                    template,
                    mut known,
                }) => {
                    known.extend(self.inner.registry.lock().await.placed.keys().cloned());
                    known.sort();
                    known.dedup();
                    Err(LeaseError::UnknownTemplate { template, known })
                }
                outcome => outcome,
            };
        };
        let server = self
            .server(major, request.postgres_version, request.wait)
            .await?;
        let mut request = request;
        request.wait = request.wait.saturating_sub(started.elapsed());
        server.handle.lease(request).await
    }

    /// Ends a lease, on the server its id names.
    pub async fn release(&self, id: LeaseId, reuse: bool) -> Result<(), LeaseOpError> {
        self.holder(&id).await.handle.release(id, reuse).await
    }

    /// Extends a lease, on the server its id names.
    pub async fn renew(
        &self,
        id: LeaseId,
        ttl: Option<Duration>,
    ) -> Result<SystemTime, LeaseOpError> {
        self.holder(&id).await.handle.renew(id, ttl).await
    }

    /// Ends a lease but keeps its database, on the server its id names.
    pub async fn keep(&self, id: LeaseId, keep: Duration) -> Result<SystemTime, LeaseOpError> {
        self.holder(&id).await.handle.keep(id, keep).await
    }

    /// Every server's kept databases, oldest first.
    pub async fn kept(&self) -> Vec<KeptDatabase> {
        let mut kept = Vec::new();
        for server in self.servers().await {
            kept.extend(server.handle.kept().await);
        }
        kept.sort_by_key(|k| k.kept_at);
        kept
    }

    /// Drops a kept database now, on the server its id names.
    pub async fn drop_kept(&self, id: LeaseId) -> Result<(), LeaseOpError> {
        self.holder(&id).await.handle.drop_kept(id).await
    }

    /// Builds a new version of a template, on its server; the operator's only for a
    /// `changer` that may change them.
    pub async fn rebuild(
        &self,
        template: TemplateName,
        changer: Changer,
    ) -> Result<TemplateStatus, LeaseError> {
        let server = match self.placement(&template).await {
            Some(major) => self.server(major, None, START_WAIT).await?,
            None => self.inner.primary.clone(),
        };
        let mut status = server.handle.rebuild(template, changer).await?;
        status.postgres_version = Some(server.version.clone());
        Ok(status)
    }

    /// Adds or replaces a template. With `postgres_version` it lives on that major's server
    /// (started now if need be); without, where it lives now, else on the primary. A
    /// template cannot move between servers: that is a 409 naming where it is. The pool
    /// holding it decides whether `changer` may change it (the operator's templates).
    pub async fn register(
        &self,
        name: TemplateName,
        source: TemplateSource,
        postgres_version: Option<VersionSpec>,
        changer: Changer,
    ) -> Result<(Registered, TemplateStatus), LeaseError> {
        // Refused before anything is placed, with the rights the build will read it with.
        if let Some(user) = &self.inner.child_user {
            let checked = source.clone();
            let refused = |message: String| LeaseError::InvalidSource {
                template: name.clone(),
                message,
            };
            user.read(move || crate::template::check_source(&checked))
                .await
                .map_err(|e| refused(user.explain(e)))?
                .map_err(|e| refused(user.explain(e)))?;
        }
        for _ in 0..REGISTER_ATTEMPTS {
            // First without the lock, to start the server the template needs outside it.
            let current = self.placement(&name).await;
            if let Some(major) = self.home(&name, postgres_version, current).await? {
                self.server(major, postgres_version, START_WAIT).await?;
            }
            // Then for good, under the lock until the template is placed and registered:
            // no other registration decides in between, and a lease for it sees both the
            // placement and the pool's template, or neither.
            let mut registry = self.inner.registry.lock().await;
            let current = registry.placement(&name);
            let home = self.home(&name, postgres_version, current).await?;
            let server = match home {
                None => self.inner.primary.clone(),
                Some(major) => match registry.running_server(major) {
                    Some(server) => server,
                    // Its place changed while the server it needed was starting.
                    None => continue,
                },
            };
            let newly_placed =
                home.is_some_and(|major| registry.placed.insert(name.clone(), major).is_none());
            let registering = server.handle.register(name.clone(), source, changer);
            // A pool that does not answer: whether it registered the template is unknown,
            // so it stays placed there (a retry goes to the same server instead of
            // splitting the template over two), and the lock is released with the error.
            let registered = answered(&server, "the registration", registering).await?;
            if registered.is_err() && newly_placed {
                registry.placed.remove(&name);
            }
            drop(registry);
            return registered.map(|(registered, mut status)| {
                status.postgres_version = Some(server.version.clone());
                (registered, status)
            });
        }
        Err(LeaseError::Internal(format!(
            "template \"{name}\" kept moving between servers while it was being registered"
        )))
    }

    /// Every server's status: the primary's report, with the templates and leases of the
    /// further servers added and one `servers` entry per server.
    pub async fn status(&self) -> Option<StatusReport> {
        let primary = &self.inner.primary;
        let mut report = primary.handle.status().await?;
        mark(&mut report, primary);
        report.servers = vec![server_status(primary.major, &report)];
        let running = self.inner.registry.lock().await.running();
        for server in running {
            let Some(mut further) = server.handle.status().await else {
                continue;
            };
            mark(&mut further, &server);
            report.servers.push(server_status(server.major, &further));
            report.templates.append(&mut further.templates);
            report.leases.append(&mut further.leases);
        }
        Some(report)
    }

    /// The primary's readiness (further servers start on demand and do not hold it back).
    pub async fn readiness(&self) -> Readiness {
        self.inner.primary.handle.readiness().await
    }

    /// Stops every server: waiting requests fail, each postgres is stopped and its data
    /// directory removed. The primary's task is the caller's to await.
    pub async fn shutdown(&self) {
        let (running, tasks) = {
            let mut registry = self.inner.registry.lock().await;
            registry.stopping = true;
            (registry.running(), std::mem::take(&mut registry.tasks))
        };
        let mut stops = vec![self.inner.primary.handle.clone()];
        stops.extend(running.into_iter().map(|s| s.handle));
        let stopping: Vec<_> = stops
            .into_iter()
            .map(|handle| tokio::spawn(async move { handle.shutdown().await }))
            .collect();
        for stop in stopping {
            let _ = stop.await;
        }
        for task in tasks {
            let _ = task.await;
        }
    }

    /// "PostgreSQL 15.14 (…) and the configured majors 16, 17", for errors.
    fn offered(&self) -> String {
        let others: Vec<String> = self
            .inner
            .configured_majors
            .iter()
            .filter(|&&major| major != self.inner.primary.major)
            .map(u32::to_string)
            .collect();
        let primary = format!("PostgreSQL {}", self.inner.primary.version);
        if others.is_empty() {
            primary
        } else {
            format!("{primary} and the configured majors {}", others.join(", "))
        }
    }

    /// Where a registration of `template` goes (see [`registry::home`]), given where it
    /// lives now; asks the primary whether it has the template when that matters.
    async fn home(
        &self,
        template: &TemplateName,
        version: Option<VersionSpec>,
        current: Option<u32>,
    ) -> Result<Option<u32>, LeaseError> {
        let primary = &self.inner.primary;
        let wanted = version.map(VersionSpec::major);
        let on_primary =
            needs_primary(current, wanted, primary.major) && self.primary_has(template).await?;
        home(&Ask {
            template,
            version,
            current,
            on_primary,
            primary_major: primary.major,
            primary_version: &primary.version,
            further_allowed: self.inner.base.is_some(),
        })
    }

    /// The major of the further server `template` lives on; None for the primary's.
    async fn placement(&self, template: &TemplateName) -> Option<u32> {
        self.inner.registry.lock().await.placement(template)
    }

    /// Whether the primary has `template`; an error when it does not answer (a
    /// registration asks under the registry lock).
    async fn primary_has(&self, template: &TemplateName) -> Result<bool, LeaseError> {
        let primary = &self.inner.primary;
        let report = answered(primary, "a status request", primary.handle.status()).await?;
        Ok(report.is_some_and(|report| report.templates.iter().any(|t| &t.name == template)))
    }

    /// Every running server, the primary first.
    async fn servers(&self) -> Vec<Server> {
        let mut servers = vec![self.inner.primary.clone()];
        servers.extend(self.inner.registry.lock().await.running());
        servers
    }

    /// The server a lease id names. An id that names no running further server is the
    /// primary's to answer.
    async fn holder(&self, id: &LeaseId) -> Server {
        let stamp = ids::stamp(id);
        let further = if stamp == ids::PRIMARY {
            None
        } else {
            self.inner.registry.lock().await.stamped(stamp)
        };
        further.unwrap_or_else(|| self.inner.primary.clone())
    }
}

/// Starts the primary server's pool with the templates that name no major (`own`).
async fn start_primary(
    config: &PoolConfig,
    own: Vec<TemplateConfig>,
) -> Result<(Server, JoinHandle<()>), StartError> {
    let mut primary_config = config.clone();
    primary_config.templates = own;
    let (handle, task) = crate::start(primary_config, ids::PRIMARY).await?;
    let Some((major, version)) = server_version(&handle).await else {
        handle.shutdown().await;
        return Err(StartError::StoppedDuringStart);
    };
    let server = Server {
        major,
        version,
        handle,
        stamp: ids::PRIMARY,
    };
    Ok((server, task))
}

/// Places each template that names a major: the primary's own major registers it on the
/// primary (like a template added over HTTP, built now with `prebuild`); another major is
/// placed on that major's server, which is not running yet. Returns those placements; an
/// error when a template cannot be registered, or names another major than an external
/// server's. The caller stops the primary on an error.
async fn place_versioned(
    primary: &Server,
    versioned: Vec<TemplateConfig>,
    config: &PoolConfig,
) -> Result<HashMap<TemplateName, u32>, StartError> {
    let external = matches!(config.server, ServerConfig::External(_));
    let mut placed = HashMap::new();
    for template in versioned {
        let Some(wanted) = template.postgres_version else {
            continue;
        };
        if wanted.major() == primary.major {
            register_on_primary(primary, &template, config.prebuild).await?;
        } else if external {
            return Err(StartError::OtherMajorOnExternal {
                template: template.name.to_string(),
                asked: wanted.to_string(),
                serving: primary.version.clone(),
            });
        } else {
            // Placed before its server runs: the one exception to "placed only on a
            // running server", made before anyone can ask. Its server starts with it
            // in its configuration.
            placed.insert(template.name.clone(), wanted.major());
        }
    }
    Ok(placed)
}

/// Registers a configured template of the primary's own major on the primary, and builds
/// it now with `prebuild`.
async fn register_on_primary(
    primary: &Server,
    template: &TemplateConfig,
    prebuild: bool,
) -> Result<(), StartError> {
    let registered = primary
        .handle
        .register(
            template.name.clone(),
            template.source.clone(),
            Changer::Configuration,
        )
        .await;
    if let Err(error) = registered {
        return Err(StartError::Template {
            template: template.name.to_string(),
            message: error.to_string(),
        });
    }
    if prebuild {
        let _ = primary
            .handle
            .rebuild(template.name.clone(), Changer::Configuration)
            .await;
    }
    Ok(())
}

/// The majors the operator made available: the primary's and those configured templates
/// name.
fn configured_majors(primary_major: u32, config: &PoolConfig) -> BTreeSet<u32> {
    std::iter::once(primary_major)
        .chain(
            config
                .templates
                .iter()
                .filter_map(|t| t.postgres_version.map(VersionSpec::major)),
        )
        .collect()
}

/// Says at start which migration commands watch nothing: their fingerprint is the command
/// string alone, so an edited migration would silently be missing from later leases.
fn warn_of_unwatched(config: &PoolConfig) {
    for template in config
        .templates
        .iter()
        .filter(|t| t.source.watches_nothing())
    {
        if config.verify_templates {
            tracing::warn!(
                template = %template.name,
                "command template {} watches no file: --verify-templates builds it afresh once \
                 at this start, but an edit of its migrations while pglease runs goes unseen; \
                 give it watch paths (--watch {}=PATH, or watch = [...] in the config file)",
                template.name,
                template.name,
            );
        } else {
            tracing::warn!(
                template = %template.name,
                "command template {} watches no file: its fingerprint is the command alone, \
                 so an edit of its migrations builds no new version; give it watch paths \
                 (--watch {}=PATH, or watch = [...] in the config file), or run with \
                 --verify-templates to build it afresh at each start",
                template.name,
                template.name,
            );
        }
    }
}

/// `request` to `server`'s pool, bounded by [`POOL_ANSWER_WAIT`]: a pool that does not
/// answer in time fails it with 503 (`postgres_unavailable`) instead of holding its caller,
/// and the registry lock that caller may hold, for ever. `what` names the request.
async fn answered<T>(
    server: &Server,
    what: &str,
    request: impl std::future::Future<Output = T>,
) -> Result<T, LeaseError> {
    tokio::time::timeout(POOL_ANSWER_WAIT, request)
        .await
        .map_err(|_| {
            LeaseError::PostgresDown(format!(
                "the PostgreSQL {} server's pool did not answer {what} within {} s; it may be stuck",
                server.major,
                POOL_ANSWER_WAIT.as_secs()
            ))
        })
}

/// Names the server on each template of its report (its live version, which a restart
/// onto new binaries may have changed, else the one it started with).
fn mark(report: &mut StatusReport, server: &Server) {
    let version = report
        .postgres
        .version
        .clone()
        .unwrap_or_else(|| server.version.clone());
    for template in &mut report.templates {
        template.postgres_version = Some(version.clone());
    }
}

fn server_status(major: u32, report: &StatusReport) -> ServerStatus {
    ServerStatus {
        major,
        postgres: report.postgres.clone(),
        templates: report.templates.iter().map(|t| t.name.clone()).collect(),
        drops: report.drops.clone(),
        limits: report.limits.clone(),
    }
}

#[cfg(test)]
mod tests;
