//! `Servers`: one daemon, several PostgreSQL majors. The primary server is the configured
//! one (`--postgres-version`, or the default); a template that names another major
//! (`postgres_version = "16"`), or a lease request for the `default` template of another
//! major, gets a server of that major — its own tuned postgres on tmpfs with a pool of its
//! own, started when first needed and supervised, restarted and budgeted like the primary.
//!
//! Each server is an ordinary pool ([`crate::start`], a [`PoolHandle`]); this router only
//! decides which pool a request goes to. It owns two things: which servers exist
//! (`slots`, by major) and which templates live on a server other than the primary
//! (`placed`). Lease ids are random, so a release or renew is simply offered to each
//! server until one knows the id. The IntegreSQL API is the primary's alone.

use crate::child_user::ChildUser;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use pglease_binaries::VersionSpec;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::config::{PoolConfig, ServerConfig, TemplateConfig, TemplateSource};
use crate::error::{LeaseError, LeaseOpError, StartError};
use crate::handle::PoolHandle;
use crate::names::{LeaseId, TemplateName};
use crate::state::Registered;
use crate::types::{
    KeptDatabase, Lease, LeaseRequest, Readiness, ServerStatus, StatusReport, TemplateStatus,
};

/// A server whose start failed is not tried again for this long: requests meanwhile get
/// the same error at once instead of each starting (or downloading) anew.
const START_RETRY_AFTER: Duration = Duration::from_secs(10);

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
    /// Further servers, by major.
    slots: Mutex<BTreeMap<u32, Slot>>,
    /// Templates that live on a further server, and its major. Every other template is the
    /// primary's.
    placed: Mutex<HashMap<TemplateName, u32>>,
    /// The further servers' pool tasks, awaited at shutdown.
    tasks: Mutex<Vec<JoinHandle<()>>>,
    stopping: std::sync::atomic::AtomicBool,
    /// The majors the operator made available: the primary's and those configured templates
    /// name. Without `PoolConfig::majors_on_request` no request starts another.
    configured_majors: std::collections::BTreeSet<u32>,
    /// Whose rights a registered source is checked with (the builds read it as that user);
    /// None over a fake pool, which reads no files.
    child_user: Option<ChildUser>,
}

/// One running server: its major, what it reports as its version, and its pool.
#[derive(Debug, Clone)]
struct Server {
    major: u32,
    /// `server_version`, e.g. "18.6" or "15.14 (Debian 15.14-0+deb12u1)".
    version: String,
    handle: PoolHandle,
}

