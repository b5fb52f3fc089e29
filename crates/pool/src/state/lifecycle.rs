//! A template's entry: which of its two lifecycles it follows — built by pglease from
//! configured sources, or built by a client through the IntegreSQL API — and what both
//! share (waiting requests, demand, the last build). Its clones are not here: they are
//! records in [`super::dbs`].

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use super::demand::Demand;
use super::owner::Owner;
use super::proofs::ProofHistory;
use super::{Action, Built, WaiterId};
use crate::config::TemplateSource;
use crate::names::{DbName, LeaseId, TemplateName};
use crate::template::SourceStamp;

/// A built template version: what its clones are made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Version {
    pub fingerprint: String,
    pub db: DbName,
}

/// A template pglease builds from its sources.
#[derive(Debug)]
pub(super) struct Configured {
    pub source: TemplateSource,
    pub build: Build,
    /// Whose it is: the operator's (defined by `--template` or the configuration file,
    /// which readiness waits on, `PoolState::readiness`, and which only the configuration
    /// and a token holder may change) or the API's (registered over HTTP).
    pub owner: Owner,
    /// The stamp of the sources behind its last build, taken before they were hashed (or
    /// when they were found unusable at start). While it is ready, a lease request whose
    /// look finds the stamp moved checks for a new version; while it has failed, the
    /// periodic look builds it again once the stamp moves.
    pub sources: Option<SourceStamp>,
    /// A periodic look at its failed sources runs.
    pub looking_at_failed: bool,
    /// Built once already in this run, for `--verify-templates` (the first build of
    /// each template starts from scratch).
    pub built_once: bool,
}

impl Configured {
    /// Starts a build that replaces `previous`: the action that runs it. With
    /// `verify_templates`, the first build in this run does not take a template
    /// database of the same fingerprint that exists already.
    pub fn start_build(
        &mut self,
        template: &TemplateName,
        previous: Option<DbName>,
        verify_templates: bool,
    ) -> Action {
        self.build = Build::Building { previous };
        let first = !std::mem::replace(&mut self.built_once, true);
        Action::Build {
            template: template.clone(),
            source: self.source.clone(),
            reuse_existing: !(verify_templates && first),
        }
    }

    /// The sources and fingerprint of its current version, for a look at whether they
    /// changed.
    pub fn watch(&self) -> Option<(SourceStamp, String)> {
        match (&self.build, &self.sources) {
            (Build::Ready(version), Some(stamp)) => {
                Some((stamp.clone(), version.fingerprint.clone()))
            }
            _ => None,
        }
    }
}

/// Where a configured template's build is.
#[derive(Debug)]
pub(super) enum Build {
    /// Not built yet (or evicted, or its server was lost).
    Idle,
    /// A build job runs; `previous` is the version it replaces, dropped when it ends.
    Building {
        previous: Option<DbName>,
    },
    Ready(Version),
    /// The last build failed, or its sources were found missing at start
    /// (`PoolState::sources_unusable`): the next request tries again, and so does the
    /// actor once the sources' stamp moves.
    Failed,
}

/// Where a client-built template is: initialize → (opened) → migrated by the client →
/// finalize → ready; or discarded.
#[derive(Debug)]
pub(super) enum ClientBuild {
    /// Its empty database is being created.
    Opening {
        db: DbName,
    },
    /// The client migrates `db` (since `since`).
    Open {
        db: DbName,
        since: Instant,
    },
    /// A finalize job runs (or a template kept by an earlier run is being restored).
    Finalizing {
        db: DbName,
    },
    Ready(Version),
    /// Its finalize failed: requests fail with the build error until a client initializes
    /// it again.
    Failed,
    /// Its client discarded it: requests fail until it is initialized again.
    Discarded,
}

/// A template's lifecycle.
#[derive(Debug)]
pub(super) enum Lifecycle {
    Configured(Configured),
    Client(ClientBuild),
}

/// A parked lease request.
#[derive(Debug)]
pub(super) struct Waiter {
    pub id: WaiterId,
    pub lease_id: LeaseId,
    pub ttl: Duration,
    pub connections: u32,
    pub reclaimable: bool,
    /// The request's label, carried to its lease.
    pub label: Option<String>,
    pub enqueued: Instant,
    pub deadline: Instant,
}

