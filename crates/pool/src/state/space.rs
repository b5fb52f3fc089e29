//! The databases' own tmpfs (`postgres/space.rs`), as last measured: when it fills, the
//! writer that hit the end got "could not extend file … No space left on device" and the
//! server stays up; the state says in `/status` (and the log) which database held the
//! most, the lease that filled it, and when there is room again; what last filled it stays
//! named after room comes back. The actor measures it (`actor/space.rs`) and asks postgres
//! for the databases' sizes, which also go to `--lease-max-bytes` (`state/lease_bytes.rs`):
//! a lease past it is ended at once. Its size is the room that limit's default is derived
//! from.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use tokio::time::Instant;

use super::{Action, PoolState};
use crate::names::{DbName, LeaseId};
use crate::types::{DatabasesSpace, FilledBy};

/// Full below this share of the space free (a writer's failed extension leaves less).
const FULL_BELOW_PERCENT: u64 = 2;
/// Room again from this share free.
const ROOM_FROM_PERCENT: u64 = 5;

/// The space's last measure, and what filled it.
#[derive(Debug)]
pub(super) struct Space {
    path: PathBuf,
    bytes: u64,
    free_bytes: u64,
    full: bool,
    /// What filled it, while it is full.
    filled_by: Option<FilledBy>,
}

impl PoolState {
    /// The server now runs with its databases on a tmpfs of their own at `path` (None: it
    /// does not, or it is gone).
    pub fn space_at(&mut self, path: Option<PathBuf>) {
        // What last filled it is history worth keeping across a restart of the server.
        if let Some(filled_by) = self.space.as_ref().and_then(|s| s.filled_by.clone()) {
            self.last_filled_by = Some(filled_by);
        }
        self.space = path.map(|path| Space {
            path,
            bytes: 0,
            free_bytes: 0,
            full: false,
            filled_by: None,
        });
    }

    /// The databases' tmpfs' size, once measured (what `--lease-max-bytes` is derived from).
    pub(super) fn space_room(&self) -> Option<u64> {
        self.space
            .as_ref()
            .map(|space| space.bytes)
            .filter(|&bytes| bytes > 0)
    }

    /// Where the databases' tmpfs is, while there is one.
    pub fn space_path(&self) -> Option<&Path> {
        self.space.as_ref().map(|space| space.path.as_path())
    }

    /// A measure of the databases' tmpfs. True on the step to full: the caller then asks
    /// postgres for every database's size and reports it with [`PoolState::space_filled`].
    pub fn space_measured(&mut self, bytes: u64, free_bytes: u64) -> bool {
        let Some(space) = self.space.as_mut() else {
            return false;
        };
        space.bytes = bytes;
        space.free_bytes = free_bytes;
        let percent_free = free_bytes * 100 / bytes.max(1);
        if !space.full && percent_free < FULL_BELOW_PERCENT {
            space.full = true;
            return true;
        }
        if space.full && percent_free >= ROOM_FROM_PERCENT {
            space.full = false;
            // No longer what fills it; still what last did (`last_filled_by`).
            space.filled_by = None;
            tracing::info!(
                path = %space.path.display(),
                free_bytes,
                "the databases' tmpfs has room again"
            );
        }
        false
    }

    /// Names what filled the databases' tmpfs, from every database's size: of the leased
    /// databases the biggest, else the biggest of all. Leases past `--lease-max-bytes` are
    /// ended at once (`state/lease_bytes.rs`): the actions carry that out.
    pub fn space_filled(
        &mut self,
        sizes: Result<Vec<(String, i64)>, crate::sql_error::SqlError>,
        at: SystemTime,
        now: Instant,
    ) -> Vec<Action> {
        let leases = self.lease_list();
        let Some(space) = self.space.as_mut() else {
            return Vec::new();
        };
        let sizes = match sizes {
            Ok(sizes) => sizes,
            Err(error) => {
                tracing::warn!(path = %space.path.display(), %error, "the databases' tmpfs is full; cannot tell which database filled it");
                return Vec::new();
            }
        };
        let leased = |name: &str| leases.iter().find(|lease| lease.database.as_str() == name);
        let biggest = sizes
            .iter()
            .filter(|(name, _)| leased(name).is_some())
            .max_by_key(|(_, bytes)| *bytes)
            .or_else(|| sizes.iter().max_by_key(|(_, bytes)| *bytes));
        let Some((name, bytes)) = biggest else {
            return Vec::new();
        };
        let lease = leased(name);
        tracing::warn!(
            path = %space.path.display(),
            database = %name,
            bytes,
            lease_id = lease.map(|l| l.id.to_string()),
            template = lease.map(|l| l.template.to_string()),
            "the databases' tmpfs is full: its writers get \"No space left on device\", the server stays up; this database holds the most"
        );
        let filled_by = FilledBy {
            database: DbName::from_server(name.clone()),
            template: lease.map(|l| l.template.clone()),
            bytes: u64::try_from(*bytes).unwrap_or(0),
            at,
        };
        space.filled_by = Some(filled_by.clone());
        self.last_filled_by = Some(filled_by);
        // The same sizes judge every lease against its bound, at once: the one that filled
        // the room is likely past it.
        let measured: Vec<(LeaseId, DbName, u64)> = leases
            .iter()
            .filter_map(|lease| {
                let (_, bytes) = sizes
                    .iter()
                    .find(|(name, _)| name == lease.database.as_str())?;
                Some((
                    lease.id.clone(),
                    lease.database.clone(),
                    u64::try_from(*bytes).unwrap_or(0),
                ))
            })
            .collect();
        self.lease_sizes(&measured, at, now)
    }

    /// The databases' tmpfs for `/status`, while there is one.
    pub fn space_status(&self) -> Option<DatabasesSpace> {
        self.space.as_ref().map(|space| DatabasesSpace {
            path: space.path.clone(),
            bytes: space.bytes,
            free_bytes: space.free_bytes,
            full: space.full,
            filled_by: space.filled_by.clone(),
            last_filled_by: self.last_filled_by.clone(),
        })
    }
}