/// A further server's life.
#[derive(Debug)]
enum Slot {
    /// Being started; the receiver sees the outcome.
    Starting(watch::Receiver<Option<Result<Server, String>>>),
    Running(Server),
    /// The last start failed; not retried before `START_RETRY_AFTER`.
    Failed {
        at: Instant,
        error: String,
    },
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
        let mut primary_config = config.clone();
        primary_config.templates = own;
        let (handle, task) = crate::start(primary_config).await?;
        let Some((major, version)) = server_version(&handle).await else {
            handle.shutdown().await;
            return Err(StartError::StoppedDuringStart);
        };
        let primary = Server {
            major,
            version,
            handle,
        };
        let external = matches!(config.server, ServerConfig::External(_));
        let mut placed = HashMap::new();
        for template in versioned {
            let Some(wanted) = template.postgres_version else {
                continue;
            };
            if wanted.major() == primary.major {
                // The primary's own major: registered there like a template added over HTTP.
                let registered = primary
                    .handle
                    .register(template.name.clone(), template.source.clone())
                    .await;
                if let Err(error) = registered {
                    primary.handle.shutdown().await;
                    return Err(StartError::Template {
                        template: template.name.to_string(),
                        message: error.to_string(),
                    });
                }
                if config.prebuild {
                    let _ = primary.handle.rebuild(template.name.clone()).await;
                }
            } else if external {
                primary.handle.shutdown().await;
                return Err(StartError::OtherMajorOnExternal {
                    template: template.name.to_string(),
                    asked: wanted.to_string(),
                    serving: primary.version.clone(),
                });
            } else {
                placed.insert(template.name.clone(), wanted.major());
            }
        }
        let child_user = ChildUser::resolve(config.child_user.as_deref())?;
        let configured_majors = std::iter::once(primary.major)
            .chain(
                config
                    .templates
                    .iter()
                    .filter_map(|t| t.postgres_version.map(VersionSpec::major)),
            )
            .collect();
        let servers = Servers {
            inner: Arc::new(Inner {
                child_user: Some(child_user),
                configured_majors,
                primary,
                base: (!external).then_some(config),
                slots: Mutex::new(BTreeMap::new()),
                placed: Mutex::new(placed),
                tasks: Mutex::new(Vec::new()),
                stopping: std::sync::atomic::AtomicBool::new(false),
            }),
        };
        if servers
            .inner
            .base
            .as_ref()
            .is_some_and(|base| base.prebuild)
        {
            let majors: Vec<u32> = lock(&servers.inner.placed).values().copied().collect();
            for major in majors {
                let servers = servers.clone();
                tokio::spawn(async move {
                    // Failures are logged by the start itself and retried on demand.
                    let _ = servers.server(major, None, Duration::from_secs(3600)).await;
                });
            }
        }
        Ok((servers, task))
    }

    /// A router over one pool: for tests of the HTTP API with a fake pool.
    pub fn single(handle: PoolHandle, major: u32, version: impl Into<String>) -> Servers {
        Servers {
            inner: Arc::new(Inner {
                primary: Server {
                    major,
                    version: version.into(),
                    handle,
                },
                base: None,
                slots: Mutex::new(BTreeMap::new()),
                placed: Mutex::new(HashMap::new()),
                tasks: Mutex::new(Vec::new()),
                stopping: std::sync::atomic::AtomicBool::new(false),
                child_user: None,
                configured_majors: std::iter::once(major).collect(),
            }),
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
        let major = match self.placement(&request.template) {
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
                    known.extend(lock(&self.inner.placed).keys().cloned());
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

    /// Ends a lease, on whichever server holds it.
    pub async fn release(&self, id: LeaseId, reuse: bool) -> Result<(), LeaseOpError> {
        for handle in self.handles() {
            match handle.release(id.clone(), reuse).await {
                Err(LeaseOpError::NotFound(_)) => continue,
                outcome => return outcome,
            }
        }
        Err(LeaseOpError::NotFound(id.as_str().to_owned()))
    }

    /// Extends a lease, on whichever server holds it.
    pub async fn renew(
        &self,
        id: LeaseId,
        ttl: Option<Duration>,
    ) -> Result<SystemTime, LeaseOpError> {
        for handle in self.handles() {
            match handle.renew(id.clone(), ttl).await {
                Err(LeaseOpError::NotFound(_)) => continue,
                outcome => return outcome,
            }
        }
        Err(LeaseOpError::NotFound(id.as_str().to_owned()))
    }

    /// Ends a lease but keeps its database, on whichever server holds it.
    pub async fn keep(&self, id: LeaseId, keep: Duration) -> Result<SystemTime, LeaseOpError> {
        for handle in self.handles() {
            match handle.keep(id.clone(), keep).await {
                Err(LeaseOpError::NotFound(_)) => continue,
                outcome => return outcome,
            }
        }
        Err(LeaseOpError::NotFound(id.as_str().to_owned()))
    }

    /// Every server's kept databases, oldest first.
    pub async fn kept(&self) -> Vec<KeptDatabase> {
        let mut kept = Vec::new();
        for handle in self.handles() {
            kept.extend(handle.kept().await);
        }
        kept.sort_by_key(|k| k.kept_at);
        kept
    }

    /// Drops a kept database now, on whichever server has it.
    pub async fn drop_kept(&self, id: LeaseId) -> Result<(), LeaseOpError> {
        for handle in self.handles() {
            match handle.drop_kept(id.clone()).await {
                Err(LeaseOpError::NotKept(_)) => continue,
                outcome => return outcome,
            }
        }
        Err(LeaseOpError::NotKept(id.as_str().to_owned()))
    }

    /// Builds a new version of a template, on its server.
    pub async fn rebuild(&self, template: TemplateName) -> Result<TemplateStatus, LeaseError> {
        let server = match self.placement(&template) {
            Some(major) => self.server(major, None, START_WAIT).await?,
            None => self.inner.primary.clone(),
        };
        let mut status = server.handle.rebuild(template).await?;
        status.postgres_version = Some(server.version.clone());
        Ok(status)
    }

    /// Adds or replaces a template. With `postgres_version` it lives on that major's server
    /// (started now if need be); without, where it lives now, else on the primary. A
    /// template cannot move between servers: that is a 409 naming where it is.
    pub async fn register(
        &self,
        name: TemplateName,
        source: TemplateSource,
        postgres_version: Option<VersionSpec>,
    ) -> Result<(Registered, TemplateStatus), LeaseError> {
        // Refused before anything is placed, with the rights the build will read it with.
        if let Some(user) = &self.inner.child_user {
            let checked = source.clone();
            user.read(move || crate::template::check_source(&checked))
                .await
                .and_then(|checked| checked)
                .map_err(|message| LeaseError::InvalidSource {
                    template: name.clone(),
                    message: user.explain(message),
                })?;
        }
        let current = self.placement(&name);
        let wanted = postgres_version.map(VersionSpec::major);
        let exists_on_primary = current.is_none() && self.primary_has(&name).await;
        let major = match (current, wanted) {
            (Some(now), Some(wanted)) if now != wanted => {
                return Err(LeaseError::OnOtherServer {
                    template: name,
                    serving: now.to_string(),
                })
            }
            (Some(now), _) => Some(now),
            (None, Some(wanted)) if wanted == self.inner.primary.major => None,
            (None, Some(_)) if exists_on_primary => {
                return Err(LeaseError::OnOtherServer {
                    template: name,
                    serving: self.inner.primary.version.clone(),
                })
            }
            (None, Some(wanted)) if self.inner.base.is_some() => Some(wanted),
            (None, Some(_)) => {
                return Err(LeaseError::VersionNotServed {
                    template: name,
                    asked: postgres_version.map(|v| v.to_string()).unwrap_or_default(),
                    serving: self.inner.primary.version.clone(),
                })
            }
            (None, None) => None,
        };
        let server = match major {
            Some(major) => self.server(major, postgres_version, START_WAIT).await?,
            None => self.inner.primary.clone(),
        };
        // Placed before it exists there, so that a lease arriving meanwhile goes to its
        // server (and waits for its build) instead of finding no such template.
        let newly_placed = major.is_some_and(|major| {
            lock(&self.inner.placed)
                .insert(name.clone(), major)
                .is_none()
        });
        match server.handle.register(name.clone(), source).await {
            Ok((registered, mut status)) => {
                status.postgres_version = Some(server.version.clone());
                Ok((registered, status))
            }
            Err(error) => {
                if newly_placed {
                    lock(&self.inner.placed).remove(&name);
                }
                Err(error)
            }
        }
    }

    /// Every server's status: the primary's report, with the templates and leases of the
    /// further servers added and one `servers` entry per server.
    pub async fn status(&self) -> Option<StatusReport> {
        let primary = &self.inner.primary;
        let mut report = primary.handle.status().await?;
        mark(&mut report, primary);
        report.servers = vec![server_status(primary.major, &report)];
        for server in self.running() {
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
        self.inner
            .stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let mut stops = vec![self.inner.primary.handle.clone()];
        stops.extend(self.running().into_iter().map(|s| s.handle));
        let tasks: Vec<_> = stops
            .into_iter()
            .map(|handle| tokio::spawn(async move { handle.shutdown().await }))
            .collect();
        for task in tasks {
            let _ = task.await;
        }
        let further = std::mem::take(&mut *lock(&self.inner.tasks));
        for task in further {
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

    fn placement(&self, template: &TemplateName) -> Option<u32> {
        lock(&self.inner.placed).get(template).copied()
    }

    async fn primary_has(&self, template: &TemplateName) -> bool {
        match self.inner.primary.handle.status().await {
            Some(report) => report.templates.iter().any(|t| &t.name == template),
            None => false,
        }
    }

    fn running(&self) -> Vec<Server> {
        lock(&self.inner.slots)
            .values()
            .filter_map(|slot| match slot {
                Slot::Running(server) => Some(server.clone()),
                _ => None,
            })
            .collect()
    }

    fn handles(&self) -> Vec<PoolHandle> {
        let mut handles = vec![self.inner.primary.handle.clone()];
        handles.extend(self.running().into_iter().map(|s| s.handle));
        handles
    }

    /// The server of `major`, started now if it is not running: the first caller starts it
    /// (in a task of its own, so a caller that gives up does not cancel it), later callers
    /// wait for the same start, up to `wait`.
    async fn server(
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
            let mut slots = lock(&self.inner.slots);
            match slots.get(&major) {
                Some(Slot::Running(server)) => return Ok(server.clone()),
                Some(Slot::Failed { at, error }) if at.elapsed() < START_RETRY_AFTER => {
                    return Err(start_failed(major, error));
                }
                Some(Slot::Starting(outcome)) => outcome.clone(),
                Some(Slot::Failed { .. }) | None => {
                    if self
                        .inner
                        .stopping
                        .load(std::sync::atomic::Ordering::SeqCst)
                    {
                        return Err(LeaseError::ShuttingDown);
                    }
                    if !base.majors_on_request && !self.inner.configured_majors.contains(&major) {
                        return Err(LeaseError::VersionNotOffered {
                            asked: asked.map_or_else(|| major.to_string(), |v| v.to_string()),
                            offered: self.offered(),
                        });
                    }
                    let (send, outcome) = watch::channel(None);
                    slots.insert(major, Slot::Starting(outcome.clone()));
                    let config = self.further_config(base, major, asked);
                    let servers = self.clone();
                    tokio::spawn(async move { servers.start_further(major, config, send).await });
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

    /// The configuration of the `major` server: the primary's, with that version, its
    /// templates, a free port and a data directory of its own.
    fn further_config(
        &self,
        base: &PoolConfig,
        major: u32,
        asked: Option<VersionSpec>,
    ) -> PoolConfig {
        let mut config = base.clone();
        let placed = lock(&self.inner.placed);
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

    async fn start_further(
        self,
        major: u32,
        config: PoolConfig,
        send: watch::Sender<Option<Result<Server, String>>>,
    ) {
        tracing::info!(
            major,
            "starting a PostgreSQL {major} server (first needed now)"
        );
        let outcome = async {
            let (handle, task) = crate::start(config).await.map_err(|e| e.to_string())?;
            let Some((_, version)) = server_version(&handle).await else {
                return Err("the pool stopped before it answered".to_owned());
            };
            lock(&self.inner.tasks).push(task);
            Ok(Server {
                major,
                version,
                handle,
            })
        }
        .await;
        match &outcome {
            Ok(server) => {
                tracing::info!(major, version = %server.version, "PostgreSQL {major} server started");
                if self
                    .inner
                    .stopping
                    .load(std::sync::atomic::Ordering::SeqCst)
                {
                    server.handle.shutdown().await;
                }
            }
            Err(error) => {
                tracing::error!(major, %error, "cannot start the PostgreSQL {major} server")
            }
        }
        lock(&self.inner.slots).insert(
            major,
            match &outcome {
                Ok(server) => Slot::Running(server.clone()),
                Err(error) => Slot::Failed {
                    at: Instant::now(),
                    error: error.clone(),
                },
            },
        );
        let _ = send.send(Some(outcome));
    }
}

/// How long a template operation waits for its server to start.
const START_WAIT: Duration = Duration::from_secs(600);

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

fn start_failed(major: u32, error: &str) -> LeaseError {
    LeaseError::PostgresDown(format!(
        "the PostgreSQL {major} server cannot start: {error}"
    ))
}

/// `<dir>-pg<major>` beside the primary's data directory.
fn sibling(dir: &std::path::Path, major: u32) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(format!("-pg{major}"));
    dir.with_file_name(name)
}

/// The server's major and `server_version`, from its pool's status.
async fn server_version(handle: &PoolHandle) -> Option<(u32, String)> {
    let version = handle.status().await?.postgres.version?;
    let (major, _) = pglease_binaries::parse_version_number(&version)?;
    Some((major, version))
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

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
