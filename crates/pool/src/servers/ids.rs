//! Which server holds a lease, read from its id. Every pool mints ids whose first byte is
//! zero ([`LeaseId::random`]); the primary's go out as they are, and a further server's go
//! out with that byte set to its major (`10…` for PostgreSQL 16, `12…` for 18). So an id
//! names its server: a release, renew, keep or drop goes to that one pool, and the pool
//! gets back the id it minted. Ids stay 32 lowercase hex characters, as the API documents,
//! and clients need not know any of this.
//!
//! An id whose first byte is no running further server's goes to the primary as it is,
//! which answers for an unknown id as it always did (404, or 410 for a lease lost with its
//! server); the IntegreSQL API, which speaks only to the primary, sees its ids unchanged.
//! The pools' own logs show the minted id, which differs from the client's in that byte.

use crate::error::LeaseOpError;
use crate::names::LeaseId;

/// The stamp of the primary's ids: none (the byte a pool mints).
pub(super) const PRIMARY: u8 = 0;

/// The stamp of a further server's ids: its major, which is never zero (None for a major
/// that does not fit a byte, which no PostgreSQL has).
pub(super) fn stamp_of(major: u32) -> Option<u8> {
    u8::try_from(major).ok().filter(|&stamp| stamp != PRIMARY)
}

/// The id a client gets for one a pool minted on the server with `stamp`.
pub(super) fn outward(id: LeaseId, stamp: u8) -> LeaseId {
    if stamp == PRIMARY {
        id
    } else {
        id.with_first_byte(stamp)
    }
}

/// The stamp a client's id carries.
pub(super) fn stamp(id: &LeaseId) -> u8 {
    id.first_byte()
}

/// The id the pool with `stamp` minted, from the one a client sent.
pub(super) fn minted(id: &LeaseId, stamp: u8) -> LeaseId {
    if stamp == PRIMARY {
        id.clone()
    } else {
        id.with_first_byte(PRIMARY)
    }
}

/// A pool's answer about `id`, naming the id the client sent rather than the one the
/// pool minted.
pub(super) fn outward_error(error: LeaseOpError, id: &LeaseId) -> LeaseOpError {
    let id = id.as_str().to_owned();
    match error {
        LeaseOpError::NotFound(_) => LeaseOpError::NotFound(id),
        LeaseOpError::Lost(_) => LeaseOpError::Lost(id),
        LeaseOpError::NotKept(_) => LeaseOpError::NotKept(id),
        LeaseOpError::ShuttingDown => LeaseOpError::ShuttingDown,
    }
}
