//! What the router knows, in one place: which further servers exist and which templates
//! live on them. One `tokio::sync::Mutex` in `Servers` guards it; it is held for lookups,
//! and across a registration's whole check-and-act, never across a server's start.
//!
//! [`home`] is the rule that says where a registration goes, without I/O.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use pglease_binaries::VersionSpec;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::{LeaseError, StartError};
use crate::handle::PoolHandle;
use crate::names::TemplateName;

/// One running server: its major, what it reports as its version, its pool, and the
/// stamp its lease ids carry (`ids.rs`).
#[derive(Debug, Clone)]
pub(super) struct Server {
    pub(super) major: u32,
    /// `server_version`, e.g. "18.6" or "15.14 (Debian 15.14-0+deb12u1)".
    pub(super) version: String,
    pub(super) handle: PoolHandle,
    pub(super) stamp: u8,
}

/// How a further server's start ended, as its waiters see it.
pub(super) type StartOutcome = Result<Server, Arc<StartError>>;

/// A further server's life.
#[derive(Debug)]
pub(super) enum Slot {
    /// Being started; the receiver sees the outcome.
    Starting(watch::Receiver<Option<StartOutcome>>),
    Running(Server),
    /// The last start failed; not retried before `START_RETRY_AFTER`.
    Failed {
        at: Instant,
        error: Arc<StartError>,
    },
}

/// The further servers and the templates placed on them.
#[derive(Debug, Default)]
pub(super) struct Registry {
    /// Further servers, by major.
    pub(super) slots: BTreeMap<u32, Slot>,
    /// Templates that live on a further server, and its major; every other template is
    /// the primary's. A template is placed only on a running server, and only by a
    /// registration holding the lock (or at start, before anyone else can ask).
    pub(super) placed: HashMap<TemplateName, u32>,
    /// Set by shutdown: no server starts after it.
    pub(super) stopping: bool,
    /// The further servers' pool tasks, awaited at shutdown.
    pub(super) tasks: Vec<JoinHandle<()>>,
}

impl Registry {
    /// The major of the further server `template` lives on; None for the primary's.
    pub(super) fn placement(&self, template: &TemplateName) -> Option<u32> {
        self.placed.get(template).copied()
    }

    /// The running further server of `major`.
    pub(super) fn running_server(&self, major: u32) -> Option<Server> {
        match self.slots.get(&major) {
            Some(Slot::Running(server)) => Some(server.clone()),
            _ => None,
        }
    }

    /// Every running further server, by major.
    pub(super) fn running(&self) -> Vec<Server> {
        self.slots
            .values()
            .filter_map(|slot| match slot {
                Slot::Running(server) => Some(server.clone()),
                _ => None,
            })
            .collect()
    }

    /// The running further server whose lease ids carry `stamp`.
    pub(super) fn stamped(&self, stamp: u8) -> Option<Server> {
        self.running().into_iter().find(|s| s.stamp == stamp)
    }
}

/// What a registration decides from, besides the registry.
pub(super) struct Ask<'a> {
    pub(super) template: &'a TemplateName,
    /// The version the registration names, if any.
    pub(super) version: Option<VersionSpec>,
    /// Where the template lives now: a further server's major, None for the primary or
    /// nowhere.
    pub(super) current: Option<u32>,
    /// The primary has the template (asked only when it matters: see [`needs_primary`]).
    pub(super) on_primary: bool,
    pub(super) primary_major: u32,
    pub(super) primary_version: &'a str,
    /// Further servers may exist (the primary is embedded).
    pub(super) further_allowed: bool,
}

/// Whether [`home`] needs to know if the primary has the template: only for a template
/// placed nowhere that names another major than the primary's.
pub(super) fn needs_primary(current: Option<u32>, wanted: Option<u32>, primary: u32) -> bool {
    current.is_none() && wanted.is_some_and(|wanted| wanted != primary)
}

/// Where a registration goes: `Some(major)` a further server, None the primary. With a
/// version the template lives on that major's server; without, where it lives now, else
/// on the primary. A template cannot move between servers: that is a 409 naming where it
/// is.
pub(super) fn home(ask: &Ask<'_>) -> Result<Option<u32>, LeaseError> {
    let wanted = ask.version.map(VersionSpec::major);
    match (ask.current, wanted) {
        (Some(now), Some(wanted)) if now != wanted => Err(LeaseError::OnOtherServer {
            template: ask.template.clone(),
            serving: now.to_string(),
        }),
        (Some(now), _) => Ok(Some(now)),
        (None, Some(wanted)) if wanted == ask.primary_major => Ok(None),
        (None, Some(_)) if ask.on_primary => Err(LeaseError::OnOtherServer {
            template: ask.template.clone(),
            serving: ask.primary_version.to_owned(),
        }),
        (None, Some(wanted)) if ask.further_allowed => Ok(Some(wanted)),
        (None, Some(_)) => Err(LeaseError::VersionNotServed {
            template: ask.template.clone(),
            asked: ask.version.map(|v| v.to_string()).unwrap_or_default(),
            serving: ask.primary_version.to_owned(),
        }),
        (None, None) => Ok(None),
    }
}