/// One template.
#[derive(Debug)]
pub(super) struct TemplateEntry {
    pub lifecycle: Lifecycle,
    /// Clones are kept warm only for templates someone asked for (or prebuilt).
    pub wanted: bool,
    pub waiters: VecDeque<Waiter>,
    pub last_error: Option<String>,
    pub clones_paused_until: Option<Instant>,
    /// Builds finished in this run; the current version's number.
    pub version: u32,
    pub last_build: Option<Built>,
    /// When a lease of it was last granted (for evicting the least recently used).
    pub last_used: Option<Instant>,
    /// How fast its ready clones are used up, to refill ahead of that.
    pub demand: Demand,
    /// Its recent proofs, which say whether a new clone is worth a stamp.
    pub proofs: ProofHistory,
    /// Its sources are being looked at (a lease request saw its stamp, maybe moved): its
    /// waiters wait, and count, but are not served until the look says whether a new
    /// version must be built first (`PoolState::sources_checked`).
    pub checking_sources: bool,
}

impl TemplateEntry {
    pub fn configured(source: TemplateSource, wanted: bool, owner: Owner) -> Self {
        Self::new(
            Lifecycle::Configured(Configured {
                source,
                build: Build::Idle,
                owner,
                sources: None,
                looking_at_failed: false,
                built_once: false,
            }),
            wanted,
        )
    }

    pub fn client(build: ClientBuild) -> Self {
        Self::new(Lifecycle::Client(build), true)
    }

    fn new(lifecycle: Lifecycle, wanted: bool) -> Self {
        TemplateEntry {
            lifecycle,
            wanted,
            waiters: VecDeque::new(),
            last_error: None,
            clones_paused_until: None,
            version: 0,
            checking_sources: false,
            last_build: None,
            last_used: None,
            demand: Demand::default(),
            proofs: ProofHistory::default(),
        }
    }

    /// The version clones are made from now, if one is built.
    pub fn current(&self) -> Option<&Version> {
        match &self.lifecycle {
            Lifecycle::Configured(Configured {
                build: Build::Ready(version),
                ..
            })
            | Lifecycle::Client(ClientBuild::Ready(version)) => Some(version),
            Lifecycle::Configured(_) | Lifecycle::Client(_) => None,
        }
    }

    /// Since when a client migrates it (client-built templates between initialize and
    /// finalize).
    pub fn migrating_since(&self) -> Option<Instant> {
        match &self.lifecycle {
            Lifecycle::Client(ClientBuild::Open { since, .. }) => Some(*since),
            Lifecycle::Client(_) | Lifecycle::Configured(_) => None,
        }
    }

    pub fn is_client_built(&self) -> bool {
        matches!(self.lifecycle, Lifecycle::Client(_))
    }

    /// Its source (a client-built template's is [`TemplateSource::Client`]).
    pub fn source(&self) -> TemplateSource {
        match &self.lifecycle {
            Lifecycle::Configured(configured) => configured.source.clone(),
            Lifecycle::Client(_) => TemplateSource::Client,
        }
    }

    /// Bytes of the current (or last built) version: what each of its clones costs.
    pub fn version_size(&self) -> u64 {
        self.last_build
            .as_ref()
            .map_or(0, |b| u64::try_from(b.size_bytes).unwrap_or(0))
    }

    /// The template databases it holds itself (not as records): the current version, the
    /// one a build replaces, or a client's database being made.
    pub fn template_dbs(&self) -> Vec<&DbName> {
        match &self.lifecycle {
            Lifecycle::Configured(configured) => match &configured.build {
                Build::Ready(version) => vec![&version.db],
                Build::Building {
                    previous: Some(db), ..
                } => vec![db],
                Build::Building { previous: None } | Build::Idle | Build::Failed => Vec::new(),
            },
            Lifecycle::Client(build) => match build {
                ClientBuild::Opening { db }
                | ClientBuild::Open { db, .. }
                | ClientBuild::Finalizing { db } => vec![db],
                ClientBuild::Ready(version) => vec![&version.db],
                ClientBuild::Failed | ClientBuild::Discarded => Vec::new(),
            },
        }
    }

    /// The word `/status` shows for it.
    pub fn state_name(&self) -> &'static str {
        match &self.lifecycle {
            Lifecycle::Configured(configured) => match configured.build {
                Build::Idle => "idle",
                Build::Building { .. } => "building",
                Build::Ready(_) => "ready",
                Build::Failed => "failed",
            },
            Lifecycle::Client(build) => match build {
                ClientBuild::Opening { .. } => "initializing",
                ClientBuild::Open { .. } => "migrating",
                ClientBuild::Finalizing { .. } => "building",
                ClientBuild::Ready(_) => "ready",
                ClientBuild::Failed => "failed",
                ClientBuild::Discarded => "discarded",
            },
        }
    }
}
